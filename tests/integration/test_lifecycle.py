"""No rank outlives the command that started it: `ringtop run` stopped by SIGTERM (timeout,
scancel, systemd), SIGHUP (the ssh session dropped) or even SIGKILL leaves no agent behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import agent_env, further, poll_until

from ringtop.cli.launch import descendants, kill_all
from ringtop.protocol import Bye, Step, free_tcp_port, read_log

pytestmark = pytest.mark.timeout(150)


def agent_args(tmp_path: Path) -> list[str]:
    ports = [f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(3)]
    return ["--steps", "0", "--batch-size", "2", "--seq-len", "16", "--log-dir", str(tmp_path / "logs"),
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--publish", ports[0], "--relay", ports[1],
            "--control", ports[2]]


def trained(log_dir: Path) -> bool:
    return all(any(isinstance(m, Step) for m in read_log(log_dir / f"rank-{r}.jsonl")) for r in (0, 1))


@contextmanager
def training_cli(tmp_path: Path):
    """`ringtop run --nproc 2` training; yields (cli process, log dir, every process below it once
    both ranks trained). Whatever is left is killed at the end, also when the test failed."""
    out = open(tmp_path / "cli.txt", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "ringtop.cli", "run", "--nproc", "2", "--", *agent_args(tmp_path)],
                            stdout=out, stderr=subprocess.STDOUT, env=agent_env(), start_new_session=True)
    out.close()
    log_dir, family = tmp_path / "logs", []
    try:
        def started():
            assert proc.poll() is None, (tmp_path / "cli.txt").read_text(errors="replace")[-3000:]
            return trained(log_dir)
        poll_until(started, 90, "both ranks training", interval_s=0.2)
        family = descendants(proc.pid)
        yield proc, log_dir, family
    finally:
        kill_all([proc.pid, *family])


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(pid)
        except OSError:
            pass
    return out


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """The processes of `pids` still alive after waiting up to `timeout_s` for them to go."""
    try:
        poll_until(lambda: not alive(pids), timeout_s, "processes to end", interval_s=0.2)
    except AssertionError:
        pass
    return alive(pids)


@pytest.mark.parametrize("sig", [pytest.param(signal.SIGTERM, marks=further), signal.SIGHUP],
                         ids=["SIGTERM", "SIGHUP"])  # one handler for both in cli/launch.py
def test_a_stop_signal_to_ringtop_run_stops_every_rank_cleanly(tmp_path, sig):
    with training_cli(tmp_path) as (proc, log_dir, family):
        assert len(family) >= 3, "a launcher and two ranks"
        os.kill(proc.pid, sig)  # the CLI alone, as timeout(1) or a dropped ssh session would
        assert proc.wait(60) == 128 + sig
        assert wait_gone(family, 30) == [], "a process outlived `ringtop run`"
        for rank in (0, 1):
            last = read_log(log_dir / f"rank-{rank}.jsonl")[-1]
            assert isinstance(last, Bye), f"rank {rank} did not stop cleanly: {last}"
        assert f"{sig.name}: stopping the ranks" in (tmp_path / "cli.txt").read_text()


def test_ctrl_c_to_ringtop_run_is_a_stop_by_ctrl_c_not_a_failure(tmp_path):
    """SIGINT to the CLI alone, as a terminal's Ctrl-C reaches it (the ranks are in their own session)."""
    with training_cli(tmp_path) as (proc, log_dir, family):
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 130
        assert wait_gone(family, 30) == [], "a process outlived `ringtop run`"
        text = (tmp_path / "cli.txt").read_text(errors="replace")
        last = text.strip().splitlines()[-1]
        assert last.startswith("ringtop: the run stopped by Ctrl-C at step ") and last.endswith("(exit code 130)"), last
        assert "the run failed" not in text and "launcher exit code" not in text
        for rank in (0, 1):  # each rank's own Bye says who stopped it
            bye = read_log(log_dir / f"rank-{rank}.jsonl")[-1]
            assert isinstance(bye, Bye) and bye.reason == "interrupted: SIGINT", bye


@further
def test_ctl_stop_ends_ringtop_run_with_exit_code_0_and_says_who_stopped_it(tmp_path):
    with training_cli(tmp_path) as (proc, log_dir, family):
        hello = next(m for m in read_log(log_dir / "rank-0.jsonl") if m.__struct_config__.tag == "hello")
        ctl = subprocess.run([sys.executable, "-m", "ringtop.cli", "ctl", "--run", hello.run_id, "stop"],
                             capture_output=True, text=True, env=agent_env(), timeout=60)
        assert ctl.returncode == 0, ctl.stdout + ctl.stderr
        assert proc.wait(60) == 0
        last = (tmp_path / "cli.txt").read_text(errors="replace").strip().splitlines()[-1]
        assert last.startswith("ringtop: the run stopped by ctl stop at step "), last


