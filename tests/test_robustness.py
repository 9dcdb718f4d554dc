"""Verdicts that hold on any machine: the seed base, the checks' margins, the robustness run, runs of their own.

* ``LENGTHGEN_SEED`` moves every random draw to a disjoint seed set and is part of every cache key;
* every process-wide numeric setting a computation depends on is part of the cache key;
* a check records its value, threshold and margin, and a failing checks cell names every failed check;
* each run (a build, a test session, a robustness condition) keeps its claims records to itself;
* the robustness run's conditions and its report;
* a closed form that sat on a float-rounding edge (chapter 6's NaN on one CPU and not another).
"""
import json
import math

import pytest
import torch

from lengthgen_utils.run import cache
from lengthgen_utils.core import seeding
from lengthgen_utils.book import checks, scoreboard
from lengthgen_utils.tools import robustness
from lengthgen_utils.analysis import theory
from lengthgen_utils.run.configs import RetrievalExperiment
from lengthgen_utils.run.evaluation import accuracy_by_length
from lengthgen_utils.core.models import RetrievalHead
from lengthgen_utils.core.encodings import WELL_CONDITIONED_FREQUENCIES
from lengthgen_utils.core.rope import kernel_frequencies
from lengthgen_utils.run.profiles import get_profile
from lengthgen_utils.core.tasks import FixedOffsetRetrieval
from lengthgen_utils.run.training import train


# ---------------------------------------------------------------- the seed base
@pytest.mark.parametrize("value", ["-1", "abc", "1.5", "0x3", " 2 3"])
def test_a_bad_seed_base_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(seeding.SEED_ENV, value)
    with pytest.raises(ValueError, match=r"\$LENGTHGEN_SEED must be an integer >= 0") as err:
        seeding.seed_base()
    assert repr(value) in str(err.value)
    with pytest.raises(ValueError, match="LENGTHGEN_SEED"):
        get_profile("quick")  # a chapter's first cell fails, naming the variable


def test_seed_base_zero_is_the_book_as_it_was(monkeypatch):
    monkeypatch.delenv(seeding.SEED_ENV, raising=False)
    assert seeding.seed_base() == 0
    a = torch.randn(5, generator=seeding.generator(7))
    b = torch.randn(5, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


def test_another_seed_base_moves_initialisation_training_stream_and_evaluation(monkeypatch):
    def run():
        model = RetrievalHead(n_models=2)
        init = model.w_q.detach().clone()
        history = train(model, FixedOffsetRetrieval(16, 3), steps=3, batch_size=8)
        acc = accuracy_by_length(model, FixedOffsetRetrieval(16, 3), [16], n_samples=64)
        return init, history, acc

    monkeypatch.setenv(seeding.SEED_ENV, "0")
    init0, hist0, _ = run()
    monkeypatch.setenv(seeding.SEED_ENV, "1")
    init1, hist1, _ = run()
    assert not torch.equal(init0, init1)
    assert not torch.equal(hist0, hist1)
    # the sequences an evaluation draws move too
    gen0 = torch.Generator().manual_seed(12345)
    assert not torch.equal(torch.randint(16, (20,), generator=seeding.generator(12345)),
                           torch.randint(16, (20,), generator=gen0))


def test_seed_bases_never_share_a_seed():
    largest_logical = 1_000_000 + 10_000  # chapter 4's nulls start at 1_000_000
    assert seeding.SEED_STRIDE > largest_logical
    with pytest.raises(ValueError, match="seed must be in"):
        seeding.effective_seed(seeding.SEED_STRIDE)


def test_seed_base_is_part_of_the_cache_key(monkeypatch):
    exp = RetrievalExperiment(n_seeds=1, steps=1)
    monkeypatch.setenv(seeding.SEED_ENV, "0")
    key0 = cache.make_key(cache.cache_description(exp, "cpu", 1))
    monkeypatch.setenv(seeding.SEED_ENV, "2")
    key2 = cache.make_key(cache.cache_description(exp, "cpu", 1))
    assert key0 != key2


# ---------------------------------------------------------------- process-wide numeric settings in the key
def _key():
    return cache.make_key(cache.cache_description(RetrievalExperiment(n_seeds=1, steps=1), "cpu", 1))


@pytest.mark.parametrize("setting", ["default_dtype", "flush_denormal", "matmul_precision", "deterministic",
                                     "mkldnn", "cpu_capability"])
def test_every_numeric_setting_a_run_depends_on_is_part_of_the_cache_key(monkeypatch, setting):
    before = _key()
    if setting == "default_dtype":
        monkeypatch.setattr(torch, "get_default_dtype", lambda: torch.float64)
    elif setting == "flush_denormal":
        torch.set_flush_denormal(True)
    elif setting == "matmul_precision":
        monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "medium")
    elif setting == "deterministic":
        monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    elif setting == "mkldnn":
        monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    else:
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    try:
        assert _key() != before, setting
    finally:
        torch.set_flush_denormal(False)


