"""Rates with their uncertainty, and one-sided tests of trained heads against a null.

A rate measured on 10-40 heads (seeds, offsets) moves by a few heads from one seed set to the next.
A check on such a rate therefore asks one of two things, never "the rate exceeds a value a few heads
under what some seed sets gave":

* **an interval against a bound the claim states**: the Wilson 95% interval of ``m`` of ``n``
  (:func:`wilson_interval`) must clear the bound, its lower end for "at least", its upper end for
  "at most";
* **a test against the null**: the trained heads beat their null with a one-sided p-value below a
  stated level, exact where the null is a rate (:func:`binomial_p`, :func:`fisher_p`) and a
  permutation p-value where the null is a distribution of draws (:func:`permutation_p`), or a rank
  test where each unit carries a number rather than a flag (:func:`rank_sum_p`).

Sources: E. B. Wilson, "Probable inference, the law of succession, and statistical inference" (JASA
1927); R. A. Fisher, *Statistical Methods for Research Workers* (1925), the exact test of a 2x2
table; B. Phipson and G. K. Smyth, "Permutation p-values should never be zero" (2010), the ``+1``
of :func:`permutation_p`; H. B. Mann and D. R. Whitney, "On a test of whether one of two random
variables is stochastically larger than the other" (Ann. Math. Statist. 1947), :func:`rank_sum_p`.
"""
from __future__ import annotations

import bisect
import itertools
import math

from .._validate import check_int

Z95 = 1.959963984540054
"""The two-sided 95% normal quantile, ``Phi^-1(0.975)``."""


def _counts(m, n) -> tuple[int, int]:
    n = check_int("n", n, minimum=1)
    m = check_int("m", m, minimum=0, maximum=n)
    return m, n


def _probability(name: str, p) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1]; got {p!r}")
    return float(p)


