"""How long moving a full training state from rank 0 to every rank takes, three ways (diagnosis
for bench_switch.py: a live switch moves the state with `broadcast_object_list`).

2 gloo ranks on CPU; tiny-gpt of the given size with AdamW state (one step taken); rank 0's full
(model, optimizer) state dicts are sent to rank 1:

- pickled: `dist.broadcast_object_list([state])` (what agent/loop/switching.py does): pickles every
  storage (torch.save per storage), sends one byte tensor, unpickles;
- tensors: `dist.broadcast` of each tensor into a tensor of the same shape already on rank 1
  (the receiver knows the shapes: it builds the same model and optimizer);
- flat: the tensors packed into one flat fp32 buffer, one `dist.broadcast`, unpacked.

Alternating, `--rounds` times; prints the medians as JSON.

    python benchmarks/bench_state_broadcast.py [--model-size 125m] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def leaves(state, out):
    if hasattr(state, "dtype") and hasattr(state, "shape"):
        out.append(state)
    elif isinstance(state, dict):
        for v in state.values():
            leaves(v, out)
    elif isinstance(state, (list, tuple)):
        for v in state:
            leaves(v, out)
    return out


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    from ringtop.agent.models.model import build_tiny_gpt

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)  # rank 1's values differ: the receive must overwrite them
    model = build_tiny_gpt(args.model_size, rank)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 100, (1, 16))
    model(idx, idx).backward()
    opt.step()
    # full_state_dict without cpu_offload: every rank gets the state (with cpu_offload, as the agent
    # asks for it, only rank 0 does; the layout is the same)
    full = StateDictOptions(full_state_dict=True)
    state = (get_model_state_dict(model, options=full), get_optimizer_state_dict(model, opt, options=full))
    tensors = [t for t in leaves(state, []) if t.dim() > 0]
    unique = list({(t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)): t for t in tensors}.values())
    nbytes = sum(t.numel() * t.element_size() for t in unique)
    times: dict[str, list[float]] = {"pickled": [], "tensors": [], "flat": []}
    for r in range(args.rounds):
        order = ["pickled", "tensors", "flat"]
        if r % 2:
            order.reverse()
        for way in order:
            dist.barrier()
            t0 = time.perf_counter()
            if way == "pickled":
                box = [state if rank == 0 else None]
                dist.broadcast_object_list(box, src=0)
                got = box[0]
                del got
            elif way == "tensors":
                for t in unique:
                    dist.broadcast(t, src=0)
            else:
                flat = torch.cat([t.reshape(-1).float() for t in unique]) if rank == 0 else \
                    torch.empty(sum(t.numel() for t in unique), dtype=torch.float32)
                dist.broadcast(flat, src=0)
                if rank != 0:
                    offset = 0
                    for t in unique:
                        t.copy_(flat[offset:offset + t.numel()].view_as(t))
                        offset += t.numel()
                del flat
            dist.barrier()
            times[way].append(time.perf_counter() - t0)
    if rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        print(json.dumps({
            "benchmark": "full_state_broadcast", "model_size": args.model_size, "ranks": 2, "backend": "gloo",
            "state_bytes": nbytes, "tensors": len(unique), "rounds": args.rounds,
            "seconds_median": {k: round(v, 3) for k, v in med.items()},
            "GBps": {k: round(nbytes / v / 1e9, 3) for k, v in med.items()},
            "pickled_over_tensors": round(med["pickled"] / med["tensors"], 2),
            "raw_seconds": {k: [round(x, 3) for x in v] for k, v in times.items()},
        }, indent=2), flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-size", default="125m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__,
           "--worker", "--model-size", args.model_size, "--rounds", str(args.rounds)]
    sys.exit(subprocess.run(cmd, env=env, check=False).returncode)


if __name__ == "__main__":
    main()
