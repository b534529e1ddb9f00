"""The relay's digests of the ranks' steps (agent/transport/step_digest.py), for the UIs of large runs.

The claim: a UI that folds the digests holds what a UI that folds every step holds (every rank's
step-time and loss histories, the cross-rank chart, goodput, skipped and non-finite steps), from
a few messages a second. The reference is the same view fed every step one by one; a view that
drops the briefs (only the latest steps) is shown to differ. Then the real relay (CURVE, real
sockets): digests only for those who ask, none forged by a rank, and the real app on a simulated
run through the real relay switching to digests and holding every step of every rank."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
import time

import msgspec
import pytest
import zmq
from background_socket import framed, relay_with_ranks, subscriber
from conftest import poll_until

from ringtop.agent.transport.step_digest import DIGEST_BODY_BYTES, MAX_BRIEFS_PER_RANK, StepDigest
from ringtop.protocol import (
    MAX_FRAME_BYTES,
    CommStat,
    Digest,
    Hello,
    Step,
    decode,
    encode,
)
from ringtop.protocol.curve import secure_client
from ringtop.protocol.messages import MAX_DIGEST_STEPS
from ringtop.tui.state.view_model import RunView

pytestmark = pytest.mark.timeout(90)

T0 = 1_780_000_000.0
WORLD = 6


def step(rank: int, n: int, **kw) -> Step:
    """Step n of a rank: its time, loss and norm differ by rank and step, so any mix-up shows."""
    fields = dict(rank=rank, seq=n, ts=T0 + 0.1 * n + 0.001 * rank, step=n, loss=3.0 - 0.01 * n + 0.001 * rank,
                  step_ms=100.0 + rank + (n % 7), grad_norm=1.0 + 0.01 * n)
    fields.update(kw)
    return Step(**fields)


def the_run(steps: int = 40) -> tuple[list[Hello], list[Step]]:
    hellos = [Hello(rank=r, seq=0, ts=T0, run_id="run", world_size=WORLD, process_started_ts=T0 - 2.0)
              for r in range(WORLD)]
    out = []
    for n in range(1, steps + 1):
        for r in range(WORLD):
            kw = {}
            if n == 17:
                kw["skipped"] = True
            if n == 23 and r == 4:
                kw["loss"] = None  # not finite on one rank
            out.append(step(r, n, **kw))
    return hellos, out


def through_digests(hellos: list, steps: list[Step], per_digest: int, keep_briefs: bool = True) -> list:
    """What a digest subscriber gets: the Hellos, then a digest every `per_digest` steps of the
    stream (as the relay cuts them every interval)."""
    digest = StepDigest()
    out: list = list(hellos)
    for i, s in enumerate(steps, 1):
        digest.add(s, len(encode(s)))
        if i % per_digest == 0 or i == len(steps):
            for d in digest.take(T0, 0):
                out.append(decode(encode(d)) if keep_briefs else msgspec.structs.replace(decode(encode(d)), briefs=[]))
    return out


def folded(messages: list) -> RunView:
    view = RunView(watch_liveness=False)
    view.apply_batch(messages, now=1.0)
    return view


def held(view: RunView) -> dict:
    """Everything a step adds to the view, NaN written as a string so that equal means equal."""
    def norm(x):
        return "nan" if isinstance(x, float) and math.isnan(x) else x
    good = view.goodput.result()
    return {
        "rows": {r: (row.step, row.folded_step, [norm(x) for x in row.step_ms_history],
                     [norm(x) for x in row.loss_history], row.step_ms_stat.count)
                 for r, row in sorted(view.ranks.items())},
        "chart": [tuple(norm(x) for x in dataclasses.astuple(p)) for p in view.step_history.points],
        "skipped": (view.skipped_steps, view.last_skipped_step),
        "nonfinite": view.first_nonfinite,
        "goodput": (round(good.productive_s, 9), round(good.wall_s, 9), good.steps),
    }


@pytest.mark.parametrize("per_digest", [WORLD * 3, 7, 1])
def test_a_view_fed_digests_holds_what_a_view_fed_every_step_holds(per_digest):
    """3 steps of every rank per digest, an uneven cut (7 messages: ranks split between digests),
    and one step per digest."""
    hellos, steps = the_run()
    reference = held(folded([*hellos, *steps]))
    assert reference["chart"] and len(reference["chart"]) == 40 and reference["skipped"] == (1, 17)
    assert reference["nonfinite"] is not None and reference["goodput"][2] == 40
    via = through_digests(hellos, steps, per_digest)
    digests = [m for m in via if isinstance(m, Digest)]
    assert len(digests) <= len(steps) // per_digest + 1
    assert held(folded(via)) == reference


def test_without_the_briefs_the_check_fails():
    """Only each rank's latest step per digest: histories, chart and goodput come out short."""
    hellos, steps = the_run()
    reference = held(folded([*hellos, *steps]))
    lossy = held(folded(through_digests(hellos, steps, WORLD * 3, keep_briefs=False)))
    assert lossy["rows"] != reference["rows"]
    assert len(lossy["chart"]) < len(reference["chart"])
    assert lossy["goodput"] != reference["goodput"]


