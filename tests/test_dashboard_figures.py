"""Pure figure builders and view shaping: payload in, figure / JSON out."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from fleetscope.dashboard.client import ApiResult, items_of, normalize_api_base
from fleetscope.dashboard.figures.grid import build_grid
from fleetscope.dashboard.figures.heatmap import build_heatmap, culprit_trace, heatmap_meta
from fleetscope.dashboard.figures.timeline import build_timeline, span_label
from fleetscope.dashboard.pages.hang import hang_panel
from fleetscope.server.store.view_queries import METRICS
from fleetscope.server.views import grid as grid_view
from fleetscope.server.views import heatmap as heatmap_view
from fleetscope.server.views import timeline as timeline_view

from fleetscope.topology import Topology
from tests.views_synth import SynthJob, one_f_one_b, span_rows

TOPO = Topology(dp=2, tp=2, pp=2)
BIG = Topology(dp=192, tp=8, pp=8)


def test_row_buckets_align_with_tp_groups_and_stay_within_bound():
    assert heatmap_view.row_bucket_size(TOPO, 256) == 1
    b = heatmap_view.row_bucket_size(BIG, 160)
    assert b % BIG.tp == 0 and -(-BIG.world_size // b) <= 160
    labels, stages, spans = heatmap_view.row_labels(BIG, b)
    assert labels[0] == f"pp0 dp0-{b // BIG.tp - 1} tp0-7" and stages[0] == 0 and stages[-1] == 7
    # every row lies inside one pipeline stage
    assert all(BIG.stage(a) == BIG.stage(z) for a, z in spans)


def test_row_labels_follow_pp_dp_tp_order():
    labels, stages, spans = heatmap_view.row_labels(TOPO, 1)
    assert labels == [TOPO.label(r) for r in TOPO.display_order()]
    assert [a for a, _ in spans] == TOPO.display_order()


def test_heatmap_payload_and_figure_mark_the_culprit_row():
    cells = pd.DataFrame({"row": [0, 5, 5], "col": [0, 0, 1], "value": [1.0, 9.0, 8.5], "worst_rank": [0, 5, 5]})
    p = heatmap_view.heatmap_payload("j", TOPO, METRICS["own"], "max", 10, 11, 1, 1, cells)
    assert p["steps"] == [10, 11] and p["z"][5] == [9.0, 8.5] and p["z"][1] == [None, None]
    assert p["rank"][5] == [5, 5]
    fig = build_heatmap(json.loads(json.dumps(p)), culprits=[5])
    assert fig["data"][0]["y"][5] == TOPO.label(5) and fig["data"][0]["customdata"][5] == [5, 5]
    assert fig["data"][1]["text"] == ["culprit r5"] and fig["data"][1]["y"] == [TOPO.label(5)]
    # one white separator between the two pipeline stages
    assert len([s for s in fig["layout"]["shapes"] if s.get("line", {}).get("color") == "white"]) == 1


def test_culprit_trace_finds_the_bucket_of_a_rank():
    b = heatmap_view.row_bucket_size(BIG, 160)
    labels, _, _ = heatmap_view.row_labels(BIG, b)
    meta = heatmap_meta({"topology": BIG.to_dict(), "row_bucket": b, "row_labels": labels, "steps": [0, 1]})
    trace = culprit_trace(meta, [7777])
    c = BIG.coords(7777)
    assert trace.y == (labels[((c.pp * BIG.dp + c.dp) * BIG.tp + c.tp) // b],)


def test_empty_heatmap_says_so():
    p = heatmap_view.heatmap_payload("j", TOPO, METRICS["step"], "max", 0, -1, 1, 1, None)
    fig = build_heatmap(p)
    assert fig.layout.meta["state"] == "empty" and "No step time" in fig.layout.annotations[0].text


def test_stage_relative_scores_flag_the_slow_rank_only():
    own = {r: 100.0 for r in TOPO.ranks()}
    own[5] = 130.0
    scores = grid_view.stage_relative_scores(TOPO, own)
    assert scores[5] == pytest.approx(1.3) and all(scores[r] == 1.0 for r in TOPO.ranks() if r != 5)
    big = {r: 100.0 + (r % 7) for r in BIG.ranks()}
    big[7777] = 150.0
    s = grid_view.stage_relative_scores(BIG, big)
    assert int(np.nanargmax(s)) == 7777 and np.isnan(grid_view.stage_relative_scores(BIG, {}))[0]


def test_rank_states_and_grid_payload():
    scores = {r: 1.0 for r in TOPO.ranks()} | {5: 1.3}
    last = {r: 20 for r in TOPO.ranks()} | {6: 17}
    inflight = pd.DataFrame([{"rank": 3, "if_kind": "section", "if_op": "forward", "if_group_id": "", "if_seq": -1,
                              "if_peer": -1, "if_since_ns": 0, "if_ts_ns": 60 * 10**9, "if_step": 21}])  # fmt: skip
    hb = pd.DataFrame([{"rank": 2, "hb_host": "h", "hb_ts_ns": 0, "hb_alive": 0, "hb_last_step": 20,
                        "hb_inflight_op": ""}])  # fmt: skip
    states, details = grid_view.rank_states(TOPO, scores, last, hb, inflight, 10**9, 10.0, 30.0)
    assert states[5] == "slow" and states[3] == "stuck" and states[2] == "dead" and states[6] == "stuck"
    assert states[0] == "ok" and details[3]["inflight"]["blocked_s"] == 60.0
    finished, _ = grid_view.rank_states(TOPO, scores, last, hb, inflight, 10**9, 10.0, 30.0, live=False)
    assert finished[2] == "ok"  # heartbeats of a finished job do not matter
    p = grid_view.grid_payload("j", BIG, {7777: 1.4}, ["ok"] * BIG.world_size, {}, (0, 9), 4096)
    assert p["dp_bucket"] == 3 and len(p["cells"]["rank"]) == 4096
    assert 7777 in p["cells"]["rank"]  # the worst rank represents its bucket
    fig = build_grid(json.loads(json.dumps(p)), culprits=[7777])
    rings = [t for t in fig["data"] if t.get("name", "").startswith("culprits")]
    assert len(rings) == 1 and rings[0]["text"] == ["r7777"]
    hm = fig["data"][0]  # one heat-map: the rank under the ring is the culprit
    assert hm["customdata"][rings[0]["y"][0]][rings[0]["x"][0]][0] == 7777


def test_synthetic_1f1b_schedule_and_timeline_figure():
    assert one_f_one_b(0, 2, 4) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    rec = SynthJob(num_steps=3).build()
    spans = pd.DataFrame(span_rows(rec, 2))
    links = timeline_view.p2p_links(spans)
    assert links and all(TOPO.stage(link["src_rank"]) != TOPO.stage(link["dst_rank"]) for link in links)
    assert all(link["dst_ns"] >= link["src_ns"] for link in links)
    chain = TOPO.group_ranks("pp", 0)
    payload = timeline_view.timeline_payload("j", TOPO, chain, 2, 2, spans[spans["rank"].isin(chain)], len(spans), 10_000)
    fig = build_timeline(json.loads(json.dumps(payload)))
    fwd = next(t for t in fig.data if t.name == "forward")
    assert {"F0", "F3"} <= set(fwd.text)
    assert len(fig.layout.annotations) == len(payload["links"])  # one arrow per p2p dependency
    trace = timeline_view.chrome_trace("j", TOPO, spans, truncated=False)
    phases = {e["ph"] for e in trace["traceEvents"]}
    assert {"M", "X", "s", "f"} <= phases
    x = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(x) == len(spans) and all(e["dur"] >= 0 for e in x)


def test_parse_ranks_accepts_lists_ranges_and_group_ids():
    assert timeline_view.parse_ranks("0, 2-3", TOPO) == [0, 2, 3]
    assert timeline_view.parse_ranks("pp.dp1.tp0", TOPO) == TOPO.group_ranks("pp", 2)
    with pytest.raises(ValueError, match="9"):
        timeline_view.parse_ranks("9", TOPO)
    with pytest.raises(ValueError, match="abc"):
        timeline_view.parse_ranks("abc", TOPO)


def test_span_labels_show_microbatches():
    assert span_label({"name": "forward", "mb": 3}) == "F3"
    assert span_label({"name": "backward", "mb": 0}) == "B0"
    assert span_label({"name": "all_reduce", "cat": "collective", "op": "all_reduce", "mb": -1}) == "all_reduce"


def test_hang_panel_names_culprit_and_chain():
    hang = {"stalled": True, "stalled_for_s": 42.0, "threshold_s": 30, "last_step": 19, "culprits": [3],
            "hang_class": "stuck_in_compute", "chain": [[7, 3, "recv"], [2, 3, "all_reduce"]], "evidence": {"x": 1}}  # fmt: skip
    grid = {"topology": TOPO.to_dict(), "ranks": [
        {"rank": 2, "state": "stuck", "inflight": {"group_id": "tp.pp0.dp1", "seq": 40, "op": "all_reduce", "peer": -1,
                                                    "blocked_s": 40.0}, "heartbeat_age_s": 1.0, "alive": True},
        {"rank": 3, "state": "stuck", "inflight": {"group_id": "tp.pp0.dp1", "seq": 39, "op": "forward", "peer": -1,
                                                    "blocked_s": 41.0}, "heartbeat_age_s": 1.0, "alive": True}]}  # fmt: skip
    text = json.dumps(hang_panel(hang, grid).to_plotly_json(), default=str)
    assert "Culprit: rank 3 (pp0 dp1 tp1)" in text and "waits on " in text and "stuck_in_compute" in text
    ok = json.dumps(hang_panel({"stalled": False, "last_step": 5}, grid).to_plotly_json(), default=str)
    assert "No hang" in ok


def test_client_helpers():
    assert normalize_api_base("http://0.0.0.0:8000") == "http://127.0.0.1:8000/api/v1"
    assert normalize_api_base("http://h:1/api/v1/") == "http://h:1/api/v1"
    with pytest.raises(ValueError, match="ftp://x"):
        normalize_api_base("ftp://x")
    assert items_of({"total": 1, "items": [{"a": 1}]}) == [{"a": 1}] and items_of([1]) == [1]
    assert ApiResult(error="Not Found", status=404).not_available
    assert not ApiResult(error="job 'x' not found", status=404).not_available


def test_cell_matrix_handles_nan_and_out_of_range():
    cells = pd.DataFrame({"row": [0, 9], "col": [0, 0], "value": [np.nan, 1.0], "worst_rank": [1, 2]})
    z, r = heatmap_view.cell_matrix(cells, 2, 1)
    assert z == [[None], [None]] and r == [[None], [None]]


def test_heatmap_and_grid_margins_are_sized_from_their_labels_without_automargin():
    # plotly's automargin measures every label and lays the figure out twice: the two
    # first-drawn figures of the job page size their margins themselves.
    for topo, bucket in ((TOPO, 1), (Topology(dp=64, tp=16, pp=4), 8)):
        labels, _, _ = heatmap_view.row_labels(topo, bucket)
        cells = pd.DataFrame({"row": [0], "col": [0], "value": [1.0], "worst_rank": [0]})
        p = heatmap_view.heatmap_payload("j", topo, METRICS["own"], "max", 0, 0, bucket, 1, cells)
        hm = build_heatmap(json.loads(json.dumps(p)))["layout"]
        assert hm["xaxis"]["automargin"] is False and hm["yaxis"]["automargin"] is False
        widest = max(len(t) for t in hm["yaxis"]["ticktext"])
        assert hm["margin"]["l"] >= 6.5 * widest + 8  # ~5.9 px per character measured in Chromium
        assert hm["margin"]["b"] >= 45  # tick labels and the "step" title
    margins = {}
    for topo in (TOPO, Topology(dp=64, tp=16, pp=4)):  # "r5 pp1 dp0 tp1" vs "r4095 pp3 dp63 tp15"
        p = heatmap_view.heatmap_payload("j", topo, METRICS["own"], "max", 0, 0, 1, 1,
                                         pd.DataFrame({"row": [0], "col": [0], "value": [1.0], "worst_rank": [0]}))
        margins[topo.world_size] = build_heatmap(json.loads(json.dumps(p)))["layout"]["margin"]["l"]
    assert margins[8] < margins[4096]
    for topo in (TOPO, Topology(dp=8, tp=16, pp=2)):
        p = grid_view.grid_payload("j", topo, {}, ["ok"] * topo.world_size, {}, (0, 9), 4096)
        g = build_grid(json.loads(json.dumps(p)))["layout"]
        assert g["xaxis"]["automargin"] is False and g["yaxis"]["automargin"] is False
        assert g["margin"]["l"] >= 6.5 * max(len(t) for t in g["yaxis"]["ticktext"]) + 25  # + the "tp" title


def test_incident_page_states_the_factor_with_its_interval():
    from fleetscope.dashboard.pages.incidents import _factor_text

    ev = {"factor": 1.794, "component": "compute (CPU time)", "factor_interval": [1.4, 2.3], "judged_steps": 3}
    assert _factor_text(ev) == " · compute (CPU time) 1.79x its peers (95%: 1.40–2.30, 3 steps)"
    assert _factor_text({"factor": 1.5, "component": "compute"}) == " · compute 1.50x its peers"
    assert _factor_text({}) == _factor_text("not json") == _factor_text({"factor": "x"}) == ""
