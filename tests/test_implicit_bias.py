"""Chapter 5c's machinery: the max-margin and decoy kernels, writing a kernel into a head, the fixed training set
of full-batch gradient descent, and the initialisation scale."""
import itertools
import math

import pytest
import torch

from lengthgen_utils.analysis import implicit_bias as ib
from lengthgen_utils.analysis import kernel
from lengthgen_utils.core.models import RetrievalHead
from lengthgen_utils.core.tasks import FixedOffsetRetrieval
from lengthgen_utils.run.configs import RetrievalExperiment, RetrievalSweep
from lengthgen_utils.run.optim import OptimizerSettings
from lengthgen_utils.run.training import train


def brute_force_min_norm(g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The min-norm point of ``g c >= h`` by enumerating active sets (a tiny programme only)."""
    best = None
    for size in range(1, g.shape[0] + 1):
        for rows in itertools.combinations(range(g.shape[0]), size):
            ga, ha = g[list(rows)], h[list(rows)]
            c = ga.T @ torch.linalg.lstsq(ga @ ga.T, ha[:, None]).solution[:, 0]
            if bool((g @ c >= h - 1e-9).all()) and (best is None or c.norm() < best.norm()):
                best = c
    return best


def test_max_margin_kernel_matches_brute_force_on_a_tiny_window():
    # d_head 4 (two pairs), window of 6: five constraints, 31 active sets
    g = ib.margin_constraints(2, 6, d_head=4)
    expected = brute_force_min_norm(g, torch.ones(g.shape[0], dtype=torch.float64))
    got = ib.max_margin_kernel(2, 6, d_head=4)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("offset", [1, 3, 5])
def test_max_margin_kernel_has_unit_margin_and_peaks_at_the_target(offset):
    c = ib.max_margin_kernel(offset, 16)
    s = ib.kernel_values(c, 16)
    assert ib.window_margin(s, offset, 16).item() == pytest.approx(1.0, abs=1e-6)
    assert kernel.peak_distance(s).item() == offset
    # a smaller multiple of c_mm loses the unit margin: it is the least norm that has one
    assert ib.window_margin(0.99 * s, offset, 16).item() < 1.0


def brute_force_linf_min(g: torch.Tensor, h: torch.Tensor, d: int) -> float:
    """The least ``max_i |c_i|`` with ``g c >= h`` by enumerating the LP's vertices (a tiny programme only).

    Variables ``(c, t)``; the optimum of ``min t`` is attained at a vertex: ``d + 1`` of the constraints
    ``g c >= h``, ``t - c_i >= 0``, ``t + c_i >= 0`` tight.
    """
    eye = torch.eye(d, dtype=torch.float64)
    a = torch.cat([torch.cat([g, torch.zeros(g.shape[0], 1, dtype=torch.float64)], 1),
                   torch.cat([-eye, torch.ones(d, 1, dtype=torch.float64)], 1),
                   torch.cat([eye, torch.ones(d, 1, dtype=torch.float64)], 1)])
    b = torch.cat([h, torch.zeros(2 * d, dtype=torch.float64)])
    best = math.inf
    for rows in itertools.combinations(range(a.shape[0]), d + 1):
        sub = a[list(rows)]
        if torch.linalg.matrix_rank(sub) < d + 1:
            continue
        x = torch.linalg.solve(sub, b[list(rows)])
        if bool((a @ x >= b - 1e-9).all()):
            best = min(best, float(x[-1]))
    return best


def test_linf_max_margin_kernel_matches_a_vertex_enumeration_on_a_tiny_window():
    # d_head 4 (two pairs), window of 6: five margin rows and eight box rows, C(13, 5) vertices
    g = ib.margin_constraints(2, 6, d_head=4)
    expected = brute_force_linf_min(g, torch.ones(g.shape[0], dtype=torch.float64), 4)
    c = ib.linf_max_margin_kernel(2, 6, d_head=4)
    assert c.abs().max().item() == pytest.approx(expected, rel=1e-6)
    assert bool((g @ c >= 1 - 1e-7).all())


def test_linf_max_margin_kernel_by_hand_on_one_pair():
    # one pair (d_head 2, theta = 1), window of 3, target k = 1, s(D) = a cos D + b sin D. The margins:
    #   over D = 0:  a (cos 1 - 1) - b sin 1 >= 1            (wants b < 0)
    #   over D = -2: a (cos 1 - cos 2) + b (sin 2 - sin 1) >= 1   (wants a > 0)
    # At the optimum b = -t and both margins are tight: a = (1 - t (sin 1 - sin 2)) / (cos 1 - cos 2) from the
    # second, and the first gives t* = (1 + r) / (sin 1 + r (sin 1 - sin 2)), r = (1 - cos 1) / (cos 1 - cos 2).
    c1, c2, s1, s2 = math.cos(1), math.cos(2), math.sin(1), math.sin(2)
    r = (1 - c1) / (c1 - c2)
    t = (1 + r) / (s1 + r * (s1 - s2))
    a = (1 - t * (s1 - s2)) / (c1 - c2)
    assert abs(a) < t  # b, not a, sits on the box
    c = ib.linf_max_margin_kernel(1, 3, d_head=2)
    torch.testing.assert_close(c, torch.tensor([a, -t], dtype=torch.float64), atol=1e-6, rtol=1e-6)
    assert ib.window_margin(ib.kernel_values(c, 3, d_head=2), 1, 3).item() == pytest.approx(1.0, abs=1e-6)
    g = ib.margin_constraints(1, 3, d_head=2)
    assert brute_force_linf_min(g, torch.ones(2, dtype=torch.float64), 2) == pytest.approx(t, rel=1e-9)


@pytest.mark.parametrize("offset", [1, 3, 5])
def test_linf_max_margin_kernel_has_unit_margin_and_least_max_coefficient(offset):
    c = ib.linf_max_margin_kernel(offset, 16)
    s = ib.kernel_values(c, 16)
    assert ib.window_margin(s, offset, 16).item() >= 1 - 1e-6
    # the l2 max-margin kernel also has a unit margin, so its max |c_i| cannot be smaller
    assert ib.max_margin_kernel(offset, 16).abs().max().item() >= c.abs().max().item() - 1e-7
    with pytest.raises(ValueError, match="offset"):
        ib.linf_max_margin_kernel(16, 16)


def test_decoy_kernel_fits_the_window_and_beats_the_target_at_the_decoy():
    c = ib.decoy_kernel(3, 16, 24, margin=8.0)
    s = ib.kernel_values(c, 32)
    assert ib.window_margin(s, 3, 16).item() >= 8.0 - 1e-6
    by_distance = s.flip(1)[0]
    assert by_distance[24] - by_distance[3] >= 8.0 - 1e-6
    with pytest.raises(ValueError, match="decoy"):
        ib.decoy_kernel(3, 16, 10, margin=8.0)
    with pytest.raises(ValueError, match="margin"):
        ib.decoy_kernel(3, 16, 24, margin=0.0)


def test_write_kernel_gives_the_kernel_exactly_and_keeps_the_value_path():
    model = RetrievalHead(n_models=3)
    c = torch.stack([ib.decoy_kernel(k, 16, 24, 6.0) for k in (1, 2, 3)])
    built = ib.write_kernel(model, c)
    torch.testing.assert_close(kernel.factorized_kernel(built), c, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(built.w_v, model.w_v)
    torch.testing.assert_close(built.w_o, model.w_o)
    assert not torch.equal(built.w_q, model.w_q)  # the argument is left alone
    with pytest.raises(ValueError, match="RetrievalHead with a RoPE"):
        ib.write_kernel(RetrievalHead(pe="ape", n_models=1), c[0])


def test_distance_travelled_is_zero_for_the_initial_model_and_scales():
    model = RetrievalHead(n_models=2)
    assert ib.distance_travelled(model, RetrievalHead(n_models=2)).abs().max() == 0
    doubled = RetrievalHead(n_models=2, init_scale=2.0)
    torch.testing.assert_close(ib.distance_travelled(doubled, model), torch.ones(2, dtype=torch.float64))


def test_init_scale_multiplies_every_initial_weight():
    base, small = RetrievalHead(pe="ape", n_models=2), RetrievalHead(pe="ape", n_models=2, init_scale=0.1)
    for (name, p), (_, q) in zip(base.named_parameters(), small.named_parameters()):
        torch.testing.assert_close(q, 0.1 * p, msg=name)
    assert small.subset([1]).config.init_scale == 0.1
    with pytest.raises(ValueError, match="init_scale"):
        RetrievalHead(init_scale=0.0)
    with pytest.raises(ValueError, match="init_scale"):
        RetrievalSweep(init_scale=-1.0)


def test_train_set_is_validated_and_carried_by_the_sweep():
    with pytest.raises(ValueError, match="train_set"):
        RetrievalSweep(train_set=0)
    with pytest.raises(ValueError, match="train_set"):
        train(RetrievalHead(n_models=1), FixedOffsetRetrieval(16, 3), steps=1, train_set=0)
    sweep = RetrievalSweep(pes=("rope",), offsets=(1, 3), train_set=8, init_scale=0.5)
    exp = sweep.experiment("rope", 3)
    assert (exp.train_set, exp.init_scale) == (8, 0.5)
    assert RetrievalSweep.of_experiment(exp, (1, 3)).train_set == 8
    assert isinstance(RetrievalExperiment(train_set=4), RetrievalExperiment)


def test_full_batch_gradient_descent_on_a_fixed_set_decreases_the_loss_every_step():
    # full-batch gradient descent with a small step on a smooth loss: every step lowers it; the same
    # recipe on fresh batches does not (the batch's noise moves the loss up and down)
    task = FixedOffsetRetrieval(16, 3)
    gd = train(RetrievalHead(n_models=2), task, OptimizerSettings("sgd", lr=0.05), steps=30, train_set=8)
    assert bool((gd[1:] < gd[:-1]).all())
    again = train(RetrievalHead(n_models=2), task, OptimizerSettings("sgd", lr=0.05), steps=30, train_set=8)
    torch.testing.assert_close(gd, again)  # one fixed set, drawn from the seed
    sgd = train(RetrievalHead(n_models=2), task, OptimizerSettings("sgd", lr=0.05), steps=30, batch_size=8)
    assert not bool((sgd[1:] < sgd[:-1]).all())


def test_full_batch_loss_is_the_mean_over_lengths_of_each_lengths_loss():
    task = FixedOffsetRetrieval(16, 3)
    model = RetrievalHead(n_models=1)
    history = train(model, task, OptimizerSettings("sgd", lr=1e-12), steps=1, train_set=4, seed=5)
    from lengthgen_utils.core.seeding import generator
    from lengthgen_utils.run.training import ensemble_cross_entropy

    gen = generator(5)
    losses = []
    for seq_len in range(5, 17):
        tokens, _ = task.sample(4, seq_len, gen, "cpu")
        logits, _ = model(tokens)
        losses.append(ensemble_cross_entropy(logits, task.targets(tokens)[None, :, -1]))
    assert math.isclose(history[0, 0].item(), torch.stack(losses).mean().item(), rel_tol=1e-5)


def test_sign_test_p():
    assert ib.sign_test_p(5, 5, 0.5) == pytest.approx(1 / 32)
    assert ib.sign_test_p(0, 5, 0.5) == pytest.approx(1.0)


def test_the_committed_learning_rates_follow_the_stated_rule():
    import json

    from lengthgen_utils.book import ch05c
    from lengthgen_utils.tools.learning_rates import GRID, SEEDS

    rates = json.loads(ch05c.RATES_FILE.read_text())
    assert set(rates["lr"]) == set(GRID)
    for rule, counts in rates["fits_of_6"].items():
        counts = {float(lr): n for lr, n in counts.items()}
        assert set(counts) == set(GRID[rule][3])
        full = [lr for lr, n in counts.items() if n == 2 * SEEDS]
        expected = max(full) if full else max(counts, key=lambda lr: (counts[lr], lr))
        assert rates["lr"][rule] == expected
    for profile in ("quick", "default", "full"):  # every cell's rule has a committed rate
        assert all(rule in rates["lr"] for rule, _ in ch05c.CELLS[profile])


def test_chapter_5c_figure_and_table_read_their_cells():
    from lengthgen_utils.book import ch05c

    lengths = [16, 32, 64]
    acc = torch.tensor([[1.0, 0.5, 0.1], [1.0, 1.0, 0.2]], dtype=torch.float64)
    fig = ch05c.accuracy_panels({"Adam": (lengths, acc, acc), "built: decoy": (lengths, acc, None)}, 1 / 16, 16, "t")
    assert len(fig.data) == 3 and fig.data[2].line.dash == "dash"
    s = ch05c.CellSummary(
        rope_accuracy=acc, ape_accuracy=acc, lengths=lengths, offsets=[1, 3], rope_fit=torch.tensor([True, True]),
        ape_fit=torch.tensor([True, False]), margin=torch.tensor([2.0, 4.0]), travelled=torch.tensor([0.1, 0.3]),
        alignment_auc=0.9, cos_mm=torch.tensor([0.9, 0.8]), cos_mm_null=torch.tensor([0.0, 0.1]),
        first_alias=[40, None], ape_unseen_drift=0.0)
    (row,) = ch05c.summary_rows({("Adam", 1.0): s})
    assert row["cell"] == "Adam" and row["RoPE 2x"] == "0.75" and row["alias <= 4x"] == "0.50"
    assert row["APE fit"] == "0.50" and row["margin"] == "2.0"  # torch's median of two is the lower
    assert ch05c.cell_label(("gradient descent", 0.1)) == "gradient descent, init x0.1"


def test_chapter_5c_summary_counts_diverged_heads_and_leaves_them_out():
    # gradient descent at init x10 (full profile) diverges: every parameter NaN; the summary must not crash on
    # it nor let a NaN head fit, and the table says how many diverged
    from lengthgen_utils.book import ch05c
    from lengthgen_utils.run.runners import run_sweep

    sweep = RetrievalSweep(pes=("rope", "ape"), offsets=(1, 3), n_seeds=2, steps=2, batch_size=8, eval_samples=16,
                           length_multiples=(1, 2), vocab_size=16, train_len=16)
    runs = run_sweep(sweep, cache=False)
    for pe in ("rope", "ape"):
        with torch.no_grad():
            next(runs.where(pe=pe).model.parameters())[0].fill_(float("nan"))  # head (k=1, seed 0) diverged
    s = ch05c.summarise(runs, n_null=8)
    assert s.rope_diverged == 1 and s.ape_diverged == 1
    assert not bool(s.rope_fit[0]) and not bool(s.ape_fit[0])
    assert s.alignment_auc is not None and math.isfinite(s.alignment_auc)
    assert math.isfinite(s.ape_unseen_drift)
    (row,) = ch05c.summary_rows({("gradient descent", 10.0): s})
    assert row["diverged"] == "1/1" and row["margin"] != "nan" and "nan" not in row["cos c_mm"]


def _cell(fit, acc_2x, acc_16x, travelled=0.5):
    """A fake CellSummary: lengths 16 / 32 / 256, every head fitted or not as ``fit``, accuracies as given."""
    from lengthgen_utils.book import ch05c

    n = len(fit)
    acc = torch.tensor([[1.0 if f else 0.5, a2, a16] for f, a2, a16 in zip(fit, acc_2x, acc_16x)], dtype=torch.float64)
    return ch05c.CellSummary(
        rope_accuracy=acc, ape_accuracy=acc, lengths=[16, 32, 256], offsets=[1] * n, rope_fit=torch.tensor(fit),
        ape_fit=torch.tensor(fit), margin=torch.ones(n), travelled=torch.full((n,), travelled),
        alignment_auc=0.9, cos_mm=torch.ones(n), cos_mm_null=torch.zeros(n), first_alias=[40] * n,
        ape_unseen_drift=0.0)


def test_chapter_5c_init_comparison_tables_and_its_absence():
    # the initialisation axis: None where the profile does not train it; otherwise the Fisher tables count fitted
    # heads only, GD (x1 vs x0.1) at 2x and Adam (x0.1 vs x1) at 16x
    from lengthgen_utils.book import ch05c

    assert ch05c.compare_init_scales({("Adam", 1.0): _cell([True], [1.0], [1.0])}) is None
    holds, fails = [True] * 6, [True] * 6
    summaries = {
        ("gradient descent", 1.0): _cell(holds + [False], [1.0] * 6 + [1.0], [0.1] * 7),  # the unfitted head is out
        ("gradient descent", 0.1): _cell(fails, [0.1] * 6, [0.1] * 6),
        ("gradient descent", 10.0): _cell([False] * 6, [0.1] * 6, [0.1] * 6),
        ("Adam", 1.0): _cell(holds, [1.0] * 6, [0.95, 0.5, 0.5, 0.5, 0.5, 0.5]),
        ("Adam", 0.1): _cell(holds, [1.0] * 6, [0.95] * 6),
        ("Adam", 10.0): _cell([False] * 6, [0.1] * 6, [0.1] * 6),
    }
    c = ch05c.compare_init_scales(summaries)
    assert c.gd_table == [[6, 0], [0, 6]] and c.adam_table == [[6, 0], [1, 5]]
    # one-sided Fisher p, written out: the hypergeometric tail of 12 heads, 6 per row
    assert math.isclose(c.p_gd_2x, 1 / math.comb(12, 6))  # 6 holding of 6: only the observed table
    assert math.isclose(c.p_adam_16x, math.comb(7, 6) / math.comb(12, 6))  # 7 holding, all 6 in the first row
    assert "6 of 6" in c.text and "0 of 6 (0 diverged)" in c.text


def test_chapter_5c_sign_text_says_when_the_committed_step_does_not_fit():
    # where sign descent fits fewer than half its heads at its committed step (full, 4000 steps) the paragraph
    # must not claim a 2x comparison; where it fits, it gives the comparison and its p values
    from lengthgen_utils.book import ch05c

    adam = _cell([True] * 4, [1.0] * 4, [1.0] * 4)
    small = _cell([True] * 4, [1.0, 1.0, 1.0, 0.1], [1.0] * 4)
    for fit, fits_enough in (([True, True, False, False], True), ([True, False, False, False], False)):
        sign = _cell(fit, [0.1] * 4, [0.1] * 4, travelled=4.0)
        assert ch05c.sign_fits_enough(sign) is fits_enough
        cells = {"sign": sign, "adam": adam, "small": small}
        hold = {k: ch05c.fitted_holding(s) for k, s in cells.items()}
        text = ch05c.sign_step_text(cells, hold, [1e-9, 2e-8], 3e-3, 4000)
        assert ("nothing to compare at 2x" in text) is not fits_enough
        assert ("p = 1e-09" in text) is fits_enough
        assert "3 of them hold 0.9 at 2x" in text and "4000 steps" in text
