"""Sphinx extension: start every build of the book with an empty claims scoreboard.

Each chapter's checks cell records what it established (``lengthgen_utils.scoreboard``); the
scoreboard page reads those records. Emptying the folder when the build starts means the page can
only show what the chapters executed by this build measured, never an earlier build's numbers.
"""
import shutil

from lengthgen_utils.scoreboard import claims_dir


def _empty_claims(app):
    shutil.rmtree(claims_dir(), ignore_errors=True)


def setup(app):
    app.connect("builder-inited", _empty_claims)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
