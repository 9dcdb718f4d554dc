"""Live explorers for a running Jupyter kernel (ipywidgets): move a slider, retrain, re-plot.

These panels need a kernel: in the static web book each chapter shows a
plotly slider figure over precomputed sweeps instead (see
:func:`lengthgen_utils.book.sliders.slider_figure`). Open a chapter in Jupyter and run::

    from .widgets import RetrievalExplorer
    RetrievalExplorer()

The figure is shown in an ``ipywidgets.Output`` whose outputs are replaced
with plotly's JSON mime bundle at every update (JupyterLab, Notebook 7 and
VS Code render it). plotly's ``FigureWidget`` is not used: in plotly 7 it
needs the extra ``anywidget`` package.
"""
from __future__ import annotations

import html
import time

import ipywidgets as widgets

from .._validate import check_int
from ..core.encodings import encoding_names, get_encoding
from ..core.models import RetrievalHead
from ..core.tasks import FixedOffsetRetrieval
from ..run.evaluation import accuracy_by_length
from ..run.profiles import Profile, get_profile
from ..run.training import train
from . import figures, render

CHAPTER_1_ENCODINGS = ("rope", "ape", "nope")
PE_CHOICES = (("RoPE, APE and NoPE", "all"),) + tuple((get_encoding(n).label, n) for n in encoding_names())
EVAL_LENGTHS = (16, 32, 64, 128, 256, 512)  # choices of the longest evaluation length (tokens)
MAX_LEN = max(EVAL_LENGTHS)  # APE tables are sized for it, so changing the evaluation length never retrains
OFFSET_MAX = 8  # the largest offset the slider offers (when the training length allows it)
TRAIN_LENS = (8, 32, 4)  # training length slider: min, max, step (tokens)


def max_offset(train_len: int) -> int:
    """The largest offset a training length admits on the slider: ``min(OFFSET_MAX, train_len - 2)``.

    The task needs ``offset <= train_len - 2`` (the target must be a content token of every training
    sequence; :class:`~lengthgen_utils.core.tasks.FixedOffsetRetrieval`).
    """
    return min(OFFSET_MAX, train_len - 2)


def eval_choices(train_len: int) -> tuple[int, ...]:
    """The longest-evaluation-length choices at a training length: those of :data:`EVAL_LENGTHS` ``>= train_len``."""
    return tuple(L for L in EVAL_LENGTHS if L >= train_len)


def _figure_output(fig) -> dict:
    """A Jupyter ``display_data`` output holding plotly's JSON (what ``Output.outputs`` stores), strict JSON
    (:func:`~lengthgen_utils.book.render.strict_json`: NaN written as ``null``)."""
    fig_dict = render.strict_json(render.fit_to_column(fig))
    return {"output_type": "display_data", "metadata": {},
            "data": {"application/vnd.plotly.v1+json": {"data": fig_dict["data"], "layout": fig_dict["layout"],
                                                        "config": {"responsive": True, "displaylogo": False}},
                     "text/plain": f"<plotly figure: {fig.layout.title.text}>"}}


