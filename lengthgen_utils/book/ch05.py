"""Chapter 5, the dilution law: its figures (exact and mean-field dilution, cliffs, where the law holds) and
the analysis behind its long cells (the regimes, the law on a long kernel, the mass at the fall, the
log-length scale)."""
from __future__ import annotations


import numpy as np
import plotly.graph_objects as go
import torch

from .._validate import check_int, check_int_or_none, per_model, per_model_rows
from ..analysis.kernel import carrier_spectrum, first_alias, mean_distractor_weight, offset_kernel
from ..analysis.theory import critical_target_mass, exact_target_mass, long_run_slope, mean_field_parameters
from ..run.configs import margin_sweep, rope_base_experiment
from ..run.evaluation import accuracy_by_length
from ..run.parallel import parallel_map
from ..run.runners import run_offset_sweep, run_snapshots
from .figures import _log_x_marker
from .render import FIGURE_HEIGHT
from .sliders import slider_figure
from .style import PALETTE
from .tables import Table


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


# --- heads with large and small margins (chapter 5, "Heads with large and small margins")
DECAY_CONTROL = "weight decay"
"""The margin control whose heads the chapter quotes as strongly weight decayed (every profile trains it)."""
DECAY_STEP = 2000
"""The snapshot of :data:`DECAY_CONTROL` the chapter quotes (its last: the decayed heads settle late)."""
DECAYED_REGIME = f"{DECAY_CONTROL}, step {DECAY_STEP}"
"""The regime name of those heads in :func:`margin_regimes`' result (``"weight decay, step 2000"``)."""


def decayed_regime(regimes: dict, profile=None):
    """The strongly weight-decayed heads' entry of a per-regime dict: ``regimes[DECAYED_REGIME]``.

    The chapter quotes these heads in every profile; :func:`margin_regimes` trains them whenever the
    profile's ``margin_controls`` hold :data:`DECAY_CONTROL` and its snapshots hold :data:`DECAY_STEP`
    (``tests/test_chapter_modules.py`` checks that every profile does).

    Args:
        regimes: ``{regime name: value}``, e.g. ``{regime: kernel.dilution_law_fit(...)}``.
        profile: optional, the build's profile, named in the error.

    Raises:
        KeyError: no :data:`DECAYED_REGIME` entry (the message names the regimes there and, where given, the
            profile's margin controls).

    Source: chapter 5, "Heads with large and small margins".
    """
    if DECAYED_REGIME not in regimes:
        controls = "" if profile is None else (f"; profile {profile.name!r} sweeps margin_controls="
                                               f"{tuple(profile.margin_controls)}")
        raise KeyError(f"chapter 5 quotes the regime {DECAYED_REGIME!r} (margin control {DECAY_CONTROL!r}, "
                       f"snapshot {DECAY_STEP}), absent here: regimes {list(regimes)}{controls}")
    return regimes[DECAYED_REGIME]


def margin_regimes(profile, book, offsets, tasks, lengths, n_samples: int) -> dict:
    """Every regime of the margin sweep: its heads, their offsets and their accuracy on a fine grid.

    The book's recipe first (``book``, chapter 1's RoPE heads, evaluated here), then each of the profile's
    ``margin_controls`` in order: ``"base"`` adds chapter 4's heads of each of the profile's ``rope_bases``
    (evaluated here), every other control the snapshots of its :func:`~lengthgen_utils.run.configs.margin_sweep`
    (their accuracy as recorded).

    Args:
        profile: the build's :class:`~lengthgen_utils.run.profiles.Profile`.
        book: the book recipe's run (:func:`~lengthgen_utils.run.runners.run_offset_sweep`): ``model``, ``offsets``.
        offsets: the task offsets the sweeps train (e.g. ``(1, 2, 3, 5)``).
        tasks: one task per head of ``book`` (the heads of every regime have the same offsets in the same order).
        lengths: the fine grid of lengths (tokens).
        n_samples: sequences per length for the accuracies measured here.

    Returns:
        ``{regime name: (model, offsets, accuracy [M, len(lengths)])}``, e.g. "book recipe", "steps, step 200",
        "base 10".

    Raises:
        ValueError / TypeError: ``n_samples`` is not an int >= 1; bad controls or bases (from the runners).

    Source: chapter 5, "Heads with large and small margins".
    """
    n_samples = check_int("n_samples", n_samples, minimum=1)

    def measured(model, offsets_of):  # one regime's heads, measured at ``lengths``
        return (model, offsets_of, accuracy_by_length(model, tasks, lengths, n_samples=n_samples))

    jobs = [lambda: {"book recipe": measured(book.model, book.offsets)}]
    for control in profile.margin_controls:
        if control == "base":
            for b in profile.rope_bases:
                def base_job(b=b):
                    run = run_offset_sweep(rope_base_experiment(profile, b), offsets=offsets)  # chapter 4's heads
                    return {f"base {b:g}": measured(run.model, run.offsets)}
                jobs.append(base_job)
            continue

        def snapshot_job(control=control):
            snap = run_snapshots(margin_sweep(profile, control, offsets))
            return {f"{control}, step {step}": (at_step.model, at_step.offsets, at_step.accuracy)
                    for step, at_step in snap.by("step").items()}
        jobs.append(snapshot_job)
    heads = {}
    for part in parallel_map(lambda job: job(), jobs):  # independent: up to one per CPU core at once
        heads |= part
    return heads


