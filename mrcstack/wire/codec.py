"""Encode and decode MRC packets with mrcstack's extension header: pure functions over the
layout in ``mrcstack.wire.layout``.

``encode`` packs a packet dataclass, computes ``hdr_check`` and asks an ``Integrity`` for the
trailer.  ``decode`` is the only door for bytes from a peer that negotiated the extension:
it returns a valid packet or raises ``DecodeError``, never anything else, whatever the input.
Writes are the hot path: one precompiled ``struct`` per layout, one CRC for the header, no
copy of the payload on receive (a memoryview slice of the datagram is returned).

The specification's headers sit where OCP MRC 1.0 puts them (``docs/wire-format.md``);
XETH/XFETH follow them, last before the payload.  :mod:`mrcstack.wire.plain` encodes the same
packets without the extension, for a peer that speaks only the specification.
"""

from __future__ import annotations

import struct
import zlib
from typing import TYPE_CHECKING, Final

from mrcstack.wire import plain
from mrcstack.wire.integrity import (
    BTH_LEN,
    HDR_CHECK_LEN,
    XETH_LEN,
    XFETH_LEN,
    BytesLike,
    DecodeError,
    DecodeReason,
    WireUsageError,
    crc32_header,
)
from mrcstack.wire.layout import (
    ACK_REQ,
    ACKNOWLEDGE_HDR_LEN,
    AETH_LEN,
    BTH,
    BTH_ACK_REQ,
    BTH_PKEY,
    BTH_PROBE_ID_BYTES,
    BTH_QPN_BYTES,
    BTH_RTX,
    BTH_TS,
    BYTE1_RESERVED,
    CC_ECN,
    CC_STATE,
    CC_STATE_LEN,
    DATA_HDR_LEN,
    DATA_IMM_HDR_LEN,
    DUPLICATE,
    ECN_ECHO,
    EETH,
    EETH_BYTE1_RESERVED,
    EETH_LEN,
    EETH_OP_SHIFT,
    ERTH,
    ERTH_BYTE1_RESERVED,
    ERTH_LEN,
    FB_RETX,
    FIRST,
    FTYPE,
    IMMDT_LEN,
    LAST,
    METH_LEN,
    NACK_HDR_LEN,
    NACK_REASONS,
    NETH,
    NETH_LEN,
    NEXT_EXT,
    OPCODE_FLAGS,
    PETH,
    PETH_LEN,
    PROBE_HDR_LEN,
    PROBE_REPLY_HDR_LEN,
    PROBE_RESPONSE,
    RELIABILITY_PROBE_HDR_LEN,
    RETH_LEN,
    RETX,
    SACK_HDR_LEN,
    SENDER_DATA_FLAGS,
    SETH,
    SETH_BYTE1_RESERVED,
    SETH_LEN,
    SETH_M_SHIFT,
    SETH_PR,
    SKIPS,
    TRIM_LASTHOP,
    TRIMMED,
    TS_MASK,
    TS_UNIT_NS_SHIFT,
    TSETH_LEN,
    U24_SHIFT,
    WRITE,
    XETH,
    XFETH,
    bad,
    byte_view,
    check_ack,
    check_bth,
    check_probe_id,
    check_range,
    check_u24,
    field_error,
    next_of,
    psn_offset,
    signed_psn,
    truncated,
    ts16,
    write_opcode,
)
from mrcstack.wire.packets import (
    AEAD_TAG_FLAG,
    ENDPOINT_QPN,
    IMM_OPCODES,
    MPR_UNIT,
    MRC_EXT_VERSION,
    PSN_MASK,
    SWITCH_FLAGS,
    WRITE_OPCODES,
    XETH_OPCODES,
    AcknowledgePacket,
    AckPacket,
    DataPacket,
    EndpointOp,
    Opcode,
    Packet,
    PortStatusPacket,
    ProbePacket,
    ProbeReplyPacket,
    ReliabilityProbePacket,
)

if TYPE_CHECKING:
    from mrcstack.wire.integrity import Integrity

__all__ = [
    "ACKNOWLEDGE_HDR_LEN",
    "AETH_LEN",
    "BTH_LEN",
    "BTH_PKEY",
    "BTH_PROBE_ID_BYTES",
    "BTH_QPN_BYTES",
    "CC_STATE_LEN",
    "DATA_HDR_LEN",
    "DATA_IMM_HDR_LEN",
    "EETH_LEN",
    "ERTH_LEN",
    "HDR_CHECK_LEN",
    "IMMDT_LEN",
    "METH_LEN",
    "NACK_HDR_LEN",
    "NETH_LEN",
    "PETH_LEN",
    "PROBE_HDR_LEN",
    "PROBE_REPLY_HDR_LEN",
    "RELIABILITY_PROBE_HDR_LEN",
    "RETH_LEN",
    "SACK_HDR_LEN",
    "SETH_LEN",
    "TSETH_LEN",
    "TS_UNIT_NS_SHIFT",
    "XETH_LEN",
    "XFETH_LEN",
    "DecodeError",
    "DecodeReason",
    "WireUsageError",
    "decode",
    "encode",
    "encode_into",
    "encode_trimmed",
    "encoded_length",
    "has_extension",
    "header_length",
    "peek_qpn",
    "trim",
    "trimmed_length",
    "write_opcode",
]

