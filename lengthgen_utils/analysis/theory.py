"""Closed forms the book tests against its trained models.

Kernels are ``[M, n]`` tensors in the row layout of :mod:`~lengthgen_utils.analysis.kernel`: column ``j``
holds ``s(D = j - (n-1))``, the target ``D = -k`` is column ``n-1-k``, and the keys a query sees at
length ``L`` are the last ``L`` columns.

Sources: the paper's attention-dilution law (arXiv 2607.18759, abstract), in the book's
reconstruction (chapter 5); log-length logit scaling as in Chiang & Cholak 2022 and scalable
softmax (Nakanishi 2025); the minimum-norm interpolant of gradient descent (chapter 6). Each
section belongs to one chapter and is self-contained.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validate import (
    check_int,
    check_int_sequence,
    check_nonempty,
    check_positive_float,
    per_model_ints,
)
from ..core.rope import check_relative_positions, rope_kernel_features

# --- dilution (chapter 5)


def _check_kernel(kernel) -> Tensor:
    if not isinstance(kernel, Tensor) or not kernel.dtype.is_floating_point:
        raise TypeError(f"kernel must be a floating torch.Tensor [M, n] (row layout); "
                        f"got {getattr(kernel, 'dtype', type(kernel).__name__)}")
    if kernel.dim() != 2:
        raise ValueError(f"kernel must have shape [M, n] (row layout); got {tuple(kernel.shape)}")
    if not bool(torch.isfinite(kernel).all()):  # a NaN or inf logit makes every closed form NaN, silently
        raise ValueError(f"kernel must hold finite logits; got {int((~torch.isfinite(kernel)).sum())} NaN or inf "
                         "entries")
    return kernel.double()


def exact_target_mass(kernel: Tensor, offset, lengths, logit_scale=None) -> Tensor:
    """Target attention mass at each length, from the offset kernel alone.

    ``p(L) = 1 / (1 + sum_{D != -k, -(L-1) <= D <= 0} exp(c_L (s(D) - s(-k))))``. For a
    RoPE head the logits depend on the offset only, so this is exact given ``s``.

    Args:
        kernel: ``[M, n]`` logits in the row layout (column ``j`` holds ``s(D = j - (n-1))``).
        offset: the target offset k (an int, or M ints, one per model).
        lengths: sequence lengths L, each with ``offset + 2 <= L <= n``.
        logit_scale: None (``c_L = 1``) or one positive factor per length (e.g. :func:`log_length_scale`).

    Returns:
        float64 ``[M, len(lengths)]`` in (0, 1].

    Raises:
        ValueError / TypeError: bad shapes, a NaN or inf logit, a length longer than the kernel or too short
            for the offset.
    """
    kernel = _check_kernel(kernel)
    m, n = kernel.shape
    ks = torch.tensor(per_model_ints("offset", offset, m, minimum=1))
    lengths = check_int_sequence("lengths", lengths, minimum=2)
    scales = [1.0] * len(lengths) if logit_scale is None else [check_positive_float("logit_scale", c) for c in logit_scale]
    if len(scales) != len(lengths):
        raise ValueError(f"logit_scale must have one entry per length ({len(lengths)}); got {len(scales)}")
    out = torch.empty(m, len(lengths), dtype=torch.float64)
    for col, (seq_len, c) in enumerate(zip(lengths, scales)):
        if seq_len > n or seq_len < int(ks.max()) + 2:
            raise ValueError(f"lengths[{col}]={seq_len} must lie in [{int(ks.max()) + 2}, {n}] (kernel has {n} columns)")
        out[:, col] = (c * kernel[:, n - seq_len:]).softmax(-1)[torch.arange(m), seq_len - 1 - ks]
    return out


def mean_field_parameters(kernel: Tensor, offset, train_len: int) -> tuple[Tensor, Tensor]:
    """Margin ``m`` and mean distractor weight ``rho`` measured inside the training window.

    ``m = s(-k) - max_{d != k, d < train_len} s(-d)`` and
    ``rho = mean_{d != k, d < train_len} exp(s(-d) - max)`` over the ``train_len - 1``
    distractors, with the normalisation chosen so that the law reproduces the exact
    ``1/p - 1`` at ``L = train_len``: ``(train_len - 2) rho e^{-m} = sum_{d != k} e^{s(-d) - s(-k)}``.

    Args:
        kernel: ``[M, n]`` logits in the row layout, ``n >= train_len``.
        offset: the target offset (int or M ints).
        train_len: the training length.

    Returns:
        ``(margin [M], rho [M])`` float64.
    """
    kernel = _check_kernel(kernel)
    m, n = kernel.shape
    train_len = check_int("train_len", train_len, minimum=3, maximum=n)
    ks = per_model_ints("offset", offset, m, minimum=1, maximum=train_len - 2)
    margins, rhos = torch.empty(m, dtype=torch.float64), torch.empty(m, dtype=torch.float64)
    for i, k in enumerate(ks):
        window = kernel[i, n - train_len:]
        target = train_len - 1 - k
        distractors = torch.cat([window[:target], window[target + 1:]])
        top = distractors.max()
        margins[i] = window[target] - top
        rhos[i] = torch.exp(distractors - top).sum() / (train_len - 2)
    return margins, rhos


def critical_target_mass(value_table: Tensor, undefined: str = "raise") -> Tensor:
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
        undefined: what a model gets whose readout is wrong for some token even at full attention on it
            (``g <= h``: no target mass is enough, so ``p*`` does not exist): ``"raise"`` (a ``ValueError``)
            or ``"nan"`` (NaN for that model, the others computed).

    Returns:
        float64 ``[M]`` in [0, 1] (NaN where undefined, with ``undefined="nan"``).

    Raises:
        ValueError: not ``[M, V, V]`` with ``M >= 1`` and ``V >= 2``; ``undefined`` not one of the two; with
            ``undefined="raise"``, some token does not favour its own class (``g <= h``).
    """
    if not isinstance(value_table, Tensor) or value_table.dim() != 3 or value_table.shape[1] != value_table.shape[2]:
        raise ValueError(f"value_table must be a tensor [M, V, V]; got {getattr(value_table, 'shape', type(value_table).__name__)}")
    if value_table.shape[0] < 1 or value_table.shape[1] < 2:
        raise ValueError(f"value_table must be [M, V, V] with M >= 1 and V >= 2 (a readout needs two classes); "
                         f"got {tuple(value_table.shape)}")
    t = value_table.double()
    mu = t.mean(1)  # [M, V]
    diag = torch.diagonal(t, dim1=1, dim2=2)  # [M, V]
    g = diag[:, :, None] - t  # [M, y, c]
    h = mu[:, :, None] - mu[:, None, :]
    eye = torch.eye(t.shape[1], dtype=torch.bool)
    denom = (g - h).masked_fill(eye, 1.0)
    bad = (denom <= 0).flatten(1).any(1)  # [M]
    if undefined not in ("raise", "nan"):
        raise ValueError(f"undefined must be 'raise' or 'nan'; got undefined={undefined!r}")
    if bad.any() and undefined == "raise":
        raise ValueError("value_table has a token whose own class does not beat another at full attention (g <= h)")
    ratio = (-h / denom.clamp_min(1e-300)).clamp_min(0.0).masked_fill(eye, 0.0)
    return ratio.flatten(1).max(1).values.masked_fill(bad, float("nan"))


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
        kernel: ``[M, n]`` logits in the row layout.
        offset: the target offset k (int or M ints), ``k <= n - 2``.

    Returns:
        float64 ``[M, n]``; column ``L - 1`` is the ratio at length ``L`` (meaningful for ``L >= k + 2``).
    """
    kernel = _check_kernel(kernel)
    m, n = kernel.shape
    ks = torch.tensor(per_model_ints("offset", offset, m, minimum=1, maximum=n - 2))
    by_distance = kernel.flip(1)  # a working copy: column d holds s(-d)
    rows = torch.arange(m)
    weights = torch.exp(by_distance - by_distance[rows, ks][:, None])
    weights[rows, ks] = 0.0
    return weights.cumsum(1)


# --- the frequency set: orbits, near-recurrences and the long-run dilution law (chapters 4 and 5)
#
# A RoPE kernel s(D) = sum_i r_i cos(theta_i D - phi_i) sees the integer relative positions D only through the
# phases (theta_i D mod 2 pi)_i. Where two frequencies have a rational ratio, their phases are tied
# for ever: with base 10^4 and d_head 16, theta_i = 10^(-i/2), so theta_i = 10 theta_{i+2} and
# theta_0 D = 10 theta_2 D (mod 2 pi) at every D. The phases then do not fill the 8-torus (Kronecker's
# theorem needs independent frequencies); they run along a lower-dimensional torus, and every average
# over long sequences is an average over that torus.


def _check_theta(theta) -> Tensor:
    theta = torch.as_tensor(theta, dtype=torch.float64).flatten()
    if theta.numel() == 0 or not torch.isfinite(theta).all() or (theta <= 0).any():
        raise ValueError(f"theta must be a non-empty list of finite frequencies > 0 (rad/token); got {theta.tolist()}")
    return theta


def frequency_orbits(theta, max_denominator: int = 12, atol: float = 1e-6) -> list[tuple[float, tuple]]:
    """Group frequencies whose ratios are rational: the independent directions their phases move in.

    Two frequencies are tied when ``theta_a / theta_b = p / q`` with ``q <= max_denominator`` (to
    ``atol`` in ``q theta_a / theta_b``); a group with generator ``omega`` holds pairs with
    ``theta_i = n_i omega`` for integers ``n_i``, so its phases are all functions of one angle
    ``psi = omega D mod 2 pi``. Groups are found pairwise, slowest frequency first. For RoPE sets with
    an integer-power base this finds every rational relation: their ratios are powers of
    ``base^(2 / d_head)``, and (for base ``10^m``) the powers that are not integers are linearly
    independent over the rationals, as are the generators together with ``2 pi``.

    Args:
        theta: frequencies ``[P]`` (rad/token), e.g. :func:`~lengthgen_utils.core.rope.rope_inverse_frequencies`.
        max_denominator: largest ``q`` tried in ``p / q``.
        atol: how close ``q theta_a / theta_b`` must be to an integer.

    Returns:
        ``[(omega, ((i, n_i), ...)), ...]``: one entry per group, members sorted by pair index. With
        base 10^4 and d_head 16: two groups, ``theta_{0,2,4,6} = (1000, 100, 10, 1) theta_6`` and
        ``theta_{1,3,5,7} = (1000, 100, 10, 1) theta_7``.

    Raises:
        ValueError: frequencies not finite and positive; bad ``max_denominator`` or ``atol``.

    Source: chapter 4, "Aliases come from the frequency set"; Kronecker's theorem (e.g. Hardy & Wright,
    ch. 23) applies to the generators, not to the raw frequencies.
    """
    theta = _check_theta(theta)  # float64 [P]
    max_denominator = check_int("max_denominator", max_denominator, minimum=1)
    atol = check_positive_float("atol", atol)
    groups: list[list] = []  # [omega, {index: multiplier}]
    for i in theta.argsort().tolist():
        for group in groups:
            ratio = float(theta[i]) / group[0]
            q = next((q for q in range(1, max_denominator + 1) if abs(q * ratio - round(q * ratio)) <= atol), None)
            if q is not None:
                group[0] /= q
                group[1] = {j: n * q for j, n in group[1].items()}
                group[1][i] = round(q * ratio)
                break
        else:
            groups.append([float(theta[i]), {i: 1}])
    return [(omega, tuple(sorted(members.items()))) for omega, members in groups]


def _spectrum(r, phi, theta) -> tuple[Tensor, Tensor, Tensor]:
    theta = _check_theta(theta)
    r = torch.as_tensor(r, dtype=torch.float64)
    phi = torch.as_tensor(phi, dtype=torch.float64)
    r, phi = (x[None] if x.dim() == 1 else x for x in (r, phi))
    if r.dim() != 2 or r.shape != phi.shape or r.shape[1] != theta.numel():
        raise ValueError(f"r and phi must both be [M, P] with P = len(theta) = {theta.numel()}; "
                         f"got r {tuple(r.shape)}, phi {tuple(phi.shape)}")
    if not (torch.isfinite(r).all() and torch.isfinite(phi).all()) or (r < 0).any():
        raise ValueError("r must be finite and >= 0 and phi finite")
    return r, phi, theta


def _orbits(orbits, theta: Tensor) -> list:
    """The orbit groups of checked frequencies: :func:`frequency_orbits` by default, else ``orbits`` if they
    hold every pair index exactly once."""
    if orbits is None:
        return frequency_orbits(theta)
    covered = sorted(i for _, members in orbits for i, _ in members)
    if covered != list(range(theta.numel())):
        raise ValueError(f"orbits must hold every pair index 0..{theta.numel() - 1} exactly once; got {covered}")
    return orbits


def orbit_log_stats(r, phi, theta, orbits=None, grid: int | None = None) -> tuple[Tensor, Tensor]:
    """``log`` of the orbit average and of the orbit maximum of ``exp(s)``: two float64 ``[M]``, from one
    quadrature (see :func:`orbit_log_mean_exp` and :func:`orbit_peakiness`, which return one each)."""
    r, phi, theta = _spectrum(r, phi, theta)  # [M, P], [M, P], [P]
    orbits = _orbits(orbits, theta)
    grid = None if grid is None else check_int("grid", grid, minimum=8)  # None: enough points for the largest
    # multiplier and amplitude, at least 256
    log_mean = torch.zeros(r.shape[0], dtype=torch.float64)
    log_max = torch.zeros(r.shape[0], dtype=torch.float64)
    for _, members in orbits:
        idx = torch.tensor([i for i, _ in members])
        mult = torch.tensor([n for _, n in members], dtype=torch.float64)
        amp = float(r[:, idx].max())
        # the integrand's harmonics above n_max (r + 6 sqrt(r) + 10) carry less than e^-18 of its mean
        points = grid if grid is not None else 1 << math.ceil(math.log2(
            max(256.0, float(mult.max()) * (amp + 6 * math.sqrt(amp) + 10))))
        psi = torch.arange(points, dtype=torch.float64) * (2 * math.pi / points)
        for chunk in torch.arange(r.shape[0]).split(max(1, 2 ** 22 // points)):
            arg = (r[chunk][:, idx][:, :, None] * torch.cos(mult[None, :, None] * psi[None, None, :]
                                                             - phi[chunk][:, idx][:, :, None])).sum(1)
            log_mean[chunk] += torch.logsumexp(arg, -1) - math.log(points)
            log_max[chunk] += arg.amax(-1)
    return log_mean, log_max


def orbit_log_mean_exp(r, phi, theta, orbits=None, grid: int | None = None) -> Tensor:
    """``log`` of the long-run average of ``exp(s(D))`` over the integer offsets, for the orbit the phases follow.

    ``s(D) = sum_i r_i cos(theta_i D - phi_i)``. Along the integers, each orbit group of
    :func:`frequency_orbits` is driven by one angle ``psi_g = omega_g D`` and the groups (with ``2 pi``) are
    rationally independent, so by Weyl's equidistribution theorem

        lim_{N -> inf} (1/N) sum_{D} exp(s(D)) = prod_g (1/2 pi) int_0^{2 pi} exp(sum_{i in g} r_i cos(n_i psi - phi_i)) d psi.

    Each one-dimensional integral is taken with the trapezoid rule on ``grid`` points, exact for the
    harmonics below ``grid`` and exponentially accurate for this analytic integrand. With every pair in
    its own group the result is ``sum_i log I_0(r_i)`` (independent phases; see
    :func:`independent_log_mean_exp`).

    Args:
        r, phi: amplitudes and phases ``[M, P]`` (or ``[P]``), as in
            :func:`~lengthgen_utils.analysis.kernel.carrier_spectrum` (nats, rad).
        theta: frequencies ``[P]`` (rad/token).
        orbits: the groups (default :func:`frequency_orbits` of ``theta``).
        grid: quadrature points per group (default: enough for the largest multiplier and amplitude).

    Returns:
        float64 ``[M]`` (nats).

    Raises:
        ValueError: shapes that do not match, negative amplitudes, groups that do not cover every pair once.

    Source: chapter 5, "The long-run law"; Weyl 1916 (equidistribution).
    """
    return orbit_log_stats(r, phi, theta, orbits, grid)[0]


def orbit_peakiness(r, phi, theta, orbits=None, grid: int | None = None) -> Tensor:
    """``kappa = log max exp(s) - log mean exp(s)`` over the orbit (nats): how spiky the distractor weights are.

    ``exp(-kappa)`` is about the share of the orbit on which ``exp(s)`` is near its maximum, so an average over
    ``n`` consecutive offsets has met that region about ``n exp(-kappa)`` times: the long-run law
    (:func:`long_run_slope`) can describe a sum over ``n`` keys only once ``n exp(-kappa) >> 1``; before
    that, the few largest terms (aliases) decide it.

    Returns:
        float64 ``[M]``, >= 0.
    """
    log_mean, log_max = orbit_log_stats(r, phi, theta, orbits, grid)
    return log_max - log_mean


def independent_log_mean_exp(r) -> Tensor:
    """``sum_i log I_0(r_i)``: the long-run ``log`` average of ``exp(s(D))`` if every phase were independent.

    The product of Bessel factors that Kronecker's theorem would give for rationally independent
    frequencies; for RoPE with base 10^4 the phases are tied (:func:`frequency_orbits`) and
    :func:`orbit_log_mean_exp` is the right average.

    Args:
        r: amplitudes ``[M, P]`` (nats), >= 0.

    Returns:
        float64 ``[M]``.
    """
    r = torch.as_tensor(r, dtype=torch.float64)
    if not torch.isfinite(r).all() or (r < 0).any():
        raise ValueError("r must be finite and >= 0")
    return (torch.log(torch.special.i0e(r)) + r).sum(-1)


def long_run_slope(r, phi, theta, offset, orbits=None) -> Tensor:
    """The long-run dilution law: ``1/p(L) - 1`` grows like ``slope * L`` for ``L -> inf``.

    ``1/p(L) - 1 = sum_{D != -k} exp(s(D) - s(-k))`` (chapter 5's exact dilution), so each new key adds on
    average ``slope = exp(log <exp s>_orbit - s(-k))`` (:func:`orbit_log_mean_exp`).

    Args:
        r, phi, theta: the carrier spectrum (``[M, P]``, ``[M, P]``, ``[P]``).
        offset: the target offset k (an int, or one per model).
        orbits: as in :func:`orbit_log_mean_exp` (``[[(i, 1)] ...]`` per pair alone gives the Bessel product).

    Returns:
        float64 ``[M]``: the slope per token (dimensionless).

    Source: the abstract's attention-dilution law, derived for the frequency set the head actually has (chapter 5).
    """
    r, phi, theta = _spectrum(r, phi, theta)
    ks = torch.tensor(per_model_ints("offset", offset, r.shape[0], minimum=1), dtype=torch.float64)
    target = (r * torch.cos(-theta[None, :] * ks[:, None] - phi)).sum(1)
    return torch.exp(orbit_log_stats(r, phi, theta, orbits)[0] - target)


def pair_recurrences(theta, pairs, max_distance: int, tolerance: float = math.pi / 3) -> Tensor:
    """The lags at which the given frequency pairs all come back near a whole number of turns.

    ``{Delta in 1..max_distance : |wrap(theta_i Delta)| <= tolerance for every i in pairs}``, with
    ``wrap`` to ``(-pi, pi]``. A kernel whose selection rests on these pairs repeats its value at ``D``
    near ``D - Delta`` for each such lag: the candidates for an alias of the target offset ``-k`` are
    the offsets ``-(k + Delta)``. The list depends on the frequency set (``d_head``, base) and on which
    pairs are meant, nothing else. With base 10^4, d_head 16, pairs {0, 1} and a tolerance of 0.4 rad
    it starts 19, 119 (about 38 pi), 138, 239, ..., 358, 377 (about 120 pi), ...

    Args:
        theta: frequencies ``[P]`` (rad/token).
        pairs: pair indices (ints in ``0 .. P-1``).
        max_distance: largest lag (>= 1).
        tolerance: largest phase error per pair, radians in ``(0, pi]``; the default ``pi/3`` keeps at
            least half of each pair's amplitude (``cos(pi/3) = 1/2``).

    Returns:
        long ``[n]``, increasing.
    """
    theta = _check_theta(theta)
    pairs = check_int_sequence("pairs", pairs, minimum=0)
    for i, p in enumerate(pairs):
        check_int(f"pairs[{i}]", p, maximum=theta.numel() - 1)
    max_distance = check_int("max_distance", max_distance, minimum=1)
    tolerance = check_positive_float("tolerance", tolerance)
    if tolerance > math.pi:
        raise ValueError(f"tolerance must be in (0, pi]; got tolerance={tolerance}")
    lags = torch.arange(1, max_distance + 1)
    phase = theta[list(pairs)][:, None] * lags.double()[None, :]
    error = torch.remainder(phase + math.pi, 2 * math.pi) - math.pi
    return lags[(error.abs() <= tolerance).all(0)]


def separation_auc(trained, null) -> float:
    """How well a measure separates two groups: ``P(x > y) + P(x = y) / 2`` for ``x`` trained, ``y`` null.

    The area under the ROC curve (the Mann-Whitney U statistic divided by ``n_x n_y``): 1 when every
    trained head lies above every null head, 0 when every one lies below, 0.5 when the measure cannot
    tell them apart.

    Args:
        trained, null: 1-d tensors of one measure (any length >= 1).

    Returns:
        a float in [0, 1].
    """
    x = torch.as_tensor(trained, dtype=torch.float64).flatten()
    y = torch.as_tensor(null, dtype=torch.float64).flatten()
    if x.numel() == 0 or y.numel() == 0 or not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        raise ValueError(f"trained and null must be non-empty and finite; got {x.numel()} and {y.numel()} values")
    y = y.sort().values
    below = torch.searchsorted(y, x, right=False).double()
    not_above = torch.searchsorted(y, x, right=True).double()
    return float(((below + not_above) / 2).sum() / (x.numel() * y.numel()))


def balanced_agreement(predicted, actual) -> float:
    """How well a yes/no rule predicts a yes/no outcome, each outcome weighted equally.

    The mean of the rule's hit rate on the ``actual`` positives and on the negatives (balanced
    accuracy): 0.5 for a constant rule or one unrelated to the outcome, 1 for a perfect one. Used where
    most (head, length) pairs hold, so that "always holds" cannot score well by plain agreement.

    Args:
        predicted, actual: boolean arrays of the same shape (any), e.g. ``p > 1/2`` and
            ``accuracy >= 0.9`` per (head, length).

    Returns:
        a float in [0, 1]; NaN when ``actual`` has only one outcome (no balance to measure).

    Raises:
        ValueError: shapes differ or the arrays are empty.

    Source: chapter 5b, "What predicts accuracy".
    """
    p = torch.as_tensor(predicted).bool().flatten()
    a = torch.as_tensor(actual).bool().flatten()
    if p.shape != a.shape or p.numel() == 0:
        raise ValueError(f"predicted and actual must be non-empty and of one shape; got {tuple(torch.as_tensor(predicted).shape)} "
                         f"and {tuple(torch.as_tensor(actual).shape)}")
    if a.all() or not a.any():
        return float("nan")
    return float(((p & a).sum() / a.sum() + (~p & ~a).sum() / (~a).sum()) / 2)


def r_squared(y: Tensor, prediction: Tensor) -> Tensor:
    """Coefficient of determination of a prediction made without fitting: ``1 - SS_res / SS_tot`` per row.

    Args:
        y: ``[M, n]`` measured values; prediction: ``[M, n]`` (or broadcastable).

    Returns:
        float64 ``[M]``: 1 for a perfect prediction, 0 for one no better than the row mean, negative when worse.

    Raises:
        ValueError: a row of ``y`` is constant (``SS_tot = 0``) or shapes do not broadcast.
    """
    y = torch.as_tensor(y, dtype=torch.float64)
    prediction = torch.as_tensor(prediction, dtype=torch.float64)
    if y.dim() != 2:
        raise ValueError(f"y must be [M, n]; got shape {tuple(y.shape)}")
    check_nonempty("y", y, "[M, n]")
    ss_tot = ((y - y.mean(1, keepdim=True)) ** 2).sum(1)
    if (ss_tot == 0).any():
        raise ValueError("a row of y is constant: R^2 is undefined")
    return 1 - ((y - prediction) ** 2).sum(1) / ss_tot


# --- min-norm interpolant (chapter 6)
#
# Without a softmax, a position-only RoPE head's attention weight on the key at
# relative position D = j - (L-1) (key minus query, D <= 0) is the offset kernel
#
#     s(D) = Phi(D) . c,   Phi(D) = [cos(theta_1 D) .. cos(theta_n D), sin(theta_1 D) .. sin(theta_n D)],
#
# with n = d_head/2 RoPE frequencies theta_i and c = (a, b) in R^{d_head}
# (chapter 4; channel order = the half-split RoPE pairing).
# Fitting the retrieval task with one-hot values and a squared loss asks for
# s = 1 at D = -k and s = 0 at every other trained offset: Phi_T c = e_k. The
# features are linear in c, so every gradient lies in the row space of Phi_T;
# gradient descent from c = 0 therefore converges to the minimum-norm
# interpolant c* = pinv(Phi_T) e_k (e.g. Gunasekar et al. 2018; Bartlett et al.
# 2020, "benign overfitting", for the general linear-regression statement).


def trained_relative_positions(train_len: int, offset: int) -> Tensor:
    """The relative positions T that carry a loss in training at lengths up to ``train_len``: ``-(train_len-1) .. -1``.

    The query itself (D = 0) is excluded: its value (the query token) is not a
    content token, so its weight never enters the readout.

    Raises:
        ValueError: ``train_len < offset + 2``.
    """
    offset = check_int("offset", offset, minimum=1)
    train_len = check_int("train_len", train_len, minimum=offset + 2)
    return torch.arange(-(train_len - 1), 0)


def min_norm_interpolant(trained, offset: int, d_head: int, base: float = 10000.0,
                         rcond: float = 1e-15, frequencies=None) -> Tensor:
    """The minimum-norm kernel ``c* = pinv(Phi_T) e_k`` with ``s(-k) = 1`` and ``s(D) = 0`` on the rest of T.

    Args:
        trained: the trained relative positions T (integers, e.g. :func:`trained_relative_positions`);
            must contain ``-offset``.
        offset: the task's offset k >= 1; the kernel should select ``D = -k``.
        d_head: even head dimension; ``c*`` has ``d_head`` entries.
        base: RoPE base.
        rcond: singular values below ``rcond * sigma_max`` are treated as zero (as in ``numpy.linalg.pinv``);
            ``1e-15`` is float64 precision, i.e. the exact pseudo-inverse.
        frequencies: optional explicit frequencies (see :func:`kernel_frequencies`).

    Returns:
        float64 ``[d_head]``: the minimum-norm (least-squares, if no exact solution exists) ``c``.

    Raises:
        ValueError: ``-offset`` not in ``trained``, or a bad size/base.

    Source: the pseudo-inverse solution of an underdetermined linear system (Penrose 1955);
    its selection by gradient descent from zero, e.g. Gunasekar et al. 2018.
    """
    rel = check_relative_positions("trained", trained)
    offset = check_int("offset", offset, minimum=1)
    rcond = check_positive_float("rcond", rcond)
    if not (rel == -offset).any():
        raise ValueError(f"trained must contain -offset = {-offset}; got {rel.tolist()}")
    phi = rope_kernel_features(rel, d_head, base, frequencies)
    target = (rel == -offset).to(torch.float64)
    return torch.linalg.pinv(phi, rtol=rcond) @ target


def squared_loss_quadratic(train_len: int, offset: int, vocab_size: int, d_head: int,
                           base: float = 10000.0, frequencies=None) -> tuple[Tensor, Tensor, float]:
    """The expected squared loss of the direct kernel head as a quadratic ``J(c) = c^T H c - 2 b^T c + z``.

    Model (:class:`~lengthgen_utils.core.models.KernelHead`): output ``o = sum_j s(D_j) e(x_j)``
    with one-hot values ``e`` over the V content tokens; loss ``||o - e(y)||^2``. With
    tokens i.i.d. uniform, ``E||o - e(y)||^2 = r^T A r`` where ``r = s - e_k`` on the
    content offsets of the sequence and ``A = (1 - 1/V) I + (1/V) 1 1^T``. Averaging over
    training lengths ``L`` uniform in ``offset+2 .. train_len`` (the sampler of
    :func:`~lengthgen_utils.run.training.train`) gives ``H = E_L[Phi_L^T A Phi_L]``,
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
        rel = torch.arange(-(seq_len - 1), 0)
        phi = rope_kernel_features(rel, d_head, base, frequencies)
        e = (rel == -offset).to(torch.float64)
        a = (1 - 1 / vocab_size) * torch.eye(len(rel), dtype=torch.float64) + 1 / vocab_size
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
    # gain_i = [1 - (1 - 2 lr lambda_i)^t] / lambda_i. For small |x| = |2 lr lambda_i| it is written without
    # cancellation (expm1/log1p; its lambda -> 0 limit is 2 lr t); elsewhere as it stands, since log1p(-x) is
    # NaN for x > 1, and a step size of 0.5 / lambda_max puts x within a rounding error of 1 for the largest
    # eigenvalue, on either side of it depending on the machine's float rounding.
    x = 2 * lr * lam
    tiny = x.abs() < 1e-300
    small = x.abs() < 0.5
    safe = torch.where(tiny, torch.ones_like(lam), lam)
    cancelled = -torch.expm1(steps * torch.log1p(-torch.where(small, x, torch.zeros_like(x)))) / safe
    direct = (1 - (1 - x) ** steps) / safe
    gain = torch.where(tiny, torch.full_like(lam, 2 * lr * steps), torch.where(small, cancelled, direct))
    return u @ (gain * proj)


