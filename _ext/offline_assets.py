"""Sphinx extension: serve plotly.js and MathJax from the book itself, so pages work with no network.

* Chapters display figures as HTML snippets that call ``Plotly.newPlot`` but
  do not embed plotly.js (``lengthgen_utils.book.plots.BookRenderer``). The
  ``plotly.min.js`` bundled in the installed ``plotly`` package is copied to
  ``_static/`` once and loaded on every page before the page's own scripts.
* Math is typeset by MathJax 3 from the copy that the ``django-static-mathjax``
  package installs (a plain packaging of MathJax's ``es5`` build; Django is
  not needed), copied to ``_static/mathjax/`` instead of Sphinx's default CDN.

Both come from packages pinned in ``requirements.txt``; nothing is committed by hand.
"""
import shutil
from pathlib import Path

import plotly

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def _mathjax_dir() -> Path:
    import mathjax  # provided by django-static-mathjax

    return Path(next(iter(mathjax.__path__))) / "static" / "mathjax" / "es5"


def _config_inited(app, config):
    config.mathjax_path = "mathjax/tex-mml-chtml.js"  # relative paths resolve inside _static/


def _copy_assets(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    static = Path(app.outdir) / "_static"
    static.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PLOTLY_JS, static / "plotly.min.js")
    shutil.copytree(_mathjax_dir(), static / "mathjax", dirs_exist_ok=True)


def setup(app):
    if not PLOTLY_JS.is_file():
        raise RuntimeError(f"plotly.min.js not found at {PLOTLY_JS}; is the plotly package installed?")
    if not (_mathjax_dir() / "tex-mml-chtml.js").is_file():
        raise RuntimeError(f"MathJax not found under {_mathjax_dir()}; pip install django-static-mathjax")
    app.add_js_file("plotly.min.js", priority=200)
    app.connect("config-inited", _config_inited)
    app.connect("build-finished", _copy_assets)
    return {"version": plotly.__version__, "parallel_read_safe": True, "parallel_write_safe": True}
