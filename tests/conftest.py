"""Shared helpers: launch real multi-rank agent runs on loopback and always clean them up."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ringtop.agent.lifecycle import EXIT_WITH_PARENT_ENV, exit_with_parent
from ringtop.cli.launch import stop_ranks
from ringtop.protocol import Step, free_tcp_ports, read_log

TESTS_DIR = Path(__file__).resolve().parent

# The suite starts hundreds of Python processes (ranks, launchers, CLIs, workers); where the
# environment forbids bytecode caches each would compile ringtop's ~90 modules anew, 0.2 s of CPU,
# and pytest would rewrite every test module's asserts again at each run (caches: __pycache__/).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


@dataclass
class AgentRun:
    proc: subprocess.Popen
    publish: str
    relay: str
    control: str
    log_dir: Path
    checkpoint_dir: Path
    output_path: Path
    nproc: int
    argv: list[str] = field(default_factory=list)
    run_id: str = ""

    def connection(self, timeout_s: float = 90):
        """Rank 0's connection file (its addresses and the run's client keys), once written."""
        from ringtop.protocol import connection_file

        path = connection_file.file_for(self.run_id)

        def written():
            if self.proc.poll() is not None:
                raise AssertionError(f"run exited ({self.proc.returncode}) before rank 0 was up:\n"
                                     f"{self.output()[-3000:]}")
            return path.exists() and connection_file.read(path)
        return poll_until(written, timeout_s, f"connection file of run {self.run_id}")

    @property
    def keys(self):
        return self.connection().keys

    def send_command(self, cmd: str, args: dict, timeout_s: float = 60):
        """The replies to one command, sent with the run's keys, as `ringtop ctl` does."""
        from ringtop.cli.ctl import send_command

        info = self.connection()
        return send_command(self.control or info.control, cmd, args, timeout_s, info.keys)

    def wait(self, timeout_s: float = 90) -> int:
        return self.proc.wait(timeout_s)

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def messages(self, rank: int) -> list:
        return read_log(self.log_dir / f"rank-{rank}.jsonl")

    def steps(self, rank: int) -> list[Step]:
        return [m for m in self.messages(rank) if isinstance(m, Step)]

    def wait_for_step(self, step: int, timeout_s: float = 60) -> None:
        def reached() -> bool:
            if all(any(s.step >= step for s in self.steps(r)) for r in range(self.nproc)):
                return True
            if self.proc.poll() is not None:
                raise AssertionError(f"run exited ({self.proc.returncode}) before step {step}:\n"
                                     f"{self.output()[-3000:]}")
            return False
        poll_until(reached, timeout_s, f"step {step}", interval_s=0.1, detail=lambda: self.output()[-3000:])


SUITE_ALL = os.environ.get("RINGTOP_SUITE_ALL") == "1"
further = pytest.mark.further
"""A variant whose code path another test of the default suite already runs (tests/README.md):
skipped unless RINGTOP_SUITE_ALL=1 (or the variable its mark names, `further(env=...)`, is 1);
`RINGTOP_SUITE_ALL=1 python -m pytest -m further` runs exactly these."""


