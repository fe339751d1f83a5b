"""The node on loopback data mode: two mrcd nodes in one loop, connected directly."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from mrcstack.core.events import (
    ConnectionFailed,
    PortStateChanged,
    SendCompleted,
    WcStatus,
    WriteImmReceived,
)
from mrcstack.core.memory import Access
from mrcstack.daemons.mrcd.config import AuthConfig
from mrcstack.daemons.mrcd.datapath import probes
from mrcstack.daemons.mrcd.datapath.transport import PROBE_QPN, open_plane_socket
from mrcstack.daemons.mrcd.node.node import Node
from mrcstack.daemons.mrcd.node.qps import IncomingConnect, QpAttrs, QpState
from mrcstack.daemons.mrcd.ops.metrics import make_registry
from mrcstack.errors import LocalError
from mrcstack.wire import CrcIntegrity, DataPacket, ProbePacket, encode, encode_plain
from tests.support.apiharness import FABRIC, Recorder, node_config
from tests.support.isolation import free_base


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[list[Node]]:
    loop = asyncio.get_running_loop()
    base = free_base((0, 2, 3), FABRIC.planes)
    psk = tmp_path / "cluster.key"
    psk.write_text(os.urandom(32).hex())
    nodes = [Node(node_config(0, base, psk), loop), Node(node_config(3, base, psk), loop)]
    for n in nodes:
        await n.start()
    try:
        yield nodes
    finally:
        for n in nodes:
            await n.stop(drain_timeout=0.1)


async def connect(nodes: list[Node], attrs: QpAttrs) -> tuple[int, int, Recorder, Recorder]:
    a, b = nodes
    ra, rb = Recorder(), Recorder()
    qa = a.create_qp(a.open_context(), attrs, ra)
    qb = b.create_qp(b.open_context(), attrs, rb)
    key = os.urandom(32)
    a.ready(qa, 3, qb, b.qp(qb).psn, key)
    b.ready(qb, 0, qa, a.qp(qa).psn, key)
    return qa, qb, ra, rb


async def test_write_between_two_nodes_lands_in_registered_memory(pair: list[Node]) -> None:
    a, b = pair
    qa, qb, ra, rb = await connect(pair, QpAttrs())
    dst = bytearray(16 << 20)
    mr = b.register(b.qp(qb).ctx, memoryview(dst), Access.REMOTE_WRITE)
    src = os.urandom(16 << 20)
    a.post_write(qa, 9, memoryview(src), mr.va, mr.rkey, imm=1234)
    (imm,) = await rb.wait_for(WriteImmReceived)
    (done,) = await ra.wait_for(SendCompleted)
    assert imm == WriteImmReceived(1234, 16 << 20)
    assert done == SendCompleted(9, WcStatus.SUCCESS, 16 << 20)
    assert dst == src
    conn = a.qp(qa).conn
    assert conn is not None and all(n > 0 for n in conn.stats.packets_sent)


async def test_admin_down_plane_carries_nothing_and_returns(pair: list[Node]) -> None:
    a, b = pair
    qa, qb, ra, _rb = await connect(pair, QpAttrs())
    dst = bytearray(4 << 20)
    mr = b.register(b.qp(qb).ctx, memoryview(dst), Access.REMOTE_WRITE)
    a.set_port_admin(2, False)
    conn = a.qp(qa).conn
    assert conn is not None
    before = conn.stats.packets_sent[2]
    a.post_write(qa, 1, memoryview(os.urandom(4 << 20)), mr.va, mr.rkey, imm=1)
    await ra.wait_for(SendCompleted)
    assert conn.stats.packets_sent[2] == before
    a.set_port_admin(2, True)
    a.post_write(qa, 2, memoryview(os.urandom(4 << 20)), mr.va, mr.rkey, imm=2)
    await ra.wait_for(SendCompleted, 2)
    assert conn.stats.packets_sent[2] > before


async def test_destroy_flushes_pending_work_and_bad_calls_fail_clearly(pair: list[Node]) -> None:
    a, b = pair
    qa, qb, ra, _rb = await connect(pair, QpAttrs())
    with pytest.raises(LocalError, match="no QP"):
        a.post_write(12345678, 1, memoryview(b"x"), 0, 1, None)
    with pytest.raises(LocalError, match="plane"):
        a.set_port_admin(9, False)
    b.destroy_qp(qb)  # the peer is gone: our write can never complete
    a.post_write(qa, 5, memoryview(os.urandom(1 << 20)), 0x1000, 1, None)
    a.destroy_qp(qa)
    (done,) = await ra.wait_for(SendCompleted)
    assert done.status is WcStatus.FLUSHED


async def test_snapshot_feeds_the_metrics_exporter(pair: list[Node]) -> None:
    a, b = pair
    qa, qb, ra, _rb = await connect(pair, QpAttrs())
    dst = bytearray(2 << 20)
    mr = b.register(b.qp(qb).ctx, memoryview(dst), Access.REMOTE_WRITE)
    a.post_write(qa, 1, memoryview(os.urandom(2 << 20)), mr.va, mr.rkey, imm=1)
    await ra.wait_for(SendCompleted)
    snap = a.snapshot()
    assert snap.connections == 1 and snap.planes == 4
    assert all(n > 0 for n in snap.traffic.bytes_sent)
    assert snap.rtt.count > 0 and snap.write_completion.count == 1
    assert sum(snap.evs["good"]) > 0
    a.destroy_qp(qa)
    after = a.snapshot()
    assert after.connections == 0
    assert after.traffic.bytes_sent == snap.traffic.bytes_sent  # counters never go down
    text = generate_latest(make_registry(a.snapshot)).decode()
    assert 'mrc_sent_bytes_total{plane="0"}' in text


async def test_connect_over_the_control_channel_with_private_data(pair: list[Node]) -> None:
    a, b = pair
    rb = Recorder()
    ctx_b = b.open_context()
    dst = bytearray(1 << 20)
    mr = b.register(ctx_b, memoryview(dst), Access.REMOTE_WRITE)

    async def on_request(req: IncomingConnect) -> None:
        assert req.remote_host == 0 and req.private_data == b"hello"
        qpn = b.create_qp(ctx_b, QpAttrs(), rb)
        b.accept(req.request_id, qpn, f"{mr.va}:{mr.rkey}".encode())

    b.listen(ctx_b, 7, on_request)
    ra = Recorder()
    qa = a.create_qp(a.open_context(), QpAttrs(), ra)
    reply = await a.connect_qp(qa, 3, 7, b"hello")
    va, rkey = (int(x) for x in reply.decode().split(":"))
    src = os.urandom(1 << 20)
    a.post_write(qa, 1, memoryview(src), va, rkey, imm=3)
    await rb.wait_for(WriteImmReceived)
    assert dst == src
    conn = a.qp(qa).conn
    assert conn is not None and conn.cfg.key is not None  # packets are authenticated
    with pytest.raises(LocalError, match="rejected"):
        await a.connect_qp(a.create_qp(a.open_context(), QpAttrs(), ra), 3, 99)


async def test_connectionless_ev_probe_measures_a_path(pair: list[Node]) -> None:
    a, _b = pair
    rtt = await a.probe(3, 1, 0x101, timeout=2.0)
    assert 0 < rtt < 2.0
    with pytest.raises(TimeoutError):
        await a.probe(1, 0, 0x000, timeout=0.2)  # no mrcd on h1: nothing answers
    with pytest.raises(LocalError):
        await a.probe(3, 1, 0x200, timeout=0.2)  # an EV of plane 2 on plane 1


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def test_malformed_datagrams_for_qp_2_are_counted_by_reason(pair: list[Node]) -> None:
    """QP 2 (the endpoint) carries only probes, their answers and port status updates:
    anything else sent there is rejected and counted (bounded reasons), like datagrams for
    a live QP."""
    a, b = pair
    dst = b.data_address(b.host, 1)
    probe = encode(ProbePacket(PROBE_QPN, 0x101, 1, 1, 5), CrcIntegrity())
    data = DataPacket(qpn=PROBE_QPN, psn=1, va=0, rkey=1, payload=b"x", ev=0x101, port=1,
                      tx_seq=1, ts_ns=0)  # fmt: skip
    sent = {
        "bad_checksum": probe[:-1] + bytes([probe[-1] ^ 1]),  # a forged or corrupted probe
        "truncated": probe[:20],
        "bad_opcode": bytes(7) + bytes([PROBE_QPN]) + bytes(4),  # a bare BTH for QP 2
        "probe_unexpected": encode_plain(data, CrcIntegrity()),  # well formed, but data
        "probe_source": probe,  # a good probe from an address that is no host's NIC
    }
    before = dict(b.snapshot().traffic.rejections)
    with contextlib.ExitStack() as stack:
        while True:  # an ephemeral port that is no host's plane-1 port (almost any)
            s = stack.enter_context(socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
            s.bind(("::1", 0))
            if b.host_of(s.getsockname()[:2], 1) is None:
                break
        for datagram in sent.values():
            s.sendto(datagram, dst)

    def rejected() -> dict[str, int]:
        after = b.snapshot().traffic.rejections
        return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}

    await wait_until(lambda: sum(rejected().values()) >= len(sent))
    assert rejected() == dict.fromkeys(sent, 1)
    assert await a.probe(3, 1, 0x101, timeout=2.0) > 0  # real probes still work
    text = generate_latest(make_registry(b.snapshot)).decode()
    assert 'mrc_rejected_packets_total{reason="probe_source"} 1.0' in text


async def test_destroy_completes_each_pending_write_once_and_keeps_no_record(
    pair: list[Node], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = pair
    qa, qb, ra, _rb = await connect(pair, QpAttrs())
    b.destroy_qp(qb)  # nothing will ever acknowledge our writes
    for wr_id in range(3):
        a.post_write(qa, wr_id, memoryview(os.urandom(1 << 16)), 0x1000, 1, None)
    assert a.writes_in_flight() == 3
    a.destroy_qp(qa)
    done = [e for e in ra.events if isinstance(e, SendCompleted)]
    assert done == [SendCompleted(i, WcStatus.FLUSHED, 1 << 16) for i in range(3)]
    assert a.writes_in_flight() == 0 and qa not in a.qps
    assert "event=connection_failed" not in caplog.text  # our own teardown is no failure


async def test_a_failed_connection_keeps_no_record_of_its_writes(pair: list[Node]) -> None:
    a, b = pair
    attrs = QpAttrs(timeout=1e-3, linear_cnt=1, exp_cnt=1)
    qa, qb, ra, _rb = await connect(pair, attrs)
    b.destroy_qp(qb)
    for wr_id in range(3):
        a.post_write(qa, wr_id, memoryview(os.urandom(1 << 16)), 0x1000, 1, None)
    (failed,) = await ra.wait_for(ConnectionFailed)
    assert [e.status for e in ra.events if isinstance(e, SendCompleted)] == [
        WcStatus.RETRY_EXCEEDED,
        WcStatus.FLUSHED,
        WcStatus.FLUSHED,
    ]
    assert a.writes_in_flight() == 0 and a.qp(qa).failure == failed.reason


async def test_quiesce_drain_and_fail_all(
    pair: list[Node], caplog: pytest.LogCaptureFixture
) -> None:
    """A stopping node takes no new work, lets what is posted finish, fails the rest."""
    a, b = pair
    qa, qb, ra, _rb = await connect(pair, QpAttrs())
    stuck, gone, rs, _ = await connect(pair, QpAttrs())
    b.destroy_qp(gone)
    dst = bytearray(4 << 20)
    mr = b.register(b.qp(qb).ctx, memoryview(dst), Access.REMOTE_WRITE)
    src = os.urandom(4 << 20)
    a.post_write(qa, 1, memoryview(src), mr.va, mr.rkey, imm=None)
    a.post_write(stuck, 2, memoryview(src[:4096]), 0x1000, 1, imm=None)
    a.quiesce()
    with pytest.raises(LocalError, match="stopping"):
        a.post_write(qa, 3, memoryview(src[:10]), mr.va, mr.rkey, imm=None)
    with pytest.raises(LocalError, match="stopping"):
        a.create_qp(a.qp(qa).ctx, QpAttrs(), ra)
    with pytest.raises(LocalError, match="stopping"):
        await a.connect_qp(qa, 3, 7)
    # The write with a live peer completes while quiesced; the stuck one cannot.
    await ra.wait_for(SendCompleted)
    assert not await a.drain(0.05)
    assert a.fail_all("mrcd stopping") == 1
    assert [e for e in ra.events if isinstance(e, SendCompleted)] == [
        SendCompleted(1, WcStatus.SUCCESS, 4 << 20)
    ]
    assert [e for e in rs.events if isinstance(e, SendCompleted)] == [
        SendCompleted(2, WcStatus.FLUSHED, 4096)
    ]
    assert isinstance(rs.events[-1], ConnectionFailed) and a.qp(stuck).state is QpState.ERROR
    assert await a.drain(0) and a.writes_in_flight() == 0 and dst == src
    assert "event=connection_failed" not in caplog.text


@pytest.mark.parametrize("broken", ["key file", "control port"])
async def test_a_failed_start_closes_what_it_opened(
    pair: list[Node], tmp_path: Path, broken: str
) -> None:
    """A node that cannot start (an unreadable key, a control port in use) leaves no socket
    open: the same ports bind again at once."""
    a, _b = pair
    cfg = a.cfg
    cfg = dataclasses.replace(cfg, host=2, control_address=("::1", 0))  # h2 runs no node
    if broken == "key file":
        cfg = dataclasses.replace(cfg, auth=AuthConfig(mode="psk", psk_file=tmp_path / "no.key"))
    else:
        cfg = dataclasses.replace(cfg, control_address=a.cfg.control_address)  # a's: in use
    fds = len(os.listdir("/proc/self/fd"))
    node = Node(cfg, asyncio.get_running_loop())
    with pytest.raises(LocalError):
        await node.start()
    assert len(os.listdir("/proc/self/fd")) == fds
    assert node.transport is None and node.control_client is None
    for plane in range(FABRIC.planes):
        open_plane_socket(node.data_address(node.host, plane)).close()


async def test_port_status_update_takes_a_peers_plane_out_and_back(pair: list[Node]) -> None:
    """A peer's PORT_STATUS_UPDATE acts on our QPs to it like the bitmap in its SACKs: its
    down plane is out of use at once (the next packets avoid it), and back when it says so."""
    a, b = pair
    qa, qb, ra, _rb = await connect(pair, QpAttrs())
    dst = bytearray(1 << 20)
    mr = b.register(b.qp(qb).ctx, memoryview(dst), Access.REMOTE_WRITE)
    conn = a.qp(qa).conn
    assert conn is not None
    stuck_qp = a.create_qp(a.open_context(), QpAttrs(), ra)  # never connected: untouched

    a.on_port_status(3, 0b1011)  # h3: plane 2 is down
    a.on_port_status(1, 0b0000)  # another host: nothing of ours goes there
    await ra.wait_for(PortStateChanged)  # the owner hears it with the transport's next flush
    assert [e for e in ra.events if isinstance(e, PortStateChanged)] == [
        PortStateChanged(2, False, remote=True)
    ]
    assert a.qp(stuck_qp).conn is None
    sent = list(conn.stats.packets_sent)
    a.post_write(qa, 1, memoryview(os.urandom(32 << 10)), mr.va, mr.rkey, imm=None)
    await asyncio.sleep(0)  # the first flight leaves (before any ACK could say otherwise)
    first = [n - s for n, s in zip(conn.stats.packets_sent, sent, strict=True)]
    assert first[2] == 0 and sum(first) >= 4, first
    await ra.wait_for(SendCompleted)
    a.on_port_status(3, 0b1111)  # back
    await ra.wait_for(PortStateChanged, 2)
    assert PortStateChanged(2, True, remote=True) in ra.events
    sent = list(conn.stats.packets_sent)
    a.post_write(qa, 2, memoryview(os.urandom(1 << 20)), mr.va, mr.rkey, imm=None)
    await ra.wait_for(SendCompleted, 2)
    assert conn.stats.packets_sent[2] > sent[2]


async def test_probes_are_authenticated_and_rate_limited(pair: list[Node]) -> None:
    """A probe sealed with the pair's key is answered with the port bitmap; a CRC-only one
    from the same host without it (both counted as answers, by how they were authenticated,
    not as rejections); a burst past the per-source rate is refused; every refusal is
    counted by reason in /metrics."""
    a, b = pair
    dst = b.data_address(b.host, 1)
    before = dict(b.snapshot().traffic.rejections)
    answered_before = dict(b.snapshot().probe_answers)

    def rejected() -> dict[str, int]:
        after = b.snapshot().traffic.rejections
        return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}

    def answered() -> dict[str, int]:
        after = b.snapshot().probe_answers
        return {k: v - answered_before[k] for k, v in after.items() if v != answered_before[k]}

    assert await a.probe(3, 1, 0x101, timeout=2.0) > 0  # sealed with h0-h3's key
    assert answered() == {"sealed": 1} and rejected() == {}
    crc_only = encode(ProbePacket(PROBE_QPN, 0x101, 1, 1 << 40, 5), a.prober._crc(b.host))
    assert a._send_raw(1, crc_only, dst)  # from h0's own plane-1 socket
    await wait_until(lambda: answered() == {"sealed": 1, "icrc": 1})
    assert rejected() == {}
    burst = 2 * int(probes.PROBE_BURST)
    for i in range(burst):
        sealed = a.prober._seal(ProbePacket(PROBE_QPN, 0x101, 1, (1 << 41) + i, 7), 3)
        a._send_raw(1, sealed, dst)
    await wait_until(lambda: rejected().get("probe_rate", 0) > 0)
    await asyncio.sleep(0.2)
    refused = rejected()["probe_rate"]
    assert 0 < refused <= burst - probes.PROBE_BURST + 1
    assert rejected() == {"probe_rate": refused}
    assert answered()["sealed"] > probes.PROBE_BURST // 2  # the burst's first, answered
    text = generate_latest(make_registry(b.snapshot)).decode()
    assert f'mrc_rejected_packets_total{{reason="probe_rate"}} {float(refused)}' in text
    icrc = float(answered_before["icrc"] + 1)
    assert f'mrc_probe_answers_total{{auth="icrc"}} {icrc}' in text
    assert 'mrc_probe_answers_total{auth="icrc_no_key"}' in text  # shown before it happens
    assert "probe_unauthenticated" not in text
