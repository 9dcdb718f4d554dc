"""Argument checks shared by the package: each error names the argument, its value and what is allowed."""
from __future__ import annotations

import math
import numbers
import os
import sys
from dataclasses import fields
from pathlib import Path


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


def check_int_or_none(name: str, value) -> int | None:
    """None, or :func:`check_int` of ``value`` (e.g. an alias distance that may be absent)."""
    return None if value is None else check_int(name, value)


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


def check_float_sequence(name: str, values) -> tuple[float, ...]:
    """Return a non-empty sequence of finite real numbers as a tuple of floats (a list or 1-d tensor is accepted).

    Raises:
        TypeError: ``values`` is not a sequence, or holds something that is not a real number.
        ValueError: ``values`` is empty or holds a NaN or infinite number.
    """
    if hasattr(values, "tolist") and getattr(values, "ndim", 1) <= 1:
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of numbers; got {type(values).__name__} {values!r:.60}")
    values = tuple(values)
    if not values:
        raise ValueError(f"{name} must not be empty")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{name}[{i}] must be a real number; got {type(v).__name__} {v!r:.60}")
        if not math.isfinite(v):
            raise ValueError(f"{name}[{i}] must be finite; got {name}[{i}]={v}")
        out.append(float(v))
    return tuple(out)


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


def check_nonempty(name: str, tensor, layout: str):
    """Return ``tensor`` if none of its dimensions is empty; else raise ``ValueError`` naming ``name`` and ``layout``.

    For the measures of a set of models: a tensor of no models, no lengths or no positions has no
    answer, and an empty result (or the NaN of a mean over nothing) would pass for one.
    """
    shape = tuple(getattr(tensor, "shape", ()))
    if any(size == 0 for size in shape):
        raise ValueError(f"{name} must have shape {layout} with every size >= 1; got {shape}")
    return tensor


def check_generator(generator) -> None:
    """Raise ``TypeError`` unless ``generator`` is a ``torch.Generator`` or None."""
    import torch

    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None; got {type(generator).__name__}")


def _count(value) -> int | None:
    """How many values a per-model argument holds: None for one value, else the length of the sequence."""
    ndim = getattr(value, "ndim", None)  # tensors and numpy arrays
    if ndim is not None:
        return None if ndim == 0 else int(value.shape[0])
    return None if not hasattr(value, "__len__") or isinstance(value, (str, bytes)) else len(value)


def _allowed(kind: str, n_models: int, shared: bool) -> str:
    """The one wording of what a per-model argument may be."""
    return (f"one {kind} or " if shared else "") + f"{n_models} {kind}{'s' if n_models != 1 else ''}, one per model"


def per_model(name: str, value, n_models: int, check, kind: str = "value", shared: bool = True,
              single=None) -> tuple:
    """One value per model of an ensemble: the one check behind every per-model argument of the package.

    ``value`` is one value (shared by all ``n_models`` models, if ``shared``) or a sequence of exactly
    ``n_models`` values; each is passed through ``check(label, v)``, which returns it (converted) or
    raises naming ``label`` (``name`` or ``name[i]``). Every mismatch raises one wording,
    ``"<name> must be one <kind> or <M> <kind>s, one per model; got <n>"``, so an error always
    names the argument, how many values it got and how many the ensemble has.

    Args:
        name: the argument's name, as the caller spells it.
        value: the argument.
        n_models: the ensemble size M >= 1.
        check: ``check(label, v) -> v``, raising ``TypeError``/``ValueError`` naming ``label``.
        kind: what one value is, for the message (``"int"``, ``"task"``, ``"row"``, ...).
        shared: whether one value may stand for every model (False e.g. for initialisation seeds).
        single: ``single(value) -> bool``, whether ``value`` is one value rather than a sequence of
            them (default: anything that is not a list, tuple, range, 1-d array or 1-d tensor).

    Returns:
        a tuple of ``n_models`` checked values.

    Raises:
        TypeError: ``value`` is neither one value nor a sequence (or one value where ``shared`` is False).
        ValueError: a sequence of the wrong length; whatever ``check`` raises for a value.
    """
    import torch

    n_models = check_int("n_models", n_models, minimum=1)
    allowed = _allowed(kind, n_models, shared)
    if isinstance(value, torch.Tensor) and value.dim() <= 1:
        value = value.tolist()
    elif hasattr(value, "ndim") and hasattr(value, "tolist") and getattr(value, "ndim", 2) <= 1:
        value = value.tolist()  # a numpy array or scalar
    is_single = single(value) if single is not None else not isinstance(value, (list, tuple, range))
    if is_single:
        if not shared:
            raise TypeError(f"{name} must be {allowed}; got one {type(value).__name__} {value!r:.60}")
        return (check(name, value),) * n_models
    values = tuple(value)
    if len(values) != n_models:
        raise ValueError(f"{name} must be {allowed}; got {len(values)}")
    return tuple(check(f"{name}[{i}]", v) for i, v in enumerate(values))


