"""The claims scoreboard: what each chapter's checks measured in this run, for the book's scoreboard page.

A chapter's checks cell ends with :meth:`Checks.record_claim <lengthgen_utils.book.checks.Checks.record_claim>`
(which calls :func:`record_claim` with the chapter's checks in memory): the claim of the abstract it tests,
the status its text states, a one-line summary, its key numbers and its *evidence*: which of the chapter's
evidence checks (those :meth:`~lengthgen_utils.book.checks.Checks.finish` just passed) bear on the claim,
``"for"`` it (passing, they show the claim holds where they test it) or ``"against"`` it (passing, they
show it fails somewhere the chapter tests). The record's status is not the chapter's word: it is derived
from which of those checks passed, by one rule, :func:`claim_status` (see :data:`STATUS_RULE`). The records are JSON files in one folder per run; the
scoreboard page and the synthesis chapter read them back with :func:`load_claims`. A record says
which profile and which run it came from, so a page never shows another run's numbers as this one's.

**Runs.** A run is one book build, one ``pytest`` session or one robustness condition; its id is
``$LENGTHGEN_RUN_ID`` (set by the book build's ``_ext/claims.py``, by ``conftest.py`` and by
``python -m lengthgen_utils robustness``; ``interactive`` when unset, e.g. in Jupyter). Each run
writes to its own folder, ``<claims>/<run id>/``, so a build and a test run in one checkout at the
same time never see each other's records, and :func:`load_claims` refuses, by name, a record
that says it belongs to another run.

Where: ``$LENGTHGEN_CLAIMS`` if set (``~`` expanded), else ``_build/claims`` of the book being run:
the nearest folder holding ``_toc.yml`` at or above the working directory (a chapter runs in its
own folder), so the records follow the book, not the checkout the package was imported from.
Only when no book is found above the working directory do they go to this package's repository.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import time
import warnings
from html import escape
from pathlib import Path

from .._validate import book_root, env_path, env_value
from ..run.profiles import get_profile

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

SUBCLAIMS = {
    "C1.content-aware head": "C1's scope: the same task with the ordinary head, whose queries and keys see the "
                             "token (chapter 5b), trained with the book's recipe, without and with weight decay.",
    "C4.aligned": "C4, first half: the learned RoPE kernel is aligned with the target offset (with the book's "
                  "recipe: training adds it, implicitly).",
    "C4.low rank": "C4, second half: the learned RoPE kernel is low rank beyond what RoPE's frequencies force at "
                   "initialisation.",
}
"""Halves of a claim that its evidence decides separately: ``"<claim>.<half>"``, each with its own status by the
one rule (:func:`claim_status`), shown on the scoreboard under the claim they split."""


EVIDENCE_ROLES = ("for", "against")
"""How a chapter's evidence check bears on its claim: passing, a check ``"for"`` the claim shows it holds where
the check tests it; a check ``"against"`` it shows it fails where the check tests it."""
UNDECIDED = "undecided"
"""The status :func:`claim_status` gives when neither side's evidence was established (shown, never stated)."""
STATUS_RULE = {(True, True): "reproduced in a regime", (True, False): "reproduced",
               (False, True): "not reproduced", (False, False): UNDECIDED}
"""The status from ``(the evidence for the claim is established, the evidence against it is established)``; a
side is established when it names at least one evidence check and every one of them passed."""


