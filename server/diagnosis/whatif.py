"""What-if step-time model: the 1F1B pipeline schedule plus TP and DP sync points.

A :class:`StepProfile` holds per-rank per-micro-batch forward/backward work and the
link times of the TP, PP and DP groups. :func:`simulate_step` plays one step:

* a pipeline *cell* is the TP group of one (dp, pp) coordinate; TP all-reduces inside
  every layer keep its members in lock-step, so a cell's op takes the slowest member's
  work plus the TP link time;
* cells of one pipeline chain run the 1F1B schedule (warm-up forwards, one-forward-
  one-backward, cool-down backwards), ``F(s, m)`` after ``F(s-1, m)`` and ``B(s, m)``
  after ``B(s+1, m)``, each hop paying the p2p link time;
* the gradient all-reduce of stage ``s`` waits for that stage in every DP replica, then
  each rank runs its optimizer.

:func:`whatif` answers "what would the step time be if these ranks (or this group's
link) ran at their peers' median", which is the estimated job slowdown of a straggler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np
import pandas as pd

from fleetscope.topology import Topology

from .breakdown import P2P_OPS, top_level_sections
from .robust import mad_sigma


@dataclass(frozen=True)
class StepProfile:
    """Durations (ns) that determine one training step."""

    topology: Topology
    num_microbatches: int
    fwd_ns: np.ndarray
    """(world_size, num_microbatches) own forward work per rank and micro-batch."""
    bwd_ns: np.ndarray
    """(world_size, num_microbatches) own backward work."""
    pre_ns: np.ndarray
    """(world_size,) work before the first forward (data loading, untimed host work)."""
    post_ns: np.ndarray
    """(world_size,) work after the gradient sync (optimizer)."""
    link_ns: dict[str, float] = field(default_factory=dict)
    """Per group id: link time per op (TP: per forward/backward op; PP: per hop; DP: per step)."""
    schedule: str = "1f1b"
    observed_step_ns: float = 0.0
    """The job's median observed step time over the same steps (0: unknown). The model
    explains only part of it (time no record covers - the OS descheduling a process on
    a loaded host - is not in it); a fix saves its modelled time out of the observed step."""
    noise: float = 0.0
    """Relative step-to-step spread (robust standard deviation of the log) of one rank's
    forward/backward work around its median. Every sync point makes the job pay its
    slowest member's noise, so :func:`whatif` plays noisy steps when this is set."""


def schedule_order(stage: int, num_stages: int, num_mb: int, schedule: str) -> list[tuple[str, int]]:
    """The op order of one pipeline stage: ``[("F", 0), ("F", 1), ("B", 0), ...]``."""
    if schedule == "gpipe":
        return [("F", m) for m in range(num_mb)] + [("B", m) for m in range(num_mb)]
    warm = min(num_stages - 1 - stage, num_mb)
    ops = [("F", m) for m in range(warm)]
    for i in range(num_mb - warm):
        ops += [("F", warm + i), ("B", i)]
    ops += [("B", m) for m in range(num_mb - warm, num_mb)]
    return ops


def simulate_step(p: StepProfile) -> float:
    """Predicted step time (ns) of a profile: the makespan of the step's dependency graph.

    The schedule's dependency structure is the same in every DP replica, so the 1F1B
    event loop runs once with one array lane per replica (the same float operations as
    one loop per replica, :func:`_simulate_step_per_replica`, which is kept for profiles
    holding NaN, where Python's ``max`` and ``np.maximum`` differ)."""
    links = np.fromiter(p.link_ns.values(), dtype=float, count=len(p.link_ns))
    if any(np.isnan(a).any() for a in (p.fwd_ns, p.bwd_ns, p.pre_ns, p.post_ns, links)):
        return _simulate_step_per_replica(p)
    return float(simulate_steps(p, p.fwd_ns[None], p.bwd_ns[None])[0])


