"""Loss detection must not mistake a software endpoint's delays for losses.

Each test drives two connections by hand, so the order in which datagrams and ACKs are
handed over is exactly the one a busy endpoint produces: a receiver reading one plane's
socket before another's, acknowledgements waiting in a socket, a burst whose tail queues
behind its head.  Every case also checks that a real loss is still found.
"""

from __future__ import annotations

import random

import pytest

from mrcstack.core.cc import CCParams
from mrcstack.core.config import ConnectionConfig
from mrcstack.core.connection import Connection, Datagram
from mrcstack.core.events import SendCompleted, WcStatus
from mrcstack.core.evs import EvEntry
from mrcstack.core.memory import MemoryTable
from mrcstack.core.psn import unwrap
from mrcstack.core.tx import Tx
from mrcstack.errors import LocalError
from mrcstack.wire import AckPacket, CrcIntegrity, decode

MTU = 256
PLANES = 2
T0 = 1e-6  # a packet sent at time 0 carries no timestamp (0 means none), so no RTT sample


def pair(
    ack_coalesce: int = 1, timeout: float = 1e-3, **cfg: object
) -> tuple[Connection, Connection, int, int]:
    """Sender a, receiver b, and the va and rkey of a 1 MiB region at b."""
    evs = tuple(EvEntry(p << 8 | i, p) for p in range(PLANES) for i in range(4))
    mem = MemoryTable()
    conns = [
        Connection(
            ConnectionConfig(
                local_qpn=1 + i,
                remote_qpn=2 - i,
                planes=PLANES,
                evs=evs,
                cc="fixed",
                cc_params=CCParams(max_cwnd=1024 * MTU),
                mtu_payload=MTU,
                timeout=timeout,
                ack_coalesce=ack_coalesce if i == 1 else 1,
                **cfg,  # type: ignore[arg-type]
            ),
            memory=MemoryTable() if i == 0 else mem,
            rng=random.Random(i),
            now=0.0,
        )
        for i in (0, 1)
    ]
    region = mem.register(bytearray(1 << 20))
    return conns[0], conns[1], region.va, region.rkey


def send_all(conn: Connection, now: float) -> list[Datagram]:
    out: list[Datagram] = []
    while batch := conn.datagrams_to_send(now):
        out.extend(batch)
    return out


def deliver(to: Connection, datagrams: list[Datagram], now: float) -> list[Datagram]:
    """Feed datagrams one by one, collecting what ``to`` sends after each (its ACKs)."""
    replies: list[Datagram] = []
    for d in datagrams:
        to.receive_datagram(d.data, now=now, port=d.port)
        replies.extend(to.datagrams_to_send(now))
    return replies


def feed(to: Connection, datagrams: list[Datagram], now: float) -> None:
    """One receive batch: everything first, then the adapter asks what to send."""
    for d in datagrams:
        to.receive_datagram(d.data, now=now, port=d.port)


def test_coalesced_acks_report_every_packet_they_stand_for() -> None:
    """A receiver reading one plane's socket dry sees that plane's packets far ahead of its
    cumulative PSN; a coalesced ACK whose 64-bit window cannot reach back over its group
    must not stand for it, or the sender reads the group as lost on its paths."""
    a, b, va, rkey = pair(ack_coalesce=16)
    a.post_write(1, bytes(300 * MTU), va, rkey, imm=None, now=0.0)
    data = send_all(a, 0.0)
    assert len(data) == 300
    first, rest = data[0], data[1:]
    # Socket by socket, and on each the packets of two distant stretches of the window
    # alternate, as when retransmissions of old PSNs share a plane with new ones.
    order = []
    for p in range(PLANES):
        mine = [d for d in rest if d.port == p]
        half = len(mine) // 2
        order += [d for pair_ in zip(mine[:half], mine[half:], strict=False) for d in pair_]
        order += mine[2 * half :]
    feed(b, order, 1e-4)  # one receive batch, then the ACKs it produced
    acks = send_all(b, 1e-4)
    reported: set[int] = set()
    for ack in acks:
        pkt = decode(ack.data, CrcIntegrity())
        assert isinstance(pkt, AckPacket)
        base = unwrap(pkt.sack_base, 0)
        reported.update(base + i for i in range(64) if pkt.sack_bitmap >> i & 1)
    psn0 = unwrap(decode(first.data, CrcIntegrity()).psn, 0)  # type: ignore[union-attr]
    assert reported == {psn0 + i for i in range(1, 300)}
    feed(a, acks, 2e-4)
    a.datagrams_to_send(2e-4)
    # Only the packet that really is missing is declared lost (by its path's later packets).
    assert a.stats.retransmissions == {"sack": 1}


