"""The fabric mapper's link denylist in force on this node, and the EVs it denies.

The controller API sets it (``ctl.set_link_denylist``: the mapper's agent does, and an
operator may); every QP then has exactly the EVs whose path crosses a listed link DENIED
(:func:`mrcstack.mapper.denylist.denied_evs`), at once, and a new QP starts with them
denied.  An EV taken off the list comes back ASSUMED_BAD and carries data again once its
probes succeed.  EVs of formats whose path the address plan does not fix (``stev``: the
switches' ECMP picks it) are left alone.  The list stays as it is when the mapper goes
away: the node keeps the last one it was given (fail static).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from mrcstack.core.evs import EvEntry
from mrcstack.core.reasons import EvReason
from mrcstack.daemons.mrcd.datapath.transport import clock
from mrcstack.daemons.mrcd.node.qps import Qp
from mrcstack.fabric import Fabric
from mrcstack.mapper.denylist import denied_evs
from mrcstack.wire import EvFormat

#: Formats whose EV fixes the path (the address plan's uSID or SRH paths).
ROUTED = frozenset({EvFormat.SRV6, EvFormat.SRV6_SRH})
REASON = EvReason.DENYLIST
#: EV sets remembered with their denied EVs (a QP's set is the same for every QP to a
#: host under one profile).
CACHE_SIZE = 4096


@dataclass(frozen=True, slots=True)
class Applied:
    """What setting a denylist did: EV state changes, QPs touched, EVs now denied."""

    changed: int
    qps: int
    denied: int


class LinkDenylist:
    """The links no path of this node may cross, as each of its QPs applies them."""

    def __init__(
        self,
        fabric: Fabric,
        host: int,
        qps: dict[int, Qp],
        profile_denied: Callable[[Qp], Collection[int]],
        kick: Callable[[int], None],
    ) -> None:
        self.fabric = fabric
        self.host = host
        self.qps = qps
        self.profile_denied = profile_denied
        self.kick = kick
        self.links: frozenset[str] = frozenset()
        self.version = 0
        self.source = ""  # who set it: the mapper instance, or "controller"
        self.updated = 0.0  # unix time of the last set
        self._cache: dict[tuple[int, tuple[EvEntry, ...]], frozenset[int]] = {}
        self._applied: dict[int, frozenset[int]] = {}  # qpn -> EVs this list denied on it

    def evs_for(self, remote: int, evs: tuple[EvEntry, ...], fmt: EvFormat) -> frozenset[int]:
        """The EVs of ``evs`` (a QP's set to ``remote``) the list denies."""
        if fmt not in ROUTED or not self.links:
            return frozenset()
        key = (remote, evs)
        got = self._cache.get(key)
        if got is None:
            if len(self._cache) >= CACHE_SIZE:
                self._cache.clear()
            got = self._cache[key] = denied_evs(self.fabric, self.host, remote, evs, self.links)
        return got

    def set(self, links: frozenset[str], version: int, source: str) -> Applied:
        """Put ``links`` in force on every QP now."""
        old = self.links
        self.links = links
        self.version = version
        self.source = source
        self.updated = time.time()
        self._cache.clear()
        now = clock()
        changed = touched = 0
        for qpn, qp in self.qps.items():
            conn = qp.conn
            if conn is None:
                continue
            remote, evs, fmt = qp.remote_host, conn.cfg.evs, conn.cfg.ev_format
            want = self.evs_for(remote, evs, fmt)
            had = self._applied.get(qpn)
            if had is None:  # built since the last set: with the old list's EVs denied
                had = (
                    denied_evs(self.fabric, self.host, remote, evs, old)
                    if fmt in ROUTED
                    else frozenset()
                )
            keep = frozenset(self.profile_denied(qp))  # the controller's own DENY stays
            n = conn.deny_evs(want, now=now, reason=REASON)
            n += conn.allow_evs(had - want - keep, now=now, reason=REASON)
            self._applied[qpn] = want
            if n:
                changed += n
                touched += 1
                self.kick(qpn)
        self._applied = {q: v for q, v in self._applied.items() if q in self.qps}
        return Applied(changed, touched, self.denied())

    def _live(self) -> list[frozenset[int]]:
        return [
            self.evs_for(qp.remote_host, qp.conn.cfg.evs, qp.conn.cfg.ev_format)
            for qp in self.qps.values()
            if qp.conn is not None
        ]

    def denied(self) -> int:
        """EVs the list denies on live QPs now."""
        return sum(len(evs) for evs in self._live())

    def to_json(self) -> dict[str, Any]:
        return {
            "links": sorted(self.links),
            "version": self.version,
            "source": self.source,
            "updated": self.updated,
            "denied_evs": self.denied(),
            "qps": sum(1 for evs in self._live() if evs),
        }
