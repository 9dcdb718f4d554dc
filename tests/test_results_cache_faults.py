"""The results cache under sharing and faults: cleanup that deletes only what it wrote, a shared cache
folder, paths from environment variables, two runs at once, and every process-wide numeric setting in
the cache key.
"""
import dataclasses
import os
import stat
from pathlib import Path

import pytest
import torch

from lengthgen_utils import _validate
from lengthgen_utils.run import cache, configs
from lengthgen_utils.tools import cli as cli


@dataclasses.dataclass(frozen=True)
class Toy:
    """A configuration for the cache tests."""

    size: int = 3


def _compute(size=3):
    return lambda: {"x": torch.arange(size, dtype=torch.float32)}


def _only_entry(folder):
    (entry,) = [p for p in Path(folder).iterdir() if p.name.endswith(".pt") and len(p.stem) == 64]
    return entry


# ================================================================ 1. cleanup that deletes what it did not write
def test_cleanup_that_deletes_what_it_did_not_write(tmp_path, monkeypatch, capsys):
    """The reported example: with ``$LENGTHGEN_CACHE`` pointing at a folder that also holds a user's checkpoint,
    ``cache clear`` deleted the checkpoint and ``cache info`` counted it. Only files that are the cache's own
    (a key-shaped name ``<64 hex>.pt`` holding the cache's header, and the cache's temporary files) are
    counted and removed; ``older_than_s`` must be a finite number >= 0."""
    folder = tmp_path / "shared"
    cache.load_or_run(Toy(), _compute(), cache=folder)
    entry = _only_entry(folder)
    ours_tmp = folder / f".{entry.stem[:16]}.abc123_x.tmp"  # what a killed write leaves
    ours_tmp.write_bytes(cache.MAGIC + b"half")
    torch.save({"w": torch.ones(2)}, folder / "checkpoint.pt")  # the user's files
    user = {folder / "checkpoint.pt": None, folder / ("ab" * 32 + ".pt"): b"a key-shaped name, not an entry",
            folder / ".editor-swap.tmp": b"someone else's temporary file", folder / "notes.txt": b"hello"}
    for path, data in user.items():
        if data is not None:
            path.write_bytes(data)
    (folder / ("cd" * 32 + ".pt")).mkdir()  # a folder with a key-shaped name: never touched, no crash
    before = {p: p.read_bytes() for p in user}
    monkeypatch.setenv("LENGTHGEN_CACHE", str(folder))
    assert cli.main(["cache", "info"]) == 0
    info = capsys.readouterr().out
    assert "1 entries" in info and "1 leftover temporary file" in info, info
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="older_than_s"):
            cache.clear(folder, older_than_s=bad)
    with pytest.raises(TypeError, match="older_than_s"):
        cache.clear(folder, older_than_s="1")
    assert entry.exists() and ours_tmp.exists()  # a refused call removed nothing
    assert cache.clear(folder, older_than_s=3600.0) == 0  # too young
    assert cache.clear(folder) == 2 and not entry.exists() and not ours_tmp.exists()
    assert {p: p.read_bytes() for p in user} == before  # every file the cache did not write is still there
    assert (folder / ("cd" * 32 + ".pt")).is_dir()
    assert cli.main(["cache", "clear"]) == 0 and "removed 0 file(s)" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in user} == before


