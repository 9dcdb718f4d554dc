"""Per-model arguments whose length does not match the ensemble, refused everywhere.
"""
import inspect

import numpy as np
import pytest
import torch

from lengthgen_utils.analysis import implicit_bias, kernel, probes, theory
from lengthgen_utils.book import ch04, ch05
from lengthgen_utils.core import models, tasks
from lengthgen_utils.core.encodings import LearnedAPE
from lengthgen_utils.core.fast import FastTransformer
from lengthgen_utils.core.models import (
    ContentRetrievalHead,
    KernelHead,
    RetrievalHead,
    SingleHead,
    Transformer,
)
from lengthgen_utils.core.tasks import DelayedCopy, FixedOffsetRetrieval
from lengthgen_utils.run import evaluation, training
from tests.package_walk import public_callables


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
    ("models.SingleHead", "seeds", lambda v: SingleHead(n_models=M, seeds=v), [4, 5, 6]),
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
    ("models.RetrievalHead.query_attention", "tokens",
     lambda v: _head().query_attention(torch.as_tensor(v)[:, None, None].expand(-1, 2, 8)), [0, 1, 2]),
    ("models.ContentRetrievalHead.query_attention", "tokens",
     lambda v: ContentRetrievalHead(n_models=M).query_attention(torch.as_tensor(v)[:, None, None].expand(-1, 2, 8)),
     [0, 1, 2]),
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
               "implicit_bias.linf_max_margin_kernel",  # chapter 5c: one closed-form kernel, one offset
               "ch01.halved_head_numbers"},  # chapter 1's exercise: one offset for both d_head runs
    "seeds": {  # a result's record, filled by the runner
              "live.accuracy_panel",  # the range of a live panel's seed slider
              "ch06.random_start"},  # chapter 6's exercise: one seed per head, the list defines M
    # the weights of alignment are a [N, P] matrix checked by shape against the spectrum's rows
    "task": {"configs.TransformerExperiment", "tasks.shared_task", "evaluation.lag_agreement", "probes.head_carriers",
             "probes.copy_head_placement", "probes.copying_head_reads",
             "ch08.copy_by_length",  # one experiment / the check itself: one task
             "runners.recurrent_accuracy"},  # handed on to accuracy_by_length, whose per-model tasks are walked
    "tokens": {"models.Transformer.forward", "models.Transformer.head_scores", "fast.FastTransformer.forward",
               "fast.FastTransformer.head_scores", "models.LinearRNN.states", "tasks.Task.targets",
               "tasks.query_targets",
               "bench.PlainGPT.forward", "bench.PlainHead.forward"},  # [B, L] shared by every model (the benchmark's peer: one model)
    "weights": {"kernel.participation_ratio", "kernel.alignment"},  # any non-negative weights, no model dimension assumed
    # a null's seed (one random stream for every draw), per-head labels and margins of figures whose length
    # defines M, and a result's record filled by the runner
    "seed": {"evaluation.accuracy_by_length", "evaluation.squared_error_by_length",
             "evaluation.token_accuracy_by_position", "probes.position_table_gradient",
             "probes.head_offset_profiles", "training.train", "training.train_sequence", "kernel.shuffled_phases",
             "evaluation.lag_agreement", "probes.head_carriers", "probes.copy_head_placement",
             "probes.copying_head_reads", "ch09.shift_violation", "bench.tf_batches", "seeding.effective_seed",
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
               "ch05c.CellSummary",  # a record filled by ch05c.summarise
               "ch05b.CellReport"},  # a record filled by ch05b.cell_report
    "rho": set(), "p_star": {"ch05b.CellReport"},
}


def test_every_per_model_argument_of_the_package_is_walked():
    """Discovery: every public function with a per-model-sounding argument is in the walk, or is documented
    above as taking one value (so a new per-model function cannot be missed)."""
    walked = {(f, a) for f, a, _, _ in PER_MODEL} | {(f, "task") for f, _ in SHARED_TASK}
    found = set()
    for qualname, obj in public_callables():
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


