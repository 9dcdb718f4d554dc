"""Chapter 8, implicit bias: what separates a recurrent model that extrapolates from one that cannot, and the
RASP-L contrast read off the transformer's runs.

The recurrent models' kernel norms are read in the book's row layout
(:meth:`~lengthgen_utils.core.models.LinearRNN.kernel_norm`: the last column is the query's own position).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validate import check_int
from ..run.evaluation import split_accuracy, token_accuracy_by_position


def far_weight(model, target: int, window: int, seq_len: int) -> Tensor:
    """The largest kernel norm beyond the training window, relative to the target's: per model ``[M]``.

    ``max_{window <= d < seq_len} ||K(d)|| / ||K(target)||``: below 1% the model ignores every token
    it never saw at training distances; near 1 a far token counts as much as the target (chapter 8).
    A model whose kernel overflows within ``seq_len`` (an unstable transition,
    :meth:`~lengthgen_utils.core.models.LinearRNN.finite_within`) gets ``inf``: far tokens outweigh
    the target without bound.

    Args:
        model: a ``LinearRNN`` ensemble.
        target: the distance of the target (the task's offset ``k``), ``0 <= target < window``.
        window: the training window (the longest training length, ``L_train``), ``< seq_len``.
        seq_len: how far to look (``d < seq_len``).

    Raises:
        TypeError / ValueError: a size out of range (``target`` outside the window, ``seq_len <= window``).
    """
    window = check_int("window", window, minimum=1)
    target = check_int("target", target, minimum=0, maximum=window - 1)
    seq_len = check_int("seq_len", seq_len, minimum=window + 1)
    finite = model.finite_within(seq_len)  # [M]
    out = torch.full((model.n_models,), math.inf, dtype=torch.float64)
    if finite.any():
        stable = torch.nonzero(finite)[:, 0].tolist()
        norms = model.subset(stable).kernel_norm(seq_len)  # [M', seq_len] row layout: the last column is D = 0
        out[stable] = norms[:, : seq_len - window].max(1).values / norms[:, -1 - target]
    return out


def unstable_phrase(model, seq_len: int) -> str:
    """A clause on the seeds of a recurrent ensemble that trained to an unstable transition, for the prose.

    ``""`` when every model's kernel stays finite to ``seq_len``; else e.g. ``" (one of the 5 seeds trained to
    an unstable transition, largest |eigenvalue| of A 2.87: its kernel overflows within 256 tokens, so it
    counts as failing beyond training)"``.

    Args:
        model: a ``LinearRNN`` ensemble; seq_len: the longest evaluated length (tokens).
    """
    finite = model.finite_within(check_int("seq_len", seq_len, minimum=1))
    bad = torch.nonzero(~finite)[:, 0].tolist()
    if not bad:
        return ""
    radius = model.spectral_radius()[bad]
    who, its, it = (("one", "its kernel overflows", "it counts") if len(bad) == 1 else
                    (str(len(bad)), "their kernels overflow", "they count"))
    return (f" ({who} of the {model.n_models} seeds trained to an unstable transition, largest |eigenvalue| of "
            f"A {', '.join(f'{r:.2f}' for r in radius.tolist())}: {its} within {seq_len} tokens, so {it} "
            "as failing beyond training)")


def fit_and_hold(accuracy: Tensor, fit: float = 0.95) -> tuple[Tensor, Tensor, Tensor]:
    """Which seeds fit the training length, and how far each falls beyond it.

    Args:
        accuracy: ``[M, n]`` accuracy by evaluation length, the training length first (a ``Runs.accuracy``).
        fit: the accuracy at the training length that counts as fitted.

    Returns:
        ``(fitted [M] bool, lowest [M], drop [M])``: ``accuracy[:, 0] >= fit``; each seed's lowest accuracy
        over every length; ``accuracy[:, 0] - accuracy[:, -1]`` (training length minus the longest).

    Raises:
        ValueError: ``accuracy`` is not ``[M, n]`` with ``n >= 2``.
    """
    if not isinstance(accuracy, Tensor) or accuracy.dim() != 2 or accuracy.shape[1] < 2 or not accuracy.numel():
        raise ValueError(f"accuracy must be [M, n >= 2] (the training length first); got "
                         f"{tuple(getattr(accuracy, 'shape', ()))}")
    return accuracy[:, 0] >= fit, accuracy.min(1).values, accuracy[:, 0] - accuracy[:, -1]


def beyond(runs) -> dict[int, Tensor]:
    """A transformer run's token accuracy beyond its training length: ``{L: [M]}`` for every evaluation
    length ``L`` longer than the training length (positions ``>= train_len``), in increasing order."""
    train_len = runs.experiment.train_len
    return {L: v for L, v in sorted(runs.outside.items()) if L > train_len}


def copy_by_length(model, task, lengths, n_samples: int = 64) -> dict[int, Tensor]:
    """Token accuracy over every scored position at each length: ``{L: [M]}`` (chapter 8's copy per half).

    Args:
        model: a transformer ensemble (a ``Runs.model`` of :func:`~lengthgen_utils.run.runners.run_transformer`).
        task: the task to read it on (e.g. ``Copy(16)``: at ``L = 2n + 1`` every scored position copies
            from ``n`` back).
        lengths: the lengths, each valid for ``task``.
        n_samples: fresh sequences per length (the evaluation's fixed seed).

    Raises:
        TypeError / ValueError: a length the task refuses, ``n_samples < 1``.
    """
    out = {}
    for seq_len in lengths:
        acc, counts = token_accuracy_by_position(model, task, seq_len, n_samples=n_samples)
        out[int(seq_len)] = split_accuracy(acc, counts, seq_len + 1)[0]  # every position: "inside" L + 1
    return out


def halves_table(by_length: dict, train_halves, caption: str):
    """Copying the first half, trained over several halves: token accuracy by evaluation length.

    Args:
        by_length: ``{L: accuracy [M]}`` with ``L = 2n + 1`` (the half ``n`` is ``(L - 1) // 2``).
        train_halves: the halves ``n`` training drew from.
        caption: the table's caption.

    Returns:
        a :class:`~lengthgen_utils.book.tables.Table`: one row per length (half, trained or not, mean,
        lowest seed).
    """
    from .tables import Table

    train_halves = set(train_halves)
    rows = []
    for L, acc in sorted(by_length.items()):
        n = (L - 1) // 2
        rows.append([L, n, "yes" if n in train_halves else "no", f"{float(acc.mean()):.3f}",
                     f"{float(acc.min()):.3f}"])
    return Table(["L", "half n", "trained", "mean", "lowest seed"], rows, caption=caption)



# --- the exercises' numbers (chapter 8, "Exercises": the solutions quote this page's run)
def large_start_numbers(run, target: int, fit: float = 0.95) -> dict:
    """Exercise 3: a recurrent ensemble trained from a large initial transition (``run_recurrent``).

    Returns:
        ``{name: value}`` for the glue names ``ch8_ex3_<name>``: ``radius_min``, ``radius_max`` (largest
        |eigenvalue| of the trained ``A`` over the seeds), ``radius_init`` (the largest before training),
        ``fit`` (seeds at ``fit`` or above at the training length), ``seeds``, ``fit_min`` (the lowest
        accuracy of those seeds at any evaluated length), ``unfit`` (a clause on the others), ``gap`` (over
        the seeds, the largest |accuracy at the longest length - at the training length|), ``carries`` (a
        clause: whether every seed's gap is at most 0.1), ``stable`` (the seeds whose trained ``A`` has every
        |eigenvalue| below 1) and ``far`` (the largest kernel norm beyond the window relative to the target's,
        :func:`far_weight`).

    Source: chapter 8, exercise 3.
    """
    acc, radius = run.accuracy, run.model.spectral_radius()
    fitted = acc[:, 0] >= fit
    unfit = [(float(a[0]), float(a[-1])) for a, f in zip(acc, fitted) if not f]
    steps = run.experiment.steps
    if not unfit:
        unfit_text = "every seed fits"
    elif len(unfit) == 1:
        unfit_text = (f"one has not fitted after {steps} steps ({unfit[0][0]:.3f} at the training length) and "
                      f"keeps {unfit[0][1]:.3f} at {max(run.lengths)} tokens")
    else:
        unfit_text = (f"{len(unfit)} have not fitted after {steps} steps ("
                      + ", ".join(f"{a:.3f}" for a, _ in unfit) + " at the training length)")
    lengths, train_len = run.lengths, run.experiment.train_len
    gap = float((acc[:, -1] - acc[:, 0]).abs().max())
    return {"radius_min": float(radius.min()), "radius_max": float(radius.max()),
            "radius_init": float(run.initial_model().spectral_radius().max()),
            "fit": int(fitted.sum()), "seeds": len(acc),
            "fit_min": float(acc[fitted].min()) if fitted.any() else float("nan"), "unfit": unfit_text,
            "gap": gap,
            "carries": "the rule still carries over" if gap <= 0.1 else "not every seed carries its rule over",
            "stable": ("every seed" if bool((radius < 1).all())
                       else f"{int((radius < 1).sum())} of the {len(acc)} seeds"),
            "far": float(far_weight(run.model, target, train_len, max(lengths)).max())}