def expected_squared_error(kernel: Tensor, offset: int, vocab_size: int) -> Tensor:
    """Expected squared loss ``E||o - e(y)||^2`` of a linear one-hot readout at one length.

    Args:
        kernel: ``[..., L]`` attention weights ``s_j`` over positions ``j = 0 .. L-1`` (the last is the
            query, whose value is zero and which therefore does not count).
        offset: k; the target sits at position ``L-1-k``.
        vocab_size: V.

    Returns:
        float64 ``[...]``: ``(1 - 1/V) sum_j r_j^2 + (1/V) (sum_j r_j)^2`` with ``r = s - e_k`` over content
        positions (computed in float64 whatever the kernel's dtype).
    """
    offset = check_int("offset", offset, minimum=1)
    vocab_size = check_int("vocab_size", vocab_size, minimum=2)
    _check_weights(kernel)
    seq_len = kernel.shape[-1]
    if offset > seq_len - 2:
        raise ValueError(f"offset must be <= seq_len - 2 = {seq_len - 2}; got offset={offset}")
    r = kernel[..., :-1].to(torch.float64)  # a copy: float16 squares would overflow above 256
    r[..., seq_len - 1 - offset] -= 1
    return (1 - 1 / vocab_size) * (r ** 2).sum(-1) + (r.sum(-1) ** 2) / vocab_size


