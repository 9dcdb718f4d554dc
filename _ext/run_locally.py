"""Sphinx extension: one line at the top of every chapter page saying how to run that chapter locally.

Each page under ``chapters/`` gets, right under its title, a paragraph (class ``run-locally``) that
names the steps: a clone of the book's repository, the README's two commands, and the chapter's own
notebook to open in Jupyter (or the page's download button), where the exercises run, with a link to the page "How to run this yourself" (``running``). The
line is added to the parsed page, so no notebook carries it and a new chapter gets it without an
edit. The chapters' pages are found by their document name (``chapters/...``).
"""
import os

from docutils import nodes
from sphinx import addnodes

PREFIX = "chapters/"
COMMANDS = ("pip install -r requirements.txt && jupyter-book build .", "pip install -r requirements.txt && pytest")


def run_locally_line(docname: str, source_suffix: str = ".ipynb") -> nodes.paragraph:
    """The paragraph for the page ``docname`` (e.g. ``"chapters/01_retrieval_task"``).

    Raises:
        TypeError: ``docname`` or ``source_suffix`` is not a string.
    """
    if not isinstance(docname, str) or not isinstance(source_suffix, str):
        raise TypeError(f"docname and source_suffix must be strings; got {docname!r}, {source_suffix!r}")
    line = nodes.paragraph(classes=["run-locally"])
    line += nodes.strong(text="Run it locally: ")
    line += nodes.Text("in a clone of the book's repository, run the README's two commands (")
    line += nodes.literal(text=COMMANDS[0])
    line += nodes.Text(" builds the book, ")
    line += nodes.literal(text=COMMANDS[1])
    line += nodes.Text(" tests it), then open ")
    line += nodes.literal(text=docname + source_suffix)
    line += nodes.Text(" in Jupyter, or take it from this page's download button (the arrow at the top) into a "
                       "Python environment with the requirements installed. The exercises run there: this web page "
                       "shows the book's own run and cannot execute code (")
    link = addnodes.pending_xref("", refdomain="std", reftype="doc", reftarget="/running", refexplicit=True,
                                 refdoc=docname, refwarn=True)
    link += nodes.inline(text="how to run this yourself", classes=["xref", "std", "std-doc"])
    line += link
    line += nodes.Text(").")
    return line


def _add_line(app, doctree) -> None:
    docname = app.env.docname
    if not docname.startswith(PREFIX):
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        return
    suffix = os.path.splitext(str(app.env.doc2path(docname)))[1] or ".ipynb"  # the page's own source file
    title = next((i for i, child in enumerate(section.children) if isinstance(child, nodes.title)), -1)
    section.insert(title + 1, run_locally_line(docname, suffix))


def setup(app):
    app.connect("doctree-read", _add_line)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
