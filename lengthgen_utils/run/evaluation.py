"""Accuracy and attention statistics by sequence length, read through the task protocol.

Every function draws fresh sequences from its own generator (seeded independently of
training), shared by all models of an ensemble, so models are compared on the same data.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .._validate import check_int, check_int_sequence, check_nonempty, check_positive_float, per_model_ints
from ..core.models import SingleHead, diverged_models_allowed
from ..core.tasks import IGNORE_INDEX, as_task_list, query_targets, shared_task
from ..core.seeding import generator
from .training import ensemble_squared_error, model_threads


def _scales(logit_scale, n_lengths: int) -> list[float]:
    if logit_scale is None:
        return [1.0] * n_lengths
    if isinstance(logit_scale, (str, bytes)) or not hasattr(logit_scale, "__iter__"):
        raise TypeError(f"logit_scale must be a sequence of positive numbers, one per length; "
                        f"got {type(logit_scale).__name__}")
    scales = [check_positive_float(f"logit_scale[{i}]", c) for i, c in enumerate(logit_scale)]
    if len(scales) != n_lengths:
        raise ValueError(f"logit_scale must have one entry per length ({n_lengths}); got {len(scales)}")
    return scales


@torch.no_grad()
def accuracy_by_length(model, task, lengths, n_samples: int = 1024, seed: int = 12345,
                       batch_size: int = 1024, logit_scale=None) -> Tensor:
    """Per-model accuracy of the query readout at each evaluation length.

    Every length gets ``n_samples`` fresh sequences from a generator seeded by
    ``seed`` (independent of the training stream), shared by all models.

    Args:
        model: a single-query model (:class:`~lengthgen_utils.core.models.RetrievalHead` or
            :class:`~lengthgen_utils.core.models.KernelHead`) ensemble of M models.
        task: one query-only task, or one per model (see :func:`~lengthgen_utils.run.training.train`).
        lengths: sequence of evaluation lengths, each valid for every task (and
            covered by the model's encoding, e.g. within an APE table, else ``ValueError``).
        n_samples: sequences per length, >= 1.
        seed: evaluation seed.
        batch_size: sequences per forward pass (memory only; results do not depend on it).
        logit_scale: None, or one positive factor per length multiplying every attention logit
            (a test-time, length-aware temperature; softmax heads; chapter 5).

    Returns:
        float64 tensor ``[M, len(lengths)]`` of accuracies in [0, 1], on CPU.

    Raises:
        TypeError / ValueError: bad sizes, a length too short for a task or beyond the encoding's range.
    """
    lengths = check_int_sequence("lengths", lengths, minimum=2)
    n_samples = check_int("n_samples", n_samples, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    scales = _scales(logit_scale, len(lengths))
    tasks = as_task_list(task, model.n_models)
    for seq_len in lengths:
        for t in tasks:
            t.check_seq_len(seq_len)
        model.check_positions(torch.arange(seq_len))
    with model_threads(model), diverged_models_allowed(model):  # a diverged model scores as class 0
        gen = generator(seed)
        out = torch.zeros(model.n_models, len(lengths), dtype=torch.float64)
        for col, (seq_len, scale) in enumerate(zip(lengths, scales)):
            correct = torch.zeros(model.n_models, dtype=torch.long, device=model.device)  # counts stay on the device
            for start in range(0, n_samples, batch_size):
                tokens, _ = tasks[0].sample(min(batch_size, n_samples - start), seq_len, gen, model.device)  # checked
                kwargs = {} if scale == 1.0 else {"logit_scale": scale}
                logits, _ = model(tokens, **kwargs)  # sampled from the task: valid by construction
                correct += (logits.argmax(-1) == query_targets(tasks, tokens)).sum(1)
            out[:, col] = correct.cpu().double() / n_samples
    return out


@torch.no_grad()
def target_attention_mass(model, offset, lengths) -> Tensor:
    """Attention weight of the query on the target key ``L-1-k`` at each length.

    Reads the attention row the model's forward pass uses (for position-only
    heads it is the same for every sequence of a length).

    Args:
        model: a :class:`~lengthgen_utils.core.models.RetrievalHead` ensemble of M models.
        offset: the target offset k (int, or M ints, one per model).
        lengths: evaluation lengths, each ``>= k + 2``.

    Returns:
        float64 ``[M, len(lengths)]`` (a fraction in [0, 1] for softmax heads), on CPU.

    Raises:
        ValueError / TypeError: a length too short for an offset; offsets not one or M ints.
    """
    lengths = check_int_sequence("lengths", lengths, minimum=2)
    offsets = torch.tensor(per_model_ints("offset", offset, model.n_models, minimum=1))
    out = torch.empty(model.n_models, len(lengths), dtype=torch.float64)
    rows = torch.arange(model.n_models)
    for col, seq_len in enumerate(lengths):
        if seq_len < int(offsets.max()) + 2:
            raise ValueError(f"lengths[{col}]={seq_len} is too short for offset {int(offsets.max())} "
                             f"(needs >= {int(offsets.max()) + 2})")
    with model_threads(model):
        for col, seq_len in enumerate(lengths):
            attn = model.attention_row(seq_len).double().cpu()
            out[:, col] = attn[rows, seq_len - 1 - offsets]
    return out


@torch.no_grad()
def squared_error_by_length(model, task, lengths, n_samples: int = 1024, seed: int = 12345) -> Tensor:
    """Per-model mean squared loss ``||o - e(y)||^2`` of a model with outputs ``[M, B, V]`` at each length.

    For the linear-readout models of chapter 6 (e.g. :class:`~lengthgen_utils.core.models.KernelHead`);
    fresh sequences per length from ``seed``, shared by all models.

    Returns:
        float64 ``[M, len(lengths)]`` on CPU.
    """
    lengths = check_int_sequence("lengths", lengths, minimum=2)
    n_samples = check_int("n_samples", n_samples, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    tasks = as_task_list(task, model.n_models)
    gen = generator(seed)
    out = torch.zeros(model.n_models, len(lengths), dtype=torch.float64)
    with model_threads(model):
        for col, seq_len in enumerate(lengths):
            tokens, _ = tasks[0].sample(n_samples, seq_len, gen, device=model.device)  # checks seq_len
            outputs, _ = model(tokens)
            out[:, col] = ensemble_squared_error(outputs.double(), query_targets(tasks, tokens)).cpu()
    return out


# ---------------------------------------------------------------- full-sequence tasks (chapters 7-9)
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
    n_samples = check_int("n_samples", n_samples, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    seq_len = shared_task(task).check_seq_len(seq_len)
    model.check_positions(torch.arange(seq_len))
    gen = generator(check_int("seed", seed, minimum=0))
    correct = torch.zeros(model.n_models, seq_len, dtype=torch.float64)
    counts = torch.zeros(seq_len, dtype=torch.float64)
    with model_threads(model):
        for start in range(0, n_samples, batch_size):
            tokens, targets = task.sample(min(batch_size, n_samples - start), seq_len, gen, model.device)  # checked
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

    Raises:
        ValueError / TypeError: ``accuracy`` not ``[M, L]`` with ``M, L >= 1``, ``counts`` not ``[L]``, or a
            ``train_len`` that is not an int >= 1.
    """
    train_len = check_int("train_len", train_len, minimum=1)
    if not isinstance(accuracy, Tensor) or accuracy.dim() != 2:
        raise ValueError(f"accuracy must be a tensor [M, L]; got {getattr(accuracy, 'shape', type(accuracy).__name__)}")
    check_nonempty("accuracy", accuracy, "[M, L]")
    if not isinstance(counts, Tensor) or tuple(counts.shape) != (accuracy.shape[1],):
        raise ValueError(f"counts must be a tensor [L = {accuracy.shape[1]}] (one count per position of accuracy); "
                         f"got {tuple(getattr(counts, 'shape', ()))}")
    inside = torch.arange(accuracy.shape[-1]) < train_len
    weighted = torch.nan_to_num(accuracy) * counts

    def mean(sel):
        total = counts[sel].sum()
        return weighted[:, sel].sum(1) / total if total > 0 else torch.full((accuracy.shape[0],), float("nan"))

    return mean(inside), mean(~inside)


