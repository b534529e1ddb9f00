"""The real Textual app driven by a Pilot: replay from real files, live over real ZeroMQ sockets,
and a process in which `import torch` fails."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import msgspec
import pytest
import zmq

from ringtop.protocol import (
    Bye,
    CommStat,
    Hello,
    MemorySample,
    Reply,
    Step,
    decode,
    encode,
    free_tcp_port,
    to_json_line,
)
from ringtop.tui.app import RingtopApp
from ringtop.tui.replay import load_replay

SIZE = (140, 32)


# ---------------------------------------------------------------------- helpers


def make_hello(rank: int, seq: int = 0, ts: float = 1000.0) -> Hello:
    return Hello(rank=rank, seq=seq, ts=ts, run_id="7f3a9c21", world_size=2, host=f"node-{rank}", pid=4000 + rank,
                 backend="gloo", device="cpu", strategy="ddp", model="tiny-gpt", param_count=1_234_567,
                 batch_size=8, seq_len=64, steps=50)


def make_step(rank: int, n: int, seq: int, ts: float, step_ms: float | None = None) -> Step:
    return Step(rank=rank, seq=seq, ts=ts, step=n, loss=round(3.0 - 0.01 * n - 0.001 * rank, 4),
                step_ms=step_ms if step_ms is not None else 100.0 + 20 * rank,
                comm_blocked_ms=10.0, tokens=512, tokens_per_s=5120.0,
                mem=MemorySample(rss_bytes=(300 + rank) * 2**20),
                comm=[CommStat(kind="all_reduce", count=1, bytes=2_000_000, busy_ms=4.0, group_size=2)],
                cpu_percent=90.0 + rank)


def write_logdir(path: Path, steps: int = 5, torn: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        msgs = [make_hello(rank, ts=1000.0 + rank * 0.01)]
        msgs += [make_step(rank, n, seq=n + 1, ts=1001.0 + n + rank * 0.01) for n in range(steps)]
        data = b"".join(to_json_line(m) for m in msgs)
        if rank == 1 and torn:
            data += to_json_line(Bye(rank=1, seq=steps + 1, ts=1100.0, reason="finished"))[:20]
        (path / f"rank-{rank}.jsonl").write_bytes(data)
    return path


async def wait_until(pilot, predicate, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def cell(app: RingtopApp, rank: int, column: str) -> str:
    from textual.widgets import DataTable

    return str(app.query_one("#ranks", DataTable).get_cell(f"r{rank}", column))


def event_log_text(app: RingtopApp) -> str:
    from textual.widgets import RichLog

    return "\n".join(strip.text for strip in app.query_one("#event-log", RichLog).lines)


def header_text(app: RingtopApp) -> str:
    from textual.widgets import Static

    return str(app.query_one("#facts", Static).content) + "  " + str(app.query_one("#conn", Static).content)


# ---------------------------------------------------------------------- replay


async def test_replay_app_shows_rows_and_problems(tmp_path):
    log = load_replay(write_logdir(tmp_path / "log"))
    app = RingtopApp(messages=log.messages, problems=log.problems, source=str(tmp_path / "log"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.replay_loaded, what="replay to load")
        await wait_until(pilot, lambda: app.query_one("#ranks").row_count == 2, what="two rows")
        await pilot.pause(0.3)  # a repaint tick
        assert cell(app, 0, "step") == "4" and cell(app, 1, "step") == "4"
        assert cell(app, 0, "loss") == "2.960" and cell(app, 1, "loss") == "2.959"
        assert cell(app, 0, "step_ms") == "100.0"
        assert cell(app, 1, "step_ms").startswith("120.0")  # the slower rank...
        assert cell(app, 1, "note").startswith("slowest")  # ...is marked
        assert cell(app, 0, "host") == "node-0"
        # comm MB/s = 2e6 bytes / 0.1 s = 20 MB/s; comm% = 10/100
        assert cell(app, 0, "comm_mb_s") == "20.0" and cell(app, 0, "comm_pct") == "10.0"
        head = header_text(app)
        assert "run 7f3a9c21" in head and "tiny-gpt 1.2M" in head and "ddp ×2" in head and "replay" in head
        assert "step 4" in head
        # c in replay: not connected
        await pilot.press("c")
        await pilot.press("2")
        await pilot.pause(0.3)
        assert app.query_one("TabbedContent").active == "events"
        text = event_log_text(app)
        assert "rank-1.jsonl: last line is incomplete (torn write), skipped" in text
        assert "checkpoint: not connected" in text
        await pilot.press("1")
        assert app.query_one("TabbedContent").active == "overview"


# ---------------------------------------------------------------------- live


class FakeRun:
    """A PUB publishing ranks 0 and 1 (repeating: PUB/SUB slow joiner), and a ROUTER acting as
    rank 0's control server that answers every command with ack then done — on the control socket
    and, like the real agent, also on telemetry in rank 0's stream."""

    def __init__(self, rate_hz: float = 50.0, burst: int = 1) -> None:
        self.pub_addr = f"tcp://127.0.0.1:{free_tcp_port()}"
        self.ctl_addr = f"tcp://127.0.0.1:{free_tcp_port()}"
        self.rate_hz = rate_hz
        self.burst = burst
        self.stop = threading.Event()
        self.commands: list = []
        self.to_publish: queue.SimpleQueue = queue.SimpleQueue()
        self.published = 0
        self._ready = threading.Barrier(3)
        self.threads = [threading.Thread(target=self._publish, daemon=True),
                        threading.Thread(target=self._control, daemon=True)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        self._ready.wait(5)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(5)

    def _publish(self) -> None:
        ctx = zmq.Context.instance()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, 100_000)
        pub.bind(self.pub_addr)
        self._ready.wait(5)
        seq = {0: 0, 1: 0}
        n = 0
        next_t = time.monotonic()
        try:
            while not self.stop.is_set():
                while not self.to_publish.empty():
                    reply = msgspec.structs.replace(self.to_publish.get(), seq=seq[0], ts=time.time())
                    seq[0] += 1
                    pub.send_multipart([b"reply.0", encode(reply)])
                for _ in range(self.burst):
                    for rank in (0, 1):
                        msg = make_hello(rank, seq[rank], time.time()) if n % 20 == 0 else \
                            make_step(rank, n, seq[rank], time.time())
                        seq[rank] += 1
                        pub.send_multipart([msg.__struct_config__.tag.encode(), encode(msg)])
                        self.published += 1
                    n += 1
                next_t += 1.0 / self.rate_hz  # paced against the clock, not sleep-after-send
                time.sleep(max(0.0, next_t - time.monotonic()))
        finally:
            pub.close()

    def _control(self) -> None:
        ctx = zmq.Context.instance()
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(self.ctl_addr)
        self._ready.wait(5)
        try:
            while not self.stop.is_set():
                if not router.poll(20):
                    continue
                ident, payload = router.recv_multipart()
                cmd = decode(payload)
                self.commands.append(cmd)
                for status in ("ack", "done"):
                    reply = Reply(rank=0, ts=time.time(), id=cmd.id, status=status, cmd=cmd.cmd,
                                  result={"path": "/ckpt/step-9"} if status == "done" else {})
                    router.send_multipart([ident, encode(reply)])
                    self.to_publish.put(reply)
        finally:
            router.close()


