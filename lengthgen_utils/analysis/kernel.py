"""The offset kernel of a RoPE head and what is read off it: spectrum, alignment, rank, aliasing (chapters 4-6).

**One layout, one name per quantity.** The *relative position* of a key at ``j`` seen from a
query at ``m`` is ``D = j - m`` (``<= 0`` under a causal mask); its *distance* is ``d = -D``;
the task's *offset* ``k`` is the distance of the target. A kernel over ``n`` relative positions
is stored as ``[M, n]`` in the **row layout**: column ``j`` holds ``s(D = j - (n-1))``, the
attention logits of a query at position ``n-1`` over keys ``0 .. n-1``, exactly as
:meth:`~lengthgen_utils.core.models.RetrievalHead.scores` returns them. The target ``D = -k`` is
column ``n-1-k``, and the row at a shorter length ``L`` is the last ``L`` columns.
:mod:`~lengthgen_utils.analysis.theory` takes kernels in the same layout, and so does every public
function of the package that takes or returns values over relative positions (a transformer head's
profiles, :func:`~lengthgen_utils.analysis.probes.head_offset_profiles`; a recurrent model's kernel
norms, :meth:`~lengthgen_utils.core.models.LinearRNN.kernel_norm`). Some functions flip a kernel into a
distance-major working copy (column ``d`` holds ``s(-d)``) inside; none takes or returns one. (The one
quantity indexed by distance is :meth:`~lengthgen_utils.core.models.LinearRNN.kernel`: the matrices
``K(d) = C A^d B`` by their power ``d``, on an axis that is not the last.)

Sources: Su et al. 2021 (RoFormer: RoPE scores depend on the offset alone); the paper's
"low-rank carrier aligned with the offset" (arXiv 2607.18759, abstract), in the book's
reconstruction (chapter 4); Barbero et al. 2025 (RoPE frequencies and aliasing at long range).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .._validate import check_int, check_nonempty, check_positive_float, per_model_ints
from ..core.encodings import RoPE
from ..core.rope import check_relative_positions, rope_kernel_coefficients, rope_kernel_features
from ..core.seeding import generator
from .theory import distractor_ratio, mean_field_parameters, orbit_log_stats, pair_recurrences, r_squared


def relative_positions(n: int) -> Tensor:
    """The relative positions ``D = -(n-1) .. 0`` of the row layout: long ``[n]``.

    ``relative_positions(train_len)`` is the training window: the relative positions a query sees in training.
    """
    n = check_int("n", n, minimum=1)
    return torch.arange(-(n - 1), 1)


def _rope_head(model) -> RoPE:
    """The model's encoding, if the kernel analyses apply to it (a position-only RoPE head)."""
    encoding = getattr(getattr(model, "config", None), "pe", None)
    if not isinstance(encoding, RoPE) or not hasattr(model, "u"):
        raise ValueError(f"model must be a RetrievalHead with a RoPE encoding; got "
                         f"{type(model).__name__} with pe={encoding!r}")
    return encoding


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

    def select(self, index) -> "CarrierSpectrum":
        """The spectra of the heads ``index`` (a boolean mask or indices)."""
        return CarrierSpectrum(self.theta, self.r[index], self.phi[index])


@torch.no_grad()
def unrotated_query_key(model) -> tuple[Tensor, Tensor]:
    """``q0 = W_Q u`` and ``k0 = W_K u``: the position-only head's query and key before any rotation, ``[M, d_head]``.

    Computed in float64 from the model's weights whatever their dtype, so that the analyses built on them
    (spectrum, alignment, predicted aliases) do not depend on the precision the model runs in; for a RoPE head
    this is ``model.queries_keys`` at position 0 (no rotation), which the tests check.
    """
    _rope_head(model)
    u = model.u.detach().double()
    return (torch.einsum("md,mhd->mh", u, model.w_q.detach().double()),
            torch.einsum("md,mhd->mh", u, model.w_k.detach().double()))


