"""Chapter 4, the carrier kernel: its figures (the kernels, the spectrum, the nulls, the aliases) and the
analysis behind its two long sections (the nulls; the aliases and where heads fail)."""
from __future__ import annotations


import numpy as np
import plotly.graph_objects as go
import torch

from .._validate import check_int, check_int_or_none, per_model
from ..analysis.kernel import carrier_spectrum, measures, shuffled_phases
from ..analysis import predictions, theory
from ..analysis.falls import AliasReport
from ..analysis.theory import separation_auc
from .sliders import slider_figure
from .style import PALETTE, SEED_COLORS, base_color
from .tables import Table


def kernel_panel(offsets, kernel, target_offset: int, train_len: int, title: str, y_range=None) -> go.Figure:
    """The offset kernel s(D) of every seed for one target offset k: one step of :func:`kernel_slider`.

    Args:
        offsets: the relative positions D ``[n]``, ints (x axis, key position j minus query position m).
        kernel: ``[n_seeds, n]`` logits in nats.
        target_offset: k; a dashed line marks ``D = -k``.
        train_len: the training length (the window ``-(train_len-1) <= D <= 0`` is shaded).
        title: figure title.
        y_range: ``[low, high]`` of the y axis (e.g. shared by every step of a slider); None fits the data.

    Returns:
        a plotly ``Figure`` with one trace per seed and the target line.

    Raises:
        ValueError: ``kernel`` is not ``[n_seeds, n]``.
    """
    x = np.asarray(offsets)
    s = np.asarray(kernel, dtype=float)
    if s.ndim != 2 or s.shape[1] != len(x):
        raise ValueError(f"kernels[{target_offset}] must be [n_seeds, {len(x)}]; got {s.shape}")
    data = [go.Scatter(x=x, y=row, mode="lines", name=f"seed {i}", line=dict(color=SEED_COLORS[i % 10], width=2),
                       hovertemplate="D=%{x}: s=%{y:.2f} nats") for i, row in enumerate(s)]
    data.append(go.Scatter(x=[-target_offset, -target_offset], y=[s.min(), s.max()], mode="lines",
                           name=f"target D = -{target_offset}", line=dict(color="black", dash="dash", width=2)))
    fig = go.Figure(data=data)
    fig.add_vrect(x0=-(train_len - 1) - 0.5, x1=0.5, fillcolor="gray", opacity=0.12, line_width=0,
                  name="training window", showlegend=True)
    fig.update_layout(title=title)
    fig.update_xaxes(title="relative position D = j − m (tokens)")
    fig.update_yaxes(title="attention logit s(D) (nats)", range=None if y_range is None else list(y_range))
    return fig


def kernel_slider(offsets, kernels: dict, train_len: int, title: str) -> go.Figure:
    """The offset kernel s(D) of every seed, one slider step per target offset k.

    Each step is the stand-alone :func:`kernel_panel` of its offset; all share one y range, so the
    steps can be compared by eye.

    Args:
        offsets: the relative positions D ``[n]``, ints (x axis, key position j minus query position m).
        kernels: ``{k: s [n_seeds, n]}`` logits in nats, one entry per target offset k.
        train_len: the training length (the window ``-(train_len-1) <= D <= 0`` is shaded).
        title: figure title.

    Returns:
        a plotly ``Figure`` (:func:`slider_figure`) with one trace per seed, a marker at ``D = -k`` and a
        slider over k.

    Raises:
        ValueError: ``kernels`` is empty or an array is not ``[n_seeds, n]``.
    """
    if not kernels:
        raise ValueError("kernels must hold at least one offset")
    x = np.asarray(offsets)
    arrays = {}
    for k, s in kernels.items():
        s = np.asarray(s, dtype=float)
        if s.ndim != 2 or s.shape[1] != len(x):
            raise ValueError(f"kernels[{k}] must be [n_seeds, {len(x)}]; got {s.shape}")
        arrays[k] = s
    y_lo = min(s.min() for s in arrays.values())
    y_hi = max(s.max() for s in arrays.values())
    pad = 0.05 * (y_hi - y_lo)
    y_range = [y_lo - pad, y_hi + pad]
    return slider_figure({str(k): kernel_panel(x, s, k, train_len, title, y_range) for k, s in arrays.items()},
                         "target offset k = ")