def per_model_ints(name: str, value, n_models: int, minimum: int | None = None,
                   maximum: int | None = None, shared: bool = True) -> tuple[int, ...]:
    """One int per model (offsets, seeds): :func:`per_model` with :func:`check_int` on each value.

    ``value`` is one int (shared by all ``n_models``, unless ``shared=False``) or a sequence of
    exactly ``n_models`` ints; a 0-d or 1-d integer tensor or numpy array counts.

    Raises:
        TypeError: ``value`` is neither an int nor a sequence of ints (a float, a bool, a string ...).
        ValueError: a sequence of the wrong length, or a value out of range.
    """
    import torch

    if isinstance(value, torch.Tensor) and (value.dtype.is_floating_point or value.dtype.is_complex
                                            or value.dtype == torch.bool or value.dim() > 1):
        raise TypeError(f"{name} must be an int or a sequence of ints; got a {value.dtype} tensor "
                        f"of shape {tuple(value.shape)}")
    return per_model(name, value, n_models, lambda label, v: check_int(label, v, minimum, maximum), "int", shared,
                     single=lambda v: not hasattr(v, "__iter__") or isinstance(v, (str, bytes)))


def per_model_rows(name: str, array, n_models: int):
    """Return ``array`` if its leading dimension holds one row per model (``n_models`` rows), else raise.

    For tensors and arrays with a model dimension (``[M, ...]``), in the wording of :func:`per_model`.

    Raises:
        ValueError: ``array`` has no dimension, or another number of rows.
    """
    n_models = check_int("n_models", n_models, minimum=1)
    rows = _count(array)
    if rows != n_models:
        raise ValueError(f"{name} must be {_allowed('row', n_models, False)}; got "
                         + ("no rows" if rows is None else f"{rows}")
                         + (f" (shape {tuple(array.shape)})" if hasattr(array, "shape") else ""))
    return array


def normalize_sequence(config, name: str, minimum: int | None = None) -> tuple[int, ...]:
    """Store field ``name`` of a frozen config as a tuple of checked ints (a list is accepted) and return it."""
    values = check_int_sequence(name, getattr(config, name), minimum=minimum)
    object.__setattr__(config, name, values)
    return values


# ---------------------------------------------------------------- numbers from other libraries (numpy scalars)
def plain_number(value):
    """``value`` with a numpy scalar (``np.bool_``, ``np.int64``, ``np.float32``, ...) turned into the Python
    ``bool``, ``int`` or ``float`` of the same value, inside tuples and lists too; anything else unchanged.

    Configurations call :func:`normalize_numbers` at construction, so that a value from numpy is stored,
    hashed and written into a cache key as the Python number it stands for.
    """
    if type(value) in (tuple, list):
        return type(value)(plain_number(v) for v in value)
    import numpy as np

    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return value.item()  # the Python bool, int or float of the same value
    return value


def normalize_numbers(config) -> None:
    """Store every field of the (frozen) dataclass ``config`` through :func:`plain_number`.

    The first step of every configuration's ``__post_init__``: after it, the checks see Python numbers
    and the configuration stores them (a numpy ``int64`` would pass ``check_int`` and then fail the
    JSON of the cache key).
    """
    for f in fields(config):
        value = getattr(config, f.name)
        plain = plain_number(value)
        if plain is not value:
            object.__setattr__(config, f.name, plain)


