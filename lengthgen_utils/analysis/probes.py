"""Probes of trained models: equivariance (chapter 2), pinning (chapter 3), head profiles (chapter 7).

Each probe asks the model for its queries, keys and scores through its public methods, so the
same probe runs on every registered position encoding. Relative positions follow the layout of
:mod:`~lengthgen_utils.analysis.kernel`: ``D = key position - query position``, distance ``d = -D``; a
global shift of every position is ``position_shift``.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from .._validate import check_int, check_int_sequence, check_nonempty, per_model_ints
from ..core.attention import ELU_LINEAR, attention_scores, row_weights
from ..core.encodings import RoPE
from ..core.rope import rope_angles
from ..core.tasks import as_task_list, query_targets, shared_task
from ..core.seeding import generator
from ..run.training import ensemble_cross_entropy, model_threads
from .kernel import CarrierFit, fit_carrier


# ---------------------------------------------------------------- equivariance (chapter 2)
def rope_angle_error(positions: Tensor, d_head: int, base: float = 10000.0,
                     dtype: torch.dtype = torch.float16) -> Tensor:
    """How far a RoPE angle formed in ``dtype`` is from the exact angle, wrapped to ``[0, pi]``.

    Args:
        positions, d_head, base, dtype: as in :func:`~lengthgen_utils.core.rope.rope_angles`.

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
    """The logit of a query at every position ``m`` against a key at every position ``j`` of a length-L sequence.

    Row ``m = L-1`` is the model's own score row (``model.scores(L)``). The matrix is returned
    without a causal mask (the head only ever uses ``j <= m``). For a relative encoding
    (RoPE, ALiBi, ...) the logit ``s_j`` of query ``m`` depends on ``D = j - m`` alone (chapter 2): the matrix is constant
    along its diagonals.

    Args:
        model: a :class:`~lengthgen_utils.core.models.RetrievalHead` ensemble (M models).
        seq_len: L >= 1.
        position_shift: added to every position (``0..L-1`` becomes ``shift..shift+L-1``).
        angle_dtype: for RoPE heads, the dtype the angles are formed in (``"float64"`` = exact;
            see :class:`~lengthgen_utils.core.encodings.RoPE`).

    Returns:
        tensor ``[M, L, L]`` (query position ``m``, key position ``j``), on the model's device.

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
        model: a ``RetrievalHead`` ensemble (its own normaliser, any of
            :data:`~lengthgen_utils.core.attention.ROW_WEIGHTS`, applied to each query's causal row).
        seq_len: L >= 1.

    Returns:
        tensor ``[M, L, L]`` (query position, key position), zeros above the diagonal.
        Row ``L-1`` is ``model.attention_row(L)``.
    """
    if model.config.attention == ELU_LINEAR:  # no logits: query m's row is the head's own row at length m + 1
        seq_len = check_int("seq_len", seq_len, minimum=1)
        out = torch.zeros(model.n_models, seq_len, seq_len, device=model.device)
        for m in range(seq_len):
            out[:, m, : m + 1] = model.attention_row(m + 1)
        return out
    s = position_logits(model, seq_len)
    out = torch.zeros_like(s)
    for m in range(seq_len):  # query m sees keys 0..m: a normaliser may depend on how many (linear_mean)
        out[:, m, : m + 1] = row_weights(s[:, m, : m + 1], model.config.attention)
    return out


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

    For every diagonal ``j - m = D`` (``D <= 0`` only when ``causal``), takes
    ``max - min`` of the entries on it; returns the largest such range.

    Args:
        logits: tensor ``[..., L, L]`` (query position, key position), e.g. from :func:`position_logits`.
        causal: only look at ``j <= m`` (query ``m``, key ``j``).

    Returns:
        tensor ``[...]`` (float64, CPU): 0 for an exactly offset-only matrix.

    Raises:
        ValueError: ``logits`` is not square in its last two dims, or has an empty dimension.
    """
    if not isinstance(logits, Tensor) or logits.dim() < 2 or logits.shape[-1] != logits.shape[-2]:
        raise ValueError(f"logits must be a tensor [..., L, L]; got shape {tuple(getattr(logits, 'shape', ()))}")
    check_nonempty("logits", logits, "[..., L, L]")
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
    it. Ties go to the lowest position. Each length's row is the model's own score row at that length
    (an encoding may depend on the length, as test-time RoPE scaling does, so rows of one longer logit
    matrix would not do).

    Returns:
        LongTensor ``[M, len(lengths)]`` of positions in ``0 .. L-1``, on CPU.
    """
    lengths = check_int_sequence("lengths", lengths, minimum=1)
    return torch.stack([model.scores(L).argmax(-1).cpu() for L in lengths], -1)