_SWITCH: Final = int(SWITCH_FLAGS)
_VALID_DATA_FLAGS: Final = SENDER_DATA_FLAGS | _SWITCH
_VALID_FEEDBACK_FLAGS: Final = ECN_ECHO | DUPLICATE | PROBE_RESPONSE | FB_RETX
_TAG: Final = AEAD_TAG_FLAG
_NOT_SENDER_OR_SWITCH: Final = 0xFF & ~(_SWITCH | _TAG)
_XETH_FLAGS_FROM_END: Final = XETH_LEN - 1  # flags byte offset, counted back from the header end
_NEXT0, _NEXT1 = NEXT_EXT >> 1, (NEXT_EXT & 1) << 7  # an extension follows: bytes 0 and 1

_DATA: Final = struct.Struct(BTH + WRITE + XETH)
_DATA_IMM: Final = struct.Struct(BTH + WRITE + "I" + XETH)
_SACK: Final = struct.Struct(BTH + SETH + CC_STATE + XFETH)
_NACK: Final = struct.Struct(BTH + NETH + XFETH)
_PROBE: Final = struct.Struct(BTH + ERTH + XETH)
_PROBE_REPLY: Final = struct.Struct(BTH + EETH + XFETH)
_RELIABILITY_PROBE: Final = struct.Struct(BTH + PETH + XETH)
_U32: Final = struct.Struct(">I")
_DATA_CHECK_AT: Final = DATA_HDR_LEN - HDR_CHECK_LEN
#: The usual write's opcode and BTH byte 8 (shifted into its PSN word) by its flags: no
#: immediate, not trimmed, any of RETX, ACK_REQ, FIRST and LAST.
_USUAL_FLAGS: Final = [
    f | r | a for f in (0, FIRST, LAST, FIRST | LAST) for r in (0, RETX) for a in (0, ACK_REQ)
]
_USUAL_OPCODE: Final[dict[int, int]] = {f: int(write_opcode(f, None)) for f in _USUAL_FLAGS}
_USUAL_BTH8: Final[dict[int, int]] = {
    f: (BTH_TS | (BTH_RTX if f & RETX else 0) | (BTH_ACK_REQ if f & ACK_REQ else 0)) << U24_SHIFT
    for f in _USUAL_FLAGS
}
_ZERO_CHECK: Final = bytes(HDR_CHECK_LEN)

_HEADER_LEN: Final[dict[int, int]] = {
    **{op: DATA_IMM_HDR_LEN if op in IMM_OPCODES else DATA_HDR_LEN for op in WRITE_OPCODES},
    Opcode.RELIABILITY_SACK: SACK_HDR_LEN,
    Opcode.RELIABILITY_NACK: NACK_HDR_LEN,
    Opcode.ENDPOINT_REQUEST: PROBE_HDR_LEN,
    Opcode.ENDPOINT_RESPONSE: PROBE_REPLY_HDR_LEN,
    Opcode.RELIABILITY_PROBE_REQ: RELIABILITY_PROBE_HDR_LEN,
    Opcode.ACKNOWLEDGE: ACKNOWLEDGE_HDR_LEN,
}


def header_length(opcode: int) -> int:
    """Bytes of headers (BTH through mrcstack's extension) for an opcode we take."""
    try:
        return _HEADER_LEN[opcode]
    except (KeyError, TypeError):
        raise WireUsageError(f"unknown opcode {opcode!r}") from None


def trimmed_length(opcode: int) -> int:
    """Length of a trimmed write: its headers only (68, or 72 with an immediate)."""
    if opcode not in WRITE_OPCODES:
        raise WireUsageError(f"only RDMA WRITE packets are trimmed, not opcode {opcode!r}")
    return _HEADER_LEN[opcode]


def encode(pkt: Packet, integrity: Integrity) -> bytes:
    """Serialize a packet with mrcstack's extension; raises WireUsageError (a ValueError) for
    out-of-range fields.

    A DataPacket whose flags include TRIMMED encodes to the trimmed form a switch would
    produce (headers only, RETH length = ``dma_len``), so trimmed packets round-trip too.
    An ACKNOWLEDGE has no room for the extension: it encodes as :func:`plain.encode_plain`.
    """
    kind = type(pkt)
    if kind is DataPacket:
        return _encode_data(pkt, integrity)  # type: ignore[arg-type]
    if kind is AckPacket:
        return _encode_ack(pkt, integrity)  # type: ignore[arg-type]
    if kind is ProbePacket or kind is PortStatusPacket:
        return _encode_probe(pkt, integrity)  # type: ignore[arg-type]
    if kind is ProbeReplyPacket:
        return _encode_probe_reply(pkt, integrity)  # type: ignore[arg-type]
    if kind is ReliabilityProbePacket:
        return _encode_reliability_probe(pkt, integrity)  # type: ignore[arg-type]
    if kind is AcknowledgePacket:
        return plain.encode_plain(pkt, integrity)
    raise WireUsageError(f"not an MRC packet: {kind.__name__}")


def encode_into(pkt: Packet, integrity: Integrity, out: bytearray | memoryview) -> int:
    """:func:`encode` into the start of ``out`` (a send slot, say); returns the datagram's
    length.  The usual write (no immediate, not trimmed, every field in range) is built in
    place: its payload is copied once, into ``out``, and authenticated there; any other
    packet is encoded and copied.  Raises what ``encode`` raises, and WireUsageError when
    ``out`` is too small."""
    if type(pkt) is DataPacket:
        size = _usual_data_into(pkt, integrity, out)
        if size >= 0:
            return size
    data = encode(pkt, integrity)
    size = len(data)
    if len(out) < size:
        raise WireUsageError(f"a buffer of {len(out)} bytes cannot hold a {size}-byte datagram")
    out[:size] = data
    return size


