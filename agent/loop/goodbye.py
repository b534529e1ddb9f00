"""How a rank ends: the ordinary shutdown on the training thread (the Bye said, then every socket,
thread and file let go), or the stall watch's escape when the training thread is stuck inside a
collective and cannot (the Bye said for it, naming where it is stuck, and the process ended).
Whichever starts first holds `ending`; the other waits or leaves it be."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

import torch.distributed as dist

from ringtop.protocol import Bye
from ringtop.protocol.downlink import Downlink
from ringtop.protocol.text_safety import printable

if TYPE_CHECKING:
    from ringtop.agent.loop.runner import Runner

EXIT_STOPPED_WHILE_STUCK = 3
"""A rank the stall watch ended because its training thread could not (a stop while stuck)."""
PEER_BYES_S = 3.0
"""On several nodes, how long rank 0's relay waits for the other nodes' Byes (they come a hop later)."""


class Goodbye:
    def __init__(self, run: Runner) -> None:
        self.run = run
        self.ending = threading.Lock()
        """Held by whoever ends the process: the training thread's shutdown or the watch's escape."""

    def escape(self, reason: str) -> None:
        """On the watch's thread: the training thread cannot end the run (it is stuck inside a
        collective, where signal handlers never run). Say goodbye for it, naming where it is stuck,
        and end the process; rank 0 first tells the other ranks to do the same."""
        if not self.ending.acquire(blocking=False):
            return  # the training thread is already shutting down
        run = self.run
        place = run.watch.stuck_at()
        bye = Bye(reason=f"{reason} {place}", ok=False, step=run.step)
        print(printable(f"ringtop agent [rank {run.ctx.rank}]: {bye.reason}; leaving without the training thread"),
              file=sys.stderr, flush=True)
        if run.ctx.rank == 0 and run.head is not None:
            # the others first: a rank leaving ends its peers' collectives in errors and its launcher
            # stops them, before they could say where they were stuck
            run.head.send_down(Downlink(action="stop", reason=reason[:200]))
            run.head.await_byes(range(1, run.ctx.world_size), run.watch.settings.grace_s + 2.0)
        self.answer_while_stuck(place)
        try:
            self.release_outside_world(bye)
            if run.node_relay is not None:
                run.node_relay.stop()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(EXIT_STOPPED_WHILE_STUCK)

    def answer_while_stuck(self, place: str) -> None:
        """The commands queued for a step boundary that will not come: the stop is done, the rest ended."""
        run = self.run
        if run.control is None:
            return
        for pending in run.control.take_pending():
            if pending.command.cmd == "stop":
                run.control.reply(pending.command, "done", result={"step": run.step, "stuck": place})
            else:
                run.control.reply(pending.command, "error", error="the run was stopped while stuck", code="ended")

    def release_outside_world(self, bye: Bye) -> None:
        """Everything a rank holds outside itself, let go in order: the sampler, the connection
        file and the control server (its last replies are published before the Bye), the Bye, the
        sockets. No collective."""
        run = self.run
        if run.sampler is not None:
            run.sampler.stop()
        if run.head is not None:
            run.head.stop_control()
        if run.telemetry is not None:
            run.telemetry.close(bye)

    def shutdown(self, bye: Bye) -> None:
        """Says goodbye and lets go. A stop signal from here on (the launcher stops the survivors
        of a dead rank moments after it died) must not cut this short: the Bye would be lost."""
        run = self.run
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if not self.ending.acquire(blocking=False):
            # the watch is ending the process for a stuck training thread: let it say the Bye
            self.ending.acquire(timeout=15)
            return
        if run.watch is not None:
            run.watch.cancel_interrupt()
            run.watch.stop()
            if not bye.reason and run.watch.stuck_reason:  # the stop landed before the reason was set
                bye.reason, bye.ok = run.watch.stuck_reason, False
        self.release_outside_world(bye)
        if (bye.ok or run.stopped_nonfinite) and run.control_group is not None:  # every rank is here
            dist.barrier(group=run.control_group)
        if run.node_relay is not None:
            run.node_relay.stop()
        if run.head is not None:
            if run.layout.multi:  # the other nodes' Byes come a hop later
                run.head.await_byes(range(run.ctx.world_size), PEER_BYES_S)
            run.head.stop()  # after the relay the exporter: the Byes are in; no thread or port outlives the run
        run.strategy.teardown()
