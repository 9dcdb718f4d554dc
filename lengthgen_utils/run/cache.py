"""The results cache: expensive experiments are stored on disk once and loaded on later builds.

An entry is one file ``<key>.pt`` in the cache folder, where ``key`` is a
SHA-256 over the experiment's full configuration and what produced it (the
package version, a fingerprint of the package's computing modules, the torch
version, the device type). The file holds::

    LENGTHGEN-CACHE 1\\n
    {"key": ..., "sha256": ..., "n_bytes": ..., "meta": {...}}\\n
    <payload: torch.save of tensors, state dicts, numbers and strings>

It is written to a temporary file in the same folder and then renamed over
the entry (``os.replace``, atomic on POSIX and Windows), so a reader sees
either no entry or a complete one, and two builds writing the same entry at
once leave one of two identical complete files. On reading, the length, the
checksum, the key and the configuration are all checked and the payload is
loaded with ``torch.load(weights_only=True)`` (no arbitrary objects are
unpickled); an entry that fails any check is reported, removed and
recomputed, never used. A write killed half way leaves only a temporary file,
which is never read (``clear`` removes it).

Entries follow the process's umask (0644 under the usual 022), like any file the user writes, so a
cache folder shared by several users or a CI job is readable by all of them. Reading never stops a run:
an entry that cannot be read (a permission, a cache path that is a file, an entry that is a folder, any
other ``OSError``) or that fails a check is reported with a ``RuntimeWarning`` and the result recomputed.

The folder may hold other files (a checkpoint, notes): :func:`clear` and ``python -m lengthgen_utils cache
info`` touch and count only the cache's own files, entries (a key-shaped name ``<64 hex digits>.pt`` that
starts with :data:`MAGIC`) and the temporary files of its writes (``.<16 hex digits>.<random>.tmp``).

Where: ``$LENGTHGEN_CACHE`` if set (``off`` disables the cache; ``~`` is expanded), else
``.cache/lengthgen`` under the repository root (ignored by git).
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import numbers
import os
import re
import stat
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from pathlib import Path

import torch
from torch import Tensor

from .. import __version__
from .._validate import check_device, env_path, env_value, expand_path

CACHE_ENV = "LENGTHGEN_CACHE"
MAGIC = b"LENGTHGEN-CACHE 1\n"
_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # lengthgen_utils/
REPO_ROOT = _PACKAGE_DIR.parent
ENTRY_NAME = re.compile(r"[0-9a-f]{64}\.pt")
"""The name of an entry: its key (a SHA-256 in hex) and ``.pt``."""
TEMP_NAME = re.compile(r"\.[0-9a-f]{16}\.[A-Za-z0-9_]+\.tmp")
"""The name of a temporary file of :func:`save_entry`: ``.<first 16 digits of the key>.<random>.tmp``."""
# The code that computes a cached number: the models, the analyses and the experiment machinery. The book's
# figures, checks and scoreboard (book/) and the tools cannot change one; profiles only choose configurations,
# which the key holds anyway.
_FINGERPRINTED = ("_validate.py", "core", "analysis", "run")
_NOT_FINGERPRINTED = {"run/profiles.py"}


class CorruptEntry(Exception):
    """An entry failed a check (length, checksum, key, configuration or safe loading)."""


def _fingerprint_files() -> str:
    h = hashlib.sha256()
    paths = [_PACKAGE_DIR / p for p in _FINGERPRINTED if p.endswith(".py")]
    paths += [p for d in _FINGERPRINTED if not d.endswith(".py") for p in (_PACKAGE_DIR / d).rglob("*.py")]
    for path in sorted(paths):
        name = path.relative_to(_PACKAGE_DIR).as_posix()
        if name not in _NOT_FINGERPRINTED:
            h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


_FINGERPRINT = _fingerprint_files()  # read when the package is imported: the code this process runs


def code_fingerprint() -> str:
    """SHA-256 (hex, 16 digits) of the package's computing modules as they were when imported.

    Part of every cache key, so an entry computed by different code (a changed
    model, task or training loop, even without a version bump) is never used.
    """
    return _FINGERPRINT


def cache_dir(path=None) -> Path | None:
    """The cache folder: ``path`` if given, else ``$LENGTHGEN_CACHE``, else ``<repo>/.cache/lengthgen``.

    ``~`` is expanded in both (``LENGTHGEN_CACHE=~/lg-cache`` is the folder in the home folder); a relative
    ``$LENGTHGEN_CACHE`` is resolved against the book's root (:func:`~lengthgen_utils._validate.env_path`), so
    every chapter and the command line share one folder whatever their working directory. Returns
    ``None`` when the cache is disabled (``path`` or ``$LENGTHGEN_CACHE`` is ``"off"``). The folder is
    created on first write, not here.

    Raises:
        TypeError: ``path`` is not a string or path.
        ValueError: a path that starts with a ``~`` naming no home folder (the message names it).
    """
    value = (env_value(CACHE_ENV) or "") if path is None else path
    if isinstance(value, str) and value.strip().lower() in ("off", "0", "false", "none"):
        return None
    if path is None:
        return env_path(CACHE_ENV, default=REPO_ROOT / ".cache" / "lengthgen")
    return expand_path("cache", value) if value else REPO_ROOT / ".cache" / "lengthgen"


def check_payload(payload, where: str = "payload") -> None:
    """Raise ``TypeError`` unless ``payload`` holds only what the cache stores safely.

    Allowed: tensors, ``None``, bools, ints, floats, strings, and dicts (string
    keys), lists and tuples of those, nested. State dicts qualify; models,
    functions and dataclasses do not (store their state dict or fields).
    """
    if payload is None or isinstance(payload, (Tensor, bool, int, float, str)):
        return
    if isinstance(payload, dict):
        for k, v in payload.items():
            if not isinstance(k, str):
                raise TypeError(f"{where} keys must be str; got {type(k).__name__} {k!r}")
            check_payload(v, f"{where}[{k!r}]")
        return
    if isinstance(payload, (list, tuple)):
        for i, v in enumerate(payload):
            check_payload(v, f"{where}[{i}]")
        return
    raise TypeError(f"{where} must hold only tensors, numbers, strings, None, dicts, lists or tuples; "
                    f"got {type(payload).__name__}")


def make_key(description: dict) -> str:
    """SHA-256 (hex) of ``description`` serialised as sorted, compact JSON.

    Raises:
        TypeError: ``description`` holds something JSON cannot represent.
    """
    text = json.dumps(description, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def entry_path(folder: Path, key: str) -> Path:
    return Path(folder) / f"{key}.pt"


def _to_cpu(payload):
    if isinstance(payload, Tensor):
        return payload.detach().cpu()
    if isinstance(payload, dict):
        return {k: _to_cpu(v) for k, v in payload.items()}
    if isinstance(payload, (list, tuple)):
        return type(payload)(_to_cpu(v) for v in payload)
    return payload


def _umask() -> int:
    """The process's file-creation mask (read without changing it where the system says it: Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (what every POSIX program does to read it)
    os.umask(mask)
    return mask


