"""What the browser loads first: the plotly.js partial bundle (and that every figure
stays within its trace types), the preloads, and the page rendered into the layout."""

from __future__ import annotations

import hashlib
import json
import re

import pandas as pd
import pytest
from fleetscope.dashboard import plotly_bundle
from fleetscope.dashboard.app import create_dash_app
from fleetscope.dashboard.figures.common import message_dict, message_figure
from fleetscope.dashboard.figures.grid import build_grid
from fleetscope.dashboard.figures.heatmap import build_heatmap
from fleetscope.dashboard.figures.timeline import build_timeline
from fleetscope.dashboard.figures.trends import build_hardware, build_trend
from fleetscope.dashboard.pages import job as job_page
from fleetscope.dashboard.pages import job_callbacks
from fleetscope.dashboard.pages.hang import EVIDENCE_ITEMS, compact
from fleetscope.dashboard.prefetch import Prefetcher
from fleetscope.server.store.view_queries import METRICS
from fleetscope.server.views import grid as grid_view
from fleetscope.server.views import heatmap as heatmap_view
from fleetscope.server.views import timeline as timeline_view

from fleetscope.topology import Topology
from tests.views_synth import SynthJob, span_rows

TOPO = Topology(dp=2, tp=2, pp=2)
FULL_JS = "/_dash-component-suites/plotly/package_data/plotly.min.js"


def _trace_types(fig) -> set[str]:
    d = fig if isinstance(fig, dict) else fig.to_plotly_json()
    return {t.get("type", "scatter") for t in d["data"]}


def test_partial_bundle_is_the_installed_plotly_js_version_with_the_declared_trace_types():
    assert plotly_bundle.partial_version() == plotly_bundle.full_version()
    assert plotly_bundle.use_partial()
    js = plotly_bundle.PARTIAL.read_text(encoding="utf-8")
    assert set(re.findall(r'moduleType:"trace",name:"(\w+)"', js)) == plotly_bundle.TRACE_TYPES
    digest = hashlib.sha256(js.encode("utf-8")).hexdigest()
    assert digest in (plotly_bundle.VENDOR / "README.md").read_text()  # provenance note is current


def test_every_figure_uses_only_trace_types_of_the_partial_bundle():
    cells = pd.DataFrame({"row": [0, 5], "col": [0, 1], "value": [1.0, 9.0], "worst_rank": [0, 5]})
    hm = heatmap_view.heatmap_payload("j", TOPO, METRICS["own"], "max", 10, 11, 1, 1, cells)
    states = ["ok", "slow", "stuck", "dead", "missing", "hung", "ok", "ok"]
    grid = grid_view.grid_payload("j", TOPO, {5: 1.3}, states, {}, (0, 9), 4096)
    rec = SynthJob(num_steps=2).build()
    spans = pd.DataFrame(span_rows(rec, 1))
    chain = TOPO.group_ranks("pp", 0)
    timeline = timeline_view.timeline_payload("j", TOPO, chain, 1, 1, spans[spans["rank"].isin(chain)], len(spans), 10_000)
    figures = {
        "heatmap": build_heatmap(json.loads(json.dumps(hm)), culprits=[5], selected=(5, 11)),
        "grid": build_grid(json.loads(json.dumps(grid)), culprits=[3]),
        "trend": build_trend({"steps": [1, 2], "median_ms": [1.0, 1.1], "max_ms": [1.2, 1.5], "mfu": [0.4, 0.3]}),
        "hardware": build_hardware({
            "t0_ns": 0, "rank": 1,
            "series": [{"name": "gpu_util", "device": "0", "ts_ns": [10**9, 2 * 10**9], "value": [90.0, 91.0]},
                       {"name": "nic_rx_bytes", "device": "mlx5_0", "ts_ns": [10**9], "value": [1e9]}],
            "events": [{"ts_ns": 10**9, "kind": "xid", "severity": "critical", "message": "Xid 79", "rank": 1}]}),
        "timeline": build_timeline(json.loads(json.dumps(timeline))),
        "message": message_figure("nothing yet"),
        "message_dict": message_dict("loading", "loading"),
    }  # fmt: skip
    kinds = {name: _trace_types(fig) for name, fig in figures.items()}
    assert {"heatmap", "scatter", "bar"} <= set().union(*kinds.values())  # the builders did draw data
    for name, types in kinds.items():
        assert types <= plotly_bundle.TRACE_TYPES, f"{name} figure uses {types - plotly_bundle.TRACE_TYPES}"


def _index(app, path: str = "/ui/jobs/j1") -> str:
    r = app.server.test_client().get(path)
    assert r.status_code == 200
    return r.get_data(as_text=True)


def test_index_preloads_the_partial_bundle_and_pins_dcc_graph_to_it():
    app = create_dash_app("http://127.0.0.1:1", url_base_pathname="/ui/")
    html = _index(app)
    url = "/ui" + plotly_bundle.route_path()
    assert f'<link rel="preload" href="{url}" as="script">' in html
    assert f"return '{url}'" in html and FULL_JS not in html
    assert '<link rel="preload" href="/ui/_dash-component-suites/dash/dcc/async-graph.js"' in html
    r = app.server.test_client().get(url)
    # The vendored file, behind V8's compile hint (a comment line for other browsers).
    body = r.get_data()
    assert r.status_code == 200 and body == b"//# allFunctionsCalledOnLoad\n" + plotly_bundle.PARTIAL.read_bytes()
    assert "immutable" in r.headers["Cache-Control"] and r.mimetype == "text/javascript"


