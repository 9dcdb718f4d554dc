"""Position encodings as objects behind one interface, a registry, and RoPE's numerics.

An encoding can act in only four places, and :class:`Encoding` names them
(the same split as TransformerLens's, where an encoding touches the embedding
and the attention scores):

1. ``embed``: a vector added to the residual stream at each position (absolute encodings);
2. ``rotate``: a position-dependent map of queries and keys (RoPE);
3. ``score_bias``: a bias added to the attention logit of each (query, key) pair (ALiBi);
4. ``train_positions``: the position indices used in training (randomised positions).

plus what figures need: a ``label`` and a ``color``, and whether the logit is a
function of the offset alone by construction (``relative``). Models, probes,
plots and widgets ask the object; none of them compares names. Encodings are
frozen dataclasses (hashable: they sit in experiment configurations and key
the results cache); learned tables are created by ``init_parameters`` and
live in the model, which hands them back to ``embed`` / ``score_bias``.

**Adding an encoding** is one class in this module, decorated with
:func:`register`; every model, probe and figure then accepts it by object or by
name (:func:`get_encoding`).

**Weights and conventions.** The book writes a query as ``q = W_Q x`` with
``W_Q`` of shape ``[d_head, d_model]`` acting on a column vector; the package
stores every weight the same way, ``[out, in]`` (as ``torch.nn.Linear`` does),
with a leading ensemble dimension ``M``.

**RoPE pairing.** The book's convention is the **half-split** pairing
(channel ``i`` is rotated together with channel ``i + d_head/2``, as in GPT-NeoX
and Llama); the **interleaved** pairing (channels ``2i`` and ``2i+1``, as in
RoFormer and ``rotary-embedding-torch``) is ``RoPE(interleaved=True)``. The two
give the same scores up to a fixed permutation of channels.

Sources: Su et al. 2021, *RoFormer* (RoPE, eq. 13-15, 34); Vaswani et al. 2017 (sinusoidal and
learned absolute positions) and Gehring et al. 2017; Kazemnejad et al. 2023 (NoPE); Press et al. 2022
(ALiBi); Raffel et al. 2020 (T5's bucketed relative bias); Ruoss et al. 2023 (randomised positions);
Chen et al. 2023 (position interpolation) and Peng et al. 2024 (NTK-aware scaling). Each class names its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from typing import ClassVar

import torch
from torch import Tensor

from ._validate import check_device, check_int, check_positive_float, check_rope_base, normalize_numbers


# ---------------------------------------------------------------- RoPE numerics
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
    per training step. The tables are computed once and kept; each call returns
    its own copy of them, so a caller that edits the result in place changes
    nothing else (the models' rotations read the memo itself, which nothing
    outside the package ever holds).

    Args:
        seq_len: L >= 1.
        d_head: even head dimension.
        base: RoPE base.
        position_shift: the first position (any integer).
        dtype: floating dtype of the returned tables.
        device: where the tables live (checked by :func:`~lengthgen_utils._validate.check_device`).

    Returns:
        ``cos, sin``, each ``[seq_len, d_head // 2]`` of ``dtype`` on ``device`` (the caller's own copy).

    Raises:
        ValueError / TypeError: ``seq_len < 1``, odd ``d_head``, ``base <= 1``, a non-floating ``dtype``,
            a device this machine cannot compute on.
    """
    seq_len = check_int("seq_len", seq_len, minimum=1)
    position_shift = check_int("position_shift", position_shift)
    d_head = check_int("d_head", d_head, minimum=2)
    base = check_rope_base("base", base)  # validated before the cache sees it (an unhashable value would fail there)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype; got {dtype!r}")
    cos, sin = _rope_cos_sin(seq_len, d_head, base, position_shift, dtype, check_device(device))
    return cos.clone(), sin.clone()


@lru_cache(maxsize=256)
def _rope_cos_sin(seq_len, d_head, base, position_shift, dtype, device) -> tuple[Tensor, Tensor]:
    """The memoised body of :func:`rope_cos_sin` (validated arguments); the tensors are the memo itself:
    only the package's rotations read them, and never in place."""
    with torch.inference_mode(False):  # cached tables must stay usable by autograd whoever built them first
        positions = torch.arange(seq_len, device=device) + position_shift
        angles = rope_angles(positions, d_head, base)
        return angles.cos().to(dtype), angles.sin().to(dtype)


rope_cos_sin.cache_clear = _rope_cos_sin.cache_clear
rope_cos_sin.cache_info = _rope_cos_sin.cache_info

COMPLEX_DTYPES = {torch.float32: torch.complex64, torch.float64: torch.complex128}
"""Real dtypes whose interleaved rotation runs as one complex multiply (half precision has no complex kernel)."""


@lru_cache(maxsize=256)
def _rope_phases(seq_len, d_head, base, position_shift, dtype, device) -> Tensor:
    """``cos + i sin`` of :func:`rope_cos_sin`'s tables (real ``dtype``), as one complex table ``[L, d_head // 2]``."""
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
        relative_positions: integers ``D = j - i`` (key minus query position), a list or an integer tensor ``[n]``.
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
    theta = kernel_frequencies(d_head, base, frequencies)
    angles = rel.to(torch.float64)[:, None] * theta
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


