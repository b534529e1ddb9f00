"""The reading of stall reports (metrics/rules/hang.py) and group names (metrics/rank_sets.py): pure, on
hand-built reports whose culprit the test knows by construction."""

from __future__ import annotations

import msgspec
import pytest

from ringtop.metrics.rank_sets import group_members, group_name, ranks_text
from ringtop.metrics.rules.hang import diagnose, step_desync
from ringtop.protocol import GroupCursor, InFlight, Stall

MB4 = 4 << 20


def waiting_in(rank: int, seq: int, group: str = "world", size: int = MB4, age_s: float = 41.0,
               shapes: str = "aa", kind: str = "all_reduce", step: int = 412) -> Stall:
    return Stall(rank=rank, step=step, phase="backward", running_s=age_s + 1, threshold_s=4.0,
                 where="torch_native.py:39 in _backward",
                 in_flight=[InFlight(group=group, seq=seq, kind=kind, bytes=size, shapes=shapes, age_s=age_s)],
                 groups=[GroupCursor(group=group, issued=seq, completed=seq - 1)])


def elsewhere(rank: int, issued: int, phase: str = "forward", where: str = "model.py:57 in forward",
              group: str = "world", step: int = 412) -> Stall:
    return Stall(rank=rank, step=step, phase=phase, running_s=42.0, threshold_s=4.0, where=where,
                 groups=[GroupCursor(group=group, issued=issued, completed=issued)])


def test_the_rank_that_has_not_entered_the_collective_is_named_with_where_it_is():
    reports = {r: waiting_in(r, 412) for r in range(3)} | {3: elsewhere(3, issued=411)}
    verdict = diagnose(reports, world_size=4)
    assert verdict.kind == "hang"
    assert verdict.culprits == (3,) and verdict.waiting == (0, 1, 2)
    assert (verdict.group, verdict.seq, verdict.collective) == ("world", 412, "all_reduce")
    assert verdict.text == ("rank 3 has not entered all_reduce #412 on group world (4.0MiB) that ranks 0–2 have "
                            "waited in for 41 s; rank 3 is in forward at model.py:57 in forward")


def test_a_rank_that_already_passed_the_collective_is_not_blamed():
    """A broadcast's source can finish before its receivers: ahead of the others is not holding them up."""
    reports = {0: waiting_in(0, 412), 1: elsewhere(1, issued=413), 2: elsewhere(2, issued=411)}
    verdict = diagnose(reports, world_size=3)
    assert verdict.culprits == (2,)


def test_a_silent_rank_is_a_culprit_and_a_dead_one_is_called_dead():
    reports = {0: waiting_in(0, 9), 1: waiting_in(1, 9)}
    silent = diagnose(reports, world_size=3)
    assert silent.kind == "hang" and silent.culprits == (2,)
    assert "rank 2 sent no stall report" in silent.text
    dead = diagnose(reports, world_size=3, dead={2})
    assert dead.kind == "dead" and dead.culprits == (2,)
    assert dead.text.startswith("rank 2 has died; ranks 0, 1 wait for it in all_reduce #9 on group world")
    seen_gone = msgspec.structs.replace(waiting_in(0, 9), gone_peers=[2])  # its process ended, on rank 0's host
    gone_by_proc = diagnose({0: seen_gone, 1: waiting_in(1, 9)}, world_size=3)
    assert gone_by_proc.kind == "dead" and gone_by_proc.culprits == (2,)


def test_members_in_the_same_collective_with_other_sizes_are_a_desync():
    reports = {0: waiting_in(0, 412), 1: waiting_in(1, 412), 2: waiting_in(2, 412, size=MB4 + 4)}
    verdict = diagnose(reports, world_size=3)
    assert verdict.kind == "desync" and verdict.culprits == (2,) and verdict.waiting == (0, 1)
    assert verdict.text.startswith("desync at collective #412 on group world: ranks 0, 1 in all_reduce (4.0MiB")
    assert "rank 2 in all_reduce (4.0MiB" in verdict.text
    same_size_other_shape = {0: waiting_in(0, 7), 1: waiting_in(1, 7, shapes="bb")}
    assert diagnose(same_size_other_shape, world_size=2).kind == "desync"


