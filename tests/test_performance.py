"""Tests of the performance layer: batched multi-offset sweeps, the results cache, the command line.

Nothing here is timed: speed is only printed by ``python -m lengthgen_utils.tools.bench``.
"""
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from lengthgen_utils.run import cache as lg_cache
from lengthgen_utils.run import runners
from lengthgen_utils.tools.cli import format_sweep_table, main
from lengthgen_utils.run.cache import cache_description, load_or_run
from lengthgen_utils.run.configs import RetrievalExperiment, RetrievalSweep
from lengthgen_utils.core.models import RetrievalHead, Transformer
from lengthgen_utils.core.encodings import LearnedAPE, RoPE
from lengthgen_utils.core.rope import _rope_cos_sin, apply_rope
from lengthgen_utils.run.profiles import PROFILES, Profile
from lengthgen_utils.run.runners import run_retrieval, run_sweep
from lengthgen_utils.core.tasks import FixedOffsetRetrieval
from lengthgen_utils.run.training import cpu_threads, default_cpu_threads, train

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- models of one ensemble stay independent
@pytest.mark.parametrize("pe", ["rope", "ape"])
def test_ensemble_with_different_offsets_and_seeds_equals_each_model_alone(pe):
    offsets, seeds = [1, 3, 5, 3], [0, 0, 1, 7]
    tasks = [FixedOffsetRetrieval(16, k) for k in offsets]
    # float64, so that the only differences are rounding; any coupling between models would show at O(1).
    ensemble = RetrievalHead(16, 32, 16, pe, max_len=32, n_models=4, seeds=seeds).double()
    hist = train(ensemble, tasks, steps=30, batch_size=32, seed=5, device="cpu", min_train_len=7)
    for i, (k, s) in enumerate(zip(offsets, seeds)):
        alone = RetrievalHead(16, 32, 16, pe, max_len=32, n_models=1, seeds=[s]).double()
        hist1 = train(alone, FixedOffsetRetrieval(16, k), steps=30, batch_size=32, seed=5, device="cpu",
                      min_train_len=7)
        torch.testing.assert_close(hist1[:, 0], hist[:, i], rtol=1e-6, atol=1e-7)
        for (name, p_alone), (_, p_ens) in zip(alone.named_parameters(), ensemble.named_parameters()):
            rel = float(((p_alone[0] - p_ens[i]).norm() / p_ens[i].norm()).detach())
            assert rel < 1e-9, (i, name, rel)
    # the offsets really differ: models 1 and 3 share seed-free setup but not the seed; models 0/1 share seed 0
    assert not torch.allclose(hist[:, 0], hist[:, 1])


def test_min_train_len_changes_the_stream_and_is_validated():
    task = FixedOffsetRetrieval(16, 1)
    h_default = train(RetrievalHead(n_models=1), task, steps=5, batch_size=8, device="cpu")
    h_long = train(RetrievalHead(n_models=1), task, steps=5, batch_size=8, device="cpu", min_train_len=12)
    assert not torch.equal(h_default, h_long)
    with pytest.raises(ValueError, match="min_train_len"):
        train(RetrievalHead(n_models=1), FixedOffsetRetrieval(16, 5), steps=1, min_train_len=6)  # needs >= 7
    with pytest.raises(ValueError, match="min_train_len"):
        train(RetrievalHead(n_models=1), task, steps=1, train_len=16, min_train_len=17)
    with pytest.raises(ValueError, match="min_train_len"):
        RetrievalExperiment(offset=3, min_train_len=4)


