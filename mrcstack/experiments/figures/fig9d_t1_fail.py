"""Fig 9d in the simulator: a T1 switch fails under four cross-rack flows.  MRC loses only
the failed T1's share of its paths; RoCE mode's flows hashed through it stall.

The T1 that fails is the one RoCE mode's flows load most (a dry run finds it): the paper's
figure is about the flows that crossed the failed switch.  Each seed places its own."""

from __future__ import annotations

from dataclasses import dataclass

from mrcstack.experiments import goodput
from mrcstack.experiments.base import Claim, Mechanism, Op, Outcome
from mrcstack.experiments.simruns import Sim, params, simulated
from mrcstack.fabric import Fabric
from mrcstack.sim import SwitchFailure

FABRIC = Fabric()
PAIRS = ((0, 2), (1, 3), (2, 0), (3, 1))
FAIL_S = 1.5e-3
MARGIN = 0.2


@dataclass(frozen=True, slots=True)
class _Figures:
    kept: dict[str, float]  # goodput 1-2 ms after the failure over before, per mode
    failed: dict[str, int]  # flows that failed, per mode


def _runs(sim: Sim, duration_s: float, seed: int) -> tuple[goodput.FaultRuns, str]:
    switch = goodput.busiest_t1(sim, FABRIC, PAIRS, seed)
    failure = SwitchFailure(switch, FAIL_S)
    faults = goodput.fault_runs(
        sim, FABRIC, PAIRS, duration_s, seed=seed, switch_failures=(failure,)
    )
    return faults, switch


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
            credits=Mechanism.MRC,
        ),
        Claim(
            f"MRC's fraction kept minus RoCE mode's (its flows through the failed T1 stall; "
            f"by at least {MARGIN})",
            figures.kept["mrc"] - figures.kept["roce"],
            MARGIN,
            credits=Mechanism.MRC,
        ),
        Claim("MRC flows failed", figures.failed["mrc"], 0, Op.AT_MOST, credits=Mechanism.MRC),
    ]


def figure(sim: Sim) -> Outcome:
    duration_s = sim.size(5, 10) * 1e-3
    seeds = sim.seeds(2, 4)
    per_seed = [_runs(sim, duration_s, seed) for seed in seeds]
    faults, switch = per_seed[0]
    outcome = goodput.outcome(
        faults,
        params(
            "4 planes x 4 T1, 2 racks x 2 hosts",
            {
                "flows": "4 cross-rack flows",
                "fault": "the T1 RoCE mode's flows load most fails at 1.5 ms: "
                + ", ".join(
                    f"seed {seed}: {t1}" for seed, (_, t1) in zip(seeds, per_seed, strict=True)
                ),
                "seeds": seeds,
            },
        ),
        ylabel="goodput (Gbit/s, all flows)",
        title="Fig 9d: a T1 switch fails",
        marks=[(FAIL_S * 1e3, f"T1 {switch} fails")],
    )
    outcome.claims = goodput.pooled([_claims(_figures(f)) for f, _ in per_seed])
    return outcome


EXPERIMENT = simulated("fig9d-t1-fail", "Fig 9d", "a T1 switch fails under traffic", figure)
