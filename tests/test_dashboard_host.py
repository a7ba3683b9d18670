"""The dashboard's host page: pure layout builders from sample JSON, and the client
against a real server that ingested a few ``probes`` records."""

from __future__ import annotations

import time
from typing import Any

import httpx
from dash.development.base_component import Component
from fleetscope.dashboard.client import ApiClient, ApiResult
from fleetscope.dashboard.pages.host import (
    host_body,
    host_href,
    selfcheck_hosts_panel,
    selfcheck_table,
    status_line,
)

from tests.helpers.server import running_server

SELFCHECK = {
    "host": "node-c", "status": "outlier", "last_ts_ns": 1_700_000_000_000_000_000,
    "probes": [
        {"host": "node-c", "device": "cuda:0", "device_model": "H200", "probe": "matmul", "variant": "bf16",
         "value": 211.5, "unit": "TFLOP/s", "peak_fraction": 0.2138, "passed": True, "ts_ns": 1, "job": "",
         "fleet_samples": 8, "fleet_hosts": 4, "fleet_median": 702.0, "ratio_to_median": 0.3013,
         "robust_z": -41.7, "history_runs": 3, "history_median": 700.0, "ratio_to_history": 0.3021,
         "status": "outlier", "detail": {}},
        {"host": "node-c", "device": "cuda:0", "device_model": "H200", "probe": "membw", "variant": "",
         "value": 4012.0, "unit": "GB/s", "peak_fraction": 0.83, "passed": True, "ts_ns": 1, "job": "",
         "fleet_samples": 8, "fleet_hosts": 4, "fleet_median": 4020.0, "ratio_to_median": 0.998,
         "robust_z": None, "history_runs": 0, "history_median": None, "ratio_to_history": None,
         "status": "ok", "detail": {}},
    ],
    "findings": [
        {"kind": "outlier", "host": "node-c", "device": "cuda:0", "device_model": "H200", "probe": "matmul",
         "variant": "bf16", "value": 211.5, "reference": 702.0, "ratio": 0.3013, "score": 11.9,
         "severity": "critical", "summary": "node-c cuda:0 matmul at 30% of the fleet median", "job": "",
         "ts_ns": 1, "evidence": {"fleet_median": 702.0, "robust_z": -41.7}, "key": "selfcheck:outlier:..."},
    ],
}
HISTORY = {
    "host": "node-c", "num_jobs": 4, "num_straggler_jobs": 3, "straggler_rate": 0.75,
    "jobs": [{"job": "pretrain-7", "attempt": 0, "ranks": [12, 13], "first_ns": 1, "last_ns": 2,
              "num_steps": 400, "incidents": {"slow_compute": 2}}],
    "incidents": [{"id": 17, "job": "pretrain-7", "kind": "slow_compute", "severity": "warning",
                   "summary": "rank 12 computes 1.5x slower", "status": "open", "opened_ns": 1,
                   "hosts": ["node-c"], "ranks": [12]}],
    "log_events": [], "selfcheck": None,
}


def _walk(c: Any):
    """Every component and string in a Dash component tree."""
    yield c
    children = c.children if isinstance(c, Component) else c if isinstance(c, (list, tuple)) else None
    if isinstance(children, (list, tuple)):
        for x in children:
            yield from _walk(x)
    elif children is not None:
        yield from _walk(children)


def _text(c: Any) -> str:
    return " | ".join(str(x) for x in _walk(c) if isinstance(x, (str, int, float)))


def _by_id(c: Any, cid: str) -> Component:
    return next(x for x in _walk(c) if isinstance(x, Component) and getattr(x, "id", None) == cid)


def _callback(url: Any, output: str, inputs: list[dict], state: list[dict]) -> str:
    """Run one dashboard callback on the server, as the browser does; the response text."""
    outputs = [{"id": o.split(".")[0], "property": o.split(".")[1]} for o in output.strip(".").split("...")]
    body = {"output": output, "outputs": outputs if len(outputs) > 1 else outputs[0], "inputs": inputs,
            "state": state, "changedPropIds": [f"{i['id']}.{i['property']}" for i in inputs]}
    r = httpx.post(f"{url}/ui/_dash-update-component", json=body, timeout=60)
    assert r.status_code == 200, r.text[:500]
    return r.text


def test_probe_table_shows_values_scores_and_flags_the_outlier():
    tbl = selfcheck_table(ApiResult(data=SELFCHECK, status=200))
    body_rows = _by_id(tbl, "host-probes").children[1].children
    cells = [[_text(td) for td in tr.children] for tr in body_rows]
    assert cells[0][:8] == ["matmul (bf16)", "cuda:0", "211.5 TFLOP/s", "21.4%", "0.301 (n=8)", "-41.70",
                            "0.302 (n=3)", "yes"]
    assert cells[0][8] == "outlier" and cells[1][0] == "membw" and cells[1][5] == "-"  # null z -> "-"
    assert [tr.className for tr in body_rows] == ["fs-lag", ""]  # the flagged probe is highlighted


