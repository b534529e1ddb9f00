"""A save completes on every rank or fails on every rank, at once and named, and nothing planted in
the checkpoint folder redirects a write: the fault matrix (rank 0 / rank 1, foreground /
background, full / sharded; a full disk, a read-only folder, a link swapped in, an exception in
the writer: all 32 cells) and every plant, in one 2-rank gloo run of 45 sequential saves
(tests/helpers/save_fault_worker.py, about 15 s); then the same through a real run and `ctl checkpoint`."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import TESTS_DIR, poll_until, run_worker_script, start_agents, stop_process_group
from save_fault_worker import PRECIOUS

from ringtop.agent.checkpoints.format import load_full_files, read_meta, resolve
from ringtop.protocol import Event, read_log

FS_FAULTS = ("full", "readonly", "link")
EXPECTED_TEXT = {
    "exception": "RuntimeError: injected failure inside the writer",
    "full": "OSError: [Errno 28] No space left on device",
    "readonly": "[Errno 30] Read-only file system",
    "link": "is a symbolic link",
    "plant-final": "already exists and is not a checkpoint folder of this user's (a symbolic link)",
    "plant-files": "[Errno 17] File exists",
    "swap-folder": "it is a symbolic link",
}
"""What each fault's failure must say (after "KIND checkpoint of step N failed on rank R: ")."""


def matrix_cells() -> list[dict]:
    cells = [{"kind": kind, "background": background, "fault": fault, "rank": rank}
             for fault, kind, background, rank in itertools.product(
                 ("exception", *FS_FAULTS), ("full", "sharded"), (False, True), (0, 1))]
    plants = [{"kind": kind, "background": False, "fault": fault, "rank": 0}
              for fault in ("plant-tmp", "plant-latest", "plant-final", "plant-files") for kind in ("full", "sharded")]
    healthy = [{"kind": kind, "background": background, "fault": "none", "rank": 0}
               for kind in ("full", "sharded") for background in (False, True)]
    return [healthy[0], *cells, healthy[1], *plants, {"kind": "full", "background": False, "fault": "swap-folder",
                                                      "rank": 0}, *healthy[2:]]


def expected_failure(cell: dict, step: int) -> str | None:
    """The start and the gist of the failure every rank must raise; None for a save that must succeed
    (no fault; a plant a careful writer gets past; a disk fault on rank 1 of a full save, where rank 1
    writes nothing)."""
    fault = cell["fault"]
    if fault in ("none", "plant-tmp", "plant-latest"):
        return None
    if cell["kind"] == "full" and cell["rank"] == 1 and fault in FS_FAULTS:
        return None
    return f"{cell['kind']} checkpoint of step {step} failed on rank {cell['rank']}: ", EXPECTED_TEXT[fault]


def victim_untouched(victim: Path) -> list[str]:
    """What a redirected write left in VICTIM (nothing, for a careful writer)."""
    found = sorted(p.name for p in victim.iterdir())
    changed = [] if found == [PRECIOUS] else [f"files: {found}"]
    if (victim / PRECIOUS).exists() and (victim / PRECIOUS).read_bytes() != b"precious\n":
        changed.append(f"{PRECIOUS} overwritten")
    return changed


@pytest.fixture
def save_folders(tmp_path):
    ckdir, victim = tmp_path / "checkpoints", tmp_path / "victim"
    ckdir.mkdir(mode=0o700)
    victim.mkdir()
    (victim / PRECIOUS).write_bytes(b"precious\n")
    return ckdir, victim