@pytest.mark.timeout(60)
async def test_live_app_rows_header_and_checkpoint_command():
    with FakeRun() as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: {0, 1} <= set(app.view.ranks) and app.view.ranks[1].step > 0,
                             what="rows for ranks 0 and 1")
            await wait_until(pilot, lambda: app.query_one("#ranks").row_count == 2, what="table rows")
            await pilot.pause(0.3)
            assert cell(app, 0, "host") == "node-0" and cell(app, 1, "host") == "node-1"
            assert int(cell(app, 1, "step").replace(",", "")) > 0
            assert "● live" in header_text(app) and "ddp ×2" in header_text(app)

            await pilot.press("c")
            await wait_until(pilot, lambda: any(c.status == "done" for c in app.view.commands.values()),
                             what="checkpoint done reply")
            assert run.commands and run.commands[0].cmd == "checkpoint"
            assert run.commands[0].args == {"kind": "full"} and run.commands[0].rank == -1
            await pilot.press("2")
            await pilot.pause(0.4)
            text = event_log_text(app)
            assert "checkpoint" in text and "pending → ack → done" in text and "/ckpt/step-9" in text
            assert text.count("pending → ack → done") == 1  # the telemetry copy is not shown again
            assert app.view.ranks[0].seq_lost == 0  # ...but it keeps rank 0's sequence whole
        # quitting the UI closed its sockets and thread, nothing else
        assert app.client is None