# ================================================================ 2. a shared cache folder
def test_a_shared_cache_folder_is_readable_by_others_and_every_read_fault_recomputes(tmp_path, monkeypatch):
    """The reported examples: entries were written owner-only (mkstemp's 0600 survived the rename), so a second
    user reading a shared cache got ``PermissionError``; a cache path that is a file raised
    ``NotADirectoryError`` from deep inside a run. Entries follow the umask; a cache that cannot be read (a file
    where the folder should be, an entry that is a folder, an entry the process may not read) is reported with a
    ``RuntimeWarning`` and the result recomputed."""
    previous = os.umask(0o022)
    try:
        cache.load_or_run(Toy(), _compute(), cache=tmp_path / "a")
        assert stat.S_IMODE(_only_entry(tmp_path / "a").stat().st_mode) == 0o644
        os.umask(0o002)  # a group-shared folder
        cache.load_or_run(Toy(), _compute(), cache=tmp_path / "b")
        assert stat.S_IMODE(_only_entry(tmp_path / "b").stat().st_mode) == 0o664
        os.umask(0o077)  # a private cache stays private
        cache.load_or_run(Toy(), _compute(), cache=tmp_path / "c")
        assert stat.S_IMODE(_only_entry(tmp_path / "c").stat().st_mode) == 0o600
    finally:
        os.umask(previous)

    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("a file where the cache folder should be")
    with pytest.warns(RuntimeWarning, match="results cache"):
        payload, status = cache.load_or_run(Toy(), _compute(), cache=not_a_folder)
    assert torch.equal(payload["x"], torch.arange(3.0)) and status == "recomputed"
    assert not_a_folder.read_text() == "a file where the cache folder should be"

    folder = tmp_path / "d"
    key = cache.make_key(cache.cache_description(Toy(), None))
    cache.entry_path(folder, key).mkdir(parents=True)  # the entry's path is a folder
    with pytest.warns(RuntimeWarning, match="results cache"):
        payload, status = cache.load_or_run(Toy(), _compute(), cache=folder)
    assert torch.equal(payload["x"], torch.arange(3.0)) and status == "recomputed"

    cache.load_or_run(Toy(), _compute(), cache=tmp_path / "e")

    def unreadable(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", unreadable)
    with pytest.warns(RuntimeWarning, match="Permission denied"):
        payload, status = cache.load_or_run(Toy(), _compute(), cache=tmp_path / "e")
    assert torch.equal(payload["x"], torch.arange(3.0)) and status == "recomputed"
    monkeypatch.undo()
    assert cache.load_or_run(Toy(), _compute(), cache=tmp_path / "e")[1] == "hit"  # the entry was left alone


# ================================================================ 3. paths from environment variables
def test_paths_from_environment_variables_expand_the_home_folder(tmp_path, monkeypatch, capsys):
    """The reported example: ``LENGTHGEN_CACHE=~/lg-cache`` created a folder literally named ``~`` in the working
    directory. ``~`` is expanded in every path variable the package reads (through ``_validate.env_path``);
    a ``~user`` that names no home folder is refused naming the variable."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    monkeypatch.setenv("LENGTHGEN_CACHE", "~/lg-cache")
    assert cache.cache_dir() == home / "lg-cache"
    assert cache.load_or_run(Toy(), _compute())[1] == "miss"
    assert _only_entry(home / "lg-cache") and not (work / "~").exists()
    assert cache.cache_dir("~/elsewhere") == home / "elsewhere"  # a path argument too
    monkeypatch.setenv("LENGTHGEN_CLAIMS", "~/claims")
    assert _validate.env_path("LENGTHGEN_CLAIMS") == home / "claims"
    monkeypatch.delenv("LENGTHGEN_CLAIMS")
    assert _validate.env_path("LENGTHGEN_CLAIMS", default=work / "x") == work / "x"
    monkeypatch.setenv("LENGTHGEN_CACHE", "~no-such-user-of-this-machine/lg-cache")
    with pytest.raises(ValueError, match="LENGTHGEN_CACHE"):
        cache.cache_dir()
    assert cli.main(["cache", "info"]) == 2  # the command line says so in one line
    err = capsys.readouterr().err
    assert "LENGTHGEN_CACHE" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (work / "~no-such-user-of-this-machine").exists()


# ---------------------------------------------------------------- kind 4: two runs at once
def test_two_runs_at_once_keep_their_own_records(tmp_path, monkeypatch):
    """A book build and a test session in one checkout: each writes and reads only its own run's records;
    a record of the other run is refused by name; a second checkout's chapters write into their own book's
    folder even when the package is imported from the first checkout."""
    from lengthgen_utils.book import scoreboard

    monkeypatch.setenv(scoreboard.CLAIMS_ENV, str(tmp_path / "claims"))
    monkeypatch.setenv(scoreboard.RUN_ENV, "build-1")
    scoreboard.record_claim("C1", "reproduced", "the build's", {"n": 1}, chapter="chapters/01_retrieval_task")
    monkeypatch.setenv(scoreboard.RUN_ENV, "pytest-2")
    scoreboard.record_claim("C1", "not reproduced", "the tests'", {"n": 2}, chapter="chapters/01_retrieval_task")
    assert scoreboard.load_claims()["C1"]["summary"] == "the tests'"
    monkeypatch.setenv(scoreboard.RUN_ENV, "build-1")
    assert scoreboard.load_claims()["C1"]["summary"] == "the build's"
    stray = tmp_path / "claims" / "build-1" / "C2.json"
    stray.write_text((tmp_path / "claims" / "pytest-2" / "C1.json").read_text().replace('"C1"', '"C2"'))
    with pytest.warns(RuntimeWarning, match="C2.json.*belongs to run 'pytest-2'"):
        assert "C2" not in scoreboard.load_claims()
    # a second checkout: its chapters run in its own folder, so its records go to its own _build
    other = tmp_path / "second-checkout"
    (other / "chapters").mkdir(parents=True)
    (other / "_toc.yml").write_text("format: jb-book\nroot: intro\n")
    monkeypatch.delenv(scoreboard.CLAIMS_ENV)
    monkeypatch.chdir(other / "chapters")
    assert scoreboard.run_dir() == other / "_build" / "claims" / "build-1"


# ---------------------------------------------------------------- kind 6: process-wide numeric settings
def test_process_wide_numeric_settings_are_part_of_the_cache_key(monkeypatch):
    """A global torch setting that changes what a run computes moves the cache key, so a run under one setting
    is never served to a run under another (each setting is also pinned one by one in test_robustness.py)."""
    exp = configs.RetrievalExperiment(n_seeds=1, steps=1)

    def key():
        return cache.make_key(cache.cache_description(exp, "cpu", 1))

    before = key()
    monkeypatch.setattr(torch, "get_default_dtype", lambda: torch.float64)
    after_dtype = key()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    after_kernels = key()
    monkeypatch.setenv("LENGTHGEN_SEED", "3")
    after_seed = key()
    assert len({before, after_dtype, after_kernels, after_seed}) == 4
    assert set(cache.numeric_settings("cpu")) >= {"seed_base", "cpu_capability", "default_dtype",
                                                  "float32_matmul_precision", "flush_denormal", "mkldnn",
                                                  "deterministic"}
