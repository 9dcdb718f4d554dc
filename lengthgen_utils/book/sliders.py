"""Figures with sliders: precomputed panels switched in the web page, with no Python running.

A slider figure holds every panel's traces and layout and switches them with plotly's own ``update`` method,
so it works in the static web book; :func:`grid_slider_figure` adds a few lines of page JavaScript for two
sliders that act together. Each step shows exactly its stand-alone panel (the tests check it).
"""
from __future__ import annotations


import numpy as np
import plotly.graph_objects as go

from .render import FIGURE_HEIGHT, SLIDER_LABELS_MAX, SLIDER_VALUE_SHIFT


# --- static explorers (web book sliders)
# What belongs to the figure that holds a slider rather than to one panel: its size and margins (room for the
# slider), the slider itself and the template. Everything else of a panel's layout is switched by its step.
_SLIDER_FRAME = frozenset({"height", "width", "margin", "autosize", "sliders", "updatemenus", "template"})


_LAYOUT_ARRAYS = frozenset({"annotations", "shapes", "images"})  # switched as whole arrays


def plain(value):
    """``value`` with numpy arrays and scalars turned into lists and Python numbers (slider arguments are JSON)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    return value


def _layout_paths(fig: go.Figure) -> dict:
    """A panel's layout as ``{attribute path: value}`` (e.g. ``"xaxis.range"``), without :data:`_SLIDER_FRAME`.

    Annotations, shapes and images are kept as whole arrays; every other attribute is a leaf path, the form
    plotly's ``update`` method sets (and resets, given ``None``).
    """
    out = {}

    def leaves(path, value):
        if isinstance(value, dict) and value:
            for key, v in value.items():
                leaves(f"{path}.{key}", v)
        else:
            out[path] = value

    for key, value in plain(fig.layout.to_plotly_json()).items():
        if key in _SLIDER_FRAME:
            continue
        if key in _LAYOUT_ARRAYS:
            out[key] = value
        else:
            leaves(key, value)
    return out


def _own_visibility(trace) -> bool | str:
    """How a trace shows in its own figure: ``True``, ``False`` or ``"legendonly"`` (plotly's default is True)."""
    return True if trace.visible is None else trace.visible


def _stacked_panels(panels: list, active: int) -> tuple[go.Figure, list, list]:
    """Every panel's traces in one figure, showing panel ``active`` with its layout entire.

    Returns:
        the figure, and per panel the trace visibility (each trace's own state in its panel, False for the
        others' traces) and the layout attributes that differ between panels, with this panel's values.
    """
    fig = go.Figure(layout=panels[active].layout)  # the page opens on the active panel, its layout entire
    owner = []  # panel index of every trace
    for i, panel in enumerate(panels):
        for trace in panel.data:
            fig.add_trace(trace)
            owner.append(i)
    layouts = [_layout_paths(panel) for panel in panels]
    paths = sorted(set().union(*layouts))
    empty = {key: [] for key in _LAYOUT_ARRAYS}  # a panel without annotations clears the others'
    varying = [p for p in paths if any(lay.get(p, empty.get(p)) != layouts[0].get(p, empty.get(p)) for lay in layouts)]
    visible = [[_own_visibility(t) if o == i else False for t, o in zip(fig.data, owner)] for i in range(len(panels))]
    relayout = [{p: layouts[i].get(p, empty.get(p)) for p in varying} for i in range(len(panels))]
    for trace, v in zip(fig.data, visible[active]):
        trace.visible = v
    return fig, visible, relayout


def slider_figure(frames: dict, slider_title: str, active: int = 0, suffix: str = "") -> go.Figure:
    """One figure with a plotly slider that switches between precomputed figures (works with no kernel).

    Each slider step shows its panel exactly as the stand-alone figure does: every trace of the
    panel in its own visibility state (a ``"legendonly"`` trace stays legend-only; the other panels'
    traces are hidden) and the panel's whole layout, title, annotations (e.g. the "below chance: likely
    a bug" flag of :func:`accuracy_vs_length`), shapes, axes (ranges, ticks, titles) and legend. Steps
    use plotly's ``"update"`` method and carry the layout attributes that differ between panels, so
    frames may differ in their number of traces and in any layout attribute. Only the figure's height
    and margins belong to the slider figure (it adds room for the slider under the plot). Everything is
    in the page's HTML: moving the slider needs plotly.js only, not Python.

    Every step is labelled by its value (``"112"``, ``"ALiBi"``), never by its index. A slider of more
    than :data:`SLIDER_LABELS_MAX` steps may have no room on a phone's rail for all its labels
    (:func:`~lengthgen_utils.book.render.fit_to_column` then hides them on the rail): each panel names
    its step where plotly writes the current value (``slider_title`` + label + ``suffix``, e.g.
    "encoding: ALiBi", "L = 112").

    Args:
        frames: ``{label: go.Figure or list of traces}``, in slider order; ``label`` is the step's text
            (e.g. ``"k = 3"``).
        slider_title: text before the current step's label (e.g. ``"offset k: "``).
        active: index of the frame shown when the page loads.
        suffix: text after the current step's label (e.g. ``" tokens"``).

    Returns:
        a plotly ``Figure`` with one slider under the plot, showing frame ``active``.

    Raises:
        ValueError: ``frames`` is empty, a frame has no traces, or ``active`` is out of range.
        TypeError: a frame is neither a figure nor a list of traces, or a label is not a string.
    """
    if not isinstance(frames, dict) or not frames:
        raise ValueError(f"frames must be a non-empty dict {{label: figure}}; got {frames!r}")
    if isinstance(active, bool) or not isinstance(active, int) or not 0 <= active < len(frames):
        raise ValueError(f"active must be an int in [0, {len(frames) - 1}]; got active={active!r}")
    figs = {}
    for label, frame in frames.items():
        if not isinstance(label, str):
            raise TypeError(f"frame labels must be strings; got {type(label).__name__} {label!r}")
        if isinstance(frame, (list, tuple)):
            frame = go.Figure(data=list(frame))
        if not isinstance(frame, go.Figure):
            raise TypeError(f"frame {label!r} must be a plotly Figure or a list of traces; got {type(frame).__name__}")
        if not frame.data:
            raise ValueError(f"frame {label!r} has no traces")
        figs[label] = frame
    numbered = len(figs) > SLIDER_LABELS_MAX
    if numbered:  # the rail may be too short for the labels: each panel writes its label where the value goes
        figs = {label: go.Figure(frame).add_annotation(
                    text=f"{slider_title}{label}{suffix}", name="slider value", xref="paper", x=0,
                    xanchor="left", yref="paper", y=1, yanchor="bottom", yshift=SLIDER_VALUE_SHIFT, showarrow=False,
                    font=dict(size=13, color="#2a3f5f"))
                for label, frame in figs.items()}
    fig, visible, relayout = _stacked_panels(list(figs.values()), active)
    steps = [dict(label=label, method="update", args=[{"visible": visible[i]}, relayout[i]])
             for i, label in enumerate(figs)]
    height = max(frame.layout.height or FIGURE_HEIGHT for frame in figs.values())  # fit_to_column adds the slider's room
    current = dict(visible=False) if numbered else dict(prefix=slider_title, suffix=suffix)
    fig.update_layout(height=height,
                      sliders=[dict(active=active, steps=steps, currentvalue=current,
                                    x=0.0, len=1.0, y=1.0, yanchor="bottom", pad=dict(t=0, b=18))])
    return fig



"""The few lines of page JavaScript behind :func:`grid_slider_figure`: when either slider moves, show the panel
that both sliders select (plotly's own sliders act one at a time)."""


def grid_slider_figure(panels: dict, slider_titles: tuple[str, str], active: tuple[int, int] = (0, 0)) -> go.Figure:
    """One figure with two sliders that act together: the panel shown is the one both sliders select.

    The panels form a grid: slider 1 picks the row, slider 2 the column. Every panel's traces are in the
    figure; which are visible, and each panel's own layout (title, annotations, shapes, axis ranges), are
    stored in ``layout.meta["grid"]``, and a few lines of page JavaScript (:data:`~lengthgen_utils.book.render.GRID_SCRIPT`, attached
    by the book's renderer) apply them when a slider moves. Works in static HTML with no kernel.

    Args:
        panels: ``{(row label, column label): go.Figure}`` for every cell of the grid (row-major order of
            first appearance defines the sliders' steps).
        slider_titles: the text before each slider's current value, e.g. ``("offset k = ", "training length = ")``.
        active: the (row, column) shown when the page loads.

    Returns:
        a plotly ``Figure`` with two sliders (steps with method ``"skip"``: the script does the switching).

    Raises:
        ValueError: a cell of the grid is missing, ``active`` is out of range, or a panel has no traces.
        TypeError: a key is not a pair of strings, or a panel is not a figure.
    """
    if not isinstance(panels, dict) or not panels:
        raise ValueError(f"panels must be a non-empty dict {{(row, column): figure}}; got {panels!r}")
    for key, panel in panels.items():
        if not (isinstance(key, tuple) and len(key) == 2 and all(isinstance(k, str) for k in key)):
            raise TypeError(f"panel keys must be (row label, column label) string pairs; got {key!r}")
        if not isinstance(panel, go.Figure):
            raise TypeError(f"panel {key!r} must be a plotly Figure; got {type(panel).__name__}")
        if not panel.data:
            raise ValueError(f"panel {key!r} has no traces")
    rows = list(dict.fromkeys(k[0] for k in panels))
    cols = list(dict.fromkeys(k[1] for k in panels))
    missing = [(r, c) for r in rows for c in cols if (r, c) not in panels]
    if missing:
        raise ValueError(f"panels must fill the grid {len(rows)} x {len(cols)}; missing {missing}")
    if not (isinstance(active, tuple) and len(active) == 2 and 0 <= active[0] < len(rows) and 0 <= active[1] < len(cols)):
        raise ValueError(f"active must be (row, column) within ({len(rows)}, {len(cols)}); got {active!r}")
    order = [panels[(r, c)] for r in rows for c in cols]
    fig, visible, relayout = _stacked_panels(order, active[0] * len(cols) + active[1])
    steps = [[dict(label=label, method="skip", args=[None]) for label in labels] for labels in (rows, cols)]
    fig.update_layout(meta={"grid": {"shape": [len(rows), len(cols)], "visible": visible, "relayout": relayout}},
                      sliders=[dict(active=a, steps=st, currentvalue=dict(prefix=title))
                               for a, st, title in zip(active, steps, slider_titles)])
    return fig


# --- equivariance (chapter 2) and pinning (chapter 3)
def _check_panels(panels: dict, name: str = "panels") -> None:
    if not panels:
        raise ValueError(f"{name} must hold at least one entry")
