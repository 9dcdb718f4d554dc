"""Reliability tests: faults commonly made with RoPE, APE, masks and evaluation, each pinned here (issue 9).

One section per case; every test docstring names its case number.
"""
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lengthgen_utils.run.optim import OptimizerSettings
from lengthgen_utils.core import attention, encodings, models, rope, tasks
from lengthgen_utils.run import configs, evaluation, profiles, training
from lengthgen_utils.book import figures, style
from lengthgen_utils.analysis import theory
from tests.reference import causal_attention, linear_attention, masked_attention
from lengthgen_utils.core.models import RetrievalHead, Transformer
from lengthgen_utils.core.encodings import LearnedAPE, RoPE
from lengthgen_utils.core.rope import (apply_rope, kernel_frequencies, rope_angles, rope_cos_sin,
                                       rope_inverse_frequencies)
from lengthgen_utils.core.tasks import IGNORE_INDEX, DelayedCopy, FixedOffsetRetrieval

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
    cos, sin = rope_cos_sin(1858, 32, 10000.0, 0, dtype, "cpu")
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


# ---------------------------------------------------------------- case 4: configuration
def test_rope_base_changes_the_tables():
    """Case 4: d_head 64: theta_1 = 0.7499 for base 1e4 and 0.6636 for base 5e5; the tables differ."""
    a, b = rope_inverse_frequencies(64, 1e4), rope_inverse_frequencies(64, 5e5)
    assert abs(float(a[1]) - 0.7499) < 1e-4 and abs(float(b[1]) - 0.6636) < 1e-4
    assert float(a[0]) == float(b[0]) == 1.0
    ca, _ = rope_cos_sin(8, 64, 1e4)
    cb, _ = rope_cos_sin(8, 64, 5e5)
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


# ---------------------------------------------------------------- case 8: scoring
from test_transformer import ConstantPredictor  # noqa: E402  (one constant predictor for both files)


def test_scoring_counts_exactly_the_defined_positions_and_never_padding():
    """Case 8: offset 3 at length 20 scores exactly positions 3..19; padded positions never count; a constant
    predictor scores chance.

    (Extends tests/test_transformer.py::test_delayed_copy_scores_exactly_the_defined_positions and
    ::test_a_constant_predictor_scores_chance, which pin the targets and the accuracy of a constant predictor.)
    """
    task = DelayedCopy(16, 3)
    acc, counts = evaluation.token_accuracy_by_position(ConstantPredictor(), task, 20, n_samples=64)
    assert (counts > 0).nonzero()[:, 0].tolist() == list(range(3, 20))
    assert torch.isnan(acc[0, :3]).all() and not torch.isnan(acc[0, 3:]).any()
    # padding: a batch padded to length 24 with IGNORE_INDEX targets has the same loss as the unpadded batch
    tokens, targets = task.sample(4, 20, gen(30))
    logits = torch.randn(1, 4, 20, 16, generator=gen(31))
    padded_targets = torch.cat([targets, torch.full((4, 4), IGNORE_INDEX)], 1)
    padded_logits = torch.cat([logits, 1e4 * torch.randn(1, 4, 4, 16, generator=gen(32))], 2)
    torch.testing.assert_close(training.sequence_cross_entropy(padded_logits, padded_targets),
                               training.sequence_cross_entropy(logits, targets))
    # a length with no scored position is refused where the length is chosen, once (the loss of every step,
    # sequence_cross_entropy, does not check it: that would read a count back from a GPU at every step)
    with pytest.raises(ValueError, match="train_len=3 .*scored"):
        training.train_sequence(_transformer(), DelayedCopy(8, 3), steps=1, train_len=3, device="cpu")
    inside, outside = evaluation.split_accuracy(acc, counts, 10)
    assert abs(float(inside) - 1 / 16) < 0.04 and abs(float(outside) - 1 / 16) < 0.04


