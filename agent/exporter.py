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

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ringtop.metrics.flops import mfu
from ringtop.metrics.goodput import CAUSES, Goodput
from ringtop.protocol import Bye, Event, Hello, MemorySample, Stall, Step

MAX_LABEL_CHARS = 128
"""A label value is cut to this many characters (a Hello's host is not bounded by the protocol)."""
MAX_KINDS_PER_RANK = 32
"""Collective kinds kept apart per rank; the rest add up under `other` (bounded label cardinality)."""
MAX_VERDICTS = 1024
MEMORY_FIELDS = ("params", "grads", "optimizer", "rss", "cuda_allocated", "cuda_reserved")
"""MemorySample's `<name>_bytes` fields, each a `ringtop_memory_<name>_bytes` gauge."""


class MetricsError(OSError):
    """The endpoint cannot listen (an OSError, as BindError: the agent says it in one line)."""


def _label(text: Any) -> str:
    return str(text)[:MAX_LABEL_CHARS]


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


class _Rank:
    """What the exporter knows of one rank: the latest figures and the running totals."""

    __slots__ = ("host", "up", "step", "step_s", "tokens_per_s", "tflops", "peak_tflops", "mem", "comm_bytes",
                 "exposed_s", "last_step_ts", "stalled", "stall_running_s", "stall_seen")

    def __init__(self) -> None:
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
        self.exposed_s = 0.0
        """Seconds the training thread was blocked on communication, since the start."""
        self.last_step_ts: float | None = None
        self.stalled = False
        self.stall_running_s = 0.0
        self.stall_seen = 0.0
        """Monotonic time of the latest stalled report (on this host: no clock skew)."""


class RunMetrics:
    """The collector. `observe` is the relay observer; `collect` is what a scrape calls."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ranks: dict[int, _Rank] = {}
        self._goodput = Goodput()
        self._verdicts: set[tuple[str, int | None]] = set()
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
        row.host = _label(msg.host)
        row.up = True
        row.peak_tflops = msg.peak_tflops
        if msg.rank == 0:
            self._run = {"run_id": _label(msg.run_id), "strategy": _label(msg.strategy),
                         "world_size": str(msg.world_size)}

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
        row.exposed_s += max(0.0, msg.comm_blocked_ms) / 1e3  # a counter never goes down

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

    def _on_event(self, row: _Rank, msg: Event) -> None:
        """Rank 0's diagnosis: `verdict` adds one, `verdict_cleared` removes it, `verdicts_active`
        restates the whole active set."""
        if msg.rank != 0 or msg.kind not in ("verdict", "verdict_cleared", "verdicts_active"):
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
            run = dict(self._run)
            rows = [(rank, r.host, r.up, r.step, r.step_s, r.tokens_per_s, (r.tflops, r.peak_tflops), r.mem,
                     dict(r.comm_bytes),
                     r.exposed_s, r.last_step_ts, r.stalled,
                     r.stall_running_s + max(0.0, now - r.stall_seen) if r.stalled else 0.0) for rank, r in ranks]
        labels = ["rank", "host"]

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        up = gauge("ringtop_up", "1 from a rank's Hello until its Bye")
        step = gauge("ringtop_step", "The rank's latest finished optimizer step")
        step_s = gauge("ringtop_step_seconds", "Wall time of the rank's latest step")
        tokens = gauge("ringtop_tokens_per_second", "Tokens per second of the rank's latest step")
        tflops = gauge("ringtop_tflops", "Achieved model TFLOP/s of the rank's latest step (model FLOPs per token "
                       "x tokens / step time)")
        mfu_ratio = gauge("ringtop_mfu_ratio", "The rank's TFLOP/s over its device's dense peak (0..1); only for "
                          "ranks whose peak is known")
        last = gauge("ringtop_last_step_timestamp_seconds",
                     "Unix time of the rank's latest Step (alert on time() - this)")
        memory = {name: gauge(f"ringtop_memory_{name}_bytes", f"Bytes of {name.replace('_', ' ')} memory the rank "
                              "holds, at its latest step") for name in MEMORY_FIELDS}
        comm = CounterMetricFamily("ringtop_comm_bytes", "Bytes the rank handed to collectives, by kind",
                                   labels=[*labels, "kind"])
        exposed = CounterMetricFamily("ringtop_comm_exposed_seconds",
                                      "Seconds the rank's training thread was blocked on communication", labels=labels)
        stalled = gauge("ringtop_stalled", "1 while the rank is reported stalled (its step runs far too long)")
        stall_s = gauge("ringtop_stall_seconds", "How long the rank's stalled phase has run; 0 when not stalled")
        for (rank, host, r_up, r_step, r_step_s, r_tokens, (r_tflops, r_peak), r_mem, r_comm, r_exposed, r_last,
             r_stalled, r_age) in rows:
            key = [str(rank), host]
            up.add_metric(key, 1.0 if r_up else 0.0)
            stalled.add_metric(key, 1.0 if r_stalled else 0.0)
            stall_s.add_metric(key, _finite(r_age))
            exposed.add_metric(key, r_exposed)
            for kind, n in sorted(r_comm.items()):
                comm.add_metric([*key, kind], float(n))
            if r_step is None:
                continue  # no step yet: no step figures, rather than zeros an alert would read as stuck
            step.add_metric(key, float(r_step))
            step_s.add_metric(key, r_step_s)
            tokens.add_metric(key, r_tokens)
            if r_tflops > 0:  # 0: the rank's FLOPs are not known, not a stopped device
                tflops.add_metric(key, r_tflops)
                ratio = mfu(r_tflops, r_peak)
                if ratio is not None:
                    mfu_ratio.add_metric(key, ratio)
            last.add_metric(key, r_last)
            for name in MEMORY_FIELDS if r_mem is not None else ():
                memory[name].add_metric(key, float(getattr(r_mem, f"{name}_bytes")))
        yield from (up, step, step_s, tokens, tflops, mfu_ratio, last, *memory.values(), comm, exposed, stalled,
                    stall_s)
        yield GaugeMetricFamily("ringtop_verdicts", "Active verdicts of rank 0's diagnosis", value=float(verdicts))
        if run:
            info = GaugeMetricFamily("ringtop_run_info", "The run: id, strategy, world size",
                                     labels=sorted(run))
            info.add_metric([run[k] for k in sorted(run)], 1.0)
            yield info
        if good.known:
            yield GaugeMetricFamily("ringtop_goodput_ratio", "Share of the run's wall time in productive steps (0..1)",
                                    value=good.goodput)
            yield GaugeMetricFamily("ringtop_goodput_productive_seconds", "Seconds of productive steps",
                                    value=good.productive_s)
            yield GaugeMetricFamily("ringtop_goodput_wall_seconds", "The run's wall time so far",
                                    value=good.wall_s)
            lost = GaugeMetricFamily("ringtop_goodput_lost_seconds", "Seconds of the wall lost, by cause",
                                     labels=["cause"])
            for cause in CAUSES:
                lost.add_metric([cause], good.lost_s.get(cause, 0.0))
            yield lost


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
            self._server, self._thread = start_http_server(self.port, addr=self.host, registry=self.registry)
        except OSError as exc:
            raise MetricsError(f"--metrics {self.host}:{self.port}: cannot listen there: "
                               f"{exc.strerror or exc}") from None
        self._thread.name = "ringtop-metrics"

    def stop(self, timeout_s: float = 2.0) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()  # serve_forever returns within its poll interval
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout_s)
