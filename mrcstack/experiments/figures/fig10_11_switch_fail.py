"""Figs 10-11 in the simulator: a T0 fails; a T1 fails and returns.

Permutation traffic across the two racks (every host sends to one host of the other rack
and receives from another).  A T0 failure takes one plane away from its rack's hosts, whose
NIC ports lose link: the steady state drops by that plane's share.  A T1 failure takes 1/16
of the paths: nothing is lost for long.  The T1 that fails is the one RoCE mode's flows
load most (a dry run finds it, each seed its own), so the baseline is hurt.
"""

from __future__ import annotations

from dataclasses import dataclass

from mrcstack.experiments import goodput
from mrcstack.experiments.base import Claim, Mechanism, Op, Outcome
from mrcstack.experiments.simruns import Sim, params, simulated
from mrcstack.fabric import Fabric
from mrcstack.sim import SwitchFailure

FABRIC = Fabric()
PAIRS = ((0, 2), (1, 3), (2, 0), (3, 1))
FAIL_S, BACK_S = 1.5e-3, 3.5e-3
FAILED_T0 = "p1-t0a"
MARGIN = 0.1


@dataclass(frozen=True, slots=True)
class _Runs:
    t0: goodput.FaultRuns  # the T0 fails for good
    t1: goodput.FaultRuns  # the T1 fails and returns
    failed_t1: str


@dataclass(frozen=True, slots=True)
class _Kept:
    """Goodput over the pre-failure goodput (after the T1 returned: over the capacity),
    per mode."""

    t0_after: dict[str, float]  # 1-2 ms after the T0 failed
    t1_during: dict[str, float]  # while the T1 is down
    t1_after: dict[str, float]  # 0.5-1.5 ms after it returned, over the capacity


def _runs(sim: Sim, duration_s: float, seed: int) -> _Runs:
    t1 = goodput.busiest_t1(sim, FABRIC, PAIRS, seed)
    return _Runs(
        t0=goodput.fault_runs(
            sim, FABRIC, PAIRS, duration_s, seed=seed,
            switch_failures=(SwitchFailure(FAILED_T0, FAIL_S),),
        ),
        t1=goodput.fault_runs(
            sim, FABRIC, PAIRS, duration_s, seed=seed,
            switch_failures=(SwitchFailure(t1, FAIL_S, BACK_S),),
        ),
        failed_t1=t1,
    )  # fmt: skip


def _ratio(run: goodput.Run, start_s: float, end_s: float) -> float:
    return goodput.span(run.gbps, start_s, end_s) / goodput.span(run.gbps, 0.5e-3, FAIL_S)


def _kept(runs: _Runs) -> _Kept:
    cap = runs.t1.capacity_gbps
    return _Kept(
        t0_after={m: _ratio(r, FAIL_S + 1e-3, FAIL_S + 2e-3) for m, r in runs.t0.runs.items()},
        t1_during={m: _ratio(r, FAIL_S + 0.3e-3, BACK_S) for m, r in runs.t1.runs.items()},
        t1_after={
            m: goodput.span(r.gbps, BACK_S + 0.5e-3, BACK_S + 1.5e-3) / cap
            for m, r in runs.t1.runs.items()
        },
    )


def _claims(kept: _Kept) -> list[Claim]:
    return [
        Claim(
            "MRC's steady state after a T0 fails, over before: every flow loses one plane "
            "of four at one end (the paper: one plane's share)",
            kept.t0_after["mrc"],
            0.75,
            Op.WITHIN,
            tolerance=0.1,
            credits=Mechanism.MRC,
        ),
        Claim(
            "MRC's goodput while a T1 is down, over before",
            kept.t1_during["mrc"],
            0.9,
            credits=Mechanism.MRC,
        ),
        Claim(
            "MRC's goodput after the T1 returns, over the flows' capacity",
            kept.t1_after["mrc"],
            0.9,
            credits=Mechanism.MRC,
        ),
        Claim(
            f"MRC's fraction kept while the T1 is down minus RoCE mode's (by at least {MARGIN})",
            kept.t1_during["mrc"] - kept.t1_during["roce"],
            MARGIN,
            credits=Mechanism.MRC,
        ),
    ]


def _side_by_side(runs: _Runs) -> goodput.FaultRuns:
    """Both failures' runs in one figure, each named after its failure and mode."""
    named = {f"T0 fails, {m}": r for m, r in runs.t0.runs.items()}
    named |= {f"T1 fails and returns, {m}": r for m, r in runs.t1.runs.items()}
    return goodput.FaultRuns(runs.t0.duration_s, named, runs.t0.capacity_gbps)


def figure(sim: Sim) -> Outcome:
    duration_s = sim.size(6, 12) * 1e-3
    seeds = sim.seeds(2, 4)
    per_seed = [_runs(sim, duration_s, seed) for seed in seeds]
    runs = per_seed[0]
    outcome = goodput.outcome(
        _side_by_side(runs),
        params(
            "4 planes x 4 T1, 2 racks x 2 hosts",
            {
                "flows": f"{len(PAIRS)} cross-rack flows (a permutation)",
                "faults": f"T0 {FAILED_T0} fails at 1.5 ms for good; the T1 RoCE mode's flows "
                "load most fails at 1.5 ms and returns at 3.5 ms (separate runs): "
                + ", ".join(
                    f"seed {s}: {r.failed_t1}" for s, r in zip(seeds, per_seed, strict=True)
                ),
                "seeds": seeds,
            },
        ),
        ylabel="goodput (Gbit/s, all flows)",
        title="Figs 10-11: a T0 fails; a T1 fails and returns",
        marks=[(FAIL_S * 1e3, "switch fails"), (BACK_S * 1e3, f"T1 {runs.failed_t1} returns")],
    )
    outcome.claims = goodput.pooled([_claims(_kept(r)) for r in per_seed])
    return outcome


EXPERIMENT = simulated(
    "fig10-11-switch-fail",
    "Figs 10-11",
    "a T0 fails (one plane's share lost), a T1 fails and returns (nothing lost)",
    figure,
)
