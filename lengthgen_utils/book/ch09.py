"""Chapter 9, the position-encoding zoo: the probes of its runs and the summary table.

The chapter asks, for each encoding people use, the same four questions: is the logit a function of the
offset alone (the shift test of chapter 2), does the trained model extrapolate (chapter 1's retrieval head
and chapter 7's delayed copy), what did training select (where the attention argmax lands beyond the
training range), and, for learned absolute positions, does changing only the training distribution
(randomised positions) change the selected rule. The runs come from :mod:`lengthgen_utils.run.zoo`
(``{pe: Runs}``, one ensemble of one encoding each); the functions here take one such :class:`Runs`.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

from .._validate import check_int, check_int_sequence
from ..analysis.probes import (PLACEMENTS, argmax_placement, attention_argmax, copy_head_placement,
                               shift_attention_change, shift_invariance, shift_logit_difference)
from ..core.encodings import get_encoding
from ..core.models import Transformer
from ..run.results import Runs
from ..core.seeding import generator
from ..run.training import model_threads
from ..run.zoo import SHIFTS, SPAN
import numpy as np
import plotly.graph_objects as go
from .render import FIGURE_HEIGHT
from .sliders import _check_panels
from .style import color_for, label_of, rgba, short_label


def visited(run: Runs) -> int:
    """Positions ``0 .. n-1`` training visited (:meth:`~lengthgen_utils.core.encodings.Encoding.visited_positions`)."""
    return run.pe.visited_positions(run.config.train_len)


def mean_at(run: Runs, multiple: int) -> float | None:
    """Mean accuracy over the seeds at ``multiple`` times the training length (None if not evaluated there)."""
    seq_len = multiple * run.config.train_len
    return float(run.accuracy[:, run.lengths.index(seq_len)].mean()) if seq_len in run.lengths else None


# ---------------------------------------------------------------- probes over a zoo
def _package_threads(probe):
    """Run ``probe(run, ...)`` with the package's intra-op CPU threads (as training and evaluation do): the
    probes' tensors are tiny, and two threads made them many times slower on a busy 2-core machine."""
    @functools.wraps(probe)
    def wrapper(run, *args, **kwargs):
        with model_threads(run.model):
            return probe(run, *args, **kwargs)
    return wrapper


@_package_threads
def shift_violation(run: Runs, shifts=SHIFTS, n_samples: int = 2, seed: int = 1) -> tuple[float, float]:
    """The shift test of chapter 2 on the random (initial) and the trained models of ``run``.

    The largest change of any logit when every position moves by each of ``shifts``, at the training
    length; for an encoding whose frequencies change with the length (PI, NTK) also at 4x the training
    length, where the scaling acts. Single heads: the query's score row
    (:func:`~lengthgen_utils.analysis.probes.shift_logit_difference`); transformers: the output logits on
    ``n_samples`` probe sequences (:func:`~lengthgen_utils.analysis.probes.shift_invariance`).

    Returns:
        ``(random, trained)``: the largest change over models, shifts and lengths (logit units).
    """
    shifts = check_int_sequence("shifts", shifts, minimum=1)
    lengths = [run.config.train_len] + ([SPAN * run.config.train_len] if run.pe.length_dependent else [])
    out = []
    for model in (run.initial_model().to(run.model.device).eval(), run.model):
        worst = 0.0
        for seq_len in lengths:
            if isinstance(model, Transformer):
                tokens, _ = run.config.task.sample(n_samples, seq_len, generator(seed),
                                                       device=model.device)
                worst = max(worst, max(shift_invariance(model, tokens, shifts).values()))
            else:
                worst = max(worst, float(shift_logit_difference(model, seq_len, shifts).max()))
        out.append(worst)
    return out[0], out[1]


