"""The agent's command line: bad options fail fast with a message that says what to do; a user's
own model and data train; a bad factory is named in the error."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from conftest import agent_env, further

from ringtop.agent.config import AgentConfig, ConfigError, agent_parser, cli_fields, parse_agent_args
from ringtop.cli.main import main as ringtop_main
from ringtop.metrics.install_hint import install_command
from ringtop.protocol import Bye, Hello, Step


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--steps", "-1"], "--steps must be >= 0"),
        (["--batch-size", "0"], "--batch-size must be >= 1"),
        (["--steps", "ten"], "invalid int value"),
        (["--model", "mypkg.mod:build", "--model-size", "10m"], "drop it when --model is your own factory"),
        (["--model", "gpt5"], "use 'tiny-gpt' or package.module:function"),
        (["--no-telemetry", "--log-dir", "x"], "drop --log-dir or drop --no-telemetry"),
        (["--publish", "tcp://0.0.0.0:5555"], "ssh -L"),
        (["--publish", "tcp://127.0.0.1:7000", "--control", "tcp://127.0.0.1:7000"], "must differ"),
        (["--publish", "udp://x"], "tcp://HOST:PORT"),
        (["--seq-len", "4096"], "--seq-len <= 1024"),
        (["--model-size", "7b"], "invalid choice"),
        (["--strategy", "zero9"], "unknown strategy 'zero9'; choose from ddp, zero1, zero2, zero3, fsdp"),
        (["--fsdp-sharding", "full"], "--fsdp-sharding applies to --strategy fsdp only"),
        (["--strategy", "fsdp", "--fsdp-sharding", "half"], "invalid choice: 'half'"),
        (["--grad-clip", "-1"], "--grad-clip must be >= 0"),
        (["--dtype", "fp8"], "invalid choice"),
        (["--checkpoint-every", "-2"], "--checkpoint-every must be >= 0"),
        (["--run-id", "../../etc/x"], "--run-id '../../etc/x': use letters, digits"),  # it names a file
        (["--run-id", ".hidden"], "not starting with '.'"),
        (["--run-id", "x" * 65], "at most 64"),
    ],
)
def test_bad_options_fail_fast_with_advice(argv, says):
    with pytest.raises(ConfigError, match=None) as info:
        parse_agent_args(argv)
    assert says in str(info.value)


def test_remote_bind_is_allowed_only_when_asked():
    cfg = parse_agent_args(["--publish", "tcp://0.0.0.0:5555", "--allow-remote"])
    assert cfg.endpoints.publish == "tcp://0.0.0.0:5555"
    assert not cfg.insecure, "off loopback the sockets still authenticate"


def test_only_the_addresses_left_at_their_defaults_may_move():
    assert parse_agent_args([]).movable_endpoints == {"publish", "relay", "control"}
    assert parse_agent_args(["--control", "tcp://127.0.0.1:7001"]).movable_endpoints == {"publish", "relay"}


AGENT_FLAGS = {
    "--strategy", "--fsdp-sharding", "--ds-config", "--pp-stages", "--pp-schedule", "--micro-batches", "--pp-split",
    "--dtype", "--grad-clip", "--model", "--model-size", "--data", "--steps", "--batch-size", "--seq-len", "--lr",
    "--seed", "--device", "--ddp-bucket-cap-mb", "--dist-timeout-s", "--on-nonfinite", "--log-dir", "--publish",
    "--relay", "--control", "--allow-remote", "--insecure", "--no-watcher", "--no-telemetry", "--run-id",
    "--step-times",
    "--print-every", "--link", "--link-tp", "--link-dp", "--link-pp", "--stall-factor", "--stall-floor",
    "--inject-hang", "--inject-desync", "--inject-crash",
    "--inject-slow-rank", "--inject-comm-delay", "--inject-save-delay", "--inject-nan", "--inject-node-relay-death",
    "--inject-fail-setup", "--checkpoint-dir", "--resume", "--checkpoint-every", "--checkpoint-kind", "--keep",
    "--stop-on-save-failure", "--group-readable",
    "--metrics", "--peak-tflops", "--tp", "--tp-sequence-parallel",
    "--alert-webhook", "--alert-command", "--alert-goodput", "--capture-on", "--capture-every", "--capture-steps",
}
"""The flags the docs (docs/running.md's options above all), the tests and users' scripts spell: none may go or
be renamed."""

NOT_OPTIONS = {"movable_endpoints", "ds_config_from_command"}
"""AgentConfig's fields the agent derives (which addresses may move) or a command sets."""


def test_an_empty_command_line_is_the_configs_defaults():
    assert parse_agent_args([]) == AgentConfig()


def test_every_field_but_the_derived_ones_is_an_option_and_its_help_says_its_default():
    actions = {a.dest: a for a in agent_parser()._actions if a.dest != "help"}
    assert set(actions) == {f.name for f in msgspec.structs.fields(AgentConfig)} - NOT_OPTIONS
    assert {flag for a in actions.values() for flag in a.option_strings} == AGENT_FLAGS
    for field in cli_fields():
        if field.value_type is not bool:
            assert "(default: " in actions[field.name].help, field.flag


RUNNING_PAGE = Path(__file__).resolve().parents[2] / "docs" / "running.md"


def options_spelled(page: str) -> set[str]:
    """The flags the options section of docs/running.md names (`--help` aside)."""
    section = page.split("## The agent's options\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", section)) - {"--help"}


