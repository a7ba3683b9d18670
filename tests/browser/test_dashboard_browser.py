"""The dashboard in real headless Chromium against a real server and a real 8-rank job
with an injected straggler and hang (see ``reference_job.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.browser import reference_job
from tests.browser.conftest import full_page_screenshot, screenshot
from tests.helpers.server import running_server
from tests.helpers.waiting import wait_for as _wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Plotly keeps the figure on the graph div: read it instead of guessing from pixels.
TRACES_JS = """
const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
if (!gd || !gd.data) return null;
return gd.data.map(t => ({type: t.type, name: t.name || '', text: t.text || null,
                          y: (t.type === 'heatmap') ? null : (t.y || null),
                          base: t.base || null}));
"""


# Viewport coordinates of the centre of the heat-map cell (rank, step index), from
# plotly's own axis mapping, with the plot scrolled wholly into view first.
CELL_JS = """
const gd = document.querySelector('#heatmap .js-plotly-plot');
if (!gd || !gd._fullLayout || !gd.data || !gd.data.length) return null;
const fl = gd._fullLayout; const hm = gd.data[0];
const row = hm.y.findIndex(l => l.startsWith('r' + arguments[0] + ' '));
if (row < 0) return null;
const step = hm.x[Math.min(arguments[1], hm.x.length - 1)];
gd.scrollIntoView({block: 'center'});
const box = gd.getBoundingClientRect();
const x = box.left + fl._size.l + fl.xaxis.d2p(step), y = box.top + fl._size.t + fl.yaxis.d2p(hm.y[row]);
if (x < 0 || y < 0 || x >= window.innerWidth || y >= window.innerHeight) return null;
return {x: x, y: y, step: step};
"""


def click_at(driver, x: float, y: float) -> None:
    """A real pointer click at viewport coordinates (not relative to an element: an
    element-relative offset is taken from the centre of its visible part, which moves
    when the page scrolls or the element is partly out of view)."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    actions = ActionBuilder(driver)
    actions.pointer_action.move_to_location(int(x), int(y)).click()
    actions.perform()


def wait_for(driver, fn, timeout_s: float = 60.0, what: str = "condition"):
    """The suite's :func:`tests.helpers.waiting.wait_for`, a page mid-render counting as not yet."""
    return _wait_for(fn, timeout_s, what, interval_s=0.25, ignore=(Exception,))


def traces(driver, graph_id: str):
    return driver.execute_script(TRACES_JS, graph_id)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> Iterator[reference_job.ReferenceJob]:
    workdir = tmp_path_factory.mktemp("dashboard-browser")
    with running_server(workdir, **reference_job.SERVER_SETTINGS) as url:
        rj = reference_job.launch(url, workdir)
        print(f"\nbrowser tests run on the {rj.source} job {rj.job!r}")
        try:
            yield rj
        finally:
            rj.stop()


def open_job(browser, scenario, query: str = "") -> None:
    browser.get(f"{scenario.url}/ui/jobs/{scenario.job}{query}")
    wait_for(browser, lambda: any(t["type"] == "heatmap" for t in traces(browser, "heatmap") or []),
             what="the heat-map to render")  # fmt: skip


def test_job_page_marks_straggler_in_heatmap_and_grid(browser, scenario):
    open_job(browser, scenario)

    def culprit_text(graph: str) -> str:
        return " ".join(
            " ".join(t["text"] or []) if isinstance(t["text"], list) else str(t["text"] or "")
            for t in traces(browser, graph) or []
            if "culprit" in t["name"]
        )

    hm = wait_for(browser, lambda: f"r{reference_job.STRAGGLER}" in culprit_text("heatmap") and culprit_text("heatmap"),
                  what="the straggler marker in the heat-map")  # fmt: skip
    grid = wait_for(browser, lambda: f"r{reference_job.STRAGGLER}" in culprit_text("grid").split() and culprit_text("grid"),
                    what="the straggler ring in the grid")  # fmt: skip
    assert f"r{reference_job.STRAGGLER}" in hm
    assert f"r{reference_job.STRAGGLER}" in grid.split()
    header = browser.find_element("id", "job-header").text
    assert "DP 2 × PP 2 × TP 2" in header
    full_page_screenshot(browser, "job_page")
    screenshot(browser, "job_page_viewport")


def test_timeline_shows_rank_lanes_with_1f1b(browser, scenario):
    open_job(browser, scenario, f"?step={reference_job.HANG_STEP - 2}&rank=0")
    tl = wait_for(browser, lambda: [t for t in traces(browser, "timeline") or [] if t["name"] in ("forward", "backward")],
                  what="forward/backward bars in the timeline")  # fmt: skip
    lanes = browser.execute_script(
        "const gd = document.querySelector('#timeline .js-plotly-plot'); return gd.layout.yaxis.ticktext;"
    )
    assert any(lane.startswith("r0 pp0") for lane in lanes) and any(lane.startswith("r4 pp1") for lane in lanes)
    # 1F1B on the first stage: a backward starts before the last forward (GPipe would
    # run every forward first). Bars are per (rank lane); lane 0 is rank 0's compute lane.
    spans = []
    for t in tl:
        for y, base, text in zip(t["y"], t["base"], t["text"]):
            if y == 0:
                spans.append((base, text))
    labels = [text for _, text in sorted(spans)]
    fwd = [i for i, lab in enumerate(labels) if lab.startswith("F")]
    bwd = [i for i, lab in enumerate(labels) if lab.startswith("B")]
    assert len(fwd) >= 4 and len(bwd) >= 4, labels
    assert min(bwd) < max(fwd), f"no 1F1B interleaving on rank 0: {labels}"
    el = browser.find_element("id", "timeline")
    browser.execute_script("arguments[0].scrollIntoView()", el)
    el.screenshot(str(screenshot(browser, "timeline_page").with_name("timeline.png")))


