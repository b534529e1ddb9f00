"""The `ringtop` command: ui, replay, run, demo, simulate, ctl, plan, models, bench.

Only `run` and `demo` start training, and they do it in child processes; this process never
imports torch, so the UI starts on a machine without it.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

from ringtop.protocol import COMMANDS, DEFAULT_CONTROL_ADDRESS, DEFAULT_PUBLISH_ADDRESS, free_tcp_port

DEMO_STEPS_UI = 600
DEMO_STEPS_HEADLESS = 40


def _digest_ranks(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of ranks: {text!r}") from None
    if not 0 <= n <= 1 << 20:
        raise argparse.ArgumentTypeError(f"{n} is not between 0 and {1 << 20}")
    return n or (1 << 21)


def _ui(args: argparse.Namespace) -> int:
    from ringtop.tui.app import run_live

    target = _client_target(args, publish_flag=True)
    if target is None:
        return 2
    publish, control, keys = target
    if args.digests_from is None:
        return run_live(publish, control, keys=keys) or 0
    return run_live(publish, control, keys=keys, digest_min_ranks=args.digests_from) or 0


def _client_target(args: argparse.Namespace, publish_flag: bool):
    """(publish, control, keys) for `ui` and `ctl`, or None after saying why there is none.

    A run of this user on this node is found by its connection file (`args.run`, or the only
    live one); `--keys FILE` names a connection file (copied from the node, for `ssh -L`);
    `--connect`/`--control` override its addresses. Never a guessed port: on a shared node it
    may be another user's job."""
    from ringtop.protocol.connection_file import ConnectionFileError, read

    if args.keys and args.insecure:
        print("ringtop: --keys and --insecure contradict each other: drop one", file=sys.stderr)
        return None
    connect = args.connect
    control = args.control if publish_flag else connect
    if args.insecure:
        if connect is None:
            print("ringtop: --insecure needs --connect ADDRESS (a run started with --insecure)", file=sys.stderr)
            return None
        return (connect if publish_flag else "", control, None)
    try:
        if args.keys:
            info = read(Path(args.keys))
        elif connect is not None:
            print("ringtop: --connect needs the run's keys: --keys FILE (its connection file; on the run's node "
                  "`ringtop connect-info > run.json` writes it), or --insecure for a run started with "
                  "--insecure", file=sys.stderr)
            return None
        else:
            info = _find_run(args.run)
            if info is None:
                return None
    except ConnectionFileError as exc:
        print(f"ringtop: {exc}", file=sys.stderr)
        return None
    publish = (connect if publish_flag and connect else info.publish)
    return publish, (control or info.control), info.keys


def _find_run(spec: str | None):
    """This user's live run named by `spec` (or the only one, or the one the user picks on a
    terminal), from its connection file; None after saying why there is none."""
    from ringtop.protocol.connection_file import ConnectionFileError, find, live_runs

    try:
        if spec is None and sys.stdin.isatty() and sys.stderr.isatty():
            runs = live_runs()
            if len(runs) > 1:
                return _choose(runs)
        return find(spec)
    except ConnectionFileError as exc:
        print(f"ringtop: {exc}", file=sys.stderr)
        return None


def _choose(runs: list):
    """Ask which of several live runs (on a terminal): the newest is the default."""
    print("several runs of yours are live on this node:", file=sys.stderr)
    for i, r in enumerate(runs, 1):
        started = time.strftime("%H:%M:%S", time.localtime(r.started_ts))
        print(f"  {i}) {r.run_id}  {r.world_size} ranks, started {started}, pid {r.pid}, logs {r.log_dir or '-'}",
              file=sys.stderr)
    try:
        answer = input(f"which one? [1-{len(runs)}, Enter = 1] ").strip()
    except EOFError:
        return None
    if not answer:
        return runs[0]
    if answer.isdigit() and 1 <= int(answer) <= len(runs):
        return runs[int(answer) - 1]
    print(f"ringtop: {answer!r} is not one of 1-{len(runs)}", file=sys.stderr)
    return None


def _ls(args: argparse.Namespace) -> int:
    from ringtop.protocol.connection_file import live_runs, runtime_dir

    runs = live_runs()
    if not runs:
        print(f"no run of yours is live on this node (connection files: {runtime_dir()})")
        return 0
    print(f"{'run':<10} {'pid':>8} {'ranks':>5}  {'started':<19} {'telemetry':<24} {'control':<24} logs")
    for r in runs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started_ts))
        insecure = "  (insecure)" if r.insecure else ""
        print(f"{r.run_id:<10} {r.pid:>8} {r.world_size:>5}  {started:<19} {r.publish:<24} {r.control:<24} "
              f"{r.log_dir or '-'}{insecure}")
    return 0


