"""The documentation site: ``mkdocs.yml`` renders ``docs/`` with an API reference generated
from the docstrings, built here with warnings as errors (a broken link or anchor, a page
left out of the navigation, a docstring the generator cannot read all fail the build), and
opened in a real headless browser (Debian's ``chromium``, driven by its ``chromedriver``;
nothing is downloaded) that checks the home page, a recipe and an API page render with
their navigation.

``python tests/package/test_site.py`` builds the site and saves the home page's screenshot
as ``docs/figures/site-home.png`` (what the README shows).
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from support import loops

import aioratelimit as arl

#: The site is the main lane's to build (it does not change with the loop or the Python).
pytestmark = pytest.mark.skipif(not loops.MAIN_LANE, reason="the site is the main lane's")

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def build(where: Path) -> str:
    """Build the site into ``where`` (strict: any warning fails it); its log."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "-d", str(where)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    return log


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("site")
    log = build(where)
    assert "WARNING" not in log, log
    return where


@contextmanager
def served(site: Path) -> Iterator[str]:
    """The built site over HTTP on a free loopback port, as a user's browser gets it."""
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def browser() -> Iterator[webdriver.Chrome]:
    """A headless Chromium (the system's: never one downloaded at run time)."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.fail("chromium and chromium-driver are not installed (scripts/test installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,900")
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()


def test_the_site_builds_strictly_with_every_public_name_in_the_reference(site: Path) -> None:
    """Every class and function the package exports has its entry in the API reference,
    under its public path (``aioratelimit.FixedWindow``, not a private module's)."""
    page = (site / "api" / "index.html").read_text(encoding="utf-8")
    documented = [name for name in arl.__all__ if callable(getattr(arl, name))]
    missing = [name for name in documented if f'id="aioratelimit.{name}"' not in page]
    assert missing == [], f"not in the API reference: {missing}"
    assert "_limits" not in page.split('id="aioratelimit.')[1][:80]  # a public path


def test_a_real_browser_renders_home_recipe_and_api_pages(site: Path) -> None:
    with served(site) as url, browser() as driver:
        pages = {
            "": "aioratelimit",
            "outbound/": "Throttling outbound calls",
            "api/": "aioratelimit",
        }
        for path, heading in pages.items():
            driver.get(f"{url}/{path}")
            h1 = driver.find_element(By.CSS_SELECTOR, "article h1")
            assert h1.text.strip() == heading, (path, h1.text)
            nav = driver.find_elements(By.CSS_SELECTOR, "nav.md-nav--primary a")
            titles = {(a.get_attribute("textContent") or "").strip() for a in nav}
            assert {"Rate limits", "Throttling outbound calls", "aioratelimit.asgi"} <= titles
        # The API page: a class rendered with its signature and its methods' docstrings.
        entry = driver.find_element(By.ID, "aioratelimit.FixedWindow")
        assert "FixedWindow" in (entry.get_attribute("textContent") or "")
        body = driver.find_element(By.TAG_NAME, "article").text
        assert "if every rate admits them" in body  # Limiter.hit's docstring
        # A recipe: its runnable example is there, highlighted.
        driver.get(f"{url}/outbound/")
        code = driver.find_elements(By.CSS_SELECTOR, "article .highlight code")
        assert any("class PartnerLimits" in c.text for c in code)


def screenshot(to: Path) -> None:
    """Build the site and save its home page's screenshot at ``to``."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="arl-site-") as where:
        build(Path(where))
        with served(Path(where)) as url, browser() as driver:
            driver.get(f"{url}/")
            driver.save_screenshot(str(to))


if __name__ == "__main__":
    screenshot(ROOT / "docs" / "figures" / "site-home.png")
