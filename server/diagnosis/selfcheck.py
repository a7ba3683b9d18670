"""Fleet-relative scoring of self-check probe results (``probes`` records).

A probe figure means little alone (what *should* an H200 reach on a 8192 GEMM with
this driver?), but a host that is 15% slower than the other hosts with the same device
model, on the same probe, is a straggler in waiting (MegaScale §4.3). Each device's
latest result is scored two ways:

* **against the fleet**: all latest results of the same ``(device_model, probe,
  variant)``; ``ratio_to_median = value / median`` and the robust z-score
  ``(value - median) / (1.4826 x MAD)``. A result is an outlier when it is both
  *relatively* slow (ratio below ``min_ratio``) and *statistically* slow (z below
  ``-z_threshold``): the ratio alone would flag noise in a naturally noisy probe, the
  z-score alone would flag a 0.5% difference in a very tight fleet;
* **against its own history**: the median of the same device's earlier results of the
  same probe and variant; a drop below ``history_min_ratio`` is a regression.

Numerics results are compared by hash instead: devices of one model, variant and
library versions must produce the same bits, and the minority is flagged.

Everything above is pure (rows in, frozen dataclasses out); :mod:`.selfcheck_report`
turns the results into the REST API's JSON. :func:`host_summary` (also part of
``GET /hosts/{host}``) and :func:`fleet_summary` add the store queries.
"""

from __future__ import annotations

import enum
import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Final

from .robust import MAD_TO_SIGMA

HIGHER_IS_BETTER: Final = frozenset({"matmul", "membw", "allreduce", "alltoall", "p2p"})


class SelfcheckKind(str, enum.Enum):
    """What a self-check finding says is wrong."""

    PROBE_FAILED = "probe_failed"
    """The probe failed its own checks (wrong result, far below datasheet peak, error)."""
    FLEET_OUTLIER = "fleet_outlier"
    """Slower than the fleet's devices of the same model on the same probe."""
    HISTORY_REGRESSION = "history_regression"
    """Slower than this device's own earlier results."""
    NUMERICS_MISMATCH = "numerics_mismatch"
    """Result bits differ from the fleet majority: possible silent data corruption."""


@dataclass(frozen=True)
class ScoringConfig:
    """Thresholds of the scoring."""

    min_ratio: float = 0.9
    """Outlier only below this fraction of the fleet median (10% slower, as MegaScale's
    stragglers that cost it ~0.7% MFU)."""
    z_threshold: float = 3.5
    """... and with a robust z-score below ``-z_threshold``."""
    min_fleet_samples: int = 3
    """Fewest devices in a group for a fleet comparison."""
    history_min_ratio: float = 0.9
    """Regression below this fraction of the device's own history median."""
    min_history_runs: int = 2
    """Fewest earlier results for a history comparison."""
    critical_ratio: float = 0.7
    """Findings below this ratio are critical rather than warnings."""

    def __post_init__(self) -> None:
        for name in ("min_ratio", "history_min_ratio", "critical_ratio"):
            v = getattr(self, name)
            if not 0 < v < 1:
                raise ValueError(f"{name} must be between 0 and 1, got {v!r}")
        if self.z_threshold <= 0 or self.min_fleet_samples < 2 or self.min_history_runs < 1:
            raise ValueError("z_threshold > 0, min_fleet_samples >= 2, min_history_runs >= 1")


@dataclass(frozen=True)
class ProbeScore:
    """The latest result of one probe on one device, with its fleet and history scores."""

    host: str
    device: str
    device_model: str
    probe: str
    variant: str
    value: float
    unit: str
    peak_fraction: float
    passed: bool
    ts_ns: int
    job: str
    fleet_samples: int = 0
    fleet_hosts: int = 0
    fleet_median: float = math.nan
    ratio_to_median: float = math.nan
    robust_z: float = math.nan
    history_runs: int = 0
    history_median: float = math.nan
    ratio_to_history: float = math.nan
    status: str = "ok"
    """``ok``, ``failed``, ``mismatch``, ``outlier`` or ``regressed`` (worst first)."""
    detail: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class SelfcheckFinding:
    """A host/device that failed or scored badly."""

    kind: SelfcheckKind
    host: str
    device: str
    device_model: str
    probe: str
    variant: str
    value: float
    reference: float
    """Fleet median, history median, or NaN (failures, numerics)."""
    ratio: float
    score: float
    """Strength: > 1 means beyond the detection threshold; larger is worse."""
    severity: str
    """``warning`` or ``critical``."""
    summary: str
    job: str = ""
    ts_ns: int = 0
    evidence: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        """Identifies the same problem across evaluations (for incidents)."""
        return f"selfcheck:{self.kind.value}:{self.host}:{self.device}:{self.probe}:{self.variant}"


