"""The Prometheus exporter (agent/prometheus/exporter.py): messages in, exposition out, parsed back with
prometheus_client's own parser; the HTTP endpoint frees its port and thread when stopped; the
`--metrics` option's checks."""

from __future__ import annotations

import socket
import urllib.request

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client import generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from ringtop.agent.config import ConfigError, parse_agent_args  # noqa: E402
from ringtop.agent.prometheus.exporter import MAX_KINDS_PER_RANK, MAX_LABEL_CHARS, MetricsExporter, RunMetrics  # noqa: E402
from ringtop.protocol import Bye, CommStat, Event, Hello, MemorySample, RankExit, Stall, Step, free_tcp_port  # noqa: E402

T0 = 1_780_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def samples(metrics: RunMetrics) -> dict[str, dict[tuple, float]]:
    """name -> {sorted label items: value}, from the text a scrape would get."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(metrics)
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def rank_labels(rank: int, host: str, run_id: str = "r1", **more: str) -> tuple:
    return tuple(sorted({"run_id": run_id, "rank": str(rank), "host": host, **more}.items()))


RUN = (("run_id", "r1"),)


def hello(rank: int) -> Hello:
    return Hello(rank=rank, ts=T0, run_id="r1", world_size=2, host=f"node-{rank}", strategy="ddp")


def step(rank: int, n: int, ts: float, step_ms: float = 100.0, exposed_comm_ms: float = 20.0) -> Step:
    return Step(rank=rank, ts=T0 + ts, step=n, loss=1.0, step_ms=step_ms, exposed_comm_ms=exposed_comm_ms,
                tokens_per_s=5000.0 + rank,
                mem=MemorySample(params_bytes=1000, grads_bytes=2000, optimizer_bytes=3000, rss_bytes=4000 + rank,
                                 cuda_allocated_bytes=5000, cuda_reserved_bytes=6000),
                comm=[CommStat(kind="all_reduce", count=1, bytes=1_000_000), CommStat(kind="broadcast", bytes=10)])


def test_messages_become_labelled_metrics():
    clock = Clock()
    m = RunMetrics(clock=clock)
    for msg in (hello(0), hello(1), step(0, 1, 1.0), step(1, 1, 1.001), step(0, 2, 1.1), step(1, 2, 1.101)):
        m.observe(msg)
    m.observe(Event(rank=0, ts=T0 + 1.2, kind="verdict", data={"rule": "straggler", "rank": 1}))
    m.observe(Event(rank=0, ts=T0 + 1.2, kind="verdict", data={"rule": "comm_bound", "rank": None}))
    m.observe(Stall(rank=1, ts=T0 + 5.0, state="stalled", running_s=3.5))
    clock.now += 2.0  # the scrape comes 2 s after the stall report
    s = samples(m)
    r0, r1 = rank_labels(0, "node-0"), rank_labels(1, "node-1")
    assert s["ringtop_step"] == {r0: 2.0, r1: 2.0}
    assert s["ringtop_step_seconds"][r0] == pytest.approx(0.1)
    assert s["ringtop_tokens_per_second"] == {r0: 5000.0, r1: 5001.0}
    assert s["ringtop_last_step_timestamp_seconds"][r1] == pytest.approx(T0 + 1.101)
    assert s["ringtop_up"] == {r0: 1.0, r1: 1.0}
    assert s["ringtop_memory_params_bytes"][r0] == 1000.0
    assert s["ringtop_memory_optimizer_bytes"][r1] == 3000.0
    assert s["ringtop_memory_rss_bytes"][r1] == 4001.0
    assert s["ringtop_memory_cuda_allocated_bytes"][r0] == 5000.0
    assert s["ringtop_memory_cuda_reserved_bytes"][r0] == 6000.0
    assert s["ringtop_comm_bytes_total"][rank_labels(0, "node-0", kind="all_reduce")] == 2_000_000.0
    assert s["ringtop_comm_bytes_total"][rank_labels(1, "node-1", kind="broadcast")] == 20.0
    assert s["ringtop_exposed_comm_seconds_total"][r0] == pytest.approx(0.04)
    assert s["ringtop_stalled"] == {r0: 0.0, r1: 1.0}
    assert s["ringtop_stall_seconds"][r1] == pytest.approx(3.5 + 2.0)
    assert s["ringtop_stall_seconds"][r0] == 0.0
    assert s["ringtop_verdicts"] == {RUN: 2.0}
    assert s["ringtop_run_info"] == {(("run_id", "r1"), ("strategy", "ddp"), ("world_size", "2")): 1.0}
    # goodput: the wall from the Hellos (T0) to the stall report (T0 + 5); rank 0's two steps of 100 ms;
    # rank 1 stalled from 1.5 s (5.0 - 3.5) on
    assert s["ringtop_goodput_wall_seconds_total"][RUN] == pytest.approx(5.0)
    assert s["ringtop_goodput_productive_seconds_total"][RUN] == pytest.approx(0.2, abs=1e-5)
    assert s["ringtop_goodput_ratio"][RUN] == pytest.approx(0.2 / 5.0, abs=1e-5)
    assert s["ringtop_goodput_lost_seconds_total"][(("cause", "stall"), *RUN)] == pytest.approx(3.5, abs=1e-5)

    m.observe(Stall(rank=1, ts=T0 + 6.0, state="recovered"))
    m.observe(Event(rank=0, ts=T0 + 6.0, kind="verdict_cleared", data={"rule": "straggler", "rank": 1}))
    m.observe(Bye(rank=1, ts=T0 + 7.0, step=2))
    s = samples(m)
    assert s["ringtop_stalled"][r1] == 0.0 and s["ringtop_stall_seconds"][r1] == 0.0
    assert s["ringtop_verdicts"] == {RUN: 1.0}
    assert s["ringtop_up"] == {r0: 1.0, r1: 0.0}
    m.observe(Event(rank=0, ts=T0 + 8.0, kind="verdicts_active", data={"verdicts": [
        {"rule": "a", "rank": 0}, {"rule": "b", "rank": 1}, {"rule": "c"}]}))
    assert samples(m)["ringtop_verdicts"] == {RUN: 3.0}


def test_a_rank_its_watcher_saw_die_is_down():
    """The watcher's RankExit (rank -1: its own word) reaches the exporter as a relay observer."""
    m = RunMetrics(clock=Clock())
    for rank in (0, 1, 2):
        m.observe(Hello(rank=rank, ts=T0, run_id="r1", world_size=3, host="node-0"))
    m.observe(Bye(rank=2, ts=T0 + 1, step=4, ok=True))
    m.observe(RankExit(ts=T0 + 2, of_rank=1, pid=4242, how="killed by SIGKILL", step=4))
    m.observe(RankExit(ts=T0 + 2, of_rank=2, pid=4243, how="killed by SIGKILL", step=4))  # after its Bye
    up = samples(m)["ringtop_up"]
    assert up == {rank_labels(0, "node-0"): 1.0, rank_labels(1, "node-0"): 0.0, rank_labels(2, "node-0"): 0.0}