def test_a_partial_bundle_of_another_plotly_js_version_is_not_used(monkeypatch):
    monkeypatch.setattr(plotly_bundle, "full_version", lambda: "0.0.1")
    html = _index(create_dash_app("http://127.0.0.1:1", url_base_pathname="/ui/"))
    assert f'<link rel="preload" href="/ui{FULL_JS}" as="script">' in html
    assert "_dashPlotlyJSURL" not in html


@pytest.mark.parametrize("mounted", [False, True])
def test_layout_holds_the_page_the_browser_is_on(mounted):
    app = create_dash_app("http://127.0.0.1:1", url_base_pathname="/ui/", mounted=mounted)
    layout_url = "/_dash-layout" if mounted else "/ui/_dash-layout"
    client = app.server.test_client()

    def layout(referer: str | None) -> dict[str, dict]:
        """Props of each component with an id, in the layout served for ``referer``."""
        r = client.get(layout_url, headers={"Referer": referer} if referer else {})
        assert r.status_code == 200
        found: dict[str, dict] = {}

        def walk(node) -> None:
            if isinstance(node, list):
                for x in node:
                    walk(x)
            elif isinstance(node, dict):
                props = node.get("props", {})
                if isinstance(props.get("id"), str):
                    found[props["id"]] = props
                for v in props.values():
                    walk(v)

        walk(r.get_json())
        return found

    job = layout("http://localhost/ui/jobs/big%20job?metric=step&rank=7")
    assert {"heatmap", "grid"} <= set(job) and job["job-id"]["data"] == "big job"
    assert job["metric"]["value"] == "step" and job["sel"]["data"] == {"rank": 7, "step": None}
    assert job["page-rendered"]["data"] == "/ui/jobs/big%20job" and job["page-path"]["data"] == ""
    for other in (None, "http://elsewhere.example/ui/jobs/j1", "http://localhost/other/jobs/j1"):
        shell = layout(other)  # no usable Referer: the router renders the page
        assert "heatmap" not in shell and shell["page-rendered"]["data"] == ""
        assert shell["page"]["children"]["props"]["className"] == "fs-msg fs-loading"


def test_prefetched_results_are_used_once_and_only_while_fresh():
    calls = []
    now = [1000.0]  # an injected clock: staleness without sleeping
    p = Prefetcher(ttl_s=10.0, max_pending=2, clock=lambda: now[0])
    assert p.start("a", lambda: calls.append("a") or "A") and not p.start("a", lambda: "again")
    assert p.take("a") == "A" and p.take("a") is None  # single use: the next call goes to the API
    p.start("b", lambda: "B")
    now[0] += 10.5
    assert p.take("b") is None  # stale
    for k in "cde":  # bounded: the oldest unclaimed result is dropped
        p.start(k, lambda k=k: k.upper())
    assert p.pending() == 2 and p.take("c") is None and p.take("e") == "E"

    def boom():
        raise RuntimeError("API down")

    p.start("f", boom)
    assert p.take("f") is None and calls == ["a"]  # a failed prefetch: the caller calls itself
    with pytest.raises(ValueError):
        Prefetcher(ttl_s=0)


def test_the_layout_request_of_a_job_page_starts_its_heatmap_and_grid_calls():
    app = create_dash_app("http://127.0.0.1:1", url_base_pathname="/ui/")
    client = app.server.test_client()
    prefetcher = app.server.extensions["fleetscope_prefetch"]
    # The page request itself starts nothing: it must not compete with the bundles.
    assert client.get("/ui/jobs/j%201?metric=step&agg=mean&from=3").status_code == 200
    assert prefetcher.pending() == 0
    for other in ("/ui/", "/ui/incidents"):  # only job pages prefetch
        assert client.get("/ui/_dash-layout", headers={"Referer": f"http://localhost{other}"}).status_code == 200
    assert prefetcher.pending() == 0
    r = client.get("/ui/_dash-layout", headers={"Referer": "http://localhost/ui/jobs/j%201?metric=step&agg=mean&from=3"})
    assert r.status_code == 200 and prefetcher.pending() == 2
    view = job_page.initial_view({"metric": "step", "agg": "mean", "from": "3"})
    keys = set(job_callbacks.first_calls(None, "j 1", view))
    assert keys == {job_callbacks.heatmap_key("j 1", job_callbacks.heatmap_params("step", "mean", 3, None)),
                    job_callbacks.grid_key("j 1")}  # fmt: skip
    results = [prefetcher.take(k) for k in keys]  # the API is unreachable: explicit errors
    assert all(r is not None and not r.ok and "unreachable" in r.error for r in results)


def test_hang_evidence_is_cut_to_a_readable_size():
    states = {str(r): "waiting" for r in range(12_288)} | {"7777": "running"}
    ev = compact({"rank_states": states, "blocked_ranks": list(range(100)), "note": "x"})
    assert len(ev["rank_states"]) == EVIDENCE_ITEMS + 2
    assert ev["rank_states"]["…"] == f"{12_288 - EVIDENCE_ITEMS} more of 12288"
    assert ev["rank_states"]["… entries per value"] == {"waiting": 12_287, "running": 1}
    assert ev["blocked_ranks"][-1] == f"… {100 - EVIDENCE_ITEMS} more of 100" and ev["note"] == "x"
    assert compact({"a": [1, 2]}) == {"a": [1, 2]}  # small evidence unchanged
