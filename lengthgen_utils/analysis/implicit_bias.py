"""What selects the rule: max-margin kernels, fits built not to extrapolate, and what training moved (chapter 5c).

A position-only RoPE head's logit is a kernel over relative positions, ``s(D) = Phi(D) . c`` with
``Phi(D) = [cos(theta_i D)]_i ++ [sin(theta_i D)]_i`` (:func:`~lengthgen_utils.core.rope.rope_kernel_features`).
Many kernels fit the training window; this module computes two kinds of them and measures trained heads
against them:

* the **l2 max-margin kernel** (:func:`max_margin_kernel`): the smallest ``||c||`` that puts the target
  ``D = -k`` at least a unit margin above every other relative position of the training window (the
  direction an exponential-tailed loss selects under gradient descent on a model linear in ``c``:
  Soudry et al. 2018; for attention, Tarzanagh et al. 2023);
* a **decoy fit** (:func:`decoy_kernel`): the smallest kernel with the same margins inside the window and a
  key at a chosen distance beyond it (the decoy) a margin *above* the target, so it fits every training
  length and fails once a sequence holds the decoy; :func:`write_kernel` writes any kernel into a
  :class:`~lengthgen_utils.core.models.RetrievalHead`'s query and key weights.

Both are small quadratic programmes, ``min ||c||^2`` subject to ``G c >= h``, solved by scipy's SLSQP and
checked against the Karush-Kuhn-Tucker conditions (:func:`solve_min_norm`).
"""
from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import Tensor

from .._validate import check_int, check_positive_float, per_model_ints
from ..core.rope import _kernel_features, kernel_frequencies


def margin_constraints(offset: int, train_len: int, d_head: int = 16, base: float = 10000.0) -> Tensor:
    """The rows ``Phi(-k) - Phi(D)`` for every relative position ``D`` of the training window but the target.

    The window is ``D = -(train_len - 1) .. 0``, the keys a query sees at the longest training length, the
    query's own key (``D = 0``) included: softmax weighs it like any other.

    Args:
        offset: the target offset ``k``, ``1 <= k <= train_len - 1``.
        train_len: the longest training length.
        d_head, base: the head's RoPE (``d_head // 2`` frequency pairs).

    Returns:
        float64 ``[train_len - 1, d_head]``: ``G c`` is the target's margin over each other position.

    Raises:
        ValueError / TypeError: an offset outside the window, odd ``d_head``, ``base <= 1``.
    """
    train_len = check_int("train_len", train_len, minimum=2)
    offset = check_int("offset", offset, minimum=1, maximum=train_len - 1)
    theta = kernel_frequencies(d_head, base)
    others = torch.tensor([d for d in range(train_len) if d != offset], dtype=torch.long)
    return _kernel_features(torch.tensor([-offset]), theta) - _kernel_features(-others, theta)


def solve_min_norm(constraints: Tensor, bounds: Tensor, tol: float = 1e-7) -> Tensor:
    """The smallest-norm ``c`` with ``constraints @ c >= bounds``: ``argmin ||c||_2`` (a convex QP).

    Solved by scipy's SLSQP from the least-squares solution of the equalities, then checked by the KKT
    conditions: the constraints hold, and ``c`` is a non-negative combination of the active rows (the
    multipliers are the non-negative least-squares fit of ``c`` by the rows within ``tol`` of their bound).

    Args:
        constraints: ``G [n, d]`` float64; bounds: ``h [n]``.
        tol: feasibility and stationarity tolerance (relative to ``||c||``).

    Returns:
        float64 ``c [d]``.

    Raises:
        ValueError: shapes that do not match, or a solution that fails the KKT check (an infeasible
            programme, or the solver stopped short).
    """
    from scipy.optimize import minimize, nnls

    g = torch.as_tensor(constraints, dtype=torch.float64)
    h = torch.as_tensor(bounds, dtype=torch.float64)
    if g.dim() != 2 or h.shape != (g.shape[0],):
        raise ValueError(f"constraints must be [n, d] and bounds [n]; got {tuple(g.shape)} and {tuple(h.shape)}")
    gn, hn = g.numpy(), h.numpy()
    start = np.linalg.lstsq(gn, hn, rcond=None)[0]
    result = minimize(lambda c: 0.5 * c @ c, start, jac=lambda c: c, method="SLSQP",
                      constraints=[{"type": "ineq", "fun": lambda c: gn @ c - hn, "jac": lambda c: gn}],
                      options={"ftol": 1e-15, "maxiter": 1000})
    c = result.x
    scale = max(np.linalg.norm(c), 1.0)
    slack = gn @ c - hn
    active = slack <= tol * scale * 10
    lam, residual = nnls(gn[active].T, c) if active.any() else (np.zeros(0), np.linalg.norm(c))
    if slack.min() < -tol * scale or residual > 1e-5 * scale:
        raise ValueError(f"the min-norm programme has no KKT point here (smallest slack {slack.min():.3g}, "
                         f"stationarity residual {residual:.3g}; solver: {result.message})")
    return torch.from_numpy(c)


