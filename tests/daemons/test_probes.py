"""The endpoint's (QP 2) rules on their own: who gets an answer, with or without the port
bitmap, in which encoding, and how often (real codecs and AES-GCM; the network is a list)."""

from __future__ import annotations

import asyncio
import os

import pytest

from mrcstack.daemons.mrcd.control.auth import Credentials
from mrcstack.daemons.mrcd.datapath import probes
from mrcstack.daemons.mrcd.datapath.probes import ProbeAuth, Prober
from mrcstack.wire import (
    AeadIntegrity,
    CrcIntegrity,
    PortStatusPacket,
    ProbePacket,
    ProbeReplyPacket,
    decode,
    decode_plain,
    encode,
    encode_plain,
)

H0, H2 = ("::1", 1000), ("::1", 1002)  # the sources of host 0 (keyed) and host 2 (not)
BITS = 0b1011


def responder(sent: list[bytes], key: bytes) -> Prober:
    hosts = {H0: 0, H2: 2}
    p = Prober(
        asyncio.new_event_loop(),
        resolve=lambda host, plane, ev: ("::1", 2000 + host),
        host_of=lambda source, plane: hosts.get(source),
        send=lambda plane, data, dst: sent.append(data) is None,
        port_bits=lambda: BITS,
    )
    p.set_keys(3, {0: key})  # host 3 has a key for host 0 only
    return p


def test_sealed_probes_get_the_bitmap_crc_ones_do_not() -> None:
    key = os.urandom(32)
    sent: list[bytes] = []
    p = responder(sent, key)
    h0 = AeadIntegrity(key, 1, 4)  # host 0's side of the pair's key
    p.on_datagram(memoryview(encode(ProbePacket(2, 0x101, 1, 9, 77, 0, 5), h0)), H0, 1)
    reply = decode(sent[-1], h0)
    assert type(reply) is ProbeReplyPacket and reply.port_state == BITS
    assert reply.echo_ts_ns == 77 and reply.probe_id == 5 and reply.qpn == 2
    probe = ProbePacket(2, 0x101, 1, 10, 78, 0, 6)
    p.on_datagram(memoryview(encode(probe, CrcIntegrity())), H0, 1)
    reply = decode(sent[-1], CrcIntegrity())
    assert type(reply) is ProbeReplyPacket and reply.port_state == 0  # withheld
    assert reply.probe_id == 6
    assert p.answers == {ProbeAuth.SEALED: 1, ProbeAuth.ICRC: 1, ProbeAuth.ICRC_NO_KEY: 0}
    assert p.rejected == {}  # both answered: nothing refused


def test_a_host_without_a_key_is_answered_without_the_bitmap() -> None:
    """With the extension (an mrcd we share no key with) or without it (a peer without
    mrcstack): answered in its own encoding, the port bitmap withheld."""
    sent: list[bytes] = []
    p = responder(sent, os.urandom(32))
    probe = ProbePacket(2, 0x101, 1, 1, 5 << 10, 0, 7)
    p.on_datagram(memoryview(encode(probe, CrcIntegrity())), H2, 1)
    reply = decode(sent[-1], CrcIntegrity())
    assert type(reply) is ProbeReplyPacket and reply.probe_id == 7 and reply.port_state == 0
    p.on_datagram(memoryview(encode_plain(probe, CrcIntegrity())), H2, 1, 0)
    reply = decode_plain(sent[-1], CrcIntegrity())
    assert type(reply) is ProbeReplyPacket and reply.probe_id == 7
    assert reply.echo_ts_ns == 5 << 10  # the 16-bit timestamp, echoed
    assert p.answers[ProbeAuth.ICRC_NO_KEY] == 2 and p.rejected == {}


def test_every_answer_counts_by_authentication_and_none_as_a_rejection() -> None:
    """A sealed probe, a CRC-only one from a host we share a key with (as a QP's own EV
    probes come) and one from a host we share no key with: each answered and counted under
    its own label; a refused one (no host on that plane) under the rejections only."""
    key = os.urandom(32)
    sent: list[bytes] = []
    p = responder(sent, key)
    h0, crc = AeadIntegrity(key, 1, 4), CrcIntegrity()
    for integrity, source, auth in (
        (h0, H0, ProbeAuth.SEALED),
        (crc, H0, ProbeAuth.ICRC),
        (crc, H2, ProbeAuth.ICRC_NO_KEY),
    ):
        before = dict(p.answers)
        probe = ProbePacket(2, 0x101, 1, 20 + len(sent), 5, 0, len(sent))
        p.on_datagram(memoryview(encode(probe, integrity)), source, 1)
        assert {a: n - before[a] for a, n in p.answers.items()} == {
            a: int(a is auth) for a in ProbeAuth
        }
        assert p.rejected == {}
    assert len(sent) == 3
    p.on_datagram(memoryview(encode(ProbePacket(2, 0x101, 1, 30, 5), crc)), ("::1", 9), 1)
    assert p.rejected == {probes.PROBE_SOURCE: 1} and sum(p.answers.values()) == 3
    assert len(sent) == 3


