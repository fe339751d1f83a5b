"""QP attributes that change what a connection does, seen from the application API.

Two mrcds in loopback data mode (tests/support/apiharness.py).  Each test shows the
behaviour an attribute is for, by counting what the daemons did (ACKs sent, packets
retransmitted), never by timing it: ``ack_coalesce`` (how many data packets one ACK stands
for), the private-data limit of connect and accept, and ``timeout``/``linear_cnt``/``exp_cnt``
(how many retransmissions a QP makes to a peer that stopped answering before it fails with
RETRY_EXC_ERR).
"""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest

from mrcstack.api import ApiError, AsyncEventType, QpAttr, QpState, WcStatus, WriteWr, wire
from mrcstack.api.limits import MAX_PRIVATE_DATA
from tests.support.apiharness import WAIT, Daemons, connect, drain, end

MTU = 4096


def stats(d: Daemons, host: int, qpn: int) -> dict[str, int]:
    """One QP's packets sent and received (all planes) and retransmissions by timeout,
    read on the daemons' loop."""

    def read() -> dict[str, int]:
        conn = d.nodes[host].qp(qpn).conn
        assert conn is not None
        st = conn.stats
        return {
            "sent": sum(st.packets_sent),
            "received": sum(st.packets_received),
            "timeout": st.retransmissions.get("timeout", 0),
        }

    return d.on_loop(read)


# ack_coalesce -------------------------------------------------------------------------------
def _acks_for(d: Daemons, coalesce: int | None, service: int) -> tuple[int, int]:
    """(data packets h3's QP received, packets it sent back) for one 64-packet write."""
    a = end(d, 0, 64 * MTU, attr=QpAttr(mtu_payload=MTU))
    b = end(d, 3, 64 * MTU, attr=QpAttr(mtu_payload=MTU, ack_coalesce=coalesce))
    connect(d, service=service, ends=(a, b))
    a.mr.buf[:] = os.urandom(64 * MTU)
    a.qp.post_send(WriteWr(1, (a.mr, 0, 64 * MTU), b.mr.addr, b.mr.rkey, imm=1))
    assert [wc.status for wc in drain(a.cq, 1)] == [WcStatus.SUCCESS]
    assert drain(b.cq, 1)[0].imm == 1 and b.mr.buf == a.mr.buf
    st = stats(d, 3, b.qp.qpn)
    return st["received"], st["sent"]


def test_ack_coalesce_sets_how_many_packets_one_ack_stands_for(daemons: Daemons) -> None:
    # ack_coalesce=1: every data packet gets its own ACK (the daemon's 16 would not).
    data, acks = _acks_for(daemons, 1, service=21)
    assert data >= 64 and acks >= data, (data, acks)
    # 64: one ACK may stand for a whole batch of packets that arrived together.
    data, acks = _acks_for(daemons, 64, service=22)
    assert data >= 64 and acks < data // 2, (data, acks)


def test_ack_coalesce_is_checked_and_reported(daemons: Daemons) -> None:
    a = end(daemons, 0, 4096)
    assert a.qp.query().attr.ack_coalesce == daemons.nodes[0].cfg.ack_coalesce == 16
    assert a.qp.modify(ack_coalesce=64).ack_coalesce == 64
    assert a.qp.modify(ack_coalesce=None).ack_coalesce == 16  # back to mrcd's setting
    for bad in (0, 65, "8"):
        with pytest.raises(ApiError, match=r"ack_coalesce: must be") as err:
            a.qp.modify(ack_coalesce=bad)
        assert err.value.errno == errno.EINVAL
    with pytest.raises(ApiError, match=r"attr\.ack_coalescing: unknown QP attribute"):
        a.ctx.conn.call("modify_qp", {"qpn": a.qp.qpn, "attr": {"ack_coalescing": 2}})


