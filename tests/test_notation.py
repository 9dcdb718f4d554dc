"""The glossary covers the book, and each symbol of notation.md means one thing.

* Every technical term of ``TERMS`` that a page of the book uses (the markdown of every page in
  ``_toc.yml`` but notation.md itself; for the scoreboard also the claim texts and number labels
  the package writes into its table) must be a term that notation.md defines: the name or a
  parenthesised synonym of a bold glossary entry (``**Carrier.**``, ``**Alias (first alias).**``)
  or a bold term in one of its tables (``**offset kernel**``).
* No symbol is listed in two rows of notation.md's tables.
* Symbols the notation retired (``a_i``/``b_i`` for the kernel coefficients, now ``\\gamma_i``,
  ``\\delta_i``; the logit scale ``c_L``, now ``\\tau_L``; the shift ``c``, now ``t_0``; a query at
  position ``i``, now ``m``) appear on no page (prose and MyST directive bodies: a proposition's
  statement counts). A page that cannot follow yet would be listed in ``PENDING`` and expected to
  fail (strictly: a page that no longer
  fails must leave the list).

Code (fenced blocks, inline code and roles such as ``{glue:text}`...` ``) is not prose and is not
scanned. A term added to a page that is not in ``TERMS`` is not checked: add it here, and to the
glossary.
"""
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTATION = ROOT / "notation.md"

# glossary name (lowercase, as notation.md spells it) -> how a page says it
TERMS = {
    "implicit bias": r"implicit[- ]bias",
    "carrier": r"\bcarriers?\b",
    "carrier alignment": r"\balignments?\b",
    "alias": r"\balias(?:es|ing|ed)?\b",
    "auc": r"\bAUCs?\b",
    "peak z": r"\bpeak z\b",
    "total variation": r"total[- ]variation",
    "near-recurrence": r"near[- ]recurrences?",
    "matched filter": r"matched[- ]filters?",
    "copying head": r"copying[- ]heads?",
    "band-limited": r"band[- ]limited",
    "max-margin selection": r"\b(?:max|maximum|large)[- ]margin",
    "min-norm interpolant": r"\b(?:min|minimum)[- ]norm\b",
    "tied frequencies": r"\btied\b|\btie (?:their|its) frequencies",
    "dilution": r"\bdilut(?:ion|es|ed|ing)\b",
    "pinning": r"\bpin(?:s|ned|ning)?\b",
    "margin": r"\bmargins?\b",
    "null": r"\bnulls\b|\bthe null\b|\bnull heads?\b",
    "separating": r"\bseparating\b",
    "cliff": r"\bcliffs?\b",
    "orbit": r"\borbits?\b",
    "peakiness": r"\bpeakiness\b|\bpeaked\b",
    "offset kernel": r"offset kernel|\bthe kernel\b",
    "relative position": r"relative positions?",
    "distance": r"\bdistances?\b",
    "offset": r"\boffsets?\b",
    "participation ratio": r"participation ratios?",
    "critical target mass": r"critical (?:target )?mass",
    "noise ratio": r"noise ratio",
    "variation-weighted alignment": r"variation[- ]weighted",
    "low rank": r"low[- ]rank",
    "dominant pairs": r"dominant pairs?",
    "frequency pair": r"frequency pairs?",
    "training window": r"training window",
    "long-run law": r"long[- ]run law",
    "dilution law": r"dilution law",
    "equivariance": r"equivarian(?:ce|t)",
    "shift invariance": r"shift invarian(?:ce|t)",
    "extrapolation": r"\bextrapolat\w*",
    "length generalization": r"length[- ]generali[sz]\w*",
    "ensemble": r"\bensembles?\b",
    "seed": r"\bseeds?\b",
    "profile": r"\bprofiles?\b",
    "nat": r"\bnats?\b",
    "consistency check": r"consistency check",
    "copying the first half": r"copying the first half",
    "delayed copy": r"delayed copy",
    "fixed-offset retrieval": r"fixed[- ]offset retrieval",
    "position-only head": r"position[- ]only head",
    "linear control": r"linear(?:-attention)? control",
    "linear attention": r"\blinear attention\b",
    "well-conditioned frequencies": r"well-conditioned (?:rotary )?frequenc(?:y|ies)",
    "ape": r"\bAPE\b",
    "rope": r"\bRoPE\b",
    "nope": r"\bNoPE\b",
    "nope + bos": r"\bBOS\b",
    "alibi": r"\bALiBi\b",
    "rasp-l": r"\bRASP-L\b",
    "t5 bias": r"\bT5\b",
    "position interpolation": r"position interpolation",
    "ntk-aware scaling": r"\bNTK\b",
    "sinusoidal ape": r"\bsinusoid",
    "random shift": r"\brandom(?:ly)? shift|\brandomi[sz]ed positions",
    "adam": r"\bAdamW?\b",
}

