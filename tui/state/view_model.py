"""The UI's view model: protocol messages in, a plain snapshot of the run out.

Pure Python — no Textual, no sockets, no clock of its own. `RunView.apply(msg, now)` folds one
message in, through `ROUTES` (message type → handler, and the parts of the view it may change,
whose snapshot versions then move on); `RunView.tick(now)` updates the connection state. The event
log, the operations and the verdicts are their own reducers (tui/state/reducers); ranks, steps and
communication share the rank rows (tui/state/rank_row.py) and are folded in by `RankFold`
(tui/state/rank_fold.py). Everything the screens show is read from here, so it can be tested by
feeding constructed messages with explicit `now` values. The wall clock (`time.time`, event lines'
times) is read here only, so a test can pin it.

Times: `now` is whatever monotonic clock the caller uses (the app passes `time.monotonic()`); it
only decides live/stale. Message `ts` (the agent's wall clock) is kept for display and ordering.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ringtop.metrics.goodput import Goodput
from ringtop.metrics.lag import Lag
from ringtop.metrics.rules.hang import HangVerdict
from ringtop.metrics.rules.outliers import Outlier
from ringtop.metrics.run_state.rules import RestartSeen
from ringtop.protocol import (
    UI_RANK,
    Bye,
    Digest,
    Event,
    Heartbeat,
    Hello,
    RankExit,
    RankLook,
    RecentSteps,
    Reply,
    Sample,
    Stall,
    Step,
    Timeline,
)
from ringtop.tui.state.facts import RunFacts
from ringtop.tui.state.liveness import DEAD_AFTER_S, STUCK_LOOK_VALID_S, RunLiveness
from ringtop.tui.state.parts import PartsAccess
from ringtop.tui.state.pipeline import PipelineState
from ringtop.tui.state.rank_fold import MAX_RANKS_BEFORE_HELLO, RankFold
from ringtop.tui.state.rank_row import HISTORY_POINTS, NonFinite, RankRow
from ringtop.tui.state.reducers import VERDICT_KINDS, CommandLog, EventLog, HangBoard, VerdictBoard
from ringtop.tui.state.reducers.comm import CommLedger
from ringtop.tui.state.reducers.events import MAX_EVENTS
from ringtop.tui.state.reducers.steps import StepHistory
from ringtop.tui.state.run_readings import RunReadings
from ringtop.tui.words import at_step

DIGEST_MIN_RANKS = 128
"""From this world size on the UI takes the relay's digests instead of every rank's steps
(agent/transport/step_digest.py): at 1024 ranks x 10 Hz, folding each step was most of the UI's time."""
SLOWEST_EVERY_S = 1.0
"""A large run's slowest rank is picked again at most this often (every rank's steps move at
every digest: at 1024 ranks the pass cost 4 ms of each 4 Hz refresh)."""
REJECT_EVENT_EVERY_S = 1.0
"""At most one event line per this many seconds for rejected frames; all are counted."""


@dataclass(frozen=True, slots=True)
class ControlReply:
    """A `Reply` that arrived on the UI's own control socket (DEALER), not on telemetry.

    Rank 0 stamps those with its control server's counter, while the copy it also publishes on
    telemetry carries a seq from rank 0's telemetry stream. Only the telemetry copy may take part in
    rank 0's sequence-gap counting, so the receiver says which channel a reply came from.
    """

    reply: Reply


