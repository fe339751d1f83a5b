"""No usable path: every local port down, or every EV assumed bad.

Nothing can be sent, so no packet times out; the sender's stall timer spends the same retry
budget as unanswered retransmissions.  A path that returns in time resumes the transfer;
one that never returns fails the connection once, with a reason, and flushes the work.
"""

from __future__ import annotations

import os

import pytest

from mrcstack.core.events import (
    ConnectionFailed,
    EvState,
    EvStateChanged,
    SendCompleted,
    WcStatus,
)
from tests.support.pairnet import LinkFaults, PairNet, make_evs

PLANES = 4
MIN_RTO = 200e-6  # ConnectionConfig.timeout default
RETRIES = {"linear_cnt": 2, "exp_cnt": 2}


def sends(net: PairNet) -> list[SendCompleted]:
    return [e for e in net.events[0] if isinstance(e, SendCompleted)]


def failures(net: PairNet) -> list[tuple[float, ConnectionFailed]]:
    """(time, event) of every ConnectionFailed endpoint 0 reported."""
    events = zip(net.event_times[0], net.events[0], strict=True)
    return [(t, e) for t, e in events if isinstance(e, ConnectionFailed)]


def pair(seed: int, faults: LinkFaults, planes: int = PLANES, **cfg: object) -> PairNet:
    return PairNet(seed, faults, planes=planes, per_plane=2, **RETRIES, **cfg)  # type: ignore[arg-type]


def budget(linear_cnt: int, exp_cnt: int) -> float:
    """How long retries last before the connection fails: linear_cnt retries at the base
    RTO (the minimum, before any RTT sample), then exp_cnt doubling ones."""
    return MIN_RTO * (linear_cnt + 1) + sum(MIN_RTO * 2**k for k in range(1, exp_cnt + 1))


def all_ports_down(net: PairNet) -> None:
    for port in range(PLANES):
        net.conns[0].set_port_state(port, False, now=net.now)


def post(net: PairNet, size: int) -> tuple[bytearray, bytes]:
    dst = bytearray(size + 10)
    mr = net.mem[1].register(dst)
    data = os.urandom(size)
    net.conns[0].post_write(1, data, mr.va, mr.rkey, now=net.now)
    net.conns[0].post_write(2, b"t" * 10, mr.va + size, mr.rkey, imm=2, now=net.now)
    return dst, data


def test_every_local_port_down_fails_after_the_retry_budget_not_never() -> None:
    """The audit's hang: every port down, a write posted, 30 s of virtual time.  The
    connection now fails once, with the retry-limit reason, and flushes both writes."""
    net = pair(31, LinkFaults())
    all_ports_down(net)
    post(net, 5000)
    net.run(30.0)
    failed = failures(net)
    assert len(failed) == 1
    reason = failed[0][1].reason
    assert "retry limit exhausted" in reason and "every local port is down" in reason
    assert net.conns[0].failed == reason
    assert [(s.wr_id, s.status) for s in sends(net)] == [
        (1, WcStatus.RETRY_EXCEEDED),
        (2, WcStatus.FLUSHED),
    ]
    assert sum(net.conns[0].stats.packets_sent) == 0
    assert net.conns[0].get_timer() is None
    # The same budget as unanswered retransmissions.
    assert failed[0][0] == pytest.approx(budget(**RETRIES))


def test_ports_that_return_in_time_resume_the_transfer_each_time() -> None:
    """Two outages, each shorter than the retry budget, together longer: the transfer
    resumes after each (the stall's retries start afresh once a path is back)."""
    net = pair(32, LinkFaults())
    dst, data = post(net, 200_000)
    sender = net.conns[0]
    outage = 0.7 * budget(**RETRIES)
    for port in (2, 1):
        all_ports_down(net)
        net.run(net.now + outage)
        assert sender.failed is None and sends(net) == []
        sender.set_port_state(port, True, now=net.now)
        net.run(net.now + 50e-6)  # some of the write goes out on that plane
        assert sender.stats.packets_sent[port] > 0
    net.run(net.now + 5.0, stop=lambda: len(sends(net)) == 2)
    assert [(s.wr_id, s.status) for s in sends(net)] == [
        (1, WcStatus.SUCCESS),
        (2, WcStatus.SUCCESS),
    ]
    assert dst[: len(data)] == data and failures(net) == []
    assert sender.stats.packets_sent[0] == sender.stats.packets_sent[3] == 0


def test_every_ev_assumed_bad_waits_for_probes_then_gives_up() -> None:
    """With ev_min_active=0 every EV may go bad; probes resurrect them when the paths come
    back, and the retry budget bounds the wait when they do not."""
    evs = [e.value for e in make_evs(2, 2)]
    # Once a timeout finds no progress, one packet at a time probes the paths, each round a
    # backed-off RTO later: 1.5 ms lets that condemn all four, well inside the retry budget.
    outage = 1.5e-3
    cfg: dict[str, object] = {"ev_min_active": 0, "probe_interval": 50e-6}
    back = pair(33, LinkFaults(blackouts=[(0.0, outage, ev) for ev in evs]), 2, **cfg)
    dst, data = post(back, 20_000)
    back.run(outage)
    assert all(back.conns[0].evs.state(ev) is EvState.ASSUMED_BAD for ev in evs)
    assert back.conns[0].get_timer() is not None
    back.run(5.0, stop=lambda: len(sends(back)) == 2)
    assert [s.status for s in sends(back)] == [WcStatus.SUCCESS] * 2 and dst[:20_000] == data
    never = pair(33, LinkFaults(blackouts=[(0.0, 100.0, ev) for ev in evs]), 2, **cfg)
    post(never, 20_000)
    never.run(30.0)
    failed = failures(never)
    assert len(failed) == 1 and "assumed bad or denied" in failed[0][1].reason
    assert [s.status for s in sends(never)] == [WcStatus.RETRY_EXCEEDED, WcStatus.FLUSHED]


def test_paths_condemned_while_the_peer_stalled_come_back_when_its_acks_do() -> None:
    """The receiver is not scheduled for a few RTOs (a busy host): every path goes silent,
    the timeouts demote the EVs they fired on, and the packets were only waiting in the
    receiver's sockets.  When the acknowledgement of the packet whose timeout condemned an
    EV comes back, the EV is reinstated at once (not after rounds of probes), so the planes
    have their paths again as soon as the peer answers."""
    start, end = 100e-6, 900e-6
    net = pair(34, LinkFaults(stalls=[(start, end, 1)]))
    dst, data = post(net, 400_000)
    net.run(end)

    def changed(reason: str) -> set[int]:
        return {e.ev for e in net.events[0] if isinstance(e, EvStateChanged) and e.reason == reason}

    condemned = changed("rto")
    assert condemned, "the stall must outlast the RTO for this check"
    net.run(end + 100e-6)  # the acks held up by the stall come back
    assert changed("late_arrival") == condemned
    assert [net.conns[0].evs.state(ev) for ev in condemned].count(EvState.ASSUMED_BAD) == 0
    net.run(1.0, stop=lambda: len(sends(net)) == 2)
    assert [s.status for s in sends(net)] == [WcStatus.SUCCESS] * 2 and dst[: len(data)] == data
