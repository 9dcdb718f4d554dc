"""Browser test of the built web book: every page of _toc.yml opened in headless Chromium, offline.

For every page: all requests that leave the book's folder are blocked (the
page must work with no network); every plotly figure must have drawn
visible traces; moving each plotly slider (a real mouse click on its rail)
must change the plotted data; no page may log a JavaScript error; no
ipywidgets placeholder may be left unrendered. Each page is screenshotted in
light and dark mode into ``artifacts/screenshots/``; in dark mode every
figure must keep its white paper background (readable lines and labels).
At a desktop (1280 px) and a phone (400 px) window, no page may be wider than the
window (``document.documentElement.scrollWidth``), no text of a figure may be
clipped or overlap other text, and no annotation's text may cover a drawn data
mark (a trace's line, marker or bar): labels of reference lines belong in the
legend. These layout checks (and, at 1280 px, the notation of axis titles and
the width of code cells) run on one load of each page per window width: a page
load with its figures and MathJax is most of the test's time.

The live panels (lengthgen_utils.book.live) are tested on their pages: each slider, moved with the keyboard,
must make the page retrain in its Web Worker and redraw a different, finite figure, both when the page
is opened from ``file://`` and over http; a setting with no task must be explained, not drawn; panels
must fit the column at 1280 px and 400 px; no request may leave the page. The measured retrain times are
printed at the end (run pytest with ``-s`` to see them).

It needs the built book and Chromium, so it runs only when
``LENGTHGEN_BROWSER_TEST=1`` (set by ``.ci/run`` after building the book with
``jupyter-book build .``); then a missing build or
browser FAILS the test instead of skipping it. Chromium is Debian's
``chromium`` package (``LENGTHGEN_CHROMIUM`` overrides the path), driven by
Playwright's Python client.
"""
from __future__ import annotations

import os
import re
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


# Every text element a figure draws (titles, axis titles, tick labels, legend, annotations, slider and colour-bar
# labels), with its box and what kind of label it is; data labels inside traces and hover labels are left out.
TEXT_BOXES_JS = """(i) => { const gd = document.querySelectorAll('.js-plotly-plot')[i];
    const fig = gd.getBoundingClientRect();
    const kind = (el) => { for (let n = el; n && n !== gd; n = n.parentNode) {
        const c = (n.getAttribute && n.getAttribute('class')) || '';
        for (const x of c.split(' ')) {
            const k = x.replace(/^([xy])\\d+/, '$1');  // x2tick -> xtick, y3title -> ytitle
            for (const name of ['gtitle', 'xtitle', 'ytitle', 'legendtext', 'annotation', 'slider', 'cbtitle',
                                'colorbar', 'xtick', 'ytick', 'updatemenu', 'trace', 'hoverlayer'])
                if (k.startsWith(name)) return name; } }
        return 'other'; };
    const out = [];
    for (const t of gd.querySelectorAll('svg text')) {
        const k = kind(t);
        if (k === 'trace' || k === 'hoverlayer' || !t.textContent.trim()) continue;
        const st = getComputedStyle(t);
        if (st.display === 'none' || st.visibility === 'hidden' || parseFloat(st.opacity || '1') === 0) continue;
        if (/rgba\\(.*,\\s*0\\)$/.test(st.fill) || st.fill === 'none' || parseFloat(st.fillOpacity || '1') === 0)
            continue;  // drawn transparent: not shown
        const r = t.getBoundingClientRect();
        if (r.width === 0 || r.height === 0) continue;
        out.push({kind: k, text: t.textContent.trim().slice(0, 40), x0: r.left - fig.left, y0: r.top - fig.top,
                  x1: r.right - fig.left, y1: r.bottom - fig.top});
    }
    return {width: fig.width, height: fig.height, texts: out}; }"""