def test_retrieval_accuracy_of_a_constant_predictor_is_chance():
    """Case 8: on retrieval, a head that always predicts one class scores 1/V, not more."""
    head = RetrievalHead(8, 16, 16, "nope")
    with torch.no_grad():
        head.embed.zero_()  # every logit is 0 for every input: argmax picks class 0 always
    acc = evaluation.accuracy_by_length(head, FixedOffsetRetrieval(8, 2), [8, 32], n_samples=4096)
    assert (acc - 1 / 8).abs().max() < 0.02, acc


# ---------------------------------------------------------------- case 9: leakage
def test_extrapolation_lengths_are_strictly_longer_than_every_training_length():
    """Case 9: the training stream never exceeds train_len; lengths called extrapolation are > train_len."""
    seen = []

    class Recording(FixedOffsetRetrieval):  # the loop draws through sample
        def sample(self, batch_size, seq_len, generator=None, device="cpu"):
            seen.append(seq_len)
            return super().sample(batch_size, seq_len, generator, device)

    exp = configs.RetrievalExperiment(steps=40, n_seeds=1)
    training.train(RetrievalHead(16, 8, 8), Recording(16, 3), steps=40, batch_size=4, train_len=exp.train_len,
                   device="cpu")
    assert max(seen) <= exp.train_len and min(seen) >= exp.offset + 2
    beyond = [L for L in exp.eval_lengths if L != exp.train_len]
    assert beyond and min(beyond) > max(seen)
    for name in ("quick", "default", "full"):
        texp = configs.transformer_experiment(profiles.get_profile(name))
        assert max(texp.eval_lengths) > texp.train_len
    acc = torch.full((1, 40), 0.5)
    counts = torch.ones(40)
    acc[0, 20:] = 0.0  # positions >= train_len are the only ones reported as "beyond"
    inside, outside = evaluation.split_accuracy(acc, counts, 20)
    assert float(inside) == 0.5 and float(outside) == 0.0


def test_tasks_report_their_sample_space_and_training_cannot_memorize_it():
    """Case 9: sample-space sizes are reported (DelayedCopy(4): 4**5 = 1024 at L=5; retrieval: 4**4 = 256, the last
    token is the fixed query); at every profile's training length the space far exceeds the sequences seen."""
    assert DelayedCopy(4, 2).sample_space_size(5) == 1024
    assert FixedOffsetRetrieval(4, 2).sample_space_size(5) == 256
    assert tasks.RunningParity().sample_space_size(6) == 64
    assert tasks.Copy(4).sample_space_size(7) == 64  # n = 3 free tokens
    for name in ("quick", "default", "full"):
        profile = profiles.get_profile(name)
        exp = configs.RetrievalExperiment.from_profile(profile)
        seen = exp.steps * exp.batch_size
        assert exp.task.sample_space_size(exp.train_len) > 1000 * seen
        texp = configs.transformer_experiment(profile)
        assert texp.task.sample_space_size(texp.train_len) > 1000 * texp.steps * texp.batch_size


# ---------------------------------------------------------------- case 10: statistics in figures
def test_accuracy_figures_show_chance_flag_below_chance_and_note_few_seeds():
    """Case 10: a chance line always; a warning and an annotation when a mean is below chance; '(3 seeds...)' noted."""
    lengths = [16, 32]
    good = {"rope": (lengths, np.full((5, 2), 0.9))}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = figures.accuracy_vs_length(good, 1 / 16, 16, "ok")
    assert fig.layout.title.text == "ok"
    assert any(s.type == "line" and s.y0 == 1 / 16 for s in fig.layout.shapes)
    assert not any("below chance" in (a.text or "") for a in fig.layout.annotations)
    bad = {"ape": (lengths, np.array([[0.01, 0.9]] * 3))}
    with pytest.warns(UserWarning, match="below chance"):
        fig = figures.accuracy_vs_length(bad, 1 / 16, 16, "bad")
    assert any("likely a bug" in (a.text or "") for a in fig.layout.annotations)
    assert "3 seeds" in fig.layout.title.text
    with pytest.warns(UserWarning, match="below chance"):
        fig = figures.accuracy_by_position({"rope": np.array([[np.nan, 0.2, 0.3], [np.nan, 0.3, 0.2]])}, 0.5, 2, "pos")
    assert "2 seeds" in fig.layout.title.text
    # one noisy position below chance is sampling noise, not a bug: the flag reads the mean over positions
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = figures.accuracy_by_position({"rope": np.array([[np.nan, 0.9, 0.3], [np.nan, 0.9, 0.4]])}, 0.5, 2, "pos")
    assert not any("below chance" in (a.text or "") for a in fig.layout.annotations)
    assert any(s.type == "line" and s.y0 == 0.5 for s in fig.layout.shapes)


