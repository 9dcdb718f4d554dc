"""The seed base: one integer that moves every random draw of the book to another, disjoint seed set.

Every generator the package and the chapters create is made by :func:`generator` from a *logical*
seed: ``0 .. n_seeds - 1`` for the models of an ensemble, ``data_seed`` for a training stream,
12345 for an evaluation sample, ``1_000_000 + i`` for the untrained heads of a null. The generator
is seeded with ``logical + SEED_STRIDE * base``, where the base is ``$LENGTHGEN_SEED`` (an integer
>= 0, default 0). Base 0 is the book as it always was; base 1 retrains every model from other
initialisations on other data and evaluates it on other sequences, so a whole build can be repeated
on another seed set (``python -m lengthgen_utils robustness`` does). The stride is larger than any
logical seed the book uses, so two bases never share a seed.

The base is part of every results-cache key (:func:`~lengthgen_utils.run.cache.cache_description`), so a
result computed under one base is never served under another.
"""
from __future__ import annotations

import torch

from .._validate import check_int, env_int

SEED_ENV = "LENGTHGEN_SEED"
SEED_STRIDE = 10_000_019
"""Logical seeds stay below this (a prime above the largest logical seed the book uses, ``1_000_000 + 4000``
for chapter 4's nulls); base ``b`` adds ``b * SEED_STRIDE``."""


MAX_SEED_BASE = (2**63 - SEED_STRIDE) // SEED_STRIDE
"""The largest seed base: every effective seed ``logical + SEED_STRIDE * base`` then fits a signed 64-bit
integer (a larger base would pass as an integer here and overflow inside ``torch.Generator.manual_seed``)."""


def seed_base() -> int:
    """The seed base: ``$LENGTHGEN_SEED`` as an integer in ``[0, MAX_SEED_BASE]``, or 0 when it is unset or empty.

    Read by :func:`~lengthgen_utils._validate.env_int` (surrounding spaces stripped, empty means unset).

    Raises:
        ValueError: ``$LENGTHGEN_SEED`` is set to something that is not such an integer (e.g. ``-1``, ``abc``,
            ``2000000000000``, past :data:`MAX_SEED_BASE`).
    """
    base = env_int(SEED_ENV, 0, MAX_SEED_BASE, "the seed base; 0 is the book's own seeds")
    return 0 if base is None else base


def effective_seed(seed: int) -> int:
    """The seed a generator for logical seed ``seed`` is actually seeded with: ``seed + SEED_STRIDE * base``.

    Raises:
        TypeError / ValueError: ``seed`` is not an int in ``[0, SEED_STRIDE)``; a bad ``$LENGTHGEN_SEED``.
    """
    seed = check_int("seed", seed, minimum=0, maximum=SEED_STRIDE - 1)
    return seed + SEED_STRIDE * seed_base()


def generator(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` for logical seed ``seed`` under the current seed base (:func:`effective_seed`).

    Raises:
        TypeError / ValueError: as :func:`effective_seed`.
    """
    return torch.Generator().manual_seed(effective_seed(seed))
