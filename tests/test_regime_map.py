"""The regime map (chapter 5b): the head whose keys see the token, the attention's vote, the rules that score
predictors, the classification of falls and the map's configuration."""
import math

import numpy as np
import pytest
import torch

from lengthgen_utils.analysis import falls
from lengthgen_utils.analysis.theory import balanced_agreement
from lengthgen_utils.run.evaluation import attention_vote
from lengthgen_utils.book import ch05b
from lengthgen_utils.book.scoreboard import chapter_link
from lengthgen_utils.core.models import ContentRetrievalHead, KernelHead, RetrievalHead
from lengthgen_utils.core.tasks import FixedOffsetRetrieval
from lengthgen_utils.run.configs import RegimeMap, RetrievalSweep, SnapshotSweep, regime_map
from lengthgen_utils.run.evaluation import accuracy_by_length, target_attention_mass
from lengthgen_utils.run.profiles import get_profile


def _tokens(b=5, seq_len=11, seed=0, vocab=16):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (b, seq_len), generator=g)
    tokens[:, -1] = vocab  # the query token
    return tokens


@pytest.mark.parametrize("pe", ["rope", "ape", "alibi", "nope"])
def test_content_head_without_token_content_is_the_position_only_head(pe):
    """With every token embedding equal, keys carry no token: the content head computes RetrievalHead's
    row and logits (the two share their parameters)."""
    content = ContentRetrievalHead(n_models=3, seeds=[0, 1, 2], pe=pe)
    plain = RetrievalHead(n_models=3, seeds=[0, 1, 2], pe=pe)
    plain.load_state_dict(content.state_dict())
    with torch.no_grad():
        for m in (content, plain):
            m.embed.zero_()
        tokens = _tokens()
        (lc, ac), (lp, ap) = content(tokens), plain(tokens)
    assert ac.shape == ap.shape == (3, 5, 11)
    assert torch.allclose(ac, ap, atol=1e-6) and torch.allclose(lc, lp, atol=1e-6)


def test_content_head_matches_a_per_sequence_reference():
    """Every logit is q_{L-1} . k_j / sqrt(d_head) with q and k from u + E[x] + e_t, rotated at their positions
    (computed here one sequence at a time, with the encoding's own rotation)."""
    model = ContentRetrievalHead(n_models=2, seeds=[3, 4], pe="rope")
    tokens = _tokens(b=4, seq_len=9, seed=1)
    with torch.no_grad():
        _, attn = model(tokens)
        positions = torch.arange(9)
        for m in range(2):
            for b in range(4):
                x = model.u[m] + model.embed[m, tokens[b]]  # [L, d_model]
                q = model.encoding.rotate((x[-1:] @ model.w_q[m].T)[None], positions[-1:])[0, 0]
                k = model.encoding.rotate((x @ model.w_k[m].T)[None], positions)[0]
                expect = (k @ q / math.sqrt(model.config.d_head)).softmax(-1)
                assert torch.allclose(attn[m, b], expect, atol=1e-6)


def test_content_head_reads_per_model_batches_as_it_reads_one_shared_batch():
    """A batch shared by the models (``[B, L]``, one index for all) and one batch per model (``[M, B, L]``)
    take two gathers; model ``m`` must see the same logits, attention and gradients either way."""
    model = ContentRetrievalHead(n_models=3, seeds=[0, 1, 2])
    batches = [_tokens(b=4, seq_len=9, seed=s) for s in range(3)]
    params = list(model.parameters())
    per_model = model(torch.stack(batches))  # ([M, B, V], [M, B, L])
    for m, tokens in enumerate(batches):
        shared = model(tokens)
        assert torch.equal(per_model[0][m], shared[0][m]) and torch.equal(per_model[1][m], shared[1][m])
        # and model m's gradients: its slice of each parameter, through either gather
        g_per = torch.autograd.grad(per_model[0][m].square().sum(), params, retain_graph=True, allow_unused=True)
        g_shared = torch.autograd.grad(shared[0][m].square().sum(), params, allow_unused=True)
        for a, b in zip(g_per, g_shared):
            assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, rtol=0, atol=1e-6))


def test_content_head_keys_see_the_token_and_rope_stays_relative():
    model = ContentRetrievalHead(n_models=2, seeds=[0, 1])
    tokens = _tokens(b=1, seq_len=12)
    other = tokens.clone()
    other[0, 3] = (other[0, 3] + 1) % 16
    with torch.no_grad():
        _, a = model(tokens)
        _, b = model(other)
        _, shifted = model(tokens, position_shift=1000)
    assert (a - b).abs().max() > 1e-3  # one distractor's token moved its logit
    assert torch.allclose(a, shifted, atol=1e-5)  # RoPE: the offset alone, per token


