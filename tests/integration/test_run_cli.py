"""The command line a user meets first, through the real `ringtop` (subprocesses, torch's own
launcher): `run` without `--ui` keeps logs and says how far it is, a failure is a line per rank
and a file, a bad value is one line, `--connect` finds the run's keys on its node."""

from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import agent_env, further, poll_until

from ringtop.cli.launch_report import LauncherOutput, failure_report, grouped, rank_causes
from ringtop.cli.progress import ProgressPrinter, progress_line
from ringtop.metrics import fmt
from ringtop.protocol import Bye, Hello, Step, free_tcp_ports, read_log, to_json_line
from ringtop.protocol import connection_file as cf

PROGRESS = re.compile(r"^ringtop: step (\d+)/(\d+)  loss (\S+)  (\S+) ms/step  (\S+) tok/s$")
TINY = ["--batch-size", "2", "--seq-len", "16", "--dist-timeout-s", "60"]


def ringtop(*args: str, cwd: Path, timeout_s: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringtop.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=agent_env(), timeout=timeout_s, stdin=subprocess.DEVNULL)


def addresses() -> list[str]:
    ports = [f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(3)]  # three picks of one may be the same port
    return ["--publish", ports[0], "--relay", ports[1], "--control", ports[2]]


def step(rank: int, n: int, loss: float | None, step_ms: float, tokens_per_s: float) -> Step:
    return Step(rank=rank, step=n, loss=loss, step_ms=step_ms, tokens=32, tokens_per_s=tokens_per_s)


# ---------------------------------------------------------------- the progress line, pure


def test_the_progress_line_is_the_step_all_reached_rank_0s_loss_the_slowest_step_and_the_summed_rate():
    latest = {1: step(1, 12, 3.5, 250.0, 1500.0), 0: step(0, 13, 2.25, 200.0, 2500.0)}
    assert progress_line(latest, 100) == "step 12/100  loss 2.250  250.0 ms/step  4.0k tok/s"
    assert progress_line({0: step(0, 7, None, 9.5, 12.0)}) == "step 7  loss n/a  9.5 ms/step  12 tok/s"


def test_the_progress_printer_tails_a_growing_log_and_prints_only_when_the_run_moved(tmp_path):
    earlier = tmp_path / "rank-1.jsonl"  # an earlier run's, in a reused log folder: not this run's rank 1
    earlier.write_bytes(to_json_line(step(1, 1, 9.0, 10, 3200)))
    os.utime(earlier, (earlier.stat().st_mtime - 3600,) * 2)
    log = tmp_path / "rank-0.jsonl"
    log.write_bytes(to_json_line(Hello(run_id="r", world_size=1, steps=50)) + to_json_line(step(0, 1, 4.0, 10, 3200)))
    out = io.StringIO()
    printer = ProgressPrinter(tmp_path, every_s=0.05, out=out).start()
    try:
        poll_until(lambda: "step 1/50" in out.getvalue(), 10, "a first progress line")
        line = to_json_line(step(0, 2, 3.0, 20, 1600))
        with open(log, "ab") as f:
            f.write(line[:9])  # a line half written is not read
            f.flush()
            poll_until(lambda: out.getvalue().count("\n") == 1, 10, "no line for a torn step")
            f.write(line[9:])
        poll_until(lambda: "step 2/50  loss 3.000  20.0 ms/step  1.6k tok/s" in out.getvalue(), 10, "a second line")
    finally:
        printer.stop()
    assert out.getvalue().count("\n") == 2, out.getvalue()  # no line again for a step already told


# ---------------------------------------------------------------- the failure report, pure


def test_a_rank_killed_without_a_bye_is_named_before_the_rank_its_death_failed(tmp_path):
    (tmp_path / "rank-0.jsonl").write_bytes(
        to_json_line(step(0, 3, 1.0, 5, 1)) + to_json_line(Bye(rank=0, ok=False, reason="error: rank 1\n has died")))
    (tmp_path / "rank-1.jsonl").write_bytes(to_json_line(step(1, 3, 1.0, 5, 1)))
    launcher = "rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 77)\n"
    assert rank_causes(tmp_path, launcher) == [(1, "ended without a Bye after step 3 (killed by SIGKILL)"),
                                               (0, "error: rank 1 has died")]


