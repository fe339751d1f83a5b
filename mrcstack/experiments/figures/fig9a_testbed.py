"""Fig 9a on the testbed: three T0-T1 links flap, 0.1 s apart, under mrcd, TCP and MPTCP.

Each flapping link is on a baseline's path: the first on plane 0 (TCP's and an MPTCP
subflow's), the others on planes 1 and 2 (two more subflows), so every stack meets the
flaps."""

from __future__ import annotations

from mrcstack.experiments.base import Mechanism, Outcome
from mrcstack.experiments.live import Action, FaultCase
from mrcstack.experiments.testbedruns import Paths, Placed, on_testbed, testbed_figure
from mrcstack.fabric import letters

#: (plane, T0 rack letter, when it goes down in s after the first); each stays down DOWN_S.
FLAPS = ((0, "a", 0.0), (1, "a", 0.1), (2, "b", 0.2))
DOWN_S = 0.3


def _down(link: str) -> Action:
    return lambda f: f.link_down(link)


def _up(link: str) -> Action:
    return lambda f: f.link_up(link)


def place(paths: Paths) -> Placed:
    """The first link goes down at the fault time; the others, and every return, later."""
    links = [(f"p{plane}:t0{rack}-t1{letters(paths[plane])}", at) for plane, rack, at in FLAPS]
    (first, _), *rest = links
    later: list[tuple[float, Action]] = [(at, _down(link)) for link, at in rest]
    later += [(at + DOWN_S, _up(link)) for link, at in links]
    case = FaultCase(
        "flaps",
        f"{len(FLAPS)} T0-T1 links on the baselines' paths flap, 0.1 s apart, each down "
        f"{DOWN_S * 1e3:.0f} ms: {', '.join(link for link, _ in links)}",
        _down(first),
        later=tuple(sorted(later, key=lambda step: step[0])),
    )
    marks = [(at * 1e3, f"{link} down") for link, at in links]
    marks += [((at + DOWN_S) * 1e3, f"{link} up") for link, at in links]
    return Placed(case, tuple(marks), (0, paths[0]))


def figure(profile: str, seed: int, sabotage: Mechanism | None = None) -> Outcome:
    return testbed_figure(
        profile,
        place,
        "ex9a",
        sabotage,
        title="Fig 9a on the testbed: T0-T1 link flaps",
        what="after the first link goes down",
    )


EXPERIMENT = on_testbed(
    "fig9a-testbed",
    "Fig 9a",
    "T0-T1 links on the baselines' paths flap under mrcd, TCP and MPTCP (shaped testbed)",
    figure,
)