def test_sweep_member_equals_its_experiment_run_alone(tmp_path):
    sweep = RetrievalSweep(pes=("rope", "ape"), offsets=(1, 3), n_seeds=2, steps=40, batch_size=64,
                           eval_samples=256, length_multiples=(1, 2))
    result = run_sweep(sweep, device="cpu", cache=tmp_path)
    assert result.where(pe=LearnedAPE(), attention="softmax").accuracy.shape == (4, 2)
    assert result.where(pe=RoPE()).loss_history.shape == (40, 4) and result.loss_history.shape == (40, 8)
    assert result.where(pe="rope").model.n_models == 4 and len(result.ensembles) == 2
    for pe in ("rope", "ape"):
        for k in (1, 3):
            exp = sweep.experiment(pe, k)
            assert exp.min_train_len == (None if k == 3 else 5)  # the sweep's shared stream: lengths 5..16
            alone = run_retrieval(exp, device="cpu", cache=False)
            member = result.where(pe=pe, offset=k)
            assert member.config == sweep and member.label("task") == [exp.task] * 2
            torch.testing.assert_close(member.loss_history, alone.loss_history, rtol=1e-5, atol=1e-5)
            # float32 rounding may flip at most a near-tie prediction
            assert (member.accuracy - alone.accuracy).abs().max() <= 1 / 256 + 1e-12
            torch.testing.assert_close(member.model.scores(32), alone.model.scores(32), rtol=1e-4, atol=1e-4)
            assert member.model.seeds == (0, 1)


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(offsets=(1, 1)), ValueError, "distinct"),
    (dict(offsets=(1, 15)), ValueError, "train_len"),
    (dict(offsets=(0, 1)), ValueError, "offsets"),
    (dict(pes=("rope", "alibi-typo")), ValueError, "registered ones are"),
    (dict(attentions=("relu",)), ValueError, "attention"),
    (dict(pes="rope"), TypeError, "pes"),
    (dict(offsets=(1, 5), min_train_len=6), ValueError, "min_train_len"),
])
def test_sweep_rejects_bad_configuration(kwargs, err, match):
    with pytest.raises(err, match=match):
        RetrievalSweep(**kwargs)


def test_sweep_from_profile_and_its_experiments():
    sweep = RetrievalSweep.from_profile(PROFILES["full"])
    assert sweep.offsets == (1, 2, 3, 5, 8) and sweep.n_seeds >= 10
    assert sweep.attentions == ("softmax", "linear")
    assert max(sweep.eval_lengths) == 64 * sweep.train_len
    assert sweep.n_models == 5 * sweep.n_seeds and sweep.shortest_train_len == 10
    assert sweep.experiment("ape", 8, "linear").min_train_len is None
    assert sweep.experiment("ape", 1, "linear").min_train_len == 10
    with pytest.raises(ValueError, match="offset"):
        sweep.experiment("rope", 4)
    assert dict(PROFILES["full"].transformer)["n_seeds"] >= 5


def test_subset_copies_members_in_order():
    model = RetrievalHead(n_models=4, seeds=[5, 6, 7, 8])
    sub = model.subset([3, 1])
    assert sub.seeds == (8, 6)
    torch.testing.assert_close(sub.scores(20), model.scores(20)[[3, 1]], rtol=0, atol=0)
    with pytest.raises(ValueError, match="indices"):
        model.subset([4])


# ---------------------------------------------------------------- hot-path pieces keep the numbers
def test_memoised_rope_tables_equal_apply_rope_bit_for_bit():
    x = torch.randn(3, 40, 16, generator=torch.Generator().manual_seed(0))
    from lengthgen_utils.core.rope import rotate_pairs

    cos, sin = _rope_cos_sin(40, 16, 10000.0, 1000, torch.float32, torch.device("cpu"))
    assert torch.equal(rotate_pairs(x, cos, sin), apply_rope(x, torch.arange(40) + 1000))
    hits = _rope_cos_sin.cache_info().hits
    again = _rope_cos_sin(40, 16, 10000.0, 1000, torch.float32, torch.device("cpu"))[0]
    assert _rope_cos_sin.cache_info().hits == hits + 1 and again is cos  # memoised: the memo itself
    # the models' rotation reads the memo: equal to apply_rope at the same positions
    head = RetrievalHead(4, 8, 16, "rope", max_len=2048)
    q, _ = head.queries_keys(torch.arange(40) + 1000)
    u = torch.einsum("md,mhd->mh", head.u, head.w_q)[:, None].expand(-1, 40, -1)
    assert torch.equal(q, apply_rope(u, torch.arange(40) + 1000))


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.float64, 1e-14)])
def test_interleaved_rope_as_a_complex_multiply_equals_the_pairwise_rotation(dtype, tol):
    """RoPE(interleaved=True).rotate multiplies complex pairs by memoised phases; it equals apply_rope's
    pairwise rotation to a few ulp, on strided views too (the transformer hands it a slice of q, k, v),
    and gradients flow through it."""
    qkv = torch.randn(3, 40, 6, 16, generator=torch.Generator().manual_seed(0), dtype=dtype, requires_grad=True)
    x = qkv[:, :, :4].transpose(1, 2)  # [3, 4, 40, 16], not contiguous
    positions = torch.arange(40) + 1000
    fast = RoPE(interleaved=True).rotate(x, positions)
    torch.testing.assert_close(fast, apply_rope(x, positions, interleaved=True), rtol=tol, atol=tol)
    fast.square().sum().backward()
    torch.testing.assert_close(qkv.grad[:, :, :4].transpose(1, 2), 2 * x.detach(), rtol=10 * tol, atol=10 * tol)
    assert (qkv.grad[:, :, 4:] == 0).all()  # rotations keep norms: d|R x|^2/dx = 2x, nothing leaks elsewhere


