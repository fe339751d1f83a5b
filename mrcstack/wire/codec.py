"""Encode and decode MRC packets: pure functions over the layout in ``mrcstack.wire.packets``.

``encode`` packs a packet dataclass, computes ``hdr_check`` and asks an ``Integrity`` for the
trailer.  ``decode`` is the only door for bytes from the network: it returns a valid packet
or raises ``DecodeError``, never anything else, whatever the input.  Writes are the hot path:
one precompiled ``struct`` per layout, one CRC for the header, no copy of the payload on
receive (a memoryview slice of the datagram is returned).

Every choice made where the public description of OCP MRC 1.0 is ambiguous is a constant in
the "Readings" block below, so a correction is one edit (``docs/wire-format.md`` lists them).
"""

from __future__ import annotations

import struct
import zlib
from typing import TYPE_CHECKING

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
from mrcstack.wire.packets import (
    IMM_OPCODES,
    MAX_WINDOW,
    MPR_UNIT,
    MRC_EXT_VERSION,
    PSN_MASK,
    PSN_MOD,
    SWITCH_FLAGS,
    WRITE_OPCODES,
    XETH_OPCODES,
    AckPacket,
    BthFlags,
    DataFlags,
    DataPacket,
    EndpointOp,
    FeedbackFlags,
    NackReason,
    Opcode,
    Packet,
    PortStatusPacket,
    ProbePacket,
    ProbeReplyPacket,
    ReliabilityProbePacket,
    SkipHint,
)

if TYPE_CHECKING:
    from mrcstack.wire.integrity import Integrity

__all__ = [
    "BTH_LEN",
    "BTH_PKEY",
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
    "encode_trimmed",
    "encoded_length",
    "header_length",
    "peek_qpn",
    "trim",
    "trimmed_length",
    "write_opcode",
]

METH_LEN = 4
TSETH_LEN = 4
RETH_LEN = 16
IMMDT_LEN = 4
SETH_LEN = 28
CC_STATE_LEN = 8
NETH_LEN = 20
ERTH_LEN = 16
EETH_LEN = 36
PETH_LEN = 16
DATA_HDR_LEN = BTH_LEN + METH_LEN + TSETH_LEN + RETH_LEN + XETH_LEN  # 68: a trimmed write
DATA_IMM_HDR_LEN = DATA_HDR_LEN + IMMDT_LEN  # 72
SACK_HDR_LEN = BTH_LEN + SETH_LEN + CC_STATE_LEN + XFETH_LEN  # 84
NACK_HDR_LEN = BTH_LEN + NETH_LEN + SETH_LEN + CC_STATE_LEN + XFETH_LEN  # 104
PROBE_HDR_LEN = BTH_LEN + ERTH_LEN + XETH_LEN  # 60
PROBE_REPLY_HDR_LEN = BTH_LEN + EETH_LEN + XFETH_LEN  # 84
RELIABILITY_PROBE_HDR_LEN = BTH_LEN + PETH_LEN + XETH_LEN  # 60
BTH_PKEY = 0xFFFF  # default partition key, as RoCEv2 NICs send
QPN_MASK = (1 << 24) - 1
_U24_SHIFT = 24  # a u24 field shares a u32 with the byte above it

# Readings: where the public record of OCP MRC 1.0 leaves a choice, this is ours.
#: TSETH/CC_STATE/NETH/ERTH timestamps: 16 bits of nanoseconds >> 10 (1.024 us units, the
#: spec's timer unit), wrapping every 67 ms.  Our own 64-bit time travels in XETH/XFETH.
TS_UNIT_NS_SHIFT = 10
_TS_MASK = 0xFFFF
_FTYPE = 0x1  # TSETH / ERTH / PETH ftype
#: Header type codes in the high nibble of an extension's byte 0; the low nibble names the
#: header after it (after CC_STATE for a SETH).  ``_NEXT_XETH`` is mrcstack's extension.
_TYPE_SETH = 0x1
_TYPE_NETH = 0x2
_TYPE_ERTH = 0x4
_TYPE_EETH = 0x5
_TYPE_PETH = 0x3
_NEXT_SETH = _TYPE_SETH
_NEXT_XETH = 0xF
#: SETH byte 1: ``m`` in bits 1-0, ``pr`` in bit 2.
_M_MASK = 0x03
#: SETH/NETH cc byte: cc_type in the high nibble (0: none named), flags low; flag bit 0 is
#: our ECN echo.
_CC_ECN = 0x01
#: SETH/NETH context ids: mrcstack addresses a QP by the BTH's DestQP; they are zero.