def simulate_steps(p: StepProfile, fwd_ns: np.ndarray, bwd_ns: np.ndarray) -> np.ndarray:
    """:func:`simulate_step` of several variants of ``p`` at once, differing only in their
    forward/backward work (``(variants, world_size, num_microbatches)``): one event loop
    with one lane per (variant, DP replica). Returns each variant's step time (ns)."""
    topo, num_mb = p.topology, p.num_microbatches
    num_stages = topo.pp
    k = fwd_ns.shape[0]
    grid, tp_ids, pp_ids = _cells(topo)
    tp_link = np.array([[p.link_ns.get(g, 0.0) for g in row] for row in tp_ids], dtype=float).reshape(
        topo.dp, num_stages)
    pp_link = np.array([p.link_ns.get(g, 0.0) if num_stages > 1 else 0.0 for g in pp_ids], dtype=float)
    f_all = fwd_ns[:, grid].max(axis=3) + tp_link[..., None]  # (k, dp, pp, mb)
    b_all = bwd_ns[:, grid].max(axis=3) + tp_link[..., None]
    clock = [np.broadcast_to(p.pre_ns[grid[:, s]].max(axis=1).astype(float), (k, topo.dp))
             for s in range(num_stages)]
    orders = [schedule_order(s, num_stages, num_mb, p.schedule) for s in range(num_stages)]
    pos = [0] * num_stages
    f_end: dict[tuple[int, int], np.ndarray] = {}
    b_end: dict[tuple[int, int], np.ndarray] = {}
    zero = np.zeros(topo.dp)
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(num_stages):
            while pos[s] < len(orders[s]):
                op, m = orders[s][pos[s]]
                if op == "F":
                    dep = f_end.get((s - 1, m)) if s > 0 else zero
                    dur = f_all[:, :, s, m]
                else:
                    dep = b_end.get((s + 1, m)) if s < num_stages - 1 else f_end.get((s, m))
                    dur = b_all[:, :, s, m]
                if dep is None:
                    break
                hop = pp_link if (op == "F" and s > 0) or (op == "B" and s < num_stages - 1) else zero
                clock[s] = np.maximum(clock[s], dep + hop) + dur
                (f_end if op == "F" else b_end)[(s, m)] = clock[s]
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # cannot happen for a valid schedule; guard against loops
            raise ValueError("pipeline schedule deadlocked")
    out = np.zeros(k)
    stages = rank_stages(topo)
    for s in range(num_stages):
        in_s = stages == s
        if not in_s.any():
            continue
        dp_link = max((p.link_ns.get(topo.group_id("dp", topo.rank(dp=0, pp=s, tp=t)), 0.0)
                       for t in range(topo.tp)), default=0.0)
        sync_end = clock[s].max(axis=1) + dp_link  # (k,)
        out = np.maximum(out, sync_end + float(p.post_ns[in_s].max()))
    return out


