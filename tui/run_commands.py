"""The commands a UI sends to rank 0 — keys, the footer and the command palette offer the same
ones, and only those the run can do now (none in a replay or once the run has ended, micro-batches
only on a pipeline). A command key pressed after the end is refused at once, saying why."""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple

from rich.text import Text
from textual.app import SystemCommand

from ringtop.metrics import fmt
from ringtop.metrics.run_lifecycle import STOP_FROM_UI
from ringtop.tui.actions import switch_rows, switch_unavailable_text
from ringtop.tui.confirm import ConfirmPrompt, ConfirmStop
from ringtop.tui.screens import MicroBatchesPrompt, SwitchPicker
from ringtop.tui.state.reducers.commands import REFUSED_ENDED

PROFILE_STEPS = 3
EVERY_TARGET = "*"
"""Hello.switch_unavailable's key for "no target at all" (agent/loop/switch_offer.py)."""


class RunCommand(NamedTuple):
    action: str
    key: str
    title: str
    help: str


RUN_COMMANDS = (
    RunCommand("switch", "S", "Switch strategy…", "pick a parallel strategy, with the cost model's memory and "
               "traffic per rank; applies live at a step boundary"),
    RunCommand("checkpoint", "c", "Checkpoint (full)", "rank 0 writes the whole model and optimizer state"),
    RunCommand("checkpoint_sharded", "C", "Checkpoint (sharded, async)", "every rank writes its shard in the "
               "background; training goes on"),
    RunCommand("micro_batches", "m", "Set micro-batches…", "pipeline runs: the micro-batches per step (M)"),
    RunCommand("profile", "p", "Profile 3 steps", "torch.profiler on every rank; exposed comm from the trace vs "
               "the live hooks"),
    RunCommand("status", "s", "Status", "rank 0's one-line status: step, strategy, loss, step time, last checkpoint"),
    RunCommand("stacks", "k", "Stacks of every rank", "each rank's Python stack and the collectives it waits in, "
               "gathered without the training threads (works while training is stuck); shown in the Hang view"),
    RunCommand("stop", "X", "Stop the run…", "every rank stops at its next step boundary and says goodbye "
               "(asks first); the agents exit"),
)
COMMAND_ACTIONS = frozenset(c.action for c in RUN_COMMANDS)
"""Actions that send a command to rank 0."""


