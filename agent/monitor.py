"""`ringtop.Monitor`: a script's own torchrun DDP or FSDP2 loop streams what the agent's loop does
(steps and their parts, memory, per-collective traffic and exposed time, stalls, numerics,
verdicts, heartbeats) through the agent's own pieces: the Runner's telemetry, relay, control
server, connection file and shutdown, with the script's model standing in for a strategy
(`own_loop.OwnLoop`). Commands arrive at step boundaries as in the agent; a checkpoint calls the
save function the script registered, a switch is refused with the reason.

Creating a Monitor and `close()` are collective (every rank, in the same order, like the process
group's own calls); so is each step boundary, which the ranks of a data-parallel loop reach
together anyway. Nothing on the step path waits for the device or for a socket."""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import torch
import torch.distributed as dist

from ringtop.protocol import Bye, Event
from ringtop.strategies import collective_hooks
from ringtop.strategies.base import DistContext, unique_parameters

from . import checkpoint_format as ckpt
from .config import CHECKPOINTS, TELEMETRY, AgentConfig, ConfigError, agent_parser, cli_fields, config_from_options
from .control import PendingCommand, all_gather_fixed
from .flop_count import FlopsPerToken
from .instruments.step_clock import StepClock
from .model import count_params
from .own_loop import NOT_OWNED, MonitorError, OwnLoop
from .runner import Runner, _WatchedPhases

ARGS_ENV = "RINGTOP_ARGS"
"""The agent's telemetry and checkpoint flags for a Monitor, e.g. `--log-dir runs/a --print-every 10`
(keyword arguments given in the script win)."""
MAX_ARGS_CHARS = 4096
USER_KIND = ckpt.USER
ERROR_BYTES = 200
NOT_OPTIONS = frozenset({"telemetry", "step_times_file", "resume", "checkpoint_every", "checkpoint_kind", "keep"})
"""Flags of those groups that only ringtop's own loop can act on."""
OPTIONS = frozenset(f.name for f in cli_fields() if f.option.group in (TELEMETRY, CHECKPOINTS)) - NOT_OPTIONS \
    | {"dtype"}
"""What a Monitor takes: where it publishes and logs, its keys, its stall thresholds, the link,
the peak and dtype MFU is measured with, where checkpoints go."""

SaveFunction = Callable[[Path, int], Any]


def monitor_config(options: dict[str, Any], env_text: str) -> AgentConfig:
    """The AgentConfig of a Monitor: `RINGTOP_ARGS` flags, then the keyword arguments, checked as
    the agent checks its command line."""
    given: dict[str, Any] = {}
    if env_text:
        if len(env_text) > MAX_ARGS_CHARS:
            raise ConfigError(f"{ARGS_ENV} is longer than {MAX_ARGS_CHARS} characters")
        try:
            words = shlex.split(env_text)
        except ValueError as exc:
            raise ConfigError(f"{ARGS_ENV}: {exc}") from None
        given.update(vars(agent_parser(f"{ARGS_ENV}=").parse_args(words)))
    fields = {f.name: f for f in cli_fields()}
    for name, value in options.items():
        if name in OPTIONS and fields[name].option.parse is not None and not isinstance(value, str):
            raise ConfigError(f"ringtop.Monitor({name}=...): give it as text, as on the command line "
                              f"({fields[name].flag} {fields[name].option.metavar or 'VALUE'})")
        given[name] = value
    refused = sorted(set(given) - OPTIONS)
    if refused:
        raise ConfigError(f"ringtop.Monitor does not take {', '.join(refused)}: the script's own loop decides "
                          f"that. It takes {', '.join(sorted(OPTIONS))}")
    return config_from_options(given)


