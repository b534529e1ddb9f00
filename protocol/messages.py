"""Every message ringtop sends, as typed structs sharing one flat, versioned envelope.

Each message is a map whose envelope keys (`v`, `type`, `rank`, `seq`, `ts`) sit beside its own
fields; `type` is the tag that selects the struct. The same structs are written as MessagePack on
the wire and as JSON lines on disk.

The structs a message is made of are in `parts.py`, the bounded field types and limits in
`fields.py`; this module re-exports the names read from it. The parts made only of scalars
(`CommStat`, `MemorySample`, `GpuSample`, `GroupCursor`, `InFlight`, `StageSpan`, `StepBrief`,
`CollectiveCall`) are `gc=False`: they can hold no cycle, and a large run's UI keeps hundreds of
thousands of them, which the garbage collector's full passes would otherwise
walk every time (pauses of hundreds of ms at 1024 ranks).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec

from ringtop.protocol.fields import (
    MAX_COUNT,
    MAX_DIMENSION_CHARS,
    MAX_ID_CHARS,
    MAX_REAL,
    MAX_WORLD_SIZE,
    PROTOCOL_VERSION,
    CommandId,
    Count,
    Rank,
    RankIndex,
    Real,
    WorldSize,
)
from ringtop.protocol.fields import UI_RANK as UI_RANK
from ringtop.protocol.parts import (
    MAX_CALLS_PER_STEP,
    CollectiveCall,
    CommStat,
    GpuSample,
    GroupCursor,
    HangReport,
    InFlight,
    MemorySample,
    StageSpan,
    StepBrief,
)
from ringtop.protocol.parts import MAX_GROUP_CHARS as MAX_GROUP_CHARS
from ringtop.protocol.parts import MAX_KIND_CHARS as MAX_KIND_CHARS


class Envelope(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=False):
    v: Count = PROTOCOL_VERSION
    rank: Rank = 0
    seq: Count = 0
    ts: Real = 0.0


# ---------------------------------------------------------------- telemetry (agent -> UI / disk)


class Sharding(msgspec.Struct, kw_only=True):
    """What a strategy splits across ranks rather than replicating."""

    params: bool = False
    grads: bool = False
    optimizer: bool = False


class Prediction(msgspec.Struct, kw_only=True):
    """The cost model's figures for this rank of this run (ringtop.metrics.costs.cost_model), sent
    beside the measurements so the UI can show measured against predicted."""

    params_bytes: Count = 0
    grads_bytes: Count = 0
    optimizer_bytes: Count = 0
    comm_payload_bytes: dict[str, Count] = {}
    """Per collective kind, bytes handed to collectives per step (what the tracer counts)."""
    comm_payload_bytes_by_group: dict[Annotated[str, msgspec.Meta(max_length=MAX_DIMENSION_CHARS)],
                                      dict[str, Count]] = {}
    """The same split by mesh dimension (as CommStat.group: `tp`, `dp`, `pp`; "" the world group),
    where a strategy's device mesh has several; {} otherwise. Its sums per kind are
    `comm_payload_bytes`."""
    comm_sent_bytes: Count = 0
    """Bytes this rank puts on the wire per step (ring algorithms)."""
    note: str = ""
    """What the prediction assumes that a reader should know (padding, backend quirks)."""


class Hello(Envelope, tag="hello", kw_only=True):
    run_id: str
    world_size: WorldSize
    local_rank: Annotated[int, msgspec.Meta(ge=0, lt=MAX_WORLD_SIZE)] = 0
    host: str = ""
    pid: Count = 0
    backend: str = ""
    device: str = ""
    strategy: str = ""
    strategy_options: dict[str, Any] = {}
    sharding: Sharding = msgspec.field(default_factory=Sharding)
    dtype: str = "fp32"
    """Compute dtype of parameters and gradients (fp32, or bf16 mixed precision)."""
    optimizer_bytes_per_param: Count = 8
    grad_clip: Real = 0.0
    """Max gradient norm ringtop clips to, the same way in every strategy; 0 = off."""
    prediction: Prediction | None = None
    link_peak_gbps: Real = 0.0
    """The link's peak bandwidth per direction the user declared (--link); 0 = unknown."""
    link_peak_gbps_by_group: dict[Annotated[str, msgspec.Meta(max_length=MAX_DIMENSION_CHARS)],
                                  Annotated[float, msgspec.Meta(gt=0, le=MAX_REAL)]] = {}
    """The links declared per mesh dimension (--link-tp, --link-dp, --link-pp), keyed as
    CommStat.group: where the tp groups run inside a node and the dp ones across."""
    model: str = ""
    param_count: Count = 0
    torch_version: str = ""
    ringtop_version: str = ""
    batch_size: Count = 0
    seq_len: Count = 0
    steps: Count = 0
    start_step: Count = 0
    lr: Real = 0.0
    seed: Count = 0
    device_mem_total_bytes: Count = 0
    accelerator: str = ""
    """The device's name as NVML gives it ("NVIDIA H100 80GB HBM3"); "" on CPU."""
    flops_per_token: Real = 0.0
    """Model FLOPs of one training token, forward and backward (ringtop.metrics.costs.flops); 0 = not known."""
    flops_source: str = ""
    """How flops_per_token was found (`formula 6N+12LHS`, `counted`), or why it was not."""
    peak_tflops: Real = 0.0
    """Dense peak TFLOP/s MFU is measured against (ringtop.metrics.rules.peaks, or --peak-tflops); 0 = not
    known: MFU n/a, never a guessed peak."""
    peak_source: str = ""
    """Where peak_tflops is from, or why there is none ("unknown device …")."""
    tflops_ceiling: Real = 0.0
    """The most TFLOP/s this rank could achieve (ringtop.metrics.rules.peaks.tflops_ceiling: the dense
    peak, or on CPU a bound for its cores); a Step's tflops above it is implausible. 0 = not known."""
    tflops_ceiling_source: str = ""
    switch_unavailable: dict[Annotated[str, msgspec.Meta(max_length=32)],
                             Annotated[str, msgspec.Meta(max_length=400)]] = {}
    """Switch targets this run cannot take, by the `switch` command's strategy name (`zero1`, or `*`
    for every one: an own loop), each with why; the UI's picker leaves them out. Empty (old logs
    too): every target is offered, and the agent refuses with the reason."""
    process_started_ts: Real = 0.0
    """When this rank's process started (Unix s): start-up before the Hello (imports, process
    group, model build, wrapping) counts against goodput too. 0 = not known."""
    restart_count: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 0
    """Which attempt of the run this is: the launcher started every rank again this many times
    after one failed (torchrun --max-restarts, a requeued Slurm job). Every attempt keeps the run
    id; goodput counts the time between them as `restart`."""
    max_restarts: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 0
    """How many restarts its launcher allows in all (torchrun --max-restarts); 0: none, or not
    known. A failed attempt with restarts left is `restarting`, not a failed run."""
    restart_cause: Annotated[str, msgspec.Meta(max_length=1000)] = ""
    """Of rank 0 in a restarted run: how the attempt before this one ended, as the run's logs tell
    it (`rank 1: error: …`); empty when not known or not rank 0."""
    publish: str = ""
    control: str = ""


