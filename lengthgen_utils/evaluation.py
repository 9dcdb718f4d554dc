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


@torch.no_grad()
def squared_error_by_length(model, task, lengths, n_samples: int = 1024, seed: int = 12345) -> Tensor:
    """Per-model mean squared loss ``||o - e(y)||^2`` of a model with outputs ``[M, B, V]`` at each length.

    For the linear-readout models of chapter 6 (e.g. :class:`~lengthgen_utils.models.KernelHead`);
    fresh sequences per length from ``seed``, shared by all models.

    Returns:
        float64 ``[M, len(lengths)]`` on CPU.
    """
    from .training import ensemble_squared_error

    lengths = check_int_sequence("lengths", lengths, minimum=2)
    n_samples = check_int("n_samples", n_samples, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    tasks = as_task_list(task, model.n_models)
    gen = torch.Generator().manual_seed(seed)
    out = torch.zeros(model.n_models, len(lengths), dtype=torch.float64)
    for col, seq_len in enumerate(lengths):
        tokens, _ = tasks[0].sample(n_samples, seq_len, gen, device=model.device)
        outputs, _ = model(tokens)
        out[:, col] = ensemble_squared_error(outputs.double(), batch_targets(tasks, tokens)).cpu()
    return out
