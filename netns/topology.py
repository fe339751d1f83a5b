"""The plan of a testbed: pure data computed from (Fabric, name), no I/O.

Everything the builder creates is named here, and every route comes from
:mod:`mrcstack.addrplan`, so the kernel forwards exactly as the simulator and the core
assume.  The builder (:mod:`mrcstack.netns.testbed`) only feeds these lines to ``ip -batch``:

- ``root_lines``: one ``ip -batch`` in the root namespace: every ``netns add``, the
  management bridge, and every veth pair created directly with both ends in their
  namespaces (``link add A netns X type veth peer name B netns Y``).
- ``setup[ns]`` then ``routes[ns]``: one ``ip -6 -n NS -batch`` per namespace.
- ``sysctls[ns]``: /proc/sys files written from inside each namespace.
- ``shaping[ns]``: ``tc -batch`` lines (tbf on both ends of every shaped link).

Naming (``{name}`` is the testbed name, ``[a-z][a-z0-9]{0,5}``):

- namespace of node N: ``{name}-N`` (``mrc-h0``, ``mrc-p0-t0a``, ``mrc-p0-t1c``);
- in a switch, the port to a peer is the peer's short name (``h0``, ``t0a``, ``t1c``);
  in a host, the port of plane p is ``nic{p}`` and the management port is ``mgmt``;
- every switch has an ``ifb`` device ``sid`` that carries its uN route, so the route
  survives any port going down (the kernel refuses a seg6local route through ``lo``);
- root namespace: bridge ``{name}-br``, management veths ``{name}-m{host}``.

Addresses: every veth end has the static link-local ``fe80::1`` (the end named first in
the canonical link name: host < T0 < T1) or ``fe80::2``; routes say ``via fe80::2 dev t1c``.
Plain IPv6 baseline (for kernel TCP/MPTCP): plane p, rack r owns ``fdb0:0:p:r::/64``, host h
of that rack has ``fdb0:0:p:r::1:<h>`` (hex) on ``lo``, routed out of ``nic{p}``; its NIC
SIDs are on ``lo`` too (``nodad``: usable at once as a route's ``src``, and they survive
port flaps).  Management: a ULA /64 derived from the testbed name; the bridge holds
``::1``, host h holds ``::1:<h>``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from ipaddress import IPv6Address, IPv6Network

from mrcstack.addrplan import (
    HOST,
    LOCATOR_BITS,
    T0,
    USID_BITS,
    canonical_link,
    classic_sid,
    fabric_links,
    nic_plane_prefix,
    nic_sid,
    nic_usid,
    parse_link,
    parse_node,
    static_routes,
    switch_locator,
    switch_usid,
    t0_usid,
)
from mrcstack.fabric import LOCATOR_BLOCK_BITS, Fabric
from mrcstack.netns.state import LinkEnd, LinkRecord, TestbedState, check_name

MGMT_IF = "mgmt"
SID_IF = "sid"  # the ifb device a switch's uN route points at
LOWER_LL = IPv6Address("fe80::1")  # the first-named end of a link
UPPER_LL = IPv6Address("fe80::2")
BASELINE_PREFIX = 0xFDB0 << 112  # fdb0:0:<plane>:<rack>::/64
#: fib_multipath_hash_fields: source and destination address, protocol, flow label, source
#: and destination port (0x01 | 0x02 | 0x04 | 0x08 | 0x10 | 0x20).
MULTIPATH_HASH_FIELDS = "0x3f"
HOST_IID = 1 << 16  # interface id ::1:<host> (baseline and management)
MGMT_SALT = b"mrcstack-mgmt:"
T0_PLANE_PREFIX = LOCATOR_BLOCK_BITS + 8  # block + the "1<plane>" byte of every T0 uSID
MAX_IFNAME = 15  # IFNAMSIZ - 1
END_FLAVOR = f"flavors next-csid lblen {LOCATOR_BLOCK_BITS} nflen {USID_BITS}"
MIN_BURST_MTUS = 2  # tbf bucket: at least two full packets...
BURST_SECONDS = 0.001  # ...or one millisecond at the shaped rate, whichever is larger


def netns_name(name: str, node: str) -> str:
    return f"{name}-{node}"


def bridge_name(name: str) -> str:
    return f"{name}-br"


def mgmt_port_name(name: str, host: int) -> str:
    return f"{name}-m{host}"


def probe_netns(name: str) -> str:
    """The throwaway namespace feature detection uses (removed by ``clean`` too)."""
    return f"{name}-probe"


def nic_name(plane: int) -> str:
    return f"nic{plane}"


def port_name(node: str, peer: str, plane: int) -> str:
    """The interface in ``node``'s namespace that leads to ``peer`` (on ``plane``)."""
    return nic_name(plane) if parse_node(node).kind == HOST else parse_node(peer).short


