"""One diagnosis pass over one job: frames in, findings out (pure, no I/O).

Runs the detectors in order - stragglers/links/GC pauses, collective mismatches, the
hang analysis, MFU decline, heartbeat loss and hardware errors - then joins hardware
evidence to the findings of the same ranks and folds heartbeat loss into a hang that
already names those ranks (one incident per hang, never one per rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from fleetscope.topology import Topology

from .breakdown import BREAKDOWN_COLUMNS, rank_step_breakdown, reduced_arrivals
from .findings import STRAGGLER_KINDS, Finding, FindingKind, HangAnalysis
from .hangs import HangConfig, analyse_hang, detect_mismatches, keep_culprits
from .health import detect_hardware_errors, detect_heartbeat_loss, detect_silence, hardware_evidence
from .loader import JobFrames, fast_enabled, rank_max
from .mfu import MfuConfig, detect_mfu_drop, mfu_series
from .progress import progress_stall
from .story import fold_secondary
from .stragglers import StragglerConfig, detect_stragglers
from .whatif import StepProfile, op_noise, profile_from_frames


@dataclass(frozen=True)
class JobInfo:
    """What the control plane knows about a job."""

    job: str
    topology: Topology
    num_microbatches: int = 1
    model_flops_per_step: float = 0.0
    device_peak_flops: float = 0.0
    status: str = "running"
    start_ns: int = 0


@dataclass(frozen=True)
class DiagnosisConfig:
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)
    hang: HangConfig = field(default_factory=HangConfig)
    mfu: MfuConfig = field(default_factory=MfuConfig)
    silent_s: float = 20.0
    """Nothing arrived from a running job, or one of its hosts, for this long: an incident."""


@dataclass
class JobDiagnosis:
    job: str
    computed_ns: int
    findings: list[Finding]
    hang: HangAnalysis
    mfu: pd.DataFrame
    breakdown: pd.DataFrame
    arrivals: pd.DataFrame
    profile: StepProfile | None


def build_profile(info: JobInfo, frames: JobFrames, breakdown: pd.DataFrame,
                  arrivals: pd.DataFrame, num_steps: int) -> StepProfile | None:
    """What-if profile over the latest ``num_steps`` complete steps."""
    if breakdown.empty:
        return None
    steps = sorted(breakdown["step"].unique())[-num_steps:]
    sec = frames.sections[frames.sections["step"].isin(steps)] if not frames.sections.empty else frames.sections
    arr = arrivals[arrivals["step"].isin(steps)] if not arrivals.empty else arrivals
    return profile_from_frames(info.topology, info.num_microbatches,
                               breakdown[breakdown["step"].isin(steps)], sec, arr)


def build_profile_reduced(info: JobInfo, red, breakdown: pd.DataFrame, arrivals: pd.DataFrame,
                          num_steps: int) -> StepProfile | None:
    """:func:`build_profile` from ClickHouse's reductions: per-rank medians over the latest
    ``num_steps`` complete steps of the forward/backward own work per micro-batch, the
    other terms (pre/post work, link times) by ``profile_from_frames`` itself."""
    if breakdown.empty:
        return None
    steps = sorted(breakdown["step"].unique())[-num_steps:]
    arr = arrivals[arrivals["step"].isin(steps)] if not arrivals.empty else arrivals
    p = profile_from_frames(info.topology, info.num_microbatches, breakdown[breakdown["step"].isin(steps)],
                            pd.DataFrame(), arr)
    mats = {}
    logs = []
    for name, per_step in (("fwd", red.fwd), ("bwd", red.bwd)):
        stack = [per_step[s] for s in steps if s in per_step and per_step[s].shape == p.fwd_ns.shape]
        if not stack:
            mats[name] = getattr(p, f"{name}_ns")
            continue
        a = np.stack(stack)
        seen = ~np.isnan(a).all(axis=0)
        med = np.zeros(a.shape[1:])
        if seen.any():
            med[seen] = np.nanmedian(a[:, seen], axis=0)
        mats[name] = med
        ok = np.isfinite(a) & (a > 0) & (med[None] > 0)
        logs.append(np.log(a[ok] / np.broadcast_to(med[None], a.shape)[ok]))
    noise = op_noise(np.concatenate(logs)) if logs else 0.0
    return replace(p, fwd_ns=mats["fwd"], bwd_ns=mats["bwd"], noise=noise)


def reduced_arrival_evidence(red, bd: pd.DataFrame, ranks: list[int], steps: list[int]) -> dict[int, dict]:
    """Per-rank arrival evidence (what the detector reads from per-op arrival rows, which
    the reduced path does not have), from the per-rank-per-step reductions of ``steps``:
    how often each of ``ranks`` arrived last, its median lateness (median over steps of
    the per-step medians), how long peers waited for it per step and in which groups
    most."""
    if not ranks or not steps or red.breakdown.empty or bd.empty:
        return {}
    b = red.breakdown[red.breakdown["step"].isin(steps) & red.breakdown["rank"].isin(ranks)]
    ev: dict[int, dict] = {}
    for r, g in b.groupby("rank"):
        n = int(g["num_collectives"].sum())
        if n == 0:
            continue
        by_group: dict[str, float] = {}
        for ks, vs in zip(g["caused_k"], g["caused_v"]):
            for k, v in zip(ks if ks is not None else (), vs if vs is not None else ()):
                by_group[str(k)] = by_group.get(str(k), 0) + float(v)
        top = sorted(by_group, key=lambda k: -by_group[k])
        ev[int(r)] = {
            "last_arrival_frac": round(float(g["num_last_arrivals"].sum()) / n, 3),
            "median_lateness_ms": round(float(np.median(g["lateness_med_ns"].astype(float))) / 1e6, 3),
            "peers_waited_ms_per_step": round(float(g["wait_caused_ns"].sum()) / 1e6 / max(len(steps), 1), 3),
            "waited_in_groups": top[:4],
        }
    return ev


def add_arrival_evidence(findings: list[Finding], red, bd: pd.DataFrame, config) -> None:
    """:func:`reduced_arrival_evidence` of the straggler findings' ranks over the latest
    ``recent_steps`` steps every rank completed, into their evidence."""
    ranks = {f.ranks[0] for f in findings if f.kind in STRAGGLER_KINDS and len(f.ranks) == 1 and not f.group_id}
    if not ranks or red.breakdown.empty or bd.empty:
        return
    counts = bd.groupby("step")["rank"].nunique()
    full = counts[counts >= counts.max()].index.sort_values()
    steps = list(full[-config.window_steps:])[-min(config.recent_steps, len(full)):]
    ev = reduced_arrival_evidence(red, bd, sorted(ranks), steps)
    for f in findings:
        if f.kind in STRAGGLER_KINDS and len(f.ranks) == 1 and not f.group_id and f.ranks[0] in ev:
            f.evidence.update(ev[f.ranks[0]])


def diagnose_hang(info: JobInfo, frames: JobFrames, now_ns: int,
                  config: DiagnosisConfig = DiagnosisConfig(),
                  previous: HangAnalysis | None = None) -> tuple[HangAnalysis, list[Finding]]:
    """The hang analysis alone (cheap: no straggler/what-if/MFU work) and its findings:
    the hang (hosts, heartbeat loss folded in) or, without one, heartbeat losses.
    ``previous`` is the job's previous hang analysis (culprit stickiness, see
    :func:`.hangs.keep_culprits`)."""
    topo = info.topology
    if info.status not in ("running", "failed", "lost"):
        return HangAnalysis(job=info.job, stalled=False, stalled_since_ns=0, stalled_for_s=0.0,
                            threshold_s=config.hang.hang_min_s, last_step=frames.last_step), []
    rank_last = rank_max(frames.steps, "step")
    hc = config.hang
    red = frames.reduced
    reference = not fast_enabled()  # the previous pass, rank by rank (benchmark, equivalence tests)
    op = progress_stall(now_ns, list(topo.ranks()), frames.collectives, frames.sections, frames.inflight,
                        frames.heartbeats, frames.last_step, frames.first_step,
                        hang_op_min_s=hc.hang_op_min_s, hang_k=hc.hang_k,
                        min_history_steps=hc.op_min_history_steps, min_blocked_s=hc.min_blocked_s,
                        gaps=red.gaps if red is not None else None,
                        quiet_since_ns=red.quiet_since_ns if red is not None else None,
                        reference=reference)
    hang = analyse_hang(info.job, topo, now_ns, frames.step_times, frames.inflight,
                        frames.heartbeats, frames.progress, info.start_ns, frames.last_seen,
                        hc, job_failed=info.status == "failed", rank_last_step=rank_last,
                        progress_stall=op, warmup_step=frames.first_step, reference=reference,
                        failed_ops=frames.failed_ops)
    hang = keep_culprits(previous, hang)
    hosts = frames.hosts
    host_data = {}
    if not frames.steps.empty:
        host_data = {str(h): int(t) for h, t in frames.steps.groupby("host")["end_ns"].max().items()}
    lost = detect_heartbeat_loss(info.job, frames.heartbeats, now_ns, hc.heartbeat_stale_s,
                                 host_data_ns=host_data, host_seen_ns=frames.host_seen_ns)
    if info.status in ("running", "lost"):  # a failed job's own final record explains its silence
        silent = detect_silence(info.job, frames, now_ns, config.silent_s, frames.host_seen_ns)
        covered = {h for f in silent for h in f.hosts}
        lost = [f for f in lost if not set(f.hosts) & covered] + silent
    hang_finding = hang.to_finding()
    if hang_finding is None:
        return hang, lost
    hang_finding = replace(hang_finding, hosts=tuple(sorted({hosts[r] for r in hang_finding.ranks if r in hosts})))
    # a whole job gone silent stays its own finding (it pages, and the job's status becomes
    # lost); hosts' heartbeat losses are evidence of the hang, not separate incidents
    job_silent = [f for f in lost if f.evidence.get("silence") == "job"]
    hang_finding.evidence["heartbeat_lost"] = [f.summary for f in lost if f not in job_silent]
    return hang, [hang_finding, *job_silent]


def diagnose(info: JobInfo, frames: JobFrames, now_ns: int,
             config: DiagnosisConfig = DiagnosisConfig(),
             previous: HangAnalysis | None = None) -> JobDiagnosis:
    """All findings for one job at ``now_ns``, strongest first within each detector."""
    topo = info.topology
    hosts = frames.hosts
    red = frames.reduced
    if red is not None:
        bd = red.breakdown[list(BREAKDOWN_COLUMNS)] if not red.breakdown.empty else \
            pd.DataFrame(columns=BREAKDOWN_COLUMNS)
        arr = reduced_arrivals(red.groups)
    else:
        bd, arr = rank_step_breakdown(frames.sections, frames.collectives, frames.steps)
    bd = complete_steps(bd, frames.last_step, rank_max(frames.steps, "step"))
    if red is not None:
        profile = build_profile_reduced(info, red, bd, arr, config.stragglers.recent_steps)
    else:
        profile = build_profile(info, frames, bd, arr, config.stragglers.recent_steps)
    # the reduced path has no per-op arrival rows: the detector reads the ranks' arrival
    # evidence (lateness: do peers wait on it?) from the reductions instead
    evidence = (None if red is None
                else lambda ranks, steps: reduced_arrival_evidence(red, bd, ranks, steps))
    profiles: dict[int, StepProfile | None] = {}

    def profile_for(num_steps: int) -> StepProfile | None:
        """The profile over the latest ``num_steps`` steps (a finding since a recent onset)."""
        if num_steps not in profiles:
            profiles[num_steps] = (build_profile_reduced(info, red, bd, arr, num_steps) if red is not None
                                   else build_profile(info, frames, bd, arr, num_steps))
        return profiles[num_steps]

    findings = detect_stragglers(info.job, topo, bd, arr, profile, hosts, config.stragglers,
                                 arrival_evidence=evidence, profile_for=profile_for)
    if red is not None:
        add_arrival_evidence(findings, red, bd, config.stragglers)
        findings += detect_mismatches(info.job, red.mismatch_rows)
    else:
        findings += detect_mismatches(info.job, frames.collectives)
    hang, hang_findings = diagnose_hang(info, frames, now_ns, config, previous)
    mfu = mfu_series(frames.step_times, info.model_flops_per_step, info.device_peak_flops,
                     topo.world_size)
    mfu_finding = detect_mfu_drop(info.job, mfu, bd, config.mfu)
    if mfu_finding is not None:
        findings.append(mfu_finding)
    if hang.stalled:
        findings[:0] = hang_findings
    else:
        findings += hang_findings  # heartbeat losses
    findings += detect_hardware_errors(info.job, frames.log_events, frames.metrics, hosts)
    add_hardware_evidence(findings, frames)
    findings = fold_secondary(findings, topo)
    return JobDiagnosis(info.job, now_ns, findings, hang, mfu, bd, arr, profile)


def complete_steps(bd: pd.DataFrame, last_step: int, rank_last: dict[int, int]) -> pd.DataFrame:
    """The rows of ``bd`` a pass may judge: the newest step may still be arriving, so only
    steps before the job's newest, and of each rank only the steps before its own newest
    (``rank_last``). A rank's step record can reach the store before the step's last ops
    and sections do (an agent's batch cut between the frames of one flush, a slow
    insert): judged then, the step's missing communication reads as the rank's own work
    - a straggler made of missing rows. A later step of the same rank comes after them
    in its spool. (With one step only, that step: a short job's first verdicts.) The
    pass's window then ends at the newest step every rank has completed
    (``stragglers._window``). O(rows)."""
    if bd.empty or last_step < 0 or bd["step"].nunique() <= 1:
        return bd
    step = bd["step"].to_numpy(dtype=np.int64)
    keep = step < last_step
    if rank_last:
        rank = bd["rank"].to_numpy(dtype=np.int64)
        size = max(int(rank.max()) + 1, max(rank_last) + 1) if rank.size else 0
        newest = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)  # unknown rank: no limit
        newest[np.fromiter(rank_last.keys(), dtype=np.int64, count=len(rank_last))] = np.fromiter(
            rank_last.values(), dtype=np.int64, count=len(rank_last))
        keep &= step < newest[rank]
    return bd[keep]


def add_hardware_evidence(findings: list[Finding], frames: JobFrames) -> None:
    """Hardware events of a finding's ranks, joined into its evidence."""
    hw = hardware_evidence(frames.log_events, frames.metrics, frames.hosts)
    if hw:
        for f in findings:
            if f.kind != FindingKind.HARDWARE_ERROR:
                events = [e for r in f.ranks for e in hw.get(r, [])]
                if events:
                    f.evidence["hardware_events"] = sorted(set(events))[:20]