@pytest.mark.timeout(240)
def test_every_fault_fails_the_save_on_every_rank_at_once_named_and_nothing_planted_redirects_it(
        tmp_path, save_folders):
    ckdir, victim = save_folders
    cells = matrix_cells()
    results = run_worker_script(TESTS_DIR / "helpers" / "save_fault_worker.py",
                                [str(ckdir), str(victim), json.dumps(cells)], tmp_path / "out", nproc=2, timeout_s=200)
    wrong = []
    last_saved = None
    for step, cell in enumerate(cells, start=1):
        got = [r["results"][step - 1] for r in results]
        expected = expected_failure(cell, step)
        for rank, result in enumerate(got):
            if not result["group_ok"]:
                wrong.append(f"{cell}: the group broke on rank {rank}")
            if result["seconds"] > 30:
                wrong.append(f"{cell}: took {result['seconds']:.1f} s on rank {rank}")
            if expected is None and result["error"] is not None:
                wrong.append(f"{cell}: failed on rank {rank}: {result['error']}")
            elif expected is not None and not (result["error"] or "").startswith(expected[0]):
                wrong.append(f"{cell}: rank {rank} said {result['error']!r}, not {expected[0]!r}...")
            elif expected is not None and expected[1] not in result["error"]:
                wrong.append(f"{cell}: rank {rank} said {result['error']!r}, without {expected[1]!r}")
        if got[0]["error"] is not None and got[0]["error"] != got[1]["error"]:
            wrong.append(f"{cell}: the ranks said different things: {got[0]['error']!r} / {got[1]['error']!r}")
        if expected is None:
            last_saved = got[0]["saved"]
            assert read_meta(Path(last_saved))["step"] == step
    assert not wrong, "\n".join(wrong)
    assert not victim_untouched(victim), victim_untouched(victim)
    assert resolve("latest", ckdir) == Path(last_saved)
    assert not (ckdir / "latest").is_symlink()
    model_state, _, payload = load_full_files(Path(next(r["saved"] for r in results[0]["results"] if r["saved"])))
    assert payload["step"] == 1 and tuple(model_state["weight"].shape) == (64, 64)


def test_the_victim_check_bites(save_folders):
    """A writer that follows a planted link (as the agent's did) is caught by `victim_untouched`."""
    ckdir, victim = save_folders
    os.symlink(victim / PRECIOUS, ckdir / "latest")
    (ckdir / "latest").write_text("step-00000003-full\n")
    os.symlink(victim, ckdir / ".step-00000003-full.tmp")
    (ckdir / ".step-00000003-full.tmp" / "meta.json").write_text("{}")
    assert victim_untouched(victim) == ["files: ['meta.json', 'precious']", "precious overwritten"]


# ---------------------------------------------------------------- through a real run


