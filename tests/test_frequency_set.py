"""Tests for the frequency-set analyses of chapters 4 and 5: orbits, near-recurrences, the long-run
dilution law, the carrier measures and their nulls, alias prediction, and the snapshot runner."""
import math

import pytest
import torch

from lengthgen_utils.analysis import kernel, probes, theory
from lengthgen_utils.run.configs import RetrievalExperiment, RetrievalSweep, SnapshotSweep
from lengthgen_utils.core.models import RetrievalHead
from lengthgen_utils.core.encodings import RoPE
from lengthgen_utils.core.rope import rope_inverse_frequencies
from lengthgen_utils.run.runners import run_snapshots, untrained_heads
from lengthgen_utils.run.training import train

scipy_special = pytest.importorskip("scipy.special")
scipy_stats = pytest.importorskip("scipy.stats")


def head_with_spectrum(r, phi, base=10000.0, d_model=32):
    """A one-model RoPE head whose carrier spectrum is exactly (r, phi): q0 pair i = (sqrt r_i, 0) * d^(1/4),
    k0 pair i = sqrt r_i d^(1/4) (cos -phi_i, sin -phi_i), so that zq conj(zk) / sqrt(d) = r_i exp(i phi_i)."""
    r, phi = torch.as_tensor(r, dtype=torch.float32), torch.as_tensor(phi, dtype=torch.float32)
    half = r.numel()
    d_head = 2 * half
    model = RetrievalHead(n_models=1, d_model=d_model, d_head=d_head, pe=RoPE(base=base))
    scale = d_head ** 0.25
    amp = r.sqrt() * scale
    q0 = torch.cat([amp, torch.zeros(half)])
    k0 = torch.cat([amp * torch.cos(-phi), amp * torch.sin(-phi)])
    with torch.no_grad():
        model.u.zero_()
        model.u[0, 0] = 1.0
        model.w_q.zero_()
        model.w_k.zero_()
        model.w_q[0, :, 0] = q0
        model.w_k[0, :, 0] = k0
    return model


def test_head_with_spectrum_has_that_spectrum():
    r, phi = torch.rand(8) * 3, (torch.rand(8) * 2 - 1) * 3
    spec = kernel.carrier_spectrum(head_with_spectrum(r, phi))
    torch.testing.assert_close(spec.r[0], r.double(), atol=1e-5, rtol=0)
    torch.testing.assert_close(spec.phi[0], phi.double(), atol=1e-5, rtol=0)


# ---------------------------------------------------------------- orbits
def test_frequency_orbits_of_rope_bases():
    groups = theory.frequency_orbits(rope_inverse_frequencies(16, 1e4))
    members = sorted(tuple(m) for _, m in groups)
    assert members == [((0, 1000), (2, 100), (4, 10), (6, 1)), ((1, 1000), (3, 100), (5, 10), (7, 1))]
    assert sorted(omega for omega, _ in groups) == pytest.approx([10 ** -3.5, 1e-3])
    assert len(theory.frequency_orbits(rope_inverse_frequencies(16, 1e3))) == 8  # 10^(3/8): no rational ratio
    assert len(theory.frequency_orbits(rope_inverse_frequencies(16, 1e5))) == 8
    pairs = theory.frequency_orbits(rope_inverse_frequencies(16, 1e2))
    assert sorted(tuple(m) for _, m in pairs) == [((0, 10), (4, 1)), ((1, 10), (5, 1)), ((2, 10), (6, 1)),
                                                  ((3, 10), (7, 1))]


def test_frequency_orbits_finds_a_rational_ratio_and_rejects_bad_input():
    (omega, members), = theory.frequency_orbits([1.0, 1.5])
    assert omega == pytest.approx(0.5) and members == ((0, 2), (1, 3))
    assert len(theory.frequency_orbits([1.0, math.sqrt(2)])) == 2
    for bad in ([], [1.0, -1.0], [float("nan")]):
        with pytest.raises(ValueError, match="theta"):
            theory.frequency_orbits(bad)
    with pytest.raises(ValueError, match="max_denominator"):
        theory.frequency_orbits([1.0], max_denominator=0)