@torch.no_grad()
def carrier_spectrum(model) -> CarrierSpectrum:
    """Amplitude ``r_i`` and phase ``phi_i`` of every RoPE frequency pair of each model.

    With ``q0 = W_Q u`` and ``k0 = W_K u`` (before rotation), write pair
    ``i`` of each as a complex number ``z = x_i + 1j x_{i+d/2}`` (half-split;
    ``x_{2i} + 1j x_{2i+1}`` when interleaved). RoPE multiplies it by
    ``exp(1j t theta_i)`` at position t, so the query at ``L-1`` and key at
    ``j = L-1+D`` give ``Re(zq conj(zk) exp(-1j theta_i D))``; hence
    ``r_i = |zq conj(zk)| / sqrt(d_head)`` and ``phi_i = arg(zq conj(zk))``.
    Equivalently ``a_i = r_i cos phi_i = q^(i).k^(i)/sqrt(d)`` and
    ``b_i = r_i sin phi_i = q^(i).J k^(i)/sqrt(d)``.

    Args:
        model: a RoPE :class:`~lengthgen_utils.core.models.RetrievalHead` ensemble (M models).

    Returns:
        :class:`CarrierSpectrum`.

    Raises:
        ValueError: the model is not a position-only RoPE head.

    Source: Su et al. 2021 (RoFormer), eq. (13)-(16); chapter 4, "The offset kernel".
    """
    encoding = _rope_head(model)
    q0, k0 = (t.double() for t in unrotated_query_key(model))
    d_head = q0.shape[-1]
    half = d_head // 2
    if encoding.interleaved:
        zq, zk = torch.complex(q0[:, 0::2], q0[:, 1::2]), torch.complex(k0[:, 0::2], k0[:, 1::2])
    else:
        zq, zk = torch.complex(q0[:, :half], q0[:, half:]), torch.complex(k0[:, :half], k0[:, half:])
    w = zq * zk.conj() / math.sqrt(d_head)
    theta = encoding.frequencies(d_head, 1)  # RoPE's, or a subclass's own set
    return CarrierSpectrum(theta=theta, r=w.abs().cpu(), phi=w.angle().cpu())


@torch.no_grad()
def factorized_kernel(model) -> Tensor:
    """Kernel coefficients ``c [M, d_head]`` (float64) of a position-only RoPE head: ``s(D) = Phi(D) . c``.

    In the order of :func:`~lengthgen_utils.core.rope.rope_kernel_features` (the ``1/sqrt(d_head)``
    score scale included), so chapter 6 can compare a trained factorised head with the closed forms.
    """
    encoding = _rope_head(model)
    q0, k0 = unrotated_query_key(model)
    return rope_kernel_coefficients(q0.double(), k0.double(), encoding.interleaved) / q0.shape[-1] ** 0.5


def peak_distance(kernel: Tensor) -> Tensor:
    """The distance ``d = -D`` of each row's largest entry, for a kernel ``[M, n]`` in the row layout: long ``[M]``.

    A head that selects its target has ``peak_distance == offset``.

    Raises:
        ValueError: ``kernel`` is not ``[M, n]`` with ``M, n >= 1``.
    """
    if not isinstance(kernel, Tensor) or kernel.dim() != 2:
        raise ValueError(f"kernel must be a tensor [M, n] in the row layout; got {getattr(kernel, 'shape', kernel)!r}")
    check_nonempty("kernel", kernel, "[M, n]")
    return kernel.shape[1] - 1 - kernel.argmax(1).cpu()


def participation_ratio(weights: Tensor) -> Tensor:
    """``(sum_i w_i)^2 / sum_i w_i^2`` over the last dim: the effective number of non-negative components.

    1 when one component carries everything, ``n`` when all ``n`` are equal. Computed in float64
    (squares of float16 weights above 256 would overflow).

    Returns:
        float64 ``[...]``.

    Raises:
        ValueError: negative entries, a row that is all zero, or an empty dimension (no rows, no components).
    """
    if not isinstance(weights, Tensor) or weights.dtype.is_complex or weights.dim() < 1:
        raise TypeError(f"weights must be a real torch.Tensor [..., n]; got {type(weights).__name__}")
    check_nonempty("weights", weights, "[..., n]")
    weights = weights.double()
    if (weights < 0).any():
        raise ValueError(f"weights must be >= 0; got min {float(weights.min()):.3g}")
    denom = (weights ** 2).sum(-1)
    if (denom == 0).any():
        raise ValueError("weights has a row that is all zero; its participation ratio is undefined")
    return weights.sum(-1) ** 2 / denom


@torch.no_grad()
def qk_effective_rank(model) -> Tensor:
    """Participation ratio of the squared singular values of the bilinear form ``W_Q^T W_K``.

    ``(sum sigma^2)^2 / sum sigma^4`` of the ``[d_model, d_model]`` matrix whose (rotated) form gives
    every logit. With a constant query/key input ``u`` only the rank-one slice
    ``(u^T W_Q^T, u^T W_K^T)`` reaches the logits; this measures the whole matrix, including
    directions the task never uses.

    Returns:
        float64 ``[M]``, between 1 and ``d_head``.
    """
    _rope_head(model)
    sigma = torch.linalg.svdvals((model.w_q.transpose(1, 2) @ model.w_k).double())
    return participation_ratio(sigma ** 2).cpu()


def _window(window) -> Tensor:
    """A window of relative positions: a training length ``L`` gives ``D = -(L-1) .. 0``; a sequence is checked."""
    if isinstance(window, int) and not isinstance(window, bool):
        return relative_positions(check_int("train_len", window, minimum=2))
    return check_relative_positions("window", window)


