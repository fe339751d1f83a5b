"""MRC packets as OCP MRC 1.0 lays them out alone: no mrcstack extension header.

This is what a QP sends and takes when its peer speaks only the specification (a NIC, or an
mrcd that did not negotiate the extension).  What the extension would have carried comes
from elsewhere, and the caller supplies it:

- the packet's EV: from the UDP source port and the IPv6 flow label it arrived with
  (:func:`mrcstack.wire.evformat.ev_from_outer`; a sender stripes its EV there in every
  format), passed as ``ev``;
- the NIC port (plane) it arrived on, ``port``;
- whether a switch trimmed it: the traffic class's DSCP, 12 (TRIMMED) or 16 (TRIMMED on the
  last hop), passed as ``tclass``: a trimmed write's payload and trailer are cut off, so its
  headers are all that is read;
- time: the 16-bit timestamps (1.024 us units) come back as ``ts16 << 10`` nanoseconds, for
  the connection to widen against its own clock; a write without a TSETH has ``ts_ns = -1``.

A write here says where it goes (RETH) but not where it sits in its write: its ``offset`` is
0 for a first packet, the DMA length minus the payload for a last one, and -1 for a middle
one, which the connection places from the write's other packets (``docs/wire-format.md``).
There is no ``tx_seq``, so AES-GCM (whose nonce it is) needs the extension: only the ICRC
trailer is used here.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from mrcstack.wire.integrity import (
    BTH_LEN,
    AeadIntegrity,
    DecodeError,
    DecodeReason,
    WireUsageError,
)
from mrcstack.wire.layout import (
    ACK_REQ,
    ACKNOWLEDGE_HDR_LEN,
    AETH,
    BTH,
    BTH_ACK_REQ,
    BTH_PKEY,
    BTH_RTX,
    BTH_TS,
    BYTE1_RESERVED,
    CC_ECN,
    CC_STATE,
    CC_STATE_LEN,
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
    NACK_REASONS,
    NETH,
    NETH_LEN,
    NEXT_NONE,
    OPCODE_FLAGS,
    PETH,
    PETH_LEN,
    PROBE_RESPONSE,
    RETH_LEN,
    RETX,
    SENDER_DATA_FLAGS,
    SETH,
    SETH_BYTE1_RESERVED,
    SETH_LEN,
    SETH_M_SHIFT,
    SETH_PR,
    SKIPS,
    TRIM_LASTHOP,
    TRIMMED,
    TS_UNIT_NS_SHIFT,
    TSETH_LEN,
    U24_SHIFT,
    WRITE,
    WRITE_NO_TS,
    ack_from_aeth,
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
    ENDPOINT_QPN,
    IMM_OPCODES,
    MPR_UNIT,
    PSN_MASK,
    WRITE_OPCODES,
    AcknowledgePacket,
    AckPacket,
    DataPacket,
    Dscp,
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
    "decode_acknowledge",
    "decode_plain",
    "encode_plain",
    "plain_encoded_length",
    "plain_header_length",
]

_TS_WORD = FTYPE  # TSETH/ERTH/PETH word after the timestamp: TSR 0, reserved 0, ftype 1
_VALID_FEEDBACK_FLAGS = ECN_ECHO | PROBE_RESPONSE | FB_RETX
_VALID_DATA_FLAGS = SENDER_DATA_FLAGS | TRIMMED | TRIM_LASTHOP
_TRIMMED_DSCP = {int(Dscp.TRIMMED): TRIMMED, int(Dscp.TRIMMED_LASTHOP): TRIMMED | TRIM_LASTHOP}
_BTH_S = struct.Struct(BTH)
_METH_TSETH_RETH = struct.Struct(">" + WRITE)
_METH_RETH = struct.Struct(">" + WRITE_NO_TS)
_IMM = struct.Struct(">I")
_SACK = struct.Struct(BTH + SETH + CC_STATE)
_NACK = struct.Struct(BTH + NETH)
_PROBE = struct.Struct(BTH + ERTH)
_PROBE_REPLY = struct.Struct(BTH + EETH)
_RELIABILITY_PROBE = struct.Struct(BTH + PETH)
_ACKNOWLEDGE = struct.Struct(BTH + AETH)
_CONTROL_LEN: dict[int, int] = {
    Opcode.RELIABILITY_SACK: BTH_LEN + SETH_LEN + CC_STATE_LEN,
    Opcode.RELIABILITY_NACK: BTH_LEN + NETH_LEN,
    Opcode.ENDPOINT_REQUEST: BTH_LEN + ERTH_LEN,
    Opcode.ENDPOINT_RESPONSE: BTH_LEN + EETH_LEN,
    Opcode.RELIABILITY_PROBE_REQ: BTH_LEN + PETH_LEN,
    Opcode.ACKNOWLEDGE: ACKNOWLEDGE_HDR_LEN,
}


def plain_header_length(opcode: int, tseth: bool = True) -> int:
    """Bytes of headers of a packet without the extension: a write's are BTH, METH,
    [TSETH], RETH, [ImmDt] (32 to 40, what a trim leaves)."""
    if opcode in WRITE_OPCODES:
        return (
            BTH_LEN + METH_LEN + RETH_LEN + (TSETH_LEN if tseth else 0)
            + (IMMDT_LEN if opcode in IMM_OPCODES else 0)
        )  # fmt: skip
    try:
        return _CONTROL_LEN[opcode]
    except (KeyError, TypeError):
        raise WireUsageError(f"unknown opcode {opcode!r}") from None


#: Header bytes of the control packets of one fixed size, by packet type.
_FIXED_LEN: dict[type, int] = {
    ProbePacket: _CONTROL_LEN[Opcode.ENDPOINT_REQUEST],
    PortStatusPacket: _CONTROL_LEN[Opcode.ENDPOINT_REQUEST],
    ProbeReplyPacket: _CONTROL_LEN[Opcode.ENDPOINT_RESPONSE],
    ReliabilityProbePacket: _CONTROL_LEN[Opcode.RELIABILITY_PROBE_REQ],
    AcknowledgePacket: ACKNOWLEDGE_HDR_LEN,
}


def plain_encoded_length(pkt: Packet, trailer_len: int) -> int:
    """``len(encode_plain(pkt, integrity))`` without encoding, for an integrity whose trailer
    is ``trailer_len`` bytes (a trimmed write has none)."""
    kind = type(pkt)
    if kind is DataPacket:
        data: DataPacket = pkt  # type: ignore[assignment]
        hlen = plain_header_length(write_opcode(data.flags, data.imm), data.ts_ns >= 0)
        if data.flags & TRIMMED:
            return hlen
        return hlen + len(byte_view(data.payload)) + trailer_len
    if kind is AckPacket:
        ack: AckPacket = pkt  # type: ignore[assignment]
        op = Opcode.RELIABILITY_NACK if ack.nack_reason else Opcode.RELIABILITY_SACK
        return _CONTROL_LEN[op] + trailer_len
    try:
        return _FIXED_LEN[kind] + trailer_len
    except KeyError:
        raise WireUsageError(f"not an MRC packet: {kind.__name__}") from None


def _crc_only(integrity: Integrity) -> None:
    if isinstance(integrity, AeadIntegrity):
        raise WireUsageError(
            "AES-GCM packet authentication needs mrcstack's extension headers (its nonce is "
            "their tx_seq): a QP without them uses the ICRC"
        )


def encode_plain(pkt: Packet, integrity: Integrity) -> bytes:
    """Serialize a packet as the specification alone lays it out (see the module's
    docstring for what is left out); raises WireUsageError for what it cannot carry."""
    _crc_only(integrity)
    kind = type(pkt)
    try:
        if kind is DataPacket:
            return _encode_data(pkt, integrity)  # type: ignore[arg-type]
        if kind is AckPacket:
            header = _ack_header(pkt)  # type: ignore[arg-type]
        elif kind is ProbePacket or kind is PortStatusPacket:
            header = _probe_header(pkt)  # type: ignore[arg-type]
        elif kind is ProbeReplyPacket:
            header = _reply_header(pkt)  # type: ignore[arg-type]
        elif kind is ReliabilityProbePacket:
            rp: ReliabilityProbePacket = pkt  # type: ignore[assignment]
            check_u24(rp, rp.qpn)
            header = _RELIABILITY_PROBE.pack(
                Opcode.RELIABILITY_PROBE_REQ, 0, BTH_PKEY, rp.qpn, 0, 0, 0, 0, 0, rp.probe_id,
                0, rp.scid, rp.qpn & 0xFFFF, ts16(rp.ts_ns), _TS_WORD,
            )  # fmt: skip
        elif kind is AcknowledgePacket:
            ak: AcknowledgePacket = pkt  # type: ignore[assignment]
            check_u24(ak, ak.qpn, ak.psn, ak.msn)
            header = _ACKNOWLEDGE.pack(
                Opcode.ACKNOWLEDGE, 0, BTH_PKEY, ak.qpn, ak.psn, ak.syndrome << U24_SHIFT | ak.msn
            )
        else:
            raise WireUsageError(f"not an MRC packet: {kind.__name__}")
    except struct.error as exc:
        raise field_error(pkt, exc) from None
    _, trailer = integrity.seal(header, b"", 0, pkt.port, pkt.ev)
    return header + trailer


def _encode_data(pkt: DataPacket, integrity: Integrity) -> bytes:
    flags = pkt.flags
    if not isinstance(flags, int) or flags & ~_VALID_DATA_FLAGS:
        raise WireUsageError(f"DataPacket.flags {flags!r} has bits outside RETX|FIRST|LAST|trim")
    payload = byte_view(pkt.payload)
    trimmed = flags & TRIMMED
    if trimmed and len(payload):
        raise WireUsageError("a trimmed DataPacket has no payload")
    if flags & TRIM_LASTHOP and not trimmed:
        raise WireUsageError("TRIM_LASTHOP is only valid together with TRIMMED")
    dma_len = pkt.dma_len
    offset = pkt.offset
    if dma_len == -1:
        dma_len = max(offset, 0) + len(payload)
    if offset >= 0:
        check_range(flags, offset, len(payload), dma_len, trimmed)
    elif flags & (FIRST | LAST) and not trimmed:
        raise WireUsageError("a first or last packet knows its offset in its write")
    check_u24(pkt, pkt.qpn, pkt.psn)
    imm = pkt.imm
    opcode = write_opcode(flags, imm)
    ts_ns = pkt.ts_ns
    bth8 = (BTH_RTX if flags & RETX else 0) | (BTH_ACK_REQ if flags & ACK_REQ else 0)
    try:
        bth = _BTH_S.pack(
            opcode,
            0,
            BTH_PKEY,
            pkt.qpn,
            (bth8 | (BTH_TS if ts_ns >= 0 else 0)) << U24_SHIFT | pkt.psn,
        )
        if ts_ns >= 0:
            rest = _METH_TSETH_RETH.pack(
                pkt.rq_msn, pkt.msn, ts16(ts_ns), _TS_WORD, pkt.va, pkt.rkey, dma_len
            )
        else:
            rest = _METH_RETH.pack(pkt.rq_msn, pkt.msn, pkt.va, pkt.rkey, dma_len)
        header = bth + rest + (b"" if imm is None else _IMM.pack(imm))
    except struct.error as exc:
        raise field_error(pkt, exc) from None
    if trimmed:
        return header
    body, trailer = integrity.seal(header, payload, 0, pkt.port, pkt.ev)
    return b"".join((header, body, trailer))


def _ack_header(pkt: AckPacket) -> bytes:
    """A SACK (BTH, SETH, CC_STATE) or a NACK (BTH, NETH): the SETH context ids carry the
    QPNs, received bytes count 256-byte units."""
    check_ack(pkt, _VALID_FEEDBACK_FLAGS)
    flags = pkt.flags
    cc = pkt.cc_type << 4 | (CC_ECN if flags & ECN_ECHO else 0)
    rtx = BTH_RTX << U24_SHIFT if flags & FB_RETX else 0
    if pkt.nack_reason == 0:
        cum = pkt.cum_psn
        return _SACK.pack(
            Opcode.RELIABILITY_SACK, 0, BTH_PKEY, pkt.qpn, rtx | cum,
            0, pkt.skip << SETH_M_SHIFT | (SETH_PR if flags & PROBE_RESPONSE else 0),
            psn_offset("echo_psn", pkt.echo_psn, cum), pkt.echo_ev, pkt.scid, pkt.qpn & 0xFFFF,
            cum, cc, pkt.window // MPR_UNIT, psn_offset("sack_base", pkt.sack_base, cum),
            pkt.sack_bitmap, ts16(pkt.echo_ts_ns), pkt.ooo_count, pkt.rcv_bytes,
        )  # fmt: skip
    psn = pkt.echo_psn
    return _NACK.pack(
        Opcode.RELIABILITY_NACK, 0, BTH_PKEY, pkt.qpn, rtx | psn, 0, 0, pkt.nack_reason, 0,
        pkt.echo_ev, pkt.scid, pkt.qpn & 0xFFFF, psn, cc, 0, ts16(pkt.echo_ts_ns),
    )  # fmt: skip


def _probe_header(pkt: ProbePacket | PortStatusPacket) -> bytes:
    if pkt.qpn != ENDPOINT_QPN:
        raise WireUsageError(f"endpoint operations go to QP {ENDPOINT_QPN}, not {pkt.qpn}")
    check_probe_id(pkt)
    op = EndpointOp.EV_PROBE if type(pkt) is ProbePacket else EndpointOp.PORT_STATUS_UPDATE
    return _PROBE.pack(
        Opcode.ENDPOINT_REQUEST, 0, BTH_PKEY, pkt.qpn, pkt.probe_id, 0, op, 0, 0,
        pkt.port_state, 0, ts16(pkt.ts_ns), _TS_WORD,
    )  # fmt: skip


def _reply_header(pkt: ProbeReplyPacket) -> bytes:
    if pkt.qpn != ENDPOINT_QPN:
        raise WireUsageError(f"endpoint operations go to QP {ENDPOINT_QPN}, not {pkt.qpn}")
    check_probe_id(pkt)
    if pkt.op not in (EndpointOp.EV_PROBE, EndpointOp.PORT_STATUS_UPDATE):
        raise WireUsageError(f"ProbeReplyPacket.op {pkt.op!r} is not an EndpointOp")
    return _PROBE_REPLY.pack(
        Opcode.ENDPOINT_RESPONSE, 0, BTH_PKEY, pkt.qpn, pkt.probe_id, 0,
        pkt.op << EETH_OP_SHIFT, 0, 0, 0, 0, 0, ts16(pkt.echo_ts_ns), 0, 0,
    )  # fmt: skip


def decode_plain(
    data: bytes | bytearray | memoryview,
    integrity: Integrity,
    *,
    ev: int = 0,
    port: int = 0,
    tclass: int = 0,
) -> Packet:
    """Parse and verify one datagram of a QP without mrcstack's extension; raises
    DecodeError and nothing else on bad input.  ``ev``, ``port`` and ``tclass`` are what the
    outer header and the plane said (see the module's docstring)."""
    _crc_only(integrity)
    try:
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        size = len(view)
        if size < BTH_LEN:
            raise DecodeError(DecodeReason.TRUNCATED, f"{size} bytes is shorter than a BTH")
        opcode = view[0]
        if opcode in WRITE_OPCODES:
            return _decode_data(view, size, integrity, ev, port, tclass)
        hlen = _CONTROL_LEN.get(opcode)
        if hlen is None:
            raise DecodeError(DecodeReason.BAD_OPCODE, f"opcode {opcode:#04x} is not one we take")
        if size < hlen:
            raise truncated(size, hlen)
        tlen = integrity.trailer_len
        if size != hlen + tlen:
            reason = DecodeReason.TRUNCATED if size < hlen + tlen else DecodeReason.BAD_LENGTH
            raise DecodeError(reason, f"{size} bytes, opcode {opcode:#04x} needs {hlen + tlen}")
        if opcode == Opcode.ACKNOWLEDGE:
            return decode_acknowledge(view, size, integrity, ev, port)
        if next_of(view[BTH_LEN], view[BTH_LEN + 1]) != NEXT_NONE:
            raise bad("an extension follows that this QP did not negotiate (or type not 0)")
        pkt = _control(view, opcode, ev, port)
        integrity.open(view[:hlen], view[hlen:hlen], view[hlen:], 0, port, ev)
        return pkt
    except DecodeError:
        raise
    except (struct.error, ValueError, TypeError, IndexError, OverflowError, BufferError) as exc:
        raise DecodeError(DecodeReason.BAD_FIELD, f"malformed packet: {exc}") from None


def decode_acknowledge(
    view: memoryview, size: int, integrity: Integrity, ev: int, port: int
) -> AcknowledgePacket:
    """An ACKNOWLEDGE (BTH + AETH + trailer), the same with or without the extension."""
    hlen = ACKNOWLEDGE_HDR_LEN
    tlen = integrity.trailer_len
    if size != hlen + tlen:
        reason = DecodeReason.TRUNCATED if size < hlen + tlen else DecodeReason.BAD_LENGTH
        raise DecodeError(reason, f"{size} bytes, an ACKNOWLEDGE needs {hlen + tlen}")
    _, bth1, pkey, qpn, psn_word, word = _ACKNOWLEDGE.unpack_from(view)
    check_bth(bth1, pkey, qpn)
    if psn_word >> U24_SHIFT:
        raise bad("ACKNOWLEDGE BTH flags set")
    pkt = ack_from_aeth(qpn, psn_word, word, ev, port)
    integrity.open(view[:hlen], view[hlen:hlen], view[hlen:], 0, port, ev)
    return pkt


def _decode_data(
    view: memoryview, size: int, integrity: Integrity, ev: int, port: int, tclass: int
) -> DataPacket:
    opcode = view[0]
    if size < BTH_LEN + METH_LEN + RETH_LEN:
        raise truncated(size, BTH_LEN + METH_LEN + RETH_LEN)
    _, bth1, pkey, qpn, psn_word = _BTH_S.unpack_from(view)
    check_bth(bth1, pkey, qpn)
    bth8 = psn_word >> U24_SHIFT
    if bth8 & ~(BTH_ACK_REQ | BTH_RTX | BTH_TS):
        raise bad("BTH R or reserved bits set")
    hlen = plain_header_length(opcode, bool(bth8 & BTH_TS))
    if size < hlen:
        raise truncated(size, hlen)
    if bth8 & BTH_TS:
        rq_msn, msn, ts, ts_word, va, rkey, dma_len = _METH_TSETH_RETH.unpack_from(view, BTH_LEN)
        if ts_word != _TS_WORD:
            raise bad("TSETH TSR, reserved or ftype not (0, 0, 1)")
        ts_ns = ts << TS_UNIT_NS_SHIFT
    else:
        rq_msn, msn, va, rkey, dma_len = _METH_RETH.unpack_from(view, BTH_LEN)
        ts_ns = -1
    imm = _IMM.unpack_from(view, hlen - IMMDT_LEN)[0] if opcode in IMM_OPCODES else None
    flags = OPCODE_FLAGS[opcode]
    if bth8 & BTH_RTX:
        flags |= RETX
    if bth8 & BTH_ACK_REQ:
        flags |= ACK_REQ
    psn = psn_word & PSN_MASK
    trim = _TRIMMED_DSCP.get(tclass >> 2)
    if trim is not None:  # a switch cut the payload and the trailer: the headers are all
        offset = 0 if flags & FIRST else -1
        return DataPacket(
            qpn, psn, va, rkey, b"", ev, port, 0, ts_ns, flags | trim, imm, dma_len, msn,
            offset, rq_msn,
        )  # fmt: skip
    tlen = integrity.trailer_len
    if size < hlen + tlen:
        raise DecodeError(DecodeReason.TRUNCATED, f"{size} bytes leaves no room for trailer")
    end = size - tlen
    paylen = end - hlen
    if flags & LAST:
        offset = dma_len - paylen
    elif flags & FIRST:
        offset = 0
    else:
        offset = -1
    if paylen > dma_len or (flags & FIRST and flags & LAST and paylen != dma_len):
        raise DecodeError(
            DecodeReason.BAD_LENGTH,
            f"{paylen} payload bytes in a {dma_len}-byte write ({Opcode(opcode).name})",
        )
    payload = integrity.open(view[:hlen], view[hlen:end], view[end:], 0, port, ev)
    return DataPacket(
        qpn, psn, va, rkey, payload, ev, port, 0, ts_ns, flags, imm, dma_len, msn, offset, rq_msn
    )


def _control(view: memoryview, opcode: int, ev: int, port: int) -> Packet:
    if opcode == Opcode.RELIABILITY_SACK:
        return _sack(view, ev, port)
    if opcode == Opcode.RELIABILITY_NACK:
        return _nack(view, ev, port)
    if opcode == Opcode.ENDPOINT_REQUEST:
        return _probe(view, ev, port)
    if opcode == Opcode.ENDPOINT_RESPONSE:
        return _reply(view, ev, port)
    return _reliability_probe(view, ev, port)


def _flags(bth8: int, cc: int) -> int:
    if bth8 & ~BTH_RTX or cc & 0x0F & ~CC_ECN:
        raise bad("feedback flag bits invalid")
    return (ECN_ECHO if cc & CC_ECN else 0) | (FB_RETX if bth8 else 0)


def _sack(view: memoryview, ev: int, port: int) -> AckPacket:
    (
        _, bth1, pkey, qpn, psn_word,
        _, b1, ack_off, entropy, scid, dcid, cack_word, cc, mpr, sack_off, bitmap,
        ts_echo, ooo, rcv_word,
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
    ):
        raise bad("SACK reserved, copied or flag fields invalid")
    flags = _flags(psn_word >> U24_SHIFT, cc)
    if b1 & SETH_PR:
        flags |= PROBE_RESPONSE
    return AckPacket(
        qpn, cack_word, 0, ev, port, 0, entropy, signed_psn(cack_word, ack_off),
        ts_echo << TS_UNIT_NS_SHIFT, signed_psn(cack_word, sack_off), bitmap, 0, flags, 0,
        skip, ooo, rcv_word, mpr * MPR_UNIT, cc >> 4, scid,
    )  # fmt: skip


def _nack(view: memoryview, ev: int, port: int) -> AckPacket:
    (
        _, bth1, pkey, qpn, psn_word,
        _, b1, reason, vendor, entropy, scid, dcid, nack_word, cc, rsvd, ts,
    ) = _NACK.unpack_from(view)  # fmt: skip
    check_bth(bth1, pkey, qpn)
    if psn_word & PSN_MASK != nack_word or b1 & BYTE1_RESERVED or vendor or dcid != qpn & 0xFFFF:
        raise bad("NACK reserved or copied fields invalid")
    if rsvd:
        raise bad("NACK reserved byte set")
    if reason not in NACK_REASONS:
        raise bad(f"unknown NACK reason {reason:#04x}")
    return AckPacket(
        qpn, nack_word, 0, ev, port, 0, entropy, nack_word, ts << TS_UNIT_NS_SHIFT, nack_word,
        0, 0, _flags(psn_word >> U24_SHIFT, cc), reason, 0, 0, 0, 0, cc >> 4, scid,
    )  # fmt: skip


def _probe(view: memoryview, ev: int, port: int) -> ProbePacket | PortStatusPacket:
    _, bth1, pkey, qpn, psn_word, _, b1, rsvd, vendor, mask, rsvd2, ts, ts_word = (
        _PROBE.unpack_from(view)
    )
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
        or ts_word != _TS_WORD
    ):
        raise bad("endpoint request QP, PSN, reserved, op or ftype invalid")
    ts_ns = ts << TS_UNIT_NS_SHIFT
    if op == EndpointOp.PORT_STATUS_UPDATE:
        return PortStatusPacket(qpn, mask, ev, port, 0, ts_ns, psn_word)
    return ProbePacket(qpn, ev, port, 0, ts_ns, mask, psn_word)


