"""Chapter 1, the retrieval task: which RoPE seeds fail at 8x and 16x, predicted before the long run.

The committed predictions (:mod:`~lengthgen_utils.analysis.predictions`, read from the file) give every
distance at which a head with the book's frequency set can alias. Which of them a given head does alias
at depends on its weights; reading the head's kernel at those few distances, without any long sequence,
says which seeds will fail and at which length.
"""
from __future__ import annotations

import torch

from ..analysis import predictions
from ..analysis.kernel import carrier_spectrum, kernel_at
from ..analysis.rates import permutation_p


def committed_failures(model, offsets, lengths, accuracy, train_len: int, d_head: int, base: float = 1e4,
                       tolerance: float = 1.0, threshold: float = 0.95, n_null: int = 2000,
                       seed: int = 0) -> dict:
    """Each head's first failing length, predicted from the committed candidates, against the measured one.

    For head ``i`` with offset ``k``: the committed candidate distances ``d`` (those a sequence of at most
    ``max(lengths)`` tokens holds, ``d + 1 <= max(lengths)``) are read from the file; the first of them at
    which the head's kernel, computed from its weights, is within ``tolerance`` nats of its target logit
    (chapter 4's alias criterion) is its predicted alias, and the first evaluated length ``L >= d + 1``
    its predicted first failing length (None: the head is predicted to hold at every evaluated length).

    Args:
        model: a RoPE retrieval-head ensemble (M heads).
        offsets: the offset of each head (M ints).
        lengths: the evaluated lengths (tokens, increasing); accuracy: ``[M, n]`` (fraction).
        train_len, d_head, base: the heads' settings (a row of the committed file).
        tolerance: nats below the target that count as an alias.
        threshold: accuracy below which a head counts as failing at a length.
        n_null, seed: the permutation null (see Returns).

    Returns:
        a dict: ``predicted`` and ``measured`` (per head, a length or None), ``earliest`` (per head, the
        committed first failing length, from the frequency set alone), ``agree`` (per head, predicted ==
        measured), and ``null_agree`` ``[n_null]``: the share of heads whose predicted length equals the
        measured length of a randomly permuted head (a predictor that knows how many heads fail at each
        length, but not which), and ``p``: the one-sided permutation p-value of the heads' agreement against
        that null (:func:`~lengthgen_utils.analysis.rates.permutation_p`).

    Raises:
        KeyError: the committed file has no row for these settings.
        ValueError: ``accuracy`` is not ``[M, len(lengths)]``.

    Source: chapter 1, "Checks"; the rule of :mod:`~lengthgen_utils.analysis.predictions`.
    """
    lengths = [int(L) for L in lengths]
    acc = torch.as_tensor(accuracy)
    ks = [int(k) for k in offsets]
    if acc.dim() != 2 or acc.shape != (len(ks), len(lengths)):
        raise ValueError(f"accuracy must be [M = {len(ks)}, {len(lengths)}]; got {tuple(acc.shape)}")
    spec = carrier_spectrum(model)
    predicted, earliest = [], []
    for i, k in enumerate(ks):
        row = predictions.load_prediction("single head", base, d_head, k, train_len)
        earliest.append(row["first_failing_length"])
        candidates = [d for d in row["distances"] if d + 1 <= max(lengths)]
        alias = None
        if candidates:
            head = spec.select([i])
            values = kernel_at(head, [-d for d in candidates])[0]
            target = kernel_at(head, [-k])[0, 0]
            hits = torch.nonzero(values >= target - tolerance)
            alias = candidates[int(hits[0, 0])] if hits.numel() else None
        predicted.append(None if alias is None else next(L for L in lengths if L >= alias + 1))
    measured = [next((L for L, a in zip(lengths, row.tolist()) if a < threshold), None) for row in acc]
    agree = [p == m for p, m in zip(predicted, measured)]
    g = torch.Generator().manual_seed(seed)
    null = torch.tensor([sum(p == measured[j] for p, j in zip(predicted, torch.randperm(len(ks), generator=g)
                                                                   .tolist())) / len(ks) for _ in range(n_null)])
    p = permutation_p(sum(agree) / len(agree), null)
    return dict(predicted=predicted, measured=measured, earliest=earliest, agree=agree, null_agree=null, p=p)
