"""A length whose full attention would not fit in memory is refused before anything is allocated.

The readable :class:`~lengthgen_utils.core.models.Transformer` builds ``[M, B, H, L, L]`` scores and weights in
every layer; at 32,768 tokens and beyond it went straight to the allocator ("can't allocate 8589934592
bytes") or into swap. It, :class:`~lengthgen_utils.core.fast.FastTransformer` when it returns weights or
scores, and the evaluation helpers that run them refuse such a length through one check
(:func:`~lengthgen_utils.core.attention.check_attention_fits`), naming the length and the memory needed.
(``FastTransformer``'s plain forward pass computes attention with torch's fused kernel, which never holds an
``[L, L]`` map: it is not refused, and is not tested here, since at this length it runs for minutes.)
"""
from __future__ import annotations

import pytest
import torch

from lengthgen_utils.core import attention
from lengthgen_utils.core.fast import FastTransformer
from lengthgen_utils.core.models import Transformer
from lengthgen_utils.core.tasks import DelayedCopy
from lengthgen_utils.run.evaluation import lag_agreement, token_accuracy_by_position

LONG = 2**17  # 131,072 tokens: one [L, L] float32 map is 64 GiB, more than any machine the tests run on


def _small(cls):
    return cls(vocab_size=16, n_layers=1, n_heads=2, d_model=16, pe="rope", max_len=64, n_models=1)


@pytest.mark.parametrize("call", [
    lambda: _small(Transformer)(torch.zeros(1, LONG, dtype=torch.long)),
    lambda: _small(Transformer).head_scores(torch.zeros(1, LONG, dtype=torch.long)),
    lambda: _small(FastTransformer)(torch.zeros(1, LONG, dtype=torch.long), return_attention=True),
    lambda: _small(FastTransformer).head_scores(torch.zeros(1, LONG, dtype=torch.long)),
    lambda: token_accuracy_by_position(_small(Transformer), DelayedCopy(16, 5), LONG, n_samples=1, batch_size=1),
    lambda: lag_agreement(_small(Transformer), DelayedCopy(16, 5), LONG, lag=5, n_samples=1),
], ids=["Transformer", "Transformer.head_scores", "FastTransformer weights", "FastTransformer.head_scores",
        "token_accuracy_by_position", "lag_agreement"])
def test_a_length_whose_attention_cannot_fit_is_refused_naming_length_and_memory(call):
    with pytest.raises(ValueError, match=rf"seq_len={LONG}: .* needs [0-9.]+ GiB") as err:
        call()
    assert "available" in str(err.value)


def test_the_check_counts_every_map_it_would_hold():
    """``copies x maps x L^2 x bytes``: at a length that fits, nothing is refused; the same maps times a
    number of sequences that cannot fit are."""
    attention.check_attention_fits(64, 8, torch.float32, "cpu")
    free = attention.available_memory("cpu")
    assert free is not None and free > 0
    maps = free // (3 * 1024 * 1024 * 4) + 1  # just more than fits at L = 1024
    with pytest.raises(ValueError, match="seq_len=1024"):
        attention.check_attention_fits(1024, maps, torch.float32, "cpu")


def test_a_length_that_fits_still_runs():
    model = _small(Transformer)
    logits = model(torch.zeros(2, 48, dtype=torch.long))
    assert logits.shape == (1, 2, 48, 16)
