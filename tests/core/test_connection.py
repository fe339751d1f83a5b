"""The connection core driven in-process over a faulty virtual link."""

from __future__ import annotations

import os
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrcstack.core.cc import CCParams
from mrcstack.core.connection import Connection, Datagram
from mrcstack.core.events import (
    ConnectionFailed,
    Event,
    EvState,
    EvStateChanged,
    PortStateChanged,
    SendCompleted,
    WcStatus,
    WriteImmReceived,
)
from mrcstack.core.memory import Access
from mrcstack.core.recovery import GoBackN
from mrcstack.core.tx import Tx
from mrcstack.errors import ConnectionFailedError, LocalError
from mrcstack.wire import (
    WRITE_OPCODES,
    AckPacket,
    DataFlags,
    DataPacket,
    Opcode,
    ReliabilityProbePacket,
    decode,
    encode,
)
from tests.support.pairnet import LinkFaults, PairNet

GUARD = 64
DATA = WRITE_OPCODES


def region(net: PairNet, side: int, size: int) -> tuple[bytearray, int, int]:
    """A registered region inside a larger buffer whose guard bytes must never change."""
    backing = bytearray(b"\xee" * (size + 2 * GUARD))
    view = memoryview(backing)[GUARD : GUARD + size]
    mr = net.mem[side].register(view)
    return backing, mr.va, mr.rkey


def sends(net: PairNet, side: int = 0) -> list[SendCompleted]:
    return [e for e in net.events[side] if isinstance(e, SendCompleted)]


def imms(net: PairNet, side: int = 1) -> list[WriteImmReceived]:
    return [e for e in net.events[side] if isinstance(e, WriteImmReceived)]


def test_write_with_immediate_lands_and_completes() -> None:
    net = PairNet(1, LinkFaults())
    backing, va, rkey = region(net, 1, 5000)
    src = bytes(range(256)) * 19 + b"xyz"
    net.conns[0].post_write(7, src[:4867], va, rkey, imm=0xDEADBEEF, now=0.0)
    net.run(1.0, stop=lambda: bool(sends(net)) and bool(imms(net)))
    assert sends(net) == [SendCompleted(7, WcStatus.SUCCESS, 4867)]
    assert imms(net) == [WriteImmReceived(0xDEADBEEF, 4867)]
    assert backing[GUARD : GUARD + 4867] == src[:4867]
    assert backing[:GUARD] == b"\xee" * GUARD
    assert backing[GUARD + 4867 :] == b"\xee" * (len(backing) - GUARD - 4867)


def test_one_byte_write_and_psn_wraparound() -> None:
    # Both PSN spaces wrap within this transfer.
    net = PairNet(2, LinkFaults(), psns=((1 << 24) - 3, (1 << 24) - 1))
    backing, va, rkey = region(net, 1, 4096)
    net.conns[0].post_write(1, b"\x01", va, rkey, now=0.0)
    net.conns[0].post_write(2, bytes(range(200)) * 20, va + 1, rkey, imm=5, now=0.0)
    net.run(1.0, stop=lambda: len(sends(net)) == 2)
    assert [s.wr_id for s in sends(net)] == [1, 2]
    assert backing[GUARD] == 1
    assert backing[GUARD + 1 : GUARD + 4001] == bytes(range(200)) * 20


def test_immediate_reports_its_own_writes_length() -> None:
    """WriteImmReceived.byte_len is that write's length, as verbs' byte_len: writes without
    an immediate before it do not count (they used to)."""
    net = PairNet(17, LinkFaults(loss=0.05, reorder=20e-6))
    _, va, rkey = region(net, 1, 9000)
    net.conns[0].post_write(1, b"a" * 1000, va, rkey, now=0.0)
    net.conns[0].post_write(2, b"b" * 3000, va + 1000, rkey, now=0.0)
    net.conns[0].post_write(3, b"c" * 700, va + 4000, rkey, imm=3, now=0.0)
    net.conns[0].post_write(4, b"d" * 1, va + 4700, rkey, imm=4, now=0.0)
    net.run(5.0, stop=lambda: len(imms(net)) == 2)
    assert imms(net) == [WriteImmReceived(3, 700), WriteImmReceived(4, 1)]


def test_bad_rkey_is_nacked_and_never_touches_memory() -> None:
    net = PairNet(3, LinkFaults())
    backing, va, rkey = region(net, 1, 1024)
    before = bytes(backing)
    net.conns[0].post_write(1, b"A" * 100, va, rkey + 99, now=0.0)  # wrong rkey
    net.run(1.0, stop=lambda: bool(sends(net)))
    assert sends(net)[0].status is WcStatus.REMOTE_ACCESS_ERROR
    assert any(isinstance(e, ConnectionFailed) for e in net.events[0])
    assert bytes(backing) == before
    assert net.conns[1].stats.rejected.get("rkey", 0) >= 1
    with pytest.raises(ConnectionFailedError):
        net.conns[0].post_write(2, b"x", va, rkey, now=net.now)