_TRIMMED = int(DataFlags.TRIMMED)
_TRIM_LASTHOP = int(DataFlags.TRIM_LASTHOP)
_SWITCH = int(SWITCH_FLAGS)
_RETX = int(DataFlags.RETX)
_LAST = int(DataFlags.LAST)
_FIRST = int(DataFlags.FIRST)
_SENDER_DATA_FLAGS = _RETX | _LAST | _FIRST
_VALID_DATA_FLAGS = _SENDER_DATA_FLAGS | _SWITCH
_BTH_RTX = int(BthFlags.RTX)
_BTH_TS = int(BthFlags.TS)
_ECN_ECHO = int(FeedbackFlags.ECN_ECHO)
_DUPLICATE = int(FeedbackFlags.DUPLICATE)
_VALID_FEEDBACK_FLAGS = _ECN_ECHO | _DUPLICATE
_NACK_REASONS = frozenset(int(r) for r in NackReason)
_SKIPS = frozenset(int(m) for m in SkipHint)
_XETH_FLAGS_FROM_END = XETH_LEN - 1  # flags byte offset, counted back from the header end

# opcode of a write from (first, last, has imm)
_WRITE_OPCODE = {
    (True, True, False): Opcode.RDMA_WRITE_ONLY,
    (True, True, True): Opcode.RDMA_WRITE_ONLY_IMM,
    (True, False, False): Opcode.RDMA_WRITE_FIRST,
    (False, False, False): Opcode.RDMA_WRITE_MIDDLE,
    (False, True, False): Opcode.RDMA_WRITE_LAST,
    (False, True, True): Opcode.RDMA_WRITE_LAST_IMM,
}
_OPCODE_FLAGS = {int(op): (_FIRST if f else 0) | (_LAST if la else 0)
                 for (f, la, _), op in _WRITE_OPCODE.items()}  # fmt: skip
# The same table keyed by FIRST|LAST flag bits, and whether there is an immediate.
_OPCODE_OF: dict[tuple[int, bool], Opcode] = {
    (flags, imm): op for (f, la, imm), op in _WRITE_OPCODE.items()
    for flags in [(_FIRST if f else 0) | (_LAST if la else 0)]
}  # fmt: skip

_BTH = ">BBHII"  # opcode, M/SE/PadCnt/TVer, P_Key, resv|DestQP, A/R/RTX/TS|PSN
_XETH = "BBBBIQQII"  # ver, flags, port, rsvd, ev, tx_seq, ts_ns, offset, hdr_check
_XFETH = "BBBBIQQIHHI"  # ver, flags, port, rsvd, ev, tx_seq, echo_ts_ns, msn, port_state,
#                         rsvd, hdr_check
_SETH = "BBhIHHIBBhQ"  # type|next, m|pr, ack_psn_offset, entropy, src ctx, dst ctx,
#                        rsvd|cack_psn, cc, MPR, sack_offset, bitmap
_CC_STATE = "HHI"  # ts echo, rsvd|ooo_count, R/C|penalty|received bytes
_NETH = "BBBBIHHIBBH"  # type|next, rsvd, reason, vendor, entropy, ctx, ctx, rsvd|psn, cc,
#                        rsvd, tx_timestamp
_ERTH = "BBBBIIHH"  # type|next, op, rsvd, vendor, port mask, rsvd, tx_timestamp, TSR|ftype
_PETH = "BBBBHHHHHH"  # type|next, rsvd, rsvd, vendor, probe id, rsvd, ctx, ctx, ts, TSR|ftype
_EETH = "BBHIIQQHHI"  # type|next, op, rsvd, entropy echo, port mask, 16 rsvd, ts echo,
#                       TSR|ftype, rsvd
_DATA = struct.Struct(_BTH + "HH" + "HH" + "QII" + _XETH)
_DATA_IMM = struct.Struct(_BTH + "HH" + "HH" + "QII" + "I" + _XETH)
_SACK = struct.Struct(_BTH + _SETH + _CC_STATE + _XFETH)
_NACK = struct.Struct(_BTH + _NETH + _SETH + _CC_STATE + _XFETH)
_PROBE = struct.Struct(_BTH + _ERTH + _XETH)
_PROBE_REPLY = struct.Struct(_BTH + _EETH + _XFETH)
_RELIABILITY_PROBE = struct.Struct(_BTH + _PETH + _XETH)
_U32 = struct.Struct(">I")
_ZERO_CHECK = bytes(HDR_CHECK_LEN)

_HEADER_LEN: dict[int, int] = {
    **{op: DATA_IMM_HDR_LEN if op in IMM_OPCODES else DATA_HDR_LEN for op in WRITE_OPCODES},
    Opcode.RELIABILITY_SACK: SACK_HDR_LEN,
    Opcode.RELIABILITY_NACK: NACK_HDR_LEN,
    Opcode.ENDPOINT_REQUEST: PROBE_HDR_LEN,
    Opcode.ENDPOINT_RESPONSE: PROBE_REPLY_HDR_LEN,
    Opcode.RELIABILITY_PROBE_REQ: RELIABILITY_PROBE_HDR_LEN,
}