def evidence_checks(evidence: dict, checks: list[dict]) -> dict:
    """The chapter's evidence checks that ``evidence`` names, by role.

    Args:
        evidence: ``{"for": [name, ...], "against": [name, ...]}`` (either list may be empty or left out): the
            names of the chapter's checks (a chapter tags them where they are made, :class:`~lengthgen_utils.book.checks.Checks`).
        checks: the chapter's check records (the ``"checks"`` list :meth:`Checks.record` writes: ``name``,
            ``passed``, ``kind``).

    Returns:
        ``{"for": [check record, ...], "against": [...]}``, each in the chapter's order; code checks
        (``kind == "code"``, tests of the code, not evidence) are never selected.

    Raises:
        ValueError: a role not in :data:`EVIDENCE_ROLES`; a name that is no evidence check of the chapter (the
            message lists the chapter's evidence checks); a check named for both roles.
        TypeError: ``evidence`` is not a dict of lists of strings.
    """
    if not isinstance(evidence, dict):
        raise TypeError(f"evidence must be a dict {{'for': [...], 'against': [...]}}; got {type(evidence).__name__}")
    unknown = [r for r in evidence if r not in EVIDENCE_ROLES]
    if unknown:
        raise ValueError(f"evidence roles must be among {EVIDENCE_ROLES}; got {unknown}")
    usable = [c for c in checks if c.get("kind") != "code"]
    chosen = {}
    for role in EVIDENCE_ROLES:
        names = evidence.get(role, [])
        if isinstance(names, str) or not all(isinstance(x, str) for x in names):
            raise TypeError(f"evidence[{role!r}] must be a list of check names; got {names!r}")
        for name in names:
            if not any(c["name"] == name for c in usable):
                raise ValueError(f"evidence[{role!r}]: {name!r} names no evidence check of the chapter; its "
                                 f"evidence checks are {[c['name'] for c in usable]}")
        chosen[role] = [c for c in usable if c["name"] in names]
    both = [c["name"] for c in chosen["for"] if c in chosen["against"]]
    if both:
        raise ValueError(f"checks named both for and against the claim: {both}")
    return chosen


def claim_status(evidence: dict, checks: list[dict]) -> str:
    """A claim's status from the chapter's checks: the one rule of the scoreboard.

    Each side (the evidence ``"for"`` the claim, the evidence ``"against"`` it) is *established* when
    ``evidence`` names at least one of the chapter's evidence checks for it and every one of them passed.
    Then (:data:`STATUS_RULE`): both established, "reproduced in a regime" (the claim holds where the checks
    for it test it and fails where those against it do); only the evidence for it, "reproduced"; only the
    evidence against it, "not reproduced"; neither, :data:`UNDECIDED`. A failed check for the claim thus
    turns "reproduced" into "undecided" and "reproduced in a regime" into "not reproduced"; a failed check
    against it turns "reproduced in a regime" into "reproduced" and "not reproduced" into "undecided".

    Args:
        evidence: ``{"for": [...], "against": [...]}`` check names (:func:`evidence_checks`).
        checks: the chapter's check records (``name``, ``passed``, ``kind``).

    Raises:
        ValueError / TypeError: from :func:`evidence_checks`.
    """
    chosen = evidence_checks(evidence, checks)
    established = tuple(bool(chosen[r]) and all(c["passed"] for c in chosen[r]) for r in EVIDENCE_ROLES)
    return STATUS_RULE[established]


def checks_path(chapter: str) -> Path:
    """Where :meth:`Checks.finish` writes ``chapter``'s checks in this run: ``run_dir() / "checks" / ...``."""
    return run_dir() / "checks" / f"{chapter.replace('/', '__')}.json"


RUN_ENV = "LENGTHGEN_RUN_ID"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def run_id() -> str:
    """This run's id: ``$LENGTHGEN_RUN_ID``, else ``"interactive"``.

    Raises:
        ValueError: ``$LENGTHGEN_RUN_ID`` is not 1-100 letters, digits, ``.``, ``_`` or ``-`` (it names a folder).
    """
    value = env_value(RUN_ENV)
    if value is None:
        return "interactive"
    if not _RUN_ID.fullmatch(value):
        raise ValueError(f"${RUN_ENV} must be 1-100 letters, digits, '.', '_' or '-' starting with a letter or "
                         f"digit (it names the run's folder); got {value!r}")
    return value


def new_run_id(kind: str) -> str:
    """A fresh run id such as ``build-20261201T200000-12345`` (``kind``, UTC time, process id)."""
    return f"{kind}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"


