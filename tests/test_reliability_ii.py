"""Reliability II: five kinds of failure, each fixed everywhere in the package and pinned here.

1. low-precision numerics in every attention path (float16, bfloat16);
2. configuration values of the wrong container type (a list where a tuple is stored);
3. per-model arguments whose length does not match the ensemble;
4. slider figures that must show each panel exactly as its stand-alone figure;
5. interactive panels that fail loudly and keep their controls valid.

Each kind has one test per reported example, with the right value, and a sweep over the package.
"""
import dataclasses
import importlib
import inspect
import pkgutil

import numpy as np
import pytest
import torch

import lengthgen_utils
from lengthgen_utils import (cache, configs, evaluation, kernel, models, plots, positional, probes, profiles,
                             runners, tasks, theory, training)
from lengthgen_utils.models import KernelHead, RetrievalHead, Transformer
from lengthgen_utils.positional import LearnedAPE
from lengthgen_utils.tasks import DelayedCopy, FixedOffsetRetrieval


def _public_callables():
    """Every public function, class and public method defined in the package: ``(qualified name, callable)``."""
    for info in pkgutil.iter_modules(lengthgen_utils.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"lengthgen_utils.{info.name}")
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            yield f"{info.name}.{name}", obj
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if not attr.startswith("_") and inspect.isfunction(member):
                        yield f"{info.name}.{name}.{attr}", member


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
    ("kernel.carrier_alignment", "offset", lambda v: kernel.carrier_alignment(_head(), v, train_len=8), [1, 2, 3]),
    ("kernel.first_alias_distance", "offset", lambda v: kernel.first_alias_distance(_head(), v, 8, 64), [1, 2, 3]),
    ("theory.exact_target_mass", "offset", lambda v: theory.exact_target_mass(KERNEL, v, [8, 24]), [1, 2, 3]),
    ("theory.mean_field_parameters", "offset", lambda v: theory.mean_field_parameters(KERNEL, v, 8), [1, 2, 3]),
    ("theory.distractor_ratio", "offset", lambda v: theory.distractor_ratio(KERNEL, v), [1, 2, 3]),
    ("theory.mean_field_target_mass", "rho",
     lambda v: theory.mean_field_target_mass([8, 16], torch.ones(M), v), [0.5, 0.25, 1.0]),
    ("theory.mean_field_target_mass", "margin",
     lambda v: theory.mean_field_target_mass([8, 16], v, torch.ones(M)), [0.5, 1.0, 2.0]),
    ("theory.critical_length", "p_star", lambda v: theory.critical_length(v, torch.ones(M), torch.ones(M)),
     [0.1, 0.2, 0.3]),
    ("theory.critical_length", "margin", lambda v: theory.critical_length(torch.full((M,), 0.2), v, torch.ones(M)),
     [0.1, 0.2, 0.3]),
    ("theory.critical_length", "rho", lambda v: theory.critical_length(torch.full((M,), 0.2), torch.ones(M), v),
     [0.1, 0.2, 0.3]),
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
    ("models.Transformer", "seeds", lambda v: Transformer(16, 1, 2, 16, n_models=M, seeds=v), [4, 5, 6]),
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
    ("plots.alias_vs_failure", "alias_distance",
     lambda v: plots.alias_vs_failure(v, [None] * M, ["a", "b", "c"], 64, 256, "t"), [20, None, 30]),
    ("plots.alias_vs_failure", "failure_length",
     lambda v: plots.alias_vs_failure([None] * M, v, ["a", "b", "c"], 64, 256, "t"), [32, None, 64]),
    ("plots.dilution_slider", "measured",
     lambda v: plots.dilution_slider([8, 16], np.array(v)[:, None].repeat(2, 1), ([8, 16], np.full((M, 2), 0.5)),
                                     ([8, 16], np.full((M, 2), 0.5)), ["a", "b", "c"], "t"), [0.5, 0.4, 0.3]),
    ("plots.dilution_slider", "exact",
     lambda v: plots.dilution_slider([8, 16], np.full((M, 2), 0.5), ([8, 16], np.array(v)[:, None].repeat(2, 1)),
                                     ([8, 16], np.full((M, 2), 0.5)), ["a", "b", "c"], "t"), [0.5, 0.4, 0.3]),
    ("plots.dilution_slider", "mean_field",
     lambda v: plots.dilution_slider([8, 16], np.full((M, 2), 0.5), ([8, 16], np.full((M, 2), 0.5)),
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
    "offset": {"configs.RetrievalExperiment", "configs.RetrievalSweep.experiment", "runners.SweepResult.result",
               "runners.OffsetSweepResult.rows", "tasks.FixedOffsetRetrieval", "tasks.DelayedCopy",
               "tasks.LaggedSum", "theory.trained_relative_positions", "theory.min_norm_interpolant",
               "theory.squared_loss_quadratic", "theory.expected_squared_error", "theory.linear_noise_ratio",
               "widgets.RetrievalExplorer"},  # one experiment, task, closed form or control: one offset
    "seed": {"evaluation.accuracy_by_length", "evaluation.squared_error_by_length",
             "evaluation.token_accuracy_by_position", "probes.position_table_gradient",
             "probes.head_offset_profiles", "training.train", "training.train_sequence"},  # one shared data stream
    "seeds": {"runners.OffsetSweepResult"},  # a result's record, filled by the runner
    "task": {"configs.TransformerExperiment", "tasks.shared_task"},  # one experiment / the check itself: one task
    "tokens": {"models.Transformer.forward", "models.Transformer.head_scores", "tasks.Task.targets",
               "tasks.batch_targets", "tasks.query_targets"},  # [B, L] shared by every model
    "weights": {"kernel.participation_ratio"},  # any non-negative weights, no model dimension assumed
    "labels": {"plots.alias_vs_failure", "plots.dilution_slider"},  # define M: the others are checked against them
 "measured": set(), "exact": set(), "mean_field": set(), "alias_distance": set(),
    "failure_length": set(), "margin": set(), "rho": set(), "p_star": set(),
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
        with pytest.raises(ValueError, match=rf"^(\w+ and )?{argument}( and \w+)? must .* one per model.*got .*{len(wrong)}"):
            call(wrong)


@pytest.mark.parametrize("function, call", SHARED_TASK, ids=[f for f, _ in SHARED_TASK])
def test_functions_of_one_shared_task_refuse_a_task_per_model(function, call):
    """A sequence of tasks where one task serves every model raises a TypeError naming ``task`` (it used to
    fail with an AttributeError on the list)."""
    with pytest.raises(TypeError, match="^task must be one Task"):
        call([DelayedCopy(16, 2)] * M)


@pytest.mark.parametrize("function", ["mean_field_parameters", "exact_target_mass", "distractor_ratio",
                                      "target_attention_mass", "carrier_alignment", "first_alias_distance"])
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
        "carrier_alignment": lambda i, k: kernel.carrier_alignment(head if i is None else head.select(i), k, 8),
        "first_alias_distance": lambda i, k: torch.tensor([-1 if d is None else d for d in kernel.first_alias_distance(
            head if i is None else head.select(i), k, 8, 400, tolerance=3.0)]),
    }[function]
    together = calls(None, offsets)
    alone = torch.cat([calls(i, k) for i, k in enumerate(offsets)])
    torch.testing.assert_close(together, alone, rtol=1e-6, atol=1e-9)


def test_seeds_of_a_model_must_be_one_per_model_not_one_for_all():
    """One int for every model's initialisation would make the models identical: refused, naming ``seeds``."""
    with pytest.raises(TypeError, match="^seeds must be 3 ints, one per model; got one int"):
        RetrievalHead(n_models=3, seeds=7)


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
    "models.RetrievalHeadConfig": lambda: models.RetrievalHeadConfig(),
    "models.TransformerConfig": lambda: models.TransformerConfig(),
    "positional.Encoding": lambda: positional.Encoding(),
    "positional.NoPE": lambda: positional.NoPE(),
    "positional.LearnedAPE": lambda: positional.LearnedAPE(),
    "positional.RoPE": lambda: positional.RoPE(),
    "positional.ALiBi": lambda: positional.ALiBi(),
    "profiles.Profile": lambda: profiles.PROFILES["quick"],
    "tasks.FixedOffsetRetrieval": lambda: FixedOffsetRetrieval(),
    "tasks.DelayedCopy": lambda: DelayedCopy(),
    "tasks.LaggedSum": lambda: tasks.LaggedSum(),
    "tasks.RunningParity": lambda: tasks.RunningParity(),
    "tasks.Copy": lambda: tasks.Copy(),
}
NOT_CONFIGS = {"kernel.CarrierSpectrum"}  # a measurement (tensors), never built from user values nor cached


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
    assert sorted(result.accuracy) == [32, 64] and sorted(result.outside) == [32, 64]
    assert result.accuracy[64].shape == (1, 64)
    key = cache.make_key(cache.cache_description(exp, "cpu"))
    assert (tmp_path / f"{key}.pt").exists()
    payload, status = cache.load_or_run(exp, lambda: pytest.fail("a cache hit must not recompute"), cache=tmp_path,
                                        device="cpu")
    assert status == "hit"
