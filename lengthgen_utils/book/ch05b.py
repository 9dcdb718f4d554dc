"""Chapter 5b, the regime map: how each head's accuracy falls, its carrier against the untrained null, its
margin and the law's fit, cell by cell of a :class:`~lengthgen_utils.run.configs.RegimeMap`; the phase
diagram and the tables that show them."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import plotly.graph_objects as go
import torch
from torch import Tensor

from .._validate import check_int
from ..analysis.falls import FALLS, FIT_LEVEL, classify_falls, first_length_holding
from ..analysis.kernel import dilution_law_fit, measures, offset_kernel, predicted_alias_distance
from ..analysis.probes import outranked_beyond_window
from ..analysis.theory import balanced_agreement, critical_target_mass, mean_field_parameters, separation_auc
from ..core.tasks import FixedOffsetRetrieval
from ..run.evaluation import attention_vote
from ..run.parallel import parallel_map
from ..run.runners import untrained_heads
from .render import FIGURE_HEIGHT
from .sliders import slider_figure
from .tables import Table

FALL_COLORS = ("#bdbdbd", "#2ca02c", "#d62728", "#ff7f0e", "#1f77b4", "#9467bd")
FALL_KEYS = ("none", "holds", "alias", "cliff", "gradual", "cut off")
"""The colour key's short names of :data:`FALLS` (six fit side by side under a phone's column, unrotated)."""
LOW_RANK_AUC = 0.8
"""A cell's carrier is low rank beyond its initialisation when its top-2 share beats the untrained null at this AUC."""


