"""Every registered position encoding runs through every model, probe and figure (the encoding interface).

A new encoding registered in ``lengthgen_utils.positional`` is picked up here without new test code;
tests of a particular encoding against an independent reference follow below the walk.
"""
import numpy as np
import pytest
import torch

from lengthgen_utils import plots
from lengthgen_utils.configs import RetrievalExperiment, TransformerExperiment
from lengthgen_utils.models import RetrievalHead, Transformer
from lengthgen_utils.positional import ENCODINGS, Encoding, encoding_names, get_encoding
from lengthgen_utils.probes import diagonal_spread, position_logits, shift_invariance, shift_logit_difference
from lengthgen_utils.tasks import DelayedCopy, FixedOffsetRetrieval
from lengthgen_utils.training import train, train_sequence

REGISTERED = [get_encoding(name) for name in encoding_names()]
IDS = [pe.name for pe in REGISTERED]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_the_chapter_encodings_are_registered():
    assert {"rope", "ape", "nope"} <= set(encoding_names())
    assert all(isinstance(pe, Encoding) and pe.label and pe.color.startswith("#") for pe in REGISTERED)


@pytest.mark.parametrize("pe", REGISTERED, ids=IDS)
def test_retrieval_head_runs_and_trains_with_every_encoding(pe):
    task = FixedOffsetRetrieval(16, 3)
    model = RetrievalHead(pe=pe, n_models=2, max_len=64)
    tokens, _ = task.sample(4, 20, gen())
    logits, attn = model(tokens)
    assert logits.shape == (2, 4, 16) and attn.shape == (2, 4, 20)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4))
    history = train(model, task, steps=3, batch_size=8, device="cpu")
    assert torch.isfinite(history).all()
    assert RetrievalExperiment(pe=pe.name).pe == pe  # by name in a configuration


@pytest.mark.parametrize("pe", REGISTERED, ids=IDS)
def test_transformer_runs_trains_and_stays_causal_with_every_encoding(pe):
    model = Transformer(16, 1, 2, 16, pe, max_len=64, n_models=2)
    tokens, _ = DelayedCopy(16, 2).sample(3, 12, gen())
    changed = tokens.clone()
    changed[:, 8] = (changed[:, 8] + 1) % 16
    a, b = model(tokens), model(changed)
    assert a.shape == (2, 3, 12, 16) and torch.isfinite(a).all()
    torch.testing.assert_close(a[:, :, :8], b[:, :, :8], rtol=0, atol=1e-6)
    history = train_sequence(model, DelayedCopy(16, 2), steps=2, batch_size=4, train_len=12, device="cpu")
    assert torch.isfinite(history).all()
    assert TransformerExperiment(pe=pe.name).pe == pe


@pytest.mark.parametrize("pe", REGISTERED, ids=IDS)
def test_equivariance_probe_is_exact_for_relative_encodings(pe):
    """A relative encoding's logit depends on the offset alone (constant diagonals, shift-invariant, to float32);
    an absolute one's does not (a measurable violation at random initialisation)."""
    model = RetrievalHead(pe=pe, n_models=3, max_len=1100)
    spread = diagonal_spread(position_logits(model, 24))
    shifts = shift_logit_difference(model, 24, [1, 1000]).max()
    transformer = Transformer(16, 1, 2, 16, pe, max_len=1100, n_models=1)
    tokens, _ = DelayedCopy(16, 2).sample(2, 24, gen())
    whole = max(shift_invariance(transformer, tokens, (1, 1000)).values())
    if pe.relative:
        assert spread.max() < 1e-4 and shifts < 1e-4 and whole < 1e-4, (spread, shifts, whole)
    else:
        assert spread.min() > 1e-6 and shifts > 1e-6 and whole > 1e-6, (spread, shifts, whole)


@pytest.mark.parametrize("pe", REGISTERED, ids=IDS)
def test_figures_label_and_colour_every_encoding(pe):
    fig = plots.accuracy_vs_length({pe: ([16, 32], np.full((5, 2), 0.5)), pe.name: ([16, 32], np.full((5, 2), 0.5))},
                                   chance=1 / 16, train_len=16, title="t")
    means = [t for t in fig.data if t.mode == "lines+markers"]
    assert [t.line.color for t in means] == [pe.color, pe.color]
    assert all(t.name.startswith(pe.label) for t in means)


