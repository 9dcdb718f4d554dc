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
                                                "frames": fig_dict.get("frames", []),
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
    fig = make_subplots(rows=1, cols=n, subplot_titles=list(panels), horizontal_spacing=0.2)
    for i, (name, z) in enumerate(panels.items()):
        z = np.asarray(z, dtype=float)
        if z.ndim != 2 or z.shape[0] != z.shape[1]:
            raise ValueError(f"panel {name!r} must be a square matrix [L, L]; got shape {z.shape}")
        x_right = fig.layout[f"xaxis{i + 1 if i else ''}"].domain[1]  # colour bar just right of its panel
        fig.add_trace(go.Heatmap(z=z, zmid=zmid, colorscale=colorscale,
                                 colorbar=dict(title=dict(text=colorbar_title, side="right"), x=x_right + 0.01,
                                               xanchor="left", len=0.8, thickness=12),
                                 hovertemplate="query m=%{y}, key n=%{x}: %{z:.4g}<extra></extra>"),
                      row=1, col=i + 1)
        fig.update_xaxes(title="key position n (tokens)", row=1, col=i + 1)
        fig.update_yaxes(title="query position m (tokens)" if i == 0 else None, autorange="reversed",
                         row=1, col=i + 1)
        if train_len is not None and train_len < z.shape[0]:
            edge = train_len - 0.5
            for kw in (dict(x=edge), dict(y=edge)):
                line = dict(color="black", dash="dash", width=1)
                if "x" in kw:
                    fig.add_vline(x=edge, line=line, row=1, col=i + 1)
                else:
                    fig.add_hline(y=edge, line=line, row=1, col=i + 1)
    fig.update_layout(title=title, height=FIGURE_HEIGHT + 60)
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
    palette = ["#d62728", "#ff7f0e", "#1f77b4", "#2ca02c"]
    for i, (name, err) in enumerate(errors.items()):
        err = np.asarray(err, dtype=float)
        if err.shape != x.shape:
            raise ValueError(f"errors[{name!r}] must have shape {x.shape}; got {err.shape}")
        fig.add_trace(go.Scatter(x=x, y=np.maximum(err, 1e-12), mode="lines", name=name,
                                 line=dict(color=palette[i % len(palette)], width=2),
                                 hovertemplate="position %{x:.0f}: error %{y:.2e} rad<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="black", dash="dot", width=1.5), annotation_text="1 radian",
                  annotation_position="bottom right")
    fig.update_layout(title=title)
    fig.update_xaxes(title="position (tokens, log scale)", type="log")
    fig.update_yaxes(title="max over pairs of |angle error| (radians, log scale)", type="log", exponentformat="power")
    return fig


def argmax_histogram(counts, train_len: int, marker_position: int | None, title: str,
                     marker_label: str = "L_train − 1 − k") -> go.Figure:
    """Histogram of the attention argmax over absolute positions, one bar group per seed.

    Args:
        counts: ``[n_seeds, P]`` counts per position (e.g. from
            :func:`lengthgen_utils.analysis.attention_argmax_histogram`).
        train_len: longest training length; the training range is shaded.
        marker_position: a position to mark with a dashed line (e.g. ``L_train - 1 - k``), or None.
        title: figure title.
        marker_label: annotation of the marker line.

    Returns:
        a plotly ``Figure``: x = absolute key position, y = number of test lengths.
    """
    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise ValueError(f"counts must be [n_seeds, positions]; got shape {counts.shape}")
    used = np.nonzero(counts.sum(0))[0]
    x_max = int(max(used.max() if used.size else 0, train_len)) + 2
    fig = go.Figure()
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf"]
    for i, row in enumerate(counts):
        fig.add_trace(go.Bar(x=np.arange(x_max), y=row[:x_max], name=f"seed {i}", marker_color=palette[i % 10],
                             hovertemplate=f"seed {i}: " + "argmax at position %{x} for %{y} lengths<extra></extra>"))
    fig.add_vrect(x0=-0.5, x1=train_len - 0.5, fillcolor="gray", opacity=0.12, line_width=0,
                  annotation_text="training positions", annotation_position="top left")
    if marker_position is not None:
        fig.add_vline(x=marker_position, line=dict(color="black", dash="dash", width=1.5),
                      annotation_text=f"{marker_label} = {marker_position}", annotation_position="top right")
    fig.update_layout(title=title, barmode="group", bargap=0.15)
    fig.update_xaxes(title="absolute key position of the attention argmax (tokens)")
    fig.update_yaxes(title="number of test lengths")
    return fig


def attention_row_slider(rows: dict, train_len: int, target_offset: int | None, title: str) -> go.Figure:
    """Attention rows of every seed against absolute key position, with a slider over the test length.

    Works in static HTML: each slider step shows a precomputed plotly frame.

    Args:
        rows: ``{L: attention [n_seeds, L]}`` for each test length L (weights in [0, 1]).
        train_len: longest training length; the training positions are shaded.
        target_offset: when given, the target key ``L - 1 - k`` of each frame is marked.
        title: figure title.

    Returns:
        a plotly ``Figure`` with frames named by L and a slider (starts at the first L).

    Raises:
        ValueError: ``rows`` is empty or a row's width differs from its L.
    """
    _check_panels(rows, "rows")
    lengths = sorted(rows)
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf"]

    def traces(L):
        a = np.asarray(rows[L], dtype=float)
        if a.ndim != 2 or a.shape[1] != L:
            raise ValueError(f"rows[{L}] must be [n_seeds, {L}]; got shape {a.shape}")
        out = [go.Scatter(x=np.arange(L), y=r, mode="lines+markers", marker=dict(size=4),
                          line=dict(color=palette[i % 10], width=1.5), name=f"seed {i}",
                          hovertemplate=f"seed {i}: " + "key %{x}: weight %{y:.3f}<extra></extra>")
               for i, r in enumerate(a)]
        if target_offset is not None:
            t = L - 1 - target_offset
            out.append(go.Scatter(x=[t, t], y=[0, 1.02], mode="lines", line=dict(color="black", dash="dash", width=1),
                                  name="target key L − 1 − k", hoverinfo="skip"))
        return out

    frames = [go.Frame(data=traces(L), name=str(L)) for L in lengths]
    fig = go.Figure(data=frames[0].data, frames=frames)
    steps = [dict(method="animate", label=str(L),
                  args=[[str(L)], dict(mode="immediate", frame=dict(duration=0, redraw=True), transition=dict(duration=0))])
             for L in lengths]
    fig.update_layout(title=title, height=FIGURE_HEIGHT + 80, margin=dict(b=140),
                      sliders=[dict(active=0, steps=steps, x=0.0, len=1.0, y=-0.22, yanchor="top",
                                    currentvalue=dict(prefix="test length L = ", suffix=" tokens"))])
    fig.add_vrect(x0=-0.5, x1=train_len - 0.5, fillcolor="gray", opacity=0.12, line_width=0,
                  annotation_text="training positions", annotation_position="top left")
    fig.update_xaxes(title="absolute key position (tokens)", range=[-1, max(lengths)])
    fig.update_yaxes(title="attention weight of the query (fraction)", range=[-0.02, 1.05])
    return fig


def bar_by_setting(values: dict, title: str, y_title: str, chance: float | None = None) -> go.Figure:
    """One marker per seed and a bar for the mean, for each named setting.

    Args:
        values: ``{setting name: per-seed values [n_seeds]}``.
        title: figure title.
        y_title: y axis title with units.
        chance: when given, a dotted chance line.

    Returns:
        a plotly ``Figure``.
    """
    _check_panels(values, "values")
    values = {n: np.asarray(v, dtype=float).ravel() for n, v in values.items()}
    names = list(values)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=names, y=[float(np.mean(values[n])) for n in names], name="mean over seeds",
                         marker_color="rgba(214,39,40,0.35)"))
    xs = [n for n in names for _ in values[n]]
    ys = [float(v) for n in names for v in values[n]]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="each seed", marker=dict(color="#d62728", size=8)))
    if chance is not None:
        fig.add_hline(y=chance, line=dict(color="black", dash="dot", width=1.5),
                      annotation_text=f"chance = {chance:.3f}", annotation_position="bottom right")
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
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=list(panels), shared_yaxes=True,
                        horizontal_spacing=0.06)
    dashes = ["solid", "dot", "dash", "dashdot"]
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    for c, (name, rows) in enumerate(panels.items()):
        for i, (L, row) in enumerate(sorted(rows.items())):
            row = np.asarray(row, dtype=float)
            if row.shape != (L,):
                raise ValueError(f"panels[{name!r}][{L}] must have shape ({L},); got {row.shape}")
            fig.add_trace(go.Scatter(x=np.arange(-(L - 1), 1), y=row, mode="lines+markers", marker=dict(size=5),
                                     line=dict(color=palette[i % 4], dash=dashes[i % 4], width=2),
                                     name=f"L = {L}", legendgroup=str(L), showlegend=c == 0,
                                     hovertemplate=f"L={L}, " + "offset %{x}: logit %{y:.5g}<extra></extra>"),
                          row=1, col=c + 1)
        fig.update_xaxes(title="key offset j − (L−1) (tokens)", row=1, col=c + 1,
                         range=None if min_offset is None else [min_offset - 0.5, 0.5])
        if target_offset is not None:
            fig.add_vline(x=-target_offset, line=dict(color="black", dash="dash", width=1), row=1, col=c + 1)
    fig.update_yaxes(title="attention logit s_j (logit units)", row=1, col=1)
    fig.update_layout(title=title, margin=dict(t=130), legend=dict(y=1.12))
    return fig


def per_position_curves(curves: dict, title: str, y_title: str, train_len: int | None = None,
                        log_y: bool = False, floor: float = 1e-12) -> go.Figure:
    """A per-position quantity (e.g. per-row gradient norm) against absolute position: mean line, min..max band.

    Args:
        curves: ``{name: values [n_seeds, P]}`` for positions ``0 .. P-1``.
        title: figure title.
        y_title: y axis title with units.
        train_len: when given, the training positions are shaded.
        log_y: log y axis; values below ``floor`` (exact zeros) are drawn at ``floor``.

    Returns:
        a plotly ``Figure``.
    """
    _check_panels(curves, "curves")
    fig = go.Figure()
    palette = ["#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd"]
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
                      annotation_text="training positions", annotation_position="top left")
    fig.update_layout(title=title)
    fig.update_xaxes(title="absolute position t (row of the APE table)")
    fig.update_yaxes(title=y_title, type="log" if log_y else "linear", exponentformat="power" if log_y else None)
    return fig
