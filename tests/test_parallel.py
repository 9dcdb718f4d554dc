"""Independent single-head computations on several CPU threads (run.parallel, runners.run_many).

A code test: the parallel schedule must give, bit for bit, what a plain loop gives (the results and
the cache entries), keep every operation on one intra-op thread, refuse a computation that asks for
more, and report bad arguments by name.
"""
import pytest
import torch

from lengthgen_utils.run import parallel, runners
from lengthgen_utils.run.configs import RetrievalExperiment, RetrievalSweep
from lengthgen_utils.run.profiles import get_profile
from lengthgen_utils.run.training import THREADS_ENV, cpu_threads


def _experiments(steps=60):
    profile = get_profile("quick")
    return {pe: RetrievalExperiment.from_profile(profile, pe=pe, offset=3, n_seeds=2, steps=steps,
                                                 eval_samples=64)
            for pe in ("rope", "ape", "nope")}


def test_run_many_equals_a_loop_bit_for_bit():
    exps = _experiments()
    loop = {name: runners.run_retrieval(exp, cache=False) for name, exp in exps.items()}
    many = runners.run_many(runners.run_retrieval, exps, cache=False)
    assert list(many) == list(exps)
    for name in exps:
        assert torch.equal(loop[name].accuracy, many[name].accuracy)
        assert torch.equal(loop[name].loss_history, many[name].loss_history)
        for a, b in zip(loop[name].model.state_dict().values(), many[name].model.state_dict().values()):
            assert torch.equal(a, b)


def test_run_sweep_in_parallel_equals_one_at_a_time(tmp_path, monkeypatch):
    sweep = RetrievalSweep.from_profile(get_profile("quick"), offsets=(1, 3), n_seeds=2, steps=60,
                                        eval_samples=64, pes=("rope", "ape"))
    monkeypatch.setattr(runners, "parallel_workers", lambda device=None: 1)
    one = runners.run_sweep(sweep, cache=tmp_path / "one")
    monkeypatch.undo()
    both = runners.run_sweep(sweep, cache=tmp_path / "both")
    assert torch.equal(one.accuracy, both.accuracy)
    assert torch.equal(one.loss_history, both.loss_history)
    # the same cache keys: an entry written by either schedule serves the other
    assert sorted(p.name for p in (tmp_path / "one").glob("*.pt")) == \
        sorted(p.name for p in (tmp_path / "both").glob("*.pt"))


def test_every_call_runs_on_one_thread_and_the_count_is_restored():
    before = torch.get_num_threads()
    seen = parallel.parallel_map(lambda _: torch.get_num_threads(), range(4), workers=2)
    assert seen == [1, 1, 1, 1]
    assert torch.get_num_threads() == before


def test_a_computation_asking_for_two_threads_inside_the_map_is_refused():
    def transformer_like(_):
        with cpu_threads(2):
            return 0

    with pytest.raises(RuntimeError, match="inside parallel_map asked for 2 intra-op threads"):
        parallel.parallel_map(transformer_like, range(2), workers=2)
    with cpu_threads(1):  # outside a map, any count is allowed
        pass


def test_results_keep_the_order_of_the_items_and_the_first_error_is_raised():
    assert parallel.parallel_map(lambda x: x * x, range(7), workers=2) == [x * x for x in range(7)]

    def fail_on_three(x):
        if x == 3:
            raise KeyError(x)
        return x

    with pytest.raises(KeyError):
        parallel.parallel_map(fail_on_three, range(6), workers=2)


def test_nested_maps_run_their_items_one_by_one():
    inner = parallel.parallel_map(lambda x: parallel.parallel_map(lambda y: y + x, range(3)), range(2), workers=2)
    assert inner == [[0, 1, 2], [1, 2, 3]]


def test_workers_follow_the_thread_setting(monkeypatch):
    monkeypatch.setenv(THREADS_ENV, "2")  # the single head on two threads: nothing left to share
    assert parallel.parallel_workers("cpu") == 1
    monkeypatch.setenv(THREADS_ENV, "1")
    assert parallel.parallel_workers("cpu") >= 1


@pytest.mark.parametrize("workers, error, message", [
    (0, ValueError, "workers"), (1.5, TypeError, "workers"), ("2", TypeError, "workers")])
def test_bad_workers_are_refused_by_name(workers, error, message):
    with pytest.raises(error, match=message):
        parallel.parallel_map(abs, [1, 2], workers=workers)


def test_bad_arguments_of_run_many_are_refused_by_name():
    with pytest.raises(TypeError, match="runner must be callable"):
        runners.run_many("run_retrieval", {})
    with pytest.raises(TypeError, match="experiments must be a dict"):
        runners.run_many(runners.run_retrieval, list(_experiments().values()))
    with pytest.raises(TypeError, match="fn must be callable"):
        parallel.parallel_map(None, [1])
