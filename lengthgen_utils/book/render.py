"""How a figure reaches the page: the book's template, the fit to the page's column, the offline renderer.

**The page column.** The book's content column is about 690 px wide on a desktop and about 370 px on a
phone, and a figure is as wide as the column (plotly's responsive mode). So that nothing is cut or
overlaps at either width, every figure passes through :func:`fit_to_column` when it is shown: its titles
are wrapped to lines that fit a phone, the top margin holds the title below the toolbar's band, sliders
sit between the title and the plot, the legend goes under the plot (the template puts it at the bottom
of the figure), and axis titles and tick labels take the margins they need (``automargin``). The book's
browser test checks every figure of every page at both widths.

Figures are shown through the ``"lengthgen"`` renderer (see :func:`setup`): its output carries plotly's
own JSON for live Jupyter front ends *and* an HTML snippet without plotly.js, which the web book renders
with the single copy of plotly.js that the build serves from its own ``_static`` folder (no CDN, works
offline). Every figure is written as strict JSON (:func:`strict_json`).

A number reaches the prose through myst-nb's ``glue``: :func:`glue_numbers` glues a cell's numbers in one
call, and a ``{glue:text}`name:.2f``` role in the markdown shows each.
"""
from __future__ import annotations

import copy
import json
import textwrap

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer



FIGURE_HEIGHT = 440  # px: the plot area plus the margins below it; titles and sliders add their own height


TITLE_CHARS = 42  # characters per title line that fit a phone's column at the title's font size


X_TITLE_CHARS = 28  # per line of an x-axis title


Y_TITLE_CHARS = 28  # per line of a (rotated) y-axis title: on a phone the plot is about 230 px high


TOOLBAR_PX = 44  # the first title baseline sits here, below plotly's toolbar (28 px high, shown on hover)


TITLE_LINE_PX = 20


SLIDER_PX = 96  # a slider between the title and the plot: its current value, rail and step labels


SLIDER_LABELS_MAX = 6  # a slider with more steps names its current step above the plot (its rail may hide labels)


SLIDER_RAIL_CHARS = 40  # label characters a slider's rail holds on a phone's column (all steps together)
SLIDER_VALUE_SHIFT = 70  # px above the plot where a numbered slider's current label is written (plotly's own place)


LEGEND_CHARS = 40  # per line of a legend entry


LEGEND_LINE_PX = 20  # one line of the legend under the plot


SUBPLOT_TITLE_PX = 24  # a subplot title above the top panel


BOOK_TEMPLATE = go.layout.Template(pio.templates["plotly_white"])
BOOK_TEMPLATE.layout.update(
    font=dict(family="Helvetica, Arial, sans-serif", size=13),
    title=dict(font=dict(size=15), x=0.0, xanchor="left", xref="container", y=1.0, yref="container",
               yanchor="top", pad=dict(t=TOOLBAR_PX, l=8)),  # pad.t places the first baseline
    height=FIGURE_HEIGHT,
    margin=dict(l=8, r=12, t=TOOLBAR_PX + 16, b=8),
    paper_bgcolor="white",
    plot_bgcolor="white",
    # under the plot: at the bottom of the figure, which grows to hold it (so it never meets the axis)
    legend=dict(orientation="h", x=0.0, xanchor="left", xref="container", y=0.0, yref="container",
                yanchor="bottom", bgcolor="rgba(255,255,255,0.85)"),
    xaxis=dict(automargin=True, title=dict(standoff=8)),
    yaxis=dict(automargin=True, title=dict(standoff=8)),
)


CONFIG = {"responsive": True, "displaylogo": False}


def wrap_text(text: str | None, width: int) -> str | None:
    """``text`` with ``<br>`` inserted so that no line is longer than ``width`` characters (existing breaks kept)."""
    if not text:
        return text
    lines = []
    for segment in str(text).split("<br>"):
        lines += textwrap.wrap(segment, width, break_long_words=False, break_on_hyphens=False) or [""]
    return "<br>".join(lines)


def _lines(text: str | None) -> int:
    return 0 if not text else str(text).count("<br>") + 1


GRID_SCRIPT = """
(function () {
  var gd = document.getElementById('{plot_id}');
  var grid = gd && gd.layout.meta && gd.layout.meta.grid;
  if (!grid) { return; }
  gd.on('plotly_sliderchange', function () {
    // gd.layout, not gd._fullLayout: after a resize plotly's slider may update a stale full-layout copy
    var a = gd.layout.sliders[0].active || 0, b = gd.layout.sliders[1].active || 0;
    var i = a * grid.shape[1] + b;
    Plotly.update(gd, {visible: grid.visible[i]}, grid.relayout[i]);
  });
})();
"""


