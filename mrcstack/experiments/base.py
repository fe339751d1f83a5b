"""What every experiment shares: its description, its claims, and the files it writes.

An experiment turns a profile (``quick`` or ``full``) and a seed into an :class:`Outcome`:
the parameters it ran with, the data behind each plot (series of numbers, also written as
CSV), the plots themselves (drawn by :mod:`mrcstack.experiments.plots`), and a list of
:class:`Claim`, each a number against a threshold.  :func:`write` puts it all under
``DIR/NAME/``: ``result.json``, one CSV per table, one PNG per plot.
"""

from __future__ import annotations

import csv
import enum
import gzip
import json
import math
import os
import platform
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mrcstack import __version__

#: The quick profile takes minutes; the full one moves more data and runs more seeds.
PROFILES = ("quick", "full")
#: The folder of an experiment's simulator runs, one scenario file each (gzipped when
#: larger than SCENARIO_GZIP_BYTES; ``mrcstack sim --scenario`` reads either).
SCENARIOS = "scenarios"
SCENARIO_GZIP_BYTES = 32 << 10


class Op(enum.StrEnum):
    """How a claim compares its value with its threshold; the text is what result.json and
    the report show."""

    AT_LEAST = ">="
    AT_MOST = "<="


@dataclass(frozen=True, slots=True)
class Claim:
    """One stated number: ``value`` compared with ``threshold`` by ``op``.  A value that
    could not be measured (NaN) fails."""

    text: str
    value: float
    threshold: float
    op: Op = Op.AT_LEAST

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", Op(self.op))  # ValueError for an unknown comparison

    @property
    def passed(self) -> bool:
        if math.isnan(self.value):
            return False
        if self.op is Op.AT_LEAST:
            return self.value >= self.threshold
        return self.value <= self.threshold

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "value": _finite(self.value),
            "threshold": self.threshold,
            "op": self.op.value,
            "pass": self.passed,
        }


@dataclass(frozen=True, slots=True)
class Table:
    """Rows of numbers with named columns: a CSV file and the data behind a plot."""

    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    def column(self, name: str) -> list[Any]:
        i = self.columns.index(name)
        return [r[i] for r in self.rows]


@dataclass(frozen=True, slots=True)
class Plot:
    """A PNG to draw from tables: ``draw(path, tables)`` (see ``plots.py``)."""

    name: str
    title: str
    draw: Callable[[Path, dict[str, Table]], None]


@dataclass(slots=True)
class Outcome:
    params: dict[str, Any]
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Each simulator run as a scenario file: (file stem, TOML text).
    scenarios: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Experiment:
    name: str
    figure: str
    shows: str
    where: str  # "sim", "testbed" or "sim+testbed"
    run: Callable[[str, int], Outcome]  # (profile, seed)
    needs_root: bool = False


def scaled(profile: str, quick: int, full: int) -> int:
    """A figure's size (bytes, runs, seeds) in ``profile``: ``quick`` or ``full``."""
    return quick if profile == "quick" else full


@dataclass(frozen=True, slots=True)
class RunInfo:
    """How a report was made, so a reader can rerun any figure: stated in every result and
    at the top of the report."""

    profile: str
    seed: int
    revision: str  # git revision of the checkout, or the package version
    machine: str  # OS, CPUs, Python

    @classmethod
    def here(cls, profile: str, seed: int) -> RunInfo:
        return cls(profile, seed, _revision(), _machine())

    def command(self, name: str) -> str:
        quick = " --quick" if self.profile == "quick" else ""
        return f"mrcstack experiment run {name}{quick} --seed {self.seed}"


def _revision() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except OSError:
        return f"mrcstack {__version__}"
    rev = proc.stdout.strip()
    return f"git {rev}" if proc.returncode == 0 and rev else f"mrcstack {__version__}"


def _machine() -> str:
    return (
        f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )


