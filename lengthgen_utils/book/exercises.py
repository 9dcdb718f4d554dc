"""The chapters' checked exercises: each ``check_*`` tests a reader's function against the package.

A chapter asks the reader to write one small function (``my_targets``, ``my_kernel``, ...), whose stub
returns None. The next cell passes it to the chapter's check, which calls it on fixed, seeded inputs,
compares the result with the package's own computation (``torch.testing.assert_close``) and returns
``(passed, message)``: ``"PASS: ..."`` with the largest difference, ``"FAIL: ..."`` with the reason, or
``"not written yet: ..."`` for the stub. A check never raises on the reader's function (a wrong shape, a
bug, an exception inside it), so a chapter with the stub still runs from top to bottom.

Chapter 0's ``check_rope`` is written in its page; these are the others, kept here so the page shows only
the exercise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.testing import assert_close

from ..analysis import implicit_bias, kernel, probes, theory
from ..core import seeding
from ..core.attention import causal_attention
from ..core.encodings import WELL_CONDITIONED_FREQUENCIES, ALiBi
from ..core.models import LinearRNN, RetrievalHead
from ..core.rope import apply_rope
from ..core.tasks import FixedOffsetRetrieval
from ..run.evaluation import attention_vote

__all__ = [
    "check_alibi_bias",
    "check_attention_argmax",
    "check_causal_attention",
    "check_kernel",
    "check_min_norm",
    "check_relative_score",
    "check_rnn_logits",
    "check_target_mass",
    "check_targets",
    "check_vote",
    "check_window_margin",
    "compare",
]

Case = tuple[tuple, Tensor]  # (the arguments of one call, the package's answer)


def compare(fn: Callable, cases: Sequence[Case], name: str, reference: str,
            rtol: float | None = None, atol: float | None = None) -> tuple[bool, str]:
    """Call ``fn(*args)`` on every case and compare it with the package's answer.

    Args:
        fn: the reader's function.
        cases: ``(args, expected)`` pairs; ``expected`` a tensor (an integer one is compared exactly).
        name: the function's name in the page (for the "not written yet" message).
        reference: what the answer is compared with, for the "PASS" message.
        rtol, atol: tolerances of ``assert_close`` (None: its defaults for the expected dtype).

    Returns:
        ``(passed, message)``; never raises on what ``fn`` does.
    """
    gap = 0.0
    for args, expected in cases:
        try:
            out = fn(*args)
            if out is None:
                return False, f"not written yet: fill in {name} above, then rerun both cells"
            out = torch.as_tensor(out)
            if expected.is_floating_point():
                out = out.to(expected.dtype)
            assert_close(out, expected, rtol=rtol, atol=atol, check_dtype=expected.is_floating_point())
        except Exception as error:  # noqa: BLE001  (a wrong shape, a wrong value, a bug in fn)
            return False, f"FAIL: {type(error).__name__}: {str(error).strip()[:400]}"
        gap = max(gap, float((out.double() - expected.double()).abs().max()) if out.numel() else 0.0)
    return True, f"PASS: equals {reference} on {len(cases)} inputs (largest difference {gap:.1e})"


# ------------------------------------------------------------------------------------------ chapter 1
def check_targets(fn: Callable) -> tuple[bool, str]:
    """``fn(tokens [B, L], offset) -> [B]``: the token each sequence's query must retrieve.

    Compared with the targets ``FixedOffsetRetrieval(16, offset).sample`` draws (at the query, the last
    position) for offsets 1, 3, 5 and lengths 8, 16, 64.
    """
    cases = []
    for offset in (1, 3, 5):
        for seq_len in (8, 16, 64):
            tokens, targets = FixedOffsetRetrieval(16, offset).sample(
                32, seq_len, seeding.generator(100 * offset + seq_len))
            cases.append(((tokens, offset), targets[:, -1]))
    return compare(fn, cases, "my_targets", "the task's targets")


# ------------------------------------------------------------------------------------------ chapter 2
def check_relative_score(fn: Callable) -> tuple[bool, str]:
    """``fn(q [d], k [d], D [n]) -> [n]``: the logit ``q_m . k_j`` of a RoPE pair, from ``D = j - m`` alone.

    Compared, in float64, with ``apply_rope(q, m) . apply_rope(k, m + D)`` at query positions
    ``m = 0, 37, 1000, 100000``: a function of ``D`` alone passes only if RoPE's logit is one.
    """
    gen = seeding.generator(2)
    q, k = torch.randn(2, 16, generator=gen, dtype=torch.float64)
    D = torch.arange(-63, 64)  # [n]
    cases = []
    for m in (0, 37, 1000, 100_000):
        qm = apply_rope(q.expand(len(D), -1), torch.full_like(D, m))  # [n, d]
        kj = apply_rope(k.expand(len(D), -1), m + D)
        cases.append(((q, k, D), (qm * kj).sum(-1)))
    return compare(fn, cases, "my_relative_score", "the rotated query . rotated key")


# ------------------------------------------------------------------------------------------ chapter 3
def check_attention_argmax(fn: Callable, model: RetrievalHead | None = None) -> tuple[bool, str]:
    """``fn(model, seq_len) -> [M]``: the key position the query (at ``L - 1``) of each head attends to most.

    Compared with :func:`~lengthgen_utils.analysis.probes.attention_argmax` at lengths 16, 32, 64 and 256,
    on ``model`` (default: four untrained learned-APE heads, seeds 0 to 3).
    """
    if model is None:
        model = RetrievalHead(pe="ape", n_models=4)
    cases = [((model, L), probes.attention_argmax(model, [L])[:, 0]) for L in (16, 32, 64, 256)]
    return compare(fn, cases, "my_attention_argmax", "probes.attention_argmax")


# ------------------------------------------------------------------------------------------ chapter 4
def check_kernel(fn: Callable) -> tuple[bool, str]:
    """``fn(q0 [d], k0 [d], theta [d/2], D [n]) -> [n]``: a RoPE head's kernel ``s(D)`` from its weights.

    ``q0``, ``k0`` are the unrotated query and key of three untrained RoPE heads
    (:func:`~lengthgen_utils.analysis.kernel.unrotated_query_key`); compared with
    :func:`~lengthgen_utils.analysis.kernel.kernel_at` over ``D = -255 .. 0``.
    """
    model = RetrievalHead(pe="rope", n_models=3, seeds=(4, 5, 6))
    q0, k0 = kernel.unrotated_query_key(model)  # [M, d], float64
    theta = model.encoding.frequencies(q0.shape[-1], 1).double()  # [d/2]
    D = kernel.relative_positions(256)
    s = kernel.kernel_at(model, D)  # [M, n]
    cases = [((q0[i], k0[i], theta, D), s[i]) for i in range(3)]
    return compare(fn, cases, "my_kernel", "kernel.kernel_at")


# ------------------------------------------------------------------------------------------ chapter 5
def check_target_mass(fn: Callable) -> tuple[bool, str]:
    """``fn(s [n], offset, seq_len) -> scalar``: the attention on the target, from the kernel alone.

    ``s`` in the row layout (entry ``j`` holds ``s(D = j - (n-1))``); compared with
    :func:`~lengthgen_utils.analysis.theory.exact_target_mass` on random kernels.
    """
    s = 3 * torch.randn(2, 256, generator=seeding.generator(5), dtype=torch.float64)
    cases = [((s[i], k, L), theory.exact_target_mass(s[i : i + 1], k, [L])[0, 0])
             for i in range(2) for k in (1, 3) for L in (16, 64, 256)]
    return compare(fn, cases, "my_target_mass", "theory.exact_target_mass")


# ----------------------------------------------------------------------------------------- chapter 5b
def check_vote(fn: Callable) -> tuple[bool, str]:
    """``fn(tokens [B, L], attention [B, L], n_classes) -> [B]``: the class each sequence's attention votes for.

    The vote replaces the value table by the identity: class ``c`` collects the attention on the keys that
    hold token ``c`` (the query token holds no class) and the head answers the class with the most. The
    accuracy of ``fn``'s answers on chapter 1's task (``k = 3``) is compared with ``vote_accuracy`` of
    :func:`~lengthgen_utils.run.evaluation.attention_vote` on the same sequences, for three RoPE heads
    (``init_scale`` 4, so that their attention is far from flat) at lengths 16 and 64.
    """
    model = RetrievalHead(pe="rope", n_models=3, seeds=(50, 51, 52), init_scale=4.0)
    task = FixedOffsetRetrieval(16, 3)

    def accuracy(tokens, attention, n_classes, targets):
        winners = fn(tokens, attention, n_classes)
        return None if winners is None else (torch.as_tensor(winners) == targets).double().mean()

    cases = []
    for L in (16, 64):
        expected = attention_vote(model, task, [L], n_samples=256, seed=L)["vote_accuracy"][:, 0]  # [M]
        tokens, targets = task.sample(256, L, seeding.generator(L))
        with torch.no_grad():
            _, attention = model(tokens)  # [M, B, L]
        cases += [((tokens, attention[i], 16, targets[:, -1]), expected[i]) for i in range(3)]
    return compare(accuracy, cases, "my_vote", "evaluation.attention_vote's vote accuracy")


# ----------------------------------------------------------------------------------------- chapter 5c
def check_window_margin(fn: Callable) -> tuple[bool, str]:
    """``fn(s [n], offset, train_len) -> scalar``: the target's margin over the training window.

    Compared with :func:`~lengthgen_utils.analysis.implicit_bias.window_margin` on random kernels
    (row layout), offsets 1, 3, 5 and ``train_len = 16``.
    """
    s = torch.randn(3, 64, generator=seeding.generator(56), dtype=torch.float64)
    cases = [((s[i], k, 16), implicit_bias.window_margin(s[i : i + 1], k, 16)[0])
             for i in range(3) for k in (1, 3, 5)]
    return compare(fn, cases, "my_window_margin", "implicit_bias.window_margin")


# ------------------------------------------------------------------------------------------ chapter 6
def check_min_norm(fn: Callable) -> tuple[bool, str]:
    """``fn(trained [T], offset, theta [d/2]) -> [d]``: the min-norm interpolant ``c* = pinv(Phi_T) e_k``.

    Compared with :func:`~lengthgen_utils.analysis.theory.min_norm_interpolant` for the well-conditioned
    frequencies of chapter 6 (``d_head = 16``), training lengths 8 and 16, offsets 1 and 3. (RoPE's own
    frequencies make ``Phi_T`` so ill-conditioned that two correct pseudo-inverses differ.)
    """
    theta = torch.tensor(WELL_CONDITIONED_FREQUENCIES, dtype=torch.float64)  # [d/2]
    cases = []
    for train_len in (8, 16):
        trained = theory.trained_relative_positions(train_len, 1)
        for k in (1, 3):
            expected = theory.min_norm_interpolant(trained, k, 16, frequencies=theta)
            cases.append(((trained, k, theta), expected))
    return compare(fn, cases, "my_min_norm", "theory.min_norm_interpolant", rtol=1e-6, atol=1e-8)


# ------------------------------------------------------------------------------------------ chapter 7
def check_causal_attention(fn: Callable) -> tuple[bool, str]:
    """``fn(q, k, v) -> [..., L, d_head]``: causal softmax attention with the ``1/sqrt(d_head)`` scale.

    Compared with :func:`~lengthgen_utils.core.attention.causal_attention` on random ``[2, 4, L, 8]``
    queries, keys and values, ``L = 1, 12, 40``.
    """
    gen = seeding.generator(7)
    cases = []
    for L in (1, 12, 40):
        q, k, v = torch.randn(3, 2, 4, L, 8, generator=gen)
        cases.append(((q, k, v), causal_attention(q, k, v)))
    return compare(fn, cases, "my_causal_attention", "attention.causal_attention")


# ------------------------------------------------------------------------------------------ chapter 8
def check_rnn_logits(fn: Callable) -> tuple[bool, str]:
    """``fn(A [n, n], B [n, V+1], C [V, n], tokens [batch, L]) -> [batch, V]``: a linear RNN's logits.

    Compared with :class:`~lengthgen_utils.core.models.LinearRNN`'s forward (one model, ``init_scale``
    0.9 so that far tokens still count) on chapter 1's task at lengths 4, 16 and 48.
    """
    model = LinearRNN(16, d_state=16, init_scale=0.9, seeds=(8,))
    A, B, C = (t.detach()[0] for t in (model.A, model.B, model.C))
    cases = []
    for L in (4, 16, 48):
        tokens, _ = FixedOffsetRetrieval(16, 1).sample(8, L, seeding.generator(L))
        with torch.no_grad():
            cases.append(((A, B, C, tokens), model(tokens)[0][0]))
    return compare(fn, cases, "my_rnn_logits", "LinearRNN's forward", rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------ chapter 9
def check_alibi_bias(fn: Callable) -> tuple[bool, str]:
    """``fn(n_heads, seq_len) -> [H, L, L]``: ALiBi's bias ``m_h (j - m)`` for a power-of-two head count.

    Compared with ``ALiBi().score_bias`` for 1, 2, 4 and 8 heads at ``L = 10``.
    """
    pos = torch.arange(10)
    cases = [((h, 10), ALiBi().score_bias(None, pos, pos, h)[0]) for h in (1, 2, 4, 8)]
    return compare(fn, cases, "my_alibi_bias", "ALiBi().score_bias")