def carrier_spectrum_figure(periods, amplitude, variation, title: str) -> go.Figure:
    """Per-pair amplitude r_i and window variation v_i, mean over models with min..max error bars.

    Args:
        periods: ``[P]`` period of each pair, ``2 pi / theta_i`` (tokens).
        amplitude, variation: ``[n_models, P]`` (nats).
    """
    periods = np.asarray(periods, dtype=float)
    def compact(p):  # 63, 199, 2.0k, 20k: a period label that fits beside seven others on a phone
        return f"{p:.0f}" if p < 1000 else f"{p / 1000:.1f}k" if p < 10_000 else f"{p / 1000:.0f}k"

    labels = [f"{i}<br>{compact(p)}" for i, p in enumerate(periods)]
    fig = go.Figure()
    for name, arr, color in (("amplitude r_i", amplitude, "#1f77b4"), ("variation v_i over the training window", variation, "#ff7f0e")):
        arr = np.asarray(arr, dtype=float)
        mean = arr.mean(0)
        fig.add_trace(go.Bar(x=labels, y=mean, name=f"{name} (mean of {arr.shape[0]})", marker_color=color,
                             error_y=dict(type="data", symmetric=False, array=arr.max(0) - mean,
                                          arrayminus=mean - arr.min(0))))
    fig.update_layout(title=title, barmode="group")
    fig.update_xaxes(title="frequency pair i and its period 2π/θ_i (tokens)")
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


def prior_report(report: AliasReport, base: float, d_head: int, train_len: int, max_distance: int,
                 seed: int = 0) -> dict:
    """Score the committed before-training predictions against an :class:`~lengthgen_utils.analysis.falls.AliasReport`'s heads.

    For every head, the prediction of :mod:`~lengthgen_utils.analysis.predictions` for its
    ``(base, d_head, k, train_len)`` is read from the committed file (not recomputed), then compared with
    what the trained head did: whether its scanned first alias lies on a committed candidate distance, and
    whether it held (accuracy >= 0.95) at every evaluated length shorter than the committed first failing
    length. The hits are scored against a null of as many random lags over ``1 .. max_distance``
    (:func:`~lengthgen_utils.analysis.predictions.score_lags`).

    Args:
        report: an :class:`~lengthgen_utils.analysis.falls.AliasReport` of heads with RoPE base ``base``.
        base, d_head, train_len: the heads' settings (they must have a row in the committed file).
        max_distance: the distance the scan searched (tokens).
        seed: the null's seed.

    Returns:
        a dict: ``first`` (the committed first alias per head, or None), ``in_set`` (per head with a
        scanned alias: True when the scanned distance is a committed candidate), ``early`` (per head:
        True when it failed before the committed first failing length, or failed at all where the file
        predicts no alias), ``score`` (:func:`~lengthgen_utils.analysis.predictions.score_lags` of the
        scanned lags, or None when no head aliases), ``n_candidates`` (committed candidate lags).

    Raises:
        KeyError: the committed file has no row for these settings.

    Source: chapter 4, "Predicted before training".
    """
    rows = [predictions.load_prediction("single head", base, d_head, k, train_len) for k in report.offsets]
    first = [r["first_alias"] for r in rows]
    in_set = [s in r["distances"] for s, r in zip(report.scanned, rows) if s is not None]
    early = []
    for fail, r in zip(report.fail, rows):
        limit = r["first_failing_length"]
        early.append(fail is not None and (limit is None or fail < limit))
    lags = [s - k for s, k in zip(report.scanned, report.offsets) if s is not None]
    candidates = sorted({d - k for r, k in zip(rows, report.offsets) for d in r["distances"]})
    score = predictions.score_lags(lags, candidates, max_distance, seed=seed) if lags and candidates else None
    return dict(first=first, in_set=in_set, early=early, score=score, n_candidates=len(candidates))


