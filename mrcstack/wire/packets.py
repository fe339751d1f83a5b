"""MRC packets as frozen dataclasses, and their RoCEv2-framed wire layout.

Every packet is the payload of a UDP datagram to port 4791 (RoCEv2), so Wireshark/tshark
decode the InfiniBand BTH and RETH without options.  ``docs/wire-format.md`` documents every
field and why it is there.  Layout (all big-endian):

Data (RDMA WRITE ONLY 0x0A, or WRITE ONLY WITH IMMEDIATE 0x0B on a message's last packet)::

    BTH   12  opcode u8 | flags u8 (0) | pkey u16 (0xffff) | resv u8 | destqp u24 |
              ackreq u8 | psn u24
    RETH  16  va u64 | rkey u32 | dma_len u32 (this packet's payload length)
    ImmDt  4  only for opcode 0x0B
    MRCX  28  ver u8 | flags u8 | port u8 | rsvd u8 | ev u32 | tx_seq u64 | ts_ns u64 |
              hdr_check u32
    payload
    trailer   4-byte CRC32 (ICRC-like), or 16-byte AES-GCM tag when the connection has a key

A switch that trims a data packet cuts it to exactly its headers (BTH..MRCX: 56 or 60 bytes,
no payload, no trailer) and sets ``DataFlags.TRIMMED`` (plus ``TRIM_LASTHOP`` on a port facing
a host) in the MRCX flags byte.  ``hdr_check`` (CRC32 of the headers with ``hdr_check`` zeroed
and the switch-writable flag bits cleared) lets the receiver trust a trimmed header.

Feedback (ACK / NACK: opcode ACKNOWLEDGE 0x11; probe reply: 0xC1)::

    BTH   12  psn = cumulative ACK PSN (every PSN up to and including it was received)
    AETH   4  syndrome u8 (0x1f ACK, 0x60|code NAK) | msn u24 (messages completed)   [0x11 only]
    MRCF  52  ver u8 | flags u8 | port u8 | nack_reason u8 | ev u32 | tx_seq u64 |
              echo_ev u32 | echo_psn u32 | echo_ts_ns u64 | sack_base u32 |
              port_state u16 | rsvd u16 | sack_bitmap u64 | hdr_check u32
    trailer

Probe (opcode 0xC0, from the manufacturer-specific range)::

    BTH 12 | MRCX 28 (flags has PROBE) | trailer
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

ROCEV2_UDP_PORT = 4791
PSN_BITS = 24
PSN_MOD = 1 << PSN_BITS
PSN_MASK = PSN_MOD - 1
MRC_EXT_VERSION = 1


class Opcode(enum.IntEnum):
    """BTH opcodes (IBTA RC opcodes; 0xC0-0xC1 are manufacturer-specific)."""

    RDMA_WRITE_ONLY = 0x0A
    RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0B
    ACKNOWLEDGE = 0x11
    MRC_PROBE = 0xC0
    MRC_PROBE_REPLY = 0xC1


class DataFlags(enum.IntFlag):
    """Flags byte of the MRC data/probe extension."""

    RETX = 0x01  # a retransmission
    LAST = 0x02  # last packet of a message (work request)
    PROBE = 0x04  # an EV probe
    TRIMMED = 0x40  # set by a switch that cut the payload
    TRIM_LASTHOP = 0x80  # set by a switch that trimmed on a host-facing port


#: Flag bits a switch may set in flight; excluded from every integrity check.
SWITCH_FLAGS = DataFlags.TRIMMED | DataFlags.TRIM_LASTHOP


class FeedbackFlags(enum.IntFlag):
    """Flags byte of the MRC feedback extension."""

    ECN_ECHO = 0x01  # the triggering data packet arrived ECN-marked (CE)
    DUPLICATE = 0x02  # the triggering data packet had already arrived (like TCP's DSACK)


class NackReason(enum.IntEnum):
    """NACK reason codes: UET's values where UET defines one, mrcstack's own at 0xE0 and up."""

    TRIMMED = 0x01
    TRIMMED_LASTHOP = 0x02
    NO_BITMAP = 0x06
    NO_PKT_BUFFER = 0x07
    NO_RESOURCE = 0x0A
    PSN_OOR_WINDOW = 0x0B
    UNEXP_EVENT = 0x19
    REMOTE_ACCESS = 0xE0  # rkey / range / permission mismatch: never retried
    SEQ_ERROR = 0xE1  # RoCE-like mode: out-of-order packet discarded (go-back-N)


AETH_ACK = 0x1F  # ACK syndrome with "no credit" (unlimited)
AETH_NAK_SEQ = 0x60  # NAK: PSN sequence error (retry)
AETH_NAK_ACCESS = 0x62  # NAK: remote access error (fatal to the work request)


@dataclass(frozen=True, slots=True)
class DataPacket:
    """One RDMA WRITE packet; carries a full RETH so it can be placed on arrival."""

    qpn: int
    psn: int
    va: int
    rkey: int
    payload: bytes | memoryview
    ev: int
    port: int
    tx_seq: int
    ts_ns: int
    flags: int = 0
    imm: int | None = None
    dma_len: int = -1  # decoded RETH length; on encode, len(payload) is used

    @property
    def trimmed(self) -> bool:
        return bool(self.flags & DataFlags.TRIMMED)


@dataclass(frozen=True, slots=True)
class AckPacket:
    """ACK (nack_reason == 0) or NACK: cumulative PSN, SACK bitmap, echoes, port state."""

    qpn: int
    cum_psn: int
    msn: int
    ev: int
    port: int
    tx_seq: int
    echo_ev: int
    echo_psn: int
    echo_ts_ns: int
    sack_base: int
    sack_bitmap: int
    port_state: int
    flags: int = 0
    nack_reason: int = 0


@dataclass(frozen=True, slots=True)
class ProbePacket:
    """An EV probe: tests one path to the peer; answered by a ProbeReplyPacket."""

    qpn: int
    ev: int
    port: int
    tx_seq: int
    ts_ns: int


@dataclass(frozen=True, slots=True)
class ProbeReplyPacket:
    """Answer to a probe, echoing its EV and timestamp; carries the replier's port state."""

    qpn: int
    ev: int
    port: int
    tx_seq: int
    echo_ev: int
    echo_ts_ns: int
    port_state: int


Packet = DataPacket | AckPacket | ProbePacket | ProbeReplyPacket
