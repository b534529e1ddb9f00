"""protocol/safe_files.py: nothing planted in a run's folder redirects a write, a folder that is a
link or others can write is refused with the reason, and what is made is private; then the
writers that use it (logs, dumps, connection files, profiles, `trace`, `report`, `bench comm
--out`, `--step-times`) against the plants the issue found, an agent refusing to start on a linked
log folder, and `ringtop run -- --group-readable` making what the run writes readable by the
owner's group alone."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import agent_env

from ringtop.cli.main import main as ringtop_main
from ringtop.protocol import Hello, Step, connection_file, free_tcp_ports, safe_files, to_json_line


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


# ---------------------------------------------------------------- files the user names, and the CLI's outputs


def write_logs(folder: Path) -> Path:
    """A private run folder holding one rank's log of 3 steps: what `trace` and `report` read."""
    folder.mkdir(mode=0o700)
    lines = [to_json_line(Hello(rank=0, ts=1000.0, run_id="r", world_size=1, host="node-a"))]
    lines += [to_json_line(Step(rank=0, ts=1000.0 + s * 0.1, step=s, loss=1.0, step_ms=90.0, forward_ms=30.0))
              for s in (1, 2, 3)]
    (folder / "rank-0.jsonl").write_bytes(b"".join(lines))
    return folder


def mode_of(path: Path) -> str:
    return oct(path.lstat().st_mode & 0o777)


@pytest.fixture
def guessed_temporary_name(monkeypatch) -> str:
    """The temporary names made guessable, as if a planter had guessed one (they hold 48 random bits)."""
    monkeypatch.setattr(safe_files, "temporary_name", lambda name: f".{name}.guessed")
    return ".{}.guessed"


def test_a_file_the_user_names_refuses_a_link_replaces_a_file_and_is_private(tmp_path, victim):
    out = tmp_path / "out.json"
    os.symlink(victim / "precious", out)
    with pytest.raises(safe_files.UnsafePathError, match=f"refusing to write {out}: it is a symbolic link"):
        safe_files.write_output(out, b"{}")
    out.unlink()
    os.link(victim / "precious", out)  # a hard link: its entry is replaced, the file it shares is kept
    safe_files.write_output(out, b"{}")
    assert out.read_bytes() == b"{}" and mode_of(out) == oct(0o600) and untouched(victim)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(safe_files.UnsafePathError, match="it is not a regular file"):
        safe_files.check_output(tmp_path / "fifo")


