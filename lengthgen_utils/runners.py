"""Runners: build, train and evaluate one experiment, through the results cache.

A chapter calls one runner per experiment, so its cells stay a few lines long and every
chapter uses the same settings for the same profile. Each runner goes through
:func:`~lengthgen_utils.cache.load_or_run`: a rebuild of the book loads what an earlier
build computed instead of training again, and a loaded result is the stored one exactly.

Data flows one way: configuration -> model -> training -> evaluation -> result.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ._validate import check_device, check_int, check_positive_float
from .cache import load_or_run
from .configs import (KernelHeadConfig, RecurrentExperiment, RetrievalExperiment, RetrievalSweep, SnapshotSweep,
                      TransformerExperiment, transformer_experiment)
from .evaluation import (accuracy_by_length, split_accuracy, squared_error_by_length, token_accuracy_by_position)
from .models import KernelHead, LinearRNN, RetrievalHead, Transformer
from .positional import get_encoding, kernel_frequencies, rope_kernel_features
from .profiles import Profile
from .theory import (expected_squared_error, gradient_descent_kernel, log_length_scale, min_norm_interpolant,
                     squared_loss_quadratic, trained_relative_positions)
from .training import default_cpu_threads, train, train_sequence, train_squared_loss


def _device(device) -> torch.device:
    """The device a runner trains on, checked before any work (:func:`~lengthgen_utils._validate.check_device`)."""
    return check_device(device)


# ---------------------------------------------------------------- one single-head ensemble
@dataclass
class RetrievalResult:
    """What :func:`run_retrieval` returns: the trained ensemble and its measurements."""

    experiment: RetrievalExperiment
    model: RetrievalHead
    loss_history: torch.Tensor  # [steps, n_seeds]
    lengths: list[int]
    accuracy: torch.Tensor  # [n_seeds, len(lengths)]
    extra: dict = field(default_factory=dict)


def _retrieval_head(settings, n_models: int, seeds, pe, attention: str) -> RetrievalHead:
    return RetrievalHead(settings.vocab_size, settings.d_model, settings.d_head, pe, attention,
                         max_len=settings.table_len, n_models=n_models, seeds=seeds)


def build_model(exp: RetrievalExperiment) -> RetrievalHead:
    """The untrained ensemble of ``exp`` (seeds ``0 .. n_seeds-1``): what :func:`run_retrieval` starts from.

    The encoding covers ``exp.max_len`` positions when set, else the longest evaluation length.
    """
    return _retrieval_head(exp, exp.n_seeds, None, exp.pe, exp.attention)


def _model_payload(model, history, lengths, accuracy) -> dict:
    return {"state_dict": dict(model.state_dict()), "loss_history": history, "lengths": list(lengths),
            "accuracy": accuracy}


def run_retrieval(exp: RetrievalExperiment, device=None, cache=True) -> RetrievalResult:
    """Build, train and evaluate the ensemble described by ``exp`` (or load it from the results cache).

    Seeds ``0 .. n_seeds-1`` initialise the models; ``exp.data_seed`` seeds the training stream.

    Args:
        exp: the experiment.
        device: where to train (default :func:`~lengthgen_utils.training.default_device`).
        cache: ``True`` (default folder), ``False`` (train, store nothing) or a cache folder;
            see :func:`~lengthgen_utils.cache.load_or_run`. ``result.extra["cache"]`` says what happened.

    Returns:
        a :class:`RetrievalResult` whose model lives on ``device``.
    """
    model, payload, status = _train_query_readout(exp, build_model, exp.task, exp.min_train_len, device, cache)
    return RetrievalResult(exp, model, payload["loss_history"], list(payload["lengths"]), payload["accuracy"],
                           extra={"cache": status})


def _train_query_readout(exp, build, task, min_train_len: int, device, cache):
    """Train ``build(exp)`` with :func:`~lengthgen_utils.training.train` and evaluate it at ``exp.eval_lengths``
    (or load both from the results cache): the recipe every query-readout ensemble shares.

    Returns:
        ``(model on device in eval mode, payload, cache status)``.
    """
    device = _device(device)
    lengths = exp.eval_lengths

    def compute():
        model = build(exp)
        history = train(model, task, steps=exp.steps, batch_size=exp.batch_size, lr=exp.lr,
                        train_len=exp.train_len, fixed_length=exp.fixed_length, weight_decay=exp.weight_decay,
                        seed=exp.data_seed, device=device, min_train_len=min_train_len)
        acc = accuracy_by_length(model, task, lengths, n_samples=exp.eval_samples)
        return _model_payload(model, history, lengths, acc)

    payload, status = load_or_run(exp, compute, cache=cache, device=device,
                                  threads=default_cpu_threads("single-head"))
    model = build(exp)
    model.load_state_dict(payload["state_dict"])
    return model.to(device).eval(), payload, status


# ---------------------------------------------------------------- sweeps: seeds x offsets x encodings x attention
@dataclass
class SweepResult:
    """What :func:`run_sweep` returns. Keys are ``(pe, attention)`` with ``pe`` an Encoding; models are offset-major.

    Attributes:
        sweep: the sweep.
        lengths: evaluation lengths (tokens).
        accuracy: ``(pe, attention) -> [n_offsets, n_seeds, n_lengths]`` float64 accuracies.
        loss_history: ``(pe, attention) -> [steps, n_offsets, n_seeds]`` training losses (nats).
        models: ``(pe, attention) ->`` the trained :class:`RetrievalHead` of ``n_offsets * n_seeds`` models.
        cache: ``(pe, attention) ->`` cache status (see :func:`~lengthgen_utils.cache.load_or_run`).
        seconds: ``(pe, attention) ->`` wall time of training or loading (s).
    """

    sweep: RetrievalSweep
    lengths: list[int]
    accuracy: dict
    loss_history: dict
    models: dict
    cache: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)

    def result(self, pe, offset: int, attention: str = "softmax") -> RetrievalResult:
        """The seeds of one ``(pe, offset, attention)`` as a :class:`RetrievalResult` (its own model copy)."""
        pe = get_encoding(pe)
        exp = self.sweep.experiment(pe, offset, attention)
        row = self.sweep.offsets.index(offset)
        n = self.sweep.n_seeds
        model = self.models[(pe, attention)].subset(range(row * n, (row + 1) * n))
        return RetrievalResult(exp, model, self.loss_history[(pe, attention)][:, row].clone(), list(self.lengths),
                               self.accuracy[(pe, attention)][row].clone(),
                               extra={"cache": self.cache.get((pe, attention)), "sweep": self.sweep})

    def summary_rows(self) -> list[dict]:
        """One row per ``(pe, attention, offset)``: mean, min and max accuracy over seeds at each length."""
        rows = []
        for (pe, attention), acc in self.accuracy.items():
            for row, offset in enumerate(self.sweep.offsets):
                a = acc[row]  # [n_seeds, n_lengths]
                rows.append({"pe": pe, "attention": attention, "offset": offset,
                             "mean": a.mean(0).tolist(), "min": a.min(0).values.tolist(),
                             "max": a.max(0).values.tolist()})
        return rows


def run_sweep(sweep: RetrievalSweep, device=None, cache=True, progress: bool = False,
              on_ensemble: Callable | None = None) -> SweepResult:
    """Train and evaluate every ensemble of ``sweep`` (one batched ensemble per (encoding, attention)), through the cache.

    Args:
        sweep: the sweep.
        device: where to train (default :func:`~lengthgen_utils.training.default_device`).
        cache: see :func:`~lengthgen_utils.cache.load_or_run`; each ensemble is its own entry.
        progress: show a progress bar per ensemble's training.
        on_ensemble: called as ``on_ensemble(pe, attention, status, seconds)`` after each ensemble.

    Returns:
        a :class:`SweepResult`.
    """
    device = _device(device)
    lengths = sweep.eval_lengths
    tasks, seeds = sweep.tasks, sweep.seeds
    shape = (len(sweep.offsets), sweep.n_seeds)
    out = SweepResult(sweep, lengths, {}, {}, {})
    for pe in sweep.pes:
        for attention in sweep.attentions:
            start = time.perf_counter()

            def compute():
                model = _retrieval_head(sweep, sweep.n_models, seeds, pe, attention)
                history = train(model, tasks, steps=sweep.steps, batch_size=sweep.batch_size, lr=sweep.lr,
                                train_len=sweep.train_len, fixed_length=sweep.fixed_length,
                                weight_decay=sweep.weight_decay, seed=sweep.data_seed, device=device,
                                min_train_len=sweep.shortest_train_len, progress=progress)
                acc = accuracy_by_length(model, tasks, lengths, n_samples=sweep.eval_samples)
                return _model_payload(model, history, lengths, acc)

            payload, status = load_or_run(sweep.ensemble(pe, attention), compute, cache=cache, device=device,
                                          threads=default_cpu_threads("single-head"))
            model = _retrieval_head(sweep, sweep.n_models, seeds, pe, attention)
            model.load_state_dict(payload["state_dict"])
            key = (pe, attention)
            out.models[key] = model.to(device).eval()
            out.accuracy[key] = payload["accuracy"].view(*shape, len(lengths))
            out.loss_history[key] = payload["loss_history"].view(-1, *shape)
            out.cache[key] = status
            out.seconds[key] = time.perf_counter() - start
            if on_ensemble is not None:
                on_ensemble(pe, attention, status, out.seconds[key])
    return out


@dataclass
class OffsetSweepResult:
    """What :func:`run_offset_sweep` returns: one ensemble holding every (offset, seed) pair.

    Model ``i`` was trained on offset ``offsets[i]`` from seed ``seeds[i]``;
    ``accuracy`` is ``[n_models, len(lengths)]``.
    """

    experiment: RetrievalExperiment
    model: RetrievalHead
    offsets: list[int]
    seeds: list[int]
    loss_history: torch.Tensor
    lengths: list[int]
    accuracy: torch.Tensor

    def rows(self, offset: int) -> list[int]:
        """Indices of the models trained on ``offset``."""
        rows = [i for i, k in enumerate(self.offsets) if k == offset]
        if not rows:
            raise ValueError(f"offset must be one of {sorted(set(self.offsets))}; got {offset!r}")
        return rows


def run_offset_sweep(exp: RetrievalExperiment, offsets=(1, 2, 3, 5), device=None, cache=True) -> OffsetSweepResult:
    """Train ``exp.n_seeds`` seeds for each offset in one ensemble and evaluate at ``exp.eval_lengths``.

    The one-ensemble :class:`~lengthgen_utils.configs.RetrievalSweep` of ``exp``
    (:meth:`~lengthgen_utils.configs.RetrievalSweep.of_experiment`) run by :func:`run_sweep`, flattened
    to one model per row: ``exp.offset`` is ignored (each model gets its own offset from ``offsets``);
    every other field of ``exp`` applies.

    Raises:
        ValueError / TypeError: ``offsets`` empty, repeated, not ints, or too large for
            ``exp.train_len`` (or ``exp.min_train_len``).
    """
    sweep = RetrievalSweep.of_experiment(exp, offsets)
    result = run_sweep(sweep, device=device, cache=cache)
    key = (exp.pe, exp.attention)
    history = result.loss_history[key]
    return OffsetSweepResult(exp, result.models[key], [t.offset for t in sweep.tasks], sweep.seeds,
                             history.reshape(history.shape[0], -1), list(result.lengths),
                             result.accuracy[key].reshape(sweep.n_models, -1))


# ---------------------------------------------------------------- untrained heads (the nulls of chapter 4)
def untrained_heads(exp: RetrievalExperiment, n_heads: int, first_seed: int = 1_000_000) -> RetrievalHead:
    """``n_heads`` untrained heads of ``exp``'s architecture, initialised exactly as training starts them.

    Seeds ``first_seed .. first_seed + n_heads - 1``, disjoint from the seeds ``0 .. n_seeds-1`` that the
    book trains, so no null head is the initial state of a trained one. The null of chapter 4: what
    the package's initialisation already gives, before any training.

    Raises:
        ValueError / TypeError: ``n_heads < 1`` or ``first_seed`` not an int >= ``exp.n_seeds``.
    """
    n_heads = check_int("n_heads", n_heads, minimum=1)
    first_seed = check_int("first_seed", first_seed, minimum=exp.n_seeds)
    return _retrieval_head(exp, n_heads, range(first_seed, first_seed + n_heads), exp.pe, exp.attention)


# ---------------------------------------------------------------- one training, several snapshots (chapter 5)
class _LogLengthTrainingHead(RetrievalHead):
    """A retrieval head whose logits at length ``L`` are multiplied by ``log L / log train_len`` in every forward
    pass: a log-length temperature used in training (its weights load into a plain :class:`RetrievalHead`)."""

    def __init__(self, *args, train_len: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.train_len = train_len

    def forward(self, tokens, position_shift=0, validate=True, logit_scale=1.0, positions=None):
        scale = logit_scale * math.log(tokens.shape[-1]) / math.log(self.train_len)
        return super().forward(tokens, position_shift, validate, scale, positions)


@dataclass
class SnapshotResult:
    """What :func:`run_snapshots` returns.

    Attributes:
        config: the :class:`~lengthgen_utils.configs.SnapshotSweep`.
        models: ``step ->`` the ensemble's weights after that step (a :class:`RetrievalHead`, offset-major models).
        accuracy: ``step ->`` ``[n_models, len(lengths)]`` accuracy at ``config.lengths`` (with the
            log-length scale when ``config.length_temperature``).
        loss_history: ``[steps, n_models]`` training losses (nats).
        offsets: one offset per model; seeds: one initialisation seed per model.
    """

    config: SnapshotSweep
    models: dict
    accuracy: dict
    loss_history: torch.Tensor
    offsets: list
    seeds: list
    extra: dict = field(default_factory=dict)

    @property
    def lengths(self) -> list[int]:
        return list(self.config.lengths)


def run_snapshots(config: SnapshotSweep, device=None, cache=True) -> SnapshotResult:
    """Train the one ensemble of ``config.sweep`` once, keeping its weights at ``config.snapshot_steps``.

    Each snapshot equals the same ensemble trained for that many steps alone (the training stream does
    not depend on the run's length). Every snapshot is evaluated at ``config.lengths``. Results go
    through the results cache.

    Returns:
        a :class:`SnapshotResult`.
    """
    device = _device(device)
    sweep = config.sweep
    pe, attention = sweep.pes[0], sweep.attentions[0]
    tasks, seeds = sweep.tasks, sweep.seeds
    lengths = list(config.lengths)
    scale = log_length_scale(lengths, sweep.train_len) if config.length_temperature else None

    def build(training: bool = False) -> RetrievalHead:
        if training and config.length_temperature:
            return _LogLengthTrainingHead(sweep.vocab_size, sweep.d_model, sweep.d_head, pe, attention,
                                          max_len=sweep.table_len, n_models=sweep.n_models, seeds=seeds,
                                          train_len=sweep.train_len)
        return _retrieval_head(sweep, sweep.n_models, seeds, pe, attention)

    def compute():
        model = build(training=True)
        kept = {}

        def keep(step, _loss):
            if step in config.snapshot_steps:
                kept[step] = {name: t.detach().clone() for name, t in model.state_dict().items()}

        history = train(model, tasks, steps=sweep.steps, batch_size=sweep.batch_size, lr=sweep.lr,
                        train_len=sweep.train_len, fixed_length=sweep.fixed_length, weight_decay=sweep.weight_decay,
                        seed=sweep.data_seed, device=device, min_train_len=sweep.shortest_train_len, callback=keep)
        accuracy = []
        for step in config.snapshot_steps:
            plain = build().to(device)
            plain.load_state_dict(kept[step])
            accuracy.append(accuracy_by_length(plain, tasks, lengths, n_samples=config.eval_samples,
                                               logit_scale=scale))
        return {"states": [kept[s] for s in config.snapshot_steps], "loss_history": history, "accuracy": accuracy}

    payload, status = load_or_run(config, compute, cache=cache, device=device,
                                  threads=default_cpu_threads("single-head"))
    models = {}
    for step, state in zip(config.snapshot_steps, payload["states"]):
        models[step] = build()
        models[step].load_state_dict(state)
        models[step].to(device).eval()
    return SnapshotResult(config, models, dict(zip(config.snapshot_steps, payload["accuracy"])),
                          payload["loss_history"], [t.offset for t in tasks], list(seeds), extra={"cache": status})


# ---------------------------------------------------------------- the direct kernel head (chapter 6)
@dataclass
class KernelResult:
    """Direct-kernel ensemble (one model per data seed, each started at ``c = 0``) and its theory."""

    name: str
    frequencies: torch.Tensor  # [d_head // 2] rad/token
    lr: float
    steps: int
    c: torch.Tensor  # [n_seeds, d_head] trained kernels
    c_gd: torch.Tensor  # [d_head] closed-form gradient descent on the expected loss after `steps` steps
    c_star: torch.Tensor  # [d_head] exact min-norm interpolant pinv(Phi_T) e_k
    loss_history: torch.Tensor  # [steps, n_seeds]
    lengths: list[int]
    accuracy: torch.Tensor  # [n_seeds, len(lengths)]
    squared_error: torch.Tensor  # [n_seeds, len(lengths)] measured
    predicted_squared_error: torch.Tensor  # [len(lengths)] from c_gd, exact expectation
    hessian_eigenvalues: torch.Tensor  # [d_head]
    min_norm_accuracy: torch.Tensor  # [len(lengths)] accuracy of c* itself (float64), on the same sequences


def run_kernel_head(exp: RetrievalExperiment, name: str = "rope", frequencies=None,
                    lr_fraction: float = 0.5, steps: int | None = None, device=None, cache=True) -> KernelResult:
    """Train the directly parameterised kernel head with SGD on the squared loss, and its closed forms.

    One model per data seed ``exp.data_seed + i`` (``i < exp.n_seeds``), each from ``c = 0``
    (with ``c = 0`` every model of one data stream is the same, so seeds vary the data). The
    models train as one batched ensemble, model ``i`` on its own stream
    (:func:`~lengthgen_utils.training.train_squared_loss` with one seed per model), through the
    results cache. The step size is ``lr_fraction / lambda_max(H)`` (stable for ``lr_fraction < 1``).

    Args:
        exp: the experiment (its offset, lengths, vocabulary, ``d_head``, batch size, seeds, steps).
        name: a label for the frequency set (figures and tables).
        frequencies: ``theta [d_head // 2]`` in rad/token, or ``None`` for RoPE's.
        lr_fraction: the step size as a fraction of ``1 / lambda_max`` of the expected-loss Hessian.
        steps: SGD steps (default ``exp.steps``).
        device: where to train (default :func:`~lengthgen_utils.training.default_device`).

    Returns:
        a :class:`KernelResult`; its ``min_norm_accuracy`` is the accuracy of ``c*`` itself, evaluated
        in float64 on the same sequences as the trained models.

    Raises:
        ValueError: ``exp.fixed_length`` or ``exp.min_train_len`` is set (the closed forms assume
            lengths uniform in ``[offset + 2, train_len]``); a bad ``steps`` or ``lr_fraction``.
    """
    if exp.fixed_length or exp.min_train_len is not None:
        raise ValueError("run_kernel_head trains on lengths U{offset + 2 .. train_len} (the closed forms assume them); "
                         f"got fixed_length={exp.fixed_length!r}, min_train_len={exp.min_train_len!r}")
    steps = exp.steps if steps is None else check_int("steps", steps, minimum=1)
    lr_fraction = check_positive_float("lr_fraction", lr_fraction)
    device = _device(device)
    theta = kernel_frequencies(exp.d_head, 10000.0, frequencies)
    h, b, _ = squared_loss_quadratic(exp.train_len, exp.offset, exp.vocab_size, exp.d_head, frequencies=theta)
    eig = torch.linalg.eigvalsh(h)
    lr = lr_fraction / float(eig.max())
    lengths = exp.eval_lengths

    def compute():
        model = KernelHead(exp.vocab_size, exp.d_head, frequencies=theta, n_models=exp.n_seeds)
        history = train_squared_loss(model, exp.task, steps=steps, batch_size=exp.batch_size, lr=lr,
                                     train_len=exp.train_len, device=device,
                                     seed=[exp.data_seed + i for i in range(exp.n_seeds)])
        model.cpu()
        return {"c": model.c.detach().double(), "loss_history": history,
                "accuracy": accuracy_by_length(model, exp.task, lengths, n_samples=exp.eval_samples),
                "squared_error": squared_error_by_length(model, exp.task, lengths, n_samples=exp.eval_samples)}

    config = KernelHeadConfig(exp, None if frequencies is None else tuple(theta.tolist()), lr_fraction, steps)
    payload, _ = load_or_run(config, compute, cache=cache, device=device, threads=default_cpu_threads("single-head"))
    c_gd = gradient_descent_kernel(h, b, lr, steps)
    c_star = min_norm_interpolant(trained_relative_positions(exp.train_len, exp.offset), exp.offset, exp.d_head,
                                  frequencies=theta)
    predicted = torch.stack([
        expected_squared_error(c_gd @ rope_kernel_features(torch.arange(L) - (L - 1), exp.d_head, frequencies=theta).T,
                               exp.offset, exp.vocab_size)
        for L in lengths])
    min_norm = KernelHead(exp.vocab_size, exp.d_head, frequencies=theta).double()  # float64: c* may be huge
    with torch.no_grad():
        min_norm.c.copy_(c_star[None])
    min_norm_accuracy = accuracy_by_length(min_norm, exp.task, lengths, n_samples=exp.eval_samples)[0]
    return KernelResult(name, theta, lr, steps, payload["c"], c_gd, c_star, payload["loss_history"], lengths,
                        payload["accuracy"], payload["squared_error"], predicted, eig, min_norm_accuracy)


# ---------------------------------------------------------------- a linear recurrent model (chapter 8)
@dataclass
class RecurrentResult:
    """What :func:`run_recurrent` returns: model ``i`` was trained on ``experiment.tasks[i]``."""

    experiment: RecurrentExperiment
    model: LinearRNN
    loss_history: torch.Tensor  # [steps, n_models]
    lengths: list[int]
    accuracy: torch.Tensor  # [n_models, len(lengths)]

    def rows(self, offset: int) -> list[int]:
        """Indices of the models trained on ``offset``."""
        if offset not in self.experiment.offsets:
            raise ValueError(f"offset must be one of {self.experiment.offsets}; got {offset!r}")
        i, n = self.experiment.offsets.index(offset), self.experiment.n_seeds
        return list(range(i * n, (i + 1) * n))


def _linear_rnn(exp: RecurrentExperiment) -> LinearRNN:
    return LinearRNN(exp.vocab_size, exp.d_state, exp.init_scale, n_models=exp.n_models, seeds=exp.seeds)


def run_recurrent(exp: RecurrentExperiment, device=None, cache=True) -> RecurrentResult:
    """Train and evaluate the linear recurrent ensemble of ``exp`` (or load it from the results cache).

    The models train with :func:`~lengthgen_utils.training.train` (Adam, cross-entropy at the query:
    the single head's recipe) and are evaluated at ``exp.eval_lengths`` with
    :func:`~lengthgen_utils.evaluation.accuracy_by_length`.

    Returns:
        a :class:`RecurrentResult` whose model lives on ``device``.
    """
    model, payload, _ = _train_query_readout(exp, _linear_rnn, exp.tasks, exp.shortest_train_len, device, cache)
    return RecurrentResult(exp, model, payload["loss_history"], list(payload["lengths"]), payload["accuracy"])


# ---------------------------------------------------------------- the multi-layer transformer (chapters 7-9)
@dataclass
class TransformerResult:
    """What :func:`run_transformer` returns."""

    experiment: TransformerExperiment
    model: Transformer
    loss_history: torch.Tensor  # [steps, n_seeds]
    accuracy: dict  # {eval length: [n_seeds, L] per-position token accuracy}
    counts: dict  # {eval length: [L] scored tokens per position}
    inside: torch.Tensor  # [n_seeds] token accuracy at positions < train_len (at the shortest eval length)
    outside: dict  # {eval length: [n_seeds] token accuracy at positions >= train_len}


def build_transformer(exp: TransformerExperiment) -> Transformer:
    """The untrained ensemble of ``exp`` (seeds ``0 .. n_seeds-1``): what :func:`run_transformer` starts from."""
    return Transformer(exp.task.n_tokens, exp.n_layers, exp.n_heads, exp.d_model, exp.pe, max_len=exp.max_len,
                       n_models=exp.n_seeds)


def run_transformer(exp: TransformerExperiment, device=None, cache=True) -> TransformerResult:
    """Train the ensemble of ``exp`` and measure per-position token accuracy at each evaluation length.

    Results go through the results cache (``cache`` as in :func:`~lengthgen_utils.cache.load_or_run`):
    a rebuild of the book loads the trained weights and measurements instead of retraining.
    """
    device = _device(device)

    def compute():
        model = build_transformer(exp)
        history = train_sequence(model, exp.task, steps=exp.steps, batch_size=exp.batch_size, lr=exp.lr,
                                 weight_decay=exp.weight_decay, train_len=exp.train_len, seed=exp.data_seed,
                                 device=device)
        measured = [token_accuracy_by_position(model, exp.task, L, n_samples=exp.eval_samples)
                    for L in exp.eval_lengths]
        return {"state_dict": dict(model.state_dict()), "loss_history": history,
                "accuracy": [acc for acc, _ in measured], "counts": [cnt for _, cnt in measured]}

    payload, _ = load_or_run(exp, compute, cache=cache, device=device, threads=default_cpu_threads("transformer"))
    model = build_transformer(exp)
    model.load_state_dict(payload["state_dict"])
    model.to(device).eval()
    accuracy = dict(zip(exp.eval_lengths, payload["accuracy"]))
    counts = dict(zip(exp.eval_lengths, payload["counts"]))
    split = {L: split_accuracy(accuracy[L], counts[L], exp.train_len) for L in exp.eval_lengths}
    # inside the training length, measured on the shortest evaluation sequences (the training length
    # itself in every experiment of the book): a longer sequence may score no position < train_len (copy)
    inside = split[min(exp.eval_lengths)][0]
    return TransformerResult(exp, model, payload["loss_history"], accuracy, counts, inside,
                             {L: out for L, (_, out) in split.items()})


# ---------------------------------------------------------------- suites run by ``python -m lengthgen_utils run``
SUITE_ENCODINGS = ("rope", "ape", "nope")


def run_single_head_suite(profile: Profile, n_seeds: int | None = None, device=None, cache=True,
                          progress: bool = True, on_ensemble: Callable | None = None) -> SweepResult:
    """The profile's single-head sweep: seeds x offsets x {RoPE, APE, NoPE} x attention types."""
    overrides = {} if n_seeds is None else {"n_seeds": check_int("n_seeds", n_seeds, minimum=1)}
    sweep = RetrievalSweep.from_profile(profile, pes=SUITE_ENCODINGS, **overrides)
    return run_sweep(sweep, device=device, cache=cache, progress=progress, on_ensemble=on_ensemble)


def run_transformer_suite(profile: Profile, n_seeds: int | None = None, device=None, cache=True,
                          progress: bool = True, on_ensemble: Callable | None = None) -> dict:
    """Chapter 7's transformer on delayed copy, one ensemble per encoding (RoPE, APE, NoPE).

    Seeds default to the profile's transformer setting. ``on_ensemble(pe, attention, status, seconds)`` is
    called after each ensemble, as for the single-head suite. Returns ``{Encoding: TransformerResult}``.
    """
    overrides = {} if n_seeds is None else {"n_seeds": check_int("n_seeds", n_seeds, minimum=1)}
    results = {}
    for name in SUITE_ENCODINGS:
        pe = get_encoding(name)
        start = time.perf_counter()
        results[pe] = run_transformer(transformer_experiment(profile, pe=pe, **overrides), device=device, cache=cache)
        if on_ensemble is not None:
            on_ensemble(pe, "softmax", "done", time.perf_counter() - start)
    return results


SUITES: dict[str, Callable] = {"single-head": run_single_head_suite, "transformer": run_transformer_suite}
