"""The UI's rooms hold (issue 30): the run's state (tui/state) imports neither Textual nor torch nor
any tab, so the exporter and `summary` can fold with it; a tab reads no sibling tab (the Overview,
which summarises the others, excepted); every tab has its panel behind the one `Panel` interface."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TUI = Path(__file__).resolve().parents[2] / "tui"
TABS_DIR = TUI / "tabs"

BLOCKED_RUN = textwrap.dedent("""
    import importlib, pkgutil, sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("textual", "torch"):
                raise ImportError("blocked " + name)
    sys.meta_path.insert(0, Block())
    package = importlib.import_module(sys.argv[1])
    for m in pkgutil.walk_packages(getattr(package, "__path__", []), package.__name__ + "."):
        importlib.import_module(m.name)
    print("imported", sys.argv[1])
""")


def _import_blocked(module: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKED_RUN, module], capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(90)
def test_the_run_state_imports_without_textual_or_torch():
    proc = _import_blocked("ringtop.tui.state")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "imported ringtop.tui.state" in proc.stdout


@pytest.mark.timeout(90)
def test_the_blocked_import_bites_on_a_module_that_needs_textual():
    proc = _import_blocked("ringtop.tui.app")
    assert proc.returncode != 0 and "blocked textual" in proc.stderr


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def _crossings(path: Path, own: str) -> set[str]:
    """What a module of the room `own` imports that it may not: for tui/state, any other room of
    the UI but the shell's words; for a tab, another tab."""
    bad = set()
    for name in _imports(path):
        if own == "state" and name.startswith("ringtop.tui.") and not name.startswith(
                ("ringtop.tui.state", "ringtop.tui.words", "ringtop.tui.sanitize", "ringtop.tui.stacks_text")):
            bad.add(name)
        sibling = name.startswith("ringtop.tui.tabs.") and not name.startswith(f"ringtop.tui.{own}")
        if own.startswith("tabs.") and sibling:
            bad.add(name)
    return bad


def _rooms() -> list[tuple[Path, str]]:
    out = [(p, "state") for p in sorted((TUI / "state").rglob("*.py"))]
    for tab in sorted(d for d in TABS_DIR.iterdir() if d.is_dir() and d.name != "overview" and d.name != "__pycache__"):
        out += [(p, f"tabs.{tab.name}") for p in sorted(tab.glob("*.py"))]
    return out


def test_state_reads_no_tab_and_no_tab_reads_a_sibling():
    assert len(_rooms()) > 30
    found = {f"{p.relative_to(TUI)}": bad for p, own in _rooms() if (bad := _crossings(p, own))}
    assert not found


@pytest.mark.parametrize(("own", "line"), [
    ("state", "from ringtop.tui.tabs.comm.figures import comm_window"),
    ("state", "from ringtop.tui.widgets.spark import Spark"),
    ("tabs.comm", "from ringtop.tui.tabs.memory.render import stacked_bar"),
])
def test_the_room_check_bites(tmp_path, own, line):
    module = tmp_path / "module.py"
    module.write_text(line + "\n")
    assert _crossings(module, own) == {line.split()[1]}


def test_every_tab_has_its_panel_and_the_app_refreshes_through_them():
    from ringtop.tui.app import TABS, RingtopApp, tab_panels

    panels = tab_panels()
    assert list(panels) == list(TABS)
    assert all(p.tab == tab and callable(p.build) and hasattr(p.widget, "show") for tab, p in panels.items())
    assert panels["overview"].comm is panels["comm"].figures  # one computation of the comm window for both
    source = ast.unparse(next(n for n in ast.walk(ast.parse((TUI / "app.py").read_text()))
                              if isinstance(n, ast.FunctionDef) and n.name == "refresh_view"))
    assert "self.panels.get(self.active_tab)" in source and not any(f"== '{tab}'" in source for tab in TABS)
    assert RingtopApp.refresh_view.__doc__
