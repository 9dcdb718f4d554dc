"""The transformer the book trains: :class:`FastTransformer`, the readable model computed in a batched layout.

:class:`~lengthgen_utils.core.models.Transformer` is the model to read: nanoGPT's shape, one block at a time,
the same RoPE (the encoding's ``rotate``), score bias and causal softmax a chapter shows.
:class:`FastTransformer` *is* that model (a subclass: the same parameters, the same initialisation, the same
state dict, so weights move between the two with ``load_state_dict``) with a forward pass written for
speed on a small CPU:

* LayerNorm's scale and shift folded into the next matmul (:func:`_norm_linear`);
* every projection one ``baddbmm`` over the models, its rows split evenly over the threads (:func:`_baddbmm`);
* the first block's projections of the V token rows computed once and looked up, when the encoding adds
  nothing to the residual stream;
* queries and keys rotated in the encoding's cheapest equivalent form
  (:meth:`~lengthgen_utils.core.encodings.Encoding.dot_product_form`: RoPE's half-split pairing as the
  interleaved one, a single complex multiply, on reordered projection rows);
* attention by :func:`~lengthgen_utils.core.attention.causal_attention`'s fast path: batched matmuls up to
  :data:`~lengthgen_utils.core.attention.SHORT_SEQUENCE` keys, torch's fused kernel beyond, the explicit
  softmax when weights are asked for.

``tests/test_fast_transformer.py`` holds the two equal (logits, loss and the gradient of every parameter) on
every registered encoding, at lengths on both sides of the attention switch and for several ensemble sizes;
``python -m lengthgen_utils.tools.bench`` measures what the layout buys.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import attention_scores, causal_attention, causal_mask, check_attention_fits
from .models import Transformer, _check_tokens, _model_positions


def _norm_linear(x: Tensor, ln_weight: Tensor, ln_bias: Tensor, weight: Tensor,
                 bias: Tensor | None = None) -> Tensor:
    """``LayerNorm(x) W^T + b`` per model, with the norm's scale and shift folded into the matmul.

    With ``n`` the normalised ``x`` (zero mean, unit variance over the last dim, eps 1e-5),
    ``(n * g + s) W^T + b = n (W diag g)^T + (W s + b)``: the scale multiplies the small weight
    ``[M, out, in]`` instead of the activations, and the shift joins the bias of one ``baddbmm``.

    Args:
        x: ``[M, N, in]``; ln_weight, ln_bias: ``[M, in]``; weight: ``[M, out, in]``; bias: ``[M, out]`` or None.

    Returns:
        ``[M, N, out]``.
    """
    shift = torch.bmm(ln_bias[:, None, :], weight.transpose(1, 2))  # W s: [M, 1, out]
    if bias is not None:
        shift = shift + bias[:, None, :]
    return _baddbmm(shift, F.layer_norm(x, x.shape[-1:]), (weight * ln_weight[:, None, :]).transpose(1, 2))


def _baddbmm(start: Tensor, x: Tensor, weight_t: Tensor) -> Tensor:
    """``start + x @ weight_t`` per model: ``start [M, N or 1, out]``, ``x [M, N, in]``, ``weight_t [M, in, out]``.

    A batched matmul gives each thread whole matmuls, so 3 models on 2 threads leave one thread idle a
    third of the time. With ``T = torch.get_num_threads() > 1`` threads (and ``N`` divisible by ``T``),
    each model's ``N`` rows are cut into ``T`` blocks and the ``M * T`` block products run as one
    batched matmul: equal work per thread for any ``M``. The blocks depend on ``T`` only, never on
    ``M``, so a model computes the same numbers in any ensemble.
    """
    m, n, _ = x.shape
    blocks = torch.get_num_threads()
    if blocks == 1 or n % blocks:
        return torch.baddbmm(start, x, weight_t)

    def row_blocks(t):  # [M, N, k] -> [M * T, N / T, k]
        return t.reshape(m * blocks, n // blocks, t.shape[-1])

    def repeated(t):  # [M, a, b] -> [M * T, a, b], each model's copy once per block
        return t.unsqueeze(1).expand(m, blocks, *t.shape[1:]).reshape(m * blocks, *t.shape[1:])

    start = row_blocks(start) if start.shape[1] == n else repeated(start)
    return torch.baddbmm(start, row_blocks(x), repeated(weight_t)).view(m, n, -1)


class FastTransformer(Transformer):
    """:class:`~lengthgen_utils.core.models.Transformer` in a batched layout: what the book trains.

    The same model, the same arguments, parameters, initialisation and state dict as the readable
    ``Transformer`` (see there); only the forward pass differs, and only in float rounding (tested:
    ``tests/test_fast_transformer.py``). See the module docstring for what the layout does.

    Shapes:
        ``forward(tokens [B, L])`` -> logits ``[M, B, L, V]``; with ``return_attention=True``
        also a list (one per layer) of attention weights ``[M, B, n_heads, L, L]``.

    Raises:
        TypeError / ValueError: as :class:`~lengthgen_utils.core.models.Transformer`.
    """

    def __init__(self, vocab_size: int = 16, n_layers: int = 2, n_heads: int = 4, d_model: int = 128,
                 pe="rope", max_len: int = 256, n_models: int = 1, seeds=None, mlp_ratio: int = 4):
        super().__init__(vocab_size, n_layers, n_heads, d_model, pe, max_len, n_models, seeds, mlp_ratio)
        cfg = self.config
        # the rotation actually applied to queries and keys (see _attention_inputs)
        order, self._qk_encoding = cfg.pe.dot_product_form(cfg.d_head)
        rows = None
        if order is not None:
            heads = torch.arange(2 * n_heads)[:, None] * cfg.d_head  # the query heads, then the key heads
            rows = torch.cat([(heads + order).flatten(), torch.arange(2 * d_model, 3 * d_model)])
        self.register_buffer("_qk_rows", rows, persistent=False)

    def _attention_inputs(self, block, x: Tensor, positions: Tensor, batch: int,
                          token_rows: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values ``[M*B, H, L, d_head]`` of one block, the encoding's rotation applied.

        ``x`` is the residual stream ``[M, B*L, d_model]``. One batched matmul gives every model's
        q, k and v; queries and keys are rotated together. ``token_rows`` (``[M, B*L]``, rows of the
        stacked embedding tables) says that ``x`` is nothing but token embeddings (the first block of
        a model whose encoding adds nothing to the residual stream): then the V rows of each table are
        projected once and looked up, instead of projecting B*L copies of them.

        For an encoding whose rotation has a cheaper form on reordered channels
        (:meth:`~lengthgen_utils.core.encodings.Encoding.dot_product_form`, e.g. RoPE's half-split
        pairing), the query and key rows of ``W_QKV`` are reordered and that form is used: the
        logits ``q . k`` are the same, the channels of the returned ``q`` and ``k`` are in that order.
        """
        m, n_heads, d_head = self.n_models, self.n_heads, self.config.d_head
        seq_len = x.shape[1] // batch
        w_qkv = block.w_qkv if self._qk_rows is None else block.w_qkv[:, self._qk_rows]
        if token_rows is None:
            qkv = _norm_linear(x, block.ln1_w, block.ln1_b, w_qkv)
        else:
            table = _norm_linear(self.embed, block.ln1_w, block.ln1_b, w_qkv)  # [M, V, 3d]
            qkv = F.embedding(token_rows, table.reshape(-1, table.shape[-1]))
        qkv = qkv.view(m * batch, seq_len, 3 * n_heads, d_head)
        qk, v = qkv.split([2 * n_heads, n_heads], dim=2)
        qk = self._qk_encoding.rotate(qk.transpose(1, 2), positions)  # [M*B, 2H, L, d_head]
        q, k = qk.split(n_heads, dim=1)
        return q, k, v.transpose(1, 2)

    def _run(self, tokens: Tensor, position_shift: int, collect: str | None, positions: Tensor | None = None):
        """Run every block; ``collect`` in {None, "weights", "scores"} picks what to return per layer.

        ``positions [L]`` replaces ``shift .. shift + L - 1`` (e.g. the randomised positions of training).

        Layout: the residual stream is ``[M, B*L, d_model]`` and every weight ``[M, out, in]``, so each
        projection is one ``baddbmm`` over the models (biases and residual adds fused into it, rows
        split evenly over the threads: :func:`_baddbmm`); attention sees ``[M*B, H, L, d_head]``
        (:func:`~lengthgen_utils.core.attention.causal_attention`: batched matmuls for short sequences,
        torch's fused kernel, which takes this 4-D layout, beyond).
        """
        _check_tokens(tokens, self.config.vocab_size, self.n_models, batched_models=False)
        b, seq_len = tokens.shape
        m, d_model, n_heads = self.n_models, self.config.d_model, self.n_heads
        positions = _model_positions(self, seq_len, position_shift, positions)  # [L] on the CPU
        if collect is not None:  # weights or scores [M, B, H, L, L] per layer (else SDPA needs no [L, L] map)
            check_attention_fits(seq_len, m * b * n_heads, self.embed.dtype, self.device,
                                 copies=self.config.n_layers + 2)
        # every model's embedding table stacked into one: model i's token t is row i * V + t
        offsets = torch.arange(m, device=tokens.device)[:, None] * self.config.vocab_size
        rows = tokens.reshape(1, b * seq_len) + offsets
        x = F.embedding(rows, self.embed.reshape(-1, d_model))  # [M, B*L, d]
        added = self.encoding.embed(self.pe_params, positions)
        if added is not None:
            x = (x.view(m, b, seq_len, d_model) + added[:, None]).view(m, b * seq_len, d_model)
        bias = self._score_bias(positions)  # [M or 1, H, L, L] or None
        if bias is not None and bias.shape[0] > 1:  # [M, H, L, L] -> [M*B, H, L, L]
            bias = bias[:, None].expand(m, b, *bias.shape[1:]).reshape(m * b, *bias.shape[1:])
        collected = []
        token_rows = rows if added is None else None
        for block in self.blocks:
            q, k, v = self._attention_inputs(block, x, positions, b, token_rows)
            token_rows = None
            if collect is None:
                out = causal_attention(q, k, v, bias=bias)
            else:
                out, weights = causal_attention(q, k, v, return_weights=True, bias=bias)
                if collect == "scores":
                    scores = attention_scores(q, k) + (bias if bias is not None else 0)
                    weights = scores.masked_fill(~causal_mask(seq_len, self.device), float("-inf"))
                collected.append(weights.view(m, b, n_heads, seq_len, seq_len))
            out = out.transpose(1, 2).reshape(m, b * seq_len, d_model)  # heads side by side
            x = _baddbmm(x, out, block.w_out.transpose(1, 2))  # x + W_O o
            hidden = F.gelu(_norm_linear(x, block.ln2_w, block.ln2_b, block.w_in, block.b_in))
            x = _baddbmm(x, hidden, block.w_mlp_out.transpose(1, 2)).add_(block.b_mlp_out[:, None])
        logits = _norm_linear(x, self.ln_f_w, self.ln_f_b, self.unembed)
        return logits.view(m, b, seq_len, -1), collected

    def forward(self, tokens: Tensor, position_shift: int = 0, return_attention: bool = False,
                positions: Tensor | None = None):
        """Logits ``[M, B, L, V]`` (and per-layer attention weights with ``return_attention``).

        ``positions [L]`` (integers) replaces the positions ``shift .. shift + L - 1``, as in
        :meth:`~lengthgen_utils.core.models.Transformer.forward`; the training loop passes the encoding's
        ``train_positions``.

        Raises:
            TypeError / ValueError: as :meth:`~lengthgen_utils.core.models.Transformer.forward`.
        """
        logits, weights = self._run(tokens, position_shift, "weights" if return_attention else None, positions)
        return (logits, weights) if return_attention else logits

    @torch.no_grad()
    def head_scores(self, tokens: Tensor, position_shift: int = 0) -> list[Tensor]:
        """Pre-softmax attention logits of every head, per layer: list of ``[M, B, H, L, L]``.

        Entries above the causal diagonal are ``-inf`` (never attended).

        Raises:
            TypeError / ValueError: as :meth:`~lengthgen_utils.core.models.Transformer.forward`.
        """
        return self._run(tokens, position_shift, "scores")[1]


__all__ = ["FastTransformer"]
