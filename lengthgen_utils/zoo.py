"""The position-encoding zoo (chapter 9): every encoding on the same tasks, with the same training and probes.

The chapter asks, for each encoding people use, the same four questions: is the logit a function of the
offset alone (the shift test of chapter 2), does the trained model extrapolate (chapter 1's retrieval head
and chapter 7's delayed copy), what did training select (where the attention argmax lands beyond the
training range), and, for learned absolute positions, does changing only the training distribution
(randomised positions) change the selected rule. This module runs the experiments through the results
cache and computes the probes, so the chapter stays a few calls per cell.

Every model is trained by the package's runners (:func:`~lengthgen_utils.runners.run_retrieval`,
:func:`~lengthgen_utils.runners.run_transformer`) with the recipe of chapter 1 or chapter 7: the runs of
RoPE, APE and NoPE are the very ones those chapters trained (the same configurations, so a build of the
book loads them from the cache). Two encodings are test-time changes of RoPE (position interpolation and
NTK-aware scaling): they coincide with RoPE at every training length, so their models are the trained RoPE
models, evaluated with the scaled encoding (:class:`TestTimeEncoding`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ._validate import check_int, check_int_sequence, normalize_numbers
from .seeding import generator
from .cache import load_or_run
from .configs import RetrievalExperiment, TransformerExperiment, transformer_experiment
from .evaluation import accuracy_by_length, split_accuracy, token_accuracy_by_position
from .models import RetrievalHead, Transformer
from .positional import (ALiBi, Encoding, LearnedAPE, NoPE, NoPEBOS, RandomizedPositions, RoPE, RoPEInterpolation,
                         RoPENTK, SinusoidalAPE, T5Bias, get_encoding)
from .probes import (PLACEMENTS, argmax_placement, attention_argmax, copy_head_placement, shift_attention_change,
                     shift_invariance, shift_logit_difference)
from .profiles import Profile
from .runners import build_model, build_transformer, run_retrieval, run_transformer
from .training import default_cpu_threads, model_threads

SPAN = 4
"""Randomised training positions are drawn from ``0 .. SPAN * train_len - 1`` (4x the training length)."""

MIN_STEPS = 2000
"""Single heads train for at least this many steps in every profile: under random shifts each row of a
64-row table is visited by about a quarter of the steps, and the control needs them (chapter 1's default)."""

CONTROL_SEEDS = 24
"""Seeds of the decisive control's single-head ensemble in every profile (at least the profile's own).

Its extrapolation is a rate, not a certainty: training at random shifts visits every table row, but pairs a
query with keys at most ``train_len - 1`` away, so at 2x each query meets keys at distances no training
step paired with it, whose logits the loss never constrained. Of 256 seeds (64 each at seed bases 0, 1
and 2, and at base 0 on torch's scalar CPU kernels; the ``quick`` recipe) 78% read the key ``k`` back at 2x,
but all seeds of one run share its training batches, so one run's share moves more than independent seeds'
would: over ten seed sets of the ``quick`` profile it ranged from 0.46 to 1.0. Chapter 9 asserts that at
least a third of the seeds do; plain APE (none) cannot pass that."""

SHIFTS = (1, 16, 64, 192)
"""The global position shifts of the shift test (all keep a training-length sequence inside a 256-row table)."""


def zoo_encodings(train_len: int) -> tuple[Encoding, ...]:
    """The chapter's encodings, in the order of its table, for a task trained at length ``train_len``.

    NoPE (without and with a BOS marker), learned and sinusoidal APE, learned APE trained at randomised
    positions (a sorted random subset of ``0 .. SPAN*train_len - 1``, and a random shift within it), RoPE,
    RoPE at randomised positions, RoPE with position interpolation and with NTK-aware scaling at test time,
    ALiBi, and T5's bucketed bias.

    Raises:
        ValueError / TypeError: ``train_len`` is not an int >= 2.
    """
    train_len = check_int("train_len", train_len, minimum=2)
    span = SPAN * train_len
    return (NoPE(), NoPEBOS(), LearnedAPE(), SinusoidalAPE(),
            RandomizedPositions(LearnedAPE(), span), RandomizedPositions(LearnedAPE(), span, contiguous=True),
            RoPE(), RandomizedPositions(RoPE(), span), RoPEInterpolation(train_len=train_len),
            RoPENTK(train_len=train_len), ALiBi(), T5Bias())


def control_encoding(train_len: int) -> RandomizedPositions:
    """The decisive control: learned APE trained at a random shift within ``0 .. SPAN*train_len - 1``."""
    return RandomizedPositions(LearnedAPE(), SPAN * check_int("train_len", train_len, minimum=2), contiguous=True)


def trained_encoding(pe) -> Encoding:
    """The encoding a model is *trained* with: plain RoPE for a test-time scaling of RoPE (PI, NTK), which
    coincides with it at every length up to its ``train_len``; ``pe`` itself otherwise."""
    pe = get_encoding(pe)
    if isinstance(pe, RoPEInterpolation):
        return RoPE(pe.base, pe.interleaved, pe.angle_dtype)
    return pe


def visited_positions(pe, train_len: int) -> int:
    """How many positions (``0 .. n-1``) training visits: ``max_position`` for randomised positions, else
    ``train_len``."""
    pe = get_encoding(pe)
    return pe.max_position if isinstance(pe, RandomizedPositions) else check_int("train_len", train_len, minimum=1)


@dataclass(frozen=True)
class TestTimeEncoding:
    """The cache key of an evaluation of the weights ``trained`` produced, run with encoding ``pe`` at test time."""

    trained: RetrievalExperiment | TransformerExperiment
    pe: Encoding

    def __post_init__(self):
        normalize_numbers(self)  # numpy scalars become Python numbers before any check
        object.__setattr__(self, "pe", get_encoding(self.pe))
        if not isinstance(self.trained, (RetrievalExperiment, TransformerExperiment)):
            raise TypeError(f"trained must be a RetrievalExperiment or TransformerExperiment; got "
                            f"{type(self.trained).__name__}")


@dataclass
class ZooRun:
    """One encoding on one task: the trained ensemble (with the encoding it is tested with) and its accuracy.

    Attributes:
        pe: the encoding at test time.
        experiment: what was trained (its ``pe`` is :func:`trained_encoding` of ``pe``).
        model: the trained ensemble, running ``pe``.
        initial: the same ensemble at initialisation (the random heads of the shift test), running ``pe``.
        lengths: evaluation lengths (tokens).
        accuracy: ``[n_seeds, len(lengths)]``: retrieval accuracy at the query; for delayed copy, token
            accuracy at positions ``< train_len`` at the training length and at positions ``>= train_len``
            at longer lengths.
        train_len: the (longest) training length.
        per_position: delayed copy only: ``{L: [n_seeds, L]}`` token accuracy by position.
    """

    pe: Encoding
    experiment: RetrievalExperiment | TransformerExperiment
    model: RetrievalHead | Transformer
    initial: RetrievalHead | Transformer
    lengths: list
    accuracy: Tensor
    train_len: int
    per_position: dict | None = None

    @property
    def visited(self) -> int:
        """Positions ``0 .. visited-1`` were seen in training."""
        return visited_positions(self.pe, self.train_len)

    def mean_at(self, multiple: int) -> float | None:
        """Mean accuracy over seeds at ``multiple`` times the training length (None if not evaluated there)."""
        seq_len = multiple * self.train_len
        return float(self.accuracy[:, self.lengths.index(seq_len)].mean()) if seq_len in self.lengths else None


def _with_encoding(model, pe, build):
    """A copy of ``model`` (same weights) built by ``build`` with encoding ``pe`` instead of its own."""
    copy = build(pe)
    missing, unexpected = copy.load_state_dict(model.state_dict(), strict=False)
    if missing or unexpected:
        raise ValueError(f"encoding {pe!r} does not have the parameters of {model.encoding!r} "
                         f"(missing {missing}, unexpected {unexpected})")
    return copy.to(model.device).eval()


def _test_time(model, pe, exp, build, measure, cache):
    """The trained ``model`` rebuilt with the test-time encoding ``pe`` (same weights, see
    :func:`_with_encoding`), and ``measure(that model)`` through the cache under :class:`TestTimeEncoding`."""
    model = _with_encoding(model, pe, build)
    payload = load_or_run(TestTimeEncoding(exp, pe), lambda: measure(model), cache=cache, device=model.device,
                          threads=default_cpu_threads(model))[0]
    return model, payload


def run_retrieval_zoo(profile: Profile, offset: int = 3, encodings=None, device=None, cache=True) -> dict:
    """Chapter 1's retrieval recipe for every encoding of the zoo: ``{Encoding: ZooRun}``.

    Each encoding is one batched ensemble of ``profile.n_seeds`` seeds trained by
    :func:`~lengthgen_utils.runners.run_retrieval` with ``RetrievalExperiment.from_profile(profile, pe=...,
    offset=offset)``, chapter 1's configuration, for at least :data:`MIN_STEPS` steps (the profile's steps
    when more); a test-time scaling of RoPE is evaluated on the trained RoPE ensemble (through the cache as a
    :class:`TestTimeEncoding`). The decisive control (:func:`control_encoding`) trains
    :data:`CONTROL_SEEDS` seeds: its claim is a rate.

    Args:
        profile: the run profile.
        offset: the task's offset k (chapter 1: 3).
        encodings: the encodings (default :func:`zoo_encodings` of the profile's training length).
        device, cache: as for :func:`~lengthgen_utils.runners.run_retrieval`.

    Returns:
        ``{pe: ZooRun}`` in the order of ``encodings``.
    """
    offset = check_int("offset", offset, minimum=1)
    base = RetrievalExperiment.from_profile(profile, offset=offset, steps=max(profile.steps, MIN_STEPS))
    encodings = zoo_encodings(base.train_len) if encodings is None else tuple(get_encoding(e) for e in encodings)
    out = {}
    control = control_encoding(base.train_len)
    for pe in encodings:
        exp = replace(base, pe=trained_encoding(pe))
        if pe == control:
            exp = replace(exp, n_seeds=max(exp.n_seeds, CONTROL_SEEDS))
        result = run_retrieval(exp, device=device, cache=cache)
        model, accuracy = result.model, result.accuracy
        if pe != exp.pe:
            model, payload = _test_time(
                model, pe, exp, lambda e: build_model(replace(exp, pe=e)),
                lambda m: {"accuracy": accuracy_by_length(m, exp.task, exp.eval_lengths, n_samples=exp.eval_samples)},
                cache)
            accuracy = payload["accuracy"]
        initial = build_model(replace(exp, pe=pe)).to(model.device).eval()
        out[pe] = ZooRun(pe, exp, model, initial, list(result.lengths), accuracy, exp.train_len)
    return out


def copy_zoo_encodings(profile: Profile) -> tuple[Encoding, ...]:
    """The encodings the profile trains on delayed copy.

    ``full`` trains every encoding of :func:`zoo_encodings`. ``quick`` and ``default`` (the web book) run
    chapter 7's RoPE, APE and NoPE (the runs chapter 7 made) and train the decisive control
    (:func:`control_encoding`): one transformer costs about as much as all the single heads together, so the
    other eight (among them RoPE's weights under PI and NTK, whose evaluation at 256 tokens alone costs as
    much as several single heads) wait for ``full``.
    """
    train_len = transformer_experiment(profile).train_len
    everything = zoo_encodings(train_len)
    if profile.name == "full":
        return everything
    core = (NoPE(), LearnedAPE(), control_encoding(train_len), RoPE())
    return tuple(pe for pe in everything if pe in core)


def run_copy_zoo(profile: Profile, encodings=None, device=None, cache=True) -> dict:
    """Chapter 7's delayed copy for the zoo's encodings: ``{Encoding: ZooRun}``.

    Each encoding is trained by :func:`~lengthgen_utils.runners.run_transformer` with
    ``transformer_experiment(profile, pe=...)``, chapter 7's configuration; a test-time scaling of RoPE is
    evaluated on the trained RoPE transformer (through the cache).

    Args:
        profile: the run profile.
        encodings: default :func:`copy_zoo_encodings` of the profile.
        device, cache: as for :func:`~lengthgen_utils.runners.run_transformer`.

    Returns:
        ``{pe: ZooRun}`` whose ``accuracy`` column ``i`` is token accuracy inside the training length
        (at the shortest evaluation length, the training length) for ``i = 0`` and beyond it for longer lengths.
    """
    base = transformer_experiment(profile)
    encodings = copy_zoo_encodings(profile) if encodings is None else tuple(get_encoding(e) for e in encodings)
    out = {}
    for pe in encodings:
        exp = replace(base, pe=trained_encoding(pe))
        result = run_transformer(exp, device=device, cache=cache)
        model, per_position = result.model, result.accuracy
        if pe != exp.pe:
            def measure(m):
                measured = [token_accuracy_by_position(m, exp.task, L, n_samples=exp.eval_samples)
                            for L in exp.eval_lengths]
                return {"accuracy": [a for a, _ in measured], "counts": [c for _, c in measured]}

            model, payload = _test_time(model, pe, exp, lambda e: build_transformer(replace(exp, pe=e)), measure,
                                        cache)
            per_position = dict(zip(exp.eval_lengths, payload["accuracy"]))
            counts = dict(zip(exp.eval_lengths, payload["counts"]))
        else:
            counts = result.counts
        columns = []
        for i, L in enumerate(exp.eval_lengths):
            inside, outside = split_accuracy(per_position[L], counts[L], exp.train_len)
            columns.append(inside if i == 0 else outside)
        initial = build_transformer(replace(exp, pe=pe)).to(model.device).eval()
        out[pe] = ZooRun(pe, exp, model, initial, list(exp.eval_lengths), torch.stack(columns, 1), exp.train_len,
                         per_position)
    return out


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
def shift_violation(run: ZooRun, shifts=SHIFTS, n_samples: int = 2, seed: int = 1) -> tuple[float, float]:
    """The shift test of chapter 2 on the random (initial) and the trained models of ``run``.

    The largest change of any logit when every position moves by each of ``shifts``, at the training
    length; for an encoding whose frequencies change with the length (PI, NTK) also at 4x the training
    length, where the scaling acts. Single heads: the query's score row
    (:func:`~lengthgen_utils.probes.shift_logit_difference`); transformers: the output logits on
    ``n_samples`` probe sequences (:func:`~lengthgen_utils.probes.shift_invariance`).

    Returns:
        ``(random, trained)``: the largest change over models, shifts and lengths (logit units).
    """
    shifts = check_int_sequence("shifts", shifts, minimum=1)
    lengths = [run.train_len] + ([SPAN * run.train_len] if isinstance(run.pe, RoPEInterpolation) else [])
    out = []
    for model in (run.initial, run.model):
        worst = 0.0
        for seq_len in lengths:
            if isinstance(model, Transformer):
                tokens, _ = run.experiment.task.sample(n_samples, seq_len, generator(seed),
                                                       device=model.device)
                worst = max(worst, max(shift_invariance(model, tokens, shifts).values()))
            else:
                worst = max(worst, float(shift_logit_difference(model, seq_len, shifts).max()))
        out.append(worst)
    return out[0], out[1]


@_package_threads
def placement(run: ZooRun, offset: int | None = None, seq_len: int | None = None,
              min_query: int | None = None) -> Tensor:
    """Where the trained models attend beyond the training length (see :data:`~lengthgen_utils.probes.PLACEMENTS`).

    Single heads: every evaluation length beyond the training length, one argmax per (seed, length)
    (:func:`~lengthgen_utils.probes.argmax_placement`; ``offset`` is the task's). Transformers: the copying
    head of each seed at every query beyond the training length of ``seq_len``-token probes (default the
    longest evaluation length; queries from ``min_query``, default the training length;
    :func:`~lengthgen_utils.probes.copy_head_placement`).

    Returns:
        float64 ``[n_seeds, 3]``: the share of cases at the offset, pinned, elsewhere.
    """
    if isinstance(run.model, Transformer):
        seq_len = max(run.lengths) if seq_len is None else seq_len
        return copy_head_placement(run.model, run.experiment.task, seq_len, run.train_len, run.visited,
                                   n_samples=4, min_query=min_query)[0]
    offset = run.experiment.offset if offset is None else offset
    codes = argmax_placement(run.model, [L for L in run.lengths if L > run.train_len], offset, run.visited)
    return torch.stack([(codes == c).double().mean(1) for c in range(len(PLACEMENTS))], -1)


def placement_label(fractions: Tensor) -> str:
    """A table cell for :func:`placement`: the mean shares at the offset / pinned / elsewhere, e.g.
    ``"0.00/0.97/0.03"``."""
    return "/".join(f"{float(x):.2f}" for x in fractions.mean(0))


@_package_threads
def offset_margins(run: ZooRun, seq_len: int | None = None) -> Tensor:
    """The query's logit at every key minus its logit at the target key ``L-1-k``: ``[n_seeds, L]``.

    Column ``j`` is offset ``D = j - (L-1)``. Negative everywhere but the target means the target wins the
    argmax; a key with a margin near 0 or above is an alias (chapter 4). Single heads only.
    """
    seq_len = max(run.lengths) if seq_len is None else check_int("seq_len", seq_len, minimum=2)
    with torch.no_grad():
        s = run.model.scores(seq_len).double().cpu()
    return s - s[:, seq_len - 1 - run.experiment.offset, None]


@_package_threads
def attention_at(run: ZooRun, seq_len: int | None = None) -> Tensor:
    """The trained query's attention weights over the keys at ``seq_len`` (default the longest length):
    ``[n_seeds, L]``."""
    seq_len = max(run.lengths) if seq_len is None else check_int("seq_len", seq_len, minimum=2)
    with torch.no_grad():
        return run.model.attention_row(seq_len).double().cpu()


@_package_threads
def argmax_positions(run: ZooRun, lengths) -> Tensor:
    """The key each trained single head attends to most at each length: LongTensor ``[n_seeds, len(lengths)]``
    (:func:`~lengthgen_utils.probes.attention_argmax`)."""
    return attention_argmax(run.model, lengths)


def offset_readers(run: ZooRun, seq_len: int, min_accuracy: float = 0.9) -> Tensor:
    """Which seeds of a trained single-head run read the key ``k`` back at length ``seq_len``: accuracy at
    least ``min_accuracy`` there *and* the attention argmax on the target ``L - 1 - k``. Bool ``[n_seeds]``.

    Raises:
        ValueError: ``seq_len`` is not one of the run's evaluation lengths.
    """
    if seq_len not in run.lengths:
        raise ValueError(f"seq_len must be one of the run's evaluation lengths {run.lengths}; got {seq_len!r}")
    offset = run.experiment.offset
    accurate = run.accuracy[:, run.lengths.index(seq_len)] >= min_accuracy
    return accurate & (argmax_positions(run, [seq_len])[:, 0] == seq_len - 1 - offset)


@_package_threads
def attention_shift_change(run: ZooRun, shifts, reference: int = 0) -> Tensor:
    """The largest total-variation change of a trained single head's attention row at the training length
    under the given global shifts, against the row at shift ``reference``: ``[n_seeds]``
    (:func:`~lengthgen_utils.probes.shift_attention_change`)."""
    return shift_attention_change(run.model, run.train_len, shifts, reference=reference).amax(-1)


@_package_threads
def control_shift_change(run: ZooRun, inside=(17, 24, 32, 40, 48),
                         outside=(64, 112, 176, 240)) -> tuple[Tensor, Tensor]:
    """How much a global shift changes a trained single head's attention at the training length: shifts that
    keep the sequence inside the positions training visited, and shifts that move it beyond.

    Each row is compared with the row at positions ``train_len .. 2*train_len - 1`` (well inside the visited
    range, whose first rows a random shift visits least), in total-variation distance
    (:func:`~lengthgen_utils.probes.shift_attention_change`): 0 = the same attention row, 1 = disjoint rows.
    Every shift is kept: a seed whose offset rule holds at most placements but not at one has one large
    value among small ones, and a summary over seeds *and* shifts (a median) is not decided by that one.

    Returns:
        ``(inside [n_seeds, len(inside)], outside [n_seeds, len(outside)])``.

    Raises:
        ValueError: a shift meant to stay inside does not, or one meant to leave does not leave.
    """
    inside, outside = check_int_sequence("inside", inside, 1), check_int_sequence("outside", outside, 1)
    seq_len, visited = run.train_len, run.visited
    if max(inside) + seq_len > visited or min(outside) + seq_len <= visited:
        raise ValueError(f"inside shifts must keep positions below {visited} and outside ones must pass it; "
                         f"got inside={inside}, outside={outside} at L={seq_len}")
    return (shift_attention_change(run.model, seq_len, inside, reference=seq_len),
            shift_attention_change(run.model, seq_len, outside, reference=seq_len))


# ---------------------------------------------------------------- the summary table
RETRIEVAL_MULTIPLES = (2, 4, 16)
COPY_MULTIPLES = (2, 4, 8)


def run_for(runs: dict, pe) -> ZooRun | None:
    """The run of the same encoding in ``runs`` (matched by label: the two tasks train at different lengths, so
    e.g. their randomised ranges differ), or None when the profile did not run it."""
    label = get_encoding(pe).label
    return next((r for r in runs.values() if r.pe.label == label), None)


def summary_rows(retrieval: dict, copy: dict, violations: dict | None = None,
                 placements: dict | None = None) -> list[dict]:
    """One row per encoding of ``retrieval``: what the chapter's table shows, computed from the runs.

    Args:
        retrieval, copy: ``{pe: ZooRun}`` from :func:`run_retrieval_zoo` and :func:`run_copy_zoo`.
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
            "retrieval": {m: run.mean_at(m) for m in RETRIEVAL_MULTIPLES},
            "copy": {m: (copy_run.mean_at(m) if copy_run is not None else None) for m in COPY_MULTIPLES},
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
