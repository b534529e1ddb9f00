"""The stall watch (agent/health/stall_watch.py) and rank 0's hang watch (agent/health/hang_watch.py), in-process:
a real watch thread watching a real "training" thread, a real tracer; bounded polls."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import poll_until

from ringtop.agent.health.hang_watch import SETTLE_S, HangWatch
from ringtop.agent.health.stall_watch import StallWatch, StoppedWhileStuck, WatchSettings, where_in
from ringtop.agent.instruments.comm_tracer import CommTracer
from ringtop.protocol import Stall, Step

FAST = WatchSettings(factor=2.0, floor_s=0.3, warmup_s=0.3, startup_s=0.3, command_s=5.0, interval_s=0.02,
                     repeat_s=0.2, grace_s=0.2)


def stuck_in_the_model(release: threading.Event) -> None:
    """Stands for a model's forward that never returns (in Python: a stop can interrupt it)."""
    deadline = time.monotonic() + 30
    while not release.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)


class Trainer:
    """A thread that runs 'steps' under the watch, then gets stuck in `stuck_in_the_model`."""

    def __init__(self, steps_before: int, step_s: float, settings: WatchSettings = FAST, escape=None):
        self.release = threading.Event()
        self.interrupted = threading.Event()
        self.reports: list[Stall] = []
        self.tracer = CommTracer()
        self._steps_before, self._step_s = steps_before, step_s
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self._ready.wait(5)
        self.watch = StallWatch(self.tracer, self.reports.append, settings=settings,
                                training_thread=self.thread.ident, escape=escape)
        self._go.set()
        self.watch.start()

    _go = None

    def _run(self) -> None:
        self._go = threading.Event()
        self._ready.set()
        self._go.wait(5)
        for step in range(1, self._steps_before + 1):
            self.watch.iteration(step, "step-sync")
            self.watch.phase("forward")
            time.sleep(self._step_s)
        self.watch.iteration(self._steps_before + 1, "step-sync")
        self.watch.phase("forward")
        handle = self.tracer.begin("all_reduce", 4096, 2, "world", "abcd1234")
        try:
            stuck_in_the_model(self.release)
        except StoppedWhileStuck:
            self.interrupted.set()
            return
        self.tracer.end(handle)
        self.watch.iteration(self._steps_before + 2, "step-sync")
        time.sleep(0.5)

    def close(self) -> None:
        self.release.set()
        self.watch.stop()
        self.thread.join(5)


@pytest.mark.timeout(30)
def test_a_stuck_step_is_reported_with_its_phase_stack_and_collective_then_its_recovery():
    trainer = Trainer(steps_before=5, step_s=0.01)
    try:
        poll_until(lambda: trainer.reports, 10, "a stall report")
        report = trainer.reports[0]
        assert report.state == "stalled" and report.step == 6 and report.phase == "forward"
        assert report.running_s > report.threshold_s >= FAST.floor_s
        assert report.where.startswith("test_stall_watch.py:") and report.where.endswith(" in stuck_in_the_model")
        assert any("in _run" in frame for frame in report.stack)
        assert [(op.group, op.seq, op.kind, op.bytes, op.shapes) for op in report.in_flight] == \
            [("world", 1, "all_reduce", 4096, "abcd1234")]
        assert [(c.group, c.issued, c.completed) for c in report.groups] == [("world", 1, 0)]
        poll_until(lambda: len(trainer.reports) >= 2, 10, "the report repeated")
        trainer.release.set()
        poll_until(lambda: trainer.reports[-1].state == "recovered", 10, "recovered")
    finally:
        trainer.close()


@pytest.mark.timeout(30)
def test_steps_at_their_usual_pace_raise_nothing():
    reports: list[Stall] = []
    watch = StallWatch(None, reports.append, settings=FAST)
    watch.start()
    try:
        for step in range(1, 60):
            watch.iteration(step, "step-sync")
            time.sleep(0.005)
        watch.idle()
        time.sleep(FAST.floor_s + 0.2)  # idle longer than any threshold: outside the loop is never a stall
    finally:
        watch.stop()
    assert reports == []


