"""Every registered position encoding runs through every model, probe and figure (the encoding interface).

A new encoding registered in ``lengthgen_utils.core.encodings`` is picked up here without new test code;
tests of a particular encoding against an independent reference follow below the walk.
"""
import numpy as np
import pytest
import torch

from lengthgen_utils.run.optim import OptimizerSettings
from lengthgen_utils.book import figures
from lengthgen_utils.run.configs import RetrievalExperiment, TransformerExperiment
from lengthgen_utils.core.models import RetrievalHead, Transformer
from lengthgen_utils.core.encodings import ENCODINGS, Encoding, encoding_names, get_encoding
from lengthgen_utils.analysis.probes import diagonal_spread, position_logits, shift_invariance, shift_logit_difference
from lengthgen_utils.core.tasks import DelayedCopy, FixedOffsetRetrieval
from lengthgen_utils.run.training import train, train_sequence

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
    fig = figures.accuracy_vs_length({pe: ([16, 32], np.full((5, 2), 0.5)), pe.name: ([16, 32], np.full((5, 2), 0.5))},
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
    from lengthgen_utils.core.encodings import alibi_slopes

    assert alibi_slopes(8).tolist() == [2.0 ** -i for i in range(1, 9)]  # the paper's example: 1/2 .. 1/256
    assert alibi_slopes(1).tolist() == [2.0 ** -8]
    assert alibi_slopes(6).tolist() == [2.0 ** -e for e in (2, 4, 6, 8, 1, 3)]  # 4 heads' slopes + every other of 8
    assert alibi_slopes(3).tolist() == [2.0 ** -e for e in (4, 8, 2)]
    for n in range(1, 40):
        np.testing.assert_allclose(alibi_slopes(n).numpy(), reference_alibi_slopes(n), rtol=1e-12, atol=0)


@pytest.mark.parametrize("n_heads, error", [(0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError)])
def test_alibi_rejects_a_non_positive_head_count(n_heads, error):
    from lengthgen_utils.core.encodings import ALiBi, alibi_slopes

    with pytest.raises(error, match="n_heads"):
        alibi_slopes(n_heads)
    with pytest.raises(error, match="n_heads"):
        ALiBi().check(16, n_heads)


def test_alibi_bias_is_the_slope_times_the_relative_position():
    from lengthgen_utils.core.encodings import ALiBi, alibi_slopes

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


# ---------------------------------------------------------------- sinusoidal APE (Vaswani et al. 2017)
def test_sinusoidal_table_matches_the_papers_closed_form():
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), written out element by element."""
    import math

    from lengthgen_utils.core.encodings import sinusoidal_table

    for d_model in (1, 6, 7, 32):
        positions = [0, 1, 2, 5, 17, 255, 1000]
        table = sinusoidal_table(torch.tensor(positions), d_model)
        for r, pos in enumerate(positions):
            for c in range(d_model):
                i = c // 2
                angle = pos / 10000 ** (2 * i / d_model)
                expected = math.sin(angle) if c % 2 == 0 else math.cos(angle)
                assert float(table[r, c]) == pytest.approx(expected, abs=1e-12)


def test_sinusoidal_shift_is_a_fixed_rotation_of_each_channel_pair():
    """The paper's motivation: PE(t + k) is a linear function of PE(t), the same for every t."""
    from lengthgen_utils.core.encodings import sinusoidal_table

    d, k = 16, 7
    t = torch.arange(0, 300)
    pe, shifted = sinusoidal_table(t, d), sinusoidal_table(t + k, d)
    w = 10000 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    sin, cos = pe[:, 0::2], pe[:, 1::2]
    torch.testing.assert_close(shifted[:, 0::2], sin * torch.cos(k * w) + cos * torch.sin(k * w))
    torch.testing.assert_close(shifted[:, 1::2], cos * torch.cos(k * w) - sin * torch.sin(k * w))


