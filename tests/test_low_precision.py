"""Low-precision numerics (float16, bfloat16) in every attention path, the models and the analyses.
"""
import copy
import dataclasses
import inspect

import pytest
import torch

from lengthgen_utils.analysis import kernel, probes, theory
from lengthgen_utils.core import attention, rope
from lengthgen_utils.core.fast import FastTransformer
from lengthgen_utils.core.models import KernelHead, RetrievalHead, Transformer
from lengthgen_utils.core.tasks import DelayedCopy
from tests import reference
from tests.package_walk import public_callables


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
    out, weights = reference.causal_attention(q, q, v, return_weights=True)
    assert weights.dtype == torch.float16 and torch.isfinite(weights).all()
    expected = torch.tril(torch.ones(4, 4)) / torch.arange(1, 5)[:, None]
    torch.testing.assert_close(weights[0], expected.half(), rtol=0, atol=0)  # 1/3 rounded to float16
    assert weights[0, -1].tolist() == [0.25, 0.25, 0.25, 0.25]
    fused = reference.causal_attention(q, q, v)
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
     lambda x: reference.additive_mask(CAUSAL, 12, 12, x.dtype)),
    ("attention.masked_attention (bool mask)", _qkv,
     lambda q, k, v: reference.masked_attention(q, k, v, CAUSAL, return_weights=True)),
    ("attention.masked_attention (additive mask, bias)", lambda: _qkv() + (BIAS,),
     lambda q, k, v, b: reference.masked_attention(q, k, v, reference.additive_mask(CAUSAL, 12, 12, q.dtype),
                                                   return_weights=True, bias=b)),
    ("attention.causal_attention fused", _qkv, reference.causal_attention),
    ("attention.causal_attention fused (bias)", lambda: _qkv() + (BIAS,),
     lambda q, k, v, b: reference.causal_attention(q, k, v, bias=b)),
    ("attention.causal_attention weights", lambda: _qkv(d=64, scale=20.0),
     lambda q, k, v: reference.causal_attention(q, k, v, return_weights=True)),
    ("attention.linear_attention elu+1", _qkv, reference.linear_attention),
    ("attention.linear_attention elu+1 (far negative q, k)", lambda: (-30 + _qkv()[0], -30 + _qkv()[1], _qkv()[2]),
     reference.linear_attention),
    ("attention.linear_attention identity, unnormalised", _qkv,
     lambda q, k, v: reference.linear_attention(q, k, v, normalize=False, feature_map="identity")),
    ("attention.linear_attention elu+1, unnormalised", _qkv,
     lambda q, k, v: reference.linear_attention(q, k, v, normalize=False)),
    ("attention.linear_attention identity, unnormalised (beyond float16's range)",
     lambda: _qkv(seq_len=300, d=64, scale=6.0),
     lambda q, k, v: reference.linear_attention(q, k, v, normalize=False, feature_map="identity")),
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
    public = {name for name, obj in public_callables()
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
    out = reference.linear_attention(q, q, torch.arange(12.0).view(1, 3, 4))  # exp(-30) > 0 in float32
    torch.testing.assert_close(out, torch.arange(12.0).view(1, 3, 4).cumsum(1) / torch.arange(1, 4)[None, :, None])
    with pytest.raises(ValueError) as info:
        reference.linear_attention(q - 40, q - 40, torch.ones(1, 3, 4))  # exp(-70)^2 underflows float32
    message = str(info.value)
    assert "underflow" in message and "float32" in message
    assert "use feature_map='elu+1'" not in message and "(e.g. 'elu+1')" not in message  # what the caller does
    with pytest.raises(ValueError, match="elu\\+1"):  # the identity map is not positive: elu+1 is the advice
        reference.linear_attention(q, -q, torch.ones(1, 3, 4), feature_map="identity")