def wilson_interval(m: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a rate ``m`` of ``n`` (95% by default).

    ``(p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)`` with ``p = m/n``; unlike the normal
    interval it stays inside [0, 1] and is not empty at ``m = 0`` or ``m = n``.

    Args:
        m: units (heads, seeds) for which the event holds, ``0 <= m <= n``.
        n: units, ``>= 1``.
        z: the normal quantile (> 0; 1.96 for 95%).

    Returns:
        ``(low, high)``, fractions in [0, 1].

    Raises:
        ValueError / TypeError: ``n < 1``, ``m`` outside ``0 .. n``, ``z <= 0``.

    Source: Wilson 1927.
    """
    m, n = _counts(m, n)
    if isinstance(z, bool) or not isinstance(z, (int, float)) or not z > 0:
        raise ValueError(f"z must be a positive number (1.96 for 95%); got {z!r}")
    p, z2 = m / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    low, high = max(0.0, centre - half), min(1.0, centre + half)
    return (0.0 if m == 0 else low), (1.0 if m == n else high)  # exact ends where rounding misses them


def rate_text(m: int, n: int) -> str:
    """A rate as the scoreboard and the checks quote it: ``"17/20 = 0.85 (95% CI 0.64-0.95)"``."""
    low, high = wilson_interval(m, n)
    return f"{m}/{n} = {m / n:.2f} (95% CI {low:.2f}-{high:.2f})"


def binomial_p(m: int, n: int, p0: float) -> float:
    """One-sided exact binomial p-value: ``P(X >= m)`` for ``X ~ Binomial(n, p0)``.

    How often units that each hit with the null's rate ``p0`` would reach ``m`` hits of ``n``.

    Raises:
        ValueError / TypeError: counts out of range, ``p0`` outside [0, 1].
    """
    m, n = _counts(m, n)
    p0 = _probability("p0", p0)
    return min(1.0, sum(math.comb(n, j) * p0 ** j * (1 - p0) ** (n - j) for j in range(m, n + 1)))


def fisher_p(m1: int, n1: int, m2: int, n2: int) -> float:
    """One-sided Fisher exact p-value that group 1's rate exceeds group 2's.

    With ``m1`` of ``n1`` and ``m2`` of ``n2`` and the margins fixed, the probability (hypergeometric)
    that group 1 holds at least ``m1`` of the ``m1 + m2`` events.

    Raises:
        ValueError / TypeError: counts out of range.

    Source: Fisher 1925.
    """
    m1, n1 = _counts(m1, n1)
    m2, n2 = _counts(m2, n2)
    events, total = m1 + m2, n1 + n2
    hi = min(events, n1)
    return min(1.0, sum(math.comb(n1, j) * math.comb(n2, events - j) for j in range(m1, hi + 1))
               / math.comb(total, events))


def permutation_p(statistic: float, null) -> float:
    """One-sided permutation p-value: ``(1 + #{null >= statistic}) / (1 + len(null))``.

    Args:
        statistic: the trained heads' value (larger is better).
        null: the statistic on null draws (a sequence or a 1-d tensor of numbers, at least one).

    Raises:
        ValueError: no null draws; a statistic or draw that is not finite.

    Source: Phipson and Smyth 2010 (the observed value counts as one draw of the null, so p > 0).
    """
    values = [float(v) for v in (null.tolist() if hasattr(null, "tolist") else null)]
    if not values:
        raise ValueError("null must hold at least one draw")
    if not all(math.isfinite(v) for v in values) or not math.isfinite(float(statistic)):
        raise ValueError(f"the statistic and every null draw must be finite; got statistic {statistic!r}")
    return (1 + sum(v >= float(statistic) - 1e-12 for v in values)) / (1 + len(values))


def rank_sum_p(values, null, max_splits: int = 200_000) -> float:
    """One-sided permutation p-value that ``values`` rank above ``null`` (the Mann-Whitney statistic).

    The statistic is ``U``, the number of (value, null) pairs in which the value is larger (ties count
    one half), i.e. the sum of the values' mid-ranks in the pooled sample less its least possible sum.
    Its null distribution is that of every split of the pooled sample into groups of the two sizes:
    enumerated exactly up to ``max_splits`` splits (5 against 5: 252; 10 against 10: 184,756), else
    drawn (``max_splits`` random splits, generator seed 0, :func:`permutation_p`). Ties are exact.

    Args:
        values: the trained heads' numbers (larger is better), a sequence or 1-d tensor, at least one.
        null: the null's numbers, at least one.

    Returns:
        ``P(U_split >= U_observed)``, in (0, 1].

    Raises:
        ValueError: an empty group; a number that is not finite.

    Source: H. B. Mann and D. R. Whitney (1947); the exact permutation test of the rank sum.
    """
    x = [float(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]
    y = [float(v) for v in (null.tolist() if hasattr(null, "tolist") else null)]
    if not x or not y:
        raise ValueError(f"values and null must each hold at least one number; got {len(x)} and {len(y)}")
    if not all(math.isfinite(v) for v in x + y):
        raise ValueError("values and null must be finite")
    pooled = sorted(x + y)  # a value's mid-rank: the mean of the 1-based ranks its ties occupy
    ranks = [(bisect.bisect_left(pooled, v) + bisect.bisect_right(pooled, v) + 1) / 2 for v in x + y]
    observed = sum(ranks[: len(x)])
    if math.comb(len(ranks), len(x)) <= max_splits:  # every split, exactly
        sums = [sum(ranks[i] for i in split) for split in itertools.combinations(range(len(ranks)), len(x))]
        return sum(s >= observed - 1e-9 for s in sums) / len(sums)
    import torch

    gen = torch.Generator().manual_seed(0)
    table = torch.tensor(ranks, dtype=torch.float64)
    chunks = [min(10_000, max_splits - start) for start in range(0, max_splits, 10_000)]  # bounded memory
    draws = torch.cat([table[torch.rand(n, len(ranks), generator=gen).argsort(1)[:, : len(x)]].sum(1)
                       for n in chunks])  # random splits: the first len(x) of a random order
    return permutation_p(observed, draws)


def shuffled_agreement(predicted, measured, groups=None, n_null: int = 2000, seed: int = 0) -> dict:
    """How often a per-head prediction equals the measured value, against the same measurements shuffled among
    the heads (within each group).

    The null knows how often each measured value occurs (in each group: e.g. each RoPE base) but not which
    head has which: a predictor that guesses "the usual" scores its mean.

    Args:
        predicted, measured: one value per head (ints, None for "none"; compared with ``==``), equal lengths.
        groups: one label per head (default: one group); heads are shuffled only within their group.
        n_null: shuffles (>= 1); seed: their seed.

    Returns:
        ``{"agree": [bool per head], "share": float, "null": float64 [n_null] shares, "p": the one-sided
        permutation p-value of share against null (:func:`permutation_p`)}``.

    Raises:
        ValueError: lengths differ or no heads.
    """
    import torch

    predicted, measured = list(predicted), list(measured)
    groups = [0] * len(predicted) if groups is None else list(groups)
    if not predicted or len(measured) != len(predicted) or len(groups) != len(predicted):
        raise ValueError(f"predicted, measured and groups must be equal, non-empty lengths; got "
                         f"{len(predicted)}, {len(measured)}, {len(groups)}")
    n_null = check_int("n_null", n_null, minimum=1)
    agree = [p == m for p, m in zip(predicted, measured)]
    members = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    gen = torch.Generator().manual_seed(check_int("seed", seed, minimum=0))
    null = torch.empty(n_null, dtype=torch.float64)
    for t in range(n_null):
        hits = 0
        for idx in members.values():
            perm = torch.randperm(len(idx), generator=gen).tolist()
            hits += sum(predicted[i] == measured[idx[j]] for i, j in zip(idx, perm))
        null[t] = hits / len(predicted)
    share = sum(agree) / len(agree)
    return {"agree": agree, "share": share, "null": null, "p": permutation_p(share, null)}
