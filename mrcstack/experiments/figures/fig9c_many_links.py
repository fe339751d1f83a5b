"""Fig 9c in the simulator: many T0-T1 links go down one after another and stay down.

The paper takes 20 T0-T1 links down 1 s apart in a large fabric; here 8 of the 32 T0-T1
links of a 4-plane x 4-T1 fabric go down 0.25 ms apart and stay down (two per plane, on
different T1s, so each plane keeps two whole T1 paths and the uplinks still carry the whole
demand: what a large fabric's spare paths give).
"""

from __future__ import annotations

from dataclasses import dataclass

from mrcstack.experiments import goodput
from mrcstack.experiments.base import Claim, Outcome
from mrcstack.experiments.simruns import Sim, params, simulated
from mrcstack.fabric import Fabric
from mrcstack.sim import LinkFailure

FABRIC = Fabric()
PAIRS = ((0, 2), (1, 3), (2, 0), (3, 1))
START_S, GAP_S = 1.0e-3, 0.25e-3
LINKS = [
    link
    for plane in range(FABRIC.planes)
    for link in (f"p{plane}:t0a-t1{'abcd'[plane]}", f"p{plane}:t0b-t1{'abcd'[(plane + 1) % 4]}")
]
LAST_S = START_S + (len(LINKS) - 1) * GAP_S  # when the last link goes down
PARAMS = params(
    "4 planes x 4 T1, 2 racks x 2 hosts",
    {
        "flows": "4 cross-rack flows (a permutation)",
        "faults": f"{len(LINKS)} T0-T1 links down {GAP_S * 1e3:g} ms apart from "
        f"{START_S * 1e3:g} ms, for good (paper: 20 links, 1 s apart)",
    },
)


@dataclass(frozen=True, slots=True)
class _Kept:
    """Goodput over the pre-fault goodput: each mode's after the last link went down, and
    MRC's worst 0.2 ms while they went down."""

    after: dict[str, float]
    mrc_worst: float


def _runs(sim: Sim, duration_s: float) -> goodput.FaultRuns:
    failures = tuple(LinkFailure(link, START_S + i * GAP_S) for i, link in enumerate(LINKS))
    return goodput.fault_runs(sim, FABRIC, PAIRS, duration_s, link_failures=failures)


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
        ),
        Claim("MRC's worst 0.2 ms while links went down, over pre-fault", kept.mrc_worst, 0.6),
        Claim("MRC's fraction kept minus RoCE mode's", kept.after["mrc"] - kept.after["roce"], 0.0),
    ]


def figure(sim: Sim) -> Outcome:
    faults = _runs(sim, sim.size(6, 12) * 1e-3)
    outcome = goodput.outcome(
        faults,
        PARAMS,
        ylabel="goodput (Gbit/s, all flows)",
        title=f"Fig 9c: {len(LINKS)} T0-T1 links go down one by one",
        marks=[((START_S + i * GAP_S) * 1e3, link) for i, link in enumerate(LINKS)],
    )
    outcome.claims = _claims(_kept(faults))
    return outcome


EXPERIMENT = simulated(
    "fig9c-many-links",
    "Fig 9c",
    "8 T0-T1 links go down one by one and stay down (time-scaled)",
    figure,
)
