"""Reliability II: five kinds of failure, each fixed everywhere in the package and pinned here.

1. low-precision numerics in every attention path (float16, bfloat16);
2. configuration values of the wrong container type (a list where a tuple is stored);
3. per-model arguments whose length does not match the ensemble;
4. slider figures that must show each panel exactly as its stand-alone figure;
5. interactive panels that fail loudly and keep their controls valid.

Each kind has one test per reported example, with the right value, and a sweep over the package.
"""
import base64
import copy
import dataclasses
import importlib
import inspect
import json
import pkgutil
import re
import warnings
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest
import torch

import lengthgen_utils
from lengthgen_utils.core import attention, encodings, models, rope, tasks
from lengthgen_utils.run import cache, configs, evaluation, profiles, runners, training
from lengthgen_utils.analysis import implicit_bias, kernel, probes, theory
from lengthgen_utils.book import ch03, ch04, ch05, figures, sliders
from lengthgen_utils.core.fast import FastTransformer
from lengthgen_utils.core.models import ContentRetrievalHead, KernelHead, RetrievalHead, Transformer
from lengthgen_utils.core.encodings import LearnedAPE
from lengthgen_utils.book import widgets as widgets_module
from lengthgen_utils.core.tasks import DelayedCopy, FixedOffsetRetrieval
from lengthgen_utils.book.widgets import RetrievalExplorer


def _public_callables():
    """Every public function, class and public method defined in the package: ``(qualified name, callable)``."""
    for info in pkgutil.walk_packages(lengthgen_utils.__path__, prefix="lengthgen_utils."):
        short = info.name.rsplit(".", 1)[-1]  # "lengthgen_utils.run.cache" -> "cache": module names are unique
        if short.startswith("_") or info.ispkg:
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            yield f"{short}.{name}", obj
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if not attr.startswith("_") and inspect.isfunction(member):
                        yield f"{short}.{name}.{attr}", member


# ================================================================ 1. low precision in every attention path
LOW_PRECISION = (torch.float16, torch.bfloat16)
ULPS = 4  # tolerance: 4 units of the dtype's epsilon, relative to the output's scale
TOL = {dtype: ULPS * torch.finfo(dtype).eps for dtype in LOW_PRECISION}


def test_causal_attention_in_float16_is_uniform_where_the_raw_product_overflows():
    """The reported example: q = k = 40 (d_head 64) in float16. The raw product 40*40*64 = 102400 overflows
    float16 before the 1/sqrt(d) scale; every scaled logit is equal, so every causal row is uniform (the last
    one [0.25, 0.25, 0.25, 0.25]), and the fused path agrees."""
    q = torch.full((1, 4, 64), 40.0, dtype=torch.float16)
    v = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(0)).half()
    out, weights = attention.causal_attention(q, q, v, return_weights=True)
    assert weights.dtype == torch.float16 and torch.isfinite(weights).all()
    expected = torch.tril(torch.ones(4, 4)) / torch.arange(1, 5)[:, None]
    torch.testing.assert_close(weights[0], expected.half(), rtol=0, atol=0)  # 1/3 rounded to float16
    assert weights[0, -1].tolist() == [0.25, 0.25, 0.25, 0.25]
    fused = attention.causal_attention(q, q, v)
    assert torch.isfinite(fused).all() and torch.isfinite(out).all()
    mean_of_prefix = v.float().cumsum(1) / torch.arange(1, 5)[None, :, None]
    torch.testing.assert_close(fused.float(), mean_of_prefix, rtol=0, atol=TOL[torch.float16] * 4)
    torch.testing.assert_close(out.float(), mean_of_prefix, rtol=0, atol=TOL[torch.float16] * 4)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _qkv(seq_len=12, d=16, scale=1.0, seed=1):
    g = _gen(seed)
    return tuple(scale * torch.randn(2, 3, seq_len, d, generator=g) for _ in range(3))


def _model(kind, pe="rope", attention_kind="softmax"):
    torch.manual_seed(0)
    if kind == "head":
        return RetrievalHead(pe=pe, attention=attention_kind, n_models=2, max_len=512, seeds=[3, 4])
    if kind == "kernel":
        return KernelHead(n_models=2, seeds=[3, 4], init_std=1.0)
    if kind == "fast":
        return FastTransformer(16, 2, 2, 32, pe, max_len=256, n_models=2, seeds=[3, 4])
    return Transformer(16, 2, 2, 32, pe, max_len=256, n_models=2, seeds=[3, 4])


TOKENS = torch.randint(0, 16, (4, 40), generator=_gen(5))
KERNEL_ROWS = 3.0 * torch.randn(2, 64, generator=_gen(6))
CAUSAL = attention.causal_mask(12)
BIAS = torch.randn(3, 12, 12, generator=_gen(7))


# (name, inputs() -> tuple of float32 tensors / models, function of those inputs). Each case is run with its
# inputs cast to float16 and bfloat16, and compared with the same function on those rounded inputs in float32.
LOW_PRECISION_CASES = [
    ("attention.attention_scores", lambda: _qkv()[:2], attention.attention_scores),
    ("attention.attention_scores (logits near float16's range)", lambda: _qkv(d=64, scale=20.0)[:2],
     attention.attention_scores),
    ("attention.row_weights softmax", lambda: (5 * KERNEL_ROWS,), lambda s: attention.row_weights(s, "softmax")),
    ("attention.row_weights linear", lambda: (KERNEL_ROWS,), lambda s: attention.row_weights(s, "linear")),
    ("attention.additive_mask", lambda: (torch.zeros(1),),
     lambda x: attention.additive_mask(CAUSAL, 12, 12, x.dtype)),
    ("attention.masked_attention (bool mask)", _qkv,
     lambda q, k, v: attention.masked_attention(q, k, v, CAUSAL, return_weights=True)),
    ("attention.masked_attention (additive mask, bias)", lambda: _qkv() + (BIAS,),
     lambda q, k, v, b: attention.masked_attention(q, k, v, attention.additive_mask(CAUSAL, 12, 12, q.dtype),
                                                   return_weights=True, bias=b)),
    ("attention.causal_attention fused", _qkv, attention.causal_attention),
    ("attention.causal_attention fused (bias)", lambda: _qkv() + (BIAS,),
     lambda q, k, v, b: attention.causal_attention(q, k, v, bias=b)),
    ("attention.causal_attention weights", lambda: _qkv(d=64, scale=20.0),
     lambda q, k, v: attention.causal_attention(q, k, v, return_weights=True)),
    ("attention.linear_attention elu+1", _qkv, attention.linear_attention),
    ("attention.linear_attention elu+1 (far negative q, k)", lambda: (-30 + _qkv()[0], -30 + _qkv()[1], _qkv()[2]),
     attention.linear_attention),
    ("attention.linear_attention identity, unnormalised", _qkv,
     lambda q, k, v: attention.linear_attention(q, k, v, normalize=False, feature_map="identity")),
    ("attention.linear_attention elu+1, unnormalised", _qkv,
     lambda q, k, v: attention.linear_attention(q, k, v, normalize=False)),
    ("attention.linear_attention identity, unnormalised (beyond float16's range)",
     lambda: _qkv(seq_len=300, d=64, scale=6.0),
     lambda q, k, v: attention.linear_attention(q, k, v, normalize=False, feature_map="identity")),
    ("rope.rope_kernel_coefficients", lambda: tuple(300 * t for t in _qkv()[:2]),
     rope.rope_kernel_coefficients),
    ("kernel.participation_ratio", lambda: (300 * KERNEL_ROWS.abs(),), kernel.participation_ratio),
    ("kernel.peak_distance", lambda: (KERNEL_ROWS,), kernel.peak_distance),
    ("theory.exact_target_mass", lambda: (KERNEL_ROWS,), lambda s: theory.exact_target_mass(s, [3, 1], [8, 64])),
    ("theory.mean_field_parameters", lambda: (KERNEL_ROWS,), lambda s: theory.mean_field_parameters(s, 3, 16)),
    ("theory.distractor_ratio", lambda: (KERNEL_ROWS,), lambda s: theory.distractor_ratio(s, 3)),
    ("theory.critical_target_mass", lambda: (torch.eye(8)[None] * 5 + KERNEL_ROWS[:1, :8, None] * 0.1,),
     theory.critical_target_mass),
    ("theory.gradient_descent_kernel", lambda: (torch.eye(4) * 2 + 0.1, torch.ones(4)),
     lambda h, b: theory.gradient_descent_kernel(h, b, 0.1, 50)),
    ("theory.expected_squared_error", lambda: (300 * KERNEL_ROWS,), lambda s: theory.expected_squared_error(s, 3, 16)),
    ("theory.cosine_similarity", lambda: (KERNEL_ROWS, KERNEL_ROWS.flip(-1)), theory.cosine_similarity),
    ("theory.linear_noise_ratio", lambda: (KERNEL_ROWS,), lambda s: theory.linear_noise_ratio(s, 3)),
    ("models.KernelHead.kernel", lambda: (_model("kernel"),), lambda m: m.kernel(torch.arange(-300, 1))),
    ("models.KernelHead.scores", lambda: (_model("kernel"),), lambda m: m.scores(40)),
    ("models.KernelHead.forward", lambda: (_model("kernel"),), lambda m: m(TOKENS)),
    ("models.Transformer.forward (rope, weights)", lambda: (_model("transformer"),),
     lambda m: m(TOKENS, return_attention=True)),
    ("models.Transformer.head_scores (rope)", lambda: (_model("transformer"),), lambda m: m.head_scores(TOKENS)),
    ("fast.FastTransformer.forward (rope, weights)", lambda: (_model("fast"),),
     lambda m: m(TOKENS, return_attention=True)),
    ("fast.FastTransformer.head_scores (rope)", lambda: (_model("fast"),), lambda m: m.head_scores(TOKENS)),
    ("probes.head_offset_profiles", lambda: (_model("transformer"),),
     lambda m: probes.head_offset_profiles(m, DelayedCopy(16, 2), 24, n_samples=4)),
]
for _pe in ("ape", "nope", "alibi"):
    for _kind, _name in (("transformer", "models.Transformer"), ("fast", "fast.FastTransformer")):
        LOW_PRECISION_CASES.append((f"{_name}.forward ({_pe}, weights)",
                                    lambda pe=_pe, kind=_kind: (_model(kind, pe),),
                                    lambda m: m(TOKENS, return_attention=True)))
