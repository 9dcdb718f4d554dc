"""Chapter 5c, what selects the rule: the optimiser and initialisation cells, the decoy fits, and their figure."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from .._validate import check_int
from ..analysis import implicit_bias as ib
from ..analysis import kernel
from ..analysis.probes import table_drift
from ..analysis.theory import cosine_similarity, separation_auc
from ..run.cache import REPO_ROOT
from ..run.configs import RetrievalSweep
from ..run.evaluation import accuracy_by_length
from ..run.profiles import Profile
from ..run.runners import run_sweep, untrained_heads
from .style import PALETTE

RATES_FILE = REPO_ROOT / "predictions" / "learning_rates.json"
PREDICTIONS_FILE = REPO_ROOT / "predictions" / "selection_predictions.json"
TRAIN_SET = 32
"""Sequences per training length in gradient descent's fixed training set (384 sequences over lengths 5-16)."""
FIT = 0.99
"""A head fits when its accuracy at the training length is at least this."""
OPTIMISER_CELLS = (("Adam", 1.0), ("SGD + momentum", 1.0), ("sign descent", 1.0), ("SGD", 1.0),
                   ("gradient descent", 1.0))
CELLS = {
    "quick": (("Adam", 1.0), ("gradient descent", 1.0)),
    "default": OPTIMISER_CELLS,
    "full": OPTIMISER_CELLS + (("Adam", 0.1), ("Adam", 10.0), ("gradient descent", 0.1), ("gradient descent", 10.0)),
}
"""The (update rule, initialisation scale) cells each profile trains: ``quick`` two optimisers, ``default`` all
five, ``full`` adds the initialisation scales x0.1 and x10 under Adam and gradient descent."""
STEPS = {"quick": 300, "default": 1000}
"""Steps of each profile's cells (``quick``: the budget the learning rates were chosen at); ``full`` trains the
profile's own steps."""


def learning_rates() -> dict:
    """The committed choice of :mod:`~lengthgen_utils.tools.learning_rates`: ``{"rule", "rules", "lr", ...}``."""
    return json.loads(RATES_FILE.read_text())


def cells(profile: Profile) -> tuple:
    """The (rule, init scale) cells of ``profile``."""
    return CELLS[profile.name] if profile.name in CELLS else CELLS["default"]


def cell_sweep(profile: Profile, rule: str, init_scale: float) -> RetrievalSweep:
    """The RoPE and APE sweep of one cell: the profile's seeds, the steps of :data:`STEPS`, the profile's
    offsets in ``quick`` and 1, 2, 3, 5 otherwise, and the rule's committed rate."""
    rates = learning_rates()
    if rule not in rates["lr"]:
        raise ValueError(f"rule must be one of {sorted(rates['lr'])}; got {rule!r}")
    spec = rates["rules"][rule]
    return RetrievalSweep.from_profile(
        profile, pes=("rope", "ape"), attentions=("softmax",), offsets=(1, 2, 3, 5) if profile.name != "quick"
        else profile.offsets, optimizer=spec["optimizer"], lr=rates["lr"][rule], momentum=spec["momentum"],
        train_set=TRAIN_SET if spec["train_set"] else None, init_scale=init_scale,
        steps=STEPS.get(profile.name, profile.steps))


SIGN_SMALLER_STEP = 1e-3
"""Sign descent's other rate of the committed grid that fit as many heads as the chosen 3e-3 (3 of 6): the step-size
control of the sign-descent cell (``default`` and ``full``)."""


def run_sign_smaller_step(profile: Profile):
    """The sign-descent cell of ``profile`` trained at :data:`SIGN_SMALLER_STEP` instead of its committed rate (the
    same seeds, data, offsets and steps): ``Runs`` of RoPE and APE, through the results cache.

    Raises:
        ValueError: ``profile`` is ``quick`` (it trains no sign-descent cell).
    """
    if profile.name == "quick":
        raise ValueError("profile 'quick' trains no sign-descent cell; the step-size control runs in default and full")
    return run_sweep(dataclasses.replace(cell_sweep(profile, "sign descent", 1.0), lr=SIGN_SMALLER_STEP))


SIGN_QUICK_TEXT = ("This run (the quick profile) trains Adam and gradient descent only; the numbers of this paragraph "
                   "are measured in the default and full profiles.")
