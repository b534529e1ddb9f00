"""`ringtop.Monitor`: a script's own torchrun DDP or FSDP2 loop streams what the agent's loop does
(steps and their parts, memory, per-collective traffic and exposed time, stalls, numerics,
verdicts, heartbeats) through the agent's own pieces: the Runner's telemetry, rank 0's head
(agent/head: relay, control server, connection file) and shutdown, with the script's model
standing in for a strategy (`own_loop.OwnLoop`; the Runner over it: `monitored_run`). Commands
arrive at step boundaries as in the agent; a checkpoint calls the save function the script
registered, a switch is refused with the reason.

Creating a Monitor and `close()` are collective (every rank, in the same order, like the process
group's own calls); so is each step boundary, which the ranks of a data-parallel loop reach
together anyway. Nothing on the step path waits for the device or for a socket."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import torch
import torch.distributed as dist

from ringtop.agent.instruments.step_clock import StepClock
from ringtop.agent.loop.monitored_run import ARGS_ENV, MonitoredRun, SaveFunction, monitor_config
from ringtop.agent.loop.own_loop import MonitorError, OwnLoop
from ringtop.agent.loop.runner import WatchedPhases
from ringtop.agent.models.flop_count import FlopsPerToken
from ringtop.agent.models.model import count_params
from ringtop.metrics.costs.flops import NOT_GIVEN
from ringtop.protocol import Bye, Event
from ringtop.strategies import collective_hooks
from ringtop.strategies.base import DistContext, unique_parameters


def _flops_given(flops_per_token: float, flops_per_step: float, trainer: str) -> FlopsPerToken:
    """TFLOP/s come only from what the script gives, and the Hello says where they came from."""
    if flops_per_token > 0:
        return FlopsPerToken(float(flops_per_token), "given to ringtop.Monitor")
    if flops_per_step > 0:
        return FlopsPerToken(0.0, "FLOPs per step given to ringtop.Monitor")
    if trainer == "hf":
        return FlopsPerToken(0.0, "FLOPs per step: the Trainer's own count (floating_point_ops)")
    return FlopsPerToken(0.0, f"{NOT_GIVEN}: pass flops_per_token= and tokens_per_step=, or "
                              "flops_per_step=, to ringtop.Monitor")


class StepHandle:
    """What `with mon.step() as step:` gives the loop: set `step.loss` (a tensor, read later, off
    the step path), `step.tokens` / `step.flops` (this step's, on this rank: TFLOP/s come only from
    what the loop gives) and `step.grad_norm` (e.g. what `clip_grad_norm_` returned)."""

    __slots__ = ("loss", "tokens", "grad_norm", "flops")

    def __init__(self) -> None:
        self.loss: torch.Tensor | None = None
        self.tokens: int | None = None
        self.grad_norm: Any = None
        self.flops: float | None = None


class Monitor:
    """Watch a torchrun DDP or FSDP2 training loop with ringtop::

        mon = ringtop.Monitor(model, optimizer, log_dir="runs/mine")
        for batch in data:
            with mon.step() as step:
                ...; step.loss = loss
            if mon.should_stop:
                break
        mon.close()

    `model`: as the loop calls it (DistributedDataParallel, or fully_shard-ed). `save_fn(directory,
    step)`: what the UI's checkpoint runs on every rank (also `on_checkpoint`). TFLOP/s and MFU
    come only from what the script gives, never from a guess at its batch: `flops_per_token` (the
    model's training FLOPs per token, forward and backward) with `tokens_per_step` (this rank's
    tokens per optimizer step; or `step.tokens` / `step_end(tokens=)` per step), or
    `flops_per_step` (this rank's; or `step.flops` / `step_end(flops=)`). `trainer`: set by
    ringtop's trainer callbacks ("hf", "lightning") so that advice names that trainer's settings.
    Other options: the agent's telemetry and checkpoint flags by their field names
    (`log_dir`, `publish`, `relay`, `control`, `insecure`, `allow_remote`, `run_id`, `print_every`,
    `stall_factor`, `stall_floor_s`, `link_gbps`, `peak_tflops`, `dtype`, `metrics`,
    `checkpoint_dir`), or as flags in the `RINGTOP_ARGS` environment variable."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 save_fn: SaveFunction | None = None, flops_per_token: float = 0.0, tokens_per_step: int = 0,
                 flops_per_step: float = 0.0, fsdp_sharding: str = "full", trainer: str = "",
                 **options: Any) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise MonitorError("ringtop.Monitor needs the process group first: call "
                               "torch.distributed.init_process_group() (under torchrun) before it")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise MonitorError(f"ringtop.Monitor: optimizer must be a torch.optim.Optimizer, got "
                               f"{type(optimizer).__name__}")
        if fsdp_sharding not in ("full", "grad-op", "no-shard"):
            raise MonitorError(f"ringtop.Monitor(fsdp_sharding={fsdp_sharding!r}): one of full, grad-op, no-shard")
        if trainer not in ("", "hf", "lightning"):
            raise MonitorError(f"ringtop.Monitor(trainer={trainer!r}): hf or lightning (set by ringtop's callbacks)")
        for name, value in (("flops_per_token", flops_per_token), ("tokens_per_step", tokens_per_step),
                            ("flops_per_step", flops_per_step)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise MonitorError(f"ringtop.Monitor({name}={value!r}): a number >= 0")
        cfg = monitor_config(options, os.environ.get(ARGS_ENV, ""))
        loop = OwnLoop(model, optimizer, fsdp_sharding)
        loop.trainer = trainer
        cfg = msgspec.structs.replace(cfg, strategy=loop.kind, fsdp_sharding=fsdp_sharding, steps=0)
        parameters = unique_parameters(loop.module)
        device = parameters[0].device if parameters else torch.device("cpu")
        ctx = DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(),
                          local_rank=int(os.environ.get("LOCAL_RANK", "0")), device=device,
                          backend=str(dist.get_backend()))
        self._loop = loop
        self._run = run = MonitoredRun(cfg, ctx, loop, type(loop.module).__name__)
        run.save_fn = save_fn
        run.param_count, run.param_tensors = count_params(loop.module), len(parameters)
        self._tokens_per_step, self._flops_per_step = int(tokens_per_step), float(flops_per_step)
        run.flops = _flops_given(flops_per_token, flops_per_step, trainer)
        collective_hooks.install()
        self._closed = False
        self._lock = threading.Lock()
        try:
            run.start_watching(None)
            loop.listen()
        except BaseException as exc:  # half started: let go of what did start, then say why
            run.control_group = None
            run.goodbye.shutdown(Bye(reason=f"error: {type(exc).__name__}: {exc}"[:500], ok=False))
            raise
        if run.diagnostician is not None:
            run.diagnostician.run = dataclasses.replace(run.diagnostician.run, loop=trainer or "monitor")
        if loop.comm_note:
            run.event("warn", "comm", loop.comm_note)
        self._clock = StepClock(device)
        self._phases = WatchedPhases(self._clock, run.watch)
        self._state: str | None = None
        """None between steps; "implicit": opened by the previous `step_end`; "explicit": by `step()`."""
        self._recording: contextlib.AbstractContextManager | None = None
        atexit.register(self._at_exit)
        self._open(implicit=True)

    # ------------------------------------------------------------------ the loop's side

    @contextlib.contextmanager
    def step(self, tokens: int | None = None, flops: float | None = None) -> Iterator[StepHandle]:
        """One training step: forward, backward and optimizer step inside the block. `tokens`,
        `flops`: this step's on this rank, if known before it (else set them on the handle)."""
        handle = StepHandle()
        handle.tokens, handle.flops = tokens, flops
        if self._state is None:
            self._open(implicit=False)
        elif self._state == "implicit":  # the boundary is done; the step starts now, not at it
            self._run.watch.idle()
            self._run.watch.iteration(self._run.step + 1, "data")
            self._start_clock()
        self._state = "explicit"
        try:
            yield handle
        except BaseException:  # the step ends unrecorded; the exception goes on up
            self._stop_recording()
            self._loop.close_step()
            self._state = None
            self._run.watch.between()
            raise
        self._end(handle.loss, handle.tokens, handle.grad_norm, handle.flops)
        self._run.watch.between()

    def step_end(self, loss: torch.Tensor | None = None, tokens: int | None = None, grad_norm: Any = None,
                 flops: float | None = None) -> None:
        """For a loop without `with mon.step()`: the step since the previous call (or the Monitor's
        creation) is done; the next one starts now. `tokens`, `flops`: this step's on this rank
        (else `tokens_per_step`, `flops_per_step`); `grad_norm`: e.g. what `clip_grad_norm_` returned."""
        if self._closed:
            return
        if self._state is None:
            self._open(implicit=True)
        self._end(loss, tokens, grad_norm, flops)
        self._open(implicit=True)

    def on_checkpoint(self, fn: SaveFunction) -> SaveFunction:
        """Register `fn(directory, step)`, run on every rank by the UI's checkpoint (`c`): write the
        model's state into `directory` (it becomes `CHECKPOINT_DIR/step-NNNNNNNN-user/`). Usable as a
        decorator."""
        if not callable(fn):
            raise MonitorError("on_checkpoint takes a function fn(directory, step)")
        self._run.save_fn = fn
        return fn

    @property
    def should_stop(self) -> bool:
        """A `stop` came from the UI or `ringtop ctl stop`: leave the loop (then `close()`)."""
        return bool(self._run.stop_reason)

    @property
    def stop_reason(self) -> str:
        return self._run.stop_reason or ""

    @property
    def step_count(self) -> int:
        return self._run.step

    @property
    def run_id(self) -> str:
        return self._run.run_id

    # ------------------------------------------------------------------ steps

    def _open(self, implicit: bool) -> None:
        """A step boundary (collective: the commands agreed for it are applied), then the clock."""
        if self._closed:
            return
        self._run.step_boundary()
        if self._run.watch is not None:
            self._run.watch.phase("data")  # the boundary is agreed: the loop's own code runs next, not step-sync
        self._state = "implicit" if implicit else "explicit"
        self._start_clock()
        self._recording = collective_hooks.active(self._run.tracer)
        self._recording.__enter__()

    def _start_clock(self) -> None:
        self._clock.begin()
        self._loop.open_step(self._phases)

    def _end(self, loss: Any, tokens: int | None, grad_norm: Any, flops: float | None = None) -> None:
        if self._closed or self._state is None:
            return
        self._stop_recording()
        self._loop.close_step()
        self._state = None
        run = self._run
        run.step += 1
        self._loop.set_grad_norm(grad_norm)
        if run.node_relay is not None:
            run.keep_node_relay()
        loss_tensor = loss if isinstance(loss, torch.Tensor) else (None if loss is None else torch.tensor(float(loss)))
        run.report.record(loss_tensor, self._clock, self._tokens_per_step if tokens is None else int(tokens),
                         self._flops_per_step if flops is None else float(flops))
        if run.diagnostician is not None and run.diagnostician.due(run.step):
            run.diagnostician.run_rules()

    def _stop_recording(self) -> None:
        recording, self._recording = self._recording, None
        if recording is not None:
            recording.__exit__(None, None, None)

    # ------------------------------------------------------------------ the end

    def close(self) -> None:
        """Collective, at the end of the loop on every rank (before destroy_process_group): the
        last steps and the diagnosis published, a Bye sent, every socket, thread and the connection
        file released. Also at the end of a `with` block and, failing that, at exit."""
        self._close(error=None, collective=True)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._close(error=exc, collective=exc is None)

    def _at_exit(self) -> None:
        """The script ended without `close()`: close alone (no collective) if the group is gone or
        the script died of an exception its peers may not share."""
        died = getattr(sys, "last_value", None)
        self._close(error=died, collective=died is None and dist.is_initialized())

    def _close(self, error: BaseException | None, collective: bool) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self._at_exit)
        run = self._run
        self._stop_recording()
        self._loop.close_step()
        self._state = None
        if collective and dist.is_initialized():
            try:
                run.end_loop()
            except Exception as exc:  # a peer gone meanwhile: still let go of everything here
                error, collective = exc, False
        if not collective:
            run.control_group = None  # no barrier with peers that may be gone
            if run.watch is not None:
                run.watch.idle()
            run.report.publish_ready(wait=True)
        if isinstance(error, KeyboardInterrupt):  # Ctrl-C: a user's stop (metrics/run_lifecycle.py)
            bye = Bye(reason="interrupted: SIGINT", ok=False, step=run.step)
        elif error is not None:
            bye = Bye(reason=f"error: {type(error).__name__}: {error}"[:500], ok=False, step=run.step)
        else:
            bye = Bye(reason=run.stop_reason or f"completed {run.step} steps", ok=True, step=run.step)
        on_main = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGTERM) if on_main else None
        try:
            run.goodbye.shutdown(bye)
        finally:
            if on_main and previous is not None:
                signal.signal(signal.SIGTERM, previous)  # the Runner's shutdown ignores it; the script's again

    def event(self, text: str, level: str = "info", **data: Any) -> None:
        """An event of the script's own in the UI's Events tab and the logs (`kind` script)."""
        if level not in ("info", "warn", "error"):
            raise MonitorError(f"event level {level!r}: one of info, warn, error")
        if self._run.telemetry is not None and not self._closed:
            self._run.telemetry.emit(Event(level=level, kind="script", text=str(text)[:500], step=self._run.step,
                                           data=data))