@torch.no_grad()
def lag_agreement(model, task, seq_len: int, lag: int, min_position: int = 0, n_samples: int = 64,
                  seed: int = 12345) -> Tensor:
    """How often a full-sequence model predicts the token ``lag`` places back, at the task's scored positions.

    A diagnostic of the rule a model applies: on copying the first half (:class:`~lengthgen_utils.core.tasks.Copy`)
    trained at one length, the right offset grows with the length, and a model that still answers with
    the token ``lag`` back, the offset it was trained on, has learned a fixed-offset rule (chapter 8).

    Args:
        model: a ``Transformer`` ensemble of M models.
        task: a full-sequence task (its scored positions are the ones counted).
        seq_len: evaluation length L.
        lag: the distance back compared with, ``1 <= lag < L``.
        min_position: only positions ``t >= max(min_position, lag)`` count (e.g. the training length).
        n_samples, seed: fresh sequences.

    Returns:
        float64 ``[M]``: the fraction of counted positions where ``argmax`` of the logits is ``x_{t - lag}``.

    Raises:
        ValueError: no position is counted, or bad sizes.
    """
    seq_len = task.check_seq_len(seq_len)
    lag = check_int("lag", lag, minimum=1, maximum=seq_len - 1)
    min_position = check_int("min_position", min_position, minimum=0)
    positions = torch.nonzero(task._scored(seq_len)).flatten()  # seq_len checked above
    positions = positions[positions >= max(min_position, lag)]
    if positions.numel() == 0:
        raise ValueError(f"no scored position t >= max(min_position={min_position}, lag={lag}) at seq_len={seq_len}")
    model.check_positions(torch.arange(seq_len))  # before sampling: a length the encoding cannot cover is refused first
    tokens, _ = task.sample(check_int("n_samples", n_samples, minimum=1), seq_len,
                            generator(check_int("seed", seed, minimum=0)), device=model.device)
    with model_threads(model):
        predicted = model(tokens).argmax(-1)[:, :, positions]  # [M, B, P]
    return (predicted == tokens[None, :, positions - lag]).double().mean((1, 2)).cpu()


