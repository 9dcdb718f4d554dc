"""Chapter 6, the linear-attention control: its figures (closed form against measurement, reference curves)."""
from __future__ import annotations


import numpy as np
import plotly.graph_objects as go

from .figures import _log_x_marker
from .style import PALETTE
from .tables import Table


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


def kernel_error_table(kernels: dict, lengths, train_len: int, nu, short: dict, caption: str):
    """Chapter 6's table of direct kernel heads: predicted against measured squared error per length.

    ``kernels`` maps a frequency set's name to its kernel-head result (``predicted_squared_error [n]``,
    ``squared_error [n_seeds, n]`` over ``lengths``, in tokens); ``nu [n]`` is the noise ratio of the
    well-conditioned c* per length; ``short`` gives each name's column prefix. Per length and kernel: the
    predicted / measured (seed mean) error, and the predicted error added per relative position beyond the
    window, (error(L) - error(train_len)) / (L - train_len).
    """
    rows = []
    for col, L in enumerate(lengths):
        row = {"L": L}
        for name, k in kernels.items():
            pred = k.predicted_squared_error
            row[f"{short[name]}: pred. / meas."] = f"{pred[col]:.3f} / {k.squared_error[:, col].mean():.3f}"
            row[f"{short[name]}: per D"] = (
                f"{(pred[col] - pred[0]) / (L - train_len):.3f}" if L > train_len else "")
        row["ν(L) of c*"] = f"{nu[col]:.2f}"
        rows.append(row)
    return Table.from_rows(rows, caption=caption)
