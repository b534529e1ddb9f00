"""ringtop's terminal UI: a Textual app that renders a `RunView` at a fixed rate.

Live: a `TelemetryClient` thread receives and decodes telemetry and posts batches to the app as
`TelemetryBatch` messages; the handler only folds them into the view model. A 4 Hz timer repaints
the screens from the view model, so the message rate never drives the repaint rate.
Replay: the messages of a log directory are folded in (in chunks, so the UI stays responsive).

Quitting closes only the UI's own sockets; the agents are separate processes and keep running.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.widgets import DataTable, Footer, RichLog, Sparkline, Static, TabbedContent, TabPane

from ringtop.metrics import fmt
from ringtop.metrics.outliers import NAMED, TABLE_MARK
from ringtop.protocol.curve import ClientKeys

from .actions import switch_rows
from .comm import busbw_series, comm_window, peak_ref, slowest_rank
from .comm_tab import (
    alert_verdict_line,
    busbw_label,
    comm_caption,
    exposed_text,
    kinds_columns,
    kinds_rows,
    overview_comm_label,
    ranks_columns,
    ranks_rows,
    verdict_panel,
)
from .connection import TelemetryClient
from .health import health_line
from .memory import fit_table
from .memory_tab import fit_caption, fit_columns, fit_rows, memory_caption, memory_columns, memory_rows, on_gpu
from .pipeline import idle_rows
from .pipeline_tab import (
    HISTORY_COLUMNS,
    STAGE_COLUMNS,
    bubble_text,
    caption_text,
    history_caption,
    history_rows,
    idle_text,
    is_pipeline,
    legend_text,
    stage_rows,
    timeline_text,
)
from .replay import ReplayError, load_replay
from .screens import MicroBatchesPrompt, SwitchPicker
from .tables import Column, SyncedTable
from .view_model import COMM_KIND_ABBR, SLOWEST_WINDOW, CommandState, RankRow, RunView, describe_result

REFRESH_S = 0.25
REPLAY_CHUNK = 5_000

STATE_STYLE = {
    "live": ("● live", "bold green"),
    "waiting": ("○ waiting", "dim"),
    "stale": ("◌ stale", "bold yellow"),
    "ended": ("■ ended", "bold"),
    "failed": ("✖ failed", "bold red"),
}
LEVEL_STYLE = {"info": "cyan", "warn": "bold yellow", "error": "bold red"}
PHASE_STYLE = {"pending": ("…", "yellow"), "running": ("◐", "bold yellow"), "done": ("✓", "green"),
               "failed": ("✖", "bold red")}
PROFILE_STEPS = 3

# (key, label, width); widths fixed so in-place updates never reflow the table. The per-kind
# communication column ("comm_kinds") goes after "comm_mb_s" once the run's collectives are known.
COLUMNS: list[tuple[str, str, int]] = [
    ("rank", "rank", 4),
    ("host", "host", 8),
    ("step", "step", 6),
    ("step_ms", "step ms", 8),
    ("loss", "loss", 6),
    ("tok_s", "tok/s", 6),
    ("mem", "mem", 9),
    ("comm_mb_s", "comm MB/s", 9),
    ("idle_pct", "idle%", 5),
    ("cpu", "cpu%", 4),
    ("drops", "drops", 5),
    ("note", "note", 22),
]
COMMAND_ACTIONS = frozenset({"switch", "checkpoint", "checkpoint_sharded", "micro_batches", "profile", "status"})
"""Actions that send a command to rank 0."""
NUMERIC = {"rank", "step", "step_ms", "loss", "tok_s", "mem", "comm_mb_s", "comm_kinds", "idle_pct", "cpu", "drops"}
# idle% = (data + exposed comm) / step: the time a rank waits on data or on exposed
# communication. It replaces a separate comm% column (exposed comm / step), which would differ only by
# the data time and does not fit 120 columns beside it; the exposed share is on the busbw chart line
# below the table and per rank on the Comm tab.
TABLE_WIDTH = 118
"""The Overview table's width budget (cells plus one padding cell each side): a 120-column terminal.
The note column shrinks (to NOTE_MIN_WIDTH) to make room for the per-kind column, whose label drops
its unit when even that is not enough (3-4 kinds)."""
NOTE_MIN_WIDTH = 10


def kind_abbr(kind: str) -> str:
    """AR, RS, AG, BC for the common collectives; initials of the words otherwise."""
    return COMM_KIND_ABBR.get(kind) or "".join(w[:1] for w in kind.split("_")).upper() or "?"


def overview_columns(kinds: list[str], kinds_cell_width: int = 0) -> list[Column]:
    """The rank table's columns; with collective kinds, one more after "comm MB/s": per kind MB/s,
    e.g. "RS/AG MB/s" holding "12.5/25.0", as wide as its widest cell so far."""
    base = [Column(key, label, width, key in NUMERIC) for key, label, width in COLUMNS]
    if not kinds:
        return base
    abbrs = "/".join(kind_abbr(k) for k in kinds)
    fixed = sum(c.width + 2 for c in base if c.key != "note") + NOTE_MIN_WIDTH + 2 + 2
    label = abbrs + " MB/s"
    if fixed + max(len(label), kinds_cell_width) > TABLE_WIDTH:
        label = abbrs  # the unit is in the neighbouring "comm MB/s"
    cols: list[Column] = []
    for c in base:
        cols.append(c)
        if c.key == "comm_mb_s":
            cols.append(Column("comm_kinds", label, max(len(label), kinds_cell_width), True))
    used = sum(c.width + 2 for c in cols)
    if used > TABLE_WIDTH:
        note = cols[-1]
        cols[-1] = note._replace(width=max(NOTE_MIN_WIDTH, note.width - (used - TABLE_WIDTH)))
    return cols


class TelemetryBatch(Message):
    """Decoded messages (and rejected-frame errors) from the receive thread."""

    def __init__(self, messages: list[Any], rejected: list[str]) -> None:
        super().__init__()
        self.messages = messages
        self.rejected = rejected


class RingtopApp(App):
    """The ringtop cockpit. Live: pass `publish_addr` (and `control_addr`); replay: pass `messages`."""

    TITLE = "ringtop"
    CSS = """
    Screen { layout: vertical; }
    #header { height: 1; background: $panel; }
    #facts { width: 1fr; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    #conn { width: auto; padding: 0 1; }
    TabbedContent { height: 1fr; }
    TabPane { padding: 0; }
    #overview-body { height: 1fr; }
    #ranks { height: auto; max-height: 75%; }
    .chart { height: 1; margin: 0 1; }
    .chart-label { width: 50; }
    .comm-line { height: 1; margin: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    #comm-body { height: 1fr; }
    #comm-kinds { height: auto; max-height: 12; }
    #comm-ranks { height: auto; max-height: 50%; margin: 1 0 0 0; }
    #comm-chart-label { width: auto; max-width: 70; padding: 0 2 0 0; }
    #verdicts { height: auto; margin: 1 1 0 1; padding: 0 1; border-left: thick $warning; }
    .chart Sparkline { width: 1fr; }
    #alert { height: auto; max-height: 3; margin: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    #health { height: 1; margin: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    #event-log { height: 1fr; }
    #ops { height: auto; max-height: 8; margin: 0 1; border-bottom: solid $panel-lighten-2; text-wrap: nowrap;
           text-overflow: ellipsis; }
    #pipeline-body { height: 1fr; }
    #pp-timeline { height: auto; margin: 1 1 0 1; text-wrap: nowrap; }
    #pp-legend { height: 1; margin: 0 1; }
    #pp-bubble { height: auto; margin: 1 1 0 1; }
    #pp-stages { height: auto; margin: 1 0 0 0; }
    #pp-history-caption { height: auto; margin: 1 1 0 1; }
    #pp-history { height: auto; }
    #memory-body { height: 1fr; }
    .caption { height: auto; margin: 0 1; }
    #fit-caption { margin: 1 1 0 1; }
    #mem-ranks { height: auto; max-height: 60%; }
    #fit { height: auto; }
    """

    BINDINGS = [
        Binding("S", "switch", "switch"),
        Binding("w", "switch", "switch", show=False),
        Binding("c", "checkpoint", "ckpt"),
        Binding("C", "checkpoint_sharded", "sharded ckpt"),
        Binding("m", "micro_batches", "micro-batches"),
        Binding("p", "profile", "profile"),
        Binding("s", "status", "status"),
        Binding("1", "show_tab('overview')", "overview", show=False),
        Binding("2", "show_tab('memory')", "memory", show=False),
        Binding("3", "show_tab('comm')", "comm", show=False),
        Binding("4", "show_tab('pipeline')", "pipeline", show=False),
        Binding("5", "show_tab('events')", "events", show=False),
        Binding("r", "comm_rank", "rank/all"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(
        self,
        publish_addr: str | None = None,
        control_addr: str | None = None,
        *,
        messages: Iterable[Any] | None = None,
        problems: Iterable[str] = (),
        source: str = "",
        stale_after_s: float = 3.0,
        link_peak_gbps: float = 0.0,
        keys: ClientKeys | None = None,
    ) -> None:
        """`keys`: the run's client keys (its connection file); None for a run started --insecure."""
        super().__init__()
        self.keys = keys
        if messages is None and publish_addr is None:
            raise ValueError("RingtopApp needs either publish_addr (live) or messages (replay)")
        self.replay = messages is not None
        self.publish_addr = publish_addr
        self.control_addr = control_addr
        self.source = source or (publish_addr or "")
        self._replay_messages: list[Any] = list(messages) if messages is not None else []
        self._replay_problems = list(problems)
        self.replay_applied = 0
        self.replay_loaded = not self.replay
        self.view = RunView(stale_after_s=stale_after_s, watch_liveness=not self.replay)
        if link_peak_gbps:
            # the hook for the link's peak (GB/s per direction, as ringtop.strategies.links), e.g. `--link`
            self.view.set_link_peak(link_peak_gbps, "configured")
        self.comm_rank: int | None = None
        """The Comm tab's selection: a rank, or None for all ranks."""
        self._comm_cache: dict[tuple, Any] = {}
        self.client: TelemetryClient | None = None
        self._events_shown = 0
        self._shown: dict[str, Any] = {}
        self._tables: dict[str, SyncedTable] = {}
        self._fit_key: tuple | None = None
        self._kinds: list[str] = []
        self._kinds_width = 0
        self._bindings_strategy = ""

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        with Horizontal(id="header"):
            yield Static(id="facts")
            yield Static(id="conn")
        with TabbedContent(initial="overview"):
            with TabPane("1 Overview", id="overview"):
                yield Static(id="health")
                table: DataTable = DataTable(id="ranks", cursor_type="row", zebra_stripes=True)
                yield table
                with Horizontal(classes="chart"):
                    yield Static(id="step-label", classes="chart-label")
                    yield Sparkline([], id="step-spark")
                with Horizontal(classes="chart"):
                    yield Static(id="loss-label", classes="chart-label")
                    yield Sparkline([], id="loss-spark")
                with Horizontal(classes="chart"):
                    yield Static(id="busbw-label", classes="chart-label")
                    yield Sparkline([], id="busbw-spark")
                yield Static(id="alert")
            with TabPane("2 Memory", id="memory"):
                with VerticalScroll(id="memory-body"):
                    yield Static(id="mem-caption", classes="caption")
                    yield DataTable(id="mem-ranks", cursor_type="none", zebra_stripes=True)
                    yield Static(id="fit-caption", classes="caption")
                    yield DataTable(id="fit", cursor_type="none")
            with TabPane("3 Comm", id="comm"):
                with VerticalScroll(id="comm-body"):
                    yield Static(id="comm-caption", classes="caption")
                    yield DataTable(id="comm-kinds", cursor_type="none", zebra_stripes=True)
                    with Horizontal(classes="chart"):
                        yield Static(id="comm-chart-label")
                        yield Sparkline([], id="comm-spark")
                    yield Static(id="comm-exposed", classes="comm-line")
                    yield DataTable(id="comm-ranks", cursor_type="none", zebra_stripes=True)
                    yield Static(id="verdicts")
            with TabPane("4 Pipeline", id="pipeline"):
                with VerticalScroll(id="pipeline-body"):
                    yield Static(id="pp-caption", classes="caption")
                    yield Static(id="pp-timeline")
                    yield Static(id="pp-legend")
                    yield Static(id="pp-bubble")
                    yield DataTable(id="pp-stages", cursor_type="none", zebra_stripes=True)
                    yield Static(id="pp-history-caption")
                    yield DataTable(id="pp-history", cursor_type="none", zebra_stripes=True)
            with TabPane("5 Events", id="events"):
                yield Static(id="ops")
                yield RichLog(id="event-log", max_lines=2000, wrap=True, markup=False, auto_scroll=True)
        yield Footer()

    def _table(self, selector: str) -> SyncedTable:
        synced = self._tables.get(selector)
        if synced is None:
            synced = self._tables[selector] = SyncedTable(self.query_one(selector, DataTable))
        return synced

    def on_mount(self) -> None:
        self._table("#ranks").set_columns(overview_columns([]))
        self._table("#mem-ranks").set_columns(memory_columns(False))
        self._table("#fit").set_columns(fit_columns())
        self._table("#comm-kinds").set_columns(kinds_columns())
        self._table("#comm-ranks").set_columns(ranks_columns())
        self._table("#pp-stages").set_columns(STAGE_COLUMNS)
        self._table("#pp-history").set_columns(HISTORY_COLUMNS)
        if self.replay:
            self.sub_title = f"replay {self.source}"
            for p in self._replay_problems:
                self.view.note(p, level="warn", kind="replay")
            self.run_worker(self._load_replay(), name="replay", exclusive=True)
        else:
            self.sub_title = self.source
            self._start_client()
        self.set_interval(REFRESH_S, self.refresh_view)
        self.refresh_view()

    def _start_client(self) -> None:
        assert self.publish_addr is not None
        client = TelemetryClient(self.publish_addr, self.control_addr, self._on_batch_from_thread, keys=self.keys)
        try:
            client.start()
        except Exception as exc:  # a bad address: say so, keep the UI up
            self.view.note(f"cannot connect to {self.publish_addr}: {exc}", level="error", kind="connect")
            return
        self.client = client
        ctl = self.control_addr or "none"
        self.view.note(f"subscribed to {self.publish_addr}, control {ctl}", kind="connect")

    def _on_batch_from_thread(self, messages: list[Any], rejected: list[str]) -> None:
        # Called on the receive thread; App.post_message is thread-safe (call_soon_threadsafe).
        self.post_message(TelemetryBatch(messages, rejected))

    async def _load_replay(self) -> None:
        msgs = self._replay_messages
        for i in range(0, len(msgs), REPLAY_CHUNK):
            now = time.monotonic()
            for m in msgs[i : i + REPLAY_CHUNK]:
                self._apply_one(m, now)
            self.replay_applied = min(len(msgs), i + REPLAY_CHUNK)
            await asyncio.sleep(0)
        self.replay_applied = len(msgs)
        self.replay_loaded = True
        self.view.note(f"replay loaded: {len(msgs):,} messages from {self.source or 'log'}", kind="replay")
        self.refresh_view()

    def on_unmount(self) -> None:
        self._stop_client()

    def _stop_client(self) -> None:
        if self.client is not None:
            self.client.stop()
            self.client = None

    # ------------------------------------------------------------------ input

    def on_telemetry_batch(self, batch: TelemetryBatch) -> None:
        now = time.monotonic()
        for m in batch.messages:
            self._apply_one(m, now)
        for err in batch.rejected:
            self.view.note_rejected(err, now)

    def _apply_one(self, msg: Any, now: float) -> None:
        try:
            self.view.apply(msg, now)
        except Exception as exc:  # a view bug must not take the UI down
            self.view.note(f"could not show a {type(msg).__name__} message: {exc!r}", level="error", kind="ui")

    # ------------------------------------------------------------------ actions

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.refresh_bindings()  # `r` shows in the footer on the Comm tab only
        self.call_after_refresh(self.refresh_view)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Offer only what the run can do now: no commands in a replay, micro-batches only on a
        pipeline, `r` only on the Comm tab (False hides the key from the footer and ignores it)."""
        if action == "comm_rank":
            try:
                return self.query_one(TabbedContent).active == "comm"
            except Exception:
                return False
        if action in COMMAND_ACTIONS and self.replay:
            return False
        if action == "micro_batches":
            return self.view.facts.strategy == "pp"
        return True

    def action_comm_rank(self) -> None:
        """The Comm tab's selection: all ranks → rank 0 → rank 1 → … → all ranks."""
        ranks = sorted(self.view.ranks)
        if self.comm_rank is None:
            self.comm_rank = ranks[0] if ranks else None
        else:
            later = [r for r in ranks if r > self.comm_rank]
            self.comm_rank = later[0] if later else None
        self.refresh_view()

    def action_checkpoint(self) -> None:
        self._send("checkpoint", {"kind": "full"})

    def action_checkpoint_sharded(self) -> None:
        self._send("checkpoint", {"kind": "sharded", "async": True})

    def action_status(self) -> None:
        self._send("status", {})

    def action_profile(self) -> None:
        self._send("profile", {"steps": PROFILE_STEPS})

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
        self.push_screen(SwitchPicker(switch_rows(v), title, note=self._not_connected_reason()),
                         callback=self._on_switch_chosen)

    def _on_switch_chosen(self, choice: dict[str, Any] | None) -> None:
        if not choice:
            return  # cancelled: nothing is sent
        if choice.get("current"):
            self.view.note(f"switch: the run already uses {choice['label']}; nothing sent", level="warn",
                           kind="command")
            self.refresh_view()
            return
        self._send("switch", choice["args"])

    def action_micro_batches(self) -> None:
        """Ask for M, then send `set micro_batches M` (checked here: a whole number >= 1)."""
        if isinstance(self.screen, (SwitchPicker, MicroBatchesPrompt)):
            return
        why = self._not_connected_reason()
        if why:
            self.view.note(f"set micro_batches: {why}", level="warn", kind="command")
            self.refresh_view()
            return
        f, ps = self.view.facts, self.view.pipeline
        now = f.strategy_options.get("micro_batches") or ps.last_micro_batches or 0
        title = Text("Micro-batches per step (M)", style="bold")
        if now:
            title.append(f"  now M={now}", style="bold magenta")
        if f.strategy and f.strategy != "pp":
            title.append(f"\n{f.strategy_name} has no micro-batches: the agent will refuse", style="yellow")
        if f.batch_size:
            title.append(f"\nbatch {f.batch_size} per replica: M must divide it", style="dim")
        self.push_screen(MicroBatchesPrompt(title), callback=self._on_micro_batches)

    def _on_micro_batches(self, m: int | None) -> None:
        if m is not None:
            self._send("set", {"micro_batches": m})

    def _not_connected_reason(self) -> str:
        if self.replay:
            return "not connected (replay)"
        if self.client is None or not self.client.has_control:
            return "not connected (no control address)"
        return ""

    def _send(self, cmd: str, args: dict[str, Any]) -> None:
        why = self._not_connected_reason()
        if why:
            self.view.note(f"{cmd}: {why}", level="warn", kind="command")
        else:
            cmd_id = self.client.send_command(cmd, args)
            self.view.note_command_sent(cmd_id, cmd, args)
        self.refresh_view()

    async def action_quit(self) -> None:
        self._stop_client()  # closes the UI's sockets only; agents keep running
        self.exit()

    # ------------------------------------------------------------------ render

    def refresh_view(self) -> None:
        """Repaint everything from the view model (called at a fixed rate)."""
        if not self.is_running:
            return
        self.view.tick(time.monotonic())
        if self.view.facts.strategy != self._bindings_strategy:  # what `check_action` offers changed
            self._bindings_strategy = self.view.facts.strategy
            self.refresh_bindings()
        self._render_header()
        self._render_table()
        self._render_charts()
        self._render_alert()
        self._set_static("#health", health_line(self.view, time.monotonic()))
        self._render_comm()
        self._render_memory()
        self._render_pipeline()
        self._render_events()

    def header_text(self) -> Text:
        """The whole header line: run facts, then the connection indicator."""
        return Text.assemble(self.facts_text(), "  ", self.connection_text())

    def facts_text(self) -> Text:
        v, f = self.view, self.view.facts
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("ringtop", style="bold")
        t.append(" ─ ", style="dim")
        if not self.replay and not v.ranks and not f.run_id:
            refused = self.client.auth_failure if self.client is not None else ""
            if refused:
                t.append(f"{self.publish_addr} refuses this UI: {refused}", style="bold red")
            else:
                t.append(f"waiting for telemetry on {self.publish_addr}", style="dim")
            return t
        t.append(f"run {f.run_id[:8] or '?'}", style="bold")
        if f.model:
            t.append(f"  {f.model}")
            if f.param_count:
                t.append(f" {fmt.count(f.param_count)}")
        if f.strategy:
            t.append(f"  {f.strategy_name}", style="bold magenta")
            if f.world_size:
                t.append(f" ×{f.world_size}")
            t.append(f" ({f.sharding_text})", style="magenta")
            if f.dtype and f.dtype.lower() not in ("fp32", "float32"):
                t.append(f" {f.dtype}", style="bold")
        elif f.world_size:
            t.append(f"  ×{f.world_size}")
        step = v.latest_step
        t.append("  step ")
        t.append(f"{step:,}" if step >= 0 else "-", style="bold")
        if f.steps:
            t.append(f"/{f.steps:,}", style="dim")
        if v.tokens_per_s:
            t.append(f"  {fmt.count(v.tokens_per_s)} tok/s")
        if v.total_drops:
            t.append(f"  drops {v.total_drops:,}", style="yellow")
        if v.rejected_total:
            t.append(f"  rejected {v.rejected_total:,}", style="yellow")
        # last: what is cut off first on a narrow terminal
        if f.backend:
            t.append(f"  {f.backend}")
        if f.device and f.device != f.backend:
            t.append(f"/{f.device.split(':')[0]}", style="dim")  # the type: rank 0's index says little
        return t

    def operations_text(self) -> Text:
        """The header's one line about operations in flight: `◐ checkpoint sharded async: running 3s`."""
        t = Text(no_wrap=True)
        if self.replay or self.view.is_ended:
            return t  # a log's unanswered command is not in flight now
        active = self.view.active_commands()
        if not active:
            return t
        c = active[-1]
        mark, style = PHASE_STYLE.get(c.phase, ("…", "yellow"))
        t.append(f"{mark} {c.title}: {c.phase}", style=style)
        if c.sent_ts:
            t.append(f" {fmt.ago(max(0.0, time.time() - c.sent_ts))}", style="dim")
        if len(active) > 1:
            t.append(f" +{len(active) - 1} more", style="dim")
        t.append("  ")
        return t

    def connection_text(self) -> Text:
        v = self.view
        t = Text(no_wrap=True)
        t.append_text(self.operations_text())
        if self.replay:
            label = "▶ replay" if self.replay_loaded else f"▶ replay {self._replay_pct():.0f}%"
            t.append(label, style="bold cyan")
            if v.is_ended:
                t.append(" ■ ended", style="bold")
        else:
            label, style = STATE_STYLE.get(v.state, (v.state, ""))
            t.append(label, style=style)
            if v.state == "failed":
                t.append(f": {v.failure}", style="red")
        return t

    def _replay_pct(self) -> float:
        n = len(self._replay_messages)
        return 100.0 * self.replay_applied / n if n else 100.0

    def _set_static(self, selector: str, text: Text) -> None:
        """Update a Static only when its content changed (an update costs a layout pass)."""
        if self._shown.get(selector) != text:
            self._shown[selector] = text
            self.query_one(selector, Static).update(text)

    def _set_spark(self, selector: str, data: list[float]) -> None:
        steps = self.view.steps
        key = (len(data), steps[-1].step if steps else -1)
        if self._shown.get(selector) != key:
            self._shown[selector] = key
            self.query_one(selector, Sparkline).data = data

    def _render_header(self) -> None:
        self._set_static("#facts", self.facts_text())
        self._set_static("#conn", self.connection_text())

    def _row_cells(self, row: RankRow) -> dict[str, Text]:
        v = self.view
        excess = v.slowest_excess_pct
        slow = row.slowest and math.isfinite(excess) and excess >= TABLE_MARK.min_excess_pct
        dim = "dim" if row.ended else ""
        mem = fmt.nbytes(row.mem_bytes) if row.mem_bytes else "-"
        if row.mem_is_cuda and row.device_mem_total_bytes:
            mem = f"{row.mem_cuda_bytes / 2**30:.1f}/{row.device_mem_total_bytes / 2**30:.0f}G"
        note, note_style = "", ""
        if row.dead:
            note, note_style = f"dead: silent {fmt.ago(row.silent_s)}", "bold red"
        elif row.ended:
            note, note_style = f"ended: {row.bye_reason}", ("" if row.bye_ok else "red")
        elif not self.replay and row.silent_s > v.stale_after_s:
            note, note_style = f"silent {fmt.ago(row.silent_s)}", "yellow"
        elif slow:
            note, note_style = f"slowest +{excess:.0f}%", "bold yellow"
        cells = {
            "rank": (str(row.rank), "bold"),
            "host": (row.host or "?", ""),
            "step": (f"{row.step:,}" if row.step >= 0 else "-", ""),
            "step_ms": (fmt.ms(row.step_ms) + (" ▲" if slow else ""), "bold yellow" if slow else ""),
            # a loss only from a step this UI received: one it never got is not a NaN
            "loss": (fmt.loss(row.loss) if row.step_seen is not None else "-",
                     "bold red" if row.step_seen is not None and not math.isfinite(row.loss) else ""),
            "tok_s": (fmt.count(row.tokens_per_s) if row.tokens_per_s else "-", ""),
            "mem": (mem, ""),
            "comm_mb_s": (fmt.num(row.comm_mb_s, 1) if math.isfinite(row.comm_mb_s) else "-", ""),
            "comm_kinds": ("/".join(fmt.mb_compact(row.comm_kind_mb_s[k]) if k in row.comm_kind_mb_s else "-"
                                    for k in v.comm_kinds) if row.step >= 0 else "-", ""),
            "idle_pct": (fmt.num(row.idle_pct, 1), ""),
            "cpu": (fmt.num(row.cpu_percent, 0), ""),
            "drops": (f"{row.drops:,}", "yellow" if row.drops else ""),
            "note": (note, note_style),
        }
        return {key: Text(text, style=" ".join(s for s in (style, dim) if s)) for key, (text, style) in cells.items()}

    def _render_table(self) -> None:
        synced = self._table("#ranks")
        rows = [(f"r{row.rank}", self._row_cells(row)) for row in self.view.rows()]
        kinds = self.view.comm_kinds
        if kinds != self._kinds:
            self._kinds, self._kinds_width = kinds, 0
        # the per-kind column only widens (a rebuild), so it does not flicker between widths
        widest = max((len(cells["comm_kinds"].plain) for _, cells in rows), default=0)
        self._kinds_width = max(self._kinds_width, widest)
        synced.set_columns(overview_columns(kinds, self._kinds_width))
        synced.set_rows(rows)

    def _render_memory(self) -> None:
        # Only while the tab is shown: the fit table asks the cost model, and nobody sees it otherwise.
        if self.query_one(TabbedContent).active != "memory":
            return
        v = self.view
        self._set_static("#mem-caption", memory_caption(v))
        mem = self._table("#mem-ranks")
        mem.set_columns(memory_columns(on_gpu(v)))
        mem.set_rows(memory_rows(v))
        f = v.facts
        key = (f.param_count, f.world_size, len(v.ranks), f.dtype, f.optimizer_bytes_per_param, f.strategy,
               tuple(sorted(f.strategy_options.items(), key=str)), f.backend, f.device, f.device_mem_total_bytes,
               max((r.mem_peak_other_bytes for r in v.ranks.values()), default=0) >> 20,
               tuple(sorted({(r.host, r.device_mem_total_bytes) for r in v.ranks.values()})))
        if key != self._fit_key:  # the cost model only reruns when its inputs change
            self._fit_key = key
            ft = fit_table(v)
            self._set_static("#fit-caption", fit_caption(ft, v))
            self._table("#fit").set_rows(fit_rows(ft))

    def _render_charts(self) -> None:
        v = self.view
        steps = v.step_ms_max_history
        self._set_spark("#step-spark", steps)
        self._set_static("#step-label", _chart_label("step ms (max)", steps, fmt.ms))
        losses = v.loss_history
        self._set_spark("#loss-spark", losses)
        self._set_static("#loss-label", _chart_label("loss (mean)", losses, fmt.loss))
        if self.query_one(TabbedContent).active == "overview":
            window, series, ref = self.comm_data(None)
            self._set_comm_spark("#busbw-spark", series, None)
            self._set_static("#busbw-label", overview_comm_label(window, ref))

    def comm_data(self, rank: int | None):
        """(window, busbw series, peak reference) for a rank or all ranks, recomputed only when the
        view's communication figures changed."""
        key = (self.view.comm_version, rank)
        got = self._comm_cache.get(key)
        if got is None:
            if len(self._comm_cache) > 8:
                self._comm_cache.clear()
            window = comm_window(self.view, rank)
            series = busbw_series(self.view, rank)
            got = self._comm_cache[key] = (window, series, peak_ref(self.view, series))
        return got

    def _set_comm_spark(self, selector: str, data: list[float], rank: int | None) -> None:
        key = (self.view.comm_version, rank)
        if self._shown.get(selector) != key:
            self._shown[selector] = key
            self.query_one(selector, Sparkline).data = data

    def _render_comm(self) -> None:
        # Only while the tab is shown, like the Memory tab.
        if self.query_one(TabbedContent).active != "comm":
            return
        v = self.view
        if self.comm_rank is not None and self.comm_rank not in v.ranks:
            self.comm_rank = None  # a new run
        rank = self.comm_rank
        window, series, ref = self.comm_data(rank)
        key = ("slowest", v.comm_version)
        if key not in self._comm_cache:
            self._comm_cache[key] = slowest_rank(v)
        slow = self._comm_cache[key]
        self._set_static("#comm-caption", comm_caption(v, window, rank, slowest=slow))
        self._table("#comm-kinds").set_rows(kinds_rows(window))
        self._set_comm_spark("#comm-spark", series, rank)
        self._set_static("#comm-chart-label", busbw_label(window, ref))
        self._set_static("#comm-exposed", exposed_text(window))
        self._table("#comm-ranks").set_rows(ranks_rows(v, rank, slowest=slow))
        self._set_static("#verdicts", verdict_panel(v, slowest=slow))

    def _render_alert(self) -> None:
        v = self.view
        t = Text(no_wrap=True, overflow="ellipsis")
        verdict = alert_verdict_line(v)
        if verdict is not None:
            t.append_text(verdict)
        if v.slowest_rank is not None and math.isfinite(v.slowest_excess_pct) \
                and v.slowest_excess_pct >= NAMED.min_excess_pct:
            row = v.ranks[v.slowest_rank]
            if t.plain:
                t.append("\n")
            t.append("▲ ", style="bold yellow")
            t.append(f"rank {row.rank} slowest: {fmt.ms(row.recent_step_ms())} ms/step over the last "
                     f"{min(len(row.step_ms_history), SLOWEST_WINDOW)} steps, "
                     f"+{v.slowest_excess_pct:.0f}% vs the others' median")
            stat = row.step_ms_stat
            if stat.count:
                t.append(f"   run mean {fmt.ms(stat.mean)} min {fmt.ms(stat.min)} max {fmt.ms(stat.max)}",
                         style="dim")
        w = v.last_warning
        if w is not None:
            if t.plain:
                t.append("\n")
            t.append("⚠ " if w.level == "warn" else "✖ ", style=LEVEL_STYLE.get(w.level, ""))
            who = f"rank {w.rank}: " if w.rank is not None else ""
            t.append(f"{fmt.clock(w.ts)} {who}{w.text}")
        self._set_static("#alert", t)

    def _render_pipeline(self) -> None:
        # Only while the tab is shown; the drawing depends on the width, so it is cached on it too.
        if self.query_one(TabbedContent).active != "pipeline":
            return
        v = self.view
        ps = v.pipeline
        widget = self.query_one("#pp-timeline", Static)
        width = widget.content_size.width or (self.size.width - 2)
        pipeline = is_pipeline(v)
        self._set_static("#pp-caption", caption_text(v))
        p = ps.latest
        for sel in ("#pp-legend", "#pp-bubble", "#pp-stages", "#pp-history-caption", "#pp-history"):
            self.query_one(sel).display = p is not None
        if not pipeline:
            # idle per rank; and when the run was a pipeline earlier (a switch), its last step below
            key = ("idle", v.messages_total, width, ps.version)
            if self._shown.get("pp-key") == key:
                return
            self._shown["pp-key"] = key
            text = idle_text(idle_rows(v.rows()), width)
            if p is not None:
                text.append(f"\n\nthe last pipeline step seen, step {p.step:,} "
                            f"({p.schedule or '?'}, N={p.stages}, M={p.micro_batches}):\n", style="bold")
                text.append_text(timeline_text(p, width))
            self._set_static("#pp-timeline", text)
        elif p is None:
            key = ("wait", v.messages_total, width)
            if self._shown.get("pp-key") == key:
                return
            self._shown["pp-key"] = key
            self._set_static("#pp-timeline", idle_text(idle_rows(v.rows()), width))
            return
        else:
            key = ("pp", ps.version, width)
            if self._shown.get("pp-key") == key:
                return
            self._shown["pp-key"] = key
            self._set_static("#pp-timeline", timeline_text(p, width))
        if p is None:
            return
        self._set_static("#pp-legend", legend_text())
        self._set_static("#pp-bubble", bubble_text(p))
        self._table("#pp-stages").set_rows(stage_rows(p))
        self._set_static("#pp-history-caption", history_caption(ps))
        self._table("#pp-history").set_rows(history_rows(ps))

    def on_resize(self, event) -> None:
        self.call_after_refresh(self.refresh_view)

    def ops_text(self) -> Text:
        """The Events tab's panel: the latest operations and where each stands."""
        v = self.view
        t = Text(no_wrap=True, overflow="ellipsis")
        recent = [c for c in v.recent_commands(6)]
        if not recent:
            t.append("operations: none yet   ", style="bold")
            t.append("S switch · c checkpoint full · C sharded async · m micro-batches · p profile · s status",
                     style="dim")
            return t
        t.append("operations", style="bold")
        for c in recent:
            t.append("\n")
            t.append_text(_op_line(c))
        return t

    def _render_events(self) -> None:
        v = self.view
        if self.query_one(TabbedContent).active == "events":
            self._set_static("#ops", self.ops_text())
        if v.events_total <= self._events_shown:
            return
        # Write only while the Events tab is shown: the view holds a bounded backlog meanwhile, and a
        # hidden RichLog would queue every write unbounded until it first gets a size.
        if self.query_one(TabbedContent).active != "events":
            return
        log = self.query_one("#event-log", RichLog)
        new = v.events_since(self._events_shown)
        if new and new[0].seq > self._events_shown:
            log.write(Text(f"… {new[0].seq - self._events_shown:,} older events not kept", style="dim"))
        for e in new:
            line = Text(no_wrap=False)
            line.append(fmt.clock(e.ts) + " ", style="dim")
            line.append(f"{e.level:<5} ", style=LEVEL_STYLE.get(e.level, ""))
            who = f"r{e.rank}" if e.rank is not None else ("run" if e.kind in ("ended", "run", "rejected") else "ui")
            line.append(f"{who:>4} ", style="bold")
            line.append(e.text)
            log.write(line)
        self._events_shown = v.events_total