def _usual_data_into(pkt: DataPacket, integrity: Integrity, out: bytearray | memoryview) -> int:
    """The usual write encoded into ``out``: its length, or -1 when it is not the usual kind
    or ``out`` is too small (the caller takes the general path, whose checks name what is
    wrong).  The same bytes as :func:`_encode_data`."""
    flags = pkt.flags
    payload = pkt.payload
    # A slice of a posted buffer (the usual payload) is a flat byte view already: its
    # length is its bytes, with no new view made to check it (once per data packet).
    if type(payload) is not bytes and (
        type(payload) is not memoryview or payload.format != "B" or payload.ndim != 1
    ):
        payload = byte_view(payload)
    paylen = len(payload)
    offset = pkt.offset
    dma_len = pkt.dma_len
    if dma_len == -1:
        dma_len = offset + paylen  # the write ends with this packet
    qpn = pkt.qpn
    psn = pkt.psn
    opcode = _USUAL_OPCODE.get(flags) if type(flags) is int and pkt.imm is None else None
    end = DATA_HDR_LEN + paylen
    total = end + integrity.trailer_len
    if (
        opcode is None
        or type(offset) is not int
        or offset < 0
        or offset + paylen > dma_len
        or (flags & FIRST and offset)
        or (flags & LAST and offset + paylen != dma_len)
        or type(qpn) is not int
        or not 0 <= qpn <= PSN_MASK
        or type(psn) is not int
        or not 0 <= psn <= PSN_MASK
        or len(out) < total
    ):
        return -1
    ts_ns = pkt.ts_ns
    tx_seq = pkt.tx_seq
    port = pkt.port
    ev = pkt.ev
    # (a send slot is a view already: no second view of it, once per data packet)
    packet = out[:total] if type(out) is memoryview else memoryview(out)[:total]
    try:
        _DATA.pack_into(
            packet, 0, opcode, 0, BTH_PKEY, qpn, _USUAL_BTH8[flags] | psn,
            pkt.rq_msn, pkt.msn, (ts_ns >> TS_UNIT_NS_SHIFT) & TS_MASK, FTYPE,
            pkt.va, pkt.rkey, dma_len,
            MRC_EXT_VERSION, integrity.tag_flag, port, 0, ev, tx_seq, ts_ns, offset, 0,
        )  # fmt: skip
    except (struct.error, TypeError) as exc:
        raise field_error(pkt, exc) from None
    _U32.pack_into(packet, _DATA_CHECK_AT, zlib.crc32(packet[:DATA_HDR_LEN]))
    packet[DATA_HDR_LEN:end] = payload
    integrity.seal_into(packet, DATA_HDR_LEN, end, tx_seq, port, ev)
    return total


def _encode_data(pkt: DataPacket, integrity: Integrity) -> bytes:
    flags = pkt.flags
    if not isinstance(flags, int) or flags & ~_VALID_DATA_FLAGS:
        raise WireUsageError(f"DataPacket.flags {flags!r} has bits outside RETX|FIRST|LAST|trim")
    payload = byte_view(pkt.payload)
    trimmed = flags & TRIMMED
    offset = pkt.offset
    dma_len = pkt.dma_len
    if trimmed:
        if len(payload):
            raise WireUsageError("a trimmed DataPacket has no payload")
    elif flags & TRIM_LASTHOP:
        raise WireUsageError("TRIM_LASTHOP is only valid together with TRIMMED")
    elif dma_len == -1:
        dma_len = offset + len(payload)  # the write ends with this packet
    check_range(flags, offset, len(payload), dma_len, trimmed)
    check_u24(pkt, pkt.qpn, pkt.psn)
    imm = pkt.imm
    opcode = write_opcode(flags, imm)
    bth8 = BTH_TS | (BTH_RTX if flags & RETX else 0) | (BTH_ACK_REQ if flags & ACK_REQ else 0)
    ts_ns = pkt.ts_ns
    tag = integrity.tag_flag
    try:
        if imm is None:
            hlen = DATA_HDR_LEN
            header = bytearray(hlen)
            _DATA.pack_into(
                header, 0, opcode, 0, BTH_PKEY, pkt.qpn, bth8 << U24_SHIFT | pkt.psn,
                pkt.rq_msn, pkt.msn, (ts_ns >> TS_UNIT_NS_SHIFT) & TS_MASK, FTYPE,
                pkt.va, pkt.rkey, dma_len,
                MRC_EXT_VERSION, tag, pkt.port, 0, pkt.ev, pkt.tx_seq, ts_ns, offset, 0,
            )  # fmt: skip
        else:
            hlen = DATA_IMM_HDR_LEN
            header = bytearray(hlen)
            _DATA_IMM.pack_into(
                header, 0, opcode, 0, BTH_PKEY, pkt.qpn, bth8 << U24_SHIFT | pkt.psn,
                pkt.rq_msn, pkt.msn, (ts_ns >> TS_UNIT_NS_SHIFT) & TS_MASK, FTYPE,
                pkt.va, pkt.rkey, dma_len, imm,
                MRC_EXT_VERSION, tag, pkt.port, 0, pkt.ev, pkt.tx_seq, ts_ns, offset, 0,
            )  # fmt: skip
    except (struct.error, TypeError) as exc:
        raise field_error(pkt, exc) from None
    _U32.pack_into(header, hlen - HDR_CHECK_LEN, zlib.crc32(header))
    if trimmed:
        header[hlen - _XETH_FLAGS_FROM_END] |= flags & _SWITCH
        return bytes(header)
    body, trailer = integrity.seal(header, payload, pkt.tx_seq, pkt.port, pkt.ev)
    return b"".join((header, body, trailer))


