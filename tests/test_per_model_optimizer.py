"""One optimiser setting per model: a mixed ensemble's member equals the model trained alone with its setting.

Tolerance: none (``torch.equal``). The per-model step (:class:`~lengthgen_utils.run.optim.PerModelOptimizer`)
performs torch's operations for each rule in torch's order, with each per-model coefficient computed in
float64 and rounded once to float32 as torch rounds its Python scalar, and every operation of the models is
per model (no reduction over the model axis); so on the CPU each member's weights and losses are bit for bit
those of its lone training. A difference of one rounding anywhere (a coefficient rounded twice, a multiply-add
split in two) would fail these tests after the first step.
"""
import pytest
import torch

from lengthgen_utils.core.models import RetrievalHead, diverged_models_allowed
from lengthgen_utils.core.tasks import FixedOffsetRetrieval
from lengthgen_utils.run.optim import (OptimizerSettings, PerModelOptimizer, _groups, build_optimizer,
                                       per_model_settings)
from lengthgen_utils.run.evaluation import accuracy_by_length
from lengthgen_utils.run.training import train

TASK = FixedOffsetRetrieval(16, 3)

# three settings per rule, differing in every hyper-parameter the rule reads (0 included: a plain member
# beside decayed or momentum members)
MIXED = {
    "adamw": [OptimizerSettings("adamw", lr=1e-2), OptimizerSettings("adamw", lr=3e-3, weight_decay=1.0),
              OptimizerSettings("adamw", lr=2e-2, weight_decay=0.1)],
    "sgd": [OptimizerSettings("sgd", lr=0.5), OptimizerSettings("sgd", lr=0.1, momentum=0.9, weight_decay=0.3),
            OptimizerSettings("sgd", lr=0.2, momentum=0.5)],
    "sign": [OptimizerSettings("sign", lr=1e-2), OptimizerSettings("sign", lr=3e-3, momentum=0.9),
             OptimizerSettings("sign", lr=5e-3, weight_decay=1.0, momentum=0.5)],
}
SEEDS = (0, 1)


def _head(seeds):
    return RetrievalHead(16, 32, 16, "rope", max_len=64, n_models=len(seeds), seeds=seeds)


def _train(model, optimizer, steps=30):
    return train(model, TASK, optimizer, steps=steps, batch_size=16, train_len=16, seed=3, device="cpu")


@pytest.mark.parametrize("rule", sorted(MIXED))
def test_a_mixed_ensemble_member_equals_the_model_trained_alone_with_its_setting(rule):
    """Models interleaved (setting-major would hide an index slip): member (setting j, seed s) sits at row
    ``s * 3 + j``; its weights and loss history equal the 2-seed ensemble trained alone with setting j."""
    settings = MIXED[rule]
    rows = [(s, j) for s in SEEDS for j in range(len(settings))]
    mixed = _head([s for s, _ in rows])
    history = _train(mixed, [settings[j] for _, j in rows])
    picked = [[i for i, (_, jj) in enumerate(rows) if jj == j] for j in range(len(settings))]
    for j, setting in enumerate(settings):
        alone = _head(list(SEEDS))
        assert torch.equal(history[:, picked[j]], _train(alone, setting)), (rule, setting)
        for (name, p), (_, q) in zip(mixed.named_parameters(), alone.named_parameters()):
            assert torch.equal(p[picked[j]], q), (rule, setting, name)
        assert not torch.equal(history[-1, picked[j]], history[-1, picked[j - 1]]), \
            "the settings must differ in effect, or the test shows nothing"


@pytest.mark.parametrize("rule", sorted(MIXED))
def test_a_diverged_member_gives_nan_and_leaves_the_others_as_trained_alone(rule):
    """A member whose weights went NaN (its training diverged: gradient descent at a large rate does so under
    some seed sets in chapter 5c, every member at init x10 in ``full``) does not stop the ensemble's training:
    it stays NaN, and the other members' weights and losses are bit for bit those of their training without
    it. Training and evaluation run inside ``diverged_models_allowed``; a direct call still refuses."""
    setting = MIXED[rule][0]
    pair, alone = _head([0, 1]), _head([0])
    with torch.no_grad():
        pair.w_q[1].fill_(float("nan"))
    history = _train(pair, setting, steps=10)
    assert torch.equal(history[:, :1], _train(alone, setting, steps=10)), rule
    for (name, p), (_, q) in zip(pair.named_parameters(), alone.named_parameters()):
        assert torch.equal(p[:1], q), (rule, name)
    assert history[:, 1].isnan().all() and not torch.isfinite(pair.w_q[1]).any()
    tokens = TASK.sample(4, 16, torch.Generator().manual_seed(0))[0]
    with diverged_models_allowed(pair):
        logits, _ = pair(tokens)
    assert torch.isfinite(logits[0]).all() and logits[1].isnan().all()
    with pytest.raises(ValueError, match="not finite"):  # outside training and evaluation: refused
        pair(tokens)
    acc = accuracy_by_length(pair, TASK, [16], n_samples=64)
    assert torch.equal(acc[:1], accuracy_by_length(alone, TASK, [16], n_samples=64))
    # every member diverged (chapter 5c's gradient descent at init x10): training runs on, all NaN
    both = _head([0, 1])
    with torch.no_grad():
        both.w_k.fill_(float("nan"))
    assert _train(both, setting, steps=3).isnan().all()


