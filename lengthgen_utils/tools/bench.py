"""Benchmark: ``python -m lengthgen_utils.tools.bench``.

Prints, from one run on one machine:

1. training throughput (model-steps per second) of the batched ensemble
   against a plain sequential loop over the same models, at 1, 8, 32 and 128
   models. The two are timed in alternation (``--reps`` rounds, median), so
   that other load on the machine hits both alike; the sequential rate does
   not depend on how many models there are, so it is timed on at most
   ``--seq-models`` of them;
1b. the single head at the ensemble sizes the book trains at (``--head-sizes``: 20 heads, today's
   chapter ensembles; 120 and 480, several cells trained as one) against one head at a time (the
   package's ``train`` on ``n_models=1``) and against a plain PyTorch loop (one ``nn.Module`` head,
   per-sequence attention, ``torch.optim.AdamW``, as a tutorial writes it), side by side in alternating
   rounds; and 120 heads whose weight decay differs by model (six values, the regime map's cells, through
   :class:`~lengthgen_utils.run.optim.PerModelOptimizer`);
1c. 120 heads (or the largest of ``--head-sizes``) with glibc's malloc as the system sets it and as the package sets it
   (:func:`~lengthgen_utils.run.training.keep_freed_memory`), each timing in a fresh process
   (``$LENGTHGEN_MALLOC=system`` or ``keep``: the setting is the whole process's), in alternating rounds,
   with the page faults of the timed steps;
2. the same at 32 models with two intra-op threads instead of one, to show
   what thread synchronisation costs on a small, shared CPU;
3. wall time and peak memory (peak resident set of a fresh process; on CUDA,
   peak allocated device memory) of a full single-head sweep of a profile,
   trained without the results cache;
4. matmul FLOPs per model-step (``torch.utils.flop_counter``; elementwise work,
   softmax and the scatter of attention weights are not counted), the
   achieved FLOP/s, and the share of the machine's nominal peak;
5. the multi-layer transformer (chapter 7's model: 2 layers, 4 heads, d_model 64,
   batch 32, length 32, RoPE, AdamW) trained by the package's ensemble, the
   ``FastTransformer`` the book trains (``train_sequence``), side by side with
   what a user would write instead, as a tutorial writes it: a plain loop over
   one ``nn.Module`` per model (``scaled_dot_product_attention(is_causal=True)``,
   RoPE by ``rotate_half``), the PyTorch model-ensembling recipe
   (``torch.func.stack_module_state`` + ``vmap``) and the plain loop under
   ``torch.compile``; and with the package's readable ``Transformer`` trained
   one model per loop iteration (``train_sequence`` at ``n_models=1``). Every
   variant starts from the same weights and sees the same batches, at 1 and 2
   intra-op threads and 1, 3, 9, 27 models, timed in alternation (median of
   ``--tf-reps`` rounds). The losses of the variants after the timed steps are
   compared, so all of them train the same models. The ratios are taken against
   the best of the plain loop, the readable loop and the vmap recipe.

Nothing here is asserted: speed depends on the machine and its load. The
load average is printed before and after.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from unittest.mock import patch

import torch
import torch.nn.functional as F
from torch import nn

from .._validate import check_device, check_int
from ..core.fast import FastTransformer
from ..core.models import RetrievalHead, Transformer
from ..core.rope import rope_inverse_frequencies
from ..core.tasks import IGNORE_INDEX, DelayedCopy, FixedOffsetRetrieval
from ..run.configs import RetrievalExperiment, RetrievalSweep
from ..run.optim import OptimizerSettings, build_optimizer, decays
from ..run.profiles import get_profile
from ..run.runners import run_sweep
from ..run.training import THREADS_ENV, cpu_threads, train, train_sequence

TASK = FixedOffsetRetrieval(16, 3)


def threads_for_every_path(threads: int | None):
    """A block with ``$LENGTHGEN_THREADS`` set to ``threads`` (``None``: as it is), the count every trainer
    then runs at: the thread policy is the runners', not an argument of ``train``."""
    return patch.dict(os.environ, {} if threads is None else {THREADS_ENV: str(threads)})


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batched_rate(n_models: int, steps: int, device: torch.device, threads: int | None) -> float:
    """Model-steps per second of one ensemble of ``n_models`` trained for ``steps``."""
    model = RetrievalHead(n_models=n_models, seeds=range(n_models))
    _sync(device)
    start = time.perf_counter()
    with threads_for_every_path(threads):
        train(model, TASK, steps=steps, device=device, progress=False)
    _sync(device)
    return n_models * steps / (time.perf_counter() - start)


def sequential_rate(n_models: int, steps: int, device: torch.device, threads: int | None) -> float:
    """Model-steps per second of a Python loop training ``n_models`` single models one after another."""
    models = [RetrievalHead(n_models=1, seeds=[seed]) for seed in range(n_models)]  # built outside the timing
    _sync(device)
    start = time.perf_counter()
    with threads_for_every_path(threads):
        for model in models:
            train(model, TASK, steps=steps, device=device, progress=False)
    _sync(device)
    return n_models * steps / (time.perf_counter() - start)