def test_tables_first_built_in_inference_mode_still_train():
    _rope_cos_sin.cache_clear()
    model = RetrievalHead(n_models=2)
    with torch.inference_mode():
        model.scores(13)
    hist = train(model, FixedOffsetRetrieval(16, 3), steps=3, batch_size=8, device="cpu", fixed_length=True,
                 train_len=13)
    assert torch.isfinite(hist).all()


def test_cpu_threads_restores_the_setting(monkeypatch):
    before = torch.get_num_threads()
    with cpu_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    monkeypatch.delenv("LENGTHGEN_THREADS", raising=False)
    assert default_cpu_threads() == default_cpu_threads("single-head") == 1
    assert default_cpu_threads("transformer") == min(2, os.cpu_count())
    assert default_cpu_threads(Transformer(8, 1, 2, 8)) == default_cpu_threads("transformer")
    assert default_cpu_threads(RetrievalHead()) == 1
    with pytest.raises(ValueError, match="path"):
        default_cpu_threads("mlp")
    monkeypatch.setenv("LENGTHGEN_THREADS", "3")
    assert default_cpu_threads() == default_cpu_threads("transformer") == 3  # the override applies to every path
    monkeypatch.setenv("LENGTHGEN_THREADS", "zero")
    with pytest.raises(ValueError, match="LENGTHGEN_THREADS"):
        default_cpu_threads()


def _threads_seen(model, run) -> set:
    """The intra-op thread counts in force whenever ``model`` computes (its forward passes, and the
    transformers' block loops, ``_layers`` of the readable one and ``_run`` of the fast one, which head_scores
    runs without forward) while ``run()`` executes."""
    seen = set()
    handle = model.register_forward_pre_hook(lambda *_: seen.add(torch.get_num_threads()))
    loop = "_run" if hasattr(model, "_run") else "_layers" if hasattr(model, "_layers") else None
    if loop is not None:
        inner = getattr(model, loop)

        def recording_run(*args, **kwargs):
            seen.add(torch.get_num_threads())
            return inner(*args, **kwargs)

        setattr(model, loop, recording_run)
    try:
        run()
    finally:
        handle.remove()
        model.__dict__.pop(loop, None)
    return seen


@pytest.mark.parametrize("threads_env", [None, "1"])
def test_training_and_evaluation_of_each_model_use_its_paths_thread_count(monkeypatch, threads_env):
    """The rule lives in one place (training.CPU_THREADS): the single head trains and is evaluated with
    1 thread, the transformer with 2 (capped at the cores); $LENGTHGEN_THREADS overrides both; the count
    of the process is restored afterwards."""
    from lengthgen_utils.run.evaluation import squared_error_by_length, token_accuracy_by_position
    from lengthgen_utils.core.models import KernelHead
    from lengthgen_utils.core.tasks import DelayedCopy
    from lengthgen_utils.run.training import train_sequence, train_squared_loss

    if threads_env is None:
        monkeypatch.delenv("LENGTHGEN_THREADS", raising=False)
    else:
        monkeypatch.setenv("LENGTHGEN_THREADS", threads_env)
    before = torch.get_num_threads()
    want_head = 1
    want_transformer = 1 if threads_env else min(2, os.cpu_count())
    task = FixedOffsetRetrieval(16, 3)
    head = RetrievalHead(n_models=2)
    assert _threads_seen(head, lambda: train(head, task, steps=2, batch_size=8, device="cpu")) == {want_head}
    from lengthgen_utils.run.evaluation import accuracy_by_length
    assert _threads_seen(head, lambda: accuracy_by_length(head, task, [16], n_samples=8)) == {want_head}
    kernel = KernelHead(n_models=2)
    assert _threads_seen(kernel, lambda: train_squared_loss(kernel, task, steps=2, batch_size=8,
                                                            device="cpu")) == {want_head}
    assert _threads_seen(kernel, lambda: squared_error_by_length(kernel, task, [16], n_samples=8)) == {want_head}
    from lengthgen_utils.analysis.probes import head_offset_profiles, shift_invariance
    from lengthgen_utils.core.fast import FastTransformer

    copy = DelayedCopy(16, 2)
    tokens, _ = copy.sample(2, 16, torch.Generator().manual_seed(0))
    for model in (FastTransformer(16, 1, 2, 16, n_models=2), Transformer(16, 1, 2, 16, n_models=2)):
        assert _threads_seen(model, lambda: train_sequence(model, copy, steps=2, batch_size=4, train_len=8,
                                                           device="cpu")) == {want_transformer}
        assert _threads_seen(model, lambda: token_accuracy_by_position(model, copy, 16,
                                                                       n_samples=4)) == {want_transformer}
        assert _threads_seen(model, lambda: shift_invariance(model, tokens, (1, 7))) == {want_transformer}
        assert _threads_seen(model, lambda: head_offset_profiles(model, copy, 16, n_samples=2)) == {want_transformer}
    assert torch.get_num_threads() == before


