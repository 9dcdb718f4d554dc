"""Causal masks and linear attention: semantics, causality and the references' refusals.
"""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lengthgen_utils.core import attention
from tests.reference import causal_attention, linear_attention, masked_attention

SMALL = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- case 6: causal masks
def test_causal_mask_semantics():
    """Case 6: L=4: query i attends to i+1 keys; output 0 = value 0; changing token 3 leaves outputs 0-2 unchanged.

    (The full transformer's causality is tests/test_transformer.py::test_transformer_is_causal.)
    """
    q, k, v = (torch.randn(2, 4, 8, generator=gen(i)) for i in range(3))
    out, weights = causal_attention(q, k, v, return_weights=True)
    assert ((weights > 0).sum(-1) == torch.arange(1, 5)).all()
    torch.testing.assert_close(out[..., 0, :], v[..., 0, :])
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for t in (q2, k2, v2):
        t[..., 3, :] += 10.0
    for fn in (lambda *a: causal_attention(*a), lambda *a: causal_attention(*a, return_weights=True)[0]):
        a, b = fn(q, k, v), fn(q2, k2, v2)
        assert torch.equal(a[..., :3, :], b[..., :3, :])
        assert (a[..., 3, :] - b[..., 3, :]).abs().max() > 1e-3


def test_boolean_and_additive_masks_agree_and_a_01_float_mask_is_rejected():
    """Case 6: a boolean mask and a 0/-inf additive mask give identical results; a float 0/1 mask is rejected."""
    q, k, v = (torch.randn(3, 5, 8, generator=gen(10 + i)) for i in range(3))
    boolean = attention.causal_mask(5)
    additive = torch.zeros(5, 5).masked_fill(~boolean, float("-inf"))
    a, wa = masked_attention(q, k, v, boolean, return_weights=True)
    b, wb = masked_attention(q, k, v, additive, return_weights=True)
    assert torch.equal(a, b) and torch.equal(wa, wb)
    torch.testing.assert_close(a, causal_attention(q, k, v), rtol=1e-5, atol=1e-6)  # fused SDPA path
    assert torch.equal(a, causal_attention(q, k, v, return_weights=True)[0])  # the same code path
    with pytest.raises(ValueError, match=r"0 \(attend\) and -inf"):
        masked_attention(q, k, v, boolean.float())  # 0/1 float: would mask nothing if added
    with pytest.raises(ValueError, match="no key"):
        masked_attention(q, k, v, torch.zeros(5, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask"):
        masked_attention(q, k, v, boolean.long())
    with pytest.raises(ValueError, match="mask must have shape"):
        masked_attention(q, k, v, attention.causal_mask(4))


# ---------------------------------------------------------------- case 7: linear attention
def linear_reference(q, k, v, normalize, phi):
    """The explicit O(L^2) causal linear attention."""
    fq, fk = phi(q.double()), phi(k.double())
    w = (fq @ fk.transpose(-1, -2)).tril()
    if normalize:
        w = w / w.sum(-1, keepdim=True)
    return (w @ v.double()).to(q.dtype)


def test_normalized_linear_attention_returns_constant_values_exactly():
    """Case 7: with every value vector (3, -1), the normalized linear attention outputs exactly (3, -1)."""
    q, k = torch.randn(2, 9, 6, generator=gen(20)), torch.randn(2, 9, 6, generator=gen(21))
    v = torch.tensor([3.0, -1.0]).expand(2, 9, 2)
    out = linear_attention(q, k, v, normalize=True)
    assert torch.equal(out, v.expand_as(out))


@SMALL
@given(st.integers(1, 12), st.booleans(), st.integers(0, 2**31 - 1))
def test_linear_attention_matches_the_quadratic_reference_and_is_causal(seq_len, normalize, seed):
    """Case 7 (property): O(L) cumsum path = explicit O(L^2) reference to 1e-5; output t ignores token t+1."""
    g = gen(seed)
    q, k, v = (torch.randn(2, seq_len, 4, generator=g) for _ in range(3))
    phi = lambda x: torch.nn.functional.elu(x) + 1  # noqa: E731
    out = linear_attention(q, k, v, normalize=normalize)
    torch.testing.assert_close(out, linear_reference(q, k, v, normalize, phi), rtol=1e-5, atol=1e-5)
    raw = linear_attention(q, k, v, normalize=False, feature_map="identity")
    torch.testing.assert_close(raw, linear_reference(q, k, v, False, lambda x: x), rtol=1e-5, atol=1e-5)
    for t in range(seq_len - 1):
        q2, k2, v2 = q.clone(), k.clone(), v.clone()
        for x in (q2, k2, v2):
            x[:, t + 1] = torch.randn(2, 4, generator=g)
        out2 = linear_attention(q2, k2, v2, normalize=normalize)
        assert torch.equal(out[:, : t + 1], out2[:, : t + 1])


def test_normalized_linear_attention_refuses_a_vanishing_normaliser():
    """Case 7: normalize=True with a feature map whose normaliser is not positive raises instead of returning inf/NaN."""
    q = torch.ones(1, 3, 2)
    k = torch.tensor([[[1.0, 0.0], [-1.0, 0.0], [0.0, 0.0]]])
    with pytest.raises(ValueError, match="normaliser"):
        linear_attention(q, k, torch.ones(1, 3, 2), normalize=True, feature_map="identity")


