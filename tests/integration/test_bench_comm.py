"""`ringtop bench comm` as a user runs it: a real 2-rank gloo sweep through the CLI, its JSON, the
nccl-tests busbw factors, and its time held against a plain torch.distributed timing loop run in
the same test; bad inputs exit 2 before any rank starts; the front end never imports torch."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest
from conftest import agent_env

from ringtop.cli.bench import BenchError, parse_bytes, parse_ops, render_table

NPROC = 2
MID_BYTES = 4 << 20  # the size compared with the plain loop
ITERS, WARMUP = 10, 3
FACTORS_N2 = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0}  # nccl-tests, n = 2

# Independent of ringtop: times MID_BYTES of float32 all_reduce the plain way, several rounds.
PLAIN_LOOP = textwrap.dedent("""
    import datetime, json, sys, time
    import torch, torch.distributed as dist

    size_bytes, iters, warmup, rounds, out = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                              int(sys.argv[4]), sys.argv[5])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    x = torch.ones(size_bytes // 4, dtype=torch.float32)
    for _ in range(warmup):
        dist.all_reduce(x)
    means = []
    for _ in range(rounds):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        means.append((time.perf_counter() - t0) / iters)
    worst = torch.tensor(means, dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"time_us": [s * 1e6 for s in worst.tolist()]}, f)
    from ringtop.agent.distributed import exit_rank
    exit_rank(0)  # destroys the group; see its docstring for why not a plain exit
