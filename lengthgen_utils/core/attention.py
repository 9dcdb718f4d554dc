"""Attention primitives: masks, scores and the ways of turning scores into weights (one place for numerics).

Every model of the book forms its attention here:

* :func:`attention_scores`: ``q k^T / sqrt(d_head)``, the scale applied *before* the product and
  low-precision inputs computed in float32, so float16 never overflows on its way to a logit;
* :func:`row_weights`: the single head's choice of normaliser (``softmax``; ``linear``, the raw
  scores of chapter 6's control; and chapter 6's ablations of softmax's parts), from the registry
  :data:`ROW_WEIGHTS`;
* :func:`elu_linear_weights`: linear attention's weights with the positive feature map ``elu(x) + 1``,
  the normaliser ``linear_elu`` of :data:`ROW_WEIGHTS` (it needs the queries and keys, not the logits);
* :func:`masked_attention` / :func:`causal_attention`: softmax attention under a mask, with an
  optional additive score bias (ALiBi and other relative biases act there);
* :func:`linear_attention`: causal linear attention in O(L).

Low precision (float16, bfloat16): scores, softmax and normalisers are computed in float32 and the
result is cast back to the input dtype, so a half-precision call matches the float32 one to the
dtype's rounding. Source: Vaswani et al. 2017, eq. (1); Katharopoulos et al. 2020 (linear attention).
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validate import check_device, check_int

LOW_PRECISION = (torch.float16, torch.bfloat16)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype scores are formed in: float32 for half-precision inputs, else the input's."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def check_qkv(q, k, v=None) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``q, k`` (and ``v``) are floating tensors ``[..., L, d]`` that fit.

    Queries and keys must share their dtype and ``d_head``; keys and values their leading shape.
    """
    named = (("q", q), ("k", k)) + ((("v", v),) if v is not None else ())
    for name, t in named:
        if not isinstance(t, Tensor) or not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point torch.Tensor [..., L, d]; "
                            f"got {getattr(t, 'dtype', type(t).__name__)}")
        if t.dim() < 2 or t.shape[-2] < 1 or t.shape[-1] < 1:
            raise ValueError(f"{name} must have shape [..., L, d] with L >= 1 and d >= 1; got {tuple(t.shape)}")
    if q.dtype != k.dtype or (v is not None and v.dtype != q.dtype):
        raise TypeError(f"q, k and v must share one dtype; got q {q.dtype}, k {k.dtype}"
                        + (f", v {v.dtype}" if v is not None else ""))
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share d_head; got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if v is not None and k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k and v must share [..., L]; got k {tuple(k.shape)} and v {tuple(v.shape)}")


def attention_scores(q: Tensor, k: Tensor) -> Tensor:
    """Scaled dot-product logits ``s = q k^T / sqrt(d_head)``.

    Inner numerics: the models, :func:`masked_attention` and the probes call it on queries and keys they
    formed or checked (:func:`check_qkv`), once per head and layer, so it checks nothing itself.

    Args:
        q: floating ``[..., L_q, d_head]``; k: ``[..., L_k, d_head]`` of the same dtype and ``d_head``.

    Returns:
        ``[..., L_q, L_k]`` in float32 for float16/bfloat16 inputs, else in the inputs' dtype.
        The scale multiplies ``q`` before the product, and half-precision inputs are multiplied
        in float32, so no intermediate exceeds the final logit.

    Source: Vaswani et al. 2017, eq. (1).
    """
    dtype = _compute_dtype(q.dtype)
    return (q.to(dtype) * (1.0 / math.sqrt(q.shape[-1]))) @ k.to(dtype).transpose(-1, -2)


# ---------------------------------------------------------------- the single head's normaliser
def _softmax(scores: Tensor) -> Tensor:
    return scores.to(_compute_dtype(scores.dtype)).softmax(-1).to(scores.dtype)


def _linear(scores: Tensor) -> Tensor:
    return scores


def _linear_mean(scores: Tensor) -> Tensor:
    return scores / scores.shape[-1]


SUM_TOLERANCE = 1e-6
""":func:`row_weights` refuses ``linear_sum`` when ``|sum_i s_i|`` is below this fraction of ``sum_i |s_i|``."""


