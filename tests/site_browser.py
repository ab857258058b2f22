"""Headless Chromium for the published history's tests (and tools/history_site_example.py's screenshots):
Debian's chromium and chromium-driver, driven by selenium, with nothing fetched from outside (no
selenium-manager: the system driver is named; no first-run, sync, component update or background
networking; a fresh profile per browser).

`browser()` yields a driver or raises Unavailable (why, in one line): the tests skip on it, or fail
when QGATE_REQUIRE_BROWSER=1 (.ci/run sets it: CI installs the browser, so its absence is a failure).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


class Unavailable(Exception):
    """No browser here: the line says what is missing and how to install it."""


@contextmanager
def browser(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A headless Chromium with its console and network logged (console_errors, requests)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise Unavailable("selenium is not installed: pip install -e '.[test]'") from None
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.exists():
            raise Unavailable(f"no {path}: apt-get install -y chromium chromium-driver")
    profile = tempfile.mkdtemp(prefix="qgate-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    try:
        driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    except Exception as exc:  # a driver that does not start is "no browser here", said in one line
        shutil.rmtree(profile, ignore_errors=True)
        raise Unavailable(
            f"chromium did not start: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        ) from None
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def console_errors(driver: Any) -> list[str]:
    """The console's messages of level SEVERE (errors) since the last call."""
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def requests(driver: Any) -> list[tuple[str, str]]:
    """(document, URL) of every request the browser made since the last call (the DevTools log's
    requestWillBeSent): Chromium's own pages (chrome://) are in it too."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            params = message["params"]
            urls.append((str(params.get("documentURL")), str(params["request"]["url"])))
    return urls


def load_ms(driver: Any) -> float:
    """The page's load time as the browser measured it (navigation start to the end of load)."""
    return float(
        driver.execute_script(
            "const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd;"
        )
    )


def screenshot(driver: Any, path: Path, max_height: int = 6000) -> Path:
    """The whole page (the window grown to the page's height, up to max_height px) as a PNG."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    width = int(driver.execute_script("return document.documentElement.scrollWidth"))
    driver.set_window_size(max(width, 1200), min(max(height, 600), max_height))
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    return path
