"""`torchrun --nproc_per_node=N -m ringtop.agent [options]`: one training rank."""

from __future__ import annotations

import os
import sys

import torch.distributed as dist

from ringtop.strategies.base import StrategyError

from .checkpoint_format import CheckpointError
from .config import ConfigError, parse_agent_args
from .distributed import DeviceError, exit_rank, init_distributed
from .factories import FactoryError
from .lifecycle import EXIT_WITH_PARENT_ENV, exit_with_parent
from .runner import EXIT_STOPPED_WHILE_STUCK, Interrupted, Runner
from .stall_watch import StoppedWhileStuck


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rank = os.environ.get("RANK", "0")
    if os.environ.get(EXIT_WITH_PARENT_ENV) == "1":
        parent = os.getppid()
        exit_with_parent()  # the launcher dies (even SIGKILLed): this rank gets SIGTERM, stops cleanly
        if os.getppid() != parent:  # it died before we asked
            print(f"ringtop agent [rank {rank}]: the launcher is gone; not starting", file=sys.stderr)
            return 1
    try:
        cfg = parse_agent_args(argv)
    except ConfigError as exc:
        print(f"ringtop agent: error: {exc}", file=sys.stderr)
        return 2
    try:
        ctx = init_distributed(cfg.device, cfg.dist_timeout_s)
    except DeviceError as exc:
        print(f"ringtop agent [rank {rank}]: error: {exc}", file=sys.stderr)
        return 2
    try:
        return Runner(cfg, ctx).run()
    except (StrategyError, FactoryError, CheckpointError, ConfigError, OSError) as exc:
        print(f"ringtop agent [rank {rank}]: error: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Interrupted):
        print(f"ringtop agent [rank {rank}]: interrupted", file=sys.stderr)
        return 130
    except StoppedWhileStuck:  # raised again after the shutdown it interrupted had its say
        return EXIT_STOPPED_WHILE_STUCK
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    exit_rank(main())