def test_profiles_use_at_least_five_seeds_or_the_figures_say_so():
    """Case 10: the retrieval profiles train >= 5 seeds; the transformer profiles train fewer (cost), which
    :func:`style.seed_note` writes into every accuracy figure's title."""
    for name in ("quick", "default", "full"):
        assert profiles.get_profile(name).n_seeds >= 5
    assert style.seed_note("t", 3) == "t (3 seeds: fewer than 5)" and style.seed_note("t", 5) == "t"
    assert style.seed_note("copy, 3 seeds (mean)", 3) == "copy, 3 seeds (fewer than 5) (mean)"
    assert style.seed_note("copy, 13 seeds", 3) == "copy, 13 seeds (3 seeds: fewer than 5)"


# ---------------------------------------------------------------- case 11: determinism
def _train_head(model_seeds, data_seed):
    model = RetrievalHead(8, 8, 8, "rope", n_models=2, seeds=model_seeds)
    hist = training.train(model, FixedOffsetRetrieval(8, 2), steps=15, batch_size=16, train_len=8,
                          seed=data_seed, device="cpu")
    return hist, torch.cat([p.detach().flatten() for p in model.parameters()])


def test_training_is_bit_identical_for_the_same_seed_and_differs_otherwise():
    """Case 11: the same seeds give bit-identical losses and weights on CPU; another data or model seed differs.

    (Running nbval twice in a row is exercised by CI, which runs the chapters under nbval and then builds the book
    from the same chapters; the cache makes the second run read what the first wrote.)
    """
    h1, w1 = _train_head([0, 1], 0)
    h2, w2 = _train_head([0, 1], 0)
    assert torch.equal(h1, h2) and torch.equal(w1, w2)
    h3, w3 = _train_head([0, 1], 1)
    h4, w4 = _train_head([2, 3], 0)
    assert not torch.equal(w1, w3) and not torch.equal(w1, w4)


def test_sequence_training_is_bit_identical_for_the_same_seed():
    """Case 11: train_sequence on CPU is bit-identical for the same seeds and differs for another data seed."""
    def run(seed):
        model = Transformer(8, 1, 2, 16, "rope", n_models=1)
        hist = training.train_sequence(model, DelayedCopy(8, 2), steps=4, batch_size=4, train_len=8, seed=seed,
                                       device="cpu")
        return hist, torch.cat([p.detach().flatten() for p in model.parameters()])
    (h1, w1), (h2, w2), (_, w3) = run(0), run(0), run(1)
    assert torch.equal(h1, h2) and torch.equal(w1, w2) and not torch.equal(w1, w3)


# ---------------------------------------------------------------- case 12: bad input everywhere
def _head():
    return RetrievalHead(8, 8, 8, "rope", n_models=1)


def _transformer():
    return Transformer(8, 1, 2, 8, "rope", n_models=1)


