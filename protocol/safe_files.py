"""Creating the run's files so that nothing planted in its folders can redirect a write.

Everything is done relative to an opened, verified directory (`dir_fd`): files are created with
`O_EXCL | O_NOFOLLOW`, directories made fresh and reopened with `O_NOFOLLOW | O_DIRECTORY`,
published by a rename inside the directory (a rename replaces a planted link, never writes through
it), and trees removed without following links. A run folder that is a link, another user's, or
writable by others is refused with the reason, as ssh refuses such a key folder. Files are 0600 and
folders 0700 unless the owner asked for group-readable ones (0640 / 0750, for teams sharing runs).
Writers that only take a path (DCP, the profiler) get `fd_path`: the kernel resolves it through
the opened directory, not through its name. A file the user names (`-o FILE`) goes where they say,
by the same exclusive create and rename, and a link standing at its name is refused. Stdlib only:
the CLI and the UI write with it too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path
from typing import IO, BinaryIO, Iterator

_DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_group_readable = False


class UnsafePathError(OSError):
    """A folder or file the run would write is a link, another user's, or writable by others."""

    def __str__(self) -> str:
        return str(self.strerror)


def set_group_readable(on: bool) -> None:
    """Once, at start: `--group-readable` (0640 files, 0750 folders) instead of private."""
    global _group_readable
    _group_readable = bool(on)


def file_mode() -> int:
    return 0o640 if _group_readable else 0o600


def dir_mode() -> int:
    return 0o750 if _group_readable else 0o700


def process_umask() -> int:
    """For a process that is ringtop's alone (the agent): what a path-only writer creates is private too."""
    return 0o027 if _group_readable else 0o077


