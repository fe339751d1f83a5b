"""Fig 9d on the testbed: a T1 switch fails (all its links down) under mrcd, TCP and MPTCP."""

from __future__ import annotations

from mrcstack.experiments.base import Outcome
from mrcstack.experiments.live import FaultCase
from mrcstack.experiments.testbedruns import on_testbed, testbed_figure

FAILED_T1 = "p0-t1b"
CASE = FaultCase(
    "t1_fail", f"T1 {FAILED_T1} fails (all its links down)", lambda f: f.switch_fail(FAILED_T1)
)


def figure(profile: str, seed: int) -> Outcome:
    return testbed_figure(
        profile,
        CASE,
        "ex9d",
        title="Fig 9d on the testbed: a T1 switch fails",
        marks=[(0.0, f"{FAILED_T1} fails")],
        what="after the switch fails",
    )


EXPERIMENT = on_testbed(
    "fig9d-testbed",
    "Fig 9d",
    "a T1 switch fails under mrcd, TCP and MPTCP (shaped testbed)",
    figure,
)
