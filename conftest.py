"""Test-session settings: chapters run in the quick profile unless LENGTHGEN_PROFILE says otherwise.

nbval starts each chapter's kernel from this process's environment, so the
settings reach the notebooks too.

``OMP_WAIT_POLICY=PASSIVE`` (unless set otherwise): the transformer trains with two threads, and
on a machine where other programs compete for the cores a thread that spins while waiting for
the other one to get a core back made the transformer chapters several times slower; a passive
thread yields its core instead. It changes no number (the thread count is the same), and it must
be set before torch loads its OpenMP runtime, which is why it is set here.

``LENGTHGEN_RUN_ID``: the test session is a run of its own (``lengthgen_utils.book.scoreboard``): its chapters
record their claims in a folder of their own, so a book build in the same checkout at the same
time never shows this session's records, nor this session the build's. pytest-xdist's worker
processes inherit it, so every worker records into the one folder.

**The chapters in lanes.** ``pytest`` runs in one process per CPU core (pytest-xdist, ``-n auto``
in ``pyproject.toml``), and the chapters in the lanes the book build uses (``execute_ahead_lanes``
in ``_config.yml``): each lane is one xdist group, so its chapters run in order on one worker, in
one kernel each, as nbval runs them. The lanes are handed out first, the unit tests fill the cores
around them, and the pages that read every chapter's claims (chapter 10, the scoreboard) come last
and wait until every lane's chapters the session runs have finished (:func:`pytest_runtest_setup`):
marks in a folder the main process makes for the session (``$LENGTHGEN_PYTEST_LANES``). They stop
waiting, and fail, when a worker stopped early (``-x``, ``--maxfail``) or no lane cell finished
within nbval's timeouts. Run without xdist (``-n 0``), the same order runs in one process.
"""
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LENGTHGEN_PROFILE", "quick")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before anything imports torch

import pytest
import yaml

from lengthgen_utils.book.scoreboard import RUN_ENV, new_run_id

os.environ.setdefault(RUN_ENV, new_run_id("pytest"))

ROOT = Path(__file__).resolve().parent
LANES = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["config"]["execute_ahead_lanes"]
LANE_OF = {page: i for i, lane in enumerate(LANES) for page in lane}
STALL_MARGIN_S = 60
"""Chapter 10 and the scoreboard wait for the lanes' chapters as long as one of their cells finishes within
nbval's kernel start-up and cell timeouts (``--nbval-kernel-startup-timeout``, ``--nbval-cell-timeout``)
plus this margin (seconds); past that, they fail."""
LANES_ENV = "LENGTHGEN_PYTEST_LANES"
"""The session's folder of lane marks: made by the main process, inherited by xdist's workers."""

LANE_PAGES = pytest.StashKey[list]()  # the lane pages this session collected
LANE_CELL = pytest.StashKey[bool]()  # on every cell of a lane page
LAST_CELL = pytest.StashKey[str]()  # on a lane page's last cell: the page's name
READS_CLAIMS = pytest.StashKey[bool]()  # on a cell of a page in no lane
WAIT_FAILED = pytest.StashKey[str]()  # a failed wait, so the next page in no lane fails at once


def page_name(item) -> str | None:
    """``chapters/01_retrieval_task`` for a cell of that notebook, ``None`` for a unit test."""
    path = Path(str(item.path)).resolve()
    if path.suffix != ".ipynb" or not path.is_relative_to(ROOT):
        return None
    return path.relative_to(ROOT).with_suffix("").as_posix()


def lanes_done_dir() -> Path:
    """The folder where each lane page's end is marked, a new one per test session."""
    return Path(os.environ[LANES_ENV])


def pytest_configure(config):
    """The main process makes the session's folder of lane marks (before xdist starts its workers)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ[LANES_ENV] = tempfile.mkdtemp(prefix="lengthgen-lanes-")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Order the session: the lanes' chapters, lane by lane, then the unit tests, then the pages in no
    lane (they read every chapter's claims); each lane, and those pages, one xdist group."""
    cells, tests, after = {}, [], []  # cells: a lane page's cells by page
    for item in items:
        page = page_name(item)
        if page is None:
            tests.append(item)
        elif page in LANE_OF:
            cells.setdefault(page, []).append(item)
            item.stash[LANE_CELL] = True
            item.add_marker(pytest.mark.xdist_group(f"lane{LANE_OF[page]}"))
        else:
            after.append(item)
            item.stash[READS_CLAIMS] = True
            item.add_marker(pytest.mark.xdist_group("after the lanes"))
    items[:] = [item for lane in LANES for page in lane for item in cells.get(page, [])] + tests + after


def pytest_collection_finish(session):
    """Note the lane pages the session runs, and each one's last cell, once ``-k`` and the like have
    deselected what they deselect: a page in no lane waits for these alone."""
    last = {page_name(item): item for item in session.items if item.stash.get(LANE_CELL, False)}
    for page, item in last.items():
        item.stash[LAST_CELL] = page
    session.config.stash[LANE_PAGES] = list(last)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After each lane cell, mark the lanes' progress; after a lane page's last cell (its kernel shut down),
    mark the page finished, pass or fail."""
    try:
        return (yield)
    finally:
        if item.stash.get(LANE_CELL, False):
            done = lanes_done_dir()
            (done / "progress").touch()
            page = item.stash.get(LAST_CELL, None)
            if page is not None:
                (done / page.replace("/", "__")).touch()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A page in no lane runs only once every lane page of the session has finished (on any worker)."""
    if not item.stash.get(READS_CLAIMS, False) or not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # in one process the order alone is enough
    config = item.config
    if WAIT_FAILED in config.stash:
        pytest.fail(config.stash[WAIT_FAILED])
    pages = config.stash.get(LANE_PAGES, [])
    stall_s = (float(config.getoption("nbval_cell_timeout", 2000))
               + float(config.getoption("nbval_kernel_startup_timeout", 60)) + STALL_MARGIN_S)
    done, last_progress = lanes_done_dir(), time.time()
    while True:
        waiting = [p for p in pages if not (done / p.replace("/", "__")).is_file()]
        if not waiting:
            return
        if (done / "stopped").is_file():  # a worker stopped early (-x, --maxfail): its lane will not finish
            config.stash[WAIT_FAILED] = (f"{page_name(item)} reads every chapter's claims, but a worker stopped "
                                         f"before these chapters finished: {', '.join(waiting)}")
        elif (done / "progress").is_file():
            last_progress = max(last_progress, (done / "progress").stat().st_mtime)
        if time.time() - last_progress > stall_s:
            config.stash[WAIT_FAILED] = (f"{page_name(item)} reads every chapter's claims, but no cell of these "
                                         f"chapters finished in {stall_s:.0f} s: {', '.join(waiting)}")
        if WAIT_FAILED in config.stash:
            pytest.fail(config.stash[WAIT_FAILED])
        time.sleep(1)


def pytest_sessionfinish(session):
    """A worker stopped early (``-x``, ``--maxfail``) says so, for the pages waiting for its lane; the main
    process removes the marks (a worker's session ends before the others')."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        if session.shouldfail or session.shouldstop:
            (lanes_done_dir() / "stopped").touch()
    else:
        shutil.rmtree(lanes_done_dir(), ignore_errors=True)
