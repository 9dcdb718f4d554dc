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

import re
import warnings

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer

from .positional import ENCODINGS, Encoding, get_encoding

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]
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
        html = pio.to_html(fig_dict, include_plotlyjs=False, full_html=False, auto_play=False,
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


def _encoding(key) -> Encoding | None:
    """The encoding a curve key stands for: an Encoding, or a registered encoding's name; else None."""
    if isinstance(key, Encoding):
        return key
    return get_encoding(key) if isinstance(key, str) and key in ENCODINGS else None


def _label(key) -> str:
    """A curve's legend text: the encoding's label when the key is an encoding (or its name), else the key."""
    encoding = _encoding(key)
    return encoding.label if encoding is not None else str(key)


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
                           showarrow=False, font=dict(color="#d62728", size=14), bgcolor="rgba(255,255,255,0.8)")
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
    fig.add_hline(y=chance, line=dict(color="black", dash="dot", width=1.5),
                  annotation_text=f"chance = {chance:.3f}", annotation_position="bottom right")
    fig.add_vline(x=float(np.log2(train_len)), line=dict(color="gray", dash="dash", width=1),
                  annotation_text="training length", annotation_position="top left")
    flag_below_chance(fig, means, chance)
    fig.update_layout(title=seed_note(title, min(n_seeds)))
    if len(curves) > 3:  # a long legend would wrap into the title: put it under the plot instead
        fig.update_layout(height=FIGURE_HEIGHT + 80, margin=dict(b=140),
                          legend=dict(orientation="h", x=0.0, xanchor="left", y=-0.22, yanchor="top"))
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
    fig.update_yaxes(title="training cross-entropy (nats, log scale)", type="log", exponentformat="power")
    return fig


# --- carrier kernel (chapter 4) and dilution (chapter 5)

SEED_COLORS = PALETTE


def _slider(labels: list, prefix: str) -> dict:
    """A plotly slider whose step ``i`` shows frame ``labels[i]`` (works in static HTML, no kernel)."""
    steps = [dict(method="animate", label=str(lab),
                  args=[[str(lab)], dict(mode="immediate", frame=dict(duration=0, redraw=True), transition=dict(duration=0))])
             for lab in labels]
    return dict(active=0, currentvalue=dict(prefix=prefix), pad=dict(t=55), steps=steps)


def kernel_slider(offsets, kernels: dict, train_len: int, title: str) -> go.Figure:
    """The offset kernel s(D) of every seed, one slider frame per target offset k.

    Args:
        offsets: ints D ``[n]`` (x axis, key position minus query position).
        kernels: ``{k: s [n_seeds, n]}`` logits in nats, one entry per target offset k.
        train_len: the training length (the window ``-(train_len-1) <= D <= 0`` is shaded).
        title: figure title.

    Returns:
        a plotly ``Figure`` with one trace per seed, a marker at ``D = -k`` and a slider over k.

    Raises:
        ValueError: ``kernels`` is empty or an array is not ``[n_seeds, n]``.
    """
    if not kernels:
        raise ValueError("kernels must hold at least one offset")
    x = np.asarray(offsets)
    frames, ks = [], list(kernels)
    y_all = []
    for k in ks:
        s = np.asarray(kernels[k], dtype=float)
        if s.ndim != 2 or s.shape[1] != len(x):
            raise ValueError(f"kernels[{k}] must be [n_seeds, {len(x)}]; got {s.shape}")
        y_all.append(s)
        data = [go.Scatter(x=x, y=row, mode="lines", name=f"seed {i}", line=dict(color=SEED_COLORS[i % 10], width=2),
                           hovertemplate="D=%{x}: s=%{y:.2f} nats") for i, row in enumerate(s)]
        data.append(go.Scatter(x=[-k, -k], y=[s.min(), s.max()], mode="lines", name=f"target D = -{k}",
                               line=dict(color="black", dash="dash", width=2)))
        frames.append(go.Frame(data=data, name=str(k)))
    y_lo = min(s.min() for s in y_all)
    y_hi = max(s.max() for s in y_all)
    pad = 0.05 * (y_hi - y_lo)
    fig = go.Figure(data=frames[0].data, frames=frames)
    fig.add_vrect(x0=-(train_len - 1) - 0.5, x1=0.5, fillcolor="gray", opacity=0.12, line_width=0,
                  annotation_text="training window", annotation_position="top left")
    fig.update_layout(title=title, sliders=[_slider(ks, "target offset k = ")], height=FIGURE_HEIGHT + 80,
                      margin=dict(b=120))
    fig.update_xaxes(title="offset D = key position - query position (tokens)")
    fig.update_yaxes(title="attention logit s(D) (nats)", range=[y_lo - pad, y_hi + pad])
    return fig


