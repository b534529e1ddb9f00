"""A hung run built from fixed numbers, for the view model, the app, the screenshots and the summary:
ranks step together, then every rank but the culprit waits in the next all-reduce while the
culprit is still in its forward (an injected sleep), all of them reporting `stall` every 2 s."""

from __future__ import annotations

from ringtop.protocol import Bye, GroupCursor, Hello, InFlight, Stall, Step

T0 = 1_780_000_000.0
"""2026-05-28 20:26:40 UTC."""
MiB = 2**20
PER_STEP = 4
"""All-reduces per step on group `world`."""

WAITING_STACK = ["/usr/lib/python3.12/runpy.py:198 in _run_module_as_main",
                 "/opt/ringtop/agent/runner.py:410 in run", "/opt/ringtop/strategies/ddp.py:88 in step",
                 "/home/u/train.py:120 in backward_hook",
                 "/opt/venv/site-packages/torch/distributed/distributed_c10d.py:2501 in wait"]
CULPRIT_STACK = ["/usr/lib/python3.12/runpy.py:198 in _run_module_as_main",
                 "/opt/ringtop/agent/runner.py:410 in run", "/opt/ringtop/strategies/ddp.py:71 in step",
                 "/home/u/model.py:57 in forward", "/usr/lib/python3.12/time.py:1 in sleep"]


class Seq:
    """Per rank, sequence numbers without gaps (a gap would count as lost telemetry)."""

    def __init__(self) -> None:
        self._n: dict[int, int] = {}

    def __call__(self, rank: int) -> int:
        self._n[rank] = self._n.get(rank, 0) + 1
        return self._n[rank]


def hello(rank: int, world: int = 4) -> Hello:
    return Hello(rank=rank, seq=0, ts=T0 + rank * 0.01, run_id="hang0001", world_size=world, host=f"node-{rank // 2}",
                 pid=7000 + rank, backend="gloo", device="cpu", strategy="ddp", model="tiny-gpt", param_count=1_048_576,
                 batch_size=8, seq_len=64, steps=100)


def step(rank: int, n: int, seq: int, ts: float | None = None) -> Step:
    return Step(rank=rank, seq=seq, ts=T0 + 1 + n * 0.1 if ts is None else ts, step=n, loss=round(3.0 - 0.01 * n, 4),
                step_ms=100.0, collectives=[GroupCursor(group="world", issued=n * PER_STEP, completed=n * PER_STEP,
                                                        count=PER_STEP, digest="abcd1234")])


def stall(rank: int, seq: int, *, culprit: int = 3, done: int = 5, k: int = 0, state: str = "stalled",
          request: str = "") -> Stall:
    """Rank `rank`'s k-th report, stuck in step `done` + 1: the culprit in its forward, the others in
    all-reduce #(done x PER_STEP + 1), the first of the step, waiting for it."""
    ts = T0 + 3 + 2 * k
    if rank == culprit:
        return Stall(rank=rank, seq=seq, ts=ts, state=state, request=request, step=done + 1, phase="forward",
                     running_s=35.0 + 2 * k, threshold_s=2.5, where="model.py:57 in forward", stack=CULPRIT_STACK,
                     groups=[GroupCursor(group="world", issued=done * PER_STEP, completed=done * PER_STEP)])
    first = done * PER_STEP + 1
    return Stall(rank=rank, seq=seq, ts=ts, state=state, request=request, step=done + 1, phase="backward",
                 running_s=37.0 + 2 * k, threshold_s=2.5, where="train.py:120 in backward_hook", stack=WAITING_STACK,
                 in_flight=[InFlight(group="world", seq=first, kind="all_reduce", bytes=4 * MiB, shapes="9f3e0c11",
                                     age_s=36.0 + 2 * k),
                            InFlight(group="world", seq=first + 1, kind="all_reduce", bytes=4 * MiB, shapes="9f3e0c11",
                                     age_s=35.5 + 2 * k)],
                 groups=[GroupCursor(group="world", issued=first + 1, completed=done * PER_STEP)])


def hung_run(world: int = 4, culprit: int = 3, steps: int = 5, reports: int = 3, seq: Seq | None = None) -> list:
    """Hellos, `steps` steps on every rank, then `reports` rounds of stall reports."""
    seq = seq or Seq()
    msgs: list = [hello(r, world) for r in range(world)]
    for n in range(1, steps + 1):
        msgs += [step(r, n, seq(r)) for r in range(world)]
    for k in range(reports):
        msgs += [stall(r, seq(r), culprit=culprit, done=steps, k=k) for r in range(world)]
    return msgs


def recovered(world: int, seq: Seq, steps: int = 5) -> list:
    """Every rank finishes the step it was stuck in."""
    return [step(r, steps + 1, seq(r), ts=T0 + 40) for r in range(world)]


def failed_bye(rank: int, seq: int, step_n: int = 5) -> Bye:
    return Bye(rank=rank, seq=seq, ts=T0 + 10, reason="error: killed", step=step_n, ok=False)
