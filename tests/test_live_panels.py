"""lengthgen_utils.book.live, the Python side of the live panels: what a cell emits, and the input it refuses.

(The JavaScript that retrains the panels is tested against the package in test_live_trainer.py, and on the
built pages by the browser test.)"""
import html
import json
import re

import numpy as np
import pytest
import torch

from lengthgen_utils.analysis import kernel
from lengthgen_utils.book import live
from lengthgen_utils.run.configs import RetrievalExperiment
from lengthgen_utils.core.models import RetrievalHead
from lengthgen_utils.run.results import Ensemble, Runs

TEXT = {"static": "static", "ready": "ready", "initial": "back", "title": "t {a}"}
CONTROLS = [{"name": "a", "label": "a", "values": [1, 2, 3]}, {"name": "b", "label": "b", "values": [4, 8, 16]}]


def _figure():
    return {"data": [{"type": "scatter", "x": [1, 2], "y": [3, 4]}], "layout": {"title": {"text": "t 1"}}}


def _config(panel: live.LivePanel) -> dict:
    found = re.search(r'<script type="application/json" class="lg-live-config">(.*?)</script>', panel.html, re.S)
    return json.loads(found.group(1))


def test_a_panel_holds_its_figure_its_config_and_a_status_line_that_reads_without_javascript():
    panel = live.live_panel("accuracy", _figure(), CONTROLS, {"a": 2, "b": 8}, {"steps": 5}, TEXT, panel_id="p1")
    assert panel.html.startswith('<div class="lg-live" id="p1" data-kind="accuracy">')
    assert 'class="plotly-graph-div"' in panel.html and "Plotly.newPlot" in panel.html  # the static figure
    assert '<p class="lg-live-status" role="status" aria-live="polite">static</p>' in panel.html
    assert "<noscript>" in panel.html and "need JavaScript" in panel.html
    assert "<input" not in panel.html  # the sliders are made by the script: nothing dead without it
    config = _config(panel)
    assert config == json.loads(json.dumps(panel.config))
    assert config["initial"] == {"a": 2, "b": 8} and config["fixed"] == {"steps": 5}
    assert config["fit"]["title_chars"] == 42 and config["layout"]["title"]["text"] == "t 1"
    bundle = panel._repr_mimebundle_()
    assert set(bundle) == {"text/html", "application/vnd.plotly.v1+json", "text/plain"}
    assert bundle["application/vnd.plotly.v1+json"]["data"][0]["y"] == [3, 4]  # a Jupyter kernel shows the figure


def test_the_config_cannot_close_its_script_element():
    text = {**TEXT, "ready": "</script><script>alert(1)</script> <!--"}
    panel = live.live_panel("kernel", _figure(), CONTROLS, {"a": 1, "b": 4}, {}, text)
    body = panel.html.split('class="lg-live-config">', 1)[1]
    assert body.index("</script>") > body.index("alert")  # the first </script> is the element's own end
    assert _config(panel)["text"]["ready"] == text["ready"]


@pytest.mark.parametrize("change, message", [
    (dict(kind="movie"), "kind must be one of"),
    (dict(initial={"a": 5, "b": 4}), r"initial\['a'\] = 5 is not one of"),
    (dict(initial={"a": 1}), "initial has no value for the control 'b'"),
    (dict(controls=[{"name": "a", "label": "a", "values": []}]), "non-empty list of finite numbers"),
    (dict(controls=[{"name": "a", "label": "a", "values": [1, float("nan")]}]), "non-empty list of finite numbers"),
    (dict(controls=[{"name": "a", "values": [1]}]), "must be a dict with 'name', 'label' and 'values'"),
    (dict(controls=CONTROLS + CONTROLS[:1]), "control names must be distinct"),
    (dict(text={"static": "s"}), r"text\['ready'\] must be a non-empty string"),
    (dict(rules=[{"kind": "offset_fits", "offset": "a", "train_len": "c"}]), "a rule must be"),
    (dict(initial={"a": 3, "b": 4}, rules=[{"kind": "offset_fits", "offset": "a", "train_len": "b"}]),
     "the initial setting makes no task"),
])
def test_live_panel_refuses_a_panel_that_could_not_work(change, message):
    args = dict(kind="accuracy", initial_figure=_figure(), controls=CONTROLS, initial={"a": 1, "b": 4}, fixed={},
                text=TEXT, rules=())
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=message):
        live.live_panel(**args)


