"""protocol/safe_files.py: nothing planted in a run's folder redirects a write, a folder that is a
link or others can write is refused with the reason, and what is made is private; then the
writers that use it (logs, dumps, connection files) against the plants the issue found, and an
agent refusing to start on a linked log folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import agent_env

from ringtop.protocol import connection_file, safe_files


@pytest.fixture
def victim(tmp_path) -> Path:
    """A folder outside the run, with one file, that no write of the run may touch."""
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "precious").write_bytes(b"precious\n")
    return folder


def untouched(victim: Path) -> bool:
    return sorted(p.name for p in victim.iterdir()) == ["precious"] and (victim / "precious").read_bytes() == \
        b"precious\n"


@pytest.fixture
def run_dir(tmp_path) -> tuple[Path, int]:
    folder = tmp_path / "run"
    fd = safe_files.open_dir(folder)
    yield folder, fd
    os.close(fd)


def test_the_untouched_check_bites(victim, tmp_path):
    os.symlink(victim / "precious", tmp_path / "latest")
    (tmp_path / "latest").write_text("step-00000001-full\n")  # a writer that follows the link
    assert not untouched(victim)


def test_creating_over_a_planted_link_fails_and_writes_nothing(run_dir, victim):
    folder, fd = run_dir
    os.symlink(victim / "precious", folder / "meta.json")
    with pytest.raises(FileExistsError):
        safe_files.create(fd, "meta.json")
    assert untouched(victim)


def test_an_atomic_write_replaces_a_planted_link_instead_of_following_it(run_dir, victim):
    folder, fd = run_dir
    os.symlink(victim / "precious", folder / "latest")
    os.symlink(victim / "precious", folder / f".latest.tmp-{os.getpid()}")  # the old, guessable temporary name
    safe_files.write_atomic(fd, "latest", b"step-00000002-full\n")
    assert not (folder / "latest").is_symlink() and (folder / "latest").read_bytes() == b"step-00000002-full\n"
    assert oct((folder / "latest").stat().st_mode & 0o777) == oct(0o600)
    assert untouched(victim)


def test_removing_a_tree_removes_links_in_it_and_never_what_they_point_at(run_dir, victim):
    folder, fd = run_dir
    tree = folder / ".step-00000001-full.tmp"
    (tree / "inner").mkdir(parents=True)
    os.symlink(victim, tree / "inner" / "folder-link")
    os.symlink(victim / "precious", tree / "file-link")
    safe_files.remove_tree(fd, tree.name)
    os.symlink(victim, tree)  # a link at the name itself goes, its target stays
    safe_files.remove_tree(fd, tree.name)
    assert not os.path.lexists(tree) and untouched(victim)


@pytest.mark.parametrize("plant, said", [
    ("link", "it is a symbolic link"),
    ("world-writable", "bad permissions (mode 0777, writable by others); chmod go-w"),
    ("group-writable", "bad permissions (mode 0770, writable by others)"),
    ("another-user", "bad ownership (it belongs to uid 65534"),
    ("private", None),
])
def test_a_run_folder_that_is_a_link_or_others_can_write_is_refused_saying_why(tmp_path, victim, plant, said):
    folder = tmp_path / "logs"
    if plant == "link":
        os.symlink(victim, folder)
    else:
        folder.mkdir()
        folder.chmod({"world-writable": 0o777, "group-writable": 0o770}.get(plant, 0o700))
        if plant == "another-user":
            os.chown(folder, 65534, 65534)
    if said is None:  # the same check accepts a private folder of this user's
        os.close(safe_files.open_dir(folder, what="log folder"))
        safe_files.check_dir(folder, "log folder")
        return
    for refuse in (lambda: safe_files.open_dir(folder, what="log folder"),
                   lambda: safe_files.check_dir(folder, "log folder")):
        with pytest.raises(safe_files.UnsafePathError) as refused:
            refuse()
        assert str(refused.value).startswith(f"refusing log folder {folder}: ") and said in str(refused.value)


def test_a_log_is_not_appended_through_a_link_or_a_hard_link(run_dir, victim):
    folder, fd = run_dir
    os.symlink(victim / "precious", folder / "rank-0.jsonl")
    with pytest.raises(OSError):
        safe_files.open_append(fd, "rank-0.jsonl")
    os.link(victim / "precious", folder / "rank-1.jsonl")
    with pytest.raises(safe_files.UnsafePathError):
        safe_files.open_append(fd, "rank-1.jsonl")
    with safe_files.open_append(fd, "rank-2.jsonl") as f:
        f.write(b"{}\n")
    assert untouched(victim) and oct((folder / "rank-2.jsonl").stat().st_mode & 0o777) == oct(0o600)


def test_made_private_by_default_and_group_readable_when_asked(tmp_path):
    try:
        for shared, file_mode, dir_mode in ((False, 0o600, 0o700), (True, 0o640, 0o750)):
            safe_files.set_group_readable(shared)
            folder = tmp_path / f"shared-{shared}" / "logs"
            fd = safe_files.open_dir(folder)
            sub = safe_files.make_dir(fd, "inner")
            safe_files.write_atomic(sub, "meta.json", b"{}")
            modes = [p.stat().st_mode & 0o777 for p in (folder.parent, folder, folder / "inner")]
            assert modes == [dir_mode] * 3 and (folder / "inner" / "meta.json").stat().st_mode & 0o777 == file_mode
            os.close(sub)
            os.close(fd)
    finally:
        safe_files.set_group_readable(False)


# ---------------------------------------------------------------- the writers, against the plants


def test_the_telemetry_log_refuses_a_planted_link(tmp_path, victim):
    from ringtop.agent.transport.telemetry import Telemetry

    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    os.symlink(victim / "precious", logs / "rank-0.jsonl")
    with pytest.raises(OSError):
        Telemetry(0, None, str(logs))
    assert untouched(victim)


def test_a_dump_replaces_a_planted_ledger_link(tmp_path, victim):
    """What `ctl dump` does on each rank (OffThread.write_dump, agent/loop/off_thread.py), against
    `ln -s VICTIM LOGDIR/dumps/ledger-rank-0.json`."""
    dumps = tmp_path / "logs" / "dumps"
    dumps.mkdir(parents=True, mode=0o700)
    os.symlink(victim / "precious", dumps / "ledger-rank-0.json")
    safe_files.write_files(dumps, {"ledger-rank-0.json": b'{"rank": 0}'}, what="dump folder")
    assert (dumps / "ledger-rank-0.json").read_bytes() == b'{"rank": 0}' and untouched(victim)


def test_a_connection_file_replaces_a_planted_link_and_a_linked_runtime_folder_is_refused(tmp_path, victim,
                                                                                        monkeypatch):
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv(connection_file.RUNTIME_ENV, str(runtime))
    info = connection_file.ConnectionInfo(run_id="abc", pid=os.getpid(), host="h", publish="tcp://127.0.0.1:1",
                                          control="tcp://127.0.0.1:2")
    os.symlink(victim / "precious", runtime / "run-abc.json")
    path = connection_file.write(info)
    assert not path.is_symlink() and connection_file.read(path).run_id == "abc" and untouched(victim)
    linked = tmp_path / "linked-runtime"
    os.symlink(runtime, linked)
    monkeypatch.setenv(connection_file.RUNTIME_ENV, str(linked))
    with pytest.raises(connection_file.ConnectionFileError, match="symbolic link"):
        connection_file.write(info)


@pytest.mark.timeout(120)
def test_an_agent_refuses_to_start_on_a_linked_log_folder_and_says_why(tmp_path, victim):
    linked = tmp_path / "logs"
    os.symlink(victim, linked)
    agent = subprocess.run([sys.executable, "-m", "ringtop.agent", "--steps", "1", "--log-dir", str(linked),
                            "--checkpoint-dir", str(tmp_path / "checkpoints"), "--insecure"],
                           capture_output=True, text=True, env=agent_env(), timeout=110)
    assert agent.returncode == 2, agent.stdout[-2000:] + agent.stderr[-2000:]
    assert f"refusing log folder {linked}: it is a symbolic link" in agent.stderr
    assert untouched(victim)