def test_ranks_failing_alike_are_one_line_and_the_launchers_own_lines_are_only_in_the_file(tmp_path):
    output = ("ringtop agent [rank 2]: no connection file written (disk full)\n"  # a warning, not what ended it
              "ringtop agent [rank 1]: error: no module 'x'ringtop agent [rank 0]: error: no module 'x'\n\n"
              "E1204 18:23:13.261000 8093 torch/distributed/elastic/multiprocessing/api.py:1002] failed\n"
              "Traceback (most recent call last):\n  rank      : 2 (local_rank: 2)\n  exitcode  : -15 (pid: 9)\n")
    report = failure_report(None, 1, output, tmp_path / "agents.log")
    assert report == ["ringtop: the run failed:", "  ranks 0, 1: error: no module 'x'",
                      "  rank 2: stopped by the launcher (SIGTERM) after another rank failed",
                      f"  the launcher's full report: {tmp_path / 'agents.log'}"]
    assert grouped([(3, "a"), (1, "b"), (2, "a")]) == [([3, 2], "a"), ([1], "b")]


def test_the_launchers_output_is_kept_whole_and_only_the_ranks_own_lines_pass_on(tmp_path, capfd):
    lines = ["user: epoch 1 of 3\n",
             "ringtop agent [rank 0]: no connection file written (disk full); clients need --connect\n",
             "ringtop agent [rank 1]: error: boomringtop agent [rank 0]: error: boom\n",
             "ringtop agent: error: --steps must be >= 0\n",
             "W1204 18:23:13.245000 8093 torch/distributed/elastic/multiprocessing/api.py:1028] Sending SIGTERM\n",
             "E1204 18:23:13.261000 8093 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2)\n",
             "Traceback (most recent call last):\n", "ChildFailedError:\n"]
    read_end, write_end = os.pipe()
    output = LauncherOutput(os.fdopen(read_end, "rb"), tmp_path / "agents.log")
    with os.fdopen(write_end, "wb") as w:
        w.write("".join(lines).encode())
    assert output.text(timeout_s=10) == "".join(lines), "the file has every line"
    assert capfd.readouterr().err == lines[0] + lines[1], "the user's line and the agent's warning, nothing else"


# ---------------------------------------------------------------- the real command line


