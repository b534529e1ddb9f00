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
from ui_waits import eventually, repainted

from ringtop.protocol import (
    Bye,
    CommStat,
    Hello,
    MemorySample,
    Prediction,
    Reply,
    Sharding,
    Step,
    decode,
    encode,
    free_tcp_port,
    free_tcp_ports,
    to_json_line,
)
from ringtop.tui.app import REFRESH_S, RingtopApp
from ringtop.tui.sources.replay import load_replay

SIZE = (140, 32)


# ---------------------------------------------------------------------- helpers


def make_hello(rank: int, seq: int = 0, ts: float = 1000.0, strategy: str = "ddp") -> Hello:
    return Hello(rank=rank, seq=seq, ts=ts, run_id="7f3a9c21", world_size=2, host=f"node-{rank}", pid=4000 + rank,
                 backend="gloo", device="cpu", strategy=strategy, model="tiny-gpt", param_count=1_234_567,
                 batch_size=8, seq_len=64, steps=50)


def make_step(rank: int, n: int, seq: int, ts: float, step_ms: float | None = None) -> Step:
    return Step(rank=rank, seq=seq, ts=ts, step=n, loss=round(3.0 - 0.01 * n - 0.001 * rank, 4),
                step_ms=step_ms if step_ms is not None else 100.0 + 20 * rank,
                exposed_comm_ms=10.0, tokens=512, tokens_per_s=5120.0,
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
        def _shown_1():
            assert cell(app, 0, "step") == "4" and cell(app, 1, "step") == "4"
            assert cell(app, 0, "loss") == "2.960" and cell(app, 1, "loss") == "2.959"
            assert cell(app, 0, "step_ms") == "100.0"
            assert cell(app, 1, "step_ms").startswith("120.0")  # the slower rank...
            assert cell(app, 1, "note").startswith("▲ slowest: compute")  # ...is marked, by its compute
            assert cell(app, 0, "host") == "node-0"
        await eventually(pilot, _shown_1)
        # comm MB/s = 2e6 bytes / 0.1 s = 20 MB/s; idle% = (data 0 + exposed 10) / 100
        assert cell(app, 0, "comm_mb_s") == "20.0" and cell(app, 0, "idle_pct") == "10"  # fmt.pct, as the Comm tab
        head = header_text(app)
        assert "run 7f3a9c21" in head and "tiny-gpt 1.2M" in head and "ddp ×2" in head and "replay" in head
        assert "step 4" in head
        # c in replay: not offered, nothing happens
        await pilot.press("c")
        await pilot.press("5")
        def _shown_2():
            assert app.query_one("TabbedContent").active == "events"
            text = event_log_text(app)
            assert "rank-1.jsonl: last line is incomplete (torn write), skipped" in text
            assert "checkpoint" not in text and app.view.commands == {}
        await eventually(pilot, _shown_2)
        await pilot.press("1")
        assert app.query_one("TabbedContent").active == "overview"


# ---------------------------------------------------------------------- live


class FakeRun:
    """A PUB publishing ranks 0 and 1 (repeating: PUB/SUB slow joiner), and a ROUTER acting as
    rank 0's control server that answers every command with ack then done — on the control socket
    and, like the real agent, also on telemetry in rank 0's stream."""

    def __init__(self, rate_hz: float = 50.0, burst: int = 1, results: dict | None = None) -> None:
        """`results`: per command name, the `done` reply's result (default: a checkpoint's)."""
        self.results = results or {}
        pub_port, ctl_port = free_tcp_ports(2)
        self.pub_addr = f"tcp://127.0.0.1:{pub_port}"
        self.ctl_addr = f"tcp://127.0.0.1:{ctl_port}"
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
                    done = self.results.get(cmd.cmd, {"path": "/ckpt/step-9"})
                    reply = Reply(rank=0, ts=time.time(), id=cmd.id, status=status, cmd=cmd.cmd,
                                  result=done if status == "done" else {})
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

            def rows_and_header():  # a rank's host comes with its Hello, which may follow its first Steps
                assert cell(app, 0, "host") == "node-0" and cell(app, 1, "host") == "node-1"
                assert int(cell(app, 1, "step").replace(",", "")) > 0
                assert "● live" in header_text(app) and "ddp ×2" in header_text(app)
            await eventually(pilot, rows_and_header)

            await pilot.press("c")
            await wait_until(pilot, lambda: any(c.status == "done" for c in app.view.commands.values()),
                             what="checkpoint done reply")
            assert run.commands and run.commands[0].cmd == "checkpoint"
            assert run.commands[0].args == {"kind": "full"} and run.commands[0].rank == -1
            await pilot.press("5")

            def checkpoint_logged_once():
                text = event_log_text(app)
                assert "checkpoint" in text and "pending → ack → done" in text and "/ckpt/step-9" in text
                assert text.count("pending → ack → done") == 1  # the telemetry copy is not shown again
            await eventually(pilot, checkpoint_logged_once)
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
            await pilot.pause(3.0)
            await pilot.press("5")  # keys are still handled promptly
            assert app.query_one("TabbedContent").active == "events"
            elapsed = time.monotonic() - t0
            rate = (app.view.messages_total - start_msgs) / elapsed
            gaps = [b - a for a, b in zip(app.repaints[first_repaint:], app.repaints[first_repaint + 1:])]
        print(f"rate={rate:.0f} msgs/s published={run.published} max_gap={max(gaps):.3f}s repaints={len(gaps)}")
        assert rate > 2_000, f"only {rate:.0f} msgs/s reached the view"
        assert gaps and max(gaps) < REFRESH_S + 0.5, f"repaint stalled for {max(gaps):.2f}s (timer {REFRESH_S} s)"
        assert app.view.rejected_total == 0


@pytest.mark.timeout(30)
async def test_live_app_with_nothing_listening_waits():
    app = RingtopApp(publish_addr=f"tcp://127.0.0.1:{free_tcp_port()}", control_addr=None)
    async with app.run_test(size=SIZE) as pilot:
        def _shown_3():
            assert "○ waiting" in header_text(app)
        await eventually(pilot, _shown_3)
        await pilot.press("s")
        await pilot.press("5")
        def _shown_4():
            assert "status: not connected (no control address)" in event_log_text(app)
        await eventually(pilot, _shown_4)


@pytest.mark.timeout(30)
async def test_the_apps_collector_thresholds_are_its_own_and_given_back_when_it_ends():
    """A large run's UI collects less often (GC_THRESHOLDS; the pauses it saves are measured in
    benchmarks/README.md, UI at scale); the process that ran the app, a test or a script, gets
    its own thresholds back."""
    import gc

    from ringtop.tui.app import GC_THRESHOLDS

    before = gc.get_threshold()
    gc.set_threshold(500, 5, 5)
    try:
        app = RingtopApp(publish_addr=f"tcp://127.0.0.1:{free_tcp_port()}", control_addr=None)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_threshold() == (500, 5, 5)
    finally:
        gc.set_threshold(*before)


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
        from ringtop.tui.sources.replay import load_replay
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
                await pilot.press("2")  # the Memory tab asks the torch-free cost model
                for _ in range(100):
                    await pilot.pause(0.02)
                    if app.query_one("#fit").row_count:
                        break
                print("FIT", app.query_one("#fit").row_count, app.query_one("#mem-ranks").row_count)
                await pilot.press("3")  # the Comm tab asks the cost model for busbw factors
                for _ in range(100):
                    await pilot.pause(0.02)
                    if app.query_one("#comm-kinds").row_count:
                        break
                kinds = app.query_one("#comm-kinds")
                print("COMM", kinds.row_count, str(kinds.get_cell("all", "busbw")))
                await pilot.press("4")  # the Pipeline tab asks the torch-free schedule arithmetic
                await pilot.pause(0.3)
                print("PIPE", "Not a pipeline run" in str(app.query_one("#pp-caption").content))
                from ringtop.tui.actions import switch_rows  # the picker's figures (no picker in a replay)
                print("PICK", sum(r.params_bytes is not None for r in switch_rows(app.view)))

        asyncio.run(main())
        assert sys.modules["torch"] is None
        assert not [m for m in sys.modules if m.startswith("torch.")], "a torch submodule was imported"
        print("OK")
    """)
    proc = _run_python(code, str(logdir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ROWS 2 4 2.959" in proc.stdout and "OK" in proc.stdout
    assert "FIT 7 4" in proc.stdout  # 7 strategies; per rank a measured and a predicted row
    # all_reduce and the all row; this log sends no busy union, so busbw uses the call's own 4 ms:
    # 2e6 B / 4 ms x factor 1 (n = 2) = 0.5 GB/s
    assert "COMM 2 0.500" in proc.stdout
    assert "PIPE True" in proc.stdout and "PICK 7" in proc.stdout


async def test_events_tab_shows_bounded_backlog():
    from ringtop.protocol import Event

    msgs = [make_hello(0)] + [Event(rank=0, seq=i + 1, ts=1001.0 + i, level="info", kind="tick", text=f"event {i}")
                              for i in range(700)]
    app = RingtopApp(messages=msgs)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.replay_loaded, what="replay to load")
        def _shown_5():
            assert app.query_one("#event-log").lines == []  # nothing written while the tab is hidden
        await eventually(pilot, _shown_5)
        await pilot.press("5")
        await wait_until(pilot, lambda: "event 699" in event_log_text(app), what="latest event")
        text = event_log_text(app)
        assert "older events not kept" in text and "event 0\n" not in text


# ---------------------------------------------------------------------- strategies: header, memory, comm kinds

GiB = 2**30
MiB = 2**20


def zero3_gpu_run(steps: int = 3) -> list:
    """Two ZeRO-3 ranks on 40 GiB GPUs, 2**30 fp32 parameters, Adam (8 B/param). Every number below
    is chosen so the expected screen can be worked out by hand in the test."""
    msgs: list = []
    for r in (0, 1):
        # per rank: params 2**30 / 2 x 4 B = 2 GiB, grads 2 GiB, optimizer 2**29 x 8 B = 4 GiB
        pred = Prediction(params_bytes=2 * GiB, grads_bytes=2 * GiB, optimizer_bytes=4 * GiB,
                          comm_payload_bytes={"all_gather": 8 * GiB, "reduce_scatter": 4 * GiB},
                          comm_sent_bytes=6 * GiB, note="flat shards, ceil(P/N)")
        msgs.append(Hello(rank=r, seq=0, ts=1000.0 + r * 0.01, run_id="z3", world_size=2, host="gpu-a", pid=10 + r,
                          backend="nccl", device=f"cuda:{r}", strategy="zero3",
                          sharding=Sharding(params=True, grads=True, optimizer=True), dtype="fp32",
                          optimizer_bytes_per_param=8, prediction=pred, model="tiny-gpt", param_count=GiB,
                          device_mem_total_bytes=40 * GiB, steps=10))
    for n in range(1, steps + 1):
        for r in (0, 1):
            optimizer = 4 * GiB + (4 * MiB if r == 1 else 0)  # rank 1 holds 4 MiB more than predicted
            msgs.append(Step(
                rank=r, seq=n, ts=1000.0 + n + r * 0.01, step=n, loss=2.0, step_ms=200.0, exposed_comm_ms=20.0,
                mem=MemorySample(params_bytes=2 * GiB, grads_bytes=2 * GiB, optimizer_bytes=optimizer,
                                 cuda_allocated_bytes=32 * GiB, cuda_reserved_bytes=38 * GiB,
                                 cuda_peak_bytes=36 * GiB),
                comm=[CommStat(kind="all_gather", count=4, bytes=5_000_000, busy_ms=10.0, group_size=2),
                      CommStat(kind="reduce_scatter", count=2, bytes=2_500_000, busy_ms=5.0, group_size=2)]))
    return msgs


def table_cell(app: RingtopApp, table: str, row: str, column: str) -> str:
    from textual.widgets import DataTable

    return " ".join(str(app.query_one(table, DataTable).get_cell(row, column)).split())


def static_text(app: RingtopApp, selector: str) -> str:
    from textual.widgets import Static

    return str(app.query_one(selector, Static).content)


def column_labels(app: RingtopApp, table: str) -> dict[str, str]:
    from textual.widgets import DataTable

    return {str(k.value): str(c.label) for k, c in app.query_one(table, DataTable).columns.items()}


async def test_zero3_header_per_kind_comm_and_memory_tab():
    """At 160 columns: every column of both tabs is shown (narrower terminals drop some: test_snapshots)."""
    app = RingtopApp(messages=zero3_gpu_run(), source="zero3")
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_until(pilot, lambda: app.replay_loaded, what="replay to load")
        await wait_until(pilot, lambda: app.query_one("#ranks").row_count == 2, what="two rows")
        await repainted(pilot)

        # header: the strategy and what it shards; fp32 is not worth a word
        head = header_text(app)
        assert "zero3 ×2 (params+grads+optim sharded)" in head and "fp32" not in head

        # rank table: per-kind MB/s, reduce-scatter before all-gather, beside the total
        # all_gather 5e6 B / 0.2 s = 25 MB/s, reduce_scatter 2.5e6 / 0.2 = 12.5 MB/s, total 37.5
        labels = column_labels(app, "#ranks")
        assert labels["comm_kinds"] == "RS/AG MB/s"
        order = list(labels)
        assert order.index("comm_mb_s") + 1 == order.index("comm_kinds") < order.index("idle_pct")
        for r in (0, 1):
            assert cell(app, r, "comm_kinds") == "12.5/25.0"
            assert cell(app, r, "comm_mb_s") == "37.5" and cell(app, r, "idle_pct") == "10"

        # the Memory tab
        await pilot.press("2")
        await wait_until(pilot, lambda: app.query_one("#fit").row_count == 7, what="the fit table")
        def _shown_6():
            assert app.query_one("TabbedContent").active == "memory"
            assert app.query_one("#mem-ranks").row_count == 4  # measured and predicted, for 2 ranks
            labels = column_labels(app, "#mem-ranks")
            assert [labels[k] for k in ("total", "reserved", "peak")] == ["alloc", "reserved", "peak"]
        await eventually(pilot, _shown_6)
        m = lambda row, col: table_cell(app, "#mem-ranks", row, col)  # noqa: E731
        # rank 0 holds exactly the prediction
        assert (m("r0", "params"), m("r0", "grads"), m("r0", "optim"), m("r0", "state")) == \
            ("2.0GiB =", "2.0GiB =", "4.0GiB =", "8.0GiB =")
        # rank 1: 4 MiB more optimizer state: 4 MiB / 4 GiB = +0.098 %, of the 8 GiB state +0.049 %
        assert (m("r1", "optim"), m("r1", "state")) == ("4.0GiB +0.10%", "8.0GiB +0.05%")
        for r in ("r0p", "r1p"):
            assert (m(r, "params"), m(r, "grads"), m(r, "optim"), m(r, "state")) == \
                ("2.0GiB", "2.0GiB", "4.0GiB", "8.0GiB")
            assert m(r, "rank").endswith("pred")
        # other = allocated 32 GiB − state 8 GiB = 24 GiB; reserved and peak as sent
        assert (m("r0", "other"), m("r0", "total"), m("r0", "reserved"), m("r0", "peak")) == \
            ("24.0GiB", "32.0GiB", "38.0GiB", "36.0GiB")
        # the bar: 12 cells for 40 GiB; rank 0's 32 GiB take round(32/40 x 12) = 10, the predicted 8 GiB ~3
        assert m("r0", "bar") == "█" * 10 + "··"
        assert "note: flat shards, ceil(P/N)" in static_text(app, "#mem-caption")

        # which strategy fits 40 GiB, with the 36 − 8 = 28 GiB of non-state memory measured now, each
        # strategy as ringtop runs it (not with this fixture's 8 B/param: DeepSpeed keeps an fp32 master
        # and two moments, 12 B/param, sharded from stage 1; the torch strategies AdamW's 8 B/param):
        # ddp 4+4+8 = 16 GiB state, need 44 = 110 % ✗; zero1 between steps 4+2+6 = 12 (its reduced
        # gradients partitioned after backward, as zero2's), need 40 = 100 % ✓;
        # zero2 4+2+6 = 12, need 40 = 100 % ✓; zero3 2+2+6 = 10, need 38 = 95 %; fsdp-full 2+2+4 = 8, 90 %
        f = lambda row, col: table_cell(app, "#fit", row, col)  # noqa: E731
        assert f("zero3", "strategy") == "▶ zero3"
        assert [f(s, "strategy") for s in ("ddp", "zero1", "zero2", "fsdp-full")] == \
            ["ddp", "zero1", "zero2", "fsdp-full"]  # only this run's strategy is marked
        assert (f("ddp", "state"), f("ddp", "need"), f("ddp", "fits")) == ("16.0GiB", "44.0GiB", "✗ 110%")
        assert (f("zero1", "state"), f("zero1", "need"), f("zero1", "fits")) == ("12.0GiB", "40.0GiB", "✓ 100%")
        assert (f("zero2", "need"), f("zero2", "fits")) == ("40.0GiB", "✓ 100%")
        assert (f("zero3", "params"), f("zero3", "grads"), f("zero3", "optim")) == ("2.0GiB", "2.0GiB", "6.0GiB")
        assert (f("zero3", "state"), f("zero3", "need"), f("zero3", "fits")) == ("10.0GiB", "38.0GiB", "✓ 95%")
        assert (f("fsdp-full", "state"), f("fsdp-full", "fits")) == ("8.0GiB", "✓ 90%")
        assert f("zero3", "sharded") == "params+grads+optim" and f("ddp", "sharded") == "-"
        # bytes on the wire per rank, N = 2, 4 GiB of params and of grads: ddp 2 x 1/2 x 4 = 4 GiB,
        # zero3 two all-gathers and a reduce-scatter, 3 x 1/2 x 4 = 6 GiB
        assert (f("ddp", "wire"), f("zero3", "wire")) == ("4.0GiB", "6.0GiB")
        caption = static_text(app, "#fit-caption")
        assert "(28.0GiB)" in caption and "40.0GiB per rank" in caption

        await pilot.press("5")
        assert app.query_one("TabbedContent").active == "events"


async def test_header_shows_fsdp_sharding_and_dtype():
    hello = Hello(rank=0, run_id="f1", world_size=4, backend="nccl", device="cuda:0", strategy="fsdp",
                  strategy_options={"sharding": "grad-op"}, sharding=Sharding(grads=True, optimizer=True),
                  dtype="bf16", param_count=1000)
    app = RingtopApp(messages=[hello])
    async with app.run_test(size=(140, 30)) as pilot:
        await wait_until(pilot, lambda: app.replay_loaded, what="replay to load")
        def _shown_7():
            assert "fsdp(grad-op) ×4 (grads+optim sharded) bf16" in header_text(app)
        await eventually(pilot, _shown_7)


async def test_memory_tab_on_cpu_without_a_prediction(tmp_path):
    """The DDP replay of the first tests: no Hello.prediction and no state bytes sent, ranks on
    hosts that are not this one: predictions come from the UI's own cost model, capacity unknown."""
    log = load_replay(write_logdir(tmp_path / "log", torn=False))
    app = RingtopApp(messages=log.messages, source="ddp")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.replay_loaded, what="replay to load")
        await pilot.press("2")
        await wait_until(pilot, lambda: app.query_one("#fit").row_count == 7, what="the fit table")
        def _shown_8():
            assert "ddp ×2 (replicated)" in header_text(app)
            assert column_labels(app, "#ranks")["comm_kinds"] == "AR MB/s"
            assert cell(app, 0, "comm_kinds") == "20.0"  # 2e6 B / 0.1 s
        await eventually(pilot, _shown_8)
        m = lambda row, col: table_cell(app, "#mem-ranks", row, col)  # noqa: E731
        # 1,234,567 fp32 params, DDP replicates: 4,938,268 B = 4.7 MiB each of params and grads,
        # 9,876,536 B = 9.4 MiB of optimizer, 19,753,072 B = 18.8 MiB state
        assert (m("r0p", "params"), m("r0p", "grads"), m("r0p", "optim"), m("r0p", "state")) == \
            ("4.7MiB", "4.7MiB", "9.4MiB", "18.8MiB")
        assert m("r0p", "rank").endswith("pred*")
        assert "pred*: computed here" in static_text(app, "#mem-caption")
        # this agent counted no state bytes (all 0): shown as not measured; other = all of RSS, 300 MiB
        assert (m("r0", "params"), m("r0", "state")) == ("-", "-")
        assert m("r0", "other") == "300MiB" and m("r0", "total") == "300MiB"
        assert "the agent counted no parameter/gradient/optimizer bytes" in static_text(app, "#mem-caption")
        assert "RSS" in column_labels(app, "#mem-ranks").values()
        f = lambda row, col: table_cell(app, "#fit", row, col)  # noqa: E731
        assert f("ddp", "strategy") == "▶ ddp" and f("zero1", "strategy") == "zero1"
        assert f("ddp", "fits") == "?"
        assert "capacity unknown" in static_text(app, "#fit-caption")


