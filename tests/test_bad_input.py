"""Bad input everywhere: every public entry point refuses it with a message naming the argument.
"""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lengthgen_utils.analysis import theory
from lengthgen_utils.core import encodings, models, tasks
from lengthgen_utils.core.encodings import LearnedAPE, RoPE
from lengthgen_utils.core.models import RetrievalHead, Transformer
from lengthgen_utils.core.rope import (
    apply_rope,
    kernel_frequencies,
    rope_inverse_frequencies,
)
from lengthgen_utils.core.tasks import DelayedCopy, FixedOffsetRetrieval
from lengthgen_utils.run import configs, evaluation, training
from lengthgen_utils.run.optim import OptimizerSettings


# ---------------------------------------------------------------- case 12: bad input everywhere
def _head():
    return RetrievalHead(8, 8, 8, "rope", n_models=1)


def _transformer():
    return Transformer(8, 1, 2, 8, "rope", n_models=1)


TASK = FixedOffsetRetrieval(8, 2)
# (name, callable, valid keyword arguments, kind of each argument we corrupt): "size" = int >= 1 (or >= 2),
# "offset" = an offset or length that must fit, "real" = a positive finite float.
API = [
    ("FixedOffsetRetrieval", FixedOffsetRetrieval, dict(vocab_size=8, offset=2), dict(vocab_size="size", offset="size")),
    ("FixedOffsetRetrieval.sample", TASK.sample, dict(batch_size=2, seq_len=6),
     dict(batch_size="size", seq_len="size")),
    ("FixedOffsetRetrieval.sample_space_size", TASK.sample_space_size, dict(seq_len=6), dict(seq_len="size")),
    ("DelayedCopy", DelayedCopy, dict(vocab_size=8, offset=2), dict(vocab_size="size", offset="size")),
    ("DelayedCopy.sample", DelayedCopy(8, 2).sample, dict(batch_size=2, seq_len=6),
     dict(batch_size="size", seq_len="size")),
    ("LaggedSum", tasks.LaggedSum, dict(vocab_size=8, offset=2, offset2=3),
     dict(vocab_size="size", offset="size", offset2="size")),
    ("Copy.sample", tasks.Copy(8).sample, dict(batch_size=2, seq_len=7), dict(batch_size="size", seq_len="size")),
    ("RunningParity.sample", tasks.RunningParity().sample, dict(batch_size=2, seq_len=7),
     dict(batch_size="size", seq_len="size")),
    ("rope_inverse_frequencies", rope_inverse_frequencies, dict(d_head=8, base=1e4), dict(d_head="size", base="real")),
    ("LearnedAPE", LearnedAPE, dict(init_std=0.02), dict(init_std="real_or_zero")),
    ("RoPE", RoPE, dict(base=1e4, interleaved=False), dict(base="real")),
    ("RetrievalHead", RetrievalHead, dict(vocab_size=8, d_model=8, d_head=8, pe="rope", max_len=16, n_models=1),
     dict(vocab_size="size", d_model="size", d_head="size", max_len="size", n_models="size", pe="name")),
    ("RetrievalHead.scores", lambda **kw: _head().scores(**kw), dict(seq_len=4), dict(seq_len="size")),
    ("KernelHead", models.KernelHead, dict(vocab_size=8, d_head=8, rope_base=1e4, n_models=1),
     dict(vocab_size="size", d_head="size", rope_base="real", n_models="size")),
    ("Transformer", Transformer, dict(vocab_size=8, n_layers=1, n_heads=2, d_model=8, pe="rope", max_len=16,
                                      n_models=1, mlp_ratio=2),
     dict(vocab_size="size", n_layers="size", n_heads="size", d_model="size", max_len="size", n_models="size",
          mlp_ratio="size", pe="name")),
    ("train", lambda **kw: training.train(_head(), TASK, device="cpu", **kw),
     dict(steps=1, batch_size=2, train_len=6, seed=0),
     dict(steps="size", batch_size="size", train_len="size", seed="seed")),
    ("train_squared_loss", lambda **kw: training.train_squared_loss(models.KernelHead(8, 8), TASK, device="cpu", **kw),
     dict(steps=1, batch_size=2, train_len=6, seed=0),
     dict(steps="size", batch_size="size", train_len="size", seed="seed_per_model")),
    ("train_sequence", lambda **kw: training.train_sequence(_transformer(), DelayedCopy(8, 2), device="cpu", **kw),
     dict(steps=1, batch_size=2, train_len=6, seed=0),
     dict(steps="size", batch_size="size", train_len="size", seed="seed")),
    ("OptimizerSettings", OptimizerSettings, dict(name="sgd", lr=0.01, weight_decay=0.0, momentum=0.0),
     dict(lr="real", weight_decay="real_or_zero", momentum="real_or_zero")),
    ("accuracy_by_length", lambda **kw: evaluation.accuracy_by_length(_head(), TASK, **kw),
     dict(lengths=[6], n_samples=4, seed=0, batch_size=4),
     dict(lengths="lengths", n_samples="size", seed="seed", batch_size="size")),
    ("target_attention_mass", lambda **kw: evaluation.target_attention_mass(_head(), **kw),
     dict(offset=2, lengths=[6]), dict(offset="scalar", lengths="lengths")),
    ("accuracy_by_length(logit_scale)", lambda **kw: evaluation.accuracy_by_length(_head(), TASK, **kw),
     dict(lengths=[6], logit_scale=[1.0], n_samples=4, seed=0),
     dict(lengths="lengths", n_samples="size", seed="seed", logit_scale="scales")),
    ("squared_error_by_length", lambda **kw: evaluation.squared_error_by_length(models.KernelHead(8, 8), TASK, **kw),
     dict(lengths=[6], n_samples=4, seed=0), dict(lengths="lengths", n_samples="size", seed="seed")),
    ("token_accuracy_by_position", lambda **kw: evaluation.token_accuracy_by_position(_transformer(), DelayedCopy(8, 2),
                                                                                       **kw),
     dict(seq_len=6, n_samples=2, seed=0, batch_size=2),
     dict(seq_len="size", n_samples="size", seed="seed", batch_size="size")),
    ("split_accuracy", lambda **kw: evaluation.split_accuracy(torch.ones(1, 4), torch.ones(4), **kw),
     dict(train_len=2), dict(train_len="size")),
    ("RetrievalExperiment", configs.RetrievalExperiment,
     dict(vocab_size=8, offset=2, train_len=8, d_model=8, d_head=8, n_seeds=1, steps=1, batch_size=2,
          eval_samples=2, length_multiples=(1, 2), lr=0.01),
     dict(vocab_size="size", offset="size", train_len="size", d_model="size", d_head="size", n_seeds="size",
          steps="size", batch_size="size", eval_samples="size", length_multiples="lengths", lr="real", pe="name")),
    ("RetrievalSweep", configs.RetrievalSweep,
     dict(offsets=(1, 2), vocab_size=8, train_len=8, d_model=8, d_head=8, n_seeds=1, steps=1, batch_size=2,
          eval_samples=2, lr=0.01),
     dict(offsets="lengths", vocab_size="size", train_len="size", d_model="size", d_head="size", n_seeds="size",
          steps="size", batch_size="size", eval_samples="size", lr="real")),
    ("TransformerExperiment", configs.TransformerExperiment,
     dict(task=DelayedCopy(8, 2), train_len=8, eval_lengths=(8, 16), n_layers=1, n_heads=2, d_model=8,
          batch_size=2, steps=1, n_seeds=1, eval_samples=2, lr=0.01),
     dict(task="object", train_len="size", eval_lengths="lengths", n_layers="size",
          n_heads="size", d_model="size", batch_size="size", steps="size", n_seeds="size", eval_samples="size",
          lr="real", pe="name")),
    ("log_length_scale", theory.log_length_scale, dict(lengths=[8, 16], train_len=8),
     dict(lengths="lengths", train_len="size")),
    ("trained_relative_positions", theory.trained_relative_positions, dict(train_len=8, offset=2),
     dict(train_len="size", offset="size")),
    ("min_norm_interpolant", theory.min_norm_interpolant, dict(trained=[-2], offset=2, d_head=8),
     dict(offset="size", d_head="size")),
    ("kernel_frequencies", kernel_frequencies, dict(d_head=8, base=1e4), dict(d_head="size", base="real")),
]

