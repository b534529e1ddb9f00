"""The actions that send commands, in the real app over real ZeroMQ sockets: the switch picker (the
cost model's numbers per target, Enter sends `switch`, Escape sends nothing), the micro-batch prompt
(checked locally, then `set`), sharded async checkpoints with their progress in the header and the
Events tab, profile with the per-rank result, and the replies (ack, done, error) in the event log.
A ROUTER socket on a thread plays rank 0's control server and answers as the test tells it."""

from __future__ import annotations

import threading
import time

import msgspec
import pytest
import zmq
from test_tui_app import header_text, make_hello, make_step, static_text, wait_until
from textual.widgets import DataTable, Input, Static
from ui_waits import eventually, repainted

from ringtop.protocol import Reply, decode, encode, free_tcp_ports
from ringtop.tui.actions import SWITCH_TARGETS, parse_micro_batches
from ringtop.tui.app import RingtopApp
from ringtop.tui.confirm import ConfirmPrompt
from ringtop.tui.run_commands import COMMAND_ACTIONS
from ringtop.tui.screens import MicroBatchesPrompt, SwitchPicker

pytestmark = pytest.mark.timeout(60)
SIZE = (140, 40)


class FakeRankZero:
    """PUB: Hello and Step of ranks 0 and 1 (a 2-rank gloo DDP run of 1,234,567 fp32 parameters).
    ROUTER: rank 0's control server. Every command gets `ack`, then what `answer(cmd)` returns:
    ("done", result) or ("error", text); ("hold", ...) waits until `release()` before answering."""

    def __init__(self, answer=None, strategy: str = "ddp", hello: dict | None = None) -> None:
        self.strategy = strategy
        self.hello = hello or {}
        """Hello fields other than make_hello's."""
        pub_port, ctl_port = free_tcp_ports(2)
        self.pub_addr = f"tcp://127.0.0.1:{pub_port}"
        self.ctl_addr = f"tcp://127.0.0.1:{ctl_port}"
        self.answer = answer or (lambda cmd: ("done", {}))
        self.commands: list = []
        self.stop = threading.Event()
        self._release = threading.Event()
        self._ready = threading.Barrier(3)
        self.threads = [threading.Thread(target=self._publish, daemon=True),
                        threading.Thread(target=self._control, daemon=True)]

    def release(self) -> None:
        self._release.set()

    def __enter__(self):
        for t in self.threads:
            t.start()
        self._ready.wait(5)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(5)

    def _publish(self) -> None:
        pub = zmq.Context.instance().socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(self.pub_addr)
        self._ready.wait(5)
        seq = {0: 0, 1: 0}
        n = 0
        try:
            while not self.stop.is_set():
                for rank in (0, 1):
                    msg = msgspec.structs.replace(make_hello(rank, seq[rank], time.time(), strategy=self.strategy),
                                                  **self.hello) if n % 10 == 0 else \
                        make_step(rank, n, seq[rank], time.time())
                    seq[rank] += 1
                    pub.send_multipart([msg.__struct_config__.tag.encode(), encode(msg)])
                n += 1
                time.sleep(0.03)
        finally:
            pub.close()

    def _control(self) -> None:
        router = zmq.Context.instance().socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(self.ctl_addr)
        self._ready.wait(5)
        held: list = []
        try:
            while not self.stop.is_set():
                if self._release.is_set():
                    for ident, cmd, result in held:
                        self._reply(router, ident, cmd, "done", result=result)
                    held.clear()
                if not router.poll(20):
                    continue
                ident, payload = router.recv_multipart()
                cmd = decode(payload)
                self.commands.append(cmd)
                self._reply(router, ident, cmd, "ack", result={"applies_at": "next step boundary"})
                kind, what = self.answer(cmd)
                if kind == "hold":
                    held.append((ident, cmd, what))
                elif kind == "error":
                    self._reply(router, ident, cmd, "error", error=what, code="failed")
                else:
                    self._reply(router, ident, cmd, "done", result=what)
        finally:
            router.close()

    @staticmethod
    def _reply(router, ident, cmd, status, result=None, error="", code="") -> None:
        reply = Reply(rank=0, ts=time.time(), id=cmd.id, status=status, cmd=cmd.cmd, result=result or {},
                      error=error, code=code)
        router.send_multipart([ident, encode(reply)])


def event_log_text(app: RingtopApp) -> str:
    from textual.widgets import RichLog

    # lines as the log wraps them, joined again: a wrapped line is one line here
    return " ".join(" ".join(strip.text for strip in app.query_one("#event-log", RichLog).lines).split())