def count_kinds(kinds) -> str:
    """``"cliff 3, holds 5"``: how many heads fall each way, in the order the kinds first appear.

    Args:
        kinds: per head, how its accuracy falls (the ``"kind"`` of
            :func:`~lengthgen_utils.analysis.probes.accuracy_transition`).

    Source: chapter 5.
    """
    kinds = list(kinds)
    return ", ".join(f"{k} {kinds.count(k)}" for k in dict.fromkeys(kinds))


def regimes_table(law: dict, fall: dict, max_len: int) -> Table:
    """Each regime's range of margins and of κ, how many heads the long-run law describes, how accuracy falls.

    Args:
        law: ``{regime: kernel.dilution_law_fit(...)}`` (``margin``, ``kappa``, ``r2`` per head).
        fall: ``{regime: probes.accuracy_transition(...)}`` (``kind`` per head), the same regimes.
        max_len: the longest length of the fit (tokens), named in the caption.

    Raises:
        ValueError: ``law`` and ``fall`` name different regimes.

    Source: chapter 5, "Heads with large and small margins".
    """
    if list(law) != list(fall):
        raise ValueError(f"law and fall must name the same regimes; got {list(law)} and {list(fall)}")
    rows = []
    for name in law:
        f, m = fall[name], law[name]
        rows.append({
            "regime": name,
            "margin (nats)": f"{m['margin'].min():.1f}..{m['margin'].max():.1f}",
            "κ": f"{m['kappa'].min():.1f}..{m['kappa'].max():.1f}",
            "R² ≥ 0.9": f"{int((m['r2'] >= 0.9).sum())}/{len(f['kind'])}",
            "how accuracy falls": count_kinds(f["kind"]),
        })
    return Table.from_rows(rows, caption="Each regime: the range of its heads' margins and of κ, how many heads "
                           f"the long-run law describes (R² ≥ 0.9 up to {max_len} tokens), and how accuracy "
                           "falls on the fine grid")


# --- the law on a long kernel (chapter 5, "The law on a long kernel")
def resolved_heads(law: dict, n_long: int, n_keep: int = 2, min_hits: float = 1000.0) -> dict:
    """Per regime, the heads a kernel of ``n_long`` relative positions resolves, the hardest first.

    A head is resolved when ``n_long e^-κ >= min_hits``: its rare peaks of ``e^s`` are met often enough for
    an average over ``n_long`` keys to be the long-run one.

    Args:
        law: ``{regime: kernel.dilution_law_fit(...)}`` (``kappa [M]`` per regime).
        n_long: the kernel's length (relative positions).
        n_keep: heads kept per regime, those of largest κ.
        min_hits: the smallest ``n_long e^-κ`` that counts as resolved.

    Returns:
        ``{regime: long tensor of head indices}`` (at most ``n_keep``, by decreasing κ; may be empty).

    Raises:
        ValueError / TypeError: ``n_long`` or ``n_keep`` is not an int >= 1.

    Source: chapter 5, "The law on a long kernel".
    """
    n_long, n_keep = check_int("n_long", n_long, minimum=1), check_int("n_keep", n_keep, minimum=1)
    resolved = {}
    for name, fit in law.items():
        kappa = fit["kappa"]
        ok = torch.nonzero(n_long * torch.exp(-kappa) >= min_hits).flatten()
        resolved[name] = ok[kappa[ok].argsort(descending=True)[:n_keep]]
    return resolved


