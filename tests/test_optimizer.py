"""The one optimiser builder (``lengthgen_utils.run.optim``): each rule is the update it names, written
out independently here, every trainer uses it, the decay spares LayerNorm scales and biases, and
bad settings are refused by name."""
import pytest
import torch
from torch import nn

from lengthgen_utils.core.fast import FastTransformer
from lengthgen_utils.core.models import KernelHead, LinearRNN, RetrievalHead
from lengthgen_utils.core.tasks import FixedOffsetRetrieval
from lengthgen_utils.run import optim
from lengthgen_utils.run.configs import RetrievalExperiment, TransformerExperiment
from lengthgen_utils.run.optim import OptimizerSettings, build_optimizer, decays, register_optimizer
from lengthgen_utils.run.training import train

TASK = FixedOffsetRetrieval(16, 3)


def _grads(model, seed=0):
    """Give every parameter a reproducible gradient; returns them."""
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_decay_spares_layernorm_and_biases_and_nothing_else():
    tf = FastTransformer(16, 2, 4, 32)
    kept = sorted(n for n, _ in tf.named_parameters() if not decays(n))
    assert kept == sorted(["ln_f_w", "ln_f_b"] + [f"blocks.{i}.{n}" for i in (0, 1)
                                                  for n in ("ln1_w", "ln1_b", "ln2_w", "ln2_b", "b_in", "b_mlp_out")])
    for model in (RetrievalHead(pe="ape"), KernelHead(), LinearRNN()):  # no LayerNorm, no bias: all decay
        assert all(decays(n) for n, _ in model.named_parameters())
    plain = nn.ModuleDict({"fc": nn.Linear(4, 4), "ln_f": nn.LayerNorm(4)})  # torch's names, as in the benchmark
    assert {n: decays(n) for n, _ in plain.named_parameters()} == {
        "fc.weight": True, "fc.bias": False, "ln_f.weight": False, "ln_f.bias": False}
    groups = build_optimizer(tf, OptimizerSettings(weight_decay=0.1)).param_groups
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0] and len(groups[1]["params"]) == len(kept)


@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_adamw_is_torch_adamw_over_the_parameters_bit_for_bit(wd):
    """What every single-head number of the book was trained with: torch's AdamW over ``model.parameters()``."""
    ours, theirs = RetrievalHead(n_models=2), RetrievalHead(n_models=2)
    opt_ours = build_optimizer(ours, OptimizerSettings(lr=1e-2, weight_decay=wd))
    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=wd)
    for seed in range(5):
        _grads(ours, seed), _grads(theirs, seed)
        opt_ours.step(), opt_theirs.step()
    for (n, a), b in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.equal(a, b), n


def _two_steps(settings):
    """Two steps of the built optimiser on a head, with known gradients: ``(w0, g1, w1, g2, w2)``, one dict each."""
    model = RetrievalHead(n_models=2)
    weights = lambda: {n: p.detach().clone() for n, p in model.named_parameters()}  # noqa: E731
    opt = build_optimizer(model, settings)
    w0, g1 = weights(), _grads(model, 1)
    opt.step()
    w1, g2 = weights(), _grads(model, 2)
    opt.step()
    return w0, g1, w1, g2, weights()


def test_sgd_is_plain_sgd_with_decoupled_decay_and_heavy_ball_momentum():
    w0, g1, w1, g2, w2 = _two_steps(OptimizerSettings("sgd", lr=0.1, weight_decay=0.5, momentum=0.9))
    for n in w0:
        torch.testing.assert_close(w1[n], w0[n] * (1 - 0.1 * 0.5) - 0.1 * g1[n], rtol=0, atol=1e-6)
        torch.testing.assert_close(w2[n], w1[n] * (1 - 0.1 * 0.5) - 0.1 * (0.9 * g1[n] + g2[n]), rtol=0, atol=1e-6)