class RetrievalExplorer(widgets.VBox):
    """Sliders for offset, training length, evaluation length and PE over live-trained retrieval heads.

    Controls (all public attributes, so they can be set from code and tested):

    * ``offset`` (k), ``train_len`` (longest training length, tokens) and ``pe``
      select what is trained. The controls keep each other valid: the offset slider ends at
      ``min(8, train_len - 2)`` (:func:`max_offset`) and the evaluation-length slider starts at the
      training length (:func:`eval_choices`); moving the training length moves them (and their values,
      when they fall outside). Trained ensembles are kept per ``(pe, offset, train_len)``:
      choosing a setting already trained re-plots at once; a new one waits for
      ``retrain_button`` (a retrain of one quick-profile ensemble takes seconds on a laptop CPU).
    * ``eval_len`` (longest evaluation length, tokens) re-evaluates the trained
      models at ``train_len * 2^i`` up to it, with no retraining.
    * ``progress`` counts training steps; ``status`` says what is shown, and shows the message of any
      error raised while retraining or re-plotting (ipywidgets would otherwise swallow an exception
      raised in a control's callback, leaving the panel silent).

    ``figure`` is the plotly figure currently shown (mean accuracy over seeds
    with a min..max band, chance line, training length), and ``output`` the
    widget that displays it.

    Args:
        profile: a :class:`~lengthgen_utils.run.profiles.Profile` or its name; sets seeds, steps,
            batch size and evaluation samples (default: ``$LENGTHGEN_PROFILE``, else ``default``).
        offset, train_len, eval_len, pe: initial slider values.
        n_seeds, steps, eval_samples: override the profile's values (e.g. to keep a test short).
        train_now: train the initial setting at construction (else the figure waits for the button).

    Raises:
        ValueError / TypeError: an initial value outside its slider's range, naming the argument: an
            offset above ``min(8, train_len - 2)``, an ``eval_len`` below ``train_len``, an unknown ``pe``.
    """

    def __init__(self, profile: Profile | str | None = None, offset: int = 3, train_len: int = 16,
                 eval_len: int = 256, pe: str = "all", n_seeds: int | None = None, steps: int | None = None,
                 eval_samples: int | None = None, train_now: bool = True):
        profile = profile if isinstance(profile, Profile) else get_profile(profile)
        self.n_seeds = check_int("n_seeds", n_seeds if n_seeds is not None else profile.n_seeds, minimum=1)
        self.steps = check_int("steps", steps if steps is not None else profile.steps, minimum=1)
        self.eval_samples = check_int("eval_samples", eval_samples if eval_samples is not None
                                      else profile.eval_samples, minimum=1)
        self.batch_size = profile.batch_size
        check_int("train_len", train_len, minimum=TRAIN_LENS[0], maximum=TRAIN_LENS[1])
        if (train_len - TRAIN_LENS[0]) % TRAIN_LENS[2]:
            steps = tuple(range(TRAIN_LENS[0], TRAIN_LENS[1] + 1, TRAIN_LENS[2]))
            raise ValueError(f"train_len must be one of the slider's steps {steps}; got train_len={train_len}")
        check_int("offset", offset, minimum=1)
        if offset > max_offset(train_len):
            raise ValueError(f"offset must be at most min({OFFSET_MAX}, train_len - 2) = {max_offset(train_len)} "
                             f"at train_len={train_len} (the target must lie inside every training sequence); "
                             f"got offset={offset}")
        if eval_len not in eval_choices(train_len):
            raise ValueError(f"eval_len must be one of {eval_choices(train_len)} (evaluation lengths from "
                             f"{EVAL_LENGTHS} that are >= train_len={train_len}); got eval_len={eval_len!r}")
        if pe not in [v for _, v in PE_CHOICES]:
            raise ValueError(f"pe must be one of {[v for _, v in PE_CHOICES]}; got pe={pe!r}")

        style = {"description_width": "150px"}
        layout = widgets.Layout(width="480px")
        self.offset = widgets.IntSlider(value=offset, min=1, max=max_offset(train_len), description="offset k",
                                        style=style, layout=layout, continuous_update=False)
        self.train_len = widgets.IntSlider(value=train_len, min=TRAIN_LENS[0], max=TRAIN_LENS[1], step=TRAIN_LENS[2],
                                           description="training length", style=style, layout=layout,
                                           continuous_update=False)
        self.eval_len = widgets.SelectionSlider(options=eval_choices(train_len), value=eval_len,
                                                description="longest eval length", style=style, layout=layout,
                                                continuous_update=False)
        self.pe = widgets.ToggleButtons(options=PE_CHOICES, value=pe, description="position encoding", style=style)
        self.retrain_button = widgets.Button(description="Retrain", button_style="primary", icon="refresh")
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="training", style=style)
        self.status = widgets.HTML()
        self.output = widgets.Output()
        self.figure = None
        self._models: dict = {}  # (pe, offset, train_len) -> trained RetrievalHead ensemble
        self._syncing = False  # True while the controls' ranges are being moved (their changes are one change)

        for w in (self.offset, self.train_len, self.eval_len, self.pe):
            w.observe(self._control_changed, names="value")
        self.retrain_button.on_click(self._retrain_clicked)
        super().__init__([self.offset, self.train_len, self.eval_len, self.pe,
                          widgets.HBox([self.retrain_button, self.progress]), self.status, self.output])
        if train_now:
            self.retrain()
        else:
            self.status.value = "Press <b>Retrain</b> to train this setting."

    # ------------------------------------------------------------------ state
    @property
    def pes(self) -> list[str]:
        """The position encodings selected by ``pe``."""
        return list(CHAPTER_1_ENCODINGS) if self.pe.value == "all" else [self.pe.value]

    def _key(self, pe: str) -> tuple:
        return pe, self.offset.value, self.train_len.value

    def eval_lengths(self) -> list[int]:
        """Evaluation lengths: ``train_len * 2^i`` up to ``eval_len``, and ``eval_len`` itself (tokens)."""
        train_len, longest = self.train_len.value, self.eval_len.value
        lengths = {longest}
        length = train_len
        while length <= longest:
            lengths.add(length)
            length *= 2
        return sorted(lengths)

    # ---------------------------------------------------------------- controls
    def _sync_ranges(self) -> None:
        """Move the offset and evaluation-length sliders' ranges (and values, if outside) to the training length."""
        train_len = self.train_len.value
        self.offset.max = max_offset(train_len)  # ipywidgets lowers a value above the new max to it
        choices = eval_choices(train_len)
        if tuple(self.eval_len.options) != choices:
            keep = self.eval_len.value if self.eval_len.value in choices else choices[0]
            self.eval_len.options = choices  # (resets the value to the first option)
            self.eval_len.value = keep

    def _control_changed(self, change) -> None:
        """A control moved: keep the others valid, then show the setting (or say it needs training)."""
        if self._syncing:
            return
        self._syncing = True
        try:
            self._sync_ranges()
        finally:
            self._syncing = False
        try:
            self._settings_changed()
        except Exception:  # shown in the status line by _settings_changed; ipywidgets would swallow it
            pass

    def _retrain_clicked(self, button) -> None:
        try:
            self.retrain()
        except Exception:  # shown in the status line by retrain; ipywidgets would swallow it
            pass

    def _show_error(self, action: str, err: Exception) -> None:
        self.status.value = (f'<span style="color:#d62728"><b>{action} failed</b>: '
                             f"{html.escape(type(err).__name__)}: {html.escape(str(err))}</span>")

    # ---------------------------------------------------------------- actions
    def retrain(self) -> None:
        """Train an ensemble (``n_seeds`` models) for every selected PE at the current settings, then re-plot.

        Raises:
            Exception: whatever training or evaluation raised, after showing its message in ``status``.
        """
        try:
            task = FixedOffsetRetrieval(16, self.offset.value)
            task.check_seq_len(self.train_len.value)
            pes = self.pes
            self.progress.max = self.steps * len(pes)
            self.progress.value = 0
            self.retrain_button.disabled = True
            start = time.perf_counter()
            try:
                for i, pe in enumerate(pes):
                    label = get_encoding(pe).label
                    self.status.value = f"training {label} ({self.n_seeds} seeds, {self.steps} steps)..."
                    model = RetrievalHead(pe=pe, max_len=MAX_LEN, n_models=self.n_seeds)

                    def tick(step, loss, done=i * self.steps):
                        self.progress.value = done + step

                    train(model, task, steps=self.steps, batch_size=self.batch_size, train_len=self.train_len.value,
                          callback=tick)
                    self._models[self._key(pe)] = model
            finally:
                self.retrain_button.disabled = False
            self._plot(note=f"trained in {time.perf_counter() - start:.1f} s")
        except Exception as err:
            self._show_error("Retrain", err)
            raise

    def _settings_changed(self) -> None:
        try:
            self._show_setting()
        except Exception as err:
            self._show_error("Re-plot", err)
            raise

    def _show_setting(self) -> None:
        missing = [pe for pe in self.pes if self._key(pe) not in self._models]
        if missing:
            self.status.value = ("Not trained yet for " + ", ".join(get_encoding(p).label for p in missing)
                                 + f" at k = {self.offset.value}, training length {self.train_len.value}: "
                                   "press <b>Retrain</b>. The figure still shows the previous setting.")
            return
        self._plot()

    def _plot(self, note: str = "") -> None:
        offset, train_len = self.offset.value, self.train_len.value
        lengths = self.eval_lengths()
        task = FixedOffsetRetrieval(16, offset)
        curves = {pe: (lengths, accuracy_by_length(self._models[self._key(pe)], task, lengths,
                                                   n_samples=self.eval_samples).numpy())
                  for pe in self.pes}
        self.figure = figures.accuracy_vs_length(
            curves, chance=task.chance, train_len=train_len,
            title=f"Live: offset k = {offset}, training length {train_len}, {self.n_seeds} seeds "
                  "(line = mean, band = min..max)")
        self.figure.update_layout(template=render.BOOK_TEMPLATE)
        self.output.outputs = (_figure_output(self.figure),)
        self.status.value = f"Showing k = {offset}, training length {train_len}, evaluated up to " \
                            f"L = {lengths[-1]}" + (f"; {note}." if note else ".")


__all__ = ["RetrievalExplorer", "eval_choices", "max_offset"]
