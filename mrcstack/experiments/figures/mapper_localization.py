"""The fabric mapper at scale, in the simulator: how long it takes to name a dead link, a
dead T1 and a link losing 2%, against the probe interval and the fabric's size, up to 512
hosts (8 planes x 64 T1 in the full profile).

The agents and the localizer are mrcstack's own (:mod:`mrcstack.sim.probing`), the probes
packets on the simulated fabric, nothing else on it but a small write that ends each run.
A host probes only its own T0's links, so its share of the plan, and its probe rate, grow
with the T1s per plane but not with the hosts: the time to name a fault is set by the
interval, not by the size.  The gray failure runs on the two smaller fabrics (it takes
hundreds of rounds; at 512 hosts and 8 planes a round is 20,000 probes).  The quick profile
tries two intervals, runs the 512-host fabric on one plane (planes are separate networks:
each plane's links are judged from its own loops) and the gray failure on 8 hosts only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mrcstack import addrplan
from mrcstack.experiments.base import Claim, Mechanism, Op, Outcome, Plot, Table
from mrcstack.experiments.plots import lines
from mrcstack.experiments.simruns import Sim, simulated
from mrcstack.fabric import Fabric, letters
from mrcstack.mapper.cost import probe_cost
from mrcstack.mapper.plan import make_plan
from mrcstack.sim import FlowSpec, LinkFailure, LossChange, SwitchFailure
from mrcstack.sim.config import MapperSpec

INTERVALS_MS = (1.0, 2.0, 5.0, 10.0)
QUICK_INTERVALS_MS = (1.0, 10.0)
#: Rounds of probing before the fault, and after it for a dead link or T1 and for loss.
WARMUP_ROUNDS = 10
DOWN_ROUNDS = 20
GRAY_ROUNDS = 600
LOSS = 0.02


@dataclass(frozen=True, slots=True)
class Size:
    name: str
    fabric: Fabric
    gray: bool  # the gray failure too (hundreds of rounds: only where it stays cheap)


def sizes(sim: Sim) -> list[Size]:
    return [
        Size("8 hosts", Fabric(planes=4, racks=4, hosts_per_rack=2, t1_per_plane=4), True),
        Size(
            "64 hosts",
            Fabric(planes=8, racks=8, hosts_per_rack=8, t1_per_plane=16),
            sim.profile == "full",
        ),
        Size(
            "512 hosts",
            Fabric(planes=sim.size(1, 8), racks=16, hosts_per_rack=32, t1_per_plane=64),
            False,
        ),
    ]


@dataclass(frozen=True, slots=True)
class Row:
    size: str
    hosts: int
    planes: int
    links: int
    interval_ms: float
    down_ms: float
    t1_ms: float
    gray_ms: float  # NaN: not run at this size (see gray_run), or never named
    probes_per_host_s: float  # the plan's
    sent_per_plane: float  # probes a host sent per plane and round in the dead-link run
    exact: bool  # each fault named exactly, nothing else flagged
    gray_run: bool  # the gray failure ran at this size


def intervals(sim: Sim) -> tuple[float, ...]:
    return QUICK_INTERVALS_MS if sim.profile == "quick" else INTERVALS_MS


def _named(
    sim: Sim,
    fabric: Fabric,
    interval: float,
    rounds: int,
    faulty: set[str],
    seed: int | None = None,
    **fault: Any,
) -> tuple[float, bool, float]:
    """One simulator run: probing from 0, the fault half a round after WARMUP_ROUNDS (a
    fault comes at any time between two rounds), ``rounds`` more (a 4 KiB write then ends
    the run).  The time from the fault to the first of ``faulty`` named (NaN: none was),
    whether exactly ``faulty`` left UP, and the probes a host sent per plane and round (NaN
    for a run without the mapper: nothing probes, nothing is named)."""
    fault_at = (WARMUP_ROUNDS + 0.5) * interval
    end = fault_at + rounds * interval
    cfg = sim.config(
        fabric,
        flow_specs=(FlowSpec(0, fabric.hosts - 1, bytes=4096, start_s=end),),
        mapper=MapperSpec(interval=interval),
        max_sim_time_s=end + 0.05,
        seed=seed,
        **fault,
    )
    mapper = sim.run(cfg).mapper
    if mapper is None:  # run without the mapper
        return math.nan, False, math.nan
    named = [c.at for c in mapper.changes if c.link in faulty and c.at >= fault_at]
    flagged = {c.link for c in mapper.changes if c.old == "up"}
    sent = mapper.probes / max(1, mapper.rounds) / fabric.hosts / fabric.planes
    return (min(named) - fault_at if named else math.nan), flagged == faulty, sent


def _row(sim: Sim, size: Size, interval_ms: float) -> Row:
    fabric = size.fabric
    interval = interval_ms / 1e3
    at = (WARMUP_ROUNDS + 0.5) * interval
    last = fabric.t1_per_plane - 1
    link = f"p{fabric.planes - 1}:t0b-t1{letters(last)}"
    down, exact, sent = _named(
        sim, fabric, interval, DOWN_ROUNDS, {link}, link_failures=(LinkFailure(link, at),)
    )
    switch = f"p0-t1{letters(last // 2)}"
    t1_links = {f"p0:t0{letters(r)}-t1{letters(last // 2)}" for r in range(fabric.racks)}
    t1, exact_t1, _ = _named(
        sim, fabric, interval, DOWN_ROUNDS, t1_links,
        switch_failures=(SwitchFailure(switch, at),),
    )  # fmt: skip
    gray, exact_gray = math.nan, True
    if size.gray:
        lossy = f"p0:t0a-t1{letters(last)}"
        gray, exact_gray, _ = _named(
            sim, fabric, interval, GRAY_ROUNDS, {lossy},
            seed=sim.seed + intervals(sim).index(interval_ms),  # other draws, each interval
            loss_changes=(LossChange(at, LOSS, lossy),),
        )  # fmt: skip
    return Row(
        size.name,
        fabric.hosts,
        fabric.planes,
        len(addrplan.fabric_links(fabric)),
        interval_ms,
        down * 1e3,
        t1 * 1e3,
        gray * 1e3,
        probe_cost(make_plan(fabric), interval).host_packets_per_s,
        sent,
        exact and exact_t1 and exact_gray,
        size.gray,
    )


def claims(rows: list[Row]) -> list[Claim]:
    downs = [v / r.interval_ms for r in rows for v in (r.down_ms, r.t1_ms)]
    worst_down = math.nan if any(math.isnan(v) for v in downs) else max(downs)  # NaN: unnamed
    grays = [r.gray_ms / r.interval_ms for r in rows if r.gray_run]
    per_plane = [r.sent_per_plane for r in rows]
    largest = max(r.hosts for r in rows)
    return [
        Claim(
            f"a dead link or T1 is named within this many probe intervals, at every interval "
            f"and every fabric size up to {largest} hosts",
            worst_down,
            6,
            Op.AT_MOST,
            credits=Mechanism.MAPPER,
        ),
        Claim(
            "a link losing 2% is named within this many probe intervals (500: 5 s at the "
            "testbed's 10 ms), at every size it was run",
            math.nan if not grays or any(math.isnan(g) for g in grays) else max(grays),
            500,
            Op.AT_MOST,
            credits=Mechanism.MAPPER,
        ),
        Claim(
            "share of the runs that named exactly the faulty links and nothing else",
            sum(r.exact for r in rows) / len(rows),
            1.0,
            credits=Mechanism.MAPPER,
        ),
        Claim(
            f"probes a host sent per plane and round, the most over the fewest, 8 to "
            f"{largest} hosts (a host probes its own T0's links only)",
            max(per_plane) / min(per_plane),
            1.5,
            Op.AT_MOST,
            credits=Mechanism.MAPPER,
        ),
    ]


def _tables(sim: Sim, rows: list[Row]) -> list[Table]:
    def cell(name: str, ms: float, field: str) -> float | None:
        value = next(getattr(r, field) for r in rows if r.size == name and r.interval_ms == ms)
        return None if math.isnan(value) else round(value, 3)

    names = [s.name for s in sizes(sim)]
    grays = [s.name for s in sizes(sim) if s.gray]
    return [
        Table(
            "localization",
            ("size", "hosts", "planes", "links", "interval_ms", "down_ms", "t1_ms", "gray_ms",
             "probes_per_host_s", "sent_per_plane_round", "exact"),
            tuple(
                (r.size, r.hosts, r.planes, r.links, r.interval_ms, round(r.down_ms, 3),
                 round(r.t1_ms, 3), None if math.isnan(r.gray_ms) else round(r.gray_ms, 3),
                 round(r.probes_per_host_s), round(r.sent_per_plane, 2), r.exact)
                for r in rows
            ),
        ),
        Table(
            "by_interval",
            ("interval_ms", *(f"{n} down" for n in names), *(f"{n} 2% loss" for n in grays)),
            tuple(
                (ms, *(cell(n, ms, "down_ms") for n in names),
                 *(cell(n, ms, "gray_ms") for n in grays))
                for ms in intervals(sim)
            ),
        ),
    ]  # fmt: skip


def figure(sim: Sim) -> Outcome:
    rows = [_row(sim, size, ms) for size in sizes(sim) for ms in intervals(sim)]
    tables = _tables(sim, rows)
    columns = tables[1].columns
    down = [c for c in columns if c.endswith("down")]
    gray = [c for c in columns if c.endswith("loss")]
    outcome = Outcome(
        {
            "fabrics": {
                s.name: f"{s.fabric.planes} planes x {s.fabric.t1_per_plane} T1, "
                f"{s.fabric.racks} racks x {s.fabric.hosts_per_rack} hosts"
                for s in sizes(sim)
            },
            "intervals_ms": list(intervals(sim)),
            "mapper": "down after 3 lost probes, a probe lost after 2 intervals; lossy: loss "
            "per crossing above 0.5% with 99% confidence; windows of 100, 250, 500 rounds",
            "faults": "a T0-T1 link down, a T1 failed, a T0-T1 link losing 2% both ways",
        },
        tables=tables,
        claims=claims(rows),
    )
    outcome.plots = [
        Plot(
            "down",
            "time to name a dead link",
            lines(
                "by_interval",
                "interval_ms",
                down,
                xlabel="probe interval (ms)",
                ylabel="dead link named after (ms)",
                title="The mapper: a dead T0-T1 link, by fabric size (the sizes coincide)",
            ),
        ),
        Plot(
            "gray",
            "time to name a link losing 2%",
            lines(
                "by_interval",
                "interval_ms",
                gray,
                xlabel="probe interval (ms)",
                ylabel="2%-loss link named after (ms)",
                title="The mapper: a link losing 2%, by fabric size",
            ),
        ),
    ]
    outcome.notes.append(
        "A host's share of the plan is its short loops and the hairpins of its own T0 (two "
        "hosts per T0-T1 link): it grows with the T1s per plane, not with the hosts."
    )
    return outcome


EXPERIMENT = simulated(
    "mapper-localization",
    "Section Clustermapper",
    "the fabric mapper names dead and lossy links against probe interval and fabric size",
    figure,
    mechanisms=(Mechanism.MAPPER,),
)
