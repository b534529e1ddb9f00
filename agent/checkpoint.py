"""Full (consolidated) checkpoints: one `torch.save` file on rank 0 that plain `torch.load` reads.

Written under a temporary name, flushed and fsynced, then renamed; the `latest` pointer is
replaced last. A crash at any moment leaves the previous checkpoint whole and loadable.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

FORMAT = "ringtop.full/1"
LATEST = "latest"


class CheckpointError(RuntimeError):
    pass


@dataclass(frozen=True)
class SavedCheckpoint:
    path: str
    step: int
    bytes: int
    seconds: float


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def save_full(
    directory: str | os.PathLike,
    step: int,
    model_state: dict[str, Any],
    optim_state: dict[str, Any],
    meta: dict[str, Any],
) -> SavedCheckpoint:
    """Rank 0 only. `step` is the number of optimizer steps taken; resuming starts there."""
    t0 = time.perf_counter()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / checkpoint_name(step)
    tmp = directory / f".{final.name}.tmp-{os.getpid()}"
    payload = {
        "format": FORMAT,
        "step": step,
        "model": model_state,
        "optimizer": optim_state,
        "meta": meta,
        "rng": {"torch": torch.get_rng_state()},
    }
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _write_atomic(directory / LATEST, final.name + "\n")
        _fsync_dir(directory)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return SavedCheckpoint(str(final), step, final.stat().st_size, time.perf_counter() - t0)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def resolve(spec: str, checkpoint_dir: str | os.PathLike) -> Path:
    """`latest` (in the checkpoint dir), a checkpoint directory (its `latest`), or a file."""
    path = Path(checkpoint_dir) if spec == LATEST else Path(spec)
    if path.is_dir():
        pointer = path / LATEST
        if not pointer.exists():
            raise CheckpointError(f"no checkpoint in {path}: it has no '{LATEST}' pointer")
        path = path / pointer.read_text().strip()
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    return path


def load_full(path: Path) -> dict[str, Any]:
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a ringtop full checkpoint (format {FORMAT})")
    return payload
