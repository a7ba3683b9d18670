"""Escaped telemetry text stays text in the real plotly.js renderer (issue #13 item 17).

The timeline figure of a span named like a link is drawn by the dashboard's own
plotly.js bundle in headless Chromium: the bar label and legend show the markup as
literal text and the SVG holds no ``<a>`` element. The unescaped figure, drawn the same
way, does make a link (the check can fail).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import plotly
import pytest
from fleetscope.dashboard import plotly_bundle
from fleetscope.dashboard.figures.timeline import build_timeline

pytestmark = [pytest.mark.browser]
EVIL = '<a href="https://evil.example/">evil</a>'


def _page(tmp_path, fig: dict) -> str:
    full = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    js = plotly_bundle.served_bytes() if plotly_bundle.use_partial() else full.read_bytes()
    (tmp_path / "plotly.js").write_bytes(js)
    page = tmp_path / "fig.html"
    page.write_text(f"""<!doctype html><html><body><div id="g" style="width:900px;height:400px"></div>
<script src="plotly.js"></script><script>
const fig = {json.dumps(fig)};
Plotly.newPlot('g', fig.data, fig.layout).then(() => {{ document.title = 'drawn'; }});
</script></body></html>""")
    return page.as_uri()


def _draw(browser, url: str) -> tuple[int, str]:
    browser.get(url)
    deadline = time.monotonic() + 30
    while browser.title != "drawn" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert browser.title == "drawn"
    links = browser.execute_script("return document.querySelectorAll('#g svg a').length")
    text = browser.execute_script("return document.querySelector('#g').textContent")
    return links, text


def test_timeline_markup_is_drawn_as_text(browser, tmp_path):
    spans = [{"rank": 0, "step": 1, "cat": "collective", "name": "x", "op": EVIL, "group_id": "g",
              "seq": 1, "start_ns": 0, "end_ns": 50_000_000},
             {"rank": 0, "step": 1, "cat": "section", "name": EVIL, "kind": "compute",
              "start_ns": 0, "end_ns": 40_000_000}]
    data = {"spans": spans, "lanes": [{"rank": 0, "label": "r0"}], "links": [], "from_step": 1,
            "to_step": 1, "t0_ns": 0}
    fig = build_timeline(data, height=400).to_plotly_json()
    links, text = _draw(browser, _page(tmp_path, json.loads(json.dumps(fig, default=str))))
    assert links == 0 and EVIL in text
    # control: the same bars with raw text do become a link in this renderer
    for tr in fig["data"]:
        tr["text"] = [EVIL] * len(tr.get("text") or [])
    (tmp_path / "raw").mkdir()
    links, _ = _draw(browser, _page(tmp_path / "raw", json.loads(json.dumps(fig, default=str))))
    assert links > 0