def test_sinusoidal_encoding_is_fixed_through_training_and_limited_to_its_table():
    from lengthgen_utils.core.encodings import SinusoidalAPE, sinusoidal_table

    model = RetrievalHead(pe="sinusoidal", n_models=2, max_len=40)
    expected = sinusoidal_table(torch.arange(40), 32).float()
    train(model, FixedOffsetRetrieval(16, 3), OptimizerSettings(lr=0.1), steps=5, batch_size=8, device="cpu")
    for i in range(2):
        assert torch.equal(model.pe_params["sinusoid"][i], expected)  # never moved by the optimiser
    with pytest.raises(ValueError, match="rows"):
        model.scores(41)
    with pytest.raises(ValueError, match="base"):
        SinusoidalAPE(base=1.0)


# ---------------------------------------------------------------- T5 relative bias (Raffel et al. 2020)
def reference_t5_bucket(relative_position, num_buckets=32, max_distance=128):
    """One relative position's bucket, as T5's reference code computes it for a decoder (bidirectional=False),
    written out independently for a single integer."""
    import math

    n = max(-relative_position, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return n
    large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return min(large, num_buckets - 1)


@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 20), (2, 5), (17, 64)])
def test_t5_buckets_match_the_reference_formula(num_buckets, max_distance):
    from lengthgen_utils.core.encodings import t5_relative_buckets

    rel = torch.arange(-3000, 4)
    got = t5_relative_buckets(rel, num_buckets, max_distance)
    assert got.tolist() == [reference_t5_bucket(int(r), num_buckets, max_distance) for r in rel]


def test_t5_bucket_values_at_the_papers_settings():
    from lengthgen_utils.core.encodings import t5_relative_buckets

    d = torch.tensor([0, 1, 15, 16, 20, 32, 64, 127, 128, 10_000])  # 16 + floor(16 log(d/16) / log 8) from 16 on
    assert t5_relative_buckets(-d).tolist() == [0, 1, 15, 16, 17, 21, 26, 31, 31, 31]
    assert t5_relative_buckets(torch.tensor([1, 5])).tolist() == [0, 0]  # keys after the query (masked anyway)
    with pytest.raises(TypeError, match="integer"):
        t5_relative_buckets(torch.tensor([-1.0]))
    with pytest.raises(ValueError, match="max_distance"):
        t5_relative_buckets(torch.tensor([-1]), num_buckets=32, max_distance=16)


def test_t5_bias_is_a_per_head_table_lookup_and_unseen_buckets_keep_their_initial_value():
    from lengthgen_utils.core.encodings import T5Bias, t5_relative_buckets

    pe = T5Bias()
    params = {"t5_bias": torch.randn(2, 3, 32)}
    positions = torch.arange(40) + 7
    bias = pe.score_bias(params, positions, positions, 3)
    assert bias.shape == (2, 3, 40, 40)
    buckets = t5_relative_buckets(positions[None, :] - positions[:, None])
    torch.testing.assert_close(bias, params["t5_bias"][:, :, buckets])
    with pytest.raises(ValueError, match="heads"):
        pe.score_bias(params, positions, positions, 4)
    # training at lengths <= 16 reaches distances 0..15 only: buckets 16..31 get exactly zero gradient
    model = RetrievalHead(pe="t5", n_models=2)
    before = model.pe_params["t5_bias"].detach().clone()
    train(model, FixedOffsetRetrieval(16, 3), steps=20, batch_size=16, train_len=16, device="cpu")
    after = model.pe_params["t5_bias"].detach()
    assert torch.equal(after[..., 16:], before[..., 16:])
    assert (after[..., :16] != before[..., :16]).all()