def test_trace_replaces_a_link_planted_at_its_default_name_and_refuses_one_at_a_named_output(tmp_path, victim):
    run = write_logs(tmp_path / "run")
    os.symlink(victim / "precious", run / "trace.json")
    done = subprocess.run([sys.executable, "-m", "ringtop.cli", "trace", str(run)], capture_output=True, text=True,
                          env=agent_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    trace = run / "trace.json"
    assert not trace.is_symlink() and b'"traceEvents"' in trace.read_bytes() and mode_of(trace) == oct(0o600)
    named = tmp_path / "named.json"
    os.symlink(victim / "precious", named)
    refused = subprocess.run([sys.executable, "-m", "ringtop.cli", "trace", str(run), "-o", str(named)],
                             capture_output=True, text=True, env=agent_env(), timeout=60)
    assert refused.returncode == 1 and f"refusing to write {named}: it is a symbolic link" in refused.stderr
    assert untouched(victim)


def test_trace_fails_on_a_link_planted_at_its_temporary_name_and_writes_nothing(tmp_path, victim,
                                                                              guessed_temporary_name, capsys):
    run = write_logs(tmp_path / "run")
    os.symlink(victim / "precious", run / guessed_temporary_name.format("trace.json"))
    assert ringtop_main(["trace", str(run)]) == 1
    assert "File exists" in capsys.readouterr().err
    assert not (run / "trace.json").exists() and untouched(victim)


def test_report_refuses_a_link_at_its_output_and_writes_a_private_page(tmp_path, victim, capsys):
    pytest.importorskip("plotly")
    run = write_logs(tmp_path / "run")
    out = tmp_path / "report.html"
    os.symlink(victim / "precious", out)
    assert ringtop_main(["report", str(run), "-o", str(out)]) == 1
    assert f"refusing to write {out}: it is a symbolic link" in capsys.readouterr().err
    out.unlink()
    os.link(victim / "precious", out)
    assert ringtop_main(["report", str(run), "-o", str(out)]) == 0
    assert b"<html" in out.read_bytes()[:200] and mode_of(out) == oct(0o600) and untouched(victim)


def test_bench_refuses_a_link_at_its_out_before_any_rank_starts(tmp_path, victim):
    out = tmp_path / "bench.json"
    os.symlink(victim / "precious", out)
    done = subprocess.run([sys.executable, "-m", "ringtop.cli", "bench", "comm", "--nproc", "2", "--out", str(out)],
                          capture_output=True, text=True, env=agent_env(), timeout=60)
    assert done.returncode == 2 and f"refusing to write {out}: it is a symbolic link" in done.stderr, done.stderr
    assert "all_reduce" not in done.stdout + done.stderr and untouched(victim)


@pytest.mark.timeout(120)
def test_step_times_refuse_a_planted_link(tmp_path, victim):
    """Rank 0 writes --step-times at the end; a link planted at the name is refused, never followed."""
    out = tmp_path / "steps.json"
    os.symlink(victim / "precious", out)
    agent = subprocess.run([sys.executable, "-m", "ringtop.agent", "--steps", "2", "--batch-size", "2",
                            "--seq-len", "16", "--no-telemetry", "--step-times", str(out),
                            "--checkpoint-dir", str(tmp_path / "checkpoints")],
                           capture_output=True, text=True, env=agent_env(), timeout=110)
    assert agent.returncode == 2 and f"refusing to write {out}: it is a symbolic link" in agent.stderr, agent.stderr
    assert untouched(victim)


def profile_one_step(folder: Path) -> dict:
    """What `ctl profile steps=1` does on rank 0: record a step, export the trace, read it back."""
    import torch

    from ringtop.agent.control.profiling import ProfileSession

    session = ProfileSession(1, 1, folder, 0)
    torch.ones(8, 8).matmul(torch.ones(8, 8)).sum()
    session.step_done(0.0)
    return session.finish()


def test_a_profile_replaces_a_link_planted_at_its_trace_name(tmp_path, victim):
    folder = tmp_path / "profile"
    folder.mkdir(mode=0o700)
    final = folder / "step-00000001-rank-0.json"
    os.symlink(victim / "precious", final)
    assert profile_one_step(folder)["trace"] == str(final)
    assert not final.is_symlink() and b"traceEvents" in final.read_bytes() and mode_of(final) == oct(0o600)
    assert untouched(victim)


def test_a_profile_fails_on_a_link_planted_at_its_temporary_name(tmp_path, victim, guessed_temporary_name):
    folder = tmp_path / "profile"
    folder.mkdir(mode=0o700)
    os.symlink(victim, folder / guessed_temporary_name.format("step-00000001-rank-0.json"))
    with pytest.raises(FileExistsError):
        profile_one_step(folder)
    assert not (folder / "step-00000001-rank-0.json").exists() and untouched(victim)


# ---------------------------------------------------------------- --group-readable through `ringtop run`


@pytest.fixture
def open_base():
    """A base others may traverse (pytest's own tmp folders are 0700, which would hide any mode)."""
    base = Path(tempfile.mkdtemp(prefix="ringtop-shared-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def read_as_uid_65534(path: Path, groups: list[int]) -> subprocess.CompletedProcess:
    """`head` of `path` as uid 65534, another local user, in `groups` (and gid 65534)."""
    def become():
        os.setgroups(groups)
        os.setgid(65534)
        os.setuid(65534)
    return subprocess.run(["head", "-c", "64", str(path)], capture_output=True, text=True, timeout=60,
                          preexec_fn=become)


@pytest.mark.timeout(180)
def test_run_group_readable_makes_the_runs_files_0640_in_0750_folders_for_the_group_alone(open_base):
    """`ringtop run -- --group-readable` under a umask of 077: what the command makes (runs/ID,
    agents.log) and what the ranks make (logs, a checkpoint, --step-times) alike; a reader in the
    files' group reads rank-0.jsonl, one outside it is refused."""
    ports = [f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(3)]
    done = subprocess.run([sys.executable, "-m", "ringtop.cli", "run", "--nproc", "2", "--progress-every", "0", "--",
                           "--steps", "3", "--batch-size", "2", "--seq-len", "16", "--dist-timeout-s", "60",
                           "--group-readable", "--checkpoint-every", "3", "--step-times", "steps.json",
                           "--publish", ports[0], "--relay", ports[1], "--control", ports[2]],
                          capture_output=True, text=True, cwd=open_base, env=agent_env(), timeout=150,
                          stdin=subprocess.DEVNULL, preexec_fn=lambda: os.umask(0o077))
    assert done.returncode == 0, done.stderr[-3000:]
    made = list(open_base.rglob("*"))
    names = {p.name for p in made}
    assert {"runs", "agents.log", "rank-0.jsonl", "rank-1.jsonl", "latest", "state.pt", "steps.json"} <= names, names
    modes = {str(p.relative_to(open_base)): mode_of(p) for p in made}
    wrong = {p: m for p, m in modes.items()
             if m != (oct(0o750) if stat.S_ISDIR((open_base / p).lstat().st_mode) else oct(0o640))}
    assert not wrong, wrong
    log = next(open_base.glob("runs/*/rank-0.jsonl"))
    in_group = read_as_uid_65534(log, [log.stat().st_gid])
    assert in_group.returncode == 0 and in_group.stdout.encode() == log.read_bytes()[:64], in_group
    outside = read_as_uid_65534(log, [])
    assert outside.returncode != 0 and "Permission denied" in outside.stderr, outside
