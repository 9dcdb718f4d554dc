"""The claims scoreboard records what a chapter's checks established, and refuses what it cannot mean."""
import pytest

from lengthgen_utils import scoreboard


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
    assert row["status"] == "reproduced in a regime" and row["key numbers"] == "top2 = 0.97; n = 3"
    assert table.set_index("claim").loc["C1", "status"] == "not run in this build"
