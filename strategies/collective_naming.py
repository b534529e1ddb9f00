"""What a traced collective is called and how big it is: its payload's bytes and shapes digest,
its process group's name (by members, the same on every member) and the mesh dimension that group
is on. Shared by `collective_hooks` (torch.distributed's calls, DDP's hook) and
`collective_functional` (DTensor's)."""

from __future__ import annotations

import zlib
from typing import Any

import torch
import torch.distributed as dist

from ringtop.metrics import rank_sets
from ringtop.metrics.rank_sets import WORLD


def nbytes(t: Any) -> int:
    """A payload's bytes: a tensor's, or the sum over a list of them."""
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (list, tuple)):
        return sum(nbytes(x) for x in t)
    return 0


def first_tensor(t: Any) -> torch.Tensor | None:
    """The payload's first tensor (which says where it lives: host or device)."""
    if isinstance(t, torch.Tensor):
        return t
    if isinstance(t, (list, tuple)):
        for x in t:
            if (found := first_tensor(x)) is not None:
                return found
    return None


MAX_SHAPES_HASHED = 8
"""A list payload's shapes digest covers its first tensors and its length (an all_gather's list
of a thousand equal tensors costs no more than eight)."""


def shapes_digest(t: Any) -> str:
    """8 hex digits of the payload's dtypes and shapes: equal on ranks that issue the same call."""
    if isinstance(t, torch.Tensor):
        text = f"{t.dtype}{tuple(t.shape)}"
    elif isinstance(t, (list, tuple)):
        text = f"{len(t)}:" + ";".join(f"{x.dtype}{tuple(x.shape)}" for x in t[:MAX_SHAPES_HASHED]
                                       if isinstance(x, torch.Tensor))
    else:
        return ""
    return f"{zlib.crc32(text.encode()):08x}"


_group_names: dict[int, tuple[Any, str]] = {}


def group_name(group: Any) -> str:
    """The process group named by its members (`world`, `0-3`, ...: metrics.rank_sets), the same
    on every member; cached per group object."""
    cached = _group_names.get(id(group))
    if cached is not None and cached[0] is group:
        return cached[1]
    try:
        if group is None or group is dist.group.WORLD:
            name = WORLD
        else:
            name = rank_sets.group_name(dist.get_process_group_ranks(group), dist.get_world_size())
    except Exception:  # noqa: BLE001 - not a member, or no default group: still a name, never a failure
        name = f"group-{id(group):x}"
    _group_names[id(group)] = (group, name)
    return name


_dimensions: dict[str, str] = {}
"""This rank's groups named by a device mesh: group name -> its dimension (tp, dp, pp)."""


def name_mesh_dimensions(mesh: Any) -> None:
    """Name this rank's group on each of `mesh`'s named dimensions, for CommStat.group (the Comm
    tab's split by group). Replaces what an earlier strategy named (None: names nothing); a
    dimension whose group is the whole world, or one rank, stays unnamed, so a 1D run is as before."""
    names: dict[str, str] = {}
    for index, dim in enumerate(getattr(mesh, "mesh_dim_names", None) or ()):
        if mesh.size(index) < 2:
            continue
        label = group_name(mesh.get_group(dim))
        if label != rank_sets.WORLD:
            names[label] = dim
    _dimensions.clear()
    _dimensions.update(names)


def dimension_of(group: str) -> str:
    """The mesh dimension a group (by its `group_name`) is on; "" when no mesh named it."""
    return _dimensions.get(group, "")


def argument(args: tuple, kwargs: dict, index: int, *names: str) -> Any:
    """A wrapped call's argument, passed by one of `names` or at position `index`; None if absent."""
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return args[index] if len(args) > index else None
