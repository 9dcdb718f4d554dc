"""Degenerate sizes: the smallest sizes allowed work, one below is refused by name.
"""
import warnings

import pytest
import torch

from lengthgen_utils.analysis import kernel, probes, theory
from lengthgen_utils.core import models, rope
from lengthgen_utils.core.models import (
    KernelHead,
    LinearRNN,
    RetrievalHead,
    Transformer,
)
from lengthgen_utils.core.tasks import FixedOffsetRetrieval
from lengthgen_utils.run import evaluation, training
from lengthgen_utils.tools import cli as cli

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


