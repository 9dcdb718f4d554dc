"""The book's ``_ext/execute_ahead.py``: lanes of notebooks executed side by side before the pages are read.

Tiny notebooks stand in for chapters. What the book build needs of the extension: a lane keeps its
order and lanes run at the same time; every executed notebook is stored where jupyter-cache's lookup
finds it, and in a Sphinx build with myst-nb each page is executed once and rendered with its
outputs; a failing notebook (a cell's error, a dead kernel, a timeout) fails the build with its
traceback. The book's own lanes are checked against its table of contents.
"""
import io
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
import yaml
from jupyter_cache import get_cache
from sphinx.errors import ConfigError, ExtensionError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "_ext"))
import execute_ahead


def _notebook(folder: Path, name: str, *sources: str) -> str:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / f"{name}.ipynb"
    nbformat.write(notebook, path)
    return str(path)


def _meet(me: str, other: str) -> str:
    """A cell that marks ``me`` started, then waits (up to 60 s) until ``other`` has started too: it
    finishes only if the two notebooks run at the same time."""
    return (f"import pathlib, time\nhere = pathlib.Path('.')\n(here / {me!r}).touch()\n"
            f"deadline = time.time() + 60\nwhile not (here / {other!r}).exists():\n"
            f"    assert time.time() < deadline, 'the other lane never started'\n    time.sleep(0.05)\n"
            f"print('met')")


def test_lanes_run_side_by_side_in_order_and_every_notebook_is_stored(tmp_path):
    first = _notebook(tmp_path, "a", _meet("a_started", "c_started"), "open('made_by_a.txt', 'w').write('a')")
    second = _notebook(tmp_path, "b", "print(open('made_by_a.txt').read())")  # in its own folder, after a
    other = _notebook(tmp_path, "c", _meet("c_started", "a_started"))
    cache_path = str(tmp_path / "cache")
    results = execute_ahead.execute_lanes([[first, second], [other]], cache_path, timeout=120, allow_errors=False)
    assert [result["path"] for result in results] == [first, second, other]
    assert [result["error"] for result in results] == [None, None, None]
    assert nbformat.reads(results[1]["notebook"], as_version=4).cells[0].outputs[0]["text"] == "a\n"
    cache = get_cache(cache_path)
    for path in (first, second, other):  # jupyter-cache's lookup of the stored, unexecuted notebook
        assert cache.match_cache_notebook(nbformat.read(path, as_version=4)).uri == path


@pytest.mark.parametrize("cell, message", [
    ("raise ValueError('offset 0 has no task')", "offset 0 has no task"),  # a failing cell
    ("import os\nos._exit(1)", "DeadKernelError"),  # a kernel that dies
    ("import time\ntime.sleep(30)", "CellTimeoutError"),  # a cell over the timeout
])
def test_a_failing_notebook_fails_with_its_traceback_and_the_other_lane_is_still_stored(tmp_path, cell, message):
    failing = _notebook(tmp_path, "a", cell)
    never = _notebook(tmp_path, "b", "print('not reached')")
    other = _notebook(tmp_path, "c", "print('fine')")
    cache_path = str(tmp_path / "cache")
    with pytest.raises(ExtensionError, match=message) as error:
        execute_ahead.execute_lanes([[failing, never], [other]], cache_path, timeout=5, allow_errors=False)
    assert failing in str(error.value) and never not in str(error.value)
    cache = get_cache(cache_path)
    assert cache.match_cache_notebook(nbformat.read(other, as_version=4)).uri == other
    for path in (failing, never):
        with pytest.raises(KeyError):
            cache.match_cache_notebook(nbformat.read(path, as_version=4))


def test_errors_allowed_are_stored_and_without_raise_on_error_a_failure_is_left_to_myst_nb(tmp_path):
    failing = _notebook(tmp_path, "a", "raise ValueError('shown on the page')")
    results = execute_ahead.execute_lanes([[failing]], str(tmp_path / "allowed"), timeout=60, allow_errors=True)
    assert results[0]["error"] is None and "shown on the page" in results[0]["notebook"]
    results = execute_ahead.execute_lanes([[failing]], str(tmp_path / "left"), timeout=60, allow_errors=False,
                                          raise_on_error=False)
    assert "shown on the page" in results[0]["error"] and results[0]["notebook"] is None
    with pytest.raises(KeyError):
        get_cache(str(tmp_path / "left")).match_cache_notebook(nbformat.read(failing, as_version=4))


