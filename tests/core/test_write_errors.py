"""RDMA semantics after an error, in the core: a write is checked as a whole, the error goes
to the write that caused it, and nothing posted after it lands.

Two connections over the virtual link (tests/support/pairnet.py), 256-byte packets.  The
order in which a write's packets arrive is forced: the sender's datagrams are captured and
handed to the receiver in a chosen order, as a fabric spraying them over paths of different
delays would.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from mrcstack.core.events import ConnectionFailed, Event, SendCompleted, WcStatus
from mrcstack.wire import (
    WRITE_OPCODES,
    CrcIntegrity,
    DataFlags,
    DataPacket,
    NackReason,
    decode,
    encode,
)
from tests.support.pairnet import LinkFaults, PairNet
from tests.support.wire import data_packets

MTU = 256
REGION = 64 * MTU
CRC = CrcIntegrity()


def pair(seed: int, faults: LinkFaults | None = None) -> tuple[PairNet, bytearray, int, int]:
    """A pair, and the receiver's region (its buffer, va, rkey)."""
    net = PairNet(seed, faults or LinkFaults(), mtu=MTU)
    buf = bytearray(REGION)
    mr = net.mem[1].register(buf)
    return net, buf, mr.va, mr.rkey


def send_now(net: PairNet) -> list[bytes]:
    """The writes' datagrams the sender hands out now (its window holds them all)."""
    return [d.data for d in net.conns[0].datagrams_to_send(net.now) if d.data[0] in WRITE_OPCODES]


def deliver(net: PairNet, datagrams: list[bytes]) -> None:
    for data in datagrams:
        net.conns[1].receive_datagram(data, now=net.now, port=decode(data, CRC).port)


def completions(events: list[Event]) -> dict[int, WcStatus]:
    return {e.wr_id: e.status for e in events if isinstance(e, SendCompleted)}


def failure(events: list[Event]) -> ConnectionFailed:
    [failed] = [e for e in events if isinstance(e, ConnectionFailed)]
    return failed


@pytest.mark.parametrize("order", range(24))
def test_a_write_past_the_regions_end_places_nothing_in_any_order(order: int) -> None:
    """8 packets, the last one past the end: whichever arrives first refuses the write."""
    net, buf, va, rkey = pair(order)
    net.conns[0].post_write(7, os.urandom(8 * MTU), va + REGION - 7 * MTU, rkey, now=0.0)
    datagrams = send_now(net)
    assert len(datagrams) == 8
    random.Random(order).shuffle(datagrams)
    if order == 0:
        datagrams.reverse()  # the one in range first, sorted
    deliver(net, datagrams)
    net.run(1.0)
    assert buf == bytearray(REGION)  # not a byte of it
    assert completions(net.events[0]) == {7: WcStatus.REMOTE_ACCESS_ERROR}
    sender = failure(net.events[0])
    assert sender.wr_id == 7 and "remote access error" in sender.reason
    receiver = failure(net.events[1])  # told its QP failed, and why
    assert "refused the peer's write of 2048 bytes" in receiver.reason
    assert f"outside rkey {rkey:#x}" in receiver.reason and receiver.wr_id is None


@pytest.mark.parametrize("seed", range(10))
def test_the_error_goes_to_the_write_that_caused_it(seed: int) -> None:
    """A good 16-packet write, a bad one, a good one, in one batch, their packets reordered
    at random: the first succeeds, the second fails, the third is flushed and did not land."""
    net, buf, va, rkey = pair(seed, LinkFaults(reorder=50e-6, delay=5e-6))
    first, last = os.urandom(16 * MTU), os.urandom(4 * MTU)
    a = net.conns[0]
    a.post_write(1, first, va, rkey, now=0.0)
    a.post_write(2, bytes(2 * MTU), va + REGION - MTU, rkey, now=0.0)  # half past the end
    a.post_write(3, last, va + 32 * MTU, rkey, imm=9, now=0.0)
    net.run(1.0)
    assert completions(net.events[0]) == {
        1: WcStatus.SUCCESS,
        2: WcStatus.REMOTE_ACCESS_ERROR,
        3: WcStatus.FLUSHED,
    }
    assert buf[: 16 * MTU] == first
    assert buf[16 * MTU :] == bytearray(REGION - 16 * MTU)  # the flushed write: nothing
    assert failure(net.events[0]).wr_id == 2
    assert not any(e for e in net.events[1] if type(e).__name__ == "WriteImmReceived")


@pytest.mark.parametrize("seed", range(6))
def test_writes_behind_a_refused_one_never_land(seed: int) -> None:
    """Four writes behind the bad one, every packet of theirs delivered before any packet
    of the bad write: they wait unplaced, and are dropped when it is refused."""
    net, buf, va, rkey = pair(seed)
    a = net.conns[0]
    a.post_write(1, bytes(range(256)) * 2, va, rkey, now=0.0)  # good, 2 packets
    a.post_write(2, bytes(3 * MTU), va + REGION - 2 * MTU, rkey, now=0.0)  # bad
    for i in range(4):
        a.post_write(3 + i, os.urandom(4 * MTU), va + (8 + 4 * i) * MTU, rkey, now=0.0)
    datagrams = send_now(net)
    good, bad, behind = datagrams[:2], datagrams[2:5], datagrams[5:]
    random.Random(seed).shuffle(behind)
    deliver(net, behind)  # acknowledged, but not placed: the writes before are unchecked
    assert buf == bytearray(REGION)
    deliver(net, good)
    assert buf[: 2 * MTU] == bytes(range(256)) * 2 and buf[2 * MTU :] == bytearray(REGION - 512)
    deliver(net, bad[seed % 3 :] + bad[: seed % 3])
    net.run(1.0)
    assert buf[2 * MTU :] == bytearray(REGION - 2 * MTU)
    assert completions(net.events[0]) == {
        1: WcStatus.SUCCESS,
        2: WcStatus.REMOTE_ACCESS_ERROR,
        **{3 + i: WcStatus.FLUSHED for i in range(4)},
    }


