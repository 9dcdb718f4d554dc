"""Tests of the chapter 2 (equivariance) and chapter 3 (pinning) probes in ``lengthgen_utils.analysis.probes``."""
import math

import pytest
import torch

from lengthgen_utils.analysis import probes as A
from lengthgen_utils.run.configs import RetrievalExperiment
from lengthgen_utils.run.evaluation import target_attention_mass
from lengthgen_utils.core.models import RetrievalHead
from lengthgen_utils.core.encodings import LearnedAPE
from lengthgen_utils.core.rope import rope_angles
from lengthgen_utils.run.runners import build_model
from lengthgen_utils.core.tasks import FixedOffsetRetrieval
from lengthgen_utils.run.training import train


# --- equivariance (chapter 2)
@pytest.mark.parametrize("pe", ["rope", "ape", "nope"])
def test_position_logits_last_row_is_the_models_score_row(pe):
    model = RetrievalHead(pe=pe, n_models=3, max_len=64)
    s = A.position_logits(model, 20)
    assert s.shape == (3, 20, 20)
    torch.testing.assert_close(s[:, -1], model.scores(20), rtol=1e-6, atol=1e-6)
    # the row of query position m < L-1 is the score row of a length-(m+1) sequence
    torch.testing.assert_close(s[:, 9, :10], model.scores(10), rtol=1e-6, atol=1e-6)


def test_rope_position_logits_are_constant_along_diagonals_ape_are_not():
    rope = RetrievalHead(pe="rope", n_models=2)
    ape = RetrievalHead(pe=LearnedAPE(init_std=0.5), n_models=2)
    assert (A.diagonal_spread(A.position_logits(rope, 40)) < 1e-5).all()
    assert (A.diagonal_spread(A.position_logits(ape, 40)) > 0.1).all()


def test_diagonal_spread_pinned_values():
    m = torch.tensor([[0.0, 9.0], [2.0, 0.5]])  # diagonals: D=0 -> {0, 0.5}, D=-1 -> {2}, D=+1 -> {9}
    assert float(A.diagonal_spread(m)) == 0.5
    assert float(A.diagonal_spread(m, causal=False)) == 0.5
    with pytest.raises(ValueError, match="logits"):
        A.diagonal_spread(torch.zeros(2, 3))


def test_rope_shift_difference_is_float32_small_at_huge_shifts_and_ape_is_not():
    rope = RetrievalHead(pe="rope", n_models=4)
    d = A.shift_logit_difference(rope, 16, [0, 1, 1000, 100_000])
    assert d.shape == (4, 4)
    assert (d[:, 0] == 0).all()
    assert d.max() < 1e-4
    ape = RetrievalHead(pe=LearnedAPE(init_std=0.5), n_models=4, max_len=256)
    assert (A.shift_logit_difference(ape, 16, [1, 100]) > 1e-2).all()
    with pytest.raises(ValueError, match="APE table"):
        A.shift_logit_difference(ape, 16, [241])


def test_shared_offset_difference():
    rope = RetrievalHead(pe="rope", n_models=3)
    assert (A.shared_offset_difference(rope, 16, 256) < 1e-4).all()
    ape = RetrievalHead(pe=LearnedAPE(init_std=0.5), n_models=3)
    assert (A.shared_offset_difference(ape, 16, 64) > 1e-2).all()
    with pytest.raises(ValueError, match="long_len"):
        A.shared_offset_difference(rope, 16, 8)


def test_angles_in_float64_match_rope_angles_and_float16_is_wrong_by_order_one():
    pos = torch.arange(0, 5000)
    torch.testing.assert_close(rope_angles(pos, 16, dtype=torch.float64), rope_angles(pos, 16), rtol=0, atol=0)
    assert A.rope_angle_error(torch.arange(0, 256), 16, dtype=torch.float32).max() < 1e-4
    err16 = A.rope_angle_error(torch.arange(1000, 5000), 16, dtype=torch.float16).amax(-1)
    errbf = A.rope_angle_error(torch.arange(1000, 5000), 16, dtype=torch.bfloat16).amax(-1)
    assert err16.max() > 0.5 and errbf.max() > 2.0
    assert (A.rope_angle_error(pos, 16, dtype=torch.float16) <= math.pi + 1e-12).all()
    # pinned: position 1857 in bfloat16 rounds to 1856, so the theta_0 = 1 angle is off by exactly 1 rad
    assert float(A.rope_angle_error(torch.tensor([1857]), 16, dtype=torch.bfloat16)[0, 0]) == pytest.approx(1.0)


