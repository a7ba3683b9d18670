"""Straggler detection: ranks (or links) that persistently slow the job.

Method (no per-scenario tuning; every threshold comes from the data's own noise):

1. Per rank and step, the *busy* time = step time minus communication time (the rank's
   own work), split into compute / data loading / optimizer / untimed host work, each
   net of the communication nested in it (:mod:`.breakdown`).
2. Each rank is compared with ranks that do comparable work: the same pipeline stage
   (the first and last stages do extra work). The reference is the median of the
   *other* ranks of the stage at the same step, so one straggler cannot move it. A
   stage with a single rank is compared with its own earlier steps.
3. The per-step log ratio rank/reference has a noise scale sigma = 1.4826 x MAD over all
   rank-steps of the window. A rank is a *persistent* straggler when the median of its
   recent log ratios exceeds ``z`` standard errors of a median and a minimum effect,
   and most recent steps are above half of that.
4. The kind is the component that explains most of the excess; intermittent spikes
   far above the noise on one rank (and not its peers) are *GC-like pauses*.
5. Links: per group, the time from the last member's arrival to completion is compared
   with the other groups of the same axis in the same way (slow link when members'
   own work is normal).
6. The estimated job slowdown is a what-if over the pipeline schedule
   (:mod:`.whatif`): predicted step time now vs with the culprit at its peers' median.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
import pandas as pd

from fleetscope.topology import Topology

from .breakdown import group_transfer
from .findings import Finding, FindingKind, Severity, as_secondary, finding_cost
from .robust import MAD_TO_SIGMA, MEDIAN_SE_FACTOR, diff_sigma, mad_sigma, row_median
from .sequential import CusumConfig, CusumResult, cusum
from .whatif import StepProfile, rank_stages, whatif

COMPONENT_KIND = {
    "compute_ns": FindingKind.SLOW_COMPUTE,
    "optimizer_ns": FindingKind.SLOW_COMPUTE,
    "dataloader_ns": FindingKind.SLOW_DATALOADER,
    "untimed_ns": FindingKind.LATE_ARRIVAL,
    "other_ns": FindingKind.LATE_ARRIVAL,
    "compute_cpu_ns": FindingKind.SLOW_COMPUTE,
}
STRAGGLER_KINDS = frozenset(COMPONENT_KIND.values()) | {FindingKind.HOST_CONTENTION}
SMALL_PARTS = ("dataloader_ns", "optimizer_ns")
"""Parts of a step that are a few % of it (:attr:`StragglerConfig.component_min_factor`)."""
MEASURED = ("compute_ns", "dataloader_ns", "optimizer_ns", "untimed_ns", "compute_cpu_ns")
"""Components tested on their own (``other_ns`` - e.g. a gradient-sync section net of
its communication - is too small and noisy to judge alone). ``compute_cpu_ns`` (the
compute sections' thread CPU time, measured where the device is the CPU) only where some
rank has it."""
CPU_COMPONENT = "compute_cpu_ns"
"""Compute measured by the CPU time of the thread that ran it: the same component as
``compute_ns`` on a clock that the time a rank waited for a core or for its peers does
not move (a CPU device's counterpart of CUDA-event device time). Where it names the rank,
a compute finding's ``factor`` is read from it; whether the excess is material is judged
on the wall-clock compute excess, which is what the step pays."""
COMPONENT_NAME = {
    "compute_ns": "compute",
    "compute_cpu_ns": "compute (CPU time)",
    "optimizer_ns": "optimizer",
    "dataloader_ns": "data loading",
    "untimed_ns": "untimed host work",
    "other_ns": "other timed host work",
}
"""The operator's word for each component of own work (``Finding.component``)."""


@dataclass(frozen=True)
class StragglerConfig:
    window_steps: int = 24
    """Steps used for the noise estimate and the GC-pause count."""
    recent_steps: int = 8
    """Steps a slowdown must persist over to be reported."""
    min_steps: int = 6
    """No verdict before this many complete steps."""
    z: float = 4.0
    """Standard errors above the noise a persistent excess must reach."""
    min_effect: float = 0.03
    """Smallest relative excess of a rank's own work reported (3%)."""
    persist_frac: float = 0.75
    """Fraction of recent steps that must show the excess."""
    spike_z: float = 4.0
    """A GC-like spike is this many sigmas above the reference..."""
    spike_min_effect: float = 0.15
    """...and at least this much relative excess."""
    min_spikes: int = 3
    top_steps: int = 12
    """Steps of the distribution-free 'slowest of its stage' test on each component..."""
    top_alpha: float = 1e-4
    """...and its significance level."""
    link_min_effect: float = 0.5
    """Smallest relative excess of a group's link time reported (50%)..."""
    link_min_step_frac: float = 0.02
    """...that also costs at least this fraction of the step time."""
    scan_min_steps: int = 3
    """Sequential test: the shortest run of latest steps a slowdown is judged on. (5 was
    tried, 2bd5894: a 3-step stall of one rank's data loader was no longer named, but a
    stalled data loader's finding then came a pass after the MFU drop it causes, which
    opened an incident of its own; reverted.)"""
    scan_z: float = 4.5
    """Sequential test: standard errors above the noise over the run (higher than ``z``:
    every run length from ``scan_min_steps`` to the window is tried)."""
    component_min_factor: float = 1.5
    """A slow data loader or optimizer (``SMALL_PARTS``) whose median is at least this
    factor of its stage peers' is reported when its excess costs ``min_step_frac`` of the
    step, below the own-work floor (``min_effect``): such a part is a few % of a step, so
    even a 2-3x slow one stayed under 3% of the rank's own work and was never named."""
    levels: tuple[float, ...] = (1.03, 1.06, 1.1, 1.2, 1.4, 2.0)
    """Sequential exceedance test: slowdown levels (ratios to the peers' median)..."""
    level_alpha: float = 1e-6
    """...a run whose count of steps above a level is this unlikely under the other
    ranks' rate of exceeding it (binomial tail) is a straggler."""
    min_step_frac: float = 0.01
    """A straggler's excess must also cost at least this fraction of the step time."""
    spike_alpha: float = 1e-3
    """GC-like pauses: a rank's spike count must be this unlikely under the other ranks'
    spike rate (Poisson), so machine-load spikes scattered over ranks name nobody."""
    off_cpu_share: float = 0.5
    """GC-like pauses, where the sections' CPU clock is measured: when this share of the
    spikes' excess own work is compute time spent off the CPU (wall minus CPU clock, beyond
    the peers') and the CPU clock shows no spike, the host took the rank's core away - a
    noisy neighbour, not the rank's own pause (a collector runs on the CPU) - and no
    ``gc_pause`` is reported."""
    descheduled_share: float = 0.25
    """A finding on host work no CPU clock of its own measures (untimed or other work; the
    optimizer where its sections' CPU time is missing) is the host's (``host_contention``)
    when the rank's compute spent at least this share of its expected part of the excess
    off the CPU at its peers' CPU time (:func:`_descheduled_around`). A quarter, not a
    half: the wait for a core lands unevenly, more of it in the gaps after a blocking op
    than inside the compute sections (on 2 loaded cores, a pipeline rank's untimed gaps of
    35-180 ms a step beside forward and backward sections of 3-5 ms CPU time; the two
    such false findings of one suite run were at 0.38 and, by sums over the steps, about
    0.48 of the even share)."""
    two_state_separation: float = 4.0
    """Intermittent slowdowns: a finding's judged steps split into healthy and slow ones
    when the two groups' means are this many standard deviations apart (Ashman's D, each
    group's spread at least the typical rank's step-to-step noise) and the healthy group
    sits at its peers' level; the factor is then the slow steps' (:func:`_two_state`)."""
    two_state_min_steps: int = 3
    """...each group at least this many steps."""
    recovery_z: float = 4.0
    """A named rank whose latest steps (at least ``two_state_min_steps``) run at its
    peers' pace again, below its earlier steps by this many standard errors, has
    recovered: its finding is judged on the slow steps and says since when it is back
    (:func:`_recovered`)."""
    cusum: CusumConfig = CusumConfig()
    """The CUSUM test (:mod:`.sequential`) run beside the scans on own work and each
    measured component: drift ln 1.1, false-alarm rate 1e-4 per step at 12,288 ranks."""
    confirm_steps: int = 1
    """A rank finding judged on fewer than ``recent_steps`` steps must also be named on the
    window that ends this many steps earlier (the same detector on the steps before the
    latest): a short run that one more step can make or break is not yet a straggler. On a
    loaded host a rank's clocks jump for 2-4 steps at a time (its steps are not independent),
    and a pass that happened to end inside such a burst named it. Replayed with a pass after
    every step (``bench/straggler_replay.py suite``), the clean twins of the suite run of
    2026-12-07 with a straggler finding went from 7 of 38 to 5 (2 of them a pinned rank's
    real asymmetry), at one step more from onset to naming (median 5). 0: off."""


def stage_log_ratios(topo: Topology, bd: pd.DataFrame, column: str = "compute_ns",
                     window_steps: int = 0) -> tuple[list[int], list[int], np.ndarray, float]:
    """The detector's input for one component, for benches and checks by hand: (ranks,
    steps, per-step log ratio of each rank to the median of its other stage peers, the
    pooled robust noise scale of those ratios) over the latest ``window_steps`` complete
    steps (all when 0)."""
    bd = bd[bd["rank"].between(0, topo.world_size - 1)]
    bd = _window(bd, window_steps or int(bd["step"].nunique()))
    steps = sorted(bd["step"].unique().tolist())
    ranks = sorted(bd["rank"].unique().tolist())
    if not ranks or not steps:
        return ranks, steps, np.zeros((len(ranks), len(steps))), 0.0
    groups = _stage_groups(topo, ranks)
    x = _Grid(bd, ranks, steps).matrix(column)
    lr = _log_ratio(x, _reference(x, list(groups.values())))
    return ranks, steps, lr, _robust_sigma(lr)


def _stage_groups(topo: Topology, ranks: list[int]) -> dict[int, list[int]]:
    """Pipeline stage -> positions in ``ranks`` (sorted) of its ranks, stages in the order
    their first rank appears."""
    stages = rank_stages(topo)[np.asarray(ranks, dtype=np.int64)]
    if stages.size == 0:
        return {}
    uniq, first = np.unique(stages, return_index=True)
    return {int(st): np.nonzero(stages == st)[0].tolist() for st in uniq[np.argsort(first)]}


def _window(bd: pd.DataFrame, n: int) -> pd.DataFrame:
    """The rows of the latest ``n`` steps that have as many distinct ranks as the fullest
    step."""
    counts = _ranks_per_step(bd)
    full = counts[counts >= counts.max()].index.sort_values()
    return bd[bd["step"].isin(full[-n:])]


def _ranks_per_step(bd: pd.DataFrame) -> pd.Series:
    """``bd.groupby("step")["rank"].nunique()``: for integer steps and ranks over a compact
    range (a window of a job: a few dozen steps x its ranks) by one ``np.bincount`` of
    (step, rank) cells, several times faster at 12,288 ranks."""
    step, rank = bd["step"], bd["rank"]
    if len(bd) and pd.api.types.is_integer_dtype(step.dtype) and pd.api.types.is_integer_dtype(rank.dtype):
        st, rk = step.to_numpy(dtype=np.int64), rank.to_numpy(dtype=np.int64)
        s0, r0 = int(st.min()), int(rk.min())
        num_steps, num_ranks = int(st.max()) - s0 + 1, int(rk.max()) - r0 + 1
        if num_steps * num_ranks <= 4 * len(bd) + 1024:
            cells = np.bincount((st - s0) * num_ranks + (rk - r0), minlength=num_steps * num_ranks)
            per_step = (cells.reshape(num_steps, num_ranks) > 0).sum(axis=1)
            seen = np.bincount(st - s0, minlength=num_steps) > 0
            return pd.Series(per_step[seen], index=pd.Index(np.nonzero(seen)[0] + s0, name="step"), name="rank")
    return bd.groupby("step")["rank"].nunique()


class _Grid:
    """Rows of a (rank, step) frame laid out on a ranks x steps matrix (sum per cell)."""

    def __init__(self, bd: pd.DataFrame, ranks: list[int], steps: list[int]) -> None:
        self.shape = (len(ranks), len(steps))
        ri = pd.Index(ranks).get_indexer(bd["rank"])
        si = pd.Index(steps).get_indexer(bd["step"])
        keep = (ri >= 0) & (si >= 0)
        self.bd, self.ri, self.si = bd, ri[keep], si[keep]
        self.keep = keep
        self.flat = self.ri * self.shape[1] + self.si

    def matrix(self, col: str) -> np.ndarray:
        # bincount: the per-cell sums of ``np.add.at``, an order of magnitude faster
        w = self.bd[col].to_numpy(dtype=float)[self.keep]
        return np.bincount(self.flat, weights=w, minlength=self.shape[0] * self.shape[1]).reshape(self.shape)


def _reference(x: np.ndarray, groups: list[list[int]]) -> np.ndarray:
    """Leave-one-out median of each row's comparison group, per column.

    Vectorised (O(m) per group of m rows, not O(m^2)): leaving out one value shifts the
    column's order statistics at or after it by one, so the median of the other m - 1
    values is one of the two or three order statistics around the column's middle (the
    same value, or mean of two, that ``np.median`` returns), :func:`_loo_median`."""
    ref = np.empty_like(x)
    for members in groups:
        sub = x[members]
        if len(members) > 1 and not np.isnan(sub).any():
            ref[members] = _loo_median(sub)
            continue
        for i in members:
            peers = [j for j in members if j != i]
            if peers:
                ref[i] = np.median(x[peers], axis=0)
            else:  # alone in its stage: its own first half as the baseline
                half = max(x.shape[1] // 2, 1)
                ref[i] = np.median(x[i, :half])
    return ref


def _loo_median(sub: np.ndarray) -> np.ndarray:
    """Per column of ``sub`` (m x k, m >= 2), for each row the median of the column's
    other m - 1 values.

    The j-th order statistic of the others is the column's (j + 1)-th when the row's
    value is at or below the column's j-th (it is among the lowest j + 1, or ties the
    j-th, which then equals the (j + 1)-th), else the j-th: only the two or three order
    statistics around the middle are needed, which one ``np.partition`` of the
    transposed (contiguous) columns selects. With NaN (which compares false) or a
    negative zero (which ties with +0.0, where only the sort's stable order says which
    of the two a tie yields) it takes the sorting route, :func:`_loo_median_sorted`."""
    m = sub.shape[0]
    if m < 2 or np.isnan(sub).any() or (np.signbit(sub).any() and (np.signbit(sub) & (sub == 0)).any()):
        return _loo_median_sorted(sub)
    n = m - 1
    lo = n // 2 - 1 if n % 2 == 0 else n // 2  # the lower (or only) middle order statistic
    kth = list(range(lo, n // 2 + 2))  # lo, ..., the upper middle + 1: two or three of them
    part = sub.T.copy(order="C")  # a copy even where sub.T is contiguous (one column)
    part.partition(kth, axis=1)

    def stat(j: int) -> np.ndarray:  # j-th order statistic of the others, per (row, column)
        at, after = part[:, j], part[:, j + 1]
        return np.where(sub <= at, after, at)

    if n % 2:
        return stat(n // 2)
    return (stat(n // 2 - 1) + stat(n // 2)) / 2


def _loo_median_sorted(sub: np.ndarray) -> np.ndarray:
    """:func:`_loo_median` by sorting each column: each row's rank in its column shifts
    the order statistics at or after it by one (NaN sorts last)."""
    m = sub.shape[0]
    order = np.argsort(sub, axis=0, kind="stable")
    srt = np.take_along_axis(sub, order, axis=0)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(m)[:, None].repeat(sub.shape[1], axis=1), axis=0)
    cols = np.arange(sub.shape[1])[None, :]

    def stat(j: int) -> np.ndarray:  # j-th order statistic of the others, per (row, column)
        return srt[j + (pos <= j), cols]

    n = m - 1
    if n % 2:
        return stat(n // 2)
    return (stat(n // 2 - 1) + stat(n // 2)) / 2


def _tail_medians(x: np.ndarray, run: np.ndarray) -> np.ndarray:
    """Per row ``i``: the median of its latest ``run[i]`` columns (one row median per
    distinct run length, not one per row)."""
    out = np.empty(x.shape[0])
    run = np.asarray(run)
    for n in np.unique(run):
        rows = np.nonzero(run == n)[0]
        out[rows] = row_median(x[rows, -int(n):])
    return out


def _log_ratio(x: np.ndarray, ref: np.ndarray) -> np.ndarray:
    floor = max(float(np.median(ref)) * 1e-3, 1.0)
    return np.log(np.maximum(x, floor) / np.maximum(ref, floor))


def detect_stragglers(
    job: str,
    topo: Topology,
    breakdown: pd.DataFrame,
    arrivals: pd.DataFrame,
    profile: StepProfile | None = None,
    hosts: dict[int, str] | None = None,
    config: StragglerConfig = StragglerConfig(),
    arrival_evidence: Callable[[list[int], list[int]], dict[int, dict]] | None = None,
    profile_for: Callable[[int], StepProfile | None] | None = None,
) -> list[Finding]:
    """Persistent stragglers, GC-like pauses and slow links in the latest window.

    Args:
        job: job id.
        topo: the job's topology.
        breakdown: from :func:`breakdown.rank_step_breakdown`.
        arrivals: from :func:`breakdown.collective_arrivals`.
        profile: what-if profile of the same window (for the estimated slowdown).
        hosts: rank -> host name, for the findings.
        config: thresholds.
        arrival_evidence: (ranks, steps) -> per-rank arrival evidence (last-arrival
            share, median lateness, peers' wait), where ``arrivals`` has no per-op rows
            (the reduced path); None: computed from ``arrivals``.
        profile_for: k -> the what-if profile over the latest k complete steps. A
            finding judged on fewer steps since its onset than ``profile`` spans
            (``recent_steps``) gets its estimated slowdown from the profile over those
            steps: the older steps of the default window predate the slowdown, and the
            what-if played on them understated it (bench, 2026-12-07: a 1.5x straggler
            read 2.4% three steps after its onset and crossed the 5% alert rule only
            five steps later). None: ``profile`` for every finding.

    A rank finding judged on fewer than ``config.recent_steps`` steps is kept only when
    the window ending ``config.confirm_steps`` earlier names the rank too (a second
    detector run, made only when there is such a finding).

    Returns:
        Findings, strongest first.
    """
    hosts = hosts or {}
    findings, steps, step_ns = _detect(job, topo, breakdown, arrivals, profile, hosts, config,
                                       arrival_evidence, profile_for)
    if len(steps) < config.min_steps:
        return []
    short = [f for f in findings if f.kind in STRAGGLER_KINDS
             and int(f.evidence.get("judged_steps") or 0) < config.recent_steps]
    if short and config.confirm_steps > 0:
        # only now (a new slowdown is being judged: none on a healthy job) the detector
        # runs again, on the window that ends confirm_steps earlier
        upto = int(breakdown["step"].max()) + 1 - config.confirm_steps
        arr_before = arrivals
        if not arrivals.empty and "step" in arrivals.columns:
            arr_before = arrivals[arrivals["step"] < upto]
        earlier, _, _ = _detect(job, topo, breakdown[breakdown["step"] < upto], arr_before, None, hosts,
                                config, arrival_evidence, None)
        held = {f.ranks[0] for f in earlier if f.kind in STRAGGLER_KINDS}
        unconfirmed = {id(f) for f in short if f.ranks[0] not in held}
        findings = [f for f in findings if id(f) not in unconfirmed]
    # links last: a group with a named member is that member's story, and a rank finding
    # dropped above must not hide its group's slow link
    flagged = {r for f in findings for r in f.ranks}
    findings += _slow_links(job, topo, arrivals, steps, flagged, step_ns, hosts, profile, config)
    return sorted(findings, key=lambda f: (-f.est_slowdown, -f.score))


def _detect(job: str, topo: Topology, breakdown: pd.DataFrame, arrivals: pd.DataFrame,
            profile: StepProfile | None, hosts: dict[int, str], config: StragglerConfig,
            arrival_evidence: Callable[[list[int], list[int]], dict[int, dict]] | None,
            profile_for: Callable[[int], StepProfile | None] | None) -> tuple[list[Finding], list[int], float]:
    """The rank findings of one window (no confirmation, no links), its steps and its
    median step time (ns)."""
    if CPU_COMPONENT not in breakdown.columns:  # a frame from before the CPU clock: not measured
        breakdown = breakdown.assign(**{CPU_COMPONENT: 0})
    bd = _window(breakdown[breakdown["rank"].between(0, topo.world_size - 1)], config.window_steps)
    steps = sorted(bd["step"].unique().tolist())
    if len(steps) < config.min_steps:
        return [], steps, 0.0
    ranks = sorted(bd["rank"].unique().tolist())
    groups = _stage_groups(topo, ranks)
    grid = _Grid(bd, ranks, steps)
    busy = grid.matrix("busy_ns")
    stage_groups = list(groups.values())
    ref = _reference(busy, stage_groups)
    lr = _log_ratio(busy, ref)
    centre = np.median(lr)  # one selection for the noise scales and the CUSUM's centre
    mad = mad_sigma(lr, centre)
    sigma = max(mad, 1e-3)  # the MAD's scale alone (the thresholds' and evidence's sigma)
    k = min(config.recent_steps, len(steps))
    thr = max(math.log1p(config.min_effect), config.z * MEDIAN_SE_FACTOR * sigma / math.sqrt(k))
    comps = {c: grid.matrix(c) for c in COMPONENT_KIND}
    measured = [c for c in MEASURED if c != CPU_COMPONENT or comps[c].any()]
    num_tests = 1 + len(measured)  # own work and each measured component: C of the Bonferroni
    pooled, row = _robust_sigma(lr, centre, mad), _row_sigma(lr)
    persistent, score_busy, run_busy = _scan(lr, pooled, config, row, pooled)
    cus: dict[str, CusumResult] = {"busy_ns": cusum(lr, pooled, num_tests, topo.world_size, config.cusum, row,
                                                    float(centre))}
    persistent, score_busy, run_busy = _with_cusum(persistent, score_busy, run_busy, cus["busy_ns"])
    spike_on = _spike_steps(lr, sigma, config)
    step_ns = float(np.median(grid.matrix("step_ns")))
    run_n = np.maximum(run_busy, 1)
    busy_ex = _tail_medians(busy - ref, run_n)
    persistent &= busy_ex >= np.maximum(config.min_effect * _tail_medians(ref, run_n),
                                        config.min_step_frac * step_ns)

    comp_refs = {c: _reference(m, stage_groups) for c, m in comps.items() if c != CPU_COMPONENT or c in measured}
    # a component can be significant on its own while the busy total is too noisy to show
    # it (a slow data loader inside a long step): same test, plus a materiality floor
    comp_hit: dict[str, np.ndarray] = {}
    comp_score: dict[str, np.ndarray] = {}
    comp_run: dict[str, np.ndarray] = {}
    comp_lr: dict[str, np.ndarray] = {}
    comp_sigma: dict[str, np.ndarray] = {}  # per rank: step-to-step noise of its log ratio
    for c in measured:
        lr_c = _log_ratio(comps[c], comp_refs[c])
        comp_lr[c] = lr_c
        centre_c = np.median(lr_c)
        pooled, row = _robust_sigma(lr_c, centre_c), _row_sigma(lr_c)
        comp_sigma[c] = row
        hit, sc, run = _scan(lr_c, pooled, config, row, pooled)
        cus[c] = cusum(lr_c, pooled, num_tests, topo.world_size, config.cusum, row, float(centre_c))
        hit, sc, run = _with_cusum(hit, sc, run, cus[c])
        top = _top_test(comps[c], groups, config)
        run = np.where(hit, run, np.where(top, min(config.top_steps, len(steps)), k))
        ex_c = _tail_medians(comps[c] - comp_refs[c], run)
        material = np.maximum(config.min_effect * _tail_medians(ref, run), config.min_step_frac * step_ns)
        floor = np.ones(len(ranks), dtype=bool)
        if c == CPU_COMPONENT:
            # the CPU clock's own excess must reach the reporting floor (a steady 2% that
            # its low noise makes significant is no slowdown to report, even where the
            # wall clock's compute shows more: that more is time off the CPU)...
            floor = ex_c >= config.min_effect * _tail_medians(comp_refs[c], run)
            # ...and what the step pays is the wall-clock compute excess, if larger
            ex_c = np.maximum(ex_c, _tail_medians(comps["compute_ns"] - comp_refs["compute_ns"], run))
        if c in SMALL_PARTS:
            # a part of the step too small for the own-work floor can still be slow by a
            # large factor (a data loader at 2x its peers' costing 2.5% of the step): its
            # excess is material when the part runs at component_min_factor its peers'
            # and costs min_step_frac of the step
            large = (_tail_medians(comps[c], run) >= config.component_min_factor * _tail_medians(comp_refs[c], run))
            material = np.where(large, config.min_step_frac * step_ns, material)
        comp_hit[c] = (hit | top) & (ex_c >= material) & floor
        comp_score[c], comp_run[c] = sc, run
    # pauses, on the wall clock; where the sections' CPU clock is measured also on it (a
    # collector runs on the CPU): a host whose wall clock is too noisy to show a pause
    # above its noise can show it on the thread's CPU time, which the wait for a core does
    # not move
    spikes = spike_on.sum(axis=1)
    spike_on_cpu = (_spike_steps(comp_lr[CPU_COMPONENT], None, config) if CPU_COMPONENT in comp_lr
                    else np.zeros_like(spike_on))
    spikes_cpu = spike_on_cpu.sum(axis=1)
    named = persistent | np.logical_or.reduce([comp_hit[c] for c in comp_hit])
    suspects = np.asarray(ranks, dtype=np.int64)[named].tolist()
    # only ranks some test named, or with enough spikes to be pausing, are looked at (none
    # on a healthy job, which then needs no per-rank arrival evidence)
    looked = np.nonzero(named | (spikes >= config.min_spikes) | (spikes_cpu >= config.min_spikes))[0].tolist()
    if not looked:
        evidence: dict[int, dict] = {}
    elif arrival_evidence is not None:
        evidence = arrival_evidence([ranks[i] for i in looked], steps[-k:])
    else:
        evidence = _arrival_evidence(arrivals, steps[-k:])
    waiting = _waiting_peers(arrivals, steps[-k:]) if looked else {}
    findings: list[Finding] = []
    for i in looked:
        r = ranks[i]
        hits = [c for c in comp_hit if comp_hit[c][i]]
        if persistent[i] or hits:
            lead = None if persistent[i] else max(hits, key=lambda c: comp_score[c][i])
            n = int(run_busy[i]) if lead is None else int(comp_run[lead][i])
            n = max(n, min(config.scan_min_steps, len(steps)))
            # onset: the CUSUM's change point when the CUSUM names the rank, else where the
            # final run of steps above half the run's median effect begins
            series = lr[i] if lead is None else comp_lr[lead][i]
            half = max(float(np.median(series[-n:])) / 2, math.log1p(config.min_effect) / 2)
            above = series > half
            first = steps[_run_start(above)] if above[-1] else steps[-n]
            # the strongest CUSUM that names the rank (own work or a component) dates it
            named = [k for k in ("busy_ns", *hits) if cus[k].hit[i]]
            seq = cus[max(named, key=lambda k: cus[k].score[i])] if named else cus[
                "busy_ns" if lead is None else lead]
            if seq.hit[i]:
                first = steps[int(seq.onset[i])]
            # the magnitudes are measured over the steps since the onset (not before it)
            n = max(len(steps) - steps.index(first), min(config.scan_min_steps, len(steps)))
            ex = {c: float(np.median(comps[c][i, -n:] - comp_refs[c][i, -n:])) for c in COMPONENT_KIND
                  if c != CPU_COMPONENT or c in measured}
            pick = ex if persistent[i] else {c: ex[c] for c in hits}
            comp = max(pick, key=lambda c: pick[c])
            if comp == "compute_ns" and CPU_COMPONENT in measured and (
                    CPU_COMPONENT in hits
                    or _factor(comps[CPU_COMPONENT][i, -n:], comp_refs[CPU_COMPONENT][i, -n:])
                    >= 1 + config.min_effect):
                # the same work on the steadier clock, where that clock shows the excess too
                # (where it does not, the rank waited for a core: the wall clock tells it)
                comp = CPU_COMPONENT
            kind = COMPONENT_KIND[comp]
            if comp == "compute_ns" and n >= k and _off_cpu(i, np.arange(len(steps)) >= len(steps) - n, busy,
                                                            ref, comps, comp_refs, measured,
                                                            config.off_cpu_share, config.min_effect) and (
                    float(comps[CPU_COMPONENT][i, -n:].sum())
                    <= (1 + config.min_effect) * float(comp_refs[CPU_COMPONENT][i, -n:].sum())):
                # the wall clock's compute excess is time off the CPU, the thread's CPU time
                # is at its peers' (median and mean: a rank that burns more CPU on some of
                # the steps, an intermittent straggler, is slow itself), over at least the
                # recent steps (a core lost for a few steps is the scheduler's noise, or its
                # fairness: a rank that burned more CPU gets less of it next): the rank
                # waited for a core, its work is not slower
                kind = FindingKind.HOST_CONTENTION
            contention = None if kind == FindingKind.HOST_CONTENTION or comp not in HOST_WORK else \
                _host_work_off_cpu(i, n, comp, busy, ref, comps, comp_refs, measured, grid, stage_groups, config)
            if contention is not None:
                kind = FindingKind.HOST_CONTENTION
            score = float(score_busy[i]) if persistent[i] else float(max(comp_score[c][i] for c in hits))
            excess_ns = float(np.median(busy[i, -n:] - ref[i, -n:]))
            if (not persistent[i] and CPU_COMPONENT not in hits and excess_ns < ex[comp] / 2
                    and evidence.get(r, {}).get("median_lateness_ms", 0.0) <= 0):
                # a wall-clock component's excess mostly offset by its other work (work
                # moved across a section boundary): the rank's own work is not slower by
                # it, nor is the rank late to its peers' collectives - nobody waits on it
                continue
            if kind == FindingKind.LATE_ARRIVAL and not _residual_persists(
                    _log_ratio(comps[comp][i], comp_refs[comp][i]), n, config):
                continue
            if comp not in comp_sigma:  # own work's pick of a component not tested alone
                comp_sigma[comp] = _row_sigma(_log_ratio(comps[comp], comp_refs[comp]))
            factor = _factor(comps[comp][i, -n:], comp_refs[comp][i, -n:])
            back = _recovered(comps[comp][i], comp_refs[comp][i], n, float(np.median(comp_sigma[comp])), config)
            if back is not None:  # slow, then back at its peers' pace: its slow steps are the first ones
                slow: np.ndarray | None = np.arange(n) < back
            else:
                slow = _two_state(comps[comp][i, -n:], comp_refs[comp][i, -n:],
                                  float(np.median(comp_sigma[comp])), config)
            all_steps_factor = factor
            if slow is not None:  # intermittent: how slow it is while slow, and how often
                factor = _factor(comps[comp][i, -n:][slow], comp_refs[comp][i, -n:][slow])
            lo, hi = _factor_interval(factor, comp_sigma[comp], i, n if slow is None else int(slow.sum()))
            busy_factor = _factor(busy[i, -n:], ref[i, -n:])
            base = _base_evidence(topo, r, i, ranks, groups, busy, ref, comps, comp_refs, n, sigma, thr,
                                  measured)
            base.update(evidence.get(r, {}))
            base["significant_components"] = [c[:-3] for c in hits]
            if kind == FindingKind.HOST_CONTENTION:
                cpu_factor = _factor(comps[CPU_COMPONENT][i, -n:], comp_refs[CPU_COMPONENT][i, -n:])
                off_ex = (comps["compute_ns"][i, -n:] - comps[CPU_COMPONENT][i, -n:]) - (
                    comp_refs["compute_ns"][i, -n:] - comp_refs[CPU_COMPONENT][i, -n:])
                base.update(cpu_factor=round(cpu_factor, 3),
                            off_cpu_excess_ms=round(float(np.median(off_ex)) / 1e6, 3))
            base.update(component=COMPONENT_NAME[comp], factor=round(factor, 3),
                        factor_interval=[round(lo, 3), round(hi, 3)],
                        own_work_factor=round(busy_factor, 3), judged_steps=n,
                        slow_steps=(None if slow is None
                                    else [steps[len(steps) - n + j] for j in np.nonzero(slow)[0]]),
                        factor_all_steps=round(all_steps_factor, 3),
                        recovered_step=None if back is None else steps[len(steps) - n + back],
                        step_ms=round(step_ns / 1e6, 3),
                        component_ms=round(float(np.median(comps[comp][i, -n:])) / 1e6, 3),
                        peer_component_ms=round(float(np.median(comp_refs[comp][i, -n:])) / 1e6, 3),
                        waiting_peers=waiting.get(r, []),
                        sequential={"statistic": round(float(seq.stat[i]), 3),
                                    "threshold": round(float(seq.threshold[i]), 3),
                                    "change_step": steps[int(seq.onset[i])], "flagged": bool(seq.hit[i])})
            prof = profile
            if profile_for is not None and profile is not None and n < k:
                prof = profile_for(n) or profile
            f = _finding(job, kind, [r], score, first, steps[-1], hosts, prof,
                         excess_ns / max(step_ns, 1.0), base, "", suspects=suspects)
            summary = _summary(topo, r, COMPONENT_NAME[comp], factor, f.est_slowdown,
                               None if slow is None else (int(slow.sum()), n))
            if kind == FindingKind.HOST_CONTENTION:
                if contention is None:  # compute named, its wall clock off the CPU
                    summary = _contention_summary(topo, r, factor, base["cpu_factor"], f.est_slowdown)
                else:  # host work named, off the CPU by its own clock or its compute's
                    clock, wall, cpu_factor = contention
                    f.evidence.update(cpu_factor=round(cpu_factor, 3), cpu_clock=clock)
                    summary = _contention_summary(topo, r, wall, cpu_factor, f.est_slowdown, clock)
                    if clock != COMPONENT_NAME[comp]:
                        summary += f"; its {COMPONENT_NAME[comp]} {factor:.2f}x its stage peers' in the same steps"
            if back is not None:
                summary += f"; back at its peers' pace since step {base['recovered_step']}"
            findings.append(replace(f, factor=round(factor, 3), component=COMPONENT_NAME[comp], summary=summary))
        elif (pause := _pause_steps(i, spike_on, spikes, spike_on_cpu, spikes_cpu, busy, ref, comps, comp_refs,
                                    measured, len(steps), config)) is not None:
            on, clock = pause
            spike_steps = [steps[j] for j in np.nonzero(on)[0]]
            pause_ns = float(np.median((busy[i] - ref[i])[on]))
            mean_cost = pause_ns * len(spike_steps) / len(steps) / max(step_ns, 1.0)
            base = _base_evidence(topo, r, i, ranks, groups, busy, ref, comps, comp_refs, k, sigma, thr,
                                  measured)
            base.update(evidence.get(r, {}))
            findings.append(_finding(
                job, FindingKind.GC_PAUSE, [r], float(len(spike_steps) / max(config.min_spikes, 1)),
                spike_steps[0], spike_steps[-1], hosts, None, mean_cost,
                {**base, "spike_steps": spike_steps, "median_pause_ms": round(pause_ns / 1e6, 3),
                 "num_spikes": len(spike_steps), "num_steps": len(steps), "component": "own work",
                 "spike_clock": clock, "factor": round(math.exp(float(np.median(lr[i][on]))), 3)},
                f"rank {r} ({topo.label(r)}) pauses intermittently: {len(spike_steps)} of {len(steps)} "
                f"steps ~{pause_ns / 1e6:.0f} ms longer",
            ))
    findings = _one_per_pair(findings, groups, ranks)
    findings = _against_unnamed_peers(findings, groups, ranks, {**comps, "busy_ns": busy}, config)
    findings = _waiting_on_a_pipeline_neighbour(findings, topo, config)
    return findings, steps, step_ns


SCAN_LENGTHS = (3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)


def _residual_persists(lr: np.ndarray, n: int, config: StragglerConfig) -> bool:
    """Whether a finding on the step's residual (untimed or other host work: the
    ``late_arrival`` kind) has held long enough to be the rank's.

    The residual takes every wait outside traced ops - for a core on a loaded host, for
    a pipeline neighbour's activations - so a few steps of it far above the peers' are
    the host's as often as the rank's: on the bench (2026-12-07) two clean twins each
    read one rank's untimed work 2.9-3.9x for 3-5 steps, and a straggler's 2-rank-stage
    partner read 16x for 7 steps, a pass before the straggler itself was named. Unlike a
    timed section's, the residual's finding is made only once it has held over
    ``recent_steps`` since its onset (``n``: the judged steps), its median at least
    ``min_effect`` and ``persist_frac`` of the steps above half of that. A real
    late-arriving rank is named ``recent_steps`` steps after its onset at the earliest;
    none of the timed kinds waits. O(n)."""
    if n < config.recent_steps or lr.size < n:
        return False
    run = lr[-n:]
    med = float(np.median(run))
    return med >= math.log1p(config.min_effect) and float(np.mean(run > med / 2)) >= config.persist_frac


def _run_lengths(num_steps: int, config: StragglerConfig) -> list[int]:
    lo = min(config.scan_min_steps, num_steps)
    return sorted({n for n in SCAN_LENGTHS if lo <= n <= num_steps} | {num_steps, lo})


def _robust_sigma(lr: np.ndarray, med: float | None = None, mad: float | None = None) -> float:
    """Noise scale of log ratios that heavy tails cannot shrink: the larger of the MAD's
    and the upper tail's Gaussian-equivalent scale ((q90 - q50) / 1.2816). On a loaded
    host a third of the rank-steps may run 1.5-2.5x slow at random; the MAD alone then
    measures the quiet two thirds only. ``med`` (``np.median(lr)``) and ``mad``
    (``mad_sigma(lr, med)``) when the caller has them already."""
    if med is None:
        med = np.median(lr)  # once: the MAD's centre too
    tail = (float(np.quantile(lr, 0.9)) - float(med)) / 1.2816
    return max(mad_sigma(lr, med) if mad is None else mad, tail, 1e-3)


def _row_sigma(lr: np.ndarray) -> np.ndarray:
    """Per row: its own step-to-step noise, :func:`.robust.diff_sigma` (a level shift - the
    onset of a slowdown - does not inflate it)."""
    return diff_sigma(lr)


@lru_cache(maxsize=64)
def _log_binom_coef(n: int) -> np.ndarray:
    """log C(n, k) for k = 0..n (read-only: shared by every call of one ``n``)."""
    logc = np.array([math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) for k in range(n + 1)])
    logc.flags.writeable = False
    return logc


def _binom_sf(h: np.ndarray, n: int, p: np.ndarray) -> np.ndarray:
    """P(Binomial(n, p) >= h), element-wise (h, p arrays of one shape)."""
    j = np.arange(n + 1)
    logc = _log_binom_coef(n)
    p = np.clip(p, 1e-12, 1 - 1e-12)[..., None]
    terms = np.exp(logc + j * np.log(p) + (n - j) * np.log1p(-p))
    return np.where(j >= h[..., None], terms, 0.0).sum(axis=-1)


def _scan(lr: np.ndarray, sigma: float, config: StragglerConfig, row_sigma: np.ndarray | None = None,
          lr_sigma: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sequential test on log ratios (ranks x steps, oldest first) over runs of the latest
    ``n`` steps, ``scan_min_steps <= n <= steps``; a rank is flagged by either

    * the *median* test: the run's median is above ``max(log(1 + min_effect),
      scan_z x 1.2533 sigma / sqrt(n))`` with most of its steps above half of that
      (``sigma``: :func:`_robust_sigma`); or
    * the *exceedance* test (distribution-free): for a level ``L`` of ``levels``, the
      number ``h`` of the run's steps above ``log L`` is so high that
      P(Binomial(n, p_L) >= h) < ``level_alpha``, where ``p_L`` is how often the other
      ranks' steps exceed ``L`` in the window; ``h >= persist_frac x n`` and the run's
      median is above ``log(1 + min_effect)``. Machine load that slows random ranks at
      random steps raises ``p_L`` for everyone; a straggler is above ``L`` every step.

    Evidence accumulates with ``n``: a large slowdown is named after a few steps, a small
    one once enough steps back it; one spike never is. Returns (flagged, score: > 1 beyond
    the threshold, the longest flagged run length) per rank. ``row_sigma`` and
    ``lr_sigma`` are :func:`_row_sigma` and :func:`_robust_sigma` of ``lr`` when the
    caller has them already."""
    num_ranks, num_steps = lr.shape
    hit = np.zeros(num_ranks, dtype=bool)
    score = np.zeros(num_ranks)
    run = np.zeros(num_ranks, dtype=np.int64)
    floor = math.log1p(config.min_effect)
    # a rank on a noisy host is judged against its own noise when that is larger than the
    # pool's (its median wanders further; it is not slower)
    robust = _robust_sigma(lr) if lr_sigma is None else lr_sigma
    sigma = np.maximum(max(sigma, robust), _row_sigma(lr) if row_sigma is None else row_sigma)
    # steps x ranks: a count over steps adds whole rows (numpy's per-row sums of 24
    # booleans cost about twice as much)
    lr_t = lr.T.copy()
    above, p_other = {}, {}
    for L in config.levels:  # leave-one-out rate of exceeding L, with a pseudo-count
        e = above[L] = lr_t > math.log(L)
        per_rank = e.sum(axis=0)
        p_loo = (per_rank.sum() - per_rank + 0.5) / (e.size - num_steps + 1.0)
        # ... or the rank's own rate of the mirror event (as far below its peers): a rank
        # that is just noisier than its peers exceeds both tails alike
        p_other[L] = np.maximum(p_loo, ((lr_t < -math.log(L)).sum(axis=0) + 0.5) / (num_steps + 1.0))
    # per run length only the ranks still in the running are looked at, each on exactly
    # the figures a test over every rank would give it: every bar a run's median must
    # pass is at least ``floor``, and a median above it needs at least half the run's steps
    # above it (the upper middle value is above it), so the medians of the other runs -
    # most of 12,288 on a healthy job - are never needed (-inf passes no bar)
    over_floor = lr_t > floor
    # per level, how many of the latest n steps exceed it, grown step by step with n
    latest = {L: np.zeros(num_ranks, dtype=np.int64) for L in config.levels}
    prev = 0
    for n in _run_lengths(num_steps, config):
        for L, e in above.items():
            latest[L] += e[num_steps - n:num_steps - prev].sum(axis=0)
        prev = n
        med = np.full(num_ranks, -np.inf)
        rows = np.nonzero(over_floor[-n:].sum(axis=0) >= n - n // 2)[0]
        med[rows] = row_median(lr[rows, -n:])
        thr = np.maximum(floor, config.scan_z * MEDIAN_SE_FACTOR * sigma / math.sqrt(n))
        ok = med > thr
        rows = np.nonzero(ok)[0]
        if rows.size:
            ok[rows] = (lr[rows, -n:] > thr[rows, None] / 2).mean(axis=1) >= config.persist_frac
        sc = np.zeros(num_ranks)
        sc[ok] = med[ok] / thr[ok]
        for L in config.levels:
            rows = np.nonzero(med > max(floor, 0.5 * math.log(L)))[0]
            if not rows.size:
                continue
            h = latest[L][rows]
            cand = h >= config.persist_frac * n
            if not cand.any():
                continue
            rows, h = rows[cand], h[cand]
            tail = _binom_sf(h, n, p_other[L][rows])
            good = np.zeros(num_ranks, dtype=bool)
            good[rows] = tail < config.level_alpha
            lv = np.zeros(num_ranks)
            lv[rows] = np.log(np.maximum(tail, 1e-300)) / math.log(config.level_alpha)
            ok |= good
            sc = np.maximum(sc, np.where(good, lv, 0.0))
        score = np.maximum(score, sc)
        run = np.where(ok, n, run)
        hit |= ok
    return hit, score, run


def _with_cusum(hit: np.ndarray, score: np.ndarray, run: np.ndarray,
                seq: CusumResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scans' (flagged, score, run length) joined with the CUSUM's: a rank the CUSUM
    flags is judged on the steps since its change point."""
    run = np.where(seq.hit, np.maximum(seq.num_steps - seq.onset, 1), run)
    return hit | seq.hit, np.maximum(score, np.where(seq.hit, seq.score, 0.0)), run


def _factor(x: np.ndarray, ref: np.ndarray) -> float:
    """How many times its peers' time a rank's component takes: the median over steps of
    the per-step ratio to the same step's peer median (a step that slowed everyone, e.g.
    machine load, cancels out of its ratio; one odd step does not move the median)."""
    ok = (x > 0) & (ref > 0)
    if not ok.any():
        return 1.0
    return float(np.exp(np.median(np.log(x[ok] / ref[ok]))))


FACTOR_Z = 1.96
"""The factor's interval is its median +- 1.96 standard errors (a 95% interval)."""


def _factor_interval(factor: float, row_sigma: np.ndarray, i: int, n: int) -> tuple[float, float]:
    """A 95% interval of a factor measured as the median of ``n`` per-step log ratios:
    ``factor * exp(+-1.96 * 1.2533 * sigma / sqrt(n))``. sigma is the larger of the rank's
    own step-to-step noise and the typical rank's (``row_sigma``: per rank, the spread of
    its log ratio's step-to-step differences, which the onset's level shift barely moves).
    A factor named from 3 steps on a loaded host then says how little it knows; one
    judged over 30 steps of a quiet job is tight."""
    if n < 1 or factor <= 0 or row_sigma.size == 0:
        return factor, factor
    sigma = max(float(row_sigma[i]), float(np.median(row_sigma)))
    half = FACTOR_Z * MEDIAN_SE_FACTOR * sigma / math.sqrt(n)
    return factor * math.exp(-half), factor * math.exp(half)


def _summary(topo: Topology, rank: int, component: str, factor: float, slowdown: float,
             slow_of: tuple[int, int] | None = None) -> str:
    """The finding in an operator's words: what is slow, by how much, what it costs
    (``slow_of``: an intermittent slowdown's slow steps of the judged ones)."""
    when = "" if slow_of is None else f" on {slow_of[0]} of {slow_of[1]} steps"
    return (f"rank {rank} ({topo.label(rank)}): {component} {factor:.2f}x its stage peers{when}; "
            f"job ~{slowdown:.0%} slower")


def _contention_summary(topo: Topology, rank: int, factor: float, cpu_factor: float, slowdown: float,
                        what: str = "compute") -> str:
    """A host-contention finding in an operator's words (``what``: the work whose wall and
    CPU clocks tell it)."""
    return (f"rank {rank} ({topo.label(rank)}): {what} {factor:.2f}x its stage peers' wall time at "
            f"{cpu_factor:.2f}x their CPU time - it waits for a CPU core (host oversubscribed); "
            f"job ~{slowdown:.0%} slower")


def _two_state(x: np.ndarray, ref: np.ndarray, sigma: float, config: StragglerConfig) -> np.ndarray | None:
    """Which of a finding's judged steps were slow, when the rank switched between its
    peers' pace and a slower one (an intermittent fault) rather than running slower
    throughout: a mask over ``x``, or None.

    The per-step log ratios to the peers are sorted and split in two where the groups'
    separation is largest (Ashman's D: the means' distance over the groups' pooled
    spread, each spread at least ``sigma``, the typical rank's step-to-step noise). Two
    states only when D >= ``two_state_separation``, each group has at least
    ``two_state_min_steps`` steps and the faster group runs at its peers' pace (its
    median within 3 standard errors, or ``ln(1 + min_effect)``, of them). A persistent slowdown
    with normal or heavy-tailed noise almost never passes (a unimodal sample's best split
    gives D ~ 2.7), so its factor stays the median over all judged steps."""
    ok = (x > 0) & (ref > 0)
    m = config.two_state_min_steps
    if int(ok.sum()) < 2 * m or not sigma > 0:
        return None
    lr = np.log(x[ok] / ref[ok])
    order = np.argsort(lr, kind="stable")
    xs = lr[order]
    n = xs.size
    k = np.arange(1, n)
    csum, csq = np.cumsum(xs)[:-1], np.cumsum(xs * xs)[:-1]
    mean_lo, mean_hi = csum / k, (xs.sum() - csum) / (n - k)
    var_lo = np.maximum(csq / k - mean_lo ** 2, sigma ** 2)
    var_hi = np.maximum(((xs * xs).sum() - csq) / (n - k) - mean_hi ** 2, sigma ** 2)
    d = math.sqrt(2) * (mean_hi - mean_lo) / np.sqrt(var_lo + var_hi)
    d[(k < m) | (n - k < m)] = -np.inf
    best = int(np.argmax(d))
    split = best + 1  # steps in the faster group
    if d[best] < config.two_state_separation:
        return None
    # the faster steps run at the peers' pace: their median within 3 standard errors of
    # 0 (else they are slow too - a persistent straggler whose slowest steps were load)
    se = MEDIAN_SE_FACTOR * math.sqrt(float(var_lo[best])) / math.sqrt(split)
    if abs(float(np.median(xs[:split]))) > max(3 * se, math.log1p(config.min_effect)):
        return None
    slow_ok = np.zeros(n, dtype=bool)
    slow_ok[order[split:]] = True
    mask = np.zeros(x.shape, dtype=bool)
    mask[np.nonzero(ok)[0]] = slow_ok
    return mask


def _recovered(x: np.ndarray, ref: np.ndarray, n: int, sigma: float, config: StragglerConfig) -> int | None:
    """Whether a slowdown has ended: the latest of a finding's ``n`` judged steps (the
    last ``n`` of ``x``, a rank's window, oldest first) run at the peers' pace again.
    Returns how many of the judged steps came before the recovery (the slow ones, give
    or take the step at the change), or None.

    :func:`_two_state` sorts the steps and so ignores their order; a rank that ran slow
    and then recovered is one change in time. Every split of the steps into an earlier
    part and a latest part of at least ``two_state_min_steps`` is tried: recovered when
    for one of them the earlier part's median log ratio is above ``ln(1 + min_effect)``
    with ``persist_frac`` of its steps above half that (a rank that switched between
    slow and healthy stretches before is intermittent: it stays named, its factor the
    slow steps', :func:`_two_state`), the latest part's within 3 standard errors (or
    ``ln(1 + min_effect)``) of its peers with at most ``1 - persist_frac`` of its steps
    above half the earlier part's median (and as few of the window's steps before the
    judged ones: else it was slow before, an intermittent straggler slow again), and the
    earlier part's median exceeds the latest's by ``recovery_z`` standard errors of the
    difference (each part's spread its MAD's, at least ``sigma``: one long step moves
    neither). On a rank that stays slow the difference is noise: 6-24 steps of a steady
    1.3x read as recovered in none of 3,000 series with Gaussian noise 0.05 or 0.3, and in
    8 of 3,000 with noise 0.3 and a heavy tail (15% of the steps another 1.6x slower,
    typically), where that pass's factor is then the steps before the split's.
    Without this, the CUSUM that dated the onset (it decays by ln 1.1 a step) kept a
    1.4x straggler that had recovered named as "1.09x": its factor drifted down as
    healthy steps filled its judged run. The finding stays (what the data says reaches
    the server late, and an operator wants the episode), judged on the slow steps, with
    ``evidence.recovered_step``; the incident resolves once no pass names the rank.
    O(judged steps^2), judged steps <= the window, only for named ranks."""
    ok = (x > 0) & (ref > 0)
    m = config.two_state_min_steps
    judged = ok[-n:] if n > 0 else ok[:0]
    if int(judged.sum()) < 2 * m or not sigma > 0:
        return None
    lr_all = np.log(np.where(ok, x, 1.0) / np.where(ok, ref, 1.0))
    idx = np.nonzero(judged)[0]
    lr, before = lr_all[-n:][judged], lr_all[:-n][ok[:-n]]
    n = lr.size
    floor = math.log1p(config.min_effect)
    for t in range(m, n - m + 1):
        early, late = lr[:t], lr[t:]
        med_e, med_l = float(np.median(early)), float(np.median(late))
        if med_e <= floor or float((early > floor / 2).mean()) < config.persist_frac:
            continue  # not slow throughout before it: intermittent (see _two_state)
        if max(float((late > med_e / 2).mean()), float((before > med_e / 2).mean()) if before.size else 0.0) \
                > 1 - config.persist_frac:
            continue  # slow again on some of the latest steps, or slow before too: intermittent
        s_e, s_l = max(mad_sigma(early, med_e), sigma), max(mad_sigma(late, med_l), sigma)
        z = (med_e - med_l) / (MEDIAN_SE_FACTOR * math.sqrt(s_e ** 2 / t + s_l ** 2 / (n - t)))
        if z >= config.recovery_z and abs(med_l) <= max(3 * MEDIAN_SE_FACTOR * s_l / math.sqrt(n - t), floor):
            return int(idx[t])
    return None


def _base_evidence(topo, r, i, ranks, groups, busy, ref, comps, comp_refs, n, sigma, thr, measured) -> dict:
    excess_ns = float(np.median(busy[i, -n:] - ref[i, -n:]))
    return {
        "busy_ms": round(float(np.median(busy[i, -n:])) / 1e6, 3),
        "peer_busy_ms": round(float(np.median(ref[i, -n:])) / 1e6, 3),
        "excess_ms": round(excess_ns / 1e6, 3),
        "noise_sigma": round(sigma, 4),
        "threshold": round(thr, 4),
        "stage": topo.stage(r),
        "peers": [ranks[j] for j in groups[topo.stage(r)] if j != i],
        "components_excess_ms": {
            c[:-3]: round(float(np.median(comps[c][i, -n:] - comp_refs[c][i, -n:])) / 1e6, 3)
            for c in COMPONENT_KIND if c != CPU_COMPONENT or c in measured
        },
    }


def _spike_steps(lr: np.ndarray, sigma: float | None, config: StragglerConfig) -> np.ndarray:
    """Per rank and step: own work (or a component) far above the stage peers' - more
    than ``spike_z`` times the noise (the pool's MAD sigma ``sigma``, computed here when
    None, or the rank's own MAD about its median where larger: sparse pauses barely move
    it, and a rank on a noisy host does not count its noise as pauses) and at least
    ``spike_min_effect``."""
    if sigma is None:
        sigma = max(mad_sigma(lr, float(np.median(lr))), 1e-3)
    row_mad = MAD_TO_SIGMA * row_median(np.abs(lr - row_median(lr)[:, None]))
    thr = np.maximum(math.log1p(config.spike_min_effect), config.spike_z * np.maximum(sigma, row_mad))
    return lr > thr[:, None]


def _pause_steps(i: int, on_wall: np.ndarray, spikes: np.ndarray, on_cpu: np.ndarray, spikes_cpu: np.ndarray,
                 busy: np.ndarray, ref: np.ndarray, comps: dict, comp_refs: dict, measured: list[str],
                 num_steps: int, config: StragglerConfig) -> tuple[np.ndarray, str] | None:
    """Rank ``i``'s pause steps and the clock that showed them (``"wall"``: own work;
    ``"cpu"``: the compute sections' thread CPU time), or None when it is not pausing.

    The wall clock's spikes count unless they are the host's doing (:func:`_descheduled`).
    Failing that, the CPU clock's, when they pass the same test against the other ranks'
    CPU spikes, are isolated steps (at most a third of them next to another: a run of
    slow steps is a slowdown starting, ending or coming and going, which the straggler
    tests judge) and cost own work at least ``spike_min_effect`` on the wall clock
    (median over the spike steps): a pause the step does not pay for is not reported."""
    if _pauses(spikes, i, num_steps, config) and not _descheduled(
            i, on_wall[i], busy, ref, comps, comp_refs, measured, config):
        return on_wall[i], "wall"
    if _pauses(spikes_cpu, i, num_steps, config):
        on = on_cpu[i]
        runs = int(np.count_nonzero(np.diff(np.nonzero(on)[0]) == 1))
        if runs * 3 <= int(on.sum()) and (float(np.median(busy[i, on] - ref[i, on]))
                                          >= config.spike_min_effect * float(np.median(ref[i, on]))):
            return on, "cpu"
    return None


def _pauses(spikes: np.ndarray, i: int, num_steps: int, config: StragglerConfig) -> bool:
    """GC-like pauses on rank ``i``: enough spikes, not most steps (that is a straggler),
    and far more than the other ranks' spike rate explains (Poisson tail below
    ``spike_alpha``): load spikes scattered over all ranks do not single one out."""
    s = int(spikes[i])
    if s < config.min_spikes or s > 0.6 * num_steps:
        return False
    others = np.delete(spikes, i)
    lam = max(float(others.mean()) if others.size else 0.0, 0.5)
    tail = 1.0 - sum(math.exp(-lam) * lam ** j / math.factorial(j) for j in range(s))
    return tail < config.spike_alpha


def _descheduled(i: int, on: np.ndarray, busy: np.ndarray, ref: np.ndarray, comps: dict, comp_refs: dict,
                 measured: list[str], config: StragglerConfig) -> bool:
    """Rank ``i``'s spikes (steps ``on``) are its host's doing, not a pause of its own
    (:func:`_off_cpu`, the CPU clock's spike threshold ``spike_min_effect``): a collector
    runs on the CPU, so its pauses show on the CPU clock too, however few of the wall
    clock's milliseconds an oversubscribed host lets it run."""
    return _off_cpu(i, on, busy, ref, comps, comp_refs, measured, config.off_cpu_share,
                    config.spike_min_effect)


def _off_cpu(i: int, on: np.ndarray, busy: np.ndarray, ref: np.ndarray, comps: dict, comp_refs: dict,
             measured: list[str], share: float, cpu_effect: float) -> bool:
    """Rank ``i``'s excess own work over steps ``on`` is time its thread waited for a core:
    at least ``share`` of it is compute time spent off the CPU (wall minus CPU clock,
    beyond the peers'), and the CPU clock's median excess ratio there is below
    ``cpu_effect``. Only where the CPU clock is measured on every one of those steps;
    elsewhere (CUDA ranks) nothing tells."""
    if CPU_COMPONENT not in measured or not on.any():
        return False
    cpu, cpu_peers = comps[CPU_COMPONENT][i, on], comp_refs[CPU_COMPONENT][i, on]
    if not (cpu > 0).all():
        return False
    off = comps["compute_ns"][i, on] - cpu
    off_peers = comp_refs["compute_ns"][i, on] - cpu_peers
    excess = float((busy[i, on] - ref[i, on]).sum())
    if excess <= 0 or float((off - off_peers).sum()) < share * excess:
        return False
    return float(np.median(_log_ratio(cpu, cpu_peers))) < math.log1p(cpu_effect)


HOST_WORK = ("untimed_ns", "optimizer_ns", "other_ns")
"""Components of host work with no CPU clock of their own (the compute sections' is the
only one): on a CPU host their wall-clock excess can be the time a rank waited for a core
(:func:`_descheduled_around`)."""


def _host_work_off_cpu(i: int, n: int, comp: str, busy: np.ndarray, ref: np.ndarray, comps: dict,
                       comp_refs: dict, measured: list[str], grid: _Grid, stage_groups: list[list[int]],
                       config: StragglerConfig) -> tuple[str, float, float] | None:
    """Rank ``i``'s finding on host work ``comp`` (:data:`HOST_WORK`) over its latest
    ``n`` steps is the time it waited for a core: (the work whose clocks tell it, its wall
    and its CPU factor against its peers), else None. The optimizer's sections carry their own
    CPU clock where it is measured (``optimizer_cpu_ns``, CPU devices): at its peers'
    CPU time (below ``1 + min_effect``) while the wall clock is slower, the rank waited -
    for every rank of a data-parallel job the optimizer starts as the gradient all-reduce
    ends, all of them wanting a core at once. Untimed work has no clock of its own: the
    compute's tells (:func:`_descheduled_around`). O(rows) for the one matrix, built only
    for such a finding."""
    if comp == "optimizer_ns":
        cpu = grid.matrix("optimizer_cpu_ns")
        mine = cpu[i, -n:]
        peers = next((g for g in stage_groups if i in g and len(g) > 1), [])
        if (mine > 0).all() and peers:
            cpu_factor = _factor(mine, np.median(cpu[[j for j in peers if j != i], -n:], axis=0))
            wall = _factor(comps[comp][i, -n:], comp_refs[comp][i, -n:])
            return (COMPONENT_NAME[comp], wall, cpu_factor) if cpu_factor < 1 + config.min_effect else None
    if not _descheduled_around(i, n, busy, ref, comps, comp_refs, measured, config):
        return None
    return ("compute", _factor(comps["compute_ns"][i, -n:], comp_refs["compute_ns"][i, -n:]),
            _factor(comps[CPU_COMPONENT][i, -n:], comp_refs[CPU_COMPONENT][i, -n:]))


def _descheduled_around(i: int, n: int, busy: np.ndarray, ref: np.ndarray, comps: dict, comp_refs: dict,
                        measured: list[str], config: StragglerConfig) -> bool:
    """Rank ``i``'s own-work excess over its latest ``n`` steps, named on host work that no
    CPU clock measures (:data:`HOST_WORK`), is its host's doing: over the same steps its
    compute, whose CPU clock is measured, ran at its peers' CPU time (below
    ``1 + min_effect``) but spent time off the CPU beyond theirs - at least ``descheduled_share`` of
    what waiting for a core spread evenly over the step would put there (the compute's share
    of its peers' own work times the own-work excess). A rank whose untimed work or
    optimizer is itself slower shows that excess with its compute on the CPU; one that
    the scheduler keeps off its core shows it in every part of the step alike. Only where
    the CPU clock is measured on all those steps (CPU devices)."""
    if CPU_COMPONENT not in measured:
        return False
    cpu, cpu_peers = comps[CPU_COMPONENT][i, -n:], comp_refs[CPU_COMPONENT][i, -n:]
    if not (cpu > 0).all() or _factor(cpu, cpu_peers) >= 1 + config.min_effect:
        return False
    # medians over the steps, as the finding's own excess figures (one step a rank spent
    # mostly off its core would carry a sum)
    off_ex = float(np.median((comps["compute_ns"][i, -n:] - cpu) - (comp_refs["compute_ns"][i, -n:] - cpu_peers)))
    busy_ex = float(np.median(busy[i, -n:] - ref[i, -n:]))
    share = float(np.median(comp_refs["compute_ns"][i, -n:])) / max(float(np.median(ref[i, -n:])), 1.0)
    return busy_ex > 0 and off_ex >= config.descheduled_share * min(share, 1.0) * busy_ex


def _mirror_rank(f: Finding) -> tuple[bool, float, float]:
    """Which of a 2-rank stage's two findings is the cause (the larger): one on a timed
    section's work before one on untimed host work (the residual of the step, where the
    partner of a slow rank shows the time it spent waiting outside traced ops), then the
    costlier, then the stronger."""
    return f.kind != FindingKind.LATE_ARRIVAL, finding_cost(f), f.score


def _one_per_pair(findings: list[Finding], groups: dict[int, list[int]], ranks: list[int]) -> list[Finding]:
    """In a stage of two ranks each is measured against the other, so each component's
    ratio of one is the inverse of the other's: when both are named (the straggler on its
    compute, its peer on the untimed work the straggler shows less of), the one on
    untimed work, or else the one costing less, is the other's mirror image and goes into
    its ``evidence["secondary"]`` (:func:`_mirror_rank`). Two real faults on the two
    ranks of one such stage show as one."""
    pairs = {ranks[a]: ranks[b] for g in groups.values() if len(g) == 2 for a, b in (g, g[::-1])}
    named = {f.ranks[0]: f for f in findings if f.kind in STRAGGLER_KINDS and len(f.ranks) == 1}
    mirror = set()
    for r, f in named.items():
        other = named.get(pairs.get(r, -1))
        if other is not None and _mirror_rank(f) < _mirror_rank(other):
            mirror.add(id(f))
    if not mirror:
        return findings
    out = []
    for f in findings:
        if id(f) in mirror:
            continue
        twin = named.get(pairs.get(f.ranks[0], -1)) if f.ranks else None
        if twin is not None and id(twin) in mirror and f.kind in STRAGGLER_KINDS:
            f = replace(f, evidence={**f.evidence,
                                     "secondary": f.evidence.get("secondary", []) + [as_secondary(twin)]})
        out.append(f)
    return out


_COMPONENT_BY_NAME = {name: c for c, name in COMPONENT_NAME.items()}


def _against_unnamed_peers(findings: list[Finding], groups: dict[int, list[int]], ranks: list[int],
                           comps: dict[str, np.ndarray], config: StragglerConfig) -> list[Finding]:
    """Each rank's finding judged again without the stragglers named before it.

    A rank is measured against the median of its stage peers; where two of its three
    peers are stragglers, that median is a straggler's, and a healthy rank reads as
    slow on whatever the stragglers show less of (the untimed host work they spend
    computing). Strongest first (timed work before untimed, then by cost:
    :func:`_mirror_rank`), a finding whose stage holds a rank named before it stands
    only if its component is still at least ``min_effect`` above the median of the
    stage's ranks named by nothing yet kept, over the same judged steps; with no such
    peer left it cannot be told from them and is dropped. A ``late_arrival`` (on the
    step's residual, which grows by what the rank did not do meanwhile) must also show
    its own work in total (``comps["busy_ns"]``) that far above theirs: in
    ``three-stragglers`` on the bench (2026-12-07) rank 6, healthy beside two
    stragglers, read "untimed host work" above its one unnamed peer's by noise while its
    own work was 0.94x its stage's median. Only the few named ranks are looked at again:
    O(findings x stage size x judged steps)."""
    if len(findings) < 2:
        return findings
    pos = {r: i for i, r in enumerate(ranks)}
    stage_of = {i: st for st, members in groups.items() for i in members}
    kept: list[Finding] = []
    named: set[int] = set()
    for f in sorted(findings, key=_mirror_rank, reverse=True):
        comp = _COMPONENT_BY_NAME.get(f.component or "")
        i = pos.get(f.ranks[0], -1) if len(f.ranks) == 1 else -1
        n = int(f.evidence.get("judged_steps") or 0)
        peers = [j for j in groups.get(stage_of.get(i, -1), []) if j != i]
        if comp is None or i < 0 or n <= 0 or f.kind not in STRAGGLER_KINDS or not set(peers) & named:
            kept.append(f)
            named.add(i)
            continue
        free = [j for j in peers if j not in named]
        tested = [comp, "busy_ns"] if f.kind == FindingKind.LATE_ARRIVAL else [comp]
        if free and all(_factor(comps[c][i, -n:], np.median(comps[c][free, -n:], axis=0)) >= 1 + config.min_effect
                        for c in tested):
            kept.append(f)
            named.add(i)
            continue
        # the stage's strongest straggler carries it as a secondary effect
        k = next((k for k, g in enumerate(kept) if len(g.ranks) == 1 and pos.get(g.ranks[0], -1) in peers), None)
        if k is None:  # (every finding of a rank in ``named`` is in ``kept``: not reached)
            kept.append(f)
            continue
        kept[k] = replace(kept[k], evidence={**kept[k].evidence, "secondary": kept[k].evidence.get(
            "secondary", []) + [as_secondary(f)]})
    return kept if len(kept) < len(findings) else findings


def _waiting_on_a_pipeline_neighbour(findings: list[Finding], topo: Topology,
                                     config: StragglerConfig) -> list[Finding]:
    """A healthy rank's late arrival that its pipeline neighbour's slowness causes.

    A rank whose previous or next pipeline stage's rank is slow waits for its
    activations or gradients. Where that wait falls outside traced ops it reads as
    untimed host work, and the rank's own DP/TP peers then wait on it, so it is late
    too; but its own work in total is at its peers' (the untimed excess is offset by
    the work it did not do meanwhile). In ``three-stragglers`` on the bench (2026-12-07)
    rank 5, whose previous stage's rank 1 ran 1.4x, read "untimed host work 3.55x"
    with its own work 1.006x its stage peers'. A ``late_arrival`` finding one of whose
    pipeline neighbours is named on anything else is that neighbour's secondary effect,
    and goes into the neighbour's ``evidence.secondary``, when its own work is within
    ``min_effect`` of its peers' or its timed work (compute, data loading, optimizer) is:
    its excess is then all in the residual, where a wait for the neighbour lands. (In
    the same scenario's other seed rank 5 read own work 1.09x, against a median of stage
    peers two of which were stragglers, with its timed work at theirs.) A rank whose
    timed work is itself above its peers' keeps its finding. O(findings)."""
    by_rank = {f.ranks[0]: k for k, f in enumerate(findings)
               if len(f.ranks) == 1 and f.kind in STRAGGLER_KINDS and f.kind != FindingKind.LATE_ARRIVAL}
    if not by_rank:
        return findings
    out = list(findings)
    drop: set[int] = set()
    for k, f in enumerate(findings):
        if f.kind != FindingKind.LATE_ARRIVAL or len(f.ranks) != 1:
            continue
        if float(f.evidence.get("own_work_factor", math.inf)) >= 1 + config.min_effect and not _timed_at_peers(
                f, config):
            continue
        r = f.ranks[0]
        causes = [by_rank[n] for n in (topo.prev_stage_rank(r), topo.next_stage_rank(r)) if n in by_rank]
        if not causes:
            continue
        c = max(causes, key=lambda j: finding_cost(findings[j]))
        g = out[c]
        out[c] = replace(g, evidence={**g.evidence, "secondary": g.evidence.get("secondary", []) + [as_secondary(f)]})
        drop.add(k)
    return [f for k, f in enumerate(out) if k not in drop]


TIMED_PARTS = ("compute", "dataloader", "optimizer")
"""The timed sections' parts of own work (keys of ``evidence.components_excess_ms``)."""


def _timed_at_peers(f: Finding, config: StragglerConfig) -> bool:
    """The finding's timed work (compute + data loading + optimizer) exceeds its peers' by
    less than ``min_effect`` of their own work (read from its evidence)."""
    ev = f.evidence
    parts = ev.get("components_excess_ms") or {}
    if "peer_busy_ms" not in ev or not parts:
        return False
    excess = sum(float(parts.get(c, 0.0)) for c in TIMED_PARTS)
    return excess < config.min_effect * float(ev["peer_busy_ms"])


def _waiting_peers(arr: pd.DataFrame, steps: list[int]) -> dict[int, list[dict]]:
    """Per rank waited on: the peers that waited for it most (ms per step), up to 8."""
    if arr.empty:
        return {}
    a = arr[arr["step"].isin(steps) & ~arr["is_last"].astype(bool) & (arr["wait_ns"] > 0)]
    if a.empty:
        return {}
    w = a.groupby(["waited_on_rank", "rank"])["wait_ns"].sum() / 1e6 / max(len(steps), 1)
    out: dict[int, list[dict]] = {}
    for (on, who), ms in w.sort_values(ascending=False).items():
        if int(on) != int(who) and len(out.setdefault(int(on), [])) < 8:
            out[int(on)].append({"rank": int(who), "waited_ms_per_step": round(float(ms), 3)})
    return out


def _top_test(x: np.ndarray, groups: dict[int, list[int]], config: StragglerConfig) -> np.ndarray:
    """Distribution-free persistence test for heavy-tailed timings: a rank that is the
    slowest of its n stage peers in h of the last k steps, where under exchangeable
    noise h ~ Binomial(k, 1/n), is flagged when P(X >= h) < ``config.top_alpha``."""
    out = np.zeros(x.shape[0], dtype=bool)
    k = min(config.top_steps, x.shape[1])
    for members in groups.values():
        n = len(members)
        if n < 3 or k < config.min_steps:
            continue
        sub = x[members, -k:]
        top = sub >= sub.max(axis=0, keepdims=True)
        unique_top = top.sum(axis=0) == 1  # ties (all zero) count for nobody
        hits = (top & unique_top).sum(axis=1)
        bottom = sub <= sub.min(axis=0, keepdims=True)
        fastest = (bottom & (bottom.sum(axis=0) == 1)).sum(axis=1)
        # the rate of being the slowest is 1/n under exchangeable noise, or the rank's own
        # rate of being the fastest if higher: a rank that is only noisier than its peers
        # is the slowest and the fastest alike often
        p = np.maximum(1 / n, (fastest + 0.5) / (k + 1.0))
        # P(X >= 0) = 1: only the few ranks that were ever the slowest need the tail
        some = np.nonzero(hits)[0]
        out[np.asarray(members)[some]] = _binom_sf(hits[some], k, p[some]) < config.top_alpha
    return out


def _run_start(mask: np.ndarray) -> int:
    """Index where the final run of True values begins (allowing single-step dips)."""
    j = len(mask) - 1
    while j > 0 and (mask[j - 1] or (j > 1 and mask[j - 2])):
        j -= 1
    return j


def _arrival_evidence(arr: pd.DataFrame, steps: list[int]) -> dict[int, dict]:
    """Per rank: how often it arrived last at collectives over ``steps``, its median
    lateness, how long peers waited for it per step and in which groups most."""
    if arr.empty:
        return {}
    a = arr[arr["step"].isin(steps)]
    if a.empty:
        return {}
    is_last = a["is_last"].astype(bool)
    per_rank = pd.DataFrame({"rank": a["rank"], "last": is_last, "late": a["lateness_ns"]}).groupby("rank")
    last_frac, lateness = per_rank["last"].mean(), per_rank["late"].median()
    waited = a[(~is_last).to_numpy()]
    by = waited.groupby(["waited_on_rank", "group_id"])["wait_ns"].sum()
    out: dict[int, dict] = {}
    for r in last_frac.index:
        mine = by.loc[r] if r in by.index.get_level_values(0) else pd.Series(dtype="int64")
        top = mine.sort_values(ascending=False)
        out[int(r)] = {
            "last_arrival_frac": round(float(last_frac[r]), 3),
            "median_lateness_ms": round(float(lateness[r]) / 1e6, 3),
            "peers_waited_ms_per_step": round(float(mine.sum()) / 1e6 / max(len(steps), 1), 3),
            "waited_in_groups": [str(g) for g in top.index[:4]],
        }
    return out


def _finding(job, kind, ranks, score, first, last, hosts, profile, fallback_slowdown,
             evidence, summary, group_id="", suspects=None) -> Finding:
    slowdown, model = fallback_slowdown, "observed excess / step time"
    if profile is not None:
        w = whatif(profile, ranks=ranks if not group_id else None, group_id=group_id,
                   suspects=suspects if suspects is not None else ranks)
        slowdown, model = w.slowdown, "1f1b what-if"
        evidence = {**evidence, "predicted_step_ms": round(w.predicted_step_ns / 1e6, 3),
                    "step_ms_if_fixed": round(w.fixed_step_ns / 1e6, 3)}
    return Finding(
        kind=kind, job=job, ranks=tuple(int(r) for r in ranks), score=round(score, 3),
        summary=summary, severity=Severity.WARNING,
        hosts=tuple(sorted({hosts[r] for r in ranks if r in hosts})), group_id=group_id,
        first_step=int(first), last_step=int(last), est_slowdown=round(max(slowdown, 0.0), 4),
        evidence={**evidence, "slowdown_model": model},
    )


def _slow_links(job, topo, arr, steps, flagged, step_ns, hosts, profile, config) -> list[Finding]:
    gt = group_transfer(arr[arr["step"].isin(steps)]) if not arr.empty else arr
    if gt is None or gt.empty:
        return []
    out: list[Finding] = []
    lr_all, per_axis = [], {}
    for axis, g in gt.groupby("axis"):
        gids, x, n_ops = _link_matrices(g, steps)
        if len(gids) < 3 or x.shape[1] < config.min_steps:
            continue
        ref = _reference(x, [list(range(len(gids)))])
        lr = _log_ratio(x, ref)
        per_axis[axis] = (gids, x, ref, lr, n_ops)
        lr_all.append(lr.ravel())
    if not per_axis:
        return []
    sigma = _robust_sigma(np.concatenate(lr_all))  # heavy tails on a loaded host
    for axis, (gids, x, ref, lr, n_ops) in per_axis.items():
        k = min(config.recent_steps, lr.shape[1])
        thr = max(math.log1p(config.link_min_effect), config.z * MEDIAN_SE_FACTOR * sigma / math.sqrt(k))
        top = _top_test(x, {0: list(range(len(gids)))}, config)
        # every group of the axis at once (thousands of TP/PP groups at fleet size); the
        # loop below visits only the groups that pass
        meds = np.median(lr[:, -k:], axis=1)
        # per-step cost: the typical op's excess times the ops per step
        excesses = np.median((x[:, -k:] - ref[:, -k:]) * n_ops[:, -k:], axis=1)
        significant = (meds > thr) & ((lr[:, -k:] > thr / 2).mean(axis=1) >= config.persist_frac)
        floor = math.log1p(config.link_min_effect)
        passed = (significant | (top & (meds > floor))) & ~(excesses < config.link_min_step_frac * step_ns)
        for i in np.nonzero(passed)[0].tolist():
            gid, med, excess = gids[i], float(meds[i]), float(excesses[i])
            try:
                members = topo.parse_group_id(gid)[1]
            except ValueError:
                continue
            if set(members) & flagged:
                continue
            f = _finding(
                job, FindingKind.SLOW_LINK, members, med / thr, steps[_run_start(lr[i] > thr / 2)],
                steps[-1], hosts, profile, excess / max(step_ns, 1.0),
                {"axis": axis, "median_op_link_ms": round(float(np.median(x[i, -k:])) / 1e6, 3),
                 "peer_groups_median_op_link_ms": round(float(np.median(ref[i, -k:])) / 1e6, 3),
                 "ops_per_step": float(np.median(n_ops[i, -k:])),
                 "excess_ms_per_step": round(excess / 1e6, 3), "step_ms": round(step_ns / 1e6, 3),
                 "noise_sigma": round(sigma, 4), "threshold": round(thr, 4),
                 "component": f"{axis} link", "factor": round(math.exp(med), 3)},
                "", group_id=gid, suspects=[],
            )
            out.append(replace(f, factor=round(math.exp(med), 3), component=f"{axis} link", summary=(
                f"group {gid}: link transfers {math.exp(med):.2f}x other {axis} groups' while its "
                f"members' compute is normal; job ~{f.est_slowdown:.0%} slower")))
    return out


def _link_matrices(g: pd.DataFrame, steps: list[int]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """One axis's group ids (sorted), median op link time and ops per step as groups x
    steps matrices over the ``steps`` every group has: ``pivot_table`` sums per (group,
    step), reindexed to ``steps``, without the steps some group misses.

    :func:`.breakdown.group_transfer` gives one row per (group, step): those rows are laid
    out directly (a pivot's sum of one value is the value, a negative zero made positive:
    ``+ 0.0``), about ten times faster at 1,536 groups; anything else (a repeated cell,
    NaN, a step outside ``steps``, categorical ids) goes through ``pivot_table``."""
    gid_col = g["group_id"]
    codes, uniques = pd.factorize(gid_col, sort=True)
    cell = pd.Index(steps).get_indexer(g["step"])
    val = g["op_transfer_ns"].to_numpy(dtype=float)
    ops = g["num_ops"].to_numpy(dtype=float)
    flat = codes * len(steps) + cell
    simple = (not isinstance(gid_col.dtype, pd.CategoricalDtype) and len(steps) > 0
              and bool((codes >= 0).all() and (cell >= 0).all())
              and not (np.isnan(val).any() or np.isnan(ops).any())
              and (flat.size == 0 or int(np.bincount(flat).max()) == 1))
    if not simple:
        m = g.pivot_table(index="group_id", columns="step", values="op_transfer_ns", aggfunc="sum")
        m = m.reindex(columns=steps).dropna(axis=1)
        n_ops = g.pivot_table(index="group_id", columns="step", values="num_ops", aggfunc="sum")
        n_ops = n_ops.reindex(index=m.index, columns=m.columns).fillna(0).to_numpy(dtype=float)
        return m.index.tolist(), m.to_numpy(dtype=float), n_ops
    shape = (len(uniques), len(steps))
    x = np.full(shape[0] * shape[1], np.nan)
    x[flat] = val + 0.0
    n_ops = np.zeros(shape[0] * shape[1])
    n_ops[flat] = ops + 0.0
    x, n_ops = x.reshape(shape), n_ops.reshape(shape)
    full = ~np.isnan(x).any(axis=0)
    return uniques.tolist(), x[:, full], n_ops[:, full]
