"""Tests of the full-sequence tasks, the multi-layer transformer and its evaluation (chapters 7-8)."""

import pytest
import torch

from lengthgen_utils.run.optim import OptimizerSettings
from tests.reference import causal_attention
from lengthgen_utils.run.configs import TransformerExperiment
from lengthgen_utils.run.evaluation import split_accuracy, token_accuracy_by_position
from lengthgen_utils.core.fast import FastTransformer
from lengthgen_utils.core.models import Transformer
from lengthgen_utils.core.seeding import generator
from lengthgen_utils.analysis.probes import head_offset_profiles, shift_invariance
from lengthgen_utils.core.tasks import IGNORE_INDEX, Copy, DelayedCopy, LaggedSum, RunningParity
from lengthgen_utils.run.training import sequence_cross_entropy, train_sequence


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


BOTH = pytest.mark.parametrize("cls", [Transformer, FastTransformer], ids=["readable", "fast"])
"""The readable transformer and the batched one the book trains: each behaviour below holds for both."""


# ---------------------------------------------------------------- tasks
def test_delayed_copy_scores_exactly_the_defined_positions():
    task = DelayedCopy(16, 3)
    tokens, targets = task.sample(4, 20, gen())
    scored = (targets != IGNORE_INDEX).nonzero()[:, 1].unique()
    assert scored.tolist() == list(range(3, 20))
    assert torch.equal(targets[:, 3:], tokens[:, :17])


def test_lagged_sum_targets():
    task = LaggedSum(16, 2, 5)
    tokens, targets = task.sample(3, 12, gen())
    assert (targets[:, :5] == IGNORE_INDEX).all()
    for t in range(5, 12):
        assert torch.equal(targets[:, t], (tokens[:, t - 2] + tokens[:, t - 5]) % 16)


def test_running_parity_targets():
    tokens = torch.tensor([[1, 0, 1, 1, 0]])
    assert RunningParity().targets(tokens).tolist() == [[1, 1, 0, 1, 1]]


def test_copy_task_layout():
    tokens, targets = Copy(4).sample(2, 9, gen())
    n = 4
    assert (tokens[:, n] == 4).all()
    assert torch.equal(tokens[:, :n], tokens[:, n + 1:])
    assert torch.equal(targets[:, n:2 * n], tokens[:, :n])
    assert (targets[:, :n] == IGNORE_INDEX).all() and (targets[:, 2 * n:] == IGNORE_INDEX).all()


@pytest.mark.parametrize("make, seq_len", [
    (lambda: DelayedCopy(16, 5), 5),  # no scored position
    (lambda: LaggedSum(16, 2, 5), 5),
    (lambda: Copy(16), 8),  # even length
])
def test_lengths_that_leave_no_scored_position_are_rejected(make, seq_len):
    with pytest.raises(ValueError, match="seq_len"):
        make().sample(2, seq_len, gen())


def test_task_arguments_are_checked():
    with pytest.raises(ValueError, match="offset2"):
        LaggedSum(16, 3, 3)
    with pytest.raises(ValueError, match="vocab_size"):
        RunningParity(3)
    with pytest.raises(ValueError, match="offset"):
        DelayedCopy(16, 0)


# ---------------------------------------------------------------- attention and the model
def test_fused_and_explicit_causal_attention_agree_and_are_causal():
    q, k, v = (torch.randn(2, 3, 7, 8, generator=gen(i)) for i in range(3))
    fused = causal_attention(q, k, v)
    explicit, weights = causal_attention(q, k, v, return_weights=True)
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-5)
    assert (weights.triu(1) == 0).all()
    assert ((weights > 0).sum(-1)[0, 0] == torch.arange(1, 8)).all()  # query i sees i + 1 keys
    torch.testing.assert_close(explicit[..., 0, :], v[..., 0, :])  # output 0 is value 0