def test_packets_of_a_later_write_wait_for_the_earlier_ones_and_then_land() -> None:
    net, buf, va, rkey = pair(3)
    a = net.conns[0]
    one, two = os.urandom(3 * MTU), os.urandom(2 * MTU)
    a.post_write(1, one, va, rkey, now=0.0)
    a.post_write(2, two, va + 8 * MTU, rkey, imm=5, now=0.0)
    datagrams = send_now(net)
    deliver(net, datagrams[3:])  # write 2 first
    assert buf == bytearray(REGION)  # it waits: write 1 is not checked yet
    deliver(net, datagrams[2:3])  # any packet of write 1 checks all of it
    assert buf[8 * MTU : 10 * MTU] == two and buf[2 * MTU : 3 * MTU] == one[2 * MTU :]
    deliver(net, datagrams[:2])
    assert buf[: 3 * MTU] == one
    net.run(1.0)
    assert completions(net.events[0]) == {1: WcStatus.SUCCESS, 2: WcStatus.SUCCESS}


def forged(net: PairNet, psn_ahead: int, **fields: object) -> bytes:
    """A write packet to the receiver ``psn_ahead`` packets past what it expects."""
    b = net.conns[1]
    pkt = DataPacket(
        qpn=b.cfg.local_qpn, psn=(b.receiver.rcv_nxt + psn_ahead) & 0xFFFFFF, va=0, rkey=0,
        payload=bytes(MTU), ev=0, port=0, tx_seq=1, ts_ns=1, flags=int(DataFlags.FIRST),
        dma_len=4 * MTU,
    )  # fmt: skip
    for name, value in fields.items():
        setattr(pkt, name, value)
    return encode(pkt, CRC)


WINDOW = PairNet(0, LinkFaults()).conns[1].cfg.max_window


@pytest.mark.parametrize(
    ("ahead", "fields", "nacks", "words"),
    [
        (0, {"offset": 10, "flags": 0}, [NackReason.INVALID_REQUEST], "packet boundary"),
        (WINDOW, {}, [NackReason.PSN_OOR_WINDOW], "ahead of a window"),
        (1 << 16, {}, [], "ahead of a window"),  # too far for SETH to name: no NACK at all
    ],
)
def test_a_malformed_write_or_one_out_of_the_window_is_refused(
    ahead: int, fields: dict[str, object], nacks: list[NackReason], words: str
) -> None:
    net, buf, va, rkey = pair(5)
    b = net.conns[1]
    b.receive_datagram(forged(net, ahead, va=va, rkey=rkey, **fields), now=0.0, port=0)
    sent = [decode(d.data, CRC).nack_reason for d in b.datagrams_to_send(0.0)]  # type: ignore[union-attr]
    assert sent == nacks
    assert words in failure(net.events[1] + list(iter(b.next_event, None))).reason
    assert buf == bytearray(REGION)


@st.composite
def hostile_writes(draw: st.DrawFn, rcv_nxt: int, va: int, rkey: int) -> list[bytes]:
    """Well-formed write packets whose range fields say anything: near the receiver's PSN,
    around its region, with its rkey or another."""
    out = []
    for pkt in draw(st.lists(data_packets, min_size=1, max_size=12)):
        pkt.psn = (rcv_nxt + draw(st.integers(-4, 40))) & 0xFFFFFF
        pkt.rkey = draw(st.sampled_from([rkey, rkey, pkt.rkey]))
        pkt.va = draw(st.integers(max(0, va - 3 * MTU), va + REGION + MTU))
        pkt.payload = bytes(pkt.payload)[:MTU] or b"\xff"
        if not pkt.flags & DataFlags.FIRST and draw(st.booleans()):
            pkt.offset = MTU * draw(st.integers(0, 8))  # on a packet boundary: it may land
        end = pkt.offset + len(pkt.payload)
        pkt.dma_len = end if pkt.flags & DataFlags.LAST else max(pkt.dma_len, end)
        out.append(encode(pkt, CRC))
    return out


@settings(max_examples=int(os.environ.get("MRC_PROPERTY_CASES", "300")), deadline=None)
@given(data=st.data())
def test_hostile_range_fields_never_write_outside_the_region(data: st.DataObject) -> None:
    """Whatever the offsets, lengths, addresses and order: no exception, nothing written
    outside the region (it sits between two guard pages of the same buffer)."""
    net = PairNet(1, LinkFaults(), mtu=MTU)
    whole = bytearray(b"\xaa" * (REGION + 2 * 4096))
    view = memoryview(whole)[4096 : 4096 + REGION]
    mr = net.mem[1].register(view)
    b = net.conns[1]
    for wire in data.draw(hostile_writes(b.receiver.rcv_nxt, mr.va, mr.rkey)):
        b.receive_datagram(wire, now=0.0, port=0)
        b.datagrams_to_send(0.0)
    assert whole[:4096] == b"\xaa" * 4096 and whole[-4096:] == b"\xaa" * 4096
    event(f"placed {'some' if b.stats.data_bytes_placed else 'none'}")
