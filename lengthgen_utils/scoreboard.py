"""The claims scoreboard: what each chapter's checks measured in this build, for the book's scoreboard page.

A chapter's checks cell ends with :func:`record_claim`: the claim of the abstract it tests, the
status its checks established (``"reproduced"``, ``"reproduced in a regime"`` or ``"not reproduced"``),
a one-line summary and its key numbers. The records are JSON files in one folder; the scoreboard
page and the synthesis chapter read them back with :func:`load_claims`. A record says which profile
and which build it came from, so a page never shows another build's numbers as this one's.

Where: ``$LENGTHGEN_CLAIMS`` if set, else ``<repo>/_build/claims`` (the book's build folder, ignored by
git). The book build empties it when it starts (``_ext/claims.py``), so the page shows this build only.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from .cache import REPO_ROOT
from .profiles import get_profile

CLAIMS_ENV = "LENGTHGEN_CLAIMS"
STATUSES = ("reproduced", "reproduced in a regime", "not reproduced")
CLAIMS = {
    "C1": "On a minimal fixed-offset retrieval task, RoPE extrapolates and learned absolute positions do not.",
    "C2": "RoPE makes every attention logit a function of the relative offset alone (exact equivariance), so the "
          "rule learned at training lengths is reproduced verbatim at longer ones.",
    "C3": "Learned absolute positions leave out-of-range positions unconstrained; the trained head pins to a fixed "
          "absolute position inside the training range.",
    "C4": "The learned RoPE rule is a low-rank carrier kernel aligned with the target offset.",
    "C5": "Accuracy decays gracefully, following an attention-dilution law.",
    "C6": "Without softmax normalisation, linear attention selects a min-norm interpolant that does not extrapolate.",
    "C7": "The phenomenon, the equivariance and the carrier transfer to a multi-layer, multi-head transformer on a "
          "full-sequence task.",
    "C8": "The account connects to implicit bias in recurrent models and to the learning side of the RASP-L "
          "conjecture.",
}
"""The abstract's claims, split into checkable pieces (the book's reading of arXiv 2607.18759)."""


def claims_dir() -> Path:
    """The folder of the records: ``$LENGTHGEN_CLAIMS``, else ``<repo>/_build/claims``."""
    value = os.environ.get(CLAIMS_ENV, "")
    return Path(value) if value else REPO_ROOT / "_build" / "claims"


def record_claim(claim: str, status: str, summary: str, numbers: dict | None = None, chapter: str = "") -> None:
    """Record what a chapter's checks established about ``claim`` (written atomically as ``<claim>.json``).

    Args:
        claim: a key of :data:`CLAIMS` (``"C1"`` .. ``"C8"``), or ``"X:<name>"`` for a finding beyond the paper.
        status: one of :data:`STATUSES`.
        summary: one sentence: what was measured, in the book's words.
        numbers: the key numbers, ``{name: value}`` (JSON numbers or strings).
        chapter: the chapter that checked it (e.g. ``"chapters/04_carrier_kernel"``).

    The record is written to :func:`claims_dir` (nothing is returned, so a checks cell that ends with this
    call shows nothing more).

    Raises:
        ValueError: an unknown claim or status. TypeError: numbers JSON cannot hold.
    """
    if claim not in CLAIMS and not (isinstance(claim, str) and claim.startswith("X:")):
        raise ValueError(f"claim must be one of {tuple(CLAIMS)} or 'X:<name>'; got {claim!r}")
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}; got {status!r}")
    record = {"claim": claim, "status": status, "summary": str(summary), "numbers": dict(numbers or {}),
              "chapter": chapter, "profile": get_profile().name,
              "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    text = json.dumps(record, indent=1, allow_nan=False)
    folder = claims_dir()
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, folder / f"{claim.replace(':', '_')}.json")


def load_claims() -> dict:
    """Every record in :func:`claims_dir`, by claim: ``{claim: record}`` (empty when nothing was recorded)."""
    folder = claims_dir()
    if not folder.is_dir():
        return {}
    records = [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]
    return {r["claim"]: r for r in records}


def scoreboard_table(claims: dict | None = None):
    """The scoreboard as a table: one row per claim of :data:`CLAIMS` (and per finding beyond the paper).

    Args:
        claims: ``{claim: record}`` (default :func:`load_claims`).

    Returns:
        a ``pandas.DataFrame`` with columns claim, the paper's claim (our split of the abstract), status,
        what the book measured, key numbers, profile and chapter; a claim without a record says
        "not run in this build".
    """
    import pandas as pd

    claims = load_claims() if claims is None else claims
    rows = []
    for claim in list(CLAIMS) + sorted(c for c in claims if c not in CLAIMS):
        record = claims.get(claim)
        numbers = "" if record is None else "; ".join(f"{k} = {_fmt(v)}" for k, v in record["numbers"].items())
        rows.append({"claim": claim, "the paper says": CLAIMS.get(claim, "(beyond the paper)"),
                     "status": "not run in this build" if record is None else record["status"],
                     "what the book measured": "" if record is None else record["summary"],
                     "key numbers": numbers, "profile": "" if record is None else record["profile"],
                     "chapter": "" if record is None else record["chapter"]})
    return pd.DataFrame(rows)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)