def test_every_member_inside_means_the_transport_is_stuck():
    verdict = diagnose({r: waiting_in(r, 5) for r in range(4)}, world_size=4)
    assert verdict.kind == "hang" and verdict.culprits == ()
    assert "no member is missing" in verdict.text


def test_only_the_groups_members_are_expected():
    """Rank 3 is not in group 0-2 (a pipeline stage's data-parallel group): it holds nobody up."""
    reports = {0: waiting_in(0, 3, group="0-2"), 1: waiting_in(1, 3, group="0-2"),
               2: elsewhere(2, issued=2, group="0-2"), 3: elsewhere(3, issued=0, group="3")}
    assert diagnose(reports, world_size=4).culprits == (2,)


def test_ranks_at_the_step_boundary_wait_for_the_rank_that_has_not_reached_it():
    reports = {0: elsewhere(0, 40, phase="step-sync", where="control.py:280 in commands_for_step", step=13),
               1: elsewhere(1, 40, phase="data", where="data.py:12 in __next__", step=12)}
    verdict = diagnose(reports, world_size=2)
    assert verdict.kind == "hang" and verdict.culprits == (1,) and verdict.waiting == (0,)
    assert "rank 1 has not reached the step boundary before step 13" in verdict.text
    assert "rank 1 is in data at data.py:12 in __next__" in verdict.text


def test_a_stall_nobody_waits_on_yet_is_a_plain_stall():
    verdict = diagnose({1: elsewhere(1, 40)}, world_size=2)
    assert verdict.kind == "stall" and verdict.culprits == (1,)
    assert diagnose({}, world_size=2) is None


def test_the_reading_bites_a_wrong_culprit():
    """Swap who is where: the verdict follows the reports, not the rank numbers."""
    reports = {0: elsewhere(0, issued=411)} | {r: waiting_in(r, 412) for r in (1, 2, 3)}
    assert diagnose(reports, world_size=4).culprits == (0,)


def test_step_digests_name_the_rank_whose_collectives_differ():
    same = GroupCursor(group="world", issued=20, completed=20, count=5, digest="11111111")
    other = GroupCursor(group="world", issued=20, completed=20, count=5, digest="22222222")
    found = step_desync({0: [same], 1: [same], 2: [other]}, step=7)
    assert found.culprits == (2,) and found.agreeing == (0, 1) and found.group == "world"
    assert found.text == ("desync in step 7 on group world: rank 2 issued #16–#20 with other kinds, sizes or shapes "
                          "than ranks 0, 1")
    extra = GroupCursor(group="world", issued=21, completed=21, count=6, digest="33333333")
    assert "rank 2 issued 6 collectives, ranks 0, 1 5" in step_desync({0: [same], 1: [same], 2: [extra]}, 7).text
    assert step_desync({0: [same], 1: [same]}, 7) is None


@pytest.mark.parametrize("ranks, world, name", [
    (range(8), 8, "world"), (range(4), 8, "0-3"), ([0, 2, 4, 6], 8, "0-6/2"), ([1, 5, 6], 8, "1,5,6"), ([5], 8, "5"),
])
def test_group_names_round_trip(ranks, world, name):
    assert group_name(ranks, world) == name
    assert group_members(name, world) == frozenset(ranks)


@pytest.mark.parametrize("name", ["", "x", "3-1", "0-9", "0-6/0", "1,,2", "-1", "0-99999999/1"])
def test_a_hostile_group_name_is_no_group(name):
    assert group_members(name, world_size=8) is None


def test_rank_lists_read_as_runs():
    assert ranks_text([3]) == "rank 3"
    assert ranks_text([0, 1, 2, 4, 6, 7, 8, 9]) == "ranks 0–2, 4, 6–9"
    assert ranks_text([0, 1]) == "ranks 0, 1"


def test_two_ranks_that_disagree_are_both_named_for_no_majority_says_which_is_wrong():
    a = GroupCursor(group="world", issued=20, completed=20, count=5, digest="11111111")
    b = GroupCursor(group="world", issued=20, completed=20, count=5, digest="22222222")
    found = step_desync({0: [a], 1: [b]}, step=3)
    assert found.culprits == (0, 1) and found.agreeing == ()
    assert "no majority" in found.text
    verdict = diagnose({0: waiting_in(0, 7), 1: waiting_in(1, 7, shapes="bb")}, world_size=2)
    assert verdict.kind == "desync" and verdict.culprits == (0, 1)