# Per annotation of figure i whose text box covers a drawn data mark: the annotation and the mark. Lines are sampled
# along their path every 1.5 px (only inside their subplot's clip area: what is drawn); markers, bars and boxes count
# by their box. Both boxes are shrunk by 1.5 px, so a line that only grazes a label's edge does not count.
ANNOTATION_DATA_JS = """(i) => { const gd = document.querySelectorAll('.js-plotly-plot')[i];
    const tol = 1.5, shown = (e) => { for (let n = e; n && n !== gd; n = n.parentNode) {
        if (!n.getAttribute) continue; const st = getComputedStyle(n);
        if (st.display === 'none' || st.visibility === 'hidden' || parseFloat(st.opacity || '1') === 0) return false; }
        return true; };
    const boxes = [];
    for (const g of gd.querySelectorAll('g.annotation')) {
        const t = g.querySelector('text');
        if (!t || !t.textContent.trim() || !shown(t)) continue;
        const r = t.getBoundingClientRect();
        if (r.width && r.height) boxes.push({text: t.textContent.trim().slice(0, 40), x0: r.left + tol, y0: r.top + tol,
                                             x1: r.right - tol, y1: r.bottom - tol});
    }
    if (!boxes.length) return [];
    const clipOf = (e) => { for (let n = e; n && n !== gd; n = n.parentNode) {  // the clip rect, in page pixels
        const c = n.getAttribute && n.getAttribute('clip-path'); const m = c && c.match(/url\\(['"]?#([^'")]+)/);
        const rect = m && document.getElementById(m[1]) && document.getElementById(m[1]).querySelector('rect');
        if (rect) { const k = n.getScreenCTM(), at = (a) => parseFloat(rect.getAttribute(a) || '0');
            const x0 = at('x'), y0 = at('y'), x1 = x0 + at('width'), y1 = y0 + at('height');
            return {left: k.a * x0 + k.c * y0 + k.e, top: k.b * x0 + k.d * y0 + k.f,
                    right: k.a * x1 + k.c * y1 + k.e, bottom: k.b * x1 + k.d * y1 + k.f}; } }
        return null; };
    const name = (e) => { const t = e.closest('g.trace'); const d = t && t.__data__; const tr = d && d[0] && d[0].trace;
        return (tr && tr.name) || (t && t.getAttribute('class')) || 'a trace'; };
    const out = [], seen = new Set();
    const hit = (b, e) => { const key = b.text + '|' + name(e); if (!seen.has(key)) { seen.add(key);
        out.push(`annotation ${JSON.stringify(b.text)} covers data of ${JSON.stringify(String(name(e)).slice(0, 40))}`); } };
    for (const p of gd.querySelectorAll('g.trace path.js-line')) {
        const st = getComputedStyle(p);
        if (!shown(p) || st.stroke === 'none' || parseFloat(st.strokeWidth || '0') === 0
            || parseFloat(st.strokeOpacity || '1') === 0 || (p.getAttribute('d') || '').length < 4) continue;
        const r = p.getBoundingClientRect(), clip = clipOf(p);
        const near = boxes.filter(b => r.right + 3 >= b.x0 && r.left - 3 <= b.x1 && r.bottom + 3 >= b.y0 && r.top - 3 <= b.y1);
        if (!near.length) continue;
        const m = p.getScreenCTM(), n = p.getTotalLength();
        for (let s = 0; s <= n && near.length; s += 1.5) {
            const q = p.getPointAtLength(s), x = m.a * q.x + m.c * q.y + m.e, y = m.b * q.x + m.d * q.y + m.f;
            if (clip && (x < clip.left || x > clip.right || y < clip.top || y > clip.bottom)) continue;
            for (let j = near.length - 1; j >= 0; j--) {
                const b = near[j]; if (x > b.x0 && x < b.x1 && y > b.y0 && y < b.y1) { hit(b, p); near.splice(j, 1); } }
        }
    }
    for (const p of gd.querySelectorAll('g.trace path.point, g.trace.bars g.point path, g.trace.boxes path.box')) {
        if (!shown(p)) continue;
        const r = p.getBoundingClientRect();
        if (!r.width && !r.height) continue;
        for (const b of boxes) if (r.right > b.x0 && r.left < b.x1 && r.bottom > b.y0 && r.top < b.y1) hit(b, p);
    }
    return out; }"""