@dataclass(frozen=True)
class SelfcheckReport:
    scores: tuple[ProbeScore, ...]
    findings: tuple[SelfcheckFinding, ...]

    def for_host(self, host: str) -> SelfcheckReport:
        return SelfcheckReport(
            tuple(s for s in self.scores if s.host == host),
            tuple(f for f in self.findings if f.host == host),
        )


# ---------------------------------------------------------------------------------------
# pure scoring
# ---------------------------------------------------------------------------------------
def robust_z(value: float, values: Iterable[float]) -> tuple[float, float]:
    """(median, robust z-score of ``value``) within ``values``.

    With a zero MAD (identical values) the z-score is 0 for the median and ±inf
    otherwise.
    """
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return math.nan, math.nan
    med = median(vals)
    mad = median(abs(v - med) for v in vals) * MAD_TO_SIGMA
    if mad == 0:
        return med, 0.0 if value == med else math.copysign(math.inf, value - med)
    return med, (value - med) / mad


def probe_detail(row: Mapping[str, Any]) -> dict[str, Any]:
    """A record's ``detail`` JSON as a dict ({} when missing or malformed)."""
    raw = row.get("detail", "{}")
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        doc = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _variant(row: Mapping[str, Any], detail: Mapping[str, Any]) -> str:
    v = row.get("variant")
    return str(v) if v not in (None, "") else str(detail.get("variant", ""))


def score_probes(
    rows: Iterable[Mapping[str, Any]], config: ScoringConfig = ScoringConfig()
) -> SelfcheckReport:
    """Score the latest result of every (host, device, probe, variant) in ``rows``.

    Args:
        rows: ``probes`` records (dicts or DataFrame records); the newest row of each
            key is its latest result, older rows of the key are its history. A
            ``variant`` column is used when present, else ``detail['variant']``.
        config: thresholds.

    Returns:
        One score per key and the findings, worst first.
    """
    by_key: dict[tuple[str, str, str, str], list[tuple[Mapping[str, Any], dict[str, Any]]]] = (
        defaultdict(list)
    )
    for row in rows:
        detail = probe_detail(row)
        key = (str(row["host"]), str(row["device"]), str(row["probe"]), _variant(row, detail))
        by_key[key].append((row, detail))
    latest: dict[tuple[str, str, str, str], tuple[Mapping[str, Any], dict[str, Any]]] = {}
    history: dict[tuple[str, str, str, str], list[float]] = {}
    for key, items in by_key.items():
        items.sort(key=lambda it: int(it[0]["ts_ns"]), reverse=True)
        latest[key] = items[0]
        history[key] = [float(r["value"]) for r, _ in items[1:] if bool(r.get("passed", True))]

    groups: dict[tuple[str, str, str], list[tuple[str, str, str, str]]] = defaultdict(list)
    for key, (row, _) in latest.items():
        groups[(str(row.get("device_model", "")), key[2], key[3])].append(key)

    scores: list[ProbeScore] = []
    findings: list[SelfcheckFinding] = []
    for (model, probe, variant), keys in sorted(groups.items()):
        mismatched = _numerics_minority(keys, latest, config.min_fleet_samples) if probe == "numerics" else {}
        fleet_vals = [float(latest[k][0]["value"]) for k in keys if bool(latest[k][0].get("passed", True))]
        fleet_hosts = len({k[0] for k in keys})
        for key in sorted(keys):
            row, detail = latest[key]
            value = float(row["value"])
            base = dict(
                host=key[0], device=key[1], device_model=model, probe=probe, variant=variant,
                value=value, unit=str(row.get("unit", "")),
                peak_fraction=float(row.get("peak_fraction", math.nan)),
                passed=bool(row.get("passed", True)), ts_ns=int(row["ts_ns"]),
                job=str(row.get("job", "")), detail=detail,
            )
            s, f = _score_one(base, probe, fleet_vals, fleet_hosts, history[key],
                              mismatched.get(key), config)
            scores.append(s)
            findings.extend(f)
    findings.sort(key=lambda f: (f.severity != "critical", -f.score, f.host, f.device))
    return SelfcheckReport(tuple(scores), tuple(findings))


