"""Scapy layers for OCP MRC 1.0, bound after Scapy's RoCEv2 BTH (``scapy.contrib.roce``).

Craft and dissect MRC packets with Scapy::

    from scapy.layers.inet6 import IPv6
    from scapy.layers.inet import UDP
    from scapy.contrib.roce import BTH
    from mrcstack.wire.scapy_layers import METH, TSETH, RETH

    pkt = (IPv6(src="fd00::1", dst="fd00::2") / UDP(sport=0, dport=4791)
           / BTH(opcode=0xCA, dqpn=0x101, psn=7, resv7=0x10)   # TS: a TSETH follows
           / METH(msn=3) / TSETH(tx_timestamp=100) / RETH(va=0x1000, rkey=0x55, dmalen=5)
           / b"hello")                                          # Scapy adds the ICRC
    IPv6(bytes(pkt)).show()                                    # dissects the same layers

The fields are the specification's, as the public transcription of OCP MRC 1.0 places them
(docs/wire-format.md has the tables, with their sources); this module is written from those
tables alone and imports nothing of mrcstack, so the tests hold mrcstack's codec against it
as a second, independent implementation.  Scapy's BTH names byte 8 ``ackreq`` (A, bit 7) and
``resv7`` (the rest): MRC's R, RTX and TS are ``resv7`` bits 6, 5 and 4 (``RESV7_RTX``,
``RESV7_TS``).

mrcstack's own extension headers, XETH (after a write's or probe's headers) and XFETH (after
feedback), are here too.  A control packet says whether one follows (its OCP header's 5-bit
``next`` is ``NEXT_EXT``); a write does not, so a dissected write shows an XETH only where
the bytes after its headers are one (version ``XETH_VERSION`` and a ``hdr_check`` that
verifies).  :func:`fill_hdr_check` computes ``hdr_check`` for a packet built with one.
"""

from __future__ import annotations

import zlib
from typing import Any, ClassVar

from scapy.contrib.roce import BTH
from scapy.fields import (
    BitEnumField,
    BitField,
    ByteEnumField,
    ByteField,
    FlagsField,
    IntField,
    LongField,
    ShortField,
    SignedShortField,
    XBitField,
    XByteField,
    XIntField,
    XLongField,
    XShortField,
)
from scapy.packet import Packet, Raw, bind_layers

__all__ = [
    "CC_STATE",
    "EETH",
    "ERTH",
    "METH",
    "NETH",
    "PETH",
    "RETH",
    "SETH",
    "TSETH",
    "XETH",
    "XFETH",
    "ImmDt",
    "fill_hdr_check",
]

# Opcodes (BTH byte 0) of OCP MRC 1.0.
OPCODES = {
    0xC6: "RDMA_WRITE_FIRST",
    0xC7: "RDMA_WRITE_MIDDLE",
    0xC8: "RDMA_WRITE_LAST",
    0xC9: "RDMA_WRITE_LAST_IMM",
    0xCA: "RDMA_WRITE_ONLY",
    0xCB: "RDMA_WRITE_ONLY_IMM",
    0xD1: "ACKNOWLEDGE",
    0xD8: "ENDPOINT_REQUEST",
    0xD9: "ENDPOINT_RESPONSE",
    0xDC: "RELIABILITY_SACK",
    0xDD: "RELIABILITY_NACK",
    0xDE: "RELIABILITY_PROBE_REQ",
}
WRITES = range(0xC6, 0xCC)
WRITES_WITH_IMM = (0xC9, 0xCB)
NACK_REASONS = {
    0x01: "TRIMMED",
    0x02: "TRIMMED_LASTHOP",
    0x06: "NO_BITMAP",
    0x07: "NO_PKT_BUFFER",
    0x0A: "NO_RESOURCE",
    0x0B: "PSN_OOR_WINDOW",
    0x19: "UNEXP_EVENT",
    0xE0: "REMOTE_ACCESS",
    0xE1: "SEQ_ERROR",
    0xE2: "INVALID_REQUEST",
}
SKIP = {0: "NONE", 1: "SKIP_ONCE", 2: "ALWAYS_SKIP"}
ENDPOINT_OPS = {0: "PORT_STATUS_UPDATE", 1: "EV_PROBE"}
#: BTH ``resv7`` bits (byte 8 below A): R, RTX (a retransmission), TS (a TSETH follows).
RESV7_R = 0x40
RESV7_RTX = 0x20
RESV7_TS = 0x10
#: The QP endpoint operations go to (section 7.4.7), the probe id in PSN[15:0].
ENDPOINT_QPN = 0x2
#: ``next`` value saying that mrcstack's extension (XETH/XFETH) follows; 0: nothing does.
NEXT_EXT = 0x1F
XETH_VERSION = 4
XETH_LEN = 32
XFETH_LEN = 36