def _refuse_unsafe(path: str | os.PathLike, st: os.stat_result, what: str) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(errno.ELOOP, f"refusing {what} {path}: it is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(errno.ENOTDIR, f"refusing {what} {path}: it is not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafePathError(errno.EPERM, f"refusing {what} {path}: bad ownership (it belongs to uid {st.st_uid}, "
                                           f"not {os.geteuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePathError(errno.EPERM, f"refusing {what} {path}: bad permissions (mode "
                                           f"{stat.S_IMODE(st.st_mode):04o}, writable by others); "
                                           f"chmod go-w {path}")


def check_dir(path: str | os.PathLike, what: str = "run folder") -> None:
    """Raise UnsafePathError if an existing folder is a link, another user's or writable by others."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    _refuse_unsafe(path, st, what)


def open_dir(path: str | os.PathLike, create: bool = True, what: str = "run folder") -> int:
    """An fd of the verified folder `path` (made, with its missing parents, private if absent)."""
    path = Path(path)
    if create and not os.path.lexists(path):
        missing = []
        parent = path
        while not os.path.lexists(parent) and parent != parent.parent:
            missing.append(parent)
            parent = parent.parent
        for folder in reversed(missing):
            try:
                os.mkdir(folder, dir_mode())
            except FileExistsError:
                pass
    st = os.lstat(path)
    _refuse_unsafe(path, st, what)
    fd = os.open(path, _DIR_OPEN)
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise UnsafePathError(errno.EAGAIN, f"refusing {what} {path}: it was replaced while being opened")
    return fd


def open_subdir(dir_fd: int, name: str, create: bool = True, what: str = "folder") -> int:
    """An fd of the verified folder `name` inside `dir_fd`, made private if absent."""
    if create:
        try:
            os.mkdir(name, dir_mode(), dir_fd=dir_fd)
        except FileExistsError:
            pass
    try:
        fd = os.open(name, _DIR_OPEN, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePathError(exc.errno, f"refusing {what} {name}: it is a symbolic link or not a "
                                             "directory") from None
        raise
    try:
        _refuse_unsafe(name, os.fstat(fd), what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_dir(dir_fd: int, name: str) -> int:
    """A fresh private folder `name` inside `dir_fd` (it must not exist), opened."""
    os.mkdir(name, dir_mode(), dir_fd=dir_fd)
    fd = os.open(name, _DIR_OPEN, dir_fd=dir_fd)
    os.fchmod(fd, dir_mode())  # the umask may have taken bits off; never adds any
    return fd


def create(dir_fd: int, name: str) -> BinaryIO:
    """A new file `name` inside `dir_fd`, open for writing; a planted link or file there is an error."""
    return os.fdopen(os.open(name, _NEW_FILE, file_mode(), dir_fd=dir_fd), "wb")


def open_append(dir_fd: int, name: str, buffering: int = 0) -> BinaryIO:
    """`name` inside `dir_fd` for appending (a log): made if absent, refused if a link or not this user's file."""
    fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode(),
                 dir_fd=dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
        os.close(fd)
        raise UnsafePathError(errno.EPERM, f"refusing to append to {name}: not a file of this user's alone")
    return os.fdopen(fd, "ab", buffering=buffering)


def temporary_name(name: str) -> str:
    """A name nobody can plant ahead of time."""
    return f".{name}.tmp-{os.getpid()}-{secrets.token_hex(6)}"


@contextlib.contextmanager
def replacing(dir_fd: int, name: str, encoding: str | None = None) -> Iterator[IO]:
    """A new file that replaces `name` inside `dir_fd` whole once the block ends without an error
    (a link planted at `name` is replaced, not followed); text if `encoding` is given."""
    tmp = temporary_name(name)
    fd = os.open(tmp, _NEW_FILE, file_mode(), dir_fd=dir_fd)
    try:
        with open(fd, "w" if encoding else "wb", encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)


def write_atomic(dir_fd: int, name: str, data: bytes) -> None:
    """`name` inside `dir_fd` replaced whole by `data` (a link planted at `name` is replaced, not followed)."""
    with replacing(dir_fd, name) as f:
        f.write(data)


@contextlib.contextmanager
def output_file(path: str | os.PathLike, encoding: str | None = None) -> Iterator[IO]:
    """A file the user named (`-o FILE`): written where they say, by a rename inside its folder,
    with the run's mode. The folder is reached as the user's path reaches it; at the final name
    only a regular file is replaced: a link there (planted, or not) is refused, never followed."""
    path = Path(path)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _refuse_output(folder, path)
        with replacing(folder, path.name, encoding) as f:
            yield f
    finally:
        os.close(folder)


def check_output(path: str | os.PathLike) -> None:
    """Raise what `output_file` would before it writes (before a long job, to fail at once)."""
    path = Path(path)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _refuse_output(folder, path)
    finally:
        os.close(folder)


def _refuse_output(folder: int, path: Path) -> None:
    try:
        st = os.lstat(path.name, dir_fd=folder)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(errno.ELOOP, f"refusing to write {path}: it is a symbolic link "
                                           "(remove it, or name the file it points at)")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(errno.EEXIST, f"refusing to write {path}: it is not a regular file")


def not_written(path: str | os.PathLike, exc: OSError) -> str:
    """Why `path` was not written, in one line (a refusal says it whole)."""
    return str(exc) if isinstance(exc, UnsafePathError) else f"cannot write {path}: {exc}"


def write_output(path: str | os.PathLike, data: bytes) -> None:
    """`data` as the file the user named (`output_file`)."""
    with output_file(path) as f:
        f.write(data)


def write_files(directory: str | os.PathLike, files: dict[str, bytes], what: str = "folder") -> None:
    """Each of `files` (name: data) replaced whole inside `directory`, made private if absent."""
    path = Path(directory)
    parent_fd = open_dir(path.parent, what=what)
    try:
        fd = open_subdir(parent_fd, path.name, what=what)
    finally:
        os.close(parent_fd)
    try:
        for name, data in files.items():
            write_atomic(fd, name, data)
    finally:
        os.close(fd)


def remove_tree(dir_fd: int, name: str) -> None:
    """`name` inside `dir_fd` gone, whatever it is, following no link (a link is removed, its target kept)."""
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, _DIR_OPEN, dir_fd=dir_fd)
    try:
        for entry in list(os.scandir(fd)):
            remove_tree(fd, entry.name)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def entry_kind(dir_fd: int, name: str) -> str:
    """'absent', 'dir' (a real one of this user's), 'link' or 'other': what stands at `name`."""
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return "absent"
    if stat.S_ISLNK(st.st_mode):
        return "link"
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        return "dir"
    return "other"


def finish_tree(dir_fd: int) -> int:
    """Every file under `dir_fd` fsynced and given the run's mode (a path-only writer used the
    umask); the bytes they hold. Links are not followed."""
    total = 0
    for _root, dirs, files, root_fd in os.fwalk(dir_fd=dir_fd, follow_symlinks=False):
        for name in dirs:
            set_mode(root_fd, name, dir_mode())
        for name in files:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    continue
                raise
            try:
                st = os.fstat(fd)
                if stat.S_ISREG(st.st_mode):
                    os.fchmod(fd, file_mode())
                    os.fsync(fd)
                    total += st.st_size
            finally:
                os.close(fd)
    os.fsync(dir_fd)
    return total


def set_mode(dir_fd: int, name: str, mode: int) -> None:
    """`name` inside `dir_fd` given `mode`, through an fd opened without following a link."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def fd_path(fd: int) -> str:
    """A path that names the opened directory itself, for writers that only take a path."""
    return f"/proc/self/fd/{fd}"


def same_dir(fd: int, identity: tuple[int, int]) -> bool:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino) == identity


def identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino
