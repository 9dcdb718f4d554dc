"""The fast transformer the book trains computes the readable one: same weights, same logits, loss and gradients.

:class:`~lengthgen_utils.core.models.Transformer` is the model a reader reads; :class:`~lengthgen_utils.core.fast.
FastTransformer` computes it in a batched layout (folded LayerNorm, thread-split ``baddbmm``, pre-projected token
rows, RoPE on reordered channels, three attention paths switched by length). Every registered encoding is walked
(a new one is picked up without new test code), with two RoPE variants passed as objects (the interleaved
pairing, which the fast path rotates as it is, and explicit frequencies, which leave RoPE's memoised tables).

**Tolerances.** The two models add the same numbers in different orders (a folded norm, a different matmul
blocking, the fused attention kernel beyond 32 keys), so in float32 they differ by rounding: each of a block's
~10 steps (LayerNorm, four projections summing 32 to 128 products, softmax, GELU) adds a few units of float32's
epsilon (1.2e-7), relative to its scale. ``RTOL = 2e-5`` (about 170 epsilon) of each output's largest entry
leaves about 5x headroom over the worst we measured in this file's cases (logits 1.6e-6, gradients 3.5e-6 of
their scale), while a real difference (a wrong pairing, a missing bias, a mask off by one) moves logits by
1e-2 or more of their scale. In float64 the same comparison holds to ``1e-12`` (measured: 2e-14): the float32
gap is rounding, not another function.
"""
import pytest
import torch

from lengthgen_utils.run.optim import OptimizerSettings
from lengthgen_utils.core.attention import SHORT_SEQUENCE
from lengthgen_utils.core.encodings import RandomizedPositions, RoPE, RotaryFrequencies, encoding_names, get_encoding
from lengthgen_utils.core.fast import FastTransformer
from lengthgen_utils.core.models import Transformer
from lengthgen_utils.core.tasks import DelayedCopy
from lengthgen_utils.run.training import sequence_cross_entropy, train_sequence

ENCODINGS = [get_encoding(name) for name in encoding_names()] + [RoPE(interleaved=True), RotaryFrequencies()]
IDS = list(encoding_names()) + ["rope-interleaved", "rope-theta"]
SHORT, LONG = 12, 40  # both sides of the fast path's switch of attention kernels
SIZES = dict(vocab_size=16, n_layers=2, n_heads=2, d_model=32, max_len=64)  # d_head 16: RotaryFrequencies' size
RTOL = {torch.float32: 2e-5, torch.float64: 1e-12}


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def pair(pe, n_models, dtype=torch.float32, seeds=None):
    """A readable and a fast ensemble holding the same trained-looking weights (norms, biases and tables moved
    away from their initial values, so no term of the comparison is trivially zero)."""
    readable = Transformer(**SIZES, pe=pe, n_models=n_models, seeds=seeds)
    with torch.no_grad():
        for i, p in enumerate(readable.parameters()):
            p.add_(0.3 * torch.randn(p.shape, generator=gen(100 + i)))
    fast = FastTransformer(**SIZES, pe=pe, n_models=n_models, seeds=seeds)
    fast.load_state_dict(readable.state_dict())
    return readable.to(dtype), fast.to(dtype)


def positions_for(pe, seq_len):
    """The positions a model of ``pe`` trains at: ``0 .. L-1``, or the sorted random subset randomised positions
    draw (not a range: RoPE's rotation then leaves its memoised tables)."""
    drawn = pe.train_positions(seq_len, gen(7))
    return torch.arange(seq_len) if drawn is None else drawn


def assert_rounding_close(got, expected, dtype, what):
    """``max |got - expected| <= RTOL[dtype] * max |expected|`` (see the module docstring for why)."""
    scale = float(expected.detach().abs().max())
    gap = float((got.detach() - expected.detach()).abs().max())
    assert gap <= RTOL[dtype] * max(scale, 1e-30), f"{what}: |fast - readable| = {gap:.2e}, scale {scale:.2e}"


def test_the_lengths_straddle_the_attention_switch():
    assert SHORT < SHORT_SEQUENCE < LONG


@pytest.mark.parametrize("pe", ENCODINGS, ids=IDS)
def test_the_two_models_share_parameters_initialisation_and_state_dict(pe):
    """Built from the same seeds, the two hold the same parameters (names, shapes, values, order): a state dict
    moves between them either way, strictly."""
    readable = Transformer(**SIZES, pe=pe, n_models=3, seeds=[5, 6, 7])
    fast = FastTransformer(**SIZES, pe=pe, n_models=3, seeds=[5, 6, 7])
    ours, theirs = readable.state_dict(), fast.state_dict()
    assert list(ours) == list(theirs)
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
    assert [n for n, _ in readable.named_parameters()] == [n for n, _ in fast.named_parameters()]
    Transformer(**SIZES, pe=pe, n_models=3).load_state_dict(theirs, strict=True)
    FastTransformer(**SIZES, pe=pe, n_models=3).load_state_dict(ours, strict=True)