# ---------------------------------------------------------------- checks with margins
@pytest.fixture
def run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(scoreboard.CLAIMS_ENV, str(tmp_path))
    monkeypatch.setenv(scoreboard.RUN_ENV, "test-run")
    return tmp_path / "test-run"


def test_checks_keep_value_threshold_and_margin(run_folder):
    c = checks.Checks("chapters/99_example")
    assert c.at_least("a", torch.tensor(0.97), 0.95)
    assert c.at_most("b", 0.02, 0.1, code=True)
    assert c.below("c", 0.3, 0.5) and c.above("d", 2, 1)
    assert c.holds("e", torch.tensor(True))
    c.finish()
    record = json.loads((run_folder / "checks" / "chapters__99_example.json").read_text())
    by_name = {r["name"]: r for r in record["checks"]}
    assert by_name["a"]["margin"] == pytest.approx(0.02, abs=1e-6)
    assert by_name["b"]["margin"] == pytest.approx(0.08) and by_name["b"]["kind"] == "code"
    assert by_name["e"]["margin"] is None and record["run"] == "test-run"


def test_a_failing_checks_cell_names_every_failed_check_and_still_records_them(run_folder):
    c = checks.Checks("chapters/99_example")
    c.at_least("fits", 0.5, 0.95)
    c.at_most("near chance", 0.01, 0.1)
    c.at_least("nan fails", float("nan"), 0.0)
    with pytest.raises(AssertionError) as err:
        c.finish()
    assert "2 of 3 checks failed" in str(err.value)
    assert "fits" in str(err.value) and "nan fails" in str(err.value)
    record = json.loads((run_folder / "checks" / "chapters__99_example.json").read_text())
    assert [r["passed"] for r in record["checks"]] == [False, True, False]
    assert record["checks"][2]["value"] is None  # NaN is stored as null: strict JSON


def test_checks_refuse_a_tensor_of_many_values_and_a_repeated_name():
    c = checks.Checks("chapters/99_example")
    with pytest.raises(TypeError, match="one number"):
        c.at_least("x", torch.ones(3), 0.5)
    c.at_least("y", 1, 0)
    with pytest.raises(ValueError, match="two checks are named 'y'"):
        c.at_most("y", 1, 2)


# ---------------------------------------------------------------- a run's records are its own
def test_records_of_another_run_are_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv(scoreboard.CLAIMS_ENV, str(tmp_path))
    monkeypatch.setenv(scoreboard.RUN_ENV, "build-a")
    scoreboard.record_claim("C1", "reproduced", "x", {"n": 1}, chapter="chapters/01_retrieval_task")
    monkeypatch.setenv(scoreboard.RUN_ENV, "pytest-b")
    assert scoreboard.load_claims() == {}  # another run's folder: nothing of build-a shows
    scoreboard.record_claim("C2", "reproduced", "y", {"n": 2}, chapter="chapters/02_rope_equivariance")
    # a record of build-a copied into pytest-b's folder is refused, by name
    (tmp_path / "pytest-b" / "C1.json").write_text((tmp_path / "build-a" / "C1.json").read_text())
    with pytest.warns(RuntimeWarning, match="C1.json.*belongs to run 'build-a'"):
        loaded = scoreboard.load_claims()
    assert list(loaded) == ["C2"]


def test_records_follow_the_book_being_run_not_the_imported_package(tmp_path, monkeypatch):
    book = tmp_path / "other-checkout"
    (book / "chapters").mkdir(parents=True)
    (book / "_toc.yml").write_text("format: jb-book\nroot: intro\n")
    monkeypatch.delenv(scoreboard.CLAIMS_ENV, raising=False)
    monkeypatch.chdir(book / "chapters")  # a chapter runs in its own folder
    assert scoreboard.claims_dir() == book / "_build" / "claims"


def test_a_claims_path_with_a_tilde_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(scoreboard.CLAIMS_ENV, "~/lg-claims")
    assert scoreboard.claims_dir() == tmp_path / "lg-claims"


@pytest.mark.parametrize("value", ["../up", "a/b", "-x", "x" * 101])
def test_a_run_id_that_is_not_a_folder_name_is_refused(monkeypatch, value):
    monkeypatch.setenv(scoreboard.RUN_ENV, value)
    with pytest.raises(ValueError, match="LENGTHGEN_RUN_ID"):
        scoreboard.run_id()