class RunView(RankFold, RunLiveness, RunReadings, PartsAccess):
    """Aggregates ringtop protocol messages into what the screens show."""

    def __init__(self, stale_after_s: float = 3.0, history_points: int = HISTORY_POINTS,
                 max_events: int = MAX_EVENTS, watch_liveness: bool = True,
                 digest_min_ranks: int = DIGEST_MIN_RANKS) -> None:
        self.stale_after_s = stale_after_s
        self.digest_min_ranks = digest_min_ranks
        """From this world size on, steps come in the relay's digests (`wants_digests`)."""
        self.cut_off_hosts: frozenset[str] = frozenset()
        """As of the last tick: hosts the UI hears nothing from while it hears others (_hosts_cut_off)."""
        self.watch_liveness = watch_liveness
        """Mark silent ranks dead (live runs; a replay has no clock to be silent against)."""
        self.history_points = history_points
        self.max_events = max_events
        self._configured_peak: tuple[float, str] = (0.0, "")
        self._reset()

    def _reset(self) -> None:
        self.facts = RunFacts()
        self.restart = RestartSeen()
        self.ranks: dict[int, RankRow] = {}
        self.step_history = StepHistory(self.history_points)
        self.first_nonfinite: NonFinite | None = None
        """The earliest step (lowest rank on a tie) whose loss was not finite on some rank."""
        self.skipped_steps = 0
        """Steps whose optimizer step the run left out (--on-nonfinite), counted once per step."""
        self.last_skipped_step: int | None = None
        self.event_log = EventLog(self.max_events, quiet_kinds=frozenset(VERDICT_KINDS))
        self.command_log = CommandLog(self.event_log)
        self.verdict_board = VerdictBoard()
        self.hang = HangBoard()
        """Stuck ranks' stall reports, stacks snapshots, rank 0's hang and desync events."""
        self._hang_reading: tuple[int, HangVerdict | None] = (-1, None)
        self.latest_ts = 0.0
        """The newest `ts` of any rank's message: the run's own clock, for how long a notice stays."""
        self.messages_total = 0
        self.via_digests = False
        """Steps come in digests: a rank's `seq` then has gaps by design, so the UI does not count
        them; the relay counts what never reached it (`relay_gaps`), `digests_lost` the rest."""
        self.digests_folded = 0
        self.digests_lost = 0
        self.relay_gaps = 0
        self.relay_skipped = 0
        """Readings rank 0's relay skipped while behind (a newer one of the same rank won), from its digests."""
        self.receiver_skipped = 0
        """Readings this UI's receiver skipped while the UI was behind (tui/sources/connection.py)."""
        self.briefs_dropped = 0
        self._digest_seq = 0
        self._end_reported = False
        self.rejected_total = 0
        self._rejected_unreported = 0
        self._last_reject_event: float | None = None
        self._last_rx: float | None = None
        self.state = "waiting"
        self._live: set[int] = set()
        self._slowest: Outlier | None = None
        self._slowest_dirty = False
        self._slowest_at = -math.inf
        self.pipeline = PipelineState()
        """Pipeline stage timelines (Timeline messages), folded into complete steps and a bubble history."""
        self.comm_ledger = CommLedger(self.history_points)
        self.goodput = Goodput()
        self.lag = Lag()
        """How far behind the run the screen is (metrics/lag.py): fed by the live feed."""
        """The run's goodput (metrics/goodput.py), as the header shows it."""
        self.versions: Counter[str] = getattr(self, "versions", Counter())
        self.versions.update(PARTS)  # a new run: every snapshot version moves on
        self.link_peak_gbps: float = 0.0
        """The link's peak bandwidth per direction in GB/s, the reference for busbw; 0 = unknown.
        Hook: set it with `set_link_peak` (the app's `link_peak_gbps`, e.g. from `--link`); it is also
        taken from a verdict's evidence (`link_peak_gbps`, the agent's `--link`)."""
        self.link_peak_source = ""
        self.link_peak_gbps, self.link_peak_source = self._configured_peak

    # ------------------------------------------------------------------ input

    def apply(self, msg: Any, now: float | None = None) -> None:
        """Fold one message into the view: any `ringtop.protocol` message, or a `ControlReply`
        (a reply from the UI's own control socket). `now`: the caller's monotonic clock."""
        parts = self._fold(msg, time.monotonic() if now is None else now)
        if parts:
            self._move_on(parts)

    def apply_batch(self, msgs: Iterable[Any], now: float | None = None,
                    on_error: Callable[[Any, Exception], None] | None = None) -> None:
        """Fold messages in as `apply` does each, the parts' versions moved on once for the batch
        (a screen reads them only between batches). `on_error(msg, exc)`: a message whose fold
        raised (its parts are not moved on for it); without it the exception propagates."""
        now = time.monotonic() if now is None else now
        moved: set[tuple[str, ...]] = set()
        last: tuple[str, ...] | None = None
        fold = self._fold
        for m in msgs:
            try:
                parts = fold(m, now)
            except Exception as exc:
                if on_error is None:
                    raise
                on_error(m, exc)
                continue
            if parts is not last and parts:
                moved.add(parts)
                last = parts
        if moved:
            self._move_on(set().union(*moved))

    def _move_on(self, parts: Iterable[str]) -> None:
        versions = self.versions
        for p in parts:
            versions[p] += 1

    def _fold(self, msg: Any, now: float) -> tuple[str, ...] | None:
        """`apply` without moving the versions on: the parts that may have changed (None: none)."""
        self.messages_total += 1
        route = ROUTES.get(type(msg))
        if route is None:
            self.goodput.add(msg)  # a Stall counts there; a Command (another client's, echoed) does not
            return None
        self._last_rx = now
        handler, parts, per_rank = route
        if per_rank:
            row = self._sender(msg, now)
            if row is None:
                return None
            handler(self, row, msg, now)
        else:
            handler(self, msg, now)
        self.goodput.add(msg)  # after the handler: a new run's Hello has reset the view
        return parts

    def _sender(self, msg: Any, now: float) -> RankRow | None:
        """The row of the rank that sent `msg` (made on its first message), with its liveness
        updated; None for a message the UI itself published or from a rank outside the run."""
        if msg.rank == UI_RANK:
            if isinstance(msg, Event):  # the watcher's, once rank 0 is gone (agent/watcher/), or a client's
                self._on_event(None, msg, now)
            return None
        row = self.ranks.get(msg.rank)
        if row is None:
            if not self._may_add_row(msg.rank):
                self.note_rejected(f"{msg.__struct_config__.tag} from rank {msg.rank}, outside the run's "
                                   f"{self.facts.world_size or MAX_RANKS_BEFORE_HELLO} ranks", now)
                return None
            row = self._row(msg.rank)
        if row.dead or row.stuck:
            row.dead, row.ended_at, row.exit_how, row.exit_detail = False, None, "", ""
            row.stuck, row.stuck_seen = "", None
            self._live.add(row.rank)
            self.versions["hang"] += 1
            self.event_log.add("info", row.rank, f"rank {row.rank} is sending again", msg.ts, kind="dead")
        self._track_seq(row, msg)
        row.version += 1
        row.last_seen = now
        if row.heard_since is None:
            row.heard_since = now
        if msg.ts > row.last_ts:
            row.last_ts = msg.ts
        if msg.ts > self.latest_ts:
            self.latest_ts = msg.ts
        row.silent_s = 0.0
        return row

    # one handler per message type (ROUTES below); `now` is the caller's clock

    def _on_control_reply(self, msg: ControlReply, now: float) -> None:
        self.command_log.on_reply(msg.reply, self.facts.strategy_name)

    def _on_published_reply(self, msg: Reply, now: float) -> None:
        """The copy published on telemetry: part of rank 0's stream (its seq counts)."""
        row = self.ranks.get(msg.rank)
        if row is not None:
            self._track_seq(row, msg)
            row.version += 1
            row.last_seen = now
        self.command_log.on_reply(msg, self.facts.strategy_name)

    def apply_many(self, msgs: Iterable[Any], now: float | None = None) -> None:
        self.apply_batch(msgs, now)

    def note_rejected(self, error_text: str, now: float | None = None) -> None:
        """A telemetry frame that did not decode: counted, and reported (rate-limited) as an event."""
        now = time.monotonic() if now is None else now
        self.rejected_total += 1
        self._rejected_unreported += 1
        if self._last_reject_event is None or now - self._last_reject_event >= REJECT_EVENT_EVERY_S:
            n = self._rejected_unreported
            more = f" ({n} frames since the last report)" if n > 1 else ""
            self.event_log.add("warn", None, f"rejected telemetry frame: {error_text}{more}", time.time(),
                            kind="rejected")
            self._rejected_unreported = 0
            self._last_reject_event = now

    def note(self, text: str, level: str = "info", kind: str = "ui") -> None:
        """An event line that comes from the UI itself (e.g. 'not connected')."""
        self.event_log.add(level, None, text, time.time(), kind=kind)

    def set_link_peak(self, gbps: float, source: str = "configured") -> None:
        """The hook for the link's peak (GB/s per direction, what busbw is held against); 0 clears it.
        A configured peak wins over one the agent reports, and survives a new run."""
        gbps = float(gbps) if isinstance(gbps, (int, float)) and math.isfinite(gbps) and gbps > 0 else 0.0
        self._configured_peak = (gbps, source if gbps else "")
        self.link_peak_gbps, self.link_peak_source = self._configured_peak
        self.versions["comm"] += 1

    def tick(self, now: float) -> str:
        """Update connection state (and per-rank silence) as of `now`; returns the state."""
        for row in self.ranks.values():
            row.silent_s = 0.0 if row.last_seen is None or row.ended else max(0.0, now - row.last_seen)
        self.cut_off_hosts = self._hosts_cut_off()
        if self.watch_liveness:
            self._find_dead(now)
        self._ensure_slowest()
        self.state = self.connection_state(now)
        return self.state

    # ------------------------------------------------------------------ derived

    def note_rank_exit(self, rank: int, how: str, detail: str = "") -> None:
        """How a rank ended, learnt from outside (the launcher's report, its process gone): a rank
        that did not say Bye is dead, said how. A Bye that did arrive stands."""
        row = self.ranks.get(rank)
        if row is None or row.ended or (row.dead and (row.exit_how, row.exit_detail) == (how, detail)):
            return
        at = row.ended_at if row.ended_at is not None else row.last_seen if row.last_seen is not None else math.inf
        row.take_exit(how, detail, at)
        row.version += 1
        self._live.discard(rank)
        self._slowest_dirty = True
        self.versions.update(("ranks", "comm", "hang", "events"))
        self.event_log.add("error", rank, f"rank {rank} {how} at step {row.step}" + (f" ({detail})" if detail else ""),
                           time.time(), kind="dead")
        self.step_history.close_complete(self._live)
        self._say_the_end(time.time())

    def _on_rank_exit(self, msg: RankExit, now: float) -> None:
        """The node's watcher saw the rank's process gone (agent/watcher/witness.py)."""
        self.note_rank_exit(msg.of_rank, msg.how or "died", msg.detail)

    def _on_rank_look(self, msg: RankLook, now: float) -> None:
        """The rank's node's watcher saw it silent and alive (agent/watcher/witness.py)."""
        self.note_rank_stuck(msg.of_rank, msg.words, now)

    def note_rank_stuck(self, rank: int, words: str, now: float) -> None:
        """A silent rank whose process was seen alive from outside (its node's watcher, or this UI's
        exit probe for a rank of its host): stuck, not dead, said how (metrics/rules/liveness.py:
        stuck_words)."""
        row = self.ranks.get(rank)
        if row is None or row.ended:
            return
        row.stuck_seen = now
        if row.dead and not row.exit_how.startswith("killed"):
            row.dead, row.ended_at, row.exit_how, row.exit_detail = False, None, "", ""
            self._live.add(rank)
        if words == row.stuck:
            return
        row.stuck = words
        row.version += 1
        self.versions.update(("ranks", "hang", "events"))
        silent = f" for {now - row.last_seen:.0f} s" if row.last_seen is not None else ""
        self.event_log.add("error", rank, f"rank {rank} {words}: silent{silent}, its process {row.pid} alive",
                           time.time(), kind="stuck")

    def _find_dead(self, now: float) -> None:
        heard = [r for r in self.ranks.values() if r.last_seen is not None and now - r.last_seen <= DEAD_AFTER_S]
        others_ended = any(r.ended for r in self.ranks.values())
        for row in self.ranks.values():
            if row.ended or row.dead or row.last_seen is None or now - row.last_seen <= DEAD_AFTER_S:
                continue
            if row.stuck_seen is not None and now - row.stuck_seen <= STUCK_LOOK_VALID_S:
                continue  # alive, as a look from outside found it: stuck, not dead
            if row.host in self.cut_off_hosts:
                continue  # unreachable, not known dead
            if not heard and not others_ended:
                continue  # everyone is silent: the UI lost the run, not a rank
            row.take_exit(row.exit_how, row.exit_detail, row.last_seen)  # silent: how is not known
            row.version += 1
            self._live.discard(row.rank)
            self._slowest_dirty = True
            self.versions.update(("comm", "hang"))
            self.event_log.add("error", row.rank, f"rank {row.rank} stopped sending {at_step(row.step)}: no heartbeat "
                               f"for {now - row.last_seen:.0f} s while other ranks were heard; it died or its "
                               "process hung", time.time(), kind="dead")
            self.step_history.close_complete(self._live)
        self._say_the_end(time.time())

    # the parts' state, read where the screens always read it

    # ------------------------------------------------------------------ internals

    def _ensure_slowest(self) -> None:
        if self._slowest_dirty:
            if len(self.ranks) >= self.digest_min_ranks:  # a pass over every rank's recent steps
                now = time.monotonic()
                if now - self._slowest_at < SLOWEST_EVERY_S:
                    return
                self._slowest_at = now
            self._slowest_dirty = False
            self._update_slowest()