TASK = FixedOffsetRetrieval(8, 2)
# (name, callable, valid keyword arguments, kind of each argument we corrupt): "size" = int >= 1 (or >= 2),
# "offset" = an offset or length that must fit, "real" = a positive finite float.
API = [
    ("FixedOffsetRetrieval", FixedOffsetRetrieval, dict(vocab_size=8, offset=2), dict(vocab_size="size", offset="size")),
    ("FixedOffsetRetrieval.sample", TASK.sample, dict(batch_size=2, seq_len=6),
     dict(batch_size="size", seq_len="size")),
    ("FixedOffsetRetrieval.sample_space_size", TASK.sample_space_size, dict(seq_len=6), dict(seq_len="size")),
    ("DelayedCopy", DelayedCopy, dict(vocab_size=8, offset=2), dict(vocab_size="size", offset="size")),
    ("DelayedCopy.sample", DelayedCopy(8, 2).sample, dict(batch_size=2, seq_len=6),
     dict(batch_size="size", seq_len="size")),
    ("LaggedSum", tasks.LaggedSum, dict(vocab_size=8, offset=2, offset2=3),
     dict(vocab_size="size", offset="size", offset2="size")),
    ("Copy.sample", tasks.Copy(8).sample, dict(batch_size=2, seq_len=7), dict(batch_size="size", seq_len="size")),
    ("RunningParity.sample", tasks.RunningParity().sample, dict(batch_size=2, seq_len=7),
     dict(batch_size="size", seq_len="size")),
    ("rope_inverse_frequencies", rope_inverse_frequencies, dict(d_head=8, base=1e4), dict(d_head="size", base="real")),
    ("rope_cos_sin", rope_cos_sin, dict(seq_len=4, d_head=8, base=1e4), dict(seq_len="size", d_head="size",
                                                                             base="real")),
    ("LearnedAPE", LearnedAPE, dict(init_std=0.02), dict(init_std="real_or_zero")),
    ("RoPE", RoPE, dict(base=1e4, interleaved=False), dict(base="real")),
    ("RetrievalHead", RetrievalHead, dict(vocab_size=8, d_model=8, d_head=8, pe="rope", max_len=16, n_models=1),
     dict(vocab_size="size", d_model="size", d_head="size", max_len="size", n_models="size", pe="name")),
    ("RetrievalHead.scores", lambda **kw: _head().scores(**kw), dict(seq_len=4), dict(seq_len="size")),
    ("KernelHead", models.KernelHead, dict(vocab_size=8, d_head=8, rope_base=1e4, n_models=1),
     dict(vocab_size="size", d_head="size", rope_base="real", n_models="size")),
    ("Transformer", Transformer, dict(vocab_size=8, n_layers=1, n_heads=2, d_model=8, pe="rope", max_len=16,
                                      n_models=1, mlp_ratio=2),
     dict(vocab_size="size", n_layers="size", n_heads="size", d_model="size", max_len="size", n_models="size",
          mlp_ratio="size", pe="name")),
    ("train", lambda **kw: training.train(_head(), TASK, device="cpu", **kw),
     dict(steps=1, batch_size=2, train_len=6, seed=0),
     dict(steps="size", batch_size="size", train_len="size", seed="seed")),
    ("train_squared_loss", lambda **kw: training.train_squared_loss(models.KernelHead(8, 8), TASK, device="cpu", **kw),
     dict(steps=1, batch_size=2, train_len=6, seed=0),
     dict(steps="size", batch_size="size", train_len="size", seed="seed_per_model")),
    ("train_sequence", lambda **kw: training.train_sequence(_transformer(), DelayedCopy(8, 2), device="cpu", **kw),
     dict(steps=1, batch_size=2, train_len=6, seed=0),
     dict(steps="size", batch_size="size", train_len="size", seed="seed")),
    ("OptimizerSettings", OptimizerSettings, dict(name="sgd", lr=0.01, weight_decay=0.0, momentum=0.0),
     dict(lr="real", weight_decay="real_or_zero", momentum="real_or_zero")),
    ("accuracy_by_length", lambda **kw: evaluation.accuracy_by_length(_head(), TASK, **kw),
     dict(lengths=[6], n_samples=4, seed=0, batch_size=4),
     dict(lengths="lengths", n_samples="size", seed="seed", batch_size="size")),
    ("target_attention_mass", lambda **kw: evaluation.target_attention_mass(_head(), **kw),
     dict(offset=2, lengths=[6]), dict(offset="scalar", lengths="lengths")),
    ("accuracy_by_length(logit_scale)", lambda **kw: evaluation.accuracy_by_length(_head(), TASK, **kw),
     dict(lengths=[6], logit_scale=[1.0], n_samples=4, seed=0),
     dict(lengths="lengths", n_samples="size", seed="seed", logit_scale="scales")),
    ("squared_error_by_length", lambda **kw: evaluation.squared_error_by_length(models.KernelHead(8, 8), TASK, **kw),
     dict(lengths=[6], n_samples=4, seed=0), dict(lengths="lengths", n_samples="size", seed="seed")),
    ("token_accuracy_by_position", lambda **kw: evaluation.token_accuracy_by_position(_transformer(), DelayedCopy(8, 2),
                                                                                       **kw),
     dict(seq_len=6, n_samples=2, seed=0, batch_size=2),
     dict(seq_len="size", n_samples="size", seed="seed", batch_size="size")),
    ("split_accuracy", lambda **kw: evaluation.split_accuracy(torch.ones(1, 4), torch.ones(4), **kw),
     dict(train_len=2), dict(train_len="size")),
    ("RetrievalExperiment", configs.RetrievalExperiment,
     dict(vocab_size=8, offset=2, train_len=8, d_model=8, d_head=8, n_seeds=1, steps=1, batch_size=2,
          eval_samples=2, length_multiples=(1, 2), lr=0.01),
     dict(vocab_size="size", offset="size", train_len="size", d_model="size", d_head="size", n_seeds="size",
          steps="size", batch_size="size", eval_samples="size", length_multiples="lengths", lr="real", pe="name")),
    ("RetrievalSweep", configs.RetrievalSweep,
     dict(offsets=(1, 2), vocab_size=8, train_len=8, d_model=8, d_head=8, n_seeds=1, steps=1, batch_size=2,
          eval_samples=2, lr=0.01),
     dict(offsets="lengths", vocab_size="size", train_len="size", d_model="size", d_head="size", n_seeds="size",
          steps="size", batch_size="size", eval_samples="size", lr="real")),
    ("TransformerExperiment", configs.TransformerExperiment,
     dict(task=DelayedCopy(8, 2), train_len=8, eval_lengths=(8, 16), n_layers=1, n_heads=2, d_model=8,
          batch_size=2, steps=1, n_seeds=1, eval_samples=2, lr=0.01),
     dict(task="object", train_len="size", eval_lengths="lengths", n_layers="size",
          n_heads="size", d_model="size", batch_size="size", steps="size", n_seeds="size", eval_samples="size",
          lr="real", pe="name")),
    ("log_length_scale", theory.log_length_scale, dict(lengths=[8, 16], train_len=8),
     dict(lengths="lengths", train_len="size")),
    ("trained_relative_positions", theory.trained_relative_positions, dict(train_len=8, offset=2),
     dict(train_len="size", offset="size")),
    ("min_norm_interpolant", theory.min_norm_interpolant, dict(trained=[-2], offset=2, d_head=8),
     dict(offset="size", d_head="size")),
    ("kernel_frequencies", kernel_frequencies, dict(d_head=8, base=1e4), dict(d_head="size", base="real")),
]