MAX_STACK_FRAMES = 64
MAX_IN_FLIGHT = 64
MAX_GROUPS = 64


class Step(Envelope, tag="step", kw_only=True):
    step: Count
    loss: Real | None
    """None (null) when the loss was not finite: JSON has no NaN, and wire and disk share one schema."""
    step_ms: Real
    grad_norm: Real | None = None
    """Global gradient norm before clipping (over all ranks, the tied weight once); None when not
    finite or not known."""
    data_ms: Real = 0.0
    forward_ms: Real = 0.0
    backward_ms: Real = 0.0
    optimizer_ms: Real = 0.0
    exposed_comm_ms: Real = 0.0
    """Exposed communication (metrics.timing): time the training thread waited on collectives.
    Older logs call it `comm_blocked_ms`; the codec reads that name as this one."""
    comm_busy_ms: Real = 0.0
    """Wall time with at least one collective in flight (union of their intervals); the part of it
    not blocked was overlapped with compute."""
    tokens: Count = 0
    tokens_per_s: Real = 0.0
    tflops: Real = 0.0
    """Achieved model TFLOP/s of this step on this rank: Hello.flops_per_token × tokens / step time
    (ringtop.metrics.costs.flops); 0 = not known."""
    mem: MemorySample = msgspec.field(default_factory=MemorySample)
    comm: list[CommStat] = []
    cpu_percent: Real = 0.0
    drops: Count = 0
    idle_ms: Real = 0.0
    """Time this rank waited rather than computed: input plus exposed communication, or, in a
    pipeline, the stage's idle time (its bubble). The UI's idle column means this everywhere."""
    collectives: Annotated[list[GroupCursor], msgspec.Meta(max_length=MAX_GROUPS)] = []
    """Per process group this step used: its progress and the digest of its collectives."""
    skipped: bool = False
    """The optimizer step was left out: the global gradient norm was not finite and the run was
    told to skip such steps (--on-nonfinite); parameters and optimizer state are as before it."""


class CollectiveCalls(Envelope, tag="calls", kw_only=True):
    """Each collective a rank issued in one step, in its log after that step's `step`; never on the
    wire (LOG_ONLY: `ringtop trace` draws them, a live UI has no use for them). Its `seq` is the
    rank's previous message's, so the wire's count has no gap."""

    step: Count
    calls: Annotated[list[CollectiveCall], msgspec.Meta(max_length=MAX_CALLS_PER_STEP)] = []
    dropped: Count = 0


class Sample(Envelope, tag="sample", kw_only=True):
    """Host and device readings, taken on the sampler thread, never the training thread."""

    cpu_percent: Real = 0.0
    rss_bytes: Count = 0
    gpu: GpuSample | None = None


class Timeline(Envelope, tag="timeline", kw_only=True):
    """A pipeline stage's timeline of one step, sent for a sample of the steps."""

    step: Count
    stage: Count
    stages: Count
    micro_batches: Count
    schedule: str = ""
    window_ms: Real = 0.0
    window_start_ms: Real = 0.0
    """The window's start on the host's monotonic clock (ms): stages on one host align by it."""
    spans: list[StageSpan] = []
    bubble: Real = 0.0
    """Measured: 1 − busy / window on this stage."""
    bubble_theory: Real = 0.0
    """(N−1)/(N+M−1): equal stages, free transfers. Replaying the schedule with every stage's
    measured times (all stages' timelines of one step) is left to the receiver."""


class Heartbeat(Envelope, tag="heartbeat", kw_only=True):
    step: Count = 0
    drops: Count = 0
    queued: Count = 0


Level = Literal["info", "warn", "error"]
class Event(Envelope, tag="event", kw_only=True):
    level: Level = "info"
    kind: str = ""
    text: str = ""
    step: Annotated[int, msgspec.Meta(ge=-1, le=MAX_COUNT)] = -1
    data: dict[str, Any] = {}
    hang: HangReport | None = None
    """Of kinds `hang` and `desync` only. Older agents put it in `data`; the codec reads that as this."""


class Bye(Envelope, tag="bye", kw_only=True):
    reason: str = ""
    step: Count = 0
    ok: bool = True


Frames = Annotated[list[str], msgspec.Meta(max_length=MAX_STACK_FRAMES)]


class Stall(Envelope, tag="stall", kw_only=True):
    """Where a rank is while its step runs far longer than its recent steps (`stalled`, repeated
    while it lasts), that it moved on (`recovered`), or an answer to `stacks` (`snapshot`); in
    start-up, where it is before it counts as stalled (`starting`: metrics/rules/liveness.py). Taken by
    a watch thread from the tracer's ledger and `sys._current_frames()`: never the training thread,
    never the device."""

    state: Literal["stalled", "starting", "recovered", "snapshot"] = "stalled"
    request: CommandId = ""
    """The `stacks` command this snapshot answers."""
    step: Count = 0
    """The step being run (the last one finished + 1)."""
    phase: str = ""
    """What the training thread is doing: data, forward, backward, optimizer, step-sync (the step
    boundary, where ranks agree on commands), command:<name>, ..."""
    running_s: Real = 0.0
    """How long the current phase of work (step or command) has been running."""
    threshold_s: Real = 0.0
    """Running longer than this is a stall: max(k x the recent median step, a floor)."""
    where: str = ""
    """The innermost frame of the user's code (not torch, DeepSpeed, the standard library or
    ringtop's own, bar an agent run's model and data): `model.py:57 in forward`; empty if none."""
    stack: Frames = []
    """The training thread's Python stack, outermost first, `path:line in function`."""
    in_flight: Annotated[list[InFlight], msgspec.Meta(max_length=MAX_IN_FLIGHT)] = []
    groups: Annotated[list[GroupCursor], msgspec.Meta(max_length=MAX_GROUPS)] = []
    gone_peers: Annotated[list[Rank], msgspec.Meta(max_length=MAX_WORLD_SIZE)] = []
    """Ranks on this host whose process has ended."""


NonNegative = Annotated[float, msgspec.Meta(ge=0, le=MAX_REAL)]
MAX_OPEN_STALLS = 1 << 16


class GoodputSoFar(Envelope, tag="goodput", kw_only=True):
    """Rank 0's relay's goodput count up to `as_of_ts` (metrics/goodput_state.GoodputState), sent to each
    new subscriber after the replayed Hellos: a UI that attaches mid-run goes on from the run's
    count instead of from the steps it happened to see. `rank` is UI_RANK: no rank sends it, and
    the relay drops one that comes from a rank."""

    run_id: Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)] = ""
    world_size: Count = 0
    started_ts: Real
    as_of_ts: Real
    first_step_start_ts: Real | None = None
    step_end_ts: Real | None = None
    steps: Count = 0
    productive_s: NonNegative = 0.0
    checkpoint_s: NonNegative = 0.0
    switch_s: NonNegative = 0.0
    skipped_s: NonNegative = 0.0
    stall_closed_s: NonNegative = 0.0
    startup_s: NonNegative | None = None
    open_stalls: Annotated[list[tuple[Rank, Real]], msgspec.Meta(max_length=MAX_OPEN_STALLS)] = []
    recent_steps: Annotated[list[tuple[Real, Real]], msgspec.Meta(max_length=1024)] = []
    recent_stalls: Annotated[list[tuple[Real, Real]], msgspec.Meta(max_length=1024)] = []
    restart_s: NonNegative = 0.0
    """Seconds lost to the launcher's restarts of the run, but for one in progress."""
    restarts: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 0
    """The highest `Hello.restart_count` seen."""
    restart_from_ts: Real | None = None
    """Start of a restart in progress (the end of rank 0's last step before it); None: none."""
    redo_through_step: Count | None = None
    """After the latest restart, rank 0's steps numbered up to this redo work; None: none."""
    top_step: Count | None = None
    """The highest step number rank 0 reached; None: no step yet."""


MAX_DIGEST_STEPS = 1024
MAX_DIGEST_BRIEFS = 8192


class Digest(Envelope, tag="digest", kw_only=True):
    """Rank 0's relay's conflated steps, to the UIs that subscribe to `digest.` (a large run's):
    each rank's latest Step since the last digest, whole, and a brief of each older one. A UI
    then folds a few digests a second, whatever the step rate, instead of every rank's every
    step; its other subscriptions stay per message. `rank` is UI_RANK; the relay drops one that
    comes from a rank. `seq` counts the relay's digests (a gap: digests the UI lost)."""

    interval_s: Annotated[float, msgspec.Meta(gt=0, le=60)]
    steps: Annotated[list[Step], msgspec.Meta(max_length=MAX_DIGEST_STEPS)] = []
    briefs: Annotated[list[StepBrief], msgspec.Meta(max_length=MAX_DIGEST_BRIEFS)] = []
    briefs_dropped: Count = 0
    """Older steps the relay left out of this digest (more than a digest holds)."""
    relay_gaps: Count = 0
    """Messages of the ranks that never reached the relay (gaps in their `seq`), so far."""
    relay_skipped: Count = 0
    """Steps, samples and heartbeats the relay left out while behind, each for a newer one of the
    same rank (agent/transport/relay.py), so far: newest wins, the rank's log keeps them."""