def _encode_ack(pkt: AckPacket, integrity: Integrity) -> bytes:
    """A SACK (BTH, SETH, CC_STATE, XFETH) or, with a reason, a NACK (BTH, NETH, XFETH): a
    NACK carries no cumulative or selective state (its other fields are not sent)."""
    check_ack(pkt, _VALID_FEEDBACK_FLAGS)
    flags = pkt.flags
    reason = pkt.nack_reason
    cc = pkt.cc_type << 4 | (CC_ECN if flags & ECN_ECHO else 0)
    echo_ts_ns = pkt.echo_ts_ns
    rtx = BTH_RTX << U24_SHIFT if flags & FB_RETX else 0
    xfeth = (
        MRC_EXT_VERSION, flags & DUPLICATE | integrity.tag_flag, pkt.port, 0, pkt.ev, pkt.tx_seq,
        echo_ts_ns, pkt.msn,
        pkt.port_state, 0, 0,
    )  # fmt: skip
    try:
        if reason == 0:
            cum = pkt.cum_psn
            byte1 = _NEXT1 | pkt.skip << SETH_M_SHIFT | (SETH_PR if flags & PROBE_RESPONSE else 0)
            header = bytearray(SACK_HDR_LEN)
            _SACK.pack_into(
                header, 0, Opcode.RELIABILITY_SACK, 0, BTH_PKEY, pkt.qpn, rtx | cum, _NEXT0, byte1,
                psn_offset("echo_psn", pkt.echo_psn, cum), pkt.echo_ev, pkt.scid,
                pkt.qpn & 0xFFFF, cum, cc, pkt.window // MPR_UNIT,
                psn_offset("sack_base", pkt.sack_base, cum), pkt.sack_bitmap,
                ts16(echo_ts_ns), pkt.ooo_count, pkt.rcv_bytes, *xfeth,
            )  # fmt: skip
        else:
            psn = pkt.echo_psn
            header = bytearray(NACK_HDR_LEN)
            _NACK.pack_into(
                header, 0, Opcode.RELIABILITY_NACK, 0, BTH_PKEY, pkt.qpn, rtx | psn,
                _NEXT0, _NEXT1, reason, 0, pkt.echo_ev, pkt.scid, pkt.qpn & 0xFFFF, psn, cc, 0,
                ts16(echo_ts_ns), *xfeth,
            )  # fmt: skip
    except (struct.error, TypeError, ValueError) as exc:
        if isinstance(exc, WireUsageError):
            raise
        raise field_error(pkt, exc) from None
    return _seal_headers_only(header, integrity, pkt.tx_seq, pkt.port, pkt.ev)


def _check_endpoint_qpn(pkt: Packet) -> None:
    if pkt.qpn != ENDPOINT_QPN:
        raise WireUsageError(
            f"{type(pkt).__name__}.qpn is {pkt.qpn}: endpoint operations go to QP {ENDPOINT_QPN}"
        )


def _encode_probe(pkt: ProbePacket | PortStatusPacket, integrity: Integrity) -> bytes:
    """An endpoint request: an EV probe, or a port-status update (ERTH op 0)."""
    _check_endpoint_qpn(pkt)
    check_probe_id(pkt)
    op = EndpointOp.EV_PROBE if type(pkt) is ProbePacket else EndpointOp.PORT_STATUS_UPDATE
    header = bytearray(PROBE_HDR_LEN)
    try:
        _PROBE.pack_into(
            header, 0, Opcode.ENDPOINT_REQUEST, 0, BTH_PKEY, pkt.qpn, pkt.probe_id,
            _NEXT0, _NEXT1 | op, 0, 0, pkt.port_state, 0, ts16(pkt.ts_ns), FTYPE,
            MRC_EXT_VERSION, integrity.tag_flag, pkt.port, 0, pkt.ev, pkt.tx_seq, pkt.ts_ns, 0, 0,
        )  # fmt: skip
    except (struct.error, TypeError) as exc:
        raise field_error(pkt, exc) from None
    return _seal_headers_only(header, integrity, pkt.tx_seq, pkt.port, pkt.ev)


def _encode_probe_reply(pkt: ProbeReplyPacket, integrity: Integrity) -> bytes:
    _check_endpoint_qpn(pkt)
    check_probe_id(pkt)
    header = bytearray(PROBE_REPLY_HDR_LEN)
    try:
        _PROBE_REPLY.pack_into(
            header, 0, Opcode.ENDPOINT_RESPONSE, 0, BTH_PKEY, pkt.qpn, pkt.probe_id,
            _NEXT0, _NEXT1 | pkt.op << EETH_OP_SHIFT, 0, 0, 0, 0, 0, ts16(pkt.echo_ts_ns), 0, 0,
            MRC_EXT_VERSION, integrity.tag_flag, pkt.port, 0, pkt.ev, pkt.tx_seq, pkt.echo_ts_ns, 0,
            pkt.port_state, 0, 0,
        )  # fmt: skip
    except (struct.error, TypeError) as exc:
        raise field_error(pkt, exc) from None
    if pkt.op not in (EndpointOp.EV_PROBE, EndpointOp.PORT_STATUS_UPDATE):
        raise WireUsageError(f"ProbeReplyPacket.op {pkt.op!r} is not an EndpointOp")
    return _seal_headers_only(header, integrity, pkt.tx_seq, pkt.port, pkt.ev)