def _result(pe, accuracy, **fields):
    exp = RetrievalExperiment(pe=pe, n_seeds=accuracy.shape[0], steps=7, offset=3, **fields)
    members = [{"pe": exp.pe, "attention": "softmax", "offset": 3, "seed": s, "task": exp.task}
               for s in range(exp.n_seeds)]
    return Runs(exp, members, exp.eval_lengths, accuracy, [Ensemble(None, list(range(exp.n_seeds)))],
                torch.zeros(7, accuracy.shape[0]))


def test_accuracy_panel_shows_the_first_seeds_and_gives_the_page_the_runs_recipe():
    acc = torch.rand(5, 5, dtype=torch.float64)
    panel = live.accuracy_panel({"rope": _result("rope", acc), "ape": _result("ape", acc / 10)}, n_seeds=3)
    config = panel.config
    assert [c["name"] for c in config["controls"]] == ["offset", "train_len", "n_seeds"]
    assert config["controls"][0]["values"] == list(range(1, 16)) and config["controls"][1]["values"] == list(range(8, 65))
    assert config["initial"] == {"offset": 3, "train_len": 16, "n_seeds": 3}
    assert config["rules"] == [{"kind": "offset_fits", "offset": "offset", "train_len": "train_len"}]
    fixed = config["fixed"]
    assert (fixed["steps"], fixed["batch_size"], fixed["lr"], fixed["multiples"]) == (7, 256, 0.01, [1, 2, 4, 8, 16])
    assert fixed["labels"] == {"rope": "RoPE", "ape": "APE (learned)"} and fixed["chance_text"] == "chance = 0.062"
    means = [t for t in panel.figure["data"] if t.get("name")]
    assert [t["name"] for t in means] == ["RoPE (mean of 3)", "APE (learned) (mean of 3)"]
    assert "k = 3" in panel.figure["layout"]["title"]["text"] and "7 steps of 256" in config["text"]["static"]


def test_accuracy_panel_takes_the_1x_to_16x_columns_of_a_longer_evaluation():
    acc = 0.3 + torch.arange(7, dtype=torch.float64).repeat(5, 1) / 10
    multiples = dict(length_multiples=(1, 2, 4, 8, 16, 32, 64))
    panel = live.accuracy_panel({"rope": _result("rope", acc, **multiples), "ape": _result("ape", acc, **multiples)})
    assert panel.figure["layout"]["xaxis"]["ticktext"] == ["16<br>1x", "32<br>2x", "64<br>4x", "128<br>8x", "256<br>16x"]


@pytest.mark.parametrize("results, message", [
    (lambda a: {"rope": _result("rope", a)}, "must be {'rope'"),
    (lambda a: {"rope": _result("nope", a), "ape": _result("ape", a)}, "a RoPE .* and a learned APE run"),
    (lambda a: {"rope": _result("rope", a), "ape": _result("ape", a, fixed_length=True)},
     "lengths uniform in"),
    (lambda a: {"rope": _result("rope", a), "ape": _result("ape", a, lr=0.1)}, "share their recipe"),
    (lambda a: {"rope": _result("rope", a[:2]), "ape": _result("ape", a[:2])}, "only 2 seeds"),
])
def test_accuracy_panel_refuses_runs_the_page_could_not_retrain_alike(results, message):
    with pytest.raises(ValueError, match=message):
        live.accuracy_panel(results(torch.rand(5, 5, dtype=torch.float64)), n_seeds=3)


