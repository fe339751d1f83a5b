"""A QP without mrcstack's extension (``ConnectionConfig.extensions`` off): two connections
speaking OCP MRC 1.0's encoding alone, over the faulty virtual link, each datagram's EV and
traffic class beside it as its outer header carries them.

What the extension would say is worked out: a middle packet's place from its write's other
packets (:mod:`mrcstack.core.plainrx`), RTT samples from the 16-bit timestamps, trims from
the traffic class; answers to probes by their probe id.
"""

from __future__ import annotations

import os

import pytest

from mrcstack.core.config import ConnectionConfig
from mrcstack.core.connection import Connection
from mrcstack.core.events import SendCompleted, WcStatus, WriteImmReceived
from mrcstack.core.evs import EvEntry
from mrcstack.core.memory import MemoryTable
from mrcstack.core.plainrx import MAX_HELD, widen
from mrcstack.errors import ConfigError
from mrcstack.wire import (
    AcknowledgePacket,
    CrcIntegrity,
    DataFlags,
    DataPacket,
    decode_plain,
    encode_plain,
)
from tests.support.pairnet import LinkFaults, PairNet

GUARD = 64


def region(net: PairNet, side: int, size: int) -> tuple[bytearray, int, int]:
    backing = bytearray(b"\xee" * (size + 2 * GUARD))
    mr = net.mem[side].register(memoryview(backing)[GUARD : GUARD + size])
    return backing, mr.va, mr.rkey


def sends(net: PairNet, side: int = 0) -> list[SendCompleted]:
    return [e for e in net.events[side] if isinstance(e, SendCompleted)]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_writes_land_intact_under_loss_reordering_duplicates_and_trims(seed: int) -> None:
    """Both directions, many writes of every shape (one packet, many, with immediates),
    over a link that loses, reorders (so middle packets arrive before their write's first),
    duplicates and trims."""
    faults = LinkFaults(loss=0.03, dup=0.02, reorder=60e-6, trim=0.03, ecn=0.02)
    net = PairNet(seed, faults, extensions=False)
    rng = os.urandom
    sizes = [1, 255, 256, 257, 3000, 10_000, 40_000]
    backs = [region(net, side, sum(sizes)) for side in (0, 1)]
    sent: list[bytes] = []
    for side in (0, 1):
        _, va, rkey = backs[1 - side]
        at = 0
        for i, size in enumerate(sizes):
            data = rng(size)
            sent.append(data)
            imm = i if i % 2 else None
            net.conns[side].post_write(i, data, va + at, rkey, imm=imm, now=0.0)
            at += size
    net.run(20.0, stop=lambda: len(sends(net, 0)) == len(sends(net, 1)) == len(sizes))
    for side in (0, 1):
        assert [s.status for s in sends(net, side)] == [WcStatus.SUCCESS] * len(sizes)
        backing = backs[1 - side][0]
        at = GUARD
        for data in sent[side * len(sizes) : (side + 1) * len(sizes)]:
            assert backing[at : at + len(data)] == data
            at += len(data)
        assert backing[:GUARD] == b"\xee" * GUARD and backing[at:] == b"\xee" * GUARD
        imms = [e.imm for e in net.events[1 - side] if isinstance(e, WriteImmReceived)]
        assert imms == [i for i in range(len(sizes)) if i % 2]
        conn = net.conns[side]
        assert conn.recovery.srtt is not None  # RTT samples from 16-bit timestamps
        assert (
            conn.stats.nacks_received.get("trimmed", 0)
            + conn.stats.nacks_received.get("trimmed_lasthop", 0)
            > 0
        )  # trims recognised by their traffic class, and NACKed
        assert net.conns[1 - side].stats.trims_received > 0


def test_middle_packets_before_their_first_wait_and_land() -> None:
    """A middle packet that arrives before any packet telling where its write lies waits
    (the write is checked as a whole from its first or last packet), then lands."""
    crc = CrcIntegrity(ev_ports=True)
    cfg = dict(planes=1, evs=(EvEntry(0x10001, 0),), mtu_payload=100, extensions=False)
    rx_mem = MemoryTable()
    backing = bytearray(300)
    mr = rx_mem.register(backing)
    rx = Connection(
        ConnectionConfig(local_qpn=5, remote_qpn=6, remote_psn=1000, **cfg),  # type: ignore[arg-type]
        memory=rx_mem, rng=__import__("random").Random(0), now=0.0,
    )  # fmt: skip
    parts = [b"A" * 100, b"B" * 100, b"C" * 100]
    flags = [DataFlags.FIRST, 0, DataFlags.LAST]
    wires = [
        encode_plain(
            DataPacket(
                5,
                1000 + i,
                mr.va + 100 * i,
                mr.rkey,
                parts[i],
                0x10001,
                0,
                0,
                7 << 10,
                flags[i],
                None,
                300,
                0,
                100 * i,
            ),
            crc,
        )
        for i in range(3)
    ]
    assert decode_plain(wires[1], crc, ev=0x10001).offset == -1  # the spec says not where
    rx.receive_datagram(wires[1], now=0.0, port=0, ev=0x10001)
    assert backing == bytes(300)  # held: its write is not known yet
    assert not rx.datagrams_to_send(0.0)  # nor acknowledged
    rx.receive_datagram(wires[2], now=0.0, port=0, ev=0x10001)  # the last tells where
    rx.receive_datagram(wires[0], now=0.0, port=0, ev=0x10001)
    assert backing == b"".join(parts)
    assert len(rx.datagrams_to_send(0.0)) == 3


