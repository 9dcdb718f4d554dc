"""Models with a leading ensemble dimension: every parameter is ``[n_models, ...]``.

Training ``n_models`` independent heads in one batched pass is what makes
five or more seeds per point affordable on a laptop CPU (DESIGN.md,
"Ensembles"). Model ``i`` of an ensemble is initialised from its own
``torch.Generator(seed_i)``, so it equals the same model built alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, asdict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validate import check_int, check_int_sequence, check_positive_float, check_rope_base
from .positional import LearnedAbsolutePE, apply_rope, check_pe, rope_cos_sin, rotate_pairs

ATTENTION_NAMES = ("softmax", "linear")


def check_attention(attention: str) -> str:
    """Return ``attention`` if it is one of :data:`ATTENTION_NAMES`, else raise ``ValueError``."""
    if not isinstance(attention, str) or attention not in ATTENTION_NAMES:
        raise ValueError(f"attention must be one of {ATTENTION_NAMES}; got {attention!r}")
    return attention


@dataclass(frozen=True)
class RetrievalHeadConfig:
    """Hyper-parameters of :class:`RetrievalHead` (hashable, used as a cache key)."""

    vocab_size: int = 16
    d_model: int = 32
    d_head: int = 16
    pe: str = "rope"
    attention: str = "softmax"
    max_len: int = 256
    rope_base: float = 10000.0
    interleaved: bool = False
    ape_init_std: float = 0.02

    def __post_init__(self):
        check_int("vocab_size", self.vocab_size, minimum=2)
        check_int("d_model", self.d_model, minimum=1)
        check_int("d_head", self.d_head, minimum=1)
        check_pe(self.pe)
        check_attention(self.attention)
        check_int("max_len", self.max_len, minimum=2)
        check_positive_float("ape_init_std", self.ape_init_std, allow_zero=True)
        check_rope_base("rope_base", self.rope_base)  # checked for every pe: a config must not hold a bad base
        if not isinstance(self.interleaved, bool):
            raise TypeError(f"interleaved must be a bool; got {type(self.interleaved).__name__} {self.interleaved!r}")
        if self.pe == "rope" and self.d_head % 2:
            raise ValueError(f"d_head must be even for RoPE (channels are rotated in pairs); got d_head={self.d_head}")


class RetrievalHead(nn.Module):
    """The single attention head of the fixed-offset retrieval task (DESIGN.md).

    Queries and keys see no token content: their input is a learned constant
    vector ``u`` (plus the APE row ``p_t`` when ``pe == "ape"``). Only the
    query at the last position ``L-1`` is read out::

        RoPE:  q = R_{L-1} W_Q^T u,          k_j = R_j W_K^T u
        APE:   q = W_Q^T (u + p_{L-1}),       k_j = W_K^T (u + p_j)
        NoPE:  q = W_Q^T u,                   k_j = W_K^T u   (all logits equal)
        s_j = q . k_j / sqrt(d_head),   j = 0 .. L-1 (causal: the query sees itself and all before it)
        a = softmax(s)   or, for the linear control, a = s   (no length-dependent normaliser)
        logits = W_O^T sum_j a_j W_V^T e(x_j)

    Because the attention row does not depend on the tokens, it is computed
    once per (model, length); the value path is a per-token table
    ``E W_V W_O`` weighted by where each token sits.

    Args:
        vocab_size: number of content tokens V (the input vocabulary is V + 1 with ``[Q]``).
        d_model, d_head: widths.
        pe: ``"rope"``, ``"ape"`` or ``"nope"``.
        attention: ``"softmax"`` or ``"linear"``.
        max_len: rows of the APE table = longest usable sequence for APE.
        n_models: ensemble size M.
        seeds: ``n_models`` ints, one initialisation seed per model (default ``0 .. M-1``).
        rope_base, interleaved: RoPE settings (see :func:`~lengthgen_utils.positional.apply_rope`).
        ape_init_std: std of the APE table's initial rows.

    Shapes:
        ``forward(tokens [B, L] or [M, B, L])`` returns ``logits [M, B, V]`` and
        the query's attention weights ``[M, B, L]``.

    Raises:
        ValueError / TypeError: any argument out of range (e.g. odd ``d_head`` with RoPE,
        unknown ``pe``), at construction; a length beyond the APE table at ``forward``.
    """

    def __init__(self, vocab_size: int = 16, d_model: int = 32, d_head: int = 16, pe: str = "rope",
                 attention: str = "softmax", max_len: int = 256, n_models: int = 1, seeds=None,
                 rope_base: float = 10000.0, interleaved: bool = False, ape_init_std: float = 0.02):
        super().__init__()
        rope_base = check_rope_base("rope_base", rope_base)
        ape_init_std = check_positive_float("ape_init_std", ape_init_std, allow_zero=True)
        self.config = RetrievalHeadConfig(vocab_size, d_model, d_head, pe, attention, max_len,
                                          rope_base, bool(interleaved), ape_init_std)
        n_models = check_int("n_models", n_models, minimum=1)
        seeds = tuple(range(n_models)) if seeds is None else check_int_sequence("seeds", seeds, minimum=0)
        if len(seeds) != n_models:
            raise ValueError(f"seeds must have n_models={n_models} entries; got {len(seeds)}")
        self.seeds = seeds
        gens = [torch.Generator().manual_seed(s) for s in seeds]

        def init(*shape, std):
            return nn.Parameter(torch.stack([torch.randn(*shape, generator=g) * std for g in gens]))

        n_tokens = vocab_size + 1
        self.embed = init(n_tokens, d_model, std=1.0)
        self.u = init(d_model, std=1.0)
        self.w_q = init(d_model, d_head, std=d_model ** -0.5)
        self.w_k = init(d_model, d_head, std=d_model ** -0.5)
        self.w_v = init(d_model, d_head, std=d_model ** -0.5)
        self.w_o = init(d_head, vocab_size, std=d_head ** -0.5)
        self.ape = LearnedAbsolutePE(max_len, d_model, n_models, ape_init_std, gens) if pe == "ape" else None

    @property
    def n_models(self) -> int:
        return self.u.shape[0]

    @property
    def device(self) -> torch.device:
        return self.u.device

    def query_key(self, seq_len: int, position_shift: int = 0) -> tuple[Tensor, Tensor]:
        """The query at the last position and the keys at every position.

        Args:
            seq_len: L >= 1.
            position_shift: added to every position (0 .. L-1 becomes shift .. shift+L-1).

        Returns:
            ``q [M, d_head]`` and ``k [M, L, d_head]`` with RoPE already applied.
        """
        seq_len = check_int("seq_len", seq_len, minimum=1)
        position_shift = check_int("position_shift", position_shift)
        cfg = self.config
        if cfg.pe == "ape":
            self.ape.check_length(torch.arange(seq_len) + position_shift)  # on the host: no device sync
            x = self.u[:, None, :] + self.ape.weight[:, position_shift:position_shift + seq_len]  # [M, L, d_model]
        else:
            x = self.u[:, None, :].expand(-1, seq_len, -1)
        q = torch.einsum("md,mdh->mh", x[:, -1], self.w_q)
        k = torch.einsum("mld,mdh->mlh", x, self.w_k)
        if cfg.pe == "rope":
            # the same cos/sin apply_rope computes (float64 angles), memoised per length and shift
            cos, sin = rope_cos_sin(seq_len, cfg.d_head, cfg.rope_base, position_shift, q.dtype, q.device)
            q = rotate_pairs(q, cos[-1], sin[-1], cfg.interleaved)
            k = rotate_pairs(k, cos, sin, cfg.interleaved)
        return q, k

    def scores(self, seq_len: int, position_shift: int = 0) -> Tensor:
        """Attention logits ``s_j`` of the query over keys ``j = 0 .. L-1``: ``[M, L]``."""
        q, k = self.query_key(seq_len, position_shift)
        return torch.einsum("mh,mlh->ml", q, k) / math.sqrt(self.config.d_head)

    def attention_row(self, seq_len: int, position_shift: int = 0) -> Tensor:
        """The query's attention weights over the L keys: ``[M, L]`` (softmax or linear)."""
        s = self.scores(seq_len, position_shift)
        return s.softmax(-1) if self.config.attention == "softmax" else s

    def value_table(self) -> Tensor:
        """Class logits contributed by each input token at unit attention: ``E W_V W_O``, ``[M, V+1, V]``."""
        return self.embed @ self.w_v @ self.w_o

    def forward(self, tokens: Tensor, position_shift: int = 0, validate: bool = True) -> tuple[Tensor, Tensor]:
        """Logits ``[M, B, V]`` and the query's attention ``[M, B, L]`` for ``tokens [B, L]`` or ``[M, B, L]``.

        ``validate=False`` skips the token-range check (which reads the tokens
        back to the host, a synchronisation on a GPU); the training loop uses
        it for tokens its task sampled. Shapes are always checked.
        """
        if not isinstance(tokens, Tensor) or tokens.dtype != torch.long:
            raise TypeError(f"tokens must be a LongTensor [B, L] or [M, B, L]; got {getattr(tokens, 'dtype', type(tokens).__name__)}")
        if tokens.dim() not in (2, 3) or (tokens.dim() == 3 and tokens.shape[0] != self.n_models):
            raise ValueError(f"tokens must have shape [B, L] or [M={self.n_models}, B, L]; got {tuple(tokens.shape)}")
        n_tokens = self.config.vocab_size + 1
        if validate and tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= n_tokens):
            raise ValueError(f"tokens must lie in [0, {n_tokens - 1}]; got values in [{int(tokens.min())}, {int(tokens.max())}]")
        m, (b, seq_len) = self.n_models, tokens.shape[-2:]
        attn = self.attention_row(seq_len, position_shift)  # [M, L]
        index = tokens.expand(m, b, seq_len)
        weights = torch.zeros(m, b, n_tokens, device=self.device, dtype=attn.dtype)
        weights.scatter_add_(2, index, attn[:, None, :].expand(m, b, seq_len))  # attention mass per token id
        logits = torch.bmm(weights, self.value_table())
        return logits, attn[:, None, :].expand(m, b, seq_len)

    def select(self, index: int) -> "RetrievalHead":
        """A one-model copy of ensemble member ``index`` (for checks and plots)."""
        index = check_int("index", index, minimum=0, maximum=self.n_models - 1)
        return self.subset([index])

    def subset(self, indices) -> "RetrievalHead":
        """A copy holding ensemble members ``indices`` (in that order), e.g. the seeds of one offset of a sweep.

        Raises:
            ValueError / TypeError: an index outside ``0 .. n_models-1``, or an empty list.
        """
        indices = check_int_sequence("indices", indices, minimum=0)
        for i in indices:
            check_int("indices", i, minimum=0, maximum=self.n_models - 1)
        cfg = asdict(self.config)
        copy = RetrievalHead(n_models=len(indices), seeds=[self.seeds[i] for i in indices], **cfg).to(self.device)
        index = torch.tensor(indices, device=self.device)
        with torch.no_grad():
            for (name, p_copy), (_, p) in zip(copy.named_parameters(), self.named_parameters()):
                p_copy.copy_(p[index])
        return copy