def _simulate_step_per_replica(p: StepProfile) -> float:
    """:func:`simulate_step` with one event loop per DP replica (scalar arithmetic)."""
    topo, num_mb = p.topology, p.num_microbatches
    num_stages = topo.pp
    end_post = np.zeros(topo.world_size)
    stage_done: dict[tuple[int, int], float] = {}
    grid, tp_ids, pp_ids = _cells(topo)
    for dp in range(topo.dp):
        cells = [grid[dp, s] for s in range(num_stages)]  # = topo.group_ranks("tp", ...), in order
        tp_link = [p.link_ns.get(tp_ids[dp][s], 0.0) for s in range(num_stages)]
        pp_link = p.link_ns.get(pp_ids[dp], 0.0) if num_stages > 1 else 0.0
        f_dur = [p.fwd_ns[cells[s]].max(axis=0) + tp_link[s] for s in range(num_stages)]
        b_dur = [p.bwd_ns[cells[s]].max(axis=0) + tp_link[s] for s in range(num_stages)]
        clock = [float(p.pre_ns[cells[s]].max()) for s in range(num_stages)]
        orders = [schedule_order(s, num_stages, num_mb, p.schedule) for s in range(num_stages)]
        pos = [0] * num_stages
        f_end: dict[tuple[int, int], float] = {}
        b_end: dict[tuple[int, int], float] = {}
        remaining = sum(len(o) for o in orders)
        while remaining:
            progressed = False
            for s in range(num_stages):
                while pos[s] < len(orders[s]):
                    op, m = orders[s][pos[s]]
                    if op == "F":
                        dep = f_end.get((s - 1, m)) if s > 0 else 0.0
                        dur = f_dur[s][m]
                    else:
                        dep = b_end.get((s + 1, m)) if s < num_stages - 1 else f_end.get((s, m))
                        dur = b_dur[s][m]
                    if dep is None:
                        break
                    hop = pp_link if (op == "F" and s > 0) or (op == "B" and s < num_stages - 1) else 0.0
                    start = max(clock[s], dep + hop)
                    clock[s] = start + dur
                    (f_end if op == "F" else b_end)[(s, m)] = clock[s]
                    pos[s] += 1
                    remaining -= 1
                    progressed = True
            if not progressed:  # cannot happen for a valid schedule; guard against loops
                raise ValueError("pipeline schedule deadlocked")
        for s in range(num_stages):
            stage_done[(dp, s)] = clock[s]
    stages = rank_stages(topo)
    for s in range(num_stages):
        in_s = stages == s
        # the stage's ranks span one DP group per TP index: the max over those is the max over its ranks
        dp_link = max((p.link_ns.get(topo.group_id("dp", topo.rank(dp=0, pp=s, tp=t)), 0.0)
                       for t in range(topo.tp)), default=0.0) if in_s.any() else 0.0
        sync_end = max(stage_done[(dp, s)] for dp in range(topo.dp)) + dp_link
        end_post[in_s] = sync_end + p.post_ns[in_s]
    return float(end_post.max())


@lru_cache(maxsize=16)
def _cells(topo: Topology) -> tuple[np.ndarray, list[list[str]], list[str]]:
    """The pipeline cells of a topology, computed once per topology: ``grid[dp, pp]`` the
    TP group's ranks in group order, and the TP group id per (dp, pp) and the PP group id
    (of tp 0) per dp."""
    stride, strides = 1, {}
    for axis in topo.axes_fastest_first:
        strides[axis] = stride
        stride *= topo.size(axis)
    d, s, t = np.meshgrid(np.arange(topo.dp), np.arange(topo.pp), np.arange(topo.tp), indexing="ij")
    grid = d * strides["dp"] + s * strides["pp"] + t * strides["tp"]
    grid.setflags(write=False)
    tp_ids = [[topo.group_id("tp", int(grid[dp, st, 0])) for st in range(topo.pp)] for dp in range(topo.dp)]
    pp_ids = [topo.group_id("pp", int(grid[dp, 0, 0])) for dp in range(topo.dp)]
    return grid, tp_ids, pp_ids


@lru_cache(maxsize=16)
def _link_stages(topo: Topology) -> dict[str, int]:
    """The pipeline stage of every TP and DP group id of a topology (computed once per
    topology). A TP group of the last stage carries the LM head's extra all-reduces and a
    DP group carries its own stage's gradients, so only groups of one axis *and* one
    stage are peers; PP groups (one per chain, spanning the stages) are not listed."""
    grid, tp_ids, _ = _cells(topo)
    out = {g: st for row in tp_ids for st, g in enumerate(row)}
    for st in range(topo.pp):
        for t in range(topo.tp):
            out[topo.group_id("dp", int(grid[0, st, t]))] = st
    return out


def _link_peer_class(topo: Topology, group_id: str) -> tuple[str, int]:
    """(axis, stage) of a group id; stage -1 for groups of no one stage (PP chains,
    the world group, group ids the topology does not name)."""
    return group_id.split(".")[0], _link_stages(topo).get(group_id, -1)


def rank_stages(topo: Topology) -> np.ndarray:
    """``topo.stage(r)`` of every rank, as one array (vectorised :meth:`Topology.coords`)."""
    rest = np.arange(topo.world_size)
    for axis in topo.axes_fastest_first:
        n = topo.size(axis)
        if axis == "pp":
            return rest % n
        rest = rest // n
    raise ValueError("topology without a pp axis")


