"""One fault, one story: secondary effects become evidence of the finding that explains them.

A slow rank makes the job's MFU drop, makes its peers wait (their steps stretch; a
loaded peer may show a few long steps that look like GC pauses) and may be slow
because its GPU throttles. Reported separately these are four incidents for one fault,
and the operator has to work out which one is the cause. :func:`fold_secondary` keeps
the *primary* findings (a hang; else stragglers - slow compute, data loading, late
arrival, slow link) and moves into the primary's ``evidence["secondary"]``:

* an MFU drop while a primary exists (the drop is the primary's cost: its what-if
  ``est_slowdown`` says how much); it stays a finding of its own when nothing explains
  it (every rank slowed alike, or no straggler found);
* GC-like pauses on a rank that shares a TP, PP or DP group with a primary's culprit
  (it waits on the culprit), or on any rank while the job hangs;
* a straggler finding on a rank that shares a TP, PP or DP group, or a host, with a
  primary whose cost is at least :data:`SIDE_EFFECT_RATIO` times its own (a stalled data
  loader makes its group's peers compute while it sleeps; on shared CPUs they then
  compute slower, and a co-located rank's untimed host work stretches): a side effect of
  the big one, not a second fault. A finding's cost is the larger of its what-if
  ``est_slowdown`` and its measured excess over the step time (``evidence.excess_ms``,
  or a link's ``excess_ms_per_step``, or its largest component's excess where larger,
  over ``evidence.step_ms``): the what-if can read ~0 where it misses (a pipeline it
  models as absorbing the delay), while the excess was measured;
* GPU clock throttling on a primary's culprit (the likely cause: the summary says so).
  Other hardware errors (XID, ECC, NIC flaps) stay findings of their own: they page.

Pure: findings in, findings out.
"""

from __future__ import annotations

from dataclasses import replace

from fleetscope.topology import Topology

from .findings import Finding, FindingKind, as_secondary, finding_cost

PRIMARY_KINDS = frozenset({FindingKind.SLOW_COMPUTE, FindingKind.SLOW_DATALOADER,
                           FindingKind.LATE_ARRIVAL, FindingKind.SLOW_LINK,
                           FindingKind.HOST_CONTENTION})
THROTTLE_METRIC = "gpu.throttle_reasons"
SIDE_EFFECT_RATIO = 4.0
"""A neighbour's straggler finding costing less than 1/4 of a primary's is its side effect."""


def _neighbours(topo: Topology | None, ranks: tuple[int, ...]) -> set[int]:
    """Ranks sharing a TP, PP or DP group with any of ``ranks`` (and the ranks)."""
    out = set(ranks)
    if topo is None:
        return out
    for r in ranks:
        if 0 <= r < topo.world_size:
            for axis in ("tp", "pp", "dp"):
                out.update(topo.group_ranks(axis, r))
    return out


def fold_secondary(findings: list[Finding], topo: Topology | None = None) -> list[Finding]:
    """The findings with secondary effects folded into the primary they belong to.

    Order is kept; a primary that received evidence is replaced by a copy carrying it
    in ``evidence["secondary"]`` (a list of ``{kind, ranks, summary, ...}``).
    """
    hang = next((f for f in findings if f.kind == FindingKind.HANG), None)
    primaries = [f for f in findings if f.kind in PRIMARY_KINDS]
    if hang is None and not primaries:
        return findings
    extra: dict[int, list[dict]] = {}
    cause: dict[int, list[str]] = {}
    drop: set[int] = set()
    by_id = {id(f): i for i, f in enumerate(findings)}

    def attach(owner: Finding, f: Finding) -> None:
        extra.setdefault(by_id[id(owner)], []).append(as_secondary(f))
        drop.add(id(f))

    strongest = max(primaries, key=lambda f: (f.est_slowdown, f.score)) if primaries else hang
    cost = {id(f): finding_cost(f) for f in primaries}
    for f in primaries:  # small stragglers next to a big one
        big = next((p for p in sorted(primaries, key=lambda p: -cost[id(p)])
                    if p is not f and id(p) not in drop and cost[id(p)] > 0
                    and cost[id(p)] >= SIDE_EFFECT_RATIO * max(cost[id(f)], 1e-4)
                    and (set(f.ranks[:1]) & _neighbours(topo, p.ranks[:1]) or set(f.hosts) & set(p.hosts))),
                   None)
        if big is not None:
            attach(big, f)
    primaries = [p for p in primaries if id(p) not in drop]
    for f in findings:
        if f.kind == FindingKind.MFU_DROP:
            named = set(f.ranks)
            owner = next((p for p in primaries if named & set(p.ranks)), None) or strongest
            if owner is None or f.evidence.get("attribution") == "all ranks slowed alike" and hang is None:
                continue  # no story to join, or nothing singles a rank out: not this straggler's
            attach(owner, f)
        elif f.kind == FindingKind.GC_PAUSE:
            if hang is not None:
                attach(hang, f)
                continue
            owner = next((p for p in primaries if set(f.ranks) & _neighbours(topo, p.ranks)), None)
            if owner is not None:
                attach(owner, f)
        elif f.kind == FindingKind.HARDWARE_ERROR:
            events = [str(e) for e in f.evidence.get("events", [])]
            if not events or not all(e.startswith(THROTTLE_METRIC) for e in events):
                continue
            owner = next((p for p in primaries if set(f.ranks) & set(p.ranks[:1])), None)
            if owner is not None:
                attach(owner, f)
                cause.setdefault(by_id[id(owner)], []).extend(events)
    out: list[Finding] = []
    for i, f in enumerate(findings):
        if id(f) in drop:
            continue
        if i in extra:
            ev = {**f.evidence, "secondary": f.evidence.get("secondary", []) + extra[i]}
            summary = f.summary
            if i in cause:
                ev["probable_cause"] = sorted(set(cause[i]))[:8]
                summary += "; its GPU is throttling its clocks"
            f = replace(f, evidence=ev, summary=summary)
        out.append(f)
    return out