def carrier_spectrum_figure(periods, amplitude, variation, title: str) -> go.Figure:
    """Per-pair amplitude r_i and window variation v_i, mean over models with min..max error bars.

    Args:
        periods: ``[P]`` period of each pair, ``2 pi / theta_i`` (tokens).
        amplitude, variation: ``[n_models, P]`` (nats).
    """
    periods = np.asarray(periods, dtype=float)
    labels = [f"{i}: {p:,.0f}" for i, p in enumerate(periods)]
    fig = go.Figure()
    for name, arr, color in (("amplitude r_i", amplitude, "#1f77b4"), ("variation v_i over the training window", variation, "#ff7f0e")):
        arr = np.asarray(arr, dtype=float)
        mean = arr.mean(0)
        fig.add_trace(go.Bar(x=labels, y=mean, name=f"{name} (mean of {arr.shape[0]})", marker_color=color,
                             error_y=dict(type="data", symmetric=False, array=arr.max(0) - mean,
                                          arrayminus=mean - arr.min(0))))
    fig.update_layout(title=title, barmode="group")
    fig.update_xaxes(title="frequency pair i: period 2π/θ_i (tokens)")
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
        ValueError: the three sequences differ in length, or a value lies beyond its search range.
    """
    n = len(labels)
    if len(alias_distance) != n or len(failure_length) != n:
        raise ValueError(f"alias_distance, failure_length and labels must have one entry per model; "
                         f"got {len(alias_distance)}, {len(failure_length)}, {n}")
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
    fig.update_layout(title=title, **_LEGEND_BELOW)
    x_ticks = [4 ** e for e in range(2, int(np.log2(x_none)) // 2 + 1) if 4 ** e < x_none] + [x_none]
    y_ticks = [2 ** e for e in range(4, int(np.log2(longest_tested)) + 1)] + [y_none]
    fig.update_xaxes(title="first length with an aliasing key, d + 1 (tokens)", type="log", tickvals=x_ticks,
                     ticktext=[str(t) for t in x_ticks[:-1]] + [f"none ≤ {alias_search}"], tickangle=0)
    fig.update_yaxes(title="first length with accuracy < 0.95 (tokens)", type="log", tickvals=y_ticks,
                     ticktext=[str(t) for t in y_ticks[:-1]] + [f"> {longest_tested}"])
    return fig


def dilution_slider(lengths, measured, exact, mean_field, labels, title: str) -> go.Figure:
    """Distractor-to-target ratio 1/p - 1 against length, one slider frame per model.

    Args:
        lengths: ``[n]`` measured lengths; measured ``[M, n]`` target mass from the model.
        exact: ``(lengths_fine [f], p [M, f])`` exact kernel prediction on a fine grid.
        mean_field: ``(lengths_fine [f], p [M, f])`` mean-field law from training-window quantities.
        labels: ``[M]`` frame names (e.g. "seed 3").
    """
    lengths = np.asarray(lengths)
    measured = np.asarray(measured, dtype=float)
    fine, p_exact = np.asarray(exact[0]), np.asarray(exact[1], dtype=float)
    fine_mf, p_mf = np.asarray(mean_field[0]), np.asarray(mean_field[1], dtype=float)
    ratio = lambda p: 1.0 / np.clip(p, 1e-300, None) - 1.0
    frames = []
    for i, lab in enumerate(labels):
        data = [go.Scatter(x=fine, y=ratio(p_exact[i]), mode="lines", name="exact kernel sum",
                           line=dict(color="#1f77b4", width=3)),
                go.Scatter(x=fine_mf, y=ratio(p_mf[i]), mode="lines", name="mean-field law (from the training window)",
                           line=dict(color="#d62728", dash="dash", width=2)),
                go.Scatter(x=lengths, y=ratio(measured[i]), mode="markers", name="measured in the model",
                           marker=dict(color="black", size=10, symbol="circle-open", line=dict(width=2)))]
        ys = np.concatenate([ratio(p_exact[i]), ratio(p_mf[i]), ratio(measured[i])])
        ys = ys[ys > 0]
        y_range = [np.log10(ys.min()) - 0.3, np.log10(ys.max()) + 0.3] if ys.size else [-6, 1]
        frames.append(go.Frame(data=data, name=str(lab), layout=dict(yaxis=dict(range=y_range))))
    fig = go.Figure(data=frames[0].data, frames=frames)
    fig.update_layout(title=title, sliders=[_slider(list(labels), "")], height=FIGURE_HEIGHT + 80, margin=dict(b=120),
                      yaxis=dict(range=frames[0].layout.yaxis.range))
    fig.update_xaxes(title="sequence length L (tokens, log scale)", type="log")
    fig.update_yaxes(title="1/p - 1 (distractor / target attention, log scale)", type="log", exponentformat="power")
    return fig


# --- chapter 6: linear-attention control and min-norm interpolant

# many legend entries: below the plot, so they never run into the title
_LEGEND_BELOW = dict(height=FIGURE_HEIGHT + 140, margin=dict(l=70, r=30, t=100, b=180),
                     legend=dict(orientation="h", x=0.0, xanchor="left", y=-0.2, yanchor="top"))

def offset_kernels(curves: dict, train_len: int, target_offset: int, title: str,
                   y_title: str = "attention weight s(D), scaled so that s(-k) = 1") -> go.Figure:
    """Offset kernels ``s(D)`` against the offset, with the training window shaded.

    Args:
        curves: ``{name: (offsets [n], values [n] or [n_seeds, n])}``; a 2-D array is drawn as its mean
            with a min..max band.
        train_len: the training offsets ``-(train_len-1) .. -1`` are shaded.
        target_offset: k; a dotted vertical line marks ``D = -k``.
        title: figure title.

    Returns:
        a plotly ``Figure`` (x: offset D in tokens, key minus query).

    Raises:
        ValueError: ``curves`` is empty or an array does not match its offsets.
    """
    if not curves:
        raise ValueError("curves must name at least one curve")
    fig = go.Figure()
    palette = ["#2ca02c", "#1f77b4", "#ff7f0e", "#9467bd", "#d62728", "#8c564b"]
    for i, (name, (offsets, values)) in enumerate(curves.items()):
        offsets = np.asarray(offsets)
        values = np.atleast_2d(np.asarray(values, dtype=float))
        if values.shape[1] != len(offsets):
            raise ValueError(f"values for {name!r} must have {len(offsets)} columns; got {values.shape}")
        color = palette[i % len(palette)]
        if values.shape[0] > 1:
            fig.add_trace(go.Scatter(x=np.concatenate([offsets, offsets[::-1]]),
                                     y=np.concatenate([values.max(0), values.min(0)[::-1]]), mode="lines",
                                     fill="toself", fillcolor=_rgba(color, 0.2), line=dict(width=0),
                                     hoverinfo="skip", showlegend=False, legendgroup=_label(name)))
        label = name if values.shape[0] == 1 else f"{name} (mean of {values.shape[0]})"
        fig.add_trace(go.Scatter(x=offsets, y=values.mean(0), mode="lines", name=label, legendgroup=_label(name),
                                 line=dict(color=color, width=2, dash="dash" if i % 2 else "solid")))
    fig.add_vrect(x0=-(train_len - 1) - 0.5, x1=-0.5, fillcolor="gray", opacity=0.12, line_width=0,
                  annotation_text="trained offsets", annotation_position="top left")
    fig.add_vline(x=-target_offset, line=dict(color="black", dash="dot", width=1))
    fig.add_hline(y=0, line=dict(color="black", width=0.5))
    fig.update_layout(title=title, **_LEGEND_BELOW)
    fig.update_xaxes(title="offset D = key position - query position (tokens)")
    fig.update_yaxes(title=y_title)
    return fig


def predicted_vs_measured(curves: dict, train_len: int, title: str,
                          y_title: str = "mean squared error ||o - e(y)||^2 (log scale)") -> go.Figure:
    """A closed-form prediction (line) against measurements (markers: mean, error bars: min..max over seeds).

    Args:
        curves: ``{name: (lengths [n], predicted [n], measured [n_seeds, n])}``.
        train_len: drawn as a vertical line.
        title: figure title.

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
        color = palette[i % len(palette)]
        mean = measured.mean(0)
        fig.add_trace(go.Scatter(x=lengths, y=predicted, mode="lines", name=f"{name}: predicted",
                                 line=dict(color=color, width=2)))
        fig.add_trace(go.Scatter(x=lengths, y=mean, mode="markers", name=f"{name}: measured (mean of {measured.shape[0]})",
                                 marker=dict(color=color, size=10, symbol="circle-open", line=dict(width=2)),
                                 error_y=dict(type="data", symmetric=False, array=measured.max(0) - mean,
                                              arrayminus=mean - measured.min(0))))
    fig.add_vline(x=float(np.log10(train_len)), line=dict(color="gray", dash="dash", width=1.5),  # log axis: log10 units
                  annotation_text="training length", annotation_position="top right")
    fig.update_layout(title=title, **_LEGEND_BELOW)
    ticks = sorted({int(x) for _, (lengths, _, _) in curves.items() for x in lengths} | {int(train_len)})
    fig.update_xaxes(title="evaluation sequence length L (tokens, log scale)", type="log", tickvals=ticks,
                     ticktext=[str(t) for t in ticks],
                     range=[float(np.log10(ticks[0])) - 0.1, float(np.log10(ticks[-1])) + 0.1])
    fig.update_yaxes(title=y_title, type="log", dtick="D2")  # label 1, 2, 5 per decade: the default crowds 2..9
    return fig


