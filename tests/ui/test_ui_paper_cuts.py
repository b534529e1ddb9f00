"""Issue 28 (5), the UI's paper cuts, through the real app: the palette's Enter runs the match
the user sees highlighted, a switch asks before it is sent, `?` opens the keys help."""

from __future__ import annotations

import re

import msgspec
import pytest
from test_switch_picker import FakeRankZero, attach
from test_tui_app import wait_until
from ui_waits import repainted

from ringtop.tui.app import RingtopApp

pytestmark = pytest.mark.timeout(60)
SIZE = (140, 40)


def burst(app: RingtopApp, keys: list[str]) -> None:
    """Keys as a terminal delivers a quick typist's: all queued before the app handles the first
    (Pilot's `press` waits for the app to go idle after each key)."""
    from textual import events

    for key in keys:
        event = events.Key(key, key if len(key) == 1 else None)
        event.set_sender(app)
        app._driver.send_message(event)


async def open_palette(app: RingtopApp, pilot) -> None:
    from textual.command import CommandPalette

    await pilot.press("ctrl+p")
    await wait_until(pilot, lambda: isinstance(app.screen, CommandPalette), what="the palette")
    await repainted(pilot)


@pytest.mark.parametrize(
    ("typed", "sent"),
    [
        ("prof", [("profile", {"steps": 3})]),
        ("micro", []),  # a ddp run has no micro-batches: no match, so nothing (was: the first entry, a full checkpoint)
        ("sharded checkpoint", []),  # the words out of order match nothing
    ],
)
async def test_palette_enter_right_after_typing_runs_the_highlighted_match_or_nothing(typed, sent):
    """Typed then Enter at once (before the palette's search came back): Enter ran the first entry
    of the unfiltered list, a full checkpoint. Now it runs the filtered list's highlighted match."""
    from textual.command import CommandList
    from textual.widgets import Input

    with FakeRankZero() as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=SIZE) as pilot:
            await attach(app, pilot)
            await open_palette(app, pilot)
            burst(app, [*typed, "enter"])
            palette = app.screen

            def settled() -> bool:
                """A match: the palette closed on it. None: the search of all that was typed came back
                empty (the keys after Enter queue behind it, so Enter was taken with that list)."""
                if sent or app.screen is not palette:
                    return app.screen is not palette
                shown = palette.query_one(CommandList)
                empty = shown.option_count == 0 or shown.get_option_at_index(0).id == palette._NO_MATCHES
                return palette.query_one(Input).value == typed and empty and not (
                    getattr(palette, "searching", lambda: False)() or getattr(palette, "enter_waiting", False))

            await wait_until(pilot, settled, what="the palette's search")
            if app.screen is palette:
                await pilot.press("escape")
            await pilot.press("s")  # status: the last command on the same socket, so all before it arrived
            await wait_until(pilot, lambda: any(c.cmd == "status" for c in run.commands), what="status")
            assert [(c.cmd, c.args) for c in run.commands] == [*sent, ("status", {})]


async def test_palette_enter_runs_the_match_the_cursor_moved_to():
    from textual.command import CommandList
    from textual.widgets import Input

    with FakeRankZero() as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=SIZE) as pilot:
            await attach(app, pilot)
            await open_palette(app, pilot)
            palette = app.screen
            palette.query_one(Input).value = "checkpoint"  # as typed

            def filtered() -> bool:  # the search of what was typed is done and on screen
                shown = palette.query_one(CommandList)
                prompts = [str(shown.get_option_at_index(i).prompt) for i in range(shown.option_count)]
                return not palette.searching() and bool(prompts) and all("Checkpoint" in p for p in prompts)

            await wait_until(pilot, filtered, what="the palette's filtered list")
            await pilot.press("down", "enter")
            await wait_until(pilot, lambda: run.commands, what="the command from the palette")
            assert [(c.cmd, c.args) for c in run.commands] == [("checkpoint", {"kind": "sharded", "async": True})]


# ---------------------------------------------------------------------- the switch picker


