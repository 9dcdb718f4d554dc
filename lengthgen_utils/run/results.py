"""One result type for every ensemble run: the trained models, what each model is, and what was measured.

Every runner (:mod:`~lengthgen_utils.run.runners`) and the zoo return a :class:`Runs`. A run trains one or
more batched ensembles (one per encoding and attention normaliser; one per snapshot step); a ``Runs`` holds
them side by side as *members*, one per trained model, each with its labels::

    runs = run_sweep(sweep)                    # every (encoding, attention) of the sweep, offsets x seeds each
    runs.where(pe="rope", offset=3)            # the RoPE heads of offset 3: a Runs of n_seeds members
    runs.where(pe="rope", offset=3).accuracy   # [n_seeds, n_lengths]
    runs.where(pe="rope").model                # the trained RoPE ensemble (every offset), one model object
    for k, heads in runs.where(pe="rope").by("offset").items(): ...

Labels are plain values (``offset=3``, ``seed=0``, ``attention="softmax"``, ``step=500``); ``pe`` is the
:class:`~lengthgen_utils.core.encodings.Encoding` and is matched by object, name (``"rope"``) or label.
What a runner measures per member is in ``measures`` (a tensor whose first dimension is the member, or a
dict ``{length: tensor}`` of them) and reads as an attribute too (``runs.inside``); what it computes once
for the whole run (a closed form, a frequency set) is in ``extra`` and reads as an attribute as well.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor


class Ensemble:
    """One batched ensemble of a run: the members it holds and its trained model.

    ``members`` are member indices of the :class:`Runs`, in the order of the model's rows; ``model`` is the
    trained ensemble restricted to those rows (copied out of the source model only when first asked for);
    ``build()`` builds the same rows untrained (the same seeds and encoding: the initial state of each member).
    """

    def __init__(self, model, members: list[int], build: Callable | None = None, rows: list[int] | None = None):
        self._source, self._build, self._rows, self._model = model, build, rows, None
        self.members = list(members)

    @property
    def model(self):
        if self._rows is None:
            return self._source
        if self._model is None:
            self._model = self._source.subset(self._rows)
        return self._model

    def build(self):
        """The untrained ensemble of these rows.

        Raises:
            ValueError: the runner did not record how to build it.
        """
        if self._build is None:
            raise ValueError("this run does not record how to build its untrained models")
        model = self._build()
        return model if self._rows is None else model.subset(self._rows)

    def subset(self, rows: list[int], members: list[int]) -> "Ensemble":
        """The ensemble of some of its rows (row indices into this ensemble), held by ``members``."""
        base = list(range(len(self.members))) if self._rows is None else self._rows
        chosen = [base[r] for r in rows]
        everything = self._rows is None and chosen == list(range(len(self.members)))
        return Ensemble(self._source, members, self._build, None if everything else chosen)


def _matches(value, wanted) -> bool:
    if isinstance(wanted, (list, tuple, set, frozenset)):
        return any(_matches(value, w) for w in wanted)
    if isinstance(wanted, str) and hasattr(value, "label") and hasattr(value, "name") and not isinstance(value, str):
        return wanted in (value.name, value.label)  # an encoding by name or label
    return value == wanted


@dataclass
class Runs:
    """The trained members of one run and what was measured (see the module docstring).

    Attributes:
        config: the configuration that was run (an experiment, a sweep, a snapshot sweep, ...).
        members: one dict of labels per member (``pe``, ``attention``, ``offset``, ``seed``, and what the runner
            adds, e.g. ``step``).
        lengths: the evaluation lengths (tokens).
        accuracy: float64 ``[M, len(lengths)]``.
        ensembles: the trained ensembles (:class:`Ensemble`), each holding some members.
        loss_history: ``[steps, M]`` training losses (nats), or None.
        measures: per-member measurements: ``name -> [M, ...]`` (or a list of M values), or
            ``name -> {length: [M, ...]}``.
        extra: what the run computed once for all members (closed forms, settings).
        cache: cache status of each ensemble (:func:`~lengthgen_utils.run.cache.load_or_run`), by its labels.

    Raises:
        ValueError: (at construction) fields whose member counts disagree.
    """

    config: object
    members: list[dict]
    lengths: list[int]
    accuracy: Tensor
    ensembles: list[Ensemble]
    loss_history: Tensor | None = None
    measures: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    cache: dict = field(default_factory=dict)

    def __post_init__(self):
        m = len(self.members)
        if self.accuracy.shape[0] != m or (self.loss_history is not None and self.loss_history.shape[1] != m):
            raise ValueError(f"a Runs of {m} members needs accuracy [M, n] and loss_history [steps, M]; got "
                             f"{tuple(self.accuracy.shape)} and "
                             f"{None if self.loss_history is None else tuple(self.loss_history.shape)}")
        held = sorted(i for e in self.ensembles for i in e.members)
        if held != list(range(m)):
            raise ValueError(f"the ensembles must hold every member exactly once; they hold {held} of {m}")

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return len(self.members)

    def __getattr__(self, name):
        # measures and run-level results read as attributes (runs.inside, runs.c_star); fields come first
        if name.startswith("_") or name in ("measures", "extra"):
            raise AttributeError(name)
        for source in (self.measures, self.extra):
            if name in source:
                return source[name]
        raise AttributeError(f"{type(self).__name__} has no field, measure or result {name!r}; measures: "
                             f"{sorted(self.measures)}, results: {sorted(self.extra)}")

    def label(self, name: str) -> list:
        """Each member's value of label ``name``, in member order.

        Raises:
            KeyError: a member without that label (the message lists the labels there are).
        """
        try:
            return [m[name] for m in self.members]
        except KeyError:
            raise KeyError(f"no label {name!r}; the members have {sorted(self.members[0]) if self.members else []}"
                           ) from None

    def value(self, name: str):
        """The one value of label ``name`` every member shares (e.g. ``value("pe")`` of one ensemble).

        Raises:
            ValueError: the members' values differ (the message lists them).
        """
        values = list(dict.fromkeys(self.label(name)))
        if len(values) != 1:
            raise ValueError(f"the members' {name!r} differ ({values}); select one first")
        return values[0]

    @property
    def pe(self):
        """The members' position encoding (all of them share it; see :meth:`value`)."""
        return self.value("pe")

    @property
    def offsets(self) -> list:
        """Each member's offset ``k``."""
        return self.label("offset")

    @property
    def seeds(self) -> list:
        """Each member's initialisation seed."""
        return self.label("seed")

    @property
    def experiment(self):
        """The configuration that was run (the same as ``config``)."""
        return self.config

    # ------------------------------------------------------------------ selecting
    def where(self, **criteria) -> "Runs":
        """The members whose labels match every criterion: ``where(offset=3)``, ``where(pe="rope", seed=[0, 1])``.

        A criterion's value is one value or a list of them; ``pe`` matches an encoding object, its name or its
        label. The order of the members is kept.

        Raises:
            ValueError: no member matches (the message lists the values each label takes).
        """
        return self.select(self.rows(**criteria))

    def rows(self, **criteria) -> list[int]:
        """The indices of the members :meth:`where` keeps: the rows of a tensor computed over every member (e.g.
        ``kernel.offset_kernel(runs.model, n)[runs.rows(offset=3)]``).

        Raises:
            ValueError: no member matches.
        """
        keep = [i for i, m in enumerate(self.members)
                if all(k in m and _matches(m[k], v) for k, v in criteria.items())]
        if not keep:
            seen = {k: sorted({str(m.get(k)) for m in self.members}) for k in criteria}
            raise ValueError(f"no member matches {criteria}; the labels take the values {seen}")
        return keep

    def select(self, indices) -> "Runs":
        """The members at ``indices`` (a list of member indices, in the order given)."""
        indices = list(indices)
        ensembles = []
        for e in self.ensembles:
            rows = {member: row for row, member in enumerate(e.members)}
            mine = [(new, rows[old]) for new, old in enumerate(indices) if old in rows]
            if mine:
                ensembles.append(e.subset([row for _, row in mine], [new for new, _ in mine]))
        index = torch.tensor(indices, dtype=torch.long)
        return Runs(self.config, [self.members[i] for i in indices], list(self.lengths), self.accuracy[index],
                    ensembles, None if self.loss_history is None else self.loss_history[:, index],
                    {name: _take_rows(value, index) for name, value in self.measures.items()}, dict(self.extra),
                    dict(self.cache))

    def by(self, name: str) -> dict:
        """The members grouped by label ``name``: ``{value: Runs}`` in the order the values first occur."""
        values = list(dict.fromkeys(self.label(name)))
        return {v: self.select([i for i, m in enumerate(self.members) if m[name] == v]) for v in values}

    def grouped_accuracy(self, name: str) -> Tensor:
        """The accuracy with the members grouped by label ``name``: ``[n_values, members per value, n_lengths]``
        (e.g. ``grouped_accuracy("offset")`` of a sweep is ``[offsets, seeds, lengths]``), values in the order
        they first occur.

        Raises:
            ValueError: the groups differ in size.
        """
        groups = [r.accuracy for r in self.by(name).values()]
        if len({g.shape[0] for g in groups}) != 1:
            raise ValueError(f"the groups of {name!r} differ in size ({[g.shape[0] for g in groups]}); "
                             "select members first")
        return torch.stack(groups)

    # ------------------------------------------------------------------ the models
    @property
    def model(self):
        """The trained model of these members: one ensemble object whose rows are the members, in order.

        Raises:
            ValueError: the members belong to more than one ensemble (e.g. two encodings): select first.
        """
        return self._one().model

    def initial_model(self):
        """The untrained model of these members (the same seeds and encoding: what training started from).

        Raises:
            ValueError: more than one ensemble (see :attr:`model`), or a run that does not record how to build it.
        """
        return self._one().build()

    def _one(self) -> Ensemble:
        if len(self.ensembles) != 1:
            raise ValueError(f"these {len(self)} members belong to {len(self.ensembles)} ensembles (one per "
                             "encoding, normaliser or snapshot); select one with where(...) first")
        e = self.ensembles[0]
        if e.members != list(range(len(self))):
            return e.subset(sorted(range(len(e.members)), key=lambda r: e.members[r]), list(range(len(self))))
        return e


def _take_rows(value, index: Tensor):
    if isinstance(value, Tensor):
        return value[index]
    if isinstance(value, dict):
        return {k: _take_rows(v, index) for k, v in value.items()}
    if isinstance(value, list):
        return [value[i] for i in index.tolist()]
    raise TypeError(f"a per-member measure must be a tensor [M, ...], a list of M values or a dict of them; "
                    f"got {type(value).__name__}")
