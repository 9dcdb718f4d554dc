"""The live explorer (ipywidgets) and the static slider figure: set values from code, check what is plotted.

The explorer runs tiny ensembles here (2 seeds, 60 steps) so the tests stay
short; what is checked is the wiring (which traces, which lengths, which
title), plus one fact about the trained heads that holds even at that size.
"""
import base64
from dataclasses import replace

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from lengthgen_utils.book import figures, sliders
from lengthgen_utils.run.configs import RetrievalExperiment, RetrievalSweep
from lengthgen_utils.core.models import RetrievalHead
from lengthgen_utils.core.encodings import LearnedAPE
from lengthgen_utils.run.profiles import Profile
from lengthgen_utils.run.runners import run_offset_sweep
from lengthgen_utils.core.tasks import FixedOffsetRetrieval
from lengthgen_utils.run.training import train
from lengthgen_utils.book.widgets import RetrievalExplorer

TINY = dict(profile=Profile("tiny", n_seeds=2, steps=60, batch_size=64, eval_samples=64, length_multiples=(1,)))


def _array(value):
    """A plotly JSON array: a plain list, or plotly's typed-array form ``{"dtype", "bdata"}`` (base64)."""
    if isinstance(value, dict):
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
    return np.asarray(value)


def shown(explorer):
    """The plotly JSON the Output widget currently holds: (trace names, x of the first mean trace, title)."""
    (out,) = explorer.output.outputs
    fig = out["data"]["application/vnd.plotly.v1+json"]
    names = [t.get("name") for t in fig["data"] if t.get("name")]
    first_mean = next(t for t in fig["data"] if t.get("name"))
    return names, list(np.round(np.exp2(_array(first_mean["x"])))), fig["layout"]["title"]["text"]


@pytest.fixture(scope="module")
def explorer():
    return RetrievalExplorer(offset=3, train_len=16, eval_len=64, pe="rope", **TINY)


def test_initial_figure_shows_the_initial_setting(explorer):
    names, xs, title = shown(explorer)
    assert names == ["RoPE (mean of 2)"]
    assert xs == [16, 32, 64]
    assert "offset k = 3" in title and "training length 16" in title
    assert explorer.progress.value == explorer.progress.max == 60


def test_eval_length_slider_reevaluates_without_retraining(explorer):
    before = explorer.figure
    n_trained = len(explorer._models)
    explorer.eval_len.value = 256
    names, xs, _ = shown(explorer)
    assert xs == [16, 32, 64, 128, 256]
    assert explorer.figure is not before and len(explorer._models) == n_trained
    explorer.eval_len.value = 32
    assert shown(explorer)[1] == [16, 32]


def test_offset_change_waits_for_retrain_then_replots(explorer):
    explorer.eval_len.value = 64
    _, _, title_before = shown(explorer)
    explorer.offset.value = 5
    assert shown(explorer)[2] == title_before  # not trained yet: the figure is unchanged ...
    assert "press <b>Retrain</b>" in explorer.status.value  # ... and the panel says why
    explorer.retrain_button.click()
    _, xs, title = shown(explorer)
    assert "offset k = 5" in title and xs == [16, 32, 64]
    assert explorer.progress.value == 60
    explorer.offset.value = 3  # trained before: shown at once, no retrain
    assert "offset k = 3" in shown(explorer)[2]


def test_pe_selector_changes_the_traces(explorer):
    explorer.offset.value = 3
    explorer.pe.value = "all"
    assert "press <b>Retrain</b>" in explorer.status.value  # APE and NoPE are not trained yet
    explorer.retrain_button.click()
    names, _, _ = shown(explorer)
    assert names == ["RoPE (mean of 2)", "APE (learned) (mean of 2)", "NoPE (mean of 2)"]
    assert explorer.progress.max == 3 * 60 and explorer.progress.value == 3 * 60
    # even 60 steps put RoPE above NoPE at the training length (NoPE can only average)
    (out,) = explorer.output.outputs
    data = {t["name"]: _array(t["y"]) for t in out["data"]["application/vnd.plotly.v1+json"]["data"] if t.get("name")}
    assert data["RoPE (mean of 2)"][0] > data["NoPE (mean of 2)"][0] + 0.2


