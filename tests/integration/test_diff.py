"""`ringtop diff` on real runs that differ by one known change each, and on two identical runs.

The runs are launched at the same time (the real `ringtop run`, 2 gloo ranks each), so
both meet the same machine: a shared, noisy machine's drift between one minute and the next is
not what the comparison is about. What the diff says is held against the logs read with the json
module alone, not ringtop's reader."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import agent_env, further, stop_process_group

from ringtop.protocol import free_tcp_ports

STEPS = 40
TINY = ["--steps", str(STEPS), "--seq-len", "16", "--dist-timeout-s", "60"]
SLOW_MS = 250


def launch_together(root: Path, runs: dict[str, list[str]], timeout_s: float = 240) -> dict[str, Path]:
    """Every run of `runs` (name -> agent flags) at once, each with its own ports; their log dirs."""
    ports = free_tcp_ports(3 * len(runs))
    procs, dirs = {}, {}
    try:
        for i, (name, flags) in enumerate(runs.items()):
            p = ports[3 * i:3 * i + 3]
            dirs[name] = root / name
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "ringtop.cli", "run", "--nproc", "2", "--quiet", "--", *TINY, *flags,
                 "--log-dir", str(dirs[name]), "--publish", f"tcp://127.0.0.1:{p[0]}",
                 "--relay", f"tcp://127.0.0.1:{p[1]}", "--control", f"tcp://127.0.0.1:{p[2]}"],
                cwd=root, env=agent_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL, start_new_session=True)
        for name, proc in procs.items():
            _, err = proc.communicate(timeout=timeout_s)
            assert proc.returncode == 0, (name, err.decode()[-2000:])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                stop_process_group(proc)
    return dirs


def diff(a: Path, b: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringtop.cli", "diff", str(a), str(b), *extra], capture_output=True,
                          text=True, timeout=60, env=agent_env())


def diff_json(a: Path, b: Path) -> dict:
    done = diff(a, b, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def calls_per_step_from_the_logs(log_dir: Path, kind: str, steps: range) -> float:
    """Calls of `kind` per step and rank over `steps`, read from the JSONL with json alone."""
    calls, rows = 0, 0
    for path in log_dir.glob("rank-*.jsonl"):
        for line in path.read_text().splitlines():
            m = json.loads(line)
            if m.get("type") == "step" and m["step"] in steps:
                calls += sum(c["count"] for c in m["comm"] if c["kind"] == kind)
                rows += 1
    return calls / rows


def mean_step_ms_from_the_logs(log_dir: Path, steps: range) -> float:
    """Each rank's mean step over `steps`, averaged over ranks, read with json alone."""
    by_rank: dict[int, list[float]] = {}
    for path in log_dir.glob("rank-*.jsonl"):
        for line in path.read_text().splitlines():
            m = json.loads(line)
            if m.get("type") == "step" and m["step"] in steps:
                by_rank.setdefault(m["rank"], []).append(m["step_ms"])
    return sum(sum(v) / len(v) for v in by_rank.values()) / len(by_rank)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diff-runs")
    batch = ["--batch-size", "2"]
    return launch_together(root, {"a": batch, "a_again": batch, "bucket": [*batch, "--ddp-bucket-cap-mb", "0.2"],
                                  "slow": [*batch, "--inject-slow-rank", f"1:{SLOW_MS}"]})


def readings(d: dict) -> list[dict]:
    return d["per_step"] + [r for c in d["collectives"] for r in c["readings"]] + d["memory"] + d["ranks"]


@pytest.mark.timeout(600)
def test_two_identical_runs_differ_in_nothing(runs):
    d = diff_json(runs["a"], runs["a_again"])
    assert d["verdict"].startswith("B steps like A"), d["verdict"]
    assert d["config"] == [] and d["environment"] == []
    assert [r["name"] for r in readings(d) if r["significant"]] == [], d["verdict"]
    assert d["loss"]["identical"] is True, "same seed, same strategy, gloo on CPU: the same losses bit for bit"
    assert d["aligned"] and d["steps"]["count"] >= 20
    steps = range(d["steps"]["first"], d["steps"]["last"] + 1)
    for side, run in (("a", "a"), ("b", "a_again")):
        parts = d["where_the_step_went_ms"][side]
        assert sum(parts.values()) == pytest.approx(mean_step_ms_from_the_logs(runs[run], steps), rel=1e-6)


