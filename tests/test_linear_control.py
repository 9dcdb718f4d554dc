"""Tests of chapter 6: the linear-attention control, the direct kernel head and the min-norm interpolant."""
import math

import numpy as np
import pytest
import torch

from lengthgen_utils.run.optim import OptimizerSettings
from lengthgen_utils.analysis import theory as th
from lengthgen_utils.run.configs import RetrievalExperiment
from lengthgen_utils.run.evaluation import squared_error_by_length
from lengthgen_utils.analysis.kernel import factorized_kernel
from lengthgen_utils.core.models import KernelHead, RetrievalHead
from lengthgen_utils.core.rope import (apply_rope, rope_inverse_frequencies, rope_kernel_coefficients,
                                       rope_kernel_features)
from lengthgen_utils.run.runners import run_kernel_head
from lengthgen_utils.core.tasks import FixedOffsetRetrieval
from lengthgen_utils.run.training import train_squared_loss

TASK = FixedOffsetRetrieval(16, 3)
SGD_01 = OptimizerSettings("sgd", lr=0.01)
SPREAD_FREQUENCIES = tuple(float(x) for x in torch.linspace(0.3, 3.0, 8).tolist())
"""Eight frequencies spread over [0.3, 3.0] rad/token: a non-RoPE set whose features are well
conditioned on 15 training offsets, for the exact min-norm test."""
T = th.trained_relative_positions(16, 3)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_features_pinned():
    phi = rope_kernel_features([0, -3], d_head=4, base=100.0)
    expected = torch.tensor([[1.0, 1.0, 0.0, 0.0],
                             [math.cos(-3), math.cos(-0.3), math.sin(-3), math.sin(-0.3)]], dtype=torch.float64)
    torch.testing.assert_close(phi, expected)
    assert T.tolist() == list(range(-15, 0))


@pytest.mark.parametrize("interleaved", [False, True])
def test_kernel_coefficients_reproduce_rope_scores(interleaved):
    q, k = torch.randn(2, 16, generator=gen(1), dtype=torch.float64)
    c = rope_kernel_coefficients(q, k, interleaved)
    positions = torch.arange(40)
    q_rot = apply_rope(q.expand(40, 16).clone(), positions, interleaved=interleaved)
    k_rot = apply_rope(k.expand(40, 16).clone(), positions, interleaved=interleaved)
    scores = k_rot @ q_rot[-1]  # query at 39, keys 0..39: offsets -39..0
    torch.testing.assert_close(rope_kernel_features(positions - 39, 16) @ c, scores)


def test_factorized_kernel_matches_the_linear_head():
    model = RetrievalHead(attention="linear", n_models=3)
    c = factorized_kernel(model)
    for seq_len in (5, 16, 200):
        s = c @ rope_kernel_features(torch.arange(seq_len) - (seq_len - 1), 16).T
        torch.testing.assert_close(s, model.scores(seq_len).double(), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="RoPE"):
        factorized_kernel(RetrievalHead(pe="ape", max_len=32))


def test_linear_attention_weights_are_the_raw_logits():
    model = RetrievalHead(attention="linear", n_models=2)
    torch.testing.assert_close(model.attention_row(20), model.scores(20))
    softmax = RetrievalHead(attention="softmax", n_models=2)
    torch.testing.assert_close(softmax.attention_row(20).sum(-1), torch.ones(2))
    assert (model.attention_row(20).sum(-1) - 1).abs().min() > 1e-3  # no normaliser


@pytest.mark.parametrize("head", ["linear", "kernel"])
def test_query_output_is_causal_and_finite(head):
    """The query's output is the explicit sum over positions 0..L-1 and is finite at every length."""
    model = RetrievalHead(attention="linear", n_models=2) if head == "linear" else KernelHead(init_std=1.0, n_models=2)
    tokens, _ = TASK.sample(4, 12, gen(2))
    out, attn = model(tokens)
    assert attn.shape == (2, 4, 12)  # one weight per position up to the query, none beyond
    table = model.value_table() if head == "linear" else torch.eye(17)[:, :16].expand(2, 17, 16)  # [M, V+1, V]
    per_position = torch.stack([table[i][tokens] for i in range(2)])  # [M, B, L, V]
    ref = torch.einsum("ml,mblv->mbv", model.scores(12), per_position)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    # a prefix ending in a query only sees that prefix: appending tokens after the query cannot change it
    longer = torch.cat([tokens, torch.randint(0, 16, (4, 5), generator=gen(3))], 1)
    torch.testing.assert_close(model(longer[:, :12])[0], out)
    for seq_len in (2 + 3, 256, 4096):
        same = torch.zeros(1, seq_len, dtype=torch.long)
        same[:, -1] = 16
        assert torch.isfinite(model(same)[0]).all()


