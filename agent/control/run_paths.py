"""Paths a client names in a command: only inside the run's folders.

A command may come from any process that reached the control socket, so a path in it is resolved
(symlinks too) and accepted only under the run's checkpoint directory; the error says where paths
must be, never whether the one given exists."""

from __future__ import annotations

from pathlib import Path


class OutsideRunError(ValueError):
    """A command named a path outside the run's folders."""


def inside_run_directory(path: str, base: str, what: str) -> Path:
    """`path` (relative to `base`, or absolute) resolved, if it lies inside `base`."""
    root = Path(base).resolve()
    given = Path(path)
    candidate = (given if given.is_absolute() else root / given).resolve()
    if candidate != root and root not in candidate.parents:
        raise OutsideRunError(f"{what} must name a file inside the run's checkpoint directory {root}")
    return candidate
