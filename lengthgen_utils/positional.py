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

Sources: Su et al. 2021, *RoFormer* (RoPE, eq. 13-15, 34); Vaswani et al. 2017 and
Gehring et al. 2017 (learned absolute positions); Kazemnejad et al. 2023 (NoPE).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import ClassVar

import torch
from torch import Tensor

from ._validate import check_int, check_positive_float, check_rope_base


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
    freq = torch.as_tensor(frequencies, dtype=torch.float64).flatten()
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
        ``[..., d_head]`` in the order of :func:`rope_kernel_features` (all ``a``, then all ``b``).
        Divide by ``sqrt(d_head)`` for a head that scales its logits.

    Raises:
        TypeError / ValueError: non-float tensors, mismatched shapes or an odd last dimension.

    Source: chapter 4, "The offset kernel" (the angle-addition formulas).
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


def get_encoding(spec) -> "Encoding":
    """The encoding ``spec`` names: an :class:`Encoding` instance is returned as is, a name gives its default.

    Raises:
        TypeError: ``spec`` is neither an ``Encoding`` nor a string.
        ValueError: an unknown name; the message lists the registered ones.
    """
    if isinstance(spec, Encoding):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"pe must be an Encoding or one of the names {encoding_names()}; "
                        f"got {type(spec).__name__} {spec!r}")
    if spec not in ENCODINGS:
        raise ValueError(f"pe={spec!r} is not a registered position encoding; the registered ones are "
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
        _check_positions(positions)
        if positions.numel() == 0:
            return
        lo, hi = int(positions.min()), int(positions.max())
        if lo < 0 or hi >= max_len:
            raise ValueError(
                f"the APE table has {max_len} rows (positions 0..{max_len - 1}); asked for positions "
                f"{lo}..{hi} (sequence length {hi + 1}). Build the model with max_len >= {hi + 1}.")

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
        object.__setattr__(self, "base", check_rope_base("base", self.base))
        if not isinstance(self.interleaved, bool):
            raise TypeError(f"interleaved must be a bool; got {type(self.interleaved).__name__} {self.interleaved!r}")
        if self.angle_dtype not in ANGLE_DTYPES:
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
            cos, sin = rope_cos_sin(*table, x.dtype, x.device)
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
