"""The asyncio adapter of the sans-IO core: UDP sockets per plane, reader callbacks, one timer.

docs/linux.md measured asyncio's DatagramProtocol at 30-50k packets/s here and a reader
callback that drains a non-blocking socket with ``recv_into`` at over a million: so each
plane's socket gets ``loop.add_reader`` and a callback that drains it into reused buffers,
``READ_TURN`` datagrams per ``recvmmsg`` call, each with its flow information (the ECN bits
a switch may have set to CE, passed to the core: ``rxbatch.py``).  A QP whose peer has no
mrcstack extension is also handed each datagram's EV (its UDP source port and flow label)
and traffic class, and sends through a raw socket behind headers that stripe its EV the same
way.  Datagrams for QP 2 are endpoint operations: an answer to one of a QP's EV probes goes
to that QP (the host's :class:`~mrcstack.core.endpoint.ProbeIds` says whose), the rest to
the node's prober.  Packets are placed
synchronously during ``receive_datagram``, so nothing keeps a view of the buffers after the
call returns.  After a drained batch each touched connection is flushed once (feed, drain
events, transmit), then the single timer is re-armed.

The core's clock is ``time.monotonic``, read per datagram, not ``loop.time()``: uvloop's is
libuv's cached millisecond clock, which turns sub-millisecond RTTs into 0 or 1 ms and made
RACK and the RTO retransmit packets that were never lost.  Timers are armed in whole
milliseconds rounded up, since libuv rounds to the nearest one and would fire early.
"""

from __future__ import annotations

import asyncio
import errno
import math
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from mrcstack.core.connection import Connection
from mrcstack.core.endpoint import ENDPOINT_QPN, ProbeIds
from mrcstack.core.events import Event
from mrcstack.daemons.mrcd.datapath import rxbatch, txbatch
from mrcstack.qpn import qpn_text
from mrcstack.wire import (
    BTH_LEN,
    BTH_QPN_BYTES,
    FIRST_CONTROL_OPCODE,
    TCLASS_CONTROL,
    TCLASS_DATA,
    EvFormat,
    Opcode,
    probe_id,
)

#: setsockopt(IPPROTO_UDP, ...) values from <linux/udp.h>: zero UDP checksums on IPv6, which
#: uSID needs (the checksum would be computed against the full uSID destination;
#: docs/linux.md, trap 2).  Integrity is the MRC packet's own CRC or AES-GCM tag.
UDP_NO_CHECK6_TX: Final = 101
UDP_NO_CHECK6_RX: Final = 102
#: Datagrams drained (from all plane sockets) per readable callback before yielding to the
#: loop (fairness), in turns of READ_TURN per socket.
DRAIN_LIMIT: Final = 256
READ_TURN: Final = 16
#: A readable callback this soon (seconds) after a drain ended is one of the same poll's.
SAME_TURN: Final = 20e-6
#: Datagrams one flush hands to the sockets before yielding (a 1 GiB write must not starve
#: the receive path).
SEND_BATCH: Final = 256
#: Datagrams per ``sendmmsg`` call on one plane socket (``txbatch.py``).
SEND_TURN: Final = 64
SOCKET_BUFFER: Final = 8 << 20
#: Destinations of connectionless datagrams kept as ready sockaddrs (probers' paths to us);
#: past this the table starts over.
RAW_DESTINATIONS: Final = 4096
_SO_SNDBUFFORCE: Final = getattr(socket, "SO_SNDBUFFORCE", 32)
_SO_RCVBUFFORCE: Final = getattr(socket, "SO_RCVBUFFORCE", 33)
#: The core's clock (seconds); the node reads the same one.
clock = time.monotonic
#: Destination QPN of endpoint operations (EV probes, port status updates), never a QP's.
PROBE_QPN: Final = ENDPOINT_QPN
_ENDPOINT_RESPONSE: Final = int(Opcode.ENDPOINT_RESPONSE)
#: Traffic classes: writes go in the trimmable class (DSCP 4), everything else in the control
#: class (DSCP 46), both ECT(0) so switches may mark instead of drop.  The socket's default
#: is the data class; a control packet says otherwise in its own ancillary data.
_CONTROL_CMSG: Final = [
    (socket.IPPROTO_IPV6, socket.IPV6_TCLASS, struct.pack("@i", TCLASS_CONTROL))
]
_CONTROL_MESSAGE: Final = txbatch.ControlMessage(*_CONTROL_CMSG[0])
#: The ECN bits of a datagram a switch marked Congestion Experienced (in the traffic class,
#: and where the flow information's second byte holds them).
ECN_CE: Final = rxbatch.ECN_CE
_FLOW_CE: Final = rxbatch.FLOW_ECN_CE

