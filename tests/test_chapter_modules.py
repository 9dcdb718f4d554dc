"""The analysis that chapters 1, 2, 3, 4, 5 and 7 call from their modules (book/ch01.py, ch02.py, ch03.py, ch04.py,
ch05.py, ch07.py): each function on a tiny hand-built input with a known answer, and its bad input refused naming the
argument."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lengthgen_utils.analysis import falls, kernel, theory
from lengthgen_utils.analysis.kernel import CarrierMeasures, CarrierSpectrum
from lengthgen_utils.analysis.probes import copying_heads
from lengthgen_utils.book import ch01, ch02, ch03, ch04, ch05, ch07
from lengthgen_utils.core.models import RetrievalHead
from lengthgen_utils.run.configs import RetrievalExperiment
from lengthgen_utils.run.runners import untrained_heads

THETA = 10000.0 ** (-torch.arange(8, dtype=torch.float64) / 8)  # RoPE's frequencies, d_head 16


def _spectrum(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = 3 * torch.rand(n, 8, generator=g, dtype=torch.float64)
    phi = torch.pi * (2 * torch.rand(n, 8, generator=g, dtype=torch.float64) - 1)
    return CarrierSpectrum(THETA, r, phi)


def _measures(values):
    """CarrierMeasures whose every scalar measure is ``values`` (peak distance 1)."""
    v = torch.as_tensor(values, dtype=torch.float64)
    return CarrierMeasures(v, v, v, v, v, v, torch.ones(len(v), dtype=torch.long))


# ================================================================ chapter 1
def _grid_sweep(T, accuracy):
    """A stand-in for a sweep trained on T: ``accuracy[(pe, k)]`` is [seeds, multiples 1, 2, 4, 16]."""
    lengths = [m * T for m in (1, 2, 4, 16)]
    return SimpleNamespace(lengths=lengths, where=lambda pe, offset: SimpleNamespace(
        accuracy=torch.tensor(accuracy[(pe, offset)], dtype=torch.float64)))


def test_explorer_numbers_read_panels_first_failures_and_unfitted_seeds():
    holds = [[1.0, 1.0, 1.0, 1.0]] * 2
    grid = {T: _grid_sweep(T, {
        ("rope", 1): holds,
        ("rope", 5): [[1.0, 1.0, 0.5, 0.2], [1.0, 0.9, 1.0, 0.3]] if T == 8 else holds,  # T = 8: 2x, 4x
        ("ape", 1): [[1.0, 0.1, 0.1, 0.1], [0.5, 0.1, 0.1, 0.1]] if T == 32 else [[1.0, 0.1, 0.1, 0.1]] * 2,
        ("ape", 5): [[1.0, 0.2, 0.1, 0.1]] * 2,
        ("nope", 1): [[0.3, 0.1, 0.1, 0.1]] * 2, ("nope", 5): [[0.2, 0.1, 0.1, 0.1]] * 2,
    }) for T in (8, 32)}
    out = ch01.explorer_numbers(grid, (1, 5))
    assert out["panels"] == 4
    assert out["ape_1x_min"] == pytest.approx(0.75) and out["ape_1x_max"] == 1.0
    assert out["ape_far_min"] == pytest.approx(0.1) and out["ape_far_max"] == pytest.approx(0.1)
    assert out["rope_4x_full"] == 3  # T = 8, k = 5 has a mean of 0.75 at 4x
    assert out["first_fail"] == "2x (16 tokens) when trained on 8, no failure when trained on 32"
    assert out["8k5_below_4x"] == "one of the 2 seeds is below 0.95"
    assert out["ape_unfit"] == "one seed at training length 32, k = 1 (the panel's mean at 1x is 0.75)"
    assert (out["nope_8_min"], out["nope_8_max"]) == pytest.approx((0.2, 0.3))


def test_below_clause_says_how_many_seeds_are_below_the_level():
    assert ch01.below_clause(0, 8) == "all 8 seeds are at 0.95 or above"
    assert ch01.below_clause(1, 8) == "one of the 8 seeds is below 0.95"
    assert ch01.below_clause(3, 8) == "3 of the 8 seeds are below 0.95"
    assert ch01.below_clause(8, 8) == "all 8 seeds are below 0.95"


# ================================================================ chapter 2
def test_shift_attention_moves_is_zero_for_rope_and_grows_with_a_concentrated_ape_head():
    rope = RetrievalHead(pe="rope", n_models=3, max_len=64)
    flat = RetrievalHead(pe="ape", n_models=3, max_len=64)  # N(0, 0.02^2) rows: nearly even attention
    sharp = RetrievalHead(pe="ape", n_models=3, max_len=64)
    with torch.no_grad():
        sharp.pe_params["table"].mul_(500.0)  # the same kind of head with large rows: peaked attention
    moves = ch02.shift_attention_moves({"rope": (rope, rope), "ape": (sharp, flat)}, 16, [1, 16, 40])
    assert set(moves) == {"rope", "ape"} and all(t.shape == (3, 3) for pair in moves.values() for t in pair)
    assert float(moves["rope"][0].max()) < 1e-6  # chapter 2's theorem: the attention does not move
    assert float(moves["ape"][1].max()) < 0.05 < 0.3 < float(moves["ape"][0].min())
    with pytest.raises(ValueError, match="^pairs must be"):
        ch02.shift_attention_moves({}, 16, [1])
    with pytest.raises(TypeError, match=r"^pairs\['ape'\] must be"):
        ch02.shift_attention_moves({"ape": flat}, 16, [1])
    with pytest.raises(ValueError, match="shifts"):
        ch02.shift_attention_moves({"ape": (flat, flat)}, 16, [0])


def test_shift_separation_pools_the_groups_against_the_largest_untrained_move():
    moves = {"a": (torch.tensor([[0.9, 0.5]]), torch.tensor([[0.01, 0.02]])),
             "b": (torch.tensor([[0.1, 0.8], [0.7, 0.6]]), torch.tensor([[0.03, 0.01], [0.0, 0.02]]))}
    sep = ch02.shift_separation(moves, factor=10.0)
    assert sep["untrained_max"] == pytest.approx(0.03)
    assert sep["trained_min"] == pytest.approx(0.1)
    assert sep["trained_median"] == pytest.approx(0.6)  # torch's median of 6 values: the lower middle one
    assert sep["gap"] == pytest.approx(0.57)
    assert sep["separated"].tolist() == [True, True, False, True, True, True]  # 0.1 < 10 x 0.03
    table = ch02.shift_moves_table(moves, caption="c")
    assert table.header[0] == "heads" and [row[0] for row in table.cells] == ["a", "b"]
    with pytest.raises(ValueError, match="^factor"):
        ch02.shift_separation(moves, factor=0)
    with pytest.raises(ValueError, match="^moves must be"):
        ch02.shift_separation({})


# ================================================================ chapter 3
class _PinnedRows:
    """A stand-in head: model 0 puts logit 10 on position 2 at every length, model 1 on position 20 from
    L = 21 on (position 2 below), so its argmax leaves a 16-position training range at the longer lengths."""

    n_models = 2

    def scores(self, seq_len):
        s = torch.zeros(2, seq_len)
        s[0, 2] = 10.0
        s[1, 20 if seq_len > 20 else 2] = 10.0
        return s

    def attention_row(self, seq_len):
        return self.scores(seq_len).softmax(-1)


def test_pin_summary_reads_the_pin_its_share_the_range_and_the_weight():
    summary = ch03.pin_summary(_PinnedRows(), [16, 20, 32, 64], train_len=16)
    assert summary["position"].tolist() == [2, 2]  # model 1: 2 at two lengths, 20 at two (lowest on ties)
    assert summary["share"].tolist() == [1.0, 0.5]
    assert summary["inside"].tolist() == [1.0, 0.5]
    e = torch.tensor(10.0).exp().item()
    assert summary["weight"][0].item() == pytest.approx(e / (e + 63))  # at the longest length, 64
    assert summary["weight"][1].item() == pytest.approx(1 / (e + 63))
    at_16 = ch03.pin_summary(_PinnedRows(), [16, 32], 16, longest=16)["weight"]
    assert at_16.tolist() == pytest.approx([e / (e + 15)] * 2)
    with pytest.raises(TypeError, match="test_lengths"):
        ch03.pin_summary(_PinnedRows(), 32, 16)
    with pytest.raises(ValueError, match="train_len"):
        ch03.pin_summary(_PinnedRows(), [32], 0)


# ================================================================ chapter 4
def test_first_failure_is_the_first_length_below_the_threshold():
    acc = torch.tensor([[1.0, 0.96, 0.94, 1.0], [1.0, 1.0, 1.0, 1.0], [0.5, 1.0, 1.0, 1.0]])
    assert falls.first_failure([16, 32, 64, 128], acc) == [64, None, 16]
    assert falls.first_failure([16, 32, 64, 128], acc, threshold=0.97) == [32, None, 16]
    with pytest.raises(ValueError, match="^accuracy must be"):
        falls.first_failure([16, 32, 64], acc)


def test_first_length_holding_an_alias_is_the_first_length_past_it():
    # d = 31 needs L >= 32; d = 32 needs 33, so 64; no alias, or one beyond every length: None
    assert falls.first_length_holding([31, 32, None, 200], [16, 32, 64, 128]) == [32, 64, None, None]
    with pytest.raises(TypeError, match=r"^alias\[1\] must be an int"):
        falls.first_length_holding([31, 2.5], [16, 32])


def test_alias_report_collects_the_kernel_functions_and_the_failures():
    heads = untrained_heads(RetrievalExperiment(), 4)
    lengths, acc = [16, 32, 64], torch.tensor([[1.0, 0.9, 0.1]] * 2 + [[1.0] * 3] * 2)
    report = falls.AliasReport.of(heads, [1, 2, 3, 5], lengths, acc, 16, 256)
    predicted, dominant = kernel.predicted_alias_distance(heads, [1, 2, 3, 5], 16, 256)
    assert report.predicted == predicted
    assert report.scanned == kernel.first_alias(heads, [1, 2, 3, 5], 16, 256)
    assert report.fail == [32, 32, None, None]
    assert report.predicted_fail == falls.first_length_holding(predicted, lengths)
    assert report.longest == 64 and report.offsets == [1, 2, 3, 5]
    assert 0 < report.coverage <= 1


def test_alias_summary_and_table_count_agreements_head_by_head():
    report = falls.AliasReport(predicted=[20, None, 40], scanned=[20, None, 41], fail=[32, None, 64],
                               predicted_fail=[32, None, 32], coverage=0.125, longest=64, offsets=[1, 1, 2])
    assert ch04.alias_summary(1e4, report) == ("base 10000: predicted = scanned alias for 2/3 heads (candidate "
                                               "lags: 12.5% of all); predicted = measured first failing length "
                                               "for 2/3")
    table = ch04.alias_table(report, {1: [0, 1]}, 2)
    assert table.header == ["k", "seed 0", "seed 1"]
    assert table.cells == [["1", "20 / 32", "None / None"]]
    with pytest.raises(ValueError, match=r"^rows\[2\] must hold one head per seed \(2\)"):
        ch04.alias_table(report, {1: [0, 1], 2: [2]}, 2)


def test_carrier_nulls_condition_on_the_peak_and_shuffle_each_trained_head():
    heads = untrained_heads(RetrievalExperiment(), 40)
    spec = _spectrum(3)
    nulls = ch04.carrier_nulls(heads, spec, [1, 2, 5], (1, 2, 3, 5), 16, n_draws=20)
    assert list(nulls) == ["(a) untrained", "(b) untrained, peak at -k", "(c) shuffled phases",
                           "(c) shuffled, peak at -k"]
    assert len(nulls["(a) untrained"].peak_z) == 40 and len(nulls["(c) shuffled phases"].peak_z) == 60
    assert set(nulls["(b) untrained, peak at -k"].peak_distance.tolist()) <= {1, 2, 3, 5}
    at_k = nulls["(a) untrained"].peak_distance
    assert len(nulls["(b) untrained, peak at -k"].peak_z) == int(torch.isin(at_k, torch.tensor([1, 2, 3, 5])).sum())
    # head i of the untrained null is measured at offset (1, 2, 3, 5)[i % 4]
    expected = kernel.measures(kernel.carrier_spectrum(heads), torch.tensor([1, 2, 3, 5]).repeat(10), 16)
    torch.testing.assert_close(nulls["(a) untrained"].alignment_variation, expected.alignment_variation)
    with pytest.raises(ValueError, match="^null_heads must hold a multiple of len"):
        ch04.carrier_nulls(untrained_heads(RetrievalExperiment(), 6), spec, [1, 2, 5], (1, 2, 3, 5), 16)
    with pytest.raises(ValueError, match="^offsets must hold"):
        ch04.carrier_nulls(heads, spec, [1, 2, 5], (), 16)


def test_null_aucs_and_their_table():
    trained = _measures([3.0, 4.0])
    nulls = {"above": _measures([0.0, 1.0, 2.0]), "tie": _measures([3.0, 4.0]), "(c)": _measures([5.0]),
             "(d)": _measures([9.0])}
    auc = ch04.null_aucs(trained, nulls)
    assert auc["peak z"] == {"above": 1.0, "tie": 0.5, "(c)": 0.0, "(d)": 0.0}
    with pytest.raises(ValueError, match="^nulls must hold"):
        ch04.null_aucs(trained, {})
    table = ch04.nulls_table(trained, nulls, auc, torch.tensor([1.0, 2.0]), torch.tensor([3.0, 5.0]))
    # torch's median of an even count is the lower middle value
    assert table.cells[-1] == ["PR W_Q^T W_K", "1.00", "3.00 (0.00)", "", "", ""]
    assert table.cells[0] == ["C raw", "3.00", "1.00 (1.00)", "3.00 (0.50)", "5.00 (0.00)", "9.00 (0.00)"]
    assert table.caption.endswith("Nulls: above 3, tie 2, (c) 1, (d) 1")


# ================================================================ chapter 5
def test_count_kinds_keeps_the_order_of_first_appearance():
    assert ch05.count_kinds(["cliff", "holds", "cliff"]) == "cliff 2, holds 1"
    assert ch05.count_kinds(k for k in ["holds"]) == "holds 1"
    assert ch05.count_kinds([]) == ""


def test_regimes_table_gives_ranges_and_counts_per_regime():
    law = {"a": dict(margin=torch.tensor([1.0, 3.25]), kappa=torch.tensor([2.0, 4.0]), r2=torch.tensor([0.95, 0.5]))}
    fall = {"a": dict(kind=["cliff", "cliff"])}
    table = ch05.regimes_table(law, fall, 1024)
    assert table.cells == [["a", "1.0..3.2", "2.0..4.0", "1/2", "cliff 2"]]
    assert "up to 1024 tokens" in table.caption
    with pytest.raises(ValueError, match="^law and fall must name the same regimes"):
        ch05.regimes_table(law, {"b": fall["a"]}, 1024)


def test_resolved_heads_keep_the_largest_kappa_that_the_kernel_resolves():
    law = {"a": {"kappa": torch.tensor([1.0, 20.0, 3.0, 2.0])}, "b": {"kappa": torch.tensor([30.0])}}
    # 10^4 e^-kappa >= 1000 for kappa <= log 10 = 2.30: heads 0 and 3, the larger kappa first
    resolved = ch05.resolved_heads(law, 10_000)
    assert resolved["a"].tolist() == [3, 0] and resolved["b"].tolist() == []
    assert ch05.resolved_heads(law, 10_000, n_keep=1)["a"].tolist() == [3]
    with pytest.raises(ValueError, match="^n_long must be"):
        ch05.resolved_heads(law, 0)
    with pytest.raises(ValueError, match="^resolved must hold at least one head"):
        ch05.long_kernel_errors({}, law, {"b": resolved["b"]}, 16, 10_000)


def test_independent_slope_is_the_product_of_bessel_factors():
    spec, ks = _spectrum(4, seed=1), [1, 2, 3, 5]
    target = (spec.r * torch.cos(-spec.theta * torch.tensor(ks, dtype=torch.float64)[:, None] - spec.phi)).sum(1)
    bessel = torch.exp(-target) * torch.special.i0(spec.r).prod(1)
    torch.testing.assert_close(ch05.independent_slope(spec, ks), bessel)


def test_mass_at_fall_reads_the_ratio_at_the_fall_and_p_star_from_the_value_table():
    # [M, V + 1, V], V = 2: head 0 reads its token out; head 1 reads token 0 as class 1 (no p* exists)
    table = torch.tensor([[[4.0, 0.0], [0.0, 4.0], [1.0, 1.0]], [[0.0, 9.0], [1.0, 1.0], [0.0, 0.0]]])
    model = SimpleNamespace(value_table=lambda: table)
    law = {"a": {"ratio": torch.tensor([[0.0, 1.0, 3.0], [0.0, 0.5, 0.25]])}}
    fall = {"a": {"high": [18, 17]}}
    heads = {"a": (model, [1, 1], None)}
    p_at_fall, p_star = ch05.mass_at_fall([("a", 0), ("a", 1)], heads, law, fall, 16, 2)
    # head 0 falls at 18 (column 2: ratio 3, p = 1/4); head 1 at 17 (ratio 0.5, p = 2/3)
    expected = theory.critical_target_mass(table[:, :2], undefined="nan").numpy()
    assert np.isfinite(expected).tolist() == [True, False]  # head 1 has no p*: it is left out
    np.testing.assert_allclose(p_at_fall, [0.25])
    np.testing.assert_allclose(p_star, expected[:1])
    fall_none = {"a": {"high": [None, None]}}
    assert [len(x) for x in ch05.mass_at_fall([("a", 0)], heads, law, fall_none, 16, 2)] == [0, 0]
    with pytest.raises(ValueError, match="^train_len must be"):
        ch05.mass_at_fall([], heads, law, fall, 0, 2)


def test_scaled_logits_and_margin_regimes_refuse_a_bad_sample_count():
    with pytest.raises(ValueError, match="^n_samples must be"):
        ch05.scaled_logits(None, [1], [], [16, 32], 16, None, 0)
    with pytest.raises(TypeError, match="^n_samples must be an int"):
        ch05.margin_regimes(None, None, (1,), [], [16], 1.5)


def test_intervention_table_counts_the_heads_without_an_alias():
    lengths = 3
    plain = torch.tensor([[0.5, 0.25, 0.1], [0.5, 0.5, 0.5], [0.9, 0.5, 0.2]], dtype=torch.float64)
    scaled = torch.tensor([[0.5, 0.4, 0.5], [0.5, 0.5, 0.5], [0.9, 0.6, 0.5]], dtype=torch.float64)
    v = dict(plain=plain, scaled=scaled, clean=torch.tensor([True, False, True]), gap=torch.tensor([2.0, 0.0, 3.0]),
             plain_acc=torch.full((3, lengths), 0.5), scaled_acc=torch.full((3, lengths), 0.75))
    table = ch05.intervention_table({"r": v}, 16, 64)
    rows = {row[0]: row[1] for row in table.cells}
    assert rows["heads without an aliasing key up to L"] == "2/3"
    # 1/p - 1 at 64: plain 9 and 4, scaled 1 and 1; scaled ends below its start (1 and 1/9): the first head only
    assert rows["plain / scaled at 64"] == "4 to 9e+00"
    assert rows["scaled, below its value at 16"] == "1/2"
    assert table.cells[6][1] == "2.0..2.0 nats below" and table.cells[8][1] == "3.0..3.0 nats below"
    assert rows["mean accuracy at 64, plain / scaled"] == "0.500 / 0.750"
    assert table.header == ["heads without an alias", "r"]
    numbers = ch05.intervention_numbers(v)  # what the chapter's prose quotes from the same column
    assert numbers["rises"].tolist() == [False, True] and numbers["gap"].tolist() == [2.0, 3.0]
    assert numbers["cut"].tolist() == [9.0, 4.0]
    assert (numbers["plain_acc"], numbers["scaled_acc"]) == (0.5, 0.75)
    with pytest.raises(ValueError, match="^scaled must hold"):
        ch05.intervention_table({}, 16, 64)


def test_drop_near_alias_tells_a_cliff_at_the_alias_from_a_spread_decay_and_a_cliff_elsewhere():
    lengths = [16, 19, 23, 27, 32, 38]
    acc = [[1.0, 1.0, 1.0, 0.1, 0.1, 0.1],  # a cliff into 27: all of the drop in one step
           [1.0, 0.82, 0.64, 0.46, 0.28, 0.1],  # spread evenly over five steps: a fifth in any one
           [1.0, 0.1, 0.1, 0.1, 0.1, 0.1],  # a cliff into 19, two steps before its alias at 27
           [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]]  # no drop
    share = falls.drop_near_alias(acc, lengths, [27, 27, 27, 27])
    np.testing.assert_allclose(share[:3], [1.0, 0.2, 0.0], atol=1e-12)
    assert np.isnan(share[3])
    assert falls.drop_near_alias(acc, lengths, [27, None, 23, 27], window=0)[[0, 2]].tolist() == [1.0, 0.0]
    assert np.isnan(falls.drop_near_alias(acc, lengths, [27, None, 23, 27])[1])
    assert falls.drop_near_alias(acc, lengths, [27, 27, 23, 27])[2] == 1.0  # 19 is one step before 23
    with pytest.raises(ValueError, match="^alias_lengths\\[0\\] = 28 is not one of the lengths"):
        falls.drop_near_alias(acc, lengths, [28, 27, 27, 27])
    with pytest.raises(ValueError, match="^alias_lengths must hold one entry per head"):
        falls.drop_near_alias(acc, lengths, [27])
    with pytest.raises(ValueError, match="^accuracy must be"):
        falls.drop_near_alias([[1.0, 0.5]], lengths, [19])
    with pytest.raises(ValueError, match="^window must be"):
        falls.drop_near_alias(acc, lengths, [27] * 4, window=-1)


def test_every_profile_trains_the_decayed_regime_the_chapter_quotes():
    from lengthgen_utils.run.configs import margin_sweep
    from lengthgen_utils.run.profiles import PROFILES

    for profile in PROFILES.values():
        assert ch05.DECAY_CONTROL in profile.margin_controls, profile.name
        assert ch05.DECAY_STEP in margin_sweep(profile, ch05.DECAY_CONTROL).snapshot_steps, profile.name
    assert ch05.decayed_regime({ch05.DECAYED_REGIME: 3, "book recipe": 1}) == 3
    with pytest.raises(KeyError, match="weight decay, step 2000.*absent here: regimes \\['book recipe'\\]"):
        ch05.decayed_regime({"book recipe": 1})
    with pytest.raises(KeyError, match="margin_controls=\\('steps',\\)"):
        ch05.decayed_regime({}, SimpleNamespace(name="p", margin_controls=("steps",)))


def test_scaled_logits_marks_the_lengths_where_a_key_is_above_the_target(monkeypatch):
    heads = untrained_heads(RetrievalExperiment(), 3)
    offsets, lengths = [1, 2, 3], [16, 32, 64]
    monkeypatch.setattr(ch05, "accuracy_by_length", lambda *a, **k: torch.zeros(3, len(lengths)))
    scale = theory.log_length_scale(lengths, 16)
    v = ch05.scaled_logits(heads, offsets, [None] * 3, lengths, 16, scale, 1)
    row = kernel.offset_kernel(heads, 64)  # [3, 64], column 63 - d: distance d back
    for i, k in enumerate(offsets):
        for c, L in enumerate(lengths):
            window = [row[i, 63 - d].item() for d in range(L) if d != k]
            assert bool(v["above"][i, c]) == (max(window) > row[i, 63 - k].item())
    fine = ~v["above"]  # no key above the target: the scale (>= 1) cannot lower the target mass
    assert (v["scaled"][fine] >= v["plain"][fine] - 1e-12).all()


# ================================================================ chapter 7
def _weight():
    w = torch.zeros(2, 2, 3, 8)  # [M, n_layers, n_heads, D = -7 .. 0]: the row layout, d at index -1 - d
    w[0, 1, 2, -1 - 5] = 1.0
    w[1, 0, 1, -1 - 5] = 1.0
    w[1, 1, 0, -1 - 3] = 2.0  # the largest weight of model 1, but at another distance
    w[1, 1, 1, 5] = 3.0  # index 5 is d = 2 (a distance-major reading would take it as d = 5)
    return w


def test_copying_head_pairs_are_layer_head_pairs():
    w = _weight()
    assert ch07.copying_head_pairs(w, 5) == [(1, 2), (0, 1)]
    assert ch07.copying_head_pairs(w, 3)[1] == (1, 0)
    with pytest.raises(ValueError, match="^weight must be a tensor"):
        ch07.copying_head_pairs(w[0], 5)
    with pytest.raises(ValueError, match="^offset must be in"):
        ch07.copying_head_pairs(w, 8)
    with pytest.raises(TypeError, match="^offset must be an int"):
        ch07.copying_head_pairs(w, 5.0)


def test_head_rows_pick_each_models_head():
    values = torch.arange(2 * 2 * 3 * 4).reshape(2, 2, 3, 4)
    rows = ch07.head_rows(values, [(1, 2), (0, 1)])
    assert rows.tolist() == [values[0, 1, 2].tolist(), values[1, 0, 1].tolist()]
    # the same rows as the flat index layer * n_heads + head over (layer, head)
    flat = torch.tensor([1 * 3 + 2, 0 * 3 + 1])
    assert torch.equal(rows, values.flatten(1, 2)[torch.arange(2), flat])
    with pytest.raises(ValueError, match="^pairs must hold one"):
        ch07.head_rows(values, [(1, 2)])
    with pytest.raises(ValueError, match="^pairs must lie in 2 layers x 3 heads"):
        ch07.head_rows(values, [(1, 2), (2, 0)])
    with pytest.raises(ValueError, match="^values must be a tensor"):
        ch07.head_rows(values.numpy(), [(1, 2), (0, 1)])


def _carriers(seed):
    w = _weight() + 0.01 * torch.rand(2, 2, 3, 8, generator=torch.Generator().manual_seed(seed))
    logit = torch.randn(2, 2, 3, 8, generator=torch.Generator().manual_seed(seed + 1))
    window = kernel.relative_positions(8)[:-1]  # D = -7 .. -1
    fit = kernel.CarrierFit(_spectrum(12, seed), window, torch.linspace(0.5, 1.0, 12, dtype=torch.float64))
    return fit, logit, w


def test_copying_head_fit_and_carrier_stats_index_the_fit_in_model_layer_head_order():
    trained, null = _carriers(0), _carriers(5)
    pairs, r2, peaks = ch07.copying_head_fit(trained, 5, 8)
    assert pairs == [(1, 2), (0, 1)]
    heads = copying_heads(trained[2], 5)  # [M, 2]: (layer, head)
    assert heads.tolist() == [[1, 2], [0, 1]]
    flat = torch.arange(2) * 6 + heads[:, 0] * 3 + heads[:, 1]  # the rows of the fit over (model, layer, head)
    assert flat.tolist() == [5, 7]
    torch.testing.assert_close(r2, trained[0].r2[flat])
    logit = trained[1]  # the row layout over D = -7 .. 0: index j is d = 7 - j; the window is d = 1 .. 7
    assert peaks.tolist() == [7 - int(logit[0, 1, 2, :7].argmax()), 7 - int(logit[1, 0, 1, :7].argmax())]
    stats = ch07.carrier_stats(trained, null, 5, 8)
    measured = kernel.measures(trained[0].spectrum, 5, trained[0].window).as_dict()
    untrained = kernel.measures(null[0].spectrum, 5, null[0].window).as_dict()
    null_peak = 7 - null[1][..., :7].flatten(0, 2).argmax(1)
    for name in measured:
        torch.testing.assert_close(stats[name]["trained"], measured[name][flat])
        rule = copying_heads(null[2], 5)
        torch.testing.assert_close(stats[name]["rule"], untrained[name][torch.arange(2) * 6 + rule[:, 0] * 3 + rule[:, 1]])
        torch.testing.assert_close(stats[name]["conditioned"], untrained[name][null_peak == 5])
    table = ch07.copying_head_table({5: trained}, {5: (pairs, r2, peaks)})
    assert table.cells[0][:2] == ["5", "2.3, 1.2"]  # layer.head, 1-based
    assert table.cells[0][3] == f"{r2.min():.4f}"
    top2 = ch07.copying_head_top2({5: trained}, {5: (pairs, r2, peaks)})[5]  # one pair of pairs per seed
    rank = kernel.variation(trained[0].spectrum, trained[0].window)[flat].argsort(1, descending=True)[:, :2]
    assert top2 == [tuple(sorted(p)) for p in rank.tolist()]
    assert table.cells[0][4] == ", ".join(map(str, sorted(set(top2))))
    with pytest.raises(ValueError, match="^carriers and trained_heads must name the same offsets"):
        ch07.copying_head_table({5: trained}, {1: (pairs, r2, peaks)})
    with pytest.raises(ValueError, match="^carriers and trained_heads must name the same offsets"):
        ch07.copying_head_top2({5: trained}, {1: (pairs, r2, peaks)})