@pytest.fixture
def open_base():
    """A base others may traverse (pytest's own tmp folders are 0700, which would hide any mode)."""
    base = Path(tempfile.mkdtemp(prefix="ringtop-saves-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def read_as_nobody(path: Path) -> subprocess.CompletedProcess:
    """`path` read (a file, as `head`) or listed (a folder) by uid 65534, another local user."""
    def become_nobody():
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    command = ["ls", str(path)] if path.is_dir() else ["head", "-c", "64", str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, preexec_fn=become_nobody)


def events(run, rank: int = 0) -> list[Event]:
    return [m for m in read_log(run.log_dir / f"rank-{rank}.jsonl") if isinstance(m, Event)]


@pytest.mark.timeout(300)
def test_a_save_that_fails_on_rank_0_is_named_on_every_rank_training_goes_on_and_files_are_private(open_base):
    """The issue's run: a link planted at the final name. `ctl checkpoint` gets the named failure,
    both ranks keep stepping, nobody is called dead; then every file the run made is 0600 in 0700
    folders, and another local user reading them is refused."""
    run = start_agents(open_base / "run", 2, "--steps", "0", "--batch-size", "2", "--seq-len", "16")
    try:
        run.wait_for_step(2, timeout_s=120)
        victim = open_base / "victim"
        victim.mkdir()
        run.checkpoint_dir.mkdir(mode=0o700, exist_ok=True)
        for step in range(1, 5000):  # the command lands on a step not known in advance
            os.symlink(victim, run.checkpoint_dir / f"step-{step:08d}-full")
        replies = list(run.send_command("checkpoint", {"kind": "full"}, timeout_s=120))
        failed = replies[-1]
        assert failed.status == "error", failed
        assert failed.error.startswith("full checkpoint of step ") and " failed on rank 0: " in failed.error
        assert "a symbolic link" in failed.error and "rmtree" not in failed.error
        at = int(failed.error.split()[4])
        run.wait_for_step(at + 3, timeout_s=120)  # both ranks go on
        for step in range(1, 5000):
            (run.checkpoint_dir / f"step-{step:08d}-full").unlink()
        done = list(run.send_command("checkpoint", {"kind": "sharded"}, timeout_s=120))[-1]
        assert done.status == "done", done.error
        assert list(run.send_command("profile", {"steps": 2}, timeout_s=120))[-1].status == "done"
        (run.log_dir / "dumps").mkdir(mode=0o700)
        os.symlink(victim / "ledger", run.log_dir / "dumps" / "ledger-rank-0.json")
        assert list(run.send_command("dump", {}, timeout_s=60))[-1].status == "done"
        poll_until(lambda: not (run.log_dir / "dumps" / "ledger-rank-0.json").is_symlink()
                   and len(list((run.log_dir / "dumps").glob("ledger-rank-*.json"))) == 2, 60, "the dumps")
        assert list(run.send_command("stop", {}, timeout_s=60))[-1].status == "done"
        assert run.wait(90) == 0, run.output()[-3000:]
    finally:
        stop_process_group(run.proc)
    assert list(victim.iterdir()) == []
    for rank in (0, 1):
        said = [e.text for e in events(run, rank)]
        assert not [t for t in said if "died" in t or "dead" in t], said
        if rank == 0:
            assert any(f"full checkpoint of step {at} failed on rank 0: " in t for t in said), said

    made = [p for folder in (run.log_dir, run.checkpoint_dir) for p in [folder, *folder.rglob("*")]]
    assert len(made) > 10 and any(p.name.endswith(".distcp") for p in made)
    modes = {str(p.relative_to(open_base)): oct(p.lstat().st_mode & 0o777) for p in made}
    wrong = {p: m for p, m in modes.items() if m != (oct(0o700) if (open_base / p).is_dir() else oct(0o600))}
    assert not wrong, wrong
    for path in (run.log_dir / "rank-0.jsonl", run.log_dir, run.checkpoint_dir / "latest"):
        refused = read_as_nobody(path)
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, (path, refused)


def test_reading_as_another_user_is_refused_only_by_the_modes(open_base):
    """The check of the test above bites: the same read succeeds once a file is 0644 in a 0755 folder."""
    folder = open_base / "shared"
    folder.mkdir(mode=0o755)
    (folder / "rank-0.jsonl").write_text("{}\n")
    (folder / "rank-0.jsonl").chmod(0o644)
    assert read_as_nobody(folder / "rank-0.jsonl").returncode == 0
    (folder / "rank-0.jsonl").chmod(0o600)
    assert read_as_nobody(folder / "rank-0.jsonl").returncode != 0


@pytest.mark.timeout(240)
def test_with_stop_on_save_failure_a_failed_periodic_save_stops_every_rank_at_that_step(open_base):
    from ringtop.protocol import Bye

    workdir = open_base / "run"
    (workdir / "checkpoints").mkdir(parents=True, mode=0o700)
    victim = open_base / "victim"
    victim.mkdir()
    os.symlink(victim, workdir / "checkpoints" / "step-00000004-full")
    run = start_agents(workdir, 2, "--steps", "12", "--batch-size", "2", "--seq-len", "16", "--checkpoint-every", "2",
                       "--stop-on-save-failure")
    try:
        assert run.wait(180) == 0, run.output()[-3000:]
    finally:
        stop_process_group(run.proc)
    for rank in (0, 1):
        byes = [m for m in read_log(run.log_dir / f"rank-{rank}.jsonl") if isinstance(m, Bye)]
        assert byes and byes[-1].step == 4, byes
        assert byes[-1].reason.startswith("stopped on a failed save: full checkpoint of step 4 failed on rank 0: ")
    assert resolve("latest", run.checkpoint_dir).name == "step-00000002-full"
    assert list(victim.iterdir()) == []


def test_keep_prunes_only_the_runs_own_checkpoints(save_folders):
    """--keep K removes old checkpoint folders of this run's making; a link or a folder that is no
    checkpoint, under a checkpoint's name, stays (one process, no group: the manager's own path)."""
    from save_fault_worker import TinyState

    from ringtop.agent.checkpoints.saver import CheckpointManager

    ckdir, victim = save_folders
    os.symlink(victim, ckdir / "step-00000000-full")
    (ckdir / "step-00000000-sharded").mkdir()
    manager = CheckpointManager(str(ckdir), 0, None, None, keep=2)
    for step in (1, 2, 3):
        manager.save(TinyState(), step, "full", {}, background=False)
    assert sorted(p.name for p in ckdir.iterdir()) == ["latest", "step-00000000-full", "step-00000000-sharded",
                                                       "step-00000002-full", "step-00000003-full"]
    assert resolve("latest", ckdir).name == "step-00000003-full" and not victim_untouched(victim)
