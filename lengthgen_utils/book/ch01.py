"""Chapter 1, the retrieval task: the explorer's numbers for the prose, and which RoPE seeds fail at 8x and
16x, predicted before the long run.

The committed predictions (:mod:`~lengthgen_utils.analysis.predictions`, read from the file) give every
distance at which a head with the book's frequency set can alias. Which of them a given head does alias
at depends on its weights; reading the head's kernel at those few distances, without any long sequence,
says which seeds will fail and at which length.
"""
from __future__ import annotations

import torch

from ..analysis import falls, predictions
from ..analysis.kernel import carrier_spectrum, kernel_at
from ..analysis.rates import permutation_p


def committed_failures(model, offsets, lengths, accuracy, train_len: int, d_head: int, base: float = 1e4,
                       tolerance: float = 1.0, threshold: float = 0.95, n_null: int = 2000,
                       seed: int = 0) -> dict:
    """Each head's first failing length, predicted from the committed candidates, against the measured one.

    For head ``i`` with offset ``k``: the committed candidate distances ``d`` (those a sequence of at most
    ``max(lengths)`` tokens holds, ``d + 1 <= max(lengths)``) are read from the file; the first of them at
    which the head's kernel, computed from its weights, is within ``tolerance`` nats of its target logit
    (chapter 4's alias criterion) is its predicted alias, and the first evaluated length ``L >= d + 1``
    its predicted first failing length (None: the head is predicted to hold at every evaluated length).

    Args:
        model: a RoPE retrieval-head ensemble (M heads).
        offsets: the offset of each head (M ints).
        lengths: the evaluated lengths (tokens, increasing); accuracy: ``[M, n]`` (fraction).
        train_len, d_head, base: the heads' settings (a row of the committed file).
        tolerance: nats below the target that count as an alias.
        threshold: accuracy below which a head counts as failing at a length.
        n_null, seed: the permutation null (see Returns).

    Returns:
        a dict: ``predicted`` and ``measured`` (per head, a length or None), ``earliest`` (per head, the
        committed first failing length, from the frequency set alone), ``agree`` (per head, predicted ==
        measured), and ``null_agree`` ``[n_null]``: the share of heads whose predicted length equals the
        measured length of a randomly permuted head (a predictor that knows how many heads fail at each
        length, but not which), and ``p``: the one-sided permutation p-value of the heads' agreement against
        that null (:func:`~lengthgen_utils.analysis.rates.permutation_p`).

    Raises:
        KeyError: the committed file has no row for these settings.
        ValueError: ``accuracy`` is not ``[M, len(lengths)]``.

    Source: chapter 1, "Checks"; the rule of :mod:`~lengthgen_utils.analysis.predictions`.
    """
    lengths = [int(L) for L in lengths]
    acc = torch.as_tensor(accuracy)
    ks = [int(k) for k in offsets]
    if acc.dim() != 2 or acc.shape != (len(ks), len(lengths)):
        raise ValueError(f"accuracy must be [M = {len(ks)}, {len(lengths)}]; got {tuple(acc.shape)}")
    spec = carrier_spectrum(model)
    predicted, earliest = [], []
    for i, k in enumerate(ks):
        row = predictions.load_prediction("single head", base, d_head, k, train_len)
        earliest.append(row["first_failing_length"])
        candidates = [d for d in row["distances"] if d + 1 <= max(lengths)]
        alias = None
        if candidates:
            head = spec.select([i])
            values = kernel_at(head, [-d for d in candidates])[0]
            target = kernel_at(head, [-k])[0, 0]
            hits = torch.nonzero(values >= target - tolerance)
            alias = candidates[int(hits[0, 0])] if hits.numel() else None
        predicted.append(None if alias is None else next(L for L in lengths if L >= alias + 1))
    measured = [next((L for L, a in zip(lengths, row.tolist()) if a < threshold), None) for row in acc]
    agree = [p == m for p, m in zip(predicted, measured)]
    g = torch.Generator().manual_seed(seed)
    null = torch.tensor([sum(p == measured[j] for p, j in zip(predicted, torch.randperm(len(ks), generator=g)
                                                                   .tolist())) / len(ks) for _ in range(n_null)])
    p = permutation_p(sum(agree) / len(agree), null)
    return dict(predicted=predicted, measured=measured, earliest=earliest, agree=agree, null_agree=null, p=p)