def test_no_step_figures_before_a_rank_steps_and_no_goodput_before_the_first_step():
    m = RunMetrics()
    m.observe(hello(0))
    s = samples(m)
    assert s["ringtop_up"] == {rank_labels(0, "node-0"): 1.0}
    assert "ringtop_step" not in s and "ringtop_last_step_timestamp_seconds" not in s
    assert "ringtop_goodput_ratio" not in s


def test_hostile_but_valid_messages_neither_raise_nor_blow_up_the_label_sets():
    m = RunMetrics()
    m.observe(Hello(rank=0, ts=T0, run_id="r" * 5000, world_size=1, host="h\n\"\\" + "x" * 10_000))
    kinds = [CommStat(kind=f"kind-{i}-" + "k" * 500, bytes=1) for i in range(500)]
    m.observe(Step(rank=0, ts=T0 + 1, step=1, loss=None, step_ms=-5.0, exposed_comm_ms=-1e18, comm=kinds))
    for data in ({"rule": ["not", "a", "str"], "rank": {"a": 1}}, {"rule": "x", "rank": True}, {"verdicts": "no"},
                 {"verdicts": [1, None, {"rule": {}, "rank": []}]}):
        for kind in ("verdict", "verdict_cleared", "verdicts_active"):
            m.observe(Event(rank=0, ts=T0 + 2, kind=kind, data=data))
    m.observe(Stall(rank=0, ts=T0 + 3, state="stalled", running_s=-1e18))
    m.observe(Stall(rank=0, ts=T0 + 3, state="snapshot", request="x"))
    assert m.errors == 0
    s = samples(m)
    (host,) = {dict(k)["host"] for k in s["ringtop_up"]}
    (run_id,) = {dict(k)["run_id"] for k in s["ringtop_up"]}
    assert run_id == "r" * MAX_LABEL_CHARS
    assert len(host) == MAX_LABEL_CHARS and host.startswith("h\n\"\\")  # escaped on the way out, read back
    assert len(s["ringtop_comm_bytes_total"]) == MAX_KINDS_PER_RANK + 1  # the rest under `other`
    key = (("host", host), ("rank", "0"), ("run_id", run_id))
    assert s["ringtop_comm_bytes_total"][(("host", host), ("kind", "other"), ("rank", "0"), ("run_id", run_id))] == \
        500 - 32
    assert s["ringtop_exposed_comm_seconds_total"] == {key: 0.0}  # never goes down
    assert s["ringtop_stall_seconds"][key] >= 0.0