def test_a_refused_write_places_nothing_even_middle_packets() -> None:
    """The write's range leaves the region: its last packet tells so, and the middle one
    that waited for it is dropped with the rest."""
    net = PairNet(5, LinkFaults(reorder=50e-6), extensions=False, mtu=256)
    backing, va, rkey = region(net, 1, 1000)
    before = bytes(backing)
    net.conns[0].post_write(1, b"X" * 2000, va, rkey, now=0.0)  # 2000 > 1000
    net.run(2.0, stop=lambda: bool(sends(net)))
    assert sends(net)[0].status is WcStatus.REMOTE_ACCESS_ERROR
    assert bytes(backing) == before


def test_widen_recovers_the_send_time_across_the_16_bit_wrap() -> None:
    for now_ns in (5 << 10, 70_000_000, 70_000_000 + (1 << 26) - 1000, 10**12):
        for age_ns in (0, 1024, 30_000_000, 60_000_000):
            sent = now_ns - age_ns
            echo = ((sent >> 10) & 0xFFFF) << 10
            got = widen(echo, now_ns / 1e9)
            assert 0 <= sent - got < 2048 or (echo == 0 and got == 0), (now_ns, age_ns)


def test_an_acknowledge_completes_writes_cumulatively() -> None:
    """A spec peer may acknowledge with 0xD1 (IBTA AETH) instead of SACKs."""
    net = PairNet(6, LinkFaults(loss=1.0), extensions=False, psns=(100, 200))
    net.conns[0].post_write(1, b"a" * 300, 0x1000, 5, now=0.0)  # two packets (MTU 256)
    net.kick()
    ack = AcknowledgePacket(10, 101, 0x1F, 1)
    net.conns[0].receive_datagram(encode_plain(ack, CrcIntegrity(ev_ports=True)), now=1e-4,
                                  port=0)  # fmt: skip
    net.kick()
    assert sends(net) == [SendCompleted(1, WcStatus.SUCCESS, 300)]
    nak = AcknowledgePacket(10, 102, 0x62, 1)  # a remote access NAK of the next write
    net.conns[0].post_write(2, b"b" * 10, 0x1000, 5, now=2e-4)
    net.kick()
    net.conns[0].receive_datagram(encode_plain(nak, CrcIntegrity(ev_ports=True)), now=3e-4,
                                  port=0)  # fmt: skip
    net.kick()
    assert sends(net)[-1].status is WcStatus.REMOTE_ACCESS_ERROR


def test_ev_probes_bring_a_path_back_by_probe_id() -> None:
    """A blacked-out path is demoted; once it works again the endpoint's answers (matched by
    the probe id, the timestamp widened) resurrect it while the write goes on."""
    faults = LinkFaults(blackouts=[(0.0, 0.003, 0x001)])
    net = PairNet(7, faults, extensions=False, timeout=1e-3)
    size = 16 << 20  # longer than the blackout
    _, va, rkey = region(net, 1, size)
    net.conns[0].post_write(1, os.urandom(size), va, rkey, now=0.0)
    states: set[str] = set()
    while not sends(net) and net.now < 5.0:
        net.run(net.now + 2e-4, stop=lambda: bool(sends(net)))
        states.add({s.value: s.state.value for s in net.conns[0].ev_states()}[0x001])
    assert [s.status for s in sends(net)] == [WcStatus.SUCCESS]
    conn = net.conns[0]
    assert "assumed_bad" in states and conn.stats.probe_replies > 0
    assert {s.value: s.state.value for s in conn.ev_states()}[0x001] != "assumed_bad"


def test_aes_gcm_needs_the_extension() -> None:
    with pytest.raises(ConfigError, match="extension"):
        ConnectionConfig(
            local_qpn=1, remote_qpn=3, planes=1, evs=(EvEntry(1, 0),), key=bytes(16),
            extensions=False,
        )  # fmt: skip


def test_no_room_to_wait_drops_unacknowledged() -> None:
    assert MAX_HELD >= 1024  # a window of middle packets fits in ordinary reordering
