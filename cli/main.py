"""The `ringtop` command: ui, replay, run, demo, simulate, ctl, plan, models, bench, trace, diff, bundle.

Only `run` and `demo` start training, and they do it in child processes; this process never
imports torch, so the UI starts on a machine without it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ringtop.cli.live_runs import client_connection, client_target, connect_info, find_run, ls
from ringtop.cli.parser import build_parser
from ringtop.cli.terminal import one_line_error
from ringtop.cli.training import demo, run


def _ui(args: argparse.Namespace) -> int:
    from ringtop.tui.app import run_live

    found = client_connection(args, publish_flag=True)
    if found is None:
        return 2
    (publish, control, keys), follow = found
    if args.digests_from is None:
        return run_live(publish, control, keys=keys, follow=follow) or 0
    return run_live(publish, control, keys=keys, digest_min_ranks=args.digests_from, follow=follow) or 0


def _replay(args: argparse.Namespace) -> int:
    from ringtop.tui.app import run_replay

    logdir = args.logdir
    if not Path(logdir).exists() and "/" not in logdir:  # a live run's id: its logs, from its connection file
        info = find_run(logdir)
        if info is None:
            return 2
        if not info.log_dir:
            print(f"ringtop: run {info.run_id} writes no logs (it was started without --log-dir)", file=sys.stderr)
            return 2
        logdir = info.log_dir
    return run_replay(logdir) or 0


def _summary(args: argparse.Namespace) -> int:
    from ringtop.cli.summary import print_summary

    if not Path(args.logdir).is_dir():
        print(f"ringtop: {args.logdir}: no such log directory", file=sys.stderr)
        return 2
    if not any(Path(args.logdir).glob("rank-*.jsonl")):
        print(f"ringtop: no rank-R.jsonl files in {args.logdir!r} (a run's --log-dir holds them)", file=sys.stderr)
        return 2
    print_summary(Path(args.logdir))
    return 0


def _report(args: argparse.Namespace) -> int:
    """`ringtop report`: the run's plots as one HTML file (cli/report.py)."""
    logdir = Path(args.logdir)
    if not logdir.is_dir() or not any(logdir.glob("rank-*.jsonl")):
        return one_line_error("report", f"no rank-R.jsonl files in {args.logdir!r} (a run's --log-dir holds them)")
    from ringtop.cli.report import INSTALL_HINT, human_size, write_report

    try:
        import plotly  # noqa: F401
    except ImportError:
        from ringtop.metrics.install_hint import install_command

        return one_line_error("report", f"{INSTALL_HINT}: {install_command('report')}")
    try:
        out = write_report(logdir, Path(args.output))
    except OSError as exc:
        from ringtop.protocol.safe_files import not_written

        print(f"ringtop report: error: {not_written(args.output, exc)}", file=sys.stderr)
        return 1
    print(f"ringtop: wrote {out} ({human_size(out.stat().st_size)}); open it in a browser (works offline)")
    return 0


def _trace(args: argparse.Namespace) -> int:
    from ringtop.cli.trace import main as trace_main

    return trace_main(args)


def _diff(args: argparse.Namespace) -> int:
    from ringtop.cli.diff import main as diff_main

    return diff_main(args)


def _bundle(args: argparse.Namespace) -> int:
    from ringtop.cli.bundle import main as bundle_main

    return bundle_main(args)


def _ctl(args: argparse.Namespace) -> int:
    from ringtop.cli.ctl import run_ctl

    if args.command == "bundle":  # not a command to the run: `ringtop bundle` of it
        from ringtop.cli.bundle import main as bundle_main

        extra = [a for a in args.args if not a.startswith("out=")]
        if extra:
            return one_line_error("ctl", f"bundle takes out=FILE only, not {extra[0]!r}")
        out = next((a.removeprefix("out=") for a in args.args if a.startswith("out=")), None)
        return bundle_main(argparse.Namespace(run=args.run, output=out, no_live=False))

    target = client_target(args, publish_flag=False)
    if target is None:
        return 2
    _, control, keys = target
    return run_ctl(control, keys, args.command, args.args, args.timeout, args.json)


def _ckpt(ckpt_args: list[str]) -> int:
    from ringtop.cli.ckpt import main as ckpt_main

    return ckpt_main(ckpt_args)


def _plan(plan_args: list[str]) -> int:
    from ringtop.cli.plan import main as plan_main

    return plan_main(plan_args)


def _models(args: argparse.Namespace) -> int:
    from ringtop.cli.models import main as models_main

    return models_main(args)


def _bench(bench_args: list[str]) -> int:
    from ringtop.cli.bench import main as bench_main

    return bench_main(bench_args)


def _simulate(args: argparse.Namespace) -> int:
    from ringtop.cli.simulate import main as simulate

    return simulate(args)


def main(argv: list[str] | None = None) -> int:
    """The command, with everything it prints made inert for the terminal and a closed pipe
    (`ringtop ls | head`) ending it quietly with 141, as SIGPIPE would (cli/terminal.py)."""
    from ringtop.cli.terminal import quiet_broken_pipe, safe_terminal

    try:
        with safe_terminal():
            code = _command(argv)
            sys.stdout.flush()
        return code
    except BrokenPipeError:
        return quiet_broken_pipe()


def _command(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if argv and argv[0] == "plan":
        return _plan(argv[1:])
    if argv and argv[0] == "ckpt":
        return _ckpt(argv[1:])
    if argv and argv[0] == "bench":
        return _bench(argv[1:])
    if argv and argv[0] == "run":
        known, agent_args = parser.parse_known_args(argv)
        if agent_args[:1] == ["--"]:
            agent_args = agent_args[1:]
        if known.nproc < 1:
            return one_line_error("run", f"--nproc must be >= 1 (ranks on this node), not {known.nproc}")
        return run(known, agent_args)
    args = parser.parse_args(argv)
    if args.verb is None:
        args = parser.parse_args(["ui"])
    if args.verb == "demo" and args.nproc < 1:
        return one_line_error("demo", f"--nproc must be >= 1 (ranks on this node), not {args.nproc}")
    handlers = {"ui": _ui, "replay": _replay, "ctl": _ctl, "demo": demo, "ls": ls, "connect-info": connect_info,
                "summary": _summary, "report": _report, "simulate": _simulate, "models": _models, "trace": _trace,
                "diff": _diff, "bundle": _bundle}
    return handlers[args.verb](args)


if __name__ == "__main__":
    sys.exit(main())
