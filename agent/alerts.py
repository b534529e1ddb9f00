"""`--alert-webhook URL`, `--alert-command CMD`: rank 0 tells someone when an incident opens and
when it resolves (metrics/rules/incidents.py says what an incident is).

A relay observer, on the relay's thread, folds what the relay forwards into signals: it costs
the training thread nothing. Notices go through a bounded queue to a thread of their own, which
POSTs them (a Slack-compatible body: `text`, and the same as JSON under `ringtop`) and runs the
command (the notice as JSON on its stdin and in RINGTOP_ALERT), each with a timeout. A full queue
drops the notice and counts it; an endpoint that fails is said once in the run's events and
counted, never raised.
"""

from __future__ import annotations

import json
import math
import os
import queue
import shlex
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

from ringtop.metrics.goodput import Goodput
from ringtop.metrics.rules.incidents import FloorWatch, Incidents, Notice, Signal, SpikeWatch
from ringtop.protocol import Bye, Event, Hello, RankExit, Step

QUEUE_DEPTH = 64
SEND_TIMEOUT_S = 10.0
GOODPUT_EVERY_S = 5.0
"""How often the goodput floor is read (a fold over the run so far: not per message)."""
GOODPUT_AFTER_S = 60.0
"""Goodput is not judged in a run's first minute: start-up is most of it by then."""
HANG_VERDICTS = {"hang": "hang", "dead": "death", "stall": "stall"}


@dataclass(frozen=True)
class AlertTargets:
    webhook: str = ""
    command: str = ""
    goodput_floor_pct: float = 0.0
    """0 = no goodput alert."""

    def __post_init__(self) -> None:
        if self.webhook and not self.webhook.startswith(("http://", "https://")):
            raise ValueError(f"--alert-webhook {self.webhook!r}: an http:// or https:// URL")
        if self.command and not shlex.split(self.command):
            raise ValueError("--alert-command: an empty command")
        if not 0 <= self.goodput_floor_pct <= 100:
            raise ValueError(f"--alert-goodput {self.goodput_floor_pct:g}: a percentage, 0..100")

    @property
    def any(self) -> bool:
        return bool(self.webhook or self.command)


def hang_report(msg: Event) -> tuple[str, list[int], int] | None:
    """(verdict, culprits, step) of a hang or desync event (an older agent's `data` map is read as
    its report by the codec); a stall that is over is placed at rank 0's step."""
    report = msg.hang
    if report is None:
        return None
    return report.verdict, list(report.culprits), report.step if report.verdict != "cleared" else msg.step