@BOTH
@pytest.mark.parametrize("pe", ["rope", "ape", "nope"])
def test_transformer_is_causal(pe, cls):
    model = cls(16, 2, 4, 32, pe, max_len=16, n_models=2)
    tokens, _ = DelayedCopy(16, 2).sample(3, 10, gen())
    changed = tokens.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 16
    a, b = model(tokens), model(changed)
    assert a.shape == (2, 3, 10, 16)
    torch.testing.assert_close(a[:, :, :6], b[:, :, :6], rtol=0, atol=1e-6)
    assert (a[:, :, 6:] - b[:, :, 6:]).abs().max() > 1e-4


@BOTH
def test_rope_transformer_is_shift_invariant_and_ape_is_not(cls):
    tokens, _ = DelayedCopy(16, 5).sample(4, 24, gen())
    rope = cls(16, 2, 4, 32, "rope", n_models=2)
    assert max(shift_invariance(rope, tokens, (1, 1000, 100000)).values()) < 1e-4
    ape = cls(16, 2, 4, 32, "ape", max_len=64, n_models=2)
    assert min(shift_invariance(ape, tokens, (1, 16)).values()) > 1e-2


@BOTH
def test_transformer_ensemble_equals_models_alone(cls):
    tokens, _ = DelayedCopy(16, 5).sample(2, 12, gen())
    ensemble = cls(16, 2, 4, 32, "rope", n_models=3, seeds=[4, 5, 6])
    out = ensemble(tokens)
    for i, s in enumerate([4, 5, 6]):
        alone = cls(16, 2, 4, 32, "rope", n_models=1, seeds=[s])
        torch.testing.assert_close(alone(tokens)[0], out[i], rtol=1e-5, atol=1e-5)


@BOTH
def test_transformer_rejects_bad_configuration_and_input(cls):
    with pytest.raises(ValueError, match="divisible"):
        cls(16, 2, 3, 32)
    with pytest.raises(ValueError, match="d_head"):
        cls(16, 1, 2, 30, "rope")  # d_head = 15
    with pytest.raises(ValueError, match="pe"):
        cls(16, pe="alibi-typo")
    model = cls(16, 1, 2, 16, "ape", max_len=16)
    with pytest.raises(ValueError, match=r"16 rows.*17"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="tokens"):
        model(torch.full((1, 4), 16, dtype=torch.long))


# ---------------------------------------------------------------- loss and scoring
def test_loss_ignores_undefined_positions():
    task = DelayedCopy(4, 3)
    tokens, targets = task.sample(2, 8, gen())
    logits = torch.randn(1, 2, 8, 4, generator=gen(1))
    poisoned = logits.clone()
    poisoned[:, :, :3] = 1e6 * torch.randn(1, 2, 3, 4, generator=gen(2))  # unscored positions
    torch.testing.assert_close(sequence_cross_entropy(logits, targets), sequence_cross_entropy(poisoned, targets))
    scored = targets[:, 3:]
    ref = torch.nn.functional.cross_entropy(logits[0, :, 3:].reshape(-1, 4), scored.reshape(-1))
    torch.testing.assert_close(sequence_cross_entropy(logits, targets)[0], ref)


class ConstantPredictor(torch.nn.Module):
    """Always predicts class 0 (a model that has learned nothing but a bias)."""

    n_models, device = 1, torch.device("cpu")

    def check_positions(self, positions):
        """A constant predictor covers every position."""

    def forward(self, tokens):
        logits = torch.zeros(1, *tokens.shape, 16)
        logits[..., 0] = 1.0
        return logits


def test_a_constant_predictor_scores_chance():
    task = DelayedCopy(16, 3)
    acc, counts = token_accuracy_by_position(ConstantPredictor(), task, 20, n_samples=2048)
    assert torch.isnan(acc[0, :3]).all() and counts[:3].sum() == 0
    assert counts[3:].eq(2048).all()
    inside, outside = split_accuracy(acc, counts, 10)
    assert abs(float(inside) - 1 / 16) < 0.01 and abs(float(outside) - 1 / 16) < 0.01


