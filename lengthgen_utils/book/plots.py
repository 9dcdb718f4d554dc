"""Plotly figure builders with the book's one look (the only module, with widgets, that imports plotly).

Every accuracy figure shows the mean over seeds as a line, the spread
(min..max over seeds) as a band, a dotted chance line and the training
length; axes are labeled with units.

**Labels never sit on data.** A reference line or region (chance, the training length, a threshold,
the training window) is named in the legend (plotly's legend entries for shapes), not by text drawn
inside the plot, where it would cover a curve or a point sooner or later. The book's browser test
checks that no annotation's text overlaps a drawn line, marker or bar.

**One colour per encoding and model, set once.** An encoding's colour is its ``color``
(:mod:`~lengthgen_utils.core.encodings`); the models that are not an encoding alone (a normaliser, a
closed form, a recurrent model) take theirs from :data:`MODEL_COLORS`. Red is APE's and nothing
else's; the palette for seeds and unnamed curves (:data:`PALETTE`) has no red.

**The page column.** The book's content column is about 690 px wide on a desktop and about 370 px on a
phone, and a figure is as wide as the column (plotly's responsive mode). So that nothing is cut or
overlaps at either width, every figure passes through :func:`fit_to_column` when it is shown: its titles
are wrapped to lines that fit a phone, the top margin holds the title below the toolbar's band, sliders
sit between the title and the plot, the legend goes under the plot (the template puts it at the bottom
of the figure), and axis titles and tick labels take the margins they need (``automargin``). The book's
browser test checks every figure of every page at both widths.

Figures are shown through the ``"lengthgen"`` renderer (see :func:`setup`):
its output carries plotly's own JSON for live Jupyter front ends *and* an
HTML snippet without plotly.js, which the web book renders with the single
copy of plotly.js that the build serves from its own ``_static`` folder
(no CDN, works offline).
"""
from __future__ import annotations

import copy
import json
import re
import textwrap
import warnings

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer

from .._validate import check_int, per_model, per_model_rows
from ..core.encodings import ENCODINGS, Encoding, LearnedAPE, RoPE, RotaryFrequencies, get_encoding

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#393b79", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]
"""Colours of seeds and of curves that name no encoding or model, in order (plotly's, with indigo for red)."""

MODEL_COLORS = {
    # the single heads of chapters 6 and 8: the encoding's colour for the softmax head, another for each normaliser
    "RoPE head, softmax": RoPE.color,
    "RoPE head (softmax)": RoPE.color,
    "RoPE head, linear": "#6b6ecf",
    "rotary head, softmax": RotaryFrequencies.color,
    "rotary head, linear": "#8c6d31",
    "rotary linear head": "#8c6d31",
    "rotary head, linear / L": "#a55194",
    "rotary head, linear / sum": "#637939",
    "rotary head, exp": "#9c9ede",
    # chapter 6's directly parameterised kernels and closed forms
    "direct kernel, RoPE: trained": "#5254a3",
    "direct kernel, well-conditioned: trained": "#8ca252",
    "RoPE: min-norm c*": "#000000",
    "RoPE: closed-form c_t": "#ce6dbd",
    "well-conditioned: min-norm c*": "#bd9e39",
    # chapter 8
    "linear recurrent model": "#006d2c",
}
"""The colour of every model the chapters name that is not an encoding alone, the same in every chapter.

Two names of one model (chapter 6's "rotary head, linear" is chapter 8's "rotary linear head") share a
colour; no two models do, and none takes an encoding's colour unless it is that encoding's softmax head.
Chapters pass it as ``colors=`` / ``styles=`` (a name the figure does not draw is ignored)."""
FIGURE_HEIGHT = 440  # px: the plot area plus the margins below it; titles and sliders add their own height
TITLE_CHARS = 42  # characters per title line that fit a phone's column at the title's font size
X_TITLE_CHARS = 28  # per line of an x-axis title
Y_TITLE_CHARS = 28  # per line of a (rotated) y-axis title: on a phone the plot is about 230 px high
TOOLBAR_PX = 44  # the first title baseline sits here, below plotly's toolbar (28 px high, shown on hover)
TITLE_LINE_PX = 20
SLIDER_PX = 96  # a slider between the title and the plot: its current value, rail and step labels
SLIDER_LABELS_MAX = 6  # a slider with more steps numbers them on its rail (longer labels would collide)
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
        if len(steps) > SLIDER_LABELS_MAX and any(len(str(st.get("label", ""))) > 3 for st in steps):
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


def _bundle(fig_dict: dict) -> dict:
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
        return _bundle(fig_dict)


def setup() -> None:
    """Make the book's renderer and template plotly's defaults (call once, in a chapter's first cell)."""
    pio.templates["lengthgen"] = BOOK_TEMPLATE
    pio.templates.default = "lengthgen"
    pio.renderers["lengthgen"] = BookRenderer()
    pio.renderers.default = "lengthgen"


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def _encoding(key) -> Encoding | None:
    """The encoding a curve key stands for: an Encoding, or a registered encoding's name; else None."""
    if isinstance(key, Encoding):
        return key
    return get_encoding(key) if isinstance(key, str) and key in ENCODINGS else None


def _label(key) -> str:
    """A curve's legend text: the encoding's label when the key is an encoding (or its name), else the key."""
    encoding = _encoding(key)
    return encoding.label if encoding is not None else str(key)


SHORT_LABELS = (("APE (learned)", "APE"), (" + random positions", " + rand. pos."), (" + random shift", " + rand. shift"))


def short_label(key) -> str:
    """A curve's label (see ``_label``) shortened to fit beside a panel on a phone: ``"APE (learned) + random
    shift"`` becomes ``"APE + rand. shift"``; the chapter's caption names the encodings in full."""
    label = _label(key)
    for long, short in SHORT_LABELS:
        label = label.replace(long, short)
    return label


def _color(key, i: int) -> str:
    """A curve's colour: the encoding's own when the key is an encoding (or its name), else the i-th of the palette."""
    encoding = _encoding(key)
    return encoding.color if encoding is not None else PALETTE[i % len(PALETTE)]


MIN_SEEDS = 5  # fewer seeds than this are flagged in the figure title (the book reports >= 5 seeds per point)
BELOW_CHANCE_TOL = 0.05  # a mean accuracy this far below chance is flagged as a likely bug


def seed_note(title: str, n_seeds: int) -> str:
    """``title`` noting ``"fewer than 5"`` seeds when ``n_seeds < MIN_SEEDS``.

    A title that already says ``"N seeds"`` gets ``"N seeds (fewer than 5)"`` in place; any
    other gets ``" (N seeds: fewer than 5)"`` appended.
    """
    if n_seeds >= MIN_SEEDS:
        return title
    said = f"{n_seeds} seed{'s' if n_seeds != 1 else ''}"
    noted, count = re.subn(rf"(?<![\d.]){re.escape(said)}\b", f"{said} (fewer than {MIN_SEEDS})", title, count=1)
    return noted if count else f"{title} ({said}: fewer than {MIN_SEEDS})"


def flag_below_chance(fig: go.Figure, means: dict, chance: float, tol: float = BELOW_CHANCE_TOL) -> list[str]:
    """Warn and annotate ``fig`` when a mean accuracy lies more than ``tol`` below ``chance``.

    On a balanced task no predictor that ignores the target can score below chance in
    expectation, so a mean clearly below it points at a bug (mis-aligned targets,
    scoring padded positions, a wrong chance level) rather than at a result.

    Args:
        fig: the figure to annotate.
        means: ``{curve name: mean accuracies [n]}`` (NaN entries are ignored).
        chance: chance accuracy.
        tol: allowed shortfall (sampling noise).

    Returns:
        the names of the flagged curves (empty when none is below chance).
    """
    flagged = [name for name, m in means.items()
               if np.any(np.nan_to_num(np.asarray(m, dtype=float), nan=np.inf) < chance - tol)]
    if flagged:
        names = ", ".join(_label(n) for n in flagged)
        warnings.warn(f"mean accuracy below chance ({chance:.3f} - {tol}) for {names}: likely a bug", stacklevel=3)
        fig.add_annotation(text=f"below chance: likely a bug ({names})", xref="paper", yref="paper", x=0.5, y=0.02,
                           showarrow=False, font=dict(color="#8a4b00", size=14), bgcolor="rgba(255,255,255,0.8)")
    return flagged


def accuracy_vs_length(curves: dict, chance: float, train_len: int, title: str,
                       y_title: str = "accuracy at the query (fraction correct)", bands: bool = True,
                       styles: dict | None = None) -> go.Figure:
    """Accuracy against evaluation length, mean over seeds with a min..max band.

    Args:
        curves: ``{name: (lengths [n], accuracy [n_seeds, n])}``; ``name`` picks the colour
            (``"rope"``, ``"ape"``, ``"nope"``, ...).
        chance: chance accuracy, drawn as a dotted line.
        train_len: the longest training length, drawn as a vertical line.
        title: figure title (say what is shown and over how many seeds).
        bands: draw the min..max band of each curve (turn off when curves overlap).
        styles: optional ``{name: {"color": ..., "dash": ...}}`` overriding a curve's colour or line
            dash (e.g. the same colour for two variants of one model, dashed for one of them).

    Returns:
        a plotly ``Figure`` whose x axis is ``log2(L)``, labeled in tokens and multiples of ``train_len``.
        A mean more than :data:`BELOW_CHANCE_TOL` below ``chance`` is annotated "below chance: likely a
        bug" and warned about (:func:`flag_below_chance`); fewer than 5 seeds are noted in the title
        (:func:`seed_note`).

    Raises:
        ValueError: ``curves`` is empty, or an accuracy array is not ``[n_seeds, len(lengths)]``.
    """
    if not curves:
        raise ValueError("curves must name at least one curve")
    fig = go.Figure()
    all_lengths, means, n_seeds = set(), {}, []
    for i, (name, (lengths, acc)) in enumerate(curves.items()):
        lengths = np.asarray(lengths)
        acc = np.asarray(acc, dtype=float)
        if acc.ndim != 2 or acc.shape[1] != len(lengths):
            raise ValueError(f"accuracy for {name!r} must be [n_seeds, {len(lengths)}]; got {acc.shape}")
        all_lengths.update(int(x) for x in lengths)
        style = (styles or {}).get(name, {})
        color = style.get("color", _color(name, i))
        lo, hi, mean = acc.min(0), acc.max(0), acc.mean(0)
        means[name] = mean
        n_seeds.append(acc.shape[0])
        x = np.log2(lengths)  # a linear axis over log2(L): shapes and hovers stay in plain units
        if bands:
            fig.add_trace(go.Scatter(x=np.concatenate([x, x[::-1]]), y=np.concatenate([hi, lo[::-1]]),
                                     mode="lines", fill="toself", fillcolor=_rgba(color, 0.18), line=dict(width=0),
                                     hoverinfo="skip", showlegend=False, legendgroup=_label(name)))
        fig.add_trace(go.Scatter(x=x, y=mean, mode="lines+markers", name=f"{_label(name)} (mean of {acc.shape[0]})",
                                 line=dict(color=color, width=3, dash=style.get("dash", "solid")), legendgroup=_label(name),
                                 customdata=np.stack([lengths, lo, hi], -1),
                                 hovertemplate="L=%{customdata[0]:d}: mean %{y:.3f} "
                                               "(min %{customdata[1]:.3f}, max %{customdata[2]:.3f})"))
    ticks = sorted(all_lengths)
    fig.add_hline(y=chance, line=dict(color="black", dash="dot", width=1.5), name=f"chance = {chance:.3f}",
                  showlegend=True)
    fig.add_vline(x=float(np.log2(train_len)), line=dict(color="gray", dash="dash", width=1),
                  name="training length", showlegend=True)
    flag_below_chance(fig, means, chance)
    fig.update_layout(title=seed_note(title, min(n_seeds)))
    x = np.log2(ticks)
    fig.update_xaxes(title="sequence length L (tokens, log scale)", tickvals=x,
                     ticktext=[f"{t}<br>{t / train_len:g}x" for t in ticks],
                     range=[x[0] - 0.3, x[-1] + 0.3])
    fig.update_yaxes(title=y_title, range=[-0.02, 1.05])
    return fig


