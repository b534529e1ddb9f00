"""`python -m ringtop.agent` with its per-step telemetry switched on and off in blocks of steps.

A benchmark's entry point under torch's elastic launcher (in place of `-m ringtop.agent`), for
`bench_agent_overhead.py`: with RINGTOP_BENCH_BLOCK_STEPS=N, steps run in blocks of N, in
quartets on, off, off, on or off, on, on, off (`_block_stats.step_is_a`). Every rank decides from the step
number, so all switch at the same step boundary and their collectives stay matched. Each rank
notes the wall clock (`time.perf_counter()`) and its process's CPU time (every thread's,
`time.process_time()`) as each loop iteration begins, at the switch, and writes both lists as JSON
to RINGTOP_BENCH_ITERATIONS-rank-R.json at exit: an iteration (step, report, rules) lies wholly in
one arm, where the interval between step ends would hold the previous step's report. In an "off"
block the training thread does what `--no-telemetry` leaves out of a step:

- the step boundary: no command sync (StepSync's broadcast) and no stall-watch iteration (the watch
  is set idle when a block turns off, so the pause is not a stall);
- the step clock's begin and phase marks;
- collective tracing: DDP's comm hook all-reduces untraced (its `recording` switch) and
  `torch.distributed`'s wrapped functions record nothing (`collective_hooks.active(None)`);
- the step report: no Step, no `calls` line, no timeline, no diagnosis record, no held-bytes count
  asked of the next step (one an "on" step asks is done in the next step whatever its block);
- after the step: no diagnosis exchange.

Left running in both arms, as they cannot be switched at a step boundary: the threads (telemetry
publisher, rank 0's head with relay, publisher and control server, the 1 Hz sampler, the stall
watch's ticks; with nothing published they idle), DDP's comm hook being a Python one (the C++
default replaces it only without a recorder), and the wrapped `torch.distributed` functions'
pass-through. The whole-process comparisons of `bench_agent_overhead.py` include those.

RINGTOP_BENCH_BLOCK_NULL=1 keeps telemetry on in every block (the timing and the blocks as ever): an
A/A run, whose ratio must come out 1 within its interval.

Nothing in the agent is changed; the names patched are checked first, so a refactor that moves
them fails here instead of measuring nothing (and `bench_agent_overhead.py` checks from the logs
that Steps were published for the "on" steps alone). With RINGTOP_BENCH_BLOCK_STEPS unset this is
`python -m ringtop.agent`.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from pathlib import Path

from _block_stats import step_is_a

BLOCK_STEPS_ENV = "RINGTOP_BENCH_BLOCK_STEPS"
ITERATIONS_ENV = "RINGTOP_BENCH_ITERATIONS"
NULL_ENV = "RINGTOP_BENCH_BLOCK_NULL"


class Gate:
    on = True


def install(block_steps: int, starts: dict[str, list[float]], null: bool = False) -> None:
    from ringtop.agent.loop import runner, step_report
    from ringtop.strategies import collective_hooks, ddp

    for owner, name in ((runner, "StepClock"), (runner.Runner, "step_boundary"), (runner.Runner, "_after_step"),
                        (step_report.StepReport, "record"), (ddp, "register_traced_allreduce"),
                        (collective_hooks, "active")):
        if not hasattr(owner, name):
            where = getattr(owner, "__name__", owner)
            raise SystemExit(f"_telemetry_blocks: {where}.{name} is gone; update the wrapper")

    class GatedClock(runner.StepClock):
        def begin(self) -> None:
            if Gate.on:
                super().begin()

        def mark(self, phase: str) -> None:
            if Gate.on:
                super().mark(phase)

    real_boundary, real_after = runner.Runner.step_boundary, runner.Runner._after_step
    real_record, real_register, real_active = (step_report.StepReport.record, ddp.register_traced_allreduce,
                                               collective_hooks.active)

    def step_boundary(self) -> bool:
        starts["wall"].append(time.perf_counter())
        starts["cpu"].append(time.process_time())
        on = null or step_is_a(self.step + 1, block_steps)
        if on != Gate.on:
            Gate.on = on
            if not on and self.watch is not None:
                self.watch.idle()
        return real_boundary(self) if on else False

    def after_step(self) -> None:
        if Gate.on:
            real_after(self)

    def record(self, *args, **kwargs) -> None:
        if Gate.on:
            real_record(self, *args, **kwargs)

    def register_traced_allreduce(model, recorder, like_builtin=False, recording=None):
        return real_register(model, recorder, like_builtin, recording or (lambda: Gate.on))

    def active(recorder):
        return real_active(recorder if Gate.on else None)

    runner.StepClock = GatedClock
    runner.Runner.step_boundary, runner.Runner._after_step = step_boundary, after_step
    step_report.StepReport.record = record
    ddp.register_traced_allreduce = register_traced_allreduce
    collective_hooks.active = active


def main() -> int:
    block_steps = int(os.environ.get(BLOCK_STEPS_ENV, "0"))
    if block_steps:
        starts: dict[str, list[float]] = {"wall": [], "cpu": []}
        install(block_steps, starts, null=os.environ.get(NULL_ENV) == "1")
        out = os.environ.get(ITERATIONS_ENV)
        if out:
            path = Path(f"{out}-rank-{os.environ.get('RANK', '0')}.json")
            atexit.register(lambda: path.write_text(json.dumps(starts)))
    from ringtop.agent.__main__ import main as agent_main

    return agent_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
