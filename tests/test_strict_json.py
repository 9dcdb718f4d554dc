"""Strict JSON: every figure the book renders.
"""
import json
import warnings

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from jupyter_client.session import json_packer

from lengthgen_utils.book import ch05, render, sliders, widgets
from lengthgen_utils.tools import cli as cli


# ================================================================ 11. strict JSON
def _figures_with_nan():
    """Figures the book renders, holding NaN: a raw trace, a package heatmap of accuracies with unmeasured
    cells, and a slider figure over NaN panels."""
    raw = go.Figure(go.Scatter(x=[1, 2, 3], y=np.array([0.5, np.nan, 1.0])), layout=dict(title="raw"))
    acc = np.array([[1.0, np.nan, 0.5], [np.nan, 0.75, 0.25]])
    heatmap = ch05.accuracy_heatmap(acc, [16, 32, 64], ["a", "b"], 0.25, "heatmap")
    slider = sliders.slider_figure({"one": raw, "two": go.Figure(go.Scatter(x=[1, 2], y=[np.nan, 2.0]))}, "panel")
    return {"raw": raw, "heatmap": heatmap, "slider": slider}


def test_strict_json_of_every_figure_the_book_renders():
    """The reported example: figures holding NaN were written by the book's renderer as non-standard JSON (NaN
    in the plotly JSON, and a warning printed in the cell), where plotly's own renderer writes ``null``. Every
    output the book renders (the ``lengthgen`` renderer's bundle, the interactive panel's output) is strict JSON,
    and rendering prints no warning."""
    render.setup()
    renderer = pio.renderers["lengthgen"]
    for name, fig in _figures_with_nan().items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            bundle = renderer.to_mimebundle(fig.to_dict())
            output = widgets._figure_output(fig)
        for what, data in (("bundle", bundle), ("panel", output)):
            text = json.dumps(data, allow_nan=False)  # raises on NaN or inf
            assert "NaN" not in text, (name, what)
            with warnings.catch_warnings():  # what the kernel does to send it: it warned in the cell
                warnings.simplefilter("error")
                json_packer({"data": data})
        plotly_json = bundle["application/vnd.plotly.v1+json"]
        reference = json.loads(pio.to_json(render.fit_to_column(fig), validate=False))
        assert plotly_json["data"] == reference["data"], name  # the same as plotly's own null-for-NaN JSON
        assert "NaN" not in bundle["text/html"]


