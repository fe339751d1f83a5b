"""The one address plan: SRv6 uSID addresses, EVs, paths, link names and switch tables.

Every tool (simulator, netns testbed, daemon) takes its addresses and tables from here, so
the path a sender encodes is the path the switches follow.  An outer IPv6 destination is a
32-bit locator block (``fabric.locator_block``) followed by 16-bit uSIDs, one per switch,
ending with the destination NIC's uSID; unused trailing uSIDs are zero::

    different racks:  block | T0(src rack) | T1(ev.t1) | T0(dst rack) | NIC(dst) | 0 | 0
    same rack:        block | T0(rack)     | NIC(dst)  | 0 ...

uSID values carry the plane, so one plane's tables never match another's:

    T0   0x1000 | plane << 8  | rack      (0x1000-0x1fff)
    T1   0x2000 | plane << 8  | t1        (0x2000-0x2fff)
    NIC  0x8000 | plane << 11 | host      (0x8000-0xffff)

Every switch is a uN (End with the NEXT-C-SID flavour): it matches block + its own uSID
(a /48), shifts the uSIDs left by one and forwards on the new active uSID with a static
table (:func:`static_routes`).  A host owns block + its NIC uSID for each plane
(:func:`nic_sid`), which is what the destination address becomes after the last shift.

EV format (our SRv6 EV profile): bits 0-7 = T1 index (the T0 uplink), bits 8-11 = plane,
bits 12-31 = free entropy, ignored by the plane.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from ipaddress import IPv6Address, IPv6Network
from itertools import pairwise

from mrcstack.core.evs import EvEntry, in_use_for, listed_for
from mrcstack.fabric import (
    LOCATOR_BLOCK_BITS,
    MAX_HOSTS,
    MAX_PLANES,
    MAX_RACKS,
    MAX_T1,
    Fabric,
    letter_index,
    letters,
)

ADDRESS_BITS = 128
USID_BITS = 16
USID_MASK = (1 << USID_BITS) - 1
LOCATOR_BITS = LOCATOR_BLOCK_BITS + USID_BITS  # the /48 a uN switch (or a NIC) matches
MAX_USIDS = (ADDRESS_BITS - LOCATOR_BLOCK_BITS) // USID_BITS  # 6 uSIDs fit after the block

T0_USID_BASE = 0x1000
T1_USID_BASE = 0x2000
NIC_USID_BASE = 0x8000
SWITCH_KIND_MASK = 0xF000  # the nibble that tells T0 from T1
SWITCH_PLANE_SHIFT = 8
SWITCH_INDEX_MASK = 0xFF  # rack or T1 index
NIC_PLANE_SHIFT = 11
NIC_HOST_MASK = 0x7FF
PLANE_MASK = 0xF

EV_BITS = 32
EV_T1_BITS = 8
EV_PLANE_SHIFT = EV_T1_BITS
EV_PLANE_BITS = 4
EV_ENTROPY_SHIFT = EV_PLANE_SHIFT + EV_PLANE_BITS
EV_ENTROPY_BITS = EV_BITS - EV_ENTROPY_SHIFT  # 20

#: NIC uSIDs of one plane share their top 5 bits: block (32) + 5 = a /37 per plane.
NIC_PREFIX = LOCATOR_BLOCK_BITS + 5
#: A classic SID is a switch's locator plus this 16-bit function (bits 79-64).
CLASSIC_FUNCTION = 0xE000
CLASSIC_SHIFT = ADDRESS_BITS - LOCATOR_BITS - USID_BITS

PATH_CACHE_SIZE = 1 << 16  # paths remembered by path(); a Path is immutable
MAX_HOPS = 2 * MAX_USIDS  # forward()'s loop guard; a real path has at most 3 switches

HOST = "h"
T0 = "t0"
T1 = "t1"
_RANK = {HOST: 0, T0: 1, T1: 2}  # canonical order of a link's two ends
_LINK_KINDS = ({HOST, T0}, {T0, T1})
_NUM = r"(0|[1-9][0-9]*)"  # no leading zeros: every name has one spelling
_HOST_RE = re.compile(rf"h{_NUM}")
_SWITCH_RE = re.compile(rf"p{_NUM}-(t[01])([a-z]+)")
_SHORT_SWITCH_RE = re.compile(r"(t[01])([a-z]+)")
_LINK_RE = re.compile(rf"p{_NUM}:([a-z0-9]+)-([a-z0-9]+)")


def _check(what: str, value: int, top: int) -> None:
    if not 0 <= value < top:
        raise ValueError(f"{what} {value} out of range 0..{top - 1}")


# uSIDs ----------------------------------------------------------------------------------
def t0_usid(plane: int, rack: int) -> int:
    _check("plane", plane, MAX_PLANES)
    _check("rack", rack, MAX_RACKS)
    return T0_USID_BASE | plane << SWITCH_PLANE_SHIFT | rack


def t1_usid(plane: int, t1: int) -> int:
    _check("plane", plane, MAX_PLANES)
    _check("t1", t1, MAX_T1)
    return T1_USID_BASE | plane << SWITCH_PLANE_SHIFT | t1


def nic_usid(plane: int, host: int) -> int:
    _check("plane", plane, MAX_PLANES)
    _check("host", host, MAX_HOSTS)
    return NIC_USID_BASE | plane << NIC_PLANE_SHIFT | host


def usid_owner(usid: int) -> tuple[int, str]:
    """(plane, node name) of an assigned uSID; a NIC uSID names its host."""
    _check("uSID", usid, 1 << USID_BITS)
    if usid & NIC_USID_BASE:
        return (usid >> NIC_PLANE_SHIFT) & PLANE_MASK, Fabric.host_name(usid & NIC_HOST_MASK)
    plane, index = (usid >> SWITCH_PLANE_SHIFT) & PLANE_MASK, usid & SWITCH_INDEX_MASK
    if usid & SWITCH_KIND_MASK == T0_USID_BASE:
        return plane, Fabric.t0_name(plane, index)
    if usid & SWITCH_KIND_MASK == T1_USID_BASE:
        return plane, Fabric.t1_name(plane, index)
    raise ValueError(f"uSID {usid:#06x} is not assigned by the address plan")


def switch_usid(name: str) -> int:
    """The uSID of a switch given its node name ("p0-t1c" -> 0x2002)."""
    node = parse_node(name)
    if node.plane is None:
        raise ValueError(f"{name} is a host: it has one NIC uSID per plane (nic_usid)")
    return (t0_usid if node.kind == T0 else t1_usid)(node.plane, node.index)


def _compose(fabric: Fabric, usids: tuple[int, ...]) -> IPv6Address:
    value = fabric.block
    for position, usid in enumerate(usids):
        value |= usid << (ADDRESS_BITS - LOCATOR_BITS - position * USID_BITS)
    return IPv6Address(value)


def nic_sid(fabric: Fabric, plane: int, host: int) -> IPv6Address:
    """The address a host owns on its NIC for ``plane``: block + NIC uSID, rest zero."""
    fabric.check_plane(plane)
    fabric.check_host(host)
    return _compose(fabric, (nic_usid(plane, host),))


def nic_plane_prefix(fabric: Fabric, plane: int) -> IPv6Network:
    """Every NIC address of ``plane`` (block + NIC uSIDs 0x8000 | plane << 11 | host): what a
    host routes out of that plane's NIC for plain (ECMP) traffic."""
    fabric.check_plane(plane)
    return IPv6Network((_compose(fabric, (NIC_USID_BASE | plane << NIC_PLANE_SHIFT,)), NIC_PREFIX))


