"""Fig 9a on the testbed: three T0-T1 links flap, 0.1 s apart, under mrcd, TCP and MPTCP."""

from __future__ import annotations

from mrcstack.experiments.base import Outcome
from mrcstack.experiments.live import Action, FaultCase
from mrcstack.experiments.testbedruns import on_testbed, testbed_figure

#: (link, when it goes down in s after the first); each stays down DOWN_S.
FLAPS = (("p0:t0a-t1a", 0.0), ("p1:t0a-t1b", 0.1), ("p2:t0b-t1c", 0.2))
DOWN_S = 0.3


def _down(link: str) -> Action:
    return lambda f: f.link_down(link)


def _up(link: str) -> Action:
    return lambda f: f.link_up(link)


def _case() -> FaultCase:
    """The first link goes down at the fault time; the others, and every return, later."""
    first, *rest = FLAPS
    later: list[tuple[float, Action]] = [(at, _down(link)) for link, at in rest]
    later += [(at + DOWN_S, _up(link)) for link, at in FLAPS]
    return FaultCase(
        "flaps",
        f"{len(FLAPS)} T0-T1 links flap, 0.1 s apart, each down {DOWN_S * 1e3:.0f} ms",
        _down(first[0]),
        later=tuple(sorted(later, key=lambda step: step[0])),
    )


def figure(profile: str, seed: int) -> Outcome:
    marks = [(at * 1e3, f"{link} down") for link, at in FLAPS]
    marks += [((at + DOWN_S) * 1e3, f"{link} up") for link, at in FLAPS]
    return testbed_figure(
        profile,
        _case(),
        "ex9a",
        title="Fig 9a on the testbed: T0-T1 link flaps",
        marks=marks,
        what="after the first link goes down",
    )


EXPERIMENT = on_testbed(
    "fig9a-testbed",
    "Fig 9a",
    "T0-T1 links flap under mrcd, TCP and MPTCP (shaped testbed)",
    figure,
)
