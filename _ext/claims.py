"""Sphinx extension: every build of the book is a run of its own, with its own claims records.

Each chapter's checks cell records what it established (``lengthgen_utils.book.scoreboard``); the
scoreboard page reads those records back. The build gives itself a fresh run id
(``$LENGTHGEN_RUN_ID``, unless the caller set one) before any notebook is executed, so the kernels it
starts inherit it: the chapters write into ``_build/claims/<run id>/`` and the scoreboard reads that
folder only. A test run or another build in the same checkout at the same time has another id and
another folder, and a record of an earlier build is never shown as this one's.
"""
import os

from lengthgen_utils.book.scoreboard import RUN_ENV, clear_run, new_run_id


def _start_run(app):
    os.environ.setdefault(RUN_ENV, new_run_id("build"))
    clear_run()  # a run id given by the caller starts empty too; only its own record files are removed


def setup(app):
    app.connect("builder-inited", _start_run)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
