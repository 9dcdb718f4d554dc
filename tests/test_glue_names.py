"""Every number a page quotes from its run comes in through myst-nb's ``glue``: a ``{glue:...}`name```
role in a markdown cell must be glued by a code cell of the same notebook (a keyword of
``glue_numbers(name=...)`` or a ``glue("name", ...)`` call), or the built page shows a warning where the
number should be (and the build goes on). Checked statically, without running anything: names are read
from the cells' sources.

A glue call whose name is an f-string (``glue(f"ch3_var{k}_weight_min", ...)``) stands for every name
its literal parts match, the ``{...}`` parts read as "anything without a space".

Names are unique across the book (a name glued by two chapters would be ambiguous for a cross-page
``{glue:}`` role), and each chapter's start with its own prefix, ``chN_`` for ``chapters/NN_...``.
"""
import ast
import json
import re
from pathlib import Path
from unittest import mock

import pytest
import torch

from lengthgen_utils.book.render import glue_numbers

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted([*ROOT.glob("chapters/*.ipynb"), ROOT / "scoreboard.ipynb"])

# {glue}`name`, {glue:text}`name:.2f`, {glue:any}`name`, {glue:figure}... (the role forms myst-nb has)
ROLE = re.compile(r"\{glue(?::[a-z]+)?\}`([^`:]+)(?::[^`]*)?`")
# the directive form: ```{glue:figure} name  /  :::{glue} name
DIRECTIVE = re.compile(r"^\s*(?:`{3,}|:{3,})\{glue(?::[a-z]+)?\}\s+(\S+)", re.M)
CALL = re.compile(r"\bglue\(\s*(f?)(['\"])(.+?)\2")


def cells(path, kind):
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == kind]


def used_names(path):
    """The glue names the notebook's markdown cells refer to."""
    names = set()
    for text in cells(path, "markdown"):
        names |= set(ROLE.findall(text)) | set(DIRECTIVE.findall(text))
    return {n.strip() for n in names}


def keyword_names(code):
    """The keyword names of every ``glue_numbers(...)`` call in one cell's source."""
    return [kw.arg for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "glue_numbers"
            for kw in node.keywords if kw.arg is not None]


def glued_patterns(path):
    """The names the notebook's code cells glue, as regular expressions (f-strings match a family)."""
    patterns = []
    for code in cells(path, "code"):
        patterns += [re.escape(name) for name in keyword_names(code)]
        for is_f, _, name in CALL.findall(code):
            if is_f:
                parts = re.split(r"\{[^{}]*\}", name)
                patterns.append("[^ ]+".join(map(re.escape, parts)))
            else:
                patterns.append(re.escape(name))
    return patterns


def prefix(path):
    match = re.match(r"(\d+)_", path.name)
    return f"ch{int(match.group(1))}_" if match else None


def test_the_glue_check_reads_the_forms_the_book_uses():
    assert ROLE.findall("a {glue:text}`ch1_x:.2f` b {glue}`ch1_y` c {glue:any}`ch1_z`") == [
        "ch1_x", "ch1_y", "ch1_z"]
    assert CALL.findall('glue("ch1_a", 1, display=False)\nglue(f"ch1_b{k}_c", 2)') == [
        ("", '"', "ch1_a"), ("f", '"', "ch1_b{k}_c")]
    assert keyword_names("glue_numbers(ch1_a=1, ch1_b=x)\nrender.glue_numbers(\n    ch1_c=2.0\n)") == [
        "ch1_a", "ch1_b", "ch1_c"]


def test_glue_numbers_glues_each_keyword_in_order_and_refuses_what_a_role_cannot_show():
    with mock.patch("myst_nb.glue") as glue:
        glue_numbers(ch1_a=1, ch1_b=0.5, ch1_c="text", ch1_d=True)
    assert glue.call_args_list == [mock.call("ch1_a", 1, display=False), mock.call("ch1_b", 0.5, display=False),
                                   mock.call("ch1_c", "text", display=False), mock.call("ch1_d", True, display=False)]
    for bad in (torch.tensor(0.5), torch.tensor(0.5).numpy()[()], [1, 2]):
        with mock.patch("myst_nb.glue") as glue, pytest.raises(TypeError, match="ch1_b must be a plain str"):
            glue_numbers(ch1_a=1, ch1_b=bad)
        glue.assert_not_called()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_glue_name_in_the_prose_is_glued_by_the_notebook(path):
    patterns = glued_patterns(path)
    missing = sorted(n for n in used_names(path) if not any(re.fullmatch(p, n) for p in patterns))
    assert not missing, f"{path.name}: markdown uses glue names no code cell glues: {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_glue_names_carry_the_chapter_prefix(path):
    want = prefix(path)
    if want is None:
        return
    names = [p for p in glued_patterns(path)] + sorted(used_names(path))
    wrong = [n for n in names if not n.replace("\\", "").startswith(want)]
    assert not wrong, f"{path.name}: glue names must start with {want!r}: {wrong}"


def test_glue_names_are_unique_across_the_book():
    seen = {}
    for path in NOTEBOOKS:
        for pattern in set(glued_patterns(path)):
            seen.setdefault(pattern, []).append(path.name)
    shared = {p: where for p, where in seen.items() if len(where) > 1}
    assert not shared, f"glue names glued by more than one notebook: {shared}"
