"""Chapter 7, the transformer: its figures (attention by distance, trained heads against their nulls) and
its copying heads, named by (layer, head) pairs.

Per-head profiles are in the package's row layout (:func:`~lengthgen_utils.analysis.kernel.relative_positions`):
``[..., n]`` with index ``j`` holding the relative position ``D = j - (n - 1)``, the last index ``D = 0``
(the query itself) and the offset ``k`` at index ``-1 - k``."""
from __future__ import annotations


import numpy as np
import plotly.graph_objects as go
import torch

from .._validate import check_int
from ..analysis.kernel import measures, relative_positions, variation
from ..analysis.probes import copying_heads
from .render import FIGURE_HEIGHT
from .tables import Table


def head_offset_heatmap(profile, title: str, max_offset: int | None = None, value: str = "mean attention weight") -> go.Figure:
    """Heatmap of a per-head profile: rows = (layer, head), columns = relative position ``D = -d`` (0 on the right).

    Args:
        profile: ``[n_layers, n_heads, n]`` in the row layout (index ``j`` holds ``D = j - (n - 1)``).
        title: figure title.
        max_offset: show relative positions ``-max_offset .. 0`` only (the last ``max_offset + 1`` columns).
        value: what the colour encodes (colour-bar title).
    """
    profile = np.asarray(profile, dtype=float)
    n_layers, n_heads, n_off = profile.shape
    n_off = n_off if max_offset is None else min(n_off, max_offset + 1)
    z = profile[:, :, profile.shape[2] - n_off:].reshape(n_layers * n_heads, n_off)  # D = -(n_off - 1) .. 0
    rows = [f"layer {l + 1} head {h + 1}" for l in range(n_layers) for h in range(n_heads)]
    fig = go.Figure(go.Heatmap(z=z, x=relative_positions(n_off).tolist(), y=rows, colorscale="Viridis",
                               colorbar=dict(title=dict(text=value, side="right")),
                               hovertemplate="%{y}, D = %{x}: %{z:.3f}<extra></extra>"))
    fig.update_layout(title=title, height=max(FIGURE_HEIGHT, 60 + 28 * len(rows)))
    fig.update_xaxes(title="relative position D = j − m (tokens)")  # left to right, as every offset axis of the book
    fig.update_yaxes(title="", autorange="reversed")
    return fig


# --- chapter 7: trained heads against an untrained null
def trained_vs_null(groups: dict, title: str, y_title: str, null_names=("untrained",),
                    trained_name: str = "trained") -> go.Figure:
    """A statistic of trained heads (one marker each) beside its null distributions (box plots), per group.

    Args:
        groups: ``{group: {"trained": values [n], "<null name>": values [m], ...}}``, e.g. one group per
            offset ``k``; every null named in ``null_names`` must be present (it may be empty).
        title: figure title.
        y_title: the statistic, with units.
        null_names: the null distributions to draw, in order.
        trained_name: the key of the trained heads' values.

    Returns:
        a plotly ``Figure``: for each group, one box per null (median, quartiles, whiskers to 1.5 IQR,
        every value drawn as a point) and the trained heads as large markers.

    Raises:
        ValueError: no group, or a group without the trained values or a null.
    """
    if not groups:
        raise ValueError("groups must name at least one group")
    fig = go.Figure()
    null_colors = ["#7f7f7f", "#bcbd22", "#17becf"]
    for j, null in enumerate(null_names):
        xs, ys = [], []
        for group, values in groups.items():
            if null not in values or trained_name not in values:
                raise ValueError(f"group {group!r} must hold {trained_name!r} and {null!r}; got {sorted(values)}")
            v = np.asarray(values[null], dtype=float).ravel()
            xs += [str(group)] * len(v)
            ys += v.tolist()
        fig.add_trace(go.Box(x=xs, y=ys, name=f"{null} (null)", boxpoints="all", jitter=0.4, pointpos=0,
                             marker=dict(color=null_colors[j % len(null_colors)], size=4), line=dict(width=1),
                             offsetgroup=str(j)))
    xs = [str(g) for g, v in groups.items() for _ in np.asarray(v[trained_name]).ravel()]
    ys = [float(x) for v in groups.values() for x in np.asarray(v[trained_name], dtype=float).ravel()]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=f"{trained_name} (each seed)",
                             marker=dict(color="#1f77b4", size=11, symbol="diamond", line=dict(width=1, color="white"))))
    fig.update_layout(title=title, boxmode="group")
    fig.update_yaxes(title=y_title)
    return fig


