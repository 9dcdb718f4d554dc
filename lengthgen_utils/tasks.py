"""Synthetic tasks. Each task samples ``(tokens, targets)`` from an explicit ``torch.Generator``.

The fixed-offset retrieval task is the book's reconstruction of the paper's
"minimal fixed-offset retrieval task" (arXiv 2607.18759, abstract); the
paper's exact setting is not available, see ``DESIGN.md``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ._validate import check_int


def _check_generator(generator) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None; got {type(generator).__name__}")


@dataclass(frozen=True)
class FixedOffsetRetrieval:
    """Retrieve the token ``offset`` positions before a final query token.

    A sequence of length ``L`` is ``x_0 .. x_{L-2}`` drawn uniformly from the
    ``vocab_size`` content tokens ``0 .. vocab_size-1``, then the query token
    ``[Q] = vocab_size`` at position ``L-1``. The target is
    ``y = x_{L-1-offset}``, the token ``offset`` positions before the query.
    Chance accuracy is ``1 / vocab_size``.

    Args:
        vocab_size: number of content tokens V, >= 2.
        offset: the fixed offset k, >= 1.

    Raises:
        TypeError / ValueError: ``vocab_size < 2`` or ``offset < 1``.

    Source: DESIGN.md, "Fixed-offset retrieval" (our reconstruction of the paper's task).
    """

    vocab_size: int = 16
    offset: int = 3

    def __post_init__(self):
        check_int("vocab_size", self.vocab_size, minimum=2)
        check_int("offset", self.offset, minimum=1)

    @property
    def query_token(self) -> int:
        """Id of the query token ``[Q]`` (one past the content tokens)."""
        return self.vocab_size

    @property
    def n_tokens(self) -> int:
        """Size of the input vocabulary: the content tokens plus ``[Q]``."""
        return self.vocab_size + 1

    @property
    def chance(self) -> float:
        """Accuracy of guessing: ``1 / vocab_size``."""
        return 1.0 / self.vocab_size

    @property
    def min_seq_len(self) -> int:
        """Shortest valid length, ``offset + 2`` (the target is never position 0's only neighbour)."""
        return self.offset + 2

    def check_seq_len(self, seq_len: int) -> int:
        """Return ``seq_len`` if the offset fits: ``offset <= seq_len - 2``; else raise ``ValueError``."""
        check_int("seq_len", seq_len, minimum=2)
        if self.offset > seq_len - 2:
            raise ValueError(
                f"offset must be in [1, seq_len - 2] = [1, {seq_len - 2}] so the target is a content token "
                f"before the query; got offset={self.offset} with seq_len={seq_len}"
            )
        return seq_len

    def sample_space_size(self, seq_len: int) -> int:
        """Number of distinct sequences of length ``seq_len``: ``vocab_size ** (seq_len - 1)``."""
        return self.vocab_size ** (self.check_seq_len(seq_len) - 1)

    def targets(self, tokens: Tensor) -> Tensor:
        """Targets ``[B]`` of token batches ``[..., B, L]``: the token at position ``L - 1 - offset``."""
        if not isinstance(tokens, Tensor) or tokens.dim() < 2:
            raise TypeError("tokens must be an integer tensor [..., B, L]")
        self.check_seq_len(tokens.shape[-1])
        return tokens[..., tokens.shape[-1] - 1 - self.offset]

    def sample(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None,
               device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
        """Draw a batch.

        Args:
            batch_size: B >= 1.
            seq_len: L, with ``offset + 2 <= L``.
            generator: the only source of randomness (a CPU ``torch.Generator``).
            device: where the returned tensors live (sampled on CPU, then moved,
                so results do not depend on the device).

        Returns:
            ``tokens`` LongTensor ``[B, L]`` (last column is ``query_token``) and
            ``targets`` LongTensor ``[B]`` with ``targets == tokens[:, L-1-offset]``.
        """
        check_int("batch_size", batch_size, minimum=1)
        self.check_seq_len(seq_len)
        _check_generator(generator)
        tokens = torch.randint(0, self.vocab_size, (batch_size, seq_len), generator=generator)
        tokens[:, -1] = self.query_token
        tokens = tokens.to(device)
        return tokens, self.targets(tokens)


# --- full-sequence tasks (chapters 7 and 8): a target at every position where one is defined
IGNORE_INDEX = -100  # targets at positions where the task defines none; never scored, never in the loss


@dataclass(frozen=True)
class DelayedCopy:
    """Copy the token ``offset`` positions back, at every position: ``y_t = x_{t - offset}``.

    Tokens ``x_0 .. x_{L-1}`` are uniform over ``vocab_size`` symbols; positions
    ``t < offset`` have no target (``IGNORE_INDEX``). Chance is ``1 / vocab_size``.

    Source: DESIGN.md, "Full-sequence task" (our reconstruction of C7's setting).
    """

    vocab_size: int = 16
    offset: int = 5

    def __post_init__(self):
        check_int("vocab_size", self.vocab_size, minimum=2)
        check_int("offset", self.offset, minimum=1)

    @property
    def lags(self) -> tuple[int, ...]:
        """The offsets the task reads from."""
        return (self.offset,)

    @property
    def chance(self) -> float:
        return 1.0 / self.vocab_size

    @property
    def first_target(self) -> int:
        """The first position with a defined target."""
        return max(self.lags)

    def check_seq_len(self, seq_len: int) -> int:
        """``seq_len`` must leave at least one scored position: ``seq_len > max(lags)``."""
        check_int("seq_len", seq_len, minimum=1)
        if seq_len <= self.first_target:
            raise ValueError(f"seq_len must be > {self.first_target} (the largest lag) so that some position is "
                             f"scored; got seq_len={seq_len}")
        return seq_len

    def sample_space_size(self, seq_len: int) -> int:
        """Number of distinct sequences of length ``seq_len``: ``vocab_size ** seq_len`` (every token is free).

        Small spaces can be memorised (e.g. 4 ** 5 = 1024 sequences): report it before calling accuracy generalization.
        """
        return self.vocab_size ** self.check_seq_len(seq_len)

    def targets(self, tokens: Tensor) -> Tensor:
        """Targets ``[B, L]`` (``IGNORE_INDEX`` where undefined) for ``tokens [B, L]``."""
        self.check_seq_len(tokens.shape[-1])
        out = torch.full_like(tokens, IGNORE_INDEX)
        out[..., self.offset:] = tokens[..., : tokens.shape[-1] - self.offset]
        return out

    def sample(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None,
               device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
        """Draw ``tokens [B, L]`` and ``targets [B, L]`` (LongTensors)."""
        check_int("batch_size", batch_size, minimum=1)
        self.check_seq_len(seq_len)
        _check_generator(generator)
        tokens = torch.randint(0, self.vocab_size, (batch_size, seq_len), generator=generator).to(device)
        return tokens, self.targets(tokens)


@dataclass(frozen=True)
class LaggedSum(DelayedCopy):
    """``y_t = (x_{t - lag1} + x_{t - lag2}) mod vocab_size``: two fixed-offset retrievals and an addition.

    Source: DESIGN.md, "Full-sequence task".
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

    def targets(self, tokens: Tensor) -> Tensor:
        seq_len = self.check_seq_len(tokens.shape[-1])
        out = torch.full_like(tokens, IGNORE_INDEX)
        t0 = self.first_target
        out[..., t0:] = (tokens[..., t0 - self.offset: seq_len - self.offset]
                         + tokens[..., t0 - self.offset2: seq_len - self.offset2]) % self.vocab_size
        return out


@dataclass(frozen=True)
class RunningParity:
    """``y_t = (x_0 + ... + x_t) mod 2`` over bits: no fixed offset solves it at every length.

    It has no short length-independent RASP-L program that attention alone
    can express with fixed offsets (Zhou et al. 2024); chapter 8 contrasts
    it with delayed copy. Chance is 1/2.
    """

    vocab_size: int = 2

    def __post_init__(self):
        if check_int("vocab_size", self.vocab_size, minimum=2) != 2:
            raise ValueError(f"RunningParity is over bits: vocab_size must be 2; got {self.vocab_size}")

    lags = ()
    chance = 0.5
    first_target = 0

    def check_seq_len(self, seq_len: int) -> int:
        return check_int("seq_len", seq_len, minimum=1)

    def sample_space_size(self, seq_len: int) -> int:
        """Number of distinct bit sequences of length ``seq_len``: ``2 ** seq_len``."""
        return 2 ** self.check_seq_len(seq_len)

    def targets(self, tokens: Tensor) -> Tensor:
        self.check_seq_len(tokens.shape[-1])
        return tokens.cumsum(-1) % 2

    def sample(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None,
               device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
        check_int("batch_size", batch_size, minimum=1)
        self.check_seq_len(seq_len)
        _check_generator(generator)
        tokens = torch.randint(0, 2, (batch_size, seq_len), generator=generator).to(device)
        return tokens, self.targets(tokens)


@dataclass(frozen=True)
class Copy:
    """Copy a sequence after a separator: ``x_0 .. x_{n-1} [S] x_0 .. x_{n-1}``, ``seq_len = 2n + 1``.

    Position ``n + j`` (the separator for ``j = 0``) predicts ``x_j``: the
    offset to read from is ``n``, which *grows with the length*. A variable-
    offset task, on which RoPE transformers are known not to length-generalize
    (Kazemnejad et al. 2023). Positions ``< n`` are not scored.
    """

    vocab_size: int = 16

    def __post_init__(self):
        check_int("vocab_size", self.vocab_size, minimum=2)

    @property
    def separator(self) -> int:
        return self.vocab_size

    @property
    def n_tokens(self) -> int:
        return self.vocab_size + 1

    @property
    def chance(self) -> float:
        return 1.0 / self.vocab_size

    def check_seq_len(self, seq_len: int) -> int:
        check_int("seq_len", seq_len, minimum=3)
        if seq_len % 2 == 0:
            raise ValueError(f"seq_len must be odd (2n + 1: n tokens, the separator, n copies); got {seq_len}")
        return seq_len

    def sample_space_size(self, seq_len: int) -> int:
        """Number of distinct sequences of length ``2n + 1``: ``vocab_size ** n`` (the copy is determined)."""
        return self.vocab_size ** ((self.check_seq_len(seq_len) - 1) // 2)

    def targets(self, tokens: Tensor) -> Tensor:
        seq_len = self.check_seq_len(tokens.shape[-1])
        n = (seq_len - 1) // 2
        out = torch.full_like(tokens, IGNORE_INDEX)
        out[..., n: 2 * n] = tokens[..., :n]
        return out

    def sample(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None,
               device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
        check_int("batch_size", batch_size, minimum=1)
        seq_len = self.check_seq_len(seq_len)
        _check_generator(generator)
        n = (seq_len - 1) // 2
        content = torch.randint(0, self.vocab_size, (batch_size, n), generator=generator)
        sep = torch.full((batch_size, 1), self.separator, dtype=torch.long)
        tokens = torch.cat([content, sep, content], 1).to(device)
        return tokens, self.targets(tokens)
