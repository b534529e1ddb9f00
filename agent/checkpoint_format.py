"""Full and sharded checkpoints, written atomically, readable into any strategy and world size.

Full (`step-NNNNNNNN-full/`): consolidated on rank 0. `model.safetensors` holds the weights (plain
tools read it; a tied weight is stored once and its other names listed in the file's metadata),
`state.pt` the optimizer state (torch's full layout, fully qualified names), step, RNG and meta
(`torch.load` reads it with its default, weights-only settings), `meta.json` the run facts.

Sharded (`step-NNNNNNNN-sharded/`): a `torch.distributed.checkpoint` directory written by all ranks
in parallel (FSDP ranks write their own shards; replicated state is split among ranks by DCP's
de-duplication), plus `meta.json`.

Both are written under a temporary name, flushed and fsynced, then renamed, and the `latest`
pointer is replaced last: a crash at any moment leaves the previous checkpoint whole. Reading either
kind gives the full state on every rank, so a run can resume into any strategy and world size.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

FULL, SHARDED = "full", "sharded"
FORMATS = {FULL: "ringtop.full/2", SHARDED: "ringtop.sharded/1"}
LATEST = "latest"
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
    return directory / f".{checkpoint_name(step, kind)}.tmp"


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ---------------------------------------------------------------- writing


def write_full(tmp: Path, step: int, model_state: dict[str, Any], optim_state: dict[str, Any],
               meta: dict[str, Any]) -> None:
    """Rank 0: every file of a full checkpoint into `tmp` (not yet visible)."""
    from safetensors.torch import save_file

    tmp.mkdir(parents=True, exist_ok=True)
    tensors, aliases, by_storage = {}, {}, {}
    for name, tensor in model_state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in by_storage:
            aliases[name] = by_storage[key]
        else:
            by_storage[key] = name
            tensors[name] = tensor.detach().contiguous().cpu()
    save_file(tensors, str(tmp / MODEL_FILE), metadata={"format": FORMATS[FULL], "aliases": json.dumps(aliases)})
    state = {"format": FORMATS[FULL], "step": step, "optimizer": optim_state, "meta": meta,
             "rng": {"torch": torch.get_rng_state()}}
    with open(tmp / STATE_FILE, "wb") as f:
        torch.save(state, f)
    _write_meta(tmp, {**meta, "format": FORMATS[FULL], "kind": FULL, "step": step})
    for name in (MODEL_FILE, STATE_FILE, META_FILE):
        _fsync(tmp / name)


def publish(tmp: Path, final: Path) -> None:
    """Make a written checkpoint visible: rename, then point `latest` at it."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_atomic(final.parent / LATEST, final.name + "\n")
    _fsync(final.parent)


def _write_meta(directory: Path, meta: dict[str, Any]) -> None:
    (directory / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))


def _fsync(path: Path) -> None:
    """A file's data, or a directory's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def finish_sharded(tmp: Path, step: int, meta: dict[str, Any]) -> None:
    """Rank 0, after every rank's DCP write: the meta file, fsynced with the shards."""
    _write_meta(tmp, {**meta, "format": FORMATS[SHARDED], "kind": SHARDED, "step": step})
    for f in tmp.rglob("*"):
        if f.is_file():
            _fsync(f)


USER = "user"
"""A folder a script's own save function wrote (ringtop.Monitor): `step-NNNNNNNN-user/`."""
USER_FORMAT = "ringtop.user/1"


def finish_user(tmp: Path, step: int, meta: dict[str, Any]) -> None:
    """Rank 0, after every rank's save function returned: the meta file, fsynced with the files."""
    _write_meta(tmp, {**meta, "format": USER_FORMAT, "kind": USER, "step": step})
    for f in tmp.rglob("*"):
        if f.is_file():
            _fsync(f)


# ---------------------------------------------------------------- reading


def resolve(spec: str, checkpoint_dir: str | os.PathLike) -> Path:
    """`latest` (in the checkpoint dir), a checkpoint directory, or a directory holding a `latest`."""
    path = Path(checkpoint_dir) if spec == LATEST else Path(spec)
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