def _type_next() -> list[Any]:
    """Bytes 0-1 of every extension header (Tables 7-14 to 7-23): a 4-bit type and a 5-bit
    next header."""
    return [BitField("type", 0, 4), BitField("next", 0, 5)]


class METH(Packet):
    """Message extended transport header (Tables 6-8, 6-9): message sequence numbers."""

    name = "MRC METH"
    fields_desc: ClassVar[list[Any]] = [ShortField("rq_msn", 0), ShortField("msn", 0)]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        bth = self.underlayer
        if isinstance(bth, BTH) and bth.resv7 & RESV7_TS:
            return TSETH
        return RETH


class TSETH(Packet):
    """Requestor timestamp extended header (Tables 6-6, 6-7), present when BTH TS is set;
    the timestamp in 1.024 us units."""

    name = "MRC TSETH"
    fields_desc: ClassVar[list[Any]] = [
        ShortField("tx_timestamp", 0),
        BitField("tsr", 0, 1),
        BitField("reserved", 0, 11),
        BitField("ftype", 1, 4),
    ]


def _after_write_headers(layer: Packet, payload: bytes) -> type[Packet]:
    """What follows a write's last OCP header: mrcstack's XETH where the bytes are one."""
    if _looks_like_extension(layer, payload, XETH_LEN):
        return XETH
    return Raw


class RETH(Packet):
    """RDMA extended transport header (Table 6-5): where the payload goes; the DMA length is
    the whole write's."""

    name = "MRC RETH"
    fields_desc: ClassVar[list[Any]] = [
        XLongField("va", 0),
        XIntField("rkey", 0),
        IntField("dmalen", 0),
    ]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        bth = _bth(self)
        if bth is not None and bth.opcode in WRITES_WITH_IMM:
            return ImmDt
        return _after_write_headers(self, payload)


class ImmDt(Packet):
    """Immediate data (the last packet of a write with immediate)."""

    name = "MRC ImmDt"
    fields_desc: ClassVar[list[Any]] = [XIntField("imm", 0)]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return _after_write_headers(self, payload)


class SETH(Packet):
    """Reliability SACK header (Tables 7-14, 7-15); a CC_STATE follows."""

    name = "MRC SETH"
    fields_desc: ClassVar[list[Any]] = [
        *_type_next(),
        BitEnumField("m", 0, 2, SKIP),
        BitField("res1", 0, 3),
        BitField("pr", 0, 1),
        BitField("res2", 0, 1),
        SignedShortField("ack_psn_offset", 0),
        XIntField("entropy", 0),
        XShortField("spdcid", 0),
        XShortField("dpdcid", 0),
        ByteField("res3", 0),
        BitField("cack_psn", 0, 24),
        BitField("cc_type", 0, 4),
        BitField("cc_flags", 0, 4),
        ByteField("mpr", 0),
        SignedShortField("sack_offset", 0),
        XLongField("sack_bitmap", 0),
    ]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return CC_STATE