def test_kernel_head_query_value_is_zero_and_gradient_stays_in_the_row_space():
    model = KernelHead()
    assert torch.equal(model.c, torch.zeros(1, 16))
    history = train_squared_loss(model, TASK, SGD_01, steps=3, batch_size=64, seed=0, device="cpu")
    assert history.shape == (3, 1)
    phi = rope_kernel_features(T, 16)
    c = model.c.detach().double()[0]
    projection = phi.T @ torch.linalg.lstsq(phi.T, c[:, None]).solution[:, 0]
    assert (c - projection).norm() <= 1e-6 * c.norm()
    assert c.norm() > 0
    # the query token's value is zero: its weight s(0) never reaches the output
    tokens = torch.full((1, 6), 16)
    assert torch.equal(KernelHead(init_std=1.0)(tokens)[0], torch.zeros(1, 1, 16))


def test_per_model_seeds_train_each_model_exactly_as_alone():
    """One batched step for several data seeds: model i ends where it ends trained alone on seed[i]."""
    seeds = [3, 4, 5]
    together = KernelHead(n_models=3)
    history = train_squared_loss(together, TASK, SGD_01, steps=25, batch_size=16, seed=seeds, device="cpu")
    assert history.shape == (25, 3)
    for i, s in enumerate(seeds):
        alone = KernelHead()
        alone_history = train_squared_loss(alone, TASK, SGD_01, steps=25, batch_size=16, seed=s, device="cpu")
        torch.testing.assert_close(together.c[i], alone.c[0], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(history[:, i], alone_history[:, 0], rtol=1e-5, atol=1e-7)
    # the streams differ: the models do not
    assert not torch.allclose(together.c[0], together.c[1])


def test_one_seed_may_come_as_any_integer_or_a_list_of_one():
    runs = []
    for seed in (4, np.int64(4), [4]):
        model = KernelHead()
        runs.append(train_squared_loss(model, TASK, steps=3, batch_size=8, seed=seed, device="cpu"))
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])
    linear = RetrievalHead(attention="linear")
    train_squared_loss(linear, TASK, steps=1, batch_size=4, seed=[4], device="cpu")  # one model: nothing to pad


def test_kernel_head_run_rejects_settings_its_closed_forms_do_not_cover():
    for override in ({"fixed_length": True}, {"min_train_len": 8}):
        with pytest.raises(ValueError, match="fixed_length|min_train_len"):
            run_kernel_head(RetrievalExperiment(n_seeds=1, steps=1, **override), cache=False)


def test_kernel_head_run_rejects_another_task(monkeypatch):
    from lengthgen_utils.core import tasks

    monkeypatch.setitem(tasks.QUERY_TASKS, "other-task", FixedOffsetRetrieval)
    with pytest.raises(ValueError, match="task_family='other-task'"):
        run_kernel_head(RetrievalExperiment(n_seeds=1, steps=1, task_family="other-task"), cache=False)


@pytest.mark.parametrize("model, seed, error", [
    (KernelHead(n_models=2), [0, 1, 2], ValueError),  # one seed per model, or one for all
    (KernelHead(n_models=2), [0, -1], ValueError),
    (KernelHead(n_models=2), [0, 1.5], TypeError),
    (KernelHead(n_models=2), torch.tensor(3.0), TypeError),
    (RetrievalHead(attention="linear", n_models=2), [0, 1], TypeError),  # padding is exact only for KernelHead
])
def test_per_model_seeds_reject_bad_input(model, seed, error):
    with pytest.raises(error, match="seed|KernelHead"):
        train_squared_loss(model, TASK, steps=1, batch_size=4, seed=seed, device="cpu")


def test_kernel_head_run_is_cached(tmp_path, monkeypatch):
    from lengthgen_utils.run import runners

    exp = RetrievalExperiment(n_seeds=2, steps=20, batch_size=16, eval_samples=32, length_multiples=(1, 2))
    first = run_kernel_head(exp, "spread", SPREAD_FREQUENCIES, cache=tmp_path, device="cpu")
    assert len(list(tmp_path.rglob("*.pt"))) == 1

    def no_training(*args, **kwargs):
        raise AssertionError("a cached kernel head was trained again")

    monkeypatch.setattr(runners, "train_squared_loss", no_training)  # only a cache hit gets past this
    again = run_kernel_head(exp, "spread", SPREAD_FREQUENCIES, cache=tmp_path, device="cpu")
    monkeypatch.undo()
    assert len(list(tmp_path.rglob("*.pt"))) == 1
    assert torch.equal(first.c, again.c) and torch.equal(first.accuracy, again.accuracy)
    assert first.c.shape == (2, 16) and first.loss_history.shape == (20, 2) and first.accuracy.shape == (2, 2)
    # another frequency set is another entry
    run_kernel_head(exp, "rope", None, cache=tmp_path, device="cpu")
    assert len(list(tmp_path.rglob("*.pt"))) == 2