# --- chapter 7: the copying heads, by (layer, head)
def _profiles(name: str, values):
    if not isinstance(values, torch.Tensor) or values.dim() < 3:
        raise ValueError(f"{name} must be a tensor [M, n_layers, n_heads, ...]; got {getattr(values, 'shape', values)!r}")
    return values


def copying_head_pairs(weight, offset: int) -> list:
    """The copying head of each model as a ``(layer, head)`` pair (0-based): the head with the largest mean
    attention weight at distance ``offset`` (:func:`~lengthgen_utils.analysis.probes.copying_heads`).

    Args:
        weight: ``[M, n_layers, n_heads, n]`` mean attention weight in the row layout over
            ``D = -(n - 1) .. 0``.
        offset: the task's offset k (one int, ``1 <= k < n``).

    Returns:
        ``M`` pairs ``(layer, head)`` of ints.

    Raises:
        ValueError / TypeError: ``weight`` is not a 4-d tensor, or ``offset`` is not an int in ``1 .. n - 1``.

    Source: chapter 7, "The heads that copy, and their carrier".
    """
    weight = _profiles("weight", weight)
    offset = check_int("offset", offset, minimum=1, maximum=weight.shape[-1] - 1)
    return [(layer, head) for layer, head in copying_heads(weight, offset).tolist()]


def head_rows(values, pairs):
    """Each model's row of one head: ``values[m, layer, head]`` for the pair ``(layer, head)`` of model ``m``.

    Args:
        values: ``[M, n_layers, n_heads, ...]`` a per-head quantity (e.g. a mean logit in the row layout).
        pairs: ``M`` pairs ``(layer, head)`` (:func:`copying_head_pairs`).

    Returns:
        ``[M, ...]``.

    Raises:
        ValueError: ``values`` is not a tensor of at least 3 dimensions, ``pairs`` does not hold one pair per
            model, or a pair lies outside the model.

    Source: chapter 7.
    """
    values = _profiles("values", values)
    pairs = [tuple(int(i) for i in p) for p in pairs]
    if len(pairs) != values.shape[0] or any(len(p) != 2 for p in pairs):
        raise ValueError(f"pairs must hold one (layer, head) per model ({values.shape[0]}); got {pairs!r}")
    n_layers, n_heads = values.shape[1:3]
    if any(not (0 <= layer < n_layers and 0 <= head < n_heads) for layer, head in pairs):
        raise ValueError(f"pairs must lie in {n_layers} layers x {n_heads} heads; got {pairs!r}")
    return torch.stack([values[m, layer, head] for m, (layer, head) in enumerate(pairs)])


def _flat_rows(pairs, n_layers: int, n_heads: int):
    """The rows of ``pairs`` in a fit over every head in the order (model, layer, head): long ``[M]``."""
    row_of = torch.arange(len(pairs) * n_layers * n_heads).reshape(len(pairs), n_layers, n_heads)
    return head_rows(row_of, pairs)  # row_of[m, layer, head] is that head's row in the fit


def _window_peaks(logit, train_len: int):
    """The distance ``d`` of the largest mean logit in the window ``d = 1 .. train_len - 1``, for a profile
    ``[..., n]`` in the row layout (``n > train_len``): long ``[...]``."""
    by_distance = logit[..., -train_len:-1].flip(-1)  # a working copy: index i holds d = i + 1
    return by_distance.argmax(-1) + 1  # a tie goes to the nearest distance