@pytest.mark.parametrize("offset,length", [(1000, 100), (-1, 10), (0, 1025)])
def test_out_of_range_writes_are_rejected(offset: int, length: int) -> None:
    net = PairNet(4, LinkFaults())
    backing, va, rkey = region(net, 1, 1024)
    before = bytes(backing)
    net.conns[0].post_write(1, b"B" * length, va + offset, rkey, now=0.0)
    net.run(1.0, stop=lambda: bool(sends(net)))
    assert sends(net)[0].status is WcStatus.REMOTE_ACCESS_ERROR
    # Packets are checked one by one (as in RDMA): in-range ones of the same write may land,
    # but nothing outside the region ever changes.
    assert backing[:GUARD] == before[:GUARD] and backing[-GUARD:] == before[-GUARD:]
    assert net.conns[1].stats.rejected["rkey"] >= 1


def test_read_only_region_rejects_remote_writes() -> None:
    net = PairNet(5, LinkFaults())
    buf = bytearray(256)
    mr = net.mem[1].register(buf, Access.LOCAL_READ)
    net.conns[0].post_write(1, b"C" * 10, mr.va, mr.rkey, now=0.0)
    net.run(1.0, stop=lambda: bool(sends(net)))
    assert sends(net)[0].status is WcStatus.REMOTE_ACCESS_ERROR
    assert buf == bytearray(256)


def test_post_write_checks_arguments() -> None:
    net = PairNet(6, LinkFaults())
    conn = net.conns[0]
    with pytest.raises(LocalError):
        conn.post_write(1, b"", 0, 1, now=0.0)
    with pytest.raises(LocalError):
        conn.post_write(1, b"x", 0, 1, imm=1 << 32, now=0.0)
    with pytest.raises(LocalError):
        conn.post_write(1, b"x", (1 << 64) - 1 + 1, 1, now=0.0)
    with pytest.raises(LocalError):
        conn.set_port_state(9, False, now=0.0)


def test_completions_in_posting_order_and_imm_implies_earlier_writes_placed() -> None:
    net = PairNet(7, LinkFaults(loss=0.1, reorder=50e-6))
    backing, va, rkey = region(net, 1, 64 * 1024)
    chunks = [bytes([i]) * (1000 + 37 * i) for i in range(20)]
    offset = 0
    placed_at_imm: list[bool] = []
    for i, chunk in enumerate(chunks):
        imm = i if i % 3 == 2 else None
        net.conns[0].post_write(i, chunk, va + offset, rkey, imm=imm, now=0.0)
        offset += len(chunk)

    def on_event(side: int, ev: object) -> None:
        # The moment an immediate shows up, every earlier write must be fully placed.
        if side == 1 and isinstance(ev, WriteImmReceived):
            end = sum(len(c) for c in chunks[: ev.imm + 1])
            expect = b"".join(chunks[: ev.imm + 1])
            placed_at_imm.append(bytes(backing[GUARD : GUARD + end]) == expect)

    net.on_event = on_event
    net.run(5.0, stop=lambda: len(sends(net)) == len(chunks))
    assert [s.wr_id for s in sends(net)] == list(range(20))
    assert all(s.status is WcStatus.SUCCESS for s in sends(net))
    assert [e.imm for e in imms(net)] == [2, 5, 8, 11, 14, 17]
    assert placed_at_imm and all(placed_at_imm)


def test_blackholed_ev_goes_assumed_bad_and_retransmits_elsewhere() -> None:
    net = PairNet(8, LinkFaults(blackouts=[(0.0, 10.0, 0x001)]), planes=2, per_plane=4)
    backing, va, rkey = region(net, 1, 100_000)
    data = os.urandom(100_000)
    net.conns[0].post_write(1, data, va, rkey, imm=1, now=0.0)
    net.run(5.0, stop=lambda: bool(sends(net)))
    assert sends(net)[0].status is WcStatus.SUCCESS
    assert backing[GUARD : GUARD + 100_000] == data
    assert net.conns[0].evs.state(0x001) is EvState.ASSUMED_BAD
    bad = [
        e
        for e in net.events[0]
        if isinstance(e, EvStateChanged) and e.ev == 0x001 and e.new is EvState.ASSUMED_BAD
    ]
    assert bad and bad[0].drop_count >= 1 and bad[0].port == 0


def test_lossy_ev_is_replaced_by_a_backup_from_the_same_plane() -> None:
    net = PairNet(
        9, LinkFaults(ev_loss={0x102: 0.2}), planes=2, per_plane=6, ev_count=8
    )  # 4 in use per plane, 2 backups
    backing, va, rkey = region(net, 1, 200_000)
    data = os.urandom(200_000)
    net.conns[0].post_write(1, data, va, rkey, imm=1, now=0.0)
    net.run(5.0, stop=lambda: bool(sends(net)))
    assert backing[GUARD : GUARD + 200_000] == data
    changes = [e for e in net.events[0] if isinstance(e, EvStateChanged)]
    assert any(e.ev == 0x102 and e.new is EvState.ASSUMED_BAD for e in changes)
    activated = [e for e in changes if e.old is EvState.UNKNOWN and e.new is EvState.GOOD]
    assert activated and all(e.port == 1 for e in activated)


