"""Choose each optimiser's learning rate for chapter 5c by one stated rule, and write the choice to a file.

``python -m lengthgen_utils.tools.learning_rates`` trains, for every update rule of chapter 5c and every
rate of its grid (:data:`GRID`), one RoPE and one APE ensemble on the chapter's setting at a small scale
(offset 3, :data:`SEEDS` seeds, :data:`STEPS` steps) and keeps, per rule, **the largest rate of the grid at
which every head of both ensembles fits** (accuracy >= 0.99 at the training length); where no rate fits
every head, the rate that fits the most (ties: the larger). A rate whose training diverges (a non-finite
loss) fits no head. The choice, with every rate's fit count, goes to ``predictions/learning_rates.json``,
which the chapter reads; the chapter's own runs never tune a rate.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from ..core.models import RetrievalHead
from ..run.evaluation import accuracy_by_length
from ..run.optim import OptimizerSettings
from ..run.training import train
from ..core.tasks import FixedOffsetRetrieval

GRID = {
    "Adam": ("adamw", 0.0, None, (3e-3, 1e-2, 3e-2)),
    "SGD + momentum": ("sgd", 0.9, None, (0.01, 0.05, 0.2)),
    "sign descent": ("sign", 0.0, None, (3e-4, 1e-3, 3e-3)),
    "SGD": ("sgd", 0.0, None, (0.5, 2.0, 8.0)),
    "gradient descent": ("sgd", 0.0, 32, (0.5, 2.0, 8.0)),
}
"""Per rule: (optimiser name, momentum, fixed training set per length or None, the grid of rates)."""

SEEDS, STEPS, OFFSET, FIT = 3, 300, 3, 0.99
OUT = Path(__file__).resolve().parents[2] / "predictions" / "learning_rates.json"


def fits(pe: str, name: str, momentum: float, train_set, lr: float) -> int:
    """How many of ``SEEDS`` heads fit (accuracy >= ``FIT`` at length 16) after ``STEPS`` steps; 0 if training diverges."""
    model = RetrievalHead(pe=pe, max_len=16, n_models=SEEDS)
    task = FixedOffsetRetrieval(16, OFFSET)
    history = train(model, task, OptimizerSettings(name, lr, 0.0, momentum), steps=STEPS, train_set=train_set)
    if not bool(torch.isfinite(history).all()) or not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
        return 0
    return int((accuracy_by_length(model, task, [16], n_samples=256)[:, 0] >= FIT).sum())


def main(argv=None) -> int:
    chosen, table = {}, {}
    for rule, (name, momentum, train_set, grid) in GRID.items():
        counts = {lr: fits("rope", name, momentum, train_set, lr) + fits("ape", name, momentum, train_set, lr)
                  for lr in grid}
        table[rule] = {f"{lr:g}": n for lr, n in counts.items()}
        full = [lr for lr, n in counts.items() if n == 2 * SEEDS]
        chosen[rule] = max(full) if full else max(counts, key=lambda lr: (counts[lr], lr))
        print(rule, table[rule], "->", chosen[rule], flush=True)
    OUT.write_text(json.dumps({
        "command": "python -m lengthgen_utils.tools.learning_rates",
        "rule": (f"per update rule, the largest rate of its grid at which every head of a RoPE and an APE ensemble "
                 f"fits (accuracy >= {FIT} at length 16; offset {OFFSET}, {SEEDS} seeds each, {STEPS} steps); "
                 f"where none fits every head, the rate that fits the most (ties: the larger)"),
        "rules": {rule: {"optimizer": n, "momentum": m, "train_set": ts} for rule, (n, m, ts, _) in GRID.items()},
        "fits_of_6": table, "lr": chosen}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
