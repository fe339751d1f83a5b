"""From bad links to the EVs a host must not use: the denylist as each QP applies it.

An EV names one path between two hosts (:func:`mrcstack.addrplan.path`), and its packets and
the feedback coming back cross the same physical links, so an EV is denied on a QP when its
path crosses any link of the denylist, at both ends of the QP.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from mrcstack import addrplan
from mrcstack.core.evs import EvEntry
from mrcstack.fabric import Fabric


def denied_evs(
    fabric: Fabric, local: int, remote: int, evs: Iterable[EvEntry], links: Collection[str]
) -> frozenset[int]:
    """The EVs of ``evs`` (a QP's set, ``local`` to ``remote``) whose path crosses a link of
    ``links`` (canonical names).  EVs the address plan cannot place (not a path between
    the two) are left alone."""
    bad = frozenset(links)
    if not bad:
        return frozenset()
    out = set()
    for e in evs:
        try:
            crossed = addrplan.path(fabric, local, remote, e.port, e.value).physical_links
        except ValueError:
            continue
        if not bad.isdisjoint(crossed):
            out.add(e.value)
    return frozenset(out)


def default_denied(fabric: Fabric, host: int, links: Collection[str]) -> int:
    """How many (peer, EV) pairs of the address plan's default profile ``host`` denies for
    ``links``: what the mapper expects each host to report."""
    return sum(
        len(denied_evs(fabric, host, peer, addrplan.ev_profile(fabric, host, peer), links))
        for peer in range(fabric.hosts)
        if peer != host
    )
