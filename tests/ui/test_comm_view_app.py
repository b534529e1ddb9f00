"""The Comm tab, the verdict panel and the Overview's verdict and busbw lines in the real Textual app,
driven by a Pilot with constructed messages (the numbers are worked out in test_comm_view.py)."""

from __future__ import annotations

from test_comm_view import cleared, hello, step, verdict
from test_tui_app import cell, column_labels, static_text, table_cell, wait_until
from textual.widgets import DataTable, TabbedContent
from ui_waits import eventually

from ringtop.protocol import CommStat, Event, Prediction
from ringtop.tui.app import RingtopApp
from ringtop.tui.sources.feeds import TelemetryBatch

SIZE = (120, 50)


def hsdp_run(steps: int = 3, slow_rank: int | None = 3) -> list:
    """4 ranks; each step all-reduce 8e6 B in 4 ms (n = 2) and all-gather 6e6 B in 2 ms (n = 4), 5 ms of
    union busy time, 3 ms exposed, 5 ms data. Rank 3's steps take 150 ms, the others' 100 ms."""
    msgs: list = [hello(r) for r in range(4)]
    for n in range(1, steps + 1):
        for r in range(4):
            msgs.append(step(r, n, step_ms=150.0 if r == slow_rank else 100.0))
    return msgs


async def open_comm(app: RingtopApp, pilot) -> None:
    await wait_until(pilot, lambda: app.replay_loaded, what="replay to load")
    await pilot.press("3")
    await wait_until(pilot, lambda: app.query_one("#comm-kinds", DataTable).row_count >= 2, what="the kinds table")
    def _shown_1():
        assert app.query_one(TabbedContent).active == "comm"
    await eventually(pilot, _shown_1)


async def test_comm_tab_per_kind_rows_bandwidth_overlap_and_prediction():
    app = RingtopApp(messages=hsdp_run(slow_rank=None), source="hsdp")
    async with app.run_test(size=SIZE) as pilot:
        await open_comm(app, pilot)
        k = lambda row, col: table_cell(app, "#comm-kinds", row, col)  # noqa: E731
        assert app.query_one("#comm-kinds", DataTable).row_count == 4  # AR, AG, RS (predicted only), all
        # all_reduce, n = 2: 8e6 B per step = 7.63 MiB, as predicted; busbw = algbw = 8e6 B / 4 ms = 2.00 GB/s
        assert (k("k:all_reduce", "kind"), k("k:all_reduce", "count"), k("k:all_reduce", "mb")) == \
            ("all_reduce n=2", "2", "7.63")
        assert (k("k:all_reduce", "pred"), k("k:all_reduce", "delta")) == ("7.63", "=")
        assert (k("k:all_reduce", "busy"), k("k:all_reduce", "algbw"), k("k:all_reduce", "busbw")) == \
            ("4.0", "2.00", "2.00")
        # all_gather, n = 4: algbw 6e6 B / 2 ms = 3.00 GB/s, busbw x 3/4 = 2.25; 6e6 B (5.72 MiB) against 5e6
        # (4.77 MiB) predicted: +20 %
        assert (k("k:all_gather", "kind"), k("k:all_gather", "mb"), k("k:all_gather", "pred")) == \
            ("all_gather n=4", "5.72", "4.77")
        assert k("k:all_gather", "delta") == "+20.0%"
        assert (k("k:all_gather", "algbw"), k("k:all_gather", "busbw")) == ("3.00", "2.25")
        # the prediction names a reduce-scatter nobody counted
        assert (k("k:reduce_scatter", "mb"), k("k:reduce_scatter", "pred"), k("k:reduce_scatter", "delta")) == \
            ("0", "1.91", "-100%")
        # per step: 14e6 B (13.4 MiB) of 15e6 (14.3 MiB) predicted (-6.7 %), union busy 5 ms, exposed 3 ms:
        # overlap 1 - 3/5 = 40 %; busbw (8e6 x 1 + 6e6 x 0.75) B / 5 ms = 2.50 GB/s
        assert (k("all", "mb"), k("all", "pred"), k("all", "delta")) == ("13.4", "14.3", "-6.7%")
        assert (k("all", "busy"), k("all", "busbw"), k("all", "exposed"), k("all", "overlap")) == \
            ("5.0", "2.50", "3.0", "40")
        assert k("k:all_reduce", "exposed") == "·"  # measured per step, not per kind
        # no link peak known: the highest busbw seen is the reference
        label = static_text(app, "#comm-chart-label")
        assert label.startswith("busbw 2.50 GB/s") and "peak unknown (max seen 2.50)" in label
        assert list(app.query_one("#comm-spark").data) == [2.5, 2.5, 2.5]
        exposed = static_text(app, "#comm-exposed")
        # exposed 3 of 100 ms = 3.0 %; idle (5 + 3) / 100 = 8.0 %
        assert "exposed comm 3.0 % of step" in exposed and "overlap 40 %" in exposed and "idle 8.0 %" in exposed
        caption = static_text(app, "#comm-caption")
        assert "all 4 ranks (mean per rank), steps 1–3" in caption
        assert app.query_one("#comm-ranks", DataTable).row_count == 4
        r = lambda row, col: table_cell(app, "#comm-ranks", row, col)  # noqa: E731
        assert (r("r0", "mb"), r("r0", "exposed"), r("r0", "overlap"), r("r0", "idle"), r("r0", "busbw")) == \
            ("13.4", "3.0", "40", "8.0", "2.50")


