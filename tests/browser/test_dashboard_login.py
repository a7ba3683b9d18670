"""The dashboard behind authentication, in real headless Chromium (issue #13 item 1).

A server with a token: the browser is sent to the login page, signs in with a
``read`` token made by ``fleetscope token create``, gets an HttpOnly cookie (not
readable by page scripts) and sees the fleet page, whose job link quotes a job id
with ``/`` and a space as one path segment.
"""

from __future__ import annotations

import httpx
import pytest

from fleetscope import codec
from tests.browser.conftest import screenshot
from tests.browser.test_dashboard_browser import wait_for
from tests.helpers.data import sample_rows
from tests.helpers.server import running_server
from tests.test_auth import STATIC, bearer, make_token

pytestmark = [pytest.mark.browser]
JOB = "team/a b"


def test_browser_signs_in_and_the_dashboard_uses_its_token(browser, tmp_path):
    with running_server(tmp_path, token=STATIC, ui=True, diagnosis_enabled=False, ui_refresh_s=1) as url:
        body = codec.encode_batch({"jobs": sample_rows("jobs", 1, job=JOB, dp=1, tp=1, pp=1, status="running")})
        r = httpx.post(f"{url.api}/ingest", content=body, timeout=60, headers={
            **bearer(STATIC), "Content-Type": codec.ARROW_CONTENT_TYPE, "Idempotency-Key": "login-job"})
        assert r.status_code == 200, r.text
        token = make_token(f"sqlite:///{tmp_path / 'control.db'}", "read", "--name", "browser")

        browser.delete_all_cookies()
        browser.get(f"{url}/ui/")
        wait_for(browser, lambda: "/ui/login" in browser.current_url, what="the redirect to the login page")
        browser.find_element("id", "token").send_keys("fst_wrong-token")
        browser.find_element("id", "login").click()
        err = wait_for(browser, lambda: browser.find_element("id", "login-error").text, what="the error")
        assert "wrong" in err
        browser.find_element("id", "token").send_keys(token)
        browser.find_element("id", "login").click()
        jobs = wait_for(browser, lambda: JOB in browser.find_element("id", "fleet-jobs").text
                        and browser.find_element("id", "fleet-jobs"), what="the job on the fleet page")
        assert browser.current_url.rstrip("/").endswith("/ui")
        link = jobs.find_element("link text", JOB).get_attribute("href")
        assert link.endswith("/ui/jobs/team%2Fa%20b"), link
        assert "fleetscope_ui" not in browser.execute_script("return document.cookie")  # HttpOnly
        (cookie,) = [c for c in browser.get_cookies() if c["name"] == "fleetscope_ui"]
        assert cookie["httpOnly"] and cookie.get("sameSite") == "Strict"
        screenshot(browser, "login-fleet")
        browser.get(f"{url}/ui/logout")
        wait_for(browser, lambda: "/ui/login" in browser.current_url, what="the login page after logout")
        browser.get(f"{url}/ui/")
        wait_for(browser, lambda: "/ui/login" in browser.current_url, what="signed out")
