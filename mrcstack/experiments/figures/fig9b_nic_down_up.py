"""Fig 9b in the simulator: with 8 planes, a host's NIC ports of 4 planes go down, then up.
Goodput halves while they are down and comes back when they return.

Goodput is stated against the NIC's capacity (8 planes): half of it is left while the ports
are down, and one path per flow (RoCE mode) could never carry more than an eighth."""

from __future__ import annotations

from dataclasses import dataclass

from mrcstack.experiments import goodput
from mrcstack.experiments.base import Claim, Mechanism, Op, Outcome
from mrcstack.experiments.simruns import Sim, capacity_gbps, params, simulated
from mrcstack.fabric import Fabric
from mrcstack.sim import NicDown

FABRIC = Fabric(planes=8, t1_per_plane=2)
DOWN_S, UP_S = 2e-3, 4e-3
PLANES_DOWN = range(4)  # h0's ports of these planes


PAIRS = ((0, 2),)
CAPACITY_GBPS = capacity_gbps(FABRIC, PAIRS)


@dataclass(frozen=True, slots=True)
class _Kept:
    """Goodput over the capacity: while the ports are down, and after they return."""

    during: float
    after: float


def _run(sim: Sim, duration_s: float) -> goodput.Run:
    nics = tuple(NicDown(0, plane, DOWN_S, UP_S) for plane in PLANES_DOWN)
    faults = goodput.fault_runs(sim, FABRIC, PAIRS, duration_s, modes=("mrc",), nic_downs=nics)
    return faults.runs["mrc"]


def _kept(gbps: list[float]) -> _Kept:
    return _Kept(
        during=goodput.span(gbps, DOWN_S + 0.3e-3, UP_S) / CAPACITY_GBPS,
        after=goodput.span(gbps, UP_S + 0.5e-3, UP_S + 1.5e-3) / CAPACITY_GBPS,
    )


def _claims(kept: _Kept) -> list[Claim]:
    return [
        Claim(
            "goodput with 4 of 8 ports down, over the NIC's capacity: about half (paper: "
            "settles at about half)",
            kept.during,
            0.5,
            Op.WITHIN,
            tolerance=0.2,
            credits=Mechanism.MRC,
        ),
        Claim(
            "goodput 0.5-1.5 ms after the ports come back, over the NIC's capacity",
            kept.after,
            0.90,
            credits=Mechanism.MRC,
        ),
    ]


def figure(sim: Sim) -> Outcome:
    run = _run(sim, sim.size(6, 12) * 1e-3)
    return Outcome(
        params=params(
            "8 planes x 2 T1",
            {
                "flow": "h0->h2",
                "fault": "h0's NICs of planes 0-3 down at 2 ms, up at 4 ms",
            },
        ),
        tables=[goodput.timeline("goodput", {"mrc": run.gbps})],
        plots=[
            goodput.plot(
                ["mrc"],
                ylabel="goodput (Gbit/s)",
                title="Fig 9b: 4 of 8 NIC ports down, then up",
                marks=[(DOWN_S * 1e3, "4 NICs down"), (UP_S * 1e3, "NICs up")],
                capacity_gbps=CAPACITY_GBPS,
                ends_ms={"mrc": run.end_ms},
            )
        ],
        claims=_claims(_kept(run.gbps)),
        notes=[f"flow verified: {run.doc['verified']}"],
    )


EXPERIMENT = simulated(
    "fig9b-nic-down-up",
    "Fig 9b",
    "with 8 planes and 4 NIC ports down, goodput halves and comes back",
    figure,
)
