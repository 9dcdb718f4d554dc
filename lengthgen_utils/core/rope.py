"""RoPE's numerics, written once: the rotation of channel pairs, its angles and the offset kernel's features.

Everything a model or an analysis needs to compute with rotary position embeddings, and nothing else:

* the frequencies ``theta_i = base^(-2i/d_head)`` and the angles ``t * theta_i`` (formed in float64, or in a
  low precision to show what implementations that cache angles in the model's dtype compute, chapter 2);
* :func:`rotate_pairs` and :func:`apply_rope`, the textbook rotation (the function chapter 0 writes by hand; the
  readable :class:`~lengthgen_utils.core.models.Transformer` applies it through ``RoPE.rotate``, from the
  tables memoised per length); the one-complex-multiply form (:func:`rotate_adjacent_pairs`) that
  :class:`~lengthgen_utils.core.fast.FastTransformer` uses on reordered channels;
* the features of the offset kernel ``s(D) = Phi(D) . c`` (:func:`rope_kernel_features`) and the coefficients
  ``c`` of a query/key pair (:func:`rope_kernel_coefficients`): RoPE's dot product as a function of the relative
  position, which a model (:class:`~lengthgen_utils.core.models.KernelHead`) and the analysis
  (:mod:`~lengthgen_utils.analysis.kernel`) share.

**Pairing.** The book's convention is the **half-split** pairing (channel ``i`` is rotated together with
channel ``i + d_head/2``, as in GPT-NeoX and Llama); the **interleaved** pairing (channels ``2i`` and ``2i+1``, as
in RoFormer and ``rotary-embedding-torch``) is ``interleaved=True``. The two give the same scores up to a fixed
permutation of channels.

Source: Su et al. 2021, *RoFormer* (eq. 13-15, 34).
"""
from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from .._validate import check_int, check_rope_base


def rope_inverse_frequencies(d_head: int, base: float = 10000.0) -> Tensor:
    """RoPE inverse frequencies ``theta_i = base ** (-2 i / d_head)``.

    Args:
        d_head: head dimension, a positive even integer.
        base: the RoPE base (10000 in RoFormer), a positive float.

    Returns:
        float64 tensor ``[d_head // 2]``, radians per position, decreasing from 1.

    Raises:
        ValueError: ``d_head`` is not a positive even integer, or ``base <= 1``.

    Source: Su et al. 2021, RoFormer, eq. (15).
    """
    check_int("d_head", d_head, minimum=2)
    if d_head % 2:
        raise ValueError(f"d_head must be even for RoPE (channels are rotated in pairs); got d_head={d_head}")
    base = check_rope_base("base", base)
    exponents = torch.arange(0, d_head, 2, dtype=torch.float64) / d_head
    return base ** (-exponents)


def rope_angles(positions: Tensor, d_head: int, base: float = 10000.0, dtype: torch.dtype = torch.float64) -> Tensor:
    """Rotation angles ``positions[..., None] * theta``, formed in ``dtype`` and returned in float64.

    float64 (the default, and what every model of the package uses) keeps the angle at
    position 10^5 exact to ~1e-11 rad; float32 would be off by up to 4e-3 rad there (its
    spacing at 1e5 is 0.0078), which moves logits by ~1e-4; at position 1857 a float16 angle is
    off by about 0.7 rad. Lower precisions are for showing that failure (chapter 2).

    Args:
        positions: integer tensor of any shape ``[...]`` (token indices).
        d_head: even head dimension.
        base: RoPE base.
        dtype: the floating dtype the product ``position * theta`` is formed in.

    Returns:
        float64 tensor ``[..., d_head // 2]`` of angles in radians.

    Raises:
        TypeError: non-integer positions or a non-floating ``dtype``.
        ValueError: ``d_head``/``base`` out of range, or a position beyond ``dtype``'s largest finite value.
    """
    return angles_in_dtype(positions, rope_inverse_frequencies(d_head, base), dtype)


