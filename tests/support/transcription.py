"""The public transcription of OCP MRC 1.0 (anichol67/MRC-Client) as test data: byte vectors
its builder produced, and what its parser made of mrcstack's packets.

``tests/wire/data/make_transcription_vectors.py`` runs the transcription's own builder and
parser (from a copy of its repository, outside mrcstack) and writes
``tests/wire/data/transcription_vectors.json``; the tests read that file, so they do not need
the transcription at all.  Its known departures from RoCEv2 are corrected in every vector and
nothing else is changed: the P_Key (it sends 0x0000; RoCEv2's default partition is 0xFFFF),
the trailer (it appends a bitwise CRC-32C of the UDP payload; RoCEv2's ICRC is the CRC32 of
the invariant fields, least significant byte first) and the UDP destination port (4971, a
typo of RoCEv2's 4791).

The other direction: :data:`MRCSTACK_PACKETS` are packets mrcstack encodes without its
extension (``encode_plain``), one per packet type; the transcription's parser read each in an
Ethernet/IPv6/UDP frame made by :func:`frame`, and what it returned is recorded beside the
bytes it read.
"""

from __future__ import annotations

import ipaddress
import json
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrcstack.wire import (
    AcknowledgePacket,
    AckPacket,
    DataFlags,
    DataPacket,
    FeedbackFlags,
    NackReason,
    Packet,
    PortStatusPacket,
    ProbePacket,
    ProbeReplyPacket,
    ReliabilityProbePacket,
    SkipHint,
)
from tests.support import REPO

VECTORS = REPO / "tests" / "wire" / "data" / "transcription_vectors.json"
SOURCE = "https://github.com/anichol67/MRC-Client"
SRC, DST = "fd00:0:0:1::1", "fd00:0:0:2::1"
ROCEV2_PORT = 4791
_F, _L = DataFlags.FIRST, DataFlags.LAST


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(VECTORS).read_text())
    return data


def icrc(udp_payload: bytes, src: str, dst: str, sport: int, dport: int = ROCEV2_PORT) -> bytes:
    """The RoCEv2 ICRC of a UDP payload without its trailer, from the annex's rules: 8 bytes
    of ones, the IPv6 header with traffic class, flow label and hop limit as ones, the UDP
    header with its checksum as ones, BTH byte 4 as ones; CRC32, least significant byte
    first."""
    size = 8 + len(udp_payload) + 4
    ip = (
        b"\x6f\xff\xff\xff" + struct.pack(">HBB", size, 17, 0xFF)
        + ipaddress.IPv6Address(src).packed + ipaddress.IPv6Address(dst).packed
    )  # fmt: skip
    udp = struct.pack(">HHHH", sport, dport, size, 0xFFFF)
    bth = udp_payload[:4] + b"\xff" + udp_payload[5:]
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + ip + udp + bth))


def frame(udp_payload: bytes, sport: int, label: int, tclass: int = 0) -> bytes:
    """``udp_payload`` in an Ethernet/IPv6/UDP frame from SRC to DST (what the
    transcription's parser reads)."""
    udp = struct.pack(">HHHH", sport, ROCEV2_PORT, 8 + len(udp_payload), 0) + udp_payload
    ip = (
        struct.pack(">IHBB", 6 << 28 | tclass << 20 | label, len(udp), 17, 64)
        + ipaddress.IPv6Address(SRC).packed + ipaddress.IPv6Address(DST).packed
    )  # fmt: skip
    return bytes(6) + bytes(6) + b"\x86\xdd" + ip + udp


@dataclass(frozen=True)
class Ours:
    """One packet mrcstack sends to a spec-only peer, and the EV its outer header carries."""

    kind: str  # the packet type, as the transcription's parser names its opcode
    packet: Packet
    ev: int


EV = 0x0001_0203  # striped: UDP source port 0x0001, flow label 0x0203
MRCSTACK_PACKETS: tuple[Ours, ...] = (
    Ours("RDMA_WRITE_FIRST", DataPacket(0x1234, 100, 0x7F00_0000_1000, 0xA1B2C3D4, b"F" * 64,
         EV, 0, 0, 5 << 10, _F, None, 192, 7, 0), EV),
    Ours("RDMA_WRITE_MIDDLE", DataPacket(0x1234, 101, 0x7F00_0000_1040, 0xA1B2C3D4, b"M" * 64,
         EV, 0, 0, 6 << 10, 0, None, 192, 7, 64), EV),
    Ours("RDMA_WRITE_LAST", DataPacket(0x1234, 102, 0x7F00_0000_1080, 0xA1B2C3D4, b"L" * 64,
         EV, 0, 0, 7 << 10, _L | DataFlags.RETX, None, 192, 7, 128), EV),
    Ours("RDMA_WRITE_LAST_IMM", DataPacket(0x1234, 104, 0x7F00_0000_2040, 0xA1B2C3D4,
         b"l" * 32, EV, 0, 0, 8 << 10, _L, 0xCAFE0001, 96, 8, 64), EV),
    Ours("RDMA_WRITE_ONLY", DataPacket(0x1234, 105, 0x7F00_0000_3000, 0xA1B2C3D4, b"only",
         EV, 0, 0, 9 << 10, _F | _L, None, 4, 9, 0), EV),
    Ours("RDMA_WRITE_ONLY_IMM", DataPacket(0x1234, 106, 0x7F00_0000_4000, 0xA1B2C3D4, b"imm!",
         EV, 0, 0, 10 << 10, _F | _L, 0x01020304, 4, 10, 0), EV),
    Ours("ACKNOWLEDGE", AcknowledgePacket(0x1234, 106, 0x1F, 11, EV, 0), EV),
    Ours("ENDPOINT_REQUEST", ProbePacket(2, EV, 0, 0, 12 << 10, 0b11, 0x0102), EV),
    Ours("ENDPOINT_RESPONSE", ProbeReplyPacket(2, EV, 0, 0, 0x0102, 12 << 10, 0, 1), EV),
    Ours("RELIABILITY_SACK", AckPacket(
        qpn=0x1234, cum_psn=200, msn=0, ev=EV, port=0, tx_seq=0, echo_ev=0x0005_0607,
        echo_psn=203, echo_ts_ns=13 << 10, sack_base=202, sack_bitmap=0b1011, port_state=0,
        flags=FeedbackFlags.ECN_ECHO | FeedbackFlags.PROBE_RESPONSE,
        skip=SkipHint.ALWAYS_SKIP, ooo_count=3, rcv_bytes=0x12345, window=64 * 128,
        scid=0x4321), EV),
    Ours("RELIABILITY_NACK", AckPacket(
        qpn=0x1234, cum_psn=204, msn=0, ev=EV, port=0, tx_seq=0, echo_ev=0x0005_0608,
        echo_psn=204, echo_ts_ns=14 << 10, sack_base=204, sack_bitmap=0, port_state=0,
        nack_reason=NackReason.TRIMMED, window=0, scid=0x4321), EV),
    Ours("RELIABILITY_PROBE_REQ", ReliabilityProbePacket(0x1234, 0x0203, EV, 0, 0, 15 << 10,
         0x4321), EV),
    Ours("PORT_STATUS_UPDATE", PortStatusPacket(2, 0b01, EV, 0, 0, 16 << 10, 0x0104), EV),
)  # fmt: skip