@pytest.mark.timeout(180)
def test_run_without_ui_writes_runs_id_and_prints_progress_lines(tmp_path):
    done = ringtop("run", "--nproc", "2", "--progress-every", "0.5", "--", "--steps", "40", *TINY, *addresses(),
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    started = re.fullmatch(r"ringtop: run (\w+) on 2 ranks, logs in runs/(\w+)/", lines[0])
    assert started and started[1] == started[2], lines[0]
    log_dir = tmp_path / "runs" / started[1]
    assert sorted(p.name for p in log_dir.iterdir()) == ["agents.log", "rank-0.jsonl", "rank-1.jsonl"]
    progress = [m for m in map(PROGRESS.match, lines) if m]
    assert progress, done.stderr[-3000:]
    assert progress[-1][1] == "40" and progress[-1][2] == "40", "the last line is the run's last step"
    last = [m for m in read_log(log_dir / "rank-0.jsonl") if isinstance(m, Step)][-1]
    assert progress[-1][3] == fmt.loss(last.loss), "rank 0's loss, as its log has it"
    steps = [int(m[1]) for m in progress]
    assert steps == sorted(set(steps)), "one line per step reached, never one twice"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flag", [pytest.param("--quiet", marks=further), "--no-logs"])  # one code path: no printer
def test_quiet_prints_no_progress_and_no_logs_writes_nothing(tmp_path, flag):
    done = ringtop("run", "--nproc", "1", "--progress-every", "0.2", flag, "--", "--steps", "15", *TINY,
                   *addresses(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not [line for line in done.stderr.splitlines() if PROGRESS.match(line)], done.stderr
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    if flag == "--no-logs":
        assert done.stderr.splitlines()[0].endswith("on 1 rank, no logs")
        assert written == [], written
    else:
        assert len([w for w in written if w.endswith(".jsonl")]) == 1, written


@pytest.mark.timeout(120)
def test_a_launch_failure_is_a_line_per_rank_and_where_the_full_report_is(tmp_path):
    done = ringtop("run", "--nproc", "2", "--", "--model", "no_such_module:build", "--steps", "2", *addresses(),
                   cwd=tmp_path)
    assert done.returncode not in (0, 2), done.stderr
    lines = done.stderr.strip().splitlines()
    log_dir = next((tmp_path / "runs").iterdir())
    assert lines[1:] == ["ringtop: the run failed:",
                         "  ranks 0, 1: error: --model 'no_such_module:build': cannot import module "
                         "'no_such_module': No module named 'no_such_module'",
                         f"  the launcher's full report: runs/{log_dir.name}/agents.log"], done.stderr
    report = (log_dir / "agents.log").read_text()
    assert "Traceback" in report and "Root Cause" in report, "the launcher's own report is kept, whole"
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("argv", [["run", "--nproc", "0"], ["run", "--nproc", "-3", "--", "--steps", "1"],
                                  ["demo", "--headless", "--nproc", "0"]])
def test_a_non_positive_nproc_is_one_line_and_exit_2(tmp_path, argv):
    done = ringtop(*argv, cwd=tmp_path, timeout_s=60)
    assert (done.returncode, done.stdout) == (2, "")
    n = argv[argv.index("--nproc") + 1]
    assert done.stderr.splitlines() == [f"ringtop {argv[0]}: error: --nproc must be >= 1 (ranks on this node), not {n}"]
    assert list(tmp_path.iterdir()) == [], "nothing started, nothing written"


def test_summary_of_an_empty_folder_exits_2_with_one_line_like_replay(tmp_path):
    (tmp_path / "empty").mkdir()
    done = ringtop("summary", "empty", cwd=tmp_path, timeout_s=60)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == ["ringtop: no rank-R.jsonl files in 'empty' (a run's --log-dir holds them)"]
    (tmp_path / "empty" / "rank-0.jsonl").write_bytes(to_json_line(step(0, 1, 2.0, 10, 100)))
    assert ringtop("summary", "empty", cwd=tmp_path, timeout_s=60).returncode == 0, "a folder with a log is summed up"


# ---------------------------------------------------------------- --connect on the run's node


@pytest.mark.parametrize("given, announced, same", [
    ("tcp://127.0.0.1:5557", "tcp://127.0.0.1:5557", True),
    ("tcp://localhost:5557", "tcp://127.0.0.1:5557", True),
    ("tcp://10.0.0.7:5557", "tcp://0.0.0.0:5557", True),
    ("tcp://127.0.0.1:5558", "tcp://127.0.0.1:5557", False),
    ("tcp://10.0.0.7:5557", "tcp://10.0.0.8:5557", False),
    ("127.0.0.1:5557", "tcp://127.0.0.1:5557", False),
])
def test_an_address_is_the_announced_one_by_port_and_host_loopback_alike(given, announced, same):
    assert cf.same_address(given, announced) is same


def test_ui_connect_takes_the_keys_of_the_run_whose_telemetry_address_it_is(tmp_path, monkeypatch):
    """`ringtop ui --connect` resolves its target before the UI starts: the same resolution, in
    process (`ctl --connect` against a live run: test_authentication.py)."""
    from ringtop.cli.live_runs import client_target
    from ringtop.cli.parser import build_parser
    from ringtop.protocol import curve

    monkeypatch.setenv(cf.RUNTIME_ENV, str(tmp_path / "rt"))
    keys = curve.generate(world_size=2).client
    cf.write(cf.ConnectionInfo(run_id="mine", pid=os.getpid(), host=socket.gethostname(),
                               publish="tcp://127.0.0.1:6101", control="tcp://127.0.0.1:6102", keys=keys))
    args = build_parser().parse_args(["ui", "--connect", "tcp://localhost:6101"])
    assert client_target(args, publish_flag=True) == ("tcp://localhost:6101", "tcp://127.0.0.1:6102", keys)
    args = build_parser().parse_args(["ui", "--connect", "tcp://127.0.0.1:6102"])  # its control, not its telemetry
    assert client_target(args, publish_flag=True) is None