def write(
    out: Path, exp: Experiment, outcome: Outcome, seconds: float, info: RunInfo
) -> dict[str, Any]:
    """``out/NAME/``: result.json, the tables as CSV, the plots as PNG; returns the JSON."""
    folder = out / exp.name
    folder.mkdir(parents=True, exist_ok=True)
    tables = {t.name: t for t in outcome.tables}
    for t in outcome.tables:
        with (folder / f"{t.name}.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(t.columns)
            w.writerows(t.rows)
    for p in outcome.plots:
        p.draw(folder / f"{p.name}.png", tables)
    if outcome.scenarios:
        (folder / SCENARIOS).mkdir(exist_ok=True)
    files = []
    for stem, text in outcome.scenarios:
        data = text.encode()
        name = f"{stem}.toml"
        if len(data) > SCENARIO_GZIP_BYTES:  # a collective's hundreds of flows
            name += ".gz"
            data = gzip.compress(data, mtime=0)  # mtime 0: the same run, the same bytes
        (folder / SCENARIOS / name).write_bytes(data)
        files.append(f"{SCENARIOS}/{name}")
    doc = {
        "name": exp.name,
        "figure": exp.figure,
        "shows": exp.shows,
        "where": exp.where,
        "params": outcome.params,
        "profile": info.profile,
        "seed": info.seed,
        "revision": info.revision,
        "machine": info.machine,
        "rerun": info.command(exp.name),
        "seconds": round(seconds, 2),
        "data": {
            t.name: {"columns": list(t.columns), "rows": [list(r) for r in t.rows]}
            for t in outcome.tables
        },
        "plots": [f"{p.name}.png" for p in outcome.plots],
        "claims": [c.to_json() for c in outcome.claims],
        "notes": outcome.notes,
        "scenarios": files,
    }
    doc = dict(_clean(doc))
    (folder / "result.json").write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    return doc


def index(
    out: Path, docs: Sequence[dict[str, Any]], info: RunInfo, skipped: Sequence[str] = ()
) -> Path:
    """``out/index.md``: how it was made, every plot with its claims table, and a pass/fail
    summary."""
    claims = [c for d in docs for c in d["claims"]]
    passed = sum(1 for c in claims if c["pass"])
    lines = [
        "# mrcstack experiments",
        "",
        f"{len(docs)} experiments, {passed} of {len(claims)} claims pass.",
        "",
        f"Profile `{info.profile}`, seed {info.seed}, {info.revision}; {info.machine}. "
        "Each section names the command that reruns it.",
        "",
        *([f"Skipped (need root): {', '.join(skipped)}.", ""] if skipped else []),
        "| experiment | figure | where | claims passed | seconds |",
        "|---|---|---|---|---|",
    ]
    for d in docs:
        ok = sum(1 for c in d["claims"] if c["pass"])
        lines.append(
            f"| [{d['name']}](#{d['name']}) | {d['figure']} | {d['where']} | "
            f"{ok}/{len(d['claims'])} | {d['seconds']} |"
        )
    for d in docs:
        lines += ["", f"## {d['name']}", "", f"{d['figure']}: {d['shows']}", ""]
        lines += [f"![{p}]({d['name']}/{p})" for p in d["plots"]]
        lines += ["", "| claim | value | threshold | pass |", "|---|---|---|---|"]
        for c in d["claims"]:
            value = "n/a" if c["value"] is None else f"{c['value']:.3g}"
            lines.append(
                f"| {c['text']} | {value} | {c['op']} {c['threshold']:g} | "
                f"{'PASS' if c['pass'] else 'FAIL'} |"
            )
        lines += [f"- {n}" for n in d["notes"]]
        params = ", ".join(f"{k}={v}" for k, v in d["params"].items())
        lines += ["", f"Parameters: {params}.", "", f"Rerun: `{d['rerun']}`"]
        if d.get("scenarios"):
            lines += [
                "",
                f"Its {len(d['scenarios'])} simulator runs, one scenario file each: "
                f"`{d['name']}/{SCENARIOS}/`; `mrcstack sim --scenario FILE` reruns one.",
            ]
    path = out / "index.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _clean(value: Any) -> Any:
    """JSON without NaN or infinity (null instead), so every JSON reader takes it."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return _finite(value)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
