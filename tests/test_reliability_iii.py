"""Reliability III: the results cache under sharing and faults, devices, degenerate inputs, state that leaks.

One test per kind, named after it:

1. cleanup that deletes what it did not write (``cache.clear``, ``cache info``, a build's claims records);
2. a shared cache folder (entries readable by others; every read fault degrades to a recompute);
3. paths from environment variables (``~`` expanded);
4. two runs at once (each run's claims records are its own; another run's record is refused by name;
   the records follow the book being run, not the imported package);
5. numeric types from other libraries (numpy scalars in every configuration);
7. devices (validated once, up front; a failed call leaves the caller's model as it was);
8. non-finite inputs on the other route (an additive score bias, in both attention paths);
6. process-wide numeric settings (every one a computation depends on is part of the cache key);
9. degenerate sizes (the smallest sizes allowed work, one below is refused by name);
10. internal state handed out (memoised tables cannot be corrupted by a caller);
11. strict JSON (every figure the book renders).
"""
import dataclasses
import json
import math
import os
import stat
import warnings
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest
import torch
from jupyter_client.session import json_packer

from tests import reference
from lengthgen_utils.tools import cli as cli
from lengthgen_utils import _validate
from lengthgen_utils.core import attention, models, rope
from lengthgen_utils.run import cache, configs, evaluation, profiles, runners, training
from lengthgen_utils.analysis import kernel, probes, theory
from lengthgen_utils.book import ch05, render, sliders, widgets
from lengthgen_utils.core.models import KernelHead, LinearRNN, RetrievalHead, Transformer
from lengthgen_utils.core.tasks import DelayedCopy, FixedOffsetRetrieval

from tests.test_reliability_ii import CONFIG_EXAMPLES, NOT_CONFIGS, _config_classes


@dataclasses.dataclass(frozen=True)
class Toy:
    """A configuration for the cache tests."""

    size: int = 3


def _compute(size=3):
    return lambda: {"x": torch.arange(size, dtype=torch.float32)}


def _only_entry(folder):
    (entry,) = [p for p in Path(folder).iterdir() if p.name.endswith(".pt") and len(p.stem) == 64]
    return entry


# ================================================================ 1. cleanup that deletes what it did not write
def test_cleanup_that_deletes_what_it_did_not_write(tmp_path, monkeypatch, capsys):
    """The reported example: with ``$LENGTHGEN_CACHE`` pointing at a folder that also holds a user's checkpoint,
    ``cache clear`` deleted the checkpoint and ``cache info`` counted it. Only files that are the cache's own
    (a key-shaped name ``<64 hex>.pt`` holding the cache's header, and the cache's temporary files) are
    counted and removed; ``older_than_s`` must be a finite number >= 0."""
    folder = tmp_path / "shared"
    cache.load_or_run(Toy(), _compute(), cache=folder)
    entry = _only_entry(folder)
    ours_tmp = folder / f".{entry.stem[:16]}.abc123_x.tmp"  # what a killed write leaves
    ours_tmp.write_bytes(cache.MAGIC + b"half")
    torch.save({"w": torch.ones(2)}, folder / "checkpoint.pt")  # the user's files
    user = {folder / "checkpoint.pt": None, folder / ("ab" * 32 + ".pt"): b"a key-shaped name, not an entry",
            folder / ".editor-swap.tmp": b"someone else's temporary file", folder / "notes.txt": b"hello"}
    for path, data in user.items():
        if data is not None:
            path.write_bytes(data)
    (folder / ("cd" * 32 + ".pt")).mkdir()  # a folder with a key-shaped name: never touched, no crash
    before = {p: p.read_bytes() for p in user}
    monkeypatch.setenv("LENGTHGEN_CACHE", str(folder))
    assert cli.main(["cache", "info"]) == 0
    info = capsys.readouterr().out
    assert "1 entries" in info and "1 leftover temporary file" in info, info
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="older_than_s"):
            cache.clear(folder, older_than_s=bad)
    with pytest.raises(TypeError, match="older_than_s"):
        cache.clear(folder, older_than_s="1")
    assert entry.exists() and ours_tmp.exists()  # a refused call removed nothing
    assert cache.clear(folder, older_than_s=3600.0) == 0  # too young
    assert cache.clear(folder) == 2 and not entry.exists() and not ours_tmp.exists()
    assert {p: p.read_bytes() for p in user} == before  # every file the cache did not write is still there
    assert (folder / ("cd" * 32 + ".pt")).is_dir()
    assert cli.main(["cache", "clear"]) == 0 and "removed 0 file(s)" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in user} == before


