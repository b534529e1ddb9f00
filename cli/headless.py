"""`ringtop run` without the UI: logs in runs/RUN_ID/ by default, a progress line every few
seconds, and a failure told one line per rank with the launcher's full output kept beside the
logs (cli/launch_report.py)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

from ringtop.cli.launch import StderrTail, start_ranks, wait_ranks
from ringtop.cli.launch_report import LauncherOutput
from ringtop.cli.progress import ProgressPrinter
from ringtop.cli.summary import report_end
from ringtop.protocol.run_logs import LAUNCHER_OUTPUT


def run_headless(nproc: int, agent_args: list[str], cfg, logs: bool = True, progress_every_s: float = 5.0,
                 max_restarts: int = 0) -> int:
    """The run's exit code (cli/summary.py report_end: the launcher's; a stop by a command 0). `cfg`:
    the agent's config of `agent_args` (its --log-dir and --run-id are kept; without them they are
    added); `logs=False`: none
    written, so no progress lines either (they are read from the logs, which costs the ranks
    nothing); `progress_every_s=0`: no progress lines."""
    run_id = cfg.run_id or uuid.uuid4().hex[:8]
    if cfg.run_id is None:
        agent_args = [*agent_args, "--run-id", run_id]
    log_dir = Path(cfg.log_dir or Path("runs") / run_id) if logs and cfg.telemetry else None
    if log_dir is not None and cfg.log_dir is None:
        agent_args = [*agent_args, "--log-dir", str(log_dir)]
    where = f"logs in {log_dir}/" if log_dir is not None else "no logs"
    print(f"ringtop: run {run_id} on {nproc} rank{'s' if nproc != 1 else ''}, {where}", file=sys.stderr, flush=True)
    proc = start_ranks(nproc, agent_args, capture_stderr=True, max_restarts=max_restarts)
    output = LauncherOutput(proc.stderr, log_dir / LAUNCHER_OUTPUT) if log_dir is not None else StderrTail(proc)
    progress = None
    if log_dir is not None and progress_every_s > 0:
        progress = ProgressPrinter(log_dir, progress_every_s).start()
    try:
        code = wait_ranks(proc)
    finally:
        if progress is not None:
            progress.stop()
    return report_end(code, log_dir, output.text(), output.path if log_dir is not None else None)
