"""A step's report: what the loop measured for a finished step (timing, traffic, loss, norm, a
pipeline stage's bubble and timeline) held until the device has its phase times, then one Step
message (with its memory sample and derived numbers), the Timeline of a sampled pipeline step,
the events a step can raise (a loss no longer finite, a TFLOP/s finding), each collective of the
step (a log-only `calls` message, after the step's) and the console line. Nothing here waits for
the device, except at the end of the loop (`publish_ready(wait=True)`)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ringtop.agent.health import nonfinite
from ringtop.agent.instruments.comm_tracer import CommSummary, call_records
from ringtop.agent.instruments.step_clock import (
    StepClock,
    StepTiming,
    apply_device_phases,
    device_begin,
    device_phases_ready,
)
from ringtop.metrics.costs.flops import step_tflops
from ringtop.metrics.timing import step_idle_ms
from ringtop.protocol import CollectiveCalls, Event, MemorySample, StageSpan, Step, Timeline

if TYPE_CHECKING:
    from ringtop.agent.loop.runner import Runner

HELD_BYTES_EVERY = 20
"""The strategy measures what it holds on the first steps and every 20th."""
TIMELINE_EVERY = 5
"""A pipeline stage publishes its timeline for every 5th step (and the first after a change)."""


@dataclass
class PendingStep:
    step: int
    loss: torch.Tensor
    timing: StepTiming
    marks: Any
    comm: CommSummary
    tokens: int
    grad_norm: Any = None
    """The strategy's norm of this step (a tensor read when the step is published)."""
    flops: float = 0.0
    """This step's FLOPs as an own loop gave them; 0: from FLOPs per token × tokens."""
    bubble: Any = None
    """A pipeline stage's StageBubble of this step."""
    timeline: list | None = None
    timeline_start_ms: float = 0.0
    skipped: bool = False
    """The optimizer step was left out (--on-nonfinite, a norm not finite)."""


