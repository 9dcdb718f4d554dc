"""The figure template: every figure is laid out for the page column (render.fit_to_column)."""
import numpy as np
import plotly.graph_objects as go
import pytest

from lengthgen_utils.book import ch03, ch04, ch05, ch09, figures, render, sliders, style


def test_titles_wrap_to_a_phone_column_and_the_top_margin_holds_them():
    title = "Fixed-offset retrieval (k = 3): accuracy vs length, 5 seeds (line = mean, band = min..max)"
    fig = figures.accuracy_vs_length({"rope": ([16, 32], np.full((5, 2), 0.9))}, 1 / 16, 16, title)
    out = render.fit_to_column(fig)
    lines = out["layout"]["title"]["text"].split("<br>")
    assert len(lines) == 3 and all(len(line) <= render.TITLE_CHARS for line in lines)
    assert out["layout"]["margin"]["t"] == render.TOOLBAR_PX + 2 * render.TITLE_LINE_PX + 16
    assert fig.layout.title.text == title  # the figure itself is not changed
    assert out["layout"]["xaxis"]["automargin"] is True


def test_axis_titles_wrap_and_slider_titles_too():
    frames = {f"k = {k}": figures.accuracy_vs_length({"rope": ([16, 32], np.full((5, 2), 0.9))}, 1 / 16, 16,
                                                     f"Offset k = {k}: a long title that has to wrap on a phone")
              for k in (1, 2)}
    out = render.fit_to_column(sliders.slider_figure(frames, "offset "))
    (slider,) = out["layout"]["sliders"]
    assert slider["y"] == 1.0 and slider["yanchor"] == "bottom"  # between the title and the plot
    for step in slider["steps"]:
        assert all(len(line) <= render.TITLE_CHARS for line in step["args"][1]["title.text"].split("<br>"))
    assert out["layout"]["margin"]["t"] >= render.TOOLBAR_PX + render.TITLE_LINE_PX + render.SLIDER_PX
    y_title = render.fit_to_column(go.Figure(layout=dict(yaxis_title="a" * 20 + " " + "b" * 20)))
    assert y_title["layout"]["yaxis"]["title"]["text"] == "a" * 20 + "<br>" + "b" * 20


def test_wrap_text_keeps_existing_breaks_and_long_words():
    assert render.wrap_text("one two<br>three four", 7) == "one two<br>three<br>four"
    assert render.wrap_text("x" * 50, 10) == "x" * 50
    assert render.wrap_text(None, 10) is None


def test_a_long_legend_makes_the_figure_taller_not_the_plot_smaller():
    curves = {f"curve {i}": ([16, 32], np.full((5, 2), 0.5)) for i in range(5)}
    fig = figures.accuracy_vs_length(curves, 1 / 16, 16, "t")
    out = render.fit_to_column(fig)
    # seven legend entries (five curves, the chance line, the training length); title "t": one line
    assert out["layout"]["height"] == render.FIGURE_HEIGHT + 6 * render.LEGEND_LINE_PX


def _panel(k, t):
    return figures.accuracy_vs_length({"rope": ([t, 2 * t], np.full((5, 2), k / 10))}, 1 / 16, t, f"k = {k}, L_train {t}")


def test_grid_slider_figure_stores_every_panel_and_shows_the_active_one():
    panels = {(str(k), str(t)): _panel(k, t) for k in (1, 3) for t in (8, 16, 32)}
    fig = sliders.grid_slider_figure(panels, ("offset k = ", "training length = "), active=(1, 2))
    grid = fig.layout.meta["grid"]
    assert grid["shape"] == [2, 3] and len(grid["visible"]) == 6 and len(grid["relayout"]) == 6
    shown = [t for t in fig.data if t.visible is True and t.name]
    assert [list(t.y) for t in shown] == [[0.3, 0.3]]  # k = 3, L_train = 32
    assert fig.layout.title.text == "k = 3, L_train 32"
    assert grid["relayout"][0]["title.text"] == "k = 1, L_train 8"
    assert [len(s.steps) for s in fig.layout.sliders] == [2, 3] and fig.layout.sliders[1].active == 2
    bundle = render.bundle(fig.to_plotly_json())
    assert "plotly_sliderchange" in bundle["text/html"]  # the page script that combines the two sliders
    # it reads the sliders' positions from the user layout: after a resize plotly may move a stale
    # full-layout copy (the browser test moves each slider after a resize)
    assert "gd.layout.sliders[0].active" in bundle["text/html"] and "_fullLayout.sliders" not in bundle["text/html"]
    assert "plotly_sliderchange" not in render.bundle(_panel(1, 8).to_plotly_json())["text/html"]


