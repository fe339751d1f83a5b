"""Fig 9a in the simulator: four T0-T1 links flap in turn under two flows.  MRC moves off
each dead link and keeps most of its goodput; RoCE mode's flow on a dead link stalls."""

from __future__ import annotations

from mrcstack.experiments import goodput
from mrcstack.experiments.base import Claim, Op, Outcome
from mrcstack.experiments.simruns import Sim, params, simulated
from mrcstack.fabric import Fabric
from mrcstack.sim import LinkFailure

FABRIC = Fabric()
PAIRS = ((0, 2), (1, 3))
#: (link, when it goes down in ms); each stays down DOWN_S.
FLAPS = (("p0:t0a-t1a", 1.0), ("p1:t0a-t1b", 2.0), ("p2:t0b-t1c", 3.0), ("p3:t0b-t1d", 4.0))
DOWN_S = 0.5e-3
PARAMS = params(
    "4 planes x 4 T1, 2 racks x 2 hosts",
    {
        "flows": "h0->h2, h1->h3",
        "flaps": f"{len(FLAPS)} T0-T1 links, 0.5 ms each",
        "bin_ms": goodput.BIN_S * 1e3,
    },
)


def _runs(sim: Sim, duration_s: float) -> goodput.FaultRuns:
    failures = tuple(LinkFailure(link, t * 1e-3, t * 1e-3 + DOWN_S) for link, t in FLAPS)
    return goodput.fault_runs(sim, FABRIC, PAIRS, duration_s, link_failures=failures)


def _worst_kept(faults: goodput.FaultRuns) -> dict[str, float]:
    """Each mode's worst 0.2 ms during the flaps over its goodput before them."""
    runs = faults.runs
    pre = {m: goodput.span(r.gbps, 0.3e-3, 1e-3) for m, r in runs.items()}
    return {m: goodput.worst(r.gbps, 1e-3, 4.5e-3 + DOWN_S) / pre[m] for m, r in runs.items()}


def _claims(worst_kept: dict[str, float]) -> list[Claim]:
    return [
        Claim(
            "MRC's worst 0.2 ms during the flaps, as a fraction of its pre-flap goodput",
            worst_kept["mrc"],
            0.75,
        ),
        Claim(
            "RoCE mode's worst 0.2 ms during the flaps (a flow on a dead link stalls)",
            worst_kept["roce"],
            0.75,
            Op.AT_MOST,
        ),
        Claim("MRC's worst moment minus RoCE mode's", worst_kept["mrc"] - worst_kept["roce"], 0.0),
    ]


def figure(sim: Sim) -> Outcome:
    faults = _runs(sim, sim.size(6, 12) * 1e-3)
    outcome = goodput.outcome(
        faults,
        PARAMS,
        ylabel="goodput (Gbit/s, both flows)",
        title="Fig 9a: T0-T1 link flaps",
        spans=[(t, t + DOWN_S * 1e3, link) for link, t in FLAPS],
    )
    outcome.claims = _claims(_worst_kept(faults))
    return outcome


EXPERIMENT = simulated(
    "fig9a-link-flaps", "Fig 9a", "goodput over time while T0-T1 links flap", figure
)
