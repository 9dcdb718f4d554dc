"""Reference attention functions the tests compare the package against (the package itself never calls them).

``masked_attention`` (softmax attention under an explicit boolean or 0 / -inf mask, which
``additive_mask`` checks), ``causal_attention`` (the package's
:func:`lengthgen_utils.core.attention.causal_attention` behind the argument checks a caller handing in
its own tensors needs) and ``linear_attention`` (causal linear attention in O(L), Katharopoulos et al. 2020).
"""
from __future__ import annotations


import torch
from torch import Tensor

from lengthgen_utils.core import attention
from lengthgen_utils.core.attention import (LOW_PRECISION, _check_bias, _compute_dtype, _elu_plus_one,
                                            _masked_attention, check_qkv)


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


def causal_attention(q: Tensor, k: Tensor, v: Tensor, return_weights: bool = False, bias: Tensor | None = None):
    """Causal softmax attention, query ``i`` sees keys ``0 .. i``, with an optional additive score bias.

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
        _check_bias(bias, tuple(q.shape[:-2]), q.shape[-2], k.shape[-2], allowed=attention.causal_mask(q.shape[-2]))
    return attention.causal_attention(q, k, v, return_weights, bias)


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


def _in_dtype(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` cast to ``dtype``, refusing a finite value beyond ``dtype``'s range (it would become inf)."""
    out = x.to(dtype)
    if dtype in LOW_PRECISION and not bool(torch.isfinite(out).all()) and bool(torch.isfinite(x).all()):
        raise ValueError(f"the result reaches {float(x.abs().max()):.3g}, beyond the largest finite {dtype} "
                         f"({torch.finfo(dtype).max:g}); pass float32 inputs for it")
    return out

