"""Unit tests of the foundation: task, RoPE, APE, the ensemble head, training and evaluation.

Each test pins a real value; RoPE is checked against an independent
implementation (rotary-embedding-torch, interleaved pairing).
"""
import math

import pytest
import torch

from lengthgen_utils.run.optim import OptimizerSettings
from lengthgen_utils.run.configs import RetrievalExperiment
from lengthgen_utils.run.evaluation import accuracy_by_length
from lengthgen_utils.core.models import RetrievalHead
from lengthgen_utils.core.encodings import LearnedAPE
from lengthgen_utils.core.rope import apply_rope, rope_angles, rope_inverse_frequencies, rope_rotation_matrix
from lengthgen_utils.run.profiles import PROFILES, get_profile
from lengthgen_utils.core.tasks import IGNORE_INDEX, FixedOffsetRetrieval
from lengthgen_utils.run.training import train


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- the task
@pytest.mark.parametrize("offset", [1, 2, 3, 5])
def test_targets_are_the_token_at_the_offset(offset):
    task = FixedOffsetRetrieval(vocab_size=16, offset=offset)
    tokens, targets = task.sample(64, 12, gen())
    assert tokens.shape == (64, 12) and targets.shape == (64, 12)
    assert tokens.dtype == torch.long and targets.dtype == torch.long
    assert (tokens[:, -1] == task.query_token).all()
    assert (tokens[:, :-1] < 16).all() and (tokens[:, :-1] >= 0).all()
    assert torch.equal(targets[:, -1], tokens[:, 12 - 1 - offset])  # the one target, at the query
    assert (targets[:, :-1] == IGNORE_INDEX).all() and task.scored_positions(12).tolist() == [False] * 11 + [True]


def test_task_sampling_is_seeded():
    task = FixedOffsetRetrieval(16, 3)
    a, b, c = task.sample(8, 10, gen(1)), task.sample(8, 10, gen(1)), task.sample(8, 10, gen(2))
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


def test_task_sample_space_and_chance():
    task = FixedOffsetRetrieval(4, 1)
    assert task.sample_space_size(5) == 4 ** 4
    assert task.chance == 0.25


@pytest.mark.parametrize("kwargs, match", [
    (dict(vocab_size=1, offset=1), "vocab_size"),
    (dict(vocab_size=16, offset=0), "offset"),
])
def test_task_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FixedOffsetRetrieval(**kwargs)


@pytest.mark.parametrize("seq_len", [4, 3, 1])
def test_offset_too_large_for_the_length_is_rejected(seq_len):
    task = FixedOffsetRetrieval(16, 3)  # needs seq_len >= 5
    with pytest.raises(ValueError, match="seq_len"):
        task.sample(2, seq_len, gen())


def test_task_rejects_float_sizes():
    with pytest.raises(TypeError, match="batch_size"):
        FixedOffsetRetrieval(16, 3).sample(2.0, 8, gen())


# ---------------------------------------------------------------- RoPE
def test_rope_inverse_frequencies_pinned():
    theta = rope_inverse_frequencies(16, 10000.0)
    assert theta.shape == (8,)
    assert theta[0] == 1.0
    assert math.isclose(float(theta[1]), 10000 ** (-2 / 16), rel_tol=1e-12)
    assert math.isclose(float(theta[-1]), 10000 ** (-14 / 16), rel_tol=1e-12)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_position_zero_is_identity_and_norms_are_preserved(interleaved):
    x = torch.randn(3, 4, 10, 16, generator=gen())
    pos = torch.arange(10)
    y = apply_rope(x, pos, interleaved=interleaved)
    torch.testing.assert_close(y[..., 0, :], x[..., 0, :], rtol=0, atol=0)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-6, atol=1e-5)


def test_rope_interleaved_matches_rotary_embedding_torch():
    from rotary_embedding_torch import RotaryEmbedding

    x = torch.randn(2, 3, 20, 16, generator=gen())
    reference = RotaryEmbedding(dim=16, theta=10000).rotate_queries_or_keys(x)
    ours = apply_rope(x, torch.arange(20), interleaved=True)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)


