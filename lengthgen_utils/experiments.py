"""Named experiments, the run profiles (``LENGTHGEN_PROFILE`` = quick | default | full) and the results cache.

A chapter calls one function here per experiment, so its cells stay a few
lines long and every chapter uses the same settings for the same profile.
Expensive runs go through :func:`load_or_run`: a rebuild of the book loads
what an earlier build computed instead of training again.
"""
from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace

import torch

from . import __version__
from . import cache as _cache
from ._validate import check_fits, check_int, check_int_sequence, check_positive_float


def _check_fields(config, sizes: dict, rates: tuple = (), rates_or_zero: tuple = ()) -> None:
    """Check a config's fields at construction: ``sizes`` maps int fields to their minimum; ``rates`` are
    finite floats > 0, ``rates_or_zero`` finite floats >= 0. Errors name the field (``ValueError``/``TypeError``)."""
    for name, minimum in sizes.items():
        check_int(name, getattr(config, name), minimum=minimum)
    for name in rates:
        check_positive_float(name, getattr(config, name))
    for name in rates_or_zero:
        check_positive_float(name, getattr(config, name), allow_zero=True)


_HEAD_SIZES = dict(vocab_size=2, d_model=1, d_head=2, steps=1, batch_size=1, eval_samples=1, data_seed=0)
from .evaluation import accuracy_by_length
from .models import RetrievalHead, check_attention
from .positional import check_pe
from .tasks import FixedOffsetRetrieval
from .training import default_device, train

PROFILE_ENV = "LENGTHGEN_PROFILE"


@dataclass(frozen=True)
class Profile:
    """How much compute a run of the book spends.

    Attributes:
        name: ``"quick"`` (CI: each chapter well under a minute on 2 CPU cores),
            ``"default"`` (the web book: about 6 minutes for all chapters on 2 CPU cores) or
            ``"full"`` (paper-scale sweeps; GPU when present).
        n_seeds: models per ensemble (independent initialisations).
        steps: optimiser steps of the single-head model.
        batch_size: sequences per step.
        eval_samples: sequences per evaluation length.
        length_multiples: evaluation lengths as multiples of the training length.
        offsets: the offsets k a sweep covers (:class:`RetrievalSweep`).
        attentions: the attention types a sweep covers (``"softmax"``, ``"linear"``).

    The multi-layer transformer of chapters 7 and 8 has its own settings per profile
    (``TRANSFORMER_PROFILES``).
    """

    name: str
    n_seeds: int
    steps: int
    batch_size: int
    eval_samples: int
    length_multiples: tuple[int, ...]
    offsets: tuple[int, ...] = (1, 2, 3, 5)
    attentions: tuple[str, ...] = ("softmax", "linear")


