"""Test-session settings: chapters run in the quick profile unless LENGTHGEN_PROFILE says otherwise.

nbval starts each chapter's kernel from this process's environment, so the
setting reaches the notebooks too.
"""
import os

os.environ.setdefault("LENGTHGEN_PROFILE", "quick")