def max_margin_kernel(offset: int, train_len: int, d_head: int = 16, base: float = 10000.0) -> Tensor:
    """The l2 max-margin kernel ``c_mm = argmin ||c|| s.t. s(-k) - s(D) >= 1`` for every other ``D`` of the window.

    Its direction is the one gradient descent on the logistic (or cross-entropy) loss of a model linear in
    ``c`` converges to on separable data (Soudry et al. 2018), written for the selection of one relative
    position (Tarzanagh et al. 2023, max-margin token selection). Scale it by ``m`` for margin ``m``.

    Args:
        offset, train_len, d_head, base: as :func:`margin_constraints`.

    Returns:
        float64 ``[d_head]`` in the order of :func:`~lengthgen_utils.core.rope.rope_kernel_features`.

    Raises:
        ValueError / TypeError: as :func:`margin_constraints` and :func:`solve_min_norm`.
    """
    g = margin_constraints(offset, train_len, d_head, base)
    return solve_min_norm(g, torch.ones(g.shape[0], dtype=torch.float64))


def linf_max_margin_kernel(offset: int, train_len: int, d_head: int = 16, base: float = 10000.0) -> Tensor:
    """The l-infinity max-margin kernel: the least ``max_i |c_i|`` with ``s(-k) - s(D) >= 1`` for every other ``D``.

    The l-infinity analogue of :func:`max_margin_kernel`, the direction steepest descent in the l-infinity
    norm (sign descent) converges to on a model linear in ``c`` and separable data (Gunasekar et al. 2018,
    *Characterizing implicit bias in terms of optimization geometry*). The linear programme
    ``min t  s.t.  G c >= 1, -t <= c_i <= t`` (scipy's HiGHS) can have many solutions; of them this returns
    the one of least l2 norm (a second, strictly convex programme with ``|c_i| <= t*``), so the kernel is
    unique.

    Args:
        offset, train_len, d_head, base: as :func:`margin_constraints`.

    Returns:
        float64 ``[d_head]`` in the order of :func:`~lengthgen_utils.core.rope.rope_kernel_features`;
        ``max |c_i|`` is the programme's optimum ``t*``.

    Raises:
        ValueError / TypeError: as :func:`margin_constraints`; an infeasible programme.
    """
    from scipy.optimize import linprog

    g = margin_constraints(offset, train_len, d_head, base)
    n, d = g.shape
    # variables [c (d), t]; G c >= 1 -> -G c <= -1; c_i - t <= 0; -c_i - t <= 0
    eye = np.eye(d)
    a_ub = np.block([[-g.numpy(), np.zeros((n, 1))], [eye, -np.ones((d, 1))], [-eye, -np.ones((d, 1))]])
    b_ub = np.concatenate([-np.ones(n), np.zeros(2 * d)])
    result = linprog(np.r_[np.zeros(d), 1.0], A_ub=a_ub, b_ub=b_ub, bounds=[(None, None)] * (d + 1),
                     method="highs")
    if result.status != 0:
        raise ValueError(f"the l-infinity max-margin programme has no solution here: {result.message}")
    t = float(result.x[-1]) * (1 + 1e-9) + 1e-12
    box = torch.cat([torch.eye(d, dtype=torch.float64), -torch.eye(d, dtype=torch.float64)])
    rows = torch.cat([g, box])
    bounds = torch.cat([torch.ones(n, dtype=torch.float64), torch.full((2 * d,), -t, dtype=torch.float64)])
    return solve_min_norm(rows, bounds)


