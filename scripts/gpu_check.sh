#!/usr/bin/env bash
# Exercises ringtop's GPU-only paths on one GPU in under 5 minutes and writes the findings to
# ${OUT:-.}/gpu_check.txt: NCCL process group, CUDA events for phase timing (no added sync),
# CUDA memory stats in the step records beside the cost model's prediction for DDP, FSDP2
# (full, grad-op, bf16) and DeepSpeed ZeRO-1/2/3 (when DeepSpeed imports), NVML samples, and the
# device timing of NCCL collectives (CUDA events read lazily, held against NCCL's own timing with
# TORCH_NCCL_ENABLE_TIMING=1 and Work._get_duration(); per-kind busy ms beside the step time in the
# agent runs), and on NCCL the hang tools: a rank hung at a step is reported by its stall watch,
# `ctl stacks` answers without the training thread, `ctl dump` writes the collective ledger and
# PyTorch's NCCL Flight Recorder buffer (read back with fr_trace's loader), `ctl stop` ends the stuck
# run; per agent run the device's NVML name, its dense peak from metrics/rules/peaks.py, TFLOP/s and
# MFU. On a machine without a GPU it says so and exits 0.
set -u
cd "$(dirname "$0")/.."
out_dir=${OUT:-.}
report="$out_dir/gpu_check.txt"
work=$(mktemp -d)
py=${PYTHON:-python3}
export PYTHONPATH="${PYTHONPATH:-}:$work/site"
exec > >(tee "$report") 2>&1

echo "# ringtop gpu_check $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
if ! $py -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "SKIP: torch sees no CUDA device here (nothing GPU-only to check)."
  exit 0