def test_rank_table_drops_columns_by_priority_to_fit_the_terminal():
    from ringtop.metrics.fmt import mb_compact
    from ringtop.tui.tabs.overview.render import NOTE_MIN_WIDTH, overview_columns

    width = lambda cols: sum(c.width + 2 for c in cols)  # noqa: E731  (one padding cell each side)
    keys = lambda cols: [c.key for c in cols]  # noqa: E731
    # all four kinds (a real DeepSpeed ZeRO-3 step on gloo)
    four = ["all_reduce", "reduce_scatter", "all_gather", "broadcast"]
    wide = overview_columns(four, len("0/7.3/7.3/-"), 158)
    assert {"host", "cpu", "comm_kinds", "breakdown", "drops", "tok_s"} <= set(keys(wide)) and width(wide) <= 158
    assert [c.label for c in wide if c.key == "comm_kinds"] == ["AR/RS/AG/BC MB/s"]
    for table_width in (96, 118, 158):
        cols = overview_columns(four, len("0/7.3/7.3/-"), table_width)
        assert width(cols) <= table_width, table_width
        assert keys(cols)[:1] == ["rank"] and keys(cols)[-1] == "note"
        assert {"step_ms", "idle_pct", "step", "loss", "mem"} <= set(keys(cols))
        assert cols[-1].width >= NOTE_MIN_WIDTH
    narrow = keys(overview_columns(four, len("0/7.3/7.3/-"), 96))
    assert "cpu" not in narrow and "host" not in narrow and "comm_kinds" not in narrow
    # the order of the kept columns is the table's own
    assert narrow == [k for k in keys(wide) if k in narrow]
    assert [mb_compact(x) for x in (0.001, 0.05, 7.25, 12.5, 1234.4, 12_345.0)] == \
        ["0", "0.05", "7.2", "12.5", "1234", "12k"]