PROFILES = {
    "quick": Profile("quick", n_seeds=5, steps=500, batch_size=256, eval_samples=512,
                     length_multiples=(1, 2, 4, 8, 16), offsets=(1, 3, 5)),
    "default": Profile("default", n_seeds=8, steps=2000, batch_size=256, eval_samples=2048,
                       length_multiples=(1, 2, 4, 8, 16), offsets=(1, 2, 3, 5)),
    "full": Profile("full", n_seeds=16, steps=4000, batch_size=256, eval_samples=4096,
                    length_multiples=(1, 2, 4, 8, 16, 32, 64), offsets=(1, 2, 3, 5, 8)),
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
class SingleHeadSettings:
    """What one single-head ensemble (:class:`RetrievalExperiment`) and a sweep of them
    (:class:`RetrievalSweep`) share: task and model sizes, training and evaluation (DESIGN.md defaults).

    Fields:
        vocab_size: V content tokens.
        train_len: longest training length (tokens).
        fixed_length: train at ``train_len`` only, instead of lengths uniform in ``[min_train_len, train_len]``.
        d_model, d_head: model sizes.
        lr, weight_decay: AdamW settings.
        n_seeds: models per setting (initialisation seeds ``0 .. n_seeds-1``).
        steps, batch_size: training steps and sequences per step.
        eval_samples: fresh sequences per evaluation length.
        length_multiples: evaluation lengths are ``train_len`` times each.
        data_seed: seed of the training stream.
        ape_init_std: std of the APE table's initialisation.
        max_len: rows of the APE table; ``None`` = the longest evaluation length.
        min_train_len: shortest training length; ``None`` = the (largest) offset + 2.
    """

    vocab_size: int = 16
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
    max_len: int | None = None
    min_train_len: int | None = None

    def _check_settings(self, largest_offset: int) -> None:
        """Raise ``ValueError``/``TypeError`` naming the first bad field (called by the subclasses' ``__post_init__``)."""
        check_int("train_len", self.train_len, minimum=largest_offset + 2)
        check_int("n_seeds", self.n_seeds, minimum=1)
        _check_fields(self, _HEAD_SIZES, rates=("lr",), rates_or_zero=("weight_decay", "ape_init_std"))
        object.__setattr__(self, "length_multiples", check_int_sequence("length_multiples",
                                                                        self.length_multiples, minimum=1))
        if self.min_train_len is not None:
            check_int("min_train_len", self.min_train_len, minimum=largest_offset + 2, maximum=self.train_len)
        if self.max_len is not None:
            check_int("max_len", self.max_len, minimum=self.train_len * min(self.length_multiples))

    @property
    def eval_lengths(self) -> list[int]:
        """``train_len`` times each length multiple, up to the APE table size when ``max_len`` is set."""
        lengths = [self.train_len * m for m in self.length_multiples]
        return lengths if self.max_len is None else [L for L in lengths if L <= self.max_len]

    @property
    def table_len(self) -> int:
        """Rows of the APE table: ``max_len`` when set, else the longest evaluation length."""
        return self.max_len if self.max_len is not None else max(self.eval_lengths)


@dataclass(frozen=True)
class RetrievalExperiment(SingleHeadSettings):
    """One ensemble of single-head models trained on fixed-offset retrieval: the shared
    :class:`SingleHeadSettings` plus the position encoding, the attention type and the offset."""

    pe: str = "rope"
    attention: str = "softmax"
    offset: int = 3

    def __post_init__(self):
        check_pe(self.pe)
        check_attention(self.attention)
        self._check_settings(check_int("offset", self.offset, minimum=1))

    @classmethod
    def from_profile(cls, profile: Profile, **overrides) -> "RetrievalExperiment":
        """The experiment with a profile's compute settings and any field overridden."""
        base = dict(n_seeds=profile.n_seeds, steps=profile.steps, batch_size=profile.batch_size,
                    eval_samples=profile.eval_samples, length_multiples=profile.length_multiples)
        return cls(**{**base, **overrides})

    @property
    def task(self) -> FixedOffsetRetrieval:
        return FixedOffsetRetrieval(self.vocab_size, self.offset)


@dataclass
class RetrievalResult:
    """What :func:`run_retrieval` returns: the trained ensemble and its measurements."""

    experiment: RetrievalExperiment
    model: RetrievalHead
    loss_history: torch.Tensor  # [steps, n_seeds]
    lengths: list[int]
    accuracy: torch.Tensor  # [n_seeds, len(lengths)]
    extra: dict = field(default_factory=dict)


# ---------------------------------------------------------------- the results cache
def load_or_run(config, compute: Callable[[], dict], cache=True, device=None) -> tuple[dict, str]:
    """Load the result of ``config`` from the results cache, or compute and store it.

    The key is a SHA-256 over the configuration's class and every field
    (``dataclasses.asdict``, sorted JSON), ``lengthgen_utils.__version__``, a
    fingerprint of the package's computing modules, the torch version and the
    device type, so an entry made by other settings or other code is never
    used. Entries are written atomically and verified on reading (see
    :mod:`lengthgen_utils.cache`); a corrupt, truncated or foreign entry is
    reported with a ``RuntimeWarning`` and recomputed.

    Args:
        config: a frozen dataclass instance (e.g. :class:`RetrievalExperiment`).
        compute: called with no arguments on a miss; returns the payload, a dict of
            tensors, state dicts, numbers, strings and lists (no models or other objects).
        cache: ``True`` (the default folder: ``$LENGTHGEN_CACHE`` or ``<repo>/.cache/lengthgen``),
            ``False`` (always compute, store nothing), or a folder path.
        device: the device the computation runs on (its type is part of the key); default
            :func:`~lengthgen_utils.training.default_device`.

    Returns:
        ``(payload, status)``: status is ``"hit"``, ``"miss"`` (computed and stored),
        ``"recomputed"`` (an unusable entry was replaced) or ``"off"`` (cache disabled).

    Raises:
        TypeError: ``config`` is not a dataclass instance, or the payload holds an object
            the cache cannot store safely.
    """
    if not is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"config must be a dataclass instance; got {type(config).__name__}")
    if cache is False:
        folder = None
    elif cache is True or cache is None:
        folder = _cache.cache_dir()
    else:
        folder = _cache.cache_dir(os.fspath(cache))
    if folder is None:
        payload = compute()
        _cache.check_payload(payload)
        return payload, "off"
    description = cache_description(config, device)
    key = _cache.make_key(description)
    status = "miss"
    try:
        payload = _cache.read_entry(folder, key, expect_meta={"description": description})
    except _cache.CorruptEntry as e:
        _cache.warn_corrupt(_cache.entry_path(folder, key), str(e))
        status, payload = "recomputed", None
        try:
            _cache.entry_path(folder, key).unlink()
        except OSError:
            pass
    if payload is not None:
        return payload, "hit"
    payload = compute()
    meta = {"description": description, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        _cache.save_entry(folder, key, payload, meta)
    except OSError as e:
        warnings.warn(f"results cache: could not store the entry in {folder} ({e}); continuing without it",
                      RuntimeWarning, stacklevel=2)
    return payload, status


def cache_description(config, device=None) -> dict:
    """What identifies a cached result: the configuration and what computed it (hashed into the key)."""
    device = torch.device(device) if device is not None else default_device()
    description = {"kind": f"{type(config).__module__}.{type(config).__qualname__}", "config": asdict(config),
                   "lengthgen_utils": __version__, "code": _cache.code_fingerprint(), "torch": torch.__version__,
                   "device": device.type}
    return json.loads(json.dumps(description, allow_nan=False))  # as stored: tuples become lists


# ---------------------------------------------------------------- one ensemble
def _retrieval_head(exp, n_models: int, seeds, max_len: int, pe: str, attention: str) -> RetrievalHead:
    return RetrievalHead(exp.vocab_size, exp.d_model, exp.d_head, pe, attention, max_len=max_len,
                         n_models=n_models, seeds=seeds, ape_init_std=exp.ape_init_std)


def build_model(exp: RetrievalExperiment) -> RetrievalHead:
    """The untrained ensemble of ``exp`` (seeds ``0 .. n_seeds-1``): what :func:`run_retrieval` starts from.

    The APE table has ``exp.max_len`` rows when set, else one per position up to the longest evaluation length.
    """
    return _retrieval_head(exp, exp.n_seeds, None, exp.table_len, exp.pe, exp.attention)


def _model_payload(model: RetrievalHead, history, lengths, accuracy) -> dict:
    return {"state_dict": dict(model.state_dict()), "loss_history": history, "lengths": list(lengths),
            "accuracy": accuracy}


def run_retrieval(exp: RetrievalExperiment, device=None, cache=True) -> RetrievalResult:
    """Build, train and evaluate the ensemble described by ``exp`` (or load it from the results cache).

    Seeds ``0 .. n_seeds-1`` initialise the models; ``exp.data_seed`` seeds the
    training stream. The APE table has ``exp.max_len`` rows when set, else one per position up to
    the longest evaluation length (see :func:`build_model`).

    Args:
        exp: the experiment.
        device: where to train (default :func:`~lengthgen_utils.training.default_device`).
        cache: ``True`` (default folder), ``False`` (train, store nothing) or a cache folder;
            see :func:`load_or_run`. ``result.extra["cache"]`` says what happened.

    Returns:
        a :class:`RetrievalResult` whose model lives on ``device``; a loaded result is the
        stored one exactly (weights, loss history and accuracies).
    """
    device = torch.device(device) if device is not None else default_device()
    lengths = exp.eval_lengths

    def compute():
        model = build_model(exp)
        history = train(model, exp.task, steps=exp.steps, batch_size=exp.batch_size, lr=exp.lr,
                        train_len=exp.train_len, fixed_length=exp.fixed_length, weight_decay=exp.weight_decay,
                        seed=exp.data_seed, device=device, min_train_len=exp.min_train_len)
        acc = accuracy_by_length(model, exp.task, lengths, n_samples=exp.eval_samples)
        return _model_payload(model, history, lengths, acc)

    payload, status = load_or_run(exp, compute, cache=cache, device=device)
    model = build_model(exp)
    model.load_state_dict(payload["state_dict"])
    model.to(device).eval()
    return RetrievalResult(exp, model, payload["loss_history"], list(payload["lengths"]), payload["accuracy"],
                           extra={"cache": status})


# ---------------------------------------------------------------- sweeps: seeds x offsets x PE x attention
@dataclass(frozen=True)
class RetrievalSweep(SingleHeadSettings):
    """A sweep of single-head ensembles: every (PE, attention) pair is one batched ensemble of
    ``len(offsets) * n_seeds`` models that differ in offset and initialisation seed.

    Model ``(offset k, seed s)`` of the ensemble equals the model trained alone by
    ``run_retrieval(sweep.experiment(pe, k, attention))`` (seed ``s`` of that
    experiment) up to float rounding: the models share the data stream and are
    otherwise independent. Because they share it, every model trains on lengths
    ``U{shortest_train_len .. train_len}`` with ``shortest_train_len = max(offsets) + 2``
    unless ``min_train_len`` says otherwise (the per-offset experiments record it).

    The shared :class:`SingleHeadSettings`, plus ``pes``, ``attentions`` and ``offsets``.

    Raises:
        ValueError / TypeError: an unknown PE or attention, a duplicate or non-positive
            offset, a training length too short for the largest offset.
    """

    pes: tuple[str, ...] = ("rope", "ape", "nope")
    attentions: tuple[str, ...] = ("softmax",)
    offsets: tuple[int, ...] = (1, 2, 3, 5)

    def __post_init__(self):
        for name in ("pes", "attentions"):
            values = getattr(self, name)
            if isinstance(values, str) or not hasattr(values, "__iter__") or not tuple(values):
                raise TypeError(f"{name} must be a non-empty sequence of names; got {values!r}")
            object.__setattr__(self, name, tuple(values))
        for pe in self.pes:
            check_pe(pe)
        for attention in self.attentions:
            check_attention(attention)
        offsets = check_int_sequence("offsets", self.offsets, minimum=1)
        if len(set(offsets)) != len(offsets):
            raise ValueError(f"offsets must be distinct; got {offsets}")
        object.__setattr__(self, "offsets", offsets)
        self._check_settings(max(offsets))

    @classmethod
    def from_profile(cls, profile: Profile, **overrides) -> "RetrievalSweep":
        """The sweep with a profile's compute settings, offsets and attention types, and any field overridden."""
        base = dict(n_seeds=profile.n_seeds, steps=profile.steps, batch_size=profile.batch_size,
                    eval_samples=profile.eval_samples, length_multiples=profile.length_multiples,
                    offsets=profile.offsets, attentions=profile.attentions)
        return cls(**{**base, **overrides})

    @property
    def shortest_train_len(self) -> int:
        """The shortest training length every model of the sweep sees."""
        return self.min_train_len if self.min_train_len is not None else max(self.offsets) + 2

    @property
    def n_models(self) -> int:
        """Models per ensemble: ``len(offsets) * n_seeds``."""
        return len(self.offsets) * self.n_seeds

    def ensemble(self, pe: str, attention: str = "softmax") -> "RetrievalSweep":
        """The one-ensemble sweep of ``(pe, attention)``: the unit that is trained and cached."""
        if pe not in self.pes or attention not in self.attentions:
            raise ValueError(f"(pe, attention) must be in pes={self.pes} x attentions={self.attentions}; "
                             f"got ({pe!r}, {attention!r})")
        return replace(self, pes=(pe,), attentions=(attention,))

    def experiment(self, pe: str, offset: int, attention: str = "softmax") -> RetrievalExperiment:
        """The :class:`RetrievalExperiment` that trains the sweep's models of ``(pe, offset, attention)`` alone."""
        if offset not in self.offsets:
            raise ValueError(f"offset must be one of the sweep's offsets {self.offsets}; got {offset!r}")
        shortest = self.shortest_train_len
        shared = {f.name: getattr(self, f.name) for f in fields(SingleHeadSettings)}
        shared["min_train_len"] = None if shortest == offset + 2 else shortest
        return RetrievalExperiment(pe=pe, attention=attention, offset=offset, **shared)

    @classmethod
    def of_experiment(cls, exp: RetrievalExperiment, offsets) -> "RetrievalSweep":
        """The one-ensemble sweep that trains every field of ``exp`` except its offset, once per offset in ``offsets``.

        Raises:
            ValueError / TypeError: ``offsets`` empty, repeated or not ints, or an offset too large for
                the shortest training length (``exp.min_train_len``, else ``exp.train_len``) minus 2.
        """
        offsets = check_int_sequence("offsets", offsets, minimum=1)
        shortest = exp.min_train_len if exp.min_train_len is not None else exp.train_len
        for i, k in enumerate(offsets):
            check_int(f"offsets[{i}]", k, minimum=1, maximum=shortest - 2)
        shared = {f.name: getattr(exp, f.name) for f in fields(SingleHeadSettings)}
        return cls(pes=(exp.pe,), attentions=(exp.attention,), offsets=offsets, **shared)


@dataclass
class SweepResult:
    """What :func:`run_sweep` returns. Keys are ``(pe, attention)``; models are ordered offset-major.

    Attributes:
        sweep: the sweep.
        lengths: evaluation lengths (tokens).
        accuracy: ``(pe, attention) -> [n_offsets, n_seeds, n_lengths]`` float64 accuracies.
        loss_history: ``(pe, attention) -> [steps, n_offsets, n_seeds]`` training losses (nats).
        models: ``(pe, attention) ->`` the trained :class:`RetrievalHead` of ``n_offsets * n_seeds`` models.
        cache: ``(pe, attention) ->`` cache status (see :func:`load_or_run`).
        seconds: ``(pe, attention) ->`` wall time of training or loading (s).
    """

    sweep: RetrievalSweep
    lengths: list[int]
    accuracy: dict
    loss_history: dict
    models: dict
    cache: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)

    def result(self, pe: str, offset: int, attention: str = "softmax") -> RetrievalResult:
        """The seeds of one ``(pe, offset, attention)`` as a :class:`RetrievalResult` (its own model copy)."""
        exp = self.sweep.experiment(pe, offset, attention)
        row = self.sweep.offsets.index(offset)
        n = self.sweep.n_seeds
        model = self.models[(pe, attention)].subset(range(row * n, (row + 1) * n))
        return RetrievalResult(exp, model, self.loss_history[(pe, attention)][:, row].clone(), list(self.lengths),
                               self.accuracy[(pe, attention)][row].clone(),
                               extra={"cache": self.cache.get((pe, attention)), "sweep": self.sweep})

    def summary_rows(self) -> list[dict]:
        """One row per ``(pe, attention, offset)``: mean, min and max accuracy over seeds at each length."""
        rows = []
        for (pe, attention), acc in self.accuracy.items():
            for row, offset in enumerate(self.sweep.offsets):
                a = acc[row]  # [n_seeds, n_lengths]
                rows.append({"pe": pe, "attention": attention, "offset": offset,
                             "mean": a.mean(0).tolist(), "min": a.min(0).values.tolist(),
                             "max": a.max(0).values.tolist()})
        return rows


