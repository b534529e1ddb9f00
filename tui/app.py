"""ringtop's terminal UI: a Textual app that composes one widget per panel and routes to them.

Live: a `TelemetryClient` thread receives and decodes telemetry and posts batches to the app as
`TelemetryBatch` messages; the handler only folds them into the view model. A timer (once a second) builds
the models of the header and of the panel on screen (each tab's panel.py, one `Panel` interface)
and hands them to their widgets, so the message rate never drives the repaint rate and hidden panels cost nothing.
Replay: the messages of a log directory are folded in (in chunks, so the UI stays responsive).

Quitting closes only the UI's own sockets; the agents are separate processes and keep running.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from rich.text import Text
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, TabbedContent, TabPane

from ringtop.protocol.connection_file import ConnectionInfo
from ringtop.protocol.curve import ClientKeys
from ringtop.tui.header.model import HeaderModel
from ringtop.tui.header.render import header_model
from ringtop.tui.header.widget import RunHeader
from ringtop.tui.keys_help import KeysHelp
from ringtop.tui.large_run.keys import OVERVIEW_BINDINGS, OverviewKeys
from ringtop.tui.large_run.nav import OverviewNav, comm_nav, memory_nav
from ringtop.tui.palette import RingtopPalette
from ringtop.tui.panel import Frame, Panel
from ringtop.tui.run_commands import RUN_COMMANDS, RunCommands
from ringtop.tui.sources.connection import TelemetryClient
from ringtop.tui.sources.exit_probe import ExitProbe, LauncherExits, LauncherFailed
from ringtop.tui.sources.feeds import TIMER_REFRESH_AFTER_S, Feeds
from ringtop.tui.sources.follow import RunFollower
from ringtop.tui.sources.replay import ReplayError, load_replay
from ringtop.tui.state.view_model import DIGEST_MIN_RANKS, RunView
from ringtop.tui.tabs.comm.panel import CommFigures, CommTab
from ringtop.tui.tabs.events.panel import EventsTab
from ringtop.tui.tabs.hang.panel import HangTab
from ringtop.tui.tabs.memory.panel import MemoryTab
from ringtop.tui.tabs.overview.panel import OverviewTab
from ringtop.tui.tabs.pipeline.panel import PipelineTab

BUNDLE_TITLE = "Bundle for a bug report"
BUNDLE_HELP = ("`ringtop bundle` of this run: stacks, ledgers, last steps and events, summary, config, versions "
               "(no keys), one .tar.gz in its log folder")
BUNDLE_TIMEOUT_S = 180.0
REFRESH_S = 1.0
"""The screen's timer: once a second, as htop (1.5 s) and nvitop (2 s) refresh; a key redraws at
once, and a large run's digests redraw as they come (feeds.py). An Overview repaint costs ~25 ms
of CPU on these machines: at 4 Hz a UI watching 8 ranks took 16-17 % of a core, at 2 Hz 8-9 %,
at 1 Hz 5 % (benchmarks/bench_ui_cost.py) — a share the ranks on its node lose."""
UI_NICE = 10
"""A live UI lowers its own CPU priority by this much (`os.nice`): on a node whose cores the ranks
keep busy, the ranks come first and the screen takes what is left (at 1 Hz it needs little);
attached, a UI at nice 0 slowed a 2-rank run on 2 cores 1.18-1.32x (benchmarks/bench_ui_cost.py)."""
GC_THRESHOLDS = (10_000, 20, 10)
"""The collector's thresholds while the app runs (Python's: 700, 10, 10). A large run's UI makes
and drops tens of thousands of objects a second (decoded messages, each refresh's figures); at
the defaults its full passes came every 3 s and paused every thread, the event loop included, for
120-170 ms at 1024 ranks (65 ms of each second in collections); at these, 12-26 ms a second and
no full pass in a 12 s window (benchmarks/README.md, UI at scale). Restored when the app ends."""
TABS = ("overview", "memory", "comm", "pipeline", "events", "hang")


def tab_panels() -> dict[str, Panel]:
    """One panel per tab, in TABS order; the Overview's busbw chart and the Comm tab share their figures."""
    comm = CommFigures()
    panels: tuple[Panel, ...] = (OverviewTab(comm), MemoryTab(), CommTab(comm), PipelineTab(), EventsTab(), HangTab())
    return {p.tab: p for p in panels}


class RingtopApp(Feeds, RunCommands, OverviewKeys, App):
    """The ringtop cockpit. Live: pass `publish_addr` (and `control_addr`); replay: pass `messages`."""

    TITLE = "ringtop"
    CSS = """
    Screen { layout: vertical; }
    TabbedContent { height: 1fr; }
    TabPane { padding: 0; }
    """

    BINDINGS = [
        Binding("S", "switch", "switch"),
        Binding("w", "switch", "switch", show=False),
        Binding("c", "checkpoint", "ckpt"),
        Binding("C", "checkpoint_sharded", "sharded ckpt"),
        Binding("m", "micro_batches", "micro-batches"),
        Binding("p", "profile", "profile"),
        Binding("s", "status", "status"),
        Binding("k", "stacks", "stacks"),
        Binding("X", "stop", "stop"),
        *(Binding(c.key, f"refuse_ended('{c.action}')", show=False) for c in RUN_COMMANDS),
        *(Binding(str(i), f"show_tab('{tab}')", tab, show=False) for i, tab in enumerate(TABS, 1)),
        Binding("r", "comm_rank", "rank/all"),
        *OVERVIEW_BINDINGS,
        Binding("b", "bundle", "bundle", show=False),
        Binding("question_mark", "keys_help", "keys"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, publish_addr: str | None = None, control_addr: str | None = None, *,
                 messages: Iterable[Any] | None = None, problems: Iterable[str] = (), source: str = "",
                 stale_after_s: float = 3.0, link_peak_gbps: float = 0.0, keys: ClientKeys | None = None,
                 digest_min_ranks: int = DIGEST_MIN_RANKS, launcher_exits: LauncherExits | None = None,
                 launcher_failed: LauncherFailed | None = None, follow: ConnectionInfo | None = None) -> None:
        """`keys`: the run's client keys (its connection file); None for a run started --insecure.
        `launcher_exits`: what the launcher of the ranks saw end them (tui/sources/exit_probe.py), when known;
        `launcher_failed`: while it runs, how each worker it saw fail ended, by pid.
        `link_peak_gbps`: the link's peak per direction for the busbw reference (e.g. `--link`).
        `digest_min_ranks`: from this world size on, steps come in the relay's digests (view_model).
        `follow`: the connection file the run was found by: when its launcher restarts it, the UI
        attaches to the new rank 0 by itself (tui/sources/follow.py)."""
        super().__init__()
        if messages is None and publish_addr is None:
            raise ValueError("RingtopApp needs either publish_addr (live) or messages (replay)")
        self.keys = keys
        self.replay = messages is not None
        self.publish_addr = publish_addr
        self.control_addr = control_addr
        self.source = source or (publish_addr or "")
        self._replay_messages: list[Any] = list(messages) if messages is not None else []
        self._replay_problems = list(problems)
        self.replay_applied = 0
        self.replay_loaded = not self.replay
        self.view = RunView(stale_after_s=stale_after_s, watch_liveness=not self.replay,
                            digest_min_ranks=digest_min_ranks)
        if link_peak_gbps:
            self.view.set_link_peak(link_peak_gbps, "configured")
        self.comm_rank: int | None = None
        """The Comm tab's selection: a rank, or None for all ranks."""
        self.hang_rank: int | None = None
        """The Hang view's selection (its table's cursor): the rank whose stack it shows; None or a
        rank no row holds: the first row's, the first culprit."""
        self.client: TelemetryClient | None = None
        self.navs: dict[str, OverviewNav] = {"overview": OverviewNav(), "memory": memory_nav(), "comm": comm_nav()}
        """Per tab with a large run's table: the node opened, the sort, the filter, the rows on screen."""
        self.table_cursor_keys: dict[str, str | None] = {}
        """Per tab, the row under its table's cursor as last drawn (what Enter opens)."""
        self.table_page_rows: dict[str, int] = {}
        self.panels = tab_panels()
        self.exit_probe = None if self.replay else ExitProbe(launcher_exits, launcher_failed=launcher_failed)
        self.follower = RunFollower(follow) if follow is not None and not self.replay else None
        self._gc_thresholds = gc.get_threshold()
        self._offered: tuple = ()
        self.refreshed_at = -1e9

    def compose(self) -> ComposeResult:
        yield RunHeader()
        with TabbedContent(initial="overview"):
            for i, tab in enumerate(TABS, 1):
                with TabPane(f"{i} {tab.capitalize()}", id=tab):
                    yield self.panels[tab].widget()
        yield Footer()

    def on_mount(self) -> None:
        self._gc_thresholds = gc.get_threshold()
        gc.set_threshold(*GC_THRESHOLDS)  # back in on_unmount
        if self.replay:
            self.sub_title = f"replay {self.source}"
            for p in self._replay_problems:
                self.view.note(p, level="warn", kind="replay")
            self.run_worker(self._load_replay(), name="replay", exclusive=True)
        else:
            self.sub_title = self.source
            self._start_client()
        self.set_interval(REFRESH_S, self._on_refresh_timer)
        self.refresh_view()

    def on_unmount(self) -> None:
        self._stop_client()
        gc.set_threshold(*self._gc_thresholds)

    # ------------------------------------------------------------------ keys

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.refresh_bindings()  # `r` shows in the footer on the Comm tab only, the node keys on the Overview
        if self.active_tab == "hang":  # ↑↓ move through the ranks
            self.query_one("#hang-ranks", DataTable).focus()
        self.call_after_refresh(self.refresh_view)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """The Hang view's cursor chooses the rank whose stack it shows (a row's first rank)."""
        key = event.row_key.value if event.row_key is not None else None
        if event.data_table.id != "hang-ranks" or not key or not key.startswith("h"):
            return
        rank = int(key[1:])
        if rank != self.hang_rank:
            self.hang_rank = rank
            self.refresh_view()

    def on_resize(self, event) -> None:
        self.call_after_refresh(self.refresh_view)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """False hides the key from the footer and ignores it: `r` only on the Comm tab, commands
        only where the run can take them (run_commands.py)."""
        if action == "comm_rank":
            return self.active_tab == "comm"
        return self.command_allowed(action) and self.overview_allowed(action)

    def action_command_palette(self) -> None:
        if self.use_command_palette and not RingtopPalette.is_open(self):
            self.push_screen(RingtopPalette(id="--command-palette"))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from self.run_system_commands()
        yield SystemCommand(f"{BUNDLE_TITLE}  (b)", BUNDLE_HELP, self.action_bundle)
        yield from self.overview_system_commands()
        yield from super().get_system_commands(screen)

    def action_bundle(self) -> None:
        """`ringtop bundle` of this run (its id live, its log folder in a replay), in a child
        process: the screen goes on; Events says where the archive is."""
        target = self.source if self.replay else self.view.facts.run_id
        if not target:
            self.view.note("bundle: the run's id is not known yet (no Hello seen)", level="warn", kind="bundle")
        else:
            self.run_worker(self._bundle(target), name="bundle", exclusive=True)
        self.refresh_view()

    async def _bundle(self, target: str) -> None:
        self.view.note(f"bundle: collecting {target} …", kind="bundle")
        self.refresh_view()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ringtop.cli", "bundle", target, *(["--no-live"] if self.replay else []),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), BUNDLE_TIMEOUT_S)
        except asyncio.TimeoutError:
            self.view.note(f"bundle: no answer within {BUNDLE_TIMEOUT_S:.0f} s; left out", level="error",
                           kind="bundle")
            return
        finally:
            if proc.returncode is None:  # the UI quit, or the timeout: no process outlives its caller
                proc.kill()
                await proc.wait()
            self.refresh_view()
        said = (out if proc.returncode == 0 else err).decode(errors="replace").strip().splitlines()
        self.view.note(said[-1] if said else f"bundle: exit code {proc.returncode}",
                       level="info" if proc.returncode == 0 else "error", kind="bundle")
        self.refresh_view()

    @property
    def overview_nav(self) -> OverviewNav:
        return self.navs["overview"]

    def overview_changed(self) -> None:
        """A key moved a large run's table (a node, the sort, the filter, the cursor): redraw it now."""
        self.refresh_bindings()
        self.refresh_view()

    def action_keys_help(self) -> None:
        if not isinstance(self.screen, KeysHelp):
            self.push_screen(KeysHelp(TABS))

    def action_comm_rank(self) -> None:
        """The Comm tab's selection: all ranks → rank 0 → rank 1 → … → all ranks."""
        ranks = sorted(self.view.ranks)
        if self.comm_rank is None:
            self.comm_rank = ranks[0] if ranks else None
        else:
            later = [r for r in ranks if r > self.comm_rank]
            self.comm_rank = later[0] if later else None
        self.refresh_view()

    async def action_quit(self) -> None:
        self._stop_client()  # closes the UI's sockets only; agents keep running
        self.exit()

    # ------------------------------------------------------------------ repaint

    @property
    def active_tab(self) -> str:
        try:
            return self.query_one(TabbedContent).active
        except Exception:
            return ""

    def _on_refresh_timer(self) -> None:
        """With digests the screen is refreshed as each digest is folded in (`Feeds`), so that it
        is as fresh as the relay's steps; the timer then only fills in where no digest came."""
        now = time.monotonic()
        self._follow_run(now)
        if self.view.via_digests and now - self.refreshed_at < TIMER_REFRESH_AFTER_S:
            return
        self.refresh_view()

    def refresh_view(self) -> None:
        """Hand the header and the panel on screen their models (called at a fixed rate)."""
        if not self.is_running:
            return
        now = self.refreshed_at = time.monotonic()
        v = self.view
        if self.exit_probe is not None:
            self.exit_probe.probe(v, now)
        v.tick(now)
        nav = self.navs.get(self.active_tab)
        offered = (v.facts.strategy, self.active_tab, nav is not None and nav.scaled(len(v.ranks)),
                   nav is not None and nav.level(len(v.ranks)), v.is_ended)
        if offered != self._offered:  # what `check_action` offers changed
            self._offered = offered
            self.refresh_bindings()
        self.query_one(RunHeader).show(self._header_model())
        panel = self.panels.get(self.active_tab)
        if panel is None:
            return
        if self.comm_rank is not None and self.comm_rank not in v.ranks:
            self.comm_rank = None  # a new run
        frame = Frame(v, now, self.replay, self.navs, comm_rank=self.comm_rank, hang_rank=self.hang_rank,
                      screen_width=self.size.width)
        widget = self.query_one(panel.widget)
        built = panel.build(frame, widget)
        if built.page_rows is not None:
            self.table_cursor_keys[panel.tab], self.table_page_rows[panel.tab] = built.cursor_key, built.page_rows
        widget.show(built.model)

    def _header_model(self) -> HeaderModel:
        refused = self.client.auth_failure if self.client is not None else ""
        return header_model(self.view, replay=self.replay, source=self.publish_addr or self.source,
                            refused=refused, replay_pct=None if self.replay_loaded else self._replay_pct(),
                            width=self.size.width)

    def header_text(self) -> Text:
        """The whole header line: run facts, then the connection indicator."""
        m = self._header_model()
        return Text.assemble(m.facts, "  ", m.connection)



def run_live(publish: str, control: str | None = None, *, keys: ClientKeys | None = None,
             link_peak_gbps: float = 0.0, digest_min_ranks: int = DIGEST_MIN_RANKS, nice: int = UI_NICE,
             launcher_exits: LauncherExits | None = None, launcher_failed: LauncherFailed | None = None,
             follow: ConnectionInfo | None = None) -> int:
    """Run the UI against a live run (rank 0's publish and control addresses, the run's client keys);
    `follow`: its connection file's contents, to attach again by itself when the run restarts."""
    if nice > 0:
        try:
            os.nice(nice)  # this process only: ranks started before it keep theirs
        except OSError:
            pass
    app = RingtopApp(publish_addr=publish, control_addr=control, keys=keys, link_peak_gbps=link_peak_gbps,
                     digest_min_ranks=digest_min_ranks, launcher_exits=launcher_exits,
                     launcher_failed=launcher_failed, follow=follow)
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