def test_host_body_has_findings_with_evidence_and_history():
    body = host_body(ApiResult(data=SELFCHECK, status=200), ApiResult(data=HISTORY, status=200))
    text = _text(body)
    assert "node-c cuda:0 matmul at 30% of the fleet median" in text and "critical" in text
    assert '"robust_z": -41.7' in text  # evidence is shown
    assert "75.0%" in text and "slow_compute ×2" in text and "rank 12 computes 1.5x slower" in text
    jobs = _by_id(body, "host-jobs")
    link = next(x for x in _walk(jobs) if getattr(x, "href", None))
    assert link.href == "/jobs/pretrain-7" and link.children == "pretrain-7"
    assert "outlier" in _text(status_line(ApiResult(data=SELFCHECK, status=200)))
    assert "pass" in _text(status_line(ApiResult(data={**SELFCHECK, "status": "ok"}, status=200)))


def test_empty_and_error_states_are_explicit():
    none_yet = ApiResult(error="host 'x' has no self-check results in the last 604800s", status=404)
    no_route = ApiResult(error="Not Found", status=404)
    down = ApiResult(error="API unreachable at http://h/api/v1: ConnectError")
    no_hist = ApiResult(error="host 'x': no data in the last 30 days", status=404)
    assert "no self-check results for this host yet" in _text(selfcheck_table(none_yet))
    assert "Not available" in _text(selfcheck_table(no_route))
    assert "Error: self-check results: API unreachable" in _text(selfcheck_table(down))
    body = _text(host_body(none_yet, no_hist))
    assert "no jobs or incidents for this host" in body and "not available: no self-check results" in body
    assert "not available" in _text(status_line(down)) and "unknown" in _text(status_line(none_yet))
    assert "no findings" in _text(host_body(ApiResult(data={**SELFCHECK, "findings": []}, status=200),
                                            ApiResult(data=HISTORY, status=200)))


def test_fleet_selfcheck_panel_links_flagged_hosts():
    data = {"hosts": [{"host": "node c/1", "status": "failed", "last_ts_ns": 1, "num_findings": 2},
                      {"host": "node-a", "status": "ok", "last_ts_ns": 1, "num_findings": 0}], "findings": []}
    panel = selfcheck_hosts_panel(ApiResult(data=data, status=200))
    links = [x for x in _walk(panel) if getattr(x, "href", None)]
    assert [(x.children, x.href) for x in links] == [("node c/1", "/hosts/node%20c%2F1")]
    assert "failed" in _text(panel) and host_href("a") == "/hosts/a"
    ok = {"hosts": [data["hosts"][1]], "findings": []}
    assert "all 1 hosts pass" in _text(selfcheck_hosts_panel(ApiResult(data=ok, status=200)))
    assert "no self-check results yet" in _text(selfcheck_hosts_panel(ApiResult(data={"hosts": []}, status=200)))


def test_host_page_data_through_a_real_server(tmp_path):
    now = time.time_ns()
    values = {"h1": 10.0, "h2": 10.2, "h3": 9.9, "h4": 3.0}
    probes = [{"ts_ns": now - i * 1000, "host": h, "device": "cpu", "device_model": "test-cpu", "probe": "matmul",
               "value": v, "unit": "TFLOP/s", "peak_fraction": v / 20, "passed": True, "detail": "{}"}
              for i, (h, v) in enumerate(values.items())]
    with running_server(tmp_path, ui=True, diagnosis_enabled=False) as url:
        ack = httpx.post(f"{url.api}/ingest", json={"schema_version": 1, "records": {"probes": probes}}, timeout=30)
        assert ack.status_code == 200 and ack.json()["rows"]["probes"] == 4, ack.text
        client = ApiClient(str(url))
        try:
            deadline = time.monotonic() + 20
            sc = client.host_selfcheck("h4")
            while not sc.ok and time.monotonic() < deadline:  # writes land asynchronously
                time.sleep(0.3)
                sc = client.host_selfcheck("h4")
            assert sc.ok, sc.error
            assert sc.data["status"] == "outlier" and sc.data["probes"][0]["probe"] == "matmul"
            tbl = selfcheck_table(sc)
            assert "3 TFLOP/s" in _text(tbl) and _by_id(tbl, "host-probes").children[1].children[0].className == "fs-lag"
            hist = client.host("h4")  # history: no jobs, but the self-check summary is there
            assert hist.ok and hist.data["num_jobs"] == 0 and hist.data["selfcheck"]["status"] == "outlier"
            assert "no jobs ran on this host" in _text(host_body(sc, hist))
            missing = client.host_selfcheck("nobody")
            assert missing.status == 404 and not missing.not_available
            fleet = client.selfcheck_hosts()
            assert "h4" in _text(selfcheck_hosts_panel(fleet))
            assert httpx.get(f"{url}/ui/", timeout=60).status_code == 200
            assert httpx.get(f"{url}/ui/hosts/h4", timeout=60).status_code == 200
            page = _callback(url, "page.children", [{"id": "page-path", "property": "data", "value": "/ui/hosts/h4"}],
                             [{"id": "url", "property": "search", "value": ""}])
            assert '"host-name"' in page and '"h4"' in page
            view = _callback(url, "..host-status.children...host-body.children..",
                             [{"id": "tick", "property": "data", "value": 0},
                              {"id": "host-name", "property": "data", "value": "h4"}], [])
            assert "outlier" in view and "3 TFLOP\\u002fs" in view and "no jobs ran on this host" in view, view[:300]
        finally:
            client.close()