# retired symbol -> what replaced it (see notation.md, "How the clashes were resolved")
RETIRED = {
    r"\ba_i\b": "the kernel coefficient a_i is now \\gamma_i",
    r"\bb_i\b": "the kernel coefficient b_i is now \\delta_i",
    r"\bc_L\b": "the logit scale c_L is now \\tau_L",
    r"\bj - i\b": "a query's position i is now m (D = n - m)",
    r"integer \$c\$|by \$c\$|at \$c\$ instead": "the shift c is now t_0",
    r"\bm_h\b": "ALiBi's slope m_h is now \\beta_h (m is a query's position)",
    r"R_\{?n-m\b|\bs\(m, n\)|\bkeys? (?:at (?:any )?position )?\$n\b": "a key's position n is now j",
}
# pages that have not applied the resolution yet (none now): strict xfail, so a fixed page must leave
PENDING: set = set()


def _prose(text: str) -> str:
    """Markdown without code: fenced blocks, inline code and roles (their argument is code)."""
    # code fences go; a MyST directive's body (```{prf:proof}, ```{admonition}) is prose and stays
    text = re.sub(r"^(```|~~~)(?!\{(?!code))[^\n]*\n.*?^\1[^\n]*$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _toc_pages(root: Path = ROOT) -> list[str]:
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    names = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("file"), str):
                names.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc.get("chapters", []))
    found = []
    for name in names:
        for suffix in (".md", ".ipynb"):
            if (root / (name + suffix)).is_file():
                found.append(name + suffix)
                break
        else:
            raise FileNotFoundError(f"_toc.yml names {name!r}, which is neither .md nor .ipynb")
    return found


def page_texts(root: Path = ROOT) -> dict[str, str]:
    """The prose of every page of the book but notation.md, keyed by path (scoreboard: with its table's words)."""
    pages = {}
    for name in _toc_pages(root):
        if name == "notation.md":
            continue
        path = root / name
        if path.suffix == ".ipynb":
            cells = json.loads(path.read_text())["cells"]
            text = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        else:
            text = path.read_text()
        pages[name] = _prose(text)
    if "scoreboard.ipynb" in pages:
        from lengthgen_utils.book.scoreboard import CLAIMS, NUMBER_LABELS
        pages["scoreboard.ipynb"] += "\n\n" + "\n".join([*CLAIMS.values(), *NUMBER_LABELS.values()])
    return pages


def _names(bold: str) -> set[str]:
    """``Alias (first alias)`` -> {alias, first alias}; ``Adam, AdamW`` -> {adam, adamw}."""
    bold = bold.strip().rstrip(".").strip()
    synonyms = re.findall(r"\(([^)]*)\)", bold)
    main = re.sub(r"\s*\([^)]*\)", "", bold)
    names = {n.strip().lower() for n in main.split(",")}
    for group in synonyms:
        names |= {n.strip().lower() for n in group.split(",")}
    return {n for n in names if n}


def defined_terms(notation: str) -> set[str]:
    """Bold terms of the glossary section and of the tables' rows."""
    head, _, glossary = notation.partition("## Glossary")
    terms = set()
    for bold in re.findall(r"\*\*(.+?)\*\*", glossary):
        terms |= _names(bold)
    for line in head.splitlines():
        if line.startswith("|"):
            for bold in re.findall(r"\*\*(.+?)\*\*", line):
                terms |= _names(bold)
    return terms


def undefined_terms(pages: dict[str, str], defined: set[str], terms: dict = TERMS) -> dict[str, list[str]]:
    """For each page, the terms of ``terms`` it uses that ``defined`` lacks."""
    missing = {}
    for name, text in pages.items():
        used = [term for term, pattern in terms.items()
                if term not in defined and re.search(pattern, text, re.I)]
        if used:
            missing[name] = used
    return missing