def test_rope_half_split_matches_reference_after_channel_permutation():
    from rotary_embedding_torch import RotaryEmbedding

    x = torch.randn(2, 20, 16, generator=gen())
    # half-split pairs (i, i+8); interleaved pairs (2i, 2i+1): move channel i+8 next to channel i.
    perm = torch.stack([torch.arange(8), torch.arange(8) + 8], -1).flatten()
    reference = RotaryEmbedding(dim=16, theta=10000).rotate_queries_or_keys(x[..., perm])
    ours = apply_rope(x, torch.arange(20))[..., perm]
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_matrix_form_is_orthogonal_and_relative(interleaved):
    angles_m = rope_angles(torch.tensor(7), 8)
    angles_n = rope_angles(torch.tensor(19), 8)
    r_m, r_n = rope_rotation_matrix(angles_m, interleaved), rope_rotation_matrix(angles_n, interleaved)
    r_rel = rope_rotation_matrix(rope_angles(torch.tensor(12), 8), interleaved)
    torch.testing.assert_close(r_m.T @ r_m, torch.eye(8, dtype=torch.float64))
    torch.testing.assert_close(r_m.T @ r_n, r_rel)  # R_m^T R_n = R_{n-m}
    x = torch.randn(8, dtype=torch.float64, generator=gen())
    torch.testing.assert_close(apply_rope(x[None], torch.tensor([7]), interleaved=interleaved)[0], r_m @ x)


def test_rope_scores_depend_on_offset_only():
    q = torch.randn(16, generator=gen(1))
    k = torch.randn(16, generator=gen(2))

    def score(m, n):
        return float(apply_rope(q[None], torch.tensor([m]))[0] @ apply_rope(k[None], torch.tensor([n]))[0])

    base = score(5, 2)
    for shift in (1, 100, 1000, 100000):
        assert abs(score(5 + shift, 2 + shift) - base) < 1e-4


def test_rope_batched_positions_broadcast_over_heads():
    x = torch.randn(2, 4, 6, 8, generator=gen())
    pos = torch.stack([torch.arange(6), torch.arange(6) + 50])
    y = apply_rope(x, pos)
    torch.testing.assert_close(y[1], apply_rope(x[1], torch.arange(6) + 50))


def test_rope_angles_are_float32_for_low_precision_inputs():
    x = torch.randn(1, 4000, 32, generator=gen()).to(torch.float16)
    y = apply_rope(x, torch.arange(4000))
    assert y.dtype == torch.float16
    exact = apply_rope(x.double(), torch.arange(4000))
    assert (y.double() - exact).abs().max() < 1e-2  # angles in float16 would be off by O(1) rad here


@pytest.mark.parametrize("bad, err", [
    (dict(x=torch.randn(4, 7)), ValueError),  # odd d_head
    (dict(x=torch.randn(4, 8), positions=torch.arange(5)), ValueError),  # length mismatch
    (dict(x=torch.randn(4, 8), positions=torch.arange(4).float()), TypeError),  # float positions
    (dict(x=torch.arange(32).view(4, 8)), TypeError),  # integer x
])
def test_apply_rope_rejects_bad_input(bad, err):
    args = dict(positions=torch.arange(4)) | bad
    with pytest.raises(err):
        apply_rope(args["x"], args["positions"])


def test_rope_frequencies_reject_odd_dimension_and_bad_base():
    with pytest.raises(ValueError, match="d_head"):
        rope_inverse_frequencies(7)
    with pytest.raises(ValueError, match="base"):
        rope_inverse_frequencies(8, base=1.0)


# ---------------------------------------------------------------- APE
def test_ape_rejects_positions_beyond_the_table():
    ape = LearnedAPE()
    params = ape.init_parameters(n_models=1, d_model=4, max_len=16, n_heads=1, generators=[gen(0)])
    assert ape.embed(params, torch.arange(16)).shape == (1, 16, 4)
    with pytest.raises(ValueError, match=r"16 rows.*length 17"):
        ape.embed(params, torch.arange(17))
    with pytest.raises(ValueError):
        ape.embed(params, torch.tensor([-1, 0]))


