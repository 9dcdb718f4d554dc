"""Numeric types from other libraries (numpy scalars) in every configuration.
"""
import dataclasses

import numpy as np
import pytest

from lengthgen_utils.run import cache, configs, profiles
from lengthgen_utils.tools import cli as cli
from tests.test_config_containers import CONFIG_EXAMPLES, NOT_CONFIGS, _config_classes


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