# ---------------------------------------------------------------- the results cache
@dataclass(frozen=True)
class ToyConfig:
    size: int = 3
    scale: float = 1.5


class Counter:
    """A compute function that records its calls."""

    def __init__(self, size=3):
        self.calls, self.size = 0, size

    def __call__(self):
        self.calls += 1
        return {"x": torch.arange(self.size, dtype=torch.float32) * 1.5, "lengths": [16, 32], "name": "toy",
                "nested": {"y": torch.ones(2, 2)}}


def only_entry(folder: Path) -> Path:
    entries = list(folder.glob("*.pt"))
    assert len(entries) == 1, entries
    return entries[0]


def test_cache_miss_then_hit(tmp_path):
    compute = Counter()
    first, status1 = load_or_run(ToyConfig(), compute, cache=tmp_path)
    second, status2 = load_or_run(ToyConfig(), compute, cache=tmp_path)
    assert (status1, status2, compute.calls) == ("miss", "hit", 1)
    assert torch.equal(first["x"], second["x"]) and second["lengths"] == [16, 32] and second["name"] == "toy"
    assert torch.equal(second["nested"]["y"], torch.ones(2, 2))
    _, status3 = load_or_run(ToyConfig(size=4), Counter(4), cache=tmp_path)  # another config: another entry
    assert status3 == "miss" and len(list(tmp_path.glob("*.pt"))) == 2


def test_cache_key_covers_config_version_code_torch_device_and_threads(monkeypatch):
    base = cache_description(ToyConfig(), "cpu")
    key = lg_cache.make_key(base)
    assert base["config"] == {"class": "ToyConfig", "size": 3, "scale": 1.5}
    assert lg_cache.make_key(cache_description(ToyConfig(scale=1.50001), "cpu")) != key
    assert lg_cache.make_key(cache_description(ToyConfig(), "cuda")) != key
    # the intra-op thread count changes float rounding: part of the key on the CPU, not on a GPU
    one, two = (lg_cache.make_key(cache_description(ToyConfig(), "cpu", n)) for n in (1, 2))
    assert len({key, one, two}) == 3
    assert cache_description(ToyConfig(), "cuda", 2) == cache_description(ToyConfig(), "cuda", 1)
    monkeypatch.setattr(lg_cache, "__version__", "9.9.9")
    assert lg_cache.make_key(cache_description(ToyConfig(), "cpu")) != key
    monkeypatch.setattr(lg_cache, "_FINGERPRINT", "0" * 16)
    assert cache_description(ToyConfig(), "cpu")["code"] == "0" * 16
    assert {"lengthgen_utils", "code", "torch", "device"} <= set(base)


def test_a_transformer_result_is_cached_per_thread_count(tmp_path, monkeypatch):
    """run_transformer keys its entry by the thread count it trains with: another count is another entry,
    the same count a hit (the loaded weights are the ones stored)."""
    from lengthgen_utils.run.configs import TransformerExperiment
    from lengthgen_utils.run.runners import run_transformer

    exp = TransformerExperiment(d_model=16, n_heads=2, n_layers=1, batch_size=4, steps=2, n_seeds=1,
                                eval_samples=2, eval_lengths=(32,))
    monkeypatch.setenv("LENGTHGEN_THREADS", "1")
    first = run_transformer(exp, device="cpu", cache=tmp_path)
    monkeypatch.setenv("LENGTHGEN_THREADS", "2")
    run_transformer(exp, device="cpu", cache=tmp_path)
    assert len(list(tmp_path.glob("*.pt"))) == 2
    monkeypatch.setenv("LENGTHGEN_THREADS", "1")
    again = run_transformer(exp, device="cpu", cache=tmp_path)
    assert len(list(tmp_path.glob("*.pt"))) == 2
    assert torch.equal(again.loss_history, first.loss_history)