def untrained_measures(config, base: float, train_len: int = 16):
    """The carrier measures of ``config.n_null`` untrained RoPE heads of base ``base`` (the null of a cell).

    Head ``i`` is measured at offset ``config.offsets[i % len(offsets)]``.

    Source: chapter 5b; the null of chapter 4, "Is it training? Three nulls".
    """
    sweep = config.cell(base, 0.0).sweep
    n = config.n_null - config.n_null % len(config.offsets)
    heads = untrained_heads(sweep, n)
    return measures(heads, torch.tensor(config.offsets).repeat(n // len(config.offsets)), train_len)


@dataclass(frozen=True)
class CellReport:
    """What the map shows of one cell at one snapshot (:func:`cell_report`), per head and summarised.

    Per head (``M`` of them, ``n`` lengths): ``accuracy``, ``target_mass`` and ``vote_accuracy`` float64
    ``[M, n]``; ``fitted`` bool ``[M]`` (accuracy at the training length >= 0.9); ``p_star`` ``[M]``
    (:func:`~lengthgen_utils.analysis.theory.critical_target_mass`); ``falls`` (one class of
    :data:`~lengthgen_utils.analysis.falls.FALLS` per head); ``alias_lengths`` (the first length of
    ``lengths`` holding the predicted alias, or None; always None for content heads). Per *fitted*
    position-only head (empty for content heads and where none fitted): ``top2`` and ``align`` (the carrier
    measures), ``margin`` (nats), the law's ``r2`` and ``law_half`` (the first length at which the law's
    target mass is below 1/2, or None up to the longest length). For the cell: ``top2_auc`` and ``align_auc``
    against the untrained heads (NaN where no head fitted or for content heads) and ``null_top2``, the
    untrained heads' median top-2 share (NaN for content heads).
    """

    accuracy: Tensor
    fitted: Tensor
    target_mass: Tensor
    vote_accuracy: Tensor
    p_star: Tensor
    content: bool
    lengths: list
    falls: list
    alias_lengths: list
    top2: Tensor = field(default_factory=lambda: torch.empty(0))
    align: Tensor = field(default_factory=lambda: torch.empty(0))
    margin: Tensor = field(default_factory=lambda: torch.empty(0))
    r2: Tensor = field(default_factory=lambda: torch.empty(0))
    law_half: list = field(default_factory=list)
    null_top2: float = float("nan")
    top2_auc: float = float("nan")
    align_auc: float = float("nan")


def cell_report(at_step, null, lengths, content: bool, n_vote: int = 256) -> CellReport:
    """Everything the map shows of one cell at one snapshot, per head and summarised.

    Args:
        at_step: the cell's :class:`~lengthgen_utils.run.results.Runs` at one snapshot (``model``, ``offsets``,
            ``accuracy [M, n]`` on ``lengths``).
        null: the untrained heads' :class:`~lengthgen_utils.analysis.kernel.CarrierMeasures` of the same base
            (:func:`untrained_measures`), or None for content heads (no position-only carrier).
        lengths: the fine grid (tokens); the first is the training length.
        content: the heads' keys see the tokens (no kernel: no carrier, margin, alias or law).
        n_vote: sequences per length for :func:`~lengthgen_utils.run.evaluation.attention_vote`.

    Returns:
        a :class:`CellReport`.

    Source: chapter 5b.
    """
    n_vote = check_int("n_vote", n_vote, minimum=1)
    model, ks = at_step.model, [int(k) for k in at_step.offsets]
    lengths = [int(L) for L in lengths]
    acc = at_step.accuracy.double()
    vocab = model.config.vocab_size
    tasks = [FixedOffsetRetrieval(vocab, k) for k in ks]
    vote = attention_vote(model, tasks, lengths, n_samples=n_vote)
    fitted = acc[:, 0] >= FIT_LEVEL
    common = dict(accuracy=acc, fitted=fitted, **vote, content=content, lengths=lengths,
                  p_star=critical_target_mass(model.value_table()[:, :vocab].detach().cpu(), undefined="nan"))
    train_len, max_len = lengths[0], lengths[-1]
    if content:
        alias_lengths = [None] * len(ks)
        return CellReport(**common, alias_lengths=alias_lengths,
                          falls=classify_falls(acc, lengths, alias_lengths, chance=1 / vocab))
    alias, _ = predicted_alias_distance(model, ks, train_len, 4 * max_len)
    alias_lengths = first_length_holding(alias, lengths)
    common.update(alias_lengths=alias_lengths, falls=classify_falls(acc, lengths, alias_lengths, chance=1 / vocab),
                  null_top2=float(null.top2_kept.median()))
    idx = torch.nonzero(fitted).flatten().tolist()
    if not idx:
        return CellReport(**common)
    heads, ks_fit = model.subset(idx), [ks[i] for i in idx]
    m = measures(heads, ks_fit, train_len)
    margin, _ = mean_field_parameters(offset_kernel(heads, max_len), ks_fit, train_len)
    law = dilution_law_fit(heads, ks_fit, train_len, max_len)
    half = [torch.nonzero(row > 1.0).flatten() for row in law["law"]]  # 1/p - 1 > 1: the law's p below 1/2
    return CellReport(**common, top2=m.top2_kept, align=m.alignment_variation, margin=margin, r2=law["r2"],
                      law_half=[train_len + int(h[0]) if h.numel() else None for h in half],
                      top2_auc=separation_auc(m.top2_kept, null.top2_kept),
                      align_auc=separation_auc(m.alignment_variation, null.alignment_variation))


def map_reports(results: dict, config, n_vote: int = 256) -> dict:
    """:func:`cell_report` of every cell and snapshot of a trained map.

    Args:
        results: ``{(content, base, weight_decay): Runs}`` (:func:`~lengthgen_utils.run.runners.run_regime_map`).
        config: its :class:`~lengthgen_utils.run.configs.RegimeMap`.
        n_vote: as :func:`cell_report`.

    Returns:
        ``{(content, base, weight_decay, step): CellReport}``.

    Source: chapter 5b.
    """
    # every null and every report is independent of the others: up to one per CPU core at once
    nulls = dict(zip(config.bases, parallel_map(lambda b: untrained_measures(config, b), config.bases)))
    jobs = [((content, base, wd, step), at_step, runs.lengths)
            for (content, base, wd), runs in results.items() for step, at_step in runs.by("step").items()]

    def report(job):
        (content, base, _, _), at_step, lengths = job
        return cell_report(at_step, None if content else nulls[base], lengths, content, n_vote)

    return dict(zip([key for key, _, _ in jobs], parallel_map(report, jobs)))


def _counts(falls) -> str:
    """``"holds 7, gradual 12"``: each class of :data:`FALLS` present in ``falls`` with its count, in that order."""
    falls = list(falls)
    return ", ".join(f"{c} {falls.count(c)}" for c in FALLS if falls.count(c))


def outcome(falls) -> str:
    """A cell's outcome: its most common class of :data:`FALLS` (ties to the earlier class)."""
    falls = list(falls)
    return max(FALLS, key=lambda c: (falls.count(c), -FALLS.index(c)))


def _base_label(base: float) -> str:
    """``"10⁴"`` for a power of ten above 100, else the base as it is (``"10"``, ``"100"``, ``"500"``)."""
    exponent = math.log10(base)
    if abs(exponent - round(exponent)) < 1e-9 and base > 100:
        return "10" + str(round(exponent)).translate(str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻"))
    return f"{base:g}"


def _row_labels(config) -> list[tuple[bool, float, str]]:
    rows = [(False, b, f"base {_base_label(b)}") for b in config.bases]
    if config.content_weight_decays:
        rows += [(True, b, f"{_base_label(b)}, content") for b in config.bases]
    return rows


def _at_16x(rep: CellReport) -> float:
    """The cell's mean accuracy at 16 times the training length (``lengths[0]``, the first length of the grid)."""
    return float(rep.accuracy[:, rep.lengths.index(16 * rep.lengths[0])].mean())


def _hover(rep: CellReport, base: float, wd: float) -> str:
    falls = rep.falls
    counts = _counts(falls)
    head = "content head" if rep.content else "position-only head"
    lines = [f"{head}, base {base:g}, weight decay {wd:g}", counts,
             f"fitted {int(rep.fitted.sum())}/{len(falls)}, accuracy at 16x {_at_16x(rep):.2f}"]
    if not rep.content and len(rep.top2):
        lines += [f"top-2 share {float(rep.top2.median()):.2f} (AUC vs untrained {rep.top2_auc:.2f})",
                  f"alignment AUC {rep.align_auc:.2f}",
                  f"margin {float(rep.margin.min()):.1f}..{float(rep.margin.max()):.1f} nats",
                  f"law R² ≥ 0.9: {int((rep.r2 >= 0.9).sum())}/{len(rep.r2)}"]
    return "<br>".join(lines)


def phase_panel(reports: dict, config, step: int, title: str) -> go.Figure:
    """The phase diagram at one snapshot: weight decay across, RoPE base (and head type) down, coloured by outcome.

    Each cell is coloured by its most common class (:func:`outcome`) and labelled with that class's count;
    hovering gives the counts of every class and the cell's numbers.

    Source: chapter 5b, "The phase diagram".
    """
    wds = sorted({k[2] for k in reports})
    rows = _row_labels(config)
    z, text, hover = [], [], []
    for content, base, _ in rows:
        zr, tr, hr = [], [], []
        for wd in wds:
            rep = reports.get((content, base, wd, step))
            if rep is None:
                zr.append(None), tr.append(""), hr.append("not run")
                continue
            best = outcome(rep.falls)
            zr.append(FALLS.index(best))
            short = {"not fitted": "none", "holds": "holds", "cliff at alias": "alias", "cliff elsewhere": "cliff",
                     "gradual": "grad.", "cut off": "cut off"}[best]
            tr.append(f"{short}<br>{rep.falls.count(best)}/{len(rep.falls)}")
            hr.append(_hover(rep, base, wd))
        z.append(zr), text.append(tr), hover.append(hr)
    n = len(FALLS)
    scale = []
    for i, c in enumerate(FALL_COLORS):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return _map_heatmap(z, [f"{w:g}" for w in wds], [r[2] for r in rows], text, title, FIGURE_HEIGHT + 40,
                        dict(tickvals=list(range(n)), ticktext=list(FALL_KEYS), tickfont=dict(size=10)),
                        customdata=hover, hovertemplate="%{customdata}<extra></extra>", colorscale=scale,
                        zmin=-0.5, zmax=n - 0.5)


def _map_heatmap(z, x, y, text, title: str, height: int, colorbar: dict, **trace) -> go.Figure:
    """One panel of the map: a heatmap of cells (weight decay across, the rows down) labelled in each cell, with
    its colour bar laid flat under the plot (a phone's column has no room beside it)."""
    fig = go.Figure(go.Heatmap(z=z, x=x, y=y, text=text, texttemplate="%{text}", textfont=dict(size=11), xgap=2,
                               ygap=2, colorbar=dict(orientation="h", y=-0.32, yanchor="top", thickness=12, len=1.0,
                                                     **colorbar), **trace))
    fig.update_layout(title=title, height=height, margin=dict(l=10, r=10, t=60, b=120))
    fig.update_xaxes(title="AdamW weight decay λ", type="category")
    fig.update_yaxes(autorange="reversed", type="category")
    return fig


def _by_step(panel, reports: dict, config, title: str) -> go.Figure:
    """``panel`` at every snapshot of the map, with a slider over the training steps (static: no kernel needed)."""
    return slider_figure({f"{s}": panel(reports, config, s, f"{title}, step {s}") for s in config.snapshot_steps},
                         "training steps: ", active=len(config.snapshot_steps) - 1)


def phase_diagram(reports: dict, config, title: str) -> go.Figure:
    """:func:`phase_panel` at every snapshot, with a slider over the training steps (static: no kernel needed)."""
    return _by_step(phase_panel, reports, config, title)


def carrier_panel(reports: dict, config, step: int, title: str) -> go.Figure:
    """The carrier's top-2 share against the untrained null (AUC) per position-only cell at one snapshot."""
    wds = sorted({k[2] for k in reports if not k[0]})
    z, text = [], []
    for base in config.bases:
        zr, tr = [], []
        for wd in wds:
            rep = reports[(False, base, wd, step)]
            auc = rep.top2_auc
            zr.append(None if math.isnan(auc) else auc)
            tr.append("none<br>fitted" if math.isnan(auc) else f"{auc:.2f}<br>{float(rep.top2.median()):.2f}")
        z.append(zr), text.append(tr)
    return _map_heatmap(z, [f"{w:g}" for w in wds], [f"base {_base_label(b)}" for b in config.bases], text, title,
                        FIGURE_HEIGHT, dict(title=dict(text="AUC vs untrained", side="top")), zmin=0, zmax=1,
                        colorscale="RdBu",
                        hovertemplate="λ %{x}, %{y}<br>AUC of the top-2 share vs untrained %{z:.2f}<extra></extra>")


def carrier_diagram(reports: dict, config, title: str) -> go.Figure:
    """:func:`carrier_panel` at every snapshot, with a slider over the training steps."""
    return _by_step(carrier_panel, reports, config, title)


def regimes_table(reports: dict, config, step: int) -> Table:
    """One row per cell at one snapshot: fitted heads, classes, carrier, margins, the law's fit."""
    rows = []
    for (content, base, wd, s), rep in reports.items():
        if s != step:
            continue
        falls = rep.falls
        row = {"head": "content" if content else "position", "base": f"{base:g}", "λ": f"{wd:g}",
               "fitted": f"{int(rep.fitted.sum())}/{len(falls)}",
               "how accuracy falls": _counts(falls)}
        if not content and len(rep.top2):
            row.update({"top-2 (AUC)": f"{float(rep.top2.median()):.2f} ({rep.top2_auc:.2f})",
                        "margin (nats)": f"{float(rep.margin.min()):.1f}..{float(rep.margin.max()):.1f}",
                        "R² ≥ 0.9": f"{int((rep.r2 >= 0.9).sum())}"})
        else:
            row.update({"top-2 (AUC)": "", "margin (nats)": "", "R² ≥ 0.9": ""})
        rows.append(row)
    return Table.from_rows(rows, caption=f"Every cell of the map after {step} steps: heads fitted at the training "
                           "length, how accuracy falls (the rule in the text), the median top-2 share with its AUC "
                           "against untrained heads of the same base, the range of target margins, and the heads "
                           "whose exact 1/p − 1 the long-run law describes (R² ≥ 0.9)")


def pooled(reports: dict, content: bool | None = None) -> dict:
    """Every (head, length) of the fitted heads of the chosen cells and snapshots, as flat tensors.

    Args:
        reports: :func:`map_reports`' result.
        content: only content cells (True), only position-only cells (False), or all (None).

    Returns:
        ``{"accurate", "p", "vote", "p_star", "p_shuffled"}``: booleans ``accuracy >= 0.9``, the target mass, the
        vote's accuracy, each head's ``p*`` repeated over lengths, and the target mass of another head of the
        same cell at the same length (a fixed derangement of the cell's fitted heads: the shuffled null).

    Source: chapter 5b, "What predicts accuracy".
    """
    parts = {k: [] for k in ("accurate", "p", "vote", "p_star", "p_shuffled")}
    for key, rep in reports.items():
        if content is not None and key[0] != content:
            continue
        keep = rep.fitted
        if int(keep.sum()) < 2:
            continue
        acc, p = rep.accuracy[keep], rep.target_mass[keep]
        shift = torch.roll(torch.arange(p.shape[0]), 1)
        parts["accurate"].append((acc >= FIT_LEVEL).flatten())
        parts["p"].append(p.flatten())
        parts["vote"].append(rep.vote_accuracy[keep].flatten())
        parts["p_star"].append(rep.p_star[keep][:, None].expand_as(p).flatten())
        parts["p_shuffled"].append(p[shift].flatten())
    return {k: torch.cat(v) for k, v in parts.items()}


def predictor_scores(data: dict) -> dict:
    """Balanced agreement with ``accuracy >= 0.9`` of each rule and null on pooled (head, length) pairs.

    Rules: ``p > 1/2``; ``p > p*`` (the mean-field threshold); the vote's accuracy ``>= 0.9``. Nulls: the
    uniform row's target share ``1/L > 1/2`` (never: 0.5), and ``p > 1/2`` with ``p`` of another head of
    the same cell at the same length (the shuffled null).

    Returns:
        ``{rule: balanced agreement}`` (:func:`~lengthgen_utils.analysis.theory.balanced_agreement`).

    Source: chapter 5b, "What predicts accuracy".
    """
    a = data["accurate"]
    return {
        "p > 1/2": balanced_agreement(data["p"] > 0.5, a),
        "p > p* (mean field)": balanced_agreement(data["p"] > data["p_star"].nan_to_num(1.0), a),
        "vote ≥ 0.9": balanced_agreement(data["vote"] >= FIT_LEVEL, a),
        "null: uniform row, 1/L > 1/2": balanced_agreement(torch.zeros_like(a), a),
        "null: p of another head > 1/2": balanced_agreement(data["p_shuffled"] > 0.5, a),
    }


def predictor_table(scores: dict) -> Table:
    """The balanced agreement of every rule and null (rows) in each group of cells (columns).

    Args:
        scores: ``{group name: predictor_scores(...)}``, e.g. position-only, content, whole map.

    Source: chapter 5b, "What predicts accuracy".
    """
    groups = list(scores)
    rules = list(next(iter(scores.values())))
    cells = [[rule] + [f"{scores[g][rule]:.3f}" for g in groups] for rule in rules]
    return Table(["rule: accurate (≥ 0.9) when"] + groups, cells,
                 caption="Balanced agreement of each rule with accuracy ≥ 0.9, over every fitted head, length and "
                 "snapshot of the map (0.5: no better than a constant; 1: always right)")


def lawful_flags(reports: dict, keys, step: int, falls=None) -> list[bool]:
    """Per fitted position-only head of ``keys`` at ``step``: whether its law's R² is at least 0.9.

    Args:
        reports: :func:`map_reports`' result.
        keys: position-only cells ``(False, base, weight_decay)``.
        step: the snapshot.
        falls: None (every fitted head), or the classes of :data:`FALLS` to keep.

    Source: chapter 5b, "The phase diagram".
    """
    hits = []
    for key in keys:
        rep = reports[(*key, step)]
        fitted = torch.nonzero(rep.fitted).flatten().tolist()
        for j, i in enumerate(fitted):
            if falls is None or rep.falls[i] in falls:
                hits.append(float(rep.r2[j]) >= 0.9)
    return hits


def lawful_falls(reports: dict, step: int | None = None) -> dict:
    """Every lawful position-only head (law R² >= 0.9) that falls below 0.9, at its first length below 0.9.

    Args:
        reports: :func:`map_reports`' result.
        step: the snapshot (default: the last).

    Returns:
        numpy arrays over those heads: ``p`` (target mass), ``p_star``, ``p_over_p_star`` (NaN where ``p*`` is
        undefined or 0),
        ``vote`` (the vote's accuracy), ``law_within`` (the law's p = 1/2 length within half an octave of
        the first failing length), ``law_half`` (that length, tokens; NaN where the law's p never crosses 1/2)
        and ``fall`` (the first failing length, tokens).

    Source: chapter 5b, "Revisiting p*".
    """
    step = max(k[3] for k in reports) if step is None else step
    out = {"p": [], "p_star": [], "p_over_p_star": [], "vote": [], "law_within": [], "law_half": [], "fall": []}
    for (content, _, _, s), rep in reports.items():
        if content or s != step:
            continue
        lengths = rep.lengths
        for j, i in enumerate(torch.nonzero(rep.fitted).flatten().tolist()):
            below = torch.nonzero(rep.accuracy[i] < FIT_LEVEL).flatten()
            if float(rep.r2[j]) < 0.9 or not below.numel():
                continue
            col = int(below[0])
            p, p_star = float(rep.target_mass[i, col]), float(rep.p_star[i])
            half = rep.law_half[j]
            out["p"].append(p)
            out["p_star"].append(p_star)
            out["p_over_p_star"].append(p / p_star if p_star > 0 else float("nan"))
            out["vote"].append(float(rep.vote_accuracy[i, col]))
            out["law_within"].append(half is not None and abs(math.log2(half / lengths[col])) <= 0.5)
            out["law_half"].append(math.nan if half is None else float(half))
            out["fall"].append(float(lengths[col]))
    return {k: np.asarray(v, dtype=float) for k, v in out.items()}


def below_flags(reports: dict, content: bool, weight_decay: float, step: int, multiple: int) -> list[bool]:
    """Per head of every base (``content``, ``weight_decay``, ``step``): below 0.9 at ``multiple`` times the
    training length (a length of the grid)."""
    flags = []
    for (c, _, w, s), rep in reports.items():
        if c == content and w == weight_decay and s == step:
            col = rep.lengths.index(multiple * rep.lengths[0])
            flags += (rep.accuracy[:, col] < FIT_LEVEL).tolist()
    return flags


def content_outranking(results: dict, step: int) -> dict:
    """Per content cell, per head: what decides whether a key beyond the window outranks the target at 2x.

    Args:
        results: ``{(content, base, weight_decay): Runs}`` (:func:`~lengthgen_utils.run.runners.run_regime_map`).
        step: the snapshot read.

    Returns:
        ``{(base, weight_decay): {name: float64 [M]}}`` with ``outranked`` (the share of 2x sequences in which
        a key beyond the window outranks the target,
        :func:`~lengthgen_utils.analysis.probes.outranked_beyond_window`), ``accuracy_2x`` (measured),
        ``position_margin`` (nats: the target's logit above the largest logit beyond the window, each averaged
        over the key's token) and ``token_spread`` (nats: the standard deviation of a key's logit over its
        token, averaged over the keys of the window).

    Source: chapter 5b, "Why the ordinary head fails at 2x".
    """
    out = {}
    for (content, base, wd), runs in results.items():
        if not content:
            continue
        at, lengths = runs.by("step")[step], [int(L) for L in runs.lengths]
        ks, train_len = [int(k) for k in at.offsets], lengths[0]
        vocab, seq_len = at.model.config.vocab_size, 2 * train_len
        with torch.no_grad():  # the query is the marker token: [M, L, V] over (key position, key token)
            table = at.model.logit_table(seq_len)[:, vocab, :, :vocab].double().cpu()
        position = table.mean(-1)  # [M, L]: the token averaged out
        target = position[torch.arange(len(ks)), [seq_len - 1 - k for k in ks]]  # [M]
        out[(base, wd)] = {
            "outranked": outranked_beyond_window(at.model, ks, train_len),
            "accuracy_2x": at.accuracy.double()[:, lengths.index(seq_len)],
            "position_margin": target - position[:, : seq_len - train_len].amax(-1),
            "token_spread": table[:, seq_len - train_len : seq_len - 1].std(-1).mean(-1),
        }
    return out


def crossing_null(law_half, fall) -> float:
    """The null of the law's prediction of the fall: the share of (head ``i``, another head ``j``) pairs whose
    law's p = 1/2 length ``law_half[j]`` lies within half an octave of head ``i``'s first failing length.

    Args:
        law_half, fall: per lawful falling head (:func:`lawful_falls`), tokens; NaN in ``law_half`` (no
            crossing) never counts as within.

    Returns:
        the share, NaN with fewer than two heads.
    """
    half, fall = np.asarray(law_half, dtype=float), np.asarray(fall, dtype=float)
    if half.shape != fall.shape or half.ndim != 1:
        raise ValueError(f"law_half and fall must be 1-d of one length; got {half.shape} and {fall.shape}")
    n = len(fall)
    if n < 2:
        return float("nan")
    with np.errstate(invalid="ignore"):
        near = np.abs(np.log2(half[None, :] / fall[:, None])) <= 0.5  # [i, j]; NaN compares False
    return float(near[~np.eye(n, dtype=bool)].mean())


def share_below(reports: dict, content: bool, weight_decay: float, step: int, multiple: int) -> float:
    """Share of the heads of every base (``content``, ``weight_decay``, ``step``) below 0.9 at ``multiple`` times
    the training length (a length of the grid): the mean of :func:`below_flags`."""
    return float(np.mean(below_flags(reports, content, weight_decay, step, multiple)))


def count_falls(reports: dict, content: bool, weight_decay: float, step: int) -> str:
    """``"holds 20, gradual 12"``: how the heads of every base (``content``, ``weight_decay``, ``step``) fall."""
    return _counts(f for (c, _, w, s), rep in reports.items() if c == content and w == weight_decay and s == step
                   for f in rep.falls)


def content_summary(reports: dict, config, step: int) -> dict:
    """The content heads against the position-only ones, pooled over bases, at ``step``.

    Returns:
        ``early_plain`` / ``early_decayed``: the share of content heads below 0.9 at twice the training length
        without decay / at the largest content decay; ``early_position``: the same for position-only heads
        without decay; ``cliff_plain``: of the undecayed content heads that fall, the share by a cliff;
        ``gradual_decayed``: the share of content heads at the largest content decay that fall gradually.

    Raises:
        ValueError: the map has no content cells, or none without decay.

    Source: chapter 5b, "Distractors that see the token".
    """
    wds = config.content_weight_decays
    if not wds or 0.0 not in wds:
        raise ValueError(f"the map needs content cells without decay; content_weight_decays={wds}")
    top = max(wds)
    falls_plain = [f for (c, _, w, s), r in reports.items() if c and w == 0.0 and s == step for f in r.falls]
    falls_top = [f for (c, _, w, s), r in reports.items() if c and w == top and s == step for f in r.falls]
    fallen = [f for f in falls_plain if f not in ("holds", "not fitted")]
    return {"early_plain": share_below(reports, True, 0.0, step, 2),
            "early_decayed": share_below(reports, True, top, step, 2),
            "early_position": share_below(reports, False, 0.0, step, 2),
            "cliff_plain": sum(f.startswith("cliff") for f in fallen) / max(len(fallen), 1),
            "gradual_decayed": falls_top.count("gradual") / len(falls_top)}


def alias_cliff_shares(reports: dict, keys, step: int) -> tuple[float, float, int]:
    """Of the heads of ``keys`` at ``step`` that fall, the share with a cliff at their own predicted alias, and the
    same share with every head given another head's alias (the aliases of each cell rolled by one head: a
    null that keeps how often aliases sit on the grid and where, but not which head has which).

    Returns:
        ``(share, null share, heads that fall)``; NaN shares when none falls.

    Source: chapter 5b, "The phase diagram".
    """
    own, null = [], []
    for key in keys:
        rep = reports[(*key, step)]
        fallen = [i for i, f in enumerate(rep.falls) if f not in ("holds", "not fitted")]
        rolled = rep.alias_lengths[-1:] + rep.alias_lengths[:-1]
        swapped = classify_falls(rep.accuracy, rep.lengths, rolled, chance=1 / 16)
        own += [rep.falls[i] == "cliff at alias" for i in fallen]
        null += [swapped[i] == "cliff at alias" for i in fallen]
    nan = float("nan")
    return (float(np.mean(own)) if own else nan, float(np.mean(null)) if null else nan, len(own))
