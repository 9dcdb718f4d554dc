"""The recipes and the import rule of ``architecture.md`` ("How the package is built"), run as written.

The page's recipe code blocks are read from the page itself and executed: the new position encoding is
taken through the readable and the fast transformer, the single head, the runners, a probe and a figure;
the new query task through the single-head experiments; the new full-sequence task through the transformer
runner; the new chapter's checks cell through the scoreboard's records. Each check asks for what only the new
class does (its name in the run's records, its bias, its targets), so a recipe that silently fell back to a
built-in encoding or task fails here. The registries are
restored afterwards, so the rest of the suite never sees the recipe's classes.

The last tests check what the page says about imports: the direction between sub-packages, no cycles, and
plotly / ipywidgets in ``book`` only.
"""
import ast
import math
import re
from pathlib import Path

import plotly.graph_objects as go
import pytest
import torch

from lengthgen_utils.analysis.probes import diagonal_spread, position_logits, shift_invariance, shift_logit_difference
from lengthgen_utils.book import figures
from lengthgen_utils.core import encodings, tasks
from lengthgen_utils.core.fast import FastTransformer
from lengthgen_utils.core.models import RetrievalHead, Transformer
from lengthgen_utils.core.tasks import DelayedCopy, FixedOffsetRetrieval
from lengthgen_utils.run.configs import RetrievalExperiment, RetrievalSweep, SingleHeadSettings, TransformerExperiment
from lengthgen_utils.run.evaluation import accuracy_by_length
from lengthgen_utils.run.runners import run_offset_sweep, run_retrieval, run_sweep, run_transformer

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "architecture.md"
PACKAGE = ROOT / "lengthgen_utils"
ENCODING_RECIPE = "Recipe: add a position encoding"
TASK_RECIPE = "Recipe: add a task"
OPTIMIZER_RECIPE = "Recipe: change the optimiser"
CHAPTER_RECIPE = "Recipe: add a chapter with a claim"

# the smallest single head and transformer that train in well under a second
HEAD = dict(n_seeds=2, steps=5, batch_size=8, eval_samples=16, vocab_size=8, train_len=8, d_model=8, d_head=4,
            length_multiples=(1, 2))
TRANSFORMER = dict(n_seeds=2, steps=3, batch_size=4, eval_samples=4, train_len=8, eval_lengths=(8, 16), n_layers=1,
                   n_heads=2, d_model=16)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- reading the page
def sections(text: str) -> dict:
    """``{heading: body}`` for every ``## `` heading of a Markdown page (fenced blocks are not headings)."""
    out, current, fenced = {}, None, False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            current = line[3:].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def python_blocks(body: str) -> list[str]:
    """The fenced ```python blocks of a section, in order."""
    return [m.group(1) for m in re.finditer(r"^```python[ \t]*\n(.*?)^```[ \t]*$", body, re.S | re.M)]


def recipe_blocks(heading: str, expected: int) -> list[str]:
    found = sections(PAGE.read_text())
    if heading not in found:
        raise AssertionError(f"architecture.md has no section '## {heading}'; its sections are {sorted(found)}")
    blocks = python_blocks(found[heading])
    if len(blocks) != expected:
        raise AssertionError(f"'## {heading}' in architecture.md must hold {expected} python block(s); "
                             f"found {len(blocks)}")
    return blocks