def table_symbols(notation: str) -> list[tuple[str, int]]:
    """(symbol, line number) for every symbol in the first column of notation.md's tables."""
    out = []
    for number, line in enumerate(notation.splitlines(), 1):
        if not line.startswith("| ") or line.startswith("|---") or line.startswith("| symbol"):
            continue
        cell = line.split("|")[1].strip()
        chunks = re.findall(r"\$([^$]+)\$", cell) or [cell]
        for chunk in chunks:
            for part in chunk.split(","):
                symbol = part.split("=")[0].strip()
                if symbol and symbol != r"\dots":
                    out.append((symbol, number))
    return out


def test_every_term_the_pages_use_is_in_the_glossary():
    pages = page_texts()
    assert len(pages) >= 14, sorted(pages)  # intro, 11 chapters, the scoreboard, running, architecture
    missing = undefined_terms(pages, defined_terms(NOTATION.read_text()))
    assert not missing, f"terms used but not defined in notation.md: {missing}"


def test_every_term_of_the_list_is_defined():
    """The list names glossary entries as notation.md spells them (a renamed entry must rename it here)."""
    defined = defined_terms(NOTATION.read_text())
    assert not [t for t in TERMS if t not in defined]


def test_a_page_with_an_undefined_term_is_reported():
    """The check can fail: drop one glossary entry and a page that uses its term is named."""
    notation = NOTATION.read_text()
    entry = re.search(r"\*\*Near-recurrence\.\*\*.*?\n\n", notation, re.S)
    assert entry, "the self-test needs the glossary's near-recurrence entry"
    trimmed = notation.replace(entry.group(0), "")
    fake = {"fake.md": "Its aliases sit at near-recurrences of its dominant pairs.",
            "clean.md": "Its aliases sit where its dominant pairs recur."}
    assert undefined_terms(fake, defined_terms(trimmed)) == {"fake.md": ["near-recurrence"]}
    assert undefined_terms(fake, defined_terms(notation)) == {}
    # code is not prose: a term inside inline code or a fenced block is not a use
    assert "near" not in _prose("see `near-recurrence`\n```python\nnear_recurrence = 1\n```\n")


def test_the_tables_terms_are_read_too():
    defined = defined_terms(NOTATION.read_text())
    assert {"offset kernel", "relative position", "peakiness", "min-norm interpolant"} <= defined


def test_no_symbol_has_two_rows():
    seen = {}
    for symbol, line in table_symbols(NOTATION.read_text()):
        seen.setdefault(symbol, []).append(line)
    assert len(seen) > 40, sorted(seen)
    twice = {s: lines for s, lines in seen.items() if len(lines) > 1}
    assert not twice, f"symbols listed in two rows of notation.md (lines): {twice}"


def test_notation_rows_with_two_meanings_are_caught():
    fake = "| symbol | meaning | code |\n|---|---|---|\n| $c$ (shift) | a shift | |\n| $\\Phi(D)$, $c$ | coefficients | |\n"
    symbols = [s for s, _ in table_symbols(fake)]
    assert symbols.count("c") == 2


def _retired_uses(text: str) -> list[str]:
    return [f"{why} ({m.group(0)!r})" for pattern, why in RETIRED.items() for m in re.finditer(pattern, text)]


@pytest.mark.parametrize("page", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason="its editor has not applied the notation yet"))
    if name in PENDING else name
    for name in sorted(page_texts())])
def test_no_page_uses_a_retired_symbol(page):
    uses = _retired_uses(page_texts()[page])
    assert not uses, f"{page} still uses retired symbols: {uses}"


def test_the_retired_symbol_check_can_fail():
    assert _retired_uses("with $a_i \\cos\\theta_i D$ and $D = j - i$")
    assert _retired_uses("a key at position $n$, $R_{n-m}$")
    assert not _retired_uses("with $\\gamma_i \\cos\\theta_i D$, $\\theta_i$, $R_{j-m}$ and $D = j - m$")
    # a proposition's body is prose (a MyST directive), a code fence is not
    assert _retired_uses(_prose("```{prf:proposition} K\n$s(D) = a_i \\cos \\theta_i D$\n```\n"))
    assert not _retired_uses(_prose("```python\nx = a_i\n```\n"))
