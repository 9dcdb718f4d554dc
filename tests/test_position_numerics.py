"""RoPE's pairing conventions, RoPE on full tensors, angle precision and APE beyond its table.
"""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lengthgen_utils.core import encodings, rope
from lengthgen_utils.core.encodings import LearnedAPE
from lengthgen_utils.core.models import RetrievalHead, Transformer
from lengthgen_utils.core.rope import (
    apply_rope,
    rope_angles,
    rope_inverse_frequencies,
)
from lengthgen_utils.core.tasks import FixedOffsetRetrieval
from lengthgen_utils.run import evaluation

SMALL = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def rope_score(q, k, m, n, interleaved, base=10000.0):
    """<R_m q, R_n k> in float64."""
    qm = apply_rope(q[None], torch.tensor([m]), base, interleaved)[0]
    kn = apply_rope(k[None], torch.tensor([n]), base, interleaved)[0]
    return float(qm @ kn)


# ---------------------------------------------------------------- case 1: RoPE pairing conventions
def test_half_split_and_interleaved_pairings_differ_and_agree_after_reordering():
    """Case 1: d_head=8, m=5, n=2: the two pairings give different scores; evens-then-odds reordering makes them agree."""
    g = gen(1)
    q, k = torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64)
    half = rope_score(q, k, 5, 2, interleaved=False)
    inter = rope_score(q, k, 5, 2, interleaved=True)
    assert abs(half - inter) > 1e-3, (half, inter)
    perm = torch.cat([torch.arange(0, 8, 2), torch.arange(1, 8, 2)])  # evens then odds: pair (2i, 2i+1) -> (i, i+4)
    reordered = rope_score(q[perm], k[perm], 5, 2, interleaved=False)
    assert abs(reordered - inter) < 1e-6
    # both are exposed, and the documented default is the half-split pairing
    assert rope.apply_rope.__defaults__[-1] is False
    assert "half-split" in encodings.__doc__ and "interleaved" in encodings.__doc__
    import json
    from pathlib import Path
    notebook = json.loads((Path(__file__).parents[1] / "chapters" / "01_retrieval_task.ipynb").read_text())
    chapter = "".join("".join(cell["source"]) for cell in notebook["cells"])
    assert "\"half-split\" convention" in chapter  # the book says which pairing it uses (chapter 1)


@SMALL
@given(st.integers(-50, 50), st.integers(-50, 50), st.integers(0, 2**31 - 1))
def test_pairings_agree_after_reordering_at_any_positions(m, n, seed):
    """Case 1 (property): for any positions the interleaved score equals the half-split score of reordered channels."""
    g = gen(seed)
    q, k = torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64)
    perm = torch.cat([torch.arange(0, 8, 2), torch.arange(1, 8, 2)])
    assert abs(rope_score(q[perm], k[perm], m, n, False) - rope_score(q, k, m, n, True)) < 1e-6


