"""The cheap fold (issue 15): what the view model sums and closes at ingest, checked against plain
references computed here from the same messages, and a batch folded as its messages one by one."""

from __future__ import annotations

import math
import random

import pytest

from ringtop.protocol import CommStat, Hello, Step
from ringtop.tui.state.reducers import steps as steps_module
from ringtop.tui.state.reducers.comm import rank_step
from ringtop.tui.state.reducers.steps import StepHistory
from ringtop.tui.state.view_model import RunView

WORLD = 6
KINDS = (("all_reduce", 6), ("all_gather", 3), ("broadcast", 0))


def hello(rank: int) -> Hello:
    return Hello(rank=rank, seq=0, ts=100.0, run_id="ingest", world_size=WORLD, host=f"h{rank // 3}", pid=50 + rank,
                 strategy="fsdp")


def odd(rng: random.Random, x: float) -> float:
    """Now and then a time that is not finite: the fold must count it as none."""
    return rng.choice((math.nan, math.inf)) if rng.random() < 0.1 else x


def messages(seed: int, steps: int = 30) -> list[Step]:
    rng = random.Random(seed)
    seq = {r: 0 for r in range(WORLD)}
    out = []
    for n in range(1, steps + 1):
        ranks = [r for r in range(WORLD) if rng.random() > 0.1]  # some ranks miss a step
        rng.shuffle(ranks)
        for r in ranks:
            seq[r] += 1
            comm = [CommStat(kind=k, count=rng.randint(1, 4), bytes=rng.randint(0, 10**7),
                             busy_ms=odd(rng, rng.uniform(0.1, 9.0)), group_size=g)
                    for k, g in KINDS if rng.random() > 0.2]
            if comm and rng.random() < 0.2:
                comm.append(CommStat(kind=comm[0].kind, count=1, bytes=123, busy_ms=0.5,
                                     group_size=comm[0].group_size))  # the same kind twice in one step
            out.append(Step(rank=r, seq=seq[r], ts=200.0 + n + r * 1e-3, step=n, loss=3.0 - n * 0.01,
                            step_ms=odd(rng, rng.uniform(50.0, 150.0)) if rng.random() > 0.05 else 0.0,
                            data_ms=odd(rng, rng.uniform(0.0, 5.0)), exposed_comm_ms=odd(rng, rng.uniform(0.0, 9.0)),
                            comm_busy_ms=odd(rng, rng.uniform(0.0, 20.0)), comm=comm))
    return out