def test_content_head_is_a_sibling_with_the_same_weights_and_checks_its_tokens():
    with pytest.raises(ValueError, match="softmax only"):
        ContentRetrievalHead(attention="linear")
    model = ContentRetrievalHead()
    # a sibling of RetrievalHead, not a subclass: it has no position-only row to refuse
    assert not isinstance(model, RetrievalHead)
    assert not any(hasattr(model, name) for name in ("attention_row", "scores", "queries_keys", "with_attention"))
    model.load_state_dict(RetrievalHead(seeds=[5]).state_dict())  # the same parameters: weights load across
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, 16\]"):
        model(torch.full((2, 5), 17))
    assert isinstance(model.subset([0]), ContentRetrievalHead)


def test_logit_table_gathers_to_the_forward_logits():
    """The table of every (query token, key position, key token) logit, read at each sequence's tokens, is the
    logit forward() softmaxes (up to the softmax's constant per row)."""
    head = ContentRetrievalHead(n_models=2, seeds=[3, 4])
    tokens = _tokens(b=6, seq_len=12)
    with torch.no_grad():
        table = head.logit_table(12)  # [M, V+1, L, V+1]
        _, attn = head(tokens)
    assert table.shape == (2, 17, 12, 17)
    # the query is the marker token 16; key j of sequence b holds tokens[b, j]
    s = torch.stack([table[m, 16, torch.arange(12), tokens[b]] for m in range(2) for b in range(6)]).reshape(2, 6, 12)
    assert torch.allclose(s.softmax(-1), attn, atol=1e-6)
    with pytest.raises(ValueError, match="seq_len"):
        head.logit_table(0)


def test_outranked_beyond_window_matches_sampled_sequences():
    """The share read from the weights equals the share of sampled 2x sequences in which some key at distance
    >= train_len gets more attention than the target (untrained heads, whose kernels are random)."""
    from lengthgen_utils.analysis.probes import outranked_beyond_window

    head = ContentRetrievalHead(n_models=3, seeds=[0, 1, 2], init_scale=1.0)
    train_len, offsets, n = 8, [1, 2, 3], 20000
    predicted = outranked_beyond_window(head, offsets, train_len)
    seq_len = 2 * train_len
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 16, (n, seq_len), generator=g)
    tokens[:, -1] = 16
    with torch.no_grad():
        _, attn = head(tokens)  # [M, n, L]
    for m, k in enumerate(offsets):
        target = attn[m, :, seq_len - 1 - k]
        beyond = attn[m, :, : seq_len - train_len].amax(-1)
        sampled = float((beyond > target).double().mean())
        assert abs(sampled - float(predicted[m])) < 0.02, (m, sampled, float(predicted[m]))
    assert 0.0 < float(predicted.min()) and float(predicted.max()) < 1.0  # a test that could tell
    with pytest.raises(TypeError, match="ContentRetrievalHead"):
        outranked_beyond_window(RetrievalHead(), 1, 8)
    with pytest.raises(ValueError, match="offsets"):
        outranked_beyond_window(head, [1, 2, 8], 8)


def test_vote_of_a_one_hot_readout_is_its_accuracy_and_the_mass_is_the_row():
    """A KernelHead's values are one-hot: its readout is the vote, so the two accuracies agree exactly on the
    same sequences; for a position-only head the vote's mean target mass is the attention row's."""
    tasks = [FixedOffsetRetrieval(16, k) for k in (1, 2, 3)]
    head = KernelHead(n_models=3, seeds=[0, 1, 2])
    with torch.no_grad():
        head.c.mul_(20.0)  # peaked rows, so the vote is often wrong at long lengths and often right at short
    lengths = [8, 16, 32]
    vote = attention_vote(head, tasks, lengths, n_samples=300, seed=12345, batch_size=128)
    acc = accuracy_by_length(head, tasks, lengths, n_samples=300, seed=12345, batch_size=128)
    assert torch.equal(vote["vote_accuracy"], acc)
    rope = RetrievalHead(n_models=3, seeds=[0, 1, 2])
    got = attention_vote(rope, tasks, lengths, n_samples=64)["target_mass"]
    assert torch.allclose(got, target_attention_mass(rope, [1, 2, 3], lengths), atol=1e-6)


