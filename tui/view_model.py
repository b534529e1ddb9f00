"""The UI's view model: protocol messages in, a plain snapshot of the run out.

Pure Python — no Textual, no sockets, no clock of its own. `RunView.apply(msg, now)` folds one
message in, through `ROUTES` (message type → handler, and the parts of the view it may change,
whose snapshot versions then move on); `RunView.tick(now)` updates the connection state. The event
log, the operations and the verdicts are their own reducers (tui/reducers); ranks, steps and
communication share the rank rows and are folded in here. Everything the screens show is read
from here, so it can be tested by feeding constructed messages with explicit `now` values.

Times: `now` is whatever monotonic clock the caller uses (the app passes `time.monotonic()`); it
only decides live/stale. Message `ts` (the agent's wall clock) is kept for display and ordering.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Callable, Iterable

from ringtop.metrics.flops import mfu
from ringtop.metrics.goodput import Goodput
from ringtop.metrics.hang import HangVerdict, diagnose
from ringtop.metrics.outliers import slowest
from ringtop.metrics.strategy_names import sharded_label, strategy_label
from ringtop.metrics.timing import share_pct
from ringtop.protocol import (
    UI_RANK,
    Bye,
    Digest,
    Event,
    Heartbeat,
    Hello,
    Prediction,
    Reply,
    Sample,
    Sharding,
    Stall,
    Step,
    StepBrief,
    Timeline,
)

from .pipeline import PipelineState
from .reducers import (
    VERDICT_KINDS,
    CommandLog,
    CommandState,
    Diagnosis,
    EventLine,
    EventLog,
    HangBoard,
    VerdictBoard,
    VerdictState,
)
from .reducers.comm import COMM_WINDOW, CommLedger, CommStep
from .reducers.events import MAX_EVENTS
from .reducers.steps import StepHistory, StepPoint

HISTORY_POINTS = 240
"""Points kept per chart history (per rank and cross-rank)."""
COMM_HISTORY_BUDGET = 64 * 1024
"""Timed steps kept over all ranks' communication histories (about 500 bytes each, ~32 MB): a
rank keeps HISTORY_POINTS of them up to 273 ranks, then its share (64 at 1024 ranks), never fewer
than the Comm tab's window. 240 for each of 1024 ranks held 125 MB, and the UI's memory rose
for the 48 s they took to fill."""
DIGEST_MIN_RANKS = 128
"""From this world size on the UI takes the relay's digests instead of every rank's steps
(agent/step_digest.py): at 1024 ranks x 10 Hz, folding each step was most of the UI's time."""
SLOWEST_WINDOW = 20
"""Recent steps per rank averaged to pick the slowest rank."""
SLOWEST_EVERY_S = 1.0
"""A large run's slowest rank is picked again at most this often (every rank's steps move at
every digest: at 1024 ranks the pass cost 4 ms of each 4 Hz refresh)."""
COMM_KIND_ABBR = {"all_reduce": "AR", "reduce_scatter": "RS", "all_gather": "AG", "broadcast": "BC",
                  "reduce": "RD", "all_to_all": "A2A", "send": "P2P", "recv": "P2P", "barrier": "BAR"}
REJECT_EVENT_EVERY_S = 1.0
MAX_RANKS_BEFORE_HELLO = 1024
"""Rows the view makes for ranks it has no Hello for yet (a Hello from rank 0 gives the real count)."""
"""At most one event line per this many seconds for rejected frames; all are counted."""

CONNECTION_STATES = ("waiting", "live", "stale", "ended", "failed")
DEAD_AFTER_S = 4.0
"""A rank that sent nothing (not even its 1 s heartbeat) for this long, while the UI still hears
other ranks or another rank has ended, is marked dead: killed, or its whole process is hung."""


@dataclass(frozen=True, slots=True)
class ControlReply:
    """A `Reply` that arrived on the UI's own control socket (DEALER), not on telemetry.

    Rank 0 stamps those with its control server's counter, while the copy it also publishes on
    telemetry carries a seq from rank 0's telemetry stream. Only the telemetry copy may take part in
    rank 0's sequence-gap counting, so the receiver says which channel a reply came from.
    """

    reply: Reply


class RunningStat:
    """Running time-weighted mean, min, max and last of a metric, without storing history.

    Each value is weighted by the time it covers: the gap since the previous sample's timestamp,
    or, for the first sample (or a non-increasing timestamp), `fallback_weight` — for step times
    the step's own duration in seconds, so both weights are in seconds.
    """

    __slots__ = ("count", "min", "max", "last", "_wsum", "_w", "_last_ts")

    def __init__(self) -> None:
        self.count = 0
        self.min = math.inf
        self.max = -math.inf
        self.last = math.nan
        self._wsum = 0.0
        self._w = 0.0
        self._last_ts: float | None = None

    def update(self, value: float, ts: float | None = None, fallback_weight: float = 1.0) -> None:
        if not math.isfinite(value):
            return
        weight = fallback_weight
        if ts is not None:
            last = self._last_ts
            if last is None:
                self._last_ts = ts
            elif ts > last:
                weight = ts - last
                self._last_ts = ts
        if not 0.0 < weight < math.inf:
            weight = 1.0
        self.count += 1
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value
        self.last = value
        self._wsum += value * weight
        self._w += weight

    @property
    def mean(self) -> float:
        return self._wsum / self._w if self._w > 0 else math.nan