def save_entry(folder: Path, key: str, payload, meta: dict) -> Path:
    """Write ``payload`` (tensors moved to CPU) as the entry ``key``, atomically.

    The entry's mode follows the umask, as a file opened for writing would (``0o666 & ~umask``):
    ``mkstemp`` creates its temporary file owner-only (0600), and the rename would keep that mode,
    locking other users of a shared cache folder out of the entry.

    Raises:
        TypeError: the payload holds an object the cache does not store (see :func:`check_payload`).
        OSError: the folder cannot be written.
    """
    check_payload(payload)
    buffer = io.BytesIO()
    torch.save(_to_cpu(payload), buffer)
    body = buffer.getvalue()
    header = {"key": key, "sha256": hashlib.sha256(body).hexdigest(), "n_bytes": len(body), "meta": meta}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    final = entry_path(folder, key)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key[:16]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), 0o666 & ~_umask())
            f.write(MAGIC)
            f.write(json.dumps(header, sort_keys=True).encode() + b"\n")
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return final


def read_entry(folder: Path, key: str, expect_meta: dict | None = None):
    """The payload of entry ``key``, or ``None`` if there is none.

    Args:
        folder: the cache folder.
        key: the entry's key.
        expect_meta: items the entry's metadata must hold (e.g. the configuration).

    Raises:
        CorruptEntry: the file exists but is truncated, garbled, belongs to another
            key or configuration, or holds something ``weights_only`` loading refuses.
        OSError: the entry exists but cannot be read (a permission, a folder in its place, a cache
            path that is a file); :func:`load_or_run` reports it and recomputes.
    """
    path = entry_path(folder, key)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if not data.startswith(MAGIC):
        raise CorruptEntry("no cache header")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise CorruptEntry("header cut off")
    try:
        header = json.loads(data[len(MAGIC):end])
    except ValueError as e:
        raise CorruptEntry(f"unreadable header ({e})") from None
    if not isinstance(header, dict):
        raise CorruptEntry("header is not a JSON object")
    body = data[end + 1:]
    if header.get("key") != key:
        raise CorruptEntry(f"entry holds key {str(header.get('key'))[:16]}..., not {key[:16]}...")
    if header.get("n_bytes") != len(body):
        raise CorruptEntry(f"payload has {len(body)} bytes, header says {header.get('n_bytes')} (truncated?)")
    if header.get("sha256") != hashlib.sha256(body).hexdigest():
        raise CorruptEntry("payload checksum mismatch")
    meta = header.get("meta", {})
    for name, value in (expect_meta or {}).items():
        if meta.get(name) != value:
            raise CorruptEntry(f"metadata {name!r} differs from the request")
    try:
        return torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
    except Exception as e:  # the unpickler's errors vary by cause
        raise CorruptEntry(f"payload refused by weights_only loading ({type(e).__name__}: {e})") from None


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)  # not a folder, not a link to someone else's file
    except OSError:
        return False