def test_the_endpoint_serves_the_exposition_and_frees_its_port_and_thread():
    port = free_tcp_port()
    exporter = MetricsExporter("127.0.0.1", port)
    exporter.start()
    try:
        exporter.observe(hello(0))
        exporter.observe(step(0, 7, 1.0))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["ringtop_step"].samples[0].value == 7.0
        assert "python_gc_objects_collected" not in families  # its own registry, not the global one
        taken = MetricsExporter("127.0.0.1", port)
        with pytest.raises(OSError, match=f"--metrics 127.0.0.1:{port}: cannot listen there"):
            taken.start()
    finally:
        thread = exporter._thread
        exporter.stop()
        exporter.stop()  # twice: a shutdown path may run after a failed start
    assert not thread.is_alive()
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", port))  # nothing listens there any more
    again = MetricsExporter("127.0.0.1", port)  # and the next run may (TIME_WAIT aside, as servers do)
    again.start()
    again.stop()


@pytest.mark.parametrize("argv, message", [
    (["--metrics", "9400"], "expected HOST:PORT"),
    (["--metrics", "127.0.0.1:0"], "expected HOST:PORT"),
    (["--metrics", "0.0.0.0:9400"], "reachable from other machines"),
    (["--metrics", "10.1.2.3:9400", "--allow-remote", "--insecure"], "only on an authenticated run"),
    (["--metrics", "127.0.0.1:9400", "--no-telemetry"], "drop --metrics"),
])
def test_metrics_option_refuses_what_it_must(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_agent_args(argv)


def test_metrics_option_takes_loopback_and_remote_on_an_authenticated_run():
    assert parse_agent_args(["--metrics", "127.0.0.1:9400"]).metrics == ("127.0.0.1", 9400)
    assert parse_agent_args(["--metrics", "[::1]:9400"]).metrics == ("::1", 9400)
    assert parse_agent_args(["--metrics", "0.0.0.0:9400", "--allow-remote"]).metrics == ("0.0.0.0", 9400)
    assert parse_agent_args([]).metrics is None


@pytest.mark.timeout(90)
def test_a_run_whose_metrics_port_is_taken_fails_at_start_and_says_why(launch_agents):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = launch_agents(0, "--steps", "3", "--metrics", f"127.0.0.1:{port}")
        code = run.wait(60)
    assert code != 0
    assert f"error: --metrics 127.0.0.1:{port}: cannot listen there: Address already in use" in run.output()
    assert "Traceback" not in run.output()


def test_tflops_per_rank_and_mfu_only_for_a_rank_whose_peak_is_known():
    metrics = RunMetrics(clock=Clock())
    metrics.observe(Hello(rank=0, ts=T0, run_id="r1", world_size=3, host="h", peak_tflops=989.0))
    metrics.observe(Hello(rank=1, ts=T0, run_id="r1", world_size=3, host="h", peak_source="unknown device X"))
    metrics.observe(hello(2))
    metrics.observe(Step(rank=0, ts=T0 + 1, step=1, loss=1.0, step_ms=100.0, tflops=400.0))
    metrics.observe(Step(rank=1, ts=T0 + 1, step=1, loss=1.0, step_ms=100.0, tflops=300.0))
    metrics.observe(Step(rank=2, ts=T0 + 1, step=1, loss=1.0, step_ms=100.0))  # FLOPs not known
    got = samples(metrics)
    assert got["ringtop_model_flops_per_second"] == {rank_labels(0, "h"): 400e12, rank_labels(1, "h"): 300e12}
    assert got["ringtop_mfu_ratio"] == {rank_labels(0, "h"): pytest.approx(400.0 / 989.0)}


def every_series() -> dict:
    """A scrape of a run that produced every series: name -> (type, samples)."""
    from prometheus_client import CollectorRegistry

    m = RunMetrics(clock=Clock())
    m.observe(Hello(rank=0, ts=T0, run_id="r1", world_size=2, host="node-0", strategy="ddp", peak_tflops=100.0))
    m.observe(hello(1))
    for n in (1, 2):
        for r in (0, 1):
            m.observe(Step(rank=r, ts=T0 + n, step=n, loss=1.0, step_ms=100.0, exposed_comm_ms=5.0, tflops=1.0,
                           mem=MemorySample(params_bytes=1), comm=[CommStat(kind="all_reduce", bytes=8)]))
    m.observe(Stall(rank=1, ts=T0 + 3, state="stalled", running_s=1.0))
    registry = CollectorRegistry()
    registry.register(m)
    return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}


