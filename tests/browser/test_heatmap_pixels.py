"""The job page's heat-map shows a 1.2x straggler from its PIXELS, before and after the job
hangs (issue 14): the colour scale is a robust percentile range and the hung step, whose
cells run to 30 s, is drawn apart instead of setting the scale.

The job is generated (tests/views_synth.py) so the straggler is exactly 1.2x; the hung
step carries 30 s sections like a killed hung job's flushed records. The culprit's row
must differ visibly from its stage peers' rows in a real Chromium screenshot.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.browser.conftest import SCREENSHOTS
from tests.browser.pixels import decode_png, distance
from tests.helpers.server import running_server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

JOB = "pixels-1.2x"
STRAGGLER = 5
PEERS = (4, 6, 7)  # rank 5's pipeline stage
HANG_RANK, HANG_STEP = 3, 24
MIN_VISIBLE = 40.0
"""RGB distance (0-441) from which two colours are told apart at a glance."""

# viewport centre of every cell (row of rank r, column j) of the heat-map, from plotly's axes
CELLS_JS = """
const gd = document.querySelector('#heatmap .js-plotly-plot');
if (!gd || !gd._fullLayout || !gd.data || !gd.data.length || !gd.data[0].y) return null;
const fl = gd._fullLayout, hm = gd.data[0];
if (arguments[1]) gd.scrollIntoView({block: 'center'});
const box = gd.getBoundingClientRect(), out = {};
for (const r of arguments[0]) {
  const row = hm.y.findIndex(l => l.startsWith('r' + r + ' '));
  if (row < 0) return null;
  out[r] = hm.x.map(step => [step, box.left + fl._size.l + fl.xaxis.d2p(step),
                             box.top + fl._size.t + fl.yaxis.d2p(hm.y[row])]);
}
return {cells: out, ntraces: gd.data.length, zmax: hm.zmax || null};
"""


def _records() -> tuple[dict, dict]:
    """The job's records before the hang, and what the hang adds (the hung step)."""
    from tests.views_synth import SynthJob

    synth = SynthJob(job=JOB, t0_ns=time.time_ns() - 120 * 10**9, num_steps=30, straggler_rank=STRAGGLER,
                     straggler_factor=1.2, straggler_from_step=2, hang_rank=HANG_RANK, hang_step=HANG_STEP)  # fmt: skip
    rec = synth.build()
    # the hung step as a killed job leaves it: every rank's open section flushed at ~30 s
    start = max(s["end_ns"] for s in rec["steps"])
    for r in range(8):
        rec["sections"].append({
            "job": JOB, "attempt": 0, "rank": r, "host": synth.host(r), "step": HANG_STEP, "microbatch": 0,
            "name": "forward", "kind": "compute", "start_ns": start, "end_ns": start + 30 * 10**9,
            "duration_ns": 30 * 10**9, "device_ns": -1,
        })  # fmt: skip
    before: dict = {}
    after: dict = {}
    for kind, rows in rec.items():
        if kind in ("sections", "collectives", "steps"):
            before[kind] = [x for x in rows if x["step"] < HANG_STEP]
            after[kind] = [x for x in rows if x["step"] >= HANG_STEP]
        elif kind == "inflight":
            after[kind] = rows
        else:
            before[kind] = rows
    return before, after


def _ingest(url: str, records: dict, key: str) -> None:
    r = httpx.post(f"{url}/api/v1/ingest", json={"records": records}, headers={"Idempotency-Key": key}, timeout=60)
    r.raise_for_status()


def _on_screen(info: dict, width: float, height: float) -> bool:
    return all(0 <= x < width and 0 <= y < height for cells in info["cells"].values() for _, x, y in cells)


def _row_colours(browser, name: str) -> tuple[dict[int, tuple[float, float, float]], dict]:
    """Mean screenshot colour of each rank's row over the steps before the hang.

    The page keeps filling in around the plot and may move it, so the screenshot is taken
    only once the cells sit still inside the viewport, and kept only if they did not move
    while it was taken.
    """
    ranks = [STRAGGLER, *PEERS]
    deadline = time.monotonic() + 90
    info = None
    while time.monotonic() < deadline:
        info = browser.execute_script(CELLS_JS, ranks, True)
        if info and all(len(v) >= HANG_STEP - 2 for v in info["cells"].values()):
            break
        time.sleep(0.5)
    assert info, "heat-map did not render"
    width, height = browser.execute_script("return [window.innerWidth, window.innerHeight]")
    shot = None
    while time.monotonic() < deadline:
        time.sleep(1.0)
        browser.execute_script(CELLS_JS, ranks, True)  # back into view if the page moved it
        time.sleep(0.5)
        before = browser.execute_script(CELLS_JS, ranks, False)
        png = browser.get_screenshot_as_png()
        after = browser.execute_script(CELLS_JS, ranks, False)
        if before and before == after and _on_screen(after, width, height):
            info, shot = after, png
            break
    assert shot is not None, f"the heat-map's cells never sat still inside the {width}x{height} viewport: {info}"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    (SCREENSHOTS / f"{name}.png").write_bytes(shot)  # the very pixels judged below
    img = decode_png(shot)
    dpr = browser.execute_script("return window.devicePixelRatio") or 1
    out = {}
    for r, cells in info["cells"].items():
        cols = [img.mean(x * dpr, y * dpr) for step, x, y in cells if 4 <= step < HANG_STEP - 1]
        assert cols, f"no cells of rank {r} on screen"
        out[int(r)] = tuple(sum(c[k] for c in cols) / len(cols) for k in range(3))
    return out, info


def _assert_culprit_stands_out(colours: dict) -> None:
    culprit = colours[STRAGGLER]
    peer_gap = max(distance(colours[a], colours[b]) for a in PEERS for b in PEERS)
    gaps = [distance(culprit, colours[p]) for p in PEERS]
    assert min(gaps) >= MIN_VISIBLE, f"culprit row {culprit} vs peers {[colours[p] for p in PEERS]}"
    assert min(gaps) >= 3 * peer_gap, (gaps, peer_gap)


def test_heatmap_shows_a_1_2x_straggler_before_and_after_a_hang(tmp_path, browser):
    with running_server(tmp_path, ui=True, ui_refresh_s=3, diagnosis_tick_s=1) as url:
        before_rec, hang_rec = _records()
        _ingest(url, before_rec, "before")
        browser.get(f"{url}/ui/jobs/{JOB}")
        before, _ = _row_colours(browser, "heatmap_1.2x_before_hang")
        _assert_culprit_stands_out(before)

        _ingest(url, hang_rec, "after")
        data = httpx.get(f"{url}/api/v1/jobs/{JOB}/heatmap", params={"metric": "own"}, timeout=30).json()
        assert data["scale"]["off_scale_steps"] == [HANG_STEP], data["scale"]
        assert data["scale"]["max_value"] >= 29_000 and data["scale"]["zmax"] < 1_000
        browser.get(f"{url}/ui/jobs/{JOB}")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the page has the hung step (its grey trace)
            info = browser.execute_script(CELLS_JS, [STRAGGLER], True)
            if info and info["ntraces"] >= 3:
                break
            time.sleep(0.5)
        after, info = _row_colours(browser, "heatmap_1.2x_after_hang")
        assert info["ntraces"] >= 3, "the hung step is not drawn apart"
        _assert_culprit_stands_out(after)