def test_independent_orbit_average_is_the_bessel_product():
    theta = rope_inverse_frequencies(16, 1e3)  # rationally independent: every pair is its own orbit
    r = torch.rand(5, 8, dtype=torch.float64) * 12
    phi = (torch.rand(5, 8, dtype=torch.float64) * 2 - 1) * math.pi
    expected = torch.log(torch.tensor(scipy_special.i0(r.numpy()))).sum(1)
    torch.testing.assert_close(theory.orbit_log_mean_exp(r, phi, theta), expected, rtol=1e-10, atol=1e-9)
    torch.testing.assert_close(theory.independent_log_mean_exp(r), expected, rtol=1e-10, atol=1e-9)


def test_tied_pair_average_matches_its_fourier_series():
    """theta = (10 w, w): (1/2pi) int exp(a cos(10 psi - p) + b cos(psi - q)) = sum_n I_n(a) I_10n(b) cos(n (p - 10 q))."""
    a, b, p, q = 2.0, 25.0, 0.5, 0.05  # p - 10 q = 0: the coupling adds up
    series = scipy_special.iv(0, a) * scipy_special.iv(0, b) + 2 * sum(
        scipy_special.iv(n, a) * scipy_special.iv(10 * n, b) * math.cos(n * (p - 10 * q)) for n in range(1, 30))
    got = theory.orbit_log_mean_exp(torch.tensor([[a, b]], dtype=torch.float64),
                                   torch.tensor([[p, q]], dtype=torch.float64), torch.tensor([0.01, 0.001]))
    assert float(got) == pytest.approx(math.log(series), abs=1e-10)
    independent = theory.independent_log_mean_exp(torch.tensor([[a, b]]))
    assert abs(float(got - independent)) > 0.1  # the tie changes the average by more than 10%


def test_orbit_average_matches_a_long_sum_over_offsets_and_the_grid_has_converged():
    theta = torch.tensor([0.01, 0.001])
    r, phi = torch.tensor([[2.0, 25.0]]), torch.tensor([[0.5, 0.05]])
    d = torch.arange(1, 2 ** 21, dtype=torch.float64)
    s = (r[0, :, None] * torch.cos(theta[:, None].double() * d - phi[0, :, None])).sum(0)
    empirical = torch.logsumexp(s, 0) - math.log(d.numel())
    assert float(theory.orbit_log_mean_exp(r, phi, theta)) == pytest.approx(float(empirical), abs=0.02)
    assert abs(float(theory.independent_log_mean_exp(r)) - float(empirical)) > 0.1  # independent phases: wrong
    coarse = theory.orbit_log_mean_exp(r, phi, theta)
    fine = theory.orbit_log_mean_exp(r, phi, theta, grid=2 ** 18)
    torch.testing.assert_close(coarse, fine, rtol=0, atol=1e-10)


def test_long_run_slope_is_the_mean_distractor_weight_of_a_long_kernel():
    torch.manual_seed(0)
    model = head_with_spectrum(torch.rand(8) * 1.5, (torch.rand(8) * 2 - 1) * math.pi, base=100.0)
    spec = kernel.carrier_spectrum(model)
    slope = theory.long_run_slope(spec.r, spec.phi, spec.theta, 3)
    ratio = theory.distractor_ratio(kernel.offset_kernel(model, 2 ** 17), 3)[0]
    measured = (ratio[-1] - ratio[2 ** 16 - 1]) / (2 ** 17 - 2 ** 16)
    assert float(measured / slope) == pytest.approx(1.0, abs=0.02)


def test_orbit_peakiness_and_errors():
    theta = rope_inverse_frequencies(16, 1e4)
    assert theory.orbit_peakiness(torch.zeros(1, 8), torch.zeros(1, 8), theta).item() == pytest.approx(0.0, abs=1e-12)
    r = torch.rand(3, 8) * 5
    assert (theory.orbit_peakiness(r, torch.zeros(3, 8), theta) > 0).all()
    with pytest.raises(ValueError, match="r and phi"):
        theory.orbit_log_mean_exp(torch.ones(2, 7), torch.ones(2, 7), theta)
    with pytest.raises(ValueError, match=">= 0"):
        theory.orbit_log_mean_exp(-torch.ones(1, 8), torch.zeros(1, 8), theta)
    with pytest.raises(ValueError, match="orbits"):
        theory.orbit_log_mean_exp(torch.ones(1, 8), torch.zeros(1, 8), theta, orbits=[(1.0, ((0, 1),))])


