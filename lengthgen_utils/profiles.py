"""Run profiles: how much compute a build of the book spends (``LENGTHGEN_PROFILE`` = quick | default | full).

* ``quick``: CI and the tests; every chapter well under a minute on 2 CPU cores;
* ``default``: the web book; every chapter a few minutes at most on 2 CPU cores;
* ``full``: paper-scale sweeps, a GPU when present.

A chapter's claim checks hold in every profile, with tolerances that fit it. Where the science
needs more runs than ``default`` can afford, ``default`` runs what fits and says so.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ._validate import check_int, check_int_sequence

PROFILE_ENV = "LENGTHGEN_PROFILE"


@dataclass(frozen=True)
class Profile:
    """How much compute a run of the book spends.

    Attributes:
        name: ``"quick"``, ``"default"`` or ``"full"``.
        n_seeds: models per ensemble (independent initialisations).
        steps: optimiser steps of the single-head model.
        batch_size: sequences per step.
        eval_samples: sequences per evaluation length.
        length_multiples: evaluation lengths as multiples of the training length.
        offsets: the offsets k a sweep covers.
        attentions: the attention normalisers a sweep covers (``"softmax"``, ``"linear"``).
        transformer: the multi-layer transformer's settings (fields of
            :class:`~lengthgen_utils.configs.TransformerExperiment`), as ``(name, value)`` pairs.
    """

    name: str
    n_seeds: int
    steps: int
    batch_size: int
    eval_samples: int
    length_multiples: tuple[int, ...]
    offsets: tuple[int, ...] = (1, 2, 3, 5)
    attentions: tuple[str, ...] = ("softmax", "linear")
    transformer: tuple[tuple[str, object], ...] = ()

    def __post_init__(self):
        check_int("n_seeds", self.n_seeds, minimum=1)
        check_int("steps", self.steps, minimum=1)
        object.__setattr__(self, "length_multiples", check_int_sequence("length_multiples", self.length_multiples, 1))
        object.__setattr__(self, "offsets", check_int_sequence("offsets", self.offsets, minimum=1))
        object.__setattr__(self, "attentions", tuple(self.attentions))
        object.__setattr__(self, "transformer", tuple(dict(self.transformer).items()))


PROFILES = {
    # Transformers are the book's most expensive models on a CPU. quick and default train width 64
    # (d_head 16: 8 RoPE frequency pairs); full trains the reconstruction's d_model 128. Chapter 7 says so.
    "quick": Profile("quick", n_seeds=5, steps=500, batch_size=256, eval_samples=512,
                     length_multiples=(1, 2, 4, 8, 16), offsets=(1, 3, 5),
                     transformer=dict(d_model=64, batch_size=16, steps=200, lr=3e-3, n_seeds=3,
                                      eval_samples=32).items()),
    "default": Profile("default", n_seeds=8, steps=2000, batch_size=256, eval_samples=2048,
                       length_multiples=(1, 2, 4, 8, 16), offsets=(1, 2, 3, 5),
                       transformer=dict(d_model=64, batch_size=32, steps=300, lr=2e-3, n_seeds=3,
                                        eval_samples=128).items()),
    "full": Profile("full", n_seeds=16, steps=4000, batch_size=256, eval_samples=4096,
                    length_multiples=(1, 2, 4, 8, 16, 32, 64), offsets=(1, 2, 3, 5, 8),
                    transformer=dict(d_model=128, batch_size=64, steps=1500, lr=1e-3, n_seeds=5,
                                     eval_samples=256).items()),
}


def get_profile(name: str | None = None) -> Profile:
    """The profile named ``name``, else by ``$LENGTHGEN_PROFILE``, else ``"default"``.

    Raises:
        ValueError: the name is not one of ``quick``, ``default``, ``full``.
    """
    name = name if name is not None else os.environ.get(PROFILE_ENV, "default")
    if name not in PROFILES:
        raise ValueError(f"profile must be one of {tuple(PROFILES)} (argument or ${PROFILE_ENV}); got {name!r}")
    return PROFILES[name]