def test_rope_transformer_learns_delayed_copy_and_its_copying_head_peaks_at_the_offset():
    task = DelayedCopy(8, 3)
    model = Transformer(8, 1, 2, 32, "rope", n_models=1)
    train_sequence(model, task, OptimizerSettings("adamw", lr=3e-3, weight_decay=0.05), steps=150, batch_size=32,
                   train_len=16, device="cpu")
    acc, counts = token_accuracy_by_position(model, task, 32, n_samples=64)
    inside, outside = split_accuracy(acc, counts, 16)
    assert float(inside) > 0.9 and float(outside) > 0.9, (inside, outside)
    _, weight = head_offset_profiles(model, task, 32, n_samples=8)  # row layout: index -1 - d holds distance d
    assert (torch.nan_to_num(weight[0, 0], nan=-1).argmax(-1) == 32 - 1 - 3).any()


def test_head_offset_profiles_are_in_the_row_layout_with_d_0_last_and_nans_first():
    """Index j holds D = j - (L - 1): the last entry is each query's logit with itself, index -1 - d the key d
    back; the distances beyond min_query, which not every averaged query sees, are NaN, at the start."""
    model = Transformer(16, 2, 2, 32, "rope", n_models=2)
    task, seq_len, min_query = DelayedCopy(16, 3), 20, 12
    logit, weight = head_offset_profiles(model, task, seq_len, n_samples=4, seed=5, min_query=min_query)
    assert logit.shape == weight.shape == (2, 2, 2, seq_len)
    tokens, _ = task.sample(4, seq_len, generator(5), device=model.device)  # the probe's own sequences
    for layer, scores in enumerate(model.head_scores(tokens)):  # [M, B, H, L, L]
        for d in (0, 1, 3, min_query):
            for out, values in ((logit, scores), (weight, scores.softmax(-1))):
                pairs = torch.diagonal(values, offset=-d, dim1=-2, dim2=-1)  # (i, i - d) for i = d .. L-1
                direct = pairs[..., min_query - d:].double().mean((1, -1))  # queries i >= min_query: [M, H]
                torch.testing.assert_close(out[:, layer, :, -1 - d], direct)
    self_logit = torch.diagonal(model.head_scores(tokens)[0], dim1=-2, dim2=-1)[..., min_query:]
    torch.testing.assert_close(logit[:, 0, :, -1], self_logit.double().mean((1, -1)))  # D = 0: the query itself
    assert torch.isnan(logit[..., : seq_len - 1 - min_query]).all()  # D < -min_query: at the start
    assert torch.isfinite(logit[..., seq_len - 1 - min_query :]).all()  # D = -min_query .. 0: at the end
    assert torch.isnan(weight).equal(torch.isnan(logit))


def test_experiment_holds_a_task_object_and_rejects_a_name():
    with pytest.raises(TypeError, match="task"):
        TransformerExperiment(task="reverse")
    exp = TransformerExperiment(task=LaggedSum(16, 2, 5), eval_lengths=[32, 64])  # a list is stored as a tuple
    assert exp.eval_lengths == (32, 64) and hash(exp) == hash(TransformerExperiment(task=LaggedSum(16, 2, 5),
                                                                                   eval_lengths=(32, 64)))


