"""`ringtop bundle [RUN]`: one .tar.gz for a bug report, with a manifest of what is in it and what
was left out and why.

From the run's logs: each rank's last steps and events (a bounded tail of rank-R.jsonl), the
launcher's log, `summary`'s text (the lifecycle line, goodput, verdicts, hangs), each rank's Hello
(config, ds_config, versions, host, the mesh), collective ledger dumps and Flight Recorder files
(`ctl dump`). From a live run, besides: every rank's Python stack (`ctl stacks`, read by each
rank's telemetry thread: the training thread is not paused), fresh ledgers, `ctl status`, and
where py-spy is installed each local rank's native and Python stack read from outside
(`py-spy dump --native`). From this machine: versions (python, torch, ringtop, the CUDA and NCCL
this machine's torch is built with, the GPU driver through nvidia-smi; each `n/a` with the reason
where there is none) and the NCCL_*, TORCH_* and CUDA_* environment, its own and each local rank's.

Never in it: the connection file, any key, any other environment variable. Files of the run
folder are read without following links, only by the names ringtop writes, each with a size
bound, and the whole within MAX_BUNDLE_BYTES (`--max-size-mib`): the small parts first, then each
rank's log cut to its share of what is left (its newest lines kept), then the ledgers whole or
not at all; the manifest lists what was cut and what was left out.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import re
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import msgspec

from ringtop.metrics import fmt
from ringtop.protocol import Hello, read_log

MAX_LOG_BYTES = 8 << 20
"""Each rank's log: its last 8 MiB (the newest steps and events)."""
MAX_TEXT_BYTES = 1 << 20
MAX_DUMP_BYTES = 32 << 20
MAX_BUNDLE_BYTES = 128 << 20
"""The bundle's contents (members and manifest, before compression) stay within this by default."""
MAX_MANIFEST_BYTES = 1 << 20
"""Kept free for the manifest (at most an eighth of a smaller bound): ~200 bytes per member."""
ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_")
DUMP_NAMES = re.compile(r"^(ledger-rank-\d{1,6}\.json|nccl_trace_rank_\d{1,6})$")
LOG_NAMES = re.compile(r"^(rank-\d{1,6}\.jsonl|agents\.log)$")
LIVE_TIMEOUT_S = 10.0