@dataclass
class RunFacts:
    run_id: str = ""
    world_size: int = 0
    strategy: str = ""
    strategy_options: dict[str, Any] = field(default_factory=dict)
    sharding: Sharding = field(default_factory=Sharding)
    """What the strategy splits across ranks, as the agent says (Hello.sharding)."""
    dtype: str = "fp32"
    optimizer_bytes_per_param: int = 8
    grad_clip: float = 0.0
    model: str = ""
    param_count: int = 0
    backend: str = ""
    device: str = ""
    torch_version: str = ""
    ringtop_version: str = ""
    batch_size: int = 0
    seq_len: int = 0
    steps: int = 0
    start_step: int = 0
    device_mem_total_bytes: int = 0
    accelerator: str = ""
    flops_per_token: float = 0.0
    peak_tflops: float = 0.0
    """Rank 0's Hello.peak_tflops: 0 = not known (MFU n/a)."""
    peak_source: str = ""
    link_peaks_by_group: dict[str, float] = field(default_factory=dict)
    """Rank 0's Hello.link_peak_gbps_by_group: the link of each mesh dimension (--link-tp ...)."""

    @property
    def strategy_name(self) -> str:
        """The strategy as the header shows it: `fsdp(full)` for FSDP with its sharding option."""
        return strategy_label(self.strategy, self.strategy_options)

    @property
    def sharding_text(self) -> str:
        """What is sharded, from Hello.sharding: `params+grads+optim sharded`, or `replicated`."""
        sh = self.sharding
        if self.strategy == "pp":
            replicas = self.strategy_options.get("replicas")
            return "layers split into stages" + (f", {replicas} replicas" if isinstance(replicas, int)
                                                 and replicas > 1 else "")
        parts = sharded_label(sh, nothing="")
        return parts + " sharded" if parts else "replicated"


@dataclass(frozen=True)
class NonFinite:
    step: int
    rank: int