# The page's width against the window's, and the elements that stick out past the window's right edge.
PAGE_WIDTH_JS = """() => { const w = window.innerWidth, wide = [];
    for (const e of document.querySelectorAll('body *')) {
        const r = e.getBoundingClientRect();
        if (r.right > w + 1 && r.width > 0 && wide.length < 8) {
            let scrolls = false;  // inside a box that scrolls sideways: it does not widen the page
            for (let n = e.parentElement; n && n !== document.body; n = n.parentElement) {
                const o = getComputedStyle(n).overflowX; if (o === 'auto' || o === 'scroll' || o === 'hidden') { scrolls = true; break; } }
            const cls = typeof e.className === 'string' ? e.className.split(' ').slice(0, 2).join('.') : '';
            if (!scrolls) wide.push(`${e.tagName.toLowerCase()}.${cls} right ${Math.round(r.right)} px: `
                                    + (e.textContent || '').trim().slice(0, 50)); } }
    return {scroll: document.documentElement.scrollWidth, window: w, wide: wide}; }"""


def layout_problems(boxes: dict, tolerance: float = 1.5) -> list[str]:
    """Texts clipped by the figure's box, and pairs of texts that overlap (by more than ``tolerance`` px each way)."""
    problems, texts = [], boxes["texts"]
    for t in texts:
        if t["x0"] < -tolerance or t["y0"] < -tolerance or t["x1"] > boxes["width"] + tolerance \
                or t["y1"] > boxes["height"] + tolerance:
            problems.append(f"clipped {t['kind']} {t['text']!r}")
    for a_i, a in enumerate(texts):
        for b in texts[a_i + 1:]:
            dx = min(a["x1"], b["x1"]) - max(a["x0"], b["x0"])
            dy = min(a["y1"], b["y1"]) - max(a["y0"], b["y0"])
            if dx > tolerance and dy > tolerance:
                problems.append(f"{a['kind']} {a['text']!r} overlaps {b['kind']} {b['text']!r}")
    return problems


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


def open_page(browser, page_name: str, dark: bool, width: int = 1300):
    """Open a built page offline at a window ``width`` (px); returns (page, errors, blocked requests)."""
    path = HTML / f"{page_name}.html"
    assert path.is_file(), f"{page_name} is in _toc.yml but {path} was not built"
    context = browser.new_context(viewport={"width": width, "height": 1000})
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


def move_slider(page, index: int, slider: int = 0) -> tuple[int, int]:
    """Click the rail of figure ``index``'s slider ``slider`` at the step farthest from the active one."""
    n_steps, active = page.evaluate("([i, s]) => { const sl = document.querySelectorAll('.js-plotly-plot')[i]"
                                    ".layout.sliders[s]; return [sl.steps.length, sl.active || 0]; }", [index, slider])
    target = 0 if active >= n_steps / 2 else n_steps - 1
    rail = page.locator(".js-plotly-plot").nth(index).locator(".slider-rail-touch-rect").nth(slider)
    rail.scroll_into_view_if_needed()
    box = rail.bounding_box()
    x = box["x"] + (4 if target == 0 else box["width"] - 4)
    page.mouse.click(x, box["y"] + box["height"] / 2)
    page.wait_for_timeout(800)
    return target, page.evaluate("([i, s]) => document.querySelectorAll('.js-plotly-plot')[i].layout.sliders[s].active",
                                 [index, slider])


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
            for s in range(f["sliders"]):  # every slider of the figure changes what it shows
                n_sliders += 1
                before = page.evaluate(SIGNATURE_JS, i)
                target, active = move_slider(page, i, s)
                assert active == target, f"{page_name}: figure {i}: slider {s} did not move to step {target} ({active})"
                assert page.evaluate(SIGNATURE_JS, i) != before, f"{page_name}: figure {i}: slider {s} moved, data did not"
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