def test_retry_limit_fails_the_connection_only_when_exhausted() -> None:
    net = PairNet(10, LinkFaults(loss=1.0), linear_cnt=2, exp_cnt=2)
    _, va, rkey = region(net, 1, 1024)
    net.conns[0].post_write(1, b"z" * 500, va, rkey, now=0.0)
    net.conns[0].post_write(2, b"z" * 10, va, rkey, now=0.0)
    net.run(60.0, stop=lambda: len(sends(net)) == 2)
    failed = [e for e in net.events[0] if isinstance(e, ConnectionFailed)]
    assert len(failed) == 1 and "retry limit" in failed[0].reason
    assert [s.status for s in sends(net)] == [WcStatus.RETRY_EXCEEDED, WcStatus.FLUSHED]
    assert net.conns[0].stats.retransmissions.get("timeout", 0) >= 4


def test_plane_down_locally_stops_its_use_and_peer_learns_it() -> None:
    net = PairNet(11, LinkFaults(), planes=2, per_plane=2)
    backing, va, rkey = region(net, 1, 400_000)
    data = os.urandom(400_000)
    sender = net.conns[0]
    sent_at_event: list[int] = []
    net.on_event = lambda side, ev: (
        sent_at_event.append(sender.stats.packets_sent[1])
        if side == 0 and isinstance(ev, PortStateChanged)
        else None
    )
    net.conns[0].post_write(1, data, va, rkey, imm=3, now=0.0)
    net.run(20e-6, stop=lambda: bool(sends(net)))  # packets are on the wire on both planes
    net.conns[1].set_port_state(1, False, now=net.now)  # the receiver's port 1 goes down
    net.run(5.0, stop=lambda: bool(sends(net)))
    assert backing[GUARD : GUARD + 400_000] == data
    remote_down = [e for e in net.events[0] if isinstance(e, PortStateChanged)]
    assert remote_down == [PortStateChanged(1, False, remote=True)]
    # Once the first ACK told the sender, nothing more went out on plane 1.
    assert sent_at_event[0] > 0
    assert sender.stats.packets_sent[1] == sent_at_event[0]
    net.conns[1].set_port_state(1, True, now=net.now)
    sent_before = net.conns[0].stats.packets_sent[1]
    net.conns[0].post_write(2, data, va, rkey, imm=4, now=net.now)
    net.run(net.now + 5.0, stop=lambda: len(sends(net)) == 2)
    assert net.conns[0].stats.packets_sent[1] - sent_before > 100


def test_peer_ports_from_outside_the_data_path_act_like_a_sacks_bitmap() -> None:
    """set_peer_ports (the adapter heard the peer's PORT_STATUS_UPDATE over its control
    channel) takes the peer's down plane out of use at once, exactly as a SACK's bitmap
    would; the bitmaps of later SACKs rule again.  A failed connection ignores it."""
    net = PairNet(12, LinkFaults(), planes=2, per_plane=2)
    sender = net.conns[0]
    data_ports: list[tuple[float, int]] = []
    net.on_send = lambda side, d, now: (
        data_ports.append((now, d.port)) if side == 0 and d.data[0] in DATA else None
    )
    assert sender.set_peer_ports(0b01, now=0.0)  # the peer's plane 1 is down
    assert not sender.set_peer_ports(0b01, now=0.0)  # nothing changes
    net.kick()
    assert [e for e in net.events[0] if isinstance(e, PortStateChanged)] == [
        PortStateChanged(1, False, remote=True)
    ]
    backing, va, rkey = region(net, 1, 100_000)
    data = os.urandom(100_000)
    sender.post_write(1, data, va, rkey, now=0.0)
    net.kick()  # the first flight, before any SACK could say otherwise
    assert data_ports and {port for _, port in data_ports} == {0}
    net.run(5.0, stop=lambda: bool(sends(net)))  # the receiver's SACKs: both planes are up
    assert backing[GUARD : GUARD + 100_000] == data
    assert PortStateChanged(1, True, remote=True) in net.events[0]
    assert {port for _, port in data_ports} == {0, 1}
    sender.abort("gone")
    assert not sender.set_peer_ports(0b00, now=net.now)
    net.kick()
    assert PortStateChanged(0, False, remote=True) not in net.events[0]


def test_keyed_connection_rejects_forged_and_replayed_packets() -> None:
    key = bytes(range(16))
    net = PairNet(12, LinkFaults(), key=key, encrypt=True)
    backing, va, rkey = region(net, 1, 2048)
    net.conns[0].post_write(1, b"S" * 300, va, rkey, imm=1, now=0.0)
    captured = net.conns[0].datagrams_to_send(0.0)
    assert captured and all(b"S" * 32 not in d.data for d in captured)  # encrypted
    for d in captured:
        net.conns[1].receive_datagram(d.data, now=0.0, port=d.port)
    replayed_before = net.conns[1].stats.rejected.get("replay", 0)
    for d in captured:  # replay every packet
        net.conns[1].receive_datagram(d.data, now=0.0, port=d.port)
    forged = bytearray(captured[0].data)
    forged[-1] ^= 1
    net.conns[1].receive_datagram(bytes(forged), now=0.0, port=0)
    rejected = net.conns[1].stats.rejected
    assert rejected.get("replay", 0) - replayed_before == len(captured)
    assert rejected.get("bad_auth", 0) == 1
    assert backing[GUARD : GUARD + 300] == b"S" * 300


