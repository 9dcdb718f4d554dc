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


# --- linear-attention control and min-norm interpolant (chapter 6)

SPREAD_FREQUENCIES = tuple(float(x) for x in torch.linspace(0.3, 3.0, 8).tolist())
"""Eight frequencies evenly spread over [0.3, 3.0] rad/token: a non-RoPE set whose features are
well conditioned on 15 training offsets (condition number about 2), for the exact min-norm demonstration."""


@dataclass
class KernelResult:
    """Direct-kernel ensemble (one model per data seed, each started at ``c = 0``) and its theory."""

    name: str
    frequencies: torch.Tensor  # [d_head // 2] rad/token
    lr: float
    steps: int
    c: torch.Tensor  # [n_seeds, d_head] trained kernels
    c_gd: torch.Tensor  # [d_head] closed-form gradient descent on the expected loss after `steps` steps
    c_star: torch.Tensor  # [d_head] exact min-norm interpolant pinv(Phi_T) e_k
    loss_history: torch.Tensor  # [steps, n_seeds]
    lengths: list[int]
    accuracy: torch.Tensor  # [n_seeds, len(lengths)]
    squared_error: torch.Tensor  # [n_seeds, len(lengths)] measured
    predicted_squared_error: torch.Tensor  # [len(lengths)] from c_gd, exact expectation
    hessian_eigenvalues: torch.Tensor  # [d_head]


def run_kernel_head(exp: RetrievalExperiment, name: str = "rope", frequencies=None,
                    lr_fraction: float = 0.5, steps: int | None = None) -> KernelResult:
    """Train the directly parameterised kernel head with SGD on the squared loss, and its closed forms.

    One model per data seed ``exp.data_seed + i`` (``i < exp.n_seeds``), each from ``c = 0``
    (with ``c = 0`` every model of one data stream is the same, so seeds vary the data).
    The step size is ``lr_fraction / lambda_max(H)`` (stable for ``lr_fraction < 1``).
    """
    from .models import KernelHead
    from .evaluation import squared_error_by_length
    from .theory import (expected_squared_error, gradient_descent_kernel, kernel_frequencies, min_norm_interpolant,
                         rope_kernel_features, squared_loss_quadratic, training_offsets)
    from .training import train_squared_loss

    steps = exp.steps if steps is None else check_int("steps", steps, minimum=1)
    theta = kernel_frequencies(exp.d_head, 10000.0, frequencies)
    h, b, _ = squared_loss_quadratic(exp.train_len, exp.offset, exp.vocab_size, exp.d_head, frequencies=theta)
    eig = torch.linalg.eigvalsh(h)
    lr = lr_fraction / float(eig.max())
    lengths = exp.eval_lengths
    cs, hists, accs, errs = [], [], [], []
    for i in range(exp.n_seeds):
        model = KernelHead(exp.vocab_size, exp.d_head, frequencies=theta, seeds=[i])
        hists.append(train_squared_loss(model, exp.task, steps=steps, batch_size=exp.batch_size, lr=lr,
                                        train_len=exp.train_len, seed=exp.data_seed + i, device="cpu")[:, 0])
        cs.append(model.c.detach().double()[0])
        accs.append(accuracy_by_length(model, exp.task, lengths, n_samples=exp.eval_samples)[0])
        errs.append(squared_error_by_length(model, exp.task, lengths, n_samples=exp.eval_samples)[0])
    c_gd = gradient_descent_kernel(h, b, lr, steps)
    c_star = min_norm_interpolant(training_offsets(exp.train_len, exp.offset), exp.offset, exp.d_head,
                                  frequencies=theta)
    predicted = torch.stack([
        expected_squared_error(c_gd @ rope_kernel_features(torch.arange(L) - (L - 1), exp.d_head, frequencies=theta).T,
                               exp.offset, exp.vocab_size)
        for L in lengths])
    return KernelResult(name, theta, lr, steps, torch.stack(cs), c_gd, c_star, torch.stack(hists, 1), lengths,
                        torch.stack(accs), torch.stack(errs), predicted, eig)


def factorized_kernel(model: RetrievalHead) -> torch.Tensor:
    """Kernel coefficients ``c [M, d_head]`` (float64) of a trained position-only RoPE head: ``s(D) = Phi(D) . c``."""
    from .theory import rope_kernel_coefficients

    if model.config.pe != "rope":
        raise ValueError(f"factorized_kernel needs a RoPE head; got pe={model.config.pe!r}")
    with torch.no_grad():
        q, k = model.query_key(1)  # position 0: no rotation
        return rope_kernel_coefficients(q.double(), k[:, 0].double(), model.config.interleaved) / model.config.d_head ** 0.5