Address = tuple[str, int]
_U16: Final = struct.Struct(">H")
IPV6_HEADER: Final = 40


@dataclass(frozen=True, slots=True)
class RawRoute:
    """A path sent through a raw socket (EV formats SRV6_SRH and STEV): the headers up to
    and including UDP, made once per (peer, plane, EV) with zero lengths, and the first hop.

    Each datagram goes out as ``header + payload`` in one ``sendmsg`` (no copy of the
    payload); only the IPv6 payload length and the UDP length are written per packet."""

    first_hop: tuple[str, int]  # (address, 0): where the kernel routes the packet first
    data_header: bytes  # IPv6 [+ SRH] + UDP, in the data traffic class
    control_header: bytes  # the same in the control class
    udp_at: int  # offset of the UDP header

    def __reduce__(self) -> tuple[type[RawRoute], tuple[object, ...]]:
        # What pickle and copy use: compiled by mypyc, a frozen dataclass cannot be
        # restored field by field (mrcd hands QPs to its data-path workers pickled).
        return (RawRoute, (self.first_hop, self.data_header, self.control_header, self.udp_at))


#: (remote host, plane, EV, EV format, striped) -> where a datagram goes: a socket address
#: (SRv6 uSID: the path is the destination) or a raw route with its own headers (the other
#: formats, and every format when ``striped``: the EV in the UDP source port and flow label,
#: for a QP without mrcstack's extension).
Resolver = Callable[[int, int, int, EvFormat, bool], "Address | RawRoute"]
#: A datagram for QP 2 that is not an answer to a QP's probe: (data, source, plane, flow
#: information: traffic class and flow label).
Connectionless = Callable[[memoryview, "Address", int, int], None]


@dataclass(slots=True)
class TransportStats:
    """Socket-level counters (the core counts protocol-level ones)."""

    datagrams_in: int = 0
    datagrams_out: int = 0
    unknown_qpn: int = 0
    malformed: int = 0
    send_errors: int = 0
    send_blocked: int = 0
    #: Datagrams for a QP another data-path worker owns (the kernel's steering should
    #: never deliver one here): dropped.
    wrong_worker: int = 0


class _Qp:
    __slots__ = ("conn", "fmt", "on_event", "plain", "remote", "route", "to")

    def __init__(self, conn: Connection, remote: int, on_event: Callable[[Event], None]) -> None:
        self.conn = conn
        self.fmt = conn.cfg.ev_format
        self.plain = conn.plain  # no mrcstack extension: the EV rides in the outer header
        self.route = (self.fmt, self.plain)
        self.remote = remote
        self.on_event = on_event
        #: (port, EV) -> where its datagrams go: the transport's (peer, port, EV, route)
        #: entry, under a key that is cheap to hash once per packet sent (the route's
        #: EvFormat hashes in Python).
        self.to: dict[tuple[int, int], txbatch.Sockaddr | RawRoute] = {}


def send(sock: socket.socket, data: bytes, addr: Address) -> None:
    """One datagram in its traffic class: writes in the socket's (data), the rest in control."""
    if data and data[0] < FIRST_CONTROL_OPCODE:
        sock.sendto(data, addr)
    else:
        sock.sendmsg((data,), _CONTROL_CMSG, 0, addr)