# ---------------------------------------------------------------- case 2: RoPE on full tensors
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_on_bhld_tensors_is_relative_norm_preserving_and_identity_at_zero(interleaved):
    """Case 2: [B, H, L, d_head] tensors: scores at (5,2), (105,102), (3,0) agree; norms kept; position 0 = identity."""
    b, h, seq_len, d = 2, 3, 110, 16
    q0 = torch.randn(b, h, 1, d, generator=gen(2))
    k0 = torch.randn(b, h, 1, d, generator=gen(3))
    q, k = q0.expand(b, h, seq_len, d), k0.expand(b, h, seq_len, d)
    pos = torch.arange(seq_len)
    rq, rk = apply_rope(q, pos, interleaved=interleaved), apply_rope(k, pos, interleaved=interleaved)
    s = rq @ rk.transpose(-1, -2)  # [B, H, L, L]
    for m, n in [(105, 102), (3, 0)]:
        torch.testing.assert_close(s[..., m, n], s[..., 5, 2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rq[..., 0, :], q0[..., 0, :], rtol=0, atol=0)


def test_rope_rotation_is_shared_by_heads_and_differs_across_positions():
    """Case 2: the same vector in every head gets the same rotation at a position, different ones at different positions."""
    v = torch.randn(16, generator=gen(4))
    x = v.expand(2, 4, 6, 16)  # [B, H, L, d]: the same vector everywhere
    out = apply_rope(x, torch.arange(6))
    for head in range(1, 4):
        assert torch.equal(out[:, head], out[:, 0])
    for pos in range(1, 6):
        assert (out[0, 0, pos] - out[0, 0, 0]).abs().max() > 1e-3
    # [B, L] positions broadcast over heads
    per_batch = apply_rope(x, torch.stack([torch.arange(6), torch.arange(6) + 7]))
    assert torch.equal(per_batch[0], out[0])
    torch.testing.assert_close(per_batch[1], apply_rope(x[1:], torch.arange(6) + 7)[0])


# ---------------------------------------------------------------- case 3: precision
def test_float16_angles_are_off_by_0p7_rad_and_the_package_path_is_not():
    """Case 3: a float16 angle at position 1857 (pair 1, d_head 32, base 1e4) is off by ~0.7 rad; the package's is not."""
    theta = rope_inverse_frequencies(32, 10000.0)
    exact = 1857 * float(theta[1])
    naive = float(torch.tensor(1857.0, dtype=torch.float16) * theta[1].half())
    assert 0.6 < abs(naive - exact) < 0.8, naive - exact
    assert abs(float(rope_angles(torch.tensor([1857]), 32)[0, 1]) - exact) < 1e-9
    x = torch.randn(1, 32, generator=gen(5), dtype=torch.float64)
    ref = apply_rope(x, torch.tensor([1857]))
    for dtype in (torch.float16, torch.bfloat16):
        out = apply_rope(x.to(dtype), torch.tensor([1857]))
        assert out.dtype == dtype
        # only the cast of cos/sin and x costs precision: a few units of the dtype's eps, never ~0.7 rad
        assert (out.double() - ref).abs().max() < 40 * torch.finfo(dtype).eps * x.abs().max(), dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_models_cast_to_low_precision_keep_float64_angles(dtype):
    """Case 3: after casting a model, its RoPE tables are cos/sin of float64 angles, cast at the end."""
    cos, sin = rope._rope_cos_sin(1858, 32, 10000.0, 0, dtype, torch.device("cpu"))  # the models' memo
    angles = rope_angles(torch.arange(1858), 32)
    assert cos.dtype == dtype
    torch.testing.assert_close(cos, angles.cos().to(dtype), rtol=0, atol=0)
    torch.testing.assert_close(sin, angles.sin().to(dtype), rtol=0, atol=0)
    head = RetrievalHead(8, 16, 32, "rope", max_len=4096).to(dtype)
    q, k = head.queries_keys(torch.arange(1858))
    q32, k32 = RetrievalHead(8, 16, 32, "rope", max_len=4096).queries_keys(torch.arange(1858))
    tol = 8 * torch.finfo(dtype).eps * float(k32.detach().abs().max())
    assert (k.float() - k32).abs().max() < tol
    model = Transformer(8, 1, 2, 64, "rope").to(dtype)  # d_head 32
    tokens = torch.zeros(1, 3, dtype=torch.long)
    assert torch.isfinite(model(tokens, position_shift=1855).float()).all()


# ---------------------------------------------------------------- case 5: APE beyond the table
@pytest.mark.parametrize("device", DEVICES)
def test_ape_beyond_the_table_raises_before_any_lookup(device):
    """Case 5: 16 rows, a sequence of 17: ValueError naming 17 and 16, on CPU and CUDA; no clamp, zero row or wrap."""
    ape = LearnedAPE()
    params = {name: t.to(device) for name, t in ape.init_parameters(1, 4, 16, 1, [gen(0)]).items()}
    with pytest.raises(ValueError, match=r"16 rows.*17"):
        ape.embed(params, torch.arange(17))
    with pytest.raises(ValueError, match="16 rows"):
        ape.embed(params, torch.tensor([-1]))  # no negative index wrapping to row 15
    torch.testing.assert_close(ape.embed(params, torch.tensor([15]))[0, 0], params["table"][0, 15])
    head = RetrievalHead(8, 16, 16, "ape", max_len=16).to(device)
    with pytest.raises(ValueError, match=r"16 rows.*17"):
        head(torch.zeros(1, 17, dtype=torch.long, device=device))
    with pytest.raises(ValueError, match="16 rows"):
        head.scores(4, position_shift=-1)
    model = Transformer(8, 1, 2, 16, "ape", max_len=16).to(device)
    with pytest.raises(ValueError, match=r"16 rows.*17"):
        model(torch.zeros(1, 17, dtype=torch.long, device=device))
    with pytest.raises(ValueError, match=r"16 rows.*17"):
        evaluation.accuracy_by_length(head, FixedOffsetRetrieval(8, 2), [16, 17], n_samples=4)


