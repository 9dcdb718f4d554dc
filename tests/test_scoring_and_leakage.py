"""Evaluation: scoring against chance, no leakage of evaluation lengths into training, statistics in
figures, determinism.
"""
import warnings

import numpy as np
import pytest
import torch

from lengthgen_utils.book import figures, style
from lengthgen_utils.core import tasks
from lengthgen_utils.core.models import RetrievalHead, Transformer
from lengthgen_utils.core.tasks import IGNORE_INDEX, DelayedCopy, FixedOffsetRetrieval
from lengthgen_utils.run import configs, evaluation, profiles, training


def _transformer():
    return Transformer(8, 1, 2, 8, "rope", n_models=1)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


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


