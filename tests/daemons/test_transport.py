"""The asyncio adapter over real UDP sockets on loopback (no root needed)."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time

import pytest
import uvloop

from mrcstack.core.cc import CCParams
from mrcstack.core.config import ConnectionConfig
from mrcstack.core.connection import Connection
from mrcstack.core.events import Event, SendCompleted, WcStatus, WriteImmReceived
from mrcstack.core.evs import EvEntry
from mrcstack.core.memory import MemoryTable
from mrcstack.core.tx import Outgoing
from mrcstack.daemons.mrcd.datapath import transport as transport_module
from mrcstack.daemons.mrcd.datapath.rxbatch import IPV6_FLOWINFO, BatchReceiver
from mrcstack.daemons.mrcd.datapath.transport import (
    READ_TURN,
    TCLASS_CONTROL,
    UDP_NO_CHECK6_RX,
    Transport,
    clock,
    open_plane_socket,
)

PLANES = 2
MTU = 8192


class FedConnection(Connection):
    """A connection that notes (port, ecn) of each datagram fed to it once ``fed`` is a list
    (a subclass: a compiled connection's methods cannot be replaced on the instance)."""

    fed: list[tuple[int, bool]] | None = None

    def receive_datagram(
        self,
        data: bytes | memoryview,
        *,
        now: float,
        port: int,
        ecn: bool = False,
        ev: int = 0,
        tclass: int = 0,
    ) -> None:
        if self.fed is not None:
            self.fed.append((port, ecn))
        super().receive_datagram(data, now=now, port=port, ecn=ecn, ev=ev, tclass=tclass)


class Pair:
    """Two endpoints in one loop, each with PLANES sockets on ::1."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, mtu: int = MTU, key: bytes | None = None
    ) -> None:
        self.socks = [[open_plane_socket(("::1", 0)) for _ in range(PLANES)] for _ in (0, 1)]
        ports = [[s.getsockname()[1] for s in side] for side in self.socks]
        self.mems = [MemoryTable(), MemoryTable()]
        self.events: list[list[Event]] = [[], []]
        evs = tuple(EvEntry(p << 8 | i, p) for p in range(PLANES) for i in range(4))
        params = CCParams(max_cwnd=32 * MTU)
        self.conns: list[Connection] = [
            FedConnection(
                ConnectionConfig(
                    local_qpn=1 + 2 * s,  # (QP 2 is the endpoint's)
                    remote_qpn=3 - 2 * s,
                    planes=PLANES,
                    evs=evs,
                    mtu_payload=mtu,
                    cc_params=params,
                    key=key,
                    timeout=5e-3,
                ),
                memory=self.mems[s],
                rng=random.Random(s),
                now=loop.time(),
            )
            for s in (0, 1)
        ]
        self.done = asyncio.Event()
        self.transports = []
        for side in (0, 1):
            peer = ports[1 - side]
            t = Transport(
                loop, self.socks[side], lambda r, p, ev, fmt, striped, peer=peer: ("::1", peer[p])
            )
            t.add(1 + 2 * side, self.conns[side], 1 - side, self._recorder(side))
            self.transports.append(t)
        self.ports = ports

    def _recorder(self, side: int):  # type: ignore[no-untyped-def]
        def record(event: Event) -> None:
            self.events[side].append(event)
            if isinstance(event, WriteImmReceived):
                self.done.set()

        return record

    def close(self) -> None:
        for t in self.transports:
            t.close()
        for side in self.socks:
            for s in side:
                s.close()


async def write_one_mib(pair: Pair) -> tuple[bytearray, bytes]:
    """Side 0 writes 1 MiB of random bytes to side 1 (immediate 5): (landed, sent) once
    side 1 saw the immediate."""
    dst = bytearray(1 << 20)
    mr = pair.mems[1].register(dst)
    src = os.urandom(1 << 20)
    pair.conns[0].post_write(1, src, mr.va, mr.rkey, imm=5, now=clock())
    pair.transports[0].kick(1)
    await asyncio.wait_for(pair.done.wait(), 30)
    return dst, src


async def test_write_over_real_udp_sockets_lands_intact() -> None:
    pair = Pair(asyncio.get_running_loop())
    try:
        dst = bytearray(8 << 20)
        mr = pair.mems[1].register(dst)
        src = os.urandom(8 << 20)
        pair.conns[0].post_write(1, src, mr.va, mr.rkey, imm=77, now=0.0)
        pair.transports[0].kick(1)
        await asyncio.wait_for(pair.done.wait(), 30)
        while not any(isinstance(e, SendCompleted) for e in pair.events[0]):
            await asyncio.sleep(0.01)
        assert dst == src
        assert [e for e in pair.events[0] if isinstance(e, SendCompleted)] == [
            SendCompleted(1, WcStatus.SUCCESS, 8 << 20)
        ]
        assert all(n > 0 for n in pair.conns[0].stats.packets_sent)  # both planes used
    finally:
        pair.close()


async def test_datagrams_larger_than_a_send_slot_go_on_their_own() -> None:
    """Payloads of 16 KiB (loopback's MTU allows them) do not fit the batched send's slots:
    each is encoded once (AES-GCM: a second seal of one tx_seq would be refused) and sent
    with sendto, and the write lands intact."""
    pair = Pair(asyncio.get_running_loop(), mtu=16384, key=bytes(16))
    try:
        dst, src = await write_one_mib(pair)
        assert dst == src
        assert pair.transports[0].stats.datagrams_out >= (1 << 20) // 16384
    finally:
        pair.close()


async def test_garbage_and_unknown_qps_are_counted_and_dropped() -> None:
    pair = Pair(asyncio.get_running_loop())
    try:
        rng = random.Random(5)
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            for _ in range(300):
                s.sendto(rng.randbytes(rng.randrange(0, 200)), ("::1", pair.ports[1][0]))
            # A well-formed BTH for a QP nobody has.
            s.sendto(
                bytes([0x0A, 0, 0xFF, 0xFF, 0, 0, 0, 99, 0, 0, 0, 1]) + bytes(80),
                ("::1", pair.ports[1][1]),
            )
        for _ in range(100):
            await asyncio.sleep(0.01)
            st = pair.transports[1].stats
            if st.datagrams_in >= 301:
                break
        st = pair.transports[1].stats
        rejected = sum(pair.conns[1].stats.rejected.values())
        assert st.datagrams_in == 301
        assert st.malformed + st.unknown_qpn + rejected == 301
        assert st.unknown_qpn >= 1
    finally:
        pair.close()


def test_plane_socket_has_zero_checksum_options() -> None:
    s = open_plane_socket(("::1", 0))
    try:
        assert s.getsockopt(socket.IPPROTO_UDP, 101) == 1
        assert s.getsockopt(socket.IPPROTO_UDP, 102) == 1
        assert s.getsockopt(socket.IPPROTO_IPV6, IPV6_FLOWINFO) == 1  # traffic class, label
        assert not s.getblocking()
    finally:
        s.close()


def test_bind_failure_closes_the_socket() -> None:
    with pytest.raises(OSError):
        open_plane_socket(("2001:db8::1", 4791))  # not an address of this host


def test_rtt_samples_have_sub_millisecond_resolution() -> None:
    """The core's clock is time.monotonic, not uvloop's loop.time() (libuv's cached
    millisecond clock, which made every RTT 0 or a whole number of milliseconds).  Runs
    on uvloop, as mrcd does."""
    uvloop.run(_rtt_samples())


async def _rtt_samples() -> None:
    pair = Pair(asyncio.get_running_loop())
    samples: list[float] = []
    pair.conns[0].on_rtt = samples.append
    try:
        dst = bytearray(1 << 20)
        mr = pair.mems[1].register(dst)
        pair.conns[0].post_write(1, os.urandom(1 << 20), mr.va, mr.rkey, imm=1, now=clock())
        pair.transports[0].kick(1)
        await asyncio.wait_for(pair.done.wait(), 30)
        assert len(samples) >= 10
        assert all(s > 0 for s in samples)
        off_grid = [s for s in samples if abs(s * 1e3 - round(s * 1e3)) > 0.01]
        assert len(off_grid) > len(samples) // 2
    finally:
        pair.close()


#: A BTH for QP 2 (side 1's connection) and garbage after: its decoder rejects it (counted).
JUNK_FOR_QP3 = bytes([0x0A, 0, 0xFF, 0xFF, 0, 0, 0, 3, 0, 0, 0, 1]) + bytes(80)


def fed(conn: Connection) -> list[tuple[int, bool]]:
    """(port, ecn) of every datagram the transport feeds ``conn`` from now on."""
    assert isinstance(conn, FedConnection)
    conn.fed = []
    return conn.fed


async def test_plane_sockets_are_read_in_turns() -> None:
    """Datagrams waiting on several plane sockets reach the core in turns of READ_TURN per
    socket, so a plane's acks are not fed long after another plane's later ones."""
    pair = Pair(asyncio.get_running_loop())
    conn = pair.conns[1]
    feed = fed(conn)
    try:
        per_plane = 3 * READ_TURN + 5
        loop = asyncio.get_running_loop()
        for sock in pair.socks[1]:
            loop.remove_reader(sock.fileno())  # hold reading until both are full
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            for plane in range(PLANES):
                for _ in range(per_plane):
                    s.sendto(JUNK_FOR_QP3, ("::1", pair.ports[1][plane]))
        await asyncio.sleep(0.05)
        pair.transports[1]._on_readable(0)
        seen = [port for port, _ecn in feed]
        assert len(seen) == PLANES * per_plane
        runs: list[int] = []
        for i, port in enumerate(seen):
            if i and seen[i - 1] == port:
                runs[-1] += 1
            else:
                runs.append(1)
        assert max(runs) <= READ_TURN
        assert seen[: 2 * READ_TURN] == [0] * READ_TURN + [1] * READ_TURN
        assert sum(conn.stats.rejected.values()) == PLANES * per_plane
    finally:
        pair.close()


# ECN: the traffic class of every datagram reaches the core ----------------------------------
TCLASS_CE = 0x03
IPV6_FLOWINFO_SEND = 33  # <linux/in6.h>: sendto's flowinfo sets the flow label


def sender_with_tclass(tclass: int) -> socket.socket:
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tclass)
    return s


def test_batch_receiver_reads_length_source_and_flow_information() -> None:
    """Each datagram's traffic class (ECN) and flow label, and its source address and port:
    a peer without mrcstack's extension stripes its EV over the port and the label."""
    rx_sock = open_plane_socket(("::1", 0))
    rx = BatchReceiver(8)
    try:
        assert rx_sock.getsockopt(socket.IPPROTO_IPV6, IPV6_FLOWINFO) == 1
        assert rx.recv(rx_sock.fileno()) == 0  # nothing there: no error, no block
        sent = [  # (a label of 0 would be the kernel's to choose)
            (0xB8 | TCLASS_CE, 0x00ABC, b"marked"),
            (0xB8 | 0x02, 0xFFFFF, b""),
            (0x00, 0x12345, bytes(range(256)) * 255),
            (0x30, 0x00001, b"trimmed class"),
        ]
        sources = []
        for tclass, label, payload in sent:
            with sender_with_tclass(tclass) as s:
                s.setsockopt(socket.IPPROTO_IPV6, IPV6_FLOWINFO_SEND, 1)
                s.bind(("::1", 0))
                host, port = rx_sock.getsockname()[:2]
                s.sendto(payload, (host, port, label, 0))
                sources.append(s.getsockname()[:2])
        time.sleep(0.01)
        assert rx.recv(rx_sock.fileno()) == len(sent)
        for i, (tclass, label, payload) in enumerate(sent):
            assert rx.datagram(i) == payload
            assert rx.tclass(i) == tclass
            assert rx.flowinfo(i) & 0xFFFFF == label
            assert rx.ce(i) is (tclass & 3 == 3)
            assert rx.source(i) == sources[i]
            assert rx.source_port(i) == sources[i][1]
        assert rx.recv(rx_sock.fileno()) == 0
    finally:
        rx_sock.close()


async def test_every_datagram_reaches_the_core_with_its_own_ecn_mark() -> None:
    """Marked and unmarked datagrams interleaved over several receive batches: each is fed
    to the connection with ecn=True exactly when it arrived CE (ECT(0), ECT(1), not-ECT and
    other DSCP bits are not a mark)."""
    pair = Pair(asyncio.get_running_loop())
    feed = fed(pair.conns[1])
    loop = asyncio.get_running_loop()
    classes = [TCLASS_CE, 0x02, 0x01, 0x00, 0xB8 | TCLASS_CE, 0xB8]
    order = [classes[i * 7 % len(classes)] for i in range(3 * READ_TURN + 5)]
    senders = {t: sender_with_tclass(t) for t in classes}
    try:
        for sock in pair.socks[1]:
            loop.remove_reader(sock.fileno())  # hold reading until all have arrived
        for tclass in order:
            senders[tclass].sendto(JUNK_FOR_QP3, ("::1", pair.ports[1][0]))
        await asyncio.sleep(0.05)
        pair.transports[1]._on_readable(0)
        assert [ecn for _port, ecn in feed] == [t & 3 == 3 for t in order]
    finally:
        for s in senders.values():
            s.close()
        pair.close()


async def test_ce_marks_are_counted_and_echoed_end_to_end() -> None:
    """A sender whose packets all arrive CE (its sockets' traffic class set to CE, as a
    marking switch would leave them): the receiver counts the marks and echoes them, the
    sender counts the echoes (and NSCC sees them)."""
    pair = Pair(asyncio.get_running_loop())
    try:
        for sock in pair.socks[0]:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, TCLASS_CE)
        dst, src = await write_one_mib(pair)
        while not any(isinstance(e, SendCompleted) for e in pair.events[0]):
            await asyncio.sleep(0.01)
        assert dst == src
        received = pair.conns[1].stats.packets_received
        assert pair.conns[1].stats.ecn_received >= sum(received) // 2  # data packets: CE
        assert pair.conns[0].stats.ecn_echoes > 0
        assert pair.conns[0].stats.ecn_received == 0  # the ACKs were not marked
    finally:
        pair.close()


class _TimerOnly(Connection):
    """A connection whose timer is a given deadline, noting when it ran (and sending
    nothing): what the transport's timer asks of a connection."""

    def __init__(self, deadline: float) -> None:
        cfg = ConnectionConfig(local_qpn=1, remote_qpn=3, planes=1, evs=(EvEntry(0, 0),))
        super().__init__(cfg, memory=MemoryTable(), rng=random.Random(0), now=0.0)
        self.deadline: float | None = deadline
        self.fired: list[float] = []

    def get_timer(self) -> float | None:
        return self.deadline

    def handle_timer(self, now: float) -> None:
        assert self.deadline is not None and self.deadline <= now
        self.fired.append(now)
        self.deadline = None

    def next_event(self) -> None:
        return None

    def packets_to_send(
        self, now: float, limit: int = 0, data_limit: int | None = None
    ) -> list[Outgoing]:
        return []


def test_a_later_deadline_keeps_the_armed_timer_which_rearms_for_it() -> None:
    """An ACK moving the deadline on does not cancel and re-create the loop's timer: the
    armed one fires first and arms the later deadline, which runs the connection's timer
    no earlier than it is due; an earlier deadline re-arms at once."""
    loop = uvloop.new_event_loop()
    try:
        t = Transport(loop, [], lambda *_: ("::1", 1))
        conn = _TimerOnly(clock() + 0.02)
        t.add(1, conn, 0, lambda _: None)
        t._arm_timer()
        first = t._timer
        assert first is not None
        conn.deadline = clock() + 0.05
        t._arm_timer()
        assert t._timer is first  # kept
        due = conn.deadline
        loop.run_until_complete(asyncio.sleep(0.2))
        assert len(conn.fired) == 1 and conn.fired[0] >= due
        conn.deadline = clock() + 1.0
        t._arm_timer()
        late = t._timer
        conn.deadline = clock() + 0.01
        t._arm_timer()
        assert t._timer is not late and late is not None and late.cancelled()
        t.close()
    finally:
        loop.close()


async def test_answers_made_while_draining_leave_in_the_batch_with_their_class() -> None:
    """A connectionless datagram sent while the sockets are drained (the answer to a probe)
    waits in its plane's batch and leaves when the drain ends, in the control class; one
    sent outside a drain leaves at once."""
    loop = asyncio.get_running_loop()
    socks = [open_plane_socket(("::1", 0)) for _ in range(PLANES)]
    peer = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    peer.bind(("::1", 0))
    peer.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)  # the plane sockets send none
    peer.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVTCLASS, 1)
    peer.settimeout(5)
    to = ("::1", peer.getsockname()[1])
    held: list[int] = []
    transport: Transport

    def answer(data: memoryview, source: object, plane: int, flow: int) -> None:
        assert transport.send_raw(plane, bytes([0xFF]) + bytes(data[1:]), to)
        held.append(transport._tx[plane].count)  # queued, not yet sent

    transport = Transport(loop, socks, lambda *route: to, connectionless=answer)
    try:
        probe = bytes([0x0A, 0, 0xFF, 0xFF, 0, 0, 0, 2, 0, 0, 0, 1])  # a BTH for QP 2
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            for i in range(40):
                s.sendto(probe + bytes([i]) * 20, ("::1", socks[i % PLANES].getsockname()[1]))
        got = []
        while len(got) < 40:
            data, anc, _, _ = await loop.run_in_executor(
                None, peer.recvmsg, 256, socket.CMSG_SPACE(4)
            )
            tclass = [int.from_bytes(c[2], "little") for c in anc if c[1] == socket.IPV6_TCLASS]
            got.append((data, tclass))
        assert sorted(d for d, _ in got) == sorted(
            bytes([0xFF]) + probe[1:] + bytes([i]) * 20 for i in range(40)
        )
        assert {tuple(t) for _, t in got} == {(TCLASS_CONTROL,)}
        assert len(held) == 40 and all(n >= 1 for n in held)
        assert transport.stats.datagrams_out == 40
        assert all(b.count == 0 for b in transport._tx)
        assert transport.send_raw(0, b"\xff outside a drain", to)  # sent at once
        assert all(b.count == 0 for b in transport._tx)
        assert (await loop.run_in_executor(None, peer.recv, 256)) == b"\xff outside a drain"
    finally:
        transport.close()
        peer.close()
        for s in socks:
            s.close()


