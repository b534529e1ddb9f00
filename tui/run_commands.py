"""The commands a UI sends to rank 0 — keys, the footer and the command palette offer the same
ones, and only those the run can do now (none in a replay, micro-batches only on a pipeline)."""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple

from rich.text import Text
from textual.app import SystemCommand

from ringtop.metrics import fmt

from .actions import switch_rows
from .screens import MicroBatchesPrompt, SwitchPicker

PROFILE_STEPS = 3


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
)
COMMAND_ACTIONS = frozenset(c.action for c in RUN_COMMANDS)
"""Actions that send a command to rank 0."""


class RunCommands:
    """Mixed into the App: the actions behind the keys and the palette (`self` is the RingtopApp)."""

    def command_allowed(self, action: str) -> bool:
        if action in COMMAND_ACTIONS and self.replay:
            return False
        if action == "micro_batches":
            return self.view.facts.strategy == "pp"
        return True

    def run_system_commands(self) -> Iterable[SystemCommand]:
        for c in RUN_COMMANDS:
            if self.command_allowed(c.action):
                yield SystemCommand(f"{c.title}  ({c.key})", c.help, getattr(self, f"action_{c.action}"))

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
        if isinstance(self.screen, (SwitchPicker, MicroBatchesPrompt)):
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
        self.send("switch", choice["args"])

    def action_micro_batches(self) -> None:
        """Ask for M, then send `set micro_batches M` (checked here: a whole number >= 1)."""
        if isinstance(self.screen, (SwitchPicker, MicroBatchesPrompt)):
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
        why = self.not_connected_reason()
        if why:
            self.view.note(f"{cmd}: {why}", level="warn", kind="command")
        else:
            cmd_id = self.client.send_command(cmd, args)
            self.view.note_command_sent(cmd_id, cmd, args)
        self.refresh_view()