"""What chapter 5c says of the sign-descent cell where the profile does not train it."""


def sign_fits_enough(sign: CellSummary) -> bool:
    """Whether sign descent at its committed rate fits at least half its RoPE heads: where it does not (``full``,
    4000 steps at that fixed step), there are too few fits to compare at 2x, and chapter 5c does not test the step."""
    return 2 * int(sign.rope_fit.sum()) >= len(sign.rope_fit)


def sign_step_text(cells: dict, hold: dict, p_values, lr: float, steps: int) -> str:
    """Chapter 5c's sentences on sign descent at its committed rate ``lr`` against Adam and at
    :data:`SIGN_SMALLER_STEP`, worded for whether the committed step fits (:func:`sign_fits_enough`).

    Args:
        cells: :class:`CellSummary` per name, ``"sign"``, ``"adam"`` and ``"small"`` (the smaller step).
        hold: :func:`fitted_holding` of each.
        p_values: one-sided Fisher p of Adam against sign descent, and of the smaller step against the committed one.
        lr: sign descent's committed rate.
        steps: the cells' training steps.
    """
    sign, adam, small = cells["sign"], cells["adam"], cells["small"]
    n_sign, n_small = len(sign.rope_fit), len(small.rope_fit)
    smaller = (f"The same rule at a 3x smaller step ({SIGN_SMALLER_STEP:g}, which fit as many heads in the rate grid) "
               f"fits {int(small.rope_fit.sum())} of {n_small}, and {int(hold['small'].sum())} of them hold 0.9 at 2x")
    if not sign_fits_enough(sign):
        return (f"At its committed rate ({lr:g}) and this profile's {steps} steps, sign descent fits only "
                f"{int(sign.rope_fit.sum())} of {n_sign} RoPE heads: over this budget its fixed step carries the "
                f"weights away from a fit (they moved a median {finite_median(sign.travelled):.1f} times their "
                f"initial norm). With so few fits there is nothing to compare at 2x, so this profile does not test "
                f"whether the step selects among fits; the `default` profile, 1000 steps, does. {smaller}, against "
                f"{int(hold['adam'].sum())} of Adam's {len(hold['adam'])} fitted heads.")
    pct = {}
    for name in ("sign", "adam"):
        share = alias_within_share(cells[name])
        pct[name] = "no fitted head" if share is None else f"{share:.0%}"
    return (f"At its committed rate ({lr:g}) and this profile's {steps} steps, sign descent fits "
            f"{int(sign.rope_fit.sum())} of {n_sign} RoPE heads, and {int(hold['sign'].sum())} of them hold 0.9 at "
            f"2x, against {int(hold['adam'].sum())} of Adam's {len(hold['adam'])} fitted heads (one-sided Fisher "
            f"test, p = {p_values[0]:.1g}). The kernels of {pct['sign']} of its fitted heads come back up to the "
            f"target within 4x (Adam's: {pct['adam']}); its weights moved a median "
            f"{finite_median(sign.travelled):.2f} of their initial norm (Adam's: {finite_median(adam.travelled):.2f}). "
            f"{smaller} (p = {p_values[1]:.1g} against the committed step); its weights moved "
            f"{finite_median(small.travelled):.2f}. The encoding, the data, the initial weights and the update rule "
            f"are the same, and both steps fit the training lengths: the larger step selects heads whose kernels come "
            f"back up to the target early, and they fail at 2x. What selects the fit is the training procedure, the "
            f"rule with its step, not the encoding; this does not show that sign descent as such selects another "
            f"rule than Adam, since at its smaller step {int(hold['small'].sum())} of its "
            f"{int(small.rope_fit.sum())} fitted heads hold.")


INIT_SCALES = (0.1, 10.0)
"""The initialisation scales of ``full`` besides the book's (every initial weight multiplied)."""


@dataclass(frozen=True)
class InitScaleComparison:
    """The initialisation axis of ``full`` (:data:`INIT_SCALES` under Adam and gradient descent), as chapter 5c
    tests and words it. Each p is a one-sided Fisher test on fitted RoPE heads holding accuracy 0.9."""

    gd_table: list  # [[GD init x1 holding at 2x, not], [GD init x0.1 holding, not]]
    adam_table: list  # [[Adam init x0.1 holding at 16x, not], [Adam init x1 holding, not]]
    p_gd_2x: float  # gradient descent from the book's init holds at 2x more often than from init x0.1
    p_adam_16x: float  # Adam from init x0.1 holds at 16x more often than from the book's init
    text: str  # the paragraph's sentences, numbers from the run
    answer: str  # one sentence for the chapter's Answer