def _connect_info(args: argparse.Namespace) -> int:
    import msgspec

    info = _find_run(args.run)
    if info is None:
        return 2
    print(msgspec.json.format(msgspec.json.encode(info)).decode())
    return 0


def _replay(args: argparse.Namespace) -> int:
    from ringtop.tui.app import run_replay

    logdir = args.logdir
    if not Path(logdir).exists() and "/" not in logdir:  # a live run's id: its logs, from its connection file
        info = _find_run(logdir)
        if info is None:
            return 2
        if not info.log_dir:
            print(f"ringtop: run {info.run_id} writes no logs (it was started without --log-dir)", file=sys.stderr)
            return 2
        logdir = info.log_dir
    return run_replay(logdir) or 0


def _summary(args: argparse.Namespace) -> int:
    from .summary import print_summary

    if not Path(args.logdir).is_dir():
        print(f"ringtop: {args.logdir}: no such log directory", file=sys.stderr)
        return 2
    print_summary(Path(args.logdir))
    return 0


def _ctl(args: argparse.Namespace) -> int:
    from .ctl import run_ctl

    target = _client_target(args, publish_flag=False)
    if target is None:
        return 2
    _, control, keys = target
    return run_ctl(control, keys, args.command, args.args, args.timeout, args.json)


def _ckpt(ckpt_args: list[str]) -> int:
    from .ckpt import main as ckpt_main

    return ckpt_main(ckpt_args)


def _plan(plan_args: list[str]) -> int:
    from .plan import main as plan_main

    return plan_main(plan_args)


def _models(args: argparse.Namespace) -> int:
    from .models import main as models_main

    return models_main(args)


def _bench(bench_args: list[str]) -> int:
    from .bench import main as bench_main

    return bench_main(bench_args)


def _agent_config(agent_args: list[str]):
    """The ranks' config of these options (checked here, before any rank starts), or None after
    saying what is wrong."""
    from ringtop.agent.config import ConfigError, parse_agent_args

    try:
        return parse_agent_args(agent_args)
    except ConfigError as exc:
        print(f"ringtop: error: {exc}", file=sys.stderr)
        return None


def _run(args: argparse.Namespace, agent_args: list[str]) -> int:
    cfg = _agent_config(agent_args)
    if cfg is None:
        return 2
    from .launch import StderrTail, start_ranks, wait_ranks

    if not args.ui:
        proc = start_ranks(args.nproc, agent_args, capture_stderr=True)
        tail = StderrTail(proc)
        code = wait_ranks(proc)
        _report_failure(code, cfg.log_dir, tail.text())
        return code
    log_dir = Path(cfg.log_dir or f"runs/run-{time.strftime('%Y%m%d-%H%M%S')}")
    if cfg.log_dir is None:
        agent_args = [*agent_args, "--log-dir", str(log_dir)]
    return _run_with_ui(args.nproc, agent_args, log_dir, cfg.run_id)


def _run_with_ui(nproc: int, agent_args: list[str], log_dir: Path, run_id: str | None = None) -> int:
    """Start the ranks, wait for rank 0's connection file (its addresses and keys), open the UI.
    `run_id`: the one the agent options name; None: a new one, added to them."""
    from ringtop.protocol.connection_file import ConnectionFileError, ensure_runtime_dir
    from ringtop.tui.app import run_live

    from .launch import forward_stop_signals, start_ranks, stop_ranks, wait_ranks

    try:
        ensure_runtime_dir()  # rank 0 writes the run's addresses and keys there; the UI waits for them
    except (ConnectionFileError, OSError) as exc:
        print(f"ringtop: no place for the run's connection file: {exc}", file=sys.stderr)
        return 2
    if run_id is None:
        run_id = uuid.uuid4().hex[:8]
        agent_args = [*agent_args, "--run-id", run_id]
    output = log_dir / "agents.log"
    proc = start_ranks(nproc, agent_args, output_file=output)
    forward_stop_signals(proc)
    print(f"ringtop: starting run {run_id} on {nproc} ranks (output: {output}) ...", file=sys.stderr, flush=True)
    try:
        info = _await_connection_file(proc, run_id)
    except KeyboardInterrupt:
        print("\nringtop: SIGINT: stopping the ranks ...", file=sys.stderr, flush=True)
        stop_ranks(proc)
        return 130
    if info is None:
        code = wait_ranks(proc)
        launcher_output = _tail_of(output)
        print("ringtop: the ranks ended before rank 0 was up:\n  " + "\n  ".join(launcher_output.splitlines()[-15:]),
              file=sys.stderr)
        _report_failure(code, str(log_dir), launcher_output)
        return code or 1
    run_live(info.publish, info.control, keys=info.keys)
    if proc.poll() is None:
        print(f"ringtop: the UI is closed; the {nproc} ranks keep training (output: {output}).\n"
              f"  re-attach:  ringtop ui {run_id}\n"
              f"  stop them:  Ctrl-C here, or  ringtop ctl --run {run_id} stop", file=sys.stderr)
    code = wait_ranks(proc)
    _report_failure(code, str(log_dir), _tail_of(output))
    return code


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


