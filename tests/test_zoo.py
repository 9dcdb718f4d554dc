"""The encoding zoo (chapter 9): the placement and shift probes, the zoo's runs and its table and figures."""
import numpy as np
import pytest
import torch

from lengthgen_utils.book import ch09, sliders, tables
from lengthgen_utils.run import zoo
from lengthgen_utils.core.models import RetrievalHead
from lengthgen_utils.core.encodings import (LearnedAPE, RandomizedPositions, RoPE, RoPEInterpolation, RoPENTK,
                                            get_encoding)
from lengthgen_utils.analysis.probes import (PLACEMENTS, argmax_placement, copy_head_placement, copying_head_reads,
                                             shift_attention_change)
from lengthgen_utils.run.profiles import Profile
from lengthgen_utils.core.tasks import DelayedCopy


class ScoreRows:
    """A stand-in single head whose score row at length L puts its maximum where ``where(L)`` says."""

    def __init__(self, *wheres):
        self.wheres = wheres

    def scores(self, seq_len):
        rows = torch.zeros(len(self.wheres), seq_len)
        for m, where in enumerate(self.wheres):
            rows[m, where(seq_len)] = 1.0
        return rows


def test_argmax_placement_tells_the_offset_a_pinned_position_and_the_rest_apart():
    lengths, k = [32, 64, 128, 256], 3
    model = ScoreRows(lambda L: L - 1 - k,            # reads the offset
                      lambda L: 12,                   # pinned to one trained position
                      lambda L: L - 1 - 18,           # a fixed wrong offset: moves with the query
                      lambda L: 12 if L < 100 else 100)  # pinned, then beyond the trained positions
    codes = argmax_placement(model, lengths, offset=k, visited=16)
    assert codes.tolist() == [[0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2], [1, 1, 2, 2]]
    assert PLACEMENTS[0] == "at the offset"
    with pytest.raises(ValueError, match="lengths"):
        argmax_placement(model, [4], offset=3, visited=16)


class HeadScores:
    """A stand-in transformer whose only informative head (layer 2, head 1) attends to ``key(t)``."""

    n_models, device = 2, torch.device("cpu")

    def __init__(self, key):
        self.key = key

    def head_scores(self, tokens):
        b, seq_len = tokens.shape
        layers = [torch.zeros(self.n_models, b, 2, seq_len, seq_len) for _ in range(2)]
        for t in range(seq_len):
            layers[1][:, :, 1, t, self.key(t)] = 5.0
            layers[0][:, :, :, t, t] = 1.0  # other heads attend to the query itself
            layers[1][:, :, 0, t, t] = 1.0
        return layers


def test_copy_head_placement_finds_the_copying_head_and_classifies_its_argmax():
    task = DelayedCopy(16, 5)
    copying = HeadScores(lambda t: max(t - 5, 0))
    fractions, heads = copy_head_placement(copying, task, 64, train_len=32, visited=32, n_samples=2)
    assert fractions.tolist() == [[1.0, 0.0, 0.0]] * 2
    assert heads[:, :2].tolist() == [[1, 1]] * 2 and heads[0, 2] == 2 * (32 - 5)  # 2 sequences x 27 queries
    reads_inside = HeadScores(lambda t: max(t - 5, 0) if t < 32 else 7)  # copies inside, then reads position 7
    fractions, _ = copy_head_placement(reads_inside, task, 64, train_len=32, visited=32, n_samples=2)
    assert fractions.tolist() == [[0.0, 1.0, 0.0]] * 2
    fractions, _ = copy_head_placement(reads_inside, task, 64, train_len=32, visited=8, n_samples=2, min_query=48)
    assert fractions.tolist() == [[0.0, 1.0, 0.0]] * 2  # 7 < 8: still a visited position
    with pytest.raises(ValueError, match="seq_len"):
        copy_head_placement(copying, task, 32, train_len=32, visited=32)


def test_copying_head_reads_counts_target_argmaxes_before_and_after_the_alias():
    task = DelayedCopy(16, 5)
    # layer 2, head 1 reads t - 5 until query 40, then the key 7 (an alias at distance t - 7 >= 33)
    head = HeadScores(lambda t: max(t - 5, 0) if t < 40 else 7)
    reads = copying_head_reads(head, task, [(1, 1), (1, 1)], 64, train_len=32, alias=[40, None], n_samples=2)
    assert reads.tolist() == [[2 * 8, 2 * 8, 0, 2 * 24], [2 * 8, 2 * 32, 0, 0]]
    other = copying_head_reads(head, task, [(0, 0), (1, 0)], 64, train_len=32, alias=[40, 40], n_samples=2)
    assert other[:, 0].tolist() == [0, 0] and other[:, 2].tolist() == [0, 0]  # those heads read the query itself
    with pytest.raises(ValueError, match="pairs"):
        copying_head_reads(head, task, [(2, 0), (1, 1)], 64, train_len=32, alias=[40, 40])
    with pytest.raises(ValueError, match="one entry per model"):
        copying_head_reads(head, task, [(1, 1)], 64, train_len=32, alias=[40])


def test_shift_attention_change_is_zero_for_rope_and_not_for_ape():
    rope = RetrievalHead(pe="rope", n_models=2, max_len=64)
    ape = RetrievalHead(pe="ape", n_models=2, max_len=64)
    assert shift_attention_change(rope, 16, [1, 20, 40]).max() < 1e-6
    change = shift_attention_change(ape, 16, [1, 20], reference=8)
    assert change.shape == (2, 2) and (change > 1e-4).all() and (change <= 1).all()