def test_memory_model_has_no_ui_imports():
    import ringtop.tui.tabs.memory.figures as m

    src = open(m.__file__).read()
    assert "textual" not in src and "import torch" not in src and "rich" not in src


# ---------------------------------------------------------------------- stuck ranks


def hang_text(app: RingtopApp, selector: str) -> str:
    from textual.widgets import Static

    return str(app.query_one(selector, Static).render())


async def test_hang_banner_names_the_culprit_and_goes_when_the_ranks_step_again():
    import hang_scenario as hs

    seq = hs.Seq()
    app = RingtopApp(messages=hs.hung_run(seq=seq), source="runs/hang")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.replay_loaded, what="replay to load")
        banner = app.query_one("#hang-banner")

        def shown():
            assert banner.display
            text = hang_text(app, "#hang-banner")
            assert "HANG" in text and "rank 3 has not entered all_reduce #21 on group world (4.0MiB)" in text
            assert "6 Hang view" in text
            assert "✖ hung: rank 3 holding up ranks 0–2" in hang_text(app, "#health")
        await repainted(pilot)
        await eventually(pilot, shown)
        for m in hs.recovered(4, seq):  # fed to the view model, as the app's receive path does
            app.view.apply(m)

        def gone():
            assert not banner.display
            assert "● healthy" in hang_text(app, "#health")
        await repainted(pilot)
        await eventually(pilot, gone)


