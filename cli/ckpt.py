"""`ringtop ckpt info PATH` and `ringtop ckpt consolidate SHARDED_DIR OUT` (these need torch)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path


def _info(path: str) -> int:
    from ringtop.agent.checkpoints import format as ckpt
    from ringtop.metrics.fmt import nbytes

    where = ckpt.resolve(path, path)
    meta = ckpt.read_meta(where)
    print(f"{where}  ({meta['kind']} checkpoint, {nbytes(ckpt.dir_bytes(where))} on disk)")
    for key in ("step", "samples_seen", "strategy", "strategy_options", "world_size", "model", "model_size",
                "param_count", "dtype", "batch_size", "seq_len", "lr", "seed", "data", "run_id", "torch_version"):
        if key in meta:
            print(f"  {key:<17} {meta[key]}")
    tensors = _tensor_summary(where, meta["kind"])
    print(f"  {'tensors':<17} {tensors[0]} ({nbytes(tensors[1])})")
    return 0


def _tensor_summary(where: Path, kind: str) -> tuple[int, int]:
    if kind == "full":
        from safetensors import safe_open

        with safe_open(str(where / "model.safetensors"), framework="pt") as f:
            shapes = [f.get_slice(k).get_shape() for k in f.keys()]
        sizes = [4 * _numel(s) for s in shapes]
        return len(shapes), sum(sizes)
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(where)).read_metadata()
    items = [m for m in metadata.state_dict_metadata.values() if isinstance(m, TensorStorageMetadata)]
    return len(items), sum(_numel(m.size) * m.properties.dtype.itemsize for m in items)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _consolidate(sharded: str, out: str) -> int:
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from ringtop.agent.checkpoints import format as ckpt
    from ringtop.protocol import safe_files

    source = ckpt.resolve(sharded, sharded)
    meta = ckpt.read_meta(source)
    if meta["kind"] != ckpt.SHARDED:
        raise ckpt.CheckpointError(f"{source} is already a full checkpoint")
    with tempfile.TemporaryDirectory() as tmp:
        flat = Path(tmp) / "state.pt"
        dcp_to_torch_save(str(source), str(flat))
        state = torch.load(flat, weights_only=False)
    target = Path(out)
    if target.exists():
        raise ckpt.CheckpointError(f"{target} exists; choose a new path")
    folder = safe_files.open_dir(target.parent, what="output folder")
    scratch = safe_files.temporary_name(target.name)
    try:
        scratch_fd = safe_files.make_dir(folder, scratch)
        try:
            ckpt.write_full(scratch_fd, int(meta["step"]), state["model"], state["optim"],
                            {**meta, "consolidated_from": str(source)})
        finally:
            os.close(scratch_fd)
        os.rename(scratch, target.name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        safe_files.remove_tree(folder, scratch)
        raise
    finally:
        os.close(folder)
    print(f"wrote {target} (full checkpoint of step {meta['step']} from {source})")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ringtop ckpt", description="inspect and convert checkpoints")
    sub = parser.add_subparsers(dest="verb", required=True)
    info = sub.add_parser("info", help="what a checkpoint holds")
    info.add_argument("path", help="a checkpoint directory, or a checkpoint dir with a 'latest' pointer")
    cons = sub.add_parser("consolidate", help="turn a sharded checkpoint into a full one")
    cons.add_argument("sharded")
    cons.add_argument("out")
    args = parser.parse_args(argv)
    from ringtop.agent.checkpoints.format import CheckpointError

    try:
        if args.verb == "info":
            return _info(args.path)
        return _consolidate(args.sharded, args.out)
    except CheckpointError as exc:
        print(f"ringtop ckpt: error: {exc}", file=sys.stderr)
        return 2