# ---------------------------------------------------------------- encodings: the interface and the registry
ENCODINGS: dict[str, type] = {}


def register(cls):
    """Class decorator: make an :class:`Encoding` subclass available by its ``name`` (see :func:`get_encoding`)."""
    if not (isinstance(cls, type) and issubclass(cls, Encoding)) or not cls.name:
        raise TypeError(f"register takes an Encoding subclass with a non-empty name; got {cls!r}")
    if cls.name in ENCODINGS and ENCODINGS[cls.name] is not cls:
        raise ValueError(f"an encoding named {cls.name!r} is already registered ({ENCODINGS[cls.name].__name__})")
    ENCODINGS[cls.name] = cls
    return cls


def encoding_names() -> tuple[str, ...]:
    """The registered encodings' names, in registration order."""
    return tuple(ENCODINGS)


def get_encoding(spec, name: str = "pe") -> "Encoding":
    """The encoding ``spec`` names: an :class:`Encoding` instance is returned as is, a name gives its default.

    Args:
        spec: an Encoding, or a registered name.
        name: the argument's name in error messages (e.g. ``"base"`` for a wrapper's base encoding).

    Raises:
        TypeError: ``spec`` is neither an ``Encoding`` nor a string.
        ValueError: an unknown name; the message lists the registered ones.
    """
    if isinstance(spec, Encoding):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"{name} must be an Encoding or one of the names {encoding_names()}; "
                        f"got {type(spec).__name__} {spec!r}")
    if spec not in ENCODINGS:
        raise ValueError(f"{name}={spec!r} is not a registered position encoding; the registered ones are "
                         f"{encoding_names()}")
    return ENCODINGS[spec]()


@dataclass(frozen=True)
class Encoding:
    """What a position encoding does, at the only places it can act (see the module docstring).

    The defaults do nothing, which is NoPE: a subclass overrides the places where it acts.

    Shapes (M = ensemble size, L = sequence length, H = heads):
        * ``init_parameters(...)``: ``{name: tensor [M, ...]}``, the encoding's learned tables;
        * ``embed(params, positions [L])``: ``[M, L, d_model]`` added to the residual stream, or None;
        * ``rotate(x [..., L, d_head], positions [L])``: queries or keys, same shape;
        * ``score_bias(params, q_positions [Lq], k_positions [Lk], n_heads)``: a tensor broadcastable to
          ``[M, H, Lq, Lk]`` added to the (already scaled) attention logits, or None;
        * ``train_positions(seq_len, generator)``: positions ``[L]`` to train a batch at, or None for ``0..L-1``.

    Positions are integer tensors on the CPU (a few hundred entries: checks on them need no device
    round trip). ``params`` is a mapping from the names ``init_parameters`` returned to the model's tensors.
    """

    name: ClassVar[str] = ""
    color: ClassVar[str] = "#7f7f7f"
    relative: ClassVar[bool] = False  # True: every logit depends on positions only through offsets, for any weights

    @property
    def label(self) -> str:
        """How figures and tables name the encoding."""
        return self.name

    def check(self, d_head: int, n_heads: int) -> None:
        """Raise ``ValueError`` if the encoding cannot act on heads of this size (e.g. odd ``d_head`` for RoPE)."""

    def init_parameters(self, n_models: int, d_model: int, max_len: int, n_heads: int, generators) -> dict:
        """Learned tables, one per model of the ensemble (drawn from ``generators[i]``); none by default."""
        return {}

    def check_positions(self, positions: Tensor, max_len: int) -> None:
        """Raise ``ValueError`` if the encoding has nothing for some position (e.g. beyond an APE table)."""

    def embed(self, params, positions: Tensor) -> Tensor | None:
        return None

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        return x

    def dot_product_form(self, d_head: int) -> tuple[Tensor | None, "Encoding"]:
        """How a model that uses queries and keys only through ``q . k`` may rotate them most cheaply.

        Returns ``(order, encoding)``: ``encoding.rotate(x[..., order]) == self.rotate(x)[..., order]``
        for every ``x`` (up to float rounding), so a model that reorders the channels of both its
        queries and its keys by ``order`` (a permutation ``[d_head]``, e.g. of its projection rows)
        and rotates them with ``encoding`` computes every attention logit ``q . k`` unchanged.
        The default ``(None, self)`` means: rotate as they are.
        """
        return None, self

    def score_bias(self, params, q_positions: Tensor, k_positions: Tensor, n_heads: int) -> Tensor | None:
        return None

    def train_positions(self, seq_len: int, generator: torch.Generator) -> Tensor | None:
        return None


@register
@dataclass(frozen=True)
class NoPE(Encoding):
    """No position signal: the causal mask is the only clue to order (Kazemnejad et al. 2023).

    In the position-only retrieval head every key is the same vector, so every logit is equal.
    """

    name: ClassVar[str] = "nope"
    color: ClassVar[str] = "#7f7f7f"
    relative: ClassVar[bool] = True  # trivially: no logit depends on positions at all

    @property
    def label(self) -> str:
        return "NoPE"


