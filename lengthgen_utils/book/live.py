"""Live panels of the web book: a figure precomputed in Python that the reader's browser retrains.

A chapter cell returns a :class:`LivePanel`. In the built book it is a block of HTML holding

* the figure the build computed with the package (a plotly figure in the book's look);
* a status line saying what the figure shows, and a ``<noscript>`` note;
* the panel's configuration (sliders, the training recipe, the figure's layout) as JSON.

The book's script ``_static/lengthgen_live.js`` (loaded on every page, like every script in
``_static/``) adds the sliders; moving one trains fresh heads in a Web Worker, in plain
JavaScript (the same model, gradients and AdamW update as the package: ``tests/test_live_trainer.py``
checks them against torch step by step), shows a progress bar and "The page is training",
and redraws the figure. Until the reader touches a slider, and with JavaScript off, the panel
shows the precomputed figure. Slider settings that make no task (an offset too large for the
training length) are explained in the status line instead of being trained.

In a Jupyter kernel the panel displays as its static figure (plotly's JSON); the live explorer for
a kernel is :class:`lengthgen_utils.book.widgets.RetrievalExplorer`.

Two kinds of panel:

* ``"accuracy"`` (chapter 1, :func:`accuracy_panel`): offset, training length and number of
  seeds; RoPE against APE, accuracy from 1x to 16x the training length with the chance line;
* ``"kernel"`` (chapter 4, :func:`kernel_panel`): the RoPE base and ``d_head``; the trained kernel
  ``s(-d) - s(-k)`` of each seed over a long range, the candidate aliases of the frequency set, each
  seed's predicted first alias and its first failing length.
"""
from __future__ import annotations

import html
import itertools
import json
import math

import torch

from .._validate import check_int, check_int_sequence
from ..analysis import kernel, theory
from ..analysis.falls import first_failure
from ..core.encodings import LearnedAPE, RoPE
from . import ch04, figures, render, sliders, style

SCRIPT = "_static/lengthgen_live.js"
KINDS = ("accuracy", "kernel")
FAIL_BELOW = 0.95  # a length "fails" when a seed's accuracy there is below this (chapter 4)
_ids = itertools.count()


def _fit_constants() -> dict:
    """The layout rules of :func:`~lengthgen_utils.book.render.fit_to_column` the page's script re-applies."""
    return {"title_chars": render.TITLE_CHARS, "legend_chars": render.LEGEND_CHARS, "toolbar_px": render.TOOLBAR_PX,
            "title_line_px": render.TITLE_LINE_PX, "legend_line_px": render.LEGEND_LINE_PX,
            "figure_height": render.FIGURE_HEIGHT, "x_title_chars": render.X_TITLE_CHARS,
            "y_title_chars": render.Y_TITLE_CHARS, "min_seeds": style.MIN_SEEDS}


