"""Tests for chapters 4 and 5: the offset kernel, carrier measures and the dilution law."""

import pytest
import torch

from lengthgen_utils.analysis import kernel as analysis
from lengthgen_utils.analysis import theory
from lengthgen_utils.run.evaluation import accuracy_by_length, target_attention_mass
from lengthgen_utils.core.models import RetrievalHead
from lengthgen_utils.core.encodings import RoPE
from lengthgen_utils.core.rope import rope_inverse_frequencies
from lengthgen_utils.core.tasks import FixedOffsetRetrieval


@pytest.mark.parametrize("interleaved", [False, True])
def test_offset_kernel_equals_model_scores(interleaved):
    model = RetrievalHead(n_models=3, pe=RoPE(base=500.0, interleaved=interleaved))
    seq_len = 300
    kernel = analysis.offset_kernel(model, seq_len)  # the row layout: D = -(L-1) .. 0
    with torch.no_grad():
        scores = model.scores(seq_len).double()
    torch.testing.assert_close(kernel, scores, atol=2e-5, rtol=0)


def test_spectrum_gives_a_b_form():
    model = RetrievalHead(n_models=2)
    spec = analysis.carrier_spectrum(model)
    a, b = spec.r * spec.phi.cos(), spec.r * spec.phi.sin()
    d = torch.arange(-40, 1).double()
    s = (a[:, :, None] * torch.cos(spec.theta[None, :, None] * d) + b[:, :, None] * torch.sin(spec.theta[None, :, None] * d)).sum(1)
    torch.testing.assert_close(s, analysis.kernel_at(model, d.long()))
    assert spec.r.shape == (2, 8) and (spec.r >= 0).all()


def matched_filter(offset, d_model=32, d_head=16):
    """A head whose every pair peaks at D = -offset: q0 pair i = (1, 0), k0 pair i rotated by -theta_i k."""
    model = RetrievalHead(n_models=1, d_model=d_model, d_head=d_head)
    theta = rope_inverse_frequencies(d_head).float()
    half = d_head // 2
    q0 = torch.cat([torch.ones(half), torch.zeros(half)])
    # phi_i = arg(zq conj(zk)) = -arg(zk) must equal -theta_i k, so arg(zk) = theta_i k
    k0 = torch.cat([torch.cos(theta * offset), torch.sin(theta * offset)])
    with torch.no_grad():
        model.u.zero_()
        model.u[0, 0] = 1.0
        model.w_q.zero_()
        model.w_k.zero_()
        model.w_q[0, :, 0] = q0  # W_Q u = q0 for u = e_0 (weights are [d_head, d_model])
        model.w_k[0, :, 0] = k0
    return model


def test_matched_filter_alignment_is_one_and_peaks_at_minus_k():
    model = matched_filter(3)
    assert analysis.alignment(model, 3).item() == pytest.approx(1.0, abs=1e-6)
    assert analysis.alignment(model, 3, window=16).item() == pytest.approx(1.0, abs=1e-6)
    assert analysis.peak_distance(analysis.offset_kernel(model, 16)).item() == 3
    # peak value = sum r_i = 8 pairs * 1 / sqrt(16)
    assert analysis.kernel_at(model, [-3]).item() == pytest.approx(2.0, abs=1e-6)
    # one offset off: raw alignment is the mean of cos(theta_i) (0.936: the slow pairs barely notice),
    # the variation-weighted one is lower because it discounts those slow pairs
    raw = analysis.alignment(model, 4).item()
    assert raw == pytest.approx(rope_inverse_frequencies(16).cos().mean().item(), abs=1e-6)
    assert raw == pytest.approx(0.9356, abs=1e-4)
    assert analysis.alignment(model, 4, window=16).item() < raw - 0.1


def test_participation_ratio_values_and_errors():
    pr = analysis.participation_ratio(torch.tensor([[1.0, 0, 0, 0], [1.0, 1, 1, 1], [3.0, 1, 0, 0]]))
    torch.testing.assert_close(pr, torch.tensor([1.0, 4.0, 1.6], dtype=torch.float64))  # computed in float64
    with pytest.raises(ValueError, match="weights must be >= 0"):
        analysis.participation_ratio(torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="all zero"):
        analysis.participation_ratio(torch.zeros(1, 3))


def test_kernel_reconstruction_limits():
    model = RetrievalHead(n_models=2)
    full = analysis.reconstruction(model, 16, 8)
    torch.testing.assert_close(full, torch.ones(2, dtype=torch.float64))
    assert (analysis.reconstruction(model, 16, 0).abs() < 1e-12).all()
    r1, r2 = analysis.reconstruction(model, 16, 1), analysis.reconstruction(model, 16, 2)
    assert (r2 >= r1 - 1e-9).all()
    with pytest.raises(ValueError, match="rank must be in"):
        analysis.reconstruction(model, 16, 9)


def test_qk_effective_rank_range():
    ranks = analysis.qk_effective_rank(RetrievalHead(n_models=3))
    assert ((ranks >= 1) & (ranks <= 16)).all()


def test_first_alias_offset_definition():
    model = RetrievalHead(n_models=4, pe=RoPE(base=100.0))
    found = analysis.first_alias(model, 3, 16, 2000, tolerance=1.0)
    s = analysis.kernel_at(model, -torch.arange(2001))  # column d holds s(-d)
    for i, d in enumerate(found):
        peak = s[i, 3]
        if d is None:
            assert (s[i, 16:] < peak - 1.0).all()
        else:
            assert d >= 16 and s[i, d] >= peak - 1.0 and (s[i, 16:d] < peak - 1.0).all()


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="RoPE encoding"):
        analysis.kernel_at(RetrievalHead(pe="ape"), [0])
    with pytest.raises(ValueError, match="offset must be >= 1"):
        analysis.alignment(RetrievalHead(), 0)
    with pytest.raises(TypeError, match="must hold integers"):
        analysis.kernel_at(RetrievalHead(), torch.tensor([0.5]))
    with pytest.raises(ValueError, match="must lie in"):
        theory.exact_target_mass(torch.zeros(1, 10), 3, [11])


