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


@pytest.fixture(scope="module")
def browser() -> Iterator:
    d = new_driver()
    try:
        yield d
    finally:
        d.quit()
        shutil.rmtree(getattr(d, "_fleetscope_profile", ""), ignore_errors=True)


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
