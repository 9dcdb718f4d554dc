"""The few figure builders several chapters share: accuracy against length and position, losses, kernels, heatmaps, bars.

Every accuracy figure shows the mean over seeds as a line, the spread (min..max over seeds) as a band, a dotted
chance line and the training length; axes are labeled with units.

**Labels never sit on data.** A reference line or region (chance, the training length, a threshold, the training
window) is named in the legend (plotly's legend entries for shapes), not by text drawn inside the plot, where it
would cover a curve or a point sooner or later. The book's browser test checks that no annotation's text overlaps
a drawn line, marker or bar. A chapter's own figures live in its module (``book/chNN.py``).
"""
from __future__ import annotations

import re

import numpy as np
import plotly.graph_objects as go

from .render import wrap_text
from .sliders import _check_panels
from .style import color_for, flag_below_chance, label_of, rgba, seed_note


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
        color = style.get("color", color_for(name, i))
        lo, hi, mean = acc.min(0), acc.max(0), acc.mean(0)
        means[name] = mean
        n_seeds.append(acc.shape[0])
        x = np.log2(lengths)  # a linear axis over log2(L): shapes and hovers stay in plain units
        if bands:
            fig.add_trace(go.Scatter(x=np.concatenate([x, x[::-1]]), y=np.concatenate([hi, lo[::-1]]),
                                     mode="lines", fill="toself", fillcolor=rgba(color, 0.18), line=dict(width=0),
                                     hoverinfo="skip", showlegend=False, legendgroup=label_of(name)))
        fig.add_trace(go.Scatter(x=x, y=mean, mode="lines+markers", name=f"{label_of(name)} (mean of {acc.shape[0]})",
                                 line=dict(color=color, width=3, dash=style.get("dash", "solid")), legendgroup=label_of(name),
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
        color = (colors or {}).get(name, color_for(name, i))
        for m in range(hist.shape[1]):
            fig.add_trace(go.Scatter(x=steps, y=hist[:, m], mode="lines", line=dict(color=rgba(color, 0.35), width=1),
                                     legendgroup=label_of(name), showlegend=False,
                                     hovertemplate=f"{label_of(name)}, model {m}: " + "step %{x}: %{y:.3g}<extra></extra>"))
        medians.append(go.Scatter(x=steps, y=np.median(hist, 1), mode="lines", legendgroup=label_of(name),
                                  name=f"{label_of(name)} (median of {hist.shape[1]}; thin: each)",
                                  line=dict(color=color, width=2.5)))
    for trace in medians:
        fig.add_trace(trace)
    fig.update_layout(title=title)
    fig.update_xaxes(title="optimizer step")
    fig.update_yaxes(title="training cross-entropy (nats, log scale)", type="log", exponentformat="power")
    return fig


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
        a plotly ``Figure`` (x: relative position D = j - m in tokens, key minus query).

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
                                     fill="toself", fillcolor=rgba(color, 0.2), line=dict(width=0),
                                     hoverinfo="skip", showlegend=False, legendgroup=label_of(name)))
        label = name if values.shape[0] == 1 else f"{name} (mean of {values.shape[0]})"
        fig.add_trace(go.Scatter(x=offsets, y=values.mean(0), mode="lines", name=label, legendgroup=label_of(name),
                                 line=dict(color=color, width=2, dash="dash" if is_dashed else "solid")))
    fig.add_vrect(x0=-(train_len - 1) - 0.5, x1=-0.5, fillcolor="gray", opacity=0.12, line_width=0,
                  name="training window", showlegend=True)
    fig.add_vline(x=-target_offset, line=dict(color="black", dash="dot", width=1))
    fig.add_hline(y=0, line=dict(color="black", width=0.5))
    fig.update_layout(title=title)
    lo = min(float(np.asarray(offsets).min()) for offsets, _ in curves.values())
    fig.update_xaxes(title="relative position D = j − m (tokens)", range=[lo - 0.08 * (1 - lo), 1])  # clear of y ticks
    fig.update_yaxes(title=y_title)
    return fig


def _log_x_marker(fig: go.Figure, x: float, line: dict, text: str | None = None) -> None:
    """A vertical line at data value ``x`` on a log x axis, named ``text`` in the legend (when given).

    On a log axis plotly places shapes in data units (an annotation would take log10 units); the label
    is a legend entry of the shape, so it never sits on the data."""
    fig.add_vline(x=float(x), line=line, name=text, showlegend=bool(text))


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
        color = (colors or {}).get(name, color_for(name, i))
        fig.add_trace(go.Scatter(x=np.concatenate([pos, pos[::-1]]), y=np.concatenate([acc.max(0), acc.min(0)[::-1]]),
                                 mode="lines", fill="toself", fillcolor=rgba(color, 0.18), line=dict(width=0),
                                 hoverinfo="skip", showlegend=False))
        fig.add_trace(go.Scatter(x=pos, y=acc.mean(0), mode="lines", name=f"{label_of(name)} (mean of {acc.shape[0]})",
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


def position_heatmaps(panels: dict, title: str, colorbar_title: str, train_len: int | None = None,
                      zmid: float | None = None, colorscale: str = "RdBu_r") -> go.Figure:
    """Side-by-side heatmaps of ``[L, L]`` matrices over (query position m, key position j).

    Args:
        panels: ``{panel title: matrix [L, L]}``, row = query position m, column = key
            position j; entries that should not be drawn (e.g. ``j > m``) are NaN.
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
                                 hovertemplate="query m=%{y}, key j=%{x}: %{z:.4g}<extra></extra>"),
                      row=i + 1, col=1)
        fig.update_xaxes(title="key position j (tokens)" if i == n - 1 else None, row=i + 1, col=1)
        fig.update_yaxes(title="query position m (tokens)", autorange="reversed", row=i + 1, col=1)
        if train_len is not None and train_len < z.shape[0]:
            line = dict(color="black", dash="dash", width=1)
            fig.add_vline(x=train_len - 0.5, line=line, row=i + 1, col=1)
            fig.add_hline(y=train_len - 0.5, line=line, row=i + 1, col=1)
    fig.update_layout(title=title, height=120 + 330 * n)
    return fig


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
                         marker_color=rgba(color, 0.35)))
    xs = [n for n in names for _ in values[n]]
    ys = [float(v) for n in names for v in values[n]]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="each seed", marker=dict(color=color, size=8)))
    if chance is not None:
        fig.add_hline(y=chance, line=dict(color="black", dash="dot", width=1.5), name=f"chance = {chance:.3f}",
                      showlegend=True)
    fig.update_layout(title=title)
    fig.update_yaxes(title=y_title)
    return fig