def copying_head_fit(carriers, offset: int, train_len: int) -> tuple:
    """Each model's copying head, how well the carrier form fits it, and where its mean logit peaks.

    Args:
        carriers: ``(fit, logit, weight)`` of :func:`~lengthgen_utils.analysis.probes.head_carriers` (logit and
            weight ``[M, n_layers, n_heads, train_len + 1]`` in the row layout over ``D = -train_len .. 0``, the fit
            over every head, in (model, layer, head)).
        offset: the task's offset k.
        train_len: the training length: the window is ``d = 1 .. train_len - 1``.

    Returns:
        ``(pairs, r2, peaks)``: ``M`` pairs ``(layer, head)``; the carrier fit's ``R²`` ``[M]``; the distance
        ``d`` of the largest mean logit in the window, long ``[M]``.

    Raises:
        ValueError / TypeError: as :func:`copying_head_pairs`.

    Source: chapter 7, "The heads that copy, and their carrier".
    """
    fit, logit, weight = carriers
    pairs = copying_head_pairs(weight, offset)
    rows = _flat_rows(pairs, *weight.shape[1:3])
    peaks = _window_peaks(head_rows(logit, pairs), train_len)
    return pairs, fit.r2[rows], peaks


def carrier_stats(carriers, null, offset: int, train_len: int) -> dict:
    """The carrier measures of the trained copying heads and of two untrained nulls.

    Args:
        carriers: ``(fit, logit, weight)`` of :func:`~lengthgen_utils.analysis.probes.head_carriers` for the
            trained models.
        null: the same for untrained models of the same architecture.
        offset: the task's offset k.
        train_len: the training length (the window ``d = 1 .. train_len - 1``).

    Returns:
        ``{measure: {"trained": [M], "rule": [M_null], "conditioned": [n]}}`` for every measure of
        :func:`~lengthgen_utils.analysis.kernel.measures`: the trained copying heads; the head the same rule
        picks in each untrained model ("rule"); every untrained head whose mean logit peaks at ``d = k`` in the
        window ("conditioned").

    Raises:
        ValueError / TypeError: as :func:`copying_head_pairs`.

    Source: chapter 7, "The heads that copy, and their carrier".
    """
    fit, _, weight = carriers
    null_fit, null_logit, null_weight = null
    heads = _flat_rows(copying_head_pairs(weight, offset), *weight.shape[1:3])
    rule = _flat_rows(copying_head_pairs(null_weight, offset), *null_weight.shape[1:3])
    null_peak = _window_peaks(null_logit, train_len).flatten()  # every untrained head, in (model, layer, head)
    trained = measures(fit.spectrum, offset, fit.window).as_dict()
    untrained = measures(null_fit.spectrum, offset, null_fit.window).as_dict()
    return {name: {"trained": trained[name][heads], "rule": untrained[name][rule],
                   "conditioned": untrained[name][null_peak == offset]} for name in trained}


def copying_head_top2(carriers: dict, trained_heads: dict) -> dict:
    """The two pairs of largest variation over the window of each seed's copying head.

    Args:
        carriers: ``{k: (fit, logit, weight)}`` (:func:`~lengthgen_utils.analysis.probes.head_carriers`).
        trained_heads: ``{k: (pairs, r2, peaks)}`` (:func:`copying_head_fit`), the same offsets.

    Returns:
        ``{k: [(i, j), ...]}``: per seed, its copying head's two pairs of largest variation, ``i < j``.

    Raises:
        ValueError: ``carriers`` and ``trained_heads`` name different offsets.

    Source: chapter 7, "The heads that copy, and their carrier".
    """
    if list(carriers) != list(trained_heads):
        raise ValueError(f"carriers and trained_heads must name the same offsets; got {list(carriers)} "
                         f"and {list(trained_heads)}")
    top2 = {}
    for k, (pairs, _, _) in trained_heads.items():
        fit, _, weight = carriers[k]
        flat = _flat_rows(pairs, *weight.shape[1:3])
        order = variation(fit.spectrum, fit.window)[flat].argsort(1, descending=True)[:, :2].tolist()
        top2[k] = [tuple(sorted(p)) for p in order]
    return top2