def test_train_length_slider_moves_the_evaluation_grid():
    ex = RetrievalExplorer(offset=2, train_len=8, eval_len=64, pe="rope", **TINY)
    assert shown(ex)[1] == [8, 16, 32, 64]
    ex.train_len.value = 12
    ex.retrain_button.click()
    assert shown(ex)[1] == [12, 24, 48, 64]
    assert "training length 12" in shown(ex)[2]


@pytest.mark.parametrize("kwargs, error", [
    (dict(offset=0), ValueError), (dict(eval_len=100), ValueError), (dict(pe="alibi-typo"), ValueError),
    (dict(train_len=7), ValueError), (dict(n_seeds=0), ValueError), (dict(offset=2.0), TypeError),
])
def test_bad_initial_values_are_refused(kwargs, error):
    with pytest.raises(error):
        RetrievalExplorer(**{**TINY, "train_now": False, **kwargs})


# ------------------------------------------------------------ the static slider figure
def _frame(y, title):  # five identical seeds: fewer would be noted in the title (style.seed_note)
    return figures.accuracy_vs_length({"rope": ([16, 32], np.array([y] * 5)), "ape": ([16, 32], np.array([y] * 5))},
                                    chance=1 / 16, train_len=16, title=title)


def test_slider_figure_steps_switch_traces_and_title():
    fig = sliders.slider_figure({"k = 1": _frame([1.0, 0.9], "one"), "k = 2": _frame([0.5, 0.4], "two")},
                              slider_title="offset k: ", active=1)
    assert len(fig.data) == 8  # 2 frames x 2 encodings x (band, mean)
    assert [t.visible for t in fig.data] == [False] * 4 + [True] * 4
    assert fig.layout.title.text == "two"
    (slider,) = fig.layout.sliders
    assert [s.label for s in slider.steps] == ["k = 1", "k = 2"] and slider.active == 1
    step0 = slider.steps[0]
    assert step0.method == "update" and step0.args[0]["visible"] == [True] * 4 + [False] * 4
    assert step0.args[1] == {"title.text": "one"}
    # the traces a step shows carry that frame's data
    shown_y = [list(t.y) for t, v in zip(fig.data, step0.args[0]["visible"]) if v and t.name]
    assert shown_y == [[1.0, 0.9], [1.0, 0.9]]
    assert len(fig.layout.shapes) == 2  # chance line and training length, from the first frame


def test_slider_figure_accepts_trace_lists_and_frames_of_different_sizes():
    fig = sliders.slider_figure({"a": [go.Scatter(y=[1, 2])], "b": [go.Scatter(y=[3]), go.Scatter(y=[4])]}, "x: ")
    assert [t.visible for t in fig.data] == [True, False, False]


@pytest.mark.parametrize("frames, active, error", [
    ({}, 0, ValueError), ({"a": go.Figure()}, 0, ValueError), ({1: [go.Scatter(y=[1])]}, 0, TypeError),
    ({"a": "fig"}, 0, TypeError), ({"a": [go.Scatter(y=[1])]}, 1, ValueError),
])
def test_slider_figure_rejects_bad_input(frames, active, error):
    with pytest.raises(error):
        sliders.slider_figure(frames, "x: ", active=active)


# ------------------------------------------------------------ the offset sweep behind chapter 1's slider
def test_offset_sweep_is_one_ensemble_with_matching_seeds():
    exp = RetrievalExperiment(pe="rope", n_seeds=2, steps=30, batch_size=32, eval_samples=32, length_multiples=(1, 2))
    r = run_offset_sweep(exp, offsets=(1, 3), cache=False)
    assert r.model.n_models == 4 and r.model.seeds == (0, 1, 0, 1)
    assert r.offsets == [1, 1, 3, 3] and r.where(offset=1).seeds == [0, 1] and r.where(offset=3).seeds == [0, 1]
    assert r.accuracy.shape == (4, 2)
    assert r.loss_history.shape == (30, 4) and r.lengths == [16, 32]
    # same seed, same initialisation: models 0 and 2 differ only through training on different offsets
    fresh = RetrievalHead(n_models=4, seeds=[0, 1, 0, 1], max_len=32)
    assert torch.equal(fresh.u[0], fresh.u[2]) and not torch.equal(r.model.u[0], r.model.u[2])


