"""``mrcstack experiment list | run NAME... [--quick] [--where sim|testbed] [--out DIR]
[--seed N]``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from mrcstack import __version__
from mrcstack.experiments.base import Experiment, RunInfo, index, write
from mrcstack.experiments.registry import EXPERIMENTS

PROG = "mrcstack experiment"
DEFAULT_OUT = "experiments-out"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="the MRC paper's experiments, with plots and claims")
    p.add_argument("--version", action="version", version=f"mrcstack {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    sub.add_parser("list", help="one line per experiment: name, figure, what, where")
    r = sub.add_parser("run", help="run experiments (all when none is named)")
    r.add_argument("names", nargs="*", metavar="NAME")
    r.add_argument("--quick", action="store_true", help="the quick profile (minutes, not tens)")
    r.add_argument("--where", choices=["sim", "testbed"], help="only those that run there")
    r.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    r.add_argument("--seed", type=int, default=1)
    return p


def select(names: Sequence[str], where: str | None) -> list[Experiment]:
    known = {e.name: e for e in EXPERIMENTS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown experiment {unknown[0]!r} (`{PROG} list` names them)")
    chosen = [known[n] for n in names] if names else list(EXPERIMENTS)
    if where is not None:
        chosen = [e for e in chosen if where in e.where.split("+")]
        if not chosen:
            raise ValueError(f"no chosen experiment runs on the {where}")
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.cmd == "list":
        for e in EXPERIMENTS:
            print(f"{e.name:<20} {e.figure:<11} {e.where:<8} {e.shows}")
        return 0
    try:
        chosen = select(args.names, args.where)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    profile = "quick" if args.quick else "full"
    out = Path(args.out)
    docs: list[dict[str, Any]] = []
    skipped: list[str] = []
    info = RunInfo.here(profile, args.seed)
    start = time.monotonic()
    for i, e in enumerate(chosen, 1):
        t0 = time.monotonic()
        print(f"[{i}/{len(chosen)}] {e.name} ({e.figure}, {e.where}, {profile}) ...", flush=True)
        if e.needs_root and os.geteuid() != 0:
            print("      skipped: needs root (it builds network namespaces)", flush=True)
            skipped.append(e.name)
            continue
        outcome = e.run(profile, args.seed)
        took = time.monotonic() - t0
        doc = write(out, e, outcome, took, info)
        docs.append(doc)
        ok = sum(1 for c in doc["claims"] if c["pass"])
        print(
            f"      {ok}/{len(doc['claims'])} claims pass, {took:.1f} s "
            f"(elapsed {time.monotonic() - start:.0f} s)",
            flush=True,
        )
    report = index(out, docs, info, skipped)
    claims = [c for d in docs for c in d["claims"]]
    passed = sum(1 for c in claims if c["pass"])
    print(f"{len(docs)} experiments, {passed}/{len(claims)} claims pass: {report}")
    return 0