@_package_threads
def placement(run: Runs, offset: int | None = None, seq_len: int | None = None,
              min_query: int | None = None) -> Tensor:
    """Where the trained models attend beyond the training length (see :data:`~lengthgen_utils.analysis.probes.PLACEMENTS`).

    Single heads: every evaluation length beyond the training length, one argmax per (seed, length)
    (:func:`~lengthgen_utils.analysis.probes.argmax_placement`; ``offset`` is the task's). Transformers: the copying
    head of each seed at every query beyond the training length of ``seq_len``-token probes (default the
    longest evaluation length; queries from ``min_query``, default the training length;
    :func:`~lengthgen_utils.analysis.probes.copy_head_placement`).

    Returns:
        float64 ``[n_seeds, 3]``: the share of cases at the offset, pinned, elsewhere.
    """
    if isinstance(run.model, Transformer):
        seq_len = max(run.lengths) if seq_len is None else seq_len
        return copy_head_placement(run.model, run.config.task, seq_len, run.config.train_len, visited(run),
                                   n_samples=4, min_query=min_query)[0]
    offset = run.config.offset if offset is None else offset
    codes = argmax_placement(run.model, [L for L in run.lengths if L > run.config.train_len], offset, visited(run))
    return torch.stack([(codes == c).double().mean(1) for c in range(len(PLACEMENTS))], -1)


def placement_label(fractions: Tensor) -> str:
    """A table cell for :func:`placement`: the mean shares at the offset / pinned / elsewhere, e.g.
    ``"0.00/0.97/0.03"``."""
    return "/".join(f"{float(x):.2f}" for x in fractions.mean(0))


@_package_threads
def offset_margins(run: Runs, seq_len: int | None = None) -> Tensor:
    """The query's logit at every key minus its logit at the target key ``L-1-k``: ``[n_seeds, L]``.

    Column ``j`` is the relative position ``D = j - (L-1)``. Negative everywhere but the target means the target
    wins the argmax; a key with a margin near 0 or above is an alias (chapter 4). Single heads only.
    """
    seq_len = max(run.lengths) if seq_len is None else check_int("seq_len", seq_len, minimum=2)
    with torch.no_grad():
        s = run.model.scores(seq_len).double().cpu()
    return s - s[:, seq_len - 1 - run.config.offset, None]


@_package_threads
def attention_at(run: Runs, seq_len: int | None = None) -> Tensor:
    """The trained query's attention weights over the keys at ``seq_len`` (default the longest length):
    ``[n_seeds, L]``."""
    seq_len = max(run.lengths) if seq_len is None else check_int("seq_len", seq_len, minimum=2)
    with torch.no_grad():
        return run.model.attention_row(seq_len).double().cpu()


@_package_threads
def argmax_positions(run: Runs, lengths) -> Tensor:
    """The key each trained single head attends to most at each length: LongTensor ``[n_seeds, len(lengths)]``
    (:func:`~lengthgen_utils.analysis.probes.attention_argmax`)."""
    return attention_argmax(run.model, lengths)


def offset_readers(run: Runs, seq_len: int, min_accuracy: float = 0.9) -> Tensor:
    """Which seeds of a trained single-head run read the key ``k`` back at length ``seq_len``: accuracy at
    least ``min_accuracy`` there *and* the attention argmax on the target ``L - 1 - k``. Bool ``[n_seeds]``.

    Raises:
        ValueError: ``seq_len`` is not one of the run's evaluation lengths.
    """
    if seq_len not in run.lengths:
        raise ValueError(f"seq_len must be one of the run's evaluation lengths {run.lengths}; got {seq_len!r}")
    offset = run.config.offset
    accurate = run.accuracy[:, run.lengths.index(seq_len)] >= min_accuracy
    return accurate & (argmax_positions(run, [seq_len])[:, 0] == seq_len - 1 - offset)


