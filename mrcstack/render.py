"""Switch configurations for real hardware, from the fabric description the testbed uses.

``mrcstack render --fabric FILE --format linux|frr|sonic [--switch NAME] [--out DIR]``
prints each switch's uSID configuration, or writes one file per switch into ``DIR``
(``p0-t0a.batch``, ``p0-t0a.frr.conf``, ``p0-t0a.json``): its uN SID (End with NEXT-C-SID
on its /48 locator) and its static table (one route per next uSID, from
:func:`mrcstack.addrplan.static_routes`):

- ``linux``: an ``ip -batch`` file for a Linux whitebox switch;
- ``frr``: FRR configuration (an SRv6 locator, a static uN SID, static IPv6 routes);
- ``sonic``: ``config_db.json`` entries (``SRV6_MY_LOCATORS``, ``SRV6_MY_SIDS``,
  ``STATIC_ROUTE``).

Ports are named after the neighbour (``t1a``, ``t0b``, ``h0``), and the next hop on a port is
the neighbour's link-local address: ``fe80::1`` for the end named first in the canonical
link name (host < T0 < T1), ``fe80::2`` for the other, as on the testbed.  ``--port
PEER=IFNAME`` renames a port (``--port t1a=Ethernet0``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from ipaddress import IPv6Address
from pathlib import Path

from mrcstack import add_version_flag
from mrcstack.addrplan import (
    USID_BITS,
    canonical_link,
    parse_node,
    static_routes,
    switch_locator,
    switch_usid,
)
from mrcstack.errors import LocalError
from mrcstack.fabric import LOCATOR_BLOCK_BITS, Fabric, FabricConfigError

FORMATS = ("linux", "frr", "sonic")
LOWER_LL = IPv6Address("fe80::1")  # the end named first in the canonical link name
UPPER_LL = IPv6Address("fe80::2")
SID_DEV = "sid"  # the device the uN route points at (the kernel refuses one through lo)


class RenderError(LocalError):
    """A switch or option that the fabric does not have."""


def switches(fabric: Fabric) -> list[str]:
    return list(static_routes(fabric))


def next_hops(
    fabric: Fabric, switch: str, ports: Mapping[str, str] | None = None
) -> list[tuple[str, str, IPv6Address, str]]:
    """``(locator, port, gateway, neighbour)`` for each entry of the switch's table."""
    table = static_routes(fabric).get(switch)
    if table is None:
        raise RenderError(f"no switch {switch!r} in this fabric (try one of "
                          f"{', '.join(switches(fabric)[:4])}, ...)")  # fmt: skip
    node = parse_node(switch)
    out = []
    for usid, peer in table.items():
        link = canonical_link(f"p{node.plane}:{node.short}-{parse_node(peer).short}")
        first = link.split(":", 1)[1].split("-", 1)[0]
        gateway = LOWER_LL if parse_node(peer).short == first else UPPER_LL
        port = (ports or {}).get(parse_node(peer).short, parse_node(peer).short)
        out.append((str(switch_locator(fabric, usid)), port, gateway, peer))
    return out


def linux(fabric: Fabric, switch: str, ports: Mapping[str, str] | None = None) -> str:
    own = switch_locator(fabric, switch_usid(switch))
    hops = next_hops(fabric, switch, ports)
    lines = [
        f"# {switch}: uN {switch_usid(switch):04x} on {own}; apply with `ip -batch FILE`.",
        "# Needs: sysctl net.ipv6.conf.all.forwarding=1 and net.ipv6.conf.all.seg6_enabled=1",
        f"# (and seg6_enabled=1 on every port: {', '.join(sorted({h[1] for h in hops}))});",
        f"# each port has its link-local address ({LOWER_LL} or {UPPER_LL}, see the next hops).",
        f"link add {SID_DEV} type ifb",
        f"link set {SID_DEV} up",
        f"route replace {own} encap seg6local action End flavors next-csid "
        f"lblen {LOCATOR_BLOCK_BITS} nflen {USID_BITS} count dev {SID_DEV}",
    ]
    lines += [f"route replace {loc} via {gw} dev {port}" for loc, port, gw, _ in hops]
    return "\n".join(lines) + "\n"


