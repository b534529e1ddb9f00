"""`ringtop bench comm`: an nccl-tests-style sweep of collectives on the current backend.

    ringtop bench comm --nproc N [--ops all_reduce,all_gather,reduce_scatter,broadcast]
                       [--min-bytes 1K] [--max-bytes 256M] [--iters K] [--warmup W]
                       [--backend auto|gloo|nccl] [--json] [--out FILE]

Torch-free in this process: the ranks run `ringtop.agent.instruments.bench_comm` under torch's elastic launcher
(`python -m torch.distributed.run --standalone`, as `ringtop run` does), in a child process. Rank 0
writes the result as JSON; this process prints it as a table (one block per op, like nccl-tests)
or, with --json, as JSON. --out FILE keeps the JSON, so the diagnosis can take the best busbw of an
op as the measured link peak.

Sizes double from --min-bytes to --max-bytes (suffixes K, M, G are powers of two: 1K = 1024).
Defaults: 1K to 64M on gloo and 256M on nccl; 20 timed calls after 5 warm-up calls (nccl-tests'
-n 20 -w 5), and on gloo, unless --iters is given, at most 2 timed calls (and 1 warm-up) for sizes
above 16M, so that a CPU sweep takes seconds. Data type float32, out-of-place.

Columns (nccl-tests' definitions):
- size (B): all_reduce and broadcast: the tensor; all_gather: the gathered output; reduce_scatter:
  the full input. count (elements): the tensor's for all_reduce and broadcast, each rank's shard for
  all_gather (its input) and reduce_scatter (its output).
- time (us): each rank's mean over the timed calls (run back to back, timed around the loop); the
  reported value is the max over ranks.
- algbw = size / time; busbw = algbw x factor, factor 2(n-1)/n for all_reduce, (n-1)/n for
  all_gather and reduce_scatter, 1 for broadcast (`metrics.busbw.busbw_factor`). GB = 1e9.
On gloo, reduce_scatter_tensor runs as an all-reduce of the full input: expect its busbw to be half
a true reduce-scatter's.

The JSON (what --json prints and --out writes):

    {
      "backend": "gloo",            # or "nccl"
      "world_size": 2,
      "device": "cpu",              # or "cuda"
      "dtype": "float32",
      "iters": 20, "warmup": 5,     # as asked; a row's "iters" is what that size ran
      "ops": {
        "all_reduce": [
          {"size_bytes": 1024, "count": 256, "time_us": 123.4, "iters": 20,
           "algbw_gbps": 0.0083, "busbw_gbps": 0.0083},
          ...
        ],
        ...                          # one list per op asked for, sizes ascending
      },
      "peak_busbw_gbps": {"all_reduce": 0.86, ...}   # max busbw_gbps over the op's sizes
    }
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from ringtop.metrics import fmt
from ringtop.metrics.costs.busbw import BUSBW_FACTOR_TEXT, busbw_factor
from ringtop.protocol import safe_files

OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
ELEMENT_BYTES = 4
DEFAULT_MIN_BYTES = "1K"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class BenchError(ValueError):
    """A bad input to `ringtop bench`; the CLI prints it and exits 2."""


def parse_bytes(text: str, option: str = "size") -> int:
    """1024, 1K, 4M, 1G, 1KB, 1KiB (K = 1024) -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise BenchError(f"{option}: expected a size like 1024, 1K, 4M or 1G, got {text!r}")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value != int(value) or value < 1:
        raise BenchError(f"{option}: must be a whole number of bytes >= 1, got {text!r}")
    return int(value)