def run_blocks(blocks: list[str], heading: str) -> dict:
    namespace = {"__name__": "architecture_recipe"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"architecture.md: '{heading}', block {i + 1}", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def recipes():
    """The recipes' classes, defined and registered by the page's own code; the registries restored after."""
    saved_encodings, saved_tasks = dict(encodings.ENCODINGS), dict(tasks.QUERY_TASKS)
    try:
        found = run_blocks(recipe_blocks(ENCODING_RECIPE, 1), ENCODING_RECIPE)
        found.update(run_blocks(recipe_blocks(TASK_RECIPE, 2), TASK_RECIPE))
        missing = {"LogDistanceBias", "LaggedMax", "SuccessorRetrieval"} - set(found)
        assert not missing, f"the recipes of architecture.md no longer define {sorted(missing)}"
        yield found
    finally:
        encodings.ENCODINGS.clear()
        encodings.ENCODINGS.update(saved_encodings)
        tasks.QUERY_TASKS.clear()
        tasks.QUERY_TASKS.update(saved_tasks)


def test_the_page_has_balanced_fences_and_every_recipe_block():
    fences = [line for line in PAGE.read_text().splitlines() if line.startswith("```")]
    assert len(fences) % 2 == 0, "architecture.md has an unclosed code fence"
    recipe_blocks(ENCODING_RECIPE, 1)
    recipe_blocks(TASK_RECIPE, 2)
    recipe_blocks(OPTIMIZER_RECIPE, 1)
    recipe_blocks(CHAPTER_RECIPE, 1)


def test_the_extraction_fails_loudly_on_a_missing_section_or_block(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("# t\n\n## Recipe: add a task\n\ntext only\n")
    monkeypatch.setitem(globals(), "PAGE", page)
    with pytest.raises(AssertionError, match="must hold 2 python block"):
        recipe_blocks(TASK_RECIPE, 2)
    with pytest.raises(AssertionError, match="no section"):
        recipe_blocks(ENCODING_RECIPE, 1)


# ---------------------------------------------------------------- the new encoding
def log_bias(distance: torch.Tensor, head: int = 0) -> torch.Tensor:
    """What the recipe's encoding adds for head ``head`` at distance ``|j - i|``, written independently."""
    return -(2.0 ** -head) * torch.log1p(distance.abs().double())


def test_the_encoding_is_one_registered_class(recipes):
    cls = recipes["LogDistanceBias"]
    assert encodings.ENCODINGS["log-bias"] is cls and "log-bias" in encodings.encoding_names()
    assert type(encodings.get_encoding("log-bias")) is cls
    assert type(RetrievalExperiment(pe="log-bias").pe) is cls
    assert type(TransformerExperiment(pe="log-bias").pe) is cls


def test_the_encoding_acts_in_the_single_head_and_its_probes(recipes):
    """The head's score row is a constant plus the log-distance bias (its q and k see no position); the probes
    find it relative (constant diagonals, shift-invariant) and find the bias itself off the diagonal."""
    model = RetrievalHead(vocab_size=8, d_model=8, d_head=4, pe="log-bias", max_len=1100, n_models=2)
    assert type(model.encoding) is recipes["LogDistanceBias"]
    with torch.no_grad():
        row = model.scores(20).double()
        logits = position_logits(model, 12).double()
    distance = torch.arange(19, -1, -1)
    torch.testing.assert_close(row - row[:, -1:], log_bias(distance).expand(2, -1), rtol=0, atol=1e-5)
    m = torch.arange(12)
    torch.testing.assert_close(logits - logits.diagonal(dim1=1, dim2=2)[:, :, None],
                               log_bias(m[None, :] - m[:, None]).expand(2, -1, -1), rtol=0, atol=1e-5)
    assert float(diagonal_spread(logits).max()) < 1e-5
    assert float(shift_logit_difference(model, 12, [1, 1000]).max()) < 1e-4
    tokens, _ = FixedOffsetRetrieval(8, 2).sample(4, 12, gen())
    logits, attn = model(tokens)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4))


@pytest.mark.parametrize("seq_len", [12, 40])  # both sides of the fast transformer's switch of attention kernels
def test_the_readable_and_the_fast_transformer_agree_on_the_encoding(recipes, seq_len):
    readable = Transformer(16, 2, 2, 16, pe="log-bias", max_len=64, n_models=2)
    with torch.no_grad():
        for i, p in enumerate(readable.parameters()):  # move every weight off its initial value
            p.add_(0.3 * torch.randn(p.shape, generator=gen(100 + i)))
    fast = FastTransformer(16, 2, 2, 16, pe="log-bias", max_len=64, n_models=2)
    fast.load_state_dict(readable.state_dict())
    nope = Transformer(16, 2, 2, 16, pe="nope", max_len=64, n_models=2)
    nope.load_state_dict(readable.state_dict())
    assert type(fast.encoding) is recipes["LogDistanceBias"]
    tokens, _ = DelayedCopy(16, 3).sample(3, seq_len, gen(1))
    with torch.no_grad():
        ours, theirs, without = readable(tokens), fast(tokens), nope(tokens)
    assert ours.shape == (2, 3, seq_len, 16) and torch.isfinite(ours).all()
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
    assert float((ours - without).abs().max()) > 1e-2  # the bias acts: the same weights without it differ
    assert max(shift_invariance(fast, tokens, (1, 1000)).values()) < 1e-4  # relative, as the class says