# ---------------------------------------------------------------- both transformers against a per-model reference
def reference_logits(model, index, tokens, position_shift=0):
    """Model ``index`` of an ensemble, written out as one plain model: torch's LayerNorm, explicit masked
    softmax attention, apply_rope with the model's own pairing, the encoding's embed and score bias.

    Independent of the package's batched layout (no folded norms, no reordered channels, no SDPA)."""
    from lengthgen_utils.core.encodings import RoPE
    from lengthgen_utils.core.rope import apply_rope

    cfg, i = model.config, index
    b, seq_len = tokens.shape
    h, dh = cfg.n_heads, cfg.d_head
    positions = torch.arange(seq_len) + position_shift
    params = {name: p[i:i + 1] for name, p in model.pe_params.items()}

    def ln(x, w, bias):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], w[i], bias[i], eps=1e-5)

    x = model.embed[i][tokens]  # [B, L, d]
    added = cfg.pe.embed(params, positions)
    if added is not None:
        x = x + added[0]
    bias = cfg.pe.score_bias(params, positions, positions, h)
    mask = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    for blk in model.blocks:
        qkv = ln(x, blk.ln1_w, blk.ln1_b) @ blk.w_qkv[i].T
        q, k, v = (t.view(b, seq_len, h, dh).transpose(1, 2) for t in qkv.split(cfg.d_model, -1))
        if isinstance(cfg.pe, RoPE):
            q, k = (apply_rope(t, positions, cfg.pe.base, cfg.pe.interleaved) for t in (q, k))
        scores = q @ k.transpose(-1, -2) / dh ** 0.5
        if bias is not None:
            scores = scores + bias[0 if bias.shape[0] == 1 else i]
        att = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + att.transpose(1, 2).reshape(b, seq_len, cfg.d_model) @ blk.w_out[i].T
        hidden = torch.nn.functional.gelu(ln(x, blk.ln2_w, blk.ln2_b) @ blk.w_in[i].T + blk.b_in[i])
        x = x + hidden @ blk.w_mlp_out[i].T + blk.b_mlp_out[i]
    return ln(x, model.ln_f_w, model.ln_f_b) @ model.unembed[i].T


@BOTH
@pytest.mark.parametrize("pe", ["rope", "ape", "nope", "alibi", "rope-interleaved"])
def test_transformer_equals_a_plain_per_model_reference(pe, cls):
    """Both transformers compute the textbook model, one model at a time: the readable one (per-model einsums,
    the encoding's rotate, an explicit causal softmax) and the batched layout (folded norms, fused projections,
    reordered RoPE channels, 4-D SDPA, the first block's projection looked up per token): logits within 1e-5
    in float32 and 1e-12 in float64, for every model of the ensemble, at a shifted position too."""
    from lengthgen_utils.core.encodings import RoPE

    encoding = RoPE(interleaved=True) if pe == "rope-interleaved" else pe
    model = cls(16, 2, 4, 32, encoding, max_len=64, n_models=3, seeds=[7, 8, 9])
    with torch.no_grad():  # trained-looking weights: norms, biases and tables away from their initial values
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen(hash(p.shape) % 1000)))
    for seq_len in (12, 40):  # both attention paths (batched matmuls up to 32 keys, SDPA beyond)
        tokens, _ = DelayedCopy(16, 3).sample(3, seq_len, gen(4))
        for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
            m = model.to(dtype)
            for shift in (0, 5):
                if pe == "ape" and shift:
                    continue
                with torch.no_grad():
                    logits = m(tokens, position_shift=shift)
                    for i in range(3):
                        torch.testing.assert_close(logits[i], reference_logits(m, i, tokens, shift), rtol=tol,
                                                   atol=tol)


@BOTH
@pytest.mark.parametrize("pe", ["rope", "alibi"])
def test_attention_weights_and_head_scores_follow_the_reference(pe, cls):
    """return_attention and head_scores return, per layer, [M, B, H, L, L] weights that sum to one over the
    visible keys and scores whose softmax they are (the reordered RoPE channels change no logit)."""
    tokens, _ = DelayedCopy(16, 3).sample(2, 10, gen(5))
    model = cls(16, 2, 4, 32, pe, n_models=2)
    logits, weights = model(tokens, return_attention=True)
    scores = model.head_scores(tokens)
    torch.testing.assert_close(logits, model(tokens))
    assert len(weights) == len(scores) == 2
    for w, s in zip(weights, scores):
        assert w.shape == s.shape == (2, 2, 4, 10, 10)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 4, 10))
        assert torch.isinf(s.triu(1)[..., 0, 1:]).all()
        torch.testing.assert_close(s.softmax(-1), w.detach(), rtol=1e-5, atol=1e-6)