def test_roce_mode_is_single_path_and_recovers_with_go_back_n() -> None:
    net = PairNet(13, LinkFaults(loss=0.05), mode="roce", planes=2, per_plane=4)
    backing, va, rkey = region(net, 1, 50_000)
    data = os.urandom(50_000)
    net.conns[0].post_write(1, data, va, rkey, imm=9, now=0.0)
    net.run(30.0, stop=lambda: bool(sends(net)))
    assert backing[GUARD : GUARD + 50_000] == data
    assert net.conns[0].stats.packets_sent[1] == 0  # one EV, one plane
    assert net.conns[0].stats.retransmissions.get("nack", 0) > 0
    # Go-back-N keeps no per-path or time-ordered record: nothing pins the sent buffers.
    recovery = net.conns[0].recovery
    assert type(recovery) is GoBackN  # the mode chooses the recovery
    assert not recovery.sent_fifo and not any(recovery.ev_fifo.values()) and not recovery.txs


PROFILE = int(os.environ.get("MRC_PROPERTY_CASES", "2000"))


@settings(
    max_examples=PROFILE,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    seed=st.integers(0, 2**32 - 1),
    loss=st.floats(0.0, 0.2),
    dup=st.floats(0.0, 0.1),
    reorder=st.sampled_from([0.0, 5e-6, 50e-6, 500e-6]),
    trim=st.floats(0.0, 0.1),
    ecn=st.floats(0.0, 0.2),
    failed_link=st.sampled_from([(), (0x100,), (0x001, 0x101), (0x000, 0x001, 0x002)]),
    plane_flap=st.booleans(),
    ack_coalesce=st.sampled_from([1, 1, 4, 16]),
    sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=6),
    imm_mask=st.integers(0, 63),
    keyed=st.booleans(),
    plain=st.booleans(),
)
def test_property_every_byte_lands_every_completion_once_in_order(
    seed: int,
    loss: float,
    dup: float,
    reorder: float,
    trim: float,
    ecn: float,
    failed_link: tuple[int, ...],
    plane_flap: bool,
    ack_coalesce: int,
    sizes: list[int],
    imm_mask: int,
    keyed: bool,
    plain: bool,
) -> None:
    """Also without mrcstack's extension (``plain``: OCP MRC 1.0's encoding alone, no key)."""
    keyed = keyed and not plain
    faults = LinkFaults(
        loss=loss,
        dup=dup,
        reorder=reorder,
        trim=trim,
        ecn=ecn,
        # A failed link takes down every EV whose path crosses it, for a while.
        blackouts=[(0.0, 0.05, ev) for ev in failed_link],
    )
    # Harsh combinations (three of four paths of a plane dead while the other plane is down,
    # plus 20% loss) can need many timeouts before a live path is found: give the retry
    # budget room, since exhausting it is a separate, tested behaviour.
    net = PairNet(
        seed,
        faults,
        key=bytes(16) if keyed else None,
        mtu=256,
        exp_cnt=10,
        ack_coalesce=ack_coalesce,
        extensions=not plain,
    )
    total = sum(sizes)
    backing, va, rkey = region(net, 1, total)
    payload = net.rng.randbytes(total)
    offset = 0
    for i, size in enumerate(sizes):
        imm = i if imm_mask >> i & 1 or i == len(sizes) - 1 else None
        net.conns[0].post_write(
            i, payload[offset : offset + size], va + offset, rkey, imm=imm, now=0.0
        )
        offset += size
    if plane_flap:  # the receiver's NIC port 1 goes down mid-transfer, then comes back
        net.run(30e-6)
        net.conns[1].set_port_state(1, False, now=net.now)
        net.run(net.now + 2e-3, stop=lambda: len(sends(net)) == len(sizes))
        net.conns[1].set_port_state(1, True, now=net.now)
    net.run(120.0, stop=lambda: len(sends(net)) == len(sizes))
    done = sends(net)
    assert [s.wr_id for s in done] == list(range(len(sizes)))
    assert all(s.status is WcStatus.SUCCESS for s in done)
    assert bytes(backing[GUARD : GUARD + total]) == payload
    assert backing[:GUARD] == b"\xee" * GUARD and backing[GUARD + total :] == b"\xee" * GUARD
    net.run(net.now + 1.0, stop=lambda: bool(imms(net)) and imms(net)[-1].imm == len(sizes) - 1)
    expected = [i for i in range(len(sizes)) if imm_mask >> i & 1 or i == len(sizes) - 1]
    assert [e.imm for e in imms(net)] == expected
    if net.dropped == 0 and reorder == 0.0 and not plane_flap:
        # Nothing was lost, every path kept its order and no port went down (trims and ECN
        # marks are congestion, not loss): every retransmission answers a trim.
        for conn in net.conns:
            resent = conn.stats.retransmissions
            assert {k: v for k, v in resent.items() if k != "trim" and v} == {}, resent

    # Once everything completed, more time brings no extra completion (no late duplicate
    # of a retransmission, no timer firing one again) and no failure.  (EV events may
    # still come: the receiver keeps probing its reverse EVs for a while.)
    def settled() -> list[list[Event]]:
        kinds = (SendCompleted, WriteImmReceived, ConnectionFailed)
        return [[e for e in events if isinstance(e, kinds)] for events in net.events]

    seen = settled()
    net.run(net.now + 0.05)
    assert settled() == seen


