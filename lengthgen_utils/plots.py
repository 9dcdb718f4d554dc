"""Plotly figure builders with the book's one look (the only module, with widgets, that imports plotly).

Every accuracy figure shows the mean over seeds as a line, the spread
(min..max over seeds) as a band, a dotted chance line and the training
length; axes are labeled with units.

Figures are shown through the ``"lengthgen"`` renderer (see :func:`setup`):
its output carries plotly's own JSON for live Jupyter front ends *and* an
HTML snippet without plotly.js, which the web book renders with the single
copy of plotly.js that the build serves from its own ``_static`` folder
(no CDN, works offline).
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer

PE_COLORS = {
    "rope": "#1f77b4",
    "ape": "#d62728",
    "nope": "#7f7f7f",
    "linear": "#2ca02c",
    "sinusoidal": "#9467bd",
    "alibi": "#8c564b",
}
PE_LABELS = {"rope": "RoPE", "ape": "APE (learned)", "nope": "NoPE", "linear": "linear attention"}
FIGURE_HEIGHT = 440

BOOK_TEMPLATE = go.layout.Template(pio.templates["plotly_white"])
BOOK_TEMPLATE.layout.update(
    font=dict(family="Helvetica, Arial, sans-serif", size=14),
    title=dict(font=dict(size=17), x=0.0, xanchor="left", y=0.97, yanchor="top"),
    height=FIGURE_HEIGHT,
    margin=dict(l=70, r=30, t=100, b=60),
    paper_bgcolor="white",
    plot_bgcolor="white",
    legend=dict(orientation="h", x=0.0, xanchor="left", y=1.0, yanchor="bottom", bgcolor="rgba(255,255,255,0.85)"),
)


class BookRenderer(MimetypeRenderer):
    """Emit plotly JSON (for Jupyter) plus an HTML div that expects plotly.js on the page (for the book)."""

    def to_mimebundle(self, fig_dict):
        html = pio.to_html(fig_dict, include_plotlyjs=False, full_html=False,
                           config={"responsive": True, "displaylogo": False})
        return {
            "application/vnd.plotly.v1+json": {"data": fig_dict.get("data", []), "layout": fig_dict.get("layout", {}),
                                                "config": {"responsive": True}},
            "text/html": html,
        }


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


def _label(name: str) -> str:
    return PE_LABELS.get(name, name)


def _color(name: str, i: int) -> str:
    palette = list(PE_COLORS.values())
    return PE_COLORS.get(name.split()[0].lower(), palette[i % len(palette)])


def accuracy_vs_length(curves: dict, chance: float, train_len: int, title: str,
                       y_title: str = "accuracy at the query (fraction correct)") -> go.Figure:
    """Accuracy against evaluation length, mean over seeds with a min..max band.

    Args:
        curves: ``{name: (lengths [n], accuracy [n_seeds, n])}``; ``name`` picks the colour
            (``"rope"``, ``"ape"``, ``"nope"``, ...).
        chance: chance accuracy, drawn as a dotted line.
        train_len: the longest training length, drawn as a vertical line.
        title: figure title (say what is shown and over how many seeds).

    Returns:
        a plotly ``Figure`` whose x axis is ``log2(L)``, labeled in tokens and multiples of ``train_len``.

    Raises:
        ValueError: ``curves`` is empty, or an accuracy array is not ``[n_seeds, len(lengths)]``.
    """
    if not curves:
        raise ValueError("curves must name at least one curve")
    fig = go.Figure()
    all_lengths = set()
    for i, (name, (lengths, acc)) in enumerate(curves.items()):
        lengths = np.asarray(lengths)
        acc = np.asarray(acc, dtype=float)
        if acc.ndim != 2 or acc.shape[1] != len(lengths):
            raise ValueError(f"accuracy for {name!r} must be [n_seeds, {len(lengths)}]; got {acc.shape}")
        all_lengths.update(int(x) for x in lengths)
        color = _color(name, i)
        lo, hi, mean = acc.min(0), acc.max(0), acc.mean(0)
        x = np.log2(lengths)  # a linear axis over log2(L): shapes and hovers stay in plain units
        fig.add_trace(go.Scatter(x=np.concatenate([x, x[::-1]]), y=np.concatenate([hi, lo[::-1]]),
                                 mode="lines", fill="toself", fillcolor=_rgba(color, 0.18), line=dict(width=0),
                                 hoverinfo="skip", showlegend=False, legendgroup=name))
        fig.add_trace(go.Scatter(x=x, y=mean, mode="lines+markers", name=f"{_label(name)} (mean of {acc.shape[0]})",
                                 line=dict(color=color, width=3), legendgroup=name,
                                 customdata=np.stack([lengths, lo, hi], -1),
                                 hovertemplate="L=%{customdata[0]:d}: mean %{y:.3f} "
                                               "(min %{customdata[1]:.3f}, max %{customdata[2]:.3f})"))
    ticks = sorted(all_lengths)
    fig.add_hline(y=chance, line=dict(color="black", dash="dot", width=1.5),
                  annotation_text=f"chance = {chance:.3f}", annotation_position="bottom right")
    fig.add_vline(x=float(np.log2(train_len)), line=dict(color="gray", dash="dash", width=1),
                  annotation_text="training length", annotation_position="top left")
    fig.update_layout(title=title)
    fig.update_xaxes(title="evaluation sequence length L (tokens; multiple of the training length; log scale)",
                     tickvals=np.log2(ticks), ticktext=[f"{t} ({t / train_len:g}x)" for t in ticks])
    fig.update_yaxes(title=y_title, range=[-0.02, 1.05])
    return fig


def loss_curves(histories: dict, title: str) -> go.Figure:
    """Training loss per step, mean over the ensemble with a min..max band.

    Args:
        histories: ``{name: loss [steps, n_models]}`` (the return value of ``training.train``).
        title: figure title.

    Returns:
        a plotly ``Figure`` with a log loss axis.
    """
    fig = go.Figure()
    for i, (name, hist) in enumerate(histories.items()):
        hist = np.asarray(hist, dtype=float)
        steps = np.arange(1, hist.shape[0] + 1)
        color = _color(name, i)
        fig.add_trace(go.Scatter(x=np.concatenate([steps, steps[::-1]]),
                                 y=np.concatenate([hist.max(1), hist.min(1)[::-1]]), mode="lines", fill="toself",
                                 fillcolor=_rgba(color, 0.18), line=dict(width=0), hoverinfo="skip",
                                 showlegend=False))
        fig.add_trace(go.Scatter(x=steps, y=hist.mean(1), mode="lines", name=_label(name), line=dict(color=color)))
    fig.update_layout(title=title)
    fig.update_xaxes(title="optimizer step")
    fig.update_yaxes(title="training cross-entropy (nats, log scale)", type="log")
    return fig


def slider_figure(frames: dict, slider_title: str, active: int = 0) -> go.Figure:
    """One figure with a plotly slider that switches between precomputed figures (works with no kernel).

    Every frame's traces are put into one figure; the slider's step ``i``
    makes only frame ``i``'s traces visible and sets frame ``i``'s title
    (plotly's ``"update"`` method, so frames may have different numbers of
    traces). Axes, shapes and annotations (chance line, training length) come
    from the first frame, so frames should share them. Everything is in the
    page's HTML: moving the slider needs plotly.js only, not Python.

    Args:
        frames: ``{label: go.Figure or list of traces}``, in slider order; ``label`` is the step's text
            (e.g. ``"k = 3"``).
        slider_title: text before the current step's label (e.g. ``"offset k: "``).
        active: index of the frame shown when the page loads.

    Returns:
        a plotly ``Figure`` with one slider under the plot.

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
    first = next(iter(figs.values()))
    fig = go.Figure(layout=first.layout)
    owner = []  # frame index of every trace
    for i, frame in enumerate(figs.values()):
        for trace in frame.data:
            fig.add_trace(trace)
            owner.append(i)
    steps = []
    for i, (label, frame) in enumerate(figs.items()):
        visible = [o == i for o in owner]
        title = frame.layout.title.text if frame.layout.title.text is not None else ""
        steps.append(dict(label=label, method="update", args=[{"visible": visible}, {"title.text": title}]))
    for trace, o in zip(fig.data, owner):
        trace.visible = o == active
    active_title = list(figs.values())[active].layout.title.text
    height = (first.layout.height or FIGURE_HEIGHT) + 90
    fig.update_layout(title_text=active_title, height=height, margin_b=150,
                      sliders=[dict(active=active, steps=steps, currentvalue=dict(prefix=slider_title),
                                    x=0.0, len=1.0, y=0.0, yanchor="top", pad=dict(t=75, b=10))])
    return fig