async def attach(app: RingtopApp, pilot) -> None:
    await wait_until(pilot, lambda: app.view.facts.param_count > 0 and app.view.facts.world_size == 2,
                     what="the run's facts")


async def open_picker(app: RingtopApp, pilot, key: str = "S") -> None:
    await pilot.press(key)
    await wait_until(pilot, lambda: isinstance(app.screen, SwitchPicker), what="the picker")


def picker_cell(app: RingtopApp, row: str, col: str) -> str:
    return " ".join(str(app.screen.query_one(DataTable).get_cell(row, col)).split())


async def show_events(app: RingtopApp, pilot, text: str) -> str:
    await pilot.press("5")
    await wait_until(pilot, lambda: text in event_log_text(app), what=repr(text))
    return event_log_text(app)


# ---------------------------------------------------------------------- switch


def test_parse_micro_batches():
    assert parse_micro_batches(" 4 ") == (4, "")
    for bad in ("abc", "", "0", "-2", "2.5", "4x"):
        m, why = parse_micro_batches(bad)
        assert m is None and why


def test_switch_targets_and_their_arguments():
    assert [t.label for t in SWITCH_TARGETS] == ["ddp", "zero1", "zero2", "zero3", "fsdp full", "fsdp grad-op",
                                                 "fsdp no-shard"]
    assert [t.args for t in SWITCH_TARGETS][3:] == [
        {"strategy": "zero3"}, {"strategy": "fsdp", "fsdp_sharding": "full"},
        {"strategy": "fsdp", "fsdp_sharding": "grad-op"}, {"strategy": "fsdp", "fsdp_sharding": "no-shard"}]


def test_mesh_targets_are_tensor_parallelism_and_2d_for_each_degree_that_divides_the_world():
    from ringtop.tui.actions import mesh_targets

    assert mesh_targets(1) == []
    assert [(t.key, t.label, t.args) for t in mesh_targets(2)] == [("tp", "tp ×2", {"strategy": "tp"})]
    assert [(t.key, t.args) for t in mesh_targets(8)] == [
        ("tp", {"strategy": "tp"}),
        ("fsdp-full+tp2", {"strategy": "fsdp", "fsdp_sharding": "full", "tp": 2}),
        ("fsdp-full+tp4", {"strategy": "fsdp", "fsdp_sharding": "full", "tp": 4})]


async def test_switch_picker_offers_tensor_parallelism_without_a_prediction_and_sends_it():
    with FakeRankZero() as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=SIZE) as pilot:
            await attach(app, pilot)
            await open_picker(app, pilot)
            def _shown():
                assert picker_cell(app, "tp", "strategy") == "tp ×2"
            await eventually(pilot, _shown)
            # what a tp rank holds and sends depends on the model's layers: the UI does not guess it
            assert [picker_cell(app, "tp", c) for c in ("sharded", "params", "state", "wire")] == \
                ["matrices", "-", "-", "-"]
            await pilot.press(*["down"] * 7, "enter", "enter")  # the cursor starts on ddp (now); Enter confirms
            await wait_until(pilot, lambda: run.commands, what="the switch command")
            assert run.commands[0].cmd == "switch" and run.commands[0].args == {"strategy": "tp"}