def angles_in_dtype(positions: Tensor, theta: Tensor, dtype: torch.dtype = torch.float64) -> Tensor:
    """``positions[..., None] * theta`` formed in ``dtype`` (positions and frequencies rounded to it), as float64.

    Raises:
        TypeError / ValueError: see :func:`rope_angles`.
    """
    _check_positions(positions)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype; got {dtype!r}")
    if positions.numel() and int(positions.abs().max()) > torch.finfo(dtype).max:
        raise ValueError(f"positions up to {int(positions.abs().max())} overflow {dtype} "
                         f"(largest finite value {torch.finfo(dtype).max:g})")
    theta = theta.to(positions.device)
    return (positions.to(dtype)[..., None] * theta.to(dtype)).to(torch.float64)


def _check_positions(positions: Tensor) -> None:
    if not isinstance(positions, Tensor):
        raise TypeError(f"positions must be an integer torch.Tensor; got {type(positions).__name__}")
    if positions.dtype.is_floating_point or positions.dtype.is_complex or positions.dtype == torch.bool:
        raise TypeError(f"positions must have an integer dtype (e.g. torch.long); got {positions.dtype}")


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """Rotate each channel pair of ``x`` by the angle whose cos/sin are given.

    Args:
        x: ``[..., d_head]``.
        cos, sin: broadcastable to ``[..., d_head // 2]``, same dtype as ``x``.
        interleaved: pair channels ``(2i, 2i+1)`` if True, else ``(i, i + d_head/2)``.

    Returns:
        ``[..., d_head]``: pair ``(x1, x2)`` becomes ``(x1 cos - x2 sin, x1 sin + x2 cos)``.
    """
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return out.flatten(-2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def apply_rope(x: Tensor, positions: Tensor, base: float = 10000.0, interleaved: bool = False) -> Tensor:
    """Apply rotary position embedding to the last dimension of ``x``.

    ``x[..., l, :]`` is rotated by ``R(positions[l] * theta)``, so that for a
    query at position m and a key at position j,
    ``<R_m q, R_j k> = <q, R_{j-m} k>``: the score depends on ``D = j - m`` alone.

    Args:
        x: float tensor ``[..., L, d_head]`` (e.g. ``[B, H, L, d_head]``), ``d_head`` even.
        positions: integer tensor ``[L]``, or ``[B, L]`` where ``B == x.shape[0]``
            (then broadcast over any dims between batch and ``L``, e.g. heads).
            Any integers, negative included: RoPE is defined for every position.
        base: RoPE base (10000 by default).
        interleaved: channel pairing, see the module docstring.

    Returns:
        tensor of the same shape and dtype as ``x``. Angles and their cos/sin
        are computed in float64 whatever ``x.dtype`` is; only cos/sin are cast
        to ``x.dtype``.

    Raises:
        TypeError: ``x`` is not a floating tensor or ``positions`` is not integer.
        ValueError: odd ``d_head``, or ``positions`` does not match ``x``'s length/batch.

    Source: Su et al. 2021, RoFormer, eq. (34) (the efficient form).
    """
    if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
        raise TypeError(f"x must be a floating-point torch.Tensor [..., L, d_head]; got {getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() < 2:
        raise ValueError(f"x must have shape [..., L, d_head] (at least 2 dims); got shape {tuple(x.shape)}")
    _check_positions(positions)
    seq_len, d_head = x.shape[-2], x.shape[-1]
    if d_head % 2:
        raise ValueError(f"d_head (last dim of x) must be even for RoPE; got d_head={d_head}")
    if positions.dim() not in (1, 2) or positions.shape[-1] != seq_len:
        raise ValueError(
            f"positions must have shape [L] or [B, L] with L = x.shape[-2] = {seq_len}; got {tuple(positions.shape)}"
        )
    angles = rope_angles(positions.to(x.device), d_head, base)  # [L, d/2] or [B, L, d/2]
    if positions.dim() == 2:
        if x.dim() < 3 or positions.shape[0] != x.shape[0]:
            raise ValueError(
                f"positions of shape [B, L] need x of shape [B, ..., L, d_head] with the same B; "
                f"got positions {tuple(positions.shape)} and x {tuple(x.shape)}"
            )
        angles = angles.view(positions.shape[0], *([1] * (x.dim() - 3)), seq_len, d_head // 2)
    return rotate_pairs(x, angles.cos().to(x.dtype), angles.sin().to(x.dtype), interleaved)


@lru_cache(maxsize=256)
def _rope_cos_sin(seq_len, d_head, base, position_shift, dtype, device) -> tuple[Tensor, Tensor]:
    """cos and sin ``[seq_len, d_head // 2]`` of the RoPE angles at positions ``shift .. shift + seq_len - 1``
    (angles in float64, as :func:`apply_rope` forms them, then cast to ``dtype``), memoised per
    ``(seq_len, d_head, base, position_shift, dtype, device)``: no per-step trigonometry. The tensors are the
    memo itself, so only the package's rotations read them (never in place) and no public function hands
    them out; arguments are the callers' validated ones."""
    with torch.inference_mode(False):  # cached tables must stay usable by autograd whoever built them first
        positions = torch.arange(seq_len, device=device) + position_shift
        angles = rope_angles(positions, d_head, base)
        return angles.cos().to(dtype), angles.sin().to(dtype)


COMPLEX_DTYPES = {torch.float32: torch.complex64, torch.float64: torch.complex128}
"""Real dtypes whose interleaved rotation runs as one complex multiply (half precision has no complex kernel)."""


@lru_cache(maxsize=256)
def _rope_phases(seq_len, d_head, base, position_shift, dtype, device) -> Tensor:
    """``cos + i sin`` of :func:`_rope_cos_sin`'s tables (real ``dtype``), as one complex table ``[L, d_head // 2]``."""
    with torch.inference_mode(False):
        cos, sin = _rope_cos_sin(seq_len, d_head, base, position_shift, dtype, device)
        return torch.complex(cos, sin)


def rotate_adjacent_pairs(x: Tensor, phases: Tensor) -> Tensor:
    """The interleaved rotation of :func:`rotate_pairs` as one complex multiply.

    Pair ``(x_2i, x_2i+1)`` is read as the complex number ``x_2i + i x_2i+1`` and multiplied by
    ``phases = cos + i sin``: ``(x1 cos - x2 sin) + i (x1 sin + x2 cos)``, the same rotation in one
    kernel (forward and backward) instead of strided half-views. Equal to
    ``rotate_pairs(x, cos, sin, interleaved=True)`` up to float rounding (a few ulp).

    Args:
        x: ``[..., d_head]``, float32 or float64 (any strides; copied only if a complex view is impossible).
        phases: complex, broadcastable to ``[..., d_head // 2]``.

    Returns:
        ``[..., d_head]`` of ``x``'s dtype.
    """
    pairs = x.unflatten(-1, (-1, 2))
    if pairs.stride(-1) != 1 or pairs.storage_offset() % 2 or any(s % 2 for s in pairs.stride()[:-1]):
        pairs = pairs.contiguous()
    return torch.view_as_real(torch.view_as_complex(pairs) * phases).flatten(-2)


def rope_rotation_matrix(angles: Tensor, interleaved: bool = False) -> Tensor:
    """The explicit block-rotation matrix ``R`` with ``apply_rope(x) == x @ R.T``.

    Args:
        angles: ``[..., d_head // 2]`` radians.
        interleaved: channel pairing.

    Returns:
        ``[..., d_head, d_head]`` orthogonal matrices (for proofs and tests; the
        model never builds them).
    """
    n_pairs = angles.shape[-1]
    eye = torch.eye(2 * n_pairs, dtype=angles.dtype, device=angles.device)
    eye = eye.expand(*angles.shape[:-1], 2 * n_pairs, 2 * n_pairs)
    # Column c of R is R applied to basis vector e_c: rotate the identity's rows.
    return rotate_pairs(eye, angles.cos()[..., None, :], angles.sin()[..., None, :], interleaved).transpose(-1, -2)


# ---------------------------------------------------------------- the offset kernel of a RoPE dot product
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
    freq = torch.as_tensor(frequencies, dtype=torch.float64).flatten().clone()  # never the caller's own tensor
    if freq.shape != theta.shape or not torch.isfinite(freq).all():
        raise ValueError(f"frequencies must be d_head // 2 = {theta.numel()} finite numbers; got {frequencies!r}")
    return freq


def check_relative_positions(name: str, values) -> Tensor:
    """Integer relative positions ``D`` (a list or an integer tensor) as a flat long tensor.

    Raises:
        TypeError: non-integers. ValueError: empty.
    """
    if isinstance(values, Tensor):
        if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers; got dtype {values.dtype}")
        out = values.to(torch.long).flatten()
    else:
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise TypeError(f"{name} must be a sequence of ints or an integer tensor; got {type(values).__name__}")
        out = torch.tensor([check_int(f"{name}[{i}]", d) for i, d in enumerate(values)], dtype=torch.long)
    if out.numel() == 0:
        raise ValueError(f"{name} must not be empty")
    return out


def rope_kernel_features(relative_positions, d_head: int, base: float = 10000.0, frequencies=None) -> Tensor:
    """The RoPE offset features ``Phi(D) = [cos(theta_i D)]_i ++ [sin(theta_i D)]_i``.

    Args:
        relative_positions: integers ``D = j - m`` (key minus query position), a list or an integer tensor ``[n]``.
        d_head: even head dimension (``d_head // 2`` frequencies).
        base: RoPE base.
        frequencies: optional explicit ``theta [d_head // 2]`` replacing RoPE's (see :func:`kernel_frequencies`).

    Returns:
        float64 tensor ``[n, d_head]``: row ``D`` gives ``s(D) = Phi(D) . c``.

    Raises:
        TypeError / ValueError: non-integer or empty positions, odd ``d_head``, ``base <= 1``.

    Source: Su et al. 2021 (RoFormer), eq. (34), written as a function of the offset (chapter 4).
    """
    rel = check_relative_positions("relative_positions", relative_positions)
    return _kernel_features(rel, kernel_frequencies(d_head, base, frequencies))


def _kernel_features(relative: Tensor, theta: Tensor) -> Tensor:
    """:func:`rope_kernel_features` of checked arguments: integer ``D [n]`` and float64 frequencies ``theta [P]``
    (e.g. a :class:`~lengthgen_utils.core.models.KernelHead`'s, checked when it was built): float64 ``[n, 2P]``."""
    angles = relative.to(torch.float64)[:, None] * theta
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
        ``[..., d_head]`` in the order of :func:`rope_kernel_features` (all ``a``, then all ``b``), in
        float32 for float16/bfloat16 inputs (their products are formed in float32, as attention scores
        are), else in the inputs' dtype. Divide by ``sqrt(d_head)`` for a head that scales its logits.

    Raises:
        TypeError / ValueError: non-float tensors, mismatched shapes or an odd last dimension.

    Source: chapter 4, "The offset kernel" (the angle-addition formulas).
    """
    for name, x in (("q", q), ("k", k)):
        if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor [..., d_head]; got {type(x).__name__}")
    if q.shape != k.shape or q.dim() < 1 or q.shape[-1] % 2 or q.shape[-1] < 2:
        raise ValueError(f"q and k must have the same shape [..., d_head] with d_head even and >= 2; "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if q.dtype in (torch.float16, torch.bfloat16):
        q, k = q.float(), k.float()
    if interleaved:
        q1, q2, k1, k2 = q[..., 0::2], q[..., 1::2], k[..., 0::2], k[..., 1::2]
    else:
        h = q.shape[-1] // 2
        q1, q2, k1, k2 = q[..., :h], q[..., h:], k[..., :h], k[..., h:]
    return torch.cat([q1 * k1 + q2 * k2, q2 * k1 - q1 * k2], dim=-1)



ANGLE_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16}


def _is_range(positions: Tensor) -> bool:
    """True when ``positions`` is ``p, p+1, ..., p+L-1`` (the usual case, whose tables are memoised)."""
    if positions.dim() != 1 or positions.numel() == 0:
        return False
    first = int(positions[0])
    return bool(torch.equal(positions, torch.arange(first, first + positions.numel(), device=positions.device)))
