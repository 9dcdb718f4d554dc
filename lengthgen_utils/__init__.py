"""lengthgen_utils: the shared package of the lengthgen book.

Five sub-packages, through which data flows one way: ``core`` (the model code), ``analysis`` (what is read
off trained models), ``run`` (the experiment machinery), ``book`` (what the pages show) and ``tools`` (beside
the book). The book's appendix "How the package is built" (``architecture.md``) draws the package, one line
per module, and gives the recipes for adding a position encoding, a task and an optimiser.
"""
import os as _os

# A thread that waits for another to get a core back yields its core instead of spinning (the
# transformer trains with two OpenMP threads; on a busy machine spinning made it many times slower).
# It changes no number. OpenMP reads it when torch loads, so it takes effect where this package is
# imported before torch: the command line (python -m lengthgen_utils ...) and scripts that start with
# it. The book build (_ext/kernel_env.py) and the tests (conftest.py) set it for the chapters' kernels.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.2.0"
