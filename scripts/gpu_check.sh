#!/usr/bin/env bash
# Exercises ringtop's GPU-only paths on one GPU in under 5 minutes and writes the findings to
# ${OUT:-.}/gpu_check.txt: NCCL process group, CUDA events for phase timing (no added sync),
# CUDA memory stats in the step records beside the cost model's prediction for DDP, FSDP2
# (full, grad-op, bf16) and DeepSpeed ZeRO-1/2/3 (when DeepSpeed imports), NVML samples.
# On a machine without a GPU it says so and exits 0.
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
for room in protocol agent strategies tui cli; do ln -s "$PWD/$room" "$work/site/ringtop/$room"; done
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
print(f"nvml samples={len(samples)}" + (f" last={samples[-1].gpu}" if samples else " (none: NVML missing?)"))
assert hello.backend == "nccl" and s.mem.cuda_allocated_bytes > 0 and s.forward_ms > 0
PY
  [ $? -eq 0 ] || status=1
}

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
echo; echo "result: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
rm -rf "$work"
exit $status