# ---------------------------------------------------------------- the kernel and its terms, from a spectrum
def _spectrum(source) -> CarrierSpectrum:
    """``source`` as a :class:`CarrierSpectrum`: a spectrum as it is, a RoPE head as :func:`carrier_spectrum` reads it."""
    return source if isinstance(source, CarrierSpectrum) else carrier_spectrum(source)


def components(source, relative) -> Tensor:
    """Each pair's term ``r_i cos(theta_i D - phi_i)`` at the relative positions ``D``: float64 ``[N, P, n]``.

    The one place the carrier's terms are formed: the kernel and every measure of chapters 4 and 7 go
    through it.

    Args:
        source: a :class:`CarrierSpectrum` of ``N`` carriers, or a RoPE head ensemble (its spectrum).
        relative: integer relative positions ``D`` (key minus query; any integers).

    Raises:
        ValueError / TypeError: a model that is not a position-only RoPE head; positions empty or not integers.
    """
    spectrum = _spectrum(source)
    rel = check_relative_positions("relative", relative).double()
    angle = spectrum.theta[None, :, None] * rel[None, None, :] - spectrum.phi[:, :, None]
    return spectrum.r[:, :, None] * torch.cos(angle)


def kernel_at(source, relative) -> Tensor:
    """The carrier ``s(D) = sum_i r_i cos(theta_i D - phi_i)`` at the relative positions ``D``: float64 ``[N, n]``.

    For a trained head, the logit the query at position ``L-1`` gives the key at ``L-1+D``, at every length
    ``L`` (nats). ``source``: a spectrum or a RoPE head (see :func:`components`).
    """
    return components(source, relative).sum(1)


def offset_kernel(source, n: int) -> Tensor:
    """The kernel over ``D = -(n-1) .. 0`` in the row layout (see the module docstring): float64 ``[N, n]``.

    For a head, equal up to float rounding to its own score row ``model.scores(n)``.
    """
    return kernel_at(source, relative_positions(n))


def variation(source, window) -> Tensor:
    """How much each pair's term varies over ``window``: its population std there, float64 ``[N, P]`` (nats).

    A low frequency that barely turns over the window has a small variation however large its amplitude:
    it acts as a bias, not as a selector. ``window`` is a training length ``L`` (``D = -(L-1) .. 0``) or the
    relative positions themselves.
    """
    return components(source, _window(window)).std(-1, unbiased=False)


def alignment(source, offset, window=None, weights: Tensor | None = None) -> Tensor:
    """Alignment ``C = sum_i w_i cos(phi_i + theta_i k) / sum_i w_i`` of the carrier with the offset ``k``.

    1 when every weighted pair peaks at ``D = -k`` (a matched filter for offset ``k``). The weights are the
    amplitudes ``w_i = r_i`` by default; with ``window`` (a training length or relative positions) each
    pair's :func:`variation` over it (the pairs that actually select inside the window); or ``weights``.

    Args:
        source: a spectrum of ``N`` carriers or a RoPE head ensemble.
        offset: the target offset ``k >= 1`` (one int, or one per carrier).
        window: None, or the window whose variation weights the pairs.
        weights: None, or non-negative ``[N, P]`` (not with ``window``).

    Returns:
        float64 ``[N]`` in [-1, 1].

    Raises:
        ValueError / TypeError: bad offsets; both ``window`` and ``weights``; weights of another shape or
            negative; a carrier whose weights are all 0 (its alignment divides by their sum).

    Source: the abstract's "carrier aligned with the offset" (claim of chapter 4).
    """
    spectrum = _spectrum(source)
    if window is not None and weights is not None:
        raise ValueError("give window or weights, not both")
    n = spectrum.r.shape[0]
    k = torch.tensor(per_model_ints("offset", offset, n, minimum=1), dtype=torch.float64)
    if window is not None:
        w = variation(spectrum, window)
    else:
        w = spectrum.r if weights is None else torch.as_tensor(weights, dtype=torch.float64)
    if w.shape != spectrum.r.shape or (w < 0).any():
        raise ValueError(f"weights must be non-negative [N, P] = {tuple(spectrum.r.shape)}; got {tuple(w.shape)}")
    cos = torch.cos(spectrum.phi + spectrum.theta[None, :] * k[:, None])
    total = w.sum(1)
    if bool((total == 0).any()):
        raise ValueError("weights are all 0 for some carrier (no pair has amplitude or variation): its alignment "
                         "divides by their sum, 0")
    return (w * cos).sum(1) / total


