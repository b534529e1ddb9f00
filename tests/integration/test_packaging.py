"""The wheel maps the root folders into one `ringtop.*` namespace and installs no bare `agent`;
`import ringtop` is light and gives `ringtop.Monitor`."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_built_wheel_holds_the_ringtop_namespace_and_imports_from_it(tmp_path):
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(REPO)],
                   check=True, capture_output=True, timeout=170)
    (wheel,) = tmp_path.glob("ringtop-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("ringtop-")}
    assert tops == {"ringtop"}, f"only the ringtop namespace is installed, found {tops}"
    for room in ("protocol", "agent", "strategies", "tui", "cli", "metrics"):
        for source in (REPO / room).rglob("*.py"):  # every module, subpackages too
            assert f"ringtop/{room}/{source.relative_to(REPO / room).as_posix()}" in names, source
    assert "ringtop/protocol/README.md" in names
    assert "ringtop/__init__.py" in names, "import ringtop is a package of its own (ringtop.Monitor)"
    assert any(n.endswith("entry_points.txt") for n in names)

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = ("import ringtop; assert 'torch' not in sys.modules, 'import ringtop stays light';"
             "assert ringtop.Monitor.__module__ == 'ringtop.agent.loop.monitor';"
             "import ringtop.protocol, ringtop.agent.loop.runner, ringtop.tui.app, ringtop.cli.main;"
             "print(ringtop.protocol.__file__);"
             "from ringtop.metrics.install_hint import install_command; print(install_command('hf'))")
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {probe}"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(site))
    assert out.stdout.splitlines()[-1] == 'pip install "ringtop[hf]"', "a wheel's hint is the index's, not a checkout's"
