"""Experiment configurations: what they refuse and what they store.
"""
import pytest
import torch

from lengthgen_utils.core import models
from lengthgen_utils.core.encodings import RoPE
from lengthgen_utils.core.models import RetrievalHead, Transformer
from lengthgen_utils.core.rope import rope_angles, rope_inverse_frequencies


# ---------------------------------------------------------------- case 4: configuration
def test_rope_base_changes_the_tables():
    """Case 4: d_head 64: theta_1 = 0.7499 for base 1e4 and 0.6636 for base 5e5; the tables differ."""
    a, b = rope_inverse_frequencies(64, 1e4), rope_inverse_frequencies(64, 5e5)
    assert abs(float(a[1]) - 0.7499) < 1e-4 and abs(float(b[1]) - 0.6636) < 1e-4
    assert float(a[0]) == float(b[0]) == 1.0
    ca = rope_angles(torch.arange(8), 64, 1e4).cos()
    cb = rope_angles(torch.arange(8), 64, 5e5).cos()
    assert (ca - cb).abs().max() > 1e-2
    h1, h2 = RetrievalHead(8, 16, 64, RoPE(base=1e4)), RetrievalHead(8, 16, 64, RoPE(base=5e5))
    assert (h1.scores(12) - h2.scores(12)).abs().max() > 1e-4


@pytest.mark.parametrize("build", [
    lambda: RetrievalHead(8, 16, 7, "rope"),
    lambda: Transformer(8, 1, 2, 14, "rope"),  # d_head 7
    lambda: models.KernelHead(8, 7),
    lambda: rope_inverse_frequencies(7),
])
def test_odd_d_head_fails_at_construction(build):
    """Case 4: an odd d_head raises a clear ValueError at construction, not a shape error later."""
    with pytest.raises(ValueError, match=r"d_head.*even|even.*d_head"):
        build()