class MonitoredRun(Runner):
    """The Runner's watching half, over a loop it does not run: the commands it cannot carry out
    for such a loop are answered here."""

    def __init__(self, cfg: AgentConfig, ctx: DistContext, loop: OwnLoop, model_name: str) -> None:
        super().__init__(cfg, ctx)
        self.strategy = loop
        self.model_name = model_name
        self.save_fn: SaveFunction | None = None

    def _hello(self):
        lr = self.strategy.optimizer.param_groups[0].get("lr", 0.0) if self.strategy.optimizer.param_groups else 0.0
        return msgspec.structs.replace(super()._hello(), model=self.model_name, batch_size=0, seq_len=0, steps=0,
                                       seed=0, lr=float(lr) if isinstance(lr, (int, float)) else 0.0)

    def snapshot(self) -> dict[str, Any]:
        return {**super().snapshot(), "loop": "own"}

    def _command_switch(self, pending: PendingCommand) -> dict[str, Any]:
        raise RuntimeError(f"{NOT_OWNED}: it cannot switch its strategy; change the wrapping in the script and "
                           "start it again")

    def _command_set(self, pending: PendingCommand) -> dict[str, Any]:
        raise RuntimeError(f"{NOT_OWNED}: its micro-batches are the script's")

    def _command_checkpoint(self, pending: PendingCommand) -> dict[str, Any]:
        """On every rank at the same boundary: the script's save function writes into a temporary
        folder; once it returned on every rank, rank 0 renames it and points `latest` at it (the
        agent's atomic convention). A failure on any rank is the command's error on all."""
        if self.save_fn is None:
            raise RuntimeError("no save function registered: call mon.on_checkpoint(fn) in the script, "
                               "fn(directory, step)")
        if self.step == 0:
            raise RuntimeError("nothing to save before step 1")
        started = time.perf_counter()
        directory = Path(self.cfg.checkpoint_dir)
        tmp = ckpt.temporary_path(directory, self.step, USER_KIND)
        final = directory / ckpt.checkpoint_name(self.step, USER_KIND)
        if self.ctx.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self._barrier()
        error = ""
        try:
            self.save_fn(tmp, self.step)
        except Exception as exc:  # the script's function: its failure is the command's error, not the run's
            error = f"{type(exc).__name__}: {exc}"
        failed = self._gather_errors(error)
        if failed:
            if self.ctx.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            rank, text = failed[0]
            raise RuntimeError(f"the save function failed on rank {rank}: {text}")
        if self.ctx.rank == 0:
            ckpt.finish_user(tmp, self.step, {"run_id": self.run_id, "strategy": self.strategy.describe(),
                                              "world_size": self.ctx.world_size, "model": self.model_name,
                                              "saved_at": time.time()})
            ckpt.publish(tmp, final)
        self._barrier()
        if self.ctx.rank != 0:
            return {}
        return self._saved(ckpt.SavedCheckpoint(str(final), self.step, USER_KIND, ckpt.dir_bytes(final),
                                                time.perf_counter() - started))

    def _barrier(self) -> None:
        if self.control_group is not None:
            dist.barrier(group=self.control_group)

    def _gather_errors(self, error: str) -> list[tuple[int, str]]:
        mine = error.encode()[:ERROR_BYTES]
        if self.control_group is None:
            everyone = [mine]
        else:
            everyone = all_gather_fixed(mine, ERROR_BYTES, self.ctx.world_size, self.control_group)
        return [(r, e.decode(errors="replace")) for r, e in enumerate(everyone) if e]


