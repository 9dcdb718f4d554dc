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

    def __post_init__(self):
        check_pe(self.pe)
        check_int("train_len", self.train_len, minimum=self.offset + 2)
        check_int("n_seeds", self.n_seeds, minimum=1)

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
        return [self.train_len * m for m in self.length_multiples]


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
    training stream. The APE table is sized for the longest evaluation length.
    """
    lengths = exp.eval_lengths
    model = RetrievalHead(exp.vocab_size, exp.d_model, exp.d_head, exp.pe, exp.attention,
                          max_len=max(lengths), n_models=exp.n_seeds)
    history = train(model, exp.task, steps=exp.steps, batch_size=exp.batch_size, lr=exp.lr,
                    train_len=exp.train_len, fixed_length=exp.fixed_length, weight_decay=exp.weight_decay,
                    seed=exp.data_seed, device=device)
    acc = accuracy_by_length(model, exp.task, lengths, n_samples=exp.eval_samples)
    return RetrievalResult(exp, model, history, lengths, acc)


# --- the multi-layer transformer (chapters 7 and 8)
@dataclass(frozen=True)
class TransformerExperiment:
    """An ensemble of :class:`~lengthgen_utils.models.Transformer` seeds on a full-sequence task.

    ``task`` names the task (``"delayed_copy"``, ``"lagged_sum"``, ``"copy"``, ``"parity"``);
    ``offsets`` are its lags (one for delayed copy, two for the lagged sum).
    """

    pe: str = "rope"
    task: str = "delayed_copy"
    vocab_size: int = 16
    offsets: tuple[int, ...] = (5,)
    train_len: int = 32
    eval_lengths: tuple[int, ...] = (32, 64, 128, 256)
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.05
    batch_size: int = 64
    steps: int = 1500
    n_seeds: int = 3
    eval_samples: int = 128
    data_seed: int = 0

    def __post_init__(self):
        check_pe(self.pe)
        check_int("n_seeds", self.n_seeds, minimum=1)
        self.make_task()  # validates the task name and offsets

    def make_task(self):
        from .tasks import Copy, DelayedCopy, LaggedSum, RunningParity

        if self.task == "delayed_copy":
            return DelayedCopy(self.vocab_size, *self.offsets)
        if self.task == "lagged_sum":
            return LaggedSum(self.vocab_size, *self.offsets)
        if self.task == "copy":
            return Copy(self.vocab_size)
        if self.task == "parity":
            return RunningParity(self.vocab_size)
        raise ValueError(f"task must be one of 'delayed_copy', 'lagged_sum', 'copy', 'parity'; got {self.task!r}")


TRANSFORMER_PROFILES = {
    # Transformers are the book's most expensive models on a CPU. quick and default train width 64
    # (d_head 16: 8 RoPE frequency pairs); full trains DESIGN.md's d_model 128. Chapter 7 says so.
    "quick": dict(d_model=64, batch_size=16, steps=200, lr=3e-3, n_seeds=3, eval_samples=32),
    "default": dict(d_model=64, batch_size=32, steps=600, lr=2e-3, n_seeds=3, eval_samples=128),
    "full": dict(d_model=128, batch_size=64, steps=1500, lr=1e-3, n_seeds=5, eval_samples=256),
}


def transformer_experiment(profile: Profile, **overrides) -> TransformerExperiment:
    """The transformer experiment with ``profile``'s compute settings and any field overridden."""
    return TransformerExperiment(**{**TRANSFORMER_PROFILES[profile.name], **overrides})


@dataclass
class TransformerResult:
    """What :func:`run_transformer` returns."""

    experiment: TransformerExperiment
    model: object
    loss_history: torch.Tensor  # [steps, n_seeds]
    accuracy: dict  # {eval length: [n_seeds, L] per-position token accuracy}
    counts: dict  # {eval length: [L] scored tokens per position}
    inside: torch.Tensor  # [n_seeds] token accuracy at positions < train_len (at the longest length)
    outside: dict  # {eval length: [n_seeds] token accuracy at positions >= train_len}


def run_transformer(exp: TransformerExperiment, device=None) -> TransformerResult:
    """Train the ensemble of ``exp`` and measure per-position token accuracy at each evaluation length."""
    from .evaluation import split_accuracy, token_accuracy_by_position
    from .models import Transformer
    from .training import train_sequence

    task = exp.make_task()
    model = Transformer(getattr(task, "n_tokens", task.vocab_size), exp.n_layers, exp.n_heads, exp.d_model,
                        exp.pe, max_len=max(exp.eval_lengths + (exp.train_len,)), n_models=exp.n_seeds)
    history = train_sequence(model, task, steps=exp.steps, batch_size=exp.batch_size, lr=exp.lr,
                             weight_decay=exp.weight_decay, train_len=exp.train_len, seed=exp.data_seed,
                             device=device)
    accuracy, counts, outside = {}, {}, {}
    for seq_len in exp.eval_lengths:
        acc, cnt = token_accuracy_by_position(model, task, seq_len, n_samples=exp.eval_samples)
        accuracy[seq_len], counts[seq_len] = acc, cnt
        inside, outside[seq_len] = split_accuracy(acc, cnt, exp.train_len)
    return TransformerResult(exp, model, history, accuracy, counts, inside, outside)