@pytest.mark.parametrize("cls", [RetrievalHead, ContentRetrievalHead])
def test_query_attention_is_the_forward_passs_attention_bit_for_bit(cls):
    """A test of the code: the vote reads a single head's attention through ``query_attention`` (its forward
    pass without the readout); it must be exactly what the forward pass returns, and the logits of the
    forward pass are still the readout of that attention."""
    from lengthgen_utils.core.models import readout
    from lengthgen_utils.core.seeding import generator

    head = cls(n_models=3, seeds=[0, 1, 2], pe="ape", max_len=40) if cls is RetrievalHead else cls(n_models=3)
    tokens, _ = FixedOffsetRetrieval(16, 3).sample(32, 12, generator(5))
    for kwargs in ({}, {"logit_scale": 1.7}, {"position_shift": 3}):
        logits, attn = head(tokens, **kwargs)
        assert torch.equal(head.query_attention(tokens, **kwargs), attn)
        assert torch.equal(logits, readout(attn, tokens, head.value_table()))


def test_vote_refuses_bad_arguments():
    head = RetrievalHead()
    task = FixedOffsetRetrieval(16, 3)
    with pytest.raises(ValueError, match="n_samples"):
        attention_vote(head, task, [8], n_samples=0)
    with pytest.raises(ValueError):
        attention_vote(head, task, [4])  # too short for offset 3


def test_balanced_agreement():
    actual = torch.tensor([True] * 9 + [False])
    assert balanced_agreement(torch.ones(10, dtype=torch.bool), actual) == 0.5  # "always holds"
    assert balanced_agreement(actual, actual) == 1.0
    assert balanced_agreement(~actual, actual) == 0.0
    assert math.isnan(balanced_agreement(actual, torch.ones(10, dtype=torch.bool)))
    with pytest.raises(ValueError, match="one shape"):
        balanced_agreement(torch.ones(3, dtype=torch.bool), actual)


def test_classify_falls_by_its_stated_rule():
    lengths = [16, 19, 23, 27, 32, 38, 45, 54, 64]
    rows = {
        "holds": [1.0] * 9,
        "not fitted": [0.5] * 9,
        "cliff at alias": [1, 1, 1, 1, 0.07, 0.07, 0.07, 0.07, 0.07],
        "cliff elsewhere": [1, 1, 0.07, 0.07, 0.07, 0.07, 0.07, 0.07, 0.07],
        "gradual": [1, 0.95, 0.88, 0.8, 0.72, 0.64, 0.56, 0.5, 0.45],
        "gradual ": [1, 1, 1, 1, 1, 1, 0.85, 0.8, 0.75],  # below 0.9 three steps before the end, never halfway
        "cut off": [1, 1, 1, 1, 1, 1, 1, 0.85, 0.8],  # below 0.9 two steps before the end: a cliff could follow
        "cut off ": [1, 1, 1, 1, 1, 1, 1, 1, 0.6],  # below 0.9 at the last length
    }
    acc = np.array(list(rows.values()))
    alias = [None, None, 32, 32, None, None, None, None]
    assert falls.classify_falls(acc, lengths, alias, chance=1 / 16) == [k.strip() for k in rows]
    assert ch05b.outcome(["holds", "gradual", "gradual", "holds"]) == "holds"  # ties to the earlier class
    assert ch05b.outcome(["gradual", "cliff at alias", "gradual"]) == "gradual"


def test_regime_map_configuration():
    cfg = RegimeMap()
    assert len(cfg.cells) == len(cfg.bases) * (len(cfg.weight_decays) + len(cfg.content_weight_decays))
    cell = cfg.cell(100.0, 0.3, content=True)
    assert isinstance(cell, SnapshotSweep) and cell.content and cell.sweep.weight_decay == 0.3
    assert cell.sweep.pes[0].base == 100.0 and cell.sweep.steps == max(cfg.snapshot_steps)
    assert cell.lengths[0] == 16 and cell.lengths[-1] == 1024
    assert RegimeMap(content_weight_decays=()).cells == [c for c in cfg.cells if not c[0]]
    assert regime_map(get_profile("full")).n_seeds == get_profile("full").n_seeds
    assert regime_map(get_profile("quick")).n_seeds == 5
    for bad, err in [(dict(bases=()), ValueError), (dict(weight_decays=(-1.0,)), ValueError),
                     (dict(bases=(10.0, 10.0)), ValueError), (dict(snapshot_steps=(500, 250)), ValueError),
                     (dict(offsets=(15,)), ValueError), (dict(n_seeds=0), ValueError), (dict(bases="10"), TypeError)]:
        with pytest.raises(err):
            RegimeMap(**bad)


