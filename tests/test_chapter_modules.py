"""The analysis that chapters 4, 5 and 7 call from their modules (book/ch04.py, ch05.py, ch07.py): each function
on a tiny hand-built input with a known answer, and its bad input refused naming the argument."""
import pytest
import torch

from lengthgen_utils.analysis import kernel
from lengthgen_utils.analysis.kernel import CarrierMeasures, CarrierSpectrum
from lengthgen_utils.book import ch04
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


# ================================================================ chapter 4
def test_first_failure_is_the_first_length_below_the_threshold():
    acc = torch.tensor([[1.0, 0.96, 0.94, 1.0], [1.0, 1.0, 1.0, 1.0], [0.5, 1.0, 1.0, 1.0]])
    assert ch04.first_failure([16, 32, 64, 128], acc) == [64, None, 16]
    assert ch04.first_failure([16, 32, 64, 128], acc, threshold=0.97) == [32, None, 16]
    with pytest.raises(ValueError, match="^accuracy must be"):
        ch04.first_failure([16, 32, 64], acc)


def test_first_length_holding_an_alias_is_the_first_length_past_it():
    # d = 31 needs L >= 32; d = 32 needs 33, so 64; no alias, or one beyond every length: None
    assert ch04.first_length_holding([31, 32, None, 200], [16, 32, 64, 128]) == [32, 64, None, None]
    with pytest.raises(TypeError, match=r"^alias\[1\] must be an int"):
        ch04.first_length_holding([31, 2.5], [16, 32])


def test_alias_report_collects_the_kernel_functions_and_the_failures():
    heads = untrained_heads(RetrievalExperiment(), 4)
    lengths, acc = [16, 32, 64], torch.tensor([[1.0, 0.9, 0.1]] * 2 + [[1.0] * 3] * 2)
    report = ch04.alias_report(heads, [1, 2, 3, 5], lengths, acc, 16, 256)
    predicted, dominant = kernel.predicted_alias_distance(heads, [1, 2, 3, 5], 16, 256)
    assert report["predicted"] == predicted
    assert report["scanned"] == kernel.first_alias(heads, [1, 2, 3, 5], 16, 256)
    assert report["fail"] == [32, 32, None, None]
    assert report["predicted_fail"] == ch04.first_length_holding(predicted, lengths)
    assert report["longest"] == 64 and report["ks"] == [1, 2, 3, 5]
    assert 0 < report["coverage"] <= 1


def test_alias_summary_and_table_count_agreements_head_by_head():
    report = dict(predicted=[20, None, 40], scanned=[20, None, 41], fail=[32, None, 64],
                  predicted_fail=[32, None, 32], coverage=0.125, ks=[1, 1, 2])
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