def _op_line(c: CommandState) -> Text:
    mark, style = PHASE_STYLE.get(c.phase, ("?", ""))
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f" {mark} {c.phase:<7} ", style=style)
    t.append(c.title, style="bold")
    t.append(f" [{c.id}]" if c.id else "", style="dim")
    if c.finished and c.sent_ts and c.finished_ts:
        t.append(f"  after {max(0.0, c.finished_ts - c.sent_ts):.1f} s", style="dim")
    elif c.sent_ts:
        t.append(f"  for {fmt.ago(max(0.0, time.time() - c.sent_ts))}", style="dim")
    if c.status == "error":
        t.append(f"  {c.error}", style="red")
    elif c.status == "done" and c.result:
        t.append("  " + describe_result(c.cmd, "done", c.result, one_line=True))
    return t


def _chart_label(name: str, data: list[float], f) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{name:<14}", style="bold")
    finite = [x for x in data if math.isfinite(x)]
    if not finite:
        t.append("-", style="dim")
        return t
    t.append(f"{f(finite[-1]):>8}")
    t.append(f"  ↓{f(min(finite))} ↑{f(max(finite))}", style="dim")
    return t


# ---------------------------------------------------------------------- entry points


def run_live(publish: str, control: str | None = None, *, keys: ClientKeys | None = None,
             link_peak_gbps: float = 0.0) -> int:
    """Run the UI against a live run (rank 0's publish and control addresses, the run's client
    keys). `link_peak_gbps`: the link's peak per direction for the busbw reference (0: unknown;
    see ringtop.strategies.links)."""
    app = RingtopApp(publish_addr=publish, control_addr=control, keys=keys, link_peak_gbps=link_peak_gbps)
    try:
        app.run()
    finally:
        app._stop_client()
    return 0


def run_replay(logdir: str | Path, *, link_peak_gbps: float = 0.0) -> int:
    """Replay a log directory; prints the problem and returns 2 when it cannot be read."""
    try:
        log = load_replay(logdir)
    except ReplayError as exc:
        print(f"ringtop: {exc}", file=sys.stderr)
        return 2
    app = RingtopApp(messages=log.messages, problems=log.problems, source=str(logdir), link_peak_gbps=link_peak_gbps)
    app.run()
    return 0