def independent_slope(spec, offsets):
    """The long-run slope if every frequency pair were independent: the product of one Bessel factor per pair.

    Args:
        spec: a :class:`~lengthgen_utils.analysis.kernel.CarrierSpectrum` of M heads.
        offsets: the target offset k of each head.

    Returns:
        float64 ``[M]``: :func:`~lengthgen_utils.analysis.theory.long_run_slope` with each pair its own orbit.

    Source: chapter 5, "The law on a long kernel".
    """
    singles = [(float(t), ((i, 1),)) for i, t in enumerate(spec.theta.tolist())]
    return long_run_slope(spec.r, spec.phi, spec.theta, offsets, orbits=singles)


def long_kernel_errors(heads: dict, law: dict, resolved: dict, train_len: int, n_long: int):
    """The measured mean distractor weight of the resolved heads against the orbit law and independent phases.

    Args:
        heads: ``{regime: (model, offsets, accuracy)}`` (:func:`margin_regimes`).
        law: ``{regime: kernel.dilution_law_fit(...)}`` (``slope [M]``).
        resolved: ``{regime: head indices}`` (:func:`resolved_heads`); regimes without one are skipped.
        train_len: the training length: keys at distances ``train_len .. n_long`` are averaged.
        n_long: the kernel's length (relative positions).

    Returns:
        ``(rel_orbit, rel_bessel)``, float64 ``[n]`` over the resolved heads in regime order: measured slope
        over the orbit law's minus 1, and over :func:`independent_slope` minus 1.

    Raises:
        ValueError: no regime has a resolved head.

    Source: chapter 5, "The law on a long kernel".
    """
    rel_orbit, rel_bessel = [], []
    for name, rows in resolved.items():
        if len(rows) == 0:
            continue
        model, offsets, _ = heads[name]
        sub, sub_ks = model.subset(rows.tolist()), [offsets[i] for i in rows.tolist()]
        measured_slope = mean_distractor_weight(sub, sub_ks, train_len, n_long)
        bessel = independent_slope(carrier_spectrum(sub), sub_ks)
        rel_orbit.append(measured_slope / law[name]["slope"][rows] - 1)
        rel_bessel.append(measured_slope / bessel - 1)
    if not rel_orbit:
        raise ValueError("resolved must hold at least one head")
    return torch.cat(rel_orbit), torch.cat(rel_bessel)


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
            value = check_int_or_none(label, value)
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
    """The body of :func:`r2_vs_margin` and :func:`r2_vs_reach`: one marker per head, coloured by ``kind``.

    y is the share of ``1/p - 1`` the law leaves unexplained, ``1 - R²``, on a log axis: a head the law
    misses by far sits high instead of piling up at a clipped value. A perfect fit is drawn at ``floor``
    (``1 - R²`` below it is raised to it: the one place a value moves, on the law's good side). The
    legend has one entry per ``kind`` (colour); the regime (``symbol_by``, one symbol each) is named on
    hover.
    """
    x, r2 = np.asarray(x, dtype=float), np.asarray(r2, dtype=float)
    n = len(labels)
    if x.shape != (n,) or r2.shape != (n,) or len(kind) != n:
        raise ValueError(f"x, r2, kind and labels must have one entry per head ({n})")
    if not 0 < floor < 1:
        raise ValueError(f"floor must be in (0, 1) (the smallest 1 - R² drawn, log axis); got floor={floor!r}")
    symbols = ["circle", "square", "diamond", "triangle-up", "cross", "x", "star", "triangle-down"]
    regimes = list(dict.fromkeys(symbol_by)) if symbol_by is not None else [None]
    unexplained = np.maximum(1 - r2, floor)
    fig = go.Figure()
    for ki, k in enumerate(dict.fromkeys(kind)):
        count = sum(1 for v in kind if v == k)
        first = True
        for ri, regime in enumerate(regimes):
            rows = [i for i in range(n) if kind[i] == k and (regime is None or symbol_by[i] == regime)]
            if not rows:
                continue
            where = f", {regime}" if regime is not None else ""
            fig.add_trace(go.Scatter(
                x=x[rows], y=unexplained[rows], mode="markers", name=f"{k} ({count})", legendgroup=str(k),
                showlegend=first, text=[f"{labels[i]}{where}: R² = {r2[i]:.3g}" for i in rows],
                marker=dict(size=9, color=PALETTE[ki % 10], symbol=symbols[ri % len(symbols)], opacity=0.75),
                hovertemplate="%{text}<br>" + x_hover + "<extra></extra>"))
            first = False
    fig.add_hline(y=1 - threshold, line=dict(color="gray", dash="dash"), name=f"R² = {threshold}", showlegend=True)
    top = float(np.log10(max(unexplained.max(), 1.0)))
    fig.update_layout(title=title)
    fig.update_yaxes(title="1 − R² of the long-run law (log scale)", type="log", exponentformat="power",
                     range=[np.log10(floor) - 0.2, top + 0.3])
    return fig


