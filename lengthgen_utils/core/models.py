"""The book's models, each with a leading ensemble dimension: every parameter is ``[n_models, ...]``.

* :class:`RetrievalHead`: the single position-only head of chapters 1-6;
* :class:`KernelHead`: its linear-attention control with the offset kernel as the parameter (chapter 6);
* :class:`LinearRNN`: a linear recurrent model on the same task (chapter 8);
* :class:`Transformer`: a pre-LN decoder for the full-sequence tasks (chapters 7-9), nanoGPT-shaped and
  written to be read; the book trains :class:`~lengthgen_utils.core.fast.FastTransformer`, the same model
  (same state dict) in a batched layout, tested equal to it.

Each model asks its position encoding (:mod:`~lengthgen_utils.core.encodings`) what to add to the
residual stream, how to rotate queries and keys and what to add to the scores; none of them knows
which encoding it holds. Weights are stored ``[out, in]`` and act on column vectors, as in the book
(``q = W_Q x``). Training ``n_models`` independent models in one batched pass is what makes five
or more seeds per point affordable on a laptop CPU; model ``i`` is initialised from its own
``torch.Generator(seed_i)``, so it equals the same model built alone.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validate import (Normalized, check_int, check_int_sequence, check_positive_float, check_rope_base, per_model_ints,
                         per_model_rows)
from .seeding import generator
from .attention import ROW_WEIGHTS, _check_bias, attention_scores, causal_mask, check_attention, check_attention_fits
from .attention import ELU_LINEAR, _refuse_unstable, _softmax_rows, elu_linear_weights
from .encodings import Encoding, RoPE, get_encoding
from .rope import _kernel_features, check_relative_positions, kernel_frequencies


def _seeds(seeds, n_models: int) -> tuple[int, ...]:
    """One initialisation seed per model (default ``0 .. n_models-1``), checked by the package's one
    per-model check (:func:`~lengthgen_utils._validate.per_model_ints`); one int for all is refused
    (it would make every model the same)."""
    n_models = check_int("n_models", n_models, minimum=1)
    if seeds is None:
        return tuple(range(n_models))
    return per_model_ints("seeds", seeds, n_models, minimum=0, shared=False)


def _normal(gens, *shape, std: float, transpose: bool = False) -> nn.Parameter:
    """One ``N(0, std^2)`` tensor per generator, stacked: ``[M, *shape]`` (last two dims swapped if ``transpose``)."""
    w = torch.stack([torch.randn(*shape, generator=g) * std for g in gens])
    return nn.Parameter(w.transpose(-1, -2).contiguous() if transpose else w)


def _check_tokens(tokens, n_tokens: int, n_models: int, batched_models: bool = True) -> None:
    """Raise unless ``tokens`` is a LongTensor ``[B, L]`` (or ``[M, B, L]``) with ids in ``[0, n_tokens)``."""
    if not isinstance(tokens, Tensor) or tokens.dtype != torch.long:
        raise TypeError(f"tokens must be a LongTensor [B, L]; got {getattr(tokens, 'dtype', type(tokens).__name__)}")
    dims = (2, 3) if batched_models else (2,)
    if tokens.dim() == 3 and batched_models:
        per_model_rows("tokens", tokens, n_models)
    if tokens.dim() not in dims or tokens.shape[-1] < 1 or tokens.shape[-2] < 1:
        shape = "[B, L] or [M, B, L]" if batched_models else "[B, L]"
        raise ValueError(f"tokens must have shape {shape} (M = {n_models}, B >= 1, L >= 1); got {tuple(tokens.shape)}")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= n_tokens):
        raise ValueError(f"tokens must lie in [0, {n_tokens - 1}]; got values in [{int(tokens.min())}, {int(tokens.max())}]")


def _positions(seq_len: int, position_shift: int = 0, positions: Tensor | None = None) -> Tensor:
    """Positions ``[L]`` on the CPU: ``positions`` if given (checked), else ``shift .. shift + L - 1``."""
    seq_len = check_int("seq_len", seq_len, minimum=1)
    position_shift = check_int("position_shift", position_shift)
    if positions is None:
        return torch.arange(seq_len) + position_shift
    if not isinstance(positions, Tensor) or positions.dtype.is_floating_point or positions.shape != (seq_len,):
        raise ValueError(f"positions must be an integer tensor [L = {seq_len}]; got {positions!r:.80}")
    if position_shift:
        raise ValueError("give positions or position_shift, not both")
    return positions.cpu().long()


def _model_positions(model, seq_len: int, position_shift: int, positions: Tensor | None) -> Tensor:
    """The positions ``[L]`` a transformer's forward pass runs at, checked by :func:`_positions` and the model's
    encoding."""
    positions = _positions(seq_len, position_shift, positions)
    model.check_positions(positions)
    return positions


def readout(weights: Tensor, tokens: Tensor, table: Tensor) -> Tensor:
    """Class logits of a query that attends with ``weights`` over ``tokens``: ``sum_j a_j T[x_j]``.

    The value path of the position-only heads: every token ``x`` contributes a fixed row ``T[x]``
    of class logits (``E W_V^T W_O^T`` for :class:`RetrievalHead`, one-hot for :class:`KernelHead`),
    weighted by the attention on its position.

    Args:
        weights: ``[M, L]`` (one attention row per model, shared by the batch) or ``[M, B, L]``.
        tokens: ``[B, L]`` or ``[M, B, L]`` token ids in ``[0, n_tokens)``.
        table: ``[M, n_tokens, V]``.

    Returns:
        ``[M, B, V]``.

    Raises:
        ValueError: ``weights`` or ``tokens`` hold another number of models than ``table``.
    """
    m, n_tokens = table.shape[:2]
    per_model_rows("weights", weights, m)
    if tokens.dim() == 3:
        per_model_rows("tokens", tokens, m)
    if tokens.dim() not in (2, 3) or tokens.shape[-2] < 1 or tokens.shape[-1] < 1:
        raise ValueError(f"tokens must have shape [B, L] or [M, B, L] with B >= 1, L >= 1; got {tuple(tokens.shape)}")
    b, seq_len = tokens.shape[-2:]
    weights = weights[:, None, :] if weights.dim() == 2 else weights
    mass = torch.zeros(m, b, n_tokens, device=table.device, dtype=weights.dtype)
    mass.scatter_add_(2, tokens.expand(m, b, seq_len), weights.expand(m, b, seq_len))  # attention mass per token id
    return torch.bmm(mass, table.to(weights.dtype))


class Ensemble(nn.Module):
    """An ensemble of models: every parameter is ``[M, ...]``; ``n_models`` and ``device`` are read off them."""

    @property
    def n_models(self) -> int:
        return next(self.parameters()).shape[0]

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def _fresh(self, seeds: list[int]) -> "Ensemble":
        """A newly initialised ensemble of the same configuration with one model per seed (for :meth:`subset`)."""
        raise NotImplementedError(f"{type(self).__name__} does not support subset()")

    def subset(self, indices) -> "Ensemble":
        """A copy holding ensemble members ``indices`` (in that order), e.g. the seeds of one offset of a sweep.

        Raises:
            ValueError / TypeError: an index outside ``0 .. n_models-1``, or an empty list.
            NotImplementedError: a model class without :meth:`_fresh`.
        """
        indices = check_int_sequence("indices", indices, minimum=0)
        for i in indices:
            check_int("indices", i, minimum=0, maximum=self.n_models - 1)
        copy = self._fresh([self.seeds[i] for i in indices]).to(self.device)
        index = torch.tensor(indices, device=self.device)
        with torch.no_grad():
            for (_, p_copy), (_, p) in zip(copy.named_parameters(), self.named_parameters()):
                p_copy.copy_(p[index])
        return copy


@contextmanager
def diverged_models_allowed(model):
    """Inside this block, a single head whose attention is not finite in some models (their weights diverged: NaN
    or inf) gives those models NaN logits instead of refusing the call.

    Training and evaluating an ensemble cannot stop one member, and a chapter counts diverged models from their
    parameters (chapter 5c); :func:`~lengthgen_utils.run.training.train` and
    :func:`~lengthgen_utils.run.evaluation.accuracy_by_length` run inside it, and score a diverged model's NaN
    logits as class 0 (about chance). A call outside it refuses any non-finite attention (``ValueError``).
    Inside it, a ``linear_sum`` head whose logits sum to about zero, or an ``exp`` head with a logit that
    overflows, is not refused either (:func:`~lengthgen_utils.core.attention._refuse_unstable` is not called): its weights are huge
    or inf and the model diverges, one data point of a rate (chapter 6).
    """
    previous = getattr(model, "_diverged_allowed", False)
    model._diverged_allowed = True
    try:
        yield model
    finally:
        model._diverged_allowed = previous


class EnsembleModel(Ensemble):
    """What every model with a position encoding shares: a configuration ``config`` whose ``pe`` is the
    encoding, and the encoding's learned tables in ``pe_params``."""

    @property
    def encoding(self) -> Encoding:
        return self.config.pe

    def _init_encoding(self, encoding: Encoding, n_models: int, d_model: int, max_len: int, n_heads: int,
                       gens) -> None:
        self.pe_params = nn.ParameterDict({name: nn.Parameter(t) for name, t in
                                           encoding.init_parameters(n_models, d_model, max_len, n_heads, gens).items()})

    def check_positions(self, positions: Tensor) -> None:
        """Raise ``ValueError`` if the encoding has nothing for some of ``positions`` (e.g. beyond an APE table)."""
        self.encoding.check_positions(positions, self.config.max_len)