def throughput(sizes, steps: int, reps: int, seq_models: int, device, threads) -> list[dict]:
    """Batched vs sequential model-steps/s at each ensemble size (medians of alternating rounds)."""
    batched_rate(8, 5, device, threads)  # warm-up: allocator, thread pool, RoPE tables
    sequential_rate(1, 5, device, threads)
    rows = []
    for m in sizes:
        b, s = [], []
        for _ in range(reps):
            b.append(batched_rate(m, steps, device, threads))
            s.append(sequential_rate(min(m, seq_models), steps, device, threads))
        rows.append({"models": m, "batched": statistics.median(b), "sequential": statistics.median(s),
                     "batched_all": b, "sequential_all": s})
    return rows


class PlainHead(nn.Module):
    """One position-only retrieval head as a tutorial writes it (the plain PyTorch peer of section 1b).

    Queries and keys see the learned vector ``u`` only, RoPE by ``rotate_half`` (half-split, as the
    package), the query at the last position attends over every key, values ``W_V e(x_j)`` per token:
    ``logits = W_O sum_j a_j W_V e(x_j)``, computed per sequence as an ``nn.Module`` does. Built from row
    ``index`` of a package :class:`~lengthgen_utils.core.models.RetrievalHead` (RoPE, softmax): the same
    weights, the same function (``tests/test_performance.py``)."""

    def __init__(self, model: RetrievalHead, index: int):
        super().__init__()
        self.embed, self.u, self.w_q, self.w_k, self.w_v, self.w_o = (
            nn.Parameter(getattr(model, name)[index].detach().clone())
            for name in ("embed", "u", "w_q", "w_k", "w_v", "w_o"))
        self.register_buffer("inv_freq", rope_inverse_frequencies(model.config.d_head).float(), persistent=False)

    def forward(self, tokens):  # [B, L] -> logits [B, V]
        seq_len = tokens.shape[1]
        angles = torch.arange(seq_len, dtype=torch.float32)[:, None] * self.inv_freq  # [L, d_head / 2]
        angles = torch.cat((angles, angles), -1)
        cos, sin = angles.cos(), angles.sin()
        x = self.u.expand(*tokens.shape, -1)  # [B, L, d_model]: no token content
        q = x[:, -1:] @ self.w_q.T
        q = q * cos[-1:] + rotate_half(q) * sin[-1:]  # [B, 1, d_head]
        k = x @ self.w_k.T
        k = k * cos + rotate_half(k) * sin  # [B, L, d_head]
        a = (q @ k.transpose(1, 2) / k.shape[-1] ** 0.5).softmax(-1)  # [B, 1, L]
        v = self.embed[tokens] @ self.w_v.T  # [B, L, d_head]
        return (a @ v)[:, 0] @ self.w_o.T


