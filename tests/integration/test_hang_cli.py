"""A hang outside the UI: `ringtop ctl stacks` printed for a person (a real control socket that
answers like rank 0), and the end summary's stall episodes and rank 0's hang verdicts, from logs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import hang_scenario as hs
import pytest
import zmq
from background_socket import BackgroundSocket

from ringtop.cli.ctl import result_text, run_ctl
from ringtop.cli.summary import hang_lines, print_summary, stall_episodes
from ringtop.protocol import Event, Reply, decode, encode, to_json_line

STACKS = {"answered": 3, "missing": [3], "groups": [
    {"ranks": [2], "label": "rank 2", "phase": "forward", "where": "model.py:57 in forward", "step": 412,
     "running_s": 41.25, "stack": ["/a/train.py:10 in main", "/a/model.py:57 in forward",
                                   "/usr/lib/python3.12/time.py:1 in sleep"], "in_flight": []},
    {"ranks": [0, 1], "label": "ranks 0–1", "phase": "backward", "where": "train.py:120 in hook", "step": 412,
     "running_s": 41.0, "stack": ["/a/train.py:10 in main", "/a/train.py:120 in hook"],
     "in_flight": ["all_reduce #21 on group world (4.0MiB) for 40.0 s"]}]}


def test_stacks_result_reads_as_groups_with_their_stacks_innermost_last():
    assert result_text("stacks", STACKS).splitlines() == [
        "  3 of 4 ranks answered, 2 distinct stacks",
        "  rank 2 (1): forward, model.py:57 in forward, step 412, running 41.2 s",
        "    stack, innermost last:",
        "      /a/train.py:10 in main",
        "      /a/model.py:57 in forward",
        "      /usr/lib/python3.12/time.py:1 in sleep",
        "  ranks 0–1 (2): backward, train.py:120 in hook, step 412, running 41.0 s",
        "    waiting in all_reduce #21 on group world (4.0MiB) for 40.0 s",
        "    stack, innermost last:",
        "      /a/train.py:10 in main",
        "      /a/train.py:120 in hook",
        "  missing: rank 3 did not answer in time (stuck whole, dead, or its telemetry thread is blocked)",
    ]
    # other commands as before: one key a line
    assert result_text("dump", {"directory": "/x/dumps", "ranks": 4}) == "  directory: /x/dumps\n  ranks: 4"


def test_a_stacks_result_of_the_wrong_shape_is_left_out_not_trusted():
    odd = {"answered": "3", "missing": ["x", 2], "groups": [7, {"ranks": "0", "stack": "not a list", "step": True}]}
    lines = result_text("stacks", odd).splitlines()
    assert lines[0] == "  ranks answered: ?, 1 distinct stack"
    assert lines[1].startswith("  no rank (0): phase unknown, where unknown")
    assert lines[-1].startswith("  missing: rank 2 did not answer")


class FakeControl(BackgroundSocket):
    """A ROUTER answering `stacks` at once with `done`, as rank 0's control server does (insecure)."""

    def _run(self) -> None:
        router = zmq.Context.instance().socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(self.address)
        self.bound.set()
        try:
            while not self.stop.is_set():
                if router.poll(20):
                    ident, payload = router.recv_multipart()
                    cmd = decode(payload)
                    router.send_multipart([ident, encode(Reply(rank=0, ts=time.time(), id=cmd.id, status="done",
                                                               cmd=cmd.cmd, result=STACKS))])
        finally:
            router.close()


@pytest.mark.timeout(30)
def test_ctl_stacks_prints_the_groups_and_json_stays_the_reply(capsys):
    with FakeControl() as server:
        assert run_ctl(server.address, None, "stacks", [], 5.0, as_json=False) == 0
        out = capsys.readouterr().out
        assert out.startswith("stacks: done\n  3 of 4 ranks answered")
        assert "      /a/model.py:57 in forward\n" in out and "missing: rank 3" in out
        assert run_ctl(server.address, None, "stacks", [], 5.0, as_json=True) == 0
        reply = json.loads(capsys.readouterr().out)
        assert reply["status"] == "done" and reply["result"] == STACKS


def write_logs(directory: Path, msgs: list) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for rank in sorted({m.rank for m in msgs}):
        mine = sorted((m for m in msgs if m.rank == rank), key=lambda m: m.ts)
        (directory / f"rank-{rank}.jsonl").write_bytes(b"".join(to_json_line(m) for m in mine))
    return directory


def hang_event(n: int, ts: float, text: str, **data) -> Event:
    return Event(rank=0, seq=n, ts=ts, level="info" if data.get("cleared") else "error", kind="hang", text=text,
                 step=6, data=data)


def test_summary_counts_the_stall_episodes_names_the_culprit_and_lists_rank_0s_verdicts(tmp_path, capsys,
                                                                                       monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    seq = hs.Seq()
    verdict = {"verdict": "hang", "culprits": [3], "waiting": [0, 1, 2], "group": "world", "seq": 21}
    msgs = hs.hung_run(seq=seq) + [
        hang_event(seq(0), hs.T0 + 4, "rank 3 has not entered all_reduce #21 … for 1 s", **verdict),
        hang_event(seq(0), hs.T0 + 34, "rank 3 has not entered all_reduce #21 … for 31 s", **verdict),  # restated
        *hs.recovered(4, seq),
        hang_event(seq(0), hs.T0 + 40.5, "the stall is over after 37 s: every rank is stepping again", cleared=True),
        Event(rank=0, seq=seq(0), ts=hs.T0 + 41, level="error", kind="desync", text="desync in step 7 on group world",
              step=7, data={"step": 7, "group": "world", "culprits": [1], "agreeing": [0, 2, 3]}),
    ]
    logs = write_logs(tmp_path / "log", msgs)
    (episode,) = stall_episodes(logs)
    assert (episode.ranks, episode.step, episode.longest_s, episode.end_ts) == ({0, 1, 2, 3}, 6, 41.0, hs.T0 + 40)
    assert episode.verdict.kind == "hang" and episode.verdict.culprits == (3,)
    print_summary(logs)
    out = capsys.readouterr().out
    assert "stalls: 1 episode, the longest 41 s (step 6); culprits: rank 3" in out
    assert ("20:26:43–20:27:20  step 6, ranks 0–3 stalled, up to 41 s: rank 3 has not entered all_reduce #21 on "
            "group world (4.0MiB) that ranks 0–2 have waited in for 40 s") in out
    assert "  ✖ 20:26:44 hang: rank 3 has not entered all_reduce #21 … for 1 s (restated 1×)" in out
    assert "  ✓ 20:27:20 hang: the stall is over after 37 s" in out
    assert "  ✖ 20:27:21 desync: desync in step 7 on group world" in out
    monkeypatch.undo()
    time.tzset()


def test_a_run_whose_logs_end_while_stuck_says_so_and_a_clean_run_says_nothing(tmp_path):
    seq = hs.Seq()
    logs = write_logs(tmp_path / "stuck", hs.hung_run(seq=seq, reports=1) + [hs.failed_bye(3, seq(3))])
    (episode,) = stall_episodes(logs)  # the culprit died: the others wait for it to the end of the logs
    assert episode.end_ts is None and episode.verdict.kind == "dead" and episode.verdict.culprits == (3,)
    logs = write_logs(tmp_path / "killed", hs.hung_run(reports=2))
    (episode,) = stall_episodes(logs)
    assert episode.end_ts is None and "the end of the logs" in hang_lines(logs)[1]
    assert hang_lines(write_logs(tmp_path / "clean", hs.hung_run(reports=0))) == []