def claims_dir() -> Path:
    """The folder of every run's records: ``$LENGTHGEN_CLAIMS`` (``~`` expanded), else
    ``<book>/_build/claims`` for the book of :func:`book_root`."""
    return env_path(CLAIMS_ENV) or book_root() / "_build" / "claims"


def run_dir() -> Path:
    """This run's records: ``claims_dir() / run_id()``."""
    return claims_dir() / run_id()


CHAPTER_PAGE = re.compile(r"[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*")
"""A chapter as a record names it: the notebook's path in the book without its suffix
(``chapters/04_carrier_kernel``): letters, digits, ``_`` and ``-`` between slashes, so never a scheme
(``javascript:``), a ``..`` or an address outside the book."""
_FINDING = re.compile(r"X:[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_claim_id(claim) -> str:
    """``claim`` if it names a claim: a key of :data:`CLAIMS`, of :data:`SUBCLAIMS`, or ``"X:<name>"``.

    Raises:
        ValueError: anything else (the message lists what is allowed).
    """
    if claim not in CLAIMS and claim not in SUBCLAIMS and not (isinstance(claim, str) and _FINDING.fullmatch(claim)):
        raise ValueError(f"claim must be one of {tuple(CLAIMS)}, a half of one {tuple(SUBCLAIMS)} or 'X:<name>', "
                         f"the name 1-64 letters, digits, '_', '.' or '-' (it names the record's file; no "
                         f"'/'); got {claim!r}")
    return claim


def provenance() -> dict:
    """Under what this process computes: what every claim record carries and :func:`load_claims` compares.

    Returns:
        ``{"profile", "seed_base", "code", "threads", "cpu_kernels", "torch"}``: the profile's name, the seed
        base (``$LENGTHGEN_SEED``), the package's code fingerprint (the one the results cache keys on),
        the intra-op thread count of each path (``$LENGTHGEN_THREADS`` or the package's rule), the CPU
        kernels torch dispatches to (``$ATEN_CPU_CAPABILITY``, or ``"native"``) and torch's version.
        Each can move a number a claim rests on.

    Raises:
        ValueError: a bad ``$LENGTHGEN_PROFILE``, ``$LENGTHGEN_SEED`` or ``$LENGTHGEN_THREADS``.
    """
    import torch

    from ..core.seeding import seed_base
    from ..run.cache import code_fingerprint
    from ..run.training import CPU_THREADS, default_cpu_threads

    return {"profile": get_profile().name, "seed_base": seed_base(), "code": code_fingerprint(),
            "threads": {path: default_cpu_threads(path) for path in CPU_THREADS},
            "cpu_kernels": (os.environ.get("ATEN_CPU_CAPABILITY") or "native").strip().lower(),
            "torch": torch.__version__}


def provenance_mismatch(record: dict, current: dict | None = None) -> list[str]:
    """What in ``record``'s provenance differs from ``current`` (default :func:`provenance`), one
    ``"seed base 3 (this run: 0)"`` per field; ``["no provenance"]`` for a record that carries none."""
    current = provenance() if current is None else current
    made = record.get("provenance")
    if not isinstance(made, dict):
        return ["no provenance (a record from an older version of the package)"]
    return [f"{key.replace('_', ' ')} {made.get(key)!r} (this run: {value!r})"
            for key, value in current.items() if made.get(key) != value]


def forget_chapter(chapter: str) -> int:
    """Remove this run's claim records made by ``chapter``; returns how many.

    Called by :meth:`~lengthgen_utils.book.checks.Checks.finish` before it writes the chapter's checks: a
    claim never outlives the checks that made it. A chapter re-run in the same run (a Jupyter session,
    ``pytest`` with a fixed ``$LENGTHGEN_RUN_ID``) whose checks now fail leaves no earlier "reproduced"
    behind; passing, it records the claim again.
    """
    folder, removed = run_dir(), 0
    for path in folder.glob("*.json") if folder.is_dir() else ():
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and {"claim", "status"} <= record.keys() and record.get("chapter") == chapter:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def clear_run() -> int:
    """Remove this run's records (its claims and its checks), and nothing else; returns how many files.

    Only the files a run writes are touched: ``<claim>.json`` records (which say they are claims records),
    ``checks/<chapter>.json`` and the temporary files of an interrupted write. A folder the run did not write,
    or a file in it that is not a record, stays.
    """
    folder, removed = run_dir(), 0
    candidates = list(folder.glob("*.json")) + list((folder / "checks").glob("*.json"))
    candidates += list(folder.glob(".*.tmp")) + list((folder / "checks").glob(".*.tmp"))
    for path in candidates:
        if path.suffix == ".json":
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(record, dict) or not ({"claim", "status"} <= record.keys()
                                                    or {"chapter", "checks"} <= record.keys()):
                continue
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def record_claim(claim: str, status: str, summary: str, numbers: dict | None = None, chapter: str = "",
                 evidence: dict | None = None, checks: list | None = None) -> None:
    """Record what a chapter's checks established about ``claim`` (written atomically as ``<claim>.json``).

    Args:
        claim: a key of :data:`CLAIMS` (``"C1"`` .. ``"C8"``), of :data:`SUBCLAIMS` (a half of one, e.g.
            ``"C4.aligned"``), or ``"X:<name>"`` for a finding beyond the paper.
        status: the status the chapter's text states, one of :data:`STATUSES` (kept as ``"stated"``).
        summary: one sentence: what was measured, in the book's words.
        numbers: the key numbers, ``{name: value}`` (JSON numbers or strings).
        chapter: the chapter that checked it (e.g. ``"chapters/04_carrier_kernel"``).
        evidence: ``{"for": [...], "against": [...]}``, the chapter's evidence checks that bear on the claim
            (check names, :func:`evidence_checks`); read from the checks the chapter wrote in
            this run (:func:`checks_path`), so ``check.finish()`` comes first. The record's ``"status"`` is then
            :func:`claim_status`'s, and ``"evidence"`` keeps each named check's name, role and whether it
            passed. Without it (a record made by hand) the status is the stated one and ``"derived"`` is False.
        checks: the chapter's check records of this run, in memory (:meth:`Checks.record_claim
            <lengthgen_utils.book.checks.Checks.record_claim>` passes its own); None reads the file.

    The record is written to this run's folder, :func:`run_dir` (nothing is returned, so a checks cell that ends with this
    call shows nothing more).

    Raises:
        ValueError: an unknown claim or status; evidence without a chapter, or before the chapter's checks were
            written in this run; evidence naming no check (:func:`evidence_checks`); a derived status other than
            the stated one (raised after the record is written, so the scoreboard shows both).
        TypeError: numbers JSON cannot hold; malformed evidence.
    """
    check_claim_id(claim)
    if not isinstance(chapter, str) or (chapter and not CHAPTER_PAGE.fullmatch(chapter)):
        raise ValueError("chapter must be the chapter's path in the book without its suffix (e.g. "
                         f"'chapters/04_carrier_kernel': letters, digits, '_', '-' and '/'); got {chapter!r}")
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}; got {status!r}")
    derived, kept = status, None
    if evidence is not None:
        if not chapter:
            raise ValueError("record_claim: evidence is read from the chapter's checks; give chapter=")
        if checks is None:
            path = checks_path(chapter)
            written = json.loads(path.read_text()) if path.is_file() else None
            if written is None or written.get("run") != run_id():
                raise ValueError(f"record_claim: no checks of {chapter!r} in this run ({path}); call "
                                 "check.finish() before record_claim")
            checks = written["checks"]
        chosen = evidence_checks(evidence, checks)
        derived = claim_status(evidence, checks)
        kept = [{"name": c["name"], "role": role, "passed": c["passed"]} for role in EVIDENCE_ROLES
                for c in chosen[role]]
    record = {"claim": claim, "status": derived, "stated": status, "derived": evidence is not None,
              "evidence": kept, "summary": str(summary), "numbers": dict(numbers or {}),
              "chapter": chapter, "profile": get_profile().name, "run": run_id(), "provenance": provenance(),
              "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    text = json.dumps(record, indent=1, allow_nan=False)
    folder = run_dir()
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, folder / f"{claim.replace(':', '_').replace(' ', '_')}.json")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if derived != status:
        raise ValueError(f"{claim}: the chapter states {status!r} but its evidence gives {derived!r} "
                         f"({STATUS_RULE} on {kept})")