class StepHandle:
    """What `with mon.step() as step:` gives the loop: set `step.loss` (a tensor, read later, off
    the step path), and `step.tokens` / `step.grad_norm` where the monitor cannot see them."""

    __slots__ = ("loss", "tokens", "grad_norm")

    def __init__(self) -> None:
        self.loss: torch.Tensor | None = None
        self.tokens: int | None = None
        self.grad_norm: Any = None


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
    step)`: what the UI's checkpoint runs on every rank (also `on_checkpoint`). `flops_per_token`:
    the model's training FLOPs per token for TFLOP/s and MFU (the built-in tiny-gpt is counted by
    itself). Other options: the agent's telemetry and checkpoint flags by their field names
    (`log_dir`, `publish`, `relay`, `control`, `insecure`, `allow_remote`, `run_id`, `print_every`,
    `stall_factor`, `stall_floor_s`, `link_gbps`, `peak_tflops`, `dtype`, `metrics`,
    `checkpoint_dir`), or as flags in the `RINGTOP_ARGS` environment variable."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 save_fn: SaveFunction | None = None, flops_per_token: float = 0.0, fsdp_sharding: str = "full",
                 **options: Any) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise MonitorError("ringtop.Monitor needs the process group first: call "
                               "torch.distributed.init_process_group() (under torchrun) before it")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise MonitorError(f"ringtop.Monitor: optimizer must be a torch.optim.Optimizer, got "
                               f"{type(optimizer).__name__}")
        if fsdp_sharding not in ("full", "grad-op", "no-shard"):
            raise MonitorError(f"ringtop.Monitor(fsdp_sharding={fsdp_sharding!r}): one of full, grad-op, no-shard")
        cfg = monitor_config(options, os.environ.get(ARGS_ENV, ""))
        loop = OwnLoop(model, optimizer, fsdp_sharding)
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
        if not isinstance(flops_per_token, (int, float)) or flops_per_token < 0:
            raise MonitorError(f"ringtop.Monitor(flops_per_token={flops_per_token!r}): a number >= 0")
        run.flops = (FlopsPerToken(float(flops_per_token), "given to ringtop.Monitor") if flops_per_token > 0
                     else FlopsPerToken(0.0, "not counted: pass flops_per_token= to ringtop.Monitor"))
        collective_hooks.install()
        self._closed = False
        self._lock = threading.Lock()
        try:
            run._start_watching(None)
            loop.listen()
        except BaseException as exc:  # half started: let go of what did start, then say why
            run.control_group = None
            run._shutdown(Bye(reason=f"error: {type(exc).__name__}: {exc}"[:500], ok=False))
            raise
        if loop.comm_note:
            run._event("warn", "comm", loop.comm_note)
        self._clock = StepClock(device)
        self._phases = _WatchedPhases(self._clock, run.watch)
        self._state: str | None = None
        """None between steps; "implicit": opened by the previous `step_end`; "explicit": by `step()`."""
        self._recording: contextlib.AbstractContextManager | None = None
        atexit.register(self._at_exit)
        self._open(implicit=True)

    # ------------------------------------------------------------------ the loop's side

    @contextlib.contextmanager
    def step(self) -> Iterator[StepHandle]:
        """One training step: forward, backward and optimizer step inside the block."""
        handle = StepHandle()
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
        self._end(handle.loss, handle.tokens, handle.grad_norm)
        self._run.watch.between()

    def step_end(self, loss: torch.Tensor | None = None, tokens: int | None = None, grad_norm: Any = None) -> None:
        """For a loop without `with mon.step()`: the step since the previous call (or the Monitor's
        creation) is done; the next one starts now."""
        if self._closed:
            return
        if self._state is None:
            self._open(implicit=True)
        self._end(loss, tokens, grad_norm)
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
        self._run._step_boundary()
        self._state = "implicit" if implicit else "explicit"
        self._start_clock()
        self._recording = collective_hooks.active(self._run.tracer)
        self._recording.__enter__()

    def _start_clock(self) -> None:
        self._clock.begin()
        self._loop.open_step(self._phases)

    def _end(self, loss: Any, tokens: int | None, grad_norm: Any) -> None:
        if self._closed or self._state is None:
            return
        self._stop_recording()
        counted = self._loop.close_step()
        self._state = None
        run = self._run
        run.step += 1
        self._loop.set_grad_norm(grad_norm)
        if run.node_relay is not None:
            run._keep_node_relay()
        loss_tensor = loss if isinstance(loss, torch.Tensor) else (None if loss is None else torch.tensor(float(loss)))
        run._record_step(loss_tensor, self._clock, counted if tokens is None else int(tokens))
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
                run._end_loop()
            except Exception as exc:  # a peer gone meanwhile: still let go of everything here
                error, collective = exc, False
        if not collective:
            run.control_group = None  # no barrier with peers that may be gone
            if run.watch is not None:
                run.watch.idle()
            run._publish_ready_steps(wait=True)
        if error is not None:
            bye = Bye(reason=f"error: {type(error).__name__}: {error}"[:500], ok=False, step=run.step)
        else:
            bye = Bye(reason=run.stop_reason or f"completed {run.step} steps", ok=True, step=run.step)
        on_main = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGTERM) if on_main else None
        try:
            run._shutdown(bye)
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
