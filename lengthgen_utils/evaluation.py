"""Accuracy and attention statistics by sequence length."""
from __future__ import annotations

import torch
from torch import Tensor

from ._validate import check_int, check_int_sequence
from .training import as_task_list, batch_targets, cpu_threads, default_cpu_threads


@torch.no_grad()
def accuracy_by_length(model, task, lengths, n_samples: int = 1024, seed: int = 12345,
                       batch_size: int = 1024, num_threads: int | None = None) -> Tensor:
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
        num_threads: intra-op CPU threads when the model is on the CPU; default
            :func:`~lengthgen_utils.training.default_cpu_threads`.

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
    if model.device.type == "cpu":
        with cpu_threads(default_cpu_threads() if num_threads is None else num_threads):
            return _accuracy_loop(model, tasks, lengths, n_samples, seed, batch_size)
    return _accuracy_loop(model, tasks, lengths, n_samples, seed, batch_size)


def _accuracy_loop(model, tasks, lengths, n_samples, seed, batch_size) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    out = torch.zeros(model.n_models, len(lengths), dtype=torch.float64)
    for col, seq_len in enumerate(lengths):
        correct = torch.zeros(model.n_models, dtype=torch.long, device=model.device)  # counts stay on the device
        for start in range(0, n_samples, batch_size):
            tokens, _ = tasks[0].sample(min(batch_size, n_samples - start), seq_len, gen, device=model.device)
            logits, _ = model(tokens, validate=False)  # sampled from the task: valid by construction
            correct += (logits.argmax(-1) == batch_targets(tasks, tokens)).sum(1)
        out[:, col] = correct.cpu().double() / n_samples
    return out
