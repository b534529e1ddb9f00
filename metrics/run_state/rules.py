"""The run-level readings every surface makes of its ranks' states (metrics/run_state/rank.py):
whether the run is over, its lifecycle, who holds the others up, and what a restart by the
launcher keeps. One definition each, for the UI's `RunView`, the exporter's and `summary`'s
`RunState`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Iterable

from ringtop.metrics.rules.hang import HangVerdict, diagnose
from ringtop.metrics.run_lifecycle import STALLED, Lifecycle, fold
from ringtop.metrics.run_state.hang_board import HangBoard
from ringtop.metrics.run_state.rank import RankState


@dataclass(frozen=True)
class RestartSeen:
    """The run's latest restart by its launcher, as the fold saw it (count 0: none seen). `cause`:
    how the attempt before it ended, in the lifecycle's words ("" when not seen, e.g. attached
    after); `last_step`: the furthest step any rank had reached by then; `ts`: the new attempt's
    first Hello."""

    count: int = 0
    cause: str = ""
    last_step: int = -1
    ts: float = 0.0

    @property
    def after(self) -> str:
        """`after rank 1: error: …`, or `after step 7` when how it ended was not heard."""
        if self.cause:
            return f"after {self.cause}"
        return f"after step {self.last_step:,}" if self.last_step >= 0 else ""


def run_ended(ranks: Collection[RankState], world_size: int) -> bool:
    """Every rank known said Bye or ended without one (and, when the world size is known, all of them)."""
    known = [r for r in ranks if r.said_hello or r.over] or list(ranks)
    if not known or not all(r.over for r in known):
        return False
    return world_size <= 0 or sum(1 for r in ranks if r.over) >= world_size


def lifecycle_of(ranks: Collection[RankState], *, world_size: int, heard: bool, restarts_left: int,
                 stalled: Iterable[int] = (), how_silent: str = "", detail_silent: str = "") -> Lifecycle:
    """The run's lifecycle (metrics/run_lifecycle.py) from its ranks' states. `heard`: any message
    came; `stalled`: the ranks the caller finds not stepping; `how_silent`, `detail_silent`: the
    words for a rank ended without a Bye whose how is not known."""
    ends = [e for e in (r.end(how_silent, detail_silent) for r in ranks) if e is not None]
    running = 0 if run_ended(ranks, world_size) else max(1, len(ranks) - len(ends))
    stuck = [r.rank for r in ranks if r.stuck and not r.over]
    return fold(ends, world_size=world_size, running=running, heard=heard,
                stepped=any(r.step_seen is not None for r in ranks), stalled=stalled, stuck=stuck,
                restarts_left=restarts_left)


def restarts_left(hello: Any, restart: RestartSeen) -> int:
    """Restarts the launcher still allows: its Hello's `max_restarts` less those seen."""
    return max(0, (hello.max_restarts if hello is not None else 0) - restart.count)


def start_attempt(ranks: Iterable[RankState], life: Lifecycle, hello: Any) -> RestartSeen:
    """The first Hello of a new attempt (the launcher started every rank again): how the last one
    ended (`life`, read before this; else what the new rank 0 read in the logs, its Hello's
    `restart_cause`) is kept, then every rank's end is forgotten, as each starts again."""
    ranks = list(ranks)
    cause = life.cause or (life.words if life.state == STALLED else "") or hello.restart_cause
    seen = RestartSeen(hello.restart_count, cause, max((r.step for r in ranks), default=-1), hello.ts)
    for r in ranks:
        r.forget_end()
        r.step_seen = None
        r.stuck = ""
    return seen


def hang_reading(board: HangBoard, ranks: dict[int, RankState], world_size: int) -> HangVerdict | None:
    """Who holds the others up, from the stall reports standing (`metrics.hang.diagnose`): a rank
    that ended without a Bye, or failed, is dead, and its report no longer stands. None when no
    report stands."""
    if not board.stalled:
        return None
    dead = {r.rank for r in ranks.values() if r.dead or (r.ended and not r.bye_ok)}
    reports = {rank: s for rank, s in board.stalled.items() if rank not in dead}
    world = world_size or max(max(ranks, default=0), max(reports, default=0)) + 1
    return diagnose(reports, world, dead)
