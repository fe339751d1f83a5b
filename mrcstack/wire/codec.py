"""Encode and decode MRC packets: pure functions over the layout in ``mrcstack.wire.packets``.

``encode`` packs a packet dataclass, computes ``hdr_check`` and asks an ``Integrity`` for the
trailer.  ``decode`` is the only door for bytes from the network: it returns a valid packet
or raises ``DecodeError``, never anything else, whatever the input.  Data packets are the hot
path: one precompiled ``struct`` per header, one CRC for the header, no copy of the payload on
receive (a memoryview slice of the datagram is returned).
"""

from __future__ import annotations

import struct
import zlib
from typing import TYPE_CHECKING

from mrcstack.wire.integrity import (
    BTH_LEN,
    HDR_CHECK_LEN,
    MRCF_LEN,
    MRCX_LEN,
    BytesLike,
    DecodeError,
    DecodeReason,
    WireUsageError,
    crc32_header,
)
from mrcstack.wire.packets import (
    AETH_ACK,
    AETH_NAK_ACCESS,
    AETH_NAK_SEQ,
    MRC_EXT_VERSION,
    PSN_MASK,
    SWITCH_FLAGS,
    AckPacket,
    DataFlags,
    DataPacket,
    FeedbackFlags,
    NackReason,
    Opcode,
    Packet,
    ProbePacket,
    ProbeReplyPacket,
)

if TYPE_CHECKING:
    from mrcstack.wire.integrity import Integrity

__all__ = [
    "ACK_HDR_LEN",
    "AETH_LEN",
    "BTH_LEN",
    "BTH_PKEY",
    "DATA_HDR_LEN",
    "DATA_IMM_HDR_LEN",
    "HDR_CHECK_LEN",
    "IMMDT_LEN",
    "MRCF_LEN",
    "MRCX_LEN",
    "PROBE_HDR_LEN",
    "PROBE_REPLY_HDR_LEN",
    "RETH_LEN",
    "DecodeError",
    "DecodeReason",
    "WireUsageError",
    "decode",
    "encode",
    "encode_trimmed",
    "header_length",
    "peek_qpn",
    "trimmed_length",
]

RETH_LEN = 16
IMMDT_LEN = 4
AETH_LEN = 4
DATA_HDR_LEN = BTH_LEN + RETH_LEN + MRCX_LEN  # 56: also a trimmed WRITE's whole length
DATA_IMM_HDR_LEN = DATA_HDR_LEN + IMMDT_LEN  # 60
ACK_HDR_LEN = BTH_LEN + AETH_LEN + MRCF_LEN  # 68
PROBE_HDR_LEN = BTH_LEN + MRCX_LEN  # 40
PROBE_REPLY_HDR_LEN = BTH_LEN + MRCF_LEN  # 64
BTH_PKEY = 0xFFFF  # default partition key, as RoCEv2 NICs send
QPN_MASK = (1 << 24) - 1
MSN_MASK = (1 << 24) - 1
_U24_SHIFT = 24  # a u24 field shares a u32 with the reserved / AckReq byte above it
_MRCX_FLAGS_FROM_END = MRCX_LEN - 1  # flags byte offset, counted back from the header end

# Header structs, BTH first; every MRC extension ends with hdr_check u32.
_BTH = ">BBHII"  # opcode, flags, pkey, resv|destqp, ackreq|psn
_MRCX = "BBBBIQQI"  # ver, flags, port, rsvd, ev, tx_seq, ts_ns, hdr_check
_MRCF = "BBBBIQIIQIHHQI"  # ver, flags, port, nack_reason, ev, tx_seq, echo_ev, echo_psn,
#                           echo_ts_ns, sack_base, port_state, rsvd, sack_bitmap, hdr_check
_DATA = struct.Struct(_BTH + "QII" + _MRCX)
_DATA_IMM = struct.Struct(_BTH + "QII" + "I" + _MRCX)
_ACK = struct.Struct(_BTH + "I" + _MRCF)
_PROBE = struct.Struct(_BTH + _MRCX)
_PROBE_REPLY = struct.Struct(_BTH + _MRCF)
_U32 = struct.Struct(">I")
_ZERO_CHECK = bytes(HDR_CHECK_LEN)

