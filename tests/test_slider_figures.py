"""Slider figures show each panel exactly as its stand-alone figure.
"""
import base64
import json
import re
import warnings
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest
import torch

from lengthgen_utils.book import ch03, ch04, ch05, figures, sliders


# ================================================================ 4. slider figures keep everything of each panel
def _gen(seed):
    return torch.Generator().manual_seed(seed)


SLIDER_FRAME = {"height", "width", "margin", "autosize", "sliders", "updatemenus", "template"}  # the slider's own


def _apply_step(fig, step):
    """The figure as plotly.js shows it after the slider moves to ``step`` (method "update": traces, then layout)."""
    assert step.method == "update"
    shown = go.Figure(fig)
    for trace, visible in zip(shown.data, step.args[0]["visible"], strict=True):
        trace.visible = visible
    for path, value in step.args[1].items():
        shown.layout[path] = value
    return shown


def _decoded(spec):
    """Plotly JSON with its typed arrays (``{"dtype", "bdata"}``, base64) read back as plain lists and empty
    containers dropped (plotly.js draws both forms alike)."""
    if isinstance(spec, dict):
        if set(spec) >= {"dtype", "bdata"}:
            values = np.frombuffer(base64.b64decode(spec["bdata"]), dtype=spec["dtype"])
            shape = [int(n) for n in str(spec.get("shape", len(values))).split(",")]  # plotly writes "rows, cols"
            return values.reshape(shape).tolist()
        decoded = {k: _decoded(v) for k, v in spec.items()}
        return {k: v for k, v in decoded.items() if v != {}}  # an emptied container is the default, as if absent
    if isinstance(spec, list):
        return [_decoded(v) for v in spec]
    return spec


def _what_is_shown(fig):
    """The visible traces (with their visibility state) and the whole layout but the slider's own frame, as JSON."""
    spec = _decoded(json.loads(pio.to_json(fig, validate=False)))
    traces = [{**t, "visible": t.get("visible", True)} for t in spec["data"] if t.get("visible", True) is not False]
    layout = {k: v for k, v in spec["layout"].items() if k not in SLIDER_FRAME}
    return traces, layout


def assert_steps_show_their_panels(fig, panels):
    """Every step of ``fig``'s slider shows exactly its stand-alone panel; the page opens on the active one."""
    (slider,) = fig.layout.sliders
    assert len(slider.steps) == len(panels)
    for i, (step, panel) in enumerate(zip(slider.steps, panels)):
        assert _what_is_shown(_apply_step(fig, step)) == _what_is_shown(panel), f"step {i} ({step.label})"
    assert _what_is_shown(fig) == _what_is_shown(panels[slider.active]), "the page does not open on the active step"


def assert_grid_shows_its_panels(fig, panels):
    """Every cell of ``fig``'s grid (:func:`sliders.grid_slider_figure`: the page script applies the cell's stored
    visibility, then its layout) shows exactly its stand-alone panel; the page opens on the active cell."""
    grid = fig.layout.meta["grid"]
    rows, cols = grid["shape"]
    assert len(panels) == rows * cols == len(grid["visible"]) == len(grid["relayout"])
    strip = lambda shown: (shown[0], {k: v for k, v in shown[1].items() if k != "meta"})  # noqa: E731
    for i, panel in enumerate(panels):
        shown = go.Figure(fig)
        for trace, visible in zip(shown.data, grid["visible"][i], strict=True):
            trace.visible = visible
        for path, value in grid["relayout"][i].items():
            shown.layout[path] = value
        assert strip(_what_is_shown(shown)) == _what_is_shown(panel), f"cell {i}"
    active = fig.layout.sliders[0].active * cols + fig.layout.sliders[1].active
    assert strip(_what_is_shown(fig)) == _what_is_shown(panels[active]), "the page does not open on the active cell"