async def test_comm_tab_one_rank_at_a_time_and_the_slowest_rank():
    app = RingtopApp(messages=hsdp_run(slow_rank=3), source="hsdp")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.replay_loaded, what="replay to load")
        assert app.check_action("comm_rank", ()) is False  # `r` only on the Comm tab
        await pilot.press("r")
        assert app.comm_rank is None
        await open_comm(app, pilot)
        assert app.check_action("comm_rank", ()) is True
        # the slowest rank by compute = step - exposed - data: rank 3 150 - 3 - 5 = 142 ms, the others
        # 100 - 3 - 5 = 92 ms: +54 % (the one measure, the Overview's ▲ too)
        caption = static_text(app, "#comm-caption")
        assert "slowest rank 3: compute 142.0 ms/step, +54 % over the others' median 92.0 ms (arrives last" \
            in caption
        assert table_cell(app, "#comm-ranks", "r3", "note") == "slowest"
        assert table_cell(app, "#comm-ranks", "r0", "note") == ""
        # rank 3: compute 142 ms, idle (5 + 3) / 150 = 5.3 %
        assert (table_cell(app, "#comm-ranks", "r3", "compute"), table_cell(app, "#comm-ranks", "r3", "idle")) \
            == ("142.0", "5.3")
        await pilot.press("r")
        def _shown_2():
            assert app.comm_rank == 0 and "— rank 0, steps 1–3" in static_text(app, "#comm-caption")
            assert table_cell(app, "#comm-ranks", "r0", "rank") == "▶ 0"
        await eventually(pilot, _shown_2)
        for expected in (1, 2, 3, None):
            await pilot.press("r")
            assert app.comm_rank == expected
        def _shown_3():
            assert "all 4 ranks" in static_text(app, "#comm-caption")
        await eventually(pilot, _shown_3)