_OP_WRITE = int(Opcode.RDMA_WRITE_ONLY)
_OP_WRITE_IMM = int(Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE)
_DATA_OPCODES = frozenset({_OP_WRITE, _OP_WRITE_IMM})
_SENDER_DATA_FLAGS = int(DataFlags.RETX | DataFlags.LAST)
_VALID_DATA_FLAGS = _SENDER_DATA_FLAGS | int(SWITCH_FLAGS)  # as received
_VALID_FEEDBACK_FLAGS = int(FeedbackFlags.ECN_ECHO | FeedbackFlags.DUPLICATE)
_NACK_REASONS = frozenset(int(r) for r in NackReason)
_SWITCH_FLAGS = int(SWITCH_FLAGS)
_TRIMMED = int(DataFlags.TRIMMED)
_TRIM_LASTHOP = int(DataFlags.TRIM_LASTHOP)
_PROBE_FLAGS = int(DataFlags.PROBE)
_HEADER_LEN: dict[int, int] = {
    Opcode.RDMA_WRITE_ONLY: DATA_HDR_LEN,
    Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE: DATA_IMM_HDR_LEN,
    Opcode.ACKNOWLEDGE: ACK_HDR_LEN,
    Opcode.MRC_PROBE: PROBE_HDR_LEN,
    Opcode.MRC_PROBE_REPLY: PROBE_REPLY_HDR_LEN,
}
# opcode -> (header length, offset of the extension's version byte, is a data packet)
_FEEDBACK_OPCODES = frozenset({int(Opcode.ACKNOWLEDGE), int(Opcode.MRC_PROBE_REPLY)})
_DECODE_TABLE: dict[int, tuple[int, int, bool]] = {
    op: (hlen, hlen - (MRCF_LEN if op in _FEEDBACK_OPCODES else MRCX_LEN), op in _DATA_OPCODES)
    for op, hlen in _HEADER_LEN.items()
}

# Wire width of every numeric field, for the error message when a pack fails.
_FIELD_BITS: dict[type, dict[str, int]] = {
    DataPacket: {
        "qpn": 24, "psn": 24, "va": 64, "rkey": 32, "ev": 32, "port": 8, "tx_seq": 64,
        "ts_ns": 64, "flags": 8, "imm": 32, "dma_len": 32,
    },
    AckPacket: {
        "qpn": 24, "cum_psn": 24, "msn": 24, "ev": 32, "port": 8, "tx_seq": 64, "echo_ev": 32,
        "echo_psn": 24, "echo_ts_ns": 64, "sack_base": 24, "sack_bitmap": 64,
        "port_state": 16, "flags": 8, "nack_reason": 8,
    },
    ProbePacket: {"qpn": 24, "ev": 32, "port": 8, "tx_seq": 64, "ts_ns": 64},
    ProbeReplyPacket: {
        "qpn": 24, "ev": 32, "port": 8, "tx_seq": 64, "echo_ev": 32, "echo_ts_ns": 64,
        "port_state": 16,
    },
}  # fmt: skip


def header_length(opcode: int) -> int:
    """Bytes of headers (BTH through the MRC extension) for an opcode."""
    try:
        return _HEADER_LEN[opcode]
    except (KeyError, TypeError):
        raise WireUsageError(f"unknown opcode {opcode!r}") from None


def trimmed_length(opcode: int) -> int:
    """Length of a trimmed data packet: its headers only (56, or 60 with an immediate)."""
    if opcode not in _DATA_OPCODES:
        raise WireUsageError(f"only RDMA WRITE packets are trimmed, not opcode {opcode!r}")
    return _HEADER_LEN[opcode]