def prior_summary(base: float, prior: dict) -> str:
    """One line on a :func:`prior_report`: hits against the null, and the heads that failed early.

    Source: chapter 4, "Predicted before training".
    """
    first = sorted({f for f in prior["first"] if f is not None})
    score = prior["score"]
    hits = ("no head aliases" if score is None and not prior["in_set"] else
            f"{sum(prior['in_set'])}/{len(prior['in_set'])} scanned aliases on a committed candidate"
            + ("" if score is None else f" (random-lag sets as good: {score['p']:.1%})"))
    return (f"base {base:g}: committed first alias {first or 'none'}, {prior['n_candidates']} candidate lags; "
            f"{hits}; {sum(prior['early'])}/{len(prior['early'])} heads failed before the committed length")


def alias_summary(base: float, report: AliasReport) -> str:
    """One line on an :class:`~lengthgen_utils.analysis.falls.AliasReport`: how often the prediction equals the scan and the failure.

    Source: chapter 4, "Far keys: aliases come from the frequency set".
    """
    n = len(report.offsets)
    agree = sum(p == s for p, s in zip(report.predicted, report.scanned))
    fails = sum(p == f for p, f in zip(report.predicted_fail, report.fail))
    return (f"base {base:g}: predicted = scanned alias for {agree}/{n} heads "
            f"(candidate lags: {report.coverage:.1%} of all); predicted = measured first failing "
            f"length for {fails}/{n}")


