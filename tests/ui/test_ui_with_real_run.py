"""The real Textual app, driven by a Pilot, fed by a real 2-rank gloo run over ZeroMQ."""

from __future__ import annotations

import time

import msgspec
import pytest
from conftest import start_agents, stop_process_group
from textual.widgets import DataTable

from ringtop.protocol import curve
from ringtop.tui.app import RingtopApp

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    """One 2-rank run training until stopped, for both tests: neither stops it or reads its start."""
    run = start_agents(tmp_path_factory.mktemp("live"), 2, "--steps", "0", "--batch-size", "4", "--seq-len", "32")
    yield run
    stop_process_group(run.proc)


async def wait_until(pilot, predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        await pilot.pause(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def row_steps(app: RingtopApp) -> dict[int, int]:
    return {rank: row.step for rank, row in app.view.ranks.items()}


async def test_rows_for_both_ranks_appear_update_and_a_checkpoint_round_trips(live_run):
    run = live_run
    keys = run.keys
    app = RingtopApp(publish_addr=run.publish, control_addr=run.control, keys=keys)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_until(pilot, lambda: set(app.view.ranks) == {0, 1} and min(row_steps(app).values()) > 0,
                         90, "step rows for ranks 0 and 1")
        first = row_steps(app)
        await wait_until(pilot, lambda: all(row_steps(app)[r] > first[r] + 2 for r in (0, 1)), 60,
                         "rows to update")
        table = app.query_one("#ranks", DataTable)
        assert table.row_count == 2
        assert app.view.state == "live"

        await pilot.press("c")
        await wait_until(pilot, lambda: (run.checkpoint_dir / "latest").exists(), 60, "the checkpoint file")
        await wait_until(pilot, lambda: any("done" in e.text and "checkpoint" in e.text for e in app.view.events),
                         30, "the checkpoint's done reply in the event log")

    run_id = app.view.facts.run_id
    assert run_id and app.view.facts.world_size == 2

    # The UI has quit; the agents go on training, and a new UI re-attaches with the run's facts.
    before = max(s.step for s in run.steps(0))
    run.wait_for_step(before + 3)
    assert run.proc.poll() is None
    again = RingtopApp(publish_addr=run.publish, control_addr=run.control, keys=keys)
    async with again.run_test(size=(140, 40)) as pilot:
        await wait_until(pilot, lambda: again.view.facts.run_id == run_id and set(again.view.ranks) == {0, 1},
                         60, "the re-attached UI to learn the run's facts and both ranks")
        assert again.view.facts.world_size == 2 and again.view.facts.strategy == "ddp"


async def test_a_ui_without_the_runs_keys_gets_nothing_and_says_why(live_run):
    run = live_run
    run.wait_for_step(1)
    other_run = curve.generate().client
    stolen_server_key = msgspec.structs.replace(other_run, server_public=run.keys.server_public)
    for keys, reason in ((None, "requires its keys"), (other_run, "key does not match"),
                         (stolen_server_key, "refused this client's key")):
        app = RingtopApp(publish_addr=run.publish, control_addr=run.control, keys=keys)
        async with app.run_test(size=(160, 40)) as pilot:
            def says(app=app, reason=reason) -> bool:
                return reason in app.header_text().plain
            await wait_until(pilot, says, 30, f"the header to say {reason!r}")
            assert "refuses this UI" in app.header_text().plain
            assert not app.view.ranks and not app.view.facts.run_id, "nothing of the run reached this UI"
    assert run.proc.poll() is None, "the run trains on"
