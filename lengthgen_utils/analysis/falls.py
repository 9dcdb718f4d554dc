"""How a head's accuracy falls with length: where it first fails, whether the fall is a cliff at the alias
the frequency set predicts or a gradual decay (chapters 4, 5 and 5b).

Accuracies are fractions ``[M, n]``, one row per head, at ``n`` increasing evaluation lengths (tokens).
Source: chapter 4, "Far keys: aliases come from the frequency set"; chapter 5, "Cliffs"; chapter 5b,
"The phase diagram".
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validate import check_int, check_int_or_none
from .kernel import carrier_spectrum, first_alias, predicted_alias_distance
from .probes import accuracy_transition
from .theory import pair_recurrences

FALLS = ("not fitted", "holds", "cliff at alias", "cliff elsewhere", "gradual", "cut off")
"""How a head's accuracy falls on the fine grid, the classes of :func:`classify_falls` (in the diagram's order)."""
FIT_LEVEL = 0.9
"""Accuracy at the training length (and the level every rule here predicts) at which a head counts as fitted."""
CLIFF_WIDTH = 0.55
"""Octaves: a fall from 0.9 to halfway to chance at most this wide is a cliff: at most two steps of the fine grid
(half an octave; up to 0.524 octave between its rounded lengths, e.g. 16 to 23), where three steps are 0.75."""
ALIAS_SHARE = 0.5
"""A cliff is at the alias when at least this share of the head's drop happens within one grid step of it."""


def first_failure(lengths, accuracy, threshold: float = 0.95) -> list:
    """Each model's first evaluated length with accuracy below ``threshold``.

    Args:
        lengths: ``[n]`` evaluated lengths (tokens), in increasing order.
        accuracy: ``[M, n]`` accuracy (fraction) of each model at each length.
        threshold: the accuracy that counts as failing below it.

    Returns:
        per model, the first length with accuracy ``< threshold`` (int), or None where none is.

    Raises:
        ValueError: ``accuracy`` is not ``[M, len(lengths)]``.

    Source: chapter 4, "Far keys: aliases come from the frequency set".
    """
    lengths = [int(L) for L in lengths]
    acc = np.asarray(accuracy, dtype=float)
    if acc.ndim != 2 or acc.shape[1] != len(lengths):
        raise ValueError(f"accuracy must be [M, {len(lengths)}] (one column per length); got {acc.shape}")
    return [next((L for L, a in zip(lengths, row) if a < threshold), None) for row in acc]


def first_length_holding(alias, lengths) -> list:
    """Each model's first evaluated length that holds its alias: the first ``L >= d + 1``.

    Args:
        alias: per model, an alias distance ``d`` (tokens) or None (no alias).
        lengths: evaluated lengths (tokens), in increasing order.

    Returns:
        per model, that length (int), or None where the alias is None or beyond every length.

    Raises:
        TypeError: ``alias`` holds something other than ints and None.

    Source: chapter 4, "Far keys: aliases come from the frequency set".
    """
    alias = [check_int_or_none(f"alias[{i}]", a) for i, a in enumerate(alias)]
    return [next((L for L in lengths if a is not None and L >= a + 1), None) for a in alias]


def drop_near_alias(accuracy, lengths, alias_lengths, window: int = 1):
    """Per head, the share of its accuracy drop that happens in one step of the grid at a given length.

    The drop of head ``i`` is ``accuracy[i, 0] - min(accuracy[i])``; a step is the change between two
    neighbouring lengths. The share is the largest single-step fall whose right end lies within ``window``
    steps of ``alias_lengths[i]`` (the first length holding the head's predicted alias), over the drop.
    A cliff at the alias gives a share near 1; a decay spread over many steps, as a dilution law would give
    (on chapter 5's grid, four lengths per octave), a small one; a cliff elsewhere, about 0.

    Args:
        accuracy: ``[M, n]`` accuracies at increasing ``lengths``.
        lengths: ``n`` increasing lengths (tokens).
        alias_lengths: ``M`` lengths, each one of ``lengths`` or ``None`` (no alias on the grid).
        window: steps either side of the alias's length that count (>= 0).

    Returns:
        numpy float ``[M]`` in ``[0, 1]``; NaN where the head does not drop or has no alias length.

    Raises:
        ValueError / TypeError: ``accuracy`` is not ``[M, n]``, ``alias_lengths`` not ``M`` long or a length not
            on the grid, ``window`` not an int >= 0.

    Source: chapter 5, "Cliffs: the heads of the book's recipe".
    """
    window = check_int("window", window, minimum=0)
    lengths = [int(L) for L in lengths]
    acc = np.asarray(accuracy, dtype=float)
    if acc.ndim != 2 or acc.shape[1] != len(lengths):
        raise ValueError(f"accuracy must be [M, {len(lengths)}] (one column per length); got {acc.shape}")
    alias_lengths = list(alias_lengths)
    if len(alias_lengths) != acc.shape[0]:
        raise ValueError(f"alias_lengths must hold one entry per head ({acc.shape[0]}); got {len(alias_lengths)}")
    out = np.full(acc.shape[0], np.nan)
    steps = acc[:, :-1] - acc[:, 1:]  # column t: the fall from lengths[t] to lengths[t + 1]
    for i, L in enumerate(alias_lengths):
        if L is None:
            continue
        if int(L) not in lengths:
            raise ValueError(f"alias_lengths[{i}] = {L} is not one of the lengths")
        drop = acc[i, 0] - acc[i].min()
        if drop <= 0:
            continue
        j = lengths.index(int(L))  # the step into L is column j - 1
        near = steps[i, max(j - 1 - window, 0): max(j + window, 0)]
        out[i] = float(np.clip(near.max(initial=0.0) / drop, 0.0, 1.0))
    return out