# ---------------------------------------------------------------- recurrences and aliases
def test_pair_recurrences_by_brute_force():
    theta = rope_inverse_frequencies(16, 1e4)
    got = theory.pair_recurrences(theta, [0, 1], 3000, tolerance=0.2).tolist()
    brute = [d for d in range(1, 3001)
             if all(abs(math.remainder(float(theta[i]) * d, 2 * math.pi)) <= 0.2 for i in (0, 1))]
    assert got == brute
    assert 119 in theory.pair_recurrences(theta, [0, 1], 200, tolerance=0.4).tolist()  # about 38 pi
    with pytest.raises(ValueError, match="tolerance"):
        theory.pair_recurrences(theta, [0], 10, tolerance=4.0)
    with pytest.raises(ValueError, match="pairs"):
        theory.pair_recurrences(theta, [8], 10)


def test_predicted_alias_equals_the_full_scan_for_a_two_pair_matched_filter():
    k = 3
    theta = rope_inverse_frequencies(16, 1e4)
    r = torch.tensor([3.0, 3.0, 0, 0, 0, 0, 0, 0])
    model = head_with_spectrum(r, -theta.float() * k)  # pairs 0 and 1 peak together at D = -k
    predicted, dominant = kernel.predicted_alias_distance(model, k, 16, 4000)
    assert sorted(dominant[0].tolist()) == [0, 1]
    assert predicted == kernel.first_alias(model, k, 16, 4000)
    lag = predicted[0] - k
    assert all(abs(math.remainder(float(theta[i]) * lag, 2 * math.pi)) <= math.pi / 3 for i in (0, 1))


def test_predicted_alias_on_random_heads_lies_on_a_recurrence_or_is_none():
    model = RetrievalHead(n_models=6, pe=RoPE(base=100.0))
    with torch.no_grad():
        model.w_q.mul_(6)
        model.w_k.mul_(6)
    predicted, dominant = kernel.predicted_alias_distance(model, 2, 16, 2000)
    theta = kernel.carrier_spectrum(model).theta
    for d, pairs in zip(predicted, dominant.tolist()):
        if d is not None:
            assert d >= 16 and (d - 2) in theory.pair_recurrences(theta, pairs, 2000).tolist()
    with pytest.raises(ValueError, match="n_pairs"):
        kernel.predicted_alias_distance(model, 2, 16, 2000, n_pairs=9)


# ---------------------------------------------------------------- measures and nulls
def test_spectrum_measures_agree_with_the_model_functions():
    model = RetrievalHead(n_models=7)
    ks = [1, 2, 3, 5, 1, 2, 3]
    m = kernel.measures(kernel.carrier_spectrum(model), ks, 16)
    torch.testing.assert_close(m.alignment_raw, kernel.alignment(model, ks))
    torch.testing.assert_close(m.alignment_variation, kernel.alignment(model, ks, window=16))
    torch.testing.assert_close(m.pr_variation, kernel.participation_ratio(kernel.variation(model, 16)))
    torch.testing.assert_close(m.top2_kept, kernel.reconstruction(model, 16, 2))
    assert torch.equal(m.peak_distance, kernel.peak_distance(kernel.offset_kernel(model, 16)))
    s = kernel.offset_kernel(model, 16)
    i, k = 0, ks[0]
    others = torch.cat([s[i, :15 - k], s[i, 16 - k:]])
    assert float(m.peak_z[i]) == pytest.approx(float((s[i, 15 - k] - others.max()) / s[i].std(unbiased=False)))
    assert set(m.as_dict()) == {"C raw", "C variation", "PR amplitude", "PR variation", "top-2 kept", "peak z"}
    assert m.select(torch.tensor([0, 2])).peak_z.shape == (2,)


def test_shuffled_phases_keep_amplitudes():
    spec = kernel.carrier_spectrum(RetrievalHead(n_models=2))
    shuffled = kernel.shuffled_phases(spec, 50, seed=1)
    assert shuffled.r.shape == (100, 8) and torch.equal(shuffled.r[:50], spec.r[:1].expand(50, 8))
    assert (shuffled.phi.abs() <= math.pi).all() and shuffled.phi.std() > 1.5
    assert torch.equal(kernel.shuffled_phases(spec, 50, seed=1).phi, shuffled.phi)


