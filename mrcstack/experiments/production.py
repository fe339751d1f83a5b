"""Production events on a large simulated fabric: the job, the runs and the job's throughput
over time that Figs 6 and 8 share.

The fabric has 8 planes, 32 racks of 2 hosts and 8 T1s per plane (64 hosts, 320 switches):
each T0 has 2 hosts below it and 8 T1s above, so the job loads the uplinks to a quarter and
a QP that moves off a failed path finds room on the others (with the uplinks full, a T1 is
1/8 of a plane's capacity and that share is gone while it is down).  The job is a ring collective's
traffic: every host streams to the next one in a ring that alternates racks (so every hop
crosses a T1), one QP each.  A ring moves at the pace of its slowest member, so the *job's
throughput* over a window is the number of QPs times the least any QP moved in it
(:func:`job_gbps`), not their sum: one stalled QP stalls the job, as one slow link stalls a
training step.

Time is scaled as in every simulated figure: links run at 10 Gbit/s and the events last
milliseconds (the paper's minutes); the protocol counts its reactions in RTTs, tens of
microseconds here.  Packets carry 8 KiB (mrcd's default) to keep the run small.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mrcstack.experiments.analysis import NOT_MEASURED, mean
from mrcstack.experiments.base import Plot, Table
from mrcstack.experiments.plots import lines
from mrcstack.experiments.simruns import MODE_LABELS, MODES, RATE, Sim
from mrcstack.fabric import Fabric
from mrcstack.sim import SimResult

FABRIC = Fabric(planes=8, racks=32, hosts_per_rack=2, t1_per_plane=8)
#: The ring: h0, h4, h8, ... h60, h1, h5, ...: every neighbour in another rack.
RING = tuple(r * FABRIC.hosts_per_rack + i for i in range(FABRIC.hosts_per_rack)
             for r in range(FABRIC.racks))  # fmt: skip
PAIRS = tuple((RING[i], RING[(i + 1) % len(RING)]) for i in range(len(RING)))
MTU_PAYLOAD = 8192
BIN_S = 50e-6
#: The job's throughput is taken over windows of this many bins (0.2 ms): a QP's goodput
#: in one bin is too noisy to be the pace of a ring.
WINDOW_BINS = 4
#: Every QP's capacity: its 8 planes at the link rate (Gbit/s).
QP_GBPS = FABRIC.planes * RATE / 1e9
FABRIC_TEXT = "8 planes x 8 T1, 32 racks x 2 hosts (64 hosts, 320 switches)"


@dataclass(frozen=True, slots=True)
class JobRun:
    """One mode's run of the job: the result, and the job's throughput per window."""

    result: SimResult
    job: list[float]  # Gbit/s per window of WINDOW_BINS bins

    @property
    def end_ms(self) -> float | None:
        """When its last QP completed (ms), None if one never did."""
        r = self.result
        return r.completion_time_s * 1e3 if all(f.complete for f in r.flows) else None

    def over(self, start_s: float, end_s: float) -> float:
        """The job's mean throughput between two times."""
        w = BIN_S * WINDOW_BINS
        a, b = int(start_s / w), max(int(end_s / w), int(start_s / w) + 1)
        return mean([self.job[i] if i < len(self.job) else 0.0 for i in range(a, b)])


def job_gbps(result: SimResult, flows: int) -> list[float]:
    """The job's throughput per window: ``flows`` times the least any QP moved in it."""
    bins = result.timeline
    out = []
    for i in range(0, len(bins) - WINDOW_BINS + 1, WINDOW_BINS):
        window = bins[i : i + WINDOW_BINS]
        least = min(sum(b.flow_bytes[f] for b in window) for f in range(flows))
        out.append(flows * least * 8 / (WINDOW_BINS * BIN_S) / 1e9)
    return out


def run_job(
    sim: Sim, mode: str, duration_s: float, seed: int, ev_count: int, **faults: Any
) -> JobRun:
    """The job in ``mode`` across ``faults``, each QP sized for ``duration_s`` at its
    capacity (RoCE mode, on one plane, does not finish: its run stops at twice that)."""
    cfg = sim.config(
        FABRIC,
        pairs=PAIRS,
        bytes_per_flow=int(QP_GBPS * 1e9 / 8 * duration_s),
        mode=mode,
        seed=seed,
        ev_count=ev_count,
        mtu_payload=MTU_PAYLOAD,
        series_interval_s=BIN_S,
        max_sim_time_s=2 * duration_s,
        **faults,
    )
    result = sim.run(cfg)
    return JobRun(result, job_gbps(result, len(PAIRS)))


def timeline(runs: Mapping[str, JobRun], until_s: float) -> Table:
    """The job's throughput per window, each mode side by side, up to ``until_s``."""
    w = BIN_S * WINDOW_BINS
    n = min(int(until_s / w), max(len(r.job) for r in runs.values()))
    rows = tuple(
        (round(i * w * 1e3, 3), *(r.job[i] if i < len(r.job) else 0.0 for r in runs.values()))
        for i in range(n)
    )
    return Table("job", ("time_ms", *runs), rows)


def plot(
    title: str,
    runs: Mapping[str, JobRun],
    marks: Sequence[tuple[float, str]] = (),
    spans: Sequence[tuple[float, float, str]] = (),
) -> Plot:
    """The job's throughput over time, each mode, its end marked."""
    return Plot(
        "job",
        "the job's throughput over time",
        lines(
            "job",
            "time_ms",
            list(MODES),
            xlabel="time (ms; the paper's events last minutes)",
            ylabel="job throughput (Gbit/s: 64 x the slowest QP)",
            title=title,
            marks=marks,
            spans=spans,
            labels={m: f"{MODE_LABELS[m]}, 64 QPs in a ring" for m in MODES},
            capacity=(len(PAIRS) * QP_GBPS, f"capacity, 64 x {QP_GBPS:g} Gbit/s"),
            ends={m: e for m, r in runs.items() if (e := r.end_ms) is not None},
        ),
    )


def kept(run: JobRun, before: tuple[float, float], during: tuple[float, float]) -> float:
    """The job's throughput during a span over before it (not measured if it moved
    nothing before)."""
    pre = run.over(*before)
    return run.over(*during) / pre if pre else NOT_MEASURED
