"""Data-path workers (``workers = 2``) on two loopback mrcds: QPs spread over the workers,
each write verified byte for byte, a worker's death failing only its own QPs."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from mrcstack.api import AsyncEventType, QpState, WcStatus, WriteWr
from mrcstack.core.cc import REGISTRY
from mrcstack.core.config import ConnectionConfig
from mrcstack.core.connection import Connection
from mrcstack.core.evs import EvEntry
from mrcstack.core.memory import MemoryTable
from mrcstack.daemons.lifecycle import process_cpu
from mrcstack.daemons.mrcd.datapath.probes import ProbeAuth
from mrcstack.daemons.mrcd.datapath.steer import probe_owner
from mrcstack.daemons.mrcd.datapath.transport import Transport, open_plane_socket
from mrcstack.daemons.mrcd.node.workers import pool as pool_module
from mrcstack.daemons.mrcd.node.workers.pool import WorkerPool
from mrcstack.daemons.mrcd.node.workers.remote import RemoteConnection
from mrcstack.daemons.mrcd.node.workers.shards import ShardedProbeIds
from mrcstack.errors import LocalError
from tests.support import workers as dying
from tests.support.apiharness import WAIT, Daemons, End, connect, drain, wait_for

QPS = 4
SIZE = 1 << 20


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    d = Daemons(tmp_path, workers=2)
    try:
        yield d.start()
    finally:
        d.stop()


def pool(d: Daemons, host: int) -> WorkerPool:
    transport = d.nodes[host].transport
    assert isinstance(transport, WorkerPool)
    return transport


def pairs(d: Daemons, n: int, service: int = 7) -> list[tuple[End, End]]:
    return [connect(d, SIZE, service=service + i) for i in range(n)]


def write_and_verify(a: End, b: End, wr_id: int) -> None:
    """One write of the whole region with immediate; the receiver's bytes equal the sender's."""
    payload = os.urandom(SIZE)
    a.mr.buf[:] = payload
    a.qp.post_send(WriteWr(wr_id, (a.mr, 0, SIZE), b.mr.addr, b.mr.rkey, imm=wr_id))
    (sent,) = drain(a.cq, 1)
    assert (sent.wr_id, sent.status) == (wr_id, WcStatus.SUCCESS)
    (got,) = drain(b.cq, 1)
    assert (got.imm, got.byte_len) == (wr_id, SIZE)
    assert bytes(b.mr.buf) == payload


def test_qps_spread_over_the_workers_and_every_write_lands(daemons: Daemons) -> None:
    conns = pairs(daemons, QPS)
    for host, side in ((0, 0), (3, 1)):
        owners = [pool(daemons, host).worker_index(c[side].qp.qpn) for c in conns]
        assert sorted(owners) == [0, 0, 1, 1], owners
        info = daemons.on_loop(lambda h=host: daemons.nodes[h].qp_info())  # type: ignore[misc]
        assert sorted(q["worker"] for q in info) == [0, 0, 1, 1]
        assert all(q["qpn"] % 2 == q["worker"] for q in info)
    for i, (a, b) in enumerate(conns):
        write_and_verify(a, b, 100 + i)

    def counted() -> bool:  # the workers' counters, summed at their next status
        return daemons.nodes[3].snapshot().traffic.data_bytes_placed >= QPS * SIZE

    daemons.run(wait_for(counted, WAIT))

    def windows_reported() -> bool:  # each worker's status carries its QPs' windows
        info = daemons.nodes[0].qp_info()
        # An RTT exists only in a status (it comes with the window); none before one.
        return all(
            q["srtt"] is not None and q["cwnd"] > 0 and q["in_flight"] == 0  # type: ignore[operator]
            for q in info
        )

    daemons.run(wait_for(windows_reported, WAIT))
    daemons.run(wait_for(lambda: daemons.nodes[0].snapshot().rtt.count > 0, WAIT))
    snap = daemons.nodes[3].snapshot()
    assert snap.worker_qps == (2, 2)
    # Each worker's CPU is its own process's (both started, both carried writes).
    own = [process_cpu(w.process.pid or 0) for w in pool(daemons, 3).workers]
    assert len(snap.worker_cpu) == 2 and all(c > 0 for c in snap.worker_cpu), snap.worker_cpu
    assert all(t is not None and t >= c for t, c in zip(own, snap.worker_cpu, strict=True))
    assert snap.traffic.rejections["wrong_worker"] == 0
    assert snap.traffic.rejections["unknown_qpn"] == 0
    assert pool(daemons, 3).stats.datagrams_in > 0
    # The receiving QPs probe the paths of their ACKs (with the ICRC): host 0's workers
    # answer those themselves; its daemon's prober answers none of them.
    daemons.run(wait_for(lambda: sum(pool(daemons, 0).probe_counts("answers").values()) > 0, WAIT))
    own = daemons.nodes[0].prober.answers
    assert own[ProbeAuth.ICRC] == own[ProbeAuth.ICRC_NO_KEY] == 0, own
    answers = daemons.nodes[0].snapshot().probe_answers
    assert answers["icrc"] + answers["icrc_no_key"] > 0, answers


def test_a_dead_worker_fails_only_its_qps_and_is_replaced(daemons: Daemons) -> None:
    conns = pairs(daemons, QPS)
    p = pool(daemons, 0)
    victim = 1
    pid = p.workers[victim].process.pid
    assert pid is not None
    doomed = [c for c in conns if p.worker_index(c[0].qp.qpn) == victim]
    spared = [c for c in conns if c not in doomed]
    assert len(doomed) == 2 and len(spared) == 2
    n = 16  # writes in flight on the first doomed QP when its worker dies
    a, b = doomed[0]
    a.qp.post_send([WriteWr(i, (a.mr, 0, SIZE), b.mr.addr, b.mr.rkey) for i in range(n)])
    before = daemons.nodes[0].snapshot().worker_cpu[victim]
    assert before > 0
    os.kill(pid, signal.SIGKILL)
    wcs = drain(a.cq, n)  # each once: done before the death, or flushed
    assert sorted(w.wr_id for w in wcs) == list(range(n))
    assert {w.status for w in wcs} <= {WcStatus.SUCCESS, WcStatus.WR_FLUSH_ERR}
    for a, _b in doomed:
        event = a.ctx.get_async_event(timeout=WAIT)
        assert event is not None and event.type is AsyncEventType.QP_FATAL
        assert event.qpn == a.qp.qpn
        assert f"data-path worker {victim} (pid {pid}) died" in event.reason
        assert "signal 9" in event.reason
        assert a.qp.query().state is QpState.ERROR
    for i, (a, b) in enumerate(spared):
        assert a.qp.query().state is QpState.RTS
        write_and_verify(a, b, 200 + i)
    daemons.run(wait_for(lambda: p.restarts == 1 and p.workers[victim].process.pid != pid))
    new_cpu = process_cpu(p.workers[victim].process.pid or 0)
    assert new_cpu is not None
    snap = daemons.nodes[0].snapshot()
    assert (snap.workers, snap.worker_restarts, snap.worker_qps) == (2, 1, (2, 0))
    # The worker's CPU counter carries on: the dead process's time, then the new one's.
    assert snap.worker_cpu[victim] >= before + new_cpu, (snap.worker_cpu, before, new_cpu)
    # New QPs after the restart: the restarted worker takes its share and carries it.
    fresh = pairs(daemons, 2, service=50)
    assert sorted(p.worker_index(a.qp.qpn) for a, _b in fresh) == [0, 1]
    for i, (a, b) in enumerate(fresh):
        write_and_verify(a, b, 300 + i)
    assert daemons.nodes[0].snapshot().worker_qps == (3, 1)


def test_a_worker_that_dies_before_it_is_ready_fails_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restarting it would fail again: mrcd does not start, says which worker died and how,
    and leaves no worker running."""
    monkeypatch.setattr(pool_module, "process", dying)  # worker 1 exits at once
    d = Daemons(tmp_path, workers=2)
    try:
        with pytest.raises(LocalError, match=r"data-path worker 1 \(pid \d+\) died") as err:
            d.start()
        assert str(err.value).endswith(f"(exit status {dying.STATUS}) before it was ready")
        assert not [p for p in multiprocessing.active_children() if p.name.startswith("mrcd-")]
    finally:
        d.stop()