def reconstruction(source, window, rank: int) -> Tensor:
    """Fraction of the carrier's variance over ``window`` kept by its top-``rank`` pairs (ranked by variation).

    The reconstruction keeps those pairs' terms and replaces every other pair by its mean over the window (a
    constant bias): ``1 - ||s - s_r||^2 / ||s - mean s||^2``. Returns float64 ``[N]``, at most 1.

    Raises:
        ValueError / TypeError: ``rank`` not in ``[0, P]`` (the number of frequency pairs), or a carrier that
            is constant over the window (no variance to keep: the fraction divides by 0).
    """
    spectrum = _spectrum(source)
    rank = check_int("rank", rank, minimum=0, maximum=spectrum.r.shape[1])
    return _kept_variance(components(spectrum, _window(window)), rank)


def first_alias(source, offset, min_distance: int, max_distance: int | None = None, tolerance: float = 1.0) -> list:
    """The nearest distance ``d >= min_distance`` at which the kernel comes back near its value at ``-k``.

    The criterion ``s(-d) >= s(-k) - tolerance``: a key that gets at least ``exp(-tolerance)`` of the
    target's weight. A sequence of length ``L`` contains that key once ``L >= d + 1``.

    Args:
        source: a kernel ``[M, n]`` in the row layout (e.g. a transformer head's mean attention logit measured
            on long sequences; non-finite columns, offsets a probe did not average, are skipped), searched up to
            ``d = n - 1``; or a spectrum or a RoPE head, whose kernel is computed up to ``max_distance``.
        offset: the target offset ``k`` (one int, or one per row).
        min_distance: the first distance searched (``> k``; the training length, to search beyond the window).
        max_distance: the last distance searched (required for a spectrum or head; for a kernel, at most
            ``n - 1``, default ``n - 1``).
        tolerance: nats below the target logit that still count (>= 0).

    Returns:
        one int or ``None`` (no alias up to ``max_distance``) per row.

    Raises:
        ValueError / TypeError: a kernel that is not ``[M, n]``; bad offsets or distances; a negative tolerance.

    Source: chapter 4 (aliases of the offset kernel); Barbero et al. 2025 (RoPE frequencies at long range).
    """
    tolerance = check_positive_float("tolerance", tolerance, allow_zero=True)
    if isinstance(source, Tensor):
        if source.dim() != 2:
            raise ValueError(f"kernel must be a tensor [M, n] in the row layout; got {tuple(source.shape)}")
        kernel = source.detach().double().cpu()
        if max_distance is not None:
            check_int("max_distance", max_distance, minimum=1, maximum=kernel.shape[1] - 1)
            kernel = kernel[:, kernel.shape[1] - 1 - max_distance:]
    else:
        if max_distance is None:
            raise ValueError("max_distance is required when the kernel is computed from a spectrum or a head")
        kernel = offset_kernel(source, check_int("max_distance", max_distance, minimum=1) + 1)
    m, n = kernel.shape
    ks = per_model_ints("offset", offset, m, minimum=1, maximum=n - 1)
    min_distance = check_int("min_distance", min_distance, minimum=max(ks) + 1, maximum=n - 1)
    by_distance = kernel.flip(1)  # a working copy: column d holds s(-d)
    out = []
    for i, k in enumerate(ks):
        row = by_distance[i]
        hits = torch.nonzero(row[min_distance:] >= row[k] - tolerance)  # NaN compares False
        out.append(int(hits[0, 0]) + min_distance if hits.numel() else None)
    return out


# ---------------------------------------------------------------- what training adds: measures and their nulls
@dataclass(frozen=True)
class CarrierMeasures:
    """Every carrier measure of chapter 4 for a set of heads, computed from their spectra.

    Attributes (each float64 ``[M]``):
        alignment_raw: ``C`` with amplitude weights ``r_i`` (:func:`alignment`).
        alignment_variation: ``C`` with variation weights ``v_i``.
        pr_amplitude: participation ratio of the amplitudes (effective number of pairs, 1..P).
        pr_variation: participation ratio of the variation weights.
        top2_kept: fraction of the window variance kept by the top-2 pairs (:func:`reconstruction`).
        peak_z: the target's margin over the best other offset in the window, in units of the
            kernel's standard deviation over the window (scale-free selectivity).
        peak_distance: distance ``d = -D`` of the window's argmax (long ``[M]``).
    """

    alignment_raw: Tensor
    alignment_variation: Tensor
    pr_amplitude: Tensor
    pr_variation: Tensor
    top2_kept: Tensor
    peak_z: Tensor
    peak_distance: Tensor

    def as_dict(self) -> dict:
        """The scalar measures by name (everything but ``peak_distance``)."""
        return {"C raw": self.alignment_raw, "C variation": self.alignment_variation,
                "PR amplitude": self.pr_amplitude, "PR variation": self.pr_variation,
                "top-2 kept": self.top2_kept, "peak z": self.peak_z}

    def select(self, index) -> "CarrierMeasures":
        """The measures of the heads ``index`` (a boolean mask or indices)."""
        return CarrierMeasures(*(getattr(self, f)[index] for f in self.__dataclass_fields__))