# ================================================================ 2. a shared cache folder
def test_a_shared_cache_folder_is_readable_by_others_and_every_read_fault_recomputes(tmp_path, monkeypatch):
    """The reported examples: entries were written owner-only (mkstemp's 0600 survived the rename), so a second
    user reading a shared cache got ``PermissionError``; a cache path that is a file raised
    ``NotADirectoryError`` from deep inside a run. Entries follow the umask; a cache that cannot be read (a file
    where the folder should be, an entry that is a folder, an entry the process may not read) is reported with a
    ``RuntimeWarning`` and the result recomputed."""
    previous = os.umask(0o022)
    try:
        cache.load_or_run(Toy(), _compute(), cache=tmp_path / "a")
        assert stat.S_IMODE(_only_entry(tmp_path / "a").stat().st_mode) == 0o644
        os.umask(0o002)  # a group-shared folder
        cache.load_or_run(Toy(), _compute(), cache=tmp_path / "b")
        assert stat.S_IMODE(_only_entry(tmp_path / "b").stat().st_mode) == 0o664
        os.umask(0o077)  # a private cache stays private
        cache.load_or_run(Toy(), _compute(), cache=tmp_path / "c")
        assert stat.S_IMODE(_only_entry(tmp_path / "c").stat().st_mode) == 0o600
    finally:
        os.umask(previous)

    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("a file where the cache folder should be")
    with pytest.warns(RuntimeWarning, match="results cache"):
        payload, status = cache.load_or_run(Toy(), _compute(), cache=not_a_folder)
    assert torch.equal(payload["x"], torch.arange(3.0)) and status == "recomputed"
    assert not_a_folder.read_text() == "a file where the cache folder should be"

    folder = tmp_path / "d"
    key = cache.make_key(cache.cache_description(Toy(), None))
    cache.entry_path(folder, key).mkdir(parents=True)  # the entry's path is a folder
    with pytest.warns(RuntimeWarning, match="results cache"):
        payload, status = cache.load_or_run(Toy(), _compute(), cache=folder)
    assert torch.equal(payload["x"], torch.arange(3.0)) and status == "recomputed"

    cache.load_or_run(Toy(), _compute(), cache=tmp_path / "e")

    def unreadable(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", unreadable)
    with pytest.warns(RuntimeWarning, match="Permission denied"):
        payload, status = cache.load_or_run(Toy(), _compute(), cache=tmp_path / "e")
    assert torch.equal(payload["x"], torch.arange(3.0)) and status == "recomputed"
    monkeypatch.undo()
    assert cache.load_or_run(Toy(), _compute(), cache=tmp_path / "e")[1] == "hit"  # the entry was left alone


# ================================================================ 3. paths from environment variables
def test_paths_from_environment_variables_expand_the_home_folder(tmp_path, monkeypatch, capsys):
    """The reported example: ``LENGTHGEN_CACHE=~/lg-cache`` created a folder literally named ``~`` in the working
    directory. ``~`` is expanded in every path variable the package reads (through ``_validate.env_path``);
    a ``~user`` that names no home folder is refused naming the variable."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    monkeypatch.setenv("LENGTHGEN_CACHE", "~/lg-cache")
    assert cache.cache_dir() == home / "lg-cache"
    assert cache.load_or_run(Toy(), _compute())[1] == "miss"
    assert _only_entry(home / "lg-cache") and not (work / "~").exists()
    assert cache.cache_dir("~/elsewhere") == home / "elsewhere"  # a path argument too
    monkeypatch.setenv("LENGTHGEN_CLAIMS", "~/claims")
    assert _validate.env_path("LENGTHGEN_CLAIMS") == home / "claims"
    monkeypatch.delenv("LENGTHGEN_CLAIMS")
    assert _validate.env_path("LENGTHGEN_CLAIMS", default=work / "x") == work / "x"
    monkeypatch.setenv("LENGTHGEN_CACHE", "~no-such-user-of-this-machine/lg-cache")
    with pytest.raises(ValueError, match="LENGTHGEN_CACHE"):
        cache.cache_dir()
    assert cli.main(["cache", "info"]) == 2  # the command line says so in one line
    err = capsys.readouterr().err
    assert "LENGTHGEN_CACHE" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (work / "~no-such-user-of-this-machine").exists()


# ================================================================ 5. numeric types from other libraries
def _numpy_inputs():
    """``(class name, field, numpy value, the Python value it stands for)`` for every number field of every
    configuration class (and every number inside a sequence field)."""
    for name, cls in sorted(_config_classes().items()):
        if name in NOT_CONFIGS:
            continue
        example = CONFIG_EXAMPLES[name]()
        for f in dataclasses.fields(cls):
            value = getattr(example, f.name)
            if not f.init:
                continue
            if isinstance(value, bool):
                yield name, f.name, np.bool_(value), value
            elif isinstance(value, int):
                yield name, f.name, np.int64(value), value
            elif isinstance(value, float):
                yield name, f.name, np.float32(value), float(np.float32(value))
            elif isinstance(value, tuple) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                            for v in value):
                np_values = tuple(np.int64(v) if isinstance(v, int) else np.float64(v) for v in value)
                yield name, f.name, np_values, value


NUMPY_INPUTS = list(_numpy_inputs())


@pytest.mark.parametrize("name, field, value, plain", NUMPY_INPUTS,
                         ids=[f"{n}.{f}" for n, f, _, _ in NUMPY_INPUTS])
def test_numeric_types_from_other_libraries_are_stored_as_python_numbers(name, field, value, plain):
    """The reported example: ``np.int64(2)`` passed a configuration's validation, then crashed the cache key
    (``TypeError ... got int64``). Every number field of every configuration class (and profile transformer
    settings) stores a numpy scalar as the Python number it stands for, at construction, so the configuration
    equals and hashes like the one built from Python numbers and has its cache key."""
    example = CONFIG_EXAMPLES[name]()
    kwargs = {f.name: getattr(example, f.name) for f in dataclasses.fields(example) if f.init}
    reference = type(example)(**{**kwargs, field: plain})
    config = type(example)(**{**kwargs, field: value})
    stored = getattr(config, field)
    assert stored == plain and type(stored) is type(plain), (stored, type(stored))
    if isinstance(stored, tuple):
        assert all(type(a) is type(b) for a, b in zip(stored, plain))
    assert config == reference and hash(config) == hash(reference)
    assert cache.make_key(cache.cache_description(config, "cpu")) == cache.make_key(
        cache.cache_description(reference, "cpu"))
    if name == "profiles.Profile":  # the transformer settings of a profile too
        p = profiles.Profile("p", 1, 1, 1, 1, (1,), transformer={"d_model": np.int64(16), "lr": np.float32(0.5)})
        settings = dict(p.transformer)
        assert type(settings["d_model"]) is int and type(settings["lr"]) is float
        assert configs.transformer_experiment(p, n_heads=2).d_model == 16
    with pytest.raises(TypeError, match=field):  # a value that is not a number of the right kind is refused by name
        type(example)(**{**kwargs, field: np.array([plain, plain]) if not isinstance(plain, tuple) else "x"})


# ================================================================ 7. devices
def test_devices_are_checked_up_front_and_a_failed_call_leaves_the_model_unchanged(monkeypatch, capsys):
    """The reported examples: a device with a typo, ``"cuda"`` without CUDA, or ``"meta"`` failed deep inside
    training with torch's message (one path a bare ``AssertionError``); after a failed ``train(..., device="meta")``
    the caller's model was left on ``meta`` with its weights gone; the command line printed a traceback. The device
    is checked once, up front, naming it and what this machine has; a call that fails (for any reason) leaves
    the caller's model where and as it was; the command line prints one line."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on a machine with a GPU
    task, seq_task = FixedOffsetRetrieval(4, 1), DelayedCopy(4, 1)
    head, kernel_head = RetrievalHead(4, 8, 4, max_len=8, n_models=2), KernelHead(4, 4, init_std=0.1)
    tf = Transformer(seq_task.n_tokens, 1, 1, 4, max_len=8)
    calls = {
        "train": lambda device: training.train(head, task, steps=2, batch_size=2, train_len=4, device=device),
        "train_squared_loss": lambda device: training.train_squared_loss(kernel_head, task, steps=2, batch_size=2,
                                                                         train_len=4, device=device),
        "train_sequence": lambda device: training.train_sequence(tf, seq_task, steps=2, batch_size=2, train_len=4,
                                                                 device=device),
        "run_retrieval": lambda device: runners.run_retrieval(
            configs.RetrievalExperiment(n_seeds=1, steps=1, batch_size=2, eval_samples=2, vocab_size=4, train_len=4,
                                        d_model=4, d_head=4, offset=1, length_multiples=(1,)), device=device,
            cache=False),
        "sample": lambda device: task.sample(2, 4, torch.Generator(), device=device),
        "causal_mask": lambda device: attention.causal_mask(3, device=device),
        "rope_cos_sin": lambda device: rope.rope_cos_sin(3, 4, device=device),
        "load_or_run": lambda device: cache.load_or_run(Toy(), _compute(), cache=False, device=device),
    }
    models_ = (head, kernel_head, tf)
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in models_]
    for name, call in calls.items():
        for device, match in (("cdua", "cdua"), ("cuda", "cuda"), ("cuda:1", "cuda:1"), ("meta", "meta"),
                              (torch.device("meta"), "meta")):
            with pytest.raises(ValueError, match=match) as info:
                call(device)
            assert "available here: cpu" in str(info.value), (name, str(info.value))
        with pytest.raises(TypeError, match="device"):
            call(3)
    for m, state in zip(models_, before):
        assert m.device.type == "cpu" and all(torch.equal(v, state[k]) for k, v in m.state_dict().items())

    # a failure half way through training: the model is as it was before the call
    def fail(step, loss):
        if step == 2:
            raise RuntimeError("interrupted by the caller")

    head.train(False)
    with pytest.raises(RuntimeError, match="interrupted"):
        training.train(head, task, steps=5, batch_size=2, train_len=4, device="cpu", callback=fail)
    assert all(torch.equal(v, before[0][k]) for k, v in head.state_dict().items())
    assert not head.training and all(p.grad is None for p in head.parameters())
    training.train(head, task, steps=2, batch_size=2, train_len=4, device="cpu")  # and it still trains
    assert not all(torch.equal(v, before[0][k]) for k, v in head.state_dict().items())

    # the command line: one line, no traceback
    for argv, match in ((["run", "--profile", "quick", "--device", "cdua"], "cdua"),
                        (["run", "--profile", "quick", "--device", "meta"], "meta"),
                        (["run", "--profile", "quick", "--device", "cuda"], "cuda")):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert match in err and "available here: cpu" in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err
    monkeypatch.setenv("LENGTHGEN_PROFILE", "fastest")
    assert cli.main(["run"]) == 2
    err = capsys.readouterr().err
    assert "LENGTHGEN_PROFILE" in err and len(err.strip().splitlines()) == 1
    monkeypatch.delenv("LENGTHGEN_PROFILE")
    monkeypatch.setenv("LENGTHGEN_THREADS", "two")
    assert cli.main(["run", "--profile", "quick", "--device", "cpu"]) == 2
    assert "LENGTHGEN_THREADS" in capsys.readouterr().err


