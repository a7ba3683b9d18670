"""Dashboard at scale: a 12,288-rank job (DP 192 x PP 8 x TP 8) x 200 steps.

Runs, in one go:
1. the fixture generator (step summaries straight into the store's rollup table);
2. a real server (uvicorn, dashboard mounted at /ui) on that store;
3. REST: the server-side downsampled heat-map the dashboard asks for vs the naive
   baseline, the full 12,288 x 200 matrix; prints both times, sizes and the ratio;
4. the other routes the job page calls (header, trend, timeline), timed the same way;
5. headless Chromium (if installed): time from navigation to the job page being
   interactive (heat-map and topology grid drawn with data), with a cold and a warm
   browser cache.

Exits 1 when the downsampled heat-map is not faster than the full matrix, or when the
job page (warm browser cache, best run) is not interactive within ``--target-s``.

``--breakdown`` adds one more cold-cache visit (not counted in the figures) that says
where the time went: navigation, the renderer's start, the layout, each Dash callback
(sent, answered, bytes), plotly.js loaded, heat-map and grid drawn, and main-thread long
tasks.

    .venv/bin/python bench/dashboard_load.py [--runs 2] [--target-s 3] [--breakdown]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from fleetscope.dashboard.pages.job_callbacks import (
    GRID_MAX_CELLS,
    HEATMAP_MAX_COLS,
    HEATMAP_MAX_ROWS,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.helpers
from tests.helpers.rollup_fixture import ScaleJob, write_scale_job  # noqa: E402

# Interactive = the heat-map and the grid are drawn with their data (plotly has computed
# and laid them out) and Dash has bound its click handler (a click selects a rank).
RENDERED_JS = """
const ok = id => { const gd = document.querySelector('#' + id + ' .js-plotly-plot');
                   return !!(gd && gd.data && gd.calcdata && gd._fullLayout
                             && gd.data.some(t => t.type === 'heatmap' && t.z && t.z.length)
                             && gd._ev && (gd._ev._events || {}).plotly_click); };
