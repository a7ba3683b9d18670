"""Timeline shaping: spans of a rank set, p2p dependency links, Chrome/Perfetto trace."""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

import pandas as pd

from fleetscope.topology import Topology

SPAN_COLUMNS = ("rank", "step", "mb", "name", "kind", "cat", "start_ns", "end_ns", "op", "group_id", "seq", "peer", "state")


def parse_ranks(spec: str, topo: Topology) -> list[int]:
    """Ranks from ``"0,2,5-7"`` or a group id such as ``pp.dp0.tp0`` / ``tp.pp1.dp0``.

    Raises:
        ValueError: naming the bad part of ``spec``.
    """
    spec = spec.strip()
    if not spec:
        return []
    if spec[:3] in ("dp.", "tp.", "pp.") or spec == "world":
        try:
            return topo.parse_group_id(spec)[1]
        except ValueError as e:
            raise ValueError(f"ranks {spec!r}: {e}") from None
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"ranks: {part!r} is not a rank, a range like 4-7, or a group id")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a or b >= topo.world_size:
            raise ValueError(f"ranks: {part!r} is outside 0..{topo.world_size - 1}")
        out.extend(range(a, b + 1))
    return sorted(set(out))


def default_ranks(topo: Topology, focus: int | None = None) -> list[int]:
    """The pipeline chain (all stages of one DP replica, one TP slot) through ``focus``."""
    rank = focus if focus is not None and 0 <= focus < topo.world_size else 0
    return topo.group_ranks("pp", rank)


def p2p_links(spans: pd.DataFrame) -> list[dict[str, Any]]:
    """Match each send with the receive it feeds: the k-th send from A to B in a step
    pairs with the k-th recv on B from A. The link runs from the send's start to the
    recv's end (the moment the receiver could continue)."""
    if spans.empty:
        return []
    p2p = spans[spans["cat"] == "p2p"].sort_values("start_ns")
    sends: dict[tuple[int, int, int], deque] = defaultdict(deque)
    for s in p2p[p2p["op"].isin(["send", "isend"])].itertuples(index=False):
        sends[(int(s.step), int(s.rank), int(s.peer))].append(s)
    links = []
    for r in p2p[p2p["op"].isin(["recv", "irecv"])].itertuples(index=False):
        q = sends.get((int(r.step), int(r.peer), int(r.rank)))
        if not q:
            continue
        s = q.popleft()
        links.append(
            {
                "src_rank": int(s.rank),
                "dst_rank": int(r.rank),
                "src_ns": int(s.start_ns),
                "dst_ns": int(r.end_ns),
                "step": int(r.step),
                "mb": int(r.mb),
                "group_id": str(r.group_id),
            }
        )
    return links


def timeline_payload(
    job: str,
    topo: Topology,
    ranks: list[int],
    from_step: int,
    to_step: int,
    spans: pd.DataFrame,
    num_total: int,
    limit: int,
) -> dict[str, Any]:
    """The JSON body of ``GET /jobs/{job}/timeline``."""
    records = [] if spans.empty else spans[list(SPAN_COLUMNS)].to_dict("records")
    for rec in records:
        for k in ("rank", "step", "mb", "start_ns", "end_ns", "seq", "peer"):
            rec[k] = int(rec[k])
    return {
        "job": job,
        "topology": topo.to_dict(),
        "ranks": ranks,
        "from_step": from_step,
        "to_step": to_step,
        "t0_ns": int(spans["start_ns"].min()) if not spans.empty else None,
        "lanes": [{"rank": r, "label": topo.label(r)} for r in ranks],
        "spans": records,
        "links": p2p_links(spans),
        "truncated": num_total > len(records),
        "num_spans_total": num_total,
        "max_spans": limit,
    }


def chrome_trace(job: str, topo: Topology, spans: pd.DataFrame, truncated: bool) -> dict[str, Any]:
    """Chrome trace-event JSON (opens in Perfetto and chrome://tracing).

    One process per rank (named with its coordinates), thread 1 for sections, thread 2
    for collectives/p2p; p2p dependencies become flow arrows (``s``/``f`` events).
    Times are microseconds.
    """
    events: list[dict[str, Any]] = []
    ranks = sorted(set(int(r) for r in spans["rank"])) if not spans.empty else []
    for r in ranks:
        c = topo.coords(r)
        events.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r} ({topo.label(r)})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": (c.pp * topo.dp + c.dp) * topo.tp + c.tp}})
        events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": 1, "args": {"name": "compute"}})
        events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": 2, "args": {"name": "communication"}})
    for s in spans.itertuples(index=False) if not spans.empty else []:
        comm = s.cat in ("collective", "p2p")
        args: dict[str, Any] = {"step": int(s.step)}
        if int(s.mb) >= 0:
            args["microbatch"] = int(s.mb)
        if comm:
            args.update(group_id=s.group_id, seq=int(s.seq), state=s.state)
            if int(s.peer) >= 0:
                args["peer"] = int(s.peer)
        name = s.name if not (s.name in ("forward", "backward") and int(s.mb) >= 0) else f"{s.name} mb{int(s.mb)}"
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": s.cat if comm else str(s.kind),
                "pid": int(s.rank),
                "tid": 2 if comm else 1,
                "ts": int(s.start_ns) / 1000.0,
                "dur": max(int(s.end_ns) - int(s.start_ns), 0) / 1000.0,
                "args": args,
            }
        )
    for i, link in enumerate(p2p_links(spans)):
        common = {"name": "p2p", "cat": "p2p", "id": i + 1, "tid": 2}
        events.append({**common, "ph": "s", "pid": link["src_rank"], "ts": link["src_ns"] / 1000.0})
        events.append({**common, "ph": "f", "bp": "e", "pid": link["dst_rank"], "ts": link["dst_ns"] / 1000.0})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"job": job, "topology": topo.to_dict(), "truncated": truncated},
    }