def test_the_hello_says_zero_is_unavailable_without_deepspeed_and_an_own_loop_takes_no_switch(monkeypatch):
    import sys

    from ringtop.agent.loop.switch_offer import switch_unavailable

    assert switch_unavailable() == {}  # DeepSpeed is installed here
    assert set(switch_unavailable(own_loop=True)) == {"*"}
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # as tests/helpers/agent_without_deepspeed.py: import fails
    missing = switch_unavailable()
    assert set(missing) == {"zero1", "zero2", "zero3"} and "DeepSpeed is not installed" in missing["zero1"]


def test_a_hello_of_an_older_agent_decodes_and_offers_every_target():
    from test_tui_app import make_hello

    from ringtop.protocol import Hello

    old = msgspec.json.decode(msgspec.json.encode(make_hello(0)))
    del old["switch_unavailable"]
    assert msgspec.json.decode(msgspec.json.encode(old), type=Hello).switch_unavailable == {}


NO_DEEPSPEED = {"switch_unavailable": {z: "DeepSpeed is not installed" for z in ("zero1", "zero2", "zero3")}}


async def test_the_picker_offers_only_what_the_run_can_do_and_starts_on_the_current_strategy():
    from textual.widgets import DataTable

    from ringtop.tui.screens import SwitchPicker

    with FakeRankZero(strategy="ddp", hello=NO_DEEPSPEED) as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=SIZE) as pilot:
            await attach(app, pilot)
            await wait_until(pilot, lambda: app.view.facts.switch_unavailable, what="the Hello's switch offer")
            await pilot.press("S")
            await wait_until(pilot, lambda: isinstance(app.screen, SwitchPicker), what="the picker")
            table = app.screen.query_one(DataTable)
            assert [k.value for k in table.rows] == ["ddp", "fsdp-full", "fsdp-grad-op", "fsdp-no-shard", "tp"]
            assert table.cursor_row == 0 and str(table.get_cell("ddp", "strategy")).startswith("▶ ")
            assert "not offered: zero1, zero2, zero3: DeepSpeed is not installed" in " ".join(
                str(app.screen.query_one("#switch-title").content).split()
            )


async def test_an_own_loop_run_offers_no_switch():
    with FakeRankZero(hello={"switch_unavailable": {"*": "an own loop"}}) as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=SIZE) as pilot:
            await attach(app, pilot)
            await wait_until(pilot, lambda: app.view.facts.switch_unavailable, what="the Hello's switch offer")
            await repainted(pilot)
            assert app.check_action("switch", ()) is False and app.check_action("checkpoint", ()) is not False
            assert not any("Switch" in c.title for c in app.get_system_commands(app.screen))
            await pilot.press("S", "s")  # S does nothing; s (status) goes out
            await wait_until(pilot, lambda: run.commands, what="status")
            assert [c.cmd for c in run.commands] == ["status"] and app.screen is app.screen_stack[0]


# ---------------------------------------------------------------------- keys help


async def test_question_mark_opens_the_keys_help_and_escape_closes_it():
    from test_tui_app import make_hello

    from ringtop.tui.keys_help import KeysHelp
    from ringtop.tui.run_commands import RUN_COMMANDS

    app = RingtopApp(messages=[make_hello(0), make_hello(1)], source="log")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.replay_loaded, what="replay")
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, KeysHelp), what="the keys help")
        text = str(app.screen.query_one("#keys-text").content)
        for c in RUN_COMMANDS:
            assert c.title.rstrip("…") in text, c.title
        assert "this help" in text and "Filter the ranks" in text
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, KeysHelp), what="the help to close")
        assert app.screen is app.screen_stack[0]
        await pilot.press("escape")  # Escape on the Overview does not open it again, nor quit
        assert app.is_running and app.screen is app.screen_stack[0]


# ---------------------------------------------------------------------- no internal names


def screen_words(app: RingtopApp) -> str:
    """Every text on the screen: the Statics, the tables' cells, the event log's lines."""
    from textual.widgets import DataTable, RichLog, Static

    parts = [str(w.content) for w in app.screen.query(Static) if w.display]
    for table in app.screen.query(DataTable):
        parts += [str(c) for row in table.rows for c in table.get_row(row)]
    for log in app.screen.query(RichLog):
        parts += [strip.text for strip in log.lines]
    return "\n".join(parts)


