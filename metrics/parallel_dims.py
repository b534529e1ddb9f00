"""The one mesh of a run: tensor x pipeline x data parallel degrees, a rank's place in it, the ranks
of its groups. Torch-free, so the strategies, the cost model, `ringtop plan`, the agent's checks and
the UI do the same arithmetic (torchtitan's `ParallelDims` is the model).

The layout is torch's `init_device_mesh(device, (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))`:
tp varies fastest, so a tensor-parallel group is consecutive ranks (one node, where the fast link
is), then the stages of one replica, then the replicas: rank = (dp_index x pp + pp_index) x tp +
tp_index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

Dimension = Literal["dp", "pp", "tp"]
DIMENSIONS: tuple[Dimension, ...] = ("dp", "pp", "tp")
"""Outermost first, as the device mesh is shaped."""


class Coords(NamedTuple):
    """A rank's place: which replica, which stage of it, which share of the stage's matrices."""

    dp: int
    pp: int
    tp: int


@dataclass(frozen=True, slots=True)
class ParallelDims:
    """Degrees of each dimension; `world` = tp x pp x dp. Validated once, here."""

    tp: int = 1
    pp: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"every mesh degree must be an integer >= 1: tp={self.tp} pp={self.pp} dp={self.dp}")

    @classmethod
    def filling(cls, world: int, *, tp: int = 1, pp: int = 1) -> ParallelDims:
        """The mesh of `world` ranks with these tp and pp degrees: dp takes the rest. ValueError
        when tp x pp does not divide the world."""
        if world < 1:
            raise ValueError(f"the world size must be >= 1, got {world}")
        cls(tp=tp, pp=pp)
        if world % (tp * pp):
            split = " x ".join(f"{name} {n}" for name, n in (("tp", tp), ("pp", pp)) if n > 1)
            raise ValueError(f"the world size ({world} ranks) must be a multiple of {split}")
        return cls(tp=tp, pp=pp, dp=world // (tp * pp))

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def shape(self) -> tuple[int, int, int]:
        """(dp, pp, tp): the device mesh's shape, in DIMENSIONS' order."""
        return self.dp, self.pp, self.tp

    def coords(self, rank: int) -> Coords:
        self._check_rank(rank)
        return Coords(dp=rank // (self.pp * self.tp), pp=(rank // self.tp) % self.pp, tp=rank % self.tp)

    def rank_at(self, dp: int = 0, pp: int = 0, tp: int = 0) -> int:
        if not (0 <= dp < self.dp and 0 <= pp < self.pp and 0 <= tp < self.tp):
            raise ValueError(f"({dp}, {pp}, {tp}) is outside the mesh dp={self.dp} pp={self.pp} tp={self.tp}")
        return (dp * self.pp + pp) * self.tp + tp

    def group(self, dimension: Dimension, rank: int) -> tuple[int, ...]:
        """The ranks of `rank`'s group along `dimension` (those that differ from it only there), in order."""
        at = self.coords(rank)._asdict()
        size = getattr(self, dimension)
        return tuple(self.rank_at(**{**at, dimension: i}) for i in range(size))

    def groups(self, dimension: Dimension) -> list[tuple[int, ...]]:
        """Every group along `dimension`, ordered by their first rank: what every rank must create."""
        return sorted({self.group(dimension, rank) for rank in range(self.world)})

    def data_shard(self, rank: int) -> tuple[int, int]:
        """(index, count) of the data shard `rank` reads: the ranks of a tensor-parallel group and
        the stages of a replica are fed the same batch."""
        return self.coords(rank).dp, self.dp

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is outside a mesh of {self.world} ranks")


def tp_degrees(world: int) -> list[int]:
    """Every tensor-parallel degree that splits `world` ranks into whole groups, 1 and `world` included."""
    return [t for t in range(1, world + 1) if world % t == 0]
