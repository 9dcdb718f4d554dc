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