def test_rack_waits_for_the_whole_receive_batch() -> None:
    """ACKs read from one plane's socket before another's must not make RACK declare the
    other plane's earlier packets lost: it runs once the adapter has fed the batch."""
    a, b, va, rkey = pair()
    a.post_write(1, bytes(MTU), va, rkey, imm=None, now=T0)  # warm up: srtt = 19 us
    feed(a, deliver(b, send_all(a, T0), 10e-6), 20e-6)
    a.datagrams_to_send(20e-6)
    a.post_write(2, bytes(4 * MTU), va, rkey, imm=None, now=1e-3)
    early = send_all(a, 1e-3)
    a.post_write(3, bytes(4 * MTU), va, rkey, imm=None, now=2e-3)
    late = send_all(a, 2e-3)
    # The receiver reads plane 1 (all of the late burst's plane-1 packets) before plane 0.
    order = [d for d in late if d.port == 1] + [d for d in early + late if d.port == 0]
    order += [d for d in early if d.port == 1]
    acks = deliver(b, order, 2.01e-3)
    feed(a, acks, 2.02e-3)
    a.datagrams_to_send(2.02e-3)
    assert a.stats.retransmissions == {}
    assert not a.recovery.txs
    completions = []
    while (event := a.next_event()) is not None:
        if isinstance(event, SendCompleted):
            completions.append(event.wr_id)
    assert completions == [1, 2, 3]


def test_rack_still_finds_a_loss_within_the_batch() -> None:
    a, b, va, rkey = pair()
    a.post_write(1, bytes(MTU), va, rkey, imm=None, now=T0)
    feed(a, deliver(b, send_all(a, T0), 10e-6), 20e-6)
    a.datagrams_to_send(20e-6)
    a.post_write(2, bytes(4 * MTU), va, rkey, imm=None, now=1e-3)
    early = send_all(a, 1e-3)
    a.post_write(3, bytes(4 * MTU), va, rkey, imm=None, now=2e-3)
    late = send_all(a, 2e-3)
    lost = [d for d in early if d.port == 1][-1]  # the last one on its EV: only RACK sees it
    acks = deliver(b, [d for d in early + late if d is not lost], 2.01e-3)
    feed(a, acks, 2.02e-3)
    resent = a.datagrams_to_send(2.02e-3)
    assert a.stats.retransmissions == {"rack": 1}
    assert len(resent) == 1


def test_acks_reordered_on_their_way_back_declare_no_loss() -> None:
    """ACKs come back on several paths, so a later ACK can overtake an earlier one.  A
    later packet on an EV acknowledged says nothing of an earlier one on that EV that its
    64-bit SACK window does not reach: the earlier packet's own ACK may still be on its
    way.  Only what the ACK reports missing is lost by same-path evidence; the rest is
    RACK's to judge, with its reordering window."""
    a, b, va, rkey = pair()
    a.post_write(1, bytes(200 * MTU), va, rkey, imm=None, now=T0)
    data = send_all(a, T0)
    packets = [decode(d.data, CrcIntegrity()) for d in data]
    seqs = [unwrap(p.psn, 0) for p in packets]  # type: ignore[union-attr]
    evs = [p.ev for p in packets]  # type: ignore[union-attr]
    hole = 0  # lost: the cumulative point stays before everything else
    q = 100  # arrives; its ACK and those of the 63 packets after it come back late
    later = next(i for i in range(q + 64, len(data)) if evs[i] == evs[q])
    replies = {i: deliver(b, [data[i]], 1e-4) for i in range(len(data)) if i != hole}
    late = [ack for i, acks in replies.items() if seqs[q] <= seqs[i] < seqs[q] + 64 for ack in acks]
    first = [ack for i, acks in replies.items() if not seqs[q] <= seqs[i] < seqs[q] + 64
             for ack in acks]  # fmt: skip
    assert replies[later][0] in first
    feed(a, first, 2e-4)  # the overtaking ACKs, among them the one for `later` on q's EV
    a.datagrams_to_send(2e-4)
    feed(a, late, 2.1e-4)  # then the late ones: q arrived
    a.datagrams_to_send(2.1e-4)
    assert seqs[q] not in a.recovery.txs  # acknowledged, never declared lost
    assert a.stats.retransmissions == {"sack": 1}  # only the hole, by its path's later packets
    assert a.stats.spurious_retransmissions == 0