@torch.no_grad()
def attention_vote(model, task, lengths, n_samples: int = 512, seed: int = 4321, batch_size: int = 256) -> dict:
    """Each head's mean target mass and the accuracy of its attention's vote, on fresh sequences.

    A single head reads out ``sum_j a_j T[x_j]``. With the learned value table ``T`` replaced by the
    identity the readout is a *vote*: each token class collects the attention on the keys that hold it,
    and the head answers the class with the most. The vote is right for sure when ``p > 1/2``; the
    mean-field threshold ``p*`` of :func:`~lengthgen_utils.analysis.theory.critical_target_mass` is its
    limit when the distractors' weight is spread over infinitely many keys. The vote keeps each
    sequence's finite set of distractors.

    For every length, ``n_samples`` sequences are drawn from ``task`` (one generator seeded by ``seed``,
    shared by every head) and run through ``model``; with the query's attention ``a`` over the keys
    (one row per sequence for a head whose keys see tokens, the shared row otherwise):

    * target mass ``p = a_{L-1-k}``, averaged over the sequences;
    * the vote: class ``c`` collects ``sum_{j: x_j = c} a_j``; the vote is right when the target's token
      collects the most (ties to the lower class id, as ``argmax`` breaks them).

    The value table is not used: the vote is the readout with one-hot values (a single head's
    ``query_attention`` is its forward pass without the readout).

    Args:
        model: a single-query head ensemble of M heads (:class:`~lengthgen_utils.core.models.RetrievalHead`,
            :class:`~lengthgen_utils.core.models.ContentRetrievalHead`, :class:`~lengthgen_utils.core.models.KernelHead`).
        task: one query-only task, or one per head.
        lengths: evaluation lengths (tokens), each valid for every task and the model's encoding.
        n_samples: sequences per length (>= 1).
        seed: seed of the sequences (>= 0).
        batch_size: sequences per forward pass (memory only).

    Returns:
        ``{"target_mass": float64 [M, n], "vote_accuracy": float64 [M, n]}`` for the ``n`` lengths, on CPU.

    Raises:
        ValueError / TypeError: bad sizes, a length too short for a task or beyond the encoding.

    Source: chapter 5b, "What predicts accuracy" (the regime map).
    """
    lengths = check_int_sequence("lengths", lengths, minimum=2)
    n_samples = check_int("n_samples", n_samples, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    tasks = as_task_list(task, model.n_models)
    for seq_len in lengths:
        for t in tasks:
            t.check_seq_len(seq_len)
        model.check_positions(torch.arange(seq_len))
    m = model.n_models
    n_classes = model.config.vocab_size if hasattr(model, "config") else model.vocab_size  # KernelHead has no config
    offsets = torch.tensor([t.offset for t in tasks], device=model.device)
    mass = torch.zeros(m, len(lengths), dtype=torch.float64)
    vote = torch.zeros(m, len(lengths), dtype=torch.float64)
    gen = generator(seed)
    with model_threads(model):
        for col, seq_len in enumerate(lengths):
            for start in range(0, n_samples, batch_size):
                tokens, _ = tasks[0].sample(min(batch_size, n_samples - start), seq_len, gen, model.device)
                b = tokens.shape[0]
                # [M, B, L]; tokens drawn from the task. A single head's forward less its readout, which the vote
                # replaces
                attn = model.query_attention(tokens) if isinstance(model, SingleHead) else model(tokens)[1]
                target_pos = (seq_len - 1 - offsets)[:, None, None].expand(m, b, 1)
                mass[:, col] += attn.gather(2, target_pos)[..., 0].double().sum(1).cpu()
                votes = torch.zeros(m, b, n_classes + 1, dtype=attn.dtype, device=attn.device)
                votes.scatter_add_(2, tokens.expand(m, b, seq_len), attn)
                winner = votes[..., :n_classes].argmax(-1)  # the query token holds no class
                vote[:, col] += (winner == query_targets(tasks, tokens)).double().sum(1).cpu()
    return {"target_mass": mass / n_samples, "vote_accuracy": vote / n_samples}
