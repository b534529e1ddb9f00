"""The `ringtop` command's parser: every verb's flags and help, built without importing what the
verbs run (the agent's options are read only for `ringtop run --help`)."""

from __future__ import annotations

import argparse

from ringtop.protocol import COMMANDS, DEFAULT_CONTROL_ADDRESS, DEFAULT_PUBLISH_ADDRESS

DEMO_STEPS_UI = 600
DEMO_STEPS_HEADLESS = 40


def digest_ranks(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of ranks: {text!r}") from None
    if not 0 <= n <= 1 << 20:
        raise argparse.ArgumentTypeError(f"{n} is not between 0 and {1 << 20}")
    return n or (1 << 21)


def restarts(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of restarts: {text!r}") from None
    if not 0 <= n <= 1000:
        raise argparse.ArgumentTypeError(f"{n} is not between 0 and 1000")
    return n


RUN_DESCRIPTION = ("Launch N ranks on this node (as torchrun does). Every option that is not one of run's own "
                   "goes to each rank's agent.")


def add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc", type=int, default=2, help="ranks on this node (default: %(default)s)")
    parser.add_argument("--ui", action="store_true", help="open the UI while the ranks train")
    parser.add_argument("--max-restarts", type=restarts, default=0, metavar="N",
                        help="start every rank again, up to N times, after one fails (torchrun's --max-restarts); "
                        "the run keeps its id, its logs and its goodput (default: %(default)s)")
    parser.add_argument("--no-logs", action="store_true",
                        help="write no logs, so no progress lines either (default without --ui: logs in runs/RUN_ID/, "
                        "or the agent's --log-dir)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines (without --ui)")
    parser.add_argument("--progress-every", type=float, default=5.0, metavar="S",
                        help="seconds between progress lines: step, loss, step ms, tok/s; 0: none (default: "
                        "%(default)s)")


class RunHelp(argparse.Action):
    """`ringtop run --help` lists the agent's options too, made from the agent's config fields
    (imported only then: other commands start without the agent's modules)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from ringtop.agent.config import add_agent_arguments

        usage = (f"{parser.prog} [-h] [--nproc NPROC] [--ui] [--max-restarts N] [--no-logs] [--quiet] "
                 "[--progress-every S] [agent options]")
        full = argparse.ArgumentParser(prog=parser.prog, description=RUN_DESCRIPTION, usage=usage)
        add_run_options(full)
        add_agent_arguments(full)
        full.print_help()
        parser.exit()


def add_key_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keys", default=None, metavar="FILE",
                        help="the run's connection file (from `ringtop connect-info` on its node): its keys, and "
                             "its addresses unless --connect (and --control) say otherwise")
    parser.add_argument("--insecure", action="store_true",
                        help="no keys: only for a run started with --insecure")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringtop", description="A live cockpit for distributed PyTorch training.")
    sub = parser.add_subparsers(dest="verb")
    _add_attach_verbs(sub)
    _add_log_verbs(sub)
    _add_training_verbs(sub)
    _add_ctl(sub)
    _add_tool_verbs(sub)
    return parser


def _add_attach_verbs(sub) -> None:
    """ui, ls, connect-info: a live run of this user's, found by its connection file."""
    ui = sub.add_parser("ui", help="open the UI on a running job (yours: found by its connection file)")
    ui.add_argument("run", nargs="?", default=None,
                    help="run id (or prefix) or connection file; default: your only live run on this node")
    ui.add_argument("--connect", default=None, help="rank 0's telemetry address instead, e.g. through ssh -L "
                    f"(the agent's default is {DEFAULT_PUBLISH_ADDRESS}); the keys: those of your live run on this "
                    "node with that address, else --keys")
    ui.add_argument("--control", default=None, help="rank 0's control address, with --connect "
                    f"(the agent's default is {DEFAULT_CONTROL_ADDRESS})")
    ui.add_argument("--digests-from", type=digest_ranks, default=None, metavar="N",
                    help="from a run of N ranks on, take each rank's latest step a few times a second from rank "
                    "0's relay, and the older ones by their numbers, instead of every step of every rank "
                    "(default 128; 0: never)")
    add_key_options(ui)

    sub.add_parser("ls", help="list your live runs on this node")
    info = sub.add_parser("connect-info", help="print a run's connection file (endpoints, keys, run id, pid, "
                          "host): copy it to a laptop for `ringtop ui --keys FILE` through ssh -L")
    info.add_argument("run", nargs="?", default=None, help="run id (or prefix); default: your only live run")


def _add_log_verbs(sub) -> None:
    """replay, summary, report, trace, diff, bundle: a run (or two) read back from its logs."""
    replay = sub.add_parser("replay", help="open the UI over recorded logs (LOGDIR/rank-R.jsonl)")
    replay.add_argument("logdir", help="a run's --log-dir, or the id of a live run of yours (its logs)")
    summary = sub.add_parser("summary", help="print a run's summary from its logs: per rank, goodput, diagnosis")
    summary.add_argument("logdir", help="a run's --log-dir")
    report = sub.add_parser("report", help="write a run's plots as one self-contained HTML file (opens offline)")
    report.add_argument("logdir", help="a run's --log-dir")
    report.add_argument("-o", "--output", default="report.html", help="the HTML file to write (default: report.html)")
    trace = sub.add_parser("trace", help="write one timeline of every rank from a run's logs, for Perfetto or "
                           "chrome://tracing: steps and phases, collectives, micro-batches, events, profiles")
    from ringtop.cli.trace import add_arguments as trace_arguments

    trace_arguments(trace)
    diff = sub.add_parser("diff", help="compare two runs from their logs, aligned by step: step time and its "
                          "parts, collectives, memory, throughput, each marked significant or within noise")
    from ringtop.cli.diff import add_arguments as diff_arguments

    diff_arguments(diff)
    bundle = sub.add_parser("bundle", help="one .tar.gz for a bug report: stacks, ledgers, last steps and events, "
                            "summary, config, versions, environment (no keys)")
    from ringtop.cli.bundle import add_arguments as bundle_arguments

    bundle_arguments(bundle)


def _add_training_verbs(sub) -> None:
    """run, demo, simulate: what starts ranks (simulate: simulated ones)."""
    run = sub.add_parser("run", help="launch N ranks (as torchrun does); agent options follow",
                         description=RUN_DESCRIPTION, add_help=False, allow_abbrev=False)
    run.add_argument("-h", "--help", action=RunHelp, help="show this help message, with the agent's options, "
                     "and exit")
    add_run_options(run)

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


def _add_ctl(sub) -> None:
    ctl = sub.add_parser("ctl", help="send a command to a running job and print the reply")
    ctl.add_argument("--connect", default=None, help="rank 0's control address; default: that of your only live "
                     "run (or of --run); the keys: those of your live run on this node with that address, else "
                     "--keys")
    ctl.add_argument("--run", default=None, help="run id (or prefix) or connection file of the run to command")
    add_key_options(ctl)
    ctl.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the result (default %(default)s)")
    ctl.add_argument("--json", action="store_true", help="print the replies as JSON lines")
    ctl.add_argument("command", help=" | ".join([*COMMANDS, "bundle"]) + " (bundle: `ringtop bundle` of the run, "
                     "out=FILE)")
    ctl.add_argument("args", nargs="*", help="KEY=VALUE arguments, e.g. kind=full")


def _add_tool_verbs(sub) -> None:
    """models, ckpt, plan, bench: tools that need no run (ckpt, plan, bench parse their own arguments)."""
    models = sub.add_parser("models", help="the Hugging Face architectures --model hf:NAME builds, with their "
                            "parameter counts, layers, hidden size, heads, vocab (needs transformers)")
    from ringtop.cli.models import add_arguments as models_arguments

    models_arguments(models)

    sub.add_parser("ckpt", add_help=False, help="inspect (info) or consolidate checkpoints (`ringtop ckpt --help`)")
    sub.add_parser("plan", add_help=False, help="predict memory and communication of each strategy "
                   "(`ringtop plan --help`)")
    sub.add_parser("bench", add_help=False, help="measure collectives like nccl-tests: size, time, algbw, busbw "
                   "(`ringtop bench comm --help`)")