class Alerts:
    """The observer (`observe`) and the sending thread (`start`, `stop`)."""

    def __init__(self, targets: AlertTargets, run_id: str, log_dir: str = "",
                 say: Callable[[str, str, str], None] | None = None) -> None:
        self.targets = targets
        self.run_id = run_id
        self.log_dir = log_dir
        self.say = say
        """say(level, kind, text): an event in the run's log (an endpoint's failure, once)."""
        self.incidents = Incidents()
        self.spikes = SpikeWatch()
        self.floor = FloorWatch(targets.goodput_floor_pct / 100) if targets.goodput_floor_pct > 0 else None
        self.goodput = Goodput() if self.floor is not None else None
        self._goodput_read = 0.0
        self._started: float | None = None
        self.hosts: dict[int, str] = {}
        self._nonfinite_ranks: set[int] = set()
        self._queue: queue.Queue[Notice | None] = queue.Queue(QUEUE_DEPTH)
        self._thread = threading.Thread(target=self._send_loop, name="ringtop-alerts", daemon=True)
        self.sent = 0
        self.dropped = 0
        self.failed = 0
        self._failure_said = False

    # ------------------------------------------------------------------ on the relay's thread

    def observe(self, msg: Any) -> None:
        now = time.time()
        if self.goodput is not None:
            self.goodput.add(msg)
        for signal in self._signals(msg):
            for notice in self.incidents.feed(signal, now):
                self._enqueue(notice)
        if isinstance(msg, Bye) and msg.rank == 0:
            for notice in self.incidents.run_ended(f"the run ended: {msg.reason}", -1, now):
                self._enqueue(notice)
        self._read_goodput(now)

    def _signals(self, msg: Any) -> list[Signal]:
        if isinstance(msg, Hello):
            self.hosts[msg.rank] = msg.host
            self._started = self._started or msg.ts
            return []
        if isinstance(msg, Event):
            return self._event_signals(msg)
        if isinstance(msg, RankExit):  # its node's watcher saw the process gone
            text = f"rank {msg.of_rank} {msg.how or 'died'} at step {msg.step} (pid {msg.pid})"
            return [Signal("death", True, text, (msg.of_rank,), max(msg.step, 0))]
        if isinstance(msg, Step):
            out = []
            if msg.rank in self._nonfinite_ranks and msg.loss is not None and math.isfinite(msg.loss) \
                    and not msg.skipped:
                self._nonfinite_ranks.discard(msg.rank)
                if not self._nonfinite_ranks:
                    out.append(Signal("nonfinite", False, f"finite again at step {msg.step}", step=msg.step))
            if msg.rank == 0 and self.spikes.over(msg.step):
                out.append(Signal("loss_spike", False, f"no spike since step {msg.step - 20}", step=msg.step))
            return out
        return []

    def _event_signals(self, msg: Event) -> list[Signal]:
        if msg.kind in ("hang", "desync"):
            found = hang_report(msg)
            if found is None:
                return []
            verdict, culprits, step = found
            if msg.kind == "desync" or verdict == "desync":
                return [Signal("desync", True, msg.text, tuple(culprits), step)]
            if verdict == "cleared":
                return [Signal("hang", False, msg.text, step=step), Signal("stall", False, msg.text, step=step)]
            kind = HANG_VERDICTS.get(verdict)
            return [Signal(kind, True, msg.text, tuple(culprits), step)] if kind else []
        if msg.kind == "nonfinite" and msg.level in ("warn", "error"):
            named = [r for r in (msg.data or {}).get("ranks", []) if isinstance(r, int) and r >= 0]
            self._nonfinite_ranks.add(msg.rank)  # the rank that said it: its next finite step ends it
            return [Signal("nonfinite", True, msg.text, tuple(named or [msg.rank]), msg.step)]
        if msg.kind == "loss_spike":
            self.spikes.spiked(msg.step)
            return [Signal("loss_spike", True, msg.text, (msg.rank,), msg.step)]
        return []

    def _read_goodput(self, now: float) -> None:
        if self.goodput is None or self._started is None or now - self._goodput_read < GOODPUT_EVERY_S \
                or now - self._started < GOODPUT_AFTER_S:
            return
        self._goodput_read = now
        result = self.goodput.result()
        if not result.known:
            return
        crossed = self.floor.crossed(result.goodput)
        if crossed is None:
            return
        text = (f"goodput {result.goodput:.1%} is under the floor of {self.floor.floor:.0%}" if crossed else
                f"goodput {result.goodput:.1%} is back above {self.floor.floor:.0%}")
        for notice in self.incidents.feed(Signal("goodput", crossed, text), now):
            self._enqueue(notice)

    def _enqueue(self, notice: Notice) -> None:
        try:
            self._queue.put_nowait(notice)
        except queue.Full:
            self.dropped += 1

    # ------------------------------------------------------------------ on the alerts thread

    def body(self, n: Notice) -> dict[str, Any]:
        """What is sent: Slack's `text`, and every field under `ringtop`."""
        ranks = ", ".join(f"{r} ({self.hosts.get(r, '?')})" for r in n.ranks)
        lasted = f" after {n.ts - n.opened_ts:.0f} s" if n.action == "resolved" else ""
        where = f" at step {n.step}" if n.step >= 0 else ""
        replay = f"ringtop replay {shlex.quote(self.log_dir)}" if self.log_dir else ""
        head = "🔴" if n.action == "opened" else "✅"
        text = (f"{head} ringtop run {self.run_id}: {n.kind} {n.action}{lasted}{where}: {n.text}"
                + (f" — ranks {ranks}" if ranks else "") + (f" — `{replay}`" if replay else ""))
        return {"text": text, "ringtop": {"run_id": self.run_id, "action": n.action, "kind": n.kind, "text": n.text,
                                          "ranks": list(n.ranks), "hosts": [self.hosts.get(r, "") for r in n.ranks],
                                          "step": n.step, "ts": n.ts, "opened_ts": n.opened_ts, "replay": replay}}

    def _send_loop(self) -> None:
        while True:
            notice = self._queue.get()
            if notice is None:
                return
            body = self.body(notice)
            ok = True
            if self.targets.webhook:
                ok &= self._post(body)
            if self.targets.command:
                ok &= self._run(body)
            if ok:
                self.sent += 1

    def _post(self, body: dict) -> bool:
        request = urllib.request.Request(self.targets.webhook, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=SEND_TIMEOUT_S) as reply:
                reply.read(1 << 16)
            return True
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return self._failed(f"the alert webhook failed: {exc}")

    def _run(self, body: dict) -> bool:
        payload = json.dumps(body)
        try:
            done = subprocess.run(shlex.split(self.targets.command), input=payload, text=True, timeout=SEND_TIMEOUT_S,
                                  env={**os.environ, "RINGTOP_ALERT": payload}, capture_output=True)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return self._failed(f"the alert command failed: {exc}")
        if done.returncode != 0:
            return self._failed(f"the alert command exited {done.returncode}: {done.stderr.strip()[:200]}")
        return True

    def _failed(self, text: str) -> bool:
        self.failed += 1
        if not self._failure_said and self.say is not None:
            self._failure_said = True
            self.say("warn", "alert", f"{text} (said once; failures are counted)")
        return False

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = SEND_TIMEOUT_S + 1) -> None:
        """Sends what is queued (the run's last resolutions), within `timeout_s`."""
        try:
            self._queue.put(None, timeout=1.0)
        except queue.Full:
            return
        if self._thread.is_alive():
            self._thread.join(timeout_s)