INIT_NOT_TRAINED_TEXT = ("This profile does not train the initialisation axis: the cells init x0.1 and x10 are "
                         "trained in `full` (16 seeds, 4000 steps), where this paragraph gives their numbers.")
INIT_NOT_TRAINED_ANSWER = "Whether the initialisation scale selects too is measured in the `full` profile only."
"""What chapter 5c says of the initialisation axis where the profile does not train it."""


def compare_init_scales(summaries: dict) -> InitScaleComparison | None:
    """The initialisation axis of chapter 5c from its cells' summaries, or None where the profile does not train
    it (``quick``, ``default``).

    Args:
        summaries: ``{(rule, init scale): CellSummary}``, with the book's scale 1.0 and :data:`INIT_SCALES` under
            ``"Adam"`` and ``"gradient descent"`` where the axis is trained.
    """
    from scipy.stats import fisher_exact

    if ("gradient descent", INIT_SCALES[0]) not in summaries:
        return None
    gd, gd_s, gd_l = (summaries[("gradient descent", x)] for x in (1.0, *INIT_SCALES))
    adam, adam_s, adam_l = (summaries[("Adam", x)] for x in (1.0, *INIT_SCALES))
    gd_table = contingency(fitted_holding(gd), fitted_holding(gd_s))
    adam_table = contingency(fitted_holding(adam_s, 16), fitted_holding(adam, 16))
    p_gd = float(fisher_exact(gd_table, alternative="greater")[1])
    p_adam = float(fisher_exact(adam_table, alternative="greater")[1])

    def fits(s):
        return f"{int(s.rope_fit.sum())} of {len(s.rope_fit)}"

    share = alias_within_share(gd_s)
    alias = "none of its heads fits" if share is None else f"the kernels of {share:.0%} of its fitted heads"
    text = (f"From a 10x smaller initialisation (every initial weight x0.1), gradient descent fits {fits(gd_s)} RoPE "
            f"heads and {gd_table[1][0]} of them hold 0.9 at 2x, against {gd_table[0][0]} of the {fits(gd)} it fits "
            f"from the book's initialisation (one-sided Fisher test, p = {p_gd:.1g}); {alias} come back up to the "
            f"target within 4x, although their direction is the max-margin kernel's (median cosine "
            f"{finite_median(gd_s.cos_mm[gd_s.rope_fit]):.2f}). Adam from the same small initialisation goes the "
            f"other way: {adam_table[0][0]} of its {int(adam_s.rope_fit.sum())} fitted heads hold 0.9 at 16x, against "
            f"{adam_table[1][0]} of {int(adam.rope_fit.sum())} from the book's initialisation (p = {p_adam:.1g}). "
            f"From a 10x larger one, in this budget, Adam fits {fits(adam_l)} heads and gradient descent "
            f"{fits(gd_l)} ({gd_l.rope_diverged} diverged). With the same data, offsets and rates, the scale of the "
            f"initial weights selects among the fits, and in opposite directions for the two rules.")
    answer = (f"The initialisation selects too (measured in `full`): from a 10x smaller start gradient descent's "
              f"fitted RoPE heads fail at 2x ({gd_table[1][0]} of {int(gd_s.rope_fit.sum())} hold) and Adam's hold "
              f"to 16x more often ({adam_table[0][0]} of {int(adam_s.rope_fit.sum())}, against {adam_table[1][0]} of "
              f"{int(adam.rope_fit.sum())} from the book's).")
    return InitScaleComparison(gd_table, adam_table, p_gd, p_adam, text, answer)


def run_cells(profile: Profile) -> dict:
    """``{(rule, init_scale): Runs}`` for every cell of ``profile`` (each through the results cache)."""
    return {cell: run_sweep(cell_sweep(profile, *cell)) for cell in cells(profile)}


