"""Fig 4: a job starts on a fabric with a dead T0-T1 link and a T0-T1 link losing 2%, with
the fabric mapper and without it.

The mapper's agents probe from the start; the job, an all-to-all among the hosts (one QP
per ordered pair), starts once the mapper has had time to judge both links.  With the
mapper every QP starts with the EVs over the two links denied, so none of its packets
crosses them; without it (the simulator: the mapper only watches, its denylist reaches no
QP; the testbed: no mapper at all) each QP finds the bad paths by losing packets on them.
The figure plots the retransmissions of each host's NIC per interval and the job's goodput
over time, in the simulator and, as root, on the testbed (:mod:`.fig4_testbed`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from mrcstack.experiments.analysis import ratio
from mrcstack.experiments.base import Claim, Experiment, Mechanism, Op, Outcome, Plot, Table
from mrcstack.experiments.figures import fig4_testbed
from mrcstack.experiments.simruns import Sim, params
from mrcstack.fabric import Fabric
from mrcstack.sim import FlowSpec, LinkFailure, SimResult
from mrcstack.sim.config import MapperSpec

FABRIC = Fabric(planes=4, racks=4, hosts_per_rack=2, t1_per_plane=4)
DEAD = "p0:t0a-t1b"
LOSSY = "p2:t0c-t1d"
LOSS = 0.02
#: The agents' probe interval in the simulator (100 rounds: 10 ms; the testbed probes
#: every 10 ms, the same number of rounds per second of reaction).
INTERVAL = 1e-4
#: The job starts after 600 rounds: the mapper has judged both links by then.
JOB_START_S = 0.06
BIN_S = 1e-4
VARIANTS = ("mapper", "no_mapper")
#: The job's retransmissions with the mapper over without must be at most this (the paper's
#: Fig 4: they all but vanish); a tie (1) is no evidence.
RETRANSMISSIONS_RATIO = 0.5


@dataclass(frozen=True, slots=True)
class JobRun:
    """One run of the job: its result, and its figures."""

    variant: str
    result: SimResult

    @property
    def doc(self) -> dict[str, Any]:
        return self.result.to_json()


def _job(sim: Sim, variant: str, deny: bool) -> JobRun:
    hosts = range(FABRIC.hosts)
    specs = tuple(FlowSpec(a, b, start_s=JOB_START_S) for a in hosts for b in hosts if a != b)
    cfg = sim.config(
        FABRIC,
        flow_specs=specs,
        bytes_per_flow=sim.size(1 << 20, 4 << 20),
        link_failures=(LinkFailure(DEAD, 0.0),),
        link_loss=((LOSSY, LOSS),),
        mapper=MapperSpec(interval=INTERVAL, deny=deny),
        series_interval_s=BIN_S,
        max_sim_time_s=JOB_START_S + 0.2,
    )
    return JobRun(variant, sim.run(cfg))


# The analysis -------------------------------------------------------------------------------
def retransmissions_per_bin(run: JobRun, bins: int) -> list[list[int]]:
    """Per bin from the job's start, each host's new retransmissions."""
    mapper = run.result.mapper
    assert mapper is not None  # every run of this figure has the mapper's agents
    out = [[0] * FABRIC.hosts for _ in range(bins)]
    before = [0] * FABRIC.hosts
    for at, totals in mapper.retransmissions:
        i = int((at - JOB_START_S) // BIN_S)
        if i >= bins:
            break
        for host, n in enumerate(totals):
            if i >= 0:
                out[i][host] += n - before[host]
            before[host] = n
    return out


def goodput_per_bin(run: JobRun, bins: int) -> list[float]:
    """The job's goodput (Gbit/s, all QPs) per bin from its start."""
    first = int(JOB_START_S / BIN_S)
    timeline = run.result.timeline
    return [
        timeline[first + i].goodput_bps / 1e9 if first + i < len(timeline) else 0.0
        for i in range(bins)
    ]


