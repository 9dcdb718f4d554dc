"""The robustness run: every chapter's checks under conditions that change nothing a claim depends on.

``python -m lengthgen_utils robustness --profile quick`` executes every notebook of ``_toc.yml`` (in
the order the book build runs them) once per condition, each condition in fresh kernels with its
own results cache and its own claims records, and prints

1. a chapter x condition table: ``pass``, ``FAIL n`` (n checks failed) or ``error`` (the notebook
   stopped before its checks cell finished);
2. for every asserted quantity: its threshold, its range over the conditions and its smallest
   margin (how far from failing; :mod:`~lengthgen_utils.book.checks`), and in how many conditions it failed;
3. each chapter's smallest margin over its evidence checks, relative to the threshold (code checks, exact
   by construction, and all-or-none checks that sit on their bound in every condition are left out).

The conditions (``--conditions`` picks some by name):

* ``machine``: this machine as it is (its CPU kernels, the package's thread counts, seed base 0);
* ``kernels=DEFAULT`` and ``kernels=AVX2`` (each capability below this machine's):
  ``ATEN_CPU_CAPABILITY`` makes torch use other SIMD kernels, whose float rounding another CPU has;
* ``threads=1`` and ``threads=2``: ``LENGTHGEN_THREADS`` for every path (reductions split differently);
* ``seed=1``, ``seed=2``, ``seed=3``: ``LENGTHGEN_SEED``, another seed set for every model, training
  stream, null and evaluation sample;
* ``seed=4+kernels=DEFAULT``: both at once, the perturbation CI runs after the tests (``.ci/run``);
* ``seed=N+kernels=DEFAULT+threads=2``: the last of ``--seed-bases`` with torch's scalar kernels and two
  threads, every perturbation at once.

None of them changes what a claim depends on; a check that fails under one is fragile, and a claim
that is really a rate must be stated as one. A condition's results cache is kept in
``.cache/robustness/<profile>/<condition>`` (so a rerun after editing a checks cell recomputes only what
changed); ``--fresh`` empties it first. The condition's records (every chapter's claim and checks, as the
run wrote them) are kept beside it in ``records/``, to compare two versions of the code.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple
from unittest.mock import patch

from ..book.scoreboard import CLAIMS_ENV, RUN_ENV
from ..run.cache import CACHE_ENV, REPO_ROOT
from ..run.profiles import PROFILE_ENV, PROFILES, get_profile
from ..core.seeding import SEED_ENV
from ..run.training import THREADS_ENV
from .buildtime import execute, toc_notebooks

CAPABILITY_ENV = "ATEN_CPU_CAPABILITY"
CAPABILITIES = ("DEFAULT", "AVX2", "AVX512")  # x86 capabilities torch dispatches to, lowest first
CI_SEED = 4  # the seed base of CI's perturbed chapter run (.ci/run), with torch's scalar kernels


class Condition(NamedTuple):
    """One perturbation: a name and the environment variables the kernels get."""

    name: str
    env: dict = {}


def conditions(seed_bases=(1, 2, 3)) -> list[Condition]:
    """The conditions of the run on this machine (see the module docstring).

    Args:
        seed_bases: the seed bases besides 0 (the ``machine`` condition's).
    """
    import torch

    native = torch.backends.cpu.get_cpu_capability().upper()
    out = [Condition("machine")]
    if native in CAPABILITIES:
        out += [Condition(f"kernels={cap}", {CAPABILITY_ENV: cap.lower()})
                for cap in CAPABILITIES[:CAPABILITIES.index(native)]]
    else:  # another architecture: its scalar kernels only
        out.append(Condition("kernels=DEFAULT", {CAPABILITY_ENV: "default"}))
    out += [Condition(f"threads={n}", {THREADS_ENV: str(n)}) for n in (1, 2)]
    out += [Condition(f"seed={s}", {SEED_ENV: str(s)}) for s in seed_bases]
    out.append(Condition(f"seed={CI_SEED}+kernels=DEFAULT", {SEED_ENV: str(CI_SEED), CAPABILITY_ENV: "default"}))
    out += [Condition(f"seed={s}+kernels=DEFAULT+threads=2",  # all three at once, on the last seed base
                      {SEED_ENV: str(s), CAPABILITY_ENV: "default", THREADS_ENV: "2"}) for s in seed_bases[-1:]]
    return out


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def run_condition(condition: Condition, notebooks, profile: str, cache_root: Path, timeout: int,
                  log=print) -> dict:
    """Execute ``notebooks`` in order under ``condition``; returns ``{notebook stem: outcome}``.

    An outcome is a dict: ``seconds``, ``error`` (None or the failure's last line), ``checks`` (the
    chapter's check records, or None where its checks cell never finished).
    """
    work = Path(tempfile.mkdtemp(prefix="lengthgen-robustness-"))
    run = f"robustness-{_safe(condition.name)}"
    python_path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": python_path, PROFILE_ENV: profile, CACHE_ENV: str(cache_root / _safe(condition.name)),
           CLAIMS_ENV: str(work / "claims"), RUN_ENV: run, "OMP_WAIT_POLICY": "PASSIVE",
           CAPABILITY_ENV: None, THREADS_ENV: None, SEED_ENV: None, **condition.env}
    outcomes = {}
    try:
        with patch.dict(os.environ):  # every variable as it was, afterwards
            for key, value in env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            for path in notebooks:
                seconds, error, _ = execute(path, timeout)
                stem = path.stem
                record = work / "claims" / run / "checks"
                chapter = path.relative_to(REPO_ROOT).with_suffix("").as_posix()
                found = record / f"{chapter.replace('/', '__')}.json"
                checks = json.loads(found.read_text())["checks"] if found.is_file() else None
                outcomes[stem] = {"seconds": seconds, "error": error, "checks": checks}
                failed = [c["name"] for c in checks or [] if not c["passed"]]
                state = "pass" if not error else (f"FAIL {len(failed)}" if failed else "error")
                log(f"  [{condition.name}] {stem:<36} {seconds:6.1f} s  {state}"
                    + (f": {'; '.join(failed)[:300]}" if failed else (f": {error}" if error else "")), flush=True)
    finally:
        kept = cache_root / _safe(condition.name) / "records"  # this condition's claims and checks, for a diff later
        shutil.rmtree(kept, ignore_errors=True)
        if (work / "claims" / run).is_dir():
            shutil.copytree(work / "claims" / run, kept)
        shutil.rmtree(work, ignore_errors=True)
    return outcomes


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "nan"
    if x == 0 or 1e-3 <= abs(x) < 1e4:
        return f"{x:.4g}"
    return f"{x:.2g}"


def relative_margin(check: dict) -> float | None:
    """A check's margin as a share of its threshold (of its value when the threshold is 0); None for yes/no checks."""
    if check["margin"] is None:
        return None
    scale = abs(check["threshold"]) if check["threshold"] else abs(check["value"] or 0.0)
    return check["margin"] / scale if scale else check["margin"]


def report(results: dict, names: list[str]) -> str:
    """The three tables of the module docstring, as Markdown. ``results`` is ``{condition: {stem: outcome}}``."""
    stems = list(dict.fromkeys(s for outcome in results.values() for s in outcome))
    lines = ["| chapter | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for stem in stems:
        cells = []
        for name in names:
            o = results[name].get(stem)
            if o is None:
                cells.append("–")
            elif not o["error"]:
                cells.append("pass")
            else:
                failed = sum(not c["passed"] for c in o["checks"] or [])
                cells.append(f"**FAIL {failed}**" if failed else "**error**")
        lines.append(f"| {stem} | " + " | ".join(cells) + " |")
    seeded = [n for n in names if n.startswith("seed=")]  # the seed bases' conditions: a rate's sample
    lines += ["", "| chapter | check | kind | threshold | range over conditions | smallest margin | "
              "seed bases passing | failed in |", "|---|---|---|---|---|---|---|---|"]
    smallest = {}
    for stem in stems:
        by_name = {}
        for name in names:
            for c in (results[name].get(stem) or {}).get("checks") or []:
                by_name.setdefault(c["name"], []).append((name, c))
        for check_name, seen in by_name.items():
            first = seen[0][1]
            failed = [n for n, c in seen if not c["passed"]]
            if first["op"] == "holds":
                threshold, span, margin = "holds", f"{len(seen) - len(failed)}/{len(seen)} hold", "–"
            else:
                values = [c["value"] for _, c in seen if c["value"] is not None]
                margins = [c["margin"] for _, c in seen if c["margin"] is not None]
                threshold = f"{first['op']} {_fmt(first['threshold'])}"
                span = f"{_fmt(min(values))} .. {_fmt(max(values))}" if values else "nan"
                margin = _fmt(min(margins)) if margins else "nan"
                rel = [relative_margin(c) for _, c in seen]
                rel = [r for r in rel if r is not None]
                # a code check (two computations of one quantity, exact by construction) is no margin of a claim,
                # nor is an all-or-none statement that sits on its bound in every condition ("every seed", a count
                # of seeds): it held everywhere, and the pass/fail table says so
                if (rel and first["kind"] == "evidence" and any(r != 0 for r in rel)
                        and (stem not in smallest or min(rel) < smallest[stem][0])):
                    smallest[stem] = (min(rel), check_name)
            on_seeds = [n for n, _ in seen if n in seeded]
            passing = (f"{sum(n not in failed for n in on_seeds)}/{len(on_seeds)}" if on_seeds else "–")
            lines.append(f"| {stem} | {check_name} | {first['kind']} | {threshold} | {span} | {margin} | "
                         f"{passing} | {', '.join(failed) if failed else '–'} |")
    lines += ["", "| chapter | smallest relative margin | check |", "|---|---|---|"]
    for stem in stems:
        if stem in smallest:
            rel, name = smallest[stem]
            lines.append(f"| {stem} | {rel:+.0%} | {name} |")
    return "\n".join(lines)


PROG = "python -m lengthgen_utils robustness"
RUNNING = REPO_ROOT / "running.md"
START, END = "<!-- robustness:start -->", "<!-- robustness:end -->"


def running_section(text: str, command: str, seconds: float, machine: str) -> str:
    """The robustness section of ``running.md``, from a run's report: what ran, where, how long, and the tables.

    Args:
        text: :func:`report`'s Markdown.
        command: the command line that produced it.
        seconds: the run's wall time.
        machine: one line on the machine (cores, torch's native CPU kernels).
    """
    return (f"{START}\n## Robustness: the checks under other seeds, CPU kernels and thread counts\n\n"
            f"Written by the robustness run itself (`{command}`), on {machine}, in {seconds:.0f} s, "
            f"{time.strftime('%Y-%m-%d', time.gmtime())}. The first table says whether each notebook passed "
            "under each condition; the second gives every asserted quantity's range over the conditions, its "
            "smallest margin and in how many of the seed-base conditions it passed; the third, each chapter's "
            "closest check.\n\n:::{dropdown} The tables\n" + text + f"\n:::\n{END}")


def update_running(section: str, path: Path = RUNNING) -> None:
    """Replace the text between the robustness markers of ``path`` (markers included) by ``section``.

    Raises:
        ValueError: ``path`` does not hold each marker exactly once, in order.
    """
    page = path.read_text()
    if page.count(START) != 1 or page.count(END) != 1 or page.index(START) > page.index(END):
        raise ValueError(f"{path} must hold {START!r} and then {END!r}, once each")
    head, rest = page.split(START)
    path.write_text(head + section + rest.split(END, 1)[1])


def _settings(args):
    """Every option and environment variable checked before any work: ``(profile, conditions, notebooks, output)``.

    Raises:
        ValueError / TypeError: the message names the option or variable, its value and what is allowed.
    """
    from ..core.seeding import MAX_SEED_BASE
    from .._validate import check_int, check_output_file

    from ..run.training import malloc_choice

    profile = get_profile(args.profile).name  # a bad $LENGTHGEN_PROFILE or $LENGTHGEN_SEED is refused here
    malloc_choice()  # and a bad $LENGTHGEN_MALLOC, which every condition's kernels would meet
    check_int("--timeout", args.timeout, minimum=1)
    for base in args.seed_bases:
        check_int("--seed-bases", base, minimum=1, maximum=MAX_SEED_BASE)  # 0 is the machine condition
    repeated = sorted({b for b in args.seed_bases if args.seed_bases.count(b) > 1})
    if repeated:
        raise ValueError(f"--seed-bases {' '.join(map(str, args.seed_bases))}: {repeated} given more than once "
                         "(each would run the same condition twice)")
    every = conditions(tuple(args.seed_bases))
    if args.conditions:
        unknown = sorted(set(args.conditions) - {c.name for c in every})
        if unknown:
            raise ValueError(f"unknown condition(s) {unknown}; this machine has {[c.name for c in every]}")
        every = [c for c in every if c.name in args.conditions]
    notebooks = toc_notebooks()
    if args.chapters:
        notebooks = [p for p in notebooks if any(c in p.stem for c in args.chapters)]
        if not notebooks:
            raise ValueError(f"--chapters {args.chapters} matches no notebook of _toc.yml")
    output = None if args.output is None else check_output_file("--output", args.output)
    return profile, every, notebooks, output


def main(argv=None) -> int:
    """The command (see the module docstring). Bad options or environment variables: one line on stderr and
    exit status 2, before any notebook runs. Ctrl-C: the running notebook's kernel is shut down, nothing
    further runs, exit status 130."""
    from .._validate import error_line, interrupted

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--profile", choices=tuple(PROFILES), default=None,
                        help="quick | default | full (default: $LENGTHGEN_PROFILE, else default)")
    parser.add_argument("--conditions", nargs="+", default=None,
                        help="condition names to run (default: all; see the module docstring)")
    parser.add_argument("--chapters", nargs="+", default=None,
                        help="notebooks to run (name fragments, e.g. 07); default: every one in _toc.yml "
                             "(the scoreboard and chapter 10 need every claim, so they fail when chapters are left out)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell before it fails (>= 1)")
    parser.add_argument("--seed-bases", nargs="+", type=int, default=[1, 2, 3],
                        help="the seed bases of the seed=N conditions, besides 0, each once (default: 1 2 3)")
    parser.add_argument("--fresh", action="store_true", help="empty each condition's results cache first")
    parser.add_argument("--update-running", action="store_true",
                        help="also replace running.md's robustness section by this run's report")
    parser.add_argument("--output", default=None,
                        help="also write the Markdown report to this file (not a folder; checked before the run)")
    args = parser.parse_args(argv)
    try:
        profile, every, notebooks, output = _settings(args)
    except (ValueError, TypeError) as err:
        return error_line(PROG, str(err))
    cache_root = REPO_ROOT / ".cache" / "robustness" / profile
    print(f"robustness run, profile {profile!r}: {len(notebooks)} notebooks x {len(every)} conditions "
          f"({', '.join(c.name for c in every)}); {os.cpu_count()} CPU cores; caches under {cache_root}", flush=True)
    results, start = {}, time.perf_counter()
    for condition in every:
        if args.fresh:
            shutil.rmtree(cache_root / _safe(condition.name), ignore_errors=True)
        try:
            results[condition.name] = run_condition(condition, notebooks, profile, cache_root, args.timeout)
        except KeyboardInterrupt:
            return interrupted(PROG, f"stopped in condition {condition.name!r}; no further notebook ran")
    text = report(results, [c.name for c in every])
    print("\n" + text)
    print(f"\n{len(every)} conditions in {time.perf_counter() - start:.0f} s")
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n")
    if args.update_running:
        import torch

        command = " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])
        machine = (f"{os.cpu_count()} CPU cores, torch's "
                   f"{torch.backends.cpu.get_cpu_capability()} kernels natively")
        update_running(running_section(text, command, time.perf_counter() - start, machine))
    ok = all(not o["error"] for outcome in results.values() for o in outcome.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
