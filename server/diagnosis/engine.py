"""One diagnosis pass over one job: frames in, findings out (pure, no I/O).

Runs the detectors in order - stragglers/links/GC pauses, collective mismatches, the
hang analysis, MFU decline, heartbeat loss and hardware errors - then joins hardware
evidence to the findings of the same ranks and folds heartbeat loss into a hang that
already names those ranks (one incident per hang, never one per rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pandas as pd

from fleetscope.topology import Topology

from .breakdown import rank_step_breakdown
from .findings import Finding, FindingKind, HangAnalysis
from .hangs import HangConfig, analyse_hang, detect_mismatches, keep_culprits
from .health import detect_hardware_errors, detect_heartbeat_loss, hardware_evidence
from .loader import JobFrames
from .mfu import MfuConfig, detect_mfu_drop, mfu_series
from .progress import progress_stall
from .story import fold_secondary
from .stragglers import StragglerConfig, detect_stragglers
from .whatif import StepProfile, profile_from_frames


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


def diagnose_hang(info: JobInfo, frames: JobFrames, now_ns: int,
                  config: DiagnosisConfig = DiagnosisConfig(),
                  previous: HangAnalysis | None = None) -> tuple[HangAnalysis, list[Finding]]:
    """The hang analysis alone (cheap: no straggler/what-if/MFU work) and its findings:
    the hang (hosts, heartbeat loss folded in) or, without one, heartbeat losses.
    ``previous`` is the job's previous hang analysis (culprit stickiness, see
    :func:`.hangs.keep_culprits`)."""
    topo = info.topology
    if info.status not in ("running", "failed"):
        return HangAnalysis(info.job, False, 0, 0.0, config.hang.hang_min_s, frames.last_step), []
    rank_last = ({int(r): int(v) for r, v in frames.steps.groupby("rank")["step"].max().items()}
                 if not frames.steps.empty else {})
    hc = config.hang
    op = progress_stall(now_ns, list(topo.ranks()), frames.collectives, frames.sections, frames.inflight,
                        frames.heartbeats, frames.last_step, frames.first_step,
                        hang_op_min_s=hc.hang_op_min_s, hang_k=hc.hang_k,
                        min_history_steps=hc.op_min_history_steps, min_blocked_s=hc.min_blocked_s)
    hang = analyse_hang(info.job, topo, now_ns, frames.step_times, frames.inflight,
                        frames.heartbeats, frames.progress, info.start_ns, frames.last_seen,
                        hc, job_failed=info.status == "failed", rank_last_step=rank_last,
                        progress_stall=op, warmup_step=frames.first_step)
    hang = keep_culprits(previous, hang)
    hosts = frames.hosts
    host_data = {}
    if not frames.steps.empty:
        host_data = {str(h): int(t) for h, t in frames.steps.groupby("host")["end_ns"].max().items()}
    lost = detect_heartbeat_loss(info.job, frames.heartbeats, now_ns, hc.heartbeat_stale_s,
                                 host_data_ns=host_data, host_seen_ns=frames.host_seen_ns)
    hang_finding = hang.to_finding()
    if hang_finding is None:
        return hang, lost
    hang_finding = replace(hang_finding, hosts=tuple(sorted({hosts[r] for r in hang_finding.ranks if r in hosts})))
    hang_finding.evidence["heartbeat_lost"] = [f.summary for f in lost]  # not separate incidents
    return hang, [hang_finding]


def diagnose(info: JobInfo, frames: JobFrames, now_ns: int,
             config: DiagnosisConfig = DiagnosisConfig(),
             previous: HangAnalysis | None = None) -> JobDiagnosis:
    """All findings for one job at ``now_ns``, strongest first within each detector."""
    topo = info.topology
    hosts = frames.hosts
    bd, arr = rank_step_breakdown(frames.sections, frames.collectives, frames.steps)
    # the newest step may still be arriving: judge complete steps only
    if not bd.empty and frames.last_step >= 0:
        bd = bd[bd["step"] < frames.last_step] if bd["step"].nunique() > 1 else bd
    profile = build_profile(info, frames, bd, arr, config.stragglers.recent_steps)
    findings = detect_stragglers(info.job, topo, bd, arr, profile, hosts, config.stragglers)
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


def add_hardware_evidence(findings: list[Finding], frames: JobFrames) -> None:
    """Hardware events of a finding's ranks, joined into its evidence."""
    hw = hardware_evidence(frames.log_events, frames.metrics, frames.hosts)
    if hw:
        for f in findings:
            if f.kind != FindingKind.HARDWARE_ERROR:
                events = [e for r in f.ranks for e in hw.get(r, [])]
                if events:
                    f.evidence["hardware_events"] = sorted(set(events))[:20]