# Per figure: its axis titles (every axis of the layout and of every slider step's relayout) and its sliders' step
# labels and "slider value" annotations (a slider of many steps names its current step in one).
NOTATION_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => {
    const titles = [], text = (t) => (t && typeof t === 'object') ? t.text : t;
    const axes = (lay, prefix) => { for (const [key, value] of Object.entries(lay || {})) {
        const path = prefix + key;
        if (/^[xy]axis\\d*\\.title(\\.text)?$/.test(path) && typeof text(value) === 'string') titles.push(text(value));
        else if (value && typeof value === 'object' && !Array.isArray(value) && path.split('.').length < 3)
            axes(value, path + '.'); } };
    for (const [key, axis] of Object.entries(gd._fullLayout || {}))
        if (/^[xy]axis\\d*$/.test(key) && axis && axis.title && axis.title.text) titles.push(axis.title.text);
    const sliders = ((gd.layout || {}).sliders || []).map(sl => ({
        labels: (sl.steps || []).map(st => String(st.label)),
        values: (sl.steps || []).flatMap(st => ((st.args && st.args[1] && st.args[1].annotations) || [])
            .filter(a => a && a.name === 'slider value').map(a => a.text)),
    }));
    for (const sl of ((gd.layout || {}).sliders || [])) for (const st of (sl.steps || [])) axes(st.args && st.args[1], '');
    return {titles, sliders}; })"""

# Every code cell's box on the page (hidden inputs opened first): how wide its code is and how wide its box.
CODE_WIDTH_JS = """() => { document.querySelectorAll('details').forEach(d => { d.open = true; });
    document.querySelectorAll('.toggle-hidden, .hide-input .cell_input').forEach(e => e.classList.remove('toggle-hidden'));
    return Array.from(document.querySelectorAll('div.cell_input pre')).filter(p => p.offsetParent !== null)
        .map(p => ({scroll: p.scrollWidth, client: p.clientWidth,
                    first: (p.textContent.split('\\n').reduce((a, b) => b.length > a.length ? b : a, '')).slice(0, 60)})); }"""

RETIRED_AXIS = re.compile(r"j\s*[−-]\s*i\b|key position n\b")  # notation.md: D = j − m, j the key, m the query
INDEX_LABEL = re.compile(r"\b\d+\s+of\s+\d+\b")  # "7 of 31": a step's index, not its value


def notation_problems(figures: list, labels_max: int) -> list[str]:
    """What a page's figures break of notation.md and of value-labelled sliders (see NOTATION_JS)."""
    problems = []
    for i, f in enumerate(figures):
        problems += [f"figure {i}: axis title {t!r} uses a retired symbol" for t in f["titles"] if RETIRED_AXIS.search(t)]
        for s, sl in enumerate(f["sliders"]):
            labels = sl["labels"]
            problems += [f"figure {i}: slider {s} step {t!r} is an index" for t in labels + sl["values"]
                         if INDEX_LABEL.search(t)]
            if len(labels) > labels_max and labels == [str(n) for n in range(1, len(labels) + 1)]:
                problems.append(f"figure {i}: slider {s} is labelled 1..{len(labels)}, not by its values")
    return problems


def test_notation_problems_finds_retired_symbols_and_index_labels():
    good = [{"titles": ["relative position D = j − m (tokens)", "key position j (tokens)"],
             "sliders": [{"labels": [str(L) for L in range(16, 264, 8)], "values": ["test length L = 16 tokens"]}]}]
    assert notation_problems(good, 6) == []
    bad = [{"titles": ["D = j − i (tokens)", "key position n (tokens)", "D = j - i"],
            "sliders": [{"labels": [str(n) for n in range(1, 13)], "values": ["encoding: 7 of 12, ALiBi"]}]}]
    found = notation_problems(bad, 6)
    assert len(found) == 5, found


def wide_page(page) -> list[str]:
    """The page scrolls sideways: nothing (a line of inline code, a figure, a table outside its scrolling box)
    may be wider than the window."""
    dims = page.evaluate(PAGE_WIDTH_JS)
    if dims["scroll"] <= dims["window"]:
        return []
    return [f"the page is {dims['scroll']} px wide (window {dims['window']} px); sticking out: " + "; ".join(dims["wide"])]


