"""Reading a log directory of rank-R.jsonl files for replay, with real files."""

import pytest

from ringtop.protocol import Bye, Hello, Step, to_json_line
from ringtop.tui.sources.replay import ReplayError, load_replay


def write_rank(path, msgs, tail=b""):
    path.write_bytes(b"".join(to_json_line(m) for m in msgs) + tail)


def test_merge_by_ts_and_report_torn_and_bad_lines(tmp_path):
    r0 = [Hello(rank=0, seq=0, ts=1.0, run_id="r", world_size=2),
          Step(rank=0, seq=1, ts=3.0, step=1, loss=2.0, step_ms=10.0),
          Step(rank=0, seq=2, ts=5.0, step=2, loss=1.9, step_ms=10.0),
          Bye(rank=0, seq=3, ts=7.0, reason="finished", step=2)]
    r1 = [Hello(rank=1, seq=0, ts=2.0, run_id="r", world_size=2),
          Step(rank=1, seq=1, ts=4.0, step=1, loss=2.1, step_ms=11.0),
          Step(rank=1, seq=2, ts=6.0, step=2, loss=2.0, step_ms=11.0)]
    # rank 0: a garbage line in the middle (line 3)
    lines0 = [to_json_line(m) for m in r0]
    lines0.insert(2, b"{this is not json\n")
    (tmp_path / "rank-0.jsonl").write_bytes(b"".join(lines0))
    # rank 1: the last line torn mid-write
    torn = to_json_line(Bye(rank=1, seq=3, ts=8.0, reason="finished"))[:25]
    write_rank(tmp_path / "rank-1.jsonl", r1, tail=torn)
    (tmp_path / "notes.txt").write_text("ignored")

    messages, problems = load_replay(tmp_path)
    assert [m.ts for m in messages] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert [(type(m).__name__, m.rank) for m in messages][:2] == [("Hello", 0), ("Hello", 1)]
    assert len(problems) == 2
    assert "rank-0.jsonl: line 3 skipped" in problems[0]
    assert problems[1] == "rank-1.jsonl: last line is incomplete (torn write), skipped"


def test_last_line_without_newline_but_complete_is_kept(tmp_path):
    data = to_json_line(Hello(rank=0, ts=1.0, run_id="r", world_size=1)).rstrip(b"\n")
    (tmp_path / "rank-0.jsonl").write_bytes(data)
    messages, problems = load_replay(tmp_path)
    assert len(messages) == 1 and problems == []


def test_same_ts_keeps_each_files_order(tmp_path):
    write_rank(tmp_path / "rank-0.jsonl", [Hello(rank=0, seq=0, ts=5.0, run_id="r", world_size=1),
                                           Step(rank=0, seq=1, ts=5.0, step=0, loss=1.0, step_ms=1.0),
                                           Bye(rank=0, seq=2, ts=5.0)])
    messages, _ = load_replay(tmp_path)
    assert [m.seq for m in messages] == [0, 1, 2]


def test_missing_dir_and_empty_dir(tmp_path):
    with pytest.raises(ReplayError, match="does not exist"):
        load_replay(tmp_path / "nope")
    with pytest.raises(ReplayError, match="no rank-R.jsonl files"):
        load_replay(tmp_path)
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ReplayError, match="not a directory"):
        load_replay(f)


def test_nothing_readable_is_an_error(tmp_path):
    (tmp_path / "rank-0.jsonl").write_bytes(b'{"v": 1, "type": "nonsense"}\n{"torn')
    with pytest.raises(ReplayError, match="no readable messages") as err:
        load_replay(tmp_path)
    assert "line 1" in str(err.value)


def test_run_replay_bad_dir_exit_code(tmp_path, capsys):
    from ringtop.tui.app import run_replay

    assert run_replay(tmp_path / "missing") == 2
    assert "does not exist" in capsys.readouterr().err
