"""Analyses of trained heads: what rule the weights encode.

Sources: Su et al. 2021 (RoFormer: RoPE scores depend on the offset alone);
DESIGN.md, "Carrier probe" (our reconstruction of the paper's carrier claim);
Barbero et al. 2025 (RoPE frequencies and aliasing at long range).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ._validate import check_int
from .positional import rope_inverse_frequencies

# --- carrier kernel (chapter 4)


def _check_rope_model(model) -> None:
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "pe", None) != "rope":
        raise ValueError(f"model must be a RetrievalHead with pe='rope'; got pe={getattr(cfg, 'pe', None)!r}")


def _per_model_offsets(offset, n_models: int) -> Tensor:
    """``offset`` (one int >= 1, or one per model) as a long tensor ``[n_models]``."""
    if isinstance(offset, Tensor) or (hasattr(offset, "__iter__") and not isinstance(offset, (str, bytes))):
        vals = [check_int(f"offset[{i}]", int(k) if isinstance(k, Tensor) else k, minimum=1) for i, k in enumerate(offset)]
        if len(vals) != n_models:
            raise ValueError(f"offset must be one int or {n_models} ints (one per model); got {len(vals)}")
    else:
        vals = [check_int("offset", offset, minimum=1)] * n_models
    return torch.tensor(vals, dtype=torch.long)


def _check_offsets(offsets) -> Tensor:
    if isinstance(offsets, Tensor):
        if offsets.dtype.is_floating_point or offsets.dtype.is_complex or offsets.dtype == torch.bool:
            raise TypeError(f"offsets must be integers; got dtype {offsets.dtype}")
        out = offsets.to(torch.long).flatten()
    else:
        if isinstance(offsets, (str, bytes)) or not hasattr(offsets, "__iter__"):
            raise TypeError(f"offsets must be a sequence of ints or an integer tensor; got {type(offsets).__name__}")
        vals = list(offsets)
        for i, v in enumerate(vals):
            check_int(f"offsets[{i}]", v)
        out = torch.tensor(vals, dtype=torch.long)
    if out.numel() == 0:
        raise ValueError("offsets must not be empty")
    return out


@dataclass(frozen=True)
class CarrierSpectrum:
    """Per-pair amplitudes and phases of a RoPE head's offset kernel.

    ``s(D) = sum_i r[m, i] * cos(theta[i] * D - phi[m, i])`` (the ``1/sqrt(d_head)``
    score scale is folded into ``r``).

    Attributes:
        theta: ``[P]`` float64, rad per position (P = d_head / 2 frequency pairs).
        r: ``[M, P]`` float64 amplitudes (logit units, nats), >= 0.
        phi: ``[M, P]`` float64 phases in (-pi, pi].
    """

    theta: Tensor
    r: Tensor
    phi: Tensor


@torch.no_grad()
def carrier_spectrum(model) -> CarrierSpectrum:
    """Amplitude ``r_i`` and phase ``phi_i`` of every RoPE frequency pair of each model.

    With ``q0 = W_Q^T u`` and ``k0 = W_K^T u`` (before rotation), write pair
    ``i`` of each as a complex number ``z = x_i + 1j x_{i+d/2}`` (half-split;
    ``x_{2i} + 1j x_{2i+1}`` when interleaved). RoPE multiplies it by
    ``exp(1j t theta_i)`` at position t, so the query at ``L-1`` and key at
    ``j = L-1+D`` give ``Re(zq conj(zk) exp(-1j theta_i D))``; hence
    ``r_i = |zq conj(zk)| / sqrt(d_head)`` and ``phi_i = arg(zq conj(zk))``.
    Equivalently ``a_i = r_i cos phi_i = q^(i).k^(i)/sqrt(d)`` and
    ``b_i = r_i sin phi_i = q^(i).J k^(i)/sqrt(d)``.

    Args:
        model: a RoPE :class:`~lengthgen_utils.models.RetrievalHead` ensemble (M models).

    Returns:
        :class:`CarrierSpectrum`.

    Raises:
        ValueError: the model is not a RoPE retrieval head.

    Source: Su et al. 2021 (RoFormer), eq. (13)-(16); DESIGN.md "Key identities".
    """
    _check_rope_model(model)
    cfg = model.config
    q0 = torch.einsum("md,mdh->mh", model.u, model.w_q).double()
    k0 = torch.einsum("md,mdh->mh", model.u, model.w_k).double()
    half = cfg.d_head // 2
    if cfg.interleaved:
        zq = torch.complex(q0[:, 0::2], q0[:, 1::2])
        zk = torch.complex(k0[:, 0::2], k0[:, 1::2])
    else:
        zq = torch.complex(q0[:, :half], q0[:, half:])
        zk = torch.complex(k0[:, :half], k0[:, half:])
    w = zq * zk.conj() / math.sqrt(cfg.d_head)
    theta = rope_inverse_frequencies(cfg.d_head, cfg.rope_base)
    return CarrierSpectrum(theta=theta, r=w.abs().cpu(), phi=w.angle().cpu())


def pair_components(model, offsets) -> Tensor:
    """Each frequency pair's contribution ``r_i cos(theta_i D - phi_i)`` to the kernel.

    Args:
        model: a RoPE retrieval head ensemble (M models).
        offsets: ints ``D`` (key position minus query position; ``D <= 0`` under causal masking).

    Returns:
        float64 ``[M, P, n_offsets]`` in logit units; summing over ``P`` gives :func:`offset_kernel`.
    """
    offsets = _check_offsets(offsets)
    spec = carrier_spectrum(model)
    angle = spec.theta[None, :, None] * offsets.double()[None, None, :] - spec.phi[:, :, None]
    return spec.r[:, :, None] * torch.cos(angle)


def offset_kernel(model, offsets) -> Tensor:
    """The trained attention logit as a function of offset, computed from the weights.

    ``s(D) = sum_i [a_i cos(theta_i D) + b_i sin(theta_i D)] = sum_i r_i cos(theta_i D - phi_i)``,
    the logit the query at position ``L-1`` gives the key at ``L-1+D``, at every length ``L``.

    Args:
        model: a RoPE retrieval head ensemble (M models).
        offsets: ints ``D`` (e.g. ``range(-255, 1)``); any integers are allowed.

    Returns:
        float64 ``[M, n_offsets]`` logits (nats).

    Raises:
        ValueError / TypeError: not a RoPE model; ``offsets`` empty or not integers.
    """
    return pair_components(model, offsets).sum(1)


def training_window(train_len: int) -> Tensor:
    """The offsets a query sees in training, ``D = -(train_len-1) .. 0``: long ``[train_len]``."""
    train_len = check_int("train_len", train_len, minimum=2)
    return torch.arange(-(train_len - 1), 1)


def variation_weights(model, train_len: int) -> Tensor:
    """How much each pair's contribution varies across the training window.

    ``v_i = std_{D in window} r_i cos(theta_i D - phi_i)`` (population std). A
    low frequency that barely turns over the window has small ``v_i`` however
    large ``r_i`` is: it acts as a bias, not as a selector.

    Returns:
        float64 ``[M, P]`` (nats).
    """
    return pair_components(model, training_window(train_len)).std(-1, unbiased=False)


def carrier_alignment(model, offset: int, train_len: int | None = None) -> Tensor:
    """Alignment of the carrier with the target offset ``k``.

    ``C = sum_i w_i cos(phi_i + theta_i k) / sum_i w_i``: 1 when every pair's
    cosine peaks at ``D = -k`` (a matched filter for offset k).
    With ``train_len=None`` the weights are the raw amplitudes ``w_i = r_i``;
    with ``train_len`` they are the variation weights ``w_i = v_i`` of
    :func:`variation_weights` (the pairs that actually select inside the window).

    Args:
        model: a RoPE retrieval head ensemble (M models).
        offset: the target offset k >= 1 (one int, or one per model).
        train_len: None (raw-amplitude alignment) or the training length (variation-weighted).

    Returns:
        float64 ``[M]`` in [-1, 1].

    Source: DESIGN.md claim C4 (the abstract's "carrier aligned with the offset").
    """
    spec = carrier_spectrum(model)
    k = _per_model_offsets(offset, spec.r.shape[0]).double()
    weights = spec.r if train_len is None else variation_weights(model, train_len)
    cos = torch.cos(spec.phi + spec.theta[None, :] * k[:, None])
    return (weights * cos).sum(1) / weights.sum(1)


def participation_ratio(weights: Tensor) -> Tensor:
    """``(sum_i w_i)^2 / sum_i w_i^2`` over the last dim: the effective number of non-negative components.

    1 when one component carries everything, ``n`` when all ``n`` are equal.

    Raises:
        ValueError: negative entries, or a row that is all zero.
    """
    if not isinstance(weights, Tensor):
        raise TypeError(f"weights must be a torch.Tensor; got {type(weights).__name__}")
    if (weights < 0).any():
        raise ValueError(f"weights must be >= 0; got min {float(weights.min()):.3g}")
    denom = (weights ** 2).sum(-1)
    if (denom == 0).any():
        raise ValueError("weights has a row that is all zero; its participation ratio is undefined")
    return weights.sum(-1) ** 2 / denom


@torch.no_grad()
def qk_effective_rank(model) -> Tensor:
    """Participation ratio of the squared singular values of the bilinear form ``W_Q W_K^T``.

    ``(sum sigma^2)^2 / sum sigma^4`` of the ``[d_model, d_model]`` matrix whose
    (rotated) form gives every logit. Note that with a constant query/key input
    ``u`` only the rank-one slice ``(u^T W_Q, u^T W_K)`` reaches the logits; this
    measures the whole matrix, including directions the task never uses.

    Returns:
        float64 ``[M]``, between 1 and ``d_head``.
    """
    sigma = torch.linalg.svdvals((model.w_q @ model.w_k.transpose(1, 2)).double())
    return participation_ratio(sigma ** 2).cpu()


def kernel_reconstruction(model, train_len: int, rank: int) -> Tensor:
    """Fraction of the kernel's variance over the training window kept by its top-``rank`` pairs.

    Pairs are ranked by variation weight (:func:`variation_weights`); the
    reconstruction keeps those pairs' components and replaces every other pair
    by its mean over the window (a constant bias). Returned is
    ``1 - ||s - s_r||^2 / ||s - mean s||^2`` over the window.

    Returns:
        float64 ``[M]``, at most 1 (1 when ``rank`` pairs reconstruct the window exactly).
    """
    rank = check_int("rank", rank, minimum=0)
    comps = pair_components(model, training_window(train_len))  # [M, P, W]
    n_pairs = comps.shape[1]
    if rank > n_pairs:
        raise ValueError(f"rank must be in [0, {n_pairs}] (the number of frequency pairs); got rank={rank}")
    order = comps.std(-1, unbiased=False).argsort(1, descending=True)
    keep = torch.zeros(comps.shape[:2], dtype=torch.bool)
    keep.scatter_(1, order[:, :rank], True)
    approx = torch.where(keep[..., None], comps, comps.mean(-1, keepdim=True)).sum(1)
    s = comps.sum(1)
    resid = ((s - approx) ** 2).sum(-1)
    total = ((s - s.mean(-1, keepdim=True)) ** 2).sum(-1)
    return 1 - resid / total


def first_alias_offset(model, offset: int, train_len: int, max_distance: int, tolerance: float = 1.0) -> list:
    """The nearest offset beyond the training window at which the kernel comes back near its target peak.

    Returns, per model, the smallest distance ``d = -D >= train_len`` with
    ``s(-d) >= s(-k) - tolerance`` (a key that gets at least ``exp(-tolerance)``
    of the target's weight), searched up to ``max_distance``; ``None`` when there is none.
    A sequence of length ``L`` contains that key once ``L >= d + 1``.

    Args:
        model: a RoPE retrieval head ensemble.
        offset: the target offset k (one int, or one per model).
        train_len: the training length (the window is ``d <= train_len - 1``).
        max_distance: largest distance searched (>= train_len).
        tolerance: nats below the target logit that still count as "near the peak" (>= 0).

    Source: Barbero et al. 2025 (RoPE frequencies; aliasing at long range).
    """
    ks = _per_model_offsets(offset, model.n_models)
    train_len = check_int("train_len", train_len, minimum=int(ks.max()) + 2)
    max_distance = check_int("max_distance", max_distance, minimum=train_len)
    if not isinstance(tolerance, (int, float)) or isinstance(tolerance, bool) or not tolerance >= 0:
        raise ValueError(f"tolerance must be a number >= 0; got tolerance={tolerance!r}")
    distances = torch.arange(train_len, max_distance + 1)
    far = offset_kernel(model, -distances)
    peak = offset_kernel(model, -ks).diagonal()[:, None]  # s_m(-k_m)
    hit = far >= peak - tolerance
    out = []
    for row in hit:
        idx = torch.nonzero(row)
        out.append(int(distances[idx[0, 0]]) if idx.numel() else None)
    return out


# --- transformer heads (chapter 7)
@torch.no_grad()
def head_offset_profiles(model, task, seq_len: int, n_samples: int = 64, seed: int = 999,
                         min_query: int | None = None) -> tuple[Tensor, Tensor]:
    """Each head's mean attention logit and mean attention weight as a function of offset.

    For every query position ``i >= min_query`` and key ``j <= i``, the offset is
    ``D = j - i`` (0 = the query itself, -k = k tokens back). Logits and weights are
    averaged over queries and over random sequences (i.e. over content).

    Args:
        model: a ``Transformer`` ensemble.
        task: the task whose sequences are fed (content distribution).
        seq_len: length of the probe sequences.
        n_samples: probe sequences.
        seed: probe seed.
        min_query: smallest query position averaged (default ``seq_len // 2``, so every
            averaged query sees at least ``seq_len // 2`` keys).

    Returns:
        ``logit [M, n_layers, n_heads, seq_len]`` and ``weight`` of the same shape, where
        index ``d`` holds offset ``D = -d`` (only offsets ``-d`` with ``d <= seq_len - 1 - min_query``
        are averaged over all queries; larger ``d`` are NaN).
    """
    seq_len = task.check_seq_len(seq_len)
    min_query = seq_len // 2 if min_query is None else check_int("min_query", min_query, 0, seq_len - 1)
    tokens, _ = task.sample(check_int("n_samples", n_samples, minimum=1), seq_len,
                            torch.Generator().manual_seed(seed), device=model.device)
    scores = model.head_scores(tokens)  # list of [M, B, H, L, L]
    queries = torch.arange(min_query, seq_len)
    max_back = min_query  # every query >= min_query has keys back to offset -min_query
    logit = torch.full((model.n_models, len(scores), model.n_heads, seq_len), float("nan"), dtype=torch.float64)
    weight = logit.clone()
    for layer, s in enumerate(scores):
        w = s.softmax(-1)
        for d in range(max_back + 1):
            keys = queries - d
            logit[:, layer, :, d] = s[..., queries, keys].double().mean((1, 3)).cpu()
            weight[:, layer, :, d] = w[..., queries, keys].double().mean((1, 3)).cpu()
    return logit, weight


@torch.no_grad()
def shift_invariance(model, tokens: Tensor, shifts=(1, 1000, 100000)) -> dict:
    """Largest change of the model's output logits when every position is shifted.

    Args:
        model: a model whose ``forward(tokens, position_shift)`` returns logits.
        tokens: probe batch.
        shifts: global position shifts to try.

    Returns:
        ``{shift: max |logits(shift) - logits(0)|}`` (floats).
    """
    base = model(tokens)
    base = base[0] if isinstance(base, tuple) else base
    out = {}
    for shift in shifts:
        shifted = model(tokens, position_shift=shift)
        shifted = shifted[0] if isinstance(shifted, tuple) else shifted
        out[shift] = float((shifted - base).abs().max())
    return out