def plain_head_rate(n_models: int, steps: int, device: torch.device) -> float:
    """Model-steps/s of :class:`PlainHead` trained one model at a time with ``torch.optim.AdamW`` (lr 1e-2), on
    the single head's recipe (batch 256, lengths ``U{5..16}``), from the package's initial weights."""
    template = RetrievalHead(n_models=n_models, seeds=range(n_models))
    models = [PlainHead(template, i).to(device) for i in range(n_models)]  # built outside the timing
    _sync(device)
    start = time.perf_counter()
    for model in models:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
        gen = torch.Generator().manual_seed(0)
        for _ in range(steps):
            seq_len = int(torch.randint(TASK.min_seq_len, 17, (1,), generator=gen))
            tokens, targets = TASK.sample(256, seq_len, gen)
            loss = F.cross_entropy(model(tokens.to(device)), targets[:, -1].to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
    _sync(device)
    return n_models * steps / (time.perf_counter() - start)


MIXED_DECAYS = (0.0, 0.1, 0.3, 1.0, 3.0, 10.0)
"""The weight decays of the regime map's position-only cells: section 1b's mixed-setting ensemble."""


def mixed_rate(n_models: int, steps: int, device: torch.device, threads: int | None) -> float:
    """Model-steps/s of one ensemble whose weight decay differs by model (:data:`MIXED_DECAYS` in turn)."""
    model = RetrievalHead(n_models=n_models, seeds=range(n_models))
    settings = [OptimizerSettings(weight_decay=MIXED_DECAYS[i * len(MIXED_DECAYS) // n_models])
                for i in range(n_models)]
    _sync(device)
    start = time.perf_counter()
    with threads_for_every_path(threads):
        train(model, TASK, settings, steps=steps, device=device, progress=False)
    _sync(device)
    return n_models * steps / (time.perf_counter() - start)


def ensemble_sizes(sizes, steps: int, reps: int, seq_models: int, device, threads) -> dict:
    """Section 1b: ``{"batched": {size: rate}, "mixed": {size: rate}, "one at a time": rate, "plain loop": rate}``
    (model-steps/s, medians of ``reps`` alternating rounds; the two loops on ``seq_models`` heads each, their
    rate does not depend on how many there are). ``"mixed"`` is timed at 120 heads when 120 is in ``sizes``,
    else at the largest size."""
    mixed_at = 120 if 120 in sizes else max(sizes)
    plain_head_rate(1, 3, device)  # warm-up
    rounds: dict = {}
    for _ in range(reps):
        for m in sizes:
            rounds.setdefault(("batched", m), []).append(batched_rate(m, steps, device, threads))
            if m == mixed_at:
                rounds.setdefault(("mixed", m), []).append(mixed_rate(m, steps, device, threads))
        rounds.setdefault(("one at a time", 0), []).append(sequential_rate(seq_models, steps, device, threads))
        with cpu_threads(threads):
            rounds.setdefault(("plain loop", 0), []).append(plain_head_rate(seq_models, steps, device))
    out: dict = {"batched": {}, "mixed": {}}
    for (kind, m), values in rounds.items():
        if m:
            out[kind][m] = statistics.median(values)
        else:
            out[kind] = statistics.median(values)
    return out


def print_ensemble_sizes(result: dict, steps: int, reps: int, seq_models: int) -> None:
    """Print section 1b (see :func:`ensemble_sizes`) with the aims: >= 3x at 120 heads over 20-head
    ensembles, >= 30x over one head at a time."""
    one, plain = result["one at a time"], result["plain loop"]
    print(f"\n1b. the single head by heads per ensemble ({steps} steps per timing, median of {reps} alternating "
          f"rounds; the loops on {seq_models} heads): model-steps/s")
    print(f"   one head at a time (train, n_models=1): {one:.0f}; plain PyTorch loop (nn.Module, AdamW): {plain:.0f}")
    print(f"{'heads':>7} {'batched':>10} {'vs 20':>7} {'vs one':>8} {'vs plain':>9}")
    for m, rate in result["batched"].items():
        vs20 = rate / result["batched"][20] if 20 in result["batched"] else float("nan")
        print(f"{m:>7} {rate:>10.0f} {vs20:>6.1f}x {rate / one:>7.1f}x {rate / plain:>8.1f}x")
    for m, rate in result["mixed"].items():
        print(f"{str(m) + ' *':>7} {rate:>10.0f}   (* weight decay per model, {len(MIXED_DECAYS)} values: "
              f"{rate / result['batched'][m]:.2f}x the shared-setting ensemble)")
    if 20 in result["batched"] and 120 in result["batched"]:
        r20, r1 = result["batched"][120] / result["batched"][20], result["batched"][120] / one
        print(f"   aims at 120 heads: >= 3x the 20-head ensembles: {'met' if r20 >= 3 else 'NOT met'} ({r20:.1f}x); "
              f">= 30x one head at a time: {'met' if r1 >= 30 else 'NOT met'} ({r1:.1f}x)")


def _allocator_child(n_models: int, steps: int) -> None:
    """Time ``n_models`` heads for ``steps`` steps in this (fresh) process and print the rate and the page faults
    of the timed steps as JSON (the parent sets ``$LENGTHGEN_MALLOC``)."""
    import resource

    batched_rate(n_models, 5, torch.device("cpu"), 1)  # warm-up: imports, first allocations, the malloc setting
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    rate = batched_rate(n_models, steps, torch.device("cpu"), 1)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    print("ALLOC-JSON " + json.dumps({"rate": rate, "faults_per_step": faults / steps}))


def allocator_comparison(n_models: int, steps: int, reps: int) -> dict:
    """Section 1c: ``{"system": (rate, faults per step), "keep": (...)}``, medians of ``reps`` alternating rounds,
    each timing a fresh process with ``$LENGTHGEN_MALLOC`` set (:func:`_allocator_child`)."""
    rounds: dict = {"system": [], "keep": []}
    for _ in range(reps):
        for choice, values in rounds.items():
            env = {**os.environ, "LENGTHGEN_MALLOC": choice}
            cmd = [sys.executable, "-m", "lengthgen_utils.tools.bench", "--allocator-child", str(n_models),
                   "--steps", str(steps)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
            line = next(l for l in done.stdout.splitlines() if l.startswith("ALLOC-JSON "))
            values.append(json.loads(line[len("ALLOC-JSON "):]))
    return {choice: (statistics.median(v["rate"] for v in values),
                     statistics.median(v["faults_per_step"] for v in values)) for choice, values in rounds.items()}


def flops_per_model_step(train_len: int = 16, n_models: int = 32) -> float:
    """Matmul FLOPs of one training step (forward + backward) per model, averaged over the training lengths."""
    from torch.utils.flop_counter import FlopCounterMode

    model = RetrievalHead(n_models=n_models, seeds=range(n_models))
    lengths = range(TASK.min_seq_len, train_len + 1)
    total = 0
    for seq_len in lengths:
        tokens, targets = TASK.sample(256, seq_len, torch.Generator().manual_seed(0))
        counter = FlopCounterMode(display=False)
        with counter:
            logits, _ = model(tokens)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     targets[:, -1].repeat(n_models))
            loss.backward()
        total += counter.get_total_flops()
    return total / len(lengths) / n_models


def nominal_peak_flops(threads: int) -> tuple[float | None, str]:
    """Nominal fp32 peak of ``threads`` CPU cores from /proc/cpuinfo (clock x FMA width), or ``None``."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return None, "no /proc/cpuinfo"
    mhz = [float(line.split(":")[1]) for line in info.splitlines() if line.startswith("cpu MHz")]
    flags = next((line.split(":")[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    if not mhz:
        return None, "clock unknown"
    per_cycle = 64 if "avx512f" in flags else 32 if ("avx2" in flags and "fma" in flags) else 8
    ghz = max(mhz) / 1000
    return threads * ghz * 1e9 * per_cycle, f"{threads} core(s) x {ghz:.2f} GHz x {per_cycle} fp32 FLOP/cycle"


# ---------------------------------------------------------------- 5. the transformer against what a user would write
# Chapter 7's transformer at the default profile's size. The peers below are written as a tutorial
# writes them (nanoGPT's block on nn.Linear and nn.LayerNorm, torch's fused attention, RoPE by
# rotate_half as in Llama/GPT-NeoX, PyTorch's model-ensembling recipe); they live here, not in the
# package. They are not the package's readable Transformer, which carries the ensemble dimension, the
# encoding interface and its argument checks: it is timed beside them, one model per loop iteration,
# and a plain nn.Module is also what vmap and torch.compile take. Each starts from the package model's
# weights.
TF = dict(vocab_size=16, n_layers=2, n_heads=4, d_model=64, batch_size=32, seq_len=32, lr=2e-3, weight_decay=0.05)
TF_OPT = OptimizerSettings("adamw", lr=TF["lr"], weight_decay=TF["weight_decay"])
TF_TASK = DelayedCopy(16, 5)
READABLE = "readable Transformer, one per loop"  # the package's readable model, trained one model at a time


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class PlainBlock(nn.Module):
    """A pre-LN GPT block: causal self-attention (SDPA) with RoPE, then a GELU MLP."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.fc, self.out = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class PlainGPT(nn.Module):
    """One model: token embedding, blocks, final LayerNorm, unembedding; RoPE tables as buffers."""

    def __init__(self, vocab_size, n_layers, n_heads, d_model, seq_len):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList([PlainBlock(d_model, n_heads) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.unembed = nn.Linear(d_model, vocab_size, bias=False)
        angles = torch.arange(seq_len, dtype=torch.float64)[:, None] * rope_inverse_frequencies(d_model // n_heads)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return self.unembed(self.ln_f(x))


def plain_copy(model: Transformer, index: int) -> PlainGPT:
    """Model ``index`` of a package ensemble as a :class:`PlainGPT` (the same weights; RoPE half-split)."""
    cfg = model.config
    plain = PlainGPT(cfg.vocab_size, cfg.n_layers, cfg.n_heads, cfg.d_model, TF["seq_len"])
    with torch.no_grad():
        plain.embed.weight.copy_(model.embed[index])
        for blk, ours in zip(plain.blocks, model.blocks):
            pairs = [(blk.ln1.weight, ours.ln1_w), (blk.ln1.bias, ours.ln1_b), (blk.qkv.weight, ours.w_qkv),
                     (blk.proj.weight, ours.w_out), (blk.ln2.weight, ours.ln2_w), (blk.ln2.bias, ours.ln2_b),
                     (blk.fc.weight, ours.w_in), (blk.fc.bias, ours.b_in), (blk.out.weight, ours.w_mlp_out),
                     (blk.out.bias, ours.b_mlp_out)]
            for mine, theirs in pairs:
                mine.copy_(theirs[index])
        plain.ln_f.weight.copy_(model.ln_f_w[index])
        plain.ln_f.bias.copy_(model.ln_f_b[index])
        plain.unembed.weight.copy_(model.unembed[index])
    return plain


def readable_copy(model: Transformer, index: int) -> Transformer:
    """Model ``index`` of a package ensemble (readable or fast: one state dict) as a readable ``Transformer``
    of one model."""
    cfg = model.config
    alone = Transformer(cfg.vocab_size, cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.pe, max_len=cfg.max_len,
                        n_models=1, mlp_ratio=cfg.mlp_ratio)
    alone.load_state_dict({name: t[index:index + 1] for name, t in model.state_dict().items()})
    return alone


def readable_loop(models, steps: int, threads: int) -> torch.Tensor:
    """Train each readable one-model ``Transformer`` alone with the package's ``train_sequence`` (the batches of
    :func:`tf_batches`); returns each one's last loss."""
    with threads_for_every_path(threads):
        return torch.stack([train_sequence(model, TF_TASK, TF_OPT, steps=steps, batch_size=TF["batch_size"],
                                           train_len=TF["seq_len"], seed=0, device="cpu", progress=False)[-1, 0]
                            for model in models])


def tf_batches(steps: int, seed: int = 0) -> list:
    """The batches ``train_sequence(seed=seed)`` draws, in order."""
    gen = torch.Generator().manual_seed(seed)
    return [TF_TASK.sample(TF["batch_size"], TF["seq_len"], gen) for _ in range(steps)]


def plain_loop(models, batches, compiled: bool = False) -> torch.Tensor:
    """Train each model alone with its own AdamW (``torch.compile``'d if asked); returns each one's last loss."""
    last = []
    for model in models:
        run = torch.compile(model) if compiled else model
        opt = build_optimizer(model, TF_OPT)  # the package's rule: no decay on LayerNorm and biases
        for tokens, targets in batches:
            loss = F.cross_entropy(run(tokens).view(-1, TF["vocab_size"]), targets.view(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        last.append(loss.detach())
    return torch.stack(last)


def vmap_recipe(models, batches) -> torch.Tensor:
    """PyTorch's model-ensembling recipe, trained: stacked parameters, one vmapped functional call."""
    from torch.func import functional_call, stack_module_state

    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")

    def fmodel(p, b, x):
        return functional_call(base, (p, b), (x,))

    opt = torch.optim.AdamW([{"params": [p for n, p in params.items() if decays(n)]},
                             {"params": [p for n, p in params.items() if not decays(n)], "weight_decay": 0.0}],
                            lr=TF["lr"], weight_decay=TF["weight_decay"])
    n = len(models)
    for tokens, targets in batches:
        logits = torch.vmap(fmodel, in_dims=(0, 0, None))(params, buffers, tokens)
        per_token = F.cross_entropy(logits.reshape(-1, TF["vocab_size"]), targets.repeat(n, 1).view(-1),
                                    reduction="none").view(n, -1)
        loss = per_token.sum(1) / (targets != IGNORE_INDEX).sum()
        opt.zero_grad()
        loss.sum().backward()
        opt.step()
    return loss.detach()


def package_ensemble(n_models: int, steps: int, threads: int) -> tuple[float, torch.Tensor]:
    """Seconds and last losses of the package's ``train_sequence`` on a fresh ``FastTransformer`` of ``n_models``."""
    model = FastTransformer(TF["vocab_size"], TF["n_layers"], TF["n_heads"], TF["d_model"], "rope",
                            max_len=TF["seq_len"], n_models=n_models)
    start = time.perf_counter()
    with threads_for_every_path(threads):
        history = train_sequence(model, TF_TASK, TF_OPT, steps=steps, batch_size=TF["batch_size"],
                                 train_len=TF["seq_len"], seed=0, device="cpu", progress=False)
    return time.perf_counter() - start, history[-1]


def _compile_plain_loop(batches, threads: int) -> str:
    """Compile the plain model's forward and backward at ``threads`` (generated kernels fix their thread
    count when built, so each count gets its own build); returns what happened, in words.

    The build goes to a fresh kernel cache (``TORCHINDUCTOR_CACHE_DIR``, set by :func:`transformer_comparison`),
    so its time is what a first run pays."""
    try:
        torch._dynamo.reset()
        start = time.perf_counter()
        plain_loop([plain_copy(FastTransformer(16, 2, 4, 64, "rope", max_len=32), 0)], batches[:2], compiled=True)
        return f"built in {time.perf_counter() - start:.0f} s at {threads} thread(s), from an empty kernel cache"
    except Exception as err:  # no C++ compiler, an unsupported platform: say so and go on without it
        return f"unavailable ({type(err).__name__}: {str(err).splitlines()[0][:100]})"


def transformer_comparison(sizes, thread_counts, steps: int, reps: int, compile_: bool) -> dict:
    """Model-steps/s of the package ensemble and its peers, timed in alternation; see the module docstring.

    Returns ``{"rates": {(variant, threads, models): median}, "all": {...: [per round]},
    "agreement": {(threads, models): max |last loss of a peer - the package's|}, "compile": {threads: note}}``.
    """
    batches = tf_batches(steps)
    rates, agreement, compile_notes = {}, {}, {}
    kernel_cache = tempfile.mkdtemp(prefix="lengthgen-bench-inductor-") if compile_ else None
    try:  # compiled kernels go to a folder of their own, removed afterwards with the variable
        with patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": kernel_cache} if kernel_cache else {}):
            _compare(sizes, thread_counts, steps, reps, compile_, batches, rates, agreement, compile_notes)
    finally:
        if kernel_cache:
            shutil.rmtree(kernel_cache, ignore_errors=True)
    return {"rates": {k: statistics.median(v) for k, v in rates.items()}, "all": rates,
            "agreement": agreement, "compile": compile_notes}


def _compare(sizes, thread_counts, steps, reps, compile_, batches, rates, agreement, compile_notes) -> None:
    """The timing loop of :func:`transformer_comparison` (fills ``rates``, ``agreement``, ``compile_notes``)."""
    for threads in thread_counts:
        with cpu_threads(threads):
            peers = {"plain loop": (plain_copy, lambda ms: plain_loop(ms, batches)),  # name: (copy a model, train)
                     READABLE: (readable_copy, lambda ms: readable_loop(ms, steps, threads)),
                     "vmap recipe": (plain_copy, lambda ms: vmap_recipe(ms, batches))}
            if compile_:
                compile_notes[threads] = _compile_plain_loop(batches, threads)
                if compile_notes[threads].startswith("built"):
                    peers["plain loop, torch.compile"] = (plain_copy,
                                                          lambda ms: plain_loop(ms, batches, compiled=True))
            package_ensemble(2, 2, threads)  # warm-up: allocator, thread pool, tables
            readable_loop([readable_copy(FastTransformer(16, 2, 4, 64, "rope", max_len=32), 0)], 2, threads)
            for m in sizes:
                template = FastTransformer(16, 2, 4, 64, "rope", max_len=32, n_models=m)  # the package's weights
                worst = 0.0
                for _ in range(reps):  # one round = every variant once, in turn
                    seconds, ours = package_ensemble(m, steps, threads)
                    rates.setdefault(("package", threads, m), []).append(m * steps / seconds)
                    for name, (copy_model, run) in peers.items():
                        models = [copy_model(template, i) for i in range(m)]
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")  # vmap: "no batching rule" for the SDPA kernel
                            start = time.perf_counter()
                            last = run(models)
                            seconds = time.perf_counter() - start
                        rates.setdefault((name, threads, m), []).append(m * steps / seconds)
                        worst = max(worst, float((last - ours).abs().max()))
                agreement[(threads, m)] = worst


def tf_flops_per_model_step() -> tuple[int, float, float]:
    """Parameters per model, and matmul FLOPs of one training step (forward + backward) of the plain model
    (the textbook amount of work) and of the package's ``FastTransformer`` (which projects the first block's V
    token rows once)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = FastTransformer(16, 2, 4, 64, "rope", max_len=32)
    tokens, targets = tf_batches(1)[0]
    flops = []
    for run in (plain_copy(model, 0), lambda t: model(t)[0]):
        counter = FlopCounterMode(display=False)
        with counter:
            F.cross_entropy(run(tokens).reshape(-1, 16), targets.reshape(-1)).backward()
        flops.append(counter.get_total_flops())
    return sum(p.numel() for p in model.parameters()), flops[0], flops[1]


def print_transformer_comparison(args) -> None:
    """Section 5: the table of model-steps/s, the loss agreement and the ratios the project asks for."""
    sizes, counts = args.tf_sizes, args.tf_threads
    n_params, flops, ours = tf_flops_per_model_step()
    print(f"\n5. transformer training (2 layers, 4 heads, d_model 64, batch 32, length 32, RoPE, AdamW; "
          f"{n_params / 1e3:.1f}k parameters and {flops / 1e6:.0f} MFLOP of matmuls per model-step, "
          f"{ours / 1e6:.0f} in the package's layout), model-steps/s, median of {args.tf_reps} alternating "
          f"rounds of {args.tf_steps} steps", flush=True)
    result = transformer_comparison(sizes, counts, args.tf_steps, args.tf_reps, not args.no_compile)
    rates = result["rates"]
    variants = list(dict.fromkeys(name for name, _, _ in rates))
    head = f"   {'variant':<34}{'threads':>8}" + "".join(f"{'M=' + str(m):>9}" for m in sizes)
    print(head)
    for name in variants:
        for t in counts:
            if (name, t, sizes[0]) in rates:
                label = "package FastTransformer ensemble" if name == "package" else name
                print(f"   {label:<34}{t:>8}" + "".join(f"{rates[(name, t, m)]:>9.0f}" for m in sizes))
    worst = max(result["agreement"].values())
    print(f"   every variant trains the same models: largest |last loss - the package's| after {args.tf_steps} "
          f"steps = {worst:.1e}")
    if args.no_compile:
        print("   torch.compile: skipped (--no-compile)")
    else:
        for t, note in result["compile"].items():
            print(f"   torch.compile of the plain model: {note} (not in the timings)")
    for m in sizes:
        ours = max(rates[("package", t, m)] for t in counts)
        peers = {(name, t): rates[(name, t, m)] for name in ("plain loop", READABLE, "vmap recipe") for t in counts}
        (best_name, best_t), best = max(peers.items(), key=lambda kv: kv[1])
        line = (f"   M={m}: package (best thread count) {ours:.0f} = {ours / best:.2f}x the best of the plain loop, "
                f"the readable loop and the vmap recipe ({best_name}, {best_t} thread(s): {best:.0f})")
        compiled = [rates[(name, t, m)] for (name, t, mm) in rates if name.endswith("torch.compile") and mm == m]
        if compiled:
            line += f"; {ours / max(compiled):.2f}x the compiled plain loop ({max(compiled):.0f})"
        if m == 9:
            met = ours >= 1.3 * best and (not compiled or ours >= max(compiled))
            line += f"  [target >= 1.3x and >= compiled: {'met' if met else 'NOT met'}]"
        print(line)


def _sweep_child(profile_name: str, device: str) -> None:
    """Run one profile's single-head sweep in this (fresh) process and print its measurements as JSON."""
    import resource

    device = check_device(device)
    sweep = RetrievalSweep.from_profile(get_profile(profile_name))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    run_sweep(sweep, device=device, cache=False)
    _sync(device)
    wall = time.perf_counter() - start
    out = {"wall_s": wall, "rss_before_kib": rss_before,
           "rss_peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
           "ensembles": len(sweep.pes) * len(sweep.attentions), "models_per_ensemble": sweep.n_models,
           "steps": sweep.steps, "offsets": list(sweep.offsets), "n_seeds": sweep.n_seeds,
           "lengths": sweep.eval_lengths, "eval_samples": sweep.eval_samples}
    if device.type == "cuda":
        out["cuda_peak_bytes"] = torch.cuda.max_memory_allocated(device)
    print("SWEEP-JSON " + json.dumps(out))


def sweep_measurement(profile_name: str, device: torch.device) -> dict:
    """Wall time and peak memory of a fresh process running one profile's sweep (no cache)."""
    cmd = [sys.executable, "-m", "lengthgen_utils.tools.bench", "--sweep-child", profile_name, "--device", str(device)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    line = next(l for l in done.stdout.splitlines() if l.startswith("SWEEP-JSON "))
    return json.loads(line[len("SWEEP-JSON "):])


def parallel_comparison(steps: int) -> tuple[float, float]:
    """Seconds to train two 8-head RoPE ensembles (chapter 1's recipe, ``steps`` steps each) one after the
    other, and side by side with :func:`~lengthgen_utils.run.parallel.parallel_map` (two workers), in one run.

    Returns:
        ``(one after the other, side by side)`` in seconds; the second pass's models equal the first's bit for bit
        (``AssertionError`` otherwise).
    """
    from ..run.parallel import parallel_map
    from ..run.runners import build_model

    steps = check_int("steps", steps, minimum=1)
    exps = [RetrievalExperiment(pe="rope", offset=k, n_seeds=8, steps=steps) for k in (1, 3)]

    def one(exp):
        model = build_model(exp)
        train(model, exp.task, exp.optimizer_settings, steps=exp.steps, batch_size=exp.batch_size, train_len=exp.train_len,
              seed=exp.data_seed, device="cpu")
        return model

    start = time.perf_counter()
    serial = [one(exp) for exp in exps]
    middle = time.perf_counter()
    side = parallel_map(one, exps, workers=2)
    end = time.perf_counter()
    for a, b in zip(serial, side):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    return middle - start, end - middle


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lengthgen_utils.tools.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32, 128], help="ensemble sizes")
    parser.add_argument("--steps", type=int, default=40, help="training steps per timing")
    parser.add_argument("--reps", type=int, default=3, help="alternating rounds per size (median)")
    parser.add_argument("--seq-models", type=int, default=8, help="models timed in the sequential loop")
    parser.add_argument("--head-sizes", type=int, nargs="*", default=[20, 120, 480],
                        help="heads per ensemble of section 1b (the flag alone, with no sizes, skips it)")
    parser.add_argument("--head-reps", type=int, default=3, help="alternating rounds of section 1b (median)")
    parser.add_argument("--sweep", default="default", help="profile of the timed sweep (quick|default|full|none)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: CUDA when available)")
    parser.add_argument("--no-thread-comparison", action="store_true", help="skip the two-thread measurement")
    parser.add_argument("--no-parallel", action="store_true", help="skip the side-by-side ensembles (2b)")
    parser.add_argument("--parallel-steps", type=int, default=500, help="training steps of each ensemble in 2b")
    parser.add_argument("--tf-sizes", type=int, nargs="*", default=[1, 3, 9, 27],
                        help="transformer ensemble sizes (section 5); the flag alone, with no sizes, skips it")
    parser.add_argument("--tf-threads", type=int, nargs="+", default=[1, 2], help="thread counts of section 5")
    parser.add_argument("--tf-steps", type=int, default=8, help="training steps per transformer timing")
    parser.add_argument("--tf-reps", type=int, default=3, help="alternating rounds per transformer size (median)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile'd plain loop")
    parser.add_argument("--no-allocator", action="store_true", help="skip the malloc comparison (1c)")
    parser.add_argument("--sweep-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--allocator-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:  # checked before any work: a bad device is one line, not a traceback
        device = check_device(args.device, "--device")
        for m in args.head_sizes:
            check_int("--head-sizes", m, minimum=1)
        check_int("--head-reps", args.head_reps, minimum=1)
    except (ValueError, TypeError) as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    if args.sweep_child:
        _sweep_child(args.sweep_child, str(device))
        return 0
    if args.allocator_child:
        _allocator_child(args.allocator_child, args.steps)
        return 0
    threads = 1 if device.type == "cpu" else None
    load0 = os.getloadavg() if hasattr(os, "getloadavg") else None
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(l.split(":")[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(f"lengthgen benchmark: torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
          + f", CPU {cpu}, {os.cpu_count()} logical cores; load average {load0}")
    print(f"model: single retrieval head (V=16, d_model 32, d_head 16, RoPE, softmax), batch 256, "
          f"lengths U{{5..16}}, {args.steps} steps per timing, median of {args.reps} alternating rounds\n")

    rows = throughput(args.sizes, args.steps, args.reps, args.seq_models, device, threads)
    print(f"1. training throughput (model-steps/s), {'1 intra-op thread' if threads else device}")
    print(f"{'models':>7} {'batched':>10} {'sequential':>11} {'ratio':>7}")
    for r in rows:
        print(f"{r['models']:>7} {r['batched']:>10.0f} {r['sequential']:>11.0f} {r['batched'] / r['sequential']:>6.1f}x")
    if 32 in args.sizes:
        ratio32 = next(r for r in rows if r["models"] == 32)
        ratio32 = ratio32["batched"] / ratio32["sequential"]
        print(f"   target: batched >= 10x sequential at 32 models: {'met' if ratio32 >= 10 else 'NOT met'} "
              f"({ratio32:.1f}x)")

    if args.head_sizes:
        result = ensemble_sizes(args.head_sizes, args.steps, args.head_reps, args.seq_models, device, threads)
        print_ensemble_sizes(result, args.steps, args.head_reps, args.seq_models)

    if device.type == "cpu" and args.head_sizes and not args.no_allocator:
        at = 120 if 120 in args.head_sizes else max(args.head_sizes)
        alloc = allocator_comparison(at, args.steps, args.head_reps)
        (sys_rate, sys_faults), (keep_rate, keep_faults) = alloc["system"], alloc["keep"]
        print(f"\n1c. {at} heads, malloc as the system sets it and as the package sets it (run.training.keep_freed_memory; "
              f"a fresh process per timing, median of {args.head_reps} alternating rounds): {sys_rate:.0f} and "
              f"{keep_rate:.0f} model-steps/s, {keep_rate / sys_rate:.2f}x; page faults per step {sys_faults:.0f} "
              f"and {keep_faults:.0f}")

    if device.type == "cpu" and (os.cpu_count() or 1) >= 2 and not args.no_thread_comparison:
        steps2 = max(5, args.steps // 4)
        b2 = batched_rate(32, steps2, device, 2)
        s2 = sequential_rate(2, steps2, device, 2)
        r32 = next((r for r in rows if r["models"] == 32), None)
        print(f"\n2. two intra-op threads, 32 models ({steps2} steps): batched {b2:.0f}, sequential {s2:.0f} "
              f"model-steps/s" + (f" (one thread: {r32['batched']:.0f} and {r32['sequential']:.0f})" if r32 else ""))

    if device.type == "cpu" and (os.cpu_count() or 1) >= 2 and not args.no_parallel:
        serial, side_by_side = parallel_comparison(args.parallel_steps)
        print(f"\n2b. two RoPE ensembles of 8 heads ({args.parallel_steps} steps each), one after the other and "
              f"side by side (run.parallel.parallel_map, one thread each): {serial:.2f} s and {side_by_side:.2f} s, "
              f"{serial / side_by_side:.2f}x")

    if args.sweep != "none":
        m = sweep_measurement(args.sweep, device)
        total_model_steps = m["ensembles"] * m["models_per_ensemble"] * m["steps"]
        print(f"\n3. full single-head sweep, profile {args.sweep!r}: {m['ensembles']} ensembles (PE x attention) x "
              f"{m['models_per_ensemble']} models ({len(m['offsets'])} offsets x {m['n_seeds']} seeds) x "
              f"{m['steps']} steps, evaluated at {m['lengths']} ({m['eval_samples']} sequences each)")
        print(f"   wall time {m['wall_s']:.1f} s ({total_model_steps / m['wall_s']:.0f} model-steps/s including "
              f"evaluation); peak RSS {m['rss_peak_kib'] / 1024:.0f} MiB (process after imports: "
              f"{m['rss_before_kib'] / 1024:.0f} MiB)"
              + (f"; peak CUDA memory {m['cuda_peak_bytes'] / 2**20:.0f} MiB" if "cuda_peak_bytes" in m else ""))

    flops = flops_per_model_step()
    print(f"\n4. matmul FLOPs per model-step (forward + backward, mean over lengths 5..16): {flops / 1e6:.2f} MFLOP")
    if device.type == "cpu":
        peak, how = nominal_peak_flops(threads or 1)
    else:
        peak, how = None, "GPU peak not estimated"
    for r in rows:
        achieved = flops * r["batched"]
        share = f", {100 * achieved / peak:.2f}% of nominal peak" if peak else ""
        print(f"   {r['models']:>4} models batched: {achieved / 1e9:.2f} GFLOP/s{share}")
    if peak:
        print(f"   nominal peak {peak / 1e9:.0f} GFLOP/s ({how}): these models are far too small to be "
              f"compute-bound; time goes to per-operation overhead, which batching amortises")
    if device.type == "cpu" and args.tf_sizes:
        print_transformer_comparison(args)
    load1 = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"\nload average at the end: {load1} on {os.cpu_count()} cores"
          + (" (other processes were competing for the CPU: absolute rates are low, ratios were timed side by side)"
             if load1 and os.cpu_count() and max(load0[0], load1[0]) > 0.75 * os.cpu_count() else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
