"""The hang view as HTML: culprit, dependency chain, per-group progress, heartbeats.

Pure: ``/hang`` and ``/grid`` payloads in, Dash components out. The analysis (who is the
culprit, the wait-for chain) is the server's; this module only lays it out.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from dash import html
from fleetscope.dashboard.components import card, message, state_badge, table

from fleetscope.topology import Topology


def normalise_hang(data: Any) -> dict[str, Any] | None:
    """The hang analysis object inside a ``/hang`` answer (which may wrap it)."""
    if not isinstance(data, dict):
        return None
    for key in ("hang", "analysis"):
        if isinstance(data.get(key), dict):
            return data[key]
    return data


EVIDENCE_ITEMS = 24
"""Entries of a list or mapping shown in the evidence; a 12,288-rank job's per-rank
maps would otherwise be a 12,288-line block the browser takes seconds to lay out."""


def compact(x: Any, limit: int = EVIDENCE_ITEMS) -> Any:
    """``x`` with lists and mappings longer than ``limit`` cut to their first ``limit``
    entries plus a note of how many more there are (and, for a mapping of plain
    values, how many entries hold each value)."""
    if isinstance(x, dict):
        items = list(x.items())
        out = {k: compact(v, limit) for k, v in items[:limit]}
        if len(items) > limit:
            out["…"] = f"{len(items) - limit} more of {len(items)}"
            values = [v for _, v in items]
            if all(v is None or isinstance(v, (str, int, float, bool)) for v in values):
                out["… entries per value"] = dict(Counter(str(v) for v in values).most_common(limit))
        return out
    if isinstance(x, (list, tuple)):
        head = [compact(v, limit) for v in x[:limit]]
        return head + ([f"… {len(x) - limit} more of {len(x)}"] if len(x) > limit else [])
    return x


def _label(topo: Topology | None, rank: int) -> str:
    if topo is not None and 0 <= rank < topo.world_size:
        c = topo.coords(rank)
        return f"rank {rank} (pp{c.pp} dp{c.dp} tp{c.tp})"
    return f"rank {rank}"


def hang_panel(hang: dict[str, Any] | None, grid: dict[str, Any] | None) -> html.Div:
    """The hang card: a green "no hang" line, or the full hang view when stalled."""
    topo = Topology.from_dict(grid["topology"]) if grid and grid.get("topology") else None
    if not hang or not hang.get("stalled"):
        last = hang.get("last_step") if hang else None
        return card(
            "Hang",
            message("No hang: steps are completing" + (f" (last step {last})" if last is not None else ""), "empty"),
            className="fs-ok",
            id="hang-card",
        )
    culprits = [int(r) for r in hang.get("culprits") or []]
    hang_class = hang.get("hang_class") or (hang.get("evidence") or {}).get("hang_class") or "unknown cause"
    head = html.Div(
        [
            html.Span("HUNG ", className="fs-culprit"),
            f"no step completed for {float(hang.get('stalled_for_s') or 0):.0f} s after step {hang.get('last_step')}"
            f" (threshold {hang.get('threshold_s', '?')} s). ",
            html.Span(
                "Culprit: " + ", ".join(_label(topo, r) for r in culprits) if culprits else "Culprit: not determined",
                className="fs-culprit",
                id="hang-culprit",
            ),
            f" — {hang_class}" + (f" in {hang['group_id']}" if hang.get("group_id") else ""),
        ]
    )
    return card(
        "Hang",
        head,
        html.Div(
            [
                html.Div([html.H3("Who waits on whom"), _chain(hang, topo, culprits)], style={"flex": "1"}),
                html.Div([html.H3("Collective progress and heartbeats"), _progress(grid)], style={"flex": "1.4"}),
            ],
            className="fs-row",
        ),
        html.H3("Evidence"),
        html.Pre(json.dumps(compact(hang.get("evidence") or {}), indent=2, default=str), className="fs-evidence"),
        className="fs-hang",
        id="hang-card",
    )


def _chain(hang: dict[str, Any], topo: Topology | None, culprits: list[int]) -> html.Div | html.Ul:
    edges = hang.get("chain") or (hang.get("evidence") or {}).get("chain") or []
    if not edges:
        return message("the server gave no dependency chain for this hang", "empty")
    items = []
    for e in edges:
        if isinstance(e, dict):
            waiter, waited, reason = e.get("waiter"), e.get("waited_for", e.get("waits_on")), e.get("reason", "")
        else:
            waiter, waited, reason = (list(e) + ["", "", ""])[:3]
        if waiter is None or waited is None:
            continue  # an edge without both ends: nothing to draw
        cls = "fs-culprit" if waited in culprits else ""
        items.append(
            html.Li(
                [
                    _label(topo, int(waiter)),
                    " → waits on ",
                    html.Span(_label(topo, int(waited)), className=cls),
                    html.Span(f" · {reason}" if reason else ""),
                ]
            )
        )
    return html.Ul(items, className="fs-chain", id="hang-chain")


def _progress(grid: dict[str, Any] | None) -> html.Div:
    ranks = (grid or {}).get("ranks") or []
    if not ranks:
        return message("no per-rank in-flight or heartbeat state reported", "empty")
    rows, classes = [], []
    by_group: dict[str, list[int]] = {}
    for d in ranks:
        inf = d.get("inflight") or {}
        if inf.get("group_id"):
            by_group.setdefault(inf["group_id"], []).append(int(inf.get("seq", -1)))
    for d in sorted(ranks, key=lambda d: ((d.get("inflight") or {}).get("group_id", "~"), d["rank"])):
        inf = d.get("inflight") or {}
        gid = inf.get("group_id", "")
        seq = inf.get("seq", -1)
        behind = bool(gid) and seq < max(by_group.get(gid, [seq]))
        hb = d.get("heartbeat_age_s")
        rows.append(
            [
                f"r{d['rank']}",
                state_badge(d.get("state", "?")),
                gid or "-",
                f"{inf.get('op', '-')}" + (f" ← r{inf['peer']}" if inf.get("peer", -1) >= 0 else ""),
                "-" if seq in (None, -1) else str(seq),
                "-" if "blocked_s" not in inf else f"{inf['blocked_s']:.0f} s",
                "-" if hb is None else f"{'alive' if d.get('alive', True) else 'DEAD'} · {hb:.0f} s ago",
                "-" if d.get("last_step") is None else str(d["last_step"]),
            ]
        )
        classes.append("fs-lag" if behind else "")
    return table(
        ["rank", "state", "group", "op", "seq reached", "blocked", "heartbeat", "last step"],
        rows,
        row_class=classes,
        id="hang-progress",
    )