def load_claims() -> dict:
    """Every record of this run (:func:`run_dir`), by claim: ``{claim: record}`` (empty when nothing was recorded).

    A record whose ``run`` is another run's (a file copied or left in this run's folder) is refused: it is
    left out, with a ``RuntimeWarning`` that names it and the run it belongs to. So is a record whose
    provenance (:func:`provenance`: profile, seed base, code version, thread counts, CPU kernels, torch)
    differs from this process's, or that carries none: the warning names each field that differs.
    """
    folder, current = run_dir(), run_id()
    if not folder.is_dir():
        return {}
    here = provenance()
    claims = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        if record.get("run") != current:
            warnings.warn(f"claims record {path.name} ({record.get('claim')}) belongs to run "
                          f"{record.get('run')!r}, not to this run {current!r}: left out", RuntimeWarning,
                          stacklevel=2)
            continue
        differs = provenance_mismatch(record, here)
        if differs:
            warnings.warn(f"claims record {path.name} ({record.get('claim')}) was made under other settings than "
                          f"this run: {'; '.join(differs)}: left out", RuntimeWarning, stacklevel=2)
            continue
        claims[record["claim"]] = record
    return claims


NUMBER_LABELS = {
    # chapter 1
    "rope_heads_to_4x": "RoPE, heads at ≥ 0.95 up to 4x",
    "rope_first_failing_length_predicted": "RoPE, first failing length up to 16x as predicted before training",
    "ape_heads_near_chance_from_2x": "APE, heads within 0.2 of chance from 2x",
    "ape_max_abs_dev_from_chance_from_2x": "APE, largest |accuracy - chance| from 2x",
    "offsets": "offsets k",
    "seeds": "seeds",
    # chapter 2
    "rope_max_shift_dlogit": "RoPE, largest logit change under a shift",
    "rope_16x_vs_1x_row_diff": "RoPE, largest 16x vs 1x score-row difference",
    "ape_min_shift_dlogit": "APE, logit change under a shift (smallest)",
    "ape_16x_vs_1x_row_diff_min": "APE, 16x vs 1x score-row difference (smallest)",
    "ape_shift_attention_moved_median": "APE, trained: share of attention a shift moves (median)",
    "untrained_ape_shift_attention_moved_max": "APE, untrained: share of attention a shift moves (largest)",
    # chapter 3
    "fixed_pinned_position": "fixed length, pinned position",
    "fixed_pinned_positions_k135": "fixed length, pinned position at k = 1, 3, 5",
    "fixed_share_min": "fixed length, share of test lengths at the pin (lowest)",
    "fixed_weight_on_pin_min": "fixed length, attention on the pin (lowest)",
    "variable_weight_on_pin_max": "variable lengths, attention on the pin (highest)",
    "variable_seeds_one_position_90pct": "variable lengths, seeds at one position for ≥ 90% of lengths",
    "variable_acc_2x": "variable lengths, accuracy at 2x",
    "target_vs_decoy_max_gap": "variable lengths, target vs decoy accuracy, largest gap",
    # chapter 4
    "auc_C_variation_min": "AUC of C (variation) vs the nulls, lowest",
    "auc_top2_range": "AUC of top-2 kept vs the nulls, lowest / highest",
    "alias_prediction_agreement": "heads whose alias is predicted from the weights",
    "failure_prediction_agreement": "heads whose first failing length is predicted",
    "failing_by_4096": "share of heads failing by 4096 tokens, by RoPE base",
    "no_predicted_alias": "heads without a predicted alias in the search, by RoPE base (none, heads)",
    "alias_search_tokens": "alias search, up to (tokens)",
    "committed_candidate_hits_base1e4": "base 10^4, aliasing heads on a distance committed before training",
    "committed_null_p_base1e4": "base 10^4, random lag sets doing as well (p-value)",
    # chapter 5
    "law_r2_ge_0.9_where_n_exp_minus_kappa_ge_20": "heads with R² ≥ 0.9 where n e^-κ ≥ 20",
    "law_r2_ge_0.9_where_n_exp_minus_kappa_le_1": "heads with R² ≥ 0.9 where n e^-κ ≤ 1",
    # chapter 5b (the regime map: C4 and C5)
    "alignment_auc_min": "alignment vs untrained heads, lowest AUC over fitted cells",
    "top2_auc_decayed_small_bases": "top-2 share vs untrained (AUC), weight decay 0 < λ ≤ 1, bases 10 and 100",
    "top2_auc_no_decay_small_bases": "top-2 share vs untrained (AUC), no decay, bases 10 and 100",
    "top2_auc_no_decay_base10": "top-2 share vs untrained (AUC), no decay, base 10",
    "top2_auc_base1e4_median": "top-2 share vs untrained (AUC), base 10^4, median over λ",
    "decayed_cells": "the decayed cells",
    "step": "training steps of the map's snapshot",
    "gradual_share_decayed_small_bases": "heads falling gradually, 0 < λ ≤ 1, bases 10 and 100",
    "gradual_share_no_decay": "heads falling gradually, no decay",
    "lawful_share_of_gradual": "gradual heads the law describes (R² ≥ 0.9)",
    "alias_cliff_share_base1e4": "base 10^4, λ ≤ 1: falling heads with a cliff at the alias",
    "vote_balanced_agreement": "the attention's vote predicts accuracy ≥ 0.9 (balanced agreement)",
    "p_half_balanced_agreement_position": "p > 1/2 predicts accuracy ≥ 0.9 (balanced agreement)",
    "p_star_balanced_agreement": "p > p* predicts accuracy ≥ 0.9 (balanced agreement)",
    "shuffled_null": "null: another head's p > 1/2 (balanced agreement)",
    "median_p_over_p_star_at_fall": "lawful heads, target mass at the fall in p* (median)",
    "content_below_0.9_at_2x_no_decay": "content heads, no decay: below 0.9 at 2x",
    "position_only_below_0.9_at_2x_no_decay": "position-only heads, no decay: below 0.9 at 2x",
    "content_below_0.9_at_2x_decayed": "content heads, largest decay: below 0.9 at 2x",
    "law_half_within_half_octave_of_fall": "lawful heads: the law's p = 1/2 crossing within half an octave of "
                                           "the accuracy fall",
    # chapter 9
    "control_2x": "APE at random shifts (control), mean accuracy at 2x",
    "control_reads_2x": "control, seeds reading the key back at 2x",
    "ape_reads_2x": "learned APE, seeds reading the key back at 2x",
    "ape_2x": "learned APE, accuracy at 2x",
    "control_16x": "control, accuracy at 16x",
    "control_tv_inside": "control, attention change under shifts inside (median TV)",
    "ape_tv_min": "learned APE, attention change under shifts (lowest TV)",
    "control_copy_visited": "control on delayed copy, accuracy at positions 32..127",
    "control_copy_beyond": "control on delayed copy, accuracy at positions 128..255",
    "t5_16x": "T5 bias, accuracy at 16x",
    "ntk_16x": "RoPE + NTK, accuracy at 16x",
    "rope_16x": "RoPE, accuracy at 16x",
}
"""Short labels for the key numbers the chapters record (their ``record_claim`` keys); a key that is not here
is shown through :func:`number_label`'s fallback."""