def frr(fabric: Fabric, switch: str, ports: Mapping[str, str] | None = None) -> str:
    own = switch_locator(fabric, switch_usid(switch))
    lines = [
        f"! {switch}: uN {switch_usid(switch):04x}.  Needs an FRR whose staticd supports",
        "! `segment-routing srv6 static-sids` (static SRv6 SIDs) and a kernel with SRv6.",
        "segment-routing",
        " srv6",
        "  locators",
        f"   locator {switch}",
        f"    prefix {own} block-len {LOCATOR_BLOCK_BITS} node-len {USID_BITS} func-bits 0",
        "    behavior usid",
        "   exit",
        "  exit",
        "  static-sids",
        f"   sid {own} locator {switch} behavior uN",
        "  exit",
        " exit",
        "exit",
    ]
    lines += [
        f"ipv6 route {loc} {gw} {port}" for loc, port, gw, _ in next_hops(fabric, switch, ports)
    ]
    return "\n".join(lines) + "\n"


def sonic(fabric: Fabric, switch: str, ports: Mapping[str, str] | None = None) -> dict[str, object]:
    own = switch_locator(fabric, switch_usid(switch))
    return {
        "SRV6_MY_LOCATORS": {
            switch: {
                "prefix": str(own.network_address),
                "block_len": str(LOCATOR_BLOCK_BITS),
                "node_len": str(USID_BITS),
                "func_len": "0",
                "arg_len": "0",
            }
        },
        "SRV6_MY_SIDS": {f"{switch}|{own}": {"action": "uN"}},
        "STATIC_ROUTE": {
            f"default|{loc}": {"nexthop": str(gw), "ifname": port}
            for loc, port, gw, _ in next_hops(fabric, switch, ports)
        },
    }


def render(
    fabric: Fabric, fmt: str, switch_names: Sequence[str], ports: Mapping[str, str] | None = None
) -> str:
    if fmt not in FORMATS:
        raise RenderError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    known = switches(fabric)
    names = list(switch_names) or known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise RenderError(f"no switch {unknown[0]!r} in this fabric (switches: "
                          f"{', '.join(known[:3])}, ... {known[-1]})")  # fmt: skip
    if fmt == "sonic":
        docs = {name: sonic(fabric, name, ports) for name in names}
        return json.dumps(docs if len(names) > 1 else docs[names[0]], indent=2) + "\n"
    make = linux if fmt == "linux" else frr
    return "\n".join(make(fabric, name, ports) for name in names)


#: The file each format writes per switch with --out.
SUFFIXES = {"linux": ".batch", "frr": ".frr.conf", "sonic": ".json"}


def write_files(
    fabric: Fabric,
    fmt: str,
    switch_names: Sequence[str],
    out: Path,
    ports: Mapping[str, str] | None = None,
) -> list[Path]:
    """One file per switch in ``out`` (created if missing): each switch's :func:`render`."""
    names = list(switch_names) or switches(fabric)
    render(fabric, fmt, names, ports)  # every name checked before anything is written
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        path = out / f"{name}{SUFFIXES[fmt]}"
        path.write_text(render(fabric, fmt, [name], ports))
        written.append(path)
    return written


def _ports(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        peer, sep, ifname = item.partition("=")
        if not sep or not peer or not ifname:
            raise RenderError(f"--port {item!r}: expected PEER=IFNAME, like t1a=Ethernet0")
        out[peer] = ifname
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mrcstack render", description=__doc__.split("\n\n")[0])
    add_version_flag(p)
    p.add_argument("--fabric", help="fabric TOML (default: the default fabric)")
    p.add_argument("--format", required=True, choices=FORMATS, help="what to write")
    p.add_argument("--switch", action="append", default=[], help="a switch, like p0-t0a")
    p.add_argument(
        "--port", action="append", default=[], metavar="PEER=IFNAME",
        help="name the port to a neighbour (t1a=Ethernet0); repeat for more",
    )  # fmt: skip
    p.add_argument(
        "--out", metavar="DIR", type=Path,
        help="write one file per switch into DIR (p0-t0a.batch, .frr.conf, .json) "
        "instead of printing them all",
    )  # fmt: skip
    args = p.parse_args(argv)
    try:
        fabric = Fabric.load(args.fabric) if args.fabric else Fabric()
        ports = _ports(args.port)
        if args.out is not None:
            written = write_files(fabric, args.format, args.switch, args.out, ports)
            print(f"wrote {len(written)} files to {args.out}")
        else:
            sys.stdout.write(render(fabric, args.format, args.switch, ports))
    except (RenderError, FabricConfigError, OSError) as exc:
        print(f"mrcstack render: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
