"""Internal state handed out: memoised tables cannot be corrupted by a caller.
"""
import torch

from lengthgen_utils.core import rope
from lengthgen_utils.core.models import KernelHead, RetrievalHead, Transformer
from lengthgen_utils.tools import cli as cli


# ================================================================ 10. internal state handed out
def test_internal_state_handed_out_cannot_corrupt_the_memo():
    """The reported example: a public ``rope_cos_sin`` returned its memoised tables, so a caller's in-place edit
    changed every later RoPE rotation in the process (and those results were cached under valid keys). The
    memo is now private to the rotations, and what a public function returns is the caller's own: editing
    a rotated tensor in place changes no later rotation. The same holds for explicit frequencies handed to a
    kernel head (the head keeps its own)."""
    head = RetrievalHead(4, 8, 8, "rope", max_len=16)
    scores = head.scores(12).detach().clone()
    q, k = head.queries_keys(torch.arange(12))
    q.detach().fill_(0.0)
    k.detach().mul_(7.0)
    assert torch.equal(head.scores(12), scores)  # the model's rotation is unchanged
    tf = Transformer(6, 1, 2, 8, "rope", max_len=16)
    tokens = torch.arange(12)[None] % 6
    before = tf(tokens)
    rope.apply_rope(torch.ones(12, 4), torch.arange(12)).fill_(0.0)
    assert torch.equal(tf(tokens), before)
    assert not hasattr(rope, "rope_cos_sin")  # no public handle on the memo
    assert rope._rope_cos_sin.cache_info().hits >= 1  # still memoised
    theta = torch.tensor([0.9, 0.3], dtype=torch.float64)
    kh = KernelHead(4, 4, frequencies=theta, init_std=1.0)
    out = kh.scores(6).detach().clone()
    theta.fill_(0.0)
    assert torch.equal(kh.scores(6), out)
    assert rope.kernel_frequencies(4, frequencies=theta) is not theta