def test_a_packet_no_ack_reports_is_lost_after_the_reordering_window() -> None:
    """The same overtaking ACK, but the packet it does not report on really was lost (and
    the ACKs that would have said so too): it is lost once RACK's reordering window has
    passed with no ACK for it, by its path's evidence, without waiting for an RTO."""
    a, b, va, rkey = pair(timeout=10e-3)
    a.post_write(1, bytes(MTU), va, rkey, imm=None, now=T0)  # an RTT sample: 20 us
    feed(a, deliver(b, send_all(a, T0), 10e-6), 20e-6)
    a.datagrams_to_send(20e-6)
    a.post_write(2, bytes(200 * MTU), va, rkey, imm=None, now=1e-3)
    data = send_all(a, 1e-3)
    packets = [decode(d.data, CrcIntegrity()) for d in data]
    seqs = [unwrap(p.psn, 0) for p in packets]  # type: ignore[union-attr]
    evs = [p.ev for p in packets]  # type: ignore[union-attr]
    hole, q = 0, 100  # both lost; so are the ACKs that would report q missing
    later = next(i for i in range(q + 64, len(data)) if evs[i] == evs[q])
    replies = {i: deliver(b, [data[i]], 1.01e-3) for i in range(len(data)) if i not in (hole, q)}
    first = [ack for i, acks in replies.items() if not seqs[q] <= seqs[i] < seqs[q] + 64
             for ack in acks]  # fmt: skip
    assert replies[later][0] in first  # a later packet on q's EV, acknowledged
    feed(a, first, 1.02e-3)
    a.datagrams_to_send(1.02e-3)
    assert a.stats.retransmissions == {"sack": 1}  # the hole; q not yet
    deadline = a.get_timer()
    assert deadline is not None and deadline < 1.02e-3 + 10e-3  # well before any RTO
    a.handle_timer(deadline)
    resent = a.datagrams_to_send(deadline)
    assert a.stats.retransmissions == {"sack": 2}
    assert [decode(d.data, CrcIntegrity()).psn for d in resent] == [packets[q].psn]  # type: ignore[union-attr]


def test_rto_restarts_while_acks_keep_coming() -> None:
    """A burst's tail may queue behind its head for longer than the RTO; while other
    packets keep being acknowledged the connection is not stalled, so no timeout."""
    a, b, va, rkey = pair(timeout=1e-3)
    a.post_write(1, bytes(2 * MTU), va, rkey, imm=None, now=0.0)
    x, y = send_all(a, 0.0)
    feed(a, deliver(b, [y], 0.9e-3), 0.9e-3)  # progress at 0.9 ms
    a.datagrams_to_send(0.9e-3)
    timer = a.recovery.rto_deadline()
    assert timer is not None and timer <= 1e-3  # x's original deadline
    a.handle_timer(1e-3)
    assert a.stats.retransmissions == {}
    restarted = a.recovery.rto_deadline()
    assert restarted is not None and restarted > 1.5e-3  # from the last progress on
    feed(a, deliver(b, [x], 1.2e-3), 1.2e-3)
    a.datagrams_to_send(1.2e-3)
    assert a.stats.retransmissions == {}
    assert not a.recovery.txs


def test_a_burst_shares_one_timeout_until_its_last_packet_is_acked() -> None:
    """The packets of one transmit share ``now + rto``, and one timer entry: it stands while
    any of them is in flight, in whatever order they are acknowledged, and goes with the
    last."""
    a, b, va, rkey = pair(timeout=1e-3)
    a.post_write(1, bytes(4 * MTU), va, rkey, imm=None, now=T0)
    burst = send_all(a, T0)
    assert len(burst) == 4 and len(a.recovery.rto_heap) == 1
    deadline = a.recovery.rto_deadline()
    assert deadline == T0 + 1e-3
    for i in (3, 0, 1):  # the last one first: out of send order
        feed(a, deliver(b, [burst[i]], 0.1e-3), 0.1e-3)
        assert a.recovery.rto_deadline() == deadline  # burst[2] is still out
    feed(a, deliver(b, [burst[2]], 0.2e-3), 0.2e-3)
    assert not a.recovery.txs
    assert a.recovery.rto_deadline() is None