fi
$py -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
# ringtop itself, without pip: map the root folders into a ringtop namespace the way the wheel does.
mkdir -p "$work/site/ringtop"
for room in protocol agent strategies tui cli metrics; do ln -s "$PWD/$room" "$work/site/ringtop/$room"; done
missing=$($py - <<'PY'
import importlib
print(" ".join(m for m in ("msgspec", "zmq", "psutil", "pynvml") if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ] && [ -d wheels ]; then
  $py -m pip install --no-index --find-links wheels --target "$work/site" $missing >/dev/null 2>&1 || true
fi

status=0
run_agent() {  # name, args...
  local name=$1; shift
  echo; echo "## $name"
  timeout 120 $py -m torch.distributed.run --standalone --nproc_per_node=1 -m ringtop.agent \
      --device cuda --log-dir "$work/$name" --checkpoint-dir "$work/$name-ckpt" "$@" \
      > "$work/$name.out" 2>&1
  local rc=$?
  echo "exit code: $rc"; [ $rc -eq 0 ] || { tail -30 "$work/$name.out"; status=1; }
  $py - "$work/$name" <<'PY'
import sys, pathlib
from ringtop.protocol import Hello, Sample, Step, from_json_line
msgs = [from_json_line(l) for l in (pathlib.Path(sys.argv[1]) / "rank-0.jsonl").read_bytes().splitlines()]
hello = next(m for m in msgs if isinstance(m, Hello))
steps = [m for m in msgs if isinstance(m, Step)]
samples = [m for m in msgs if isinstance(m, Sample) and m.gpu]
print(f"backend={hello.backend} device={hello.device} params={hello.param_count} mem_total={hello.device_mem_total_bytes}")
s = steps[-1]
p = hello.prediction
print(f"strategy={hello.strategy} {hello.strategy_options} dtype={hello.dtype}")
print(f"predicted params={p.params_bytes} grads={p.grads_bytes} optim={p.optimizer_bytes} comm={p.comm_payload_bytes}")
print(f"steps={len(steps)} last: step_ms={s.step_ms:.2f} fwd={s.forward_ms:.2f} bwd={s.backward_ms:.2f} "
      f"opt={s.optimizer_ms:.2f} loss={s.loss}")
print(f"cuda allocated={s.mem.cuda_allocated_bytes} reserved={s.mem.cuda_reserved_bytes} peak={s.mem.cuda_peak_bytes} "
      f"params={s.mem.params_bytes} grads={s.mem.grads_bytes} optim={s.mem.optimizer_bytes}")
print(f"comm={[(c.kind, c.count, c.bytes) for c in s.comm]}")
from ringtop.metrics.costs.flops import mfu
print(f"accelerator={hello.accelerator!r} peak={hello.peak_tflops} TFLOP/s ({hello.peak_source or 'unknown'}) "
      f"flops/token={hello.flops_per_token:.3g} ({hello.flops_source}) last tflops={s.tflops:.2f} "
      f"mfu={mfu(s.tflops, hello.peak_tflops)}")
# collective time from the CUDA-event path (steps resolve a step or two late: the host runs ahead)
tail = steps[-10:]
mean = lambda xs: sum(xs) / max(len(xs), 1)  # noqa: E731
kinds = sorted({c.kind for t in tail for c in t.comm})
per_kind = {k: (mean([sum(c.count for c in t.comm if c.kind == k) for t in tail]),
                mean([sum(c.busy_ms for c in t.comm if c.kind == k) for t in tail])) for k in kinds}
step_ms, busy_ms, blocked_ms = (mean([getattr(t, f) for t in tail]) for f in ("step_ms", "comm_busy_ms", "exposed_comm_ms"))
print(f"last {len(tail)} steps, mean: step_ms={step_ms:.2f} comm_busy_ms={busy_ms:.3f} exposed(exposed_comm_ms)={blocked_ms:.3f} "
      + " ".join(f"{k}: {n:.1f}/step {ms:.3f} ms busy" for k, (n, ms) in per_kind.items()))
plausible = all(ms > 0 for n, ms in per_kind.values() if n > 0) and busy_ms <= step_ms and blocked_ms <= busy_ms + 1e-6
print("comm timing plausibility: " + ("ok (busy > 0 per kind with collectives, exposed <= busy <= step)" if plausible
      else "CHECK (a kind with collectives but 0 ms, or busy above the step time): read the numbers above"))
print(f"nvml samples={len(samples)}" + (f" last={samples[-1].gpu}" if samples else " (none: NVML missing?)"))
assert hello.backend == "nccl" and s.mem.cuda_allocated_bytes > 0 and s.forward_ms > 0
PY
  [ $? -eq 0 ] || status=1
}

nccl_timing() {  # CUDA-event timing of NCCL collectives against NCCL's own (Work._get_duration)
  echo; echo "## nccl collective timing: CUDA events (ringtop) vs TORCH_NCCL_ENABLE_TIMING (NCCL)"
  cat > "$work/nccl_timing.py" <<'PY'
import datetime, time
import torch, torch.distributed as dist
from ringtop.strategies import collective_hooks
from ringtop.agent.instruments.comm_tracer import CommTracer

torch.cuda.set_device(0)
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda", 0))
n = dist.get_world_size()
big = torch.randn(64 << 20, device="cuda")                          # 256 MiB
gathered, shard = torch.empty_like(big), torch.randn(big.numel() // n, device="cuda")
scattered = torch.empty(big.numel() // n, device="cuda")
a = torch.randn(4096, 4096, device="cuda")
ops = {"all_reduce": lambda: dist.all_reduce(big, async_op=True),
       "all_gather": lambda: dist.all_gather_into_tensor(gathered, shard, async_op=True),
       "reduce_scatter": lambda: dist.reduce_scatter_tensor(scattered, big, async_op=True)}
for op in ops.values():                                               # warm-up, not traced
    op().wait()
torch.cuda.synchronize()
bad = 0
for kind, op in ops.items():
    tracer, works, issue_s = CommTracer(), [], 0.0
    with collective_hooks.active(tracer):
        for _ in range(8):
            a @ a                                                     # compute queued before each
            t0 = time.perf_counter()
            works.append(op())
            issue_s += time.perf_counter() - t0
        for w in works:
            w.wait()
    early = tracer.drain()                                            # the tracer never synchronises
    torch.cuda.synchronize()                                          # only this check waits for the device
    late = tracer.drain()
    got = [k for s in (early, late) for k in s.kinds if k.kind == kind]
    count, ours = sum(k.count for k in got), sum(k.busy_ms for k in got)
    nccl = sum(w._get_duration() for w in works)
    agree = abs(ours - nccl) <= max(0.05 * count, 0.25 * nccl)
    print(f"{kind:15s} n={count} ringtop(CUDA events)={ours:8.3f} ms  NCCL(_get_duration)={nccl:8.3f} ms  "
          f"ratio={ours / nccl if nccl else float('nan'):5.2f}  host issue only={issue_s * 1e3:7.3f} ms  "
          f"pending right after issue={early.pending}/{count}  late pending={late.pending}  "
          f"{'agree' if agree else 'DIFFER'}")
    bad += count != len(works) or late.pending != 0 or ours <= 0
print("nccl timing:", "ok" if not bad else "FAIL (a collective missing, never resolved, or 0 ms)")
dist.destroy_process_group()
raise SystemExit(1 if bad else 0)
PY
  TORCH_NCCL_ENABLE_TIMING=1 timeout 120 $py -m torch.distributed.run --standalone --nproc_per_node=1 \
      "$work/nccl_timing.py" > "$work/nccl_timing.out" 2>&1
  local rc=$?
  grep -v -e Warning -e "return func" "$work/nccl_timing.out" | tail -12
  echo "exit code: $rc"; [ $rc -eq 0 ] || status=1
}

hang_tools() {  # stall watch, ctl stacks / dump / stop on NCCL, one rank hung at step 8
  echo; echo "## hang tools on NCCL: stall report, ctl stacks, ctl dump (Flight Recorder), ctl stop"
  local run_id="gpucheck$$" logs="$work/hang"
  timeout 150 $py -m torch.distributed.run --standalone --nproc_per_node=1 -m ringtop.agent --device cuda \
      --steps 0 --inject-hang 0:8 --stall-floor 2 --run-id "$run_id" --log-dir "$logs" \
      --checkpoint-dir "$work/hang-ckpt" > "$work/hang.out" 2>&1 &
  local pid=$!
  $py - "$logs" "$run_id" <<'PY'
import sys, time, pathlib, pickle
from ringtop.protocol import Stall, read_log
from ringtop.cli.ctl import send_command
from ringtop.protocol import connection_file
logs, run_id = pathlib.Path(sys.argv[1]), sys.argv[2]
deadline = time.monotonic() + 120
stall = None
while time.monotonic() < deadline and stall is None:
    time.sleep(0.5)
    if (logs / "rank-0.jsonl").exists():
        stall = next((m for m in read_log(logs / "rank-0.jsonl") if isinstance(m, Stall)), None)
assert stall is not None, "no stall report within 120 s"
print(f"stall report: step={stall.step} phase={stall.phase} running_s={stall.running_s:.1f} where={stall.where}")
info = connection_file.read(connection_file.file_for(run_id))
stacks = list(send_command(info.control, "stacks", {}, 30, info.keys))[-1]
print("ctl stacks:", stacks.status, [(g["label"], g["phase"], g["where"]) for g in stacks.result.get("groups", [])])
dump = list(send_command(info.control, "dump", {}, 30, info.keys))[-1]
print("ctl dump:", dump.status, dump.result)
trace = pathlib.Path(dump.result["directory"]) / "nccl_trace_rank_0"
deadline = time.monotonic() + 30
while not trace.exists() and time.monotonic() < deadline:
    time.sleep(0.2)
data = pickle.loads(trace.read_bytes())
entries = data.get("entries", [])
print(f"flight recorder: {trace} {trace.stat().st_size} bytes, version={data.get('version')}, entries={len(entries)}, "
      f"last={entries[-1].get('profiling_name') if entries else None}")
stop = list(send_command(info.control, "stop", {"reason": "gpu_check"}, 30, info.keys))[-1]
print("ctl stop:", stop.status, stop.result)
assert stacks.status == "done" and dump.status == "done" and entries and stop.status == "done"
PY
  local rc=$?
  wait $pid; echo "launcher exit code: $? (non-zero: the rank was stopped while stuck, exit code 3)"
  grep -h '"type":"bye"' "$logs"/rank-0.jsonl | cut -c1-300
  $py -m torch.distributed.flight_recorder.fr_trace --help > /dev/null 2>&1 \
      && echo "fr_trace analyser present: python -m torch.distributed.flight_recorder.fr_trace <dump dir>" \
      || echo "fr_trace analyser: not found in this torch"
  echo "exit code: $rc"; [ $rc -eq 0 ] || { tail -30 "$work/hang.out"; status=1; }
}

nccl_timing
hang_tools
run_agent ddp-10m --steps 40 --model-size 10m --batch-size 16 --seq-len 256
run_agent ddp-125m --steps 20 --model-size 125m --batch-size 8 --seq-len 512
run_agent fsdp-full --strategy fsdp --fsdp-sharding full --steps 20 --model-size 125m --batch-size 8 --seq-len 512
run_agent fsdp-grad-op-bf16 --strategy fsdp --fsdp-sharding grad-op --dtype bf16 --steps 20 --model-size 125m --batch-size 8 --seq-len 512
if $py -c "import deepspeed" >/dev/null 2>&1; then
  for stage in 1 2 3; do
    run_agent zero$stage --strategy zero$stage --steps 20 --model-size 125m --batch-size 8 --seq-len 512
  done
else
  echo; echo "## zero1/2/3: SKIP (DeepSpeed does not import here)"
fi
if $py -c "import transformers" >/dev/null 2>&1; then  # an hf architecture built on the GPU (not in host memory)
  run_agent hf-llama-125m-fsdp-bf16 --model hf:llama-125m --strategy fsdp --dtype bf16 --steps 10 --batch-size 4 --seq-len 512
else
  echo; echo "## hf-llama-125m: SKIP (transformers does not import here)"
fi
echo; echo "result: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
rm -rf "$work"
exit $status