for _pe in ("rope", "ape", "nope", "alibi"):
    for _att in ("softmax", "linear"):
        LOW_PRECISION_CASES += [
            (f"models.RetrievalHead.scores ({_pe}, {_att})", lambda pe=_pe, a=_att: (_model("head", pe, a),),
             lambda m: m.scores(300)),
            (f"models.RetrievalHead.attention_row ({_pe}, {_att})", lambda pe=_pe, a=_att: (_model("head", pe, a),),
             lambda m: m.attention_row(300, logit_scale=2.0)),
            (f"models.RetrievalHead.forward ({_pe}, {_att})", lambda pe=_pe, a=_att: (_model("head", pe, a),),
             lambda m: m(TOKENS)),
        ]
for _name, _fn in [("kernel.unrotated_query_key", kernel.unrotated_query_key),
                   ("kernel.carrier_spectrum", lambda m: dataclasses.astuple(kernel.carrier_spectrum(m))),
                   ("kernel.factorized_kernel", kernel.factorized_kernel),
                   ("kernel.components", lambda m: kernel.components(m, [-300, -3, 0])),
                   ("kernel.kernel_at", lambda m: kernel.kernel_at(m, [-300, -3, 0])),
                   ("kernel.offset_kernel", lambda m: kernel.offset_kernel(m, 300)),
                   ("kernel.variation", lambda m: kernel.variation(m, 16)),
                   ("kernel.alignment", lambda m: kernel.alignment(m, [3, 1], window=16)),
                   ("kernel.qk_effective_rank", kernel.qk_effective_rank),
                   ("kernel.reconstruction", lambda m: kernel.reconstruction(m, 16, 2)),
                   ("kernel.first_alias", lambda m: kernel.first_alias(m, 3, 16, 2000, 3.0)),
                   ("probes.position_logits", lambda m: probes.position_logits(m, 40)),
                   ("probes.position_attention", lambda m: probes.position_attention(m, 40)),
                   ("probes.shift_logit_difference", lambda m: probes.shift_logit_difference(m, 40, [1, 1000])),
                   ("probes.shared_offset_difference", lambda m: probes.shared_offset_difference(m, 16, 300)),
                   ("probes.query_similarity", lambda m: probes.query_similarity(m, [1, 300], 0))]:
    LOW_PRECISION_CASES.append((_name, lambda: (_model("head"),), _fn))

