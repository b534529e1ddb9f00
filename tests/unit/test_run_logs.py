"""A run's logs read back across the launcher's restarts (protocol/run_logs.py,
agent/loop/previous_attempts.py): each rank's log cut into its attempts, and how the attempt before
a restart ended — a rank the launcher saw killed by a signal named so, not only "without a Bye"."""

from __future__ import annotations

from ringtop.agent.loop.previous_attempts import attempt_end_words
from ringtop.protocol import Bye, Event, Heartbeat, Hello, Step
from ringtop.protocol.run_logs import LauncherFailures, attempt_of, attempts, launcher_failures, silent_end

LAUNCHER = """\
W1207 17:23:14.545000 1987 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 2123 closing signal SIGTERM
E1207 17:23:15.813000 1987 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 2124) of binary: /usr/bin/python3
E1207 17:24:01.100000 1987 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 2201) of binary: /usr/bin/python3
"""  # noqa: E501 - the launcher's lines as it prints them


def hello(rank: int, pid: int, restart: int, seq: int = 0, ts: float = 100.0) -> Hello:
    return Hello(rank=rank, seq=seq, ts=ts, run_id="r", world_size=2, pid=pid, restart_count=restart)


def first_attempt(rank: int, pid: int) -> list:
    steps = [Step(rank=rank, seq=n, ts=100.0 + n, step=n, loss=1.0, step_ms=10.0) for n in (1, 2, 3)]
    return [hello(rank, pid, 0), *steps]


def test_a_log_is_cut_where_a_new_process_begins_even_before_its_hello():
    log = [*first_attempt(0, 2123), Bye(rank=0, seq=4, ts=104.0, reason="error: peer died", ok=False),
           Event(rank=0, seq=0, ts=110.0, kind="auth", text="refused"),  # the next process, before its Hello
           hello(0, 2200, 1, seq=1, ts=110.5), hello(0, 2200, 1, seq=2, ts=111.0),  # its Hello, repeated
           Step(rank=0, seq=3, ts=112.0, step=1, loss=1.0, step_ms=10.0)]
    parts = attempts(log)
    assert [len(p) for p in parts] == [5, 4] and [attempt_of(p) for p in parts] == [0, 1]
    assert isinstance(parts[0][-1], Bye)  # the first attempt ends with its own Bye
    assert attempts([]) == [[]] and attempt_of([]) == 0


def test_the_launchers_failures_name_how_a_rank_without_a_bye_ended():
    assert launcher_failures(LAUNCHER) == {2124: -9, 2201: 1}
    assert silent_end(first_attempt(1, 2124), launcher_failures(LAUNCHER)) == "killed by SIGKILL"
    assert silent_end(first_attempt(0, 2201), launcher_failures(LAUNCHER)) == "exited with code 1"
    assert silent_end(first_attempt(1, 999), launcher_failures(LAUNCHER)) == "ended without a Bye"


def test_the_attempt_before_a_restart_ended_with_the_killed_rank_not_its_peers_error():
    killed = [*first_attempt(1, 2124), Heartbeat(rank=1, seq=4, ts=104.5, step=3)]  # SIGKILL: no Bye
    peer = [*first_attempt(0, 2123), Bye(rank=0, seq=4, ts=105.0, step=3, ok=False,
                                          reason="error: rank 1 (pid 2124) has died; DistBackendError")]
    logs = [(0, [*peer, hello(0, 2200, 1, ts=120.0)]), (1, [*killed, hello(1, 2201, 1, ts=120.0)])]
    assert attempt_end_words(logs, 0, launcher_failures(LAUNCHER)) == "rank 1 killed by SIGKILL at step 3"
    # without the launcher's word the same end is only silence: the check above needs it
    assert attempt_end_words(logs, 0, {}) == "rank 1 ended without a Bye at step 3"
    assert attempt_end_words(logs, 1, {}) == "rank 0 ended without a Bye"  # the new attempt, read on its own


def test_the_launchers_output_is_followed_as_it_grows_a_line_once_whole(tmp_path):
    out = tmp_path / "agents.log"
    lines = LAUNCHER.splitlines(keepends=True)
    out.write_text(lines[0] + lines[1][:60])  # the failure line half written
    follow = LauncherFailures(out)
    assert follow() == {}
    with open(out, "a") as f:
        f.write(lines[1][60:] + lines[2])
    assert follow() == {2124: "killed by SIGKILL", 2201: "exited with code 1"}
    assert LauncherFailures(tmp_path / "none.log")() == {}