def is_entry(path) -> bool:
    """True if ``path`` is one of the cache's entries: a regular file named ``<key>.pt`` (a 64-digit hex key)
    whose content starts with :data:`MAGIC`. A checkpoint or any other file in the folder is not."""
    path = Path(path)
    if not ENTRY_NAME.fullmatch(path.name) or not _is_regular(path):
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def entries(folder) -> list[Path]:
    """The cache's entries in ``folder`` (see :func:`is_entry`), sorted; ``[]`` if it is not a folder."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.pt") if is_entry(p))


def temporary_files(folder) -> list[Path]:
    """The temporary files that writes of this cache left in ``folder`` (``.<16 hex>.<random>.tmp``), sorted."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(".*.tmp") if TEMP_NAME.fullmatch(p.name) and _is_regular(p))


def clear(folder=None, older_than_s: float = 0.0) -> int:
    """Remove the cache's entries and the temporary files of its writes from the folder; returns how many.

    Only the cache's own files are touched (:func:`entries`, :func:`temporary_files`): a checkpoint, a
    note or any other file that shares the folder is left alone, whatever its name.

    Args:
        folder: the cache folder (default :func:`cache_dir`).
        older_than_s: only files last modified at least this many seconds ago (a finite number >= 0).

    Raises:
        TypeError / ValueError: ``older_than_s`` is not a finite real number >= 0 (NaN, inf, negative).
    """
    if isinstance(older_than_s, bool) or not isinstance(older_than_s, numbers.Real):
        raise TypeError(f"older_than_s must be a number of seconds >= 0; got {type(older_than_s).__name__} "
                        f"{older_than_s!r:.60}")
    older_than_s = float(older_than_s)
    if not math.isfinite(older_than_s) or older_than_s < 0:
        raise ValueError(f"older_than_s must be a finite number of seconds >= 0; got older_than_s={older_than_s}")
    folder = cache_dir(folder)
    if folder is None:
        return 0
    now, removed = time.time(), 0
    for path in entries(folder) + temporary_files(folder):
        try:
            if now - path.stat().st_mtime >= older_than_s:
                path.unlink()
                removed += 1
        except FileNotFoundError:
            pass
    return removed


def warn_corrupt(path: Path, reason: str) -> None:
    warnings.warn(f"results cache: entry {path.name} is unusable ({reason}); recomputing it", RuntimeWarning,
                  stacklevel=3)


# ---------------------------------------------------------------- load or run
def describe(obj):
    """A JSON-able description of a configuration: dataclasses become ``{"class": name, field: ...}``, nested.

    Class names are kept, so two configurations whose fields happen to agree (two tasks, two
    encodings) never share a description.

    Raises:
        TypeError: a value JSON cannot represent (after tuples become lists).
    """
    if is_dataclass(obj) and not isinstance(obj, type):
        return {"class": type(obj).__qualname__, **{f.name: describe(getattr(obj, f.name)) for f in fields(obj)}}
    if isinstance(obj, (list, tuple)):
        return [describe(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): describe(v) for k, v in obj.items()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"a configuration may hold dataclasses, numbers, strings, None, lists, tuples and dicts; "
                    f"got {type(obj).__name__} {obj!r}")