def parse_ops(text: str) -> list[str]:
    """Comma-separated ops ('all' for all four); all-reduce / allreduce spellings accepted."""
    aliases = {o.replace("_", ""): o for o in OPS}
    out: list[str] = []
    for raw in text.split(","):
        name = raw.strip().lower().replace("-", "_")
        if not name:
            continue
        if name == "all":
            out.extend(o for o in OPS if o not in out)
            continue
        op = aliases.get(name.replace("_", ""))
        if op is None:
            raise BenchError(f"--ops: unknown op {raw.strip()!r}: use {', '.join(OPS)} (or all)")
        if op not in out:
            out.append(op)
    if not out:
        raise BenchError("--ops: no op given")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ringtop bench comm",
        description="An nccl-tests-style sweep of collectives (size, count, time, algbw, busbw) on the "
                    "current backend, N ranks on this node.",
        epilog="Sizes double from --min-bytes to --max-bytes; K/M/G = 2^10/2^20/2^30. time = mean per call, "
               "max over ranks; algbw = size/time; busbw = algbw x nccl-tests' factor; GB = 1e9 bytes.")
    p.add_argument("--nproc", type=int, required=True, help="ranks on this node")
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated ops, or all (default %(default)s)")
    p.add_argument("--min-bytes", default=DEFAULT_MIN_BYTES, help="smallest size (default %(default)s)")
    p.add_argument("--max-bytes", default=None, help="largest size (default 64M on gloo, 256M on nccl)")
    p.add_argument("--iters", type=int, default=None,
                   help="timed calls per size (default 20; on gloo 2 above 16M)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls before them (default %(default)s)")
    p.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"),
                   help="auto: nccl when torch sees CUDA, else gloo (default %(default)s)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="process-group timeout (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--out", default=None, help="also write the JSON result to this file")
    return p


def worker_args(args: argparse.Namespace, out_path: Path) -> list[str]:
    """Validate the front end's options and turn them into the worker's command line (rank 0
    writes the result to `out_path`)."""
    if args.out is not None:
        try:
            safe_files.check_output(args.out)  # now, not after the sweep
        except OSError as exc:
            raise BenchError(f"--out: {safe_files.not_written(args.out, exc)}") from None
    if args.nproc < 1:
        raise BenchError(f"--nproc must be >= 1, got {args.nproc}")
    ops = parse_ops(args.ops)
    min_bytes = parse_bytes(args.min_bytes, "--min-bytes")
    max_bytes = parse_bytes(args.max_bytes, "--max-bytes") if args.max_bytes is not None else None
    if max_bytes is not None and min_bytes > max_bytes:
        raise BenchError(f"--min-bytes ({args.min_bytes} = {min_bytes} B) is larger than --max-bytes "
                         f"({args.max_bytes} = {max_bytes} B)")
    if min_bytes < ELEMENT_BYTES * args.nproc:
        raise BenchError(f"--min-bytes must be at least {ELEMENT_BYTES * args.nproc} B (one float32 element "
                         f"per rank), got {min_bytes} B")
    if args.iters is not None and args.iters < 1:
        raise BenchError(f"--iters must be >= 1, got {args.iters}")
    if args.warmup < 0:
        raise BenchError(f"--warmup must be >= 0, got {args.warmup}")
    if not args.timeout_s > 0:
        raise BenchError(f"--timeout-s must be > 0, got {args.timeout_s}")
    argv = ["--ops", ",".join(ops), "--min-bytes", str(min_bytes), "--warmup", str(args.warmup),
            "--backend", args.backend, "--timeout-s", str(args.timeout_s), "--out", str(out_path)]
    if max_bytes is not None:
        argv += ["--max-bytes", str(max_bytes)]
    if args.iters is not None:  # asked for: every size runs that many
        argv += ["--iters", str(args.iters), "--large-bytes", "0"]
    if not args.json:
        argv.append("--progress")
    return argv


def launcher_command(nproc: int, argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "ringtop.agent.instruments.bench_comm", *argv]


def render_table(result: dict) -> str:
    """One block per op, nccl-tests' columns."""
    n = result["world_size"]
    lines = [f"# ringtop bench comm: {result['backend']} on {result.get('device', '?')}, {n} ranks, "
             f"{result.get('dtype', 'float32')}, out-of-place",
             "# time: mean per call over the timed calls, max over ranks; algbw = size / time; "
             "busbw = algbw x factor; GB = 1e9 bytes"]
    header = f"#{'size':>11} {'count':>13} {'iters':>6} {'time':>10} {'algbw':>9} {'busbw':>9}"
    units = f"#{'(B)':>11} {'(elements)':>13} {'':>6} {'(us)':>10} {'(GB/s)':>9} {'(GB/s)':>9}"
    for op, rows in result["ops"].items():
        factor = busbw_factor(op, n)
        text = BUSBW_FACTOR_TEXT.get(op, "?")
        factor_text = text if text == "1" else f"{text} = {factor:.3g}"
        lines += ["#", f"# {op}   busbw factor {factor_text}", header, units]
        for r in rows:
            lines.append(f" {r['size_bytes']:>11} {r['count']:>13} {r.get('iters', ''):>6} {fmt.us(r['time_us']):>10} "
                         f"{fmt.gbps(r['algbw_gbps']):>9} {fmt.gbps(r['busbw_gbps']):>9}")
    peaks = ", ".join(f"{op} {fmt.gbps(v)}" for op, v in result.get("peak_busbw_gbps", {}).items())
    lines += ["#", f"# peak busbw (GB/s): {peaks}"]
    return "\n".join(lines)


def load_result(path: str | os.PathLike) -> dict:
    """A result written by --out, checked for the documented keys."""
    result = json.loads(Path(path).read_text())
    for key in ("backend", "world_size", "ops", "peak_busbw_gbps"):
        if key not in result:
            raise ValueError(f"{path}: not a `ringtop bench comm` result (no {key!r})")
    return result


def run_comm(args: argparse.Namespace) -> int:
    from ringtop.cli.launch import stop_ranks

    with tempfile.TemporaryDirectory(prefix="ringtop-bench-") as tmp:
        out_path = Path(tmp) / "bench.json"  # a private folder; --out is written from it, here
        try:
            argv = worker_args(args, out_path)
        except BenchError as exc:
            print(f"ringtop bench comm: error: {exc}", file=sys.stderr)
            return 2
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("PYTHONWARNINGS", "ignore")
        # the ranks' stdout goes to our stderr: our stdout carries only the table or the JSON
        try:
            ranks_stdout = sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):  # a stderr without a descriptor (captured)
            ranks_stdout = None
        proc = subprocess.Popen(launcher_command(args.nproc, argv), env=env, stdout=ranks_stdout,
                                start_new_session=True)
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            print("\nringtop bench comm: stopping the ranks ...", file=sys.stderr)
            return stop_ranks(proc) or 130
        if code != 0 or not out_path.exists():
            print(f"ringtop bench comm: the ranks failed (exit code {code}); see their output above",
                  file=sys.stderr)
            return code or 1
        result = load_result(out_path)
        if args.out:
            try:
                safe_files.write_output(args.out, out_path.read_bytes())
            except OSError as exc:
                print(f"ringtop bench comm: error: {safe_files.not_written(args.out, exc)}", file=sys.stderr)
                return 1
        print(json.dumps(result, indent=1) if args.json else render_table(result))
        if args.out and not args.json:
            print(f"# JSON written to {args.out}")
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: ringtop bench comm [options]   (`ringtop bench comm --help`)\n\n"
              "  comm   an nccl-tests-style sweep of collectives on the current backend")
        return 0 if argv else 2
    if argv[0] != "comm":
        print(f"ringtop bench: error: unknown benchmark {argv[0]!r}: use `ringtop bench comm`", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv[1:])
    return run_comm(args)