def figure_text_problems(page, page_name: str, width: int) -> list[str]:
    """No text element of any figure (title, axis titles, tick labels, legend, annotations, slider and colour-bar
    labels) is cut by the figure's box or overlaps another, no annotation's text covers a drawn line, marker or
    bar of the data, and the toolbar, shown on hover, covers no title or legend text. Each figure is
    screenshotted at this width into ``artifacts/screenshots/<width>px/``."""
    problems = []
    (SCREENSHOTS / f"{width}px").mkdir(parents=True, exist_ok=True)
    for i in range(page.evaluate("document.querySelectorAll('.js-plotly-plot').length")):
        gd = page.locator(".js-plotly-plot").nth(i)
        gd.scroll_into_view_if_needed()
        boxes = page.evaluate(TEXT_BOXES_JS, i)
        problems += [f"figure {i}: {p}" for p in layout_problems(boxes)]
        problems += [f"figure {i}: {p}" for p in page.evaluate(ANNOTATION_DATA_JS, i)]
        # each figure as a reader sees it at this width, to look at (artifacts/screenshots/<width>px/)
        gd.screenshot(path=str(SCREENSHOTS / f"{width}px" / f"{page_name.replace('/', '__')}-fig{i:02d}.png"))
        gd.hover(position={"x": boxes["width"] - 3, "y": boxes["height"] - 3})  # outside the plot area
        page.wait_for_timeout(150)
        bar = page.evaluate("(i) => { const gd = document.querySelectorAll('.js-plotly-plot')[i];"
                            " const m = gd.querySelector('.modebar'); if (!m || getComputedStyle(m).opacity === '0')"
                            " return null; const r = m.getBoundingClientRect(), f = gd.getBoundingClientRect();"
                            " return {x0: r.left - f.left, y0: r.top - f.top, x1: r.right - f.left,"
                            " y1: r.bottom - f.top}; }", i)
        if bar is not None:
            covered = [t for t in boxes["texts"] if t["kind"] in ("gtitle", "legendtext", "annotation")
                       and min(t["x1"], bar["x1"]) - max(t["x0"], bar["x0"]) > 1
                       and min(t["y1"], bar["y1"]) - max(t["y0"], bar["y0"]) > 1]
            problems += [f"figure {i}: the toolbar covers {t['kind']} {t['text']!r}" for t in covered]
    return problems


def wide_code_cells(page) -> list[str]:
    """The notebooks' code is formatted to 88 columns: every code cell (hidden ones opened, which changes the
    page, so this runs last) shows its longest line without a horizontal scroll bar."""
    cells = page.evaluate(CODE_WIDTH_JS)
    return [f"of {len(cells)} code cells, one scrolls sideways: {c['scroll']} > {c['client']} px ({c['first']!r})"
            for c in cells if c["scroll"] > c["client"] + 1]


@needs_browser
@pytest.mark.parametrize("width", [1280, 400])
@pytest.mark.parametrize("page_name", PAGES)
def test_page_layout_at_desktop_and_phone_width(browser, page_name, width):
    """The page, loaded once at a desktop (1280 px) and once at a phone (400 px) window, is no wider than the
    window and no figure's text is clipped or overlapping (:func:`wide_page`, :func:`figure_text_problems`);
    at 1280 px, too, the figures keep the notation (no axis title says "j − i" or "key position n"; notation.md:
    the key is j, the query m, D = j − m, in any slider step either), slider steps are labelled by their values
    (numbers or names), never "7 of 31" or 1..N, and no code cell scrolls sideways (:func:`wide_code_cells`)."""
    from lengthgen_utils.book.render import SLIDER_LABELS_MAX

    page, errors, blocked = open_page(browser, page_name, dark=False, width=width)
    try:
        problems = [f"width: {p}" for p in wide_page(page)]
        problems += [f"figure text: {p}" for p in figure_text_problems(page, page_name, width)]
        if width == 1280:
            problems += [f"notation: {p}" for p in notation_problems(page.evaluate(NOTATION_JS), SLIDER_LABELS_MAX)]
            problems += [f"code: {p}" for p in wide_code_cells(page)]
        problems += [f"JavaScript: {e}" for e in errors] + [f"request to the network: {u}" for u in blocked]
        assert not problems, f"{page_name} at {width} px:\n  " + "\n  ".join(problems[:40])
    finally:
        page.context.close()


# ---------------------------------------------------------------------------------- live panels
# Pages with live panels (lengthgen_utils.book.live): sliders that retrain the model in the page's Web Worker.
LIVE_PAGES = ("chapters/01_retrieval_task", "chapters/04_carrier_kernel")
LIVE_TIMES: list[str] = []  # measured retrain times, printed at the end of the module


