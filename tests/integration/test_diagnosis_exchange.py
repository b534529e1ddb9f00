"""The diagnosis exchange that scales (agent/health/diagnosis_exchange.py, metrics/sketch.py): sketches
whose medians are within their bucket's half-width, and real gloo ranks reaching the verdicts the
exact rules reach from every rank's window."""

from __future__ import annotations

import json
import math
import statistics
import textwrap

import pytest
from conftest import run_worker_script

from ringtop.agent.health.diagnosis_exchange import MS, SHARE  # noqa: E402
from ringtop.metrics.rules.diagnosis import RankWindow, RunContext, diagnose
from ringtop.metrics.sketch import Buckets, median

HALF_WIDTH = 1.05 ** 0.5 - 1
"""A value read back as its bucket's geometric middle is off by at most half the bucket's ratio."""


@pytest.mark.parametrize("values", [[50.0], [50.0, 200.0], [1.0, 2.0, 3.0, 1000.0], [0.5] * 7 + [300.0] * 2,
                                    [i * 1.37 + 0.2 for i in range(101)]])
def test_a_sketch_median_is_within_the_bucket_half_width(values):
    got = median(MS, MS.counts(values))
    true = statistics.median(values)
    lows = sorted(values)[(len(values) - 1) // 2], sorted(values)[len(values) // 2]
    assert abs(got - true) <= HALF_WIDTH * max(lows) + 1e-12


def test_leaving_one_value_out_is_the_others_median():
    counts = MS.counts([50.0, 50.0, 200.0])
    assert median(MS, counts, without=200.0) == pytest.approx(50.0, rel=HALF_WIDTH)
    assert median(MS, counts, without=50.0) == pytest.approx(125.0, rel=HALF_WIDTH)
    assert math.isnan(median(MS, MS.counts([]))) and math.isnan(median(MS, MS.counts([3.0]), without=3.0))


def test_out_of_range_and_hostile_values_land_in_the_end_buckets():
    assert MS.index(-5.0) == MS.index(0.0) == MS.index(math.nan) == 0
    assert MS.index(1e9) == MS.index(math.inf) == MS.count - 1
    assert SHARE.index(0.551) == SHARE.index(0.5525) and median(SHARE, SHARE.counts([0.55, 0.6])) == \
        pytest.approx(0.575, abs=1 / 200)
    with pytest.raises(ValueError):
        Buckets(0.0, 1.0, 10)  # log buckets need low > 0


WINDOWS = {  # rank -> (step, data, blocked, busy, bytes, reserved, retries): rank 2 computes 4x the
    # others (a straggler), rank 1 loads input 30 % of its step, rank 0 retried cudaMalloc
    0: (201.0, 1.0, 150.0, 150.0, 4e6, 1e9, 2.0),
    1: (201.0, 60.0, 90.0, 150.0, 4e6, 1e9, 0.0),
    2: (201.0, 1.0, 0.0, 150.0, 4e6, 1e9, 0.0),
}
RUN = dict(strategy="ddp", world_size=3, param_count=1_000_000, device_capacity_bytes=80e9)

EXCHANGE = textwrap.dedent("""
    import datetime, json, sys
    import torch.distributed as dist
    from ringtop.agent.health.diagnosis_exchange import Diagnostician
    from ringtop.metrics.rules.diagnosis import RunContext

    windows, run, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    events = []
    d = Diagnostician(rank, dist.get_world_size(), dist.group.WORLD, RunContext(**run),
                      lambda *e: events.append(e))
    for _ in range(3):
        d.record(*windows[str(rank)])
    verdicts = d.run_rules()
    with open(f"{out}/rank-{rank}.json", "w") as f:
        json.dump({"verdicts": [[v.rule, v.rank, v.evidence] for v in verdicts], "bytes": d.bytes_sent}, f)
    from ringtop.agent.distributed import exit_rank
    exit_rank(0)
""")


@pytest.mark.timeout(120)
def test_three_gloo_ranks_reach_the_exact_rules_verdicts_from_sketches(tmp_path):
    script = tmp_path / "exchange.py"
    script.write_text(EXCHANGE)
    results = run_worker_script(script, [json.dumps(WINDOWS), json.dumps(RUN)], tmp_path, nproc=3, timeout_s=100)
    exact = diagnose([RankWindow(r, *w) for r, w in WINDOWS.items()], RunContext(**RUN))
    got = results[0]["verdicts"]
    assert sorted((rule, rank) for rule, rank, _ in got) == sorted((v.rule, v.rank) for v in exact) == \
        [("input_stall", 1), ("memory_pressure", 0), ("straggler", 2)]
    straggler = next(e for rule, _, e in got if rule == "straggler")
    assert straggler["compute_ms"] == 200.0, "the straggler's own window travels exactly"
    assert straggler["others_compute_ms"] == pytest.approx(50.5, rel=HALF_WIDTH), "the others' median, sketched"
    assert all(r["verdicts"] == [] for r in results[1:]), "only rank 0 reads the rules"
    assert len({r["bytes"] for r in results}) == 1, "every rank sends the same, whatever its rank"