_SYMBOLS = (("_ge_", " ≥ "), ("_le_", " ≤ "), ("_gt_", " > "), ("_lt_", " < "), ("_vs_", " vs "),
            ("r2", "R²"), ("_", " "))


def number_label(key: str) -> str:
    """A reader's label for a key number: :data:`NUMBER_LABELS`, else the key humanised
    (``"_ge_"`` -> ``" ≥ "``, ``"_le_"`` -> ``" ≤ "``, ``"r2"`` -> ``"R²"``, other underscores -> spaces)."""
    if key in NUMBER_LABELS:
        return NUMBER_LABELS[key]
    label = key
    for raw, shown in _SYMBOLS:
        label = label.replace(raw, shown)
    return label


def chapter_link(chapter: str) -> tuple[str, str]:
    """``("ch. 4", "chapters/04_carrier_kernel.html")`` for ``"chapters/04_carrier_kernel"``: the chapter's short
    name and its page, relative to the book's root (where the scoreboard page sits); ``("", "")`` for ``""``.

    Only the book's own pages become links: a chapter string that is not a path of :data:`CHAPTER_PAGE`'s form
    (``javascript:...``, ``https://...``, ``../x``) comes back as its text with no page."""
    if not chapter:
        return "", ""
    if not isinstance(chapter, str) or not CHAPTER_PAGE.fullmatch(chapter):
        return str(chapter), ""  # not a page of the book (a scheme, '..', another site): shown, never linked
    stem = chapter.rsplit("/", 1)[-1]
    number = stem.split("_", 1)[0]  # "04", or "05b" for a chapter between 5 and 6
    digits = number.rstrip("abcdefghijklmnopqrstuvwxyz")
    name = f"ch. {int(digits)}{number[len(digits):]}" if digits.isdigit() else stem
    return name, f"{chapter}.html"