@dataclass(slots=True)
class RankRow:
    rank: int
    host: str = ""
    pid: int = 0
    local_rank: int = 0
    device: str = ""
    # latest step
    step: int = -1
    loss: float = math.nan
    step_ms: float = math.nan
    data_ms: float = 0.0
    forward_ms: float = 0.0
    backward_ms: float = 0.0
    optimizer_ms: float = 0.0
    comm_blocked_ms: float = 0.0
    latest: Step | None = None
    """The latest Step folded in (the last to arrive): the figures only a Step carries are read
    from it (properties below), not copied at every message."""
    peak_tflops: float = 0.0
    """From the rank's Hello: its device's dense peak; 0 = not known."""
    mem_rss_bytes: int = 0
    """From the latest Step or Sample that carried one."""
    device_mem_total_bytes: int = 0
    prediction: Prediction | None = None
    """The cost model's figures for this rank, from its Hello (None when the agent sent none)."""
    # host / device samples
    cpu_percent: float = math.nan
    gpu_util_percent: float = math.nan
    gpu_mem_used_bytes: int = 0
    # loss of messages
    agent_drops: int = 0
    """Messages the agent says it dropped so far (its bounded queue overflowed, or a send failed)."""
    seq_lost: int = 0
    """Messages missing from this rank's `seq` since the UI started following it (lost anywhere
    between the rank's `emit` and this UI: agent queue, sockets, relay)."""
    last_seq: int | None = None
    hello_ts: float = 0.0
    bye_ts: float = 0.0
    # liveness
    last_seen: float | None = None
    """`now` of the last message received from this rank (caller's clock)."""
    last_ts: float = 0.0
    """The agent's wall-clock `ts` of its last message."""
    silent_s: float = 0.0
    said_hello: bool = False
    ended: bool = False
    dead: bool = False
    """Silent past DEAD_AFTER_S while others were heard: died without a Bye (or hung whole)."""
    ended_at: float | None = None
    """`now` of its Bye, or of its last message when it was found dead: which failure came first."""
    step_seen: float | None = None
    """`now` when its latest step arrived: heartbeats without steps are a stall (tui/health.py)."""
    heard_since: float | None = None
    """`now` of the first message this UI got from it (a UI attached to a hung run saw no step)."""
    folded_step: int = -1
    """The newest step folded into its histories: a step that comes again (direct and in a
    digest, while the subscription changes) is folded once."""
    bye_reason: str = ""
    bye_ok: bool = True
    slowest: bool = False
    version: int = 0
    """Moves on with every message folded into this row (and when it is found dead): a screen
    rebuilds a rank's cells only when it moved, or when what they are compared with did."""
    recent_cache: tuple[int, float] = field(default=(-1, math.nan), repr=False, compare=False)
    """(version, recent_step_ms()) as last computed."""
    # history and running stats
    step_ms_stat: RunningStat = field(default_factory=RunningStat)
    step_ms_history: deque = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    loss_history: deque = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    comm_history: deque = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    """This rank's timed steps (`reducers.comm.TimedStep`), oldest first (for the Comm tab's window
    and chart); `reducers.comm.rank_step` makes a CommStep of one when a window reads it."""

    @property
    def drops(self) -> int:
        """Messages of this rank that did not reach the UI.

        The agent stamps `seq` when a message is emitted, before its queue, so a message the agent
        drops shows up both in its `drops` counter and as a gap here; adding the two would count it
        twice. Gaps cover every loss since the UI started following the rank, the agent's counter
        also covers the time before; the larger of the two is the best single figure.
        """
        return max(self.agent_drops, self.seq_lost)

    # Read from the latest step when a screen reads them, not at every message: at 1024 ranks x
    # 10 Hz the fold runs 10k times a second, a repaint reads the rows it shows 4 times.

    @property
    def grad_norm(self) -> float:
        """Step.grad_norm of the latest step: global, before clipping; NaN when not finite or not sent."""
        g = None if self.latest is None else self.latest.grad_norm
        return math.nan if g is None else g

    @property
    def tokens_per_s(self) -> float:
        return 0.0 if self.latest is None else self.latest.tokens_per_s

    @property
    def tflops(self) -> float:
        """Step.tflops of the latest step: 0 when the agent does not know its model's FLOPs."""
        t = 0.0 if self.latest is None else self.latest.tflops
        return t if 0.0 < t < math.inf else 0.0

    @property
    def mem_params_bytes(self) -> int:
        return 0 if self.latest is None else self.latest.mem.params_bytes

    @property
    def mem_grads_bytes(self) -> int:
        return 0 if self.latest is None else self.latest.mem.grads_bytes

    @property
    def mem_optimizer_bytes(self) -> int:
        return 0 if self.latest is None else self.latest.mem.optimizer_bytes

    @property
    def mem_cuda_bytes(self) -> int:
        return 0 if self.latest is None else self.latest.mem.cuda_allocated_bytes

    @property
    def mem_cuda_reserved_bytes(self) -> int:
        return 0 if self.latest is None else self.latest.mem.cuda_reserved_bytes

    @property
    def mem_cuda_peak_bytes(self) -> int:
        return 0 if self.latest is None else self.latest.mem.cuda_peak_bytes

    @property
    def comm(self) -> list:
        """The latest step's CommStats (the message's own list)."""
        return [] if self.latest is None else self.latest.comm

    @property
    def comm_busy_ms(self) -> float:
        """Wall time with a collective in flight in the latest step (Step.comm_busy_ms)."""
        return 0.0 if self.latest is None else self.latest.comm_busy_ms

    @property
    def idle_reported(self) -> bool:
        """Whether the latest step carried Step.idle_ms (> 0); False: idle % is data + exposed comm.
        Step.idle_ms defaults to 0: an agent that does not send it (older) reads as 0, and a rank
        never waits exactly 0 ms, so 0 means "not sent"."""
        return self.latest is not None and 0.0 < self.latest.idle_ms < math.inf

    @property
    def idle_ms(self) -> float:
        """Step.idle_ms of the latest step (0 when the agent does not send it)."""
        return self.latest.idle_ms if self.idle_reported else 0.0

    @property
    def comm_bytes(self) -> int:
        """Sum of CommStat.bytes in the latest step."""
        return sum(c.bytes for c in self.comm)

    @property
    def comm_kind_bytes(self) -> dict[str, int]:
        """Per collective kind, payload bytes in the latest step."""
        kinds: dict[str, int] = {}
        for c in self.comm:
            kinds[c.kind] = kinds.get(c.kind, 0) + c.bytes
        return kinds

    @property
    def comm_mb_s(self) -> float:
        """comm_bytes / step time, in MB/s (1 MB = 1e6 bytes); NaN without a step time."""
        return self.comm_bytes / (self.step_ms / 1000.0) / 1e6 if self.step_ms > 0 else math.nan

    @property
    def comm_kind_mb_s(self) -> dict[str, float]:
        """Per collective kind, bytes in the latest step / step time, in MB/s (sums to comm_mb_s)."""
        if not self.step_ms > 0:
            return dict.fromkeys(self.comm_kind_bytes, math.nan)
        step_s = self.step_ms / 1000.0
        return {k: b / step_s / 1e6 for k, b in self.comm_kind_bytes.items()}

    @property
    def comm_share_pct(self) -> float:
        """comm_blocked_ms / step_ms, in percent."""
        return share_pct(self.comm_blocked_ms, self.step_ms)

    @property
    def idle_pct(self) -> float:
        """idle_ms / step_ms, in percent: the share of the step this rank waited on input or on exposed
        communication, or in a pipeline on its stage's bubble. From Step.idle_ms when the
        agent sends it (> 0), else (data_ms + comm_blocked_ms) / step_ms."""
        idle = self.idle_ms if self.idle_reported else self.data_ms + self.comm_blocked_ms
        return share_pct(idle, self.step_ms)

    @property
    def mem_bytes(self) -> int:
        """The memory figure for the table: CUDA allocated when on a GPU, else process RSS."""
        return self.mem_cuda_bytes if self.mem_cuda_bytes > 0 else self.mem_rss_bytes

    @property
    def mem_is_cuda(self) -> bool:
        return self.mem_cuda_bytes > 0

    @property
    def mem_state_bytes(self) -> int:
        """Parameters + gradients + optimizer state this rank holds (counted by the agent)."""
        return self.mem_params_bytes + self.mem_grads_bytes + self.mem_optimizer_bytes

    @property
    def mem_other_bytes(self) -> int:
        """Everything else: CUDA allocated − state on a GPU, process RSS − state on CPU; never < 0."""
        return max(0, self.mem_bytes - self.mem_state_bytes) if self.mem_bytes else 0

    @property
    def mem_peak_other_bytes(self) -> int:
        """Like mem_other_bytes, from the CUDA peak when there is one (the high-water mark a
        strategy must leave room for)."""
        if self.mem_is_cuda:
            return max(0, max(self.mem_cuda_peak_bytes, self.mem_cuda_bytes) - self.mem_state_bytes)
        return self.mem_other_bytes

    def recent_step_ms(self, window: int = SLOWEST_WINDOW) -> float:
        """The mean of the last `window` step times (read from the end: O(window), not O(history));
        the default window's kept until the row moves on (the repaint asks several times per rank)."""
        if window == SLOWEST_WINDOW and self.recent_cache[0] == self.version:
            return self.recent_cache[1]
        if not self.step_ms_history:
            mean = math.nan
        else:
            pts = list(islice(reversed(self.step_ms_history), window))
            pts.reverse()  # summed oldest first, as always
            mean = sum(pts) / len(pts)
        if window == SLOWEST_WINDOW:
            self.recent_cache = (self.version, mean)
        return mean


