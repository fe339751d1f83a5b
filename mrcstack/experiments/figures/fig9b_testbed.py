"""Fig 9b on the testbed: half the receiver's NIC ports go down, then up, under mrcd, TCP and
MPTCP.  Recovery counts from the end of the command that brings them back."""

from __future__ import annotations

from mrcstack.experiments.analysis import ratio
from mrcstack.experiments.base import Claim, Outcome, Table
from mrcstack.experiments.live import FaultCase
from mrcstack.experiments.testbedruns import (
    WINDOW_S,
    Figures,
    claims,
    notes,
    on_testbed,
    outcome,
    testbed_runs,
)
from mrcstack.netns.faults import Faults

PORTS_DOWN = (2, 3)  # planes of h3's ports
DOWN_S = 0.6


def _down(f: Faults) -> None:
    for plane in PORTS_DOWN:
        f.nic_down("h3", plane)


def _up(f: Faults) -> None:
    for plane in PORTS_DOWN:
        f.nic_up("h3", plane)


CASE = FaultCase(
    "ports",
    f"{len(PORTS_DOWN)} of the receiver's 4 NIC ports down for {DOWN_S * 1e3:.0f} ms",
    _down,
    later=((DOWN_S, _up),),
)


def _window_mean(table: Table, column: str, start_ms: float, end_ms: float) -> float:
    rows = [
        v
        for t, v in zip(table.column("time_ms"), table.column(column), strict=True)
        if start_ms <= t < end_ms
    ]
    return ratio(sum(rows), len(rows))


def _claims(goodput: Table, figures: Figures) -> list[Claim]:
    during = _window_mean(goodput, "mrcd", 100.0, DOWN_S * 1e3)
    before = _window_mean(goodput, "mrcd", -300.0, 0.0)
    end = WINDOW_S * 1e3
    settled = _window_mean(goodput, "mrcd", end - 300.0, end)
    return [
        Claim(
            "mrcd's goodput while half the ports are down, as a fraction of before "
            "(half the capacity is left)",
            ratio(during, before),
            0.4,
        ),
        Claim(
            "mrcd's goodput over the window's last 0.3 s, as a fraction of before (every "
            "plane back in use)",
            ratio(settled, before),
            0.9,
        ),
        # Progress lost is not compared here: while the ports are down it is capacity that
        # is gone, for every stack alike, not failover.
        *claims(figures, "after the ports come back")[:2],
    ]


def _notes(figures: Figures) -> list[str]:
    return [
        *notes(figures),
        "Recovery after the ports come back counts from the end of the command that brings "
        "them back (their addresses, routes and neighbour entries restored), not from its "
        f"start: that command took {figures['mrcd']['restore_ms']:.0f} ms (median of the "
        "mrcd runs).",
    ]


def figure(profile: str, seed: int) -> Outcome:
    result, figures = outcome(
        testbed_runs(profile, CASE, "ex9b"),
        CASE,
        title="Fig 9b on the testbed: half the receiver's NIC ports down, then up",
        marks=[(0.0, "ports down"), (DOWN_S * 1e3, "ports up")],
        back_at_s=DOWN_S,
    )
    result.claims = _claims(next(t for t in result.tables if t.name == "goodput"), figures)
    result.notes = _notes(figures)
    return result


EXPERIMENT = on_testbed(
    "fig9b-testbed",
    "Fig 9b",
    "half the receiver's NIC ports down, then up, under mrcd, TCP and MPTCP",
    figure,
)
