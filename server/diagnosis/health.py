"""Health findings: heartbeat loss and hardware errors, joined to the ranks they affect.

Heartbeats come from the per-host agent (one row per local rank plus one host row with
``rank = -1``). Hardware signals are agent ``log_events`` (XID, ECC, CUDA errors, NCCL
warnings) and ``metrics`` counters (throttle reasons, ECC error counts, NIC carrier
changes / link flaps). :func:`hardware_evidence` returns them per rank so straggler and
hang findings of the same ranks and time can carry them as evidence.
"""

from __future__ import annotations

import pandas as pd

from .findings import Finding, FindingKind, Severity

HW_LOG_KINDS = frozenset({"xid", "ecc", "cuda_error"})
RISING_IS_BAD = (
    "nic.carrier_changes", "gpu.ecc_uncorrected_volatile", "gpu.ecc_uncorrected_aggregate",
    "gpu.retired_pages_dbe", "gpu.retired_pages_sbe", "gpu.remapped_rows_uncorrectable",
    "rdma.link_downed", "rdma.symbol_error",
)
"""Counters whose increase within the window is a hardware event."""
NONZERO_IS_BAD = ("gpu.remapped_rows_pending",)
DROP_TO_ZERO_IS_BAD = ("nic.up", "nic.carrier")
"""Link state gauges: a fall from 1 to 0 within the window is a link going down."""
THROTTLE_BAD_MASK = 0x8 | 0x40 | 0x80 | 0x100
"""NVML clock-event reasons that mean slowdown: HW slowdown, SW/HW thermal, power brake."""
HW_METRIC_PATTERNS = ("xid", "ecc", "throttle", "carrier", "flap", "link_down", "retired", "remapped", "nic.up")


def detect_heartbeat_loss(
    job: str, heartbeats: pd.DataFrame, now_ns: int, stale_s: float = 15.0, min_dead_s: float = 5.0,
    host_data_ns: dict[str, int] | None = None, host_seen_ns: dict[str, int] | None = None,
) -> list[Finding]:
    """One finding per host whose agent went silent or whose rank processes died.

    ``host_data_ns`` (host -> newest telemetry time stored from it) separates a silent
    agent from ingest lag: heartbeats count as lost only when they are ``stale_s`` older
    than the host's other telemetry. ``host_seen_ns`` (host -> when the server last
    received a batch from its agent) is proof of life: an agent that delivered within
    ``stale_s`` is not silent, even when its heartbeat thread falls behind its shipping
    (a CPU-starved host). A host gone silent altogether stalls the job, which the hang
    analysis reports with the heartbeat facts as evidence.
    """
    if heartbeats.empty:
        return []
    hb = heartbeats.sort_values("ts_ns")
    out = []
    for host, g in hb.groupby("host"):
        last_ts = int(g["ts_ns"].max())
        latest = g.groupby("rank").tail(1)
        ranks = sorted(int(r) for r in latest["rank"] if r >= 0)
        age_s = (now_ns - last_ts) / 1e9
        behind_s = (int((host_data_ns or {}).get(str(host), now_ns)) - last_ts) / 1e9
        delivered_s = (now_ns - int((host_seen_ns or {}).get(str(host), 0))) / 1e9
        if age_s > stale_s and behind_s > stale_s and delivered_s > stale_s:
            out.append(Finding(
                kind=FindingKind.HEARTBEAT_LOST, job=job, ranks=tuple(ranks), score=age_s / stale_s,
                severity=Severity.CRITICAL, hosts=(str(host),),
                summary=f"host {host}: no heartbeat for {age_s:.0f}s (ranks {ranks})",
                evidence={"last_heartbeat_ns": last_ts, "age_s": round(age_s, 1)},
            ))
            continue
        dead = latest[(latest["rank"] >= 0) & (latest["alive"].astype(int) == 0)]
        if "dead_since_ns" in dead.columns:  # a finished job's final records may still be in flight
            dead = dead[now_ns - dead["dead_since_ns"] >= min_dead_s * 1e9]
        if "caught_up" in dead.columns:
            dead = dead[dead["caught_up"].astype(int) == 1]
        ranks_rows = latest[latest["rank"] >= 0]
        if len(dead) and len(dead) == len(ranks_rows):
            continue  # every rank exited: a finished job or a crash, which the hang analysis owns
        if not dead.empty:
            dr = sorted(int(r) for r in dead["rank"])
            out.append(Finding(
                kind=FindingKind.HEARTBEAT_LOST, job=job, ranks=tuple(dr), score=float(len(dr)),
                severity=Severity.CRITICAL, hosts=(str(host),),
                summary=f"host {host}: rank process(es) {dr} exited",
                evidence={"pids": {str(int(r)): int(p) for r, p in zip(dead["rank"], dead["pid"])}},
            ))
    return out


