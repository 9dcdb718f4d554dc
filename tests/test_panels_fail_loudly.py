"""Interactive panels fail loudly and keep their controls valid.
"""
import pytest

from lengthgen_utils.book import widgets as widgets_module
from lengthgen_utils.book.widgets import RetrievalExplorer
from lengthgen_utils.core.tasks import FixedOffsetRetrieval

# ================================================================ 5. interactive panels fail loudly
QUICK_PANEL = dict(profile="quick", n_seeds=2, steps=20, eval_samples=32)


def test_explorer_offset_slider_follows_the_training_length():
    """The reported example: ``RetrievalExplorer(profile="quick", train_len=8)`` offered offset 7, which the task
    refuses (offset <= train_len - 2 = 6). The offset slider now ends at 6 at train_len 8, moves with the
    training length (8 at 12, the slider's cap) and pulls the offset back when the training length shrinks;
    the evaluation-length slider starts at the training length."""
    ex = RetrievalExplorer(train_len=8, train_now=False, **QUICK_PANEL)
    assert (ex.offset.min, ex.offset.max) == (1, 6)
    assert min(ex.eval_len.options) >= 8
    ex.train_len.value = 12
    assert ex.offset.max == 8
    ex.offset.value = 8
    ex.train_len.value = 8
    assert ex.offset.max == 6 and ex.offset.value == 6
    ex.eval_len.value = 16
    ex.train_len.value = 32
    assert ex.offset.max == 8 and min(ex.eval_len.options) == 32 and ex.eval_len.value == 32
    for train_len in range(8, 33, 4):  # every setting the controls can reach is one the task accepts
        ex.train_len.value = train_len
        FixedOffsetRetrieval(16, ex.offset.max).check_seq_len(train_len)
        assert min(ex.eval_len.options) >= train_len


@pytest.mark.parametrize("kwargs, argument", [
    (dict(train_len=8, offset=7), "offset"), (dict(train_len=12, offset=11), "offset"),
    (dict(train_len=32, eval_len=16), "eval_len"), (dict(train_len=10), "train_len"),
])
def test_explorer_refuses_invalid_combinations_naming_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=rf"^{argument} must"):
        RetrievalExplorer(train_now=False, **QUICK_PANEL, **kwargs)


def test_an_error_during_retrain_shows_in_the_status_line(monkeypatch):
    """ipywidgets swallows an exception raised in a button's callback: the status used to keep saying "press
    Retrain". Now the error's message is in the status line, the button is usable again, and a retrain called
    from code still raises."""
    ex = RetrievalExplorer(train_len=8, offset=2, eval_len=16, pe="rope", train_now=False, **QUICK_PANEL)

    def failing_train(*args, **kwargs):
        raise RuntimeError("out of memory <while training>")

    monkeypatch.setattr(widgets_module, "train", failing_train)
    ex.retrain_button.click()  # what a reader does: no exception reaches them
    assert "Retrain failed" in ex.status.value
    assert "RuntimeError: out of memory &lt;while training&gt;" in ex.status.value  # escaped, shown whole
    assert "press" not in ex.status.value.lower() and not ex.retrain_button.disabled and ex.figure is None
    with pytest.raises(RuntimeError, match="out of memory"):
        ex.retrain()


def test_an_error_while_replotting_shows_in_the_status_line(monkeypatch):
    """A control that re-plots a trained setting (here the evaluation length) shows an evaluation error too."""
    ex = RetrievalExplorer(train_len=8, offset=2, eval_len=16, pe="rope", **QUICK_PANEL)
    assert "Showing k = 2" in ex.status.value

    def failing_accuracy(*args, **kwargs):
        raise ValueError("lengths[3]=512 is beyond the table")

    monkeypatch.setattr(widgets_module, "accuracy_by_length", failing_accuracy)
    ex.eval_len.value = 64
    assert "Re-plot failed" in ex.status.value and "lengths[3]=512 is beyond the table" in ex.status.value
