"""A claim on the scoreboard says under what it was made, never outlives its checks, and links only to the book.

* A chapter re-run in the same run whose checks now fail leaves no earlier "reproduced" on the scoreboard.
* Every record carries its provenance (profile, seed base, code version, thread counts, CPU kernels, torch);
  :func:`~lengthgen_utils.book.scoreboard.load_claims` leaves out, by name, a record made under other
  settings than its run's.
* Links the page builds from a record's chapter accept only the book's own pages (no ``javascript:``).
* A claim id holding ``/`` is refused by name and leaves no temporary file.
"""
from __future__ import annotations

import json
import warnings

import pytest
import torch

from lengthgen_utils.book import checks, scoreboard
from lengthgen_utils.run.cache import code_fingerprint

CHAPTER = "chapters/99_example"


@pytest.fixture
def run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(scoreboard.CLAIMS_ENV, str(tmp_path))
    monkeypatch.setenv(scoreboard.RUN_ENV, "test-run")
    monkeypatch.setenv("LENGTHGEN_PROFILE", "quick")
    for variable in ("LENGTHGEN_SEED", "LENGTHGEN_THREADS", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(variable, raising=False)
    return tmp_path / "test-run"


def _checks_cell(value: float):
    """A chapter's checks cell: one evidence check (value >= 0.9), then the claim it supports."""
    c = checks.Checks(CHAPTER)
    c.at_least("accuracy", torch.tensor(value), 0.9, evidence_for="C1")
    c.finish()
    c.record_claim("C1", "reproduced", "s", {"acc": value})


# ---------------------------------------------------------------- a claim never outlives its checks
def test_a_failed_rerun_leaves_no_earlier_pass_on_the_scoreboard(run_folder):
    """Before: the re-run's checks cell raised before ``record_claim``, so the first run's "reproduced" stayed."""
    _checks_cell(0.95)
    assert scoreboard.load_claims()["C1"]["status"] == "reproduced"
    with pytest.raises(AssertionError):
        _checks_cell(0.5)  # the same chapter, re-run in the same run: its check fails
    assert "C1" not in scoreboard.load_claims()
    table = scoreboard.scoreboard_table().set_index("claim")
    assert table.loc["C1", "status"] == "not run in this build"
    _checks_cell(0.97)  # passing again, it records the claim again
    assert scoreboard.load_claims()["C1"]["status"] == "reproduced"


def test_another_chapters_claims_stay_when_a_chapter_is_rerun(run_folder):
    scoreboard.record_claim("C4", "reproduced", "s", {}, chapter="chapters/04_carrier_kernel")
    _checks_cell(0.95)
    assert set(scoreboard.load_claims()) == {"C1", "C4"}


# ---------------------------------------------------------------- provenance
def test_every_record_says_under_what_it_was_made(run_folder, monkeypatch):
    monkeypatch.setenv("LENGTHGEN_SEED", "3")
    monkeypatch.setenv("LENGTHGEN_THREADS", "2")
    scoreboard.record_claim("C1", "reproduced", "s", {}, chapter=CHAPTER)
    record = json.loads((run_folder / "C1.json").read_text())
    made = record["provenance"]
    assert made["profile"] == "quick" and made["seed_base"] == 3 and made["code"] == code_fingerprint()
    assert made["threads"] == {"single-head": 2, "transformer": 2}
    assert made["torch"] == torch.__version__ and made["cpu_kernels"] == "native"


@pytest.mark.parametrize("variable, made, now", [("LENGTHGEN_SEED", "3", "0"), ("LENGTHGEN_PROFILE", "quick", "default"),
                                                 ("LENGTHGEN_THREADS", "2", "1"),
                                                 ("ATEN_CPU_CAPABILITY", "default", "avx2")])
def test_a_record_made_under_other_settings_is_left_out_by_name(run_folder, monkeypatch, variable, made, now):
    """Before: a record made under ``LENGTHGEN_SEED=3`` was shown under seed base 0 without a word."""
    monkeypatch.setenv(variable, made)
    scoreboard.record_claim("C1", "reproduced", "s", {}, chapter=CHAPTER)
    monkeypatch.setenv(variable, now)
    with pytest.warns(RuntimeWarning, match="other settings") as caught:
        assert scoreboard.load_claims() == {}
    assert repr(now) in str(caught[0].message) or now in str(caught[0].message)
    monkeypatch.setenv(variable, made)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert set(scoreboard.load_claims()) == {"C1"}


def test_a_record_from_other_code_or_without_provenance_is_left_out(run_folder):
    scoreboard.record_claim("C1", "reproduced", "s", {}, chapter=CHAPTER)
    path = run_folder / "C1.json"
    record = json.loads(path.read_text())
    record["provenance"]["code"] = "0" * 16
    path.write_text(json.dumps(record))
    with pytest.warns(RuntimeWarning, match="code"):
        assert scoreboard.load_claims() == {}
    del record["provenance"]
    path.write_text(json.dumps(record))
    with pytest.warns(RuntimeWarning, match="no provenance"):
        assert scoreboard.load_claims() == {}


def test_the_scoreboard_page_states_the_seed_base_and_code_version(run_folder):
    scoreboard.record_claim("C1", "reproduced", "s", {}, chapter=CHAPTER)
    html = scoreboard.scoreboard_html(scoreboard.scoreboard_table())
    assert "Seed base 0" in html and code_fingerprint() in html


# ---------------------------------------------------------------- links and claim ids
@pytest.mark.parametrize("chapter", ["javascript:alert(1)", "JavaScript:alert(1)//x", "https://example.com/x",
                                     "../../etc/passwd", "chapters/04_x\" onmouseover=\"alert(1)",
                                     "data:text/html,<b>x</b>", "//example.com/x"])
def test_links_from_record_data_accept_only_the_books_own_pages(run_folder, chapter):
    """Before: ``html.escape`` kept a ``javascript:`` chapter string as the link's address."""
    name, page = scoreboard.chapter_link(chapter)
    assert page == ""
    with pytest.raises(ValueError, match="chapter"):
        scoreboard.record_claim("C1", "reproduced", "s", {}, chapter=chapter)
    table = scoreboard.scoreboard_table({"C1": {"claim": "C1", "status": "reproduced", "chapter": chapter,
                                                "summary": "s", "numbers": {}, "profile": "quick"}})
    html = scoreboard.scoreboard_html(table)
    assert "href=" not in html  # the chapter string is shown as text, never as an address
    assert scoreboard.chapter_link("chapters/04_carrier_kernel") == ("ch. 4", "chapters/04_carrier_kernel.html")


@pytest.mark.parametrize("claim", ["X:a/b", "X:../../escape", "X:", "X:a\\b", "X:a b"])
def test_a_claim_id_that_is_no_file_name_is_refused_by_name_and_leaves_no_tmp(run_folder, claim):
    """Before: ``X:a/b`` failed with a bare ``FileNotFoundError`` and left a ``.tmp`` file."""
    with pytest.raises(ValueError, match="claim must be"):
        scoreboard.record_claim(claim, "reproduced", "s", {})
    assert not list(run_folder.parent.rglob("*.tmp"))
    scoreboard.record_claim("X:zoo", "reproduced", "s", {})
    assert not list(run_folder.rglob("*.tmp"))