def test_sigkill_to_ringtop_run_still_leaves_no_rank(tmp_path):
    with training_cli(tmp_path) as (proc, _, family):
        os.kill(proc.pid, signal.SIGKILL)  # no handler runs: the kernel tells the launcher (PR_SET_PDEATHSIG)
        proc.wait(10)
        assert wait_gone(family, 30) == [], "a process outlived a SIGKILLed `ringtop run`"


def test_a_rank_whose_launcher_is_killed_stops(tmp_path):
    """The launcher itself SIGKILLed: each rank asked the kernel for a SIGTERM when its parent dies."""
    with training_cli(tmp_path) as (proc, log_dir, family):
        launcher = family[0]
        ranks = descendants(launcher)
        os.kill(launcher, signal.SIGKILL)
        assert wait_gone(ranks, 30) == [], "a rank outlived its launcher"
        for rank in (0, 1):
            assert isinstance(read_log(log_dir / f"rank-{rank}.jsonl")[-1], Bye)


def test_a_killed_rank_is_named_when_ringtop_run_exits(tmp_path):
    with training_cli(tmp_path) as (proc, _, family):
        rank1 = next(pid for pid in family if _rank_of(pid) == 1)
        os.kill(rank1, signal.SIGKILL)
        code = proc.wait(90)
        assert code not in (0, 128 + signal.SIGTERM)
        assert wait_gone(family, 30) == []
        out = (tmp_path / "cli.txt").read_text(errors="replace")
        report = out[out.index("ringtop: the run failed:"):].strip().splitlines()
        assert report[1].startswith("  rank 1: ended without a Bye after step "), report  # the first to go first
        assert "(killed by SIGKILL)" in report[1], report
        assert report[2].startswith(f"  rank 0: error: rank 1 (pid {rank1}) has died"), "the survivor names its peer"
        assert report[-1] == f"  the launcher's full report: {tmp_path / 'logs' / 'agents.log'}", report
        assert len(report) == 4, report


def _rank_of(pid: int) -> int | None:
    try:
        environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def test_a_stop_signal_while_the_ui_runs_stops_every_rank(tmp_path):
    """`ringtop run --ui` on a real pseudo-terminal: SIGTERM while the UI is up stops the ranks too."""
    import fcntl
    import pty
    import struct
    import termios
    import threading

    log_dir = tmp_path / "logs"
    argv = [sys.executable, "-m", "ringtop.cli", "run", "--nproc", "2", "--ui", "--", *agent_args(tmp_path)]
    env = agent_env()
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI on the terminal
        os.execve(sys.executable, argv, env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    screen = bytearray()

    def drain():
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                return
            if not data:
                return
            screen.extend(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    family: list[int] = []
    try:
        poll_until(lambda: trained(log_dir), 90, "both ranks training under the UI", interval_s=0.2)
        family = descendants(pid)
        os.kill(pid, signal.SIGTERM)
        def exit_status():
            done, status = os.waitpid(pid, os.WNOHANG)
            return (status,) if done else None
        (status,) = poll_until(exit_status, 60, "the CLI to exit", interval_s=0.1)
        assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGTERM
        assert wait_gone(family, 30) == [], "a rank outlived `ringtop run --ui`"
        reader.join(10)  # what the CLI wrote last is read once it has exited
        assert b"\x1b[?1049l" in screen, "the terminal's main screen is given back"
    finally:
        kill_all([pid, *family])
        os.close(fd)


def test_the_signal_that_ended_a_rank_is_read_from_the_launchers_own_report(tmp_path):
    """The report as torch's elastic launcher formats it (its own ChildFailedError), not a copy."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from ringtop.cli.launch_report import launcher_exits

    failures = {1: ProcessFailure(local_rank=1, pid=4242, exitcode=-signal.SIGKILL, error_file=str(tmp_path / "none")),
                0: ProcessFailure(local_rank=0, pid=4241, exitcode=1, error_file=str(tmp_path / "none")),
                3: ProcessFailure(local_rank=1, pid=4243, exitcode=-signal.SIGSEGV, error_file=str(tmp_path / "none"))}
    report = ChildFailedError("ringtop.agent", failures).format_msg()
    assert launcher_exits(f"some rank output\n{report}\nmore") == {1: -signal.SIGKILL, 0: 1, 3: -signal.SIGSEGV}
    assert launcher_exits("rank 1 said: exitcode -9 somewhere") == {}