# ---------------------------------------------------------------- the robustness run
def test_the_conditions_cover_cpu_kernels_thread_counts_and_three_seed_bases():
    names = [c.name for c in robustness.conditions()]
    assert names[0] == "machine"
    assert "kernels=DEFAULT" in names
    assert {"threads=1", "threads=2"} <= set(names)
    assert sum(n.startswith("seed=") for n in names) >= 3
    native = torch.backends.cpu.get_cpu_capability().upper()
    assert f"kernels={native}" not in names  # the machine condition is the native kernels
    combined = [c for c in robustness.conditions((61, 62)) if c.name == "seed=62+kernels=DEFAULT+threads=2"]
    assert len(combined) == 1 and combined[0].env == {"LENGTHGEN_SEED": "62", "ATEN_CPU_CAPABILITY": "default",
                                                       "LENGTHGEN_THREADS": "2"}


def test_the_report_shows_pass_fail_ranges_and_margins():
    def check(name, value, threshold, passed):
        return {"name": name, "op": ">=", "value": value, "threshold": threshold, "margin": value - threshold,
                "passed": passed, "kind": "evidence", "detail": None}

    results = {"machine": {"01_x": {"error": None, "checks": [check("acc", 0.99, 0.95, True)]}},
               "seed=1": {"01_x": {"error": "AssertionError", "checks": [check("acc", 0.90, 0.95, False)]}}}
    text = robustness.report(results, ["machine", "seed=1"])
    assert "| 01_x | pass | **FAIL 1** |" in text
    assert "| 01_x | acc | evidence | >= 0.95 | 0.9 .. 0.99 | -0.05 | 0/1 | seed=1 |" in text  # 0 of 1 seed base
    assert "-5%" in text  # the smallest relative margin

    exact = dict(check("same twice", 0.0, 0.0, True), op="<=", kind="code")  # margin 0 by construction
    results["machine"]["01_x"]["checks"].append(exact)
    results["seed=1"]["01_x"]["checks"].append(exact)
    text = robustness.report(results, ["machine", "seed=1"])
    assert "| 01_x | -5% | acc |" in text  # the chapter's smallest margin is its evidence's, not the code check's


def test_the_running_page_section_is_replaced_between_its_markers_only(tmp_path):
    page = tmp_path / "running.md"
    page.write_text(f"before\n{robustness.START}\nold table\n{robustness.END}\nafter\n")
    section = robustness.running_section("| new | table |", "robustness --chapters 05c", 12.0, "2 CPU cores")
    robustness.update_running(section, page)
    text = page.read_text()
    assert text.startswith("before\n") and text.endswith("\nafter\n") and "old table" not in text
    assert "| new | table |" in text and "robustness --chapters 05c" in text and text.count(robustness.START) == 1
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="robustness:start"):
        robustness.update_running(section, page)


# ---------------------------------------------------------------- a closed form on a rounding edge
@pytest.mark.parametrize("nudge", [-2, -1, 0, 1, 2])
def test_gradient_descent_closed_form_is_finite_at_a_step_size_on_the_edge(nudge):
    """Chapter 6 uses lr = 0.5 / lambda_max, where 2 lr lambda_max = 1 up to one rounding: on one CPU it
    came out a hair above 1 and the closed form was NaN (log1p of a negative number below -1)."""
    theta = kernel_frequencies(16, 10000.0, WELL_CONDITIONED_FREQUENCIES)
    h, b, _ = theory.squared_loss_quadratic(16, 3, 16, 16, frequencies=theta)
    lam_max = float(torch.linalg.eigvalsh(h).max())
    lr = 0.5 / lam_max
    for _ in range(abs(nudge)):
        lr = math.nextafter(lr, math.inf if nudge > 0 else 0.0)
    c = theory.gradient_descent_kernel(h, b, lr, 500)
    iterate = torch.zeros(16, dtype=torch.float64)
    for _ in range(500):
        iterate = iterate - lr * 2 * (h @ iterate - b)
    assert torch.isfinite(c).all()
    torch.testing.assert_close(c, iterate, rtol=1e-9, atol=1e-12)


def test_starting_a_run_removes_its_own_records_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setenv(scoreboard.CLAIMS_ENV, str(tmp_path))
    monkeypatch.setenv(scoreboard.RUN_ENV, "build-x")
    c = checks.Checks("chapters/01_retrieval_task")
    c.at_least("a", 1, 0)
    c.finish()  # a chapter's checks, then its claim (finish removes the chapter's earlier claims of the run)
    scoreboard.record_claim("C1", "reproduced", "x", {"n": 1}, chapter="chapters/01_retrieval_task")
    mine = tmp_path / "build-x" / "notes.json"
    mine.write_text('{"a user": "file"}')
    (tmp_path / "other-run").mkdir()
    (tmp_path / "other-run" / "C1.json").write_text("{}")
    assert scoreboard.clear_run() == 2
    assert mine.exists() and (tmp_path / "other-run" / "C1.json").exists()
    assert not (tmp_path / "build-x" / "C1.json").exists()
