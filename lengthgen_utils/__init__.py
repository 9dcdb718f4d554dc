"""lengthgen_utils: the shared package of the lengthgen book.

Data flows one way::

    tasks, positional  ->  attention  ->  models  ->  training  ->  evaluation, kernel, probes, theory  ->  plots
                                     configs, profiles -> runners (through cache) -> the chapters

* ``tasks``: the tasks, behind one protocol (:class:`~lengthgen_utils.core.tasks.Task`);
* ``positional``: position encodings as objects behind one interface, a registry, RoPE's numerics;
* ``attention``: masks, scores and normalisers (one place for numerics);
* ``models``: the retrieval head, the kernel head and the transformer; its ``Transformer`` is the one to
  read (nanoGPT-shaped, the same RoPE and attention functions the chapters show), while ``fast``'s
  ``FastTransformer``, tested equal to it (logits, loss, gradients), is the one the book trains;
* ``training`` / ``evaluation``: one step loop; accuracy and attention by length;
* ``kernel`` / ``probes`` / ``theory``: the offset kernel and what is read off it; probes of trained
  models (equivariance, pinning, head profiles); closed forms (dilution, frequency orbits, min-norm interpolant);
* ``configs`` / ``profiles`` / ``runners`` / ``cache``: experiments as frozen dataclasses, the compute
  profiles, the functions that run an experiment through the results cache;
* ``zoo``: every position encoding through the same tasks and probes (chapter 9), over the runners;
* ``plots`` / ``widgets``: plotly figures and ipywidgets panels (the only modules that import them);
* ``live``: the web book's live panels, a precomputed figure that the page's own script
  (``_static/lengthgen_live.js``) retrains in the reader's browser.

The book's appendix "How the package is built" draws the same map and gives the recipes for
adding a position encoding and a task.
"""
import os as _os

# A thread that waits for another to get a core back yields its core instead of spinning (the
# transformer trains with two OpenMP threads; on a busy machine spinning made it many times slower).
# It changes no number. OpenMP reads it when torch loads, so it takes effect where this package is
# imported before torch: the command line (python -m lengthgen_utils ...) and scripts that start with
# it. The book build (_ext/kernel_env.py) and the tests (conftest.py) set it for the chapters' kernels.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.2.0"
