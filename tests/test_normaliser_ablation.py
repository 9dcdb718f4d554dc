"""Chapter 6's ablation of softmax's parts: the normalisers, the well-conditioned rotary encoding,
the test-time swap, the selection margins and the min-norm interpolant's own accuracy."""
import math

import pytest
import torch
from torch import Tensor

from lengthgen_utils.analysis import kernel, theory
from lengthgen_utils.core.attention import EXP_MAX_LOGIT, ROW_WEIGHTS, elu_linear_weights, row_weights
from lengthgen_utils.run.configs import RetrievalExperiment
from lengthgen_utils.run.evaluation import accuracy_by_length
from lengthgen_utils.core.models import RetrievalHead
from lengthgen_utils.core.encodings import RoPE, RotaryFrequencies, WELL_CONDITIONED_FREQUENCIES, get_encoding
from lengthgen_utils.core.rope import rope_kernel_features
from lengthgen_utils.analysis.probes import position_attention
from lengthgen_utils.run.runners import run_kernel_head
from lengthgen_utils.core.tasks import FixedOffsetRetrieval


def test_each_normaliser_against_its_formula():
    s = torch.tensor([[0.5, -1.0, 2.0, 0.25]], dtype=torch.float64)
    torch.testing.assert_close(row_weights(s, "softmax"), torch.exp(s) / torch.exp(s).sum())
    torch.testing.assert_close(row_weights(s, "linear"), s)
    torch.testing.assert_close(row_weights(s, "linear_mean"), s / 4)
    torch.testing.assert_close(row_weights(s, "linear_sum"), s / s.sum())
    torch.testing.assert_close(row_weights(s, "exp"), torch.exp(s))
    assert set(ROW_WEIGHTS) == {"softmax", "linear", "linear_mean", "linear_sum", "exp", "linear_elu"}


def test_normalisers_that_can_vanish_or_overflow_refuse_instead_of_returning_inf():
    with pytest.raises(ValueError, match="linear_sum.*vanishes"):
        row_weights(torch.tensor([[1.0, -1.0, 0.0]]), "linear_sum")
    with pytest.raises(ValueError, match="exp.*overflow"):
        row_weights(torch.tensor([[EXP_MAX_LOGIT + 1.0, 0.0]]), "exp")
    assert torch.isfinite(row_weights(torch.tensor([[EXP_MAX_LOGIT, 0.0]]), "exp")).all()
    with pytest.raises(ValueError, match="attention must be one of"):
        row_weights(torch.zeros(1, 3), "relu")


def _rotation(theta: Tensor, position: int) -> Tensor:
    """The block-diagonal rotation [d, d] of RoPE's half-split layout (pair i: channels i and i + d/2)."""
    half = theta.shape[0]
    r = torch.zeros(2 * half, 2 * half, dtype=torch.float64)
    for i, angle in enumerate((theta * position).tolist()):
        c, s = math.cos(angle), math.sin(angle)
        r[i, i], r[i, i + half], r[i + half, i], r[i + half, i + half] = c, -s, s, c
    return r