def peer_ranks(topo: Topology, rank: int) -> list[int]:
    """Ranks with comparable work: the same pipeline stage, excluding ``rank``."""
    return [r for r in topo.ranks() if topo.stage(r) == topo.stage(rank) and r != rank]


def fix_ranks(p: StepProfile, ranks: list[int], exclude: set[int] | None = None) -> StepProfile:
    """The profile with ``ranks`` running at the median of their stage peers outside
    ``exclude`` (default: outside ``ranks``)."""
    fwd, bwd, pre, post = p.fwd_ns.copy(), p.bwd_ns.copy(), p.pre_ns.copy(), p.post_ns.copy()
    bad = set(ranks) if exclude is None else set(exclude)
    mats = (p.fwd_ns, p.bwd_ns, p.pre_ns, p.post_ns)
    if not any(np.isnan(m).any() for m in mats):
        _fix_ranks_vectorised(p, ranks, bad, (fwd, bwd, pre, post))
        return replace(p, fwd_ns=fwd, bwd_ns=bwd, pre_ns=pre, post_ns=post)
    for r in ranks:
        peers = [q for q in peer_ranks(p.topology, r) if q not in bad]
        if not peers:
            continue
        fwd[r] = np.median(p.fwd_ns[peers], axis=0)
        bwd[r] = np.median(p.bwd_ns[peers], axis=0)
        pre[r] = np.median(p.pre_ns[peers])
        post[r] = np.median(p.post_ns[peers])
    return replace(p, fwd_ns=fwd, bwd_ns=bwd, pre_ns=pre, post_ns=post)


def _fix_ranks_vectorised(p: StepProfile, ranks: list[int], bad: set[int], out) -> None:
    """:func:`fix_ranks` per stage with arrays (same medians, O(ranks log ranks)): a rank
    in ``bad`` gets the median of its stage's ranks outside ``bad``; a rank outside it
    the median of those others (a leave-one-out median)."""
    from .stragglers import _loo_median

    n = p.topology.world_size
    stages = rank_stages(p.topology)
    want = np.zeros(n, dtype=bool)
    rs = np.asarray([int(r) for r in ranks], dtype=np.int64)
    if rs.size == 0:
        return
    want[rs] = True
    is_bad = np.zeros(n, dtype=bool)
    bad_idx = [int(r) for r in bad if 0 <= int(r) < n]
    is_bad[bad_idx] = True
    src = (p.fwd_ns, p.bwd_ns, p.pre_ns, p.post_ns)
    for s in np.unique(stages[rs]):
        pool = np.nonzero((stages == s) & ~is_bad)[0]
        if pool.size == 0:
            continue
        targets_bad = np.nonzero((stages == s) & want & is_bad)[0]
        targets_pool = np.nonzero(want[pool])[0]  # positions in pool
        for a, dst in zip(src, out):
            sub = a[pool] if a.ndim == 2 else a[pool][:, None]
            if targets_bad.size:
                med = np.median(sub, axis=0)
                dst[targets_bad] = med if a.ndim == 2 else med[0]
            if targets_pool.size and pool.size > 1:
                loo = _loo_median(sub)[targets_pool]
                dst[pool[targets_pool]] = loo if a.ndim == 2 else loo[:, 0]


def fix_group(p: StepProfile, group_id: str) -> StepProfile:
    """The profile with one group's link time set to the median of its peer groups: the
    other groups of its axis at its pipeline stage (:func:`_link_peer_class`), or of its
    axis when it has none there."""
    mine = _link_peer_class(p.topology, group_id)
    others = [v for g, v in p.link_ns.items()
              if g != group_id and _link_peer_class(p.topology, g) == mine]
    if not others:
        others = [v for g, v in p.link_ns.items()
                  if g != group_id and g.split(".")[0] == mine[0]]
    if not others:
        return p
    links = dict(p.link_ns)
    links[group_id] = float(np.median(others))
    return replace(p, link_ns=links)


