"""Devices: validated once, up front; a failed call leaves the caller's model as it was.
"""
import dataclasses

import pytest
import torch

from lengthgen_utils.core import attention
from lengthgen_utils.core.models import KernelHead, RetrievalHead, Transformer
from lengthgen_utils.core.tasks import DelayedCopy, FixedOffsetRetrieval
from lengthgen_utils.run import cache, configs, runners, training
from lengthgen_utils.tools import cli as cli


@dataclasses.dataclass(frozen=True)
class Toy:
    """A configuration for the cache tests."""

    size: int = 3


def _compute(size=3):
    return lambda: {"x": torch.arange(size, dtype=torch.float32)}


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