def plain(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def reference_sums(msgs: list[Step]) -> dict[int, dict]:
    """Per step number, the timed steps' times and per (kind, group) totals, summed the plain way."""
    out: dict[int, dict] = {}
    for m in msgs:
        if not (math.isfinite(m.step_ms) and m.step_ms > 0):
            continue
        s = out.setdefault(m.step, {"ranks": 0, "step_ms": 0.0, "data_ms": 0.0, "exposed_comm_ms": 0.0, "busy_ms": 0.0,
                                    "kinds": {}})
        s["ranks"] += 1
        s["step_ms"] += m.step_ms
        s["data_ms"] += plain(m.data_ms)
        s["exposed_comm_ms"] += plain(m.exposed_comm_ms)
        s["busy_ms"] += plain(m.comm_busy_ms)
        for c in m.comm:
            k = s["kinds"].setdefault((c.kind, c.group_size, c.group), [0, 0, 0.0])
            k[0] += c.count
            k[1] += c.bytes
            k[2] += plain(c.busy_ms)
    return out


def same_sums(got, want: dict) -> bool:
    approx = lambda a, b: a == pytest.approx(b, rel=1e-12, abs=1e-9)  # noqa: E731
    return (got.ranks == want["ranks"] and all(approx(getattr(got, f), want[f])
                                               for f in ("step_ms", "data_ms", "exposed_comm_ms", "busy_ms"))
            and {k: [c.count, c.bytes] for k, c in got.kinds.items()} == {k: v[:2] for k, v in want["kinds"].items()}
            and all(approx(got.kinds[k].busy_ms, v[2]) for k, v in want["kinds"].items()))


@pytest.mark.parametrize("seed", range(5))
def test_the_ledgers_sums_per_step_are_the_plain_sums_over_the_ranks_messages(seed):
    msgs = messages(seed)
    v = RunView(watch_liveness=False)
    v.apply_many([hello(r) for r in range(WORLD)], now=1.0)
    v.apply_many(msgs, now=2.0)
    want = reference_sums(msgs)
    assert sorted(v.comm_steps) == sorted(want)
    for step, got in v.comm_steps.items():
        assert same_sums(got, want[step])
    # the check itself tells a wrong sum: one byte off, or one rank-step too many
    step, got = next(iter(v.comm_steps.items()))
    off = {**want[step], "kinds": {k: [c, b + 1, u] for k, (c, b, u) in want[step]["kinds"].items()}}
    assert want[step]["kinds"] and not same_sums(got, off)
    assert not same_sums(got, {**want[step], "ranks": want[step]["ranks"] + 1})


@pytest.mark.parametrize("seed", range(3))
def test_a_ranks_history_holds_its_timed_steps_and_each_reads_as_its_plain_sums(seed):
    msgs = messages(seed)
    v = RunView(watch_liveness=False)
    v.apply_many([hello(r) for r in range(WORLD)], now=1.0)
    v.apply_many(msgs, now=2.0)
    for rank, row in v.ranks.items():
        mine = [m for m in msgs if m.rank == rank and math.isfinite(m.step_ms) and m.step_ms > 0]
        kept = [(t.step, t.step_ms, t.comm) for t in row.comm_history]
        assert kept == [(m.step, m.step_ms, tuple(m.comm)) for m in mine]
        for t, m in zip(row.comm_history, mine):
            assert same_sums(rank_step(t), reference_sums([m])[m.step])


def old_collect(h: StepHistory, step: int, rank: int, step_ms: float, loss: float, live: set[int]) -> None:
    """The fold before issue 15's work: every message looks at every pending step in order."""
    if h.points and step <= h.points[-1].step:
        return
    h._pending.setdefault(step, {})[rank] = (step_ms, loss, math.nan)
    h._newest_step = max(h._newest_step, step)
    for s in sorted(h._pending):
        got = h._pending[s]
        if (s <= h._newest_step - steps_module.STEP_LAG or len(h._pending) > steps_module.MAX_PENDING_STEPS
                or steps_module._complete(got, live)):
            h._close(s, h._pending.pop(s))
        else:
            break


@pytest.mark.parametrize("seed", range(8))
def test_the_step_history_closes_the_steps_the_per_message_look_closed(seed):
    rng = random.Random(seed)
    new, old = StepHistory(240), StepHistory(240)
    live = set(range(16))
    for n in range(1, 60):
        ranks = [r for r in live if rng.random() > 0.05]
        rng.shuffle(ranks)
        for r in ranks:
            late = n - rng.randint(1, 10) if rng.random() < 0.05 else n  # a late rank's old step
            new.collect(late, r, 100.0 + r, 3.0, live)
            old_collect(old, late, r, 100.0 + r, 3.0, live)
            if rng.random() < 0.005 and len(live) > 2:  # a rank leaves (a bye, or found dead)
                live.discard(rng.choice(sorted(live)))
                new.close_complete(live)
                old.close_complete(live)
    assert len(new.points) > 20
    assert list(new.points) == list(old.points)
    assert new._pending == old._pending


def test_a_batch_folds_as_its_messages_one_by_one_and_moves_each_part_on_once():
    msgs = [hello(r) for r in range(WORLD)] + messages(7)
    one, batch = RunView(watch_liveness=False), RunView(watch_liveness=False)
    for m in msgs:
        one.apply(m, now=5.0)
    before = dict(batch.versions)
    batch.apply_batch(msgs, now=5.0)
    fields = ("step", "loss", "step_ms", "seq_lost", "version", "comm_mb_s", "idle_pct", "comm_kind_bytes")
    for rank in range(WORLD):
        a, b = one.ranks[rank], batch.ranks[rank]
        assert [getattr(a, f) for f in fields] == pytest.approx([getattr(b, f) for f in fields], nan_ok=True)
    assert list(one.steps) == list(batch.steps) and one.goodput.result() == batch.goodput.result()
    assert {p: batch.versions[p] - before[p] for p in ("ranks", "steps", "comm")} == {"ranks": 1, "steps": 1, "comm": 1}


def test_a_message_that_cannot_be_folded_is_handed_to_on_error_and_the_others_fold():
    v = RunView(watch_liveness=False)
    bad = Step(rank=0, seq=1, ts=200.0, step=1, loss=3.0, step_ms=100.0, comm=[None])  # not a CommStat
    seen = []
    v.apply_batch([hello(0), bad, Step(rank=0, seq=2, ts=201.0, step=2, loss=2.9, step_ms=90.0)], now=1.0,
                  on_error=lambda m, exc: seen.append((m, type(exc))))
    assert seen == [(bad, AttributeError)] and v.ranks[0].step == 2
    with pytest.raises(AttributeError):
        v.apply_batch([bad], now=1.0)
