"""Goodput over time in the simulator: the fault figures' runs (each mode across the same
faults, binned every :data:`BIN_S`), their mean over a span and worst moment, and the
timeline table with its plot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mrcstack.experiments.analysis import NOT_MEASURED, mean
from mrcstack.experiments.base import Outcome, Plot, Table
from mrcstack.experiments.plots import lines
from mrcstack.experiments.simruns import MODES, RATE, Sim
from mrcstack.fabric import Fabric
from mrcstack.sim import SimConfig

BIN_S = 50e-6
SMOOTH = 4  # bins averaged for the "worst moment" figures (0.2 ms)
#: A fault figure's timeline ends at this multiple of its runs' duration: a slower
#: baseline's tail would squeeze the part where the faults are.
TAIL = 1.1


@dataclass(frozen=True, slots=True)
class Run:
    """A run's JSON and its goodput per bin in Gbit/s (the run's whole length)."""

    doc: dict[str, Any]
    gbps: list[float]


def run(sim: Sim, cfg: SimConfig) -> Run:
    doc = sim.run(cfg).to_json()
    return Run(doc, [b["goodput_bps"] / 1e9 for b in doc["timeline"]])


@dataclass(frozen=True, slots=True)
class FaultRuns:
    """Runs across faults, every flow sized for ``duration_s`` at line rate on every plane."""

    duration_s: float
    runs: dict[str, Run]  # by mode, or by a name of the figure's


def fault_runs(
    sim: Sim,
    fabric: Fabric,
    pairs: tuple[tuple[int, int], ...],
    duration_s: float,
    *,
    modes: Sequence[str] = MODES,
    **faults: Any,
) -> FaultRuns:
    """Each of ``modes`` across the same ``faults`` (SimConfig's fault windows)."""
    per_flow = int(RATE * fabric.planes / 8 * duration_s)
    runs = {
        mode: run(
            sim,
            sim.config(
                fabric,
                pairs=pairs,
                bytes_per_flow=per_flow,
                mode=mode,
                max_sim_time_s=duration_s * 4,
                series_interval_s=BIN_S,
                **faults,
            ),
        )
        for mode in modes
    }
    return FaultRuns(duration_s, runs)


def per_bin(runs: Mapping[str, Run]) -> dict[str, list[float]]:
    """Each run's goodput per bin, by its name."""
    return {name: run.gbps for name, run in runs.items()}


def span(series: list[float], start_s: float, end_s: float) -> float:
    """Mean goodput between two times; a run that ended (or stalled for good) counts 0."""
    a, b = int(start_s / BIN_S), int(end_s / BIN_S)
    return mean([series[i] if i < len(series) else 0.0 for i in range(a, max(b, a + 1))])


def worst(series: list[float], start_s: float, end_s: float) -> float:
    """The lowest 0.2 ms average of goodput between two times."""
    a, b = int(start_s / BIN_S), max(int(end_s / BIN_S), int(start_s / BIN_S) + SMOOTH)
    spans = [mean(series[i : i + SMOOTH]) for i in range(a, max(a + 1, b - SMOOTH + 1))]
    return min(spans) if spans else NOT_MEASURED


def timeline(
    name: str,
    runs: Mapping[str, list[float]],
    until_s: float | None = None,
    *,
    bin_s: float = BIN_S,
) -> Table:
    """Goodput per bin of each run, side by side (up to ``until_s``: a slower baseline's
    tail would squeeze the part where the faults are)."""
    n = max(len(s) for s in runs.values())
    if until_s is not None:
        n = min(n, int(until_s / bin_s))
    rows = tuple(
        (round(i * bin_s * 1e3, 4), *(s[i] if i < len(s) else 0.0 for s in runs.values()))
        for i in range(n)
    )
    return Table(name, ("time_ms", *runs), rows)


def plot(
    columns: list[str],
    *,
    ylabel: str,
    title: str,
    marks: Sequence[tuple[float, str]] = (),
    spans: Sequence[tuple[float, float, str]] = (),
    caption: str = "goodput over time",
) -> Plot:
    """The ``goodput`` table's columns over time: the figure most experiments draw."""
    return Plot(
        "goodput",
        caption,
        lines(
            "goodput",
            "time_ms",
            columns,
            xlabel="time (ms)",
            ylabel=ylabel,
            title=title,
            marks=marks,
            spans=spans,
        ),
    )


def outcome(
    faults: FaultRuns,
    params: dict[str, Any],
    *,
    ylabel: str,
    title: str,
    marks: Sequence[tuple[float, str]] = (),
    spans: Sequence[tuple[float, float, str]] = (),
) -> Outcome:
    """A fault figure's outcome before its claims: ``params``, and each run's goodput over
    time, as a table and a plot, up to :data:`TAIL` times the runs' duration."""
    until_s = faults.duration_s * TAIL
    return Outcome(
        params=params,
        tables=[timeline("goodput", per_bin(faults.runs), until_s)],
        plots=[plot(list(faults.runs), ylabel=ylabel, title=title, marks=marks, spans=spans)],
    )
