"""Waiting in UI tests: for a state, never for a fixed time.

A fixed pause before an assertion races with whatever produces the state (a socket's next
message, the app's repaint timer, a worker thread) and fails on a loaded or slower machine.
`eventually` re-runs the assertions until they hold or a generous deadline passes, so a failure
still shows the last assertion's own message; it costs no time when the state is already there."""

from __future__ import annotations

import time
from collections.abc import Callable


async def eventually(pilot, check: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Run `check` (a function that asserts) until it passes; re-raise its last failure at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            check()
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        await pilot.pause(0.05)


async def repainted(pilot) -> None:
    """Render the view model as it is now (what the app's repaint timer does), then let Textual
    process what that posted: for data already loaded (a replay), instead of waiting for a tick."""
    pilot.app.refresh_view()
    await pilot.pause()
