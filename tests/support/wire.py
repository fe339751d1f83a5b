"""Shared by the wire tests: keys, Hypothesis packet strategies, packet builders, forging."""

from __future__ import annotations

import dataclasses
import struct
import zlib

from hypothesis import strategies as st

from mrcstack.wire import (
    CRC_TRAILER_LEN,
    ENDPOINT_QPN,
    MPR_UNIT,
    PSN_MASK,
    AcknowledgePacket,
    AckPacket,
    AeadIntegrity,
    CrcIntegrity,
    DataFlags,
    DataPacket,
    FeedbackFlags,
    Integrity,
    NackReason,
    Packet,
    PortStatusPacket,
    ProbePacket,
    ProbeReplyPacket,
    ReliabilityProbePacket,
    crc32_header,
    header_length,
)

KEY16 = bytes(range(16))
KEY32 = bytes(range(100, 132))
MODES = ("crc", "aead", "aead-encrypt")
SENDER_ID, RECEIVER_ID = 0x0A0B0C0D, 0x01020304
XETH_FLAGS_FROM_END = 31  # the XETH flags byte, counted back from a write's header end


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
    flags=st.sampled_from([0, DataFlags.FIRST, DataFlags.LAST]).flatmap(
        lambda f: st.sampled_from(
            [f, f | DataFlags.RETX, f | DataFlags.FIRST, f | DataFlags.ACK_REQ]
        )
    ),
    imm=st.none() | u(32),
    msn=u(16),
    rq_msn=u(16),
).map(lambda p: p if p.imm is None else dataclasses.replace(p, flags=p.flags | DataFlags.LAST))


@st.composite
def _in_a_write(draw: st.DrawFn, pkt: DataPacket) -> DataPacket:
    """``pkt`` placed in a write: its offset (0 for a first packet) and the write's length
    (ending at this payload for a last packet)."""
    offset = 0 if pkt.flags & DataFlags.FIRST else draw(st.integers(0, 1 << 30))
    after = 0 if pkt.flags & DataFlags.LAST else draw(st.integers(0, 1 << 30))
    return dataclasses.replace(pkt, offset=offset, dma_len=offset + len(pkt.payload) + after)


data_packets = data_packets.flatmap(_in_a_write)


@st.composite
def ack_packets(draw: st.DrawFn) -> AckPacket:
    """Any valid SACK or NACK: its PSN offsets fit SETH's signed 16 bits."""
    cum = draw(u(24))
    offset = st.integers(-(1 << 15), (1 << 15) - 1)
    reason = draw(st.sampled_from([0, *(int(r) for r in NackReason)]))
    flags = draw(st.integers(0, 15))
    if reason:  # (a NACK does not answer a reliability probe)
        flags &= ~FeedbackFlags.PROBE_RESPONSE
    return AckPacket(
        qpn=draw(u(24)),
        cum_psn=cum,
        msn=draw(u(24)),
        ev=draw(u(32)),
        port=draw(u(8)),
        tx_seq=draw(u(64)),
        echo_ev=draw(u(32)),
        echo_psn=(cum + draw(offset)) & PSN_MASK,
        echo_ts_ns=draw(u(64)),
        sack_base=(cum + draw(offset)) & PSN_MASK,
        sack_bitmap=draw(u(64)),
        port_state=draw(u(16)),
        flags=flags,
        nack_reason=reason,
        skip=draw(st.integers(0, 2)),
        ooo_count=draw(u(15)),
        rcv_bytes=draw(u(24)),
        window=draw(st.integers(0, 255)) * MPR_UNIT,
        cc_type=draw(u(4)),
        scid=draw(u(16)),
    )


probe_packets = st.builds(
    ProbePacket,
    qpn=st.just(ENDPOINT_QPN),
    ev=u(32),
    port=u(8),
    tx_seq=u(64),
    ts_ns=u(64),
    port_state=u(32),
    probe_id=u(16),
)
port_status_packets = st.builds(
    PortStatusPacket,
    qpn=st.just(ENDPOINT_QPN),
    port_state=u(32),
    ev=u(32),
    port=u(8),
    tx_seq=u(64),
    ts_ns=u(64),
    probe_id=u(16),
)
probe_reply_packets = st.builds(
    ProbeReplyPacket,
    qpn=st.just(ENDPOINT_QPN),
    ev=u(32),
    port=u(8),
    tx_seq=u(64),
    probe_id=u(16),
    echo_ts_ns=u(64),
    port_state=u(16),
    op=st.sampled_from([0, 1]),
)
reliability_probe_packets = st.builds(
    ReliabilityProbePacket,
    qpn=u(24),
    probe_id=u(16),
    ev=u(32),
    port=u(8),
    tx_seq=u(64),
    ts_ns=u(64),
    scid=u(16),
)
acknowledge_packets = st.builds(
    AcknowledgePacket,
    qpn=u(24),
    psn=u(24),
    syndrome=st.integers(0, 0x1F) | st.sampled_from([0x60, 0x61, 0x62]),
    msn=u(24),
    ev=st.just(0),
    port=st.just(0),
)
any_packet = (
    data_packets
    | ack_packets()
    | probe_packets
    | port_status_packets
    | probe_reply_packets
    | reliability_probe_packets
)


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
        "msn": 0x0102,
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
        "echo_psn": 0x010005,
        "echo_ts_ns": 123456789,
        "sack_base": 0x00FFFF,
        "sack_bitmap": 0x8000_0000_0000_0005,
        "port_state": 0b1011,
        "flags": FeedbackFlags.ECN_ECHO,
        "nack_reason": 0,
    }
    fields.update(kw)
    return AckPacket(**fields)  # type: ignore[arg-type]