def test_elu_linear_weights_against_a_loop_over_positions():
    """a_ij = R_i phi(q_i) . R_j phi(k_j) / sum_j' phi(q_i) . phi(k_j'), phi = elu + 1, entry by entry."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 5, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 7, 8, generator=gen, dtype=torch.float64)
    phi = lambda x: torch.nn.functional.elu(x) + 1  # noqa: E731
    theta = torch.tensor([1.0, 0.5, 0.25, 0.1], dtype=torch.float64)
    q_pos, k_pos = [3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5, 6]
    enc = RotaryFrequencies(theta=tuple(theta.tolist()))
    got = elu_linear_weights(q, k, lambda f: enc.rotate(f, torch.tensor(q_pos)),
                             lambda f: enc.rotate(f, torch.tensor(k_pos)))
    plain = elu_linear_weights(q, k)
    want, want_plain = torch.zeros(2, 5, 7, dtype=torch.float64), torch.zeros(2, 5, 7, dtype=torch.float64)
    for b in range(2):
        for i in range(5):
            normaliser = sum(float(phi(q[b, i]) @ phi(k[b, j])) for j in range(7))
            for j in range(7):
                rq, rk = _rotation(theta, q_pos[i]) @ phi(q[b, i]), _rotation(theta, k_pos[j]) @ phi(k[b, j])
                want[b, i, j] = float(rq @ rk) / normaliser
                want_plain[b, i, j] = float(phi(q[b, i]) @ phi(k[b, j])) / normaliser
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(plain, want_plain)
    # without rotations: Katharopoulos et al.'s weights, positive and summing to 1 in every row
    assert (plain > 0).all()
    torch.testing.assert_close(plain.sum(-1), torch.ones(2, 5, dtype=torch.float64))
    # with them: the normaliser is the same positive number, the numerator a function of j - i alone
    shifted = elu_linear_weights(q, k, lambda f: enc.rotate(f, torch.tensor(q_pos) + 11),
                                 lambda f: enc.rotate(f, torch.tensor(k_pos) + 11))
    torch.testing.assert_close(shifted, got)
    assert (got < 0).any() and not torch.allclose(got.sum(-1), torch.ones(2, 5, dtype=torch.float64))


def test_elu_linear_head_rows_and_refusals():
    """The head's row is elu_linear_weights of its own query and keys; it refuses what has no meaning for it."""
    model = RetrievalHead(pe=RotaryFrequencies(), attention="linear_elu", n_models=3)
    row = model.attention_row(12)
    assert row.shape == (3, 12) and torch.isfinite(row).all()
    torch.testing.assert_close(row[:, -1], torch.full((3,), 1 / 12))  # D = 0: the unrotated term over L terms
    torch.testing.assert_close(model.attention_row(12, position_shift=40), row, rtol=0, atol=1e-5)  # relative
    nope = RetrievalHead(pe="nope", attention="linear_elu", n_models=2).attention_row(9)
    torch.testing.assert_close(nope, torch.full((2, 9), 1 / 9))  # no position signal: uniform weights
    with pytest.raises(ValueError, match="linear_elu.*elu\\+1 features"):
        row_weights(torch.zeros(1, 3), "linear_elu")
    with pytest.raises(ValueError, match="logit_scale"):
        model.attention_row(12, logit_scale=2.0)
    with pytest.raises(ValueError, match="score bias"):
        RetrievalHead(pe="alibi", attention="linear_elu").attention_row(8)
    with pytest.raises(ValueError, match="underflowed"):
        elu_linear_weights(torch.full((1, 4), -200.0), torch.full((3, 4), -200.0))
    q, k = torch.randn(4, 8), torch.randn(6, 8)
    half = elu_linear_weights(q.half(), k.half())
    assert half.dtype == torch.float16
    want = elu_linear_weights(q.half().float(), k.half().float())
    torch.testing.assert_close(half.float(), want, rtol=1e-3, atol=1e-3)


