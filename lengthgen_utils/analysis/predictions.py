"""Aliases predicted before training: from the frequency set and the training length alone.

Chapter 4 finds that a trained RoPE head stops extrapolating at an *alias*, a far key where its
offset kernel comes back near the target's logit, and that the alias sits where the head's dominant
frequency pairs nearly repeat their phases. This module turns that into a prediction that needs no
trained weight and no long sequence: a function of ``(base, d_head, offset k, train_len)``.

**The rule.**

1. *Selecting pairs.* Pair ``i`` can tell the window's relative positions apart only if it turns
   by at least a quarter turn across the training window: ``theta_i * train_len >= pi / 2``.
   Slower pairs are nearly constant (or nearly linear) over the window and act there as a bias;
   training has no way to align them with the offset (chapter 4's "pair 3 moves the logit by a
   fraction of its amplitude across the window").
2. *Candidate lags.* A kernel that selects with these pairs comes back near its target value at
   the lags ``Delta`` where every selecting pair is within ``pi / 4`` of a whole number of turns,
   ``|wrap(theta_i Delta)| <= pi / 4`` (each keeps at least ``cos(pi/4) = 71%`` of its amplitude).
3. *Prediction.* The first alias of a head with offset ``k`` is the first candidate distance
   ``d = k + Delta >= train_len``; a sequence of length ``L`` holds it once ``L >= d + 1``, so that
   is the first length at which the head can fail. Whether a given head does fail there depends
   on its slow pairs (its weights), which the rule does not see: it predicts *where* failures can
   happen and the earliest one, not *whether* a seed fails.

The tolerance ``pi / 4`` was chosen with chapter 4's base-``10^4`` heads in view (with ``pi / 3``
the rule would predict a lag of 57, where no trained head aliases); every other setting in the
committed file is scored by chapters that train after reading it. A setting where the rule fails
is kept in the file on purpose: the base-500 transformer of chapter 7's exercises.

The predictions for the book's settings are written once by
``python -m lengthgen_utils predict`` to ``predictions/alias_predictions.json`` at the top of the
repository and committed; chapters 1, 4 and 7 read that file, then train, then score it
(:func:`score_lags` compares the hits with a null of random lags).
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import torch
from torch import Tensor

from .._validate import check_int, check_positive_float
from ..core.rope import rope_inverse_frequencies

QUARTER_TURN = math.pi / 2
"""A pair selects inside the window if it turns by at least this angle across it (radians)."""

PHASE_TOLERANCE = math.pi / 4
"""Largest phase error, per selecting pair, at a candidate lag (radians)."""

PREDICTIONS_FILE = Path(__file__).resolve().parents[2] / "predictions" / "alias_predictions.json"
"""The committed predictions (written by ``python -m lengthgen_utils predict``)."""

COMMAND = "python -m lengthgen_utils predict"

# The book's settings: (name, base, d_head, train_len, offsets, max_distance). The single heads of
# chapters 1, 4 and 5 (d_head 16, windows of 16 tokens, every base of chapter 4's sweep), chapter 1's
# d_head 8 exercise, and chapter 7's transformer (d_head 16 in quick and default, 32 in full; windows
# of 32 tokens) with the base-500 variant of its exercises.
BOOK_SETTINGS = (
    *(("single head", b, 16, 16, (1, 2, 3, 5, 8), 16384) for b in (10.0, 1e2, 1e3, 1e4, 1e5)),
    ("single head", 1e4, 8, 16, (1, 2, 3, 5, 8), 16384),
    ("transformer", 1e4, 16, 32, (1, 3, 5, 9), 4096),
    ("transformer", 1e4, 32, 32, (1, 3, 5, 9), 4096),
    ("transformer", 500.0, 16, 32, (1, 3, 5, 9), 4096),
)


def selecting_pairs(base: float, d_head: int, train_len: int) -> list[int]:
    """The pairs that turn by at least a quarter turn across the training window.

    ``{i : theta_i * train_len >= pi / 2}`` with RoPE's ``theta_i = base^(-2i / d_head)``.

    Args:
        base: RoPE base (> 0).
        d_head: head width (even, >= 2).
        train_len: the training length (tokens, >= 2).

    Returns:
        the pair indices, increasing (pair 0 always turns fastest, so the list is ``0 .. n-1``).

    Raises:
        ValueError / TypeError: arguments out of range.
    """
    theta = _theta(base, d_head)
    train_len = check_int("train_len", train_len, minimum=2)
    return [i for i, t in enumerate(theta.tolist()) if t * train_len >= QUARTER_TURN]


def candidate_lags(base: float, d_head: int, train_len: int, max_lag: int) -> Tensor:
    """The lags ``Delta in 1 .. max_lag`` at which every selecting pair is within ``pi / 4`` of a whole turn.

    Args:
        base, d_head, train_len: as in :func:`selecting_pairs`.
        max_lag: the largest lag considered (>= 1).

    Returns:
        long ``[n]``, increasing (empty when no lag qualifies).
    """
    theta = _theta(base, d_head)
    pairs = selecting_pairs(base, d_head, train_len)
    lags = torch.arange(1, check_int("max_lag", max_lag, minimum=1) + 1)
    phase = theta[pairs][:, None] * lags.double()[None, :]
    error = torch.remainder(phase + math.pi, 2 * math.pi) - math.pi
    return lags[(error.abs() <= PHASE_TOLERANCE).all(0)]


def predict(base: float, d_head: int, offset: int, train_len: int, max_distance: int) -> dict:
    """The prediction for one head: its selecting pairs, candidate alias distances and first alias.

    Args:
        base, d_head, train_len: as in :func:`selecting_pairs`.
        offset: the task's offset k (1 .. train_len - 2).
        max_distance: the largest distance considered (>= train_len).

    Returns:
        ``{"pairs": [...], "distances": [d, ...] (every candidate d = k + Delta >= train_len, up to
        max_distance), "first_alias": d or None, "first_failing_length": d + 1 or None}``.

    Source: the rule in this module's docstring; chapter 4's "Aliases come from the frequency set".
    """
    train_len = check_int("train_len", train_len, minimum=3)
    k = check_int("offset", offset, minimum=1, maximum=train_len - 2)
    max_distance = check_int("max_distance", max_distance, minimum=train_len)
    lags = candidate_lags(base, d_head, train_len, max_distance - k)
    distances = [int(d) for d in (lags + k).tolist() if d >= train_len]
    first = distances[0] if distances else None
    return {"pairs": selecting_pairs(base, d_head, train_len), "distances": distances,
            "first_alias": first, "first_failing_length": None if first is None else first + 1}


def book_predictions() -> dict:
    """Every prediction for :data:`BOOK_SETTINGS`, as written to :data:`PREDICTIONS_FILE`."""
    rows = []
    for name, base, d_head, train_len, offsets, max_distance in BOOK_SETTINGS:
        for k in offsets:
            p = predict(base, d_head, k, train_len, max_distance)
            rows.append({"setting": name, "base": base, "d_head": d_head, "train_len": train_len, "offset": k,
                         "max_distance": max_distance, **p})
    return {"command": COMMAND,
            "rule": "selecting pairs: theta_i * train_len >= pi/2; candidate lags: every selecting pair within "
                    "pi/4 of a whole turn; first alias: the first candidate distance k + lag >= train_len; "
                    "first failing length: first alias + 1",
            "predictions": rows}


def write_predictions(path: Path | str = PREDICTIONS_FILE) -> Path:
    """Write :func:`book_predictions` as JSON to ``path`` (default: the committed file) and return it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = book_predictions()
    rows = ",\n".join("  " + json.dumps(row) for row in data.pop("predictions"))  # one head per line
    head = json.dumps(data, indent=1)[:-2]
    path.write_text(f'{head},\n "predictions": [\n{rows}\n ]\n}}\n')
    return path