def run_sweep(sweep: RetrievalSweep, device=None, cache=True, progress: bool = False,
              on_ensemble: Callable | None = None) -> SweepResult:
    """Train and evaluate every ensemble of ``sweep`` (one batched ensemble per (PE, attention)), through the cache.

    Args:
        sweep: the sweep.
        device: where to train (default :func:`~lengthgen_utils.training.default_device`).
        cache: see :func:`load_or_run`; each ensemble is its own entry.
        progress: show a progress bar per ensemble's training.
        on_ensemble: called as ``on_ensemble(pe, attention, status, seconds)`` after each ensemble.

    Returns:
        a :class:`SweepResult`.
    """
    device = torch.device(device) if device is not None else default_device()
    lengths = sweep.eval_lengths
    seeds = [s for _ in sweep.offsets for s in range(sweep.n_seeds)]
    tasks = [FixedOffsetRetrieval(sweep.vocab_size, k) for k in sweep.offsets for _ in range(sweep.n_seeds)]
    shape = (len(sweep.offsets), sweep.n_seeds)
    out = SweepResult(sweep, lengths, {}, {}, {})
    for pe in sweep.pes:
        for attention in sweep.attentions:
            start = time.perf_counter()

            def compute():
                model = _retrieval_head(sweep, sweep.n_models, seeds, sweep.table_len, pe, attention)
                history = train(model, tasks, steps=sweep.steps, batch_size=sweep.batch_size, lr=sweep.lr,
                                train_len=sweep.train_len, fixed_length=sweep.fixed_length,
                                weight_decay=sweep.weight_decay, seed=sweep.data_seed, device=device,
                                min_train_len=sweep.shortest_train_len, progress=progress)
                acc = accuracy_by_length(model, tasks, lengths, n_samples=sweep.eval_samples)
                return _model_payload(model, history, lengths, acc)

            payload, status = load_or_run(sweep.ensemble(pe, attention), compute, cache=cache, device=device)
            model = _retrieval_head(sweep, sweep.n_models, seeds, sweep.table_len, pe, attention)
            model.load_state_dict(payload["state_dict"])
            key = (pe, attention)
            out.models[key] = model.to(device).eval()
            out.accuracy[key] = payload["accuracy"].view(*shape, len(lengths))
            out.loss_history[key] = payload["loss_history"].view(-1, *shape)
            out.cache[key] = status
            out.seconds[key] = time.perf_counter() - start
            if on_ensemble is not None:
                on_ensemble(pe, attention, status, out.seconds[key])
    return out