@dataclass
class CellSummary:
    """What one cell's heads did (RoPE and APE), per head where a tensor."""

    rope_accuracy: torch.Tensor  # [heads, lengths]
    ape_accuracy: torch.Tensor
    lengths: list
    offsets: list  # per RoPE head
    rope_fit: torch.Tensor  # bool [heads]
    ape_fit: torch.Tensor
    margin: torch.Tensor  # RoPE window margin (nats) [heads]
    travelled: torch.Tensor  # RoPE |w - w0| / |w0| [heads]
    alignment_auc: float | None  # RoPE C (variation weights), finite heads, against untrained heads (None: none finite)
    cos_mm: torch.Tensor  # RoPE cosine with the max-margin kernel of the head's offset [heads]
    cos_mm_null: torch.Tensor  # the same for untrained heads
    first_alias: list  # RoPE, tolerance 0, up to 4096 (None: none)
    ape_unseen_drift: float  # largest change of an APE row >= train_len, over the finite APE heads
    rope_diverged: int = 0  # RoPE heads whose parameters are no longer finite (training diverged)
    ape_diverged: int = 0


def summarise(runs, n_null: int = 64) -> CellSummary:
    """Every per-cell measure of the chapter, from one cell's :class:`~lengthgen_utils.run.results.Runs`.

    A head whose training diverged (a non-finite parameter: gradient descent at init x10 in ``full``) has
    NaN margin and cosine and chance accuracy; it is counted (``rope_diverged``, ``ape_diverged``), never
    fits, and is left out of the alignment AUC and the unseen rows' drift.
    """
    rope, ape = runs.where(pe="rope"), runs.where(pe="ape")
    train_len = runs.experiment.train_len
    ks = rope.offsets
    model = rope.model
    c = kernel.factorized_kernel(model)
    s = ib.kernel_values(c, train_len)
    mm = {k: ib.max_margin_kernel(k, train_len) for k in sorted(set(ks))}
    c_mm = torch.stack([mm[k] for k in ks])
    null = untrained_heads(runs.experiment.ensemble("rope"), n_null)
    c_null = kernel.factorized_kernel(null)
    null_ks = [ks[i % len(ks)] for i in range(n_null)]
    align = kernel.measures(model, ks, train_len).alignment_variation
    align_null = kernel.measures(null, null_ks, train_len).alignment_variation
    finite, ape_finite = _finite_heads(model), _finite_heads(ape.model)
    drift = table_drift(ape.model, ape.initial_model())[ape_finite, train_len:]
    return CellSummary(
        rope_accuracy=rope.accuracy, ape_accuracy=ape.accuracy, lengths=list(runs.lengths), offsets=list(ks),
        rope_fit=(rope.accuracy[:, 0] >= FIT) & finite, ape_fit=(ape.accuracy[:, 0] >= FIT) & ape_finite,
        margin=ib.window_margin(s, ks, train_len),
        travelled=ib.distance_travelled(model, rope.initial_model()),
        alignment_auc=separation_auc(align[finite], align_null) if finite.any() else None,
        cos_mm=cosine_similarity(c, c_mm),
        cos_mm_null=cosine_similarity(c_null, torch.stack([mm[k] for k in null_ks])),
        first_alias=kernel.first_alias(model, ks, train_len, 4096, tolerance=0.0),
        ape_unseen_drift=float(drift.max()) if drift.numel() else 0.0,
        rope_diverged=int((~finite).sum()), ape_diverged=int((~ape_finite).sum()),
    )


def _finite_heads(model) -> torch.Tensor:
    """bool ``[M]``: every parameter of the ensemble's model finite."""
    return torch.stack([torch.isfinite(p.detach()).reshape(p.shape[0], -1).all(1) for p in model.parameters()]).all(0)