def test_stale_entry_of_another_version_is_not_used(tmp_path, monkeypatch):
    compute = Counter()
    load_or_run(ToyConfig(), compute, cache=tmp_path)
    monkeypatch.setattr(lg_cache, "__version__", "0.0.0-other")
    _, status = load_or_run(ToyConfig(), compute, cache=tmp_path)
    assert status == "miss" and compute.calls == 2


def _corrupt_garbage(path):
    path.write_bytes(b"\x00\xffnot a cache entry" * 10)


def _corrupt_truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _corrupt_flip_payload_byte(path):
    data = bytearray(path.read_bytes())
    data[-40] ^= 0xFF
    path.write_bytes(bytes(data))


def _corrupt_empty(path):
    path.write_bytes(b"")


def _corrupt_header_only(path):
    data = path.read_bytes()
    path.write_bytes(data[: data.index(b"\n", len(lg_cache.MAGIC)) + 1])


@pytest.mark.parametrize("corrupt", [_corrupt_garbage, _corrupt_truncate, _corrupt_flip_payload_byte,
                                     _corrupt_empty, _corrupt_header_only])
def test_corrupt_entry_is_detected_and_recomputed(tmp_path, corrupt):
    compute = Counter()
    good, _ = load_or_run(ToyConfig(), compute, cache=tmp_path)
    corrupt(only_entry(tmp_path))
    with pytest.warns(RuntimeWarning, match="unusable"):
        again, status = load_or_run(ToyConfig(), compute, cache=tmp_path)
    assert status == "recomputed" and compute.calls == 2
    assert torch.equal(again["x"], good["x"])
    _, status = load_or_run(ToyConfig(), compute, cache=tmp_path)  # the rewritten entry is good
    assert status == "hit" and compute.calls == 2


def test_entry_of_another_key_is_refused(tmp_path):
    load_or_run(ToyConfig(size=3), Counter(3), cache=tmp_path)
    other_key = lg_cache.make_key(cache_description(ToyConfig(size=4), None))
    only_entry(tmp_path).rename(lg_cache.entry_path(tmp_path, other_key))
    compute = Counter(4)
    with pytest.warns(RuntimeWarning, match="key"):
        payload, status = load_or_run(ToyConfig(size=4), compute, cache=tmp_path)
    assert status == "recomputed" and payload["x"].shape == (4,)


class NotATensor:
    """An arbitrary object: weights_only loading must refuse it."""

    def __init__(self):
        self.value = 3


def test_entry_holding_an_arbitrary_object_is_refused_even_with_a_valid_checksum(tmp_path):
    description = cache_description(ToyConfig(), None)
    key = lg_cache.make_key(description)
    buffer = io.BytesIO()
    torch.save({"x": NotATensor()}, buffer)
    body = buffer.getvalue()
    header = {"key": key, "sha256": hashlib.sha256(body).hexdigest(), "n_bytes": len(body),
              "meta": {"description": description}}
    lg_cache.entry_path(tmp_path, key).write_bytes(lg_cache.MAGIC + json.dumps(header).encode() + b"\n" + body)
    compute = Counter()
    with pytest.warns(RuntimeWarning, match="weights_only"):
        payload, status = load_or_run(ToyConfig(), compute, cache=tmp_path)
    assert status == "recomputed" and isinstance(payload["x"], torch.Tensor)


def test_payloads_that_are_not_plain_data_are_refused(tmp_path):
    with pytest.raises(TypeError, match="payload"):
        load_or_run(ToyConfig(), lambda: {"model": RetrievalHead()}, cache=tmp_path)
    with pytest.raises(TypeError, match="keys must be str"):
        load_or_run(ToyConfig(), lambda: {1: torch.ones(1)}, cache=tmp_path)
    with pytest.raises(TypeError, match="dataclass"):
        load_or_run({"size": 3}, Counter(), cache=tmp_path)
    assert not list(tmp_path.glob("*"))


def test_cache_can_be_switched_off(tmp_path, monkeypatch):
    compute = Counter()
    assert load_or_run(ToyConfig(), compute, cache=False)[1] == "off"
    monkeypatch.setenv("LENGTHGEN_CACHE", "off")
    assert load_or_run(ToyConfig(), compute, cache=True)[1] == "off"
    monkeypatch.setenv("LENGTHGEN_CACHE", str(tmp_path / "here"))
    assert load_or_run(ToyConfig(), compute, cache=True)[1] == "miss"
    assert len(list((tmp_path / "here").glob("*.pt"))) == 1 and compute.calls == 3


