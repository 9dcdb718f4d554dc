"""Ctrl-C and failing workers: the work stops promptly, nothing keeps running, nothing is reported wrongly.

* :func:`~lengthgen_utils.run.parallel.parallel_map`: one Ctrl-C stops the running ensembles within a
  training step, no worker thread is left training, the intra-op thread count is restored, and the
  ``KeyboardInterrupt`` reaches the caller (the process exits without "terminate called ..."). Once one
  item has failed, no further item starts and the running ones stop; the failure is what is raised.
* ``python -m lengthgen_utils.tools.buildtime`` and ``python -m lengthgen_utils robustness``: Ctrl-C stops
  the run at once (not "this chapter failed" and on to the next notebook), and leaves no kernel running.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import nbformat
import pytest
import torch

from lengthgen_utils.core.models import RetrievalHead
from lengthgen_utils.core.tasks import FixedOffsetRetrieval
from lengthgen_utils.run.parallel import parallel_map
from lengthgen_utils.run.training import train

ROOT = Path(__file__).resolve().parents[1]


def _environment(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LENGTHGEN_")}
    env.update({"PYTHONPATH": str(ROOT), "LENGTHGEN_CACHE": "off", "LENGTHGEN_PROFILE": "quick", **extra})
    return env


# ---------------------------------------------------------------- parallel_map
INTERRUPTED_MAP = textwrap.dedent("""
    import os, signal, sys, threading, time
    import torch
    from lengthgen_utils.core.models import RetrievalHead
    from lengthgen_utils.core.tasks import FixedOffsetRetrieval
    from lengthgen_utils.run.parallel import parallel_map
    from lengthgen_utils.run.training import train

    # Ctrl-C raises KeyboardInterrupt here even when this process was started from a background job, whose
    # shell hands it SIGINT ignored (Python then installs no handler, and the test would wait forever)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started, sent = threading.Event(), []

    def ensemble(seed):  # far longer than the test waits: only a stop ends it
        model = RetrievalHead(16, n_models=2, seeds=[seed, seed + 10])
        train(model, FixedOffsetRetrieval(16, 3), steps=10**6, batch_size=32, device="cpu",
              callback=lambda step, loss: started.set())
        return seed

    def ctrl_c():
        started.wait(120)
        time.sleep(0.5)
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    before = torch.get_num_threads()
    threading.Thread(target=ctrl_c, daemon=True).start()
    try:
        parallel_map(ensemble, range(4), workers=2)
        print("RESULT", {"finished": True})
    except KeyboardInterrupt:
        alive = [t.name for t in threading.enumerate() if t.name.startswith("lengthgen") and t.is_alive()]
        print("RESULT", {"finished": False, "seconds": time.perf_counter() - sent[0], "alive": alive,
                         "threads": torch.get_num_threads(), "before": before})
        sys.exit(130)