@pytest.mark.timeout(30)
def test_a_stop_is_carried_out_for_a_stuck_thread_only():
    escaped: list[tuple[str, float, float]] = []
    holder: dict[str, Trainer] = {}

    def escape(reason: str) -> None:
        watch = holder["trainer"].watch
        escaped.append((reason, watch.report().running_s, watch.threshold_s()))

    trainer = holder["trainer"] = Trainer(steps_before=5, step_s=0.01, escape=escape)
    try:
        trainer.watch.request_stop("stopped by user", only_if_stalled=True)
        poll_until(lambda: escaped, 10, "the escape")
        (reason, running_s, threshold_s), = escaped
        assert reason == "stopped by user"
        assert running_s > threshold_s, "only once the step is stalled"
        assert trainer.interrupted.wait(10), "a stuck thread running Python is stopped the ordinary way too"
        assert trainer.watch.stuck_reason.startswith("stopped by user while stuck at step 6 in forward at "
                                                     "test_stall_watch.py:")
    finally:
        trainer.close()


@pytest.mark.timeout(30)
def test_a_stop_command_waits_for_a_healthy_loop_to_apply_it():
    escaped: list[str] = []
    watch = StallWatch(None, lambda s: None, settings=FAST, escape=escaped.append)
    watch.start()
    try:
        watch.request_stop("stopped by user", only_if_stalled=True)
        deadline = time.monotonic() + FAST.grace_s * 5
        step = 0
        while time.monotonic() < deadline:
            step += 1
            watch.iteration(step, "step-sync")
            time.sleep(0.01)
    finally:
        watch.stop()
    assert escaped == []


def test_where_skips_torch_and_ringtops_tracing():
    import sys

    frame = sys._current_frames()[threading.get_ident()]
    assert where_in(frame).startswith("test_stall_watch.py:")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stalled(rank: int, **fields) -> Stall:
    return Stall(rank=rank, state="stalled", **fields)


def test_rank_zero_names_the_culprit_once_the_others_reported_and_says_when_it_is_over():
    from ringtop.protocol import GroupCursor, InFlight

    clock, events = Clock(), []
    watch = HangWatch(2, lambda *e: events.append(e), clock=clock)
    waiting = stalled(0, step=8, phase="backward", in_flight=[InFlight(group="world", seq=14, kind="all_reduce",
                                                                       bytes=1 << 20, age_s=5.0)],
                      groups=[GroupCursor(group="world", issued=14, completed=13)])
    watch.observe(waiting)
    assert events == [], "it waits for the other ranks' reports"
    hung = stalled(1, step=8, phase="forward", where="model.py:83 in forward",
                   groups=[GroupCursor(group="world", issued=13, completed=13)])
    watch.observe(hung)
    assert len(events) == 1
    level, kind, text, report = events[0]
    assert (level, kind, report.culprits, report.seq) == ("error", "hang", [1], 14)
    assert text.startswith("rank 1 has not entered all_reduce #14 on group world")
    watch.observe(waiting)
    assert len(events) == 1, "the same verdict is not repeated at once"
    clock.now += 31
    watch.observe(waiting)
    assert len(events) == 2, "restated while it lasts"
    watch.observe(Step(rank=0, step=8, loss=1.0, step_ms=1.0))
    watch.observe(Stall(rank=1, state="recovered", step=9))
    assert events[-1][1] == "hang" and events[-1][3].verdict == "cleared"


def test_rank_zero_names_a_lone_report_after_settling():
    clock, events = Clock(), []
    watch = HangWatch(2, lambda *e: events.append(e), clock=clock)
    watch.observe(stalled(1, step=3, phase="forward", running_s=9.0, threshold_s=4.0))
    assert events == []
    clock.now += SETTLE_S + 0.1
    watch.observe(stalled(1, step=3, phase="forward", running_s=11.0, threshold_s=4.0))
    assert [(e[3].verdict, e[3].culprits) for e in events] == [("stall", [1])]
    assert events[0][0] == "warn", "nobody waits on it yet: a warning, not an error"