def baseline_prefix(plane: int, rack: int) -> IPv6Network:
    return IPv6Network((BASELINE_PREFIX | plane << 80 | rack << 64, 64))


def baseline_plane_prefix(plane: int) -> IPv6Network:
    return IPv6Network((BASELINE_PREFIX | plane << 80, 48))


def baseline_address(fabric: Fabric, plane: int, host: int) -> IPv6Address:
    """The plain IPv6 address of ``host`` on ``plane``: routed by the kernel, ECMP at T0."""
    prefix = baseline_prefix(plane, fabric.rack_of(host))
    return IPv6Address(int(prefix.network_address) | HOST_IID | host)


def mgmt_prefix(name: str) -> IPv6Network:
    """The management /64: fd00::/8 + 40 bits of SHA-256 of the name (RFC 4193 style)."""
    digest = hashlib.sha256(MGMT_SALT + check_name(name).encode()).digest()
    global_id = int.from_bytes(digest[:5], "big")
    return IPv6Network(((0xFD << 120) | (global_id << 80), 64))


def mgmt_address(name: str, host: int) -> IPv6Address:
    return IPv6Address(int(mgmt_prefix(name).network_address) | HOST_IID | host)


def mgmt_gateway(name: str) -> IPv6Address:
    """The bridge's address in the root namespace."""
    return IPv6Address(int(mgmt_prefix(name).network_address) | 1)


def tbf_line(ifname: str, rate_bps: float, queue_bytes: int, mtu: int) -> str:
    """A ``tc -batch`` line shaping egress of ``ifname``: tbf at the rate, queue in bytes."""
    if rate_bps <= 0 or queue_bytes <= 0 or mtu <= 0:
        raise ValueError(f"bad shaping {rate_bps=} {queue_bytes=} {mtu=}")
    burst = max(MIN_BURST_MTUS * (mtu + 64), int(rate_bps / 8 * BURST_SECONDS))
    return (
        f"qdisc replace dev {ifname} root tbf rate {int(rate_bps)}bit "
        f"burst {burst} limit {queue_bytes}"
    )


def end_route(fabric: Fabric, switch: str) -> str:
    """The switch's own uN SID: End with the NEXT-C-SID flavour, counted."""
    locator = switch_locator(fabric, switch_usid(switch))
    return f"route replace {locator} encap seg6local action End {END_FLAVOR} count dev {SID_IF}"


