"""Chapter 7's carrier fit: the carrier form fitted to measured offset profiles, its measures (the same
definitions as chapter 4's, checked against them), aliases of a measured kernel, and the transformer probes."""
import math

import pytest
import torch

from lengthgen_utils.analysis import kernel
from lengthgen_utils.analysis.kernel import CarrierSpectrum, fit_carrier, measures
from lengthgen_utils.core.models import RetrievalHead, Transformer
from lengthgen_utils.core.encodings import RoPE, RotaryFrequencies
from lengthgen_utils.analysis.probes import copying_heads, head_carriers, head_offset_profiles
from lengthgen_utils.core.tasks import DelayedCopy


def spectrum(r, phi, theta):
    return CarrierSpectrum(torch.tensor(theta, dtype=torch.float64), torch.tensor(r, dtype=torch.float64),
                           torch.tensor(phi, dtype=torch.float64))


def test_fit_recovers_a_known_carrier_exactly():
    theta = [2.5, 1.7, 0.9, 0.4]
    truth = spectrum([[1.0, 0.5, 2.0, 0.3], [0.2, 1.5, 0.1, 0.7]], [[0.3, -2.0, 1.0, 3.0], [2.0, 0.1, -1.2, 0.4]], theta)
    window = -torch.arange(1, 25)
    profile = kernel.kernel_at(truth, window)
    fit = fit_carrier(profile, window, theta)
    torch.testing.assert_close(fit.spectrum.r, truth.r)
    torch.testing.assert_close(torch.cos(fit.spectrum.phi - truth.phi), torch.ones(2, 4, dtype=torch.float64))
    torch.testing.assert_close(fit.r2, torch.ones(2, dtype=torch.float64))
    assert torch.equal(fit.window, window)


def test_fit_of_noise_explains_little_and_keeps_amplitudes_bounded():
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(50, 31, generator=gen, dtype=torch.float64)
    fit = fit_carrier(noise, -torch.arange(1, 32), RoPE().frequencies(16, 32))
    assert (fit.r2 < 0.8).all() and (fit.r2 >= 0).all()
    assert fit.spectrum.r.max() < 100  # the ill-determined slow pairs do not blow up (rcond)


def test_fit_validates():
    w = -torch.arange(1, 10)
    with pytest.raises(ValueError, match="profile must be a tensor"):
        fit_carrier(torch.zeros(2, 8), w, [1.0, 0.5])
    short = fit_carrier(torch.randn(1, 9, dtype=torch.float64), w, [1.0, 0.5, 0.3, 0.2, 0.1], rcond=1e-12)
    torch.testing.assert_close(short.r2, torch.ones(1, dtype=torch.float64))  # underdetermined: an exact fit
    with pytest.raises(ValueError, match="finite"):
        fit_carrier(torch.full((1, 9), float("nan")), w, [1.0])
    with pytest.raises(ValueError, match="constant"):
        fit_carrier(torch.ones(1, 9), w, [1.0])
    with pytest.raises(ValueError, match="distinct"):
        fit_carrier(torch.randn(1, 9), torch.tensor([-1] * 9), [1.0])
    with pytest.raises(TypeError):
        fit_carrier(torch.randn(1, 9), torch.linspace(-9, -1, 9), [1.0])


