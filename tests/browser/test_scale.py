"""A 12,288-rank job (DP 192 x PP 8 x TP 8) x 200 steps: the job page becomes
interactive within a generous bound in headless Chromium (target 3 s; the measured time
is printed and written to test-artifacts/dashboard_load.json)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.browser.conftest import ROOT, full_page_screenshot
from tests.helpers.rollup_fixture import ScaleJob, write_scale_job
from tests.helpers.server import running_server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

BOUND_S = 30.0
"""Generous: shared CI machines are slow; the target on an idle machine is 3 s."""

# Interactive = the heat-map and the grid are drawn with their data (plotly has computed
# and laid them out) and Dash has bound its click handler (a click selects a rank).
RENDERED_JS = """
const ok = id => { const gd = document.querySelector('#' + id + ' .js-plotly-plot');
                   return !!(gd && gd.data && gd.calcdata && gd._fullLayout
                             && gd.data.some(t => t.type === 'heatmap' && t.z && t.z.length)
                             && gd._ev && (gd._ev._events || {}).plotly_click); };
return ok('heatmap') && ok('grid');
"""


def test_12288_rank_job_page_is_interactive(tmp_path, browser):
    job = write_scale_job(f"chdb://{tmp_path / 'store'}", ScaleJob(t0_ns=time.time_ns() - 600 * 10**9))
    with running_server(tmp_path, ui=True, ui_refresh_s=60, diagnosis_enabled=False) as url:
        r = httpx.post(f"{url}/api/v1/ingest", json={"records": {"jobs": [job.jobs_record()]}},
                       headers={"Idempotency-Key": "scale-job"}, timeout=60)  # fmt: skip
        r.raise_for_status()
        browser.get(f"{url}/ui/")  # static bundles cached, as for an operator already on the UI
        t = time.perf_counter()
        browser.get(f"{url}/ui/jobs/{job.job}")
        while not browser.execute_script(RENDERED_JS):
            assert time.perf_counter() - t < BOUND_S, f"job page not interactive within {BOUND_S} s"
            time.sleep(0.05)
        load_s = time.perf_counter() - t
        # The heat-map came downsampled: at most 256 rows for 12,288 ranks, ranks of a
        # row never straddle a TP group, and the slow rank 7777 is the worst of its cell.
        info = browser.execute_script("""
            const gd = document.querySelector('#heatmap .js-plotly-plot'); const hm = gd.data[0];
            return {rows: hm.y.length, cols: hm.x.length, ranks: hm.customdata.flat()};""")
        assert info["rows"] <= 256 and info["cols"] == 200
        assert 7777 in info["ranks"]
        full_page_screenshot(browser, "scale_12288_job")
    out = ROOT / "test-artifacts" / "dashboard_load.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"ranks": job.topo.world_size, "steps": job.num_steps, "page_interactive_s": load_s}))
    print(f"\n12,288-rank job page interactive in {load_s:.3f} s (bound {BOUND_S} s, target 3 s)")
