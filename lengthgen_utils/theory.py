"""Closed forms the book tests against its trained models.

Sources: DESIGN.md "Key identities" (our reconstruction of the paper's
attention-dilution law, arXiv 2607.18759 abstract); log-length logit scaling
as in Chiang & Cholak 2022 and scalable softmax (Nakanishi 2025); the
minimum-norm interpolant of gradient descent (chapter 6). Each section
belongs to one chapter and is self-contained.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ._validate import check_int, check_int_sequence, check_positive_float
from .positional import rope_inverse_frequencies

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


# --- min-norm interpolant (chapter 6)
#
# Without a softmax, a position-only RoPE head's attention weight on the key at
# offset D = j - (L-1) (key minus query, D <= 0) is the offset kernel
#
#     s(D) = Phi(D) . c,   Phi(D) = [cos(theta_1 D) .. cos(theta_n D), sin(theta_1 D) .. sin(theta_n D)],
#
# with n = d_head/2 RoPE frequencies theta_i and c = (a, b) in R^{d_head}
# (DESIGN.md, "Key identities"; channel order = the half-split RoPE pairing).
# Fitting the retrieval task with one-hot values and a squared loss asks for
# s = 1 at D = -k and s = 0 at every other trained offset: Phi_T c = e_k. The
# features are linear in c, so every gradient lies in the row space of Phi_T;
# gradient descent from c = 0 therefore converges to the minimum-norm
# interpolant c* = pinv(Phi_T) e_k (e.g. Gunasekar et al. 2018; Bartlett et al.
# 2020, "benign overfitting", for the general linear-regression statement).


def _check_offsets(name: str, offsets) -> Tensor:
    if isinstance(offsets, Tensor):
        if offsets.dtype.is_floating_point or offsets.dtype.is_complex or offsets.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers; got dtype {offsets.dtype}")
        offsets = offsets.to(torch.long).flatten()
    else:
        offsets = torch.tensor([check_int(f"{name}[{i}]", d) for i, d in enumerate(offsets)], dtype=torch.long)
    if offsets.numel() == 0:
        raise ValueError(f"{name} must not be empty")
    return offsets


def kernel_frequencies(d_head: int, base: float = 10000.0, frequencies=None) -> Tensor:
    """The frequencies ``theta [d_head // 2]`` (float64, radians per token) of an offset kernel.

    RoPE's ``base ** (-2i / d_head)`` unless ``frequencies`` is given explicitly (a
    non-RoPE, e.g. evenly spread, set for the well-conditioned variant of chapter 6).

    Raises:
        ValueError: odd ``d_head``, ``base <= 1``, or ``frequencies`` not ``d_head // 2`` finite numbers.
    """
    theta = rope_inverse_frequencies(d_head, base)
    if frequencies is None:
        return theta
    freq = torch.as_tensor(frequencies, dtype=torch.float64).flatten()
    if freq.shape != theta.shape or not torch.isfinite(freq).all():
        raise ValueError(f"frequencies must be d_head // 2 = {theta.numel()} finite numbers; got {frequencies!r}")
    return freq


def rope_kernel_features(offsets, d_head: int, base: float = 10000.0, frequencies=None) -> Tensor:
    """The RoPE offset features ``Phi(D) = [cos(theta_i D)]_i ++ [sin(theta_i D)]_i``.

    Args:
        offsets: integer offsets D (key position minus query position), a list or an integer tensor ``[n]``.
        d_head: even head dimension (``d_head // 2`` frequencies).
        base: RoPE base.
        frequencies: optional explicit ``theta [d_head // 2]`` replacing RoPE's (see :func:`kernel_frequencies`).

    Returns:
        float64 tensor ``[n, d_head]``: row ``D`` gives ``s(D) = Phi(D) . c``.

    Raises:
        TypeError / ValueError: non-integer or empty offsets, odd ``d_head``, ``base <= 1``.

    Source: Su et al. 2021 (RoFormer), eq. (34), written as a function of the offset.
    """
    offsets = _check_offsets("offsets", offsets)
    theta = kernel_frequencies(d_head, base, frequencies)
    angles = offsets.to(torch.float64)[:, None] * theta
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def rope_kernel_coefficients(q: Tensor, k: Tensor, interleaved: bool = False) -> Tensor:
    """Kernel coefficients ``c = (a, b)`` of an unrotated query/key pair: ``q^T R_D k = Phi(D) . c``.

    For each RoPE channel pair ``(x1, x2)`` rotated by ``R(phi)``,
    ``q^T R(phi) k = cos(phi) (q1 k1 + q2 k2) + sin(phi) (q2 k1 - q1 k2)``, so
    ``a_i = q1 k1 + q2 k2`` and ``b_i = q2 k1 - q1 k2``.

    Args:
        q, k: ``[..., d_head]`` query and key *before* rotation (position 0).
        interleaved: the channel pairing used by the model.

    Returns:
        ``[..., d_head]`` in the order of :func:`rope_kernel_features` (all ``a``, then all ``b``).
        Divide by ``sqrt(d_head)`` for a head that scales its logits.

    Raises:
        TypeError / ValueError: non-float tensors, mismatched shapes or an odd last dimension.
    """
    for name, x in (("q", q), ("k", k)):
        if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor [..., d_head]; got {type(x).__name__}")
    if q.shape != k.shape or q.shape[-1] % 2:
        raise ValueError(f"q and k must have the same shape [..., d_head] with d_head even; "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if interleaved:
        q1, q2, k1, k2 = q[..., 0::2], q[..., 1::2], k[..., 0::2], k[..., 1::2]
    else:
        h = q.shape[-1] // 2
        q1, q2, k1, k2 = q[..., :h], q[..., h:], k[..., :h], k[..., h:]
    return torch.cat([q1 * k1 + q2 * k2, q2 * k1 - q1 * k2], dim=-1)


def training_offsets(train_len: int, offset: int) -> Tensor:
    """The offsets T that carry a loss in training at lengths up to ``train_len``: ``-(train_len-1) .. -1``.

    The query itself (D = 0) is excluded: its value (the query token) is not a
    content token, so its weight never enters the readout.

    Raises:
        ValueError: ``train_len < offset + 2``.
    """
    offset = check_int("offset", offset, minimum=1)
    train_len = check_int("train_len", train_len, minimum=offset + 2)
    return torch.arange(-(train_len - 1), 0)


def min_norm_interpolant(train_offsets, target_offset: int, d_head: int, base: float = 10000.0,
                         rcond: float = 1e-15, frequencies=None) -> Tensor:
    """The minimum-norm kernel ``c* = pinv(Phi_T) e_k`` with ``s(-k) = 1`` and ``s(D) = 0`` on the rest of T.

    Args:
        train_offsets: the trained offsets T (integers, e.g. :func:`training_offsets`); must contain ``-target_offset``.
        target_offset: k >= 1; the kernel should select ``D = -k``.
        d_head: even head dimension; ``c*`` has ``d_head`` entries.
        base: RoPE base.
        rcond: singular values below ``rcond * sigma_max`` are treated as zero (as in ``numpy.linalg.pinv``);
            ``1e-15`` is float64 precision, i.e. the exact pseudo-inverse.
        frequencies: optional explicit frequencies (see :func:`kernel_frequencies`).

    Returns:
        float64 ``[d_head]``: the minimum-norm (least-squares, if no exact solution exists) ``c``.

    Raises:
        ValueError: ``-target_offset`` not in ``train_offsets``, or a bad size/base.

    Source: the pseudo-inverse solution of an underdetermined linear system (Penrose 1955);
    its selection by gradient descent from zero, e.g. Gunasekar et al. 2018.
    """
    offsets = _check_offsets("train_offsets", train_offsets)
    target_offset = check_int("target_offset", target_offset, minimum=1)
    rcond = check_positive_float("rcond", rcond)
    if not (offsets == -target_offset).any():
        raise ValueError(f"train_offsets must contain -target_offset = {-target_offset}; got {offsets.tolist()}")
    phi = rope_kernel_features(offsets, d_head, base, frequencies)
    target = (offsets == -target_offset).to(torch.float64)
    return torch.linalg.pinv(phi, rtol=rcond) @ target


def squared_loss_quadratic(train_len: int, offset: int, vocab_size: int, d_head: int,
                           base: float = 10000.0, frequencies=None) -> tuple[Tensor, Tensor, float]:
    """The expected squared loss of the direct kernel head as a quadratic ``J(c) = c^T H c - 2 b^T c + z``.

    Model (:class:`~lengthgen_utils.models.KernelHead`): output ``o = sum_j s(D_j) e(x_j)``
    with one-hot values ``e`` over the V content tokens; loss ``||o - e(y)||^2``. With
    tokens i.i.d. uniform, ``E||o - e(y)||^2 = r^T A r`` where ``r = s - e_k`` on the
    content offsets of the sequence and ``A = (1 - 1/V) I + (1/V) 1 1^T``. Averaging over
    training lengths ``L`` uniform in ``offset+2 .. train_len`` (the sampler of
    :func:`~lengthgen_utils.training.train`) gives ``H = E_L[Phi_L^T A Phi_L]``,
    ``b = E_L[Phi_L^T A e_k]`` and ``z = E_L[e_k^T A e_k] = 1``.

    Returns:
        ``H [d_head, d_head]``, ``b [d_head]`` (float64) and the constant ``z``.
    """
    offset = check_int("offset", offset, minimum=1)
    train_len = check_int("train_len", train_len, minimum=offset + 2)
    vocab_size = check_int("vocab_size", vocab_size, minimum=2)
    lengths = range(offset + 2, train_len + 1)
    h = torch.zeros(d_head, d_head, dtype=torch.float64)
    b = torch.zeros(d_head, dtype=torch.float64)
    for seq_len in lengths:
        offs = torch.arange(-(seq_len - 1), 0)
        phi = rope_kernel_features(offs, d_head, base, frequencies)
        e = (offs == -offset).to(torch.float64)
        a = (1 - 1 / vocab_size) * torch.eye(len(offs), dtype=torch.float64) + 1 / vocab_size
        h += phi.T @ a @ phi
        b += phi.T @ a @ e
    return h / len(lengths), b / len(lengths), 1.0


def gradient_descent_kernel(h: Tensor, b: Tensor, lr: float, steps: int) -> Tensor:
    """Closed form of ``steps`` steps of gradient descent on ``J(c) = c^T H c - 2 b^T c`` from ``c = 0``.

    ``c_{t+1} = c_t - lr * 2 (H c_t - b)`` gives, in the eigenbasis ``H = U diag(lambda) U^T``,
    ``c_t = sum_i [1 - (1 - 2 lr lambda_i)^t] / lambda_i * (u_i . b) u_i``. Directions with
    ``2 lr lambda_i t >> 1`` are fitted, directions with ``2 lr lambda_i t << 1`` are still at 0;
    as ``t -> inf`` (and ``2 lr lambda_max < 2``) ``c_t`` tends to the minimum-norm minimiser.

    Args:
        h: symmetric positive semi-definite ``[d, d]``; b: ``[d]`` in the range of ``h``.
        lr: step size > 0 (stable for ``lr * lambda_max < 1``).
        steps: number of steps >= 0.

    Returns:
        float64 ``[d]``.

    Raises:
        ValueError: shapes do not match, or ``lr * lambda_max >= 1`` (the iteration diverges).
    """
    lr = check_positive_float("lr", lr)
    steps = check_int("steps", steps, minimum=0)
    if h.dim() != 2 or h.shape[0] != h.shape[1] or b.shape != h.shape[:1]:
        raise ValueError(f"h must be [d, d] and b [d]; got h {tuple(h.shape)}, b {tuple(b.shape)}")
    lam, u = torch.linalg.eigh(h.to(torch.float64))
    if lr * float(lam.max()) >= 1:
        raise ValueError(f"lr={lr} is too large: lr * lambda_max = {lr * float(lam.max()):.3g} must be < 1")
    proj = u.T @ b.to(torch.float64)
    # gain_i = [1 - (1 - 2 lr lambda_i)^t] / lambda_i, written without cancellation; its lambda -> 0 limit is 2 lr t
    x = 2 * lr * lam
    tiny = x.abs() < 1e-300
    safe = torch.where(tiny, torch.ones_like(lam), lam)
    gain = torch.where(tiny, torch.full_like(lam, 2 * lr * steps), -torch.expm1(steps * torch.log1p(-x)) / safe)
    return u @ (gain * proj)


def expected_squared_error(kernel: Tensor, offset: int, vocab_size: int) -> Tensor:
    """Expected squared loss ``E||o - e(y)||^2`` of a linear one-hot readout at one length.

    Args:
        kernel: ``[..., L]`` attention weights ``s_j`` over positions ``j = 0 .. L-1`` (the last is the
            query, whose value is zero and which therefore does not count).
        offset: k; the target sits at position ``L-1-k``.
        vocab_size: V.

    Returns:
        ``[...]``: ``(1 - 1/V) sum_j r_j^2 + (1/V) (sum_j r_j)^2`` with ``r = s - e_k`` over content positions.
    """
    offset = check_int("offset", offset, minimum=1)
    vocab_size = check_int("vocab_size", vocab_size, minimum=2)
    seq_len = kernel.shape[-1]
    if offset > seq_len - 2:
        raise ValueError(f"offset must be <= seq_len - 2 = {seq_len - 2}; got offset={offset}")
    r = kernel[..., :-1].clone()
    r[..., seq_len - 1 - offset] -= 1
    return (1 - 1 / vocab_size) * (r ** 2).sum(-1) + (r.sum(-1) ** 2) / vocab_size


def cosine_similarity(x: Tensor, y: Tensor) -> Tensor:
    """Cosine similarity of kernels along the last dimension (float64): ``x.y / (|x| |y|)``."""
    x, y = x.to(torch.float64), y.to(torch.float64)
    return (x * y).sum(-1) / (x.norm(dim=-1) * y.norm(dim=-1))


def linear_noise_ratio(kernel: Tensor, offset: int) -> Tensor:
    """Scale-free noise of a linear readout: ``sum_{j != target} s_j^2 / s_target^2`` over content positions.

    With i.i.d. uniform tokens each distractor adds ``s_j`` to a random class, so this
    ratio is the variance of the class noise relative to the target's signal (up to
    the factor ``1/V``). For a kernel that is 0 on every non-target offset it is 0;
    it grows without bound with ``L`` when ``s`` does not vanish off the training window.

    Args:
        kernel: ``[..., L]`` weights over positions ``0 .. L-1`` (the last is the query, not counted).
        offset: k <= L - 2.

    Returns:
        ``[...]`` float64.
    """
    offset = check_int("offset", offset, minimum=1)
    seq_len = kernel.shape[-1]
    if offset > seq_len - 2:
        raise ValueError(f"offset must be <= seq_len - 2 = {seq_len - 2}; got offset={offset}")
    s = kernel[..., :-1].to(torch.float64)
    target = s[..., seq_len - 1 - offset]
    return ((s ** 2).sum(-1) - target ** 2) / target ** 2