def decoy_kernel(offset: int, train_len: int, decoy: int, margin: float, d_head: int = 16,
                 base: float = 10000.0) -> Tensor:
    """The smallest kernel that fits the window with ``margin`` and puts a decoy ``margin`` above the target.

    ``argmin ||c||`` subject to ``s(-k) - s(D) >= margin`` for every other ``D`` of the window and
    ``s(-decoy) - s(-k) >= margin``: a fit of every training length (the window never holds the decoy) that
    attends to the key at distance ``decoy`` once a sequence is longer than ``decoy``.

    Args:
        offset, train_len, d_head, base: as :func:`margin_constraints`.
        decoy: the decoy's distance, ``>= train_len`` (beyond the window).
        margin: nats, > 0.

    Returns:
        float64 ``[d_head]``.

    Raises:
        ValueError / TypeError: a decoy inside the window, a margin <= 0, or as :func:`max_margin_kernel`.
    """
    train_len = check_int("train_len", train_len, minimum=2)
    decoy = check_int("decoy", decoy, minimum=train_len)
    margin = check_positive_float("margin", margin)
    theta = kernel_frequencies(d_head, base)
    g = margin_constraints(offset, train_len, d_head, base)
    beyond = _kernel_features(torch.tensor([-decoy]), theta) - _kernel_features(torch.tensor([-offset]), theta)
    g = torch.cat([g, beyond])
    return solve_min_norm(g, torch.full((g.shape[0],), margin, dtype=torch.float64))


def kernel_values(c: Tensor, n: int, d_head: int = 16, base: float = 10000.0) -> Tensor:
    """``s(D) = Phi(D) . c`` in the row layout (column ``j`` holds ``D = j - (n - 1)``): ``c [M, d]`` -> ``[M, n]``."""
    n = check_int("n", n, minimum=1)
    c = torch.as_tensor(c, dtype=torch.float64)
    phi = _kernel_features(torch.arange(-(n - 1), 1), kernel_frequencies(d_head, base))
    return torch.atleast_2d(c) @ phi.T


def window_margin(kernel: Tensor, offset, train_len: int) -> Tensor:
    """The target's margin over every other key of the training window, the query's own key included.

    ``s(-k) - max_{0 <= d < train_len, d != k} s(-d)`` for a kernel ``[M, n]`` in the row layout (``n >= train_len``).
    (Chapter 6's :func:`~lengthgen_utils.analysis.kernel.selection_margins` leaves the query's key out.)

    Returns:
        float64 ``[M]`` (nats).

    Raises:
        ValueError / TypeError: a kernel shorter than the window, an offset outside it.
    """
    kernel = torch.as_tensor(kernel, dtype=torch.float64)
    if kernel.dim() != 2 or kernel.shape[1] < train_len:
        raise ValueError(f"kernel must be [M, n] with n >= train_len={train_len}; got {tuple(kernel.shape)}")
    ks = per_model_ints("offset", offset, kernel.shape[0], minimum=1, maximum=train_len - 1)
    by_distance = kernel.flip(1)[:, :train_len].clone()
    rows = torch.arange(kernel.shape[0])
    target = by_distance[rows, ks].clone()
    by_distance[rows, ks] = -math.inf
    return target - by_distance.max(1).values