def numeric_settings(device=None) -> dict:
    """The process-wide settings that change what a computation on ``device`` returns, by name.

    Each of them changes float rounding or precision without changing any configuration, so each is
    part of every cache key (a run under one setting is never served to a run under another):

    * ``seed_base``: ``$LENGTHGEN_SEED`` (:mod:`~lengthgen_utils.core.seeding`): every random draw moves;
    * ``cpu_capability``: the SIMD kernels torch dispatches to on the CPU (``AVX512``, ``AVX2``, ``DEFAULT``;
      ``$ATEN_CPU_CAPABILITY`` lowers it): vector widths change the order of reductions;
    * ``default_dtype``: ``torch.set_default_dtype``;
    * ``float32_matmul_precision`` and ``fp32_precision``: ``torch.set_float32_matmul_precision`` and its newer
      form (TF32 or bfloat16 matmuls where the device has them);
    * ``flush_denormal``: ``torch.set_flush_denormal`` (no getter in torch: read off a denormal number);
    * ``mkldnn``: ``torch.backends.mkldnn.enabled`` (oneDNN kernels on the CPU);
    * ``deterministic``: ``torch.use_deterministic_algorithms``;
    * on CUDA, ``cuda_matmul_tf32`` and ``cudnn_tf32``.

    Returns:
        a JSON-able dict.
    """
    from ..core.seeding import seed_base
    from .training import default_device

    device = torch.device(device) if device is not None else default_device()
    settings = {"seed_base": seed_base(),
                "default_dtype": str(torch.get_default_dtype()),
                "float32_matmul_precision": torch.get_float32_matmul_precision(),
                "fp32_precision": str(getattr(torch.backends, "fp32_precision", None)),
                "flush_denormal": (torch.tensor([1e-40], dtype=torch.float32) * 1.0).item() == 0.0,
                "deterministic": torch.are_deterministic_algorithms_enabled()}
    if device.type == "cpu":
        settings["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        settings["mkldnn"] = bool(torch.backends.mkldnn.enabled)
    if device.type == "cuda":
        settings["cuda_matmul_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
        settings["cudnn_tf32"] = bool(torch.backends.cudnn.allow_tf32)
    return settings


def cache_description(config, device=None, threads: int | None = None) -> dict:
    """What identifies a cached result: the configuration and what computed it (hashed into the key).

    ``threads`` is the intra-op CPU thread count the computation runs with; it is part of the
    description on the CPU only (on a GPU it is recorded as None). :func:`numeric_settings` adds
    every process-wide setting that changes the numbers (the seed base, the CPU kernels, ...).
    """
    from .training import default_device

    device = torch.device(device) if device is not None else default_device()
    description = {"config": describe(config), "lengthgen_utils": __version__, "code": code_fingerprint(),
                   "torch": torch.__version__, "device": device.type,
                   "cpu_threads": threads if device.type == "cpu" else None,
                   "numeric": numeric_settings(device)}
    return json.loads(json.dumps(description, allow_nan=False))


def load_or_run(config, compute: Callable[[], dict], cache=True, device=None,
                threads: int | None = None) -> tuple[dict, str]:
    """Load the result of ``config`` from the results cache, or compute and store it.

    The key is a SHA-256 over :func:`cache_description`: the configuration (every field, nested,
    with class names), ``lengthgen_utils.__version__``, a fingerprint of the package's computing
    modules, the torch version, the device type, on the CPU the intra-op thread count, and the
    process-wide numeric settings (:func:`numeric_settings`: the seed base, the CPU kernels, the
    default dtype, ...), so an entry made by other settings or other code is never used. The thread count is in the key
    because it changes float rounding: a matmul or a sum split over two threads adds in another
    order, which moves a transformer's loss by about 1e-7 after one step and its trained weights
    further after hundreds (:data:`~lengthgen_utils.run.training.CPU_THREADS`); a cached result is the
    result this machine computes at that count, bit for bit. Entries are written atomically and verified on reading;
    a corrupt, truncated or foreign entry is reported with a ``RuntimeWarning`` and recomputed.

    Args:
        config: a frozen dataclass instance (e.g. :class:`~lengthgen_utils.run.configs.RetrievalExperiment`).
        compute: called with no arguments on a miss; returns the payload, a dict of
            tensors, state dicts, numbers, strings and lists (no models or other objects).
        cache: ``True`` (the default folder: ``$LENGTHGEN_CACHE`` or ``<repo>/.cache/lengthgen``),
            ``False`` (always compute, store nothing), or a folder path.
        device: the device the computation runs on (its type is part of the key); default
            :func:`~lengthgen_utils.run.training.default_device`.
        threads: the intra-op CPU thread count the computation runs with (part of the key on the
            CPU), e.g. :func:`~lengthgen_utils.run.training.default_cpu_threads` of its model's path.

    Returns:
        ``(payload, status)``: status is ``"hit"``, ``"miss"`` (computed and stored),
        ``"recomputed"`` (an entry that failed a check or could not be read was recomputed, and stored
        where the folder allows) or ``"off"`` (cache disabled). Faults of the cache itself (an unreadable
        entry or folder, a full disk) never raise: they are reported with a ``RuntimeWarning``.

    Raises:
        TypeError: ``config`` is not a dataclass instance, or the payload holds an object
            the cache cannot store safely.
        ValueError: a device this machine cannot compute on
            (:func:`~lengthgen_utils._validate.check_device`), or a cache path whose ``~`` names no home folder.
    """
    folder, key, description, payload, status = _look_up(config, cache, device, threads)
    if payload is not None:
        return payload, "hit"
    payload = compute()
    return payload, _store(folder, key, description, payload, status)


def _look_up(config, cache, device, threads):
    """The entry of ``config``: ``(folder or None when the cache is off, key, description, payload or None,
    status of a miss)``; an entry that fails a check or cannot be read is reported, and is a miss."""
    if not is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"config must be a dataclass instance; got {type(config).__name__}")
    device = check_device(device)  # a typo or "meta" is refused by name before any work
    folder = None if cache is False else cache_dir(None if cache is True or cache is None else os.fspath(cache))
    if folder is None:
        return None, None, None, None, "off"
    description = cache_description(config, device, threads)
    key = make_key(description)
    status = "miss"
    try:
        payload = read_entry(folder, key, expect_meta={"description": description})
    except CorruptEntry as e:
        warn_corrupt(entry_path(folder, key), str(e))
        status, payload = "recomputed", None
        try:
            entry_path(folder, key).unlink()
        except OSError:
            pass
    except OSError as e:  # a permission, a file where the folder should be, an entry that is a folder, ...
        warnings.warn(f"results cache: cannot read {entry_path(folder, key)} ({type(e).__name__}: {e}); "
                      "recomputing it", RuntimeWarning, stacklevel=3)
        status, payload = "recomputed", None
    return folder, key, description, payload, status


def _store(folder, key, description, payload, status) -> str:
    """Store a computed ``payload`` under ``key`` (checked; with the cache off, only checked); returns ``status``."""
    if folder is None:
        check_payload(payload)
        return "off"
    meta = {"description": description, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        save_entry(folder, key, payload, meta)
    except OSError as e:
        warnings.warn(f"results cache: could not store the entry in {folder} ({e}); continuing without it",
                      RuntimeWarning, stacklevel=3)
    return status


def load_or_run_many(configs, compute_many: Callable[[list], list], cache=True, device=None,
                     threads: int | None = None) -> list[tuple[dict, str]]:
    """:func:`load_or_run` for several configurations whose missing results are computed together.

    Each configuration keeps its own entry, keyed exactly as :func:`load_or_run` keys it, so a later
    ``load_or_run(config, ...)`` reads only that entry. ``compute_many`` is called at most once, with the
    configurations whose entries are missing (in the order given), e.g. to train several cells of a sweep
    as one batched ensemble; it is not called when every entry is there.

    Args:
        configs: frozen dataclass instances.
        compute_many: ``compute_many(missing) -> [payload, ...]``, one payload per configuration of ``missing``,
            in its order (each what ``compute`` of :func:`load_or_run` returns).
        cache, device, threads: as in :func:`load_or_run` (shared by every configuration).

    Returns:
        ``[(payload, status), ...]`` in the order of ``configs`` (status as in :func:`load_or_run`).

    Raises:
        TypeError: a configuration is not a dataclass instance, or a payload holds an object the cache cannot
            store safely.
        ValueError: ``compute_many`` returned a number of payloads other than the missing count; a device
            this machine cannot compute on.
    """
    configs = list(configs)
    looked = [_look_up(config, cache, device, threads) for config in configs]
    missing = [i for i, (_, _, _, payload, _) in enumerate(looked) if payload is None]
    results = [(payload, "hit") for _, _, _, payload, _ in looked]
    if missing:
        computed = list(compute_many([configs[i] for i in missing]))
        if len(computed) != len(missing):
            raise ValueError(f"compute_many must return one payload per missing configuration ({len(missing)}); "
                             f"got {len(computed)}")
        for i, payload in zip(missing, computed):
            folder, key, description, _, status = looked[i]
            results[i] = (payload, _store(folder, key, description, payload, status))
    return results