def _numerics_minority(
    keys: list[tuple[str, str, str, str]],
    latest: Mapping[tuple[str, str, str, str], tuple[Mapping[str, Any], dict[str, Any]]],
    min_devices: int,
) -> dict[tuple[str, str, str, str], str]:
    """Keys whose hash differs from the majority of comparable devices -> the majority hash.

    A comparison needs ``min_devices`` comparable devices: two that disagree cannot say
    which is wrong (and while a preflight's results arrive host by host, the first two
    would otherwise flag a healthy host before the third settles it).
    """
    by_versions: dict[str, list[tuple[str, str, str, str]]] = defaultdict(list)
    for k in keys:
        detail = latest[k][1]
        if detail.get("hash"):
            by_versions[json.dumps(detail.get("versions", {}), sort_keys=True)].append(k)
    out: dict[tuple[str, str, str, str], str] = {}
    for ks in by_versions.values():
        counts = Counter(latest[k][1]["hash"] for k in ks)
        if len(counts) < 2 or len(ks) < min_devices:
            continue
        (top, top_n), (_, second_n) = counts.most_common(2)
        majority = top if top_n > second_n else ""
        for k in ks:
            if latest[k][1]["hash"] != majority:
                out[k] = majority
    return out


def _score_one(
    base: dict[str, Any],
    probe: str,
    fleet_vals: list[float],
    fleet_hosts: int,
    hist: list[float],
    numerics_majority: str | None,
    config: ScoringConfig,
) -> tuple[ProbeScore, list[SelfcheckFinding]]:
    value = base["value"]
    findings: list[SelfcheckFinding] = []
    status = "ok"

    def finding(kind: SelfcheckKind, reference: float, ratio: float, score: float,
                critical: bool, summary: str, **evidence: Any) -> SelfcheckFinding:
        return SelfcheckFinding(
            kind=kind, host=base["host"], device=base["device"],
            device_model=base["device_model"], probe=probe, variant=base["variant"],
            value=value, reference=reference, ratio=ratio, score=score,
            severity="critical" if critical else "warning", summary=summary,
            job=base["job"], ts_ns=base["ts_ns"], evidence=evidence,
        )

    where = f"{base['host']} {base['device']} {probe} ({base['variant']})"
    extra: dict[str, Any] = {}
    if probe in HIGHER_IS_BETTER and len(fleet_vals) >= config.min_fleet_samples:
        med, z = robust_z(value, fleet_vals)
        ratio = value / med if med > 0 else math.nan
        extra.update(fleet_samples=len(fleet_vals), fleet_hosts=fleet_hosts, fleet_median=med,
                     ratio_to_median=ratio, robust_z=z)
        if base["passed"] and ratio < config.min_ratio and z < -config.z_threshold:
            status = "outlier"
            findings.append(finding(
                SelfcheckKind.FLEET_OUTLIER, med, ratio,
                (1 - ratio) / (1 - config.min_ratio), ratio < config.critical_ratio,
                f"{where}: {value:.4g} {base['unit']} is {ratio:.0%} of the fleet median "
                f"{med:.4g} over {len(fleet_vals)} devices (robust z {z:.1f})",
                fleet_samples=len(fleet_vals), robust_z=z))
    if probe in HIGHER_IS_BETTER and len(hist) >= config.min_history_runs:
        hmed = median(hist)
        hratio = value / hmed if hmed > 0 else math.nan
        extra.update(history_runs=len(hist), history_median=hmed, ratio_to_history=hratio)
        if base["passed"] and hratio < config.history_min_ratio:
            status = "outlier" if status == "outlier" else "regressed"
            findings.append(finding(
                SelfcheckKind.HISTORY_REGRESSION, hmed, hratio,
                (1 - hratio) / (1 - config.history_min_ratio), hratio < config.critical_ratio,
                f"{where}: {value:.4g} {base['unit']} is {hratio:.0%} of its own median "
                f"{hmed:.4g} over {len(hist)} earlier runs", history=hist[:10]))
    if numerics_majority is not None:
        status = "mismatch"
        h = base["detail"].get("hash", "")
        findings.append(finding(
            SelfcheckKind.NUMERICS_MISMATCH, math.nan, math.nan, 2.0, True,
            f"{where}: result hash {h} differs from "
            + (f"the fleet majority {numerics_majority}" if numerics_majority
               else "other devices (no majority)") + ": possible silent data corruption",
            hash=h, majority=numerics_majority))
    if not base["passed"]:
        status = "failed"
        reason = base["detail"].get("reason") or base["detail"].get("error") or "failed"
        findings.append(finding(
            SelfcheckKind.PROBE_FAILED, math.nan, math.nan, 2.0, True,
            f"{where} failed: {reason}", reason=reason))
    return ProbeScore(**base, status=status, **extra), findings


