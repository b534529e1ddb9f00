"""`ringtop ctl`: one command to a running job over its control socket, for scripts."""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

import msgspec
import zmq

from ringtop.metrics import fmt
from ringtop.protocol import UI_RANK, Command, ProtocolError, Reply, decode, encode
from ringtop.protocol.curve import ClientKeys, HandshakeWatch, secure_client
from ringtop.protocol.text_safety import json_safe
from ringtop.tui.stacks_text import stacks_plain  # pure: no Textual, no Rich


def parse_kv(items: list[str]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"argument {item!r} is not KEY=VALUE")
        try:
            args[key] = json.loads(value)
        except json.JSONDecodeError:
            args[key] = value
    return args


class RefusedError(ConnectionError):
    """The run refused this client's handshake (no keys, or wrong ones)."""


def send_command(address: str, cmd: str, args: dict[str, Any], timeout_s: float, keys: ClientKeys | None = None):
    """Yields each Reply to the command until `done` or `error`; raises TimeoutError past the
    deadline, RefusedError if the run does not accept `keys` (None: an --insecure run)."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    secure_client(sock, keys)
    watch = HandshakeWatch(sock, keys is not None)
    sock.connect(address)
    command = Command(id=uuid.uuid4().hex[:12], cmd=cmd, args=args, rank=UI_RANK, ts=time.time())
    try:
        sock.send(encode(command))
        deadline = time.monotonic() + timeout_s
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not sock.poll(min(remaining_ms, 200)):
                if failure := watch.read():
                    raise RefusedError(f"{address}: {failure}")
                if remaining_ms <= 0:
                    raise TimeoutError(f"no reply from {address} within {timeout_s:g} s (is the job running?)")
                continue
            reply = decode(sock.recv())
            if not isinstance(reply, Reply) or reply.id not in (command.id, ""):
                continue
            yield reply
            if reply.status != "ack":
                return
    finally:
        watch.close()
        sock.close()


def result_text(cmd: str, result: dict[str, Any]) -> str:
    """A `done` reply's result for a person: `stacks` as its groups of ranks with their stacks
    (innermost frame last, as a traceback reads), `status` in words and the UI's number formats,
    anything else one `key: value` a line."""
    if cmd == "stacks" and isinstance(result.get("groups"), list):
        return "\n".join("  " + line for line in stacks_plain(result).splitlines())
    if cmd == "status":
        return "\n".join(f"  {label}: {value}" for label, value in status_lines(result))
    return "\n".join(f"  {key}: {value}" for key, value in result.items())


STATUS_LABELS = {"run_id": "run", "world_size": "ranks", "last_checkpoint": "last checkpoint",
                 "refused_connections": "refused connections", "lost_messages": "lost messages"}
"""`status`'s fields as `ctl` names them (the others: their own name, `_` as a space)."""
STATUS_STEP_FIELDS = ("step_ms", "step_ms_steps", "step_ms_last_step")


def status_lines(result: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) per field of a `status` reply: the loss and step ms formatted as the UI shows
    them (metrics/fmt.py), the step ms with its window (rank 0's last N steps, as the UI's cell)."""
    lines = []
    for key, value in result.items():
        if key in STATUS_STEP_FIELDS[1:]:
            continue
        if key == "step_ms":
            lines.append(("step ms", status_step_text(result)))
        elif key == "loss":
            lines.append(("loss", fmt.loss(value) if isinstance(value, (int, float)) else str(value)))
        else:
            lines.append((STATUS_LABELS.get(key, key.replace("_", " ")), "-" if value in ("", None) else str(value)))
    return lines


def status_step_text(result: dict[str, Any]) -> str:
    """`152.3 (mean of rank 0's last 20 steps, to step 412)`; from an older agent (no window), its latest step's."""
    value, n, last = (result.get(k) for k in STATUS_STEP_FIELDS)
    if not isinstance(value, (int, float)):
        return "-"
    if not isinstance(n, int):
        return f"{fmt.ms(value)} (rank 0's latest step)"
    return f"{fmt.ms(value)} (mean of rank 0's last {n} step{'s' if n != 1 else ''}, to step {last})"


def run_ctl(address: str, keys: ClientKeys | None, cmd: str, raw_args: list[str], timeout_s: float,
            as_json: bool) -> int:
    try:
        args = parse_kv(raw_args)
        for reply in send_command(address, cmd, args, timeout_s, keys):
            if as_json:
                print(json_safe(msgspec.json.encode(reply).decode()), flush=True)
            elif reply.status == "ack":
                print(f"{cmd}: accepted, applies at the step boundary after next", flush=True)
            elif reply.status == "done":
                print(f"{cmd}: done", flush=True)
                text = result_text(cmd, reply.result)
                if text:
                    print(text, flush=True)
            else:
                print(f"{cmd}: error [{reply.code}] {reply.error}", file=sys.stderr, flush=True)
                return 1
        return 0
    except (ValueError, ProtocolError) as exc:
        print(f"ringtop ctl: error: {exc}", file=sys.stderr)
        return 2
    except TimeoutError as exc:
        print(f"ringtop ctl: {exc}", file=sys.stderr)
        return 3
    except RefusedError as exc:
        print(f"ringtop ctl: refused: {exc}", file=sys.stderr)
        return 4
