"""Rates with intervals and one-sided tests (lengthgen_utils.analysis.rates), the checks that use them, and a
recurrent seed that trains to an unstable transition counted as failing, not raising."""
import math

import pytest
import torch
from scipy import stats

from lengthgen_utils.analysis.rates import (binomial_p, fisher_p, permutation_p, rank_sum_p, rate_text,
                                           wilson_interval)
from lengthgen_utils.book.checks import Checks


@pytest.mark.parametrize("m,n", [(0, 1), (0, 10), (5, 10), (10, 10), (17, 20), (30, 40)])
def test_wilson_interval_matches_the_closed_form_and_contains_the_rate(m, n):
    low, high = wilson_interval(m, n)
    z = 1.959963984540054
    p = m / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert low == pytest.approx(max(0.0, centre - half)) and high == pytest.approx(min(1.0, centre + half))
    assert 0.0 <= low <= p <= high <= 1.0


def test_wilson_interval_known_value_and_narrows_with_n():
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)  # Wilson 1927, tabulated
    assert wilson_interval(50, 100)[1] - wilson_interval(50, 100)[0] < wilson_interval(5, 10)[1] - wilson_interval(5, 10)[0]
    assert rate_text(17, 20) == "17/20 = 0.85 (95% CI 0.64-0.95)"


@pytest.mark.parametrize("m,n,p0", [(5, 10, 0.1), (0, 7, 0.3), (20, 20, 0.5), (12, 40, 0.2)])
def test_binomial_p_is_scipys_upper_tail(m, n, p0):
    assert binomial_p(m, n, p0) == pytest.approx(stats.binom.sf(m - 1, n, p0))


@pytest.mark.parametrize("table", [(8, 10, 0, 4), (7, 10, 3, 5), (3, 12, 4, 6), (10, 10, 4, 4)])
def test_fisher_p_is_scipys_one_sided_exact_test(table):
    m1, n1, m2, n2 = table
    expected = stats.fisher_exact([[m1, n1 - m1], [m2, n2 - m2]], alternative="greater").pvalue
    assert fisher_p(*table) == pytest.approx(expected)


def test_permutation_p_counts_the_observed_value_as_a_draw():
    assert permutation_p(1.0, [0.0] * 99) == pytest.approx(0.01)
    assert permutation_p(0.5, torch.tensor([0.5, 0.6, 0.1])) == pytest.approx(3 / 4)


@pytest.mark.parametrize("call", [lambda: wilson_interval(3, 2), lambda: wilson_interval(0, 0),
                                  lambda: binomial_p(1, 2, 1.5), lambda: permutation_p(0.1, []),
                                  lambda: permutation_p(float("nan"), [0.1])])
def test_bad_input_is_refused(call):
    with pytest.raises((ValueError, TypeError)):
        call()


def test_rate_at_least_bounds_the_interval_not_the_rate():
    check = Checks("chapters/test")
    # 8 of 10 is above a bound of 0.5, but its interval's lower end (0.49) is not
    assert not check.rate_at_least("eight of ten", [True] * 8 + [False] * 2, 0.5, reason="a majority")
    assert check.rate_at_least("nineteen of twenty", [True] * 19 + [False], 0.5, reason="a majority")
    record = check.results[0]
    assert record["value"] == pytest.approx(wilson_interval(8, 10)[0]) and "a majority" in record["detail"]
    with pytest.raises(TypeError):
        check.rate_at_least("no reason", [True], 0.5, reason="")
    with pytest.raises(ValueError):
        check.rate_at_least("bad bound", [True], 1.5, reason="x")


def test_rate_at_most_bounds_the_upper_end_of_the_interval():
    check = Checks("chapters/test")
    # 1 of 10 is below a bound of 0.2, but its interval's upper end (0.40) is not
    assert not check.rate_at_most("one of ten", [True] + [False] * 9, 0.2, reason="rare")
    assert check.rate_at_most("one of fifty", [True] + [False] * 49, 0.2, reason="rare")
    assert check.results[0]["value"] == pytest.approx(wilson_interval(1, 10)[1]) and "rare" in check.results[0]["detail"]
    with pytest.raises(TypeError):
        check.rate_at_most("no reason", [True], 0.5, reason="")
    with pytest.raises(ValueError):
        check.rate_at_most("no units", [], 0.5, reason="x")