@dataclass(frozen=True, slots=True)
class Figures:
    """What the claims compare, per variant."""

    data_on_bad: dict[str, float]  # data packets on EVs over the bad links after the push
    qps_on_bad: dict[str, float]  # QPs that sent anything over them after the push
    qps_paid: dict[str, float]  # QPs that retransmitted at all
    retransmissions: dict[str, float]
    completion_ms: dict[str, float]
    named_ms: dict[str, float]  # when both bad links were on the denylist (ms of the run)
    qps: int


def figures(runs: Sequence[JobRun]) -> Figures:
    def mapper(run: JobRun) -> Any:
        assert run.result.mapper is not None
        return run.result.mapper

    def named(run: JobRun) -> float:
        for denial in mapper(run).denials:
            if {DEAD, LOSSY} <= set(denial.links):
                return float(denial.at * 1e3)
        return math.nan

    return Figures(
        data_on_bad={r.variant: float(mapper(r).data_on_denied) for r in runs},
        qps_on_bad={r.variant: float(len(mapper(r).pairs_on_denied)) for r in runs},
        qps_paid={
            r.variant: float(sum(1 for f in r.result.flows if sum(f.retransmissions.values())))
            for r in runs
        },
        retransmissions={r.variant: float(sum(r.result.retransmissions.values())) for r in runs},
        completion_ms={r.variant: (r.result.completion_time_s - JOB_START_S) * 1e3 for r in runs},
        named_ms={r.variant: named(r) for r in runs},
        qps=len(runs[0].result.flows),
    )


def claims(f: Figures) -> list[Claim]:
    """The with-mapper run against the figure's claims; each fails for a run without it."""
    return [
        Claim(
            "simulator, with the mapper: data packets on EVs over the dead or lossy link "
            "after the first denylist push",
            f.data_on_bad["mapper"],
            0,
            Op.AT_MOST,
            credits=Mechanism.MAPPER,
        ),
        Claim(
            f"simulator, with the mapper: QPs (of {f.qps}) that sent any packet over the dead "
            "or lossy link after the push, so that one could be lost there and retransmitted",
            f.qps_on_bad["mapper"],
            0,
            Op.AT_MOST,
            credits=Mechanism.MAPPER,
        ),
        Claim(
            "simulator: the job's retransmissions with the mapper over those without it",
            ratio(f.retransmissions["mapper"], f.retransmissions["no_mapper"]),
            RETRANSMISSIONS_RATIO,
            Op.AT_MOST,
            credits=Mechanism.MAPPER,
        ),
    ]


