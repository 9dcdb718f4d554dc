"""Experiment configurations: frozen dataclasses that say exactly what is trained and evaluated.

Each configuration is hashable and describes itself completely, so it keys the results cache
(:func:`~lengthgen_utils.run.cache.load_or_run`). Configurations hold their task and their position
encoding as objects (:mod:`~lengthgen_utils.core.tasks`, :mod:`~lengthgen_utils.core.encodings`); a
registered encoding name is accepted and looked up at construction. Sequence fields accept lists
and are stored as tuples.

The defaults are the book's reconstruction of the paper's setups (arXiv 2607.18759; only its
abstract is available): chapter 1 for the single head, chapter 7 for the transformer.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace


from .._validate import (Normalized, check_fits, check_float_sequence, check_int, check_int_sequence, check_positive_float,
                         normalize_sequence)
from ..core.attention import check_attention
from ..core.encodings import Encoding, RoPE, get_encoding
from ..core.models import check_transition
from ..core.tasks import QUERY_TASKS, DelayedCopy, Task, query_task
from .optim import OptimizerSettings
from .profiles import Profile


@dataclass(frozen=True)
class TrainingSettings(Normalized):
    """What every ensemble experiment has: how many models, how they are trained, how much they are evaluated.

    Fields:
        n_seeds: models in the ensemble (initialisation seeds ``0 .. n_seeds-1``).
        steps, batch_size: training steps and sequences per step.
        optimizer, lr, weight_decay, momentum: the optimiser (:class:`~lengthgen_utils.run.optim.OptimizerSettings`:
            ``"adamw"``, ``"sgd"`` or ``"sign"``; the book's recipe is plain Adam, ``"adamw"`` with no decay).
        eval_samples: fresh sequences per evaluation length.
        data_seed: seed of the training stream.
    """

    n_seeds: int = 5
    steps: int = 500
    batch_size: int = 256
    lr: float = 1e-2
    weight_decay: float = 0.0
    eval_samples: int = 512
    data_seed: int = 0
    optimizer: str = "adamw"
    momentum: float = 0.0

    def __post_init__(self):
        self._check_training()

    def _check_training(self, **sizes) -> None:
        """Raise ``ValueError``/``TypeError`` naming the first bad field: these fields, and the int fields
        ``sizes`` names with their minimum."""
        for name, minimum in dict(n_seeds=1, steps=1, batch_size=1, eval_samples=1, data_seed=0, **sizes).items():
            check_int(name, getattr(self, name), minimum=minimum)
        self.optimizer_settings  # checks optimizer, lr, weight_decay and momentum

    @property
    def optimizer_settings(self) -> OptimizerSettings:
        """The optimiser these settings train with (built by :func:`~lengthgen_utils.run.optim.build_optimizer`)."""
        return OptimizerSettings(self.optimizer, self.lr, self.weight_decay, self.momentum)


@dataclass(frozen=True)
class SingleHeadSettings(TrainingSettings):
    """What one single-head ensemble (:class:`RetrievalExperiment`) and a sweep of them
    (:class:`RetrievalSweep`) share: the :class:`TrainingSettings`, task and model sizes, and lengths.

    Fields (beyond :class:`TrainingSettings`):
        vocab_size: V content tokens.
        train_len: longest training length (tokens).
        fixed_length: train at ``train_len`` only, instead of lengths uniform in ``[min_train_len, train_len]``.
        d_model, d_head: model sizes.
        length_multiples: evaluation lengths are ``train_len`` times each.
        max_len: positions the encoding covers (rows of an APE table); ``None`` = the longest evaluation length.
        min_train_len: shortest training length; ``None`` = the (largest) offset + 2.
        task_family: the name of a query-only task registered in :mod:`~lengthgen_utils.core.tasks`
            (:func:`~lengthgen_utils.core.tasks.register_query_task`), built as ``(vocab_size, offset)``
            for each offset; ``"fixed-offset"`` is :class:`~lengthgen_utils.core.tasks.FixedOffsetRetrieval`.
    """

    vocab_size: int = 16
    train_len: int = 16
    fixed_length: bool = False
    d_model: int = 32
    d_head: int = 16
    length_multiples: tuple[int, ...] = (1, 2, 4, 8, 16)
    max_len: int | None = None
    min_train_len: int | None = None
    task_family: str = "fixed-offset"

    def __post_init__(self):
        self._check_settings(1)

    def _check_settings(self, largest_offset: int) -> None:
        """Raise ``ValueError``/``TypeError`` naming the first bad field (called by the subclasses' ``__post_init__``)."""
        check_int("train_len", self.train_len, minimum=largest_offset + 2)
        self._check_training(vocab_size=2, d_model=1, d_head=2)
        if not isinstance(self.task_family, str):
            raise TypeError(f"task_family must be a task name (str), one of {sorted(QUERY_TASKS)}; "
                            f"got {type(self.task_family).__name__} {self.task_family!r}")
        if self.task_family not in QUERY_TASKS:
            raise ValueError(f"task_family must be one of the registered query-only tasks {sorted(QUERY_TASKS)}; "
                             f"got {self.task_family!r}")
        if not isinstance(self.fixed_length, bool):
            raise TypeError(f"fixed_length must be a bool; got {self.fixed_length!r}")
        normalize_sequence(self, "length_multiples", minimum=1)
        if self.min_train_len is not None:
            check_int("min_train_len", self.min_train_len, minimum=largest_offset + 2, maximum=self.train_len)
        if self.max_len is not None:
            check_int("max_len", self.max_len, minimum=self.train_len * min(self.length_multiples))

    @property
    def eval_lengths(self) -> list[int]:
        """``train_len`` times each length multiple, up to ``max_len`` when it is set."""
        lengths = [self.train_len * m for m in self.length_multiples]
        return lengths if self.max_len is None else [L for L in lengths if L <= self.max_len]

    @property
    def table_len(self) -> int:
        """Positions the encoding covers: ``max_len`` when set, else the longest evaluation length."""
        return self.max_len if self.max_len is not None else max(self.eval_lengths)

    @staticmethod
    def _profile_overrides(profile: Profile) -> dict:
        return dict(n_seeds=profile.n_seeds, steps=profile.steps, batch_size=profile.batch_size,
                    eval_samples=profile.eval_samples, length_multiples=profile.length_multiples)


def _check_selection(settings) -> None:
    """Check the two fields of the single-head ensembles that chapter 5c varies (``TypeError``/``ValueError``
    naming the field):

    * ``train_set``: ``None`` (a fresh batch every step), or the sequences per training length of one fixed
      training set drawn once, on which every step takes the full-batch loss (with ``"sgd"`` and no momentum:
      full-batch gradient descent); ``batch_size`` is then unused. An int >= 1.
    * ``init_scale``: every initial weight of the head times this factor (1: the book's initialisation), > 0.
    """
    if settings.train_set is not None:
        check_int("train_set", settings.train_set, minimum=1)
    check_positive_float("init_scale", settings.init_scale)


@dataclass(frozen=True)
class RetrievalExperiment(SingleHeadSettings):
    """One ensemble of single-head models trained on fixed-offset retrieval: the shared
    :class:`SingleHeadSettings` plus the position encoding, the attention normaliser, the offset, and
    ``train_set`` and ``init_scale`` (:func:`_check_selection`: a fixed training set, the initialisation's scale)."""

    pe: Encoding = field(default_factory=RoPE)
    attention: str = "softmax"
    offset: int = 3
    train_set: int | None = None
    init_scale: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "pe", get_encoding(self.pe))
        check_attention(self.attention)
        self._check_settings(check_int("offset", self.offset, minimum=1))
        _check_selection(self)
        self.pe.check(self.d_head, 1)

    @classmethod
    def from_profile(cls, profile: Profile, **overrides) -> "RetrievalExperiment":
        """The experiment with a profile's compute settings and any field overridden."""
        return cls(**{**cls._profile_overrides(profile), **overrides})

    @property
    def task(self) -> Task:
        """The experiment's task: ``task_family`` built with ``(vocab_size, offset)``."""
        return query_task(self.task_family, self.vocab_size, self.offset)


class _OffsetMajorEnsemble:
    """One ensemble holding ``n_seeds`` models per offset of ``offsets``, offset-major (a mixin of the
    sweeps whose models each retrieve at their own offset: needs the fields ``offsets``, ``n_seeds``,
    ``vocab_size`` and ``min_train_len``)."""

    @property
    def n_models(self) -> int:
        """Models in one ensemble: ``len(offsets) * n_seeds``."""
        return len(self.offsets) * self.n_seeds

    @property
    def tasks(self) -> list[Task]:
        """One task per model of an ensemble, offset-major (``task_family`` built at each offset)."""
        return [query_task(self.task_family, self.vocab_size, k) for k in self.offsets for _ in range(self.n_seeds)]

    @property
    def seeds(self) -> list[int]:
        """One initialisation seed per model of an ensemble, offset-major."""
        return [s for _ in self.offsets for s in range(self.n_seeds)]

    @property
    def shortest_train_len(self) -> int:
        """The shortest training length every model sees: ``min_train_len``, else the largest offset + 2."""
        return self.min_train_len if self.min_train_len is not None else max(self.offsets) + 2


@dataclass(frozen=True)
class RetrievalSweep(_OffsetMajorEnsemble, SingleHeadSettings):
    """A sweep of single-head ensembles: every (encoding, attention) pair is one batched ensemble of
    ``len(offsets) * n_seeds`` models that differ in offset and initialisation seed.

    Model ``(offset k, seed s)`` of the ensemble equals the model trained alone by
    ``run_retrieval(sweep.experiment(pe, k, attention))`` (seed ``s`` of that
    experiment) up to float rounding: the models share the data stream and are
    otherwise independent. Because they share it, every model trains on lengths
    ``U{shortest_train_len .. train_len}`` with ``shortest_train_len = max(offsets) + 2``
    unless ``min_train_len`` says otherwise (the per-offset experiments record it).

    The shared :class:`SingleHeadSettings`, plus ``pes`` (encodings; names are looked up),
    ``attentions`` and ``offsets``.

    Raises:
        ValueError / TypeError: an unknown encoding or attention, a duplicate or non-positive
            offset, a training length too short for the largest offset.
    """

    pes: tuple[Encoding, ...] = ("rope", "ape", "nope")
    attentions: tuple[str, ...] = ("softmax",)
    offsets: tuple[int, ...] = (1, 2, 3, 5)
    train_set: int | None = None
    init_scale: float = 1.0

    def __post_init__(self):
        for name in ("pes", "attentions"):
            values = getattr(self, name)
            if isinstance(values, (str, Encoding)) or not hasattr(values, "__iter__") or not tuple(values):
                raise TypeError(f"{name} must be a non-empty sequence; got {values!r}")
        object.__setattr__(self, "pes", tuple(get_encoding(pe) for pe in self.pes))
        object.__setattr__(self, "attentions", tuple(check_attention(a) for a in self.attentions))
        offsets = normalize_sequence(self, "offsets", minimum=1)
        if len(set(offsets)) != len(offsets):
            raise ValueError(f"offsets must be distinct; got {offsets}")
        self._check_settings(max(offsets))
        _check_selection(self)
        for pe in self.pes:
            pe.check(self.d_head, 1)

    @classmethod
    def from_profile(cls, profile: Profile, **overrides) -> "RetrievalSweep":
        """The sweep with a profile's compute settings, offsets and attention types, and any field overridden."""
        base = {**cls._profile_overrides(profile), "offsets": profile.offsets, "attentions": profile.attentions}
        return cls(**{**base, **overrides})

    def ensemble(self, pe, attention: str = "softmax") -> "RetrievalSweep":
        """The one-ensemble sweep of ``(pe, attention)``: the unit that is trained and cached."""
        pe = get_encoding(pe)
        if pe not in self.pes or attention not in self.attentions:
            raise ValueError(f"(pe, attention) must be in pes={self.pes} x attentions={self.attentions}; "
                             f"got ({pe!r}, {attention!r})")
        return replace(self, pes=(pe,), attentions=(attention,))

    def experiment(self, pe, offset: int, attention: str = "softmax") -> RetrievalExperiment:
        """The :class:`RetrievalExperiment` that trains the sweep's models of ``(pe, offset, attention)`` alone."""
        if offset not in self.offsets:
            raise ValueError(f"offset must be one of the sweep's offsets {self.offsets}; got {offset!r}")
        shortest = self.shortest_train_len
        shared = {f.name: getattr(self, f.name) for f in fields(SingleHeadSettings)}
        shared["min_train_len"] = None if shortest == offset + 2 else shortest
        return RetrievalExperiment(pe=pe, attention=attention, offset=offset, train_set=self.train_set,
                                   init_scale=self.init_scale, **shared)

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
        return cls(pes=(exp.pe,), attentions=(exp.attention,), offsets=offsets, train_set=exp.train_set,
                   init_scale=exp.init_scale, **shared)


@dataclass(frozen=True)
class SnapshotSweep(Normalized):
    """One single-head ensemble trained once, with its weights kept at several steps (chapter 5's margin sweep).

    Margins grow with training, so the snapshots of one run are heads of increasing margin, for the
    price of one training. The cache key of :func:`~lengthgen_utils.run.runners.run_snapshots`.

    Fields:
        sweep: a one-ensemble :class:`RetrievalSweep` (one encoding, one attention); its ``steps`` is the
            length of the run.
        snapshot_steps: the steps after which the weights are kept (each in ``1 .. sweep.steps``).
        lengths: the evaluation lengths of every snapshot (any lengths >= the shortest valid one,
            within the encoding's range).
        eval_samples: sequences per evaluation length.
        length_temperature: train with every logit multiplied by ``log L / log train_len`` at length L
            (a log-length temperature used in training, Chiang & Cholak 2022); the snapshots are evaluated
            with the same scale.
        content: train the ordinary head whose queries and keys see the token as well as the position
            (:class:`~lengthgen_utils.core.models.ContentRetrievalHead`, softmax only) instead of the
            position-only :class:`~lengthgen_utils.core.models.RetrievalHead` (the regime map).

    Raises:
        ValueError / TypeError: a sweep of more than one ensemble, a snapshot step outside the run,
            lengths out of range.
    """

    sweep: RetrievalSweep
    snapshot_steps: tuple[int, ...]
    lengths: tuple[int, ...]
    eval_samples: int = 1024
    length_temperature: bool = False
    content: bool = False

    def __post_init__(self):
        if not isinstance(self.sweep, RetrievalSweep) or len(self.sweep.pes) != 1 or len(self.sweep.attentions) != 1:
            raise TypeError(f"sweep must be a RetrievalSweep of one encoding and one attention; got {self.sweep!r:.200}")
        for i, step in enumerate(normalize_sequence(self, "snapshot_steps", minimum=1)):
            check_int(f"snapshot_steps[{i}]", step, minimum=1, maximum=self.sweep.steps)
        for i, seq_len in enumerate(normalize_sequence(self, "lengths", minimum=self.sweep.shortest_train_len)):
            check_int(f"lengths[{i}]", seq_len, maximum=self.sweep.table_len)
        check_int("eval_samples", self.eval_samples, minimum=1)
        if not isinstance(self.length_temperature, bool):
            raise TypeError(f"length_temperature must be a bool; got {self.length_temperature!r}")
        if not isinstance(self.content, bool):
            raise TypeError(f"content must be a bool; got {self.content!r}")
        if self.content and (self.length_temperature or self.sweep.attentions != ("softmax",)):
            raise ValueError("content heads train with softmax attention and no length temperature; got "
                             f"attentions={self.sweep.attentions}, length_temperature={self.length_temperature}")


@dataclass(frozen=True)
class RecurrentExperiment(_OffsetMajorEnsemble, SingleHeadSettings):
    """An ensemble of :class:`~lengthgen_utils.core.models.LinearRNN` models on fixed-offset retrieval (chapter 8).

    One model per (offset, seed), offset-major, trained together on one data stream as a
    :class:`RetrievalSweep` is (lengths ``U{max(offsets) + 2 .. train_len}`` unless ``min_train_len`` or
    ``fixed_length`` says otherwise). The shared :class:`SingleHeadSettings` (``d_model`` and ``d_head``
    are not used), plus:

    Fields:
        offsets: the offsets k (distinct).
        d_state: the recurrent state size.
        init_scale: the initial spectral scale of the transition matrix (see
            :class:`~lengthgen_utils.core.models.LinearRNNConfig`).
        transition: ``"free"`` (every entry of the transition trained) or ``"rotation"`` (trained
            rotations, every ``|eigenvalue|`` 1: a kernel that cannot decay), as in
            :class:`~lengthgen_utils.core.models.LinearRNNConfig`.
    """

    offsets: tuple[int, ...] = (1, 3, 5)
    d_state: int = 32
    init_scale: float = 0.1
    transition: str = "free"

    def __post_init__(self):
        offsets = normalize_sequence(self, "offsets", minimum=1)
        if len(set(offsets)) != len(offsets):
            raise ValueError(f"offsets must be distinct; got {offsets}")
        self._check_settings(max(offsets))
        check_int("d_state", self.d_state, minimum=1)
        check_positive_float("init_scale", self.init_scale, allow_zero=True)
        check_transition(self.transition, self.d_state)

    @classmethod
    def from_profile(cls, profile: Profile, **overrides) -> "RecurrentExperiment":
        """The experiment with a profile's compute settings and any field overridden."""
        return cls(**{**cls._profile_overrides(profile), **overrides})




@dataclass(frozen=True)
class KernelHeadConfig(Normalized):
    """The cache key of :func:`~lengthgen_utils.run.runners.run_kernel_head`: the experiment, the frequency set
    and the SGD settings."""

    experiment: RetrievalExperiment
    frequencies: tuple[float, ...] | None
    lr_fraction: float
    steps: int

    def __post_init__(self):
        if not isinstance(self.experiment, RetrievalExperiment):
            raise TypeError(f"experiment must be a RetrievalExperiment; got {type(self.experiment).__name__} "
                            f"{self.experiment!r:.60}")
        if self.frequencies is not None:
            object.__setattr__(self, "frequencies", check_float_sequence("frequencies", self.frequencies))
        check_positive_float("lr_fraction", self.lr_fraction)
        check_int("steps", self.steps, minimum=1)


@dataclass(frozen=True)
class TransformerExperiment(TrainingSettings):
    """An ensemble of :class:`~lengthgen_utils.core.models.Transformer` seeds on a full-sequence task.

    Sequence fields (``eval_lengths``) accept a list and are stored as a tuple, so the configuration
    stays hashable and keys the results cache.

    The :class:`TrainingSettings` (the reconstruction's AdamW recipe of chapter 7 by default:
    lr 1e-3, weight decay 0.05, batch 64, 1500 steps), plus:

    Fields:
        pe: the position encoding (an Encoding, or a registered name).
        task: the task object (e.g. ``DelayedCopy(16, 5)``); the model's vocabulary is ``task.n_tokens``.
        train_len: training sequence length (the longest, with ``min_train_len``); eval_lengths:
            evaluation lengths (a list is accepted).
        n_layers, n_heads, d_model: model sizes.
        min_train_len: ``None`` (train at ``train_len`` only) or the shortest training length: each step
            draws one of the task's valid lengths in ``[min_train_len, train_len]``
            (:func:`~lengthgen_utils.run.training.train_sequence`; chapter 8).
    """

    steps: int = 1500
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.05
    pe: Encoding = field(default_factory=RoPE)
    task: Task = field(default_factory=DelayedCopy)
    train_len: int = 32
    eval_lengths: tuple[int, ...] = (32, 64, 128, 256)
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 128
    min_train_len: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "pe", get_encoding(self.pe))
        if not isinstance(self.task, Task):
            raise TypeError(f"task must be a Task (e.g. DelayedCopy(16, 5)); got {type(self.task).__name__} "
                            f"{self.task!r}")
        self._check_training(n_layers=1, n_heads=1, d_model=1)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model must be divisible by n_heads; got d_model={self.d_model}, n_heads={self.n_heads}")
        self.pe.check(self.d_model // self.n_heads, self.n_heads)
        check_fits("train_len", self.train_len, self.task.check_seq_len)
        if self.min_train_len is not None:
            check_int("min_train_len", self.min_train_len, minimum=self.task.min_seq_len, maximum=self.train_len)
            self.task.valid_lengths(self.min_train_len, self.train_len)  # raises if none is valid
        for i, seq_len in enumerate(normalize_sequence(self, "eval_lengths", minimum=1)):
            check_fits(f"eval_lengths[{i}]", seq_len, self.task.check_seq_len)

    @property
    def max_len(self) -> int:
        """Positions the encoding covers: the longest of the training and evaluation lengths."""
        return max(self.eval_lengths + (self.train_len,))


def transformer_experiment(profile: Profile, **overrides) -> TransformerExperiment:
    """The transformer experiment with ``profile``'s compute settings and any field overridden."""
    return TransformerExperiment(**{**dict(profile.transformer), **overrides})


# ---------------------------------------------------------------- chapters 4 and 5: the base and margin sweeps
BASE_SWEEP_MULTIPLES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Chapter 4's base sweep is evaluated to 256x the training length (4096 tokens): small bases alias late."""


def rope_base_experiment(profile: Profile, base: float) -> RetrievalExperiment:
    """Chapter 4's sweep over the RoPE base: the RoPE experiment of chapter 1 with base ``base``.

    The profile's seeds and steps, evaluated at :data:`BASE_SWEEP_MULTIPLES` times the training length
    with 512 sequences per length; run it with
    :func:`~lengthgen_utils.run.runners.run_offset_sweep` (offsets 1, 2, 3, 5 in the book).
    """
    return RetrievalExperiment.from_profile(profile, pe=RoPE(base=base), length_multiples=BASE_SWEEP_MULTIPLES,
                                            eval_samples=512)


def fine_lengths(train_len: int = 16, octaves: int = 6, per_octave: int = 4) -> tuple[int, ...]:
    """Lengths ``train_len * 2^(j / per_octave)`` for ``j = 0 .. octaves * per_octave`` (rounded, distinct):
    fine enough to tell a cliff (a fall within one step) from a gradual decay."""
    train_len = check_int("train_len", train_len, minimum=2)
    octaves, per_octave = check_int("octaves", octaves, minimum=1), check_int("per_octave", per_octave, minimum=1)
    return tuple(sorted({round(train_len * 2 ** (j / per_octave)) for j in range(octaves * per_octave + 1)}))


MARGIN_CONTROLS = ("steps", "weight decay", "temperature")


def margin_sweep(profile: Profile, control: str, offsets=(1, 2, 3, 5)) -> SnapshotSweep:
    """Chapter 5's runs that move the margin, each one training with snapshots (the RoPE base is
    swept separately, by :func:`rope_base_experiment`).

    * ``"steps"``: learning rate 1e-3, snapshots after 100, 200 and 400 steps (small margins);
    * ``"weight decay"``: AdamW weight decay 1.0 at chapter 1's learning rate, 2000 steps in every
      profile (the decayed heads settle late), snapshots after 500, 1000 and 2000 steps;
    * ``"temperature"``: chapter 1's recipe with a log-length temperature in training (logits times
      ``log L / log 16``), the profile's steps.

    Every snapshot is evaluated on :func:`fine_lengths` up to 64x the training length.

    Raises:
        ValueError: an unknown control.
    """
    base = RetrievalSweep.from_profile(profile, pes=("rope",), attentions=("softmax",), offsets=offsets,
                                       length_multiples=(1, 2, 4, 8, 16, 32, 64))
    lengths = fine_lengths(base.train_len)
    samples = min(512, profile.eval_samples)
    if control == "steps":
        return SnapshotSweep(replace(base, lr=1e-3, steps=400), (100, 200, 400), lengths, samples)
    if control == "weight decay":
        return SnapshotSweep(replace(base, weight_decay=1.0, steps=2000), (500, 1000, 2000), lengths, samples)
    if control == "temperature":
        return SnapshotSweep(base, (base.steps,), lengths, samples, length_temperature=True)
    raise ValueError(f"control must be one of {MARGIN_CONTROLS}; got {control!r}")


@dataclass(frozen=True)
class RegimeMap(Normalized):
    """Chapter 5b's sweep over what sets a RoPE head's rule and its margin: the regime map.

    One cell is one :class:`SnapshotSweep` (one training of ``len(offsets) * n_seeds`` heads with
    snapshots): every RoPE base of ``bases`` times every AdamW weight decay of ``weight_decays``, for the
    position-only head, and every base times ``content_weight_decays`` for the head whose queries and
    keys see the token (``content=True``). The snapshots after ``snapshot_steps`` are the third axis.
    Every cell uses chapter 1's recipe otherwise (learning rate 1e-2, batch 256, training lengths
    ``U{7 .. 16}``) and is evaluated on :func:`fine_lengths` to 64x the training length.

    Fields:
        bases: RoPE bases.
        weight_decays: AdamW weight decays of the position-only heads (>= 0).
        content_weight_decays: weight decays of the content heads (may be empty).
        snapshot_steps: steps after which each training is kept (the last is the length of the run).
        offsets: task offsets; n_seeds: heads per offset and cell.
        eval_samples: test sequences per length; n_null: untrained heads per base (the carrier's null).

    Raises:
        ValueError / TypeError: empty or repeated axes, negative decays, bad sizes.
    """

    bases: tuple[float, ...] = (10.0, 100.0, 10000.0)
    weight_decays: tuple[float, ...] = (0.0, 0.1, 0.3, 1.0, 3.0, 10.0)
    content_weight_decays: tuple[float, ...] = (0.0, 1.0)
    snapshot_steps: tuple[int, ...] = (250, 500, 1000, 2000)
    offsets: tuple[int, ...] = (1, 2, 3, 5)
    n_seeds: int = 5
    eval_samples: int = 512
    n_null: int = 2000

    def __post_init__(self):
        for name in ("bases", "weight_decays", "content_weight_decays"):
            values = getattr(self, name)
            values = () if name == "content_weight_decays" and not tuple(values) else check_float_sequence(name, values)
            if len(set(values)) != len(values):
                raise ValueError(f"{name} must be distinct; got {values}")
            for i, v in enumerate(values):
                check_positive_float(f"{name}[{i}]", v, allow_zero=name != "bases")
            object.__setattr__(self, name, tuple(values))
        steps = normalize_sequence(self, "snapshot_steps", minimum=1)
        if list(steps) != sorted(set(steps)):
            raise ValueError(f"snapshot_steps must increase; got {steps}")
        offsets = normalize_sequence(self, "offsets", minimum=1)
        if len(set(offsets)) != len(offsets) or max(offsets) > 14:
            raise ValueError(f"offsets must be distinct and at most 14 (training length 16); got {offsets}")
        for name in ("n_seeds", "eval_samples", "n_null"):
            check_int(name, getattr(self, name), minimum=1)

    def cell(self, base: float, weight_decay: float, content: bool = False) -> SnapshotSweep:
        """The :class:`SnapshotSweep` of one cell: RoPE base ``base``, weight decay ``weight_decay``."""
        sweep = RetrievalSweep(pes=(RoPE(base=base),), attentions=("softmax",), offsets=self.offsets,
                               n_seeds=self.n_seeds, steps=max(self.snapshot_steps), weight_decay=weight_decay,
                               length_multiples=(1, 2, 4, 8, 16, 32, 64))
        return SnapshotSweep(sweep, self.snapshot_steps, fine_lengths(sweep.train_len), self.eval_samples,
                             content=content)

    @property
    def cells(self) -> list[tuple[bool, float, float]]:
        """Every cell as ``(content, base, weight_decay)``: the position-only cells, then the content cells."""
        return ([(False, b, w) for b in self.bases for w in self.weight_decays]
                + [(True, b, w) for b in self.bases for w in self.content_weight_decays])


def regime_map(profile: Profile) -> RegimeMap:
    """The profile's :class:`RegimeMap`: 5 seeds per offset and cell in ``quick`` and ``default``, the
    profile's seeds and 1024 test sequences per length in ``full`` (chapter 5b says which it ran)."""
    if profile.name == "full":
        return RegimeMap(n_seeds=profile.n_seeds, eval_samples=1024, n_null=4000)
    return RegimeMap()
