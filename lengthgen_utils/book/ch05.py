"""Chapter 5, the dilution law: its figures (exact and mean-field dilution, cliffs, where the law holds)."""
from __future__ import annotations


import numpy as np
import plotly.graph_objects as go

from .._validate import per_model, per_model_rows
from .ch04 import _int_or_none
from .figures import _log_x_marker
from .render import FIGURE_HEIGHT
from .sliders import slider_figure
from .style import PALETTE


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