_KILLED_WRITER = textwrap.dedent("""
    import json, os, sys, time, torch
    from lengthgen_utils.run import cache
    def hang(*args, **kwargs):
        print("HANGING", flush=True)
        time.sleep(600)
    folder, description, where = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    setattr(os, where, hang)
    cache.save_entry(folder, cache.make_key(description), {"x": torch.arange(3, dtype=torch.float32)},
                     {"description": description})
""")


@pytest.mark.parametrize("hang_in", ["fsync", "replace"])
def test_a_killed_write_leaves_no_entry_and_is_recomputed(tmp_path, hang_in):
    """The writer of ToyConfig's entry is killed half way (before its data is synced, or before the rename)."""
    description = cache_description(ToyConfig(), None)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(tmp_path), json.dumps(description), hang_in],
                             env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "HANGING"  # the write is under way
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    assert list(tmp_path.glob("*.pt")) == []  # no entry: only the temporary file
    assert len(list(tmp_path.glob(".*.tmp"))) == 1
    compute = Counter()
    _, status = load_or_run(ToyConfig(), compute, cache=tmp_path)
    assert status == "miss" and compute.calls == 1
    assert load_or_run(ToyConfig(), compute, cache=tmp_path)[1] == "hit"
    assert lg_cache.clear(tmp_path) == 2 and not list(tmp_path.iterdir())


_CONCURRENT_WRITER = textwrap.dedent("""
    import sys, torch
    from lengthgen_utils.run import cache
    payload = {"w": torch.arange(200_000, dtype=torch.float32), "tag": "same"}
    for _ in range(int(sys.argv[3])):
        cache.save_entry(sys.argv[1], sys.argv[2], payload, {"description": "concurrent"})
""")


def test_two_writers_at_once_never_expose_a_partial_entry(tmp_path):
    key = "c" * 64
    env = dict(os.environ, PYTHONPATH=str(REPO))
    writers = [subprocess.Popen([sys.executable, "-c", _CONCURRENT_WRITER, str(tmp_path), key, "25"], env=env)
               for _ in range(2)]
    reads = 0
    while any(w.poll() is None for w in writers):
        payload = lg_cache.read_entry(tmp_path, key, expect_meta={"description": "concurrent"})  # raises if torn
        if payload is not None:
            assert payload["tag"] == "same" and int(payload["w"][-1]) == 199_999
            reads += 1
        time.sleep(0.005)
    assert all(w.returncode == 0 for w in writers)
    final = lg_cache.read_entry(tmp_path, key, expect_meta={"description": "concurrent"})
    assert torch.equal(final["w"], torch.arange(200_000, dtype=torch.float32))
    assert list(tmp_path.glob(".*.tmp")) == [] and reads >= 1


def test_run_retrieval_goes_through_the_cache(tmp_path, monkeypatch):
    exp = RetrievalExperiment(pe="ape", n_seeds=2, steps=20, batch_size=32, eval_samples=64,
                              length_multiples=(1, 2))
    fresh = run_retrieval(exp, device="cpu", cache=tmp_path)
    assert list(fresh.cache.values()) == ["miss"]

    def no_training(*args, **kwargs):
        raise AssertionError("a warm cache must not train")

    monkeypatch.setattr(runners, "train", no_training)
    loaded = run_retrieval(exp, device="cpu", cache=tmp_path)
    assert list(loaded.cache.values()) == ["hit"]
    assert torch.equal(loaded.accuracy, fresh.accuracy) and torch.equal(loaded.loss_history, fresh.loss_history)
    for (name, a), (_, b) in zip(loaded.model.named_parameters(), fresh.model.named_parameters()):
        assert torch.equal(a.cpu(), b.cpu()), name
    assert loaded.model.seeds == (0, 1) and loaded.lengths == [16, 32]


# ---------------------------------------------------------------- command line
TINY = Profile("quick", n_seeds=1, steps=20, batch_size=32, eval_samples=64, length_multiples=(1, 2),
               offsets=(1, 3), attentions=("softmax",))