def test_content_snapshots_need_softmax_and_no_temperature():
    sweep = RetrievalSweep(pes=("rope",), attentions=("linear",), offsets=(1,), n_seeds=1, steps=10)
    with pytest.raises(ValueError, match="content heads"):
        SnapshotSweep(sweep, (10,), (16,), 8, content=True)
    with pytest.raises(TypeError, match="content must be a bool"):
        SnapshotSweep(sweep, (10,), (16,), 8, content=1)


def test_chapter_links_name_an_inserted_chapter():
    assert chapter_link("chapters/05b_regime_map") == ("ch. 5b", "chapters/05b_regime_map.html")
    assert chapter_link("chapters/04_carrier_kernel")[0] == "ch. 4"


SMALL_MAP = RegimeMap(bases=(10.0, 100.0), weight_decays=(0.0, 10.0), content_weight_decays=(0.0, 3.0),
                      snapshot_steps=(3, 6), offsets=(1, 3), n_seeds=2, eval_samples=16)


@pytest.fixture(scope="module")
def small_map(tmp_path_factory):
    """SMALL_MAP run once into a fresh cache folder: ``(folder, {cell: Runs})``."""
    from lengthgen_utils.run.runners import run_regime_map

    folder = tmp_path_factory.mktemp("regime-cache")
    return folder, run_regime_map(SMALL_MAP, device="cpu", cache=folder)


def _same_payload(a, b) -> bool:
    return (torch.equal(a.accuracy, b.accuracy) and torch.equal(a.loss_history, b.loss_history)
            and all(torch.equal(x, y) for ea, eb in zip(a.ensembles, b.ensembles)
                    for x, y in zip(ea.model.state_dict().values(), eb.model.state_dict().values())))


def test_regime_map_cells_trained_together_equal_each_cell_trained_alone(small_map):
    """The map trains its cells of one base and kind as one ensemble (per-model weight decay); every cell's
    snapshots, accuracies and losses equal run_snapshots of that cell alone, bit for bit (tolerance 0: each
    member's arithmetic is its lone training's, see tests/test_per_model_optimizer.py). The decays differ
    in effect, or the test would show nothing."""
    from lengthgen_utils.run.runners import run_snapshots

    together = small_map[1]
    assert all(runs.cache == {k: "miss" for k in runs.cache} for runs in together.values())
    for (content, base, wd), runs in together.items():
        alone = run_snapshots(SMALL_MAP.cell(base, wd, content), device="cpu", cache=False)
        assert _same_payload(runs, alone), (content, base, wd)
    assert not torch.equal(together[(False, 10.0, 0.0)].loss_history, together[(False, 10.0, 10.0)].loss_history)


def test_regime_map_cells_are_cached_one_by_one(small_map):
    """Each cell is its own cache entry: run_snapshots of one cell reads it (a hit); a map with one entry
    gone trains only that cell and loads the others."""
    from lengthgen_utils.run import runners

    tmp_path, first = small_map
    one = SMALL_MAP.cell(100.0, 10.0)
    again = runners.run_snapshots(one, device="cpu", cache=tmp_path)
    assert set(again.cache.values()) == {"hit"} and _same_payload(again, first[(False, 100.0, 10.0)])
    from lengthgen_utils.run.cache import cache_description, entry_path, make_key
    from lengthgen_utils.run.training import default_cpu_threads
    key = make_key(cache_description(one, "cpu", default_cpu_threads("single-head")))
    entry_path(tmp_path, key).unlink()
    trained = []
    original = runners.train_snapshots

    def spy(configs, device=None):
        trained.extend(configs)
        return original(configs, device)

    runners.train_snapshots = spy
    try:
        second = runners.run_regime_map(SMALL_MAP, device="cpu", cache=tmp_path)
    finally:
        runners.train_snapshots = original
    assert trained == [one]
    for cell, runs in second.items():
        assert set(runs.cache.values()) == ({"miss"} if cell == (False, 100.0, 10.0) else {"hit"}), cell
        assert _same_payload(runs, first[cell])


def test_train_snapshots_refuses_sweeps_that_differ_in_more_than_the_optimiser():
    from lengthgen_utils.run.runners import train_snapshots

    with pytest.raises(ValueError, match=r"configs\[1\] differs"):
        train_snapshots([SMALL_MAP.cell(10.0, 0.0), SMALL_MAP.cell(100.0, 0.0)], device="cpu")
    with pytest.raises(TypeError, match="SnapshotSweep"):
        train_snapshots([], device="cpu")