# Private data -------------------------------------------------------------------------------
def test_private_data_limit_is_one_constant_both_ways(daemons: Daemons) -> None:
    most = bytes(range(256)) * (MAX_PRIVATE_DATA // 256)
    assert len(most) == MAX_PRIVATE_DATA == 256
    # Exactly the limit, both ways, through mrcd and the control channel.
    connect(daemons, 4096, hello=most, welcome=most[::-1])
    a, b = end(daemons, 0, 4096), end(daemons, 3, 4096)
    # One byte more: the library says so before sending anything...
    with pytest.raises(ApiError, match=f"private_data: at most {MAX_PRIVATE_DATA} bytes, got 257"):
        a.qp.connect(3, 31, most + b"!", timeout=WAIT)
    # ...and so does mrcd, to a client that skips the library's check.
    for side, op, args in (
        (a, "connect", {"remote_host": 3, "service": 31}),
        (b, "accept", {"request_id": 1}),
    ):
        args |= {"qpn": side.qp.qpn, "private_data": (most + b"!").hex()}
        with pytest.raises(
            ApiError, match=f"private_data: at most {MAX_PRIVATE_DATA} bytes"
        ) as err:
            side.ctx.conn.call(op, args, timeout=WAIT)
        assert err.value.errno == errno.EINVAL


def test_one_qp_accepted_for_two_requests_connects_once(daemons: Daemons) -> None:
    """Two of h0's QPs ask for the same service; h3 accepts both with one QP.  Exactly one
    accept returns (the QP is connected to that peer); the other fails at once, and its
    peer's connect is refused, because a connected QP cannot be set up again."""
    b = end(daemons, 3, 4096)
    listener = b.ctx.listen(51)
    askers = [end(daemons, 0, 4096) for _ in range(2)]
    results: dict[int, BaseException | bytes] = {}

    def ask(i: int) -> None:
        try:
            results[i] = askers[i].qp.connect(3, 51, timeout=WAIT)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    requests = [listener.get_request(timeout=WAIT) for _ in range(2)]
    assert None not in requests

    # Both accepts in one write: mrcd takes them up together, before either connects.
    conn = b.ctx.conn
    ids = [conn.next_id() for _ in requests]
    conn.send(b"".join(
        wire.request(i, "accept", {"request_id": r.request_id, "qpn": b.qp.qpn})
        for i, r in zip(ids, requests, strict=True) if r is not None
    ))  # fmt: skip
    accepted: list[ApiError | None] = []
    for i in ids:
        try:
            conn.reply(i, WAIT)
            accepted.append(None)
        except ApiError as exc:
            accepted.append(exc)
    for t in threads:
        t.join(WAIT)
    assert accepted[0] is None, accepted  # the first connects the QP...
    failed = accepted[1]  # ...so the second cannot: it fails at once, the peer is refused
    assert failed is not None and failed.errno == errno.ECONNABORTED, failed
    assert "not reset" in failed.message
    refused = [r for r in results.values() if isinstance(r, BaseException)]
    assert len(results) == 2 and len(refused) == 1, results
    assert isinstance(refused[0], ApiError) and refused[0].errno == errno.ECONNREFUSED
    info = b.qp.query()
    winner = next(x for i, x in enumerate(askers) if not isinstance(results[i], BaseException))
    assert info.state is QpState.RTS and info.remote_qpn == winner.qp.qpn


# Retries: a peer that stops answering -------------------------------------------------------
def _fail_against_silent_peer(d: Daemons, attr: QpAttr, service: int) -> tuple[int, str, float]:
    """Connect with ``attr``, prove the path works, then the peer's application destroys its
    QP (mrcd drops whatever comes for it: nothing answers any more); post one write.  Returns
    the retransmissions by timeout the write got, the QP_FATAL reason, and the seconds from
    the post to the failed completion."""
    a = end(d, 0, MTU, attr=attr)
    b = end(d, 3, MTU)
    connect(d, service=service, ends=(a, b))
    a.qp.post_send(WriteWr(1, (a.mr, 0, 64), b.mr.addr, b.mr.rkey))
    assert drain(a.cq, 1)[0].status is WcStatus.SUCCESS  # an RTT sample, the path is good
    before = stats(d, 0, a.qp.qpn)["timeout"]
    b.qp.destroy()
    posted = time.monotonic()
    a.qp.post_send(WriteWr(2, (a.mr, 0, 64), b.mr.addr, b.mr.rkey))
    (wc,) = drain(a.cq, 1)
    took = time.monotonic() - posted
    assert (wc.wr_id, wc.status) == (2, WcStatus.RETRY_EXC_ERR)
    event = a.ctx.get_async_event(timeout=WAIT)
    assert event is not None and event.type is AsyncEventType.QP_FATAL and event.qpn == a.qp.qpn
    after = stats(d, 0, a.qp.qpn)["timeout"]
    return after - before, event.reason, took


def test_retry_counts_decide_when_a_silent_peer_fails(daemons: Daemons) -> None:
    """linear_cnt + exp_cnt retransmissions, then RETRY_EXC_ERR: more retries, more of them."""
    few, reason, _ = _fail_against_silent_peer(
        daemons, QpAttr(timeout=2e-3, linear_cnt=1, exp_cnt=1), service=41
    )
    assert few == 2, reason
    assert "retry limit exhausted" in reason and "timed out 3 times" in reason
    more, reason, _ = _fail_against_silent_peer(
        daemons, QpAttr(timeout=2e-3, linear_cnt=3, exp_cnt=2), service=42
    )
    assert more == 5 and "timed out 6 times" in reason, reason


def test_timeout_is_the_least_a_silent_peer_is_waited_for(daemons: Daemons) -> None:
    """Each retry waits at least ``timeout`` (then twice that, once exp_cnt starts), so the
    failure cannot come before timeout x (1 + 1 + 2): a lower bound no load can break."""
    timeout = 0.05
    retx, reason, took = _fail_against_silent_peer(
        daemons, QpAttr(timeout=timeout, linear_cnt=1, exp_cnt=1), service=43
    )
    assert retx == 2 and "timed out 3 times" in reason
    assert took >= timeout * (1 + 1 + 2), took