def scoreboard_table(claims: dict | None = None):
    """The scoreboard as a table: one row per claim of :data:`CLAIMS` (and per finding beyond the paper).

    Args:
        claims: ``{claim: record}`` (default :func:`load_claims`).

    Returns:
        a ``pandas.DataFrame``, one row per claim (each recorded half of :data:`SUBCLAIMS` right under its claim),
        with columns claim (``"C1"``), chapter (``"ch. 1"``), chapter
        page (its HTML page relative to the book's root), the paper says (our split of the abstract), status,
        what the book measured (the chapter's summary), key numbers (one ``"label: value"`` per line, labels
        from :func:`number_label`), profile, seed base and code (the record's provenance, :func:`provenance`;
        :func:`load_claims` keeps only records made under this run's); a claim without a record says "not run in this build" and
        leaves the other columns empty. :func:`scoreboard_html` lays it out for the page.
    """
    import pandas as pd

    claims = load_claims() if claims is None else claims
    rows = []
    order = [c for claim in CLAIMS
             for c in (claim, *(h for h in SUBCLAIMS if h.split(".")[0] == claim and h in claims))]
    for claim in order + sorted(c for c in claims if c not in CLAIMS and c not in SUBCLAIMS):
        record = claims.get(claim) or {}
        name, page = chapter_link(record.get("chapter", ""))
        numbers = "\n".join(f"{number_label(k)}: {_fmt(v, number_label(k))}"
                            for k, v in record.get("numbers", {}).items())
        rows.append({"claim": claim, "chapter": name, "chapter page": page,
                     "the paper says": CLAIMS.get(claim, SUBCLAIMS.get(claim, "(beyond the paper)")),
                     "status": _status_text(record),
                     "what the book measured": record.get("summary", ""),
                     "key numbers": numbers, "profile": record.get("profile", ""),
                     "seed base": (record.get("provenance") or {}).get("seed_base", ""),
                     "code": (record.get("provenance") or {}).get("code", "")})
    return pd.DataFrame(rows)


