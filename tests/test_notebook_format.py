"""The chapters' code is formatted to the book's column width (88 characters) by ruff's formatter,
which reads notebooks cell by cell. Run ``ruff format --line-length 88 chapters scoreboard.ipynb``
to fix a failure."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(str(p.relative_to(ROOT)) for p in [*ROOT.glob("chapters/*.ipynb"), ROOT / "scoreboard.ipynb"])


def test_there_are_notebooks_to_check():
    assert len(NOTEBOOKS) >= 11, NOTEBOOKS


def test_notebook_code_is_formatted_to_88_columns():
    done = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", "--line-length", "88", *NOTEBOOKS],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, (
        "notebooks not formatted (run `ruff format --line-length 88 chapters scoreboard.ipynb`):\n"
        + done.stdout[-3000:] + done.stderr[-2000:])