async def test_verdict_panel_and_overview_alert_follow_verdicts_until_cleared():
    app = RingtopApp(messages=hsdp_run(), source="hsdp")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.replay_loaded, what="replay to load")
        def _shown_4():
            assert "⚠" not in static_text(app, "#alert")
        await eventually(pilot, _shown_4)
        # rank 0 publishes a straggler verdict about rank 3, the way the live client delivers it
        app.post_message(TelemetryBatch([verdict(3, text="rank 3 is a straggler: compute 145 ms per step, "
                                                         "+52 % over the others' median 95 ms")], []))
        await wait_until(pilot, lambda: "rank 3 is a straggler" in static_text(app, "#alert"), what="the alert")
        alert = static_text(app, "#alert")
        assert alert.startswith("⚠ rank 3 is a straggler: compute 145 ms per step")
        await open_comm(app, pilot)
        panel = static_text(app, "#verdicts")
        assert "1 active" in panel and "⚠ straggler  rank 3  since step 20" in panel
        assert "evidence compute ms 210 · others' compute ms 58" in panel and "_ms" not in panel
        assert "advice   check that rank's host" in panel
        assert "slowest rank 3: compute 142.0 ms/step, +54 %" in panel
        assert table_cell(app, "#comm-ranks", "r3", "note") == "⚠ straggler slowest"

        app.post_message(TelemetryBatch([cleared(3)], []))
        await wait_until(pilot, lambda: "none active" in static_text(app, "#verdicts"), what="the verdict to clear")
        panel = static_text(app, "#verdicts")
        assert "rank 3 is a straggler" not in panel and "cleared: straggler (rank 3, step 40)" in panel
        assert table_cell(app, "#comm-ranks", "r3", "note") == "slowest"
        await pilot.press("1")
        def _shown_5():
            assert "straggler" not in static_text(app, "#alert")
        await eventually(pilot, _shown_5)

        # the end-of-run summary lists what was seen
        app.post_message(TelemetryBatch([Event(
            rank=0, seq=80, ts=1080.0, level="warn", kind="diagnosis", step=60,
            text="diagnosis: rank 3 is a straggler",
            data={"verdicts": [{"rule": "straggler", "rank": 3, "text": "rank 3 is a straggler",
                                "advice": "a"}]})], []))
        await wait_until(pilot, lambda: "end-of-run diagnosis" in static_text(app, "#alert"), what="the diagnosis")
        await pilot.press("3")
        def _shown_6():
            assert "end of run (step 60): 1 finding during the run" in static_text(app, "#verdicts")
        await eventually(pilot, _shown_6)


async def test_overview_idle_column_and_busbw_line_with_a_configured_peak():
    app = RingtopApp(messages=hsdp_run(slow_rank=None), source="hsdp", link_peak_gbps=25.0)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.replay_loaded, what="replay to load")
        await wait_until(pilot, lambda: app.query_one("#ranks").row_count == 4, what="four rows")
        def _shown_7():
            labels = column_labels(app, "#ranks")
            assert labels["idle_pct"] == "idle %" and "comm_pct" not in labels
            assert cell(app, 0, "idle_pct") == "8.0"  # (data 5 + exposed 3) / 100 ms
        await eventually(pilot, _shown_7)
        # busbw 2.5 GB/s of the configured 25 GB/s = 10 %; exposed 3 % of the step
        line = static_text(app, "#busbw-label")
        assert line.split() == ["busbw", "GB/s", "2.50", "of", "25.0", "(10%)", "exposed", "comm", "3.0%"]
        await pilot.press("3")
        def _shown_8():
            assert static_text(app, "#comm-chart-label").startswith("busbw 2.50 GB/s of 25.0 (10 %)")
        await eventually(pilot, _shown_8)


# A 2D run (fsdp --tp 2 on 4 ranks), every rank and step: the activations' all-reduce on its tp
# group (8e6 B in 4 ms, n = 2), the gradient norm's on the world (1e6 B in 1 ms, n = 4: no
# dimension), FSDP's reduce-scatter and all-gather on its dp group (3e6 B in 1.5 ms each, n = 2).
TWO_D = [CommStat(kind="all_reduce", count=16, bytes=8_000_000, busy_ms=4.0, group_size=2, group="tp"),
         CommStat(kind="all_reduce", count=1, bytes=1_000_000, busy_ms=1.0, group_size=4),
         CommStat(kind="reduce_scatter", count=5, bytes=3_000_000, busy_ms=1.5, group_size=2, group="dp"),
         CommStat(kind="all_gather", count=10, bytes=3_000_000, busy_ms=1.5, group_size=2, group="dp")]
TWO_D_PRED = Prediction(comm_payload_bytes={"all_reduce": 9_000_000, "reduce_scatter": 3_000_000,
                                            "all_gather": 3_000_000})