def bth(qpn: int) -> bytes:
    """A runt BTH-shaped datagram for ``qpn`` (opcode RDMA WRITE ONLY, nothing else valid)."""
    return struct.pack(">BBHI", 0x0A, 0, 0xFFFF, qpn & 0xFFFFFF) + bytes(8)


@pytest.mark.asyncio
async def test_a_datagram_for_another_workers_qp_is_counted_and_dropped() -> None:
    """Worker 0 of 2 (its socket fed directly, as if steering had failed): datagrams for odd
    QPNs are counted as wrong_worker and dropped; even ones are this worker's unknown QPs."""
    loop = asyncio.get_running_loop()
    sock = open_plane_socket(("::1", 0))
    sender = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    transport = Transport(loop, [sock], lambda *a: ("::1", 1))
    transport.shard, transport.shards = 0, 2
    try:
        odd = [1, 3, 0x123457, 0xFFFFFF]
        even = [4, 0x123456, 0xFFFFFE]
        for qpn in odd + even:
            sender.sendto(bth(qpn), sock.getsockname()[:2])
        deadline = loop.time() + WAIT
        while transport.stats.datagrams_in < len(odd + even) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert transport.stats.wrong_worker == len(odd)
        assert transport.stats.unknown_qpn == len(even)
    finally:
        transport.close()
        sock.close()
        sender.close()