# The figure ---------------------------------------------------------------------------------
def _draw_retransmissions(path: Path, tables: dict[str, Table]) -> None:
    t = tables["retransmissions"]
    xs = t.column("time_ms")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, variant, title in zip(
        axes, VARIANTS, ("with the mapper", "without (the mapper only watches)"), strict=True
    ):
        for host in range(FABRIC.hosts):
            ax.plot(xs, t.column(f"{variant}_h{host}"), label=f"h{host}", linewidth=1.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("time since the job started (ms)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"retransmissions per NIC per {BIN_S * 1e3:g} ms")
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle("Fig 4: a job starts on a fabric with a dead and a 2%-loss link")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _draw_goodput(path: Path, tables: dict[str, Table]) -> None:
    t = tables["goodput"]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for variant in VARIANTS:
        ax.plot(t.column("time_ms"), t.column(variant), label=variant.replace("_", " "))
    ax.set_xlabel("time since the job started (ms)")
    ax.set_ylabel("job goodput (Gbit/s, every QP)")
    ax.set_title("Fig 4: the job's goodput, with the mapper and without")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def tables(runs: Sequence[JobRun]) -> list[Table]:
    bins = max(1, math.ceil(max(r.result.completion_time_s - JOB_START_S for r in runs) / BIN_S))
    per_host = {r.variant: retransmissions_per_bin(r, bins) for r in runs}
    goodput = {r.variant: goodput_per_bin(r, bins) for r in runs}
    hosts = range(FABRIC.hosts)
    retx_rows = tuple(
        (
            round(i * BIN_S * 1e3, 3),
            *(per_host[v][i][h] for v in VARIANTS for h in hosts),
        )
        for i in range(bins)
    )
    return [
        Table(
            "retransmissions",
            ("time_ms", *(f"{v}_h{h}" for v in VARIANTS for h in hosts)),
            retx_rows,
        ),
        Table(
            "goodput",
            ("time_ms", *VARIANTS),
            tuple(
                (round(i * BIN_S * 1e3, 3), *(round(goodput[v][i], 4) for v in VARIANTS))
                for i in range(bins)
            ),
        ),
    ]


def summary(f: Figures) -> Table:
    return Table(
        "summary",
        ("variant", "data_on_bad", "qps_on_bad", "qps_paid", "retransmissions",
         "completion_ms", "named_ms"),
        tuple(
            (v, f.data_on_bad[v], f.qps_on_bad[v], f.qps_paid[v], f.retransmissions[v],
             round(f.completion_ms[v], 3), round(f.named_ms[v], 3))
            for v in VARIANTS
        ),
    )  # fmt: skip


def simulated_part(
    sim: Sim, without: Mechanism | None = None
) -> tuple[list[Table], list[Plot], list[Claim], Figures]:
    """Both variants; without the mapper, the first runs as the second does (the claims
    judge the first)."""
    runs = [_job(sim, "mapper", deny=without is None), _job(sim, "no_mapper", deny=False)]
    f = figures(runs)
    plots = [
        Plot(
            "retransmissions", "Fig 4 (simulator): retransmissions per NIC", _draw_retransmissions
        ),
        Plot("goodput", "Fig 4 (simulator): the job's goodput", _draw_goodput),
    ]
    return [*tables(runs), summary(f)], plots, claims(f), f


def run(profile: str, seed: int, without: Mechanism | None = None) -> Outcome:
    """Both variants, in the simulator and (as root) on the testbed.  Without the mapper,
    the variant with it runs as the one without does, and its claims fail."""
    if without not in (None, Mechanism.MAPPER):
        raise ValueError(f"fig4-job-start's claims credit the mapper, not {without}")
    sim = Sim(profile, seed)
    tables_, plots, claims_, f = simulated_part(sim, without)
    outcome = Outcome(
        params(
            f"{FABRIC.planes} planes x {FABRIC.t1_per_plane} T1, {FABRIC.racks} racks x "
            f"{FABRIC.hosts_per_rack} hosts",
            {
                "job": f"all-to-all, {f.qps} QPs, from {JOB_START_S * 1e3:g} ms",
                "faults": f"{DEAD} dead, {LOSSY} losing {LOSS:.0%} (both directions)",
                "mapper": f"every loop every {INTERVAL * 1e3:g} ms (scaled: 10 ms on the testbed)",
                "without": "the mapper only watches: its denylist reaches no QP",
            },
        ),
        tables=tables_,
        plots=plots,
        claims=claims_,
        notes=[
            f"simulator: both links were on the denylist {f.named_ms['mapper']:.1f} ms into the "
            f"run; the job retransmitted {f.retransmissions['mapper']:g} packets with the "
            f"mapper ({f.qps_paid['mapper']:g} of {f.qps} QPs), "
            f"{f.retransmissions['no_mapper']:g} without it ({f.qps_paid['no_mapper']:g} QPs), "
            f"{f.data_on_bad['no_mapper']:g} of its data packets on the bad links' EVs.",
        ],
    )
    outcome.scenarios.extend(sim.scenarios)
    if os.geteuid() == 0:
        fig4_testbed.add(outcome, profile, seed, without)
    else:
        outcome.notes.append("testbed: not run (it needs root: it builds network namespaces)")
    return outcome


EXPERIMENT = Experiment(
    "fig4-job-start",
    "Fig 4",
    "a job starts on a fabric with a dead and a lossy link, with the mapper and without",
    "sim+testbed",
    run,
    mechanisms=(Mechanism.MAPPER,),
)
