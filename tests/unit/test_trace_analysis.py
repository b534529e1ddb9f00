"""Exposed communication from torch.profiler Chrome traces: hand-made traces with intervals whose
union, overlap and exposure are worked out by hand, and a real 2-rank gloo DDP profile."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
import textwrap

import pytest
from conftest import run_worker_script

from ringtop.agent.control.trace_analysis import (
    analyze_trace,
    collective_kind,
    intersect,
    merge,
    subtract,
    total,
)


def X(name, ts, dur, tid=1, cat="cpu_op", pid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


# ---------------------------------------------------------------- interval arithmetic


def test_interval_helpers():
    assert merge([(5, 7), (0, 2), (1, 3), (3, 4), (9, 9)]) == [(0, 4), (5, 7)]
    assert total(merge([(0, 10), (2, 3), (20, 25)])) == 15
    assert intersect([(0, 10), (20, 30)], [(5, 25)]) == [(5, 10), (20, 25)]
    assert subtract([(0, 10), (20, 30)], [(2, 3), (5, 22), (29, 40)]) == [(0, 2), (3, 5), (22, 29)]
    assert subtract([(0, 10)], []) == [(0, 10)]
    assert subtract([(0, 10)], [(0, 10)]) == []


@pytest.mark.parametrize("name, args, kind", [
    ("gloo:all_reduce", None, "all_reduce"),
    ("gloo:all_gather", None, "all_gather"),
    ("c10d::_reduce_scatter_base_", None, "reduce_scatter"),
    ("c10d::_allgather_base_", None, "all_gather"),
    ("c10d::alltoall_base_", None, "all_to_all"),
    ("c10d::reduce_", None, "reduce"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", None, "all_reduce"),
    ("ncclKernel_ReduceScatter_RING_LL_Sum_float", None, "reduce_scatter"),
    ("ncclDevKernel_SendRecv", None, "send_recv"),
    ("nccl:broadcast", None, "broadcast"),
    ("record_param_comms", {"Collective name": "_allgather_base"}, "all_gather"),
    ("gloo:barrier", None, "barrier"),
    ("c10d::monitored_barrier_", None, "barrier"),
])
def test_collective_kind(name, args, kind):
    assert collective_kind(name, args) == kind


# ---------------------------------------------------------------- hand-made traces


def cpu_trace(with_steps: bool = True) -> dict:
    """Training thread tid 1, a gloo thread tid 2 (as torch 2.13 writes them on CPU)."""
    ev = [
        # step 5: forward, then a backward op that issues an all-reduce which runs on the gloo thread
        X("DistributedDataParallel.forward", 0, 30, cat="user_annotation"),  # an annotation: never compute
        X("aten::linear", 0, 30), X("aten::addmm", 5, 20),                    # nested: counted once
        X("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 40, 30),
        X("c10d::allreduce_", 50, 10),                                         # issue call inside it
        X("gloo:all_reduce", 52, 38, tid=2, cat="user_annotation"),
        X("aten::mm", 70, 10),
        # step 6: a broadcast whose gloo span runs past the step's end (200)
        X("aten::mm", 100, 30), X("c10d::broadcast_", 135, 6), X("aten::add", 141, 9),
        X("gloo:broadcast", 140, 70, tid=2, cat="user_annotation"),
        X("Optimizer.step#SGD.step", 141, 9, cat="user_annotation"),
        # after the profiled steps
        X("aten::foo", 250, 10), X("gloo:all_reduce", 255, 15, tid=2, cat="user_annotation"),
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "pt_gloo_runloop"}},
        {"ph": "i", "name": "instant", "pid": 1, "tid": 1, "ts": 5},
    ]
    if with_steps:
        ev += [X("ProfilerStep#5", 0, 100, cat="user_annotation"), X("ProfilerStep#6", 100, 100, cat="user_annotation")]
    return {"distributedInfo": {"backend": "gloo", "rank": 1, "world_size": 2}, "traceEvents": ev}


def test_cpu_trace_per_step_by_hand():
    a = analyze_trace(cpu_trace())
    assert a.timeline == "cpu" and a.rank == 1
    s5, s6 = a.steps
    # step 5: compute [0,30] + AccumulateGrad [40,70] minus its own c10d call [50,60] + mm [70,80]
    #         = [0,30] [40,50] [60,80] = 60; comm = c10d [50,60] u gloo [52,90] = [50,90] = 40;
    #         overlap [60,80] = 20 -> exposed 20, overlap 50 %
    assert (s5.step, s5.wall_ms) == (5, 0.1)
    assert close(s5.compute_ms, 0.060) and close(s5.comm_ms, 0.040) and close(s5.exposed_comm_ms, 0.020)
    assert close(s5.overlap_pct, 50.0)
    assert s5.per_kind == (("all_reduce", 1),)  # the gloo span, not also its c10d issue call
    # step 6: compute [100,130] + [141,150] = 39; comm [135,141] u [140,210] cut at 200 = [135,200] = 65;
    #         overlap [141,150] = 9 -> exposed 56
    assert close(s6.compute_ms, 0.039) and close(s6.comm_ms, 0.065) and close(s6.exposed_comm_ms, 0.056)
    assert close(s6.overlap_pct, 100 * 9 / 65)
    assert s6.per_kind == (("broadcast", 1),)
    # totals: the steps summed; the events after step 6 are left out
    assert close(a.comm_ms, 0.105) and close(a.compute_ms, 0.099) and close(a.exposed_comm_ms, 0.076)
    assert close(a.overlap_pct, 100 * 29 / 105) and close(a.wall_ms, 0.2)
    assert a.kind_counts() == {"all_reduce": 1, "broadcast": 1}


def test_cpu_trace_without_steps_is_one_window():
    a = analyze_trace(cpu_trace(with_steps=False))
    (only,) = a.steps
    assert only.step is None
    # compute 30+10+20+30+9+10 = 109; comm [50,90] [135,210] [255,270] = 130; overlap 20+9+5 = 34
    assert close(a.compute_ms, 0.109) and close(a.comm_ms, 0.130) and close(a.exposed_comm_ms, 0.096)
    assert close(a.wall_ms, 0.270)
    assert a.kind_counts() == {"all_reduce": 2, "broadcast": 1}


def test_host_spans_are_counted_once_when_there_is_no_execution_span():
    ev = [X("record_param_comms", 10, 10, **{"Collective name": "allreduce"}),
          X("c10d::allreduce_", 10, 9), X("aten::mm", 0, 10), X("aten::mm", 15, 20)]
    a = analyze_trace(ev)
    assert a.kind_counts() == {"all_reduce": 1}
    # comm [10,20] = 10; compute [0,10] + ([15,35] minus the same thread's comm [10,20]) = 10 + 15
    assert close(a.comm_ms, 0.010) and close(a.compute_ms, 0.025) and close(a.exposed_comm_ms, 0.010)
    assert a.overlap_pct == 0.0


def test_gpu_trace_kernels_belong_to_the_step_that_launched_them():
    def launch(ts, corr):
        return X("cudaLaunchKernel", ts, 2, cat="cuda_runtime", correlation=corr)

    def k(name, ts, dur, corr, stream=7):
        return X(name, ts, dur, tid=stream, pid=0, cat="kernel", correlation=corr)

    ev = [
        X("ProfilerStep#1", 0, 50, cat="user_annotation"), X("ProfilerStep#2", 50, 150, cat="user_annotation"),
        launch(5, 1), launch(10, 2), launch(20, 3), launch(60, 4), launch(70, 5),
        X("record_param_comms", 9, 3, **{"Collective name": "allreduce"}),  # host side: not device time
        X("aten::mm", 0, 40),                                                # host op: not GPU compute
        k("sm80_xmma_gemm", 30, 50, 1),
        k("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40, 80, 2, stream=20),
        k("sm80_xmma_gemm", 90, 10, 3),
        k("vectorized_elementwise_kernel", 130, 20, 4),
        k("ncclDevKernel_AllGather_RING_LL", 150, 20, 5, stream=20),
        X("Memcpy HtoD", 0, 200, pid=0, tid=7, cat="gpu_memcpy"),
        X("ProfilerStep#1", 30, 90, pid=0, tid=7, cat="gpu_user_annotation"),  # kineto's GPU-side mirror
    ]
    a = analyze_trace({"traceEvents": ev})
    assert a.timeline == "gpu"
    s1, s2 = a.steps
    # step 1: compute [30,80] [90,100] = 60; comm [40,120] = 80; overlap [40,80] + [90,100] = 50 -> exposed 30
    assert close(s1.compute_ms, 0.060) and close(s1.comm_ms, 0.080) and close(s1.exposed_comm_ms, 0.030)
    # step 2: compute [130,150]; comm [150,170] only touches it -> all exposed
    assert close(s2.compute_ms, 0.020) and close(s2.comm_ms, 0.020) and close(s2.exposed_comm_ms, 0.020)
    assert close(a.overlap_pct, 50.0)
    assert s1.per_kind == (("all_reduce", 1),) and s2.per_kind == (("all_gather", 1),)


def test_point_to_point_waits_are_kept_apart_from_exposed_comm():
    """A pipeline stage's recv lasts until the other stage has computed: bubble, not collective
    communication. Counted as comm it would make this step's exposed comm 120 instead of 30."""
    ev = [
        X("ProfilerStep#3", 0, 200, cat="user_annotation"),
        X("aten::mm", 0, 40),
        X("c10d::recv_", 40, 2), X("gloo:recv", 42, 78, cat="user_annotation"),  # waits for the other stage
        X("aten::mm", 120, 40),
        X("c10d::send", 160, 1), X("gloo:send", 161, 9, cat="user_annotation"),
        X("c10d::allreduce_", 170, 30), X("gloo:all_reduce", 172, 26, tid=2, cat="user_annotation"),  # the loss
    ]
    a = analyze_trace(ev)
    (s,) = a.steps
    # compute [0,40] [120,160] = 80; collective [170,200] = 30, none of it overlapped -> exposed 30;
    # p2p [40,120] u [160,170] = 90, none of it under compute or a collective -> p2p wait 90
    assert close(s.compute_ms, 0.080) and close(s.comm_ms, 0.030) and close(s.exposed_comm_ms, 0.030)
    assert close(s.p2p_ms, 0.090) and close(s.p2p_wait_ms, 0.090)
    assert close(a.exposed_comm_ms, 0.030) and close(a.p2p_wait_ms, 0.090) and close(a.overlap_pct, 0.0)
    assert a.kind_counts() == {"all_reduce": 1, "recv": 1, "send": 1}


