"""Closed forms the book tests against its trained models.

Sources: DESIGN.md "Key identities" (our reconstruction of the paper's
attention-dilution law, arXiv 2607.18759 abstract); log-length logit scaling
as in Chiang & Cholak 2022 and scalable softmax (Nakanishi 2025).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ._validate import check_int, check_int_sequence, check_positive_float

# --- dilution (chapter 5)


def _check_kernel(kernel) -> Tensor:
    if not isinstance(kernel, Tensor) or not kernel.dtype.is_floating_point:
        raise TypeError(f"kernel must be a floating torch.Tensor [M, n_distances]; got {getattr(kernel, 'dtype', type(kernel).__name__)}")
    if kernel.dim() != 2:
        raise ValueError(f"kernel must have shape [M, n_distances]; got {tuple(kernel.shape)}")
    return kernel


def exact_target_mass(kernel: Tensor, offset, lengths, logit_scale=None) -> Tensor:
    """Target attention mass at each length, from the offset kernel alone.

    ``p(L) = 1 / (1 + sum_{D != -k, -(L-1) <= D <= 0} exp(c_L (s(D) - s(-k))))``. For a
    RoPE head the logits depend on the offset only, so this is exact given ``s``.

    Args:
        kernel: ``[M, n]`` logits by *distance*: column ``d`` holds ``s(D = -d)``, ``d = 0 .. n-1``.
        offset: the target offset k (an int, or a sequence of M ints, one per model).
        lengths: sequence lengths L, each with ``offset + 2 <= L <= n``.
        logit_scale: None (``c_L = 1``) or one positive factor per length (e.g. :func:`log_length_scale`).

    Returns:
        float64 ``[M, len(lengths)]`` in (0, 1].

    Raises:
        ValueError / TypeError: bad shapes, a length longer than the kernel or too short for the offset.
    """
    kernel = _check_kernel(kernel).double()
    m, n = kernel.shape
    offsets = torch.tensor([check_int("offset", offset, minimum=1)] * m if isinstance(offset, int) and not isinstance(offset, bool)
                           else list(check_int_sequence("offset", offset, minimum=1)))
    if offsets.numel() != m:
        raise ValueError(f"offset must be one int or {m} ints (one per model); got {offsets.numel()}")
    lengths = check_int_sequence("lengths", lengths, minimum=2)
    scales = [1.0] * len(lengths) if logit_scale is None else [check_positive_float("logit_scale", c) for c in logit_scale]
    if len(scales) != len(lengths):
        raise ValueError(f"logit_scale must have one entry per length ({len(lengths)}); got {len(scales)}")
    out = torch.empty(m, len(lengths), dtype=torch.float64)
    for col, (seq_len, c) in enumerate(zip(lengths, scales)):
        if seq_len > n or seq_len < int(offsets.max()) + 2:
            raise ValueError(f"lengths[{col}]={seq_len} must lie in [{int(offsets.max()) + 2}, {n}] (kernel has {n} distances)")
        logits = c * kernel[:, :seq_len]
        out[:, col] = logits.softmax(-1)[torch.arange(m), offsets]
    return out


def mean_field_target_mass(lengths, margin, rho) -> Tensor:
    """The mean-field dilution law ``p(L) = 1 / (1 + (L - 2) rho exp(-margin))``.

    ``L - 2`` distractors (every key but the target and the query) each get,
    on average, ``rho exp(-margin)`` of the target's weight. Then
    ``1/p - 1 = (L - 2) rho exp(-margin)`` is linear in L.

    Args:
        lengths: sequence lengths ``[n]`` (ints >= 2).
        margin: ``[M]`` or float, nats (target logit minus the largest distractor logit).
        rho: ``[M]`` or float > 0, mean distractor weight relative to the largest one.

    Returns:
        float64 ``[M, n]`` (or ``[1, n]`` for scalar parameters).

    Source: DESIGN.md claim C5 (our reconstruction of the paper's dilution law).
    """
    lengths = torch.tensor(check_int_sequence("lengths", lengths, minimum=2), dtype=torch.float64)
    margin = torch.as_tensor(margin, dtype=torch.float64).reshape(-1, 1)
    rho = torch.as_tensor(rho, dtype=torch.float64).reshape(-1, 1)
    if (rho <= 0).any() or not torch.isfinite(rho).all() or not torch.isfinite(margin).all():
        raise ValueError(f"rho must be finite and > 0 and margin finite; got rho={rho.flatten().tolist()}, margin={margin.flatten().tolist()}")
    return 1.0 / (1.0 + (lengths[None, :] - 2) * rho * torch.exp(-margin))


def mean_field_parameters(kernel: Tensor, offset, train_len: int) -> tuple[Tensor, Tensor]:
    """Margin ``m`` and mean distractor weight ``rho`` measured inside the training window.

    ``m = s(-k) - max_{d != k, d < train_len} s(-d)`` and
    ``rho = mean_{d != k, d < train_len} exp(s(-d) - max)`` over the ``train_len - 1``
    distractors, with the normalisation chosen so that the law reproduces the exact
    ``1/p - 1`` at ``L = train_len``: ``(train_len - 2) rho e^{-m} = sum_{d != k} e^{s(-d) - s(-k)}``.

    Args:
        kernel: ``[M, n]`` logits by distance (see :func:`exact_target_mass`), ``n >= train_len``.
        offset: the target offset (int or M ints).
        train_len: the training length.

    Returns:
        ``(margin [M], rho [M])`` float64.
    """
    kernel = _check_kernel(kernel).double()
    m, n = kernel.shape
    train_len = check_int("train_len", train_len, minimum=3, maximum=n)
    offsets = [offset] * m if isinstance(offset, int) else list(offset)
    margins, rhos = torch.empty(m, dtype=torch.float64), torch.empty(m, dtype=torch.float64)
    for i, k in enumerate(offsets):
        k = check_int("offset", k, minimum=1, maximum=train_len - 2)
        window = kernel[i, :train_len]
        distractors = torch.cat([window[:k], window[k + 1:]])
        top = distractors.max()
        margins[i] = window[k] - top
        rhos[i] = torch.exp(distractors - top).sum() / (train_len - 2)
    return margins, rhos


def critical_target_mass(value_table: Tensor) -> Tensor:
    """The smallest target mass at which the mean-field readout is still always right.

    With attention ``p`` on the target ``y`` and the rest spread thinly over many
    uniform random tokens, the class logits tend to ``p T[y] + (1 - p) mu`` with
    ``T`` the per-token value table and ``mu`` its mean row. The readout picks
    ``y`` over ``c`` iff ``p g_yc + (1 - p) h_yc > 0`` with ``g_yc = T[y,y] - T[y,c]``
    and ``h_yc = mu_y - mu_c``, so errors begin once ``p`` falls below
    ``p* = max_{y, c != y} max(0, -h_yc / (g_yc - h_yc))``.

    Args:
        value_table: ``[M, V, V]`` class logits of each content token (rows: input token,
            columns: class), e.g. ``model.value_table()[:, :V]``.

    Returns:
        float64 ``[M]`` in [0, 1].

    Raises:
        ValueError: not ``[M, V, V]``, or some token does not favour its own class (``g <= h``).
    """
    if not isinstance(value_table, Tensor) or value_table.dim() != 3 or value_table.shape[1] != value_table.shape[2]:
        raise ValueError(f"value_table must be a tensor [M, V, V]; got {getattr(value_table, 'shape', type(value_table).__name__)}")
    t = value_table.double()
    mu = t.mean(1)  # [M, V]
    diag = torch.diagonal(t, dim1=1, dim2=2)  # [M, V]
    g = diag[:, :, None] - t  # [M, y, c]
    h = mu[:, :, None] - mu[:, None, :]
    eye = torch.eye(t.shape[1], dtype=torch.bool)
    denom = (g - h).masked_fill(eye, 1.0)
    if (denom <= 0).any():
        raise ValueError("value_table has a token whose own class does not beat another at full attention (g <= h)")
    ratio = (-h / denom).clamp_min(0.0).masked_fill(eye, 0.0)
    return ratio.flatten(1).max(1).values


def critical_length(p_star: Tensor, margin: Tensor, rho: Tensor) -> Tensor:
    """Length at which the mean-field law reaches ``p*``: ``L* = 2 + (1/p* - 1) e^m / rho``.

    Returns float64 ``[M]`` (``inf`` where ``p* = 0``: the mean-field readout never errs).
    """
    p_star, margin, rho = (torch.as_tensor(x, dtype=torch.float64) for x in (p_star, margin, rho))
    return 2 + (1 / p_star - 1) * torch.exp(margin) / rho


def log_length_scale(lengths, train_len: int) -> list[float]:
    """Length-aware logit scale ``c_L = log L / log train_len`` (1 at the training length).

    Multiplying logits by ``c log L`` keeps a fixed margin ``m`` worth
    ``L^{c m}`` against ``L`` distractors, the idea of log-length scaling
    (Chiang & Cholak 2022) and scalable softmax (Nakanishi 2025).
    """
    lengths = check_int_sequence("lengths", lengths, minimum=2)
    train_len = check_int("train_len", train_len, minimum=2)
    return [math.log(L) / math.log(train_len) for L in lengths]


def distractor_ratio(kernel: Tensor, offset) -> Tensor:
    """``1/p(L) - 1 = sum_{d != k, d < L} exp(s(-d) - s(-k))`` for every length ``L = 1 .. n`` at once.

    Args:
        kernel: ``[M, n]`` logits by distance (see :func:`exact_target_mass`).
        offset: the target offset k (int or M ints), ``k <= n - 2``.

    Returns:
        float64 ``[M, n]``; column ``L - 1`` is the ratio at length ``L`` (meaningful for ``L >= k + 2``).
    """
    kernel = _check_kernel(kernel).double()
    m, n = kernel.shape
    ks = [offset] * m if isinstance(offset, int) else list(offset)
    if len(ks) != m:
        raise ValueError(f"offset must be one int or {m} ints; got {len(ks)}")
    ks = torch.tensor([check_int("offset", k, minimum=1, maximum=n - 2) for k in ks])
    rows = torch.arange(m)
    weights = torch.exp(kernel - kernel[rows, ks][:, None])
    weights[rows, ks] = 0.0
    return weights.cumsum(1)


def linear_fit(x, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Least-squares line ``y ~ a x + b`` per row, with its coefficient of determination.

    Args:
        x: ``[n]`` abscissae (e.g. lengths), at least 3 distinct values.
        y: ``[M, n]`` values.

    Returns:
        ``(slope [M], intercept [M], r2 [M])`` float64; ``r2 = 1 - SS_res / SS_tot``.

    Raises:
        ValueError: shapes differ, fewer than 3 points, or a row of ``y`` is constant.
    """
    x = torch.as_tensor(x, dtype=torch.float64)
    y = torch.as_tensor(y, dtype=torch.float64)
    if y.dim() != 2 or x.dim() != 1 or y.shape[1] != x.shape[0] or x.shape[0] < 3:
        raise ValueError(f"need x [n >= 3] and y [M, n]; got x {tuple(x.shape)}, y {tuple(y.shape)}")
    xc = x - x.mean()
    yc = y - y.mean(1, keepdim=True)
    ss_tot = (yc ** 2).sum(1)
    if (ss_tot == 0).any():
        raise ValueError("a row of y is constant: R^2 is undefined")
    slope = (yc * xc).sum(1) / (xc ** 2).sum()
    intercept = y.mean(1) - slope * x.mean()
    resid = y - (slope[:, None] * x[None, :] + intercept[:, None])
    return slope, intercept, 1 - (resid ** 2).sum(1) / ss_tot
