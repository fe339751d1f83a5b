"""The OCP MRC 1.0 header layout shared by both encodings: sizes, codes, precompiled structs
and the field checks the two codecs have in common.

``mrcstack.wire.codec`` packs packets with mrcstack's extension header (XETH/XFETH),
``mrcstack.wire.plain`` without it; both lay the specification's headers out the same way,
from the tables here.  Every choice made where the public description of OCP MRC 1.0 is
ambiguous is a constant in the "Readings" block, so a correction is one edit
(``docs/wire-format.md`` lists them, with the source of every field's position).
"""

from __future__ import annotations

import struct
from typing import Final

from mrcstack.wire.integrity import (
    BTH_LEN,
    XETH_LEN,
    XFETH_LEN,
    DecodeError,
    DecodeReason,
    WireUsageError,
)
from mrcstack.wire.packets import (
    PSN_MASK,
    PSN_MOD,
    AcknowledgePacket,
    AckPacket,
    BthFlags,
    DataFlags,
    DataPacket,
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

METH_LEN: Final = 4
TSETH_LEN: Final = 4
RETH_LEN: Final = 16
IMMDT_LEN: Final = 4
AETH_LEN: Final = 4
SETH_LEN: Final = 28
CC_STATE_LEN: Final = 8
NETH_LEN: Final = 20
ERTH_LEN: Final = 16
EETH_LEN: Final = 36
PETH_LEN: Final = 16
#: A write's headers with mrcstack's extension (also a trimmed write's whole length).
DATA_HDR_LEN: Final = BTH_LEN + METH_LEN + TSETH_LEN + RETH_LEN + XETH_LEN  # 68
DATA_IMM_HDR_LEN: Final = DATA_HDR_LEN + IMMDT_LEN  # 72
SACK_HDR_LEN: Final = BTH_LEN + SETH_LEN + CC_STATE_LEN + XFETH_LEN  # 84
NACK_HDR_LEN: Final = BTH_LEN + NETH_LEN + XFETH_LEN  # 68
PROBE_HDR_LEN: Final = BTH_LEN + ERTH_LEN + XETH_LEN  # 60
PROBE_REPLY_HDR_LEN: Final = BTH_LEN + EETH_LEN + XFETH_LEN  # 84
RELIABILITY_PROBE_HDR_LEN: Final = BTH_LEN + PETH_LEN + XETH_LEN  # 60
ACKNOWLEDGE_HDR_LEN: Final = BTH_LEN + AETH_LEN  # 16, with or without the extension
BTH_PKEY: Final = 0xFFFF  # default partition key, as RoCEv2 NICs send
QPN_MASK: Final = (1 << 24) - 1
U24_SHIFT: Final = 24  # a u24 field shares a u32 with the byte above it

# Readings: where the public record of OCP MRC 1.0 leaves a choice, this is ours.
#: TSETH/CC_STATE/NETH/ERTH/PETH/EETH timestamps: 16 bits of nanoseconds >> 10 (1.024 us
#: units, the spec's timer unit), wrapping every 67 ms.  Our own 64-bit time travels in
#: XETH/XFETH when the extension is on.
TS_UNIT_NS_SHIFT: Final = 10
TS_MASK: Final = 0xFFFF
FTYPE: Final = 0x1  # TSETH / ERTH / PETH ftype (the transcription's only value)
#: Extension headers open with a 4-bit type (bits 7-4 of byte 0) and a 5-bit next header
#: (bits 3-0 of byte 0, then bit 7 of byte 1), as the transcription's Tables 7-14 to 7-23
#: place them.  It names no values and sends both as 0: so do we (type 0), and a next header
#: of 0 means nothing follows; ``NEXT_EXT`` (the top of the 5-bit space) says that
#: mrcstack's XETH/XFETH follows, which only a QP that negotiated it sends.
NEXT_NONE: Final = 0
NEXT_EXT: Final = 0x1F
#: SETH byte 1 (Table 7-14): next[0] bit 7, ``m`` bits 6-5, reserved 4-2, ``pr`` bit 1,
#: reserved bit 0.
SETH_M_SHIFT: Final = 5
SETH_PR: Final = 0x02
SETH_BYTE1_RESERVED: Final = 0x1D
#: EETH byte 1 (Table 7-22): next[0] bit 7, reserved 6, ``op`` bits 5-4, reserved 3-0.
EETH_OP_SHIFT: Final = 4
EETH_BYTE1_RESERVED: Final = 0x4F
#: ERTH byte 1 (Table 7-20): next[0] bit 7, reserved 6-2, ``op`` bits 1-0.
ERTH_BYTE1_RESERVED: Final = 0x7C
#: NETH/PETH byte 1: next[0] bit 7, the rest reserved.
BYTE1_RESERVED: Final = 0x7F
#: SETH/NETH cc byte: cc_type in the high nibble (carried, 0 sent), flags low; flag bit 0 is
#: our ECN echo, the others must be 0.
CC_ECN: Final = 0x01
#: CC_STATE received bytes count 256-byte units (7.5.5.4 as transcribed), mod 2**24.
RCV_BYTES_SHIFT: Final = 8
#: AETH syndromes (IBTA): 000xxxxx ACK (with a credit count), 011xxxxx NAK; the NAK codes.
AETH_ACK_MAX: Final = 0x1F
AETH_NAK: Final = 0x60
AETH_NAK_MASK: Final = 0xE0
AETH_NAK_SEQ: Final = 0x60
AETH_NAK_INVALID: Final = 0x61
AETH_NAK_ACCESS: Final = 0x62

TRIMMED: Final = int(DataFlags.TRIMMED)
TRIM_LASTHOP: Final = int(DataFlags.TRIM_LASTHOP)
RETX: Final = int(DataFlags.RETX)
LAST: Final = int(DataFlags.LAST)
FIRST: Final = int(DataFlags.FIRST)
ACK_REQ: Final = int(DataFlags.ACK_REQ)
SENDER_DATA_FLAGS: Final = RETX | LAST | FIRST | ACK_REQ
BTH_ACK_REQ: Final = int(BthFlags.ACK_REQ)
BTH_RTX: Final = int(BthFlags.RTX)
BTH_TS: Final = int(BthFlags.TS)
ECN_ECHO: Final = int(FeedbackFlags.ECN_ECHO)
DUPLICATE: Final = int(FeedbackFlags.DUPLICATE)
PROBE_RESPONSE: Final = int(FeedbackFlags.PROBE_RESPONSE)
FB_RETX: Final = int(FeedbackFlags.RETX)
NACK_REASONS: Final = frozenset(int(r) for r in NackReason)
SKIPS: Final = frozenset(int(m) for m in SkipHint)

# opcode of a write from (first, last, has imm)
_WRITE_OPCODE: Final = {
    (True, True, False): Opcode.RDMA_WRITE_ONLY,
    (True, True, True): Opcode.RDMA_WRITE_ONLY_IMM,
    (True, False, False): Opcode.RDMA_WRITE_FIRST,
    (False, False, False): Opcode.RDMA_WRITE_MIDDLE,
    (False, True, False): Opcode.RDMA_WRITE_LAST,
    (False, True, True): Opcode.RDMA_WRITE_LAST_IMM,
}
OPCODE_FLAGS: Final = {int(op): (FIRST if f else 0) | (LAST if la else 0)
                for (f, la, _), op in _WRITE_OPCODE.items()}  # fmt: skip
# The same table keyed by FIRST|LAST flag bits, and whether there is an immediate.
_OPCODE_OF: Final[dict[tuple[int, bool], Opcode]] = {
    (flags, imm): op for (f, la, imm), op in _WRITE_OPCODE.items()
    for flags in [(FIRST if f else 0) | (LAST if la else 0)]
}  # fmt: skip

BTH: Final = ">BBHII"  # opcode, M/SE/PadCnt/TVer, P_Key, resv|DestQP, A/R/RTX/TS|PSN
#: Where two BTH fields lie, for code that sorts datagrams before decoding them (a slice and
#: ``int.from_bytes``, cheaper per datagram than a call): the destination QP (24 bits) and
#: an endpoint packet's probe id (its PSN's low 16 bits).
BTH_QPN_BYTES: Final = slice(5, 8)
BTH_PROBE_ID_BYTES: Final = slice(10, 12)
WRITE: Final = "HH" + "HH" + "QII"  # METH, TSETH, RETH
WRITE_NO_TS: Final = "HH" + "QII"  # METH, RETH (no TSETH: the BTH's TS bit clear)
XETH: Final = "BBBBIQQII"  # ver, flags, port, rsvd, ev, tx_seq, ts_ns, offset, hdr_check
XFETH: Final = "BBBBIQQIHHI"  # ver, flags, port, rsvd, ev, tx_seq, echo_ts_ns, msn, port_state,
#                        rsvd, hdr_check
SETH: Final = "BBhIHHIBBhQ"  # type|next, next|m|pr, ack_psn_offset, entropy, src ctx, dst ctx,
#                       rsvd|cack_psn, cc, MPR, sack_offset, bitmap
CC_STATE: Final = "HHI"  # ts echo, rsvd|ooo_count, R/C|penalty|received bytes (256-byte units)
NETH: Final = "BBBBIHHIBBH"  # type|next, next|rsvd, reason, vendor, entropy, ctx, ctx, rsvd|psn,
#                       cc, rsvd, tx_timestamp
ERTH: Final = "BBBBIIHH"  # type|next, next|rsvd|op, rsvd, vendor, port mask, rsvd, ts, TSR|ftype
PETH: Final = "BBBBHHHHHH"  # type|next, next|rsvd, rsvd, vendor, probe id, rsvd, ctx, ctx, ts,
#                      TSR|ftype
EETH: Final = "BBHIIQQHHI"  # type|next, next|rsvd|op, rsvd, 24 reserved bytes, ts echo, rsvd,
#                      rsvd
AETH: Final = "I"  # syndrome | MSN
U32: Final = struct.Struct(">I")

# Wire width of every numeric field, for the error message when a pack fails.
FIELD_BITS: Final[dict[type, dict[str, int]]] = {
    DataPacket: {
        "qpn": 24, "psn": 24, "va": 64, "rkey": 32, "ev": 32, "port": 8, "tx_seq": 64,
        "ts_ns": 64, "flags": 8, "imm": 32, "dma_len": 32, "msn": 16, "offset": 32,
        "rq_msn": 16,
    },
    AckPacket: {
        "qpn": 24, "cum_psn": 24, "msn": 24, "ev": 32, "port": 8, "tx_seq": 64, "echo_ev": 32,
        "echo_psn": 24, "echo_ts_ns": 64, "sack_base": 24, "sack_bitmap": 64,
        "port_state": 16, "flags": 8, "nack_reason": 8, "skip": 2, "ooo_count": 15,
        "rcv_bytes": 24, "cc_type": 4, "scid": 16,
    },
    ProbePacket: {
        "qpn": 24, "ev": 32, "port": 8, "tx_seq": 64, "ts_ns": 64, "port_state": 32,
        "probe_id": 16,
    },
    ProbeReplyPacket: {
        "qpn": 24, "ev": 32, "port": 8, "tx_seq": 64, "probe_id": 16, "echo_ts_ns": 64,
        "port_state": 16, "op": 2,
    },
    ReliabilityProbePacket: {
        "qpn": 24, "probe_id": 16, "ev": 32, "port": 8, "tx_seq": 64, "ts_ns": 64, "scid": 16,
    },
    PortStatusPacket: {
        "qpn": 24, "port_state": 32, "ev": 32, "port": 8, "tx_seq": 64, "ts_ns": 64,
        "probe_id": 16,
    },
    AcknowledgePacket: {"qpn": 24, "psn": 24, "syndrome": 8, "msn": 24, "ev": 32, "port": 8},
}  # fmt: skip


def write_opcode(flags: int, imm: int | None) -> Opcode:
    """The write opcode for a packet's FIRST/LAST flags and immediate."""
    try:
        return _OPCODE_OF[flags & (FIRST | LAST), imm is not None]
    except (KeyError, TypeError):
        raise WireUsageError("an immediate goes only on the last packet of a write") from None


def ts16(ts_ns: int) -> int:
    """A nanosecond time as the 16-bit timestamps carry it (0 for none: a negative time)."""
    return (ts_ns >> TS_UNIT_NS_SHIFT) & TS_MASK if ts_ns >= 0 else 0


def next_bytes(next_header: int) -> tuple[int, int]:
    """Byte 0 (type 0, next[4:1]) and the bit 7 of byte 1 (next[0]) of an extension header."""
    return next_header >> 1, (next_header & 1) << 7


def next_of(byte0: int, byte1: int) -> int:
    """The 5-bit next header of an extension header whose type (byte 0 bits 7-4) is 0;
    -1 when the type is not."""
    if byte0 >> 4:
        return -1
    return (byte0 & 0x0F) << 1 | byte1 >> 7


def field_error(pkt: Packet, cause: Exception) -> WireUsageError:
    """Name the first field that does not fit its wire width (slow path, for errors only)."""
    for name, bits in FIELD_BITS[type(pkt)].items():
        value = getattr(pkt, name)
        if name == "imm" and value is None:
            continue
        if name in ("dma_len", "ts_ns") and value == -1:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            return WireUsageError(f"{type(pkt).__name__}.{name} must be an int, got {value!r}")
        if not 0 <= value < 1 << bits:
            return WireUsageError(
                f"{type(pkt).__name__}.{name} = {value} does not fit in {bits} unsigned bits"
            )
    return WireUsageError(f"cannot encode {type(pkt).__name__}: {cause}")


def byte_view(payload: object) -> bytes | memoryview:
    """The payload as bytes or a flat byte memoryview (so len() counts bytes)."""
    if type(payload) is bytes:
        return payload
    try:
        view = memoryview(payload)  # type: ignore[arg-type]
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    except TypeError as exc:
        raise WireUsageError(f"payload must be bytes-like and contiguous: {exc}") from None


def check_u24(pkt: Packet, *values: int) -> None:
    for value in values:
        if type(value) is not int or not 0 <= value <= PSN_MASK:
            raise field_error(pkt, ValueError("24-bit field out of range"))


def check_probe_id(pkt: ProbePacket | PortStatusPacket | ProbeReplyPacket) -> None:
    """A probe id rides in PSN[15:0]: 16 bits."""
    if type(pkt.probe_id) is not int or not 0 <= pkt.probe_id <= 0xFFFF:
        raise field_error(pkt, ValueError("probe id out of range"))


def check_range(flags: int, offset: int, paylen: int, dma_len: int, trimmed: int) -> None:
    """A write's packet lies inside it: the first at offset 0, the last at its end."""
    if type(offset) is not int or not 0 <= offset <= dma_len:
        raise WireUsageError(f"DataPacket.offset {offset!r} outside a {dma_len}-byte write")
    if flags & FIRST and offset:
        raise WireUsageError(f"the first packet of a write has offset 0, not {offset}")
    if not trimmed and (offset + paylen > dma_len or (flags & LAST and offset + paylen != dma_len)):
        raise WireUsageError(
            f"{paylen} payload bytes at offset {offset} do not fit a {dma_len}-byte write"
        )


def psn_offset(name: str, psn: int, base: int) -> int:
    """``psn - base`` in the PSN circle, as SETH's signed 16-bit offset."""
    delta = (psn - base) & PSN_MASK
    if delta >= PSN_MOD // 2:
        delta -= PSN_MOD
    if not -(1 << 15) <= delta < 1 << 15:
        raise WireUsageError(f"AckPacket.{name} is {delta} PSNs from cum_psn: SETH holds 16 bits")
    return delta


def check_ack(pkt: AckPacket, allowed_flags: int) -> None:
    """An AckPacket's enumerated and small fields, before packing."""
    reason = pkt.nack_reason
    if reason != 0 and reason not in NACK_REASONS:
        raise WireUsageError(f"AckPacket.nack_reason {reason!r} is not 0 or a NackReason")
    flags = pkt.flags
    if not isinstance(flags, int) or flags & ~allowed_flags:
        raise WireUsageError(f"AckPacket.flags {flags!r} has bits this encoding cannot carry")
    if reason and flags & PROBE_RESPONSE:
        raise WireUsageError("a NACK does not answer a reliability probe (SETH pr)")
    if pkt.skip not in SKIPS:
        raise WireUsageError(f"AckPacket.skip {pkt.skip!r} is not a SkipHint")
    window = pkt.window
    if type(window) is not int or not 0 <= window <= 255 * 128 or window % 128:
        raise WireUsageError(f"AckPacket.window {window!r} is not a multiple of 128 in 0..32640")
    check_u24(pkt, pkt.qpn, pkt.cum_psn, pkt.msn, pkt.echo_psn, pkt.sack_base, pkt.rcv_bytes)
    if type(pkt.ooo_count) is not int or not 0 <= pkt.ooo_count < 1 << 15:
        raise field_error(pkt, ValueError("ooo_count out of range"))


def bad(detail: str) -> DecodeError:
    return DecodeError(DecodeReason.BAD_FIELD, detail)


def truncated(size: int, need: int) -> DecodeError:
    return DecodeError(DecodeReason.TRUNCATED, f"{size} bytes, headers need {need}")


def check_bth(bth1: int, pkey: int, qpn_word: int) -> None:
    if bth1 or pkey != BTH_PKEY or qpn_word >> U24_SHIFT:
        raise bad("BTH flags, P_Key or reserved byte not MRC's")


def signed_psn(base: int, offset: int) -> int:
    return (base + offset) & PSN_MASK


def ack_from_aeth(qpn: int, psn: int, word: int, ev: int, port: int) -> AcknowledgePacket:
    """An ACKNOWLEDGE's AETH: an ACK or one of the IBTA NAKs MRC can mean, else BAD_FIELD."""
    syndrome = word >> U24_SHIFT
    if syndrome > AETH_ACK_MAX and syndrome not in (
        AETH_NAK_SEQ,
        AETH_NAK_INVALID,
        AETH_NAK_ACCESS,
    ):
        raise bad(f"AETH syndrome {syndrome:#04x} is neither an ACK nor a NAK MRC knows")
    return AcknowledgePacket(qpn, psn, syndrome, word & QPN_MASK, ev, port)