def classic_sid(fabric: Fabric, usid: int) -> IPv6Address:
    """A switch's classic SID, for paths written as an SRH: its /48 locator and the function
    ``CLASSIC_FUNCTION`` in the next 16 bits.  Neighbours reach it by the locator route; on
    the switch a /128 plain End route, more specific than the uN /48, processes the SRH."""
    locator = switch_locator(fabric, usid)
    return IPv6Address(int(locator.network_address) | CLASSIC_FUNCTION << CLASSIC_SHIFT)


def srh_segments(
    fabric: Fabric, src_host: int, dst_host: int, plane: int, ev: int
) -> tuple[IPv6Address, ...]:
    """The EV's path as a segment list in path order: each switch's classic SID, then the
    destination NIC's address (the last segment).  The first is the first destination."""
    nodes = path(fabric, src_host, dst_host, plane, ev).nodes
    sids = tuple(classic_sid(fabric, switch_usid(n)) for n in nodes[1:-1])
    return (*sids, nic_sid(fabric, plane, dst_host))


def switch_locator(fabric: Fabric, usid: int) -> IPv6Network:
    """The /48 (block + uSID) that a switch with this uSID matches as its uN SID."""
    if not 0 < usid <= USID_MASK:
        raise ValueError(f"uSID {usid} out of range 1..{USID_MASK:#x}")
    return IPv6Network((_compose(fabric, (usid,)), LOCATOR_BITS))