def test_grid_slider_figure_refuses_a_hole_in_the_grid():
    import pytest

    with pytest.raises(ValueError, match="missing"):
        sliders.grid_slider_figure({("1", "8"): _panel(1, 8), ("3", "16"): _panel(3, 16)}, ("a", "b"))
    with pytest.raises(TypeError, match="pairs"):
        sliders.grid_slider_figure({"1": _panel(1, 8)}, ("a", "b"))


def test_loss_curves_smooth_is_the_running_mean_and_medians_are_on_top():
    rng = np.random.default_rng(0)
    hist = {"rope": np.exp(rng.normal(size=(50, 3))), "ape": np.exp(rng.normal(size=(50, 2)))}
    fig = figures.loss_curves(hist, "loss", smooth=7)
    want = [hist["rope"][max(0, t - 6): t + 1, 1].mean() for t in range(50)]
    np.testing.assert_allclose(fig.data[1].y, want, rtol=1e-12)
    # thin lines first (3 + 2), then the two medians, so no model's line hides a median
    assert [t.showlegend for t in fig.data[:5]] == [False] * 5
    assert [t.name.split(" (median")[0] for t in fig.data[5:]] == ["RoPE", "APE (learned)"]
    np.testing.assert_allclose(figures.loss_curves(hist, "loss").data[0].y, hist["rope"][:, 0])


@pytest.mark.parametrize("smooth", [0, -3, 2.5, True])
def test_loss_curves_refuses_a_bad_window(smooth):
    with pytest.raises(ValueError, match="smooth"):
        figures.loss_curves({"rope": np.ones((5, 2))}, "loss", smooth=smooth)


def test_loss_curves_smoothing_averages_an_underflowed_zero_loss():
    hist = np.array([[1.0], [0.0], [0.0], [2.0]])
    y = figures.loss_curves({"ape": hist}, "loss", smooth=2).data[0].y
    np.testing.assert_allclose(y, [1.0, 0.5, 0.0, 1.0])


