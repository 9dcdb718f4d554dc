"""The command line and the environment: one way to fail, one convention, checked before any work.

* Every command (``python -m lengthgen_utils run | robustness | predict | cache`` and
  ``python -m lengthgen_utils.tools.buildtime``) answers a bad ``$LENGTHGEN_PROFILE``, ``$LENGTHGEN_SEED``,
  ``$LENGTHGEN_THREADS`` or option with one line on stderr and exit status 2, never a traceback.
* Options are checked before the work: ``robustness --output`` an existing folder, ``--timeout`` <= 0 and a
  repeated ``--seed-bases`` fail before any notebook runs (the tests run them where a notebook would
  take minutes: they return at once).
* Every ``LENGTHGEN_*`` variable treats an empty value as unset and strips surrounding spaces.
* Integers that would overflow inside torch later (a seed base past 64 bits, a thread count past 32 bits)
  are refused at the edge, naming the variable.
* A relative ``$LENGTHGEN_CACHE`` / ``$LENGTHGEN_CLAIMS`` means one folder, whatever the working directory.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lengthgen_utils import _validate
from lengthgen_utils.book import scoreboard
from lengthgen_utils.core import seeding
from lengthgen_utils.run import cache, training
from lengthgen_utils.run.profiles import get_profile

ROOT = Path(__file__).resolve().parents[1]
MAX_SEED_BASE = (2**63 - seeding.SEED_STRIDE) // seeding.SEED_STRIDE  # every effective seed fits 64 bits
MAX_THREADS = 1024
COMMANDS = {
    "run": ["-m", "lengthgen_utils", "run", "--suite", "single-head"],
    "robustness": ["-m", "lengthgen_utils", "robustness", "--chapters", "01"],
    "buildtime": ["-m", "lengthgen_utils.tools.buildtime", "--chapters", "01", "--cold-only"],
}


def _command(args, env=None, cwd=ROOT, timeout=120):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LENGTHGEN_")}
    environment.update({"PYTHONPATH": str(ROOT), "LENGTHGEN_CACHE": "off", **(env or {})})
    return subprocess.run([sys.executable, *args], env=environment, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _one_line_exit_2(out, *words):
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0], out.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


# ---------------------------------------------------------------- one command line, one way to fail
@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("variable, value", [("LENGTHGEN_PROFILE", "fast"), ("LENGTHGEN_SEED", "-1"),
                                             ("LENGTHGEN_SEED", "2000000000000"), ("LENGTHGEN_MALLOC", "fast")])
def test_every_command_refuses_a_bad_variable_in_one_line(command, variable, value):
    """Before: ``run`` gave one line, ``robustness`` and ``buildtime`` a traceback and exit 1."""
    _one_line_exit_2(_command(COMMANDS[command], {variable: value}), variable)


def test_predict_refuses_an_output_folder_in_one_line(tmp_path):
    """Before: ``predict --output <a folder>`` computed every prediction, then ``IsADirectoryError``."""
    _one_line_exit_2(_command(["-m", "lengthgen_utils", "predict", "--output", str(tmp_path)]), "--output",
                     str(tmp_path))


@pytest.mark.parametrize("options, named", [
    (["--output", "{folder}"], "--output"),
    (["--timeout", "0"], "--timeout"),
    (["--timeout", "-7"], "--timeout"),
    (["--seed-bases", "1", "1"], "--seed-bases"),
    (["--seed-bases", "2", "3", "2"], "--seed-bases"),
])
def test_robustness_checks_its_options_before_any_notebook_runs(tmp_path, options, named):
    """Before: ``--output <a folder>`` failed after every condition had run; ``--timeout 0`` or ``-7`` meant
    no timeout; ``--seed-bases 1 1`` ran one condition twice. Each is refused at once (a notebook run would
    take minutes: the timeout of this call is what proves nothing started)."""
    options = [o.format(folder=tmp_path) for o in options]
    out = _command(["-m", "lengthgen_utils", "robustness", "--chapters", "01", "--conditions", "machine", *options],
                   timeout=90)
    _one_line_exit_2(out, named)
    assert "robustness run" not in out.stdout  # the run's first line: nothing started


def test_buildtime_refuses_a_timeout_that_is_not_positive():
    _one_line_exit_2(_command(COMMANDS["buildtime"] + ["--timeout", "0"]), "--timeout")


# ---------------------------------------------------------------- one convention for every variable
@pytest.mark.parametrize("value, expected", [("", "default"), ("   ", "default"), (" quick ", "quick"),
                                             ("\tfull\n", "full")])
def test_the_profile_variable_follows_the_convention_of_every_other(monkeypatch, value, expected):
    """Before: ``LENGTHGEN_PROFILE=''`` and ``' quick '`` were errors while every other variable treated empty as
    unset and stripped spaces."""
    monkeypatch.setenv("LENGTHGEN_PROFILE", value)
    assert get_profile().name == expected


@pytest.mark.parametrize("variable, value, read, expected", [
    ("LENGTHGEN_SEED", " 3 ", lambda: seeding.seed_base(), 3),
    ("LENGTHGEN_SEED", "", lambda: seeding.seed_base(), 0),
    ("LENGTHGEN_THREADS", " 2 ", lambda: training.default_cpu_threads("single-head"), 2),
    ("LENGTHGEN_THREADS", "  ", lambda: training.default_cpu_threads("single-head"), 1),
    ("LENGTHGEN_MALLOC", " system ", lambda: training.malloc_choice(), "system"),
    ("LENGTHGEN_MALLOC", "  ", lambda: training.malloc_choice(), "keep"),
    ("LENGTHGEN_RUN_ID", "  ", lambda: scoreboard.run_id(), "interactive"),
    ("LENGTHGEN_RUN_ID", " build-1 ", lambda: scoreboard.run_id(), "build-1"),
    ("LENGTHGEN_CACHE", "  ", lambda: cache.cache_dir(), cache.REPO_ROOT / ".cache" / "lengthgen"),
    ("LENGTHGEN_CLAIMS", "  ", lambda: scoreboard.claims_dir() != Path.cwd() / "  ", True),
])
def test_every_variable_treats_empty_as_unset_and_strips_spaces(monkeypatch, variable, value, read, expected):
    monkeypatch.setenv(variable, value)
    assert read() == expected


def test_every_lengthgen_variable_is_read_through_one_function():
    """No module reads a ``LENGTHGEN_*`` variable by hand: each goes through ``_validate.env_value`` (or
    ``env_int`` / ``env_path`` built on it), so the convention cannot drift again."""
    offenders = []
    for path in (ROOT / "lengthgen_utils").rglob("*.py"):
        if path.name == "_validate.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "environ.get(" in line and any(name in line for name in (
                    "_ENV", "LENGTHGEN_")) and "OMP" not in line and "PYTHONPATH" not in line:
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, offenders


# ---------------------------------------------------------------- integers that overflow later
@pytest.mark.parametrize("value", ["2000000000000", str(2**64), str(MAX_SEED_BASE + 1)])
def test_a_seed_base_that_would_overflow_torch_is_refused_naming_the_variable(monkeypatch, value):
    """Before: ``LENGTHGEN_SEED=2000000000000`` passed, then torch failed ("Overflow when unpacking long")."""
    monkeypatch.setenv("LENGTHGEN_SEED", value)
    with pytest.raises(ValueError, match="LENGTHGEN_SEED"):
        seeding.seed_base()


def test_the_largest_seed_base_seeds_every_generator(monkeypatch):
    assert seeding.MAX_SEED_BASE == MAX_SEED_BASE and training.MAX_THREADS == MAX_THREADS
    monkeypatch.setenv("LENGTHGEN_SEED", str(MAX_SEED_BASE))
    seeding.generator(seeding.SEED_STRIDE - 1)  # the largest effective seed: no overflow


@pytest.mark.parametrize("value", [str(2**31), str(2**40), str(MAX_THREADS + 1)])
def test_a_thread_count_that_would_overflow_torch_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("LENGTHGEN_THREADS", value)
    with pytest.raises(ValueError, match="LENGTHGEN_THREADS"):
        training.default_cpu_threads("single-head")


def test_a_thread_count_argument_that_would_overflow_torch_is_refused_by_name():
    with pytest.raises(ValueError, match="num_threads"):
        with training.cpu_threads(2**31):
            pass


# ---------------------------------------------------------------- relative paths: one base
def test_a_relative_cache_and_claims_folder_mean_one_folder_from_any_working_directory(monkeypatch):
    """Before: a chapter (run in ``chapters/``) and the scoreboard (run in the book's root) resolved
    ``LENGTHGEN_CLAIMS=claims`` against their own working directories: the scoreboard found no records and
    the cache split in two. Both now resolve against the book's root."""
    monkeypatch.setenv("LENGTHGEN_CACHE", "my-cache")
    monkeypatch.setenv("LENGTHGEN_CLAIMS", "my-claims")
    seen = set()
    for folder in (ROOT, ROOT / "chapters"):
        monkeypatch.chdir(folder)
        seen.add((cache.cache_dir(), scoreboard.claims_dir()))
    assert seen == {(ROOT / "my-cache", ROOT / "my-claims")}


def test_book_root_is_the_one_base(tmp_path, monkeypatch):
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\n")
    (tmp_path / "chapters").mkdir()
    monkeypatch.chdir(tmp_path / "chapters")
    monkeypatch.setenv("LENGTHGEN_CLAIMS", "claims")
    assert _validate.book_root() == tmp_path
    assert scoreboard.claims_dir() == tmp_path / "claims"
