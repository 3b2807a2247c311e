"""The documentation: the site builds strictly, every Python block of its pages and of the README runs,
and a real browser opens the built site and searches it."""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
SNIPPET = re.compile(r'^--8<-- "([^":]+):(\w+)"$', re.MULTILINE)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text(encoding="utf-8"))


RUNNABLE = [page for page in PAGES if any(not SNIPPET.search(block) for block in blocks(page))]


@functools.cache
def built_site(folder: str) -> Path:
    process = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", folder],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert process.returncode == 0, process.stderr[-3000:]
    return Path(folder)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return built_site(str(tmp_path_factory.mktemp("site")))


@pytest.mark.slow
def test_the_site_builds_strictly_with_the_api_from_the_docstrings(site):
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert 'id="ray_dptune.tune.tuner.private_tuner"' in api and "A <code>tune.Tuner</code> whose whole search" in api
    assert (site / "guides" / "own-loop" / "index.html").is_file() and (site / "search" / "search_index.json").is_file()


def test_included_code_comes_from_tested_examples_whole():
    included = [(page, *found) for page in PAGES for found in SNIPPET.findall(page.read_text(encoding="utf-8"))]
    assert included  # the own-loop guide shows the example's loop
    for page, path, section in included:
        text = (ROOT / path).read_text(encoding="utf-8")
        start, end = f"# --8<-- [start:{section}]", f"# --8<-- [end:{section}]"
        assert start in text and end in text, f"{page.name} includes {path}:{section}, which is not marked"
        assert text.index(end) - text.index(start) > 200


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_python_block_runs(page, ray_session, tmp_path):
    """A page's blocks run in order as one program, in a fresh process on the shared Ray, with a home of its own."""
    import ray

    program = "\n".join(block for block in blocks(page) if not SNIPPET.search(block))
    environment = {
        **os.environ,
        "HOME": str(tmp_path),  # Tune's default storage, ~/ray_results, is the test's
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
        "PYTHONPATH": str(ROOT),
    }
    token = Path.home() / ".ray" / "auth_token"
    if token.is_file():  # a cluster with token authentication: its token, from the real home
        environment.setdefault("RAY_AUTH_TOKEN_PATH", str(token))
    process = subprocess.run(
        [sys.executable, "-c", program],
        check=False,
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert process.returncode == 0, process.stderr[-3000:]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (Debian's chromium package; .ci/run installs it)")
def test_a_browser_opens_the_site_and_finds_private_tuner(site):
    playwright = pytest.importorskip("playwright.sync_api")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    home = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        with playwright.sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(home)
            assert page.title() == "ray_dptune"
            page.goto(home + "guides/own-loop/")
            assert page.locator("h1").first.inner_text().startswith("Your own Opacus training loop")
            page.goto(home + "reference/api/")
            assert page.locator("[id='ray_dptune.tune.tuner.private_tuner']").count() == 1
            page.click("input.md-search__input")
            page.keyboard.type("private_tuner")
            page.wait_for_selector(".md-search-result__item", timeout=20000)
            assert page.locator(".md-search-result__item").count() >= 3
            browser.close()
    finally:
        server.shutdown()
