"""A peer that dies, restarts or blips, on two real nodes in one loop (loopback data mode).

The signals are real: the control channel's TCP connections close or reset, probes go out
on the plane sockets, PORT_STATUS travels the control channel.  The live versions (SIGKILL
of a daemon, NICs down on the namespace testbed) are in ``test_dead_peer.py``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mrcstack.core.events import ConnectionFailed, SendCompleted, WcStatus, WriteImmReceived
from mrcstack.core.memory import Access
from mrcstack.daemons.mrcd.control.client import Session
from mrcstack.daemons.mrcd.node.node import Node
from mrcstack.daemons.mrcd.node.qps import IncomingConnect, QpAttrs, QpState
from tests.support.apiharness import FABRIC, Recorder, node_config
from tests.support.isolation import free_base

MIB = 1 << 20
WAIT_STEPS = 2000  # x 5 ms: how long a test waits for an announcement to arrive


@pytest.fixture
async def trio(tmp_path: Path) -> AsyncIterator[tuple[Node, Node, int, Path]]:
    """Nodes h0 and h3 (and the base port and key to start another h3 with)."""
    loop = asyncio.get_running_loop()
    base = free_base((0, 2, 3), FABRIC.planes)
    psk = tmp_path / "cluster.key"
    psk.write_text(os.urandom(32).hex())
    a, b = Node(node_config(0, base, psk), loop), Node(node_config(3, base, psk), loop)
    await a.start()
    await b.start()
    try:
        yield a, b, base, psk
    finally:
        for n in (a, b):
            await n.stop(drain_timeout=0.1)


class Peer:
    """An application on h3 that accepts one QP per connect into one region."""

    def __init__(self, node: Node, service: int = 7, size: int = 64 * MIB) -> None:
        self.node = node
        self.rec = Recorder()
        self.ctx = node.open_context()
        self.dst = bytearray(size)
        self.mr = node.register(self.ctx, memoryview(self.dst), Access.REMOTE_WRITE)
        self.qpns: list[int] = []

        async def on_request(req: IncomingConnect) -> None:
            qpn = node.create_qp(self.ctx, QpAttrs(), self.rec)
            self.qpns.append(qpn)
            node.accept(req.request_id, qpn, b"")

        node.listen(self.ctx, service, on_request)


async def connected(a: Node, peer: Peer) -> tuple[int, Recorder]:
    rec = Recorder()
    qpn = a.create_qp(a.open_context(), QpAttrs(), rec)
    await a.connect_qp(qpn, 3, 7)
    return qpn, rec


def session(node: Node, peer: str = "h3") -> Session:
    assert node.control_client is not None
    return node.control_client._sessions[peer]


def reset(s: Session) -> None:
    """Reset the session's TCP connection (RST), as a middlebox or ``ss -K`` would."""
    s._writer.transport.abort()


async def write_and_verify(a: Node, qpn: int, rec: Recorder, peer: Peer, wr_id: int) -> None:
    src = os.urandom(MIB)
    done = len([e for e in rec.events if isinstance(e, SendCompleted)])
    a.post_write(qpn, wr_id, memoryview(src), peer.mr.va, peer.mr.rkey, imm=wr_id)
    await rec.wait_for(SendCompleted, done + 1)
    assert rec.events[-1] == SendCompleted(wr_id, WcStatus.SUCCESS, MIB)
    assert peer.dst[:MIB] == src


async def test_a_dead_peer_mrcd_fails_every_pending_write_once_and_a_new_one_connects(
    trio: tuple[Node, Node, int, Path],
) -> None:
    """The peer's mrcd goes away (its control server closes, nothing listens): our session
    ends, the reconnect is refused, and the QP fails at once, not after its retry budget."""
    a, b, base, psk = trio
    peer = Peer(b)
    qpn, rec = await connected(a, peer)
    assert a.qp(qpn).peer_instance == b.instance
    # Make the writes wait for us: the peer's data path is gone before its control channel.
    assert b.transport is not None
    b.transport.close()
    b.transport = None
    for wr in range(3):
        a.post_write(qpn, wr, memoryview(bytes(4 * MIB)), peer.mr.va, peer.mr.rkey, imm=None)
    await b.stop(drain_timeout=0)  # (b's QP is gone; it tells no one but by closing)
    done = await rec.wait_for(SendCompleted, 3, timeout=10)
    assert [(e.wr_id, e.status) for e in done] == [  # type: ignore[attr-defined]
        (0, WcStatus.RETRY_EXCEEDED),
        (1, WcStatus.FLUSHED),
        (2, WcStatus.FLUSHED),
    ]
    (failed,) = await rec.wait_for(ConnectionFailed)
    assert "peer gone" in failed.reason and "refused" in failed.reason  # type: ignore[attr-defined]
    assert a.peers.failures["control_refused"] == 1
    assert a.qp(qpn).state is QpState.ERROR
    budget = a.qp(qpn).conn.retry_budget()  # type: ignore[union-attr]
    assert budget > 0.5  # (what the daemon would otherwise have waited)

    # The same host comes back with a new mrcd on the same config: a new connect works.
    loop = asyncio.get_running_loop()
    b2 = Node(node_config(3, base, psk), loop)
    await b2.start()
    try:
        assert b2.instance != b.instance
        peer2 = Peer(b2)
        qpn2, rec2 = await connected(a, peer2)
        assert a.qp(qpn2).peer_instance == b2.instance
        await write_and_verify(a, qpn2, rec2, peer2, 1)
        assert len([e for e in rec.events if isinstance(e, SendCompleted)]) == 3  # no more
    finally:
        await b2.stop(drain_timeout=0.1)