def test_separation_auc_is_the_mann_whitney_statistic():
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 20, (37,), generator=gen).double()
    y = torch.randint(0, 25, (51,), generator=gen).double()
    u = scipy_stats.mannwhitneyu(x.numpy(), y.numpy(), alternative="two-sided").statistic
    assert theory.separation_auc(x, y) == pytest.approx(u / (37 * 51))
    assert theory.separation_auc([2.0, 3.0], [0.0, 1.0]) == 1.0 and theory.separation_auc([0.0], [0.0]) == 0.5
    with pytest.raises(ValueError, match="non-empty"):
        theory.separation_auc([], [1.0])


def test_r_squared():
    y = torch.tensor([[1.0, 2.0, 4.0]])
    assert theory.r_squared(y, y).item() == 1.0
    assert theory.r_squared(y, y.mean()).item() == pytest.approx(0.0)
    with pytest.raises(ValueError, match="constant"):
        theory.r_squared(torch.ones(1, 3), torch.ones(1, 3))


def test_untrained_heads_are_the_package_initialisation_with_disjoint_seeds():
    exp = RetrievalExperiment(n_seeds=3)
    null = untrained_heads(exp, 4, first_seed=100)
    assert null.seeds == (100, 101, 102, 103)
    alone = RetrievalHead(n_models=1, seeds=[102], max_len=exp.table_len)
    torch.testing.assert_close(null.w_q[2], alone.w_q[0])
    with pytest.raises(ValueError, match="first_seed"):
        untrained_heads(exp, 4, first_seed=2)


# ---------------------------------------------------------------- probes
def test_accuracy_transition_cliff_gradual_and_intact():
    lengths = [16, 19, 23, 27, 32, 38, 45, 54, 64]
    acc = torch.tensor([[1.0] * 4 + [0.06] * 5,                                  # a cliff at 32
                        [1.0, 1.0, 0.85, 0.8, 0.7, 0.6, 0.55, 0.3, 0.2],         # gradual: 23 .. 54
                        [1.0] * 9])                                              # intact
    out = probes.accuracy_transition(acc, lengths, chance=1 / 16)
    assert out["high"] == [32, 23, None] and out["half"] == [32, 54, None]
    assert out["width"][0] == 0 and out["width"][1] == pytest.approx(math.log2(54 / 23))
    assert math.isnan(out["width"][2])
    assert out["kind"] == ["cliff", "gradual", "holds"]
    assert probes.accuracy_transition(torch.tensor([[0.5] * 9]), lengths, 1 / 16)["kind"] == ["not learned"]
    with pytest.raises(ValueError, match="increase"):
        probes.accuracy_transition(acc, lengths[::-1], chance=1 / 16)
    with pytest.raises(ValueError, match="one column per length"):
        probes.accuracy_transition(acc[:, :3], lengths, chance=1 / 16)


def test_attention_argmax_from_one_logit_matrix_equals_the_score_rows():
    model = RetrievalHead(n_models=3, pe="ape", max_len=64)
    lengths = [5, 17, 40, 64]
    with torch.no_grad():
        expected = torch.stack([model.scores(L).argmax(-1) for L in lengths], -1)
    assert torch.equal(probes.attention_argmax(model, lengths), expected)
    weight = probes.attention_at(model, [0, 3, 4], lengths)
    for col, L in enumerate(lengths):
        row = model.attention_row(L).detach().double()
        torch.testing.assert_close(weight[:, col], row[torch.arange(3), torch.tensor([0, 3, 4])])
    with pytest.raises(ValueError, match="positions"):
        probes.attention_at(model, 5, lengths)


# ---------------------------------------------------------------- snapshots
def small_sweep(**overrides):
    return RetrievalSweep(pes=("rope",), attentions=("softmax",), offsets=(1, 3), n_seeds=2, steps=12,
                          batch_size=8, eval_samples=16, length_multiples=(1, 2), **overrides)


def test_a_snapshot_equals_the_ensemble_trained_for_that_many_steps():
    sweep = small_sweep()
    result = run_snapshots(SnapshotSweep(sweep, (5, 12), (16, 20, 32), eval_samples=16), cache=False, device="cpu")
    alone = RetrievalHead(n_models=4, seeds=sweep.seeds, max_len=sweep.table_len)
    train(alone, sweep.tasks, sweep.optimizer_settings, steps=5, batch_size=8, train_len=16, seed=0, device="cpu",
          min_train_len=sweep.shortest_train_len)
    for name, p in alone.named_parameters():
        torch.testing.assert_close(dict(result.where(step=5).model.named_parameters())[name], p)
    assert result.where(step=12).accuracy.shape == (4, 3) and result.where(step=12).loss_history.shape == (12, 4)
    assert result.where(step=5).offsets == [1, 1, 3, 3] and result.lengths == [16, 20, 32]


