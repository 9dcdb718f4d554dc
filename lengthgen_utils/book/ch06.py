"""Chapter 6, the linear-attention control: its figures (closed form against measurement, reference curves)."""
from __future__ import annotations


import numpy as np
import plotly.graph_objects as go
import torch

from .figures import _log_x_marker
from .style import PALETTE
from .tables import Table


def predicted_vs_measured(curves: dict, train_len: int, title: str,
                          y_title: str = "mean squared error ||o - e(y)||^2 (log scale)",
                          colors: dict | None = None) -> go.Figure:
    """A closed-form prediction (line) against measurements (markers: mean, error bars: min..max over seeds).

    Args:
        curves: ``{name: (lengths [n], predicted [n], measured [n_seeds, n])}``.
        train_len: drawn as a vertical line.
        title: figure title.
        colors: optional ``{name: colour}`` (one colour per model across a chapter's figures).

    Returns:
        a plotly ``Figure`` with log axes (x: sequence length in tokens).
    """
    if not curves:
        raise ValueError("curves must name at least one curve")
    fig = go.Figure()
    palette = ["#2ca02c", "#9467bd", "#1f77b4", "#ff7f0e"]
    for i, (name, (lengths, predicted, measured)) in enumerate(curves.items()):
        lengths = np.asarray(lengths)
        predicted = np.asarray(predicted, dtype=float)
        measured = np.atleast_2d(np.asarray(measured, dtype=float))
        if predicted.shape != lengths.shape or measured.shape[1] != len(lengths):
            raise ValueError(f"{name!r}: predicted must be [{len(lengths)}] and measured [n_seeds, {len(lengths)}]")
        color = (colors or {}).get(name, palette[i % len(palette)])
        mean = measured.mean(0)
        fig.add_trace(go.Scatter(x=lengths, y=predicted, mode="lines", name=f"{name}: predicted",
                                 line=dict(color=color, width=2)))
        fig.add_trace(go.Scatter(x=lengths, y=mean, mode="markers", name=f"{name}: measured (mean of {measured.shape[0]})",
                                 marker=dict(color=color, size=10, symbol="circle-open", line=dict(width=2)),
                                 error_y=dict(type="data", symmetric=False, array=measured.max(0) - mean,
                                              arrayminus=mean - measured.min(0))))
    _log_x_marker(fig, train_len, line=dict(color="gray", dash="dash", width=1.5), text="training length")
    fig.update_layout(title=title)
    ticks = sorted({int(x) for _, (lengths, _, _) in curves.items() for x in lengths} | {int(train_len)})
    fig.update_xaxes(title="evaluation sequence length L (tokens, log scale)", type="log", tickvals=ticks,
                     ticktext=[str(t) for t in ticks],
                     range=[float(np.log10(ticks[0])) - 0.1, float(np.log10(ticks[-1])) + 0.1])
    fig.update_yaxes(title=y_title, type="log", dtick="D2")  # label 1, 2, 5 per decade: the default crowds 2..9
    return fig


# --- chapter 6: reference curves beside trained ensembles
def add_reference_curves(fig: go.Figure, curves: dict, colors: dict | None = None) -> go.Figure:
    """Add single curves (closed forms, not ensembles) to a figure made by :func:`accuracy_vs_length`.

    A reference curve is one computed value per length (e.g. the accuracy of the min-norm interpolant
    itself), so it is drawn dashed, without a band and without counting as seeds in the title.

    Args:
        fig: a figure from :func:`accuracy_vs_length` (its x axis is ``log2(L)``).
        curves: ``{name: (lengths [n], values [n])}``.
        colors: optional ``{name: colour}``.

    Returns:
        ``fig``, with one dashed line per curve.

    Raises:
        ValueError: ``curves`` is empty or a curve's values do not match its lengths.
    """
    if not curves:
        raise ValueError("curves must name at least one curve")
    for i, (name, (lengths, values)) in enumerate(curves.items()):
        lengths = np.asarray(lengths)
        values = np.asarray(values, dtype=float)
        if values.shape != lengths.shape:
            raise ValueError(f"values for {name!r} must have shape {lengths.shape}; got {values.shape}")
        color = (colors or {}).get(name, PALETTE[(i + 5) % len(PALETTE)])
        fig.add_trace(go.Scatter(x=np.log2(lengths), y=values, mode="lines+markers", name=str(name),
                                 line=dict(color=color, width=2, dash="dash"), marker=dict(symbol="diamond"),
                                 customdata=lengths, hovertemplate="L=%{customdata:d}: %{y:.3f}<extra></extra>"))
    return fig


def kernel_error_table(kernels: dict, lengths, train_len: int, nu, short: dict, caption: str):
    """Chapter 6's table of direct kernel heads: predicted against measured squared error per length.

    ``kernels`` maps a frequency set's name to its kernel-head result (``predicted_squared_error [n]``,
    ``squared_error [n_seeds, n]`` over ``lengths``, in tokens); ``nu [n]`` is the noise ratio of the
    well-conditioned c* per length; ``short`` gives each name's column prefix. Per length and kernel: the
    predicted / measured (seed mean) error, and the predicted error added per relative position beyond the
    window, (error(L) - error(train_len)) / (L - train_len).
    """
    rows = []
    for col, L in enumerate(lengths):
        row = {"L": L}
        for name, k in kernels.items():
            pred = k.predicted_squared_error
            row[f"{short[name]}: pred. / meas."] = f"{pred[col]:.3f} / {k.squared_error[:, col].mean():.3f}"
            row[f"{short[name]}: per D"] = (
                f"{(pred[col] - pred[0]) / (L - train_len):.3f}" if L > train_len else "")
        row["ν(L) of c*"] = f"{nu[col]:.2f}"
        rows.append(row)
    return Table.from_rows(rows, caption=caption)