def test_a_silent_rank_of_another_node_is_not_dead_until_its_watcher_says_so():
    """Silence alone cannot tell a rank behind a cut link or stuck from a dead one off this host:
    it is named as one that sent no report; its node's watcher's RankExit makes it dead."""
    from ringtop.protocol import GroupCursor, Hello, InFlight, RankExit

    clock, events = Clock(), []
    watch = HangWatch(2, lambda *e: events.append(e), clock=clock)
    watch.observe(Hello(rank=1, run_id="r", world_size=2, host="another-node", pid=4242, process_started_ts=1.0))
    clock.now += 30.0  # rank 1 silent long past the silence rule
    watch.observe(stalled(0, step=8, phase="backward", groups=[GroupCursor(group="world", issued=14, completed=13)],
                          in_flight=[InFlight(group="world", seq=14, kind="all_reduce", bytes=1 << 20, age_s=9.0)]))
    clock.now += SETTLE_S + 0.1
    watch.observe(stalled(0, step=8, phase="backward", groups=[GroupCursor(group="world", issued=14, completed=13)],
                          in_flight=[InFlight(group="world", seq=14, kind="all_reduce", bytes=1 << 20, age_s=9.7)]))
    assert [(e[3].verdict, e[3].culprits) for e in events] == [("hang", [1])], events
    assert "has died" not in events[0][2] and "rank 1 sent no stall report" in events[0][2]
    watch.observe(RankExit(of_rank=1, pid=4242, how="killed by SIGKILL"))
    assert [(e[3].verdict, e[3].culprits) for e in events][-1] == ("dead", [1])
    assert events[-1][2].startswith("rank 1 has died")


def test_rank_zero_compares_step_digests_and_names_a_desync_once():
    from ringtop.protocol import GroupCursor

    events = []
    watch = HangWatch(3, lambda *e: events.append(e), clock=Clock())
    for step in (5, 6):
        for rank in range(3):
            digest = "bad00000" if (rank == 2 and step == 5) else "good0000"
            watch.observe(Step(rank=rank, step=step, loss=1.0, step_ms=1.0, collectives=[
                GroupCursor(group="world", issued=step * 4, completed=step * 4, count=4, digest=digest)]))
    assert [(e[1], e[3].culprits, e[3].step) for e in events] == [("desync", [2], 5)]


@pytest.mark.parametrize("steps_before, state", [(0, "starting"), (5, "stalled")])
@pytest.mark.timeout(30)
def test_in_start_up_a_stuck_step_is_reported_as_starting_long_before_the_warm_up(steps_before, state):
    """The warm-up (30 s here) bounds only the rank's own stall; its whereabouts go out after
    `startup_s`, as `starting`. Once its usual step time is known, a stuck step is a stall."""
    settings = WatchSettings(factor=2.0, floor_s=0.3, warmup_s=30.0, startup_s=0.3, interval_s=0.02, repeat_s=0.2)
    trainer = Trainer(steps_before=steps_before, step_s=0.01, settings=settings)
    try:
        report = poll_until(lambda: next(iter(trainer.reports), None), 10, "a report")
        assert (report.state, report.step, report.phase) == (state, steps_before + 1, "forward")
        assert report.threshold_s == (30.0 if steps_before == 0 else pytest.approx(2 * 0.01 + 0.3, abs=0.01))
        assert [(op.kind, op.seq) for op in report.in_flight] == [("all_reduce", 1)]
        trainer.release.set()
        poll_until(lambda: trainer.reports[-1].state == "recovered", 10, "recovered")
    finally:
        trainer.close()


def test_a_place_is_the_users_frame_never_ringtops_own_machinery():
    import threading as stdlib_module

    import torch

    from ringtop.agent.health import diagnosis_exchange
    from ringtop.agent.health.stall_watch import is_users
    from ringtop.agent.loop import runner
    from ringtop.agent.models import model
    from ringtop.metrics.rules import hang
    from ringtop.strategies import collective_hooks

    assert is_users(__file__), "a user's script"
    assert is_users(model.__file__), "an agent run trains ringtop's model in place of a user's"
    for own in (diagnosis_exchange.__file__, runner.__file__, collective_hooks.__file__, hang.__file__,
                stdlib_module.__file__, torch.__file__, "<frozen runpy>"):
        assert not is_users(own), own
    assert is_users("<string>"), "a user's `python -c` program"


@pytest.mark.timeout(30)
def test_before_the_first_step_a_stuck_set_up_is_placed_and_counts_as_no_step():
    settings = WatchSettings(factor=2.0, floor_s=0.3, warmup_s=30.0, startup_s=0.3, interval_s=0.02, repeat_s=0.2)
    reports: list[Stall] = []
    watch = StallWatch(None, reports.append, settings=settings)
    watch.start()
    try:
        watch.setting_up(1, "data")
        report = poll_until(lambda: next(iter(reports), None), 10, "a report from the set-up")
        assert (report.state, report.step, report.phase) == ("starting", 1, "data")
        watch.iteration(1, "step-sync")
        poll_until(lambda: reports[-1].state == "recovered", 10, "recovered once the loop begins")
        assert watch.threshold_s() == 30.0, "the set-up is not a step of the history"
    finally:
        watch.stop()
