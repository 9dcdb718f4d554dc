"""Chapter 2, RoPE's exact relative-offset equivariance: its figures (shift differences, angle errors, logit rows)
and the comparison of trained with untrained APE heads under a global position shift."""
from __future__ import annotations


import numpy as np
import plotly.graph_objects as go
import torch
from torch import Tensor

from .._validate import check_int, check_int_sequence, check_positive_float
from ..analysis import probes
from ..analysis.probes import shift_attention_change
from .sliders import _check_panels
from .style import color_for, label_of
from .tables import Table


# ---------------------------------------------------------------- trained against untrained heads
def shift_attention_moves(pairs: dict, seq_len: int, shifts) -> dict[str, tuple[Tensor, Tensor]]:
    """How much of each head's attention a global position shift moves, trained heads and the same heads
    untrained.

    For every group ``name: (trained, untrained)`` of position-only heads, the total-variation distance
    ``0.5 * sum_j |a_j(shift) - a_j(0)|`` between the query's attention row over positions
    ``shift .. shift + L - 1`` and over ``0 .. L - 1``
    (:func:`~lengthgen_utils.analysis.probes.shift_attention_change`): 0 when the shift leaves the
    attention as it was (RoPE, by chapter 2's theorem), 1 when the two rows share no weight. The untrained
    heads (the same seeds before training, e.g. ``Runs.initial_model()``) are the null: an APE head's
    logits move under a shift whether or not it was trained, and what training adds is attention that a
    shift can move.

    Args:
        pairs: ``{name: (trained, untrained)}``, two ``RetrievalHead`` ensembles per group (the same
            architecture; any number of members each).
        seq_len: the sequence length L >= 1 (tokens).
        shifts: non-empty sequence of ints >= 1 (positions; for an APE table ``shift + L`` must fit it).

    Returns:
        ``{name: (trained [M, S], untrained [M', S])}``, float64 on CPU, in [0, 1].

    Raises:
        ValueError / TypeError: ``pairs`` empty or not pairs; a bad ``seq_len`` or ``shifts``; a shift
            the encoding cannot cover.
    """
    if not isinstance(pairs, dict) or not pairs:
        raise ValueError(f"pairs must be a non-empty dict {{name: (trained, untrained)}}; got {pairs!r:.80}")
    seq_len = check_int("seq_len", seq_len, minimum=1)
    shifts = check_int_sequence("shifts", shifts, minimum=1)
    moves = {}
    for name, pair in pairs.items():
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"pairs[{name!r}] must be a (trained, untrained) pair of heads; got {pair!r:.80}")
        moves[name] = tuple(shift_attention_change(m, seq_len, shifts) for m in pair)
    return moves


def shift_separation(moves: dict, factor: float = 10.0) -> dict:
    """What separates trained from untrained heads in :func:`shift_attention_moves`, pooled over the groups
    (offsets, runs) and their (seed, shift) pairs.

    Args:
        moves: the output of :func:`shift_attention_moves`.
        factor: a trained (head, shift) pair counts as separated when it moves more than ``factor`` times
            the largest move of any untrained head at any shift (> 0).

    Returns:
        dict with ``trained`` and ``untrained`` (every pair's move, flattened, float64), ``trained_median``,
        ``trained_min``, ``untrained_max`` (floats, in [0, 1]), ``gap`` (``trained_median - untrained_max``)
        and ``separated`` (bool ``[pairs]``, one per trained (head, shift) pair, in the order of ``moves``).

    Raises:
        ValueError: ``moves`` is empty; ``factor`` not a positive number.
    """
    if not isinstance(moves, dict) or not moves:
        raise ValueError("moves must be the non-empty dict that shift_attention_moves returns")
    factor = check_positive_float("factor", factor)
    trained = torch.cat([torch.as_tensor(t, dtype=torch.float64).flatten() for t, _ in moves.values()])
    untrained = torch.cat([torch.as_tensor(u, dtype=torch.float64).flatten() for _, u in moves.values()])
    untrained_max = float(untrained.max())
    median = float(trained.median())
    return dict(trained=trained, untrained=untrained, trained_median=median, trained_min=float(trained.min()),
                untrained_max=untrained_max, gap=median - untrained_max, separated=trained > factor * untrained_max)


def shift_moves_table(moves: dict, caption: str = "") -> Table:
    """One row per group of :func:`shift_attention_moves`: the trained heads' smallest and median move over
    their (seed, shift) pairs, and the untrained heads' median and largest."""
    if not isinstance(moves, dict) or not moves:
        raise ValueError("moves must be the non-empty dict that shift_attention_moves returns")
    rows = []
    for name, (t, u) in moves.items():
        t, u = torch.as_tensor(t).flatten(), torch.as_tensor(u).flatten()
        rows.append({"heads": name, "trained: smallest": f"{float(t.min()):.3f}",
                     "trained: median": f"{float(t.median()):.3f}",
                     "untrained: median": f"{float(u.median()):.4f}",
                     "untrained: largest": f"{float(u.max()):.4f}"})
    return Table.from_rows(rows, caption)


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


# --- the exercises' numbers (chapter 2, "Exercises": the solutions quote this page's run)
def float32_angle_numbers(model, seq_len: int, shift: int = 10**7) -> dict:
    """Exercise 3: a trained RoPE head's query row with its angles formed in float32 at positions
    ``shift .. shift + seq_len - 1``, against the exact (float64) angles.

    Returns:
        ``{name: value}`` for the glue names ``ch2_ex3_<name>``: ``change_min``, ``change_max`` (over the
        seeds, the largest change of the query row), ``err1``, ``err2`` (the largest float32 angle error of
        pairs 1 and 2 at those positions, rad), ``err_max`` (of any pair), ``r_min``, ``r_max`` (the
        amplitudes ``r_i`` of pairs 0 and 1 over the seeds, logit units) and ``bound_min``, ``bound_max``
        (over the seeds, ``2 sum_i r_i eps_i``: the query's and the key's angles each off by at most
        ``eps_i``, a term ``r_i cos(theta_i D - phi_i)`` moves by at most ``2 r_i eps_i``).

    Source: chapter 2, exercise 3.
    """
    from ..analysis.kernel import carrier_spectrum

    exact = probes.position_logits(model, seq_len, shift)
    low = probes.position_logits(model, seq_len, shift, angle_dtype="float32")
    change = (low - exact)[:, -1].abs().amax(-1).double().cpu()  # per seed
    positions = torch.arange(shift, shift + seq_len)
    cfg = model.config
    eps = probes.rope_angle_error(positions, cfg.d_head, cfg.pe.base, dtype=torch.float32).amax(0)  # per pair
    r = carrier_spectrum(model).r  # [M, pairs]
    bound = 2 * (r * eps).sum(1)
    return {"change_min": float(change.min()), "change_max": float(change.max()),
            "err1": float(eps[1]), "err2": float(eps[2]), "err_max": float(eps.max()),
            "r_min": float(r[:, :2].min()), "r_max": float(r[:, :2].max()),
            "bound_min": float(bound.min()), "bound_max": float(bound.max())}
