"""Chapter 0 (the model in plain torch) and the book's schematics.

* The exercise's solution, printed in a dropdown of chapter 0 and never executed by the build, is
  correct: run here against the package's ``apply_rope``.
* The schematics in ``_static/figures/`` are self-contained SVGs (no external fonts, images or
  links: the book works offline), their text stays readable when the figure is scaled down to a
  phone's column, and every one of them is shown on some page.
"""
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest
import torch

from lengthgen_utils.core.rope import apply_rope

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "chapters" / "00_the_model.ipynb"
FIGURES = sorted((ROOT / "_static" / "figures").glob("*.svg"))
PHONE_COLUMN_PX = 360  # the content column at a 400 px window
MIN_TEXT_PX = 11  # the smallest text a schematic may show there
SVG = "{http://www.w3.org/2000/svg}"


def _markdown(path: Path) -> str:
    return "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")


def test_the_rope_exercise_solution_equals_apply_rope():
    solution = re.search(r":::\{admonition\} Solution.*?```python\n(.*?)```", _markdown(CHAPTER), re.S)
    assert solution, "chapter 0 has no solution code block for the RoPE exercise"
    d_head, base = 16, 10000.0
    namespace = {"torch": torch, "theta": base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)}
    exec(solution.group(1), namespace)  # noqa: S102 (the book's own text)
    x = torch.randn(2, 24, d_head, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(24) * 37 - 100
    torch.testing.assert_close(namespace["my_rope"](x, positions), apply_rope(x, positions))


def test_the_exercise_is_left_to_the_reader():
    """The stub the reader fills in returns nothing, and the chapter's check cell says so instead of failing."""
    cells = nbformat.read(CHAPTER, as_version=4).cells
    stub = next(c.source for c in cells if c.cell_type == "code" and c.source.startswith("def my_rope"))
    assert "return None" in stub
    checker = next(c.source for c in cells if c.cell_type == "code" and "def check_rope" in c.source)
    assert "not written yet" in checker and "PASS" in checker and "FAIL" in checker


def test_there_are_schematics():
    names = {p.stem for p in FIGURES}
    assert {"task", "rope_rotation", "pinning", "argument_map"} <= names, names


@pytest.mark.parametrize("path", FIGURES, ids=[p.stem for p in FIGURES])
def test_schematic_is_self_contained_and_readable_on_a_phone(path):
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    width = float(root.get("viewBox").split()[2])
    assert root.find(f"{SVG}title") is not None and root.find(f"{SVG}desc") is not None, "title and desc for screen readers"
    text = path.read_text()
    assert not re.search(r"(href|src)\s*=\s*\"(?!#)", text), "a schematic may not load anything from outside itself"
    assert "@import" not in text and "url(http" not in text
    for t in root.iter(f"{SVG}text"):
        px = float(t.get("font-size")) * PHONE_COLUMN_PX / width
        assert px >= MIN_TEXT_PX, f"{path.name}: {''.join(t.itertext())!r} is {px:.1f} px on a phone"


@pytest.mark.parametrize("path", FIGURES, ids=[p.stem for p in FIGURES])
def test_schematic_is_shown_on_a_page(path):
    pages = [p for p in [*ROOT.glob("*.md"), *ROOT.glob("chapters/*.ipynb")]
             if f"_static/figures/{path.name}" in (p.read_text() if p.suffix == ".md" else _markdown(p))]
    assert pages, f"{path.name} is on no page"
