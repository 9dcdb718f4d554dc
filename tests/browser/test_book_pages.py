"""Browser test of the built web book: every page of _toc.yml opened in headless Chromium, offline.

For every page: all requests that leave the book's folder are blocked (the
page must work with no network); every plotly figure must have drawn
visible traces; moving each plotly slider (a real mouse click on its rail)
must change the plotted data; no page may log a JavaScript error; no
ipywidgets placeholder may be left unrendered. Each page is screenshotted in
light and dark mode into ``artifacts/screenshots/``; in dark mode every
figure must keep its white paper background (readable lines and labels).

It needs the built book and Chromium, so it runs only when
``LENGTHGEN_BROWSER_TEST=1`` (set by ``.ci/run`` after building the book with
``LENGTHGEN_PROFILE=quick jupyter-book build .``); then a missing build or
browser FAILS the test instead of skipping it. Chromium is Debian's
``chromium`` package (``LENGTHGEN_CHROMIUM`` overrides the path), driven by
Playwright's Python client.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HTML = Path(os.environ.get("LENGTHGEN_BOOK_HTML", ROOT / "_build" / "html"))
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = os.environ.get("LENGTHGEN_CHROMIUM", "/usr/bin/chromium")
ENABLED = os.environ.get("LENGTHGEN_BROWSER_TEST") == "1"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SLIDER_PAGES = ("chapters/01_retrieval_task", "chapters/09_encoding_zoo")  # pages that must have a plotly slider

needs_browser = pytest.mark.skipif(not ENABLED, reason="browser test: build the book, then run with "
                                                    "LENGTHGEN_BROWSER_TEST=1 (.ci/run does both)")


def toc_pages(toc: dict) -> list[str]:
    """Every ``file`` of a Jupyter Book ``_toc.yml`` (root first), in reading order."""
    pages = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                pages.append(node["file"])
            for key in ("parts", "chapters", "sections"):
                for child in node.get(key, []):
                    walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(toc)
    return [p.removesuffix(".md").removesuffix(".ipynb") for p in pages]


PAGES = toc_pages(yaml.safe_load((ROOT / "_toc.yml").read_text()))

# Returns, per plotly figure on the page: visible traces, drawn SVG marks, slider count and paper colour.
FIGURES_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => ({
    visible: (gd._fullData || []).filter(t => t.visible === true).length,
    marks: Array.from(gd.querySelectorAll('g.trace path, g.trace image, g.trace text, g.hm image'))
                .filter(e => e.tagName !== 'path' || (e.getAttribute('d') || '').length > 3).length,
    sliders: ((gd.layout || {}).sliders || []).length,
    paper: (gd._fullLayout || {}).paper_bgcolor,
}))"""

# What a figure shows: the data of its visible traces and its title.
SIGNATURE_JS = """(i) => { const gd = document.querySelectorAll('.js-plotly-plot')[i];
    const arr = v => v === undefined || v === null ? null : Array.from(v, e => (e && e.length !== undefined && typeof e !== 'string') ? Array.from(e) : e);
    return JSON.stringify([(gd._fullLayout.title || {}).text,
        gd._fullData.filter(t => t.visible === true).map(t => [t.type, t.name, arr(t.x), arr(t.y), arr(t.z)])]); }"""


def test_toc_lists_the_chapters():
    assert PAGES[0] == "intro" and "chapters/01_retrieval_task" in PAGES and "running" in PAGES


@pytest.fixture(scope="module")
def browser():
    if not (HTML / "index.html").is_file():
        pytest.fail(f"no built book at {HTML}: run `LENGTHGEN_PROFILE=quick jupyter-book build .` first")
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"Chromium not found at {CHROMIUM}: `apt-get install chromium` or set LENGTHGEN_CHROMIUM")
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def open_page(browser, page_name: str, dark: bool):
    """Open a built page offline; returns (page, errors, blocked requests)."""
    path = HTML / f"{page_name}.html"
    assert path.is_file(), f"{page_name} is in _toc.yml but {path} was not built"
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    if dark:
        context.add_init_script("localStorage.setItem('mode', 'dark'); localStorage.setItem('theme', 'dark');")
    page = context.new_page()
    errors, blocked = [], []
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)

    def route(r):
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length === "
                           "document.querySelectorAll('.plotly-graph-div').length", timeout=20_000)
    page.wait_for_timeout(1500)  # MathJax and plotly's resize
    return page, errors, blocked