def test_gpu_send_recv_kernels_are_p2p_and_only_their_uncovered_part_is_wait():
    def k(name, ts, dur, stream):
        return X(name, ts, dur, tid=stream, pid=0, cat="kernel")

    a = analyze_trace([k("ncclDevKernel_SendRecv", 0, 50, 20), k("sm90_gemm", 30, 10, 7),
                       k("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 60, 10, 20)])
    assert a.timeline == "gpu"
    # p2p [0,50] minus compute [30,40] = 40 of wait; the all-reduce [60,70] is all exposed
    assert close(a.p2p_ms, 0.050) and close(a.p2p_wait_ms, 0.040)
    assert close(a.comm_ms, 0.010) and close(a.exposed_comm_ms, 0.010)
    assert a.kind_counts() == {"all_reduce": 1, "send_recv": 1}


def test_paths_gzip_and_empty(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(json.dumps(cpu_trace()).encode()))
    assert analyze_trace(p) == analyze_trace(cpu_trace())
    (tmp_path / "t.json").write_text(json.dumps(cpu_trace()))
    assert analyze_trace(str(tmp_path / "t.json")) == analyze_trace(cpu_trace())
    empty = analyze_trace({"traceEvents": []})
    assert (empty.comm_ms, empty.exposed_comm_ms, empty.overlap_pct, empty.per_kind) == (0, 0, 0.0, ())
    with pytest.raises(ValueError):
        analyze_trace([], timeline="tpu")


def test_module_does_not_import_torch():
    code = "import sys, ringtop.agent.control.trace_analysis; assert 'torch' not in sys.modules"
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


# ---------------------------------------------------------------- a real profile

PROFILE_DDP = textwrap.dedent("""
    import datetime, sys
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.profiler import ProfilerActivity, profile, schedule

    out = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)]),
                                    bucket_cap_mb=0.3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 256)
    export = lambda p: p.export_chrome_trace(f"{out}/rank-{rank}.json")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, on_trace_ready=export,
                 schedule=schedule(wait=0, warmup=1, active=3, repeat=1)) as prof:
        for _ in range(4):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            prof.step()
    from ringtop.agent.distributed import exit_rank
    exit_rank(0)  # destroys the group; see its docstring for why not a plain exit
""")


@pytest.mark.timeout(120)
def test_real_two_rank_ddp_profile(tmp_path):
    script = tmp_path / "profile_ddp.py"
    script.write_text(PROFILE_DDP)
    run_worker_script(script, [], tmp_path, nproc=2, timeout_s=100)
    for rank in (0, 1):
        path = tmp_path / f"rank-{rank}.json"
        a = analyze_trace(path)
        assert a.timeline == "cpu" and a.rank == rank
        assert len(a.steps) == 3 and [s.step for s in a.steps] == sorted(s.step for s in a.steps)
        assert a.comm_ms > 0 and a.compute_ms > 0
        assert 0 <= a.exposed_comm_ms <= a.comm_ms + 1e-9
        assert 0 <= a.overlap_pct <= 100
        for s in a.steps:
            assert 0 <= s.exposed_comm_ms <= s.comm_ms + 1e-9 <= s.wall_ms + 1e-6
            assert s.compute_ms <= s.wall_ms + 1e-6
        # the all-reduces counted are the gloo spans that start inside the profiled steps
        events = json.loads(path.read_text())["traceEvents"]
        windows = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")]
        spans = [e for e in events if e.get("ph") == "X" and e["name"] == "gloo:all_reduce"]
        assert spans, "gloo runs collectives as gloo:* spans"
        in_steps = sum(any(s <= e["ts"] < t for s, t in windows) for e in spans)
        assert a.kind_counts()["all_reduce"] == in_steps >= 3
