"""Chapter 7, the transformer: its figures (attention by distance, trained heads against their nulls)."""
from __future__ import annotations


import numpy as np
import plotly.graph_objects as go

from .render import FIGURE_HEIGHT


def head_offset_heatmap(profile, title: str, max_offset: int | None = None, value: str = "mean attention weight") -> go.Figure:
    """Heatmap of a per-head profile by distance: rows = (layer, head), columns = relative position ``D = -d``.

    Args:
        profile: ``[n_layers, n_heads, n_distances]`` (index ``d`` is the relative position ``D = -d``).
        title: figure title.
        max_offset: show relative positions ``0 .. -max_offset`` only.
        value: what the colour encodes (colour-bar title).
    """
    profile = np.asarray(profile, dtype=float)
    n_layers, n_heads, n_off = profile.shape
    n_off = n_off if max_offset is None else min(n_off, max_offset + 1)
    z = profile[:, :, :n_off].reshape(n_layers * n_heads, n_off)
    rows = [f"layer {l + 1} head {h + 1}" for l in range(n_layers) for h in range(n_heads)]
    fig = go.Figure(go.Heatmap(z=z, x=[-d for d in range(n_off)], y=rows, colorscale="Viridis",
                               colorbar=dict(title=dict(text=value, side="right")),
                               hovertemplate="%{y}, D = %{x}: %{z:.3f}<extra></extra>"))
    fig.update_layout(title=title, height=max(FIGURE_HEIGHT, 60 + 28 * len(rows)))
    fig.update_xaxes(title="relative position D = j − i (tokens)")  # left to right, as every offset axis of the book
    fig.update_yaxes(title="", autorange="reversed")
    return fig


# --- chapter 7: trained heads against an untrained null
def trained_vs_null(groups: dict, title: str, y_title: str, null_names=("untrained",),
                    trained_name: str = "trained") -> go.Figure:
    """A statistic of trained heads (one marker each) beside its null distributions (box plots), per group.

    Args:
        groups: ``{group: {"trained": values [n], "<null name>": values [m], ...}}``, e.g. one group per
            offset ``k``; every null named in ``null_names`` must be present (it may be empty).
        title: figure title.
        y_title: the statistic, with units.
        null_names: the null distributions to draw, in order.
        trained_name: the key of the trained heads' values.

    Returns:
        a plotly ``Figure``: for each group, one box per null (median, quartiles, whiskers to 1.5 IQR,
        every value drawn as a point) and the trained heads as large markers.

    Raises:
        ValueError: no group, or a group without the trained values or a null.
    """
    if not groups:
        raise ValueError("groups must name at least one group")
    fig = go.Figure()
    null_colors = ["#7f7f7f", "#bcbd22", "#17becf"]
    for j, null in enumerate(null_names):
        xs, ys = [], []
        for group, values in groups.items():
            if null not in values or trained_name not in values:
                raise ValueError(f"group {group!r} must hold {trained_name!r} and {null!r}; got {sorted(values)}")
            v = np.asarray(values[null], dtype=float).ravel()
            xs += [str(group)] * len(v)
            ys += v.tolist()
        fig.add_trace(go.Box(x=xs, y=ys, name=f"{null} (null)", boxpoints="all", jitter=0.4, pointpos=0,
                             marker=dict(color=null_colors[j % len(null_colors)], size=4), line=dict(width=1),
                             offsetgroup=str(j)))
    xs = [str(g) for g, v in groups.items() for _ in np.asarray(v[trained_name]).ravel()]
    ys = [float(x) for v in groups.values() for x in np.asarray(v[trained_name], dtype=float).ravel()]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=f"{trained_name} (each seed)",
                             marker=dict(color="#1f77b4", size=11, symbol="diamond", line=dict(width=1, color="white"))))
    fig.update_layout(title=title, boxmode="group")
    fig.update_yaxes(title=y_title)
    return fig
