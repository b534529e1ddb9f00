"""Under torchrun: one process trains the same DDP or FSDP strategy with two recorders alternated in
blocks: the tracer with its ledger (seq per group, shape digests, the ring) and the tracer as it
was without it. Rank 0 writes each arm's step times (ms) to --out."""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

from ringtop.agent.instruments.comm_tracer import CommTracer
from ringtop.agent.models.data import global_batch
from ringtop.agent.models.model import MODEL_SIZES, build_tiny_gpt
from ringtop.strategies import collective_hooks
from ringtop.strategies.base import DistContext, TrainSettings
from ringtop.strategies.registry import build_strategy


class BareTracer(CommTracer):
    """`begin` as before the ledger: no seq, no ledger entry, no per-step digest."""

    def begin(self, kind, nbytes, group_size, group="world", shapes=""):
        handle = next(self._ids)
        with self._lock:
            self._open[handle] = _Open(kind, nbytes, group_size, time.perf_counter_ns())
        return handle


class _Open:
    __slots__ = ("kind", "nbytes", "group_size", "issued_ns", "group", "seq", "done_ns")

    def __init__(self, kind, nbytes, group_size, issued_ns):
        self.kind, self.nbytes, self.group_size, self.issued_ns = kind, nbytes, group_size, issued_ns
        self.group, self.seq, self.done_ns = "world", 0, 0


class Switchable:
    """One recorder attached once (DDP takes a comm hook once), handing each call to the arm in turn:
    both arms pay this indirection alike."""

    def __init__(self, target):
        self.target = target

    def __getattr__(self, name):
        return getattr(self.target, name)


class NoPhases:
    def mark(self, phase):
        pass


def per_call_us(digest, name, n: int = 20000, repeats: int = 7) -> dict[str, float]:
    """A traced collective's bookkeeping alone (begin + end, plus the shapes digest and group name
    the hooks compute), ledger against bare, alternated; the median over repeats, in µs per call."""
    payload = torch.empty(1 << 16)
    best: dict[str, list[float]] = {"ledger": [], "bare": []}
    for r in range(repeats):
        for arm in (("ledger", "bare") if r % 2 == 0 else ("bare", "ledger")):
            tracer = CommTracer() if arm == "ledger" else BareTracer()
            t0 = time.perf_counter()
            for _ in range(n):
                shapes = digest(payload) if arm == "ledger" else ""
                group = name(None) if arm == "ledger" else "world"
                tracer.end(tracer.begin("all_reduce", 1 << 18, 2, group, shapes))
            best[arm].append((time.perf_counter() - t0) / n * 1e6)
            tracer.drain()
    return {arm: sorted(v)[len(v) // 2] for arm, v in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ctx = DistContext(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"), backend="gloo")
    collective_hooks.install()
    options = {"sharding": "full"} if args.strategy == "fsdp" else {}
    strategy = build_strategy(args.strategy, options, ctx.device)
    strategy.setup(build_tiny_gpt("1m", 0), lambda p: torch.optim.AdamW(p, lr=1e-3), ctx,
                   TrainSettings(batch_size=args.batch_size))
    vocab = MODEL_SIZES["1m"].vocab_size
    real_digest, real_name = collective_hooks.shapes_digest, collective_hooks.group_name
    arms = {"ledger": CommTracer(), "bare": BareTracer()}
    recorder = Switchable(arms["ledger"])
    strategy.attach_comm_recorder(recorder)
    times: dict[str, list[float]] = {name: [] for name in arms}
    rounds: list[dict[str, float]] = []
    step = 0
    for r in range(args.rounds + 1):  # round 0 warms up
        order = ["ledger", "bare"] if r % 2 == 0 else ["bare", "ledger"]
        medians = {}
        for name in order:
            if name == "bare":
                collective_hooks.shapes_digest, collective_hooks.group_name = (lambda t: ""), (lambda g: "world")
            else:
                collective_hooks.shapes_digest, collective_hooks.group_name = real_digest, real_name
            recorder.target = arms[name]
            block = []
            for _ in range(args.block):
                step += 1
                batch = global_batch(step, rank, world, args.batch_size, args.seq_len, vocab, 0)
                dist.barrier()
                t0 = time.perf_counter()
                loss = strategy.run_step(batch, lambda m, b: m(*b), NoPhases())
                arms[name].drain()
                loss.item()
                block.append((time.perf_counter() - t0) * 1e3)
            if r > 0:
                times[name].extend(block)
                medians[name] = sorted(block)[len(block) // 2]
        if r > 0:
            rounds.append(medians)
    calls_per_step = {name: 0 for name in arms}
    for name, tracer in arms.items():  # one more step each, to count what a step issues
        recorder.target = tracer
        tracer.drain()
        step += 1
        strategy.run_step(global_batch(step, rank, world, args.batch_size, args.seq_len, vocab, 0),
                          lambda m, b: m(*b), NoPhases()).item()
        calls_per_step[name] = sum(k.count for k in tracer.drain().kinds)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"times": times, "rounds": rounds, "calls_per_step": calls_per_step["ledger"],
                       "per_call_us": per_call_us(real_digest, real_name)}, f)
    strategy.teardown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
