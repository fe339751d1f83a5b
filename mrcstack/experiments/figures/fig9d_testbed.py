"""Fig 9d on the testbed: a T1 switch fails (all its links down) under mrcd, TCP and MPTCP:
the T1 that TCP's path, and MPTCP's plane-0 subflow, cross."""

from __future__ import annotations

from mrcstack.experiments.base import Mechanism, Outcome
from mrcstack.experiments.live import FaultCase
from mrcstack.experiments.testbedruns import Paths, Placed, on_testbed, testbed_figure
from mrcstack.fabric import Fabric


def place(paths: Paths) -> Placed:
    t1 = Fabric.t1_name(0, paths[0])
    case = FaultCase("t1_fail", f"T1 {t1} fails (all its links down)", lambda f: f.switch_fail(t1))
    return Placed(case, ((0.0, f"{t1} fails"),), (0, paths[0]))


def figure(profile: str, seed: int, sabotage: Mechanism | None = None) -> Outcome:
    return testbed_figure(
        profile,
        place,
        "ex9d",
        sabotage,
        title="Fig 9d on the testbed: a T1 switch fails",
        what="after the switch fails",
    )


EXPERIMENT = on_testbed(
    "fig9d-testbed",
    "Fig 9d",
    "the T1 on the baselines' path fails under mrcd, TCP and MPTCP (shaped testbed)",
    figure,
)