@register
@dataclass(frozen=True)
class LearnedAPE(Encoding):
    """A learned absolute position table ``p_t`` added to the residual stream (one row per position).

    Rows are initialised explicitly from ``N(0, init_std^2)``, model ``i`` from ``generators[i]``.
    A row that no training sequence reaches gets exactly zero gradient and keeps its initial
    value (chapter 3). The table has ``max_len`` rows: asking for a position beyond it raises
    ``ValueError`` (never clamped or wrapped).

    Args:
        init_std: standard deviation of the initial rows, >= 0.

    Parameters: ``table [M, max_len, d_model]``.

    Source: Gehring et al. 2017; Vaswani et al. 2017 (learned variant); Devlin et al. 2019.
    """

    init_std: float = 0.02
    name: ClassVar[str] = "ape"
    color: ClassVar[str] = "#d62728"

    def __post_init__(self):
        normalize_numbers(self)  # numpy scalars become Python numbers before any check
        check_positive_float("init_std", self.init_std, allow_zero=True)

    @property
    def label(self) -> str:
        return "APE (learned)"

    def init_parameters(self, n_models, d_model, max_len, n_heads, generators) -> dict:
        table = torch.empty(n_models, max_len, d_model)
        for i in range(n_models):
            table[i].normal_(0.0, self.init_std, generator=generators[i] if generators is not None else None)
        return {"table": table}

    def check_positions(self, positions: Tensor, max_len: int) -> None:
        _check_table_positions(positions, max_len, "APE table")

    def embed(self, params, positions: Tensor) -> Tensor:
        table = params["table"]
        self.check_positions(positions, table.shape[1])
        return table[:, positions.to(table.device)]


@register
@dataclass(frozen=True)
class RoPE(Encoding):
    """Rotary position embedding: queries and keys rotated pair by pair by ``t * theta_i``.

    ``<R_m q, R_n k> = <q, R_{n-m} k>``, so every logit depends on the offset ``n - m``
    alone, for any weights (chapter 2).

    Args:
        base: the RoPE base (10000 in RoFormer), > 1.
        interleaved: channel pairing (see the module docstring).
        angle_dtype: the dtype the angles ``t * theta_i`` are formed in: ``"float64"`` (exact, the
            default) or a low precision (``"float32"``, ``"float16"``, ``"bfloat16"``) to show what
            implementations that cache angles in the model's dtype compute (chapter 2).

    Source: Su et al. 2021, RoFormer, eq. (34).
    """

    base: float = 10000.0
    interleaved: bool = False
    angle_dtype: str = "float64"
    name: ClassVar[str] = "rope"
    color: ClassVar[str] = "#1f77b4"
    relative: ClassVar[bool] = True

    def __post_init__(self):
        normalize_numbers(self)  # numpy scalars become Python numbers before any check
        object.__setattr__(self, "base", check_rope_base("base", self.base))
        if not isinstance(self.interleaved, bool):
            raise TypeError(f"interleaved must be a bool; got {type(self.interleaved).__name__} {self.interleaved!r}")
        if not isinstance(self.angle_dtype, str) or self.angle_dtype not in ANGLE_DTYPES:
            raise ValueError(f"angle_dtype must be one of {tuple(ANGLE_DTYPES)}; got {self.angle_dtype!r}")

    @property
    def label(self) -> str:
        return "RoPE" if self.base == 10000.0 else f"RoPE (base {self.base:g})"

    def check(self, d_head: int, n_heads: int) -> None:
        if d_head % 2:
            raise ValueError(f"d_head must be even for RoPE (channels are rotated in pairs); got d_head={d_head}")

    def frequencies(self, d_head: int, seq_len: int) -> Tensor:
        """``theta [d_head // 2]`` (float64, rad per position) used at sequence length ``seq_len``."""
        return rope_inverse_frequencies(d_head, self.base)

    def dot_product_form(self, d_head: int) -> tuple[Tensor | None, "Encoding"]:
        """The half-split pairing is the interleaved one with channel ``i + d_head/2`` moved next to
        channel ``i``; the interleaved rotation runs as one complex multiply, so a model that only
        forms ``q . k`` reorders its query and key channels and rotates them interleaved."""
        if self.interleaved:
            return None, self
        half = check_int("d_head", d_head, minimum=2) // 2
        order = torch.stack((torch.arange(half), torch.arange(half) + half), dim=-1).flatten()
        return order, replace(self, interleaved=True)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        d_head = x.shape[-1]
        self.check(d_head, 1)
        theta = self.frequencies(d_head, positions.shape[-1])
        if self.angle_dtype == "float64" and type(self).frequencies is RoPE.frequencies and _is_range(positions):
            # the same numbers as below, memoised per (length, first position): no per-step trigonometry
            table = (positions.shape[-1], d_head, self.base, int(positions[0]))
            if self.interleaved and x.dtype in COMPLEX_DTYPES:  # one complex multiply (see rotate_adjacent_pairs)
                return rotate_adjacent_pairs(x, _rope_phases(*table, x.dtype, x.device))
            cos, sin = _rope_cos_sin(*table, x.dtype, x.device)  # the memo itself: read, never modified
        else:
            angles = angles_in_dtype(positions, theta, ANGLE_DTYPES[self.angle_dtype]).to(x.device)
            cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        return rotate_pairs(x, cos, sin, self.interleaved)


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi's per-head slopes ``m_h`` (float64 ``[n_heads]``), for any number of heads.

    For ``n`` a power of two the slopes are the geometric sequence ``2^(-8/n), 2^(-16/n), ..., 2^(-8)``.
    Otherwise, with ``c`` the largest power of two below ``n``, they are the ``c`` slopes of ``c`` heads
    followed by every other slope of ``2c`` heads (``2^(-4/c), 2^(-12/c), ...``), ``n - c`` of them,
    as in the paper's reference code.

    Raises:
        TypeError / ValueError: ``n_heads`` is not an int >= 1.

    Source: Press et al. 2022, *Train Short, Test Long* (ALiBi), section 3 and its reference implementation.
    """
    n_heads = check_int("n_heads", n_heads, minimum=1)
    closest = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = [2.0 ** (-8.0 * (i + 1) / closest) for i in range(closest)]
    slopes += [2.0 ** (-4.0 * (2 * i + 1) / closest) for i in range(n_heads - closest)]
    return torch.tensor(slopes, dtype=torch.float64)


@register
@dataclass(frozen=True)
class ALiBi(Encoding):
    """Attention with linear biases: head ``h`` adds ``m_h (j - i)`` to the logit of query ``i`` and key ``j``.

    No position signal enters the residual stream or the queries and keys; the bias, non-positive under
    a causal mask, penalises a key in proportion to its distance, with a different slope per head
    (:func:`alibi_slopes`). It depends on ``j - i`` alone, so ALiBi is relative by construction.

    Source: Press et al. 2022, *Train Short, Test Long: Attention with Linear Biases Enables Input Length
    Extrapolation*, eq. (1) and section 3.
    """

    name: ClassVar[str] = "alibi"
    color: ClassVar[str] = "#8c564b"
    relative: ClassVar[bool] = True

    @property
    def label(self) -> str:
        return "ALiBi"

    def check(self, d_head: int, n_heads: int) -> None:
        check_int("n_heads", n_heads, minimum=1)

    def score_bias(self, params, q_positions: Tensor, k_positions: Tensor, n_heads: int) -> Tensor:
        relative = (k_positions[None, :] - q_positions[:, None]).to(torch.float64)  # D = j - i: [Lq, Lk]
        return (alibi_slopes(n_heads)[:, None, None] * relative)[None].float()  # [1, H, Lq, Lk]


WELL_CONDITIONED_FREQUENCIES = (2.98, 2.79, 2.39, 1.98, 1.45, 1.01, 0.56, 0.28)
"""Eight rotation frequencies (rad/token) whose offset features are well conditioned on a 15-offset window.

