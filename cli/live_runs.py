"""This user's live runs on this node, found by their connection files: the target of `ui` and
`ctl`, `ringtop ls`, `ringtop connect-info`. Never a guessed port: on a shared node it may be
another user's job."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def client_target(args: argparse.Namespace, publish_flag: bool):
    """(publish, control, keys) for `ui` and `ctl`, or None after saying why there is none."""
    found = client_connection(args, publish_flag)
    return None if found is None else found[0]


def client_connection(args: argparse.Namespace, publish_flag: bool):
    """((publish, control, keys), the run's connection file when the run was found by it, to
    follow across restarts, else None), or None after saying why there is none.

    A run of this user on this node is found by its connection file (`args.run`, or the only
    live one); `--keys FILE` names a connection file (copied from the node, for `ssh -L`);
    `--connect`/`--control` override its addresses; `--connect` alone takes the keys of the live
    run of this user's on this node whose address it is. Never a guessed port: on a shared node it
    may be another user's job."""
    from ringtop.protocol.connection_file import ConnectionFileError, find_by_address, read

    if args.keys and args.insecure:
        print("ringtop: --keys and --insecure contradict each other: drop one", file=sys.stderr)
        return None
    connect = args.connect
    control = args.control if publish_flag else connect
    if args.insecure:
        if connect is None:
            print("ringtop: --insecure needs --connect ADDRESS (a run started with --insecure)", file=sys.stderr)
            return None
        return (connect if publish_flag else "", control, None), None
    try:
        if args.keys:
            info = read(Path(args.keys))
        elif connect is not None:
            info = find_by_address(connect, "publish" if publish_flag else "control")
            if info is None:
                print(f"ringtop: no live run of yours on this node has the address {connect}: give its keys with "
                      "--keys FILE (its connection file; on the run's node `ringtop connect-info > run.json` "
                      "writes it), or --insecure for a run started with --insecure", file=sys.stderr)
                return None
        else:
            info = find_run(args.run)
            if info is None:
                return None
    except ConnectionFileError as exc:
        print(f"ringtop: {exc}", file=sys.stderr)
        return None
    publish = (connect if publish_flag and connect else info.publish)
    by_file = not args.keys and connect is None
    return (publish, (control or info.control), info.keys), (info if by_file else None)


def find_run(spec: str | None):
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


def ls(args: argparse.Namespace) -> int:
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


def connect_info(args: argparse.Namespace) -> int:
    import msgspec

    info = find_run(args.run)
    if info is None:
        return 2
    from ringtop.protocol.text_safety import json_safe

    print(json_safe(msgspec.json.format(msgspec.json.encode(info)).decode()))
    return 0
