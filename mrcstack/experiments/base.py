"""What every experiment shares: its description, its claims, and the files it writes.

An experiment turns a profile (``quick`` or ``full``), a seed and, optionally, a
:class:`Mechanism` to run without into an :class:`Outcome`: the parameters it ran with, the
data behind each plot (series of numbers, also written as CSV), the plots themselves (drawn
by :mod:`mrcstack.experiments.plots`), and a list of :class:`Claim`, each a number against
a threshold that credits one mechanism.  Run without that mechanism, the claim must fail:
that is what makes it evidence.  :func:`write` puts it all under ``DIR/NAME/``:
``result.json``, one CSV per table, one PNG per plot.
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
from collections.abc import Callable
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


class Mechanism(enum.StrEnum):
    """What a claim credits.  ``mrcstack experiment run NAME --without M`` takes it away
    (:attr:`without` says how), and every claim crediting it should then fail."""

    MRC = "mrc"
    SPRAYING = "spraying"
    TRIMMING = "trimming"
    ECN = "ecn"
    PLANES = "planes"
    MAPPER = "mapper"

    @property
    def without(self) -> str:
        """What a run without this mechanism runs instead."""
        return _WITHOUT[self]


_WITHOUT = {
    Mechanism.MRC: "MRC replaced by RoCE mode: one ECMP path per flow, go-back-N",
    Mechanism.SPRAYING: "one path per connection (mrcd: a single EV, on the path the fault hits)",
    Mechanism.TRIMMING: "switches drop what they would trim",
    Mechanism.ECN: "switches never mark ECN",
    Mechanism.PLANES: "one plane at the NIC's whole rate instead of several",
    Mechanism.MAPPER: "no fabric mapper: no probes, no denylist (Fig 4 keeps the mapper "
    "watching, to count what crosses the links it would deny, but nothing reaches a QP)",
}


class Op(enum.StrEnum):
    """How a claim compares its value with its threshold; the text is what result.json and
    the report show."""

    AT_LEAST = ">="
    AT_MOST = "<="
    WITHIN = "within"  # of the threshold, by the claim's relative tolerance


@dataclass(frozen=True, slots=True)
class Claim:
    """One stated number: ``value`` compared with ``threshold`` by ``op``.  A value that
    could not be measured (NaN) fails.  :attr:`Op.WITHIN` passes a value within
    ``tolerance`` (relative) of the threshold: a number the paper gives, reproduced.
    ``credits`` names the mechanism the claim rests on; a value decided over repeated runs
    gives their number and the ``interval`` (the lowest and highest run) around it."""

    text: str
    value: float
    threshold: float
    op: Op = Op.AT_LEAST
    credits: Mechanism | None = field(default=None, kw_only=True)
    interval: tuple[float, float] | None = field(default=None, kw_only=True)
    runs: int | None = field(default=None, kw_only=True)
    tolerance: float | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", Op(self.op))  # ValueError for an unknown comparison
        if (self.op is Op.WITHIN) != (self.tolerance is not None):
            raise ValueError("a tolerance goes with Op.WITHIN, and only with it")
        if self.credits is not None:
            object.__setattr__(self, "credits", Mechanism(self.credits))

    @property
    def passed(self) -> bool:
        if math.isnan(self.value):
            return False
        if self.op is Op.AT_LEAST:
            return self.value >= self.threshold
        if self.op is Op.WITHIN:
            return abs(self.value - self.threshold) <= (self.tolerance or 0.0) * abs(self.threshold)
        return self.value <= self.threshold

    @property
    def condition(self) -> str:
        """The threshold as the report states it: ``>= 0.9``, ``within 2% of 0.6``."""
        if self.op is Op.WITHIN:
            return f"within {(self.tolerance or 0.0) * 100:g}% of {self.threshold:g}"
        return f"{self.op.value} {self.threshold:g}"

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "value": _finite(self.value),
            "threshold": self.threshold,
            "op": self.op.value,
            "tolerance": self.tolerance,
            "condition": self.condition,
            "pass": self.passed,
            "credits": None if self.credits is None else self.credits.value,
            "interval": None if self.interval is None else [_finite(v) for v in self.interval],
            "runs": self.runs,
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
    """What a run of an experiment produced (``write`` turns it into files)."""

    params: dict[str, Any]
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Each simulator run as a scenario file: (file stem, TOML text).
    scenarios: list[tuple[str, str]] = field(default_factory=list)


#: How an experiment runs: (profile, seed, the mechanism to run without or None).
Run = Callable[[str, int, Mechanism | None], Outcome]


@dataclass(frozen=True, slots=True)
class Experiment:
    """``where``: "sim", "testbed" or "design" (arithmetic, no runs).  ``mechanisms``:
    what its claims credit, each one it can run without."""

    name: str
    figure: str
    shows: str
    where: str
    run: Run
    needs_root: bool = False
    mechanisms: tuple[Mechanism, ...] = ()


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
    without: Mechanism | None = None

    @classmethod
    def here(cls, profile: str, seed: int, without: Mechanism | None = None) -> RunInfo:
        return cls(profile, seed, _revision(), _machine(), without)

    def command(self, name: str) -> str:
        quick = " --quick" if self.profile == "quick" else ""
        without = f" --without {self.without}" if self.without else ""
        return f"mrcstack experiment run {name}{quick} --seed {self.seed}{without}"


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
        "without": None if info.without is None else info.without.value,
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