class CC_STATE(Packet):  # noqa: N801  (the specification's name)
    """Congestion control state after a SETH (Tables 7-12, 7-13): received bytes in 256-byte
    units (section 7.5.5.4)."""

    name = "MRC CC_STATE"
    fields_desc: ClassVar[list[Any]] = [
        ShortField("tx_timestamp", 0),
        BitField("reserved", 0, 1),
        BitField("ooo_count", 0, 15),
        BitField("rc", 0, 1),
        BitField("rcv_cwnd_pen", 0, 7),
        BitField("rcvd_bytes", 0, 24),
    ]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        seth = self.underlayer
        if isinstance(seth, SETH) and seth.next == NEXT_EXT:
            return XFETH
        return Raw


class NETH(Packet):
    """Reliability NACK header (Tables 7-16, 7-17)."""

    name = "MRC NETH"
    fields_desc: ClassVar[list[Any]] = [
        *_type_next(),
        BitField("reserved", 0, 7),
        ByteEnumField("nack_reason", 0, NACK_REASONS),
        XByteField("vendor_info", 0),
        XIntField("entropy", 0),
        XShortField("spdcid", 0),
        XShortField("dpdcid", 0),
        ByteField("res1", 0),
        BitField("nack_psn", 0, 24),
        BitField("cc_type", 0, 4),
        BitField("cc_flags", 0, 4),
        ByteField("res2", 0),
        ShortField("tx_timestamp", 0),
    ]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return XFETH if self.next == NEXT_EXT else Raw


class PETH(Packet):
    """Reliability probe request header (Tables 7-18, 7-19): answered with a SACK, pr set."""

    name = "MRC PETH"
    fields_desc: ClassVar[list[Any]] = [
        *_type_next(),
        BitField("reserved1", 0, 7),
        ByteField("reserved2", 0),
        XByteField("vendor_info", 0),
        ShortField("probe_id", 0),
        ShortField("reserved3", 0),
        XShortField("spdcid", 0),
        XShortField("dpdcid", 0),
        ShortField("tx_timestamp", 0),
        BitField("tsr", 0, 1),
        BitField("reserved4", 0, 11),
        BitField("ftype", 1, 4),
    ]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return XETH if self.next == NEXT_EXT else Raw


class ERTH(Packet):
    """Endpoint request header (Tables 7-20, 7-21): an EV probe or a port status update, to
    QP 2 with the probe id in the BTH's PSN[15:0]."""

    name = "MRC ERTH"
    fields_desc: ClassVar[list[Any]] = [
        *_type_next(),
        BitField("reserved1", 0, 5),
        BitEnumField("op", 1, 2, ENDPOINT_OPS),
        ByteField("reserved2", 0),
        XByteField("vendor_info", 0),
        XIntField("port_status_mask", 0),
        IntField("reserved3", 0),
        ShortField("tx_timestamp", 0),
        BitField("tsr", 0, 1),
        BitField("reserved4", 0, 11),
        BitField("ftype", 1, 4),
    ]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return XETH if self.next == NEXT_EXT else Raw


class EETH(Packet):
    """Endpoint response header (Tables 7-22, 7-23): the probe's timestamp echoed at bytes
    28-29, everything else but the op reserved."""

    name = "MRC EETH"
    fields_desc: ClassVar[list[Any]] = [
        *_type_next(),
        BitField("r1", 0, 1),
        BitEnumField("op", 1, 2, ENDPOINT_OPS),
        BitField("r2", 0, 4),
        ShortField("reserved", 0),
        XBitField("reserved_words", 0, 192),
        ShortField("tx_timestamp", 0),
        ShortField("reserved_tail", 0),
        IntField("reserved_word", 0),
    ]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return XFETH if self.next == NEXT_EXT else Raw


_XFLAGS = ["b0", "DUPLICATE", "b2", "b3", "b4", "AEAD_TAG", "TRIMMED", "TRIM_LASTHOP"]


