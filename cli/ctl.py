"""`ringtop ctl`: one command to a running job over its control socket, for scripts."""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

import msgspec
import zmq

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
    (innermost frame last, as a traceback reads), anything else one `key: value` a line."""
    if cmd == "stacks" and isinstance(result.get("groups"), list):
        return "\n".join("  " + line for line in stacks_plain(result).splitlines())
    return "\n".join(f"  {key}: {value}" for key, value in result.items())


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