NOT_INT = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3), st.none(),
                    st.just(True), st.just([1]))
NOT_REAL = st.one_of(st.text(max_size=3), st.none(), st.just([1.0]))
BAD = {
    "size": st.one_of(st.integers(max_value=0), NOT_INT),
    "scalar": st.one_of(st.integers(max_value=0), st.floats(allow_nan=True), st.text(max_size=3), st.none(),
                        st.just(True)),  # an int, or one per model: a list [k] is valid for a 1-model ensemble
    "seed": st.one_of(st.integers(max_value=-1), NOT_INT),
    # one seed per model: a list of one int is valid for a one-model ensemble, so it is not drawn as bad input
    "seed_per_model": st.one_of(st.integers(max_value=-1), st.floats(allow_nan=True, allow_infinity=True),
                                st.text(max_size=3), st.none(), st.just(True), st.just([-1]), st.just([1, 2])),
    "real": st.one_of(st.floats(max_value=0.0), st.just(float("nan")), st.just(float("inf")), NOT_REAL),
    "real_or_zero": st.one_of(st.floats(max_value=-1e-9), st.just(float("nan")), st.just(float("inf")), NOT_REAL),
    "lengths": st.one_of(st.just([]), st.just("16"), st.none(), st.lists(st.integers(max_value=0), min_size=1,
                                                                         max_size=3),
                         st.lists(st.floats(allow_nan=True), min_size=1, max_size=2)),
    "scales": st.one_of(st.just(["x"]), st.just([float("nan")]), st.just([-1.0]), st.just([])),  # None is the default (no scale)
    "name": st.one_of(st.text(max_size=4).filter(lambda s: s not in encodings.ENCODINGS), st.none(), st.just(3)),
    "object": st.one_of(st.text(max_size=3), st.none(), st.just(3)),
}


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_public_api_rejects_bad_input_naming_the_argument(data):
    """Case 12: every public entry point rejects wrong types, zero/negative sizes, bad offsets, NaN rates, with a
    ValueError/TypeError that names the argument (no IndexError, no NaN or partial result)."""
    name, fn, valid, kinds = data.draw(st.sampled_from(API), label="function")
    arg = data.draw(st.sampled_from(sorted(kinds)), label="argument")
    bad = data.draw(BAD[kinds[arg]], label="value")
    with pytest.raises((TypeError, ValueError)) as info:
        fn(**{**valid, arg: bad})
    assert arg in str(info.value), f"{name}({arg}={bad!r}) raised {info.type.__name__}: {info.value}"