""")


def ringtop(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringtop.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=agent_env())


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[dict, dict]:
    """One real sweep, 1K..4M, all four ops: (stdout JSON, --out file JSON)."""
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    res = ringtop("bench", "comm", "--nproc", str(NPROC), "--min-bytes", "1K", "--max-bytes", "4M",
                  "--iters", str(ITERS), "--warmup", str(WARMUP), "--backend", "gloo", "--json", "--out", str(out),
                  timeout=90)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout), json.loads(out.read_text())


@pytest.mark.timeout(120)
def test_json_shape_sizes_and_counts(sweep):
    printed, written = sweep
    assert printed == written
    assert written["backend"] == "gloo" and written["world_size"] == NPROC
    assert list(written["ops"]) == ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
    sizes = [1024 << k for k in range(13)]  # 1K, 2K, ..., 4M
    for op, rows in written["ops"].items():
        assert [r["size_bytes"] for r in rows] == sizes, op
        for r in rows:
            assert set(r) >= {"size_bytes", "count", "time_us", "algbw_gbps", "busbw_gbps"}
            assert r["iters"] == ITERS and r["time_us"] > 0
            # nccl-tests' count: the whole tensor, or each rank's shard for all_gather / reduce_scatter
            shard = op in ("all_gather", "reduce_scatter")
            assert r["count"] == r["size_bytes"] // 4 // (NPROC if shard else 1)
        assert written["peak_busbw_gbps"][op] == max(r["busbw_gbps"] for r in rows)


@pytest.mark.timeout(120)
def test_busbw_is_algbw_times_the_nccl_tests_factor_and_algbw_is_size_over_time(sweep):
    _, result = sweep
    for op, rows in result["ops"].items():
        for r in rows:
            assert math.isclose(r["busbw_gbps"] / r["algbw_gbps"], FACTORS_N2[op], rel_tol=1e-9), (op, r)
            # GB/s = bytes / seconds / 1e9, with time in microseconds
            assert math.isclose(r["algbw_gbps"], r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9, rel_tol=1e-9)


@pytest.mark.timeout(120)
def test_time_agrees_with_a_plain_torch_distributed_loop(sweep, tmp_path):
    _, result = sweep
    script, out = tmp_path / "plain_loop.py", tmp_path / "plain.json"
    script.write_text(PLAIN_LOOP)
    rounds = 3
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={NPROC}",
                          str(script), str(MID_BYTES), str(ITERS), str(WARMUP), str(rounds), str(out)],
                         capture_output=True, text=True, timeout=90, env=agent_env())
    assert res.returncode == 0, res.stderr[-3000:]
    plain_us = json.loads(out.read_text())["time_us"]
    bench_us = next(r["time_us"] for r in result["ops"]["all_reduce"] if r["size_bytes"] == MID_BYTES)
    # Two CPU ranks on a shared machine are noisy: allow 4x either way around the plain rounds. A unit
    # slip (ms for us, 1000x) or a per-call time taken over the whole loop (10x) would still fail.
    lo, hi = min(plain_us) / 4, max(plain_us) * 4
    assert lo <= bench_us <= hi, f"bench {bench_us:.0f} us vs plain rounds {[round(t) for t in plain_us]} us"


@pytest.mark.parametrize(
    "args, says",
    [
        (["--nproc", "0"], "--nproc must be >= 1"),
        (["--nproc", "2", "--ops", "all_reduce,alltoallz"], "unknown op 'alltoallz'"),
        (["--nproc", "2", "--min-bytes", "1M", "--max-bytes", "1K"], "is larger than --max-bytes"),
        (["--nproc", "2", "--min-bytes", "1.5.K"], "expected a size like"),
        (["--nproc", "2", "--min-bytes", "4"], "one float32 element per rank"),
        (["--nproc", "2", "--iters", "0"], "--iters must be >= 1"),
        (["--nproc", "2", "--warmup", "-1"], "--warmup must be >= 0"),
    ],
)
def test_bad_inputs_exit_2_with_a_clear_message(args, says):
    res = ringtop("bench", "comm", *args)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert says in res.stderr
    assert "Traceback" not in res.stderr


def test_unknown_benchmark_exits_2():
    res = ringtop("bench", "disk")
    assert res.returncode == 2 and "ringtop bench comm" in res.stderr


def test_parsing_sizes_and_ops():
    assert [parse_bytes(s) for s in ("1024", "1K", "1k", "4M", "1G", "2KiB", "3MB")] == [
        1024, 1024, 1024, 4 << 20, 1 << 30, 2048, 3 << 20]
    for bad in ("", "K", "-1K", "0", "0.3K"):
        with pytest.raises(BenchError):
            parse_bytes(bad)
    assert parse_ops("all") == ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
    assert parse_ops("allreduce, all-gather,all_reduce") == ["all_reduce", "all_gather"]
    with pytest.raises(BenchError):
        parse_ops(",")


def test_table_has_a_block_per_op_with_the_numbers():
    result = {"backend": "gloo", "world_size": 2, "device": "cpu", "dtype": "float32",
              "ops": {"all_reduce": [{"size_bytes": 1 << 20, "count": 1 << 18, "time_us": 1000.0, "iters": 20,
                                      "algbw_gbps": 1.048576, "busbw_gbps": 1.048576}],
                      "all_gather": [{"size_bytes": 1 << 20, "count": 1 << 17, "time_us": 500.0, "iters": 20,
                                      "algbw_gbps": 2.097152, "busbw_gbps": 1.048576}]},
              "peak_busbw_gbps": {"all_reduce": 1.048576, "all_gather": 1.048576}}
    table = render_table(result)
    assert "# all_reduce   busbw factor 2(n-1)/n = 1" in table
    assert "# all_gather   busbw factor (n-1)/n = 0.5" in table
    rows = [line.split() for line in table.splitlines() if not line.startswith("#")]
    assert rows == [["1048576", "262144", "20", "1000.0", "1.05", "1.05"],
                    ["1048576", "131072", "20", "500.0", "2.10", "1.05"]]


def test_front_end_does_not_import_torch():
    code = "import sys, ringtop.cli.main, ringtop.cli.bench; assert 'torch' not in sys.modules, 'torch imported'"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


def test_help_exits_0():
    res = ringtop("bench", "comm", "--help")
    assert res.returncode == 0 and "--max-bytes" in res.stdout