NOT_INT = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3), st.none(),
                    st.just(True), st.just([1]))
NOT_REAL = st.one_of(st.text(max_size=3), st.none(), st.just([1.0]))
BAD = {
    "size": st.one_of(st.integers(max_value=0), NOT_INT),
    "scalar": st.one_of(st.integers(max_value=0), st.floats(allow_nan=True), st.text(max_size=3), st.none(),
                        st.just(True)),  # an int, or one per model: a list [k] is valid for a 1-model ensemble
    "seed": st.one_of(st.integers(max_value=-1), NOT_INT),
    # one seed per model: a list of one int is valid for a one-model ensemble, so it is not drawn as bad input
    "seed_per_model": st.one_of(st.integers(max_value=-1), st.floats(allow_nan=True, allow_infinity=True),
                                st.text(max_size=3), st.none(), st.just(True), st.just([-1]), st.just([1, 2])),
    "real": st.one_of(st.floats(max_value=0.0), st.just(float("nan")), st.just(float("inf")), NOT_REAL),
    "real_or_zero": st.one_of(st.floats(max_value=-1e-9), st.just(float("nan")), st.just(float("inf")), NOT_REAL),
    "lengths": st.one_of(st.just([]), st.just("16"), st.none(), st.lists(st.integers(max_value=0), min_size=1,
                                                                         max_size=3),
                         st.lists(st.floats(allow_nan=True), min_size=1, max_size=2)),
    "scales": st.one_of(st.just(["x"]), st.just([float("nan")]), st.just([-1.0]), st.just([])),  # None is the default (no scale)
    "name": st.one_of(st.text(max_size=4).filter(lambda s: s not in encodings.ENCODINGS), st.none(), st.just(3)),
    "object": st.one_of(st.text(max_size=3), st.none(), st.just(3)),
}


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_public_api_rejects_bad_input_naming_the_argument(data):
    """Case 12: every public entry point rejects wrong types, zero/negative sizes, bad offsets, NaN rates, with a
    ValueError/TypeError that names the argument (no IndexError, no NaN or partial result)."""
    name, fn, valid, kinds = data.draw(st.sampled_from(API), label="function")
    arg = data.draw(st.sampled_from(sorted(kinds)), label="argument")
    bad = data.draw(BAD[kinds[arg]], label="value")
    with pytest.raises((TypeError, ValueError)) as info:
        fn(**{**valid, arg: bad})
    assert arg in str(info.value), f"{name}({arg}={bad!r}) raised {info.type.__name__}: {info.value}"