PROBE = ProbePacket(
    qpn=ENDPOINT_QPN, ev=0x01020304, port=5, tx_seq=79, ts_ns=42 << 10, port_state=0b101,
    probe_id=0x0102,
)  # fmt: skip
PROBE_REPLY = ProbeReplyPacket(
    qpn=ENDPOINT_QPN, ev=9, port=1, tx_seq=80, probe_id=0x0102, echo_ts_ns=42, port_state=0xFF
)


def normalized(pkt: Packet) -> Packet:
    """What decode(encode(pkt)) must return: payload as bytes, dma_len filled in, a NACK
    without the SACK state it does not carry."""
    if isinstance(pkt, DataPacket):
        payload = bytes(pkt.payload)
        dma_len = pkt.dma_len if pkt.dma_len >= 0 else pkt.offset + len(payload)
        return dataclasses.replace(pkt, payload=payload, dma_len=dma_len)
    if isinstance(pkt, AckPacket) and pkt.nack_reason:
        return _nack_only(pkt)
    return pkt


def _nack_only(pkt: AckPacket) -> AckPacket:
    psn = pkt.echo_psn
    return dataclasses.replace(
        pkt, cum_psn=psn, sack_base=psn, sack_bitmap=0, skip=0, ooo_count=0, rcv_bytes=0,
        window=0,
    )  # fmt: skip


def normalized_plain(pkt: Packet, ev: int = 0, port: int = 0) -> Packet:
    """What decode_plain(encode_plain(pkt), ev=, port=) must return: what the extension would
    have carried is gone (tx_seq, the full timestamps, the port state, the feedback's MSN),
    the EV and port are the outer header's, timestamps are 16 bits in 1.024 us units, and a
    write's offset is what its opcode and length tell."""

    def ts(ns: int) -> int:
        return -1 if ns < 0 else (ns >> 10 & 0xFFFF) << 10

    if isinstance(pkt, DataPacket):
        payload = bytes(pkt.payload)
        dma_len = pkt.dma_len if pkt.dma_len >= 0 else pkt.offset + len(payload)
        last, first = pkt.flags & DataFlags.LAST, pkt.flags & DataFlags.FIRST
        offset = 0 if first else (dma_len - len(payload) if last and not pkt.trimmed else -1)
        return dataclasses.replace(
            pkt, payload=payload, dma_len=dma_len, ev=ev, port=port, tx_seq=0, ts_ns=ts(pkt.ts_ns),
            offset=offset,
        )  # fmt: skip
    common = {"ev": ev, "port": port, "tx_seq": 0}
    if isinstance(pkt, AckPacket):
        if pkt.nack_reason:
            pkt = _nack_only(pkt)
        return dataclasses.replace(
            pkt, **common, msn=0, port_state=0, echo_ts_ns=ts(pkt.echo_ts_ns)
        )  # fmt: skip
    if isinstance(pkt, ProbeReplyPacket):
        return dataclasses.replace(pkt, **common, port_state=0, echo_ts_ns=ts(pkt.echo_ts_ns))
    if isinstance(pkt, AcknowledgePacket):
        return dataclasses.replace(pkt, ev=ev, port=port)
    return dataclasses.replace(pkt, **common, ts_ns=ts(pkt.ts_ns))  # type: ignore[type-var]


def forge(wire: bytes, offset: int, value: int, trailer_len: int = CRC_TRAILER_LEN) -> bytes:
    """Set one header byte and recompute hdr_check and the ICRC (a buggy peer)."""
    hlen = header_length(wire[0])
    buf = bytearray(wire)
    buf[offset] = value
    struct.pack_into(">I", buf, hlen - 4, crc32_header(buf[:hlen]))
    if trailer_len:
        body = bytes(buf[:-trailer_len])
        return body + icrc(body)
    return bytes(buf)


def icrc(
    body: bytes,
    src: bytes = bytes(16),
    dst: bytes = bytes(16),
    sport: int = 4791,
    dport: int = 4791,
) -> bytes:
    """The RoCEv2 ICRC of a UDP payload (without its trailer), written out from the RoCEv2
    annex independently of the codec: 8 bytes of ones, the IPv6 header with traffic class,
    flow label and hop limit as ones, the UDP header with its checksum as ones, the BTH with
    byte 4 as ones; CRC32, sent least significant byte first."""
    size = 8 + len(body) + 4
    ip = b"\x6f\xff\xff\xff" + struct.pack(">HBB", size, 17, 0xFF) + src + dst
    udp = struct.pack(">HHHH", sport, dport, size, 0xFFFF)
    bth = body[:4] + b"\xff" + body[5:]
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + ip + udp + bth))
