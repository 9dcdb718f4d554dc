"""Figures of the reader pass on chapters 4-6: what each shows, and the bad input each refuses."""
import numpy as np
import pytest
import torch

from lengthgen_utils.book import ch04, ch05, ch06, figures


def test_accuracy_heatmap_marks_the_given_length_of_each_row_and_labels_every_other_octave():
    lengths = [16, 19, 23, 27, 32, 38, 45, 54, 64]
    fig = ch05.accuracy_heatmap(torch.rand(3, 9), lengths, ["a", "b", "c"], chance=1 / 16, title="t",
                                 marks=[32, None, 64], mark_name="predicted alias")
    marks = fig.data[1]
    assert list(marks.x) == ["32", "64"] and list(marks.y) == ["a", "c"] and marks.name == "predicted alias"
    assert list(fig.layout.xaxis.tickvals) == ["16", "64"]  # 16 x 4^j: labels a phone's column can hold
    with pytest.raises(ValueError, match=r"marks\[0\] must be one of lengths"):
        ch05.accuracy_heatmap(torch.rand(3, 9), lengths, ["a", "b", "c"], 1 / 16, "t", marks=[33, None, None])
    with pytest.raises(ValueError, match="marks must be .* one per model"):
        ch05.accuracy_heatmap(torch.rand(3, 9), lengths, ["a", "b", "c"], 1 / 16, "t", marks=[32, None])


def test_r2_vs_reach_puts_heads_on_a_log_axis_and_shades_both_sides_of_the_boundary():
    fig = ch05.r2_vs_reach([1e-3, 5.0, 40.0], [-1e9, 0.2, 0.99], ["cliff", "cliff", "gradual"], ["a", "b", "c"],
                            title="t", symbol_by=["book", "wd", "wd"])
    assert fig.layout.xaxis.type == "log"
    assert sorted(x for trace in fig.data for x in trace.x) == [1e-3, 5.0, 40.0]
    # y is 1 - R² on a log axis: the head the law misses by far (R² = -1e9) sits high, not at a clipped value
    assert fig.layout.yaxis.type == "log"
    assert sorted(y for trace in fig.data for y in trace.y) == [pytest.approx(0.01), pytest.approx(0.8),
                                                               pytest.approx(1e9 + 1)]
    assert [t.name for t in fig.data if t.showlegend is not False] == ["cliff (2)", "gradual (1)"]  # one per kind
    assert [s.y0 for s in fig.layout.shapes if s.type == "line"] == [pytest.approx(0.1)]  # R² = 0.9
    assert [s.x1 for s in fig.layout.shapes if s.type == "rect"][0] == 1.0
    assert [s.x0 for s in fig.layout.shapes if s.type == "rect"][1] == 20.0
    with pytest.raises(ValueError, match="reach must be positive"):
        ch05.r2_vs_reach([0.0, 1.0], [0.5, 0.5], ["a", "a"], ["a", "b"], title="t")
    with pytest.raises(ValueError, match="alias_side and law_side"):
        ch05.r2_vs_reach([1.0], [0.5], ["a"], ["a"], title="t", alias_side=30.0)
    with pytest.raises(ValueError, match="one entry per head"):
        ch05.r2_vs_reach([1.0, 2.0], [0.5], ["a"], ["a"], title="t")


def test_distractor_ratio_by_head_draws_one_line_per_head_and_setting_as_1_over_p_minus_1():
    p_plain = np.array([[0.5, 0.25], [0.9, 0.8]])
    p_scaled = np.array([[0.5, 0.4], [0.9, 0.95]])
    fig = ch05.distractor_ratio_by_head([16, 32], p_plain, p_scaled, title="t", train_len=16)
    assert len(fig.data) == 4 and sum(t.showlegend for t in fig.data) == 2
    np.testing.assert_allclose(fig.data[0].y, [1.0, 3.0])
    np.testing.assert_allclose(fig.data[3].y, [1 / 0.9 - 1, 1 / 0.95 - 1])
    assert fig.data[2].line.dash == "dash" and fig.layout.yaxis.type == "log"
    with pytest.raises(ValueError, match="both be"):
        ch05.distractor_ratio_by_head([16, 32], p_plain, p_scaled[:1], title="t")
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        ch05.distractor_ratio_by_head([16, 32], p_plain * 0, p_scaled, title="t")


def test_offset_kernels_dashes_the_named_curves_only():
    d = np.arange(-5, 1)
    curves = {"trained": (d, np.ones(6)), "closed form": (d, np.zeros(6)), "other": (d, np.ones(6))}
    fig = figures.offset_kernels(curves, train_len=4, target_offset=1, title="t", dashed={"closed form"})
    assert [t.line.dash for t in fig.data] == ["solid", "dash", "solid"]
    default = figures.offset_kernels(curves, train_len=4, target_offset=1, title="t")
    assert [t.line.dash for t in default.data] == ["solid", "dash", "solid"]  # every second, as before
    with pytest.raises(ValueError, match="dashed must name curves"):
        figures.offset_kernels(curves, train_len=4, target_offset=1, title="t", dashed={"missing"})


def test_markers_on_log_axes_put_the_line_in_data_units_and_the_label_in_the_legend():
    """Plotly places shapes on a log axis in data units: a training-length line at 16 must be a shape at 16.
    Its label is the shape's legend entry (text drawn on the plot would sit on data), and so are the two
    sides of chapter 5's boundary figure."""
    fig = ch06.predicted_vs_measured({"a": ([32, 64], [1.0, 2.0], [[1.0, 2.0]])}, train_len=16, title="t")
    assert [(s.x0, s.name, s.showlegend) for s in fig.layout.shapes] == [(16.0, "training length", True)]
    assert not fig.layout.annotations
    fig = ch05.r2_vs_reach([1e-3, 40.0], [0.0, 0.99], ["a", "b"], ["a", "b"], title="t")
    lo, hi = fig.layout.xaxis.range
    sides = [s for s in fig.layout.shapes if s.type == "rect"]
    assert [s.x0 for s in sides] == [pytest.approx(10 ** lo), 20.0] and [s.x1 for s in sides] == [1.0, pytest.approx(10 ** hi)]
    assert all(s.showlegend for s in sides) and "aliases" in sides[0].name and "law" in sides[1].name
    assert not fig.layout.annotations  # the R² threshold too is a legend entry
    fig = ch05.distractor_ratio_by_head([16, 32], [[0.5, 0.4]], [[0.5, 0.45]], title="t", train_len=16)
    assert [s.x0 for s in fig.layout.shapes] == [16.0]


def test_censored_scatter_keeps_its_corner_and_its_censored_labels_readable():
    """The two axes' first labels would meet in the corner (both 8): the y axis starts at 32. Over more than
    ten octaves the x axis labels every 16x, and the censored column keeps room for its label."""
    fig = ch04.censored_scatter([100, None], [128, None], ["a", "b"], x_limit=16385, y_limit=4096,
                                 x_title="x", y_title="y", title="t", x_none="none")
    assert fig.layout.yaxis.tickvals[0] == 32 and fig.layout.xaxis.tickvals[0] == 8
    assert list(fig.layout.xaxis.tickvals[:-1]) == [8, 128, 2048] and fig.layout.xaxis.ticktext[-1] == "none"
    assert fig.layout.xaxis.range[1] >= np.log10(fig.layout.xaxis.tickvals[-1]) + 0.3