def decoy_fits(runs, decoy: int, lengths, n_samples: int = 512) -> dict:
    """Heads built to fit every training length and fail beyond: each trained RoPE head of ``runs`` with its
    kernel replaced by the smallest one that keeps the head's own margin in the window and puts the key at
    distance ``decoy`` that margin above the target (:func:`~lengthgen_utils.analysis.implicit_bias.decoy_kernel`).

    Args:
        runs: a cell's runs (its RoPE heads are used).
        decoy: the decoy's distance (>= the training length).
        lengths: evaluation lengths (each training length and beyond).
        n_samples: sequences per length.

    Only the heads that fit (accuracy >= :data:`FIT` at the training length) are rebuilt.

    Returns:
        dict: ``model`` (the built heads), ``offsets``, ``accuracy [heads, lengths]``, ``trained_accuracy`` (the heads they
        were built from, same lengths), ``kernel`` and ``trained_kernel`` ``[heads, d_head]``, ``margin`` and
        ``trained_margin`` ``[heads]``.
    """
    rope = runs.where(pe="rope")
    rope = rope.select([i for i in range(len(rope)) if bool(rope.accuracy[i, 0] >= FIT)])  # the heads that fit
    train_len = runs.experiment.train_len
    decoy = check_int("decoy", decoy, minimum=train_len)
    ks = rope.offsets
    trained = rope.model
    c = kernel.factorized_kernel(trained)
    margin = ib.window_margin(ib.kernel_values(c, train_len), ks, train_len)
    built_c = torch.stack([ib.decoy_kernel(k, train_len, decoy, float(m)) for k, m in zip(ks, margin)])
    built = ib.write_kernel(trained, built_c)
    tasks = [t for t in rope.label("task")]
    acc = accuracy_by_length(built, tasks, lengths, n_samples=n_samples)
    trained_acc = accuracy_by_length(trained, tasks, lengths, n_samples=n_samples)
    return dict(model=built, offsets=list(ks), accuracy=acc, trained_accuracy=trained_acc, kernel=built_c, trained_kernel=c,
                margin=ib.window_margin(ib.kernel_values(kernel.factorized_kernel(built), train_len), ks, train_len),
                trained_margin=margin)


def cell_label(cell) -> str:
    """``"Adam"`` or ``"gradient descent, init x0.1"``."""
    rule, scale = cell
    return rule if scale == 1.0 else f"{rule}, init x{scale:g}"