@pytest.mark.parametrize("per_digest", [WORLD, WORLD * 2])
def test_a_step_that_comes_direct_and_in_a_digest_is_folded_once(per_digest):
    """While the subscription changes a UI may get a step both ways: step 5 of every rank comes
    direct, then in a digest whole (one step a digest) or as a brief (two)."""
    hellos, steps = the_run(10)
    reference = held(folded([*hellos, *steps]))
    first, rest = steps[:30], steps[24:]
    view = RunView(watch_liveness=False)
    view.apply_batch([*hellos, *first], now=1.0)
    view.via_digests = True
    view.apply_batch(through_digests([], rest, per_digest), now=1.0)
    assert held(view) == reference


def test_digests_are_bounded_and_each_fits_a_frame():
    digest = StepDigest()
    heavy = [CommStat(kind=f"kind{i}", count=1, bytes=1, group_size=2) for i in range(20)]
    for n in (1, 2):
        for r in range(2500):
            s = step(r, n, comm=heavy)
            digest.add(s, len(encode(s)))
    digests = digest.take(T0, 5)
    assert len(digests) >= 3
    assert sorted(s.rank for d in digests for s in d.steps) == list(range(2500))
    assert sorted(b.rank for d in digests for b in d.briefs) == list(range(2500))
    seqs = [d.seq for d in digests]
    assert seqs == list(range(seqs[0], seqs[0] + len(digests)))
    for d in digests:
        body = encode(d)
        assert len(body) <= MAX_FRAME_BYTES and len(d.steps) <= MAX_DIGEST_STEPS
        assert decode(body) == d and d.relay_gaps == 5
        assert {b.rank for b in d.briefs} <= {s.rank for s in d.steps}  # a rank's briefs travel with it
    assert digest.take(T0, 5) == []


def test_a_rank_too_fast_for_a_digest_loses_its_oldest_briefs_counted():
    digest = StepDigest()
    n_steps = MAX_BRIEFS_PER_RANK + 11
    for n in range(1, n_steps + 1):
        digest.add(step(0, n), 300)
    (d,) = digest.take(T0, 0)
    assert [s.step for s in d.steps] == [n_steps]
    assert [b.step for b in d.briefs] == list(range(n_steps - MAX_BRIEFS_PER_RANK, n_steps))
    assert d.briefs_dropped == 10


def test_a_step_too_big_to_carry_whole_comes_by_its_numbers():
    digest = StepDigest()
    digest.add(step(0, 1), DIGEST_BODY_BYTES + 1)
    digest.add(step(1, 1), 300)
    (d,) = digest.take(T0, 0)
    assert [s.rank for s in d.steps] == [1] and [(b.rank, b.step) for b in d.briefs] == [(0, 1)]
    view = folded([Hello(rank=r, ts=T0, run_id="run", world_size=2) for r in (0, 1)] + [decode(encode(d))])
    assert view.ranks[0].folded_step == 1 and list(view.ranks[0].step_ms_history) == [step(0, 1).step_ms]


# ---------------------------------------------------------------------- the real relay


def digest_subscriber(address: str, keys) -> zmq.Socket:
    """As the UI subscribes for a large run (tui/sources/connection.py): digests and everything but steps."""
    from ringtop.tui.sources.connection import BUT_STEPS, DIGEST_TOPIC

    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    for topic in (DIGEST_TOPIC, *BUT_STEPS):
        sub.setsockopt(zmq.SUBSCRIBE, topic)
    secure_client(sub, keys)
    sub.connect(address)
    return sub


def test_the_relay_sends_digests_to_who_asks_and_never_a_ranks(gatekeeper):
    gate, keys = gatekeeper
    got_all: list = []
    got_digests: list = []

    def drain(sock, into) -> None:
        while sock.poll(0):
            into.append(decode(sock.recv_multipart()[1]))
    n = {"step": 0}

    def send_steps(pubs) -> int:
        n["step"] += 1
        for rank in (0, 1):
            pubs[rank].send_multipart(framed(step(rank, n["step"])))
        return n["step"]

    def steps_seen(into) -> set[int]:
        return {m.step for m in into if isinstance(m, Step)}
    with relay_with_ranks(gate, keys, "run") as (relay, publish_addr, pubs):
        everything = subscriber(publish_addr, keys.client)
        digests = None
        try:
            hello = Hello(rank=0, ts=T0, run_id="run", world_size=2)
            poll_until(lambda: (pubs[0].send_multipart(framed(hello)), drain(everything, got_all), got_all)[2],
                       20, "the relay forwarding", interval_s=0.05)
            # a subscriber to everything: no digest is built for it
            poll_until(lambda: (drain(everything, got_all), send_steps(pubs) and steps_seen(got_all))[1],
                       20, "steps forwarded", interval_s=0.05)
            assert relay.digests_sent == 0 and not relay.digest._latest
            assert not any(isinstance(m, Digest) for m in got_all)

            digests = digest_subscriber(publish_addr, keys.client)
            forged = Digest(rank=1, seq=1, ts=T0, interval_s=59.0, steps=[step(1, 999)])
            pubs[1].send_multipart([b"digest.1", encode(forged)])
            pubs[1].send_multipart([b"digest.-1", encode(msgspec.structs.replace(forged, rank=-1))])

            def digests_with_both_ranks() -> bool:
                send_steps(pubs)
                drain(digests, got_digests)
                return any(isinstance(m, Digest) and {s.rank for s in m.steps} == {0, 1} for m in got_digests)
            poll_until(digests_with_both_ranks, 20, "a digest of both ranks", interval_s=0.05)
            assert not any(isinstance(m, Step) for m in got_digests)  # steps come only in the digests
            assert all(d.interval_s != 59.0 and all(s.step != 999 for s in d.steps)
                       for d in got_digests if isinstance(d, Digest))
            assert relay.dropped >= 2

            digests.close(0)
            digests = None
            poll_until(lambda: not relay._digest_wanted, 20, "the relay to notice no one wants digests")
            sent = relay.digests_sent
            last = send_steps(pubs)
            poll_until(lambda: (drain(everything, got_all), last in steps_seen(got_all))[1], 20,
                       "the last steps forwarded")
            assert relay.digests_sent == sent and not relay.digest._latest  # nothing kept for no one
        finally:
            for sock in (everything, *([digests] if digests is not None else [])):
                sock.close(0)


