"""The position-encoding zoo (chapter 9): every encoding on the same tasks, with the same training.

This module runs the zoo's experiments through the results cache; chapter 9's probes of them (the shift
test, where the argmax lands, the decisive control) are in :mod:`lengthgen_utils.book.ch09`.

Every model is trained by the package's runners (:func:`~lengthgen_utils.run.runners.run_retrieval`,
:func:`~lengthgen_utils.run.runners.run_transformer`) with the recipe of chapter 1 or chapter 7: the runs of
RoPE, APE and NoPE are the very ones those chapters trained (the same configurations, so a build of the
book loads them from the cache). Two encodings are test-time changes of RoPE (position interpolation and
NTK-aware scaling): they coincide with RoPE at every training length, so their models are the trained RoPE
models, evaluated with the scaled encoding (:class:`TestTimeEncoding`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .._validate import Normalized, check_int
from ..core.encodings import (ALiBi, Encoding, LearnedAPE, NoPE, NoPEBOS, RandomizedPositions, RoPE,
                              RoPEInterpolation, RoPENTK, SinusoidalAPE, T5Bias, get_encoding)
from .cache import load_or_run
from .configs import RetrievalExperiment, TransformerExperiment, transformer_experiment
from .evaluation import accuracy_by_length, token_accuracy_by_position
from .parallel import parallel_map, parallel_workers
from .profiles import Profile
from .results import Ensemble, Runs
from .runners import build_model, build_transformer, run_retrieval, run_transformer, transformer_runs
from .training import default_cpu_threads

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
would: over ten seed sets of the ``quick`` profile it ranged from 0.46 to 1.0. So chapter 9 tests it against
its null, plain learned APE trained with as many seeds (none of which reads the key back), by a one-sided
Fisher test, not against a fixed share; with five APE seeds, 11 of 24 against none (seed base 61) is not
significant (p = 0.07)."""

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


@dataclass(frozen=True)
class TestTimeEncoding(Normalized):
    """The cache key of an evaluation of the weights ``trained`` produced, run with encoding ``pe`` at test time."""

    trained: RetrievalExperiment | TransformerExperiment
    pe: Encoding

    def __post_init__(self):
        object.__setattr__(self, "pe", get_encoding(self.pe))
        if not isinstance(self.trained, (RetrievalExperiment, TransformerExperiment)):
            raise TypeError(f"trained must be a RetrievalExperiment or TransformerExperiment; got "
                            f"{type(self.trained).__name__}")


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
    """Chapter 1's retrieval recipe for every encoding of the zoo: ``{Encoding: Runs}``.

    Each encoding is one batched ensemble of ``profile.n_seeds`` seeds trained by
    :func:`~lengthgen_utils.run.runners.run_retrieval` with ``RetrievalExperiment.from_profile(profile, pe=...,
    offset=offset)``, chapter 1's configuration, for at least :data:`MIN_STEPS` steps (the profile's steps
    when more); a test-time scaling of RoPE is evaluated on the trained RoPE ensemble (through the cache as a
    :class:`TestTimeEncoding`). The decisive control (:func:`control_encoding`) and its null, plain learned
    APE, train :data:`CONTROL_SEEDS` seeds each: the control's claim is a rate, tested against the null's.

    Args:
        profile: the run profile.
        offset: the task's offset k (chapter 1: 3).
        encodings: the encodings (default :func:`zoo_encodings` of the profile's training length).
        device, cache: as for :func:`~lengthgen_utils.run.runners.run_retrieval`.

    Returns:
        ``{pe: Runs}`` in the order of ``encodings``: each a :class:`~lengthgen_utils.run.results.Runs` whose
        ``config`` is what was trained (``pe.for_training()``), whose members carry the test-time ``pe`` and
        whose model runs it; ``initial_model()`` is the same ensemble untrained, running ``pe``.
    """
    offset = check_int("offset", offset, minimum=1)
    base = RetrievalExperiment.from_profile(profile, offset=offset, steps=max(profile.steps, MIN_STEPS))
    encodings = zoo_encodings(base.train_len) if encodings is None else tuple(get_encoding(e) for e in encodings)
    out = {}
    control = control_encoding(base.train_len)

    def trained(pe):
        exp = replace(base, pe=get_encoding(pe).for_training())
        if pe in (control, LearnedAPE()):  # the control and its null: as many seeds
            exp = replace(exp, n_seeds=max(exp.n_seeds, CONTROL_SEEDS))
        return exp, run_retrieval(exp, device=device, cache=cache)

    # the ensembles are independent: up to one per CPU core at once (run.parallel)
    for pe, (exp, result) in zip(encodings, parallel_map(trained, encodings, workers=parallel_workers(device))):
        if pe != exp.pe:
            model, payload = _test_time(
                result.model, pe, exp, lambda e: build_model(replace(exp, pe=e)),
                lambda m: {"accuracy": accuracy_by_length(m, exp.task, exp.eval_lengths, n_samples=exp.eval_samples)},
                cache)
            members = [{**m, "pe": pe} for m in result.members]
            result = Runs(exp, members, result.lengths, payload["accuracy"],
                          [Ensemble(model, list(range(exp.n_seeds)))], result.loss_history, cache=result.cache)
        exp_pe = replace(exp, pe=pe)
        result.ensembles = [Ensemble(result.model, list(range(exp.n_seeds)), lambda exp_pe=exp_pe: build_model(exp_pe))]
        out[pe] = result
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
    """Chapter 7's delayed copy for the zoo's encodings: ``{Encoding: Runs}``.

    Each encoding is trained by :func:`~lengthgen_utils.run.runners.run_transformer` with
    ``transformer_experiment(profile, pe=...)``, chapter 7's configuration; a test-time scaling of RoPE is
    evaluated on the trained RoPE transformer (through the cache).

    Args:
        profile: the run profile.
        encodings: default :func:`copy_zoo_encodings` of the profile.
        device, cache: as for :func:`~lengthgen_utils.run.runners.run_transformer`.

    Returns:
        ``{pe: Runs}`` as :func:`~lengthgen_utils.run.runners.run_transformer` returns them (its ``accuracy``
        column ``i`` is token accuracy inside the training length for ``i = 0``, beyond it for longer lengths),
        each running the test-time ``pe``, whose ``initial_model()`` is the untrained ensemble running it.
    """
    base = transformer_experiment(profile)
    encodings = copy_zoo_encodings(profile) if encodings is None else tuple(get_encoding(e) for e in encodings)
    out = {}
    for pe in encodings:
        exp = replace(base, pe=get_encoding(pe).for_training())
        result = run_transformer(exp, device=device, cache=cache)
        model, per_position, counts = result.model, [result.per_position[L] for L in exp.eval_lengths], None
        if pe != exp.pe:
            def measure(m):
                measured = [token_accuracy_by_position(m, exp.task, L, n_samples=exp.eval_samples)
                            for L in exp.eval_lengths]
                return {"accuracy": [a for a, _ in measured], "counts": [c for _, c in measured]}

            model, payload = _test_time(model, pe, exp, lambda e: build_transformer(replace(exp, pe=e)), measure,
                                        cache)
            per_position, counts = payload["accuracy"], payload["counts"]
        else:
            counts = [result.counts[L] for L in exp.eval_lengths]
        exp_pe = replace(exp, pe=pe)
        runs = transformer_runs(exp, model, result.loss_history, per_position, counts,
                                lambda exp_pe=exp_pe: build_transformer(exp_pe), result.cache)
        runs.members = [{**m, "pe": pe} for m in runs.members]
        out[pe] = runs
    return out
