"""Probes of trained models: equivariance (chapter 2), pinning (chapter 3), head profiles (chapter 7).

Each probe asks the model for its queries, keys and scores through its public methods, so the
same probe runs on every registered position encoding. Relative positions follow the layout of
:mod:`~lengthgen_utils.kernel`: ``D = key position - query position``, distance ``d = -D``; a
global shift of every position is ``position_shift``.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from ._validate import check_int, check_int_sequence
from .attention import attention_scores, causal_mask, row_weights
from .positional import RoPE, rope_angles
from .tasks import as_task_list, query_targets
from .training import ensemble_cross_entropy, model_threads


# ---------------------------------------------------------------- equivariance (chapter 2)
def rope_angle_error(positions: Tensor, d_head: int, base: float = 10000.0,
                     dtype: torch.dtype = torch.float16) -> Tensor:
    """How far a RoPE angle formed in ``dtype`` is from the exact angle, wrapped to ``[0, pi]``.

    Args:
        positions, d_head, base, dtype: as in :func:`~lengthgen_utils.positional.rope_angles`.

    Returns:
        float64 tensor ``[..., d_head // 2]``: ``|wrap(angle_dtype - angle_exact)|`` in radians,
        where ``wrap`` maps to ``(-pi, pi]`` (an error of ``2 pi`` is no error).

    Source: the rounding of IEEE half/bfloat16 formats; the failure mode is
    discussed for long-context RoPE by e.g. Barbero et al. 2025.
    """
    err = rope_angles(positions, d_head, base, dtype) - rope_angles(positions, d_head, base)
    return torch.remainder(err + math.pi, 2 * math.pi).sub(math.pi).abs()


@torch.no_grad()
def position_logits(model, seq_len: int, position_shift: int = 0, angle_dtype: str = "float64") -> Tensor:
    """The logit of a query at every position ``m`` against a key at every position ``n`` of a length-L sequence.

    Row ``m = L-1`` is the model's own score row (``model.scores(L)``). The matrix is returned
    without a causal mask (the head only ever uses ``n <= m``). For a relative encoding
    (RoPE, ALiBi, ...) ``s(m, n)`` depends on ``n - m`` alone (chapter 2): the matrix is constant
    along its diagonals.

    Args:
        model: a :class:`~lengthgen_utils.models.RetrievalHead` ensemble (M models).
        seq_len: L >= 1.
        position_shift: added to every position (``0..L-1`` becomes ``shift..shift+L-1``).
        angle_dtype: for RoPE heads, the dtype the angles are formed in (``"float64"`` = exact;
            see :class:`~lengthgen_utils.positional.RoPE`).

    Returns:
        tensor ``[M, L, L]`` (query position, key position), on the model's device.

    Raises:
        ValueError / TypeError: bad ``seq_len``/``position_shift``, positions the encoding cannot
            cover, a low-precision ``angle_dtype`` for a head that is not RoPE.
    """
    seq_len = check_int("seq_len", seq_len, minimum=1)
    positions = torch.arange(seq_len) + check_int("position_shift", position_shift)
    encoding = model.encoding
    if angle_dtype != "float64":
        if not isinstance(encoding, RoPE):
            raise ValueError(f"angle_dtype applies to RoPE heads only; this head's encoding is {encoding!r}")
        encoding = replace(encoding, angle_dtype=angle_dtype)
    q, k = model.queries_keys(positions, encoding=encoding)
    s = attention_scores(q, k)
    bias = encoding.score_bias(model.pe_params, positions, positions, 1)
    return s if bias is None else s + bias.reshape(-1, seq_len, seq_len).to(s)


def position_attention(model, seq_len: int) -> Tensor:
    """Causal attention of a query at every position ``m`` over the keys ``n <= m``.

    Args:
        model: a ``RetrievalHead`` ensemble (its own normaliser: softmax or linear).
        seq_len: L >= 1.

    Returns:
        tensor ``[M, L, L]`` (query position, key position), zeros above the diagonal.
        Row ``L-1`` is ``model.attention_row(L)``.
    """
    s = position_logits(model, seq_len)
    causal = causal_mask(seq_len, s.device)
    if model.config.attention == "softmax":
        return row_weights(s.masked_fill(~causal, float("-inf")), "softmax")
    return row_weights(s, model.config.attention).masked_fill(~causal, 0.0)


@torch.no_grad()
def shift_logit_difference(model, seq_len: int, shifts) -> Tensor:
    """Largest change of the model's score row when every position is shifted.

    Computes ``max_j |s_j(shift) - s_j(0)|`` with the model's own forward
    path (``model.scores``), for each model and shift.

    Args:
        model: a ``RetrievalHead`` ensemble.
        seq_len: L >= 1.
        shifts: sequence of ints (for an APE table, ``shift + L`` must fit it).

    Returns:
        float64 tensor ``[M, len(shifts)]`` (logit units), on CPU.

    Raises:
        ValueError: a shift that moves a position outside what the encoding covers.
    """
    shifts = check_int_sequence("shifts", shifts)
    base = model.scores(seq_len, 0).double()
    cols = [(model.scores(seq_len, s).double() - base).abs().amax(-1) for s in shifts]
    return torch.stack(cols, -1).cpu()


@torch.no_grad()
def shared_offset_difference(model, short_len: int, long_len: int) -> Tensor:
    """Largest difference between the score rows at two lengths over the relative positions both share.

    The query sits at the last position, so key ``j`` of a length-``L`` row
    has relative position ``D = j - (L-1)``. ``D = -(short_len-1) .. 0`` exist at both
    lengths: they are the last ``short_len`` keys of the long row and all
    keys of the short row.

    Args:
        model: a ``RetrievalHead`` ensemble.
        short_len, long_len: ``1 <= short_len <= long_len``.

    Returns:
        float64 tensor ``[M]``: ``max |s^{long}(D) - s^{short}(D)|`` (logit units), on CPU.

    Raises:
        ValueError: ``short_len > long_len``.
    """
    short_len = check_int("short_len", short_len, minimum=1)
    long_len = check_int("long_len", long_len, minimum=short_len)
    short = model.scores(short_len).double()
    long = model.scores(long_len).double()[:, long_len - short_len:]
    return (long - short).abs().amax(-1).cpu()


def diagonal_spread(logits: Tensor, causal: bool = True) -> Tensor:
    """How far a ``[.., L, L]`` logit matrix is from being constant along its diagonals.

    For every diagonal ``n - m = D`` (``D <= 0`` only when ``causal``), takes
    ``max - min`` of the entries on it; returns the largest such range.

    Args:
        logits: tensor ``[..., L, L]`` (query position, key position), e.g. from :func:`position_logits`.
        causal: only look at ``n <= m``.

    Returns:
        tensor ``[...]`` (float64, CPU): 0 for an exactly offset-only matrix.

    Raises:
        ValueError: ``logits`` is not square in its last two dims.
    """
    if not isinstance(logits, Tensor) or logits.dim() < 2 or logits.shape[-1] != logits.shape[-2]:
        raise ValueError(f"logits must be a tensor [..., L, L]; got shape {tuple(getattr(logits, 'shape', ()))}")
    x = logits.detach().double().cpu()
    seq_len = x.shape[-1]
    spreads = []
    for d in range(-(seq_len - 1), 1 if causal else seq_len):
        diag = torch.diagonal(x, offset=d, dim1=-2, dim2=-1)
        spreads.append(diag.amax(-1) - diag.amin(-1))
    return torch.stack(spreads, -1).amax(-1)


@torch.no_grad()
def shift_invariance(model, tokens: Tensor, shifts=(1, 1000, 100000)) -> dict:
    """Largest change of the model's output logits when every position is shifted.

    Args:
        model: a model whose ``forward(tokens, position_shift)`` returns logits (or a tuple starting with them).
        tokens: probe batch.
        shifts: global position shifts to try.

    Returns:
        ``{shift: max |logits(shift) - logits(0)|}`` (floats).
    """
    def logits(shift):
        out = model(tokens, position_shift=shift)
        return out[0] if isinstance(out, tuple) else out

    shifts = check_int_sequence("shifts", shifts)
    with model_threads(model):  # the thread count the model is trained and evaluated with
        base = logits(0)
        return {shift: float((logits(shift) - base).abs().max()) for shift in shifts}


# ---------------------------------------------------------------- pinning (chapter 3)
@torch.no_grad()
def attention_argmax(model, lengths) -> Tensor:
    """The absolute key position the query attends to most, at each length.

    In the position-only head the attention row does not depend on the
    tokens, so every sequence of a given length has the same argmax; this is
    it. Ties go to the lowest position.

    Returns:
        LongTensor ``[M, len(lengths)]`` of positions in ``0 .. L-1``, on CPU.
    """
    lengths = check_int_sequence("lengths", lengths, minimum=1)
    return torch.stack([model.scores(L).argmax(-1) for L in lengths], -1).cpu()


def attention_argmax_histogram(model, lengths) -> Tensor:
    """How many of the given lengths put the attention argmax on each absolute position.

    Returns:
        LongTensor ``[M, max(lengths)]``: counts per position, each row summing to ``len(lengths)``.
    """
    lengths = check_int_sequence("lengths", lengths, minimum=1)
    argmax = attention_argmax(model, lengths)
    counts = torch.zeros(argmax.shape[0], max(lengths), dtype=torch.long)
    return counts.scatter_add_(1, argmax, torch.ones_like(argmax))


def pinned_position(model, lengths) -> tuple[Tensor, Tensor]:
    """The absolute position each model pins to at the given lengths, and how consistently.

    Returns:
        ``position`` LongTensor ``[M]``: the most frequent attention argmax (lowest on ties);
        ``fraction`` float64 ``[M]``: the share of ``lengths`` whose argmax is that position.
    """
    counts = attention_argmax_histogram(model, lengths)
    top, position = counts.max(-1)
    return position, top.double() / counts.sum(-1).double()


def _position_table(model) -> Tensor:
    table = model.pe_params["table"] if "table" in model.pe_params else None
    if table is None:
        raise TypeError(f"model must have a learned position table (e.g. LearnedAPE); its encoding is "
                        f"{model.encoding!r}")
    return table


def position_table_gradient(model, task, seq_lens, batch_size: int = 256, seed: int = 0) -> Tensor:
    """Norm of the loss gradient on each row of a learned position table, from one batch at each training length.

    Args:
        model: a ``RetrievalHead`` ensemble with a learned table (M models, ``max_len`` rows).
        task: the task (e.g. :class:`~lengthgen_utils.tasks.FixedOffsetRetrieval`), or one per model.
        seq_lens: the lengths to draw batches at (e.g. every training length).
        batch_size: sequences per batch.
        seed: seeds the batches.

    Returns:
        float64 tensor ``[M, max_len]``: ``||d loss / d p_t||`` per row (0 exactly
        for every row no batch reaches), on CPU. The model's ``.grad`` fields are
        left as they were.

    Raises:
        TypeError: the model has no learned position table.
    """
    table = _position_table(model)
    seq_lens = check_int_sequence("seq_lens", seq_lens, minimum=2)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    tasks = as_task_list(task, model.n_models)
    gen = torch.Generator().manual_seed(check_int("seed", seed, minimum=0))
    total = torch.zeros_like(table)
    for seq_len in seq_lens:
        tokens, _ = tasks[0].sample(batch_size, seq_len, gen, device=model.device)
        logits, _ = model(tokens)
        loss = ensemble_cross_entropy(logits, query_targets(tasks, tokens)).sum()
        (grad,) = torch.autograd.grad(loss, table)
        total += grad
    return total.norm(dim=-1).double().cpu()


@torch.no_grad()
def table_drift(model, initial) -> Tensor:
    """How far each row of a learned position table moved from its initial value: ``max_c |p_t[c] - p0_t[c]|``.

    Args:
        model, initial: two ``RetrievalHead`` ensembles of the same shape (e.g. after and before training).

    Returns:
        float64 tensor ``[M, max_len]``, on CPU (exactly 0 for a row training never changed).

    Raises:
        TypeError: either model has no learned table. ValueError: the tables' shapes differ.
    """
    a, b = _position_table(model), _position_table(initial)
    if a.shape != b.shape:
        raise ValueError(f"position tables differ in shape: model {tuple(a.shape)}, initial {tuple(b.shape)}")
    return (a.detach().cpu().double() - b.detach().cpu().double()).abs().amax(-1)


@torch.no_grad()
def query_similarity(model, positions, reference_position: int) -> Tensor:
    """Cosine similarity between the query at each position and the query at ``reference_position``.

    Used to see what a query at a position never seen in training computes:
    for APE its table row is still at initialization, so its query is close
    to ``W_Q u``.

    Returns:
        float64 tensor ``[M, len(positions)]`` of cosines in [-1, 1], on CPU.
    """
    positions = check_int_sequence("positions", positions, minimum=0)
    reference_position = check_int("reference_position", reference_position, minimum=0)
    q, _ = model.queries_keys(torch.tensor((reference_position, *positions)))
    q = q.double()
    return torch.nn.functional.cosine_similarity(q[:, 1:], q[:, :1], dim=-1).cpu()


# ---------------------------------------------------------------- transformer heads (chapter 7)
@torch.no_grad()
def head_offset_profiles(model, task, seq_len: int, n_samples: int = 64, seed: int = 999,
                         min_query: int | None = None) -> tuple[Tensor, Tensor]:
    """Each head's mean attention logit and mean attention weight as a function of the distance back.

    For every query position ``i >= min_query`` and key ``j <= i``, the distance is
    ``d = i - j`` (relative position ``D = -d``; 0 = the query itself). Logits and weights are
    averaged over queries and over random sequences (i.e. over content).

    Args:
        model: a ``Transformer`` ensemble.
        task: the task whose sequences are fed (content distribution).
        seq_len: length of the probe sequences.
        n_samples: probe sequences.
        seed: probe seed.
        min_query: smallest query position averaged (default ``seq_len // 2``, so every
            averaged query sees at least ``seq_len // 2`` keys).

    Returns:
        ``logit [M, n_layers, n_heads, seq_len]`` and ``weight`` of the same shape, where
        index ``d`` holds distance ``d`` (only ``d <= min_query`` are averaged over all queries;
        larger ``d`` are NaN).
    """
    seq_len = task.check_seq_len(seq_len)
    min_query = seq_len // 2 if min_query is None else check_int("min_query", min_query, 0, seq_len - 1)
    tokens, _ = task.sample(check_int("n_samples", n_samples, minimum=1), seq_len,
                            torch.Generator().manual_seed(seed), device=model.device)
    with model_threads(model):  # the thread count the model is trained and evaluated with
        scores = model.head_scores(tokens)  # list of [M, B, H, L, L]
    queries = torch.arange(min_query, seq_len, device=model.device)
    distances = torch.arange(min_query + 1, device=model.device)
    keys = queries[None, :] - distances[:, None]  # [d, query]: every averaged query sees every distance
    logit = torch.full((model.n_models, len(scores), model.n_heads, seq_len), float("nan"), dtype=torch.float64)
    weight = logit.clone()
    for layer, s in enumerate(scores):
        for out, values in ((logit, s), (weight, s.softmax(-1))):
            picked = values[..., queries.expand_as(keys), keys]  # [M, B, H, d, query]: one gather for all d
            out[:, layer, :, : min_query + 1] = picked.double().mean((1, 4)).cpu()
    return logit, weight
