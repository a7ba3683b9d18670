"""Per-rank state and straggler score for the 3D topology grid.

The score is a rank's median own work (step time minus communication) over the window
divided by the median of the other ranks of its pipeline stage (stages do different
work). The state combines liveness (heartbeats), what the rank is blocked in (in-flight
records) and progress (last step) so a hang shows who is stuck before any detector ran.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from fleetscope.topology import Topology

SLOW_SCORE = 1.10
"""Score from which a rank is drawn as ``slow`` (10% more own work than its stage)."""

SEVERITY: dict[str, int] = {"ok": 0, "slow": 1, "missing": 2, "stuck": 3, "dead": 4}
STATES = tuple(SEVERITY)
SMALL_STAGE = 64
"""Up to this many ranks, a rank's reference excludes the rank itself."""

# Everything below is numpy over whole-job arrays indexed by rank: a 12,288-rank job
# is one vector operation per step, not a Python loop per rank.


def per_rank(values: Mapping[int, float] | np.ndarray | pd.Series | None, world: int, fill: float) -> np.ndarray:
    """A length-``world`` float array from a rank -> value mapping (``fill`` where a
    rank has no value; ranks outside ``0..world-1`` are ignored) or an array."""
    if isinstance(values, np.ndarray):
        if values.shape != (world,):
            raise ValueError(f"per-rank array has shape {values.shape}, expected ({world},)")
        return values.astype(float)
    out = np.full(world, fill, dtype=float)
    if values:
        r = np.fromiter((int(k) for k in values), dtype=np.int64, count=len(values))
        v = np.array([np.nan if x is None else float(x) for x in values.values()], dtype=float)
        ok = (r >= 0) & (r < world)
        out[r[ok]] = v[ok]
    return out


def frame_to_rank_array(df: pd.DataFrame, column: str, world: int, fill: float) -> np.ndarray:
    """``df[column]`` scattered into a length-``world`` array by ``df["rank"]``."""
    out = np.full(world, fill, dtype=float)
    if df is not None and not df.empty:
        r = df["rank"].to_numpy(dtype=np.int64)
        ok = (r >= 0) & (r < world)
        out[r[ok]] = df[column].to_numpy(dtype=float)[ok]
    return out


