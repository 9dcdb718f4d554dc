"""lengthgen_utils: the shared package of the lengthgen book.

Data flows one way, through five sub-packages; a module imports only the sub-packages above it (and its
own), with one exception, ``analysis.probes`` using ``run.training``'s ensemble loss and thread count::

    core  ->  analysis  ->  run  ->  book  ->  tools            (then the chapters)

* :mod:`.core`: the model code.
  ``tasks`` (the tasks behind one protocol, :class:`~lengthgen_utils.core.tasks.Task`), ``seeding`` (the seed
  base), ``rope`` (RoPE's numerics, written once), ``encodings`` (position encodings as objects behind one
  interface, and a registry), ``attention`` (masks, scores, normalisers), ``models`` (the retrieval head, the
  kernel head, a linear RNN and ``Transformer``, the nanoGPT-shaped transformer to read) and ``fast``
  (``FastTransformer``, the same model in a batched layout, tested equal to it: the one the book trains);
* :mod:`.analysis`: what is read off trained models. ``kernel`` (a RoPE head's offset kernel, spectrum
  first), ``probes`` (equivariance, pinning, head profiles), ``theory`` (closed forms: dilution, frequency
  orbits, the min-norm interpolant);
* :mod:`.run`: the experiment machinery. ``configs`` and ``profiles`` (experiments as frozen dataclasses, how
  much a build computes), ``training`` and ``evaluation`` (one step loop; accuracy by length and position),
  ``cache`` (``load_or_run``), ``results`` (``Runs``, the one result type), ``runners`` (run an experiment
  through the cache) and ``zoo`` (every encoding through the same tasks, chapter 9);
* :mod:`.book`: what the pages show, the only part that imports plotly or ipywidgets. ``render``, ``style``,
  ``sliders``, ``tables`` and ``figures`` (the shared builders), one ``chNN`` module per chapter with its own
  figures, ``checks`` and ``scoreboard`` (a chapter's checks and the claims they record), ``widgets`` (live
  explorers in a kernel) and ``live`` (panels the web page retrains, ``_static/lengthgen_live.js``);
* :mod:`.tools`: beside the book. ``cli`` (``python -m lengthgen_utils``), ``bench``, ``buildtime`` and
  ``robustness``.

The book's appendix "How the package is built" (``architecture.md``) draws the same map, one line per
module, and gives the recipes for adding a position encoding and a task.
"""
import os as _os

# A thread that waits for another to get a core back yields its core instead of spinning (the
# transformer trains with two OpenMP threads; on a busy machine spinning made it many times slower).
# It changes no number. OpenMP reads it when torch loads, so it takes effect where this package is
# imported before torch: the command line (python -m lengthgen_utils ...) and scripts that start with
# it. The book build (_ext/kernel_env.py) and the tests (conftest.py) set it for the chapters' kernels.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.2.0"