def test_plain_sgd_is_torch_sgd_exactly():
    a, b = KernelHead(n_models=2), KernelHead(n_models=2)
    opt_a = build_optimizer(a, OptimizerSettings("sgd", lr=0.05))
    opt_b = torch.optim.SGD(b.parameters(), lr=0.05)
    for seed in range(3):
        _grads(a, seed), _grads(b, seed)
        opt_a.step(), opt_b.step()
    assert torch.equal(a.c, b.c)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sign_descent_steps_by_the_sign_of_the_gradient_or_of_its_average(momentum):
    w0, g1, w1, g2, w2 = _two_steps(OptimizerSettings("sign", lr=1e-3, weight_decay=0.1, momentum=momentum))
    for n in w0:
        m1 = (1 - momentum) * g1[n]
        m2 = momentum * m1 + (1 - momentum) * g2[n]
        torch.testing.assert_close(w1[n], w0[n] * (1 - 1e-4) - 1e-3 * m1.sign(), rtol=0, atol=1e-7)
        torch.testing.assert_close(w2[n], w1[n] * (1 - 1e-4) - 1e-3 * m2.sign(), rtol=0, atol=1e-7)


@pytest.mark.parametrize("settings", [OptimizerSettings("sgd", lr=0.05, momentum=0.9),
                                      OptimizerSettings("sign", lr=1e-3, weight_decay=0.1)])
def test_every_rule_keeps_ensemble_members_independent(settings):
    """Model i of an ensemble receives the update it would receive trained alone (every rule is elementwise)."""
    both = RetrievalHead(n_models=2, seeds=[0, 1])
    train(both, TASK, settings, steps=8, batch_size=16, device="cpu")
    alone = RetrievalHead(n_models=1, seeds=[1])
    train(alone, TASK, settings, steps=8, batch_size=16, device="cpu")
    for (n, a), b in zip(both.named_parameters(), alone.parameters()):
        torch.testing.assert_close(a[1:], b, rtol=0, atol=1e-6, msg=n)


def test_the_transformer_trainer_uses_the_builder_and_keeps_layernorm_undecayed():
    """With a learning rate too small to move anything, only decay could change a weight: LayerNorm stays."""
    from lengthgen_utils.core.tasks import DelayedCopy
    from lengthgen_utils.run.training import train_sequence

    model = FastTransformer(16, 1, 2, 16, max_len=16)
    ln_before = model.blocks[0].ln1_w.detach().clone()
    w_before = model.blocks[0].w_qkv.detach().clone()
    train_sequence(model, DelayedCopy(16, 2), OptimizerSettings("sgd", lr=1e-30, weight_decay=1e28), steps=1,
                   batch_size=2, train_len=8, device="cpu")
    assert torch.equal(model.blocks[0].ln1_w.detach(), ln_before)
    torch.testing.assert_close(model.blocks[0].w_qkv.detach(), w_before * (1 - 1e-2))


def test_experiments_carry_the_optimizer_into_training():
    exp = RetrievalExperiment(optimizer="sign", lr=1e-3, momentum=0.5)
    assert exp.optimizer_settings == OptimizerSettings("sign", 1e-3, 0.0, 0.5)
    assert TransformerExperiment().optimizer_settings == OptimizerSettings("adamw", 1e-3, 0.05)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        RetrievalExperiment(optimizer="lion")


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="lion"), "optimizer must be one of"),
    (dict(name=3), "optimizer must be a name"),
    (dict(momentum=0.9), "momentum must be 0 for 'adamw'"),
    (dict(name="sgd", momentum=1.0), r"momentum must be in \[0, 1\)"),
    (dict(lr=0.0), "lr must be a finite number > 0"),
    (dict(lr=float("nan")), "lr must be a finite number > 0"),
    (dict(weight_decay=-0.1), "weight_decay must be a finite number >= 0"),
])
def test_bad_settings_are_refused_by_name(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        OptimizerSettings(**kwargs)


def test_the_builder_and_the_trainers_refuse_what_is_not_settings():
    with pytest.raises(TypeError, match="optimizer must be an OptimizerSettings or a sequence"):
        build_optimizer(RetrievalHead(), "adam")
    with pytest.raises(TypeError, match="optimizer must be an OptimizerSettings or a sequence of one per model"):
        train(RetrievalHead(), TASK, {"lr": 1e-2}, steps=1)
    with pytest.raises(ValueError, match="fused applies to 'adamw' only"):
        build_optimizer(RetrievalHead(), OptimizerSettings("sgd", lr=0.1), fused=True)
    with pytest.raises(ValueError, match="registered already"):
        register_optimizer("adamw")
    assert sorted(optim.OPTIMIZERS) == ["adamw", "sgd", "sign"]