def rank_coords(topo: Topology) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pp, dp, tp) coordinate arrays of ranks ``0..world-1``."""
    rank = np.arange(topo.world_size, dtype=np.int64)
    stride, out = 1, {}
    for axis in topo.axes_fastest_first:
        out[axis] = (rank // stride) % topo.size(axis)
        stride *= topo.size(axis)
    return out["pp"], out["dp"], out["tp"]


def stage_relative_scores(topo: Topology, own_ns: Mapping[int, float] | np.ndarray) -> np.ndarray:
    """Own-work time of each rank relative to the median of the rest of its stage.

    Returns a length-``world`` array, NaN for ranks without a (positive) own time.
    """
    own = per_rank(own_ns, topo.world_size, np.nan)
    valid = np.isfinite(own) & (own > 0)
    stage = rank_coords(topo)[0]
    scores = np.full(topo.world_size, np.nan)
    for s in range(topo.pp):
        idx = np.flatnonzero(valid & (stage == s))
        if idx.size == 0:
            continue
        vals = own[idx]
        if idx.size == 1:
            ref = vals
        elif idx.size <= SMALL_STAGE:  # small stage: exclude the rank itself from its reference
            ref = np.array([np.median(np.delete(vals, i)) for i in range(idx.size)])
        else:  # one rank barely moves the median of many
            ref = np.full(idx.size, np.median(vals))
        scores[idx] = np.round(np.where(ref > 0, vals / np.where(ref > 0, ref, 1.0), 1.0), 4)
    return scores


def rank_states(
    topo: Topology,
    scores: Mapping[int, float] | np.ndarray,
    last_steps: Mapping[int, int] | np.ndarray,
    heartbeats: pd.DataFrame,
    inflight: pd.DataFrame,
    now_ns: int,
    stall_s: float,
    heartbeat_timeout_s: float,
    live: bool = True,
) -> tuple[list[str], dict[int, dict[str, Any]]]:
    """State of every rank (``ok``, ``slow``, ``stuck``, ``dead``, ``missing``) and
    details (heartbeat age, in-flight op, last step) for the ranks not ``ok``.

    ``scores`` and ``last_steps`` are per-rank arrays (NaN / negative where unknown)
    or rank -> value mappings. A rank is ``stuck`` when its latest in-flight record is
    for a step it has not completed and shows it blocked in one op/section for more
    than ``stall_s`` (the record's time minus the time it entered the op), or when it
    is two or more steps behind the job. Heartbeat age only counts while the job is
    ``live`` (running).
    """
    n = topo.world_size
    score = per_rank(scores, n, np.nan)
    last = per_rank(last_steps, n, -1.0)
    last = np.where(np.isfinite(last) & (last >= 0), last, -1).astype(np.int64)
    has_last = last >= 0
    top_step = int(last.max()) if has_last.any() else -1

    hb = _latest_rows(heartbeats, n)
    has_hb = np.zeros(n, dtype=bool)
    hb_age = np.full(n, np.nan)
    hb_alive = np.ones(n, dtype=bool)
    if hb is not None:
        r = hb["rank"].to_numpy(dtype=np.int64)
        has_hb[r] = True
        hb_age[r] = np.round((now_ns - hb["hb_ts_ns"].to_numpy(dtype=np.int64)) / 1e9, 1)
        hb_alive[r] = hb["hb_alive"].to_numpy().astype(bool)

    inf = _latest_rows(inflight, n)
    has_inf = np.zeros(n, dtype=bool)
    blocked = np.zeros(n, dtype=bool)  # in an op of a step it has not completed
    blocked_s = np.zeros(n)
    if inf is not None:
        r = inf["rank"].to_numpy(dtype=np.int64)
        has_inf[r] = True
        kind = inf["if_kind"].astype(str).to_numpy()
        step = inf["if_step"].to_numpy(dtype=np.int64)
        blocked[r] = ~np.isin(kind, ("", "idle")) & (step > last[r])
        blocked_s[r] = np.round((inf["if_ts_ns"].to_numpy(dtype=np.int64) - inf["if_since_ns"].to_numpy(dtype=np.int64)) / 1e9, 1)

    sev = np.full(n, SEVERITY["ok"], dtype=np.int8)
    behind = has_last & (top_step >= 0) & (last < top_step - 1)
    # Lowest precedence first; each later rule overrides the earlier ones.
    sev[behind] = SEVERITY["stuck"]
    sev[np.nan_to_num(score, nan=1.0) >= SLOW_SCORE] = SEVERITY["slow"]
    sev[blocked & (blocked_s > stall_s)] = SEVERITY["stuck"]
    sev[~has_last & ~has_hb & ~has_inf] = SEVERITY["missing"]
    if live:
        sev[has_hb & (~hb_alive | (hb_age > heartbeat_timeout_s))] = SEVERITY["dead"]
    states = np.array(STATES, dtype=object)[sev]

    details: dict[int, dict[str, Any]] = {}
    hb_rows = {int(x["rank"]): x for x in hb.to_dict("records")} if hb is not None else {}
    inf_rows = {int(x["rank"]): x for x in inf.to_dict("records")} if inf is not None else {}
    for r in np.flatnonzero(sev != SEVERITY["ok"]).tolist():
        d: dict[str, Any] = {"state": states[r], "score": None if np.isnan(score[r]) else float(score[r]),
                             "last_step": int(last[r]) if has_last[r] else None}  # fmt: skip
        if has_hb[r]:
            h = hb_rows[r]
            d.update(heartbeat_age_s=float(hb_age[r]), alive=bool(hb_alive[r]), host=str(h["hb_host"]))
        if blocked[r]:
            i = inf_rows[r]
            d["inflight"] = {
                "kind": str(i["if_kind"]), "op": str(i["if_op"]), "group_id": str(i["if_group_id"]),
                "seq": int(i["if_seq"]), "peer": int(i["if_peer"]), "blocked_s": float(blocked_s[r]),
                "step": int(i["if_step"]),
            }  # fmt: skip
        details[r] = d
    return states.tolist(), details


def _latest_rows(df: pd.DataFrame | None, world: int) -> pd.DataFrame | None:
    """The rows of a per-rank frame whose rank is in ``0..world-1`` (None if none)."""
    if df is None or df.empty:
        return None
    r = df["rank"].to_numpy(dtype=np.int64)
    df = df[(r >= 0) & (r < world)]
    return None if df.empty else df


def grid_payload(
    job: str,
    topo: Topology,
    scores: Mapping[int, float] | np.ndarray,
    states: list[str],
    details: dict[int, dict[str, Any]],
    window: tuple[int, int] | None,
    max_cells: int,
    max_details: int = 200,
) -> dict[str, Any]:
    """The JSON body of ``GET /jobs/{job}/grid``: columnar cells, aggregated over DP
    buckets (worst score wins) when the job has more than ``max_cells`` ranks."""
    n = topo.world_size
    dp_bucket = max(1, math.ceil(n / max(1, max_cells)))
    dp_bucket = min(dp_bucket, topo.dp)
    n_dpb = math.ceil(topo.dp / dp_bucket)
    score = per_rank(scores, n, np.nan)
    names = np.asarray(states, dtype=str)
    sev = np.zeros(n, dtype=np.int8)
    for name, level in SEVERITY.items():
        sev[names == name] = level
    pp, dp, tp = rank_coords(topo)
    cell = (pp * n_dpb + dp // dp_bucket) * topo.tp + tp  # sorted cell order = (pp, dp bucket, tp)
    # Representative rank of a cell: the highest score, ties and all-unknown -> lowest rank.
    order = np.lexsort((np.arange(n), -np.nan_to_num(score, nan=-np.inf), cell))
    first = np.ones(n, dtype=bool)
    first[1:] = cell[order][1:] != cell[order][:-1]
    rep = order[first]
    cells = cell[rep]
    worst = np.zeros(cells.max() + 1, dtype=np.int8)
    np.maximum.at(worst, cell, sev)
    rep_score = score[rep]
    score_out = rep_score.astype(object)  # Python floats; None (JSON null) where unknown
    score_out[np.isnan(rep_score)] = None
    counts = np.bincount(sev, minlength=len(STATES))
    top = sorted(details.items(), key=lambda kv: (-SEVERITY[kv[1]["state"]], -(kv[1]["score"] or 0)))
    return {
        "job": job,
        "topology": topo.to_dict(),
        "window": list(window) if window else None,
        "dp_bucket": dp_bucket,
        "score_label": "own work ÷ stage median",
        "slow_score": SLOW_SCORE,
        "cells": {
            "pp": pp[rep].tolist(),
            "dp": (dp[rep] // dp_bucket).tolist(),
            "tp": tp[rep].tolist(),
            "rank": rep.tolist(),
            "score": score_out.tolist(),
            "state": np.array(STATES, dtype=object)[worst[cells]].tolist(),
        },
        "state_counts": {name: int(c) for name, c in zip(STATES, counts) if c},
        "ranks": [{"rank": r, **d} for r, d in top[:max_details]],
    }