RoPE's own frequencies ``10000^(-2i/16)`` are all at most 1 rad/token, so a kernel built from them is
band-limited and cannot single out one offset among its neighbours (condition number of the features
on the offsets ``-15 .. -1`` about ``10^19``). These eight span ``[0.28, 2.98]`` rad/token: condition number
2.6 on that window. They were picked from 20 000 random draws in ``[0.2, 3.0]`` with condition number
below 6 as the set whose equal-weight sum ``(1/8) sum_i cos(theta_i d)`` comes back least close to 1 for
``10 <= d < 300`` (0.66 after rounding; evenly spaced frequencies come back to 0.92 near ``d = 16``, a
period of their spacing), so no offset beyond the window mimics the target by construction (chapter 6).
"""


@dataclass(frozen=True)
class RotaryFrequencies(RoPE):
    """RoPE with an explicit set of rotation frequencies ``theta_i`` instead of ``base^(-2i / d_head)``.

    Everything else is RoPE's: pair ``i`` of queries and keys is rotated by ``t * theta_i``, so every
    logit depends on the offset alone (chapter 2), and a position-only head's logit is the offset kernel
    ``s(D) = sum_i r_i cos(theta_i D - phi_i)`` (chapter 4) over these frequencies. The inherited ``base``
    is not used. The default is :data:`WELL_CONDITIONED_FREQUENCIES` (chapter 6: a rotary head whose linear
    control can fit the training window), which fits ``d_head = 16`` only. Like ``RoPE(base=500)``, this is
    a variant of RoPE passed as an object (``pe=RotaryFrequencies()``), not a registered name: a name's
    default must serve every head size.

    Args:
        theta: ``d_head // 2`` frequencies in ``(0, pi]`` rad/token, one per channel pair.
        interleaved, angle_dtype: as for :class:`RoPE`.

    Raises:
        ValueError / TypeError: a frequency outside ``(0, pi]`` or not a number; at use, a head whose
            ``d_head // 2`` differs from ``len(theta)``.

    Source: Su et al. 2021, RoFormer, eq. (34), with the frequencies as a free choice.
    """

    theta: tuple[float, ...] = WELL_CONDITIONED_FREQUENCIES
    name: ClassVar[str] = "rope_theta"
    color: ClassVar[str] = "#17becf"

    def __post_init__(self):
        super().__post_init__()
        values = self.theta
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__") or not tuple(values):
            raise TypeError(f"theta must be a non-empty sequence of frequencies (rad/token); got {values!r}")
        values = tuple(values)
        for i, x in enumerate(values):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < float(x) <= math.pi:
                raise ValueError(f"theta[{i}] must be a number in (0, pi] rad/token; got {x!r}")
        object.__setattr__(self, "theta", tuple(float(x) for x in values))

    @property
    def label(self) -> str:
        return f"RoPE (theta {max(self.theta):g}..{min(self.theta):g} rad/token)"

    def check(self, d_head: int, n_heads: int) -> None:
        super().check(d_head, n_heads)
        if d_head // 2 != len(self.theta):
            raise ValueError(f"d_head must be 2 * len(theta) = {2 * len(self.theta)} (one frequency per channel "
                             f"pair); got d_head={d_head}")

    def frequencies(self, d_head: int, seq_len: int) -> Tensor:
        self.check(d_head, 1)
        return torch.tensor(self.theta, dtype=torch.float64)


ANGLE_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16}


def _is_range(positions: Tensor) -> bool:
    """True when ``positions`` is ``p, p+1, ..., p+L-1`` (the usual case, which ``rope_cos_sin`` memoises)."""
    if positions.dim() != 1 or positions.numel() == 0:
        return False
    first = int(positions[0])
    return bool(torch.equal(positions, torch.arange(first, first + positions.numel(), device=positions.device)))


def encoding_fields(encoding: Encoding) -> dict:
    """The dataclass fields of an encoding (its settings), e.g. for a table or a cache description."""
    return {f.name: getattr(encoding, f.name) for f in fields(encoding)}


def _check_table_positions(positions: Tensor, max_len: int, table: str) -> None:
    """Raise ``ValueError`` unless every position has a row in a ``max_len``-row ``table`` (no clamping or wrapping)."""
    _check_positions(positions)
    if positions.numel() == 0:
        return
    lo, hi = int(positions.min()), int(positions.max())
    if lo < 0 or hi >= max_len:
        raise ValueError(
            f"the {table} has {max_len} rows (positions 0..{max_len - 1}); asked for positions "
            f"{lo}..{hi} (sequence length {hi + 1}). Build the model with max_len >= {hi + 1}.")


# ---------------------------------------------------------------- the zoo (chapter 9): more encodings, one class each
@register
@dataclass(frozen=True)
class NoPEBOS(Encoding):
    """NoPE plus a distinct beginning-of-sequence signal: a learned vector ``b`` added at absolute position 0 only.

    Every other position gets nothing, so the causal mask and this one marked position are the model's only
    clues to order. It is the smallest absolute encoding there is, a one-row learned table, and it stands for
    the BOS token a NoPE model is usually given: with every training and test sequence starting at position 0
    the two are the same signal (a learned vector on the first token). They differ only under a global shift
    of positions: the marker stays at position 0 and so leaves a shifted sequence, where a BOS token would move
    with it. Either way the logit is not a function of the offset alone (the marked key is special), so
    ``relative`` is False.

    Args:
        init_std: standard deviation of the initial ``b``, >= 0 (0.02, as an APE row).

    Parameters: ``bos [M, d_model]``.

    Source: Kazemnejad et al. 2023 (NoPE with a BOS token; their construction of absolute positions from the
    causal mask uses it); the marker as a one-row table follows Gehring et al. 2017.
    """

    init_std: float = 0.02
    name: ClassVar[str] = "nope_bos"
    color: ClassVar[str] = "#bcbd22"

    def __post_init__(self):
        normalize_numbers(self)  # numpy scalars become Python numbers before any check
        check_positive_float("init_std", self.init_std, allow_zero=True)

    @property
    def label(self) -> str:
        return "NoPE + BOS"

    def init_parameters(self, n_models, d_model, max_len, n_heads, generators) -> dict:
        bos = torch.empty(n_models, d_model)
        for i in range(n_models):
            bos[i].normal_(0.0, self.init_std, generator=generators[i] if generators is not None else None)
        return {"bos": bos}

    def check_positions(self, positions: Tensor, max_len: int) -> None:
        _check_positions(positions)

    def embed(self, params, positions: Tensor) -> Tensor:
        bos = params["bos"]  # [M, d_model]
        self.check_positions(positions, 0)
        first = (positions == 0).to(device=bos.device, dtype=bos.dtype)  # [L]: 1 at absolute position 0
        return first[None, :, None] * bos[:, None, :]  # [M, L, d_model]


def sinusoidal_table(positions: Tensor, d_model: int, base: float = 10000.0) -> Tensor:
    """The fixed sinusoidal position vectors ``PE(t, 2i) = sin(t w_i)``, ``PE(t, 2i+1) = cos(t w_i)``.

    ``w_i = base ** (-2i / d_model)`` (radians per position), channels interleaved sin, cos as in the paper;
    for an odd ``d_model`` the last channel is the sine of one more frequency.

    Args:
        positions: integer tensor ``[P]`` (any integers).
        d_model: width, >= 1.
        base: the wavelength scale (10000 in the paper), > 1.

    Returns:
        float64 tensor ``[P, d_model]``.

    Raises:
        TypeError / ValueError: non-integer positions, ``d_model < 1`` or ``base <= 1``.

    Source: Vaswani et al. 2017, *Attention Is All You Need*, section 3.5.
    """
    _check_positions(positions)
    d_model = check_int("d_model", d_model, minimum=1)
    base = check_rope_base("base", base)
    w = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # [ceil(d/2)]
    angles = positions.to(torch.float64)[:, None] * w  # [P, ceil(d/2)]
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)[:, :d_model]


@register
@dataclass(frozen=True)
class SinusoidalAPE(Encoding):
    """Fixed sinusoidal absolute positions added to the residual stream (:func:`sinusoidal_table`).

    Nothing is learned: the table is computed in closed form by ``init_parameters`` (one copy per model, so it
    moves to the model's device and is saved with it) and read *detached* by ``embed``, so it never receives a
    gradient and the optimiser leaves it exactly as computed. The table has ``max_len`` rows: a position beyond
    it raises ``ValueError``, as for :class:`LearnedAPE`. Every position has its own vector, so the logit
    depends on absolute positions (``relative`` is False), even though ``PE(t + k)`` is a fixed rotation of
    ``PE(t)`` (the paper's motivation): the cross terms between the vector and the rest of the residual stream
    are not rotated.

    Args:
        base: the wavelength scale, > 1 (10000 in the paper).

    Parameters: ``sinusoid [M, max_len, d_model]`` (fixed).

    Source: Vaswani et al. 2017, *Attention Is All You Need*, section 3.5.
    """

    base: float = 10000.0
    name: ClassVar[str] = "sinusoidal"
    color: ClassVar[str] = "#ff7f0e"

    def __post_init__(self):
        normalize_numbers(self)  # numpy scalars become Python numbers before any check
        object.__setattr__(self, "base", check_rope_base("base", self.base))

    @property
    def label(self) -> str:
        return "sinusoidal APE"

    def init_parameters(self, n_models, d_model, max_len, n_heads, generators) -> dict:
        table = sinusoidal_table(torch.arange(max_len), d_model, self.base).float()
        return {"sinusoid": table[None].repeat(n_models, 1, 1)}

    def check_positions(self, positions: Tensor, max_len: int) -> None:
        _check_table_positions(positions, max_len, "sinusoidal table")

    def embed(self, params, positions: Tensor) -> Tensor:
        table = params["sinusoid"].detach()  # fixed: no gradient, so no optimiser step ever moves it
        self.check_positions(positions, table.shape[1])
        return table[:, positions.to(table.device)]


def t5_relative_buckets(relative_positions: Tensor, num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """T5's bucket of each relative position ``D = j - i`` in a causal (decoder) model.

    The distance ``d = max(-D, 0)`` (keys after the query share bucket 0; a causal mask hides them) has a bucket
    of its own while ``d < num_buckets // 2``; larger distances share logarithmically wider buckets up to
    ``max_distance``, and every ``d >= max_distance`` falls in the last bucket ``num_buckets - 1``.

    Args:
        relative_positions: integer tensor of any shape (``D = key position - query position``).
        num_buckets: buckets, >= 2 (32 in T5).
        max_distance: the distance from which all keys share the last bucket, > ``num_buckets // 2`` (128 in T5).

    Returns:
        LongTensor of the same shape, values in ``0 .. num_buckets - 1``.

    Raises:
        TypeError / ValueError: non-integer positions, or sizes out of range.

    Source: Raffel et al. 2020, *Exploring the Limits of Transfer Learning with a Unified Text-to-Text
    Transformer* (T5), section 2.1, and its reference implementation (``_relative_position_bucket``,
    ``bidirectional=False``).
    """
    _check_positions(relative_positions)
    num_buckets = check_int("num_buckets", num_buckets, minimum=2)
    max_exact = num_buckets // 2
    max_distance = check_int("max_distance", max_distance, minimum=max_exact + 1)
    d = (-relative_positions.long()).clamp(min=0)  # distance back; keys after the query: 0 (masked anyway)
    log_ratio = torch.log(d.clamp(min=1).to(torch.float64) / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return torch.where(d < max_exact, d, large)


@register
@dataclass(frozen=True)
class T5Bias(Encoding):
    """T5's relative position bias: a learned scalar per head and distance bucket, added to the logits.

    Head ``h`` adds ``B[h, bucket(j - i)]`` to the logit of query ``i`` and key ``j``
    (:func:`t5_relative_buckets`): the bias depends on ``j - i`` alone, so the encoding is relative by
    construction. Unlike ALiBi's fixed slopes, every bucket is a free parameter: a bucket that no training pair
    reaches (distances beyond the training length) gets exactly zero gradient and keeps its initial value, as
    an unseen APE row does.

    Args:
        num_buckets: buckets, >= 2 (T5: 32).
        max_distance: distance from which keys share the last bucket (T5: 128).
        init_std: standard deviation of the initial biases, >= 0.

    Parameters: ``t5_bias [M, n_heads, num_buckets]``.

    Source: Raffel et al. 2020 (T5), section 2.1; the bucketing of its reference implementation.
    """

    num_buckets: int = 32
    max_distance: int = 128
    init_std: float = 0.02
    name: ClassVar[str] = "t5"
    color: ClassVar[str] = "#9467bd"
    relative: ClassVar[bool] = True

    def __post_init__(self):
        normalize_numbers(self)  # numpy scalars become Python numbers before any check
        check_int("num_buckets", self.num_buckets, minimum=2)
        check_int("max_distance", self.max_distance, minimum=self.num_buckets // 2 + 1)
        check_positive_float("init_std", self.init_std, allow_zero=True)

    @property
    def label(self) -> str:
        return "T5 bias"

    def check(self, d_head: int, n_heads: int) -> None:
        check_int("n_heads", n_heads, minimum=1)

    def init_parameters(self, n_models, d_model, max_len, n_heads, generators) -> dict:
        bias = torch.empty(n_models, n_heads, self.num_buckets)
        for i in range(n_models):
            bias[i].normal_(0.0, self.init_std, generator=generators[i] if generators is not None else None)
        return {"t5_bias": bias}

    def score_bias(self, params, q_positions: Tensor, k_positions: Tensor, n_heads: int) -> Tensor:
        table = params["t5_bias"]  # [M, H, n_buckets]
        if table.shape[1] != n_heads:
            raise ValueError(f"the T5 bias table has {table.shape[1]} heads; the model asks for n_heads={n_heads}")
        buckets = t5_relative_buckets(k_positions[None, :] - q_positions[:, None], self.num_buckets,
                                      self.max_distance)  # [Lq, Lk]
        return table[:, :, buckets.to(table.device)]  # [M, H, Lq, Lk]


def _blend(hex_color: str, towards: int, amount: float) -> str:
    """``hex_color`` moved ``amount`` of the way towards white (``towards=255``) or black (0): a variant's
    colour next to its base's."""
    h = hex_color.lstrip("#")
    rgb = [int(h[i:i + 2], 16) for i in (0, 2, 4)]
    return "#" + "".join(f"{round(c + (towards - c) * amount):02x}" for c in rgb)


@register
@dataclass(frozen=True)
class RandomizedPositions(Encoding):
    """Any encoding trained at randomised positions: the same model, a different training distribution.

    At every training step the ``L`` tokens of a batch get positions drawn from ``0 .. max_position - 1``
    instead of ``0 .. L-1``: a sorted random subset (``contiguous=False``, the scheme of Ruoss et al. 2023), or
    a contiguous block ``s .. s + L - 1`` with a random start ``s`` (``contiguous=True``: a random global
    shift, which keeps every distance between tokens). At test time positions are ``0 .. L-1`` as for any
    encoding. Everything else is the base encoding's: the same parameters, the same places it acts, the same
    functions it can express. Only which positions, and so which (query, key) pairs, training visits changes.

    Args:
        base: the encoding to train at random positions (an Encoding or a registered name; default learned APE).
        max_position: positions are drawn from ``0 .. max_position - 1`` (e.g. the longest test length; an APE
            base needs a table with at least this many rows). The registry's default, 64, suits short tests.
        contiguous: draw a random contiguous block instead of a sorted random subset.

    Raises:
        TypeError / ValueError: a base that is not an encoding (or is itself randomised), ``max_position < 2``;
            at training, a sequence longer than ``max_position``.

    Source: Ruoss et al. 2023, *Randomized Positional Encodings Boost Length Generalization of Transformers*,
    section 3 (they draw the positions at test time too; here test positions are ``0 .. L-1``).
    """

    base: Encoding = field(default_factory=lambda: LearnedAPE())
    max_position: int = 64
    contiguous: bool = False
    name: ClassVar[str] = "randomized"

    def __post_init__(self):
        normalize_numbers(self)  # numpy scalars become Python numbers before any check
        object.__setattr__(self, "base", get_encoding(self.base, "base"))
        if isinstance(self.base, RandomizedPositions):
            raise TypeError("base must not itself be RandomizedPositions (draw positions once)")
        check_int("max_position", self.max_position, minimum=2)
        if not isinstance(self.contiguous, bool):
            raise TypeError(f"contiguous must be a bool; got {type(self.contiguous).__name__} {self.contiguous!r}")

    @property
    def relative(self) -> bool:  # the base's: training positions change the selected weights, not the function class
        return self.base.relative

    @property
    def color(self) -> str:
        """Learned APE's two variants have colours of their own (red is plain APE's alone, so a shade of it
        would read as APE); any other base's variant is its colour darkened (shift) or lightened (positions)."""
        if isinstance(self.base, LearnedAPE) and type(self.base).color == LearnedAPE.color:
            return "#7b4173" if self.contiguous else "#2ca02c"
        return _blend(self.base.color, 0, 0.45) if self.contiguous else _blend(self.base.color, 255, 0.5)

    @property
    def label(self) -> str:
        return f"{self.base.label} + random {'shift' if self.contiguous else 'positions'}"

    def check(self, d_head: int, n_heads: int) -> None:
        self.base.check(d_head, n_heads)

    def init_parameters(self, n_models, d_model, max_len, n_heads, generators) -> dict:
        return self.base.init_parameters(n_models, d_model, max_len, n_heads, generators)

    def check_positions(self, positions: Tensor, max_len: int) -> None:
        self.base.check_positions(positions, max_len)

    def embed(self, params, positions: Tensor) -> Tensor | None:
        return self.base.embed(params, positions)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        return self.base.rotate(x, positions)

    def score_bias(self, params, q_positions: Tensor, k_positions: Tensor, n_heads: int) -> Tensor | None:
        return self.base.score_bias(params, q_positions, k_positions, n_heads)

    def train_positions(self, seq_len: int, generator: torch.Generator) -> Tensor:
        seq_len = check_int("seq_len", seq_len, minimum=1, maximum=self.max_position)
        if self.contiguous:
            start = int(torch.randint(0, self.max_position - seq_len + 1, (1,), generator=generator))
            return torch.arange(start, start + seq_len)
        return torch.randperm(self.max_position, generator=generator)[:seq_len].sort().values


@register
@dataclass(frozen=True)
class RoPEInterpolation(RoPE):
    """RoPE with position interpolation at test time: beyond the training length, positions are squeezed into it.

    At sequence length ``L`` every frequency is multiplied by ``min(1, train_len / L)``, i.e. position ``t``
    is rotated as RoPE rotates ``t * train_len / L``: the angles of a long sequence stay within the range seen
    in training, at the price of resolution (an offset ``D`` now turns by ``D * train_len / L``). At
    ``L <= train_len`` it is exactly RoPE. At each length the logit depends on the offset alone
    (``relative``), but the offset kernel changes with ``L``.

    Args:
        train_len: the training length the scaling refers to, >= 1.
        base, interleaved, angle_dtype: as for :class:`RoPE`.

    Source: Chen et al. 2023, *Extending Context Window of Large Language Models via Positional Interpolation*,
    eq. (2) (used here without their fine-tuning, and with the factor taken from the current length, the
    "dynamic" form of Peng et al. 2024).
    """

    train_len: int = 16
    name: ClassVar[str] = "rope_pi"
    color: ClassVar[str] = "#e7ba52"  # not RotaryFrequencies' cyan: one colour per encoding

    def __post_init__(self):
        super().__post_init__()
        check_int("train_len", self.train_len, minimum=1)

    @property
    def label(self) -> str:
        return "RoPE + PI"

    def scale(self, seq_len: int) -> float:
        """The extension factor ``s = max(1, L / train_len)`` at sequence length ``L``."""
        return max(1.0, check_int("seq_len", seq_len, minimum=1) / self.train_len)

    def frequencies(self, d_head: int, seq_len: int) -> Tensor:
        return rope_inverse_frequencies(d_head, self.base) / self.scale(seq_len)


@register
@dataclass(frozen=True)
class RoPENTK(RoPEInterpolation):
    """RoPE with NTK-aware scaling at test time: beyond the training length the base grows, not the positions.

    At sequence length ``L`` the base becomes ``base * s ** (d_head / (d_head - 2))`` with
    ``s = max(1, L / train_len)``: the highest frequency (``theta_0 = 1``) is untouched, the lowest is divided
    by exactly ``s`` (as in position interpolation), and the ones between by less. Short offsets keep their
    angles; long wavelengths are stretched to cover the longer sequence. At ``L <= train_len`` it is exactly
    RoPE; ``relative`` as for :class:`RoPEInterpolation`.

    Args:
        train_len, base, interleaved, angle_dtype: as for :class:`RoPEInterpolation`.

    Source: "NTK-aware" scaling (bloc97, 2023), as written in Peng et al. 2024, *YaRN: Efficient Context Window
    Extension of Large Language Models*, section 3.2 (with the dynamic factor of their section 3.3).
    """

    name: ClassVar[str] = "rope_ntk"
    color: ClassVar[str] = "#e377c2"

    @property
    def label(self) -> str:
        return "RoPE + NTK"

    def check(self, d_head: int, n_heads: int) -> None:
        super().check(d_head, n_heads)
        if d_head < 4:
            raise ValueError(f"NTK-aware scaling needs d_head >= 4 (its exponent is d_head / (d_head - 2)); "
                             f"got d_head={d_head}")

    def frequencies(self, d_head: int, seq_len: int) -> Tensor:
        self.check(d_head, 1)
        return rope_inverse_frequencies(d_head, self.base * self.scale(seq_len) ** (d_head / (d_head - 2)))
