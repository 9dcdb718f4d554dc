"""The claims scoreboard records what a chapter's checks established, and refuses what it cannot mean."""
import ast
from pathlib import Path

import nbformat
import pytest

from lengthgen_utils.book import scoreboard


def test_record_and_load_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("LENGTHGEN_CLAIMS", str(tmp_path))
    monkeypatch.setenv("LENGTHGEN_PROFILE", "quick")
    assert scoreboard.load_claims() == {}
    scoreboard.record_claim("C1", "reproduced", "RoPE 1.00 to 4x; APE at chance from 2x", {"rope_4x": 1.0},
                            chapter="chapters/01_retrieval_task")
    scoreboard.record_claim("C1", "reproduced in a regime", "overwritten by a later record", {})
    scoreboard.record_claim("X:zoo", "not reproduced", "beyond the paper", {"n": 3})
    claims = scoreboard.load_claims()
    assert set(claims) == {"C1", "X:zoo"}
    assert claims["C1"]["status"] == "reproduced in a regime" and claims["C1"]["profile"] == "quick"
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("claim, status, numbers, error", [
    ("C9", "reproduced", {}, ValueError), ("C1", "done", {}, ValueError),
    ("C1", "reproduced", {"x": float("nan")}, ValueError), ("C1", "reproduced", {"x": object()}, TypeError),
])
def test_bad_records_are_refused(tmp_path, monkeypatch, claim, status, numbers, error):
    monkeypatch.setenv("LENGTHGEN_CLAIMS", str(tmp_path))
    with pytest.raises(error):
        scoreboard.record_claim(claim, status, "s", numbers)


def test_scoreboard_table_has_a_row_per_claim_and_says_what_was_not_run(tmp_path, monkeypatch):
    monkeypatch.setenv("LENGTHGEN_CLAIMS", str(tmp_path))
    scoreboard.record_claim("C4", "reproduced in a regime", "low rank only where rank is not forced",
                            {"top2": 0.97, "n": 3}, chapter="chapters/04_carrier_kernel")
    scoreboard.record_claim("X:zoo", "reproduced", "beyond the paper", {"encodings": 10})
    table = scoreboard.scoreboard_table()
    assert list(table["claim"]) == list(scoreboard.CLAIMS) + ["X:zoo"]
    row = table.set_index("claim").loc["C4"]
    assert row["status"] == "reproduced in a regime" and row["key numbers"] == "top2: 0.97\nn: 3"
    assert (row["chapter"], row["chapter page"]) == ("ch. 4", "chapters/04_carrier_kernel.html")
    assert table.set_index("claim").loc["C1", "status"] == "not run in this build"


def test_a_claims_halves_are_rows_under_it_each_with_its_own_status(tmp_path, monkeypatch):
    monkeypatch.setenv("LENGTHGEN_CLAIMS", str(tmp_path))
    scoreboard.record_claim("C4.low rank", "reproduced in a regime", "only under decay", {"n": 1})
    scoreboard.record_claim("C4.aligned", "reproduced", "implicit", {"n": 1})
    scoreboard.record_claim("X:zoo", "reproduced", "beyond the paper", {"n": 1})
    table = scoreboard.scoreboard_table()
    claims = list(table["claim"])
    assert claims[claims.index("C4"):claims.index("C5")] == ["C4", "C4.aligned", "C4.low rank"]
    assert claims[-1] == "X:zoo" and "C1.content-aware head" not in claims  # a half shows once recorded
    row = table.set_index("claim").loc["C4.aligned"]
    assert row["status"] == "reproduced" and row["the paper says"] == scoreboard.SUBCLAIMS["C4.aligned"]
    with pytest.raises(ValueError, match="half"):
        scoreboard.record_claim("C4.tiny", "reproduced", "s", {"n": 1})


def test_scoreboard_html_has_four_columns_a_chapter_link_and_the_profile_once(tmp_path, monkeypatch):
    monkeypatch.setenv("LENGTHGEN_CLAIMS", str(tmp_path))
    monkeypatch.setenv("LENGTHGEN_PROFILE", "quick")
    scoreboard.record_claim("C4", "not reproduced", "a < b & c", {"law_r2_ge_0.9_where_n_exp_minus_kappa_ge_20": "3/4",
                            "auc_top2_range": [0.4, 0.6]}, chapter="chapters/04_carrier_kernel")
    html = scoreboard.scoreboard_html(scoreboard.scoreboard_table())
    assert html.count("<th ") == 4 and html.count("<tr>") == 1 + len(scoreboard.CLAIMS)
    assert '<a href="chapters/04_carrier_kernel.html">ch. 4</a>' in html
    assert "a &lt; b &amp; c" in html and "<li>heads with R² ≥ 0.9 where n e^-κ ≥ 20: 3/4</li>" in html
    assert "<li>AUC of top-2 kept vs the nulls, lowest / highest: 0.4 / 0.6</li>" in html
    assert html.count("quick") == 1 and "profile of this build" in html
    assert "background-color:#f8d7d7" in html and "overflow-x:auto" in html


