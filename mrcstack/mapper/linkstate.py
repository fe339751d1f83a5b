"""A link's state as the mapper sees it: the one table of its transitions.

The localizer (:mod:`.localize`) turns probe results into *evidence* about each link, and
the evidence moves the link through :data:`TRANSITIONS`:

- ``down``: every loop over the link failed its last few probes while the loops' other links
  are good elsewhere;
- ``lossy``: the link loses more than the threshold, with the stated confidence;
- ``good``: loops over it deliver again (a down link), or its loss is confidently under the
  threshold (a lossy one);
- ``hold_expired``: a recovering link stayed good for the whole hold-down time.

A link in DOWN, LOSSY or HELD is on the denylist: HELD keeps it there until the hold-down
has passed, so a flapping link does not churn the hosts' EV sets.  ``docs/mapper.md``
embeds :func:`transitions_markdown` (a test keeps them equal).
"""

from __future__ import annotations

import enum


class LinkState(enum.StrEnum):
    """What the mapper says of a link (the text reaches status, metrics and logs)."""

    UP = "up"
    LOSSY = "lossy"
    DOWN = "down"
    HELD = "held"  # good again, denied until the hold-down has passed


class Evidence(enum.StrEnum):
    """The inputs of :data:`TRANSITIONS`."""

    DOWN = "down"
    LOSSY = "lossy"
    GOOD = "good"
    HOLD_EXPIRED = "hold_expired"


#: (state, evidence) -> new state; evidence not listed for a state changes nothing.
TRANSITIONS: dict[tuple[LinkState, Evidence], LinkState] = {
    (LinkState.UP, Evidence.DOWN): LinkState.DOWN,
    (LinkState.UP, Evidence.LOSSY): LinkState.LOSSY,
    (LinkState.LOSSY, Evidence.DOWN): LinkState.DOWN,
    (LinkState.LOSSY, Evidence.GOOD): LinkState.HELD,
    (LinkState.DOWN, Evidence.LOSSY): LinkState.LOSSY,  # delivers again, but not well
    (LinkState.DOWN, Evidence.GOOD): LinkState.HELD,
    (LinkState.HELD, Evidence.DOWN): LinkState.DOWN,  # a flap: the hold-down starts over
    (LinkState.HELD, Evidence.LOSSY): LinkState.LOSSY,
    (LinkState.HELD, Evidence.HOLD_EXPIRED): LinkState.UP,
}

#: States whose links are on the denylist.
DENIED = frozenset({LinkState.DOWN, LinkState.LOSSY, LinkState.HELD})
#: ``mrc_link_state``'s value for each state (a gauge: 0 is up, larger is worse).
GAUGE = {LinkState.UP: 0, LinkState.HELD: 1, LinkState.LOSSY: 2, LinkState.DOWN: 3}


def transitions_markdown() -> str:
    """The table as Markdown for ``docs/mapper.md``."""
    lines = ["| state | evidence | new state |", "|---|---|---|"]
    for (state, evidence), new in TRANSITIONS.items():
        lines.append(f"| {state.name} | `{evidence.value}` | {new.name} |")
    return "\n".join(lines) + "\n"