# ================================================================ 8. non-finite inputs on the other route
def _qkv(seq_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, seq_len, 8, generator=g) for _ in range(3)]


ATTENTION_PATHS = {
    "causal (fused)": lambda q, k, v, bias: reference.causal_attention(q, k, v, bias=bias),
    "causal (explicit)": lambda q, k, v, bias: reference.causal_attention(q, k, v, bias=bias, return_weights=True)[0],
    "masked": lambda q, k, v, bias: reference.masked_attention(q, k, v, attention.causal_mask(q.shape[-2]), bias=bias),
    "masked (weights)": lambda q, k, v, bias: reference.masked_attention(
        q, k, v, attention.causal_mask(q.shape[-2]), return_weights=True, bias=bias)[0],
}


@pytest.mark.parametrize("seq_len", [4, 40])  # the batched-matmul route and torch's fused kernel
def test_non_finite_inputs_on_the_other_route_are_refused_in_both_attention_paths(seq_len):
    """The reported example: masks were validated, but an additive score bias holding ``-inf`` rows or NaN gave
    silent NaN outputs, and the fused and explicit paths disagreed (beyond 32 keys the fused kernel returned 0
    for a row with no key). Now every path refuses a NaN or ``+inf`` bias, and a ``-inf`` bias that leaves a
    query no key, naming ``bias``; a ``-inf`` bias that leaves every query a key masks those keys, identically
    in every path. A transformer whose encoding's bias has gone non-finite is refused at a validated call."""
    q, k, v = _qkv(seq_len)
    bad = {}
    bias = torch.zeros(seq_len, seq_len)
    bias[2, :] = -math.inf
    bad["a -inf row"] = bias
    bias = torch.zeros(seq_len, seq_len)
    bias[seq_len - 1, : seq_len - 1] = -math.inf
    bias[0, 0] = -math.inf  # query 0 sees key 0 only
    bad["-inf on every key a query sees"] = bias
    bias = torch.zeros(seq_len, seq_len)
    bias[3, 1] = math.nan
    bad["NaN"] = bias
    bias = torch.zeros(seq_len, seq_len)
    bias[3, seq_len - 1] = math.nan  # even on a masked key: NaN + -inf is NaN
    bad["NaN above the diagonal"] = bias
    bad["+inf"] = torch.zeros(seq_len, seq_len).index_put_((torch.tensor([3]), torch.tensor([1])),
                                                          torch.tensor(math.inf))
    bad["a -inf row of one head"] = torch.zeros(3, seq_len, seq_len).index_put_(
        (torch.tensor([1]), torch.tensor([2])), torch.tensor(-math.inf))
    for path, run in ATTENTION_PATHS.items():
        for what, bias in bad.items():
            with pytest.raises(ValueError, match="bias") as info:
                run(q, k, v, bias)
            assert "nan" in str(info.value).lower() or "inf" in str(info.value).lower(), (path, what, info.value)
        with pytest.raises(TypeError, match="bias"):
            run(q, k, v, torch.zeros(seq_len, seq_len, dtype=torch.long))
        with pytest.raises(ValueError, match="bias"):
            run(q, k, v, torch.zeros(seq_len + 1, seq_len))
    # -inf that leaves every query a key: a padding mask, the same numbers in every path
    partial = torch.zeros(seq_len, seq_len)
    partial[:, 1] = -math.inf
    partial[1, 0] = 0.0
    partial[1, 1] = 0.0  # query 1 keeps keys 0 and 1
    partial[0, 1] = -math.inf
    outputs = {path: run(q, k, v, partial) for path, run in ATTENTION_PATHS.items()}
    for path, out in outputs.items():
        assert torch.isfinite(out).all(), path
        torch.testing.assert_close(out, outputs["causal (explicit)"], rtol=1e-5, atol=1e-5)
    # the other route into a model: a learned bias that has gone NaN (a validated call refuses it)
    model = Transformer(6, 1, 2, 8, "t5", max_len=seq_len)
    head = RetrievalHead(4, 8, 4, "t5", max_len=seq_len)
    for m in (model, head):
        with torch.no_grad():
            m.pe_params["t5_bias"].fill_(math.nan)
        with pytest.raises(ValueError, match="bias"):
            m(torch.zeros(1, seq_len, dtype=torch.long))
    # and the closed forms of a kernel with a NaN logit
    logits = torch.zeros(1, seq_len)
    logits[0, 1] = math.nan
    for closed_form in (lambda s: theory.exact_target_mass(s, 1, [seq_len]), lambda s: theory.distractor_ratio(s, 1),
                        lambda s: theory.mean_field_parameters(s, 1, 3)):
        with pytest.raises(ValueError, match="kernel"):
            closed_form(logits)