def r2_vs_margin(margin, r2, kind, labels, title: str, floor: float = 1e-4, threshold: float = 0.9,
                 symbol_by=None) -> go.Figure:
    """The law's R^2 of each head against its margin, coloured by how its accuracy falls.

    Args:
        margin: per head, target logit minus the best other logit in the training window (nats).
        r2: per head, the coefficient of determination of the law (drawn as ``1 - R²``, log axis,
            at least ``floor``).
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
                floor: float = 1e-4, threshold: float = 0.9, symbol_by=None) -> go.Figure:
    """The law's R^2 of each head against ``n e^-kappa``, how often ``n`` keys meet the peaks of ``e^s``.

    Chapter 5's boundary: the long-run law can describe a head's target mass only where
    ``n e^-kappa >> 1``; where ``n e^-kappa <~ 1`` a few large terms (aliases) rule the sum. The two
    sides are shaded.

    Args:
        reach: per head, ``n e^-kappa`` (> 0; drawn on a log axis).
        r2: per head, the coefficient of determination of the law (drawn as ``1 - R²``, log axis,
            at least ``floor``).
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
    return fig


# --- where does the law hold? (chapter 5)
def mass_at_fall(lawful, heads: dict, law: dict, fall: dict, train_len: int, vocab_size: int):
    """For the heads the law describes, the target mass where accuracy falls, and the critical mass p*.

    Args:
        lawful: ``(regime, head index)`` pairs (e.g. those with ``R² >= 0.9``).
        heads: ``{regime: (model, offsets, accuracy)}`` (:func:`margin_regimes`).
        law: ``{regime: kernel.dilution_law_fit(...)}`` (``ratio [M, n]``, ``1/p - 1`` from ``train_len`` on).
        fall: ``{regime: probes.accuracy_transition(...)}`` (``high``: the first length below 0.9, or None).
        train_len: the training length (column 0 of ``ratio``).
        vocab_size: the value table's token columns (the task's vocabulary).

    Returns:
        ``(p_at_fall, p_star)``, numpy float ``[n]`` over the lawful heads that fall and have a p*:
        ``1 / (1 + ratio)`` at the first length below 0.9, and
        :func:`~lengthgen_utils.analysis.theory.critical_target_mass` of the head's value table.

    Raises:
        ValueError / TypeError: ``train_len`` or ``vocab_size`` is not an int >= 1.

    Source: chapter 5, "Where does the law hold?".
    """
    train_len, vocab_size = check_int("train_len", train_len, minimum=1), check_int("vocab_size", vocab_size, minimum=1)
    p_at_fall, p_star = [], []
    for name, i in lawful:
        high = fall[name]["high"][i]
        if high is None:
            continue
        ratio = law[name]["ratio"][i, high - train_len]
        p_at_fall.append(float(1 / (1 + ratio)))
        table = heads[name][0].value_table().detach()[i:i + 1, :vocab_size]
        p_star.append(float(critical_target_mass(table, undefined="nan")[0]))
    p_at_fall, p_star = np.array(p_at_fall), np.array(p_star)
    defined = np.isfinite(p_star)  # p* does not exist where a token loses even at full attention
    return p_at_fall[defined], p_star[defined]