def _linear_sum(scores: Tensor) -> Tensor:
    s = scores.to(_compute_dtype(scores.dtype))
    total = s.sum(-1, keepdim=True)
    if not bool((total.abs() > SUM_TOLERANCE * s.abs().sum(-1, keepdim=True)).all()):
        raise ValueError("attention 'linear_sum' divides by the sum of the logits, which vanishes for some row "
                         f"(|sum s| <= {SUM_TOLERANCE:g} * sum |s|): its weights would be inf or NaN. Use 'linear_mean' "
                         "(divide by the length) or a positive score map ('exp', 'softmax')")
    return (s / total).to(scores.dtype)


EXP_MAX_LOGIT = 80.0
""":func:`row_weights` refuses ``exp`` above this logit: ``exp(88.7)`` already overflows float32."""


def _exp(scores: Tensor) -> Tensor:
    s = scores.to(_compute_dtype(scores.dtype))
    if not bool((s <= EXP_MAX_LOGIT).all()):
        raise ValueError(f"attention 'exp' (un-normalised exp(s_j)) got a logit {float(s.max()):.1f} > "
                         f"{EXP_MAX_LOGIT:g}: its weight would overflow to inf in float32")
    return s.exp().to(scores.dtype)


ROW_WEIGHTS = {
    "softmax": _softmax,  # a_j = exp(s_j) / sum_i exp(s_i)
    "linear": _linear,  # a_j = s_j: no exponential, no normaliser (chapter 6's control)
    "linear_mean": _linear_mean,  # a_j = s_j / L: linear, divided by the number of keys (a length normaliser)
    "linear_sum": _linear_sum,  # a_j = s_j / sum_i s_i: linear, divided by its own sum (refused where it vanishes)
    "exp": _exp,  # a_j = exp(s_j): softmax's exponential without its normaliser (refused where it overflows)
}
"""How the single retrieval head turns its logits ``[..., L]`` over the keys a query sees into attention weights.

Chapter 6's ablation separates softmax's two parts, the exponential and the division by a sum that
grows with the length. Normalisers that can vanish or overflow raise ``ValueError`` instead of
returning inf or NaN."""


def check_attention(attention: str) -> str:
    """Return ``attention`` if it names a normaliser of :data:`ROW_WEIGHTS`, else raise ``ValueError``."""
    if not isinstance(attention, str) or attention not in ROW_WEIGHTS:
        raise ValueError(f"attention must be one of {tuple(ROW_WEIGHTS)}; got {attention!r}")
    return attention


def row_weights(scores: Tensor, attention: str = "softmax") -> Tensor:
    """Attention weights ``[..., L]`` of logits ``[..., L]`` over the keys a query sees (see :data:`ROW_WEIGHTS`).

    Raises:
        ValueError: an unknown normaliser; ``"linear_sum"`` where the sum of a row's logits vanishes;
            ``"exp"`` where a logit would overflow (:data:`EXP_MAX_LOGIT`).
    """
    return ROW_WEIGHTS[check_attention(attention)](scores)


# ---------------------------------------------------------------- the single head's positive-feature linear attention
ELU_LINEAR = "linear_elu"
"""The normaliser of :data:`ROW_WEIGHTS` that needs the queries and keys, not the logits: :func:`elu_linear_weights`."""


def elu_linear_weights(q: Tensor, k: Tensor, rotate_q=None, rotate_k=None) -> Tensor:
    """Linear attention's weights with the positive feature map ``phi(x) = elu(x) + 1``.

    Query ``m`` weighs key ``j`` by::

        a_mj = R_m phi(q_m) . R_j phi(k_j) / sum_j' phi(q_m) . phi(k_j')

    Without rotations (``R = I``) this is Katharopoulos et al.'s linear attention: every weight is
    positive and each row sums to 1. With RoPE the rotation acts on the features of the numerator
    only and the normaliser stays unrotated, so it stays positive (RoFormer's linear attention):
    the numerator then depends on the relative position ``D = j - m`` alone, and a weight can be
    negative and a row need not sum to 1. (Rotating ``q`` and ``k`` before ``phi`` would keep the
    weights a distribution but make them depend on absolute positions.)

    Args:
        q: ``[..., L_q, d]`` queries before any rotation; k: ``[..., L_k, d]`` keys before any
            rotation (same dtype and ``d``).
        rotate_q, rotate_k: ``None`` (no rotation) or callables ``[..., L, d] -> [..., L, d]`` that
            rotate the features of the queries and of the keys by their positions, e.g.
            ``lambda f: encoding.rotate(f, positions)``.

    Returns:
        ``[..., L_q, L_k]``: the weights over every key given (a causal caller passes each query
        the keys it sees), in the inputs' dtype; half-precision inputs are computed in float32.

    Raises:
        TypeError / ValueError: see :func:`check_qkv`; ``ValueError`` if the normaliser underflows to 0
            (far-negative queries and keys: their features ``exp(x)`` multiply to below the dtype's range).

    Source: Katharopoulos et al. 2020, *Transformers are RNNs*, eq. (4) with the feature map of eq. (7);
    with RoPE, Su et al. 2021, *RoFormer*, sec. 3.3 ("RoPE with linear attention").
    """
    check_qkv(q, k)
    dtype = _compute_dtype(q.dtype)
    phi_q, phi_k = _elu_plus_one(q.to(dtype)), _elu_plus_one(k.to(dtype))
    normaliser = phi_q @ phi_k.sum(-2)[..., :, None]  # sum_j' phi(q_i) . phi(k_j'): [..., L_q, 1]
    if not bool((normaliser > 0).all()):
        raise ValueError(f"the elu+1 normaliser underflowed to 0 in {dtype}: the features exp(x) of far-negative "
                         "queries and keys multiply to less than the smallest number; scale q and k down")
    if rotate_q is not None:
        phi_q = rotate_q(phi_q)
    if rotate_k is not None:
        phi_k = rotate_k(phi_k)
    return (phi_q @ phi_k.transpose(-1, -2) / normaliser).to(q.dtype)