@pytest.fixture(scope="module")
def http_book():
    """The built book served over http from 127.0.0.1 (a thread of this process): the page's origin."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(HTML)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    if LIVE_TIMES:  # printed (with -s), and kept beside the screenshots: an xdist worker prints nothing
        text = "live panel retrain times (headless Chromium):\n  " + "\n  ".join(LIVE_TIMES)
        print("\n" + text)
        with open(SCREENSHOTS.parent / "live-retrain-times.txt", "a") as f:
            f.write("\n".join(LIVE_TIMES) + "\n")


def open_live_page(browser, page_name: str, origin: str | None, width: int = 1300):
    """Open a built page from ``file://`` (origin None) or over http; returns (page, errors, blocked requests).

    Every request that leaves the page's origin is refused and recorded (a ``blob:`` URL, the training worker's
    script made from the page's own text, stays in the page)."""
    context = browser.new_context(viewport={"width": width, "height": 1000})
    page = context.new_page()
    errors, blocked = [], []
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("worker", lambda w: w.on("console", lambda m: errors.append(f"worker {m.type}: {m.text}")
                                     if m.type == "error" else None))
    own = "file://" if origin is None else origin + "/"

    def route(r):
        url = r.request.url
        if url.startswith(own) or url.startswith("blob:"):
            r.continue_()
        else:
            blocked.append(url)
            r.abort()

    page.route("**/*", route)
    url = (HTML / f"{page_name}.html").as_uri() if origin is None else f"{origin}/{page_name}.html"
    page.goto(url, wait_until="load")
    page.wait_for_function("() => document.querySelectorAll('.lg-live.lg-live-ready').length === "
                           "document.querySelectorAll('.lg-live').length", timeout=20_000)
    page.wait_for_timeout(1000)
    return page, errors, blocked


def figure_index(page, panel: int) -> int:
    """Index, among the page's plotly figures, of live panel ``panel``'s figure (for SIGNATURE_JS)."""
    return page.evaluate("(p) => Array.from(document.querySelectorAll('.js-plotly-plot')).indexOf("
                         "document.querySelectorAll('.lg-live')[p].querySelector('.js-plotly-plot'))", panel)


def press_slider(page, panel: int, name: str, key: str, timeout_ms: int = 120_000) -> dict:
    """Press ``key`` on slider ``name`` of live panel ``panel`` (as a reader's keyboard does) and wait until the
    panel has settled: retrained, shown a setting already trained, or explained a setting with no task."""
    state = page.evaluate("(p) => { const r = document.querySelectorAll('.lg-live')[p];"
                          " return [Number(r.dataset.retrains || 0), r.querySelector('.lg-live-status').textContent]; }",
                          panel)
    slider = page.locator(".lg-live").nth(panel).locator(f"input[data-name='{name}']")
    slider.scroll_into_view_if_needed()
    slider.focus()
    start = page.evaluate("performance.now()")
    slider.press(key)
    page.wait_for_function("([p, n, text]) => { const r = document.querySelectorAll('.lg-live')[p];"
                           " const s = r.querySelector('.lg-live-status').textContent;"
                           " return r.dataset.state !== 'training' && (Number(r.dataset.retrains || 0) > n"
                           " || (s !== text && r.dataset.state !== undefined)); }",
                           arg=[panel, *state], timeout=timeout_ms, polling=100)
    page.wait_for_function("(p) => document.querySelectorAll('.lg-live')[p].dataset.state !== 'training'", arg=panel)
    out = page.evaluate("(p) => { const r = document.querySelectorAll('.lg-live')[p];"
                        " return {state: r.dataset.state, retrains: Number(r.dataset.retrains || 0),"
                        " ms: Number(r.dataset.lastRetrainMs || 0),"
                        " status: r.querySelector('.lg-live-status').textContent}; }", panel)
    out["elapsed_ms"] = page.evaluate("performance.now()") - start
    out["retrained"] = out["retrains"] > state[0]
    return out


def settle(page, panel: int, text: str, timeout_ms: int = 120_000) -> None:
    """Wait until live panel ``panel`` has acted on sliders set by script (their update is debounced): its
    status names ``text`` and it is not training."""
    page.wait_for_function("([p, text]) => { const r = document.querySelectorAll('.lg-live')[p];"
                           " return r.dataset.state !== 'training'"
                           " && r.querySelector('.lg-live-status').textContent.includes(text); }",
                           arg=[panel, text], timeout=timeout_ms, polling=100)


