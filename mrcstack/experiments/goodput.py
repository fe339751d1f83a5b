"""Goodput over time in the simulator: the fault figures' runs (each mode across the same
faults, binned every :data:`BIN_S`), their mean over a span and worst moment, and the
timeline table with its plot."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mrcstack.experiments.analysis import NOT_MEASURED, mean
from mrcstack.experiments.base import Claim, Op, Outcome, Plot, Table
from mrcstack.experiments.plots import lines
from mrcstack.experiments.simruns import MODE_LABELS, MODES, RATE, Sim, capacity_gbps
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

    @property
    def end_ms(self) -> float | None:
        """When its last flow completed (ms), None if one never did."""
        done = all(f["complete"] for f in self.doc["flows"])
        return self.doc["completion_time_s"] * 1e3 if done else None


def run(sim: Sim, cfg: SimConfig) -> Run:
    doc = sim.run(cfg).to_json()
    return Run(doc, [b["goodput_bps"] / 1e9 for b in doc["timeline"]])


def label(name: str) -> str:
    """A run's name as a legend says it: a mode names its stack and paths; a name ending
    in ", <mode>" keeps its start."""
    head, _, mode = name.rpartition(", ")
    if mode in MODE_LABELS:
        return f"{head}: {MODE_LABELS[mode]}" if head else MODE_LABELS[mode]
    return name


@dataclass(frozen=True, slots=True)
class FaultRuns:
    """Runs across faults, every flow sized for ``duration_s`` at line rate on every plane;
    ``capacity_gbps``: what the flows could move at most together."""

    duration_s: float
    runs: dict[str, Run]  # by mode, or by a name of the figure's
    capacity_gbps: float = 0.0


def fault_runs(
    sim: Sim,
    fabric: Fabric,
    pairs: tuple[tuple[int, int], ...],
    duration_s: float,
    *,
    modes: Sequence[str] = MODES,
    seed: int | None = None,
    **faults: Any,
) -> FaultRuns:
    """Each of ``modes`` across the same ``faults`` (SimConfig's fault windows), with the
    figure's seed unless ``seed``."""
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
                seed=seed,
                **faults,
            ),
        )
        for mode in modes
    }
    return FaultRuns(duration_s, runs, capacity_gbps(fabric, pairs))


def roce_load(
    sim: Sim, fabric: Fabric, pairs: tuple[tuple[int, int], ...], seed: int
) -> dict[str, int]:
    """Bytes RoCE mode's flows put on each fabric link (a short dry run with ``seed``):
    where a figure places its fault so that the baseline is hurt, as the paper's Fig 9d
    fails the switch its flows cross."""
    dry = sim.run(sim.config(fabric, pairs=pairs, bytes_per_flow=1 << 20, mode="roce", seed=seed))
    return {link: int(st["bytes"]) for link, st in dry.to_json()["links"].items() if st["bytes"]}


def physical(link: str) -> str:
    """A directed link's physical name (its ends in name order): ``p1:t1c-t0b`` ->
    ``p1:t0b-t1c``."""
    plane, _, ends = link.partition(":")
    a, b = ends.split("-")
    return f"{plane}:{min(a, b)}-{max(a, b)}"


def busiest(load: Mapping[str, int], keep: Callable[[str], bool] = lambda _: True) -> list[str]:
    """The links of ``load`` that ``keep`` accepts, most loaded first (then by name)."""
    return sorted((k for k in load if keep(k)), key=lambda k: (-load[k], k))


def busiest_t1(sim: Sim, fabric: Fabric, pairs: tuple[tuple[int, int], ...], seed: int) -> str:
    """The T1 that RoCE mode's flows load most (a short dry run with ``seed``)."""
    load: dict[str, int] = {}
    for link, n in roce_load(sim, fabric, pairs, seed).items():
        plane, _, ends = link.partition(":")  # "p3:t0a-t1c": plane 3, T0 a to T1 c
        for end in ends.split("-"):
            if end.startswith("t1"):
                load[f"{plane}-{end}"] = load.get(f"{plane}-{end}", 0) + n
    return busiest(load)[0] if load else fabric.t1_name(fabric.planes - 1, fabric.t1_per_plane - 1)


def pooled(per_seed: Sequence[Sequence[Claim]]) -> list[Claim]:
    """Claims that must hold for every seed: each one's worst seed (the lowest value of an
    "at least", the highest of an "at most", the farthest of a "within"), with the range
    over the seeds and their number."""
    out = []
    for same in zip(*per_seed, strict=True):
        first = same[0]
        values = [c.value for c in same]
        if first.op is Op.AT_LEAST:
            worst = min(values)
        elif first.op is Op.AT_MOST:
            worst = max(values)
        else:
            worst = max(values, key=lambda v: abs(v - first.threshold))
        if any(math.isnan(v) for v in values):
            worst = NOT_MEASURED
        finite = [v for v in values if not math.isnan(v)]
        interval = (min(finite), max(finite)) if finite else None
        text = f"{first.text} (worst of {len(same)} seeds)"
        out.append(replace(first, text=text, value=worst, interval=interval, runs=len(same)))
    return out


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
    capacity_gbps: float | None = None,
    ends_ms: Mapping[str, float | None] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Plot:
    """The ``goodput`` table's columns over time: the figure most experiments draw, each
    column named by :func:`label` (or ``labels``), the capacity dashed, and each run's
    end marked where it ended."""
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
            labels={c: label(c) for c in columns} | dict(labels or {}),
            capacity=None
            if not capacity_gbps
            else (capacity_gbps, f"capacity, {capacity_gbps:g} Gbit/s"),
            ends={k: v for k, v in (ends_ms or {}).items() if v is not None},
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
        plots=[
            plot(
                list(faults.runs),
                ylabel=ylabel,
                title=title,
                marks=marks,
                spans=spans,
                capacity_gbps=faults.capacity_gbps,
                ends_ms={name: r.end_ms for name, r in faults.runs.items()},
            )
        ],
    )
