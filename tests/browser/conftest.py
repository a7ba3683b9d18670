"""Real headless Chromium (Debian's chromium + chromium-driver) and a real server.

Skips cleanly when chromium or chromedriver is missing (``make browser-deps`` installs
them). Screenshots go to ``test-artifacts/screenshots/``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
WINDOW = (1440, 900)

CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


def chromium_paths() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def new_driver(width: int = WINDOW[0], height: int = WINDOW[1]):
    """A fresh headless Chromium with its own profile directory."""
    paths = chromium_paths()
    if paths is None:
        pytest.skip("chromium/chromedriver not installed (run `make browser-deps`)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = paths
    profile = tempfile.mkdtemp(prefix="fleetscope-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for a in CHROMIUM_ARGS:
        opts.add_argument(a)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.add_argument(f"--window-size={width},{height}")
    d = webdriver.Chrome(service=Service(driver), options=opts)
    d.set_page_load_timeout(60)
    d._fleetscope_profile = profile  # type: ignore[attr-defined]
    return d


def _quit(d) -> None:
    try:
        d.quit()
    finally:
        shutil.rmtree(getattr(d, "_fleetscope_profile", ""), ignore_errors=True)


def _alive(d) -> bool:
    try:
        d.current_url  # noqa: B018 (a round trip to the browser)
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def _chromium() -> Iterator[list]:
    """One Chromium for the whole session (a start and quit cost about 2 s each); the
    list holds the live driver so a module can replace one that died."""
    holder: list = []
    try:
        yield holder
    finally:
        for d in holder:
            _quit(d)


@pytest.fixture(scope="module")
def browser(_chromium: list) -> Iterator:
    """The session's Chromium, reset for this module as if new: no cookies (they ignore
    the port, so one module's sign-in would reach the next module's server), no cache,
    the default window, a blank page. Storage is per origin and every module's server
    has its own port, so no origin is shared."""
    if _chromium and not _alive(_chromium[0]):
        _quit(_chromium.pop())
    if not _chromium:
        _chromium.append(new_driver())
    d = _chromium[0]
    d.execute_cdp_cmd("Network.clearBrowserCookies", {})
    d.execute_cdp_cmd("Network.clearBrowserCache", {})
    d.set_window_size(*WINDOW)
    d.get("about:blank")
    yield d


def screenshot(driver, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def full_page_screenshot(driver, name: str) -> Path:
    """Screenshot of the whole page height (the window is resized, then restored)."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(WINDOW[0], min(max(height + 40, WINDOW[1]), 4000))
    try:
        return screenshot(driver, name)
    finally:
        driver.set_window_size(*WINDOW)
