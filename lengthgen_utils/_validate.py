"""Argument checks shared by the package: each error names the argument, its value and what is allowed."""
from __future__ import annotations

import math
import numbers


def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` as an int if it is an integer within ``[minimum, maximum]``.

    Raises:
        TypeError: ``value`` is not an integer (bools and floats are refused, even 3.0).
        ValueError: ``value`` lies outside the allowed range.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int; got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        allowed = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {allowed}; got {name}={value}")
    if maximum is not None and value > maximum:
        allowed = f"<= {maximum}" if minimum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {allowed}; got {name}={value}")
    return value


def check_positive_float(name: str, value, allow_zero: bool = False) -> float:
    """Return ``value`` as a float if it is a finite real number > 0 (or >= 0 with ``allow_zero``).

    Raises:
        TypeError: ``value`` is not a real number.
        ValueError: ``value`` is NaN, infinite, negative, or zero when not allowed.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        allowed = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {allowed}; got {name}={value}")
    return value


def check_int_sequence(name: str, values, minimum: int | None = None) -> tuple[int, ...]:
    """Return a non-empty sequence of ints as a tuple, each checked with :func:`check_int`."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of ints; got {type(values).__name__} {values!r}")
    values = tuple(values)
    if not values:
        raise ValueError(f"{name} must not be empty")
    return tuple(check_int(f"{name}[{i}]", v, minimum=minimum) for i, v in enumerate(values))


def check_rope_base(name: str, value) -> float:
    """Return a RoPE base as a float if it is a finite real number > 1 (so that frequencies decrease).

    Raises:
        TypeError: ``value`` is not a real number.
        ValueError: ``value`` is NaN, infinite or ``<= 1``.
    """
    value = check_positive_float(name, value)
    if value <= 1.0:
        raise ValueError(f"{name} must be > 1 so that RoPE frequencies decrease; got {name}={value}")
    return value


def check_fits(name: str, value, check) -> int:
    """Return ``check(value)``, re-raising a ``ValueError`` so that its message names ``name``.

    For lengths handed to a task's ``check_seq_len`` under another name (e.g. ``train_len``).
    """
    value = check_int(name, value, minimum=1)
    try:
        return check(value)
    except ValueError as err:
        raise ValueError(f"{name}={value} does not fit the task: {err}") from err


def check_generator(generator) -> None:
    """Raise ``TypeError`` unless ``generator`` is a ``torch.Generator`` or None."""
    import torch

    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None; got {type(generator).__name__}")


def per_model_ints(name: str, value, n_models: int, minimum: int | None = None,
                   maximum: int | None = None) -> tuple[int, ...]:
    """One int per model: ``value`` is one int (shared by all ``n_models``) or a sequence of exactly ``n_models``.

    The one check behind every argument that takes a value per ensemble member (offsets, seeds):
    the error names the argument, how many values it got and how many the ensemble has.

    Raises:
        TypeError: ``value`` is neither an int nor a sequence of ints (a 0-d or 1-d integer tensor counts).
        ValueError: a sequence of the wrong length, or a value out of range.
    """
    import torch

    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool or value.dim() > 1:
            raise TypeError(f"{name} must be an int or a sequence of ints; got a {value.dtype} tensor "
                            f"of shape {tuple(value.shape)}")
        value = value.tolist()
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return (check_int(name, value, minimum, maximum),) * n_models
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be an int or a sequence of {n_models} ints (one per model); "
                        f"got {type(value).__name__} {value!r}")
    values = tuple(value)
    if len(values) != n_models:
        raise ValueError(f"{name} must be one int or {n_models} ints (one per model); got {len(values)}")
    return tuple(check_int(f"{name}[{i}]", v, minimum, maximum) for i, v in enumerate(values))


def normalize_sequence(config, name: str, minimum: int | None = None) -> tuple[int, ...]:
    """Store field ``name`` of a frozen config as a tuple of checked ints (a list is accepted) and return it."""
    values = check_int_sequence(name, getattr(config, name), minimum=minimum)
    object.__setattr__(config, name, values)
    return values