def _check_weights(kernel, name: str = "kernel") -> None:
    """Raise unless ``kernel`` is a real tensor ``[..., L]`` with no empty dimension."""
    if not isinstance(kernel, Tensor) or kernel.dtype.is_complex or kernel.dtype == torch.bool or kernel.dim() < 1:
        raise TypeError(f"{name} must be a real torch.Tensor [..., L]; "
                        f"got {getattr(kernel, 'dtype', type(kernel).__name__)}")
    check_nonempty(name, kernel, "[..., L]")


def cosine_similarity(x: Tensor, y: Tensor) -> Tensor:
    """Cosine similarity of kernels along the last dimension (float64): ``x.y / (|x| |y|)``.

    Args:
        x, y: real tensors ``[..., d]`` (broadcastable, ``d >= 1``).

    Returns:
        float64 ``[...]`` in [-1, 1].

    Raises:
        TypeError / ValueError: not real tensors, an empty dimension, or a zero vector (its direction, and
            so the cosine, is undefined: 0/0).
    """
    _check_weights(x, "x")
    _check_weights(y, "y")
    x, y = x.to(torch.float64), y.to(torch.float64)
    norms = x.norm(dim=-1) * y.norm(dim=-1)
    if bool((norms == 0).any()):
        raise ValueError("x or y holds a zero vector: its cosine similarity is undefined (0/0)")
    return (x * y).sum(-1) / norms


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

    Raises:
        TypeError / ValueError: ``kernel`` not a real tensor ``[..., L]`` with every size >= 1, an offset
            beyond ``L - 2``, or a kernel whose weight on the target is 0 (the ratio divides by it).
    """
    offset = check_int("offset", offset, minimum=1)
    _check_weights(kernel)
    seq_len = kernel.shape[-1]
    if offset > seq_len - 2:
        raise ValueError(f"offset must be <= seq_len - 2 = {seq_len - 2}; got offset={offset}")
    s = kernel[..., :-1].to(torch.float64)
    target = s[..., seq_len - 1 - offset]
    if bool((target == 0).any()):
        raise ValueError(f"kernel has weight 0 on the target (position L-1-k = {seq_len - 1 - offset}) in some row: "
                         "the noise ratio divides by it")
    return ((s ** 2).sum(-1) - target ** 2) / target ** 2
