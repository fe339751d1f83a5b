"""A host's endpoint (QP 2): the probe ids of its EV probes, and whose probe each one is.

OCP MRC 1.0 sends endpoint operations (EV probes, port status updates) to QP 2, not to a
connection, with a 16-bit probe id in the PSN; the answer comes back to the prober's QP 2
with the same id.  So the ids are a host's, shared by its connections: :class:`ProbeIds`
hands them out and remembers which QP sent each, so that an adapter can give an answer to
the connection that asked (:meth:`ProbeIds.owner`).  A connection alone (two connections in a
test) keeps its own.
"""

from __future__ import annotations

import random

from mrcstack.wire.packets import ENDPOINT_QPN, PROBE_ID_MASK

__all__ = ["ENDPOINT_QPN", "ProbeIds"]

#: Ids outstanding at once, per host: past this the oldest are forgotten (an answer to one
#: of them is then ignored, as an answer to a probe given up for lost is).
MAX_OUTSTANDING = 1 << 14


class ProbeIds:
    """16-bit probe ids: each handed out once until released (or until 65,536 later)."""

    __slots__ = ("_next", "_owner")

    def __init__(self, rng: random.Random | None = None) -> None:
        self._next = (rng or random.Random(0)).randrange(PROBE_ID_MASK + 1)
        self._owner: dict[int, int] = {}  # probe id -> the QPN that sent it

    def allocate(self, qpn: int) -> int:
        """A fresh id for a probe QP ``qpn`` sends."""
        owner = self._owner
        if len(owner) >= MAX_OUTSTANDING:
            del owner[next(iter(owner))]
        ident = self._next
        while ident in owner:
            ident = (ident + 1) & PROBE_ID_MASK
        self._next = (ident + 1) & PROBE_ID_MASK
        owner[ident] = qpn
        return ident

    def owner(self, ident: int) -> int | None:
        """The QPN whose probe ``ident`` is, or None (unknown, answered or given up)."""
        return self._owner.get(ident)

    def release(self, ident: int) -> None:
        self._owner.pop(ident, None)

    def __len__(self) -> int:
        return len(self._owner)