def test_beats_null_is_a_test_at_a_stated_level():
    check = Checks("chapters/test")
    assert check.beats_null("strong", binomial_p(5, 10, 0.1), 0.01, null="another head's alias, binomial")
    assert not check.beats_null("weak", binomial_p(2, 10, 0.1), 0.01, null="another head's alias, binomial")
    assert "another head's alias" in check.results[0]["detail"]
    with pytest.raises(ValueError):
        check.beats_null("level", 0.1, 1.0, null="x")


def test_rate_beats_is_fisher_against_null_units_and_binomial_against_a_rate():
    check = Checks("tests/rate_beats")
    assert check.rate_beats("5 of 5 vs 0 of 5", [True] * 5, [False] * 5, 0.05, against="controls")
    assert check.results[-1]["value"] == pytest.approx(fisher_p(5, 5, 0, 5))  # 1 / C(10, 5)
    assert not check.rate_beats("3 of 5 vs 0 of 5", [1, 1, 1, 0, 0], [0] * 5, 0.05, against="controls")
    assert check.rate_beats("9 of 9 vs chance 0.05", [True] * 9, 0.05, 0.01, against="chance")
    assert check.results[-1]["value"] == pytest.approx(0.05 ** 9)
    assert not check.rate_beats("1 of 9 vs chance 0.05", [True] + [False] * 8, 0.05, 0.01, against="chance")
    with pytest.raises(ValueError, match="null rate"):
        check.rate_beats("p0", [True], 1.5, 0.05, against="x")
    with pytest.raises(ValueError, match="no units"):
        check.rate_beats("empty null", [True], [], 0.05, against="x")
    with pytest.raises(TypeError, match="null is"):
        check.rate_beats("against", [True], [False], 0.05, against="")


def test_an_unstable_recurrent_seed_counts_as_failing_not_raising():
    from lengthgen_utils.book import ch08
    from lengthgen_utils.core.models import LinearRNN
    from lengthgen_utils.core.tasks import FixedOffsetRetrieval
    from lengthgen_utils.run.evaluation import accuracy_by_length
    from lengthgen_utils.run.runners import recurrent_accuracy

    model = LinearRNN(16, d_state=8, n_models=3, seeds=[0, 1, 2])
    with torch.no_grad():
        model.A[1] = 3.0 * torch.eye(8)  # |eigenvalue| 3: C A^d B overflows float32 within about 80 steps
    task, lengths = FixedOffsetRetrieval(16, 3), [16, 32, 128, 256]
    assert model.finite_within(32).tolist() == [True, True, True]
    assert model.finite_within(128).tolist() == [True, False, True]
    with pytest.raises(ValueError, match="overflows"):
        accuracy_by_length(model, task, lengths, n_samples=64)
    acc = recurrent_accuracy(model, task, lengths, n_samples=64)
    assert acc.shape == (3, 4) and acc[1, 2:].eq(0).all()
    stable = accuracy_by_length(model.subset([0, 2]), task, lengths, n_samples=64)
    assert torch.equal(acc[[0, 2]], stable)  # the stable seeds are scored as before
    assert torch.equal(acc[1, :2], accuracy_by_length(model.subset([1]), task, lengths[:2], n_samples=64)[0])
    far = ch08.far_weight(model, 3, 16, 256)
    assert math.isinf(far[1]) and far[[0, 2]].isfinite().all()
    assert "one of the 3 seeds" in ch08.unstable_phrase(model, 256)
    assert ch08.unstable_phrase(model.subset([0, 2]), 256) == ""
    # an ensemble with no unstable seed is scored exactly as accuracy_by_length scores it
    assert torch.equal(recurrent_accuracy(model.subset([0, 2]), task, lengths, n_samples=64), stable)


@pytest.mark.parametrize("x,y", [([0.9, 0.95, 1.0, 0.97, 0.99], [0.1, 0.2, 0.15, 0.3, 0.05]),
                                 ([3.0, 1.0, 4.0, 1.5], [2.0, 0.5, 2.5, 6.0, 0.7, 0.9]),
                                 ([0.2, 0.1], [0.3, 0.4, 0.5])])
