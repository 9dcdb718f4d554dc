"""Position encodings as objects behind one interface, and a registry.

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
from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch
from torch import Tensor

from .._validate import Normalized, check_int, check_positive_float, check_rope_base
from .rope import (ANGLE_DTYPES, COMPLEX_DTYPES, _check_positions, _is_range, _rope_phases, angles_in_dtype,
                   _rope_cos_sin, rope_inverse_frequencies, rotate_adjacent_pairs, rotate_pairs)


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
class Encoding(Normalized):
    """What a position encoding does, at the only places it can act (see the module docstring).

    The defaults do nothing, which is NoPE: a subclass overrides the places where it acts.

    Shapes (M = ensemble size, L = sequence length, H = heads):
        * ``init_parameters(...)``: ``{name: tensor [M, ...]}``, the encoding's learned tables;
        * ``embed(params, positions [L])``: ``[M, L, d_model]`` added to the residual stream, or None;
        * ``rotate(x [..., L, d_head], positions [L])``: queries or keys, same shape;
        * ``score_bias(params, q_positions [Lq], k_positions [Lk], n_heads)``: a tensor broadcastable to
          ``[M, H, Lq, Lk]`` added to the (already scaled) attention logits, or None;
        * ``train_positions(seq_len, generator)``: positions ``[L]`` to train a batch at, or None for ``0..L-1``.

    and what the experiments and probes need to know without looking at the class:

        * ``frequencies(d_head, seq_len)``: the rotation frequencies ``theta [d_head // 2]`` at length ``L``
          (None when the encoding does not rotate; the offset-kernel analyses need them);
        * ``for_training()``: the encoding a model is trained with (a test-time scaling trains as the plain
          encoding it scales);
        * ``visited_positions(train_len)``: how many positions ``0 .. n-1`` training visits;
        * ``length_dependent``: whether the rule changes with the sequence length (a test at one length then
          says nothing about another).

    Positions are integer tensors on the CPU (a few hundred entries: checks on them need no device
    round trip). ``params`` is a mapping from the names ``init_parameters`` returned to the model's tensors.
    """

    name: ClassVar[str] = ""
    color: ClassVar[str] = "#7f7f7f"
    relative: ClassVar[bool] = False  # True: every logit depends on positions only through offsets, for any weights
    length_dependent: ClassVar[bool] = False  # True: what a position contributes changes with the sequence length

    @property
    def label(self) -> str:
        """How figures and tables name the encoding."""
        return self.name

    def frequencies(self, d_head: int, seq_len: int) -> Tensor | None:
        """The rotation frequencies ``theta [d_head // 2]`` (float64, rad per position) at length ``seq_len``, or
        None for an encoding that does not rotate queries and keys."""
        return None

    def for_training(self) -> "Encoding":
        """The encoding a model is trained with: this one, unless it only changes what happens at test time."""
        return self

    def visited_positions(self, train_len: int) -> int:
        """How many positions (``0 .. n-1``) training at lengths up to ``train_len`` visits: ``train_len``."""
        return check_int("train_len", train_len, minimum=1)

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
        _check_table_positions(positions, max_len, "APE table")

    def embed(self, params, positions: Tensor) -> Tensor:
        table = params["table"]
        self.check_positions(positions, table.shape[1])
        return table[:, positions.to(table.device)]


@register
@dataclass(frozen=True)
class RoPE(Encoding):
    """Rotary position embedding: queries and keys rotated pair by pair by ``t * theta_i``.

    ``<R_m q, R_j k> = <q, R_{j-m} k>``, so every logit depends on the relative position ``D = j - m``
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
        half = d_head // 2  # the model's checked head size (the fast transformer asks once, when it is built)
        order = torch.stack((torch.arange(half), torch.arange(half) + half), dim=-1).flatten()
        return order, replace(self, interleaved=True)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        # an odd d_head (refused when a model is built, by check) is refused here by the frequencies' own check
        d_head = x.shape[-1]
        if self.angle_dtype == "float64" and type(self).frequencies is RoPE.frequencies and _is_range(positions):
            # the same numbers as below, memoised per (length, first position): no per-step trigonometry
            table = (positions.shape[-1], d_head, self.base, int(positions[0]))
            if self.interleaved and x.dtype in COMPLEX_DTYPES:  # one complex multiply (see rotate_adjacent_pairs)
                return rotate_adjacent_pairs(x, _rope_phases(*table, x.dtype, x.device))
            cos, sin = _rope_cos_sin(*table, x.dtype, x.device)  # the memo itself: read, never modified
        else:
            theta = self.frequencies(d_head, positions.shape[-1])
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
    """Attention with linear biases: head ``h`` adds ``beta_h (j - m)`` to the logit of query ``m`` and key ``j``.

    No position signal enters the residual stream or the queries and keys; the bias, non-positive under
    a causal mask, penalises a key in proportion to its distance, with a different slope per head
    (:func:`alibi_slopes`). It depends on ``D = j - m`` alone, so ALiBi is relative by construction.

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
        relative = (k_positions[None, :] - q_positions[:, None]).to(torch.float64)  # D = j - m: [Lq, Lk]
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

    Inner numerics: :class:`SinusoidalAPE` builds its table with it once, from a model's checked width and its
    own checked ``base``, so it checks nothing.

    Args:
        positions: integer tensor ``[P]`` (any integers).
        d_model: width, >= 1.
        base: the wavelength scale (10000 in the paper), > 1.

    Returns:
        float64 tensor ``[P, d_model]``.

    Source: Vaswani et al. 2017, *Attention Is All You Need*, section 3.5.
    """
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
    """T5's bucket of each relative position ``D = j - m`` in a causal (decoder) model.

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
    max_distance = check_int("max_distance", max_distance, minimum=num_buckets // 2 + 1)
    max_exact = num_buckets // 2
    d = (-relative_positions.long()).clamp(min=0)  # distance back; keys after the query: 0 (masked anyway)
    log_ratio = torch.log(d.clamp(min=1).to(torch.float64) / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return torch.where(d < max_exact, d, large)


@register
@dataclass(frozen=True)
class T5Bias(Encoding):
    """T5's relative position bias: a learned scalar per head and distance bucket, added to the logits.

    Head ``h`` adds ``B[h, bucket(j - m)]`` to the logit of query ``m`` and key ``j``
    (:func:`t5_relative_buckets`): the bias depends on ``D = j - m`` alone, so the encoding is relative by
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

    def frequencies(self, d_head: int, seq_len: int) -> Tensor | None:
        return self.base.frequencies(d_head, seq_len)

    def visited_positions(self, train_len: int) -> int:
        """Training draws positions from ``0 .. max_position - 1``: all of them are visited."""
        check_int("train_len", train_len, minimum=1)
        return self.max_position

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
    in training, at the price of resolution (a relative position ``D`` now turns by ``D * train_len / L``). At
    ``L <= train_len`` it is exactly RoPE. At each length the logit depends on the relative position alone
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
    length_dependent: ClassVar[bool] = True  # beyond train_len every frequency is scaled by the length

    def __post_init__(self):
        super().__post_init__()
        check_int("train_len", self.train_len, minimum=1)

    @property
    def label(self) -> str:
        return "RoPE + PI"

    def for_training(self) -> RoPE:
        """Plain RoPE: at every length up to ``train_len`` the scaling is the identity, so the model trains as RoPE."""
        return RoPE(self.base, self.interleaved, self.angle_dtype)

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