@pytest.mark.timeout(60)
async def test_live_app_stays_responsive_under_5000_msgs_per_s():
    class TimedApp(RingtopApp):
        # (Textual calls on_mount of every class in the MRO, so no on_mount override here)
        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            self.repaints: list[float] = []

        def refresh_view(self) -> None:
            self.repaints.append(time.monotonic())
            super().refresh_view()

    # 2 ranks x 25 per burst x 100 bursts/s ~= 5,000 messages/s
    with FakeRun(rate_hz=100.0, burst=25) as run:
        app = TimedApp(publish_addr=run.pub_addr, control_addr=None)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.view.messages_total > 0, what="first messages")
            start_msgs, t0 = app.view.messages_total, time.monotonic()
            first_repaint = len(app.repaints)
            await pilot.pause(2.0)
            await pilot.press("2")  # keys are still handled promptly
            assert app.query_one("TabbedContent").active == "events"
            elapsed = time.monotonic() - t0
            rate = (app.view.messages_total - start_msgs) / elapsed
            gaps = [b - a for a, b in zip(app.repaints[first_repaint:], app.repaints[first_repaint + 1:])]
        print(f"rate={rate:.0f} msgs/s published={run.published} max_gap={max(gaps):.3f}s repaints={len(gaps)}")
        assert rate > 2_000, f"only {rate:.0f} msgs/s reached the view"
        assert gaps and max(gaps) < 1.0, f"repaint stalled for {max(gaps):.2f}s"
        assert app.view.rejected_total == 0


@pytest.mark.timeout(30)
async def test_live_app_with_nothing_listening_waits():
    app = RingtopApp(publish_addr=f"tcp://127.0.0.1:{free_tcp_port()}", control_addr=None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.3)
        assert "○ waiting" in header_text(app)
        await pilot.press("s")
        await pilot.press("2")
        await pilot.pause(0.3)
        assert "status: not connected (no control address)" in event_log_text(app)


# ---------------------------------------------------------------------- no torch


def _run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.timeout(90)
def test_ui_runs_in_a_process_where_torch_cannot_be_imported(tmp_path):
    logdir = write_logdir(tmp_path / "log")
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None  # `import torch` now raises ImportError
        import asyncio
        from ringtop.tui.app import RingtopApp
        from ringtop.tui.replay import load_replay
        try:
            import torch
        except ImportError:
            pass
        else:
            raise SystemExit("torch should not be importable here")

        async def main():
            log = load_replay(sys.argv[1])
            app = RingtopApp(messages=log.messages, problems=log.problems, source=sys.argv[1])
            async with app.run_test(size=(120, 30)) as pilot:
                for _ in range(200):
                    await pilot.pause(0.02)
                    if app.replay_loaded and app.query_one("#ranks").row_count == 2:
                        break
                await pilot.pause(0.3)
                table = app.query_one("#ranks")
                print("ROWS", table.row_count, str(table.get_cell("r0", "step")), str(table.get_cell("r1", "loss")))

        asyncio.run(main())
        assert sys.modules["torch"] is None
        assert not [m for m in sys.modules if m.startswith("torch.")], "a torch submodule was imported"
        print("OK")
    """)
    proc = _run_python(code, str(logdir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ROWS 2 4 2.959" in proc.stdout and "OK" in proc.stdout


def test_tui_modules_do_not_import_torch():
    code = textwrap.dedent("""
        import sys
        import ringtop.tui, ringtop.tui.app, ringtop.tui.connection, ringtop.tui.replay, ringtop.tui.view_model
        assert "torch" not in sys.modules, "ringtop.tui imported torch"
        print("OK")
    """)
    proc = _run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK" in proc.stdout


async def test_events_tab_shows_bounded_backlog():
    from ringtop.protocol import Event

    msgs = [make_hello(0)] + [Event(rank=0, seq=i + 1, ts=1001.0 + i, level="info", kind="tick", text=f"event {i}")
                              for i in range(700)]
    app = RingtopApp(messages=msgs)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.replay_loaded, what="replay to load")
        await pilot.pause(0.3)
        assert app.query_one("#event-log").lines == []  # nothing written while the tab is hidden
        await pilot.press("2")
        await wait_until(pilot, lambda: "event 699" in event_log_text(app), what="latest event")
        text = event_log_text(app)
        assert "older events not kept" in text and "event 0\n" not in text