def _encode_reliability_probe(pkt: ReliabilityProbePacket, integrity: Integrity) -> bytes:
    check_u24(pkt, pkt.qpn)
    header = bytearray(RELIABILITY_PROBE_HDR_LEN)
    try:
        _RELIABILITY_PROBE.pack_into(
            header, 0, Opcode.RELIABILITY_PROBE_REQ, 0, BTH_PKEY, pkt.qpn, 0,
            _NEXT0, _NEXT1, 0, 0, pkt.probe_id, 0, pkt.scid, pkt.qpn & 0xFFFF,
            ts16(pkt.ts_ns), FTYPE,
            MRC_EXT_VERSION, integrity.tag_flag, pkt.port, 0, pkt.ev, pkt.tx_seq, pkt.ts_ns, 0, 0,
        )  # fmt: skip
    except (struct.error, TypeError) as exc:
        raise field_error(pkt, exc) from None
    return _seal_headers_only(header, integrity, pkt.tx_seq, pkt.port, pkt.ev)


def _seal_headers_only(
    header: bytearray, integrity: Integrity, tx_seq: int, plane: int, ev: int
) -> bytes:
    _U32.pack_into(header, len(header) - HDR_CHECK_LEN, zlib.crc32(header))
    _, trailer = integrity.seal(header, b"", tx_seq, plane, ev)
    return bytes(header) + trailer


def encode_trimmed(data: BytesLike, lasthop: bool) -> bytes:
    """Do what a trimming switch does to an encoded write (with the extension).

    Cut it to its headers (payload and trailer gone) and set TRIMMED, plus TRIM_LASTHOP when
    the switch port faces the destination host.  ``hdr_check`` still verifies because it is
    computed with those bits clear.
    """
    if len(data) < BTH_LEN or data[0] not in WRITE_OPCODES:
        raise WireUsageError("encode_trimmed needs an encoded RDMA WRITE packet")
    hlen = _HEADER_LEN[data[0]]
    if len(data) < hlen:
        raise WireUsageError(f"a write has at least {hlen} bytes, got {len(data)}")
    trimmed = bytearray(data[:hlen])
    trimmed[hlen - _XETH_FLAGS_FROM_END] |= TRIMMED | (TRIM_LASTHOP if lasthop else 0)
    return bytes(trimmed)


def trim(pkt: DataPacket, lasthop: bool) -> DataPacket:
    """:func:`encode_trimmed` on a decoded write: what the receiver decodes from the trimmed
    datagram (no payload, RETH length kept in ``dma_len``, TRIMMED and perhaps TRIM_LASTHOP
    set).  The simulator trims packets it never encodes with this."""
    dma_len = pkt.dma_len if pkt.dma_len >= 0 else pkt.offset + len(byte_view(pkt.payload))
    return DataPacket(
        pkt.qpn, pkt.psn, pkt.va, pkt.rkey, b"", pkt.ev, pkt.port, pkt.tx_seq, pkt.ts_ns,
        pkt.flags | TRIMMED | (TRIM_LASTHOP if lasthop else 0), pkt.imm,
        dma_len, pkt.msn, pkt.offset, pkt.rq_msn,
    )  # fmt: skip


#: Header bytes of the packets whose length does not depend on their fields.
_FIXED_HEADER_LEN: Final[dict[type, int]] = {
    ProbePacket: PROBE_HDR_LEN,
    PortStatusPacket: PROBE_HDR_LEN,
    ProbeReplyPacket: PROBE_REPLY_HDR_LEN,
    ReliabilityProbePacket: RELIABILITY_PROBE_HDR_LEN,
    AcknowledgePacket: ACKNOWLEDGE_HDR_LEN,
}


def encoded_length(pkt: Packet, trailer_len: int) -> int:
    """``len(encode(pkt, integrity))`` without encoding, for an integrity whose trailer is
    ``trailer_len`` bytes (a trimmed write has none)."""
    kind = type(pkt)
    if kind is DataPacket:
        data: DataPacket = pkt  # type: ignore[assignment]
        hlen = DATA_HDR_LEN if data.imm is None else DATA_IMM_HDR_LEN
        if data.flags & TRIMMED:
            return hlen
        return hlen + len(byte_view(data.payload)) + trailer_len
    if kind is AckPacket:
        ack: AckPacket = pkt  # type: ignore[assignment]
        return (NACK_HDR_LEN if ack.nack_reason else SACK_HDR_LEN) + trailer_len
    try:
        return _FIXED_HEADER_LEN[kind] + trailer_len
    except KeyError:
        raise WireUsageError(f"not an MRC packet: {kind.__name__}") from None


def peek_qpn(data: BytesLike) -> int:
    """Destination QP number from the BTH, to demultiplex before a full decode."""
    try:
        view = memoryview(data).cast("B")
    except TypeError as exc:
        raise DecodeError(DecodeReason.BAD_FIELD, f"not a byte buffer: {exc}") from None
    if len(view) < BTH_LEN:
        raise DecodeError(DecodeReason.TRUNCATED, f"{len(view)} bytes is shorter than a BTH")
    return int.from_bytes(view[BTH_QPN_BYTES], "big")