def _field_error(pkt: Packet, cause: Exception) -> WireUsageError:
    """Name the first field that does not fit its wire width (slow path, for errors only)."""
    for name, bits in _FIELD_BITS[type(pkt)].items():
        value = getattr(pkt, name)
        if name == "imm" and value is None:
            continue
        if name == "dma_len" and not pkt.flags & _TRIMMED:  # type: ignore[union-attr]
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
    if kind is ProbePacket:
        return _encode_probe(pkt, integrity)  # type: ignore[arg-type]
    if kind is ProbeReplyPacket:
        return _encode_probe_reply(pkt, integrity)  # type: ignore[arg-type]
    raise WireUsageError(f"not an MRC packet: {kind.__name__}")


def _check_u24(pkt: Packet, *values: int) -> None:
    for value in values:
        if type(value) is not int or not 0 <= value <= PSN_MASK:
            raise _field_error(pkt, ValueError("24-bit field out of range"))


def _encode_data(pkt: DataPacket, integrity: Integrity) -> bytes:
    flags = pkt.flags
    if not isinstance(flags, int) or flags & ~_VALID_DATA_FLAGS:
        raise WireUsageError(f"DataPacket.flags {flags!r} has bits outside RETX|LAST|trim")
    payload = _byte_view(pkt.payload)
    trimmed = flags & _TRIMMED
    if trimmed:
        if len(payload):
            raise WireUsageError("a trimmed DataPacket has no payload")
        dma_len = pkt.dma_len
    elif flags & _TRIM_LASTHOP:
        raise WireUsageError("TRIM_LASTHOP is only valid together with TRIMMED")
    else:
        dma_len = len(payload)
    _check_u24(pkt, pkt.qpn, pkt.psn)
    imm = pkt.imm
    wire_flags = flags & _SENDER_DATA_FLAGS  # switch bits are added after hdr_check
    try:
        if imm is None:
            hlen = DATA_HDR_LEN
            header = bytearray(hlen)
            _DATA.pack_into(
                header, 0, _OP_WRITE, 0, BTH_PKEY, pkt.qpn, pkt.psn, pkt.va, pkt.rkey, dma_len,
                MRC_EXT_VERSION, wire_flags, pkt.port, 0, pkt.ev, pkt.tx_seq, pkt.ts_ns, 0,
            )  # fmt: skip
        else:
            hlen = DATA_IMM_HDR_LEN
            header = bytearray(hlen)
            _DATA_IMM.pack_into(
                header, 0, _OP_WRITE_IMM, 0, BTH_PKEY, pkt.qpn, pkt.psn, pkt.va, pkt.rkey,
                dma_len, imm,
                MRC_EXT_VERSION, wire_flags, pkt.port, 0, pkt.ev, pkt.tx_seq, pkt.ts_ns, 0,
            )  # fmt: skip
    except (struct.error, TypeError) as exc:
        raise _field_error(pkt, exc) from None
    _U32.pack_into(header, hlen - HDR_CHECK_LEN, zlib.crc32(header))
    if trimmed:
        header[hlen - _MRCX_FLAGS_FROM_END] = flags
        return bytes(header)
    body, trailer = integrity.seal(header, payload, pkt.tx_seq)
    return b"".join((header, body, trailer))


def _ack_syndrome(nack_reason: int) -> int:
    if nack_reason == 0:
        return AETH_ACK
    if nack_reason == NackReason.REMOTE_ACCESS:
        return AETH_NAK_ACCESS
    return AETH_NAK_SEQ