async def test_hang_view_lists_the_ranks_culprit_first_and_shows_a_chosen_ranks_stack():
    import hang_scenario as hs
    from textual.widgets import DataTable

    app = RingtopApp(messages=hs.hung_run(), source="runs/hang")
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_until(pilot, lambda: app.replay_loaded, what="replay to load")
        await pilot.press("6")
        table = app.query_one("#hang-ranks", DataTable)

        def listed():
            assert app.query_one("TabbedContent").active == "hang"
            assert [k.value for k in table.rows] == ["h3", "h0", "h1", "h2"]  # the culprit first
            assert table_cell(app, "#hang-ranks", "h3", "state") == "stalled 39 s"
            assert table_cell(app, "#hang-ranks", "h0", "state") == "waits 40 s", "the verdict's wait"
            assert table_cell(app, "#hang-ranks", "h3", "where") == "model.py:57 in forward"
            assert table_cell(app, "#hang-ranks", "h0", "waiting") == "all_reduce #21 world 4.0MiB +1"
            assert table_cell(app, "#hang-ranks", "h0", "groups") == "world 22/20"
            stack = hang_text(app, "#hang-stack")
            assert stack.startswith("rank 3  stall report")
            frames = [line.strip() for line in stack.splitlines()]
            assert frames[-2:] == ["/home/u/model.py:57 in forward", "/usr/lib/python3.12/time.py:1 in sleep"]
            assert "rank 3 has not entered" in hang_text(app, "#hang-caption")
        await repainted(pilot)
        await eventually(pilot, listed)
        await pilot.press("down")  # the table has the focus: the next row's stack

        def rank_0():
            assert app.hang_rank == 0
            stack = hang_text(app, "#hang-stack")
            assert stack.startswith("rank 0  stall report") and "waiting in all_reduce #21 on group world" in stack
            assert stack.rstrip().endswith("distributed_c10d.py:2501 in wait")
        await eventually(pilot, rank_0)


