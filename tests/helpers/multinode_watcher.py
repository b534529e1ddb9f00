"""Run inside the head node's namespace by test_multinode.py: a UI's view of a run, from its own
connection file's keys, written to a file. Once every rank has stepped it asks every rank for its
stack (`ctl stacks`: the downlink through the node relays and the answers back) and writes
OUT.ready; with `outage` it then waits for a node relay to say it found the head again (the test
cuts the link meanwhile) or was started again (it died), and for steps of every rank after that;
then it stops the run. With `death` it stops nothing: the test kills a rank, and it waits until
every rank has said Bye or been named dead (a RankExit), noting each.

    python multinode_watcher.py RUN_ID WORLD_SIZE OUT.json [outage|death]
"""

from __future__ import annotations

import json
import sys
import time

import zmq

from ringtop.cli.ctl import send_command
from ringtop.protocol import Bye, Event, Hello, ProtocolError, RankExit, Step, connection_file, decode
from ringtop.protocol.curve import secure_client

WAIT_S = 150


def main(run_id: str, world_size: int, out: str, outage: bool, death: bool = False) -> None:
    seen = {"hosts": {}, "steps": {}, "byes": {}, "relay_events": [], "stacks": None, "error": "",
            "after_resume": [], "stop": None, "status": {}, "exits": {}, "bye_reasons": {}}
    deadline = time.monotonic() + WAIT_S
    path = connection_file.file_for(run_id)
    while not path.exists():
        if time.monotonic() > deadline:
            seen["error"] = "no connection file"
            return _write(out, seen)
        time.sleep(0.05)
    info = connection_file.read(path)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, 0)  # the Byes must not be dropped while a command is waited for
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    secure_client(sub, info.keys)
    sub.connect(info.publish)
    while time.monotonic() < deadline and len({*seen["byes"], *seen["exits"]}) < world_size:
        if sub.poll(100):
            try:
                msg = decode(sub.recv_multipart()[-1])
            except ProtocolError:
                continue
            if isinstance(msg, Hello):
                seen["hosts"][msg.rank] = msg.host
            elif isinstance(msg, Step):
                seen["steps"].setdefault(msg.rank, []).append(msg.step)
                if any(e["state"] in ("resumed", "restarted") for e in seen["relay_events"]):
                    seen["after_resume"] = sorted({*seen["after_resume"], msg.rank})
            elif isinstance(msg, Bye):
                seen["byes"][msg.rank] = msg.ok
                seen["bye_reasons"][msg.rank] = msg.reason
            elif isinstance(msg, RankExit):
                seen["exits"][msg.of_rank] = {"how": msg.how, "detail": msg.detail, "ts": msg.ts}
            elif isinstance(msg, Event) and msg.kind == "relay":
                seen["relay_events"].append({"rank": msg.rank, "level": msg.level, **msg.data})
        if seen["stacks"] is None and len(seen["steps"]) == world_size:
            try:
                replies = list(send_command(info.control, "stacks", {"timeout_s": 10}, 30, info.keys))
                seen["stacks"] = replies[-1].result
            except Exception as exc:  # said in the file, for the test's message
                seen["stacks"] = {"error": repr(exc)}
            _write(out + ".ready", seen)
        done = seen["stacks"] is not None and (not outage or len(seen["after_resume"]) == world_size) and not death
        if done and seen["stop"] is None:
            seen["status"] = list(send_command(info.control, "status", {}, 30, info.keys))[-1].result
            seen["stop"] = list(send_command(info.control, "stop", {}, 60, info.keys))[-1].status
    _write(out, seen)


def _write(out: str, seen: dict) -> None:
    with open(out, "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:] == ["outage"], sys.argv[4:] == ["death"])