def test_the_encoding_runs_through_the_single_head_runners_and_a_figure(recipes, tmp_path):
    cls = recipes["LogDistanceBias"]
    exp = RetrievalExperiment(pe="log-bias", offset=2, **HEAD)
    runs = run_retrieval(exp, cache=tmp_path)
    assert type(runs.pe) is cls and len(runs.where(pe="log-bias")) == exp.n_seeds
    assert type(runs.model.encoding) is cls and runs.cache == {(exp.pe, "softmax"): "miss"}
    assert list(tmp_path.glob("*.pt")), "the run stored nothing in its cache folder"
    again = run_retrieval(exp, cache=tmp_path)
    assert again.cache == {(exp.pe, "softmax"): "hit"} and torch.equal(again.accuracy, runs.accuracy)
    assert runs.accuracy.shape == (exp.n_seeds, 2) and torch.isfinite(runs.loss_history).all()

    sweep = run_offset_sweep(exp, offsets=(1, 2), cache=tmp_path)
    assert all(type(pe) is cls for pe in sweep.label("pe")) and list(sweep.by("offset")) == [1, 2]

    fig = figures.accuracy_vs_length({runs.pe: (runs.lengths, runs.accuracy)}, chance=exp.task.chance,
                                     train_len=exp.train_len, title="log-distance bias")
    assert isinstance(fig, go.Figure) and fig.data
    means = [t for t in fig.data if t.mode == "lines+markers"]
    assert [t.line.color for t in means] == [cls.color] and means[0].name.startswith(cls().label)


def test_the_encoding_runs_through_the_transformer_runner(recipes, tmp_path):
    cls = recipes["LogDistanceBias"]
    exp = TransformerExperiment(pe="log-bias", task=DelayedCopy(8, 2), **TRANSFORMER)
    runs = run_transformer(exp, cache=tmp_path)
    assert type(runs.pe) is cls and type(runs.model.encoding) is cls and isinstance(runs.model, FastTransformer)
    assert runs.accuracy.shape == (exp.n_seeds, 2) and torch.isfinite(runs.loss_history).all()


# ---------------------------------------------------------------- the new tasks
def test_the_query_task_reaches_the_single_head_experiments(recipes, tmp_path):
    """Trained on the successor task, the head answers the successor, not the token itself: the runner trained
    on the recipe's targets, not on fixed-offset retrieval's."""
    cls = recipes["SuccessorRetrieval"]
    assert tasks.QUERY_TASKS["successor"] is cls
    assert SingleHeadSettings(task_family="successor").task_family == "successor"
    exp = RetrievalExperiment(pe="rope", task_family="successor", offset=1,
                              **{**HEAD, "steps": 200, "batch_size": 64, "eval_samples": 256, "vocab_size": 16})
    assert type(exp.task) is cls and (exp.task.vocab_size, exp.task.offset) == (16, 1)
    runs = run_retrieval(exp, cache=tmp_path)
    assert all(type(task) is cls for task in runs.label("task"))
    assert float(runs.accuracy[:, 0].min()) >= 0.9, runs.accuracy
    plain = accuracy_by_length(runs.model, FixedOffsetRetrieval(16, 1), [exp.train_len], n_samples=256)
    assert float(plain.max()) <= 0.2, plain  # the successor, not the token

    sweep = run_offset_sweep(RetrievalExperiment(task_family="successor", **HEAD), offsets=(1, 2), cache=tmp_path)
    assert [(type(t), t.offset) for t in sweep.label("task")] == [(cls, 1), (cls, 1), (cls, 2), (cls, 2)]
    both = run_sweep(RetrievalSweep(pes=("rope", "nope"), offsets=(2,), task_family="successor", **HEAD),
                     cache=tmp_path)
    assert all(type(t) is cls for t in both.label("task")) and len(both.by("pe")) == 2


def test_an_unregistered_task_family_is_refused_by_name(recipes):
    with pytest.raises(ValueError, match="task_family"):
        RetrievalExperiment(task_family="no-such-task")
    with pytest.raises(TypeError, match="task_family"):
        RetrievalSweep(task_family=recipes["SuccessorRetrieval"])


