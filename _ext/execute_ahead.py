"""Sphinx extension: the build executes chapters side by side in lanes, then renders them in order.

A build of the book is mostly notebook execution, and myst-nb executes one notebook at a time while
it reads the pages, so on a two-core machine the build's kernels leave a core idle for much of the
time (most chapters train their single heads on one thread). So before Sphinx reads any page
(``env-before-read-docs``), this extension executes the notebooks of each *lane*
(``execute_ahead_lanes`` in ``_config.yml``): the lanes side by side in worker processes, the
notebooks of one lane one after another in the listed order, each in a fresh kernel with the
notebook's folder as working directory (as myst-nb runs it). Each executed notebook goes into a
jupyter-cache of this build's own, where myst-nb's ``cache`` execution mode looks every page up (by
its kernelspec and its code cells) and renders the stored outputs without executing the page
again. What no lane lists (chapter 10 and the scoreboard, which read the claims every other chapter
recorded in this run) myst-nb executes itself while reading, after the lanes, in page order.

* **Each page Sphinx reads is executed in this build.** The jupyter-cache is a fresh temporary
  folder, removed when the build ends: a chapter's results depend on ``$LENGTHGEN_PROFILE``, which a
  cache keyed by a notebook's code cannot see. Sphinx reads every page of a first build, and on a
  rebuild the pages whose source changed. Trained models are reused across builds and chapters by
  the package's own results cache, which is keyed by every setting.
* **The numbers do not depend on the lanes.** A chapter that reads what another trained (chapter 2
  reads chapter 1's heads, chapter 9 reads runs of chapters 1 and 7) finds it in the results cache,
  or trains it itself with the same settings, seeds and thread count: at worst the work is done
  twice. Put such a chapter after the one it reads, in the same lane or where the other lane has
  long finished it, and a page that reads the run's claims in no lane.
* **A failing notebook fails the build** (``execute.allow_errors: false`` and myst-nb's
  ``raise_on_error``, the book's settings): a failing cell, a timeout, a kernel that dies. The lanes
  still running finish first; then every failure is reported with its notebook and traceback.
  Without ``raise_on_error`` a failed notebook is left out of the cache, so myst-nb executes it
  again and reports it its own way.
* After the pages are read, a lane notebook that myst-nb executed again (its cache lookup missed)
  is reported with a warning, and ``_build/jupyter_execute/<page>.ipynb`` is the executed notebook,
  as with serial execution.
* Nothing happens unless ``execute.execute_notebooks`` is ``cache``. A lane page that is not among
  the pages being built (a build of one page) is skipped.
"""
from __future__ import annotations

import atexit
import multiprocessing
import shutil
import sys
import tempfile
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path, PurePosixPath

import nbformat
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn
from jupyter_cache.executors.utils import single_nb_execution
from sphinx.errors import ConfigError, ExtensionError
from sphinx.util import logging

LOGGER = logging.getLogger(__name__)
CONFIG = "execute_ahead_lanes"


def execute_lane(paths: list[str], timeout: int | None, allow_errors: bool) -> list[dict]:
    """Execute the notebooks ``paths`` one after another, each in a fresh kernel run in its own folder.

    Stops at the first notebook that fails (a cell's error when ``allow_errors`` is false, a cell over
    ``timeout`` seconds, a kernel that dies or does not start, an unreadable file). Returns one dict
    per notebook attempted: ``path``, ``notebook`` (the executed notebook as nbformat JSON text, or
    ``None`` when it failed), ``seconds`` (wall time, kernel start included) and ``error`` (the
    traceback text, or ``None``). Each finished notebook is announced on stderr as it ends. Runs in a
    worker process: arguments and results are plain values.
    """
    results = []
    for path in paths:
        try:
            notebook = nbformat.read(path, as_version=4)
            result = single_nb_execution(notebook, cwd=str(Path(path).parent), timeout=timeout,
                                         allow_errors=allow_errors)
            seconds, error = result.time, result.exc_string if result.err is not None else None
        except Exception:  # noqa: BLE001 - a dead kernel, a kernel that cannot start, a bad file
            seconds, error = float("nan"), traceback.format_exc()
        results.append({"path": path, "seconds": seconds, "error": error,
                        "notebook": None if error else nbformat.writes(result.nb)})
        print(f"execute_ahead: {Path(path).name} {'FAILED' if error else 'executed'} in {seconds:.1f} s",
              file=sys.stderr, flush=True)
        if error:
            break
    return results