def test_ape_init_is_explicit():
    table = LearnedAPE(init_std=0.02).init_parameters(1, 32, 4096, 1, [gen(0)])["table"]
    assert abs(float(table.std()) - 0.02) < 1e-3


# ---------------------------------------------------------------- the head
@pytest.mark.parametrize("pe", ["rope", "ape", "nope"])
def test_head_shapes(pe):
    model = RetrievalHead(16, 32, 16, pe, max_len=64, n_models=3)
    tokens, _ = FixedOffsetRetrieval(16, 3).sample(5, 20, gen())
    logits, attn = model(tokens)
    assert logits.shape == (3, 5, 16) and attn.shape == (3, 5, 20)
    torch.testing.assert_close(attn.sum(-1), torch.ones(3, 5))


def test_rope_head_logits_unchanged_under_global_shift():
    model = RetrievalHead(16, 32, 16, "rope", n_models=4)
    tokens, _ = FixedOffsetRetrieval(16, 3).sample(8, 24, gen())
    ref, _ = model(tokens)
    for shift in (1, 1000, 100000):
        out, _ = model(tokens, position_shift=shift)
        assert (out - ref).abs().max() < 1e-5
        assert (model.scores(24, shift) - model.scores(24)).abs().max() < 1e-4


def test_ape_head_logits_change_under_global_shift():
    model = RetrievalHead(16, 32, 16, LearnedAPE(init_std=0.5), max_len=128, n_models=2)
    assert (model.scores(24, 50) - model.scores(24)).abs().max() > 1e-2


def test_nope_head_attends_uniformly():
    model = RetrievalHead(16, 32, 16, "nope", n_models=2)
    torch.testing.assert_close(model.attention_row(10), torch.full((2, 10), 0.1))


@pytest.mark.parametrize("pe", ["rope", "ape"])
def test_ensemble_equals_models_run_one_at_a_time(pe):
    seeds = [3, 11, 42]
    ensemble = RetrievalHead(16, 32, 16, pe, max_len=64, n_models=3, seeds=seeds)
    tokens, _ = FixedOffsetRetrieval(16, 3).sample(6, 20, gen())
    logits, attn = ensemble(tokens)
    for i, s in enumerate(seeds):
        alone = RetrievalHead(16, 32, 16, pe, max_len=64, n_models=1, seeds=[s])
        for (name, p_alone), (_, p_ens) in zip(alone.named_parameters(), ensemble.named_parameters()):
            assert torch.equal(p_alone[0], p_ens[i]), name
        l1, a1 = alone(tokens)
        torch.testing.assert_close(l1[0], logits[i], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a1[0], attn[i], rtol=1e-6, atol=1e-6)


def test_training_an_ensemble_equals_training_each_model_alone():
    task = FixedOffsetRetrieval(16, 3)
    # float64, so that the only differences are rounding (batched and single matmuls
    # sum in different orders): any coupling between models would show at O(1).
    ensemble = RetrievalHead(16, 32, 16, "rope", n_models=3, seeds=[0, 1, 2]).double()
    hist = train(ensemble, task, steps=30, batch_size=32, seed=5, device="cpu")
    for i in range(3):
        alone = RetrievalHead(16, 32, 16, "rope", n_models=1, seeds=[i]).double()
        hist1 = train(alone, task, steps=30, batch_size=32, seed=5, device="cpu")
        torch.testing.assert_close(hist1[:, 0], hist[:, i], rtol=1e-6, atol=1e-7)
        for (name, p_alone), (_, p_ens) in zip(alone.named_parameters(), ensemble.named_parameters()):
            rel = float(((p_alone[0] - p_ens[i]).norm() / p_ens[i].norm()).detach())
            assert rel < 1e-9, (name, rel)


