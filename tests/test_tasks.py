"""Every task follows one protocol (lengthgen_utils.core.tasks.Task): walked here for each task of the package,
plus the example of the appendix recipe "add a task"."""
from dataclasses import dataclass

import pytest
import torch

from lengthgen_utils.core import tasks
from lengthgen_utils.run.configs import TransformerExperiment
from lengthgen_utils.core.tasks import IGNORE_INDEX, Task


@dataclass(frozen=True)
class LaggedMax(Task):
    """The appendix's recipe: the larger of the tokens 2 and 5 places back."""

    vocab_size: int = 16

    @property
    def min_seq_len(self) -> int:
        return 6

    def n_scored(self, seq_len):
        return seq_len - 5

    def _targets_at(self, tokens):
        out = torch.full_like(tokens, IGNORE_INDEX)
        out[..., 5:] = torch.maximum(tokens[..., 3:-2], tokens[..., :-5])
        return out


ALL = [tasks.FixedOffsetRetrieval(16, 3), tasks.DelayedCopy(16, 5), tasks.LaggedSum(16, 2, 5), tasks.RunningParity(),
       tasks.Copy(8), LaggedMax()]


def test_every_task_class_of_the_package_is_walked():
    defined = {cls for cls in vars(tasks).values() if isinstance(cls, type) and issubclass(cls, Task) and cls is not Task}
    assert defined <= {type(t) for t in ALL}


@pytest.mark.parametrize("task", ALL, ids=lambda t: type(t).__name__)
def test_protocol(task):
    seq_len = task.min_seq_len if task.min_seq_len % 2 else task.min_seq_len + 1  # Copy needs odd lengths
    seq_len = max(seq_len, 9)
    tokens, targets = task.sample(64, seq_len, torch.Generator().manual_seed(0))
    assert tokens.shape == targets.shape == (64, seq_len) and tokens.dtype == targets.dtype == torch.long
    assert 0 <= int(tokens.min()) and int(tokens.max()) < task.n_tokens
    scored = task.scored_positions(seq_len)
    assert scored.shape == (seq_len,) and scored.any()
    assert ((targets != IGNORE_INDEX) == scored).all()  # targets exactly where positions are scored
    assert 0 <= int(targets[:, scored].min()) and int(targets[:, scored].max()) < task.vocab_size
    assert torch.equal(task.targets(tokens), targets)
    assert task.chance == 1 / task.vocab_size
    again, _ = task.sample(64, seq_len, torch.Generator().manual_seed(0))
    assert torch.equal(again, tokens)  # seeded
    assert task.query_only == (scored.sum() == 1 and bool(scored[-1]))
    hash(task)  # a task keys the results cache
    with pytest.raises(ValueError, match="seq_len"):
        task.sample(2, task.min_seq_len - 1 if task.min_seq_len > 1 else 0)


def test_the_recipe_task_trains_in_a_transformer_experiment():
    exp = TransformerExperiment(task=LaggedMax(16), train_len=16, eval_lengths=[16, 32], d_model=16, n_heads=2,
                                steps=1, n_seeds=1)
    assert exp.task.n_tokens == 16 and exp.eval_lengths == (16, 32)


def test_special_tokens_take_the_id_after_the_content_tokens():
    assert tasks.FixedOffsetRetrieval(16, 3).query_token == 16 == tasks.Copy(16).separator
    assert tasks.FixedOffsetRetrieval(16, 3).n_tokens == 17 and tasks.DelayedCopy(16).n_tokens == 16
    with pytest.raises(ValueError, match="no special token"):
        tasks.DelayedCopy(16).special_token