PARTS = ("ranks", "steps", "comm", "events", "commands", "verdicts", "pipeline", "hang")
"""The view's parts; each has a snapshot version (`RunView.versions`) that moves on whenever a
message that may change it is folded in, so a screen rebuilds only what did change."""


ROUTES: dict[type, tuple[Any, tuple[str, ...], bool]] = {
    # message type: (handler, parts it may change, whether it comes from a rank's row)
    ControlReply: (RunView._on_control_reply, ("commands", "events"), False),
    Reply: (RunView._on_published_reply, ("commands", "events"), False),
    Hello: (RunView._on_hello, ("ranks", "steps", "comm", "events"), False),
    Step: (RunView._on_step, ("ranks", "steps", "comm"), True),
    Digest: (RunView._on_digest, ("ranks", "steps", "comm"), False),
    RecentSteps: (RunView._on_recent_steps, ("ranks", "steps"), False),
    Timeline: (RunView._on_timeline, ("pipeline",), True),
    Sample: (RunView._on_sample, ("ranks",), True),
    Heartbeat: (RunView._on_heartbeat, ("ranks",), True),
    Event: (RunView._on_event, ("events", "verdicts", "commands"), True),
    Stall: (RunView._on_stall, ("hang",), True),
    Bye: (RunView._on_bye, ("ranks", "comm", "events", "hang"), True),
    RankExit: (RunView._on_rank_exit, ("ranks", "comm", "events", "hang"), False),
    RankLook: (RunView._on_rank_look, ("ranks", "hang", "events"), False),
}