def execute_lanes(lanes: list[list[str]], cache_path: str, timeout: int | None, allow_errors: bool,
                  raise_on_error: bool = True) -> list[dict]:
    """Execute each lane's notebooks in order, the lanes side by side (one worker process each), and
    store every notebook that succeeded in the jupyter-cache at ``cache_path``.

    Returns every notebook's result (as :func:`execute_lane`), lane by lane; a lane whose worker
    process died gives one result with its error. Raises :class:`sphinx.errors.ExtensionError` naming
    every notebook that failed, with its traceback, once every lane has stopped, unless
    ``raise_on_error`` is false.
    """
    results = []
    # "spawn": the workers start clean, whatever the Python version's default start method
    with ProcessPoolExecutor(max_workers=len(lanes), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(execute_lane, lane, timeout, allow_errors) for lane in lanes]
        for lane, future in zip(lanes, futures):
            try:
                results.extend(future.result())
            except Exception:  # noqa: BLE001 - the worker process itself died
                results.append({"path": lane[0], "seconds": float("nan"), "notebook": None,
                                "error": f"the lane starting here stopped:\n{traceback.format_exc()}"})
    cache = get_cache(cache_path)
    for result in results:
        if result["notebook"] is not None:
            cache.cache_notebook_bundle(
                CacheBundleIn(nbformat.reads(result["notebook"], as_version=4), result["path"],
                              data={"execution_seconds": result["seconds"]}),
                check_validity=False, overwrite=True)
    failed = [result for result in results if result["error"] is not None]
    if failed and raise_on_error:
        raise ExtensionError("\n\n".join(f"executing {result['path']} failed:\n{result['error']}"
                                         for result in failed))
    return results


def lane_names(lanes) -> list[list[str]]:
    """The setting ``execute_ahead_lanes``, checked: a list of lists of page names, none twice.

    Raises:
        ConfigError: the setting is not a list of lists of strings, or names a page twice.
    """
    if (not isinstance(lanes, (list, tuple))
            or not all(isinstance(lane, (list, tuple)) and all(isinstance(name, str) for name in lane)
                       for lane in lanes)):
        raise ConfigError(f"{CONFIG} must be a list of lists of page names (strings); got {lanes!r}")
    names = [name for lane in lanes for name in lane]
    if len(names) != len(set(names)):
        raise ConfigError(f"{CONFIG} names a page more than once: {names!r}")
    return [list(lane) for lane in lanes]


def _execute_ahead(app, env, docnames):
    config = env.mystnb_config
    lanes = lane_names(app.config[CONFIG])
    if config.execution_mode != "cache":
        return
    if config.execution_in_temp or config.kernel_rgx_aliases:
        raise ConfigError(f"{CONFIG} executes each notebook in its own folder with its own kernelspec; "
                          "execute.run_in_temp and nb_kernel_rgx_aliases are not supported with it")
    cache_path = tempfile.mkdtemp(prefix="lengthgen-jupyter-cache-")
    atexit.register(shutil.rmtree, cache_path, ignore_errors=True)  # also after an interrupted build
    env.mystnb_config = config.copy(execution_cache_path=cache_path)
    reading = set(docnames)
    skipped = [name for lane in lanes for name in lane if name not in env.found_docs]
    if skipped:
        LOGGER.info(f"{CONFIG}: not pages of this build, skipped: {', '.join(skipped)}")
    excluded = [name for lane in lanes for name in lane
                if any(PurePosixPath(env.doc2path(name)).match(pattern)
                       for pattern in config.execution_excludepatterns)]
    lanes = [[name for name in lane if name in reading and name not in excluded] for lane in lanes]
    lanes = [[str(env.doc2path(name)) for name in lane] for lane in lanes if lane]
    app.env.execute_ahead = {"cache": cache_path, "results": []}
    if not lanes:
        return
    LOGGER.info(f"executing {sum(map(len, lanes))} notebooks ahead, in {len(lanes)} lanes side by side; "
                f"jupyter-cache of this build: {cache_path}")
    results = execute_lanes(lanes, cache_path, config.execution_timeout, config.execution_allow_errors,
                            config.execution_raise_on_error)
    for result in results:
        LOGGER.info(f"  {Path(result['path']).name}: {result['seconds']:.1f} s")
    app.env.execute_ahead["results"] = [result for result in results if result["notebook"] is not None]


def _after_reading(app, env):
    """Warn about a lane notebook myst-nb executed again, and write each lane notebook, executed, where
    myst-nb writes the notebooks it executes (it wrote the unexecuted source on a cache hit)."""
    ahead = getattr(env, "execute_ahead", None)
    if not ahead or not ahead["results"]:
        return
    executed_again = {record.uri for record in get_cache(ahead["cache"]).list_project_records()}
    out = Path(app.outdir).parent / "jupyter_execute"
    for result in ahead["results"]:
        if result["path"] in executed_again:
            LOGGER.warning(f"{result['path']} was executed twice: myst-nb did not find the lane's run in the cache")
        docname = env.path2doc(result["path"])
        if docname is not None and (out / f"{docname}.ipynb").is_file():
            (out / f"{docname}.ipynb").write_text(result["notebook"], encoding="utf-8")
    ahead["results"] = []  # the notebooks' text stays out of the pickled environment


def _remove_cache(app, exception):
    ahead = getattr(app.env, "execute_ahead", None)
    if ahead:
        shutil.rmtree(ahead["cache"], ignore_errors=True)


def setup(app):
    app.add_config_value(CONFIG, [], "")
    app.connect("env-before-read-docs", _execute_ahead)
    app.connect("env-updated", _after_reading)
    app.connect("build-finished", _remove_cache)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
