"""Named experiments and the run profiles (``LENGTHGEN_PROFILE`` = quick | default | full).

A chapter calls one function here per experiment, so its cells stay a few
lines long and every chapter uses the same settings for the same profile.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ._validate import check_int
from .evaluation import accuracy_by_length
from .models import RetrievalHead
from .positional import check_pe
from .tasks import FixedOffsetRetrieval
from .training import train

PROFILE_ENV = "LENGTHGEN_PROFILE"


@dataclass(frozen=True)
class Profile:
    """How much compute a run of the book spends.

    Attributes:
        name: ``"quick"`` (CI: each chapter well under a minute on 2 CPU cores),
            ``"default"`` (the web book: a few minutes per chapter at most) or
            ``"full"`` (paper-scale sweeps; GPU when present).
        n_seeds: models per ensemble (independent initialisations).
        steps: optimiser steps of the single-head model.
        batch_size: sequences per step.
        eval_samples: sequences per evaluation length.
        length_multiples: evaluation lengths as multiples of the training length.
    """

    name: str
    n_seeds: int
    steps: int
    batch_size: int
    eval_samples: int
    length_multiples: tuple[int, ...]


PROFILES = {
    "quick": Profile("quick", n_seeds=5, steps=500, batch_size=256, eval_samples=512,
                     length_multiples=(1, 2, 4, 8, 16)),
    "default": Profile("default", n_seeds=8, steps=2000, batch_size=256, eval_samples=2048,
                       length_multiples=(1, 2, 4, 8, 16)),
    "full": Profile("full", n_seeds=16, steps=4000, batch_size=256, eval_samples=4096,
                    length_multiples=(1, 2, 4, 8, 16, 32, 64)),
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


@dataclass(frozen=True)
class RetrievalExperiment:
    """One ensemble of single-head models trained on fixed-offset retrieval (DESIGN.md defaults)."""

    pe: str = "rope"
    attention: str = "softmax"
    vocab_size: int = 16
    offset: int = 3
    train_len: int = 16
    fixed_length: bool = False
    d_model: int = 32
    d_head: int = 16
    lr: float = 1e-2
    weight_decay: float = 0.0
    n_seeds: int = 5
    steps: int = 500
    batch_size: int = 256
    eval_samples: int = 512
    length_multiples: tuple[int, ...] = (1, 2, 4, 8, 16)
    data_seed: int = 0
    ape_init_std: float = 0.02
    max_len: int | None = None  # rows of the APE table; None = the longest evaluation length

    def __post_init__(self):
        check_pe(self.pe)
        check_int("train_len", self.train_len, minimum=self.offset + 2)
        check_int("n_seeds", self.n_seeds, minimum=1)
        if self.max_len is not None:
            check_int("max_len", self.max_len, minimum=self.train_len)

    @classmethod
    def from_profile(cls, profile: Profile, **overrides) -> "RetrievalExperiment":
        """The experiment with a profile's compute settings and any field overridden."""
        base = dict(n_seeds=profile.n_seeds, steps=profile.steps, batch_size=profile.batch_size,
                    eval_samples=profile.eval_samples, length_multiples=profile.length_multiples)
        return cls(**{**base, **overrides})

    @property
    def task(self) -> FixedOffsetRetrieval:
        return FixedOffsetRetrieval(self.vocab_size, self.offset)

    @property
    def eval_lengths(self) -> list[int]:
        """``train_len`` times each length multiple, up to the APE table size when ``max_len`` is set."""
        lengths = [self.train_len * m for m in self.length_multiples]
        return lengths if self.max_len is None else [L for L in lengths if L <= self.max_len]


def build_model(exp: RetrievalExperiment) -> RetrievalHead:
    """The untrained ensemble of ``exp`` (seeds ``0 .. n_seeds-1``): what :func:`run_retrieval` starts from."""
    max_len = exp.max_len if exp.max_len is not None else max(exp.eval_lengths)
    return RetrievalHead(exp.vocab_size, exp.d_model, exp.d_head, exp.pe, exp.attention, max_len=max_len,
                         n_models=exp.n_seeds, ape_init_std=exp.ape_init_std)


@dataclass
class RetrievalResult:
    """What :func:`run_retrieval` returns: the trained ensemble and its measurements."""

    experiment: RetrievalExperiment
    model: RetrievalHead
    loss_history: torch.Tensor  # [steps, n_seeds]
    lengths: list[int]
    accuracy: torch.Tensor  # [n_seeds, len(lengths)]
    extra: dict = field(default_factory=dict)


def run_retrieval(exp: RetrievalExperiment, device=None) -> RetrievalResult:
    """Build, train and evaluate the ensemble described by ``exp``.

    Seeds ``0 .. n_seeds-1`` initialise the models; ``exp.data_seed`` seeds the
    training stream. The APE table is sized for the longest evaluation length
    (or ``exp.max_len`` rows when set).
    """
    lengths = exp.eval_lengths
    model = build_model(exp)
    history = train(model, exp.task, steps=exp.steps, batch_size=exp.batch_size, lr=exp.lr,
                    train_len=exp.train_len, fixed_length=exp.fixed_length, weight_decay=exp.weight_decay,
                    seed=exp.data_seed, device=device)
    acc = accuracy_by_length(model, exp.task, lengths, n_samples=exp.eval_samples)
    return RetrievalResult(exp, model, history, lengths, acc)