def test_select_copies_one_member():
    model = RetrievalHead(16, 32, 16, "ape", max_len=32, n_models=3)
    one = model.select(2)
    torch.testing.assert_close(one.scores(20)[0], model.scores(20)[2])
    with pytest.raises(ValueError, match="index"):
        model.select(3)


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(pe="rope", d_head=15), ValueError, "d_head"),
    (dict(pe="sinusoidal-typo"), ValueError, "registered ones are"),
    (dict(vocab_size=1), ValueError, "vocab_size"),
    (dict(attention="relu"), ValueError, "attention"),
    (dict(n_models=0), ValueError, "n_models"),
    (dict(n_models=2, seeds=[1]), ValueError, "seeds"),
])
def test_head_rejects_bad_configuration(kwargs, err, match):
    with pytest.raises(err, match=match):
        RetrievalHead(**kwargs)


def test_ape_head_rejects_lengths_beyond_its_table_before_computing():
    model = RetrievalHead(16, 32, 16, "ape", max_len=16)
    tokens, _ = FixedOffsetRetrieval(16, 3).sample(2, 17, gen())
    with pytest.raises(ValueError, match=r"16 rows.*17"):
        model(tokens)
    with pytest.raises(ValueError, match="16 rows"):
        accuracy_by_length(model, FixedOffsetRetrieval(16, 3), [16, 32])


def test_head_rejects_out_of_vocabulary_tokens():
    model = RetrievalHead(16, 32, 16, "rope")
    with pytest.raises(ValueError, match="tokens"):
        model(torch.full((2, 8), 17, dtype=torch.long))


# ---------------------------------------------------------------- training and evaluation
def test_training_is_deterministic_and_seeds_differ():
    task = FixedOffsetRetrieval(16, 3)
    runs = []
    for seeds in ([0, 1], [0, 1], [2, 3]):
        model = RetrievalHead(16, 32, 16, "rope", n_models=2, seeds=seeds)
        runs.append(train(model, task, steps=20, batch_size=16, device="cpu"))
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


def test_rope_learns_and_extrapolates_ape_does_not():
    """A small end-to-end version of chapter 1's claim."""
    task = FixedOffsetRetrieval(16, 3)
    acc = {}
    for pe in ("rope", "ape"):
        model = RetrievalHead(16, 32, 16, pe, max_len=64, n_models=2)
        train(model, task, steps=300, batch_size=128, device="cpu")
        acc[pe] = accuracy_by_length(model, task, [16, 64], n_samples=256)
    assert (acc["rope"] >= 0.95).all(), acc["rope"]
    assert (acc["ape"][:, 0] >= 0.95).all() and (acc["ape"][:, 1] < 0.25).all(), acc["ape"]


def test_accuracy_of_a_constant_predictor_is_chance():
    task = FixedOffsetRetrieval(16, 3)
    model = RetrievalHead(16, 32, 16, "nope")
    with torch.no_grad():
        model.w_o.zero_()
        model.w_o[..., 5] = 1.0  # logits favour class 5 whatever the input
        model.embed.fill_(1.0)
        model.w_v.fill_(1.0)
    acc = accuracy_by_length(model, task, [16], n_samples=4096)
    assert abs(float(acc) - task.chance) < 0.015


def test_train_rejects_bad_arguments():
    model = RetrievalHead(16, 32, 16, "rope")
    task = FixedOffsetRetrieval(16, 3)
    with pytest.raises(ValueError, match="steps"):
        train(model, task, steps=0)
    with pytest.raises(ValueError, match="lr"):
        train(model, task, OptimizerSettings(lr=-1.0), steps=1)
    with pytest.raises(ValueError, match="offset"):
        train(model, task, steps=1, train_len=4)
    with pytest.raises(ValueError, match="vocab_size"):
        train(model, FixedOffsetRetrieval(8, 3), steps=1)


# ---------------------------------------------------------------- profiles
def test_profiles(monkeypatch):
    monkeypatch.setenv("LENGTHGEN_PROFILE", "quick")
    assert get_profile() is PROFILES["quick"]
    assert get_profile("full").n_seeds >= 10
    assert all(p.n_seeds >= 5 for p in PROFILES.values())
    monkeypatch.setenv("LENGTHGEN_PROFILE", "fast")
    with pytest.raises(ValueError, match="profile"):
        get_profile()


def test_experiment_rejects_a_training_length_too_short_for_the_offset():
    with pytest.raises(ValueError, match="train_len"):
        RetrievalExperiment(offset=5, train_len=6)
