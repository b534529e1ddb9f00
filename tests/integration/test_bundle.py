"""`ringtop bundle` of a live 2-rank run (real gloo ranks, real control socket, real py-spy where
installed) and of a finished one: what the manifest lists is in the archive, every rank's stack
and ledger is there, no key of the run is anywhere in it, and a link planted in the run folder is
not followed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import agent_env, start_agents, stop_process_group

from ringtop.protocol import connection_file


def bundle(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringtop.cli", "bundle", *args], capture_output=True, text=True,
                          timeout=120, env=agent_env(), cwd=cwd)


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@pytest.mark.timeout(240)
def test_a_live_runs_bundle_holds_every_ranks_stack_and_ledger_and_no_key(tmp_path):
    run = start_agents(tmp_path / "run", 2, "--steps", "100000", "--batch-size", "2", "--seq-len", "16")
    try:
        run.wait_for_step(3)
        info = run.connection()
        (run.log_dir / "rank-9.jsonl").symlink_to("/etc/passwd")  # planted: must not be read
        out = tmp_path / "b.tar.gz"
        done = bundle(str(run.log_dir), "-o", str(out), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert str(out) in done.stdout
        files = members(out)
        via_ctl = subprocess.run([sys.executable, "-m", "ringtop.cli", "ctl", "--run", run.run_id, "bundle",
                                  f"out={tmp_path / 'c.tar.gz'}"], capture_output=True, text=True, timeout=120,
                                 env=agent_env(), cwd=tmp_path)
        assert via_ctl.returncode == 0, via_ctl.stderr
        assert "live/stacks.json" in members(tmp_path / "c.tar.gz"), "ctl bundle: the same, of the run named"
    finally:
        stop_process_group(run.proc)
    manifest = json.loads(files.pop("MANIFEST.json"))
    assert sorted(f["name"] for f in manifest["files"]) == sorted(files)
    assert all(len(files[f["name"]]) == f["bytes"] for f in manifest["files"])
    stacks = json.loads(files["live/stacks.json"])
    ranks = sorted(r for g in stacks["groups"] for r in g["ranks"])
    assert ranks == [0, 1], stacks
    for rank in (0, 1):
        ledger = json.loads(files[f"dumps/ledger-rank-{rank}.json"])
        assert ledger["rank"] == rank and ledger["collectives"], "a fresh ledger of every rank"
        logged = [json.loads(line) for line in files[f"logs/rank-{rank}.jsonl"].splitlines()]
        assert any(m.get("type") == "step" for m in logged)
        if shutil.which("py-spy"):  # the test extra installs it; a container may deny it ptrace
            said = {x["what"]: x["why"] for x in manifest["left_out"]}
            native = f"native/rank-{rank}.txt"
            assert (native in files and b"Thread" in files[native]) or "py-spy could not read it" in said[native]
    assert "logs/rank-9.jsonl" not in files and b"root:" not in b"".join(files.values())
    assert any(x["what"] == "logs/rank-9.jsonl" for x in manifest["left_out"])
    assert json.loads(files["config.json"])["0"]["run_id"] == run.run_id
    assert b"where the step went" in files["summary.txt"]
    everything = b"".join(files.values())
    keys = info.keys
    for secret in (keys.client_secret, keys.client_public, keys.server_public):
        assert secret.encode() not in everything, "no key of the run in a bundle"
    assert not any("connection" in name for name in files)


def test_a_finished_runs_bundle_says_what_it_could_not_have(tmp_path):
    log_dir = Path(__file__).resolve().parents[1] / "data" / "numbers_run"
    runs = sorted(p for p in log_dir.iterdir() if p.is_dir())
    out = tmp_path / "b.tar.gz"
    done = bundle(str(runs[0]), "-o", str(out), "--no-live", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    files = members(out)
    manifest = json.loads(files["MANIFEST.json"])
    why = {x["what"]: x["why"] for x in manifest["left_out"]}
    assert "no rank of the run is alive on this host" in why["native stacks"]
    assert "live/stacks.json" not in files and "summary.txt" in files
    env = json.loads(files["environment.json"])
    assert all(k.startswith(("NCCL_", "TORCH_", "CUDA_")) for e in env.values() for k in e)
    again = bundle(str(runs[0]), "-o", str(out), "--no-live", cwd=tmp_path)
    assert again.returncode == 1 and "cannot write" in again.stderr, "an existing file is never overwritten"


def test_no_run_is_one_line_and_exit_2(tmp_path):
    env = agent_env()
    env[connection_file.RUNTIME_ENV] = str(tmp_path / "empty-runtime")
    done = subprocess.run([sys.executable, "-m", "ringtop.cli", "bundle"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not list(tmp_path.glob("*.tar.gz"))


async def test_the_ui_key_b_bundles_a_replayed_run_into_its_folder_and_says_where(tmp_path):
    from ui_waits import eventually

    from ringtop.tui.app import RingtopApp
    from ringtop.tui.sources.replay import load_replay

    logs = tmp_path / "ddp"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "numbers_run" / "ddp", logs)
    log = load_replay(logs)
    app = RingtopApp(messages=log.messages, problems=log.problems, source=str(logs))
    async with app.run_test(size=(160, 48)) as pilot:
        await eventually(pilot, lambda: app.replay_loaded or (_ for _ in ()).throw(AssertionError("loading")))
        await pilot.press("b")

        def said() -> None:
            texts = [e.text for e in app.view.events if "ringtop bundle:" in e.text]
            assert texts and str(logs) in texts[-1], [e.text for e in app.view.events][-3:]
        await eventually(pilot, said, timeout_s=90)
    (made,) = logs.glob("bundle-*.tar.gz")
    assert "summary.txt" in members(made)