def _reply(view: memoryview, ev: int, port: int) -> ProbeReplyPacket:
    (_, bth1, pkey, qpn, psn_word, _, b1, rsvd, r1, r2, r3, r4, ts, r5, r6) = (
        _PROBE_REPLY.unpack_from(view)
    )
    check_bth(bth1, pkey, qpn)
    op = b1 >> EETH_OP_SHIFT & 3
    if (
        qpn != ENDPOINT_QPN
        or psn_word >> 16
        or b1 & EETH_BYTE1_RESERVED
        or op not in (EndpointOp.EV_PROBE, EndpointOp.PORT_STATUS_UPDATE)
        or rsvd
        or r1
        or r2
        or r3
        or r4
        or r5
        or r6
    ):
        raise bad("endpoint response QP, PSN, reserved or op invalid")
    return ProbeReplyPacket(qpn, ev, port, 0, psn_word, ts << TS_UNIT_NS_SHIFT, 0, op)


def _reliability_probe(view: memoryview, ev: int, port: int) -> ReliabilityProbePacket:
    (_, bth1, pkey, qpn, psn_word, _, b1, r2, vendor, probe_id, r3, scid, dcid, ts, ts_word) = (
        _RELIABILITY_PROBE.unpack_from(view)
    )
    check_bth(bth1, pkey, qpn)
    if (
        psn_word
        or b1 & BYTE1_RESERVED
        or r2
        or vendor
        or r3
        or dcid != qpn & 0xFFFF
        or ts_word != _TS_WORD
    ):
        raise bad("reliability probe PSN, reserved or ftype invalid")
    return ReliabilityProbePacket(qpn, probe_id, ev, port, 0, ts << TS_UNIT_NS_SHIFT, scid)
