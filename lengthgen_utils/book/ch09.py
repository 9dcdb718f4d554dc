"""Chapter 9, the position-encoding zoo: the probes of its runs and the summary table.

The chapter asks, for each encoding people use, the same four questions: is the logit a function of the
offset alone (the shift test of chapter 2), does the trained model extrapolate (chapter 1's retrieval head
and chapter 7's delayed copy), what did training select (where the attention argmax lands beyond the
training range), and, for learned absolute positions, does changing only the training distribution
(randomised positions) change the selected rule. The runs come from :mod:`lengthgen_utils.run.zoo`
(``{pe: Runs}``, one ensemble of one encoding each); the functions here take one such :class:`Runs`.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

from .._validate import check_int, check_int_sequence
from ..analysis.probes import (PLACEMENTS, argmax_placement, attention_argmax, copy_head_placement,
                               shift_attention_change, shift_invariance, shift_logit_difference)
from ..core.encodings import get_encoding
from ..core.models import Transformer
from ..run.results import Runs
from ..run.seeding import generator
from ..run.training import model_threads
from ..run.zoo import SHIFTS, SPAN


def visited(run: Runs) -> int:
    """Positions ``0 .. n-1`` training visited (:meth:`~lengthgen_utils.core.encodings.Encoding.visited_positions`)."""
    return run.pe.visited_positions(run.config.train_len)


def mean_at(run: Runs, multiple: int) -> float | None:
    """Mean accuracy over the seeds at ``multiple`` times the training length (None if not evaluated there)."""
    seq_len = multiple * run.config.train_len
    return float(run.accuracy[:, run.lengths.index(seq_len)].mean()) if seq_len in run.lengths else None


# ---------------------------------------------------------------- probes over a zoo
def _package_threads(probe):
    """Run ``probe(run, ...)`` with the package's intra-op CPU threads (as training and evaluation do): the
    probes' tensors are tiny, and two threads made them many times slower on a busy 2-core machine."""
    @functools.wraps(probe)
    def wrapper(run, *args, **kwargs):
        with model_threads(run.model):
            return probe(run, *args, **kwargs)
    return wrapper


@_package_threads
def shift_violation(run: Runs, shifts=SHIFTS, n_samples: int = 2, seed: int = 1) -> tuple[float, float]:
    """The shift test of chapter 2 on the random (initial) and the trained models of ``run``.

    The largest change of any logit when every position moves by each of ``shifts``, at the training
    length; for an encoding whose frequencies change with the length (PI, NTK) also at 4x the training
    length, where the scaling acts. Single heads: the query's score row
    (:func:`~lengthgen_utils.analysis.probes.shift_logit_difference`); transformers: the output logits on
    ``n_samples`` probe sequences (:func:`~lengthgen_utils.analysis.probes.shift_invariance`).

    Returns:
        ``(random, trained)``: the largest change over models, shifts and lengths (logit units).
    """
    shifts = check_int_sequence("shifts", shifts, minimum=1)
    lengths = [run.config.train_len] + ([SPAN * run.config.train_len] if run.pe.length_dependent else [])
    out = []
    for model in (run.initial_model().to(run.model.device).eval(), run.model):
        worst = 0.0
        for seq_len in lengths:
            if isinstance(model, Transformer):
                tokens, _ = run.config.task.sample(n_samples, seq_len, generator(seed),
                                                       device=model.device)
                worst = max(worst, max(shift_invariance(model, tokens, shifts).values()))
            else:
                worst = max(worst, float(shift_logit_difference(model, seq_len, shifts).max()))
        out.append(worst)
    return out[0], out[1]


