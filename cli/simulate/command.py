"""`ringtop simulate` on the command line: its flags, and the run until --seconds or Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from ringtop.cli.simulate.config import SimConfig, SimulateError
from ringtop.cli.simulate.run import Simulation
from ringtop.cli.simulate.scenario import HANG_AFTER_S
from ringtop.protocol import connection_file
from ringtop.protocol.safe_files import check_output, not_written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=8, help="simulated ranks N (default %(default)s)")
    parser.add_argument("--nodes", type=int, default=1, help="hosts node-000... the ranks are spread over "
                        "(default %(default)s)")
    parser.add_argument("--procs", type=int, default=None, metavar="P",
                        help="processes the run spreads over, this one included: nodes 1..M-1, each with a real "
                             "node relay, go to P-1 workers (default 1: every rank in this process, straight to the "
                             "head relay)")
    parser.add_argument("--rank-procs", type=int, default=0, metavar="K",
                        help="ranks 1..N-1 in K worker processes, each rank straight to the head relay (which "
                             "stays here with rank 0); default 0: every rank in this process, sharing the relay's GIL")
    parser.add_argument("--hz", type=float, default=10.0, help="steps per second, all ranks together "
                        "(default %(default)s)")
    parser.add_argument("--straggler", type=int, default=None, metavar="R", help="rank R's steps take 1.3x longer")
    parser.add_argument("--hang", type=int, default=None, metavar="R",
                        help=f"after {HANG_AFTER_S:g} s every rank stops stepping, rank R not having entered the "
                             "collective the others wait in (stall reports every 2 s)")
    parser.add_argument("--seconds", type=float, default=0.0, help="end after S seconds with every rank's Bye "
                        "(default 0: until Ctrl-C)")
    parser.add_argument("--seed", type=int, default=0, help="the noise's seed (default %(default)s)")
    parser.add_argument("--run-id", default="", help="the run's id (default: a random one)")
    parser.add_argument("--status-file", default=None, metavar="FILE",
                        help="rewrite FILE (JSON) at every step: step, messages sent (all processes), head relay "
                             "forwarded and dropped, node relays lost (for benchmarks)")
    for flag, what in (("relay", "the ranks publish to"), ("publish", "UIs subscribe to"),
                       ("control", "UIs send commands to")):
        parser.add_argument(f"--{flag}", default="", metavar="ADDR",
                            help=f"the address {what} (default: the run's own default, a free port when taken)")


def config_from(args: argparse.Namespace) -> SimConfig:
    return SimConfig(ranks=args.ranks, nodes=args.nodes, hz=args.hz, straggler=args.straggler, hang=args.hang,
                     seconds=args.seconds, seed=args.seed, run_id=args.run_id, status_file=args.status_file,
                     relay=args.relay, publish=args.publish, control=args.control, procs=args.procs,
                     rank_procs=args.rank_procs)


def main(args: argparse.Namespace) -> int:
    """The CLI: Ctrl-C (or SIGTERM) ends the run as --seconds does, with every rank's Bye."""
    cfg = config_from(args)
    try:
        cfg.validate()
    except SimulateError as exc:
        print(f"ringtop simulate: {exc}", file=sys.stderr)
        return 2
    if cfg.status_file:
        try:
            check_output(cfg.status_file)
        except OSError as exc:
            print(f"ringtop simulate: {not_written(cfg.status_file, exc)}", file=sys.stderr)
            return 2
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}

    def ready(info: connection_file.ConnectionInfo) -> None:
        print(f"ringtop simulate: run {info.run_id}, {cfg.ranks} ranks on {cfg.nodes} nodes at {cfg.hz:g} Hz; "
              f"{cfg.processes} processes; telemetry {info.publish}, control {info.control}; attach with "
              "`ringtop ui`", file=sys.stderr,
              flush=True)

    try:
        result = Simulation(cfg, stop, on_ready=ready).run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(f"ringtop simulate: ended at step {result.steps} after {result.seconds:.1f} s: {result.sent:,} messages "
          f"sent ({result.send_drops} refused by full sockets), relay forwarded {result.forwarded:,}, "
          f"dropped {result.dropped}; node relays lost {result.lost}", file=sys.stderr)
    return 0
