"""A real 2-rank gloo own loop under ringtop.Monitor (tests/helpers/own_loop_hang.py): a rank stuck in its
first steps is named within seconds of its peer entering the collective it has not entered, not
after the 60 s warm-up; every place a rank is reported is the script's own frame and phase."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from conftest import run_worker_script

from ringtop.metrics.rules import liveness
from ringtop.protocol import Event, Stall, read_log

TESTS = Path(__file__).resolve().parents[1]
SCRIPT = TESTS / "helpers" / "own_loop_hang.py"
OWN_FILES = re.compile(r"^(diagnosis_exchange|monitor|monitored_run|own_loop|runner|step_report|commands|stall_watch"
                       r"|collective_\w+)\.py:")


def marks() -> dict[str, int]:
    """`# mark:NAME` -> its line in the script."""
    lines = SCRIPT.read_text().splitlines()
    return {m.group(1): i for i, line in enumerate(lines, 1) if (m := re.search(r"# mark:(\w+)", line))}


@pytest.mark.timeout(150)
def test_an_own_loop_hung_in_its_first_forward_is_named_in_seconds_and_placed_in_its_own_frames(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGTOP_TEST_RUN_ID", uuid.uuid4().hex[:8])
    run_worker_script(SCRIPT, [], tmp_path, nproc=2, timeout_s=120)
    at = marks()
    logs = {r: read_log(tmp_path / "logs" / f"rank-{r}.jsonl") for r in (0, 1)}

    hangs = [m for m in logs[0] if isinstance(m, Event) and m.kind == "hang" and m.level == "error"]
    first = next((m for m in hangs if m.hang.step == 2), None)
    assert first is not None, "rank 0 named no hang at step 2: " + repr([m for m in logs[0] if isinstance(m, Event)])
    assert (first.hang.verdict, first.hang.culprits, first.hang.waiting) == ("hang", [1], [0])
    assert first.hang.collective == "all_reduce"
    # named while rank 0 had waited for seconds, far under the warm-up; the old rule waited 60 s
    assert 1.0 < first.hang.wait_s < 10.0 < liveness.WARMUP_S, first.hang
    assert f"rank 1 is in forward at own_loop_hang.py:{at['forward']} in forward" in first.text, first.text

    def reports(rank: int, step: int) -> list[Stall]:
        return [m for m in logs[rank] if isinstance(m, Stall) and m.step == step and m.state in ("stalled", "starting")]

    def placed(rank: int, step: int) -> tuple[str, str]:
        """(phase, where) of the rank's last report of the step, deep in its sleep or wait; none of its
        reports in ringtop's own files."""
        found = reports(rank, step)
        assert found, f"rank {rank} reported nothing at step {step}"
        assert not [m.where for m in found if OWN_FILES.search(m.where)], [m.where for m in found]
        return found[-1].phase, found[-1].where

    early = reports(1, 2)
    assert early and {m.state for m in early} == {"starting"}, "a start-up report, not a stall of its own"
    assert placed(1, 6) == ("data", f"own_loop_hang.py:{at['data']} in main")
    assert placed(0, 20)[1] == f"own_loop_hang.py:{at['step_end']} in main", "waiting in the diagnosis round"
    assert any("diagnosis_exchange.py" in f for f in reports(0, 20)[-1].stack), (
        "ringtop's own frames stay in the full stack, only the place is the script's"
    )
    assert placed(1, 20)[1] == f"own_loop_hang.py:{at['after']} in main"
