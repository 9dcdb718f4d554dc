"""The aliases predicted before training: the rule, the committed file and the scoring against a null."""
import json
import math

import pytest
import torch

from lengthgen_utils.tools.cli import main
from lengthgen_utils.analysis import predictions as P
from lengthgen_utils.analysis.theory import pair_recurrences
from lengthgen_utils.core.rope import rope_inverse_frequencies


def test_the_committed_file_is_what_the_rule_gives_today():
    """A test of the code: if the rule changes, the committed predictions must be rewritten (and the diff
    shows it), so no chapter scores a prediction the rule no longer makes."""
    committed = json.loads(P.PREDICTIONS_FILE.read_text())
    assert committed == json.loads(json.dumps(P.book_predictions()))
    assert committed["command"] == "python -m lengthgen_utils predict"


def test_the_command_writes_the_same_file(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["predict", "--output", str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads(P.PREDICTIONS_FILE.read_text())
    assert str(out) in capsys.readouterr().out


def test_the_book_setting_selects_pairs_0_to_2_and_first_aliases_at_lag_119():
    assert P.selecting_pairs(1e4, 16, 16) == [0, 1, 2]  # pair 2 turns 1.6 rad across 16 tokens, pair 3 0.5
    for k in (1, 2, 3, 5):
        p = P.predict(1e4, 16, k, 16, 16384)
        assert p["first_alias"] == k + 119 and p["first_failing_length"] == k + 120
    assert P.predict(1e4, 16, 5, 32, 4096)["first_alias"] == 124  # the transformer's window: the same lag


def test_every_pair_selects_at_base_10_so_no_alias_is_predicted():
    assert P.selecting_pairs(10.0, 16, 16) == list(range(8))
    assert P.predict(10.0, 16, 3, 16, 16384) == {"pairs": list(range(8)), "distances": [], "first_alias": None,
                                                  "first_failing_length": None}


def test_the_tolerance_is_what_the_module_says():
    """With pi/3 (chapter 4's tolerance for the weight-based prediction) lag 57 would qualify: the docstring's
    reason for pi/4."""
    theta = rope_inverse_frequencies(16, 1e4)
    assert 57 in pair_recurrences(theta, [0, 1, 2], 200, math.pi / 3).tolist()
    assert P.candidate_lags(1e4, 16, 16, 200).tolist() == [119, 120]


def test_candidates_are_lags_where_every_selecting_pair_is_near_a_whole_turn():
    theta = rope_inverse_frequencies(16, 500.0)
    pairs = P.selecting_pairs(500.0, 16, 32)
    lags = P.candidate_lags(500.0, 16, 32, 2000)
    for lag in range(1, 2001):
        error = [abs((theta[i].item() * lag + math.pi) % (2 * math.pi) - math.pi) for i in pairs]
        assert (lag in lags.tolist()) == all(e <= P.PHASE_TOLERANCE for e in error)


def test_score_counts_hits_against_random_lag_sets():
    score = P.score_lags([119, 120, None, 377], [119, 120, 377], 1000, n_null=500)
    assert score["n"] == 3 and score["hits"] == 1.0
    assert score["null_q99"] < 0.5  # three random lags out of 1000 rarely hold a measured one
    assert P.score_lags([5], [119], 1000, n_null=10)["hits"] == 0.0


@pytest.mark.parametrize("call, match", [
    (lambda: P.predict(1e4, 15, 1, 16, 100), "d_head must be even"),
    (lambda: P.predict(-1.0, 16, 1, 16, 100), "base"),
    (lambda: P.predict(1e4, 16, 15, 16, 100), "offset"),
    (lambda: P.predict(1e4, 16, 1, 16, 10), "max_distance"),
    (lambda: P.score_lags([None], [3], 10), "no lag"),
    (lambda: P.score_lags([11], [3], 10), "measured lag"),
    (lambda: P.load_prediction("single head", 7.0, 16, 1, 16), "no committed prediction"),
])
def test_bad_input_is_refused_with_its_name(call, match):
    with pytest.raises((ValueError, TypeError, KeyError), match=match):
        call()


def test_score_null_is_seeded():
    a = P.score_lags([119, 200], [119], 500, n_null=50, seed=3)["null_hits"]
    b = P.score_lags([119, 200], [119], 500, n_null=50, seed=3)["null_hits"]
    assert torch.equal(a, b)