# --- intervening on the law (chapter 5, "Intervening on the law")
def scaled_logits(model, offsets, tasks, lengths, train_len: int, scale, n_samples: int) -> dict:
    """A regime's heads with plain logits and with a length-aware logit scale, from the kernel and in the model.

    Args:
        model: a RoPE head ensemble of M heads; offsets: the target offset k of each.
        tasks: one task per head (for the accuracies).
        lengths: ``[n]`` lengths (tokens), increasing; the kernel is read up to ``max(lengths)``.
        train_len: the training length (tokens).
        scale: ``[n]`` logit scale ``c_L`` per length (e.g. ``theory.log_length_scale``).
        n_samples: sequences per length for the accuracies.

    Returns:
        a dict: ``plain`` and ``scaled`` ``[M, n]`` target mass from the kernel
        (:func:`~lengthgen_utils.analysis.theory.exact_target_mass`); ``clean`` bool ``[M]``, no aliasing key up
        to ``max(lengths)``; ``margin [M]`` (nats, from the mean-field parameters); ``gap [M]``, the target's
        logit minus the nearest far key's (nats); ``above`` bool ``[M, n]``, some key of the sequence at that
        length above the target (where the scale, at least 1, can lower the target mass; elsewhere scaled
        ``p >= `` plain ``p`` by construction); ``plain_acc`` and ``scaled_acc`` ``[M, n]`` measured accuracy.

    Raises:
        ValueError / TypeError: ``n_samples`` is not an int >= 1; bad offsets or lengths (from the kernel).

    Source: chapter 5, "Intervening on the law".
    """
    n_samples = check_int("n_samples", n_samples, minimum=1)
    max_len = max(lengths)
    row = offset_kernel(model, max_len)
    alias = first_alias(model, offsets, train_len, max_distance=max_len)
    target = row[torch.arange(len(offsets)), max_len - 1 - torch.tensor(offsets)]
    others = row.clone()
    others[torch.arange(len(offsets)), max_len - 1 - torch.tensor(offsets)] = -torch.inf
    nearest = others.flip(1).cummax(1).values  # column L - 1: the largest logit of the last L keys
    above = nearest[:, [L - 1 for L in lengths]] > target[:, None]
    return dict(
        plain=exact_target_mass(row, offsets, lengths),
        scaled=exact_target_mass(row, offsets, lengths, logit_scale=scale),
        clean=torch.tensor([a is None for a in alias]),
        margin=mean_field_parameters(row, offsets, train_len)[0],
        gap=target - row[:, : max_len - train_len].max(1).values,  # nearest far key
        above=above,
        plain_acc=accuracy_by_length(model, tasks, lengths, n_samples=n_samples),
        scaled_acc=accuracy_by_length(model, tasks, lengths, n_samples=n_samples, logit_scale=scale),
    )


def _span(x):
    """min..max of the nats below the target, or "none" for no head."""
    return f"{x.min():.1f}..{x.max():.1f} nats below" if len(x) else "none"


def intervention_numbers(v) -> dict:
    """What the log-length scale does to one regime's heads without an alias: the numbers of its table column.

    Args:
        v: one regime's :func:`scaled_logits`.

    Returns:
        a dict: ``clean`` bool ``[M]`` (no aliasing key); over the clean heads, ``plain`` and ``scaled``
        ``1/p - 1`` ``[heads, n]``, ``cut`` (plain over scaled ``1/p - 1`` at the longest length), ``rises``
        (bool: the scaled ratio ends above its value at the first length) and ``gap`` (nats from the target
        down to the nearest key beyond the window); ``plain_acc`` and ``scaled_acc``, the mean accuracy of all
        ``M`` heads at the longest length (floats).

    Source: chapter 5, "Intervening on the law".
    """
    c = v["clean"]
    plain, scal = 1 / v["plain"][c] - 1, 1 / v["scaled"][c] - 1  # [heads, lengths]
    return dict(clean=c, plain=plain, scaled=scal, cut=plain[:, -1] / scal[:, -1],
                rises=scal[:, -1] > scal[:, 0], gap=v["gap"][c],
                plain_acc=float(v["plain_acc"][:, -1].mean()), scaled_acc=float(v["scaled_acc"][:, -1].mean()))


def _intervention(v, train_len: int, max_len: int):
    """(quantity, value) rows for the heads without an alias: 1/p - 1, accuracy."""
    x = intervention_numbers(v)
    c, plain, scal = x["clean"], x["plain"], x["scaled"]
    cut, rises, gap = x["cut"], x["rises"], x["gap"]
    acc = f"{x['plain_acc']:.3f} / {x['scaled_acc']:.3f}"
    return [
        ("heads without an aliasing key up to L", f"{int(c.sum())}/{len(c)}"),
        (f"1/p - 1 at {train_len} (median)", f"{plain[:, 0].median():.1e}"),
        (f"1/p - 1 at {max_len}, plain (median)", f"{plain[:, -1].median():.1e}"),
        (f"1/p - 1 at {max_len}, scaled (median)", f"{scal[:, -1].median():.1e}"),
        (f"plain / scaled at {max_len}", f"{cut.min():.0f} to {cut.max():.0e}"),
        (f"scaled, below its value at {train_len}", f"{int((~rises).sum())}/{len(rises)}"),
        ("  nearest key beyond the window", _span(gap[~rises])),
        (f"scaled, above its value at {train_len}", f"{int(rises.sum())}/{len(rises)}"),
        ("  nearest key beyond the window", _span(gap[rises])),
        (f"mean accuracy at {max_len}, plain / scaled", acc),
    ]