class RunCommands:
    """Mixed into the App: the actions behind the keys and the palette (`self` is the RingtopApp)."""

    def command_allowed(self, action: str) -> bool:
        if action == "refuse_ended":  # a command key after the end: said so rather than ignored
            return not self.replay and self.view.is_ended
        if action in COMMAND_ACTIONS and (self.replay or self.view.is_ended):
            return False
        if action == "micro_batches":
            return self.view.facts.strategy == "pp"
        if action == "switch":
            return EVERY_TARGET not in self.view.facts.switch_unavailable  # an own loop (ringtop.Monitor)
        return True

    def run_system_commands(self) -> Iterable[SystemCommand]:
        for c in RUN_COMMANDS:
            if self.command_allowed(c.action):
                yield SystemCommand(f"{c.title}  ({c.key})", c.help, getattr(self, f"action_{c.action}"))

    def action_refuse_ended(self, action: str) -> None:
        title = next((c.title.rstrip("…") for c in RUN_COMMANDS if c.action == action), "command")
        self.view.note(f"{title}: refused, {REFUSED_ENDED}", level="warn", kind="command")
        self.refresh_view()

    def action_stop(self) -> None:
        """Asks first; yes sends `stop` (the run then reads "stopped by the UI")."""
        if isinstance(self.screen, (SwitchPicker, MicroBatchesPrompt, ConfirmPrompt)):
            return
        self.push_screen(ConfirmStop(note=self.not_connected_reason()), callback=self._on_stop_confirmed)

    def _on_stop_confirmed(self, yes: bool | None) -> None:
        if yes:
            self.send("stop", {"reason": STOP_FROM_UI})

    def action_checkpoint(self) -> None:
        self.send("checkpoint", {"kind": "full"})

    def action_checkpoint_sharded(self) -> None:
        self.send("checkpoint", {"kind": "sharded", "async": True})

    def action_status(self) -> None:
        self.send("status", {})

    def action_stacks(self) -> None:
        """Ask every rank for its stack now; the Hang view shows the answer."""
        self.send("stacks", {})
        if not self.not_connected_reason():
            self.action_show_tab("hang")

    def action_profile(self) -> None:
        self.send("profile", {"steps": PROFILE_STEPS})

    def action_switch(self) -> None:
        """The switch picker: each target's predicted memory and traffic; Enter sends `switch`."""
        if isinstance(self.screen, (SwitchPicker, MicroBatchesPrompt, ConfirmPrompt)):
            return
        f, v = self.view.facts, self.view
        n = f.world_size or len(v.ranks)
        title = Text("Switch the parallel strategy", style="bold")
        title.append(f"  now {f.strategy_name or '?'}", style="bold magenta")
        params = f"{fmt.count(f.param_count)} params" if f.param_count else "parameter count unknown"
        title.append(f"\n{f.model or 'model'} {params}, {n} ranks, {f.dtype or 'fp32'}"
                     f"{', ' + f.backend if f.backend else ''}: the cost model's state per rank "
                     "(params + grads + optimizer; zero* K=12 B/param, ddp/fsdp fp32 + 8) and bytes each rank "
                     "sends per step", style="dim")
        left_out = switch_unavailable_text(f.switch_unavailable)
        if left_out:
            title.append(f"\nnot offered: {left_out}", style="dim yellow")
        self.push_screen(SwitchPicker(switch_rows(v), title, note=self.not_connected_reason()),
                         callback=self._on_switch_chosen)

    def _on_switch_chosen(self, choice: dict[str, Any] | None) -> None:
        if not choice:
            return  # cancelled: nothing is sent
        if choice.get("current"):
            self.view.note(f"switch: the run already uses {choice['label']}; nothing sent", level="warn",
                           kind="command")
            self.refresh_view()
            return
        f = self.view.facts
        title = Text("Switch ", style="bold")
        title.append(f"{f.strategy_name or '?'} → {choice['label']}", style="bold magenta")
        title.append("?", style="bold")
        detail = Text("Every rank stops at the next step boundary, moves its model and optimizer state to the "
                      "new layout and goes on; a failure rolls back.", style="dim")
        self.push_screen(ConfirmPrompt(title, detail, yes="switch"),
                         callback=lambda yes: self.send("switch", choice["args"]) if yes else None)

    def action_micro_batches(self) -> None:
        """Ask for M, then send `set micro_batches M` (checked here: a whole number >= 1)."""
        if isinstance(self.screen, (SwitchPicker, MicroBatchesPrompt, ConfirmPrompt)):
            return
        why = self.not_connected_reason()
        if why:
            self.view.note(f"set micro_batches: {why}", level="warn", kind="command")
            self.refresh_view()
            return
        f, ps = self.view.facts, self.view.pipeline
        now = f.strategy_options.get("micro_batches") or ps.last_micro_batches or 0
        title = Text("Micro-batches per step (M)", style="bold")
        if now:
            title.append(f"  now M={now}", style="bold magenta")
        if f.batch_size:
            title.append(f"\nbatch {f.batch_size} per replica: M must divide it", style="dim")
        self.push_screen(MicroBatchesPrompt(title), callback=self._on_micro_batches)

    def _on_micro_batches(self, m: int | None) -> None:
        if m is not None:
            self.send("set", {"micro_batches": m})

    def not_connected_reason(self) -> str:
        if self.replay:
            return "not connected (replay)"
        if self.client is None or not self.client.has_control:
            return "not connected (no control address)"
        return ""

    def send(self, cmd: str, args: dict[str, Any]) -> None:
        why = REFUSED_ENDED if self.view.is_ended and not self.replay else self.not_connected_reason()
        if why:
            self.view.note(f"{cmd}: {'refused, ' if why == REFUSED_ENDED else ''}{why}", level="warn",
                           kind="command")
        else:
            cmd_id = self.client.send_command(cmd, args)
            self.view.note_command_sent(cmd_id, cmd, args)
        self.refresh_view()