# Wire width of every numeric field, for the error message when a pack fails.
_FIELD_BITS: dict[type, dict[str, int]] = {
    DataPacket: {
        "qpn": 24, "psn": 24, "va": 64, "rkey": 32, "ev": 32, "port": 8, "tx_seq": 64,
        "ts_ns": 64, "flags": 8, "imm": 32, "dma_len": 32, "msn": 16, "offset": 32,
    },
    AckPacket: {
        "qpn": 24, "cum_psn": 24, "msn": 24, "ev": 32, "port": 8, "tx_seq": 64, "echo_ev": 32,
        "echo_psn": 24, "echo_ts_ns": 64, "sack_base": 24, "sack_bitmap": 64,
        "port_state": 16, "flags": 8, "nack_reason": 8, "skip": 2, "ooo_count": 15,
        "rcv_bytes": 24,
    },
    ProbePacket: {"qpn": 24, "ev": 32, "port": 8, "tx_seq": 64, "ts_ns": 64, "port_state": 16},
    ProbeReplyPacket: {
        "qpn": 24, "ev": 32, "port": 8, "tx_seq": 64, "echo_ev": 32, "echo_ts_ns": 64,
        "port_state": 16,
    },
    ReliabilityProbePacket: {
        "qpn": 24, "probe_id": 16, "ev": 32, "port": 8, "tx_seq": 64, "ts_ns": 64,
    },
    PortStatusPacket: {
        "qpn": 24, "port_state": 16, "ev": 32, "port": 8, "tx_seq": 64, "ts_ns": 64,
    },
}  # fmt: skip


def header_length(opcode: int) -> int:
    """Bytes of headers (BTH through mrcstack's extension) for an opcode we send."""
    try:
        return _HEADER_LEN[opcode]
    except (KeyError, TypeError):
        raise WireUsageError(f"unknown opcode {opcode!r}") from None


def trimmed_length(opcode: int) -> int:
    """Length of a trimmed write: its headers only (68, or 72 with an immediate)."""
    if opcode not in WRITE_OPCODES:
        raise WireUsageError(f"only RDMA WRITE packets are trimmed, not opcode {opcode!r}")
    return _HEADER_LEN[opcode]


def write_opcode(flags: int, imm: int | None) -> Opcode:
    """The write opcode for a packet's FIRST/LAST flags and immediate."""
    try:
        return _OPCODE_OF[flags & (_FIRST | _LAST), imm is not None]
    except (KeyError, TypeError):
        raise WireUsageError("an immediate goes only on the last packet of a write") from None


def _ts16(ts_ns: int) -> int:
    return (ts_ns >> TS_UNIT_NS_SHIFT) & _TS_MASK


def _field_error(pkt: Packet, cause: Exception) -> WireUsageError:
    """Name the first field that does not fit its wire width (slow path, for errors only)."""
    for name, bits in _FIELD_BITS[type(pkt)].items():
        value = getattr(pkt, name)
        if name == "imm" and value is None:
            continue
        if name == "dma_len" and value == -1:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            return WireUsageError(f"{type(pkt).__name__}.{name} must be an int, got {value!r}")
        if not 0 <= value < 1 << bits:
            return WireUsageError(
                f"{type(pkt).__name__}.{name} = {value} does not fit in {bits} unsigned bits"
            )
    return WireUsageError(f"cannot encode {type(pkt).__name__}: {cause}")


def _byte_view(payload: object) -> bytes | memoryview:
    """The payload as bytes or a flat byte memoryview (so len() counts bytes)."""
    if type(payload) is bytes:
        return payload
    try:
        view = memoryview(payload)  # type: ignore[arg-type]
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    except TypeError as exc:
        raise WireUsageError(f"payload must be bytes-like and contiguous: {exc}") from None


def encode(pkt: Packet, integrity: Integrity) -> bytes:
    """Serialize a packet; raises WireUsageError (a ValueError) for out-of-range fields.

    A DataPacket whose flags include TRIMMED encodes to the trimmed form a switch would
    produce (headers only, RETH length = ``dma_len``), so trimmed packets round-trip too.
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
    raise WireUsageError(f"not an MRC packet: {kind.__name__}")


def _check_u24(pkt: Packet, *values: int) -> None:
    for value in values:
        if type(value) is not int or not 0 <= value <= PSN_MASK:
            raise _field_error(pkt, ValueError("24-bit field out of range"))


def _check_range(
    pkt: DataPacket, flags: int, offset: int, paylen: int, dma_len: int, trimmed: int
) -> None:
    """A write's packet lies inside it: the first at offset 0, the last at its end."""
    if type(offset) is not int or not 0 <= offset <= dma_len:
        raise WireUsageError(f"DataPacket.offset {offset!r} outside a {dma_len}-byte write")
    if flags & _FIRST and offset:
        raise WireUsageError(f"the first packet of a write has offset 0, not {offset}")
    if not trimmed and (
        offset + paylen > dma_len or (flags & _LAST and offset + paylen != dma_len)
    ):
        raise WireUsageError(
            f"{paylen} payload bytes at offset {offset} do not fit a {dma_len}-byte write"
        )