def test_half_precision_linear_sum_and_exp_are_formed_in_float32():
    s = torch.tensor([[3.0, 1.0, 2.0]], dtype=torch.float16)
    for name in ("linear_sum", "exp"):
        out = row_weights(s, name)
        assert out.dtype == torch.float16
        torch.testing.assert_close(out.float(), row_weights(s.float(), name), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("attention", sorted(ROW_WEIGHTS))
def test_position_attention_applies_the_normaliser_to_each_causal_row(attention):
    model = RetrievalHead(pe="rope", attention=attention, n_models=2)
    attn = position_attention(model, 9)
    assert attn.shape == (2, 9, 9) and torch.isfinite(attn).all()
    assert (attn.triu(1) == 0).all()  # nothing above the diagonal
    torch.testing.assert_close(attn[:, -1], model.attention_row(9))  # the last row is the model's own


def test_rotary_frequencies_rotate_by_their_own_set():
    enc = RotaryFrequencies()
    assert isinstance(enc, RoPE) and enc.relative and enc.theta == WELL_CONDITIONED_FREQUENCIES
    model = RetrievalHead(pe=enc, n_models=3)
    # the score row is the offset kernel over these frequencies (read from the weights), at every length
    for L in (5, 40):
        torch.testing.assert_close(kernel.offset_kernel(model, L), model.scores(L).double(), rtol=0, atol=1e-5)
    c = kernel.factorized_kernel(model)
    D = kernel.relative_positions(30)
    phi = rope_kernel_features(D, 16, frequencies=WELL_CONDITIONED_FREQUENCIES)
    torch.testing.assert_close(c @ phi.T, model.scores(30).double(), rtol=0, atol=1e-5)
    # and it is not RoPE's: the same weights with RoPE's frequencies give other logits
    assert (kernel.offset_kernel(model, 30) - (c @ rope_kernel_features(D, 16).T)).abs().max() > 1e-2


def test_rotary_frequencies_validate():
    with pytest.raises(ValueError, match="theta\\[1\\]"):
        RotaryFrequencies(theta=(1.0, 4.0))
    with pytest.raises(ValueError, match="theta\\[0\\]"):
        RotaryFrequencies(theta=(0.0, 1.0))
    with pytest.raises(TypeError, match="theta"):
        RotaryFrequencies(theta=())
    with pytest.raises(ValueError, match="d_head must be 2 \\* len\\(theta\\) = 16"):
        RetrievalHead(pe=RotaryFrequencies(), d_head=8)
    assert RotaryFrequencies(theta=[1, 2.5]).theta == (1.0, 2.5)
    assert get_encoding(RotaryFrequencies()) == RotaryFrequencies()  # an object, hashable, equal by value
    assert hash(RetrievalExperiment(pe=RotaryFrequencies())) != hash(RetrievalExperiment(pe="rope"))


def test_well_conditioned_frequencies_are_what_their_docstring_says():
    T = torch.arange(-15, 0)
    sv = torch.linalg.svdvals(rope_kernel_features(T, 16, frequencies=WELL_CONDITIONED_FREQUENCIES))
    assert 2.0 < float(sv.max() / sv.min()) < 3.0
    sv_rope = torch.linalg.svdvals(rope_kernel_features(T, 16))
    assert float(sv_rope.max() / sv_rope.min()) > 1e15
    theta = torch.tensor(WELL_CONDITIONED_FREQUENCIES, dtype=torch.float64)
    d = torch.arange(10, 300, dtype=torch.float64)
    assert float(torch.cos(theta[:, None] * d).mean(0).max()) == pytest.approx(0.66, abs=0.01)


def test_a_test_time_swap_keeps_weights_and_a_positive_rescaling_keeps_every_prediction():
    task = FixedOffsetRetrieval(16, 3)
    model = RetrievalHead(pe="rope", attention="exp", n_models=3)
    swapped = model.with_attention("softmax")
    assert swapped.config.attention == "softmax" and swapped.seeds == model.seeds
    for (name, a), (_, b) in zip(model.state_dict().items(), swapped.state_dict().items()):
        assert torch.equal(a, b), name
    acc_exp = accuracy_by_length(model, task, [16, 40], n_samples=256)
    acc_soft = accuracy_by_length(swapped, task, [16, 40], n_samples=256)
    torch.testing.assert_close(acc_exp, acc_soft)  # exp / sum is a positive rescaling of each row
    with pytest.raises(ValueError, match="attention must be one of"):
        model.with_attention("nope")


def test_selection_margins_on_a_hand_made_kernel():
    # row layout over n = 8 (D = -7 .. 0); train_len 4 -> window d = 1, 2, 3; target k = 2
    row = torch.tensor([[4.0, 3.0, 6.0, 0.0, 2.0, 5.0, 1.0, 9.0]])  # s(D) for D = -7 .. 0 (d = 7 .. 0)
    inside, beyond = kernel.selection_margins(row, 2, 4)
    assert inside.item() == 3.0  # s(-2) = 5 over max(s(-1), s(-3)) = 2; the query's own 9 is excluded
    assert beyond.item() == 1.0  # max over d = 4..7 is 6
    with pytest.raises(ValueError, match="train_len"):
        kernel.selection_margins(row, 2, 8)
    with pytest.raises(ValueError, match="kernel must be"):
        kernel.selection_margins(torch.zeros(8), 2, 4)


def test_the_min_norm_interpolant_of_well_conditioned_frequencies_fits_and_is_reached(tmp_path):
    exp = RetrievalExperiment(attention="linear", n_seeds=2, steps=300, eval_samples=256,
                              length_multiples=(1, 2), batch_size=64)
    result = run_kernel_head(exp, "well-conditioned", WELL_CONDITIONED_FREQUENCIES, cache=tmp_path, device="cpu")
    assert result.min_norm_accuracy.shape == (2,) and result.min_norm_accuracy[0] == 1.0
    assert result.min_norm_accuracy[1] < 0.95
    assert (theory.cosine_similarity(result.c, result.c_star) > 0.999).all()
    torch.testing.assert_close(result.accuracy.mean(0), result.min_norm_accuracy, rtol=0, atol=0.02)
    rope = run_kernel_head(exp, "rope", None, steps=5, cache=tmp_path, device="cpu")
    assert rope.min_norm_accuracy[0] == 1.0  # evaluated in float64: the huge c* still interpolates exactly
    assert math.isfinite(float(rope.c_star.norm())) and rope.c_star.norm() > 1e10


def test_unseen_weight_on_a_hand_made_kernel():
    """Sixteen keys beyond a window of 16 at 0 nats and a target at 5 nats: log(16 e^-5) = log 16 - 5."""
    row = torch.zeros(1, 32)
    row[0, 31 - 3] = 5.0
    assert float(kernel.unseen_weight(row, 3, 16)) == pytest.approx(math.log(16) - 5, abs=1e-12)
    with pytest.raises(ValueError, match="train_len"):
        kernel.unseen_weight(row, 3, 32)