def probe_id(data: BytesLike) -> int:
    """The probe id of an endpoint datagram (QP 2): the low 16 bits of its BTH PSN (the
    caller has checked that it holds a BTH)."""
    return int.from_bytes(data[BTH_PROBE_ID_BYTES], "big")


def has_extension(data: BytesLike) -> bool:
    """Whether a control packet (SACK, NACK, probes and their answers) says that mrcstack's
    extension follows its OCP header (the 5-bit next header).  A write does not say (the
    QP's negotiation does); nor does an ACKNOWLEDGE, which never carries one."""
    if len(data) < BTH_LEN + 2 or data[0] in WRITE_OPCODES or data[0] == Opcode.ACKNOWLEDGE:
        return False
    return next_of(data[BTH_LEN], data[BTH_LEN + 1]) == NEXT_EXT


def flags_aead_tag(data: BytesLike) -> bool:
    """Whether a control packet with mrcstack's extension (:func:`has_extension`) flags an
    AES-GCM tag as its trailer, not the ICRC: which integrity to open it with, without
    trying both.  False for anything too short to say (its decode then says why)."""
    opcode = data[0] if len(data) else -1
    hlen = _HEADER_LEN.get(opcode)
    if hlen is None or opcode in WRITE_OPCODES or len(data) < hlen:
        return False
    ext_len = XETH_LEN if opcode in XETH_OPCODES else XFETH_LEN
    return bool(data[hlen - ext_len + 1] & _TAG)


def decode(data: BytesLike, integrity: Integrity) -> Packet:
    """Parse and verify one datagram of a QP that negotiated mrcstack's extension; raises
    DecodeError and nothing else on bad input.

    In CRC and authenticate-only modes a write's payload is a memoryview slice of ``data``
    (no copy): it stays valid only while the caller keeps that buffer unchanged.
    """
    try:
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        size = len(view)
        if size < BTH_LEN:
            raise DecodeError(DecodeReason.TRUNCATED, f"{size} bytes is shorter than a BTH")
        opcode = view[0]
        if opcode in WRITE_OPCODES:
            return _decode_data(view, size, integrity)
        hlen = _HEADER_LEN.get(opcode)
        if hlen is None:
            raise DecodeError(DecodeReason.BAD_OPCODE, f"opcode {opcode:#04x} is not one we take")
        if size < hlen:
            raise truncated(size, hlen)
        if opcode == Opcode.ACKNOWLEDGE:
            return plain.decode_acknowledge(view, size, integrity, 0, 0)
        return _decode_control(view, size, hlen, integrity)
    except DecodeError:
        raise
    except (struct.error, ValueError, TypeError, IndexError, OverflowError, BufferError) as exc:
        raise DecodeError(DecodeReason.BAD_FIELD, f"malformed packet: {exc}") from None


def _decode_control(view: memoryview, size: int, hlen: int, integrity: Integrity) -> Packet:
    """SACK, NACK, EV probe and probe reply: headers and trailer only, no payload."""
    opcode = view[0]
    ext_len = XETH_LEN if opcode in XETH_OPCODES else XFETH_LEN
    if view[hlen - ext_len] != MRC_EXT_VERSION:
        raise DecodeError(
            DecodeReason.BAD_VERSION, f"mrcstack extension version {view[hlen - ext_len]}"
        )
    if view[hlen - ext_len + 1] & _TAG != integrity.tag_flag:
        raise _trailer_mismatch(integrity)
    tlen = integrity.trailer_len
    if size != hlen + tlen:
        reason = DecodeReason.TRUNCATED if size < hlen + tlen else DecodeReason.BAD_LENGTH
        raise DecodeError(reason, f"{size} bytes, opcode {opcode:#04x} needs {hlen + tlen}")
    _verify_hdr_check(view, hlen)
    if next_of(view[BTH_LEN], view[BTH_LEN + 1]) != NEXT_EXT:
        raise bad("the next header does not name mrcstack's extension")
    if opcode == Opcode.RELIABILITY_SACK:
        pkt: Packet = _sack_fields(view)
    elif opcode == Opcode.RELIABILITY_NACK:
        pkt = _nack_fields(view)
    elif opcode == Opcode.ENDPOINT_REQUEST:
        pkt = _probe_fields(view)
    elif opcode == Opcode.RELIABILITY_PROBE_REQ:
        pkt = _reliability_probe_fields(view)
    else:
        pkt = _probe_reply_fields(view)
    integrity.open(view[:hlen], view[hlen:hlen], view[hlen:], pkt.tx_seq, pkt.port, pkt.ev)
    return pkt


def _trailer_mismatch(integrity: Integrity) -> DecodeError:
    """A packet whose extension names the other trailer than this QP's mode."""
    if integrity.tag_flag:
        return bad("the extension flags an ICRC trailer: this QP authenticates with AES-GCM")
    return bad("the extension flags an AES-GCM tag: this QP checks the ICRC")


def _verify_hdr_check(view: memoryview, hlen: int) -> None:
    """Fast hdr_check for headers whose switch-writable bits are clear."""
    end = hlen - HDR_CHECK_LEN
    expected = zlib.crc32(_ZERO_CHECK, zlib.crc32(view[:end]))
    if expected != _U32.unpack_from(view, end)[0]:
        raise DecodeError(DecodeReason.BAD_HEADER_CHECK, "header CRC does not match")


