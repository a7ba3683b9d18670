"""Health findings: heartbeat loss and hardware errors, joined to the ranks they affect.

Heartbeats come from the per-host agent (one row per local rank plus one host row with
``rank = -1``). Hardware signals are agent ``log_events`` (XID, ECC, CUDA errors, NCCL
warnings) and ``metrics`` counters (throttle reasons, ECC error counts, NIC carrier
changes / link flaps). :func:`hardware_evidence` returns them per rank so straggler and
hang findings of the same ranks and time can carry them as evidence.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .findings import Finding, FindingKind, Severity
from .robust import mad_sigma

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


def _median_of_others(values: np.ndarray) -> np.ndarray:
    """For each element, the median of all the *other* elements (0 when there are none);
    O(n log n)."""
    n = len(values)
    if n < 2:
        return np.zeros(n)
    order = np.argsort(values, kind="stable")
    srt = values[order]
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    m = n - 1  # the others, sorted: srt without position rank[i]

    def at(j: int) -> np.ndarray:  # element j of the others, for every i at once
        return np.where(j < rank, srt[j], srt[min(j + 1, n - 1)])

    if m % 2:
        return at(m // 2)
    return (at(m // 2 - 1) + at(m // 2)) / 2.0


SILENCE_SPREAD_K = 3.0
"""A host's silence is its own when it exceeds the other hosts' median by this many of
their robust standard deviations (and by the floor, ``stale_s`` / ``silent_s``)."""
_EXACT_OTHERS = 64
"""Up to this many hosts the others' spread is computed without the host itself; past it
one host cannot move the fleet's MAD, so the fleet's is used (O(n log n))."""


def silent_beyond_others(ages_s: np.ndarray, floor_s: float) -> np.ndarray:
    """Per host: is its silence (``ages_s``, seconds since it was last heard from) its own?
    True when it exceeds the median of the *other* hosts' silences by ``floor_s`` and by
    :data:`SILENCE_SPREAD_K` of their robust spread. When ingest runs behind (agents
    queued behind an overloaded server) every host's last arrival ages together, spread
    over one delivery cycle, and no host is singled out; a dead host's silence keeps
    growing until it stands out, later the further behind the server is."""
    ages = np.asarray(ages_s, dtype=float)
    n = len(ages)
    if n == 0:
        return np.zeros(0, dtype=bool)
    if n == 1:
        return ages >= floor_s
    if n <= _EXACT_OTHERS:
        limit = np.empty(n)
        for i in range(n):
            others = np.delete(ages, i)
            limit[i] = np.median(others) + max(floor_s, SILENCE_SPREAD_K * mad_sigma(others))
    else:
        limit = _median_of_others(ages) + max(floor_s, SILENCE_SPREAD_K * mad_sigma(ages))
    return ages >= limit


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
    (a CPU-starved host). A host's heartbeats are also judged against the other hosts':
    they count as lost only when ``stale_s`` older than the median of the others' (all
    of them ageing together is ingest running behind, not 1,536 dead agents). A host gone
    silent altogether stalls the job, which the hang analysis reports with the heartbeat
    facts as evidence.
    """
    if heartbeats.empty:
        return []
    hb = heartbeats.sort_values("ts_ns")
    # vectorised per host (a Python loop over 1,536 hosts' groups cost a minute per pass)
    latest = hb.groupby(["host", "rank"], sort=False).tail(1)
    host_ts = hb.groupby("host")["ts_ns"].max()
    hosts = host_ts.index.astype(str)
    age = (now_ns - host_ts.to_numpy(dtype="int64")) / 1e9
    data = np.array([int((host_data_ns or {}).get(h, now_ns)) for h in hosts], dtype="int64")
    seen = np.array([int((host_seen_ns or {}).get(h, 0)) for h in hosts], dtype="int64")
    behind = (data - host_ts.to_numpy(dtype="int64")) / 1e9
    delivered = (now_ns - seen) / 1e9
    # and stale beyond what is usual for the other hosts right now: when ingest runs behind
    # (agents queued behind an overloaded server), every host's heartbeats age together
    silent = ((age > stale_s) & (behind > stale_s) & (delivered > stale_s)
              & silent_beyond_others(age, stale_s))
    silent_hosts = host_ts.index[silent]
    mine = latest[(latest["rank"] >= 0) & latest["host"].isin(set(silent_hosts))] if silent.any() else latest[:0]
    ranks_of = mine.groupby("host")["rank"].apply(lambda x: sorted(int(r) for r in x)) if len(mine) else {}
    out = []
    for host, a, last_ts in zip(host_ts.index[silent], age[silent], host_ts.to_numpy()[silent]):
        ranks = ranks_of.get(host, [])
        out.append(Finding(
            kind=FindingKind.HEARTBEAT_LOST, job=job, ranks=tuple(ranks), score=float(a) / stale_s,
            severity=Severity.CRITICAL, hosts=(str(host),),
            summary=f"host {host}: no heartbeat for {a:.0f}s (ranks {ranks})",
            evidence={"last_heartbeat_ns": int(last_ts), "age_s": round(float(a), 1)},
        ))
    rk = latest[(latest["rank"] >= 0) & ~latest["host"].isin(set(host_ts.index[silent]))]
    dead = rk[rk["alive"].astype(int) == 0]
    if "dead_since_ns" in dead.columns:  # a finished job's final records may still be in flight
        dead = dead[now_ns - dead["dead_since_ns"] >= min_dead_s * 1e9]
    if "caught_up" in dead.columns:
        dead = dead[dead["caught_up"].astype(int) == 1]
    if dead.empty:
        return out
    n_ranks = rk.groupby("host")["rank"].size()
    for host, g in dead.groupby("host"):
        if len(g) == int(n_ranks.get(host, 0)):
            continue  # every rank exited: a finished job or a crash, which the hang analysis owns
        dr = sorted(int(r) for r in g["rank"])
        out.append(Finding(
            kind=FindingKind.HEARTBEAT_LOST, job=job, ranks=tuple(dr), score=float(len(dr)),
            severity=Severity.CRITICAL, hosts=(str(host),),
            summary=f"host {host}: rank process(es) {dr} exited",
            evidence={"pids": {str(int(r)): int(p) for r, p in zip(g["rank"], g["pid"])}},
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


def host_last_arrival(frames, host_seen_ns: dict[str, int] | None = None,
                      job_only: bool = False) -> dict[str, int]:
    """Host -> newest sign of life of the job on it: its ranks' latest records and rank
    heartbeats, and - unless ``job_only`` - its agent's host heartbeats and when the server
    last received a batch from it (``host_seen_ns``, the server's clock; absent after a
    restart). The agent-level signals also come from other jobs on the same host, so they
    say the host is up, never that this job is."""
    both = _host_arrivals(frames, host_seen_ns)
    return both[1] if job_only else both[0]


def _host_arrivals(frames, host_seen_ns: dict[str, int] | None) -> tuple[dict[str, int], dict[str, int]]:
    """:func:`host_last_arrival` with and without ``job_only``, from one pass over the
    frames (arrays: 12,288 ranks on 1,536 hosts)."""
    hosts = frames.hosts
    base: dict[str, int] = {}
    for h in set(hosts.values()):
        base.setdefault(h, 0)
    job_parts: list[tuple[np.ndarray, np.ndarray]] = []
    agent_parts: list[tuple[np.ndarray, np.ndarray]] = []
    seen = frames.last_seen or {}
    if seen and hosts:  # its ranks' records
        ranks = np.fromiter((int(r) for r in seen), dtype=np.int64, count=len(seen))
        host_of = pd.Series(hosts, dtype=object).reindex(ranks).to_numpy(dtype=object)
        job_parts.append((host_of, np.fromiter(seen.values(), dtype=np.int64, count=len(seen))))
    hb = frames.heartbeats
    if hb is not None and not hb.empty:
        rank_rows = (hb["rank"] >= 0).to_numpy()
        h_all, t_all = hb["host"].to_numpy(dtype=object), hb["ts_ns"].to_numpy().astype(np.int64)
        job_parts.append((h_all[rank_rows], t_all[rank_rows]))  # rank heartbeats
        agent_parts.append((h_all[~rank_rows], t_all[~rank_rows]))  # the agents' own
    for d in (getattr(frames, "host_last_ns", None) or {}, host_seen_ns or {}):
        if d:
            agent_parts.append((np.array(list(d.keys()), dtype=object),
                                np.fromiter((int(v) for v in d.values()), dtype=np.int64, count=len(d))))
    if not frames.steps.empty and "end_ns" in frames.steps:
        job_parts.append((frames.steps["host"].to_numpy(dtype=object), frames.steps["end_ns"].to_numpy().astype(np.int64)))

    names = list(base)
    index = pd.Index(names, dtype=object)

    def newest(parts: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """Per host of ``names``: its newest positive time in ``parts`` (0: none)."""
        best = np.zeros(len(names), dtype=np.int64)
        if parts and names:
            code = index.get_indexer(np.concatenate([p[0] for p in parts]))
            t = np.concatenate([p[1] for p in parts])
            keep = (code >= 0) & (t > 0)
            np.maximum.at(best, code[keep], t[keep])
        return best

    def merged(*news: np.ndarray) -> dict[str, int]:
        best = np.maximum.reduce(news) if len(news) > 1 else news[0]
        return dict(zip(names, best.tolist()))

    job_new = newest(job_parts)
    agent_new = newest(agent_parts)
    return merged(job_new, agent_new), merged(job_new)


def detect_silence(job: str, frames, now_ns: int, silent_s: float,
                   host_seen_ns: dict[str, int] | None = None) -> list[Finding]:
    """Nothing arrived for ``silent_s``: from the whole job (``job_silent``: every rank and
    agent went quiet at once, e.g. a crash that took the job and its agent down), or from
    one host while the job's other hosts still report (``host_down``). Both are
    ``heartbeat_lost`` findings (they page like one) with ``evidence["silence"]`` set to
    ``job`` or ``host``, naming the ranks and hosts as last seen and the last step."""
    last, job_last = _host_arrivals(frames, host_seen_ns)
    if not last or max(job_last.values()) <= 0:
        return []
    hosts = frames.hosts
    seen = {int(r): int(t) for r, t in (frames.last_seen or {}).items() if t > 0}
    rank_step = ({int(r): int(s) for r, s in frames.steps.groupby("rank")["step"].max().items()}
                 if not frames.steps.empty else {})
    # the job's own records' times, or when a batch of its rows last arrived: with ingest
    # running behind, records keep arriving although their own times are old
    newest = max(max(job_last.values()), int(getattr(frames, "job_seen_ns", 0) or 0))
    quiet_s = (now_ns - newest) / 1e9
    if quiet_s >= silent_s:
        order = sorted(seen, key=lambda r: (seen[r], r))
        t0 = seen[order[0]] if order else 0
        first = [r for r in order if seen[r] - t0 < 1_000_000_000]
        latest = [r for r in order if seen[order[-1]] - seen[r] < 1_000_000_000] if order else []
        ranks = tuple((order or sorted(hosts))[:64])
        return [Finding(
            kind=FindingKind.HEARTBEAT_LOST, job=job, ranks=ranks, score=quiet_s / silent_s,
            severity=Severity.CRITICAL, hosts=tuple(sorted(job_last)), last_step=int(frames.last_step),
            summary=f"job silent: nothing arrived from any of its {len(hosts) or len(seen)} rank(s) on "
                    f"{len(job_last)} host(s) for {quiet_s:.0f}s; last step {frames.last_step}; "
                    f"rank(s) {first[:8]} went silent first",
            evidence={"silence": "job", "what": "job_silent", "silent_for_s": round(quiet_s, 1),
                      "last_step": int(frames.last_step), "first_silent_ranks": first[:64],
                      "last_seen_ranks": latest[:64],
                      "host_last_seen_ns": {h: int(t) for h, t in sorted(job_last.items())},
                      "rank_last_step": {str(r): rank_step[r] for r in sorted(rank_step)[:64]}},
        )]
    out = []
    names = sorted(last)
    ages = np.array([(now_ns - last[h]) / 1e9 if last[h] > 0 else quiet_s for h in names])
    own = silent_beyond_others(ages, silent_s)
    others = _median_of_others(ages)
    for h, age_s, usual_s, down in zip(names, ages.tolist(), others.tolist(), own.tolist()):
        if not down:  # not silent beyond what the job's other hosts show right now
            continue
        t = last[h]
        ranks = tuple(sorted(r for r, hh in hosts.items() if hh == h))
        steps = [rank_step[r] for r in ranks if r in rank_step]
        out.append(Finding(
            kind=FindingKind.HEARTBEAT_LOST, job=job, ranks=ranks, score=age_s / silent_s,
            severity=Severity.CRITICAL, hosts=(h,), last_step=max(steps) if steps else -1,
            summary=f"host {h} down: nothing arrived from it (agent and rank(s) {list(ranks)[:8]}) for "
                    f"{age_s:.0f}s while the job's other hosts report; its last step "
                    f"{max(steps) if steps else 'unknown'}",
            evidence={"silence": "host", "what": "host_down", "silent_for_s": round(age_s, 1),
                      "others_silent_for_s": round(usual_s, 1),
                      "last_seen_ns": int(t), "last_step": max(steps) if steps else -1,
                      "ranks_last_seen_ns": {str(r): seen.get(r, 0) for r in ranks}},
        ))
    return out
