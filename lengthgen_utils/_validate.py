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
