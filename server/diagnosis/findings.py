"""Typed results of the detectors: frozen dataclasses with a ``kind`` enum.

Detectors are pure functions from frames to these values; the diagnosis loop turns
them into incidents and the REST API serialises them with :func:`finding_to_dict`.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class FindingKind(str, enum.Enum):
    """What a finding says is wrong."""

    SLOW_COMPUTE = "slow_compute"
    """A rank's own compute (forward/backward/optimizer) is slower than its peers'."""
    SLOW_DATALOADER = "slow_dataloader"
    """A rank spends longer loading data than its peers."""
    LATE_ARRIVAL = "late_arrival"
    """A rank persistently arrives last at collectives though no timed section explains it."""
    SLOW_LINK = "slow_link"
    """A process group's transfers are slow while its members' compute is normal."""
    GC_PAUSE = "gc_pause"
    """Intermittent long pauses on one rank (garbage-collector-like)."""
    HOST_CONTENTION = "host_contention"
    """A rank's compute takes longer than its peers' on the wall clock while its thread's
    CPU time stays at their level: it waits for a CPU core (an oversubscribed host, a
    noisy neighbour), its own work is not slower. Only where the sections' CPU clock is
    measured (the CPU is the device)."""
    HANG = "hang"
    """No step (or no traced op anywhere in the job) completed for longer than its stall
    threshold."""
    COLLECTIVE_MISMATCH = "collective_mismatch"
    """Ranks disagree on op/size/dtype for the same group sequence number."""
    MFU_DROP = "mfu_drop"
    """A sustained decline of model FLOPs utilisation."""
    HEARTBEAT_LOST = "heartbeat_lost"
    """A host or rank stopped sending heartbeats, or its process is gone."""
    HARDWARE_ERROR = "hardware_error"
    """GPU XID/ECC/throttle or NIC flapping seen by the agent."""


STRAGGLER_KINDS = frozenset(
    {
        FindingKind.SLOW_COMPUTE,
        FindingKind.SLOW_DATALOADER,
        FindingKind.LATE_ARRIVAL,
        FindingKind.SLOW_LINK,
        FindingKind.GC_PAUSE,
        FindingKind.HOST_CONTENTION,
    }
)


class HangClass(str, enum.Enum):
    """Why a hang's culprit does not progress."""

    PROCESS_DEAD = "process_dead"
    STUCK_IN_COMPUTE = "stuck_in_compute"
    DATALOADER_STALL = "dataloader_stall"
    COLLECTIVE_FAULT = "collective_fault"
    """Stuck inside a collective/p2p op with every peer present: link or NCCL fault."""
    COLLECTIVE_MISMATCH = "collective_mismatch"
    UNRESPONSIVE = "unresponsive"
    """No in-flight record and no heartbeat from the rank: nothing known."""
    STUCK_OUTSIDE_TRACED_CODE = "stuck_outside_traced_code"


class Severity(str, enum.Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True)
class Finding:
    """One diagnosis result.

    ``key`` identifies the same underlying problem across ticks (kind + culprit), so the
    loop can update an incident instead of opening a new one.
    """

    kind: FindingKind
    job: str
    ranks: tuple[int, ...]
    """Culprit ranks first (the ones to look at), then affected ranks if any."""
    score: float
    """Detector-specific strength; > 1 means beyond the detection threshold."""
    summary: str
    severity: Severity = Severity.WARNING
    hosts: tuple[str, ...] = ()
    group_id: str = ""
    first_step: int = -1
    last_step: int = -1
    est_slowdown: float = 0.0
    """Estimated fractional job slowdown caused (0.12 = step time 12% longer)."""
    factor: float = 0.0
    """Stragglers: how many times its peers' time the slow ``component`` takes (median
    over the judged steps of the per-step ratio to the peers' median; 1.5 = 50% longer).
    0 where it does not apply."""
    component: str = ""
    """Stragglers: what ``factor`` measures - ``compute``, ``data loading``, ``optimizer``,
    ``untimed host work``, ``own work`` (GC-like pauses) or ``<axis> link``."""
    evidence: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        who = ",".join(str(r) for r in self.ranks[:4]) if not self.group_id else self.group_id
        return f"{self.kind.value}:{who}"