async def test_one_read_of_every_socket_per_loop_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop calls the reader once per readable socket, back to back: the first call
    reads them all, a call right after it returns at once, and a later one reads what
    came meanwhile (the clock is a fake one, so "right after" is exact)."""
    now = [100.0]
    monkeypatch.setattr(transport_module, "clock", lambda: now[0])
    loop = asyncio.get_running_loop()
    socks = [open_plane_socket(("::1", 0)) for _ in range(PLANES)]
    seen: list[int] = []
    transport = Transport(
        loop, socks, lambda *route: ("::1", 9), connectionless=lambda d, s, p, f: seen.append(p)
    )
    for sock in socks:
        loop.remove_reader(sock.fileno())  # only the calls below read
    probe = bytes([0x0B, 0, 0xFF, 0xFF, 0, 0, 0, 2, 0, 0, 0, 1]) + bytes(20)  # for QP 2
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:

            def send(plane: int) -> None:
                s.sendto(probe, ("::1", socks[plane].getsockname()[1]))
                time.sleep(0.05)  # (delivered)

            send(0)
            send(1)
            transport._on_readable(0)  # as the loop calls it, for plane 0's socket
            assert sorted(seen) == [0, 1] and transport.stats.datagrams_in == 2
            send(1)
            now[0] += transport_module.SAME_TURN / 2
            transport._on_readable(1)  # the same poll: plane 1's socket, read already
            assert transport.stats.datagrams_in == 2
            now[0] += transport_module.SAME_TURN
            transport._on_readable(1)  # a later turn
            assert transport.stats.datagrams_in == 3 and sorted(seen) == [0, 1, 1]
    finally:
        transport.close()
        for sock in socks:
            sock.close()