def test_angles_reject_overflow_and_bad_dtype():
    with pytest.raises(ValueError, match="overflow"):
        rope_angles(torch.tensor([70000]), 16, dtype=torch.float16)
    with pytest.raises(TypeError, match="dtype"):
        rope_angles(torch.tensor([1]), 16, dtype=torch.int32)
    with pytest.raises(TypeError, match="positions"):
        rope_angles(torch.tensor([1.0]), 16)


def test_low_precision_angles_break_the_trained_shift_invariance():
    rope = RetrievalHead(pe="rope", n_models=2)
    exact = A.position_logits(rope, 16, position_shift=3000)
    half = A.position_logits(rope, 16, position_shift=3000, angle_dtype="float16")
    assert (exact - A.position_logits(rope, 16)).abs().max() < 1e-4
    assert (half - exact).abs().max() > 1e-2


def test_target_attention_is_a_weight():
    model = RetrievalHead(pe="nope", n_models=2)
    a = target_attention_mass(model, 3, [8, 32])
    torch.testing.assert_close(a, torch.tensor([[1 / 8, 1 / 32]] * 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="lengths"):
        target_attention_mass(model, 3, [3])


# --- pinning (chapter 3)
def _ape(max_len=64, n_models=3, std=0.02):
    return RetrievalHead(pe=LearnedAPE(init_std=std), n_models=n_models, max_len=max_len)


def test_attention_argmax_histogram_and_pinned_position():
    model = _ape()
    with torch.no_grad():  # make key position 5 win at every length: a big key along the query
        q = torch.einsum("md,mhd->mh", model.u, model.w_q)
        direction = torch.linalg.lstsq(model.w_k, q[..., None]).solution[..., 0]
        model.pe_params["table"][:, 5] = 50 * direction
    lengths = list(range(16, 65))
    argmax = A.attention_argmax(model, lengths)
    assert argmax.shape == (3, len(lengths)) and (argmax == 5).all()
    counts = A.attention_argmax_histogram(model, lengths)
    assert counts.shape == (3, 64) and (counts.sum(-1) == len(lengths)).all() and (counts[:, 5] == len(lengths)).all()
    pos, frac = A.pinned_position(model, lengths)
    assert pos.tolist() == [5, 5, 5] and frac.tolist() == [1.0, 1.0, 1.0]


def test_unseen_rows_get_exactly_zero_gradient_and_seen_rows_do_not():
    model = _ape()
    g = A.position_table_gradient(model, FixedOffsetRetrieval(16, 3), [12, 16], batch_size=32)
    assert g.shape == (3, 64)
    assert (g[:, 16:] == 0).all()
    assert (g[:, :16] > 0).all()
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(TypeError, match="APE"):
        A.position_table_gradient(RetrievalHead(pe="rope"), FixedOffsetRetrieval(16, 3), [16])


@pytest.mark.parametrize("weight_decay, unseen_changes", [(0.0, False), (0.1, True)])
def test_training_leaves_unseen_rows_at_init_unless_weight_decay(weight_decay, unseen_changes):
    exp = RetrievalExperiment(pe="ape", n_seeds=2, steps=20, train_len=12, fixed_length=True,
                              weight_decay=weight_decay, length_multiples=(1, 2))
    model, initial = build_model(exp), build_model(exp)
    train(model, exp.task, exp.optimizer_settings, steps=exp.steps, batch_size=32, train_len=exp.train_len,
          fixed_length=True, device="cpu")
    drift = A.table_drift(model, initial)
    assert drift.shape == (2, 24)
    assert (drift[:, :12] > 0).all()
    assert bool((drift[:, 12:] > 0).all()) is unseen_changes
    assert bool((drift[:, 12:] == 0).all()) is (not unseen_changes)
    if unseen_changes:  # decoupled decay shrinks an untouched row by exactly (1 - lr wd) per step
        ratio = model.pe_params['table'][:, 12:] / initial.pe_params['table'][:, 12:]
        torch.testing.assert_close(ratio, torch.full_like(ratio, (1 - 1e-2 * 0.1) ** 20), rtol=1e-5, atol=1e-5)


def test_table_size_does_not_change_the_shared_rows_of_the_init():
    a = build_model(RetrievalExperiment(pe="ape", n_seeds=2, max_len=64))
    b = build_model(RetrievalExperiment(pe="ape", n_seeds=2, max_len=256))
    assert torch.equal(a.pe_params['table'], b.pe_params['table'][:, :64])
    assert RetrievalExperiment(pe="ape", max_len=64).eval_lengths == [16, 32, 64]
    with pytest.raises(ValueError, match="max_len"):
        RetrievalExperiment(pe="ape", max_len=8)


def test_query_similarity():
    model = _ape(std=0.0)  # no position signal at all: every query is W_Q^T u
    sim = A.query_similarity(model, [0, 30, 63], reference_position=15)
    torch.testing.assert_close(sim, torch.ones(3, 3, dtype=torch.float64))
    model = _ape(std=1.0)
    assert (A.query_similarity(model, [30], reference_position=15) < 0.999).all()
    with pytest.raises(ValueError, match="APE table"):
        A.query_similarity(model, [64], reference_position=15)


def test_position_attention_rows_are_causal_softmax_and_last_row_is_the_models():
    model = RetrievalHead(pe=LearnedAPE(init_std=0.5), n_models=2, max_len=32)
    a = A.position_attention(model, 12)
    assert a.shape == (2, 12, 12)
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 12))
    assert (a.triu(1) == 0).all()
    torch.testing.assert_close(a[:, -1], model.attention_row(12))
    linear = RetrievalHead(pe="rope", attention="linear", n_models=2)  # raw scores on and below the diagonal
    torch.testing.assert_close(A.position_attention(linear, 8), A.position_logits(linear, 8).tril())