def pytest_configure(config):
    """On a pytest-xdist worker: ports picked for runs come from the worker's own share of the spare
    range (endpoints.SPARE_PORTS_ENV, inherited by every process the worker starts), so a port one
    worker picked and has not bound yet is never picked by another."""
    from ringtop.protocol.endpoints import SPARE_PORTS_ENV, spare_port_range

    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()):
        return
    low, high = spare_port_range()
    share = (high - low) // int(count)
    mine = low + int(worker[2:]) * share
    os.environ[SPARE_PORTS_ENV] = f"{mine}-{mine + share}"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Skip the `further` variants unless RINGTOP_SUITE_ALL=1 or their own variable is 1; under
    pytest-xdist, keep the tests that share a run on one worker (`_share_one_worker`)."""
    _share_one_worker(config, items)
    for item in items:
        mark = item.get_closest_marker("further")
        if mark is None or SUITE_ALL:
            continue
        env = mark.kwargs.get("env")
        if env and os.environ.get(env) == "1":
            continue
        also = f" or {env}=1" if env else ""
        item.add_marker(pytest.mark.skip(reason=f"a further variant, left out for the suite's time: "
                                                f"RINGTOP_SUITE_ALL=1{also}"))


def _share_one_worker(config, items) -> None:
    """On pytest-xdist workers (`-n 2 --dist loadgroup`, tests/README.md) each test runs wherever a
    worker is free; tests that share a module- or session-scoped fixture of the suite's (a finished
    run, a reference) get one `xdist_group` mark, so the fixture is built once, not once per worker.
    A fixture every test uses (the runtime folder) groups nothing."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    shared: dict[pytest.Item, set[str]] = {}
    for item in items:
        info = getattr(item, "_fixtureinfo", None)  # the fixtures a test uses, its own and theirs
        defs = info.name2fixturedefs.items() if info is not None else ()
        shared[item] = {name if d[-1].scope == "session" else item.nodeid.split("::")[0]
                        for name, d in defs if d and d[-1].scope != "function" and d[-1].baseid}
    everywhere = set.intersection(*shared.values()) if shared else set()
    group: dict[str, str] = {}

    def root(key: str) -> str:
        while group.setdefault(key, key) != key:
            key = group[key]
        return key
    for item in items:
        keys = sorted(shared[item] - everywhere)
        for key in keys[1:]:
            group[root(key)] = root(keys[0])
    for item in items:
        keys = shared[item] - everywhere
        if keys:
            item.add_marker(pytest.mark.xdist_group(root(min(keys))))


def poll_until(condition, timeout_s: float, what: str, interval_s: float = 0.05, detail=None):
    """Wait for a state, not for a time: `condition()` until it is truthy (returned) or
    `timeout_s` passes (AssertionError naming `what`, then `detail()` if given: e.g. a run's output)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s" + (f":\n{detail()}" if detail else ""))
        time.sleep(interval_s)


def agent_env() -> dict[str, str]:
    """As `ringtop run` starts ranks: one intra-op thread, and every process of the run ends with
    its parent (a pytest killed mid-test leaves no rank behind)."""
    env = dict(os.environ)
    env[EXIT_WITH_PARENT_ENV] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), str(TESTS_DIR / "helpers"), env.get("PYTHONPATH", "")])
    # No background warm-up for switching (DeepSpeed's import: seconds of CPU per rank, on 2 cores
    # shared by both ranks) unless a test asks for it: test_switch.py runs with it, as users do.
    env.setdefault("RINGTOP_PREWARM", "0")
    return env


def stop_process_group(proc: subprocess.Popen) -> None:
    """Stop a launcher and every rank it started (ranks live in sessions of their own)."""
    stop_ranks(proc)


def run_worker_script(script: Path, args: list[str], out: Path, nproc: int, timeout_s: float) -> list[dict]:
    """`script ARGS... OUT` on `nproc` ranks (rank_launcher); each rank writes
    OUT/rank-R.json, returned in rank order. The launcher's output goes to OUT/output.txt."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    cmd = [*rank_launcher(nproc), str(script), *args, str(out)]
    log = out / "output.txt"
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=agent_env(), start_new_session=True,
                                preexec_fn=exit_with_parent)
    try:
        rc = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        stop_process_group(proc)
    assert rc == 0, f"{script.name} {' '.join(args)} exited with {rc}:\n{log.read_text(errors='replace')[-4000:]}"
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(nproc)]


def rank_launcher(nproc: int, torchrun: bool = False) -> list[str]:
    """The command that starts `nproc` ranks of what follows it: the suite's own launcher
    (tests/helpers/rank_launcher.py), or torch's elastic one where a test is about torchrun's part."""
    if torchrun:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return [sys.executable, str(TESTS_DIR / "helpers" / "rank_launcher.py"), str(nproc), sys.executable]