def accuracy_panels(curves: dict, chance: float, train_len: int, title: str) -> go.Figure:
    """Accuracy against length, RoPE (left) beside APE (right), one line per cell (mean over heads).

    Args:
        curves: ``{label: (lengths, rope_accuracy [heads, n] or None, ape_accuracy [heads, n] or None)}``;
            the same label keeps its colour in both panels; a label starting with "built" is drawn dashed.
        chance: the chance line; train_len: the training length (a vertical line).
        title: the figure's title.
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=("RoPE", "learned APE"), shared_yaxes=True,
                        horizontal_spacing=0.06)
    ticks = set()
    for i, (label, (lengths, rope, ape)) in enumerate(curves.items()):
        color = PALETTE[i % len(PALETTE)]
        x = np.log2(np.asarray(lengths))
        ticks.update(int(v) for v in lengths)
        dash = "dash" if label.startswith("built") else "solid"
        for col, acc in ((1, rope), (2, ape)):
            if acc is None:
                continue
            acc = np.asarray(acc, dtype=float)
            fig.add_trace(go.Scatter(
                x=x, y=acc.mean(0), mode="lines+markers", name=f"{label} ({acc.shape[0]} heads)",
                legendgroup=label, showlegend=col == 1 or rope is None, line=dict(color=color, dash=dash, width=2.5),
                customdata=np.stack([lengths, acc.min(0), acc.max(0)], -1),
                hovertemplate=label + ", L=%{customdata[0]:d}: mean %{y:.3f} (min %{customdata[1]:.3f}, "
                                      "max %{customdata[2]:.3f})<extra></extra>"), row=1, col=col)
    t = sorted(ticks)
    for col in (1, 2):
        fig.add_hline(y=chance, line=dict(color="black", dash="dot", width=1.2), row=1, col=col)
        fig.add_vline(x=float(np.log2(train_len)), line=dict(color="gray", dash="dash", width=1), row=1, col=col)
        fig.update_xaxes(title="L (tokens)", tickvals=np.log2(t),
                         ticktext=[f"{v}" if v % train_len else f"{v}<br>{v // train_len}x" for v in t],
                         row=1, col=col)
    fig.update_yaxes(title="accuracy at the query", range=[-0.02, 1.05], row=1, col=1)
    fig.update_layout(title=title, legend=dict(orientation="h", y=-0.3))
    return fig


def summary_rows(summaries: dict, lengths_x: tuple = (1, 2, 4, 16)) -> list[dict]:
    """One row per cell for the chapter's table: fit rates, RoPE and APE accuracy at a few multiples, margin,
    distance travelled, the share of fitted RoPE heads whose first alias is within 4x, alignment AUC, cosine
    with the max-margin kernel (trained, untrained)."""
    rows = []
    for cell, s in summaries.items():
        train_len = s.lengths[0]
        row = {"cell": cell_label(cell), "RoPE fit": f"{s.rope_fit.double().mean():.2f}",
               "APE fit": f"{s.ape_fit.double().mean():.2f}"}
        for m in lengths_x:
            if m * train_len in s.lengths:
                j = s.lengths.index(m * train_len)
                row[f"RoPE {m}x"] = f"{s.rope_accuracy[:, j].mean():.2f}"
        j2 = s.lengths.index(2 * train_len)
        row["APE 2x"] = f"{s.ape_accuracy[:, j2].mean():.2f}"
        ok = ~(s.margin.isnan() | s.travelled.isnan())  # diverged heads have none
        row["margin"] = f"{s.margin[ok].median():.1f}" if ok.any() else "-"
        row["moved"] = f"{s.travelled[ok].median():.2f}" if ok.any() else "-"
        early = alias_within_share(s, 4)
        row["alias <= 4x"] = f"{early:.2f}" if early is not None else "-"
        row["C AUC"] = f"{s.alignment_auc:.2f}" if s.alignment_auc is not None else "-"
        cos = s.cos_mm[~s.cos_mm.isnan()]
        row["cos c_mm"] = (f"{cos.median():.2f}" if cos.numel() else "-") + f" ({s.cos_mm_null.median():.2f})"
        row["diverged"] = f"{s.rope_diverged}/{s.ape_diverged}"
        rows.append(row)
    return rows


def fitted_holding(s: CellSummary, multiple: int = 2, level: float = 0.9) -> torch.Tensor:
    """Bool ``[fitted RoPE heads]``: accuracy ``>= level`` at ``multiple`` times the training length.

    Raises:
        ValueError: ``multiple`` times the training length is not one of the cell's evaluated lengths.
    """
    L = check_int("multiple", multiple, minimum=1) * s.lengths[0]
    if L not in s.lengths:
        raise ValueError(f"multiple = {multiple}: length {L} is not evaluated; lengths are {s.lengths}")
    return s.rope_accuracy[s.rope_fit, s.lengths.index(L)] >= level


def alias_within_share(s: CellSummary, multiple: int = 4) -> float | None:
    """Share of the fitted RoPE heads whose kernel's first alias lies within ``multiple`` times the training
    length (None: no head fits)."""
    limit = check_int("multiple", multiple, minimum=1) * s.lengths[0]
    early = [a is not None and a <= limit for a, f in zip(s.first_alias, s.rope_fit.tolist()) if f]
    return sum(early) / len(early) if early else None


def contingency(first: torch.Tensor, second: torch.Tensor) -> list[list[int]]:
    """The 2 x 2 table of two groups of heads, ``[[holding, not], [holding, not]]``, from bool tensors (for
    ``scipy.stats.fisher_exact``; ``alternative="greater"`` asks whether the first group holds more often)."""
    return [[int(g.sum()), int((~g).sum())] for g in (first, second)]


def finite_median(values: torch.Tensor) -> float:
    """The median of the finite entries (a diverged head has NaN measures); NaN when none is finite."""
    values = values[torch.isfinite(values)]
    return float(values.median()) if values.numel() else float("nan")


def near_chance(accuracy: torch.Tensor, chance: float, within: float = 0.15) -> torch.Tensor:
    """``|accuracy - chance| <= within`` per head, as float64 0/1 (the predictions' "near chance")."""
    return ((torch.as_tensor(accuracy, dtype=torch.float64) - chance).abs() <= within).double()


def mm_auc(s: CellSummary) -> float:
    """AUC of a cell's fitted RoPE heads' cosines with the l2 max-margin kernel against untrained heads'."""
    return separation_auc(s.cos_mm[s.rope_fit], s.cos_mm_null)


def max_margin_reach(offsets, train_len: int, gap_offset: int = 3, horizon: int = 4096) -> dict:
    """How far the l2 max-margin kernel extrapolates, from the frequencies alone.

    Returns:
        dict: ``alias`` ``{k: first alias of c_mm up to horizon (tolerance 0), or None}`` for each offset,
        ``gap`` (at ``gap_offset``: the target's smallest lead over a key at distance ``train_len ..
        4 train_len``, in units of the unit margin) and ``gap_distance`` (where it is smallest).
    """
    alias = {k: kernel.first_alias(ib.kernel_values(ib.max_margin_kernel(k, train_len), horizon + 1), k,
                                   train_len, tolerance=0.0)[0] for k in offsets}
    by_distance = ib.kernel_values(ib.max_margin_kernel(gap_offset, train_len), 4 * train_len + 1).flip(1)[0]
    gap = by_distance[gap_offset] - by_distance[train_len:]  # target minus each key beyond the window
    return dict(alias=alias, gap=float(gap.min()), gap_distance=int(gap.argmin()) + train_len)


def score_predictions(summaries: dict, train_len: int, chance: float) -> dict:
    """Score the committed predictions (:data:`PREDICTIONS_FILE`) on a run's cells, each against its null.

    Args:
        summaries: ``{(rule, init scale): CellSummary}``; it must hold ``("Adam", 1.0)`` and
            ``("gradient descent", 1.0)`` (P4 pairs them head by head).
        train_len, chance: the training length (2x and 4x are read at its multiples) and chance accuracy.

    Returns:
        dict: ``rows`` (one per prediction: id, statement, score, held), ``held`` (how many held),
        ``fitted_ape_2x`` (every fitted APE head's accuracy at 2x, every cell) and ``ape_unseen_drift``
        (P1's largest change of an unseen APE row).
    """
    preds = json.loads(PREDICTIONS_FILE.read_text())["predictions"]
    adam, gd = summaries[("Adam", 1.0)], summaries[("gradient descent", 1.0)]
    j2, j4 = adam.lengths.index(2 * train_len), adam.lengths.index(4 * train_len)
    fitted_ape = torch.cat([s.ape_accuracy[s.ape_fit, j2] for s in summaries.values()])
    fitted_rope = torch.cat([s.rope_accuracy[s.rope_fit, j2] for s in summaries.values()])
    p1 = max(s.ape_unseen_drift for s in summaries.values())
    diverged = sum(s.ape_diverged for s in summaries.values())
    p2, p2_null = near_chance(fitted_ape, chance).mean(), near_chance(fitted_rope, chance).mean()
    p3 = {cell_label(c): float((s.rope_accuracy[s.rope_fit, j2] >= 0.9).double().mean())
          for c, s in summaries.items() if c[1] == 1.0 and s.rope_fit.any()}
    pairs = adam.rope_accuracy[:, j4] - gd.rope_accuracy[:, j4]  # same (offset, seed)
    p4_p = ib.sign_test_p(int((pairs > 0).sum()), int((pairs != 0).sum()), 0.5)
    p5 = {cell_label(c): mm_auc(s) for c, s in summaries.items() if s.rope_fit.any()}
    scores = [
        (f"largest change of an unseen APE row: {p1}" + (f" ({diverged} diverged APE heads left out)" if diverged
                                                          else ""), p1 == 0.0),
        (f"fitted APE heads near chance at 2x: {p2:.2f} (RoPE: {p2_null:.2f})", bool(p2 == 1.0 and p2_null < 1.0)),
        ("fitted RoPE heads >= 0.9 at 2x: " + ", ".join(f"{k} {v:.2f}" for k, v in p3.items()),
         all(v >= 0.8 for v in p3.values())),
        (f"Adam - gradient descent at 4x: {float(pairs.mean()):+.3f} (sign test p = {p4_p:.3f})",
         bool(pairs.mean() > 0 and p4_p < 0.05)),
        ("AUC of cosines with c_mm: " + ", ".join(f"{k} {v:.2f}" for k, v in p5.items()),
         all(v > 0.5 for v in p5.values())),
    ]
    rows = [{"id": p["id"], "prediction": p["statement"], "score": sc, "held": "yes" if ok else "no"}
            for (sc, ok), p in zip(scores, preds)]
    return dict(rows=rows, held=sum(ok for _, ok in scores), fitted_ape_2x=fitted_ape, ape_unseen_drift=p1)
