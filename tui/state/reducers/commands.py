"""The operations a UI sees: commands it sent and replies from rank 0 (to any client's command),
folded into one state per command id, and each result in words for the Events tab."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from ringtop.metrics import fmt
from ringtop.protocol import UI_RANK, Reply
from ringtop.tui.sanitize import visible
from ringtop.tui.stacks_text import group_heading, stacks_lines
from ringtop.tui.state.reducers.events import EventLog


def _finite_num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else 0.0

STATUSES = ("ack", "done", "error")
MAX_COMMANDS = 200
NOT_RUN_ENDED = "not run: the run ended"
"""What a command still in flight when its run ended says."""
REFUSED_ENDED = "the run has ended"
"""Why a command is refused at once when the run is over."""
"""Commands remembered for the Events tab's operations panel and the header's in-flight line."""


@dataclass
class CommandState:
    id: str
    cmd: str
    args: dict[str, Any] = field(default_factory=dict)
    status: str = "pending"
    """pending (sent, nothing back yet) -> ack -> done | error."""
    history: list[str] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    code: str = ""
    sent_ts: float = 0.0
    """Wall clock when the UI sent it, or when the first reply was seen (a command of another client)."""
    finished_ts: float = 0.0
    mine: bool = False
    """Sent by this UI (its arguments are known)."""

    @property
    def finished(self) -> bool:
        return self.status in ("done", "error")

    @property
    def phase(self) -> str:
        """What the user reads: pending (sent, nothing back), running (acknowledged), done, failed."""
        return {"pending": "pending", "ack": "running", "done": "done", "error": "failed"}.get(self.status, self.status)

    @property
    def title(self) -> str:
        """The command in words, from its arguments: `checkpoint sharded async`, `switch → zero3`."""
        return command_title(self.cmd, self.args)


class CommandLog:
    def __init__(self, events: EventLog) -> None:
        self.commands: dict[str, CommandState] = {}
        self._seen: set[tuple[str, str]] = set()
        self._events = events

    def restated(self, operations: Any, ts: float) -> None:
        """Rank 0's `operations_recent`: commands this UI has not seen (it attached later) are
        added as they ended; what it has seen stands. No event lines: a restatement is not news."""
        for op in operations if isinstance(operations, list) else []:
            if not isinstance(op, dict):
                continue
            cmd_id, cmd, status = op.get("id"), op.get("cmd"), op.get("status")
            if not (isinstance(cmd_id, str) and cmd_id and isinstance(cmd, str) and status in STATUSES):
                continue
            if visible(cmd_id) in self.commands:
                continue
            args, result, error = op.get("args"), op.get("result"), op.get("error")
            sent = _finite_num(op.get("ts")) or ts
            finished = _finite_num(op.get("finished_ts")) if status in ("done", "error") else 0.0
            state = CommandState(id=visible(cmd_id), cmd=visible(cmd), status=status, history=[status],
                                 args=dict(args) if isinstance(args, dict) else {},
                                 result=dict(result) if isinstance(result, dict) else {},
                                 error=visible(error) if isinstance(error, str) else "", sent_ts=sent,
                                 finished_ts=finished)
            self._keep(state)

    def _keep(self, state: CommandState) -> None:
        self.commands[state.id] = state
        while len(self.commands) > MAX_COMMANDS:
            del self.commands[next(iter(self.commands))]

    def sent(self, cmd_id: str, cmd: str, args: dict[str, Any] | None = None) -> CommandState:
        """The UI sent a command; it is `pending` until a Reply arrives."""
        state = CommandState(id=cmd_id, cmd=cmd, args=dict(args or {}), status="pending",
                             history=["pending"], sent_ts=time.time(), mine=True)
        self._keep(state)
        arg_text = " ".join(f"{k}={v}" for k, v in state.args.items())
        sent = f" ({arg_text})" if arg_text else ""
        self._events.add("info", None, f"{state.title} [{cmd_id}] sent{sent} → pending", state.sent_ts,
                        kind="command", cmd_id=cmd_id)
        return state

    def end_pending(self, ts: float) -> bool:
        """The run ended: what is still in flight will not run (a `stop` did: it ended the run).
        Says so once per command; True if any was in flight."""
        ended = [c for c in self.commands.values() if not c.finished]
        for state in ended:
            stop = state.cmd == "stop"
            state.status = "done" if stop else "error"
            state.error = "" if stop else NOT_RUN_ENDED
            state.code = "" if stop else "ended"
            state.history.append(state.status)
            state.finished_ts = ts
            text = "the run stopped" if stop else NOT_RUN_ENDED
            self._events.add("info" if stop else "warn", None, f"{state.title or '?'} [{state.id}] "
                             f"{' → '.join(state.history)}: {text}", ts, kind="reply", cmd_id=state.id)
        return bool(ended)

    def active(self) -> list[CommandState]:
        """Operations still in flight (pending or acknowledged), oldest first; `status` is answered
        at once and never listed."""
        return [c for c in self.commands.values() if not c.finished and c.cmd != "status"]

    def recent(self, n: int = 6) -> list[CommandState]:
        """The last `n` commands (sent here or seen in replies), newest first."""
        return list(self.commands.values())[-n:][::-1]

    def on_reply(self, msg: Reply, strategy_name: str = "") -> None:
        # Each reply reaches the UI that sent the command twice: on its control socket and on
        # telemetry (where every UI sees it). Show each status of a command once.
        key = (msg.id, msg.status)
        if msg.id and key in self._seen:
            return
        if msg.id:
            self._seen.add(key)
            if len(self._seen) > 10_000:
                self._seen.clear()
        state = self.commands.get(msg.id)
        if state is None:
            state = CommandState(id=msg.id, cmd=msg.cmd, history=[], sent_ts=msg.ts or time.time())
            self._keep(state)
        state.cmd = state.cmd or msg.cmd
        acked_args = msg.result.get("args") if msg.status == "ack" else None
        if not state.args and isinstance(acked_args, dict):  # another client's command: its ack says what
            state.args = dict(acked_args)
        if state.finished and msg.status == "ack":
            return  # the ack overtaken by its own result (two channels): the result stands
        state.status = msg.status
        state.history.append(msg.status)
        if msg.result:
            state.result = dict(msg.result)
        if msg.error:
            state.error = msg.error
            state.code = msg.code
        if state.finished:
            state.finished_ts = msg.ts or time.time()
        trail = " → ".join(state.history)
        detail = ""
        if msg.status == "error":
            detail = f": {msg.error}" + (f" ({msg.code})" if msg.code else "")
            if state.cmd == "switch" and strategy_name:
                detail += f"; the run goes on with {strategy_name}"
        elif msg.result:
            detail = ": " + describe_result(state.cmd, msg.status, msg.result)
        level = "error" if msg.status == "error" else "info"
        self._events.add(level, msg.rank if msg.rank != UI_RANK else None,
                        f"{state.title or '?'} [{msg.id}] {trail}{detail}", msg.ts, kind="reply", cmd_id=msg.id)


def command_title(cmd: str, args: dict[str, Any]) -> str:
    """A command in words: `checkpoint sharded async`, `switch → fsdp grad-op`, `set micro_batches=4`."""
    args = args if isinstance(args, dict) else {}
    if cmd == "checkpoint" and args:
        return " ".join(["checkpoint", str(args.get("kind", "full"))] + (["async"] if args.get("async") else []))
    if cmd == "switch" and args.get("strategy"):
        target = str(args["strategy"])
        if args.get("fsdp_sharding"):
            target += f" {args['fsdp_sharding']}"
        return f"switch → {target}"
    if cmd == "set" and args:
        return "set " + " ".join(f"{k}={v}" for k, v in args.items())
    if cmd == "profile" and "steps" in args:
        return f"profile {args['steps']} steps"
    return cmd or "?"


def _num(d: dict[str, Any], key: str) -> float | None:
    v = d.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def describe_result(cmd: str, status: str, result: dict[str, Any], one_line: bool = False) -> str:
    """A reply's result in words, for the event log (unknown keys fall back to key=value);
    `one_line`: a single short line (the Events tab's operations panel). Long by design: one
    branch per command, read side by side, is how a new command's words are added."""
    r = result if isinstance(result, dict) else {}
    if status == "ack":
        where = r.get("applies_at")
        return f"applies at {where}" if isinstance(where, str) else _compact(r)
    seconds = _num(r, "seconds")
    took = f" in {seconds:.2f} s" if seconds is not None else ""
    if cmd == "checkpoint" and "path" in r:
        parts = []
        if _num(r, "bytes"):
            parts.append(fmt.nbytes(_num(r, "bytes")))
        if isinstance(r.get("step"), int):
            parts.append(f"step {r['step']}")
        extra = f" ({', '.join(parts)})" if parts else ""
        path = str(r["path"])
        if one_line:  # the checkpoint's own name; the event log has the whole path
            path = path.rstrip("/").rsplit("/", 1)[-1]
        return f"{r.get('kind', '')} checkpoint written{took}: {path}{extra}".lstrip()
    if cmd == "switch" and ("from" in r or "to" in r):
        at = f" at step {r['step']}" if isinstance(r.get("step"), int) else ""
        return f"{r.get('from', '?')} → {r.get('to', '?')}{at}{took}"
    if cmd == "status" and "step" in r:
        return status_text(r)
    if cmd == "set" and "micro_batches" in r:
        after = f" after step {r['step']}" if isinstance(r.get("step"), int) else ""
        return f"micro-batches now {r['micro_batches']}{after}"
    if cmd == "stacks" and isinstance(r.get("groups"), list):
        groups = [group_heading(g) for g in r["groups"] if isinstance(g, dict)]
        lines = stacks_lines(r)
        summary, missing = lines[0].text, [line.text for line in lines if line.role == "missing"]
        if one_line:
            return "; ".join([summary] + groups[:2] + (["…"] if len(groups) > 2 else []))
        return "\n".join([summary + " (the Hang view has the stacks)"] + [f"  {g}" for g in groups] + missing)
    if cmd == "profile" and isinstance(r.get("ranks"), list) and one_line:
        parts = [f"r{d.get('rank', '?')} {fmt.ms(_num(d, 'exposed_comm_ms_per_step_trace'))} vs "
                 f"{fmt.ms(_num(d, 'exposed_comm_ms_per_step_live'))}" for d in r["ranks"] if isinstance(d, dict)]
        return "exposed comm ms/step, trace vs live: " + ", ".join(parts)
    if cmd == "profile" and isinstance(r.get("ranks"), list):
        steps = r.get("steps", "?")
        lines = [f"profile of {steps} steps, exposed communication per step, trace vs live "
                 f"(trace: torch.profiler's timeline of these {steps} steps, the reference; live: ringtop's "
                 "always-on hooks, what the other tabs show):"]
        for d in r["ranks"]:
            if not isinstance(d, dict):
                continue
            trace, live = _num(d, "exposed_comm_ms_per_step_trace"), _num(d, "exposed_comm_ms_per_step_live")
            total, overlap = _num(d, "comm_ms_per_step_trace"), _num(d, "overlap_pct_trace")
            line = f"  rank {d.get('rank', '?')}: exposed {fmt.ms(trace)} ms (trace) vs {fmt.ms(live)} ms (live)"
            if total is not None:
                line += f", comm {fmt.ms(total)} ms"
            if overlap is not None:
                line += f", overlap {overlap:.0f}%"
            if d.get("trace"):
                line += f"  {d['trace']}"
            if d.get("error"):
                line += f"  error: {d['error']}"
            gap = profile_gap(trace, live)
            if gap:
                line += f"  [{gap}]"
            lines.append(line)
        return "\n".join(lines)
    return _compact(r)


PROFILE_AGREE_RATIO = 1.3
"""Trace and live exposed comm within this factor of each other agree, for a few profiled steps."""


def profile_gap(trace_ms: float | None, live_ms: float | None) -> str:
    """Which figure to trust when the two disagree: the trace saw every op of these steps."""
    if trace_ms is None or live_ms is None or not (math.isfinite(trace_ms) and math.isfinite(live_ms)):
        return ""
    lo, hi = sorted((trace_ms, live_ms))
    if hi < 1.0 or (lo > 0 and hi / lo <= PROFILE_AGREE_RATIO):
        return "agree"
    ratio = f"{hi / lo:.1f}×" if lo > 0 else "one is 0"
    return f"differ {ratio}: trust the trace for these steps; the live figure is what the other tabs show"


def status_text(r: dict[str, Any]) -> str:
    """A `status` result in words, the checkpoint by its directory name (the whole path is in the
    connection file's checkpoint_dir): nothing cut off at 100 columns."""
    parts = []
    steps = r.get("steps")
    if isinstance(r.get("step"), int):
        parts.append(f"step {r['step']}" + (f"/{steps}" if isinstance(steps, int) and steps > 0 else ""))
    if r.get("strategy"):
        ranks = f" ×{r['world_size']}" if isinstance(r.get("world_size"), int) else ""
        parts.append(f"{r['strategy']}{ranks}")
    loss, step_ms = _num(r, "loss"), _num(r, "step_ms")
    if loss is not None:
        parts.append(f"loss {fmt.loss(loss)}")
    if step_ms is not None:
        parts.append(f"{fmt.ms(step_ms)} ms/step")
    last = r.get("last_checkpoint")
    parts.append(f"last ckpt {str(last).rstrip('/').rsplit('/', 1)[-1]}" if last else "no checkpoint yet")
    refused = r.get("refused_connections")
    if isinstance(refused, int) and refused:
        parts.append(f"{refused:,} refused")
    return ", ".join(parts)


def _compact(d: dict[str, Any], limit: int = 160) -> str:
    parts = []
    for k, v in d.items():
        if isinstance(v, float):
            v = f"{v:.4g}"
        elif isinstance(v, (dict, list)):
            v = f"{type(v).__name__}[{len(v)}]"
        parts.append(f"{k}={v}")
    text = " ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"