# --- the exercises' numbers (chapter 6, "Exercises": the solutions quote this page's run)
def closed_form_after(run, exp, steps: int) -> dict:
    """Exercise 1: the closed-form gradient-descent kernel ``c_t`` of a direct kernel head's run after its own
    steps and after ``steps``, which says what a longer run does without training it.

    Args:
        run: a :func:`~lengthgen_utils.run.runners.run_kernel_head` result (its ``frequencies``, ``lr``,
            ``steps``, ``hessian_eigenvalues``).
        exp: its experiment (offset, training length, vocabulary, ``d_head``, evaluation lengths and samples).
        steps: the longer run's steps.

    Returns:
        ``{name: value}`` for the glue names ``ch6_ex1_<name>_short`` (after ``run.steps``) and
        ``..._long`` (after ``steps``): ``resolved`` (directions with ``2 lr lambda_i t > 1``), ``loss`` (the
        expected training loss ``J(c_t)``), ``off_target`` (the largest kernel value inside the window off the
        target, in units of ``s(-k)``), ``accuracy`` (at the training length) and ``error`` (the expected
        squared error at the longest evaluation length); and ``steps_long``.

    Source: chapter 6, exercise 1.
    """
    from ..analysis import theory
    from ..core.models import KernelHead
    from ..core.rope import rope_kernel_features
    from ..run.evaluation import accuracy_by_length

    theta, k = run.frequencies, exp.offset
    h, b, _ = theory.squared_loss_quadratic(exp.train_len, k, exp.vocab_size, exp.d_head, frequencies=theta)
    window = theory.trained_relative_positions(exp.train_len, k)  # D = -(L_train - 1) .. -1
    longest = max(exp.eval_lengths)
    far = rope_kernel_features(torch.arange(longest) - (longest - 1), exp.d_head, frequencies=theta)
    out = {"steps_long": steps}
    for label, t in (("short", run.steps), ("long", steps)):
        c = theory.gradient_descent_kernel(h, b, run.lr, t)
        s = c @ rope_kernel_features(window, exp.d_head, frequencies=theta).T
        target = s[window == -k]
        head = KernelHead(exp.vocab_size, exp.d_head, frequencies=theta).double()  # float64, as c* in the run
        with torch.no_grad():
            head.c.copy_(c[None])
        out |= {
            f"resolved_{label}": int((2 * run.lr * run.hessian_eigenvalues * t > 1).sum()),
            f"loss_{label}": float(c @ h @ c - 2 * b @ c + 1),
            f"off_target_{label}": float((s[window != -k] / target).max()),
            f"accuracy_{label}": float(accuracy_by_length(head, exp.task, [exp.train_len],
                                                          n_samples=exp.eval_samples)[0, 0]),
            f"error_{label}": float(theory.expected_squared_error(c @ far.T, k, exp.vocab_size)),
        }
    return out


def random_start(exp, frequencies, init_std: float = 0.1, seeds=(0, 1, 2, 3), steps: int = 500) -> dict:
    """Exercise 2: direct kernel heads trained from a random start ``c_0`` against ``c* + P_N c_0``, the
    min-norm interpolant plus the start's component in the null space of ``Phi_T``.

    Args:
        exp: the direct kernel head's experiment (offset, training length, vocabulary, ``d_head``, task).
        frequencies: the heads' frequencies (rad/token); init_std: the start's scale; seeds: one per head.
        steps: SGD steps, at the chapter's step size ``0.5 / lambda_max(H)``.

    Returns:
        ``{name: value}`` for the glue names ``ch6_ex2_<name>``: ``rel_min``, ``rel_max`` (over the heads,
        ``|c - (c* + P_N c_0)| / |c|``) and ``null_min``, ``null_max`` (``|P_N c_0|``).

    Source: chapter 6, exercise 2.
    """
    from ..analysis import theory
    from ..core.models import KernelHead
    from ..core.rope import rope_kernel_features
    from ..run.optim import OptimizerSettings
    from ..run.training import train_squared_loss

    seeds = list(seeds)
    model = KernelHead(exp.vocab_size, exp.d_head, frequencies=frequencies, n_models=len(seeds),
                       init_std=init_std, seeds=seeds)
    c0 = model.c.detach().double().clone()
    h, _, _ = theory.squared_loss_quadratic(exp.train_len, exp.offset, exp.vocab_size, exp.d_head,
                                            frequencies=frequencies)
    lr = 0.5 / float(torch.linalg.eigvalsh(h).max())
    train_squared_loss(model, exp.task, OptimizerSettings("sgd", lr=lr), steps=steps, seed=seeds)
    trained = theory.trained_relative_positions(exp.train_len, exp.offset)
    phi = rope_kernel_features(trained, exp.d_head, frequencies=frequencies)
    null = c0 @ (torch.eye(phi.shape[1], dtype=phi.dtype) - torch.linalg.pinv(phi) @ phi).T  # P_N c_0
    c_star = theory.min_norm_interpolant(trained, exp.offset, exp.d_head, frequencies=frequencies)
    c = model.c.detach().double()
    rel = (c - (c_star + null)).norm(dim=1) / c.norm(dim=1)
    return {"rel_min": float(rel.min()), "rel_max": float(rel.max()),
            "null_min": float(null.norm(dim=1).min()), "null_max": float(null.norm(dim=1).max())}