# --- figures of chapters 2 and 3
def test_slider_figure_has_one_step_per_length():
    from lengthgen_utils.book import ch03

    rows = {L: torch.full((3, L), 1.0 / L) for L in (16, 24, 32)}
    fig = ch03.attention_row_slider(rows, train_len=16, target_offset=3, title="t")
    steps = fig.layout.sliders[0].steps
    assert [s.label for s in steps] == ["16", "24", "32"]
    shown = [t for t, v in zip(fig.data, steps[2].args[0]["visible"]) if v]
    assert len(shown) == 4 and len(shown[0].x) == 32  # 3 seeds + the target marker
    shown = [t for t, v in zip(fig.data, steps[1].args[0]["visible"]) if v]
    assert list(shown[3].x) == [20, 20]  # target key L - 1 - k at L = 24
    with pytest.raises(ValueError, match="rows"):
        ch03.attention_row_slider({16: torch.zeros(3, 15)}, 16, 3, "t")


def test_attention_row_slider_opens_at_the_requested_length():
    from lengthgen_utils.book import ch03

    rows = {L: torch.full((3, L), 1.0 / L) for L in (16, 24, 32, 40)}
    fig = ch03.attention_row_slider(rows, train_len=16, target_offset=3, title="t", active=32)
    slider = fig.layout.sliders[0]
    assert slider.active == 2 and slider.steps[2].label == "32"
    shown = [t for t in fig.data if t.visible is not False]  # the page opens on L = 32's traces
    assert len(shown) == 4 and len(shown[0].x) == 32 and list(shown[3].x) == [28, 28]
    assert ch03.attention_row_slider(rows, 16, 3, "t").layout.sliders[0].active == 0  # default: shortest
    for bad in (33, True, "32"):
        with pytest.raises(ValueError, match="active"):
            ch03.attention_row_slider(rows, 16, 3, "t", active=bad)


def test_per_position_curves_zooms_the_x_axis_but_draws_every_position():
    from lengthgen_utils.book import ch03

    values = {"fixed": torch.rand(3, 256)}
    fig = ch03.per_position_curves(values, "t", "y", train_len=16, x_max=47)
    assert tuple(fig.layout.xaxis.range) == (-0.5, 47.5)
    assert len(fig.data[-1].x) == 256  # zooming out still shows the flat rest
    assert ch03.per_position_curves(values, "t", "y").layout.xaxis.range is None
    with pytest.raises(ValueError, match="x_max"):
        ch03.per_position_curves(values, "t", "y", x_max=0)
    with pytest.raises(TypeError, match="x_max"):
        ch03.per_position_curves(values, "t", "y", x_max=47.0)


def test_heatmap_and_histogram_figures_validate_and_label():
    from lengthgen_utils.book import ch03, figures

    fig = figures.position_heatmaps({"a": torch.zeros(8, 8), "b": torch.ones(8, 8)}, "t", "logit", train_len=4)
    assert len(fig.data) == 2 and fig.layout.xaxis2.title.text.startswith("key position")  # under the last panel
    with pytest.raises(ValueError, match="square"):
        figures.position_heatmaps({"a": torch.zeros(8, 7)}, "t", "logit")
    counts = torch.zeros(2, 64, dtype=torch.long)
    counts[:, 12] = 10
    fig = ch03.argmax_histogram(counts, train_len=16, marker_position=12, title="t")
    assert len(fig.data) == 2 and list(fig.data[0].y[:13]) == [0] * 12 + [10]