# ---------------------------------------------------------------- labels off the data, one colour per model
def _hue_sat_val(hex_color):
    import colorsys

    r, g, b = (int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    h, s, v = colorsys.rgb_to_hsv(r, g, b)
    return 360 * h, s, v


def _is_red(hex_color):
    h, s, v = _hue_sat_val(hex_color)
    return (h <= 15 or h >= 345) and s >= 0.6 and v >= 0.35


def test_reference_lines_are_named_in_the_legend_not_written_on_the_plot():
    """The chance line and the training length of every accuracy figure are legend entries; the figure writes no
    text inside its plot area (the browser test checks the drawn figures of the book)."""
    fig = figures.accuracy_vs_length({"rope": ([16, 32], np.full((5, 2), 0.9))}, 1 / 16, 16, "t")
    assert not fig.layout.annotations
    assert sorted((s.name, s.showlegend) for s in fig.layout.shapes) == [("chance = 0.062", True),
                                                                          ("training length", True)]
    for fig in (figures.accuracy_by_position({"rope": np.full((5, 40), 0.9)}, 1 / 16, 16, "t"),
                ch04.kernel_panel(np.arange(-20, 1), np.zeros((3, 21)), 3, 16, "t"),
                ch03.attention_row_panel(np.full((3, 32), 1 / 32), 16, 3, "t"),
                figures.bar_by_setting({"a": [0.1, 0.2], "b": [0.3]}, "t", "y", chance=1 / 16),
                ch05.r2_vs_margin([0.5, 1.0], [0.2, 0.95], ["cliff", "holds"], ["a", "b"], "t"),
                ch09.violations_by_encoding({"rope": (1e-9, 1e-9), "ape": (0.1, 1.0)}, 1e-4, "t")):
        assert not fig.layout.annotations
        assert fig.layout.shapes and all(s.showlegend and s.name for s in fig.layout.shapes if s.type == "line"
                                         and s.line.dash in ("dot", "dash"))


def test_fit_to_column_counts_legend_entries_of_shapes():
    fig = go.Figure(go.Scatter(x=[0, 1], y=[0, 1], name="a"))
    base = render.fit_to_column(fig)["layout"]["height"]
    fig.add_hline(y=0.5, name="chance", showlegend=True)
    fig.add_hline(y=0.7)  # not in the legend
    assert render.fit_to_column(fig)["layout"]["height"] == base + render.LEGEND_LINE_PX


def test_a_slider_of_many_steps_labels_each_step_by_its_value():
    """Chapter 9's zoo slider has twelve steps: every step is labelled by its encoding (never "7 of 12"), each
    panel names its step above the plot, and a rail too short for twelve names hides them; a rail of short
    numbers that fits shows them."""
    frames = {f"encoding {i}": figures.accuracy_vs_length({"rope": ([16, 32], np.full((5, 2), 0.9))}, 1 / 16, 16,
                                                        f"panel {i}") for i in range(12)}
    fig = sliders.slider_figure(frames, "encoding: ", active=6)
    (slider,) = fig.layout.sliders
    assert [s.label for s in slider.steps] == [f"encoding {i}" for i in range(12)]
    assert slider.currentvalue.visible is False
    names = [a.text for a in fig.layout.annotations if a.name == "slider value"]
    assert names == ["encoding: encoding 6"]
    step = slider.steps[0].args[1]
    assert [a["text"] for a in step["annotations"] if a.get("name") == "slider value"] == ["encoding: encoding 0"]
    out = render.fit_to_column(fig)
    assert out["layout"]["sliders"][0]["font"]["color"] == "rgba(0,0,0,0)"  # twelve names do not fit the rail
    lengths = {str(L): frames["encoding 0"] for L in range(16, 80, 8)}
    short = render.fit_to_column(sliders.slider_figure(lengths, "L = "))
    assert [s["label"] for s in short["layout"]["sliders"][0]["steps"]] == [str(L) for L in range(16, 80, 8)]
    assert "color" not in short["layout"]["sliders"][0].get("font", {})  # eight short values fit: shown
    few = sliders.slider_figure(dict(list(frames.items())[:3]), "encoding: ")
    assert [s.label for s in few.layout.sliders[0].steps] == ["encoding 0", "encoding 1", "encoding 2"]


def test_red_means_ape_alone():
    """One colour per encoding and model across the book, and red is learned APE's only."""
    from lengthgen_utils.run import zoo
    from lengthgen_utils.core.encodings import ENCODINGS, RotaryFrequencies, get_encoding

    encodings = {pe.label: pe.color for pe in [get_encoding(n) for n in ENCODINGS] + list(zoo.zoo_encodings(16))
                 + [RotaryFrequencies()]}
    reds = [label for label, color in encodings.items() if _is_red(color)]
    assert reds == ["APE (learned)"], reds
    assert len(set(encodings.values())) == len(encodings), encodings  # no two encodings share a colour
    models = style.MODEL_COLORS
    assert not any(_is_red(c) for c in models.values()) and not any(_is_red(c) for c in style.PALETTE)
    same_model = {("RoPE head, softmax", "RoPE head (softmax)"), ("rotary head, linear", "rotary linear head")}
    owner = {}
    for name, color in models.items():
        if color in owner:
            assert (owner[color], name) in same_model, f"{owner[color]!r} and {name!r} share {color}"
        owner.setdefault(color, name)
    softmax_heads = {models["RoPE head, softmax"], models["rotary head, softmax"]}
    assert not (set(models.values()) - softmax_heads) & set(encodings.values()), "a model took an encoding's colour"
    import inspect
    import re

    import importlib

    for name in ("ch02", "ch03", "ch04", "ch05", "ch06", "ch07", "ch08", "ch09", "figures", "render", "sliders", "style"):
        module = importlib.import_module(f"lengthgen_utils.book.{name}")
        literals = re.findall(r"#[0-9a-fA-F]{6}\b", inspect.getsource(module))
        assert not [c for c in literals if _is_red(c)], f"a red literal in {module.__name__}: red is LearnedAPE.color's"


def test_a_numbered_slider_stays_clear_of_subplot_titles():
    """Chapter 9's zoo panels have subplot titles on the top panels: the slider, its numbers and its current label
    move up by a subplot title's height, so the numbers do not sit on the titles."""
    frames = {f"enc {i}": ch09.encoding_panels({"retrieval": ([1, 2], np.full((3, 2), 0.5), "solid")},
                                                np.full((3, 8), 1 / 8), train_len=4, target=5, chance=1 / 16,
                                                title=f"enc {i}", color="#1f77b4") for i in range(8)}
    out = render.fit_to_column(sliders.slider_figure(frames, "encoding: "))
    (slider,) = out["layout"]["sliders"]
    assert slider["pad"]["b"] == 18 + render.SUBPLOT_TITLE_PX
    shifts = [a["yshift"] for a in out["layout"]["annotations"] if a.get("name") == "slider value"]
    shifts += [a["yshift"] for st in slider["steps"] for a in st["args"][1].get("annotations", [])
               if a.get("name") == "slider value"]
    assert shifts and set(shifts) == {render.SLIDER_VALUE_SHIFT + render.SUBPLOT_TITLE_PX}