def screenshot(page, path: Path) -> None:
    """Full-page screenshot taken at the page's full height, so plotly's responsive resize settles first."""
    page.evaluate("window.scrollTo(0, 0)")
    height = page.evaluate("document.documentElement.scrollHeight")
    page.set_viewport_size({"width": 1300, "height": height})
    page.wait_for_timeout(1000)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size({"width": 1300, "height": 1000})
    page.wait_for_timeout(500)


def move_slider(page, index: int) -> tuple[int, int]:
    """Click the rail of figure ``index``'s first slider at the step farthest from the active one."""
    n_steps, active = page.evaluate("(i) => { const s = document.querySelectorAll('.js-plotly-plot')[i]"
                                    ".layout.sliders[0]; return [s.steps.length, s.active || 0]; }", index)
    target = 0 if active >= n_steps / 2 else n_steps - 1
    rail = page.locator(".js-plotly-plot").nth(index).locator(".slider-rail-touch-rect").first
    rail.scroll_into_view_if_needed()
    box = rail.bounding_box()
    x = box["x"] + (4 if target == 0 else box["width"] - 4)
    page.mouse.click(x, box["y"] + box["height"] / 2)
    page.wait_for_timeout(800)
    return target, page.evaluate("(i) => document.querySelectorAll('.js-plotly-plot')[i].layout.sliders[0].active", index)


@needs_browser
@pytest.mark.parametrize("page_name", PAGES)
def test_page_renders_offline_without_errors(browser, page_name):
    page, errors, blocked = open_page(browser, page_name, dark=False)
    try:
        figures = page.evaluate(FIGURES_JS)
        assert page.evaluate("document.querySelectorAll('.plotly-graph-div').length") == len(figures)
        for i, f in enumerate(figures):
            assert f["visible"] > 0 and f["marks"] > 0, f"{page_name}: figure {i} drew nothing: {f}"
        dead = page.evaluate("document.querySelectorAll('script[type*=\"jupyter.widget\"], .jupyter-widgets').length")
        assert dead == 0, f"{page_name}: {dead} ipywidgets elements with no kernel to drive them"
        if (ROOT / f"{page_name}.ipynb").is_file():  # a notebook chapter offers its .ipynb for download
            href = page.evaluate("(document.querySelector('a.btn-download-source-button') || {}).href || ''")
            assert href.endswith(f"_sources/{page_name}.ipynb"), f"{page_name}: download link is {href!r}"
            assert (HTML / "_sources" / f"{page_name}.ipynb").is_file(), f"{page_name}: the .ipynb was not copied"
        screenshot(page, SCREENSHOTS / f"{page_name.replace('/', '__')}.png")
        n_sliders = 0
        for i, f in enumerate(figures):
            if not f["sliders"]:
                continue
            n_sliders += 1
            before = page.evaluate(SIGNATURE_JS, i)
            target, active = move_slider(page, i)
            assert active == target, f"{page_name}: figure {i}: slider did not move to step {target} (at {active})"
            assert page.evaluate(SIGNATURE_JS, i) != before, f"{page_name}: figure {i}: slider moved, data did not"
        if page_name in SLIDER_PAGES:
            assert n_sliders >= 1, f"{page_name} should have at least one plotly slider"
        assert not errors, f"{page_name}: JavaScript errors: {errors}"
        assert not blocked, f"{page_name}: requests to the network: {blocked}"
    finally:
        page.context.close()


@needs_browser
@pytest.mark.parametrize("page_name", PAGES)
def test_dark_mode_keeps_figures_readable(browser, page_name):
    page, errors, blocked = open_page(browser, page_name, dark=True)
    try:
        assert page.evaluate("document.documentElement.dataset.theme") == "dark"
        for i, f in enumerate(page.evaluate(FIGURES_JS)):
            assert f["paper"] in ("white", "#fff", "#ffffff", "rgb(255, 255, 255)"), \
                f"{page_name}: figure {i} has paper colour {f['paper']!r} in dark mode"
        screenshot(page, SCREENSHOTS / f"{page_name.replace('/', '__')}-dark.png")
        assert not errors, f"{page_name} (dark): JavaScript errors: {errors}"
        assert not blocked, f"{page_name} (dark): requests to the network: {blocked}"
    finally:
        page.context.close()