def loss_curves(histories: dict, title: str, colors: dict | None = None, smooth: int = 1) -> go.Figure:
    """Training loss per step: every model of each ensemble as a thin line, the median as a thick one.

    On a log axis a min..max band is misleading (a loss near 0 draws the band down to 1e-9), so each
    model gets its own faint line. A loss that jumps by orders of magnitude from step to step (a head
    whose loss is already near 0) still fills the axis with a band of thin lines; ``smooth`` draws every
    line as the running mean of the loss over that many steps (the loss the model had on average over
    the window; a loss of exactly 0, float32 underflow, is averaged like any other), so the trend is
    readable. The thin lines are drawn first and the thick medians on top of all of them.

    Args:
        histories: ``{name: loss [steps, n_models]}`` (the return value of ``training.train``).
        title: figure title.
        colors: optional ``{name: colour}`` (one colour per model across a chapter's figures).
        smooth: window of the running mean in steps (1: the raw loss). A window of ``w`` plots, at
            step ``t``, the mean over steps ``t - w + 1 .. t`` (fewer at the start).

    Returns:
        a plotly ``Figure`` with a log loss axis.

    Raises:
        ValueError: a history that is not ``[steps, n_models]``; ``smooth`` not a positive integer.
    """
    if isinstance(smooth, bool) or not isinstance(smooth, int) or smooth < 1:
        raise ValueError(f"smooth must be a positive integer (steps); got {smooth!r}")
    fig, medians = go.Figure(), []
    for i, (name, hist) in enumerate(histories.items()):
        hist = np.asarray(hist, dtype=float)
        if hist.ndim != 2:
            raise ValueError(f"histories[{name!r}] must be [steps, n_models]; got shape {hist.shape}")
        if smooth > 1:
            cum = np.cumsum(hist, axis=0)
            lagged = np.zeros_like(cum)  # the sum of the losses before the window
            lagged[smooth:] = cum[:-smooth]
            count = np.minimum(np.arange(1, hist.shape[0] + 1), smooth)[:, None]
            hist = (cum - lagged) / count
        steps = np.arange(1, hist.shape[0] + 1)
        color = (colors or {}).get(name, _color(name, i))
        for m in range(hist.shape[1]):
            fig.add_trace(go.Scatter(x=steps, y=hist[:, m], mode="lines", line=dict(color=_rgba(color, 0.35), width=1),
                                     legendgroup=_label(name), showlegend=False,
                                     hovertemplate=f"{_label(name)}, model {m}: " + "step %{x}: %{y:.3g}<extra></extra>"))
        medians.append(go.Scatter(x=steps, y=np.median(hist, 1), mode="lines", legendgroup=_label(name),
                                  name=f"{_label(name)} (median of {hist.shape[1]}; thin: each)",
                                  line=dict(color=color, width=2.5)))
    for trace in medians:
        fig.add_trace(trace)
    fig.update_layout(title=title)
    fig.update_xaxes(title="optimizer step")
    fig.update_yaxes(title="training cross-entropy (nats, log scale)", type="log", exponentformat="power")
    return fig


# --- carrier kernel (chapter 4) and dilution (chapter 5)

SEED_COLORS = PALETTE


def kernel_panel(offsets, kernel, target_offset: int, train_len: int, title: str, y_range=None) -> go.Figure:
    """The offset kernel s(D) of every seed for one target offset k: one step of :func:`kernel_slider`.

    Args:
        offsets: ints D ``[n]`` (x axis, key position minus query position).
        kernel: ``[n_seeds, n]`` logits in nats.
        target_offset: k; a dashed line marks ``D = -k``.
        train_len: the training length (the window ``-(train_len-1) <= D <= 0`` is shaded).
        title: figure title.
        y_range: ``[low, high]`` of the y axis (e.g. shared by every step of a slider); None fits the data.

    Returns:
        a plotly ``Figure`` with one trace per seed and the target line.

    Raises:
        ValueError: ``kernel`` is not ``[n_seeds, n]``.
    """
    x = np.asarray(offsets)
    s = np.asarray(kernel, dtype=float)
    if s.ndim != 2 or s.shape[1] != len(x):
        raise ValueError(f"kernels[{target_offset}] must be [n_seeds, {len(x)}]; got {s.shape}")
    data = [go.Scatter(x=x, y=row, mode="lines", name=f"seed {i}", line=dict(color=SEED_COLORS[i % 10], width=2),
                       hovertemplate="D=%{x}: s=%{y:.2f} nats") for i, row in enumerate(s)]
    data.append(go.Scatter(x=[-target_offset, -target_offset], y=[s.min(), s.max()], mode="lines",
                           name=f"target D = -{target_offset}", line=dict(color="black", dash="dash", width=2)))
    fig = go.Figure(data=data)
    fig.add_vrect(x0=-(train_len - 1) - 0.5, x1=0.5, fillcolor="gray", opacity=0.12, line_width=0,
                  name="training window", showlegend=True)
    fig.update_layout(title=title)
    fig.update_xaxes(title="relative position D = j − i (tokens)")
    fig.update_yaxes(title="attention logit s(D) (nats)", range=None if y_range is None else list(y_range))
    return fig


def kernel_slider(offsets, kernels: dict, train_len: int, title: str) -> go.Figure:
    """The offset kernel s(D) of every seed, one slider step per target offset k.

    Each step is the stand-alone :func:`kernel_panel` of its offset; all share one y range, so the
    steps can be compared by eye.

    Args:
        offsets: ints D ``[n]`` (x axis, key position minus query position).
        kernels: ``{k: s [n_seeds, n]}`` logits in nats, one entry per target offset k.
        train_len: the training length (the window ``-(train_len-1) <= D <= 0`` is shaded).
        title: figure title.

    Returns:
        a plotly ``Figure`` (:func:`slider_figure`) with one trace per seed, a marker at ``D = -k`` and a
        slider over k.

    Raises:
        ValueError: ``kernels`` is empty or an array is not ``[n_seeds, n]``.
    """
    if not kernels:
        raise ValueError("kernels must hold at least one offset")
    x = np.asarray(offsets)
    arrays = {}
    for k, s in kernels.items():
        s = np.asarray(s, dtype=float)
        if s.ndim != 2 or s.shape[1] != len(x):
            raise ValueError(f"kernels[{k}] must be [n_seeds, {len(x)}]; got {s.shape}")
        arrays[k] = s
    y_lo = min(s.min() for s in arrays.values())
    y_hi = max(s.max() for s in arrays.values())
    pad = 0.05 * (y_hi - y_lo)
    y_range = [y_lo - pad, y_hi + pad]
    return slider_figure({str(k): kernel_panel(x, s, k, train_len, title, y_range) for k, s in arrays.items()},
                         "target offset k = ")


def carrier_spectrum_figure(periods, amplitude, variation, title: str) -> go.Figure:
    """Per-pair amplitude r_i and window variation v_i, mean over models with min..max error bars.

    Args:
        periods: ``[P]`` period of each pair, ``2 pi / theta_i`` (tokens).
        amplitude, variation: ``[n_models, P]`` (nats).
    """
    periods = np.asarray(periods, dtype=float)
    def compact(p):  # 63, 199, 2.0k, 20k: a period label that fits beside seven others on a phone
        return f"{p:.0f}" if p < 1000 else f"{p / 1000:.1f}k" if p < 10_000 else f"{p / 1000:.0f}k"

    labels = [f"{i}<br>{compact(p)}" for i, p in enumerate(periods)]
    fig = go.Figure()
    for name, arr, color in (("amplitude r_i", amplitude, "#1f77b4"), ("variation v_i over the training window", variation, "#ff7f0e")):
        arr = np.asarray(arr, dtype=float)
        mean = arr.mean(0)
        fig.add_trace(go.Bar(x=labels, y=mean, name=f"{name} (mean of {arr.shape[0]})", marker_color=color,
                             error_y=dict(type="data", symmetric=False, array=arr.max(0) - mean,
                                          arrayminus=mean - arr.min(0))))
    fig.update_layout(title=title, barmode="group")
    fig.update_xaxes(title="frequency pair i and its period 2π/θ_i (tokens)")
    fig.update_yaxes(title="nats")
    return fig


def reconstruction_figure(ranks, explained: dict, title: str) -> go.Figure:
    """Fraction of the kernel's window variance kept by the top-r pairs, per offset (mean, min..max)."""
    fig = go.Figure()
    for i, (name, arr) in enumerate(explained.items()):
        arr = np.asarray(arr, dtype=float)
        mean = arr.mean(0)
        fig.add_trace(go.Scatter(x=list(ranks), y=mean, mode="lines+markers", name=f"{name} (mean of {arr.shape[0]})",
                                 line=dict(color=SEED_COLORS[i % 10]),
                                 error_y=dict(type="data", symmetric=False, array=arr.max(0) - mean,
                                              arrayminus=mean - arr.min(0))))
    fig.update_layout(title=title)
    fig.update_xaxes(title="number of frequency pairs kept, r", dtick=1)
    fig.update_yaxes(title="variance of s(D) explained in the window (fraction)", range=[0, 1.05])
    return fig


def _int_or_none(label: str, value):
    return None if value is None else check_int(label, value)


