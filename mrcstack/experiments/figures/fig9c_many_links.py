"""Fig 9c in the simulator: many T0-T1 links go down one after another and stay down.

The paper takes 20 T0-T1 links down 1 s apart in a large fabric; here 8 of the 32 T0-T1
links of a 4-plane x 4-T1 fabric go down 0.25 ms apart and stay down: two per plane, on
different T1s, so each plane keeps two whole T1 paths and the uplinks still carry the whole
demand (what a large fabric's spare paths give).  The links chosen first are the ones RoCE
mode's flows cross (a dry run finds them), so the baseline is hurt; each seed places its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from mrcstack.experiments import goodput
from mrcstack.experiments.base import Claim, Mechanism, Outcome
from mrcstack.experiments.simruns import Sim, params, simulated
from mrcstack.fabric import Fabric
from mrcstack.sim import LinkFailure

FABRIC = Fabric()
PAIRS = ((0, 2), (1, 3), (2, 0), (3, 1))
START_S, GAP_S = 1.0e-3, 0.25e-3
PER_PLANE = 2
#: Each plane's links when RoCE mode's flows cross none of it: T0 a to one T1, T0 b to the next.
DEFAULT = [
    (f"p{plane}:t0a-t1{'abcd'[plane]}", f"p{plane}:t0b-t1{'abcd'[(plane + 1) % 4]}")
    for plane in range(FABRIC.planes)
]
LAST_S = START_S + (PER_PLANE * FABRIC.planes - 1) * GAP_S  # when the last link goes down
MARGIN = 0.2
PARAMS = {
    "flows": "4 cross-rack flows (a permutation)",
    "faults": f"{PER_PLANE * FABRIC.planes} T0-T1 links down {GAP_S * 1e3:g} ms apart from "
    f"{START_S * 1e3:g} ms, for good, RoCE mode's first (paper: 20 links, 1 s apart)",
}


@dataclass(frozen=True, slots=True)
class _Kept:
    """Goodput over the pre-fault goodput: each mode's after the last link went down, and
    MRC's worst 0.2 ms while they went down."""

    after: dict[str, float]
    mrc_worst: float


def _t1(link: str) -> str:
    return next(end for end in link.split(":")[1].split("-") if end.startswith("t1"))


def links(sim: Sim, seed: int) -> list[str]:
    """Two links per plane on different T1s, those RoCE mode's flows cross first."""
    load = goodput.roce_load(sim, FABRIC, PAIRS, seed)
    crossed = list(
        dict.fromkeys(goodput.physical(k) for k in goodput.busiest(load, lambda k: "t1" in k))
    )
    out = []
    for plane in range(FABRIC.planes):
        chosen: list[str] = []
        for link in [c for c in crossed if c.startswith(f"p{plane}:")] + list(DEFAULT[plane]):
            if len(chosen) < PER_PLANE and all(_t1(link) != _t1(c) for c in chosen):
                chosen.append(link)
        out += chosen
    return out


def _runs(sim: Sim, duration_s: float, seed: int) -> tuple[goodput.FaultRuns, list[str]]:
    down = links(sim, seed)
    failures = tuple(LinkFailure(link, START_S + i * GAP_S) for i, link in enumerate(down))
    return goodput.fault_runs(
        sim, FABRIC, PAIRS, duration_s, seed=seed, link_failures=failures
    ), down


def _kept(faults: goodput.FaultRuns) -> _Kept:
    runs = faults.runs
    pre = {m: goodput.span(r.gbps, 0.3e-3, START_S) for m, r in runs.items()}
    after = {
        m: goodput.span(r.gbps, LAST_S + 0.5e-3, LAST_S + 2e-3) / pre[m] for m, r in runs.items()
    }
    return _Kept(after, goodput.worst(runs["mrc"].gbps, START_S, LAST_S + 0.5e-3) / pre["mrc"])


def _claims(kept: _Kept) -> list[Claim]:
    return [
        Claim(
            "MRC's goodput after the last link went down, over its pre-fault goodput",
            kept.after["mrc"],
            0.85,
            credits=Mechanism.MRC,
        ),
        Claim(
            "MRC's worst 0.2 ms while links went down, over pre-fault",
            kept.mrc_worst,
            0.6,
            credits=Mechanism.MRC,
        ),
        Claim(
            f"MRC's fraction kept minus RoCE mode's (by at least {MARGIN})",
            kept.after["mrc"] - kept.after["roce"],
            MARGIN,
            credits=Mechanism.MRC,
        ),
    ]


def figure(sim: Sim) -> Outcome:
    duration_s = sim.size(6, 12) * 1e-3
    seeds = sim.seeds(2, 4)
    per_seed = [_runs(sim, duration_s, seed) for seed in seeds]
    faults, down = per_seed[0]
    outcome = goodput.outcome(
        faults,
        params(
            "4 planes x 4 T1, 2 racks x 2 hosts",
            {**PARAMS, "seeds": seeds, "plotted": f"seed {seeds[0]}"},
        ),
        ylabel="goodput (Gbit/s, all flows)",
        title=f"Fig 9c: {len(down)} T0-T1 links go down one by one",
        marks=[((START_S + i * GAP_S) * 1e3, link) for i, link in enumerate(down)],
    )
    outcome.claims = goodput.pooled([_claims(_kept(f)) for f, _ in per_seed])
    return outcome


EXPERIMENT = simulated(
    "fig9c-many-links",
    "Fig 9c",
    "8 T0-T1 links go down one by one and stay down (time-scaled)",
    figure,
)