async def test_switch_picker_shows_predictions_and_enter_sends_switch():
    answer = lambda cmd: ("done", {"from": "ddp", "to": "zero3", "step": 9, "seconds": 0.4213})  # noqa: E731
    with FakeRankZero(answer) as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=SIZE) as pilot:
            await attach(app, pilot)
            await open_picker(app, pilot)
            def _shown_1():
                table = app.screen.query_one(DataTable)
                assert [k.value for k in table.rows] == ["ddp", "zero1", "zero2", "zero3", "fsdp-full", "fsdp-grad-op",
                                                         "fsdp-no-shard", "tp"]
                assert picker_cell(app, "ddp", "strategy") == "▶ ddp (now)"
                assert picker_cell(app, "zero3", "strategy") == "zero3"
            await eventually(pilot, _shown_1)
            # zero3 by hand: P = 1,234,567 fp32 parameters on N = 2 gloo ranks. DeepSpeed keeps params and
            # grads in the compute dtype (4 B) and K = 12 optimizer bytes per parameter, each sharded:
            # ceil(P/2) = 617,284 -> params 2,469,136 B = 2.4 MiB, grads 2.4 MiB, optimizer 7,407,408 B
            # = 7.1 MiB, state 12,345,680 B = 11.8 MiB. On the wire: two all-gathers of the 4,938,268 B of
            # params, (N-1)/N each = 4,938,268 B, and gloo's reduce-scatter runs as an all-reduce,
            # 2 (N-1)/N x 4,938,268 = 4,938,268 B: 9,876,536 B = 9.4 MiB per rank and step.
            assert [picker_cell(app, "zero3", c) for c in ("params", "grads", "optim", "state", "wire")] == \
                ["2.4MiB", "2.4MiB", "7.1MiB", "11.8MiB", "9.4MiB"]
            assert picker_cell(app, "zero3", "sharded") == "params+grads+optim"
            # ddp replicates fp32 params and grads (4.7 MiB each) and AdamW's 8 B/param (9.4 MiB): 18.8 MiB;
            # the all-reduce sends 2 (N-1)/N x 4,938,268 B = 4.7 MiB
            assert [picker_cell(app, "ddp", c) for c in ("state", "wire")] == ["18.8MiB", "4.7MiB"]
            assert "1.2M params, 2 ranks, fp32, gloo" in static_text(app.screen, "#switch-title")
            # the cursor starts on the current strategy; three down is zero3; then the confirmation
            assert app.screen.query_one(DataTable).cursor_row == 0
            await pilot.press("down", "down", "down", "enter")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmPrompt), what="the confirmation")
            assert "Switch ddp → zero3?" in static_text(app.screen, "#confirm-title")
            assert run.commands == []  # not before the confirmation
            await pilot.press("enter")
            await wait_until(pilot, lambda: run.commands, what="the switch command")
            assert not isinstance(app.screen, (SwitchPicker, ConfirmPrompt))
            assert run.commands[0].cmd == "switch" and run.commands[0].args == {"strategy": "zero3"}
            text = await show_events(app, pilot, "done")
            assert "switch → zero3" in text and "pending → ack → done: ddp → zero3 at step 9 in 0.42 s" in text
            ops = static_text(app, "#ops")
            assert "✓ done" in ops and "switch → zero3" in ops


async def test_switch_picker_sends_fsdp_sharding_and_escape_sends_nothing():
    with FakeRankZero() as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=SIZE) as pilot:
            await attach(app, pilot)
            await open_picker(app, pilot)
            await pilot.press("down", "escape")
            await wait_until(pilot, lambda: not isinstance(app.screen, SwitchPicker), what="the picker to close")
            def _shown_2():
                assert run.commands == [] and app.view.commands == {}
            await eventually(pilot, _shown_2)
            # `w` opens it too; fsdp grad-op is the sixth row; Escape at the confirmation sends nothing
            await open_picker(app, pilot, "w")
            await pilot.press(*["down"] * 5, "enter")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmPrompt), what="the confirmation")
            await pilot.press("escape")
            await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmPrompt), what="the confirmation to close")
            await open_picker(app, pilot, "w")
            await pilot.press(*["down"] * 5, "enter", "y")
            await wait_until(pilot, lambda: run.commands, what="the switch command")
            assert run.commands[0].args == {"strategy": "fsdp", "fsdp_sharding": "grad-op"}
            # choosing the current strategy sends nothing and says why
            await open_picker(app, pilot)
            await pilot.press("enter")  # the cursor starts on the current strategy
            def _shown_3():
                assert len(run.commands) == 1
            await eventually(pilot, _shown_3)
            await show_events(app, pilot, "already uses ddp")


async def test_a_failed_switch_shows_the_reason_and_that_the_run_goes_on():
    reason = "SwitchError: zero3 could not be built (injected failure); rolled back to ddp"
    answer = lambda cmd: ("error", reason)  # noqa: E731
    with FakeRankZero(answer) as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=SIZE) as pilot:
            await attach(app, pilot)
            await open_picker(app, pilot)
            await pilot.press("down", "down", "down", "enter", "enter")
            text = await show_events(app, pilot, "error")
            assert "pending → ack → error: SwitchError: zero3 could not be built (injected failure); rolled back " \
                   "to ddp (failed); the run goes on with ddp" in text
            assert "✖ failed" in static_text(app, "#ops")


# ---------------------------------------------------------------------- micro-batches