@dataclass
class Bundle:
    """The members, in order, what was cut and what was left out."""

    members: list[tuple[str, bytes, str]] = field(default_factory=list)
    """(name in the archive, content, what it is)."""
    left_out: list[dict[str, str]] = field(default_factory=list)
    truncated: list[dict[str, Any]] = field(default_factory=list)
    """Members kept in part: name, kept_bytes, of_bytes, why."""
    total: int = 0
    max_bytes: int = MAX_BUNDLE_BYTES

    def room(self) -> int:
        """Bytes still free for members (the manifest's share kept aside)."""
        return max(0, self.max_bytes - min(MAX_MANIFEST_BYTES, self.max_bytes // 8) - self.total)

    def add(self, name: str, data: bytes, what: str) -> bool:
        if len(data) > self.room():
            self.left_out.append({"what": name, "why": f"the bundle's {fmt.nbytes(self.max_bytes)} bound"})
            return False
        self.members.append((name, data, what))
        self.total += len(data)
        return True

    def add_json(self, name: str, value: Any, what: str) -> None:
        self.add(name, json.dumps(value, indent=1, default=str).encode(), what)

    def skip(self, what: str, why: str) -> None:
        self.left_out.append({"what": what, "why": why})


@dataclass(frozen=True)
class Tail:
    data: bytes
    size: int
    """The whole file's bytes."""

    @property
    def cut(self) -> bool:
        return len(self.data) < self.size


def read_tail(path: Path, max_bytes: int) -> Tail | None:
    """The file's last `max_bytes`, whole lines only when cut, read without following a link; None
    for anything that is not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        start = max(0, st.st_size - max_bytes)
        os.lseek(fd, start, os.SEEK_SET)
        chunks, left = [], st.st_size - start
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if start:  # whole lines only: from the first line break on
            at = data.find(b"\n")
            data = data[at + 1:] if at >= 0 else b""
        return Tail(data, st.st_size)
    finally:
        os.close(fd)


def hellos(log_dir: Path) -> dict[int, Hello]:
    found = {}
    for path in sorted(log_dir.glob("rank-*.jsonl")):
        if not LOG_NAMES.match(path.name) or path.is_symlink():
            continue
        hello = next((m for m in read_log(path) if isinstance(m, Hello)), None)
        if hello is not None:
            found[hello.rank] = hello
    return found


def add_logs(b: Bundle, log_dir: Path) -> None:
    """Each log's newest lines: at most its own bound, and at most an equal share of the room left
    (so every rank's last steps are in, not a few ranks' whole logs); the smallest first, so what
    a small log leaves of its share goes to the larger ones."""
    paths = sorted((p for p in log_dir.iterdir() if LOG_NAMES.match(p.name)), key=lambda p: (_size(p), p.name))
    for i, path in enumerate(paths):
        own = MAX_TEXT_BYTES if path.name == "agents.log" else MAX_LOG_BYTES
        share = b.room() // (len(paths) - i)
        bound = min(own, share)
        got = read_tail(path, bound)
        name = f"logs/{path.name}"
        if got is None:
            b.skip(name, "not a regular file (a link or a special file is never followed)")
            continue
        if got.cut and not got.data:
            b.skip(name, f"the bundle's {fmt.nbytes(b.max_bytes)} bound (no room left for a whole line of it)")
            continue
        what = "the launcher's log" if path.name == "agents.log" else "the rank's steps, events and stalls"
        if got.cut:
            why = (f"the {fmt.nbytes(own)} bound on one log" if bound == own else
                   f"its share of the bundle's {fmt.nbytes(b.max_bytes)} bound")
            what += f" (its last {fmt.nbytes(len(got.data))} of {fmt.nbytes(got.size)}: {why})"
        if b.add(name, got.data, what) and got.cut:
            b.truncated.append({"name": name, "kept_bytes": len(got.data), "of_bytes": got.size,
                                "why": f"{why}; the newest lines are kept"})


def _size(path: Path) -> int:
    try:
        return path.lstat().st_size
    except OSError:
        return 0


def add_dumps(b: Bundle, dumps: Path) -> None:
    if not dumps.is_dir() or dumps.is_symlink():
        b.skip("dumps/", "no collective ledgers in the run folder (`ringtop ctl dump` writes them)")
        return
    for path in sorted(dumps.iterdir(), key=lambda p: p.name):
        if not DUMP_NAMES.match(path.name):
            continue
        got = read_tail(path, MAX_DUMP_BYTES)
        if got is None or got.cut:
            b.skip(f"dumps/{path.name}", "not a regular file" if got is None else
                   f"over {fmt.nbytes(MAX_DUMP_BYTES)}")
            continue
        b.add(f"dumps/{path.name}", got.data, "a rank's collective ledger" if path.name.startswith("ledger")
              else "a rank's NCCL Flight Recorder buffer (torch's fr_trace reads it)")


def summary_text(log_dir: Path) -> str:
    from ringtop.cli.summary import print_summary

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_summary(log_dir)
    return out.getvalue()


def filtered_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)}


def process_env(pid: int) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return filtered_env({k: v for k, _, v in pairs})


def process_started_ts(pid: int) -> float | None:
    """When process `pid` started (epoch seconds), from /proc: its start tick after boot."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def local_ranks(found: dict[int, Hello]) -> dict[int, int]:
    """rank -> pid of the ranks on this host whose process is still the rank's: a pid of an ended
    run may be another process's now (its start time tells them apart)."""
    here = socket.gethostname()
    out = {}
    for rank, h in found.items():
        if h.host != here or h.pid <= 0:
            continue
        started = process_started_ts(h.pid)
        if started is not None and h.process_started_ts > 0 and abs(started - h.process_started_ts) < 2.0:
            out[rank] = h.pid
    return out


def versions(found: dict[int, Hello]) -> dict[str, Any]:
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None
    v: dict[str, Any] = {"python": sys.version, "platform": platform.platform(), "ringtop": version("ringtop"),
                         "torch (this machine)": version("torch"), "pyzmq": version("pyzmq"),
                         "textual": version("textual"), "deepspeed": version("deepspeed"),
                         "ranks": {r: {"torch": h.torch_version, "ringtop": h.ringtop_version, "host": h.host,
                                       "backend": h.backend, "device": h.device, "accelerator": h.accelerator}
                                   for r, h in sorted(found.items())}}
    v.update(torch_build())
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            done = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv"],
                                  capture_output=True, text=True, timeout=10)
            v["nvidia-smi"] = done.stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            v["nvidia-smi"] = f"n/a: nvidia-smi failed: {exc}"
    else:
        v["nvidia-smi"] = "n/a: no nvidia-smi on this machine's PATH (no NVIDIA driver here)"
    return v


def torch_build() -> dict[str, str]:
    """The CUDA and NCCL this machine's torch is built with (the ranks on this machine load the same
    libraries), each "n/a: why" where there is none. Imported only here: the UI runs without torch."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - not installed, or a broken install: say which, go on
        why = f"n/a: torch cannot be imported here ({type(exc).__name__}: {exc})"
        return {"cuda": why, "nccl": why}
    if not torch.version.cuda:
        other = f", for ROCm {torch.version.hip}" if getattr(torch.version, "hip", None) else ""
        why = f"n/a: this machine's torch {torch.__version__} is built without CUDA{other}"
        return {"cuda": why, "nccl": why}
    try:
        found = torch.cuda.nccl.version()
        nccl = ".".join(map(str, found)) if isinstance(found, tuple) else str(found)
    except Exception as exc:  # noqa: BLE001 - a CUDA build without NCCL
        nccl = f"n/a: this machine's torch has no NCCL ({type(exc).__name__}: {exc})"
    return {"cuda": str(torch.version.cuda), "nccl": nccl}


def mesh(found: dict[int, Hello]) -> dict[str, Any]:
    hosts: dict[str, list[int]] = {}
    for r, h in sorted(found.items()):
        hosts.setdefault(h.host, []).append(r)
    first = found[min(found)] if found else None
    return {"world_size": first.world_size if first else 0, "strategy": first.strategy if first else "",
            "strategy_options": first.strategy_options if first else {}, "hosts": hosts}


def native_stacks(b: Bundle, pids: dict[int, int]) -> None:
    from ringtop.protocol import native_stack

    if not pids:
        b.skip("native stacks", "no rank of the run is alive on this host")
        return
    if native_stack.py_spy() is None:
        b.skip("native stacks", "py-spy is not installed (pip install py-spy): each rank's Python stack is in "
               "live/stacks.json where the run answered")
        return
    for rank, pid in sorted(pids.items()):
        found = native_stack.dump(pid, timeout_s=30)
        if found.error:
            b.skip(f"native/rank-{rank}.txt", found.error)
            continue
        b.add(f"native/rank-{rank}.txt", found.text.encode()[:MAX_TEXT_BYTES],
              "the rank's threads, Python and native frames, read from outside (py-spy)")


def live_parts(b: Bundle, info, log_dir: Path | None, ranks: int) -> None:
    """`ctl stacks`, `ctl status` and fresh ledgers (`ctl dump`) from the live run."""
    from ringtop.cli.ctl import RefusedError, send_command

    for cmd in ("stacks", "status"):
        try:
            replies = list(send_command(info.control, cmd, {}, LIVE_TIMEOUT_S, info.keys))
        except (TimeoutError, RefusedError, OSError) as exc:
            b.skip(f"live/{cmd}.json", f"the run did not answer: {exc}")
            continue
        done = [r for r in replies if r.status == "done"]
        if done:
            b.add_json(f"live/{cmd}.json", done[-1].result, "every rank's stack, from its telemetry thread"
                       if cmd == "stacks" else "the run's state as rank 0 reports it")
        else:
            b.skip(f"live/{cmd}.json", f"the run answered {[r.status for r in replies]}")
    if log_dir is None:
        return
    asked = time.time()
    try:
        list(send_command(info.control, "dump", {}, LIVE_TIMEOUT_S, info.keys))
    except (TimeoutError, RefusedError, OSError) as exc:
        b.skip("dumps/ (fresh)", f"the run did not answer: {exc}")
        return
    dumps = log_dir / "dumps"
    deadline = time.monotonic() + LIVE_TIMEOUT_S
    while time.monotonic() < deadline:  # each rank's telemetry thread writes its own
        fresh = [p for p in dumps.glob("ledger-rank-*.json") if p.stat().st_mtime >= asked - 1] if dumps.is_dir() \
            else []
        if len(fresh) >= ranks:
            return
        time.sleep(0.1)
    b.skip("dumps/ (fresh)", f"not every rank wrote its ledger within {LIVE_TIMEOUT_S:g} s")


def build(log_dir: Path | None, info=None, max_bytes: int = MAX_BUNDLE_BYTES) -> Bundle:
    """The small parts first, the logs and ledgers in what room is left."""
    b = Bundle(max_bytes=max_bytes)
    found = hellos(log_dir) if log_dir is not None else {}
    if info is not None:
        live_parts(b, info, log_dir, info.world_size or len(found))
    if log_dir is not None and found:
        b.add("summary.txt", summary_text(log_dir).encode(), "`ringtop summary`: per rank, lifecycle, goodput, "
              "verdicts, where the step went, hangs")
        b.add_json("config.json", {r: msgspec.to_builtins(h) for r, h in sorted(found.items())},
                   "each rank's Hello: the run's config (ds_config among the strategy options), model, versions")
        b.add_json("mesh.json", mesh(found), "hosts and their ranks, the strategy and its options")
    b.add_json("versions.json", versions(found), "versions here and on each rank")
    pids = local_ranks(found)
    env = {"this machine": filtered_env(dict(os.environ))}
    env.update({f"rank {r}": e for r, pid in sorted(pids.items()) if (e := process_env(pid)) is not None})
    b.add_json("environment.json", env, f"the {', '.join(p + '*' for p in ENV_PREFIXES)} variables only")
    native_stacks(b, pids)
    if log_dir is not None:
        add_logs(b, log_dir)
        add_dumps(b, log_dir / "dumps")
    else:
        b.skip("logs/", "the run writes no logs (started without --log-dir)")
    return b


def write(b: Bundle, out: Path, run_id: str) -> None:
    """The archive, manifest first, written to a new file (never over a planted one)."""
    manifest = {"run": run_id, "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "max_bytes": b.max_bytes, "files": [{"name": n, "bytes": len(d), "what": w} for n, d, w in b.members],
                "truncated": b.truncated, "left_out": b.left_out}
    top = f"ringtop-bundle-{run_id}"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w:gz") as tar:
        for name, data in [("MANIFEST.json", json.dumps(manifest, indent=1).encode())] + [(n, d) for n, d, _ in
                                                                                         b.members]:
            member = tarfile.TarInfo(f"{top}/{name}")
            member.size, member.mtime, member.mode = len(data), int(time.time()), 0o600
            tar.addfile(member, io.BytesIO(data))


def add_arguments(parser) -> None:
    parser.add_argument("run", nargs="?", metavar="RUN",
                        help="a run's --log-dir, or the id of a live run of yours (default: the only live one)")
    parser.add_argument("-o", "--output", default=None, metavar="FILE",
                        help="the .tar.gz to write (default: bundle-RUN-TIME.tar.gz in the run's log folder, "
                        "else here)")
    parser.add_argument("--no-live", action="store_true", help="only what the logs hold: ask the run for nothing")
    parser.add_argument("--max-size-mib", type=_size_mib, default=MAX_BUNDLE_BYTES >> 20, metavar="MIB",
                        help=f"the most the bundle holds, before compression (default {MAX_BUNDLE_BYTES >> 20}): "
                        "the logs are cut to their newest lines to fit, and the manifest says what was cut")


def _size_mib(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of MiB") from None
    if not 1 <= value <= 1 << 20:
        raise argparse.ArgumentTypeError(f"{value} MiB: give 1 to {1 << 20}")
    return value


def resolve(spec: str | None):
    """(log_dir or None, live connection info or None, run id), or a message saying why not."""
    from ringtop.protocol.connection_file import ConnectionFileError, find, live_runs

    if spec is not None and Path(spec).is_dir():
        log_dir = Path(spec)
        found = hellos(log_dir)
        run_id = found[min(found)].run_id if found else log_dir.name
        info = next((r for r in live_runs() if r.run_id == run_id), None)
        return log_dir, info, run_id
    try:
        info = find(spec)
    except ConnectionFileError as exc:
        return str(exc)
    return (Path(info.log_dir) if info.log_dir else None), info, info.run_id


def main(args) -> int:
    found = resolve(args.run)
    if isinstance(found, str):
        print(f"ringtop bundle: {found}", file=sys.stderr)
        return 2
    log_dir, info, run_id = found
    if not re.fullmatch(r"[\w.-]{1,64}", run_id):
        run_id = "run"
    b = build(log_dir, None if args.no_live else info, getattr(args, "max_size_mib", MAX_BUNDLE_BYTES >> 20) << 20)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out = Path(args.output) if args.output else (log_dir or Path.cwd()) / f"bundle-{run_id}-{stamp}.tar.gz"
    try:
        write(b, out, run_id)
    except OSError as exc:
        print(f"ringtop bundle: error: cannot write {str(out)!r}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"ringtop bundle: {len(b.members) + 1} files, {fmt.nbytes(out.stat().st_size)} -> {out}"
          + (f" ({len(b.left_out)} left out: see MANIFEST.json)" if b.left_out else ""))
    return 0