# ================================================================ 9. degenerate sizes
_tok = lambda b, L: torch.zeros(b, L, dtype=torch.long)  # noqa: E731
_spectrum = lambda r: kernel.CarrierSpectrum(torch.tensor([1.0, 0.5]), torch.full((1, 2), float(r)),  # noqa: E731
                                            torch.zeros(1, 2))
SMALLEST = {  # the smallest sizes each function allows: a finite, non-empty result
    "RetrievalHead B=1 L=1": lambda: RetrievalHead(2, 1, 2, max_len=2)(_tok(1, 1))[0],
    "KernelHead B=1 L=1": lambda: KernelHead(2, 2)(_tok(1, 1))[0],
    "LinearRNN B=1 L=1": lambda: LinearRNN(2, 1)(_tok(1, 1))[0],
    "LinearRNN.states B=1 L=1": lambda: LinearRNN(2, 1).states(_tok(1, 1)),
    "Transformer B=1 L=1": lambda: Transformer(2, 1, 1, 2, max_len=1)(_tok(1, 1)),
    "readout B=1": lambda: models.readout(torch.ones(1, 1), _tok(1, 1), torch.ones(1, 2, 2)),
    "ensemble_cross_entropy B=1": lambda: training.ensemble_cross_entropy(torch.zeros(1, 1, 2), _tok(1, 1)),
    "ensemble_squared_error B=1": lambda: training.ensemble_squared_error(torch.zeros(1, 1, 2), _tok(1, 1)),
    "split_accuracy M=1 L=1": lambda: evaluation.split_accuracy(torch.ones(1, 1), torch.ones(1), 1)[0],
    "accuracy_by_length": lambda: evaluation.accuracy_by_length(RetrievalHead(2, 1, 2, max_len=3),
                                                                FixedOffsetRetrieval(2, 1), [3], n_samples=1),
    "r_squared M=1 n=2": lambda: theory.r_squared(torch.tensor([[0.0, 1.0]]), torch.zeros(1, 2)),
    "cosine_similarity d=1": lambda: theory.cosine_similarity(torch.ones(1), torch.ones(1)),
    "linear_noise_ratio L=3": lambda: theory.linear_noise_ratio(torch.ones(1, 3), 1),
    "expected_squared_error M=1": lambda: theory.expected_squared_error(torch.ones(1, 3), 1, 2),
    "critical_target_mass V=2": lambda: theory.critical_target_mass(2 * torch.eye(2)[None]),
    "peak_distance M=1 n=1": lambda: kernel.peak_distance(torch.zeros(1, 1)).double(),
    "participation_ratio n=1": lambda: kernel.participation_ratio(torch.ones(1, 1)),
    "diagonal_spread L=1": lambda: probes.diagonal_spread(torch.zeros(1, 1, 1)),
    "accuracy_transition M=1": lambda: probes.accuracy_transition(torch.ones(1, 1), [16], 0.5)["width"].nan_to_num(),
    "alignment": lambda: kernel.alignment(_spectrum(1.0), 1),
    "reconstruction": lambda: kernel.reconstruction(_spectrum(1.0), 3, 1),
    "rope_kernel_coefficients d=2": lambda: rope.rope_kernel_coefficients(torch.ones(1, 2), torch.ones(1, 2)),
}
ONE_BELOW = {  # one below: refused, naming the argument (never an empty result, a NaN or a ZeroDivisionError)
    "RetrievalHead B=0": ("tokens", lambda: RetrievalHead(2, 1, 2, max_len=2)(_tok(0, 2))),
    "KernelHead B=0": ("tokens", lambda: KernelHead(2, 2)(_tok(0, 2))),
    "LinearRNN B=0": ("tokens", lambda: LinearRNN(2, 1)(_tok(0, 2))),
    "LinearRNN.states B=0": ("tokens", lambda: LinearRNN(2, 1).states(_tok(0, 2))),
    "Transformer B=0": ("tokens", lambda: Transformer(2, 1, 1, 2, max_len=4)(_tok(0, 4))),
    "Transformer.head_scores B=0": ("tokens", lambda: Transformer(2, 1, 1, 2, max_len=4).head_scores(_tok(0, 4))),
    "Transformer L=0": ("tokens", lambda: Transformer(2, 1, 1, 2, max_len=4)(_tok(1, 0))),
    "readout B=0": ("tokens", lambda: models.readout(torch.ones(1, 2), _tok(0, 2), torch.ones(1, 2, 2))),
    # a batch of no sequences, refused by the trainers that choose the batch (their per-step losses,
    # ensemble_cross_entropy and ensemble_squared_error, are inner numerics and check nothing)
    "train B=0": ("batch_size", lambda: training.train(RetrievalHead(2, 1, 2, max_len=3), FixedOffsetRetrieval(2, 1),
                                                       steps=1, batch_size=0, train_len=3, device="cpu")),
    "train_squared_loss B=0": ("batch_size", lambda: training.train_squared_loss(
        KernelHead(2, 2), FixedOffsetRetrieval(2, 1), steps=1, batch_size=0, train_len=3, device="cpu")),
    "split_accuracy M=0": ("accuracy", lambda: evaluation.split_accuracy(torch.ones(0, 2), torch.ones(2), 1)),
    "split_accuracy L=0": ("accuracy", lambda: evaluation.split_accuracy(torch.ones(1, 0), torch.ones(0), 1)),
    "split_accuracy counts": ("counts", lambda: evaluation.split_accuracy(torch.ones(1, 2), torch.ones(3), 1)),
    "r_squared M=0": ("y", lambda: theory.r_squared(torch.zeros(0, 3), torch.zeros(0, 3))),
    "cosine_similarity of a zero vector": ("zero", lambda: theory.cosine_similarity(torch.zeros(3), torch.ones(3))),
    "cosine_similarity d=0": ("x", lambda: theory.cosine_similarity(torch.zeros(0), torch.zeros(0))),
    "linear_noise_ratio, target weight 0": ("kernel", lambda: theory.linear_noise_ratio(torch.zeros(1, 3), 1)),
    "linear_noise_ratio M=0": ("kernel", lambda: theory.linear_noise_ratio(torch.zeros(0, 3), 1)),
    "expected_squared_error M=0": ("kernel", lambda: theory.expected_squared_error(torch.zeros(0, 3), 1, 2)),
    "critical_target_mass V=1": ("value_table", lambda: theory.critical_target_mass(torch.ones(1, 1, 1))),
    "critical_target_mass V=0": ("value_table", lambda: theory.critical_target_mass(torch.zeros(1, 0, 0))),
    "critical_target_mass M=0": ("value_table", lambda: theory.critical_target_mass(torch.zeros(0, 2, 2))),
    "peak_distance n=0": ("kernel", lambda: kernel.peak_distance(torch.zeros(1, 0))),
    "peak_distance M=0": ("kernel", lambda: kernel.peak_distance(torch.zeros(0, 3))),
    "participation_ratio M=0": ("weights", lambda: kernel.participation_ratio(torch.ones(0, 3))),
    "diagonal_spread L=0": ("logits", lambda: probes.diagonal_spread(torch.zeros(1, 0, 0))),
    "diagonal_spread M=0": ("logits", lambda: probes.diagonal_spread(torch.zeros(0, 2, 2))),
    "accuracy_transition M=0": ("accuracy", lambda: probes.accuracy_transition(torch.ones(0, 2), [16, 32], 0.5)),
    "alignment, all weights 0": ("weights", lambda: kernel.alignment(_spectrum(0.0), 1)),
    "reconstruction, no variance": ("variance", lambda: kernel.reconstruction(_spectrum(0.0), 3, 1)),
    "rope_kernel_coefficients d=0": ("d_head", lambda: rope.rope_kernel_coefficients(torch.ones(1, 0),
                                                                                         torch.ones(1, 0))),
}