class RunView:
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
        self.briefs_dropped = 0
        self._digest_seq = 0
        self._failure_reported = False
        self.rejected_total = 0
        self._rejected_unreported = 0
        self._last_reject_event: float | None = None
        self._last_rx: float | None = None
        self.state = "waiting"
        self._live: set[int] = set()
        self._slowest_rank: int | None = None
        self._slowest_excess_pct = math.nan
        self._slowest_dirty = False
        self._slowest_at = -math.inf
        self.pipeline = PipelineState()
        """Pipeline stage timelines (Timeline messages), folded into complete steps and a bubble history."""
        self.comm_ledger = CommLedger(self.history_points)
        self.goodput = Goodput()
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
            if isinstance(msg, Event):
                self.event_log.add(msg.level, None, msg.text or msg.kind, msg.ts, kind=msg.kind)
            return None
        row = self.ranks.get(msg.rank)
        if row is None:
            if not self._may_add_row(msg.rank):
                self.note_rejected(f"{msg.__struct_config__.tag} from rank {msg.rank}, outside the run's "
                                   f"{self.facts.world_size or MAX_RANKS_BEFORE_HELLO} ranks", now)
                return None
            row = self._row(msg.rank)
        if row.dead:
            row.dead, row.ended_at = False, None
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

    def _on_timeline(self, row: RankRow, msg: Timeline, now: float) -> None:
        self.pipeline.add(msg, host=row.host)

    def _on_sample(self, row: RankRow, msg: Sample, now: float) -> None:
        if msg.cpu_percent or not math.isfinite(row.cpu_percent):
            row.cpu_percent = msg.cpu_percent
        if msg.rss_bytes:
            row.mem_rss_bytes = msg.rss_bytes
        if msg.gpu is not None:
            row.gpu_util_percent = msg.gpu.util_percent
            row.gpu_mem_used_bytes = msg.gpu.mem_used_bytes
            if msg.gpu.mem_total_bytes:
                row.device_mem_total_bytes = msg.gpu.mem_total_bytes

    def _on_stall(self, row: RankRow, msg: Stall, now: float) -> None:
        self.hang.on_stall(msg)

    def _on_heartbeat(self, row: RankRow, msg: Heartbeat, now: float) -> None:
        if msg.step > row.step:
            row.step = msg.step
        row.agent_drops = max(row.agent_drops, msg.drops)

    def _on_event(self, row: RankRow, msg: Event, now: float) -> None:
        if self.hang.on_event(msg):
            self.versions["hang"] += 1
        if msg.kind in VERDICT_KINDS:
            peak = self.verdict_board.on_event(msg)
            if peak is not None:
                self._agent_link_peak(peak, "the agent (--link)")
        if msg.kind == "operations_recent":
            data = msg.data if isinstance(msg.data, dict) else {}
            self.command_log.restated(data.get("operations"), msg.ts)
            return  # restated for late joiners, not news
        if msg.kind != "verdicts_active":  # a periodic restatement for late joiners, not news
            self.event_log.add(msg.level, msg.rank, self._event_text(msg), msg.ts, kind=msg.kind)

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

    def connection_state(self, now: float) -> str:
        if self._last_rx is None:
            return "waiting"
        if self.is_ended:
            return "failed" if self.failure is not None else "ended"
        return "live" if now - self._last_rx <= self.stale_after_s else "stale"

    @property
    def is_ended(self) -> bool:
        """Every rank we know of said Bye or died (and, when the world size is known, all of them)."""
        known = [r for r in self.ranks.values() if r.said_hello or r.ended or r.dead] or list(self.ranks.values())
        if not known or not all(r.ended or r.dead for r in known):
            return False
        ws = self.facts.world_size
        return ws <= 0 or sum(1 for r in self.ranks.values() if r.ended or r.dead) >= ws

    @property
    def failure(self) -> str | None:
        """What failed first, in words: the earliest dead rank or failed Bye; None if nothing did.
        A rank that dies takes its peers down with it, and their errors arrive first: the dead rank
        went silent before them, so it is named."""
        failed = [r for r in self.ranks.values() if r.dead or (r.ended and not r.bye_ok)]
        if not failed:
            return None
        first = min(failed, key=lambda r: (r.ended_at if r.ended_at is not None else math.inf, r.rank))
        if first.dead:
            return f"rank {first.rank} died at step {first.step} (no message for {DEAD_AFTER_S:.0f} s)"
        return f"rank {first.rank}: {first.bye_reason}"

    def _hosts_cut_off(self) -> frozenset[str]:
        """Hosts none of whose live ranks was heard for the silence limit while a rank of another
        host was: their node relay gone or the link to the head cut. Their ranks may well train on,
        so they are not declared dead; a node that did die leaves its peers waiting in a collective,
        and the peers' stall reports say so. Only a live view: a replay's arrival times say nothing."""
        if not self.watch_liveness:
            return frozenset()
        limit = min(self.stale_after_s, DEAD_AFTER_S)
        heard: set[str] = set()
        quiet: set[str] = set()
        for r in self.ranks.values():
            if r.host and not (r.ended or r.dead or r.last_seen is None):
                (quiet if r.silent_s > limit else heard).add(r.host)
        return frozenset(quiet - heard) if heard else frozenset()

    def _find_dead(self, now: float) -> None:
        heard = [r for r in self.ranks.values() if r.last_seen is not None and now - r.last_seen <= DEAD_AFTER_S]
        others_ended = any(r.ended for r in self.ranks.values())
        for row in self.ranks.values():
            if row.ended or row.dead or row.last_seen is None or now - row.last_seen <= DEAD_AFTER_S:
                continue
            if row.host in self.cut_off_hosts:
                continue  # unreachable, not known dead
            if not heard and not others_ended:
                continue  # everyone is silent: the UI lost the run, not a rank
            row.dead, row.ended_at = True, row.last_seen
            row.version += 1
            self._live.discard(row.rank)
            self._slowest_dirty = True
            self.versions.update(("comm", "hang"))
            self.event_log.add("error", row.rank, f"rank {row.rank} stopped sending at step {row.step}: no heartbeat "
                               f"for {now - row.last_seen:.0f} s while other ranks were heard; it died or its "
                               "process hung", time.time(), kind="dead")
            self.step_history.close_complete(self._live)
        if self.is_ended and self.failure is not None and not self._failure_reported:
            self._failure_reported = True
            self.event_log.add("error", None, f"the run failed: {self.failure}", time.time(), kind="failed")

    def rows(self) -> list[RankRow]:
        self._ensure_slowest()
        return [self.ranks[r] for r in sorted(self.ranks)]

    @property
    def slowest_rank(self) -> int | None:
        """The live rank with the highest mean step time over its last SLOWEST_WINDOW steps;
        None unless more than one rank is live."""
        self._ensure_slowest()
        return self._slowest_rank

    @property
    def slowest_excess_pct(self) -> float:
        """How much slower the slowest rank is than the other ranks' median, in percent (metrics.outliers)."""
        self._ensure_slowest()
        return self._slowest_excess_pct

    def live_rows(self) -> list[RankRow]:
        return [r for r in self.rows() if not r.ended]

    @property
    def latest_step(self) -> int:
        """The step every live rank has reached (min over live ranks); -1 when unknown."""
        rows = [r for r in self.live_rows() if r.step >= 0] or [r for r in self.rows() if r.step >= 0]
        return min((r.step for r in rows), default=-1)

    @property
    def tokens_per_s(self) -> float:
        rows = self.live_rows() or self.rows()
        return sum(r.tokens_per_s for r in rows)

    @property
    def tflops(self) -> float:
        """The run's achieved TFLOP/s: its ranks' latest steps summed."""
        rows = self.live_rows() or self.rows()
        return sum(r.tflops for r in rows)

    @property
    def mfu(self) -> float | None:
        """The run's MFU: its TFLOP/s over its ranks' summed peaks; None (n/a) unless every rank
        that reports TFLOP/s has a known peak."""
        rows = [r for r in (self.live_rows() or self.rows()) if r.tflops > 0]
        if not rows or any(r.peak_tflops <= 0 for r in rows):
            return None
        return mfu(sum(r.tflops for r in rows), sum(r.peak_tflops for r in rows))

    @property
    def step_ms_max_history(self) -> list[float]:
        return [p.max_ms for p in self.step_history.points]

    @property
    def step_ms_median_history(self) -> list[float]:
        return [p.median_ms for p in self.step_history.points]

    @property
    def grad_norm_history(self) -> list[float]:
        return [p.grad_norm for p in self.step_history.points if math.isfinite(p.grad_norm)]

    @property
    def nonfinite_ranks(self) -> list[int]:
        """Live ranks whose latest loss (from a step this UI received) is not finite."""
        return sorted(r.rank for r in self.ranks.values()
                      if r.step_seen is not None and not r.ended and not math.isfinite(r.loss))

    @property
    def loss_history(self) -> list[float]:
        return [p.loss for p in self.step_history.points if math.isfinite(p.loss)]

    def events_since(self, seq: int) -> list[EventLine]:
        """Event lines with `seq >= seq` still held (older ones may have been dropped)."""
        return self.event_log.since(seq)

    # the parts' state, read where the screens always read it

    @property
    def events(self) -> deque[EventLine]:
        return self.event_log.lines

    @property
    def events_total(self) -> int:
        return self.event_log.total

    @property
    def last_warning(self) -> EventLine | None:
        return self.event_log.last_warning

    @property
    def commands(self) -> dict[str, CommandState]:
        return self.command_log.commands

    def note_command_sent(self, cmd_id: str, cmd: str, args: dict[str, Any] | None = None) -> CommandState:
        """The UI sent a command; it is `pending` until a Reply arrives."""
        return self.command_log.sent(cmd_id, cmd, args)

    def active_commands(self) -> list[CommandState]:
        return self.command_log.active()

    def recent_commands(self, n: int = 6) -> list[CommandState]:
        return self.command_log.recent(n)

    @property
    def verdicts(self) -> dict[tuple[str, int | None], VerdictState]:
        return self.verdict_board.verdicts

    @property
    def cleared_verdicts(self) -> deque[VerdictState]:
        return self.verdict_board.cleared

    @property
    def diagnosis(self) -> Diagnosis | None:
        return self.verdict_board.diagnosis

    @property
    def steps(self) -> deque[StepPoint]:
        return self.step_history.points

    @property
    def comm_steps(self) -> dict[int, CommStep]:
        return self.comm_ledger.steps

    @property
    def comm_version(self) -> int:
        """Moves on whenever anything the Comm tab shows may have changed (steps, predictions,
        the link peak, who is live): builders recompute its figures only then."""
        return self.versions["comm"]

    @property
    def comm_kinds(self) -> list[str]:
        """Collective kinds seen in this run's steps (since the strategy last changed), in
        COMM_KIND_ORDER, others after it alphabetically."""
        return self.comm_ledger.kinds

    @property
    def active_verdicts(self) -> list[VerdictState]:
        """Verdicts in force, newest first."""
        return self.verdict_board.active

    def hang_verdict(self) -> HangVerdict | None:
        """Who holds the others up, and where: the UI's own reading of the stall reports it holds
        (`metrics.hang.diagnose`, recomputed only when a report, a death or a bye moved the `hang`
        version on); without reports, rank 0's latest `hang` event while it stands. None when
        nothing is stuck."""
        version = self.versions["hang"]
        if self._hang_reading[0] != version:
            self._hang_reading = (version, self._diagnose())
        own = self._hang_reading[1]
        return own if own is not None else self.hang.rank0_verdict(self.latest_ts, self.is_ended)

    def _diagnose(self) -> HangVerdict | None:
        if not self.hang.stalled:
            return None
        dead = {r.rank for r in self.ranks.values() if r.dead or (r.ended and not r.bye_ok)}
        reports = {rank: s for rank, s in self.hang.stalled.items() if rank not in dead}
        world = self.facts.world_size or max(max(self.ranks, default=0), max(reports, default=0)) + 1
        return diagnose(reports, world, dead)

    def desync_notice(self) -> Event | None:
        """Rank 0's latest `desync` event (its comparison of the steps' collectives), while the
        run goes on and for NOTICE_S after it."""
        return self.hang.desync_notice(self.latest_ts, self.is_ended)

    @property
    def total_drops(self) -> int:
        """Messages that did not reach the UI; with digests, a lost digest counts once."""
        return sum(r.drops for r in self.ranks.values()) + self.relay_gaps + self.digests_lost

    @property
    def wants_digests(self) -> bool:
        return self.facts.world_size >= self.digest_min_ranks

    # ------------------------------------------------------------------ internals

    def _drop_phantom_rows(self) -> None:
        """Rows made before the world size was known, for ranks the run does not have."""
        for rank in [r for r in self.ranks if r >= self.facts.world_size > 0]:
            del self.ranks[rank]
            self._live.discard(rank)
            self.step_history.forget_rank(rank)
            self._slowest_dirty = True
            self.note_rejected(f"rows for rank {rank}: outside the run's {self.facts.world_size} ranks")

    def _may_add_row(self, rank: int) -> bool:
        """A row only for a rank of the run: below the world size its Hello gave, and before any
        Hello at most MAX_RANKS_BEFORE_HELLO rows (forged ranks never make thousands)."""
        if self.facts.world_size:
            return 0 <= rank < self.facts.world_size
        return 0 <= rank and len(self.ranks) < MAX_RANKS_BEFORE_HELLO

    def _row(self, rank: int) -> RankRow:
        row = self.ranks.get(rank)
        if row is None:
            row = RankRow(rank=rank, device_mem_total_bytes=self.facts.device_mem_total_bytes)
            row.step_ms_history = deque(maxlen=self.history_points)
            row.loss_history = deque(maxlen=self.history_points)
            row.comm_history = deque(maxlen=self.comm_points())
            self.ranks[rank] = row
            self._live.add(rank)
        return row

    def comm_points(self) -> int:
        """A rank's communication history's length: its share of COMM_HISTORY_BUDGET."""
        world = max(self.facts.world_size, len(self.ranks), 1)
        return max(min(COMM_WINDOW, self.history_points), min(self.history_points, COMM_HISTORY_BUDGET // world))

    def _bound_comm_histories(self) -> None:
        points = self.comm_points()
        for r in self.ranks.values():
            if r.comm_history.maxlen != points:
                r.comm_history = deque(r.comm_history, maxlen=points)

    def _track_seq(self, row: RankRow, msg: Any) -> None:
        seq = msg.seq
        if row.last_seq is not None and seq > row.last_seq + 1 and not self.via_digests:
            row.seq_lost += seq - row.last_seq - 1
        if row.last_seq is None or seq > row.last_seq:
            row.last_seq = seq

    def _on_hello(self, msg: Hello, now: float) -> None:
        if msg.rank == UI_RANK:
            return
        if msg.rank >= msg.world_size:
            self.note_rejected(f"hello from rank {msg.rank} of a world of {msg.world_size}", now)
            return
        if self.facts.run_id and msg.run_id and msg.run_id != self.facts.run_id:
            old = self.facts.run_id
            self._reset()
            self.event_log.add("info", None, f"new run {msg.run_id} (was {old})", msg.ts, kind="run")
        self._last_rx = now
        f = self.facts
        authoritative = msg.rank == 0 or not f.run_id
        if authoritative:
            f.run_id = msg.run_id or f.run_id
            world = f.world_size
            f.world_size = msg.world_size or f.world_size
            self._drop_phantom_rows()
            if f.world_size != world:
                self._bound_comm_histories()
            if msg.strategy and (msg.strategy, dict(msg.strategy_options)) != (f.strategy, f.strategy_options):
                self.comm_ledger.clear()  # a new strategy talks in other collectives
                for r in self.ranks.values():
                    r.comm_history.clear()
                f.strategy = msg.strategy
                f.strategy_options = dict(msg.strategy_options)
            f.sharding = msg.sharding
            if f.link_peaks_by_group != msg.link_peak_gbps_by_group:
                f.link_peaks_by_group = dict(msg.link_peak_gbps_by_group)
                self.versions["comm"] += 1
            f.dtype = msg.dtype or f.dtype
            f.optimizer_bytes_per_param = msg.optimizer_bytes_per_param
            f.grad_clip = msg.grad_clip
            f.model = msg.model or f.model
            f.param_count = msg.param_count or f.param_count
            f.backend = msg.backend or f.backend
            f.device = msg.device or f.device
            f.torch_version = msg.torch_version or f.torch_version
            f.ringtop_version = msg.ringtop_version or f.ringtop_version
            f.batch_size = msg.batch_size or f.batch_size
            f.seq_len = msg.seq_len or f.seq_len
            f.steps = msg.steps or f.steps
            f.start_step = msg.start_step or f.start_step
            f.device_mem_total_bytes = msg.device_mem_total_bytes or f.device_mem_total_bytes
            f.accelerator = msg.accelerator or f.accelerator
            f.flops_per_token = msg.flops_per_token
            f.peak_tflops, f.peak_source = msg.peak_tflops, msg.peak_source
        row = self._row(msg.rank)
        first = not row.said_hello
        # The relay re-sends its cached Hello (and Bye) of every rank whenever a UI subscribes, so
        # the same Hello may arrive again: only a new process (new pid, or a newer Hello that restarts
        # the sequence) counts as a restart.
        if row.pid and msg.pid:
            restarted = not first and msg.pid != row.pid
        else:
            restarted = not first and msg.ts > row.hello_ts and (row.last_seq is None or msg.seq <= row.last_seq)
        if restarted:
            self._live.add(row.rank)
            row.agent_drops = 0
            row.seq_lost = 0
            row.ended = False
            row.bye_reason = ""
            row.bye_ok = True
            row.bye_ts = 0.0
        if first or restarted:
            # A Hello may be a cached copy sent long after; the next message sets the baseline.
            row.last_seq = None
            row.folded_step = -1
            row.hello_ts = msg.ts
        else:
            self._track_seq(row, msg)  # a Hello repeated in-stream; an old cached copy is ignored
        row.said_hello = True
        row.version += 1
        if row.heard_since is None:
            row.heard_since = now
        row.host = msg.host or row.host
        row.pid = msg.pid or row.pid
        row.local_rank = msg.local_rank
        row.device = msg.device or row.device
        row.prediction = msg.prediction
        row.peak_tflops = msg.peak_tflops
        peak = getattr(msg, "link_peak_gbps", 0.0)  # hook: a Hello that states the link's peak
        if peak:
            self._agent_link_peak(peak, f"rank {msg.rank}")
        if msg.device_mem_total_bytes:
            row.device_mem_total_bytes = msg.device_mem_total_bytes
        if msg.start_step and row.step < 0:
            row.step = msg.start_step
        row.last_seen = now
        row.last_ts = max(row.last_ts, msg.ts)
        if first or restarted:  # an agent may repeat its Hello for late joiners; say it once
            where = f"{msg.host} pid {msg.pid}" if msg.host else f"pid {msg.pid}"
            extra = f", resuming at step {msg.start_step}" if msg.start_step else ""
            self.event_log.add("info", msg.rank,
                            f"{'rejoined' if restarted else 'joined'}: {where}, {msg.strategy or '?'} on "
                            f"{msg.device or msg.backend or '?'}{extra}", msg.ts, kind="hello")

    def _on_step(self, row: RankRow, msg: Step, now: float) -> None:
        row.step_seen = now
        if msg.step <= row.folded_step and self.via_digests:
            return  # already folded (it came direct and in a digest)
        loss = msg.loss
        if loss is None:
            loss = math.nan  # null: the loss was not finite
        row.loss = loss
        row.step_ms = msg.step_ms
        row.data_ms = msg.data_ms
        row.forward_ms = msg.forward_ms
        row.backward_ms = msg.backward_ms
        row.optimizer_ms = msg.optimizer_ms
        row.comm_blocked_ms = msg.comm_blocked_ms
        row.latest = msg
        rss = msg.mem.rss_bytes
        if rss:
            row.mem_rss_bytes = rss
        if msg.cpu_percent:
            row.cpu_percent = msg.cpu_percent
        if msg.drops > row.agent_drops:
            row.agent_drops = msg.drops
        own = self.comm_ledger.collect(msg)
        if own is not None:
            row.comm_history.append(own)
        self._fold_step(row, msg.step, msg.ts, msg.step_ms, loss, msg.grad_norm, msg.skipped)

    def _fold_step(self, row: RankRow, step: int, ts: float, step_ms: float, loss: float,
                   grad_norm: float | None, skipped: bool) -> None:
        """What every step adds, whole or a digest's brief of it: the rank's histories, the
        cross-rank chart, the skipped and non-finite counts."""
        row.folded_step = step
        if self.hang.stalled and self.hang.on_step(row.rank, step):
            self.versions["hang"] += 1
        if step > row.step:
            row.step = step
        if math.isfinite(step_ms):
            row.step_ms_stat.update(step_ms, ts or None, (step_ms if step_ms > 0.0 else 0.0) / 1000.0)
            row.step_ms_history.append(step_ms)
        row.loss_history.append(loss)
        if grad_norm is None:
            grad_norm = math.nan
        if skipped and (self.last_skipped_step is None or step > self.last_skipped_step):
            self.last_skipped_step = step  # every rank skips the same step: count it once
            self.skipped_steps += 1
        if not math.isfinite(loss):
            first = self.first_nonfinite
            if first is None or (step, row.rank) < (first.step, first.rank):
                self.first_nonfinite = NonFinite(step=step, rank=row.rank)
        self.step_history.collect(step, row.rank, step_ms, loss, self._live, grad_norm)
        self._slowest_dirty = True

    def _on_digest(self, msg: Digest, now: float) -> None:
        """The relay's conflated steps (agent/step_digest.py): each rank's older steps by their
        numbers, then its latest whole, as if they had come one by one."""
        if self._digest_seq and msg.seq > self._digest_seq + 1:
            self.digests_lost += msg.seq - self._digest_seq - 1
        if msg.seq > self._digest_seq:
            self._digest_seq = msg.seq
        self.via_digests = True
        self.digests_folded += 1
        self.relay_gaps = max(self.relay_gaps, msg.relay_gaps)
        self.briefs_dropped += msg.briefs_dropped
        rows: dict[int, RankRow] = {}
        for step in msg.steps:
            row = self._sender(step, now)
            if row is not None:
                rows[step.rank] = row
        goodput = self.goodput
        for b in msg.briefs:
            row = rows.get(b.rank)
            if row is None:
                row = rows[b.rank] = self._sender(_BriefSender(b), now)  # a step too big to carry whole
                if row is None:
                    continue
            if b.step > row.folded_step:
                self._fold_step(row, b.step, b.ts, b.step_ms, math.nan if b.loss is None else b.loss,
                                b.grad_norm, b.skipped)
                goodput.add_step(b.rank, b.ts, b.step_ms, b.skipped)
        for step in msg.steps:
            row = rows.get(step.rank)
            if row is not None:
                if step.step > row.folded_step:
                    goodput.add(step)
                self._on_step(row, step, now)

    def _agent_link_peak(self, gbps: float, source: str) -> None:
        if self._configured_peak[0] > 0 or not (math.isfinite(gbps) and gbps > 0):
            return  # a peak configured in the UI wins
        if (self.link_peak_gbps, self.link_peak_source) != (gbps, source):
            self.link_peak_gbps, self.link_peak_source = gbps, source
            self.versions["comm"] += 1

    def _ensure_slowest(self) -> None:
        if self._slowest_dirty:
            if len(self.ranks) >= self.digest_min_ranks:  # a pass over every rank's recent steps
                now = time.monotonic()
                if now - self._slowest_at < SLOWEST_EVERY_S:
                    return
                self._slowest_at = now
            self._slowest_dirty = False
            self._update_slowest()

    def _update_slowest(self) -> None:
        live = [r for r in self.ranks.values() if not r.ended and r.step_ms_history]
        for r in self.ranks.values():
            r.slowest = False
        if len(live) < 2:
            self._slowest_rank = None
            self._slowest_excess_pct = math.nan
            return
        found = slowest({r.rank: r.recent_step_ms() for r in live})
        self._slowest_rank = found.rank
        self._slowest_excess_pct = found.excess_pct
        self.ranks[found.rank].slowest = True

    def _on_bye(self, row: RankRow, msg: Bye, now: float) -> None:
        if row.ended and msg.ts <= row.bye_ts:
            return  # the relay's cached copy, sent again to a new subscriber
        was_ended = self.is_ended
        row.bye_ts = msg.ts
        row.ended = True
        row.ended_at = row.last_seen
        self._live.discard(row.rank)
        row.bye_reason = msg.reason or ("finished" if msg.ok else "failed")
        row.bye_ok = msg.ok
        self.hang.on_bye(row.rank)
        if msg.step > row.step:
            row.step = msg.step
        level = "info" if msg.ok else "error"
        self.event_log.add(level, msg.rank, f"bye at step {msg.step}: {row.bye_reason}", msg.ts, kind="bye")
        self._slowest_dirty = True
        self.step_history.close_complete(self._live)
        if self.is_ended and not was_ended:
            if self.failure is None:
                self.event_log.add("info", None, "every rank said bye: the run has ended", msg.ts, kind="ended")
            elif not self._failure_reported:
                self._failure_reported = True
                self.event_log.add("error", None, f"the run failed: {self.failure}", msg.ts, kind="failed")

    @staticmethod
    def _event_text(msg: Event) -> str:
        text = msg.text or msg.kind or "(empty event)"
        if msg.kind and msg.text and not msg.text.startswith(msg.kind):
            text = f"{msg.kind}: {msg.text}"
        if msg.step >= 0:
            text = f"{text} (step {msg.step})"
        return text





PARTS = ("ranks", "steps", "comm", "events", "commands", "verdicts", "pipeline", "hang")
"""The view's parts; each has a snapshot version (`RunView.versions`) that moves on whenever a
message that may change it is folded in, so a screen rebuilds only what did change."""
class _BriefSender:
    """A brief as `_sender` reads a message: its rank, `seq` (none: 0) and `ts`."""

    __slots__ = ("rank", "seq", "ts")

    def __init__(self, brief: StepBrief) -> None:
        self.rank, self.seq, self.ts = brief.rank, 0, brief.ts


ROUTES: dict[type, tuple[Any, tuple[str, ...], bool]] = {
    # message type: (handler, parts it may change, whether it comes from a rank's row)
    ControlReply: (RunView._on_control_reply, ("commands", "events"), False),
    Reply: (RunView._on_published_reply, ("commands", "events"), False),
    Hello: (RunView._on_hello, ("ranks", "comm", "events"), False),
    Step: (RunView._on_step, ("ranks", "steps", "comm"), True),
    Digest: (RunView._on_digest, ("ranks", "steps", "comm"), False),
    Timeline: (RunView._on_timeline, ("pipeline",), True),
    Sample: (RunView._on_sample, ("ranks",), True),
    Heartbeat: (RunView._on_heartbeat, ("ranks",), True),
    Event: (RunView._on_event, ("events", "verdicts", "commands"), True),
    Stall: (RunView._on_stall, ("hang",), True),
    Bye: (RunView._on_bye, ("ranks", "comm", "events", "hang"), True),
}
