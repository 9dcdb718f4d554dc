"""Command line: ``python -m lengthgen_utils run --profile full [--seeds N]``, ``... cache``, ``... predict``
and ``... robustness``.

``run`` trains a profile's sweeps (through the results cache), with a
progress bar, and prints a summary table at the end: mean accuracy over
seeds (and the worst seed) at each evaluation length, for every positional
encoding, attention type and offset. ``cache info`` / ``cache clear`` show or
empty the results cache. ``predict [--output FILE]`` writes the aliases predicted before training
(:mod:`~lengthgen_utils.analysis.predictions`) to the committed file. ``robustness`` executes every chapter's checks under other CPU kernels,
thread counts and seed bases (:mod:`~lengthgen_utils.tools.robustness`; ``robustness --help`` for its options).
"""
from __future__ import annotations

import argparse
import sys
import time

from .._validate import check_device, check_output_file, error_line, interrupted
from ..run import cache as _cache
from ..run.profiles import PROFILES, get_profile
from ..run.results import Runs
from ..run.runners import SUITE_ENCODINGS, SUITES
from ..run.training import CPU_THREADS, default_cpu_threads, malloc_choice

PROG = "python -m lengthgen_utils"


def format_sweep_table(result: Runs) -> str:
    """The summary table of a sweep: one line per (PE, attention, offset), ``mean (min)`` accuracy per length."""
    sweep = result.config
    head = f"{'pe':<5} {'attention':<9} {'k':>2} " + " ".join(f"{str(m) + 'x':>12}" for m in sweep.length_multiples)
    lines = [f"accuracy: mean over {sweep.n_seeds} seeds (worst seed); train_len {sweep.train_len}, "
             f"lengths {result.lengths[0]}..{result.lengths[-1]}, chance {1 / sweep.vocab_size:.3f}", head,
             "-" * len(head)]
    for pe_runs in result.by("pe").values():
        for att_runs in pe_runs.by("attention").values():
            for k, heads in att_runs.by("offset").items():
                cells = " ".join(f"{mean:>6.3f} ({low:.2f})"
                                 for mean, low in zip(heads.accuracy.mean(0), heads.accuracy.min(0).values))
                lines.append(f"{heads.pe.name:<5} {heads.value('attention'):<9} {k:>2} {cells}")
    return "\n".join(lines)


def format_transformer_table(results: dict) -> str:
    """Token accuracy of the transformer suite: inside the training length, and beyond it at each length."""
    first = next(iter(results.values())).experiment
    longer = [L for L in first.eval_lengths if L > first.train_len]
    lines = [f"{first.task!r}, {first.n_seeds} seeds: mean token accuracy (min over seeds)",
             f"{'pe':<5} {'t < ' + str(first.train_len):>14} " + " ".join(f"{'t >= ' + str(first.train_len) + ' @' + str(L):>16}" for L in longer)]
    for pe, r in results.items():
        cells = " ".join(f"{float(r.outside[L].mean()):>9.3f} ({float(r.outside[L].min()):.2f})" for L in longer)
        lines.append(f"{pe.name:<5} {float(r.inside.mean()):>7.3f} ({float(r.inside.min()):.2f}) {cells}")
    return "\n".join(lines)


def _settings(args):
    """Every input of ``run`` checked up front (arguments and environment), before any work:
    ``(profile, device, thread note, cache folder)``.

    Raises:
        ValueError / TypeError: a device this machine cannot compute on, an unknown ``$LENGTHGEN_PROFILE``,
            a bad ``$LENGTHGEN_THREADS``, ``$LENGTHGEN_MALLOC`` or ``$LENGTHGEN_CACHE`` (each message names it).
    """
    profile = get_profile(args.profile)
    device = check_device(args.device, "--device")
    threads = ", ".join(f"{path} {default_cpu_threads(path)}" for path in CPU_THREADS) if device.type == "cpu" else None
    malloc_choice()
    folder = None if args.no_cache else _cache.cache_dir()
    return profile, device, threads, folder