# --- transformer (chapter 7)
def accuracy_by_position(curves: dict, chance: float, train_len: int, title: str) -> go.Figure:
    """Token accuracy at each position of a long sequence, mean over seeds with a min..max band.

    Args:
        curves: ``{name: accuracy [n_seeds, L]}`` (NaN where a position is never scored).
        chance: chance accuracy (dotted line).
        train_len: training length (dashed line: positions to its right were never trained).
        title: figure title.

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
        color = _color(name, i)
        fig.add_trace(go.Scatter(x=np.concatenate([pos, pos[::-1]]), y=np.concatenate([acc.max(0), acc.min(0)[::-1]]),
                                 mode="lines", fill="toself", fillcolor=_rgba(color, 0.18), line=dict(width=0),
                                 hoverinfo="skip", showlegend=False))
        fig.add_trace(go.Scatter(x=pos, y=acc.mean(0), mode="lines", name=f"{_label(name)} (mean of {acc.shape[0]})",
                                 line=dict(color=color, width=2)))
    fig.add_hline(y=chance, line=dict(color="black", dash="dot", width=1.5),
                  annotation_text=f"chance = {chance:.3f}", annotation_position="bottom right")
    fig.add_vline(x=train_len - 0.5, line=dict(color="gray", dash="dash", width=1),
                  annotation_text="training length", annotation_position="top right")
    flag_below_chance(fig, means, chance)
    fig.update_layout(title=seed_note(title, min(n_seeds)))
    fig.update_xaxes(title="position t in the sequence (tokens)")
    fig.update_yaxes(title="token accuracy at position t (fraction)", range=[-0.02, 1.05])
    return fig


def head_offset_heatmap(profile, title: str, max_offset: int | None = None, value: str = "mean attention weight") -> go.Figure:
    """Heatmap of a per-head offset profile: rows = (layer, head), columns = offset ``D = -d``.

    Args:
        profile: ``[n_layers, n_heads, n_offsets]`` (index ``d`` is offset ``-d``).
        title: figure title.
        max_offset: show offsets ``0 .. -max_offset`` only.
        value: what the colour encodes (colour-bar title).
    """
    profile = np.asarray(profile, dtype=float)
    n_layers, n_heads, n_off = profile.shape
    n_off = n_off if max_offset is None else min(n_off, max_offset + 1)
    z = profile[:, :, :n_off].reshape(n_layers * n_heads, n_off)
    rows = [f"layer {l + 1} head {h + 1}" for l in range(n_layers) for h in range(n_heads)]
    fig = go.Figure(go.Heatmap(z=z, x=[-d for d in range(n_off)], y=rows, colorscale="Viridis",
                               colorbar=dict(title=value),
                               hovertemplate="%{y}, offset %{x}: %{z:.3f}<extra></extra>"))
    fig.update_layout(title=title, height=max(FIGURE_HEIGHT, 60 + 28 * len(rows)))
    fig.update_xaxes(title="offset D = key position - query position (tokens)", autorange="reversed")
    fig.update_yaxes(title="", autorange="reversed")
    return fig


# --- static explorers (web book sliders)
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
            :func:`lengthgen_utils.probes.attention_argmax_histogram`).
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
    palette = PALETTE
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
    palette = PALETTE

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


# --- the encoding zoo (chapter 9)
class Table:
    """A table that a notebook shows as HTML (in the web book) and ``print`` shows as aligned text.

    Args:
        header: column titles.
        cells: rows of strings, one per column.
        caption: a line above the table.

    Raises:
        ValueError: a row whose length differs from the header's.
    """

    def __init__(self, header, cells, caption: str = ""):
        self.header = [str(h) for h in header]
        self.cells = [[str(c) for c in row] for row in cells]
        for i, row in enumerate(self.cells):
            if len(row) != len(self.header):
                raise ValueError(f"row {i} has {len(row)} cells; the header has {len(self.header)}")
        self.caption = caption

    def __str__(self) -> str:
        widths = [max([len(h)] + [len(row[i]) for row in self.cells]) for i, h in enumerate(self.header)]
        lines = ([self.caption] if self.caption else []) + ["  ".join(h.ljust(w) for h, w in zip(self.header, widths))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in self.cells]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        from html import escape

        head = "".join(f"<th>{escape(h)}</th>" for h in self.header)
        body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in self.cells)
        caption = f"<caption>{escape(self.caption)}</caption>" if self.caption else ""
        return (f'<div style="overflow-x:auto"><table class="lengthgen-table" style="font-size:0.85em">'
                f"{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")


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
                        subplot_titles=("accuracy (mean, min..max)", "attention at the longest length"))
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
                  annotation_text=f"chance {chance:.3f}", annotation_position="bottom right")
    fig.add_vrect(x0=-0.5, x1=train_len - 0.5, fillcolor="gray", opacity=0.15, line_width=0, row=1, col=2)
    ticks = sorted(ticks)
    fig.update_xaxes(title="length / training length (log scale)", tickvals=np.log2(ticks),
                     ticktext=[f"{t}x" for t in ticks], row=1, col=1)
    fig.update_yaxes(title="accuracy (fraction)", range=[-0.02, 1.05], row=1, col=1)
    fig.update_xaxes(title="key position (tokens)", range=[-1, attention.shape[1]], row=1, col=2)
    fig.update_yaxes(title="attention weight", range=[-0.02, 1.05], row=1, col=2)
    fig.update_layout(title=title, height=FIGURE_HEIGHT + 60, margin=dict(t=150, b=70),
                      legend=dict(orientation="h", x=0.0, xanchor="left", y=1.13, yanchor="bottom"))
    return fig


def offset_margin_profiles(curves: dict, train_len: int, offset: int, title: str) -> go.Figure:
    """The trained query's logit at each offset minus its logit at the target offset: one panel per encoding.

    The encodings' margins differ by orders of magnitude, so each panel has its own y axis.

    Args:
        curves: ``{encoding (or name): margins [n_seeds, L]}``, column ``j`` at offset ``D = j - (L-1)``
            (e.g. :func:`lengthgen_utils.zoo.offset_margins`); drawn as the mean with a min..max band.
        train_len: the offsets the training sequences contained, ``-(train_len-1) .. 0``, are shaded.
        offset: the target offset k (its margin is 0 by construction; a dotted line).
        title: figure title.

    Returns:
        a plotly ``Figure`` with two panels per row: x = offset D (tokens), y = margin (logit units); a key
        above the zero line beats the target.

    Raises:
        ValueError: ``curves`` is empty or an array is not 2-D.
    """
    from plotly.subplots import make_subplots

    _check_panels(curves, "curves")
    n_rows = (len(curves) + 1) // 2
    fig = make_subplots(rows=n_rows, cols=2, subplot_titles=[_label(n) for n in curves],
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
        fig.update_xaxes(title="offset D (tokens)" if row == n_rows else None, row=row, col=col)
        fig.update_yaxes(title="margin (logits)" if col == 1 else None, row=row, col=col)
    fig.update_layout(title=title, height=150 + 210 * n_rows, margin=dict(t=110))
    return fig


def violations_by_encoding(values: dict, tolerance: float, title: str, floor: float = 1e-9) -> go.Figure:
    """The shift test's violation per encoding: random and trained heads side by side, log scale.

    Args:
        values: ``{encoding (or name): (random, trained)}``, the largest logit change under a global shift.
        tolerance: the exactness threshold, drawn as a vertical line.
        title: figure title.
        floor: a value below it (an exact 0) is drawn at ``floor`` and says so on hover.

    Returns:
        a plotly ``Figure`` with one row per encoding.
    """
    _check_panels(values, "values")
    names = list(values)
    labels = [_label(n) for n in names]
    fig = go.Figure()
    for k, (kind, symbol) in enumerate((("random head", "circle-open"), ("trained", "circle"))):
        xs = [float(values[n][k]) for n in names]
        fig.add_trace(go.Scatter(x=[max(x, floor) for x in xs], y=labels, mode="markers", name=kind,
                                 marker=dict(symbol=symbol, size=11, color=[_color(n, i) for i, n in enumerate(names)],
                                             line=dict(width=2, color=[_color(n, i) for i, n in enumerate(names)])),
                                 customdata=xs, hovertemplate="%{y}, " + kind + ": %{customdata:.2e}<extra></extra>"))
    fig.add_vline(x=tolerance, line=dict(color="black", dash="dash", width=1),
                  annotation_text=f"tolerance {tolerance:g}", annotation_position="top")
    fig.update_layout(title=title, height=max(FIGURE_HEIGHT, 140 + 32 * len(names)), margin=dict(l=230))
    fig.update_xaxes(title=f"max |Δ logit| (log scale; 0 drawn at {floor:g})",
                     type="log", exponentformat="power")
    fig.update_yaxes(autorange="reversed")
    return fig