def typical(p: StepProfile, keep_ranks: Sequence[int] = (), keep_groups: Sequence[str] = ()) -> StepProfile:
    """The profile with every rank outside ``keep_ranks`` at the median of its stage's
    ranks outside ``keep_ranks``, and every link outside ``keep_groups`` at the median of
    its peer groups (its axis at its stage, :func:`_link_peer_class`): per-rank medians
    over a few steps still carry noise (one rank a little slower by chance sets a
    pipeline cell's pace), which would otherwise hide or inflate what the suspects alone
    cost."""
    keep = set(keep_ranks)
    fixed = fix_ranks(p, [r for r in p.topology.ranks() if r not in keep], exclude=keep)
    links = dict(fixed.link_ns)
    classes: dict[tuple[str, int], list[str]] = {}
    for g in links:
        classes.setdefault(_link_peer_class(p.topology, g), []).append(g)
    for mine in classes.values():
        base = [links[g] for g in mine if g not in keep_groups] or [links[g] for g in mine]
        med = float(np.median(base))
        for g in mine:
            if g not in keep_groups:
                links[g] = med
    return replace(fixed, link_ns=links)


@dataclass(frozen=True)
class WhatIf:
    predicted_step_ns: float
    fixed_step_ns: float
    observed_step_ns: float = 0.0

    @property
    def saved_ns(self) -> float:
        return max(self.predicted_step_ns - self.fixed_step_ns, 0.0)

    @property
    def slowdown(self) -> float:
        """Fractional job slowdown caused by what was fixed (0.1 = 10% longer steps): the
        modelled saving over the observed step time without it (over the modelled step
        when the observed one is unknown or shorter)."""
        base = self.observed_step_ns if self.observed_step_ns > self.predicted_step_ns else self.predicted_step_ns
        return max(self.saved_ns / max(base - self.saved_ns, 1.0), 0.0)


NOISE_DRAWS = 8
"""Noisy steps :func:`whatif` plays per question (the same draws with and without the fix)."""


def noise_factors(p: StepProfile, draws: int = NOISE_DRAWS, seed: int = 0) -> np.ndarray | None:
    """``(2, draws, world_size, num_microbatches)`` log-normal factors of ``p.noise`` for
    the forward and backward work (``None`` when the profile has no noise). A fixed seed
    gives every question about one job the same draws."""
    if p.noise <= 0.0 or draws <= 0:
        return None
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((2, draws, *p.fwd_ns.shape), dtype=np.float32)
    return np.exp(np.float32(p.noise) * z, out=z)


def expected_step(p: StepProfile, factors: np.ndarray | None) -> float:
    """The mean step time over noisy steps: the profile's forward/backward medians times
    ``factors`` (:func:`noise_factors`; the profile's own step when ``None``). The draws
    share one event loop (:func:`simulate_steps`)."""
    if factors is None or np.isnan(p.fwd_ns).any() or np.isnan(p.bwd_ns).any():
        return simulate_step(p)
    return float(simulate_steps(p, p.fwd_ns[None] * factors[0], p.bwd_ns[None] * factors[1]).mean())


def whatif(p: StepProfile, ranks: list[int] | None = None, group_id: str = "",
           suspects: list[int] | None = None) -> WhatIf:
    """Step time as observed vs with ``ranks`` (and/or ``group_id``'s link) at peer median.

    With ``suspects`` (the ranks every current finding names, ``[]`` for none) the
    question is asked of the *typical* job (:func:`typical`: everyone else at their
    stage's median, ``group_id`` and the suspects as observed): what these ranks or this
    link cost by themselves, not what the window's noise happened to put on the path.
    """
    if suspects is not None:
        p = typical(p, keep_ranks=sorted(set(suspects) | set(ranks or [])),
                    keep_groups=[group_id] if group_id else [])
    fixed = fix_ranks(p, ranks) if ranks else p
    if group_id:
        fixed = fix_group(fixed, group_id)
    factors = noise_factors(p)  # the same noisy steps with and without the fix
    return WhatIf(expected_step(p, factors), expected_step(fixed, factors), p.observed_step_ns)