@_package_threads
def control_shift_change(run: Runs, inside=(17, 24, 32, 40, 48),
                         outside=(64, 112, 176, 240)) -> tuple[Tensor, Tensor]:
    """How much a global shift changes a trained single head's attention at the training length: shifts that
    keep the sequence inside the positions training visited, and shifts that move it beyond.

    Each row is compared with the row at positions ``train_len .. 2*train_len - 1`` (well inside the visited
    range, whose first rows a random shift visits least), in total-variation distance
    (:func:`~lengthgen_utils.analysis.probes.shift_attention_change`): 0 = the same attention row, 1 = disjoint rows.
    Every shift is kept: a seed whose offset rule holds at most placements but not at one has one large
    value among small ones, and a summary over seeds *and* shifts (a median) is not decided by that one.

    Returns:
        ``(inside [n_seeds, len(inside)], outside [n_seeds, len(outside)])``.

    Raises:
        ValueError: a shift meant to stay inside does not, or one meant to leave does not leave.
    """
    inside, outside = check_int_sequence("inside", inside, 1), check_int_sequence("outside", outside, 1)
    seq_len, n_visited = run.config.train_len, visited(run)
    if max(inside) + seq_len > n_visited or min(outside) + seq_len <= n_visited:
        raise ValueError(f"inside shifts must keep positions below {n_visited} and outside ones must pass it; "
                         f"got inside={inside}, outside={outside} at L={seq_len}")
    return (shift_attention_change(run.model, seq_len, inside, reference=seq_len),
            shift_attention_change(run.model, seq_len, outside, reference=seq_len))


# ---------------------------------------------------------------- the summary table
RETRIEVAL_MULTIPLES = (2, 4, 16)
COPY_MULTIPLES = (2, 4, 8)


def run_for(runs: dict, pe) -> Runs | None:
    """The run of the same encoding in ``runs`` (matched by label: the two tasks train at different lengths, so
    e.g. their randomised ranges differ), or None when the profile did not run it."""
    label = get_encoding(pe).label
    return next((r for r in runs.values() if r.pe.label == label), None)


def summary_rows(retrieval: dict, copy: dict, violations: dict | None = None,
                 placements: dict | None = None) -> list[dict]:
    """One row per encoding of ``retrieval``: what the chapter's table shows, computed from the runs.

    Args:
        retrieval, copy: ``{pe: Runs}`` from :func:`run_retrieval_zoo` and :func:`run_copy_zoo`.
        violations: ``{pe: (random, trained)}`` already computed by :func:`shift_violation` (else computed).
        placements: ``{pe: [n_seeds, 3]}`` already computed by :func:`placement` for ``retrieval`` (else computed).

    Returns:
        dicts with keys ``encoding`` (label), ``relative`` (by construction), ``retrieval`` and ``copy``
        (``{multiple: mean accuracy}``, None where the profile did not run the encoding), ``placement`` and
        ``copy_placement`` (:func:`placement_label`), ``shift_random`` and ``shift_trained`` (single head).
    """
    rows = []
    for pe, run in retrieval.items():
        random_shift, trained_shift = (violations or {}).get(pe) or shift_violation(run)
        where = (placements or {}).get(pe)
        copy_run = run_for(copy, pe)
        rows.append({
            "encoding": pe.label, "relative": bool(pe.relative),
            "retrieval": {m: mean_at(run, m) for m in RETRIEVAL_MULTIPLES},
            "copy": {m: (mean_at(copy_run, m) if copy_run is not None else None) for m in COPY_MULTIPLES},
            "placement": placement_label(where if where is not None else placement(run)),
            "copy_placement": placement_label(placement(copy_run)) if copy_run is not None else None,
            "shift_random": random_shift, "shift_trained": trained_shift,
        })
    return rows


def summary_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The header and the cells (strings) of the chapter's summary table, from :func:`summary_rows`."""
    header = ["encoding", "relative by construction",
              "retrieval " + " / ".join(f"{m}x" for m in RETRIEVAL_MULTIPLES),
              "delayed copy " + " / ".join(f"{m}x" for m in COPY_MULTIPLES),
              "retrieval argmax: offset / pinned / elsewhere", "copying head: offset / pinned / elsewhere",
              "shift violation: random head, trained"]

    def accuracies(values: dict) -> str:
        if any(v is None for v in values.values()):
            return "not run"
        return "/".join(f"{v:.2f}" for v in values.values())

    def violation(x: float) -> str:  # a minus sign, not a hyphen: the cell never breaks inside a number
        return f"{x:.0e}".replace("-", "\u2212") if x > 0 else "0"

    cells = []
    for r in rows:
        cells.append([r["encoding"], "yes" if r["relative"] else "no", accuracies(r["retrieval"]),
                      accuracies(r["copy"]), r["placement"], r["copy_placement"] or "not run",
                      f"{violation(r['shift_random'])}, {violation(r['shift_trained'])}"])
    return header, cells


