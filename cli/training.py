"""The commands that start training, `run` and `demo`: the ranks in child processes (this one
never imports torch), headless or with the UI on them, and the run's last words."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
from pathlib import Path

from ringtop.cli.parser import DEMO_STEPS_HEADLESS, DEMO_STEPS_UI
from ringtop.cli.terminal import one_line_error
from ringtop.protocol import free_tcp_ports


def _agent_config(agent_args: list[str]):
    """The ranks' config of these options (checked here, before any rank starts), or None after
    saying what is wrong."""
    from ringtop.agent.config import ConfigError, parse_agent_args

    try:
        return parse_agent_args(agent_args)
    except ConfigError as exc:
        print(f"ringtop: error: {exc}", file=sys.stderr)
        return None


def run(args: argparse.Namespace, agent_args: list[str]) -> int:
    cfg = _agent_config(agent_args)
    if cfg is None:
        return 2
    if args.no_logs and cfg.log_dir is not None:
        return one_line_error("run", "--no-logs and --log-dir contradict each other: drop one")
    if args.no_logs and args.ui:
        return one_line_error("run", "--no-logs is for runs without --ui (the UI's runs keep their logs, for replay)")
    if not has_torch():
        return 2
    modes_as_the_ranks(cfg.group_readable)
    if not args.ui:
        from ringtop.cli.headless import run_headless

        return run_headless(args.nproc, agent_args, cfg, logs=not args.no_logs,
                            progress_every_s=0.0 if args.quiet else args.progress_every, max_restarts=args.max_restarts)
    run_id = cfg.run_id or uuid.uuid4().hex[:8]
    if cfg.run_id is None:
        agent_args = [*agent_args, "--run-id", run_id]
    log_dir = Path(cfg.log_dir or Path("runs") / run_id)
    if cfg.log_dir is None:
        agent_args = [*agent_args, "--log-dir", str(log_dir)]
    return run_with_ui(args.nproc, agent_args, log_dir, run_id, max_restarts=args.max_restarts)


def modes_as_the_ranks(group_readable: bool) -> None:
    """What this process makes for the run (its folder, agents.log) gets the ranks' modes: with
    `--group-readable` 0750 / 0640, the umask set as each rank sets its own (agent/__main__.py), so
    that a user's 077 does not narrow them."""
    from ringtop.protocol import safe_files

    safe_files.set_group_readable(group_readable)
    if group_readable:
        os.umask(safe_files.process_umask())