def _run(args, settings) -> int:
    profile, device, threads, folder = settings
    names = list(SUITES) if args.suite == "all" else [args.suite]
    cache = False if args.no_cache else True
    print(f"profile {profile.name}: {args.seeds or profile.n_seeds} seeds, {profile.steps} steps, offsets "
          f"{profile.offsets}, attention {profile.attentions}, lengths up to {max(profile.length_multiples)}x; "
          f"device {device}" + (f" (intra-op threads: {threads})" if threads else "")
          + f"; cache {'off' if args.no_cache else folder or 'off ($LENGTHGEN_CACHE)'}", flush=True)
    status = 0
    for name in names:
        suite = SUITES[name]
        print(f"\n[{name}]", flush=True)
        from tqdm.auto import tqdm

        n = len(SUITE_ENCODINGS) * (1 if name == "transformer" else len(profile.attentions))
        bar = tqdm(total=n, desc=f"{name} ensembles", unit="ensemble")
        timings = []

        def report(pe, attention, cache_status, seconds):
            timings.append((pe, attention, cache_status, seconds))
            bar.set_postfix_str(f"{pe.name}/{attention}: {cache_status}, {seconds:.1f} s")
            bar.update(1)

        start = time.perf_counter()
        result = suite(profile, n_seeds=args.seeds, device=device, cache=cache, progress=True, on_ensemble=report)
        bar.close()
        total = time.perf_counter() - start
        if name == "transformer":
            print(format_transformer_table(result))
        else:
            print(format_sweep_table(result))
            print("\nensembles (models each = offsets x seeds = "
                  f"{result.config.n_models}): " + "; ".join(f"{pe.name}/{att} {st} {s:.1f} s" for pe, att, st, s in timings))
        print(f"[{name}] wall time {total:.1f} s", flush=True)
    return status


def _cache_command(args, folder) -> int:
    """``cache info`` / ``cache clear``: counts and removes the cache's own files only (see :func:`cache.clear`)."""
    if folder is None:
        print("the results cache is disabled ($LENGTHGEN_CACHE=off)")
        return 0
    if folder.exists() and not folder.is_dir():
        print(f"{folder} is not a folder: the results cache is not used (runs recompute and warn)")
        return 0
    if args.action == "clear":
        print(f"removed {_cache.clear(folder)} file(s) from {folder} (other files left alone)")
        return 0
    entries, temps = _cache.entries(folder), _cache.temporary_files(folder)
    size = sum(p.stat().st_size for p in entries)
    print(f"{folder}: {len(entries)} entries, {size / 2**20:.1f} MiB; {len(temps)} leftover temporary file(s)")
    return 0


def _error(message: str) -> int:
    return error_line(PROG, message)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train a profile's sweeps and print a summary table")
    run.add_argument("--profile", choices=tuple(PROFILES), default=None,
                     help="quick | default | full (default: $LENGTHGEN_PROFILE, else default)")
    run.add_argument("--seeds", type=int, default=None, help="seeds per setting (default: the profile's)")
    run.add_argument("--suite", choices=("all", *SUITES), default="all", help="which sweeps to run")
    run.add_argument("--device", default=None,
                     help="cpu, cuda or cuda:N (default: CUDA when available); checked before any work")
    run.add_argument("--no-cache", action="store_true", help="train everything, store nothing")
    cache = sub.add_parser("cache", help="show or empty the results cache")
    cache.add_argument("action", choices=("info", "clear"))
    predict = sub.add_parser("predict", help="write the aliases predicted before training (the committed file)")
    predict.add_argument("--output", default=None, help="where to write (default: predictions/alias_predictions.json)")
    sub.add_parser("robustness", add_help=False,
                   help="every chapter's checks under other CPU kernels, thread counts and seed bases")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["robustness"]:
        from .robustness import main as robustness_main

        return robustness_main(argv[1:])
    args = parser.parse_args(argv)
    try:  # every input is checked here, before any work: a bad one is one line, not a traceback
        if args.command == "predict":
            from ..analysis import predictions

            output = check_output_file("--output", args.output or predictions.PREDICTIONS_FILE)
        elif args.command == "run":
            if args.seeds is not None and args.seeds < 1:
                raise ValueError(f"--seeds must be >= 1; got {args.seeds}")
            settings = _settings(args)
        else:
            folder = _cache.cache_dir()
    except (ValueError, TypeError) as err:
        return _error(str(err))
    if args.command == "predict":
        print(f"wrote {predictions.write_predictions(output)}")
        return 0
    if args.command == "run":
        try:
            return _run(args, settings)
        except KeyboardInterrupt:  # the trainers stopped (parallel_map waits for its workers): no traceback
            return interrupted(PROG, "the run stopped; finished ensembles stay in the results cache")
    return _cache_command(args, folder)


if __name__ == "__main__":
    sys.exit(main())
