"""Rank 0's Prometheus endpoint (`--metrics HOST:PORT`): what the relay forwards, as metrics.

Fed entirely by a relay observer, on the relay's thread: the training thread pays nothing, and a
scrape never touches a rank. The observer keeps one small record per rank (one dict update per
message, whatever the world size) under a lock; a scrape (`collect`, on the HTTP server's
threads) builds the metric families from it. A custom collector rather than labelled gauge
children, so a thousand ranks cost a thousand records, not tens of thousands of metric objects.

Its own `CollectorRegistry`: no process metrics of the global registry, nothing shared with a
user's own exporter in the same process.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ringtop.agent.prometheus.names import SERIES, labels_of
from ringtop.agent.prometheus.server import serve_metrics
from ringtop.metrics.costs.flops import mfu
from ringtop.metrics.goodput import CAUSES, Goodput
from ringtop.metrics.run_lifecycle import STATES, RankEnd, fold
from ringtop.protocol import Bye, Event, Hello, MemorySample, Stall, Step

MAX_LABEL_CHARS = 128
"""A label value is cut to this many characters (a Hello's host is not bounded by the protocol)."""
MAX_KINDS_PER_RANK = 32
"""Collective kinds kept apart per rank; the rest add up under `other` (bounded label cardinality)."""
MAX_VERDICTS = 1024
MEMORY_FIELDS = ("params", "grads", "optimizer", "rss", "cuda_allocated", "cuda_reserved")
"""MemorySample's `<name>_bytes` fields, each a `ringtop_memory_<name>_bytes` gauge (metric_names.py)."""


class MetricsError(OSError):
    """The endpoint cannot listen (an OSError, as BindError: the agent says it in one line)."""


def _label(text: Any) -> str:
    return str(text)[:MAX_LABEL_CHARS]


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


class _Rank:
    """What the exporter knows of one rank: the latest figures and the running totals."""

    __slots__ = ("run_id", "host", "up", "step", "step_s", "tokens_per_s", "tflops", "peak_tflops", "mem", "comm_bytes",
                 "exposed_comm_s", "last_step_ts", "stalled", "stall_running_s", "stall_seen", "end")

    def __init__(self) -> None:
        self.run_id = ""
        """From the rank's own Hello: every series of it carries it."""
        self.host = ""
        self.up = True
        self.step: int | None = None
        self.step_s = 0.0
        self.tokens_per_s = 0.0
        self.tflops = 0.0
        self.peak_tflops = 0.0
        """From the rank's Hello; 0: not known, and no ringtop_mfu_ratio for it."""
        self.mem: MemorySample | None = None
        """The latest step's (the protocol's struct, kept as it came: no copy per message)."""
        self.comm_bytes: dict[str, int] = {}
        """Collective kind -> bytes handed to it, since the start."""
        self.exposed_comm_s = 0.0
        """Seconds the training thread was blocked on communication, since the start."""
        self.last_step_ts: float | None = None
        self.stalled = False
        self.stall_running_s = 0.0
        self.stall_seen = 0.0
        """Monotonic time of the latest stalled report (on this host: no clock skew)."""
        self.end: RankEnd | None = None
        """Its Bye, as the run's lifecycle reads it."""


class RunMetrics:
    """The collector. `observe` is the relay observer; `collect` is what a scrape calls."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ranks: dict[int, _Rank] = {}
        self._goodput = Goodput()
        self._verdicts: set[tuple[str, int | None]] = set()
        self._culprits: frozenset[int] = frozenset()
        """The ranks rank 0's latest `hang` event holds the others up for; empty once cleared."""
        self._run: dict[str, str] = {}
        self.errors = 0
        """Messages the observer could not fold in (counted, never raised into the relay)."""

    # ------------------------------------------------------------------ input (the relay's thread)

    def observe(self, msg: Any) -> None:
        try:
            with self._lock:
                self._goodput.add(msg)
                handler = _HANDLERS.get(type(msg))
                if handler is not None and 0 <= msg.rank:
                    handler(self, self._row(msg.rank), msg)
        except Exception:  # a message the code did not foresee must not reach the relay
            self.errors += 1

    def _row(self, rank: int) -> _Rank:
        row = self._ranks.get(rank)
        if row is None:
            row = self._ranks[rank] = _Rank()
        return row

    def _on_hello(self, row: _Rank, msg: Hello) -> None:
        row.run_id = _label(msg.run_id)
        row.host = _label(msg.host)
        row.up = True
        row.end = None
        row.peak_tflops = msg.peak_tflops
        if msg.rank == 0:
            self._run = {"run_id": _label(msg.run_id), "strategy": _label(msg.strategy),
                         "world_size": str(msg.world_size),
                         "restarts_left": str(max(0, msg.max_restarts - msg.restart_count))}

    def _on_step(self, row: _Rank, msg: Step) -> None:
        row.step = msg.step
        row.step_s = msg.step_ms / 1e3
        row.tokens_per_s = msg.tokens_per_s
        row.tflops = msg.tflops
        row.last_step_ts = msg.ts
        row.mem = msg.mem
        kinds = row.comm_bytes
        for c in msg.comm:
            kind = _label(c.kind)
            if kind not in kinds and len(kinds) >= MAX_KINDS_PER_RANK:
                kind = "other"
            kinds[kind] = kinds.get(kind, 0) + c.bytes
        row.exposed_comm_s += max(0.0, msg.exposed_comm_ms) / 1e3  # a counter never goes down

    def _on_stall(self, row: _Rank, msg: Stall) -> None:
        if msg.state == "stalled":
            row.stalled = True
            row.stall_running_s = max(0.0, msg.running_s)
            row.stall_seen = self._clock()
        elif msg.state == "recovered":
            row.stalled = False

    def _on_bye(self, row: _Rank, msg: Bye) -> None:
        row.up = False
        row.stalled = False
        row.end = RankEnd(msg.rank, msg.step, msg.ok, msg.reason, at=msg.ts)

    def _on_event(self, row: _Rank, msg: Event) -> None:
        """Rank 0's diagnosis: `verdict` adds one, `verdict_cleared` removes it, `verdicts_active`
        restates the whole active set; a `hang` event names its culprits."""
        if msg.rank != 0 or msg.kind not in ("verdict", "verdict_cleared", "verdicts_active", "hang"):
            return
        if msg.kind == "hang":
            report = msg.hang
            named = report.culprits if report is not None and report.verdict != "cleared" else []
            self._culprits = frozenset(named[:MAX_VERDICTS])
            return
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
            ranks = sorted(self._ranks.items())
            good = self._goodput.result()
            verdicts = len(self._verdicts)
            culprits = self._culprits
            run = dict(self._run)
            life = fold([r.end for _, r in ranks if r.end is not None], world_size=int(run.get("world_size", 0)),
                        running=sum(1 for _, r in ranks if r.end is None),
                        stepped=any(r.step is not None for _, r in ranks),
                        stalled=[rank for rank, r in ranks if r.stalled],
                        restarts_left=int(run.get("restarts_left", 0)))
            rows = [(rank, r.run_id, r.host, r.up, r.step, r.step_s, r.tokens_per_s, (r.tflops, r.peak_tflops),
                     r.mem, dict(r.comm_bytes), r.exposed_comm_s, r.last_step_ts, r.stalled,
                     r.stall_running_s + max(0.0, now - r.stall_seen) if r.stalled else 0.0) for rank, r in ranks]
        fam = {name: family(name) for name in SERIES}
        for (rank, run_id, host, r_up, r_step, r_step_s, r_tokens, (r_tflops, r_peak), r_mem, r_comm, r_exposed,
             r_last, r_stalled, r_age) in rows:
            key = [run_id or run.get("run_id", ""), str(rank), host]
            fam["ringtop_up"].add_metric(key, 1.0 if r_up else 0.0)
            fam["ringtop_stalled"].add_metric(key, 1.0 if r_stalled else 0.0)
            fam["ringtop_stall_seconds"].add_metric(key, _finite(r_age))
            fam["ringtop_hang_culprit"].add_metric(key, 1.0 if rank in culprits else 0.0)
            fam["ringtop_exposed_comm_seconds_total"].add_metric(key, r_exposed)
            for kind, n in sorted(r_comm.items()):
                fam["ringtop_comm_bytes_total"].add_metric([*key, kind], float(n))
            if r_step is None:
                continue  # no step yet: no step figures, rather than zeros an alert would read as stuck
            fam["ringtop_step"].add_metric(key, float(r_step))
            fam["ringtop_step_seconds"].add_metric(key, r_step_s)
            fam["ringtop_tokens_per_second"].add_metric(key, r_tokens)
            if r_tflops > 0:  # 0: the rank's FLOPs are not known, not a stopped device
                fam["ringtop_model_flops_per_second"].add_metric(key, r_tflops * 1e12)
                ratio = mfu(r_tflops, r_peak)
                if ratio is not None:
                    fam["ringtop_mfu_ratio"].add_metric(key, ratio)
            fam["ringtop_last_step_timestamp_seconds"].add_metric(key, r_last)
            for name in MEMORY_FIELDS if r_mem is not None else ():
                fam[f"ringtop_memory_{name}_bytes"].add_metric(key, float(getattr(r_mem, f"{name}_bytes")))
        run_key = [run.get("run_id", "")]
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


def family(name: str) -> GaugeMetricFamily | CounterMetricFamily:
    """The empty family of one of SERIES (agent/prometheus/names.py), with its labels."""
    s = SERIES[name]
    cls = CounterMetricFamily if s.kind == "counter" else GaugeMetricFamily
    return cls(name, s.doc, labels=labels_of(name))


def _verdict_key(data: dict) -> tuple[str, int | None]:
    rule, rank = data.get("rule"), data.get("rank")
    return (_label(rule) if isinstance(rule, str) else "?",
            rank if isinstance(rank, int) and not isinstance(rank, bool) else None)


_HANDLERS: dict[type, Callable[[RunMetrics, _Rank, Any], None]] = {
    Hello: RunMetrics._on_hello,
    Step: RunMetrics._on_step,
    Stall: RunMetrics._on_stall,
    Bye: RunMetrics._on_bye,
    Event: RunMetrics._on_event,
}


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