# ---------------------------------------------------------------------- the real app


async def test_the_app_on_a_simulated_run_takes_digests_and_holds_every_step():
    """64 simulated ranks on 4 nodes through the real relay; the UI takes digests from 32 ranks on.
    Every rank's history holds consecutive steps (the briefs filled what the digests conflated),
    the cross-rank chart's latest points hold all 64 ranks (the first ones, while the simulation
    connects its ranks, fewer), and the straggler is the slowest."""
    from test_simulate import on_own_ports

    from ringtop.cli.simulate import SimConfig, Simulation
    from ringtop.protocol import connection_file
    from ringtop.tui.app import RingtopApp

    stop = threading.Event()
    sim = Simulation(on_own_ports(SimConfig(ranks=64, nodes=4, hz=10, straggler=37, seed=5)), stop)
    thread = threading.Thread(target=sim.run, daemon=True)
    thread.start()
    try:
        info = await asyncio.to_thread(
            poll_until, lambda: _readable(connection_file.file_for(sim.run_id)), 30, "the connection file")
        app = RingtopApp(publish_addr=info.publish, control_addr=info.control, keys=info.keys, digest_min_ranks=32)
        async with app.run_test(size=(200, 60)) as pilot:
            deadline = time.monotonic() + 40
            view = app.view
            folded_steps: dict[int, list[int]] = {}
            fold_step = view._fold_step

            def recording(row, n, *rest) -> None:  # which steps reach each rank's histories
                folded_steps.setdefault(row.rank, []).append(n)
                fold_step(row, n, *rest)
            view._fold_step = recording

            def ready() -> bool:
                rows = list(view.ranks.values())
                return (len(rows) == 64 and app.client.digests and view.digests_folded >= 8 and len(folded_steps) == 64
                        and all(len(f) >= 12 for f in folded_steps.values()) and len(view.step_history.points) >= 5)
            while not ready():
                assert time.monotonic() < deadline, (len(view.ranks), app.client.digests, view.digests_folded)
                await pilot.pause(0.2)
            assert view.via_digests and view.total_drops == 0
            for rank, got in folded_steps.items():
                assert got == list(range(got[0], got[0] + len(got))), rank  # every step once, in order
            points = list(view.step_history.points)
            assert all(p.ranks == 64 for p in points[-5:]), [(p.step, p.ranks) for p in points]
            view._ensure_slowest()
            assert view.slowest_rank == 37  # the simulated straggler, by its compute
            # far fewer messages than steps: the digests carry the steps of all 64 ranks
            steps_held = sum(len(r.step_ms_history) for r in view.ranks.values())
            assert view.digests_folded < steps_held / 20
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 20)
    assert not thread.is_alive()


def _readable(path):
    from ringtop.protocol import connection_file

    try:
        return connection_file.read(path)
    except connection_file.ConnectionFileError:
        return None


@pytest.mark.parametrize("given, expected", [("0", 1 << 21), ("4", 4), ("128", 128)])
def test_ringtop_ui_digests_from(given, expected):
    """0 means never (more ranks than a run may have); the default is the view's."""
    from ringtop.cli.parser import build_parser
    from ringtop.tui.state.view_model import DIGEST_MIN_RANKS

    parser = build_parser()
    assert parser.parse_args(["ui", "--digests-from", given]).digests_from == expected
    assert parser.parse_args(["ui"]).digests_from is None
    ui = next(a for a in parser._subparsers._group_actions[0].choices["ui"]._actions if a.dest == "digests_from")
    assert f"default {DIGEST_MIN_RANKS};" in ui.help


@pytest.mark.parametrize("given", ["-1", "x", str((1 << 20) + 1)])
def test_ringtop_ui_refuses_a_bad_digests_from(given, capsys):
    from ringtop.cli.parser import build_parser

    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["ui", "--digests-from", given])
    assert exit_info.value.code == 2 and "--digests-from" in capsys.readouterr().err
