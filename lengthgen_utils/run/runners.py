"""Runners: build, train and evaluate one experiment, through the results cache.

A chapter calls one runner per experiment, so its cells stay a few lines long and every
chapter uses the same settings for the same profile. Each runner goes through
:func:`~lengthgen_utils.run.cache.load_or_run`: a rebuild of the book loads what an earlier
build computed instead of training again, and a loaded result is the stored one exactly.

Data flows one way: configuration -> model -> training -> evaluation -> result.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import Tensor

from .._validate import check_device, check_int, check_positive_float
from ..analysis.theory import (expected_squared_error, gradient_descent_kernel, log_length_scale,
                               min_norm_interpolant, squared_loss_quadratic, trained_relative_positions)
from ..core.encodings import get_encoding
from ..core.fast import FastTransformer
from ..core.models import ContentRetrievalHead, KernelHead, LinearRNN, RetrievalHead, SingleHead
from ..core.rope import kernel_frequencies, rope_kernel_features
from ..core.tasks import as_task_list
from .cache import load_or_run, load_or_run_many
from .configs import (KernelHeadConfig, RecurrentExperiment, RegimeMap, RetrievalExperiment, RetrievalSweep, SnapshotSweep,
                      TransformerExperiment, transformer_experiment)
from .evaluation import accuracy_by_length, split_accuracy, squared_error_by_length, token_accuracy_by_position
from .parallel import parallel_map, parallel_workers
from .optim import OptimizerSettings
from .profiles import Profile
from .results import Ensemble, Runs
from .training import default_cpu_threads, train, train_sequence, train_squared_loss


def _device(device) -> torch.device:
    """The device a runner trains on, checked before any work (:func:`~lengthgen_utils._validate.check_device`)."""
    return check_device(device)


# ---------------------------------------------------------------- single-head ensembles
def _retrieval_head(settings, n_models: int, seeds, pe, attention: str) -> RetrievalHead:
    return RetrievalHead(settings.vocab_size, settings.d_model, settings.d_head, pe, attention,
                         max_len=settings.table_len, n_models=n_models, seeds=seeds, init_scale=settings.init_scale)


def build_model(exp: RetrievalExperiment) -> RetrievalHead:
    """The untrained ensemble of ``exp`` (seeds ``0 .. n_seeds-1``): what :func:`run_retrieval` starts from.

    The encoding covers ``exp.max_len`` positions when set, else the longest evaluation length.
    """
    return _retrieval_head(exp, exp.n_seeds, None, exp.pe, exp.attention)


def _model_payload(model, history, lengths, accuracy) -> dict:
    return {"state_dict": dict(model.state_dict()), "loss_history": history, "lengths": list(lengths),
            "accuracy": accuracy}


def _members(pe, attention: str, tasks, seeds) -> list[dict]:
    """The labels of an ensemble's models: one dict per model, in the model's order."""
    return [{"pe": pe, "attention": attention, "offset": getattr(task, "offset", None), "seed": int(seed),
             "task": task} for task, seed in zip(tasks, seeds)]


def run_retrieval(exp: RetrievalExperiment, device=None, cache=True) -> Runs:
    """Build, train and evaluate the ensemble described by ``exp`` (or load it from the results cache).

    Seeds ``0 .. n_seeds-1`` initialise the models; ``exp.data_seed`` seeds the training stream.

    Args:
        exp: the experiment.
        device: where to train (default :func:`~lengthgen_utils.run.training.default_device`).
        cache: ``True`` (default folder), ``False`` (train, store nothing) or a cache folder;
            see :func:`~lengthgen_utils.run.cache.load_or_run`.

    Returns:
        a :class:`~lengthgen_utils.run.results.Runs` of ``n_seeds`` members (labels ``pe``, ``attention``,
        ``offset``, ``seed``, ``task``) whose model lives on ``device``.
    """
    model, payload, status = _train_query_readout(exp, build_model, exp.task, exp.min_train_len, device, cache,
                                                  train_set=exp.train_set)
    members = _members(exp.pe, exp.attention, [exp.task] * exp.n_seeds, range(exp.n_seeds))
    return Runs(exp, members, list(payload["lengths"]), payload["accuracy"],
                [Ensemble(model, list(range(exp.n_seeds)), lambda: build_model(exp))], payload["loss_history"],
                cache={(exp.pe, exp.attention): status})


def _train_query_readout(exp, build, task, min_train_len: int, device, cache, evaluate=accuracy_by_length,
                         train_set: int | None = None):
    """Train ``build(exp)`` with :func:`~lengthgen_utils.run.training.train` and evaluate it at ``exp.eval_lengths``
    with ``evaluate`` (or load both from the results cache): the recipe every query-readout ensemble shares.

    Returns:
        ``(model on device in eval mode, payload, cache status)``.
    """
    device = _device(device)
    lengths = exp.eval_lengths

    def compute():
        model = build(exp)
        history = train(model, task, exp.optimizer_settings, steps=exp.steps, batch_size=exp.batch_size,
                        train_len=exp.train_len, fixed_length=exp.fixed_length, seed=exp.data_seed, device=device,
                        min_train_len=min_train_len, train_set=train_set)
        acc = evaluate(model, task, lengths, n_samples=exp.eval_samples)
        return _model_payload(model, history, lengths, acc)

    payload, status = load_or_run(exp, compute, cache=cache, device=device,
                                  threads=default_cpu_threads("single-head"))
    model = build(exp)
    model.load_state_dict(payload["state_dict"])
    return model.to(device).eval(), payload, status


def run_sweep(sweep: RetrievalSweep, device=None, cache=True, progress: bool = False,
              on_ensemble: Callable | None = None) -> Runs:
    """Train and evaluate every ensemble of ``sweep`` (one batched ensemble per (encoding, attention)), through the cache.

    Args:
        sweep: the sweep.
        device: where to train (default :func:`~lengthgen_utils.run.training.default_device`).
        cache: see :func:`~lengthgen_utils.run.cache.load_or_run`; each ensemble is its own entry.
        progress: show a progress bar per ensemble's training.
        on_ensemble: called as ``on_ensemble(pe, attention, status, seconds)`` after each ensemble, from the
            thread that ran it (the ensembles run up to one per CPU core at once, :mod:`~lengthgen_utils.run.parallel`;
            with ``progress``, one at a time).

    Returns:
        a :class:`~lengthgen_utils.run.results.Runs`: one member per (encoding, attention, offset, seed), one
        ensemble per (encoding, attention) whose models are offset-major; ``extra["seconds"]`` holds each
        ensemble's wall time of training or loading.
    """
    device = _device(device)
    lengths = sweep.eval_lengths
    tasks, seeds = sweep.tasks, sweep.seeds

    def build(pe, attention):
        return _retrieval_head(sweep, sweep.n_models, seeds, pe, attention)

    def run_one(pair):
        pe, attention = pair
        start = time.perf_counter()

        def compute():
            model = build(pe, attention)
            loss = train(model, tasks, sweep.optimizer_settings, steps=sweep.steps, batch_size=sweep.batch_size,
                         train_len=sweep.train_len, fixed_length=sweep.fixed_length, seed=sweep.data_seed, device=device,
                         min_train_len=sweep.shortest_train_len, progress=progress, train_set=sweep.train_set)
            acc = accuracy_by_length(model, tasks, lengths, n_samples=sweep.eval_samples)
            return _model_payload(model, loss, lengths, acc)

        payload, status = load_or_run(sweep.ensemble(pe, attention), compute, cache=cache, device=device,
                                      threads=default_cpu_threads("single-head"))
        seconds = time.perf_counter() - start
        if on_ensemble is not None:
            on_ensemble(pe, attention, status, seconds)
        return payload, status, seconds

    pairs = [(pe, attention) for pe in sweep.pes for attention in sweep.attentions]
    # the ensembles are independent: up to one per CPU core at once (progress bars: one at a time)
    done = parallel_map(run_one, pairs, workers=1 if progress else parallel_workers(device))
    members, ensembles, accuracy, history, status, seconds = [], [], [], [], {}, {}
    for (pe, attention), (payload, status[(pe, attention)], seconds[(pe, attention)]) in zip(pairs, done):
        model = build(pe, attention)
        model.load_state_dict(payload["state_dict"])
        ensembles.append(Ensemble(model.to(device).eval(), list(range(len(members), len(members) + len(tasks))),
                                  lambda pe=pe, attention=attention: build(pe, attention)))
        members += _members(pe, attention, tasks, seeds)
        accuracy.append(payload["accuracy"])
        history.append(payload["loss_history"])
    return Runs(sweep, members, list(lengths), torch.cat(accuracy), ensembles, torch.cat(history, 1),
                extra={"seconds": seconds}, cache=status)


def run_offset_sweep(exp: RetrievalExperiment, offsets=(1, 2, 3, 5), device=None, cache=True) -> Runs:
    """Train ``exp.n_seeds`` seeds for each offset in one ensemble and evaluate at ``exp.eval_lengths``.

    The one-ensemble :class:`~lengthgen_utils.run.configs.RetrievalSweep` of ``exp``
    (:meth:`~lengthgen_utils.run.configs.RetrievalSweep.of_experiment`) run by :func:`run_sweep`:
    ``exp.offset`` is ignored (each model gets its own offset from ``offsets``); every other field of ``exp``
    applies.

    Raises:
        ValueError / TypeError: ``offsets`` empty, repeated, not ints, or too large for
            ``exp.train_len`` (or ``exp.min_train_len``).
    """
    return run_sweep(RetrievalSweep.of_experiment(exp, offsets), device=device, cache=cache)


# ---------------------------------------------------------------- untrained heads (the nulls of chapter 4)
def untrained_heads(exp, n_heads: int, first_seed: int = 1_000_000) -> RetrievalHead:
    """``n_heads`` untrained heads of ``exp``'s architecture, initialised exactly as training starts them.

    Seeds ``first_seed .. first_seed + n_heads - 1``, disjoint from the seeds ``0 .. n_seeds-1`` that the
    book trains, so no null head is the initial state of a trained one. The null of chapter 4: what
    the package's initialisation already gives, before any training.

    Args:
        exp: a :class:`~lengthgen_utils.run.configs.RetrievalExperiment`, or a sweep of one encoding and one
            attention normaliser (e.g. the ``config`` of :func:`run_offset_sweep`'s result).

    Raises:
        ValueError / TypeError: ``n_heads < 1``, ``first_seed`` not an int >= ``exp.n_seeds``, or a sweep of
            several encodings or normalisers.
    """
    n_heads = check_int("n_heads", n_heads, minimum=1)
    first_seed = check_int("first_seed", first_seed, minimum=exp.n_seeds)
    if isinstance(exp, RetrievalSweep):
        if len(exp.pes) != 1 or len(exp.attentions) != 1:
            raise ValueError(f"exp must be an experiment or a sweep of one encoding and one attention; got "
                             f"pes={exp.pes}, attentions={exp.attentions}")
        pe, attention = exp.pes[0], exp.attentions[0]
    else:
        pe, attention = exp.pe, exp.attention
    return _retrieval_head(exp, n_heads, range(first_seed, first_seed + n_heads), pe, attention)


# ---------------------------------------------------------------- one training, several snapshots (chapter 5)
class _LogLengthTrainingHead(RetrievalHead):
    """A retrieval head whose logits at length ``L`` are multiplied by ``log L / log train_len`` in every forward
    pass: a log-length temperature used in training (its weights load into a plain :class:`RetrievalHead`)."""

    def __init__(self, *args, train_len: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.train_len = train_len

    def forward(self, tokens, position_shift=0, logit_scale=1.0, positions=None):
        scale = logit_scale * math.log(tokens.shape[-1]) / math.log(self.train_len)
        return super().forward(tokens, position_shift, scale, positions)


def _snapshot_head(config: SnapshotSweep, seeds, training: bool = False) -> SingleHead:
    """The untrained heads of ``config`` with initialisation ``seeds`` (one per model): content heads with
    ``config.content``; in training with ``config.length_temperature``, the log-length-scaled head."""
    sweep = config.sweep
    pe, attention = sweep.pes[0], sweep.attentions[0]
    shape = (sweep.vocab_size, sweep.d_model, sweep.d_head, pe, attention)
    if config.content:
        return ContentRetrievalHead(*shape, max_len=sweep.table_len, n_models=len(seeds), seeds=seeds,
                                    init_scale=sweep.init_scale)
    if training and config.length_temperature:
        return _LogLengthTrainingHead(*shape, max_len=sweep.table_len, n_models=len(seeds), seeds=seeds,
                                      init_scale=sweep.init_scale, train_len=sweep.train_len)
    return _retrieval_head(sweep, len(seeds), seeds, pe, attention)


def trains_with(config: SnapshotSweep) -> SnapshotSweep:
    """``config`` with its optimiser's learning rate, weight decay and momentum set aside: snapshot sweeps
    equal under it share every shape, task, seed and the data stream, so they train as one ensemble with one
    optimiser setting per model (:func:`train_snapshots`)."""
    sweep = replace(config.sweep, lr=1.0, weight_decay=0.0, momentum=0.0)
    return replace(config, sweep=sweep)


def train_snapshots(configs, device=None) -> list[dict]:
    """Train the snapshot sweeps ``configs`` as ONE batched ensemble; return each one's payload.

    The sweeps may differ only in the optimiser's learning rate, weight decay and momentum (equal under
    :func:`trains_with`): the ensemble holds each sweep's heads in turn, each with its own sweep's setting
    (:class:`~lengthgen_utils.run.optim.PerModelOptimizer`; one sweep alone trains with torch's optimiser),
    on the one data stream they share. Every member is updated exactly as in its sweep's own training and
    each sweep's snapshots are evaluated on its own heads, so each payload is bit for bit the one its sweep
    trained alone gives (``tests/test_regime_map.py``), in less time: much of a head's step is per-operation
    overhead, shared by every model of an ensemble (120 heads trained at 1.5-2.0x the model-steps/s of 20 on
    the book's 2-core machine: ``python -m lengthgen_utils.tools.bench``, section 1b; ``running.md``).

    Args:
        configs: one or more :class:`~lengthgen_utils.run.configs.SnapshotSweep`.
        device: where to train (default :func:`~lengthgen_utils.run.training.default_device`).

    Returns:
        one payload per sweep, in order: ``{"states": [state dict per snapshot], "loss_history": [steps, n],
        "accuracy": [[n, len(lengths)] per snapshot]}`` (what :func:`run_snapshots` caches).

    Raises:
        TypeError / ValueError: ``configs`` empty or not snapshot sweeps, or sweeps that differ in more than
            the optimiser's hyper-parameters.
    """
    configs = list(configs)
    if not configs or not all(isinstance(c, SnapshotSweep) for c in configs):
        raise TypeError(f"configs must be one or more SnapshotSweep; got {[type(c).__name__ for c in configs]}")
    first = configs[0]
    for i, config in enumerate(configs):
        if trains_with(config) != trains_with(first):
            raise ValueError(f"configs[{i}] differs from configs[0] in more than lr, weight_decay and momentum; "
                             "such sweeps cannot share one training")
    device = _device(device)
    sweep = first.sweep
    n, tasks, seeds = sweep.n_models, sweep.tasks, sweep.seeds
    lengths = list(first.lengths)
    scale = log_length_scale(lengths, sweep.train_len) if first.length_temperature else None
    model = _snapshot_head(first, seeds * len(configs), training=True)  # sweep-major: rows c*n .. (c+1)*n - 1
    settings = [c.sweep.optimizer_settings for c in configs for _ in range(n)]
    kept = {}

    def keep(step, _loss):
        if step in first.snapshot_steps:
            kept[step] = {name: t.detach().clone() for name, t in model.state_dict().items()}

    history = train(model, tasks * len(configs), settings, steps=sweep.steps, batch_size=sweep.batch_size,
                    train_len=sweep.train_len, fixed_length=sweep.fixed_length, seed=sweep.data_seed,
                    device=device, min_train_len=sweep.shortest_train_len, callback=keep, train_set=sweep.train_set)
    payloads = []
    for c in range(len(configs)):
        rows = slice(c * n, (c + 1) * n)
        states = [{name: t[rows].clone() for name, t in kept[step].items()} for step in first.snapshot_steps]
        accuracy = []
        for state in states:
            plain = _snapshot_head(first, seeds).to(device)
            plain.load_state_dict(state)
            accuracy.append(accuracy_by_length(plain, tasks, lengths, n_samples=first.eval_samples,
                                               logit_scale=scale, batch_size=256 if first.content else 1024))
        payloads.append({"states": states, "loss_history": history[:, rows].clone(), "accuracy": accuracy})
    return payloads


def run_snapshots(config: SnapshotSweep, device=None, cache=True) -> Runs:
    """Train the one ensemble of ``config.sweep`` once, keeping its weights at ``config.snapshot_steps``.

    Each snapshot equals the same ensemble trained for that many steps alone (the training stream does
    not depend on the run's length). Every snapshot is evaluated at ``config.lengths`` (with the log-length
    scale when ``config.length_temperature``); with ``config.content`` the heads are
    :class:`~lengthgen_utils.core.models.ContentRetrievalHead` (queries and keys see the tokens). Results go
    through the results cache (:func:`train_snapshots` computes them).

    Returns:
        a :class:`~lengthgen_utils.run.results.Runs` with one ensemble per snapshot: its members carry the
        label ``step`` besides the sweep's (``where(step=500)`` is the ensemble after 500 steps); every member's
        loss history is the run's, up to its last step.
    """
    device = _device(device)
    payload, status = load_or_run(config, lambda: train_snapshots([config], device)[0], cache=cache, device=device,
                                  threads=default_cpu_threads("single-head"))
    return _snapshot_runs(config, payload, status, device)


def _snapshot_runs(config: SnapshotSweep, payload: dict, status: str, device) -> Runs:
    """The :class:`~lengthgen_utils.run.results.Runs` of :func:`run_snapshots` from its payload."""
    sweep = config.sweep
    pe, attention = sweep.pes[0], sweep.attentions[0]
    tasks, seeds = sweep.tasks, sweep.seeds
    members, ensembles, accuracy = [], [], []
    for step, state, acc in zip(config.snapshot_steps, payload["states"], payload["accuracy"]):
        model = _snapshot_head(config, seeds)
        model.load_state_dict(state)
        ensembles.append(Ensemble(model.to(device).eval(), list(range(len(members), len(members) + len(tasks))),
                                  lambda: _snapshot_head(config, seeds)))
        members += [{**m, "step": step} for m in _members(pe, attention, tasks, seeds)]
        accuracy.append(acc)
    history = payload["loss_history"].repeat(1, len(config.snapshot_steps))
    return Runs(config, members, list(config.lengths), torch.cat(accuracy), ensembles, history,
                cache={(pe, attention): status})


# ---------------------------------------------------------------- the direct kernel head (chapter 6)
def run_kernel_head(exp: RetrievalExperiment, name: str = "rope", frequencies=None,
                    lr_fraction: float = 0.5, steps: int | None = None, device=None, cache=True) -> Runs:
    """Train the directly parameterised kernel head with SGD on the squared loss, and its closed forms.

    One model per data seed ``exp.data_seed + i`` (``i < exp.n_seeds``), each from ``c = 0``
    (with ``c = 0`` every model of one data stream is the same, so seeds vary the data). The
    models train as one batched ensemble, model ``i`` on its own stream
    (:func:`~lengthgen_utils.run.training.train_squared_loss` with one seed per model), through the
    results cache. The step size is ``lr_fraction / lambda_max(H)`` (stable for ``lr_fraction < 1``).

    Args:
        exp: the experiment (its offset, lengths, vocabulary, ``d_head``, batch size, seeds, steps).
        name: a label for the frequency set (figures and tables).
        frequencies: ``theta [d_head // 2]`` in rad/token, or ``None`` for RoPE's.
        lr_fraction: the step size as a fraction of ``1 / lambda_max`` of the expected-loss Hessian.
        steps: SGD steps (default ``exp.steps``).
        device: where to train (default :func:`~lengthgen_utils.run.training.default_device`).

    Returns:
        a :class:`~lengthgen_utils.run.results.Runs` of ``n_seeds`` members (label ``data_seed`` besides the
        experiment's), whose measures are ``c [M, d_head]`` (the trained kernels) and ``squared_error [M, n]``;
        its run-level results (``extra``, also attributes) are ``name``, ``frequencies [d_head // 2]``, ``lr``,
        ``steps``, ``c_gd [d_head]`` (closed-form gradient descent on the expected loss after ``steps`` steps),
        ``c_star [d_head]`` (the exact min-norm interpolant), ``predicted_squared_error [n]`` (from ``c_gd``,
        exact expectation), ``hessian_eigenvalues [d_head]`` and ``min_norm_accuracy [n]`` (the accuracy of
        ``c*`` itself, in float64 on the same sequences as the trained models).

    Raises:
        ValueError: ``exp.fixed_length`` or ``exp.min_train_len`` is set (the closed forms assume
            lengths uniform in ``[offset + 2, train_len]``); ``exp.task_family`` is not ``"fixed-offset"``
            (the closed forms are those of fixed-offset retrieval); a bad ``steps`` or ``lr_fraction``.
    """
    if exp.task_family != "fixed-offset":
        raise ValueError("run_kernel_head's closed forms are those of fixed-offset retrieval; got "
                         f"task_family={exp.task_family!r} (allowed: 'fixed-offset')")
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
        history = train_squared_loss(model, exp.task, OptimizerSettings("sgd", lr=lr), steps=steps,
                                     batch_size=exp.batch_size,
                                     train_len=exp.train_len, device=device,
                                     seed=[exp.data_seed + i for i in range(exp.n_seeds)])
        model.cpu()
        return {"c": model.c.detach().double(), "loss_history": history,
                "accuracy": accuracy_by_length(model, exp.task, lengths, n_samples=exp.eval_samples),
                "squared_error": squared_error_by_length(model, exp.task, lengths, n_samples=exp.eval_samples)}

    config = KernelHeadConfig(exp, None if frequencies is None else tuple(theta.tolist()), lr_fraction, steps)
    payload, status = load_or_run(config, compute, cache=cache, device=device,
                                  threads=default_cpu_threads("single-head"))
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
    model = KernelHead(exp.vocab_size, exp.d_head, frequencies=theta, n_models=exp.n_seeds)
    with torch.no_grad():
        model.c.copy_(payload["c"].to(model.c.dtype))
    members = [{**m, "data_seed": exp.data_seed + i}
               for i, m in enumerate(_members(exp.pe, exp.attention, [exp.task] * exp.n_seeds, [0] * exp.n_seeds))]
    return Runs(config, members, list(lengths), payload["accuracy"], [Ensemble(model, list(range(exp.n_seeds)))],
                payload["loss_history"], measures={"c": payload["c"], "squared_error": payload["squared_error"]},
                extra={"name": name, "frequencies": theta, "lr": lr, "steps": steps, "c_gd": c_gd, "c_star": c_star,
                       "predicted_squared_error": predicted, "hessian_eigenvalues": eig,
                       "min_norm_accuracy": min_norm_accuracy}, cache={"kernel head": status})


# ---------------------------------------------------------------- a linear recurrent model (chapter 8)
def _linear_rnn(exp: RecurrentExperiment) -> LinearRNN:
    return LinearRNN(exp.vocab_size, exp.d_state, exp.init_scale, n_models=exp.n_models, seeds=exp.seeds,
                     transition=exp.transition)


def recurrent_accuracy(model: LinearRNN, task, lengths, n_samples: int = 1024) -> Tensor:
    """:func:`~lengthgen_utils.run.evaluation.accuracy_by_length` of a recurrent ensemble in which a model may
    have trained to an unstable transition.

    A model whose kernel ``C A^d B`` overflows within a length (:meth:`LinearRNN.finite_within`: largest
    ``|eigenvalue|`` of ``A`` above 1, raised to that many steps) gives no prediction there; it scores 0 at
    that length and every longer one (a seed that fails beyond training, counted as a data point, not an
    error). Every model still runs on the same evaluation sequences: the stable models are scored together,
    each unstable one on the lengths before its overflow, from the same evaluation stream; an ensemble with
    no unstable model is scored exactly as ``accuracy_by_length`` scores it.

    Args:
        model: a :class:`~lengthgen_utils.core.models.LinearRNN` ensemble (M models).
        task: one query-only task, or one per model; lengths: increasing evaluation lengths; n_samples: per
            length.

    Returns:
        float64 ``[M, len(lengths)]`` accuracies in [0, 1], on the CPU.

    Raises:
        TypeError / ValueError: as :func:`~lengthgen_utils.run.evaluation.accuracy_by_length`.
    """
    lengths = list(lengths)
    reach = torch.stack([model.finite_within(L) for L in lengths], 1).long().cumprod(1).sum(1)  # [M]
    if bool((reach == len(lengths)).all()):
        return accuracy_by_length(model, task, lengths, n_samples=n_samples)
    tasks = as_task_list(task, model.n_models)
    out = torch.zeros(model.n_models, len(lengths), dtype=torch.float64)
    stable = [i for i in range(model.n_models) if reach[i] == len(lengths)]
    if stable:
        out[stable] = accuracy_by_length(model.subset(stable), [tasks[i] for i in stable], lengths,
                                         n_samples=n_samples)
    for i in range(model.n_models):
        n_ok = int(reach[i])
        if 0 < n_ok < len(lengths):  # the same stream: the lengths before the overflow come first
            out[i, :n_ok] = accuracy_by_length(model.subset([i]), tasks[i], lengths[:n_ok], n_samples=n_samples)[0]
    return out


def run_recurrent(exp: RecurrentExperiment, device=None, cache=True) -> Runs:
    """Train and evaluate the linear recurrent ensemble of ``exp`` (or load it from the results cache).

    The models train with :func:`~lengthgen_utils.run.training.train` (Adam, cross-entropy at the query:
    the single head's recipe) and are evaluated at ``exp.eval_lengths`` with :func:`recurrent_accuracy`
    (a model whose transition overflows at a length scores 0 there).

    Returns:
        a :class:`~lengthgen_utils.run.results.Runs`, one member per (offset, seed) (``pe`` is None: the
        recurrence is the model's only position signal), whose model lives on ``device``.
    """
    model, payload, status = _train_query_readout(exp, _linear_rnn, exp.tasks, exp.shortest_train_len, device,
                                                  cache, evaluate=recurrent_accuracy)
    members = _members(None, "recurrent", exp.tasks, exp.seeds)
    return Runs(exp, members, list(payload["lengths"]), payload["accuracy"],
                [Ensemble(model, list(range(exp.n_models)), lambda: _linear_rnn(exp))], payload["loss_history"],
                cache={"recurrent": status})


# ---------------------------------------------------------------- the multi-layer transformer (chapters 7-9)
def build_transformer(exp: TransformerExperiment) -> FastTransformer:
    """The untrained ensemble of ``exp`` (seeds ``0 .. n_seeds-1``): what :func:`run_transformer` starts from.

    A :class:`~lengthgen_utils.core.fast.FastTransformer`, the batched layout the book trains with; its state
    dict loads into the readable :class:`~lengthgen_utils.core.models.Transformer` unchanged.
    """
    return FastTransformer(exp.task.n_tokens, exp.n_layers, exp.n_heads, exp.d_model, exp.pe, max_len=exp.max_len,
                           n_models=exp.n_seeds)


def run_transformer(exp: TransformerExperiment, device=None, cache=True) -> Runs:
    """Train the ensemble of ``exp`` and measure per-position token accuracy at each evaluation length.

    Results go through the results cache (``cache`` as in :func:`~lengthgen_utils.run.cache.load_or_run`):
    a rebuild of the book loads the trained weights and measurements instead of retraining.

    Returns:
        a :class:`~lengthgen_utils.run.results.Runs` of ``n_seeds`` members whose ``accuracy [M, n]`` holds token
        accuracy at positions ``< train_len`` at the shortest evaluation length (the training length in every
        experiment of the book; a longer sequence may score no position below it) and at positions
        ``>= train_len`` at each longer one; measures ``per_position {L: [M, L]}`` (NaN where the task scores
        nothing), ``inside [M]`` and ``outside {L: [M]}``; run-level ``counts {L: [L]}`` (scored tokens per
        position).
    """
    device = _device(device)

    def compute():
        model = build_transformer(exp)
        history = train_sequence(model, exp.task, exp.optimizer_settings, steps=exp.steps,
                                 batch_size=exp.batch_size, train_len=exp.train_len, seed=exp.data_seed,
                                 device=device, min_train_len=exp.min_train_len)
        measured = [token_accuracy_by_position(model, exp.task, L, n_samples=exp.eval_samples)
                    for L in exp.eval_lengths]
        return {"state_dict": dict(model.state_dict()), "loss_history": history,
                "accuracy": [acc for acc, _ in measured], "counts": [cnt for _, cnt in measured]}

    payload, status = load_or_run(exp, compute, cache=cache, device=device,
                                  threads=default_cpu_threads("transformer"))
    model = build_transformer(exp)
    model.load_state_dict(payload["state_dict"])
    model.to(device).eval()
    return transformer_runs(exp, model, payload["loss_history"], payload["accuracy"], payload["counts"],
                            lambda: build_transformer(exp), {(exp.pe, "softmax"): status})


def transformer_runs(exp: TransformerExperiment, model, loss_history, per_position, counts, build=None,
                     cache=None) -> Runs:
    """The :class:`~lengthgen_utils.run.results.Runs` of a trained transformer ensemble from its per-position
    accuracy (one ``[M, L]`` per evaluation length) and scored-token counts (one ``[L]`` each): what
    :func:`run_transformer` returns (and the zoo, for a model evaluated under a test-time encoding)."""
    per_position = dict(zip(exp.eval_lengths, per_position))
    counts = dict(zip(exp.eval_lengths, counts))
    split = {L: split_accuracy(per_position[L], counts[L], exp.train_len) for L in exp.eval_lengths}
    inside = split[min(exp.eval_lengths)][0]
    outside = {L: out for L, (_, out) in split.items()}
    columns = [inside if i == 0 else outside[L] for i, L in enumerate(exp.eval_lengths)]
    members = [{"pe": exp.pe, "attention": "softmax", "offset": getattr(exp.task, "offset", None), "seed": s,
                "task": exp.task} for s in range(exp.n_seeds)]
    return Runs(exp, members, list(exp.eval_lengths), torch.stack(columns, 1),
                [Ensemble(model, list(range(exp.n_seeds)), build)], loss_history,
                measures={"per_position": per_position, "inside": inside, "outside": outside},
                extra={"counts": counts}, cache=cache or {})


# ---------------------------------------------------------------- suites run by ``python -m lengthgen_utils run``
SUITE_ENCODINGS = ("rope", "ape", "nope")


def run_single_head_suite(profile: Profile, n_seeds: int | None = None, device=None, cache=True,
                          progress: bool = True, on_ensemble: Callable | None = None) -> Runs:
    """The profile's single-head sweep: seeds x offsets x {RoPE, APE, NoPE} x attention types."""
    overrides = {} if n_seeds is None else {"n_seeds": check_int("n_seeds", n_seeds, minimum=1)}
    sweep = RetrievalSweep.from_profile(profile, pes=SUITE_ENCODINGS, **overrides)
    return run_sweep(sweep, device=device, cache=cache, progress=progress, on_ensemble=on_ensemble)


def run_transformer_suite(profile: Profile, n_seeds: int | None = None, device=None, cache=True,
                          progress: bool = True, on_ensemble: Callable | None = None) -> dict:
    """Chapter 7's transformer on delayed copy, one ensemble per encoding (RoPE, APE, NoPE).

    Seeds default to the profile's transformer setting. ``on_ensemble(pe, attention, status, seconds)`` is
    called after each ensemble, as for the single-head suite. Returns ``{Encoding: Runs}``.
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


# ---------------------------------------------------------------- the regime map (chapter 5b)
def run_regime_map(config: RegimeMap, device=None, cache=True) -> dict:
    """Train every cell of a :class:`~lengthgen_utils.run.configs.RegimeMap` (each through the results cache).

    Each cell keeps its own cache entry, the one :func:`run_snapshots` of :meth:`RegimeMap.cell` reads; the
    cells whose entries are missing train together: cells that differ only in weight decay (one RoPE base,
    one kind of head) as one ensemble (:func:`train_snapshots`: each member bit for bit its cell's own
    training), the ensembles up to one per CPU core at once. The ``default`` map's 24 cells train as 6
    ensembles (3 bases x {position-only, content}).

    Returns:
        ``{(content, base, weight_decay): Runs}`` in :attr:`RegimeMap.cells` order, each the
        :func:`run_snapshots` result of :meth:`RegimeMap.cell`.

    Raises:
        TypeError: ``config`` is not a :class:`~lengthgen_utils.run.configs.RegimeMap`.
    """
    if not isinstance(config, RegimeMap):
        raise TypeError(f"config must be a RegimeMap; got {type(config).__name__}")
    device = _device(device)
    cells = config.cells
    sweeps = [config.cell(base, weight_decay, content) for content, base, weight_decay in cells]
    done = load_or_run_many(sweeps, lambda missing: train_together(missing, device), cache=cache, device=device,
                            threads=default_cpu_threads("single-head"))
    return {cell: _snapshot_runs(sweep, payload, status, device)
            for cell, sweep, (payload, status) in zip(cells, sweeps, done)}


def train_together(configs, device=None) -> list[dict]:
    """:func:`train_snapshots` of ``configs`` with every group that can share a training (equal under
    :func:`trains_with`) trained as one ensemble, the groups up to one per CPU core at once
    (:func:`~lengthgen_utils.run.parallel.parallel_map`). Returns one payload per config, in order."""
    configs = list(configs)
    groups: dict = {}
    for i, c in enumerate(configs):
        groups.setdefault(trains_with(c), []).append(i)
    # the largest groups first, so the last to start is a small one
    order = sorted(groups.values(), key=lambda rows: -sum(configs[i].sweep.n_models for i in rows))
    trained = parallel_map(lambda rows: train_snapshots([configs[i] for i in rows], device), order,
                           workers=parallel_workers(device))
    payloads = [None] * len(configs)
    for rows, group in zip(order, trained):
        for i, payload in zip(rows, group):
            payloads[i] = payload
    return payloads


def run_many(runner: Callable, experiments: dict, device=None, cache=True, **kwargs) -> dict:
    """``{name: runner(exp, ...)}`` for independent single-head experiments, up to one per CPU core at once.

    A single head trains on one CPU thread, so on a 2-core machine two ensembles train at once
    (:func:`~lengthgen_utils.run.parallel.parallel_map`; 1.1x to 1.9x faster than one after the other
    on the book's machine, ``running.md``); each result, and each cache entry, is the
    one a loop of ``runner`` calls gives, bit for bit.

    Args:
        runner: a single-head runner (:func:`run_retrieval`, :func:`run_offset_sweep`, :func:`run_sweep`,
            :func:`run_snapshots`, :func:`run_recurrent`, :func:`run_kernel_head`), or any function of one
            configuration that trains single heads.
        experiments: ``{name: configuration}``.
        device, cache: passed to every call.
        **kwargs: passed to every call (e.g. ``offsets=`` of :func:`run_offset_sweep`).

    Returns:
        ``{name: Runs}`` in the order of ``experiments``.

    Raises:
        TypeError: ``runner`` is not callable or ``experiments`` is not a dict.
        RuntimeError: the runner trains a transformer (two threads per model): call it outside.
    """
    if not callable(runner):
        raise TypeError(f"runner must be callable; got {type(runner).__name__}")
    if not isinstance(experiments, dict):
        raise TypeError(f"experiments must be a dict {{name: configuration}}; got {type(experiments).__name__}")
    done = parallel_map(lambda exp: runner(exp, device=device, cache=cache, **kwargs), experiments.values(),
                        workers=parallel_workers(device))
    return dict(zip(experiments, done))