_SPEC = lambda: kernel.carrier_spectrum(_model("head"))  # noqa: E731
LOW_PRECISION_CASES += [
    ("kernel.predicted_alias_distance", lambda: (_model("head"),),
     lambda m: kernel.predicted_alias_distance(m, 3, 16, 400)),
    ("kernel.dilution_law_fit", lambda: (_model("head"),),
     lambda m: list(kernel.dilution_law_fit(m, 3, 16, 256).values())),
    ("kernel.mean_distractor_weight", lambda: (_model("head"),), lambda m: kernel.mean_distractor_weight(m, 3, 16, 400)),
    ("kernel.measures", lambda: dataclasses.astuple(_SPEC()),
     lambda theta, r, phi: dataclasses.astuple(kernel.measures(kernel.CarrierSpectrum(theta, r, phi), 3, 16))),
    ("theory.long_run_slope", lambda: dataclasses.astuple(_SPEC()),
     lambda theta, r, phi: theory.long_run_slope(r, phi, theta, 3)),
    ("theory.orbit_log_mean_exp", lambda: dataclasses.astuple(_SPEC()),
     lambda theta, r, phi: theory.orbit_log_mean_exp(r, phi, theta)),
    ("theory.orbit_log_stats", lambda: dataclasses.astuple(_SPEC()),
     lambda theta, r, phi: theory.orbit_log_stats(r, phi, theta)),
    ("theory.orbit_peakiness", lambda: dataclasses.astuple(_SPEC()),
     lambda theta, r, phi: theory.orbit_peakiness(r, phi, theta)),
    ("theory.independent_log_mean_exp", lambda: (_SPEC().r,), theory.independent_log_mean_exp),
    ("kernel.components", lambda: dataclasses.astuple(_SPEC()),
     lambda theta, r, phi: kernel.components(kernel.CarrierSpectrum(theta, r, phi), [-300, -3, 0])),
    ("kernel.kernel_at", lambda: dataclasses.astuple(_SPEC()),
     lambda theta, r, phi: kernel.kernel_at(kernel.CarrierSpectrum(theta, r, phi), [-300, -3, 0])),
    ("kernel.variation", lambda: dataclasses.astuple(_SPEC()),
     lambda theta, r, phi: kernel.variation(kernel.CarrierSpectrum(theta, r, phi), 16)),
    ("kernel.alignment", lambda: dataclasses.astuple(_SPEC()),
     lambda theta, r, phi: kernel.alignment(kernel.CarrierSpectrum(theta, r, phi), 3)),
    ("kernel.reconstruction", lambda: dataclasses.astuple(_SPEC()),
     lambda theta, r, phi: kernel.reconstruction(kernel.CarrierSpectrum(theta, r, phi), 16, 2)),
    ("attention.elu_linear_weights", lambda: _qkv()[:2], attention.elu_linear_weights),
    ("attention.elu_linear_weights (far negative q, k)", lambda: (-30 + _qkv()[0], -30 + _qkv()[1]),
     attention.elu_linear_weights),
    ("kernel.selection_margins", lambda: (KERNEL_ROWS,), lambda s: kernel.selection_margins(s, 3, 16)),
    ("kernel.unseen_weight", lambda: (KERNEL_ROWS,), lambda s: kernel.unseen_weight(s, 3, 16)),
    ("kernel.first_alias", lambda: (KERNEL_ROWS,), lambda s: kernel.first_alias(s, 3, 16, tolerance=3.0)),
    ("kernel.fit_carrier", lambda: (KERNEL_ROWS[:, -16:-1],),
     lambda p: dataclasses.astuple(kernel.fit_carrier(p, -torch.arange(15, 0, -1), _SPEC().theta))),
    ("kernel.measures", lambda: (KERNEL_ROWS[:, -16:-1],),
     lambda p: list(kernel.measures(kernel.fit_carrier(p, -torch.arange(15, 0, -1), _SPEC().theta).spectrum, 3, kernel.fit_carrier(p, -torch.arange(15, 0, -1), _SPEC().theta).window).as_dict().values())),
    ("theory.r_squared", lambda: (KERNEL_ROWS, KERNEL_ROWS + 0.1), theory.r_squared),
    ("theory.separation_auc", lambda: (KERNEL_ROWS[0], KERNEL_ROWS[1]), theory.separation_auc),
]
# functions of these modules with no floating-point input (sizes, masks, closed forms built in float64), or whose
# float input is a frequency set or a seed (built in float64 by the package, never in a model's dtype)
NO_FLOAT_INPUT = {"attention.check_qkv", "attention.check_attention", "attention.causal_mask",
                  "kernel.relative_positions", "theory.log_length_scale", "theory.trained_relative_positions",
                  "theory.min_norm_interpolant", "theory.squared_loss_quadratic", "theory.frequency_orbits",
                  "theory.pair_recurrences", "kernel.shuffled_phases", "kernel.CarrierMeasures.as_dict",
                  "kernel.CarrierMeasures.select", "kernel.CarrierSpectrum.select",
                  "theory.balanced_agreement",  # booleans in, a rate out
                  "attention.available_memory", "attention.check_attention_fits"}  # a device, sizes and a dtype
# differences of two nearly equal computations: their error is measured against the logits' scale
LOGIT_SCALE = {"probes.shift_logit_difference", "probes.shared_offset_difference"}


def test_every_score_function_is_in_the_low_precision_sweep():
    """Discovery: every public function of attention, kernel and theory is swept below, or takes no float input."""
    swept = {name.split(" (")[0].split(" softmax")[0].split(" linear")[0].split(" fused")[0]
             .split(" weights")[0].split(" elu")[0].split(" identity")[0] for name, _, _ in LOW_PRECISION_CASES}
    public = {name for name, obj in _public_callables()
              if name.split(".")[0] in ("attention", "kernel", "theory") and inspect.isfunction(obj)}
    missing = public - swept - NO_FLOAT_INPUT
    assert not missing, f"functions neither swept in float16/bfloat16 nor listed as taking no float: {sorted(missing)}"


def _cast(inputs, dtype):
    return tuple(copy.deepcopy(x).to(dtype) if isinstance(x, (torch.Tensor, torch.nn.Module)) else x for x in inputs)


def _tensors(out):
    """The numbers of an output as a flat list of tensors (tuples, lists, ints and None included)."""
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    if out is None:
        return [torch.tensor(float("nan"))]
    return [torch.as_tensor(out)]


def low_precision_deviation(name, inputs, fn, dtype):
    """``(deviation, error)``: the largest |low - float32| over the output's scale, or the error raised."""
    low_inputs = _cast(inputs, dtype)
    reference = fn(*_cast(low_inputs, torch.float32))  # the same rounded inputs, computed in float32
    try:
        out = fn(*low_inputs)
    except (TypeError, ValueError) as err:
        return None, err
    worst = 0.0
    for o, r in zip(_tensors(out), _tensors(reference), strict=True):
        o, r = o.detach(), r.detach()
        assert o.shape == r.shape, name
        if not (o.dtype.is_floating_point or r.dtype.is_floating_point):
            assert torch.equal(o, r), f"{name}: {o} != {r}"
            continue
        o, r = o.double(), r.double()
        assert torch.equal(torch.isnan(o), torch.isnan(r)) and torch.equal(torch.isinf(o), torch.isinf(r)), \
            f"{name} in {dtype}: non-finite entries differ from float32"
        finite = torch.isfinite(r)
        if name.split(" (")[0] in LOGIT_SCALE:
            scale = float(inputs[0].scores(40).detach().abs().max())
        else:
            scale = float(r[finite].abs().max()) if finite.any() else 1.0
        if finite.any():
            worst = max(worst, float((o[finite] - r[finite]).abs().max()) / max(scale, 1e-30))
    return worst, None


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("name, inputs, fn", LOW_PRECISION_CASES, ids=[c[0] for c in LOW_PRECISION_CASES])
def test_every_attention_path_matches_float32_in_low_precision_or_refuses_naming_the_dtype(name, inputs, fn, dtype):
    """Every function that forms scores, feature maps or normalisers, given float16/bfloat16 inputs (a model cast
    with ``.to(dtype)``), returns the float32 result on the same rounded inputs to within 4 units of the dtype's
    epsilon of the output's scale (no overflow, no underflow to 0, no NaN), or raises an error naming the dtype."""
    deviation, err = low_precision_deviation(name, inputs(), fn, dtype)
    if err is not None:
        assert str(dtype).removeprefix("torch.") in str(err), f"{name}: the error does not name {dtype}: {err}"
        return
    assert deviation <= TOL[dtype], f"{name} in {dtype}: deviation {deviation:.2e} > {TOL[dtype]:.2e}"


def test_linear_attention_never_tells_the_user_to_do_what_they_are_already_doing():
    """The normaliser error used to say "use a positive feature map (e.g. 'elu+1') with normalize=True" to a
    caller using exactly that (far-negative queries and keys made elu(x) + 1 round to 0). Now elu + 1 is
    computed without that cancellation, and a normaliser that still underflows is reported as what it is."""
    q = torch.full((1, 3, 4), -30.0)
    out = attention.linear_attention(q, q, torch.arange(12.0).view(1, 3, 4))  # exp(-30) > 0 in float32
    torch.testing.assert_close(out, torch.arange(12.0).view(1, 3, 4).cumsum(1) / torch.arange(1, 4)[None, :, None])
    with pytest.raises(ValueError) as info:
        attention.linear_attention(q - 40, q - 40, torch.ones(1, 3, 4))  # exp(-70)^2 underflows float32
    message = str(info.value)
    assert "underflow" in message and "float32" in message
    assert "use feature_map='elu+1'" not in message and "(e.g. 'elu+1')" not in message  # what the caller does
    with pytest.raises(ValueError, match="elu\\+1"):  # the identity map is not positive: elu+1 is the advice
        attention.linear_attention(q, -q, torch.ones(1, 3, 4), feature_map="identity")


# ================================================================ 2. configuration values of the wrong container type
def _config_classes():
    """Every frozen dataclass of the package (configurations, encodings, tasks, profiles): ``{name: class}``."""
    return {name: obj for name, obj in _public_callables()
            if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and obj.__dataclass_params__.frozen}