@torch.no_grad()
def attention_at(model, positions, lengths) -> Tensor:
    """The query's attention weight on one absolute key position per model, at each length.

    Args:
        model: a :class:`~lengthgen_utils.core.models.RetrievalHead` ensemble (M models).
        positions: one key position per model (an int or M ints), each ``< min(lengths)``.
        lengths: sequence lengths.

    Returns:
        float64 ``[M, len(lengths)]`` on CPU (e.g. the weight on a pinned position, chapter 3).
    """
    lengths = check_int_sequence("lengths", lengths, minimum=1)
    index = torch.tensor(per_model_ints("positions", positions, model.n_models, minimum=0,
                                        maximum=min(lengths) - 1))
    rows = torch.arange(model.n_models)
    return torch.stack([model.attention_row(L).double().cpu()[rows, index] for L in lengths], -1)


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
        task: the task (e.g. :class:`~lengthgen_utils.core.tasks.FixedOffsetRetrieval`), or one per model.
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
    gen = generator(check_int("seed", seed, minimum=0))
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
    """Each head's mean attention logit and mean attention weight as a function of the relative position.

    For every query position ``m >= min_query`` and key ``j <= m``, the relative position is
    ``D = j - m`` (distance ``d = -D``; ``D = 0`` is the query itself). Logits and weights are
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
        ``logit [M, n_layers, n_heads, seq_len]`` and ``weight`` of the same shape, in the row layout
        of :func:`~lengthgen_utils.analysis.kernel.relative_positions`: index ``j`` holds
        ``D = j - (seq_len - 1)``, so the last index is ``D = 0`` and the target of offset ``k`` is
        index ``-1 - k``. Only ``D >= -min_query`` are averaged over all queries; the entries at
        ``D < -min_query`` (the first ``seq_len - 1 - min_query`` indices) are NaN.
    """
    seq_len = shared_task(task).check_seq_len(seq_len)
    min_query = seq_len // 2 if min_query is None else check_int("min_query", min_query, 0, seq_len - 1)
    tokens, _ = task.sample(check_int("n_samples", n_samples, minimum=1), seq_len,
                            generator(seed), device=model.device)
    with model_threads(model):  # the thread count the model is trained and evaluated with
        scores = model.head_scores(tokens)  # list of [M, B, H, L, L]
    queries = torch.arange(min_query, seq_len, device=model.device)
    relative = torch.arange(-min_query, 1, device=model.device)  # D = -min_query .. 0, the row layout's tail
    keys = queries[None, :] + relative[:, None]  # [D, query]: every averaged query sees every D
    logit = torch.full((model.n_models, len(scores), model.n_heads, seq_len), float("nan"), dtype=torch.float64)
    weight = logit.clone()
    for layer, s in enumerate(scores):
        for out, values in ((logit, s), (weight, s.softmax(-1))):
            picked = values[..., queries.expand_as(keys), keys]  # [M, B, H, D, query]: one gather for all D
            out[:, layer, :, seq_len - 1 - min_query:] = picked.double().mean((1, 4)).cpu()
    return logit, weight