def test_command_line_run_prints_a_summary_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(PROFILES, "quick", TINY)
    monkeypatch.setenv("LENGTHGEN_CACHE", str(tmp_path))
    assert main(["run", "--profile", "quick", "--suite", "single-head", "--seeds", "2", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "mean over 2 seeds" in out and "wall time" in out
    table = [line for line in out.splitlines() if line.startswith(("rope ", "ape ", "nope "))]
    assert len(table) == 3 * 2  # PE x offsets, one attention type
    assert main(["run", "--profile", "quick", "--suite", "single-head", "--seeds", "2", "--device", "cpu"]) == 0
    assert "rope/softmax hit" in capsys.readouterr().out
    assert main(["cache", "info"]) == 0
    assert "3 entries" in capsys.readouterr().out


def test_summary_table_reports_mean_and_worst_seed(tmp_path):
    sweep = RetrievalSweep(pes=("nope",), offsets=(2,), n_seeds=2, steps=5, batch_size=16, eval_samples=64,
                           length_multiples=(1, 2))
    result = run_sweep(sweep, device="cpu", cache=False)
    acc = result.where(pe="nope", offset=2).accuracy
    line = format_sweep_table(result).splitlines()[-1]
    assert line.split()[:3] == ["nope", "softmax", "2"]
    assert f"{float(acc[:, 0].mean()):.3f} ({float(acc[:, 0].min()):.2f})" in line


def test_benchmark_smoke(capsys):
    from lengthgen_utils.tools import bench

    assert bench.main(["--sizes", "1", "2", "--steps", "2", "--reps", "1", "--seq-models", "1", "--sweep", "none",
                       "--no-thread-comparison", "--device", "cpu", "--tf-sizes", "1", "2", "--tf-threads", "1",
                       "--tf-steps", "2", "--tf-reps", "1", "--no-compile", "--head-sizes", "2", "6",
                       "--head-reps", "1"]) == 0
    out = capsys.readouterr().out
    assert "model-steps/s" in out and "MFLOP" in out and "ratio" in out
    # section 1b: the single head by heads per ensemble, beside one head at a time and the plain loop
    assert "1b. the single head by heads per ensemble" in out and "plain PyTorch loop" in out
    section = out.split("1b. the single head", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.split()[:2] == ["6", "*"] for line in section].count(True) == 1, section  # the mixed ensemble
    assert any("aims at 120 heads" in line for line in section) is False  # no 20 or 120 here: no aim line
    # section 5: the package's transformer and its peers, side by side, training the same models
    rows = [line.split()[0] for line in out.splitlines() if line.strip().startswith(("package", "plain", "vmap"))]
    assert rows[:3] == ["package", "plain", "vmap"], rows
    agreement = next(line for line in out.splitlines() if "trains the same models" in line)
    assert float(agreement.rsplit("=", 1)[1]) < 1e-4, agreement
    assert "torch.compile: skipped" in out and "M=2: package" in out
    # section 1c: the malloc setting, each timing in its own process, at the largest head size
    assert "1c. 6 heads, malloc as the system sets it and as the package sets it" in out


# ---------------------------------------------------------------- glibc's malloc keeps freed memory
def test_keep_freed_memory_and_its_variable(monkeypatch):
    from lengthgen_utils.run import training

    monkeypatch.setenv("LENGTHGEN_MALLOC", "fast")
    with pytest.raises(ValueError, match="LENGTHGEN_MALLOC.*'keep' or 'system'.*'fast'"):
        training.keep_freed_memory()
    with pytest.raises(ValueError, match="LENGTHGEN_MALLOC"):  # refused where the package first computes
        train(RetrievalHead(), FixedOffsetRetrieval(16, 3), steps=1)
    monkeypatch.setenv("LENGTHGEN_MALLOC", "system")
    assert training.keep_freed_memory() is False
    monkeypatch.setenv("LENGTHGEN_MALLOC", " keep ")
    glibc = os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc") if hasattr(os, "confstr") else False
    assert training.keep_freed_memory() is glibc


_MALLOC_RUN = textwrap.dedent("""
    import hashlib, json, resource, torch
    from lengthgen_utils.core.models import RetrievalHead
    from lengthgen_utils.core.tasks import FixedOffsetRetrieval
    from lengthgen_utils.run.evaluation import accuracy_by_length
    from lengthgen_utils.run.training import train
    task = FixedOffsetRetrieval(16, 3)
    train(RetrievalHead(n_models=120, seeds=range(120)), task, steps=3)  # imports and the first allocations
    model = RetrievalHead(n_models=120, seeds=range(120))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    losses = train(model, task, steps=60)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    digest = hashlib.sha256(losses.numpy().tobytes())
    for value in model.state_dict().values():
        digest.update(value.numpy().tobytes())
    digest.update(accuracy_by_length(model, task, [16, 64], n_samples=64).numpy().tobytes())
    print(json.dumps({"digest": digest.hexdigest(), "faults_per_step": faults / 60}))
""")


def test_the_malloc_setting_changes_where_memory_comes_from_never_a_number():
    """The same training and evaluation in a process with glibc's own malloc settings and in one with the package's:
    every loss, weight and accuracy is equal bit for bit, and (on glibc) the package's process takes its memory
    from the system far less often per step (about 6 page faults against about 800 at 120 heads)."""
    out = {}
    for choice in ("system", "keep"):
        env = {**os.environ, "LENGTHGEN_MALLOC": choice, "PYTHONPATH": str(REPO)}
        done = subprocess.run([sys.executable, "-c", _MALLOC_RUN], capture_output=True, text=True, env=env,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        out[choice] = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["system"]["digest"] == out["keep"]["digest"]
    if hasattr(os, "confstr") and os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
        assert out["keep"]["faults_per_step"] < out["system"]["faults_per_step"] / 4, out


def test_benchmark_plain_head_is_the_package_head():
    """Section 1b's plain PyTorch head, built from a package head's row, computes that row's logits: the loop
    it is timed in trains the same function."""
    from lengthgen_utils.tools import bench

    model = RetrievalHead(n_models=3, seeds=[0, 1, 2])
    tokens, _ = bench.TASK.sample(8, 13, torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, _ = model(tokens)
        for i in range(3):
            torch.testing.assert_close(bench.PlainHead(model, i)(tokens), logits[i], rtol=1e-5, atol=1e-5)


def test_benchmark_peers_are_the_package_model():
    """The benchmark's plain model and its one-model readable Transformer, given the package model's weights,
    compute the same logits (the peers train the same function, so their speed is comparable)."""
    from lengthgen_utils.core.fast import FastTransformer
    from lengthgen_utils.tools import bench

    model = FastTransformer(16, 2, 4, 64, "rope", max_len=32, n_models=2)
    tokens, _ = bench.tf_batches(1)[0]
    with torch.no_grad():
        for i in range(2):
            torch.testing.assert_close(bench.plain_copy(model, i)(tokens), model(tokens)[i], rtol=1e-5, atol=1e-5)
            readable = bench.readable_copy(model, i)
            assert type(readable) is Transformer and readable.n_models == 1
            torch.testing.assert_close(readable(tokens)[0], model(tokens)[i], rtol=1e-5, atol=1e-5)


def test_cli_runs_the_transformer_suite(monkeypatch, tmp_path, capsys):
    """The transformer suite (chapter 7's delayed copy, RoPE/APE/NoPE) runs and prints its table."""
    from dataclasses import replace

    tiny = dict(d_model=16, n_heads=2, batch_size=4, steps=2, lr=1e-3, n_seeds=1, eval_samples=2)
    monkeypatch.setitem(PROFILES, "quick", replace(PROFILES["quick"], transformer=tuple(tiny.items())))
    monkeypatch.setenv("LENGTHGEN_CACHE", str(tmp_path))
    assert main(["run", "--profile", "quick", "--suite", "transformer", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[0] for line in out.splitlines() if line.startswith(("rope ", "ape ", "nope "))]
    assert rows == ["rope", "ape", "nope"] and "t >= 32 @256" in out and "wall time" in out


def test_buildtime_runs_the_toc_in_order_and_gives_kernels_this_checkout_and_a_fresh_cache(tmp_path, monkeypatch):
    """The per-chapter timing script runs _toc.yml's notebooks in the order the build executes them (the
    chapters before the scoreboard that reads their records), and the kernels it starts
    import this checkout's package with the cache and claims folders it chose (a notebook that checks them
    fails otherwise)."""
    import nbformat

    from lengthgen_utils.tools import buildtime

    paths = [p.relative_to(REPO).as_posix() for p in buildtime.toc_notebooks()]
    assert paths and paths == sorted(paths) and paths[0].startswith("chapters/00_")
    assert paths.index("scoreboard.ipynb") > max(i for i, p in enumerate(paths) if p.startswith("chapters/"))
    env = buildtime.kernel_environment(tmp_path / "cache", tmp_path / "claims", "quick")
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(f"""
        import os, lengthgen_utils
        from lengthgen_utils.run.cache import cache_dir
        assert lengthgen_utils.__file__.startswith({str(REPO)!r}), lengthgen_utils.__file__
        assert str(cache_dir()) == {str(tmp_path / "cache")!r} and os.environ["LENGTHGEN_PROFILE"] == "quick"
        """)), nbformat.v4.new_code_cell("assert False, 'a failing check'")]
    path = tmp_path / "probe.ipynb"
    nbformat.write(nb, path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    seconds, error, cpu = buildtime.execute(path, timeout=120)
    assert seconds > 0 and cpu > 0 and error is not None and "a failing check" in error  # the first cell passed