@BOTH
@pytest.mark.parametrize("pe", ["rope", "ape", "alibi"])
@pytest.mark.parametrize("threads", [1, 2])
def test_training_a_transformer_ensemble_equals_training_each_model_alone(pe, threads, cls, monkeypatch):
    """Model i of a trained ensemble is the model trained alone: losses within 1e-6 and parameters within
    1e-6 (relative) in float32, at 1 and 2 threads (on the machines we ran, they were bit-identical)."""
    task, seeds = DelayedCopy(16, 5), [3, 4, 5]
    kwargs = dict(optimizer=OptimizerSettings("adamw", lr=3e-3, weight_decay=0.05), steps=6, batch_size=8, train_len=16,
                  device="cpu")
    monkeypatch.setenv("LENGTHGEN_THREADS", str(threads))  # the count every trainer runs at
    ensemble = cls(16, 2, 4, 32, pe, max_len=32, n_models=3, seeds=seeds)
    history = train_sequence(ensemble, task, **kwargs)
    for i, seed in enumerate(seeds):
        alone = cls(16, 2, 4, 32, pe, max_len=32, n_models=1, seeds=[seed])
        torch.testing.assert_close(train_sequence(alone, task, **kwargs)[:, 0], history[:, i], rtol=0, atol=1e-6)
        for (name, p_alone), (_, p_ens) in zip(alone.named_parameters(), ensemble.named_parameters()):
            rel = float((p_alone[0] - p_ens[i]).detach().norm() / p_ens[i].detach().norm())
            assert rel < 1e-6, (i, name, rel)
    assert not torch.allclose(history[:, 0], history[:, 1])  # the seeds really differ


@pytest.mark.parametrize("seq_len", [7, 32, 33, 80])
def test_fast_causal_attention_paths_agree_with_the_explicit_one(seq_len):
    """causal_attention without weights takes batched matmuls up to SHORT_SEQUENCE keys and SDPA beyond; both
    equal the explicit masked softmax (1e-5) for inputs of rank 2 to 5, with no bias, a shared bias or one per
    head, and pass gradients to a learned bias."""
    from lengthgen_utils.core.attention import SHORT_SEQUENCE, causal_mask
    from tests.reference import masked_attention

    assert SHORT_SEQUENCE == 32  # 7 and 32 take the batched path, 33 and 80 SDPA
    for shape in [(seq_len, 8), (3, seq_len, 8), (2, 3, seq_len, 8), (2, 2, 3, seq_len, 8)]:
        q, k, v = (torch.randn(*shape, generator=gen(i)) for i in range(3))
        for bias in (None, torch.randn(seq_len, seq_len, generator=gen(7)),
                     torch.randn(*shape[:-2], seq_len, seq_len, generator=gen(8))):
            fast = causal_attention(q, k, v, bias=bias)
            torch.testing.assert_close(fast, masked_attention(q, k, v, causal_mask(seq_len), bias=bias),
                                       rtol=1e-5, atol=1e-5)
    q, k, v = (torch.randn(2, 4, seq_len, 8, generator=gen(i)) for i in range(3))
    bias = torch.zeros(1, 4, seq_len, seq_len, requires_grad=True)
    causal_attention(q, k, v, bias=bias).square().sum().backward()
    assert bias.grad.abs().sum() > 0 and (bias.grad.triu(1) == 0).all()  # masked keys get no gradient


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_row_blocked_batched_matmul_is_the_batched_matmul(threads):
    """fast._baddbmm cuts each model's rows into one block per thread (balanced work for any number of
    models); it computes start + x @ W^T (1e-6), for a bias row or a full start, whatever N and d_in."""
    from lengthgen_utils.core.fast import _baddbmm
    from lengthgen_utils.run.training import cpu_threads

    for m, n, d_in, d_out in [(3, 12, 12, 5), (2, 7, 4, 6), (1, 16, 8, 16)]:
        x = torch.randn(m, n, d_in, generator=gen(1))
        w_t = torch.randn(m, d_out, d_in, generator=gen(2)).transpose(1, 2)
        for start in (torch.randn(m, 1, d_out, generator=gen(3)), torch.randn(m, n, d_out, generator=gen(4))):
            with cpu_threads(threads):
                got = _baddbmm(start, x, w_t)
            torch.testing.assert_close(got, torch.baddbmm(start, x, w_t), rtol=1e-6, atol=1e-6)
