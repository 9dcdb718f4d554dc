"""Run profiles: how much compute a build of the book spends (``LENGTHGEN_PROFILE`` = quick | default | full).

* ``quick``: CI and the tests; every chapter well under a minute on 2 CPU cores;
* ``default``: the web book; every chapter a few minutes at most on 2 CPU cores;
* ``full``: paper-scale sweeps, a GPU when present.

A chapter's claim checks hold in every profile, with tolerances that fit it. Where the science
needs more runs than ``default`` can afford, ``default`` runs what fits and says so.
"""
from __future__ import annotations

from dataclasses import dataclass

from .._validate import Normalized, check_int, check_int_sequence, check_rope_base, env_value, plain_number
from ..core.attention import check_attention

PROFILE_ENV = "LENGTHGEN_PROFILE"


def _frozen(name: str, value):
    """``value`` with every list turned into a tuple (nested) and every numpy scalar into the Python number it
    stands for, so that it can be hashed and keys the cache; else ``TypeError``."""
    value = plain_number(value)
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(f"{name}[{i}]", v) for i, v in enumerate(value))
    try:
        hash(value)
    except TypeError:
        raise TypeError(f"{name} must be hashable (a number, a string, a tuple, a frozen configuration); "
                        f"got {type(value).__name__} {value!r:.60}") from None
    return value


@dataclass(frozen=True)
class Profile(Normalized):
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
            :class:`~lengthgen_utils.run.configs.TransformerExperiment`), as ``(name, value)`` pairs or a dict.
        rope_bases: the RoPE bases of chapter 4's base sweep, besides the book's 10^4.
        margin_controls: the margin controls chapter 5 sweeps (``"steps"``, ``"weight decay"``,
            ``"base"``, ``"temperature"``).

    Sequence fields accept lists and are stored as tuples (lists inside ``transformer``'s values too),
    so a profile is hashable.

    Raises:
        TypeError / ValueError: a field of the wrong type or out of range, naming the field.
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
    rope_bases: tuple[float, ...] = (10.0,)
    margin_controls: tuple[str, ...] = ("steps", "weight decay")

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"name must be a non-empty str; got {type(self.name).__name__} {self.name!r}")
        for name in ("n_seeds", "steps", "batch_size", "eval_samples"):
            check_int(name, getattr(self, name), minimum=1)
        object.__setattr__(self, "length_multiples", check_int_sequence("length_multiples", self.length_multiples, 1))
        object.__setattr__(self, "offsets", check_int_sequence("offsets", self.offsets, minimum=1))
        if isinstance(self.attentions, (str, bytes)) or not hasattr(self.attentions, "__iter__"):
            raise TypeError(f"attentions must be a sequence of normaliser names; got {self.attentions!r}")
        object.__setattr__(self, "attentions", tuple(check_attention(a) for a in self.attentions))
        if isinstance(self.transformer, (str, bytes)) or not hasattr(self.transformer, "__iter__"):
            raise TypeError(f"transformer must be (name, value) pairs or a dict; got {self.transformer!r:.60}")
        try:
            pairs = dict(self.transformer.items() if isinstance(self.transformer, dict) else self.transformer)
        except (TypeError, ValueError) as err:
            raise TypeError(f"transformer must be (name, value) pairs or a dict; got {self.transformer!r:.60}") from err
        for key in pairs:
            if not isinstance(key, str):
                raise TypeError(f"transformer keys must be field names (str); got {key!r}")
        object.__setattr__(self, "transformer", tuple((k, _frozen(f"transformer[{k!r}]", v)) for k, v in pairs.items()))
        if isinstance(self.rope_bases, (str, bytes)) or not hasattr(self.rope_bases, "__iter__"):
            raise TypeError(f"rope_bases must be a sequence of numbers; got {self.rope_bases!r}")
        object.__setattr__(self, "rope_bases", tuple(check_rope_base(f"rope_bases[{i}]", b)
                                                     for i, b in enumerate(self.rope_bases)))
        if isinstance(self.margin_controls, (str, bytes)) or not hasattr(self.margin_controls, "__iter__"):
            raise TypeError(f"margin_controls must be a sequence of names; got {self.margin_controls!r}")
        object.__setattr__(self, "margin_controls", tuple(self.margin_controls))

    def __str__(self) -> str:
        """What a chapter prints in its first cell: the profile's compute, and the seed base this run uses."""
        from ..core.seeding import seed_base

        return (f"profile {self.name!r}: {self.n_seeds} seeds, {self.steps} steps of the single head (batch "
                f"{self.batch_size}), {self.eval_samples} test sequences per length, offsets {self.offsets}; "
                f"seed base {seed_base()} ($LENGTHGEN_SEED)")


PROFILES = {
    # Transformers are the book's most expensive models on a CPU. quick and default train width 64
    # (d_head 16: 8 RoPE frequency pairs); full trains the reconstruction's d_model 128. Chapter 7 says so.
    # At width 64 and batch 32 every RoPE and APE ensemble fits delayed copy (k = 1, 5, 9) within about
    # 100 steps; 120 (quick) or 150 (default) steps give the same cliff positions as 600 did, so default
    # spends its budget on 5 seeds instead (chapter 7 trains five ensembles).
    "quick": Profile("quick", n_seeds=5, steps=500, batch_size=256, eval_samples=512,
                     length_multiples=(1, 2, 4, 8, 16), offsets=(1, 3, 5),
                     transformer=dict(d_model=64, batch_size=32, steps=120, lr=2e-3, n_seeds=3,
                                      eval_samples=32).items()),
    "default": Profile("default", n_seeds=8, steps=2000, batch_size=256, eval_samples=2048,
                       length_multiples=(1, 2, 4, 8, 16), offsets=(1, 2, 3, 5),
                       transformer=dict(d_model=64, batch_size=32, steps=150, lr=2e-3, n_seeds=5,
                                        eval_samples=64).items()),
    "full": Profile("full", n_seeds=16, steps=4000, batch_size=256, eval_samples=4096,
                    length_multiples=(1, 2, 4, 8, 16, 32, 64), offsets=(1, 2, 3, 5, 8),
                    transformer=dict(d_model=128, batch_size=64, steps=1500, lr=1e-3, n_seeds=5,
                                     eval_samples=256).items(),
                    rope_bases=(10.0, 1e2, 1e3, 1e5),
                    margin_controls=("steps", "weight decay", "base", "temperature")),
}


def get_profile(name: str | None = None) -> Profile:
    """The profile named ``name``, else by ``$LENGTHGEN_PROFILE`` (spaces stripped; empty means unset), else
    ``"default"``.

    Raises:
        ValueError: the name is not one of ``quick``, ``default``, ``full``; ``$LENGTHGEN_SEED`` is set to
            something that is not an integer >= 0.
    """
    from ..core.seeding import seed_base

    if name is None:  # the variable by the package's one convention: spaces stripped, empty means unset
        name = env_value(PROFILE_ENV) or "default"
    if name not in PROFILES:
        raise ValueError(f"profile must be one of {tuple(PROFILES)} (argument or ${PROFILE_ENV}); got {name!r}")
    seed_base()  # a bad $LENGTHGEN_SEED fails here, in a chapter's first cell, naming the variable
    return PROFILES[name]