def classify_falls(accuracy, lengths, alias_lengths, chance: float) -> list[str]:
    """How each head's accuracy falls with length: one of :data:`FALLS` per head, by a stated rule.

    With :func:`~lengthgen_utils.analysis.probes.accuracy_transition` (``L_high``: first length below 0.9;
    ``L_half``: first below halfway to chance; the width ``log2(L_half / L_high)`` octaves):

    * **not fitted**: below 0.9 already at the first length (the training length);
    * **holds**: never below 0.9 on the grid;
    * **cliff**: width at most :data:`CLIFF_WIDTH` octaves; **at alias** when at least :data:`ALIAS_SHARE` of
      the drop happens within one grid step of the first length holding the head's predicted alias
      (:func:`drop_near_alias`), **elsewhere** otherwise (or without an alias);
    * **gradual**: wider than :data:`CLIFF_WIDTH`, or below 0.9 but never below halfway on the grid, with
      ``L_high`` three or more grid steps before the grid's end would continue (so its width is more than a
      cliff's two steps);
    * **cut off**: first below 0.9 at one of the grid's last two lengths and never below halfway: a cliff's two
      steps would end beyond the grid, so the grid cannot tell a cliff from a gradual fall.

    Args:
        accuracy: ``[M, n]`` accuracies at ``lengths``.
        lengths: ``n`` increasing lengths (tokens), a fine grid (four per octave in the book).
        alias_lengths: ``M`` entries, each one of ``lengths`` or None (no predicted alias on the grid).
        chance: the task's chance accuracy.

    Returns:
        ``M`` strings from :data:`FALLS`.

    Raises:
        ValueError / TypeError: as :func:`~lengthgen_utils.analysis.probes.accuracy_transition` and
            :func:`drop_near_alias`.

    Source: chapter 5b, "The phase diagram".
    """
    fall = accuracy_transition(accuracy, lengths, chance=chance, high=FIT_LEVEL, cliff=CLIFF_WIDTH,
                               gradual=CLIFF_WIDTH + 1e-9)
    share = drop_near_alias(np.asarray(accuracy, dtype=float), lengths, alias_lengths)
    out = []
    for kind, high, s in zip(fall["kind"], fall["high"], share):
        if kind == "not learned":
            out.append("not fitted")
        elif kind == "holds":
            out.append("holds")
        elif kind == "cliff":
            out.append("cliff at alias" if s >= ALIAS_SHARE else "cliff elsewhere")
        elif kind == "partial" and list(lengths).index(high) >= len(lengths) - 2:
            out.append("cut off")  # a cliff's two steps from L_high would end beyond the grid
        else:  # gradual, or partial whose width is already more than a cliff's
            out.append("gradual")
    return out


@dataclass(frozen=True)
class AliasReport:
    """The aliases of a RoPE head ensemble, predicted and scanned, against where its accuracy fails
    (:meth:`of`). Per-head fields hold one entry per head, in the ensemble's order.

    Attributes:
        predicted: the alias distance :func:`~lengthgen_utils.analysis.kernel.predicted_alias_distance`
            reads off the dominant frequency pairs (tokens), or None.
        scanned: the first alias :func:`~lengthgen_utils.analysis.kernel.first_alias` finds in the kernel
            (tokens), or None.
        fail: the first evaluated length with accuracy below 0.95 (:func:`first_failure`), or None.
        predicted_fail: the first evaluated length holding the predicted alias (:func:`first_length_holding`).
        coverage: the median over heads of the share of lags ``1 .. max_distance`` where the dominant pairs
            recur (a prediction that covers most lags predicts little).
        longest: the longest evaluated length (tokens).
        offsets: each head's target offset k.
    """

    predicted: list
    scanned: list
    fail: list
    predicted_fail: list
    coverage: float
    longest: int
    offsets: list

    @classmethod
    def of(cls, model, offsets, lengths, accuracy, train_len: int, max_distance: int) -> "AliasReport":
        """The report of ``model``.

        Args:
            model: a RoPE head ensemble of M heads.
            offsets: the target offset k of each head.
            lengths: ``[n]`` evaluated lengths (tokens); accuracy: ``[M, n]`` (fraction).
            train_len: the training length (tokens).
            max_distance: the largest distance searched for an alias (tokens).

        Raises:
            ValueError / TypeError: from the kernel functions (bad offsets or distances) or :func:`first_failure`.

        Source: chapter 4, "Far keys: aliases come from the frequency set".
        """
        predicted, dominant = predicted_alias_distance(model, offsets, train_len, max_distance)
        scanned = first_alias(model, offsets, train_len, max_distance)
        theta = carrier_spectrum(model).theta
        coverage = float(np.median([len(pair_recurrences(theta, d.tolist(), max_distance)) / max_distance
                                    for d in dominant]))
        return cls(predicted=predicted, scanned=scanned, fail=first_failure(lengths, accuracy),
                   predicted_fail=first_length_holding(predicted, lengths), coverage=coverage,
                   longest=max(lengths), offsets=list(offsets))