# ---------------------------------------------------------------- the single retrieval head (chapters 1-6)
@dataclass(frozen=True)
class RetrievalHeadConfig(Normalized):
    """Hyper-parameters of :class:`RetrievalHead` (hashable).

    Attributes:
        vocab_size: content tokens V (the input vocabulary is V + 1 with the query token).
        d_model, d_head: widths.
        pe: the position encoding (an :class:`~lengthgen_utils.core.encodings.Encoding`; a name is looked up).
        attention: the normaliser, a key of :data:`~lengthgen_utils.core.attention.ROW_WEIGHTS`.
        max_len: positions the encoding must cover (rows of an APE table).
        init_scale: every initial weight (the encoding's tables included) times this factor, > 0
            (1: the book's initialisation; small: rich, feature-learning training; large: lazy).
    """

    vocab_size: int = 16
    d_model: int = 32
    d_head: int = 16
    pe: Encoding = field(default_factory=RoPE)
    attention: str = "softmax"
    max_len: int = 256
    init_scale: float = 1.0

    def __post_init__(self):
        check_int("vocab_size", self.vocab_size, minimum=2)
        check_int("d_model", self.d_model, minimum=1)
        check_int("d_head", self.d_head, minimum=1)
        object.__setattr__(self, "pe", get_encoding(self.pe))
        check_attention(self.attention)
        check_int("max_len", self.max_len, minimum=2)
        check_positive_float("init_scale", self.init_scale)
        self.pe.check(self.d_head, 1)


class SingleHead(EnsembleModel):
    """What the two single retrieval heads share: their parameters, initialisation and value path.

    :class:`RetrievalHead` (queries and keys see the position only) and :class:`ContentRetrievalHead` (they
    see the token too) are siblings with the same parameters, so one's weights load into the other; each
    defines its own attention. Arguments and parameters: see :class:`RetrievalHead`.
    """

    def __init__(self, vocab_size: int = 16, d_model: int = 32, d_head: int = 16, pe="rope",
                 attention: str = "softmax", max_len: int = 256, n_models: int = 1, seeds=None,
                 init_scale: float = 1.0):
        super().__init__()
        self.config = RetrievalHeadConfig(vocab_size, d_model, d_head, pe, attention, max_len, init_scale)
        self.seeds = _seeds(seeds, n_models)
        gens = [generator(s) for s in self.seeds]
        self.embed = _normal(gens, vocab_size + 1, d_model, std=1.0)
        self.u = _normal(gens, d_model, std=1.0)
        self.w_q = _normal(gens, d_model, d_head, std=d_model ** -0.5, transpose=True)
        self.w_k = _normal(gens, d_model, d_head, std=d_model ** -0.5, transpose=True)
        self.w_v = _normal(gens, d_model, d_head, std=d_model ** -0.5, transpose=True)
        self.w_o = _normal(gens, d_head, vocab_size, std=d_head ** -0.5, transpose=True)
        self._init_encoding(self.config.pe, len(self.seeds), d_model, max_len, 1, gens)
        if self.config.init_scale != 1.0:
            with torch.no_grad():
                for p in self.parameters():
                    p.mul_(self.config.init_scale)

    def value_table(self) -> Tensor:
        """Class logits contributed by each input token at unit attention: ``E W_V^T W_O^T``, ``[M, V+1, V]``."""
        return self.embed @ self.w_v.transpose(1, 2) @ self.w_o.transpose(1, 2)

    def select(self, index: int) -> "SingleHead":
        """A one-model copy of ensemble member ``index`` (for checks and plots)."""
        return self.subset([check_int("index", index, minimum=0, maximum=self.n_models - 1)])

    def _fresh(self, seeds: list[int]) -> "SingleHead":
        cfg = self.config
        return type(self)(cfg.vocab_size, cfg.d_model, cfg.d_head, cfg.pe, cfg.attention, cfg.max_len,
                          n_models=len(seeds), seeds=seeds, init_scale=cfg.init_scale)


