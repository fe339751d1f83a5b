"""Fig 9a in the simulator: four T0-T1 links flap in turn under two flows.  MRC moves off
each dead link and keeps most of its goodput; RoCE mode's flow on a dead link stalls.

The flapping links are the ones RoCE mode's flows cross (a dry run finds them), so the
baseline is hurt by every flap, whatever its hash; each seed places its own."""

from __future__ import annotations

from mrcstack.experiments import goodput
from mrcstack.experiments.base import Claim, Mechanism, Outcome
from mrcstack.experiments.simruns import Sim, params, simulated
from mrcstack.fabric import Fabric
from mrcstack.sim import LinkFailure

FABRIC = Fabric()
PAIRS = ((0, 2), (1, 3))
#: When each link goes down (ms); each stays down DOWN_S.
TIMES_MS = (1.0, 2.0, 3.0, 4.0)
DOWN_S = 0.5e-3
#: Links to flap where RoCE mode's flows cross fewer than four T0-T1 links.
SPARE = ("p0:t0a-t1a", "p1:t0a-t1b", "p2:t0b-t1c", "p3:t0b-t1d")
MARGIN = 0.2


def flaps(sim: Sim, seed: int) -> list[tuple[str, float]]:
    """(link, down at ms): the T0-T1 links RoCE mode's flows cross, most loaded first."""
    load = goodput.roce_load(sim, FABRIC, PAIRS, seed)
    links = list(
        dict.fromkeys(goodput.physical(k) for k in goodput.busiest(load, lambda k: "t1" in k))
    )
    links += [s for s in SPARE if s not in links]
    return list(zip(links, TIMES_MS, strict=False))


def _runs(
    sim: Sim, duration_s: float, seed: int
) -> tuple[goodput.FaultRuns, list[tuple[str, float]]]:
    placed = flaps(sim, seed)
    failures = tuple(LinkFailure(link, t * 1e-3, t * 1e-3 + DOWN_S) for link, t in placed)
    faults = goodput.fault_runs(sim, FABRIC, PAIRS, duration_s, seed=seed, link_failures=failures)
    return faults, placed


def _worst_kept(faults: goodput.FaultRuns) -> dict[str, float]:
    """Each mode's worst 0.2 ms during the flaps over its goodput before them."""
    runs = faults.runs
    pre = {m: goodput.span(r.gbps, 0.3e-3, 1e-3) for m, r in runs.items()}
    end = TIMES_MS[-1] * 1e-3 + DOWN_S
    return {m: goodput.worst(r.gbps, 1e-3, end) / pre[m] for m, r in runs.items()}


def _claims(worst_kept: dict[str, float]) -> list[Claim]:
    return [
        Claim(
            "MRC's worst 0.2 ms during the flaps, as a fraction of its pre-flap goodput",
            worst_kept["mrc"],
            0.75,
            credits=Mechanism.MRC,
        ),
        Claim(
            f"MRC's worst moment minus RoCE mode's (a flow on a dead link stalls; by at "
            f"least {MARGIN})",
            worst_kept["mrc"] - worst_kept["roce"],
            MARGIN,
            credits=Mechanism.MRC,
        ),
    ]


def figure(sim: Sim) -> Outcome:
    duration_s = sim.size(6, 12) * 1e-3
    seeds = sim.seeds(2, 4)
    per_seed = [_runs(sim, duration_s, seed) for seed in seeds]
    faults, placed = per_seed[0]
    outcome = goodput.outcome(
        faults,
        params(
            "4 planes x 4 T1, 2 racks x 2 hosts",
            {
                "flows": "h0->h2, h1->h3",
                "flaps": f"{len(TIMES_MS)} T0-T1 links on RoCE mode's paths, 0.5 ms each",
                "seeds": seeds,
                "plotted": f"seed {seeds[0]}: " + ", ".join(link for link, _ in placed),
                "bin_ms": goodput.BIN_S * 1e3,
            },
        ),
        ylabel="goodput (Gbit/s, both flows)",
        title="Fig 9a: T0-T1 link flaps",
        spans=[(t, t + DOWN_S * 1e3, link) for link, t in placed],
    )
    outcome.claims = goodput.pooled([_claims(_worst_kept(f)) for f, _ in per_seed])
    return outcome


EXPERIMENT = simulated(
    "fig9a-link-flaps", "Fig 9a", "goodput over time while T0-T1 links flap", figure
)