def test_one_gibibyte_write_with_immediate() -> None:
    """Writes of any length: 1 GiB in one work request, cut lazily into packets."""
    gib = 1 << 30
    net = PairNet(14, LinkFaults(loss=0.001), mtu=60_000, cc_params=CCParams(max_cwnd=64 * 60_000))
    dst = bytearray(gib)
    mr = net.mem[1].register(dst)
    src = os.urandom(1 << 20) * 1024
    net.conns[0].post_write(1, src, mr.va, mr.rkey, imm=42, now=0.0)
    net.run(60.0, stop=lambda: bool(sends(net)) and bool(imms(net)))
    assert sends(net) == [SendCompleted(1, WcStatus.SUCCESS, gib)]
    assert imms(net) == [WriteImmReceived(42, gib)]
    assert dst == src


@pytest.mark.parametrize("coalesce", [1, 8])
def test_ack_coalescing_cuts_acks_in_receive_batches(coalesce: int) -> None:
    net = PairNet(15, LinkFaults(), planes=2, per_plane=2, ack_coalesce=coalesce)
    backing, va, rkey = region(net, 1, 64 * 256)
    data = os.urandom(64 * 256)
    net.conns[0].post_write(1, data, va, rkey, imm=1, now=0.0)
    net.run(1.0, stop=lambda: bool(sends(net)))
    assert backing[GUARD : GUARD + len(data)] == data
    acks = sum(net.conns[1].stats.packets_sent)
    if coalesce == 1:
        assert acks == 64  # one per data packet
    else:
        assert acks <= 64 // coalesce + 2 * 2  # plus at most one partial ACK per plane per batch


#: The ACK delay of :func:`delayed_write`'s receiver (a quarter of its 1 ms timeout at most).
DELAY = 200e-6


def delayed_write(seed: int) -> tuple[Connection, Connection]:
    """A pair whose receiver delays its ACKs (``DELAY``, coalescing 16) and an 8-packet
    write posted on the sender, nothing sent yet: (sender, receiver)."""
    net = PairNet(seed, LinkFaults(), planes=2, per_plane=2, ack_coalesce=16, ack_delay=DELAY,
                  timeout=1e-3)  # fmt: skip
    _, va, rkey = region(net, 1, 8 * 256)
    sender, receiver = net.conns
    sender.post_write(1, bytes(8 * 256), va, rkey, now=0.0)
    return sender, receiver


def test_a_delayed_ack_waits_for_more_data_but_not_past_a_writes_end() -> None:
    """With ``ack_delay`` a receive batch's coalesced ACK stays pending past the transmit
    that would have sent it, with the connection's timer at its deadline, and leaves then;
    a write's last packet is acknowledged at once, with the pending ones."""
    sender, receiver = delayed_write(5)
    data = [d for d in sender.datagrams_to_send(0.0) if d.data[0] in DATA]
    assert len(data) == 8
    for d in data[:3]:
        receiver.receive_datagram(d.data, now=1e-5, port=d.port)
    assert receiver.datagrams_to_send(1e-5) == []  # held back
    assert receiver.get_timer() == pytest.approx(1e-5 + DELAY)
    receiver.receive_datagram(data[3].data, now=5e-5, port=data[3].port)
    assert receiver.datagrams_to_send(5e-5) == []  # the same group: the deadline stands
    acks = receiver.datagrams_to_send(1e-5 + DELAY)
    assert acks and all(type(decode(a.data, sender.integrity)) is AckPacket for a in acks)
    assert receiver.datagrams_to_send(2e-5 + DELAY) == []
    for d in data[4:7]:
        receiver.receive_datagram(d.data, now=3e-4, port=d.port)
    assert receiver.datagrams_to_send(3e-4) == []
    receiver.receive_datagram(data[7].data, now=3.1e-4, port=data[7].port)  # LAST
    last = [decode(a.data, sender.integrity) for a in receiver.datagrams_to_send(3.1e-4)]
    assert last and max(a.cum_psn for a in last) == (receiver.cfg.remote_psn + 7) & 0xFFFFFF  # type: ignore[union-attr]
    assert receiver.datagrams_to_send(3e-4 + DELAY) == []  # nothing was left waiting