def measures(source, offset, window) -> CarrierMeasures:
    """The carrier measures of heads given by their spectra (trained, untrained or with shuffled phases).

    Args:
        source: a :class:`CarrierSpectrum` of M heads (``r``, ``phi`` ``[M, P]``) or a RoPE head ensemble.
        offset: the target offset k (one int, or one per head).
        window: the training length ``L`` (the window ``D = -(L-1) .. 0``) or the relative positions of
            the window (e.g. a fit's); it must hold every target ``D = -k``.

    Returns:
        :class:`CarrierMeasures`.

    Raises:
        ValueError / TypeError: bad offsets, or a window without some target ``-k``.

    Source: chapter 4 (the measures and their nulls).
    """
    spec = _spectrum(source)
    m = spec.r.shape[0]
    ks = torch.tensor(per_model_ints("offset", offset, m, minimum=1))
    rel = _window(window)
    where = (rel[None, :] == -ks[:, None])
    if not where.any(1).all():
        raise ValueError(f"window must contain every target D = -k; offsets {sorted(set(ks.tolist()))}, "
                         f"window {int(rel.min())} .. {int(rel.max())}")
    comps = components(spec, rel)
    s = comps.sum(1)  # [M, W]
    var = comps.std(-1, unbiased=False)
    rows, target = torch.arange(m), where.double().argmax(1)
    others = s.clone()
    others[rows, target] = -math.inf
    return CarrierMeasures(
        alignment_raw=alignment(spec, ks.tolist()),
        alignment_variation=alignment(spec, ks.tolist(), weights=var),
        pr_amplitude=participation_ratio(spec.r),
        pr_variation=participation_ratio(var),
        top2_kept=_kept_variance(comps, 2),
        peak_z=(s[rows, target] - others.max(1).values) / s.std(1, unbiased=False),
        peak_distance=-rel[s.argmax(1)],
    )


def shuffled_phases(spec: CarrierSpectrum, n_draws: int, seed: int = 0) -> CarrierSpectrum:
    """A null: each head's amplitudes with phases drawn uniformly in ``(-pi, pi]``, ``n_draws`` times per head.

    Keeps what a head's amplitudes say and destroys what its phases say (alignment).

    Returns:
        :class:`CarrierSpectrum` of ``M * n_draws`` heads, head-major (draws of head 0 first).
    """
    n_draws = check_int("n_draws", n_draws, minimum=1)
    gen = generator(check_int("seed", seed, minimum=0))
    r = spec.r.repeat_interleave(n_draws, 0)
    phi = (1 - 2 * torch.rand(r.shape, generator=gen, dtype=torch.float64)) * math.pi
    return CarrierSpectrum(theta=spec.theta, r=r, phi=phi)


def predicted_alias_distance(source, offset, train_len: int, max_distance: int, n_pairs: int = 2,
                             phase_tolerance: float = math.pi / 3, tolerance: float = 1.0) -> tuple[list, Tensor]:
    """Predict each head's first aliasing distance from the frequency set and its dominant pairs.

    1. The head's dominant pairs are its ``n_pairs`` pairs of largest variation over the training
       window (:func:`variation`): the pairs that do the selecting.
    2. The candidate lags are the near-recurrences of those pairs,
       :func:`~lengthgen_utils.analysis.theory.pair_recurrences` (every dominant pair within
       ``phase_tolerance`` of a whole turn): they depend on ``d_head``, the base and which pairs
       dominate, nothing else.
    3. The predicted first alias is the first candidate distance ``d = k + Delta >= train_len`` at which
       the kernel, read from the weights, comes within ``tolerance`` nats of its target logit
       (the criterion of :func:`first_alias`).

    No sequence longer than the training window is run through the model. Where the prediction equals
    :func:`first_alias` (which scans every distance), the aliases lie where the
    dominant pairs recur.

    Args:
        source: a RoPE retrieval head ensemble, or its :class:`CarrierSpectrum`.
        offset: the target offset k (one int, or one per model).
        train_len: the training length.
        max_distance: largest distance considered (>= train_len).
        n_pairs: how many dominant pairs (1 .. P).
        phase_tolerance: radians in (0, pi]; the default ``pi / 3`` keeps half of each pair's amplitude.
        tolerance: nats below the target logit that count as an alias (>= 0).

    Returns:
        ``(distances, dominant)``: a list with one predicted distance (int) or None per head, and the
        dominant pair indices ``[M, n_pairs]``.

    Source: chapter 4, "Aliases come from the frequency set".
    """
    spec = _spectrum(source)
    ks = per_model_ints("offset", offset, spec.r.shape[0], minimum=1)
    train_len = check_int("train_len", train_len, minimum=max(ks) + 2)
    max_distance = check_int("max_distance", max_distance, minimum=train_len)
    if not isinstance(tolerance, (int, float)) or isinstance(tolerance, bool) or not tolerance >= 0:
        raise ValueError(f"tolerance must be a number >= 0; got tolerance={tolerance!r}")
    n_pairs = check_int("n_pairs", n_pairs, minimum=1, maximum=spec.theta.numel())
    dominant = variation(spec, train_len).argsort(1, descending=True)[:, :n_pairs]
    out = []
    for i, k in enumerate(ks):
        lags = pair_recurrences(spec.theta, dominant[i].tolist(), max_distance - k, phase_tolerance)
        distances = lags[lags + k >= train_len] + k
        if distances.numel() == 0:
            out.append(None)
            continue
        head = spec.select([i])
        values = kernel_at(head, -distances)[0]
        target = kernel_at(head, [-k])[0, 0]
        hits = torch.nonzero(values >= target - tolerance)
        out.append(int(distances[hits[0, 0]]) if hits.numel() else None)
    return out, dominant