@pytest.mark.parametrize("name, fn, valid, kinds", API, ids=[a[0] for a in API])
def test_public_api_accepts_its_valid_example(name, fn, valid, kinds):
    """Case 12: the walker's valid arguments are valid (so each rejection above is due to the bad value alone)."""
    out = fn(**valid)
    for t in (out if isinstance(out, tuple) else (out,)):
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
            # NaN is documented only where a position is never scored (token_accuracy_by_position, positions < offset)
            allowed = name in ("split_accuracy", "token_accuracy_by_position")
            assert allowed or not torch.isnan(t).any(), name


@pytest.mark.parametrize("call, arg", [
    (lambda: FixedOffsetRetrieval(8, 7).sample(2, 8), "offset"),  # offset > seq_len - 2
    (lambda: DelayedCopy(8, 8).sample(2, 8), "seq_len"),  # no scored position
    (lambda: evaluation.target_attention_mass(_head(), 5, [6]), "offset"),
    (lambda: evaluation.accuracy_by_length(_head(), FixedOffsetRetrieval(8, 5), [6], n_samples=2), "offset"),
    (lambda: training.train(_head(), FixedOffsetRetrieval(8, 5), steps=1, train_len=6, device="cpu"), "train_len"),
    (lambda: training.train_sequence(_transformer(), DelayedCopy(8, 6), steps=1, train_len=6, device="cpu"),
     "train_len"),
    (lambda: theory.trained_relative_positions(6, 5), "train_len"),
    (lambda: configs.RetrievalExperiment(offset=15, train_len=16), "train_len"),
    (lambda: _head().select(1), "index"),
    (lambda: apply_rope(torch.ones(4, 8), torch.arange(5)), "positions"),
    (lambda: apply_rope(torch.ones(4, 8), torch.arange(4.0)), "positions"),
    (lambda: apply_rope(torch.ones(4, 7), torch.arange(4)), "d_head"),
])
def test_out_of_range_offsets_and_shapes_are_rejected_by_name(call, arg):
    """Case 12: offsets that do not fit the length, and mismatched shapes, raise errors naming the argument."""
    with pytest.raises((TypeError, ValueError), match=arg):
        call()