@dataclass(frozen=True)
class HangAnalysis:
    """The state of a possible hang at one moment."""

    job: str
    stalled: bool
    stalled_since_ns: int
    stalled_for_s: float
    threshold_s: float
    last_step: int
    culprits: tuple[int, ...] = ()
    hang_class: HangClass | None = None
    group_id: str = ""
    chain: tuple[tuple[int, int, str], ...] = ()
    """Wait-for edges ``(waiter, waited_for, reason)`` leading from blocked ranks to the root."""
    evidence: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    due_in_s: float | None = None
    """Not stalled yet: seconds until a stall rule would fire if nothing progresses."""

    def to_finding(self) -> Finding | None:
        if not self.stalled:
            return None
        cls = self.hang_class.value if self.hang_class else "unknown"
        where = f" in {self.group_id}" if self.group_id else ""
        what = ("no traced op completed anywhere in the job" if self.evidence.get("detected_by") == "op_progress"
                else "no step completed")
        return Finding(
            kind=FindingKind.HANG,
            job=self.job,
            ranks=self.culprits,
            score=self.stalled_for_s / max(self.threshold_s, 1e-9),
            summary=(
                f"{what} for {self.stalled_for_s:.0f}s after step {self.last_step}; "
                f"culprit rank(s) {list(self.culprits)}: {cls}{where}"
            ),
            severity=Severity.CRITICAL,
            group_id=self.group_id,
            first_step=self.last_step + 1,
            last_step=self.last_step + 1,
            est_slowdown=1.0,
            evidence={
                "hang_class": cls,
                "stalled_since_ns": self.stalled_since_ns,
                "threshold_s": self.threshold_s,
                "chain": [list(e) for e in self.chain],
                **self.evidence,
            },
        )


def finding_cost(f: Finding) -> float:
    """What a straggler finding costs the job: the larger of its what-if and its measured
    excess per step over the step time - of its own work, or of the component it was
    named on where that is larger (on a noisy wall clock the own-work excess can read ~0
    while the steadier CPU clock measures the component's)."""
    ev = f.evidence or {}
    try:
        excess = float(ev.get("excess_ms", ev.get("excess_ms_per_step", 0.0)))
        parts = ev.get("components_excess_ms") or {}
        excess = max([excess, *(float(v) for v in parts.values())])
        measured = excess / float(ev.get("step_ms", 0.0))
    except (TypeError, ValueError, ZeroDivisionError, AttributeError):
        measured = 0.0
    return max(f.est_slowdown, measured if measured == measured else 0.0, 0.0)


def as_secondary(f: Finding) -> dict:
    """A finding as an entry of another's ``evidence["secondary"]``."""
    return {"kind": f.kind.value, "ranks": list(f.ranks), "summary": f.summary,
            "first_step": f.first_step, "est_slowdown": f.est_slowdown}


def finding_to_dict(f: Finding) -> dict[str, Any]:
    """JSON-ready dict of a finding (enums as their values)."""
    d = asdict(f)
    d["kind"] = f.kind.value
    d["severity"] = f.severity.value
    d["ranks"] = list(f.ranks)
    d["hosts"] = list(f.hosts)
    d["key"] = f.key
    return _jsonable(d)


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, enum.Enum):
        return v.value
    if hasattr(v, "item") and callable(v.item):  # numpy scalar
        return v.item()
    if isinstance(v, float) and v != v:
        return None
    return v


def finding_from_dict(d: dict[str, Any]) -> Finding:
    """The inverse of :func:`finding_to_dict` (``key`` is derived, not read)."""
    return Finding(
        kind=FindingKind(d["kind"]), job=str(d["job"]), ranks=tuple(int(r) for r in d.get("ranks") or ()),
        score=float(d.get("score") or 0.0), summary=str(d.get("summary") or ""),
        severity=Severity(d.get("severity") or Severity.WARNING.value),
        hosts=tuple(str(h) for h in d.get("hosts") or ()), group_id=str(d.get("group_id") or ""),
        first_step=int(d.get("first_step", -1)), last_step=int(d.get("last_step", -1)),
        est_slowdown=float(d.get("est_slowdown") or 0.0), factor=float(d.get("factor") or 0.0),
        component=str(d.get("component") or ""), evidence=dict(d.get("evidence") or {}),
    )


def hang_to_dict(h: HangAnalysis) -> dict[str, Any]:
    """JSON-ready dict of a hang analysis (what ``GET /jobs/{job}/hang`` answers)."""
    return _jsonable({
        "job": h.job, "stalled": h.stalled, "stalled_since_ns": h.stalled_since_ns,
        "stalled_for_s": round(h.stalled_for_s, 3), "threshold_s": h.threshold_s,
        "last_step": h.last_step, "culprits": list(h.culprits),
        "hang_class": h.hang_class.value if h.hang_class else None, "group_id": h.group_id,
        "chain": [list(e) for e in h.chain], "evidence": h.evidence, "due_in_s": h.due_in_s,
    })


def hang_from_dict(d: dict[str, Any]) -> HangAnalysis:
    """The inverse of :func:`hang_to_dict`."""
    cls = d.get("hang_class")
    due = d.get("due_in_s")
    return HangAnalysis(
        job=str(d["job"]), stalled=bool(d.get("stalled")), stalled_since_ns=int(d.get("stalled_since_ns") or 0),
        stalled_for_s=float(d.get("stalled_for_s") or 0.0), threshold_s=float(d.get("threshold_s") or 0.0),
        last_step=int(d.get("last_step", -1)), culprits=tuple(int(r) for r in d.get("culprits") or ()),
        hang_class=HangClass(cls) if cls else None, group_id=str(d.get("group_id") or ""),
        chain=tuple((int(a), int(b), str(c)) for a, b, c in d.get("chain") or ()),
        evidence=dict(d.get("evidence") or {}), due_in_s=None if due is None else float(due),
    )
