"""The one mesh object: a rank's place and its groups' ranks as torch's device mesh lays them out,
the data shard a rank reads, and what it refuses."""

from __future__ import annotations

import itertools

import pytest

from ringtop.metrics.parallel_dims import DIMENSIONS, Coords, ParallelDims, tp_degrees

SHAPES = [(1, 1, 1), (2, 1, 1), (1, 4, 1), (1, 1, 3), (2, 2, 2), (4, 2, 1), (8, 2, 4), (2, 3, 2)]


def device_mesh(dims: ParallelDims):
    """What `init_device_mesh(device, (dp, pp, tp))` holds: the ranks `arange(world)` viewed in that shape."""
    torch = pytest.importorskip("torch")
    return torch.arange(dims.world).view(dims.dp, dims.pp, dims.tp)


@pytest.mark.parametrize("tp, pp, dp", SHAPES)
def test_a_ranks_place_and_groups_are_the_device_meshs(tp, pp, dp):
    dims = ParallelDims(tp=tp, pp=pp, dp=dp)
    mesh = device_mesh(dims)
    assert dims.world == tp * pp * dp == mesh.numel()
    for d, p, t in itertools.product(range(dp), range(pp), range(tp)):
        rank = int(mesh[d, p, t])
        assert dims.coords(rank) == Coords(dp=d, pp=p, tp=t)
        assert dims.rank_at(d, p, t) == rank
        assert dims.group("tp", rank) == tuple(mesh[d, p, :].tolist())
        assert dims.group("pp", rank) == tuple(mesh[d, :, t].tolist())
        assert dims.group("dp", rank) == tuple(mesh[:, p, t].tolist())
    for axis, name in enumerate(DIMENSIONS):
        expected = sorted(tuple(g.tolist()) for g in mesh.movedim(axis, -1).reshape(-1, mesh.shape[axis]))
        assert dims.groups(name) == expected


def test_the_chapters_64_gpu_layout_by_hand():
    """8 TP x 2 PP x 4 DP: rank 37 is in replica 2 (ranks 32-47), stage 0 of it (32-39), share 5."""
    dims = ParallelDims(tp=8, pp=2, dp=4)
    assert dims.coords(37) == (2, 0, 5)
    assert dims.group("tp", 37) == tuple(range(32, 40))
    assert dims.group("pp", 37) == (37, 45)
    assert dims.group("dp", 37) == (5, 21, 37, 53)
    assert dims.data_shard(37) == (2, 4)


def test_a_tensor_parallel_group_and_a_replicas_stages_read_one_shard():
    dims = ParallelDims(tp=2, pp=2, dp=3)
    shards = {dims.data_shard(rank) for rank in dims.group("tp", 5) + dims.group("pp", 5)}
    assert shards == {(1, 3)}
    assert sorted({dims.data_shard(r)[0] for r in range(dims.world)}) == [0, 1, 2]


@pytest.mark.parametrize(
    "world, tp, pp, expected", [(8, 2, 1, (2, 1, 4)), (8, 2, 2, (2, 2, 2)), (6, 1, 3, (1, 3, 2)), (4, 4, 1, (4, 1, 1))]
)
def test_filling_a_world_gives_dp_the_rest(world, tp, pp, expected):
    dims = ParallelDims.filling(world, tp=tp, pp=pp)
    assert (dims.tp, dims.pp, dims.dp) == expected and dims.shape == expected[::-1]


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: ParallelDims.filling(8, pp=3), "must be a multiple of pp 3"),
        (lambda: ParallelDims.filling(12, tp=2, pp=4), "must be a multiple of tp 2 x pp 4"),
        (lambda: ParallelDims.filling(0), ">= 1"),
        (lambda: ParallelDims(tp=0), ">= 1"),
        (lambda: ParallelDims(pp=True), ">= 1"),
        (lambda: ParallelDims(dp=2.0), ">= 1"),
        (lambda: ParallelDims(tp=2).coords(2), "outside"),
        (lambda: ParallelDims(tp=2).rank_at(tp=2), "outside"),
    ],
    ids=["pp", "tp x pp", "no ranks", "a zero degree", "a bool", "a float", "a rank past the world", "a place past it"],
)
def test_what_does_not_fit_is_refused_with_the_reason(make, words):
    with pytest.raises(ValueError, match=words):
        make()


def test_tp_degrees_are_the_divisors_of_the_world():
    assert tp_degrees(12) == [1, 2, 3, 4, 6, 12]
    assert tp_degrees(7) == [1, 7] and tp_degrees(1) == [1]
