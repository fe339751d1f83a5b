"""The fabric model: directional links with rate, delay and an egress queue; hosts at the edges.

Built for speed: one heap event per packet per hop and no per-packet queue objects.  An
egress queue is only a ``busy_until`` time: a packet reaching an egress at ``now`` sees
``max(0, busy_until - now) * rate / 8`` queued bytes, departs at ``max(now, busy_until)``
plus its serialization time and reaches the next node one propagation delay later.

Accounting (used everywhere, including the runner's capacity and goodput): a packet's size on
the wire is ``len(datagram) + WIRE_OVERHEAD_BYTES`` (outer IPv6 40 + UDP 8); Ethernet
framing is not modelled.

What travels is opaque to the network: encoded datagrams (:meth:`Network.send`), or any
message with its datagram length and traffic class (:meth:`Network.send_packet`: the runner
sends decoded packets, which it never needs to encode).  The trimmer is the one thing that
looks inside, to cut a data packet to its headers.

- Host NIC egress (host -> T0): unlimited queue (a NIC never drops its own packets), no ECN,
  no trimming; the runner keeps it short by pulling data from connections only as it drains.
- Traffic classes: control packets (ACK, NACK, probes; mrcd sends them as DSCP 46) and
  trimmed headers leave every egress, host NICs included, at strict priority: after only
  their own serialization, not behind queued data.  Control still counts against a switch
  port's buffer and is tail-dropped when it is full; trimmed headers never are.
- Switch egress: queue limit ``queue_bytes``.  With trimming on, a data packet that would push
  the queue over ``trim_threshold_bytes`` is cut to its headers (``TRIM_LASTHOP`` when the
  port faces a host) and leaves at high priority after only its own serialization (trimmed
  headers are never dropped for congestion); any other packet over the limit is tail-dropped.
  Data packets seeing more than ``ecn_kmin_bytes`` queued are CE-marked with a probability
  ramping linearly to 1 at ``ecn_kmax_bytes`` (RED style), except on a port facing a host:
  MRC marks only where another path could help.  ``ecn_last_hop`` marks there too, as a
  DCQCN fabric does (the receiver's own link is then a congestion signal for the sender).
- Faults: random loss per link (the packet still uses the link's bandwidth), failed links
  (a packet reaching the egress of a failed link is dropped; packets already on the wire
  arrive), and per-EV loss on chosen host pairs (applied on arrival, after the path's
  bandwidth was used).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from heapq import heappush
from typing import Any

from mrcstack import addrplan
from mrcstack.fabric import Fabric, letters
from mrcstack.sim.engine import Engine
from mrcstack.wire import WRITE_OPCODES, encode_trimmed

#: Outer IPv6 (40) + UDP (8) header bytes added to every datagram on the wire.
WIRE_OVERHEAD_BYTES = 48
DEFAULT_RATE_BPS = 100e9
DEFAULT_LINK_DELAY_S = 1e-6
#: Threshold defaults, as fractions of the switch queue limit.
DEFAULT_TRIM_FRACTION = 1 / 2
DEFAULT_ECN_KMIN_FRACTION = 1 / 16
DEFAULT_ECN_KMAX_FRACTION = 1 / 4
DATA_OPCODES = WRITE_OPCODES

#: (src host, dst host, plane, ev) -> directional link names from src to dst.
Router = Callable[[int, int, int, int], Sequence[str]]
#: (data packet, trimmed on a host-facing port) -> (trimmed packet, its datagram length).
Trimmer = Callable[[Any, bool], tuple[Any, int]]
#: Called on delivery at a host: (packet, its datagram length, plane, ecn_marked).
Handler = Callable[[Any, int, int, bool], None]


def trim_datagram(data: bytes, lasthop: bool) -> tuple[bytes, int]:
    """The default trimmer, for encoded datagrams: what a trimming switch does."""
    trimmed = encode_trimmed(data, lasthop)
    return trimmed, len(trimmed)


@dataclass(frozen=True, slots=True)
class NetParams:
    """Link and switch behaviour; ``None`` thresholds derive from the queue limit."""

    link_delay_s: float = DEFAULT_LINK_DELAY_S
    default_rate_bps: float = DEFAULT_RATE_BPS  # for links the fabric leaves unshaped
    queue_bytes: int | None = None  # switch egress limit; None = fabric.queue_bytes
    trim: bool = True
    trim_threshold_bytes: int | None = None
    ecn_kmin_bytes: int | None = None
    ecn_kmax_bytes: int | None = None
    loss: float = 0.0  # every link, both directions
    link_loss: tuple[tuple[str, float], ...] = ()  # physical link name, probability
    ev_loss: tuple[tuple[int, float], ...] = ()  # EV value, probability
    ecn_last_hop: bool = False  # mark on host-facing switch ports too

    def __post_init__(self) -> None:
        if not self.link_delay_s >= 0:
            raise ValueError(f"link delay must be >= 0, got {self.link_delay_s}")
        if not self.default_rate_bps > 0:
            raise ValueError(f"link rate must be positive, got {self.default_rate_bps}")
        for what, p in (
            ("loss", self.loss),
            *((f"loss of {n}", q) for n, q in self.link_loss),
            *((f"loss of EV {e}", q) for e, q in self.ev_loss),
        ):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{what} must be a probability in [0, 1], got {p}")
        for what, v in (
            ("queue", self.queue_bytes),
            ("trim threshold", self.trim_threshold_bytes),
            ("ECN kmin", self.ecn_kmin_bytes),
            ("ECN kmax", self.ecn_kmax_bytes),
        ):
            if v is not None and v <= 0:
                raise ValueError(f"{what} must be positive, got {v}")

    def thresholds(self, fabric: Fabric) -> tuple[int, int, int, int]:
        """(queue limit, trim threshold, ECN kmin, ECN kmax) in bytes, checked for order."""
        queue = fabric.queue_bytes if self.queue_bytes is None else self.queue_bytes
        trim = self.trim_threshold_bytes or int(queue * DEFAULT_TRIM_FRACTION)
        kmin = self.ecn_kmin_bytes or int(queue * DEFAULT_ECN_KMIN_FRACTION)
        kmax = self.ecn_kmax_bytes or max(kmin + 1, int(queue * DEFAULT_ECN_KMAX_FRACTION))
        if trim > queue:
            raise ValueError(f"trim threshold {trim} exceeds the queue limit {queue}")
        if kmax <= kmin:
            raise ValueError(f"ECN kmax {kmax} must exceed kmin {kmin}")
        return queue, trim, kmin, kmax


class Link:
    """One direction of a physical link, with its egress queue and counters."""

    __slots__ = (
        "busy_until",
        "byte_time",
        "bytes_per_s",
        "delay",
        "down",
        "drop_at",
        "drops_down",
        "drops_loss",
        "drops_queue",
        "ecn_marks",
        "last_hop",
        "loss",
        "mark_at",
        "max_queue",
        "name",
        "physical",
        "plane",
        "rate_bps",
        "switch_egress",
        "trim_at",
        "trims",
        "tx_bytes",
        "tx_packets",
    )

    def __init__(
        self,
        name: str,
        physical: str,
        plane: int,
        rate_bps: float,
        delay: float,
        *,
        switch_egress: bool,
        last_hop: bool,
    ) -> None:
        self.name = name
        self.physical = physical
        self.plane = plane
        self.rate_bps = rate_bps
        self.bytes_per_s = rate_bps / 8
        self.byte_time = 8 / rate_bps
        self.delay = delay
        self.switch_egress = switch_egress
        self.last_hop = last_hop
        self.loss = 0.0
        self.down = 0  # number of active failures (windows may overlap)
        self.busy_until = 0.0
        self.tx_packets = 0
        self.tx_bytes = 0
        self.trims = 0
        self.ecn_marks = 0
        self.drops_queue = 0
        self.drops_loss = 0
        self.drops_down = 0
        self.max_queue = 0.0
        # A switch egress's thresholds in queued bytes (set by the network; infinite: never):
        # a data packet that would take the queue past ``trim_at`` is trimmed, past
        # ``drop_at`` dropped (control too), and one that finds more than ``mark_at``
        # queued may be ECN-marked.
        self.trim_at = self.drop_at = self.mark_at = math.inf

    def counters(self) -> dict[str, int]:
        return {
            "packets": self.tx_packets,
            "bytes": self.tx_bytes,
            "trims": self.trims,
            "ecn_marks": self.ecn_marks,
            "drops_queue": self.drops_queue,
            "drops_loss": self.drops_loss,
            "drops_down": self.drops_down,
            "max_queue_bytes": int(self.max_queue),
        }


class _Packet:
    """A packet in flight (internal and mutable: trimming and marking change it)."""

    __slots__ = (
        "doomed",
        "dst",
        "ecn",
        "hop",
        "hops",
        "is_data",
        "msg",
        "plane",
        "priority",
        "route",
        "sent_at",
        "size",
        "src",
    )

    def __init__(
        self,
        msg: Any,
        size: int,
        is_data: bool,
        route: tuple[Link, ...],
        dst: int,
        plane: int,
        doomed: bool,
        sent_at: float,
        src: int,
    ) -> None:
        self.msg = msg
        self.src = src  # the sending host: whom a host's endpoint (QP 2) answers
        self.size = size  # bytes on the wire: the datagram and WIRE_OVERHEAD_BYTES
        self.sent_at = sent_at
        self.route = route
        self.hops = len(route)
        self.dst = dst
        self.plane = plane
        self.doomed = doomed
        self.hop = 0
        self.ecn = False
        self.is_data = is_data
        # Control (ACK, NACK, probes: mrcd's DSCP 46 class) rides the strict-priority
        # queue; a trimmed data packet joins it when trimmed.
        self.priority = not is_data


_new_packet = object.__new__


@dataclass(frozen=True, slots=True)
class NetStats:
    """Counters summed over all links, plus per-link detail for links that saw traffic."""

    packets_sent: int  # datagrams injected by hosts
    packets_delivered: int
    trims: int
    ecn_marks: int
    drops: dict[str, int]  # reason -> count: queue, loss, link_down, ev_loss
    links: dict[str, dict[str, int]]  # directional link name -> counters


class Network:
    """Hosts, switches and links of a multi-plane two-tier Clos, driven by an Engine."""

    def __init__(
        self,
        fabric: Fabric,
        engine: Engine,
        rng: random.Random,
        params: NetParams | None = None,
        *,
        router: Router | None = None,
        trimmer: Trimmer | None = None,
        ev_loss_pairs: Iterable[tuple[int, int]] | None = None,
    ) -> None:
        self.fabric = fabric
        self.engine = engine
        self.params = params = params or NetParams()
        self._rng = rng
        self._random = rng.random
        self._router = router or _addrplan_router(fabric)
        self._trimmer = trimmer or trim_datagram
        self.queue_bytes, self.trim_threshold, self.ecn_kmin, self.ecn_kmax = params.thresholds(
            fabric
        )
        self._ecn_span = self.ecn_kmax - self.ecn_kmin
        self.links: dict[str, Link] = {}  # directional name -> Link
        self.physical: dict[str, tuple[Link, Link]] = {}  # canonical name -> both directions
        self._node_links: dict[str, list[str]] = {}  # full node name -> canonical link names
        self._build()
        for link in self.links.values():
            link.loss = params.loss
        for name, p in params.link_loss:
            for link in self.physical[self.canonical(name)]:
                link.loss = p
        for link in self.links.values():
            if link.switch_egress:
                link.drop_at = self.queue_bytes
                if params.trim:
                    link.trim_at = self.trim_threshold
                if params.ecn_last_hop or not link.last_hop:
                    link.mark_at = self.ecn_kmin
        self._ev_loss = dict(params.ev_loss)
        self._ev_loss_pairs = None if ev_loss_pairs is None else frozenset(ev_loss_pairs)
        self._handlers: dict[int, Handler] = {}
        self._routes: dict[tuple[int, int, int, int], tuple[Link, ...]] = {}
        # The per-hop path pushes onto the engine's heap itself (see Engine.queue).
        self._engine = engine
        self._slots, self._times, self._tiebreak = engine.queue()
        self._forward_cb = self._forward
        self._deliver_cb = self._deliver
        self.packets_sent = 0
        self.packets_delivered = 0
        self.drops_ev_loss = 0
        self._delivering: _Packet | None = None  # the packet a handler is given

    # Topology -------------------------------------------------------------------------
    def _build(self) -> None:
        f = self.fabric
        host_rate = f.host_link_bps or self.params.default_rate_bps
        fabric_rate = f.fabric_link_bps or self.params.default_rate_bps
        for plane in range(f.planes):
            for host in range(f.hosts):
                rack = host // f.hosts_per_rack
                self._add(
                    plane,
                    (f"h{host}", f.host_name(host)),
                    (f"t0{letters(rack)}", f.t0_name(plane, rack)),
                    host_rate,
                    host_side=True,
                )
            for rack in range(f.racks):
                for t1 in range(f.t1_per_plane):
                    self._add(
                        plane,
                        (f"t0{letters(rack)}", f.t0_name(plane, rack)),
                        (f"t1{letters(t1)}", f.t1_name(plane, t1)),
                        fabric_rate,
                        host_side=False,
                    )

    def _add(
        self, plane: int, a: tuple[str, str], b: tuple[str, str], rate: float, *, host_side: bool
    ) -> None:
        name = f"p{plane}:{a[0]}-{b[0]}"
        reverse = f"p{plane}:{b[0]}-{a[0]}"
        delay = self.params.link_delay_s
        up = Link(name, name, plane, rate, delay, switch_egress=not host_side, last_hop=False)
        down = Link(reverse, name, plane, rate, delay, switch_egress=True, last_hop=host_side)
        self.links[name] = up
        self.links[reverse] = down
        self.physical[name] = (up, down)
        for node in (a[1], b[1]):
            self._node_links.setdefault(node, []).append(name)

    def canonical(self, name: str) -> str:
        """The physical link a directional name belongs to; ValueError if unknown."""
        link = self.links.get(name)
        if link is None:
            raise ValueError(f"no link named {name!r} in this fabric")
        return link.physical

    def host_link(self, host: int, plane: int) -> str:
        """The physical name of a host's link to its T0 in ``plane``."""
        self.fabric.check_host(host)
        self.fabric.check_plane(plane)
        rack = host // self.fabric.hosts_per_rack
        return f"p{plane}:h{host}-t0{letters(rack)}"

    def switch_links(self, node: str) -> list[str]:
        """Every physical link of a switch (full node name, e.g. ``p0-t1a``)."""
        links = self._node_links.get(node)
        if links is None or node.startswith("h"):
            raise ValueError(f"no switch named {node!r} in this fabric")
        return list(links)

    # Faults ---------------------------------------------------------------------------
    def set_link(self, name: str, up: bool) -> None:
        """Fail (``up=False``) or restore one physical link, both directions.

        Failures nest: a link failed twice (say by a link and a switch failure) comes back
        only after both are restored.
        """
        for link in self.physical[self.canonical(name)]:
            link.down = link.down + 1 if not up else max(0, link.down - 1)

    def set_switch(self, node: str, up: bool) -> None:
        for name in self.switch_links(node):
            self.set_link(name, up)

    def plane_links(self, plane: int) -> list[str]:
        """Every physical link of a plane (its hosts' links included)."""
        self.fabric.check_plane(plane)
        return [name for name, (up, _) in self.physical.items() if up.plane == plane]

    def set_loss(self, link: str | None, loss: float) -> None:
        """Random loss from now on: one physical link (both ways) or, with None, all."""
        if not 0.0 <= loss <= 1.0:
            raise ValueError(f"loss must be a probability in [0, 1], got {loss}")
        targets = self.links.values() if link is None else self.physical[self.canonical(link)]
        for directional in targets:
            directional.loss = loss

    # Data path ------------------------------------------------------------------------
    def attach(self, host: int, handler: Handler) -> None:
        """Deliver packets arriving at ``host`` to ``handler(packet, length, plane, ecn)``."""
        self.fabric.check_host(host)
        self._handlers[host] = handler

    def route(self, src: int, dst: int, plane: int, ev: int) -> tuple[Link, ...]:
        """The links a packet from src to dst on (plane, ev) crosses (cached)."""
        key = (src, dst, plane, ev)
        route = self._routes.get(key)
        if route is None:
            names = self._router(src, dst, plane, ev)
            links = []
            for name in names:
                link = self.links.get(name)
                if link is None:
                    raise ValueError(f"route {key} names unknown link {name!r}")
                links.append(link)
            if not links:
                raise ValueError(f"route {key} is empty")
            route = tuple(links)
            self._routes[key] = route
        return route

    def add_route(self, src: int, dst: int, plane: int, key: int, links: Sequence[str]) -> None:
        """Send what ``src`` sends to ``dst`` on ``(plane, key)`` over these directional
        links: a path the router does not know (a link probe's loop back to its sender)."""
        route = tuple(self.links[name] for name in links)
        if not route:
            raise ValueError(f"route {(src, dst, plane, key)} is empty")
        self._routes[(src, dst, plane, key)] = route

    def send(self, src: int, dst: int, plane: int, ev: int, data: bytes) -> None:
        """Inject a datagram at ``src``'s NIC port for ``plane`` now, on the path of ``ev``."""
        self.send_packet(
            src, dst, plane, ev, data, len(data), bool(data) and data[0] in DATA_OPCODES
        )

    def send_packet(
        self, src: int, dst: int, plane: int, ev: int, msg: Any, length: int, is_data: bool
    ) -> None:
        """Like :meth:`send` for any message: ``length`` is its datagram's, ``is_data`` says
        it is a data packet (trimmed, ECN-marked and queued behind other data), not control."""
        route = self._routes.get((src, dst, plane, ev)) or self.route(src, dst, plane, ev)
        doomed = False
        if self._ev_loss:
            p = self._ev_loss.get(ev)
            if p and (self._ev_loss_pairs is None or (src, dst) in self._ev_loss_pairs):
                doomed = self._rng.random() < p
        self.packets_sent += 1
        # _Packet(...), written out: a constructor call costs more than its stores.
        pkt = _new_packet(_Packet)
        pkt.msg = msg
        pkt.size = length + WIRE_OVERHEAD_BYTES
        pkt.sent_at = self._engine.now
        pkt.route = route
        pkt.hops = len(route)
        pkt.src = src
        pkt.dst = dst
        pkt.plane = plane
        pkt.doomed = doomed
        pkt.hop = 0
        pkt.ecn = False
        pkt.is_data = is_data
        pkt.priority = not is_data
        self._forward(pkt)

    def _forward(self, pkt: _Packet) -> None:
        """The packet is at the node before ``route[hop]``: enqueue it there.

        It then reaches the next node (the next hop's event) or, after the last link, its
        host (the delivery event).  This runs once per packet per hop, a good share of the
        simulator's time: locals, no calls but the random draws and the heap push.
        """
        now = self._engine.now
        hop = pkt.hop
        link = pkt.route[hop]
        pkt.hop = hop = hop + 1
        if link.down:
            link.drops_down += 1
            return
        size = pkt.size
        busy = link.busy_until
        if busy < now:
            busy = now
        if link.switch_egress:
            queued = (busy - now) * link.bytes_per_s
            if queued > link.max_queue:
                link.max_queue = queued
            if pkt.priority:
                if not pkt.is_data and queued + size > link.drop_at:
                    link.drops_queue += 1  # control shares the port's buffer
                    return
            else:
                total = queued + size
                if total > link.trim_at:
                    pkt.msg, length = self._trimmer(pkt.msg, link.last_hop)
                    pkt.priority = True
                    link.trims += 1
                    size = pkt.size = length + WIRE_OVERHEAD_BYTES
                elif total > link.drop_at:
                    link.drops_queue += 1
                    return
                elif queued > link.mark_at:
                    excess = queued - link.mark_at
                    if excess >= self._ecn_span or self._random() * self._ecn_span < excess:
                        pkt.ecn = True
                        link.ecn_marks += 1
        if pkt.priority:
            serialization = size * link.byte_time
            link.busy_until = busy + serialization
            depart = now + serialization
        else:
            depart = link.busy_until = busy + size * link.byte_time
        link.tx_packets += 1
        link.tx_bytes += size
        loss = link.loss
        if loss and self._random() < loss:
            link.drops_loss += 1
            return
        arrive = depart + link.delay
        entry = (self._tiebreak(), self._forward_cb if hop < pkt.hops else self._deliver_cb, pkt)
        current = self._slots.setdefault(arrive, entry)  # see Engine.queue
        if current is entry:
            heappush(self._times, arrive)
        elif type(current) is tuple:  # other events at that very instant: after them
            self._slots[arrive] = [current, entry]
        else:
            current.append(entry)

    def _deliver(self, pkt: _Packet) -> None:
        if pkt.doomed:
            self.drops_ev_loss += 1
            return
        handler = self._handlers.get(pkt.dst)
        if handler is None:
            raise ValueError(f"no endpoint attached at host {pkt.dst}")
        self.packets_delivered += 1
        self._delivering = pkt
        handler(pkt.msg, pkt.size - WIRE_OVERHEAD_BYTES, pkt.plane, pkt.ecn)

    @property
    def delivered_src(self) -> int:
        """While a handler runs: the host that sent the packet it was given."""
        pkt = self._delivering
        return -1 if pkt is None else pkt.src

    @property
    def delivered_latency(self) -> float | None:
        """While a handler runs: the one-way latency of the full data packet it was given
        (send to arrival), or None for anything else (control, trimmed headers)."""
        pkt = self._delivering
        if pkt is None or not pkt.is_data or pkt.priority:
            return None
        return self._engine.now - pkt.sent_at

    # Counters -------------------------------------------------------------------------
    def stats(self) -> NetStats:
        links = {n: lk.counters() for n, lk in sorted(self.links.items()) if lk.tx_packets}
        all_links = self.links.values()
        return NetStats(
            packets_sent=self.packets_sent,
            packets_delivered=self.packets_delivered,
            trims=sum(lk.trims for lk in all_links),
            ecn_marks=sum(lk.ecn_marks for lk in all_links),
            drops={
                "queue": sum(lk.drops_queue for lk in all_links),
                "loss": sum(lk.drops_loss for lk in all_links),
                "link_down": sum(lk.drops_down for lk in all_links),
                "ev_loss": self.drops_ev_loss,
            },
            links=links,
        )


def _addrplan_router(fabric: Fabric) -> Router:
    """The production router: MRC's algorithmic EV -> path mapping from ``addrplan``."""

    def router(src: int, dst: int, plane: int, ev: int) -> Sequence[str]:
        return addrplan.path(fabric, src, dst, plane, ev).links

    return router
