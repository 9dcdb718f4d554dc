"""Positional encodings: RoPE (half-split and interleaved), learned APE, NoPE.

The book's convention is the **half-split** RoPE pairing (channel ``i`` is
rotated together with channel ``i + d_head/2``, as in GPT-NeoX and Llama); the
**interleaved** pairing (channels ``2i`` and ``2i+1``, as in the original
RoFormer paper and ``rotary-embedding-torch``) is available through
``interleaved=True``. The two give the same scores up to a fixed permutation
of channels.

Sources: Su et al. 2021, *RoFormer* (RoPE, eq. 13-15); Vaswani et al. 2017
(sinusoidal and learned absolute positions); Kazemnejad et al. 2023 (NoPE).
"""
from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor, nn

from ._validate import check_int, check_positive_float, check_rope_base

PE_NAMES = ("rope", "ape", "nope")


def check_pe(pe: str) -> str:
    """Return ``pe`` if it names a positional encoding of this package.

    Raises:
        TypeError: ``pe`` is not a string.
        ValueError: ``pe`` is not one of :data:`PE_NAMES`.
    """
    if not isinstance(pe, str):
        raise TypeError(f"pe must be a str, one of {PE_NAMES}; got {type(pe).__name__} {pe!r}")
    if pe not in PE_NAMES:
        raise ValueError(f"pe must be one of {PE_NAMES}; got {pe!r}")
    return pe


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


def rope_angles(positions: Tensor, d_head: int, base: float = 10000.0) -> Tensor:
    """Rotation angles ``positions[..., None] * theta`` in float64.

    float64 keeps the angle at position 10^5 exact to ~1e-11 rad; float32
    would be off by up to 4e-3 rad there (its spacing at 1e5 is 0.0078), which
    moves logits by ~1e-4. Never form angles in float16/bfloat16: at position
    1857 a float16 angle is off by about 0.7 rad.

    Args:
        positions: integer tensor of any shape ``[...]`` (token indices).
        d_head: even head dimension.
        base: RoPE base.

    Returns:
        float64 tensor ``[..., d_head // 2]`` of angles in radians.
    """
    _check_positions(positions)
    theta = rope_inverse_frequencies(d_head, base).to(positions.device)
    return positions.to(torch.float64)[..., None] * theta


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
    query at position m and a key at position n,
    ``<R_m q, R_n k> = <q, R_{n-m} k>``: the score depends on ``n - m`` alone.

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


def rope_cos_sin(seq_len: int, d_head: int, base: float = 10000.0, position_shift: int = 0,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """cos and sin of the RoPE angles at positions ``shift .. shift + seq_len - 1``, memoised.

    The same numbers :func:`apply_rope` computes for ``positions = arange(seq_len) + position_shift``
    (angles in float64, then cos/sin cast to ``dtype``), computed once per
    ``(seq_len, d_head, base, position_shift, dtype, device)`` instead of once
    per training step. The returned tensors are shared between callers: never
    modify them in place.

    Args:
        seq_len: L >= 1.
        d_head: even head dimension.
        base: RoPE base.
        position_shift: the first position (any integer).
        dtype: floating dtype of the returned tables.
        device: where the tables live.

    Returns:
        ``cos, sin``, each ``[seq_len, d_head // 2]`` of ``dtype`` on ``device``.

    Raises:
        ValueError / TypeError: ``seq_len < 1``, odd ``d_head``, ``base <= 1``, a non-floating ``dtype``.
    """
    seq_len = check_int("seq_len", seq_len, minimum=1)
    position_shift = check_int("position_shift", position_shift)
    d_head = check_int("d_head", d_head, minimum=2)
    base = check_rope_base("base", base)  # validated before the cache sees it (an unhashable value would fail there)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype; got {dtype!r}")
    return _rope_cos_sin(seq_len, d_head, base, position_shift, dtype, torch.device(device))


@lru_cache(maxsize=256)
def _rope_cos_sin(seq_len, d_head, base, position_shift, dtype, device) -> tuple[Tensor, Tensor]:
    """The memoised body of :func:`rope_cos_sin` (validated arguments)."""
    with torch.inference_mode(False):  # cached tables must stay usable by autograd whoever built them first
        positions = torch.arange(seq_len, device=device) + position_shift
        angles = rope_angles(positions, d_head, base)
        return angles.cos().to(dtype), angles.sin().to(dtype)


rope_cos_sin.cache_clear = _rope_cos_sin.cache_clear
rope_cos_sin.cache_info = _rope_cos_sin.cache_info


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


class LearnedAbsolutePE(nn.Module):
    """A learned absolute position table ``p_t`` (one row per position).

    Rows are initialised explicitly from N(0, init_std^2). A row that no
    training sequence reaches gets exactly zero gradient and keeps its
    initial value (chapter 3).

    Args:
        max_len: number of rows (positions ``0 .. max_len-1``), >= 1.
        d_model: width of each row, >= 1.
        n_models: leading ensemble dimension, >= 1.
        init_std: standard deviation of the initial rows, >= 0.
        generators: optional list of ``n_models`` ``torch.Generator``s, one per model.

    Shapes:
        ``weight``: ``[n_models, max_len, d_model]``; ``forward(positions [L])``
        returns ``[n_models, L, d_model]``.

    Raises:
        ValueError: a size is out of range; ``forward`` is asked for a
        position outside ``0 .. max_len-1`` (never clamped or wrapped).

    Source: Gehring et al. 2017; Vaswani et al. 2017 (learned variant); Devlin et al. 2019.
    """

    def __init__(self, max_len: int, d_model: int, n_models: int = 1, init_std: float = 0.02, generators=None):
        super().__init__()
        self.max_len = check_int("max_len", max_len, minimum=1)
        self.d_model = check_int("d_model", d_model, minimum=1)
        n_models = check_int("n_models", n_models, minimum=1)
        init_std = check_positive_float("init_std", init_std, allow_zero=True)
        weight = torch.empty(n_models, max_len, d_model)
        for i in range(n_models):
            gen = generators[i] if generators is not None else None
            weight[i].normal_(0.0, init_std, generator=gen)
        self.weight = nn.Parameter(weight)

    def check_length(self, positions: Tensor) -> None:
        """Raise ``ValueError`` if any position falls outside the table."""
        _check_positions(positions)
        if positions.numel() == 0:
            return
        lo, hi = int(positions.min()), int(positions.max())
        if lo < 0 or hi >= self.max_len:
            raise ValueError(
                f"APE table has {self.max_len} rows (positions 0..{self.max_len - 1}); asked for positions "
                f"{lo}..{hi} (sequence length {hi + 1}). Build the model with max_len >= {hi + 1}."
            )

    def forward(self, positions: Tensor) -> Tensor:
        self.check_length(positions)
        return self.weight[:, positions.to(self.weight.device)]
