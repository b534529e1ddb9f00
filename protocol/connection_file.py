"""Connection files: how a client finds this user's runs, and only this user's.

The process that serves a run's telemetry (its watcher, agent/watcher/; rank 0 itself under
--no-watcher) writes one file per run into a per-user runtime directory (`$XDG_RUNTIME_DIR/ringtop`, else
`~/.local/share/ringtop/runtime`), mode 0600 in a 0700 directory, as Jupyter does for its kernels:
the run's endpoints, keys, id, pid and host. `ringtop ui`, `ctl` and `ls` read them instead of guessing a
port that, on a shared node, may be another user's job. A file is trusted only if this user owns
it and nobody else can write it; one whose process is gone is stale and ignored.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import time
from pathlib import Path

import msgspec

from ringtop.protocol import safe_files
from ringtop.protocol.curve import ClientKeys
from ringtop.protocol.processes import process_gone

MAX_FILE_BYTES = 64 * 1024
RUNTIME_ENV = "RINGTOP_RUNTIME_DIR"
"""Overrides where connection files live (tests, or a shared filesystem a user prefers)."""


class ConnectionFileError(RuntimeError):
    """A connection file or its directory cannot be trusted or read."""


class ConnectionInfo(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    run_id: str
    pid: int
    """The process serving the run's telemetry: its watcher, or rank 0 under --no-watcher."""
    host: str
    publish: str
    """The relay's address UIs subscribe to."""
    control: str
    """Rank 0's control socket."""
    relay: str = ""
    world_size: int = 0
    started_ts: float = 0.0
    log_dir: str = ""
    checkpoint_dir: str = ""
    keys: ClientKeys | None = None
    """The run's client keys (protocol/curve.py); None only for a run started with --insecure."""

    @property
    def insecure(self) -> bool:
        return self.keys is None


def runtime_dir() -> Path:
    override = os.environ.get(RUNTIME_ENV)
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / "ringtop"
    return Path.home() / ".local" / "share" / "ringtop" / "runtime"


def _private_dir(create: bool) -> Path:
    directory = runtime_dir()
    if create:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        st = directory.lstat()
    except FileNotFoundError:
        return directory
    if stat.S_ISLNK(st.st_mode):
        raise ConnectionFileError(f"{directory}: this directory is a symbolic link; not trusted")
    _check_private(directory, st, "directory")
    return directory


def _check_private(path: Path, st: os.stat_result, what: str) -> None:
    if st.st_uid != os.getuid():
        raise ConnectionFileError(f"{path}: this {what} belongs to another user; not trusted")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConnectionFileError(f"{path}: others can write this {what}; not trusted (chmod go-w)")


def ensure_runtime_dir() -> Path:
    """The runtime directory, made private if new; raises ConnectionFileError (or OSError) if it
    cannot be made or trusted: a launcher checks before it waits for a file to appear there."""
    return _private_dir(create=True)


def file_for(run_id: str) -> Path:
    return runtime_dir() / f"run-{run_id}.json"


def write(info: ConnectionInfo) -> Path:
    """Atomically, readable and writable by this user only; nothing planted in the folder is followed."""
    directory = _private_dir(create=True)
    name = f"run-{info.run_id}.json"
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _check_private(directory, os.fstat(fd), "directory")
        tmp = safe_files.temporary_name(name)
        try:
            fd_file = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                              dir_fd=fd)
            with os.fdopen(fd_file, "wb") as f:
                f.write(msgspec.json.encode(info))
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
            raise
    finally:
        os.close(fd)
    return directory / name


def read(path: Path) -> ConnectionInfo:
    try:
        st = path.stat()
    except OSError as exc:
        raise ConnectionFileError(f"{path}: cannot read it: {exc.strerror}") from None
    _check_private(path, st, "file")
    if st.st_size > MAX_FILE_BYTES:
        raise ConnectionFileError(f"{path}: {st.st_size} bytes is not a connection file")
    try:
        return msgspec.json.decode(path.read_bytes(), type=ConnectionInfo)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConnectionFileError(f"{path}: not a ringtop connection file: {exc}") from None


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)


def is_alive(pid: int) -> bool:
    """The run's serving process (the file's `pid`) still runs: not gone, not a zombie (killed,
    not yet reaped), and not another user's process that has our pid's number now."""
    return not process_gone(pid, others_count_as_gone=True)


def live_runs() -> list[ConnectionInfo]:
    """This user's runs whose rank 0 is alive on this host, newest first; files that cannot be
    trusted, and stale ones, are left out."""
    directory = runtime_dir()
    try:
        _private_dir(create=False)
        paths = sorted(directory.glob("run-*.json"))
    except (ConnectionFileError, OSError):
        return []
    here = socket.gethostname()
    runs = []
    for path in paths:
        try:
            info = read(path)
        except ConnectionFileError:
            continue
        if info.host != here:
            continue
        if is_alive(info.pid):
            runs.append(info)
        else:
            remove(path)  # its rank 0 is gone (killed before it could remove the file)
    return sorted(runs, key=lambda r: -r.started_ts)


def find(spec: str | None) -> ConnectionInfo:
    """The run a client means: `spec` is a run id (or its prefix), a connection file's path, or
    None for the only live run."""
    if spec and (spec.endswith(".json") or os.sep in spec):
        return read(Path(spec))
    runs = live_runs()
    if spec:
        matches = [r for r in runs if r.run_id.startswith(spec)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise ConnectionFileError(f"no live run of yours matches {spec!r} (`ringtop ls` lists them)")
        raise ConnectionFileError(f"{len(matches)} runs match {spec!r}: " + ", ".join(r.run_id for r in matches))
    if not runs:
        raise ConnectionFileError("no run of yours is live on this node (`ringtop demo` starts one; pass "
                                  "--connect ADDRESS for a run elsewhere, e.g. through ssh -L)")
    if len(runs) > 1:
        raise ConnectionFileError("several runs of yours are live; name one (`ringtop ui RUN_ID`): "
                                  + ", ".join(f"{r.run_id} (pid {r.pid}, started "
                                              f"{time.strftime('%H:%M:%S', time.localtime(r.started_ts))})"
                                              for r in runs))
    return runs[0]


WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "*"})


def same_address(given: str, announced: str) -> bool:
    """Whether a client's `tcp://HOST:PORT` reaches the socket a connection file announces: the
    same port, and the same host, or both loopback, or a socket bound to every interface."""
    from ringtop.protocol.endpoints import EndpointError, is_loopback, parse_tcp

    try:
        (host, port), (bound, bound_port) = parse_tcp(given), parse_tcp(announced)
    except EndpointError:
        return False
    if port != bound_port:
        return False
    return host == bound or bound in WILDCARD_HOSTS or (is_loopback(host) and is_loopback(bound))


def find_by_address(address: str, role: str) -> ConnectionInfo | None:
    """This user's live run on this node whose `role` address ("publish" or "control") is
    `address`: its keys, for a client given only the address. None if no run of this user's
    has it (a port forwarded from elsewhere, another user's run)."""
    matches = [r for r in live_runs() if same_address(address, getattr(r, role))]
    return matches[0] if len(matches) == 1 else None
