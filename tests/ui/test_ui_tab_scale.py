"""The real app's Memory and Comm tabs on a run of 1024 ranks (8 nodes x 128), replayed through its
normal message path: one row per node, the rank holding the most memory and the rank the others
wait for named (values from the scenario's inputs), Enter into a node and Escape back, the
filter, and the small run's tables as they were."""

from __future__ import annotations

import msgspec
import pytest
import scale_scenario as sc
from textual.widgets import DataTable, Static
from ui_waits import eventually, repainted

from ringtop.protocol import MemorySample, Step
from ringtop.tui.app import RingtopApp

SIZE = (160, 48)
STEPS = 12
BIG = 333
"""On node-2: 900 MiB, every other rank 600–602 MiB."""
BIG_MIB = 900


def messages() -> list:
    out = []
    for m in sc.run(steps=STEPS):
        if isinstance(m, Step) and m.rank == BIG:
            m = msgspec.structs.replace(m, mem=MemorySample(rss_bytes=BIG_MIB * sc.MiB))
        out.append(m)
    return out


def text(app: RingtopApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


def row_keys(app: RingtopApp, table: str) -> list[str]:
    return [k.value for k in app.query_one(table, DataTable).rows]


def cell(app: RingtopApp, table: str, row: str, column: str) -> str:
    return str(app.query_one(table, DataTable).get_cell(row, column))


def _assert(ok: bool) -> None:
    assert ok


async def loaded(pilot, app: RingtopApp) -> None:
    await eventually(pilot, lambda: _assert(app.replay_loaded), timeout_s=30)
    await repainted(pilot)


@pytest.mark.timeout(60)
async def test_memory_tab_of_1024_ranks_shows_node_rows_and_names_the_rank_holding_most():
    app = RingtopApp(messages=messages(), source="runs/scale")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.press("2")

        def nodes():
            keys = row_keys(app, "#mem-ranks")
            assert keys[0] == f"nnode-{BIG // sc.PER_NODE}" and sorted(keys) == [f"nnode-{i}" for i in range(8)]
            assert cell(app, "#mem-ranks", keys[0], "most") == f"r{BIG}"
            assert cell(app, "#mem-ranks", keys[0], "mem_max") == f"{BIG_MIB}MiB"
            assert cell(app, "#mem-ranks", "nnode-0", "mem_min") == "600MiB"  # rank 0: 600 + 0 MiB
            assert cell(app, "#mem-ranks", "nnode-0", "most") == "r2"  # 602 MiB, the lowest of those ranks
            assert "8 nodes · 1,024 ranks · by memory" in text(app, "#mem-table-caption")
            standouts = text(app, "#mem-standouts")
            assert standouts.startswith(f"▲ most memory: r{BIG} node-2 {BIG_MIB}MiB")
            assert f"memory r{BIG}" in standouts  # the robust outlier too
        await eventually(pilot, nodes)
        await pilot.press("enter")

        def opened():
            keys = row_keys(app, "#mem-ranks")
            assert keys[0] == f"r{BIG}" and all(256 <= int(k[1:]) < 384 for k in keys)
            assert not any(k.endswith("p") for k in keys)  # a large run's ranks: no predicted row each
            assert "node node-2: 128 ranks" in text(app, "#mem-table-caption")
        await eventually(pilot, opened)
        await pilot.press("escape")
        await eventually(pilot, lambda: _assert(row_keys(app, "#mem-ranks")[0] == "nnode-2"))
        await pilot.press("slash")
        await pilot.press(*"5-7", "enter")
        by_mem = [f"r{r}" for r in sorted(range(5, 8), key=lambda r: (-(600 + r % 3), r))]  # the scenario's RSS
        await eventually(pilot, lambda: _assert(row_keys(app, "#mem-ranks") == by_mem))
        await pilot.press("escape", "1")  # the Overview's own nav is untouched by the Memory tab's
        await eventually(pilot, lambda: _assert(row_keys(app, "#ranks")[0] == "nnode-4"))


@pytest.mark.timeout(60)
async def test_comm_tab_of_1024_ranks_shows_node_rows_and_names_the_slowest_rank():
    app = RingtopApp(messages=messages(), source="runs/scale")
    compute = 130.0 - 3.0 - 1.0  # the straggler's step - exposed comm - data (scale_scenario.step)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.press("3")

        def nodes():
            keys = row_keys(app, "#comm-ranks")
            assert keys[0] == f"nnode-{sc.STRAGGLER // sc.PER_NODE}" and len(keys) == 8
            assert cell(app, "#comm-ranks", keys[0], "slowest") == f"r{sc.STRAGGLER}"
            assert cell(app, "#comm-ranks", keys[0], "compute_max") == f"{compute:.1f}"
            assert cell(app, "#comm-ranks", "nnode-0", "compute_min") == f"{100.0 - 4.0:.1f}"
            assert "8 nodes · 1,024 ranks · by compute" in text(app, "#comm-table-caption")
            assert text(app, "#comm-standouts").startswith(f"▲ slowest (compute/step): r{sc.STRAGGLER} node-4 "
                                                           f"{compute:.1f} ms")
            assert f"slowest rank {sc.STRAGGLER}: compute {compute:.1f} ms/step" in text(app, "#comm-caption")
        await eventually(pilot, nodes)
        await pilot.press("enter")

        def opened():
            keys = row_keys(app, "#comm-ranks")
            assert keys[0] == f"r{sc.STRAGGLER}" and all(512 <= int(k[1:]) < 640 for k in keys)
            assert "slowest" in cell(app, "#comm-ranks", keys[0], "note")
            assert "node node-4: 128 ranks" in text(app, "#comm-table-caption")
        await eventually(pilot, opened)
        await pilot.press("escape", "o")
        await eventually(pilot, lambda: _assert("by exposed comm" in text(app, "#comm-table-caption")))


@pytest.mark.timeout(60)
async def test_a_small_run_keeps_its_tables_rows_per_rank_and_no_scale_lines():
    app = RingtopApp(messages=sc.run(steps=4, world=8), source="runs/small")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.press("2")
        await eventually(pilot, lambda: _assert(row_keys(app, "#mem-ranks")[:2] == ["r0", "r0p"]))
        assert not app.query_one("#mem-table-caption").display and not app.query_one("#mem-standouts").display
        await pilot.press("3")
        await eventually(pilot, lambda: _assert(row_keys(app, "#comm-ranks") == [f"r{r}" for r in range(8)]))
        assert not app.query_one("#comm-standouts").display
