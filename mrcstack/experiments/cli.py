"""``mrcstack experiment list | run NAME... [--quick] [--where sim|testbed|design] [--out DIR]
[--seed N] [--without MECHANISM] [--jobs N] | agree DIR...``."""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, NoReturn

from mrcstack import __version__
from mrcstack.experiments import agreement
from mrcstack.experiments.base import Experiment, Mechanism, RunInfo, write
from mrcstack.experiments.registry import EXPERIMENTS
from mrcstack.experiments.report import index

PROG = "mrcstack experiment"
DEFAULT_OUT = "experiments-out"
WHERE = ("sim", "testbed", "design")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _jobs(text: str) -> int:
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"wants a number of processes >= 1, not {text!r}")
    return jobs


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="the MRC paper's experiments, with plots and claims")
    p.add_argument("--version", action="version", version=f"mrcstack {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    sub.add_parser("list", help="one line per experiment: name, figure, what, where")
    r = sub.add_parser("run", help="run experiments (all when none is named)")
    r.add_argument("names", nargs="*", metavar="NAME")
    r.add_argument("--quick", action="store_true", help="the quick profile (minutes, not tens)")
    r.add_argument("--where", choices=WHERE, help="only those that run there")
    r.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument(
        "--without",
        choices=[m.value for m in Mechanism],
        help="run without this mechanism: the claims crediting it should fail "
        "(only the chosen experiments whose claims credit it run)",
    )
    r.add_argument(
        "--jobs",
        type=_jobs,
        default=1,
        metavar="N",
        help="run up to N simulator and design experiments at once, a process each "
        "(the simulator is deterministic: the same numbers); those that use the testbed "
        "run one at a time afterwards, since they measure this machine",
    )
    a = sub.add_parser(
        "agree", help="whether several reports agree on every claim's pass/fail (a table)"
    )
    a.add_argument("reports", nargs="+", metavar="DIR", help="output folders of `run`")
    return p


def select(
    names: Sequence[str], where: str | None, without: Mechanism | None = None
) -> list[Experiment]:
    known = {e.name: e for e in EXPERIMENTS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown experiment {unknown[0]!r} (`{PROG} list` names them)")
    chosen = [known[n] for n in names] if names else list(EXPERIMENTS)
    if where is not None:
        chosen = [e for e in chosen if where in e.where.split("+")]
        if not chosen:
            raise ValueError(f"no chosen experiment runs on the {where}")
    if without is not None:
        chosen = [e for e in chosen if without in e.mechanisms]
        if not chosen:
            raise ValueError(f"no chosen experiment's claims credit {without}")
    return chosen


def _run_one(e: Experiment, out: Path, info: RunInfo) -> dict[str, Any]:
    """Run ``e`` and write its folder; its result.json."""
    t0 = time.monotonic()
    outcome = e.run(info.profile, info.seed, info.without)
    return write(out, e, outcome, time.monotonic() - t0, info)


#: A worker's experiments and where they write (an experiment's run is often a closure,
#: which does not pickle: a forked worker is handed them as they are).
_WORK: list[tuple[Experiment, Path, RunInfo]] = []


def _take(work: list[tuple[Experiment, Path, RunInfo]]) -> None:
    _WORK[:] = work


def _run_nth(i: int) -> dict[str, Any]:
    return _run_one(*_WORK[i])


def longest_first(chosen: Sequence[Experiment], out: Path, profile: str) -> list[Experiment]:
    """``chosen`` in the order to hand them to the workers: the longest first, as each took
    when it last wrote to ``out`` in ``profile`` (one never run there, or run otherwise,
    first of all), so that no long figure starts last while the other processes idle."""

    def last(e: Experiment) -> float:
        try:
            doc = json.loads((out / e.name / "result.json").read_text())
        except (OSError, ValueError):
            return math.inf
        if not isinstance(doc, dict) or doc.get("profile") != profile:
            return math.inf
        seconds = doc.get("seconds")
        return float(seconds) if isinstance(seconds, int | float) else math.inf

    return sorted(chosen, key=last, reverse=True)  # (stable: ties keep the order asked)


def _ran(doc: dict[str, Any], start: float) -> str:
    ok = sum(1 for c in doc["claims"] if c["pass"])
    return (
        f"{ok}/{len(doc['claims'])} claims pass, {doc['seconds']:.1f} s "
        f"(elapsed {time.monotonic() - start:.0f} s)"
    )


def run(args: argparse.Namespace) -> int:
    without = Mechanism(args.without) if args.without else None
    try:
        chosen = select(args.names, args.where, without)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    profile = "quick" if args.quick else "full"
    out = Path(args.out)
    done: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    info = RunInfo.here(profile, args.seed, without)
    start = time.monotonic()
    # The simulator's and the arithmetic's figures may share the machine; a testbed's
    # measures it (CPU-bound daemons, timed failovers), so it runs with nothing beside it.
    together = [e for e in chosen if "testbed" not in e.where.split("+")] if args.jobs > 1 else []
    if together:
        print(f"{len(together)} experiments in up to {args.jobs} processes ...", flush=True)
        # fork: a worker starts as this process is (what a caller set up included).
        context = multiprocessing.get_context("fork")
        together = longest_first(together, out, profile)
        work = [(e, out, info) for e in together]
        workers = min(args.jobs, len(together))
        with ProcessPoolExecutor(workers, context, _take, (work,)) as pool:
            running = {pool.submit(_run_nth, i): e for i, e in enumerate(together)}
            try:
                for future in as_completed(running):
                    e = running[future]
                    done[e.name] = doc = future.result()
                    print(
                        f"[{len(done)}/{len(chosen)}] {e.name} ({e.figure}, {e.where}, "
                        f"{profile}): {_ran(doc, start)}",
                        flush=True,
                    )
            except BaseException:  # one failed (or Ctrl-C): the rest are not started
                for future in running:
                    future.cancel()
                raise
    for e in chosen:
        if e.name in done:
            continue
        print(f"[{len(done) + len(skipped) + 1}/{len(chosen)}] {e.name} ({e.figure}, {e.where}, "
              f"{profile}) ...", flush=True)  # fmt: skip
        if e.needs_root and os.geteuid() != 0:
            print("      skipped: needs root (it builds network namespaces)", flush=True)
            skipped.append(e.name)
            continue
        done[e.name] = doc = _run_one(e, out, info)
        print(f"      {_ran(doc, start)}", flush=True)
    docs = [done[e.name] for e in chosen if e.name in done]  # the report in the chosen order
    report = index(out, docs, info, skipped, [e.name for e in EXPERIMENTS])
    claims = [c for d in docs for c in d["claims"]]
    passed = sum(1 for c in claims if c["pass"])
    print(
        f"{len(docs)} experiments, {passed}/{len(claims)} claims pass "
        f"({time.monotonic() - start:.0f} s): {report}"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.cmd == "list":
        for e in EXPERIMENTS:
            print(f"{e.name:<22} {e.figure:<13} {e.where:<8} {e.shows}")
        return 0
    if args.cmd == "agree":
        try:
            print(agreement.table([Path(r) for r in args.reports]))
        except (OSError, ValueError) as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
        return 0
    return run(args)