# one valid instance of each; a configuration class added to the package fails the walk until it has one here
CONFIG_EXAMPLES = {
    "configs.TrainingSettings": lambda: configs.TrainingSettings(),
    "configs.SingleHeadSettings": lambda: configs.SingleHeadSettings(),
    "configs.RetrievalExperiment": lambda: configs.RetrievalExperiment(),
    "configs.RetrievalSweep": lambda: configs.RetrievalSweep(),
    "configs.KernelHeadConfig": lambda: configs.KernelHeadConfig(configs.RetrievalExperiment(), (0.5, 1.0) * 4, 0.5,
                                                                 10),
    "configs.TransformerExperiment": lambda: configs.TransformerExperiment(),
    "configs.SnapshotSweep": lambda: configs.SnapshotSweep(configs.RetrievalSweep(pes=("rope",), steps=10),
                                                           (5, 10), (16, 32)),
    "configs.RecurrentExperiment": lambda: configs.RecurrentExperiment(),
    "configs.RegimeMap": lambda: configs.RegimeMap(),
    "models.RetrievalHeadConfig": lambda: models.RetrievalHeadConfig(),
    "models.LinearRNNConfig": lambda: models.LinearRNNConfig(),
    "encodings.RotaryFrequencies": lambda: encodings.RotaryFrequencies(),
    "encodings.NoPEBOS": lambda: encodings.NoPEBOS(),
    "zoo.TestTimeEncoding": lambda: __import__("lengthgen_utils.run.zoo").run.zoo.TestTimeEncoding(configs.RetrievalExperiment(),
                                                                                            "rope_ntk"),
    "encodings.SinusoidalAPE": lambda: encodings.SinusoidalAPE(),
    "encodings.T5Bias": lambda: encodings.T5Bias(),
    "encodings.RandomizedPositions": lambda: encodings.RandomizedPositions(),
    "encodings.RoPEInterpolation": lambda: encodings.RoPEInterpolation(),
    "encodings.RoPENTK": lambda: encodings.RoPENTK(),
    "models.TransformerConfig": lambda: models.TransformerConfig(),
    "encodings.Encoding": lambda: encodings.Encoding(),
    "encodings.NoPE": lambda: encodings.NoPE(),
    "encodings.LearnedAPE": lambda: encodings.LearnedAPE(),
    "encodings.RoPE": lambda: encodings.RoPE(),
    "encodings.ALiBi": lambda: encodings.ALiBi(),
    "profiles.Profile": lambda: profiles.PROFILES["quick"],
    "tasks.FixedOffsetRetrieval": lambda: FixedOffsetRetrieval(),
    "tasks.DelayedCopy": lambda: DelayedCopy(),
    "tasks.LaggedSum": lambda: tasks.LaggedSum(),
    "tasks.RunningParity": lambda: tasks.RunningParity(),
    "tasks.Copy": lambda: tasks.Copy(),
    "optim.OptimizerSettings": lambda: __import__("lengthgen_utils.run.optim").run.optim.OptimizerSettings(),
}
NOT_CONFIGS = {"kernel.CarrierSpectrum", "kernel.CarrierMeasures", "kernel.CarrierFit",
               "optim.Rule"}  # optim.Rule: a registry entry made by register_optimizer, never from user values  # measurements (tensors), never built from user values nor cached


def _list_inputs():
    """``(class name, field, list value, the stored value expected or None for a refusal)`` for every field."""
    for name, cls in sorted(_config_classes().items()):
        if name in NOT_CONFIGS:
            continue
        example = CONFIG_EXAMPLES[name]()
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            value = getattr(example, f.name)
            if isinstance(value, tuple):  # a sequence field: the list is normalised to the tuple
                yield name, f.name, [list(v) if isinstance(v, tuple) else v for v in value], value
            else:  # one value: the list is refused, naming the field
                yield name, f.name, [value], None


def test_every_configuration_class_has_an_example():
    """Discovery: the walk below covers every frozen dataclass of the package (no hard-coded partial list)."""
    missing = set(_config_classes()) - set(CONFIG_EXAMPLES) - NOT_CONFIGS
    assert not missing, f"configuration classes without an example for the list walk: {sorted(missing)}"


@pytest.mark.parametrize("name, field, value, stored", list(_list_inputs()),
                         ids=[f"{n}.{f}" for n, f, _, _ in _list_inputs()])
def test_every_configuration_field_normalises_a_list_or_refuses_it_by_name(name, field, value, stored):
    """A list given to a sequence field is stored as the tuple (the configuration hashes, equals the one built
    from the tuple and has its cache key); a list given to any other field raises naming the field."""
    example = CONFIG_EXAMPLES[name]()
    kwargs = {f.name: getattr(example, f.name) for f in dataclasses.fields(example) if f.init}
    cls = type(example)
    if stored is None:
        with pytest.raises((TypeError, ValueError), match=field):
            cls(**{**kwargs, field: value})
        return
    config = cls(**{**kwargs, field: value})
    assert getattr(config, field) == stored and isinstance(getattr(config, field), tuple)
    assert hash(config) == hash(example) and config == example
    assert cache.make_key(cache.cache_description(config, "cpu")) == cache.make_key(
        cache.cache_description(example, "cpu"))


def test_profile_transformer_settings_with_a_list_stay_hashable():
    """A list inside a profile's transformer settings (e.g. ``eval_lengths``) is stored as a tuple."""
    p = profiles.Profile("p", 1, 1, 1, 1, [1, 2], transformer={"eval_lengths": [32, 64]})
    assert dict(p.transformer)["eval_lengths"] == (32, 64) and hash(p) is not None
    with pytest.raises(TypeError, match=r"transformer\['x'\]"):
        profiles.Profile("p", 1, 1, 1, 1, [1], transformer={"x": {"a": 1}})


def test_transformer_experiment_with_a_list_of_eval_lengths_runs_and_keys_the_cache(tmp_path):
    """The reported example: ``TransformerExperiment(eval_lengths=[32, 64])`` used to be accepted, then
    ``run_transformer`` failed ("can only concatenate list (not "tuple") to list") and the configuration could
    not be hashed. Now the list is stored as ``(32, 64)``; the run measures both lengths and a second run is a
    cache hit on the same key."""
    small = dict(d_model=16, n_heads=2, n_layers=1, n_seeds=1, steps=2, batch_size=4, eval_samples=4)
    exp = configs.TransformerExperiment(eval_lengths=[32, 64], **small)
    assert exp.eval_lengths == (32, 64) and exp.max_len == 64
    assert hash(exp) == hash(configs.TransformerExperiment(eval_lengths=(32, 64), **small))
    result = runners.run_transformer(exp, device="cpu", cache=tmp_path)
    assert sorted(result.per_position) == [32, 64] and sorted(result.outside) == [32, 64]
    assert result.per_position[64].shape == (1, 64) and result.accuracy.shape == (1, 2)
    key = cache.make_key(cache.cache_description(exp, "cpu", training.default_cpu_threads("transformer")))
    assert (tmp_path / f"{key}.pt").exists()
    payload, status = cache.load_or_run(exp, lambda: pytest.fail("a cache hit must not recompute"), cache=tmp_path,
                                        device="cpu", threads=training.default_cpu_threads("transformer"))
    assert status == "hit"


