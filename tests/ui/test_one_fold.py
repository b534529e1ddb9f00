"""One fold of the messages (metrics/run_state), read by the three surfaces that show a run: the UI's
view, the Prometheus exporter and `summary`. Each is fed the same logs as it is in use (the view and
the exporter every message in time order, `summary` the log folder) and read through what it shows:
the view's rows, lifecycle, goodput, restart and hang verdict; the exporter's scrape; `summary`'s
rows, lines and goodput. On the recorded runs (tests/data/numbers_run/) and on a run written here
that restarts after a crash and stalls in its second attempt, every figure agrees; an exporter with
a stall rule of its own (a stall ends only when the rank says so) fails the same comparison."""

from __future__ import annotations

import math
from pathlib import Path

import hang_scenario as hs
import msgspec
import pytest

from ringtop.agent.prometheus.exporter import RunMetrics
from ringtop.cli import summary
from ringtop.metrics.run_lifecycle import FINAL
from ringtop.metrics.run_state import RunState
from ringtop.protocol import Bye, Event, HangReport, Hello, Stall, Step, to_json_line
from ringtop.protocol.run_logs import rank_logs
from ringtop.tui.state.view_model import RunView

RUNS_DIR = Path(__file__).parents[1] / "data" / "numbers_run"
T0 = 1_780_000_000.0
CRASH = "error: RuntimeError: injected crash"


def merged(log_dir: Path) -> list:
    """Every rank's logged messages in time order (each rank's own order kept), as the relay passes them."""
    return sorted((m for _, messages in rank_logs(log_dir) for m in messages), key=lambda m: m.ts)


def write_logs(log_dir: Path, msgs: list) -> Path:
    log_dir.mkdir()
    for rank in sorted({m.rank for m in msgs}):
        (log_dir / f"rank-{rank}.jsonl").write_bytes(b"".join(to_json_line(m) for m in msgs if m.rank == rank))
    return log_dir


def ui_reads(log_dir: Path) -> dict:
    view = RunView(watch_liveness=False)
    for m in merged(log_dir):
        view.apply(m, now=m.ts)
    life, good, verdict = view.lifecycle(), view.goodput.result(), view.hang_verdict()
    return {
        "step": {r.rank: r.step for r in view.rows()},
        "step_ms": {r.rank: r.step_ms for r in view.rows()},
        "window_step_ms": {r.rank: r.recent_step_ms() for r in view.rows()},
        "loss": {r.rank: r.loss for r in view.rows()},
        "exposed_comm_s": {r.rank: r.exposed_comm_ms_total / 1e3 for r in view.rows()},
        "up": {r.rank: not (r.ended or r.dead) for r in view.rows()},
        "exit": {r.rank: r.bye_reason for r in view.rows() if r.ended},
        "lifecycle": (life.state, life.words),
        "goodput": (good.goodput, good.productive_s, good.wall_s) if good.known else None,
        "restarts": view.restart.count,
        "stalled": sorted(rank for rank, s in view.hang.stalled.items() if s.state == "stalled"),
        "culprits": sorted(verdict.culprits) if verdict is not None else [],
    }


def scrape(metrics: RunMetrics) -> dict[str, dict]:
    """name -> {rank (or the run's labels): value}."""
    out: dict[str, dict] = {}
    for family in metrics.collect():
        for s in family.samples:
            key = int(s.labels["rank"]) if "rank" in s.labels else s.labels.get("state") or s.labels.get("cause", "")
            out.setdefault(s.name, {})[key] = s.value
    return out


def exporter_reads(log_dir: Path, state: RunState | None = None) -> dict:
    metrics = RunMetrics(clock=lambda: T0)
    if state is not None:
        metrics._state = state  # a fold with a rule of its own, to show the comparison bites
    for m in merged(log_dir):
        metrics.observe(m)
    got = scrape(metrics)
    assert metrics.errors == 0
    return {
        "step": {r: int(v) for r, v in got.get("ringtop_step", {}).items()},
        "step_ms": {r: v * 1e3 for r, v in got.get("ringtop_step_seconds", {}).items()},
        "exposed_comm_s": got["ringtop_exposed_comm_seconds_total"],
        "up": {r: v == 1.0 for r, v in got["ringtop_up"].items()},
        "lifecycle": next(state for state, v in got["ringtop_run_state"].items() if v == 1.0),
        "goodput": (got["ringtop_goodput_ratio"][""], got["ringtop_goodput_productive_seconds_total"][""],
                    got["ringtop_goodput_wall_seconds_total"][""]) if "ringtop_goodput_ratio" in got else None,
        "stalled": sorted(r for r, v in got["ringtop_stalled"].items() if v == 1.0),
        "rank0_culprits": sorted(r for r, v in got["ringtop_hang_culprit"].items() if v == 1.0),
    }