def intervention_table(scaled: dict, train_len: int, max_len: int) -> Table:
    """Plain against log-length scaled logits for the heads without an alias, one column per regime.

    Args:
        scaled: ``{regime: scaled_logits(...)}`` (:func:`scaled_logits`).
        train_len: the training length (tokens); max_len: the longest length (tokens).

    Raises:
        ValueError: ``scaled`` is empty.

    Source: chapter 5, "Intervening on the law".
    """
    if not scaled:
        raise ValueError("scaled must hold at least one regime")
    columns = {name: _intervention(v, train_len, max_len) for name, v in scaled.items()}
    first = next(iter(columns.values()))
    return Table(["heads without an alias"] + list(columns),
                 [[quantity] + [col[i][1] for col in columns.values()] for i, (quantity, _) in enumerate(first)],
                 caption=f"Log-length scaled logits (c_L = log L / log {train_len}) against plain ones; L up to "
                 f"{max_len}")


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


# --- the exercises' numbers (chapter 5, "Exercises": the solutions quote this page's run)
def decay_numbers(book, decayed, train_len: int, max_distance: int, slow=slice(3, None), lag: int = 19) -> dict:
    """Exercise 2: the book's heads against the strongly weight-decayed ones: the slow pairs' amplitudes and
    the first aliases.

    Args:
        book, decayed: ``(model, offsets)`` of each regime (the first two entries of :func:`margin_regimes`).
        train_len: the training length; max_distance: the farthest alias searched (tokens).
        slow: the slow pairs (default 3 to 7); lag: the lag counted (pairs 0 and 1's first near-recurrence).

    Returns:
        ``{name: value}`` for the glue names ``ch5_ex2_<name>``: ``book_r_min``, ``book_r_max``,
        ``decayed_r_min``, ``decayed_r_max`` (over the slow pairs, the median amplitude over the heads, nats),
        ``at_lag`` (decayed heads whose first alias is at ``k + lag``), ``heads`` (decayed heads),
        ``book_alias``, ``decayed_alias`` (median first alias over the heads with one, tokens) and ``moves``
        ('falls' or 'rises': from the book's median to the decayed one).

    Source: chapter 5, exercise 2.
    """
    out = {}
    aliases = {}
    for name, (model, offsets) in (("book", book), ("decayed", decayed)):
        r = carrier_spectrum(model).r.median(0).values[slow]
        out[f"{name}_r_min"], out[f"{name}_r_max"] = float(r.min()), float(r.max())
        aliases[name] = first_alias(model, offsets, train_len, max_distance)
        found = [a for a in aliases[name] if a is not None]
        out[f"{name}_alias"] = float(np.median(found)) if found else float("nan")
    out["at_lag"] = sum(a is not None and a - k == lag for a, k in zip(aliases["decayed"], decayed[1]))
    out["heads"] = len(aliases["decayed"])
    out["moves"] = "falls" if out["decayed_alias"] < out["book_alias"] else "rises"
    return out


def temperature_numbers(law_trained: dict, kinds, law_book: dict, kinds_book) -> dict:
    """Exercise 3: heads trained with the log-length temperature against the book's recipe.

    Args:
        law_trained, law_book: :func:`~lengthgen_utils.analysis.kernel.dilution_law_fit` of each
            (``margin``, ``r2`` per head).
        kinds, kinds_book: how each head falls (``probes.accuracy_transition``'s ``kind``), the temperature
            heads evaluated with the same scale.

    Returns:
        ``{name: value}`` for the glue names ``ch5_ex3_<name>``: ``margin_min``, ``margin_max``,
        ``margin_median``, ``book_margin`` (the book's median), ``smaller`` ('no smaller than' or 'smaller
        than': the temperature heads' median margin against the book's), ``lawful`` (heads with
        ``R^2 >= 0.9``), ``heads``, ``falls`` and ``book_falls`` (:func:`count_kinds`).

    Source: chapter 5, exercise 3.
    """
    margin, book = law_trained["margin"], float(law_book["margin"].median())
    return {"margin_min": float(margin.min()), "margin_max": float(margin.max()),
            "margin_median": float(margin.median()), "book_margin": book,
            "smaller": "no smaller than" if float(margin.median()) >= book else "smaller than",
            "lawful": int((law_trained["r2"] >= 0.9).sum()), "heads": len(margin),
            "falls": count_kinds(kinds), "book_falls": count_kinds(kinds_book)}