def fit_to_column(fig) -> dict:
    """A figure's plotly JSON laid out for the page column at any width (see the module docstring).

    Wraps the figure's title and the title of every slider step and frame to :data:`TITLE_CHARS`
    characters per line, and axis titles to :data:`X_TITLE_CHARS` / :data:`Y_TITLE_CHARS`; moves sliders
    between the title and the plot; sets the top margin and the height for what sits above the plot.

    Args:
        fig: a plotly ``Figure`` or its JSON dict (``{"data", "layout", "frames"}``).

    Returns:
        a new JSON dict (the argument is not changed).
    """
    fig = copy.deepcopy(fig.to_plotly_json() if isinstance(fig, go.Figure) else fig)
    layout = fig.setdefault("layout", {})
    title = layout.get("title") if isinstance(layout.get("title"), dict) else {"text": layout.get("title")}
    title["text"] = wrap_text(title.get("text"), TITLE_CHARS)
    layout["title"] = title
    n_lines = _lines(title["text"])
    sliders = layout.get("sliders") or []
    updates = [u for slider in sliders for step in slider.get("steps", []) for u in (step.get("args") or [])[1:2]]
    updates += ((layout.get("meta") or {}).get("grid") or {}).get("relayout", [])  # grid_slider_figure's panels
    for update in updates:  # the layout update of a step
        if not isinstance(update, dict):
            continue
        for key, value in update.items():
            if key == "title.text" and value:
                update[key] = wrap_text(value, TITLE_CHARS)
                n_lines = max(n_lines, _lines(update[key]))
            elif key.endswith("title.text") and key[0] in "xy" and value:
                update[key] = wrap_text(value, X_TITLE_CHARS if key[0] == "x" else Y_TITLE_CHARS)
    for frame in fig.get("frames") or []:
        frame_title = (frame.get("layout") or {}).get("title")
        if isinstance(frame_title, dict) and frame_title.get("text"):
            frame_title["text"] = wrap_text(frame_title["text"], TITLE_CHARS)
            n_lines = max(n_lines, _lines(frame_title["text"]))
    for key, axis in layout.items():
        if (key.startswith("xaxis") or key.startswith("yaxis")) and isinstance(axis, dict):
            axis_title = axis.get("title")
            if isinstance(axis_title, dict) and axis_title.get("text"):
                axis_title["text"] = wrap_text(axis_title["text"], X_TITLE_CHARS if key[0] == "x" else Y_TITLE_CHARS)
            axis.setdefault("automargin", True)
            if axis.get("type") == "log" and "tickvals" not in axis and "dtick" not in axis:
                axis.setdefault("nticks", 6)  # plotly's default labels every 2..9 of a short range: they collide
    top = TOOLBAR_PX + max(n_lines - 1, 0) * TITLE_LINE_PX + 16  # the last title line's baseline, its descent, a gap
    subplot_titles = any(a.get("yref") == "paper" and (a.get("y") or 0) >= 0.99 and a.get("yanchor") == "bottom"
                         and a.get("name") != "slider value" for a in layout.get("annotations") or [])
    if subplot_titles:
        top += SUBPLOT_TITLE_PX  # a subplot title stands on the top panel: sliders sit above it
        shifted = [a for a in layout.get("annotations") or [] if a.get("name") == "slider value"]
        shifted += [a for u in updates if isinstance(u, dict) for a in u.get("annotations") or []
                    if isinstance(a, dict) and a.get("name") == "slider value"]
        for a in shifted:  # a numbered slider's current label moves up with its slider
            a["yshift"] = (a.get("yshift") or 0) + SUBPLOT_TITLE_PX
    for n, slider in enumerate(sliders):  # between the title and the plot, full width, the first on top
        below = (len(sliders) - 1 - n) * SLIDER_PX + (SUBPLOT_TITLE_PX if subplot_titles else 0)
        slider.update(x=0.0, len=1.0, xanchor="left", y=1.0, yanchor="bottom", pad=dict(t=0, b=18 + below, l=24, r=24))
        slider.setdefault("currentvalue", {}).setdefault("font", {"size": 13, "color": "#2a3f5f"})
        steps = slider.get("steps", [])
        widest = max((len(str(st.get("label", ""))) for st in steps), default=0)
        if len(steps) > SLIDER_LABELS_MAX and len(steps) * widest > SLIDER_RAIL_CHARS:
            slider["font"] = {**slider.get("font", {}), "color": "rgba(0,0,0,0)"}  # the current value names the step
        top += SLIDER_PX
    for trace in fig.get("data", []):  # legend entries on lines that fit the column
        if trace.get("name") and trace.get("showlegend", True) is not False:
            trace["name"] = wrap_text(trace["name"], LEGEND_CHARS)
    shapes = [s for s in layout.get("shapes") or [] if s.get("showlegend") and s.get("name")]
    for shape in shapes:  # reference lines and regions named in the legend
        shape["name"] = wrap_text(shape["name"], LEGEND_CHARS)
    margin = layout.setdefault("margin", {})
    margin["t"] = max(margin.get("t") or 0, top)
    # a legend under the plot wraps to about one entry per line on a phone: the figure grows, the plot does not shrink
    entries = len({t.get("legendgroup") or t.get("name") for t in fig.get("data", [])
                   if t.get("showlegend", True) is not False and t.get("name")})
    entries += len({s.get("legendgroup") or s["name"] for s in shapes})
    legend_px = LEGEND_LINE_PX * max(0, entries - 1) if layout.get("showlegend", True) is not False else 0
    layout["height"] = (layout.get("height") or FIGURE_HEIGHT) + top - (TOOLBAR_PX + 16) + legend_px
    return fig