class RetrievalHead(SingleHead):
    """The single attention head of the fixed-offset retrieval task (chapter 1).

    Queries and keys see no token content: their input is a learned constant
    vector ``u`` plus whatever the encoding adds at position ``t`` (``e_t``; zero
    for RoPE and NoPE). Only the query at the last position ``L-1`` is read out::

        x_t = u + e_t,   q_t = Rot_t(W_Q x_t),   k_j = Rot_j(W_K x_j)
        s_j = q_{L-1} . k_j / sqrt(d_head) + bias(L-1, j),   j = 0 .. L-1
        a = softmax(s)   or, for the linear control, a = s   (no length-dependent normaliser)
        logits = W_O sum_j a_j W_V e(x_j)

    (``Rot`` is RoPE's rotation, the identity for the other encodings; ``bias`` is, e.g., ALiBi's.)
    Because the attention row does not depend on the tokens, it is computed once per
    (model, length); the value path is a per-token table ``E W_V^T W_O^T`` weighted by where each
    token sits (:func:`readout`).

    Args:
        vocab_size: number of content tokens V (the input vocabulary is V + 1 with ``[Q]``).
        d_model, d_head: widths.
        pe: the position encoding: an :class:`~lengthgen_utils.core.encodings.Encoding` or a registered
            name (``"rope"``, ``"ape"``, ``"nope"``, ...).
        attention: ``"softmax"`` or ``"linear"`` (:data:`~lengthgen_utils.core.attention.ROW_WEIGHTS`).
        max_len: positions the encoding must cover (the APE table's rows = longest usable sequence).
        n_models: ensemble size M.
        seeds: ``n_models`` ints, one initialisation seed per model (default ``0 .. M-1``).
        init_scale: every initial weight times this factor, > 0 (default 1, the book's initialisation;
            chapter 5c varies it). The draws are the same for every scale.

    Parameters:
        ``embed [M, V+1, d_model]``, ``u [M, d_model]``, ``w_q, w_k, w_v [M, d_head, d_model]``,
        ``w_o [M, V, d_head]`` and the encoding's tables in ``pe_params``.

    Shapes:
        ``forward(tokens [B, L] or [M, B, L])`` returns ``logits [M, B, V]`` and the query's attention
        weights ``[M, B, L]``.

    Raises:
        ValueError / TypeError: any argument out of range (e.g. odd ``d_head`` with RoPE, an unknown
        encoding name), at construction; a position the encoding cannot cover at ``forward``.
    """

    def queries_keys(self, positions: Tensor, encoding: Encoding | None = None) -> tuple[Tensor, Tensor]:
        """The query and the key a token at each of ``positions`` would emit (encoding applied).

        Args:
            positions: integer tensor ``[P]`` of absolute positions.
            encoding: compute with this encoding instead of the model's own (same learned tables), e.g.
                RoPE with angles formed in low precision (chapter 2).

        Returns:
            ``q [M, P, d_head]`` and ``k [M, P, d_head]``.
        """
        encoding = self.encoding if encoding is None else get_encoding(encoding)
        positions = torch.as_tensor(positions).cpu()
        x = self.u[:, None, :]  # [M, 1, d_model]
        added = encoding.embed(self.pe_params, positions)
        x = x + added if added is not None else x  # [M, P, d_model], or [M, 1, d_model]: the same at every position
        shape = (-1, positions.shape[0], -1)
        q = encoding.rotate(torch.einsum("mpd,mhd->mph", x, self.w_q).expand(shape), positions)
        k = encoding.rotate(torch.einsum("mpd,mhd->mph", x, self.w_k).expand(shape), positions)
        # each its own memory (a caller may edit it in place): a copy only where the encoding returned
        # the expanded input itself (NoPE, ALiBi, T5); a rotation's result already is one
        return q.contiguous(), k.contiguous()  # [M, P, d_head] each

    def scores(self, seq_len: int, position_shift: int = 0, positions: Tensor | None = None) -> Tensor:
        """Attention logits ``s_j`` of the query (position ``L-1``) over keys ``j = 0 .. L-1``: ``[M, L]``.

        ``positions`` replaces ``shift .. shift + L - 1`` (e.g. the randomised positions of training).
        """
        positions = _positions(seq_len, position_shift, positions)  # [L] integers on the CPU
        q, k = self.queries_keys(positions)
        s = attention_scores(q[:, -1:], k)[:, 0]  # [M, L]
        bias = self.encoding.score_bias(self.pe_params, positions[-1:], positions, 1)
        return s if bias is None else s + bias.reshape(-1, positions.shape[0]).to(s)

    def attention_row(self, seq_len: int, position_shift: int = 0, logit_scale: float = 1.0,
                      positions: Tensor | None = None) -> Tensor:
        """The query's attention weights over the L keys: ``[M, L]``.

        ``logit_scale`` multiplies every logit first (a test-time temperature, chapter 5).
        """
        if logit_scale != 1.0:
            logit_scale = check_positive_float("logit_scale", logit_scale)
        if self.config.attention == ELU_LINEAR:  # no logits: its own path
            return self._elu_linear_row(_positions(seq_len, position_shift, positions), logit_scale)
        s = self.scores(seq_len, position_shift, positions)  # [M, L]
        if logit_scale != 1.0:
            s = logit_scale * s
        if not getattr(self, "_diverged_allowed", False):
            # inside diverged_models_allowed, a model whose logits sum to about zero (linear_sum) or overflow
            # (exp) diverges, as a data point
            _refuse_unstable(s, self.config.attention)
        return ROW_WEIGHTS[self.config.attention](s)

    def _elu_linear_row(self, positions: Tensor, logit_scale: float) -> Tensor:
        """:meth:`attention_row` of the ``linear_elu`` head: elu+1 features of the unrotated query and keys,
        rotated by the encoding in the numerator only (:func:`~lengthgen_utils.core.attention.elu_linear_weights`).

        Raises:
            ValueError: a ``logit_scale`` other than 1 (this head has no logits to scale), or an encoding
                with a score bias (ALiBi's: nothing to add it to).
        """
        if logit_scale != 1.0:
            raise ValueError(f"logit_scale applies to a head with logits; attention {ELU_LINEAR!r} has none "
                             f"(got logit_scale={logit_scale!r})")
        if self.encoding.score_bias(self.pe_params, positions[-1:], positions, 1) is not None:
            raise ValueError(f"attention {ELU_LINEAR!r} has no logits to add {self.encoding!r}'s score bias to")
        x = self.u[:, None, :]
        added = self.encoding.embed(self.pe_params, positions)
        x = x + added if added is not None else x.expand(-1, positions.shape[0], -1)  # [M, P, d_model]
        q = torch.einsum("mpd,mhd->mph", x[:, -1:], self.w_q)  # [M, 1, d_head], before any rotation
        k = torch.einsum("mpd,mhd->mph", x, self.w_k)  # [M, P, d_head]
        return elu_linear_weights(q, k, lambda f: self.encoding.rotate(f, positions[-1:]),
                                  lambda f: self.encoding.rotate(f, positions))[:, 0]

    def query_attention(self, tokens: Tensor, position_shift: int = 0, logit_scale: float = 1.0,
                        positions: Tensor | None = None) -> Tensor:
        """The query's attention ``[M, B, L]`` for ``tokens [B, L]`` or ``[M, B, L]``: :meth:`forward` without
        its readout (the row of :meth:`attention_row`, the same for every sequence, expanded over the batch).

        Arguments and errors as :meth:`forward`.
        """
        _check_tokens(tokens, self.config.vocab_size + 1, self.n_models)
        attn = self.attention_row(tokens.shape[-1], position_shift, logit_scale, positions)  # [M, L]
        if not getattr(self, "_diverged_allowed", False) and not bool(torch.isfinite(attn).all()):
            raise ValueError(f"the attention row of {self.encoding!r} at length {tokens.shape[-1]} is not "
                             "finite (a NaN or inf score bias or weight): refusing to read it out")
        return attn[:, None, :].expand(self.n_models, tokens.shape[-2], -1)

    def forward(self, tokens: Tensor, position_shift: int = 0, logit_scale: float = 1.0,
                positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Logits ``[M, B, V]`` and the query's attention ``[M, B, L]`` for ``tokens [B, L]`` or ``[M, B, L]``.

        ``logit_scale`` and ``positions`` are passed to :meth:`attention_row`.

        Raises:
            ValueError: an attention row is not finite (a NaN or inf weight or learned score bias), except inside
                :func:`diverged_models_allowed` (training, evaluation), where such a model gives NaN logits; bad
                ``tokens``.
        """
        attn = self.query_attention(tokens, position_shift, logit_scale, positions)  # [M, B, L]: one row, expanded
        return readout(attn[:, 0], tokens, self.value_table()), attn

    def with_attention(self, attention: str) -> "RetrievalHead":
        """A copy with the same weights whose attention row uses another normaliser (chapter 6's test-time swap).

        Args:
            attention: a key of :data:`~lengthgen_utils.core.attention.ROW_WEIGHTS`.

        Raises:
            ValueError: an unknown normaliser.
        """
        cfg = self.config
        copy = RetrievalHead(cfg.vocab_size, cfg.d_model, cfg.d_head, cfg.pe, check_attention(attention), cfg.max_len,
                             n_models=self.n_models, seeds=self.seeds).to(self.device)
        copy.load_state_dict(self.state_dict())
        return copy.eval() if not self.training else copy


class ContentRetrievalHead(SingleHead):
    """The ordinary single head: queries and keys see the token as well as the position (the regime map).

    :class:`RetrievalHead` gives queries and keys a learned constant input, so every key of a length gets
    the same logit wherever its token is: its distractors are positions, never tokens. Here the input
    of position ``t`` is ``u + E[x_t] + e_t`` in the query and key paths too::

        x_t = u + E[x_t] + e_t,   q = Rot_{L-1}(W_Q x_{L-1}),   k_j = Rot_j(W_K x_j)
        s_j = q . k_j / sqrt(d_head) + bias(L-1, j),   a = softmax(s),   logits = W_O sum_j a_j W_V E[x_j]

    so the logit of key ``j`` depends on its token: a distractor whose token the query favours
    competes with the target, the comparable distractors a dilution law is about. The two heads are
    siblings (:class:`SingleHead`): the same parameters and value path (``value_table``), so a
    :class:`RetrievalHead`'s weights load into this head and back. This head has no position-only
    attention row (``scores``, ``attention_row``): its row differs per sequence. With RoPE every logit still
    depends on the positions only through the offset ``j - (L-1)`` (chapter 2's argument, per token).

    Args:
        as :class:`RetrievalHead`; ``attention`` must be ``"softmax"`` (a per-sequence row of another
        normaliser is not part of the book).

    Shapes:
        ``forward(tokens [B, L] or [M, B, L])`` returns ``logits [M, B, V]`` and the query's attention
        weights ``[M, B, L]``, one row per sequence.

    Raises:
        ValueError / TypeError: as :class:`RetrievalHead`; an ``attention`` other than ``"softmax"``.

    Source: the regime map (chapter 5b, "Distractors that see the token"); the usual single attention head
    (Vaswani et al. 2017) with the book's readout at the last position.
    """

    def __init__(self, vocab_size: int = 16, d_model: int = 32, d_head: int = 16, pe="rope",
                 attention: str = "softmax", max_len: int = 256, n_models: int = 1, seeds=None,
                 init_scale: float = 1.0):
        if attention != "softmax":
            raise ValueError(f"ContentRetrievalHead attends with softmax only; got attention={attention!r}")
        super().__init__(vocab_size, d_model, d_head, pe, attention, max_len, n_models, seeds, init_scale)

    def logit_table(self, seq_len: int, positions: Tensor | None = None) -> Tensor:
        """Every logit the query at the last position can give a key: ``[M, V+1, L, V+1]``, indexed by
        (the query's token, the key's position, the key's token), at positions ``0 .. seq_len - 1`` or at
        ``positions`` (``[seq_len]`` integers: a forward pass's).

        A position-only head has one kernel over the offset; this head has one per (query token, key
        token) pair, and training shapes them only inside its window (chapter 5b reads beyond it).

        Raises:
            ValueError / TypeError: ``seq_len`` not an integer >= 1, ``positions`` not ``seq_len`` integers,
                or a position the encoding cannot cover (APE).

        Source: chapter 5b, "Why the ordinary head fails at 2x".
        """
        positions = _model_positions(self, seq_len, 0, positions)
        m, n_tokens, seq_len = self.n_models, self.config.vocab_size + 1, positions.shape[0]
        x = self.u[:, None, :] + self.embed  # [M, V+1, d_model]: each token's input before the position
        q = torch.einsum("mvd,mhd->mvh", x, self.w_q)[:, :, None, :]  # [M, V+1, 1, d_head]: per query token
        k = torch.einsum("mvd,mhd->mvh", x, self.w_k)[:, :, None, :]  # [M, V+1, 1, d_head]: per key token
        added = self.encoding.embed(self.pe_params, positions)  # APE's e_t [M, L, d_model]; linear, so added here
        if added is not None:
            q = q + torch.einsum("mld,mhd->mlh", added[:, -1:], self.w_q)[:, None]
            k = k + torch.einsum("mld,mhd->mlh", added, self.w_k)[:, None]  # [M, V+1, L, d_head]
        q = self.encoding.rotate(q, positions[-1:])[:, :, 0]  # [M, V+1, d_head]
        k = self.encoding.rotate(k.expand(m, n_tokens, seq_len, -1), positions)  # [M, V+1, L, d_head]
        # every (query token, key position, key token) logit: [M, V+1, L, V+1], small next to [M, B, L, d_head]
        return torch.einsum("muh,mvlh->mulv", q, k) / math.sqrt(self.config.d_head)

    def _content_scores(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Attention logits of the query over every key of each sequence: ``[M, B, L]`` (on arguments
        :meth:`forward` checked).

        Args:
            tokens: ``[B, L]`` or ``[M, B, L]`` token ids (checked by :meth:`forward`).
            positions: ``[L]`` integer positions on the CPU.
        """
        m, n_tokens, seq_len = self.n_models, self.config.vocab_size + 1, positions.shape[0]
        table = self.logit_table(seq_len, positions).reshape(m, -1)  # [M, (V+1) * L * (V+1)]
        # the flat index of (query token, key position, key token): [B, L] or [M, B, L]
        where = (tokens[..., -1:] * seq_len + torch.arange(seq_len, device=tokens.device)) * n_tokens + tokens
        if tokens.dim() == 2:  # one batch for every model: one index, not M copies of it
            s = table.index_select(1, where.flatten()).view(m, *tokens.shape)  # [M, B, L]
        else:
            s = table.gather(1, where.reshape(m, -1)).view(tokens.shape)
        bias = self.encoding.score_bias(self.pe_params, positions[-1:], positions, 1)
        return s if bias is None else s + bias.reshape(-1, 1, positions.shape[0]).to(s)

    def query_attention(self, tokens: Tensor, position_shift: int = 0, logit_scale: float = 1.0,
                        positions: Tensor | None = None) -> Tensor:
        """The query's attention ``[M, B, L]`` (one row per sequence): :meth:`forward` without its readout.

        Arguments, a diverged model and errors as :meth:`RetrievalHead.forward`.
        """
        _check_tokens(tokens, self.config.vocab_size + 1, self.n_models)
        positions = _positions(tokens.shape[-1], position_shift, positions)  # [L] integers on the CPU
        if logit_scale != 1.0:
            logit_scale = check_positive_float("logit_scale", logit_scale)
        s = self._content_scores(tokens, positions)  # the positions are checked by logit_table
        attn = _softmax_rows(s if logit_scale == 1.0 else logit_scale * s)  # [M, B, L]
        if not getattr(self, "_diverged_allowed", False) and not bool(torch.isfinite(attn).all()):
            raise ValueError(f"the attention of {self.encoding!r} at length {tokens.shape[-1]} is not finite")
        return attn

    def forward(self, tokens: Tensor, position_shift: int = 0, logit_scale: float = 1.0,
                positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Logits ``[M, B, V]`` and the query's attention ``[M, B, L]`` (one row per sequence).

        Arguments, a diverged model and errors as :meth:`RetrievalHead.forward`.
        """
        attn = self.query_attention(tokens, position_shift, logit_scale, positions)  # [M, B, L]
        return readout(attn, tokens, self.value_table()), attn


# ---------------------------------------------------------------- the direct kernel head (chapter 6)
class KernelHead(Ensemble):
    """A directly parameterised RoPE offset kernel with linear attention and one-hot values (chapter 6).

    The exactly solvable version of the linear-attention control: the head's
    attention weight on the key at relative position ``D = j - (L-1)`` is the kernel
    ``s(D) = Phi(D) . c`` itself (no softmax, no normaliser, no scale), with
    ``Phi(D) = [cos(theta_i D)]_i ++ [sin(theta_i D)]_i`` (RoPE frequencies
    ``theta_i``, see :func:`~lengthgen_utils.core.rope.rope_kernel_features`) and
    ``c`` in ``R^{d_head}`` the only parameter. Values are one-hot over the V
    content tokens (the query token's value is zero)::

        output_v = sum_{j=0}^{L-1} s(j - (L-1)) [x_j == v],   v = 0 .. V-1

    A factorised RoPE head with ``q = W_Q u``, ``k = W_K u`` realises every
    ``c`` (:func:`~lengthgen_utils.core.rope.rope_kernel_coefficients`), so this is
    the same function class with the kernel as the parameter.

    Args:
        vocab_size: V content tokens (inputs may also hold the query token V).
        d_head: even; ``c`` has ``d_head`` entries (``d_head // 2`` frequencies).
        rope_base: RoPE base.
        n_models: ensemble size M.
        seeds: one seed per model (default ``0 .. M-1``).
        init_std: std of the initial ``c`` (0 gives ``c = 0``, the start the min-norm theorem needs).
        frequencies: optional explicit ``theta [d_head // 2]`` instead of RoPE's (the well-conditioned variant).

    Shapes:
        ``forward(tokens [B, L] or [M, B, L])`` returns ``outputs [M, B, V]`` and the attention
        weights ``[M, B, L]``.

    Raises:
        ValueError / TypeError: bad sizes at construction; bad tokens at ``forward``.
    """

    def __init__(self, vocab_size: int = 16, d_head: int = 16, rope_base: float = 10000.0, n_models: int = 1,
                 seeds=None, init_std: float = 0.0, frequencies=None):
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=2)
        self.d_head = check_int("d_head", d_head, minimum=2)
        self.rope_base = check_rope_base("rope_base", rope_base)
        self.frequencies = kernel_frequencies(self.d_head, self.rope_base, frequencies)  # validates
        init_std = check_positive_float("init_std", init_std, allow_zero=True)
        self.seeds = _seeds(seeds, n_models)
        self.c = nn.Parameter(torch.stack([torch.randn(d_head, generator=generator(s)) * init_std
                                           for s in self.seeds]))
        values = torch.eye(vocab_size + 1, vocab_size)  # one-hot values; the query token's row is zero
        self.register_buffer("values", values, persistent=False)

    def check_positions(self, positions: Tensor) -> None:
        """Nothing to check: a kernel over relative positions covers every length."""

    def kernel(self, relative_positions) -> Tensor:
        """``s(D)`` at the given relative positions ``D``: ``[M, n]`` (float32, differentiable in ``c``).

        Raises:
            TypeError / ValueError: positions that are not integers, or none.
        """
        relative = check_relative_positions("relative_positions", relative_positions)  # long [n]
        return self.c @ _kernel_features(relative, self.frequencies).to(self.c).T

    def scores(self, seq_len: int) -> Tensor:
        """Attention weights of the last position over keys ``j = 0 .. L-1``: ``[M, L]``."""
        seq_len = check_int("seq_len", seq_len, minimum=1)
        return self.kernel(torch.arange(seq_len) - (seq_len - 1))

    attention_row = scores

    def forward(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """``tokens [B, L]`` or ``[M, B, L]`` -> ``(outputs [M, B, V], attention [M, B, L])``."""
        _check_tokens(tokens, self.vocab_size + 1, self.n_models)
        seq_len = tokens.shape[-1]
        attn = self.kernel(torch.arange(seq_len) - (seq_len - 1))  # [M, L]: scores(L), L read off the tokens
        table = self.values.to(attn)[None].expand(self.n_models, -1, -1)
        return readout(attn, tokens, table), attn[:, None, :].expand(self.n_models, tokens.shape[-2], -1)


# ---------------------------------------------------------------- a linear recurrent model (chapter 8)
TRANSITIONS = ("free", "rotation")
"""How :class:`LinearRNN` parameterises its transition ``A``: every entry trained, or trained rotations."""


def check_transition(transition, d_state: int) -> str:
    """Return ``transition`` if it is one of :data:`TRANSITIONS` and fits ``d_state``.

    Raises:
        TypeError: ``transition`` is not a str.
        ValueError: an unknown name, or ``"rotation"`` with an odd ``d_state`` (rotations act on pairs).
    """
    if not isinstance(transition, str):
        raise TypeError(f"transition must be one of {TRANSITIONS} (a str); got {type(transition).__name__} "
                        f"{transition!r}")
    if transition not in TRANSITIONS:
        raise ValueError(f"transition must be one of {TRANSITIONS}; got {transition!r}")
    if transition == "rotation" and d_state % 2:
        raise ValueError(f"d_state must be even with transition='rotation' (2 x 2 rotations); got d_state={d_state}")
    return transition


def rotation_transition(theta: Tensor) -> Tensor:
    """The block-diagonal rotation with angles ``theta``: ``[M, P]`` (rad per step) -> ``A [M, 2P, 2P]``.

    Block ``p`` is ``[[cos theta_p, -sin theta_p], [sin theta_p, cos theta_p]]``, so ``A`` is orthogonal,
    every ``|eigenvalue|`` is 1 (``exp(+-i theta_p)``) and ``A^d`` rotates pair ``p`` by ``d theta_p``:
    the recurrent kernel ``C A^d B`` is a sum of undamped cosines in ``d``, like a rotary linear head's
    kernel over relative positions (chapter 6), with trained frequencies. Differentiable in ``theta``.

    Raises:
        TypeError: ``theta`` is not a floating tensor ``[M, P]``.
    """
    if not isinstance(theta, Tensor) or theta.dim() != 2 or not theta.is_floating_point():
        raise TypeError(f"theta must be a float tensor [M, P]; got {getattr(theta, 'dtype', type(theta).__name__)} "
                        f"{tuple(getattr(theta, 'shape', ()))}")
    c, s = theta.cos(), theta.sin()
    blocks = torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)  # [M, P, 2, 2]
    n_pairs = theta.shape[1]
    eye = torch.eye(n_pairs, dtype=theta.dtype, device=theta.device)
    return torch.einsum("mpij,pq->mpiqj", blocks, eye).reshape(theta.shape[0], 2 * n_pairs, 2 * n_pairs)


@dataclass(frozen=True)
class LinearRNNConfig(Normalized):
    """Hyper-parameters of :class:`LinearRNN` (hashable).

    Attributes:
        vocab_size: content tokens V (the input vocabulary is V + 1 with the query token).
        d_state: state size n.
        init_scale: std of ``A``'s entries times ``sqrt(n)`` at initialisation (its spectral radius is
            about ``init_scale``); small, as in the implicit-bias results on linear recurrent networks.
            Used by the ``"free"`` transition only.
        transition: how ``A`` is parameterised, one of :data:`TRANSITIONS`: ``"free"`` (every entry
            trained: training can make ``A`` stable, and the kernel decays) or ``"rotation"`` (``A`` is
            block-diagonal with trained 2 x 2 rotations, so every ``|eigenvalue|`` is 1 and the kernel
            cannot decay; ``d_state`` must be even). Chapter 8's contrast.
    """

    vocab_size: int = 16
    d_state: int = 32
    init_scale: float = 0.1
    transition: str = "free"

    def __post_init__(self):
        check_int("vocab_size", self.vocab_size, minimum=2)
        check_int("d_state", self.d_state, minimum=1)
        check_positive_float("init_scale", self.init_scale, allow_zero=True)
        check_transition(self.transition, self.d_state)


class LinearRNN(Ensemble):
    """A linear recurrent model read out at the last position: an ensemble for the query-readout tasks.

    ``h_t = A h_{t-1} + B e(x_t)`` from ``h_{-1} = 0`` (``e`` one-hot over the V + 1 input tokens), and
    class logits ``C h_{L-1}``. Unrolled, the readout is a convolution over the distance ``d`` back::

        logits = sum_{d=0}^{L-1} K(d) e(x_{L-1-d}),   K(d) = C A^d B   ([V, V+1] per distance)

    a kernel over distances like an attention head's kernel over offsets (chapters 4 and 6), but one
    that decays geometrically wherever ``A`` is stable, instead of carrying on at every length. No
    position signal enters: order comes only from the recurrence, so :attr:`encoding` is NoPE.

    Args:
        vocab_size, d_state, init_scale, transition: see :class:`LinearRNNConfig`.
        n_models: ensemble size M; ``seeds``: one initialisation seed per model (default ``0 .. M-1``).

    Parameters: ``A [M, n, n]`` (``N(0, init_scale^2 / n)``), ``B [M, n, V+1]`` and ``C [M, V, n]``
    (``N(0, 1/n)``). With ``transition="rotation"`` the parameter ``theta [M, n/2]`` (``U(0, pi)``)
    replaces ``A``, and :attr:`A` is :func:`rotation_transition` of it; ``B`` and ``C`` start as the
    free model of the same seed does.

    Shapes:
        ``forward(tokens [B, L] or [M, B, L])`` -> ``(logits [M, B, V], kernel norms [M, L])``, the norms
        in the row layout (column ``j`` holds ``||K(d = L-1-j)||``; the last is ``d = 0``).

    Raises:
        ValueError / TypeError: sizes out of range; bad tokens; positions given (an RNN has none);
        a state that overflows (``A`` unstable at that length) instead of returning inf or NaN.

    Source: the linear recurrent networks of Cohen-Karlik et al. 2022, 2023 (implicit bias towards
    low-dimensional state and extrapolation), here on chapter 1's task.
    """

    def __init__(self, vocab_size: int = 16, d_state: int = 32, init_scale: float = 0.1, n_models: int = 1,
                 seeds=None, transition: str = "free"):
        super().__init__()
        self.config = cfg = LinearRNNConfig(vocab_size, d_state, init_scale, transition)
        self.seeds = _seeds(seeds, n_models)
        gens = [generator(s) for s in self.seeds]
        n = cfg.d_state
        free_a = _normal(gens, n, n, std=cfg.init_scale / math.sqrt(n))  # drawn in both: the same B and C
        if cfg.transition == "free":
            self.A = free_a
        self.B = _normal(gens, n, vocab_size + 1, std=1 / math.sqrt(n))
        self.C = _normal(gens, vocab_size, n, std=1 / math.sqrt(n))
        if cfg.transition == "rotation":
            self.theta = nn.Parameter(torch.stack([torch.rand(n // 2, generator=g) * math.pi for g in gens]))

    @property
    def A(self) -> Tensor:
        """The transition ``A [M, n, n]``: the parameter itself (``transition="free"``), or the rotation
        :func:`rotation_transition` builds from ``theta`` (``"rotation"``; differentiable, rebuilt per call)."""
        params = self._parameters
        if "A" in params:
            return params["A"]
        if "theta" in params:
            return rotation_transition(params["theta"])
        raise AttributeError("A")  # during construction, before the parameters exist

    @property
    def encoding(self) -> Encoding:
        """NoPE: no position signal; order enters only through the recurrence."""
        return get_encoding("nope")

    def check_positions(self, positions: Tensor) -> None:
        """Nothing to check: a recurrence runs at any length."""

    def kernel(self, seq_len: int) -> Tensor:
        """``K(d) = C A^d B`` for ``d = 0 .. L-1``: ``[M, L, V, V+1]`` (differentiable).

        Raises:
            ValueError: an entry is not finite (``A`` grows without bound over ``L`` steps).
        """
        kernel = self._powers(check_int("seq_len", seq_len, minimum=1))
        if not bool(torch.isfinite(kernel).all()):
            radius = float(torch.linalg.eigvals(self.A.detach().double().cpu()).abs().max())
            raise ValueError(f"the recurrent kernel C A^d B overflows within seq_len={seq_len} steps (largest "
                             f"|eigenvalue| of A: {radius:.3g}): the model cannot be run at this length")
        return kernel

    def _powers(self, seq_len: int) -> Tensor:
        """``C A^d B`` for ``d = 0 .. seq_len-1``: ``[M, L, V, V+1]``, inf or NaN where it overflows."""
        a, power_b, out = self.A, self.B, []  # A once: the rotation transition builds it from theta per access
        for _ in range(seq_len):
            out.append(self.C @ power_b)  # C A^d B
            power_b = a @ power_b
        return torch.stack(out, 1)

    def finite_within(self, seq_len: int) -> Tensor:
        """Whether each model's kernel ``C A^d B`` stays finite for ``d < seq_len``: bool ``[M]`` on the CPU.

        False where ``A`` is unstable enough to overflow within ``seq_len`` steps; such a model cannot be run
        at that length (:meth:`kernel` raises), and a reader of the ensemble counts it as failing there.

        Raises:
            TypeError / ValueError: ``seq_len`` not an int ``>= 1``.
        """
        with torch.no_grad():
            kernel = self._powers(check_int("seq_len", seq_len, minimum=1))
            return torch.isfinite(kernel).flatten(1).all(1).cpu()

    def kernel_norm(self, seq_len: int) -> Tensor:
        """Frobenius norm of ``K(d)``, how much the token at ``D = -d`` counts: float64 ``[M, L]`` in the row
        layout (column ``j`` holds ``D = j - (L-1)``, ``d = L-1-j``; the last column is ``d = 0``)."""
        with torch.no_grad():
            return self.kernel(seq_len).double().flatten(2).norm(dim=-1).flip(1).cpu()

    def spectral_radius(self) -> Tensor:
        """Largest ``|eigenvalue|`` of ``A`` per model: float64 ``[M]`` (< 1: the kernel decays geometrically)."""
        return torch.linalg.eigvals(self.A.detach().double().cpu()).abs().max(-1).values

    def states(self, tokens: Tensor) -> Tensor:
        """The recurrence itself, step by step: ``h_{L-1}`` ``[M, B, n]`` for ``tokens [B, L]`` (a reference for tests)."""
        _check_tokens(tokens, self.config.vocab_size + 1, self.n_models, batched_models=False)
        a = self.A
        h = torch.zeros(self.n_models, tokens.shape[0], self.config.d_state, device=self.device, dtype=a.dtype)
        for t in range(tokens.shape[1]):
            h = torch.einsum("mij,mbj->mbi", a, h) + self.B[:, :, tokens[:, t]].transpose(1, 2)
        return h

    def forward(self, tokens: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``tokens [B, L]`` or ``[M, B, L]`` -> ``(logits [M, B, V], kernel norms [M, L])`` (row layout).

        ``positions`` must be None: the training loop passes the encoding's training positions, which NoPE
        leaves at None.
        """
        if positions is not None:
            raise ValueError("a LinearRNN has no positions to set (order enters through the recurrence); got positions")
        _check_tokens(tokens, self.config.vocab_size + 1, self.n_models)
        seq_len = tokens.shape[-1]
        kernel = self.kernel(seq_len).flip(1)  # [M, L, V, V+1]: index j holds K(d = L-1-j)
        one_hot = F.one_hot(tokens, self.config.vocab_size + 1).to(kernel.dtype)  # [(M,) B, L, V+1]
        pattern = "mblv,mlcv->mbc" if tokens.dim() == 3 else "blv,mlcv->mbc"
        logits = torch.einsum(pattern, one_hot, kernel)
        return logits, kernel.detach().flatten(2).norm(dim=-1)  # row layout, as the kernel above

    def _fresh(self, seeds: list[int]) -> "LinearRNN":
        cfg = self.config
        return LinearRNN(cfg.vocab_size, cfg.d_state, cfg.init_scale, n_models=len(seeds), seeds=seeds,
                         transition=cfg.transition)


# ---------------------------------------------------------------- the multi-layer transformer (chapters 7-9)
def _filled(*shape, value: float) -> nn.Parameter:
    """A parameter of ``shape`` holding ``value`` everywhere (LayerNorm scales: 1; biases: 0)."""
    return nn.Parameter(torch.full(shape, value))


def _layer_norm(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """LayerNorm over the last dim (eps 1e-5), each model with its own scale and shift.

    ``x [M, ..., d]``, ``weight, bias [M, d]`` -> ``[M, ..., d]``.
    """
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)  # [M, 1, ..., 1, d]
    return F.layer_norm(x, x.shape[-1:]) * weight.view(shape) + bias.view(shape)


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``W x + b`` per model, on row vectors: ``x [M, B, L, in]``, ``weight [M, out, in]``, ``bias [M, out]``
    -> ``[M, B, L, out]``."""
    y = torch.einsum("mbli,moi->mblo", x, weight)
    return y if bias is None else y + bias[:, None, None]


@dataclass(frozen=True)
class TransformerConfig(Normalized):
    """Hyper-parameters of :class:`Transformer` (hashable).

    Attributes:
        vocab_size: input and output vocabulary V >= 2.
        n_layers, n_heads, d_model: sizes; ``d_model`` divisible by ``n_heads``.
        pe: the position encoding (an Encoding or a registered name).
        max_len: positions the encoding must cover (rows of an APE table).
        mlp_ratio: MLP width factor.
    """

    vocab_size: int = 16
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 128
    pe: Encoding = field(default_factory=RoPE)
    max_len: int = 256
    mlp_ratio: int = 4

    def __post_init__(self):
        check_int("vocab_size", self.vocab_size, minimum=2)
        check_int("n_layers", self.n_layers, minimum=1)
        check_int("n_heads", self.n_heads, minimum=1)
        check_int("d_model", self.d_model, minimum=1)
        check_int("mlp_ratio", self.mlp_ratio, minimum=1)
        check_int("max_len", self.max_len, minimum=1)
        object.__setattr__(self, "pe", get_encoding(self.pe))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model must be divisible by n_heads; got d_model={self.d_model}, n_heads={self.n_heads}")
        try:
            self.pe.check(self.d_head, self.n_heads)
        except ValueError as err:
            raise ValueError(f"{err} (d_head = d_model / n_heads = {self.d_model} / {self.n_heads})") from None

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


class Block(nn.Module):
    """One pre-LN block of :class:`Transformer` for ``M`` models at once: ``x + Attn(LN1(x))``, then ``+ MLP(LN2(x))``.

    Parameters (``d = d_model``, weights ``[M, out, in]``): ``ln1_w, ln1_b [M, d]``, ``w_qkv [M, 3d, d]`` (the
    query, key and value rows of every head, stacked), ``w_out [M, d, d]``, ``ln2_w, ln2_b [M, d]``,
    ``w_in [M, r d, d]``, ``b_in [M, r d]``, ``w_mlp_out [M, d, r d]``, ``b_mlp_out [M, d]`` (``r = mlp_ratio``).
    Initialised as GPT-2: weights ``N(0, 0.02^2)``, the two that write to the residual stream scaled by
    ``1 / sqrt(2 n_layers)``, LayerNorm scales one and every bias zero.
    """

    def __init__(self, config: TransformerConfig, gens):
        super().__init__()
        self.config = config
        m, d, d_mlp = len(gens), config.d_model, config.mlp_ratio * config.d_model
        std, out_std = 0.02, 0.02 / math.sqrt(2 * config.n_layers)
        self.ln1_w, self.ln1_b = _filled(m, d, value=1.0), _filled(m, d, value=0.0)
        self.w_qkv = _normal(gens, d, 3 * d, std=std, transpose=True)
        self.w_out = _normal(gens, d, d, std=out_std, transpose=True)
        self.ln2_w, self.ln2_b = _filled(m, d, value=1.0), _filled(m, d, value=0.0)
        self.w_in, self.b_in = _normal(gens, d, d_mlp, std=std, transpose=True), _filled(m, d_mlp, value=0.0)
        self.w_mlp_out = _normal(gens, d_mlp, d, std=out_std, transpose=True)
        self.b_mlp_out = _filled(m, d, value=0.0)

    def forward(self, x: Tensor, positions: Tensor, bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """The residual stream ``x [M, B, L, d]`` after this block, and the attention's weights and scores.

        Args:
            x: ``[M, B, L, d_model]``; positions: ``[L]`` (integers); bias: the encoding's score bias
                ``[M or 1, H, L, L]`` or None.

        Returns:
            ``x [M, B, L, d_model]``, weights and scores ``[M, B, H, L, L]`` (see :meth:`attention`).
        """
        out, weights, scores = self.attention(_layer_norm(x, self.ln1_w, self.ln1_b), positions, bias)
        x = x + out
        x = x + self.mlp(_layer_norm(x, self.ln2_w, self.ln2_b))
        return x, weights, scores

    def attention(self, x: Tensor, positions: Tensor, bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Causal multi-head self-attention of the normalised stream ``x [M, B, L, d]``.

        Returns:
            the output ``W_O o`` ``[M, B, L, d]``, the weights ``[M, B, H, L, L]`` (rows sum to one over keys
            ``0 .. m``) and the scores before the softmax ``[M, B, H, L, L]`` (``-inf`` above the diagonal).
        """
        m, b, seq_len, d = x.shape
        h, pe = self.config.n_heads, self.config.pe
        q, k, v = _linear(x, self.w_qkv).split(d, dim=-1)  # [M, B, L, d] each
        q, k, v = (t.view(m, b, seq_len, h, d // h).transpose(2, 3) for t in (q, k, v))  # [M, B, H, L, d_head]
        q, k = pe.rotate(q, positions), pe.rotate(k, positions)  # RoPE turns pair i by t theta_i; most: identity
        scores = attention_scores(q, k)  # q k^T / sqrt(d_head): [M, B, H, L, L]
        if bias is not None:
            scores = scores + bias[:, None]  # ALiBi's beta_h (j - m), T5's bucket bias, ...
        scores = scores.masked_fill(~causal_mask(seq_len, x.device), float("-inf"))  # query m sees keys 0 .. m
        weights = scores.softmax(-1)  # [M, B, H, L, L]
        out = (weights @ v.to(weights.dtype)).to(x.dtype)  # [M, B, H, L, d_head]
        out = out.transpose(2, 3).reshape(m, b, seq_len, d)  # the heads side by side: [M, B, L, d]
        return _linear(out, self.w_out), weights.to(x.dtype), scores

    def mlp(self, x: Tensor) -> Tensor:
        """``W_2 GELU(W_1 x + b_1) + b_2`` of ``x [M, B, L, d]``: ``[M, B, L, d]``."""
        return _linear(F.gelu(_linear(x, self.w_in, self.b_in)), self.w_mlp_out, self.b_mlp_out)


class Transformer(EnsembleModel):
    """A pre-LN decoder-only transformer with a leading ensemble dimension: the model to read.

    nanoGPT's shape, written for a reader: ``x = E[tokens]`` (+ what the encoding adds at each position);
    each of ``n_layers`` :class:`Block` s is ``x += Attn(LN(x)); x += MLP(LN(x))`` with ``n_heads`` causal
    heads (queries and keys turned by the encoding's ``rotate``, its ``score_bias`` added to the logits, a
    plain causal softmax) and a GELU MLP of width ``mlp_ratio * d_model``; logits ``= W_U LN(x)``. No biases
    in the attention projections. Every parameter is ``[M, ...]``: model ``i`` is slice ``i`` of each.

    The book trains :class:`~lengthgen_utils.core.fast.FastTransformer`, the same model (same parameters,
    same initialisation, the same state dict) computed in a batched layout; the tests hold the two equal
    (logits, loss and every gradient) on every registered encoding.

    Args:
        vocab_size, n_layers, n_heads, d_model, pe, max_len, mlp_ratio: see :class:`TransformerConfig`.
        n_models: ensemble size M; ``seeds``: one init seed per model (default ``0 .. M-1``).

    Parameters (weights ``[M, out, in]``): ``embed [M, V, d]``; per block ``w_qkv [M, 3d, d]``,
    ``w_out [M, d, d]``, ``w_in [M, 4d, d]``, ``w_mlp_out [M, d, 4d]`` with LayerNorm and MLP biases
    (:class:`Block`); ``ln_f_w, ln_f_b [M, d]``; ``unembed [M, V, d]``; the encoding's tables in ``pe_params``.

    Shapes:
        ``forward(tokens [B, L])`` -> logits ``[M, B, L, V]``; with ``return_attention=True``
        also a list (one per layer) of attention weights ``[M, B, n_heads, L, L]``.

    Raises:
        TypeError / ValueError: sizes out of range, a head size the encoding cannot use, an unknown encoding
        name (at construction); tokens that are not a LongTensor ``[B, L]`` in ``[0, V)``, positions the
        encoding cannot cover, a score bias that went NaN (at ``forward``).

    Source: Radford et al. 2019 (pre-LN GPT-2 block); nanoGPT's ``model.py`` layout.
    """

    def __init__(self, vocab_size: int = 16, n_layers: int = 2, n_heads: int = 4, d_model: int = 128,
                 pe="rope", max_len: int = 256, n_models: int = 1, seeds=None, mlp_ratio: int = 4):
        super().__init__()
        self.config = cfg = TransformerConfig(vocab_size, n_layers, n_heads, d_model, pe, max_len, mlp_ratio)
        self.seeds = _seeds(seeds, n_models)
        gens = [generator(s) for s in self.seeds]  # model i draws every initial weight from its own generator
        m = len(self.seeds)
        self.embed = _normal(gens, vocab_size, d_model, std=0.02)  # [M, V, d]
        self._init_encoding(cfg.pe, m, d_model, max_len, n_heads, gens)  # e.g. an APE table [M, max_len, d]
        self.blocks = nn.ModuleList([Block(cfg, gens) for _ in range(n_layers)])
        self.ln_f_w, self.ln_f_b = _filled(m, d_model, value=1.0), _filled(m, d_model, value=0.0)
        self.unembed = _normal(gens, d_model, vocab_size, std=0.02, transpose=True)  # [M, V, d]

    @property
    def n_heads(self) -> int:
        return self.config.n_heads

    def forward(self, tokens: Tensor, position_shift: int = 0, return_attention: bool = False,
                positions: Tensor | None = None):
        """Logits ``[M, B, L, V]`` of ``tokens [B, L]`` (and, with ``return_attention``, per-layer weights).

        ``positions [L]`` (integers) replaces the positions ``shift .. shift + L - 1``, as in
        :meth:`RetrievalHead.forward`; the training loop passes the encoding's ``train_positions``.

        Raises:
            TypeError / ValueError: see the class docstring.
        """
        logits, layers = self._layers(tokens, position_shift, positions)
        return (logits, [weights for weights, _ in layers]) if return_attention else logits

    @torch.no_grad()
    def head_scores(self, tokens: Tensor, position_shift: int = 0) -> list[Tensor]:
        """Pre-softmax attention logits of every head, per layer: list of ``[M, B, H, L, L]``.

        Entries above the causal diagonal are ``-inf`` (never attended).

        Raises:
            TypeError / ValueError: see the class docstring.
        """
        return [scores for _, scores in self._layers(tokens, position_shift, None)[1]]

    def _layers(self, tokens: Tensor, position_shift: int, positions: Tensor | None):
        """The whole model: logits ``[M, B, L, V]`` and, per layer, (weights, scores) ``[M, B, H, L, L]``."""
        _check_tokens(tokens, self.config.vocab_size, self.n_models, batched_models=False)
        b, seq_len = tokens.shape
        positions = _model_positions(self, seq_len, position_shift, positions)  # [L] on the CPU
        # each layer keeps its weights and scores [M, B, H, L, L], one more in flight: refused before allocating
        check_attention_fits(seq_len, self.n_models * b * self.n_heads, self.embed.dtype, self.device,
                             copies=2 * self.config.n_layers + 1)
        x = self.embed[:, tokens]  # [M, B, L, d]: every model looks the tokens up in its own table
        added = self.encoding.embed(self.pe_params, positions)  # [M, L, d] (absolute encodings) or None
        if added is not None:
            x = x + added[:, None]
        bias = self._score_bias(positions)  # [M or 1, H, L, L] (ALiBi, T5) or None
        layers = []
        for block in self.blocks:
            x, weights, scores = block(x, positions, bias)
            layers.append((weights, scores))
        logits = _linear(_layer_norm(x, self.ln_f_w, self.ln_f_b), self.unembed)  # [M, B, L, V]
        return logits, layers

    def _score_bias(self, positions: Tensor) -> Tensor | None:
        """The encoding's score bias at ``positions`` (queries and keys alike), ``[M or 1, H, L, L]`` in the
        model's dtype and device, or None; a bias that went NaN or ``+inf`` is refused."""
        bias = self.encoding.score_bias(self.pe_params, positions, positions, self.n_heads)
        if bias is None:
            return None
        bias = bias.to(device=self.device, dtype=self.embed.dtype)
        seq_len = positions.shape[0]
        fits = bias.dim() == 4 and bias.shape[1] in (1, self.n_heads) and bias.shape[-2:] == (seq_len, seq_len)
        if not (fits and bool(torch.isfinite(bias).all())):  # one reduction when all is well; else say what is wrong
            try:  # e.g. a learned bias that went NaN
                _check_bias(bias, (bias.shape[0], self.n_heads), seq_len, seq_len, allowed=causal_mask(seq_len))
            except ValueError as err:
                raise ValueError(f"the score bias of {self.encoding!r}: {err}") from None
        return bias


__all__ = ["RetrievalHead", "RetrievalHeadConfig", "KernelHead", "LinearRNN", "LinearRNNConfig", "Transformer",
           "TransformerConfig", "Block", "readout"]