def test_exact_mass_equals_model_attention_and_ratio():
    model = RetrievalHead(n_models=3, pe=RoPE(base=100.0))
    lengths = [8, 16, 64, 200]
    kernel = analysis.offset_kernel(model, 200)
    exact = theory.exact_target_mass(kernel, [1, 2, 5], lengths)
    measured = target_attention_mass(model, [1, 2, 5], lengths)
    torch.testing.assert_close(exact, measured, atol=1e-5, rtol=0)
    ratio = theory.distractor_ratio(kernel, [1, 2, 5])
    torch.testing.assert_close(1 / (1 + ratio[:, [L - 1 for L in lengths]]), exact)


def test_mean_field_law_values():
    model = RetrievalHead(n_models=2, pe=RoPE(base=100.0))
    kernel = analysis.offset_kernel(model, 64)
    m, rho = theory.mean_field_parameters(kernel, 3, 16)
    assert (rho <= 1).all() and (rho > 0).all()


def test_critical_target_mass_and_length():
    # two classes: token 0 pushes class 1 up a little; mean row favours class 1
    t = torch.tensor([[[2.0, 1.0], [0.0, 2.0]]])
    # mu = (1, 1.5); y=0, c=1: g = 1, h = -0.5 -> p* = 0.5 / 1.5 = 1/3; y=1, c=0: h = 0.5 > 0 -> 0
    assert theory.critical_target_mass(t).item() == pytest.approx(1 / 3)
    assert theory.critical_target_mass(torch.eye(4)[None] * 3).item() == 0.0
    with pytest.raises(ValueError, match=r"\[M, V, V\]"):
        theory.critical_target_mass(torch.ones(2, 3))


def test_log_length_scale():
    assert theory.log_length_scale([16, 256], 16) == pytest.approx([1.0, 2.0])


def test_scaled_accuracy_with_unit_scale_matches_accuracy_by_length():
    model = RetrievalHead(n_models=2, pe=RoPE(base=100.0))
    task = FixedOffsetRetrieval(16, 2)
    lengths = [8, 32]
    torch.testing.assert_close(accuracy_by_length(model, task, lengths, n_samples=256, logit_scale=[1.0, 1.0]),
                               accuracy_by_length(model, task, lengths, n_samples=256))


def test_slider_figures_have_one_step_per_panel():
    from lengthgen_utils.book import ch04, ch05
    import numpy as np
    fig = ch04.kernel_slider([-2, -1, 0], {1: np.zeros((2, 3)), 2: np.ones((2, 3))}, 16, "t")
    steps = fig.layout.sliders[0].steps
    assert [s.label for s in steps] == ["1", "2"]
    assert len(fig.data) == 6 and steps[1].args[0]["visible"] == [False] * 3 + [True] * 3  # 2 seeds + target line
    with pytest.raises(ValueError, match="must be"):
        ch04.kernel_slider([-1, 0], {1: np.zeros((2, 3))}, 16, "t")
    p = np.array([[0.9, 0.5], [0.99, 0.2]])
    fig = ch05.dilution_slider([16, 32], p, ([16, 32], p), ([16, 32], p), ["a", "b"], "t")
    steps = fig.layout.sliders[0].steps
    assert len(steps) == 2 and steps[1].args[1]["yaxis.range"][1] > steps[0].args[1]["yaxis.range"][1]


def test_alias_vs_failure_draws_censored_heads_apart():
    """A head that never failed, or has no alias, is drawn in its own labelled row/column, never at a number."""
    from lengthgen_utils.book import ch04

    alias, fail = [20, 600, None, None], [32, None, 256, None]
    fig = ch04.alias_vs_failure(alias, fail, ["a", "b", "c", "d"], longest_tested=1024, alias_search=4096, title="t")
    by_name = {t.name.split(" (")[0]: t for t in fig.data if t.mode == "markers"}
    assert set(by_name) == {"alias and failure both seen", "no failure up to 1024", "no alias up to 4096", "neither"}
    top_row, right_column = max(fig.layout.yaxis.tickvals), max(fig.layout.xaxis.tickvals)
    assert fig.layout.yaxis.ticktext[-1] == "> 1024" and top_row > 1024
    assert fig.layout.xaxis.ticktext[-1] == "none<br>≤ 4096" and right_column > 4097
    assert list(by_name["no failure up to 1024"].y) == [top_row] and list(by_name["no failure up to 1024"].x) == [601]
    assert list(by_name["no alias up to 4096"].x) == [right_column] and list(by_name["no alias up to 4096"].y) == [256]
    with pytest.raises(ValueError, match="failure_length must be 1 value, one per model; got 2"):
        ch04.alias_vs_failure([1], [1, 2], ["a"], longest_tested=64, alias_search=256, title="t")
    with pytest.raises(ValueError, match="failure_length"):
        ch04.alias_vs_failure([20], [2048], ["a"], longest_tested=1024, alias_search=4096, title="t")


def test_unrotated_query_key_is_the_models_query_and_key_at_position_zero():
    model = RetrievalHead(n_models=3)
    q0, k0 = analysis.unrotated_query_key(model)
    q, k = model.queries_keys(torch.zeros(1, dtype=torch.long))
    assert q0.dtype == torch.float64
    torch.testing.assert_close(q0.float(), q[:, 0]), torch.testing.assert_close(k0.float(), k[:, 0])