# ---------------------------------------------------------------- the long-run dilution law, head by head (chapter 5)
def mean_distractor_weight(source, offset, start: int, stop: int, chunk: int = 1 << 16) -> Tensor:
    """The average weight of a key relative to the target over the distances ``start .. stop-1``.

    ``(1 / (stop - start)) sum_{d = start}^{stop - 1} exp(s(-d) - s(-k))``: the measured slope of
    ``1/p(L) - 1`` between ``L = start`` and ``L = stop`` (chapter 5's exact dilution), computed from
    the weights in chunks (no ``[M, stop]`` tensor is formed).

    Args:
        source: a RoPE retrieval head ensemble, or its :class:`CarrierSpectrum`.
        offset: the target offset k (one int, or one per model).
        start, stop: ``1 <= start < stop``; the target distance ``k`` must lie below ``start``.
        chunk: distances per chunk.

    Returns:
        float64 ``[M]``.
    """
    spec = _spectrum(source)
    ks = per_model_ints("offset", offset, spec.r.shape[0], minimum=1)
    start = check_int("start", start, minimum=max(ks) + 1)
    stop = check_int("stop", stop, minimum=start + 1)
    chunk = check_int("chunk", chunk, minimum=1)
    k = torch.tensor(ks, dtype=torch.float64)
    target = (spec.r * torch.cos(-spec.theta[None, :] * k[:, None] - spec.phi)).sum(1, keepdim=True)  # s_m(-k_m)
    total = torch.zeros(spec.r.shape[0], dtype=torch.float64)
    for begin in range(start, stop, chunk):
        distances = torch.arange(begin, min(stop, begin + chunk))
        total += torch.exp(kernel_at(spec, -distances) - target).sum(1)
    return total / (stop - start)


def dilution_law_fit(source, offset, train_len: int, max_len: int) -> dict:
    """How well the long-run dilution law describes each head's exact ``1/p(L) - 1`` up to ``max_len``.

    The law anchored at the training length, with the orbit slope of
    :func:`~lengthgen_utils.analysis.theory.long_run_slope` and no fitted parameter:
    ``1/p(L) - 1 = ratio(train_len) + slope (L - train_len)``.

    Args:
        source: a RoPE retrieval head ensemble, or its :class:`CarrierSpectrum`.
        offset: the target offset k (one int, or one per head).
        train_len, max_len: the lengths the law is anchored at and tested up to.

    Returns:
        ``{"margin", "kappa", "slope", "r2"}``, each float64 ``[M]``: the window margin (nats; see
        :func:`~lengthgen_utils.analysis.theory.mean_field_parameters`), the orbit peakiness
        (:func:`~lengthgen_utils.analysis.theory.orbit_peakiness`), the slope, and the law's R^2 against the exact
        ratio at every length ``train_len .. max_len``; plus ``"ratio"`` ``[M, max_len - train_len + 1]``
        (exact) and ``"law"`` (predicted) on those lengths.

    Source: chapter 5.
    """
    spec = _spectrum(source)
    ks = per_model_ints("offset", offset, spec.r.shape[0], minimum=1)
    train_len = check_int("train_len", train_len, minimum=max(ks) + 2)
    max_len = check_int("max_len", max_len, minimum=train_len + 2)
    row = offset_kernel(spec, max_len)
    margin, _ = mean_field_parameters(row, ks, train_len)
    ratio = distractor_ratio(row, ks)[:, train_len - 1:]
    log_mean, log_max = orbit_log_stats(spec.r, spec.phi, spec.theta)  # one quadrature for slope and kappa
    k = torch.tensor(ks, dtype=torch.float64)
    target = (spec.r * torch.cos(-spec.theta[None, :] * k[:, None] - spec.phi)).sum(1)  # s_m(-k_m)
    slope = torch.exp(log_mean - target)
    steps = torch.arange(0, max_len - train_len + 1, dtype=torch.float64)
    law = ratio[:, :1] + slope[:, None] * steps[None, :]
    return {"margin": margin, "kappa": log_max - log_mean, "slope": slope,
            "r2": r_squared(ratio, law), "ratio": ratio, "law": law}