async def test_comm_tab_splits_a_kind_by_mesh_dimension_on_a_2d_run():
    msgs: list = [hello(r, TWO_D_PRED) for r in range(4)]
    msgs += [step(r, n, comm=TWO_D) for n in (1, 2, 3) for r in range(4)]
    app = RingtopApp(messages=msgs, source="2d")
    async with app.run_test(size=(160, 50)) as pilot:  # the wider kind column leaves Δ in at 160
        await open_comm(app, pilot)
        k = lambda row, col: table_cell(app, "#comm-kinds", row, col)  # noqa: E731
        assert app.query_one("#comm-kinds", DataTable).row_count == 5  # 4 (kind, group) rows and all
        # tp: algbw 8e6 B / 4 ms = 2.00 GB/s, busbw x 2(2-1)/2 = 2.00
        assert (k("k:all_reduce:tp", "kind"), k("k:all_reduce:tp", "mb"), k("k:all_reduce:tp", "count")) == \
            ("all_reduce · tp n=2", "7.63", "16")
        assert (k("k:all_reduce:tp", "algbw"), k("k:all_reduce:tp", "busbw")) == ("2.00", "2.00")
        # the world's: 1e6 B / 1 ms = 1.00 GB/s, busbw x 2(4-1)/4 = 1.50
        assert (k("k:all_reduce", "kind"), k("k:all_reduce", "mb"), k("k:all_reduce", "busbw")) == \
            ("all_reduce n=4", "0.95", "1.50")
        # the prediction is per kind: against neither part of a split all-reduce, against a whole kind
        assert (k("k:all_reduce:tp", "pred"), k("k:all_reduce", "delta")) == ("-", "-")
        assert (k("k:reduce_scatter:dp", "kind"), k("k:reduce_scatter:dp", "mb")) == ("reduce_scatter · dp n=2",
                                                                                      "2.86")
        assert (k("k:all_gather:dp", "pred"), k("k:all_gather:dp", "delta")) == ("2.86", "=")
        assert (k("all", "mb"), k("all", "pred"), k("all", "delta")) == ("14.3", "14.3", "=")


# The same run as its agents predict it per mesh dimension and declare its links (--link-tp 8,
# --link-dp 2 GB/s per direction): each (kind, dimension) row is held against its own prediction,
# and its busbw against its own link.
TWO_D_PRED_BY_GROUP = Prediction(
    comm_payload_bytes={"all_reduce": 9_000_000, "reduce_scatter": 3_000_000, "all_gather": 3_000_000},
    comm_payload_bytes_by_group={"tp": {"all_reduce": 8_000_000}, "": {"all_reduce": 1_000_000},
                                 "dp": {"reduce_scatter": 3_000_000, "all_gather": 2_000_000}})


async def test_comm_tab_holds_each_mesh_dimension_against_its_prediction_and_link():
    import msgspec

    msgs: list = [msgspec.structs.replace(hello(r, TWO_D_PRED_BY_GROUP), link_peak_gbps_by_group={"tp": 8.0, "dp": 2.0})
                  for r in range(4)]
    msgs += [step(r, n, comm=TWO_D) for n in (1, 2, 3) for r in range(4)]
    app = RingtopApp(messages=msgs, source="2d")
    async with app.run_test(size=(180, 50)) as pilot:
        await open_comm(app, pilot)
        k = lambda row, col: table_cell(app, "#comm-kinds", row, col)  # noqa: E731
        assert (k("k:all_reduce:tp", "pred"), k("k:all_reduce:tp", "delta")) == ("7.63", "=")
        assert (k("k:all_reduce", "pred"), k("k:all_reduce", "delta")) == ("0.95", "=")
        # the all-gather was predicted 1 MB short (by the test): its row says so, the others do not
        assert (k("k:all_gather:dp", "pred"), k("k:all_gather:dp", "delta")) == ("1.91", "+50.0%")
        # busbw against the dimension's link: tp 2.00 of 8 GB/s, dp's reduce-scatter 3e6 B in
        # 1.5 ms x (2-1)/2 = 1.00 of 2 GB/s; the world's row has no link of its own
        assert column_labels(app, "#comm-kinds")["link"] == "of link %"
        assert (k("k:all_reduce:tp", "link"), k("k:reduce_scatter:dp", "link"), k("k:all_reduce", "link")) == \
            ("25", "50", "·")
