"""Process groups of the 3D layout, built from the core topology (the one place that
decides which global rank has which (dp, pp, tp))."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from fleetscope.topology import Topology


@dataclass
class ParallelGroups:
    """This rank's dp, tp and pp process groups (``None`` where the axis has size 1)."""

    topology: Topology
    rank: int
    dp: Any = None
    tp: Any = None
    pp: Any = None

    def get(self, axis: str) -> Any:
        return getattr(self, axis)

    def by_id(self) -> dict[int, str]:
        """id(process group) -> axis, for code that must recognise a group object."""
        return {id(g): a for a in ("dp", "tp", "pp") if (g := self.get(a)) is not None}


def build_groups(topology: Topology, rank: int) -> ParallelGroups:
    """Create every dp/tp/pp group (all ranks call this in the same order) and keep ours."""
    out = ParallelGroups(topology, rank)
    for axis in ("tp", "dp", "pp"):
        if topology.size(axis) == 1:
            continue
        for _gid, ranks in sorted(topology.groups(axis).items()):
            group = dist.new_group(ranks=ranks)
            if rank in ranks:
                setattr(out, axis, group)
    return out