def test_fitted_measures_are_chapter_4s_measures():
    """Consistency: fit a position-only head's own kernel (frequencies that a 40-offset window identifies)
    and the spectrum measures equal the model measures read from the weights."""
    model = RetrievalHead(pe=RotaryFrequencies(), n_models=4)
    window = -torch.arange(1, 41)
    fit = fit_carrier(kernel.kernel_at(model, window), window, RotaryFrequencies().frequencies(16, 1))
    exact = kernel.carrier_spectrum(model)
    torch.testing.assert_close(fit.spectrum.r, exact.r, rtol=1e-5, atol=1e-7)
    offsets = [1, 2, 3, 5]
    torch.testing.assert_close(kernel.alignment(fit.spectrum, offsets), kernel.alignment(model, offsets),
                               rtol=1e-5, atol=1e-6)
    train_window = kernel.relative_positions(16)
    variation = kernel.variation(fit.spectrum, train_window)
    torch.testing.assert_close(variation, kernel.variation(model, 16), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(kernel.alignment(fit.spectrum, offsets, weights=variation),
                               kernel.alignment(model, offsets, window=16), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(kernel.reconstruction(fit.spectrum, train_window, 2),
                               kernel.reconstruction(model, 16, 2), rtol=1e-5, atol=1e-6)
    measured = measures(fit.spectrum, 3, fit.window).as_dict()
    assert set(measured) == {"C raw", "C variation", "PR amplitude", "PR variation", "top-2 kept", "peak z"}
    assert all(v.shape == (4,) for v in measured.values())
    torch.testing.assert_close(measured["PR amplitude"], kernel.participation_ratio(exact.r), rtol=1e-5, atol=1e-6)


def test_a_matched_carrier_is_aligned_and_a_shifted_one_is_not():
    theta = [1.0, 0.5, 0.25]
    matched = spectrum([[1.0, 1.0, 1.0]], [[-1.0 * 3, -0.5 * 3, -0.25 * 3]], theta)  # cos(theta (D + 3))
    assert kernel.alignment(matched, 3).item() == pytest.approx(1.0)
    opposite = spectrum([[1.0, 1.0, 1.0]], [[-3.0 + math.pi, -1.5 + math.pi, -0.75 + math.pi]], theta)
    assert kernel.alignment(opposite, 3).item() == pytest.approx(-1.0)


def test_kernel_first_alias_on_a_hand_made_kernel():
    row = torch.tensor([[float("nan"), 6.0, 4.5, 3.0, 2.0, 5.0, 1.0, 0.0]])  # s(D), D = -7 .. 0 (d = 7 .. 0)
    assert kernel.first_alias(row, 2, min_distance=3) == [5]  # 4.5 >= 5 - 1
    assert kernel.first_alias(row, 2, min_distance=3, tolerance=0.0) == [6]
    assert kernel.first_alias(row[:, 2:], 2, min_distance=3, tolerance=0.0) == [None]
    with pytest.raises(ValueError, match="min_distance"):
        kernel.first_alias(row, 2, min_distance=2)


def test_copying_heads_picks_the_most_weight_at_the_offset():
    weight = torch.zeros(2, 2, 3, 10)  # row layout: index -1 - d holds distance d
    weight[0, 1, 2, -1 - 4] = 0.9
    weight[1, 0, 1, -1 - 4] = 0.5
    weight[1, 1, 0, -1 - 5] = 0.99  # most weight, but not at d = 4
    weight[1, 1, 1, 4] = 0.999  # index 4 of 10 is d = 5 (a distance-major reading would take it as d = 4)
    assert copying_heads(weight, 4).tolist() == [[1, 2], [0, 1]]  # (layer, head)
    assert copying_heads(weight, [4, 5]).tolist() == [[1, 2], [1, 1]]
    assert copying_heads(weight, 4).dtype == torch.long
    with pytest.raises(ValueError, match="weight must be"):
        copying_heads(weight[0], 4)


def test_head_carriers_fits_every_head_of_a_rope_transformer_and_refuses_others():
    model = Transformer(16, 2, 2, 32, "rope", max_len=64, n_models=2)
    fit, logit, weight = head_carriers(model, DelayedCopy(16, 3), train_len=16, n_samples=4)
    assert fit.spectrum.r.shape == (2 * 2 * 2, 8) and fit.window.tolist() == list(range(-1, -16, -1))
    assert logit.shape == weight.shape == (2, 2, 2, 17)  # row layout over D = -16 .. 0
    assert torch.isfinite(logit).all() and torch.isfinite(weight).all()
    profile, _ = head_offset_profiles(model, DelayedCopy(16, 3), 32, n_samples=4, min_query=16)
    torch.testing.assert_close(logit, profile[..., -17:], rtol=0, atol=0)  # the same probe, its last 17 entries
    profiles = logit[..., fit.window - 1].reshape(8, 15)  # column w holds D = fit.window[w] (index -1 + D)
    refit = fit_carrier(profiles, fit.window, model.encoding.frequencies(16, 32))
    torch.testing.assert_close(refit.r2, fit.r2, rtol=0, atol=0)
    assert ((fit.r2 >= 0) & (fit.r2 <= 1 + 1e-9)).all()
    torch.testing.assert_close(weight.sum(-1) <= 1 + 1e-6, torch.ones(2, 2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="RoPE transformer"):
        head_carriers(Transformer(16, 1, 2, 32, "ape", max_len=64), DelayedCopy(16, 3), train_len=16)