def _encode_data(pkt: DataPacket, integrity: Integrity) -> bytes:
    flags = pkt.flags
    if not isinstance(flags, int) or flags & ~_VALID_DATA_FLAGS:
        raise WireUsageError(f"DataPacket.flags {flags!r} has bits outside RETX|FIRST|LAST|trim")
    payload = _byte_view(pkt.payload)
    trimmed = flags & _TRIMMED
    offset = pkt.offset
    dma_len = pkt.dma_len
    if trimmed:
        if len(payload):
            raise WireUsageError("a trimmed DataPacket has no payload")
    elif flags & _TRIM_LASTHOP:
        raise WireUsageError("TRIM_LASTHOP is only valid together with TRIMMED")
    elif dma_len == -1:
        dma_len = offset + len(payload)  # the write ends with this packet
    _check_range(pkt, flags, offset, len(payload), dma_len, trimmed)
    _check_u24(pkt, pkt.qpn, pkt.psn)
    imm = pkt.imm
    opcode = write_opcode(flags, imm)
    bth8 = _BTH_TS | (_BTH_RTX if flags & _RETX else 0)
    ts_ns = pkt.ts_ns
    try:
        if imm is None:
            hlen = DATA_HDR_LEN
            header = bytearray(hlen)
            _DATA.pack_into(
                header, 0, opcode, 0, BTH_PKEY, pkt.qpn, bth8 << _U24_SHIFT | pkt.psn,
                0, pkt.msn, (ts_ns >> TS_UNIT_NS_SHIFT) & _TS_MASK, _FTYPE,
                pkt.va, pkt.rkey, dma_len,
                MRC_EXT_VERSION, 0, pkt.port, 0, pkt.ev, pkt.tx_seq, ts_ns, offset, 0,
            )  # fmt: skip
        else:
            hlen = DATA_IMM_HDR_LEN
            header = bytearray(hlen)
            _DATA_IMM.pack_into(
                header, 0, opcode, 0, BTH_PKEY, pkt.qpn, bth8 << _U24_SHIFT | pkt.psn,
                0, pkt.msn, (ts_ns >> TS_UNIT_NS_SHIFT) & _TS_MASK, _FTYPE,
                pkt.va, pkt.rkey, dma_len, imm,
                MRC_EXT_VERSION, 0, pkt.port, 0, pkt.ev, pkt.tx_seq, ts_ns, offset, 0,
            )  # fmt: skip
    except (struct.error, TypeError) as exc:
        raise _field_error(pkt, exc) from None
    _U32.pack_into(header, hlen - HDR_CHECK_LEN, zlib.crc32(header))
    if trimmed:
        header[hlen - _XETH_FLAGS_FROM_END] = flags & _SWITCH
        return bytes(header)
    body, trailer = integrity.seal(header, payload, pkt.tx_seq, pkt.port, pkt.ev)
    return b"".join((header, body, trailer))


def _offset(pkt: AckPacket, name: str, psn: int, base: int) -> int:
    """``psn - base`` in the PSN circle, as SETH's signed 16-bit offset."""
    delta = (psn - base) & PSN_MASK
    if delta >= PSN_MOD // 2:
        delta -= PSN_MOD
    if not -(1 << 15) <= delta < 1 << 15:
        raise WireUsageError(f"AckPacket.{name} is {delta} PSNs from cum_psn: SETH holds 16 bits")
    return delta


