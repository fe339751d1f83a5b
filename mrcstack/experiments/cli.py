"""``mrcstack experiment list | run NAME... [--quick] [--where sim|testbed|design] [--out DIR]
[--seed N] [--without MECHANISM] | agree DIR...``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
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


def run(args: argparse.Namespace) -> int:
    without = Mechanism(args.without) if args.without else None
    try:
        chosen = select(args.names, args.where, without)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    profile = "quick" if args.quick else "full"
    out = Path(args.out)
    docs: list[dict[str, Any]] = []
    skipped: list[str] = []
    info = RunInfo.here(profile, args.seed, without)
    start = time.monotonic()
    for i, e in enumerate(chosen, 1):
        t0 = time.monotonic()
        print(f"[{i}/{len(chosen)}] {e.name} ({e.figure}, {e.where}, {profile}) ...", flush=True)
        if e.needs_root and os.geteuid() != 0:
            print("      skipped: needs root (it builds network namespaces)", flush=True)
            skipped.append(e.name)
            continue
        outcome = e.run(profile, args.seed, without)
        took = time.monotonic() - t0
        doc = write(out, e, outcome, took, info)
        docs.append(doc)
        ok = sum(1 for c in doc["claims"] if c["pass"])
        print(
            f"      {ok}/{len(doc['claims'])} claims pass, {took:.1f} s "
            f"(elapsed {time.monotonic() - start:.0f} s)",
            flush=True,
        )
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