class StepReport:
    def __init__(self, run: Runner) -> None:
        self.run = run
        self._pending: list[PendingStep] = []
        self.timeline_due = True
        """The next sampled pipeline step publishes its timeline (set after a switch or a change)."""
        self._loss_was_finite = True

    def record(self, loss: torch.Tensor | None, clock: StepClock, tokens: int, flops: float = 0.0) -> None:
        """A finished step's timing and traffic queued, and the steps whose device times are in
        published (nothing here waits for the device). `flops`: the step's own, where an own loop
        gave them."""
        run = self.run
        timing, marks = clock.finish()
        comm = run.tracer.drain()
        self._pending.append(self._pending_step(loss, timing, marks, comm, tokens))
        self._pending[-1].flops = flops
        self.publish_ready()
        if run.commands.profiling is not None:
            run.commands.profile_step(comm.exposed_comm_ms, comm.p2p_wait_ms)

    def _pending_step(self, loss, timing, marks, comm, tokens: int) -> PendingStep:
        run, strategy = self.run, self.run.strategy
        bubble = strategy.last_bubble()
        sampled = bubble is not None and not bubble.warmup and (run.step % TIMELINE_EVERY == 0 or self.timeline_due)
        timeline, start = None, 0
        if sampled:
            self.timeline_due = False
            start, _ = strategy.last_window_ns()
            timeline = [StageSpan(e.micro_batch, e.kind, (e.start_ns - start) / 1e6, (e.end_ns - start) / 1e6)
                        for e in strategy.last_timeline()]
        # Each stage (or tensor-parallel rank) does its share of the work on its replica's tokens.
        return PendingStep(run.step, None if loss is None else loss.detach(), timing, marks, comm,
                           tokens // (strategy.num_stages * strategy.work_split),
                           grad_norm=strategy.last_grad_norm(), bubble=bubble, timeline=timeline,
                           timeline_start_ms=start / 1e6, skipped=strategy.last_step_skipped())

    def publish_ready(self, wait: bool = False) -> None:
        """The queued steps whose device phase times are in; `wait`: all of them (the loop's end)."""
        while self._pending and (wait or device_phases_ready(self._pending[0].marks)):
            p = self._pending.pop(0)
            if wait and p.marks is not None:
                p.marks.events[-1][1].synchronize()
            self._emit(p, apply_device_phases(p.timing, p.marks))

    def _emit(self, p: PendingStep, timing: StepTiming) -> None:
        run = self.run
        loss = float("nan") if p.loss is None else float(p.loss)
        grad_norm = None if p.grad_norm is None else float(p.grad_norm)
        norm_finite = nonfinite.norm_is_finite(grad_norm)
        self._watch_numerics(p, loss, grad_norm, norm_finite)
        run.last_loss, run.last_step_ms = loss, timing.step_ms
        run.step_window.add(p.step, timing.step_ms)
        run.telemetry.step = p.step
        mem = self._memory(p.step)
        ph = timing.phase_ms
        idle_ms = step_idle_ms(ph.get("data", 0.0), p.comm.exposed_comm_ms,
                               p.bubble.idle_ms if p.bubble is not None else None)
        if p.bubble is not None and p.timeline is not None:
            run.telemetry.emit(self._timeline(p))
        run.diagnostician.record(timing.step_ms, ph.get("data", 0.0), p.comm.exposed_comm_ms, p.comm.busy_ms,
                                 sum(k.bytes for k in p.comm.kinds), mem.cuda_reserved_bytes,
                                 mem.cuda_alloc_retries, step=p.step)
        tflops = step_tflops(run.flops.flops, p.tokens, p.flops, timing.step_ms)
        for found in run.step_findings.observe(p.step, loss, tflops):
            run.telemetry.emit(Event(level=found.level, kind=found.kind, text=found.text, step=found.step,
                                     data=found.data))
        run.telemetry.emit(Step(
            step=p.step, loss=loss if math.isfinite(loss) else None, step_ms=timing.step_ms,
            grad_norm=grad_norm if grad_norm is not None and norm_finite else None, skipped=p.skipped,
            data_ms=ph.get("data", 0.0),
            forward_ms=ph.get("forward", 0.0), backward_ms=ph.get("backward", 0.0),
            optimizer_ms=ph.get("optimizer", 0.0), exposed_comm_ms=p.comm.exposed_comm_ms,
            comm_busy_ms=p.comm.busy_ms, tokens=p.tokens,
            tokens_per_s=p.tokens / (timing.step_ms / 1e3) if timing.step_ms > 0 else 0.0,
            tflops=tflops, mem=mem,
            comm=p.comm.kinds, collectives=p.comm.collectives,
            cpu_percent=run.sampler.latest.cpu_percent, drops=run.telemetry.drops, idle_ms=idle_ms,
        ))
        if (p.comm.calls or p.comm.calls_dropped) and run.telemetry.has_log:
            run.telemetry.emit(CollectiveCalls(step=p.step, dropped=p.comm.calls_dropped,
                                               calls=call_records(p.comm.calls, timing.started_ns,
                                                                  device_begin(p.marks))))
        if run.ctx.rank == 0 and run.cfg.print_every and p.step % run.cfg.print_every == 0:
            print(f"[ringtop] step {p.step}/{run.cfg.steps or '∞'}  loss {loss:.4f}  "
                  f"{timing.step_ms:.1f} ms/step  {p.tokens * run.ctx.world_size / (timing.step_ms / 1e3):,.0f} tok/s",
                  file=sys.stderr, flush=True)

    def _watch_numerics(self, p: PendingStep, loss: float, grad_norm: float | None, norm_finite: bool) -> None:
        """--on-nonfinite warn's naming of the ranks, and the loss turning non-finite said once."""
        run = self.run
        if run.naming is not None:
            run.naming.observe(p.step, grad_norm, math.isfinite(loss))
            for found in run.naming.ready():
                run.report_nonfinite(found)
        if p.loss is not None and not math.isfinite(loss) and self._loss_was_finite and norm_finite:
            # (a non-finite norm: the nonfinite event says it)
            run.event("warn", "loss", f"loss is {loss} at step {p.step}")
        self._loss_was_finite = math.isfinite(loss)

    def _memory(self, step: int) -> MemorySample:
        """What the strategy holds (measured on some steps) and the allocator's counters: no device sync."""
        run = self.run
        if step <= run.start_step + 2 or step % HELD_BYTES_EVERY == 0:
            run.strategy.measure_next_step()
        held = run.strategy.held_bytes()
        mem = MemorySample(params_bytes=held.params, grads_bytes=held.grads,
                           optimizer_bytes=held.optimizer, rss_bytes=run.sampler.latest.rss_bytes)
        device = run.ctx.device
        if device.type == "cuda":
            mem.cuda_allocated_bytes = torch.cuda.memory_allocated(device)
            mem.cuda_reserved_bytes = torch.cuda.memory_reserved(device)
            stats = torch.cuda.memory_stats(device)
            mem.cuda_peak_bytes = stats.get("active_bytes.all.peak", 0)
            mem.cuda_peak_reserved_bytes = stats.get("reserved_bytes.all.peak", 0)
            mem.cuda_alloc_retries = stats.get("num_alloc_retries", 0)
            mem.cuda_ooms = stats.get("num_ooms", 0)
        return mem

    @staticmethod
    def _timeline(p: PendingStep) -> Timeline:
        b = p.bubble
        return Timeline(step=p.step, stage=b.stage, stages=b.stages, micro_batches=b.micro_batches,
                        schedule=b.schedule, window_ms=b.window_ms, window_start_ms=p.timeline_start_ms,
                        spans=p.timeline, bubble=b.bubble, bubble_theory=b.theory)