class KernelHead(nn.Module):
    """A directly parameterised RoPE offset kernel with linear attention and one-hot values (chapter 6).

    The exactly solvable version of the linear-attention control: the head's
    attention weight on the key at offset ``D = j - (L-1)`` is the kernel
    ``s(D) = Phi(D) . c`` itself (no softmax, no normaliser, no scale), with
    ``Phi(D) = [cos(theta_i D)]_i ++ [sin(theta_i D)]_i`` (RoPE frequencies
    ``theta_i``, see :func:`~lengthgen_utils.theory.rope_kernel_features`) and
    ``c`` in ``R^{d_head}`` the only parameter. Values are one-hot over the V
    content tokens (the query token's value is zero)::

        output_v = sum_{j=0}^{L-1} s(j - (L-1)) [x_j == v],   v = 0 .. V-1

    A factorised RoPE head with ``q = W_Q u``, ``k = W_K u`` realises every
    ``c`` (:func:`~lengthgen_utils.theory.rope_kernel_coefficients`), so this is
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
        from .theory import kernel_frequencies

        self.frequencies = kernel_frequencies(self.d_head, self.rope_base, frequencies)  # validates
        init_std = check_positive_float("init_std", init_std, allow_zero=True)
        n_models = check_int("n_models", n_models, minimum=1)
        seeds = tuple(range(n_models)) if seeds is None else check_int_sequence("seeds", seeds, minimum=0)
        if len(seeds) != n_models:
            raise ValueError(f"seeds must have n_models={n_models} entries; got {len(seeds)}")
        self.seeds = seeds
        c = torch.stack([torch.randn(d_head, generator=torch.Generator().manual_seed(s)) * init_std for s in seeds])
        self.c = nn.Parameter(c)

    @property
    def n_models(self) -> int:
        return self.c.shape[0]

    @property
    def device(self) -> torch.device:
        return self.c.device

    def kernel(self, offsets) -> Tensor:
        """``s(D)`` at the given integer offsets: ``[M, n]`` (float32, differentiable in ``c``)."""
        from .theory import rope_kernel_features

        phi = rope_kernel_features(offsets, self.d_head, self.rope_base, self.frequencies).to(self.c)
        return self.c @ phi.T

    def scores(self, seq_len: int) -> Tensor:
        """Attention weights of the last position over keys ``j = 0 .. L-1``: ``[M, L]``."""
        seq_len = check_int("seq_len", seq_len, minimum=1)
        return self.kernel(torch.arange(seq_len) - (seq_len - 1))

    attention_row = scores

    def forward(self, tokens: Tensor, validate: bool = True) -> tuple[Tensor, Tensor]:
        """``tokens [B, L]`` or ``[M, B, L]`` -> ``(outputs [M, B, V], attention [M, B, L])``.

        ``validate=False`` skips the token-range check (for tokens sampled from the task), as in
        :meth:`RetrievalHead.forward`.
        """
        if not isinstance(tokens, Tensor) or tokens.dtype != torch.long:
            raise TypeError(f"tokens must be a LongTensor [B, L] or [M, B, L]; got {getattr(tokens, 'dtype', type(tokens).__name__)}")
        if tokens.dim() not in (2, 3) or (tokens.dim() == 3 and tokens.shape[0] != self.n_models):
            raise ValueError(f"tokens must have shape [B, L] or [M={self.n_models}, B, L]; got {tuple(tokens.shape)}")
        n_tokens = self.vocab_size + 1
        if validate and tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= n_tokens):
            raise ValueError(f"tokens must lie in [0, {n_tokens - 1}]; got values in [{int(tokens.min())}, {int(tokens.max())}]")
        m, (b, seq_len) = self.n_models, tokens.shape[-2:]
        attn = self.scores(seq_len)  # [M, L]
        out = torch.zeros(m, b, n_tokens, device=self.device, dtype=attn.dtype)
        out.scatter_add_(2, tokens.expand(m, b, seq_len), attn[:, None, :].expand(m, b, seq_len))
        return out[..., : self.vocab_size], attn[:, None, :].expand(m, b, seq_len)


# --- the multi-layer transformer (chapter 7)
def _layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """LayerNorm over the last dim with per-model parameters: ``x [M, ..., d]``, ``weight/bias [M, d]``."""
    shape = (weight.shape[0],) + (1,) * (x.dim() - 2) + (weight.shape[-1],)
    return F.layer_norm(x, x.shape[-1:], eps=eps) * weight.view(shape) + bias.view(shape)


def _check_qkv(q, k, v) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``q, k, v`` are floating tensors ``[..., L, d]`` that fit together."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point torch.Tensor [..., L, d]; "
                            f"got {getattr(t, 'dtype', type(t).__name__)}")
        if t.dim() < 2 or t.shape[-2] < 1 or t.shape[-1] < 1:
            raise ValueError(f"{name} must have shape [..., L, d] with L >= 1 and d >= 1; got {tuple(t.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share d_head; got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k and v must share [..., L]; got k {tuple(k.shape)} and v {tuple(v.shape)}")


def additive_mask(mask: Tensor, q_len: int, k_len: int, dtype: torch.dtype) -> Tensor:
    """The additive (0 / -inf) form of an attention mask, after checking it.

    Two forms are accepted, and nothing else:

    * **boolean**: ``True`` = the query may attend to the key, ``False`` = it may not;
    * **additive float**: every entry is exactly ``0`` (attend) or ``-inf`` (do not attend).

    A float mask of 0/1 (a common mistake: it reads like a boolean mask but, added to
    the logits, it masks nothing) or any other bias is rejected.

    Args:
        mask: ``[L_q, L_k]`` or broadcastable to ``[..., L_q, L_k]``.
        q_len, k_len: ``L_q``, ``L_k``.
        dtype: floating dtype of the returned bias.

    Returns:
        ``[..., L_q, L_k]`` tensor of ``dtype`` holding 0 and -inf.

    Raises:
        TypeError: ``mask`` is not a bool or floating tensor.
        ValueError: wrong trailing shape, a float entry other than 0 / -inf, or a query row
            that may attend to no key (its softmax would be NaN).
    """
    if not isinstance(mask, Tensor) or not (mask.dtype == torch.bool or mask.dtype.is_floating_point):
        raise TypeError("mask must be a bool tensor (True = attend) or a float tensor of 0 / -inf (added to "
                        f"the logits); got {getattr(mask, 'dtype', type(mask).__name__)}")
    if mask.dim() < 2 or mask.shape[-2:] != (q_len, k_len):
        raise ValueError(f"mask must have shape [..., L_q={q_len}, L_k={k_len}]; got {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        allowed = mask
    else:
        ok = (mask == 0) | (mask == float("-inf"))
        if not bool(ok.all()):
            bad = mask[~ok].flatten()[:3].tolist()
            raise ValueError("a float mask must hold only 0 (attend) and -inf (do not attend), the additive form; "
                             f"got values such as {bad}. For a 0/1 mask pass mask.bool() (True = attend).")
        allowed = mask == 0
    if not bool(allowed.any(-1).all()):
        raise ValueError("mask leaves a query with no key to attend to (its softmax would be NaN)")
    return torch.zeros(allowed.shape, dtype=dtype, device=mask.device).masked_fill(~allowed, float("-inf"))


def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, return_weights: bool = False):
    """Softmax attention ``softmax(q k^T / sqrt(d_head) + bias) v`` under an explicit mask.

    Args:
        q: ``[..., L_q, d_head]``; k: ``[..., L_k, d_head]``; v: ``[..., L_k, d_v]``.
        mask: boolean (``True`` = attend) or additive float (0 / -inf), ``[L_q, L_k]`` or
            broadcastable to ``[..., L_q, L_k]``; see :func:`additive_mask`. The two forms of
            the same mask give identical results.
        return_weights: also return the weights ``[..., L_q, L_k]``.

    Returns:
        output ``[..., L_q, d_v]`` (and the weights, if asked).

    Raises:
        TypeError / ValueError: see :func:`additive_mask`; tensors of the wrong type or shape.

    Source: Vaswani et al. 2017, eq. (1).
    """
    _check_qkv(q, k, v)
    bias = additive_mask(mask, q.shape[-2], k.shape[-2], q.dtype)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias.to(q.device)
    weights = scores.softmax(-1)
    out = weights @ v
    return (out, weights) if return_weights else out


def causal_mask(seq_len: int, device=None) -> Tensor:
    """Boolean causal mask ``[L, L]``: entry ``(i, j)`` is True iff ``j <= i`` (query i sees keys 0..i)."""
    seq_len = check_int("seq_len", seq_len, minimum=1)
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


def causal_attention(q: Tensor, k: Tensor, v: Tensor, return_weights: bool = False):
    """Causal softmax attention, query ``i`` sees keys ``0 .. i``.

    Args:
        q, k, v: ``[..., L, d_head]``.
        return_weights: also return the attention weights ``[..., L, L]``: the explicit path,
            :func:`masked_attention` with :func:`causal_mask`; otherwise torch's fused
            ``scaled_dot_product_attention`` (the same function up to float rounding).

    Returns:
        output ``[..., L, d_head]`` (and weights, if asked).

    Source: Vaswani et al. 2017, eq. (1), with a causal mask.
    """
    _check_qkv(q, k, v)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal attention needs as many queries as keys; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if not return_weights:
        flat = lambda t: t.reshape(-1, *t.shape[-2:])  # noqa: E731  SDPA wants [N, L, d]
        out = F.scaled_dot_product_attention(flat(q), flat(k), flat(v), is_causal=True)
        return out.view(q.shape[:-1] + v.shape[-1:])
    return masked_attention(q, k, v, causal_mask(q.shape[-2], q.device), return_weights=True)


LINEAR_FEATURE_MAPS = ("elu+1", "identity")


def linear_attention(q: Tensor, k: Tensor, v: Tensor, normalize: bool = True, feature_map="elu+1") -> Tensor:
    """Causal linear attention in O(L) time through cumulative sums.

    With features ``phi``, output ``t`` is

        unnormalised:  o_t = sum_{j<=t} (phi(q_t) . phi(k_j)) v_j
        normalised:    o_t = sum_{j<=t} w_tj v_j,   w_tj = phi(q_t) . phi(k_j) / sum_{i<=t} phi(q_t) . phi(k_i)

    computed as ``phi(q_t)^T S_t`` with ``S_t = sum_{j<=t} phi(k_j) v_j^T`` (a running sum).
    The normalised form is evaluated as ``v_0 + sum_j w_tj (v_j - v_0)`` (the same value,
    since the weights sum to 1 and every query sees key 0), so constant values come
    back *exactly*. The default feature map ``elu(x) + 1`` is positive, so the
    normaliser never vanishes (Katharopoulos et al. 2020). The unnormalised form with the
    identity map is the raw-logit control of chapter 6.

    Args:
        q, k: ``[..., L, d_head]``; v: ``[..., L, d_v]``.
        normalize: divide by the running normaliser (True) or not.
        feature_map: ``"elu+1"``, ``"identity"`` or a callable ``[..., L, d] -> [..., L, d']``.

    Returns:
        ``[..., L, d_v]``; output ``t`` depends on positions ``0 .. t`` only.

    Raises:
        TypeError / ValueError: bad tensors or feature map; ``normalize=True`` with a
            normaliser that is not positive at some position (the output would be inf/NaN).

    Source: Katharopoulos et al. 2020, *Transformers are RNNs*, eq. (4)-(9).
    """
    _check_qkv(q, k, v)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal attention needs as many queries as keys; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool; got {type(normalize).__name__} {normalize!r}")
    if feature_map == "elu+1":
        phi = lambda x: F.elu(x) + 1  # noqa: E731
    elif feature_map == "identity":
        phi = lambda x: x  # noqa: E731
    elif callable(feature_map):
        phi = feature_map
    else:
        raise ValueError(f"feature_map must be one of {LINEAR_FEATURE_MAPS} or a callable; got {feature_map!r}")
    fq, fk = phi(q), phi(k)
    v_first = v[..., :1, :]
    if normalize:
        v = v - v_first
    state = torch.cumsum(fk[..., :, None] * v[..., None, :], dim=-3)  # S_t: [..., L, d', d_v]
    out = torch.einsum("...lf,...lfe->...le", fq, state)
    if not normalize:
        return out
    denom = (fq * torch.cumsum(fk, dim=-2)).sum(-1, keepdim=True)  # [..., L, 1]
    if not bool((denom > 0).all()):
        raise ValueError("the linear-attention normaliser is not positive at some position; use a positive "
                         "feature map (e.g. 'elu+1') with normalize=True")
    return v_first + out / denom


class Transformer(nn.Module):
    """A pre-LN decoder-only transformer with a leading ensemble dimension.

    ``x = E[tokens] (+ P[positions] for APE)``; each of ``n_layers`` blocks is
    ``x += Attn(LN(x)); x += MLP(LN(x))`` with ``n_heads`` causal heads
    (RoPE applied to queries and keys when ``pe == "rope"``) and a GELU MLP of
    width ``mlp_ratio * d_model``; logits ``= LN(x) W_U``. No biases in the
    attention projections.

    Args:
        vocab_size: input and output vocabulary V >= 2.
        n_layers, n_heads, d_model: sizes; ``d_model`` divisible by ``n_heads``.
        pe: ``"rope"``, ``"ape"`` or ``"nope"``.
        max_len: rows of the APE table (longest usable length for APE).
        n_models: ensemble size M; ``seeds``: one init seed per model.
        rope_base: RoPE base. mlp_ratio: MLP width factor.

    Shapes:
        ``forward(tokens [B, L])`` -> logits ``[M, B, L, V]``; with ``return_attention=True``
        also a list (one per layer) of attention weights ``[M, B, n_heads, L, L]``.

    Raises:
        ValueError: sizes out of range, ``d_head`` odd with RoPE, lengths beyond the APE table.

    Source: Radford et al. 2019 (pre-LN GPT-2 block); nanoGPT's ``model.py`` layout.
    """

    def __init__(self, vocab_size: int = 16, n_layers: int = 2, n_heads: int = 4, d_model: int = 128,
                 pe: str = "rope", max_len: int = 256, n_models: int = 1, seeds=None,
                 rope_base: float = 10000.0, mlp_ratio: int = 4):
        super().__init__()
        check_int("vocab_size", vocab_size, minimum=2)
        check_int("n_layers", n_layers, minimum=1)
        check_int("n_heads", n_heads, minimum=1)
        check_int("d_model", d_model, minimum=1)
        check_int("mlp_ratio", mlp_ratio, minimum=1)
        check_pe(pe)
        check_int("max_len", max_len, minimum=1)
        if d_model % n_heads:
            raise ValueError(f"d_model must be divisible by n_heads; got d_model={d_model}, n_heads={n_heads}")
        d_head = d_model // n_heads
        rope_base = check_rope_base("rope_base", rope_base)
        if pe == "rope" and d_head % 2:
            raise ValueError(f"d_head = d_model / n_heads must be even for RoPE (channels are rotated in pairs); "
                             f"got d_head={d_head} (d_model={d_model}, n_heads={n_heads})")
        n_models = check_int("n_models", n_models, minimum=1)
        seeds = tuple(range(n_models)) if seeds is None else check_int_sequence("seeds", seeds, minimum=0)
        if len(seeds) != n_models:
            raise ValueError(f"seeds must have n_models={n_models} entries; got {len(seeds)}")
        self.vocab_size, self.n_layers, self.n_heads, self.d_model = vocab_size, n_layers, n_heads, d_model
        self.d_head, self.pe, self.max_len, self.rope_base, self.seeds = d_head, pe, max_len, float(rope_base), seeds
        gens = [torch.Generator().manual_seed(s) for s in seeds]

        def init(*shape, std):
            return nn.Parameter(torch.stack([torch.randn(*shape, generator=g) * std for g in gens]))

        def ones(*shape, value=1.0):
            return nn.Parameter(torch.full((n_models, *shape), value))

        std, d_mlp = 0.02, mlp_ratio * d_model
        self.embed = init(vocab_size, d_model, std=std)
        self.ape = LearnedAbsolutePE(max_len, d_model, n_models, std, gens) if pe == "ape" else None
        self.blocks = nn.ModuleList()
        for _ in range(n_layers):
            block = nn.Module()
            block.ln1_w, block.ln1_b = ones(d_model), ones(d_model, value=0.0)
            block.w_qkv = init(d_model, 3 * d_model, std=std)
            block.w_out = init(d_model, d_model, std=std / math.sqrt(2 * n_layers))
            block.ln2_w, block.ln2_b = ones(d_model), ones(d_model, value=0.0)
            block.w_in, block.b_in = init(d_model, d_mlp, std=std), ones(d_mlp, value=0.0)
            block.w_mlp_out = init(d_mlp, d_model, std=std / math.sqrt(2 * n_layers))
            block.b_mlp_out = ones(d_model, value=0.0)
            self.blocks.append(block)
        self.ln_f_w, self.ln_f_b = ones(d_model), ones(d_model, value=0.0)
        self.unembed = init(d_model, vocab_size, std=std)

    @property
    def n_models(self) -> int:
        return self.embed.shape[0]

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def qkv(self, block, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values ``[M, B, H, L, d_head]`` of one block (RoPE applied for ``pe="rope"``)."""
        m, b, seq_len, _ = x.shape
        h = _layer_norm(x, block.ln1_w, block.ln1_b)
        qkv = torch.einsum("mbld,mde->mble", h, block.w_qkv)
        q, k, v = qkv.view(m, b, seq_len, 3, self.n_heads, self.d_head).permute(3, 0, 1, 4, 2, 5)
        if self.pe == "rope":
            q, k = apply_rope(q, positions, self.rope_base), apply_rope(k, positions, self.rope_base)
        return q, k, v

    def _run(self, tokens: Tensor, position_shift: int, collect: str | None):
        """Run every block; ``collect`` in {None, "weights", "scores"} picks what to return per layer."""
        if not isinstance(tokens, Tensor) or tokens.dtype != torch.long or tokens.dim() != 2:
            raise TypeError(f"tokens must be a LongTensor [B, L]; got {getattr(tokens, 'dtype', type(tokens).__name__)} "
                            f"{tuple(getattr(tokens, 'shape', ()))}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(f"tokens must lie in [0, {self.vocab_size - 1}]; got [{int(tokens.min())}, {int(tokens.max())}]")
        position_shift = check_int("position_shift", position_shift)
        b, seq_len = tokens.shape
        positions = torch.arange(seq_len, device=self.device) + position_shift
        idx = torch.arange(self.n_models, device=self.device)[:, None, None]
        x = self.embed[idx, tokens[None]]  # [M, B, L, d]
        if self.ape is not None:
            x = x + self.ape(positions)[:, None]
        collected = []
        for block in self.blocks:
            q, k, v = self.qkv(block, x, positions)
            if collect is None:
                out = causal_attention(q, k, v)
            else:
                out, weights = causal_attention(q, k, v, return_weights=True)
                if collect == "scores":
                    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=self.device).tril()
                    weights = (q @ k.transpose(-1, -2) / math.sqrt(self.d_head)).masked_fill(~causal, float("-inf"))
                collected.append(weights)
            out = out.permute(0, 1, 3, 2, 4).reshape(self.n_models, b, seq_len, self.d_model)
            x = x + torch.einsum("mbld,mde->mble", out, block.w_out)
            h = _layer_norm(x, block.ln2_w, block.ln2_b)
            h = F.gelu(torch.einsum("mbld,mde->mble", h, block.w_in) + block.b_in[:, None, None])
            x = x + torch.einsum("mble,med->mbld", h, block.w_mlp_out) + block.b_mlp_out[:, None, None]
        logits = torch.einsum("mbld,mdv->mblv", _layer_norm(x, self.ln_f_w, self.ln_f_b), self.unembed)
        return logits, collected

    def forward(self, tokens: Tensor, position_shift: int = 0, return_attention: bool = False):
        logits, weights = self._run(tokens, position_shift, "weights" if return_attention else None)
        return (logits, weights) if return_attention else logits

    @torch.no_grad()
    def head_scores(self, tokens: Tensor, position_shift: int = 0) -> list[Tensor]:
        """Pre-softmax attention logits of every head, per layer: list of ``[M, B, H, L, L]``.

        Entries above the causal diagonal are ``-inf`` (never attended).
        """
        return self._run(tokens, position_shift, "scores")[1]
