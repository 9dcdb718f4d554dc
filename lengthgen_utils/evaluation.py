"""Accuracy and attention statistics by sequence length."""
from __future__ import annotations

import torch
from torch import Tensor

import numbers

from ._validate import check_int, check_int_sequence, check_positive_float
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


@torch.no_grad()
def target_attention_mass(model, offset, lengths) -> Tensor:
    """Measured attention weight of the query on the target key ``L-1-k`` at each length.

    Reads the attention row the model's forward pass uses (for position-only
    heads it is the same for every sequence of a length).

    Args:
        model: a softmax :class:`~lengthgen_utils.models.RetrievalHead` ensemble of M models.
        offset: the target offset k (int, or M ints, one per model).
        lengths: evaluation lengths, each ``>= k + 2``.

    Returns:
        float64 ``[M, len(lengths)]`` in [0, 1].
    """
    lengths = check_int_sequence("lengths", lengths, minimum=2)
    if isinstance(offset, numbers.Integral) and not isinstance(offset, bool):
        offsets = [offset] * model.n_models
    else:
        offsets = list(check_int_sequence("offset", offset, minimum=1))
    if len(offsets) != model.n_models:
        raise ValueError(f"offset must be one int or {model.n_models} ints; got {len(offsets)}")
    offsets = [check_int("offset", k, minimum=1) for k in offsets]
    out = torch.empty(model.n_models, len(lengths), dtype=torch.float64)
    rows = torch.arange(model.n_models)
    for col, seq_len in enumerate(lengths):
        if seq_len < max(offsets) + 2:
            raise ValueError(f"lengths[{col}]={seq_len} is too short for offset {max(offsets)} (needs >= {max(offsets) + 2})")
        attn = model.attention_row(seq_len).double().cpu()
        out[:, col] = attn[rows, torch.tensor([seq_len - 1 - k for k in offsets])]
    return out


@torch.no_grad()
def accuracy_with_logit_scale(model, task, lengths, logit_scale, n_samples: int = 1024, seed: int = 12345) -> Tensor:
    """Accuracy when every attention logit at length ``L`` is multiplied by ``logit_scale[L]``.

    A test-time, length-aware temperature (softmax heads only): the attention row
    becomes ``softmax(c_L s)``; the value path is the model's own.

    Returns:
        float64 ``[M, len(lengths)]``.
    """
    lengths = check_int_sequence("lengths", lengths, minimum=2)
    n_samples = check_int("n_samples", n_samples, minimum=1)
    if isinstance(logit_scale, (str, bytes)) or not hasattr(logit_scale, "__iter__"):
        raise TypeError(f"logit_scale must be a sequence of positive numbers; got {type(logit_scale).__name__}")
    scales = [check_positive_float(f"logit_scale[{i}]", c) for i, c in enumerate(logit_scale)]
    if len(scales) != len(lengths):
        raise ValueError(f"logit_scale must have one entry per length ({len(lengths)}); got {len(scales)}")
    if model.config.attention != "softmax":
        raise ValueError(f"accuracy_with_logit_scale needs a softmax head; got attention={model.config.attention!r}")
    tasks = as_task_list(task, model.n_models)
    gen = torch.Generator().manual_seed(check_int("seed", seed, minimum=0))
    out = torch.empty(model.n_models, len(lengths), dtype=torch.float64)
    table = model.value_table()
    m, n_tokens = model.n_models, model.config.vocab_size + 1
    for col, (seq_len, c) in enumerate(zip(lengths, scales)):
        for t in tasks:
            t.check_seq_len(seq_len)
        attn = (float(c) * model.scores(seq_len)).softmax(-1)  # [M, L]
        tokens, _ = tasks[0].sample(n_samples, seq_len, gen, device=model.device)
        weights = torch.zeros(m, n_samples, n_tokens, device=model.device, dtype=attn.dtype)
        weights.scatter_add_(2, tokens.expand(m, -1, -1), attn[:, None, :].expand(m, n_samples, seq_len))
        logits = torch.bmm(weights, table)
        out[:, col] = (logits.argmax(-1) == batch_targets(tasks, tokens)).double().mean(1).cpu()
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
    with cpu_threads(default_cpu_threads() if model.device.type == "cpu" else None):
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