def test_the_docs_spell_every_agent_option_and_no_other():
    assert options_spelled(RUNNING_PAGE.read_text()) == AGENT_FLAGS


@pytest.mark.parametrize("damage", [lambda t: t.replace("`--keep K`, ", ""), lambda t: t.replace("`--lr`", "`--rate`")])
def test_a_flag_left_out_or_misspelled_in_the_docs_is_found(damage):
    page = RUNNING_PAGE.read_text()
    assert damage(page) != page
    assert options_spelled(damage(page)) != AGENT_FLAGS


@pytest.mark.parametrize("argv, field, value", [
    (["--no-telemetry"], "telemetry", False),
    (["--step-times", "t.json"], "step_times_file", "t.json"),
    (["--inject-comm-delay", "5"], "inject_comm_delay_ms", 5.0),
    (["--inject-save-delay", "7"], "inject_save_delay_ms", 7.0),
    (["--inject-slow-rank", "1:200"], "inject_slow_rank", (1, 200.0)),
    (["--link", "pcie4"], "link_gbps", 32.0),
    (["--link-tp", "nvlink4"], "link_peaks_by_group", {"tp": 450.0}),
    (["--link-dp", "ib-ndr", "--link-pp", "12.5"], "link_peaks_by_group", {"dp": 50.0, "pp": 12.5}),
    (["--strategy", "pp", "--pp-split", "3,1"], "pp_split", (3, 1)),
    (["--inject-hang", "3:12"], "inject_hang", (3, 12, "forward")),
    (["--inject-hang", "1:5:before-collective"], "inject_hang", (1, 5, "before-collective")),
    (["--inject-desync", "2:7"], "inject_desync", (2, 7)),
    (["--inject-crash", "1:5"], "inject_crash", (1, 5)),
    (["--stall-floor", "1.5"], "stall_floor_s", 1.5),
    (["--peak-tflops", "312"], "peak_tflops", 312.0),
])
def test_an_option_spelled_unlike_its_field_sets_that_field(argv, field, value):
    assert getattr(parse_agent_args(argv), field) == value