# ---------------------------------------------------------------- suites run by ``python -m lengthgen_utils run``
def run_single_head_suite(profile: Profile, n_seeds: int | None = None, device=None, cache=True,
                          progress: bool = True, on_ensemble: Callable | None = None) -> SweepResult:
    """The profile's single-head sweep: seeds x offsets x {RoPE, APE, NoPE} x attention types."""
    overrides = {} if n_seeds is None else {"n_seeds": check_int("n_seeds", n_seeds, minimum=1)}
    sweep = RetrievalSweep.from_profile(profile, **overrides)
    return run_sweep(sweep, device=device, cache=cache, progress=progress, on_ensemble=on_ensemble)


def run_transformer_suite(profile: Profile, n_seeds: int | None = None, device=None, cache=True,
                          progress: bool = True, on_ensemble: Callable | None = None) -> dict:
    """Chapter 7's transformer on delayed copy, one ensemble per PE (RoPE, APE, NoPE).

    Seeds default to the profile's transformer setting (``TRANSFORMER_PROFILES``; 5 in ``full``).
    ``on_ensemble(pe, attention, status, seconds)`` is called after each ensemble, as for the
    single-head suite. Returns ``{pe: TransformerResult}``.
    """
    overrides = {} if n_seeds is None else {"n_seeds": check_int("n_seeds", n_seeds, minimum=1)}
    results = {}
    for pe in ("rope", "ape", "nope"):
        start = time.perf_counter()
        results[pe] = run_transformer(transformer_experiment(profile, pe=pe, **overrides), device=device, cache=cache)
        if on_ensemble is not None:
            on_ensemble(pe, "softmax", "done", time.perf_counter() - start)
    return results