# ---------------------------------------------------------------- how accuracy falls (chapter 5)
def accuracy_transition(accuracy: Tensor, lengths, chance: float, high: float = 0.9, cliff: float = 0.5,
                        gradual: float = 1.0) -> dict:
    """Where each model's accuracy falls and how fast: a cliff or a gradual decay.

    ``L_high`` is the first length with accuracy below ``high``; ``L_half`` the first length with
    accuracy below ``(1 + chance) / 2``, halfway from perfect to chance. The width of the fall is
    ``log2(L_half / L_high)`` octaves: 0 when it happens between two neighbouring lengths of the grid.

    Args:
        accuracy: ``[M, n]`` accuracies at increasing ``lengths``.
        lengths: ``n`` increasing lengths (a fine grid resolves the width: e.g. four per octave).
        chance: the task's chance accuracy.
        high: the accuracy a model counts as intact at.
        cliff, gradual: widths (octaves) at or below which a fall is a cliff, at or above which it is gradual.

    Returns:
        ``{"high": [M] lengths or None, "half": [M] lengths or None, "width": [M] float64 octaves
        (NaN where either length is missing), "start": [M] accuracy at the first length,
        "kind": [M] one of "not learned" (below ``high`` at the first length), "holds" (never below
        ``high``), "cliff", "gradual", "between" (a width in between) or "partial" (below ``high`` but
        never below halfway)}``.

    Raises:
        ValueError: shapes that do not match (or no model), lengths not increasing, chance or high outside (0, 1).
    """
    lengths = check_int_sequence("lengths", lengths, minimum=1)
    accuracy = torch.as_tensor(accuracy, dtype=torch.float64)
    if accuracy.dim() != 2 or accuracy.shape[1] != len(lengths):
        raise ValueError(f"accuracy must be [M, {len(lengths)}] (one column per length); got {tuple(accuracy.shape)}")
    check_nonempty("accuracy", accuracy, f"[M, {len(lengths)}]")
    if any(b <= a for a, b in zip(lengths, lengths[1:])):
        raise ValueError(f"lengths must increase; got {lengths}")
    if not (0 < chance < 1) or not (0 < high < 1) or high <= (1 + chance) / 2:
        raise ValueError(f"need 0 < chance < 1 and (1 + chance)/2 < high < 1; got chance={chance}, high={high}")
    half_level = (1 + chance) / 2

    def first(row, level):
        below = torch.nonzero(row < level)
        return lengths[int(below[0, 0])] if below.numel() else None

    out_high = [first(row, high) for row in accuracy]
    out_half = [first(row, half_level) for row in accuracy]
    width = torch.tensor([math.log2(b / a) if a is not None and b is not None else math.nan
                          for a, b in zip(out_high, out_half)], dtype=torch.float64)
    kinds = []
    for row, a, w in zip(accuracy, out_high, width.tolist()):
        if row[0] < high:
            kinds.append("not learned")
        elif a is None:
            kinds.append("holds")
        elif math.isnan(w):
            kinds.append("partial")
        else:
            kinds.append("cliff" if w <= cliff else "gradual" if w >= gradual else "between")
    return {"high": out_high, "half": out_half, "width": width, "start": accuracy[:, 0].clone(), "kind": kinds}


