"""Fig 20 in the simulator: permutation traffic.  MRC sprays every flow over all paths and
reaches most of the capacity; one ECMP path per flow collides."""

from __future__ import annotations

import random

from mrcstack.experiments.analysis import mean
from mrcstack.experiments.base import Claim, Mechanism, Outcome, Plot, Table
from mrcstack.experiments.plots import bars
from mrcstack.experiments.simruns import MODE_LABELS, MODES, Sim, params, simulated
from mrcstack.fabric import Fabric

FABRIC = Fabric(racks=4, hosts_per_rack=2, t1_per_plane=8)

Pairs = tuple[tuple[int, int], ...]


def _permutations(seed: int, trials: int) -> list[Pairs]:
    """Random permutations with every host sending to another rack."""
    rng = random.Random(seed)
    out = []
    for _ in range(trials):
        hosts = list(range(FABRIC.hosts))
        while True:
            rng.shuffle(hosts)
            if all(FABRIC.rack_of(s) != FABRIC.rack_of(d) for s, d in enumerate(hosts)):
                break
        out.append(tuple(enumerate(hosts)))
    return out


def _runs(sim: Sim, trials: int, per: int) -> list[tuple[int, str, float]]:
    """(trial, mode, goodput as a fraction of capacity) of every run."""
    rows = []
    for trial, pairs in enumerate(_permutations(sim.seed, trials)):
        for mode in MODES:
            cfg = sim.config(
                FABRIC,
                pairs=pairs,
                bytes_per_flow=per,
                mode=mode,
                seed=sim.seed + trial,
                max_sim_time_s=2.0,
            )
            rows.append((trial, mode, sim.run(cfg).to_json()["goodput_fraction"]))
    return rows


def _claims(fraction: dict[str, float]) -> list[Claim]:
    return [
        Claim(
            "MRC's goodput as a fraction of capacity (the paper: full rate for all)",
            fraction["mrc"],
            0.85,
            credits=Mechanism.MRC,
        ),
        Claim(
            "MRC over RoCE mode (the paper: colliding flows get 1/2 or 1/3 of the rate)",
            fraction["mrc"] / fraction["roce"],
            1.5,
            credits=Mechanism.MRC,
        ),
    ]


PLOT = Plot(
    "goodput",
    "goodput",
    bars(
        "mean",
        "mode",
        ["goodput_fraction"],
        ylabel="goodput / capacity",
        title="Fig 20: permutation traffic, spraying against one ECMP path per flow",
        capacity=(1.0, "capacity"),
    ),
)


def figure(sim: Sim) -> Outcome:
    per = sim.size(4, 16) << 20
    trials = sim.size(3, 10)
    rows = _runs(sim, trials, per)
    fraction = {m: mean([f for _, mode, f in rows if mode == m]) for m in MODES}
    return Outcome(
        params=params(
            "4 planes x 8 T1, 4 racks x 2 hosts",
            {
                "bytes_per_flow": per,
                "trials": trials,
            },
        ),
        tables=[
            Table("goodput", ("trial", "mode", "goodput_fraction"), tuple(rows)),
            Table(
                "mean",
                ("mode", "goodput_fraction"),
                tuple((MODE_LABELS[m], f) for m, f in fraction.items()),
            ),
        ],
        plots=[PLOT],
        claims=_claims(fraction),
        notes=[f"RoCE mode reaches {fraction['roce']:.2f} of the capacity (ECMP collisions)."],
    )


EXPERIMENT = simulated(
    "fig20-permutation",
    "Fig 20",
    "permutation traffic: spraying against one ECMP path per flow",
    figure,
)
