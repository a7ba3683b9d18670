"""Fault specs of the simulator: ``fleetscope train``'s, parsed by the trainer's own
parser, plus ``host_down:host=H:step=S`` (a whole host, its agent included, goes silent).

A parsed set of faults becomes per-rank numpy arrays the vectorised schedule reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fleetscope.trainer.faults import Fault, parse_fault

NEVER = np.iinfo(np.int64).max
HANG_WHERE = ("compute", "collective", "p2p", "in_collective", "in_p2p")


def parse_sim_fault(spec: str, world_size: int, num_hosts: int) -> Fault:
    """Parse one ``--inject`` spec; ``ValueError`` names the bad part.

    ``host_down:host=H:step=S`` is the simulator's own; every other kind goes through
    :func:`fleetscope.trainer.faults.parse_fault` unchanged.
    """
    kind = spec.strip().split(":", 1)[0]
    if kind != "host_down":
        return parse_fault(spec, world_size)
    values: dict[str, int] = {}
    for part in spec.strip().split(":")[1:]:
        key, eq, raw = part.partition("=")
        if not eq or key not in ("host", "step"):
            raise ValueError(f"--inject {spec!r}: bad field {part!r}; host_down takes host/step")
        try:
            values[key] = int(raw)
        except ValueError:
            raise ValueError(f"--inject {spec!r}: {key} must be int, got {raw!r}") from None
    for key in ("host", "step"):
        if key not in values:
            raise ValueError(f"--inject {spec!r}: missing {key}=")
    if not 0 <= values["host"] < num_hosts:
        raise ValueError(f"--inject {spec!r}: host={values['host']} out of range [0, {num_hosts})")
    if values["step"] < 0:
        raise ValueError(f"--inject {spec!r}: step={values['step']} out of range")
    return Fault("host_down", -1, tuple(sorted(values.items())), spec)


@dataclass
class FaultPlan:
    """The faults as per-rank arrays (index: global rank)."""

    faults: list[Fault]
    world_size: int
    gpus_per_host: int
    compute_factor: np.ndarray = field(init=False)
    compute_from: np.ndarray = field(init=False)
    dl_factor: np.ndarray = field(init=False)
    dl_from: np.ndarray = field(init=False)
    hang_step: np.ndarray = field(init=False)
    hang_where: np.ndarray = field(init=False)
    """Index into :data:`HANG_WHERE` (-1: none)."""
    dead_step: np.ndarray = field(init=False)
    """Step at whose start the rank's process is gone (crash, host_down)."""
    host_down_step: dict[int, int] = field(init=False)
    crash_ranks: dict[int, int] = field(init=False)
    slow_ns: dict[str, np.ndarray] = field(init=False)
    """Axis -> per-rank delay added inside every op of that axis (slowlink)."""
    gc_every: np.ndarray = field(init=False)
    gc_pause_ns: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        n = self.world_size
        self.compute_factor = np.ones(n)
        self.compute_from = np.full(n, NEVER)
        self.dl_factor = np.ones(n)
        self.dl_from = np.full(n, NEVER)
        self.hang_step = np.full(n, NEVER)
        self.hang_where = np.full(n, -1)
        self.dead_step = np.full(n, NEVER)
        self.host_down_step, self.crash_ranks = {}, {}
        self.slow_ns = {a: np.zeros(n) for a in ("tp", "dp", "pp")}
        self.gc_every = np.zeros(n, dtype=np.int64)
        self.gc_pause_ns = np.zeros(n)
        for f in self.faults:
            r = f.rank
            if f.kind == "straggler":
                if f.get("section") == "dataloader":
                    self.dl_factor[r], self.dl_from[r] = f.get("factor"), f.get("from_step")
                else:
                    self.compute_factor[r], self.compute_from[r] = f.get("factor"), f.get("from_step")
            elif f.kind == "hang":
                if f.get("step") < self.hang_step[r]:
                    self.hang_step[r] = f.get("step")
                    self.hang_where[r] = HANG_WHERE.index(f.get("where"))
            elif f.kind == "crash":
                self.dead_step[r] = min(self.dead_step[r], f.get("step"))
                self.crash_ranks[r] = int(self.dead_step[r])
            elif f.kind == "slowlink":
                self.slow_ns[f.get("group")][r] += f.get("delay_ms") * 1e6
            elif f.kind == "gc":
                self.gc_every[r], self.gc_pause_ns[r] = f.get("every"), f.get("pause_ms") * 1e6
            elif f.kind == "host_down":
                h, s = f.get("host"), f.get("step")
                lo, hi = h * self.gpus_per_host, min(n, (h + 1) * self.gpus_per_host)
                self.dead_step[lo:hi] = np.minimum(self.dead_step[lo:hi], s)
                self.host_down_step[h] = min(self.host_down_step.get(h, NEVER), s)

    def host_dead_from(self, num_hosts: int) -> np.ndarray:
        """Per host: the step from which it (agent included) is silent, NEVER if not."""
        out = np.full(num_hosts, NEVER)
        for h, s in self.host_down_step.items():
            out[h] = s
        return out

    def describe(self) -> list[dict[str, Any]]:
        return [{"spec": f.spec, "kind": f.kind, "rank": f.rank, **dict(f.params)} for f in self.faults]