def _status_text(record: dict) -> str:
    """The status cell: the derived status; the chapter's own word too where it differs."""
    if not record:
        return "not run in this build"
    status, stated = record.get("status", ""), record.get("stated", record.get("status", ""))
    return status if stated == status else f"{status} (the chapter states: {stated})"


STATUS_COLOURS = {"reproduced": "#d8f0d8", "reproduced in a regime": "#fff3c4", "not reproduced": "#f8d7d7",
                  UNDECIDED: "#e4e4f4"}
"""The status cell's background on the scoreboard page (grey for a claim not run)."""


def scoreboard_html(table) -> str:
    """The scoreboard page's table: four columns that fit the book's text column (about 690 px at a 1280 px
    window): the claim and a link to its chapter; the paper's claim; the status, coloured
    (:data:`STATUS_COLOURS`); what the book measured, with its key numbers below it, one per line. The
    profile, the same for every row of one build, is said once in the caption. The table keeps a minimum
    width and scrolls sideways inside its own box on a narrower screen.

    Args:
        table: :func:`scoreboard_table`'s ``DataFrame``.

    Returns:
        an HTML string (every text escaped).
    """
    cell = 'style="vertical-align:top; padding:0.35em 0.5em; border-top:1px solid #ccc; text-align:left"'
    body = []
    for row in table.to_dict("records"):
        claim = f"<b>{escape(row['claim'])}</b>"
        if row["chapter page"]:
            claim += f'<br><a href="{escape(row["chapter page"])}">{escape(row["chapter"])}</a>'
        colour = STATUS_COLOURS.get(row["status"].split(" (")[0], "#eeeeee")
        numbers = "".join(f"<li>{escape(line)}</li>" for line in row["key numbers"].splitlines())
        measured = escape(row["what the book measured"])
        if numbers:
            measured += ('<ul style="margin:0.4em 0 0 0; padding-left:1.1em; font-size:0.9em">'
                         f"{numbers}</ul>")
        body.append(f"<tr><td {cell}>{claim}</td><td {cell}>{escape(row['the paper says'])}</td>"
                    f'<td {cell[:-1]}; background-color:{colour}">{escape(row["status"])}</td>'
                    f"<td {cell}>{measured}</td></tr>")
    profiles = sorted({p for p in table["profile"] if p})
    if not profiles:
        caption = "Nothing recorded in this build."
    elif len(profiles) == 1:
        caption = f"Every row ran in the {escape(profiles[0])} profile of this build."
    else:
        caption = "Profiles: " + "; ".join(
            f"{escape(p)} ({escape(', '.join(table.loc[table['profile'] == p, 'claim']))})" for p in profiles) + "."
    made = sorted({(str(b), str(c)) for b, c in zip(table.get("seed base", ()), table.get("code", ())) if c != ""})
    if len(made) == 1:
        caption += (f" Seed base {escape(made[0][0])} ($LENGTHGEN_SEED), code version {escape(made[0][1])}: every "
                    "record was made under this run's settings (a record made under others is left out).")
    head = "".join(f'<th {cell}>{h}</th>' for h in ("claim", "the paper says", "status", "what the book measured"))
    return ('<div style="overflow-x:auto"><table class="scoreboard" style="width:100%; min-width:40em; '
            'table-layout:fixed; border-collapse:collapse; font-size:0.85em; line-height:1.35">'
            f'<caption style="caption-side:bottom; text-align:left; padding-top:0.5em">{caption}</caption>'
            '<colgroup><col style="width:4.5em"><col style="width:30%"><col style="width:7.5em"><col></colgroup>'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>")


def _fmt(value, label: str = "") -> str:
    """A key number as text: floats to 3 significant digits (``2e-07`` -> ``2e-7``), ``None`` as "none", lists
    joined by " / " where the label reads "a / b", else by ", ", dicts as ``key → value``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return re.sub(r"e([+-])0*(\d)", lambda m: f"e{m.group(1).replace('+', '')}{m.group(2)}", f"{value:.3g}")
    if isinstance(value, (list, tuple)):
        return (" / " if " / " in label else ", ").join(_fmt(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} → {_fmt(v)}" for k, v in value.items())
    return str(value)
