"""Training loop for ensembles: one optimiser step updates every model of the ensemble.

The loss is the *sum* over models of each model's mean cross-entropy, and
Adam(W) acts elementwise, so model ``i`` receives exactly the update it would
receive if trained alone on the same batches (no coupling through the loss
scale, no global gradient clipping).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ._validate import check_int, check_positive_float


def default_device() -> torch.device:
    """CUDA when available, else the CPU (everything in the book runs on CPU)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def as_task_list(task, n_models: int) -> list:
    """Normalise ``task`` (one task, or one per model) to a list of ``n_models`` tasks with one vocabulary."""
    tasks = list(task) if isinstance(task, Sequence) else [task] * n_models
    if len(tasks) != n_models:
        raise ValueError(f"task must be one task or a sequence of n_models={n_models} tasks; got {len(tasks)}")
    vocab = {t.vocab_size for t in tasks}
    if len(vocab) != 1:
        raise ValueError(f"all tasks of one ensemble must share vocab_size; got {sorted(vocab)}")
    return tasks


def batch_targets(tasks: list, tokens: Tensor) -> Tensor:
    """Targets ``[M, B]`` for an ensemble whose model ``i`` solves ``tasks[i]`` on the shared ``tokens [B, L]``."""
    if all(t == tasks[0] for t in tasks):
        return tasks[0].targets(tokens).expand(len(tasks), -1)
    return torch.stack([t.targets(tokens) for t in tasks])


def ensemble_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Per-model mean cross-entropy: ``logits [M, B, V]``, ``targets [M, B]`` -> ``[M]``."""
    m, b, v = logits.shape
    return F.cross_entropy(logits.reshape(m * b, v), targets.reshape(m * b), reduction="none").view(m, b).mean(1)


def train(model, task, steps: int = 2000, batch_size: int = 256, lr: float = 1e-2, train_len: int = 16,
          fixed_length: bool = False, weight_decay: float = 0.0, seed: int = 0, device=None,
          progress: bool | None = None, callback=None) -> Tensor:
    """Train an ensemble on the fixed-offset retrieval task with Adam(W).

    Each step draws one batch at a single length: ``train_len`` when
    ``fixed_length``, else uniform in ``[min_seq_len, train_len]`` (the whole
    batch shares a length, so the attention row is computed once).

    Args:
        model: a :class:`~lengthgen_utils.models.RetrievalHead` (any ``n_models``).
        task: a task with ``sample``/``targets``, or a sequence of one task per model
            (e.g. different offsets), all with the same ``vocab_size``.
        steps: optimiser steps, >= 1.
        batch_size: sequences per step (shared by all models).
        lr: Adam learning rate.
        train_len: longest training length L_train.
        fixed_length: train only at ``train_len``.
        weight_decay: decoupled weight decay (AdamW); 0 gives plain Adam.
        seed: seeds the data stream (lengths and tokens); model seeds live in the model.
        device: defaults to :func:`default_device`.
        progress: show a progress bar; ``None`` shows one for runs of 5000+ steps.
        callback: ``None``, or a callable ``callback(step, loss)`` run after every step with the
            1-based step number and the models' losses ``[M]`` (detached), e.g. to drive a progress widget.

    Returns:
        loss history ``[steps, M]`` (float32, on CPU): each model's training loss per step.

    Raises:
        ValueError / TypeError: a size or rate out of range, or ``train_len`` too short for an offset.
    """
    steps = check_int("steps", steps, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    lr = check_positive_float("lr", lr)
    weight_decay = check_positive_float("weight_decay", weight_decay, allow_zero=True)
    seed = check_int("seed", seed, minimum=0)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be None or callable; got {type(callback).__name__} {callback!r}")
    tasks = as_task_list(task, model.n_models)
    for t in tasks:
        t.check_seq_len(train_len)
    if tasks[0].vocab_size != model.config.vocab_size:
        raise ValueError(f"task vocab_size={tasks[0].vocab_size} differs from model vocab_size={model.config.vocab_size}")
    min_len = max(t.min_seq_len for t in tasks)
    device = torch.device(device) if device is not None else default_device()
    model.to(device)
    model.train()
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    history = torch.empty(steps, model.n_models, device=device)
    bar = None
    if progress or (progress is None and steps >= 5000):
        from tqdm.auto import tqdm
        bar = tqdm(total=steps, desc="training", leave=False)
    for step in range(steps):
        seq_len = train_len if fixed_length else int(torch.randint(min_len, train_len + 1, (1,), generator=gen))
        tokens, _ = tasks[0].sample(batch_size, seq_len, gen)
        tokens = tokens.to(device)
        logits, _ = model(tokens)
        loss = ensemble_cross_entropy(logits, batch_targets(tasks, tokens))
        opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        opt.step()
        history[step] = loss.detach()
        if callback is not None:
            callback(step + 1, history[step])
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    model.eval()
    return history.float().cpu()