# --- offset sweeps for chapters 4 and 5
@dataclass
class OffsetSweepResult:
    """What :func:`run_offset_sweep` returns: one ensemble holding every (offset, seed) pair.

    Model ``i`` was trained on offset ``offsets[i]`` from seed ``seeds[i]``;
    ``accuracy`` is ``[n_models, len(lengths)]``.
    """

    experiment: RetrievalExperiment
    model: RetrievalHead
    offsets: list[int]
    seeds: list[int]
    loss_history: torch.Tensor
    lengths: list[int]
    accuracy: torch.Tensor

    def rows(self, offset: int) -> list[int]:
        """Indices of the models trained on ``offset``."""
        rows = [i for i, k in enumerate(self.offsets) if k == offset]
        if not rows:
            raise ValueError(f"offset must be one of {sorted(set(self.offsets))}; got {offset!r}")
        return rows


def run_offset_sweep(exp: RetrievalExperiment, offsets=(1, 2, 3, 5), device=None, cache=True) -> OffsetSweepResult:
    """Train ``exp.n_seeds`` seeds for each offset in one ensemble and evaluate at ``exp.eval_lengths``.

    The one-ensemble :class:`RetrievalSweep` of ``exp`` (:meth:`RetrievalSweep.of_experiment`) run by
    :func:`run_sweep`, flattened to one model per row: ``exp.offset`` is ignored (each model gets its
    own offset from ``offsets``); every other field of ``exp`` applies. Results go through the results
    cache (``cache`` as in :func:`load_or_run`).

    Raises:
        ValueError / TypeError: ``offsets`` empty, repeated, not ints, or too large for
            ``exp.train_len`` (or ``exp.min_train_len``).
    """
    sweep = RetrievalSweep.of_experiment(exp, offsets)
    result = run_sweep(sweep, device=device, cache=cache)
    key = (exp.pe, exp.attention)
    per_model_offsets = [k for k in sweep.offsets for _ in range(sweep.n_seeds)]
    seeds = [s for _ in sweep.offsets for s in range(sweep.n_seeds)]
    history = result.loss_history[key]
    return OffsetSweepResult(exp, result.models[key], per_model_offsets, seeds,
                             history.reshape(history.shape[0], -1), list(result.lengths),
                             result.accuracy[key].reshape(sweep.n_models, -1))


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