def _accuracy_panel(means, title, n_curves=2, lengths=(16, 32, 64)):
    curves = {pe: (list(lengths), np.array([means] * 5)) for pe in ("rope", "ape", "nope", "alibi")[:n_curves]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the below-chance flag also warns
        return figures.accuracy_vs_length(curves, chance=1 / 16, train_len=16, title=title)


def test_slider_step_keeps_its_panels_below_chance_flag_and_legendonly_traces():
    """The reported example: the slider used to take annotations from the first panel (dropping the "below
    chance: likely a bug" flag of another) and to make a legend-only trace visible. The flagged panel's step
    shows its flag, the other step none, and the legend-only trace stays legend-only."""
    fine = _accuracy_panel([1.0, 0.9, 0.8], "fine")
    flagged = _accuracy_panel([0.5, 0.01, 0.0], "below chance")  # mean 0.0 < 1/16 - 0.05: flagged
    flagged.data[1].visible = "legendonly"
    fig = sliders.slider_figure({"a": fine, "b": flagged}, "panel: ", active=0)
    texts = lambda f: [a.text for a in f.layout.annotations]  # noqa: E731
    assert not any("likely a bug" in t for t in texts(fig))
    on_b = _apply_step(fig, fig.layout.sliders[0].steps[1])
    assert any(t.startswith("below chance: likely a bug") for t in texts(on_b))
    assert [t.visible for t in on_b.data][4:] == [True, "legendonly", True, True]
    back = _apply_step(on_b, fig.layout.sliders[0].steps[0])
    assert not any("likely a bug" in t for t in texts(back))
    assert_steps_show_their_panels(fig, [fine, flagged])
    assert_steps_show_their_panels(sliders.slider_figure({"a": fine, "b": flagged}, "panel: ", active=1),
                                   [fine, flagged])


def test_slider_steps_switch_axes_legends_shapes_and_trace_counts():
    """Panels that differ in evaluation lengths (axis ticks), number of curves (legend placement), shapes and
    trace count: each step is its panel, in both directions."""
    panels = [_accuracy_panel([1.0, 0.9, 0.8], "three lengths"),
              _accuracy_panel([1.0, 0.9, 0.8, 0.7], "four curves, four lengths", n_curves=4, lengths=(8, 16, 32, 64)),
              ch04.kernel_panel([-2, -1, 0], np.ones((2, 3)), 1, 2, "a kernel panel", y_range=[-3, 3])]
    for active in range(3):
        fig = sliders.slider_figure({str(i): p for i, p in enumerate(panels)}, "x: ", active=active)
        assert_steps_show_their_panels(fig, panels)


def _book_sliders():
    """The slider figures the book builds: ``(plots function, figure, stand-alone panels)``, as in the chapters."""
    g = _gen(0)
    lengths = [16, 32, 64, 128]
    sweep = {k: {pe: (lengths, torch.rand(5, 4, generator=g).numpy()) for pe in ("rope", "ape", "nope")}
             for k in (1, 3, 5)}
    sweep[5]["nope"] = (lengths, np.zeros((5, 4)))  # a below-chance panel, as a bug would show it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        panels = [figures.accuracy_vs_length(c, chance=1 / 16, train_len=16, title=f"k = {k}") for k, c in sweep.items()]
    yield "slider_figure", sliders.slider_figure({f"k = {k}": p for k, p in zip(sweep, panels)}, "offset ", 1), panels
    kernels = {k: torch.randn(3, 49, generator=g).double().numpy() for k in (1, 3, 5)}
    fig = ch04.kernel_slider(list(range(-48, 1)), kernels, 16, "kernels")
    y = [s.min() for s in kernels.values()], [s.max() for s in kernels.values()]
    y_range = [min(y[0]) - 0.05 * (max(y[1]) - min(y[0])), max(y[1]) + 0.05 * (max(y[1]) - min(y[0]))]
    yield "kernel_slider", fig, [ch04.kernel_panel(list(range(-48, 1)), s, k, 16, "kernels", y_range)
                                 for k, s in kernels.items()]
    rows = {L: torch.softmax(torch.randn(3, L, generator=g), -1) for L in (16, 24, 40)}
    yield "attention_row_slider", ch03.attention_row_slider(rows, 16, 3, "rows", active=24), [
        ch03.attention_row_panel(rows[L], 16, 3, "rows", x_max=40) for L in (16, 24, 40)]
    fine = [16, 32, 64, 128, 256]
    p = torch.rand(3, 5, generator=g).numpy() * 0.9 + 0.05
    yield "dilution_slider", ch05.dilution_slider([16, 64], p[:, [0, 2]], (fine, p), (fine, p ** 2), "abc", "dil"), [
        ch05.dilution_panel([16, 64], p[i, [0, 2]], (fine, p[i]), (fine, p[i] ** 2), "dil") for i in range(3)]
    grid = {}  # chapter 1's explorer: offset x training length, each panel on its own lengths
    for k in (1, 3):
        for train_len in (8, 16, 32):
            lengths = [train_len * m for m in (1, 2, 4)]
            curves = {pe: (lengths, torch.rand(5, 3, generator=g).numpy()) for pe in ("rope", "ape", "nope")}
            grid[(str(k), str(train_len))] = figures.accuracy_vs_length(curves, chance=1 / 16, train_len=train_len,
                                                                     title=f"k = {k}, L = {train_len}")
    yield "grid_slider_figure", sliders.grid_slider_figure(grid, ("offset k = ", "training length = "), (1, 1)), list(
        grid.values())


def test_every_slider_figure_of_the_book_is_swept():
    """Discovery: every plots function the chapters call to build a slider is in the sweep below."""
    called = set()
    for path in sorted((Path(__file__).parents[1] / "chapters").glob("*.ipynb")):
        source = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
        called |= set(re.findall(r"(?:sliders|ch0\d|figures)\.(\w*slider\w*)\(", source))
    assert called and called <= {name for name, _, _ in _book_sliders()}, called


@pytest.mark.parametrize("name", ["slider_figure", "kernel_slider", "attention_row_slider", "dilution_slider",
                                  "grid_slider_figure"])
def test_every_book_slider_step_equals_its_stand_alone_panel(name):
    """Each step of each slider figure the book builds shows its stand-alone panel exactly: traces and their
    visibility, title, annotations (chapter 1's below-chance flag included), shapes, axes and legend."""
    (fig, panels), = [(f, p) for n, f, p in _book_sliders() if n == name]
    if name == "grid_slider_figure":
        assert_grid_shows_its_panels(fig, panels)
    else:
        assert_steps_show_their_panels(fig, panels)