# uN behaviour ---------------------------------------------------------------------------
def _as_int(addr: IPv6Address | int, block_bits: int, usid_bits: int) -> int:
    if block_bits < 0 or usid_bits < 1 or block_bits + usid_bits > ADDRESS_BITS:
        raise ValueError(f"bad uSID format: block {block_bits} bits, uSID {usid_bits} bits")
    value = int(addr)
    _check("address", value, 1 << ADDRESS_BITS)
    return value


def usid_shift(
    addr: IPv6Address | int, block_bits: int = LOCATOR_BLOCK_BITS, usid_bits: int = USID_BITS
) -> IPv6Address:
    """What a uN (NEXT-C-SID End) switch does: keep the block, shift the rest left by one
    uSID and zero-fill."""
    value = _as_int(addr, block_bits, usid_bits)
    rest_mask = (1 << (ADDRESS_BITS - block_bits)) - 1
    return IPv6Address((value & ~rest_mask) | ((value << usid_bits) & rest_mask))


def active_usid(
    addr: IPv6Address | int, block_bits: int = LOCATOR_BLOCK_BITS, usid_bits: int = USID_BITS
) -> int:
    """The uSID right after the block: the one the next switch matches."""
    value = _as_int(addr, block_bits, usid_bits)
    return (value >> (ADDRESS_BITS - block_bits - usid_bits)) & ((1 << usid_bits) - 1)


# EVs ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class EvFields:
    """The fields of an entropy value under our EV profile."""

    t1: int  # T0 uplink: which T1 of the plane (ignored between hosts of one rack)
    plane: int
    entropy: int  # free bits; the address plan ignores them


def ev_value(plane: int, t1: int, entropy: int = 0) -> int:
    """Pack an EV: bits 0-7 T1, bits 8-11 plane, bits 12-31 entropy."""
    _check("plane", plane, 1 << EV_PLANE_BITS)
    _check("t1", t1, 1 << EV_T1_BITS)
    _check("entropy", entropy, 1 << EV_ENTROPY_BITS)
    return entropy << EV_ENTROPY_SHIFT | plane << EV_PLANE_SHIFT | t1


def ev_fields(ev: int) -> EvFields:
    _check("EV", ev, 1 << EV_BITS)
    return EvFields(
        t1=ev & ((1 << EV_T1_BITS) - 1),
        plane=(ev >> EV_PLANE_SHIFT) & ((1 << EV_PLANE_BITS) - 1),
        entropy=ev >> EV_ENTROPY_SHIFT,
    )