def _by_distance(kernel: Tensor, offset, train_len: int) -> tuple[Tensor, Tensor, int]:
    """A row-layout kernel ``[M, n]`` checked and flipped into a working copy whose column ``d`` holds ``s(-d)``
    (float64 on the CPU), with the offsets ``[M]`` and the checked training length (``3 <= train_len < n``,
    ``1 <= k <= train_len - 2``)."""
    if not isinstance(kernel, Tensor) or kernel.dim() != 2:
        raise ValueError(f"kernel must be a tensor [M, n] in the row layout; got {getattr(kernel, 'shape', kernel)!r}")
    m, n = kernel.shape
    train_len = check_int("train_len", train_len, minimum=3, maximum=n - 1)
    ks = torch.tensor(per_model_ints("offset", offset, m, minimum=1, maximum=train_len - 2))
    return kernel.detach().double().cpu().flip(1), ks, train_len


def selection_margins(kernel: Tensor, offset, train_len: int) -> tuple[Tensor, Tensor]:
    """How far a kernel's target stands above the other offsets, inside and beyond the training window.

    For a kernel in the row layout (column ``j`` holds ``s(D = j - (n-1))``):

    * ``inside = s(-k) - max_{1 <= d < train_len, d != k} s(-d)``: the margin training could see;
    * ``beyond = max_{train_len <= d < n} s(-d) - s(-k)``: how far the best offset training never saw
      rises above the target (> 0: a key beyond the window outscores the target).

    The query itself (``d = 0``) is excluded: its value is the query token, never a target.

    Args:
        kernel: ``[M, n]`` logits (nats), ``n > train_len``.
        offset: the target offset ``k`` (one int, or one per model), ``k <= train_len - 2``.
        train_len: the training length.

    Returns:
        ``(inside [M], beyond [M])`` float64 (nats).

    Raises:
        ValueError / TypeError: a kernel that is not ``[M, n]`` with ``n > train_len``; bad offsets.

    Source: chapter 6 (what softmax's normaliser makes training do).
    """
    by_distance, ks, train_len = _by_distance(kernel, offset, train_len)
    rows = torch.arange(by_distance.shape[0])
    target = by_distance[rows, ks]
    window = by_distance[:, 1:train_len].clone()
    window[rows, ks - 1] = -math.inf
    return target - window.max(1).values, by_distance[:, train_len:].max(1).values - target


def unseen_weight(kernel: Tensor, offset, train_len: int) -> Tensor:
    """The keys training never saw, weighed together against the target: ``log sum_{train_len <= d < n} e^{s(-d) - s(-k)}``.

    For a kernel in the row layout over ``n`` relative positions (a sequence of ``n`` tokens): below 0,
    the keys beyond the training window hold less attention together than the target alone (under any
    normaliser that divides a row by one number, softmax included); the mass they take grows with their
    number, so this is the dilution the sequence brings (chapter 5) in one number.

    Args:
        kernel: ``[M, n]`` logits (nats), ``n > train_len``.
        offset: the target offset ``k`` (one int, or one per model), ``k <= train_len - 2``.
        train_len: the training length.

    Returns:
        float64 ``[M]`` (nats).

    Raises:
        ValueError / TypeError: as :func:`selection_margins`.

    Source: chapter 6 (which heads keep the target at long lengths).
    """
    by_distance, ks, train_len = _by_distance(kernel, offset, train_len)
    target = by_distance[torch.arange(by_distance.shape[0]), ks]
    return torch.logsumexp(by_distance[:, train_len:] - target[:, None], dim=1)


# ---------------------------------------------------------------- a carrier fitted to a measured profile (chapter 7)
#
# The measures above read the carrier of a position-only head off its weights. A head of a full
# transformer has no such closed form in general, but its attention logit averaged over content is
# still a function of the offset alone under RoPE (chapter 2): fit the carrier form to it and apply
# the same measures to the fitted spectrum.

@dataclass(frozen=True)
class CarrierFit:
    """A carrier ``s(D) = sum_i r_i cos(theta_i D - phi_i)`` least-squares fitted to measured profiles.

    Attributes:
        spectrum: the fitted :class:`CarrierSpectrum` (``r``, ``phi``: ``[N, P]`` for N profiles).
        window: the relative positions ``D`` the fit used, long ``[W]``.
        r2: float64 ``[N]``, the fraction of each profile's variance over the window that the fit explains.
    """

    spectrum: CarrierSpectrum
    window: Tensor
    r2: Tensor


