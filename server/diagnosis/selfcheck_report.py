"""Self-check scores and findings as the JSON of the REST API (pure).

Status of a host = the worst of its probes' statuses: ``failed`` (a probe failed its
own checks), ``mismatch`` (numerics differ from the fleet), ``outlier`` (slower than the
fleet), ``regressed`` (slower than its own history), ``ok``.
"""

from __future__ import annotations

import enum
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any, Final

from .selfcheck import ProbeScore, SelfcheckFinding, SelfcheckReport, probe_detail


def _jsonable(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item") and callable(v.item):  # numpy scalar
        return _jsonable(v.item())
    return v


def score_to_dict(s: ProbeScore) -> dict[str, Any]:
    """JSON-ready dict of a score (NaN/inf as null)."""
    return _jsonable(asdict(s))  # type: ignore[no-any-return]


def finding_to_dict(f: SelfcheckFinding) -> dict[str, Any]:
    """JSON-ready dict of a finding (NaN/inf as null), with its ``key``."""
    d = _jsonable(asdict(f))
    d["key"] = f.key
    return d  # type: ignore[no-any-return]


_STATUS_ORDER: Final = ("failed", "mismatch", "outlier", "regressed", "ok")


def host_status(scores: Iterable[ProbeScore]) -> str:
    """The worst status among a host's scores; ``unknown`` when there are none."""
    seen = {s.status for s in scores}
    return next((st for st in _STATUS_ORDER if st in seen), "unknown")


def report_to_dict(report: SelfcheckReport, host: str) -> dict[str, Any]:
    """One host's part of a report as the JSON of ``GET /hosts/{host}/selfcheck``."""
    mine = report.for_host(host)
    return {
        "host": host,
        "status": host_status(mine.scores),
        "last_ts_ns": max((s.ts_ns for s in mine.scores), default=None),
        "probes": [score_to_dict(s) for s in mine.scores],
        "findings": [finding_to_dict(f) for f in mine.findings],
    }


def job_preflight(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Which hosts passed the self-check recorded with one job (its preflight).

    A host passed when every result it recorded for the job passed. Only each host's
    latest run counts: results older than the host's newest result by more than an hour
    belong to an earlier attempt.

    Returns:
        ``{"passed": bool, "num_hosts", "hosts": [{"host", "passed", "num_results",
        "ts_ns", "failures": [...]}]}``, failing hosts first.
    """
    by_host: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        by_host[str(r["host"])].append(r)
    hosts = []
    for host, rs in by_host.items():
        newest = max(int(r["ts_ns"]) for r in rs)
        rs = [r for r in rs if newest - int(r["ts_ns"]) <= 3600 * 10**9]
        failures = []
        for r in rs:
            if not bool(r.get("passed", True)):
                d = probe_detail(r)
                why = d.get("reason") or d.get("error") or "failed"
                failures.append(f"{r['probe']} {r['device']}: {why}")
        hosts.append({"host": host, "passed": not failures, "num_results": len(rs),
                      "ts_ns": newest, "failures": failures})
    hosts.sort(key=lambda h: (h["passed"], h["host"]))
    return {"passed": bool(hosts) and all(h["passed"] for h in hosts), "num_hosts": len(hosts),
            "hosts": hosts}



def fleet_report_to_dict(report: SelfcheckReport) -> dict[str, Any]:
    """A whole report as the JSON of ``GET /selfcheck/hosts``: per-host status, findings."""
    by_host: dict[str, list[ProbeScore]] = defaultdict(list)
    for s in report.scores:
        by_host[s.host].append(s)
    nfind = Counter(f.host for f in report.findings)
    hosts = [
        {
            "host": h,
            "status": host_status(ss),
            "last_ts_ns": max(s.ts_ns for s in ss),
            "device_models": sorted({s.device_model for s in ss}),
            "num_probes": len(ss),
            "num_findings": nfind.get(h, 0),
        }
        for h, ss in sorted(by_host.items())
    ]
    hosts.sort(key=lambda d: (_STATUS_ORDER.index(d["status"]), d["host"]))
    return {"hosts": hosts, "findings": [finding_to_dict(f) for f in report.findings]}
