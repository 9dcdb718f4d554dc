"""Per-chapter execution times of the whole book: ``python -m lengthgen_utils.tools.buildtime``.

Executes every notebook chapter listed in ``_toc.yml``, in the book's order, with nbclient
(what the book build uses), one at a time so that each time is the chapter's own, twice:

1. **cold**: from an empty results cache (a fresh temporary folder), as a first build of a fresh
   clone computes everything;
2. **warm**: again with the cache the first pass filled, as a rebuild does.

and prints a table: chapter, seconds cold, seconds warm, and the totals (with each kernel's CPU
seconds beside them: on a busy machine they show what the chapter itself cost). The kernels it starts
get ``PYTHONPATH`` (this repository first, so they import this checkout's package),
``LENGTHGEN_PROFILE``, ``LENGTHGEN_CACHE`` (the temporary folder) and ``LENGTHGEN_CLAIMS`` (a
temporary folder, so the book's scoreboard records are left alone). Each time is the wall
time of one notebook's execution, kernel start included. Nothing is written to the
repository; the temporary folders are removed at the end.

The build itself executes the lanes of ``execute_ahead_lanes`` (``_config.yml``) side by side
(``_ext/execute_ahead.py``), so its wall time is less than the total printed here.

The load average is printed before and after: on a machine shared with other processes,
times are longer than the project's budget assumes (2 otherwise idle CPU cores).
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from unittest.mock import patch

from ..book.scoreboard import CLAIMS_ENV, RUN_ENV, new_run_id
from ..run.cache import CACHE_ENV, REPO_ROOT
from ..run.profiles import PROFILE_ENV, PROFILES, get_profile
from .._validate import check_int, env_value
from ..run.training import THREADS_ENV, default_cpu_threads, malloc_choice

PROG = "python -m lengthgen_utils.tools.buildtime"


def toc_notebooks(root: Path = REPO_ROOT) -> list[Path]:
    """The notebooks of ``_toc.yml`` (``root`` and every ``file`` entry, nested parts and sections included),
    in the order the book build reads them.

    That is the order of their paths, not the table of contents: the build reads its pages sorted
    by name, and executes each page no lane executed ahead (``_ext/execute_ahead.py``) as it reads
    it, so the chapters run before the claims scoreboard that reads what they recorded, wherever
    the table of contents puts it (after chapter 10).

    Raises:
        FileNotFoundError: no ``_toc.yml`` in ``root``.
    """
    import yaml

    toc = yaml.safe_load((Path(root) / "_toc.yml").read_text())
    files = []

    def walk(node):
        if isinstance(node, dict):
            for key in ("root", "file"):
                if isinstance(node.get(key), str):
                    files.append(node[key])
            for value in node.values():
                if isinstance(value, (list, dict)):
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    paths = [Path(root) / (f if f.endswith(".ipynb") else f + ".ipynb") for f in files]
    found = [p for p in dict.fromkeys(paths) if p.is_file()]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _client_class():
    """nbclient's ``NotebookClient`` with Ctrl-C made an interrupt of the whole run, not a failed notebook.

    nbclient answers SIGINT by shutting the kernel down under the running cell, and the caller then sees
    a failed notebook (an ``AssertionError`` or a dead kernel) and would run the next one. This client
    instead interrupts the kernel (the cell ends), lets nbclient shut the kernel down as after any notebook,
    and records that it was interrupted: :func:`execute` then raises ``KeyboardInterrupt``.
    """
    import asyncio
    import signal
    from contextlib import asynccontextmanager

    from nbclient import NotebookClient
    from nbclient.util import ensure_async

    class Client(NotebookClient):
        interrupted = False

        @asynccontextmanager
        async def async_setup_kernel(self, **kwargs):
            async with super().async_setup_kernel(**kwargs):
                loop = asyncio.get_event_loop()

                def on_interrupt():
                    self.interrupted = True
                    self.shutdown_kernel = "immediate"  # the run is over: no graceful shutdown to wait for
                    if self.km is not None:
                        asyncio.ensure_future(ensure_async(self.km.interrupt_kernel()))

                try:  # replaces nbclient's handler (which shuts the kernel down under the cell) while cells run
                    loop.add_signal_handler(signal.SIGINT, on_interrupt)
                except (RuntimeError, NotImplementedError):  # not the main thread, or no signals here
                    pass
                yield

    return Client


def execute(path: Path, timeout: int) -> tuple[float, str | None, float]:
    """Execute one notebook in a fresh kernel (outputs discarded).

    Returns:
        ``(seconds, error, cpu_seconds)``: wall seconds, None or what failed, and the CPU seconds
        (user + system, every thread) of the kernel, which has ended when this returns.

    Raises:
        KeyboardInterrupt: Ctrl-C while the notebook ran (after its kernel was shut down): an interrupt of
            the caller's run, never reported as a failure of this notebook.
    """
    import nbformat

    nb = nbformat.read(path, as_version=4)
    client = _client_class()(nb, timeout=timeout, kernel_name="python3",
                             resources={"metadata": {"path": str(path.parent)}})
    cpu0, start = _children_cpu_seconds(), time.perf_counter()
    try:
        client.execute()
        error = None
    except Exception as err:  # a failing cell (e.g. a claim check), a timeout, a dead kernel
        error = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:200] if str(err).strip() else ''}"
    finally:
        if client.km is not None and client.owns_km:  # e.g. a KeyboardInterrupt raised outside a cell
            try:
                client._cleanup_kernel()
            except Exception:  # already gone
                pass
    if client.interrupted:
        raise KeyboardInterrupt(f"{path.name} was interrupted")
    return time.perf_counter() - start, error, _children_cpu_seconds() - cpu0


def kernel_environment(cache: Path, claims: Path, profile: str) -> dict:
    """The variables the kernels get: this checkout first on ``PYTHONPATH``, the profile, the cache, the claims,
    and ``OMP_WAIT_POLICY`` as the book build sets it (``PASSIVE`` unless the caller set another value)."""
    python_path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": python_path, PROFILE_ENV: profile, CACHE_ENV: str(cache), CLAIMS_ENV: str(claims),
            RUN_ENV: new_run_id("buildtime"), "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY") or "PASSIVE"}


def main(argv=None) -> int:
    from .._validate import error_line, interrupted

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--profile", choices=tuple(PROFILES), default=None,
                        help="quick | default | full (default: $LENGTHGEN_PROFILE, else default)")
    parser.add_argument("--chapters", nargs="+", default=None,
                        help="notebooks to run (paths or name fragments, e.g. 07); default: every one in _toc.yml")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell before it fails (>= 1)")
    parser.add_argument("--cold-only", action="store_true", help="skip the warm pass")
    args = parser.parse_args(argv)
    try:  # every input checked before any work: a bad one is one line on stderr and exit status 2
        profile = get_profile(args.profile).name  # a bad $LENGTHGEN_PROFILE or $LENGTHGEN_SEED is refused here
        check_int("--timeout", args.timeout, minimum=1)
        default_cpu_threads()  # a bad $LENGTHGEN_THREADS or $LENGTHGEN_MALLOC, which every kernel would otherwise meet
        malloc_choice()
        notebooks = toc_notebooks()
        if args.chapters:
            notebooks = [p for p in notebooks if any(c in str(p) for c in args.chapters)]
            if not notebooks:
                raise ValueError(f"--chapters {args.chapters} matches no notebook of _toc.yml")
    except (ValueError, TypeError) as err:
        return error_line(PROG, str(err))
    work = Path(tempfile.mkdtemp(prefix="lengthgen-buildtime-"))
    environment = patch.dict(os.environ, kernel_environment(work / "cache", work / "claims", profile))
    environment.start()  # every variable as it was, after the run (finally, below)
    load0 = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"book execution times, profile {profile!r}, {len(notebooks)} notebooks of _toc.yml, one at a time in page order; "
          f"{os.cpu_count()} CPU cores, ${THREADS_ENV}={env_value(THREADS_ENV) or 'unset'}, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}; "
          f"load average {load0}", flush=True)
    passes = ("cold", "warm")[: 1 if args.cold_only else 2]
    times = {name: {} for name in passes}
    cpu = {name: {} for name in passes}
    failed = []
    try:
        for name in passes:
            print(f"[{name}] results cache {'empty' if name == 'cold' else 'filled by the cold pass'}: "
                  f"{work / 'cache'}", flush=True)
            for path in notebooks:
                try:
                    seconds, error, cpu[name][path] = execute(path, args.timeout)
                except KeyboardInterrupt:
                    return interrupted(PROG, f"stopped in {path.stem} ({name} pass); no further notebook ran")
                times[name][path] = seconds
                print(f"  {path.stem:<40} {seconds:7.1f} s (kernel CPU {cpu[name][path]:.1f} s)"
                      + (f"  FAILED: {error}" if error else ""), flush=True)
                if error:
                    failed.append((name, path.stem, error))
    finally:
        environment.stop()
        shutil.rmtree(work, ignore_errors=True)
    load1 = os.getloadavg() if hasattr(os, "getloadavg") else None
    print()
    print(f"{'chapter':<40}" + "".join(f"{'seconds ' + name:>15}" for name in passes)
          + "".join(f"{'CPU s ' + name:>13}" for name in passes))
    for path in notebooks:
        print(f"{path.stem:<40}" + "".join(f"{times[name][path]:>15.1f}" for name in passes)
              + "".join(f"{cpu[name][path]:>13.1f}" for name in passes))
    print(f"{'total':<40}" + "".join(f"{sum(times[name].values()):>15.1f}" for name in passes)
          + "".join(f"{sum(cpu[name].values()):>13.1f}" for name in passes))
    print("(seconds: wall time of each notebook, kernel start included; CPU s: the kernel's user + system "
          "time over all its threads)")
    print(f"\nload average at the end: {load1} on {os.cpu_count()} cores"
          + (" (other processes were competing for the CPU: these times are longer than on an idle machine)"
             if load0 and load1 and max(load0[0], load1[0]) > 0.75 * (os.cpu_count() or 1) else ""))
    for name, stem, error in failed:
        print(f"FAILED ({name}): {stem}: {error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
