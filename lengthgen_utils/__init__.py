"""lengthgen_utils: the shared package of the lengthgen book.

Data flows one way::

    tasks, positional  ->  attention  ->  models  ->  training  ->  evaluation, kernel, probes, theory  ->  plots
                                     configs, profiles -> runners (through cache) -> the chapters

* ``tasks``: the tasks, behind one protocol (:class:`~lengthgen_utils.tasks.Task`);
* ``positional``: position encodings as objects behind one interface, a registry, RoPE's numerics;
* ``attention``: masks, scores and normalisers (one place for numerics);
* ``models``: the retrieval head, the kernel head and the transformer;
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
__version__ = "0.2.0"