def test_offset_sweep_carries_every_field_of_the_experiment():
    # the APE init scale, the table size and the shortest training length all reach the trained ensemble
    exp = RetrievalExperiment(pe=LearnedAPE(init_std=0.5), n_seeds=2, steps=3, batch_size=8, eval_samples=8,
                              length_multiples=(1, 2, 4), max_len=40, min_train_len=10)
    sweep = RetrievalSweep.of_experiment(exp, (1, 3))
    assert sweep.experiment(exp.pe, 3) == replace(exp, offset=3) and sweep.table_len == 40
    r = run_offset_sweep(exp, offsets=(1, 3), cache=False)
    assert r.lengths == [16, 32] and r.accuracy.shape == (4, 2)
    table = r.model.pe_params["table"].detach()
    assert table.shape[-2] == 40
    unseen = table[..., 16:, :]  # rows no training sequence reaches keep their initialisation
    assert 0.4 < float(unseen.std()) < 0.6, float(unseen.std())


@pytest.mark.parametrize("offsets, error", [((), ValueError), ((1, 1), ValueError), ((0,), ValueError),
                                            ((15,), ValueError), ((1.0,), TypeError)])
def test_offset_sweep_rejects_bad_offsets(offsets, error):
    with pytest.raises(error, match="offsets"):
        run_offset_sweep(RetrievalExperiment(n_seeds=1, steps=1), offsets=offsets)


def test_offset_sweep_checks_offsets_against_the_shortest_training_length():
    with pytest.raises(ValueError, match=r"offsets\[1\] must be .*8"):
        run_offset_sweep(RetrievalExperiment(n_seeds=1, steps=1, min_train_len=10), offsets=(1, 9))


@pytest.mark.parametrize("cls", [RetrievalExperiment, RetrievalSweep])
def test_table_size_must_hold_an_evaluation_length(cls):
    with pytest.raises(ValueError, match="max_len"):
        cls(max_len=20, length_multiples=(2, 4))
    assert cls(max_len=32, length_multiples=(2, 4)).eval_lengths == [32]


def test_training_callback_sees_every_step():
    seen = []
    model = RetrievalHead(n_models=3, max_len=16)
    history = train(model, FixedOffsetRetrieval(16, 2), steps=5, batch_size=8, callback=lambda s, l: seen.append((s, l.clone())))
    assert [s for s, _ in seen] == [1, 2, 3, 4, 5]
    assert torch.equal(torch.stack([l for _, l in seen]), history)
    with pytest.raises(TypeError):
        train(model, FixedOffsetRetrieval(16, 2), steps=1, callback="print")


def test_accuracy_vs_length_styles_and_bands():
    """Overlapping variants can share a colour, differ in dash, and drop their bands."""
    acc = np.full((5, 2), 0.5)
    curves = {"a plain": ([16, 32], acc), "a scaled": ([16, 32], acc)}
    fig = figures.accuracy_vs_length(curves, chance=0.1, train_len=16, title="t", bands=False,
                                   styles={"a plain": dict(color="#123456"), "a scaled": dict(color="#123456", dash="dash")})
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    assert [t.line.color for t in lines] == ["#123456", "#123456"] and [t.line.dash for t in lines] == ["solid", "dash"]
    assert not any(t.fill == "toself" for t in fig.data)
    with_bands = figures.accuracy_vs_length(curves, chance=0.1, train_len=16, title="t")
    assert sum(t.fill == "toself" for t in with_bands.data) == 2