def test_each_source_has_a_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst, then nothing until the bucket refills (the clock stands still here)."""
    monkeypatch.setattr(probes.time, "monotonic", lambda: 100.0)
    key = os.urandom(32)
    sent: list[bytes] = []
    p = responder(sent, key)
    h0 = AeadIntegrity(key, 1, 4)
    n = int(probes.PROBE_BURST) + 20
    for i in range(n):
        p.on_datagram(memoryview(encode(ProbePacket(2, 0x101, 1, 100 + i, 5), h0)), H0, 1)
    refused = p.rejected.get(probes.PROBE_RATE_LIMITED, 0)
    assert refused == 20 and len(sent) == n - refused == p.answers[ProbeAuth.SEALED]


def test_both_ends_derive_the_same_probe_key() -> None:
    psk = os.urandom(32)
    assert Credentials.from_psk("h0", psk).probe_key("h3") == Credentials.from_psk(
        "h3", psk
    ).probe_key("h0")
    assert Credentials.from_psk("h0", psk).probe_key("h3") != Credentials.from_psk(
        "h0", psk
    ).probe_key("h2")


def test_port_status_updates_over_the_fabric() -> None:
    """Sent on every plane up, two paths each, sealed; the peer applies the first copy of
    the newest update only, and none that is not sealed with the pair's key."""
    key = os.urandom(32)
    sent: list[bytes] = []
    applied: list[tuple[int, int]] = []
    p = responder(sent, key)
    p.on_port_status = lambda host, bits: applied.append((host, bits))
    h0 = AeadIntegrity(key, 1, 4)
    crc = CrcIntegrity()
    assert p.send_port_status(0, 0b0101, [0, 2], t1s=4) == 4
    updates = [decode(d, h0) for d in sent]  # sealed for host 0
    assert all(type(u) is PortStatusPacket and u.port_state == 0b0101 for u in updates)
    assert sorted((u.port, u.ev) for u in updates) == [  # type: ignore[union-attr]
        (0, 0x000),
        (0, 0x001),
        (2, 0x200),
        (2, 0x201),
    ]
    seq = 100
    for when, bits in ((10, 0b1110), (10, 0b1110), (9, 0b0001), (11, 0b1111)):
        for plane in (1, 3):  # copies on two planes: one update, one timestamp
            seq += 1
            pkt = PortStatusPacket(2, bits, plane << 8, plane, seq, when)
            p.on_datagram(memoryview(encode(pkt, h0)), H0, plane)
    assert applied == [(0, 0b1110), (0, 0b1111)]  # once each, the stale one dropped
    forged = PortStatusPacket(2, 0, 0x100, 1, 999, 99)
    p.on_datagram(memoryview(encode(forged, CrcIntegrity())), H0, 1)
    assert applied[-1] == (0, 0b1111)
    assert p.rejected == {probes.PORT_STATUS_UNAUTHENTICATED: 1}  # refused: not applied
    # A peer without mrcstack (no key, no extension): applied as it comes.
    p.on_datagram(memoryview(encode_plain(PortStatusPacket(2, 0b0110, 0, 1, 0, 5), crc)), H2, 1)
    assert applied[-1] == (2, 0b0110)
    assert p.send_port_status(2, 0b0011, [1], t1s=4, plain=True) == 2
    update = decode_plain(sent[-1], crc)
    assert type(update) is PortStatusPacket and update.port_state == 0b0011