def test_unknown_number_keys_are_humanised():
    assert scoreboard.number_label("law_r2_ge_0.9_where_n_le_1") == "law R² ≥ 0.9 where n ≤ 1"
    assert scoreboard.number_label("APE at 2x") == "APE at 2x"
    assert scoreboard._fmt(2.5e-07) == "2.5e-7" and scoreboard._fmt(None) == "none"
    assert scoreboard._fmt({"10": 0.5, "1e+04": 0.25}) == "10 → 0.5, 1e+04 → 0.25"


def record_claim_call(call: ast.Call) -> bool:
    """A call of ``record_claim`` or of ``check.record_claim``."""
    return getattr(call.func, "id", getattr(call.func, "attr", "")) == "record_claim"


def recorded_number_keys() -> dict[str, list[str]]:
    """Every key number a chapter records, read from the notebooks' source: the keys of the dict literal
    passed to ``record_claim`` (or of the dict literal last assigned to the name passed)."""
    keys = {}
    for path in sorted((Path(__file__).resolve().parents[1] / "chapters").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code" or "record_claim(" not in cell.source:
                continue
            tree = ast.parse(cell.source)
            dicts = {t.id: node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                     and isinstance(node.value, ast.Dict) for t in node.targets if isinstance(t, ast.Name)}
            for call in ast.walk(tree):
                if isinstance(call, ast.Call) and record_claim_call(call):
                    numbers = call.args[3] if len(call.args) > 3 else None
                    numbers = dicts.get(numbers.id) if isinstance(numbers, ast.Name) else numbers
                    assert isinstance(numbers, ast.Dict), f"{path.name}: numbers not a dict literal"
                    keys[path.stem] = [k.value for k in numbers.keys]
    return keys


def test_every_key_number_the_chapters_record_has_a_label():
    keys = recorded_number_keys()
    assert len(keys) >= 9 and all(keys.values()), keys  # chapters 1-4, 5b, 6-9 record a claim, each with numbers
    raw = [k for ks in keys.values() for k in ks if "_" in k or k not in scoreboard.NUMBER_LABELS and " " not in k]
    missing = [k for k in raw if k not in scoreboard.NUMBER_LABELS]
    assert not missing, f"key numbers without a label in scoreboard.NUMBER_LABELS: {missing}"
    assert "control_2x" in raw and "gradual_share_decayed_small_bases" in raw


def _checks(**passed):
    """Check records as Checks.record writes them: name -> passed (a name ending in '_code' is a code check)."""
    return [{"name": n, "passed": p, "kind": "code" if n.endswith("_code") else "evidence"} for n, p in passed.items()]


@pytest.mark.parametrize("evidence, passed, status", [
    ({"for": ["rope holds"]}, {"rope holds": True}, "reproduced"),
    ({"for": ["rope holds"], "against": ["base 10: flat"]}, {"rope holds": True, "base 10: flat": True},
     "reproduced in a regime"),
    ({"against": ["cliff at alias", "cliff share"]}, {"cliff at alias": True, "cliff share": True},
     "not reproduced"),
    ({"for": [], "against": []}, {"x": True}, scoreboard.UNDECIDED),
    # evidence that fails gives another status than the same record with it passing
    ({"for": ["rope holds"]}, {"rope holds": False}, scoreboard.UNDECIDED),
    ({"for": ["rope holds"], "against": ["base 10: flat"]}, {"rope holds": False, "base 10: flat": True},
     "not reproduced"),
    ({"for": ["rope holds"], "against": ["base 10: flat"]}, {"rope holds": True, "base 10: flat": False},
     "reproduced"),
    ({"against": ["cliff at alias", "cliff share"]}, {"cliff at alias": True, "cliff share": False},
     scoreboard.UNDECIDED),
    # a name is a name: no pattern
    ({"for": ["rope holds"]}, {"rope holds": True, "rope holds too": False}, "reproduced"),
])
def test_the_status_rule(evidence, passed, status):
    assert scoreboard.claim_status(evidence, _checks(**passed)) == status


def test_the_status_rule_is_one_table_over_both_sides():
    assert set(scoreboard.STATUS_RULE.values()) == set(scoreboard.STATUSES) | {scoreboard.UNDECIDED}
    assert len(scoreboard.STATUS_RULE) == 4


@pytest.mark.parametrize("evidence, error, match", [
    ({"for": ["nothing like it"]}, ValueError, "names no evidence check"),
    ({"for": ["identity_code"]}, ValueError, "names no evidence check"),  # code checks are not evidence
    ({"for": ["*"]}, ValueError, "names no evidence check"),  # no patterns: a check is named
    ({"for": ["a"], "against": ["a"]}, ValueError, "both for and against"),
    ({"pro": ["a"]}, ValueError, "evidence roles"),
    ({"for": "a"}, TypeError, "list of check names"),
    (["a"], TypeError, "must be a dict"),
])
def test_evidence_that_names_nothing_or_is_malformed_is_refused(evidence, error, match):
    with pytest.raises(error, match=match):
        scoreboard.claim_status(evidence, _checks(a=True, identity_code=True))


def _chapter_checks(tmp_path, monkeypatch, passed: dict, chapter="chapters/04_carrier_kernel"):
    from lengthgen_utils.book.checks import Checks

    monkeypatch.setenv("LENGTHGEN_CLAIMS", str(tmp_path))
    monkeypatch.setenv("LENGTHGEN_RUN_ID", "t-1")
    check = Checks(chapter)
    for name, ok in passed.items():
        check.holds(name, ok, code=name.endswith("_code"))
    try:
        check.finish()
    except AssertionError:
        pass  # a failed check is written all the same
    return chapter


def test_record_claim_derives_the_status_from_the_checks_the_chapter_wrote(tmp_path, monkeypatch):
    chapter = _chapter_checks(tmp_path, monkeypatch, {"aligned": True, "base 10: not low rank": True,
                                                      "kernel_code": True})
    scoreboard.record_claim("C4", "reproduced in a regime", "s", {"n": 1}, chapter=chapter,
                            evidence={"for": ["aligned"], "against": ["base 10: not low rank"]})
    record = scoreboard.load_claims()["C4"]
    assert (record["status"], record["stated"], record["derived"]) == ("reproduced in a regime",) * 2 + (True,)
    assert record["evidence"] == [{"name": "aligned", "role": "for", "passed": True},
                                  {"name": "base 10: not low rank", "role": "against", "passed": True}]


def test_checks_record_the_claim_from_memory_and_only_after_finish(tmp_path, monkeypatch):
    """A chapter records its claim from its Checks object: the evidence is the checks tagged for or against the
    claim where they were made, the status derives from them in memory (the file finish wrote is not read back),
    never before finish, and never after a finish that raised."""
    from lengthgen_utils.book.checks import Checks

    monkeypatch.setenv("LENGTHGEN_CLAIMS", str(tmp_path))
    monkeypatch.setenv("LENGTHGEN_RUN_ID", "t-memory")
    check = Checks("chapters/04_carrier_kernel")
    check.at_least("aligned", 0.9, 0.5, evidence_for=("C4", "C4.aligned"))
    check.rate_beats("base 10: not low rank", [True] * 5, [False] * 5, 0.05, against="untrained heads",
                     evidence_against="C4")
    check.at_most("unrelated", 0.1, 0.5)
    check.holds("kernel_code", True, code=True)
    with pytest.raises(RuntimeError, match="call check.finish"):
        check.record_claim("C4", "reproduced in a regime", "s", {"n": 1})
    check.finish()
    assert [(r["for"], r["against"]) for r in check.results] == [(["C4", "C4.aligned"], []), ([], ["C4"]),
                                                                  ([], []), ([], [])]
    scoreboard.checks_path(check.chapter).unlink()  # what finish wrote is not needed
    check.record_claim("C4", "reproduced in a regime", "s", {"n": 1})
    check.record_claim("C4.aligned", "reproduced", "s", {"n": 1})
    claims = scoreboard.load_claims()
    record = claims["C4"]
    assert (record["status"], record["derived"], record["chapter"]) == ("reproduced in a regime", True, check.chapter)
    assert [(e["name"], e["role"]) for e in record["evidence"]] == [("aligned", "for"),
                                                                    ("base 10: not low rank", "against")]
    assert [e["name"] for e in claims["C4.aligned"]["evidence"]] == ["aligned"]
    with pytest.raises(ValueError, match="no check is tagged"):  # a claim no check bears on
        check.record_claim("C5", "reproduced", "s", {"n": 1})
    failing = Checks("chapters/04_carrier_kernel")
    failing.at_least("aligned", 0.1, 0.5, evidence_for="C4")
    with pytest.raises(AssertionError):
        failing.finish()
    with pytest.raises(RuntimeError, match="every check passed"):
        failing.record_claim("C4", "reproduced", "s", {"n": 1})
    assert "C4" not in scoreboard.load_claims()  # the failed finish forgot the chapter's earlier claim


@pytest.mark.parametrize("tags, error, match", [
    (dict(evidence_for="C99"), ValueError, "evidence_for: claim must be one of"),
    (dict(evidence_against=("C4", "X:a/b")), ValueError, "evidence_against: claim must be one of"),
    (dict(evidence_for="C4", evidence_against="C4"), ValueError, "both for and against"),
    (dict(evidence_for="C4", code=True), TypeError, "code check"),
    (dict(evidence_on="C4"), TypeError, "evidence_on"),
    (dict(evidence_for=4), TypeError, "evidence_for must be a claim id or a tuple"),
    (dict(evidence_for=None), TypeError, "evidence_for must be a claim id or a tuple"),
])
def test_a_bad_tag_is_refused_where_the_check_is_made(tags, error, match):
    from lengthgen_utils.book.checks import Checks

    with pytest.raises(error, match=match):
        Checks("chapters/04_carrier_kernel").at_least("aligned", 0.9, 0.5, **tags)


def test_a_record_whose_evidence_fails_shows_the_derived_status_and_raises(tmp_path, monkeypatch):
    chapter = _chapter_checks(tmp_path, monkeypatch, {"aligned": True, "base 10: not low rank": False})
    with pytest.raises(ValueError, match="states 'reproduced in a regime' but its evidence gives 'reproduced'"):
        scoreboard.record_claim("C4", "reproduced in a regime", "s", {"n": 1}, chapter=chapter,
                                evidence={"for": ["aligned"], "against": ["base 10: not low rank"]})
    table = scoreboard.scoreboard_table().set_index("claim")
    assert table.loc["C4", "status"] == "reproduced (the chapter states: reproduced in a regime)"
    assert "background-color:#d8f0d8" in scoreboard.scoreboard_html(table.reset_index())


def test_evidence_needs_the_chapter_and_its_checks_of_this_run(tmp_path, monkeypatch):
    chapter = _chapter_checks(tmp_path, monkeypatch, {"aligned": True})
    with pytest.raises(ValueError, match="give chapter="):
        scoreboard.record_claim("C4", "reproduced", "s", {"n": 1}, evidence={"for": ["aligned"]})
    with pytest.raises(ValueError, match="call check.finish"):
        scoreboard.record_claim("C1", "reproduced", "s", {"n": 1}, chapter="chapters/01_retrieval_task",
                                evidence={"for": ["aligned"]})
    monkeypatch.setenv("LENGTHGEN_RUN_ID", "t-2")  # another run: chapter 4's checks are not this run's
    with pytest.raises(ValueError, match="call check.finish"):
        scoreboard.record_claim("C4", "reproduced", "s", {"n": 1}, chapter=chapter, evidence={"for": ["aligned"]})


def test_every_chapter_names_its_evidence():
    """Chapters 1-4, 5b, 5c and 6-9 record claims whose status derives from checks tagged where they are made
    (``evidence_for=`` / ``evidence_against=``, literal claim ids): every claim a chapter records has a tagged
    check, and every tag names a claim the chapter records. Chapter 5b records C4 (and its two halves), C5 and
    C1's scope from the regime map, chapter 4 its alias finding beyond the paper, chapter 5c what selects the
    rule (beyond the paper), chapter 5 nothing."""
    named, tagged = {}, {}
    for path in sorted((Path(__file__).resolve().parents[1] / "chapters").glob("0[1-9]*_*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code" or "check" not in cell.source:
                continue
            for call in ast.walk(ast.parse(cell.source)):
                if isinstance(call, ast.Call) and record_claim_call(call):
                    assert not call.keywords, f"{path.stem}: record_claim takes no evidence= (tag the checks)"
                    named.setdefault(path.stem, []).append(call.args[0].value)
                for k in getattr(call, "keywords", []) if isinstance(call, ast.Call) else []:
                    if k.arg in ("evidence_for", "evidence_against"):
                        value = ast.literal_eval(k.value)
                        tagged.setdefault(path.stem, set()).update([value] if isinstance(value, str) else value)
    known = {"01_retrieval_task", "02_rope_equivariance", "03_absolute_pinning", "04_carrier_kernel",
             "05b_regime_map", "05c_what_selects_the_rule", "06_linear_attention_control", "07_deep_transformer",
             "08_implicit_bias_and_rasp_l", "09_encoding_zoo"}  # a new chapter with a claim joins without a change here
    assert known <= set(named), named
    assert {stem: set(claims) for stem, claims in named.items()} == tagged
    assert named["05b_regime_map"] == ["C4", "C1.content-aware head", "C4.aligned", "C4.low rank", "C5"]
    assert named["05c_what_selects_the_rule"] == ["X:selection"]
    assert named["04_carrier_kernel"] == ["X:aliases"] and "05_dilution_law" not in named
