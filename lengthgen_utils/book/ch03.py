"""Chapter 3, learned absolute positions pin to a trained position: its figures (argmax histograms, attention rows)."""
from __future__ import annotations


import numpy as np
import plotly.graph_objects as go

from .._validate import check_int, check_int_sequence
from ..analysis.probes import attention_argmax, attention_at, pinned_position
from ..core.encodings import LearnedAPE
from .sliders import _check_panels, slider_figure
from .style import PALETTE, rgba
from .tables import Table


def pin_summary(model, test_lengths, train_len: int, longest: int | None = None) -> dict:
    """Where a position-only head's attention argmax pins, how often, and how much attention the pin gets.

    Args:
        model: a ``RetrievalHead`` ensemble (M models).
        test_lengths: non-empty sequence of test lengths L >= 1 (tokens).
        train_len: the longest training length; positions below it are "inside the training range".
        longest: the length at which the attention on the pinned key is read (default: the largest of
            ``test_lengths``).

    Returns:
        dict of tensors ``[M]``: ``position`` (the most frequent argmax position over the test lengths,
        :func:`~lengthgen_utils.analysis.probes.pinned_position`), ``share`` (the share of the test lengths
        whose argmax is there), ``inside`` (the share whose argmax is a position ``< train_len``) and
        ``weight`` (the attention on ``position`` at ``longest``).

    Raises:
        ValueError / TypeError: empty or non-int ``test_lengths``; ``train_len`` or ``longest`` not an
            int >= 1.
    """
    test_lengths = list(check_int_sequence("test_lengths", test_lengths, minimum=1))
    train_len = check_int("train_len", train_len, minimum=1)
    longest = max(test_lengths) if longest is None else check_int("longest", longest, minimum=1)
    position, share = pinned_position(model, test_lengths)
    inside = (attention_argmax(model, test_lengths) < train_len).double().mean(1)
    weight = attention_at(model, position, [longest])[:, 0]
    return dict(position=position, share=share, inside=inside, weight=weight)


def pin_table(pins: dict, longest: int):
    """The pin table of chapter 3: one row per training setting.

    ``pins`` maps a setting's name to :func:`pin_summary`'s dict for its seeds; ``longest`` is the length
    (tokens) at which the weight on the pin was read. Rows list the pinned position and the weight per seed,
    and the shares (of test lengths at the pin, of argmaxes inside the training range) as min..max or min.
    """
    return Table.from_rows(
        [{"training": name,
          "pinned position": " ".join(map(str, v["position"].tolist())),
          "share of lengths": f"{v['share'].min():.2f}..{v['share'].max():.2f}",
          "inside the range": f"{v['inside'].min():.2f}",
          f"weight on the pin at L = {longest}": " ".join(f"{w:.3f}" for w in v["weight"].tolist())}
         for name, v in pins.items()],
        caption="Per seed (positions, weights) or min..max over the seeds (shares)",
    )


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
    fig.update_xaxes(title="key position j of the attention argmax (tokens)")
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
    fig.update_xaxes(title="key position j (tokens)", range=[-1, seq_len if x_max is None else x_max])
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
                                 mode="lines", fill="toself", fillcolor=rgba(color, 0.18), line=dict(width=0),
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


# --- the exercises' numbers (chapter 3, "Exercises": the solutions quote this page's run)
def zeroed_unseen_rows(model, train_len: int):
    """A copy of an APE ``RetrievalHead`` ensemble whose table rows ``t >= train_len`` are zero (exercise 1);
    ``model`` is left as it is."""
    import copy

    import torch

    zeroed = copy.deepcopy(model)
    with torch.no_grad():
        zeroed.pe_params["table"][:, check_int("train_len", train_len, minimum=1):] = 0
    return zeroed


def pin_dilution(model, pin, seq_len: int, train_len: int) -> dict:
    """How far below a fixed-length APE head's pin the other keys of its length-``seq_len`` row sit, and how long
    a sequence must be before the pin gets less than half the attention (exercise 2).

    Assumes that further unseen keys look like the row's ``seq_len - train_len`` unseen ones: with the unseen
    keys a ``log mean exp`` gap ``g`` below the pin, ``L - train_len`` of them weigh ``(L - train_len) e^-g``,
    one pin's worth at ``L = train_len + e^g``.

    Args:
        model: a position-only APE ``RetrievalHead`` ensemble (M models).
        pin: per model, the pinned key position (``< train_len``).
        seq_len: the row's length; train_len: the training length.

    Returns:
        dict of float64 tensors ``[M]``: ``best`` (pin minus the best unseen key, logits), ``gap`` (``g``),
        ``trained`` (pin minus the best other trained key) and ``half`` (``train_len + e^g``, tokens).

    Source: chapter 3, exercise 2.
    """
    import torch

    s = model.scores(seq_len).detach().double()  # [M, L]
    rows = torch.arange(s.shape[0])
    at_pin = s[rows, pin]
    unseen = s[:, train_len:]
    trained = s[:, :train_len].clone()
    trained[rows, pin] = float("-inf")
    gap = at_pin - (torch.logsumexp(unseen, 1) - np.log(unseen.shape[1]))
    return dict(best=at_pin - unseen.max(1).values, gap=gap, trained=at_pin - trained.max(1).values,
                half=train_len + gap.exp())
