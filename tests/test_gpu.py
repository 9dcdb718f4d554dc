"""The GPU path: every model trains on a CUDA device to the same result as on the CPU.

Skipped unless the device under test exists. The device is ``cuda`` unless
``$LENGTHGEN_GPU_TEST_DEVICE`` names another one (``cpu`` runs the same code
against itself: a dry run of this file on a machine without a GPU, which
checks the tests, not the GPU). ``.ci/gpu-check`` runs this file on a GPU
machine, with the benchmark and the ``full`` profile.

What may differ between devices: float32 reductions run in another order on a
GPU, so weights and losses are compared with a relative tolerance, and
accuracies (means over thousands of sequences) to within a few sequences.
What may not: the data (sampled on the CPU from the same generators), the
initialisation (drawn on the CPU), the RoPE angles (float64, then cast), and
the results cache, whose key holds the device type.
"""
import os

import pytest
import torch

from lengthgen_utils.run.optim import OptimizerSettings
from lengthgen_utils.run import cache as lg_cache
from lengthgen_utils.run import configs, runners
from lengthgen_utils.run.cache import cache_description
from lengthgen_utils.run.evaluation import accuracy_by_length, token_accuracy_by_position
from lengthgen_utils.core.fast import FastTransformer
from lengthgen_utils.core.models import KernelHead, LinearRNN, RetrievalHead, Transformer
from lengthgen_utils.core.rope import apply_rope
from lengthgen_utils.core.tasks import DelayedCopy, FixedOffsetRetrieval
from lengthgen_utils.run.training import train, train_sequence, train_squared_loss

DEVICE = os.environ.get("LENGTHGEN_GPU_TEST_DEVICE", "cuda")


def _available(device: str) -> bool:
    kind = torch.device(device).type
    return kind == "cpu" or (kind == "cuda" and torch.cuda.is_available())


pytestmark = pytest.mark.skipif(not _available(DEVICE), reason=f"no {DEVICE} device on this machine")
TASK = FixedOffsetRetrieval(16, 3)


def _close(a, b, rtol=2e-3, atol=2e-4):
    torch.testing.assert_close(a.detach().float().cpu(), b.detach().float().cpu(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("pe, attention", [("rope", "softmax"), ("ape", "softmax"), ("rope", "linear")])
def test_single_head_ensemble_trains_alike_on_both_devices(pe, attention):
    """Same initialisation and data; compared by what the models compute (Adam can turn rounding-level
    differences in a near-zero gradient into visible differences in that one weight)."""
    probe, _ = TASK.sample(256, 40, torch.Generator().manual_seed(7))
    runs = {}
    for device in ("cpu", DEVICE):
        model = RetrievalHead(pe=pe, attention=attention, n_models=4, max_len=64)
        assert model.device.type == "cpu"  # initialised on the CPU whatever the training device
        history = train(model, TASK, steps=60, batch_size=64, device=device, progress=False)
        assert model.device.type == torch.device(device).type
        acc = accuracy_by_length(model, TASK, [16, 64], n_samples=512)
        with torch.no_grad():
            logits = model(probe.to(device))[0]
        runs[device] = (history, acc, logits)
    (h_cpu, a_cpu, l_cpu), (h_dev, a_dev, l_dev) = runs["cpu"], runs[DEVICE]
    _close(h_dev, h_cpu, rtol=5e-3, atol=5e-4)
    _close(l_dev, l_cpu, rtol=1e-2, atol=1e-2)
    assert (a_dev - a_cpu).abs().max() <= 4 / 512, (a_dev, a_cpu)


def test_kernel_head_per_model_streams_train_alike_on_both_devices():
    cs = {}
    for device in ("cpu", DEVICE):
        model = KernelHead(n_models=3)
        train_squared_loss(model, TASK, OptimizerSettings("sgd", lr=0.01), steps=50, batch_size=32, seed=[0, 1, 2],
                           device=device)
        cs[device] = model.c
    _close(cs[DEVICE], cs["cpu"], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("cls", [FastTransformer, Transformer], ids=["fast", "readable"])
@pytest.mark.parametrize("pe", ["rope", "ape"])
def test_transformer_trains_alike_on_both_devices(pe, cls):
    task = DelayedCopy(8, 3)
    runs = {}
    for device in ("cpu", DEVICE):
        model = cls(8, 2, 2, 32, pe, max_len=64, n_models=2)
        history = train_sequence(model, task, OptimizerSettings("adamw", lr=3e-3, weight_decay=0.05), steps=30, batch_size=16, train_len=16, device=device,
                                 progress=False)
        acc, _ = token_accuracy_by_position(model, task, 32, n_samples=64)
        runs[device] = (history, acc)
    _close(runs[DEVICE][0], runs["cpu"][0], rtol=5e-3, atol=5e-4)
    scored = ~torch.isnan(runs["cpu"][1])
    assert (runs[DEVICE][1][scored] - runs["cpu"][1][scored]).abs().mean() <= 0.02


def test_rope_angles_keep_their_precision_on_the_device():
    """Far positions (up to 1e5) rotate the same on both devices: angles are float64 before the cast."""
    x = torch.randn(1, 5, 16, generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([0, 7, 1000, 54321, 99999])
    on_cpu = apply_rope(x, positions)
    on_dev = apply_rope(x.to(DEVICE), positions.to(DEVICE))
    assert on_dev.device.type == torch.device(DEVICE).type
    _close(on_dev, on_cpu, rtol=1e-5, atol=1e-5)


def test_run_retrieval_on_the_device_is_cached_apart_from_the_cpu(tmp_path):
    exp = configs.RetrievalExperiment(n_seeds=2, steps=20, batch_size=32, eval_samples=64, length_multiples=(1, 2))
    on_dev = runners.run_retrieval(exp, device=DEVICE, cache=tmp_path)
    assert on_dev.model.device.type == torch.device(DEVICE).type
    assert on_dev.accuracy.device.type == "cpu" and on_dev.accuracy.dtype == torch.float64
    again = runners.run_retrieval(exp, device=DEVICE, cache=tmp_path)
    assert again.extra["cache"] == "hit" and torch.equal(again.accuracy, on_dev.accuracy)
    key_dev = lg_cache.make_key(cache_description(exp, DEVICE))
    key_cpu = lg_cache.make_key(cache_description(exp, "cpu"))
    assert (key_dev != key_cpu) == (torch.device(DEVICE).type != "cpu")


def test_linear_rnn_trains_alike_on_both_devices():
    probe, _ = TASK.sample(128, 40, torch.Generator().manual_seed(7))
    runs = {}
    for device in ("cpu", DEVICE):
        model = LinearRNN(16, d_state=16, n_models=3)
        history = train(model, TASK, steps=40, batch_size=64, device=device, progress=False)
        with torch.no_grad():
            runs[device] = (history, model(probe.to(device))[0])
    _close(runs["cpu"][0], runs[DEVICE][0])
    _close(runs["cpu"][1], runs[DEVICE][1], rtol=1e-2, atol=1e-3)