async def test_a_restarted_peer_is_recognized_by_its_instance(
    trio: tuple[Node, Node, int, Path],
) -> None:
    """After a reset the session comes back to a different instance of the peer: the QPs
    made with the old one are dead there and fail here, with the peer named."""
    a, b, _base, _psk = trio
    peer = Peer(b)
    _qpn, rec = await connected(a, peer)
    b.instance = "feed0001"  # what a restarted mrcd on the same address answers with
    reset(session(a))
    (failed,) = await rec.wait_for(ConnectionFailed, timeout=10)
    assert "peer restarted" in failed.reason  # type: ignore[attr-defined]
    assert a.peers.failures["restarted"] == 1


async def test_a_momentary_control_reset_fails_nothing(
    trio: tuple[Node, Node, int, Path],
) -> None:
    """Reset the control connection only: both ends reconnect to the same instance, the QPs
    stay up and the data keeps flowing, verified."""
    a, b, _base, _psk = trio
    peer = Peer(b)
    qpn, rec = await connected(a, peer)
    await write_and_verify(a, qpn, rec, peer, 1)
    reset(session(a))

    async def restored() -> None:
        while a.peers.restored < 1 or b.peers.restored < 1:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(restored(), 10)  # each end confirmed the other is the same
    await write_and_verify(a, qpn, rec, peer, 2)
    assert a.qp(qpn).state is QpState.RTS and b.qp(peer.qpns[0]).state is QpState.RTS
    assert sum(a.peers.failures.values()) == sum(b.peers.failures.values()) == 0
    assert not [e for e in rec.events if isinstance(e, ConnectionFailed)]


async def test_ports_going_down_are_announced_and_an_answering_peer_is_kept(
    trio: tuple[Node, Node, int, Path],
) -> None:
    """A node whose ports all go down tells its peers over the control channel at once (no
    SACK could).  The peer probes: here the probes are answered (loopback data mode does
    not follow admin state), so the QP is kept, and resumes when the ports come back."""
    a, b, _base, _psk = trio
    peer = Peer(b)
    qpn, rec = await connected(a, peer)
    conn = a.qp(qpn).conn
    assert conn is not None
    for plane in range(FABRIC.planes):
        b.set_port_admin(plane, False)

    async def until(cond: object) -> None:
        while not cond():  # type: ignore[operator]
            await asyncio.sleep(0.01)

    await asyncio.wait_for(until(lambda: not conn.evs.up_planes), 10)
    await asyncio.wait_for(until(lambda: a.peers._alive_at.get(3) is not None), 10)
    assert a.qp(qpn).state is QpState.RTS and sum(a.peers.failures.values()) == 0
    for plane in range(FABRIC.planes):
        b.set_port_admin(plane, True)
    await asyncio.wait_for(until(lambda: len(conn.evs.up_planes) == FABRIC.planes), 10)
    await write_and_verify(a, qpn, rec, peer, 3)
    await peer.rec.wait_for(WriteImmReceived)


async def test_a_port_going_down_is_announced_over_the_fabric(
    trio: tuple[Node, Node, int, Path],
) -> None:
    """h3 disables its plane-1 port: the PORT_STATUS_UPDATE goes over the fabric (sealed
    with the pair's probe key, on the planes still up), and h0's connection stops spraying
    plane 1 before any SACK carries the bitmap."""
    a, b, _, _ = trio
    peer = Peer(b)
    qpn, rec = await connected(a, peer)
    await write_and_verify(a, qpn, rec, peer, 1)
    conn = a.qp(qpn).conn
    assert conn is not None and conn.evs.remote_port_up[1]
    b.set_port_admin(1, False)
    for _ in range(WAIT_STEPS):  # (a bound, not a measurement: it comes in milliseconds)
        if not conn.evs.remote_port_up[1]:
            break
        await asyncio.sleep(0.005)
    assert not conn.evs.remote_port_up[1]
    assert 3 in a.prober._port_ts  # it came as a PORT_STATUS_UPDATE datagram
    b.set_port_admin(1, True)
    for _ in range(WAIT_STEPS):
        if conn.evs.remote_port_up[1]:
            break
        await asyncio.sleep(0.005)
    assert conn.evs.remote_port_up[1]
    await write_and_verify(a, qpn, rec, peer, 2)