@_package_threads
def placement(run: Runs, offset: int | None = None, seq_len: int | None = None,
              min_query: int | None = None) -> Tensor:
    """Where the trained models attend beyond the training length (see :data:`~lengthgen_utils.analysis.probes.PLACEMENTS`).

    Single heads: every evaluation length beyond the training length, one argmax per (seed, length)
    (:func:`~lengthgen_utils.analysis.probes.argmax_placement`; ``offset`` is the task's). Transformers: the copying
    head of each seed at every query beyond the training length of ``seq_len``-token probes (default the
    longest evaluation length; queries from ``min_query``, default the training length;
    :func:`~lengthgen_utils.analysis.probes.copy_head_placement`).

    Returns:
        float64 ``[n_seeds, 3]``: the share of cases at the offset, pinned, elsewhere.
    """
    if isinstance(run.model, Transformer):
        seq_len = max(run.lengths) if seq_len is None else seq_len
        return copy_head_placement(run.model, run.config.task, seq_len, run.config.train_len, visited(run),
                                   n_samples=4, min_query=min_query)[0]
    offset = run.config.offset if offset is None else offset
    codes = argmax_placement(run.model, [L for L in run.lengths if L > run.config.train_len], offset, visited(run))
    return torch.stack([(codes == c).double().mean(1) for c in range(len(PLACEMENTS))], -1)


def placement_label(fractions: Tensor) -> str:
    """A table cell for :func:`placement`: the mean shares at the offset / pinned / elsewhere, e.g.
    ``"0.00/0.97/0.03"``."""
    return "/".join(f"{float(x):.2f}" for x in fractions.mean(0))


@_package_threads
def offset_margins(run: Runs, seq_len: int | None = None) -> Tensor:
    """The query's logit at every key minus its logit at the target key ``L-1-k``: ``[n_seeds, L]``.

    Column ``j`` is offset ``D = j - (L-1)``. Negative everywhere but the target means the target wins the
    argmax; a key with a margin near 0 or above is an alias (chapter 4). Single heads only.
    """
    seq_len = max(run.lengths) if seq_len is None else check_int("seq_len", seq_len, minimum=2)
    with torch.no_grad():
        s = run.model.scores(seq_len).double().cpu()
    return s - s[:, seq_len - 1 - run.config.offset, None]


@_package_threads
def attention_at(run: Runs, seq_len: int | None = None) -> Tensor:
    """The trained query's attention weights over the keys at ``seq_len`` (default the longest length):
    ``[n_seeds, L]``."""
    seq_len = max(run.lengths) if seq_len is None else check_int("seq_len", seq_len, minimum=2)
    with torch.no_grad():
        return run.model.attention_row(seq_len).double().cpu()


@_package_threads
def argmax_positions(run: Runs, lengths) -> Tensor:
    """The key each trained single head attends to most at each length: LongTensor ``[n_seeds, len(lengths)]``
    (:func:`~lengthgen_utils.analysis.probes.attention_argmax`)."""
    return attention_argmax(run.model, lengths)


def offset_readers(run: Runs, seq_len: int, min_accuracy: float = 0.9) -> Tensor:
    """Which seeds of a trained single-head run read the key ``k`` back at length ``seq_len``: accuracy at
    least ``min_accuracy`` there *and* the attention argmax on the target ``L - 1 - k``. Bool ``[n_seeds]``.

    Raises:
        ValueError: ``seq_len`` is not one of the run's evaluation lengths.
    """
    if seq_len not in run.lengths:
        raise ValueError(f"seq_len must be one of the run's evaluation lengths {run.lengths}; got {seq_len!r}")
    offset = run.config.offset
    accurate = run.accuracy[:, run.lengths.index(seq_len)] >= min_accuracy
    return accurate & (argmax_positions(run, [seq_len])[:, 0] == seq_len - 1 - offset)


@_package_threads
def attention_shift_change(run: Runs, shifts, reference: int = 0) -> Tensor:
    """The largest total-variation change of a trained single head's attention row at the training length
    under the given global shifts, against the row at shift ``reference``: ``[n_seeds]``
    (:func:`~lengthgen_utils.analysis.probes.shift_attention_change`)."""
    return shift_attention_change(run.model, run.config.train_len, shifts, reference=reference).amax(-1)


