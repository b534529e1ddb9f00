"""Full and sharded checkpoints, written atomically, readable into any strategy and world size.

Full (`step-NNNNNNNN-full/`): consolidated on rank 0. `model.safetensors` holds the weights (plain
tools read it; a tied weight is stored once and its other names listed in the file's metadata),
`state.pt` the optimizer state (torch's full layout, fully qualified names), step, RNG and meta
(`torch.load` reads it with its default, weights-only settings), `meta.json` the run facts.

Sharded (`step-NNNNNNNN-sharded/`): a `torch.distributed.checkpoint` directory written by all ranks
in parallel (FSDP ranks write their own shards; replicated state is split among ranks by DCP's
de-duplication), plus `meta.json`.

Both are written under a temporary name inside the opened checkpoint folder, with files created
exclusively and no link followed (protocol/safe_files.py), flushed and fsynced, then renamed, and the
`latest` pointer is replaced last: a crash at any moment leaves the previous checkpoint whole. Reading either
kind gives the full state on every rank, so a run can resume into any strategy and world size.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ringtop.protocol import safe_files

FULL, SHARDED = "full", "sharded"
FORMATS = {FULL: "ringtop.full/2", SHARDED: "ringtop.sharded/1"}
LATEST = "latest"
AUTO = "auto"
MODEL_FILE, STATE_FILE, META_FILE = "model.safetensors", "state.pt", "meta.json"


class CheckpointError(RuntimeError):
    pass


@dataclass(frozen=True)
class SavedCheckpoint:
    path: str
    step: int
    kind: str
    bytes: int
    seconds: float


def checkpoint_name(step: int, kind: str) -> str:
    return f"step-{step:08d}-{kind}"


def temporary_path(directory: Path, step: int, kind: str) -> Path:
    """The same on every rank (a sharded save writes into it from all of them)."""
    return directory / temporary_name(step, kind)


def temporary_name(step: int, kind: str) -> str:
    return f".{checkpoint_name(step, kind)}.tmp"


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ---------------------------------------------------------------- writing
# Every write is relative to an opened, verified folder (protocol/safe_files.py): nothing planted in
# the checkpoint folder (a link at a temporary or final name) can redirect it.


def write_full(tmp_fd: int, step: int, model_state: dict[str, Any], optim_state: dict[str, Any],
               meta: dict[str, Any], fault: Callable[[str], None] | None = None) -> None:
    """Rank 0: every file of a full checkpoint into the fresh folder `tmp_fd` (not yet visible).
    `fault`, called between the files, is the tests' way to fail inside the writer."""
    from safetensors.torch import save

    tensors, aliases, by_storage = {}, {}, {}
    for name, tensor in model_state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in by_storage:
            aliases[name] = by_storage[key]
        else:
            by_storage[key] = name
            tensors[name] = tensor.detach().contiguous().cpu()
    _write_file(tmp_fd, MODEL_FILE, save(tensors, metadata={"format": FORMATS[FULL], "aliases": json.dumps(aliases)}))
    if fault is not None:
        fault("write")
    state = {"format": FORMATS[FULL], "step": step, "optimizer": optim_state, "meta": meta,
             "rng": {"torch": torch.get_rng_state()}}
    with safe_files.create(tmp_fd, STATE_FILE) as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    _write_meta(tmp_fd, {**meta, "format": FORMATS[FULL], "kind": FULL, "step": step})
    os.fsync(tmp_fd)


