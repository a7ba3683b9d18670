"""The 3D-parallel timeline: one lane pair per rank (compute sections, communication).

Forward/backward sections carry their micro-batch index (``F3``/``B3``) so the 1F1B
pipeline schedule reads directly off the chart; p2p dependencies (send -> matching
recv) are drawn as arrows between the communication lanes.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import plotly.graph_objects as go
from fleetscope.dashboard import palette
from fleetscope.dashboard.figures.common import base_layout, message_figure, plain

MAX_ARROWS = 300
LANE_KINDS = ("compute", "comm")


def lane_index(rank_pos: int, lane: str) -> int:
    """y position of a rank's lane: two lanes per rank, compute above communication."""
    return 2 * rank_pos + (0 if lane == "compute" else 1)


def span_label(span: dict[str, Any]) -> str:
    """Short in-bar label: ``F3``/``B3`` for micro-batch sections, op name otherwise
    (escaped: plotly would render markup in a span or op name)."""
    name = str(span.get("name", ""))
    mb = span.get("mb", -1)
    if name in ("forward", "backward") and mb is not None and mb >= 0:
        return f"{name[0].upper()}{mb}"
    if span.get("cat") in ("collective", "p2p"):
        return plain(span.get("op", name))
    return plain(name[:3])


def build_timeline(data: dict[str, Any], height: int | None = None) -> go.Figure:
    """Timeline figure of the ``/timeline`` payload.

    Args:
        data: payload with ``lanes`` (rank, label), ``spans`` and ``links``; times in ns
            relative to ``t0_ns`` are shown in milliseconds.
        height: pixel height; grows with the number of lanes when omitted.
    """
    spans = data.get("spans") or []
    lanes = data.get("lanes") or []
    if not spans or not lanes:
        return message_figure(
            f"No sections or collectives for ranks {data.get('ranks', [])} in steps "
            f"{data.get('from_step', '?')}–{data.get('to_step', '?')}",
            height=height or 260,
        )
    t0 = int(data.get("t0_ns") or min(s["start_ns"] for s in spans))
    pos = {int(lane["rank"]): i for i, lane in enumerate(lanes)}
    traces: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for s in spans:
        if int(s["rank"]) not in pos:
            continue
        cat = s.get("cat", "section")
        key = cat if cat in ("collective", "p2p") else s.get("name", "other")
        lane = "comm" if cat in ("collective", "p2p") else "compute"
        start_ms = (int(s["start_ns"]) - t0) / 1e6
        dur_ms = max((int(s["end_ns"]) - int(s["start_ns"])) / 1e6, 1e-3)
        tr = traces[key]
        tr["base"].append(start_ms)
        tr["x"].append(dur_ms)
        tr["y"].append(lane_index(pos[int(s["rank"])], lane))
        tr["text"].append(span_label(s))
        tr["hover"].append(_hover(s, start_ms, dur_ms))
        tr["kind"].append(s.get("kind", ""))
    fig = go.Figure()
    order = ["forward", "backward", "optimizer", "dataloader", "collective", "p2p"]
    for key in sorted(traces, key=lambda k: (order.index(k) if k in order else 99, k)):
        tr = traces[key]
        fig.add_trace(
            go.Bar(
                base=tr["base"],
                x=tr["x"],
                y=tr["y"],
                orientation="h",
                width=0.8,
                name=plain(key),
                text=tr["text"],
                textposition="inside",
                insidetextanchor="middle",
                hovertext=tr["hover"],
                hovertemplate="%{hovertext}<extra></extra>",
                marker=dict(
                    color=palette.span_color(key, tr["kind"][0]),
                    line=dict(width=0.5, color="white"),
                ),
            )
        )
    _arrows(fig, data.get("links") or [], pos, t0)
    tickvals = [lane_index(i, k) for i in range(len(lanes)) for k in LANE_KINDS]
    ticktext = [
        f"{plain(lanes[i].get('label') or 'r' + str(lanes[i]['rank']))} · {k}"
        for i in range(len(lanes))
        for k in LANE_KINDS
    ]
    fig.update_yaxes(tickvals=tickvals, ticktext=ticktext, autorange="reversed", showgrid=False)
    fig.update_xaxes(title="time since window start (ms)", zeroline=False)
    title = (
        f"timeline · steps {data.get('from_step')}–{data.get('to_step')} · "
        f"{len(lanes)} ranks · {len(spans)} spans"
    )
    if data.get("truncated"):
        title += f" (first {len(spans)} of {data.get('num_spans_total', '?')}; narrow the window)"
    return base_layout(
        fig,
        height=height or max(280, 60 + 44 * len(lanes)),
        barmode="overlay",
        bargap=0.1,
        uniformtext=dict(minsize=8, mode="hide"),
        legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"),
        title=dict(text=title, x=0.01, font_size=14),
    )


def _hover(s: dict[str, Any], start_ms: float, dur_ms: float) -> str:
    head = f"rank {plain(s['rank'])} · step {plain(s.get('step'))}"
    if s.get("mb", -1) is not None and s.get("mb", -1) >= 0:
        head += f" · micro-batch {plain(s['mb'])}"
    if s.get("cat") in ("collective", "p2p"):
        body = f"{plain(s.get('op'))} on {plain(s.get('group_id'))} seq {plain(s.get('seq'))}"
        if s.get("peer", -1) not in (None, -1):
            body += f" peer r{plain(s['peer'])}"
        if s.get("state") and s.get("state") != "completed":
            body += f" · {plain(s['state'])}"
    else:
        body = f"{plain(s.get('name'))} ({plain(s.get('kind'))})"
    return f"{head}<br>{body}<br>start {start_ms:.2f} ms · {dur_ms:.2f} ms"


def _arrows(fig: go.Figure, links: list[dict[str, Any]], pos: dict[int, int], t0: int) -> None:
    for link in links[:MAX_ARROWS]:
        src, dst = int(link["src_rank"]), int(link["dst_rank"])
        if src not in pos or dst not in pos:
            continue
        fig.add_annotation(
            x=(int(link["dst_ns"]) - t0) / 1e6,
            y=lane_index(pos[dst], "comm"),
            ax=(int(link["src_ns"]) - t0) / 1e6,
            ay=lane_index(pos[src], "comm"),
            xref="x",
            yref="y",
            axref="x",
            ayref="y",
            showarrow=True,
            arrowhead=2,
            arrowsize=1,
            arrowwidth=1,
            arrowcolor=palette.ARROW_COLOR,
            opacity=0.6,
            text="",
        )