def _encode_ack(pkt: AckPacket, integrity: Integrity) -> bytes:
    reason = pkt.nack_reason
    if reason != 0 and reason not in _NACK_REASONS:
        raise WireUsageError(f"AckPacket.nack_reason {reason!r} is not 0 or a NackReason")
    flags = pkt.flags
    if not isinstance(flags, int) or flags & ~_VALID_FEEDBACK_FLAGS:
        raise WireUsageError(f"AckPacket.flags {flags!r} has bits outside FeedbackFlags")
    if pkt.skip not in _SKIPS:
        raise WireUsageError(f"AckPacket.skip {pkt.skip!r} is not a SkipHint")
    window = pkt.window
    if type(window) is not int or not MPR_UNIT <= window <= MAX_WINDOW or window % MPR_UNIT:
        raise WireUsageError(f"AckPacket.window {window!r} is not a multiple of 128 in 128..32640")
    _check_u24(pkt, pkt.qpn, pkt.cum_psn, pkt.msn, pkt.echo_psn, pkt.sack_base, pkt.rcv_bytes)
    if type(pkt.ooo_count) is not int or not 0 <= pkt.ooo_count < 1 << 15:
        raise _field_error(pkt, ValueError("ooo_count out of range"))
    cum = pkt.cum_psn
    ack_off = _offset(pkt, "echo_psn", pkt.echo_psn, cum)
    sack_off = _offset(pkt, "sack_base", pkt.sack_base, cum)
    cc = _CC_ECN if flags & _ECN_ECHO else 0
    ts16 = _ts16(pkt.echo_ts_ns) if isinstance(pkt.echo_ts_ns, int) else 0
    next_hdr = _NEXT_XETH
    try:
        seth = (
            _TYPE_SETH << 4 | next_hdr, pkt.skip, ack_off, pkt.echo_ev, 0, 0, cum, cc,
            pkt.window // MPR_UNIT, sack_off, pkt.sack_bitmap,
            ts16, pkt.ooo_count, pkt.rcv_bytes,
            MRC_EXT_VERSION, flags & _DUPLICATE, pkt.port, 0, pkt.ev, pkt.tx_seq,
            pkt.echo_ts_ns, pkt.msn, pkt.port_state, 0, 0,
        )  # fmt: skip
        if reason == 0:
            header = bytearray(SACK_HDR_LEN)
            _SACK.pack_into(header, 0, Opcode.RELIABILITY_SACK, 0, BTH_PKEY, pkt.qpn, cum, *seth)
        else:
            header = bytearray(NACK_HDR_LEN)
            _NACK.pack_into(
                header, 0, Opcode.RELIABILITY_NACK, 0, BTH_PKEY, pkt.qpn, cum,
                _TYPE_NETH << 4 | _NEXT_SETH, 0, reason, 0, pkt.echo_ev, 0, 0, pkt.echo_psn,
                cc, 0, ts16, *seth,
            )  # fmt: skip
    except (struct.error, TypeError) as exc:
        raise _field_error(pkt, exc) from None
    return _seal_headers_only(header, integrity, pkt.tx_seq, pkt.port, pkt.ev)


def _encode_probe(pkt: ProbePacket | PortStatusPacket, integrity: Integrity) -> bytes:
    """An endpoint request: an EV probe, or a port-status update (ERTH op 0)."""
    _check_u24(pkt, pkt.qpn)
    op = EndpointOp.EV_PROBE if type(pkt) is ProbePacket else EndpointOp.PORT_STATUS_UPDATE
    header = bytearray(PROBE_HDR_LEN)
    try:
        _PROBE.pack_into(
            header, 0, Opcode.ENDPOINT_REQUEST, 0, BTH_PKEY, pkt.qpn, 0,
            _TYPE_ERTH << 4 | _NEXT_XETH, op, 0, 0, pkt.port_state, 0,
            _ts16(pkt.ts_ns), _FTYPE,
            MRC_EXT_VERSION, 0, pkt.port, 0, pkt.ev, pkt.tx_seq, pkt.ts_ns, 0, 0,
        )  # fmt: skip
    except (struct.error, TypeError) as exc:
        raise _field_error(pkt, exc) from None
    return _seal_headers_only(header, integrity, pkt.tx_seq, pkt.port, pkt.ev)


def _encode_probe_reply(pkt: ProbeReplyPacket, integrity: Integrity) -> bytes:
    _check_u24(pkt, pkt.qpn)
    header = bytearray(PROBE_REPLY_HDR_LEN)
    try:
        _PROBE_REPLY.pack_into(
            header, 0, Opcode.ENDPOINT_RESPONSE, 0, BTH_PKEY, pkt.qpn, 0,
            _TYPE_EETH << 4 | _NEXT_XETH, EndpointOp.EV_PROBE, 0, pkt.echo_ev, pkt.port_state,
            0, 0, _ts16(pkt.echo_ts_ns), _FTYPE, 0,
            MRC_EXT_VERSION, 0, pkt.port, 0, pkt.ev, pkt.tx_seq, pkt.echo_ts_ns, 0,
            pkt.port_state, 0, 0,
        )  # fmt: skip
    except (struct.error, TypeError) as exc:
        raise _field_error(pkt, exc) from None
    return _seal_headers_only(header, integrity, pkt.tx_seq, pkt.port, pkt.ev)


def _encode_reliability_probe(pkt: ReliabilityProbePacket, integrity: Integrity) -> bytes:
    _check_u24(pkt, pkt.qpn)
    header = bytearray(RELIABILITY_PROBE_HDR_LEN)
    try:
        _RELIABILITY_PROBE.pack_into(
            header, 0, Opcode.RELIABILITY_PROBE_REQ, 0, BTH_PKEY, pkt.qpn, 0,
            _TYPE_PETH << 4 | _NEXT_XETH, 0, 0, 0, pkt.probe_id, 0, 0, 0,
            _ts16(pkt.ts_ns), _FTYPE,
            MRC_EXT_VERSION, 0, pkt.port, 0, pkt.ev, pkt.tx_seq, pkt.ts_ns, 0, 0,
        )  # fmt: skip
    except (struct.error, TypeError) as exc:
        raise _field_error(pkt, exc) from None
    return _seal_headers_only(header, integrity, pkt.tx_seq, pkt.port, pkt.ev)


