"""Independent single-head computations on every CPU core at once: :func:`parallel_map`.

A single head trains and evaluates on one intra-op thread
(:data:`~lengthgen_utils.run.training.CPU_THREADS`: its operations are too small to split), so on the
book's 2-core machine a chapter that trains ensemble after ensemble leaves one core idle.
:func:`parallel_map` runs independent computations (each its own ensemble, its own generators, its own
cache entry) on Python threads instead. Torch's operations release the GIL while they compute, so two
threads train two ensembles at once: ``python -m lengthgen_utils.tools.bench`` (section 2b) measures the
speed-up side by side. On the book's 2-core machine it ranged from 1.1x to 1.9x from run to run, and the
whole ``default`` book from an empty cache went from 640 s to 563 s (``running.md``).

Nothing a runner returns changes. Every operation runs on one intra-op thread (the count is pinned to
1 for the whole map, and a computation that asks for another count raises), every random draw comes
from the computation's own ``torch.Generator``, and the results cache's key does not depend on how the
work was scheduled; so each result of a single-head runner, and each cache entry, is bit for bit what a
plain loop computes (``tests/test_parallel.py`` holds the two equal). Other torch code mapped here
(an analysis that would otherwise use two threads) also runs on one thread, which can move its float
rounding by about 1e-7 against a run on two.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

import torch

from .._validate import check_device, check_int
from .training import _WORKER, default_cpu_threads, default_device


def parallel_workers(device=None) -> int:
    """How many single-head computations :func:`parallel_map` runs at once on ``device``.

    Args:
        device: where the computations run (default :func:`~lengthgen_utils.run.training.default_device`).

    Returns:
        1 on a GPU (its own parallelism is inside each operation) or when the single head's thread
        count (:func:`~lengthgen_utils.run.training.default_cpu_threads`, ``$LENGTHGEN_THREADS``) is not 1;
        else ``os.cpu_count()``.

    Raises:
        ValueError: a device this machine cannot compute on, or a bad ``$LENGTHGEN_THREADS``.
    """
    device = default_device() if device is None else check_device(device)
    if device.type != "cpu" or default_cpu_threads("single-head") != 1:
        return 1
    return max(1, os.cpu_count() or 1)


class Stopped(Exception):
    """Raised inside a worker of :func:`parallel_map` between two training steps once the map is stopping
    (another item failed, or the caller pressed Ctrl-C); the map never returns or raises it to its caller."""


def parallel_map(fn: Callable, items: Iterable, workers: int | None = None) -> list:
    """``[fn(item) for item in items]``, computed up to ``workers`` at a time on CPU threads.

    For independent single-head computations: runners such as
    :func:`~lengthgen_utils.run.runners.run_retrieval` over several experiments. Results come back in the
    order of ``items``. Called inside another map, it runs its items one by one.

    Failure and Ctrl-C: once a call raises, no further item starts, the running calls stop at their next
    training step (each trainer's step loop checks the map's stop flag), and the first exception, in the
    order of ``items``, is raised. A ``KeyboardInterrupt`` (Ctrl-C) in the caller's thread does the same
    and is raised again once every worker has ended: none keeps training in the background, and the
    process's intra-op thread count is back to what it was before the map.

    Args:
        fn: called once per item, with the item.
        items: the arguments, e.g. experiment configurations.
        workers: how many at once (an int >= 1); default :func:`parallel_workers`. With 1, a plain loop.

    Returns:
        the list of ``fn``'s results, one per item, in order.

    Raises:
        TypeError: ``fn`` is not callable, or ``workers`` is not an int.
        ValueError: ``workers`` < 1.
        RuntimeError: (from a call) a computation inside the map asked for more than one intra-op
            thread (a transformer): run those outside it.
        KeyboardInterrupt: Ctrl-C while the map ran, after its workers stopped.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable; got {type(fn).__name__}")
    items = list(items)
    workers = parallel_workers() if workers is None else check_int("workers", workers, minimum=1)
    if workers == 1 or len(items) <= 1 or getattr(_WORKER, "active", False):
        return [fn(item) for item in items]
    stopping = threading.Event()

    def stop():  # called by the trainers between two steps (training._run_steps)
        if stopping.is_set():
            raise Stopped("parallel_map is stopping: another item failed or the map was interrupted")

    def call(item):
        if stopping.is_set():
            raise Stopped("parallel_map stopped before this item started")
        _WORKER.active, _WORKER.stop = True, stop
        try:
            return fn(item)
        except BaseException:
            stopping.set()  # before this worker takes another item: nothing new starts after a failure
            raise
        finally:
            _WORKER.active, _WORKER.stop = False, None

    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # before any worker starts: no call changes it while the others run
    pool = ThreadPoolExecutor(min(workers, len(items)), thread_name_prefix="lengthgen")
    futures = []
    try:
        futures = [pool.submit(call, item) for item in items]
        wait(futures, return_when=FIRST_EXCEPTION)
    except BaseException:  # Ctrl-C in the caller's thread: stop the workers, then raise it (below)
        stopping.set()
        raise
    finally:
        if any(f.done() and not f.cancelled() and f.exception() is not None for f in futures):
            stopping.set()
        if stopping.is_set():
            for future in futures:
                future.cancel()
        while True:  # every worker ends (within one training step once stopping), even through another Ctrl-C
            try:
                pool.shutdown(wait=True, cancel_futures=True)
                break
            except KeyboardInterrupt:
                stopping.set()
        torch.set_num_threads(previous)
    errors = [f.exception() for f in futures if not f.cancelled() and f.exception() is not None]
    real = [e for e in errors if not isinstance(e, Stopped)]
    if real or errors:
        raise (real or errors)[0]
    return [future.result() for future in futures]
