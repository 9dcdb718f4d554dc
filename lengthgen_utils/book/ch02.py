"""Chapter 2, RoPE's exact relative-offset equivariance: its figures (shift differences, angle errors, logit rows)."""
from __future__ import annotations


import numpy as np
import plotly.graph_objects as go

from .sliders import _check_panels
from .style import color_for, label_of


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
        color = color_for(name, i)
        x = np.repeat(s[None], diff.shape[0], 0).ravel()
        fig.add_trace(go.Scatter(x=x, y=np.maximum(diff.ravel(), floor), mode="markers", name=f"{label_of(name)} (each seed)",
                                 marker=dict(color=color, size=9, opacity=0.7),
                                 hovertemplate="shift %{x:.0f}: max |Δ logit| = %{y:.2e}<extra></extra>"))
        fig.add_trace(go.Scatter(x=s, y=np.maximum(diff.max(0), floor), mode="lines", line=dict(color=color, dash="dot"),
                                 name=f"{label_of(name)} (max over seeds)"))
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