def has_torch() -> bool:
    """Whether the ranks can import torch (this process never does); if not, says how to add it."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        return True
    from ringtop.metrics.install_hint import install_command

    print(f"ringtop: the ranks need torch, which is not installed here: {install_command('agent')}", file=sys.stderr)
    return False


def run_with_ui(nproc: int, agent_args: list[str], log_dir: Path, run_id: str | None = None,
                max_restarts: int = 0) -> int:
    """Start the ranks, wait for rank 0's connection file (its addresses and keys), open the UI.
    `run_id`: the one the agent options name; None: a new one, added to them."""
    from ringtop.cli.launch import forward_stop_signals, start_ranks, stop_ranks, wait_ranks
    from ringtop.protocol.connection_file import ConnectionFileError, ensure_runtime_dir
    from ringtop.protocol.run_logs import LauncherFailures
    from ringtop.tui.app import run_live

    try:
        ensure_runtime_dir()  # rank 0 writes the run's addresses and keys there; the UI waits for them
    except (ConnectionFileError, OSError) as exc:
        print(f"ringtop: no place for the run's connection file: {exc}", file=sys.stderr)
        return 2
    if run_id is None:
        run_id = uuid.uuid4().hex[:8]
        agent_args = [*agent_args, "--run-id", run_id]
    output = log_dir / "agents.log"
    proc = start_ranks(nproc, agent_args, output_file=output, max_restarts=max_restarts)
    forward_stop_signals(proc)
    print(f"ringtop: starting run {run_id} on {nproc} ranks (output: {output}) ...", file=sys.stderr, flush=True)
    try:
        info = _await_connection_file(proc, run_id)
    except KeyboardInterrupt:
        print("\nringtop: SIGINT: stopping the ranks ...", file=sys.stderr, flush=True)
        stop_ranks(proc, sig=signal.SIGINT)
        print("ringtop: the run stopped by Ctrl-C before rank 0 was up (exit code 130)", file=sys.stderr)
        return 130
    if info is None:
        code = wait_ranks(proc)
        print("ringtop: the ranks ended before rank 0 was up", file=sys.stderr)
        report_failure(code or 1, str(log_dir), _tail_of(output), output)
        return code or 1
    run_live(info.publish, info.control, keys=info.keys, launcher_exits=launcher_exits_for_ui(proc, output),
             launcher_failed=LauncherFailures(output), follow=info)
    if proc.poll() is None:
        print(f"ringtop: the UI is closed; the {nproc} ranks keep training (output: {output}).\n"
              f"  re-attach:  ringtop ui {run_id}\n"
              f"  stop them:  Ctrl-C here, or  ringtop ctl --run {run_id} stop", file=sys.stderr)
    return report_failure(wait_ranks(proc), str(log_dir), _tail_of(output), output)


def launcher_exits_for_ui(proc, output: Path):
    """For the UI: None while the launcher runs; then the signal its report says ended each rank."""
    from ringtop.cli.summary import launcher_signals

    said: list[dict[int, str]] = []  # read once: the report does not change after the launcher's exit

    def exits() -> dict[int, str] | None:
        if proc.poll() is None:
            return None
        if not said:
            said.append({rank: f"killed by {sig}" for rank, sig in launcher_signals(_tail_of(output)).items()})
        return said[0]
    return exits


def _tail_of(path: Path, max_bytes: int = 64 * 1024) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - max_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _await_connection_file(proc, run_id: str):
    """Rank 0's connection file once it is written, or None if the launcher ends first."""
    from ringtop.protocol.connection_file import ConnectionFileError, file_for, read

    path = file_for(run_id)
    while proc.poll() is None:
        if path.exists():
            try:
                return read(path)
            except ConnectionFileError:
                pass  # being replaced right now: read it again
        time.sleep(0.1)
    return None


def report_failure(code: int, log_dir: str | None, launcher_output: str = "", report: Path | None = None) -> int:
    """The run's last words, as its lifecycle says (cli/summary.py report_end): completed, stopped by
    whom, or one line per rank that failed, the first failure first, and where the launcher's full
    report is; returns the exit code that agrees with them."""
    from ringtop.cli.summary import report_end

    return report_end(code, Path(log_dir) if log_dir else None, launcher_output, report)


def demo(args: argparse.Namespace) -> int:
    ports = free_tcp_ports(3)
    publish, relay, control = (f"tcp://127.0.0.1:{p}" for p in ports)
    log_dir = Path(args.log_dir or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    steps = args.steps if args.steps is not None else (DEMO_STEPS_HEADLESS if args.headless else DEMO_STEPS_UI)
    agent_args = ["--steps", str(steps), "--log-dir", str(log_dir), "--publish", publish, "--relay", relay,
                  "--control", control, "--checkpoint-dir", str(log_dir / "checkpoints"),
                  "--model-size", args.model_size]
    if args.headless:
        from ringtop.cli.launch import start_ranks, wait_ranks
        from ringtop.cli.launch_report import LauncherOutput
        from ringtop.cli.summary import print_summary
        from ringtop.protocol.run_logs import LAUNCHER_OUTPUT

        print(f"ringtop demo: {args.nproc} CPU ranks, tiny-gpt {args.model_size}, {steps} steps, logs in {log_dir}",
              file=sys.stderr)
        proc = start_ranks(args.nproc, [*agent_args, "--print-every", "10"], capture_stderr=True)
        output = LauncherOutput(proc.stderr, log_dir / LAUNCHER_OUTPUT)
        code = wait_ranks(proc)
        print_summary(log_dir)
        code = report_failure(code, str(log_dir), output.text(), output.path)
        print(f"\nreplay it:  ringtop replay {log_dir}")
        return code
    return run_with_ui(args.nproc, agent_args, log_dir)
