"""Shared by the wire tests: keys, Hypothesis packet strategies, packet builders, forging."""

from __future__ import annotations

import dataclasses
import struct
import zlib

from hypothesis import strategies as st

from mrcstack.wire import (
    CRC_TRAILER_LEN,
    AckPacket,
    AeadIntegrity,
    CrcIntegrity,
    DataFlags,
    DataPacket,
    FeedbackFlags,
    Integrity,
    NackReason,
    Packet,
    ProbePacket,
    ProbeReplyPacket,
    crc32_header,
    header_length,
)

KEY16 = bytes(range(16))
KEY32 = bytes(range(100, 132))
MODES = ("crc", "aead", "aead-encrypt")
SENDER_ID, RECEIVER_ID = 0x0A0B0C0D, 0x01020304
MRCX_FLAGS_FROM_END = 27  # the data extension's flags byte, counted back from the header end


def make_pair(mode: str, key: bytes = KEY16) -> tuple[Integrity, Integrity]:
    """(sender's, receiver's) integrity objects for one direction of a connection."""
    if mode == "crc":
        return CrcIntegrity(), CrcIntegrity()
    encrypt = mode == "aead-encrypt"
    return (
        AeadIntegrity(key, SENDER_ID, RECEIVER_ID, encrypt=encrypt),
        AeadIntegrity(key, RECEIVER_ID, SENDER_ID, encrypt=encrypt),
    )


def u(bits: int) -> st.SearchStrategy[int]:
    return st.integers(0, (1 << bits) - 1)


data_packets = st.builds(
    DataPacket,
    qpn=u(24),
    psn=u(24),
    va=u(64),
    rkey=u(32),
    payload=st.binary(max_size=300),
    ev=u(32),
    port=u(8),
    tx_seq=u(64),
    ts_ns=u(64),
    flags=st.sampled_from([0, DataFlags.RETX, DataFlags.LAST, DataFlags.RETX | DataFlags.LAST]),
    imm=st.none() | u(32),
)
ack_packets = st.builds(
    AckPacket,
    qpn=u(24),
    cum_psn=u(24),
    msn=u(24),
    ev=u(32),
    port=u(8),
    tx_seq=u(64),
    echo_ev=u(32),
    echo_psn=u(24),
    echo_ts_ns=u(64),
    sack_base=u(24),
    sack_bitmap=u(64),
    port_state=u(16),
    flags=st.sampled_from([0, int(FeedbackFlags.ECN_ECHO), int(FeedbackFlags.DUPLICATE), 3]),
    nack_reason=st.sampled_from([0, *(int(r) for r in NackReason)]),
)
probe_packets = st.builds(ProbePacket, qpn=u(24), ev=u(32), port=u(8), tx_seq=u(64), ts_ns=u(64))
probe_reply_packets = st.builds(
    ProbeReplyPacket,
    qpn=u(24),
    ev=u(32),
    port=u(8),
    tx_seq=u(64),
    echo_ev=u(32),
    echo_ts_ns=u(64),
    port_state=u(16),
)
any_packet = data_packets | ack_packets | probe_packets | probe_reply_packets


def data(payload: bytes = b"0123456789abcdef" * 4, **kw: object) -> DataPacket:
    fields: dict[str, object] = {
        "qpn": 0x123456,
        "psn": 0xABCDEF,
        "va": 0x1122334455667788,
        "rkey": 0xCAFEBABE,
        "payload": payload,
        "ev": 0xDEADBEEF,
        "port": 3,
        "tx_seq": 77,
        "ts_ns": 123456789,
        "flags": DataFlags.LAST,
        "imm": None,
    }
    fields.update(kw)
    return DataPacket(**fields)  # type: ignore[arg-type]


def ack(**kw: object) -> AckPacket:
    fields: dict[str, object] = {
        "qpn": 0x654321,
        "cum_psn": 0x00FFFE,
        "msn": 9,
        "ev": 17,
        "port": 2,
        "tx_seq": 78,
        "echo_ev": 0xDEADBEEF,
        "echo_psn": 0xABCDEF,
        "echo_ts_ns": 123456789,
        "sack_base": 0x00FFFF,
        "sack_bitmap": 0x8000_0000_0000_0005,
        "port_state": 0b1011,
        "flags": FeedbackFlags.ECN_ECHO,
        "nack_reason": 0,
    }
    fields.update(kw)
    return AckPacket(**fields)  # type: ignore[arg-type]


PROBE = ProbePacket(qpn=7, ev=0x01020304, port=5, tx_seq=79, ts_ns=42)
PROBE_REPLY = ProbeReplyPacket(
    qpn=7, ev=9, port=1, tx_seq=80, echo_ev=0x01020304, echo_ts_ns=42, port_state=0xFF
)


def normalized(pkt: Packet) -> Packet:
    """What decode(encode(pkt)) must return: payload as bytes, dma_len filled in."""
    if isinstance(pkt, DataPacket):
        payload = bytes(pkt.payload)
        dma_len = pkt.dma_len if pkt.trimmed else len(payload)
        return dataclasses.replace(pkt, payload=payload, dma_len=dma_len)
    return pkt


def forge(wire: bytes, offset: int, value: int, trailer_len: int = CRC_TRAILER_LEN) -> bytes:
    """Set one header byte and recompute hdr_check and the CRC trailer (a buggy peer)."""
    hlen = header_length(wire[0])
    buf = bytearray(wire)
    buf[offset] = value
    struct.pack_into(">I", buf, hlen - 4, crc32_header(buf[:hlen]))
    if trailer_len:
        body = bytes(buf[:-trailer_len])
        return body + struct.pack(">I", zlib.crc32(body))
    return bytes(buf)