@pytest.mark.parametrize("cc", sorted(REGISTRY))
def test_a_workers_qp_shows_the_starting_window_before_its_first_status(cc: str) -> None:
    """Not 0/0: the node shows what an in-process connection of the same config would."""
    evs = tuple(EvEntry(p << 8 | i, p) for p in range(2) for i in range(2))
    cfg = ConnectionConfig(local_qpn=5, remote_qpn=6, planes=2, evs=evs, cc=cc)
    local = Connection(cfg, memory=MemoryTable(), rng=random.Random(1), now=0.0)
    remote = RemoteConnection(5, 0, cfg, lambda _msg: None)
    assert remote.window() == local.window()
    assert remote.window()[0] > 0


def test_probe_ids_tell_their_owner() -> None:
    workers = 2
    ids = [ShardedProbeIds(s, workers + 1) for s in range(workers + 1)]
    for shard, table in enumerate(ids):
        for _ in range(200):
            ident = table.allocate(qpn=5)
            assert probe_owner(ident, workers) == shard
            assert table.owner(ident) == 5


def test_failing_a_workers_qp_here_completes_each_write_once(daemons: Daemons) -> None:
    """As in-process: the node's failure flushes the pending writes at once, and what the
    worker says of them afterwards is not heard twice."""
    ((a, b),) = pairs(daemons, 1)
    n = 16
    a.qp.post_send([WriteWr(i, (a.mr, 0, SIZE), b.mr.addr, b.mr.rkey) for i in range(n)])
    flushed = daemons.on_loop(lambda: daemons.nodes[0].fail_all("failed here for the test"))
    wcs = drain(a.cq, n)
    assert sorted(w.wr_id for w in wcs) == list(range(n))
    statuses = [w.status for w in wcs]
    assert statuses.count(WcStatus.WR_FLUSH_ERR) == flushed > 0
    assert set(statuses) <= {WcStatus.SUCCESS, WcStatus.WR_FLUSH_ERR}
    event = a.ctx.get_async_event(timeout=WAIT)
    assert event is not None and event.type is AsyncEventType.QP_FATAL
    assert event.reason == "failed here for the test"
    assert a.ctx.get_async_event(timeout=0.5) is None  # once
    assert a.cq.poll(64) == []