# Addresses and paths --------------------------------------------------------------------
def ev_profile(
    fabric: Fabric, src_host: int, dst_host: int, ev_count: int = 128
) -> tuple[EvEntry, ...]:
    """The default generated EV profile from src to dst (OCP GEN mode over our fields).

    Every EV names a different path.  Per plane the fabric has ``t1_per_plane`` paths
    between racks (one per T1) and one within a rack; the profile lists as many of them as
    ``ev_count // planes`` in use plus a backup set need (:func:`~mrcstack.core.evs.
    listed_for`), all of them when the fabric has fewer.  The core keeps a quarter of each
    plane's EVs (at least one, when it lists two or more) back as backups and sprays on the
    rest (:func:`~mrcstack.core.evs.in_use_for`): on the default fabric 3 of 4 per plane
    between racks, and the one path per plane within a rack, with no backup.  Host ``h``
    lists the T1s from ``h x (backups per plane)`` on, so consecutive hosts keep disjoint
    T1s back as backups and every T1 carries traffic.  Used by the simulator and by mrcd.
    """
    _check_pair(fabric, src_host, dst_host)
    if ev_count < 1:
        raise ValueError(f"ev_count must be >= 1, got {ev_count}")
    paths = 1 if fabric.rack_of(src_host) == fabric.rack_of(dst_host) else fabric.t1_per_plane
    requested = max(1, ev_count // fabric.planes)
    listed = min(paths, listed_for(requested))
    # Consecutive hosts start one backup set further on: their backups are disjoint T1s.
    first = src_host * (listed - in_use_for(listed, requested)) % paths
    return tuple(
        EvEntry(ev_value(plane, (first + k) % paths), plane)
        for plane in range(fabric.planes)
        for k in range(listed)
    )


def _check_pair(fabric: Fabric, src_host: int, dst_host: int) -> None:
    fabric.check_host(src_host)
    fabric.check_host(dst_host)
    if src_host == dst_host:
        raise ValueError(f"source and destination are the same host {src_host}")


def _route(fabric: Fabric, src_host: int, dst_host: int, plane: int, ev: int) -> int | None:
    """The T1 index a packet crosses, or None within one rack; checks every argument."""
    _check_pair(fabric, src_host, dst_host)
    fabric.check_plane(plane)
    fields = ev_fields(ev)
    if fields.plane != plane:
        raise ValueError(f"EV {ev:#x} is for plane {fields.plane}, not plane {plane}")
    if fabric.rack_of(src_host) == fabric.rack_of(dst_host):
        return None
    if fields.t1 >= fabric.t1_per_plane:
        raise ValueError(f"EV {ev:#x} names T1 {fields.t1}; plane has {fabric.t1_per_plane}")
    return fields.t1


def address(fabric: Fabric, src_host: int, dst_host: int, plane: int, ev: int) -> IPv6Address:
    """The outer destination that carries a packet from src to dst along the EV's path."""
    t1 = _route(fabric, src_host, dst_host, plane, ev)
    src_rack, dst_rack = fabric.rack_of(src_host), fabric.rack_of(dst_host)
    nic = nic_usid(plane, dst_host)
    if t1 is None:
        return _compose(fabric, (t0_usid(plane, src_rack), nic))
    return _compose(
        fabric, (t0_usid(plane, src_rack), t1_usid(plane, t1), t0_usid(plane, dst_rack), nic)
    )


@dataclass(frozen=True, slots=True)
class Path:
    """One path through the fabric: what an EV selects between two hosts."""

    plane: int
    ev: int
    nodes: tuple[str, ...]  # src host, switches, dst host
    address: IPv6Address  # outer destination address
    links: tuple[str, ...]  # directed link names in path order ("p0:t1c-t0b")

    @property
    def physical_links(self) -> tuple[str, ...]:
        """The links in canonical form: the same names whichever way a packet crosses."""
        return tuple(canonical_link(link) for link in self.links)


def path(fabric: Fabric, src_host: int, dst_host: int, plane: int, ev: int) -> Path:
    """The path an EV selects from src to dst (cached: simulators ask once per packet)."""
    return _cached_path(fabric, src_host, dst_host, plane, ev)


@functools.lru_cache(maxsize=PATH_CACHE_SIZE)
def _cached_path(fabric: Fabric, src_host: int, dst_host: int, plane: int, ev: int) -> Path:
    t1 = _route(fabric, src_host, dst_host, plane, ev)
    src_rack, dst_rack = fabric.rack_of(src_host), fabric.rack_of(dst_host)
    switches = (
        (Fabric.t0_name(plane, src_rack),)
        if t1 is None
        else (
            Fabric.t0_name(plane, src_rack),
            Fabric.t1_name(plane, t1),
            Fabric.t0_name(plane, dst_rack),
        )
    )
    nodes = (Fabric.host_name(src_host), *switches, Fabric.host_name(dst_host))
    return Path(
        plane=plane,
        ev=ev,
        nodes=nodes,
        address=address(fabric, src_host, dst_host, plane, ev),
        links=tuple(link_name(plane, a, b) for a, b in pairwise(nodes)),
    )


def loop_address(fabric: Fabric, host: int, plane: int, t1: int | None) -> IPv6Address:
    """The outer destination of a link probe that comes back to ``host``: up to its T0 and
    straight back (``t1`` None), or up through T1 ``t1`` and back through the same T0::

        block | T0(rack) | NIC(host)                     host -> T0 -> host
        block | T0(rack) | T1(t1) | T0(rack) | NIC(host)  host -> T0 -> T1 -> T0 -> host

    The switches' ordinary tables forward both: a T0 sends its own hosts' NIC uSIDs down and
    T1 uSIDs up, a T1 sends T0 uSIDs down.  Nothing is added to any table."""
    fabric.check_host(host)
    fabric.check_plane(plane)
    t0 = t0_usid(plane, fabric.rack_of(host))
    nic = nic_usid(plane, host)
    if t1 is None:
        return _compose(fabric, (t0, nic))
    if not 0 <= t1 < fabric.t1_per_plane:
        raise ValueError(f"T1 {t1} out of range 0..{fabric.t1_per_plane - 1}")
    return _compose(fabric, (t0, t1_usid(plane, t1), t0, nic))


def loop_path(fabric: Fabric, host: int, plane: int, t1: int | None) -> Path:
    """The path of :func:`loop_address`: both ends ``host``; its EV names the T1 (0 for the
    short loop, which crosses no T1)."""
    address_ = loop_address(fabric, host, plane, t1)
    t0 = Fabric.t0_name(plane, fabric.rack_of(host))
    middle = (t0,) if t1 is None else (t0, Fabric.t1_name(plane, t1), t0)
    nodes = (Fabric.host_name(host), *middle, Fabric.host_name(host))
    return Path(
        plane=plane,
        ev=ev_value(plane, 0 if t1 is None else t1),
        nodes=nodes,
        address=address_,
        links=tuple(link_name(plane, a, b) for a, b in pairwise(nodes)),
    )


def paths(fabric: Fabric, src_host: int, dst_host: int) -> list[Path]:
    """Every distinct path from src to dst, by plane then T1 (one per plane in a rack)."""
    _check_pair(fabric, src_host, dst_host)
    same_rack = fabric.rack_of(src_host) == fabric.rack_of(dst_host)
    t1s = range(1 if same_rack else fabric.t1_per_plane)
    return [
        path(fabric, src_host, dst_host, plane, ev_value(plane, t1))
        for plane in range(fabric.planes)
        for t1 in t1s
    ]


# Node and link names --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Node:
    """A parsed node name: a host (on every plane) or a T0/T1 switch of one plane."""

    kind: str  # HOST, T0 or T1
    index: int  # host number, rack, or T1 number
    plane: int | None  # None for a host

    @property
    def name(self) -> str:
        if self.plane is None:
            return Fabric.host_name(self.index)
        return f"p{self.plane}-{self.short}"

    @property
    def short(self) -> str:
        """The name inside a link name: "h0", "t0a", "t1c"."""
        return (
            Fabric.host_name(self.index) if self.plane is None else self.kind + letters(self.index)
        )


def _switch(kind: str, plane: int, index_letters: str, text: str) -> Node:
    _check(f"{text}: plane", plane, MAX_PLANES)
    index = letter_index(index_letters)
    _check(f"{text}: {'rack' if kind == T0 else 't1'}", index, MAX_RACKS if kind == T0 else MAX_T1)
    return Node(kind, index, plane)


def _host(number: str, text: str) -> Node:
    _check(f"{text}: host", int(number), MAX_HOSTS)
    return Node(HOST, int(number), None)


def parse_node(name: str) -> Node:
    """Parse "h3", "p0-t0a" or "p2-t1c"; ValueError on anything else."""
    if match := _HOST_RE.fullmatch(name):
        return _host(match.group(1), name)
    if match := _SWITCH_RE.fullmatch(name):
        return _switch(match.group(2), int(match.group(1)), match.group(3), name)
    raise ValueError(f"bad node name {name!r}: expected h<n>, p<plane>-t0<x> or p<plane>-t1<x>")


def _link_end(plane: int, text: str) -> Node:
    """A link end given as a node name ("p0-t0a", "h0") or in short form ("t0a")."""
    if match := _SHORT_SWITCH_RE.fullmatch(text):
        return _switch(match.group(1), plane, match.group(2), text)
    node = parse_node(text)
    if node.plane is not None and node.plane != plane:
        raise ValueError(f"{text} is not on plane {plane}")
    return node


def _check_link(plane: int, a: Node, b: Node) -> None:
    if {a.kind, b.kind} not in _LINK_KINDS:
        raise ValueError(
            f"p{plane}:{a.short}-{b.short} is not a link: links join a host to a T0 or a T0 to a T1"
        )


def link_name(plane: int, a: str, b: str) -> str:
    """The directed name of the link from node ``a`` to node ``b`` on ``plane``."""
    _check("plane", plane, MAX_PLANES)
    end_a, end_b = _link_end(plane, a), _link_end(plane, b)
    _check_link(plane, end_a, end_b)
    return f"p{plane}:{end_a.short}-{end_b.short}"


def parse_link(name: str, fabric: Fabric | None = None) -> tuple[int, str, str]:
    """Parse "p0:t0a-t1c" into (0, "p0-t0a", "p0-t1c"), ends in the order given (for
    --fail-link and the like).  With a fabric, also check that the link exists in it."""
    match = _LINK_RE.fullmatch(name)
    if match is None:
        raise ValueError(f"bad link name {name!r}: expected like p0:t0a-t1c or p0:h0-t0a")
    plane = int(match.group(1))
    _check(f"{name}: plane", plane, MAX_PLANES)
    a, b = (_link_end(plane, match.group(i)) for i in (2, 3))
    _check_link(plane, a, b)
    if fabric is not None:
        _check_in_fabric(fabric, name, plane, a, b)
    return plane, a.name, b.name


def _check_in_fabric(fabric: Fabric, name: str, plane: int, a: Node, b: Node) -> None:
    tops = {
        HOST: ("host", fabric.hosts),
        T0: ("rack", fabric.racks),
        T1: ("t1", fabric.t1_per_plane),
    }
    try:
        fabric.check_plane(plane)
        for node in (a, b):
            what, top = tops[node.kind]
            _check(what, node.index, top)
    except ValueError as exc:
        raise ValueError(f"{name}: not in this fabric: {exc}") from None
    host, t0 = (a, b) if a.kind == HOST else (b, a)
    if host.kind == HOST and fabric.rack_of(host.index) != t0.index:
        raise ValueError(f"{name}: not in this fabric: h{host.index} is not in rack {t0.short}")


def canonical_link(name: str) -> str:
    """The physical link a directed name belongs to: ends ordered host < T0 < T1."""
    return _cached_canonical_link(name)


@functools.lru_cache(maxsize=PATH_CACHE_SIZE)
def _cached_canonical_link(name: str) -> str:
    plane, a, b = parse_link(name)
    ends = sorted((parse_node(a), parse_node(b)), key=lambda n: (_RANK[n.kind], n.index))
    return link_name(plane, ends[0].name, ends[1].name)


def fabric_links(fabric: Fabric) -> list[str]:
    """Every physical link, canonical names, by plane: host-T0 links, then T0-T1 links."""
    links: list[str] = []
    for plane in range(fabric.planes):
        links += [
            link_name(plane, Fabric.host_name(h), Fabric.t0_name(plane, fabric.rack_of(h)))
            for h in range(fabric.hosts)
        ]
        links += [
            link_name(plane, Fabric.t0_name(plane, rack), Fabric.t1_name(plane, t1))
            for rack in range(fabric.racks)
            for t1 in range(fabric.t1_per_plane)
        ]
    return links


# Switch tables and the forwarding walk --------------------------------------------------
def static_routes(fabric: Fabric) -> dict[str, dict[int, str]]:
    """Every switch's static table: active uSID (after its own shift) -> next node.

    A T0 sends T1 uSIDs of its plane up to that T1 and its rack's NIC uSIDs down to the
    host; a T1 sends T0 uSIDs of its plane down to that T0.  Nothing else is routed."""
    routes: dict[str, dict[int, str]] = {}
    for plane in range(fabric.planes):
        for rack in range(fabric.racks):
            table = {
                t1_usid(plane, t1): Fabric.t1_name(plane, t1) for t1 in range(fabric.t1_per_plane)
            }
            first = rack * fabric.hosts_per_rack
            for host in range(first, first + fabric.hosts_per_rack):
                table[nic_usid(plane, host)] = Fabric.host_name(host)
            routes[Fabric.t0_name(plane, rack)] = table
        for t1 in range(fabric.t1_per_plane):
            routes[Fabric.t1_name(plane, t1)] = {
                t0_usid(plane, rack): Fabric.t0_name(plane, rack) for rack in range(fabric.racks)
            }
    return routes


def forward(
    fabric: Fabric,
    src_host: int,
    addr: IPv6Address | int,
    routes: Mapping[str, Mapping[int, str]] | None = None,
) -> tuple[str, ...]:
    """Walk a packet from ``src_host`` through the switches as the kernel would.

    It enters at the src host's T0 on the plane named by the first uSID; each switch whose
    uSID is active shifts (uN), then looks the new active uSID up in its table.  Returns the
    node names visited, src host first; ValueError when a lookup misses."""
    value = int(addr)
    if value >> (ADDRESS_BITS - LOCATOR_BLOCK_BITS) != fabric.block >> (
        ADDRESS_BITS - LOCATOR_BLOCK_BITS
    ):
        raise ValueError(f"{IPv6Address(value)} is outside the block {fabric.locator_block}/32")
    table = static_routes(fabric) if routes is None else routes
    plane, first = usid_owner(active_usid(value))
    fabric.check_plane(plane)
    node = Fabric.t0_name(plane, fabric.rack_of(src_host))
    if first != node:
        raise ValueError(f"{IPv6Address(value)} starts at {first}, not at h{src_host}'s T0 {node}")
    visited = [Fabric.host_name(src_host), node]
    for _ in range(MAX_HOPS):
        if active_usid(value) == switch_usid(node):
            value = int(usid_shift(value))
        usid = active_usid(value)
        next_node = table.get(node, {}).get(usid)
        if next_node is None:
            raise ValueError(f"{node}: no route for uSID {usid:#06x} ({IPv6Address(value)})")
        visited.append(next_node)
        if parse_node(next_node).kind == HOST:  # it owns block + its NIC uSID (/48 on lo)
            return tuple(visited)
        node = next_node
    raise ValueError(f"{IPv6Address(int(addr))}: still in the fabric after {MAX_HOPS} hops")


# Documentation --------------------------------------------------------------------------
def render_plan(fabric: Fabric, plane: int = 0) -> str:
    """The address plan, SID tables and example paths of one plane, as README text.

    Generated from the functions above so the documentation cannot drift from the code."""
    fabric.check_plane(plane)
    routes = static_routes(fabric)
    switches = [name for name in routes if parse_node(name).plane == plane]
    lines = [
        f"Plane {plane}: locator block {fabric.locator_block}/{LOCATOR_BLOCK_BITS}, "
        f"{USID_BITS}-bit uSIDs",
        "",
        f"{'switch':<8} {'uSID':<5} {'uN SID (End next-csid)':<24} static table: uSID -> next hop",
    ]
    for name in switches:
        usid = switch_usid(name)
        table = " ".join(f"{u:04x}->{n}" for u, n in routes[name].items())
        lines.append(f"{name:<8} {usid:04x}  {switch_locator(fabric, usid)!s:<24} {table}")
    lines += ["", f"{'host':<8} {'uSID':<5} NIC SID on plane {plane} (/128 on lo, local /48)"]
    for host in range(fabric.hosts):
        sid = nic_sid(fabric, plane, host)
        lines.append(f"{Fabric.host_name(host):<8} {nic_usid(plane, host):04x}  {sid}")
    examples = [(0, fabric.hosts_per_rack)] if fabric.racks > 1 else []
    examples += [(0, 1)] if fabric.hosts_per_rack > 1 else []
    for src, dst in examples:
        lines += ["", f"Paths h{src} -> h{dst} on plane {plane}: EV, outer destination, nodes"]
        for p in paths(fabric, src, dst):
            if p.plane == plane:
                lines.append(f"  ev {p.ev:#06x}  {p.address!s:<32} {' '.join(p.nodes)}")
    return "\n".join(lines) + "\n"