class XETH(Packet):
    """mrcstack's extension after a write's, an endpoint request's or a reliability probe's
    headers (docs/wire-format.md): the EV, port, transmission number, 64-bit send time, the
    payload's offset in its write, and a CRC32 of all the headers."""

    name = "mrcstack XETH"
    fields_desc: ClassVar[list[Any]] = [
        ByteField("version", XETH_VERSION),
        FlagsField("flags", 0, 8, _XFLAGS),
        ByteField("port", 0),
        ByteField("reserved", 0),
        XIntField("ev", 0),
        LongField("tx_seq", 0),
        LongField("ts_ns", 0),
        IntField("offset", 0),
        XIntField("hdr_check", 0),
    ]


class XFETH(Packet):
    """mrcstack's extension after feedback (SACK, NACK, endpoint response): the reverse EV,
    port, transmission number, the echoed 64-bit time, writes completed, the port state."""

    name = "mrcstack XFETH"
    fields_desc: ClassVar[list[Any]] = [
        ByteField("version", XETH_VERSION),
        FlagsField("flags", 0, 8, _XFLAGS),
        ByteField("port", 0),
        ByteField("reserved", 0),
        XIntField("ev", 0),
        LongField("tx_seq", 0),
        LongField("echo_ts_ns", 0),
        IntField("msn", 0),
        XShortField("port_state", 0),
        ShortField("reserved2", 0),
        XIntField("hdr_check", 0),
    ]


def _bth(layer: Packet | None) -> BTH | None:
    while layer is not None and not isinstance(layer, BTH):
        layer = layer.underlayer
    return layer


def _header_bytes(layer: Packet | None) -> bytes:
    """The bytes of the headers from the BTH down to (and including) ``layer``."""
    chain = []
    while layer is not None:
        chain.append(layer)
        if isinstance(layer, BTH):
            break
        layer = layer.underlayer
    else:
        return b""
    return b"".join(bytes(hdr.self_build()) for hdr in reversed(chain))


def _crc32_header(header: bytes, ext_len: int) -> int:
    """CRC32 of the headers with the last 4 bytes (``hdr_check``) zero and the two
    switch-written flag bits (TRIMMED, TRIM_LASTHOP) of the extension's flags byte clear."""
    buf = bytearray(header)
    buf[-4:] = bytes(4)
    buf[len(buf) - ext_len + 1] &= 0x3F
    return zlib.crc32(bytes(buf))


def _looks_like_extension(layer: Packet, payload: bytes, length: int) -> bool:
    """The bytes after ``layer`` are one of mrcstack's extension headers: the version, and a
    hdr_check over every header before and including them."""
    if len(payload) < length or payload[0] != XETH_VERSION:
        return False
    header = _header_bytes(layer) + payload[:length]
    return _crc32_header(header, length) == int.from_bytes(header[-4:], "big")


def fill_hdr_check(pkt: Packet) -> Packet:
    """Set the ``hdr_check`` of the packet's XETH or XFETH (if it has one) to the CRC32 of
    its headers, as mrcstack's extension requires; returns the packet."""
    ext = pkt.getlayer(XETH) or pkt.getlayer(XFETH)
    if ext is None:
        return pkt
    ext.hdr_check = 0
    ext.hdr_check = _crc32_header(
        _header_bytes(ext), XETH_LEN if isinstance(ext, XETH) else XFETH_LEN
    )
    return pkt


for _op in WRITES:
    bind_layers(BTH, METH, opcode=_op)
bind_layers(TSETH, RETH)
bind_layers(BTH, SETH, opcode=0xDC)
bind_layers(BTH, NETH, opcode=0xDD)
bind_layers(BTH, PETH, opcode=0xDE)
bind_layers(BTH, ERTH, opcode=0xD8)
bind_layers(BTH, EETH, opcode=0xD9)
try:  # Scapy's IBTA AETH, for ACKNOWLEDGE (0xD1)
    from scapy.contrib.roce import AETH

    bind_layers(BTH, AETH, opcode=0xD1)
except ImportError:  # pragma: no cover - every Scapy with RoCE has it
    pass
