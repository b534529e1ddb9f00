"""`ringtop bundle` of a live 2-rank run (real gloo ranks, real control socket, real py-spy where
installed) and of a finished one: what the manifest lists is in the archive, every rank's stack
and ledger is there, no key of the run is anywhere in it (the server's secret and every rank's
included, as Z85 text or raw bytes), versions say CUDA and NCCL or why not, a link planted in the
run folder is not followed, and a run folder with a large log gives a bundle within its bound that
says what it cut."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import msgspec
import pytest
import zmq.utils.z85
from conftest import TESTS_DIR, agent_env, start_agents, stop_process_group

from ringtop.cli.bundle import MAX_BUNDLE_BYTES, MAX_LOG_BYTES
from ringtop.protocol import Heartbeat, connection_file, to_json_line
from ringtop.protocol.curve import RunKeys


def bundle(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringtop.cli", "bundle", *args], capture_output=True, text=True,
                          timeout=120, env=agent_env(), cwd=cwd)


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def key_forms(z85_key: str) -> dict[str, bytes]:
    """Every way a key could be written into a file: its Z85 text (as ZeroMQ and the connection
    file hold it), its 32 raw bytes, and those in hex and base64."""
    raw = zmq.utils.z85.decode(z85_key.encode())
    assert len(raw) == 32
    return {"z85": z85_key.encode(), "raw": raw, "hex": raw.hex().encode(), "HEX": raw.hex().upper().encode(),
            "base64": base64.b64encode(raw), "urlsafe base64": base64.urlsafe_b64encode(raw)}


def run_secrets(keys: RunKeys) -> dict[str, str]:
    """Every secret of a run, by what it is, and the public keys (no reason for those to be there either)."""
    found = {"server secret": keys.server_secret, "client secret": keys.client.client_secret,
             "server public": keys.server_public, "client public": keys.client.client_public}
    found.update({f"rank {r} secret": k for r, k in enumerate(keys.rank_secret)})
    found.update({f"rank {r} public": k for r, k in enumerate(keys.rank_public)})
    found.update({f"node relay {n} secret": k for n, k in enumerate(keys.node_secret)})
    return found


def leaks(blob: bytes, keys: RunKeys) -> list[str]:
    return [f"{name} as {form}" for name, key in run_secrets(keys).items()
            for form, data in key_forms(key).items() if data in blob]


def expected_torch_build() -> dict[str, str | None]:
    """What this machine's torch says, asked here apart from the bundle (None: n/a expected)."""
    import torch

    if not torch.version.cuda:
        return {"cuda": None, "nccl": None}
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - a CUDA build without NCCL
        nccl = None
    return {"cuda": torch.version.cuda, "nccl": nccl}


@pytest.mark.timeout(240)
def test_a_live_runs_bundle_holds_every_ranks_stack_and_ledger_and_no_key(tmp_path):
    keys_file = tmp_path / "run-keys.json"  # outside the run folder: the bundle cannot come across it
    run = start_agents(tmp_path / "run", 2, "--steps", "100000", "--batch-size", "2", "--seq-len", "16",
                       "--keys-out", str(keys_file), entry=str(TESTS_DIR / "helpers" / "agent_revealing_keys.py"))
    try:
        run.wait_for_step(3)
        info = run.connection()
        keys = msgspec.json.decode(keys_file.read_bytes(), type=RunKeys)
        assert keys.client == info.keys and len(keys.rank_secret) == 2, "the keys the run itself uses"
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
    everything = b"".join(files.values()) + json.dumps(manifest).encode()
    assert leaks(everything, keys) == [], "no key of the run in a bundle, in any encoding"
    for form, data in key_forms(keys.server_secret).items():  # the check bites on each encoding
        assert f"server secret as {form}" in leaks(everything + b"planted:" + data, keys)
    assert "rank 1 secret as raw" in leaks(everything + zmq.utils.z85.decode(keys.rank_secret[1].encode()), keys)
    assert not any("connection" in name for name in files)
    said = json.loads(files["versions.json"])
    for part, version in expected_torch_build().items():
        if version is None:
            assert said[part].startswith("n/a: ") and len(said[part]) > len("n/a: ") + 10, said[part]
        else:
            assert said[part] == version, (part, said[part])
    assert said["nvidia-smi"] if shutil.which("nvidia-smi") else said["nvidia-smi"].startswith("n/a: ")


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


def test_a_large_log_is_cut_to_its_newest_lines_within_the_bound_and_the_manifest_says_so(tmp_path):
    """A real run's folder with rank 0's log grown past one log's bound (protocol-valid lines,
    planted): at the default bound that log is cut to its last MAX_LOG_BYTES; with a bound
    smaller than the logs, every log shares what room is left and the small parts stay whole."""
    logs = tmp_path / "run"
    shutil.copytree(TESTS_DIR / "data" / "numbers_run" / "ddp", logs)
    planted = logs / "rank-0.jsonl"
    line = len(to_json_line(Heartbeat(rank=0, seq=10**6, ts=1796409699.5, step=10**6)))
    with open(planted, "ab") as f:
        f.write(b"".join(to_json_line(Heartbeat(rank=0, seq=10**6 + i, ts=1796409699.5, step=10**6 + i))
                         for i in range((MAX_LOG_BYTES + (1 << 20)) // line)))
    size = planted.stat().st_size
    assert size > MAX_LOG_BYTES
    content = planted.read_bytes()
    for max_mib in (None, 4):
        out = tmp_path / f"b-{max_mib}.tar.gz"
        done = bundle(str(logs), "-o", str(out), "--no-live", *(["--max-size-mib", str(max_mib)] if max_mib else []),
                      cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        bound = MAX_BUNDLE_BYTES if max_mib is None else max_mib << 20
        files = members(out)
        manifest = json.loads(files["MANIFEST.json"])
        assert manifest["max_bytes"] == bound
        assert sum(len(d) for d in files.values()) <= bound and out.stat().st_size <= bound
        kept = files["logs/rank-0.jsonl"]
        assert len(kept) <= (MAX_LOG_BYTES if max_mib is None else bound)
        assert content.endswith(kept) and content[-len(kept) - 1:-len(kept)] == b"\n", "its newest whole lines"
        (cut,) = [t for t in manifest["truncated"] if t["name"] == "logs/rank-0.jsonl"]
        assert cut["kept_bytes"] == len(kept) and cut["of_bytes"] == size
        assert ("one log" if max_mib is None else "share of the bundle") in cut["why"]
        listed = {f["name"]: f for f in manifest["files"]}
        assert "last" in listed["logs/rank-0.jsonl"]["what"]
        assert {"summary.txt", "config.json", "versions.json", "environment.json", "logs/rank-1.jsonl"} <= set(files)
        assert files["logs/rank-1.jsonl"] == (logs / "rank-1.jsonl").read_bytes(), "a small log whole"
        assert [t["name"] for t in manifest["truncated"]] == ["logs/rank-0.jsonl"]


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