def below_clause(n: int, total: int, level: float = 0.95) -> str:
    """How many of ``total`` seeds are below ``level``, as a clause: 'all 8 seeds are at 0.95 or above',
    'one of the 8 seeds is below 0.95', '3 of the 8 seeds are below 0.95', 'all 8 seeds are below 0.95'."""
    if n == 0:
        return f"all {total} seeds are at {level} or above"
    if n == total:
        return f"all {total} seeds are below {level}"
    if n == 1:
        return f"one of the {total} seeds is below {level}"
    return f"{n} of the {total} seeds are below {level}"


def explorer_numbers(grid: dict, offsets) -> dict:
    """The numbers chapter 1's prose quotes from its explorer, ``{name: value}`` (glued as ``ch1_grid_<name>``).

    ``grid`` maps a training length T to the sweep trained on it (``run_sweep`` over ``offsets`` and the
    encodings rope, ape and nope), evaluated at whole multiples of T. Accuracies are per seed; the panel of
    (T, k) is one training length and one offset. Names and values are those the chapter glues: APE's panel
    means at 1x and at 4x/16x, RoPE panels whose mean at 4x prints as 1.00, the first multiple where a
    RoPE seed is below 0.95 per training length, APE seeds that do not fit, NoPE's means at 1x for T = 8, 32.
    """
    def acc(T, pe, k, multiple):  # (n_seeds,) accuracy of pe, offset k, trained on T, at multiple x T
        g = grid[T]
        return g.where(pe=pe, offset=k).accuracy[:, g.lengths.index(multiple * T)]

    train_lens = list(grid)
    panels = [(T, k) for T in train_lens for k in offsets]
    ape_1x = [float(acc(T, "ape", k, 1).mean()) for T, k in panels]
    ape_far = [float(acc(T, "ape", k, m).mean()) for T, k in panels for m in (4, 16)]
    out = {
        "panels": len(panels),
        "ape_1x_min": min(ape_1x), "ape_1x_max": max(ape_1x),
        "ape_far_min": min(ape_far), "ape_far_max": max(ape_far),
        # panels whose RoPE mean at 4x prints as 1.00
        "rope_4x_full": sum(float(acc(T, "rope", k, 4).mean()) >= 0.995 for T, k in panels),
    }
    phrases = []  # per training length: the multiples where a panel first has a seed < 0.95
    for T in train_lens:
        firsts = []
        for k in offsets:
            below = [L // T for L in grid[T].lengths if (acc(T, "rope", k, L // T) < 0.95).any()]
            firsts += below[:1]
        lo, hi = (min(firsts), max(firsts)) if firsts else (None, None)
        phrases.append(f"no failure when trained on {T}" if lo is None
                       else f"{lo}x ({lo * T} tokens) when trained on {T}" if lo == hi
                       else f"{lo}x to {hi}x ({lo * T} to {hi * T} tokens) when trained on {T}")
    out["first_fail"] = ", ".join(phrases)
    n_seeds = len(acc(8, "rope", 5, 4))
    out["8k5_below_4x"] = below_clause(int((acc(8, "rope", 5, 4) < 0.95).sum()), n_seeds)
    unfit = [(T, k, int((acc(T, "ape", k, 1) < 0.95).sum()), float(acc(T, "ape", k, 1).mean()))
             for T, k in panels]
    out["ape_unfit"] = "; ".join(
        f"{'one seed' if c == 1 else f'{c} seeds'} at training length {T}, k = {k} "
        f"(the panel's mean at 1x is {m:.2f})" for T, k, c, m in unfit if c
    ) or "no APE seed is below 0.95 at 1x in any panel"
    for T in (8, 32):
        nope_1x = [float(acc(T, "nope", k, 1).mean()) for k in offsets]
        out[f"nope_{T}_min"], out[f"nope_{T}_max"] = min(nope_1x), max(nope_1x)
    return out


# --- the exercises' numbers (chapter 1, "Exercises": the solutions quote this page's run)
def and_list(items) -> str:
    """A list in words: ``[1]`` -> '1', ``[1, 2]`` -> '1 and 2', ``[1, 2, 3]`` -> '1, 2 and 3'.

    Args:
        items: at least one item (each written with ``str``).

    Raises:
        ValueError: ``items`` is empty.
    """
    items = [str(i) for i in items]
    if not items:
        raise ValueError("and_list: items must hold at least one item; got none")
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def seed_spread(values) -> str:
    """How one accuracy varies over the seeds, as a clause: 'all 5 seeds score exactly the same, 0.064' or
    'the seeds score 0.061 to 0.066'.

    Source: chapter 1, exercise 1 (fixed-length APE at 2x).
    """
    values = torch.as_tensor(values, dtype=torch.float64)
    lo, hi = float(values.min()), float(values.max())
    if lo == hi:
        return f"all {len(values)} seeds score exactly the same, {lo:.3f}"
    return f"the seeds score {lo:.3f} to {hi:.3f}"


def failure_clause(first, train_len: int, longest: int) -> str:
    """Where the seeds first fail, as a clause: '3 seeds fail from 64 tokens (4x) and 2 from 512 (32x)',
    '1 seed fails from 128 tokens (8x), 2 from 512 (32x) and 2 hold to 1024 (64x)', 'all 5 seeds hold to
    1024 tokens (64x)'. ``first``: per seed, a first failing length or None (holds to ``longest``)."""
    failing = sorted({L for L in first if L is not None})
    holding = sum(L is None for L in first)
    if not failing:
        return f"all {holding} seeds hold to {longest} tokens ({longest // train_len}x)"
    parts = []
    for L in failing:
        n = first.count(L)
        parts.append(f"{n} seed{'s fail' if n > 1 else ' fails'} from {L} tokens ({L // train_len}x)" if not parts
                     else f"{n} from {L} ({L // train_len}x)")
    if holding:
        parts.append(f"{holding} hold{'s' if holding == 1 else ''} to {longest} ({longest // train_len}x)")
    return and_list(parts)


def alias_clause(aliases, max_distance: int) -> str:
    """Each head's first alias, as a noun phrase: 'first aliases at distances 34, 47 and 311', '... at 104 and
    361 (3 have none up to 1023)', 'no first alias up to 1023'."""
    found = [str(a) for a in aliases if a is not None]
    missing = sum(a is None for a in aliases)
    if not found:
        return f"no first alias up to {max_distance}"
    text = f"first aliases at distances {and_list(found)}"
    if missing:
        text += f" ({missing} {'has' if missing == 1 else 'have'} none up to {max_distance})"
    return text


def halved_head_numbers(runs: dict, offset: int, train_len: int, max_distance: int = 1023,
                        base: float = 1e4) -> dict:
    """Exercise 2's numbers: RoPE heads of ``d_head`` 8 and 16, where they first fail and where they alias.

    Args:
        runs: ``{d_head: (model, lengths, accuracy [M, len(lengths)])}``, both evaluated to the same length.
        offset, train_len: the heads' offset k and training length.
        max_distance: the farthest distance :func:`~lengthgen_utils.analysis.kernel.first_alias` searches.
        base: the heads' RoPE base (a row of the committed file for ``d_head`` 8).

    Returns:
        ``{name: value}`` for the glue names ``ch1_ex2_<name>``: ``fail8``, ``fail16`` (:func:`failure_clause`),
        ``alias8``, ``alias16`` (:func:`alias_clause`), ``agree`` and ``heads`` (heads of both sizes whose first
        failing length is the first evaluated length longer than their alias, or that neither alias nor
        fail), ``committed`` (the committed file's first alias for ``d_head`` 8) and ``early`` (a clause: how
        many ``d_head`` 8 heads alias before it).

    Source: chapter 1, exercise 2.
    """
    from ..analysis.kernel import first_alias

    out, agree, heads = {}, 0, 0
    committed = predictions.load_prediction("single head", base, 8, offset, train_len)["first_alias"]
    for d_head, (model, lengths, accuracy) in runs.items():
        first = falls.first_failure(lengths, accuracy)
        aliases = first_alias(model, offset, train_len, max_distance)
        out[f"fail{d_head}"] = failure_clause(first, train_len, max(lengths))
        out[f"alias{d_head}"] = alias_clause(aliases, max_distance)
        agree += sum(f == h for f, h in zip(first, falls.first_length_holding(aliases, lengths)))
        heads += len(first)
        if d_head == 8:
            n = sum(a is not None and a < committed for a in aliases)
            out["early"] = ("none of them comes" if n == 0 else "one of them comes" if n == 1
                            else f"{n} of them come")
    out.update(agree=agree, heads=heads, committed=committed)
    return out
