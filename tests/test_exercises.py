"""The chapters' checked exercises: every solution in a page passes its check, and the checks can fail.

Each chapter 0-9 asks the reader to write one function (a stub that returns None), then a cell passes
it to a check. This runs the solution printed in the page's "Solution" dropdown through the same
check, so a wrong solution in a page fails here; and it feeds each check the stub, a function that
raises and a function whose answer is off by one, which must be reported (never raised).
"""

import json
import math
import re
from pathlib import Path

import pytest
import torch

from lengthgen_utils.book import exercises

CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"
STUB = "return None  # replace this line with your code"
NAMES = [
    "01_retrieval_task", "02_rope_equivariance", "03_absolute_pinning", "04_carrier_kernel",
    "05_dilution_law", "05b_regime_map", "05c_what_selects_the_rule",
    "06_linear_attention_control", "07_deep_transformer", "08_implicit_bias_and_rasp_l",
    "09_encoding_zoo",
]


def exercise(name: str) -> tuple[str, str, str]:
    """(function name, check name, solution code) of the chapter's checked exercise."""
    cells = json.loads((CHAPTERS / f"{name}.ipynb").read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells]
    stubs = [i for i, s in enumerate(sources) if STUB in s]
    assert len(stubs) == 1, f"{name}: expected one exercise stub, found {len(stubs)}"
    i = stubs[0]
    fn_name = re.search(r"def (\w+)\(", sources[i]).group(1)
    assert cells[i + 1]["cell_type"] == "code", f"{name}: the check must follow the stub"
    check = re.search(rf"exercises\.(check_\w+)\({fn_name}\b", sources[i + 1])
    assert check, f"{name}: the cell after the stub must call exercises.check_*({fn_name})"
    dropdowns = sources[i + 2]
    assert ":::{admonition} Hint" in dropdowns and ":::{admonition} Solution" in dropdowns, name
    solution = dropdowns[dropdowns.index(":::{admonition} Solution") :]
    code = re.search(r"```python\n(.*?)```", solution, re.DOTALL)
    assert code, f"{name}: the Solution dropdown has no python block"
    return fn_name, check.group(1), code.group(1)


def solution_function(name: str):
    fn_name, check_name, code = exercise(name)
    namespace = {"torch": torch, "math": math}
    exec(compile(code, f"<{name} solution>", "exec"), namespace)  # noqa: S102 (the page's own code)
    return namespace[fn_name], getattr(exercises, check_name)


@pytest.mark.parametrize("name", NAMES)
def test_page_solution_passes_its_check(name):
    fn, check = solution_function(name)
    passed, message = check(fn)
    assert passed, f"{name}: {message}"
    assert message.startswith("PASS")


@pytest.mark.parametrize("name", NAMES)
def test_check_reports_the_stub_a_bug_and_a_wrong_answer(name):
    fn, check = solution_function(name)

    def bug(*args):
        raise RuntimeError("a bug in the reader's function")

    def off_by_one(*args):
        return fn(*args) + 1

    assert check(lambda *args: None) == (
        False,
        f"not written yet: fill in {exercise(name)[0]} above, then rerun both cells",
    )
    passed, message = check(bug)
    assert not passed and message.startswith("FAIL: RuntimeError"), message
    passed, message = check(off_by_one)
    assert not passed and message.startswith("FAIL"), message


def test_ape_argmax_check_on_a_given_model():
    """Chapter 3 passes its own trained heads; the check uses them instead of its default."""
    from lengthgen_utils.core.models import RetrievalHead

    fn, check = solution_function("03_absolute_pinning")
    model = RetrievalHead(pe="ape", n_models=2, seeds=(11, 12))
    assert check(fn, model)[0]
    assert not check(lambda m, L: torch.zeros(m.n_models + 1, dtype=torch.long), model)[0]


def test_every_chapter_has_one_checked_exercise_before_its_checks():
    for name in NAMES:
        cells = json.loads((CHAPTERS / f"{name}.ipynb").read_text())["cells"]
        sources = ["".join(c["source"]) for c in cells]
        stub = next(i for i, s in enumerate(sources) if STUB in s)
        checks = next(i for i, s in enumerate(sources) if s.lstrip().startswith("## Checks"))
        assert stub < checks, f"{name}: the exercise comes before the checks"
