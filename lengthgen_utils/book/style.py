"""The book's one look: how encodings and models are named and coloured, and the flags every accuracy figure gets.

**One colour per encoding and model, set once.** An encoding's colour is its ``color``
(:mod:`~lengthgen_utils.core.encodings`); the models that are not an encoding alone (a normaliser, a
closed form, a recurrent model) take theirs from :data:`MODEL_COLORS`. Red is APE's and nothing
else's; the palette for seeds and unnamed curves (:data:`PALETTE`) has no red.

**Flags.** A figure whose mean accuracy sits well below chance says so (a likely bug, not a finding), and a
figure over fewer than five seeds says so in its title.
"""
from __future__ import annotations

import re
import warnings

import numpy as np
import plotly.graph_objects as go

from ..core.encodings import ENCODINGS, Encoding, RoPE, RotaryFrequencies, get_encoding


PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#393b79", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]
"""Colours of seeds and of curves that name no encoding or model, in order (plotly's, with indigo for red)."""


MODEL_COLORS = {
    # the single heads of chapters 6 and 8: the encoding's colour for the softmax head, another for each normaliser
    "RoPE head, softmax": RoPE.color,
    "RoPE head (softmax)": RoPE.color,
    "RoPE head, linear": "#6b6ecf",
    "rotary head, softmax": RotaryFrequencies.color,
    "rotary head, linear": "#8c6d31",
    "rotary linear head": "#8c6d31",
    "rotary head, linear / L": "#a55194",
    "rotary head, linear / sum": "#637939",
    "rotary head, exp": "#9c9ede",
    "rotary head, elu+1 linear": "#e6550d",
    # chapter 6's directly parameterised kernels and closed forms
    "direct kernel, RoPE: trained": "#5254a3",
    "direct kernel, well-conditioned: trained": "#8ca252",
    "RoPE: min-norm c*": "#000000",
    "RoPE: closed-form c_t": "#ce6dbd",
    "well-conditioned: min-norm c*": "#bd9e39",
    # chapter 8
    "linear recurrent model": "#006d2c",
    "free transition (n = 128)": "#74c476",
    "rotation transition (n = 128)": "#393b79",
}
"""The colour of every model the chapters name that is not an encoding alone, the same in every chapter.

Two names of one model (chapter 6's "rotary head, linear" is chapter 8's "rotary linear head") share a
colour; no two models do, and none takes an encoding's colour unless it is that encoding's softmax head.
Chapters pass it as ``colors=`` / ``styles=`` (a name the figure does not draw is ignored)."""


BASE_COLORS = {10.0: "#2ca02c", 100.0: "#9467bd", 1000.0: "#8c564b", 10000.0: RoPE.color, 100000.0: "#e377c2"}
"""The colour of each RoPE base the book trains, the same in every figure: the book's base 10^4 is RoPE's blue."""


def base_color(base: float) -> str:
    """The colour of RoPE base ``base`` (:data:`BASE_COLORS`).

    Raises:
        ValueError: ``base`` is not one of the book's bases.
    """
    if isinstance(base, bool) or not isinstance(base, (int, float)) or float(base) not in BASE_COLORS:
        raise ValueError(f"base must be one of the book's RoPE bases {sorted(BASE_COLORS)}; got base={base!r}")
    return BASE_COLORS[float(base)]


def rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def encoding_of(key) -> Encoding | None:
    """The encoding a curve key stands for: an Encoding, or a registered encoding's name; else None."""
    if isinstance(key, Encoding):
        return key
    return get_encoding(key) if isinstance(key, str) and key in ENCODINGS else None


def label_of(key) -> str:
    """A curve's legend text: the encoding's label when the key is an encoding (or its name), else the key."""
    encoding = encoding_of(key)
    return encoding.label if encoding is not None else str(key)


SHORT_LABELS = (("APE (learned)", "APE"), (" + random positions", " + rand. pos."), (" + random shift", " + rand. shift"))


def short_label(key) -> str:
    """A curve's label (see ``label_of``) shortened to fit beside a panel on a phone: ``"APE (learned) + random
    shift"`` becomes ``"APE + rand. shift"``; the chapter's caption names the encodings in full."""
    label = label_of(key)
    for long, short in SHORT_LABELS:
        label = label.replace(long, short)
    return label


def color_for(key, i: int) -> str:
    """A curve's colour: the encoding's own when the key is an encoding (or its name), else the i-th of the palette."""
    encoding = encoding_of(key)
    return encoding.color if encoding is not None else PALETTE[i % len(PALETTE)]


MIN_SEEDS = 5  # fewer seeds than this are flagged in the figure title (the book reports >= 5 seeds per point)


BELOW_CHANCE_TOL = 0.05  # a mean accuracy this far below chance is flagged as a likely bug


def seed_note(title: str, n_seeds: int) -> str:
    """``title`` noting ``"fewer than 5"`` seeds when ``n_seeds < MIN_SEEDS``.

    A title that already says ``"N seeds"`` gets ``"N seeds (fewer than 5)"`` in place; any
    other gets ``" (N seeds: fewer than 5)"`` appended.
    """
    if n_seeds >= MIN_SEEDS:
        return title
    said = f"{n_seeds} seed{'s' if n_seeds != 1 else ''}"
    noted, count = re.subn(rf"(?<![\d.]){re.escape(said)}\b", f"{said} (fewer than {MIN_SEEDS})", title, count=1)
    return noted if count else f"{title} ({said}: fewer than {MIN_SEEDS})"


def flag_below_chance(fig: go.Figure, means: dict, chance: float, tol: float = BELOW_CHANCE_TOL) -> list[str]:
    """Warn and annotate ``fig`` when a mean accuracy lies more than ``tol`` below ``chance``.

    On a balanced task no predictor that ignores the target can score below chance in
    expectation, so a mean clearly below it points at a bug (mis-aligned targets,
    scoring padded positions, a wrong chance level) rather than at a result.

    Args:
        fig: the figure to annotate.
        means: ``{curve name: mean accuracies [n]}`` (NaN entries are ignored).
        chance: chance accuracy.
        tol: allowed shortfall (sampling noise).

    Returns:
        the names of the flagged curves (empty when none is below chance).
    """
    flagged = [name for name, m in means.items()
               if np.any(np.nan_to_num(np.asarray(m, dtype=float), nan=np.inf) < chance - tol)]
    if flagged:
        names = ", ".join(label_of(n) for n in flagged)
        warnings.warn(f"mean accuracy below chance ({chance:.3f} - {tol}) for {names}: likely a bug", stacklevel=3)
        fig.add_annotation(text=f"below chance: likely a bug ({names})", xref="paper", yref="paper", x=0.5, y=0.02,
                           showarrow=False, font=dict(color="#8a4b00", size=14), bgcolor="rgba(255,255,255,0.8)")
    return flagged


SEED_COLORS = PALETTE