def test_min_norm_interpolant_interpolates_and_is_shortest():
    c = th.min_norm_interpolant(T, 3, 16, frequencies=SPREAD_FREQUENCIES)
    phi = rope_kernel_features(T, 16, frequencies=SPREAD_FREQUENCIES)
    torch.testing.assert_close(phi @ c, (T == -3).double(), atol=1e-10, rtol=0)
    assert c.norm().item() == pytest.approx(0.36831, abs=1e-4)
    null = torch.linalg.svd(phi).Vh[-1]  # 16 unknowns, 15 equations: one null direction
    torch.testing.assert_close(phi @ null, torch.zeros(15, dtype=torch.float64), atol=1e-10, rtol=0)
    assert (c + 0.1 * null).norm() > c.norm()
    # with RoPE's frequencies the same system is numerically singular: the exact interpolant is enormous
    assert th.min_norm_interpolant(T, 3, 16).norm() > 1e10


def test_min_norm_interpolant_rejects_bad_input():
    with pytest.raises(ValueError, match="-offset"):
        th.min_norm_interpolant([-1, -2], 3, 16)
    with pytest.raises(TypeError, match="trained"):
        th.min_norm_interpolant(torch.tensor([-1.0, -3.0]), 3, 16)
    with pytest.raises(ValueError, match="rcond"):
        th.min_norm_interpolant(T, 3, 16, rcond=0.0)
    with pytest.raises(ValueError, match="d_head"):
        th.min_norm_interpolant(T, 3, 15)
    with pytest.raises(ValueError, match="frequencies"):
        rope_kernel_features(T, 16, frequencies=[1.0, 2.0])
    with pytest.raises(ValueError, match="train_len"):
        th.trained_relative_positions(4, 3)


def test_gradient_descent_closed_form_matches_iteration():
    h, b, _ = th.squared_loss_quadratic(16, 3, 16, 16)
    lr = 0.5 / torch.linalg.eigvalsh(h).max().item()
    c = torch.zeros(16, dtype=torch.float64)
    for _ in range(40):
        c = c - lr * 2 * (h @ c - b)
    torch.testing.assert_close(th.gradient_descent_kernel(h, b, lr, 40), c, atol=1e-10, rtol=1e-8)
    with pytest.raises(ValueError, match="lr"):
        th.gradient_descent_kernel(h, b, 2.0 / torch.linalg.eigvalsh(h).max().item(), 10)


def test_expected_squared_error_matches_sampling_and_the_quadratic():
    model = KernelHead(init_std=0.3, seeds=[4])
    c = model.c.detach().double()[0]
    lengths = [16, 40]
    measured = squared_error_by_length(model, TASK, lengths, n_samples=20000, seed=1)[0]
    for col, seq_len in enumerate(lengths):
        predicted = th.expected_squared_error(model.scores(seq_len).detach().double()[0], 3, 16)
        assert measured[col].item() == pytest.approx(predicted.item(), rel=0.03)
    # the quadratic is the average of the same expectation over training lengths 5..16
    h, b, z = th.squared_loss_quadratic(16, 3, 16, 16)
    per_length = torch.stack([th.expected_squared_error(model.scores(L).detach().double()[0], 3, 16)
                              for L in range(5, 17)])
    torch.testing.assert_close(c @ h @ c - 2 * b @ c + z, per_length.mean())


def test_kernel_head_rejects_bad_input():
    with pytest.raises(ValueError, match="d_head"):
        KernelHead(d_head=7)
    with pytest.raises(ValueError, match="seeds"):
        KernelHead(n_models=2, seeds=[1])
    with pytest.raises(ValueError, match="tokens"):
        KernelHead()(torch.full((1, 5), 17))
    with pytest.raises(TypeError, match="tokens"):
        KernelHead()(torch.zeros(1, 5))
    assert torch.equal(KernelHead().frequencies, rope_inverse_frequencies(16))


def test_kernel_head_is_evaluated_by_the_shared_accuracy_function():
    """accuracy_by_length drives every model type through one call (a KernelHead once broke it)."""
    from lengthgen_utils.run.evaluation import accuracy_by_length

    model = KernelHead(init_std=1.0, n_models=2)
    acc = accuracy_by_length(model, FixedOffsetRetrieval(16, 3), [16, 32], n_samples=64)
    assert acc.shape == (2, 2) and ((acc >= 0) & (acc <= 1)).all()