def _report_failure(code: int, log_dir: str | None, launcher_output: str = "") -> None:
    """A failed run ends with one line naming the rank that failed first and what ended it (not
    after a stop signal)."""
    if code == 0 or code >= 128:
        return
    from .summary import failure_line, launcher_signals

    print(failure_line(Path(log_dir) if log_dir else None, code, launcher_signals(launcher_output)), file=sys.stderr)


def _simulate(args: argparse.Namespace) -> int:
    from ringtop.cli.simulate import main as simulate

    return simulate(args)


def _demo(args: argparse.Namespace) -> int:
    ports = [free_tcp_port() for _ in range(3)]
    publish, relay, control = (f"tcp://127.0.0.1:{p}" for p in ports)
    log_dir = Path(args.log_dir or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    steps = args.steps if args.steps is not None else (DEMO_STEPS_HEADLESS if args.headless else DEMO_STEPS_UI)
    agent_args = ["--steps", str(steps), "--log-dir", str(log_dir), "--publish", publish, "--relay", relay,
                  "--control", control, "--checkpoint-dir", str(log_dir / "checkpoints"),
                  "--model-size", args.model_size]
    if args.headless:
        from .launch import StderrTail, start_ranks, wait_ranks
        from .summary import print_summary

        print(f"ringtop demo: {args.nproc} CPU ranks, tiny-gpt {args.model_size}, {steps} steps, logs in {log_dir}",
              file=sys.stderr)
        proc = start_ranks(args.nproc, [*agent_args, "--print-every", "10"], capture_stderr=True)
        tail = StderrTail(proc)
        code = wait_ranks(proc)
        print_summary(log_dir)
        _report_failure(code, str(log_dir), tail.text())
        print(f"\nreplay it:  ringtop replay {log_dir}")
        return code
    return _run_with_ui(args.nproc, agent_args, log_dir)


RUN_DESCRIPTION = ("Launch N ranks on this node (as torchrun does). Every option that is not one of run's own "
                   "goes to each rank's agent.")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc", type=int, default=2, help="ranks on this node (default: %(default)s)")
    parser.add_argument("--ui", action="store_true", help="open the UI while the ranks train")


class _RunHelp(argparse.Action):
    """`ringtop run --help` lists the agent's options too, made from the agent's config fields
    (imported only then: other commands start without the agent's modules)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from ringtop.agent.config import add_agent_arguments

        full = argparse.ArgumentParser(prog=parser.prog, description=RUN_DESCRIPTION,
                                       usage=f"{parser.prog} [-h] [--nproc NPROC] [--ui] [agent options]")
        _add_run_options(full)
        add_agent_arguments(full)
        full.print_help()
        parser.exit()


def _add_key_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keys", default=None, metavar="FILE",
                        help="the run's connection file (from `ringtop connect-info` on its node): its keys, and "
                             "its addresses unless --connect (and --control) say otherwise")
    parser.add_argument("--insecure", action="store_true",
                        help="no keys: only for a run started with --insecure")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringtop", description="A live cockpit for distributed PyTorch training.")
    sub = parser.add_subparsers(dest="verb")

    ui = sub.add_parser("ui", help="open the UI on a running job (yours: found by its connection file)")
    ui.add_argument("run", nargs="?", default=None,
                    help="run id (or prefix) or connection file; default: your only live run on this node")
    ui.add_argument("--connect", default=None, help="rank 0's telemetry address instead, e.g. through ssh -L "
                    f"(the agent's default is {DEFAULT_PUBLISH_ADDRESS})")
    ui.add_argument("--control", default=None, help="rank 0's control address, with --connect "
                    f"(the agent's default is {DEFAULT_CONTROL_ADDRESS})")
    ui.add_argument("--digests-from", type=_digest_ranks, default=None, metavar="N",
                    help="from a run of N ranks on, take each rank's latest step a few times a second from rank "
                    "0's relay, and the older ones by their numbers, instead of every step of every rank "
                    "(default 128; 0: never)")
    _add_key_options(ui)

    sub.add_parser("ls", help="list your live runs on this node")
    info = sub.add_parser("connect-info", help="print a run's connection file (endpoints, keys, run id, pid, "
                          "host): copy it to a laptop for `ringtop ui --keys FILE` through ssh -L")
    info.add_argument("run", nargs="?", default=None, help="run id (or prefix); default: your only live run")

    replay = sub.add_parser("replay", help="open the UI over recorded logs (LOGDIR/rank-R.jsonl)")
    replay.add_argument("logdir", help="a run's --log-dir, or the id of a live run of yours (its logs)")
    summary = sub.add_parser("summary", help="print a run's summary from its logs: per rank, goodput, diagnosis")
    summary.add_argument("logdir", help="a run's --log-dir")

    run = sub.add_parser("run", help="launch N ranks (as torchrun does); agent options follow",
                         description=RUN_DESCRIPTION, add_help=False, allow_abbrev=False)
    run.add_argument("-h", "--help", action=_RunHelp, help="show this help message, with the agent's options, "
                     "and exit")
    _add_run_options(run)

    demo = sub.add_parser("demo", help="2 CPU ranks training tiny-gpt, with the UI (or --headless)",
                          description="Two CPU ranks (gloo) train the built-in tiny GPT on synthetic tokens, "
                                      "with the UI attached; logs and checkpoints go under --log-dir.")
    demo.add_argument("--headless", action="store_true", help="no UI: logs, progress lines and a summary")
    demo.add_argument("--nproc", type=int, default=2, help="ranks (default %(default)s)")
    demo.add_argument("--steps", type=int, default=None,
                      help=f"optimizer steps (default {DEMO_STEPS_UI} with the UI, {DEMO_STEPS_HEADLESS} headless)")
    demo.add_argument("--model-size", default="1m", choices=("1m", "10m", "25m", "125m"),
                      help="tiny-gpt's size in parameters (default %(default)s)")
    demo.add_argument("--log-dir", default=None,
                      help="where logs and checkpoints go (default runs/demo-DATE-TIME)")

    simulate = sub.add_parser("simulate", help="publish realistic telemetry of N simulated ranks through the real "
                              "relay (keys, connection file): try the UI at any scale without a cluster")
    from ringtop.cli.simulate import add_arguments as simulate_arguments

    simulate_arguments(simulate)

    ctl = sub.add_parser("ctl", help="send a command to a running job and print the reply")
    ctl.add_argument("--connect", default=None, help="rank 0's control address; default: that of your only live "
                     "run (or of --run)")
    ctl.add_argument("--run", default=None, help="run id (or prefix) or connection file of the run to command")
    _add_key_options(ctl)
    ctl.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the result (default %(default)s)")
    ctl.add_argument("--json", action="store_true", help="print the replies as JSON lines")
    ctl.add_argument("command", help=" | ".join(COMMANDS))
    ctl.add_argument("args", nargs="*", help="KEY=VALUE arguments, e.g. kind=full")

    models = sub.add_parser("models", help="the Hugging Face architectures --model hf:NAME builds, with their "
                            "parameter counts, layers, hidden size, heads, vocab (needs transformers)")
    from ringtop.cli.models import add_arguments as models_arguments

    models_arguments(models)

    sub.add_parser("ckpt", add_help=False, help="inspect (info) or consolidate checkpoints (`ringtop ckpt --help`)")
    sub.add_parser("plan", add_help=False, help="predict memory and communication of each strategy "
                   "(`ringtop plan --help`)")
    sub.add_parser("bench", add_help=False, help="measure collectives like nccl-tests: size, time, algbw, busbw "
                   "(`ringtop bench comm --help`)")
    return parser


def main(argv: list[str] | None = None) -> int:
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
            parser.error("--nproc must be >= 1")
        return _run(known, agent_args)
    args = parser.parse_args(argv)
    if args.verb is None:
        args = parser.parse_args(["ui"])
    if args.verb == "demo" and args.nproc < 1:
        parser.error("--nproc must be >= 1")
    handlers = {"ui": _ui, "replay": _replay, "ctl": _ctl, "demo": _demo, "ls": _ls, "connect-info": _connect_info,
                "summary": _summary, "simulate": _simulate, "models": _models}
    return handlers[args.verb](args)


if __name__ == "__main__":
    sys.exit(main())
