"""Accuracy and attention statistics by sequence length."""
from __future__ import annotations

import torch
from torch import Tensor

from ._validate import check_int, check_int_sequence
from .training import as_task_list, batch_targets


@torch.no_grad()
def accuracy_by_length(model, task, lengths, n_samples: int = 1024, seed: int = 12345,
                       batch_size: int = 1024) -> Tensor:
    """Per-model accuracy of the query readout at each evaluation length.

    Every length gets ``n_samples`` fresh sequences from a generator seeded by
    ``seed`` (independent of the training stream), shared by all models.

    Args:
        model: a :class:`~lengthgen_utils.models.RetrievalHead` ensemble of M models.
        task: one task, or one per model (see :func:`~lengthgen_utils.training.train`).
        lengths: sequence of evaluation lengths, each valid for every task (and
            within the APE table, else ``ValueError``).
        n_samples: sequences per length, >= 1.
        seed: evaluation seed.
        batch_size: sequences per forward pass (memory only; results do not depend on it).

    Returns:
        float64 tensor ``[M, len(lengths)]`` of accuracies in [0, 1], on CPU.
    """
    lengths = check_int_sequence("lengths", lengths, minimum=2)
    n_samples = check_int("n_samples", n_samples, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    tasks = as_task_list(task, model.n_models)
    for seq_len in lengths:
        for t in tasks:
            t.check_seq_len(seq_len)
        if getattr(model, "ape", None) is not None:
            model.ape.check_length(torch.arange(seq_len))
    gen = torch.Generator().manual_seed(seed)
    out = torch.zeros(model.n_models, len(lengths), dtype=torch.float64)
    for col, seq_len in enumerate(lengths):
        correct = torch.zeros(model.n_models, dtype=torch.float64)
        for start in range(0, n_samples, batch_size):
            tokens, _ = tasks[0].sample(min(batch_size, n_samples - start), seq_len, gen, device=model.device)
            logits, _ = model(tokens)
            correct += (logits.argmax(-1) == batch_targets(tasks, tokens)).sum(1).double().cpu()
        out[:, col] = correct / n_samples
    return out


# --- full-sequence tasks (chapter 7)
@torch.no_grad()
def token_accuracy_by_position(model, task, seq_len: int, n_samples: int = 256, seed: int = 12345,
                               batch_size: int = 64) -> tuple[Tensor, Tensor]:
    """Per-model, per-position token accuracy on a full-sequence task.

    Args:
        model: a ``Transformer`` ensemble of M models.
        task: a full-sequence task.
        seq_len: evaluation length L.
        n_samples: sequences, >= 1.
        seed: evaluation seed.
        batch_size: sequences per forward pass (memory only).

    Returns:
        ``accuracy [M, L]`` (NaN exactly at positions the task never scores) and
        ``counts [L]`` (scored tokens per position), both float64 on CPU.
    """
    from .tasks import IGNORE_INDEX

    n_samples = check_int("n_samples", n_samples, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    task.check_seq_len(seq_len)
    if getattr(model, "ape", None) is not None:
        model.ape.check_length(torch.arange(seq_len))
    gen = torch.Generator().manual_seed(check_int("seed", seed, minimum=0))
    correct = torch.zeros(model.n_models, seq_len, dtype=torch.float64)
    counts = torch.zeros(seq_len, dtype=torch.float64)
    for start in range(0, n_samples, batch_size):
        tokens, targets = task.sample(min(batch_size, n_samples - start), seq_len, gen, device=model.device)
        scored = targets != IGNORE_INDEX
        hits = (model(tokens).argmax(-1) == targets) & scored
        correct += hits.sum(1).double().cpu()
        counts += scored.sum(0).double().cpu()
    acc = correct / counts
    acc[:, counts == 0] = float("nan")
    return acc, counts


def split_accuracy(accuracy: Tensor, counts: Tensor, train_len: int) -> tuple[Tensor, Tensor]:
    """Token accuracy inside (positions ``< train_len``) and beyond the training length.

    Args:
        accuracy: ``[M, L]`` from :func:`token_accuracy_by_position`.
        counts: ``[L]`` scored tokens per position.
        train_len: the training length.

    Returns:
        ``inside [M]`` and ``outside [M]``, count-weighted means (NaN when a side has no scored token).
    """
    train_len = check_int("train_len", train_len, minimum=1)
    inside = torch.arange(accuracy.shape[-1]) < train_len
    weighted = torch.nan_to_num(accuracy) * counts

    def mean(sel):
        total = counts[sel].sum()
        return weighted[:, sel].sum(1) / total if total > 0 else torch.full((accuracy.shape[0],), float("nan"))

    return mean(inside), mean(~inside)
