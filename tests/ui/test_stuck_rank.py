"""A rank stuck in native code that holds the GIL sends nothing, not even its heartbeat, yet it is
alive: the UI looks at its process from outside (/proc on its host, py-spy for its stack) and says
`stuck (alive, GIL held, CPU 0%) in … ← hang_holding_the_gil (faults.py:…)`, never `dead`; rank 0's hang
watch, which looks the same way, names it as the rank the others wait for, not as died. Real
ranks (`--inject-hang 1:4:gil-held`: libc's sleep through ctypes.PyDLL), the real app."""

from __future__ import annotations

import os
import time

import pytest
from test_tui_app import header_text
from ui_waits import eventually, repainted

from ringtop.metrics.rules.liveness import stuck_words
from ringtop.protocol import native_stack
from ringtop.protocol.processes import look
from ringtop.tui.sources.exit_probe import PROBE_EVERY_S
from ringtop.tui.state.liveness import DEAD_AFTER_S

DUMP = """Process 7007: python /tmp/gil.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 7007 (idle): "MainThread"
    clock_nanosleep (libc.so.6)
    sleep (libc.so.6)
    ffi_call (libffi.so.8.1.2)
    PyCFuncPtr_call (_ctypes.c:4201)
    stuck (/home/u/gil.py:7)
    <module> (/home/u/gil.py:8)
Thread 7009 (idle): "Thread-1 (beat)"
    pthread_cond_timedwait (libc.so.6)
    beat (/home/u/gil.py:4)
"""


def test_the_stuck_threads_stack_is_its_innermost_frame_and_the_python_frame_that_called_it():
    frames = native_stack.stuck_thread(DUMP)
    assert native_stack.short_stack(frames) == "clock_nanosleep ← … ← stuck (gil.py:7)"
    marked = DUMP.replace('Thread 7009 (idle): "Thread-1 (beat)"', 'Thread 7009 (active+gil): "Thread-1 (beat)"')
    assert native_stack.short_stack(native_stack.stuck_thread(marked)) == "pthread_cond_timedwait ← … ← beat (gil.py:4)"
    assert native_stack.stuck_thread("nothing py-spy would print") is None
    assert stuck_words("S", "sleep ← … ← f (m.py:1)") == "stuck (alive, GIL held) in sleep ← … ← f (m.py:1)"
    assert stuck_words("T", "", 0.0) == "stuck (stopped by a signal)"
    assert stuck_words("D").startswith("stuck (alive, in uninterruptible I/O")
    assert stuck_words("R", "", 100.0) == "stuck (alive, GIL held, CPU 100%)"  # a spin in native code


def test_a_look_from_outside_sees_this_process_and_no_other_with_its_pid():
    mine = look(os.getpid())
    assert mine is not None and mine.state in "RS" and mine.cpu_s > 0
    assert look(os.getpid(), mine.started_ts) is not None
    assert look(os.getpid(), mine.started_ts - 3600) is None  # the pid reused by another process
    assert look(0) is None and look(2**22 + 7) is None


@pytest.mark.timeout(150)
async def test_a_rank_holding_the_gil_is_named_stuck_with_its_native_stack_and_never_dead(launch_agents):
    from ringtop.tui.app import RingtopApp
    from ringtop.tui.state.health import health_line

    if native_stack.py_spy() is None:
        pytest.skip("needs py-spy (the test extra) to read the stuck rank's stack")
    run = launch_agents(2, "--steps", "0", "--batch-size", "2", "--seq-len", "16", "--inject-hang", "1:4:gil-held")
    app = RingtopApp(publish_addr=run.publish, control_addr=run.control, keys=run.keys)
    async with app.run_test(size=(200, 40)) as pilot:
        v = app.view
        await eventually(pilot, lambda: _check(1 in v.ranks and v.ranks[1].step == 3), timeout_s=90)
        row = v.ranks[1]
        await eventually(pilot, lambda: _check("hang_holding_the_gil (faults.py:" in row.stuck), timeout_s=60)
        assert row.stuck.startswith("stuck (alive, GIL held, CPU 0%) in "), row.stuck  # asleep in libc
        deadline = time.monotonic() + 30
        while row.silent_s <= DEAD_AFTER_S + 3 * PROBE_EVERY_S:  # well past the silence rule's limit
            assert not row.dead, "a live rank holding the GIL was called dead"
            assert time.monotonic() < deadline
            await pilot.pause(0.1)
        assert not row.dead and not v.is_ended
        await repainted(pilot)
        assert "⏸ stalled: rank 1" in header_text(app)
        assert f"✖ rank 1 {row.stuck}" in health_line(v, time.monotonic()).plain
        await eventually(pilot, lambda: _check(any(e.kind == "hang" and e.rank == 0 for e in v.event_log.lines)),
                         timeout_s=30)
        hangs = [e.text for e in v.event_log.lines if e.kind == "hang"]
        assert not any("died" in t for t in hangs), hangs
        assert any(t.startswith("hang: rank 1 has not entered") for t in hangs), hangs


def _check(ok: bool) -> None:
    assert ok