def publish(dir_fd: int, tmp_name: str, final_name: str) -> None:
    """Make a written checkpoint visible: rename inside the checkpoint folder, then point `latest`
    at it. A real folder of this user's at the final name (the same step saved again) is replaced;
    anything else there (a link) is not this run's to remove, and the save fails."""
    standing = safe_files.entry_kind(dir_fd, final_name)
    if standing in ("link", "other"):
        raise CheckpointError(f"{final_name} already exists and is not a checkpoint folder of this user's "
                              f"({'a symbolic link' if standing == 'link' else 'not a folder of this user'}); "
                              "left alone")
    aside = None
    if standing == "dir":
        aside = safe_files.temporary_name(final_name)
        os.rename(final_name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.rename(tmp_name, final_name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    safe_files.write_atomic(dir_fd, LATEST, (final_name + "\n").encode())
    if aside is not None:
        safe_files.remove_tree(dir_fd, aside)


def _write_file(dir_fd: int, name: str, data: bytes) -> None:
    with safe_files.create(dir_fd, name) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_meta(dir_fd: int, meta: dict[str, Any]) -> None:
    _write_file(dir_fd, META_FILE, json.dumps(meta, indent=1, sort_keys=True, default=str).encode())


def _fsync(path: Path) -> None:
    """A file's data, or a directory's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def finish_sharded(tmp_fd: int, step: int, meta: dict[str, Any]) -> int:
    """Rank 0, after every rank's DCP write: the meta file, every file fsynced and private; the bytes."""
    _write_meta(tmp_fd, {**meta, "format": FORMATS[SHARDED], "kind": SHARDED, "step": step})
    return safe_files.finish_tree(tmp_fd)


USER = "user"
"""A folder a script's own save function wrote (ringtop.Monitor): `step-NNNNNNNN-user/`."""
USER_FORMAT = "ringtop.user/1"


def finish_user(tmp_fd: int, step: int, meta: dict[str, Any]) -> int:
    """Rank 0, after every rank's save function returned: the meta file, fsynced with the files; the bytes."""
    _write_meta(tmp_fd, {**meta, "format": USER_FORMAT, "kind": USER, "step": step})
    return safe_files.finish_tree(tmp_fd)


# ---------------------------------------------------------------- reading


class NoCheckpointYet(CheckpointError):
    """`--resume auto` found no checkpoint: the run's first attempt starts fresh."""


def resolve(spec: str, checkpoint_dir: str | os.PathLike) -> Path:
    """`latest` (in the checkpoint dir), a checkpoint directory, or a directory holding a `latest`;
    `auto`: as `latest`, raising NoCheckpointYet where there is none (so a run under a launcher's
    restarts resumes from its last checkpoint, and its first attempt starts fresh)."""
    path = Path(checkpoint_dir) if spec in (LATEST, AUTO) else Path(spec)
    if spec == AUTO and not (path / LATEST).exists():
        raise NoCheckpointYet(f"no checkpoint in {path} yet")
    if path.is_dir() and not (path / META_FILE).exists():
        pointer = path / LATEST
        if not pointer.exists():
            raise CheckpointError(f"no checkpoint in {path}: it has no '{LATEST}' pointer")
        path = path / pointer.read_text().strip()
    if not (path / META_FILE).exists():
        raise CheckpointError(f"{path} is not a ringtop checkpoint (no {META_FILE})")
    return path


def read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {path / META_FILE}: {exc}") from exc
    if meta.get("format") == USER_FORMAT:
        raise CheckpointError(f"{path}: written by a script's own save function (ringtop.Monitor), step "
                              f"{meta.get('step')}; its files are the script's to read")
    if meta.get("format") not in FORMATS.values():
        raise CheckpointError(f"{path}: unknown checkpoint format {meta.get('format')!r}")
    return meta


def load_full_files(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(model state, optimizer state, the state file's payload) of a full checkpoint."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        model_state = load_file(str(path / MODEL_FILE))
        with safe_open(str(path / MODEL_FILE), framework="pt") as f:
            aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
        payload = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    for alias, name in aliases.items():
        model_state[alias] = model_state[name]
    return model_state, payload["optimizer"], payload


def load_sharded_into(path: Path, template: dict[str, Any], group=None, no_dist: bool = False) -> None:
    """Fill a full-sized template ({"model": ..., "optim": ...}) from a DCP directory, whatever
    the world size and wrapping it was written with (DCP reshards)."""
    import torch.distributed.checkpoint as dcp

    try:
        dcp.load(template, checkpoint_id=str(path), process_group=group, no_dist=no_dist)
    except Exception as exc:
        raise CheckpointError(f"cannot read sharded checkpoint {path}: {exc}") from exc