def _seal_headers_only(
    header: bytearray, integrity: Integrity, tx_seq: int, plane: int, ev: int
) -> bytes:
    _U32.pack_into(header, len(header) - HDR_CHECK_LEN, zlib.crc32(header))
    _, trailer = integrity.seal(header, b"", tx_seq, plane, ev)
    return bytes(header) + trailer


def encode_trimmed(data: BytesLike, lasthop: bool) -> bytes:
    """Do what a trimming switch does to an encoded write.

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
    trimmed[hlen - _XETH_FLAGS_FROM_END] |= _TRIMMED | (_TRIM_LASTHOP if lasthop else 0)
    return bytes(trimmed)


def trim(pkt: DataPacket, lasthop: bool) -> DataPacket:
    """:func:`encode_trimmed` on a decoded write: what the receiver decodes from the trimmed
    datagram (no payload, RETH length kept in ``dma_len``, TRIMMED and perhaps TRIM_LASTHOP
    set).  The simulator trims packets it never encodes with this."""
    dma_len = pkt.dma_len if pkt.dma_len >= 0 else pkt.offset + len(_byte_view(pkt.payload))
    return DataPacket(
        pkt.qpn, pkt.psn, pkt.va, pkt.rkey, b"", pkt.ev, pkt.port, pkt.tx_seq, pkt.ts_ns,
        pkt.flags | _TRIMMED | (_TRIM_LASTHOP if lasthop else 0), pkt.imm,
        dma_len, pkt.msn, pkt.offset,
    )  # fmt: skip


#: Header bytes of the packets whose length does not depend on their fields.
_FIXED_HEADER_LEN: dict[type, int] = {
    ProbePacket: PROBE_HDR_LEN,
    PortStatusPacket: PROBE_HDR_LEN,
    ProbeReplyPacket: PROBE_REPLY_HDR_LEN,
    ReliabilityProbePacket: RELIABILITY_PROBE_HDR_LEN,
}


def encoded_length(pkt: Packet, trailer_len: int) -> int:
    """``len(encode(pkt, integrity))`` without encoding, for an integrity whose trailer is
    ``trailer_len`` bytes (a trimmed write has none)."""
    kind = type(pkt)
    if kind is DataPacket:
        data: DataPacket = pkt  # type: ignore[assignment]
        hlen = DATA_HDR_LEN if data.imm is None else DATA_IMM_HDR_LEN
        if data.flags & _TRIMMED:
            return hlen
        return hlen + len(_byte_view(data.payload)) + trailer_len
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
    return int.from_bytes(view[5:8], "big")


def decode(data: BytesLike, integrity: Integrity) -> Packet:
    """Parse and verify one datagram; raises DecodeError and nothing else on bad input.

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
            raise DecodeError(DecodeReason.TRUNCATED, f"{size} bytes, headers need {hlen}")
        return _decode_control(view, size, hlen, integrity)
    except DecodeError:
        raise
    except (struct.error, ValueError, TypeError, IndexError, OverflowError, BufferError) as exc:
        raise DecodeError(DecodeReason.BAD_FIELD, f"malformed packet: {exc}") from None


def _check_version(view: memoryview, at: int) -> None:
    if view[at] != MRC_EXT_VERSION:
        raise DecodeError(DecodeReason.BAD_VERSION, f"mrcstack extension version {view[at]}")


def _decode_control(view: memoryview, size: int, hlen: int, integrity: Integrity) -> Packet:
    """SACK, NACK, EV probe and probe reply: headers and trailer only, no payload."""
    opcode = view[0]
    ext_len = XETH_LEN if opcode in XETH_OPCODES else XFETH_LEN
    _check_version(view, hlen - ext_len)
    tlen = integrity.trailer_len
    if size != hlen + tlen:
        reason = DecodeReason.TRUNCATED if size < hlen + tlen else DecodeReason.BAD_LENGTH
        raise DecodeError(reason, f"{size} bytes, opcode {opcode:#04x} needs {hlen + tlen}")
    _verify_hdr_check(view, hlen)
    if opcode == Opcode.RELIABILITY_SACK:
        pkt: Packet = _ack_fields(_SACK.unpack_from(view), 0, 0, 0)
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


def _verify_hdr_check(view: memoryview, hlen: int) -> None:
    """Fast hdr_check for headers whose switch-writable bits are clear."""
    end = hlen - HDR_CHECK_LEN
    expected = zlib.crc32(_ZERO_CHECK, zlib.crc32(view[:end]))
    if expected != _U32.unpack_from(view, end)[0]:
        raise DecodeError(DecodeReason.BAD_HEADER_CHECK, "header CRC does not match")