def _encode_ack(pkt: AckPacket, integrity: Integrity) -> bytes:
    reason = pkt.nack_reason
    if reason != 0 and reason not in _NACK_REASONS:
        raise WireUsageError(f"AckPacket.nack_reason {reason!r} is not 0 or a NackReason")
    if not isinstance(pkt.flags, int) or pkt.flags & ~_VALID_FEEDBACK_FLAGS:
        raise WireUsageError(f"AckPacket.flags {pkt.flags!r} has bits outside FeedbackFlags")
    _check_u24(pkt, pkt.qpn, pkt.cum_psn, pkt.msn, pkt.echo_psn, pkt.sack_base)
    header = bytearray(ACK_HDR_LEN)
    try:
        _ACK.pack_into(
            header, 0, Opcode.ACKNOWLEDGE, 0, BTH_PKEY, pkt.qpn, pkt.cum_psn,
            _ack_syndrome(reason) << _U24_SHIFT | pkt.msn,
            MRC_EXT_VERSION, pkt.flags, pkt.port, reason, pkt.ev, pkt.tx_seq, pkt.echo_ev,
            pkt.echo_psn, pkt.echo_ts_ns, pkt.sack_base, pkt.port_state, 0, pkt.sack_bitmap, 0,
        )  # fmt: skip
    except (struct.error, TypeError) as exc:
        raise _field_error(pkt, exc) from None
    return _seal_headers_only(header, integrity, pkt.tx_seq)


def _encode_probe(pkt: ProbePacket, integrity: Integrity) -> bytes:
    _check_u24(pkt, pkt.qpn)
    header = bytearray(PROBE_HDR_LEN)
    try:
        _PROBE.pack_into(
            header, 0, Opcode.MRC_PROBE, 0, BTH_PKEY, pkt.qpn, 0,
            MRC_EXT_VERSION, _PROBE_FLAGS, pkt.port, 0, pkt.ev, pkt.tx_seq, pkt.ts_ns, 0,
        )  # fmt: skip
    except (struct.error, TypeError) as exc:
        raise _field_error(pkt, exc) from None
    return _seal_headers_only(header, integrity, pkt.tx_seq)


def _encode_probe_reply(pkt: ProbeReplyPacket, integrity: Integrity) -> bytes:
    _check_u24(pkt, pkt.qpn)
    header = bytearray(PROBE_REPLY_HDR_LEN)
    try:
        _PROBE_REPLY.pack_into(
            header, 0, Opcode.MRC_PROBE_REPLY, 0, BTH_PKEY, pkt.qpn, 0,
            MRC_EXT_VERSION, 0, pkt.port, 0, pkt.ev, pkt.tx_seq, pkt.echo_ev, 0,
            pkt.echo_ts_ns, 0, pkt.port_state, 0, 0, 0,
        )  # fmt: skip
    except (struct.error, TypeError) as exc:
        raise _field_error(pkt, exc) from None
    return _seal_headers_only(header, integrity, pkt.tx_seq)


def _seal_headers_only(header: bytearray, integrity: Integrity, tx_seq: int) -> bytes:
    _U32.pack_into(header, len(header) - HDR_CHECK_LEN, zlib.crc32(header))
    _, trailer = integrity.seal(header, b"", tx_seq)
    return bytes(header) + trailer