def test_hang_view_names_the_culprit(browser, scenario):
    open_job(browser, scenario)
    culprit = wait_for(browser, lambda: browser.find_element("id", "hang-culprit").text,
                       what="the hang culprit")  # fmt: skip
    assert f"rank {reference_job.HANG_RANK} " in culprit + " "
    chain = browser.find_element("id", "hang-chain").text
    assert f"waits on rank {reference_job.HANG_RANK}" in chain
    progress = browser.find_element("id", "hang-progress").text.lower()  # headers are upper-cased by CSS
    assert "seq reached" in progress and "heartbeat" in progress and "alive" in progress
    card = browser.find_element("id", "hang-card")
    browser.execute_script("arguments[0].scrollIntoView()", card)
    card.screenshot(str(screenshot(browser, "hang_page").with_name("hang_view.png")))


def test_clicking_a_heatmap_cell_opens_that_rank(browser, scenario):
    open_job(browser, scenario)
    target = reference_job.STRAGGLER
    # The header and other panels fill in around the heat-map after it is drawn and can
    # move it: wait for the header, then aim each click from a fresh measurement.
    wait_for(browser, lambda: "topology" in browser.find_element("id", "job-header").text.lower(),
             what="the job header")  # fmt: skip
    pos = None
    for _attempt in range(3):  # a live refresh may redraw the plot under the pointer: retry
        pos = wait_for(browser, lambda: browser.execute_script(CELL_JS, target, 6), what="the heat-map cell position")
        click_at(browser, pos["x"], pos["y"])
        try:
            wait_for(browser, lambda: f"rank={target}&" in browser.current_url + "&", timeout_s=15, what="the URL")
            break
        except AssertionError:
            pass
    sel = wait_for(browser, lambda: browser.find_element("id", "selected-rank").text == f"rank {target}",
                   timeout_s=90, what=f"the selected rank panel (URL {browser.current_url})")  # fmt: skip
    assert sel
    assert f"rank={target}" in browser.current_url and f"step={pos['step']}" in browser.current_url
    # The timeline follows the selection: the pipeline chain through rank 5.
    wait_for(browser, lambda: any(lane.startswith(f"r{target} ") for lane in browser.execute_script(
        "const gd = document.querySelector('#timeline .js-plotly-plot'); return gd.layout.yaxis.ticktext || [];")),
        what="the timeline to show the selected rank")  # fmt: skip
    full_page_screenshot(browser, "rank_selected")
    # The deep link reopens the same view.
    browser.get(browser.current_url)
    wait_for(browser, lambda: browser.find_element("id", "selected-rank").text == f"rank {target}",
             what="the deep link to restore the selection")  # fmt: skip


def test_fleet_page_lists_the_job(browser, scenario):
    browser.get(f"{scenario.url}/ui/")
    row = wait_for(browser, lambda: scenario.job in browser.find_element("id", "fleet-jobs").text
                   and browser.find_element("id", "fleet-jobs").text, what="the job row")  # fmt: skip
    assert "DP 2 × PP 2 × TP 2" in row
    wait_for(browser, lambda: "hang" in browser.find_element("id", "fleet-incidents").text.lower()
             or "no step completed" in browser.find_element("id", "fleet-incidents").text,
             what="the open hang incident on the fleet page")  # fmt: skip
    full_page_screenshot(browser, "fleet")


def test_incident_page_acknowledges_an_incident(browser, scenario):
    api = f"{scenario.url}/api/v1"
    items = httpx.get(f"{api}/incidents", params={"job": scenario.job, "status": "open"}, timeout=10).json()["items"]
    assert items, "no open incident to acknowledge"
    iid = str(items[0]["id"])
    browser.get(f"{scenario.url}/ui/incidents")
    wait_for(browser, lambda: browser.find_element("id", "incident-table"), what="the incident table")
    full_page_screenshot(browser, "incidents")
    ack_xpath = f"//button[contains(@id, '\"id\":\"{iid}\"') and contains(@id, 'ack')]"

    def click_ack():  # the table refreshes live: find and click in one retried step
        browser.find_element("xpath", ack_xpath).click()
        return True

    for attempt in range(3):  # a click landing on a row being replaced is lost: click again
        wait_for(browser, click_ack, what="the acknowledge button")
        try:
            wait_for(browser, lambda: "acknowledged" in browser.find_element("id", "action-ok").text,
                     timeout_s=20 if attempt < 2 else 60, what="the acknowledgement message")  # fmt: skip
            break
        except AssertionError:
            still_open = httpx.get(f"{api}/incidents/{iid}", timeout=10).json()["status"] == "open"
            if attempt == 2 or not still_open:  # acknowledged but no message: a real failure
                raise
    status = httpx.get(f"{api}/incidents/{iid}", timeout=10).json()["status"]
    assert status == "acknowledged"
    browser.get(f"{scenario.url}/ui/incidents/{iid}")
    detail = wait_for(browser, lambda: browser.find_element("id", "incident-summary").text,
                      what="the incident detail")  # fmt: skip
    assert detail
    full_page_screenshot(browser, "incident_detail")
