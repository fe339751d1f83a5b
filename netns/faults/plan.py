"""Planning faults, as pure functions: names, probabilities, nftables rules, route lines.

Nothing here touches the system: :mod:`.harness` records what these functions produce
(:mod:`.records`) and :mod:`.ops` runs it.  Kept apart so every rule the harness installs
can be unit-tested without root.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from mrcstack.addrplan import (
    HOST,
    LOCATOR_BITS,
    active_usid,
    canonical_link,
    link_name,
    parse_link,
    parse_node,
    switch_locator,
    switch_usid,
    usid_owner,
)
from mrcstack.fabric import Fabric
from mrcstack.netns.run import TestbedError
from mrcstack.netns.state import LinkRecord, plane_of

NUMGEN_MOD = 1_000_000  # loss probability resolution: 1e-6
NFT_PRIORITY = -300  # before anything else in the hook (the "raw" priority)
NFT_TABLE_PREFIX = "mrcfault_"  # one nft table per fault: mrcfault_<id>


class FaultError(TestbedError):
    """A fault cannot be applied or undone; the message is one line naming the problem."""


# Names -> fabric objects (pure) -------------------------------------------------------------
def resolve_link(fabric: Fabric, a: str, b: str | None = None) -> str:
    """The canonical name of a link given as "p0:t0a-t1c" or as two node names, checked
    against the fabric ("p0-t1c", "p0-t0a" -> "p0:t0a-t1c")."""
    try:
        name = a if b is None else link_name(plane_of(a, b), a, b)
        parse_link(name, fabric)
        return canonical_link(name)
    except ValueError as exc:
        shown = a if b is None else f"{a} {b}"
        raise FaultError(f"bad link {shown!r}: {exc}") from None


def link_ends(link: str) -> tuple[str, str]:
    """The two node names of a canonical link, host/T0 first."""
    _, a, b = parse_link(link)
    return a, b


def resolve_switch(fabric: Fabric, text: str) -> str:
    """A switch given by node name ("p0-t1c"), uSID ("2002", "0x2002") or address/prefix in
    its locator ("fcbb:bb00:2002::", "fcbb:bb00:2002::/48"), checked against the fabric."""
    try:
        name = _switch_name(fabric, text.strip())
        node = parse_node(name)
        if node.plane is None:
            raise ValueError(f"{name} is a host, not a switch")
        fabric.check_plane(node.plane)
        top = fabric.racks if node.kind == "t0" else fabric.t1_per_plane
        if node.index >= top:
            raise ValueError(f"{name} is not in this fabric")
        return name
    except ValueError as exc:
        raise FaultError(f"bad switch {text!r}: {exc}") from None


def _switch_name(fabric: Fabric, text: str) -> str:
    if text.startswith("p") or text.startswith("h"):
        return parse_node(text).name
    if ":" not in text:
        usid = int(text, 16)
        return usid_owner(usid)[1]
    net = ipaddress.IPv6Network(text, strict=False)
    if net.prefixlen not in (LOCATOR_BITS, 128):
        raise ValueError(f"a switch locator is a /{LOCATOR_BITS}, got /{net.prefixlen}")
    value = int(net.network_address)
    if value & ~((1 << 96) - 1) != fabric.block:
        raise ValueError(f"not in the locator block {fabric.locator_block}/32")
    if value & ((1 << (128 - LOCATOR_BITS)) - 1):
        raise ValueError(
            "it names a path (more than one uSID), not a switch: give the switch's "
            f"/{LOCATOR_BITS} or its name"
        )
    return usid_owner(active_usid(value))[1]


def parse_probability(value: str | float) -> float:
    """A loss/trim probability from 0.2, "0.2" or "20%"; must be in (0, 1]."""
    try:
        if isinstance(value, str):
            text = value.strip()
            number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError
        else:
            number = float(value)
    except ValueError:
        raise FaultError(f"bad rate {value!r}: expected a probability like 0.2 or 20%") from None
    if not 0.0 < number <= 1.0:
        raise FaultError(f"bad rate {value!r}: must be in (0, 1] (use `loss clear` for none)")
    return number


def directions(link: str, from_node: str | None = None) -> list[tuple[str, str]]:
    """(sender, receiver) pairs of a link: both ways, or only from ``from_node``."""
    a, b = link_ends(link)
    if from_node is None:
        return [(a, b), (b, a)]
    if from_node not in (a, b):
        raise FaultError(f"{from_node} is not an end of {link} ({a}, {b})")
    return [(from_node, b if from_node == a else a)]


def is_host(node: str) -> bool:
    return parse_node(node).kind == HOST


def tier_rate(fabric: Fabric, link: str) -> float | None:
    """The rate the testbed shapes a link with: the fabric's host or fabric tier rate (None
    when that tier is unshaped)."""
    a, _ = link_ends(link)
    return fabric.host_link_bps if is_host(a) else fabric.fabric_link_bps


def trim_settings(
    fabric: Fabric,
    link: str,
    receiver: str,
    *,
    threshold_bytes: int,
    ecn_threshold_bytes: int | None,
    rate_bps: float | None,
    probability: float | None,
    queue_bytes: int | None,
) -> dict[str, Any]:
    """The trim program's settings (:func:`mrcstack.netns.trim.attach` keywords) for the egress port
    of ``link`` toward ``receiver``.  The rate defaults to the link's tier rate (an unshaped
    link needs one given), the queue to ``fabric.queue_bytes``; last hop when the port faces
    a host.  In congestion mode on a shaped port the threshold must be below the queue, or
    the queue would tail-drop before anything is trimmed."""
    if rate_bps is None:
        rate_bps = tier_rate(fabric, link)
        if rate_bps is None:
            raise FaultError(f"trim {link}: the link is unshaped, give its rate (--rate)")
    if not rate_bps >= 0:
        raise FaultError(f"trim {link}: bad rate {rate_bps!r}")
    queue = fabric.queue_bytes if queue_bytes is None else int(queue_bytes)
    if probability is None and rate_bps and not threshold_bytes < queue:
        raise FaultError(
            f"trim {link}: threshold {threshold_bytes} bytes is not below the queue "
            f"({queue} bytes): nothing would ever be trimmed"
        )
    return {
        "rate_bps": int(rate_bps),
        "trim_threshold_bytes": int(threshold_bytes),
        "ecn_threshold_bytes": ecn_threshold_bytes,
        "last_hop": is_host(receiver),
        "probability": probability,
        "queue_bytes": queue,
    }


# nftables rules (pure) ----------------------------------------------------------------------
def nft_table_name(fault_id: int) -> str:
    return f"{NFT_TABLE_PREFIX}{fault_id}"


def nft_random_drop(rate: float) -> str:
    """The statement dropping a packet with probability ``rate`` (numgen, 1e-6 steps)."""
    threshold = round(rate * NUMGEN_MOD)
    if not 0 < threshold <= NUMGEN_MOD:
        raise FaultError(f"rate {rate!r} rounds to {threshold}/{NUMGEN_MOD}: out of (0, 1]")
    if threshold == NUMGEN_MOD:
        return "counter drop"
    return f"numgen random mod {NUMGEN_MOD} < {threshold} counter drop"


def nft_ruleset(table: str, hook: str, rules: Sequence[str]) -> str:
    """An ``nft -f`` script creating one inet table with one filter chain on ``hook``."""
    if hook not in ("prerouting", "forward"):
        raise ValueError(f"hook {hook!r}")
    body = "".join(f"    {rule}\n" for rule in rules)
    return (
        f"table inet {table} {{\n"
        f"  chain c_{hook} {{\n"
        f"    type filter hook {hook} priority {NFT_PRIORITY}; policy accept;\n"
        f"{body}"
        "  }\n"
        "}\n"
    )


def loss_site(record: LinkRecord, sender: str) -> tuple[str, str]:
    """Where packets ``sender`` puts on this link are seen by a forward hook: (namespace,
    match).  A switch's egress port (``oifname``), or for a host, its T0's ingress port."""
    end, peer = record.end(sender), record.peer(sender)
    if not is_host(sender):
        return end.netns, f'oifname "{_ifname(end.ifname)}"'
    return peer.netns, f'iifname "{_ifname(peer.ifname)}"'


def _ifname(name: str) -> str:
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise FaultError(f"unexpected interface name {name!r}")
    return name


def path_loss_rule(fabric: Fabric, switch: str, rate: float) -> str:
    """The prerouting rule at ``switch`` that drops packets arriving with its uSID active."""
    locator = switch_locator(fabric, switch_usid(switch))
    return f"ip6 daddr {locator} {nft_random_drop(rate)}"


# Route lines (pure) -------------------------------------------------------------------------
def _tokens_dev(tokens: list[str]) -> list[str]:
    return [tokens[i + 1] for i, tok in enumerate(tokens[:-1]) if tok == "dev"]


def routes_avoiding(lines: Sequence[str], down: set[str]) -> list[str]:
    """The recorded route lines that can be installed while the ports in ``down`` are down:
    single-device lines through them are left out, and a multipath line keeps only its
    nexthops through ports that are up (left out when none is)."""
    kept: list[str] = []
    for line in lines:
        tokens = line.split()
        if "nexthop" not in tokens:
            if not set(_tokens_dev(tokens)) & down:
                kept.append(line)
            continue
        first = tokens.index("nexthop")
        head, hops, current = tokens[:first], [], list[str]()
        for tok in tokens[first:]:
            if tok == "nexthop" and current:
                hops.append(current)
                current = []
            current.append(tok)
        hops.append(current)
        alive = [hop for hop in hops if not set(_tokens_dev(hop)) & down]
        if alive:
            kept.append(" ".join(head + [tok for hop in alive for tok in hop]))
    return kept


def as_replace(line: str) -> str:
    """A route line as ``route replace`` (idempotent)."""
    tokens = line.split()
    for i, tok in enumerate(tokens[:-1]):
        if tok == "route" and tokens[i + 1] in ("add", "append", "replace", "change"):
            tokens[i + 1] = "replace"
            return " ".join(tokens)
    raise FaultError(f"not a route line: {line!r}")


# Time ---------------------------------------------------------------------------------------
def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