def figure_is_finite(page, index: int) -> bool:
    return page.evaluate("(i) => document.querySelectorAll('.js-plotly-plot')[i]._fullData.every((t) =>"
                         " Array.from(t.y || []).every((v) => v === null || Number.isFinite(Number(v))))", index)


SLIDER_MOVES = {  # per live page and panel: (slider, key) in the order pressed
    "chapters/01_retrieval_task": [[("offset", "ArrowRight"), ("train_len", "ArrowRight"), ("n_seeds", "ArrowRight")]],
    "chapters/04_carrier_kernel": [[("base", "ArrowLeft"), ("d_head", "ArrowLeft")]],
}


@needs_browser
@pytest.mark.parametrize("scheme", ["file", "http"])
@pytest.mark.parametrize("page_name", LIVE_PAGES)
def test_live_panels_retrain_in_the_page(browser, http_book, page_name, scheme):
    """Each live slider, moved, makes the page train in its Web Worker (from file:// and over http), say so
    while it trains, and redraw a different, finite figure; no request leaves the page, no error is logged.
    From file:// every slider is moved; over http the first of each panel."""
    page, errors, blocked = open_live_page(browser, page_name, None if scheme == "file" else http_book)
    try:
        panels = page.evaluate("document.querySelectorAll('.lg-live').length")
        assert panels == len(SLIDER_MOVES[page_name]), f"{page_name}: {panels} live panels"
        for p, moves in enumerate(SLIDER_MOVES[page_name]):
            index = figure_index(page, p)
            initial = page.evaluate(SIGNATURE_JS, index)
            for name, key in moves if scheme == "file" else moves[:1]:
                before = page.evaluate(SIGNATURE_JS, index)
                out = press_slider(page, p, name, key)
                assert out["state"] == "done" and out["retrained"], f"{page_name} panel {p}, {name}: {out}"
                assert page.evaluate(SIGNATURE_JS, index) != before, f"{page_name} panel {p}: {name} moved, figure did not"
                assert figure_is_finite(page, index)
                LIVE_TIMES.append(f"{page_name} ({scheme}), {name}: {out['ms'] / 1000:.2f} s — {out['status']}")
            if scheme == "file":  # back at the precomputed setting: the static figure again, no retrain
                for name, key in reversed(moves):
                    out = press_slider(page, p, name, "ArrowLeft" if key == "ArrowRight" else "ArrowRight")
                assert not out["retrained"] and page.evaluate(SIGNATURE_JS, index) == initial, out
        assert not errors, f"{page_name}: JavaScript errors: {errors}"
        assert not blocked, f"{page_name}: requests that left the page: {blocked}"
    finally:
        page.context.close()


@needs_browser
def test_a_live_setting_with_no_task_is_explained_not_drawn(browser):
    """Chapter 1's panel at an offset too large for the training length (k = 15, L_train = 8) trains nothing,
    explains why in its status line and keeps a finite figure (dimmed); a valid setting trains again."""
    page, errors, blocked = open_live_page(browser, "chapters/01_retrieval_task", None)
    try:
        index = figure_index(page, 0)
        page.evaluate("""() => { const r = document.querySelectorAll('.lg-live')[0];
            const set = (name, i) => { const s = r.querySelector(`input[data-name='${name}']`); s.value = String(i);
                s.dispatchEvent(new Event('input', {bubbles: true})); };
            set('train_len', 0); set('offset', 13); }""")  # training length 8, offset 14
        settle(page, 0, "k = 14")  # the sliders' own update first, so the key's is the one read below
        out = press_slider(page, 0, "offset", "ArrowRight")  # offset 15
        assert out["state"] == "invalid" and not out["retrained"], out
        assert "No task for this setting" in out["status"] and "k = 15" in out["status"], out["status"]
        assert "lg-live-stale" in page.evaluate("document.querySelectorAll('.lg-live')[0].className")
        assert figure_is_finite(page, index)
        page.evaluate("""() => { const s = document.querySelectorAll('.lg-live')[0].querySelector("input[data-name='offset']");
            s.value = '3'; s.dispatchEvent(new Event('input', {bubbles: true})); }""")  # offset 4
        settle(page, 0, "k = 4")
        out = press_slider(page, 0, "offset", "ArrowLeft")  # offset 3 at training length 8: a task
        assert out["state"] == "done" and out["retrained"], out
        assert "k = 3, training length 8" in out["status"] and figure_is_finite(page, index)
        assert not errors and not blocked, (errors, blocked)
    finally:
        page.context.close()