def test_the_full_sequence_task_reaches_the_transformer_runner(recipes, tmp_path):
    """The task's own scoring pattern comes back from the runner: nothing scored before position 5."""
    cls = recipes["LaggedMax"]
    task = cls(8)
    tokens, targets = task.sample(3, 12, gen(2))
    torch.testing.assert_close(targets[:, 5:], torch.maximum(tokens[:, 3:10], tokens[:, 0:7]))
    scored = targets != tasks.IGNORE_INDEX
    assert torch.equal(task.scored_positions(12), scored.any(0)) and torch.equal(scored.all(0), scored.any(0))
    exp = TransformerExperiment(pe="rope", task=task, **TRANSFORMER)
    runs = run_transformer(exp, cache=tmp_path)
    assert all(type(t) is cls for t in runs.label("task"))
    for L in exp.eval_lengths:
        counts = runs.counts[L]
        assert (counts[:5] == 0).all() and (counts[5:] > 0).all(), counts
        assert torch.isnan(runs.per_position[L][:, :5]).all()
    assert math.isclose(task.chance, 1 / 8)


# ---------------------------------------------------------------- the new optimiser
def test_the_optimizer_recipe_trains_with_its_rule_through_the_experiment(tmp_path):
    """The page's rule is the one that trains: the runner's head equals a head trained by torch's Adagrad
    on the same stream, and differs from the book's Adam head; the registry is restored afterwards."""
    from lengthgen_utils.run import optim
    from lengthgen_utils.run.runners import build_model
    from lengthgen_utils.run.training import train

    saved = dict(optim.OPTIMIZERS)
    try:
        found = run_blocks(recipe_blocks(OPTIMIZER_RECIPE, 1), OPTIMIZER_RECIPE)
        assert "adagrad" in optim.OPTIMIZERS and callable(found["adagrad"])
        exp = RetrievalExperiment(pe="rope", offset=2, optimizer="adagrad", lr=0.1, **HEAD)
        runs = run_retrieval(exp, cache=tmp_path)
        built = optim.build_optimizer(build_model(exp), exp.optimizer_settings)
        assert type(built) is torch.optim.Adagrad

        by_hand = build_model(exp)
        original = optim.OPTIMIZERS.pop("adagrad")  # train it with torch's Adagrad, not through the page's rule
        optim.OPTIMIZERS["by-hand"] = optim.Rule(lambda groups, s: torch.optim.Adagrad(by_hand.parameters(), lr=0.1))
        train(by_hand, exp.task, optim.OptimizerSettings("by-hand", lr=0.1), steps=exp.steps,
              batch_size=exp.batch_size, train_len=exp.train_len, seed=exp.data_seed, device="cpu")
        optim.OPTIMIZERS["adagrad"] = original
        for (name, a), b in zip(runs.model.named_parameters(), by_hand.parameters()):
            torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=0, atol=1e-6, msg=name)
        adam = run_retrieval(RetrievalExperiment(pe="rope", offset=2, lr=0.1, **HEAD), cache=tmp_path)
        assert not torch.allclose(adam.model.w_q, runs.model.w_q)
    finally:
        optim.OPTIMIZERS.clear()
        optim.OPTIMIZERS.update(saved)


# ---------------------------------------------------------------- the new chapter with a claim
def test_the_chapter_recipe_records_a_claim_whose_status_its_checks_derive(tmp_path, monkeypatch):
    """The page's checks cell, run as a chapter of a run of its own: its claim reaches the scoreboard's records
    with the status its evidence derives; with the trained heads no better than their null the checks stop
    the chapter and no claim is left; a status the evidence does not give is written beside it and refused."""
    from lengthgen_utils.book import scoreboard

    monkeypatch.setenv(scoreboard.CLAIMS_ENV, str(tmp_path / "claims"))
    monkeypatch.setenv(scoreboard.RUN_ENV, "recipe-chapter")
    (block,) = recipe_blocks(CHAPTER_RECIPE, 1)
    run_blocks([block], CHAPTER_RECIPE)
    record = scoreboard.load_claims()["X:a-finding"]
    assert record["status"] == "reproduced" and record["derived"] and record["chapter"] == "chapters/11_a_finding"
    assert [(e["name"], e["role"], e["passed"]) for e in record["evidence"]] == [
        ("trained heads: seeds at >= 0.9 at 2x, over untrained ones", "for", True)]  # the code check is not evidence

    no_better = block.replace("null = [False, False, True, False, False, False, False, False]",
                              "null = [True, True, True, False, True, True, True, True]")
    assert no_better != block
    with pytest.raises(AssertionError, match="trained heads: seeds at >= 0.9 at 2x"):
        run_blocks([no_better], CHAPTER_RECIPE)
    assert "X:a-finding" not in scoreboard.load_claims()

    overstated = block.replace('"X:a-finding", "reproduced",', '"X:a-finding", "reproduced in a regime",')
    assert overstated != block
    with pytest.raises(ValueError, match="states 'reproduced in a regime' but its evidence gives 'reproduced'"):
        run_blocks([overstated], CHAPTER_RECIPE)
    record = scoreboard.load_claims()["X:a-finding"]
    assert (record["stated"], record["status"]) == ("reproduced in a regime", "reproduced")