@pytest.mark.parametrize("pe", REGISTERED, ids=IDS)
def test_dot_product_form_keeps_every_rotated_channel_and_logit(pe):
    """What a model may use instead of ``rotate`` (Encoding.dot_product_form) gives the same rotated
    channels, reordered, and so the same logits q . k, to float32 rounding."""
    order, form = pe.dot_product_form(8)
    positions = torch.arange(10) + 3
    q, k = (torch.randn(2, 3, 10, 8, generator=gen(s)) for s in (1, 2))
    expected = pe.rotate(q, positions) @ pe.rotate(k, positions).transpose(-1, -2)
    if order is None:
        assert form == pe
        return
    assert sorted(order.tolist()) == list(range(8))
    q2, k2 = form.rotate(q[..., order], positions), form.rotate(k[..., order], positions)
    torch.testing.assert_close(q2, pe.rotate(q, positions)[..., order], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(q2 @ k2.transpose(-1, -2), expected, rtol=1e-5, atol=1e-5)


def test_unknown_encoding_names_the_registered_ones():
    with pytest.raises(ValueError, match="registered ones are") as info:
        get_encoding("rotary")
    assert all(name in str(info.value) for name in ENCODINGS)
    with pytest.raises(TypeError, match="pe"):
        get_encoding(3)
    with pytest.raises(ValueError, match="registered ones are"):
        RetrievalHead(pe="rotary")


# ---------------------------------------------------------------- ALiBi (Press et al. 2022)
def reference_alibi_slopes(n):
    """The recursion of the ALiBi paper's reference code, written out independently: the geometric
    slopes of the largest power of two below n, then every other slope of twice that many heads."""
    def power_of_two(m):
        start = 2 ** (-(2 ** -(np.log2(m) - 3)))
        return [start ** (i + 1) for i in range(m)]

    if np.log2(n).is_integer():
        return power_of_two(n)
    closest = 2 ** int(np.floor(np.log2(n)))
    return power_of_two(closest) + reference_alibi_slopes(2 * closest)[0::2][: n - closest]


def test_alibi_slopes_match_the_papers_values_for_any_head_count():
    from lengthgen_utils.positional import alibi_slopes

    assert alibi_slopes(8).tolist() == [2.0 ** -i for i in range(1, 9)]  # the paper's example: 1/2 .. 1/256
    assert alibi_slopes(1).tolist() == [2.0 ** -8]
    assert alibi_slopes(6).tolist() == [2.0 ** -e for e in (2, 4, 6, 8, 1, 3)]  # 4 heads' slopes + every other of 8
    assert alibi_slopes(3).tolist() == [2.0 ** -e for e in (4, 8, 2)]
    for n in range(1, 40):
        np.testing.assert_allclose(alibi_slopes(n).numpy(), reference_alibi_slopes(n), rtol=1e-12, atol=0)


@pytest.mark.parametrize("n_heads, error", [(0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError)])
def test_alibi_rejects_a_non_positive_head_count(n_heads, error):
    from lengthgen_utils.positional import ALiBi, alibi_slopes

    with pytest.raises(error, match="n_heads"):
        alibi_slopes(n_heads)
    with pytest.raises(error, match="n_heads"):
        ALiBi().check(16, n_heads)


def test_alibi_bias_is_the_slope_times_the_relative_position():
    from lengthgen_utils.positional import ALiBi, alibi_slopes

    pe = get_encoding("alibi")
    assert isinstance(pe, ALiBi) and pe.relative and pe.label == "ALiBi"
    positions = torch.arange(5) + 100  # any shift: the bias only sees j - i
    bias = pe.score_bias({}, positions, positions, 4)
    assert bias.shape == (1, 4, 5, 5)
    slopes = alibi_slopes(4).float()
    for h in range(4):
        for i in range(5):
            for j in range(5):
                assert float(bias[0, h, i, j]) == pytest.approx(float(slopes[h]) * (j - i))
    # in the single head the query's scores are the position-free logit plus m (j - (L-1)): linear in the distance
    model = RetrievalHead(pe="alibi", n_models=2)
    s = model.scores(12)
    torch.testing.assert_close(s[:, 1:] - s[:, :-1], torch.full((2, 11), 2.0 ** -8))
    # in the transformer every head of a layer gets its own slope
    scores = Transformer(16, 1, 4, 16, "alibi").head_scores(torch.zeros(1, 6, dtype=torch.long))[0]
    steps = scores[0, 0, :, 5, 1:6] - scores[0, 0, :, 5, 0:5]  # query 5, keys 0..5: identical content, one bias step
    torch.testing.assert_close(steps, alibi_slopes(4).float()[:, None].expand(4, 5), rtol=1e-5, atol=1e-6)
