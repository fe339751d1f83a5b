"""Fig 9b on the testbed: half the receiver's NIC ports go down, then up, under mrcd, TCP and
MPTCP.  Recovery counts from the end of the command that brings them back.

Goodput is stated against the four planes' capacity (800 Mbit/s), not the stack's own rate
before the fault: with its ports of two planes down, half of it is left, and one path
alone (mrcd without spraying) could carry at most a quarter."""

from __future__ import annotations

from collections.abc import Sequence

from mrcstack.experiments.analysis import mean, median
from mrcstack.experiments.base import Claim, Mechanism, Outcome
from mrcstack.experiments.live import FaultCase, Run
from mrcstack.experiments.testbedruns import (
    BIN_S,
    CAPACITY_MBPS,
    WINDOW_S,
    Figures,
    Paths,
    Placed,
    notes,
    on_testbed,
    outcome,
    testbed_runs,
)
from mrcstack.netns.faults import Faults

PORTS_DOWN = (2, 3)  # planes of h3's ports
DOWN_S = 0.6
#: Goodput over the capacity while half the ports are down (at most 1/2), and over the
#: window's last 0.3 s (every plane back; one path alone is 1/4).
DURING, SETTLED = 0.3, 0.5


def _down(f: Faults) -> None:
    for plane in PORTS_DOWN:
        f.nic_down("h3", plane)


def _up(f: Faults) -> None:
    for plane in PORTS_DOWN:
        f.nic_up("h3", plane)


def place(paths: Paths) -> Placed:
    case = FaultCase(
        "ports",
        f"{len(PORTS_DOWN)} of the receiver's 4 NIC ports down for {DOWN_S * 1e3:.0f} ms",
        _down,
        later=((DOWN_S, _up),),
    )
    marks = ((0.0, "ports down"), (DOWN_S * 1e3, "ports up"))
    return Placed(case, marks, (PORTS_DOWN[0], paths[PORTS_DOWN[0]]), back_at_s=DOWN_S)


def _share(runs: Sequence[Run], start_s: float, end_s: float) -> tuple[float, float, float]:
    """Each run's mean goodput between two times (after its fault) over the capacity:
    median, lowest, highest."""
    xs = [mean(r.timeline(BIN_S, start_s, end_s)) / 1e6 / CAPACITY_MBPS for r in runs]
    return median(xs), min(xs), max(xs)


def _claims(runs: Sequence[Run]) -> list[Claim]:
    def share(text: str, start_s: float, end_s: float, threshold: float) -> Claim:
        value, lo, hi = _share(runs, start_s, end_s)
        return Claim(
            f"mrcd's goodput {text}, over the 4 planes' capacity (median of {len(runs)} runs)",
            value,
            threshold,
            credits=Mechanism.SPRAYING,
            interval=(lo, hi),
            runs=len(runs),
        )

    return [
        share("while half the ports are down (half is left)", 0.1, DOWN_S, DURING),
        share(
            "over the window's last 0.3 s (every plane back in use; one path is 0.25)",
            WINDOW_S - 0.3,
            WINDOW_S,
            SETTLED,
        ),
    ]


def _notes(figures: Figures) -> list[str]:
    return [
        *notes(figures),
        "Progress lost is not compared: while the ports are down it is capacity that is "
        "gone, for every stack alike, not failover; nor is the recovery after they come "
        "back, which one path (mrcd without spraying) makes as fast.",
        "Recovery after the ports come back counts from the end of the command that brings "
        "them back (their addresses, routes and neighbour entries restored), not from its "
        f"start: that command took {figures['mrcd']['restore_ms']:.0f} ms (median of the "
        "mrcd runs).",
    ]


def figure(profile: str, seed: int, sabotage: Mechanism | None = None) -> Outcome:
    runs, placed, paths = testbed_runs(profile, place, "ex9b", sabotage)
    result, figures = outcome(
        runs,
        placed,
        title="Fig 9b on the testbed: half the receiver's NIC ports down, then up",
        sabotage=sabotage,
        paths=paths,
    )
    result.claims = _claims(runs["mrcd"])
    result.notes = _notes(figures)
    return result


EXPERIMENT = on_testbed(
    "fig9b-testbed",
    "Fig 9b",
    "half the receiver's NIC ports down, then up, under mrcd, TCP and MPTCP",
    figure,
)