# ---------------------------------------------------------------- the import rule the page states
EXCEPTIONS = {("analysis.probes", "run.training")}  # the one import of a module drawn below, named on the page


def drawn_order() -> dict:
    """``{module: rank}`` from the page's drawing of the package: the sub-packages (``core/``) and their modules
    (one per line, ``chNN`` standing for every chapter module), top to bottom. A package itself ranks with its
    heading."""
    found = sections(PAGE.read_text())["The modules and the data flow"]
    drawing = re.search(r"^```text\n(.*?)^```", found, re.S | re.M)
    assert drawing, "the data-flow section of architecture.md has no text block"
    order, package = {}, None
    for line in drawing.group(1).splitlines():
        if m := re.match(r"^  (\w+)/\s", line):
            package = m.group(1)
            order[package] = len(order)
        elif (m := re.match(r"^    (\w+)\s{2,}\S", line)) and package:
            order[f"{package}.{m.group(1)}"] = len(order)
    assert {"core.tasks", "core.fast", "analysis.kernel", "run.results", "book.figures", "tools.cli"} <= set(order), \
        f"the drawing of architecture.md lost modules: {sorted(order)}"
    return order


def drawn_rank(order: dict, module: str) -> int | None:
    if re.fullmatch(r"book\.ch\d\d[a-z]?", module):  # ch05b: a chapter between 5 and 6
        module = "book.chNN"
    if module == "__main__":
        return len(order)  # the command line's entry point, below everything
    return order.get(module)


def module_imports() -> dict:
    """``{module: {imported package module, ...}}`` from the source (imports inside functions included)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        package = parts[:-1]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[:len(package) - (node.level - 1)]
                if node.module:
                    deps.add(".".join(base + node.module.split(".")))
                else:
                    deps.update(".".join(base + [a.name]) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lengthgen_utils"):
                deps.add(node.module[len("lengthgen_utils."):])
            elif isinstance(node, ast.Import):
                deps.update(a.name[len("lengthgen_utils."):] for a in node.names
                            if a.name.startswith("lengthgen_utils."))
        found[name] = {d for d in deps if d}
    return found


def test_every_module_is_drawn_and_imports_only_modules_drawn_above_it():
    order, imports = drawn_order(), module_imports()
    undrawn = sorted(m for m in imports if m not in ("", "_validate") and drawn_rank(order, m) is None)
    assert not undrawn, f"modules missing from the drawing in architecture.md: {undrawn}"
    gone = sorted(m for m in order if m != "book.chNN" and m not in imports)
    assert not gone, f"architecture.md draws modules the package does not have: {gone}"
    below = set()
    for m, deps in imports.items():
        for d in deps - {"", "_validate", "__version__"}:
            mine, theirs = drawn_rank(order, m), drawn_rank(order, d)
            if theirs > mine or (theirs == mine and not m.startswith("book.ch")):
                below.add((m, d))
    assert below == EXCEPTIONS, f"imports of modules drawn below (or beside) the importer: {sorted(below)}"


def test_the_package_has_no_import_cycle():
    imports = module_imports()
    known = {m: {d for d in deps if d in imports and d != m} for m, deps in imports.items()}
    done, active = set(), []

    def visit(m):
        if m in active:
            raise AssertionError(f"import cycle: {' -> '.join(active[active.index(m):] + [m])}")
        if m not in done:
            active.append(m)
            for d in sorted(known[m]):
                visit(d)
            active.pop()
            done.add(m)

    for m in sorted(known):
        visit(m)


def test_only_the_book_imports_plotly_or_ipywidgets():
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "book":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            outside += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in ("plotly", "ipywidgets")]
    assert not outside, outside