def strict_json(fig_dict: dict) -> dict:
    """A figure's JSON dict as strict JSON: through plotly's encoder, so NaN and infinities become ``null`` (what
    plotly.js draws as a gap) and numpy arrays plotly's lists or typed arrays.

    The book's outputs are written into notebooks and pages as JSON; Python's ``json`` would write a NaN as
    the non-standard ``NaN`` (and Jupyter warns, in the cell, about a message that is not JSON). plotly's own
    renderers do the same round trip.

    Args:
        fig_dict: a figure's JSON dict (``{"data", "layout", "frames"}``).

    Returns:
        a new dict that ``json.dumps(..., allow_nan=False)`` writes.
    """
    return json.loads(pio.to_json(fig_dict, validate=False, remove_uids=False))


def bundle(fig_dict: dict) -> dict:
    """The output of a figure: plotly's JSON (Jupyter) and an HTML div for the book (plotly.js served by the book),
    both strict JSON (:func:`strict_json`)."""
    fig_dict = strict_json(fit_to_column(fig_dict))
    grid = ((fig_dict.get("layout") or {}).get("meta") or {}).get("grid")
    html = pio.to_html(fig_dict, include_plotlyjs=False, full_html=False, auto_play=False, config=CONFIG,
                       post_script=GRID_SCRIPT if grid else None)
    return {"application/vnd.plotly.v1+json": {"data": fig_dict.get("data", []), "layout": fig_dict.get("layout", {}),
                                               "frames": fig_dict.get("frames", []), "config": CONFIG},
            "text/html": html}


class BookRenderer(MimetypeRenderer):
    """Emit plotly JSON (for Jupyter) plus an HTML div that expects plotly.js on the page (for the book)."""

    def to_mimebundle(self, fig_dict):
        return bundle(fig_dict)


def setup() -> None:
    """Make the book's renderer and template plotly's defaults (call once, in a chapter's first cell)."""
    pio.templates["lengthgen"] = BOOK_TEMPLATE
    pio.templates.default = "lengthgen"
    pio.renderers["lengthgen"] = BookRenderer()
    pio.renderers.default = "lengthgen"


def glue_numbers(**numbers) -> None:
    """Glue a cell's numbers for the page's prose, in one call.

    ``glue_numbers(ch1_fit=3, ch1_acc=0.97)`` does what ``glue("ch1_fit", 3, display=False)`` and
    ``glue("ch1_acc", 0.97, display=False)`` do; a ``{glue:text}`ch1_acc:.2f``` role in the chapter's
    markdown then shows the value, so the page agrees with its own run on any machine. The names are
    keywords, so ``tests/test_glue_names.py`` reads them from the source without running anything (a name
    built at run time goes through ``glue`` itself).

    Args:
        **numbers: ``{name: value}`` in order; a name starts with its chapter's prefix (``ch1_``); a value
            is a plain Python ``str``, ``int``, ``float`` or ``bool`` (what a role formats).

    Raises:
        TypeError: a value of another type (a tensor or a numpy scalar, whose text would read
            ``tensor(0.5)`` or ``np.float64(0.5)``); nothing is glued then.
    """
    for name, value in numbers.items():
        if type(value) not in (str, int, float, bool):
            raise TypeError(f"{name} must be a plain str, int, float or bool (e.g. float(x) or int(x)); got "
                            f"{type(value).__name__}: {value!r}")
    from myst_nb import glue  # here, not at the top: the package runs without the book's builder

    for name, value in numbers.items():
        glue(name, value, display=False)
