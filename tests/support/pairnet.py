"""Two connections in one process over a seeded, faulty virtual link (aioquic-style tests).

The link's faults (:class:`LinkFaults`): random loss, duplication, reordering (random extra
delay), trimming (the switch's cut, with the last-hop flag sometimes), ECN marks, and EV
blackouts (a failed path) in time windows.  Time is virtual; nothing sleeps.  Without
mrcstack's extension (``extensions=False``) each datagram carries its EV and traffic class
beside it, as the outer header would, and a trim cuts a write to the specification's headers
and marks it DSCP 12 (16 on the last hop).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from mrcstack.core.cc import CCParams
from mrcstack.core.config import ConnectionConfig
from mrcstack.core.connection import Connection, Datagram
from mrcstack.core.events import Event
from mrcstack.core.evs import EvEntry
from mrcstack.core.memory import MemoryTable
from mrcstack.wire import (
    WRITE_OPCODES,
    Dscp,
    encode_trimmed,
    plain_header_length,
    traffic_class,
)


@dataclass
class LinkFaults:
    """What the virtual link does to datagrams (not the testbed's fault harness)."""

    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0  # max extra delay, seconds
    trim: float = 0.0
    ecn: float = 0.0
    delay: float = 10e-6
    blackouts: list[tuple[float, float, int]] = field(default_factory=list)  # (start, end, ev)
    # (start, end, side, ev): drop only what endpoint ``side`` sends on ``ev`` (one direction
    # of a path: e.g. the reverse path that carries one end's ACKs)
    one_way: list[tuple[float, float, int, int]] = field(default_factory=list)
    ev_loss: dict[int, float] = field(default_factory=dict)
    # (start, end, side): endpoint ``side`` is not scheduled (a stalled process): what
    # arrives for it meanwhile waits in its socket and is read at ``end``
    stalls: list[tuple[float, float, int]] = field(default_factory=list)


def make_evs(planes: int, per_plane: int) -> tuple[EvEntry, ...]:
    return tuple(EvEntry(p << 8 | i, p) for p in range(planes) for i in range(per_plane))


class PairNet:
    """Endpoint 0 and endpoint 1, each a Connection, joined by a faulty virtual link."""

    def __init__(
        self,
        seed: int,
        faults: LinkFaults,
        *,
        planes: int = 2,
        per_plane: int = 4,
        mode: str = "mrc",
        key: bytes | None = None,
        encrypt: bool = False,
        mtu: int = 256,
        psns: tuple[int, int] | None = None,
        **cfg: object,
    ) -> None:
        self.rng = random.Random(seed)
        self.faults = faults
        self.now = 0.0
        self.mem = [MemoryTable(), MemoryTable()]
        psn = psns or (self.rng.randrange(1 << 24), self.rng.randrange(1 << 24))
        evs = make_evs(planes, per_plane)
        cfg.setdefault("cc_params", CCParams(max_cwnd=32 * mtu))
        self.conns = [
            Connection(
                ConnectionConfig(
                    local_qpn=10 + i,
                    remote_qpn=11 - i,
                    planes=planes,
                    evs=evs,
                    mode=mode,
                    cc="fixed",
                    mtu_payload=mtu,
                    key=key,
                    encrypt=encrypt,
                    local_psn=psn[i],
                    remote_psn=psn[1 - i],
                    **cfg,  # type: ignore[arg-type]
                ),
                memory=self.mem[i],
                rng=random.Random(seed * 2 + i),
                now=0.0,
            )
            for i in (0, 1)
        ]
        self.events: list[list[Event]] = [[], []]
        self.event_times: list[list[float]] = [[], []]  # when each of ``events`` came out
        self._heap: list[tuple[float, int, int, bytes, int, bool, int, int]] = []
        self.plain = not self.conns[0].cfg.extensions
        self._tie = 0
        self.delivered = 0
        self.dropped = 0
        self.on_event: Callable[[int, Event], None] | None = None  # sees events as they happen
        # Sees every datagram an endpoint hands out (side, datagram, time), before any fault.
        self.on_send: Callable[[int, Datagram, float], None] | None = None

    def _transmit(self, side: int) -> None:
        conn = self.conns[side]
        f = self.faults
        rng = self.rng
        for d in conn.datagrams_to_send(self.now):
            if self.on_send is not None:
                self.on_send(side, d, self.now)
            peer = self.conns[1 - side]
            if not (peer.evs.port_up[d.port] and conn.evs.port_up[d.port]):
                self.dropped += 1  # a NIC port that is down neither sends nor receives
                continue
            if any(s <= self.now < e and ev == d.ev for s, e, ev in f.blackouts) or any(
                s <= self.now < e and who == side and ev == d.ev for s, e, who, ev in f.one_way
            ):
                self.dropped += 1
                continue
            if rng.random() < f.loss + f.ev_loss.get(d.ev, 0.0):
                self.dropped += 1
                continue
            data = d.data
            ecn = rng.random() < f.ecn
            tclass = 0
            if data[0] in WRITE_OPCODES and rng.random() < f.trim:
                lasthop = rng.random() < 0.3
                if self.plain:  # cut to the spec's headers, the class says trimmed
                    data = data[: plain_header_length(data[0], bool(data[8] & 0x10))]
                    tclass = traffic_class(Dscp.TRIMMED_LASTHOP if lasthop else Dscp.TRIMMED)
                else:
                    data = encode_trimmed(data, lasthop=lasthop)
            copies = 2 if rng.random() < f.dup else 1
            for _ in range(copies):
                at = self.now + f.delay + rng.random() * f.reorder
                for start, end, who in f.stalls:
                    if who == 1 - side and start <= at < end:
                        at = end
                self._tie += 1
                heapq.heappush(
                    self._heap, (at, self._tie, 1 - side, data, d.port, ecn, d.ev, tclass)
                )

    def _drain(self, side: int) -> None:
        conn = self.conns[side]
        while (ev := conn.next_event()) is not None:
            self.events[side].append(ev)
            self.event_times[side].append(self.now)
            if self.on_event is not None:
                self.on_event(side, ev)
        self._transmit(side)

    def kick(self) -> None:
        for side in (0, 1):
            self._drain(side)

    def receive(
        self, side: int, data: bytes, *, now: float, port: int, ecn: bool, ev: int, tclass: int
    ) -> None:
        """One datagram handed to ``side``'s connection (a test may wrap this: the
        connection's own methods cannot be replaced when the core runs compiled)."""
        self.conns[side].receive_datagram(data, now=now, port=port, ecn=ecn, ev=ev, tclass=tclass)

    def run(self, until: float, stop: object = None) -> None:
        """Advance virtual time until ``until`` or until ``stop()`` is true."""
        self.kick()
        while self.now < until:
            if callable(stop) and stop():
                return
            t_net = self._heap[0][0] if self._heap else None
            timers = [c.get_timer() for c in self.conns]
            candidates = [t for t in (t_net, *timers) if t is not None]
            if not candidates:
                return
            t = max(self.now, min(candidates))
            if t > until:
                self.now = until
                return
            self.now = t
            if t_net is not None and t_net <= t:
                _, _, side, data, port, ecn, ev, tclass = heapq.heappop(self._heap)
                self.delivered += 1
                self.receive(side, data, now=t, port=port, ecn=ecn, ev=ev, tclass=tclass)
                # Everything arriving at that instant is one receive batch (as a daemon
                # drains a socket) before the endpoint transmits.
                while self._heap and self._heap[0][0] <= t and self._heap[0][2] == side:
                    _, _, _, data, port, ecn, ev, tclass = heapq.heappop(self._heap)
                    self.delivered += 1
                    self.receive(side, data, now=t, port=port, ecn=ecn, ev=ev, tclass=tclass)
                self._drain(side)
                continue
            for side, timer in enumerate(timers):
                if timer is not None and timer <= t:
                    self.conns[side].handle_timer(t)
                    self._drain(side)