def send_route(sock: socket.socket, data: bytes, route: RawRoute) -> None:
    """One datagram through a raw socket, behind the route's own IPv6 [+ SRH] + UDP headers."""
    control = bool(data) and data[0] >= FIRST_CONTROL_OPCODE
    header = bytearray(route.control_header if control else route.data_header)
    _U16.pack_into(header, 4, len(header) - IPV6_HEADER + len(data))
    _U16.pack_into(header, route.udp_at + 4, len(header) - route.udp_at + len(data))
    sock.sendmsg((header, data), (), 0, route.first_hop)


def open_raw_socket(device: str | None = None) -> socket.socket:
    """A non-blocking raw IPv6 socket that sends whole packets (IPPROTO_RAW: the header is
    ours); needs CAP_NET_RAW."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
    try:
        try:
            sock.setsockopt(socket.SOL_SOCKET, _SO_SNDBUFFORCE, SOCKET_BUFFER)
        except PermissionError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        if device is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def open_plane_socket(
    address: Address, *, device: str | None = None, reuseport: bool = False
) -> socket.socket:
    """A non-blocking UDP/IPv6 socket with zero checksums, the data class (DSCP 4, ECT(0)) on
    what it sends, each received datagram's traffic class delivered (ECN), big buffers;
    ``reuseport``: one of a group sharing the address (data-path workers, ``steer.py``)."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        if reuseport:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_TX, 1)
        sock.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, TCLASS_DATA)
        rxbatch.enable_flowinfo(sock)
        for force, plain in (
            (_SO_RCVBUFFORCE, socket.SO_RCVBUF),
            (_SO_SNDBUFFORCE, socket.SO_SNDBUF),
        ):
            try:  # root may exceed net.core.[rw]mem_max (208 KiB by default: too small)
                sock.setsockopt(socket.SOL_SOCKET, force, SOCKET_BUFFER)
            except PermissionError:
                sock.setsockopt(socket.SOL_SOCKET, plain, SOCKET_BUFFER)
        if device is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
        sock.bind(address)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class Transport:
    """Connections of one endpoint over its plane sockets, driven by one asyncio loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sockets: list[socket.socket],
        resolver: Resolver,
        connectionless: Connectionless | None = None,
        raw_socket: Callable[[int], socket.socket] | None = None,
    ) -> None:
        self.loop = loop
        self.sockets = sockets
        self.resolver = resolver
        # plane -> a raw socket for EV formats that write their own headers (made on demand)
        self.raw_socket = raw_socket
        self.raw_sockets: dict[int, socket.socket] = {}
        # Datagrams for QP 2 that are not a QP's: EV probes to answer, our connectionless
        # probes' answers, port status updates.
        self.connectionless = connectionless
        #: The host's probe ids, shared by its QPs and its connectionless probes.
        self.probe_ids = ProbeIds()
        self.stats = TransportStats()
        #: This transport carries the QPs ``qpn % shards == shard`` (a data-path worker's).
        self.shard = 0
        self.shards = 1
        self._qps: dict[int, _Qp] = {}
        self._addr_cache: dict[tuple[int, int, int, tuple[EvFormat, bool]], Address | RawRoute] = {}
        self._rx = rxbatch.BatchReceiver(READ_TURN)
        self._tx = [txbatch.BatchSender(SEND_TURN) for _ in sockets]
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._backlog: deque[tuple[int, bytes, Address | RawRoute]] = deque()
        self._writers: dict[int, socket.socket] = {}  # fd -> socket waited on for room
        self._pending_flush: set[int] = set()
        self._flush_scheduled = False
        self._closed = False
        self._draining = False
        self._drained_at = -1.0  # when the last drain from a readable callback ended
        self._raw_to: dict[Address, txbatch.Sockaddr] = {}  # send_raw's destinations
        for plane, sock in enumerate(sockets):
            loop.add_reader(sock.fileno(), self._on_readable, plane)

    # Connections ------------------------------------------------------------------------
    def add(
        self, qpn: int, conn: Connection, remote: int, on_event: Callable[[Event], None]
    ) -> None:
        if qpn in self._qps:
            raise ValueError(f"QP {qpn_text(qpn)} already exists")
        if qpn == ENDPOINT_QPN:
            raise ValueError(f"QP {qpn_text(qpn)} is the endpoint's")
        conn.probe_ids = self.probe_ids
        self._qps[qpn] = _Qp(conn, remote, on_event)

    def prepare(
        self, remote: int, paths: list[tuple[int, int]], fmt: EvFormat, striped: bool = False
    ) -> None:
        """Resolve every (plane, EV) a new connection may use before its first packet, and
        open the raw sockets its routes need: building a format's headers (Scapy) must not
        stall the data path mid-transfer, and a missing CAP_NET_RAW must fail the QP's setup
        (OSError), not a send."""
        for plane, ev in paths:
            key = (remote, plane, ev, (fmt, striped))
            if key not in self._addr_cache:
                self._addr_cache[key] = self.resolver(remote, plane, ev, fmt, striped)
            if type(self._addr_cache[key]) is not tuple:
                self._raw(plane)

    def remove(self, qpn: int) -> None:
        self._qps.pop(qpn, None)
        self._pending_flush.discard(qpn)

    def connection(self, qpn: int) -> Connection:
        return self._qps[qpn].conn

    @property
    def qpns(self) -> list[int]:
        return list(self._qps)

    def kick(self, qpn: int) -> None:
        """Something changed outside a receive (a post, a port change): flush soon."""
        self._pending_flush.add(qpn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_pending)

    # Receive ----------------------------------------------------------------------------
    def _on_readable(self, _plane: int) -> None:
        """Any plane socket is readable: drain them all, then flush once.

        The sockets are read in turns of READ_TURN datagrams, so acknowledgements are fed
        to the core in about the order they arrived whatever plane they came on; reading
        one socket dry before the next would make a loss detector that compares send times
        see a plane's waiting acks as losses.

        The loop calls this once per readable socket in one poll, back to back; the first
        call reads them all, so a call within SAME_TURN of the end of a drain returns at
        once (what arrived since is read in the next turn, the sockets still readable)
        instead of reading every socket again, mostly to find it empty.  (A callback
        scheduled to mark the turn's end would cost the loop an extra turn per drain.)
        A later poll within SAME_TURN returns at once too, and the loop polls again until
        it has passed: at low rates a few empty turns, under load a short wait that lets
        the next read take a fuller batch.  Skipping each plane's call only once per drain
        (reading at the next poll) did away with those turns (5 times fewer polls on the
        shaped testbed) but measured neither less CPU nor more goodput, shaped or not.
        """
        if self._draining or clock() - self._drained_at < SAME_TURN:
            return
        self._draining = True
        try:
            self._drain()
        finally:
            self._draining = False
        if self._pending_flush:
            self._flush_pending()
        self._send_batches()
        self._drained_at = clock()

    def _drain(self) -> None:
        rx = self._rx
        recv = rx.recv
        data, slot = rx.data, rx.slot
        u32, length_at = rx.u32, rx.length_at
        size_t, controllen_at = rx.size_t, rx.controllen_at
        control, ecn_at = rx.control, rx.ecn_at
        qps = self._qps
        touched = self._pending_flush
        stats = self.stats
        now_ = clock
        readers = [(plane, sock.fileno()) for plane, sock in enumerate(self.sockets)]
        budget = DRAIN_LIMIT
        while readers and budget > 0:
            still = []
            for plane, fd in readers:
                try:
                    k = recv(fd)
                except OSError:  # an error the kernel reports once (ICMP): read on
                    stats.malformed += 1
                    budget -= 1
                    still.append((plane, fd))
                    continue
                budget -= k
                stats.datagrams_in += k
                # One clock reading per batch: its datagrams were all waiting when it was
                # read, so this is closer to their arrival than a reading after the
                # earlier ones were handled.
                now = now_()
                last = -1
                for i in range(k):
                    start = i * slot
                    datagram = data[start : start + u32[length_at[i]]]
                    # peek_qpn, inline (a view of bytes already): once per datagram.
                    if len(datagram) < BTH_LEN:
                        stats.malformed += 1
                        continue
                    qpn = int.from_bytes(datagram[BTH_QPN_BYTES], "big")
                    qp = qps.get(qpn)
                    if qp is None:
                        if qpn == ENDPOINT_QPN:
                            self._endpoint(datagram, rx, i, plane)
                        elif qpn % self.shards != self.shard:
                            stats.wrong_worker += 1
                        else:
                            stats.unknown_qpn += 1
                        continue
                    # The traffic class's ECN bits (no control message: not marked).
                    ce = size_t[controllen_at[i]] != 0 and control[ecn_at[i]] & _FLOW_CE == _FLOW_CE
                    if qp.plain:  # the EV and the traffic class from the outer header
                        flow = rx.flowinfo(i)
                        qp.conn.receive_datagram(
                            datagram, now=now, port=plane, ecn=ce,
                            ev=rx.source_port(i) << 16 | flow & 0xFFFF, tclass=flow >> 20 & 0xFF,
                        )  # fmt: skip
                    else:
                        qp.conn.receive_datagram(datagram, now=now, port=plane, ecn=ce)
                    if qpn != last:
                        touched.add(qpn)
                        last = qpn
                if k == READ_TURN:
                    still.append((plane, fd))  # a full turn: maybe more there
            readers = still

    def _endpoint(
        self, datagram: memoryview, rx: rxbatch.BatchReceiver, i: int, plane: int
    ) -> None:
        """A datagram for QP 2: the answer to one of a QP's probes goes to that QP, anything
        else to the node's prober."""
        flow = rx.flowinfo(i)
        if len(datagram) >= BTH_LEN and datagram[0] == _ENDPOINT_RESPONSE:
            owner = self.probe_ids.owner(probe_id(datagram))
            qp = self._qps.get(owner) if owner is not None else None
            if qp is not None:
                qp.conn.receive_endpoint_datagram(
                    datagram, now=clock(), port=plane, ev=rx.source_port(i) << 16 | flow & 0xFFFF
                )
                self._pending_flush.add(owner)  # type: ignore[arg-type]
                return
        if self.connectionless is not None:
            self.connectionless(datagram, rx.source(i), plane, flow)
        else:
            self.stats.unknown_qpn += 1

    def deliver_endpoint(self, data: bytes, plane: int, ev: int) -> None:
        """An answer to one of our QPs' EV probes that another worker received."""
        owner = self.probe_ids.owner(probe_id(data))
        qp = self._qps.get(owner) if owner is not None else None
        if qp is None:
            self.stats.unknown_qpn += 1
            return
        qp.conn.receive_endpoint_datagram(memoryview(data), now=clock(), port=plane, ev=ev)
        self.kick(owner)  # type: ignore[arg-type]

    # Transmit and timers ------------------------------------------------------------------
    def _flush_pending(self) -> None:
        self._flush_scheduled = False
        pending = self._pending_flush
        self._pending_flush = set()
        more = False
        for qpn in pending:
            qp = self._qps.get(qpn)
            if qp is not None and self._flush(qp, qpn):
                more = True
        if more:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_pending)
        self._arm_timer()

    def _flush(self, qp: _Qp, qpn: int) -> bool:
        """Drain events and transmit one batch; True if the connection has more to send.

        Each datagram is copied into the next slot of its plane's batch, and each batch
        leaves in ``sendmmsg`` calls of up to ``SEND_TURN``; a datagram that needs a raw
        route (or is too big for a slot) is sent on its own, after what its plane has
        batched so far."""
        conn = qp.conn
        while (event := conn.next_event()) is not None:
            qp.on_event(event)
        if self._backlog:
            self._pending_flush.add(qpn)
            return False  # sockets are full: the writer callback resumes us
        out = conn.packets_to_send(clock(), SEND_BATCH)
        tos = qp.to
        batches = self._tx
        sockaddr = txbatch.Sockaddr
        encode_into = conn.encode_into
        for pkt, size in out:
            port = pkt.port
            to = tos.get((port, pkt.ev))
            if to is None:
                to = tos[port, pkt.ev] = self._resolve((qp.remote, port, pkt.ev, qp.route))
            if type(to) is sockaddr:
                batch = batches[port]
                if size <= batch.slot:
                    # Encoded straight into the send slot: no datagram object, no copy.
                    slot = batch.slots[batch.count]
                    size = encode_into(pkt, slot)
                    control = None if slot[0] < FIRST_CONTROL_OPCODE else _CONTROL_MESSAGE
                    if batch.add(size, to, control):
                        self._send_batch(port)
                    continue
                self._send_batch(port)
                self._send_one(port, conn.encode(pkt), to.address)
            else:
                self._send_batch(port)
                self._send_one(port, conn.encode(pkt), to)  # type: ignore[arg-type]
        self._send_batches()
        while (event := conn.next_event()) is not None:
            qp.on_event(event)
        if len(out) >= SEND_BATCH:
            self._pending_flush.add(qpn)
            return True
        return False

    def _resolve(
        self, key: tuple[int, int, int, tuple[EvFormat, bool]]
    ) -> txbatch.Sockaddr | RawRoute:
        """Where datagrams of (peer, plane, EV, route) go: a sockaddr_in6 made once (uSID)
        or a raw route (each QP keeps it by plane and EV)."""
        addr = self._addr_cache.get(key)
        if addr is None:
            remote, plane, ev, route = key
            addr = self._addr_cache[key] = self.resolver(remote, plane, ev, *route)
        return txbatch.Sockaddr(addr) if isinstance(addr, tuple) else addr

    def _send_batch(self, plane: int) -> None:
        """Hand plane ``plane``'s batched datagrams to its socket; what the socket has no
        room for waits in the backlog, in order."""
        batch = self._tx[plane]
        count = batch.count
        if not count:
            return
        stats = self.stats
        backlog = self._backlog
        done = sent = 0
        if not backlog:
            fd = self.sockets[plane].fileno()
            while done < count:
                try:
                    k = batch.send(fd, done)
                except BlockingIOError:
                    stats.send_blocked += count - done
                    break
                except OSError as exc:
                    # A down port (ENETUNREACH, ENETDOWN...): the packet is lost like on a
                    # wire; the core's recovery handles it.
                    if exc.errno not in _LOSS_ERRNOS:
                        batch.count = 0
                        raise
                    stats.send_errors += 1
                    done += 1
                else:
                    done += k
                    sent += k
        stats.datagrams_out += sent
        if done < count:  # the socket is full, or earlier datagrams wait: keep the order
            for i in range(done, count):
                address = batch.addresses[i]
                assert address is not None
                backlog.append((plane, batch.datagram(i), address))
            self._watch_writable(plane, backlog[-1][2])
        batch.count = 0

    def _send_batches(self) -> None:
        """Send what the batches hold (a flush's datagrams, :meth:`send_raw`'s in a drain)."""
        for plane, batch in enumerate(self._tx):
            if batch.count:
                self._send_batch(plane)

    def _send_one(self, plane: int, data: bytes, addr: Address | RawRoute) -> None:
        """One datagram outside the batches (a raw route, a jumbo datagram)."""
        stats = self.stats
        if self._backlog:
            self._backlog.append((plane, data, addr))
            return
        try:
            self._send_now(plane, data, addr)
        except BlockingIOError:
            stats.send_blocked += 1
            self._backlog.append((plane, data, addr))
            self._watch_writable(plane, addr)
        except OSError as exc:
            if exc.errno not in _LOSS_ERRNOS:
                raise
            stats.send_errors += 1
        else:
            stats.datagrams_out += 1

    def _send_now(self, plane: int, data: bytes, addr: Address | RawRoute) -> None:
        if type(addr) is tuple:
            send(self.sockets[plane], data, addr)
        else:
            send_route(self._raw(plane), data, addr)  # type: ignore[arg-type]

    def _raw(self, plane: int) -> socket.socket:
        sock = self.raw_sockets.get(plane)
        if sock is None:
            if self.raw_socket is None:
                raise OSError(errno.EPROTONOSUPPORT, "this transport has no raw sockets")
            sock = self.raw_sockets[plane] = self.raw_socket(plane)
        return sock

    def _watch_writable(self, plane: int, addr: Address | RawRoute) -> None:
        sock = self.sockets[plane] if type(addr) is tuple else self._raw(plane)
        if sock.fileno() not in self._writers:
            self._writers[sock.fileno()] = sock
            self.loop.add_writer(sock.fileno(), self._on_writable)

    def _on_writable(self) -> None:
        backlog = self._backlog
        while backlog:
            plane, data, addr = backlog[0]
            try:
                self._send_now(plane, data, addr)
            except BlockingIOError:
                return
            except OSError:
                self.stats.send_errors += 1
            else:
                self.stats.datagrams_out += 1
            backlog.popleft()
        for fd in self._writers:
            self.loop.remove_writer(fd)
        self._writers.clear()
        self._flush_pending()

    def _arm_timer(self) -> None:
        if self._closed:
            return
        deadline: float | None = None
        for qp in self._qps.values():
            t = qp.conn.get_timer()
            if t is not None and (deadline is None or t < deadline):
                deadline = t
        armed = self._timer_at
        if deadline == armed:
            return
        if deadline is not None and armed is not None and armed <= deadline:
            # A later deadline (an ACK moved the RTO or the tail probe on, as most do): the
            # armed timer fires first and re-arms, instead of a cancel and a new timer per
            # flush (a few microseconds in the loop each time).
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is not None:
            delay = math.ceil(max(0.0, deadline - clock()) * 1000.0) / 1000.0
            self._timer = self.loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        # Read what has already arrived before declaring anything timed out: after a stall
        # (the process was not scheduled, a long callback) libuv runs due timers before it
        # polls for I/O, and the acknowledgements waiting in the sockets would otherwise
        # turn into spurious timeouts.
        if not self._draining:
            self._draining = True
            try:
                self._drain()
            finally:
                self._draining = False
        now = clock()
        for qpn, qp in self._qps.items():
            t = qp.conn.get_timer()
            if t is not None and t <= now:
                qp.conn.handle_timer(now)
                self._pending_flush.add(qpn)
        self._flush_pending()
        self._send_batches()

    def send_raw(self, plane: int, data: bytes, addr: Address) -> bool:
        """Send one datagram outside any connection (probes); False if the port refused.

        One sent while the sockets are drained (the answer to a probe that just arrived)
        joins its plane's batch and leaves when the drain ends, with the acknowledgements
        made meanwhile: on its own, a ``sendmsg`` costs several times the system time of a
        batched datagram.  Its errors are then the batch's (counted, the datagram lost)."""
        if self._draining and 0 < len(data) <= txbatch.SLOT:
            to = self._raw_to.get(addr)
            if to is None:
                if len(self._raw_to) >= RAW_DESTINATIONS:
                    self._raw_to.clear()
                to = self._raw_to[addr] = txbatch.Sockaddr(addr)
            batch = self._tx[plane]
            size = len(data)
            batch.slots[batch.count][:size] = data
            control = None if data[0] < FIRST_CONTROL_OPCODE else _CONTROL_MESSAGE
            if batch.add(size, to, control):
                self._send_batch(plane)
            return True
        try:
            send(self.sockets[plane], data, addr)
        except OSError:
            self.stats.send_errors += 1
            return False
        self.stats.datagrams_out += 1
        return True

    def close(self) -> None:
        """Stop reading and timing; the caller closes the sockets it opened."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for sock in self.sockets:
            self.loop.remove_reader(sock.fileno())
        for fd in self._writers:
            self.loop.remove_writer(fd)
        self._writers.clear()
        for sock in self.raw_sockets.values():
            sock.close()
        self.raw_sockets.clear()


_LOSS_ERRNOS: Final = frozenset(
    {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EADDRNOTAVAIL, errno.ENOBUFS}
)
