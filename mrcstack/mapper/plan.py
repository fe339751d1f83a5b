"""The probe plan: which host probes which loop, derived from the fabric and the address plan.

Every probe is a loop that comes back to the host that sent it (:func:`mrcstack.addrplan.
loop_path`), so one host tests a path with no peer's help:

- the *short loop* ``h -> T0 -> h`` crosses only h's link to its T0 (twice);
- a *hairpin* ``h -> T0 -> T1x -> T0 -> h`` crosses that link and the T0-T1x link (each
  twice, once each way).

Each host runs its short loop on every plane, and the hairpins of its T0 are dealt out among
the hosts of the rack: every T0-T1 link gets ``overlap`` hairpins from different hosts (all
the rack's hosts when it has fewer), the hosts taking turns so no host carries more than one
hairpin more than another.  That is enough to localize one failed link: a host link is the
only link of its short loop, and a T0-T1 link is the only link its hairpins do not share
with a short loop, so every link has a set of covering loops no other link has
(:meth:`ProbePlan.problems` checks it).  The overlap keeps a T0-T1 link watched when one of
its probing hosts is down.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from ipaddress import IPv6Address

from mrcstack import addrplan
from mrcstack.fabric import Fabric

#: Hosts that probe each T0-T1 link (fewer when the rack has fewer hosts).
DEFAULT_OVERLAP = 2
MAX_OVERLAP = 16


@dataclass(frozen=True, slots=True)
class ProbePath:
    """One loop of the plan: its prober (also its destination), plane and T1 (None for the
    short loop), the physical links it crosses (each once in this tuple) and its address."""

    ident: int  # index in the plan: what reports name
    host: int
    plane: int
    t1: int | None
    links: tuple[str, ...]  # canonical names: the host link first
    address: IPv6Address

    @property
    def name(self) -> str:
        """``h0:p0:t0a`` for a short loop, ``h0:p0:t1c`` for a hairpin through p0-t1c."""
        if self.t1 is None:
            return f"h{self.host}:p{self.plane}:{self.links[0].split('-')[-1]}"
        return f"h{self.host}:p{self.plane}:{self.links[1].split('-')[-1]}"

    @property
    def short(self) -> bool:
        return self.t1 is None


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """Every loop of a fabric, who runs it, and which loops cover each link."""

    fabric: Fabric
    overlap: int
    paths: tuple[ProbePath, ...]
    links: tuple[str, ...]  # every physical link, addrplan.fabric_links order
    _covering: dict[str, tuple[int, ...]] = field(repr=False, compare=False)
    _shares: tuple[tuple[int, ...], ...] = field(repr=False, compare=False)

    def share(self, host: int) -> tuple[ProbePath, ...]:
        """The loops ``host`` runs (its short loops and its hairpins), by plane."""
        self.fabric.check_host(host)
        return tuple(self.paths[i] for i in self._shares[host])

    def covering(self, link: str) -> tuple[int, ...]:
        """The loops that cross ``link`` (a canonical name); KeyError for an unknown link."""
        return self._covering[link]

    def has_link(self, link: str) -> bool:
        """``link`` (a canonical name) is a link of this fabric."""
        return link in self._covering

    @property
    def digest(self) -> str:
        """Names this plan: agents and the mapper check that they follow the same one."""
        text = f"{self.fabric.to_toml()}overlap={self.overlap}\n".encode()
        return hashlib.sha256(text).hexdigest()[:16]

    def problems(self) -> list[str]:
        """What keeps a single failed link from being localized: a link no loop covers, or
        two links covered by exactly the same loops.  Empty for every plan :func:`make_plan`
        builds (a test checks it over many fabrics)."""
        out = [f"{link}: no loop crosses it" for link in self.links if not self._covering[link]]
        seen: dict[tuple[int, ...], str] = {}
        for link in self.links:
            cover = self._covering[link]
            if cover and cover in seen:
                out.append(f"{link}: crossed by exactly the loops of {seen[cover]}")
            seen.setdefault(cover, link)
        return out

    def per_host(self) -> tuple[int, int]:
        """(fewest, most) loops a host runs."""
        counts = [len(s) for s in self._shares]
        return min(counts), max(counts)


@functools.lru_cache(maxsize=16)
def make_plan(fabric: Fabric, overlap: int = DEFAULT_OVERLAP) -> ProbePlan:
    """The plan for ``fabric``: short loops for every host and plane, hairpins dealt out
    (remembered: a plan is immutable, and a large one takes a second to build)."""
    if not 1 <= overlap <= MAX_OVERLAP:
        raise ValueError(f"overlap must be in 1..{MAX_OVERLAP}, got {overlap}")
    paths: list[ProbePath] = []
    shares: list[list[int]] = [[] for _ in range(fabric.hosts)]

    def add(host: int, plane: int, t1: int | None) -> None:
        loop = addrplan.loop_path(fabric, host, plane, t1)
        links = tuple(dict.fromkeys(loop.physical_links))  # each link once, host link first
        ident = len(paths)
        paths.append(ProbePath(ident, host, plane, t1, links, loop.address))
        shares[host].append(ident)

    for plane in range(fabric.planes):
        for rack in range(fabric.racks):
            hosts = list(range(rack * fabric.hosts_per_rack, (rack + 1) * fabric.hosts_per_rack))
            for host in hosts:
                add(host, plane, None)
            probers = min(overlap, len(hosts))
            # Slot s goes to host s mod |hosts|: a T1's slots are consecutive, so its probers
            # differ; the start turns with plane and rack, so the hosts that carry one
            # hairpin more than the others are not the same ones everywhere.
            start = plane * fabric.racks + rack
            for t1 in range(fabric.t1_per_plane):
                for k in range(probers):
                    host = hosts[(start + t1 * probers + k) % len(hosts)]
                    add(host, plane, t1)
    links = tuple(addrplan.fabric_links(fabric))
    covering: dict[str, list[int]] = {link: [] for link in links}
    for p in paths:
        for link in p.links:
            covering[link].append(p.ident)
    return ProbePlan(
        fabric,
        overlap,
        tuple(paths),
        links,
        {k: tuple(v) for k, v in covering.items()},
        tuple(tuple(s) for s in shares),
    )


def link_ends(link: str) -> tuple[int, str, str]:
    """(plane, end a, end b) of a canonical link name, as node names (``p0-t0a``, ``h0``)."""
    return addrplan.parse_link(link)


def switches(plan: ProbePlan) -> dict[str, tuple[str, ...]]:
    """Every switch and its links (canonical names), in plan order."""
    out: dict[str, list[str]] = {}
    for link in plan.links:
        _, a, b = link_ends(link)
        for end in (a, b):
            if not end.startswith("h"):
                out.setdefault(end, []).append(link)
    return {k: tuple(v) for k, v in out.items()}