def _bad(detail: str) -> DecodeError:
    return DecodeError(DecodeReason.BAD_FIELD, detail)


def _decode_data(view: memoryview, size: int, integrity: Integrity) -> DataPacket:
    opcode = view[0]
    if opcode in IMM_OPCODES:
        hlen = DATA_IMM_HDR_LEN
        if size < hlen:
            raise DecodeError(DecodeReason.TRUNCATED, f"{size} bytes, headers need {hlen}")
        (
            _, bth1, pkey, qpn, psn_word, rq_msn, msn, ts16, ts_ftype, va, rkey, dma_len, imm,
            version, xflags, port, rsvd, ev, tx_seq, ts_ns, offset, hdr_check,
        ) = _DATA_IMM.unpack_from(view)  # fmt: skip
    else:
        hlen = DATA_HDR_LEN
        if size < hlen:
            raise DecodeError(DecodeReason.TRUNCATED, f"{size} bytes, headers need {hlen}")
        (
            _, bth1, pkey, qpn, psn_word, rq_msn, msn, ts16, ts_ftype, va, rkey, dma_len,
            version, xflags, port, rsvd, ev, tx_seq, ts_ns, offset, hdr_check,
        ) = _DATA.unpack_from(view)  # fmt: skip
        imm = None
    if version != MRC_EXT_VERSION:
        raise DecodeError(DecodeReason.BAD_VERSION, f"mrcstack extension version {version}")
    tlen = integrity.trailer_len
    if xflags & _TRIMMED:
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
    bth8 = psn_word >> _U24_SHIFT
    if (
        bth1
        or pkey != BTH_PKEY
        or qpn >> _U24_SHIFT
        or bth8 & ~_BTH_RTX != _BTH_TS  # mrcstack always sends a TSETH
        or rsvd
        or rq_msn
        or ts_ftype != _FTYPE
        or ts16 != (ts_ns >> TS_UNIT_NS_SHIFT) & _TS_MASK
        or xflags & ~_SWITCH
        or (xflags & _TRIM_LASTHOP and not xflags & _TRIMMED)
    ):
        raise _bad("reserved, AckReq, P_Key, TSETH or flag bits invalid")
    flags = _OPCODE_FLAGS[opcode] | xflags | (_RETX if bth8 & _BTH_RTX else 0)
    psn = psn_word & PSN_MASK
    if xflags & _TRIMMED:
        if offset > dma_len or (flags & _FIRST and offset):
            raise DecodeError(
                DecodeReason.BAD_LENGTH, f"offset {offset} outside a write of {dma_len} bytes"
            )
        return DataPacket(
            qpn, psn, va, rkey, b"", ev, port, tx_seq, ts_ns, flags, imm, dma_len, msn, offset
        )
    end = size - tlen
    paylen = end - hlen
    if (
        offset + paylen > dma_len
        or (flags & _FIRST and offset)
        or (flags & _LAST and offset + paylen != dma_len)
    ):
        raise DecodeError(
            DecodeReason.BAD_LENGTH,
            f"{paylen} payload bytes at offset {offset} of a {dma_len}-byte write "
            f"({Opcode(opcode).name})",
        )
    payload = integrity.open(view[:hlen], view[hlen:end], view[end:], tx_seq, port, ev)
    return DataPacket(
        qpn, psn, va, rkey, payload, ev, port, tx_seq, ts_ns, flags, imm, dma_len, msn, offset
    )


def _check_bth(bth1: int, pkey: int, qpn_word: int) -> None:
    if bth1 or pkey != BTH_PKEY or qpn_word >> _U24_SHIFT:
        raise _bad("BTH flags, P_Key or reserved byte not MRC's")


def _signed_psn(base: int, offset: int) -> int:
    return (base + offset) & PSN_MASK


def _ack_fields(f: tuple[int, ...], reason: int, nack_entropy: int, nack_psn: int) -> AckPacket:
    (
        _, bth1, pkey, qpn, psn_word,
        type_next, m_pr, ack_off, entropy, sctx, dctx, cack_word, cc, mpr, sack_off, bitmap,
        ts_echo, ooo, rcv_word,
        _, xflags, port, xrsvd, ev, tx_seq, echo_ts_ns, msn, port_state, xrsvd2, _,
    ) = f  # fmt: skip
    _check_bth(bth1, pkey, qpn)
    if (
        psn_word != cack_word
        or type_next != (_TYPE_SETH << 4 | _NEXT_XETH)
        or m_pr & ~_M_MASK
        or (m_pr & _M_MASK) not in _SKIPS
        or sctx
        or dctx
        or cc & ~_CC_ECN
        or not mpr
        or ooo >> 15
        or rcv_word >> 24
        or ts_echo != _ts16(echo_ts_ns)
        or xflags & ~_DUPLICATE
        or xrsvd
        or xrsvd2
        or msn >> 24
    ):
        raise _bad("SACK reserved, copied or flag fields invalid")
    cum = cack_word & PSN_MASK
    flags = xflags | (_ECN_ECHO if cc & _CC_ECN else 0)
    echo_psn = _signed_psn(cum, ack_off)
    if reason and (entropy != nack_entropy or echo_psn != nack_psn):
        raise _bad("NACK and its SETH name different packets")
    return AckPacket(
        qpn, cum, msn, ev, port, tx_seq, entropy, echo_psn, echo_ts_ns,
        _signed_psn(cum, sack_off), bitmap, port_state, flags, reason, m_pr & _M_MASK, ooo,
        rcv_word, mpr * MPR_UNIT,
    )  # fmt: skip