@_package_threads
def control_shift_change(run: Runs, inside=(17, 24, 32, 40, 48),
                         outside=(64, 112, 176, 240)) -> tuple[Tensor, Tensor]:
    """How much a global shift changes a trained single head's attention at the training length: shifts that
    keep the sequence inside the positions training visited, and shifts that move it beyond.

    Each row is compared with the row at positions ``train_len .. 2*train_len - 1`` (well inside the visited
    range, whose first rows a random shift visits least), in total-variation distance
    (:func:`~lengthgen_utils.analysis.probes.shift_attention_change`): 0 = the same attention row, 1 = disjoint rows.
    Every shift is kept: a seed whose offset rule holds at most placements but not at one has one large
    value among small ones, and a summary over seeds *and* shifts (a median) is not decided by that one.

    Returns:
        ``(inside [n_seeds, len(inside)], outside [n_seeds, len(outside)])``.

    Raises:
        ValueError: a shift meant to stay inside does not, or one meant to leave does not leave.
    """
    inside, outside = check_int_sequence("inside", inside, 1), check_int_sequence("outside", outside, 1)
    seq_len, n_visited = run.config.train_len, visited(run)
    if max(inside) + seq_len > n_visited or min(outside) + seq_len <= n_visited:
        raise ValueError(f"inside shifts must keep positions below {n_visited} and outside ones must pass it; "
                         f"got inside={inside}, outside={outside} at L={seq_len}")
    return (shift_attention_change(run.model, seq_len, inside, reference=seq_len),
            shift_attention_change(run.model, seq_len, outside, reference=seq_len))


# ---------------------------------------------------------------- the summary table
RETRIEVAL_MULTIPLES = (2, 4, 16)
COPY_MULTIPLES = (2, 4, 8)


def run_for(runs: dict, pe) -> Runs | None:
    """The run of the same encoding in ``runs`` (matched by label: the two tasks train at different lengths, so
    e.g. their randomised ranges differ), or None when the profile did not run it."""
    label = get_encoding(pe).label
    return next((r for r in runs.values() if r.pe.label == label), None)


def summary_rows(retrieval: dict, copy: dict, violations: dict | None = None,
                 placements: dict | None = None) -> list[dict]:
    """One row per encoding of ``retrieval``: what the chapter's table shows, computed from the runs.

    Args:
        retrieval, copy: ``{pe: Runs}`` from :func:`run_retrieval_zoo` and :func:`run_copy_zoo`.
        violations: ``{pe: (random, trained)}`` already computed by :func:`shift_violation` (else computed).
        placements: ``{pe: [n_seeds, 3]}`` already computed by :func:`placement` for ``retrieval`` (else computed).

    Returns:
        dicts with keys ``encoding`` (label), ``relative`` (by construction), ``retrieval`` and ``copy``
        (``{multiple: mean accuracy}``, None where the profile did not run the encoding), ``placement`` and
        ``copy_placement`` (:func:`placement_label`), ``shift_random`` and ``shift_trained`` (single head).
    """
    rows = []
    for pe, run in retrieval.items():
        random_shift, trained_shift = (violations or {}).get(pe) or shift_violation(run)
        where = (placements or {}).get(pe)
        copy_run = run_for(copy, pe)
        rows.append({
            "encoding": pe.label, "relative": bool(pe.relative),
            "retrieval": {m: mean_at(run, m) for m in RETRIEVAL_MULTIPLES},
            "copy": {m: (mean_at(copy_run, m) if copy_run is not None else None) for m in COPY_MULTIPLES},
            "placement": placement_label(where if where is not None else placement(run)),
            "copy_placement": placement_label(placement(copy_run)) if copy_run is not None else None,
            "shift_random": random_shift, "shift_trained": trained_shift,
        })
    return rows


def summary_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The header and the cells (strings) of the chapter's summary table, from :func:`summary_rows`."""
    header = ["encoding", "relative by construction",
              "retrieval " + " / ".join(f"{m}x" for m in RETRIEVAL_MULTIPLES),
              "delayed copy " + " / ".join(f"{m}x" for m in COPY_MULTIPLES),
              "retrieval argmax: offset / pinned / elsewhere", "copying head: offset / pinned / elsewhere",
              "shift violation: random head, trained"]

    def accuracies(values: dict) -> str:
        if any(v is None for v in values.values()):
            return "not run"
        return "/".join(f"{v:.2f}" for v in values.values())

    def violation(x: float) -> str:  # a minus sign, not a hyphen: the cell never breaks inside a number
        return f"{x:.0e}".replace("-", "\u2212") if x > 0 else "0"

    cells = []
    for r in rows:
        cells.append([r["encoding"], "yes" if r["relative"] else "no", accuracies(r["retrieval"]),
                      accuracies(r["copy"]), r["placement"], r["copy_placement"] or "not run",
                      f"{violation(r['shift_random'])}, {violation(r['shift_trained'])}"])
    return header, cells