async def test_micro_batches_prompt_rejects_bad_input_locally_then_sends_set():
    answer = lambda cmd: ("error", "RuntimeError: 4 micro-batches do not divide the batch")  # noqa: E731
    with FakeRankZero(answer, strategy="pp") as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=SIZE) as pilot:
            await attach(app, pilot)
            await pilot.press("m")
            await wait_until(pilot, lambda: isinstance(app.screen, MicroBatchesPrompt), what="the prompt")
            await pilot.press("a", "b", "c", "enter")
            def _shown_4():
                assert isinstance(app.screen, MicroBatchesPrompt)  # still open, with the reason
                error = str(app.screen.query_one("#mb-error", Static).content)
                assert "'abc' is not a whole number" in error and "nothing sent" in error
            await eventually(pilot, _shown_4)
            await pilot.press("0", "enter")  # the rejected text is selected: typing replaces it
            def _shown_5():
                assert "less than 1" in str(app.screen.query_one("#mb-error", Static).content)
                assert run.commands == []
                assert app.screen.query_one(Input).value == "0"
            await eventually(pilot, _shown_5)
            await pilot.press("4", "enter")
            await wait_until(pilot, lambda: run.commands, what="the set command")
            assert run.commands[0].cmd == "set" and run.commands[0].args == {"micro_batches": 4}
            text = await show_events(app, pilot, "error")
            assert "set micro_batches=4" in text
            assert "error: RuntimeError: 4 micro-batches do not divide the batch (failed)" in text


async def test_micro_batches_escape_sends_nothing_and_done_says_the_new_m():
    answer = lambda cmd: ("done", {"micro_batches": 8, "step": 41})  # noqa: E731
    with FakeRankZero(answer, strategy="pp") as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=SIZE) as pilot:
            await attach(app, pilot)
            await pilot.press("m")
            await wait_until(pilot, lambda: isinstance(app.screen, MicroBatchesPrompt), what="the prompt")
            await pilot.press("2", "escape")
            def _shown_6():
                assert not isinstance(app.screen, MicroBatchesPrompt) and run.commands == []
            await eventually(pilot, _shown_6)
            await pilot.press("m")
            await wait_until(pilot, lambda: isinstance(app.screen, MicroBatchesPrompt), what="the prompt")
            await pilot.press("8", "enter")
            await wait_until(pilot, lambda: run.commands, what="the set command")
            text = await show_events(app, pilot, "done")
            assert "pending → ack → done: micro-batches now 8 after step 41" in text


# ---------------------------------------------------------------------- checkpoint, profile


async def test_sharded_async_checkpoint_progress_in_header_and_events():
    def answer(cmd):
        if cmd.cmd == "checkpoint" and cmd.args.get("kind") == "sharded":
            return "hold", {"path": "/ckpt/step-00000012-sharded", "step": 12, "kind": "sharded",
                            "bytes": 3 * 2**20, "seconds": 1.25}
        return "done", {"path": "/ckpt/step-00000013", "step": 13, "kind": "full", "bytes": 2**20, "seconds": 0.5}

    with FakeRankZero(answer) as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=SIZE) as pilot:
            await attach(app, pilot)
            await pilot.press("C")
            await wait_until(pilot, lambda: run.commands, what="the checkpoint command")
            assert run.commands[0].cmd == "checkpoint"
            assert run.commands[0].args == {"kind": "sharded", "async": True}
            # acknowledged, being written: the header says so while it lasts
            await wait_until(pilot, lambda: "checkpoint sharded async: running" in header_text(app),
                             what="the header's checkpoint line")
            await pilot.press("5")
            await wait_until(pilot, lambda: "◐ running" in static_text(app, "#ops"), what="the running operation")
            run.release()
            await wait_until(pilot, lambda: "done" in event_log_text(app), what="the done reply")
            text = event_log_text(app)
            assert "checkpoint sharded async [" in text
            assert ("pending → ack → done: sharded checkpoint written in 1.25 s: /ckpt/step-00000012-sharded "
                    "(3.0MiB, step 12)") in text
            def _shown_7():
                assert "checkpoint" not in header_text(app)  # nothing in flight any more
                assert "✓ done" in static_text(app, "#ops")
            await eventually(pilot, _shown_7)
            # `c` stays a full checkpoint
            await pilot.press("c")
            await wait_until(pilot, lambda: len(run.commands) == 2, what="the full checkpoint")
            assert run.commands[1].args == {"kind": "full"}