def copying_heads(weight: Tensor, offset) -> Tensor:
    """The head of each model that puts the most mean attention weight at the task's offset.

    Args:
        weight: ``[M, n_layers, n_heads, n]`` mean attention weight in the row layout (index ``j`` holds
            ``D = j - (n - 1)``; the offset ``k`` is index ``-1 - k``), e.g. from :func:`head_offset_profiles`.
        offset: the distance ``k`` (one int, or one per model), ``0 <= k <= n - 1``.

    Returns:
        long ``[M, 2]``: the ``(layer, head)`` of each model's copying head (0-based). Ties go to the
        first head in (layer, head) order; a NaN weight never wins.
    """
    if not isinstance(weight, Tensor) or weight.dim() != 4:
        raise ValueError(f"weight must be a tensor [M, n_layers, n_heads, n]; got {getattr(weight, 'shape', weight)!r}")
    m, _, n_heads, n = weight.shape
    ks = per_model_ints("offset", offset, m, minimum=0, maximum=n - 1)
    at_k = torch.stack([weight[i, :, :, -1 - k] for i, k in enumerate(ks)])  # [M, n_layers, n_heads]
    best = torch.nan_to_num(at_k.flatten(1), nan=-1.0).argmax(1)  # over (layer, head), layer-major
    return torch.stack((best // n_heads, best % n_heads), dim=1)


def head_carriers(model, task, train_len: int, n_samples: int = 32, seed: int = 999,
                  rcond: float = 1e-3) -> tuple[CarrierFit, Tensor, Tensor]:
    """Fit the carrier form to every head's content-averaged attention logit over the training window.

    Each head's mean logit at relative position ``D`` (:func:`head_offset_profiles` on sequences of length
    ``2 train_len``, averaged over the last ``train_len`` queries and over content) is fitted with
    ``sum_i r_i cos(theta_i D - phi_i)`` for ``D = -1 .. -(train_len - 1)`` (the query's own
    key, whose token is the query's, is left out), by
    :func:`~lengthgen_utils.analysis.kernel.fit_carrier` with the encoding's frequencies. Under RoPE the mean
    logit of a layer-1 head is exactly of this form (its query and key see independent tokens at
    ``d >= 1``); deeper heads need not be, and the fit's ``r2`` says how close they come.

    Args:
        model: a RoPE :class:`~lengthgen_utils.core.models.Transformer` ensemble (M models).
        task: the task whose sequences are fed.
        train_len: the training length (the window).
        n_samples, seed: probe sequences.
        rcond: passed to :func:`~lengthgen_utils.analysis.kernel.fit_carrier`; combinations of frequency pairs
            that barely turn over the window (singular values below ``rcond`` of the largest) are left out.

    Returns:
        ``(fit, logit, weight)``: the :class:`~lengthgen_utils.analysis.kernel.CarrierFit` of
        ``N = M * n_layers * n_heads`` profiles in the order ``(model, layer, head)`` (its ``window``
        runs outward from the query, ``D = -1, -2, .., -(train_len - 1)``), and the mean logit and weight
        ``[M, n_layers, n_heads, train_len + 1]`` in the row layout over ``D = -train_len .. 0`` (the last
        index is ``D = 0``; the offset ``k`` is index ``-1 - k``).

    Raises:
        ValueError: the model's encoding is not RoPE (its logits are not a function of the offset).

    Source: chapter 7; the carrier form of chapter 4.
    """
    encoding = model.encoding
    if not isinstance(encoding, RoPE):
        raise ValueError(f"head_carriers fits a RoPE transformer's heads; this model's encoding is {encoding!r}")
    train_len = check_int("train_len", train_len, minimum=3)
    logit, weight = head_offset_profiles(model, task, 2 * train_len, n_samples=n_samples, seed=seed,
                                         min_query=train_len)
    d_head = model.config.d_head
    window = -torch.arange(1, train_len)  # D = -1, -2, .., -(train_len - 1): outward from the query
    profiles = logit[..., window - 1].reshape(-1, train_len - 1)  # column w holds D = window[w]
    fit = fit_carrier(profiles, window, encoding.frequencies(d_head, 2 * train_len), rcond=rcond)
    return fit, logit[..., -(train_len + 1):], weight[..., -(train_len + 1):]


# ---------------------------------------------------------------- what was selected (chapter 9)
PLACEMENTS = ("at the offset", "pinned", "elsewhere")


def _place(argmax: Tensor, target: Tensor, visited: int) -> Tensor:
    """0 where ``argmax == target``, else 1 where ``argmax < visited`` (a position training saw), else 2."""
    return torch.where(argmax == target, 0, torch.where(argmax < visited, 1, 2))


@torch.no_grad()
def argmax_placement(model, lengths, offset: int, visited: int) -> Tensor:
    """Where the query's attention argmax lands, at each length: at the offset, pinned, or elsewhere.

    The query sits at position ``L-1``; its target key is ``L-1-k``. An argmax on the target is "at the
    offset" (code 0). An argmax that stays on one absolute position as the length grows (the same position
    at two or more of ``lengths``), a position training visited (``< visited``), is "pinned" (1), as a learned
    APE head pins (chapter 3). The rest is "elsewhere" (2): e.g. a far alias of a RoPE kernel (chapter 4),
    or a wrong offset that moves with the query.

    Args:
        model: a ``RetrievalHead`` ensemble (M models).
        lengths: evaluation lengths, each ``>= offset + 2``.
        offset: the task's offset k >= 1.
        visited: positions ``0 .. visited-1`` were seen in training, >= 1.

    Returns:
        LongTensor ``[M, len(lengths)]`` of codes (see :data:`PLACEMENTS`), on CPU.

    Raises:
        ValueError / TypeError: a length too short for the offset, or bad sizes.
    """
    offset = check_int("offset", offset, minimum=1)
    visited = check_int("visited", visited, minimum=1)
    lengths = check_int_sequence("lengths", lengths, minimum=offset + 2)
    argmax = attention_argmax(model, lengths)  # [M, n]
    target = torch.tensor([L - 1 - offset for L in lengths])
    repeated = (argmax[:, :, None] == argmax[:, None, :]).sum(-1) >= 2  # the same position at another length
    codes = _place(argmax, target, visited)
    return torch.where((codes == 1) & ~repeated, 2, codes)


@torch.no_grad()
def copy_head_placement(model, task, seq_len: int, train_len: int, visited: int, n_samples: int = 8,
                        seed: int = 999, min_query: int | None = None) -> tuple[Tensor, Tensor]:
    """Where a transformer's copying head attends beyond the training length: at the offset, pinned, or elsewhere.

    For each model the copying head is the (layer, head) whose attention argmax lands on ``t - k`` most often
    at query positions ``k <= t < train_len`` (inside the training length) of length-``seq_len`` probe
    sequences. At every query ``t >= min_query`` (default ``train_len``) its argmax key is then classified:
    on ``t - k`` (0), on another position training visited, ``< visited`` (1, "pinned": a query beyond the
    training range reading a position inside it, as an APE model does), or elsewhere (2).

    Args:
        model: a ``Transformer`` ensemble (M models).
        task: a task with one fixed lag ``offset`` (e.g. ``DelayedCopy``); its sequences are the probe.
        seq_len: probe length, > ``train_len``.
        train_len: the training length.
        visited: positions ``0 .. visited-1`` were seen in training (``train_len`` unless training drew others).
        n_samples, seed: probe sequences.
        min_query: the first query position classified, in ``[train_len, seq_len)``.

    Returns:
        ``fractions`` float64 ``[M, 3]`` (share of queries beyond the training length per code) and
        ``heads`` LongTensor ``[M, 3]``: each model's copying head (layer, head) and how many of the
        inside queries it got right, all on CPU.

    Raises:
        ValueError / TypeError: ``seq_len <= train_len``, a task without a single ``offset``, bad sizes.
    """
    offset = check_int("task.offset", getattr(task, "offset", None), minimum=1)
    train_len = check_int("train_len", train_len, minimum=offset + 1)
    seq_len = check_int("seq_len", task.check_seq_len(seq_len), minimum=train_len + 1)
    visited = check_int("visited", visited, minimum=1)
    min_query = train_len if min_query is None else check_int("min_query", min_query, train_len, seq_len - 1)
    tokens, _ = task.sample(check_int("n_samples", n_samples, minimum=1), seq_len,
                            generator(check_int("seed", seed, minimum=0)), device=model.device)
    argmax = torch.stack([s.argmax(-1) for s in model.head_scores(tokens)], 1).cpu()  # [M, layers, B, H, L]
    argmax = argmax.permute(0, 1, 3, 2, 4)  # [M, layers, H, B, L]
    t = torch.arange(seq_len)
    inside = (argmax[..., offset:train_len] == t[offset:train_len] - offset).sum((-1, -2))  # [M, layers, H]
    best = inside.flatten(1).argmax(1)  # [M]
    n_heads = inside.shape[2]
    layer, head = best // n_heads, best % n_heads
    rows = torch.arange(argmax.shape[0])
    chosen = argmax[rows, layer, head][..., min_query:]  # [M, B, L - min_query]
    codes = _place(chosen, t[min_query:] - offset, visited)
    fractions = torch.stack([(codes == c).double().mean((1, 2)) for c in range(len(PLACEMENTS))], -1)
    return fractions, torch.stack([layer, head, inside.flatten(1)[rows, best]], -1)


@torch.no_grad()
def shift_attention_change(model, seq_len: int, shifts, reference: int = 0) -> Tensor:
    """Total-variation distance between the query's attention row at positions ``r .. r+L-1`` (``r`` =
    ``reference``) and at ``s .. s+L-1`` for each shift ``s``.

    ``0.5 * sum_j |a_j(shift) - a_j(0)|``: 0 when a global shift leaves the attention unchanged (as for a
    relative encoding, whatever its logits do), 1 when the two rows share no mass. Softmax ignores a
    constant added to every logit of a row, so this is the part of a shift's effect that the head's output
    can see (:func:`shift_logit_difference` reports the logits themselves).

    Args:
        model: a ``RetrievalHead`` ensemble.
        seq_len: L >= 1.
        shifts: sequence of ints (for an APE table, ``shift + L`` must fit it).
        reference: the shift the others are compared with (default 0: positions ``0 .. L-1``).

    Returns:
        float64 tensor ``[M, len(shifts)]`` in [0, 1], on CPU.
    """
    shifts = check_int_sequence("shifts", shifts)
    base = model.attention_row(seq_len, check_int("reference", reference)).double()
    cols = [0.5 * (model.attention_row(seq_len, s).double() - base).abs().sum(-1) for s in shifts]
    return torch.stack(cols, -1).cpu()


@torch.no_grad()
def copying_head_reads(model, task, pairs, seq_len: int, train_len: int, alias, n_samples: int = 4,
                       seed: int = 999) -> Tensor:
    """How often a transformer's copying head puts its argmax on the target ``t - k``, before and after its alias.

    For each model ``m`` the head ``pairs[m] = (layer, head)`` is read at every query ``t >= train_len`` of
    ``n_samples`` probe sequences of length ``seq_len``. A query is *before the alias* when the key at the
    alias distance ``d* = alias[m]`` does not exist yet (``t < d*``, or no alias), else *after* it.

    Args:
        model: a ``Transformer`` ensemble (M models).
        task: a task with one fixed lag ``offset`` (e.g. ``DelayedCopy``); its sequences are the probe.
        pairs: M ``(layer, head)`` pairs, 0-based (chapter 7's copying-head rule).
        seq_len: probe length, > ``train_len``.
        train_len: the training length (the first query read).
        alias: M alias distances (ints) or None (no alias within the probe).
        n_samples, seed: probe sequences.

    Returns:
        LongTensor ``[M, 4]`` on CPU: hits before the alias, queries before it, hits after, queries after.

    Raises:
        ValueError / TypeError: ``pairs`` or ``alias`` not of length M, a pair outside the model, bad sizes.
    """
    offset = check_int("task.offset", getattr(task, "offset", None), minimum=1)
    train_len = check_int("train_len", train_len, minimum=offset + 1)
    seq_len = check_int("seq_len", task.check_seq_len(seq_len), minimum=train_len + 1)
    m = model.n_models
    if len(pairs) != m or len(alias) != m:
        raise ValueError(f"pairs and alias must have one entry per model ({m}); got {len(pairs)} and {len(alias)}")
    tokens, _ = task.sample(check_int("n_samples", n_samples, minimum=1), seq_len,
                            generator(check_int("seed", seed, minimum=0)), device=model.device)
    scores = model.head_scores(tokens)  # per layer [M, B, H, L, L]
    n_layers, n_heads = len(scores), scores[0].shape[2]
    for layer, head in pairs:
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ValueError(f"pairs: ({layer}, {head}) is outside {n_layers} layers x {n_heads} heads")
    t = torch.arange(train_len, seq_len)  # the queries read
    out = []
    for i, ((layer, head), d) in enumerate(zip(pairs, alias)):
        hit = (scores[layer][i, :, head, train_len:].argmax(-1).cpu() == t - offset)  # [B, L - train_len]
        before = t < (seq_len if d is None else check_int("alias", d, minimum=1))  # [L - train_len]
        out.append([int(hit[:, before].sum()), int(before.sum()) * hit.shape[0],
                    int(hit[:, ~before].sum()), int((~before).sum()) * hit.shape[0]])
    return torch.tensor(out)


def outranked_beyond_window(model, offsets, train_len: int) -> Tensor:
    """Per content-aware head: the share of sequences of twice the training length in which a key beyond
    the training window outranks the target in the query's logits.

    A :class:`~lengthgen_utils.core.models.ContentRetrievalHead` has one kernel per (query token, key token)
    pair (:meth:`~lengthgen_utils.core.models.ContentRetrievalHead.logit_table`); the task's query is the
    marker token ``V``. At length ``L = 2 * train_len`` the keys at distance ``d >= train_len`` from the query
    are ones no training sequence had. For a target token ``y`` and such a key ``j``, the share of key tokens
    ``v`` with ``s(j, v) > s(target, y)`` is the chance that key outranks the target; with independent,
    uniform tokens the share of sequences in which none does is their product over ``j``::

        outranked = 1 - mean_y prod_j (1 - #{v : s(j, v) > s(L-1-k, y)} / V)

    Args:
        model: a ``ContentRetrievalHead`` ensemble (M heads) whose task's tokens are ``0 .. V-1`` and
            whose query is the marker ``V`` (:class:`~lengthgen_utils.core.tasks.FixedOffsetRetrieval`).
        offsets: the task offset ``k`` of every head (one int, or M ints), ``1 <= k < train_len``.
        train_len: the longest training length (tokens, >= 2).

    Returns:
        float64 ``[M]`` on CPU, in ``[0, 1]``.

    Raises:
        TypeError: ``model`` has no ``logit_table`` (a position-only head: use chapter 4's alias instead).
        ValueError / TypeError: bad ``offsets`` or ``train_len``; ``2 * train_len`` beyond APE's table.

    Source: chapter 5b, "Why the ordinary head fails at 2x" (our construction).
    """
    if not hasattr(model, "logit_table"):
        raise TypeError(f"outranked_beyond_window needs a ContentRetrievalHead; got {type(model).__name__}")
    train_len = check_int("train_len", train_len, minimum=2)
    ks = per_model_ints("offsets", offsets, model.n_models, minimum=1, maximum=train_len - 1)
    seq_len, vocab = 2 * train_len, model.config.vocab_size
    with torch.no_grad():
        table = model.logit_table(seq_len)[:, vocab, :, :vocab].double().cpu()  # [M, L, V]: query = marker
    out = []
    for m, k in enumerate(ks):
        target = table[m, seq_len - 1 - k]  # [V]: the target's logit per target token y
        beyond = table[m, : seq_len - train_len]  # [L - train_len, V]: keys at distance >= train_len
        beats = (beyond[None, :, :] > target[:, None, None]).double().mean(-1)  # [y, j]: chance key j outranks
        out.append(1.0 - (1.0 - beats).prod(-1).mean())
    return torch.stack(out)
