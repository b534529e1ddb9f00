"""What a failed `ringtop run` says: one line per rank (what ended it, first failure first) and
where the launcher's full output is, instead of torch's 45-line elastic report.

The causes come from the ranks' logs (a Bye's reason; a log that ends without one), then from
the launcher's output (the agent's own `error:` line of a rank that failed before its log
opened; the launcher's per-rank exit codes).
"""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path

from ringtop.metrics.rank_sets import ranks_text
from ringtop.protocol import Bye, Step, read_log, safe_files
from ringtop.protocol.run_logs import signal_name

MAX_RANK_LINES = 8
"""More failed ranks than this: the rest are counted, and the full report has them."""

MAX_CAUSE_CHARS = 200

"""The launcher's output (and the ranks' stderr) in the run's log folder."""

_AGENT_ERROR = re.compile(r"ringtop agent \[rank (\d+)\]: (error: .+?)(?=ringtop agent \[rank |\n|$)")
"""A rank's own error line (the agent's last word when it cannot train); a lookahead, as two
ranks writing at once can share a line."""
_AGENT_CONFIG_ERROR = re.compile(r"ringtop agent: error: (.+?)(?=ringtop agent|\n|$)")
_AGENT_ERROR_LINE = re.compile(r"ringtop agent(?: \[rank \d+\])?: error: ")
_LAUNCHER_EXIT = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_LAUNCHER_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S*torch/distributed/")
"""torch's elastic launcher logging (glog style: `E1204 18:23:13.261000 8093 torch/distributed/...`)."""


def launcher_exits(launcher_output: str) -> dict[int, int]:
    """Rank -> its exit code, from the failure report torch's elastic launcher prints (`rank : 1
    (local_rank: 1)` / `exitcode : -9 (pid: ...)`; negative: the signal that ended it)."""
    return {int(rank): int(code) for rank, code in _LAUNCHER_EXIT.findall(launcher_output)}


def _one_line(text: str) -> str:
    text = " ".join(text.split())  # a traceback's lines, made one
    return text[:MAX_CAUSE_CHARS] + ("…" if len(text) > MAX_CAUSE_CHARS else "")


