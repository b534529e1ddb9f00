"""ringtop.Monitor on a script's own torchrun loop: it changes nothing the loop computes, and the
example of docs/own-loops.md (examples/own_loop.py, run as it is on 2 gloo ranks) streams steps, traffic,
memory and verdicts to the real UI, takes the UI's checkpoint through the script's save function,
refuses a switch with the reason, stops on `ctl stop` and leaves nothing behind."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from conftest import AgentRun, agent_env, poll_until, run_worker_script, stop_process_group

from ringtop.agent.lifecycle import exit_with_parent
from ringtop.protocol import Bye, Event, Hello, Stall, Step, connection_file, free_tcp_ports, read_log
from ringtop.tui.app import RingtopApp

pytestmark = pytest.mark.timeout(180)

TESTS = Path(__file__).resolve().parents[1]
EXAMPLE = TESTS.parent / "examples" / "own_loop.py"


def test_the_docs_show_the_example_that_runs():
    page = (TESTS.parent / "docs" / "own-loops.md").read_text()
    block = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert block == EXAMPLE.read_text(), "docs/own-loops.md's example must be examples/own_loop.py as it is"


def example_model_sizes() -> tuple[int, int]:
    """(parameter bytes, parameter tensors) of the example's model, counted by torch here."""
    spec = importlib.util.spec_from_file_location("own_loop_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    params = list(module.TinyLM().parameters())
    return sum(p.numel() * p.element_size() for p in params), len(params)


NET_PARAM_BYTES = 4 * ((24 * 40 + 40) + (40 * 40 + 40) + (40 * 8 + 8))
"""own_loop_equivalence.Net's three fp32 Linear layers, weights and biases."""


def test_the_loop_computes_the_same_watched_or_not(tmp_path, monkeypatch):
    """Bitwise: the same operations. 3 ranks, so that a reduction done differently (divide by N
    instead of DDP's scale by 1/N) changes the numbers; the worker's third run does that."""
    monkeypatch.setenv("RINGTOP_TEST_RUN_ID", uuid.uuid4().hex[:8])
    ranks = run_worker_script(TESTS / "helpers" / "own_loop_equivalence.py", [], tmp_path, nproc=3, timeout_s=150)
    for rank, result in enumerate(ranks):
        for kind in ("ddp", "fsdp"):
            r = result[kind]
            assert r["watched"] == r["plain"], f"rank {rank} {kind}: losses differ with the monitor"
            assert r["watched_params"] == r["plain_params"], f"rank {rank} {kind}: final parameters differ"
            steps = [s for s in read_log(tmp_path / f"logs-{kind}" / f"rank-{rank}.jsonl") if isinstance(s, Step)]
            assert [float.fromhex(x) for x in r["watched"]] == [s.loss for s in steps], f"{kind}: the logs' losses"
            for s in steps:
                moved = {c.kind: c.bytes for c in s.comm}
                if kind == "ddp":
                    assert moved == {"all_reduce": NET_PARAM_BYTES}
                else:  # FSDP2 pads each shard to a multiple of the world size; full reshard gathers twice
                    assert set(moved) == {"all_gather", "reduce_scatter"}
                    assert NET_PARAM_BYTES <= moved["reduce_scatter"] < 1.1 * NET_PARAM_BYTES
                    assert moved["all_gather"] == 2 * moved["reduce_scatter"]
        assert result["ddp_mutated_params"] != result["ddp"]["plain_params"], "the check must see a changed reduction"


@pytest.fixture(scope="module")
def example_run(tmp_path_factory):
    """examples/own_loop.py on 2 ranks until stopped, with a slow loader (an input stall),
    configured through RINGTOP_ARGS only, as docs/own-loops.md says."""
    workdir = tmp_path_factory.mktemp("own_loop")
    publish, relay, control = (f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(3))
    log_dir, ckpt_dir, output = workdir / "logs", workdir / "checkpoints", workdir / "output.txt"
    run_id = uuid.uuid4().hex[:8]
    env = agent_env()
    env["RINGTOP_ARGS"] = (f"--publish {publish} --relay {relay} --control {control} --log-dir {log_dir} "
                           f"--checkpoint-dir {ckpt_dir} --run-id {run_id}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(EXAMPLE),
           "--steps", "0", "--data-ms", "15"]
    with open(output, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=exit_with_parent)
    run = AgentRun(proc, publish, relay, control, log_dir, ckpt_dir, output, 2, cmd, run_id)
    yield run
    stop_process_group(proc)


async def wait_until(pilot, predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.2)


async def test_the_ui_sees_the_loop_and_its_checkpoint_and_refusal(example_run):
    run = example_run
    app = RingtopApp(publish_addr=run.publish, control_addr=run.control, keys=run.keys)
    async with app.run_test(size=(160, 48)) as pilot:
        view = app.view
        await wait_until(pilot, lambda: set(view.ranks) == {0, 1} and min(r.step for r in view.ranks.values()) > 0,
                         90, "steps of ranks 0 and 1")
        assert view.facts.strategy == "ddp" and view.facts.world_size == 2
        # the Hello says an own loop cannot switch: no switch key, nor in the palette
        assert "*" in view.facts.switch_unavailable and app.check_action("switch", ()) is False
        assert not any("Switch" in c.title for c in app.get_system_commands(app.screen))
        await wait_until(pilot, lambda: any(v.rule == "input_stall" for v in view.active_verdicts), 60,
                         "the input-stall verdict (the loader sleeps 15 ms a batch)")
        await wait_until(pilot, lambda: any("waits on input" in e.text and "since step" in e.text for e in view.events),
                         30, "the verdict in the Events tab, naming its rank and step")
        verdict = next(v for v in view.active_verdicts if v.rule == "input_stall")
        assert "DataLoader(num_workers=" in verdict.advice, "advice in the script's own terms"

        await pilot.press("c")
        await wait_until(pilot, lambda: (run.checkpoint_dir / "latest").exists(), 60, "the checkpoint")
        await wait_until(pilot, lambda: any("done" in e.text and "checkpoint" in e.text for e in view.events), 30,
                         "the checkpoint's done reply in the UI")

        replies = list(run.send_command("switch", {"strategy": "fsdp"}))
        assert replies[-1].status == "error" and "does not own this training loop" in replies[-1].error
        await wait_until(pilot, lambda: any("does not own this training loop" in e.text for e in view.events), 30,
                         "the refusal in the UI's events")


def test_the_save_function_wrote_the_step_it_was_given(example_run, capsys):
    from ringtop.cli.main import main as ringtop_main

    run = example_run
    replies = list(run.send_command("checkpoint", {"kind": "full"}))
    done = replies[-1]
    assert done.status == "done", done
    step, path = done.result["step"], Path(done.result["path"])
    assert path.name == f"step-{step:08d}-user" and (run.checkpoint_dir / "latest").read_text().strip() == path.name
    saved = torch.load(path / "state.pt", weights_only=True)
    assert saved["step"] == step
    assert not list(run.checkpoint_dir.glob(".*.tmp")), "no temporary folder left"
    assert any(isinstance(m, Event) and m.kind == "checkpoint" and m.data.get("step") == step
               for m in run.messages(0))
    assert ringtop_main(["ckpt", "info", str(path)]) == 2
    assert "written by a script's own save function" in capsys.readouterr().err


def test_steps_carry_the_loops_traffic_memory_and_phases(example_run):
    run = example_run
    run.wait_for_step(25)
    param_bytes, tensors = example_model_sizes()
    for rank in (0, 1):
        messages = run.messages(rank)
        hello = next(m for m in messages if isinstance(m, Hello))
        assert hello.strategy == "ddp" and hello.strategy_options.get("loop") == "own"
        assert hello.prediction.params_bytes == param_bytes and hello.flops_per_token > 0
        steps = [m for m in messages if isinstance(m, Step)]
        assert [s.step for s in steps] == list(range(1, len(steps) + 1))
        for s in steps:
            reduced = {c.kind: c.bytes for c in s.comm}
            assert reduced == {"all_reduce": param_bytes}, f"rank {rank} step {s.step}: DDP all-reduces the grads"
            assert s.tokens == 8 * 32 and s.loss is not None, "the tokens the example gives (tokens_per_step)"
            assert s.tflops == pytest.approx(hello.flops_per_token * s.tokens / (s.step_ms / 1e3) / 1e12)
            assert s.grad_norm is not None and s.grad_norm > 0, "the norm the example's clip_grad_norm_ returned"
            assert s.mem.params_bytes == param_bytes and s.mem.grads_bytes == param_bytes
            assert s.mem.optimizer_bytes == 2 * param_bytes + 4 * tensors  # AdamW: two moments, a step count
            assert s.data_ms >= 15 * 0.9 and s.backward_ms > 0 and s.forward_ms > 0 and s.optimizer_ms > 0
            assert s.data_ms + s.forward_ms + s.backward_ms + s.optimizer_ms <= s.step_ms * 1.001
            assert s.comm_busy_ms > 0


def test_a_stop_ends_the_script_cleanly(example_run):
    run = example_run
    conn = connection_file.file_for(run.run_id)
    assert conn.exists()
    replies = list(run.send_command("stop", {"reason": "test"}))
    assert replies[-1].status == "done"
    assert run.wait(60) == 0, run.output()[-3000:]
    for rank in (0, 1):
        last = run.messages(rank)[-1]
        assert isinstance(last, Bye) and last.ok and "stopped by user" in last.reason
    poll_until(lambda: not conn.exists(), 5, "the connection file removed")
    assert "Traceback" not in run.output()


def test_wrong_calls_say_why_and_an_unclosed_monitor_closes_at_exit(tmp_path, monkeypatch):
    run_id = uuid.uuid4().hex[:8]
    monkeypatch.setenv("RINGTOP_TEST_RUN_ID", run_id)
    ranks = run_worker_script(TESTS / "helpers" / "own_loop_unclosed.py", [], tmp_path, nproc=2, timeout_s=120)
    errors = ranks[0]
    assert "does not take steps" in errors["unknown option"]
    assert "--run-id '../x'" in errors["bad run id"]
    assert "DistributedDataParallel model or an FSDP2" in errors["not wrapped"]
    assert "give it as text" in errors["metrics as a tuple"]
    assert "must be a torch.optim.Optimizer" in errors["not an optimizer"]
    assert all("\n" not in text for text in errors.values())
    for rank in (0, 1):
        messages = read_log(tmp_path / "logs" / f"rank-{rank}.jsonl")
        assert [m.step for m in messages if isinstance(m, Step)] == [1, 2, 3, 4, 5, 6]
        assert isinstance(messages[-1], Bye) and messages[-1].ok and messages[-1].step == 6
        stalls = [m for m in messages if isinstance(m, Stall) and m.state == "stalled"]
        assert stalls and all(m.step == 6 for m in stalls), f"rank {rank}: the stall of step 6 reported"
        if rank == 1:
            assert "own_loop_unclosed.py" in stalls[0].where, stalls[0].where
    assert not connection_file.file_for(run_id).exists()
    named = [m for m in read_log(tmp_path / "logs" / "rank-0.jsonl") if isinstance(m, Event) and m.kind == "nonfinite"]
    assert [(m.step, m.data.get("ranks")) for m in named] == [(4, [1])], "the diverging rank is named"