# ---------------------------------------------------------------- figures
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
                                 mode="lines", fill="toself", fillcolor=rgba(color, 0.15), line=dict(width=0),
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
    fig.update_xaxes(title="key position j<br>(tokens)", range=[-1, attention.shape[1]], row=1, col=2)
    fig.update_yaxes(title="attention weight", range=[-0.02, 1.05], row=1, col=2)
    fig.update_layout(title=title, height=FIGURE_HEIGHT + 60, margin=dict(t=150, b=70),
                      legend=dict(orientation="h", x=0.0, xanchor="left", y=1.13, yanchor="bottom"))
    return fig


def offset_margin_profiles(curves: dict, train_len: int, offset: int, title: str) -> go.Figure:
    """The trained query's logit at each relative position D minus its logit at the target's: one panel per encoding.

    The encodings' margins differ by orders of magnitude, so each panel has its own y axis.

    Args:
        curves: ``{encoding (or name): margins [n_seeds, L]}``, column ``j`` at relative position ``D = j - (L-1)``
            (e.g. :func:`lengthgen_utils.run.zoo.offset_margins`); drawn as the mean with a min..max band.
        train_len: the offsets the training sequences contained, ``-(train_len-1) .. 0``, are shaded.
        offset: the target offset k (its margin is 0 by construction; a dotted line).
        title: figure title.

    Returns:
        a plotly ``Figure`` with two panels per row: x = relative position D = j - m (tokens), y = margin (logit units); a key
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
        color = color_for(name, i)
        fig.add_trace(go.Scatter(x=np.concatenate([d, d[::-1]]), y=np.concatenate([m.max(0), m.min(0)[::-1]]),
                                 mode="lines", fill="toself", fillcolor=rgba(color, 0.2), line=dict(width=0),
                                 hoverinfo="skip", showlegend=False), row=row, col=col)
        fig.add_trace(go.Scatter(x=d, y=m.mean(0), mode="lines", showlegend=False, line=dict(color=color, width=1.5),
                                 hovertemplate=f"{label_of(name)}, " + "D=%{x}: margin %{y:.2f}<extra></extra>"),
                      row=row, col=col)
        fig.add_vrect(x0=-(train_len - 1) - 0.5, x1=0.5, fillcolor="gray", opacity=0.15, line_width=0,
                      row=row, col=col)
        fig.add_vline(x=-offset, line=dict(color="black", dash="dot", width=1), row=row, col=col)
        fig.add_hline(y=0, line=dict(color="black", width=1), row=row, col=col)
        # "D (tokens)": "D = j − m (tokens)" runs into its neighbour and past the edge at 400 px; the caption says D = j − m
        fig.update_xaxes(title="D (tokens)" if row == n_rows else None, row=row, col=col)
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
                                 marker=dict(symbol=symbol, size=11, color=[color_for(n, i) for i, n in enumerate(names)],
                                             line=dict(width=2, color=[color_for(n, i) for i, n in enumerate(names)])),
                                 customdata=xs, hovertemplate="%{y}, " + kind + ": %{customdata:.2e}<extra></extra>"))
    fig.add_vline(x=tolerance, line=dict(color="black", dash="dash", width=1), name="tolerance", showlegend=True)
    fig.update_layout(title=title, height=max(FIGURE_HEIGHT, 140 + 32 * len(names)))
    drawn = [max(float(v[k]), floor) for v in values.values() for k in (0, 1)]
    span = [np.log10(min(drawn + [tolerance])) - 0.5, np.log10(max(drawn + [tolerance])) + 0.5]
    fig.update_xaxes(title="max |Δ logit| (log scale)", type="log", exponentformat="power", range=span,
                     dtick=4, tick0=0, tickangle=0)  # a label every 4 decades: more collide on a phone
    fig.update_yaxes(autorange="reversed")
    return fig