def test_rank_sum_p_is_scipys_exact_mann_whitney_without_ties(x, y):
    assert rank_sum_p(x, y) == pytest.approx(stats.mannwhitneyu(x, y, alternative="greater", method="exact").pvalue)


def test_rank_sum_p_handles_ties_and_draws_when_splits_are_many():
    x, y = [1.0, 1.0, 1.0, 0.5], [0.5, 0.5, 0.0]  # ties: the permutation distribution itself
    exact = stats.permutation_test((x, y), lambda a, b: stats.mannwhitneyu(a, b).statistic,
                                   permutation_type="independent", alternative="greater").pvalue
    assert rank_sum_p(x, y) == pytest.approx(exact)
    gen = torch.Generator().manual_seed(1)
    a, b = torch.rand(14, generator=gen) + 0.3, torch.rand(14, generator=gen)
    drawn = rank_sum_p(a, b, max_splits=5000)  # C(28, 14) > 5000 splits: drawn, not enumerated
    exact = stats.mannwhitneyu(a.tolist(), b.tolist(), alternative="greater", method="exact").pvalue
    assert abs(drawn - exact) < 0.01 + 3 * math.sqrt(exact / 5000)
    with pytest.raises(ValueError, match="at least one"):
        rank_sum_p([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        rank_sum_p([float("nan")], [1.0])


def test_ranks_above_is_a_rank_test_where_a_flag_test_cannot_pass():
    check = Checks("chapters/x")
    trained, null = [1.0, 1.0, 1.0, 0.93, 0.91], [0.1, 0.06, 0.2, 0.12, 0.08]
    assert not check.rate_beats("flags", [v >= 0.95 for v in trained], [v >= 0.95 for v in null], 0.05,
                                against="null")  # 3/5 against 0/5: Fisher p = 1/12
    assert check.ranks_above("numbers", trained, null, 0.05, against="null")  # every pair ordered: 1/252
    assert check.results[-1]["value"] == pytest.approx(1 / 252)
    assert not check.ranks_above("no better", null, trained, 0.05, against="null")
    with pytest.raises(TypeError, match="null is"):
        check.ranks_above("against", [1.0], [0.0], 0.05, against="")


def test_a_linear_sum_or_exp_head_that_cannot_normalise_diverges_in_training_instead_of_raising():
    """Outside training a vanishing sum (an overflowing logit) is refused by name; inside it (diverged models allowed) the model's
    weights are not finite and it scores about chance, the other models untouched."""
    from lengthgen_utils.core.models import RetrievalHead, diverged_models_allowed
    from lengthgen_utils.core.tasks import FixedOffsetRetrieval
    from lengthgen_utils.run.evaluation import accuracy_by_length

    head = RetrievalHead(8, d_model=8, d_head=4, pe="rope", attention="linear_sum", n_models=2, seeds=[0, 1])
    with torch.no_grad():
        head.w_q[1] = 0.0  # model 1: every logit 0, so its row sums to 0
    with pytest.raises(ValueError, match="linear_sum"):
        head.attention_row(8)
    with diverged_models_allowed(head):
        row = head.attention_row(8)
    assert row[0].isfinite().all() and not row[1].isfinite().all()
    acc = accuracy_by_length(head, FixedOffsetRetrieval(8, 2), [8], n_samples=32)
    assert acc.shape == (2, 1) and acc.isfinite().all()

    exp = RetrievalHead(8, d_model=8, d_head=4, pe="rope", attention="exp", n_models=2, seeds=[0, 1])
    with torch.no_grad():
        exp.w_q[1] *= 1e3  # model 1: logits far beyond exp's float32 range
    with pytest.raises(ValueError, match="overflow"):
        exp.attention_row(8)
    with diverged_models_allowed(exp):
        row = exp.attention_row(8)
    assert row[0].isfinite().all() and not row[1].isfinite().all()
    assert accuracy_by_length(exp, FixedOffsetRetrieval(8, 2), [8], n_samples=32).isfinite().all()
