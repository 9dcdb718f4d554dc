"""Training loop for ensembles: one optimiser step updates every model of the ensemble.

The loss is the *sum* over models of each model's mean cross-entropy, and
Adam(W) acts elementwise, so model ``i`` receives exactly the update it would
receive if trained alone on the same batches (no coupling through the loss
scale, no global gradient clipping).
"""
from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validate import check_device, check_fits, check_int, env_int, env_value, per_model_ints
from ..core.models import KernelHead, Transformer, diverged_models_allowed
from ..core.tasks import IGNORE_INDEX, as_task_list, query_targets, shared_task
from ..core.seeding import generator
from .optim import OptimizerSettings, build_optimizer, per_model_settings


def default_device() -> torch.device:
    """CUDA when available, else the CPU (everything in the book runs on CPU)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@contextmanager
def unchanged_on_failure(model):
    """Run the block; if it raises (anything, Ctrl-C included), put ``model`` back as it was before it.

    The trainers move the caller's model to the training device and update its weights in place; a call
    that fails half way (a callback that raises, an interrupt, a model that overflows at some length) would
    leave it moved and half trained. This restores its device, every parameter, gradient and buffer, and
    its train/eval mode, then re-raises. The copy is taken once per call (the models are small), never
    per step.
    """
    device, training = model.device, model.training
    params = [(p.detach().clone(), None if p.grad is None else p.grad.detach().clone()) for p in model.parameters()]
    buffers = [b.detach().clone() for b in model.buffers()]
    try:
        yield
    except BaseException:
        model.to(device)
        with torch.no_grad():
            for p, (value, grad) in zip(model.parameters(), params):
                p.copy_(value)
                p.grad = grad
            for b, value in zip(model.buffers(), buffers):
                b.copy_(value)
        model.train(training)
        raise


THREADS_ENV = "LENGTHGEN_THREADS"
MAX_THREADS = 1024
"""The most intra-op threads a count may ask for (``$LENGTHGEN_THREADS``, :func:`cpu_threads`): more than any
machine the book runs on has cores; torch keeps the count in 32 bits, so 2^31 would pass an unbounded check
and overflow inside ``torch.set_num_threads``."""

CPU_THREADS = {"single-head": 1, "transformer": 2}
"""Intra-op CPU threads of each model's training and evaluation, the one place the rule lives.

The right count depends on how much work one operation holds, measured side by side by
``python -m lengthgen_utils.tools.bench`` on 2 CPU cores:

* ``"single-head"`` (:class:`~lengthgen_utils.core.models.RetrievalHead`, :class:`~lengthgen_utils.core.models.KernelHead`):
  **1 thread**. A step is a few dozen operations on tensors of ~10^5 elements, less than the
  cost of waking and joining a second thread; two threads were slower at every ensemble size
  (and 10 to 100 times slower on a machine busy with other processes).
* ``"transformer"`` (:class:`~lengthgen_utils.core.fast.FastTransformer`, the one the book trains, and the
  readable :class:`~lengthgen_utils.core.models.Transformer` it subclasses): **2 threads**. A step of the
  book's transformer multiplies matrices of ~10^6 elements per model (1024 tokens x d_model 64,
  four projections per block); two threads train it about 1.6-1.8x faster than one at 3 or more models
  on an otherwise idle machine.