def test_a_packet_armed_at_the_instant_of_a_finished_burst_gets_its_own_timer() -> None:
    """The burst's timer entry is gone once all of it was acknowledged; a transmission armed
    for that same instant (a later transmit at the same clock reading) must not join it."""
    a, b, va, rkey = pair(timeout=1e-3)
    a.post_write(1, bytes(MTU), va, rkey, imm=None, now=T0)
    (first,) = send_all(a, T0)
    (tx,) = a.recovery.txs.values()
    feed(a, deliver(b, [first], 0.1e-3), 0.1e-3)
    assert a.recovery.rto_deadline() is None  # its entry left the heap
    again = Tx(tx.seq + 1, tx.wr, MTU, tx.slot, T0, tx.order + 1)
    again.deadline = tx.deadline
    a.recovery.track(again)
    assert a.recovery.rto_deadline() == tx.deadline


def test_a_silent_burst_times_out_in_send_order() -> None:
    a, b, va, rkey = pair(timeout=1e-3)
    a.post_write(1, bytes(MTU), va, rkey, imm=None, now=T0)
    feed(a, deliver(b, send_all(a, T0), 10e-6), 20e-6)  # an RTT sample, then silence
    a.datagrams_to_send(20e-6)
    a.post_write(2, bytes(6 * MTU), va, rkey, imm=None, now=1e-3)
    burst = send_all(a, 1e-3)  # all lost
    sent = sorted(a.recovery.txs)
    assert a.recovery.rto_deadline() == 2e-3  # (which drops the acked packet's entry)
    assert len(burst) == 6 and len(a.recovery.rto_heap) == 1
    a.recovery.tlp_deadline = None  # (the RTO's turn alone)
    a.handle_timer(2e-3)
    assert [tx.seq for tx, _ in a.recovery.retx] == sent
    assert {reason for _, reason in a.recovery.retx} == {"timeout"}


def test_rto_fires_when_the_connection_is_silent() -> None:
    a, b, va, rkey = pair(timeout=1e-3)
    a.post_write(1, bytes(MTU), va, rkey, imm=None, now=T0)
    feed(a, deliver(b, send_all(a, T0), 10e-6), 20e-6)
    a.datagrams_to_send(20e-6)
    a.post_write(2, bytes(2 * MTU), va, rkey, imm=None, now=1e-3)
    send_all(a, 1e-3)  # both lost
    deadline = a.recovery.rto_deadline()
    assert deadline is not None and deadline == 2e-3  # the 1 ms floor from its send time
    a.handle_timer(deadline)
    assert a.datagrams_to_send(deadline)  # a packet goes out at once
    # Both are declared lost (the newest by the tail probe that came due meanwhile); with no
    # progress since the timeout, one packet at a time is in flight.
    assert a.recovery.rto_rounds == 1
    assert sorted(reason for _, reason in a.recovery.retx) + sorted(a.stats.retransmissions) == [
        "timeout",
        "tlp",
    ]


def test_initial_rto_holds_until_the_first_rtt_sample() -> None:
    a, b, va, rkey = pair(timeout=1e-3, initial_rto=50e-3)
    a.post_write(1, bytes(MTU), va, rkey, imm=None, now=T0)
    data = send_all(a, T0)
    assert a.recovery.next_deadline() == T0 + 50e-3  # no RTT yet: no probe timer either
    a.handle_timer(10e-3)
    assert a.stats.retransmissions == {}
    feed(a, deliver(b, data, 10e-3), 20e-3)
    a.datagrams_to_send(20e-3)
    a.post_write(2, bytes(MTU), va, rkey, imm=None, now=30e-3)
    send_all(a, 30e-3)
    srtt, rttvar = a.recovery.srtt, a.recovery.rttvar
    assert srtt is not None
    assert a.recovery.rto_deadline() == pytest.approx(30e-3 + srtt + 4 * rttvar)  # measured
    assert [e for e in iter(a.next_event, None) if isinstance(e, SendCompleted)] == [
        SendCompleted(1, WcStatus.SUCCESS, MTU)
    ]