async def test_hang_view_groups_a_thousand_ranks_into_a_few_rows():
    import hang_scenario as hs
    from textual.widgets import DataTable

    app = RingtopApp(messages=hs.hung_run(world=1000, culprit=517, steps=1, reports=1), source="runs/hang")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.replay_loaded, timeout=30, what="replay to load")
        await pilot.press("6")

        def grouped():
            table = app.query_one("#hang-ranks", DataTable)
            assert [k.value for k in table.rows] == ["h517", "h0"]
            assert table_cell(app, "#hang-ranks", "h0", "rank") == "0–516, 518–999"
            assert table_cell(app, "#hang-ranks", "h517", "rank") == "▶ 517"
        await repainted(pilot)
        await eventually(pilot, grouped)


def test_stacks_key_is_offered_in_the_palette():
    from ringtop.tui.run_commands import RUN_COMMANDS

    assert ("stacks", "k") in {(c.action, c.key) for c in RUN_COMMANDS}


@pytest.mark.timeout(60)
async def test_stacks_key_sends_the_command_and_the_hang_view_shows_the_answer():
    result = {"answered": 2, "missing": [], "groups": [
        {"ranks": [1], "label": "rank 1", "phase": "forward", "where": "model.py:57 in forward", "step": 9,
         "running_s": 4.5, "stack": ["/a/train.py:10 in main", "/a/model.py:57 in forward"], "in_flight": []},
        {"ranks": [0], "label": "rank 0", "phase": "backward", "where": "train.py:120 in hook", "step": 9,
         "running_s": 4.4, "stack": ["/a/train.py:10 in main", "/a/train.py:120 in hook"],
         "in_flight": ["all_reduce #37 on group world (4.0MiB) for 4.3 s"]}]}
    with FakeRun(results={"stacks": result}) as run:
        app = RingtopApp(publish_addr=run.pub_addr, control_addr=run.ctl_addr)
        async with app.run_test(size=(140, 48)) as pilot:
            await wait_until(pilot, lambda: {0, 1} <= set(app.view.ranks), what="rows for ranks 0 and 1")
            await wait_until(pilot, lambda: app.client is not None and app.client.has_control, what="control")
            await pilot.press("k")
            await wait_until(pilot, lambda: any(c.cmd == "stacks" and c.status == "done"
                                                for c in app.view.commands.values()), what="stacks done reply")
            assert run.commands[0].cmd == "stacks" and run.commands[0].args == {}
            assert app.query_one("TabbedContent").active == "hang"  # where the answer is shown

            def answered():
                reply = hang_text(app, "#hang-reply")
                assert "2 of 2 ranks answered, 2 distinct stacks" in reply
                assert "rank 1 (1): forward, model.py:57 in forward, step 9, running 4.5 s" in reply
                assert "waiting in all_reduce #37 on group world (4.0MiB) for 4.3 s" in reply
                assert reply.rstrip().endswith("/a/train.py:120 in hook")
                assert "nothing is stuck" in hang_text(app, "#hang-caption")
            await repainted(pilot)
            await eventually(pilot, answered)


async def test_hang_and_desync_events_carry_their_level_colour_in_the_events_tab():
    import hang_scenario as hs
    from textual.widgets import RichLog

    from ringtop.protocol import Event, HangReport

    msgs = [hs.hello(r) for r in range(4)] + [
        Event(rank=0, seq=1, ts=hs.T0 + 5, level="error", kind="hang", text="rank 3 has not entered all_reduce #21",
              hang=HangReport(verdict="hang", culprits=[3])),
        Event(rank=0, seq=2, ts=hs.T0 + 6, level="error", kind="desync", text="desync in step 7 on group world",
              hang=HangReport(verdict="desync", step=7, culprits=[1]))]
    app = RingtopApp(messages=msgs, source="runs/hang")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.replay_loaded, what="replay to load")
        await pilot.press("5")
        await wait_until(pilot, lambda: "desync in step 7" in event_log_text(app), what="the desync event")
        for kind in ("hang: rank 3 has not entered", "desync in step 7"):
            strip = next(s for s in app.query_one("#event-log", RichLog).lines if kind in s.text)
            level = next(seg for seg in strip if seg.text.strip() == "error")
            assert level.style.color is not None and level.style.color.name == "red" and level.style.bold