def classic_end_route(fabric: Fabric, switch: str) -> str:
    """The switch's classic SID (``sid_format = "classic"``): the kernel's plain End, counted,
    for paths that carry an SRH."""
    sid = classic_sid(fabric, switch_usid(switch))
    return f"route replace {sid}/128 encap seg6local action End count dev {SID_IF}"


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything a testbed consists of, as names and ``ip``/``tc`` lines."""

    name: str
    fabric: Fabric
    netns: dict[str, str]  # node -> namespace, hosts first then switches in plane order
    links: dict[str, LinkRecord]  # canonical link name -> both ends
    bridge: str
    mgmt_ports: dict[str, str]  # host -> root-namespace veth on the bridge
    mgmt: dict[str, str]  # host -> management address
    baseline: dict[str, list[str]]  # host -> plain IPv6 address per plane
    root_lines: list[str]  # one `ip -batch` in the root namespace
    setup: dict[str, list[str]]  # namespace -> `ip -6 -batch` lines before the routes
    routes: dict[str, list[str]]  # namespace -> `route replace` lines
    sysctls: dict[str, dict[str, str]]  # namespace -> {path under /proc/sys: value}
    shaping: dict[str, list[str]]  # namespace -> `tc -batch` lines (empty when unshaped)

    @property
    def root_links(self) -> tuple[str, ...]:
        return (self.bridge, *self.mgmt_ports.values())

    @property
    def switches(self) -> list[str]:
        return [n for n in self.netns if parse_node(n).kind != HOST]

    def state(self, *, complete: bool = False) -> TestbedState:
        return TestbedState(
            name=self.name,
            fabric=self.fabric,
            netns=dict(self.netns),
            links=dict(self.links),
            routes={ns: list(lines) for ns, lines in self.routes.items()},
            mgmt=dict(self.mgmt),
            bridge=self.bridge,
            mgmt_prefix=str(mgmt_prefix(self.name)),
            root_links=self.root_links,
            baseline={h: list(a) for h, a in self.baseline.items()},
            complete=complete,
        )


def plan(fabric: Fabric, name: str) -> Plan:
    """The complete, deterministic plan of testbed ``name`` for ``fabric``."""
    check_name(name)
    hosts = [Fabric.host_name(h) for h in range(fabric.hosts)]
    switch_table = static_routes(fabric)
    nodes = hosts + list(switch_table)
    netns = {node: netns_name(name, node) for node in nodes}
    links = _links(fabric, netns)
    bridge = bridge_name(name)
    mgmt_ports = {Fabric.host_name(h): mgmt_port_name(name, h) for h in range(fabric.hosts)}
    mgmt = {Fabric.host_name(h): str(mgmt_address(name, h)) for h in range(fabric.hosts)}
    baseline = {
        Fabric.host_name(h): [str(baseline_address(fabric, p, h)) for p in range(fabric.planes)]
        for h in range(fabric.hosts)
    }
    ports: dict[str, list[tuple[LinkEnd, IPv6Address]]] = {ns: [] for ns in netns.values()}
    for rec in links.values():
        ports[rec.a.netns].append((rec.a, LOWER_LL))
        ports[rec.b.netns].append((rec.b, UPPER_LL))

    setup: dict[str, list[str]] = {}
    routes: dict[str, list[str]] = {}
    sysctls: dict[str, dict[str, str]] = {}
    for node in nodes:
        ns = netns[node]
        lines = ["link set dev lo up"]
        for end, ll in ports[ns]:
            lines += [
                f"link set dev {end.ifname} addrgenmode none",
                f"address add {ll}/64 dev {end.ifname} nodad",
            ]
        if parse_node(node).kind == HOST:
            host = parse_node(node).index
            lines += _host_setup(fabric, name, host, baseline[node])
            routes[ns] = _host_routes(fabric, host)
        else:
            lines += [f"link add name {SID_IF} type ifb", f"link set dev {SID_IF} up"]
            routes[ns] = _switch_routes(fabric, node, switch_table[node], links)
        lines += [f"link set dev {end.ifname} up" for end, _ in ports[ns]]
        setup[ns] = lines
        sysctls[ns] = _sysctls(fabric, node, [end.ifname for end, _ in ports[ns]])

    return Plan(
        name=name,
        fabric=fabric,
        netns=netns,
        links=links,
        bridge=bridge,
        mgmt_ports=mgmt_ports,
        mgmt=mgmt,
        baseline=baseline,
        root_lines=_root_lines(fabric, name, netns, links, mgmt_ports),
        setup=setup,
        routes=routes,
        sysctls=sysctls,
        shaping=_shaping(fabric, links),
    )


def _links(fabric: Fabric, netns: dict[str, str]) -> dict[str, LinkRecord]:
    links: dict[str, LinkRecord] = {}
    for link in fabric_links(fabric):
        plane, a, b = parse_link(link)
        host_facing = parse_node(a).kind == HOST
        links[link] = LinkRecord(
            name=link,
            a=LinkEnd(a, netns[a], port_name(a, b, plane)),
            b=LinkEnd(b, netns[b], port_name(b, a, plane)),
            host_facing=host_facing,
        )
    return links


def _root_lines(
    fabric: Fabric,
    name: str,
    netns: dict[str, str],
    links: dict[str, LinkRecord],
    mgmt_ports: dict[str, str],
) -> list[str]:
    bridge = bridge_name(name)
    lines = [f"netns add {ns}" for ns in netns.values()]
    lines += [
        f"link add name {bridge} type bridge",
        f"link set dev {bridge} addrgenmode none",
        f"address add {mgmt_gateway(name)}/64 dev {bridge} nodad",
        f"link set dev {bridge} up",
    ]
    for host, port in mgmt_ports.items():
        lines += [
            f"link add name {port} type veth peer name {MGMT_IF} netns {netns[host]}",
            f"link set dev {port} addrgenmode none",
            f"link set dev {port} master {bridge} up",
        ]
    mtu = fabric.mtu
    for rec in links.values():
        lines.append(
            f"link add name {rec.a.ifname} mtu {mtu} netns {rec.a.netns} "
            f"type veth peer name {rec.b.ifname} mtu {mtu} netns {rec.b.netns}"
        )
    return lines


def _host_setup(fabric: Fabric, name: str, host: int, baseline: list[str]) -> list[str]:
    lines = []
    for plane in range(fabric.planes):
        lines += [
            f"address add {nic_sid(fabric, plane, host)}/128 dev lo nodad",
            f"address add {baseline[plane]}/128 dev lo nodad",
        ]
    lines += [
        f"link set dev {MGMT_IF} addrgenmode none",
        f"address add {mgmt_address(name, host)}/64 dev {MGMT_IF} nodad",
        f"link set dev {MGMT_IF} up",
    ]
    return lines


def _host_routes(fabric: Fabric, host: int) -> list[str]:
    """A host owns its NIC SIDs (local /48) and sends every uSID path of plane p, which
    starts with a T0 uSID 0x1<p>xx, out of ``nic{p}``; plain IPv6 of plane p likewise."""
    lines = []
    for plane in range(fabric.planes):
        sid = nic_sid(fabric, plane, host)
        first_t0 = switch_locator(fabric, t0_usid(plane, 0)).network_address
        t0s = IPv6Network((first_t0, T0_PLANE_PREFIX))
        nic = nic_name(plane)
        lines += [
            f"route replace local {sid}/{LOCATOR_BITS} dev lo",
            f"route replace {t0s} via {UPPER_LL} dev {nic} src {sid}",
            # Plain (ECMP) and SRH traffic to the plane's other NICs leaves by the same NIC.
            f"route replace {nic_plane_prefix(fabric, plane)} via {UPPER_LL} dev {nic} src {sid}",
            f"route replace {baseline_plane_prefix(plane)} via {UPPER_LL} dev {nic} "
            f"src {baseline_address(fabric, plane, host)}",
        ]
    return lines


def _switch_routes(
    fabric: Fabric, switch: str, table: dict[int, str], links: dict[str, LinkRecord]
) -> list[str]:
    node = parse_node(switch)
    plane = node.plane
    if plane is None:  # pragma: no cover - callers pass switches only
        raise ValueError(f"{switch} is not a switch")

    def via(peer: str) -> str:
        rec = links[canonical_link(f"p{plane}:{node.short}-{parse_node(peer).short}")]
        gateway = LOWER_LL if rec.a.node == peer else UPPER_LL
        return f"via {gateway} dev {rec.end(switch).ifname}"

    lines = [end_route(fabric, switch)]
    if fabric.sid_format == "classic":
        lines.append(classic_end_route(fabric, switch))
    lines += [
        f"route replace {switch_locator(fabric, usid)} {via(nxt)}" for usid, nxt in table.items()
    ]
    # Plain destinations, routed by the kernel (ECMP over the T1s at a T0): the baseline
    # addresses, and the NIC addresses for MRC's UDP/STEV EV format.
    if node.kind == T0:
        rack = node.index
        first = rack * fabric.hosts_per_rack
        for host in range(first, first + fabric.hosts_per_rack):
            addr = baseline_address(fabric, plane, host)
            lines.append(f"route replace {addr}/128 {via(Fabric.host_name(host))}")
        uplinks = " ".join(
            f"nexthop {via(Fabric.t1_name(plane, t1))}" for t1 in range(fabric.t1_per_plane)
        )
        for other in range(fabric.racks):
            if other != rack:
                lines.append(f"route replace {baseline_prefix(plane, other)} {uplinks}")
                for host in _rack_hosts(fabric, other):
                    nic = switch_locator(fabric, nic_usid(plane, host))
                    lines.append(f"route replace {nic} {uplinks}")
    else:
        for rack in range(fabric.racks):
            t0 = via(Fabric.t0_name(plane, rack))
            lines.append(f"route replace {baseline_prefix(plane, rack)} {t0}")
            for host in _rack_hosts(fabric, rack):
                if nic_usid(plane, host) not in table:
                    lines.append(
                        f"route replace {switch_locator(fabric, nic_usid(plane, host))} {t0}"
                    )
    return lines


def _rack_hosts(fabric: Fabric, rack: int) -> range:
    return range(rack * fabric.hosts_per_rack, (rack + 1) * fabric.hosts_per_rack)


def _sysctls(fabric: Fabric, node: str, ports: list[str]) -> dict[str, str]:
    kind = parse_node(node).kind
    values = {
        "net/ipv6/conf/all/keep_addr_on_down": "1",  # keeps global addresses only
        "net/ipv6/conf/all/accept_dad": "0",
        "net/ipv6/conf/default/accept_dad": "0",
    }
    if kind == HOST:
        if fabric.sid_format == "classic":  # a host takes packets whose SRH ends at it
            for ifname in ("all", "default", "lo", *ports):
                values[f"net/ipv6/conf/{ifname}/seg6_enabled"] = "1"
        return values
    values["net/ipv6/conf/all/forwarding"] = "1"
    for ifname in ("all", "default", "lo", SID_IF, *ports):
        values[f"net/ipv6/conf/{ifname}/seg6_enabled"] = "1"
    if kind == T0:
        # ECMP on addresses, protocol, ports and the flow label: what the UDP/STEV EV format
        # writes its EV into (policy 3 hashes the fields named in fib_multipath_hash_fields).
        values["net/ipv6/fib_multipath_hash_policy"] = "3"
        values["net/ipv6/fib_multipath_hash_fields"] = MULTIPATH_HASH_FIELDS
    return values


def _shaping(fabric: Fabric, links: dict[str, LinkRecord]) -> dict[str, list[str]]:
    shaping: dict[str, list[str]] = {}
    for rec in links.values():
        rate = fabric.host_link_bps if rec.host_facing else fabric.fabric_link_bps
        if rate is None:
            continue
        for end in (rec.a, rec.b):
            line = tbf_line(end.ifname, rate, fabric.queue_bytes, fabric.mtu)
            shaping.setdefault(end.netns, []).append(line)
    return shaping