@pytest.mark.parametrize("case", list(SMALLEST) + list(ONE_BELOW))
def test_degenerate_sizes_work_at_the_smallest_allowed_and_are_refused_one_below(case):
    """The reported example: at the smallest sizes their arguments allow and one below, some model and evaluation
    functions gave an empty result, and the transformer divided by zero (a batch of no sequences). At the
    smallest allowed size every one gives a finite, non-empty result; one below, a ``ValueError`` naming the
    argument."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if case in SMALLEST:
            out = SMALLEST[case]()
            assert out.numel() > 0 and torch.isfinite(out.double()).all(), (case, out)
            return
        name, call = ONE_BELOW[case]
        with pytest.raises(ValueError, match=name):
            call()


# ================================================================ 10. internal state handed out
def test_internal_state_handed_out_cannot_corrupt_the_memo():
    """The reported example: ``rope_cos_sin`` returned its memoised tables, so a caller's in-place edit changed
    every later RoPE rotation in the process (and those results were cached under valid keys). Public callers
    get their own copy; the models' hot path keeps using the memo. The same holds for explicit frequencies
    handed to a kernel head (the head keeps its own)."""
    rope.rope_cos_sin.cache_clear()
    head = RetrievalHead(4, 8, 8, "rope", max_len=16)
    scores = head.scores(12).detach().clone()
    cos, sin = rope.rope_cos_sin(12, 8, dtype=torch.float32)
    cos.fill_(0.0)
    sin.mul_(7.0)
    again, _ = rope.rope_cos_sin(12, 8, dtype=torch.float32)
    torch.testing.assert_close(again, rope.rope_angles(torch.arange(12), 8).cos().float(), rtol=0, atol=0)
    assert torch.equal(head.scores(12), scores)  # the model's rotation is unchanged
    tf = Transformer(6, 1, 2, 8, "rope", max_len=16)
    tokens = torch.arange(12)[None] % 6
    before = tf(tokens)
    rope.rope_cos_sin(12, 4, dtype=torch.float32)[0].fill_(0.0)
    assert torch.equal(tf(tokens), before)
    assert rope.rope_cos_sin.cache_info().hits >= 1  # still memoised
    theta = torch.tensor([0.9, 0.3], dtype=torch.float64)
    kh = KernelHead(4, 4, frequencies=theta, init_std=1.0)
    out = kh.scores(6).detach().clone()
    theta.fill_(0.0)
    assert torch.equal(kh.scores(6), out)
    assert rope.kernel_frequencies(4, frequencies=theta) is not theta


# ================================================================ 11. strict JSON
def _figures_with_nan():
    """Figures the book renders, holding NaN: a raw trace, a package heatmap of accuracies with unmeasured
    cells, and a slider figure over NaN panels."""
    raw = go.Figure(go.Scatter(x=[1, 2, 3], y=np.array([0.5, np.nan, 1.0])), layout=dict(title="raw"))
    acc = np.array([[1.0, np.nan, 0.5], [np.nan, 0.75, 0.25]])
    heatmap = ch05.accuracy_heatmap(acc, [16, 32, 64], ["a", "b"], 0.25, "heatmap")
    slider = sliders.slider_figure({"one": raw, "two": go.Figure(go.Scatter(x=[1, 2], y=[np.nan, 2.0]))}, "panel")
    return {"raw": raw, "heatmap": heatmap, "slider": slider}


def test_strict_json_of_every_figure_the_book_renders():
    """The reported example: figures holding NaN were written by the book's renderer as non-standard JSON (NaN
    in the plotly JSON, and a warning printed in the cell), where plotly's own renderer writes ``null``. Every
    output the book renders (the ``lengthgen`` renderer's bundle, the interactive panel's output) is strict JSON,
    and rendering prints no warning."""
    render.setup()
    renderer = pio.renderers["lengthgen"]
    for name, fig in _figures_with_nan().items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            bundle = renderer.to_mimebundle(fig.to_dict())
            output = widgets._figure_output(fig)
        for what, data in (("bundle", bundle), ("panel", output)):
            text = json.dumps(data, allow_nan=False)  # raises on NaN or inf
            assert "NaN" not in text, (name, what)
            with warnings.catch_warnings():  # what the kernel does to send it: it warned in the cell
                warnings.simplefilter("error")
                json_packer({"data": data})
        plotly_json = bundle["application/vnd.plotly.v1+json"]
        reference = json.loads(pio.to_json(render.fit_to_column(fig), validate=False))
        assert plotly_json["data"] == reference["data"], name  # the same as plotly's own null-for-NaN JSON
        assert "NaN" not in bundle["text/html"]


# ---------------------------------------------------------------- kind 4: two runs at once
def test_two_runs_at_once_keep_their_own_records(tmp_path, monkeypatch):
    """A book build and a test session in one checkout: each writes and reads only its own run's records;
    a record of the other run is refused by name; a second checkout's chapters write into their own book's
    folder even when the package is imported from the first checkout."""
    from lengthgen_utils.book import scoreboard

    monkeypatch.setenv(scoreboard.CLAIMS_ENV, str(tmp_path / "claims"))
    monkeypatch.setenv(scoreboard.RUN_ENV, "build-1")
    scoreboard.record_claim("C1", "reproduced", "the build's", {"n": 1}, chapter="chapters/01_retrieval_task")
    monkeypatch.setenv(scoreboard.RUN_ENV, "pytest-2")
    scoreboard.record_claim("C1", "not reproduced", "the tests'", {"n": 2}, chapter="chapters/01_retrieval_task")
    assert scoreboard.load_claims()["C1"]["summary"] == "the tests'"
    monkeypatch.setenv(scoreboard.RUN_ENV, "build-1")
    assert scoreboard.load_claims()["C1"]["summary"] == "the build's"
    stray = tmp_path / "claims" / "build-1" / "C2.json"
    stray.write_text((tmp_path / "claims" / "pytest-2" / "C1.json").read_text().replace('"C1"', '"C2"'))
    with pytest.warns(RuntimeWarning, match="C2.json.*belongs to run 'pytest-2'"):
        assert "C2" not in scoreboard.load_claims()
    # a second checkout: its chapters run in its own folder, so its records go to its own _build
    other = tmp_path / "second-checkout"
    (other / "chapters").mkdir(parents=True)
    (other / "_toc.yml").write_text("format: jb-book\nroot: intro\n")
    monkeypatch.delenv(scoreboard.CLAIMS_ENV)
    monkeypatch.chdir(other / "chapters")
    assert scoreboard.run_dir() == other / "_build" / "claims" / "build-1"


# ---------------------------------------------------------------- kind 6: process-wide numeric settings
def test_process_wide_numeric_settings_are_part_of_the_cache_key(monkeypatch):
    """A global torch setting that changes what a run computes moves the cache key, so a run under one setting
    is never served to a run under another (each setting is also pinned one by one in test_robustness.py)."""
    exp = configs.RetrievalExperiment(n_seeds=1, steps=1)

    def key():
        return cache.make_key(cache.cache_description(exp, "cpu", 1))

    before = key()
    monkeypatch.setattr(torch, "get_default_dtype", lambda: torch.float64)
    after_dtype = key()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    after_kernels = key()
    monkeypatch.setenv("LENGTHGEN_SEED", "3")
    after_seed = key()
    assert len({before, after_dtype, after_kernels, after_seed}) == 4
    assert set(cache.numeric_settings("cpu")) >= {"seed_base", "cpu_capability", "default_dtype",
                                                  "float32_matmul_precision", "flush_denormal", "mkldnn",
                                                  "deterministic"}
