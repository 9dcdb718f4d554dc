"""``conftest.py``: ``pytest`` runs the chapters in the build's lanes on pytest-xdist's workers.

A small project stands in for the book: its own ``_config.yml`` names two lanes of tiny notebooks,
a notebook in no lane reads what every lane wrote (as chapter 10 and the scoreboard read every
chapter's claims), and the book's own ``conftest.py`` orders and groups them. What ``pytest`` needs
of it: a lane's notebooks run in their order, the lanes and the unit tests share the workers, and a
page in no lane starts only after every lane page has finished, on whichever worker, a failed one
included.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """sphinx:
  config:
    execute_ahead_lanes:
      - [book/a, book/b]
      - [book/c]
"""
PYPROJECT = """[tool.pytest.ini_options]
testpaths = ["test_unit.py", "book"]
addopts = "--nbval-lax -p no:cacheprovider --dist loadgroup --no-loadscope-reorder"
"""


def _notebook(path: Path, *sources: str) -> None:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, path)


def _log(project: Path, line: str) -> str:
    """A cell that appends ``line`` to the project's log."""
    return f"with open({str(project / 'log.txt')!r}, 'a') as f:\n    f.write({line!r} + '\\n')"


def _project(tmp_path: Path, b_fails: bool = True, c_fails: bool = False) -> Path:
    project = tmp_path / "book-project"
    (project / "book").mkdir(parents=True)
    shutil.copy(ROOT / "conftest.py", project)
    (project / "_config.yml").write_text(CONFIG)
    (project / "pyproject.toml").write_text(PYPROJECT)
    (project / "test_unit.py").write_text("def test_unit():\n    assert True\n")
    _notebook(project / "book" / "a.ipynb", _log(project, "a"))
    _notebook(project / "book" / "b.ipynb", "raise ValueError('b failed')" if b_fails else "pass",
              _log(project, "b"))
    # the slow lane: without the wait, the page in no lane would start long before it ends
    _notebook(project / "book" / "c.ipynb", "import time\ntime.sleep(4)",
              "raise ValueError('c failed')" if c_fails else "pass", _log(project, "c"))
    read = (f"lines = open({str(project / 'log.txt')!r}).read().split()\n"
            "assert {'a', 'b', 'c'} <= set(lines), lines")
    # named to come first, as the scoreboard would if the order of names decided
    _notebook(project / "book" / "0_reads_all.ipynb", read, _log(project, "z"))
    return project


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess:
    """``pytest`` in ``project``, a session of its own: its temporary files (the lane marks) in the project."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LENGTHGEN_RUN_ID", "LENGTHGEN_PYTEST_LANES", "PYTEST_XDIST_WORKER")}
    env["TMPDIR"] = str(project)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("workers", ["2", "0"])
def test_the_page_in_no_lane_runs_after_every_lane_page_a_failed_one_too(tmp_path, workers):
    project = _project(tmp_path)
    result = _pytest(project, "-n", workers)
    # b's first cell fails, and nothing else: its second cell runs, and z finds every lane's line
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 failed" in result.stdout and "b failed" in result.stdout, result.stdout[-3000:]
    lines = (project / "log.txt").read_text().split()
    assert sorted(lines) == ["a", "b", "c", "z"] and lines[-1] == "z", lines
    assert lines.index("a") < lines.index("b"), lines  # a lane keeps its order
    assert not list(project.glob("lengthgen-lanes-*"))  # the marks are removed


def test_the_page_in_no_lane_waits_only_for_the_lane_pages_the_session_runs(tmp_path):
    project = _project(tmp_path)
    (project / "book" / "0_reads_all.ipynb").unlink()  # a page in no lane that needs no lane
    _notebook(project / "book" / "0_reads_all.ipynb", _log(project, "z"))
    result = _pytest(project, "-n", "2", "--nbval-cell-timeout=5", "--deselect", "book/c.ipynb")
    # c is deselected: waiting for it would outlast the run's 120 s (a stall limit of 5 + 60 + 60 s)
    assert result.returncode == 1 and "1 failed" in result.stdout, result.stdout[-3000:]
    assert sorted((project / "log.txt").read_text().split()) == ["a", "b", "z"]


def test_a_worker_stopped_by_maxfail_releases_the_page_in_no_lane_at_once(tmp_path):
    project = _project(tmp_path, b_fails=False, c_fails=True)
    # the wait's stall limit is 30 + 60 + 60 s here, past this run's 120 s: only the stop mark ends it
    result = _pytest(project, "-n", "2", "--maxfail=1", "--nbval-cell-timeout=30")
    assert result.returncode in (1, 2), result.stdout[-3000:]  # failed, or interrupted by --maxfail
    lines = (project / "log.txt").read_text().split()
    # the page in no lane was either never handed out, or failed at once, naming the lane it waited for
    assert "z" not in lines, lines
    assert "0_reads_all" not in result.stdout or "a worker stopped before these chapters finished: book/c" \
        in result.stdout, result.stdout[-3000:]