def _json_for_html(value) -> str:
    """JSON that is safe inside a ``<script>`` element (no ``</script>`` or ``<!--`` can appear)."""
    return json.dumps(value, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e")


class LivePanel:
    """A live panel: a static figure, what the page's script needs to retrain it, and how to display it.

    Built by :func:`live_panel` (or the chapters' :func:`accuracy_panel` / :func:`kernel_panel`);
    display it as a cell's value.

    Attributes:
        kind: ``"accuracy"`` or ``"kernel"``.
        figure: the static figure, as laid out for the page (:func:`~lengthgen_utils.book.render.fit_to_column`).
        config: the JSON configuration the page's script reads (controls, initial values, recipe, texts).
        html: the panel's HTML for the built book.
    """

    def __init__(self, kind: str, figure: dict, config: dict, html_text: str):
        self.kind, self.figure, self.config, self.html = kind, figure, config, html_text

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        bundle = render.bundle(self.figure)
        return {"text/html": self.html,
                "application/vnd.plotly.v1+json": bundle["application/vnd.plotly.v1+json"],
                "text/plain": f"<live panel ({self.kind}): {self.config['text']['static']}>"}

    def _repr_html_(self) -> str:
        return self.html


def _check_controls(controls, initial: dict) -> list[dict]:
    if isinstance(controls, (str, bytes)) or not hasattr(controls, "__iter__"):
        raise TypeError(f"controls must be a sequence of dicts; got {controls!r:.60}")
    out = []
    for i, c in enumerate(controls):
        if not isinstance(c, dict) or not {"name", "label", "values"} <= set(c):
            raise TypeError(f"controls[{i}] must be a dict with 'name', 'label' and 'values'; got {c!r:.80}")
        values = list(c["values"])
        if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                             for v in values):
            raise ValueError(f"controls[{i}] ({c['name']!r}) must have a non-empty list of finite numbers; got {values!r}")
        if c["name"] not in initial:
            raise ValueError(f"initial has no value for the control {c['name']!r}; got {sorted(initial)}")
        if initial[c["name"]] not in values:
            raise ValueError(f"initial[{c['name']!r}] = {initial[c['name']]!r} is not one of the control's values "
                             f"{values}")
        out.append({**c, "values": values})
    names = [c["name"] for c in out]
    if len(set(names)) != len(names):
        raise ValueError(f"control names must be distinct; got {names}")
    return out