SNAKE_CASE = re.compile(r"\b(?!all_reduce|all_gather|reduce_scatter|all_to_all)[a-z]+(?:_[a-z0-9]+)+\b")
"""An identifier; torch.distributed's collectives keep the names the user calls them by."""


async def test_no_verdict_rule_event_kind_or_evidence_key_is_shown_as_an_identifier():
    """Every rule the agent raises, a verdict cleared, their evidence, on every tab: words only."""
    from test_tui_app import make_hello, make_step

    from ringtop.protocol import Event

    rules = {
        "straggler": {"compute_ms": 210.0, "others_compute_ms": 58.0},
        "comm_bound": {"exposed_comm_share": 0.4, "exposed_comm_ms": 40.0, "achieved_gbps": 2.5,
                       "link_peak_gbps": 25.0},
        "input_stall": {"data_ms": 30.0, "step_ms": 100.0},
        "memory_pressure": {"reserved_share": 0.97, "alloc_retries": 3},
    }
    msgs = [make_hello(0), make_hello(1)]
    msgs += [make_step(r, n, n, 1000.0 + n) for n in range(1, 30) for r in (0, 1)]
    for i, (rule, evidence) in enumerate(rules.items()):
        msgs.append(
            Event(
                rank=0,
                seq=40 + i,
                ts=1030.0 + i,
                level="warn",
                kind="verdict",
                text="",
                step=20,
                data={"rule": rule, "rank": 1, "evidence": evidence, "advice": "x"},
            )
        )
    msgs.append(
        Event(
            rank=0,
            seq=50,
            ts=1040.0,
            level="info",
            kind="verdict_cleared",
            text="",
            step=25,
            data={"rule": "straggler", "rank": 1},
        )
    )
    msgs.append(Event(rank=0, seq=51, ts=1041.0, level="warn", kind="memory_pressure", text="", step=25))
    app = RingtopApp(messages=msgs, source="log")
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: app.replay_loaded, what="replay")
        seen = ""
        for tab in "123456":
            await pilot.press(tab)
            await repainted(pilot)
            text = screen_words(app)
            seen += text
            assert not SNAKE_CASE.findall(text), (tab, SNAKE_CASE.findall(text))
        for words in (
            "communication-bound",
            "waiting for input data",
            "memory pressure",
            "data wait ms",
            "verdict cleared",
        ):
            assert words in seen, words


async def test_stop_from_the_palette_asks_first_as_the_key_does():
    """ctrl+p, `stop`, Enter: the same question as `X`; no sends nothing, yes sends the stop."""
    from textual.command import CommandList
    from textual.widgets import Input

    from ringtop.tui.confirm import ConfirmStop

    with FakeRankZero() as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=SIZE) as pilot:
            await attach(app, pilot)
            for answer in ("n", "y"):
                await open_palette(app, pilot)
                palette = app.screen
                palette.query_one(Input).value = "stop"  # as typed

                def filtered(palette=palette) -> bool:
                    shown = palette.query_one(CommandList)
                    prompts = [str(shown.get_option_at_index(i).prompt) for i in range(shown.option_count)]
                    return not palette.searching() and bool(prompts) and "Stop the run" in prompts[0]

                await wait_until(pilot, filtered, what="the palette's filtered list")
                await pilot.press("enter")
                await wait_until(pilot, lambda: isinstance(app.screen, ConfirmStop), what="the stop question")
                assert not any(c.cmd == "stop" for c in run.commands), "nothing sent before the answer"
                await pilot.press(answer)
                await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmStop), what="the answer")
                if answer == "n":
                    await pilot.press("s")  # status: the next command on the same socket, after any stop
                    await wait_until(pilot, lambda: run.commands, what="status")
                    assert [c.cmd for c in run.commands] == ["status"], "no: nothing was sent"
            await wait_until(pilot, lambda: len(run.commands) == 2, what="the stop")
            assert [(c.cmd, c.args) for c in run.commands][1] == ("stop", {"reason": "from the UI"})
