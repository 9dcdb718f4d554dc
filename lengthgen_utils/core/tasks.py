"""Synthetic tasks behind one protocol (:class:`Task`).

A task says what a sequence holds and what is asked of the model at each
position. Every task of the book answers the same questions, so training,
evaluation and the figures read the protocol and never ask which task they
hold:

* ``vocab_size``: the classes a prediction ranges over (``V``); ``n_tokens``: the
  input vocabulary (``V`` plus any special token such as the query ``[Q]``);
* ``chance``: the accuracy of guessing;
* ``min_seq_len`` and ``check_seq_len``: the shortest length with a scored position;
* ``scored_positions(L)``: where a target is defined (elsewhere ``IGNORE_INDEX``);
* ``targets(tokens)``: ``[..., B, L]`` targets, ``IGNORE_INDEX`` where none is defined;
* ``sample(batch_size, seq_len, generator)``: tokens and targets from an explicit
  ``torch.Generator``;
* ``query_only``: only the last position (the query) is scored, the readout of the
  single-head model of chapters 1-6.

Adding a task is one class here that implements ``_targets_at`` (and, if its
tokens are not i.i.d. uniform content, ``_sample_tokens``). A query-only task
built from ``(vocab_size, offset)`` also reaches the single-head experiments of
chapters 1-6 once it is registered under a name with
:func:`register_query_task`; the experiments name it in their ``task`` field
(:func:`query_task` builds it). The settings are the
book's reconstruction of the paper's tasks (arXiv 2607.18759; only its abstract
is available): chapter 1 (fixed-offset retrieval) and chapter 7 (full-sequence tasks).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from .._validate import Normalized, check_device, check_generator, check_int, per_model

IGNORE_INDEX = -100  # targets at positions where the task defines none; never scored, never in the loss


class Task(Normalized):
    """The protocol every task follows (see the module docstring).

    Subclasses are frozen dataclasses (hashable, so a task can sit in an experiment's
    configuration and key the results cache). They define ``vocab_size`` and
    ``_targets_at``; the rest has defaults here. A task with a special input token
    (a query or a separator) sets ``n_special_tokens = 1``; that token's id is ``vocab_size``.
    """

    vocab_size: int
    query_only: ClassVar[bool] = False
    n_special_tokens: ClassVar[int] = 0

    def __post_init__(self):
        check_int("vocab_size", self.vocab_size, minimum=2)

    @property
    def n_tokens(self) -> int:
        """Size of the input vocabulary: the content tokens plus any special token (query, separator)."""
        return self.vocab_size + self.n_special_tokens

    @property
    def special_token(self) -> int:
        """Id of the task's special input token (one past the content tokens).

        Raises:
            ValueError: the task has none.
        """
        if not self.n_special_tokens:
            raise ValueError(f"{self!r} has no special token")
        return self.vocab_size

    @property
    def chance(self) -> float:
        """Accuracy of guessing uniformly: ``1 / vocab_size``."""
        return 1.0 / self.vocab_size

    @property
    def min_seq_len(self) -> int:
        """The shortest length that has at least one scored position."""
        return 1

    def check_seq_len(self, seq_len: int) -> int:
        """Return ``seq_len`` if it is an int ``>= min_seq_len``; else raise ``ValueError``/``TypeError``."""
        seq_len = check_int("seq_len", seq_len, minimum=1)
        if seq_len < self.min_seq_len:
            raise ValueError(f"seq_len must be >= {self.min_seq_len} for {self!r} so that some position is "
                             f"scored; got seq_len={seq_len}")
        return seq_len

    def valid_lengths(self, shortest: int, longest: int) -> list[int]:
        """Every length in ``[shortest, longest]`` the task accepts (:meth:`check_seq_len`), increasing:
        the lengths a training over several lengths draws from (for :class:`Copy`, the odd ones).

        Raises:
            TypeError / ValueError: ``shortest`` not an int in ``[min_seq_len, longest]``, or a range that
                holds no length the task accepts.
        """
        longest = check_int("longest", longest, minimum=self.min_seq_len)
        shortest = check_int("shortest", shortest, minimum=self.min_seq_len, maximum=longest)
        lengths = []
        for seq_len in range(shortest, longest + 1):
            try:
                lengths.append(self.check_seq_len(seq_len))
            except ValueError:
                continue
        if not lengths:
            raise ValueError(f"no length in [{shortest}, {longest}] is valid for {self!r}")
        return lengths

    def scored_positions(self, seq_len: int) -> Tensor:
        """Boolean ``[L]``: True where the task defines a target."""
        seq_len = self.check_seq_len(seq_len)
        return self._scored(seq_len)

    def _scored(self, seq_len: int) -> Tensor:
        return torch.arange(seq_len) >= seq_len - self.n_scored(seq_len)

    def n_scored(self, seq_len: int) -> int:
        """Number of scored positions at length ``seq_len`` (the last ones, unless ``_scored`` says otherwise)."""
        raise NotImplementedError

    def targets(self, tokens: Tensor) -> Tensor:
        """Targets ``[..., B, L]`` of token batches ``[..., B, L]``: ``IGNORE_INDEX`` where none is defined."""
        if not isinstance(tokens, Tensor) or tokens.dtype != torch.long or tokens.dim() < 2:
            raise TypeError(f"tokens must be a LongTensor [..., B, L]; got {getattr(tokens, 'dtype', type(tokens).__name__)}"
                            f" {tuple(getattr(tokens, 'shape', ()))}")
        self.check_seq_len(tokens.shape[-1])
        return self._targets_at(tokens)

    def _targets_at(self, tokens: Tensor) -> Tensor:
        raise NotImplementedError

    def sample_space_size(self, seq_len: int) -> int:
        """Number of distinct sequences of length ``seq_len`` (small spaces can be memorised: report it)."""
        return self.vocab_size ** self.check_seq_len(seq_len)

    def _sample_tokens(self, batch_size: int, seq_len: int, generator) -> Tensor:
        return torch.randint(0, self.vocab_size, (batch_size, seq_len), generator=generator)

    def sample(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None,
               device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
        """Draw a batch.

        Args:
            batch_size: B >= 1.
            seq_len: L >= ``min_seq_len``.
            generator: the only source of randomness (a CPU ``torch.Generator``).
            device: where the returned tensors live (sampled on the CPU, then moved, so results
                do not depend on the device); checked by :func:`~lengthgen_utils._validate.check_device`.

        Returns:
            ``tokens`` LongTensor ``[B, L]`` and ``targets`` LongTensor ``[B, L]``
            (``IGNORE_INDEX`` at unscored positions).

        Raises:
            TypeError / ValueError: a size of the wrong type or out of range; a generator that is not one;
                a device this machine cannot compute on.
        """
        check_int("batch_size", batch_size, minimum=1)
        seq_len = self.check_seq_len(seq_len)
        check_generator(generator)
        tokens = self._sample_tokens(batch_size, seq_len, generator).to(check_device(device))  # [B, L]
        return tokens, self._targets_at(tokens)


def _ignored_like(tokens: Tensor) -> Tensor:
    return torch.full_like(tokens, IGNORE_INDEX)


QUERY_TASKS: dict[str, type] = {}  # name -> query-only task class built as cls(vocab_size, offset)


def register_query_task(name: str):
    """Class decorator: make a query-only task reachable by ``name`` from the single-head experiments.

    The class must be a :class:`Task` with ``query_only = True`` whose constructor takes
    ``(vocab_size, offset)``.

    Raises:
        TypeError: the class is not a query-only :class:`Task`.
        ValueError: ``name`` is already registered to another class.
    """
    def decorate(cls):
        if not (isinstance(cls, type) and issubclass(cls, Task) and cls.query_only):
            raise TypeError(f"register_query_task({name!r}) needs a query-only Task class; got {cls!r}")
        if QUERY_TASKS.get(name, cls) is not cls:
            raise ValueError(f"task name {name!r} is already registered to {QUERY_TASKS[name].__name__}")
        QUERY_TASKS[name] = cls
        return cls

    return decorate


def query_task(name: str, vocab_size: int, offset: int) -> "Task":
    """The registered query-only task ``name`` with ``vocab_size`` content tokens and offset ``offset``.

    Raises:
        ValueError: ``name`` is not registered (the message lists the names that are), or the
            task rejects ``vocab_size`` / ``offset``.
    """
    if name not in QUERY_TASKS:
        raise ValueError(f"task must be one of the registered query-only tasks {sorted(QUERY_TASKS)}; "
                         f"got {name!r}")
    return QUERY_TASKS[name](vocab_size, offset)


@register_query_task("fixed-offset")
@dataclass(frozen=True)
class FixedOffsetRetrieval(Task):
    """Retrieve the token ``offset`` positions before a final query token (chapters 1-6).

    A sequence of length ``L`` is ``x_0 .. x_{L-2}`` drawn uniformly from the
    ``vocab_size`` content tokens ``0 .. vocab_size-1``, then the query token
    ``[Q] = vocab_size`` at position ``L-1``. The only target is at the query:
    ``y = x_{L-1-offset}``, the token ``offset`` positions before it. Chance
    accuracy is ``1 / vocab_size``.

    Args:
        vocab_size: number of content tokens V, >= 2.
        offset: the fixed offset k, >= 1.

    Raises:
        TypeError / ValueError: ``vocab_size < 2`` or ``offset < 1``.

    Source: the paper's "minimal fixed-offset retrieval task" (arXiv 2607.18759, abstract),
    in the book's reconstruction (chapter 1).
    """

    vocab_size: int = 16
    offset: int = 3
    query_only: ClassVar[bool] = True
    n_special_tokens: ClassVar[int] = 1

    def __post_init__(self):
        super().__post_init__()
        check_int("offset", self.offset, minimum=1)

    @property
    def query_token(self) -> int:
        """Id of the query token ``[Q]`` (one past the content tokens)."""
        return self.special_token

    @property
    def min_seq_len(self) -> int:
        """Shortest valid length, ``offset + 2``: the target is a content token before the query."""
        return self.offset + 2

    def check_seq_len(self, seq_len: int) -> int:
        """Return ``seq_len`` if the offset fits: ``offset <= seq_len - 2``; else raise ``ValueError``."""
        seq_len = check_int("seq_len", seq_len, minimum=2)
        if self.offset > seq_len - 2:
            raise ValueError(
                f"offset must be in [1, seq_len - 2] = [1, {seq_len - 2}] so the target is a content token "
                f"before the query; got offset={self.offset} with seq_len={seq_len}")
        return seq_len

    def n_scored(self, seq_len: int) -> int:
        return 1

    def sample_space_size(self, seq_len: int) -> int:
        """Number of distinct sequences of length ``seq_len``: ``vocab_size ** (seq_len - 1)``."""
        return self.vocab_size ** (self.check_seq_len(seq_len) - 1)

    def _targets_at(self, tokens: Tensor) -> Tensor:
        out = _ignored_like(tokens)
        seq_len = tokens.shape[-1]
        out[..., -1] = tokens[..., seq_len - 1 - self.offset]
        return out

    def _sample_tokens(self, batch_size, seq_len, generator) -> Tensor:
        tokens = torch.randint(0, self.vocab_size, (batch_size, seq_len), generator=generator)
        tokens[:, -1] = self.query_token
        return tokens


@dataclass(frozen=True)
class DelayedCopy(Task):
    """Copy the token ``offset`` positions back, at every position: ``y_t = x_{t - offset}`` (chapter 7).

    Tokens ``x_0 .. x_{L-1}`` are uniform over ``vocab_size`` symbols; positions
    ``t < offset`` have no target. Chance is ``1 / vocab_size``.

    Source: the book's reconstruction of the paper's full-sequence setting (chapter 7).
    """

    vocab_size: int = 16
    offset: int = 5

    def __post_init__(self):
        super().__post_init__()
        check_int("offset", self.offset, minimum=1)

    @property
    def lags(self) -> tuple[int, ...]:
        """The offsets the task reads from."""
        return (self.offset,)

    @property
    def min_seq_len(self) -> int:
        return max(self.lags) + 1

    def n_scored(self, seq_len: int) -> int:
        return seq_len - max(self.lags)

    def _targets_at(self, tokens: Tensor) -> Tensor:
        out = _ignored_like(tokens)
        out[..., self.offset:] = tokens[..., : tokens.shape[-1] - self.offset]
        return out


@dataclass(frozen=True)
class LaggedSum(DelayedCopy):
    """``y_t = (x_{t - offset} + x_{t - offset2}) mod vocab_size``: two fixed-offset retrievals and an addition.

    Source: the book's reconstruction of the paper's full-sequence setting (chapter 7).
    """

    offset: int = 2
    offset2: int = 5

    def __post_init__(self):
        super().__post_init__()
        check_int("offset2", self.offset2, minimum=1)
        if self.offset2 == self.offset:
            raise ValueError(f"offset2 must differ from offset; got both = {self.offset}")

    @property
    def lags(self) -> tuple[int, ...]:
        return (self.offset, self.offset2)

    def _targets_at(self, tokens: Tensor) -> Tensor:
        seq_len = tokens.shape[-1]
        out = _ignored_like(tokens)
        t0 = max(self.lags)
        out[..., t0:] = (tokens[..., t0 - self.offset: seq_len - self.offset]
                         + tokens[..., t0 - self.offset2: seq_len - self.offset2]) % self.vocab_size
        return out


@dataclass(frozen=True)
class RunningParity(Task):
    """``y_t = (x_0 + ... + x_t) mod 2`` over bits: no fixed offset solves it at every length.

    It has no short length-independent RASP-L program that attention alone can
    express with fixed offsets (Zhou et al. 2024); chapter 8 contrasts it with
    delayed copy. Chance is 1/2.
    """

    vocab_size: int = 2

    def __post_init__(self):
        super().__post_init__()
        if self.vocab_size != 2:
            raise ValueError(f"RunningParity is over bits: vocab_size must be 2; got {self.vocab_size}")

    def n_scored(self, seq_len: int) -> int:
        return seq_len

    def _targets_at(self, tokens: Tensor) -> Tensor:
        return tokens.cumsum(-1) % 2


@dataclass(frozen=True)
class Copy(Task):
    """Copy a sequence after a separator: ``x_0 .. x_{n-1} [S] x_0 .. x_{n-1}``, ``seq_len = 2n + 1``.

    Position ``n + j`` (the separator for ``j = 0``) predicts ``x_j``: the
    offset to read from is ``n``, which *grows with the length*. A variable-
    offset task, on which RoPE transformers are known not to length-generalize
    (Kazemnejad et al. 2023). Positions ``< n`` and the last one are not scored.
    """

    vocab_size: int = 16
    n_special_tokens: ClassVar[int] = 1

    @property
    def separator(self) -> int:
        """Id of the separator token ``[S]``."""
        return self.special_token

    @property
    def min_seq_len(self) -> int:
        return 3

    def check_seq_len(self, seq_len: int) -> int:
        seq_len = check_int("seq_len", seq_len, minimum=3)
        if seq_len % 2 == 0:
            raise ValueError(f"seq_len must be odd (2n + 1: n tokens, the separator, n copies); got {seq_len}")
        return seq_len

    def _scored(self, seq_len: int) -> Tensor:
        n = (seq_len - 1) // 2
        pos = torch.arange(seq_len)
        return (pos >= n) & (pos < 2 * n)

    def sample_space_size(self, seq_len: int) -> int:
        """Number of distinct sequences of length ``2n + 1``: ``vocab_size ** n`` (the copy is determined)."""
        return self.vocab_size ** ((self.check_seq_len(seq_len) - 1) // 2)

    def _targets_at(self, tokens: Tensor) -> Tensor:
        n = (tokens.shape[-1] - 1) // 2
        out = _ignored_like(tokens)
        out[..., n: 2 * n] = tokens[..., :n]
        return out

    def _sample_tokens(self, batch_size, seq_len, generator) -> Tensor:
        n = (seq_len - 1) // 2
        content = torch.randint(0, self.vocab_size, (batch_size, n), generator=generator)
        sep = torch.full((batch_size, 1), self.separator, dtype=torch.long)
        return torch.cat([content, sep, content], 1)


# ---------------------------------------------------------------- ensembles: one task per model
def as_task_list(task, n_models: int) -> list:
    """Normalise ``task`` (one task, or one per model) to a list of ``n_models`` tasks sharing one vocabulary.

    Raises:
        TypeError: an entry does not follow the :class:`Task` protocol.
        ValueError: a sequence whose length is not ``n_models``, or tasks that differ in
            vocabulary or in their readout (``query_only``).
    """
    def check(label, t):
        if not isinstance(t, Task):
            raise TypeError(f"{label} must be a Task (e.g. FixedOffsetRetrieval); got {type(t).__name__}")
        return t

    tasks = list(per_model("task", task, n_models, check, "task"))
    for name in ("vocab_size", "n_tokens", "query_only"):
        values = {getattr(t, name) for t in tasks}
        if len(values) != 1:
            raise ValueError(f"all tasks of one ensemble must share {name}; got {sorted(values)}")
    return tasks


def shared_task(task) -> "Task":
    """Return ``task`` if it is one :class:`Task`, for functions whose models all solve one task.

    Raises:
        TypeError: ``task`` is a sequence (these functions take no task per model) or not a Task.
    """
    if isinstance(task, (list, tuple)):
        raise TypeError(f"task must be one Task, shared by every model (this function takes no task per model); "
                        f"got a {type(task).__name__} of {len(task)}")
    if not isinstance(task, Task):
        raise TypeError(f"task must be a Task (e.g. DelayedCopy); got {type(task).__name__} {task!r:.60}")
    return task


def query_targets(tasks: list, tokens: Tensor) -> Tensor:
    """Targets ``[M, B]`` at the query (last) position for an ensemble whose model ``i`` solves ``tasks[i]``
    on the shared ``tokens [B, L]`` (query-only tasks: the single-head readout).

    Each distinct task computes its targets once (a sweep has a few offsets and many seeds per offset), and
    only the query's are kept: at 1024 tokens, 120 models' full ``[M, B, L]`` targets would be half a
    gigabyte. ``tasks`` is a checked list (:func:`as_task_list`) and ``tokens`` a batch they sampled (the loops
    call this once per batch), so the tokens are not checked again (:meth:`Task.targets` checks a batch from
    elsewhere).

    Raises:
        ValueError: a task scores more than the last position.
    """
    if not tasks[0].query_only:
        raise ValueError(f"the single-head readout needs a query-only task (one target, at the last position); "
                         f"got {tasks[0]!r}")
    def at_query(task):  # [B]
        return task._targets_at(tokens)[..., -1]

    if all(t == tasks[0] for t in tasks):
        return at_query(tasks[0]).expand(len(tasks), tokens.shape[0])
    try:
        per_task = {t: at_query(t) for t in dict.fromkeys(tasks)}
    except TypeError:  # an unhashable task: compute per model
        return torch.stack([at_query(t) for t in tasks])
    return torch.stack([per_task[t] for t in tasks])