def copying_head_table(carriers: dict, trained_heads: dict) -> Table:
    """The copying head of each seed (layer.head, 1-based), its window peak, its fit and its top-2 pairs.

    Args:
        carriers: ``{k: (fit, logit, weight)}`` (:func:`~lengthgen_utils.analysis.probes.head_carriers`).
        trained_heads: ``{k: (pairs, r2, peaks)}`` (:func:`copying_head_fit`), the same offsets.

    Raises:
        ValueError: ``carriers`` and ``trained_heads`` name different offsets.

    Source: chapter 7, "The heads that copy, and their carrier".
    """
    rows = []
    top2_of = copying_head_top2(carriers, trained_heads)  # checks that both name the same offsets
    for k, (pairs, r2, peaks) in trained_heads.items():
        top2 = set(top2_of[k])
        rows.append([k, ", ".join(f"{layer + 1}.{head + 1}" for layer, head in pairs),
                     ", ".join(str(p) for p in peaks.tolist()), f"{r2.min():.4f}", ", ".join(map(str, sorted(top2)))])
    return Table(["k", "copying head (layer.head), per seed", "window peak d", "fit R² (min)", "top-2 pairs"], rows,
                 caption="The copying head of each seed, where its mean logit peaks in the window, the carrier fit "
                 "and its two pairs of largest variation")


def carrier_numbers(stats: dict, trained_heads: dict, carriers: dict, top2_auc: dict) -> dict:
    """The carrier numbers chapter 7's prose quotes, ``{name: value}`` (glued as ``ch7_carrier_<name>``).

    ``stats`` maps an offset k to :func:`carrier_stats` (per measure, per group "trained" / "rule" /
    "conditioned": a tensor over heads); ``trained_heads`` to :func:`copying_head_fit`; ``carriers`` to the
    head carriers; ``top2_auc`` maps a null group to the copying heads' top-2 AUC against it. For C variation
    and C raw: the trained range, the larger null's 95th percentile (highest over k) and how many copying
    heads lie above it; the nulls' median range; how many untrained heads reach the least aligned copying
    head at their offset; the smallest fit R²; which frequency pairs the copying heads keep as their top 2.
    """
    offsets = list(stats)

    def pooled(name, group):
        return torch.cat([stats[k][name][group] for k in offsets])

    out = {}
    for name, key in (("C variation", "cvar"), ("C raw", "craw")):
        bars = {k: max(stats[k][name][g].quantile(0.95).item() for g in ("rule", "conditioned"))
                for k in offsets}
        out[f"{key}_min"] = pooled(name, "trained").min().item()
        out[f"{key}_max"] = pooled(name, "trained").max().item()
        out[f"{key}_null95"] = max(bars.values())
        out[f"{key}_above"] = sum(int((stats[k][name]["trained"] > bars[k]).sum()) for k in offsets)
    medians = [stats[k]["C variation"][g].quantile(0.5).item() for k in offsets for g in ("rule", "conditioned")]
    out["cvar_null_median_min"], out["cvar_null_median_max"] = min(medians), max(medians)
    for g in ("rule", "conditioned"):  # untrained heads as aligned as the least aligned copying head
        cvar = {k: stats[k]["C variation"] for k in offsets}
        out[f"reach_{g}"] = sum(int((cvar[k][g] >= cvar[k]["trained"].min()).sum()) for k in offsets)
    out["r2_min"] = min(trained_heads[k][1].min().item() for k in offsets)
    top2 = [p for v in copying_head_top2(carriers, trained_heads).values() for p in v]
    out["top2"] = ", ".join(f"{i} and {j} in {top2.count((i, j))}"
                                for (i, j) in sorted(set(top2), key=lambda p: -top2.count(p)))
    out["copying_heads"] = len(top2)
    out["top2_auc_min"] = min(top2_auc.values())
    return out
