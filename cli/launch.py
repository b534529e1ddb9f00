"""Starts the ranks through torch's elastic launcher (what `torchrun` does) as a child process.

Kept torch-free in this process: the launcher runs as `python -m torch.distributed.run`, so the
UI beside it never imports torch.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from ringtop.agent.lifecycle import EXIT_WITH_PARENT_ENV, exit_with_parent
from ringtop.protocol import safe_files


def launcher_command(nproc: int, agent_args: list[str], max_restarts: int = 0) -> list[str]:
    restarts = [f"--max-restarts={max_restarts}"] if max_restarts else []
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *restarts,
        "-m", "ringtop.agent", *agent_args,
    ]


def start_ranks(nproc: int, agent_args: list[str], output_file: Path | None = None,
                capture_stderr: bool = False, max_restarts: int = 0) -> subprocess.Popen:
    """In a new session so one signal reaches the launcher and every rank it started; the launcher
    gets SIGTERM from the kernel if this process dies without stopping it (even by SIGKILL).
    `capture_stderr`: a pipe, for a StderrTail to pass on and keep. `max_restarts`: how many times
    the launcher starts every rank again after one fails (the run keeps its id)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONWARNINGS", "ignore")
    env[EXIT_WITH_PARENT_ENV] = "1"
    out = None
    if output_file is not None:
        folder = safe_files.open_dir(output_file.parent, what="log folder")
        try:
            out = safe_files.open_append(folder, output_file.name)
        finally:
            os.close(folder)
    try:
        stderr = subprocess.STDOUT if out else (subprocess.PIPE if capture_stderr else None)
        return subprocess.Popen(launcher_command(nproc, agent_args, max_restarts), env=env, stdout=out, stderr=stderr,
                                start_new_session=True, preexec_fn=exit_with_parent)
    finally:
        if out is not None:
            out.close()


class StderrTail:
    """Passes the launcher's stderr on to ours as it comes and keeps its last lines: they hold the
    launcher's failure report (which rank ended, by which signal)."""

    def __init__(self, proc: subprocess.Popen, max_lines: int = 400) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._thread = threading.Thread(target=self._copy, args=(proc.stderr,), name="ringtop-launcher-stderr",
                                        daemon=True)
        self._thread.start()

    def _copy(self, stream) -> None:
        out = getattr(sys.stderr, "buffer", None)
        for line in iter(stream.readline, b""):
            self._lines.append(line.decode(errors="replace"))
            try:
                if out is not None:
                    out.write(line)
                    out.flush()
            except (OSError, ValueError):
                pass  # our stderr is gone: keep draining, or the ranks would block on a full pipe

    def text(self, timeout_s: float = 2.0) -> str:
        """What was kept, once the launcher's stderr has closed (or `timeout_s` passed)."""
        self._thread.join(timeout_s)
        return "".join(self._lines)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc). torch's launcher starts each rank in a session of
    its own, so a signal to the launcher's group does not reach them."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_all(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_ranks(proc: subprocess.Popen, timeout_s: float = 15.0, sig: int = signal.SIGTERM) -> int:
    """`sig` to the launcher (it passes it on to the ranks, which send their Bye), then SIGKILL
    whatever of the launcher and its ranks is left. Ctrl-C is passed on as SIGINT, so that each
    rank's Bye says who stopped it (metrics/run_lifecycle.py)."""
    if proc.poll() is None:
        ranks = descendants(proc.pid)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            kill_all([proc.pid, *ranks])
            proc.wait()
        kill_all(ranks)
    return proc.returncode


class _Stopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum, frame):
    raise _Stopped(signum)


def forward_stop_signals(proc: subprocess.Popen) -> None:
    """SIGTERM (timeout, scancel, systemd) and SIGHUP (the ssh session dropped) stop the ranks
    before this process exits, as Ctrl-C does; for use while something else (the UI) runs. The
    terminal is given back as it was (the UI had it in raw mode on its alternate screen)."""
    restore = _terminal_restorer()

    def stop(signum, frame):
        signal.signal(signum, signal.SIG_IGN)  # a second one while stopping changes nothing
        restore()
        print(f"\nringtop: {signal.Signals(signum).name}: stopping the ranks ...", file=sys.stderr, flush=True)
        stop_ranks(proc)
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def _terminal_restorer():
    """A function that puts the terminal back as it is now: mode, screen, cursor, mouse."""
    try:
        import termios

        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
    except Exception:  # no terminal (a pipe, a service): nothing to give back
        return lambda: None

    def restore() -> None:
        try:
            termios.tcsetattr(fd, termios.TCSANOW, saved)
            out = sys.__stdout__  # the UI captures sys.stdout while it runs
            if out is not None and out.isatty():
                out.write("\x1b[?1000l\x1b[?1003l\x1b[?1006l\x1b[?1015l\x1b[?2004l\x1b[?25h\x1b[?1049l")
                out.flush()
        except Exception:
            pass
    return restore


def wait_ranks(proc: subprocess.Popen) -> int:
    """Wait for the run. Ctrl-C, SIGTERM and SIGHUP stop it cleanly: the ranks get SIGINT for
    Ctrl-C, SIGTERM otherwise (they finish the step and send their Bye), whatever is left after a
    grace period is killed; the exit code is 130 for Ctrl-C, 128 + the signal otherwise (not the
    launcher's own, which says only that it was interrupted). SIGINT is handled here too, not left
    to Python's default: a command started in the background of a script inherits SIGINT ignored,
    and `kill -INT` must still stop its ranks cleanly."""
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        return proc.wait()
    except (KeyboardInterrupt, _Stopped) as exc:
        signum = exc.signum if isinstance(exc, _Stopped) else signal.SIGINT
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        print(f"\nringtop: {signal.Signals(signum).name}: stopping the ranks ...", file=sys.stderr, flush=True)
        stop_ranks(proc, sig=signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
        return 128 + signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
