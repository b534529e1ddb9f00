"""Helpers the benchmarks share: start a real multi-rank agent run on loopback (the pattern of
tests/conftest.py's `start_agents`, through benchmarks/_timed_agent.py so start-up, switch and save
phases are timed), send it commands, read its JSONL logs, stop it."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringtop.cli.ctl import send_command
from ringtop.cli.launch import stop_ranks
from ringtop.protocol import Event, Hello, Step, free_tcp_ports, read_log

HERE = Path(__file__).resolve().parent
TIMED_AGENT = HERE / "_timed_agent.py"


@dataclass
class AgentRun:
    proc: subprocess.Popen
    control: str
    log_dir: Path
    checkpoint_dir: Path
    phases_dir: Path
    output_path: Path
    nproc: int
    launched_at: float
    argv: list[str] = field(default_factory=list)

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def messages(self, rank: int) -> list:
        return read_log(self.log_dir / f"rank-{rank}.jsonl")

    def steps(self, rank: int = 0) -> list[Step]:
        return [m for m in self.messages(rank) if isinstance(m, Step)]

    def hello_ts(self, rank: int = 0) -> float | None:
        hellos = [m.ts for m in self.messages(rank) if isinstance(m, Hello)]
        return hellos[0] if hellos else None

    def wait_for_event(self, kind: str, timeout_s: float = 120, poll_s: float = 0.1) -> Event:
        """Until rank 0 has logged an event of `kind`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            hits = [m for m in self.messages(0) if isinstance(m, Event) and m.kind == kind]
            if hits:
                return hits[0]
            if self.proc.poll() is not None:
                raise RuntimeError(f"run exited ({self.proc.returncode}) before a {kind} event:\n"
                                   f"{self.output()[-3000:]}")
            time.sleep(poll_s)
        raise TimeoutError(f"no {kind} event within {timeout_s}s:\n{self.output()[-3000:]}")

    def last_step(self, rank: int = 0) -> int:
        steps = self.steps(rank)
        return steps[-1].step if steps else 0

    def wait_for_step(self, step: int, timeout_s: float = 600, poll_s: float = 0.05) -> float:
        """Until every rank has logged a step >= `step`; returns the latest of the ranks' first
        such record's `ts` (when the step was done, not when the file was read)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            firsts = []
            for r in range(self.nproc):
                hit = [s.ts for s in self.steps(r) if s.step >= step]
                if not hit:
                    break
                firsts.append(hit[0])
            else:
                return max(firsts)
            if self.proc.poll() is not None:
                raise RuntimeError(f"run exited ({self.proc.returncode}) before step {step}:\n{self.output()[-3000:]}")
            time.sleep(poll_s)
        raise TimeoutError(f"no step {step} within {timeout_s}s:\n{self.output()[-3000:]}")

    def phases(self, rank: int = 0, since: float = 0.0) -> list[dict[str, Any]]:
        path = self.phases_dir / f"rank-{rank}.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec["start"] >= since:
                out.append(rec)
        return out


def agent_env(phases_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    env["RINGTOP_BENCH_PHASES"] = str(phases_dir)
    return env


def start_agents(workdir: Path, nproc: int, *agent_args: str) -> AgentRun:
    ports = free_tcp_ports(3)
    publish, relay, control = (f"tcp://127.0.0.1:{p}" for p in ports)
    workdir.mkdir(parents=True, exist_ok=True)
    log_dir, ckpt_dir, phases_dir = workdir / "logs", workdir / "checkpoints", workdir / "phases"
    output_path = workdir / "output.txt"
    argv = ["--publish", publish, "--relay", relay, "--control", control, "--log-dir", str(log_dir),
            "--checkpoint-dir", str(ckpt_dir), "--dist-timeout-s", "300", *agent_args]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(TIMED_AGENT), *argv]
    launched_at = time.time()
    with open(output_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=agent_env(phases_dir),
                                start_new_session=True)
    return AgentRun(proc, control, log_dir, ckpt_dir, phases_dir, output_path, nproc, launched_at, argv)


@dataclass
class CommandResult:
    result: dict[str, Any]
    sent_at: float
    ack_s: float
    done_s: float
    """Wall time from sending the command to the done reply."""


def command(run: AgentRun, cmd: str, args: dict[str, Any], timeout_s: float = 600) -> CommandResult:
    sent = time.time()
    t0 = time.perf_counter()
    ack_s = float("nan")
    for reply in send_command(run.control, cmd, args, timeout_s):
        if reply.status == "ack":
            ack_s = time.perf_counter() - t0
        elif reply.status == "done":
            return CommandResult(dict(reply.result), sent, ack_s, time.perf_counter() - t0)
        else:
            raise RuntimeError(f"{cmd} {args}: error [{reply.code}] {reply.error}")
    raise RuntimeError(f"{cmd} {args}: no done reply")


def stop(run: AgentRun, timeout_s: float = 120) -> float:
    """The `stop` command, then wait for the launcher to exit; seconds from sending to exit."""
    t0 = time.perf_counter()
    try:
        command(run, "stop", {"reason": "benchmark"}, timeout_s)
        run.proc.wait(timeout_s)
    except Exception:
        stop_ranks(run.proc)
        raise
    return time.perf_counter() - t0


def kill(run: AgentRun) -> None:
    stop_ranks(run.proc)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def phase_sums(records: list[dict[str, Any]], depth_max: int = 99) -> dict[str, float]:
    """Seconds per phase name (calls summed), rounded."""
    out: dict[str, float] = {}
    for r in records:
        if r["depth"] <= depth_max:
            out[r["phase"]] = out.get(r["phase"], 0.0) + r["s"]
    return {k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}
