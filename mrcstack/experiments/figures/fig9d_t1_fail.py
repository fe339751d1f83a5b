"""Fig 9d in the simulator: a T1 switch fails under four cross-rack flows.  MRC loses only
the failed T1's share of its paths; RoCE mode's flows hashed through it stall."""

from __future__ import annotations

from dataclasses import dataclass

from mrcstack.experiments import goodput
from mrcstack.experiments.base import Claim, Op, Outcome
from mrcstack.experiments.simruns import Sim, params, simulated
from mrcstack.fabric import Fabric
from mrcstack.sim import SwitchFailure

FABRIC = Fabric()
PAIRS = ((0, 2), (1, 3), (2, 0), (3, 1))
FAIL_S = 1.5e-3
#: The T1 to fail when the dry run loaded none.
DEFAULT_T1 = "p1-t1b"


@dataclass(frozen=True, slots=True)
class _Figures:
    kept: dict[str, float]  # goodput 1-2 ms after the failure over before, per mode
    failed: dict[str, int]  # flows that failed, per mode


def _busiest_t1(sim: Sim) -> str:
    """The T1 that RoCE mode's ECMP hashing loads most (a short dry run): the paper's figure
    is about the flows that crossed the failed switch."""
    dry = sim.run(sim.config(FABRIC, pairs=PAIRS, bytes_per_flow=1 << 20, mode="roce"))
    load: dict[str, int] = {}
    for link, st in dry.to_json()["links"].items():  # "p3:t0a-t1c": plane 3, T0 a to T1 c
        plane, _, ends = link.partition(":")
        for end in ends.split("-"):
            if end.startswith("t1"):
                load[f"{plane}-{end}"] = load.get(f"{plane}-{end}", 0) + int(st["bytes"])
    return max(sorted(load), key=lambda k: load[k]) if load else DEFAULT_T1


def _runs(sim: Sim, switch: str, duration_s: float) -> goodput.FaultRuns:
    failure = SwitchFailure(switch, FAIL_S)
    return goodput.fault_runs(sim, FABRIC, PAIRS, duration_s, switch_failures=(failure,))


def _figures(faults: goodput.FaultRuns) -> _Figures:
    runs = faults.runs
    pre = {m: goodput.span(r.gbps, 0.5e-3, FAIL_S) for m, r in runs.items()}
    return _Figures(
        kept={
            m: goodput.span(r.gbps, FAIL_S + 1e-3, FAIL_S + 2e-3) / pre[m] for m, r in runs.items()
        },
        failed={m: sum(1 for f in r.doc["flows"] if f["failed"]) for m, r in runs.items()},
    )


def _claims(figures: _Figures) -> list[Claim]:
    return [
        Claim(
            "MRC keeps this fraction of its pre-failure goodput 1-2 ms after a T1 fails "
            "(a T1 is 1/16 of the paths)",
            figures.kept["mrc"],
            0.85,
        ),
        Claim(
            "RoCE mode keeps (its flows through the failed T1 stall)",
            figures.kept["roce"],
            0.9,
            Op.AT_MOST,
        ),
        Claim("MRC flows failed", figures.failed["mrc"], 0, Op.AT_MOST),
    ]


def figure(sim: Sim) -> Outcome:
    switch = _busiest_t1(sim)
    faults = _runs(sim, switch, sim.size(5, 10) * 1e-3)
    outcome = goodput.outcome(
        faults,
        params(
            "4 planes x 4 T1, 2 racks x 2 hosts",
            {"flows": "4 cross-rack flows", "fault": f"T1 {switch} fails at 1.5 ms"},
        ),
        ylabel="goodput (Gbit/s, all flows)",
        title="Fig 9d: a T1 switch fails",
        marks=[(FAIL_S * 1e3, f"T1 {switch} fails")],
    )
    outcome.claims = _claims(_figures(faults))
    return outcome


EXPERIMENT = simulated("fig9d-t1-fail", "Fig 9d", "a T1 switch fails under traffic", figure)