@pytest.mark.parametrize("argv, message", [
    (["--inject-hang", "3"], "expected R:STEP"),
    (["--inject-hang", "3:0"], "expected R:STEP"),
    (["--inject-hang", "x:4"], "expected R:STEP"),
    (["--inject-hang", "1:4:sideways"], "the place is one of forward, before-collective"),
    (["--inject-desync", "1:4:forward"], "expected R:STEP"),
    (["--inject-crash", "1"], "expected R:STEP"),
    (["--stall-factor", "0.5"], "--stall-factor"),
    (["--peak-tflops", "-1"], "--peak-tflops must be >= 0"),
    (["--link-dp", "carrier-pigeon"], "--link-dp: "),
])
def test_a_bad_fault_or_stall_option_is_refused_with_what_to_write(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_agent_args(argv)


def test_an_abbreviated_address_option_still_pins_that_address():
    assert parse_agent_args(["--contr", "tcp://127.0.0.1:7001"]).movable_endpoints == {"publish", "relay"}


def test_ringtop_run_help_lists_every_agent_option(capsys):
    with pytest.raises(SystemExit) as exited:
        ringtop_main(["run", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "--nproc" in out
    assert [flag for flag in sorted(AGENT_FLAGS) if flag not in out] == []


def run_agent(*argv: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringtop.agent", *argv], capture_output=True, text=True,
                          env=agent_env(), timeout=timeout)


@pytest.mark.timeout(60)
def test_the_agent_exits_2_and_explains_an_unknown_option():
    result = run_agent("--stratgy", "ddp")
    assert result.returncode == 2
    assert "ringtop agent: error: unrecognized arguments: --stratgy" in result.stderr


@pytest.mark.timeout(60)
def test_an_unknown_strategy_is_refused_with_the_choices():
    result = run_agent("--no-telemetry", "--strategy", "zero9", "--steps", "1")
    assert result.returncode == 2
    assert "unknown strategy 'zero9'; choose from ddp, zero1, zero2, zero3, fsdp" in result.stderr


@pytest.mark.timeout(60)
def test_a_strategy_that_cannot_run_here_is_refused_with_the_reason():
    blocked = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['deepspeed'] = None; from ringtop.agent.__main__ import main; "
                               "sys.exit(main(['--no-telemetry', '--strategy', 'zero2', '--steps', '1']))"],
        capture_output=True, text=True, env=agent_env(), timeout=60)
    assert blocked.returncode == 2
    assert "strategy 'zero2' cannot run here: DeepSpeed is not installed" in blocked.stderr
    assert install_command("deepspeed") in blocked.stderr, "the hint for how ringtop was installed"
    no_gpu = run_agent("--no-telemetry", "--device", "cuda", "--steps", "1")
    assert no_gpu.returncode == 2 and "torch sees no CUDA device" in no_gpu.stderr


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "model, says",
    [
        # test_run_cli.py's launch failure names this one on every rank of `ringtop run`
        pytest.param("no_such_module:build", "--model 'no_such_module:build': cannot import module 'no_such_module'",
                     marks=further),
        pytest.param("user_factories:nope", "module 'user_factories' has no attribute 'nope'", marks=further),
        ("user_factories:broken_model", "raised RuntimeError: weights went missing"),
        pytest.param("user_factories:not_a_module", "returned int; expected an nn.Module", marks=further),
    ],
)
def test_a_bad_model_factory_is_named(model, says):
    result = run_agent("--no-telemetry", "--model", model, "--steps", "1")
    assert result.returncode == 2, result.stderr
    assert says in result.stderr


@pytest.mark.timeout(90)
@pytest.mark.parametrize("model, nproc", [("user_factories:model_and_loss", 2),
                                          ("user_factories:model_returning_loss", 0)])
def test_a_users_own_model_and_data_train_under_the_agent(launch_agents, model, nproc):
    run = launch_agents(nproc, "--model", model, "--data", "user_factories:batches", "--steps", "5",
                        "--batch-size", "4")
    assert run.wait(80) == 0, run.output()[-3000:]
    for rank in range(max(nproc, 1)):
        msgs = run.messages(rank)
        hello = msgs[0]
        assert isinstance(hello, Hello) and hello.model == model and hello.param_count == 8 * 16 + 16 + 16 + 1
        steps = [m for m in msgs if isinstance(m, Step)]
        assert [s.step for s in steps] == [1, 2, 3, 4, 5]
        assert all(s.tokens == 4 * 8 for s in steps)
        assert isinstance(msgs[-1], Bye) and msgs[-1].ok


@pytest.mark.timeout(60)
def test_a_fault_aimed_at_a_rank_the_run_does_not_have_is_refused():
    result = run_agent("--no-telemetry", "--inject-hang", "3:2", "--steps", "1")
    assert result.returncode == 2
    assert "--inject-hang: rank 3 is not in this run of 1 rank" in result.stderr