def op_noise(log_ratios: np.ndarray) -> float:
    """:attr:`StepProfile.noise` from the logs of every (rank, step, micro-batch) forward or
    backward work over its (rank, micro-batch) median: their robust spread about 0 (0.0
    with fewer than 8 of them)."""
    x = np.asarray(log_ratios, dtype=float)
    x = x[np.isfinite(x)]
    return mad_sigma(x, 0.0) if x.size >= 8 else 0.0


def profile_from_frames(
    topo: Topology,
    num_microbatches: int,
    breakdown: pd.DataFrame,
    sections: pd.DataFrame,
    arrivals: pd.DataFrame,
    schedule: str = "1f1b",
) -> StepProfile:
    """Build a profile from observed frames: per-rank medians over the steps given.

    ``breakdown``/``arrivals`` come from :func:`breakdown.rank_step_breakdown`;
    ``sections`` is the raw sections frame (forward/backward per micro-batch).
    """
    n, num_mb = topo.world_size, max(int(num_microbatches), 1)
    fwd, bwd = np.zeros((n, num_mb)), np.zeros((n, num_mb))
    noise = 0.0
    nsteps = max(breakdown["step"].nunique(), 1) if not breakdown.empty else 1
    if not sections.empty:
        sec = top_level_sections(sections)
        comm = arrivals[["rank", "enqueued_ns", "excl_ns"]] if not arrivals.empty else arrivals
        from .breakdown import nested_comm_ns

        sec = sec.assign(net_ns=np.maximum(sec["duration_ns"].to_numpy() - nested_comm_ns(sec, comm), 0))
        spreads: list[np.ndarray] = []
        for name, target in (("forward", fwd), ("backward", bwd)):
            s = sec[sec["name"] == name]
            if s.empty:
                continue
            mb = s["microbatch"].clip(lower=0) % num_mb
            per_step = s.assign(mb=mb).groupby(["rank", "step", "mb"])["net_ns"].sum()
            med = per_step.groupby(["rank", "mb"]).median()
            for (r, m), v in med.items():
                if 0 <= r < n:
                    target[int(r), int(m)] = v
            own = per_step.to_numpy(dtype=float)
            ref = med.reindex(per_step.index.droplevel("step")).to_numpy(dtype=float)
            ok = (own > 0) & (ref > 0)
            spreads.append(np.log(own[ok] / ref[ok]))
        noise = op_noise(np.concatenate(spreads) if spreads else np.zeros(0))
    pre, post = np.zeros(n), np.zeros(n)
    if not breakdown.empty:
        med = breakdown.groupby("rank")[["dataloader_ns", "untimed_ns", "other_ns", "optimizer_ns"]].median()
        r = med.index.to_numpy().astype(np.int64)
        ok = (r >= 0) & (r < n)
        col = {c: med[c].to_numpy(dtype=float)[ok] for c in ("dataloader_ns", "untimed_ns", "other_ns",
                                                               "optimizer_ns")}
        pre[r[ok]] = col["dataloader_ns"] + col["untimed_ns"] + col["other_ns"]
        post[r[ok]] = col["optimizer_ns"]
    links: dict[str, float] = {}
    if not arrivals.empty:
        per_op = arrivals.groupby(["group_id", "axis", "step", "seq", "op"], as_index=False)["transfer_ns"].min()
        per_op = per_op[~per_op["op"].isin({"send", "isend"})]
        tot = per_op.groupby(["group_id", "axis"])["transfer_ns"].sum() / nsteps
        for (gid, axis), v in tot.items():
            if axis == "tp":
                links[gid] = float(v) / (2 * num_mb)
            elif axis == "pp":
                links[gid] = float(v) / (2 * num_mb * max(topo.pp - 1, 1))
            else:
                links[gid] = float(v)
    observed = 0.0
    if not breakdown.empty:
        observed = float(breakdown.groupby("step")["step_ns"].max().median())
    return StepProfile(topo, num_mb, fwd, bwd, pre, post, links, schedule, observed, noise)


__all__ = ["P2P_OPS", "StepProfile", "WhatIf", "fix_group", "fix_ranks", "peer_ranks",
           "profile_from_frames", "rank_stages", "expected_step", "noise_factors", "op_noise", "schedule_order", "simulate_step", "simulate_steps", "typical", "whatif"]
