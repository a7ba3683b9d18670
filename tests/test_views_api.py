"""The view routes and the /ui mount against a real server (uvicorn, chdb, SQLite)."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from tests.helpers.server import running_server
from tests.views_synth import SynthJob


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("views-api")
    with running_server(tmp, ui=True, diagnosis_enabled=False) as url:
        t0 = time.time_ns() - 120 * 10**9
        for job in (
            SynthJob(job="strag", t0_ns=t0, straggler_rank=5, straggler_factor=1.3, straggler_from_step=10),
            # one micro-batch: no paired isend+irecv
            SynthJob(job="strag-1mb", t0_ns=t0, straggler_rank=5, straggler_factor=1.3, straggler_from_step=10, num_mb=1),
            SynthJob(job="hang", t0_ns=t0, hang_rank=3, hang_step=20),
        ):
            r = httpx.post(f"{url.api}/ingest", json={"records": job.build()}, headers={"Idempotency-Key": job.job},
                           timeout=60)  # fmt: skip
            assert r.status_code == 200, r.text
        yield url


def get(server, path, **params):
    return httpx.get(f"{server.api}{path}", params=params, timeout=60)


def test_heatmap_rows_in_pp_dp_tp_order_and_straggler_is_hottest(server):
    r = get(server, "/jobs/strag/heatmap", metric="own", from_step=10, to_step=29)
    assert r.status_code == 200
    h = r.json()
    assert h["row_labels"][0] == "r0 pp0 dp0 tp0" and h["row_pp"] == [0, 0, 0, 0, 1, 1, 1, 1]
    row5 = h["row_labels"].index("r5 pp1 dp0 tp1")
    means = [sum(v for v in row if v is not None) / len(row) for row in h["z"]]
    assert max(range(8), key=lambda i: means[i]) == row5 and h["rank"][row5][0] == 5
    small = get(server, "/jobs/strag/heatmap", max_rows=3, max_cols=7).json()
    assert len(small["z"]) <= 3 and len(small["steps"]) <= 7 and small["row_bucket"] >= 3


def test_heatmap_errors_name_the_bad_value(server):
    assert get(server, "/jobs/nope/heatmap").status_code == 404
    r = get(server, "/jobs/strag/heatmap", metric="bogus")
    assert r.status_code == 422 and "bogus" in r.json()["detail"]
    r = get(server, "/jobs/strag/heatmap", from_step=9, to_step=3)
    assert r.status_code == 422 and "to_step=3" in r.json()["detail"]
    r = get(server, "/jobs/strag/timeline", ranks="0,99")
    assert r.status_code == 422 and "99" in r.json()["detail"]


def test_grid_scores_the_straggler_and_shows_the_hang(server):
    g = get(server, "/jobs/strag-1mb/grid").json()
    i = g["cells"]["rank"].index(5)
    assert g["cells"]["state"][i] == "slow" and g["cells"]["score"][i] > 1.2
    assert all(s == "ok" for r, s in zip(g["cells"]["rank"], g["cells"]["state"]) if r != 5)
    h = get(server, "/jobs/hang/grid").json()
    stuck = {d["rank"]: d for d in h["ranks"] if d["state"] == "stuck"}
    assert 3 in stuck and stuck[3]["inflight"]["op"] == "forward"


def test_grid_flags_only_the_straggler_with_paired_exchanges(server):
    """The overlapping isend+irecv of a 1F1B paired exchange wait once: own work (step -
    comm) of the straggler's neighbour stage is not cut, so its other replica is not slow."""
    g = get(server, "/jobs/strag/grid").json()
    assert [r for r, s in zip(g["cells"]["rank"], g["cells"]["state"]) if s != "ok"] == [5]


def test_timeline_is_bounded_and_links_p2p(server):
    t = get(server, "/jobs/strag/timeline", rank=5, from_step=20, to_step=20).json()
    assert t["ranks"] == [1, 5] and not t["truncated"]
    assert {s["name"] for s in t["spans"]} >= {"forward", "backward", "send", "recv"}
    assert t["links"] and all({link["src_rank"], link["dst_rank"]} == {1, 5} for link in t["links"])
    small = get(server, "/jobs/strag/timeline", ranks="0-7", max_spans=50).json()
    assert len(small["spans"]) == 50 and small["truncated"] and small["num_spans_total"] > 50


def test_trace_export_is_chrome_trace_json(server):
    r = get(server, "/jobs/strag/trace.json", ranks="pp.dp0.tp1", from_step=5, to_step=5)
    assert r.status_code == 200 and "attachment" in r.headers["content-disposition"]
    ev = r.json()["traceEvents"]
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"rank 1 (r1 pp0 dp0 tp1)", "rank 5 (r5 pp1 dp0 tp1)"}
    assert any(e["ph"] == "X" and e["name"] == "forward mb0" for e in ev)
    assert sum(e["ph"] == "s" for e in ev) == sum(e["ph"] == "f" for e in ev) > 0


def test_trend_and_hardware(server):
    tr = get(server, "/jobs/strag/trend").json()
    assert len(tr["steps"]) == 30 and tr["max_ms"][-1] > tr["max_ms"][0] and tr["mfu"][0] is not None
    hw = get(server, "/jobs/strag/hardware", rank=5).json()
    assert hw["host"] == "node-1" and hw["series"][0]["name"] == "gpu.temperature_c"


def test_dashboard_is_mounted_at_ui(server):
    r = httpx.get(f"{server}/ui/", timeout=60)
    assert r.status_code == 200 and '"requests_pathname_prefix":"\\u002fui\\u002f"' in r.text
    layout = httpx.get(f"{server}/ui/_dash-layout", timeout=60)
    assert layout.status_code == 200 and "live-toggle" in layout.text


def test_dashboard_cli_rejects_bad_api_url():
    p = subprocess.run([sys.executable, "-m", "fleetscope.cli", "dashboard", "--api", "localhost:8000"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 2 and "localhost:8000" in p.stderr