# ================================================================ 3. per-model arguments
M = 3  # ensemble size of the walk
TASK = FixedOffsetRetrieval(16, 2)
KERNEL = torch.randn(M, 24, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def _head(pe="rope"):
    return RetrievalHead(pe=pe, n_models=M, max_len=64)


# (function, argument, call(value) -> result, a valid per-model value). Every call gets its ensemble size M
# from the other arguments; the walk passes M - 1 and M + 1 values and expects the one shared wording.
PER_MODEL = [
    ("evaluation.target_attention_mass", "offset",
     lambda v: evaluation.target_attention_mass(_head(), v, [8, 12]), [1, 2, 3]),
    ("kernel.alignment", "offset", lambda v: kernel.alignment(_head(), v, window=8), [1, 2, 3]),
    ("kernel.first_alias", "offset", lambda v: kernel.first_alias(_head(), v, 8, 64), [1, 2, 3]),
    ("kernel.predicted_alias_distance", "offset",
     lambda v: kernel.predicted_alias_distance(_head(), v, 8, 64), [1, 2, 3]),
    ("kernel.dilution_law_fit", "offset", lambda v: kernel.dilution_law_fit(_head(), v, 8, 64), [1, 2, 3]),
    ("kernel.mean_distractor_weight", "offset", lambda v: kernel.mean_distractor_weight(_head(), v, 8, 64), [1, 2, 3]),
    ("kernel.measures", "offset",
     lambda v: kernel.measures(kernel.carrier_spectrum(_head()), v, 8), [1, 2, 3]),
    ("kernel.alignment", "offset",
     lambda v: kernel.alignment(kernel.carrier_spectrum(_head()), v), [1, 2, 3]),
    ("kernel.selection_margins", "offset", lambda v: kernel.selection_margins(KERNEL, v, 8), [1, 2, 3]),
    ("implicit_bias.window_margin", "offset", lambda v: implicit_bias.window_margin(KERNEL, v, 8), [1, 2, 3]),
    ("kernel.unseen_weight", "offset", lambda v: kernel.unseen_weight(KERNEL, v, 8), [1, 2, 3]),
    ("kernel.first_alias", "offset", lambda v: kernel.first_alias(KERNEL, v, 8), [1, 2, 3]),
    ("kernel.measures", "offset",
     lambda v: kernel.measures(kernel.fit_carrier(KERNEL[:, -8:-1].float(), -torch.arange(7, 0, -1),
                                                                 kernel.carrier_spectrum(_head()).theta).spectrum, v, kernel.fit_carrier(KERNEL[:, -8:-1].float(), -torch.arange(7, 0, -1),
                                                                 kernel.carrier_spectrum(_head()).theta).window).as_dict(),
     [1, 2, 3]),
    ("probes.copying_heads", "offset", lambda v: probes.copying_heads(torch.rand(M, 2, 2, 8), v), [1, 2, 3]),
    ("models.LinearRNN", "seeds", lambda v: models.LinearRNN(n_models=M, seeds=v), [4, 5, 6]),
    ("models.LinearRNN.forward", "tokens",
     lambda v: models.LinearRNN(n_models=M)(torch.as_tensor(v)[:, None, None].expand(-1, 2, 8)), [0, 1, 2]),
    ("theory.long_run_slope", "offset",
     lambda v: (lambda sp: theory.long_run_slope(sp.r, sp.phi, sp.theta, v))(kernel.carrier_spectrum(_head())),
     [1, 2, 3]),
    ("theory.exact_target_mass", "offset", lambda v: theory.exact_target_mass(KERNEL, v, [8, 24]), [1, 2, 3]),
    ("theory.mean_field_parameters", "offset", lambda v: theory.mean_field_parameters(KERNEL, v, 8), [1, 2, 3]),
    ("theory.distractor_ratio", "offset", lambda v: theory.distractor_ratio(KERNEL, v), [1, 2, 3]),
    ("training.train_squared_loss", "seed",
     lambda v: training.train_squared_loss(KernelHead(n_models=M), TASK, steps=1, batch_size=2, seed=v,
                                           device="cpu"), [0, 1, 2]),
    ("training.train", "task",
     lambda v: training.train(_head(), v, steps=1, batch_size=2, train_len=8, device="cpu"),
     [FixedOffsetRetrieval(16, k) for k in (1, 2, 3)]),
    ("training.train_squared_loss", "task",
     lambda v: training.train_squared_loss(KernelHead(n_models=M), v, steps=1, batch_size=2, device="cpu"),
     [TASK] * M),
    ("evaluation.accuracy_by_length", "task",
     lambda v: evaluation.accuracy_by_length(_head(), v, [8], n_samples=4),
     [FixedOffsetRetrieval(16, k) for k in (1, 2, 3)]),
    ("evaluation.squared_error_by_length", "task",
     lambda v: evaluation.squared_error_by_length(KernelHead(n_models=M), v, [8], n_samples=4), [TASK] * M),
    ("probes.position_table_gradient", "task",
     lambda v: probes.position_table_gradient(_head(LearnedAPE()), v, [8], batch_size=4), [TASK] * M),
    ("tasks.as_task_list", "task", lambda v: tasks.as_task_list(v, M), [TASK] * M),
    ("models.RetrievalHead", "seeds", lambda v: RetrievalHead(n_models=M, seeds=v), [4, 5, 6]),
    ("models.KernelHead", "seeds", lambda v: KernelHead(n_models=M, seeds=v), [4, 5, 6]),
    ("models.ContentRetrievalHead", "seeds", lambda v: ContentRetrievalHead(n_models=M, seeds=v), [4, 5, 6]),
    ("models.ContentRetrievalHead.forward", "tokens",
     lambda v: ContentRetrievalHead(n_models=M)(torch.as_tensor(v)[:, None, None].expand(-1, 2, 8)), [0, 1, 2]),
    ("evaluation.attention_vote", "task",
     lambda v: evaluation.attention_vote(_head(), v, [8], n_samples=4), [FixedOffsetRetrieval(16, k) for k in (1, 2, 3)]),
    ("models.Transformer", "seeds", lambda v: Transformer(16, 1, 2, 16, n_models=M, seeds=v), [4, 5, 6]),
    ("fast.FastTransformer", "seeds", lambda v: FastTransformer(16, 1, 2, 16, n_models=M, seeds=v), [4, 5, 6]),
    ("models.readout", "weights",
     lambda v: models.readout(torch.as_tensor(v, dtype=torch.float32)[:, None].expand(-1, 4),
                              torch.zeros(2, 4, dtype=torch.long), torch.ones(M, 17, 16)), [0.1, 0.2, 0.3]),
    ("models.readout", "tokens",
     lambda v: models.readout(torch.ones(M, 4), torch.as_tensor(v)[:, None, None].expand(-1, 2, 4),
                              torch.ones(M, 17, 16)), [0, 1, 2]),
    ("models.RetrievalHead.forward", "tokens",
     lambda v: _head()(torch.as_tensor(v)[:, None, None].expand(-1, 2, 8)), [0, 1, 2]),
    ("models.KernelHead.forward", "tokens",
     lambda v: KernelHead(n_models=M)(torch.as_tensor(v)[:, None, None].expand(-1, 2, 8)), [0, 1, 2]),
    ("probes.shift_invariance", "tokens",
     lambda v: probes.shift_invariance(_head(), torch.as_tensor(v)[:, None, None].expand(-1, 2, 8), shifts=(1,)),
     [0, 1, 2]),
    ("ch04.alias_vs_failure", "alias_distance",
     lambda v: ch04.alias_vs_failure(v, [None] * M, ["a", "b", "c"], 64, 256, "t"), [20, None, 30]),
    ("ch04.alias_vs_failure", "failure_length",
     lambda v: ch04.alias_vs_failure([None] * M, v, ["a", "b", "c"], 64, 256, "t"), [32, None, 64]),
    ("ch05.dilution_slider", "measured",
     lambda v: ch05.dilution_slider([8, 16], np.array(v)[:, None].repeat(2, 1), ([8, 16], np.full((M, 2), 0.5)),
                                     ([8, 16], np.full((M, 2), 0.5)), ["a", "b", "c"], "t"), [0.5, 0.4, 0.3]),
    ("ch05.dilution_slider", "exact",
     lambda v: ch05.dilution_slider([8, 16], np.full((M, 2), 0.5), ([8, 16], np.array(v)[:, None].repeat(2, 1)),
                                     ([8, 16], np.full((M, 2), 0.5)), ["a", "b", "c"], "t"), [0.5, 0.4, 0.3]),
    ("ch05.dilution_slider", "mean_field",
     lambda v: ch05.dilution_slider([8, 16], np.full((M, 2), 0.5), ([8, 16], np.full((M, 2), 0.5)),
                                     ([8, 16], np.array(v)[:, None].repeat(2, 1)), ["a", "b", "c"], "t"),
     [0.5, 0.4, 0.3]),
]
# Functions that take one task for the whole ensemble: a sequence of tasks is refused, naming ``task``.
SHARED_TASK = [
    ("evaluation.token_accuracy_by_position",
     lambda v: evaluation.token_accuracy_by_position(Transformer(16, 1, 2, 16, n_models=M), v, 8, n_samples=2)),
    ("probes.head_offset_profiles",
     lambda v: probes.head_offset_profiles(Transformer(16, 1, 2, 16, n_models=M), v, 8, n_samples=2)),
    ("training.train_sequence",
     lambda v: training.train_sequence(Transformer(16, 1, 2, 16, n_models=M), v, steps=1, train_len=8,
                                       device="cpu")),
]
# Arguments with a per-model-sounding name that hold one value by design, and why.
ONE_VALUE = {
    "offset": {"configs.RetrievalExperiment", "configs.RetrievalSweep.experiment", "tasks.FixedOffsetRetrieval", "tasks.query_task",
               "probes.argmax_placement", "ch09.placement", "zoo.run_retrieval_zoo", "ch09.offset_margin_profiles", "tasks.DelayedCopy",
               "tasks.LaggedSum", "theory.trained_relative_positions", "theory.min_norm_interpolant",
               "theory.squared_loss_quadratic", "theory.expected_squared_error", "theory.linear_noise_ratio",
               "widgets.RetrievalExplorer", "live.kernel_panel",
               "live.kernel_report",  # one experiment, task, closed form, control or live panel: one offset
               "ch07.copying_head_pairs", "ch07.copying_head_fit",
               "ch07.carrier_stats",  # chapter 7: one delayed-copy run, one offset for all its models
               "predictions.predict", "predictions.load_prediction",  # one head's setting, no model
               "implicit_bias.margin_constraints", "implicit_bias.max_margin_kernel",
               "implicit_bias.decoy_kernel",
               "implicit_bias.linf_max_margin_kernel"},  # chapter 5c: one closed-form kernel, one offset
    "seeds": {  # a result's record, filled by the runner
              "live.accuracy_panel"},  # the range of a live panel's seed slider
    # the weights of alignment are a [N, P] matrix checked by shape against the spectrum's rows
    "task": {"configs.TransformerExperiment", "tasks.shared_task", "evaluation.lag_agreement", "probes.head_carriers",
             "probes.copy_head_placement", "ch08.copy_by_length",  # one experiment / the check itself: one task
             "runners.recurrent_accuracy"},  # handed on to accuracy_by_length, whose per-model tasks are walked
    "tokens": {"models.Transformer.forward", "models.Transformer.head_scores", "fast.FastTransformer.forward",
               "fast.FastTransformer.head_scores", "models.LinearRNN.states", "tasks.Task.targets",
               "tasks.batch_targets", "tasks.query_targets",
               "bench.PlainGPT.forward", "bench.PlainHead.forward"},  # [B, L] shared by every model (the benchmark's peer: one model)
    "weights": {"kernel.participation_ratio", "kernel.alignment"},  # any non-negative weights, no model dimension assumed
    # a null's seed (one random stream for every draw), per-head labels and margins of figures whose length
    # defines M, and a result's record filled by the runner
    "seed": {"evaluation.accuracy_by_length", "evaluation.squared_error_by_length",
             "evaluation.token_accuracy_by_position", "probes.position_table_gradient",
             "probes.head_offset_profiles", "training.train", "training.train_sequence", "kernel.shuffled_phases",
             "evaluation.lag_agreement", "probes.head_carriers", "probes.copy_head_placement",
             "ch09.shift_violation", "bench.tf_batches", "seeding.effective_seed",
             "seeding.generator",  # the benchmark's batches, a generator: one stream for every model
             "predictions.score_lags", "ch04.prior_report", "ch01.committed_failures",
             "evaluation.attention_vote",
             "rates.shuffled_agreement"},  # a null's seed; the vote's sequences, shared by every head
    "labels": {"ch04.alias_vs_failure", "ch05.dilution_slider", "ch05.accuracy_heatmap", "ch05.r2_vs_reach",
               "ch04.censored_scatter", "ch05.r2_vs_margin"},  # define M: the others are checked against them
    "measured": {"ch05.dilution_panel",
                 "predictions.score_lags",  # measured lags: a list whose length defines the heads scored
                 "rates.shuffled_agreement"},  # one value per head, checked against the predictions' length
    "exact": {"ch05.dilution_panel"},  # one model's panel
    "mean_field": {"ch05.dilution_panel"}, "alias_distance": set(),
    "failure_length": set(),
    "margin": {"ch05.r2_vs_margin", "implicit_bias.decoy_kernel",  # one closed-form kernel's margin
               "ch05c.CellSummary"},  # a record filled by ch05c.summarise "rho": set(), "p_star": set(),
}


def test_every_per_model_argument_of_the_package_is_walked():
    """Discovery: every public function with a per-model-sounding argument is in the walk, or is documented
    above as taking one value (so a new per-model function cannot be missed)."""
    walked = {(f, a) for f, a, _, _ in PER_MODEL} | {(f, "task") for f, _ in SHARED_TASK}
    found = set()
    for qualname, obj in _public_callables():
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            continue
        found |= {(qualname, p) for p in params if p in ONE_VALUE}
    missing = {(f, a) for f, a in found if (f, a) not in walked and f not in ONE_VALUE[a]}
    assert not missing, f"per-model arguments neither walked nor documented as one value: {sorted(missing)}"
    assert walked <= found, f"walked entries that no longer exist: {sorted(walked - found)}"


@pytest.mark.parametrize("function, argument, call, valid", PER_MODEL, ids=[f"{f}-{a}" for f, a, _, _ in PER_MODEL])
def test_per_model_arguments_of_the_wrong_length_are_refused_in_one_wording(function, argument, call, valid):
    """A value per model whose length is not the ensemble's (M - 1 or M + 1 values) raises a ValueError that
    names the argument in the package's one wording ("... one per model; got n"); the valid value passes.
    (Where no model fixes M and two arguments disagree, e.g. margin and rho, the error names both.)"""
    call(valid)
    for wrong in (valid[:-1], valid + valid[:1]):
        pattern = rf"^(\w+ and )?{argument}( and \w+)? must .* one per model.*got .*{len(wrong)}"
        with pytest.raises(ValueError, match=pattern):
            call(wrong)


@pytest.mark.parametrize("function, call", SHARED_TASK, ids=[f for f, _ in SHARED_TASK])
def test_functions_of_one_shared_task_refuse_a_task_per_model(function, call):
    """A sequence of tasks where one task serves every model raises a TypeError naming ``task`` (it used to
    fail with an AttributeError on the list)."""
    with pytest.raises(TypeError, match="^task must be one Task"):
        call([DelayedCopy(16, 2)] * M)


@pytest.mark.parametrize("function", ["mean_field_parameters", "exact_target_mass", "distractor_ratio",
                                      "target_attention_mass", "alignment", "first_alias"])
def test_per_model_results_equal_each_model_computed_alone(function):
    """No uninitialised memory: with one offset per model, every row equals that model computed alone
    (an entry left unwritten by a length mismatch would differ)."""
    offsets = [3, 1, 2]
    head = _head()
    calls = {
        "mean_field_parameters": lambda i, k: torch.stack(theory.mean_field_parameters(
            KERNEL if i is None else KERNEL[i:i + 1], k, 8), -1),
        "exact_target_mass": lambda i, k: theory.exact_target_mass(KERNEL if i is None else KERNEL[i:i + 1], k,
                                                                   [8, 24]),
        "distractor_ratio": lambda i, k: theory.distractor_ratio(KERNEL if i is None else KERNEL[i:i + 1], k),
        "target_attention_mass": lambda i, k: evaluation.target_attention_mass(
            head if i is None else head.select(i), k, [8, 16]),
        "alignment": lambda i, k: kernel.alignment(head if i is None else head.select(i), k, window=8),
        "first_alias": lambda i, k: torch.tensor([-1 if d is None else d for d in kernel.first_alias(
            head if i is None else head.select(i), k, 8, 400, tolerance=3.0)]),
    }[function]
    together = calls(None, offsets)
    alone = torch.cat([calls(i, k) for i, k in enumerate(offsets)])
    torch.testing.assert_close(together, alone, rtol=1e-6, atol=1e-9)


def test_seeds_of_a_model_must_be_one_per_model_not_one_for_all():
    """One int for every model's initialisation would make the models identical: refused, naming ``seeds``."""
    with pytest.raises(TypeError, match="^seeds must be 3 ints, one per model; got one int"):
        RetrievalHead(n_models=3, seeds=7)


# ================================================================ 4. slider figures keep everything of each panel
SLIDER_FRAME = {"height", "width", "margin", "autosize", "sliders", "updatemenus", "template"}  # the slider's own


def _apply_step(fig, step):
    """The figure as plotly.js shows it after the slider moves to ``step`` (method "update": traces, then layout)."""
    assert step.method == "update"
    shown = go.Figure(fig)
    for trace, visible in zip(shown.data, step.args[0]["visible"], strict=True):
        trace.visible = visible
    for path, value in step.args[1].items():
        shown.layout[path] = value
    return shown


def _decoded(spec):
    """Plotly JSON with its typed arrays (``{"dtype", "bdata"}``, base64) read back as plain lists and empty
    containers dropped (plotly.js draws both forms alike)."""
    if isinstance(spec, dict):
        if set(spec) >= {"dtype", "bdata"}:
            values = np.frombuffer(base64.b64decode(spec["bdata"]), dtype=spec["dtype"])
            shape = [int(n) for n in str(spec.get("shape", len(values))).split(",")]  # plotly writes "rows, cols"
            return values.reshape(shape).tolist()
        decoded = {k: _decoded(v) for k, v in spec.items()}
        return {k: v for k, v in decoded.items() if v != {}}  # an emptied container is the default, as if absent
    if isinstance(spec, list):
        return [_decoded(v) for v in spec]
    return spec


def _what_is_shown(fig):
    """The visible traces (with their visibility state) and the whole layout but the slider's own frame, as JSON."""
    spec = _decoded(json.loads(pio.to_json(fig, validate=False)))
    traces = [{**t, "visible": t.get("visible", True)} for t in spec["data"] if t.get("visible", True) is not False]
    layout = {k: v for k, v in spec["layout"].items() if k not in SLIDER_FRAME}
    return traces, layout


def assert_steps_show_their_panels(fig, panels):
    """Every step of ``fig``'s slider shows exactly its stand-alone panel; the page opens on the active one."""
    (slider,) = fig.layout.sliders
    assert len(slider.steps) == len(panels)
    for i, (step, panel) in enumerate(zip(slider.steps, panels)):
        assert _what_is_shown(_apply_step(fig, step)) == _what_is_shown(panel), f"step {i} ({step.label})"
    assert _what_is_shown(fig) == _what_is_shown(panels[slider.active]), "the page does not open on the active step"


def assert_grid_shows_its_panels(fig, panels):
    """Every cell of ``fig``'s grid (:func:`sliders.grid_slider_figure`: the page script applies the cell's stored
    visibility, then its layout) shows exactly its stand-alone panel; the page opens on the active cell."""
    grid = fig.layout.meta["grid"]
    rows, cols = grid["shape"]
    assert len(panels) == rows * cols == len(grid["visible"]) == len(grid["relayout"])
    strip = lambda shown: (shown[0], {k: v for k, v in shown[1].items() if k != "meta"})  # noqa: E731
    for i, panel in enumerate(panels):
        shown = go.Figure(fig)
        for trace, visible in zip(shown.data, grid["visible"][i], strict=True):
            trace.visible = visible
        for path, value in grid["relayout"][i].items():
            shown.layout[path] = value
        assert strip(_what_is_shown(shown)) == _what_is_shown(panel), f"cell {i}"
    active = fig.layout.sliders[0].active * cols + fig.layout.sliders[1].active
    assert strip(_what_is_shown(fig)) == _what_is_shown(panels[active]), "the page does not open on the active cell"


def _accuracy_panel(means, title, n_curves=2, lengths=(16, 32, 64)):
    curves = {pe: (list(lengths), np.array([means] * 5)) for pe in ("rope", "ape", "nope", "alibi")[:n_curves]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the below-chance flag also warns
        return figures.accuracy_vs_length(curves, chance=1 / 16, train_len=16, title=title)


def test_slider_step_keeps_its_panels_below_chance_flag_and_legendonly_traces():
    """The reported example: the slider used to take annotations from the first panel (dropping the "below
    chance: likely a bug" flag of another) and to make a legend-only trace visible. The flagged panel's step
    shows its flag, the other step none, and the legend-only trace stays legend-only."""
    fine = _accuracy_panel([1.0, 0.9, 0.8], "fine")
    flagged = _accuracy_panel([0.5, 0.01, 0.0], "below chance")  # mean 0.0 < 1/16 - 0.05: flagged
    flagged.data[1].visible = "legendonly"
    fig = sliders.slider_figure({"a": fine, "b": flagged}, "panel: ", active=0)
    texts = lambda f: [a.text for a in f.layout.annotations]  # noqa: E731
    assert not any("likely a bug" in t for t in texts(fig))
    on_b = _apply_step(fig, fig.layout.sliders[0].steps[1])
    assert any(t.startswith("below chance: likely a bug") for t in texts(on_b))
    assert [t.visible for t in on_b.data][4:] == [True, "legendonly", True, True]
    back = _apply_step(on_b, fig.layout.sliders[0].steps[0])
    assert not any("likely a bug" in t for t in texts(back))
    assert_steps_show_their_panels(fig, [fine, flagged])
    assert_steps_show_their_panels(sliders.slider_figure({"a": fine, "b": flagged}, "panel: ", active=1),
                                   [fine, flagged])


def test_slider_steps_switch_axes_legends_shapes_and_trace_counts():
    """Panels that differ in evaluation lengths (axis ticks), number of curves (legend placement), shapes and
    trace count: each step is its panel, in both directions."""
    panels = [_accuracy_panel([1.0, 0.9, 0.8], "three lengths"),
              _accuracy_panel([1.0, 0.9, 0.8, 0.7], "four curves, four lengths", n_curves=4, lengths=(8, 16, 32, 64)),
              ch04.kernel_panel([-2, -1, 0], np.ones((2, 3)), 1, 2, "a kernel panel", y_range=[-3, 3])]
    for active in range(3):
        fig = sliders.slider_figure({str(i): p for i, p in enumerate(panels)}, "x: ", active=active)
        assert_steps_show_their_panels(fig, panels)


def _book_sliders():
    """The slider figures the book builds: ``(plots function, figure, stand-alone panels)``, as in the chapters."""
    g = _gen(0)
    lengths = [16, 32, 64, 128]
    sweep = {k: {pe: (lengths, torch.rand(5, 4, generator=g).numpy()) for pe in ("rope", "ape", "nope")}
             for k in (1, 3, 5)}
    sweep[5]["nope"] = (lengths, np.zeros((5, 4)))  # a below-chance panel, as a bug would show it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        panels = [figures.accuracy_vs_length(c, chance=1 / 16, train_len=16, title=f"k = {k}") for k, c in sweep.items()]
    yield "slider_figure", sliders.slider_figure({f"k = {k}": p for k, p in zip(sweep, panels)}, "offset ", 1), panels
    kernels = {k: torch.randn(3, 49, generator=g).double().numpy() for k in (1, 3, 5)}
    fig = ch04.kernel_slider(list(range(-48, 1)), kernels, 16, "kernels")
    y = [s.min() for s in kernels.values()], [s.max() for s in kernels.values()]
    y_range = [min(y[0]) - 0.05 * (max(y[1]) - min(y[0])), max(y[1]) + 0.05 * (max(y[1]) - min(y[0]))]
    yield "kernel_slider", fig, [ch04.kernel_panel(list(range(-48, 1)), s, k, 16, "kernels", y_range)
                                 for k, s in kernels.items()]
    rows = {L: torch.softmax(torch.randn(3, L, generator=g), -1) for L in (16, 24, 40)}
    yield "attention_row_slider", ch03.attention_row_slider(rows, 16, 3, "rows", active=24), [
        ch03.attention_row_panel(rows[L], 16, 3, "rows", x_max=40) for L in (16, 24, 40)]
    fine = [16, 32, 64, 128, 256]
    p = torch.rand(3, 5, generator=g).numpy() * 0.9 + 0.05
    yield "dilution_slider", ch05.dilution_slider([16, 64], p[:, [0, 2]], (fine, p), (fine, p ** 2), "abc", "dil"), [
        ch05.dilution_panel([16, 64], p[i, [0, 2]], (fine, p[i]), (fine, p[i] ** 2), "dil") for i in range(3)]
    grid = {}  # chapter 1's explorer: offset x training length, each panel on its own lengths
    for k in (1, 3):
        for train_len in (8, 16, 32):
            lengths = [train_len * m for m in (1, 2, 4)]
            curves = {pe: (lengths, torch.rand(5, 3, generator=g).numpy()) for pe in ("rope", "ape", "nope")}
            grid[(str(k), str(train_len))] = figures.accuracy_vs_length(curves, chance=1 / 16, train_len=train_len,
                                                                     title=f"k = {k}, L = {train_len}")
    yield "grid_slider_figure", sliders.grid_slider_figure(grid, ("offset k = ", "training length = "), (1, 1)), list(
        grid.values())


def test_every_slider_figure_of_the_book_is_swept():
    """Discovery: every plots function the chapters call to build a slider is in the sweep below."""
    called = set()
    for path in sorted((Path(__file__).parents[1] / "chapters").glob("*.ipynb")):
        source = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
        called |= set(re.findall(r"(?:sliders|ch0\d|figures)\.(\w*slider\w*)\(", source))
    assert called and called <= {name for name, _, _ in _book_sliders()}, called


@pytest.mark.parametrize("name", ["slider_figure", "kernel_slider", "attention_row_slider", "dilution_slider",
                                  "grid_slider_figure"])
def test_every_book_slider_step_equals_its_stand_alone_panel(name):
    """Each step of each slider figure the book builds shows its stand-alone panel exactly: traces and their
    visibility, title, annotations (chapter 1's below-chance flag included), shapes, axes and legend."""
    (fig, panels), = [(f, p) for n, f, p in _book_sliders() if n == name]
    if name == "grid_slider_figure":
        assert_grid_shows_its_panels(fig, panels)
    else:
        assert_steps_show_their_panels(fig, panels)


# ================================================================ 5. interactive panels fail loudly
QUICK_PANEL = dict(profile="quick", n_seeds=2, steps=20, eval_samples=32)


def test_explorer_offset_slider_follows_the_training_length():
    """The reported example: ``RetrievalExplorer(profile="quick", train_len=8)`` offered offset 7, which the task
    refuses (offset <= train_len - 2 = 6). The offset slider now ends at 6 at train_len 8, moves with the
    training length (8 at 12, the slider's cap) and pulls the offset back when the training length shrinks;
    the evaluation-length slider starts at the training length."""
    ex = RetrievalExplorer(train_len=8, train_now=False, **QUICK_PANEL)
    assert (ex.offset.min, ex.offset.max) == (1, 6)
    assert min(ex.eval_len.options) >= 8
    ex.train_len.value = 12
    assert ex.offset.max == 8
    ex.offset.value = 8
    ex.train_len.value = 8
    assert ex.offset.max == 6 and ex.offset.value == 6
    ex.eval_len.value = 16
    ex.train_len.value = 32
    assert ex.offset.max == 8 and min(ex.eval_len.options) == 32 and ex.eval_len.value == 32
    for train_len in range(8, 33, 4):  # every setting the controls can reach is one the task accepts
        ex.train_len.value = train_len
        FixedOffsetRetrieval(16, ex.offset.max).check_seq_len(train_len)
        assert min(ex.eval_len.options) >= train_len


@pytest.mark.parametrize("kwargs, argument", [
    (dict(train_len=8, offset=7), "offset"), (dict(train_len=12, offset=11), "offset"),
    (dict(train_len=32, eval_len=16), "eval_len"), (dict(train_len=10), "train_len"),
])
def test_explorer_refuses_invalid_combinations_naming_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=rf"^{argument} must"):
        RetrievalExplorer(train_now=False, **QUICK_PANEL, **kwargs)


def test_an_error_during_retrain_shows_in_the_status_line(monkeypatch):
    """ipywidgets swallows an exception raised in a button's callback: the status used to keep saying "press
    Retrain". Now the error's message is in the status line, the button is usable again, and a retrain called
    from code still raises."""
    ex = RetrievalExplorer(train_len=8, offset=2, eval_len=16, pe="rope", train_now=False, **QUICK_PANEL)

    def failing_train(*args, **kwargs):
        raise RuntimeError("out of memory <while training>")

    monkeypatch.setattr(widgets_module, "train", failing_train)
    ex.retrain_button.click()  # what a reader does: no exception reaches them
    assert "Retrain failed" in ex.status.value
    assert "RuntimeError: out of memory &lt;while training&gt;" in ex.status.value  # escaped, shown whole
    assert "press" not in ex.status.value.lower() and not ex.retrain_button.disabled and ex.figure is None
    with pytest.raises(RuntimeError, match="out of memory"):
        ex.retrain()


def test_an_error_while_replotting_shows_in_the_status_line(monkeypatch):
    """A control that re-plots a trained setting (here the evaluation length) shows an evaluation error too."""
    ex = RetrievalExplorer(train_len=8, offset=2, eval_len=16, pe="rope", **QUICK_PANEL)
    assert "Showing k = 2" in ex.status.value

    def failing_accuracy(*args, **kwargs):
        raise ValueError("lengths[3]=512 is beyond the table")

    monkeypatch.setattr(widgets_module, "accuracy_by_length", failing_accuracy)
    ex.eval_len.value = 64
    assert "Re-plot failed" in ex.status.value and "lengths[3]=512 is beyond the table" in ex.status.value