def test_length_temperature_changes_training_and_configs_validate():
    sweep = small_sweep()
    plain = run_snapshots(SnapshotSweep(sweep, (12,), (16, 32), eval_samples=16), cache=False, device="cpu")
    scaled = run_snapshots(SnapshotSweep(sweep, (12,), (16, 32), eval_samples=16, length_temperature=True),
                           cache=False, device="cpu")
    assert not torch.equal(plain.where(step=12).model.w_q, scaled.where(step=12).model.w_q)
    with pytest.raises(ValueError, match="snapshot_steps"):
        SnapshotSweep(sweep, (13,), (16,))
    with pytest.raises(ValueError, match="lengths"):
        SnapshotSweep(sweep, (12,), (33,))
    with pytest.raises(TypeError, match="one encoding"):
        SnapshotSweep(RetrievalSweep(pes=("rope", "ape")), (1,), (16,))


def test_mean_distractor_weight_and_law_fit_agree_with_the_exact_ratio():
    model = RetrievalHead(n_models=3, pe=RoPE(base=100.0))
    ks = [1, 2, 5]
    ratio = theory.distractor_ratio(kernel.offset_kernel(model, 400), ks)  # column L-1: 1/p(L) - 1
    expected = (ratio[:, 399] - ratio[:, 99]) / 300  # distances 100 .. 399
    got = kernel.mean_distractor_weight(model, ks, 100, 400, chunk=37)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=0)
    fit = kernel.dilution_law_fit(model, ks, 16, 400)
    torch.testing.assert_close(fit["ratio"], ratio[:, 15:400])
    assert fit["r2"].shape == (3,) and (fit["kappa"] >= 0).all()
    spec = kernel.carrier_spectrum(model)
    torch.testing.assert_close(fit["slope"], theory.long_run_slope(spec.r, spec.phi, spec.theta, ks))


# ---------------------------------------------------------------- figures
def test_new_figures_build_label_and_validate():
    from lengthgen_utils.book import ch04, ch05

    fig = ch04.measure_vs_nulls({"trained": [0.9, 0.95], "untrained": torch.rand(300)}, "C", title="t")
    assert len(fig.data) == 2 and fig.data[1].name.startswith("untrained")
    with pytest.raises(ValueError, match="empty"):
        ch04.measure_vs_nulls({"trained": []}, "C", title="t")
    fig = ch04.censored_scatter([100, None, 50], [128, 256, None], ["a", "b", "c"], x_limit=1000, y_limit=1024,
                                 x_title="x", y_title="y", title="t", groups=["g1", "g1", "g2"])
    xs = [x for trace in fig.data[:2] for x in trace.x]
    assert max(xs) > 1000 and fig.layout.yaxis.ticktext[-1] == "none ≤ 1024"
    with pytest.raises(ValueError, match="x_limit"):
        ch04.censored_scatter([2000], [1], ["a"], 1000, 1024, "x", "y", "t")
    fig = ch05.accuracy_heatmap(torch.rand(3, 4), [16, 32, 64, 128], ["a", "b", "c"], chance=1 / 16, title="t")
    assert fig.data[0].zmin == pytest.approx(1 / 16)
    with pytest.raises(ValueError, match="accuracy must be"):
        ch05.accuracy_heatmap(torch.rand(2, 4), [16, 32, 64, 128], ["a", "b", "c"], chance=1 / 16, title="t")
    fig = ch05.r2_vs_margin([3.0, 9.0], [0.99, -1e9], ["gradual", "cliff"], ["h1", "h2"], title="t",
                             symbol_by=["wd", "book"])
    ys = sorted(y for trace in fig.data for y in trace.y)  # 1 - R² on a log axis: nothing piles up at a clip
    assert ys[0] == pytest.approx(0.01) and ys[-1] == pytest.approx(1e9 + 1) and fig.layout.yaxis.type == "log"