def _decode_data(view: memoryview, size: int, integrity: Integrity) -> DataPacket:
    opcode = view[0]
    if opcode in IMM_OPCODES:
        hlen = DATA_IMM_HDR_LEN
        if size < hlen:
            raise truncated(size, hlen)
        (
            _, bth1, pkey, qpn, psn_word, rq_msn, msn, ts16_, ts_ftype, va, rkey, dma_len, imm,
            version, xflags, port, rsvd, ev, tx_seq, ts_ns, offset, hdr_check,
        ) = _DATA_IMM.unpack_from(view)  # fmt: skip
    else:
        hlen = DATA_HDR_LEN
        if size < hlen:
            raise truncated(size, hlen)
        (
            _, bth1, pkey, qpn, psn_word, rq_msn, msn, ts16_, ts_ftype, va, rkey, dma_len,
            version, xflags, port, rsvd, ev, tx_seq, ts_ns, offset, hdr_check,
        ) = _DATA.unpack_from(view)  # fmt: skip
        imm = None
    if version != MRC_EXT_VERSION:
        raise DecodeError(DecodeReason.BAD_VERSION, f"mrcstack extension version {version}")
    tlen = integrity.trailer_len
    if xflags & TRIMMED:
        if size != hlen:
            raise DecodeError(
                DecodeReason.BAD_LENGTH, f"trimmed packet of {size} bytes, must be {hlen}"
            )
    elif size < hlen + tlen:
        raise DecodeError(DecodeReason.TRUNCATED, f"{size} bytes leaves no room for trailer")
    if xflags & _SWITCH:  # rare: the generic check, which ignores the switch's bits
        expected = crc32_header(view[:hlen])
    else:
        expected = zlib.crc32(_ZERO_CHECK, zlib.crc32(view[: hlen - HDR_CHECK_LEN]))
    if expected != hdr_check:
        raise DecodeError(DecodeReason.BAD_HEADER_CHECK, "header CRC does not match")
    if xflags & _TAG != integrity.tag_flag:
        raise _trailer_mismatch(integrity)
    bth8 = psn_word >> U24_SHIFT
    if (
        bth1
        or pkey != BTH_PKEY
        or qpn >> U24_SHIFT
        or bth8 & ~(BTH_RTX | BTH_ACK_REQ) != BTH_TS  # mrcstack always sends a TSETH
        or rsvd
        or ts_ftype != FTYPE
        or ts16_ != (ts_ns >> TS_UNIT_NS_SHIFT) & TS_MASK
        or xflags & _NOT_SENDER_OR_SWITCH
        or (xflags & TRIM_LASTHOP and not xflags & TRIMMED)
    ):
        raise bad("reserved, P_Key, TSETH or flag bits invalid")
    flags = OPCODE_FLAGS[opcode] | xflags & _SWITCH | (RETX if bth8 & BTH_RTX else 0)
    if bth8 & BTH_ACK_REQ:
        flags |= ACK_REQ
    psn = psn_word & PSN_MASK
    if xflags & TRIMMED:
        if offset > dma_len or (flags & FIRST and offset):
            raise DecodeError(
                DecodeReason.BAD_LENGTH, f"offset {offset} outside a write of {dma_len} bytes"
            )
        return DataPacket(
            qpn, psn, va, rkey, b"", ev, port, tx_seq, ts_ns, flags, imm, dma_len, msn, offset,
            rq_msn,
        )  # fmt: skip
    end = size - tlen
    paylen = end - hlen
    if (
        offset + paylen > dma_len
        or (flags & FIRST and offset)
        or (flags & LAST and offset + paylen != dma_len)
    ):
        raise DecodeError(
            DecodeReason.BAD_LENGTH,
            f"{paylen} payload bytes at offset {offset} of a {dma_len}-byte write "
            f"({Opcode(opcode).name})",
        )
    payload = integrity.open_at(view, hlen, end, tx_seq, port, ev)
    return DataPacket(
        qpn, psn, va, rkey, payload, ev, port, tx_seq, ts_ns, flags, imm, dma_len, msn, offset,
        rq_msn,
    )  # fmt: skip


def _feedback_flags(bth8: int, cc: int, xflags: int) -> int:
    """The AckPacket flags from the BTH's byte 8, the cc byte and XFETH's flags; BAD_FIELD
    for a bit none of them defines."""
    if bth8 & ~BTH_RTX or cc & 0x0F & ~CC_ECN or xflags & ~(DUPLICATE | _TAG):
        raise bad("feedback flag bits invalid")
    return xflags & DUPLICATE | (ECN_ECHO if cc & CC_ECN else 0) | (FB_RETX if bth8 else 0)


def _sack_fields(view: memoryview) -> AckPacket:
    (
        _, bth1, pkey, qpn, psn_word,
        _, b1, ack_off, entropy, scid, dcid, cack_word, cc, mpr, sack_off, bitmap,
        ts_echo, ooo, rcv_word,
        _, xflags, port, xrsvd, ev, tx_seq, echo_ts_ns, msn, port_state, xrsvd2, _,
    ) = _SACK.unpack_from(view)  # fmt: skip
    check_bth(bth1, pkey, qpn)
    skip = b1 >> SETH_M_SHIFT & 3
    if (
        psn_word & PSN_MASK != cack_word
        or b1 & SETH_BYTE1_RESERVED
        or skip not in SKIPS
        or dcid != qpn & 0xFFFF
        or ooo >> 15
        or rcv_word >> 24
        or ts_echo != ts16(echo_ts_ns)
        or xrsvd
        or xrsvd2
        or msn >> 24
    ):
        raise bad("SACK reserved, copied or flag fields invalid")
    flags = _feedback_flags(psn_word >> U24_SHIFT, cc, xflags)
    if b1 & SETH_PR:
        flags |= PROBE_RESPONSE
    return AckPacket(
        qpn, cack_word, msn, ev, port, tx_seq, entropy, signed_psn(cack_word, ack_off),
        echo_ts_ns, signed_psn(cack_word, sack_off), bitmap, port_state, flags, 0, skip, ooo,
        rcv_word, mpr * MPR_UNIT, cc >> 4, scid,
    )  # fmt: skip