def encode_trimmed(data: BytesLike, lasthop: bool) -> bytes:
    """Do what a trimming switch does to an encoded data packet.

    Cut it to its headers (payload and trailer gone) and set TRIMMED, plus TRIM_LASTHOP when
    the switch port faces the destination host.  ``hdr_check`` still verifies because it is
    computed with those bits clear.
    """
    if len(data) < BTH_LEN or data[0] not in _DATA_OPCODES:
        raise WireUsageError("encode_trimmed needs an encoded RDMA WRITE packet")
    hlen = _HEADER_LEN[data[0]]
    if len(data) < hlen:
        raise WireUsageError(f"a data packet has at least {hlen} bytes, got {len(data)}")
    trimmed = bytearray(data[:hlen])
    trimmed[hlen - _MRCX_FLAGS_FROM_END] |= _TRIMMED | (_TRIM_LASTHOP if lasthop else 0)
    return bytes(trimmed)


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

    In CRC and authenticate-only modes a data packet's payload is a memoryview slice of
    ``data`` (no copy): it stays valid only while the caller keeps that buffer unchanged.
    """
    try:
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        size = len(view)
        if size < BTH_LEN:
            raise DecodeError(DecodeReason.TRUNCATED, f"{size} bytes is shorter than a BTH")
        opcode = view[0]
        info = _DECODE_TABLE.get(opcode)
        if info is None:
            raise DecodeError(DecodeReason.BAD_OPCODE, f"opcode {opcode:#04x} is not MRC")
        hlen, version_at, is_data = info
        if size < hlen:
            raise DecodeError(DecodeReason.TRUNCATED, f"{size} bytes, headers need {hlen}")
        if view[version_at] != MRC_EXT_VERSION:
            raise DecodeError(DecodeReason.BAD_VERSION, f"MRC extension version {view[version_at]}")
        if is_data:
            return _decode_data(view, size, hlen, integrity)
        return _decode_control(view, size, hlen, integrity)
    except DecodeError:
        raise
    except (struct.error, ValueError, TypeError, IndexError, OverflowError, BufferError) as exc:
        raise DecodeError(DecodeReason.BAD_FIELD, f"malformed packet: {exc}") from None


def _decode_control(view: memoryview, size: int, hlen: int, integrity: Integrity) -> Packet:
    """ACK/NACK, probe and probe reply: headers and trailer only, no payload."""
    opcode = view[0]
    tlen = integrity.trailer_len
    if size != hlen + tlen:
        reason = DecodeReason.TRUNCATED if size < hlen + tlen else DecodeReason.BAD_LENGTH
        raise DecodeError(reason, f"{size} bytes, opcode {opcode:#04x} needs {hlen + tlen}")
    _verify_hdr_check(view, hlen)
    if opcode == Opcode.ACKNOWLEDGE:
        pkt: Packet = _ack_fields(view)
    elif opcode == Opcode.MRC_PROBE:
        pkt = _probe_fields(view)
    else:
        pkt = _probe_reply_fields(view)
    integrity.open(view[:hlen], view[hlen:hlen], view[hlen:], pkt.tx_seq)
    return pkt


def _verify_hdr_check(view: memoryview, hlen: int) -> None:
    """Fast hdr_check for headers whose switch-writable bits are clear."""
    end = hlen - HDR_CHECK_LEN
    expected = zlib.crc32(_ZERO_CHECK, zlib.crc32(view[:end]))
    if expected != _U32.unpack_from(view, end)[0]:
        raise DecodeError(DecodeReason.BAD_HEADER_CHECK, "header CRC does not match")


def _check_bth(flags: int, pkey: int, qpn_word: int) -> None:
    if flags or pkey != BTH_PKEY or qpn_word >> _U24_SHIFT:
        raise DecodeError(DecodeReason.BAD_FIELD, "BTH flags, P_Key or reserved byte not MRC's")


def _decode_data(view: memoryview, size: int, hlen: int, integrity: Integrity) -> DataPacket:
    if hlen == DATA_HDR_LEN:
        (
            _, bth_flags, pkey, qpn, psn_word, va, rkey, dma_len,
            _, flags, port, rsvd, ev, tx_seq, ts_ns, hdr_check,
        ) = _DATA.unpack_from(view)  # fmt: skip
        imm = None
    else:
        (
            _, bth_flags, pkey, qpn, psn_word, va, rkey, dma_len, imm,
            _, flags, port, rsvd, ev, tx_seq, ts_ns, hdr_check,
        ) = _DATA_IMM.unpack_from(view)  # fmt: skip
    tlen = integrity.trailer_len
    if flags & _TRIMMED:
        if size != hlen:
            raise DecodeError(
                DecodeReason.BAD_LENGTH, f"trimmed packet of {size} bytes, must be {hlen}"
            )
    elif size < hlen + tlen:
        raise DecodeError(DecodeReason.TRUNCATED, f"{size} bytes leaves no room for trailer")
    if flags & _SWITCH_FLAGS:  # rare: the generic check, which ignores the switch's bits
        expected = crc32_header(view[:hlen])
    else:
        expected = zlib.crc32(_ZERO_CHECK, zlib.crc32(view[: hlen - HDR_CHECK_LEN]))
    if expected != hdr_check:
        raise DecodeError(DecodeReason.BAD_HEADER_CHECK, "header CRC does not match")
    if (
        bth_flags
        or pkey != BTH_PKEY
        or qpn >> _U24_SHIFT
        or psn_word >> _U24_SHIFT
        or rsvd
        or flags & ~_VALID_DATA_FLAGS
        or (flags & _TRIM_LASTHOP and not flags & _TRIMMED)
    ):
        raise DecodeError(DecodeReason.BAD_FIELD, "reserved, AckReq, P_Key or flag bits invalid")
    if flags & _TRIMMED:
        return DataPacket(
            qpn, psn_word, va, rkey, b"", ev, port, tx_seq, ts_ns, flags, imm, dma_len
        )
    end = size - tlen
    if dma_len != end - hlen:
        raise DecodeError(
            DecodeReason.BAD_LENGTH, f"RETH length {dma_len} but {end - hlen} payload bytes"
        )
    payload = integrity.open(view[:hlen], view[hlen:end], view[end:], tx_seq)
    return DataPacket(
        qpn, psn_word, va, rkey, payload, ev, port, tx_seq, ts_ns, flags, imm, dma_len
    )


def _ack_fields(view: memoryview) -> AckPacket:
    (
        _, bth_flags, pkey, qpn, cum_psn, aeth,
        _, flags, port, reason, ev, tx_seq, echo_ev, echo_psn, echo_ts_ns, sack_base,
        port_state, rsvd, sack_bitmap, _,
    ) = _ACK.unpack_from(view)  # fmt: skip
    _check_bth(bth_flags, pkey, qpn)
    if cum_psn >> _U24_SHIFT or rsvd or flags & ~_VALID_FEEDBACK_FLAGS:
        raise DecodeError(DecodeReason.BAD_FIELD, "AckReq, reserved or flag bits set")
    if echo_psn > PSN_MASK or sack_base > PSN_MASK:
        raise DecodeError(DecodeReason.BAD_FIELD, "echo_psn / sack_base wider than a PSN")
    if reason != 0 and reason not in _NACK_REASONS:
        raise DecodeError(DecodeReason.BAD_FIELD, f"unknown NACK reason {reason:#04x}")
    if aeth >> _U24_SHIFT != _ack_syndrome(reason):
        raise DecodeError(DecodeReason.BAD_FIELD, "AETH syndrome disagrees with NACK reason")
    return AckPacket(
        qpn, cum_psn, aeth & MSN_MASK, ev, port, tx_seq, echo_ev, echo_psn, echo_ts_ns,
        sack_base, sack_bitmap, port_state, flags, reason,
    )  # fmt: skip


def _probe_fields(view: memoryview) -> ProbePacket:
    (
        _, bth_flags, pkey, qpn, psn_word, _, flags, port, rsvd, ev, tx_seq, ts_ns, _,
    ) = _PROBE.unpack_from(view)  # fmt: skip
    _check_bth(bth_flags, pkey, qpn)
    if psn_word or rsvd or flags != _PROBE_FLAGS:
        raise DecodeError(DecodeReason.BAD_FIELD, "probe PSN, reserved or flag bits wrong")
    return ProbePacket(qpn, ev, port, tx_seq, ts_ns)


def _probe_reply_fields(view: memoryview) -> ProbeReplyPacket:
    (
        _, bth_flags, pkey, qpn, psn_word,
        _, flags, port, reason, ev, tx_seq, echo_ev, echo_psn, echo_ts_ns, sack_base,
        port_state, rsvd, sack_bitmap, _,
    ) = _PROBE_REPLY.unpack_from(view)  # fmt: skip
    _check_bth(bth_flags, pkey, qpn)
    if psn_word or flags or reason or echo_psn or sack_base or rsvd or sack_bitmap:
        raise DecodeError(DecodeReason.BAD_FIELD, "probe reply has ACK-only fields set")
    return ProbeReplyPacket(qpn, ev, port, tx_seq, echo_ev, echo_ts_ns, port_state)
