"""A process's threads read from outside, with py-spy (`py-spy dump --native`, an optional extra):
the only way to see a rank stuck in native code that holds the GIL, where none of its own threads
can answer. Used by the UI's and the watchers' look at a silent rank of their host and by
`ringtop bundle`.

py-spy lists each thread's frames innermost first, native ones (`sleep (libc.so.6)`) and Python
ones (`forward (model.py:57)`), and marks the thread it sees holding the GIL (`Thread 42
(active+gil): "MainThread"`) where it can tell; a thread asleep in native code while holding it is
often just `(idle)`."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from typing import NamedTuple

DUMP_TIMEOUT_S = 20.0
MAX_DUMP_CHARS = 256 * 1024
_THREAD = re.compile(r"^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)")
_FRAME = re.compile(r"^\s+(\S.*?)\s+\(([^()]*)\)\s*$")


class NativeDump(NamedTuple):
    """`text`: py-spy's whole answer (empty when there is none); `error`: why there is none."""

    text: str
    error: str = ""


def py_spy() -> str | None:
    return shutil.which("py-spy")


def dump(pid: int, timeout_s: float = DUMP_TIMEOUT_S) -> NativeDump:
    """py-spy's dump of `pid` (Python and native frames of every thread); blocks up to `timeout_s`:
    call it off any thread that must stay responsive."""
    spy = py_spy()
    if spy is None:
        return NativeDump("", "py-spy is not installed (pip install py-spy)")
    try:
        done = subprocess.run([spy, "dump", "--pid", str(pid), "--native"], capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return NativeDump("", f"py-spy did not answer: {exc}")
    if done.returncode != 0:  # e.g. no ptrace permission in a container
        why = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return NativeDump("", f"py-spy could not read it: {why[0][:300] if why else done.returncode}")
    return NativeDump(done.stdout[:MAX_DUMP_CHARS])


def threads(text: str) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(name, status, frames) of each thread of a dump; frames innermost first, (function, where)
    pairs, `where` a library (`libc.so.6`) or `file.py:line`."""
    found: list[tuple[str, str, list[tuple[str, str]]]] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head is not None:
            name = line.rsplit(":", 1)[-1].strip().strip('"')
            found.append((name, head.group(2), []))
            continue
        frame = _FRAME.match(line)
        if frame is not None and found:
            found[-1][2].append((frame.group(1), frame.group(2)))
    return found


def stuck_thread(text: str) -> list[tuple[str, str]] | None:
    """The frames of the thread a silent rank is stuck in: the one py-spy marks as holding the GIL,
    else the main thread (where a rank trains); None when the dump has neither."""
    found = threads(text)
    marked = next((frames for _, status, frames in found if "gil" in status.split("+")), None)
    if marked is not None:
        return marked
    return next((frames for name, _, frames in found if name == "MainThread"), None)


def short_stack(frames: list[tuple[str, str]]) -> str:
    """`sleep ← … ← pre_hook (faults.py:52)`: where it is stuck and the innermost Python frame that
    called into it (the code a user can read)."""
    if not frames:
        return ""
    inner = frames[0][0]
    python = next(((f, w) for f, w in frames if ".py:" in w), None)
    if python is None:
        return inner
    name, where = python
    place = f"{name} ({where.rsplit('/', 1)[-1]})"
    return place if python == frames[0] else f"{inner} ← … ← {place}"


STACK_EVERY_S = 15.0
"""A stuck process's stack is read again this often (py-spy stops the process for a moment)."""


class StackReader:
    """The latest short stack of each stuck rank's process, read off the caller's thread (a dump
    takes up to DUMP_TIMEOUT_S): `latest` answers at once with what was read so far and starts a
    read when one is due. The UI's exit probe and the watchers share it."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and py_spy() is not None
        self._read_of: dict[int, tuple[int, float, str]] = {}
        """rank -> (pid, when read, short stack) of its latest read."""
        self._reading: set[int] = set()

    def latest(self, rank: int, pid: int) -> str:
        """The latest short stack read of `rank`'s process `pid` ("" before one)."""
        kept = self._read_of.get(rank)
        due = kept is None or kept[0] != pid or time.monotonic() - kept[1] >= STACK_EVERY_S
        if self.enabled and due and rank not in self._reading:
            self._reading.add(rank)
            threading.Thread(target=self._read, args=(rank, pid), name=f"ringtop-stack-{rank}", daemon=True).start()
        return kept[2] if kept is not None and kept[0] == pid else ""

    def _read(self, rank: int, pid: int) -> None:
        try:
            found = dump(pid)
            frames = stuck_thread(found.text) if not found.error else None
            self._read_of[rank] = (pid, time.monotonic(), short_stack(frames or []))
        finally:
            self._reading.discard(rank)
