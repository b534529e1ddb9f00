"""Rank 0's Prometheus endpoint (`--metrics HOST:PORT`): what the relay forwards, as metrics.

Fed entirely by a relay observer, on the relay's thread: the training thread pays nothing, and a
scrape never touches a rank. The observer folds each message into the run's state
(metrics/run_state: one small record per rank, the same fold the UI and `summary` make) under a
lock; a scrape (`collect`, on the HTTP server's threads) builds the metric families from it. A
custom collector rather than labelled gauge children, so a thousand ranks cost a thousand records,
not tens of thousands of metric objects.

Its own `CollectorRegistry`: no process metrics of the global registry, nothing shared with a
user's own exporter in the same process.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Iterator, NamedTuple

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ringtop.agent.prometheus.names import SERIES, labels_of
from ringtop.agent.prometheus.server import serve_metrics
from ringtop.metrics.costs.flops import mfu
from ringtop.metrics.goodput import CAUSES
from ringtop.metrics.run_lifecycle import STATES
from ringtop.metrics.run_state import MAX_KINDS_PER_RANK as MAX_KINDS_PER_RANK  # its bound on kinds
from ringtop.metrics.run_state import RankState, RunState
from ringtop.protocol import Event

MAX_LABEL_CHARS = 128
"""A label value is cut to this many characters (a Hello's host is not bounded by the protocol)."""
MAX_VERDICTS = 1024
VERDICT_KINDS = ("verdict", "verdict_cleared", "verdicts_active")
MEMORY_FIELDS = ("params", "grads", "optimizer", "rss", "cuda_allocated", "cuda_reserved")
"""MemorySample's `<name>_bytes` fields, each a `ringtop_memory_<name>_bytes` gauge (metric_names.py)."""


class MetricsError(OSError):
    """The endpoint cannot listen (an OSError, as BindError: the agent says it in one line)."""


def _label(text: Any) -> str:
    return str(text)[:MAX_LABEL_CHARS]


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


class RunMetrics:
    """The collector. `observe` is the relay observer; `collect` is what a scrape calls. What it
    exports is read from the run's state (metrics/run_state), the one fold of the messages the UI's
    view and `summary` make too; only the verdict count is its own."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._state = RunState()
        self._verdicts: set[tuple[str, int | None]] = set()
        self.errors = 0
        """Messages the observer could not fold in (counted, never raised into the relay)."""

    # ------------------------------------------------------------------ input (the relay's thread)

    def observe(self, msg: Any) -> None:
        try:
            with self._lock:
                self._state.add(msg, self._clock())
                if type(msg) is Event and msg.rank == 0 and msg.kind in VERDICT_KINDS:
                    self._on_verdict(msg)
        except Exception:  # a message the code did not foresee must not reach the relay
            self.errors += 1

    def _on_verdict(self, msg: Event) -> None:
        """Rank 0's diagnosis: `verdict` adds one, `verdict_cleared` removes it, `verdicts_active`
        restates the whole active set."""
        data = msg.data if isinstance(msg.data, dict) else {}
        if msg.kind == "verdicts_active":
            listed = data.get("verdicts")
            found = {_verdict_key(d) for d in listed if isinstance(d, dict)} if isinstance(listed, list) else set()
            self._verdicts = set(list(found)[:MAX_VERDICTS])
        elif msg.kind == "verdict":
            if len(self._verdicts) < MAX_VERDICTS:
                self._verdicts.add(_verdict_key(data))
        else:
            self._verdicts.discard(_verdict_key(data))

    # ------------------------------------------------------------------ output (a scrape's thread)

    def describe(self) -> list:
        return []  # names are not checked against other collectors: the registry is this run's own

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = self._clock()
        with self._lock:
            state = self._state
            hello = state.hello
            run_id = _label(state.run_id)
            rows = [_row_of(r, state.stall_s(rank, now), run_id) for rank, r in sorted(state.ranks.items())]
            good = state.goodput.result()
            verdicts = len(self._verdicts)
            culprits = state.hang.rank0_culprits()
            stalled = set(state.hang.reported_stalled())
            life = state.lifecycle()
            run = {"strategy": _label(hello.strategy), "world_size": str(hello.world_size)} if hello else {}
        fam = {name: family(name) for name in SERIES}
        for row in rows:
            _add_rank(fam, row, culprits, stalled)
        run_key = [run_id]
        fam["ringtop_verdicts"].add_metric(run_key, float(verdicts))
        for name in STATES:
            fam["ringtop_run_state"].add_metric([*run_key, name], 1.0 if name == life.state else 0.0)
        if run:
            fam["ringtop_run_info"].add_metric([*run_key, run["strategy"], run["world_size"]], 1.0)
        if good.known:
            fam["ringtop_goodput_ratio"].add_metric(run_key, good.goodput)
            fam["ringtop_goodput_productive_seconds_total"].add_metric(run_key, good.productive_s)
            fam["ringtop_goodput_wall_seconds_total"].add_metric(run_key, good.wall_s)
            for cause in CAUSES:
                fam["ringtop_goodput_lost_seconds_total"].add_metric([*run_key, cause], good.lost_s.get(cause, 0.0))
        yield from fam.values()


class _Row(NamedTuple):
    """One rank's figures, copied out of the run's state under the lock."""

    rank: int
    key: list[str]
    up: bool
    step: int
    latest: Any
    """Its latest Step (None: no step yet: no step figures, rather than zeros an alert would read as stuck)."""
    step_ms: float
    peak_tflops: float
    comm: dict[str, int]
    exposed_comm_s: float
    stall_s: float


def _row_of(r: RankState, stall_s: float, run_id: str) -> _Row:
    own = _label(r.hello.run_id) if r.hello is not None else ""
    comm: dict[str, int] = {}
    for kind, n in r.comm_bytes_by_kind.items():
        comm[_label(kind)] = comm.get(_label(kind), 0) + n
    return _Row(r.rank, [own or run_id, str(r.rank), _label(r.host)], not r.over, r.step, r.latest, r.step_ms,
                r.peak_tflops, comm, r.exposed_comm_ms_total / 1e3, stall_s)


def _add_rank(fam: dict, row: _Row, culprits: frozenset[int], stalled: set[int]) -> None:
    key = row.key
    fam["ringtop_up"].add_metric(key, 1.0 if row.up else 0.0)
    fam["ringtop_stalled"].add_metric(key, 1.0 if row.rank in stalled else 0.0)
    fam["ringtop_stall_seconds"].add_metric(key, _finite(row.stall_s))
    fam["ringtop_hang_culprit"].add_metric(key, 1.0 if row.rank in culprits else 0.0)
    fam["ringtop_exposed_comm_seconds_total"].add_metric(key, row.exposed_comm_s)
    for kind, n in sorted(row.comm.items()):
        fam["ringtop_comm_bytes_total"].add_metric([*key, kind], float(n))
    latest = row.latest
    if latest is None:
        return
    fam["ringtop_step"].add_metric(key, float(row.step))
    fam["ringtop_step_seconds"].add_metric(key, row.step_ms / 1e3)
    fam["ringtop_tokens_per_second"].add_metric(key, latest.tokens_per_s)
    if latest.tflops > 0:  # 0: the rank's FLOPs are not known, not a stopped device
        fam["ringtop_model_flops_per_second"].add_metric(key, latest.tflops * 1e12)
        ratio = mfu(latest.tflops, row.peak_tflops)
        if ratio is not None:
            fam["ringtop_mfu_ratio"].add_metric(key, ratio)
    fam["ringtop_last_step_timestamp_seconds"].add_metric(key, latest.ts)
    for name in MEMORY_FIELDS:
        fam[f"ringtop_memory_{name}_bytes"].add_metric(key, float(getattr(latest.mem, f"{name}_bytes")))


def family(name: str) -> GaugeMetricFamily | CounterMetricFamily:
    """The empty family of one of SERIES (agent/prometheus/names.py), with its labels."""
    s = SERIES[name]
    cls = CounterMetricFamily if s.kind == "counter" else GaugeMetricFamily
    return cls(name, s.doc, labels=labels_of(name))


def _verdict_key(data: dict) -> tuple[str, int | None]:
    rule, rank = data.get("rule"), data.get("rank")
    return (_label(rule) if isinstance(rule, str) else "?",
            rank if isinstance(rank, int) and not isinstance(rank, bool) else None)


class MetricsExporter:
    """The HTTP endpoint: `start` listens (rank 0, with the relay), `stop` frees the port and
    joins the server's thread, so nothing outlives the run."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.metrics = RunMetrics()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.metrics)
        self._server = None
        self._thread: threading.Thread | None = None

    def observe(self, msg: Any) -> None:
        """The relay observer."""
        self.metrics.observe(msg)

    def start(self) -> None:
        try:
            self._server, self._thread = serve_metrics(self.host, self.port, self.registry)
        except OSError as exc:
            raise MetricsError(f"--metrics {self.host}:{self.port}: cannot listen there: "
                               f"{exc.strerror or exc}") from None

    def stop(self, timeout_s: float = 2.0) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()  # serve_forever returns within its poll interval
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout_s)
