"""Attention primitives: masks, scores and the ways of turning scores into weights (one place for numerics).

Every model of the book forms its attention here:

* :func:`attention_scores`: ``q k^T / sqrt(d_head)``, the scale applied *before* the product and
  low-precision inputs computed in float32, so float16 never overflows on its way to a logit;
* :func:`row_weights`: the single head's choice of normaliser (``softmax``; ``linear``, the raw
  scores of chapter 6's control; and chapter 6's ablations of softmax's parts), from the registry
  :data:`ROW_WEIGHTS`;
* :func:`elu_linear_weights`: linear attention's weights with the positive feature map ``elu(x) + 1``,
  the normaliser ``linear_elu`` of :data:`ROW_WEIGHTS` (it needs the queries and keys, not the logits);
* :func:`causal_attention`: softmax attention under the causal mask, with an optional additive
  score bias (ALiBi and other relative biases act there).

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


SHORT_ROW = 16
"""Rows shorter than this are padded before a CPU softmax (:func:`_softmax_rows`)."""


def _softmax_rows(scores: Tensor) -> Tensor:
    """``scores.softmax(-1)``, with rows shorter than :data:`SHORT_ROW` padded on the CPU.

    Torch's CPU softmax vectorises along the row only when the row holds at least one vector of floats;
    the single heads' training rows (7 to 15 keys) took its scalar path, about 4x slower forward and
    backward on the book's machine. A key padded with ``-inf`` gets weight exactly 0, so the result is the
    same softmax up to float rounding (the sum is taken in another order).

    Args:
        scores: floating ``[..., L]``; returns ``[..., L]``.
    """
    n = scores.shape[-1]
    if n >= SHORT_ROW or scores.device.type != "cpu":
        return scores.softmax(-1)
    return F.pad(scores, (0, SHORT_ROW - n), value=-math.inf).softmax(-1)[..., :n]


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
    return (s / s.sum(-1, keepdim=True)).to(scores.dtype)


EXP_MAX_LOGIT = 80.0
""":func:`row_weights` refuses ``exp`` above this logit: ``exp(88.7)`` already overflows float32."""


def _exp(scores: Tensor) -> Tensor:
    return scores.to(_compute_dtype(scores.dtype)).exp().to(scores.dtype)


ROW_WEIGHTS = {
    "softmax": _softmax,  # a_j = exp(s_j) / sum_i exp(s_i)
    "linear": _linear,  # a_j = s_j: no exponential, no normaliser (chapter 6's control)
    "linear_mean": _linear_mean,  # a_j = s_j / L: linear, divided by the number of keys (a length normaliser)
    "linear_sum": _linear_sum,  # a_j = s_j / sum_i s_i: linear, divided by its own sum (refused where it vanishes)
    "exp": _exp,  # a_j = exp(s_j): softmax's exponential without its normaliser (refused where it overflows)
}
"""How the single retrieval head turns its logits ``[..., L]`` over the keys a query sees into attention weights.

Chapter 6's ablation separates softmax's two parts, the exponential and the division by a sum that
grows with the length. The functions are the math alone; the two that can vanish or overflow are refused
at the edge (:func:`row_weights`, a model's forward pass) by :func:`_refuse_unstable`, not inside."""


def _refuse_unstable(scores: Tensor, attention: str) -> None:
    """Raise ``ValueError`` where ``attention``'s weights of ``scores [..., L]`` would be inf or NaN: a row of
    ``linear_sum`` whose sum vanishes (:data:`SUM_TOLERANCE`), a logit of ``exp`` above :data:`EXP_MAX_LOGIT`.
    Not called where a model may diverge as a data point (training and evaluating an ensemble:
    :func:`~lengthgen_utils.core.models.diverged_models_allowed`)."""
    s = scores.to(_compute_dtype(scores.dtype))
    if attention == "linear_sum":
        total = s.sum(-1, keepdim=True)
        if not bool((total.abs() > SUM_TOLERANCE * s.abs().sum(-1, keepdim=True)).all()):
            raise ValueError("attention 'linear_sum' divides by the sum of the logits, which vanishes for some row "
                             f"(|sum s| <= {SUM_TOLERANCE:g} * sum |s|): its weights would be inf or NaN. Use "
                             "'linear_mean' (divide by the length) or a positive score map ('exp', 'softmax')")
    elif attention == "exp" and not bool((s <= EXP_MAX_LOGIT).all()):
        raise ValueError(f"attention 'exp' (un-normalised exp(s_j)) got a logit {float(s.max().detach()):.1f} > "
                         f"{EXP_MAX_LOGIT:g}: its weight would overflow to inf in float32")


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
    attention = check_attention(attention)
    _refuse_unstable(scores, attention)
    return ROW_WEIGHTS[attention](scores)


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
    device = check_device("cpu" if device is None else device)
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


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


def _masked_attention(q: Tensor, k: Tensor, v: Tensor, additive: Tensor, return_weights: bool, bias):
    """Softmax attention under a 0 / -inf mask ``additive`` (scores' dtype): :func:`causal_attention`'s explicit path."""
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
        q, k, v: ``[..., L, d_head]``; the fastest layout is 4-D ``[N, H, L, d_head]``, the one torch's fused
            CPU kernel takes as it is.
        return_weights: also return the weights ``[..., L, L]`` (the explicit path); otherwise batched matmuls
            up to :data:`SHORT_SEQUENCE` keys and torch's fused ``scaled_dot_product_attention`` beyond (the
            same function up to float rounding).
        bias: ``None`` or a score bias broadcastable to ``[..., L, L]``, added after the scaling.

    Returns:
        output ``[..., L, d_head]`` (and the weights, if asked), in the inputs' dtype.

    The models call it once per layer on queries and keys they formed, with the score bias their forward
    pass checked once (``_check_bias``), so it checks only that the shapes fit.

    Source: Vaswani et al. 2017, eq. (1), with a causal mask.
    """
    assert q.shape[-2] == k.shape[-2] == v.shape[-2] and q.shape[-1] == k.shape[-1], (q.shape, k.shape, v.shape)
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
            ~causal_mask(seq_len, device), float("-inf"))


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


def _elu_plus_one(x: Tensor) -> Tensor:
    """``elu(x) + 1``: ``x + 1`` for ``x > 0`` and ``exp(x)`` otherwise, without the cancellation of
    ``(exp(x) - 1) + 1``, which rounds to 0 for ``x`` below about -17 in float32."""
    return torch.where(x > 0, x + 1, torch.exp(x.clamp(max=0)))