class Normalized:
    """Base of every frozen dataclass built from user values (experiments, settings, encodings, tasks, model
    configurations).

    Its ``__post_init__`` stores every field through :func:`plain_number` (:func:`normalize_numbers`) and
    runs before a subclass's own ``__post_init__``, so that one's checks see Python numbers and the
    configuration stores them (a numpy ``int64`` would pass ``check_int`` and then fail the JSON of the
    cache key).
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__post_init__")
        if own is not None and not getattr(own, "_normalizes", False):
            def __post_init__(self, _own=own):
                normalize_numbers(self)  # numpy scalars become Python numbers before any check
                _own(self)
            __post_init__._normalizes = True
            cls.__post_init__ = __post_init__

    def __post_init__(self):
        normalize_numbers(self)


# ---------------------------------------------------------------- environment variables
def env_value(variable: str) -> str | None:
    """The value of environment variable ``variable``, surrounding spaces stripped; None when it is unset or empty.

    The one convention of every ``LENGTHGEN_*`` variable: an empty (or blank) value means the same as an
    unset one, and ``' quick '`` means ``'quick'``. Every variable the package reads goes through here.
    """
    value = os.environ.get(variable)
    if value is None:
        return None
    return value.strip() or None


def env_int(variable: str, minimum: int, maximum: int, meaning: str) -> int | None:
    """``$variable`` as an integer in ``[minimum, maximum]``, or None when it is unset or empty (:func:`env_value`).

    The bound keeps a value that would overflow inside torch later (a seed past 64 bits, a thread count
    past 32 bits) from passing here: it is refused at the edge, naming the variable.

    Args:
        variable: the variable's name, e.g. ``"LENGTHGEN_SEED"``.
        minimum, maximum: the allowed range (inclusive).
        meaning: what the value is, for the message (``"the seed base"``).

    Raises:
        ValueError: a value that is not a whole number written in decimal digits (``-1``, ``2.5``, ``abc``,
            ``1e3``), or one outside the range; the message names the variable and its value.
    """
    value = env_value(variable)
    if value is None:
        return None
    digits = value[1:] if value[:1] == "+" else value
    number = int(digits) if digits.isascii() and digits.isdigit() else None
    if number is None or not minimum <= number <= maximum:
        raise ValueError(f"${variable} must be an integer >= {minimum} and <= {maximum} ({meaning}); "
                         f"got {variable}={os.environ[variable]!r}")
    return number


# ---------------------------------------------------------------- paths from environment variables
def expand_path(name: str, value) -> Path:
    """``value`` (a path given as ``name``: an argument or ``$VARIABLE``) as a ``Path`` with ``~`` expanded.

    Raises:
        TypeError: ``value`` is not a string or path.
        ValueError: it starts with ``~`` that names no home folder (an unknown ``~user``, or no ``$HOME``).
    """
    try:
        text = os.fspath(value)
    except TypeError:
        raise TypeError(f"{name} must be a path (str or os.PathLike); got {type(value).__name__} "
                        f"{value!r:.60}") from None
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    expanded = os.path.expanduser(text)
    if expanded.startswith("~"):
        raise ValueError(f"{name}={text!r} starts with '~', which names no home folder here (unknown user, or "
                         "$HOME unset); give an absolute path or one relative to the working directory")
    return Path(expanded)


PACKAGE_REPOSITORY = Path(__file__).resolve().parent.parent
"""The repository this package was imported from (the folder holding ``lengthgen_utils``)."""


def book_root(start: Path | None = None) -> Path:
    """The book being run: the nearest folder at or above ``start`` (default: the working directory) that
    holds ``_toc.yml``; this package's repository when there is none.

    A chapter runs in ``chapters/``, the scoreboard in the book's root and the command line wherever it is
    started: all of them inside one book find the same folder here.
    """
    here = Path.cwd() if start is None else Path(start)
    for folder in (here, *here.parents):
        if (folder / "_toc.yml").is_file():
            return folder
    return PACKAGE_REPOSITORY


def env_path(variable: str, default=None) -> Path | None:
    """The path in environment variable ``variable``, absolute, or ``default`` when it is unset or empty.

    Every path the package reads from the environment goes through here (``$LENGTHGEN_CACHE``,
    ``$LENGTHGEN_CLAIMS``): ``~`` is expanded (``LENGTHGEN_CACHE=~/lg-cache`` means the folder in the home
    folder, never a folder literally named ``~``), and a relative path is resolved once, against one base,
    the book's root (:func:`book_root`: the nearest folder holding ``_toc.yml`` at or above the working
    directory), never against each process's working directory: a chapter (run in ``chapters/``) and the
    scoreboard (run in the book's root) then read and write the same folder.

    Raises:
        ValueError: the value starts with a ``~`` that names no home folder (see :func:`expand_path`).
    """
    value = env_value(variable)
    if value is None:
        return default
    path = expand_path(f"${variable}", value)
    return path if path.is_absolute() else book_root() / path


def check_output_file(name: str, value) -> Path:
    """``value`` as the path of a file a command will write (``--output``), checked before any work.

    Raises:
        TypeError: ``value`` is not a string or path.
        ValueError: it names an existing folder, or a folder above it is a file (nothing could be written
            there); the message names ``name`` and the path.
    """
    path = expand_path(name, value)
    if path.is_dir():
        raise ValueError(f"{name} {str(path)!r} is a folder; give the path of a file to write")
    for above in path.parents:
        if above.exists():
            if not above.is_dir():
                raise ValueError(f"{name} {str(path)!r} cannot be written: {str(above)!r} is a file, not a folder")
            break
    return path


# ---------------------------------------------------------------- devices
def available_devices() -> tuple[str, ...]:
    """The devices this machine computes on: ``"cpu"``, then ``"cuda"``, ``"cuda:0"``, ... and ``"mps"`` if present."""
    import torch

    out = ["cpu"]
    if torch.cuda.is_available():
        out += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    return tuple(out)


def check_device(device, name: str = "device"):
    """Return ``device`` as a ``torch.device`` the package can compute on, checked once, before any work.

    ``None`` is the default device (CUDA when available, else the CPU). A string with a typo, ``"cuda"``
    on a machine without CUDA, a CUDA index beyond the devices present, and devices that hold no numbers
    (``"meta"``) or that the package does not run on are refused here, naming the device and what this
    machine has, instead of failing deep inside a run with torch's message (or its bare ``AssertionError``).

    Raises:
        TypeError: ``device`` is not a string, a ``torch.device`` or None.
        ValueError: a device this machine cannot compute on.
    """
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, torch.device):
        dev = device
    elif isinstance(device, str):
        try:
            dev = torch.device(device)
        except (RuntimeError, ValueError):
            raise ValueError(f"{name}={device!r} is not a device name; available here: "
                             f"{', '.join(available_devices())}") from None
    else:
        raise TypeError(f"{name} must be a device name (e.g. 'cpu', 'cuda'), a torch.device or None; "
                        f"got {type(device).__name__} {device!r:.60}")
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            built = ("this torch build has no CUDA" if not torch.backends.cuda.is_built()
                     else "no CUDA device is visible")
            raise ValueError(f"{name}={str(dev)!r} is not available: {built} (torch {torch.__version__}); "
                             f"available here: {', '.join(available_devices())}")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{name}={str(dev)!r} is not available: this machine has {torch.cuda.device_count()} "
                             f"CUDA device(s); available here: {', '.join(available_devices())}")
        return dev
    if dev.type == "mps" and "mps" in available_devices():
        return dev
    why = "it holds shapes, not numbers" if dev.type == "meta" else "the package does not compute on it here"
    raise ValueError(f"{name}={str(dev)!r} cannot run the package's computations ({why}); available here: "
                     f"{', '.join(available_devices())}")


def error_line(prog: str, message: str) -> int:
    """A bad input of a command (an option or an environment variable): one line on stderr, no traceback;
    returns exit status 2 (as argparse's own). Every command of the package fails this one way."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def interrupted(prog: str, what: str = "") -> int:
    """Ctrl-C: one line on stderr saying what was stopped; returns exit status 130 (128 + SIGINT, as a shell)."""
    print(f"{prog}: interrupted (Ctrl-C){': ' + what if what else ''}", file=sys.stderr)
    return 130