def _from_logs(log_dir: Path | None, exits: dict[int, int]) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(ranks whose log ends without a Bye, the one whose log ends first first; ranks whose Bye
    says they failed), each as (rank, cause)."""
    silent, failed = [], []
    if log_dir is None:
        return silent, failed
    for path in sorted(log_dir.glob("rank-*.jsonl"), key=lambda p: int(p.stem.split("-")[1])):
        messages = read_log(path)
        if not messages:
            continue
        rank = int(path.stem.split("-")[1])
        last_step = max((m.step for m in messages if isinstance(m, Step)), default=0)
        bye = messages[-1] if isinstance(messages[-1], Bye) else None
        if bye is None:
            code = exits.get(rank)
            how = (f"killed by {signal_name(-code)}" if code is not None and code < 0
                   else f"exit code {code}" if code else "killed by a signal, or crashed")
            silent.append((messages[-1].ts, rank, f"ended without a Bye after step {last_step} ({how})"))
        elif not bye.ok:
            failed.append((rank, _one_line(bye.reason)))
    return [(rank, text) for _, rank, text in sorted(silent)], failed


def rank_causes(log_dir: Path | None, launcher_output: str) -> list[tuple[int, str]]:
    """(rank, what ended it) for every rank that did not end well, the first failure first: a
    rank killed (no Bye) before ranks whose Bye reports the error its death caused them."""
    exits = launcher_exits(launcher_output)
    silent, failed = _from_logs(log_dir, exits)
    causes = [*silent, *failed]
    known = {rank for rank, _ in causes}
    for rank, text in _AGENT_ERROR.findall(launcher_output):
        if int(rank) not in known:
            causes.append((int(rank), _one_line(text)))
            known.add(int(rank))
    config_error = _AGENT_CONFIG_ERROR.search(launcher_output)
    for rank, code in sorted(exits.items(), key=lambda rc: (rc[1] < 0, rc[0])):  # a rank's own exit before a signal
        if rank in known:
            continue
        if code < 0:
            by = signal_name(-code)
            text = (f"stopped by the launcher ({by}) after another rank failed" if causes and by == "SIGTERM"
                    else f"killed by {by}")
        elif config_error is not None:
            text = "error: " + _one_line(config_error.group(1))
        else:
            text = f"exit code {code}"
        causes.append((rank, text))
        known.add(rank)
    return causes


def grouped(causes: list[tuple[int, str]]) -> list[tuple[list[int], str]]:
    """Ranks that ended for the same reason on one line (eight ranks that cannot import the
    model are one line, not eight), in the order each reason first appears."""
    by_text: dict[str, list[int]] = {}
    for rank, text in causes:
        by_text.setdefault(text, []).append(rank)
    return [(ranks, text) for text, ranks in by_text.items()]


def failure_report(log_dir: Path | None, launcher_code: int, launcher_output: str,
                   report_path: Path | None) -> list[str]:
    """The lines a failed run ends with: a headline, one line per rank (ranks of one cause
    together), where the full report is."""
    causes = grouped(rank_causes(log_dir, launcher_output))
    lines = ["ringtop: the run failed:" if causes else f"ringtop: the run failed (launcher exit code {launcher_code})"]
    for ranks, text in causes[:MAX_RANK_LINES]:
        lines.append(f"  {ranks_text(ranks)}: {text}")
    if len(causes) > MAX_RANK_LINES:
        more = sum(len(ranks) for ranks, _ in causes[MAX_RANK_LINES:])
        lines.append(f"  … and {more} more rank{'s' if more != 1 else ''}")
    if report_path is not None:
        lines.append(f"  the launcher's full report: {report_path}")
    return lines


def print_failure(code: int, log_dir: Path | None, launcher_output: str, report_path: Path | None) -> None:
    """The failure report on stderr, if the run failed (not after a stop signal: 128 + it)."""
    if code == 0 or code >= 128:
        return
    print("\n".join(failure_report(log_dir, code, launcher_output, report_path)), file=sys.stderr)


class LauncherOutput:
    """Keeps the launcher's stderr (the ranks' too) in a file of the run's log folder and passes on
    to ours what is the ranks' and the user's: not torch's elastic logging, not its failure report
    (from the launcher's first error on), not the agent's `error:` lines (the failure report
    has them, one per rank)."""

    def __init__(self, stream, path: Path) -> None:
        self.path = path
        folder = safe_files.open_dir(path.parent, what="log folder")  # private, no planted link followed
        try:
            self._file = safe_files.open_append(folder, path.name)
        finally:
            os.close(folder)
        self._reporting = False
        self._thread = threading.Thread(target=self._copy, args=(stream,), name="ringtop-launcher-output",
                                        daemon=True)
        self._thread.start()

    def passes_on(self, line: str) -> bool:
        if _LAUNCHER_LINE.match(line):
            if line.startswith("E"):
                self._reporting = True  # its traceback and report follow
            return False
        return not self._reporting and not _AGENT_ERROR_LINE.search(line)

    def _copy(self, stream) -> None:
        out = getattr(sys.stderr, "buffer", None)
        for line in iter(stream.readline, b""):
            try:
                self._file.write(line)
                self._file.flush()
            except (OSError, ValueError):
                pass  # a full disk: keep draining, or the ranks would block on a full pipe
            try:
                if out is not None and self.passes_on(line.decode(errors="replace")):
                    out.write(line)
                    out.flush()
            except (OSError, ValueError):
                pass
        self._file.close()

    def text(self, timeout_s: float = 2.0, max_bytes: int = 256 * 1024) -> str:
        """The file's last `max_bytes`, once the launcher's stderr has closed (or `timeout_s` passed)."""
        self._thread.join(timeout_s)
        try:
            with open(self.path, "rb") as f:
                f.seek(max(0, self.path.stat().st_size - max_bytes))
                return f.read().decode(errors="replace")
        except OSError:
            return ""