def fit_carrier(profile: Tensor, window, theta, rcond: float = 1e-3) -> CarrierFit:
    """Least-squares fit of the carrier form ``sum_i r_i cos(theta_i D - phi_i)`` to offset profiles.

    Writing ``r_i cos(theta_i D - phi_i) = a_i cos(theta_i D) + b_i sin(theta_i D)`` makes the fit
    linear in ``c = (a, b)``: ``c = pinv(Phi_W) s_W`` over the window ``W`` of relative positions
    (the minimum-norm least-squares solution, so frequencies that barely turn over the window and
    cannot be told apart share their part rather than cancel with huge amplitudes). Then
    ``r_i = |a_i + 1j b_i|`` and ``phi_i = arg(a_i + 1j b_i)``, the convention of
    :func:`carrier_spectrum`, so :func:`alignment` and the other measures read it the same way.

    Args:
        profile: float ``[N, W]``: column ``w`` holds the profile at ``window[w]``, in any order the window
            gives (e.g. a head's mean attention logit at each relative position of the window, picked out of the
            row layout of :func:`~lengthgen_utils.analysis.probes.head_offset_profiles` at index ``window - 1``).
        window: the ``W`` integer relative positions ``D`` of the columns (distinct).
        theta: ``[P]`` frequencies in rad/token (e.g. ``RoPE().frequencies(d_head, L)``).
        rcond: singular values of ``Phi_W`` below ``rcond * sigma_max`` are dropped. With RoPE's
            frequencies (base ``10^4``, ``d_head = 16``) on the 31 offsets of a length-32 window, the
            default keeps 8 of the 16 directions (singular values 12.9 down to 0.066); the next ones
            (0.002, 2e-5, ...) would let a fit to noise reach amplitudes of ``10^6``.

    Returns:
        :class:`CarrierFit`.

    Raises:
        ValueError / TypeError: shapes that do not match, repeated or non-integer positions, a
            non-finite profile, a profile constant over the window. (A window shorter than ``2 P``
            is allowed: the fit is then the minimum-norm one among exact fits.)

    Source: the carrier form of chapter 4 (RoFormer's eq. (34) read as a function of the offset).
    """
    window = check_relative_positions("window", window)
    if window.unique().numel() != window.numel():
        raise ValueError(f"window must hold distinct relative positions; got {window.tolist()}")
    theta = torch.as_tensor(theta, dtype=torch.float64).flatten()
    if theta.numel() < 1 or not torch.isfinite(theta).all():
        raise ValueError(f"theta must be a non-empty tensor of finite frequencies; got {theta!r}")
    if not isinstance(profile, Tensor) or profile.dim() != 2 or profile.shape[1] != window.numel():
        raise ValueError(f"profile must be a tensor [N, W = {window.numel()}] (one column per window position); "
                         f"got {tuple(getattr(profile, 'shape', ()))}")
    y = profile.detach().double().cpu()
    if not torch.isfinite(y).all():
        raise ValueError("profile must be finite over the window (a NaN marks an offset it did not average)")
    variance = ((y - y.mean(1, keepdim=True)) ** 2).sum(1)
    if (variance == 0).any():
        raise ValueError("a profile is constant over the window: its carrier fit is undefined")
    phi = rope_kernel_features(window, 2 * theta.numel(), frequencies=theta)  # [W, 2P]
    c = y @ torch.linalg.pinv(phi, rtol=check_positive_float("rcond", rcond)).T  # [N, 2P]
    residual = ((y - c @ phi.T) ** 2).sum(1)
    p = theta.numel()
    z = torch.complex(c[:, :p], c[:, p:])
    return CarrierFit(CarrierSpectrum(theta=theta, r=z.abs(), phi=z.angle()), window, 1 - residual / variance)


def _kept_variance(comps: Tensor, rank: int) -> Tensor:
    """``1 - ||s - s_r||^2 / ||s - mean s||^2`` for components ``[N, P, W]`` keeping the top-``rank`` pairs."""
    order = comps.std(-1, unbiased=False).argsort(1, descending=True)
    keep = torch.zeros(comps.shape[:2], dtype=torch.bool)
    keep.scatter_(1, order[:, :rank], True)
    approx = torch.where(keep[..., None], comps, comps.mean(-1, keepdim=True)).sum(1)
    s = comps.sum(1)
    variance = ((s - s.mean(-1, keepdim=True)) ** 2).sum(-1)
    if bool((variance == 0).any()):
        raise ValueError("a carrier is constant over the window: it has no variance, so the fraction of it kept "
                         "divides by 0")
    return 1 - ((s - approx) ** 2).sum(-1) / variance