def _nack_fields(view: memoryview) -> AckPacket:
    (
        _, bth1, pkey, qpn, psn_word,
        _, b1, reason, vendor, entropy, scid, dcid, nack_word, cc, rsvd, ts,
        _, xflags, port, xrsvd, ev, tx_seq, echo_ts_ns, msn, port_state, xrsvd2, _,
    ) = _NACK.unpack_from(view)  # fmt: skip
    check_bth(bth1, pkey, qpn)
    if (
        psn_word & PSN_MASK != nack_word
        or b1 & BYTE1_RESERVED
        or vendor
        or dcid != qpn & 0xFFFF
        or rsvd
        or ts != ts16(echo_ts_ns)
        or xrsvd
        or xrsvd2
        or msn >> 24
    ):
        raise bad("NACK reserved or copied fields invalid")
    if reason not in NACK_REASONS:
        raise bad(f"unknown NACK reason {reason:#04x}")
    flags = _feedback_flags(psn_word >> U24_SHIFT, cc, xflags)
    return AckPacket(
        qpn, nack_word, msn, ev, port, tx_seq, entropy, nack_word, echo_ts_ns, nack_word, 0,
        port_state, flags, reason, 0, 0, 0, 0, cc >> 4, scid,
    )  # fmt: skip


def _probe_fields(view: memoryview) -> ProbePacket | PortStatusPacket:
    (
        _, bth1, pkey, qpn, psn_word,
        _, b1, rsvd, vendor, mask, rsvd2, ts, ftype,
        _, xflags, port, xrsvd, ev, tx_seq, ts_ns, xoffset, _,
    ) = _PROBE.unpack_from(view)  # fmt: skip
    check_bth(bth1, pkey, qpn)
    op = b1 & 3
    if (
        qpn != ENDPOINT_QPN
        or psn_word >> 16
        or b1 & ERTH_BYTE1_RESERVED
        or op not in (EndpointOp.EV_PROBE, EndpointOp.PORT_STATUS_UPDATE)
        or rsvd
        or vendor
        or rsvd2
        or ts != ts16(ts_ns)
        or ftype != FTYPE
        or xflags & ~_TAG
        or xrsvd
        or xoffset
    ):
        raise bad("endpoint request QP, PSN, reserved, op or copied fields invalid")
    if op == EndpointOp.PORT_STATUS_UPDATE:
        return PortStatusPacket(qpn, mask, ev, port, tx_seq, ts_ns, psn_word)
    return ProbePacket(qpn, ev, port, tx_seq, ts_ns, mask, psn_word)


def _reliability_probe_fields(view: memoryview) -> ReliabilityProbePacket:
    (
        _, bth1, pkey, qpn, psn_word,
        _, b1, r2, vendor, probe_id, r3, scid, dcid, ts, ftype,
        _, xflags, port, xrsvd, ev, tx_seq, ts_ns, xoffset, _,
    ) = _RELIABILITY_PROBE.unpack_from(view)  # fmt: skip
    check_bth(bth1, pkey, qpn)
    if (
        psn_word
        or b1 & BYTE1_RESERVED
        or r2
        or vendor
        or r3
        or dcid != qpn & 0xFFFF
        or ts != ts16(ts_ns)
        or ftype != FTYPE
        or xflags & ~_TAG
        or xrsvd
        or xoffset
    ):
        raise bad("reliability probe PSN, reserved or copied fields invalid")
    return ReliabilityProbePacket(qpn, probe_id, ev, port, tx_seq, ts_ns, scid)


def _probe_reply_fields(view: memoryview) -> ProbeReplyPacket:
    (
        _, bth1, pkey, qpn, psn_word,
        _, b1, rsvd, r1, r2, r3, r4, ts, r5, r6,
        _, xflags, port, xrsvd, ev, tx_seq, echo_ts_ns, msn, port_state, xrsvd2, _,
    ) = _PROBE_REPLY.unpack_from(view)  # fmt: skip
    check_bth(bth1, pkey, qpn)
    if (
        qpn != ENDPOINT_QPN
        or psn_word >> 16
        or b1 & EETH_BYTE1_RESERVED
        or rsvd
        or r1
        or r2
        or r3
        or r4
        or r5
        or r6
        or ts != ts16(echo_ts_ns)
        or xflags & ~_TAG
        or xrsvd
        or xrsvd2
        or msn
    ):
        raise bad("endpoint response QP, PSN, reserved or copied fields invalid")
    op = b1 >> EETH_OP_SHIFT & 3
    if op not in (EndpointOp.EV_PROBE, EndpointOp.PORT_STATUS_UPDATE):
        raise bad(f"endpoint response op {op}")
    return ProbeReplyPacket(qpn, ev, port, tx_seq, psn_word, echo_ts_ns, port_state, op)