@dataclass(frozen=True)
class KernelHeadConfig:
    """The cache key of :func:`run_kernel_head`: the experiment, the frequency set and the SGD settings."""

    experiment: RetrievalExperiment
    frequencies: tuple[float, ...] | None
    lr_fraction: float
    steps: int


def run_kernel_head(exp: RetrievalExperiment, name: str = "rope", frequencies=None,
                    lr_fraction: float = 0.5, steps: int | None = None, device=None, cache=True) -> KernelResult:
    """Train the directly parameterised kernel head with SGD on the squared loss, and its closed forms.

    One model per data seed ``exp.data_seed + i`` (``i < exp.n_seeds``), each from ``c = 0``
    (with ``c = 0`` every model of one data stream is the same, so seeds vary the data). The
    models train as one batched ensemble, model ``i`` on its own stream
    (:func:`~lengthgen_utils.training.train_squared_loss` with one seed per model), through the
    results cache (``cache`` as in :func:`load_or_run`).
    The step size is ``lr_fraction / lambda_max(H)`` (stable for ``lr_fraction < 1``).

    Args:
        exp: the experiment (its offset, lengths, vocabulary, ``d_head``, batch size, seeds, steps).
        name: a label for the frequency set (figures and tables).
        frequencies: ``theta [d_head // 2]`` in rad/token, or ``None`` for RoPE's.
        lr_fraction: the step size as a fraction of ``1 / lambda_max`` of the expected-loss Hessian.
        steps: SGD steps (default ``exp.steps``).
        device: where to train (default :func:`~lengthgen_utils.training.default_device`).

    Returns:
        a :class:`KernelResult`.

    Raises:
        ValueError: ``exp.fixed_length`` or ``exp.min_train_len`` is set (the closed forms assume
            lengths uniform in ``[offset + 2, train_len]``); a bad ``steps`` or ``lr_fraction``.
    """
    from .evaluation import squared_error_by_length
    from .models import KernelHead
    from .theory import (expected_squared_error, gradient_descent_kernel, kernel_frequencies, min_norm_interpolant,
                         rope_kernel_features, squared_loss_quadratic, training_offsets)
    from .training import train_squared_loss

    if exp.fixed_length or exp.min_train_len is not None:
        raise ValueError("run_kernel_head trains on lengths U{offset + 2 .. train_len} (the closed forms assume them); "
                         f"got fixed_length={exp.fixed_length!r}, min_train_len={exp.min_train_len!r}")
    steps = exp.steps if steps is None else check_int("steps", steps, minimum=1)
    lr_fraction = check_positive_float("lr_fraction", lr_fraction)
    device = torch.device(device) if device is not None else default_device()
    theta = kernel_frequencies(exp.d_head, 10000.0, frequencies)
    h, b, _ = squared_loss_quadratic(exp.train_len, exp.offset, exp.vocab_size, exp.d_head, frequencies=theta)
    eig = torch.linalg.eigvalsh(h)
    lr = lr_fraction / float(eig.max())
    lengths = exp.eval_lengths

    def compute():
        model = KernelHead(exp.vocab_size, exp.d_head, frequencies=theta, n_models=exp.n_seeds)
        history = train_squared_loss(model, exp.task, steps=steps, batch_size=exp.batch_size, lr=lr,
                                     train_len=exp.train_len, device=device,
                                     seed=[exp.data_seed + i for i in range(exp.n_seeds)])
        model.cpu()
        return {"c": model.c.detach().double(), "loss_history": history,
                "accuracy": accuracy_by_length(model, exp.task, lengths, n_samples=exp.eval_samples),
                "squared_error": squared_error_by_length(model, exp.task, lengths, n_samples=exp.eval_samples)}

    config = KernelHeadConfig(exp, None if frequencies is None else tuple(float(x) for x in theta.tolist()),
                              lr_fraction, steps)
    payload, _ = load_or_run(config, compute, cache=cache, device=device)
    c_gd = gradient_descent_kernel(h, b, lr, steps)
    c_star = min_norm_interpolant(training_offsets(exp.train_len, exp.offset), exp.offset, exp.d_head,
                                  frequencies=theta)
    predicted = torch.stack([
        expected_squared_error(c_gd @ rope_kernel_features(torch.arange(L) - (L - 1), exp.d_head, frequencies=theta).T,
                               exp.offset, exp.vocab_size)
        for L in lengths])
    return KernelResult(name, theta, lr, steps, payload["c"], c_gd, c_star, payload["loss_history"], lengths,
                        payload["accuracy"], payload["squared_error"], predicted, eig)


