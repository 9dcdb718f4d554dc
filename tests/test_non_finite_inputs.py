"""Non-finite inputs on the other route: an additive score bias in every attention path and the models.
"""
import math

import pytest
import torch

from lengthgen_utils.analysis import theory
from lengthgen_utils.core import attention
from lengthgen_utils.core.models import RetrievalHead, Transformer
from lengthgen_utils.tools import cli as cli
from tests import reference


# ================================================================ 8. non-finite inputs on the other route
def _qkv(seq_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, seq_len, 8, generator=g) for _ in range(3)]


ATTENTION_PATHS = {
    "causal (fused)": lambda q, k, v, bias: reference.causal_attention(q, k, v, bias=bias),
    "causal (explicit)": lambda q, k, v, bias: reference.causal_attention(q, k, v, bias=bias, return_weights=True)[0],
    "masked": lambda q, k, v, bias: reference.masked_attention(q, k, v, attention.causal_mask(q.shape[-2]), bias=bias),
    "masked (weights)": lambda q, k, v, bias: reference.masked_attention(
        q, k, v, attention.causal_mask(q.shape[-2]), return_weights=True, bias=bias)[0],
}


@pytest.mark.parametrize("seq_len", [4, 40])  # the batched-matmul route and torch's fused kernel
def test_non_finite_inputs_on_the_other_route_are_refused_in_both_attention_paths(seq_len):
    """The reported example: masks were validated, but an additive score bias holding ``-inf`` rows or NaN gave
    silent NaN outputs, and the fused and explicit paths disagreed (beyond 32 keys the fused kernel returned 0
    for a row with no key). Now every path refuses a NaN or ``+inf`` bias, and a ``-inf`` bias that leaves a
    query no key, naming ``bias``; a ``-inf`` bias that leaves every query a key masks those keys, identically
    in every path. A transformer whose encoding's bias has gone non-finite is refused at a validated call."""
    q, k, v = _qkv(seq_len)
    bad = {}
    bias = torch.zeros(seq_len, seq_len)
    bias[2, :] = -math.inf
    bad["a -inf row"] = bias
    bias = torch.zeros(seq_len, seq_len)
    bias[seq_len - 1, : seq_len - 1] = -math.inf
    bias[0, 0] = -math.inf  # query 0 sees key 0 only
    bad["-inf on every key a query sees"] = bias
    bias = torch.zeros(seq_len, seq_len)
    bias[3, 1] = math.nan
    bad["NaN"] = bias
    bias = torch.zeros(seq_len, seq_len)
    bias[3, seq_len - 1] = math.nan  # even on a masked key: NaN + -inf is NaN
    bad["NaN above the diagonal"] = bias
    bad["+inf"] = torch.zeros(seq_len, seq_len).index_put_((torch.tensor([3]), torch.tensor([1])),
                                                          torch.tensor(math.inf))
    bad["a -inf row of one head"] = torch.zeros(3, seq_len, seq_len).index_put_(
        (torch.tensor([1]), torch.tensor([2])), torch.tensor(-math.inf))
    for path, run in ATTENTION_PATHS.items():
        for what, bias in bad.items():
            with pytest.raises(ValueError, match="bias") as info:
                run(q, k, v, bias)
            assert "nan" in str(info.value).lower() or "inf" in str(info.value).lower(), (path, what, info.value)
        with pytest.raises(TypeError, match="bias"):
            run(q, k, v, torch.zeros(seq_len, seq_len, dtype=torch.long))
        with pytest.raises(ValueError, match="bias"):
            run(q, k, v, torch.zeros(seq_len + 1, seq_len))
    # -inf that leaves every query a key: a padding mask, the same numbers in every path
    partial = torch.zeros(seq_len, seq_len)
    partial[:, 1] = -math.inf
    partial[1, 0] = 0.0
    partial[1, 1] = 0.0  # query 1 keeps keys 0 and 1
    partial[0, 1] = -math.inf
    outputs = {path: run(q, k, v, partial) for path, run in ATTENTION_PATHS.items()}
    for path, out in outputs.items():
        assert torch.isfinite(out).all(), path
        torch.testing.assert_close(out, outputs["causal (explicit)"], rtol=1e-5, atol=1e-5)
    # the other route into a model: a learned bias that has gone NaN (a validated call refuses it)
    model = Transformer(6, 1, 2, 8, "t5", max_len=seq_len)
    head = RetrievalHead(4, 8, 4, "t5", max_len=seq_len)
    for m in (model, head):
        with torch.no_grad():
            m.pe_params["t5_bias"].fill_(math.nan)
        with pytest.raises(ValueError, match="bias"):
            m(torch.zeros(1, seq_len, dtype=torch.long))
    # and the closed forms of a kernel with a NaN logit
    logits = torch.zeros(1, seq_len)
    logits[0, 1] = math.nan
    for closed_form in (lambda s: theory.exact_target_mass(s, 1, [seq_len]), lambda s: theory.distractor_ratio(s, 1),
                        lambda s: theory.mean_field_parameters(s, 1, 3)):
        with pytest.raises(ValueError, match="kernel"):
            closed_form(logits)