""")


def test_one_ctrl_c_stops_parallel_map_within_a_step_and_leaves_nothing_running():
    """Before: the first Ctrl-C returned only when the running ensembles had finished (here: never within the
    test), a second left a worker training and the thread count at 1."""
    out = subprocess.run([sys.executable, "-c", INTERRUPTED_MAP], env=_environment(), cwd=ROOT,
                         capture_output=True, text=True, timeout=240)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT")]
    assert lines, (out.returncode, out.stdout[-2000:], out.stderr[-3000:])
    result = eval(lines[-1].split(" ", 1)[1])  # a dict literal printed by the script
    assert result["finished"] is False
    assert result["seconds"] < 10, result  # a step of these heads takes milliseconds; 10 s leaves room for load
    assert result["alive"] == [], result
    assert result["threads"] == result["before"], result
    assert out.returncode == 130, (out.returncode, out.stderr[-2000:])
    assert "terminate called" not in out.stderr, out.stderr[-2000:]
    print(f"\nparallel_map: KeyboardInterrupt reached the caller {result['seconds']:.2f} s after Ctrl-C")


def test_no_item_starts_after_one_failed_and_the_running_ones_stop():
    """Before: a failing item's error came back, but six more items started after it and the running one
    trained to its end."""
    started, steps_done, training = set(), [], threading.Event()
    lock = threading.Lock()

    def step(number, loss):
        steps_done.append(number)
        training.set()

    def item(i):
        with lock:
            started.add(i)
        if i == 0:  # fails while item 1 is training
            assert training.wait(60)
            raise ValueError("item 0 failed")
        if i == 1:
            model = RetrievalHead(16, n_models=1, seeds=[1])
            train(model, FixedOffsetRetrieval(16, 3), steps=3000, batch_size=32, device="cpu", callback=step)
        return i

    before = torch.get_num_threads()
    start = time.perf_counter()
    with pytest.raises(ValueError, match="item 0 failed"):
        parallel_map(item, range(8), workers=2)
    assert started == {0, 1}, started
    assert 1 <= len(steps_done) < 3000, "the running item trained to its end after another had failed"
    assert torch.get_num_threads() == before
    assert not [t for t in threading.enumerate() if t.name.startswith("lengthgen") and t.is_alive()]
    print(f"\nstarted {sorted(started)}, item 1 stopped after {len(steps_done)} of 3000 steps, "
          f"{time.perf_counter() - start:.2f} s")


def test_the_first_failure_in_item_order_is_raised():
    def item(i):
        if i in (1, 2):
            raise RuntimeError(f"item {i}")
        return i

    with pytest.raises(RuntimeError, match="item 1"):
        parallel_map(item, range(3), workers=3)
    assert parallel_map(lambda i: i * i, range(5), workers=2) == [0, 1, 4, 9, 16]


# ---------------------------------------------------------------- buildtime and robustness
def _notebook(path: Path, source: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


TOOL = textwrap.dedent("""
    import sys
    from pathlib import Path
    from lengthgen_utils.tools import buildtime, robustness
    notebooks = [Path(p) for p in sys.argv[2:]]
    if sys.argv[1] == "buildtime":
        buildtime.toc_notebooks = lambda root=None: notebooks
        sys.exit(buildtime.main(["--cold-only", "--profile", "quick", "--timeout", "300"]))
    robustness.toc_notebooks = lambda root=None: notebooks
    robustness.REPO_ROOT = notebooks[0].parent  # the conditions' caches go to the test's folder
    sys.exit(robustness.main(["--profile", "quick", "--conditions", "machine", "threads=1", "--timeout", "300"]))
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (ended, not yet reaped) counts as ended
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("tool", ["buildtime", "robustness"])
def test_ctrl_c_stops_the_tool_at_once_and_leaves_no_kernel(tmp_path, tool):
    """Before: nbclient shut the kernel down under the cell, the tool recorded "this chapter failed"
    (``AssertionError``) and ran the next notebook."""
    first = _notebook(tmp_path / "a_first.ipynb", textwrap.dedent(f"""
        import os, time
        from pathlib import Path
        Path({str(tmp_path / 'kernel.pid')!r}).write_text(str(os.getpid()))
        time.sleep(300)
    """))
    second = _notebook(tmp_path / "b_second.ipynb",
                       f"from pathlib import Path\nPath({str(tmp_path / 'second.ran')!r}).write_text('yes')")
    proc = subprocess.Popen([sys.executable, "-c", TOOL, tool, str(first), str(second)], env=_environment(),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        marker = tmp_path / "kernel.pid"
        deadline = time.monotonic() + 180
        while not marker.is_file() or not marker.read_text():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the first notebook's kernel never started"
            time.sleep(0.2)
        kernel = int(marker.read_text())
        time.sleep(0.5)
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        stdout, stderr = proc.communicate(timeout=60)
        seconds = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, stdout[-2000:], stderr[-2000:])
    assert "interrupted" in stderr and "Traceback" not in stderr, stderr[-2000:]
    assert "FAIL" not in stdout and "error" not in stdout.split("interrupted")[0].lower(), stdout[-2000:]
    assert not (tmp_path / "second.ran").exists(), "the next notebook ran after Ctrl-C"
    deadline = time.monotonic() + 20
    while _alive(kernel) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(kernel), f"the kernel {kernel} still runs after the tool returned"
    print(f"\n{tool}: stopped {seconds:.1f} s after Ctrl-C; exit status {proc.returncode}")