def factorized_kernel(model: RetrievalHead) -> torch.Tensor:
    """Kernel coefficients ``c [M, d_head]`` (float64) of a trained position-only RoPE head: ``s(D) = Phi(D) . c``."""
    from .theory import rope_kernel_coefficients

    if model.config.pe != "rope":
        raise ValueError(f"factorized_kernel needs a RoPE head; got pe={model.config.pe!r}")
    with torch.no_grad():
        q, k = model.query_key(1)  # position 0: no rotation
        return rope_kernel_coefficients(q.double(), k[:, 0].double(), model.config.interleaved) / model.config.d_head ** 0.5


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
        _check_fields(self, dict(vocab_size=2, n_layers=1, n_heads=1, d_model=1, batch_size=1, steps=1,
                                 eval_samples=1, data_seed=0), rates=("lr",), rates_or_zero=("weight_decay",))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model must be divisible by n_heads; got d_model={self.d_model}, n_heads={self.n_heads}")
        if isinstance(self.offsets, (str, bytes)) or not hasattr(self.offsets, "__iter__"):
            raise TypeError(f"offsets must be a sequence of ints; got {type(self.offsets).__name__} {self.offsets!r}")
        if self.task in ("delayed_copy", "lagged_sum"):
            n = 1 if self.task == "delayed_copy" else 2
            offsets = check_int_sequence("offsets", self.offsets, minimum=1)
            if len(offsets) != n:
                raise ValueError(f"offsets must hold {n} lag(s) for task {self.task!r}; got offsets={offsets}")
        task = self.make_task()  # validates the task name
        check_fits("train_len", self.train_len, task.check_seq_len)
        lengths = check_int_sequence("eval_lengths", self.eval_lengths, minimum=1)
        for i, seq_len in enumerate(lengths):
            check_fits(f"eval_lengths[{i}]", seq_len, task.check_seq_len)

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
    inside: torch.Tensor  # [n_seeds] token accuracy at positions < train_len (at the shortest eval length)
    outside: dict  # {eval length: [n_seeds] token accuracy at positions >= train_len}