def _build(source: Path, out: Path) -> str:
    """Build the Sphinx project ``source`` into ``out`` (HTML); returns its warnings."""
    from sphinx.application import Sphinx

    warnings = io.StringIO()
    Sphinx(str(source), str(source), str(out / "html"), str(out / "doctrees"), "html", status=None,
           warning=warnings).build()
    return warnings.getvalue()


def test_a_sphinx_build_executes_each_page_once_and_renders_the_lanes_outputs(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the build's jupyter-cache goes
    source, log = tmp_path / "book", tmp_path / "executed.log"
    source.mkdir()
    for name in ("a", "b", "c"):  # a and b in lanes, c in none: myst-nb executes it while reading
        _notebook(source, name, f"# {name}\nopen({str(log)!r}, 'a').write('{name}\\n')\nprint('output of {name}')")
    (source / "index.md").write_text("# Book\n\n```{toctree}\na\nb\nc\n```\n")
    (source / "conf.py").write_text('extensions = ["myst_nb", "execute_ahead"]\nnb_execution_mode = "cache"\n'
                                    'execute_ahead_lanes = [["a"], ["b"], ["not_a_page"]]\n')
    warnings = _build(source, tmp_path / "out")
    assert sorted(log.read_text().split()) == ["a", "b", "c"], "a page was executed twice or not at all"
    assert "executed twice" not in warnings
    for name in ("a", "b", "c"):
        assert f"output of {name}" in (tmp_path / "out" / "html" / f"{name}.html").read_text()
        executed = nbformat.read(tmp_path / "out" / "jupyter_execute" / f"{name}.ipynb", as_version=4)
        assert executed.cells[0].outputs, f"{name}: the written notebook has no outputs"
    assert not list(tmp_path.glob("lengthgen-jupyter-cache-*")), "the build left its jupyter-cache behind"
    _build(source, tmp_path / "out")  # nothing changed: nothing is executed again
    assert sorted(log.read_text().split()) == ["a", "b", "c"]


@pytest.mark.parametrize("lanes, message", [
    ("chapters/00_the_model", "list of lists"),
    ([["chapters/00_the_model", 3]], "list of lists"),
    ([["chapters/00_the_model"], ["chapters/00_the_model"]], "more than once"),
])
def test_bad_lanes_are_refused_with_the_setting_and_the_value(lanes, message):
    with pytest.raises(ConfigError, match=message):
        execute_ahead.lane_names(lanes)


def _book_config():
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def test_the_book_executes_its_lanes_through_the_cache_mode():
    config = _book_config()
    assert config["execute"]["execute_notebooks"] == "cache"
    assert config["sphinx"]["local_extensions"]["execute_ahead"] == "./_ext"


def test_the_book_lanes_list_toc_chapters_once_and_leave_the_claim_readers_last():
    from lengthgen_utils.tools.buildtime import toc_notebooks

    lanes = execute_ahead.lane_names(_book_config()["sphinx"]["config"][execute_ahead.CONFIG])
    toc = [str(path) for path in toc_notebooks(ROOT)]
    paths = [[str(ROOT / f"{name}.ipynb") for name in lane] for lane in lanes]
    laned = [path for lane in paths for path in lane]
    assert set(laned) <= set(toc), "a lane names a page that is not a notebook of _toc.yml"
    for lane in paths:  # a lane keeps the book's order, so a chapter follows the ones it reads
        assert lane == sorted(lane, key=toc.index)
    readers = [path for path in toc if any(call in Path(path).read_text() for call in ("load_claims", "scoreboard_table"))]
    assert readers and not set(readers) & set(laned), "a page that reads this run's claims must run after the lanes"
