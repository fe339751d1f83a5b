"""MRC packets as frozen dataclasses, and their OCP MRC 1.0 wire layout.

Every packet is the payload of a UDP datagram to port 4791 (RoCEv2): a BTH, the MRC
extension headers of the OCP MRC 1.0 specification, optionally mrcstack's own extension
header (XETH on data and probes, XFETH on feedback: negotiated per QP) and a trailer.
``docs/wire-format.md`` is the conformance table: every field, its offset and width, its
source and our reading where the public record is ambiguous.  Layout (all big-endian)::

    write (0xC6-0xCB)  BTH 12 | METH 4 | [TSETH 4] | RETH 16 | [ImmDt 4] | [XETH 32] | payload
    SACK (0xDC)        BTH 12 | SETH 28 | CC_STATE 8 | [XFETH 36]
    NACK (0xDD)        BTH 12 | NETH 20 | [XFETH 36]
    EV probe (0xD8)    BTH 12 (QP 2, PSN = probe id) | ERTH 16 | [XETH 32]
    probe reply (0xD9) BTH 12 (QP 2, PSN = probe id) | EETH 36 | [XFETH 36]
    reliability probe  BTH 12 | PETH 16 | [XETH 32]                  (0xDE)
    ACKNOWLEDGE (0xD1) BTH 12 | AETH 4
    every packet       ... | trailer: the RoCEv2 ICRC (4), or an AES-GCM tag (16)

``mrcstack.wire.codec`` encodes the form with mrcstack's extension (``encode``/``decode``),
``mrcstack.wire.plain`` the specification's alone (``encode_plain``/``decode_plain``).

Packets are values: nothing changes one after it is built.  They are not declared frozen
because a frozen dataclass sets each field through ``object.__setattr__``, which made
building the two packets of every data exchange (a write, its ACK) cost more than the rest
of handling them in the simulator; they still compare and hash by value.

A switch that trims a write cuts it to its headers (68 or 72 bytes, no payload, no trailer)
and sets ``DataFlags.TRIMMED`` (plus ``TRIM_LASTHOP`` on a port facing a host) in the XETH
flags byte.  ``hdr_check`` (CRC32 of the headers with ``hdr_check`` zeroed and those two bits
clear) lets the receiver trust a trimmed header, which has lost its trailer.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

ROCEV2_UDP_PORT: Final = 4791
PSN_BITS: Final = 24
PSN_MOD: Final = 1 << PSN_BITS
PSN_MASK: Final = PSN_MOD - 1
#: Version byte of mrcstack's extension headers (XETH, XFETH): 1 was the pre-OCP framing, 2
#: had no write offset, 3 sat behind the pre-transcription positions of the OCP headers.
MRC_EXT_VERSION: Final = 4
#: Destination QP of the endpoint operations (EV probe, port status update) and their
#: answers, OCP MRC 1.0 section 7.4.7: not a connection; the probe id rides in PSN[15:0].
ENDPOINT_QPN: Final = 0x2
PROBE_ID_MASK: Final = 0xFFFF
#: PSN offsets in SETH (ACK PSN, SACK base) are signed 16-bit; MPR counts units of 128 PSNs.
PSN_OFFSET_MIN: Final = -(1 << 15)
PSN_OFFSET_MAX: Final = (1 << 15) - 1
MPR_UNIT: Final = 128
MAX_WINDOW: Final = 255 * MPR_UNIT  # the widest receive window MPR (8 bits) can state


class Opcode(enum.IntEnum):
    """BTH opcodes of OCP MRC 1.0."""

    RDMA_WRITE_FIRST = 0xC6
    RDMA_WRITE_MIDDLE = 0xC7
    RDMA_WRITE_LAST = 0xC8
    RDMA_WRITE_LAST_IMM = 0xC9
    RDMA_WRITE_ONLY = 0xCA
    RDMA_WRITE_ONLY_IMM = 0xCB
    ACKNOWLEDGE = 0xD1
    ENDPOINT_REQUEST = 0xD8
    ENDPOINT_RESPONSE = 0xD9
    RELIABILITY_SACK = 0xDC
    RELIABILITY_NACK = 0xDD
    RELIABILITY_PROBE_REQ = 0xDE


#: The write opcodes, and those of them that carry an ImmDt.
WRITE_OPCODES: Final = frozenset(range(Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_ONLY_IMM + 1))
IMM_OPCODES: Final = frozenset({Opcode.RDMA_WRITE_LAST_IMM, Opcode.RDMA_WRITE_ONLY_IMM})


#: Opcodes whose headers end with mrcstack's XETH (writes, EV probes and port-status
#: updates, reliability probes), and those that end with its XFETH (feedback).
XETH_OPCODES: Final = WRITE_OPCODES | {Opcode.ENDPOINT_REQUEST, Opcode.RELIABILITY_PROBE_REQ}
XFETH_OPCODES: Final = frozenset(
    {Opcode.RELIABILITY_SACK, Opcode.RELIABILITY_NACK, Opcode.ENDPOINT_RESPONSE}
)


class BthFlags(enum.IntFlag):
    """BTH byte 8: ack request, reserved R, retransmission, TSETH present."""

    ACK_REQ = 0x80
    R = 0x40
    RTX = 0x20
    TS = 0x10


class DataFlags(enum.IntFlag):
    """A write's flags as the core sees them.

    FIRST and LAST come from the opcode, RETX from the BTH; TRIMMED and TRIM_LASTHOP are the
    XETH flags byte, the only bits a switch writes.
    """

    RETX = 0x01  # a retransmission (BTH RTX)
    LAST = 0x02  # last packet of a message (opcode LAST/ONLY)
    ACK_REQ = 0x04  # the sender asks for an acknowledgement now (BTH A)
    FIRST = 0x08  # first packet of a message (opcode FIRST/ONLY)
    TRIMMED = 0x40  # set by a switch that cut the payload
    TRIM_LASTHOP = 0x80  # set by a switch that trimmed on a host-facing port


#: Flag bits a switch may set in flight; excluded from every integrity check.
SWITCH_FLAGS: Final = DataFlags.TRIMMED | DataFlags.TRIM_LASTHOP
#: Bit 5 of the XETH/XFETH flags byte: the trailer is mrcstack's 16-byte AES-GCM tag, not the
#: ICRC.  The sender sets it from its integrity mode, the header check and the tag cover it,
#: and a receiver whose mode differs rejects the packet: so a capture says which trailer
#: every packet carries, with no setting in the dissector.
AEAD_TAG_FLAG: Final = 0x20


class FeedbackFlags(enum.IntFlag):
    """Feedback flags: ECN_ECHO travels in SETH's (NETH's) cc flags, PROBE_RESPONSE is SETH's
    ``pr``, RETX the BTH's RTX bit, DUPLICATE XFETH's flags (mrcstack's extension only)."""

    ECN_ECHO = 0x01  # the triggering data packet arrived ECN-marked (CE)
    DUPLICATE = 0x02  # the triggering data packet had already arrived (like TCP's DSACK)
    PROBE_RESPONSE = 0x04  # SETH pr: this SACK answers a reliability probe
    RETX = 0x08  # BTH RTX on feedback (a spec peer's SACK for a retransmission sets it)


class SkipHint(enum.IntEnum):
    """SETH ``m``: the receiver tells the sender to skip the acknowledged packet's EV."""

    NONE = 0
    SKIP_ONCE = 1
    ALWAYS_SKIP = 2


class NackReason(enum.IntEnum):
    """NETH reasons: OCP MRC 1.0's values, mrcstack's own at 0xE0 and up."""

    TRIMMED = 0x01
    TRIMMED_LASTHOP = 0x02
    NO_BITMAP = 0x06
    NO_PKT_BUFFER = 0x07
    NO_RESOURCE = 0x0A
    PSN_OOR_WINDOW = 0x0B
    UNEXP_EVENT = 0x19
    REMOTE_ACCESS = 0xE0  # rkey / range / permission mismatch: never retried
    SEQ_ERROR = 0xE1  # RoCE-like mode: out-of-order packet discarded (go-back-N)
    INVALID_REQUEST = 0xE2  # a write that cannot be what its sender meant: never retried


class Dscp(enum.IntEnum):
    """Traffic classes of OCP MRC 1.0: switches trim only DATA, and forward TRIMMED (what a
    trim leaves; TRIMMED_LASTHOP when the trimming port faced the host) ahead of data."""

    DATA = 4
    TRIMMED = 12
    TRIMMED_LASTHOP = 16
    CONTROL = 46


ECT0: Final = 0x02  # the ECN field: ECN-capable transport, so switches may mark instead of drop


def traffic_class(dscp: int, ecn: int = ECT0) -> int:
    """The IPv6 traffic class byte: DSCP in the top six bits, ECN in the low two."""
    return dscp << 2 | ecn


TCLASS_DATA: Final = traffic_class(Dscp.DATA)
TCLASS_CONTROL: Final = traffic_class(Dscp.CONTROL)
#: Opcodes from here up are control (SACK, NACK, probes): sent in the control class.
FIRST_CONTROL_OPCODE: Final = 0xD0


class EndpointOp(enum.IntEnum):
    """ERTH/EETH op (low 2 bits of byte 1)."""

    PORT_STATUS_UPDATE = 0
    EV_PROBE = 1


# The two packets made once per data packet write their __init__ out (init=False): compiled
# by mypyc (mrcstack.native) it is native code, where the one dataclasses generates stays
# Python (0.44 us a packet).  Same parameters, order and defaults as the generated one.
@dataclass(slots=True, unsafe_hash=True, init=False)
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
    #: RETH DMA length: the whole write's length (as an InfiniBand first packet's RETH), so
    #: the receiver checks the write as a whole from any of its packets.  -1 on encode:
    #: ``offset + len(payload)``, a write that ends with this packet.
    dma_len: int = -1
    msn: int = 0  # METH MSN: the message's sequence number, mod 2**16
    #: Where this payload sits in its write, in bytes (XETH): ``va - offset`` is the write's
    #: first byte, and ``offset // mtu`` its first packet's PSN distance.  Decoded without
    #: the extension it is what the opcode and RETH tell: 0 for a first packet, the DMA
    #: length minus the payload for a last one, and -1 (unknown) for a middle one.
    offset: int = 0
    rq_msn: int = 0  # METH RQ MSN: carried as received; mrcstack sends 0

    def __init__(
        self, qpn: int, psn: int, va: int, rkey: int, payload: bytes | memoryview, ev: int,
        port: int, tx_seq: int, ts_ns: int, flags: int = 0, imm: int | None = None,
        dma_len: int = -1, msn: int = 0, offset: int = 0, rq_msn: int = 0,
    ) -> None:  # fmt: skip
        self.qpn = qpn
        self.psn = psn
        self.va = va
        self.rkey = rkey
        self.payload = payload
        self.ev = ev
        self.port = port
        self.tx_seq = tx_seq
        self.ts_ns = ts_ns
        self.flags = flags
        self.imm = imm
        self.dma_len = dma_len
        self.msn = msn
        self.offset = offset
        self.rq_msn = rq_msn

    @property
    def trimmed(self) -> bool:
        return bool(self.flags & DataFlags.TRIMMED)


@dataclass(slots=True, unsafe_hash=True, init=False)
class AckPacket:
    """SACK (nack_reason == 0) or NACK: cumulative PSN, SACK bitmap, echoes, port state."""

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
    skip: int = 0  # SkipHint: SETH m
    ooo_count: int = 0  # CC_STATE: out-of-order packets held (15 bits, saturating)
    rcv_bytes: int = 0  # CC_STATE: bytes received, mod 2**24
    window: int = MAX_WINDOW  # SETH MPR x 128: the receiver's PSN window (0: not stated)
    cc_type: int = 0  # SETH/NETH cc_type: carried as received; mrcstack sends 0
    #: SETH/NETH source context id: the sending QP's number (its low 16 bits).
    scid: int = 0

    def __init__(
        self, qpn: int, cum_psn: int, msn: int, ev: int, port: int, tx_seq: int, echo_ev: int,
        echo_psn: int, echo_ts_ns: int, sack_base: int, sack_bitmap: int, port_state: int,
        flags: int = 0, nack_reason: int = 0, skip: int = 0, ooo_count: int = 0,
        rcv_bytes: int = 0, window: int = MAX_WINDOW, cc_type: int = 0, scid: int = 0,
    ) -> None:  # fmt: skip
        self.qpn = qpn
        self.cum_psn = cum_psn
        self.msn = msn
        self.ev = ev
        self.port = port
        self.tx_seq = tx_seq
        self.echo_ev = echo_ev
        self.echo_psn = echo_psn
        self.echo_ts_ns = echo_ts_ns
        self.sack_base = sack_base
        self.sack_bitmap = sack_bitmap
        self.port_state = port_state
        self.flags = flags
        self.nack_reason = nack_reason
        self.skip = skip
        self.ooo_count = ooo_count
        self.rcv_bytes = rcv_bytes
        self.window = window
        self.cc_type = cc_type
        self.scid = scid


@dataclass(slots=True, unsafe_hash=True)
class ProbePacket:
    """An EV probe (ERTH EV_PROBE) to the peer's endpoint (QP 2): tests one path; answered
    by a reply carrying the same probe id."""

    qpn: int
    ev: int
    port: int
    tx_seq: int
    ts_ns: int
    port_state: int = 0  # ERTH port status mask
    probe_id: int = 0  # BTH PSN[15:0]


@dataclass(slots=True, unsafe_hash=True)
class ProbeReplyPacket:
    """An endpoint response (EETH) to the prober's endpoint (QP 2): the probe id and the
    probe's timestamp, echoed; with mrcstack's extension, the responder's port state."""

    qpn: int
    ev: int
    port: int
    tx_seq: int
    probe_id: int
    echo_ts_ns: int
    port_state: int = 0
    op: int = 1  # EndpointOp: EV_PROBE (a spec peer may answer a port status update, op 0)


@dataclass(slots=True, unsafe_hash=True)
class PortStatusPacket:
    """PORT_STATUS_UPDATE (ERTH op 0) to the peer's endpoint (QP 2): which of the sender's
    NIC ports are up; no answer needed (it is repeated on every plane that is up)."""

    qpn: int
    port_state: int
    ev: int
    port: int
    tx_seq: int
    ts_ns: int
    probe_id: int = 0  # BTH PSN[15:0]


@dataclass(slots=True, unsafe_hash=True)
class ReliabilityProbePacket:
    """A reliability probe (PETH): asks the receiver for its acknowledgement state now; it
    answers with a SACK (``pr`` set) whose entropy and timestamp echo the probe's."""

    qpn: int
    probe_id: int
    ev: int
    port: int
    tx_seq: int
    ts_ns: int
    scid: int = 0  # PETH source context id: the prober's QP number (its low 16 bits)


@dataclass(slots=True, unsafe_hash=True)
class AcknowledgePacket:
    """ACKNOWLEDGE (0xD1, the IBTA AETH): a cumulative acknowledgement up to and including
    ``psn`` (syndrome 0x00-0x1F), or an IBTA NAK (syndrome 0x60-0x7F) of ``psn``.  A spec
    peer may send it; mrcstack acknowledges with SACKs.  It has no room for mrcstack's
    extension: ``ev`` and ``port`` are what the outer header and the plane say."""

    qpn: int
    psn: int
    syndrome: int
    msn: int
    ev: int = 0
    port: int = 0
    tx_seq: int = 0  # (no room for one: always 0)


Packet = (
    DataPacket
    | AckPacket
    | ProbePacket
    | ProbeReplyPacket
    | ReliabilityProbePacket
    | PortStatusPacket
    | AcknowledgePacket
)