class _Spared(torch.nn.Module):
    """A toy ensemble with a decayed weight and a spared bias (``b_in``), as the transformer has."""

    def __init__(self, m):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.n_models = m
        self.w = torch.nn.Parameter(torch.randn(m, 5, 3, generator=g))
        self.b_in = torch.nn.Parameter(torch.randn(m, 7, generator=g))


@pytest.mark.parametrize("rule", sorted(MIXED))
def test_the_per_model_step_spares_what_decays_spares_and_equals_torch_per_member(rule):
    """Gradients drawn at random (so every step differs): member i of the mixed optimiser equals a 1-model
    copy stepped by torch's own optimiser with settings[i], the bias undecayed in both."""
    settings = MIXED[rule]
    m = len(settings)
    mixed = _Spared(m)
    opt = build_optimizer(mixed, settings)
    assert isinstance(opt, PerModelOptimizer)
    alone = []
    for i in range(m):
        one = _Spared(1)
        with torch.no_grad():
            one.w.copy_(mixed.w[i:i + 1])
            one.b_in.copy_(mixed.b_in[i:i + 1])
        alone.append((one, build_optimizer(one, settings[i])))
    assert not isinstance(alone[0][1], PerModelOptimizer)
    g = torch.Generator().manual_seed(2)
    for _ in range(25):
        grads = [torch.randn(p.shape, generator=g) for p in mixed.parameters()]
        for p, grad in zip(mixed.parameters(), grads):
            p.grad = grad.clone()
        opt.step()
        for i, (one, one_opt) in enumerate(alone):
            for p, grad in zip(one.parameters(), grads):
                p.grad = grad[i:i + 1].clone()
            one_opt.step()
    for i, (one, _) in enumerate(alone):
        assert torch.equal(mixed.w[i:i + 1], one.w) and torch.equal(mixed.b_in[i:i + 1], one.b_in), (rule, i)


@pytest.mark.parametrize("rule", sorted(MIXED))
def test_the_per_model_arithmetic_with_one_shared_setting_is_torchs_step(rule):
    """Forced onto the per-model path with every model on the same setting, the step equals torch's optimiser
    (the path build_optimizer takes then) bit for bit: the per-model arithmetic is torch's, not an approximation."""
    setting = MIXED[rule][-1]
    a, b = _Spared(3), _Spared(3)
    ours = PerModelOptimizer(_groups(a, torch.full((3,), setting.weight_decay, dtype=torch.float64)), (setting,) * 3)
    theirs = build_optimizer(b, setting)
    g = torch.Generator().manual_seed(4)
    for _ in range(25):
        for p, q in zip(a.parameters(), b.parameters()):
            q.grad = torch.randn(p.shape, generator=g)
            p.grad = q.grad.clone()
        ours.step()
        theirs.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_a_shared_setting_ensemble_trains_with_torchs_optimiser_exactly_as_before():
    """One setting per model, all equal: torch's optimiser (not the per-model one), and the same weights and
    losses as the single setting gives, bit for bit; so no number trained with one setting moves."""
    setting = OptimizerSettings(weight_decay=0.1)
    assert per_model_settings([setting] * 4, 4) is setting
    assert type(build_optimizer(_head([0, 1, 2, 3]), [setting] * 4)) is torch.optim.AdamW
    a, b = _head([0, 1, 2, 3]), _head([0, 1, 2, 3])
    assert torch.equal(_train(a, [setting] * 4), _train(b, setting))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_bad_per_model_settings_are_refused_by_name():
    s = OptimizerSettings()
    model = _head([0, 1])
    with pytest.raises(ValueError, match="one OptimizerSettings per model: 2; got 3"):
        train(model, TASK, [s, s, s], steps=1)
    with pytest.raises(ValueError, match="share one update rule"):
        build_optimizer(model, [s, OptimizerSettings("sgd", lr=0.1)])
    with pytest.raises(TypeError, match=r"optimizer\[1\] must be an OptimizerSettings"):
        build_optimizer(model, [s, {"lr": 0.1}])
    with pytest.raises(TypeError, match="sequence of one per model"):
        build_optimizer(model, "adamw")
    with pytest.raises(ValueError, match="fused needs one setting"):
        build_optimizer(model, [s, OptimizerSettings(lr=0.1)], fused=True)