# ---------------------------------------------------------------- randomised positions (Ruoss et al. 2023)
def test_randomized_positions_are_a_sorted_subset_or_a_shifted_block_of_the_range():
    from lengthgen_utils.core.encodings import LearnedAPE, RandomizedPositions

    subset = RandomizedPositions(LearnedAPE(), max_position=50)
    shift = RandomizedPositions("ape", max_position=50, contiguous=True)
    g = gen(3)
    drawn = [subset.train_positions(12, g) for _ in range(300)]
    for p in drawn:
        assert p.dtype == torch.long and p.shape == (12,)
        assert (p[1:] > p[:-1]).all() and 0 <= int(p.min()) and int(p.max()) < 50
    counts = torch.bincount(torch.cat(drawn), minlength=50)
    assert (counts > 0).all()  # every position of the range is visited, the first and last included
    for _ in range(100):
        p = shift.train_positions(12, g)
        assert torch.equal(p, torch.arange(int(p[0]), int(p[0]) + 12)) and int(p[-1]) < 50
    assert torch.equal(subset.train_positions(12, gen(5)), subset.train_positions(12, gen(5)))  # seeded
    with pytest.raises(ValueError, match="seq_len"):
        subset.train_positions(51, g)
    with pytest.raises(TypeError, match="base"):
        RandomizedPositions(subset)
    with pytest.raises(ValueError, match="max_position"):
        RandomizedPositions("rope", max_position=1)


def test_randomized_positions_change_training_only():
    """Same parameters, same function at test positions 0..L-1 as the base encoding: only training differs."""
    from lengthgen_utils.core.encodings import RandomizedPositions, RoPE

    for base in ("ape", RoPE()):
        plain = RetrievalHead(pe=base, n_models=2, max_len=64)
        randomized = RetrievalHead(pe=RandomizedPositions(base, 64), n_models=2, max_len=64)
        randomized.load_state_dict(plain.state_dict())
        torch.testing.assert_close(randomized.scores(20), plain.scores(20), rtol=0, atol=0)
        assert randomized.encoding.relative == plain.encoding.relative
        assert randomized.encoding.label.startswith(plain.encoding.label)


def test_training_loops_place_batches_at_the_encodings_training_positions():
    """Table rows beyond the training length move only when the encoding draws positions there (train and
    train_sequence), and rows beyond max_position never do."""
    from lengthgen_utils.core.encodings import RandomizedPositions

    for pe, moved in (("ape", False), (RandomizedPositions("ape", 48, contiguous=True), True),
                      (RandomizedPositions("ape", 48), True)):
        head = RetrievalHead(pe=pe, n_models=1, max_len=64)
        before = head.pe_params["table"].detach().clone()
        train(head, FixedOffsetRetrieval(16, 3), steps=60, batch_size=8, train_len=12, device="cpu")
        drift = (head.pe_params["table"].detach() - before).abs().amax(-1)[0]
        assert bool((drift[12:48] > 0).all()) == moved and (drift[48:] == 0).all()
        net = Transformer(16, 2, 2, 16, pe, max_len=64, n_models=1)
        before = net.pe_params["table"].detach().clone()
        train_sequence(net, DelayedCopy(16, 2), OptimizerSettings(lr=1e-3), steps=60, batch_size=4, train_len=12,
                       device="cpu")  # decoupled decay would move every row
        drift = (net.pe_params["table"].detach() - before).abs().amax(-1)[0]
        assert bool((drift[12:48] > 0).all()) == moved and (drift[48:] == 0).all()


def test_transformer_accepts_positions_as_a_global_shift_would_give_them():
    model = Transformer(16, 2, 2, 16, "rope", n_models=2)
    tokens, _ = DelayedCopy(16, 2).sample(3, 10, gen())
    torch.testing.assert_close(model(tokens, positions=torch.arange(10) + 7), model(tokens, position_shift=7))
    spread = torch.tensor([0, 3, 4, 10, 11, 20, 40, 41, 42, 60])
    logits, weights = model(tokens, positions=spread, return_attention=True)
    assert logits.shape == (2, 3, 10, 16) and len(weights) == 2
    with pytest.raises(ValueError, match="positions"):
        model(tokens, positions=torch.arange(9))
    with pytest.raises(ValueError, match="not both"):
        model(tokens, position_shift=1, positions=torch.arange(10))