async def test_profile_sends_three_steps_and_shows_exposed_comm_per_rank():
    result = {"steps": 3, "ranks": [
        {"rank": 0, "trace": "/log/profile/step-00000010-rank-0.json", "steps": 3,
         "exposed_comm_ms_per_step_trace": 3.25, "comm_ms_per_step_trace": 10.5, "overlap_pct_trace": 69.0,
         "exposed_comm_ms_per_step_live": 2.9},
        {"rank": 1, "trace": "/log/profile/step-00000010-rank-1.json", "steps": 3,
         "exposed_comm_ms_per_step_trace": 4.0, "comm_ms_per_step_trace": 11.0, "overlap_pct_trace": 63.6,
         "exposed_comm_ms_per_step_live": 3.5}]}
    with FakeRankZero(lambda cmd: ("done", result)) as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=SIZE) as pilot:
            await attach(app, pilot)
            await pilot.press("p")
            await wait_until(pilot, lambda: run.commands, what="the profile command")
            assert run.commands[0].cmd == "profile" and run.commands[0].args == {"steps": 3}
            text = await show_events(app, pilot, "rank 1: exposed")
            assert "profile 3 steps [" in text
            assert "rank 0: exposed 3.2 ms (trace) vs 2.9 ms (live), comm 10.5 ms, overlap 69%" in text
            assert "rank 1: exposed 4.0 ms (trace) vs 3.5 ms (live), comm 11.0 ms, overlap 64%" in text


def footer_actions(app: RingtopApp) -> set[str]:
    from textual.widgets._footer import FooterKey

    return {key.action for key in app.query(FooterKey)}


async def test_a_replay_offers_no_commands_and_micro_batches_only_a_pipeline():
    """Issue 13: the replay advertised S/c/C/m/p/s, and `m` on a ddp run opened a dialog that
    already said it would be refused. Keys for what cannot be done are not shown, and do nothing."""
    from test_tui_app import make_hello as hello

    app = RingtopApp(messages=[hello(0, strategy="pp"), hello(1, strategy="pp")], source="log")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.replay_loaded, what="replay")
        await repainted(pilot)
        assert footer_actions(app) & COMMAND_ACTIONS == set(), footer_actions(app)
        assert "quit" in footer_actions(app) or "app.quit" in footer_actions(app)
        for key in ("C", "p", "m", "c", "S", "s"):
            await pilot.press(key)
        assert app.screen is app.screen_stack[0], "no picker, no prompt"
        assert app.view.commands == {} and not any("not connected" in e.text for e in app.view.events)

    for strategy, offered in (("ddp", False), ("pp", True)):
        with FakeRankZero(strategy=strategy) as run:
            app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
            async with app.run_test(size=SIZE) as pilot:
                await attach(app, pilot)
                await wait_until(pilot, lambda app=app, strategy=strategy: app.view.facts.strategy == strategy,
                                 what="the run's strategy")

                def footer_says(app=app, offered=offered, strategy=strategy) -> None:
                    actions = footer_actions(app)
                    assert any(a.endswith("checkpoint") for a in actions), actions
                    assert any(a.endswith("micro_batches") for a in actions) is offered, (strategy, actions)
                await repainted(pilot)
                await eventually(pilot, footer_says)
                await pilot.press("m")
                await repainted(pilot)
                assert isinstance(app.screen, MicroBatchesPrompt) is offered, strategy


def palette_titles(app: RingtopApp) -> list[str]:
    return [c.title for c in app.get_system_commands(app.screen)]


async def test_the_command_palette_holds_ringtops_commands_and_sends_them():
    """ctrl+p, type, Enter: the same command as its key, and only those the run can take now."""
    from test_tui_app import make_hello as hello
    from textual.command import CommandPalette
    from textual.widgets import Input

    replay = RingtopApp(messages=[hello(0), hello(1)], source="log")
    async with replay.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: replay.replay_loaded, what="replay")
        titles = palette_titles(replay)
        assert not any("Checkpoint" in t or "Switch" in t for t in titles), titles  # a replay takes none
        assert any(t == "Quit the application" or "Quit" in t for t in titles)

    with FakeRankZero(lambda cmd: ("done", {"kind": "sharded", "step": 5, "path": "/ckpt/step-5"})) as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=SIZE) as pilot:
            await attach(app, pilot)
            titles = palette_titles(app)
            assert {"Switch strategy…  (S)", "Checkpoint (full)  (c)", "Checkpoint (sharded, async)  (C)",
                    "Profile 3 steps  (p)", "Status  (s)"} <= set(titles), titles
            assert not any("micro-batches" in t for t in titles)  # a ddp run has none
            await pilot.press("ctrl+p")
            await wait_until(pilot, lambda: isinstance(app.screen, CommandPalette), what="the palette")
            app.screen.query_one(Input).value = "sharded async"
            await repainted(pilot)
            await pilot.press("enter")
            await wait_until(pilot, lambda: run.commands, what="the command from the palette")
            assert (run.commands[0].cmd, run.commands[0].args) == ("checkpoint", {"kind": "sharded", "async": True})