The count is capped at ``os.cpu_count()``. ``$LENGTHGEN_THREADS`` overrides it for every path.
The thread count changes float rounding (a reduction split in two sums in another order: about
1e-7 in a step's loss), so results are cached per thread count (:mod:`~lengthgen_utils.run.cache`).
"""


_WORKER = threading.local()
"""``active`` is true in a thread of :func:`~lengthgen_utils.run.parallel.parallel_map`: there, every
computation runs on the one intra-op thread the map pinned, and :func:`cpu_threads` refuses another count."""


def thread_path(model) -> str:
    """The key of :data:`CPU_THREADS` that applies to ``model``: ``"transformer"`` (either transformer: the fast
    one is a subclass of the readable one) or ``"single-head"``."""
    return "transformer" if isinstance(model, Transformer) else "single-head"


def default_cpu_threads(path="single-head") -> int:
    """Intra-op CPU threads for a training or evaluation path: ``$LENGTHGEN_THREADS``, else :data:`CPU_THREADS`.

    Args:
        path: a key of :data:`CPU_THREADS`, or a model (its path is :func:`thread_path`).

    Returns:
        ``$LENGTHGEN_THREADS`` if set, else ``min(CPU_THREADS[path], os.cpu_count())``.

    Raises:
        ValueError: ``$LENGTHGEN_THREADS`` is set but is not an integer in ``[1, MAX_THREADS]``, or ``path`` is
            unknown.
    """
    if not isinstance(path, str):
        path = thread_path(path)
    if path not in CPU_THREADS:
        raise ValueError(f"path must be one of {tuple(CPU_THREADS)} or a model; got {path!r}")
    n = env_int(THREADS_ENV, 1, MAX_THREADS, "intra-op CPU threads")
    return min(CPU_THREADS[path], os.cpu_count() or 1) if n is None else n


MALLOC_ENV = "LENGTHGEN_MALLOC"
MALLOC_THRESHOLDS = {"M_MMAP_THRESHOLD": (-3, 16 << 20), "M_TRIM_THRESHOLD": (-1, 32 << 20)}
"""``mallopt(3)`` settings of :func:`keep_freed_memory`: ``{name: (glibc's parameter number, bytes)}``."""
_MALLOC = {}


def malloc_choice() -> str:
    """``$LENGTHGEN_MALLOC``: ``"keep"`` (the default: :func:`keep_freed_memory` sets malloc's thresholds) or
    ``"system"`` (it leaves them as they are).

    Raises:
        ValueError: any other value; the message names the variable and its value.
    """
    choice = env_value(MALLOC_ENV) or "keep"
    if choice not in ("keep", "system"):
        raise ValueError(f"${MALLOC_ENV} must be 'keep' or 'system'; got {MALLOC_ENV}={os.environ[MALLOC_ENV]!r}")
    return choice


def keep_freed_memory() -> bool:
    """Let glibc's malloc keep the memory torch frees for the next allocation, once per process.

    A CPU training step frees and allocates again tensors of a few MiB (an ensemble's batch of logits,
    its gradient: ``[120, 256, 17]`` floats are 2 MiB). glibc serves such a block with ``mmap``, or from
    the top of its heap, which it gives back to the system after a free; so every step asks the kernel
    for the same memory again and pays a page fault, and a zeroed page, at each first touch (500 to 1000
    faults per step of 120 heads). With ``M_MMAP_THRESHOLD`` at 16 MiB and ``M_TRIM_THRESHOLD`` at 32 MiB
    (:data:`MALLOC_THRESHOLDS`) the heap keeps up to 32 MiB free for reuse: such a step faults 5 to 30 times,
    and 120 heads train about 1.2x faster (``python -m lengthgen_utils.tools.bench``, section 1c, times both
    settings side by side). Only where the memory comes from changes, never a number computed in it
    (``tests/test_performance.py``).

    :func:`model_threads` calls it before the package computes on the CPU. It is a setting of the whole
    process; nothing here changes it back.

    Returns:
        True once the thresholds are set; False where they are not: malloc is not glibc's (macOS, Windows,
        musl), or ``$LENGTHGEN_MALLOC`` is ``system`` (keep the system's behaviour, e.g. to measure both).

    Raises:
        ValueError: ``$LENGTHGEN_MALLOC`` is set to anything but ``keep`` (the default) or ``system``.
    """
    if malloc_choice() == "system":
        return False
    if "set" not in _MALLOC:
        _MALLOC["set"] = False
        try:  # glibc names itself here ("glibc 2.36"); musl, macOS and Windows do not
            glibc = os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
            mallopt = ctypes.CDLL(None).mallopt if glibc else None
        except (AttributeError, OSError, ValueError):
            mallopt = None
        if mallopt is not None:
            _MALLOC["set"] = all(mallopt(number, size) == 1 for number, size in MALLOC_THRESHOLDS.values())
    return _MALLOC["set"]


def model_threads(model, device=None):
    """A :func:`cpu_threads` block for computing with ``model`` on ``device`` (default: where the model is):
    on the CPU, its path's count (:func:`default_cpu_threads`, which ``$LENGTHGEN_THREADS`` overrides); on
    another device, the setting is left alone. The trainers and evaluators call it: the policy is not an
    argument of theirs."""
    device = model.device if device is None else device
    if device.type == "cpu":
        keep_freed_memory()
    return cpu_threads(default_cpu_threads(model) if device.type == "cpu" else None)


@contextmanager
def cpu_threads(n: int | None):
    """Run the block with ``torch.set_num_threads(n)``, restoring the previous count afterwards.

    ``n=None`` leaves the setting alone.

    Raises:
        TypeError / ValueError: ``n`` is not an int in ``[1, MAX_THREADS]``.
        RuntimeError: inside :func:`~lengthgen_utils.run.parallel.parallel_map`, ``n`` differs from the
            one thread the map pinned (another computation runs beside this one on the same setting).
    """
    if n is None:
        yield
        return
    n = check_int("num_threads", n, minimum=1, maximum=MAX_THREADS)
    previous = torch.get_num_threads()
    if getattr(_WORKER, "active", False) and n != previous:
        raise RuntimeError(f"a computation inside parallel_map asked for {n} intra-op threads; the map runs "
                           f"one-thread computations only (the single head): run this one outside it")
    if n != previous:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n != previous:
            torch.set_num_threads(previous)


def _check_optimizer(optimizer, default: OptimizerSettings, n_models: int | None = None):
    """``optimizer``, or ``default`` when it is ``None``; a ``TypeError`` naming it for anything else. With
    ``n_models``, also one setting per model (:func:`~lengthgen_utils.run.optim.per_model_settings`)."""
    if optimizer is None:
        return default
    if n_models is not None:
        return per_model_settings(optimizer, n_models)
    if not isinstance(optimizer, OptimizerSettings):
        raise TypeError(f"optimizer must be None or an OptimizerSettings (lengthgen_utils.run.optim); got "
                        f"{type(optimizer).__name__} {optimizer!r:.80}")
    return optimizer


def ensemble_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Per-model mean cross-entropy: ``logits [M, B, V]``, ``targets [M, B]`` -> ``[M]``.

    The loss of every training step: its callers (the trainers, the probes) drew ``B >= 1`` sequences of a checked
    batch size, so it checks nothing (an empty batch would give a NaN mean).
    """
    m, b, v = logits.shape
    return F.cross_entropy(logits.reshape(m * b, v), targets.reshape(m * b), reduction="none").view(m, b).mean(1)


def train(model, task, optimizer: OptimizerSettings | None = None, steps: int = 2000, batch_size: int = 256,
          train_len: int = 16, fixed_length: bool = False, seed: int = 0, device=None,
          progress: bool | None = None, min_train_len: int | None = None,
          callback=None, train_set: int | None = None) -> Tensor:
    """Train an ensemble on the fixed-offset retrieval task (by default with Adam, lr 1e-2: the book's recipe).

    Each step draws one batch at a single length: ``train_len`` when
    ``fixed_length``, else uniform in ``[min_train_len, train_len]`` (the whole
    batch shares a length, so the attention row is computed once). Tokens are
    sampled on the CPU from one generator and then moved to ``device``, so
    every model of the ensemble sees the same stream as it would alone, on any
    device.

    Args:
        model: a :class:`~lengthgen_utils.core.models.RetrievalHead` (any ``n_models``).
        task: a task with ``sample``/``targets``, or a sequence of one task per model
            (e.g. different offsets), all with the same ``vocab_size``.
        optimizer: the update rule and its hyper-parameters
            (:class:`~lengthgen_utils.run.optim.OptimizerSettings`, built by
            :func:`~lengthgen_utils.run.optim.build_optimizer`); default ``OptimizerSettings()``, Adam with lr 1e-2.
            Or one per model (same rule; learning rate, weight decay and momentum may differ): each model
            trains exactly as it would alone with its own (:class:`~lengthgen_utils.run.optim.PerModelOptimizer`).
        steps: optimiser steps, >= 1.
        batch_size: sequences per step (shared by all models).
        train_len: longest training length L_train.
        fixed_length: train only at ``train_len``.
        seed: seeds the data stream (lengths and tokens); model seeds live in the model.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device``; defaults to :func:`default_device`.
            Checked before any work (:func:`~lengthgen_utils._validate.check_device`).
        progress: show a progress bar; ``None`` shows one for runs of 5000+ steps.
        min_train_len: shortest training length (variable-length training only); default
            the shortest length every task allows, ``max(offset) + 2``. An ensemble whose
            models have different offsets shares one length stream: give the same
            ``min_train_len`` to a model trained alone and it sees exactly that stream.
        callback: ``None``, or a callable ``callback(step, loss)`` run after every step with the
            1-based step number and the models' losses ``[M]`` (detached), e.g. to drive a progress widget.
        train_set: ``None`` (a fresh batch every step), or ``n`` >= 1: draw one fixed training set of ``n``
            sequences at every training length once (from ``seed``) and take every step on its full-batch
            loss, the mean over lengths of each length's mean cross-entropy (the loss of the
            variable-length stream, on a finite sample). With ``OptimizerSettings("sgd", lr)`` this is
            full-batch gradient descent (chapter 5c). ``batch_size`` is then unused.

    Returns:
        loss history ``[steps, M]`` (float32, on CPU): each model's training loss per step. The model is
        trained in place and left on ``device``; if the call fails, it is left as it was
        (:func:`unchanged_on_failure`).

    Raises:
        ValueError / TypeError: a size or rate out of range, ``train_len`` too short for an offset, or a
            device this machine cannot compute on (a typo, ``"cuda"`` without CUDA, ``"meta"``).
    """
    optimizer = _check_optimizer(optimizer, OptimizerSettings(), model.n_models)
    steps = check_int("steps", steps, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    if train_set is not None:
        train_set = check_int("train_set", train_set, minimum=1)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be None or callable; got {type(callback).__name__} {callback!r}")
    tasks = as_task_list(task, model.n_models)
    for t in tasks:
        check_fits("train_len", train_len, t.check_seq_len)
    if not tasks[0].query_only:
        raise ValueError(f"train fits the single-head readout (one target, at the query); {tasks[0]!r} scores "
                         "other positions: use train_sequence")
    if tasks[0].vocab_size != model.config.vocab_size:
        raise ValueError(f"task vocab_size={tasks[0].vocab_size} differs from model vocab_size={model.config.vocab_size}")
    min_len = max(t.min_seq_len for t in tasks)
    if min_train_len is not None:
        min_len = check_int("min_train_len", min_train_len, minimum=min_len, maximum=train_len)
    device = check_device(device)
    # a model whose weights diverge stays NaN and leaves the others alone (they share no arithmetic)
    with model_threads(model, device), unchanged_on_failure(model), diverged_models_allowed(model):
        return _train_loop(model, tasks, optimizer, steps, batch_size, train_len, fixed_length,
                           seed, device, progress, min_len, callback, train_set)


def _run_steps(model, optimizer, batch_loss, steps: int, device, progress: bool, callback=None) -> Tensor:
    """The optimisation loop every trainer shares, on validated arguments.

    Each step calls ``batch_loss()`` (per-model losses ``[M]``), backpropagates their sum (so
    the models stay independent), steps ``optimizer`` and records the losses; no host
    synchronisation inside the loop. ``callback(step, losses)`` is called after each step.

    Returns:
        loss history ``[steps, M]`` (float32, CPU).
    """
    history = torch.empty(steps, model.n_models, device=device)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=steps, desc="training", leave=False)
    for step in range(steps):
        stop = getattr(_WORKER, "stop", None)  # inside parallel_map: raises once the map is stopping
        if stop is not None:
            stop()
        loss = batch_loss()
        optimizer.zero_grad(set_to_none=True)
        loss.sum().backward()
        optimizer.step()
        history[step] = loss.detach()
        if callback is not None:
            callback(step + 1, history[step])
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return history.float().cpu()


def _train_loop(model, tasks, optimizer, steps, batch_size, train_len, fixed_length, seed, device,
                progress, min_len, callback=None, train_set=None) -> Tensor:
    """The loop of :func:`train`, on validated arguments."""
    model.to(device)
    model.train()
    gen = generator(seed)
    opt = build_optimizer(model, optimizer)
    if train_set is not None:
        fixed = []  # one (positions, tokens [n, L], targets [M, n]) per training length, drawn once
        for seq_len in ([train_len] if fixed_length else range(min_len, train_len + 1)):
            positions = model.encoding.train_positions(seq_len, gen)
            tokens, _ = tasks[0].sample(train_set, seq_len, gen, "cpu")
            fixed.append((positions, tokens.to(device), query_targets(tasks, tokens).to(device)))

        def full_batch_loss():
            losses = [ensemble_cross_entropy(model(tokens, positions=positions)[0], targets)
                      for positions, tokens, targets in fixed]
            return torch.stack(losses).mean(0)  # [M]: every length weighs the same, as in the stream

        history = _run_steps(model, opt, full_batch_loss, steps, device,
                             progress=bool(progress or (progress is None and steps >= 5000)), callback=callback)
        model.eval()
        return history

    def batch_loss():
        seq_len = train_len if fixed_length else int(torch.randint(min_len, train_len + 1, (1,), generator=gen))
        positions = model.encoding.train_positions(seq_len, gen)  # None: 0 .. L-1 (randomised encodings differ)
        tokens, _ = tasks[0].sample(batch_size, seq_len, gen, "cpu")  # train checked every length it draws
        tokens = tokens.to(device, non_blocking=True)
        logits, _ = model(tokens, positions=positions)  # tokens come from the task: valid
        return ensemble_cross_entropy(logits, query_targets(tasks, tokens))  # query-only: checked

    history = _run_steps(model, opt, batch_loss, steps, device,
                         progress=bool(progress or (progress is None and steps >= 5000)), callback=callback)
    model.eval()
    return history


def ensemble_squared_error(outputs: Tensor, targets: Tensor) -> Tensor:
    """Per-model mean squared loss ``||o - e(y)||^2``: ``outputs [M, B, V]``, ``targets [M, B]`` -> ``[M]``.

    The loss of every step of :func:`train_squared_loss` (and of its evaluation): its callers drew ``B >= 1``
    sequences of a checked size, so it checks nothing (an empty batch would give a NaN mean).
    """
    one_hot = F.one_hot(targets, outputs.shape[-1]).to(outputs.dtype)
    return ((outputs - one_hot) ** 2).sum(-1).mean(1)


def train_squared_loss(model, task, optimizer: OptimizerSettings | None = None, steps: int = 2000,
                       batch_size: int = 256, train_len: int = 16, seed: int | Sequence[int] = 0,
                       device=None) -> Tensor:
    """Train an ensemble on the squared loss, by default with plain SGD (the min-norm setting of chapter 6).

    Same data stream as :func:`train` (one length per step, uniform in
    ``[min_seq_len, train_len]``; tokens from ``seed``), but the loss is
    ``||o - e(y)||^2`` and the default optimiser is plain SGD without momentum or
    weight decay: each update is a multiple of the loss gradient, so a model
    linear in its parameters never leaves the span of its gradients.

    With one seed per model, model ``i`` draws its own stream (lengths and
    tokens) from ``seed[i]``: exactly the stream it would see trained alone
    with ``seed=seed[i]``, so an ensemble of data seeds trains in one batched
    step. The sequences of one step then differ in length; each is left-padded
    to the longest with the query token, whose value is zero in a
    :class:`~lengthgen_utils.core.models.KernelHead`, so padding changes no output
    and no gradient (the relative positions ``D = j - (L-1)`` of the real tokens stay the same).

    Args:
        model: e.g. :class:`~lengthgen_utils.core.models.KernelHead`; its outputs ``[M, B, V]`` are compared
            with one-hot targets. Per-model seeds need a ``KernelHead``.
        task, steps, batch_size, train_len, device: as in :func:`train`.
        optimizer: default ``OptimizerSettings("sgd", lr=0.05)``, plain SGD.
        seed: one int (every model sees the same stream), or one int per model.

    Returns:
        loss history ``[steps, M]`` (float32, CPU).

    Raises:
        ValueError / TypeError: bad sizes, a seed list whose length is not ``M`` (the package's one
            per-model check, :func:`~lengthgen_utils._validate.per_model_ints`), different per-model
            seeds for a model other than a ``KernelHead``, or a device this machine cannot compute on.
            A call that fails leaves the model as it was (:func:`unchanged_on_failure`).
    """
    optimizer = _check_optimizer(optimizer, OptimizerSettings("sgd", lr=0.05))
    steps = check_int("steps", steps, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    seeds = per_model_ints("seed", seed, model.n_models, minimum=0)
    per_model = len(set(seeds)) > 1  # equal seeds draw equal streams: one shared stream is the same
    if per_model and not isinstance(model, KernelHead):
        raise TypeError(f"per-model seeds need a KernelHead (its query token has value zero, so "
                        f"left-padding is exact); got {type(model).__name__}")
    if not per_model:
        seeds = seeds[:1]
    tasks = as_task_list(task, model.n_models)
    if per_model and any(t != tasks[0] for t in tasks):
        raise ValueError("per-model seeds need one task shared by all models")
    for t in tasks:
        check_fits("train_len", train_len, t.check_seq_len)
    if not tasks[0].query_only:
        raise ValueError(f"train_squared_loss fits the single-head readout (one target, at the query); {tasks[0]!r} "
                         "scores other positions")
    min_len = max(t.min_seq_len for t in tasks)
    device = check_device(device)
    with model_threads(model, device), unchanged_on_failure(model):
        return _train_squared_loss_loop(model, tasks, seeds, per_model, optimizer, steps, batch_size, train_len,
                                        min_len, device)


def _train_squared_loss_loop(model, tasks, seeds, per_model, optimizer, steps, batch_size, train_len, min_len,
                             device) -> Tensor:
    """The loop of :func:`train_squared_loss`, on validated arguments."""
    model.to(device)
    gens = [generator(s) for s in seeds]
    opt = build_optimizer(model, optimizer)

    def batch_loss():
        batches = []
        for gen in gens:
            seq_len = int(torch.randint(min_len, train_len + 1, (1,), generator=gen))
            batches.append(tasks[0].sample(batch_size, seq_len, gen, "cpu")[0])  # lengths checked before the loop
        if per_model:
            longest = max(b.shape[1] for b in batches)
            targets = torch.stack([tasks[0]._targets_at(b)[:, -1] for b in batches]).to(device)  # [M, B]
            # the padding token is the query token V, whose value in a KernelHead is zero
            tokens = torch.stack([F.pad(b, (longest - b.shape[1], 0), value=model.vocab_size)
                                  for b in batches]).to(device)  # [M, B, longest]
        else:
            tokens = batches[0].to(device)
            targets = query_targets(tasks, tokens)
        outputs, _ = model(tokens)  # tokens the task sampled (and query-token padding): valid
        return ensemble_squared_error(outputs, targets)

    return _run_steps(model, opt, batch_loss, steps, device, progress=False)


# --- full-sequence training (chapter 7)
def sequence_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Per-model mean cross-entropy over *defined* positions only.

    Args:
        logits: ``[M, B, L, V]``.
        targets: ``[B, L]`` with ``IGNORE_INDEX`` where the task defines no target.

    Returns:
        ``[M]``: each model's loss averaged over the scored positions (padding and
        undefined positions never count).

    The loss of every step of :func:`train_sequence`, which checked that its length has a scored position
    (``task.check_seq_len``): ``targets`` must hold at least one (else the mean is NaN). It is not checked
    here, which would read the count back to the host, a synchronisation per step on a GPU.
    """
    m, b, seq_len, v = logits.shape
    flat_targets = targets.expand(m, b, seq_len).reshape(-1)
    loss = F.cross_entropy(logits.reshape(-1, v), flat_targets, ignore_index=IGNORE_INDEX, reduction="none")
    return loss.view(m, b * seq_len).sum(1) / (targets != IGNORE_INDEX).sum()


def train_sequence(model, task, optimizer: OptimizerSettings | None = None, steps: int = 1500,
                   batch_size: int = 64, train_len: int = 32, seed: int = 0, device=None,
                   progress: bool | None = None, min_train_len: int | None = None) -> Tensor:
    """Train a transformer ensemble on a full-sequence task (by default with AdamW, lr 1e-3, weight decay 0.05).

    The book trains :class:`~lengthgen_utils.core.fast.FastTransformer` (what
    :func:`~lengthgen_utils.run.runners.build_transformer` builds); the readable
    :class:`~lengthgen_utils.core.models.Transformer` trains the same way, to the same losses up to rounding.

    Every batch has length ``train_len`` (or, with ``min_train_len``, one length per step drawn uniformly
    from the lengths in ``[min_train_len, train_len]`` the task accepts, the whole batch sharing it) and is
    placed at the positions the model's encoding draws (``train_positions``: ``0 .. L-1`` unless the
    encoding randomises them, as in :func:`train`); the loss is the sum over models of each model's mean
    cross-entropy over defined positions (models stay independent).

    Args:
        model: a ``FastTransformer`` or ``Transformer`` (any ``n_models``).
        task: a full-sequence task (``DelayedCopy``, ``LaggedSum``, ``RunningParity``).
        optimizer: default ``OptimizerSettings("adamw", lr=1e-3, weight_decay=0.05)`` (chapter 7's recipe; the
            decay spares LayerNorm scales and biases, :func:`~lengthgen_utils.run.optim.decays`). AdamW runs
            torch's fused kernel on CPU and CUDA.
        steps, batch_size: optimisation settings (chapter 7's defaults).
        train_len: training sequence length.
        seed: seeds the data stream.
        device: defaults to :func:`default_device`.
        progress: progress bar; ``None`` shows one for runs of 1000+ steps.
        min_train_len: ``None`` (every batch at ``train_len``, the stream of chapter 7) or the shortest
            training length: each step then draws its length from the task's valid lengths in
            ``[min_train_len, train_len]`` (for :class:`~lengthgen_utils.core.tasks.Copy`, the odd ones:
            halves ``n`` from ``(min_train_len - 1) // 2`` up), as chapter 8's copy over several lengths does.

    Returns:
        loss history ``[steps, M]`` on CPU.

    Raises:
        ValueError / TypeError: a size or rate out of range, a task whose vocabulary is not the model's, or
            a device this machine cannot compute on. A call that fails leaves the model as it was
            (:func:`unchanged_on_failure`).
    """
    optimizer = _check_optimizer(optimizer, OptimizerSettings("adamw", lr=1e-3, weight_decay=0.05))
    steps = check_int("steps", steps, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    train_len = check_fits("train_len", train_len, shared_task(task).check_seq_len)
    if task.n_tokens != model.config.vocab_size:
        raise ValueError(f"task input vocabulary {task.n_tokens} differs from model vocab_size={model.config.vocab_size}")
    # every position training can visit, checked before the first step
    model.check_positions(torch.arange(model.encoding.visited_positions(train_len)))
    if min_train_len is not None:
        check_int("min_train_len", min_train_len, minimum=task.min_seq_len, maximum=train_len)
    lengths = [train_len] if min_train_len is None else task.valid_lengths(min_train_len, train_len)
    device = check_device(device)
    with model_threads(model, device), unchanged_on_failure(model):
        return _train_sequence_loop(model, task, optimizer, steps, batch_size, lengths, seed, device, progress)


def _train_sequence_loop(model, task, optimizer, steps, batch_size, lengths, seed, device, progress) -> Tensor:
    """The loop of :func:`train_sequence`, on validated arguments (``lengths``: the lengths to draw from)."""
    model.to(device)
    model.train()
    gen = generator(seed)
    opt = build_optimizer(model, optimizer, fused=optimizer.name == "adamw" and device.type in ("cpu", "cuda"))  # one kernel
    # per parameter instead of about ten

    def batch_loss():
        # one length: no draw, so chapter 7's stream is what it was before lengths could vary
        seq_len = lengths[0] if len(lengths) == 1 else lengths[int(torch.randint(len(lengths), (1,), generator=gen))]
        positions = model.encoding.train_positions(seq_len, gen)  # None: 0 .. L-1 (randomised encodings differ)
        tokens, targets = task.sample(batch_size, seq_len, gen, device)  # the lengths were checked before the loop
        return sequence_cross_entropy(model(tokens, positions=positions), targets)

    history = _run_steps(model, opt, batch_loss, steps, device,
                         progress=bool(progress or (progress is None and steps >= 1000)))
    model.eval()
    return history
