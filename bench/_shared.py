"""Pieces the benchmark scripts share beyond their arguments (imported as a sibling:
``python bench/x.py`` puts this folder on ``sys.path``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def interleaved(runs: dict[str, Callable[[], Any]], repeat: int) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Run each of ``runs`` ``repeat`` times, alternating their order round by round (so
    the machine's load drifts over both alike); (seconds per run by name, each one's last
    result)."""
    names = list(runs)
    times: dict[str, list[float]] = {k: [] for k in names}
    got: dict[str, Any] = {}
    for i in range(repeat):
        for k in (names if i % 2 == 0 else names[::-1]):
            a = time.perf_counter()
            got[k] = runs[k]()
            times[k].append(time.perf_counter() - a)
    return times, got


def breakdown_frame(comp: np.ndarray, rng: np.random.Generator, phase: np.ndarray | None = None,
                    cpu: np.ndarray | None = None) -> Any:
    """A reduced per-(rank, step) breakdown frame (what ClickHouse gives the straggler
    detector) around ``comp``, the compute of ranks x steps in ns: a data loader with
    exponential stalls, an optimizer and untimed work with log-normal noise (drawn from
    ``rng`` in that order), each times ``phase`` per step (machine load; untimed work
    excepted), steps 1.5x the slowest rank's work; ``cpu`` is the compute's CPU clock
    (``compute_cpu_ns``; 0, not measured, when None)."""
    import pandas as pd
    from fleetscope.server.diagnosis.breakdown import BREAKDOWN_COLUMNS

    world, steps = comp.shape
    phase = np.ones(steps) if phase is None else phase
    dl = 5e6 * (1 + rng.exponential(0.3, (world, steps))) * phase
    opt = 4e6 * np.exp(0.1 * rng.standard_normal((world, steps))) * phase
    unt = 1e6 * np.exp(0.3 * rng.standard_normal((world, steps)))
    busy = comp + dl + opt + unt
    step = np.broadcast_to(busy.max(axis=0) * 1.5, (world, steps))
    rk, st = np.meshgrid(np.arange(world), np.arange(steps), indexing="ij")
    return pd.DataFrame({"rank": rk.ravel(), "step": st.ravel(), "step_ns": step.ravel(),
                         "comm_ns": (step - busy).ravel(), "wait_ns": (step - busy).ravel(), "busy_ns": busy.ravel(),
                         "compute_ns": comp.ravel(), "dataloader_ns": dl.ravel(), "optimizer_ns": opt.ravel(),
                         "other_ns": 0.0, "untimed_ns": unt.ravel(), "wait_caused_ns": 0.0, "num_last_arrivals": 0,
                         "num_collectives": 10, "compute_cpu_ns": 0.0 if cpu is None else cpu.ravel(),
                         "optimizer_cpu_ns": 0.0},
                        )[list(BREAKDOWN_COLUMNS)]
