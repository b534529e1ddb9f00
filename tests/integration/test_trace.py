"""`ringtop trace`: a real 2-rank run (profiled, checkpointed, its ledger dumped) turned into one
timeline by the real CLI, read back with plain `json` and checked against the Trace Event Format
and against the logs; the layout's pure functions alone; and checks that bite."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import agent_env, poll_until, start_agents, stop_process_group

from ringtop.metrics import trace_events as te
from ringtop.protocol import Event, Hello, InFlight, Stall, Step, Timeline, to_json_line

pytestmark = pytest.mark.timeout(240)

RUN_ARGS = os.environ.get("TRACE_RUN_ARGS", "--strategy pp --micro-batches 2").split()
"""A 2-stage pipeline: micro-batches, collectives (the gradient norm's) and point-to-point in one run."""
PHASES = {"data", "forward", "backward", "optimizer"}
US_TOL = 0.002  # the file's µs are rounded to the nanosecond


def ringtop(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringtop.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout_s, env=agent_env())


def format_errors(doc: dict) -> list[str]:
    """What breaks the Trace Event Format's JSON object form (as Perfetto reads it), checked here
    independently of the writer."""
    errors = []
    if not isinstance(doc.get("traceEvents"), list):
        return ["no traceEvents list"]
    if doc.get("displayTimeUnit") not in ("ms", "ns"):
        errors.append("displayTimeUnit is not ms or ns")
    for i, e in enumerate(doc["traceEvents"]):
        ph = e.get("ph")
        if ph not in ("X", "i", "M"):
            errors.append(f"event {i}: phase {ph!r}")
            continue
        if not isinstance(e.get("name"), str) or not isinstance(e.get("pid"), int):
            errors.append(f"event {i}: no name or integer pid")
        if ph == "M":
            continue
        if not isinstance(e.get("tid"), int) or not isinstance(e.get("ts"), (int, float)):
            errors.append(f"event {i}: no tid or ts")
        if ph == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            errors.append(f"event {i}: X without a duration >= 0")
        if ph == "i" and e.get("s", "t") not in ("t", "p", "g"):
            errors.append(f"event {i}: instant of scope {e.get('s')!r}")
    return errors


def nesting_errors(events: list[dict]) -> list[str]:
    """On each thread, the X events must nest (Perfetto drops or misdraws partial overlaps), and
    each phase must lie inside a step."""
    errors = []
    tracks: dict[tuple[int, int], list[dict]] = {}
    for e in events:
        if e.get("ph") == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for key, spans in tracks.items():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ends: list[tuple[float, dict]] = []
        for e in spans:
            while open_ends and open_ends[-1][0] <= e["ts"] + US_TOL:
                open_ends.pop()
            if open_ends and e["ts"] + e["dur"] > open_ends[-1][0] + US_TOL:
                errors.append(f"track {key}: {e['name']} at {e['ts']} overlaps {open_ends[-1][1]['name']}")
            if e["name"] in PHASES and not (open_ends and open_ends[0][1]["name"].startswith("step ")):
                errors.append(f"track {key}: phase {e['name']} at {e['ts']} outside any step")
            open_ends.append((e["ts"] + e["dur"], e))
    return errors


def steps_by_track(doc: dict) -> dict[tuple[int, int], dict]:
    """(rank, step) -> the step's X event, the rank read from its track's name."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    out = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["name"].startswith("step "):
            label = names[(e["pid"], e["tid"])]
            out[(int(label.split()[1]), int(e["name"].split()[1]))] = e
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A real 2-rank gloo run (RUN_ARGS): a few steps, a 2-step profile, a checkpoint and a ledger dump."""
    run = start_agents(tmp_path_factory.mktemp("trace-run"), 2, "--steps", "0", "--batch-size", "4", *RUN_ARGS,
                       "--seq-len", "32")
    try:
        run.wait_for_step(2)
        assert list(run.send_command("profile", {"steps": 2}, timeout_s=120))[-1].status == "done"
        assert list(run.send_command("checkpoint", {"kind": "full"}, timeout_s=120))[-1].status == "done"
        assert list(run.send_command("dump", {}, timeout_s=60))[-1].status == "done"
        poll_until(lambda: len(list((run.log_dir / "dumps").glob("ledger-rank-*.json"))) == 2, 60, "ledger dumps")
        assert list(run.send_command("stop", {}, timeout_s=60))[-1].status == "done"
        assert run.wait(60) == 0, run.output()[-3000:]
    finally:
        stop_process_group(run.proc)
    return run.log_dir


@pytest.fixture(scope="module")
def traced(recorded, tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("trace-out") / "run.json"
    result = ringtop("trace", str(recorded), "-o", str(out))
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text()), recorded


def test_trace_of_a_real_run_is_well_formed_and_holds_the_logged_durations(traced):
    doc, log_dir = traced
    assert format_errors(doc) == []
    assert nesting_errors(doc["traceEvents"]) == []
    steps = steps_by_track(doc)
    for rank in (0, 1):
        logged = [m for m in _read(log_dir / f"rank-{rank}.jsonl") if isinstance(m, Step)]
        assert len(logged) >= 4
        for s in logged:
            e = steps[(rank, s.step)]
            assert math.isclose(e["dur"], s.step_ms * 1e3, abs_tol=US_TOL), (rank, s.step)
            phases = [p for p in doc["traceEvents"] if p["ph"] == "X" and p["name"] in PHASES
                      and (p["pid"], p["tid"]) == (e["pid"], e["tid"]) and p["args"]["step"] == s.step]
            logged_ms = {"data": s.data_ms, "forward": s.forward_ms, "backward": s.backward_ms,
                         "optimizer": s.optimizer_ms}
            assert {p["name"] for p in phases} == {n for n, ms in logged_ms.items() if ms > 0}
            assert sum(p["dur"] for p in phases) <= e["dur"] + US_TOL
            fwd = next(p for p in phases if p["name"] == "forward")
            assert math.isclose(fwd["dur"], s.forward_ms * 1e3, abs_tol=US_TOL)
    # one host: both ranks under one process, on tracks of their own
    assert len({e["pid"] for e in steps.values()}) == 1 and len({e["tid"] for e in steps.values()}) >= 2


def test_trace_has_the_runs_events_collectives_and_profiles(traced):
    doc, log_dir = traced
    events = doc["traceEvents"]
    instants = [e for e in events if e["ph"] == "i"]
    logged = [m for m in _read(log_dir / "rank-0.jsonl") if isinstance(m, Event) and m.kind == "checkpoint"]
    assert logged and any(e["name"] == logged[-1].text for e in instants), "the checkpoint, in the user's words"
    ledger = json.loads((log_dir / "dumps" / "ledger-rank-1.json").read_text())["collectives"]
    comm = [e for e in events if e["ph"] == "X" and e.get("cat") == "collective"]
    assert comm and {e["args"]["seq"] for e in comm} >= {c["seq"] for c in ledger if c["group"] == ledger[-1]["group"]
                                                         and c["done_ns"]}
    assert all("group" in e["args"] and "bytes" in e["args"] for e in comm)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    drawn = {(e["args"]["group"], e["args"]["seq"]): e for e in comm
             if names[(e["pid"], e["tid"])].startswith("rank 1 ")}
    for c in (c for c in ledger if c["done_ns"]):
        e = drawn[(c["group"], c["seq"])]
        assert e["name"] == c["kind"] and e["args"]["bytes"] == c["nbytes"]
        assert math.isclose(e["dur"], (c["done_ns"] - c["issued_ns"]) / 1e3, abs_tol=US_TOL)
    profiled = [e for e in events if e["ph"] == "X" and e["name"].startswith("ProfilerStep#")]
    assert len(profiled) >= 2
    steps = steps_by_track(doc)
    for p in profiled:
        rank = int(names[(p["pid"], p["tid"])].split()[1])
        step = steps[(rank, int(p["name"].split("#")[1]))]
        # shifted onto the run's clock (the profiler's own is another): the profiled span (the
        # training step without its data loading) lies in its logged step, but for the jitter of
        # the step's publication (its `ts`) after its end: up to 10 ms of 55-80 ms steps measured
        # on this loaded 2-core machine, so at least half of the span is asked for
        overlap_us = min(p["ts"] + p["dur"], step["ts"] + step["dur"]) - max(p["ts"], step["ts"])
        assert overlap_us >= 0.5 * p["dur"], (p, step)


def test_trace_has_every_logged_micro_batch_inside_its_step(traced):
    doc, log_dir = traced
    steps = steps_by_track(doc)
    drawn = [e for e in doc["traceEvents"] if e.get("cat") == "pipeline"]
    logged = 0
    for rank in (0, 1):
        for t in (m for m in _read(log_dir / f"rank-{rank}.jsonl") if isinstance(m, Timeline)):
            step = steps[(rank, t.step)]
            mine = [e for e in drawn if e["args"]["step"] == t.step and e["args"]["stage"] == t.stage]
            assert sorted(e["dur"] for e in mine) == pytest.approx(
                sorted((sp.end_ms - sp.start_ms) * 1e3 for sp in t.spans), abs=US_TOL)
            for e in mine:
                assert step["ts"] - US_TOL <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + US_TOL
            logged += len(t.spans)
    assert logged > 0 and len(drawn) == logged


def logged_calls(log_dir: Path, rank: int) -> list[dict]:
    """The rank's `calls` lines, read with plain `json` as a client written from the protocol's
    README would: each call an array [kind, group, seq, bytes, issued_ms, done_ms, wait_start_ms,
    wait_end_ms, device]."""
    lines = (log_dir / f"rank-{rank}.jsonl").read_bytes().splitlines()
    return [m for m in map(json.loads, lines) if m.get("type") == "calls"]


def call_errors(doc: dict, calls: dict[int, list[dict]]) -> list[str]:
    """Against the logged `calls`: one wait span per logged wait and no other, inside its step, at
    its offset from the step's start, of its logged duration, with its kind, group, seq and bytes;
    and each completed collective's span from its issue to its completion."""
    events, steps = doc["traceEvents"], steps_by_track(doc)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    drawn: dict[tuple[str, int, str, int], list[dict]] = {}
    for e in events:
        if e["ph"] == "X" and e.get("cat") in ("collective", "collective wait"):
            label = names[(e["pid"], e["tid"])]
            key = (e["cat"], int(label.split()[1]), e["args"]["group"], e["args"]["seq"])
            drawn.setdefault(key, []).append(e)
    errors = []
    for rank, messages in calls.items():
        for m in messages:
            step = steps.get((rank, m["step"]))
            for kind, group, seq, nbytes, issued_ms, done_ms, wait_start_ms, wait_end_ms, _device in m["calls"]:
                where = f"rank {rank} step {m['step']} {kind} #{seq} on {group}"
                expected = [("collective", kind, issued_ms, done_ms)] if done_ms is not None else []
                if wait_start_ms is not None:
                    expected.append(("collective wait", f"{kind} wait", wait_start_ms, wait_end_ms))
                for cat, name, start_ms, end_ms in expected:
                    found = drawn.pop((cat, rank, group, seq), [])
                    if cat == "collective wait" and len(found) != 1:
                        errors.append(f"{where}: {len(found)} wait spans")
                    if not found or step is None:
                        errors.append(f"{where}: no {cat} span" if not found else f"{where}: its step is not drawn")
                        continue
                    e = found[0]
                    if e["name"] != name or e["args"]["bytes"] != nbytes:
                        errors.append(f"{where}: drawn as {e['name']} of {e['args']['bytes']} bytes")
                    if not math.isclose(e["dur"], (end_ms - start_ms) * 1e3, abs_tol=US_TOL):
                        errors.append(f"{where}: {cat} of {e['dur']} µs, logged {(end_ms - start_ms) * 1e3}")
                    if not math.isclose(e["ts"] - step["ts"], start_ms * 1e3, abs_tol=2 * US_TOL):
                        errors.append(f"{where}: {cat} at {e['ts'] - step['ts']} µs into its step, logged "
                                      f"{start_ms * 1e3}")
                    if not (step["ts"] - US_TOL <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + US_TOL):
                        errors.append(f"{where}: {cat} outside its step")
    errors += [f"{key}: drawn, not logged" for key in drawn if key[0] == "collective wait"]
    return errors


def test_trace_has_each_logged_collective_and_its_wait_inside_its_step(traced):
    """The pipeline waits for every transfer it posts and for the gradient norm's all-reduces, so
    every collective this run logged has a wait; each is drawn once, as logged."""
    doc, log_dir = traced
    calls = {rank: logged_calls(log_dir, rank) for rank in (0, 1)}
    assert all(calls.values()), "every rank logs its collectives"
    listed = [c for messages in calls.values() for m in messages for c in m["calls"]]
    assert {c[1] for c in listed} >= {"p2p", "world"} and all(c[6] is not None for c in listed)
    assert not any(m["dropped"] for messages in calls.values() for m in messages)
    assert call_errors(doc, calls) == []
    assert len([e for e in doc["traceEvents"] if e.get("cat") == "collective wait"]) == len(listed)


def test_the_collective_checks_bite_on_a_shifted_a_missing_and_a_stretched_wait(traced):
    doc, log_dir = traced
    calls = {rank: logged_calls(log_dir, rank) for rank in (0, 1)}
    waits = [i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "collective wait"]
    for damage, said in ((lambda e: dict(e, ts=e["ts"] + 500.0), "into its step"),
                         (lambda e: dict(e, dur=e["dur"] * 1.5 + 1.0), "logged"),
                         (lambda e: None, "0 wait spans"),
                         (lambda e: dict(e, args=dict(e["args"], bytes=e["args"]["bytes"] + 1)), "bytes")):
        events = list(doc["traceEvents"])
        events[waits[len(waits) // 2]] = damage(events[waits[len(waits) // 2]])
        errors = call_errors(dict(doc, traceEvents=[e for e in events if e is not None]), calls)
        assert any(said in err for err in errors), (said, errors[:3])


def test_from_to_selects_steps(recorded, tmp_path):
    out = tmp_path / "part.json"
    result = ringtop("trace", str(recorded), "-o", str(out), "--from", "2", "--to", "3")
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert format_errors(doc) == [] and nesting_errors(doc["traceEvents"]) == []
    assert sorted(steps_by_track(doc)) == [(0, 2), (0, 3), (1, 2), (1, 3)]
    bad = ringtop("trace", str(recorded), "--from", "5", "--to", "2")
    assert bad.returncode == 2 and "--from 5 is after --to 2" in bad.stderr


def test_the_checks_bite_on_a_shifted_phase_and_a_negative_duration():
    step = te.complete("step 1", "step", 0.0, 100.0, 1, 0)
    phase = te.complete("forward", "phase", 50.0, 40.0, 1, 0)
    assert nesting_errors([step, phase]) == []
    shifted = dict(phase, ts=80.0)
    assert nesting_errors([step, shifted]) and "overlaps" in nesting_errors([step, shifted])[0]
    assert "outside any step" in nesting_errors([dict(phase, ts=200.0)])[0]
    assert format_errors({"traceEvents": [dict(step, dur=-1.0)], "displayTimeUnit": "ms"})
    assert format_errors({"traceEvents": [{k: v for k, v in step.items() if k != "dur"}], "displayTimeUnit": "ms"})


@pytest.mark.parametrize("step_ms, phases, expect", [
    (100.0, {"data": 10, "forward": 30, "backward": 40, "optimizer": 10}, [10, 30, 40, 10]),
    (50.0, {"data": 20, "forward": 20, "backward": 20, "optimizer": 0}, [50 / 3, 50 / 3, 50 / 3]),  # scaled to fit
])
def test_step_spans_end_at_the_step_end_and_nest(step_ms, phases, expect):
    spans = te.step_spans(1e6, step_ms, phases)
    assert spans[0] == ("step", pytest.approx(1e6 - step_ms * 1e3), pytest.approx(step_ms * 1e3))
    assert [d / 1e3 for _, _, d in spans[1:]] == pytest.approx(expect)
    _, last_start, last_us = spans[-1]
    assert last_start + last_us == pytest.approx(1e6)
    for (_, a, da), (_, b, _) in zip(spans[1:], spans[2:]):
        assert a + da == pytest.approx(b, abs=0.002)
    assert spans[1][1] >= spans[0][1]


def test_host_offsets_align_a_skewed_host():
    ends = {"a": {s: 100.0 + s for s in range(1, 6)}, "b": {s: 100.0 + s + 2.5 for s in range(1, 6)},
            "c": {99: 5.0}}
    offsets = te.host_offsets_s(ends)
    assert offsets["a"] == 0.0 and offsets["b"] == pytest.approx(2.5) and offsets["c"] == 0.0
    assert te.host_offsets_s({"a": {1: 3.0}}) == {"a": 0.0}


def test_two_hosts_get_a_process_each_and_their_clocks_aligned(tmp_path):
    """Generated logs (two hosts, host b's clock 3 s ahead): the steps of both meet on one clock,
    and with --clock wall they stay apart."""
    for rank, host, skew in ((0, "node-a", 0.0), (1, "node-b", 3.0)):
        lines = [to_json_line(Hello(rank=rank, ts=1000.0 + skew, run_id="r", world_size=2, host=host))]
        for s in range(1, 6):
            lines.append(to_json_line(Step(rank=rank, ts=1000.0 + s * 0.1 + skew, step=s, loss=1.0, step_ms=90.0,
                                           forward_ms=30.0, backward_ms=40.0)))
        (tmp_path / f"rank-{rank}.jsonl").write_bytes(b"".join(lines))
    for clock, apart_us in (("steps", 0.0), ("wall", 3e6)):
        out = tmp_path / f"{clock}.json"
        assert ringtop("trace", str(tmp_path), "-o", str(out), "--clock", clock).returncode == 0
        doc = json.loads(out.read_text())
        steps = steps_by_track(doc)
        assert len({steps[(r, 1)]["pid"] for r in (0, 1)}) == 2
        assert steps[(1, 3)]["ts"] - steps[(0, 3)]["ts"] == pytest.approx(apart_us, abs=1.0)
        hosts = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
        assert {"host node-a", "host node-b"} <= hosts


def test_a_stall_and_a_verdict_are_drawn_with_the_collective_in_flight(tmp_path):
    """Generated logs: a rank stalled in backward with an all_reduce 0.5 s in flight, then a
    straggler verdict: instants named in the run's words, the collective ending at the stall."""
    verdict = {"rule": "straggler", "rank": 1, "text": "rank 1 is a straggler", "advice": "look at rank 1"}
    lines = [to_json_line(Hello(rank=0, ts=99.0, run_id="r", world_size=2, host="node-a")),
             to_json_line(Step(rank=0, ts=100.0, step=1, loss=1.0, step_ms=90.0, forward_ms=30.0)),
             to_json_line(Stall(rank=0, ts=101.0, step=2, phase="backward", state="stalled", running_s=1.0,
                                in_flight=[InFlight(group="world", seq=7, kind="all_reduce", bytes=1024,
                                                    age_s=0.5)])),
             to_json_line(Event(rank=0, ts=102.0, kind="diagnosis", level="warn", step=2,
                                text="diagnosis: rank 1 is a straggler", data={"verdicts": [verdict]})),
             to_json_line(Step(rank=0, ts=103.0, step=2, loss=1.0, step_ms=2990.0, forward_ms=30.0))]
    (tmp_path / "rank-0.jsonl").write_bytes(b"".join(lines))
    out = tmp_path / "t.json"
    assert ringtop("trace", str(tmp_path), "-o", str(out)).returncode == 0
    doc = json.loads(out.read_text())
    assert format_errors(doc) == [] and nesting_errors(doc["traceEvents"]) == []
    by_name = {e["name"]: e for e in doc["traceEvents"] if e["ph"] in ("X", "i")}
    stall, flight = by_name["stalled in backward"], by_name["all_reduce (in flight)"]
    assert flight["args"]["seq"] == 7 and flight["args"]["group"] == "world" and flight["args"]["bytes"] == 1024
    assert flight["dur"] == pytest.approx(0.5e6) and flight["ts"] + flight["dur"] == pytest.approx(stall["ts"])
    assert by_name["rank 1 is a straggler"]["ts"] - by_name["step 1"]["ts"] == pytest.approx(2.09e6)
    assert "diagnosis: rank 1 is a straggler" in by_name
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert tracks[(flight["pid"], flight["tid"])] == "rank 0 communication"


def test_profiler_shift_puts_each_span_inside_its_step():
    # steps [0, 100] and [100, 180]; the profiler's spans [1000, 1090], [1100, 1160] on its own clock
    pairs = [(0.0, 100.0, 1000.0, 1090.0), (100.0, 180.0, 1100.0, 1160.0)]
    shift = te.profiler_shift_us(pairs)
    assert shift == -990.0  # the tighter step's end; the other span is inside its step too
    assert all(ss <= ps + shift and pe + shift <= se for ss, se, ps, pe in pairs)
    # aligning the ends by their median would push the first span past its step (the check bites)
    median_end = statistics.median(se - pe for ss, se, ps, pe in pairs)
    assert not all(pe + median_end <= se for ss, se, ps, pe in pairs)
    jitter = [(0.0, 100.0, 0.0, 100.0), (200.0, 300.0, 190.0, 290.0)]  # no shift fits both: spill least
    assert te.profiler_shift_us(jitter) == 5.0 and te.profiler_shift_us([]) == 0.0


def test_lanes_split_overlaps_and_keep_nested_or_disjoint_spans_together():
    lanes = te.Lanes(3)
    assert [lanes.place(a, b) for a, b in ((0, 10), (10, 20), (5, 15), (6, 7), (30, 40))] == [0, 0, 1, 2, 0]
    nesting = te.NestingLanes()
    # (start, -dur) order: a parent, its child, a partial overlap of the parent, after both
    assert [nesting.place(a, b) for a, b in ((0, 10), (2, 5), (8, 12), (12, 13))] == [0, 0, 1, 0]


def test_lanes_hold_only_recent_spans_however_long_the_run():
    """A rank's collectives over 10,000 steps of 100 ms (two overlapping a step): the tracks keep
    what can still overlap a span to come, and place as before."""
    lanes = te.Lanes(3)
    placed = []
    for step in range(10_000):
        t = step * 100_000.0
        placed += [lanes.place(t, t + 40_000), lanes.place(t + 10_000, t + 60_000)]
    assert placed[-2:] == [0, 1] and set(placed) == {0, 1}
    horizon_steps = te.LANE_HORIZON_US / 100_000
    assert lanes.held() <= 2 * (horizon_steps + te.LANE_PRUNE_AT + 2)  # not 20,000
    assert lanes.place(-5.0, -1.0) == 0  # a span long before the horizon: placed where nothing is held


def test_a_folder_without_logs_is_refused(tmp_path):
    result = ringtop("trace", str(tmp_path))
    assert result.returncode == 2 and "no rank-R.jsonl files" in result.stderr


def _read(path: Path):
    from ringtop.protocol import read_log

    return read_log(path)