def test_every_series_follows_prometheus_conventions_and_carries_the_run_id():
    from ringtop.agent.prometheus.names import SERIES, convention_problems

    assert {name: convention_problems(name, s) for name, s in SERIES.items() if convention_problems(name, s)} == {}
    families = every_series()
    # the parser names a counter's family without _total, its samples with it
    exposed = {f.name + ("_total" if f.type == "counter" else ""): f for f in families.values()}
    assert set(exposed) == set(SERIES)
    for name, family in exposed.items():
        assert family.type == SERIES[name].kind, name
        assert family.samples, name
        for sample in family.samples:
            assert sample.labels.get("run_id") == "r1", (name, sample.labels)
            assert ("rank" in sample.labels) is SERIES[name].per_rank, name


@pytest.mark.parametrize(("name", "kind", "problem"), [
    ("ringtop_step_ms", "gauge", "ms"),
    ("ringtop_comm_mb", "gauge", "mb"),
    ("ringtop_tflops", "gauge", "tflops"),
    ("ringtop_goodput_lost_seconds", "counter", "_total"),
    ("ringtop_up_total", "gauge", "_total"),
    ("step_seconds", "gauge", "namespace"),
])
def test_the_convention_check_bites(name, kind, problem):
    from ringtop.agent.prometheus.names import Series, convention_problems

    assert any(problem in p for p in convention_problems(name, Series(kind, "doc"))), name


def test_the_docs_list_every_series_and_no_other():
    import re
    from pathlib import Path

    from ringtop.agent.prometheus.names import SERIES

    section = (Path(__file__).resolve().parents[2] / "docs" / "prometheus.md").read_text()
    expanded = set()
    for head, braces, tail in re.findall(r"(ringtop_[a-z_]+)(?:\{([a-z_,]+)\}([a-z_]*))?", section):
        if braces and tail:  # ringtop_memory_{params,grads}_bytes: one name each
            expanded |= {f"{head}{part}{tail}" for part in braces.split(",")}
        else:  # ringtop_comm_bytes_total{kind}: its labels
            expanded.add(head)
    assert set(SERIES) <= expanded, set(SERIES) - expanded
    assert expanded <= set(SERIES), expanded - set(SERIES)  # a series the page names is in the table