def live_panel(kind: str, initial_figure, controls, initial: dict, fixed: dict, text: dict, rules=(),
               panel_id: str | None = None) -> LivePanel:
    """A live panel around a precomputed figure (see the module docstring).

    Args:
        kind: ``"accuracy"`` or ``"kernel"``: which training job and figure the page's script makes.
        initial_figure: the precomputed plotly figure (a ``Figure`` or its JSON dict); it must show
            the setting ``initial``.
        controls: the sliders, in order: dicts with ``name``, ``label`` (shown beside the slider),
            ``values`` (the numbers the slider steps through) and optionally ``format`` (``"base"``:
            powers of ten written as ``10⁴``).
        initial: ``{name: value}`` for every control: the setting the static figure shows (the page
            shows the static figure again when the sliders come back to it).
        fixed: the training recipe and evaluation settings of the kind (numbers and lists, JSON).
        text: the strings the panel shows: ``static`` (the status line with JavaScript off),
            ``ready`` (once the sliders are there), ``initial`` (back at the static setting) and ``title``
            (the figure title, with ``{name}`` fields).
        rules: settings that make no task, e.g. ``{"kind": "offset_fits", "offset": "offset",
            "train_len": "train_len"}`` (the offset must be at most the training length - 2).
        panel_id: the HTML id (default: a fresh ``lg-live-<n>``).

    Returns:
        a :class:`LivePanel`.

    Raises:
        ValueError / TypeError: an unknown kind, a control without values or whose initial value is
            not one of them, a missing text, a rule naming an unknown control, or an initial setting
            that a rule forbids.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    if not isinstance(initial, dict):
        raise TypeError(f"initial must be a dict {{control name: value}}; got {type(initial).__name__}")
    controls = _check_controls(controls, initial)
    for key in ("static", "ready", "initial", "title"):
        if not isinstance(text.get(key), str) or not text[key]:
            raise ValueError(f"text[{key!r}] must be a non-empty string; got {text.get(key)!r}")
    names = {c["name"] for c in controls}
    rules = [dict(r) for r in rules]
    for r in rules:
        if r.get("kind") != "offset_fits" or not {r.get("offset"), r.get("train_len")} <= names:
            raise ValueError(f"a rule must be {{'kind': 'offset_fits', 'offset': <control>, 'train_len': <control>}} "
                             f"over the controls {sorted(names)}; got {r!r}")
        if initial[r["offset"]] > initial[r["train_len"]] - 2:
            raise ValueError(f"the initial setting makes no task: offset {initial[r['offset']]} > training length "
                             f"{initial[r['train_len']]} - 2")
    figure = render.fit_to_column(initial_figure)
    layout = sliders.plain(figure.get("layout", {}))
    config = {"kind": kind, "controls": controls, "initial": dict(initial), "fixed": sliders.plain(fixed),
              "rules": rules, "text": dict(text), "fit": _fit_constants(), "layout": layout}
    panel_id = panel_id or f"lg-live-{next(_ids)}"
    figure_html = render.bundle(figure)["text/html"]
    note = ("The sliders of this panel retrain the model in your browser and need JavaScript; without it the "
            "panel shows the figure computed when the book was built.")
    body = (f'<div class="lg-live" id="{html.escape(panel_id)}" data-kind="{kind}">'
            f'<script type="application/json" class="lg-live-config">{_json_for_html(config)}</script>'
            f'<div class="lg-live-figure">{figure_html}</div>'
            f'<p class="lg-live-status" role="status" aria-live="polite">{html.escape(text["static"])}</p>'
            f'<noscript><p class="lg-live-note">{html.escape(note)}</p></noscript></div>')
    return LivePanel(kind, figure, config, body)


# ---------------------------------------------------------------------------------- chapter 1
ACCURACY_TITLE = "Accuracy, k = {k}, L<sub>train</sub> = {T}: {n} seeds"
MULTIPLES = (1, 2, 4, 8, 16)  # evaluation lengths of chapter 1's panel, in training lengths


def _experiment_recipe(exp) -> dict:
    return {"steps": exp.steps, "batch_size": exp.batch_size, "lr": exp.lr, "weight_decay": exp.weight_decay,
            "vocab_size": exp.vocab_size, "d_model": exp.d_model, "d_head": exp.d_head, "data_seed": exp.data_seed,
            "eval_samples": exp.eval_samples, "eval_seed": 12345}


def accuracy_panel(results: dict, n_seeds: int = 3, offsets=range(1, 16), train_lens=range(8, 65),
                   seeds=range(1, 9)) -> LivePanel:
    """Chapter 1's live panel: RoPE against APE, accuracy from 1x to 16x, retrained for any offset and length.

    The static figure is the first ``n_seeds`` seeds of the chapter's own runs (``results``); the
    page trains with the same recipe (steps, batch, learning rate, sizes; lengths uniform in
    ``[k + 2, L_train]``; APE table of ``16 L_train`` rows) for the offset, training length and
    number of seeds on the sliders. An offset above the training length - 2 is explained, not trained.

    Args:
        results: ``{"rope": Runs, "ape": Runs}`` from
            :func:`~lengthgen_utils.run.runners.run_retrieval`, at one offset and training length,
            variable-length training from ``offset + 2``, evaluated at (at least) 1x, 2x, 4x, 8x and 16x;
            the panel shows those five lengths.
        n_seeds: seeds in the static figure (the first ones of each run) and the slider's start.
        offsets, train_lens, seeds: the values of the three sliders.

    Returns:
        a :class:`LivePanel` of kind ``"accuracy"``.

    Raises:
        ValueError / TypeError: not exactly a RoPE (base 10^4, half-split) and a learned APE run;
            runs that differ in their recipe; fixed-length training or a shortest length other
            than ``offset + 2``; fewer than ``n_seeds`` seeds; slider values that leave out the runs'
            setting.
    """
    if not isinstance(results, dict) or set(results) != {"rope", "ape"}:
        raise ValueError(f"results must be {{'rope': ..., 'ape': ...}}; got keys {sorted(results)!r}")
    rope, ape = results["rope"], results["ape"]
    if rope.experiment.pe != RoPE() or not isinstance(ape.experiment.pe, LearnedAPE) \
            or ape.experiment.pe != LearnedAPE():
        raise ValueError(f"results must hold a RoPE (base 10^4) and a learned APE run (init std 0.02); got "
                         f"{rope.experiment.pe!r} and {ape.experiment.pe!r}")
    n_seeds = check_int("n_seeds", n_seeds, minimum=1)
    exp = rope.experiment
    for r in (rope, ape):
        e = r.experiment
        if _experiment_recipe(e) != _experiment_recipe(exp) or (e.offset, e.train_len) != (exp.offset, exp.train_len):
            raise ValueError("the RoPE and APE runs must share their recipe, offset and training length")
        if e.fixed_length or e.min_train_len not in (None, e.offset + 2) or e.attention != "softmax":
            raise ValueError("the runs must train softmax heads at lengths uniform in [offset + 2, train_len]")
        if not set(MULTIPLES) <= set(e.length_multiples) or e.table_len < 16 * e.train_len:
            raise ValueError(f"the runs must be evaluated at {MULTIPLES} times the training length (at least); "
                             f"got {e.length_multiples}")
        if r.accuracy.shape[0] < n_seeds:
            raise ValueError(f"n_seeds={n_seeds} but a run has only {r.accuracy.shape[0]} seeds")
    offsets = check_int_sequence("offsets", offsets, minimum=1)
    train_lens = check_int_sequence("train_lens", train_lens, minimum=3)
    seeds = check_int_sequence("seeds", seeds, minimum=1)
    k, T = exp.offset, exp.train_len
    title = ACCURACY_TITLE.format(k=k, T=T, n=n_seeds).replace("1 seeds", "1 seed")  # as the page writes it
    curves = {}
    for pe, r in results.items():  # the columns at 1x .. 16x (the full profile evaluates further)
        cols = [r.experiment.length_multiples.index(m) for m in MULTIPLES]
        curves[pe] = ([r.lengths[c] for c in cols], r.accuracy[:n_seeds, cols].double().numpy())
    chance = exp.task.chance
    figure = figures.accuracy_vs_length(curves, chance=chance, train_len=T, title=title)
    recipe = _experiment_recipe(exp)
    fixed = {**recipe, "encodings": ["rope", "ape"], "base": RoPE().base, "multiples": list(MULTIPLES),
             "chance": chance, "chance_text": f"chance = {chance:.3f}", "labels": {pe: r.experiment.pe.label for pe, r in results.items()},
             "colors": {pe: r.experiment.pe.color for pe, r in results.items()}}
    steps = f"{exp.steps} steps of {exp.batch_size} sequences"
    text = {
        "static": f"Computed when the book was built, in Python: RoPE and APE, {n_seeds} seeds each, k = {k}, "
                  f"training length {T}, {steps}.",
        "ready": f"Computed when the book was built, in Python (RoPE and APE, {n_seeds} seeds each, k = {k}, "
                 f"training length {T}, {steps}). Move a slider and this page trains new heads in your browser "
                 f"with the same recipe.",
        "initial": f"Back at the setting computed when the book was built (in Python, {steps}).",
        "title": ACCURACY_TITLE,
    }
    controls = [{"name": "offset", "label": "offset k", "values": list(offsets)},
                {"name": "train_len", "label": "training length", "values": list(train_lens)},
                {"name": "n_seeds", "label": "seeds", "values": list(seeds)}]
    return live_panel("accuracy", figure, controls, {"offset": k, "train_len": T, "n_seeds": n_seeds}, fixed, text,
                      rules=[{"kind": "offset_fits", "offset": "offset", "train_len": "train_len"}])


# ---------------------------------------------------------------------------------- chapter 4
KERNEL_TITLE = "Kernel of RoPE heads, base {base}, d<sub>head</sub> = {d_head}, k = {k}"
BASES = tuple(10 ** (1 + i / 4) for i in range(17))  # 10 .. 10^5, four steps a decade
SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def _base_text(base: float) -> str:
    """The RoPE base as the panel writes it: ``10⁴`` or ``1.8×10⁴`` from 1000 on, else three digits (the script's rule)."""
    if base >= 1000:
        e = math.floor(math.log10(base) + 1e-9)
        m = base / 10 ** e
        return ("" if abs(m - 1) < 1e-9 else f"{float(f'{m:.2g}'):g}×") + "10" + str(e).translate(SUPERSCRIPT)
    return str(round(base)) if base >= 100 else f"{float(f'{base:.3g}'):g}"


def kernel_report(model, offset: int, train_len: int, max_distance: int, tolerance: float = 1.0) -> dict:
    """What chapter 4's live panel draws for a set of RoPE heads, computed with the package.

    Args:
        model: a RoPE :class:`~lengthgen_utils.core.models.RetrievalHead` ensemble (M heads, one offset).
        offset: the target offset k.
        train_len: the training length.
        max_distance: the longest distance drawn (>= train_len).
        tolerance: nats below the target logit that count as an alias.

    Returns:
        ``{"relative": float64 [M, max_distance + 1]``, ``s(D) - s(-k)`` (nats) in the row layout over
        ``D = -max_distance .. 0`` (column ``-1 - d`` holds distance ``d``),
        ``"aliases"``: per head the predicted first alias (:func:`~lengthgen_utils.analysis.kernel.predicted_alias_distance`)
        or None, ``"dominant"``: ``[M, 2]`` pair indices, ``"candidates"``: the union of the heads' candidate
        alias distances ``k + lag >= train_len`` (increasing), ``"pairs"``: the union of their dominant pairs}.

    Raises:
        ValueError: not a RoPE head, or sizes out of range (see the kernel functions).
    """
    row = kernel.offset_kernel(model, max_distance + 1)  # s(D), D = -max_distance .. 0
    relative = (row - row[:, -1 - offset, None]).numpy()
    aliases, dominant = kernel.predicted_alias_distance(model, offset, train_len, max_distance, tolerance=tolerance)
    theta = kernel.carrier_spectrum(model).theta
    candidates = set()
    for pairs in dominant.tolist():
        lags = theory.pair_recurrences(theta, pairs, max_distance - offset, math.pi / 3)
        candidates.update(int(d) for d in (lags + offset).tolist() if d >= train_len)
    return {"relative": relative, "aliases": aliases, "dominant": dominant, "candidates": sorted(candidates),
            "pairs": sorted(set(dominant.flatten().tolist()))}


def kernel_panel(model, offsets, lengths, accuracy, experiment, offset: int = 3, n_seeds: int = 3,
                 bases=BASES, d_heads=(4, 8, 16, 32)) -> LivePanel:
    """Chapter 4's live panel: the kernel of RoPE heads over a long range, retrained for any base and ``d_head``.

    The static figure is computed from the chapter's own heads: the first ``n_seeds`` heads of
    ``offset`` in an offset-major sweep (``model``, ``offsets``), their accuracy at ``lengths`` giving
    each head's first failing length (accuracy below 0.95). The page retrains ``n_seeds`` RoPE heads
    with the sweep's recipe (steps, batch, learning rate, lengths uniform in the sweep's shared
    ``[max(offsets) + 2, L_train]``) at the base and ``d_head`` of the sliders, evaluates them at
    ``lengths`` (512 sequences each) and draws the same figure
    (:func:`~lengthgen_utils.book.ch04.alias_kernel_figure`).

    Args:
        model: a RoPE :class:`~lengthgen_utils.core.models.RetrievalHead` ensemble, one head per entry of ``offsets``.
        offsets: each head's offset (offset-major, seeds ``0 ..`` within each offset).
        lengths: evaluation lengths (tokens), increasing; the longest sets the range drawn (``d <= max - 1``).
        accuracy: ``[n_heads, len(lengths)]`` accuracies.
        experiment: the sweep's :class:`~lengthgen_utils.run.configs.RetrievalExperiment` (its recipe).
        offset: the offset drawn (k).
        n_seeds: heads drawn (the first seeds of ``offset``).
        bases, d_heads: the values of the two sliders (the model's base and ``d_head`` must be among them).

    Returns:
        a :class:`LivePanel` of kind ``"kernel"``.

    Raises:
        ValueError / TypeError: not a RoPE model; ``offsets`` or ``accuracy`` that do not match it; fewer
            than ``n_seeds`` heads of ``offset``; lengths that do not start at the training length;
            the model's base or ``d_head`` not on the sliders.
    """
    enc = model.config.pe
    if type(enc) is not RoPE or enc.interleaved or enc.angle_dtype != "float64":
        raise ValueError(f"model must be a RoPE head (half-split, float64 angles); got pe={enc!r}")
    offsets = list(check_int_sequence("offsets", offsets, minimum=1))
    if len(offsets) != model.n_models:
        raise ValueError(f"offsets must have one entry per head ({model.n_models}); got {len(offsets)}")
    lengths = list(check_int_sequence("lengths", lengths, minimum=2))
    acc = torch.as_tensor(accuracy).double()
    if tuple(acc.shape) != (model.n_models, len(lengths)):
        raise ValueError(f"accuracy must be [{model.n_models}, {len(lengths)}]; got {tuple(acc.shape)}")
    rows = [i for i, k in enumerate(offsets) if k == offset][:check_int("n_seeds", n_seeds, minimum=1)]
    if len(rows) < n_seeds:
        raise ValueError(f"only {len(rows)} heads have offset {offset}; n_seeds={n_seeds}")
    T = experiment.train_len
    if lengths != sorted(lengths) or lengths[0] != T:
        raise ValueError(f"lengths must increase from the training length {T}; got {lengths}")
    bases, d_heads = [float(b) for b in bases], list(check_int_sequence("d_heads", d_heads, minimum=2))
    base = min(bases, key=lambda b: abs(math.log(b / enc.base)))
    if abs(base / enc.base - 1) > 1e-9 or model.config.d_head not in d_heads:
        raise ValueError(f"the model's base {enc.base:g} and d_head {model.config.d_head} must be slider values "
                         f"(bases {[f'{b:g}' for b in bases]}, d_heads {d_heads})")
    heads = model.subset(rows)
    max_distance = lengths[-1] - 1
    report = kernel_report(heads, offset, T, max_distance)
    failures = first_failure(lengths, acc[rows].numpy(), FAIL_BELOW)
    title = KERNEL_TITLE.format(base=_base_text(base), d_head=model.config.d_head, k=offset)
    y_range = (-12.0, 8.0)
    figure = ch04.alias_kernel_figure(report["relative"], report["aliases"], failures, report["candidates"],
                                       report["pairs"], T, lengths[-1], title, y_range=y_range)
    min_train_len = experiment.min_train_len if experiment.min_train_len is not None else max(offsets) + 2
    recipe = _experiment_recipe(experiment)
    fixed = {**recipe, "eval_samples": 512, "offset": offset, "train_len": T, "min_train_len": min_train_len,
             "n_seeds": n_seeds, "lengths": lengths, "max_distance": max_distance, "n_pairs": 2,
             "phase_tolerance": math.pi / 3, "tolerance": 1.0, "fail_below": FAIL_BELOW,
             "y_low": y_range[0], "y_high": y_range[1]}
    steps = f"{experiment.steps} steps of {experiment.batch_size} sequences"
    what = (f"RoPE base {_base_text(base)}, d_head {model.config.d_head}, {n_seeds} seeds, k = {offset}, {steps}, "
            f"accuracy at {lengths[0]} to {lengths[-1]} tokens")
    text = {
        "static": f"Computed when the book was built, in Python: {what}.",
        "ready": f"Computed when the book was built, in Python ({what}). Move a slider and this page trains "
                 f"new heads in your browser with the same recipe (accuracy on 512 sequences per length).",
        "initial": f"Back at the setting computed when the book was built (in Python, {steps}).",
        "title": KERNEL_TITLE.replace("{k}", str(offset)),
    }
    controls = [{"name": "base", "label": "RoPE base", "values": bases, "format": "base"},
                {"name": "d_head", "label": "d<sub>head</sub>", "values": d_heads}]
    return live_panel("kernel", figure, controls, {"base": base, "d_head": model.config.d_head}, fixed, text)


__all__ = ["LivePanel", "live_panel", "accuracy_panel", "kernel_panel", "kernel_report"]