def summary_reads(log_dir: Path) -> dict:
    rows = {row["rank"]: row for row in summary.summarize(log_dir)}
    state = summary.run_state(log_dir)
    life, good = summary.lifecycle_of_logs(log_dir), summary.goodput(log_dir)
    episodes = summary.stall_episodes(log_dir)
    open_episodes = [e for e in episodes if e.end_ts is None]
    restarts = summary.restart_lines(log_dir)
    return {
        "step": {r: row["steps"] for r, row in rows.items()},
        "window_step_ms": {r: s.recent_step_ms() for r, s in state.ranks.items() if s.timed_steps},
        "loss": {r: row["last_loss"] for r, row in rows.items()},
        "exposed_comm_pct": {r: row["exposed_comm_pct"] for r, row in rows.items()},
        "exit": {r: row["exit"] for r, row in rows.items() if not row["exit"].startswith("no bye")},
        "lifecycle": (life.state, life.words),
        "goodput": (good.goodput, good.productive_s, good.wall_s) if good.known else None,
        "restarts": int(restarts[0].split(": ")[1]) if restarts else 0,
        "stalled": sorted(open_episodes[-1].ranks) if open_episodes else [],
        "culprits": sorted(episodes[-1].verdict.culprits) if open_episodes and episodes[-1].verdict else [],
    }