MAX_RECENT_BRIEFS = 8192


class RecentSteps(Envelope, tag="recent", kw_only=True):
    """Rank 0's relay's last steps of each rank (agent/transport/relay.py keeps a bounded number), sent when
    a UI subscribes, after the cached Hellos: a UI that attaches mid-run draws its charts from
    them instead of from nothing. Every subscriber gets it; one already attached holds those steps
    and folds none. `rank` is UI_RANK; the relay drops one that comes from a rank."""

    briefs: Annotated[list[StepBrief], msgspec.Meta(max_length=MAX_RECENT_BRIEFS)] = []


class WatchersWord(Envelope, kw_only=True):
    """What a node's watcher (agent/watcher/) says of one rank of its node, seen from outside it.
    `rank` is UI_RANK: the watcher speaks for no rank; the relay drops such a word that comes from
    a rank, and takes one from a node relay only for a rank it carries."""

    rank: Rank = UI_RANK
    of_rank: RankIndex
    pid: Annotated[int, msgspec.Meta(ge=0, le=1 << 31)] = 0
    host: Annotated[str, msgspec.Meta(max_length=256)] = ""


class RankExit(WatchersWord, tag="exit", kw_only=True):
    """How a rank's process ended (a rank killed by a signal or gone without a Bye says nothing
    itself). The relay keeps the latest of each `of_rank` for UIs that attach later."""

    how: Annotated[str, msgspec.Meta(max_length=256)] = ""
    """`killed by SIGKILL`, `exited with code 1`, `died`: words of metrics/run_lifecycle's ends."""
    detail: Annotated[str, msgspec.Meta(max_length=1024)] = ""
    step: Annotated[int, msgspec.Meta(ge=-1, le=MAX_COUNT)] = -1
    """The rank's last step the watcher saw (-1: none)."""


class RankLook(WatchersWord, tag="look", kw_only=True):
    """A silent rank whose process is alive: stuck, not dead (a rank stuck in native code with the
    GIL held sends nothing, not even heartbeats). Sent about once a second while it lasts."""

    state: Annotated[str, msgspec.Meta(max_length=8)] = ""
    """/proc's letter: R running, S sleeping, D in uninterruptible I/O, T stopped."""
    words: Annotated[str, msgspec.Meta(max_length=2048)] = ""
    """metrics/rules/liveness.stuck_words: `stuck (alive, GIL held, CPU 0%) in sleep ← … ← f (m.py:7)`."""
    silent_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_REAL)] = 0.0


# ---------------------------------------------------------------- control (UI -> rank 0 -> UI)


class Command(Envelope, tag="command", kw_only=True):
    id: CommandId
    cmd: str
    args: dict[str, Any] = {}


ReplyStatus = Literal["ack", "done", "error"]


class Reply(Envelope, tag="reply", kw_only=True):
    """`ack` when a command is accepted, then `done` or `error`; a rejected command gets `error` only."""

    id: CommandId
    status: ReplyStatus
    cmd: str = ""
    result: dict[str, Any] = {}
    error: str = ""
    code: str = ""


Telemetry = Union[Hello, Step, Sample, Timeline, Heartbeat, Event, Stall, Bye, GoodputSoFar, Digest, RecentSteps,
                  CollectiveCalls, RankExit, RankLook]
Message = Union[Hello, Step, Sample, Timeline, Heartbeat, Event, Stall, Bye, GoodputSoFar, Digest, RecentSteps,
                CollectiveCalls, RankExit, RankLook, Command, Reply]

MESSAGE_TYPES: dict[str, type] = {
    cls.__struct_config__.tag: cls
    for cls in (Hello, Step, Sample, Timeline, Heartbeat, Event, Stall, Bye, GoodputSoFar, Digest, RecentSteps,
                CollectiveCalls, RankExit, RankLook, Command, Reply)
}
LOG_ONLY: frozenset[type] = frozenset({CollectiveCalls})
"""Written to a rank's log, never sent: a relay drops one that comes."""
