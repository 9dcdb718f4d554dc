"""Analyses of trained models: offset profiles, equivariance, carriers, pinning."""
from __future__ import annotations

import torch
from torch import Tensor

from ._validate import check_int


# --- transformer heads (chapter 7)
@torch.no_grad()
def head_offset_profiles(model, task, seq_len: int, n_samples: int = 64, seed: int = 999,
                         min_query: int | None = None) -> tuple[Tensor, Tensor]:
    """Each head's mean attention logit and mean attention weight as a function of offset.

    For every query position ``i >= min_query`` and key ``j <= i``, the offset is
    ``D = j - i`` (0 = the query itself, -k = k tokens back). Logits and weights are
    averaged over queries and over random sequences (i.e. over content).

    Args:
        model: a ``Transformer`` ensemble.
        task: the task whose sequences are fed (content distribution).
        seq_len: length of the probe sequences.
        n_samples: probe sequences.
        seed: probe seed.
        min_query: smallest query position averaged (default ``seq_len // 2``, so every
            averaged query sees at least ``seq_len // 2`` keys).

    Returns:
        ``logit [M, n_layers, n_heads, seq_len]`` and ``weight`` of the same shape, where
        index ``d`` holds offset ``D = -d`` (only offsets ``-d`` with ``d <= seq_len - 1 - min_query``
        are averaged over all queries; larger ``d`` are NaN).
    """
    seq_len = task.check_seq_len(seq_len)
    min_query = seq_len // 2 if min_query is None else check_int("min_query", min_query, 0, seq_len - 1)
    tokens, _ = task.sample(check_int("n_samples", n_samples, minimum=1), seq_len,
                            torch.Generator().manual_seed(seed), device=model.device)
    scores = model.head_scores(tokens)  # list of [M, B, H, L, L]
    queries = torch.arange(min_query, seq_len)
    max_back = min_query  # every query >= min_query has keys back to offset -min_query
    logit = torch.full((model.n_models, len(scores), model.n_heads, seq_len), float("nan"), dtype=torch.float64)
    weight = logit.clone()
    for layer, s in enumerate(scores):
        w = s.softmax(-1)
        for d in range(max_back + 1):
            keys = queries - d
            logit[:, layer, :, d] = s[..., queries, keys].double().mean((1, 3)).cpu()
            weight[:, layer, :, d] = w[..., queries, keys].double().mean((1, 3)).cpu()
    return logit, weight


@torch.no_grad()
def shift_invariance(model, tokens: Tensor, shifts=(1, 1000, 100000)) -> dict:
    """Largest change of the model's output logits when every position is shifted.

    Args:
        model: a model whose ``forward(tokens, position_shift)`` returns logits.
        tokens: probe batch.
        shifts: global position shifts to try.

    Returns:
        ``{shift: max |logits(shift) - logits(0)|}`` (floats).
    """
    base = model(tokens)
    base = base[0] if isinstance(base, tuple) else base
    out = {}
    for shift in shifts:
        shifted = model(tokens, position_shift=shift)
        shifted = shifted[0] if isinstance(shifted, tuple) else shifted
        out[shift] = float((shifted - base).abs().max())
    return out
