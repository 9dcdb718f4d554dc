"""Benchmark: ``python -m lengthgen_utils.bench``.

Prints, from one run on one machine:

1. training throughput (model-steps per second) of the batched ensemble
   against a plain sequential loop over the same models, at 1, 8, 32 and 128
   models. The two are timed in alternation (``--reps`` rounds, median), so
   that other load on the machine hits both alike; the sequential rate does
   not depend on how many models there are, so it is timed on at most
   ``--seq-models`` of them;
2. the same at 32 models with two intra-op threads instead of one, to show
   what thread synchronisation costs on a small, shared CPU;
3. wall time and peak memory (peak resident set of a fresh process; on CUDA,
   peak allocated device memory) of a full single-head sweep of a profile,
   trained without the results cache;
4. matmul FLOPs per model-step (``torch.utils.flop_counter``; elementwise work,
   softmax and the scatter of attention weights are not counted), the
   achieved FLOP/s, and the share of the machine's nominal peak.

Nothing here is asserted: speed depends on the machine and its load. The
load average is printed before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

from .configs import RetrievalSweep
from .profiles import get_profile
from .runners import run_sweep
from .models import RetrievalHead
from .tasks import FixedOffsetRetrieval
from .training import default_device, train

TASK = FixedOffsetRetrieval(16, 3)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batched_rate(n_models: int, steps: int, device: torch.device, threads: int | None) -> float:
    """Model-steps per second of one ensemble of ``n_models`` trained for ``steps``."""
    model = RetrievalHead(n_models=n_models, seeds=range(n_models))
    _sync(device)
    start = time.perf_counter()
    train(model, TASK, steps=steps, device=device, num_threads=threads, progress=False)
    _sync(device)
    return n_models * steps / (time.perf_counter() - start)


def sequential_rate(n_models: int, steps: int, device: torch.device, threads: int | None) -> float:
    """Model-steps per second of a Python loop training ``n_models`` single models one after another."""
    models = [RetrievalHead(n_models=1, seeds=[seed]) for seed in range(n_models)]  # built outside the timing
    _sync(device)
    start = time.perf_counter()
    for model in models:
        train(model, TASK, steps=steps, device=device, num_threads=threads, progress=False)
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


def _sweep_child(profile_name: str, device: str) -> None:
    """Run one profile's single-head sweep in this (fresh) process and print its measurements as JSON."""
    import resource

    device = torch.device(device)
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
    cmd = [sys.executable, "-m", "lengthgen_utils.bench", "--sweep-child", profile_name, "--device", str(device)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    line = next(l for l in done.stdout.splitlines() if l.startswith("SWEEP-JSON "))
    return json.loads(line[len("SWEEP-JSON "):])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lengthgen_utils.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32, 128], help="ensemble sizes")
    parser.add_argument("--steps", type=int, default=40, help="training steps per timing")
    parser.add_argument("--reps", type=int, default=3, help="alternating rounds per size (median)")
    parser.add_argument("--seq-models", type=int, default=8, help="models timed in the sequential loop")
    parser.add_argument("--sweep", default="default", help="profile of the timed sweep (quick|default|full|none)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: CUDA when available)")
    parser.add_argument("--no-thread-comparison", action="store_true", help="skip the two-thread measurement")
    parser.add_argument("--sweep-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = torch.device(args.device) if args.device else default_device()
    if args.sweep_child:
        _sweep_child(args.sweep_child, str(device))
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

    if device.type == "cpu" and (os.cpu_count() or 1) >= 2 and not args.no_thread_comparison:
        steps2 = max(5, args.steps // 4)
        b2 = batched_rate(32, steps2, device, 2)
        s2 = sequential_rate(2, steps2, device, 2)
        r32 = next((r for r in rows if r["models"] == 32), None)
        print(f"\n2. two intra-op threads, 32 models ({steps2} steps): batched {b2:.0f}, sequential {s2:.0f} "
              f"model-steps/s" + (f" (one thread: {r32['batched']:.0f} and {r32['sequential']:.0f})" if r32 else ""))

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
    load1 = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"\nload average at the end: {load1} on {os.cpu_count()} cores"
          + (" (other processes were competing for the CPU: absolute rates are low, ratios were timed side by side)"
             if load1 and os.cpu_count() and max(load0[0], load1[0]) > 0.75 * os.cpu_count() else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