def test_initial_rto_is_validated() -> None:
    with pytest.raises(ValueError, match="initial_rto"):
        ConnectionConfig(1, 2, 1, (EvEntry(0, 0),), timeout=1e-3, initial_rto=1e-4)


def run_timers(a: Connection, until: float) -> list[Datagram]:
    """Fire ``a``'s timer while it is due before ``until``; what it sends then."""
    out: list[Datagram] = []
    while (deadline := a.get_timer()) is not None and deadline <= until:
        a.handle_timer(deadline)
        out.extend(send_all(a, deadline))
    return out


def test_a_lost_tail_is_found_by_the_tail_probe_not_the_rto() -> None:
    """The newest packet of a transfer is lost: no later packet can reveal it (RACK, the
    path's order), so the tail-loss probe resends it about two RTTs after the last ack,
    long before the RTO."""
    a, b, va, rkey = pair(timeout=1e-3)
    a.post_write(1, bytes(MTU), va, rkey, imm=None, now=T0)  # warm up: srtt = 19 us
    feed(a, deliver(b, send_all(a, T0), 10e-6), 20e-6)
    a.datagrams_to_send(20e-6)
    a.post_write(2, bytes(8 * MTU), va, rkey, imm=7, now=100e-6)
    burst = send_all(a, 100e-6)
    feed(a, deliver(b, burst[:-1], 110e-6), 120e-6)  # the tail never arrives
    a.datagrams_to_send(120e-6)
    probe = run_timers(a, 120e-6 + 5 * 20e-6)
    assert a.stats.retransmissions == {"tlp": 1}
    assert len(probe) == 1 and probe[0].ev != burst[-1].ev  # another path than the lost one
    feed(a, deliver(b, probe, 200e-6), 210e-6)
    a.datagrams_to_send(210e-6)
    done = [e for e in iter(a.next_event, None) if isinstance(e, SendCompleted)]
    assert [e.wr_id for e in done] == [1, 2]
    assert a.stats.retransmissions == {"tlp": 1}  # no timeout, and nothing else resent


def test_a_probe_that_finds_the_tail_arrived_is_no_spurious_retransmission() -> None:
    """The tail arrived but its ack is late (a busy host): the probe goes out, the receiver
    reports it as a duplicate, and that is the probe's expected outcome, counted apart:
    no spurious retransmission, and the reordering window stays as it was."""
    a, b, va, rkey = pair(timeout=1e-3)
    a.post_write(1, bytes(MTU), va, rkey, imm=None, now=T0)  # warm up: srtt = 19 us
    feed(a, deliver(b, send_all(a, T0), 10e-6), 20e-6)
    a.datagrams_to_send(20e-6)
    a.post_write(2, bytes(4 * MTU), va, rkey, imm=7, now=100e-6)
    burst = send_all(a, 100e-6)
    acks = deliver(b, burst, 110e-6)  # everything arrives; the acks are held back
    window = a.recovery.reo_fraction
    probe = run_timers(a, 100e-6 + 5 * 20e-6)
    assert a.stats.retransmissions == {"tlp": 1} and len(probe) == 1
    feed(a, acks + deliver(b, probe, 210e-6), 220e-6)
    a.datagrams_to_send(220e-6)
    assert b.stats.duplicates == 1  # the receiver did see the probe as a duplicate
    assert a.stats.tlp_unneeded == 1
    assert a.stats.spurious_retransmissions == 0
    assert a.recovery.reo_fraction == window
    done = [e for e in iter(a.next_event, None) if isinstance(e, SendCompleted)]
    assert [e.wr_id for e in done] == [1, 2]