def _hw_metrics(metrics: pd.DataFrame) -> pd.DataFrame:
    """Rows (host, rank, device, name, first, last) of hardware metrics that signal trouble."""
    if metrics.empty:
        return metrics
    m = metrics.sort_values("ts_ns")
    g = m.groupby(["host", "rank", "device", "name"])["value"]
    agg = pd.DataFrame({"first": g.first(), "last": g.last(), "min": g.min(), "max": g.max()}).reset_index()
    name = agg["name"]
    rising = name.isin(RISING_IS_BAD) & (agg["last"] > agg["first"])
    nonzero = name.isin(NONZERO_IS_BAD) & (agg["max"] > 0)
    dropped = name.isin(DROP_TO_ZERO_IS_BAD) & (agg["max"] > 0) & (agg["min"] <= 0)
    throttle = (name == "gpu.throttle_reasons") & (
        agg["max"].fillna(0).astype("int64") & THROTTLE_BAD_MASK).astype(bool)
    return agg[rising | nonzero | dropped | throttle]


def hardware_evidence(
    log_events: pd.DataFrame, metrics: pd.DataFrame, rank_hosts: dict[int, str]
) -> dict[int, list[str]]:
    """Rank -> human-readable hardware events (host-level events apply to all its ranks)."""
    by_host: dict[str, list[int]] = {}
    for r, h in rank_hosts.items():
        by_host.setdefault(h, []).append(r)
    out: dict[int, list[str]] = {}

    def add(host: str, rank: int, text: str) -> None:
        for r in [rank] if rank >= 0 else by_host.get(host, []):
            out.setdefault(int(r), []).append(text)

    if log_events is not None and not log_events.empty:
        ev = log_events[log_events["kind"].isin(HW_LOG_KINDS)]
        for row in ev.tail(200).itertuples(index=False):
            add(str(row.host), int(row.rank), f"{row.kind}: {str(row.message)[:160]}")
    if metrics is not None and not metrics.empty:
        for row in _hw_metrics(metrics).itertuples(index=False):
            add(str(row.host), int(row.rank), f"{row.name} on {row.device or row.host}: {row.first:g} -> {row.last:g}")
    return out


def detect_hardware_errors(
    job: str, log_events: pd.DataFrame, metrics: pd.DataFrame, rank_hosts: dict[int, str]
) -> list[Finding]:
    """One finding per affected host, listing the ranks it serves and the events."""
    ev = hardware_evidence(log_events, metrics, rank_hosts)
    per_host: dict[str, dict[int, list[str]]] = {}
    for r, items in ev.items():
        per_host.setdefault(rank_hosts.get(r, "?"), {})[r] = items
    out = []
    for host, ranks in sorted(per_host.items()):
        events = sorted({e for items in ranks.values() for e in items})
        out.append(Finding(
            kind=FindingKind.HARDWARE_ERROR, job=job, ranks=tuple(sorted(ranks)),
            score=float(len(events)), severity=Severity.CRITICAL, hosts=(host,),
            summary=f"host {host}: {len(events)} hardware event(s): {events[0]}",
            evidence={"events": events[:20]},
        ))
    return out
