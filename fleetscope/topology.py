"""Rank <-> (dp, pp, tp) coordinates and process-group membership, as plain data.

One place decides which global rank has which coordinates, so the trainer, the agent,
the server and the dashboard all compute "which TP group is slow" the same way.

The ``order`` string lists the axes fastest-varying first. The default ``tp-dp-pp`` is
Megatron's: ranks of a tensor-parallel group are adjacent (same host), then data
parallel, then pipeline stages. For ``tp-dp-pp``::

    rank = tp + TP * (dp + DP * pp)

Group ids are stable strings naming the fixed coordinates, e.g. ``tp.pp0.dp1`` is the
tensor-parallel group of stage 0, replica 1; ``pp.dp1.tp0`` is one pipeline chain;
``world`` is everybody.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

AXES: Final = ("dp", "pp", "tp")
DEFAULT_ORDER: Final = "tp-dp-pp"


@dataclass(frozen=True)
class Coords:
    dp: int
    pp: int
    tp: int

    def get(self, axis: str) -> int:
        return getattr(self, axis)


@dataclass(frozen=True)
class Topology:
    """The 3D-parallel layout of a job. Pure numbers; builds no process groups."""

    dp: int = 1
    """Data-parallel size (number of model replicas)."""
    tp: int = 1
    """Tensor-parallel size (ranks that split each layer)."""
    pp: int = 1
    """Pipeline-parallel size (number of stages)."""
    order: str = DEFAULT_ORDER
    """Axes fastest-varying first, e.g. ``tp-dp-pp``."""

    def __post_init__(self) -> None:
        for axis in AXES:
            size = getattr(self, axis)
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ValueError(f"topology {axis} must be a positive integer, got {size!r}")
        parts = self.order.split("-")
        if sorted(parts) != sorted(AXES):
            raise ValueError(
                f"topology order must be a permutation of dp, pp, tp joined by '-', "
                f"got {self.order!r}"
            )

    # ---- sizes -----------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def size(self, axis: str) -> int:
        if axis == "world":
            return self.world_size
        _check_axis(axis)
        return int(getattr(self, axis))

    @property
    def axes_fastest_first(self) -> tuple[str, ...]:
        return tuple(self.order.split("-"))

    # ---- rank <-> coords ---------------------------------------------------------
    def coords(self, rank: int) -> Coords:
        self._check_rank(rank)
        values: dict[str, int] = {}
        rest = rank
        for axis in self.axes_fastest_first:
            n = self.size(axis)
            values[axis] = rest % n
            rest //= n
        return Coords(**values)

    def rank(self, dp: int = 0, pp: int = 0, tp: int = 0) -> int:
        given = {"dp": dp, "pp": pp, "tp": tp}
        for axis, v in given.items():
            if not 0 <= v < self.size(axis):
                raise ValueError(f"{axis}={v} out of range [0, {self.size(axis)})")
        rank, stride = 0, 1
        for axis in self.axes_fastest_first:
            rank += given[axis] * stride
            stride *= self.size(axis)
        return rank

    def ranks(self) -> range:
        return range(self.world_size)

    # ---- groups ------------------------------------------------------------------
    def group_id(self, axis: str, rank: int) -> str:
        """Stable id of the ``axis`` group that ``rank`` belongs to."""
        if axis == "world":
            return "world"
        _check_axis(axis)
        c = self.coords(rank)
        fixed = [a for a in AXES if a != axis]
        fixed.sort(key=lambda a: ("pp", "dp", "tp").index(a))
        return axis + "." + ".".join(f"{a}{c.get(a)}" for a in fixed)

    def group_ranks(self, axis: str, rank: int) -> list[int]:
        """Global ranks of the ``axis`` group containing ``rank``, in group-rank order."""
        if axis == "world":
            return list(self.ranks())
        _check_axis(axis)
        c = self.coords(rank)
        out = []
        for i in range(self.size(axis)):
            kw = {"dp": c.dp, "pp": c.pp, "tp": c.tp, axis: i}
            out.append(self.rank(**kw))
        return out

    def groups(self, axis: str) -> dict[str, list[int]]:
        """All groups of an axis: group id -> member ranks (each rank in exactly one)."""
        out: dict[str, list[int]] = {}
        for r in self.ranks():
            gid = self.group_id(axis, r)
            if gid not in out:
                out[gid] = self.group_ranks(axis, r)
        return out

    def parse_group_id(self, group_id: str) -> tuple[str, list[int]]:
        """Inverse of :meth:`group_id`: the axis and member ranks of a group id."""
        if group_id == "world":
            return "world", list(self.ranks())
        axis, _, rest = group_id.partition(".")
        _check_axis(axis)
        fixed = {"dp": 0, "pp": 0, "tp": 0}
        for part in rest.split(".") if rest else []:
            name, value = part[:2], part[2:]
            if name not in fixed or not value.isdigit():
                raise ValueError(f"bad group id {group_id!r}")
            fixed[name] = int(value)
        return axis, self.group_ranks(axis, self.rank(**fixed))

    # ---- pipeline helpers -----------------------------------------------------------
    def stage(self, rank: int) -> int:
        return self.coords(rank).pp

    def is_first_stage(self, rank: int) -> bool:
        return self.stage(rank) == 0

    def is_last_stage(self, rank: int) -> bool:
        return self.stage(rank) == self.pp - 1

    def next_stage_rank(self, rank: int) -> int | None:
        c = self.coords(rank)
        return None if c.pp == self.pp - 1 else self.rank(dp=c.dp, pp=c.pp + 1, tp=c.tp)

    def prev_stage_rank(self, rank: int) -> int | None:
        c = self.coords(rank)
        return None if c.pp == 0 else self.rank(dp=c.dp, pp=c.pp - 1, tp=c.tp)

    # ---- display order --------------------------------------------------------------
    def display_order(self) -> list[int]:
        """Ranks sorted by (pp, dp, tp): the heat-map row order."""
        return sorted(self.ranks(), key=lambda r: self._display_key(r))

    def _display_key(self, rank: int) -> tuple[int, int, int]:
        c = self.coords(rank)
        return (c.pp, c.dp, c.tp)

    def label(self, rank: int) -> str:
        c = self.coords(rank)
        return f"r{rank} pp{c.pp} dp{c.dp} tp{c.tp}"

    def iter_coords(self) -> Iterator[tuple[int, Coords]]:
        for r in self.ranks():
            yield r, self.coords(r)

    # ---- serialisation -------------------------------------------------------------
    def to_dict(self) -> dict[str, int | str]:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "order": self.order}

    @classmethod
    def from_dict(cls, d: dict) -> Topology:
        return cls(
            dp=int(d.get("dp", 1)),
            tp=int(d.get("tp", 1)),
            pp=int(d.get("pp", 1)),
            order=str(d.get("order", DEFAULT_ORDER)),
        )

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range [0, {self.world_size})")


def _check_axis(axis: str) -> None:
    if axis not in AXES:
        raise ValueError(f"unknown axis {axis!r}; expected one of {AXES} or 'world'")