def test_a_sender_whose_window_is_full_asks_for_an_ack_now() -> None:
    """The packet after which the congestion window is full carries ACK_REQ (a peer with
    ``ack_delay`` acknowledges it at once), whatever this end's own ``ack_delay``; the
    others do not, and neither does a packet sent with room to spare."""
    for delay in (0.0, 100e-6):
        net = PairNet(6, LinkFaults(), ack_delay=delay, timeout=1e-3,
                      cc_params=CCParams(max_cwnd=4 * 256))  # fmt: skip
        _, va, rkey = region(net, 1, 16 * 256)
        net.conns[0].post_write(1, bytes(16 * 256), va, rkey, now=0.0)
        sent = [p for p, _ in net.conns[0].packets_to_send(0.0) if type(p) is DataPacket]
        assert len(sent) == 4  # the window
        assert [p.flags & DataFlags.ACK_REQ != 0 for p in sent] == [False] * 3 + [True]
    net = PairNet(6, LinkFaults(), cc_params=CCParams(max_cwnd=64 * 256))
    _, va, rkey = region(net, 1, 3 * 256)
    net.conns[0].post_write(1, bytes(3 * 256), va, rkey, now=0.0)
    sent = [p for p, _ in net.conns[0].packets_to_send(0.0) if type(p) is DataPacket]
    assert len(sent) == 3 and not any(p.flags & DataFlags.ACK_REQ for p in sent)


def test_a_retransmission_asks_for_its_ack_now() -> None:
    """A packet resent after a loss carries ACK_REQ, and a receiver that delays its ACKs
    acknowledges it at once (the repair's news does not wait out the delay); the first
    transmissions before the window's end do not ask."""
    sender, receiver = delayed_write(8)
    first = [p for p, _ in sender.packets_to_send(0.0) if type(p) is DataPacket]
    assert len(first) == 8 and not any(p.flags & DataFlags.ACK_REQ for p in first[:-1])
    # Packet 2 is lost: the rest arrive; the last one's ACK (at once) reports the hole.
    lost = first[2]
    now = 1e-4
    for p in first:
        if p is not lost:
            receiver.receive_datagram(sender.encode(p), now=now, port=p.port)
    for ack in receiver.datagrams_to_send(now):
        sender.receive_datagram(ack.data, now=now + 1e-4, port=ack.port)
    now += 1e-4
    resent: list[DataPacket] = []
    while not resent and now < 0.1:
        timer = sender.get_timer()
        assert timer is not None
        now = max(now, timer)
        sender.handle_timer(now)
        resent = [p for p, _ in sender.packets_to_send(now) if type(p) is DataPacket]
    assert [p.psn for p in resent] == [lost.psn]
    assert resent[0].flags & DataFlags.RETX and resent[0].flags & DataFlags.ACK_REQ
    receiver.receive_datagram(sender.encode(resent[0]), now=now, port=resent[0].port)
    acks = [decode(a.data, sender.integrity) for a in receiver.datagrams_to_send(now)]
    assert acks, "the repair's ACK waited for the delay"
    assert max(a.cum_psn for a in acks) == (receiver.cfg.remote_psn + 7) & 0xFFFFFF  # type: ignore[union-attr]


def test_window_reports_the_congestion_window_and_the_bytes_in_flight() -> None:
    """What ``mrcctl qp show`` shows: a window's packets in flight once sent, none once
    every write completed; the congestion window as the sender's CC holds it."""
    mtu = 256
    net = PairNet(7, LinkFaults(), mtu=mtu, cc_params=CCParams(max_cwnd=4 * mtu))
    conn = net.conns[0]
    assert conn.window() == (4 * mtu, 0)
    _, va, rkey = region(net, 1, 16 * mtu)
    conn.post_write(1, bytes(16 * mtu), va, rkey, now=0.0)
    sent = [p for p, _ in conn.packets_to_send(0.0) if type(p) is DataPacket]
    cwnd, in_flight = conn.window()
    assert cwnd == conn.cc.cwnd and in_flight == sum(tx.size for tx in conn.recovery.txs.values())
    assert len(sent) == 4 and 4 * mtu <= in_flight <= cwnd + mtu
    net.kick()
    net.run(1.0, stop=lambda: len(sends(net)) == 1)
    assert [s.wr_id for s in sends(net)] == [1] and conn.window()[1] == 0