@pytest.mark.parametrize("n_models", [1, 2, 5])
@pytest.mark.parametrize("seq_len", [SHORT, LONG])
@pytest.mark.parametrize("pe", ENCODINGS, ids=IDS)
def test_same_weights_give_equal_logits_loss_and_gradients(pe, seq_len, n_models):
    """float32, every registered encoding, short and long sequences, 1 to 5 models: logits, each model's loss
    and the gradient of every parameter agree to rounding (RTOL of their scale)."""
    dtype = torch.float32
    readable, fast = pair(pe, n_models, dtype)
    tokens, targets = DelayedCopy(16, 3).sample(4, seq_len, gen(1))
    positions = positions_for(pe, seq_len)
    logits = {name: model(tokens, positions=positions) for name, model in (("readable", readable), ("fast", fast))}
    assert logits["fast"].shape == logits["readable"].shape == (n_models, 4, seq_len, 16)
    assert_rounding_close(logits["fast"], logits["readable"], dtype, "logits")
    losses = {name: sequence_cross_entropy(out, targets) for name, out in logits.items()}  # [M]
    assert_rounding_close(losses["fast"], losses["readable"], dtype, "loss")
    for loss in losses.values():
        loss.sum().backward()
    for (name, p_readable), p_fast in zip(readable.named_parameters(), fast.parameters()):
        if p_readable.grad is None or p_fast.grad is None:  # a fixed table (sinusoidal): no gradient in either
            assert p_readable.grad is None and p_fast.grad is None, name
            continue
        assert p_readable.grad.abs().max() > 0, name  # every learned parameter is reached
        assert_rounding_close(p_fast.grad, p_readable.grad, dtype, f"gradient of {name}")


@pytest.mark.parametrize("seq_len", [SHORT, LONG])
@pytest.mark.parametrize("pe", ENCODINGS, ids=IDS)
def test_in_float64_the_two_agree_to_1e_12(pe, seq_len):
    """The float32 gap is rounding: in float64 logits and gradients agree to 1e-12 of their scale."""
    dtype = torch.float64
    readable, fast = pair(pe, 3, dtype)
    tokens, targets = DelayedCopy(16, 3).sample(4, seq_len, gen(2))
    positions = positions_for(pe, seq_len)
    ours, theirs = readable(tokens, positions=positions), fast(tokens, positions=positions)
    assert_rounding_close(theirs, ours, dtype, "logits")
    sequence_cross_entropy(ours, targets).sum().backward()
    sequence_cross_entropy(theirs, targets).sum().backward()
    for (name, p_readable), p_fast in zip(readable.named_parameters(), fast.parameters()):
        if p_readable.grad is not None:
            assert_rounding_close(p_fast.grad, p_readable.grad, dtype, f"gradient of {name}")


@pytest.mark.parametrize("pe", ENCODINGS, ids=IDS)
def test_attention_weights_and_head_scores_are_equal(pe):
    """What the probes read (per-layer weights and pre-softmax scores, ``[M, B, H, L, L]``) agrees too, with the
    same ``-inf`` above the diagonal, at a length on each side of the switch and at shifted positions
    (``3 .. L+2``, within an APE table's 64 rows)."""
    readable, fast = pair(pe, 2)
    for seq_len in (SHORT, LONG):
        tokens, _ = DelayedCopy(16, 3).sample(3, seq_len, gen(3))
        with torch.no_grad():
            _, ours = readable(tokens, position_shift=3, return_attention=True)
            _, theirs = fast(tokens, position_shift=3, return_attention=True)
        for w_ours, w_theirs in zip(ours, theirs, strict=True):
            assert w_ours.shape == w_theirs.shape == (2, 3, 2, seq_len, seq_len)
            assert_rounding_close(w_theirs, w_ours, torch.float32, "attention weights")
        for s_ours, s_theirs in zip(readable.head_scores(tokens, 3), fast.head_scores(tokens, 3), strict=True):
            assert torch.equal(torch.isinf(s_ours), torch.isinf(s_theirs))
            finite = torch.isfinite(s_ours)
            assert_rounding_close(s_theirs[finite], s_ours[finite], torch.float32, "head scores")


@pytest.mark.parametrize("pe", ENCODINGS, ids=IDS)
def test_training_a_few_steps_gives_the_same_losses(pe):
    """train_sequence on each, from the same seeds and the same batches (the book's AdamW recipe, lr 1e-3): the
    loss histories agree within 5e-6 over 6 steps.

    The first loss differs by rounding only; then AdamW divides each gradient entry by its running RMS, so an
    entry whose gradient is mostly rounding noise moves by up to the learning rate, differently in each model,
    and the gap grows with the steps and the rate (7e-5 after 10 steps at lr 1e-2 with the T5 bias). Here it
    was at most 5e-7 (two float32 epsilon of a loss near ln 16); 5e-6 leaves 10x headroom."""
    kwargs = dict(optimizer=OptimizerSettings("adamw", lr=1e-3, weight_decay=0.05), steps=6, batch_size=8, train_len=16,
                  device="cpu")
    readable = Transformer(**SIZES, pe=pe, n_models=2, seeds=[3, 4])
    fast = FastTransformer(**SIZES, pe=pe, n_models=2, seeds=[3, 4])
    ours, theirs = train_sequence(readable, DelayedCopy(16, 3), **kwargs), train_sequence(fast, DelayedCopy(16, 3),
                                                                                          **kwargs)
    assert ours.shape == theirs.shape == (6, 2) and torch.isfinite(ours).all()
    torch.testing.assert_close(theirs, ours, rtol=0, atol=5e-6)
    assert not torch.equal(ours[0], ours[-1])  # the models did train


def test_randomised_positions_reach_both_models_the_same_way():
    """The one encoding that changes the training positions: both models, given the same drawn positions, agree
    (and differ from the plain range, so the positions really reach the computation)."""
    pe = RandomizedPositions(max_position=64)
    readable, fast = pair(pe, 2)
    tokens, _ = DelayedCopy(16, 3).sample(2, LONG, gen(4))
    drawn = positions_for(pe, LONG)
    with torch.no_grad():
        assert_rounding_close(fast(tokens, positions=drawn), readable(tokens, positions=drawn), torch.float32,
                              "logits")
        assert (readable(tokens, positions=drawn) - readable(tokens)).abs().max() > 1e-3
