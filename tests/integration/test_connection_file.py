"""Connection files: a client finds this user's runs, and only this user's, without guessing a port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from conftest import agent_env, poll_until

from ringtop.protocol import connection_file as cf
from ringtop.protocol.processes import process_gone


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    path = tmp_path / "rt"
    monkeypatch.setenv(cf.RUNTIME_ENV, str(path))
    return path


def info(run_id: str, pid: int | None = None, host: str | None = None, started: float = 0.0) -> cf.ConnectionInfo:
    return cf.ConnectionInfo(run_id=run_id, pid=os.getpid() if pid is None else pid, host=host or socket.gethostname(),
                             publish="tcp://127.0.0.1:1", control="tcp://127.0.0.1:2",
                             started_ts=started or time.time())


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_written_for_this_user_only_and_read_back(runtime):
    path = cf.write(info("abc123"))
    assert path == runtime / "run-abc123.json"
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(runtime.stat().st_mode & 0o777) == "0o700"
    assert cf.read(path) == info("abc123", started=cf.read(path).started_ts)
    assert [r.run_id for r in cf.live_runs()] == ["abc123"]


def test_a_file_or_folder_others_can_write_is_not_trusted(runtime):
    path = cf.write(info("abc123"))
    path.chmod(0o666)
    with pytest.raises(cf.ConnectionFileError, match="others can write"):
        cf.read(path)
    assert cf.live_runs() == []
    path.chmod(0o600)
    runtime.chmod(0o777)
    assert cf.live_runs() == []
    with pytest.raises(cf.ConnectionFileError, match="others can write"):
        cf.write(info("other"))


def test_stale_and_foreign_files_are_left_out(runtime):
    cf.write(info("live"))
    stale = cf.write(info("stale", pid=dead_pid()))
    cf.write(info("elsewhere", host="some-other-node"))
    (runtime / "run-junk.json").write_bytes(b"\x00not json")
    (runtime / "run-junk.json").chmod(0o600)
    assert [r.run_id for r in cf.live_runs()] == ["live"]
    assert not stale.exists(), "a stale file is removed"


def _proc_state(pid: int) -> str:
    """The process's state letter, read here apart from the code under test."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_a_run_whose_rank_0_is_a_zombie_is_stale(runtime):
    """A rank 0 killed and not yet reaped by its parent is a zombie: `kill(pid, 0)` still succeeds
    on it, yet the run is over. A real child of this test, alive and then exited and left unreaped
    on purpose: listed while it runs, stale (and its file removed) once it is a zombie."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        path = cf.write(info("zombie", pid=child.pid))
        assert [r.run_id for r in cf.live_runs()] == ["zombie"], "a live rank 0 is listed"
        child.stdin.close()  # it exits; nothing here waits for it, so it stays a zombie
        poll_until(lambda: _proc_state(child.pid) == "Z", 30, "the child to exit and stay unreaped")
        os.kill(child.pid, 0)  # the check this replaces: it raises nothing for a zombie
        assert cf.live_runs() == [] and not path.exists(), "a zombie's run is stale"
        assert process_gone(child.pid) and not process_gone(os.getpid())
        assert _proc_state(child.pid) == "Z", "still unreaped: the zombie itself was judged, not a reaped pid"
    finally:
        child.kill()
        child.wait()


def test_find_the_only_run_a_named_one_or_say_why_not(runtime):
    with pytest.raises(cf.ConnectionFileError, match="no run of yours is live"):
        cf.find(None)
    cf.write(info("aaaa1111", started=1.0))
    assert cf.find(None).run_id == "aaaa1111"
    cf.write(info("bbbb2222", started=2.0))
    with pytest.raises(cf.ConnectionFileError, match="several runs of yours.*bbbb2222.*aaaa1111"):
        cf.find(None)
    assert cf.find("bbbb").run_id == "bbbb2222"
    with pytest.raises(cf.ConnectionFileError, match="matches 'cccc'"):
        cf.find("cccc")
    assert cf.find(str(runtime / "run-aaaa1111.json")).run_id == "aaaa1111"


def cli(*args: str, env_runtime) -> subprocess.CompletedProcess:
    env = dict(agent_env(), **{cf.RUNTIME_ENV: str(env_runtime)})
    return subprocess.run([sys.executable, "-m", "ringtop.cli", *args], capture_output=True, text=True, timeout=60,
                          env=env, stdin=subprocess.DEVNULL)


def test_ui_and_ctl_without_a_run_say_so_instead_of_waiting_on_a_port(runtime):
    for args in (("ui",), ("ctl", "status"), ("connect-info",)):
        done = cli(*args, env_runtime=runtime)
        assert done.returncode == 2 and "no run of yours is live on this node" in done.stderr, (args, done.stderr)
    listed = cli("ls", env_runtime=runtime)
    assert listed.returncode == 0 and "no run of yours is live" in listed.stdout


@pytest.mark.timeout(120)
def test_a_run_announces_itself_and_ctl_finds_it(launch_agents):
    run = launch_agents(2, "--steps", "0", "--batch-size", "2", "--seq-len", "16")
    run.wait_for_step(1)
    runs = cf.live_runs()
    assert len(runs) == 1 and (runs[0].publish, runs[0].control, runs[0].world_size) == (run.publish, run.control, 2)
    runtime = cf.runtime_dir()
    listed = cli("ls", env_runtime=runtime)
    assert runs[0].run_id in listed.stdout and run.control in listed.stdout
    status = cli("ctl", "status", "--json", env_runtime=runtime)
    assert status.returncode == 0 and '"world_size":2' in status.stdout.replace(" ", ""), status.stderr
    assert list(run.send_command("stop", {}, timeout_s=60))[-1].status == "done"
    assert run.wait(60) == 0
    assert cf.live_runs() == [] and not list(runtime.glob("run-*.json")), "the file goes with the run"


@pytest.mark.timeout(60)
def test_with_several_live_runs_a_terminal_user_is_asked_which(runtime):
    """On a terminal `ringtop connect-info` (as `ui`) lists the runs and takes the user's pick;
    without a terminal it names them and stops (tested above)."""
    import pty

    cf.write(info("older", started=time.time() - 60))
    cf.write(info("newer"))
    env = {**agent_env(), cf.RUNTIME_ENV: str(runtime)}
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(sys.executable, [sys.executable, "-m", "ringtop.cli", "connect-info"], env)
    out = b""
    try:
        def read_until(marker: bytes) -> bytes:
            nonlocal out
            deadline = time.monotonic() + 30
            while marker not in out:
                assert time.monotonic() < deadline, out.decode(errors="replace")
                out += os.read(fd, 4096)
            return out
        prompt = read_until(b"which one?").decode()
        assert prompt.index("1) newer") < prompt.index("2) older"), prompt
        os.write(fd, b"2\n")
        read_until(b"}")
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert '"run_id": "older"' in out.decode()
