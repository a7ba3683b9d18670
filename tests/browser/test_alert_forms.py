"""The incidents page set up like an operator would, in real headless Chromium: an alert
rule and a webhook created through the forms (the server's validation errors shown next
to their fields), a test notification sent with the webhook's button and received, signed,
by a loopback receiver; at 1440 px the tables fit and the "live" label is beside its box."""

from __future__ import annotations

import json

import httpx
import pytest
from fleetscope.server.alerts.signing import verify

from tests.browser.conftest import WINDOW, full_page_screenshot, screenshot
from tests.helpers.server import running_server
from tests.helpers.waiting import wait_for as _wait_for
from tests.helpers.webhooks import WebhookReceiver

pytestmark = pytest.mark.browser
SECRET = "form-signing-secret-0123"


def wait_for(fn, timeout_s: float = 60.0, what: str = "condition"):
    """The suite's :func:`tests.helpers.waiting.wait_for`, a page mid-render counting as not yet."""
    return _wait_for(fn, timeout_s, what, interval_s=0.25, ignore=(Exception,))


def fill(browser, element_id: str, text: str) -> None:
    from selenium.webdriver.common.keys import Keys

    el = browser.find_element("id", element_id)
    el.click()
    el.send_keys(Keys.CONTROL, "a")
    el.send_keys(Keys.DELETE)
    el.send_keys(text)


def text_of(browser, element_id: str) -> str:
    return browser.find_element("id", element_id).text


def test_rule_and_webhook_forms_and_test_notification(browser, tmp_path):
    rx = WebhookReceiver()
    try:
        with running_server(tmp_path, ui=True, ui_refresh_s=2, webhook_allow="127.0.0.1") as url:
            api = url.api
            browser.get(f"{url}/ui/incidents")
            wait_for(lambda: "straggler-5pct" in text_of(browser, "rules-list"), 60, "the built-in rules")

            # a rule: the browser refuses a missing name; the server's answer lands per field
            fill(browser, "rule-f-min_slowdown", "0.1")
            browser.find_element("id", "rule-create").click()
            wait_for(lambda: text_of(browser, "rule-e-name") == "required", 30, "name required")
            fill(browser, "rule-f-name", "slow ranks 10%")
            fill(browser, "rule-f-min_steps", "2000000")  # above the server's limit
            browser.find_element("id", "rule-create").click()
            err = wait_for(lambda: text_of(browser, "rule-e-min_steps"), 30, "min_steps error from the server")
            assert "1000000" in err, err
            assert text_of(browser, "rule-e-name") == ""
            fill(browser, "rule-f-min_steps", "20")
            browser.find_element("id", "rule-create").click()
            wait_for(lambda: browser.find_elements("id", "rule-created"), 30, "rule created")
            rule = next(r for r in httpx.get(f"{api}/alerts/rules", timeout=10).json() if r["name"] == "slow ranks 10%")
            assert (rule["kind"], rule["min_slowdown"], rule["min_steps"], rule["severity"]) == ("straggler", 0.1, 20, "warning")
            wait_for(lambda: "slow ranks 10%" in text_of(browser, "rules-list"), 30, "the new rule in the table")

            # a webhook: each server error under its own field. The body's fields are checked
            # first (max_attempts), the URL after (the SSRF guard, which shows only the URL's
            # scheme, host and port), so the two errors come one submit after the other.
            fill(browser, "webhook-f-name", "loopback pager")
            fill(browser, "webhook-f-url", "ftp://nope.example")
            fill(browser, "webhook-f-max_attempts", "500")
            browser.find_element("id", "webhook-create").click()
            err = wait_for(lambda: text_of(browser, "webhook-e-max_attempts"), 30, "max_attempts error")
            assert "100" in err, err
            fill(browser, "webhook-f-max_attempts", "3")
            browser.find_element("id", "webhook-create").click()
            err = wait_for(lambda: text_of(browser, "webhook-e-url"), 30, "url error from the server")
            assert "expected http or https" in err, err
            assert text_of(browser, "webhook-e-max_attempts") == ""
            browser.execute_script("document.getElementById('webhook-form').scrollIntoView()")
            screenshot(browser, "incidents-webhook-form-errors")
            fill(browser, "webhook-f-url", rx.url)
            fill(browser, "webhook-f-max_attempts", "3")
            fill(browser, "webhook-f-secret", SECRET)
            browser.find_element("id", "webhook-create").click()
            wait_for(lambda: browser.find_elements("id", "webhook-created"), 30, "webhook created")
            assert text_of(browser, "webhook-e-url") == "" and text_of(browser, "webhook-e-max_attempts") == ""
            hook = next(h for h in httpx.get(f"{api}/alerts/webhooks", timeout=10).json() if h["name"] == "loopback pager")
            # the API shows URLs as scheme://host:port/… (paths often hold tokens)
            assert rx.url.startswith(hook["url"].rstrip("…")) and hook["has_secret"] and hook["max_attempts"] == 3

            # the test notification button of that webhook's row
            button = wait_for(lambda: browser.find_element(
                "css selector", f'button[id*="webhook-test"][id*="\\"{hook["id"]}\\""]'), 30, "test button")
            button.click()
            ok = wait_for(lambda: text_of(browser, "webhook-test-ok"), 30, "test notification delivered")
            assert f"webhook {hook['id']}" in ok
            first = rx.wait_for_deliveries(1, timeout_s=10)[0]
            headers, body = first.headers, first.body
            payload = json.loads(body)
            assert payload["version"] == "4" and payload["receiver"] == "loopback pager"
            assert payload["alerts"][0]["labels"]["alertname"] == "FleetscopeTestNotification"
            assert verify(SECRET, headers, body)

            # layout at 1440 px: nothing wider than the viewport, tables inside their cards,
            # the live label's text starts right of its checkbox
            assert browser.get_window_size()["width"] == WINDOW[0]
            geo = browser.execute_script("""
                const out = {page: document.documentElement.scrollWidth, view: document.documentElement.clientWidth};
                out.tables = [...document.querySelectorAll('#rules-list table, #webhooks-list table')].map(t => {
                    const card = t.closest('.fs-card').getBoundingClientRect();
                    return [t.getBoundingClientRect().right, card.right];
                });
                const box = document.querySelector('#live-toggle input').getBoundingClientRect();
                const label = document.querySelector('#live-toggle label');
                const walk = document.createTreeWalker(label, NodeFilter.SHOW_TEXT,
                    {acceptNode: n => n.textContent.trim() ? NodeFilter.FILTER_ACCEPT : NodeFilter.FILTER_SKIP});
                const text = walk.nextNode();
                const r = document.createRange(); r.selectNodeContents(text);
                const t = r.getBoundingClientRect();
                out.live = [box.left, box.right, t.left, t.right, box.top, box.bottom, t.top, t.bottom];
                out.liveColor = getComputedStyle(label).color;
                return out;""")
            assert geo["page"] <= geo["view"], geo
            assert len(geo["tables"]) == 2 and all(right <= card for right, card in geo["tables"]), geo
            box_l, box_r, text_l, text_r, *_ = geo["live"]
            assert box_r <= text_l and text_r > text_l, geo["live"]
            assert geo["liveColor"] == "rgb(255, 255, 255)", geo
            browser.execute_script("window.scrollTo(0, 0)")
            full_page_screenshot(browser, "incidents-alert-forms")
    finally:
        rx.close()