# ---------------------------------------------------------------- RoPE scaled at test time (PI, NTK-aware)
def test_position_interpolation_divides_every_frequency_by_the_extension_factor():
    """Chen et al. 2023: position t is rotated as t * L_train / L; theta_i = 10000^(-2i/d) otherwise."""
    from lengthgen_utils.core.encodings import RoPEInterpolation

    pe = RoPEInterpolation(train_len=16)
    for seq_len, factor in ((5, 1.0), (16, 1.0), (24, 1.5), (256, 16.0)):
        expected = torch.tensor([10000 ** (-2 * i / 16) / factor for i in range(8)], dtype=torch.float64)
        torch.testing.assert_close(pe.frequencies(16, seq_len), expected, rtol=1e-14, atol=0)


def test_ntk_aware_scaling_raises_the_base_and_keeps_the_highest_frequency():
    """Peng et al. 2023 (YaRN), NTK-aware: b' = b * s^(d/(d-2)); theta_0 = 1 stays, the lowest frequency is
    divided by s exactly."""
    from lengthgen_utils.core.encodings import RoPENTK

    pe = RoPENTK(train_len=32)
    d = 16
    for seq_len in (20, 32, 64, 100, 512):
        s = max(1.0, seq_len / 32)
        b = 10000 * s ** (d / (d - 2))
        expected = torch.tensor([b ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
        theta = pe.frequencies(d, seq_len)
        torch.testing.assert_close(theta, expected, rtol=1e-12, atol=0)
        assert float(theta[0]) == 1.0
        assert float(theta[-1]) == pytest.approx(10000 ** (-(d - 2) / d) / s, rel=1e-12)
    with pytest.raises(ValueError, match="d_head"):
        RoPENTK().check(2, 1)


@pytest.mark.parametrize("name", ["rope_pi", "rope_ntk"])
def test_scaled_rope_is_rope_up_to_the_training_length_and_rotates_by_its_own_angles_beyond(name):
    from lengthgen_utils.core.rope import rope_rotation_matrix

    rope = RetrievalHead(pe="rope", n_models=2)
    scaled = RetrievalHead(pe=get_encoding(name).__class__(train_len=16), n_models=2)
    scaled.load_state_dict(rope.state_dict())
    for seq_len in (5, 16):
        torch.testing.assert_close(scaled.scores(seq_len), rope.scores(seq_len), rtol=0, atol=0)
    # beyond: the score of the query at L-1 and key j is (R(theta' (L-1)) W_Q u) . (R(theta' j) W_K u) / 4
    seq_len = 40
    theta = scaled.encoding.frequencies(16, seq_len)
    q0 = torch.einsum("md,mhd->mh", scaled.u, scaled.w_q).double()
    k0 = torch.einsum("md,mhd->mh", scaled.u, scaled.w_k).double()
    rot = rope_rotation_matrix(torch.arange(seq_len, dtype=torch.float64)[:, None] * theta)  # [L, 16, 16]
    q = torch.einsum("ij,mj->mi", rot[-1], q0)
    k = torch.einsum("lij,mj->mli", rot, k0)
    expected = torch.einsum("mi,mli->ml", q, k) / 4.0
    torch.testing.assert_close(scaled.scores(seq_len).double(), expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(scaled.scores(seq_len), rope.scores(seq_len))


# ---------------------------------------------------------------- NoPE with a BOS signal
def test_nope_bos_marks_absolute_position_zero_only():
    model = RetrievalHead(pe="nope_bos", n_models=2)
    s = model.scores(12)
    assert not torch.allclose(s[:, 0], s[:, 1])  # the marked key differs from the rest
    torch.testing.assert_close(s[:, 1:], s[:, 1:2].expand(-1, 11))  # every other key is the same
    shifted = model.scores(12, position_shift=1)  # the sequence leaves position 0: no key is marked
    torch.testing.assert_close(shifted, shifted[:, :1].expand(-1, 12))
    added = model.encoding.embed(model.pe_params, torch.tensor([3, 0, 5]))
    assert (added[:, [0, 2]] == 0).all() and torch.equal(added[:, 1], model.pe_params["bos"].detach())
