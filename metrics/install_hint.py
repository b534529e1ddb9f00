"""The `pip install` line that adds an extra to *this* ringtop, as it was installed.

A source checkout (an editable install, or the repository on the path) takes `pip install -e
".[hf]"`; `pip install "ringtop[hf]"` there would fetch another copy from an index. A wheel takes
`pip install "ringtop[hf]"`; one built from a local folder, that folder. Here, not in cli/, because
the hints come from every room (agent, strategies, cli) and metrics/ is the one they all import;
stdlib only, like the rest of it.
"""

from __future__ import annotations

import json
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
"""The repository's root in a source checkout (metrics/ is one of its rooms); in a wheel, the
installed `ringtop` package's folder."""


def _installed_from() -> dict | None:
    """The distribution's PEP 610 record (`direct_url.json`): where pip installed it from; None
    for an index's wheel or when ringtop is not installed at all."""
    from importlib import metadata

    try:
        text = metadata.distribution("ringtop").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _is_checkout(root: Path) -> bool:
    try:
        return 'name = "ringtop"' in (root / "pyproject.toml").read_text()
    except OSError:
        return False


def install_command(extra: str, *, package_root: Path | None = None, installed_from: dict | None | bool = False,
                    cwd: Path | None = None) -> str:
    """`pip install ...` that adds `extra` (e.g. "hf", "deepspeed", "agent,hf") to this ringtop.
    The keyword arguments stand in for this installation's facts (tests)."""
    root = PACKAGE_ROOT if package_root is None else package_root
    record = _installed_from() if installed_from is False else installed_from
    here = (cwd or Path.cwd()).resolve()
    if _is_checkout(root):
        return f'pip install -e "{_spec(root, here)}[{extra}]"'
    url = (record or {}).get("url", "")
    if url.startswith("file://") and "dir_info" in (record or {}):
        folder = Path(url.removeprefix("file://"))
        editable = (record or {}).get("dir_info", {}).get("editable", False)
        return f'pip install {"-e " if editable else ""}"{_spec(folder, here)}[{extra}]"'
    return f'pip install "ringtop[{extra}]"'


def _spec(folder: Path, cwd: Path) -> str:
    """`.` from inside the folder itself, else its path."""
    return "." if folder.resolve() == cwd else str(folder)
