"""The UI never passes wire text raw to the terminal, and never draws phantom ranks: hostile
messages published to the real app over a real socket, checked through a Pilot."""

from __future__ import annotations

import pytest
import zmq
from background_socket import BackgroundSocket
from textual.widgets import DataTable, RichLog, Static
from ui_waits import eventually

from ringtop.protocol import Event, Hello, Reply, Stall, Step, encode
from ringtop.tui.app import RingtopApp
from ringtop.tui.sanitize import visible

pytestmark = pytest.mark.timeout(60)

ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[31m\x9b1m\r"


def hostile_messages(seq: int) -> list[tuple[bytes, object]]:
    hello = [Hello(rank=r, seq=seq, ts=1000.0, run_id="7f3a9c21", world_size=2, host=f"node-{r}{ESCAPES}",
                   strategy="ddp", model="tiny-gpt") for r in (0, 1)]
    return [
        *((f"hello.{h.rank}".encode(), h) for h in hello),
        *((f"step.{r}".encode(), Step(rank=r, seq=seq + 1, ts=1001.0, step=3, loss=2.5, step_ms=100.0))
          for r in (0, 1)),
        (b"event.0", Event(rank=0, seq=seq + 2, ts=1002.0, level="warn", kind="note", text=f"look{ESCAPES}here")),
        (b"reply.0", Reply(rank=0, seq=seq + 3, ts=1003.0, id=f"id{ESCAPES}", status="error", cmd="status",
                           error=f"bad{ESCAPES}")),
        (b"stall.1", Stall(rank=1, seq=seq + 2, ts=1002.0, step=4, phase=f"forward{ESCAPES}", running_s=30.0,
                           where=f"model.py:57 in f{ESCAPES}", stack=[f"/x/model{ESCAPES}.py:57 in f{ESCAPES}"])),
        (b"step.5000", Step(rank=5000, seq=seq, ts=1001.0, step=3, loss=2.5, step_ms=100.0)),  # no such rank
        (b"hello.7", Hello(rank=7, seq=seq, run_id="7f3a9c21", world_size=2)),  # a rank outside its own world
    ]


class HostilePublisher(BackgroundSocket):
    """Publishes the hostile set over and over (PUB/SUB drops what precedes the subscription)."""

    def _run(self) -> None:
        pub = zmq.Context.instance().socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(self.address)
        self.bound.set()
        seq = 0
        try:
            while not self.stop.wait(0.05):
                for topic, msg in hostile_messages(seq):
                    pub.send_multipart([topic, encode(msg)])
                seq += 4
        finally:
            pub.close()


def everything_drawn(app: RingtopApp) -> str:
    """The text of every Static, table cell and event line on screen."""
    parts = [str(w.content) for w in app.query(Static)]
    for table in app.query(DataTable):
        parts += [str(table.get_cell_at((r, c))) for r in range(table.row_count) for c in range(len(table.columns))]
    parts += [strip.text for strip in app.query_one("#event-log", RichLog).lines]
    return "\n".join(parts)


def test_visible_shows_every_control_character_and_keeps_text():
    assert visible("plain text, ünïcode ✓") == "plain text, ünïcode ✓"
    assert visible("a\x1b[2Jb\x07c\x9bd\r\n\te") == "a\\x1b[2Jb\\x07c\\x9bd\\x0d  e"
    assert all(ord(ch) >= 0x20 and not 0x7f <= ord(ch) <= 0x9f for ch in visible("".join(map(chr, range(0x100)))))


async def test_escape_sequences_are_shown_visibly_and_phantom_ranks_are_refused():
    with HostilePublisher() as pub:
        app = RingtopApp(publish_addr=pub.address, control_addr=None)
        async with app.run_test(size=(160, 48)) as pilot:
            def rows_and_events():
                assert set(app.view.ranks) == {0, 1}
                assert app.query_one("#ranks", DataTable).row_count == 2
                assert any("look" in e.text for e in app.view.events)
                assert app.view.rejected_total > 0
            await eventually(pilot, rows_and_events)
            await pilot.press("5")

            def drawn_safely():
                text = everything_drawn(app)
                assert "node-0\\x1b]0;pwned\\x07" in text and "look\\x1b]0;pwned" in text
                assert not any(ord(ch) < 0x20 and ch != "\n" or 0x7f <= ord(ch) <= 0x9f for ch in text)
                assert "rank 5000" in text and "outside the run's 2 ranks" in text
            await eventually(pilot, drawn_safely)
            await pilot.press("6")  # a stall report's phase, frame and stack

            def stack_drawn_safely():
                text = everything_drawn(app)
                assert "/x/model\\x1b]0;pwned" in text and "forward\\x1b]0;pwned" in text
                assert not any(ord(ch) < 0x20 and ch != "\n" or 0x7f <= ord(ch) <= 0x9f for ch in text)
            await eventually(pilot, stack_drawn_safely)
            assert 5000 not in app.view.ranks and 7 not in app.view.ranks


def test_sanitized_escapes_every_string_of_a_message_and_keeps_clean_ones_as_they_are():
    """The receive thread's pass over each message: a control character anywhere (the second
    collective's kind, a dict key) is escaped in a copy; a clean message comes back as itself."""
    from ringtop.protocol import CommStat
    from ringtop.tui.sanitize import sanitized

    def step(*kinds: str) -> Step:
        return Step(rank=0, seq=1, ts=1.0, step=3, loss=2.0, step_ms=10.0, comm=[CommStat(kind=k) for k in kinds])

    clean = step("all_reduce", "all_gather")
    assert sanitized(clean) is clean
    dirty = step("all_reduce", f"ag{ESCAPES}", f"rs{ESCAPES}")
    out = sanitized(dirty)
    assert [c.kind for c in out.comm] == ["all_reduce", visible(f"ag{ESCAPES}"), visible(f"rs{ESCAPES}")]
    assert out.comm[0] is dirty.comm[0] and dirty.comm[1].kind == f"ag{ESCAPES}"  # the original is untouched
    assert not any(ch in kind for kind in (c.kind for c in out.comm) for ch in "\x1b\x07\x9b\r")
    event = Event(rank=0, seq=2, ts=1.0, kind="note", text="ok", data={f"k{ESCAPES}": [f"v{ESCAPES}", 1]})
    (key, value), = sanitized(event).data.items()
    assert key == visible(f"k{ESCAPES}") and value == [visible(f"v{ESCAPES}"), 1]