def same(a, b) -> bool:
    """Equal, NaN equal to NaN (a loss that was not finite), floats to their rounding."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-9)
    return a == b


def agree(log_dir: Path, exporter_state: RunState | None = None) -> None:
    """Every figure two surfaces both show is the same; the exporter's exposed counter is the
    share `summary` prints, of the step time the view's rows hold. The lifecycle of a run still
    going is read with what each surface knows (the UI's stalled ranks by its own clock, the
    exporter's stall reports; to `summary` the end of a log is its rank's end): it is compared once
    the run is over."""
    ui, prom, cli = ui_reads(log_dir), exporter_reads(log_dir, exporter_state), summary_reads(log_dir)
    for name in ("step", "step_ms", "exposed_comm_s", "up", "goodput", "stalled"):
        assert same(ui[name], prom[name]), (name, ui[name], prom[name])
    for name in ("step", "window_step_ms", "loss", "exit", "goodput", "restarts", "stalled", "culprits"):
        assert same(ui[name], cli[name]), (name, ui[name], cli[name])
    if ui["lifecycle"][0] in FINAL:
        assert ui["lifecycle"][0] == prom["lifecycle"], (ui["lifecycle"], prom["lifecycle"])
        assert ui["lifecycle"] == cli["lifecycle"], (ui["lifecycle"], cli["lifecycle"])
    view = RunView(watch_liveness=False)
    for m in merged(log_dir):
        view.apply(m, now=m.ts)
    shares = {r.rank: 100 * r.exposed_comm_ms_total / r.step_ms_total for r in view.rows() if r.timed_steps}
    assert same(shares, cli["exposed_comm_pct"])


@pytest.mark.parametrize("name", ["ddp", "pp", "zero1", "fsdp-grad-op"])
def test_the_three_surfaces_read_one_fold_of_a_recorded_run(name):
    agree(RUNS_DIR / name)


# ---------------------------------------------------------------------- a restarted run that stalls


def hello(rank: int, attempt: int) -> Hello:
    return Hello(rank=rank, seq=0, ts=T0 + 30 * attempt + rank * 0.01, run_id="fold0001", world_size=2,
                 host=f"node-{rank}", pid=1000 * (attempt + 1) + rank, strategy="ddp", restart_count=attempt,
                 max_restarts=1, start_step=2 * attempt)


def step(rank: int, n: int, seq: int, attempt: int) -> Step:
    return Step(rank=rank, seq=seq, ts=T0 + 30 * attempt + 1 + n * 0.5 + rank * 0.01, step=n, step_ms=100.0 + rank + n,
                loss=3.0 - 0.1 * n, exposed_comm_ms=5.0 + rank, data_ms=1.0)


def stall(rank: int, seq: int, ts: float, done: int) -> Stall:
    """Rank 1 in its forward, rank 0 in the step's first all-reduce, waiting for it (hang_scenario's)."""
    return msgspec.structs.replace(hs.stall(rank, seq, culprit=1, done=done), ts=ts)


def restarted_run(until: str = "end") -> list:
    """Attempt 0: rank 1 crashes after step 4 (its peer is stopped by the launcher); attempt 1 resumes
    at step 3, both ranks stall in step 6 (rank 1 in its forward), rank 0 says rank 1 holds it up,
    then (`until` past `stall`) they step on without a `recovered`, and (`end`) complete."""
    msgs = [hello(0, 0), hello(1, 0)]
    for n in range(1, 5):
        msgs += [step(0, n, n, 0), step(1, n, n, 0)]
    msgs += [Bye(rank=1, seq=5, ts=T0 + 4, reason=CRASH, ok=False, step=4),
             Bye(rank=0, seq=5, ts=T0 + 4.5, reason="interrupted: SIGTERM", ok=False, step=4)]
    msgs += [hello(0, 1), hello(1, 1)]
    for n in range(3, 6):
        msgs += [step(0, n, n, 1), step(1, n, n, 1)]
    msgs += [stall(0, 6, T0 + 40, 5), stall(1, 6, T0 + 40.1, 5),
             Event(rank=0, seq=7, ts=T0 + 41, level="error", kind="hang", text="rank 1 holds up rank 0", step=6,
                   hang=HangReport(verdict="hang", culprits=[1], waiting=[0], group="world", step=6))]
    if until == "stall":
        return msgs
    msgs += [step(0, 6, 8, 2), step(1, 6, 7, 2)]
    if until == "stepping":
        return msgs
    return msgs + [Bye(rank=r, seq=9, ts=T0 + 70, reason="completed 6 steps", step=6) for r in (0, 1)]


@pytest.mark.parametrize("until", ["stall", "stepping", "end"])
def test_the_three_surfaces_read_one_fold_of_a_restarted_run_that_stalls(tmp_path, until):
    logs = write_logs(tmp_path / until, restarted_run(until))
    agree(logs)
    ui, prom, cli = ui_reads(logs), exporter_reads(logs), summary_reads(logs)
    assert ui["restarts"] == cli["restarts"] == 1
    assert summary.restart_lines(logs)[1].endswith(f"after rank 1: {CRASH}")
    if until == "stall":
        assert ui["culprits"] == cli["culprits"] == prom["rank0_culprits"] == [1]
        assert ui["stalled"] == prom["stalled"] == [0, 1]
    else:
        assert ui["stalled"] == prom["stalled"] == cli["stalled"] == []
    if until == "end":
        assert ui["lifecycle"] == cli["lifecycle"] == ("ended", "completed 6 steps") and prom["lifecycle"] == "ended"


class StallsEndOnlyWhenSaid(RunState):
    """The exporter's own rule before the one fold: a stall ends with a `recovered` or a Bye, not
    with the step the rank was stuck in."""

    def _on_step(self, row, msg, now):
        row.take_step(msg, now)
        if msg.step > row.folded_step:
            row.fold_step(msg.step, msg.step_ms)
            row.count_step(msg)


def test_a_surface_with_a_rule_of_its_own_fails_the_comparison(tmp_path):
    logs = write_logs(tmp_path / "stepping", restarted_run("stepping"))
    agree(logs)
    with pytest.raises(AssertionError, match="stalled"):
        agree(logs, exporter_state=StallsEndOnlyWhenSaid())
    assert exporter_reads(logs, StallsEndOnlyWhenSaid())["lifecycle"] == "stalled"
    assert exporter_reads(logs)["lifecycle"] == ui_reads(logs)["lifecycle"][0] == "live"
