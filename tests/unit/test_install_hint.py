"""An install hint is the command that adds an extra to *this* ringtop: a source checkout's
editable install, a local folder's, or the index's wheel (the wheel itself: test_packaging.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringtop.metrics.install_hint import install_command

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def checkout(tmp_path) -> Path:
    root = tmp_path / "ringtop-src"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "ringtop"\n')
    return root


def test_a_source_checkout_is_installed_editable_from_its_own_folder(checkout, tmp_path):
    assert install_command("hf", package_root=checkout, installed_from=None, cwd=checkout) == 'pip install -e ".[hf]"'
    assert (install_command("hf", package_root=checkout, installed_from=None, cwd=tmp_path)
            == f'pip install -e "{checkout}[hf]"'), "from elsewhere: the checkout's path, not '.'"


@pytest.mark.parametrize("record, expected", [
    (None, 'pip install "ringtop[deepspeed]"'),
    ({"url": "https://files.example/ringtop-0.1.0-py3-none-any.whl", "archive_info": {}},
     'pip install "ringtop[deepspeed]"'),
    ({"url": "file:///opt/src/ringtop", "dir_info": {}}, 'pip install "/opt/src/ringtop[deepspeed]"'),
    ({"url": "file:///opt/src/ringtop", "dir_info": {"editable": True}},
     'pip install -e "/opt/src/ringtop[deepspeed]"'),
])
def test_an_installed_ringtop_names_where_pip_took_it_from(tmp_path, record, expected):
    site_package = tmp_path / "site-packages" / "ringtop"  # no pyproject beside an installed package
    site_package.mkdir(parents=True)
    assert install_command("deepspeed", package_root=site_package, installed_from=record, cwd=tmp_path) == expected


def test_this_checkout_gets_the_editable_hint(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    assert install_command("hf") == 'pip install -e ".[hf]"'
    monkeypatch.chdir(tmp_path)
    assert install_command("agent,hf") == f'pip install -e "{REPO}[agent,hf]"'