def run_transformer(exp: TransformerExperiment, device=None, cache=True) -> TransformerResult:
    """Train the ensemble of ``exp`` and measure per-position token accuracy at each evaluation length.

    Results go through the results cache (:func:`load_or_run`; ``cache`` as there): a rebuild of
    the book loads the trained weights and measurements instead of retraining.
    """
    from .evaluation import split_accuracy, token_accuracy_by_position
    from .models import Transformer
    from .training import train_sequence

    device = torch.device(device) if device is not None else default_device()
    task = exp.make_task()

    def build():
        return Transformer(getattr(task, "n_tokens", task.vocab_size), exp.n_layers, exp.n_heads, exp.d_model,
                           exp.pe, max_len=max(exp.eval_lengths + (exp.train_len,)), n_models=exp.n_seeds)

    def compute():
        model = build()
        history = train_sequence(model, task, steps=exp.steps, batch_size=exp.batch_size, lr=exp.lr,
                                 weight_decay=exp.weight_decay, train_len=exp.train_len, seed=exp.data_seed,
                                 device=device)
        measured = [token_accuracy_by_position(model, task, L, n_samples=exp.eval_samples) for L in exp.eval_lengths]
        return {"state_dict": dict(model.state_dict()), "loss_history": history,
                "accuracy": [acc for acc, _ in measured], "counts": [cnt for _, cnt in measured]}

    payload, _ = load_or_run(exp, compute, cache=cache, device=device)
    model = build()
    model.load_state_dict(payload["state_dict"])
    model.to(device).eval()
    accuracy = dict(zip(exp.eval_lengths, payload["accuracy"]))
    counts = dict(zip(exp.eval_lengths, payload["counts"]))
    split = {L: split_accuracy(accuracy[L], counts[L], exp.train_len) for L in exp.eval_lengths}
    outside = {L: out for L, (_, out) in split.items()}
    # inside the training length, measured on the shortest evaluation sequences (the training length
    # itself in every experiment of the book): a longer sequence may score no position < train_len (copy)
    inside = split[min(exp.eval_lengths)][0]
    return TransformerResult(exp, model, payload["loss_history"], accuracy, counts, inside, outside)


SUITES: dict[str, Callable] = {"single-head": run_single_head_suite, "transformer": run_transformer_suite}
