"""`python -m ringtop.agent` with timers around the coarse phases of start-up, switching and saving.

A benchmark's entry point (run under torch's elastic launcher in place of `-m ringtop.agent`): it
wraps a fixed list of functions, none of them on the per-step path, so that a benchmark can say
where a slow switch, save or start-up spends its time. Each finished call appends one JSON line to
`$RINGTOP_BENCH_PHASES/rank-R.jsonl`: {"phase", "start" (time.time()), "s", "depth"} (a recursive
call is counted once, in its outermost call). Nothing in
the agent is changed; with RINGTOP_BENCH_PHASES unset this is `python -m ringtop.agent`.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import threading
import time

T_PROCESS = time.time()

_local = threading.local()
_out = None


def _record(phase: str, start: float, seconds: float, depth: int, **extra) -> None:
    if _out is None:
        return
    line = json.dumps({"phase": phase, "start": round(start, 6), "s": round(seconds, 6), "depth": depth,
                       "thread": threading.current_thread().name, **extra})
    with _lock:
        _out.write(line + "\n")
        _out.flush()


_lock = threading.Lock()


def _timed(phase: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        active = _local.__dict__.setdefault("active", set())
        if phase in active:  # a recursive call: counted in the outermost one
            return fn(*args, **kwargs)
        active.add(phase)
        depth = getattr(_local, "depth", 0)
        _local.depth = depth + 1
        extra = {}
        if phase.endswith(".setup"):
            extra["deepspeed_imported_before"] = "deepspeed" in sys.modules
        t0, w0 = time.perf_counter(), time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            _local.depth = depth
            active.discard(phase)
            _record(phase, w0, time.perf_counter() - t0, depth, **extra)
    return wrapper


def _patch(module_name: str, attr_path: str, label: str | None = None) -> None:
    """Wrap module.attr or module.Class.method (only where the class defines it itself)."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return
    owner, *rest = attr_path.split(".")
    if rest:
        cls = getattr(module, owner, None)
        if cls is None or rest[0] not in cls.__dict__:
            return
        setattr(cls, rest[0], _timed(label or attr_path, cls.__dict__[rest[0]]))
    elif hasattr(module, owner):
        setattr(module, owner, _timed(label or attr_path, getattr(module, owner)))


STRATEGY_METHODS = ("setup", "full_state_dict", "sharded_state_dict", "load_full_state_dict", "stage_full_state_dict",
                    "teardown")
STRATEGY_CLASSES = (
    ("ringtop.strategies.torch_native", "TorchNativeStrategy"),
    ("ringtop.strategies.ddp", "DDPStrategy"),
    ("ringtop.strategies.fsdp", "FSDPStrategy"),
    ("ringtop.strategies.zero", "ZeroStrategy"),
    ("ringtop.strategies.zero", "Zero1Strategy"),
    ("ringtop.strategies.zero", "Zero2Strategy"),
    ("ringtop.strategies.zero", "Zero3Strategy"),
)


def install() -> None:
    for module, cls in STRATEGY_CLASSES:
        for method in STRATEGY_METHODS:
            _patch(module, f"{cls}.{method}", f"{cls}.{method}")
    # switching
    _patch("ringtop.agent.loop.switching", "build_strategy", "switch.build_strategy")
    _patch("ringtop.agent.loop.switching", "full_state_everywhere", "switch.full_state_everywhere")
    _patch("ringtop.agent.loop.switching", "all_ranks_ok", "switch.all_ranks_ok")
    _patch("ringtop.agent.loop.switching", "trim_heap", "switch.trim_heap")
    _patch("ringtop.agent.loop.switching", "switch_strategy", "switch.total")
    _patch("torch.distributed", "broadcast_object_list", "dist.broadcast_object_list")
    # the runner
    _patch("ringtop.agent.loop.build", "build_model", "runner.build_model")
    _patch("ringtop.agent.loop.build", "read_resume", "runner.read_resume")
    _patch("ringtop.agent.loop.runner", "Runner._start_telemetry", "runner.start_telemetry")
    _patch("ringtop.agent.loop.commands", "Commands.save", "runner.checkpoint_command")
    _patch("ringtop.agent.loop.commands", "Commands.switch", "runner.switch_command")
    _patch("ringtop.agent.loop.goodbye", "Goodbye.shutdown", "runner.shutdown")
    # checkpoints
    _patch("ringtop.agent.checkpoints.saver", "CheckpointManager.save", "ckpt.save")
    _patch("ringtop.agent.checkpoints.saver", "CheckpointManager._publish", "ckpt.publish_step")
    _patch("ringtop.agent.checkpoints.saver", "CheckpointManager._barrier", "ckpt.barrier")
    _patch("ringtop.agent.checkpoints.saver", "detached_copy", "ckpt.detached_copy")
    _patch("ringtop.agent.checkpoints.format", "write_full", "ckpt.write_full")
    _patch("ringtop.agent.checkpoints.format", "finish_sharded", "ckpt.finish_sharded")
    _patch("ringtop.agent.checkpoints.format", "publish", "ckpt.rename_and_latest")
    _patch("ringtop.agent.checkpoints.format", "dir_bytes", "ckpt.dir_bytes")
    _patch("ringtop.agent.checkpoints.format", "_fsync", "ckpt.fsync_file")
    _patch("ringtop.agent.checkpoints.format", "load_full_files", "ckpt.load_full_files")
    _patch("ringtop.agent.checkpoints.format", "load_sharded_into", "ckpt.load_sharded_into")
    _patch("safetensors.torch", "save_file", "ckpt.safetensors_save_file")
    _patch("torch", "save", "torch.save")
    _patch("torch.distributed.checkpoint", "save", "dcp.save")
    # start-up
    _patch("ringtop.agent.__main__", "init_distributed", "startup.init_distributed")
    _patch("deepspeed", "initialize", "deepspeed.initialize") if "deepspeed" in sys.modules else None


def main() -> int:
    global _out
    t_imports = time.perf_counter()
    directory = os.environ.get("RINGTOP_BENCH_PHASES")
    if directory:
        os.makedirs(directory, exist_ok=True)
        _out = open(os.path.join(directory, f"rank-{os.environ.get('RANK', '0')}.jsonl"), "a")  # noqa: SIM115 (process lifetime)
        install()
        _record("startup.process_to_imports_done", T_PROCESS, time.time() - T_PROCESS, 0,
                 install_s=round(time.perf_counter() - t_imports, 6))
    from ringtop.agent.__main__ import main as agent_main

    return agent_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