return ok('heatmap') && ok('grid');
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(workdir: Path, port: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    env.update(FLEETSCOPE_UI="true", FLEETSCOPE_UI_REFRESH_S="30", FLEETSCOPE_TTL_DAYS="0")
    cmd = [sys.executable, "-m", "fleetscope.cli", "server", "--store", f"chdb://{workdir / 'store'}",
           "--db", f"sqlite:///{workdir / 'control.db'}", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=open(workdir / "server.log", "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((workdir / "server.log").read_text()[-3000:])
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server not ready in 120 s")


def timed_get(url: str, **params) -> tuple[float, int]:
    t = time.perf_counter()
    r = httpx.get(url, params=params, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t, len(r.content)


# --breakdown only: page-side marks (performance.now() of each first sighting) and long tasks.
MARKS_JS = """
window.__fs = {marks: {}, longtasks: []};
try { new PerformanceObserver(l => { for (const e of l.getEntries())
        window.__fs.longtasks.push([Math.round(e.startTime), Math.round(e.duration)]); })
      .observe({type: 'longtask', buffered: true}); } catch (e) {}
(function poll() {
  const m = window.__fs.marks, now = Math.round(performance.now());
  const gd = id => document.querySelector('#' + id + ' .js-plotly-plot');
  const drawn = id => { const g = gd(id); return !!(g && g.calcdata && g.data && g.data.some(
      t => t.type === 'heatmap' && t.z && t.z.length)); };
  const seen = {renderer: !!window.dash_renderer, page_rendered: !!document.querySelector('#heatmap'),
                plotly_js: !!window.Plotly, heatmap_drawn: drawn('heatmap'), grid_drawn: drawn('grid')};
  for (const k in seen) { if (seen[k] && m[k] === undefined) { m[k] = now; } }
  if (m.heatmap_drawn === undefined || m.grid_drawn === undefined) { setTimeout(poll, 10); }
})();
"""


def chromium(profile: str, perf_log: bool = False):
    """A fresh headless Chromium (None when chromium/chromedriver are not installed)."""
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (browser and driver):
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1440,900"):  # fmt: skip
        opts.add_argument(a)
    if perf_log:
        opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=opts)


def wait_interactive(d, t0: float, timeout_s: float) -> float:
    while not d.execute_script(RENDERED_JS):
        if time.perf_counter() - t0 > timeout_s:
            raise RuntimeError(f"job page not interactive within {timeout_s} s")
        time.sleep(0.05)
    return time.perf_counter() - t0


def cold_breakdown(base: str, job: str, timeout_s: float = 120.0) -> dict | None:
    """One cold-cache visit with page-side marks, resource timing and the Dash callbacks
    (from Chromium's network log), all in ms since navigation start."""
    profile = tempfile.mkdtemp(prefix="fleetscope-bench-chromium-")
    d = chromium(profile, perf_log=True)
    if d is None:
        shutil.rmtree(profile, ignore_errors=True)
        return None
    try:
        d.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": MARKS_JS})
        t = time.perf_counter()
        d.get(f"{base}/ui/jobs/{job}")
        wall = wait_interactive(d, t, timeout_s)
        time.sleep(0.2)
        page = d.execute_script("""
            const nav = performance.getEntriesByType('navigation')[0];
            const res = performance.getEntriesByType('resource').filter(e => !e.name.includes('_dash-update'))
              .map(e => [e.name.split('?')[0].split('/').pop(), Math.round(e.startTime), Math.round(e.responseEnd),
                         e.encodedBodySize]);
            return {marks: window.__fs.marks, longtasks: window.__fs.longtasks, html: Math.round(nav.responseEnd),
                    dom_content_loaded: Math.round(nav.domContentLoadedEventEnd), resources: res,
                    time_origin: performance.timeOrigin};""")  # fmt: skip
        calls: dict[str, dict] = {}
        for entry in d.get_log("performance"):
            m = json.loads(entry["message"])["message"]
            p = m.get("params", {})
            if m["method"] == "Network.requestWillBeSent" and "_dash-update-component" in p["request"]["url"]:
                body = json.loads(p["request"].get("postData") or "{}")
                calls[p["requestId"]] = {"output": str(body.get("output", "?")).split("@")[0].strip("."),
                                         "wall": p["wallTime"], "ts": p["timestamp"]}  # fmt: skip
            elif m["method"] == "Network.loadingFinished" and p["requestId"] in calls:
                c = calls[p["requestId"]]
                c["done_ms"], c["bytes"] = round(1000 * (p["timestamp"] - c["ts"])), p["encodedDataLength"]
        callbacks = sorted(
            ([c["output"][:60], round(c["wall"] * 1000 - page["time_origin"]), c.get("done_ms"), c.get("bytes")]
             for c in calls.values()),
            key=lambda x: x[1],
        )  # fmt: skip
        page.pop("time_origin")
        return {"interactive_s": round(wall, 3), **page,
                "callbacks [output, sent ms, took ms, bytes]": callbacks,
                "long_tasks_total_ms": sum(x[1] for x in page["longtasks"])}  # fmt: skip
    finally:
        d.quit()
        shutil.rmtree(profile, ignore_errors=True)


def page_load_s(base: str, job: str, timeout_s: float = 120.0) -> tuple[float, float] | None:
    """Navigation start -> heat-map and grid drawn, in a fresh headless Chromium:
    (cold browser cache, warm browser cache)."""
    profile = tempfile.mkdtemp(prefix="fleetscope-bench-chromium-")
    d = chromium(profile)
    if d is None:
        shutil.rmtree(profile, ignore_errors=True)
        return None
    try:
        times = []
        for _ in range(2):  # first visit: cold browser cache; second: bundles cached
            t = time.perf_counter()
            d.get(f"{base}/ui/jobs/{job}")
            times.append(wait_interactive(d, t, timeout_s))
        return tuple(times)
    finally:
        d.quit()
        shutil.rmtree(profile, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=2, help="measurements of each kind (the best is reported)")
    p.add_argument("--target-s", type=float, default=3.0,
                   help="fail when the job page (warm browser cache, best run) takes longer (default 3)")  # fmt: skip
    p.add_argument("--breakdown", action="store_true",
                   help="one more cold-cache visit (not counted) that prints where its time went")  # fmt: skip
    args = p.parse_args()
    if args.runs < 1 or args.target_s <= 0:
        p.error("--runs must be >= 1 and --target-s > 0")
    workdir = Path(tempfile.mkdtemp(prefix="fleetscope-dashboard-bench-"))
    t = time.perf_counter()
    job = write_scale_job(f"chdb://{workdir / 'store'}", ScaleJob(t0_ns=time.time_ns() - 600 * 10**9))
    gen_s = time.perf_counter() - t
    port = free_port()
    proc = start_server(workdir, port)
    base = f"http://127.0.0.1:{port}"
    api = f"{base}/api/v1"
    try:
        httpx.post(f"{api}/ingest", json={"records": {"jobs": [job.jobs_record()]}},
                   headers={"Idempotency-Key": "bench-job"}, timeout=60).raise_for_status()  # fmt: skip
        hm = f"{api}/jobs/{job.job}/heatmap"
        timed_get(hm, metric="own")  # warm caches once for both
        down = min(timed_get(hm, metric="own", max_rows=HEATMAP_MAX_ROWS, max_cols=HEATMAP_MAX_COLS)
                   for _ in range(args.runs))  # fmt: skip
        full = min(timed_get(hm, metric="own", max_rows=job.topo.world_size, max_cols=job.num_steps)
                   for _ in range(args.runs))  # fmt: skip
        grid = min(timed_get(f"{api}/jobs/{job.job}/grid", max_cells=GRID_MAX_CELLS) for _ in range(args.runs))
        others = {
            name: min(timed_get(f"{api}/jobs/{job.job}{path}") for _ in range(args.runs))
            for name, path in (("job_header", ""), ("trend", "/trend"), ("timeline", "/timeline"))
        }
        loads = [page_load_s(base, job.job) for _ in range(args.runs)]
        breakdown = cold_breakdown(base, job.job) if args.breakdown else None
        cold = [x[0] for x in loads if x]
        warm = [x[1] for x in loads if x]
        result = {
            "ranks": job.topo.world_size,
            "steps": job.num_steps,
            "fixture_write_s": round(gen_s, 2),
            "heatmap_downsampled_s": round(down[0], 3),
            "heatmap_downsampled_bytes": down[1],
            "heatmap_full_matrix_s": round(full[0], 3),
            "heatmap_full_matrix_bytes": full[1],
            "heatmap_speedup_vs_full": round(full[0] / down[0], 1),
            "grid_s": round(grid[0], 3),
            "grid_bytes": grid[1],
            **{f"{name}_s": round(v[0], 3) for name, v in others.items()},
            "page_interactive_cold_cache_s": round(min(cold), 3) if cold else None,
            "page_interactive_warm_cache_s": round(min(warm), 3) if warm else None,
            "page_interactive_cold_cache_median_s": round(statistics.median(cold), 3) if cold else None,
            "page_interactive_warm_cache_median_s": round(statistics.median(warm), 3) if warm else None,
            "page_interactive_all_s": [None if x is None else [round(v, 3) for v in x] for x in loads],
            "load_average_1min": round(os.getloadavg()[0], 1),
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    print(f"12,288-rank job ({job.topo.world_size} ranks x {job.num_steps} steps), fixture written in {gen_s:.1f} s")
    print(f"heat-map, downsampled (dashboard): {down[0]:.3f} s, {down[1] / 1e3:.0f} kB")
    print(f"heat-map, full matrix (baseline):  {full[0]:.3f} s, {full[1] / 1e6:.1f} MB")
    print(f"ratio full / downsampled: {full[0] / down[0]:.1f}x time, {full[1] / down[1]:.1f}x bytes")
    print(f"grid: {grid[0]:.3f} s, {grid[1] / 1e3:.0f} kB; "
          + ", ".join(f"{name}: {v[0]:.3f} s" for name, v in others.items()))  # fmt: skip
    if not cold:
        print("job page interactive: skipped (chromium/chromedriver not installed)")
    else:
        print(f"job page interactive in headless Chromium: {min(warm):.3f} s with cached bundles, "
              f"{min(cold):.3f} s cold (best of {len(cold)}; medians {statistics.median(warm):.3f} s and "
              f"{statistics.median(cold):.3f} s; runs [cold, warm]: {result['page_interactive_all_s']}; target <= 3 s; "
              f"1-min load average {result['load_average_1min']} on {os.cpu_count()} CPUs)")  # fmt: skip
    if breakdown:
        print("cold-cache breakdown (ms since navigation start):")
        for k, v in breakdown.items():
            print(f"  {k}: {v}")
    print(json.dumps(result))
    failures = []
    if down[0] >= full[0]:
        failures.append(f"the downsampled heat-map ({down[0]:.3f} s) is not faster than the full matrix ({full[0]:.3f} s)")
    if warm and min(warm) > args.target_s:
        failures.append(f"job page interactive in {min(warm):.3f} s > target {args.target_s} s")
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