@pytest.mark.parametrize("name, fn, valid, kinds", API, ids=[a[0] for a in API])
def test_public_api_accepts_its_valid_example(name, fn, valid, kinds):
    """Case 12: the walker's valid arguments are valid (so each rejection above is due to the bad value alone)."""
    out = fn(**valid)
    for t in (out if isinstance(out, tuple) else (out,)):
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
            # NaN is documented only where a position is never scored (token_accuracy_by_position, positions < offset)
            allowed = name in ("split_accuracy", "token_accuracy_by_position")
            assert allowed or not torch.isnan(t).any(), name


@pytest.mark.parametrize("call, arg", [
    (lambda: FixedOffsetRetrieval(8, 7).sample(2, 8), "offset"),  # offset > seq_len - 2
    (lambda: DelayedCopy(8, 8).sample(2, 8), "seq_len"),  # no scored position
    (lambda: evaluation.target_attention_mass(_head(), 5, [6]), "offset"),
    (lambda: evaluation.accuracy_by_length(_head(), FixedOffsetRetrieval(8, 5), [6], n_samples=2), "offset"),
    (lambda: training.train(_head(), FixedOffsetRetrieval(8, 5), steps=1, train_len=6, device="cpu"), "train_len"),
    (lambda: training.train_sequence(_transformer(), DelayedCopy(8, 6), steps=1, train_len=6, device="cpu"),
     "train_len"),
    (lambda: theory.trained_relative_positions(6, 5), "train_len"),
    (lambda: configs.RetrievalExperiment(offset=15, train_len=16), "train_len"),
    (lambda: _head().select(1), "index"),
    (lambda: apply_rope(torch.ones(4, 8), torch.arange(5)), "positions"),
    (lambda: apply_rope(torch.ones(4, 8), torch.arange(4.0)), "positions"),
    (lambda: apply_rope(torch.ones(4, 7), torch.arange(4)), "d_head"),
])
def test_out_of_range_offsets_and_shapes_are_rejected_by_name(call, arg):
    """Case 12: offsets that do not fit the length, and mismatched shapes, raise errors naming the argument."""
    with pytest.raises((TypeError, ValueError), match=arg):
        call()