def test_delayed_acks_lose_nothing_resend_nothing_and_stall_no_window() -> None:
    """Writes of every size through a window of 4 packets, with and without loss: every
    byte lands and every write completes; without loss, no retransmission of any kind, the
    ACKs stood for several packets each, and the run took a fraction of what waiting out
    the delay once per window would (the window's last packet asks for its ACK at once).
    Virtual time: exact, not timed."""
    sizes = [1, 255, 256, 3000, 20_000, 70_000]
    delay, mtu = 250e-6, 256
    windows = sum(-(-size // mtu) for size in sizes) / 4
    for seed, loss in ((1, 0.0), (2, 0.0), (3, 0.05), (4, 0.05)):
        net = PairNet(seed, LinkFaults(loss=loss), ack_coalesce=16, ack_delay=delay,
                      timeout=1e-3, mtu=mtu, cc_params=CCParams(max_cwnd=4 * mtu))  # fmt: skip
        backing, va, rkey = region(net, 1, sum(sizes))
        payload = net.rng.randbytes(sum(sizes))
        offset = 0
        for i, size in enumerate(sizes):
            net.conns[0].post_write(i, payload[offset : offset + size], va + offset, rkey, now=0.0)
            offset += size
        net.run(30.0, stop=lambda net=net: len(sends(net)) == len(sizes))  # type: ignore[misc]
        assert [s.wr_id for s in sends(net)] == list(range(len(sizes)))
        assert bytes(backing[GUARD : GUARD + sum(sizes)]) == payload
        if loss == 0.0:
            resent = net.conns[0].stats.retransmissions
            assert {k: v for k, v in resent.items() if v} == {}, resent
            acks = sum(net.conns[1].stats.packets_sent)
            assert sum(net.conns[0].stats.packets_sent) > 1.5 * acks  # coalesced
            assert net.now < windows * delay / 4, net.now


def test_duplicate_reports_widen_the_reordering_window() -> None:
    """Heavy reordering makes RACK resend too early; the receiver's DUPLICATE flag (DSACK)
    tells the sender, which widens its reordering window instead of wasting more."""
    net = PairNet(16, LinkFaults(reorder=300e-6), planes=2, per_plane=4)
    backing, va, rkey = region(net, 1, 200_000)
    data = os.urandom(200_000)
    net.conns[0].post_write(1, data, va, rkey, imm=1, now=0.0)
    net.run(10.0, stop=lambda: bool(sends(net)))
    assert backing[GUARD : GUARD + len(data)] == data
    assert net.conns[1].stats.duplicates > 0
    assert net.conns[0].stats.spurious_retransmissions > 0
    assert net.conns[0].recovery.reo_fraction > 0.25


def test_a_reliability_probe_gets_the_receivers_state_in_a_sack() -> None:
    """PETH: the receiver answers with its cumulative PSN and SACK bitmap at once, echoing
    the probe's EV and timestamp (a peer's tail-loss or liveness question)."""
    net = PairNet(3, LinkFaults(), psns=(100, 500))
    _, va, rkey = region(net, 1, 4096)
    sender, receiver = net.conns
    sender.post_write(1, bytes(range(256)) * 4, va, rkey, now=0.0)  # 4 packets of 256 B
    data = [d for d in sender.datagrams_to_send(0.0) if d.data[0] in DATA]
    assert len(data) == 4
    for d in (data[0], data[2]):  # PSN 100 and 102 arrive, 101 and 103 do not
        receiver.receive_datagram(d.data, now=0.001, port=d.port)
    receiver.datagrams_to_send(0.001)  # the ACKs of those two
    probe = ReliabilityProbePacket(qpn=11, probe_id=7, ev=0x102, port=1, tx_seq=99,
                                   ts_ns=123_456_789)  # fmt: skip
    receiver.receive_datagram(encode(probe, receiver.integrity), now=0.002, port=1)
    (answer,) = receiver.datagrams_to_send(0.002)
    sack = decode(answer.data, sender.integrity)
    assert isinstance(sack, AckPacket) and not sack.nack_reason
    assert (sack.cum_psn, sack.echo_ev, sack.echo_ts_ns) == (100, 0x102, 123_456_789)
    assert sack.sack_base == 101 and sack.sack_bitmap == 0b10  # 102 held, 101 missing
    assert receiver.stats.reliability_probes == 1
    sender.receive_datagram(answer.data, now=0.003, port=answer.port)
    assert sender.sender.snd_una == 101  # the sender takes the state like any SACK


def test_a_pacing_adapter_takes_data_only_as_its_nic_has_room() -> None:
    """``data_limit`` bounds data packets, never control; what is held back stays unsent
    (no timer runs for it) and leaves on a later call."""
    net = PairNet(1, LinkFaults())
    _, va, rkey = region(net, 1, 64 * 1024)
    sender = net.conns[0]
    sender.post_write(1, bytes(64 * 1024), va, rkey, now=0.0)
    assert sender.datagrams_to_send(0.0, data_limit=0) == []
    first = sender.datagrams_to_send(0.0, data_limit=3)
    assert len(first) == 3
    assert sum(sender.stats.packets_sent) == 3
    rest = sender.datagrams_to_send(1e-6)  # no data limit: as far as the window allows
    assert len(rest) > 3 and sum(sender.stats.packets_sent) == 3 + len(rest)


def test_data_and_ack_packets_have_every_field_set() -> None:
    """The sender and the ACK path fill their packets field by field (no constructor call):
    each must come out as the dataclass's own constructor would build it."""
    net = PairNet(1, LinkFaults())
    _, va, rkey = region(net, 1, 4096)
    net.conns[0].post_write(3, b"\x07" * 3000, va, rkey, imm=9, now=0.0)
    data = next(p for p, _ in net.conns[0].packets_to_send(0.0) if type(p) is DataPacket)
    rebuilt = DataPacket(**{f.name: getattr(data, f.name) for f in fields(DataPacket)})
    assert rebuilt == data
    net.conns[1].receive_packet(data, 3100, now=1e-6, port=data.port)
    ack = next(p for p, _ in net.conns[1].packets_to_send(1e-6) if type(p) is AckPacket)
    assert AckPacket(**{f.name: getattr(ack, f.name) for f in fields(AckPacket)}) == ack


def test_transmission_records_have_every_slot_set() -> None:
    """A transmission record comes out as ``Tx``'s constructor builds it, but for what the
    send itself decides after (the deadline, and a retransmission's counts)."""
    net = PairNet(1, LinkFaults())
    _, va, rkey = region(net, 1, 4096)
    net.conns[0].post_write(3, b"\x07" * 3000, va, rkey, imm=9, now=0.0)
    net.conns[0].packets_to_send(0.0)
    txs = list(net.conns[0].recovery.txs.values())
    assert txs
    for tx in txs:
        ref = Tx(tx.seq, tx.wr, tx.size, tx.slot, tx.sent, tx.order)
        decided = ("deadline", "queued")  # set by the send after the record is made
        # (compiled by mypyc, a class lists its fields in __mypyc_attrs__, not __slots__)
        for name in getattr(Tx, "__mypyc_attrs__", None) or Tx.__slots__:
            if name not in decided:
                assert getattr(tx, name) == getattr(ref, name), name
        assert tx.deadline > tx.sent and tx.queued


@pytest.mark.parametrize(
    ("key", "encrypt", "extensions"),
    [(None, False, True), (bytes(16), False, True), (bytes(16), True, True), (None, False, False)],
)
def test_encode_into_sends_what_datagrams_to_send_would(
    key: bytes | None, encrypt: bool, extensions: bool
) -> None:
    """An adapter encoding into its own send slots sends the same bytes as one taking
    datagrams: two identical pairs, one each way, with the ACKs both ways."""
    nets = [PairNet(5, LinkFaults(), key=key, encrypt=encrypt, extensions=extensions) for _ in "ab"]
    for net in nets:
        _, va, rkey = region(net, 1, 4096)
        net.conns[0].post_write(1, bytes(range(256)) * 8, va, rkey, imm=7, now=0.0)
    slot = bytearray(4096)
    for side in (0, 1):  # the data, then the ACKs
        want = [(d.data, d.port) for d in nets[0].conns[side].datagrams_to_send(0.0)]
        got = []
        conn = nets[1].conns[side]
        for pkt, size in conn.packets_to_send(0.0):
            n = conn.encode_into(pkt, slot)
            assert n == size  # the length packets_to_send gave
            got.append((bytes(slot[:n]), pkt.port))
        assert got == want and want
        for i, net in enumerate(nets):
            for data, port in want if i == 0 else got:
                net.conns[1 - side].receive_datagram(data, now=0.0, port=port)
    for net in nets:  # the write completed on both
        done = [e for e in iter(net.conns[0].next_event, None) if isinstance(e, SendCompleted)]
        assert [(e.wr_id, e.status) for e in done] == [(1, WcStatus.SUCCESS)]


@pytest.mark.parametrize(
    ("key", "encrypt", "extensions"),
    [(None, False, True), (bytes(16), True, True), (None, False, False)],
    ids=["crc", "aes-gcm", "plain"],
)
def test_bytes_sent_and_received_count_the_datagrams(
    key: bytes | None, encrypt: bool, extensions: bool
) -> None:
    """Each end's byte counters add up the datagrams it hands out and takes in (those not
    rejected), with or without the extension: writes with and without an immediate,
    retransmissions, SACKs, NACKs (trims), EV probes and their answers."""
    faults = LinkFaults(loss=0.05, trim=0.05, delay=20e-6)
    net = PairNet(3, faults, key=key, encrypt=encrypt, extensions=extensions, probe_interval=5e-5)
    sent = [0, 0]
    kinds: set[int] = set()

    def on_send(side: int, d: Datagram, now: float) -> None:
        sent[side] += len(d.data)
        kinds.add(d.data[0])

    net.on_send = on_send
    taken = [0, 0]
    receive = net.receive

    def counted(side: int, data: bytes, **kw: Any) -> None:
        stats = net.conns[side].stats
        rejected = sum(stats.rejected.values())
        receive(side, data, **kw)
        if sum(stats.rejected.values()) == rejected:
            taken[side] += len(data)

    net.receive = counted  # type: ignore[method-assign]
    _, va, rkey = region(net, 1, 4 * 8192)
    for i in range(4):
        payload = bytes(range(256)) * 30 + b"x" * i
        imm = i if i % 2 else None
        net.conns[0].post_write(i, payload, va + i * 8192, rkey, imm=imm, now=0.0)
    net.run(0.05, stop=lambda: len(sends(net)) == 4)
    net.run(net.now + 1e-3)  # the last ACKs and probes
    net.kick()  # what is queued is handed out (counted once queued)
    assert [e.status for e in sends(net)] == [WcStatus.SUCCESS] * 4
    assert {
        Opcode.RDMA_WRITE_LAST_IMM,
        Opcode.RELIABILITY_SACK,
        Opcode.RELIABILITY_NACK,
        Opcode.ENDPOINT_REQUEST,
    } <= kinds
    assert [sum(c.stats.bytes_sent) for c in net.conns] == sent
    assert [sum(c.stats.bytes_received) for c in net.conns] == taken