@torch.no_grad()
def write_kernel(model, c: Tensor):
    """A copy of a position-only RoPE head whose query and key weights give the kernel ``c`` exactly.

    Keeps ``u``, the embedding and the value path (``W_V``, ``W_O``); sets ``W_Q = q0 u^T / |u|^2`` and
    ``W_K = k0 u^T / |u|^2`` with, per frequency pair, ``k0 = (rho, 0)`` and ``q0 = (a, b) sqrt(d_head) / rho``,
    ``rho = ((a^2 + b^2) d_head)^(1/4)`` (query and key of equal norm in each pair: for a given kernel, the
    least ``|q0|^2 + |k0|^2``). Then :func:`~lengthgen_utils.analysis.kernel.factorized_kernel` returns ``c``.

    Args:
        model: a RoPE :class:`~lengthgen_utils.core.models.RetrievalHead` of M models, half-split pairs.
        c: ``[M, d_head]`` or ``[d_head]`` (one kernel for every model).

    Returns:
        a new head (the argument is left unchanged).

    Raises:
        ValueError: not a RoPE head with half-split pairs; ``c`` of the wrong shape.
    """
    from .kernel import _rope_head

    encoding = _rope_head(model)
    if encoding.interleaved:
        raise ValueError("write_kernel writes half-split RoPE pairs; got an interleaved encoding")
    m, d_head = model.n_models, model.config.d_head
    c = torch.as_tensor(c, dtype=torch.float64).expand(m, d_head) if torch.as_tensor(c).dim() == 1 else \
        torch.as_tensor(c, dtype=torch.float64)
    if c.shape != (m, d_head):
        raise ValueError(f"c must be [d_head] or [M, d_head] = [{m}, {d_head}]; got {tuple(c.shape)}")
    half = d_head // 2
    a, b = c[:, :half], c[:, half:]
    rho = ((a ** 2 + b ** 2) * d_head).clamp_min(1e-300) ** 0.25  # a pair with a = b = 0 gets q0 = 0
    q0 = torch.cat([a, b], 1) * math.sqrt(d_head) / torch.cat([rho, rho], 1)
    k0 = torch.cat([rho * (a ** 2 + b ** 2 > 0), torch.zeros_like(rho)], 1)
    out = copy.deepcopy(model)
    u = out.u.detach().double()
    uu = (u ** 2).sum(1)[:, None, None]
    dtype = out.w_q.dtype
    out.w_q.copy_((q0[:, :, None] * u[:, None, :] / uu).to(dtype))
    out.w_k.copy_((k0[:, :, None] * u[:, None, :] / uu).to(dtype))
    return out


def amplitude_cost(c: Tensor) -> Tensor:
    """``sum_i sqrt(a_i^2 + b_i^2)``: the pairs' amplitudes summed, for kernels ``c [M, d_head]``.

    Times ``2 sqrt(d_head)``, the least ``|W_Q u|^2 + |W_K u|^2`` a factorised head needs to realise ``c``
    (each pair's query and key of equal norm): the norm a factorised parameterisation pays, an l1 norm over
    the pairs where the kernel's own norm is an l2 norm.
    """
    c = torch.atleast_2d(torch.as_tensor(c, dtype=torch.float64))
    half = c.shape[1] // 2
    return (c[:, :half] ** 2 + c[:, half:] ** 2).sqrt().sum(1)


@torch.no_grad()
def distance_travelled(model, initial) -> Tensor:
    """``|w - w0| / |w0|`` over every parameter of each model: how far training moved it from its initialisation.

    Args:
        model, initial: two ensembles of one architecture (``initial`` untrained, same seeds), M models each.

    Returns:
        float64 ``[M]``.

    Raises:
        ValueError: the ensembles' parameters differ in name or shape.
    """
    now, then = dict(model.named_parameters()), dict(initial.named_parameters())
    if now.keys() != then.keys() or any(now[k].shape != then[k].shape for k in now):
        raise ValueError("model and initial must be ensembles of one architecture and size")
    moved = sum(((now[k].double().cpu() - then[k].double().cpu()) ** 2).flatten(1).sum(1) for k in now)
    size = sum((then[k].double().cpu() ** 2).flatten(1).sum(1) for k in now)
    return (moved / size).sqrt()


def sign_test_p(successes: int, trials: int, chance: float) -> float:
    """One-sided binomial p-value ``P(X >= successes)`` for ``X ~ Binomial(trials, chance)``: a rate against its null."""
    from scipy.stats import binom

    successes = check_int("successes", successes, minimum=0)
    trials = check_int("trials", trials, minimum=successes)
    return float(binom.sf(successes - 1, trials, chance))


def spectrum(c: Tensor, d_head: int = 16, base: float = 10000.0):
    """The :class:`~lengthgen_utils.analysis.kernel.CarrierSpectrum` of kernel coefficients ``c [M, d_head]``:
    ``r_i = sqrt(a_i^2 + b_i^2)``, ``phi_i = atan2(b_i, a_i)``, so that ``s(D) = sum_i r_i cos(theta_i D - phi_i)``;
    chapter 4's measures then apply to a computed or built kernel as to a trained head."""
    from .kernel import CarrierSpectrum

    c = torch.atleast_2d(torch.as_tensor(c, dtype=torch.float64))
    if c.shape[1] != d_head:
        raise ValueError(f"c must be [M, d_head={d_head}]; got {tuple(c.shape)}")
    half = d_head // 2
    a, b = c[:, :half], c[:, half:]
    return CarrierSpectrum(kernel_frequencies(d_head, base), (a ** 2 + b ** 2).sqrt(), torch.atan2(b, a))