def test_kernel_panel_draws_each_heads_kernel_aliases_and_first_failure_from_the_package():
    model = RetrievalHead(n_models=6, seeds=range(6))  # untrained: the panel reads whatever the weights say
    offsets, lengths = [1, 1, 1, 3, 3, 3], [16, 32, 64, 128]
    accuracy = torch.tensor([[1.0, 1, 1, 1]] * 3 + [[1.0, 0.9, 0.1, 0.1], [1.0, 1, 1, 1], [1.0, 1, 1, 0.5]])
    exp = RetrievalExperiment(pe="rope", n_seeds=3, steps=11, length_multiples=(1, 2, 4, 8))
    panel = live.kernel_panel(model, offsets, lengths, accuracy, exp, offset=3, n_seeds=3)
    heads = model.subset([3, 4, 5])
    predicted, dominant = kernel.predicted_alias_distance(heads, 3, 16, 127)
    lines = [t for t in panel.figure["data"] if t["mode"] == "lines"]
    assert len(lines) == 3
    for i, line in enumerate(lines):
        fail = {0: "fails at L = 32", 1: "holds to 128", 2: "fails at L = 128"}[i]
        alias = "no alias" if predicted[i] is None else f"alias {predicted[i]}"
        assert line["name"] == f"seed {i}: {alias}, {fail}"
    report = live.kernel_report(heads, 3, 16, 127)
    assert report["relative"].shape == (3, 128) and report["aliases"] == predicted  # row layout: D = -127 .. 0
    row = kernel.offset_kernel(heads, 128)
    np.testing.assert_allclose(report["relative"][:, -1 - 10], (row[:, -1 - 10] - row[:, -1 - 3]).numpy())  # d = 10
    assert (report["relative"][:, -1 - 3] == 0).all()  # the target, against itself
    assert report["pairs"] == sorted(set(dominant.flatten().tolist()))
    config = panel.config
    assert config["initial"] == {"base": 10000.0, "d_head": 16} and config["fixed"]["min_train_len"] == 5
    assert config["fixed"]["max_distance"] == 127 and config["fixed"]["steps"] == 11
    assert [c["name"] for c in config["controls"]] == ["base", "d_head"]
    assert config["controls"][0]["values"][0] == 10 and config["controls"][0]["values"][-1] == 1e5
    assert "base 10⁴" in html.unescape(panel.figure["layout"]["title"]["text"])


def test_kernel_panel_refuses_what_it_cannot_draw():
    exp = RetrievalExperiment(pe="rope", n_seeds=2, length_multiples=(1, 2))
    acc = torch.ones(2, 2)
    with pytest.raises(ValueError, match="must be a RoPE head"):
        live.kernel_panel(RetrievalHead(pe="ape", n_models=2), [3, 3], [16, 32], acc, exp, n_seeds=2)
    with pytest.raises(ValueError, match="one entry per head"):
        live.kernel_panel(RetrievalHead(n_models=2), [3], [16, 32], acc, exp, n_seeds=2)
    with pytest.raises(ValueError, match="only 2 heads have offset 3"):
        live.kernel_panel(RetrievalHead(n_models=2), [3, 3], [16, 32], acc, exp, n_seeds=3)
    with pytest.raises(ValueError, match="base 500 and d_head 16 must be slider values"):
        live.kernel_panel(RetrievalHead(pe=live.RoPE(base=500.0), n_models=2), [3, 3], [16, 32], acc, exp, n_seeds=2)
    with pytest.raises(ValueError, match="accuracy must be"):
        live.kernel_panel(RetrievalHead(n_models=2), [3, 3], [16, 32], torch.ones(2, 3), exp, n_seeds=2)


@pytest.mark.parametrize("base, text", [(10.0, "10"), (10 ** 1.25, "17.8"), (10 ** 2.5, "316"), (1e4, "10⁴"),
                                        (10 ** 4.25, "1.8×10⁴"), (1e5, "10⁵")])
def test_the_base_is_written_as_the_page_writes_it(base, text):
    assert live._base_text(base) == text
