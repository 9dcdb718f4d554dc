"""A chapter's checks: every asserted quantity with its value, its threshold and its margin.

A checks cell states each assertion through one :class:`Checks` object instead of a bare ``assert``::

    checks = Checks("chapters/01_retrieval_task")
    checks.at_least("RoPE mean accuracy up to 4x, k = 3", rope_short, 0.95)
    checks.at_most("APE |mean - chance| from 2x, k = 3", ape_long, 0.10)
    checks.holds("every evaluation length beyond 1x is longer than training", longer)
    checks.at_most("max |logit change| under a shift", dlogit, 1e-5, code=True)  # a test of the code
    checks.rate_at_least("seeds at >= 0.95 up to 4x", holds, 0.5, reason="a majority")  # Wilson lower end
    checks.beats_null("hits minus the shuffled null", p, 0.01, null="shuffled heads, permutation test")
    checks.rate_beats("seeds at >= 0.95 to 16x", holds, null_holds, 0.05, against="the linear heads")
    checks.ranks_above("seeds' lowest accuracy to 4x", lowest, null_lowest, 0.05, against="the linear heads")
    checks.at_least("RoPE seeds at >= 0.95 to 16x", rope_16x, 0.5, evidence_for="C1")  # evidence for claim C1
    checks.finish()  # raises AssertionError listing every check that failed
    checks.record_claim("C1", "reproduced", "one sentence", {"RoPE at 4x": 1.0})  # its status from the tags

Each check is kept with its *margin*: how far the value is from failing, in the quantity's own units
(``value - threshold`` for :meth:`~Checks.at_least`, ``threshold - value`` for :meth:`~Checks.at_most`;
positive passes). :meth:`~Checks.finish` writes them all to the run's records
(:func:`~lengthgen_utils.book.scoreboard.run_dir`), failed ones included, and then raises if any failed, so
``python -m lengthgen_utils robustness`` can show every quantity's range and smallest margin over the
conditions it runs, and a failing build names every failed check at once, not the first.

:meth:`~Checks.record_claim` then records the chapter's claim with the status these checks give by the
book's one rule (:func:`~lengthgen_utils.book.scoreboard.claim_status`), read from this object, not from
the file :meth:`~Checks.finish` wrote.

A check bears on a claim where it is made: ``evidence_for="C1"`` or ``evidence_against="C1"`` (or a tuple
of claims); :meth:`~Checks.record_claim` collects the tagged checks, so a renamed check keeps its role.

``code=True`` marks a consistency check (two computations of one quantity, an identity that holds by
construction): a test of the code, not evidence for the claim. The checks cell says so too.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import statistics
import tempfile
import time

from ..analysis.rates import binomial_p, fisher_p, rank_sum_p, rate_text, wilson_interval
from ..run.profiles import get_profile


def _number(name: str, value) -> float:
    """``value`` (a Python or numpy number, or a one-element tensor) as a float; else ``TypeError``."""
    if hasattr(value, "numel") and hasattr(value, "item"):
        if value.numel() != 1:
            raise TypeError(f"check {name!r}: the value must be one number, not a tensor of shape "
                            f"{tuple(value.shape)} (reduce it first: .min(), .max(), .mean())")
        value = value.item()
    elif hasattr(value, "item") and not isinstance(value, (bool, numbers.Number)):
        value = value.item()  # numpy scalars
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"check {name!r}: the value must be a real number; got {type(value).__name__} {value!r:.60}")
    return float(value)


def _claims(name: str, argument: str, claims) -> list[str]:
    """The claims a check is tagged with (``evidence_for=`` / ``evidence_against=``): one claim id or several."""
    from .scoreboard import check_claim_id

    if not isinstance(claims, (str, tuple, list)):
        raise TypeError(f"check {name!r}: {argument} must be a claim id or a tuple of them (e.g. 'C1', "
                        f"('C4', 'C4.aligned')); got {type(claims).__name__} {claims!r}")
    claims = [claims] if isinstance(claims, str) else list(claims)
    for claim in claims:
        try:
            check_claim_id(claim)
        except ValueError as error:
            raise ValueError(f"check {name!r}: {argument}: {error}") from None
    return claims


class Checks:
    """The assertions of one chapter's checks cell (see the module docstring).

    Every check method also takes ``evidence_for=`` and ``evidence_against=``: the claim (``"C1"``, a half such
    as ``"C4.aligned"``, or ``"X:<name>"``), or a tuple of claims, on which the check bears, as evidence for it
    or against it. :meth:`record_claim` reads the tags; a code check (``code=True``) takes none.

    Args:
        chapter: the chapter's path without suffix, e.g. ``"chapters/04_carrier_kernel"``.

    Attributes:
        results: one dict per check, in order: ``name``, ``op`` (``">="``, ``"<="``, ``">"``, ``"<"``, ``"holds"``),
            ``value``, ``threshold``, ``margin``, ``passed``, ``kind`` (``"evidence"`` or ``"code"``), ``for`` and
            ``against`` (the claims it is tagged with).

    Raises:
        ValueError: two checks with one name (the robustness table matches checks across runs by name); a tag
            that is not a claim id, or one claim tagged both for and against.
        TypeError: a code check with a tag.
    """

    def __init__(self, chapter: str):
        if not isinstance(chapter, str) or not chapter:
            raise TypeError(f"chapter must be a non-empty str such as 'chapters/01_retrieval_task'; got {chapter!r}")
        self.chapter = chapter
        self.results: list[dict] = []
        self.finished = False  # set by finish(), which every claim waits for

    def _add(self, name: str, op: str, value, threshold, margin, passed: bool, code: bool, detail,
             evidence_for=(), evidence_against=()) -> bool:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a check's name must be a non-empty str; got {name!r}")
        if any(r["name"] == name for r in self.results):
            raise ValueError(f"two checks are named {name!r}: give each check its own name")
        roles = {"for": _claims(name, "evidence_for", evidence_for),
                 "against": _claims(name, "evidence_against", evidence_against)}
        if code and (roles["for"] or roles["against"]):
            raise TypeError(f"check {name!r}: a code check (code=True) tests the code; it is evidence for no claim")
        both = set(roles["for"]) & set(roles["against"])
        if both:
            raise ValueError(f"check {name!r} is tagged both for and against {sorted(both)}")
        self.results.append({"name": name, "op": op, "value": value, "threshold": threshold, "margin": margin,
                             "passed": bool(passed), "kind": "code" if code else "evidence",
                             "detail": None if detail is None else str(detail)[:300], **roles})
        return bool(passed)

    def at_least(self, name: str, value, threshold, *, code: bool = False, detail=None, **tags) -> bool:
        """Check ``value >= threshold`` (a NaN value fails). Returns whether it passed."""
        v, t = _number(name, value), _number(name, threshold)
        return self._add(name, ">=", v, t, v - t, v >= t, code, detail, **tags)

    def at_most(self, name: str, value, threshold, *, code: bool = False, detail=None, **tags) -> bool:
        """Check ``value <= threshold`` (a NaN value fails). Returns whether it passed."""
        v, t = _number(name, value), _number(name, threshold)
        return self._add(name, "<=", v, t, t - v, v <= t, code, detail, **tags)

    def above(self, name: str, value, threshold, *, code: bool = False, detail=None, **tags) -> bool:
        """Check ``value > threshold`` (strictly; a NaN value fails). Returns whether it passed."""
        v, t = _number(name, value), _number(name, threshold)
        return self._add(name, ">", v, t, v - t, v > t, code, detail, **tags)

    def below(self, name: str, value, threshold, *, code: bool = False, detail=None, **tags) -> bool:
        """Check ``value < threshold`` (strictly; a NaN value fails). Returns whether it passed."""
        v, t = _number(name, value), _number(name, threshold)
        return self._add(name, "<", v, t, t - v, v < t, code, detail, **tags)

    def share(self, name: str, flags, *, at_least=None, at_most=None, code: bool = False, **tags) -> bool:
        """Check a rate: the share of units (seeds, heads) for which ``flags`` holds, against ``at_least`` or
        ``at_most`` (one of the two). The record keeps ``m/n`` and its interval in its detail.

        The detail keeps the rate's Wilson 95% interval. A bare share against a threshold is a floor, not a
        test: where a claim says "at least", prefer :meth:`rate_at_least` (the interval's lower end against a
        bound the claim states) or :meth:`beats_null` (a one-sided test against the null); a share of 1.0 or
        0.0 (every unit, none) states an all-or-none claim.

        Args:
            flags: booleans, one per unit (a bool tensor, array or list), at least one.

        Raises:
            TypeError / ValueError: not exactly one of ``at_least`` / ``at_most``; no units.
        """
        if (at_least is None) == (at_most is None):
            raise TypeError(f"check {name!r}: give exactly one of at_least / at_most")
        m, n = self._count(name, flags)
        detail = rate_text(m, n)
        if at_least is not None:
            return self.at_least(name, m / n, at_least, code=code, detail=detail, **tags)
        return self.at_most(name, m / n, at_most, code=code, detail=detail, **tags)

    def rate_at_least(self, name: str, flags, bound, *, reason: str, code: bool = False, **tags) -> bool:
        """Check a rate "at least ``bound``" by its uncertainty: the lower end of the Wilson 95% interval of the
        share of ``flags`` that hold must be ``>= bound``. The record's value is that lower end; its detail
        keeps ``m/n``, the interval and ``reason``.

        Args:
            flags: booleans, one per unit (a bool tensor, array or list), at least one.
            bound: the rate the claim states (a fraction in [0, 1]).
            reason: why the claim needs that bound (e.g. "a majority", "above the random-lag rate 0.02").

        Raises:
            TypeError / ValueError: no units; ``bound`` outside [0, 1]; an empty ``reason``.

        Source: :func:`~lengthgen_utils.analysis.rates.wilson_interval`.
        """
        (low, _), bound, detail = self._interval(name, flags, bound, reason, "lower")
        return self.at_least(name, low, bound, code=code, detail=detail, **tags)

    def rate_at_most(self, name: str, flags, bound, *, reason: str, code: bool = False, **tags) -> bool:
        """Check a rate "at most ``bound``" by its uncertainty: the upper end of the Wilson 95% interval of the
        share of ``flags`` that hold must be ``<= bound`` (the mirror of :meth:`rate_at_least`). The record's
        value is that upper end; its detail keeps ``m/n``, the interval and ``reason``.

        Raises:
            TypeError / ValueError: as :meth:`rate_at_least`.

        Source: :func:`~lengthgen_utils.analysis.rates.wilson_interval`.
        """
        (_, high), bound, detail = self._interval(name, flags, bound, reason, "upper")
        return self.at_most(name, high, bound, code=code, detail=detail, **tags)

    def _interval(self, name: str, flags, bound, reason, end: str) -> tuple:
        """The Wilson interval of ``flags``, the checked ``bound`` and the record's detail (both rate checks)."""
        m, n = self._count(name, flags)
        if not isinstance(reason, str) or not reason:
            raise TypeError(f"check {name!r}: give the bound's reason as a non-empty str")
        bound = _number(name, bound)
        if not 0.0 <= bound <= 1.0:
            raise ValueError(f"check {name!r}: bound must be a rate in [0, 1]; got {bound}")
        return wilson_interval(m, n), bound, f"{rate_text(m, n)}; {end} end vs {bound:.3g}: {reason}"

    def beats_null(self, name: str, p_value, level, *, null: str, detail=None, **tags) -> bool:
        """Check a one-sided test of the trained heads against their null: ``p_value <= level``.

        Args:
            p_value: the test's one-sided p-value (:mod:`~lengthgen_utils.analysis.rates`: an exact binomial
                or Fisher p-value, or a permutation p-value over the null's draws).
            level: the stated significance level (e.g. 0.01).
            null: what the null is and which test, e.g. "shuffled heads, permutation test".
            detail: the statistic against the null (e.g. "17 of 20 against a null mean of 0.62").

        Raises:
            TypeError / ValueError: ``level`` outside (0, 1); an empty ``null``.
        """
        if not isinstance(null, str) or not null:
            raise TypeError(f"check {name!r}: say what the null is (a non-empty str)")
        level = _number(name, level)
        if not 0.0 < level < 1.0:
            raise ValueError(f"check {name!r}: level must be in (0, 1); got {level}")
        text = f"one-sided p against {null}" + ("" if detail is None else f"; {detail}")
        return self.at_most(name, p_value, level, detail=text, **tags)

    def rate_beats(self, name: str, flags, null, level, *, against: str, **tags) -> bool:
        """Check that a rate beats its null's by a one-sided exact test: ``p <= level``.

        The null is either the same flags measured on the null's units (an untrained, conditioned or control
        model: a one-sided Fisher exact test that ``flags`` hold more often) or the rate ``p0`` at which a unit
        would hold by chance (an exact binomial test). The record's value is the p-value; its detail keeps both
        rates with their intervals.

        Args:
            flags: booleans, one per unit of the trained heads (seeds, (offset, seed) pairs), at least one.
            null: booleans, one per unit of the null (at least one), or a rate ``p0`` in [0, 1].
            level: the stated significance level, in (0, 1).
            against: what the null is, e.g. "the rotation transition's seeds" (a non-empty str).

        Raises:
            TypeError / ValueError: no units; ``level`` outside (0, 1); ``p0`` outside [0, 1]; an empty
            ``against``.

        Source: :func:`~lengthgen_utils.analysis.rates.fisher_p`, :func:`~lengthgen_utils.analysis.rates.binomial_p`.
        """
        if not isinstance(against, str) or not against:
            raise TypeError(f"check {name!r}: say what the null is (a non-empty str)")
        m, n = self._count(name, flags)
        if isinstance(null, numbers.Real) and not isinstance(null, bool):
            p0 = _number(name, null)
            if not 0.0 <= p0 <= 1.0:
                raise ValueError(f"check {name!r}: a null rate must be in [0, 1]; got {p0}")
            p, test, base = binomial_p(m, n, p0), "exact binomial", f"{p0:.3g}"
        else:
            m0, n0 = self._count(name, null)
            p, test, base = fisher_p(m, n, m0, n0), "Fisher exact test", rate_text(m0, n0)
        return self.beats_null(name, p, level, null=f"{against} ({test})",
                               detail=f"{rate_text(m, n)} against {base}", **tags)

    def ranks_above(self, name: str, values, null, level, *, against: str, **tags) -> bool:
        """Check that the trained heads' numbers rank above their null's: one-sided rank test, ``p <= level``.

        Where each unit carries a number (a seed's lowest accuracy up to 4x) and the claim is that the
        trained heads do better than their null, the number keeps what a flag at a threshold throws away:
        five seeds against five cannot pass a Fisher test at 0.05 with three hits against none, while a
        rank test passes when every seed beats every null seed (p = 1/252). The record's value is the
        p-value; its detail gives both groups' medians and sizes.

        Args:
            values: the trained heads' numbers (larger is better), at least one.
            null: the null's numbers (a control, an untrained or conditioned model), at least one.
            level: the stated significance level, in (0, 1).
            against: what the null is (a non-empty str).

        Raises:
            TypeError / ValueError: an empty group or ``against``; a number that is not finite; ``level``
            outside (0, 1).

        Source: :func:`~lengthgen_utils.analysis.rates.rank_sum_p`.
        """
        if not isinstance(against, str) or not against:
            raise TypeError(f"check {name!r}: say what the null is (a non-empty str)")
        x, y = ([float(v) for v in (g.tolist() if hasattr(g, "tolist") else g)] for g in (values, null))
        p = rank_sum_p(x, y)
        return self.beats_null(name, p, level, null=f"{against} (rank test)",
                               detail=f"median {statistics.median(x):.3g} of {len(x)} against "
                                      f"{statistics.median(y):.3g} of {len(y)}", **tags)

    @staticmethod
    def _count(name: str, flags) -> tuple[int, int]:
        values = [bool(f) for f in (flags.tolist() if hasattr(flags, "tolist") else flags)]
        if not values:
            raise ValueError(f"check {name!r}: a rate of no units is undefined")
        return sum(values), len(values)

    def holds(self, name: str, condition, *, code: bool = False, detail=None, **tags) -> bool:
        """Check a yes/no statement (no margin: prefer :meth:`at_least` / :meth:`at_most` where a number decides).

        ``condition`` is a bool or a one-element boolean tensor.
        """
        if hasattr(condition, "numel"):
            if condition.numel() != 1:
                raise TypeError(f"check {name!r}: the condition must be one bool (use .all() or .any())")
            condition = bool(condition.item())
        if not isinstance(condition, bool) and type(condition).__name__ != "bool_":
            raise TypeError(f"check {name!r}: the condition must be a bool; got {type(condition).__name__}")
        return self._add(name, "holds", None, None, None, bool(condition), code, detail, **tags)

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.results if not r["passed"]]

    def summary(self) -> str:
        """One line per check: ``PASS``/``FAIL``, the name, the value against its threshold and the margin."""
        lines = []
        for r in self.results:
            tag = ("pass" if r["passed"] else "FAIL") + (" (code)" if r["kind"] == "code" else "")
            if r["op"] == "holds":
                lines.append(f"{tag:<11} {r['name']}")
            else:
                lines.append(f"{tag:<11} {r['name']}: {_fmt(r['value'])} {r['op']} {_fmt(r['threshold'])} "
                             f"(margin {_fmt(r['margin'])})")
            if r["detail"]:
                lines.append(f"{'':<11}   {r['detail'] if not r['passed'] else r['detail'][:120]}")
        return "\n".join(lines)

    def record(self) -> dict:
        """What :meth:`finish` writes: the chapter, the profile, the run and every check."""
        from .scoreboard import run_id

        return {"chapter": self.chapter, "profile": get_profile().name, "run": run_id(),
                "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "checks": [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
                           for r in self.results]}

    def finish(self, show: bool = False) -> None:
        """Write every check to the run's records, then raise ``AssertionError`` naming each failed one.

        The chapter's claim records of this run are removed first
        (:func:`~lengthgen_utils.book.scoreboard.forget_chapter`): its ``record_claim`` after this call writes
        them again, so a re-run whose checks fail leaves no earlier claim on the scoreboard.

        Args:
            show: also print :meth:`summary` when every check passed.

        Raises:
            AssertionError: at least one check failed (the message lists them all with their values).
        """
        from .scoreboard import checks_path, forget_chapter

        forget_chapter(self.chapter)  # a claim never outlives the checks that made it (re-recorded if they pass)
        path = checks_path(self.chapter)
        folder = path.parent
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(self.record(), f, indent=1, allow_nan=False)
        os.replace(tmp, path)
        if self.failed:
            raise AssertionError(f"{len(self.failed)} of {len(self.results)} checks failed:\n" + self.summary())
        self.finished = True
        if show:
            print(self.summary())

    def record_claim(self, claim: str, status: str, summary: str, numbers: dict | None = None) -> None:
        """Record ``claim`` for the scoreboard with the status these checks derive (after :meth:`finish`).

        The evidence is the checks tagged ``evidence_for=claim`` or ``evidence_against=claim``, read from this
        object, in memory; the record is the one :func:`~lengthgen_utils.book.scoreboard.record_claim` writes
        for this chapter.

        Args:
            claim, status, summary, numbers: as :func:`~lengthgen_utils.book.scoreboard.record_claim`.

        Raises:
            RuntimeError: :meth:`finish` has not run, or raised (a claim never outlives its checks).
            ValueError: no check is tagged for or against ``claim``.
            ValueError / TypeError: as :func:`~lengthgen_utils.book.scoreboard.record_claim` (a derived status
                other than the stated one is written, then raised).
        """
        from .scoreboard import record_claim

        if not self.finished:
            raise RuntimeError(f"{self.chapter}: call check.finish() before check.record_claim (and only "
                               "after every check passed)")
        evidence = {role: [r["name"] for r in self.results if claim in r[role]] for role in ("for", "against")}
        if not evidence["for"] and not evidence["against"]:
            raise ValueError(f"{self.chapter}: no check is tagged evidence_for={claim!r} or "
                             f"evidence_against={claim!r}; tag the checks that bear on it where they are made")
        record_claim(claim, status, summary, numbers, chapter=self.chapter, evidence=evidence,
                     checks=self.record()["checks"])


def _fmt(x) -> str:
    if x is None:
        return "nan"
    if isinstance(x, float) and (x == 0 or 1e-3 <= abs(x) < 1e4):
        return f"{x:.4g}"
    return f"{x:.3g}"
