"""The book's ``_ext/run_locally.py``: every chapter page, and no other, opens with the line saying how to run it."""
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from docutils import nodes
from sphinx import addnodes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "_ext"))
import run_locally  # noqa: E402


def _page(title="1. A fixed-offset retrieval task"):
    doc = nodes.document("", None)
    section = nodes.section()
    section += nodes.title(text=title)
    section += nodes.paragraph(text="Question.")
    doc += section
    return doc, section


def _app(docname, source):
    return SimpleNamespace(env=SimpleNamespace(docname=docname, doc2path=lambda name: str(ROOT / source)))


def test_a_chapter_page_gets_the_line_under_its_title():
    doc, section = _page()
    run_locally._add_line(_app("chapters/01_retrieval_task", "chapters/01_retrieval_task.ipynb"), doc)
    assert isinstance(section[0], nodes.title) and "run-locally" in section[1]["classes"]
    text = section[1].astext()
    assert "clone of the book's repository" in text and "chapters/01_retrieval_task.ipynb" in text
    assert all(command in text for command in run_locally.COMMANDS)
    assert "download button" in text and "exercises run there" in text  # a web reader's way to run them
    assert section[2].astext() == "Question."
    (link,) = section[1].findall(addnodes.pending_xref)
    assert link["reftype"] == "doc" and link["reftarget"] == "/running"


def test_other_pages_are_left_alone():
    for docname, source in (("intro", "intro.md"), ("scoreboard", "scoreboard.ipynb"), ("running", "running.md")):
        doc, section = _page()
        run_locally._add_line(_app(docname, source), doc)
        assert len(section) == 2


def test_the_readme_has_the_two_commands_the_line_names():
    readme = (ROOT / "README.md").read_text()
    assert all(command in readme for command in run_locally.COMMANDS)


def test_the_extension_is_registered():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["sphinx"]["local_extensions"]["run_locally"] == "./_ext"


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="docname"):
        run_locally.run_locally_line(None)
