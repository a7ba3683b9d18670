"""Per-rank state and straggler score for the 3D topology grid.

The score is a rank's median own work (step time minus communication) over the window
divided by the median of the other ranks of its pipeline stage (stages do different
work). The state combines liveness (heartbeats), what the rank is blocked in (in-flight
records) and progress (last step) so a hang shows who is stuck before any detector ran.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from fleetscope.topology import Topology

SLOW_SCORE = 1.10
"""Score from which a rank is drawn as ``slow`` (10% more own work than its stage)."""


def stage_relative_scores(topo: Topology, own_ns: dict[int, float]) -> dict[int, float]:
    """Own-work time of each rank relative to the median of the rest of its stage."""
    by_stage: dict[int, list[tuple[int, float]]] = {}
    for r, v in own_ns.items():
        if v is not None and v == v and v > 0:
            by_stage.setdefault(topo.stage(r), []).append((r, float(v)))
    scores: dict[int, float] = {}
    for members in by_stage.values():
        ranks = np.array([r for r, _ in members])
        vals = np.array([v for _, v in members])
        if len(vals) <= 64:  # small stage: exclude the rank itself from its reference
            ref = np.array([np.median(np.delete(vals, i)) if len(vals) > 1 else vals[0] for i in range(len(vals))])
        else:  # one rank barely moves the median of many
            ref = np.full(len(vals), np.median(vals))
        ratio = np.where(ref > 0, vals / np.where(ref > 0, ref, 1.0), 1.0)
        scores.update(zip(ranks.tolist(), np.round(ratio, 4).tolist()))
    return scores


def rank_states(
    topo: Topology,
    scores: dict[int, float],
    last_steps: dict[int, int],
    heartbeats: pd.DataFrame,
    inflight: pd.DataFrame,
    now_ns: int,
    stall_s: float,
    heartbeat_timeout_s: float,
    live: bool = True,
) -> tuple[list[str], dict[int, dict[str, Any]]]:
    """State of every rank (``ok``, ``slow``, ``stuck``, ``dead``, ``missing``) and
    details (heartbeat age, in-flight op, last step) for the ranks not ``ok``.

    A rank is ``stuck`` when its latest in-flight record is for a step it has not
    completed and shows it blocked in one op/section for more than ``stall_s`` (the
    record's time minus the time it entered the op), or when it is two or more steps
    behind the job. Heartbeat age only counts while the job is ``live`` (running).
    """
    hb = {int(r["rank"]): r for r in heartbeats.to_dict("records")} if not heartbeats.empty else {}
    inf = {int(r["rank"]): r for r in inflight.to_dict("records")} if not inflight.empty else {}
    top_step = max(last_steps.values()) if last_steps else -1
    states: list[str] = []
    details: dict[int, dict[str, Any]] = {}
    for r in topo.ranks():
        d: dict[str, Any] = {"last_step": last_steps.get(r)}
        h = hb.get(r)
        if h is not None:
            d["heartbeat_age_s"] = round((now_ns - int(h["hb_ts_ns"])) / 1e9, 1)
            d["alive"] = bool(h["hb_alive"])
            d["host"] = str(h["hb_host"])
        i = inf.get(r)
        if i is not None and str(i["if_kind"]) not in ("", "idle"):
            d["inflight"] = {
                "kind": str(i["if_kind"]),
                "op": str(i["if_op"]),
                "group_id": str(i["if_group_id"]),
                "seq": int(i["if_seq"]),
                "peer": int(i["if_peer"]),
                "blocked_s": round((int(i["if_ts_ns"]) - int(i["if_since_ns"])) / 1e9, 1),
                "step": int(i["if_step"]),
            }
            if int(i["if_step"]) <= last_steps.get(r, -1):
                del d["inflight"]  # the rank finished that step since: not blocked any more
        if live and h is not None and (not d["alive"] or d["heartbeat_age_s"] > heartbeat_timeout_s):
            state = "dead"
        elif r not in last_steps and h is None and i is None:
            state = "missing"
        elif "inflight" in d and d["inflight"]["blocked_s"] > stall_s:
            state = "stuck"
        elif scores.get(r, 1.0) >= SLOW_SCORE:
            state = "slow"
        elif top_step >= 0 and last_steps.get(r, top_step) < top_step - 1:
            state = "stuck"
        else:
            state = "ok"
        states.append(state)
        if state != "ok":
            details[r] = {"state": state, "score": scores.get(r), **d}
    return states, details


def grid_payload(
    job: str,
    topo: Topology,
    scores: dict[int, float],
    states: list[str],
    details: dict[int, dict[str, Any]],
    window: tuple[int, int] | None,
    max_cells: int,
    max_details: int = 200,
) -> dict[str, Any]:
    """The JSON body of ``GET /jobs/{job}/grid``: columnar cells, aggregated over DP
    buckets (worst score wins) when the job has more than ``max_cells`` ranks."""
    dp_bucket = max(1, math.ceil(topo.world_size / max(1, max_cells)))
    dp_bucket = min(dp_bucket, topo.dp)
    severity = {"ok": 0, "slow": 1, "missing": 2, "stuck": 3, "dead": 4}
    agg: dict[tuple[int, int, int], dict[str, Any]] = {}
    for r, c in topo.iter_coords():
        key = (c.pp, c.dp // dp_bucket, c.tp)
        s = scores.get(r)
        st = states[r]
        cur = agg.get(key)
        if cur is None:
            agg[key] = {"rank": r, "score": s, "state": st}
            continue
        if s is not None and (cur["score"] is None or s > cur["score"]):
            cur["score"], cur["rank"] = s, r
        if severity[st] > severity[cur["state"]]:
            cur["state"] = st
    keys = sorted(agg)
    counts: dict[str, int] = {}
    for st in states:
        counts[st] = counts.get(st, 0) + 1
    worst = sorted(details.items(), key=lambda kv: (-severity[kv[1]["state"]], -(kv[1]["score"] or 0)))
    return {
        "job": job,
        "topology": topo.to_dict(),
        "window": list(window) if window else None,
        "dp_bucket": dp_bucket,
        "score_label": "own work ÷ stage median",
        "slow_score": SLOW_SCORE,
        "cells": {
            "pp": [k[0] for k in keys],
            "dp": [k[1] for k in keys],
            "tp": [k[2] for k in keys],
            "rank": [agg[k]["rank"] for k in keys],
            "score": [agg[k]["score"] for k in keys],
            "state": [agg[k]["state"] for k in keys],
        },
        "state_counts": counts,
        "ranks": [{"rank": r, **d} for r, d in worst[:max_details]],
    }