@pytest.mark.timeout(600)
def test_a_smaller_ddp_bucket_is_named_with_the_all_reduces_it_adds(runs):
    d = diff_json(runs["a"], runs["bucket"])
    assert d["config"] == [{"what": "bucket_cap_mb", "flag": "--ddp-bucket-cap-mb", "a": None, "b": 0.2,
                            "default": 25}]
    assert "--ddp-bucket-cap-mb 25 (default) → 0.2" in d["verdict"]
    (all_reduce,) = [c for c in d["collectives"] if c["kind"] == "all_reduce"]
    calls, nbytes = all_reduce["readings"][:2]
    steps = range(d["steps"]["first"], d["steps"]["last"] + 1)
    assert calls["a"] == pytest.approx(calls_per_step_from_the_logs(runs["a"], "all_reduce", steps))
    assert calls["b"] == pytest.approx(calls_per_step_from_the_logs(runs["bucket"], "all_reduce", steps))
    assert calls["b"] > calls["a"] and calls["judgement"] == "differs"
    assert nbytes["judgement"] == "same", "the same gradients, cut into more buckets"
    assert f"all_reduce {calls['a']:g} → {calls['b']:g} calls per step" in d["verdict"]


@pytest.mark.timeout(600)
def test_an_injected_slow_rank_is_the_verdict_with_its_compute(runs):
    d = diff_json(runs["a"], runs["slow"])
    step = d["per_step"][0]
    assert step["name"] == "step time" and step["significant"] and step["delta"] > 0.5 * SLOW_MS, d["verdict"]
    by_rank = {r["rank"]: r for r in d["ranks"]}
    assert by_rank[1]["significant"] and by_rank[1]["delta"] > 0.4 * SLOW_MS  # the sleep frees a core for others
    assert abs(by_rank[0]["delta"]) < 0.5 * by_rank[1]["delta"], "rank 0 waits for rank 1: in comm, not compute"
    assert "rank 1 compute +" in d["verdict"] and d["config"] == [], "an injected fault is no config change"
    text = diff(runs["a"], runs["slow"])
    assert text.returncode == 0 and text.stdout.splitlines()[0] == d["verdict"]
    assert "Welch's t-test" in text.stdout
    shown = subprocess.run([sys.executable, "-m", "ringtop.cli", "summary", str(runs["slow"])], capture_output=True,
                           text=True, timeout=60, env=agent_env()).stdout
    share = {int(m[1]): float(m[2]) for m in re.finditer(r"^  rank (\d+) +[\d.]+ ms = compute (\d+)%", shown, re.M)}
    assert share[1] > share[0] + 20, ("the slow rank's step is mostly its own compute, rank 0's mostly waiting", shown)


@further
@pytest.mark.timeout(600)
def test_a_strategy_and_micro_batch_change_name_their_collectives(tmp_path):
    dirs = launch_together(tmp_path, {"ddp": ["--batch-size", "4"], "fsdp": ["--batch-size", "4", "--strategy", "fsdp"],
                                      "pp2": ["--batch-size", "4", "--strategy", "pp", "--micro-batches", "2"],
                                      "pp4": ["--batch-size", "4", "--strategy", "pp", "--micro-batches", "4"]})
    d = diff_json(dirs["ddp"], dirs["fsdp"])
    assert {"what": "strategy", "flag": "--strategy", "a": "ddp", "b": "fsdp"} in d["config"]
    kinds = {c["kind"]: c["readings"][0] for c in d["collectives"]}
    assert kinds["all_reduce"]["b"] == 0 and kinds["reduce_scatter"]["b"] > 0 and kinds["all_gather"]["b"] > 0
    d = diff_json(dirs["pp2"], dirs["pp4"])
    assert d["config"] == [{"what": "micro_batches", "flag": "--micro-batches", "a": 2, "b": 4}]
    (p2p,) = [c for c in d["collectives"] if c["kind"] == "p2p"]
    assert p2p["readings"][0]["b"] == 2 * p2p["readings"][0]["a"], "twice the micro-batches, twice the sends"


def test_a_folder_without_logs_is_one_line_and_exit_2(tmp_path):
    done = diff(tmp_path, tmp_path / "nowhere")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"ringtop diff: error: no rank-R.jsonl files in {str(tmp_path)!r} (a run's --log-dir holds them)"]


def test_every_flag_the_diff_names_is_one_the_agent_or_run_takes():
    from ringtop.cli.diff import CONFIG_FLAGS, OPTION_FLAGS

    helps = "".join(subprocess.run([sys.executable, "-m", *cmd, "--help"], capture_output=True, text=True,
                                   timeout=60, env=agent_env()).stdout for cmd in (["ringtop.agent"],
                                                                                    ["ringtop.cli", "run"]))
    named = set(CONFIG_FLAGS.values()) | set(OPTION_FLAGS.values())
    assert [flag for flag in sorted(named) if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helps)] == []