def _nack_fields(view: memoryview) -> AckPacket:
    f = _NACK.unpack_from(view)
    type_next, rsvd, reason, vendor, entropy, sctx, dctx, psn_word, cc, rsvd2, ts = f[5:16]
    if (
        type_next != (_TYPE_NETH << 4 | _NEXT_SETH)
        or rsvd
        or vendor
        or sctx
        or dctx
        or psn_word >> _U24_SHIFT
        or rsvd2
        or cc != f[23]  # the NETH's cc byte and its SETH's agree
        or ts != f[27]  # as do the timestamp echoes
    ):
        raise _bad("NETH reserved or copied fields invalid")
    if reason not in _NACK_REASONS:
        raise _bad(f"unknown NACK reason {reason:#04x}")
    return _ack_fields(f[:5] + f[16:], reason, entropy, psn_word)


def _probe_fields(view: memoryview) -> ProbePacket | PortStatusPacket:
    (
        _, bth1, pkey, qpn, psn_word,
        type_next, op, rsvd, vendor, mask, rsvd2, ts, ftype,
        _, xflags, port, xrsvd, ev, tx_seq, ts_ns, xoffset, _,
    ) = _PROBE.unpack_from(view)  # fmt: skip
    _check_bth(bth1, pkey, qpn)
    if (
        psn_word
        or type_next != (_TYPE_ERTH << 4 | _NEXT_XETH)
        or op not in (EndpointOp.EV_PROBE, EndpointOp.PORT_STATUS_UPDATE)
        or rsvd
        or vendor
        or mask >> 16
        or rsvd2
        or ts != _ts16(ts_ns)
        or ftype != _FTYPE
        or xflags
        or xrsvd
        or xoffset
    ):
        raise _bad("EV probe PSN, reserved, op or copied fields invalid")
    if op == EndpointOp.PORT_STATUS_UPDATE:
        return PortStatusPacket(qpn, mask, ev, port, tx_seq, ts_ns)
    return ProbePacket(qpn, ev, port, tx_seq, ts_ns, mask)


def _reliability_probe_fields(view: memoryview) -> ReliabilityProbePacket:
    (
        _, bth1, pkey, qpn, psn_word,
        type_next, r1, r2, vendor, probe_id, r3, sctx, dctx, ts, ftype,
        _, xflags, port, xrsvd, ev, tx_seq, ts_ns, xoffset, _,
    ) = _RELIABILITY_PROBE.unpack_from(view)  # fmt: skip
    _check_bth(bth1, pkey, qpn)
    if (
        psn_word
        or type_next != (_TYPE_PETH << 4 | _NEXT_XETH)
        or r1
        or r2
        or vendor
        or r3
        or sctx
        or dctx
        or ts != _ts16(ts_ns)
        or ftype != _FTYPE
        or xflags
        or xrsvd
        or xoffset
    ):
        raise _bad("reliability probe PSN, reserved or copied fields invalid")
    return ReliabilityProbePacket(qpn, probe_id, ev, port, tx_seq, ts_ns)


def _probe_reply_fields(view: memoryview) -> ProbeReplyPacket:
    (
        _, bth1, pkey, qpn, psn_word,
        type_next, op, rsvd, echo_ev, mask, r1, r2, ts, ftype, r3,
        _, xflags, port, xrsvd, ev, tx_seq, echo_ts_ns, msn, port_state, xrsvd2, _,
    ) = _PROBE_REPLY.unpack_from(view)  # fmt: skip
    _check_bth(bth1, pkey, qpn)
    if (
        psn_word
        or type_next != (_TYPE_EETH << 4 | _NEXT_XETH)
        or op != EndpointOp.EV_PROBE
        or rsvd
        or r1
        or r2
        or r3
        or mask != port_state
        or ts != _ts16(echo_ts_ns)
        or ftype != _FTYPE
        or xflags
        or xrsvd
        or xrsvd2
        or msn
    ):
        raise _bad("probe reply PSN, reserved, op or copied fields invalid")
    return ProbeReplyPacket(qpn, ev, port, tx_seq, echo_ev, echo_ts_ns, port_state)
