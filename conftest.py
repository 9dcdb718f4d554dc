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
time never shows this session's records, nor this session the build's.
"""
import os

os.environ.setdefault("LENGTHGEN_PROFILE", "quick")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before anything imports torch

from lengthgen_utils.book.scoreboard import RUN_ENV, new_run_id

os.environ.setdefault(RUN_ENV, new_run_id("pytest"))
