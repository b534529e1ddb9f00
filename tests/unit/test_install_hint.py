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


def test_the_switch_pickers_deepspeed_reason_is_this_checkouts_install_line(monkeypatch, tmp_path):
    """The Hello's reason for leaving ZeRO out of the picker (agent/loop/switch_offer.py) names the
    same line as every other hint: from this checkout an editable install, never the index's wheel."""
    import sys

    from ringtop.agent.loop.switch_offer import REASON_MAX_CHARS, switch_unavailable

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # its import fails, as without DeepSpeed
    monkeypatch.chdir(REPO)
    reasons = set(switch_unavailable().values())
    assert reasons == {'DeepSpeed is not installed: pip install -e ".[deepspeed]"'}
    assert "ringtop[deepspeed]" not in reasons.pop()
    monkeypatch.chdir(tmp_path)
    assert set(switch_unavailable().values()) == {f'DeepSpeed is not installed: {install_command("deepspeed")}'}
    long_checkout = tmp_path / ("d" * 200) / ("e" * 200)  # a checkout whose path overflows the Hello's field
    long_checkout.mkdir(parents=True)
    (long_checkout / "pyproject.toml").write_text('[project]\nname = "ringtop"\n')
    monkeypatch.setattr("ringtop.metrics.install_hint.PACKAGE_ROOT", long_checkout)
    assert len(f'DeepSpeed is not installed: {install_command("deepspeed")}') > REASON_MAX_CHARS
    (reason,) = set(switch_unavailable().values())
    assert len(reason) <= REASON_MAX_CHARS and reason.startswith("DeepSpeed is not installed")