def start_agents(workdir: Path, nproc: int, *agent_args: str, entry: str | None = None,
                 default_ports: bool = False, torchrun: bool = False) -> AgentRun:
    """`nproc` ranks through the suite's launcher (`torchrun`: torch's elastic one; nproc=0: one
    process without a launcher), with free loopback ports and a private log dir under `workdir`.
    `entry`: a script to run instead of `-m ringtop.agent`. `default_ports`: no addresses given,
    as a user starts a run (then `run.connection()` has them)."""
    ports = free_tcp_ports(3)
    publish, relay, control = ("" if default_ports else f"tcp://127.0.0.1:{p}" for p in ports)
    log_dir, ckpt_dir, output_path = workdir / "logs", workdir / "checkpoints", workdir / "output.txt"
    workdir.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:8]
    addresses = [] if default_ports else ["--publish", publish, "--relay", relay, "--control", control]
    argv = [*addresses, "--log-dir", str(log_dir), "--checkpoint-dir", str(ckpt_dir), "--dist-timeout-s", "60",
            "--run-id", run_id, *agent_args]
    target = [entry] if entry else ["-m", "ringtop.agent"]
    if nproc == 0:
        cmd = [sys.executable, *target, *argv]
    else:
        cmd = [*rank_launcher(nproc, torchrun), *target, *argv]
    with open(output_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=agent_env(), start_new_session=True,
                                preexec_fn=exit_with_parent)
    return AgentRun(proc, publish, relay, control, log_dir, ckpt_dir, output_path, max(nproc, 1), argv, run_id)


def finished_agents(workdir: Path, nproc: int, *agent_args: str, timeout_s: float = 200) -> AgentRun:
    """`start_agents`, waited for until it ends with exit code 0 (its output's tail otherwise);
    every process it started is stopped in any case."""
    run = start_agents(workdir, nproc, *agent_args)
    try:
        assert run.wait(timeout_s) == 0, run.output()[-4000:]
    finally:
        stop_process_group(run.proc)
    return run


@pytest.fixture(autouse=True, scope="session")
def _suite_runtime_dir(tmp_path_factory):
    """The suite's runs write their connection files into a folder of their own, never the user's
    (so `ringtop ui` in a test can only find the test's run)."""
    from ringtop.protocol.connection_file import RUNTIME_ENV

    before = os.environ.get(RUNTIME_ENV)
    os.environ[RUNTIME_ENV] = str(tmp_path_factory.mktemp("runtime"))
    yield
    if before is None:
        os.environ.pop(RUNTIME_ENV, None)
    else:
        os.environ[RUNTIME_ENV] = before


@pytest.fixture(scope="session")
def finished_ddp_run(tmp_path_factory) -> AgentRun:
    """One finished 2-rank DDP run (6 steps, batch 4, sequence 64) for the tests that only read its
    logs (test_report.py's page, test_mfu_run.py's TFLOP/s): one launch instead of one each."""
    return finished_agents(tmp_path_factory.mktemp("ddp-6-steps"), 2, "--steps", "6", "--batch-size", "4",
                           "--seq-len", "64", timeout_s=150)


@pytest.fixture
def gatekeeper():
    """(Gatekeeper, RunKeys) of a fresh 2-rank run, for servers a test builds itself: pass
    `gate=` to them, then start the gatekeeper. Stopped at teardown."""
    from ringtop.agent.transport.gatekeeper import Gatekeeper
    from ringtop.protocol import curve

    keys = curve.generate(world_size=2)
    gate = Gatekeeper(keys)
    yield gate, keys
    gate.stop()


@pytest.fixture
def launch_agents(tmp_path):
    """launch(nproc, *agent_args, name=...) -> AgentRun; every run is stopped at teardown."""
    runs: list[AgentRun] = []

    def launch(nproc: int, *agent_args: str, name: str | None = None, entry: str | None = None,
               default_ports: bool = False, torchrun: bool = False) -> AgentRun:
        run = start_agents(tmp_path / (name or f"run{len(runs)}"), nproc, *agent_args, entry=entry,
                           default_ports=default_ports, torchrun=torchrun)
        runs.append(run)
        return run

    yield launch
    for run in runs:
        stop_process_group(run.proc)