def load_prediction(setting: str, base: float, d_head: int, offset: int, train_len: int,
                    path: Path | str = PREDICTIONS_FILE) -> dict:
    """The committed prediction for one head, read from the file (not recomputed).

    Raises:
        FileNotFoundError: the file is missing (write it with ``python -m lengthgen_utils predict``).
        KeyError: the file has no row for these settings (the message lists the settings it has).
    """
    rows = _committed_rows(str(path))
    for row in rows:
        if (row["setting"], row["base"], row["d_head"], row["offset"], row["train_len"]) == (
                setting, float(base), d_head, offset, train_len):
            return dict(row)  # a copy: the parsed rows are shared
    have = sorted({(r["setting"], r["base"], r["d_head"], r["train_len"]) for r in rows})
    raise KeyError(f"no committed prediction for setting={setting!r}, base={base}, d_head={d_head}, "
                   f"offset={offset}, train_len={train_len}; the file has {have}")


@functools.lru_cache(maxsize=4)
def _committed_rows(path: str) -> tuple:
    """The rows of a committed predictions file, parsed once per process (a chapter reads one row per head)."""
    return tuple(json.loads(Path(path).read_text())["predictions"])


def score_lags(measured: list, candidates: list, max_lag: int, n_null: int = 2000, seed: int = 0) -> dict:
    """How often measured alias lags fall in a candidate set, against sets of random lags of the same size.

    Args:
        measured: the measured lags (ints; None entries, heads without an alias, are left out).
        candidates: the predicted candidate lags (ints in ``1 .. max_lag``).
        max_lag: the probed range ``1 .. max_lag`` the null draws from.
        n_null: null draws.
        seed: the null's seed.

    Returns:
        ``{"n": heads scored, "hits": share of measured lags in the candidates, "null_hits": [n_null]
        shares for random sets, "null_q99": their 99th percentile, "p": the share of random sets that
        hold at least as many of the measured lags as the candidates do}``.
    """
    max_lag = check_int("max_lag", max_lag, minimum=1)
    lags = [check_int("measured lag", m, 1, max_lag) for m in measured if m is not None]
    cand = sorted({check_int("candidate lag", c, 1, max_lag) for c in candidates})
    if not lags:
        raise ValueError("measured holds no lag to score (every entry is None)")
    hits = sum(m in set(cand) for m in lags) / len(lags)
    g = torch.Generator().manual_seed(check_int("seed", seed, minimum=0))
    n = check_int("n_null", n_null, minimum=1)
    measured_t = torch.tensor(lags)
    null = torch.empty(n, dtype=torch.float64)
    for i in range(n):
        guess = torch.randperm(max_lag, generator=g)[: len(cand)] + 1
        null[i] = torch.isin(measured_t, guess).double().mean()
    return {"n": len(lags), "hits": hits, "null_hits": null, "null_q99": float(null.quantile(0.99)),
            "p": float((null >= hits - 1e-12).double().mean())}


def _theta(base: float, d_head: int) -> Tensor:
    base = check_positive_float("base", base)
    d_head = check_int("d_head", d_head, minimum=2)
    if d_head % 2:
        raise ValueError(f"d_head must be even (RoPE turns pairs of channels); got d_head={d_head}")
    return rope_inverse_frequencies(d_head, base)
