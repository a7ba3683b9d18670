"""``fleetscope import trace``: torch.profiler traces of a real 2-rank gloo job, imported
into a real server; the timeline, the Perfetto export and the step breakdown use them."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from fleetscope.server.importers.profiler_trace import TraceError, load_trace, to_records

from tests.helpers.ranks import run_ranks
from tests.helpers.server import running_server
from tests.helpers.trace_scenarios import SLOW_S, STEPS

TOKEN = "trace-import-token-0123456789"


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    work = tmp_path_factory.mktemp("prof")
    run_ranks("tests.helpers.trace_scenarios:profiled_job", 2, work, timeout_s=180)
    return sorted((work / "traces").glob("rank*.json"))


def test_trace_becomes_steps_sections_and_numbered_collectives(traces):
    docs = [load_trace(p) for p in traces]
    marked = [any(e.get("name", "").startswith("ProfilerStep#") for e in d["traceEvents"]) for d in docs]
    assert marked == [True, False]  # steps from ProfilerStep ranges on 0, inferred on 1: same
    recs = [to_records("t", p, d) for p, d in zip(traces, docs)]
    assert [r["rank"] for r in recs] == [0, 1]
    for r in recs:
        assert [s["step"] for s in r["steps"]] == list(range(STEPS))
        names = [s["name"] for s in r["sections"]]
        assert names.count("forward") == STEPS and names.count("optimizer") == STEPS
        coll = r["collectives"]
        assert [c["seq"] for c in coll] == list(range(1, 4 * STEPS + 1))  # 4 grads per step
        assert all(c["op"] == "all_reduce" and c["group_id"] == "world" for c in coll)
        assert all(c["completed_ns"] >= c["enqueued_ns"] for c in coll)
        assert [c["step"] for c in coll] == [s for s in range(STEPS) for _ in range(4)]
    # both ranks' clocks map to the same epoch: the first all-reduce overlaps on both
    a, b = recs[0]["collectives"][0], recs[1]["collectives"][0]
    assert a["enqueued_ns"] <= b["completed_ns"] and b["enqueued_ns"] <= a["completed_ns"]


def test_import_into_a_server_feeds_timeline_perfetto_and_breakdown(traces, tmp_path):
    with running_server(tmp_path, token=TOKEN) as url:
        proc = subprocess.run([sys.executable, "-m", "fleetscope.cli", "import", "trace",
                               *map(str, traces), "--job", "prof", "--server", str(url),
                               "--token", TOKEN], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        h = {"Authorization": f"Bearer {TOKEN}"}
        tl = httpx.get(f"{url}/api/v1/jobs/prof/timeline", params={"ranks": "0,1", "from_step": 0,
                       "to_step": STEPS - 1}, headers=h, timeout=60)
        assert tl.status_code == 200, tl.text
        body = tl.text
        assert "forward" in body and "all_reduce" in body
        pf = httpx.get(f"{url}/api/v1/jobs/prof/trace.json", params={"ranks": "0,1"}, headers=h, timeout=60)
        assert pf.status_code == 200 and pf.json()["traceEvents"]
        steps = httpx.get(f"{url}/api/v1/jobs/prof/steps", headers=h, timeout=60)
        assert steps.status_code == 200, steps.text
        rows = steps.json()
        rows = rows.get("rows", rows) if isinstance(rows, dict) else rows
        by_rank = {0: [], 1: []}
        for r in rows:
            by_rank[int(r["rank"])].append(r)
        assert len(by_rank[0]) == len(by_rank[1]) == STEPS
        # again: the content-derived idempotency keys store nothing twice
        again = subprocess.run([sys.executable, "-m", "fleetscope.cli", "import", "trace",
                                *map(str, traces), "--job", "prof", "--server", str(url),
                                "--token", TOKEN], capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        steps2 = httpx.get(f"{url}/api/v1/jobs/prof/steps", headers=h, timeout=60).json()
        rows2 = steps2.get("rows", steps2) if isinstance(steps2, dict) else steps2
        assert len(rows2) == len(rows)


def test_rank_ones_slow_forward_shows_in_its_sections(traces):
    recs = {r["rank"]: r for r in (to_records("t", p, load_trace(p)) for p in traces)}
    fwd = {k: sorted(s["duration_ns"] for s in r["sections"] if s["name"] == "forward")
           for k, r in recs.items()}
    assert min(fwd[1]) >= SLOW_S * 1e9  # the busy loop is inside rank 1's forward


def test_not_a_trace_is_a_clear_error(tmp_path):
    bad = tmp_path / "rank0.json"
    bad.write_text('{"foo": 1}')
    with pytest.raises(TraceError, match="no traceEvents list"):
        load_trace(bad)
    proc = subprocess.run([sys.executable, "-m", "fleetscope.cli", "import", "trace", str(bad),
                           "--job", "j"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "rank0.json: not a Chrome trace" in proc.stderr
