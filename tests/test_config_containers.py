"""Configuration values of the wrong container type (a list where a tuple is stored), in every configuration.
"""
import dataclasses
import inspect

import pytest

from lengthgen_utils.core import encodings, models, tasks
from lengthgen_utils.core.tasks import DelayedCopy, FixedOffsetRetrieval
from lengthgen_utils.run import cache, configs, profiles, runners, training
from tests.package_walk import public_callables


# ================================================================ 2. configuration values of the wrong container type
def _config_classes():
    """Every frozen dataclass of the package (configurations, encodings, tasks, profiles): ``{name: class}``."""
    return {name: obj for name, obj in public_callables()
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
# measurements (tensors, per-head lists, chapter 5c's tests and sentences), never built from user values nor cached;
# optim.Rule: a registry entry made by register_optimizer, never from user values
NOT_CONFIGS = {"kernel.CarrierSpectrum", "kernel.CarrierMeasures", "kernel.CarrierFit", "falls.AliasReport",
               "optim.Rule", "ch05c.InitScaleComparison", "ch05b.CellReport"}


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


