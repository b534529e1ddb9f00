"""The hang watch's reading crosses the wire typed (`Event.hang`): validated once on entry, an older
agent's `data` map read as the same report, and the UI's verdict the one rank 0 made."""

from __future__ import annotations

import json

import msgspec
import pytest

from ringtop.agent.health.hang_watch import report
from ringtop.metrics.rules.hang import HangVerdict
from ringtop.protocol import Event, HangReport, InvalidMessageError, decode, encode, from_json_line, to_json_line
from ringtop.tui.state.reducers.hang import HangBoard

VERDICT = HangVerdict(
    "hang",
    "rank 3 has not entered all_reduce #21 on group world",
    culprits=(3,),
    waiting=(0, 1, 2),
    group="world",
    seq=21,
    collective="all_reduce",
    wait_s=41.25,
    step=6,
    where={3: "in forward at model.py:57"},
)


def hang_line(**fields) -> bytes:
    wire = {
        "type": "event",
        "v": 1,
        "rank": 0,
        "seq": 1,
        "ts": 100.0,
        "level": "error",
        "kind": "hang",
        "text": "rank 3 …",
        **fields,
    }
    return json.dumps(wire).encode()


@pytest.mark.parametrize("codec", ["json", "msgpack"])
def test_rank_0s_verdict_reaches_the_ui_as_it_made_it(codec):
    sent = Event(rank=0, ts=100.0, level="error", kind="hang", text=VERDICT.text, hang=report(VERDICT))
    back = from_json_line(to_json_line(sent)) if codec == "json" else decode(encode(sent))
    assert back == sent
    board = HangBoard()
    board.on_event(back)
    assert board.rank0_verdict(latest_ts=101.0, ended=False) == VERDICT


def test_the_json_line_names_each_culprits_place_by_its_rank():
    line = to_json_line(Event(kind="hang", hang=report(VERDICT)))
    assert json.loads(line)["hang"]["where"] == {"3": "in forward at model.py:57"}


@pytest.mark.parametrize(
    "hang",
    [
        {"verdict": "stuck"},
        {"verdict": "hang", "culprits": [-1]},
        {"verdict": "hang", "culprits": ["3"]},
        {"verdict": "hang", "where": {"x": "in forward"}},
        {"verdict": "cleared", "lasted_s": -1.0},
    ],
    ids=["unknown verdict", "negative rank", "a rank as text", "a place not keyed by rank", "negative time"],
)
@pytest.mark.parametrize("form", ["typed", "data"])
def test_a_bad_reading_is_refused_on_entry_in_either_form(hang, form):
    line = hang_line(hang=hang) if form == "typed" else hang_line(data=hang)
    with pytest.raises(InvalidMessageError):
        from_json_line(line)


def test_a_report_without_its_verdict_is_refused():
    with pytest.raises(InvalidMessageError):
        from_json_line(hang_line(hang={"culprits": [3]}))


def test_a_sound_reading_passes_the_same_checks():
    """The refusals above are the checks biting, not every reading refused."""
    assert from_json_line(hang_line(hang={"verdict": "hang", "culprits": [3], "where": {"3": "x"}})).hang == HangReport(
        verdict="hang", culprits=[3], where={3: "x"}
    )


@pytest.mark.parametrize(
    "kind, data, expected",
    [
        (
            "hang",
            {
                "verdict": "dead",
                "culprits": [2],
                "waiting": [0, 1],
                "group": "0-3",
                "seq": 4,
                "collective": "all_gather",
                "wait_s": 7.5,
                "step": 9,
                "where": {"2": "in backward"},
            },
            HangReport(
                verdict="dead",
                culprits=[2],
                waiting=[0, 1],
                group="0-3",
                seq=4,
                collective="all_gather",
                wait_s=7.5,
                step=9,
                where={2: "in backward"},
            ),
        ),
        ("hang", {"cleared": True, "seconds": 37.2}, HangReport(verdict="cleared", lasted_s=37.2)),
        (
            "desync",
            {"step": 7, "group": "world", "culprits": [1], "agreeing": [0, 2, 3]},
            HangReport(verdict="desync", step=7, group="world", culprits=[1], waiting=[0, 2, 3]),
        ),
    ],
    ids=["hang", "cleared", "desync"],
)
def test_an_older_agents_data_map_is_read_as_the_report(kind, data, expected):
    line = hang_line(kind=kind, data=data)
    for back in (from_json_line(line), decode(msgspec.msgpack.encode(json.loads(line)))):
        assert (back.hang, back.data) == (expected, {})


def test_other_events_keep_their_data_and_carry_no_reading():
    back = from_json_line(hang_line(kind="checkpoint", data={"verdict": "hang", "seconds": 1.5}))
    assert (back.hang, back.data) == (None, {"verdict": "hang", "seconds": 1.5})
