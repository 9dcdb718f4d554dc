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

from ._validate import check_int, check_int_sequence
from .positional import rope_inverse_frequencies, rotate_pairs

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
    """Participation ratio of the squared singular values of the bilinear form ``W_Q^T W_K``.

    In the book's notation (``W_Q``, ``W_K`` are ``[d_head, d_model]``; the code stores their
    transposes ``w_q``, ``w_k`` as ``[M, d_model, d_head]``, so this is ``w_q @ w_k^T``):
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


# --- equivariance (chapter 2)
LOW_PRECISION_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # angle dtypes compared

def _check_dtype(name: str, dtype) -> torch.dtype:
    if dtype not in LOW_PRECISION_DTYPES:
        raise ValueError(f"{name} must be one of {LOW_PRECISION_DTYPES}; got {dtype!r}")
    return dtype


def rope_angles_in_dtype(positions: Tensor, d_head: int, base: float = 10000.0,
                         dtype: torch.dtype = torch.float64) -> Tensor:
    """RoPE angles ``position * theta_i`` formed the way a low-precision implementation forms them.

    The position and the frequency are both rounded to ``dtype`` and multiplied
    in ``dtype``; the (rounded) result is returned in float64. With
    ``dtype=torch.float64`` this equals
    :func:`~lengthgen_utils.positional.rope_angles`.

    Args:
        positions: integer tensor ``[...]``.
        d_head: even head dimension.
        base: RoPE base.
        dtype: float16, bfloat16, float32 or float64.

    Returns:
        float64 tensor ``[..., d_head // 2]`` of angles in radians.

    Raises:
        TypeError: ``positions`` is not an integer tensor.
        ValueError: unknown ``dtype``, or a position too large for ``dtype``
            (float16 overflows above 65504: the angle would be ``inf``).
    """
    if not isinstance(positions, Tensor) or positions.dtype.is_floating_point or positions.dtype == torch.bool:
        raise TypeError(f"positions must be an integer torch.Tensor; got {getattr(positions, 'dtype', type(positions).__name__)}")
    dtype = _check_dtype("dtype", dtype)
    if positions.numel() and positions.abs().max() > torch.finfo(dtype).max:
        raise ValueError(f"positions up to {int(positions.abs().max())} overflow dtype={dtype} "
                         f"(largest finite value {torch.finfo(dtype).max:g})")
    theta = rope_inverse_frequencies(d_head, base).to(positions.device)
    return (positions.to(dtype)[..., None] * theta.to(dtype)).to(torch.float64)


def rope_angle_error(positions: Tensor, d_head: int, base: float = 10000.0,
                     dtype: torch.dtype = torch.float16) -> Tensor:
    """How far a RoPE angle formed in ``dtype`` is from the exact angle, wrapped to ``[0, pi]``.

    Args:
        positions, d_head, base, dtype: as in :func:`rope_angles_in_dtype`.

    Returns:
        float64 tensor ``[..., d_head // 2]``: ``|wrap(angle_dtype - angle_exact)|`` in radians,
        where ``wrap`` maps to ``(-pi, pi]`` (an error of ``2 pi`` is no error).

    Source: the rounding of IEEE half/bfloat16 formats; the failure mode is
    discussed for long-context RoPE by e.g. Barbero et al. 2025.
    """
    exact = rope_angles_in_dtype(positions, d_head, base, torch.float64)
    err = rope_angles_in_dtype(positions, d_head, base, dtype) - exact
    return torch.remainder(err + math.pi, 2 * math.pi).sub(math.pi).abs()


def position_queries_keys(model, positions: Tensor, angle_dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """The head's query and key at every given position (RoPE applied), before any causal mask.

    For the position-only head of the retrieval task (DESIGN.md), the query a
    token at position ``m`` would emit and the key at position ``n`` are::

        RoPE: q_m = R_m W_Q^T u,          k_n = R_n W_K^T u
        APE:  q_m = W_Q^T (u + p_m),      k_n = W_K^T (u + p_n)
        NoPE: q_m = W_Q^T u,              k_n = W_K^T u

    The model itself only reads the query at the last position; this
    function evaluates the same formulas at every position.

    Args:
        model: a ``RetrievalHead`` ensemble (M models).
        positions: integer tensor ``[P]`` of absolute positions (within the APE table for APE).
        angle_dtype: dtype in which RoPE angles are formed (float64 = exact;
            see :func:`rope_angles_in_dtype`); ignored unless ``pe == "rope"``.

    Returns:
        ``q [M, P, d_head]`` and ``k [M, P, d_head]`` in the model's dtype.

    Raises:
        TypeError: ``positions`` is not a 1-d integer tensor.
        ValueError: a position outside the APE table (APE), or a bad ``angle_dtype``.
    """
    if not isinstance(positions, Tensor) or positions.dim() != 1 or positions.dtype.is_floating_point:
        raise TypeError(f"positions must be a 1-d integer tensor [P]; got {positions!r:.80}")
    cfg = model.config
    positions = positions.to(model.device)
    if cfg.pe == "ape":
        x = model.u[:, None, :] + model.ape(positions)  # [M, P, d_model]
    else:
        x = model.u[:, None, :].expand(-1, positions.shape[0], -1)
    q = torch.einsum("mpd,mdh->mph", x, model.w_q)
    k = torch.einsum("mpd,mdh->mph", x, model.w_k)
    if cfg.pe == "rope":
        angles = rope_angles_in_dtype(positions, cfg.d_head, cfg.rope_base, angle_dtype)
        cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)
        q = rotate_pairs(q, cos, sin, cfg.interleaved)
        k = rotate_pairs(k, cos, sin, cfg.interleaved)
    return q, k


@torch.no_grad()
def position_logits(model, seq_len: int, position_shift: int = 0,
                    angle_dtype: torch.dtype = torch.float64) -> Tensor:
    """The logit ``s(m, n) = q_m . k_n / sqrt(d_head)`` for every query position m and key position n < L.

    Row ``m = L-1`` is the model's own score row (``model.scores(L)``). The
    matrix is returned without a causal mask; the head only ever uses
    ``n <= m``. For RoPE, ``s(m, n)`` depends on ``n - m`` alone (chapter 2),
    so the matrix is constant along its diagonals.

    Args:
        model: a ``RetrievalHead`` ensemble (M models).
        seq_len: L >= 1.
        position_shift: added to every position (``0..L-1`` becomes ``shift..shift+L-1``).
        angle_dtype: dtype in which RoPE angles are formed (see :func:`rope_angles_in_dtype`).

    Returns:
        tensor ``[M, L, L]`` (query position, key position), on the model's device.

    Raises:
        ValueError / TypeError: bad ``seq_len``/``position_shift``, positions beyond the APE table.
    """
    seq_len = check_int("seq_len", seq_len, minimum=1)
    position_shift = check_int("position_shift", position_shift)
    positions = torch.arange(seq_len) + position_shift
    q, k = position_queries_keys(model, positions, angle_dtype)
    return torch.einsum("mah,mbh->mab", q, k) / math.sqrt(model.config.d_head)


def position_attention(model, seq_len: int) -> Tensor:
    """Causal attention of a query at every position m over the keys n <= m (softmax heads).

    Args:
        model: a ``RetrievalHead`` ensemble with ``attention == "softmax"``.
        seq_len: L >= 1.

    Returns:
        tensor ``[M, L, L]`` (query position, key position): each row sums to 1, zeros above the diagonal.
        Row ``L-1`` is ``model.attention_row(L)``.

    Raises:
        ValueError: the model uses linear attention (no softmax to normalise).
    """
    if model.config.attention != "softmax":
        raise ValueError(f"position_attention needs a softmax head; got attention={model.config.attention!r}")
    s = position_logits(model, seq_len)
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=s.device).tril()
    return s.masked_fill(~causal, float("-inf")).softmax(-1)


@torch.no_grad()
def shift_logit_difference(model, seq_len: int, shifts) -> Tensor:
    """Largest change of the model's score row when every position is shifted.

    Computes ``max_j |s_j(shift) - s_j(0)|`` with the model's own forward
    path (``model.scores``), for each model and shift.

    Args:
        model: a ``RetrievalHead`` ensemble.
        seq_len: L >= 1.
        shifts: sequence of ints (for APE, ``shift + L`` must fit the table).

    Returns:
        float64 tensor ``[M, len(shifts)]`` (logit units), on CPU.

    Raises:
        ValueError: a shift that moves a position outside the APE table.
    """
    shifts = check_int_sequence("shifts", shifts)
    base = model.scores(seq_len, 0).double()
    cols = [(model.scores(seq_len, s).double() - base).abs().amax(-1) for s in shifts]
    return torch.stack(cols, -1).cpu()


@torch.no_grad()
def shared_offset_difference(model, short_len: int, long_len: int) -> Tensor:
    """Largest difference between the score rows at two lengths over the offsets both share.

    The query sits at the last position, so key ``j`` of a length-``L`` row
    has offset ``j - (L-1)``. The offsets ``-(short_len-1) .. 0`` exist at both
    lengths: they are the last ``short_len`` keys of the long row and all
    keys of the short row.

    Args:
        model: a ``RetrievalHead`` ensemble.
        short_len, long_len: ``1 <= short_len <= long_len``.

    Returns:
        float64 tensor ``[M]``: ``max |s^{long}_{offset} - s^{short}_{offset}|`` (logit units), on CPU.

    Raises:
        ValueError: ``short_len > long_len``.
    """
    short_len = check_int("short_len", short_len, minimum=1)
    long_len = check_int("long_len", long_len, minimum=short_len)
    short = model.scores(short_len).double()
    long = model.scores(long_len).double()[:, long_len - short_len:]
    return (long - short).abs().amax(-1).cpu()


def diagonal_spread(logits: Tensor, causal: bool = True) -> Tensor:
    """How far a ``[.., L, L]`` logit matrix is from being constant along its diagonals.

    For every diagonal ``n - m = D`` (``D <= 0`` only when ``causal``), takes
    ``max - min`` of the entries on it; returns the largest such range.

    Args:
        logits: tensor ``[..., L, L]`` (query position, key position), e.g. from :func:`position_logits`.
        causal: only look at ``n <= m``.

    Returns:
        tensor ``[...]`` (float64, CPU): 0 for an exactly offset-only matrix.

    Raises:
        ValueError: ``logits`` is not square in its last two dims.
    """
    if not isinstance(logits, Tensor) or logits.dim() < 2 or logits.shape[-1] != logits.shape[-2]:
        raise ValueError(f"logits must be a tensor [..., L, L]; got shape {tuple(getattr(logits, 'shape', ()))}")
    x = logits.detach().double().cpu()
    seq_len = x.shape[-1]
    offsets = range(-(seq_len - 1), 1 if causal else seq_len)
    spreads = []
    for d in offsets:
        diag = torch.diagonal(x, offset=d, dim1=-2, dim2=-1)
        spreads.append(diag.amax(-1) - diag.amin(-1))
    return torch.stack(spreads, -1).amax(-1)


@torch.no_grad()
def target_attention(model, lengths, offset: int) -> Tensor:
    """Attention weight of the query on the target key (``offset`` before the query) at each length.

    Args:
        model: a ``RetrievalHead`` ensemble.
        lengths: sequence of lengths L, each ``> offset``.
        offset: the task's offset k >= 1.

    Returns:
        float64 tensor ``[M, len(lengths)]`` with ``a_{L-1-k}`` (a fraction in [0, 1] for softmax), on CPU.
    """
    offset = check_int("offset", offset, minimum=1)
    lengths = check_int_sequence("lengths", lengths, minimum=offset + 1)
    return torch.stack([model.attention_row(L)[:, L - 1 - offset].double() for L in lengths], -1).cpu()


# --- pinning (chapter 3)
@torch.no_grad()
def attention_argmax(model, lengths) -> Tensor:
    """The absolute key position the query attends to most, at each length.

    In the position-only head the attention row does not depend on the
    tokens, so every sequence of a given length has the same argmax; this is
    it. Ties go to the lowest position.

    Args:
        model: a ``RetrievalHead`` ensemble.
        lengths: sequence of lengths L >= 1 (within the APE table for APE).

    Returns:
        LongTensor ``[M, len(lengths)]`` of positions in ``0 .. L-1``, on CPU.
    """
    lengths = check_int_sequence("lengths", lengths, minimum=1)
    return torch.stack([model.scores(L).argmax(-1) for L in lengths], -1).cpu()


def attention_argmax_histogram(model, lengths) -> Tensor:
    """How many of the given lengths put the attention argmax on each absolute position.

    Args:
        model: a ``RetrievalHead`` ensemble.
        lengths: sequence of lengths L >= 1 (one test sequence per length: all
            sequences of one length share the argmax, see :func:`attention_argmax`).

    Returns:
        LongTensor ``[M, max(lengths)]``: counts per position, each row summing to ``len(lengths)``.
    """
    lengths = check_int_sequence("lengths", lengths, minimum=1)
    argmax = attention_argmax(model, lengths)
    counts = torch.zeros(argmax.shape[0], max(lengths), dtype=torch.long)
    return counts.scatter_add_(1, argmax, torch.ones_like(argmax))


def pinned_position(model, lengths) -> tuple[Tensor, Tensor]:
    """The absolute position each model pins to at the given lengths, and how consistently.

    Args:
        model: a ``RetrievalHead`` ensemble.
        lengths: sequence of (test) lengths.

    Returns:
        ``position`` LongTensor ``[M]``: the most frequent attention argmax (lowest on ties);
        ``fraction`` float64 ``[M]``: the share of ``lengths`` whose argmax is that position.
    """
    counts = attention_argmax_histogram(model, lengths)
    top, position = counts.max(-1)
    return position, top.double() / counts.sum(-1).double()


def position_table_gradient(model, task, seq_lens, batch_size: int = 256, seed: int = 0) -> Tensor:
    """Norm of the loss gradient on each row of the APE table, from one batch at each training length.

    Args:
        model: an APE ``RetrievalHead`` ensemble (M models, table of ``max_len`` rows).
        task: the task (e.g. :class:`~lengthgen_utils.tasks.FixedOffsetRetrieval`).
        seq_lens: the lengths to draw batches at (e.g. every training length).
        batch_size: sequences per batch.
        seed: seeds the batches.

    Returns:
        float64 tensor ``[M, max_len]``: ``||d loss / d p_t||`` per row (0 exactly
        for every row no batch reaches), on CPU. The model's ``.grad`` fields are
        left as they were.

    Raises:
        TypeError: the model has no APE table.
    """
    from .training import as_task_list, batch_targets, ensemble_cross_entropy

    if getattr(model, "ape", None) is None:
        raise TypeError(f"model must have a learned APE table (pe='ape'); got pe={model.config.pe!r}")
    seq_lens = check_int_sequence("seq_lens", seq_lens, minimum=2)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    tasks = as_task_list(task, model.n_models)
    gen = torch.Generator().manual_seed(check_int("seed", seed, minimum=0))
    weight = model.ape.weight
    total = torch.zeros_like(weight)
    for seq_len in seq_lens:
        tokens, _ = tasks[0].sample(batch_size, seq_len, gen, device=model.device)
        logits, _ = model(tokens)
        loss = ensemble_cross_entropy(logits, batch_targets(tasks, tokens)).sum()
        (grad,) = torch.autograd.grad(loss, weight)
        total += grad
    return total.norm(dim=-1).double().cpu()


@torch.no_grad()
def table_drift(model, initial) -> Tensor:
    """How far each APE row moved from its initial value: ``max_c |p_t[c] - p0_t[c]|``.

    Args:
        model, initial: two APE ``RetrievalHead`` ensembles of the same shape
            (e.g. after and before training).

    Returns:
        float64 tensor ``[M, max_len]``, on CPU (exactly 0 for a row training never changed).

    Raises:
        TypeError: either model has no APE table. ValueError: the tables' shapes differ.
    """
    for name, m in (("model", model), ("initial", initial)):
        if getattr(m, "ape", None) is None:
            raise TypeError(f"{name} must have a learned APE table (pe='ape')")
    a, b = model.ape.weight, initial.ape.weight
    if a.shape != b.shape:
        raise ValueError(f"APE tables differ in shape: model {tuple(a.shape)}, initial {tuple(b.shape)}")
    return (a.detach().cpu().double() - b.detach().cpu().double()).abs().amax(-1)


@torch.no_grad()
def query_similarity(model, positions, reference_position: int) -> Tensor:
    """Cosine similarity between the query at each position and the query at ``reference_position``.

    Used to see what a query at a position never seen in training computes:
    for APE its table row is still at initialization, so its query is close
    to ``W_Q^T u``.

    Args:
        model: a ``RetrievalHead`` ensemble.
        positions: sequence of absolute positions (within the APE table for APE).
        reference_position: an absolute position (e.g. the training query position ``L_train - 1``).

    Returns:
        float64 tensor ``[M, len(positions)]`` of cosines in [-1, 1], on CPU.
    """
    positions = check_int_sequence("positions", positions, minimum=0)
    reference_position = check_int("reference_position", reference_position, minimum=0)
    q, _ = position_queries_keys(model, torch.tensor((reference_position, *positions)))
    q = q.double()
    return torch.nn.functional.cosine_similarity(q[:, 1:], q[:, :1], dim=-1).cpu()