def alias_table(report: AliasReport, rows: dict, n_seeds: int) -> Table:
    """Each head's predicted first alias and first failing length, one row per offset, one column per seed.

    Args:
        report: an :class:`~lengthgen_utils.analysis.falls.AliasReport`.
        rows: ``{k: the indices of offset k's heads}``, one per seed (e.g. ``sweep.rows(offset=k)``).
        n_seeds: the number of seed columns.

    Raises:
        ValueError: a row does not hold ``n_seeds`` heads.

    Source: chapter 4, "Far keys: aliases come from the frequency set".
    """
    for k, heads in rows.items():
        if len(heads) != n_seeds:
            raise ValueError(f"rows[{k}] must hold one head per seed ({n_seeds}); got {len(heads)}")
    cells = [[k] + [f"{report.predicted[i]} / {report.fail[i]}" for i in heads] for k, heads in rows.items()]
    return Table(["k"] + [f"seed {s}" for s in range(n_seeds)], cells,
                 caption="Base 10^4, each head: predicted first alias distance / first length with "
                 "accuracy below 0.95 (None: none found)")


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
        ValueError / TypeError: ``alias_distance`` or ``failure_length`` does not hold one int or None per
            label (the package's one per-model check), or a value lies beyond its search range.
    """
    n = len(labels)
    alias_distance = per_model("alias_distance", alias_distance, n, check_int_or_none, shared=False)
    failure_length = per_model("failure_length", failure_length, n, check_int_or_none, shared=False)
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
            marker=dict(size=11, symbol=symbol, color=base_color(1e4), opacity=0.75,
                        line=dict(width=1.5, color=base_color(1e4))),
            hovertemplate="%{text}<br>first length containing an alias: %{x}<br>first failing length: %{y}"))
    fig.add_trace(go.Scatter(x=[16, longest_tested], y=[16, longest_tested], mode="lines",
                             name="failure at the alias", line=dict(color="black", dash="dot")))
    fig.update_layout(title=title)
    x_ticks = [16 ** e for e in range(1, int(np.log2(x_none)) // 4 + 1) if 16 ** e < x_none / 2] + [x_none]
    y_ticks = [2 ** e for e in range(4, int(np.log2(longest_tested)) + 1)] + [y_none]
    fig.update_xaxes(title="first length with an aliasing key, d + 1 (tokens)", type="log", tickvals=x_ticks,
                     ticktext=[str(t) for t in x_ticks[:-1]] + [f"none<br>≤ {alias_search}"], tickangle=0)
    fig.update_yaxes(title="first length with accuracy < 0.95 (tokens)", type="log", tickvals=y_ticks,
                     ticktext=[str(t) for t in y_ticks[:-1]] + [f"> {longest_tested}"])
    return fig


def alias_kernel_figure(relative, aliases, failures, candidates, pairs, train_len: int, longest_tested: int,
                        title: str, tolerance: float = 1.0, y_range=(-12.0, 8.0)) -> go.Figure:
    """A RoPE head's kernel over a long range, relative to its target, with the aliases the frequency set predicts.

    One line per seed: ``s(-d) - s(-k)`` (nats) against the distance ``d = 1 .. n`` on a log axis; a key
    above the dotted line ``-tolerance`` gets at least ``exp(-tolerance)`` of the target's weight (an
    alias, :func:`~lengthgen_utils.analysis.kernel.first_alias`). The candidate distances where the
    seeds' dominant pairs recur (:func:`~lengthgen_utils.analysis.kernel.predicted_alias_distance`) are a rug of
    ticks at the bottom; each seed's predicted first alias is a ring on its line (on the top edge when
    higher), and its first failing length ``L`` (the first evaluated length with accuracy below 0.95) a cross at the top, at
    ``d = L - 1``, the farthest key a sequence of that length holds. The live panel of chapter 4 draws
    the same traces in the browser (``_static/lengthgen_live.js``, ``kernelFigure``).

    Args:
        relative: ``[n_seeds, n + 1]`` float, ``s(D) - s(-k)`` (nats) in the row layout over ``D = -n .. 0``
            (column ``-1 - d`` holds distance ``d``; the column ``D = 0`` is not drawn).
        aliases: per seed, the predicted first alias distance (int) or None.
        failures: per seed, the first failing length (int) or None (none up to ``longest_tested``).
        candidates: candidate alias distances (ints in ``1 .. n``), increasing.
        pairs: the dominant pair indices the candidates come from (named in the legend).
        train_len: the training length (a dashed line at ``d = train_len - 1``, the window's edge).
        longest_tested: the longest evaluated length (tokens).
        title: figure title.
        tolerance: nats below the target that count as an alias (> 0).
        y_range: ``(low, high)`` of the y axis (nats): far keys can lie tens of nats above the target, and a
            fixed range keeps the threshold readable (higher values leave the plot at its top edge).

    Returns:
        a plotly ``Figure``.

    Raises:
        ValueError / TypeError: ``relative`` is not 2-d, ``aliases`` or ``failures`` do not hold one int or
            None per seed, a candidate lies outside ``1 .. n``, or ``train_len < 2``.
    """
    rel = np.asarray(relative, dtype=float)
    if rel.ndim != 2 or rel.shape[1] < 3:
        raise ValueError(f"relative must be [n_seeds, n + 1 >= 3] (D = -n .. 0); got shape {rel.shape}")
    rel = rel[:, -2::-1]  # a working copy for the log-distance axis: column d - 1 holds d = 1 .. n
    n_seeds, n = rel.shape
    aliases = per_model("aliases", aliases, n_seeds, check_int_or_none, shared=False)
    failures = per_model("failures", failures, n_seeds, check_int_or_none, shared=False)
    candidates = [check_int("candidates", c, minimum=1, maximum=n) for c in candidates]
    train_len = check_int("train_len", train_len, minimum=2)
    distances = np.arange(1, n + 1)
    y_low, top = (float(v) for v in y_range)
    if not y_low < -tolerance < top - 1:
        raise ValueError(f"y_range must hold the threshold -tolerance = {-tolerance:g} with a nat to spare above; "
                         f"got {y_range!r}")
    fig = go.Figure()
    for i, row in enumerate(rel):
        color = SEED_COLORS[i % len(SEED_COLORS)]
        alias, fail = aliases[i], failures[i]
        said_alias = "no alias" if alias is None else f"alias {alias}"
        said_fail = f"holds to {longest_tested}" if fail is None else f"fails at L = {fail}"
        fig.add_trace(go.Scatter(x=distances, y=row, mode="lines", name=f"seed {i}: {said_alias}, {said_fail}",
                                 line=dict(color=color, width=1.2), legendgroup=f"seed{i}",
                                 hovertemplate="d=%{x}: %{y:.2f} nats<extra></extra>"))
        if alias is not None:
            fig.add_trace(go.Scatter(x=[alias], y=[min(float(row[alias - 1]), top - 1)], mode="markers",
                                     showlegend=False,
                                     legendgroup=f"seed{i}", marker=dict(color=color, size=11, symbol="circle-open",
                                                                         line=dict(width=2.5)),
                                     hovertemplate=f"first alias: d={alias}<extra></extra>"))
        if fail is not None:
            fig.add_trace(go.Scatter(x=[fail - 1], y=[top - 0.4], mode="markers", showlegend=False,
                                     legendgroup=f"seed{i}", marker=dict(color=color, size=12, symbol="x-thin",
                                                                         line=dict(width=3, color=color)),
                                     hovertemplate=f"accuracy < 0.95 from L={fail}<extra></extra>"))
    fig.add_trace(go.Scatter(x=candidates, y=[y_low + 0.5] * len(candidates), mode="markers",
                             name=f"candidate aliases (pairs {', '.join(str(p) for p in pairs)} recur)",
                             marker=dict(color="#555", size=9, symbol="line-ns-open", line=dict(width=1)),
                             hovertemplate="candidate d=%{x}<extra></extra>"))
    # the two reference lines are named in the legend, never by labels on the plot: a seed's curve can
    # pass anywhere, and a label drawn there would hide it (the page's live panel keeps these shapes)
    fig.add_shape(type="line", xref="x domain", x0=0, x1=1, yref="y", y0=-tolerance, y1=-tolerance,
                  line=dict(color="black", dash="dot", width=1.5), showlegend=True,
                  name=f"alias threshold: {tolerance:g} nat below the target")
    fig.add_shape(type="line", xref="x", x0=train_len - 1, x1=train_len - 1, yref="y domain", y0=0, y1=1,
                  line=dict(color="gray", dash="dash", width=1), showlegend=True,
                  name=f"training window's edge (d = {train_len - 1})")
    ticks = [4 ** e for e in range(int(np.log(n) / np.log(4)) + 1)]
    fig.update_layout(title=title)
    fig.update_xaxes(title="distance d = −D (tokens, log scale)", type="log", range=[0, float(np.log10(n))],
                     tickvals=ticks, ticktext=[str(t) for t in ticks])
    fig.update_yaxes(title="s(−d) − s(−k) (nats)", range=[y_low, top])
    return fig


# --- decisive evidence: nulls, aliases, regimes (chapters 4 and 5)
def carrier_nulls(null_heads, spec, head_offsets, offsets, train_len: int, n_draws: int = 300) -> dict:
    """The carrier measures of the four nulls of "Is it training? Three nulls".

    Args:
        null_heads: an untrained RoPE head ensemble (e.g. ``runners.untrained_heads``), ``N`` heads with ``N`` a
            multiple of ``len(offsets)``; head ``i`` is measured at offset ``offsets[i % len(offsets)]``.
        spec: the trained heads' :class:`~lengthgen_utils.analysis.kernel.CarrierSpectrum` (M heads).
        head_offsets: the offset k of each trained head (M ints).
        offsets: the task offsets (e.g. ``(1, 2, 3, 5)``).
        train_len: the training length (the window ``D = -(train_len - 1) .. 0``).
        n_draws: shuffled-phase draws per trained head (seed 0 of
            :func:`~lengthgen_utils.analysis.kernel.shuffled_phases`).

    Returns:
        ``{null name: CarrierMeasures}`` for "(a) untrained", "(b) untrained, peak at -k" (the untrained heads
        whose window argmax is at a task offset, with that offset as their k), "(c) shuffled phases" and
        "(c) shuffled, peak at -k".

    Raises:
        ValueError: ``offsets`` is empty or the number of null heads is not a multiple of ``len(offsets)``.

    Source: chapter 4, "Is it training? Three nulls".
    """
    offsets = torch.tensor(list(offsets))
    if offsets.numel() == 0:
        raise ValueError("offsets must hold at least one offset")
    null_spec = carrier_spectrum(null_heads)
    n_null = null_spec.r.shape[0]
    if n_null % len(offsets):
        raise ValueError(f"null_heads must hold a multiple of len(offsets) = {len(offsets)} heads; got {n_null}")
    untrained = measures(null_spec, offsets.repeat(n_null // len(offsets)), train_len)
    at_k = torch.isin(untrained.peak_distance, offsets)
    conditioned = measures(null_spec.select(at_k), untrained.peak_distance[at_k], train_len)
    shuffled_k = torch.tensor(list(head_offsets)).repeat_interleave(n_draws)
    shuffled = measures(shuffled_phases(spec, n_draws), shuffled_k, train_len)
    return {
        "(a) untrained": untrained,
        "(b) untrained, peak at -k": conditioned,
        "(c) shuffled phases": shuffled,
        "(c) shuffled, peak at -k": shuffled.select(shuffled.peak_distance == shuffled_k),
    }


def null_aucs(trained, nulls: dict) -> dict:
    """The AUC of the trained heads against every null, for every carrier measure.

    Args:
        trained: the trained heads' :class:`~lengthgen_utils.analysis.kernel.CarrierMeasures`.
        nulls: ``{null name: CarrierMeasures}`` (:func:`carrier_nulls`).

    Returns:
        ``{measure: {null name: AUC}}`` (:func:`~lengthgen_utils.analysis.theory.separation_auc`, floats in
        [0, 1]; 1: every trained head above every null head).

    Raises:
        ValueError: ``nulls`` is empty, or a group is empty (from ``separation_auc``).

    Source: chapter 4, "Is it training? Three nulls".
    """
    if not nulls:
        raise ValueError("nulls must hold at least one null")
    return {m: {n: separation_auc(x, nulls[n].as_dict()[m]) for n in nulls}
            for m, x in trained.as_dict().items()}


def nulls_table(trained, nulls: dict, auc: dict, qk_rank, null_qk) -> Table:
    """Median of each measure in the trained heads and in each null, with the trained heads' AUC against it.

    Args:
        trained, nulls, auc: as :func:`null_aucs` takes and returns them.
        qk_rank, null_qk: the participation ratio of ``W_Q^T W_K`` of the trained and the untrained heads
            (:func:`~lengthgen_utils.analysis.kernel.qk_effective_rank`); shuffled phases have no weights.

    Source: chapter 4, "Is it training? Three nulls".
    """
    qk_auc = separation_auc(qk_rank, null_qk)
    sizes = ", ".join(f"{n} {len(v.peak_z)}" for n, v in nulls.items())
    cells = [[m, f"{x.median():.2f}"] + [f"{nulls[n].as_dict()[m].median():.2f} ({auc[m][n]:.2f})" for n in nulls]
             for m, x in trained.as_dict().items()]
    cells.append(["PR W_Q^T W_K", f"{qk_rank.median():.2f}", f"{null_qk.median():.2f} ({qk_auc:.2f})"]
                 + [""] * (len(nulls) - 1))
    return Table(["measure", "trained", "(a)", "(b)", "(c)", "(d)"], cells,
                 caption="Median of each measure in the trained heads and in each null; in "
                 f"brackets the AUC of the trained heads against that null. Nulls: {sizes}")


def measure_vs_nulls(groups: dict, measure: str, title: str, y_title: str | None = None) -> go.Figure:
    """One measure's distribution in trained heads and in each null, as box plots side by side.

    Args:
        groups: ``{group name: values [n]}`` in display order (e.g. trained heads first, then the nulls).
        measure: the measure's name (axis title unless ``y_title`` is given).
        title: figure title.

    Returns:
        a plotly ``Figure``: one box per group (median line, quartile box, whiskers to 1.5 IQR, outliers).

    Raises:
        ValueError: no groups, or an empty group.
    """
    if not groups:
        raise ValueError("groups must hold at least one group")
    fig = go.Figure()
    for i, (name, values) in enumerate(groups.items()):
        values = np.asarray(values, dtype=float).ravel()
        if values.size == 0:
            raise ValueError(f"group {name!r} is empty")
        fig.add_trace(go.Box(y=values, name=f"{name}<br>n={values.size}", marker_color=PALETTE[i % 10],
                             boxpoints="outliers" if values.size > 200 else "all", jitter=0.4, pointpos=0,
                             marker=dict(size=4), line=dict(width=1.5)))
    fig.update_layout(title=title, showlegend=False)
    fig.update_yaxes(title=y_title or measure)
    return fig


def censored_scatter(x, y, labels, x_limit: int, y_limit: int, x_title: str, y_title: str, title: str,
                     x_none: str | None = None, y_none: str | None = None, diagonal: str = "prediction = measurement",
                     groups=None, colors: dict | None = None) -> go.Figure:
    """A prediction against a measurement on log axes, where either may be "none up to a limit".

    ``None`` in ``x`` (``y``) is drawn in a column (row) of its own beyond ``x_limit`` (``y_limit``),
    labelled ``x_none`` (``y_none``), so that "not seen" is never drawn as a number.

    Args:
        x, y: per model, a positive number or None.
        labels: per model hover text.
        x_limit, y_limit: the largest value that could have been seen on each axis.
        x_title, y_title, title: axis and figure titles.
        x_none, y_none: tick text of the censored column / row (default ``"none ≤ limit"``).
        diagonal: legend text of the dotted ``y = x`` line.
        groups: optional per-model group names (one colour and legend entry each).
        colors: optional ``{group: colour}`` (e.g. :func:`~lengthgen_utils.book.style.base_color` of each
            base, so a base has one colour across the book); a group it does not name takes the palette's.

    Raises:
        ValueError: lengths differ, or a value lies beyond its limit.
    """
    n = len(labels)
    if len(x) != n or len(y) != n:
        raise ValueError(f"x, y and labels must have one entry per model; got {len(x)}, {len(y)}, {n}")
    if any(v is not None and v > x_limit for v in x) or any(v is not None and v > y_limit for v in y):
        raise ValueError(f"x values must be <= x_limit={x_limit} and y values <= y_limit={y_limit}, or None")
    groups = ["heads"] * n if groups is None else list(groups)
    x_cens, y_cens = 2 ** (int(np.ceil(np.log2(x_limit))) + 1), 2 ** (int(np.ceil(np.log2(y_limit))) + 1)
    fig = go.Figure()
    for gi, group in enumerate(dict.fromkeys(groups)):
        rows = [i for i in range(n) if groups[i] == group]
        fig.add_trace(go.Scatter(
            x=[x[i] if x[i] is not None else x_cens for i in rows], y=[y[i] if y[i] is not None else y_cens for i in rows],
            mode="markers", name=f"{group} ({len(rows)})", text=[labels[i] for i in rows],
            marker=dict(size=10, color=(colors or {}).get(group, PALETTE[gi % 10]), opacity=0.7, line=dict(width=1, color="white")),
            hovertemplate="%{text}<br>x: %{x}<br>y: %{y}<extra></extra>"))
    low = 8
    fig.add_trace(go.Scatter(x=[low, max(x_cens, y_cens)], y=[low, max(x_cens, y_cens)], mode="lines", name=diagonal,
                             line=dict(color="black", dash="dot")))
    fig.update_layout(title=title)

    def ticks(limit, cens, none, step=2, first=low):
        vals = [2 ** e for e in range(3, int(np.log2(cens))) if first <= 2 ** e <= limit][::step] + [cens]
        return vals, [str(v) for v in vals[:-1]] + [none or f"none ≤ {limit}"]

    # x labels sit side by side: over more than 10 octaves label every 16x, so that they fit a phone
    xv, xt = ticks(x_limit, x_cens, x_none, step=4 if np.log2(x_cens / low) > 10 else 2)
    yv, yt = ticks(y_limit, y_cens, y_none, first=4 * low)  # the corner holds the x axis's first label
    # room right of the censored column for half its label (plotly hides a tick label that passes the figure)
    fig.update_xaxes(title=x_title, type="log", tickvals=xv, ticktext=xt, tickangle=0,
                     range=[np.log10(low), np.log10(x_cens) + 0.35])
    fig.update_yaxes(title=y_title, type="log", tickvals=yv, ticktext=yt, range=[np.log10(low), np.log10(y_cens) + 0.15])
    return fig


# --- the exercises' numbers (chapter 4, "Exercises": the solutions quote this page's run)
def _count_clause(n: int, total: int, noun: str, what: str = "one") -> str:
    """'none of the 20 <noun>s has <what>', 'every <noun> has <what>', '3 of the 20 <noun>s have <what>'."""
    if n == 0:
        return f"none of the {total} {noun}s has {what}"
    if n == total:
        return f"every {noun} has {what}"
    return f"{n} of the {total} {noun}s {'has' if n == 1 else 'have'} {what}"


def matched_filter_numbers(spec, offsets, train_len: int, max_distance: int = 20_000) -> dict:
    """Exercise 1: the trained heads' amplitudes with every phase set to ``-theta_i k`` (a perfect matched
    filter), against the trained kernels: which have a first alias up to ``max_distance``.

    Returns:
        ``{name: value}`` for the glue names ``ch4_ex1_<name>``: ``matched`` and ``trained`` (clauses: how
        many heads have an alias), ``earliest`` (per offset, the earliest trained alias), ``lags`` (those
        distances minus k) and ``all_pairs`` (a clause: the lags up to ``max_distance`` that bring every pair
        within 0.4 rad of a whole turn, :func:`~lengthgen_utils.analysis.theory.pair_recurrences`).

    Source: chapter 4, exercise 1.
    """
    from ..analysis.kernel import CarrierSpectrum, first_alias, kernel_at, relative_positions

    ks = [int(k) for k in offsets]
    phi = -spec.theta[None, :] * torch.tensor(ks, dtype=torch.float64)[:, None]
    phi = torch.remainder(phi + np.pi, 2 * np.pi) - np.pi  # into (-pi, pi]
    far = relative_positions(max_distance + 1)
    matched = first_alias(kernel_at(CarrierSpectrum(spec.theta, spec.r, phi), far), ks, train_len)
    trained = first_alias(kernel_at(spec, far), ks, train_len)
    n = len(ks)
    earliest = {k: min((a for a, kk in zip(trained, ks) if kk == k and a is not None), default=None)
                for k in dict.fromkeys(ks)}
    found = {k: a for k, a in earliest.items() if a is not None}
    lags = sorted({a - k for k, a in found.items()})
    every = theory.pair_recurrences(spec.theta, list(range(len(spec.theta))), max_distance, tolerance=0.4)
    return {
        "matched": _count_clause(sum(a is not None for a in matched), n, "matched filter", "an alias"),
        "trained": _count_clause(sum(a is not None for a in trained), n, "trained head"),
        "earliest": ", ".join(f"{a} (k = {k})" for k, a in found.items()) or "none",
        "lags": ", ".join(map(str, lags)) or "none",
        "all_pairs": (f"no lag up to {max_distance:,} brings all {len(spec.theta)} within 0.4 rad of one"
                      if len(every) == 0 else f"{len(every)} lags up to {max_distance:,} bring all "
                      f"{len(spec.theta)} within 0.4 rad of one, the first at {int(every[0])}"),
    }


def base_sweep_numbers(run, train_len: int, max_distance: int) -> dict:
    """Exercise 2: a base sweep's heads (``run_offset_sweep``): their dominant pairs, the near-recurrences of
    pairs 0 and 1, and how many fail by the longest evaluated length.

    Returns:
        ``{name: value}`` for the glue names ``ch4_ex2_<name>``: ``heads``, ``dominant`` (a clause: '0 and 1 in
        13 heads, 0 and 2 in 6'), ``lags`` (the first lags where pairs 0 and 1 are both within pi/3 of a whole
        turn), ``fail`` (heads below 0.95 by the longest length), ``share`` (their share), ``at_alias`` (of
        them, those failing at the first evaluated length that holds their predicted alias).

    Source: chapter 4, exercise 2.
    """
    from collections import Counter

    from ..analysis.kernel import predicted_alias_distance

    report = AliasReport.of(run.model, run.offsets, run.lengths, run.accuracy, train_len, max_distance)
    _, dominant = predicted_alias_distance(run.model, run.offsets, train_len, max_distance)
    parts = []
    for i, ((a, b), n) in enumerate(Counter(tuple(sorted(d)) for d in dominant.tolist()).most_common()):
        count = ("one head" if n == 1 else f"{n} heads") if i == 0 else ("one" if n == 1 else str(n))
        parts.append(f"{a} and {b} in {count}")
    lags = theory.pair_recurrences(carrier_spectrum(run.model).theta, [0, 1], 60).tolist()
    failing = [i for i, f in enumerate(report.fail) if f is not None]
    return {
        "heads": len(report.fail),
        "dominant": ", ".join(parts),
        "lags": ", ".join(map(str, lags)),
        "fail": len(failing),
        "share": len(failing) / len(report.fail),
        "at_alias": sum(report.fail[i] == report.predicted_fail[i] for i in failing),
    }