def test_the_zoo_has_one_of_each_encoding_and_trains_test_time_scalings_as_rope():
    encodings = zoo.zoo_encodings(16)
    assert len(encodings) == len(set(encodings)) == 12
    assert len({pe.label for pe in encodings}) == 12  # labels pair the two tasks' runs
    assert {pe.name for pe in encodings} >= {"nope", "nope_bos", "ape", "sinusoidal", "randomized", "rope",
                                             "rope_pi", "rope_ntk", "alibi", "t5"}
    assert zoo.control_encoding(16) in encodings and zoo.control_encoding(16).max_position == 64
    assert RoPEInterpolation(train_len=16).for_training() == RoPE()
    assert RoPENTK(base=500.0, train_len=32).for_training() == RoPE(base=500.0)
    assert LearnedAPE().for_training() == LearnedAPE()
    assert zoo.control_encoding(32).visited_positions(32) == 128 and RoPE().visited_positions(16) == 16
    assert RoPENTK(train_len=16).length_dependent and not RoPE().length_dependent
    full = Profile("full", n_seeds=1, steps=1, batch_size=1, eval_samples=1, length_multiples=(1,))
    quick = Profile("quick", n_seeds=1, steps=1, batch_size=1, eval_samples=1, length_multiples=(1,))
    assert len(zoo.copy_zoo_encodings(full)) == 12
    assert [pe.label for pe in zoo.copy_zoo_encodings(quick)] == ["NoPE", "APE (learned)",
                                                                  "APE (learned) + random shift", "RoPE"]


def test_a_test_time_encoding_needs_the_trained_parameters():
    rope = RetrievalHead(pe="rope", n_models=1)
    with pytest.raises(ValueError, match="parameters"):
        zoo._with_encoding(rope, get_encoding("ape"), lambda pe: RetrievalHead(pe=pe, n_models=1))
    copy = zoo._with_encoding(rope, RoPEInterpolation(train_len=16), lambda pe: RetrievalHead(pe=pe, n_models=1))
    torch.testing.assert_close(copy.scores(16), rope.scores(16), rtol=0, atol=0)
    with pytest.raises(TypeError, match="trained"):
        zoo.TestTimeEncoding("rope", "rope")


def test_run_retrieval_zoo_evaluates_rope_weights_under_position_interpolation():
    profile = Profile("test", n_seeds=2, steps=1, batch_size=8, eval_samples=64, length_multiples=(1, 2))
    runs = zoo.run_retrieval_zoo(profile, encodings=["rope", RoPEInterpolation(train_len=16)], cache=False)
    rope, pi = runs.values()
    assert pi.experiment == rope.experiment and pi.experiment.steps == zoo.MIN_STEPS
    assert pi.model.encoding == RoPEInterpolation(train_len=16) and rope.model.encoding == RoPE()
    torch.testing.assert_close(pi.accuracy[:, 0], rope.accuracy[:, 0])  # the same weights at 1x
    torch.testing.assert_close(pi.model.scores(16), rope.model.scores(16), rtol=0, atol=0)
    assert not torch.allclose(pi.model.scores(32), rope.model.scores(32))
    assert ch09.mean_at(pi, 2) is not None and ch09.mean_at(pi, 16) is None
    random_shift, trained_shift = ch09.shift_violation(pi)
    assert random_shift < 1e-4 and trained_shift < 1e-4  # relative at every length, also where PI scales
    rows = ch09.summary_rows(runs, {})
    header, cells = ch09.summary_table(rows)
    assert all(len(row) == len(header) for row in cells)
    assert cells[1][0] == "RoPE + PI" and "not run" in cells[1]
    where = ch09.placement(pi)
    assert where.shape == (2, 3) and torch.allclose(where.sum(1), torch.ones(2, dtype=torch.float64))


def test_the_zoo_figures_and_table_render():
    table = tables.Table(["a", "b"], [["1", "x<y"], ["22", "z"]], caption="c")
    assert "x&lt;y" in table._repr_html_() and str(table).splitlines()[1].startswith("a ")
    with pytest.raises(ValueError, match="row 0"):
        tables.Table(["a"], [["1", "2"]])
    rng = np.random.default_rng(0)
    panels = {name: ch09.encoding_panels(
        {"retrieval": ([1, 2, 4], rng.random((3, 3)), "solid"), "delayed copy": ([1, 2], rng.random((2, 2)), "dash")},
        rng.random((3, 64)), train_len=16, target=60, chance=1 / 16, title=name, color="#1f77b4", visited=32)
        for name in ("A", "B")}
    slider = sliders.slider_figure(panels, "encoding: ")
    assert len(slider.layout.sliders[0].steps) == 2
    fig = ch09.offset_margin_profiles({"rope": -rng.random((3, 64)), RandomizedPositions("rope"): -rng.random((3, 64))},
                                       train_len=16, offset=3, title="t")
    assert len(fig.data) == 4
    fig = ch09.violations_by_encoding({"rope": (1e-7, 1e-5), "ape": (0.1, 10.0), "nope": (0.0, 0.0)}, 1e-4, "t")
    assert min(fig.data[0].x) == 1e-9  # an exact 0 drawn at the floor
    with pytest.raises(ValueError, match="accuracy"):
        ch09.encoding_panels({"r": ([1, 2], rng.random((3, 3)), "solid")}, rng.random((3, 8)), 4, 5, 0.1, "t", "#000000")