def test_a_workers_prober_answers_crc_probes_and_relays_the_rest_as_they_came() -> None:
    """A data-path worker's prober (``relay`` set) answers the EV probes with the ICRC,
    from a host we share a key with or not, in either encoding, and counts them; a sealed
    probe (its answer carries the daemon's port bitmap), a port status update and an
    answer go to the relay untouched, unanswered and uncounted."""
    key = os.urandom(32)
    sent: list[bytes] = []
    relayed: list[tuple[bytes, tuple[str, int], int, int]] = []
    p = responder(sent, key)
    p.relay = lambda data, source, plane, flow: relayed.append((bytes(data), source, plane, flow))
    crc, h0 = CrcIntegrity(), AeadIntegrity(key, 1, 4)
    p.on_datagram(memoryview(encode(ProbePacket(2, 0x101, 1, 1, 77, 0, 5), crc)), H0, 1)
    p.on_datagram(memoryview(encode(ProbePacket(2, 0x101, 1, 2, 78, 0, 6), crc)), H2, 1)
    p.on_datagram(memoryview(encode_plain(ProbePacket(2, 0x101, 1, 3, 79, 0, 7), crc)), H2, 1)
    assert [decode(d, crc).probe_id for d in sent[:2]] == [5, 6]  # type: ignore[union-attr]
    assert decode_plain(sent[2], crc).probe_id == 7  # type: ignore[union-attr]
    assert p.answers == {ProbeAuth.SEALED: 0, ProbeAuth.ICRC: 1, ProbeAuth.ICRC_NO_KEY: 2}
    assert relayed == []
    others = [
        encode(ProbePacket(2, 0x101, 1, 4, 80, 0, 8), h0),  # sealed
        encode(PortStatusPacket(2, 0b0110, 0x100, 1, 5, 9), crc),
        encode_plain(PortStatusPacket(2, 0b0110, 0, 1, 0, 5), crc),
        encode(ProbeReplyPacket(2, 0x101, 1, 6, 9, 81, 0), crc),
    ]
    for i, data in enumerate(others):
        p.on_datagram(memoryview(data), H0, 1, i)
    assert relayed == [(data, H0, 1, i) for i, data in enumerate(others)]
    assert len(sent) == 3 and p.answers[ProbeAuth.SEALED] == 0 and p.rejected == {}
    # An answer whose ICRC fails stops here, counted: junk does not cross to the daemon.
    damaged = bytearray(others[-1])
    damaged[-1] ^= 0xFF
    p.on_datagram(memoryview(damaged), H0, 1)
    assert len(relayed) == len(others) and sum(p.rejected.values()) == 1


def test_a_probe_sealed_with_another_key_is_refused_unanswered() -> None:
    """Its extension flags an AES-GCM tag: opened with the pair's key only (not retried as
    a CRC packet), refused with the decode's reason, and not answered."""
    key = os.urandom(32)
    sent: list[bytes] = []
    p = responder(sent, key)
    forged = encode(ProbePacket(2, 0x101, 1, 9, 77, 0, 5), AeadIntegrity(os.urandom(32), 1, 4))
    p.on_datagram(memoryview(forged), H0, 1)
    assert sent == []
    assert sum(p.rejected.values()) == 1
    assert not set(p.rejected) & set(probes.REASONS)  # a decode reason, not the prober's


def test_who_sent_it_and_the_way_back_are_worked_out_once_per_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """host_of and resolve are pure and slow (address parsing): asked once per source and
    per path, in tables that a flood of spoofed sources cannot grow past MAX_SOURCES."""
    monkeypatch.setattr(probes, "MAX_SOURCES", 8)
    asked: list[str] = []
    sent: list[bytes] = []
    p = Prober(
        asyncio.new_event_loop(),
        resolve=lambda host, plane, ev: asked.append("resolve") or ("::1", 2000 + ev),
        host_of=lambda source, plane: asked.append("host_of") or 2,
        send=lambda plane, data, dst: sent.append(data) is None,
        port_bits=lambda: BITS,
    )
    crc = CrcIntegrity()
    for i in range(30):
        p.on_datagram(memoryview(encode(ProbePacket(2, 0x101, 1, i, 5, 0, i), crc)), H2, 1)
    assert asked == ["host_of", "resolve"] and len(sent) == 30
    assert {decode(d, crc).probe_id for d in sent} == set(range(30))  # type: ignore[union-attr]
    asked.clear()
    for i in range(20):  # 20 sources, 20 EVs
        probe = ProbePacket(2, 0x120 + i, 1, 100 + i, 5, 0, i)
        p.on_datagram(memoryview(encode(probe, crc)), ("::1", 3000 + i), 1)
    assert asked.count("host_of") == 20 and asked.count("resolve") == 20
    assert len(p._hosts) <= 8 and len(p._dsts) <= 8
