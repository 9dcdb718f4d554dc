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
                if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "record_claim":
                    numbers = call.args[3] if len(call.args) > 3 else None
                    numbers = dicts.get(numbers.id) if isinstance(numbers, ast.Name) else numbers
                    assert isinstance(numbers, ast.Dict), f"{path.name}: numbers not a dict literal"
                    keys[path.stem] = [k.value for k in numbers.keys]
    return keys


def test_every_key_number_the_chapters_record_has_a_label():
    keys = recorded_number_keys()
    assert len(keys) >= 9 and all(keys.values()), keys  # chapters 1-9 record a claim, each with numbers
    raw = [k for ks in keys.values() for k in ks if "_" in k or k not in scoreboard.NUMBER_LABELS and " " not in k]
    missing = [k for k in raw if k not in scoreboard.NUMBER_LABELS]
    assert not missing, f"key numbers without a label in scoreboard.NUMBER_LABELS: {missing}"
    assert "control_2x" in raw and "law_r2_ge_0.9_where_n_exp_minus_kappa_ge_20" in raw
