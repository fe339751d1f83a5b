"""The application API end to end: two mrcds (loopback data mode, real control channel),
programs using mrcstack.api over their Unix sockets, data in shared memory."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mrcstack.api import (
    ApiError,
    AsyncEventType,
    CompletionQueue,
    Device,
    Opcode,
    QpAttr,
    QpCap,
    QpHint,
    QpState,
    SendWr,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WriteWr,
    shm,
    wire,
)
from mrcstack.api import client as api_client
from mrcstack.daemons.mrcd.node.qps import QpAttrs
from mrcstack.qpn import qpn_text
from tests.support import REPO
from tests.support.apiharness import WAIT, Daemons, connect, drain, end

ROOT = REPO


def test_query_device_and_context_objects(daemons: Daemons) -> None:
    with Device.open(daemons.sockets[0]) as dev:
        attr = dev.query_device()
        assert (
            attr.host == 0 and attr.planes == 4 and attr.max_wimm > 0 and attr.protocol_version == 1
        )
        ctx = dev.create_context()
        hint = ctx.create_qp_hint(QpHint(num_qps_per_peer=2))
        assert ctx.query_qp_hint(hint).num_qps_per_peer == 2
        cq = ctx.create_cq(16)
        qp = ctx.create_qp(
            cq, attr=QpAttr(timeout=5e-3, linear_cnt=2, exp_cnt=25, hint=hint), cap=QpCap(8, 8)
        )
        info = qp.query()
        assert info.state is QpState.RESET and info.attr.timeout == 5e-3 and info.attr.exp_cnt == 25
        assert info.attr.hint == hint and info.cap == QpCap(8, 8)
        assert qp.modify(max_wimm=4).max_wimm == 4
        with pytest.raises(ApiError, match=r"linear_cnt: must be in 0\.\.7") as err:
            qp.modify(linear_cnt=9)
        assert err.value.errno == errno.EINVAL
        with pytest.raises(ApiError, match="no EV profile 77") as err:
            qp.modify(ev_profile_id=77)
        assert err.value.errno == errno.ENOENT
        with pytest.raises(ApiError, match="still used"):
            ctx.destroy_qp_hint(hint)
        with pytest.raises(ApiError, match="used by 1 QP"):
            cq.destroy()
        default = ctx.create_qp(cq)  # no timeout given: the daemon's (see QpAttrs)
        assert default.query().attr.timeout == QpAttrs().timeout == 10e-3
        default.destroy()
        qp.destroy()
        cq.destroy()
        ctx.destroy_qp_hint(hint)
        ctx.close()


def test_write_with_immediate_lands_in_the_receivers_own_mapping(daemons: Daemons) -> None:
    size = 4 << 20
    a, b = connect(daemons, size)
    payload = os.urandom(size)
    a.mr.buf[:] = payload  # the sender's memory: mrcd reads it in place
    chunk = size // 4
    wrs = [
        WriteWr(
            100 + i,
            (a.mr, i * chunk, chunk),
            b.mr.addr + i * chunk,
            b.mr.rkey,
            imm=i,
            signaled=i != 1,
        )
        for i in range(4)
    ]
    a.qp.post_send(wrs)  # one batch
    sent = drain(a.cq, 3)
    assert [w.wr_id for w in sent] == [100, 102, 103]  # in order; 101 was unsignaled
    assert all(w.status is WcStatus.SUCCESS and w.opcode is WcOpcode.RDMA_WRITE for w in sent)
    got = drain(b.cq, 4)
    assert [(w.wr_id, w.imm, w.byte_len) for w in got] == [(i, i, chunk) for i in range(4)]
    assert all(w.opcode is WcOpcode.RECV_RDMA_WITH_IMM and w.qpn == b.qp.qpn for w in got)
    # The receiver's client mapping holds the bytes: no copy between mrcd and the program.
    assert bytes(b.mr.buf) == payload
    info = a.qp.query()
    assert info.state is QpState.RTS and info.remote_host == 3 and info.remote_qpn == b.qp.qpn
    assert info.outstanding_sends == 0
    assert b.qp.query().posted_recvs == 64 - 4
    with pytest.raises(ApiError, match="fixed once connected") as err:
        a.qp.modify(timeout=1e-3)
    assert err.value.errno == errno.EBUSY


def test_bad_requests_fail_clearly_and_touch_no_memory(daemons: Daemons) -> None:
    a, b = connect(daemons, 1 << 16)
    other = b.ctx.reg_mr(1 << 16)  # a second region next to the target: must stay zero
    a.mr.buf[:] = b"\xab" * len(a.mr.buf)
    conn = a.ctx.conn

    def raw_post(**fields: int) -> None:
        base = {"wr_id": 1, "opcode": 0, "flags": 1, "lkey": a.mr.lkey, "offset": 0, "length": 64,
                "remote_addr": b.mr.addr, "rkey": b.mr.rkey, "imm": 0}  # fmt: skip
        rec = wire.SendWrRecord(**(base | fields))
        req_id = conn.next_id()
        conn.post(wire.encode_post_send(req_id, a.qp.qpn, [rec]), req_id)

    with pytest.raises(ApiError, match=r"unknown lkey 0x1bad") as err:
        raw_post(lkey=0x1BAD)  # a hostile client: mrcd checks every key itself
    assert err.value.errno == errno.EINVAL
    with pytest.raises(ApiError, match=r"local range 65000\+1000 leaves lkey"):
        a.qp.post_send(WriteWr(2, (a.mr, 65000, 1000), b.mr.addr, b.mr.rkey))
    with pytest.raises(ApiError, match=r"local range .* leaves"):
        raw_post(offset=(1 << 64) - 8, length=16)  # wrap-around attempt
    with pytest.raises(ApiError, match="unsupported opcode SEND") as err:
        a.qp.post_send(SendWr(3, Opcode.SEND, (a.mr, 0, 64), b.mr.addr, b.mr.rkey))
    assert err.value.errno == errno.EOPNOTSUPP
    with pytest.raises(ApiError, match="unsupported opcode RDMA_READ"):
        a.qp.post_send(SendWr(4, Opcode.RDMA_READ, (a.mr, 0, 64), b.mr.addr, b.mr.rkey))
    with pytest.raises(ApiError, match="not registered in this context"):
        a.qp.post_send(WriteWr(5, (other, 0, 64), b.mr.addr, b.mr.rkey))
    # A batch stops at its first bad request; the good ones before it are posted.
    with pytest.raises(ApiError, match="work request 1: unsupported opcode"):
        a.qp.post_send(
            [
                WriteWr(6, (a.mr, 0, 64), b.mr.addr, b.mr.rkey),
                SendWr(7, Opcode.ATOMIC_FETCH_AND_ADD, (a.mr, 0, 8), b.mr.addr, b.mr.rkey),
            ]
        )
    assert [w.wr_id for w in drain(a.cq, 1)] == [6]
    b.mr.buf[:64] = bytes(64)
    # Unconnected QP.
    spare = a.ctx.create_qp(a.cq)
    with pytest.raises(ApiError, match=f"QP {qpn_text(spare.qpn)} is not connected"):
        spare.post_send(WriteWr(8, (a.mr, 0, 64), b.mr.addr, b.mr.rkey))
    # A range that starts inside the target and ends past it, and a wrong rkey: the remote
    # end rejects the packet (remote access error), the QP fails, nothing is written.
    a.qp.post_send(WriteWr(9, (a.mr, 0, 1000), b.mr.addr + (1 << 16) - 500, b.mr.rkey))
    (wc,) = drain(a.cq, 1)
    assert (wc.wr_id, wc.status) == (9, WcStatus.REM_ACCESS_ERR)
    event = a.ctx.get_async_event(timeout=WAIT)
    assert event is not None and event.type is AsyncEventType.QP_FATAL and event.qpn == a.qp.qpn
    assert "remote access error" in event.reason
    assert a.qp.query().state is QpState.ERROR
    assert bytes(b.mr.buf) == bytes(1 << 16) and bytes(other.buf) == bytes(1 << 16)
    # The session still serves.
    assert a.ctx.query_device().host == 0


def test_wrong_rkey_is_a_remote_access_error(daemons: Daemons) -> None:
    a, b = connect(daemons, 1 << 16)
    a.qp.post_send(WriteWr(1, (a.mr, 0, 4096), b.mr.addr, b.mr.rkey ^ 0x5A5A, imm=1))
    (wc,) = drain(a.cq, 1)
    assert wc.status is WcStatus.REM_ACCESS_ERR
    assert bytes(b.mr.buf) == bytes(1 << 16)
    # The responder's QP failed as an RC responder's does: no immediate was delivered, its
    # receives are flushed, and its application is told why.
    flushed = b.cq.poll(64)
    assert flushed and all(w.status is WcStatus.WR_FLUSH_ERR for w in flushed)
    event = b.ctx.get_async_event(timeout=WAIT)
    assert event is not None and event.type is AsyncEventType.QP_FATAL
    assert "refused the peer's write of 4096 bytes" in event.reason
    assert "unknown rkey" in event.reason


def test_registration_checks_the_file_not_the_message(daemons: Daemons, tmp_path: Path) -> None:
    ctx = Device.open(daemons.sockets[0]).create_context()
    conn = ctx.conn
    plain = tmp_path / "plain"
    plain.write_bytes(bytes(4096))
    fd = os.open(plain, os.O_RDWR)
    try:
        with pytest.raises(ApiError, match="not sealed against shrinking"):
            conn.call("reg_mr", {"length": 4096, "access": 3}, fds=[fd])
    finally:
        os.close(fd)
    fd, mapping = shm.create(4096)
    try:
        with pytest.raises(ApiError, match="fewer than the 8192 registered"):
            conn.call("reg_mr", {"length": 8192, "access": 3}, fds=[fd])
        with pytest.raises(ApiError, match="takes 1 descriptor"):
            conn.call("reg_mr", {"length": 4096, "access": 3})
    finally:
        os.close(fd)
        mapping.close()
    mr = ctx.reg_mr(8192)
    mr.dereg()
    with pytest.raises(ApiError, match="unknown lkey"):
        conn.call("dereg_mr", {"lkey": mr.lkey})
    assert ctx.query_device().host == 0


def test_receive_queue_exhaustion_is_an_async_error(daemons: Daemons) -> None:
    a, b = connect(daemons, 1 << 16, recvs=1)
    a.mr.buf[:8] = b"12345678"
    a.qp.post_send([WriteWr(i, (a.mr, 0, 8), b.mr.addr, b.mr.rkey, imm=i) for i in range(2)])
    assert len(drain(a.cq, 2)) == 2
    assert [w.imm for w in drain(b.cq, 1)] == [0]
    event = b.ctx.get_async_event(timeout=WAIT)
    assert event is not None and event.type is AsyncEventType.RECV_QUEUE_EMPTY
    assert event.qpn == b.qp.qpn and "0x1" in event.reason
    assert bytes(b.mr.buf[:8]) == b"12345678"  # the data itself was placed


def test_send_queue_and_max_wimm_limits(daemons: Daemons) -> None:
    a, b = connect(
        daemons, 1 << 16, attr=QpAttr(max_wimm=1), cap=QpCap(max_send_wr=8, max_recv_wr=64)
    )
    with pytest.raises(ApiError, match="work request 1: max_wimm") as err:
        a.qp.post_send([WriteWr(i, (a.mr, 0, 8), b.mr.addr, b.mr.rkey, imm=i) for i in range(2)])
    assert err.value.errno == errno.ENOMEM
    drain(a.cq, 1)
    with pytest.raises(ApiError, match="receive queue full"):
        b.qp.post_recv(range(100))


def test_completion_channel_fd_works_with_select(daemons: Daemons) -> None:
    a, b = connect(daemons, 1 << 16)
    channel = b.ctx.create_comp_channel()
    cq = b.ctx.create_cq(64, channel=channel, cq_context="mine")
    qp = b.ctx.create_qp(cq)
    listener = b.ctx.listen(9)
    qp.post_recv(range(8))
    other = a.ctx.create_qp(a.cq)
    done: list[bytes] = []
    t = threading.Thread(target=lambda: done.append(other.connect(3, 9, timeout=WAIT)))
    t.start()
    req = listener.get_request(timeout=WAIT)
    assert req is not None
    listener.accept(req, qp, timeout=WAIT)
    t.join(WAIT)
    cq.req_notify()
    assert select.select([channel], [], [], 0)[0] == []  # armed, nothing happened yet
    other.post_send(WriteWr(1, (a.mr, 0, 16), b.mr.addr, b.mr.rkey, imm=0xFEED))
    readable, _, _ = select.select([channel], [], [], WAIT)
    assert readable == [channel]
    got = channel.get_cq_event(timeout=WAIT)
    assert got is cq and got.cq_context == "mine"
    (wc,) = cq.poll(4)  # already here: get_cq_event read up to the event
    assert wc.imm == 0xFEED
    assert channel.unacked_events(cq) == 1
    channel.ack_cq_events(cq, 1)
    assert channel.unacked_events(cq) == 0
    assert channel.get_cq_event(timeout=0) is None  # one event per arm
    other.post_send(WriteWr(2, (a.mr, 0, 16), b.mr.addr, b.mr.rkey, imm=2))
    assert cq.poll_wait(1, timeout=WAIT)[0].imm == 2
    assert select.select([channel], [], [], 0)[0] == []  # not re-armed: no event
    with pytest.raises(ApiError, match="still has CQs"):
        channel.destroy()


def test_asyncio_flavour(daemons: Daemons) -> None:
    a, b = connect(daemons, 1 << 16)

    async def main() -> list[int | None]:
        waiter = asyncio.ensure_future(b.cq.wait())
        await asyncio.sleep(0)
        assert not waiter.done()
        a.qp.post_send([WriteWr(i, (a.mr, 0, 8), b.mr.addr, b.mr.rkey, imm=i) for i in range(5)])
        await asyncio.wait_for(waiter, WAIT)
        imms: list[int | None] = []
        async for wc in b.cq:
            imms.append(wc.imm)
            if len(imms) == 5:
                break
        sent = [wc.wr_id async for wc in _take(a.cq, 5)]
        assert sent == list(range(5))
        return imms

    assert asyncio.run(main()) == list(range(5))


async def _take(cq: CompletionQueue, n: int) -> AsyncIterator[WorkCompletion]:
    for _ in range(n):
        yield await asyncio.wait_for(cq.__anext__(), WAIT)


def test_async_connect_and_accept(daemons: Daemons) -> None:
    a, b = end(daemons, 0, 4096), end(daemons, 3, 4096)
    listener = b.ctx.listen(11)

    async def main() -> bytes:
        async def serve() -> None:
            req = await listener.get_request_async()
            await listener.accept_async(req, b.qp, b"async")

        server = asyncio.ensure_future(serve())
        peer = await asyncio.wait_for(a.qp.connect_async(3, 11, b"x"), WAIT)
        await asyncio.wait_for(server, WAIT)
        return peer

    # Two contexts, two sockets, one loop: each waits on its own socket.
    assert asyncio.run(main()) == b"async"
    assert a.qp.query().state is QpState.RTS and b.qp.query().state is QpState.RTS


def test_connect_without_listener_is_refused(daemons: Daemons) -> None:
    a = end(daemons, 0, 4096)
    with pytest.raises(ApiError) as err:
        a.qp.connect(3, 4242, timeout=WAIT)
    assert err.value.errno == errno.ECONNREFUSED and "rejected" in str(err.value)
    with pytest.raises(ApiError, match="is this host"):
        a.qp.connect(0, 1, timeout=WAIT)


def test_a_busy_peer_is_retried_and_reported_as_busy(daemons: Daemons) -> None:
    """h3's control channel takes no new session from h0 (its share is 0): h0's mrcd asks
    again until the application's connect timeout, then says the peer is busy.  Given
    room, the next connect goes through."""
    server, client = daemons.nodes[3].control_server, daemons.nodes[0].control_client
    assert server is not None and client is not None

    def share(n: int) -> None:
        server.max_per_source = n

    daemons.on_loop(lambda: share(0))
    daemons.run(client.close())  # h0 must open a new session to h3
    a, b = end(daemons, 0, 4096), end(daemons, 3, 4096)
    b.ctx.listen(9)
    with pytest.raises(ApiError) as err:  # (2 s: several tries even on a loaded machine)
        a.qp.connect(3, 9, timeout=2.0)
    assert err.value.errno == errno.ECONNREFUSED
    assert "mrcd on h3 is busy" in str(err.value) and "credentials" not in str(err.value)
    assert daemons.on_loop(lambda: server.stats.rejected["source_busy"]) >= 2  # asked again
    daemons.on_loop(lambda: share(8))
    connect(daemons, ends=(end(daemons, 0, 4096), b))


CHILD = """
import os, sys, time
from mrcstack.api import Device, WriteWr
ctx = Device.open(sys.argv[1]).create_context()
mr = ctx.reg_mr(1 << 20)
cq = ctx.create_cq()
qp = ctx.create_qp(cq)
qp.connect(3, 5, timeout=30)
mr.buf[:4] = b"kill"
rkey, addr = int(sys.argv[2]), int(sys.argv[3])
qp.post_send(WriteWr(1, (mr, 0, 4), addr, rkey, imm=1))
cq.poll_wait(1, timeout=30)
print("ready", os.getpid(), flush=True)
time.sleep(60)
"""


def _maps(pid: int) -> list[str]:
    with open("/proc/self/maps") as f:
        return [line for line in f if f"mrc-mr-{pid}" in line]


def test_client_disconnect_closes_its_context(daemons: Daemons) -> None:
    """A program killed mid-connection: mrcd destroys its QPs and unmaps its memory."""
    b = end(daemons, 3, 1 << 16)
    listener = b.ctx.listen(5)
    b.qp.post_recv(range(4))
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(daemons.sockets[0]), str(b.mr.rkey), str(b.mr.addr)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        req = listener.get_request(timeout=WAIT)
        assert req is not None
        listener.accept(req, b.qp, timeout=WAIT)
        assert drain(b.cq, 1)[0].imm == 1
        assert child.stdout is not None
        line = child.stdout.readline().split()
        assert line[0] == "ready"
        node = daemons.nodes[0]
        assert daemons.on_loop(lambda: len(node.contexts)) == 1
        assert len(_maps(child.pid)) == 1  # mrcd's mapping of the child's region
        child.send_signal(signal.SIGKILL)
        child.wait(WAIT)

        async def gone() -> None:
            while node.contexts or node.qps:
                await asyncio.sleep(0.005)

        daemons.run(gone(), WAIT)
        assert _maps(child.pid) == []
        assert bytes(b.mr.buf[:4]) == b"kill"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def _inodes(pid: int) -> dict[int, int]:
    """memfd inode -> number of mappings of it in this process (client's and mrcd's)."""
    counts: dict[int, int] = {}
    for line in _maps(pid):
        inode = int(line.split()[4])
        counts[inode] = counts.get(inode, 0) + 1
    return counts


def test_dereg_and_close_unmap_on_both_sides(daemons: Daemons) -> None:
    # Count by inode: other tests' regions may be unmapped (garbage-collected) meanwhile.
    ctx = Device.open(daemons.sockets[0]).create_context()
    before = set(_inodes(os.getpid()))
    mr = ctx.reg_mr(1 << 16)
    new = {i: n for i, n in _inodes(os.getpid()).items() if i not in before}
    assert list(new.values()) == [2]  # this program's mapping and mrcd's
    (inode,) = new
    mr.dereg()
    assert inode not in _inodes(os.getpid())
    before = set(_inodes(os.getpid()))
    ctx.reg_mr(1 << 16)
    (inode,) = set(_inodes(os.getpid())) - before
    ctx.close()
    node = daemons.nodes[0]

    async def gone() -> None:
        while node.contexts:
            await asyncio.sleep(0.005)

    daemons.run(gone(), WAIT)
    assert inode not in _inodes(os.getpid())


def test_mrcd_stop_tells_clients(tmp_path: Path) -> None:
    d = Daemons(tmp_path, hosts=(0,)).start()
    try:
        ctx = Device.open(d.sockets[0]).create_context()
        d.run(d.servers[0].stop())
        event = ctx.get_async_event(timeout=WAIT)
        assert event is not None and event.type is AsyncEventType.DEVICE_FATAL
        with pytest.raises(ApiError):
            ctx.query_device()
        assert not d.sockets[0].exists()
    finally:
        d.stop()


OPS = [
    "query_device",
    "open_context",
    "reg_mr",
    "dereg_mr",
    "create_comp_channel",
    "destroy_comp_channel",
    "create_cq",
    "destroy_cq",
    "create_qp_hint",
    "modify_qp_hint",
    "query_qp_hint",
    "destroy_qp_hint",
    "create_qp",
    "modify_qp",
    "query_qp",
    "destroy_qp",
    "connect",
    "listen",
    "accept",
    "reject",
    "ctl.query_device",
    "ctl.list_ports",
    "ctl.modify_port",
    "ctl.query_ev_fmt_profile",
    "ctl.create_ev_profile",
    "ctl.modify_ev_profile",
    "ctl.modify_ev_state",
    "ctl.destroy_ev_profile",
    "ctl.query_ev_profile",
    "ctl.list_ev_profiles",
    "ctl.query_ev_states",
    "ctl.create_cc_profile",
    "ctl.destroy_cc_profile",
    "ctl.query_cc_profile",
    "ctl.list_cc_profiles",
    "ctl.ep_batch",
    "nonsense",
]
VALUES: tuple[object, ...] = (
    None,
    -1,
    0,
    1,
    2**70,
    1.5,
    float("nan"),
    "x",
    "zz",
    [],
    [[1, 2]],
    {},
    {"a": 1},
    True,
)
KEYS = [
    "length",
    "access",
    "lkey",
    "channel",
    "cqe",
    "cq",
    "hint",
    "send_cq",
    "recv_cq",
    "attr",
    "cap",
    "qpn",
    "remote_host",
    "service",
    "private_data",
    "request_id",
    "id",
    "port",
    "enabled",
    "mode",
    "evs",
    "fields",
    "ev_count",
    "ev_min_active",
    "event_mask",
    "state",
    "algorithm",
    "config",
    "op",
    "requests",
    "timeout",
]


def test_hostile_requests_get_answers_and_never_an_internal_error(daemons: Daemons) -> None:
    """Every operation with wrongly typed or out-of-range arguments: a clear error reply,
    never an internal error, and the session keeps serving."""
    rng = random.Random(4)
    ctx = Device.open(daemons.sockets[0]).create_context()
    conn = ctx.conn
    for _ in range(3000):
        op = rng.choice(OPS)
        args = {k: rng.choice(VALUES) for k in rng.sample(KEYS, rng.randrange(0, 6))}
        try:
            conn.call(op, args, timeout=WAIT)
        except ApiError as exc:
            assert exc.errno != errno.EIO, (op, args, str(exc))
    assert ctx.query_device().host == 0


def test_broken_frames_close_only_that_session(daemons: Daemons) -> None:
    good = Device.open(daemons.sockets[0])
    for junk in (
        struct.pack("<IB", 0, 1),  # zero length
        struct.pack("<IB", wire.MAX_FRAME + 1, 1),  # too long
        wire.frame(wire.Kind.COMPLETIONS, b"\x01\x00"),  # a kind clients never send
        wire.frame(wire.Kind.REQUEST, b"\x01\x00\x00\x00[1,2]"),  # JSON but not an object
        wire.frame(wire.Kind.REQUEST, b"\x01\x00"),  # truncated
        wire.frame(wire.Kind.POST_SEND, struct.pack("<IIH", 1, 1, 5)),  # count without WRs
        wire.request(1, "reg_mr", {"length": 4096}, nfds=2),  # descriptors never sent
        b"\xff" * 4096,  # a length no frame may have
    ):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(daemons.sockets[0]))
        s.sendall(junk)
        s.settimeout(WAIT)
        data = b""
        while chunk := s.recv(4096):  # mrcd hangs up (possibly after a reply)
            data += chunk
        s.close()
        assert good.query_device().host == 0


def test_one_context_from_several_threads(daemons: Daemons) -> None:
    """Whichever thread reads the socket dispatches for all; nobody waits for a reply
    another thread already read."""
    a, b = connect(daemons, 1 << 16)
    errors: list[BaseException] = []

    def queries() -> None:
        try:
            for _ in range(300):
                assert a.ctx.query_device().host == 0
        except BaseException as exc:
            errors.append(exc)

    def writes() -> None:
        try:
            for i in range(300):
                a.qp.post_send(WriteWr(i, (a.mr, 0, 8), b.mr.addr, b.mr.rkey))
                assert a.cq.poll_wait(1, timeout=WAIT)[0].wr_id == i
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=f) for f in (queries, queries, writes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not errors and not any(t.is_alive() for t in threads)


def test_a_reply_another_thread_read_wakes_its_caller(
    daemons: Daemons, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread blocked in ``poll_wait`` reads the reply another thread's call waits for:
    the caller returns once that reply is dispatched.  Its own re-check interval is an hour
    here, so only the reader's wake-up can end the wait; the reader pauses between its read
    and its dispatch, the window in which a caller that took the socket itself would block
    reading a reply that has already left it."""
    monkeypatch.setattr(api_client, "LOCK_SLICE", 3600.0)
    a, b = connect(daemons, 1 << 16)
    conn = a.ctx.conn
    dispatch = conn._dispatch

    def slow_dispatch(kind: int, body: bytes) -> None:
        time.sleep(0.05)
        dispatch(kind, body)

    monkeypatch.setattr(conn, "_dispatch", slow_dispatch)
    polled: list[object] = []
    poller = threading.Thread(target=lambda: polled.append(a.cq.poll_wait(1, timeout=WAIT)))
    poller.start()
    while not conn._rlock.locked():  # the poller is reading the socket
        time.sleep(0.001)
    answered: list[int] = []
    caller = threading.Thread(target=lambda: answered.append(a.ctx.query_device().host))
    caller.start()
    caller.join(WAIT)
    assert answered == [0]
    a.qp.post_send(WriteWr(1, (a.mr, 0, 8), b.mr.addr, b.mr.rkey))  # ends the poll
    poller.join(WAIT)
    assert not poller.is_alive() and polled