@needs_browser
@pytest.mark.parametrize("width", [1280, 400])
@pytest.mark.parametrize("page_name", LIVE_PAGES)
def test_live_panels_fit_the_column(browser, page_name, width):
    """At a desktop and a phone width every live panel, its sliders and its status line stay inside the text
    column, and the retrained figure's text is neither clipped nor overlapping; light-mode screenshots of the
    page before and after a retrain go to artifacts/screenshots/."""
    page, errors, blocked = open_live_page(browser, page_name, None, width=width)
    try:
        stem = f"{page_name.replace('/', '__')}-live-{width}"
        problems = []
        for p, moves in enumerate(SLIDER_MOVES[page_name]):
            panel = page.locator(".lg-live").nth(p)
            panel.scroll_into_view_if_needed()
            panel.screenshot(path=str(SCREENSHOTS / f"{stem}-{p}-static.png"))
            out = press_slider(page, p, *moves[0])
            assert out["state"] == "done", out
            page.wait_for_timeout(300)
            panel.screenshot(path=str(SCREENSHOTS / f"{stem}-{p}-retrained.png"))
            fit = page.evaluate("""(p) => { const r = document.querySelectorAll('.lg-live')[p];
                const box = r.getBoundingClientRect(), col = r.parentElement.getBoundingClientRect();
                const out = [];
                if (box.left < col.left - 1 || box.right > col.right + 1) out.push(`panel ${box.left}..${box.right} `
                    + `outside the column ${col.left}..${col.right}`);
                if (box.right > document.documentElement.clientWidth) out.push('panel wider than the window');
                if (r.scrollWidth > r.clientWidth + 1) out.push(`panel content ${r.scrollWidth} px in ${r.clientWidth}`);
                for (const el of r.querySelectorAll('.lg-live-control, .lg-live-status, .lg-live-progress, .js-plotly-plot')) {
                    const b = el.getBoundingClientRect();
                    if (b.width && (b.left < box.left - 1 || b.right > box.right + 1))
                        out.push(`${el.className} ${b.left}..${b.right} outside the panel ${box.left}..${box.right}`);
                }
                return out; }""", p)
            problems += [f"panel {p}: {x}" for x in fit]
            index = figure_index(page, p)
            problems += [f"panel {p} (retrained): {x}" for x in layout_problems(page.evaluate(TEXT_BOXES_JS, index))]
            LIVE_TIMES.append(f"{page_name} at {width} px, {moves[0][0]}: {out['ms'] / 1000:.2f} s")
        assert not problems, f"{page_name} at {width} px:\n  " + "\n  ".join(problems)
        assert not errors and not blocked, (errors, blocked)
    finally:
        page.context.close()


@needs_browser
@pytest.mark.parametrize("page_name", LIVE_PAGES)
def test_live_panels_read_without_javascript(browser, page_name):
    """With JavaScript off a live panel is its status line, saying what the precomputed figure shows, and a note
    that the sliders need JavaScript: no slider, no progress bar, nothing that would not work."""
    context = browser.new_context(java_script_enabled=False, viewport={"width": 1300, "height": 1000})
    try:
        page = context.new_page()
        page.goto((HTML / f"{page_name}.html").as_uri(), wait_until="load")
        for p in range(page.locator(".lg-live").count()):
            panel = page.locator(".lg-live").nth(p)
            assert panel.locator("input, progress").count() == 0
            status = panel.locator(".lg-live-status")
            assert status.is_visible() and status.inner_text().startswith("Computed when the book was built")
            note = panel.locator(".lg-live-note")
            assert note.is_visible() and "need JavaScript" in note.inner_text()
    finally:
        context.close()