def test_a_needless_timeout_counts_as_spurious_but_is_no_reordering() -> None:
    """The counterpart: a packet the RTO declared lost that had arrived (its acks held back
    by a stalled host) is a spurious retransmission; but a stall is not reordering, so
    RACK's reordering window stays as it was (doubling it for every packet of such a storm
    left every loss for the next half second found two RTTs late)."""
    a, b, va, rkey = pair(timeout=1e-3)
    a.post_write(1, bytes(MTU), va, rkey, imm=None, now=T0)
    feed(a, deliver(b, send_all(a, T0), 10e-6), 20e-6)
    a.datagrams_to_send(20e-6)
    a.post_write(2, bytes(2 * MTU), va, rkey, imm=None, now=1e-3)
    sent = send_all(a, 1e-3)
    acks = deliver(b, sent, 1.01e-3)  # arrived; acks held back past the RTO
    again = run_timers(a, 5e-3)
    assert a.stats.retransmissions.get("timeout", 0) >= 1
    window = a.recovery.reo_fraction
    feed(a, deliver(b, again, 5.1e-3) + acks, 5.2e-3)
    a.datagrams_to_send(5.2e-3)
    assert a.stats.spurious_retransmissions >= 2  # both packets, resent by the RTO
    assert a.recovery.reo_fraction == window


def test_the_tail_probe_stays_quiet_while_acks_come() -> None:
    a, b, va, rkey = pair(timeout=1e-3)
    a.post_write(1, bytes(4 * MTU), va, rkey, imm=None, now=T0)
    feed(a, deliver(b, send_all(a, T0), 10e-6), 20e-6)
    a.datagrams_to_send(20e-6)
    assert a.recovery.tlp_deadline is None  # nothing in flight: no probe armed
    assert a.stats.retransmissions == {}


def test_a_late_ack_does_not_revive_a_plane_the_peer_reported_down() -> None:
    """ACKs may arrive out of order: the port bitmap of an older one (plane 1 up) must not
    undo what a newer one said (plane 1 down)."""
    a, b, va, rkey = pair()
    a.post_write(1, bytes(MTU), va, rkey, imm=None, now=T0)
    old_acks = deliver(b, send_all(a, T0), 10e-6)  # b's ports all up
    b.set_port_state(1, False, now=15e-6)
    a.post_write(2, bytes(4 * MTU), va, rkey, imm=None, now=16e-6)
    new_acks = deliver(b, [d for d in send_all(a, 16e-6) if d.port == 0], 20e-6)
    assert old_acks and new_acks
    feed(a, new_acks, 30e-6)
    assert not a.evs.remote_port_up[1]  # the peer said so
    feed(a, old_acks, 31e-6)
    assert not a.evs.remote_port_up[1]  # and an older ACK does not say otherwise


def test_ev_min_active_is_checked_against_ev_count() -> None:
    evs = tuple(EvEntry(i, 0) for i in range(4))
    with pytest.raises(ValueError, match="ev_min_active"):
        ConnectionConfig(1, 2, 1, evs, ev_count=4, ev_min_active=5)
    conn = Connection(
        ConnectionConfig(1, 2, 1, evs, ev_count=4),
        memory=MemoryTable(),
        rng=random.Random(1),
        now=0.0,
    )
    conn.set_ev_min_active(4)
    with pytest.raises(LocalError, match="ev_count"):
        conn.set_ev_min_active(5)


def test_rack_finds_a_loss_within_one_burst_sent_at_one_instant() -> None:
    """A burst leaves at one ``now``: send times cannot order it, send order can.  A packet
    lost early in the burst, alone on its EV, is found by RACK once later packets of the
    same burst on its plane are acknowledged, before any tail-loss probe."""
    a, b, va, rkey = pair()
    a.post_write(1, bytes(MTU), va, rkey, imm=None, now=T0)
    feed(a, deliver(b, send_all(a, T0), 10e-6), 20e-6)  # an RTT sample
    a.datagrams_to_send(20e-6)
    a.post_write(2, bytes(6 * MTU), va, rkey, imm=None, now=1e-3)
    burst = send_all(a, 1e-3)
    plane1 = [d for d in burst if d.port == 1]
    lost = plane1[0]  # the first on plane 1: two more follow it there
    assert len(plane1) == 3 and len({d.ev for d in plane1}) == 3  # alone on its EV
    feed(a, deliver(b, [d for d in burst if d is not lost], 1.01e-3), 1.02e-3)
    a.datagrams_to_send(1.02e-3)
    # The reordering window (a quarter of the RTT) has passed; the probe (two RTTs) has not.
    a.handle_timer(1.03e-3)
    resent = a.datagrams_to_send(1.03e-3)
    assert a.stats.retransmissions == {"rack": 1}
    assert [d.data for d in resent] and resent[0].port == 1
