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


def test_no_code_line_is_longer_than_88_columns():
    """ruff's formatter does not split long strings, so a long f-string line passes the
    formatter yet scrolls sideways in the page's code column (about 88 characters at
    1280 px)."""
    import json

    long = []
    for name in NOTEBOOKS:
        for cell in json.loads((ROOT / name).read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            for line in "".join(cell["source"]).splitlines():
                if len(line) > 88:
                    long.append(f"{name} ({cell.get('id')}): {len(line)} columns: {line[:60]!r}")
    assert not long, "code lines over 88 columns:\n" + "\n".join(long)


def test_no_cell_is_longer_than_35_lines_but_the_checks_cell():
    """A page's code comes in cells a reader takes in at once; only a chapter's final checks cell (which
    asserts every claim of the page in one place) may be longer. Move what a longer cell computes into
    the chapter's module in ``lengthgen_utils.book`` (or ``analysis`` when it is science)."""
    import json

    long = []
    for name in NOTEBOOKS:
        code = [c for c in json.loads((ROOT / name).read_text())["cells"] if c["cell_type"] == "code"]
        for i, cell in enumerate(code):
            source = "".join(cell["source"])
            is_checks = i == len(code) - 1 and "Checks(" in source
            if not is_checks and len(source.splitlines()) > 35:
                long.append(f"{name} ({cell.get('id')}): {len(source.splitlines())} lines")
    assert not long, "code cells over 35 lines outside the checks cell:\n" + "\n".join(long)
