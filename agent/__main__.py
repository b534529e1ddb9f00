"""`torchrun --nproc_per_node=N -m ringtop.agent [options]`: one training rank."""

from __future__ import annotations

import os
import sys

import torch.distributed as dist

from ringtop.agent.checkpoints.format import CheckpointError
from ringtop.agent.config import ConfigError, parse_agent_args
from ringtop.agent.distributed import DeviceError, exit_rank, init_distributed
from ringtop.agent.health.stall_watch import StoppedWhileStuck
from ringtop.agent.lifecycle import EXIT_WITH_PARENT_ENV, exit_with_parent
from ringtop.agent.loop.goodbye import EXIT_STOPPED_WHILE_STUCK
from ringtop.agent.loop.runner import Interrupted, Runner
from ringtop.agent.models.factories import FactoryError
from ringtop.protocol import safe_files
from ringtop.strategies.base import StrategyError


def say(line: str) -> None:
    """One line on stderr in one write: the ranks share the launcher's pipe, and a line written in
    two parts (text, then its newline) interleaves with another rank's."""
    data = (line[:3000] + "\n").encode(errors="replace")  # under PIPE_BUF: one atomic write
    try:
        sys.stderr.flush()
        os.write(sys.stderr.fileno(), data)
    except (OSError, ValueError, AttributeError):  # no file descriptor under it (a test's capture)
        try:
            print(line, file=sys.stderr)
        except (OSError, ValueError):
            pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rank = os.environ.get("RANK", "0")
    if os.environ.get(EXIT_WITH_PARENT_ENV) == "1":
        parent = os.getppid()
        exit_with_parent()  # the launcher dies (even SIGKILLed): this rank gets SIGTERM, stops cleanly
        if os.getppid() != parent:  # it died before we asked
            say(f"ringtop agent [rank {rank}]: the launcher is gone; not starting")
            return 1
    try:
        cfg = parse_agent_args(argv)
    except ConfigError as exc:
        say(f"ringtop agent: error: {exc}")
        return 2
    try:
        ctx = init_distributed(cfg.device, cfg.dist_timeout_s)
    except DeviceError as exc:
        say(f"ringtop agent [rank {rank}]: error: {exc}")
        return 2
    safe_files.set_group_readable(cfg.group_readable)
    os.umask(safe_files.process_umask())  # what a path-only writer (DCP, the profiler) makes is private too
    try:
        return Runner(cfg, ctx).run()
    except (StrategyError, FactoryError, CheckpointError, ConfigError, OSError) as exc:
        say(f"ringtop agent [rank {rank}]: error: {exc}")
        return 2
    except (KeyboardInterrupt, Interrupted):
        say(f"ringtop agent [rank {rank}]: interrupted")
        return 130
    except StoppedWhileStuck:  # raised again after the shutdown it interrupted had its say
        return EXIT_STOPPED_WHILE_STUCK
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    exit_rank(main())