def _needs_queries_and_keys(scores: Tensor) -> Tensor:
    raise ValueError(f"attention {ELU_LINEAR!r} weighs keys by elu+1 features of the queries and keys, not by "
                     "their logits: call elu_linear_weights(q, k, ...) (RetrievalHead.attention_row does)")


ROW_WEIGHTS[ELU_LINEAR] = _needs_queries_and_keys  # a_j = phi(q) . phi(k_j) / sum phi(q) . phi(k_j'), phi = elu + 1


# ---------------------------------------------------------------- masks and softmax attention
def causal_mask(seq_len: int, device=None) -> Tensor:
    """Boolean causal mask ``[L, L]``: entry ``(m, j)`` is True iff ``j <= m`` (query m sees keys 0..m).

    ``device``: where it lives (default the CPU), checked by :func:`~lengthgen_utils._validate.check_device`.

    Raises:
        TypeError / ValueError: ``seq_len`` not an int >= 1; a device this machine cannot compute on.
    """
    seq_len = check_int("seq_len", seq_len, minimum=1)
    return _causal_mask(seq_len, check_device("cpu" if device is None else device))


def _causal_mask(seq_len: int, device: torch.device) -> Tensor:
    """:func:`causal_mask` of a length and device the caller has (a model's own, once per layer): no checks."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


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


def _check_bias(bias, lead: tuple, q_len: int, k_len: int, allowed: Tensor | None = None) -> None:
    """Raise unless ``bias`` is an additive score bias every attention path treats the same way.

    A bias must be a floating tensor broadcastable to ``[*lead, L_q, L_k]`` (without enlarging it), hold no
    NaN and no ``+inf`` (either makes a softmax row NaN), and leave every query at least one key it may
    attend to (``allowed``, the mask; all keys if None) with a finite bias: a query whose every key gets
    ``-inf`` has no softmax (the explicit path returned NaN there, the fused kernel 0). ``-inf`` on some
    keys of a row is allowed: it masks them, identically in every path.

    Raises:
        TypeError: ``bias`` is not a floating tensor.
        ValueError: a shape that does not broadcast, a NaN or ``+inf`` entry, or a query left no key.
    """
    if not isinstance(bias, Tensor) or not bias.dtype.is_floating_point:
        raise TypeError(f"bias must be a floating torch.Tensor broadcastable to [..., L_q, L_k]; "
                        f"got {getattr(bias, 'dtype', type(bias).__name__)}")
    target = (*lead, q_len, k_len)
    try:
        fits = torch.broadcast_shapes(bias.shape, target) == torch.Size(target)
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"bias must be broadcastable to [..., L_q, L_k] = {list(target)}; got {tuple(bias.shape)}")
    if bool(torch.isnan(bias).any()):
        raise ValueError(f"bias holds NaN ({int(torch.isnan(bias).sum())} entries): every query row it reaches would "
                         "have NaN weights; a bias must be a number, or -inf to mask a key")
    if bool((bias == math.inf).any()):
        raise ValueError("bias holds +inf: the softmax of a row with +inf is NaN; a bias must be finite, or -inf "
                         "to mask a key")
    finite = torch.isfinite(bias)
    if not bool(finite.all()):
        keep = finite if allowed is None else finite & allowed.to(finite.device)
        if not bool(keep.any(-1).all()):
            raise ValueError("bias is -inf on every key some query may attend to, so that query has no softmax "
                             "(NaN); leave each query at least one key with a finite bias")


def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, return_weights: bool = False,
                     bias: Tensor | None = None):
    """Softmax attention ``softmax(q k^T / sqrt(d_head) + bias + mask) v`` under an explicit mask.

    Args:
        q: ``[..., L_q, d_head]``; k: ``[..., L_k, d_head]``; v: ``[..., L_k, d_v]``.
        mask: boolean (``True`` = attend) or additive float (0 / -inf), ``[L_q, L_k]`` or
            broadcastable to ``[..., L_q, L_k]``; see :func:`additive_mask`. The two forms of
            the same mask give identical results.
        return_weights: also return the weights ``[..., L_q, L_k]``.
        bias: an optional score bias broadcastable to ``[..., L_q, L_k]`` (e.g. ALiBi's): finite, or ``-inf``
            on keys to mask as long as every query keeps one (see :func:`_check_bias`).

    Returns:
        output ``[..., L_q, d_v]`` (and the weights, if asked), in the inputs' dtype; half-precision
        inputs are computed in float32.

    Raises:
        TypeError / ValueError: see :func:`additive_mask`, :func:`check_qkv` and :func:`_check_bias`.

    Source: Vaswani et al. 2017, eq. (1).
    """
    check_qkv(q, k, v)
    additive = additive_mask(mask, q.shape[-2], k.shape[-2], _compute_dtype(q.dtype)).to(q.device)
    if bias is not None:
        _check_bias(bias, tuple(q.shape[:-2]), q.shape[-2], k.shape[-2], allowed=additive == 0)
    return _masked_attention(q, k, v, additive, return_weights, bias)


def _masked_attention(q: Tensor, k: Tensor, v: Tensor, additive: Tensor, return_weights: bool, bias):
    """:func:`masked_attention` on checked inputs (``additive``: the 0 / -inf mask in the scores' dtype)."""
    scores = attention_scores(q, k) + additive
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    weights = scores.softmax(-1)
    out = (weights @ v.to(weights.dtype)).to(v.dtype)
    weights = weights.to(q.dtype)
    return (out, weights) if return_weights else out


def causal_attention(q: Tensor, k: Tensor, v: Tensor, return_weights: bool = False, bias: Tensor | None = None):
    """Causal softmax attention, query ``m`` sees keys ``0 .. m``, with an optional additive score bias.

    Args:
        q, k, v: ``[..., L, d_head]``; the fastest layout is 4-D ``[N, H, L, d_head]`` (any strides
            with a unit last stride), the one torch's fused CPU kernel takes as it is. Other ranks are
            reshaped to it.
        return_weights: also return the attention weights ``[..., L, L]``: the explicit path,
            :func:`masked_attention` with :func:`causal_mask`; otherwise torch's fused
            ``scaled_dot_product_attention`` (the same function up to float rounding).
        bias: an optional score bias broadcastable to ``[..., L, L]`` (added after the scaling): finite, or
            ``-inf`` on keys to mask as long as every query keeps a key it sees (:func:`_check_bias`, the
            same in both paths). On the fused path it is added to a memoised 0 / -inf causal mask and
            passed as SDPA's ``attn_mask``; a bias that requires grad makes torch take its differentiable
            (unfused) path.

    Returns:
        output ``[..., L, d_head]`` (and weights, if asked).

    Raises:
        TypeError / ValueError: see :func:`check_qkv` and :func:`_check_bias` (a NaN or ``+inf`` bias, or one
            that is ``-inf`` on every key a query sees).

    Source: Vaswani et al. 2017, eq. (1), with a causal mask.
    """
    check_qkv(q, k, v)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal attention needs as many queries as keys; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if bias is not None:
        _check_bias(bias, tuple(q.shape[:-2]), q.shape[-2], k.shape[-2], allowed=_causal_mask(q.shape[-2], "cpu"))
    return _causal_attention(q, k, v, return_weights, bias)


def _causal_attention(q: Tensor, k: Tensor, v: Tensor, return_weights: bool = False, bias: Tensor | None = None):
    """:func:`causal_attention` on checked inputs: what the models call, once per layer (their score bias is
    checked once per validated forward pass, not here)."""
    seq_len = q.shape[-2]
    if return_weights or q.dtype in LOW_PRECISION:
        additive = _additive_causal_mask(seq_len, _compute_dtype(q.dtype), q.device)
        return _masked_attention(q, k, v, additive, return_weights, bias)
    mask = None if bias is None else bias.to(q.dtype) + _additive_causal_mask(seq_len, q.dtype, q.device)
    return _fused_attention(q, k, v, mask)


def available_memory(device) -> int | None:
    """Bytes a new tensor can take on ``device`` now: CUDA's free memory, else the machine's available memory
    (``MemAvailable`` of ``/proc/meminfo``, or the free physical pages); None where it cannot be read."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_attention_fits(seq_len: int, n_maps: int, dtype: torch.dtype, device, copies: int = 3) -> None:
    """Refuse a length whose ``[..., L, L]`` attention would not fit in memory, before it is allocated.

    The one check of every model and evaluation helper that builds full attention maps (the readable
    :class:`~lengthgen_utils.core.models.Transformer`, :class:`~lengthgen_utils.core.fast.FastTransformer` when
    it returns weights or scores): ``copies`` tensors of ``n_maps`` maps of ``seq_len^2`` numbers
    (scores, masked scores, weights) must fit in :func:`available_memory`. Without it, a long length goes
    straight to the allocator (``can't allocate 8589934592 bytes``) or into swap.

    Args:
        seq_len: the length L.
        n_maps: how many ``[L, L]`` maps one tensor holds (models x sequences x heads).
        dtype: their dtype; device: where they would live.
        copies: how many such tensors are alive at once.

    Raises:
        ValueError: they would need more than the memory available; the message names the length, the
            memory needed and the memory available.
    """
    need = copies * n_maps * seq_len * seq_len * torch.empty((), dtype=dtype).element_size()
    free = available_memory(device)
    if free is not None and need > free:
        raise ValueError(f"seq_len={seq_len}: full attention over {n_maps} map(s) of {seq_len} x {seq_len} needs "
                         f"{need / 2**30:.1f} GiB ({copies} tensors of {dtype}) on {device}, but {free / 2**30:.1f} "
                         "GiB is available; use a shorter length or fewer sequences per call")


@lru_cache(maxsize=64)
def _additive_causal_mask(seq_len: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The 0 / -inf form of :func:`causal_mask` ``[L, L]``, built once per (length, dtype, device); never modify it."""
    with torch.inference_mode(False):  # usable by autograd whoever built it first
        return torch.zeros(seq_len, seq_len, dtype=dtype, device=device).masked_fill(
            ~_causal_mask(seq_len, device), float("-inf"))


SHORT_SEQUENCE = 32
"""Up to this many keys, :func:`causal_attention`'s fast path uses batched matmuls instead of SDPA.

At the book's training length (32) torch's fused CPU attention kernel did not get faster with a second
thread (``python -m lengthgen_utils.tools.bench`` setting, 2 cores: 10.9 ms at one thread, 10.6 at two, for
forward and backward of 288 sequences x 4 heads), while three batched kernels (scores with the mask as
their start, softmax, weighted values) did: the transformer's whole training step was 12% faster with
them at 3 models and 2 threads. Longer sequences keep the fused kernel, which never stores the
``[L, L]`` scores.
"""


def _fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Softmax attention of 4-D ``[N, H, L, d]`` (or any rank) inputs, causal when ``mask`` is None.

    Short sequences (:data:`SHORT_SEQUENCE`): ``softmax(mask + q k^T / sqrt(d)) v`` as batched matmuls.
    Longer ones: ``scaled_dot_product_attention``, whose fused CPU kernel takes only 4-D tensors (other
    ranks fall back to the unfused math), so leading dims are merged into ``N`` (or a unit dim is
    added) and the output reshaped back.
    """
    seq_len, d_head = q.shape[-2], q.shape[-1]
    if seq_len <= SHORT_SEQUENCE:
        lead, n = q.shape[:-2], math.prod(q.shape[:-2])
        start = _additive_causal_mask(seq_len, q.dtype, q.device) if mask is None else mask
        if start.dim() > 2:
            start = start.expand(*lead, seq_len, seq_len).reshape(n, seq_len, seq_len)
        keys_t = k.reshape(n, seq_len, d_head).transpose(1, 2)
        scores = torch.baddbmm(start, q.reshape(n, seq_len, d_head), keys_t, alpha=1.0 / math.sqrt(d_head))
        out = torch.bmm(scores.softmax(-1), v.reshape(n, seq_len, v.shape[-1]))
        return out.view(*lead, seq_len, v.shape[-1])
    if q.dim() == 4:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    lead, seq_len = q.shape[:-2], q.shape[-2]
    heads = lead[-1] if lead else 1
    q4, k4, v4 = (t.reshape(-1, heads, *t.shape[-2:]) for t in (q, k, v))
    if mask is not None and mask.dim() > 2:
        mask = mask.expand(*lead, seq_len, seq_len).reshape(-1, heads, seq_len, seq_len)
    out = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, is_causal=mask is None)
    return out.reshape(*lead, seq_len, v.shape[-1])


# ---------------------------------------------------------------- linear attention
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
    normaliser never vanishes (Katharopoulos et al. 2020); it is computed as ``exp(x)`` for
    ``x <= 0``, so far-negative inputs keep positive features. The unnormalised form with the
    identity map is the raw-logit control of chapter 6. Half-precision inputs are computed
    in float32 (the running sums would otherwise overflow) and the output cast back; an
    unnormalised output beyond the dtype's range is refused, not returned as inf.

    Args:
        q, k: ``[..., L, d_head]``; v: ``[..., L, d_v]``.
        normalize: divide by the running normaliser (True) or not.
        feature_map: ``"elu+1"``, ``"identity"`` or a callable ``[..., L, d] -> [..., L, d']``.

    Returns:
        ``[..., L, d_v]`` in the inputs' dtype; output ``t`` depends on positions ``0 .. t`` only.

    Raises:
        TypeError / ValueError: bad tensors or feature map; ``normalize=True`` with a
            normaliser that is not positive at some position (the output would be inf/NaN);
            float16/bfloat16 inputs whose unnormalised output exceeds the dtype's range.

    Source: Katharopoulos et al. 2020, *Transformers are RNNs*, eq. (4)-(9).
    """
    check_qkv(q, k, v)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal attention needs as many queries as keys; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool; got {type(normalize).__name__} {normalize!r}")
    if feature_map == "elu+1":
        phi = _elu_plus_one
    elif feature_map == "identity":
        phi = lambda x: x  # noqa: E731
    elif callable(feature_map):
        phi = feature_map
    else:
        raise ValueError(f"feature_map must be one of {LINEAR_FEATURE_MAPS} or a callable; got {feature_map!r}")
    out_dtype, dtype = v.dtype, _compute_dtype(q.dtype)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    fq, fk = phi(q), phi(k)
    v_first = v[..., :1, :]
    if normalize:
        v = v - v_first
    state = torch.cumsum(fk[..., :, None] * v[..., None, :], dim=-3)  # S_t: [..., L, d', d_v]
    out = torch.einsum("...lf,...lfe->...le", fq, state)
    if not normalize:
        return _in_dtype(out, out_dtype)
    denom = (fq * torch.cumsum(fk, dim=-2)).sum(-1, keepdim=True)  # [..., L, 1]
    if not bool((denom > 0).all()):
        if feature_map == "elu+1":  # positive in exact arithmetic: the normaliser underflowed
            raise ValueError(f"the linear-attention normaliser underflowed to 0 in {dtype} at some position: the "
                             "elu+1 features exp(x) of far-negative queries and keys multiply to less than the "
                             f"smallest {dtype} number; scale q and k down or shift them up")
        raise ValueError(f"the linear-attention normaliser is <= 0 in {dtype} at some position, so the weights are "
                         f"undefined: the features of feature_map={feature_map!r} are not positive there (or "
                         "underflowed); feature_map='elu+1' is positive, computed as exp(x) below 0")
    return _in_dtype((v_first + out / denom), out_dtype)


def _elu_plus_one(x: Tensor) -> Tensor:
    """``elu(x) + 1``: ``x + 1`` for ``x > 0`` and ``exp(x)`` otherwise, without the cancellation of
    ``(exp(x) - 1) + 1``, which rounds to 0 for ``x`` below about -17 in float32."""
    return torch.where(x > 0, x + 1, torch.exp(x.clamp(max=0)))


def _in_dtype(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` cast to ``dtype``, refusing a finite value beyond ``dtype``'s range (it would become inf)."""
    out = x.to(dtype)
    if dtype in LOW_PRECISION and not bool(torch.isfinite(out).all()) and bool(torch.isfinite(x).all()):
        raise ValueError(f"the result reaches {float(x.abs().max()):.3g}, beyond the largest finite {dtype} "
                         f"({torch.finfo(dtype).max:g}); pass float32 inputs for it")
    return out