# ---------------------------------------------------------------------------------------
# with the store
# ---------------------------------------------------------------------------------------
DEFAULT_WINDOW_S: Final = 30 * 86400
"""Results older than this are ignored."""


def _since(window_s: float, now_ns: int | None) -> int:
    return (now_ns if now_ns is not None else time.time_ns()) - int(window_s * 1e9)


def host_summary(
    store: Any,
    host: str,
    *,
    window_s: float = DEFAULT_WINDOW_S,
    history: int = 10,
    config: ScoringConfig = ScoringConfig(),
    now_ns: int | None = None,
) -> dict[str, Any] | None:
    """A host's latest probe results with fleet and history scores, and its findings.

    Args:
        store: the telemetry store (``query_rows(sql, params)``).
        host: host name.
        window_s: only results newer than this many seconds.
        history: earlier results per probe used for the history score.
        config: thresholds.
        now_ns: "now" (tests); default the current time.

    Returns:
        ``{"host", "status", "last_ts_ns", "probes": [...], "findings": [...]}``, or None
        when the host has no probe results in the window.
    """
    from fleetscope.server.store import probe_queries

    since = _since(window_s, now_ns)
    own = probe_queries.recent_probes(store, since_ns=since, per_key=history + 1, host=host)
    if not own:
        return None
    models = sorted({str(r["device_model"]) for r in own})
    fleet = probe_queries.recent_probes(store, since_ns=since, per_key=1, models=models)
    rows = [r for r in fleet if r["host"] != host] + own
    from .selfcheck_report import report_to_dict

    return report_to_dict(score_probes(rows, config), host)


def fleet_summary(
    store: Any,
    *,
    window_s: float = DEFAULT_WINDOW_S,
    history: int = 5,
    device_model: str | None = None,
    config: ScoringConfig = ScoringConfig(),
    now_ns: int | None = None,
) -> dict[str, Any]:
    """Every host's self-check status and findings (``GET /selfcheck/hosts``).

    Args:
        store: the telemetry store.
        window_s: only results newer than this many seconds.
        history: earlier results per probe used for the history score (0: none).
        device_model: only this device model.
        config: thresholds.
        now_ns: "now" (tests).

    Returns:
        ``{"hosts": [{"host", "status", "last_ts_ns", "num_probes", "findings"}...],
        "findings": [... worst first]}``.
    """
    from fleetscope.server.store import probe_queries

    rows = probe_queries.recent_probes(
        store, since_ns=_since(window_s, now_ns), per_key=history + 1,
        models=[device_model] if device_model else [],
    )
    from .selfcheck_report import fleet_report_to_dict

    return fleet_report_to_dict(score_probes(rows, config))