def alias_vs_failure(alias_distance, failure_length, labels, longest_tested: int, alias_search: int,
                     title: str) -> go.Figure:
    """First aliasing distance of each model against the first length at which its accuracy drops.

    Censored values get their own row and column, so that "not seen" is never drawn as a number:
    a head that never failed up to ``longest_tested`` sits in the row "> longest_tested", and a head
    with no aliasing key within ``alias_search`` in the column "none up to alias_search"; each of
    the four cases has its own marker.

    Args:
        alias_distance: per model, the distance d of the first near-peak key beyond the window (None: none found).
        failure_length: per model, the first evaluated length with accuracy below threshold (None: never).
        labels: per model hover label.
        longest_tested: the longest evaluated length (tokens).
        alias_search: the largest distance searched for an alias (tokens).

    Raises:
        ValueError / TypeError: ``alias_distance`` or ``failure_length`` does not hold one int or None per
            label (the package's one per-model check), or a value lies beyond its search range.
    """
    n = len(labels)
    alias_distance = per_model("alias_distance", alias_distance, n, _int_or_none, shared=False)
    failure_length = per_model("failure_length", failure_length, n, _int_or_none, shared=False)
    if any(a is not None and a > alias_search for a in alias_distance):
        raise ValueError(f"alias_distance must be <= alias_search={alias_search} or None")
    if any(f is not None and f > longest_tested for f in failure_length):
        raise ValueError(f"failure_length must be <= longest_tested={longest_tested} or None")
    x_none, y_none = 2 ** (int(np.ceil(np.log2(alias_search + 2))) + 1), 2 * longest_tested  # an octave clear of any alias
    cases = {  # (alias found, failure seen): name, marker
        (True, True): ("alias and failure both seen", "circle"),
        (True, False): (f"no failure up to {longest_tested}", "triangle-up"),
        (False, True): (f"no alias up to {alias_search}", "triangle-right"),
        (False, False): ("neither", "diamond-open"),
    }
    fig = go.Figure(layout=dict(title=title))
    for (has_alias, has_fail), (name, symbol) in cases.items():
        rows = [i for i in range(n) if (alias_distance[i] is not None) == has_alias
                and (failure_length[i] is not None) == has_fail]
        if not rows:
            continue
        fig.add_trace(go.Scatter(
            x=[alias_distance[i] + 1 if has_alias else x_none for i in rows],
            y=[failure_length[i] if has_fail else y_none for i in rows],
            mode="markers", name=f"{name} ({len(rows)})", text=[labels[i] for i in rows],
            marker=dict(size=11, symbol=symbol, color="#1f77b4", opacity=0.75, line=dict(width=1.5, color="#1f77b4")),
            hovertemplate="%{text}<br>first length containing an alias: %{x}<br>first failing length: %{y}"))
    fig.add_trace(go.Scatter(x=[16, longest_tested], y=[16, longest_tested], mode="lines",
                             name="failure at the alias", line=dict(color="black", dash="dot")))
    fig.update_layout(title=title)
    x_ticks = [16 ** e for e in range(1, int(np.log2(x_none)) // 4 + 1) if 16 ** e < x_none / 2] + [x_none]
    y_ticks = [2 ** e for e in range(4, int(np.log2(longest_tested)) + 1)] + [y_none]
    fig.update_xaxes(title="first length with an aliasing key, d + 1 (tokens)", type="log", tickvals=x_ticks,
                     ticktext=[str(t) for t in x_ticks[:-1]] + [f"none<br>≤ {alias_search}"], tickangle=0)
    fig.update_yaxes(title="first length with accuracy < 0.95 (tokens)", type="log", tickvals=y_ticks,
                     ticktext=[str(t) for t in y_ticks[:-1]] + [f"> {longest_tested}"])
    return fig


def alias_kernel_figure(relative, aliases, failures, candidates, pairs, train_len: int, longest_tested: int,
                        title: str, tolerance: float = 1.0, y_range=(-12.0, 8.0)) -> go.Figure:
    """A RoPE head's kernel over a long range, relative to its target, with the aliases the frequency set predicts.

    One line per seed: ``s(-d) - s(-k)`` (nats) against the distance ``d = 1 .. n`` on a log axis; a key
    above the dotted line ``-tolerance`` gets at least ``exp(-tolerance)`` of the target's weight (an
    alias, :func:`~lengthgen_utils.analysis.kernel.first_alias_distance`). The candidate distances where the
    seeds' dominant pairs recur (:func:`~lengthgen_utils.analysis.kernel.predicted_alias_distance`) are a rug of
    ticks at the bottom; each seed's predicted first alias is a ring on its line (on the top edge when
    higher), and its first failing length ``L`` (the first evaluated length with accuracy below 0.95) a cross at the top, at
    ``d = L - 1``, the farthest key a sequence of that length holds. The live panel of chapter 4 draws
    the same traces in the browser (``_static/lengthgen_live.js``, ``kernelFigure``).

    Args:
        relative: ``[n_seeds, n]`` float, column ``d - 1`` holding ``s(-d) - s(-k)`` (nats).
        aliases: per seed, the predicted first alias distance (int) or None.
        failures: per seed, the first failing length (int) or None (none up to ``longest_tested``).
        candidates: candidate alias distances (ints in ``1 .. n``), increasing.
        pairs: the dominant pair indices the candidates come from (named in the legend).
        train_len: the training length (a dashed line at ``d = train_len - 1``, the window's edge).
        longest_tested: the longest evaluated length (tokens).
        title: figure title.
        tolerance: nats below the target that count as an alias (> 0).
        y_range: ``(low, high)`` of the y axis (nats): far keys can lie tens of nats above the target, and a
            fixed range keeps the threshold readable (higher values leave the plot at its top edge).

    Returns:
        a plotly ``Figure``.

    Raises:
        ValueError / TypeError: ``relative`` is not 2-d, ``aliases`` or ``failures`` do not hold one int or
            None per seed, a candidate lies outside ``1 .. n``, or ``train_len < 2``.
    """
    rel = np.asarray(relative, dtype=float)
    if rel.ndim != 2 or rel.shape[1] < 2:
        raise ValueError(f"relative must be [n_seeds, n >= 2]; got shape {rel.shape}")
    n_seeds, n = rel.shape
    aliases = per_model("aliases", aliases, n_seeds, _int_or_none, shared=False)
    failures = per_model("failures", failures, n_seeds, _int_or_none, shared=False)
    candidates = [check_int("candidates", c, minimum=1, maximum=n) for c in candidates]
    train_len = check_int("train_len", train_len, minimum=2)
    distances = np.arange(1, n + 1)
    y_low, top = (float(v) for v in y_range)
    if not y_low < -tolerance < top - 1:
        raise ValueError(f"y_range must hold the threshold -tolerance = {-tolerance:g} with a nat to spare above; "
                         f"got {y_range!r}")
    fig = go.Figure()
    for i, row in enumerate(rel):
        color = SEED_COLORS[i % len(SEED_COLORS)]
        alias, fail = aliases[i], failures[i]
        said_alias = "no alias" if alias is None else f"alias {alias}"
        said_fail = f"holds to {longest_tested}" if fail is None else f"fails at L = {fail}"
        fig.add_trace(go.Scatter(x=distances, y=row, mode="lines", name=f"seed {i}: {said_alias}, {said_fail}",
                                 line=dict(color=color, width=1.2), legendgroup=f"seed{i}",
                                 hovertemplate="d=%{x}: %{y:.2f} nats<extra></extra>"))
        if alias is not None:
            fig.add_trace(go.Scatter(x=[alias], y=[min(float(row[alias - 1]), top - 1)], mode="markers",
                                     showlegend=False,
                                     legendgroup=f"seed{i}", marker=dict(color=color, size=11, symbol="circle-open",
                                                                         line=dict(width=2.5)),
                                     hovertemplate=f"first alias: d={alias}<extra></extra>"))
        if fail is not None:
            fig.add_trace(go.Scatter(x=[fail - 1], y=[top - 0.4], mode="markers", showlegend=False,
                                     legendgroup=f"seed{i}", marker=dict(color=color, size=12, symbol="x-thin",
                                                                         line=dict(width=3, color=color)),
                                     hovertemplate=f"accuracy < 0.95 from L={fail}<extra></extra>"))
    fig.add_trace(go.Scatter(x=candidates, y=[y_low + 0.5] * len(candidates), mode="markers",
                             name=f"candidate aliases (pairs {', '.join(str(p) for p in pairs)} recur)",
                             marker=dict(color="#555", size=9, symbol="line-ns-open", line=dict(width=1)),
                             hovertemplate="candidate d=%{x}<extra></extra>"))
    fig.add_shape(type="line", xref="x domain", x0=0, x1=1, yref="y", y0=-tolerance, y1=-tolerance,
                  line=dict(color="black", dash="dot", width=1.5))
    fig.add_shape(type="line", xref="x", x0=train_len - 1, x1=train_len - 1, yref="y domain", y0=0, y1=1,
                  line=dict(color="gray", dash="dash", width=1))
    fig.add_annotation(text=f"{tolerance:g} nat below the target", showarrow=False, xref="x domain", x=1,
                       xanchor="right", yref="y", y=-tolerance, yanchor="top", bgcolor="rgba(255,255,255,0.7)")
    fig.add_annotation(text="training<br>window", showarrow=False, xref="x", x=float(np.log10(train_len - 1)),
                       xanchor="right", yref="y domain", y=1, yanchor="top", bgcolor="rgba(255,255,255,0.7)")
    ticks = [4 ** e for e in range(int(np.log(n) / np.log(4)) + 1)]
    fig.update_layout(title=title)
    fig.update_xaxes(title="distance d = −D (tokens, log scale)", type="log", range=[0, float(np.log10(n))],
                     tickvals=ticks, ticktext=[str(t) for t in ticks])
    fig.update_yaxes(title="s(−d) − s(−k) (nats)", range=[y_low, top])
    return fig


def _distractor_ratio(p):
    return 1.0 / np.clip(p, 1e-300, None) - 1.0


def dilution_panel(lengths, measured, exact, mean_field, title: str) -> go.Figure:
    """Distractor-to-target ratio 1/p - 1 of one model against length: one step of :func:`dilution_slider`.

    Args:
        lengths: ``[n]`` measured lengths; measured ``[n]`` target mass from the model.
        exact: ``(lengths_fine [f], p [f])`` exact kernel prediction on a fine grid.
        mean_field: ``(lengths_fine [f], p [f])`` mean-field law from training-window quantities.
        title: figure title.

    Returns:
        a plotly ``Figure`` with log axes, its y range fitted to this model's ratios.
    """
    p_exact, p_mf, measured = (np.asarray(p, dtype=float) for p in (exact[1], mean_field[1], measured))
    data = [go.Scatter(x=np.asarray(exact[0]), y=_distractor_ratio(p_exact), mode="lines", name="exact kernel sum",
                       line=dict(color="#1f77b4", width=3)),
            go.Scatter(x=np.asarray(mean_field[0]), y=_distractor_ratio(p_mf), mode="lines",
                       name="mean-field law (from the training window)",
                       line=dict(color="#555555", dash="dash", width=2.5)),
            go.Scatter(x=np.asarray(lengths), y=_distractor_ratio(measured), mode="markers",
                       name="measured in the model",
                       marker=dict(color="black", size=10, symbol="circle-open", line=dict(width=2)))]
    ys = np.concatenate([_distractor_ratio(p_exact), _distractor_ratio(p_mf), _distractor_ratio(measured)])
    ys = ys[ys > 0]
    y_range = [np.log10(ys.min()) - 0.3, np.log10(ys.max()) + 0.3] if ys.size else [-6, 1]
    fig = go.Figure(data=data)
    fig.update_layout(title=title)
    fig.update_xaxes(title="sequence length L (tokens, log scale)", type="log")
    fig.update_yaxes(title="1/p - 1 (distractor / target attention, log scale)", type="log", exponentformat="power",
                     range=[float(y) for y in y_range])
    return fig


def dilution_slider(lengths, measured, exact, mean_field, labels, title: str) -> go.Figure:
    """Distractor-to-target ratio 1/p - 1 against length, one slider step per model.

    Each step is the stand-alone :func:`dilution_panel` of its model.

    Args:
        lengths: ``[n]`` measured lengths; measured ``[M, n]`` target mass from the model.
        exact: ``(lengths_fine [f], p [M, f])`` exact kernel prediction on a fine grid.
        mean_field: ``(lengths_fine [f], p [M, f])`` mean-field law from training-window quantities.
        labels: ``[M]`` step names (e.g. "seed 3").

    Raises:
        ValueError: ``measured``, ``exact`` or ``mean_field`` does not hold one row per label.
    """
    labels = list(labels)
    measured = per_model_rows("measured", np.asarray(measured, dtype=float), max(len(labels), 1))
    p_exact = per_model_rows("exact", np.asarray(exact[1], dtype=float), len(labels))
    p_mf = per_model_rows("mean_field", np.asarray(mean_field[1], dtype=float), len(labels))
    return slider_figure({str(lab): dilution_panel(lengths, measured[i], (exact[0], p_exact[i]),
                                                   (mean_field[0], p_mf[i]), title)
                          for i, lab in enumerate(labels)}, "")


# --- chapter 6: linear-attention control and min-norm interpolant


def offset_kernels(curves: dict, train_len: int, target_offset: int, title: str,
                   y_title: str = "attention weight s(D), scaled so that s(-k) = 1",
                   colors: dict | None = None, dashed=None) -> go.Figure:
    """Offset kernels ``s(D)`` against the offset, with the training window shaded.

    Args:
        curves: ``{name: (offsets [n], values [n] or [n_seeds, n])}``; a 2-D array is drawn as its mean
            with a min..max band.
        train_len: the training offsets ``-(train_len-1) .. -1`` are shaded.
        target_offset: k; a dotted vertical line marks ``D = -k``.
        title: figure title.
        y_title: the y axis title (say what is plotted, with units).
        colors: optional ``{name: colour}`` (one colour per model across a chapter's figures).
        dashed: optional names of the curves drawn dashed (e.g. closed forms beside trained models);
            by default every second curve is dashed.

    Returns:
        a plotly ``Figure`` (x: relative position D = j - i in tokens, key minus query).

    Raises:
        ValueError: ``curves`` is empty, an array does not match its offsets, or ``dashed`` names a curve
            that ``curves`` does not hold.
    """
    if not curves:
        raise ValueError("curves must name at least one curve")
    if dashed is not None and not set(dashed) <= set(curves):
        raise ValueError(f"dashed must name curves of {sorted(curves)}; got {sorted(set(dashed) - set(curves))}")
    fig = go.Figure()
    palette = ["#2ca02c", "#1f77b4", "#ff7f0e", "#9467bd", "#393b79", "#8c564b"]
    for i, (name, (offsets, values)) in enumerate(curves.items()):
        offsets = np.asarray(offsets)
        values = np.atleast_2d(np.asarray(values, dtype=float))
        if values.shape[1] != len(offsets):
            raise ValueError(f"values for {name!r} must have {len(offsets)} columns; got {values.shape}")
        color = (colors or {}).get(name, palette[i % len(palette)])
        is_dashed = bool(i % 2) if dashed is None else name in dashed
        if values.shape[0] > 1:
            fig.add_trace(go.Scatter(x=np.concatenate([offsets, offsets[::-1]]),
                                     y=np.concatenate([values.max(0), values.min(0)[::-1]]), mode="lines",
                                     fill="toself", fillcolor=_rgba(color, 0.2), line=dict(width=0),
                                     hoverinfo="skip", showlegend=False, legendgroup=_label(name)))
        label = name if values.shape[0] == 1 else f"{name} (mean of {values.shape[0]})"
        fig.add_trace(go.Scatter(x=offsets, y=values.mean(0), mode="lines", name=label, legendgroup=_label(name),
                                 line=dict(color=color, width=2, dash="dash" if is_dashed else "solid")))
    fig.add_vrect(x0=-(train_len - 1) - 0.5, x1=-0.5, fillcolor="gray", opacity=0.12, line_width=0,
                  name="training window", showlegend=True)
    fig.add_vline(x=-target_offset, line=dict(color="black", dash="dot", width=1))
    fig.add_hline(y=0, line=dict(color="black", width=0.5))
    fig.update_layout(title=title)
    lo = min(float(np.asarray(offsets).min()) for offsets, _ in curves.values())
    fig.update_xaxes(title="relative position D = j − i (tokens)", range=[lo - 0.08 * (1 - lo), 1])  # clear of y ticks
    fig.update_yaxes(title=y_title)
    return fig


def _log_x_marker(fig: go.Figure, x: float, line: dict, text: str | None = None) -> None:
    """A vertical line at data value ``x`` on a log x axis, named ``text`` in the legend (when given).

    On a log axis plotly places shapes in data units (an annotation would take log10 units); the label
    is a legend entry of the shape, so it never sits on the data."""
    fig.add_vline(x=float(x), line=line, name=text, showlegend=bool(text))


def predicted_vs_measured(curves: dict, train_len: int, title: str,
                          y_title: str = "mean squared error ||o - e(y)||^2 (log scale)",
                          colors: dict | None = None) -> go.Figure:
    """A closed-form prediction (line) against measurements (markers: mean, error bars: min..max over seeds).

    Args:
        curves: ``{name: (lengths [n], predicted [n], measured [n_seeds, n])}``.
        train_len: drawn as a vertical line.
        title: figure title.
        colors: optional ``{name: colour}`` (one colour per model across a chapter's figures).

    Returns:
        a plotly ``Figure`` with log axes (x: sequence length in tokens).
    """
    if not curves:
        raise ValueError("curves must name at least one curve")
    fig = go.Figure()
    palette = ["#2ca02c", "#9467bd", "#1f77b4", "#ff7f0e"]
    for i, (name, (lengths, predicted, measured)) in enumerate(curves.items()):
        lengths = np.asarray(lengths)
        predicted = np.asarray(predicted, dtype=float)
        measured = np.atleast_2d(np.asarray(measured, dtype=float))
        if predicted.shape != lengths.shape or measured.shape[1] != len(lengths):
            raise ValueError(f"{name!r}: predicted must be [{len(lengths)}] and measured [n_seeds, {len(lengths)}]")
        color = (colors or {}).get(name, palette[i % len(palette)])
        mean = measured.mean(0)
        fig.add_trace(go.Scatter(x=lengths, y=predicted, mode="lines", name=f"{name}: predicted",
                                 line=dict(color=color, width=2)))
        fig.add_trace(go.Scatter(x=lengths, y=mean, mode="markers", name=f"{name}: measured (mean of {measured.shape[0]})",
                                 marker=dict(color=color, size=10, symbol="circle-open", line=dict(width=2)),
                                 error_y=dict(type="data", symmetric=False, array=measured.max(0) - mean,
                                              arrayminus=mean - measured.min(0))))
    _log_x_marker(fig, train_len, line=dict(color="gray", dash="dash", width=1.5), text="training length")
    fig.update_layout(title=title)
    ticks = sorted({int(x) for _, (lengths, _, _) in curves.items() for x in lengths} | {int(train_len)})
    fig.update_xaxes(title="evaluation sequence length L (tokens, log scale)", type="log", tickvals=ticks,
                     ticktext=[str(t) for t in ticks],
                     range=[float(np.log10(ticks[0])) - 0.1, float(np.log10(ticks[-1])) + 0.1])
    fig.update_yaxes(title=y_title, type="log", dtick="D2")  # label 1, 2, 5 per decade: the default crowds 2..9
    return fig


# --- transformer (chapter 7)
def accuracy_by_position(curves: dict, chance: float, train_len: int, title: str,
                         colors: dict | None = None) -> go.Figure:
    """Token accuracy at each position of a long sequence, mean over seeds with a min..max band.

    Args:
        curves: ``{name: accuracy [n_seeds, L]}`` (NaN where a position is never scored).
        chance: chance accuracy (dotted line).
        train_len: training length (dashed line: positions to its right were never trained).
        title: figure title.
        colors: optional ``{name: colour}`` (one colour per model across a chapter's figures).

    Returns:
        a plotly ``Figure``; below-chance means are flagged and fewer than 5 seeds noted, as in
        :func:`accuracy_vs_length`.

    Raises:
        ValueError: ``curves`` is empty, or an accuracy array is not 2-D.
    """
    if not curves:
        raise ValueError("curves must name at least one curve")
    fig = go.Figure()
    means, n_seeds = {}, []
    for i, (name, acc) in enumerate(curves.items()):
        acc = np.asarray(acc, dtype=float)
        if acc.ndim != 2:
            raise ValueError(f"accuracy for {name!r} must be [n_seeds, L]; got shape {acc.shape}")
        pos = np.arange(acc.shape[1])
        keep = ~np.isnan(acc).any(0)
        pos, acc = pos[keep], acc[:, keep]
        # flag on the mean over all scored positions: a single position's mean over a few
        # sequences dips below chance by sampling noise alone
        means[name], n_seeds = [acc.mean()], n_seeds + [acc.shape[0]]
        color = (colors or {}).get(name, _color(name, i))
        fig.add_trace(go.Scatter(x=np.concatenate([pos, pos[::-1]]), y=np.concatenate([acc.max(0), acc.min(0)[::-1]]),
                                 mode="lines", fill="toself", fillcolor=_rgba(color, 0.18), line=dict(width=0),
                                 hoverinfo="skip", showlegend=False))
        fig.add_trace(go.Scatter(x=pos, y=acc.mean(0), mode="lines", name=f"{_label(name)} (mean of {acc.shape[0]})",
                                 line=dict(color=color, width=2)))
    fig.add_hline(y=chance, line=dict(color="black", dash="dot", width=1.5), name=f"chance = {chance:.3f}",
                  showlegend=True)
    fig.add_vline(x=train_len - 0.5, line=dict(color="gray", dash="dash", width=1), name="training length",
                  showlegend=True)
    flag_below_chance(fig, means, chance)
    fig.update_layout(title=seed_note(title, min(n_seeds)))
    fig.update_xaxes(title="position t in the sequence (tokens)")
    fig.update_yaxes(title="token accuracy at position t (fraction)", range=[-0.02, 1.05])
    return fig


def head_offset_heatmap(profile, title: str, max_offset: int | None = None, value: str = "mean attention weight") -> go.Figure:
    """Heatmap of a per-head profile by distance: rows = (layer, head), columns = relative position ``D = -d``.

    Args:
        profile: ``[n_layers, n_heads, n_distances]`` (index ``d`` is the relative position ``D = -d``).
        title: figure title.
        max_offset: show relative positions ``0 .. -max_offset`` only.
        value: what the colour encodes (colour-bar title).
    """
    profile = np.asarray(profile, dtype=float)
    n_layers, n_heads, n_off = profile.shape
    n_off = n_off if max_offset is None else min(n_off, max_offset + 1)
    z = profile[:, :, :n_off].reshape(n_layers * n_heads, n_off)
    rows = [f"layer {l + 1} head {h + 1}" for l in range(n_layers) for h in range(n_heads)]
    fig = go.Figure(go.Heatmap(z=z, x=[-d for d in range(n_off)], y=rows, colorscale="Viridis",
                               colorbar=dict(title=dict(text=value, side="right")),
                               hovertemplate="%{y}, D = %{x}: %{z:.3f}<extra></extra>"))
    fig.update_layout(title=title, height=max(FIGURE_HEIGHT, 60 + 28 * len(rows)))
    fig.update_xaxes(title="relative position D = j − i (tokens)")  # left to right, as every offset axis of the book
    fig.update_yaxes(title="", autorange="reversed")
    return fig


# --- static explorers (web book sliders)
# What belongs to the figure that holds a slider rather than to one panel: its size and margins (room for the
# slider), the slider itself and the template. Everything else of a panel's layout is switched by its step.
_SLIDER_FRAME = frozenset({"height", "width", "margin", "autosize", "sliders", "updatemenus", "template"})
_LAYOUT_ARRAYS = frozenset({"annotations", "shapes", "images"})  # switched as whole arrays


def _plain(value):
    """``value`` with numpy arrays and scalars turned into lists and Python numbers (slider arguments are JSON)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
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

    for key, value in _plain(fig.layout.to_plotly_json()).items():
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

    A slider of more than :data:`SLIDER_LABELS_MAX` steps has no room on a phone's rail for their
    labels: its steps are numbered 1, 2, ... on the rail, and each panel names its step in full where
    plotly writes the current value (``slider_title`` + label + ``suffix``, e.g. "encoding: 7 of 12,
    ALiBi").

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
    if numbered:  # the rail shows numbers; each panel writes its full label where the current value goes
        n = len(figs)
        figs = {label: go.Figure(frame).add_annotation(
                    text=f"{slider_title}{i + 1} of {n}, {label}{suffix}", name="slider value", xref="paper", x=0,
                    xanchor="left", yref="paper", y=1, yanchor="bottom", yshift=SLIDER_VALUE_SHIFT, showarrow=False,
                    font=dict(size=13, color="#2a3f5f"))
                for i, (label, frame) in enumerate(figs.items())}
    fig, visible, relayout = _stacked_panels(list(figs.values()), active)
    steps = [dict(label=str(i + 1) if numbered else label, method="update", args=[{"visible": visible[i]}, relayout[i]])
             for i, label in enumerate(figs)]
    height = max(frame.layout.height or FIGURE_HEIGHT for frame in figs.values())  # fit_to_column adds the slider's room
    current = dict(visible=False) if numbered else dict(prefix=slider_title, suffix=suffix)
    fig.update_layout(height=height,
                      sliders=[dict(active=active, steps=steps, currentvalue=current,
                                    x=0.0, len=1.0, y=1.0, yanchor="bottom", pad=dict(t=0, b=18))])
    return fig


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
"""The few lines of page JavaScript behind :func:`grid_slider_figure`: when either slider moves, show the panel
that both sliders select (plotly's own sliders act one at a time)."""


def grid_slider_figure(panels: dict, slider_titles: tuple[str, str], active: tuple[int, int] = (0, 0)) -> go.Figure:
    """One figure with two sliders that act together: the panel shown is the one both sliders select.

    The panels form a grid: slider 1 picks the row, slider 2 the column. Every panel's traces are in the
    figure; which are visible, and each panel's own layout (title, annotations, shapes, axis ranges), are
    stored in ``layout.meta["grid"]``, and a few lines of page JavaScript (:data:`GRID_SCRIPT`, attached
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


def position_heatmaps(panels: dict, title: str, colorbar_title: str, train_len: int | None = None,
                      zmid: float | None = None, colorscale: str = "RdBu_r") -> go.Figure:
    """Side-by-side heatmaps of ``[L, L]`` matrices over (query position, key position).

    Args:
        panels: ``{panel title: matrix [L, L]}``, row = query position m, column = key
            position n; entries that should not be drawn (e.g. ``n > m``) are NaN.
        title: figure title.
        colorbar_title: what the colour shows, with units.
        train_len: when given, dashed lines mark the edge of the training range.
        zmid: colour midpoint (e.g. 0 for logits); None lets plotly choose.
        colorscale: a plotly colour scale name.

    Returns:
        a plotly ``Figure`` with one heatmap per panel (each with its own colour scale).

    Raises:
        ValueError: ``panels`` is empty or a matrix is not square.
    """
    from plotly.subplots import make_subplots

    _check_panels(panels)
    n = len(panels)
    # one panel under the other: side by side, two heatmaps and their colour bars do not fit a phone's column
    fig = make_subplots(rows=n, cols=1, subplot_titles=list(panels), vertical_spacing=0.12 if n > 1 else 0.0)
    for i, (name, z) in enumerate(panels.items()):
        z = np.asarray(z, dtype=float)
        if z.ndim != 2 or z.shape[0] != z.shape[1]:
            raise ValueError(f"panel {name!r} must be a square matrix [L, L]; got shape {z.shape}")
        domain = fig.layout[f"yaxis{i + 1 if i else ''}"].domain  # colour bar beside its own panel
        fig.add_trace(go.Heatmap(z=z, zmid=zmid, colorscale=colorscale,
                                 colorbar=dict(title=dict(text=colorbar_title, side="right"), x=1.0,
                                               xanchor="left", y=(domain[0] + domain[1]) / 2, yanchor="middle",
                                               len=domain[1] - domain[0], thickness=12),
                                 hovertemplate="query m=%{y}, key n=%{x}: %{z:.4g}<extra></extra>"),
                      row=i + 1, col=1)
        fig.update_xaxes(title="key position n (tokens)" if i == n - 1 else None, row=i + 1, col=1)
        fig.update_yaxes(title="query position m (tokens)", autorange="reversed", row=i + 1, col=1)
        if train_len is not None and train_len < z.shape[0]:
            line = dict(color="black", dash="dash", width=1)
            fig.add_vline(x=train_len - 0.5, line=line, row=i + 1, col=1)
            fig.add_hline(y=train_len - 0.5, line=line, row=i + 1, col=1)
    fig.update_layout(title=title, height=120 + 330 * n)
    return fig


def shift_differences(shifts, curves: dict, title: str, floor: float = 1e-9) -> go.Figure:
    """Largest logit change under a global position shift, one marker per seed, against the shift.

    Args:
        shifts: sequence of shifts (positions), all >= 1.
        curves: ``{name: differences [n_seeds, len(shifts)]}``; ``name`` picks the colour.
        title: figure title.
        floor: values below it (an exact 0) are drawn at ``floor`` so the log axis can show them.

    Returns:
        a plotly ``Figure`` with log-log axes.

    Raises:
        ValueError: ``curves`` is empty or a shape does not match ``shifts``.
    """
    _check_panels(curves, "curves")
    fig = go.Figure()
    for i, (name, diff) in enumerate(curves.items()):
        s = np.asarray(shifts[name] if isinstance(shifts, dict) else shifts, dtype=float)
        diff = np.asarray(diff, dtype=float)
        if diff.ndim != 2 or diff.shape[1] != len(s):
            raise ValueError(f"differences for {name!r} must be [n_seeds, {len(s)}]; got {diff.shape}")
        color = _color(name, i)
        x = np.repeat(s[None], diff.shape[0], 0).ravel()
        fig.add_trace(go.Scatter(x=x, y=np.maximum(diff.ravel(), floor), mode="markers", name=f"{_label(name)} (each seed)",
                                 marker=dict(color=color, size=9, opacity=0.7),
                                 hovertemplate="shift %{x:.0f}: max |Δ logit| = %{y:.2e}<extra></extra>"))
        fig.add_trace(go.Scatter(x=s, y=np.maximum(diff.max(0), floor), mode="lines", line=dict(color=color, dash="dot"),
                                 name=f"{_label(name)} (max over seeds)"))
    fig.update_layout(title=title)
    fig.update_xaxes(title="global position shift (tokens, log scale)", type="log")
    fig.update_yaxes(title="max |logit(shift) − logit(0)| (logit units, log scale)", type="log", exponentformat="power")
    return fig


def angle_errors(positions, errors: dict, title: str) -> go.Figure:
    """Largest RoPE angle error (over frequency pairs) against position, one line per dtype.

    Args:
        positions: sequence of positions [P].
        errors: ``{dtype name: error [P]}`` in radians (wrapped to [0, pi]).
        title: figure title.

    Returns:
        a plotly ``Figure`` with log-log axes and a dotted line at 1 radian.
    """
    _check_panels(errors, "errors")
    x = np.asarray(positions, dtype=float)
    fig = go.Figure()
    palette = ["#393b79", "#ff7f0e", "#1f77b4", "#2ca02c"]
    for i, (name, err) in enumerate(errors.items()):
        err = np.asarray(err, dtype=float)
        if err.shape != x.shape:
            raise ValueError(f"errors[{name!r}] must have shape {x.shape}; got {err.shape}")
        fig.add_trace(go.Scatter(x=x, y=np.maximum(err, 1e-12), mode="lines", name=name,
                                 line=dict(color=palette[i % len(palette)], width=2),
                                 hovertemplate="position %{x:.0f}: error %{y:.2e} rad<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="black", dash="dot", width=1.5), name="1 radian", showlegend=True)
    fig.update_layout(title=title)
    fig.update_xaxes(title="position (tokens, log scale)", type="log")
    fig.update_yaxes(title="max over pairs of |angle error| (radians, log scale)", type="log", exponentformat="power")
    return fig


def argmax_histogram(counts, train_len: int, marker_position: int | None, title: str,
                     marker_label: str = "L_train − 1 − k") -> go.Figure:
    """Histogram of the attention argmax over absolute positions, one bar group per seed.

    Args:
        counts: ``[n_seeds, P]`` counts per position (e.g. from
            :func:`lengthgen_utils.analysis.probes.attention_argmax_histogram`).
        train_len: longest training length; the training range is shaded.
        marker_position: a position to mark with a dashed line (e.g. ``L_train - 1 - k``), or None.
        title: figure title.
        marker_label: the marker line's name in the legend.

    Returns:
        a plotly ``Figure``: x = absolute key position, y = number of test lengths.
    """
    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise ValueError(f"counts must be [n_seeds, positions]; got shape {counts.shape}")
    used = np.nonzero(counts.sum(0))[0]
    x_max = int(max(used.max() if used.size else 0, train_len)) + 2
    fig = go.Figure()
    palette = PALETTE
    for i, row in enumerate(counts):
        fig.add_trace(go.Bar(x=np.arange(x_max), y=row[:x_max], name=f"seed {i}", marker_color=palette[i % 10],
                             hovertemplate=f"seed {i}: " + "argmax at position %{x} for %{y} lengths<extra></extra>"))
    fig.add_vrect(x0=-0.5, x1=train_len - 0.5, fillcolor="gray", opacity=0.12, line_width=0,
                  name="training positions", showlegend=True)
    if marker_position is not None:
        fig.add_vline(x=marker_position, line=dict(color="black", dash="dash", width=1.5),
                      name=f"{marker_label} = {marker_position}", showlegend=True)
    fig.update_layout(title=title, barmode="group", bargap=0.15)
    fig.update_xaxes(title="key position of the attention argmax (tokens)")
    fig.update_yaxes(title="number of test lengths")
    return fig


def attention_row_panel(row, train_len: int, target_offset: int | None, title: str,
                        x_max: int | None = None) -> go.Figure:
    """Attention row of every seed against absolute key position at one test length: one step of
    :func:`attention_row_slider`.

    Args:
        row: ``[n_seeds, L]`` attention weights in [0, 1].
        train_len: longest training length; the training positions are shaded.
        target_offset: when given, the target key ``L - 1 - k`` is marked.
        title: figure title.
        x_max: right end of the x axis (e.g. the longest length of a slider); default ``L``.

    Raises:
        ValueError: ``row`` is not 2-D.
    """
    a = np.asarray(row, dtype=float)
    if a.ndim != 2:
        raise ValueError(f"row must be [n_seeds, L]; got shape {a.shape}")
    seq_len = a.shape[1]
    data = [go.Scatter(x=np.arange(seq_len), y=r, mode="lines+markers", marker=dict(size=4),
                       line=dict(color=PALETTE[i % 10], width=1.5), name=f"seed {i}",
                       hovertemplate=f"seed {i}: " + "key %{x}: weight %{y:.3f}<extra></extra>")
            for i, r in enumerate(a)]
    if target_offset is not None:
        t = seq_len - 1 - target_offset
        data.append(go.Scatter(x=[t, t], y=[0, 1.02], mode="lines", line=dict(color="black", dash="dash", width=1),
                               name="target key L − 1 − k", hoverinfo="skip"))
    fig = go.Figure(data=data)
    fig.add_vrect(x0=-0.5, x1=train_len - 0.5, fillcolor="gray", opacity=0.12, line_width=0,
                  name="training positions", showlegend=True)
    fig.update_layout(title=title)
    fig.update_xaxes(title="absolute key position (tokens)", range=[-1, seq_len if x_max is None else x_max])
    fig.update_yaxes(title="attention weight of the query (fraction)", range=[-0.02, 1.05])
    return fig


def attention_row_slider(rows: dict, train_len: int, target_offset: int | None, title: str,
                         active: int | None = None) -> go.Figure:
    """Attention rows of every seed against absolute key position, with a slider over the test length.

    Works in static HTML: each slider step is the stand-alone :func:`attention_row_panel` of its
    length, all on the x axis of the longest length (so the row is seen to grow).

    Args:
        rows: ``{L: attention [n_seeds, L]}`` for each test length L (weights in [0, 1]).
        train_len: longest training length; the training positions are shaded.
        target_offset: when given, the target key ``L - 1 - k`` of each step is marked.
        title: figure title.
        active: the test length L (a key of ``rows``) shown when the page loads; default the shortest.

    Returns:
        a plotly ``Figure`` (:func:`slider_figure`) with steps labelled by L, in increasing order.

    Raises:
        ValueError: ``rows`` is empty, a row's width differs from its L, or ``active`` is not a key of
            ``rows``.
    """
    _check_panels(rows, "rows")
    lengths = sorted(rows)
    for L in lengths:
        a = np.asarray(rows[L], dtype=float)
        if a.ndim != 2 or a.shape[1] != L:
            raise ValueError(f"rows[{L}] must be [n_seeds, {L}]; got shape {a.shape}")
    if active is not None and (isinstance(active, bool) or active not in rows):
        raise ValueError(f"active must be one of the test lengths {lengths}; got active={active!r}")
    return slider_figure({str(L): attention_row_panel(rows[L], train_len, target_offset, title, max(lengths))
                          for L in lengths}, "test length L = ", suffix=" tokens",
                         active=0 if active is None else lengths.index(active))


def bar_by_setting(values: dict, title: str, y_title: str, chance: float | None = None,
                   color: str = "#2a3f5f") -> go.Figure:
    """One marker per seed and a bar for the mean, for each named setting.

    Args:
        values: ``{setting name: per-seed values [n_seeds]}``.
        title: figure title.
        y_title: y axis title with units.
        chance: when given, a dotted chance line (named in the legend).
        color: the bars' and markers' colour, ``"#rrggbb"`` (default: neutral slate; pass an encoding's
            ``color`` when every setting is that encoding).

    Raises:
        ValueError: ``values`` is empty, or ``color`` is not ``"#rrggbb"``.

    Returns:
        a plotly ``Figure``.
    """
    _check_panels(values, "values")
    values = {n: np.asarray(v, dtype=float).ravel() for n, v in values.items()}
    names = [wrap_text(n, 9) for n in values]  # category labels on short lines: they sit side by side
    values = dict(zip(names, values.values()))
    fig = go.Figure()
    if not (isinstance(color, str) and re.fullmatch(r"#[0-9a-fA-F]{6}", color)):
        raise ValueError(f"color must be '#rrggbb'; got {color!r}")
    fig.add_trace(go.Bar(x=names, y=[float(np.mean(values[n])) for n in names], name="mean over seeds",
                         marker_color=_rgba(color, 0.35)))
    xs = [n for n in names for _ in values[n]]
    ys = [float(v) for n in names for v in values[n]]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="each seed", marker=dict(color=color, size=8)))
    if chance is not None:
        fig.add_hline(y=chance, line=dict(color="black", dash="dot", width=1.5), name=f"chance = {chance:.3f}",
                      showlegend=True)
    fig.update_layout(title=title)
    fig.update_yaxes(title=y_title)
    return fig


def logit_rows_by_offset(panels: dict, title: str, target_offset: int | None = None,
                         min_offset: int | None = None) -> go.Figure:
    """Score rows of the query at several lengths, drawn against the offset ``j - (L-1)``.

    Args:
        panels: ``{panel title: {L: score row [L]}}``; each row is drawn at offsets ``-(L-1) .. 0``.
        title: figure title.
        target_offset: when given, the target offset ``-k`` is marked.
        min_offset: when given, the x axis starts there (e.g. ``-47``: the offsets near the
            query); the rest of each row is reached by zooming out.

    Returns:
        a plotly ``Figure`` with one panel per entry of ``panels`` (shared y axis).

    Raises:
        ValueError: ``panels`` is empty or a row's width differs from its L.
    """
    from plotly.subplots import make_subplots

    _check_panels(panels)
    n = len(panels)  # one panel under the other (side by side they do not fit a phone's column)
    fig = make_subplots(rows=n, cols=1, subplot_titles=list(panels), shared_xaxes=True, vertical_spacing=0.14)
    dashes = ["solid", "dot", "dash", "dashdot"]
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#393b79"]
    for c, (name, rows) in enumerate(panels.items()):
        for i, (L, row) in enumerate(sorted(rows.items())):
            row = np.asarray(row, dtype=float)
            if row.shape != (L,):
                raise ValueError(f"panels[{name!r}][{L}] must have shape ({L},); got {row.shape}")
            fig.add_trace(go.Scatter(x=np.arange(-(L - 1), 1), y=row, mode="lines+markers", marker=dict(size=5),
                                     line=dict(color=palette[i % 4], dash=dashes[i % 4], width=2),
                                     name=f"L = {L}", legendgroup=str(L), showlegend=c == 0,
                                     hovertemplate=f"L={L}, " + "D = %{x}: logit %{y:.5g}<extra></extra>"),
                          row=c + 1, col=1)
        fig.update_xaxes(title="relative position D = j − (L−1) (tokens)" if c == n - 1 else None, row=c + 1, col=1,
                         range=None if min_offset is None else [min_offset - 0.5, 0.5])
        fig.update_yaxes(title="logit s(D)", row=c + 1, col=1)
        if target_offset is not None:
            fig.add_vline(x=-target_offset, line=dict(color="black", dash="dash", width=1), row=c + 1, col=1)
    fig.update_layout(title=title, height=120 + 260 * n)
    return fig


def per_position_curves(curves: dict, title: str, y_title: str, train_len: int | None = None,
                        log_y: bool = False, floor: float = 1e-12, x_max: int | None = None) -> go.Figure:
    """A per-position quantity (e.g. per-row gradient norm) against absolute position: mean line, min..max band.

    Args:
        curves: ``{name: values [n_seeds, P]}`` for positions ``0 .. P-1``.
        title: figure title.
        y_title: y axis title with units.
        train_len: when given, the training positions are shaded.
        log_y: log y axis; values below ``floor`` (exact zeros) are drawn at ``floor``.
        x_max: when given, the x axis shows positions ``0 .. x_max`` only (e.g. where the curves are
            informative); every position is still drawn and is reached by zooming out.

    Returns:
        a plotly ``Figure``.

    Raises:
        ValueError: ``curves`` is empty, a curve is not ``[n_seeds, positions]``, or ``x_max < 1``.
        TypeError: ``x_max`` is not an int.
    """
    _check_panels(curves, "curves")
    if x_max is not None:
        check_int("x_max", x_max, minimum=1)
    fig = go.Figure()
    palette = [LearnedAPE.color, "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd"]  # rows of an APE table: APE first
    for i, (name, v) in enumerate(curves.items()):
        v = np.asarray(v, dtype=float)
        if v.ndim != 2:
            raise ValueError(f"curves[{name!r}] must be [n_seeds, positions]; got shape {v.shape}")
        if log_y:
            v = np.maximum(v, floor)
        x = np.arange(v.shape[1])
        color = palette[i % len(palette)]
        fig.add_trace(go.Scatter(x=np.concatenate([x, x[::-1]]), y=np.concatenate([v.max(0), v.min(0)[::-1]]),
                                 mode="lines", fill="toself", fillcolor=_rgba(color, 0.18), line=dict(width=0),
                                 hoverinfo="skip", showlegend=False))
        fig.add_trace(go.Scatter(x=x, y=v.mean(0), mode="lines", name=f"{name} (mean of {v.shape[0]})",
                                 line=dict(color=color, width=2),
                                 hovertemplate="position %{x}: %{y:.3g}<extra></extra>"))
    if train_len is not None:
        fig.add_vrect(x0=-0.5, x1=train_len - 0.5, fillcolor="gray", opacity=0.12, line_width=0,
                      name="training positions", showlegend=True)
    fig.update_layout(title=title)
    fig.update_xaxes(title="absolute position t (row of the APE table)",
                     range=None if x_max is None else [-0.5, x_max + 0.5])
    fig.update_yaxes(title=y_title, type="log" if log_y else "linear", exponentformat="power" if log_y else None)
    return fig


# --- decisive evidence: nulls, aliases, regimes (chapters 4 and 5)
def measure_vs_nulls(groups: dict, measure: str, title: str, y_title: str | None = None) -> go.Figure:
    """One measure's distribution in trained heads and in each null, as box plots side by side.

    Args:
        groups: ``{group name: values [n]}`` in display order (e.g. trained heads first, then the nulls).
        measure: the measure's name (axis title unless ``y_title`` is given).
        title: figure title.

    Returns:
        a plotly ``Figure``: one box per group (median line, quartile box, whiskers to 1.5 IQR, outliers).

    Raises:
        ValueError: no groups, or an empty group.
    """
    if not groups:
        raise ValueError("groups must hold at least one group")
    fig = go.Figure()
    for i, (name, values) in enumerate(groups.items()):
        values = np.asarray(values, dtype=float).ravel()
        if values.size == 0:
            raise ValueError(f"group {name!r} is empty")
        fig.add_trace(go.Box(y=values, name=f"{name}<br>n={values.size}", marker_color=PALETTE[i % 10],
                             boxpoints="outliers" if values.size > 200 else "all", jitter=0.4, pointpos=0,
                             marker=dict(size=4), line=dict(width=1.5)))
    fig.update_layout(title=title, showlegend=False)
    fig.update_yaxes(title=y_title or measure)
    return fig


def censored_scatter(x, y, labels, x_limit: int, y_limit: int, x_title: str, y_title: str, title: str,
                     x_none: str | None = None, y_none: str | None = None, diagonal: str = "prediction = measurement",
                     groups=None) -> go.Figure:
    """A prediction against a measurement on log axes, where either may be "none up to a limit".

    ``None`` in ``x`` (``y``) is drawn in a column (row) of its own beyond ``x_limit`` (``y_limit``),
    labelled ``x_none`` (``y_none``), so that "not seen" is never drawn as a number.

    Args:
        x, y: per model, a positive number or None.
        labels: per model hover text.
        x_limit, y_limit: the largest value that could have been seen on each axis.
        x_title, y_title, title: axis and figure titles.
        x_none, y_none: tick text of the censored column / row (default ``"none ≤ limit"``).
        diagonal: legend text of the dotted ``y = x`` line.
        groups: optional per-model group names (one colour and legend entry each).

    Raises:
        ValueError: lengths differ, or a value lies beyond its limit.
    """
    n = len(labels)
    if len(x) != n or len(y) != n:
        raise ValueError(f"x, y and labels must have one entry per model; got {len(x)}, {len(y)}, {n}")
    if any(v is not None and v > x_limit for v in x) or any(v is not None and v > y_limit for v in y):
        raise ValueError(f"x values must be <= x_limit={x_limit} and y values <= y_limit={y_limit}, or None")
    groups = ["heads"] * n if groups is None else list(groups)
    x_cens, y_cens = 2 ** (int(np.ceil(np.log2(x_limit))) + 1), 2 ** (int(np.ceil(np.log2(y_limit))) + 1)
    fig = go.Figure()
    for gi, group in enumerate(dict.fromkeys(groups)):
        rows = [i for i in range(n) if groups[i] == group]
        fig.add_trace(go.Scatter(
            x=[x[i] if x[i] is not None else x_cens for i in rows], y=[y[i] if y[i] is not None else y_cens for i in rows],
            mode="markers", name=f"{group} ({len(rows)})", text=[labels[i] for i in rows],
            marker=dict(size=10, color=PALETTE[gi % 10], opacity=0.7, line=dict(width=1, color="white")),
            hovertemplate="%{text}<br>x: %{x}<br>y: %{y}<extra></extra>"))
    low = 8
    fig.add_trace(go.Scatter(x=[low, max(x_cens, y_cens)], y=[low, max(x_cens, y_cens)], mode="lines", name=diagonal,
                             line=dict(color="black", dash="dot")))
    fig.update_layout(title=title)

    def ticks(limit, cens, none, step=2, first=low):
        vals = [2 ** e for e in range(3, int(np.log2(cens))) if first <= 2 ** e <= limit][::step] + [cens]
        return vals, [str(v) for v in vals[:-1]] + [none or f"none ≤ {limit}"]

    # x labels sit side by side: over more than 10 octaves label every 16x, so that they fit a phone
    xv, xt = ticks(x_limit, x_cens, x_none, step=4 if np.log2(x_cens / low) > 10 else 2)
    yv, yt = ticks(y_limit, y_cens, y_none, first=4 * low)  # the corner holds the x axis's first label
    # room right of the censored column for half its label (plotly hides a tick label that passes the figure)
    fig.update_xaxes(title=x_title, type="log", tickvals=xv, ticktext=xt, tickangle=0,
                     range=[np.log10(low), np.log10(x_cens) + 0.35])
    fig.update_yaxes(title=y_title, type="log", tickvals=yv, ticktext=yt, range=[np.log10(low), np.log10(y_cens) + 0.15])
    return fig


def accuracy_heatmap(accuracy, lengths, labels, chance: float, title: str, marks=None,
                     mark_name: str = "marked length") -> go.Figure:
    """Accuracy of every head (rows) at every length (columns): where each head falls, and how fast.

    Args:
        accuracy: ``[M, n]`` accuracies; lengths: ``n`` tokens; labels: ``M`` row names.
        chance: chance accuracy (the colour scale runs from chance to 1).
        title: figure title.
        marks: optional, per row, one of ``lengths`` to mark with a white-edged circle (e.g. the first
            length that holds a predicted alias), or None for no mark in that row.
        mark_name: the legend text of the marks.

    Returns:
        a plotly ``Figure``; the x axis labels every other octave of ``lengths`` (so that the labels fit
        a phone's column).

    Raises:
        ValueError: ``accuracy`` is not ``[len(labels), len(lengths)]``, or a mark is not one of ``lengths``.
        TypeError: ``marks`` does not hold one value per row.
    """
    accuracy = np.asarray(accuracy, dtype=float)
    if accuracy.shape != (len(labels), len(lengths)):
        raise ValueError(f"accuracy must be [len(labels), len(lengths)] = [{len(labels)}, {len(lengths)}]; "
                         f"got {accuracy.shape}")
    names = [str(L) for L in lengths]
    fig = go.Figure(go.Heatmap(z=accuracy, x=names, y=list(labels), zmin=chance, zmax=1.0,
                               colorscale="Viridis", colorbar=dict(title=dict(text="accuracy", side="right")),
                               hovertemplate="%{y}, L = %{x}: accuracy %{z:.2f}<extra></extra>"))
    if marks is not None:
        allowed = {int(L) for L in lengths}

        def check_mark(label, value):
            value = _int_or_none(label, value)
            if value is not None and value not in allowed:
                raise ValueError(f"{label} must be one of lengths {sorted(allowed)} or None; got {value}")
            return value

        marks = per_model("marks", marks, len(labels), check_mark, shared=False)
        rows = [i for i, m in enumerate(marks) if m is not None]
        fig.add_trace(go.Scatter(x=[str(marks[i]) for i in rows], y=[labels[i] for i in rows], mode="markers",
                                 name=mark_name, marker=dict(symbol="circle", size=9, color="white",
                                                             line=dict(width=1.5, color="black")),
                                 hovertemplate="%{y}: " + mark_name + " %{x}<extra></extra>"))
        fig.update_layout(showlegend=True)
    octaves = [name for L, name in zip(lengths, names) if float(np.log2(L / lengths[0])) % 2 == 0]
    fig.update_layout(title=title, height=max(FIGURE_HEIGHT, 120 + 14 * len(labels)))
    fig.update_xaxes(title="sequence length L (tokens)", type="category", tickangle=0, tickvals=octaves)
    # every row named (plotly would thin the labels of a long category axis)
    fig.update_yaxes(title="", autorange="reversed", tickfont=dict(size=10), tickmode="array",
                     tickvals=list(labels))
    return fig


def _r2_scatter(x, r2, kind, labels, title: str, x_hover: str, floor: float, threshold: float,
                symbol_by) -> go.Figure:
    """The body of :func:`r2_vs_margin` and :func:`r2_vs_reach`: one marker per head, coloured by ``kind``."""
    x, r2 = np.asarray(x, dtype=float), np.asarray(r2, dtype=float)
    n = len(labels)
    if x.shape != (n,) or r2.shape != (n,) or len(kind) != n:
        raise ValueError(f"x, r2, kind and labels must have one entry per head ({n})")
    symbols = ["circle", "square", "diamond", "triangle-up", "cross", "x", "star", "triangle-down"]
    regimes = list(dict.fromkeys(symbol_by)) if symbol_by is not None else [None]
    fig = go.Figure()
    for ki, k in enumerate(dict.fromkeys(kind)):
        for ri, regime in enumerate(regimes):
            rows = [i for i in range(n) if kind[i] == k and (regime is None or symbol_by[i] == regime)]
            if not rows:
                continue
            fig.add_trace(go.Scatter(
                x=x[rows], y=np.maximum(r2[rows], floor), mode="markers",
                name=f"{k}" + (f", {regime}" if regime is not None else "") + f" ({len(rows)})",
                text=[f"{labels[i]}: R² = {r2[i]:.3g}" for i in rows],
                marker=dict(size=9, color=PALETTE[ki % 10], symbol=symbols[ri % len(symbols)], opacity=0.75),
                hovertemplate="%{text}<br>" + x_hover + "<extra></extra>"))
    fig.add_hline(y=threshold, line=dict(color="gray", dash="dash"), name=f"R² = {threshold}", showlegend=True)
    fig.update_layout(title=title)
    fig.update_yaxes(title=f"R² of the long-run law (clipped at {floor:g})", range=[floor - 0.05, 1.05])
    return fig


def r2_vs_margin(margin, r2, kind, labels, title: str, floor: float = -1.0, threshold: float = 0.9,
                 symbol_by=None) -> go.Figure:
    """The law's R^2 of each head against its margin, coloured by how its accuracy falls.

    Args:
        margin: per head, target logit minus the best other logit in the training window (nats).
        r2: per head, the coefficient of determination of the law (drawn clipped at ``floor``).
        kind: per head, how accuracy falls (e.g. ``"cliff"``, ``"gradual"``, ``"holds"``): one colour each.
        labels: per head hover text.
        threshold: drawn as a dashed line (the R^2 the law must reach).
        symbol_by: optional per-head regime names (one marker symbol each).

    Raises:
        ValueError: the per-head arguments differ in length.
    """
    fig = _r2_scatter(margin, r2, kind, labels, title, "margin %{x:.2f} nats", floor, threshold, symbol_by)
    fig.update_xaxes(title="margin in the training window (nats)")
    return fig


def r2_vs_reach(reach, r2, kind, labels, title: str, alias_side: float = 1.0, law_side: float = 20.0,
                floor: float = -1.0, threshold: float = 0.9, symbol_by=None) -> go.Figure:
    """The law's R^2 of each head against ``n e^-kappa``, how often ``n`` keys meet the peaks of ``e^s``.

    Chapter 5's boundary: the long-run law can describe a head's target mass only where
    ``n e^-kappa >> 1``; where ``n e^-kappa <~ 1`` a few large terms (aliases) rule the sum. The two
    sides are shaded.

    Args:
        reach: per head, ``n e^-kappa`` (> 0; drawn on a log axis).
        r2: per head, the coefficient of determination of the law (drawn clipped at ``floor``).
        kind: per head, how accuracy falls (one colour each).
        labels: per head hover text.
        alias_side: heads at or below this reach are the side where aliases must dominate.
        law_side: heads at or above this reach are the side where the law must hold.
        threshold: drawn as a dashed line (the R^2 the law must reach).
        symbol_by: optional per-head regime names (one marker symbol each).

    Raises:
        ValueError: the per-head arguments differ in length, a reach is not positive, or
            ``alias_side >= law_side``.

    Source: chapter 5, "The long-run law" (the orbit average and its peakiness kappa).
    """
    reach = np.asarray(reach, dtype=float)
    if not (reach > 0).all():
        raise ValueError(f"reach must be positive (a log axis); got min {reach.min():.3g}")
    if not 0 < alias_side < law_side:
        raise ValueError(f"alias_side and law_side must satisfy 0 < alias_side < law_side; "
                         f"got {alias_side}, {law_side}")
    fig = _r2_scatter(reach, r2, kind, labels, title, "n e^-κ = %{x:.3g}", floor, threshold, symbol_by)
    lo = float(np.log10(min(reach.min(), alias_side))) - 0.3
    hi = float(np.log10(max(reach.max(), law_side))) + 0.3
    # the two sides, named in the legend (shapes take data units on a log axis)
    fig.add_vrect(x0=10 ** lo, x1=alias_side, fillcolor="#393b79", opacity=0.08, line_width=0,
                  name=f"n e^-κ ≤ {alias_side:g}: aliases' side", showlegend=True)
    fig.add_vrect(x0=law_side, x1=10 ** hi, fillcolor="#2ca02c", opacity=0.1, line_width=0,
                  name=f"n e^-κ ≥ {law_side:g}: the law's side", showlegend=True)
    fig.update_xaxes(title="n e^-κ (log scale)", type="log", range=[lo, hi], exponentformat="power")
    fig.update_yaxes(range=[floor - 0.3, 1.05])
    return fig


def scaled_vs_plain_mass(lengths, plain, scaled, title: str) -> go.Figure:
    """Target attention mass against length with and without a length-aware logit scale (mean, min..max band).

    Args:
        lengths: ``n`` tokens; plain, scaled: ``[M, n]`` target mass of the same heads.
    """
    fig = go.Figure()
    for i, (name, values) in enumerate((("plain softmax", plain), ("log-length scaled logits", scaled))):
        values = np.asarray(values, dtype=float)
        color = PALETTE[i]
        fig.add_trace(go.Scatter(x=list(lengths) + list(lengths)[::-1],
                                 y=list(values.max(0)) + list(values.min(0))[::-1], fill="toself",
                                 fillcolor=_rgba(color, 0.15), line=dict(width=0), hoverinfo="skip", showlegend=False))
        fig.add_trace(go.Scatter(x=list(lengths), y=values.mean(0), mode="lines+markers", name=name,
                                 line=dict(color=color, width=2.5, dash="solid" if i == 0 else "dash")))
    fig.update_layout(title=title)
    fig.update_xaxes(title="sequence length L (tokens, log scale)", type="log")
    fig.update_yaxes(title="attention mass on the target, p(L)", range=[0, 1.02])
    return fig


def distractor_ratio_by_head(lengths, plain, scaled, title: str, train_len: int | None = None) -> go.Figure:
    """The distractor-to-target weight ``1/p - 1`` of each head against length, plain and scaled logits.

    One thin line per head and setting (a log axis: a band of min..max would hide the heads), solid for
    plain logits and dashed for a length-aware logit scale.

    Args:
        lengths: ``n`` tokens.
        plain, scaled: ``[M, n]`` target mass ``p`` of the same heads (each in ``(0, 1]``).
        title: figure title.
        train_len: drawn as a vertical line (optional).

    Returns:
        a plotly ``Figure`` with log axes.

    Raises:
        ValueError: ``plain`` and ``scaled`` are not both ``[M, n]`` with ``n = len(lengths)``, or a mass is
            outside ``(0, 1]``.

    Source: chapter 5, "Intervening on the law".
    """
    lengths = np.asarray(lengths)
    plain, scaled = np.asarray(plain, dtype=float), np.asarray(scaled, dtype=float)
    if plain.ndim != 2 or plain.shape != scaled.shape or plain.shape[1] != len(lengths):
        raise ValueError(f"plain and scaled must both be [M, {len(lengths)}]; got {plain.shape}, {scaled.shape}")
    if not ((plain > 0) & (plain <= 1) & (scaled > 0) & (scaled <= 1)).all():
        raise ValueError("plain and scaled must hold target masses p in (0, 1]")
    fig = go.Figure()
    ratios = []
    for i, (name, p, dash) in enumerate((("plain softmax", plain, "solid"),
                                         ("logits times c_L", scaled, "dash"))):
        color = PALETTE[i]
        for m, row in enumerate(p):
            ratio = _distractor_ratio(row)
            ratios.append(ratio)
            fig.add_trace(go.Scatter(x=lengths, y=ratio, mode="lines", name=f"{name} ({len(p)} heads)",
                                     legendgroup=name, showlegend=m == 0,
                                     line=dict(color=color, width=1.5, dash=dash), opacity=0.8,
                                     hovertemplate=f"head {m}, {name}: " + "L=%{x}: 1/p - 1 = %{y:.2e}<extra></extra>"))
    if train_len is not None:
        _log_x_marker(fig, train_len, line=dict(color="gray", dash="dot", width=1))
    ys = np.concatenate(ratios)
    ys = ys[ys > 0]
    fig.update_layout(title=title)
    fig.update_xaxes(title="sequence length L (tokens, log scale)", type="log", tickvals=lengths.tolist(),
                     ticktext=[str(int(L)) if i % 2 == 0 else "" for i, L in enumerate(lengths)],
                     range=[float(np.log10(lengths.min())) - 0.1, float(np.log10(lengths.max())) + 0.1])
    fig.update_yaxes(title="1/p − 1: distractors' weight / target's (log scale)", type="log",
                     exponentformat="power",
                     range=[float(np.log10(ys.min())) - 0.3, float(np.log10(ys.max())) + 0.3] if ys.size else None)
    return fig


# --- chapter 6: reference curves beside trained ensembles
def add_reference_curves(fig: go.Figure, curves: dict, colors: dict | None = None) -> go.Figure:
    """Add single curves (closed forms, not ensembles) to a figure made by :func:`accuracy_vs_length`.

    A reference curve is one computed value per length (e.g. the accuracy of the min-norm interpolant
    itself), so it is drawn dashed, without a band and without counting as seeds in the title.

    Args:
        fig: a figure from :func:`accuracy_vs_length` (its x axis is ``log2(L)``).
        curves: ``{name: (lengths [n], values [n])}``.
        colors: optional ``{name: colour}``.

    Returns:
        ``fig``, with one dashed line per curve.

    Raises:
        ValueError: ``curves`` is empty or a curve's values do not match its lengths.
    """
    if not curves:
        raise ValueError("curves must name at least one curve")
    for i, (name, (lengths, values)) in enumerate(curves.items()):
        lengths = np.asarray(lengths)
        values = np.asarray(values, dtype=float)
        if values.shape != lengths.shape:
            raise ValueError(f"values for {name!r} must have shape {lengths.shape}; got {values.shape}")
        color = (colors or {}).get(name, PALETTE[(i + 5) % len(PALETTE)])
        fig.add_trace(go.Scatter(x=np.log2(lengths), y=values, mode="lines+markers", name=str(name),
                                 line=dict(color=color, width=2, dash="dash"), marker=dict(symbol="diamond"),
                                 customdata=lengths, hovertemplate="L=%{customdata:d}: %{y:.3f}<extra></extra>"))
    return fig


# --- chapter 7: trained heads against an untrained null
def trained_vs_null(groups: dict, title: str, y_title: str, null_names=("untrained",),
                    trained_name: str = "trained") -> go.Figure:
    """A statistic of trained heads (one marker each) beside its null distributions (box plots), per group.

    Args:
        groups: ``{group: {"trained": values [n], "<null name>": values [m], ...}}``, e.g. one group per
            offset ``k``; every null named in ``null_names`` must be present (it may be empty).
        title: figure title.
        y_title: the statistic, with units.
        null_names: the null distributions to draw, in order.
        trained_name: the key of the trained heads' values.

    Returns:
        a plotly ``Figure``: for each group, one box per null (median, quartiles, whiskers to 1.5 IQR,
        every value drawn as a point) and the trained heads as large markers.

    Raises:
        ValueError: no group, or a group without the trained values or a null.
    """
    if not groups:
        raise ValueError("groups must name at least one group")
    fig = go.Figure()
    null_colors = ["#7f7f7f", "#bcbd22", "#17becf"]
    for j, null in enumerate(null_names):
        xs, ys = [], []
        for group, values in groups.items():
            if null not in values or trained_name not in values:
                raise ValueError(f"group {group!r} must hold {trained_name!r} and {null!r}; got {sorted(values)}")
            v = np.asarray(values[null], dtype=float).ravel()
            xs += [str(group)] * len(v)
            ys += v.tolist()
        fig.add_trace(go.Box(x=xs, y=ys, name=f"{null} (null)", boxpoints="all", jitter=0.4, pointpos=0,
                             marker=dict(color=null_colors[j % len(null_colors)], size=4), line=dict(width=1),
                             offsetgroup=str(j)))
    xs = [str(g) for g, v in groups.items() for _ in np.asarray(v[trained_name]).ravel()]
    ys = [float(x) for v in groups.values() for x in np.asarray(v[trained_name], dtype=float).ravel()]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=f"{trained_name} (each seed)",
                             marker=dict(color="#1f77b4", size=11, symbol="diamond", line=dict(width=1, color="white"))))
    fig.update_layout(title=title, boxmode="group")
    fig.update_yaxes(title=y_title)
    return fig


# --- the encoding zoo (chapter 9)
class Table:
    """A table that a notebook shows as HTML (in the web book) and ``print`` shows as aligned text.

    A thin layer over pandas (its ``DataFrame`` for text, its ``Styler`` for HTML), so every printed
    table of the book looks the same: no index column, a caption above, the column's width at the page's.

    Args:
        header: column titles.
        cells: rows, one value per column (formatted with ``str``).
        caption: a line above the table.

    Raises:
        ValueError: a row whose length differs from the header's.
    """

    def __init__(self, header, cells, caption: str = ""):
        import pandas as pd

        self.header = [str(h) for h in header]
        self.cells = [[str(c) for c in row] for row in cells]
        for i, row in enumerate(self.cells):
            if len(row) != len(self.header):
                raise ValueError(f"row {i} has {len(row)} cells; the header has {len(self.header)}")
        self.caption = caption
        self.frame = pd.DataFrame(self.cells, columns=self.header)

    @classmethod
    def from_rows(cls, rows: list[dict], caption: str = "") -> "Table":
        """A table of ``rows``, one dict per row with the same keys (the column titles, in order)."""
        if not rows:
            raise ValueError("rows must hold at least one row")
        header = list(rows[0])
        return cls(header, [[row[h] for h in header] for row in rows], caption)

    def __str__(self) -> str:
        text = self.frame.to_string(index=False, justify="left")
        return f"{self.caption}\n{text}" if self.caption else text

    __repr__ = __str__

    def _repr_html_(self) -> str:
        styler = (self.frame.style.hide(axis="index").format(escape="html")
                  .set_table_attributes('class="lengthgen-table"'))
        if self.caption:
            styler = styler.set_caption(self.caption)
        return f'<div style="overflow-x:auto">{styler.to_html()}</div>'


def encoding_panels(curves: dict, attention, train_len: int, target: int, chance: float, title: str,
                    color: str, visited: int | None = None) -> go.Figure:
    """One encoding in two panels: accuracy against length on each task (left), and where the trained query
    attends at the longest length (right). Frames for :func:`slider_figure` (the panels share axes and shapes).

    Args:
        curves: ``{task name: (length multiples [n], accuracy [n_seeds, n], dash)}``, e.g.
            ``{"retrieval": ([1, 2, 4, 8, 16], acc, "solid")}``; drawn as mean with a min..max band.
        attention: ``[n_seeds, L]`` attention weights of the query (position ``L-1``) at the longest length.
        train_len: training length of the attention panel's task; its positions are shaded.
        target: the target key ``L - 1 - k``, marked.
        chance: chance accuracy (dotted line, left panel).
        title: the frame's title.
        color: the encoding's colour.
        visited: when given and beyond ``train_len``, the last position training visited is marked.

    Returns:
        a plotly ``Figure`` with two subplots.

    Raises:
        ValueError: an accuracy array that does not match its multiples, or ``attention`` not 2-D.
    """
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14,
                        subplot_titles=("accuracy", f"attention, L = {np.shape(attention)[-1]}"))
    ticks = set()
    for name, (multiples, acc, dash) in curves.items():
        x = np.log2(np.asarray(multiples, dtype=float))
        acc = np.asarray(acc, dtype=float)
        if acc.ndim != 2 or acc.shape[1] != len(x):
            raise ValueError(f"accuracy for {name!r} must be [n_seeds, {len(x)}]; got {acc.shape}")
        ticks.update(int(m) for m in multiples)
        fig.add_trace(go.Scatter(x=np.concatenate([x, x[::-1]]), y=np.concatenate([acc.max(0), acc.min(0)[::-1]]),
                                 mode="lines", fill="toself", fillcolor=_rgba(color, 0.15), line=dict(width=0),
                                 hoverinfo="skip", showlegend=False), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=acc.mean(0), mode="lines+markers", name=f"{name} ({acc.shape[0]} seeds)",
                                 line=dict(color=color, width=3, dash=dash),
                                 hovertemplate=f"{name}, " + "%{text}: mean %{y:.3f}<extra></extra>",
                                 text=[f"{m:g}x" for m in multiples]), row=1, col=1)
    attention = np.asarray(attention, dtype=float)
    if attention.ndim != 2:
        raise ValueError(f"attention must be [n_seeds, L]; got shape {attention.shape}")
    keys = np.arange(attention.shape[1])
    for i, row in enumerate(attention):
        fig.add_trace(go.Scatter(x=keys, y=row, mode="lines", line=dict(color=color, width=1.5), opacity=0.7,
                                 showlegend=False, hovertemplate=f"seed {i}: " + "key %{x}: %{y:.3f}<extra></extra>"),
                      row=1, col=2)
    fig.add_trace(go.Scatter(x=[target, target], y=[0, 1.02], mode="lines", name=f"target key L-1-k = {target}",
                             line=dict(color="black", dash="dash", width=1)), row=1, col=2)
    if visited is not None and visited > train_len:
        fig.add_trace(go.Scatter(x=[visited - 0.5] * 2, y=[0, 1.02], mode="lines",
                                 name=f"last position training visited ({visited - 1})",
                                 line=dict(color="gray", dash="dot", width=1.5)), row=1, col=2)
    fig.add_hline(y=chance, line=dict(color="black", dash="dot", width=1.5), row=1, col=1,
                  name=f"chance {chance:.3f}", showlegend=True)
    fig.add_vrect(x0=-0.5, x1=train_len - 0.5, fillcolor="gray", opacity=0.15, line_width=0, row=1, col=2)
    ticks = sorted(ticks)
    fig.update_xaxes(title="length / training<br>length (log scale)", tickvals=np.log2(ticks),
                     ticktext=[f"{t}x" for t in ticks], row=1, col=1)
    fig.update_yaxes(title="accuracy (fraction)", range=[-0.02, 1.05], row=1, col=1)
    fig.update_xaxes(title="key position<br>(tokens)", range=[-1, attention.shape[1]], row=1, col=2)
    fig.update_yaxes(title="attention weight", range=[-0.02, 1.05], row=1, col=2)
    fig.update_layout(title=title, height=FIGURE_HEIGHT + 60, margin=dict(t=150, b=70),
                      legend=dict(orientation="h", x=0.0, xanchor="left", y=1.13, yanchor="bottom"))
    return fig


def offset_margin_profiles(curves: dict, train_len: int, offset: int, title: str) -> go.Figure:
    """The trained query's logit at each relative position D minus its logit at the target's: one panel per encoding.

    The encodings' margins differ by orders of magnitude, so each panel has its own y axis.

    Args:
        curves: ``{encoding (or name): margins [n_seeds, L]}``, column ``j`` at offset ``D = j - (L-1)``
            (e.g. :func:`lengthgen_utils.run.zoo.offset_margins`); drawn as the mean with a min..max band.
        train_len: the offsets the training sequences contained, ``-(train_len-1) .. 0``, are shaded.
        offset: the target offset k (its margin is 0 by construction; a dotted line).
        title: figure title.

    Returns:
        a plotly ``Figure`` with two panels per row: x = relative position D = j - i (tokens), y = margin (logit units); a key
        above the zero line beats the target.

    Raises:
        ValueError: ``curves`` is empty or an array is not 2-D.
    """
    from plotly.subplots import make_subplots

    _check_panels(curves, "curves")
    n_rows = (len(curves) + 1) // 2
    fig = make_subplots(rows=n_rows, cols=2, subplot_titles=[short_label(n) for n in curves],
                        horizontal_spacing=0.12, vertical_spacing=0.5 / n_rows)
    for i, (name, margins) in enumerate(curves.items()):
        m = np.asarray(margins, dtype=float)
        if m.ndim != 2:
            raise ValueError(f"margins for {name!r} must be [n_seeds, L]; got shape {m.shape}")
        row, col = i // 2 + 1, i % 2 + 1
        d = np.arange(-(m.shape[1] - 1), 1)
        color = _color(name, i)
        fig.add_trace(go.Scatter(x=np.concatenate([d, d[::-1]]), y=np.concatenate([m.max(0), m.min(0)[::-1]]),
                                 mode="lines", fill="toself", fillcolor=_rgba(color, 0.2), line=dict(width=0),
                                 hoverinfo="skip", showlegend=False), row=row, col=col)
        fig.add_trace(go.Scatter(x=d, y=m.mean(0), mode="lines", showlegend=False, line=dict(color=color, width=1.5),
                                 hovertemplate=f"{_label(name)}, " + "D=%{x}: margin %{y:.2f}<extra></extra>"),
                      row=row, col=col)
        fig.add_vrect(x0=-(train_len - 1) - 0.5, x1=0.5, fillcolor="gray", opacity=0.15, line_width=0,
                      row=row, col=col)
        fig.add_vline(x=-offset, line=dict(color="black", dash="dot", width=1), row=row, col=col)
        fig.add_hline(y=0, line=dict(color="black", width=1), row=row, col=col)
        fig.update_xaxes(title="D = j − i (tokens)" if row == n_rows else None, row=row, col=col)
        fig.update_yaxes(title="margin (logits)" if col == 1 else None, row=row, col=col)
    fig.update_layout(title=title, height=150 + 210 * n_rows, margin=dict(t=110))
    return fig


def violations_by_encoding(values: dict, tolerance: float, title: str, floor: float = 1e-9) -> go.Figure:
    """The shift test's violation per encoding: random and trained heads side by side, log scale.

    Args:
        values: ``{encoding (or name): (random, trained)}``, the largest logit change under a global shift.
        tolerance: the exactness threshold, drawn as a vertical line (its value belongs in the caption).
        title: figure title.
        floor: a value below it (an exact 0) is drawn at ``floor`` (the caption should say so); the hover text
            gives the exact value.

    Returns:
        a plotly ``Figure`` with one row per encoding, labelled by :func:`short_label`.
    """
    _check_panels(values, "values")
    names = list(values)
    labels = [short_label(n) for n in names]
    fig = go.Figure()
    for k, (kind, symbol) in enumerate((("random head", "circle-open"), ("trained", "circle"))):
        xs = [float(values[n][k]) for n in names]
        fig.add_trace(go.Scatter(x=[max(x, floor) for x in xs], y=labels, mode="markers", name=kind,
                                 marker=dict(symbol=symbol, size=11, color=[_color(n, i) for i, n in enumerate(names)],
                                             line=dict(width=2, color=[_color(n, i) for i, n in enumerate(names)])),
                                 customdata=xs, hovertemplate="%{y}, " + kind + ": %{customdata:.2e}<extra></extra>"))
    fig.add_vline(x=tolerance, line=dict(color="black", dash="dash", width=1), name="tolerance", showlegend=True)
    fig.update_layout(title=title, height=max(FIGURE_HEIGHT, 140 + 32 * len(names)))
    drawn = [max(float(v[k]), floor) for v in values.values() for k in (0, 1)]
    span = [np.log10(min(drawn + [tolerance])) - 0.5, np.log10(max(drawn + [tolerance])) + 0.5]
    fig.update_xaxes(title="max |Δ logit| (log scale)", type="log", exponentformat="power", range=span,
                     dtick=4, tick0=0, tickangle=0)  # a label every 4 decades: more collide on a phone
    fig.update_yaxes(autorange="reversed")
    return fig
