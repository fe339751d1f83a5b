"""Wire codec: round trips, exact layout, zero-copy decode, tamper detection, trimming, errors.

Integrity (AEAD, the nonce guard, the replay window, the CRC header check) is in
test_wire_integrity.py; the shared strategies and builders are in wire_strategies.py.
"""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrcstack import native
from mrcstack.errors import LocalError, PeerError
from mrcstack.wire import (
    BTH_LEN,
    BTH_PKEY,
    BTH_QPN_BYTES,
    CRC_TRAILER_LEN,
    DATA_HDR_LEN,
    DATA_IMM_HDR_LEN,
    MRC_EXT_VERSION,
    NACK_HDR_LEN,
    PROBE_HDR_LEN,
    PROBE_REPLY_HDR_LEN,
    PSN_MASK,
    PSN_MOD,
    RELIABILITY_PROBE_HDR_LEN,
    SACK_HDR_LEN,
    TS_UNIT_NS_SHIFT,
    XFETH_LEN,
    AckPacket,
    BthFlags,
    CrcIntegrity,
    DataFlags,
    DataPacket,
    DecodeError,
    DecodeReason,
    EndpointOp,
    FeedbackFlags,
    IcrcPath,
    NackReason,
    Opcode,
    Packet,
    ReliabilityProbePacket,
    SkipHint,
    WireUsageError,
    crc32_header,
    decode,
    encode,
    encode_into,
    encode_plain,
    encode_trimmed,
    encoded_length,
    flags_aead_tag,
    has_extension,
    header_length,
    peek_qpn,
    plain_encoded_length,
    probe_id,
    trim,
    trimmed_length,
    write_opcode,
)
from tests.support import REPO
from tests.support.wire import (
    MODES,
    PROBE,
    PROBE_REPLY,
    XETH_FLAGS_FROM_END,
    ack,
    acknowledge_packets,
    any_packet,
    data,
    data_packets,
    forge,
    icrc,
    make_pair,
    normalized,
)

# --- round trips -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@given(pkt=any_packet)
@settings(max_examples=150, deadline=None)
def test_round_trip_every_packet_type(mode: str, pkt: Packet) -> None:
    tx, rx = make_pair(mode)
    wire = encode(pkt, tx)
    got = decode(wire, rx)
    assert normalized(got) == normalized(pkt)
    assert type(got) is type(pkt)


@pytest.mark.parametrize("mode", MODES)
@given(pkt=data_packets)
@settings(max_examples=60, deadline=None)
def test_data_length_is_headers_payload_trailer(mode: str, pkt: DataPacket) -> None:
    tx, _ = make_pair(mode)
    hlen = DATA_HDR_LEN if pkt.imm is None else DATA_IMM_HDR_LEN
    assert len(encode(pkt, tx)) == hlen + len(pkt.payload) + tx.trailer_len


@pytest.mark.parametrize("mode", MODES)
@given(pkt=any_packet)
@settings(max_examples=100, deadline=None)
def test_encoded_length_is_the_datagram_length(mode: str, pkt: Packet) -> None:
    tx, _ = make_pair(mode)
    assert encoded_length(pkt, tx.trailer_len) == len(encode(pkt, tx))


@given(pkt=any_packet | acknowledge_packets, no_ts=st.booleans(), trimmed=st.booleans())
@settings(max_examples=200, deadline=None)
def test_plain_encoded_length_is_the_datagram_length(
    pkt: Packet, no_ts: bool, trimmed: bool
) -> None:
    """Without the extension too, for writes with and without TSETH, trimmed or not."""
    if type(pkt) is DataPacket:
        pkt = dataclasses.replace(pkt, ts_ns=-1) if no_ts else pkt
        pkt = trim(pkt, lasthop=False) if trimmed else pkt
    elif type(pkt) is AckPacket:  # (DUPLICATE needs the extension's XFETH)
        pkt = dataclasses.replace(pkt, flags=pkt.flags & ~FeedbackFlags.DUPLICATE)
    crc = CrcIntegrity()
    assert plain_encoded_length(pkt, crc.trailer_len) == len(encode_plain(pkt, crc))


@pytest.mark.parametrize("mode", MODES)
@given(pkt=any_packet, spare=st.integers(0, 40))
@settings(max_examples=100, deadline=None)
def test_encode_into_writes_the_bytes_encode_returns(mode: str, pkt: Packet, spare: int) -> None:
    tx, _ = make_pair(mode)
    tx2, _ = make_pair(mode)  # (a sender seals each tx_seq once: a second one)
    wire = encode(pkt, tx)
    out = bytearray(b"\xee") * (len(wire) + spare)
    assert encode_into(pkt, tx2, memoryview(out)) == len(wire)
    assert out[: len(wire)] == wire
    assert out[len(wire) :] == b"\xee" * spare  # nothing written past the datagram


@pytest.mark.parametrize("mode", MODES)
def test_encode_into_counts_any_payload_view_in_bytes(mode: str) -> None:
    """A payload given as a view of another shape (2-D bytes, 32-bit items) or a slice of
    a buffer encodes to the same datagram as the same bytes: its length is in bytes."""
    raw = bytes(range(256)) * 4
    views = [
        memoryview(bytearray(raw))[100:612],
        memoryview(bytearray(raw[:512])).cast("B", (16, 32)),
        memoryview(bytearray(raw[:512])).cast("I"),
    ]
    for view in views:
        tx, _ = make_pair(mode)
        tx2, _ = make_pair(mode)
        want = encode(data(payload=bytes(view.tobytes())), tx)
        out = bytearray(len(want) + 8)
        assert encode_into(data(payload=view), tx2, out) == len(want)
        assert out[: len(want)] == want


@pytest.mark.parametrize("mode", MODES)
def test_encode_into_a_buffer_too_small_is_refused(mode: str) -> None:
    tx, _ = make_pair(mode)
    pkt = data()
    size = encoded_length(pkt, tx.trailer_len)
    with pytest.raises(WireUsageError):
        encode_into(pkt, tx, bytearray(size - 1))
    with pytest.raises(WireUsageError):
        encode_into(ack(), tx, bytearray(4))


def test_encode_into_names_a_bad_field_as_encode_does() -> None:
    tx, _ = make_pair("aead")
    bad = data(psn=1 << 24)
    with pytest.raises(WireUsageError, match="psn") as want:
        encode(bad, tx)
    with pytest.raises(WireUsageError) as got:
        encode_into(bad, tx, bytearray(9000))
    assert str(got.value) == str(want.value)


#: What refuses a non-packet: the codec (as Python), or the call itself (compiled, mypyc).
NOT_A_PACKET = (
    (TypeError, "DataPacket.* object expected; got str")
    if native.compiled()
    else (WireUsageError, "not an MRC packet: str")
)


def test_encoded_length_refuses_non_packets() -> None:
    with pytest.raises(NOT_A_PACKET[0], match=NOT_A_PACKET[1]):
        encoded_length("x", 4)  # type: ignore[arg-type]


@pytest.mark.parametrize("psn", [0, 1, PSN_MASK - 1, PSN_MASK])
def test_psn_edges_round_trip(psn: int) -> None:
    crc = CrcIntegrity()
    assert decode(encode(data(psn=psn), crc), crc).psn == psn  # type: ignore[union-attr]
    pkt = ack(cum_psn=psn, echo_psn=(psn + 5) & PSN_MASK, sack_base=(psn - 7) & PSN_MASK)
    assert decode(encode(pkt, crc), crc) == pkt  # offsets across the PSN wrap


@pytest.mark.parametrize("psn", [PSN_MOD, -1, 1 << 32])
def test_psn_out_of_range_is_a_local_error(psn: int) -> None:
    with pytest.raises(WireUsageError, match="psn"):
        encode(data(psn=psn), CrcIntegrity())


def test_a_field_of_the_wrong_type_is_refused() -> None:
    """By the codec, which names the field (the packets as Python); compiled (mypyc), a
    packet cannot be made with it."""
    if native.compiled():
        with pytest.raises(TypeError, match="int object expected; got float"):
            data(va=1.5)
        return
    with pytest.raises(WireUsageError, match=r"\.va\b"):
        encode(data(va=1.5), CrcIntegrity())


@pytest.mark.parametrize(
    ("pkt", "field"),
    [
        (data(qpn=1 << 24), "qpn"),
        (data(va=1 << 64), "va"),
        (data(rkey=-1), "rkey"),
        (data(ev=1 << 32), "ev"),
        (data(port=256), "port"),
        (data(tx_seq=1 << 64), "tx_seq"),
        (data(ts_ns=-5), "ts_ns"),
        (data(imm=1 << 32), "imm"),
        (ack(msn=1 << 24), "msn"),
        (ack(sack_base=1 << 24), "sack_base"),
        (ack(sack_bitmap=1 << 64), "sack_bitmap"),
        (ack(port_state=1 << 16), "port_state"),
        (ack(ooo_count=1 << 15), "ooo_count"),
        (ack(rcv_bytes=1 << 24), "rcv_bytes"),
        (data(msn=1 << 16), "msn"),
        (ack(echo_psn=(0x00FFFE + (1 << 15)) & PSN_MASK), "echo_psn"),
        (ack(sack_base=(0x00FFFE - (1 << 15) - 1) & PSN_MASK), "sack_base"),
        (dataclasses.replace(PROBE, ts_ns=1 << 64), "ts_ns"),
        (dataclasses.replace(PROBE_REPLY, probe_id=1 << 16), "probe_id"),
        (dataclasses.replace(PROBE, port_state=1 << 32), "port_state"),
        (data(rq_msn=1 << 16), "rq_msn"),
        (ack(scid=1 << 16), "scid"),
    ],
)
def test_out_of_range_field_is_named(pkt: Packet, field: str) -> None:
    with pytest.raises(WireUsageError, match=rf"\.{field}\b") as info:
        encode(pkt, CrcIntegrity())
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, LocalError)


@pytest.mark.parametrize(
    "pkt",
    [
        data(flags=0x10),
        data(flags=DataFlags.TRIM_LASTHOP),
        data(flags=DataFlags.FIRST, imm=5),  # an immediate only on the last packet
        data(flags=DataFlags.TRIMMED, dma_len=10),  # trimmed but carries a payload
        data(payload=b"", flags=DataFlags.TRIMMED),  # trimmed needs dma_len >= 0
        ack(nack_reason=0x55),
        ack(flags=0x10),
        ack(nack_reason=NackReason.TRIMMED, flags=FeedbackFlags.PROBE_RESPONSE),
        ack(skip=3),
        ack(window=100),
        ack(window=256 * 128),
        dataclasses.replace(PROBE, qpn=7),  # endpoint operations go to QP 2
        dataclasses.replace(PROBE_REPLY, op=2),
    ],
)
def test_invalid_combinations_are_refused(pkt: Packet) -> None:
    with pytest.raises(WireUsageError):
        encode(pkt, CrcIntegrity())


def test_encode_refuses_non_packets() -> None:
    with pytest.raises(NOT_A_PACKET[0], match=NOT_A_PACKET[1]):
        encode("hello", CrcIntegrity())  # type: ignore[arg-type]


def test_payload_may_be_a_memoryview_or_bytearray() -> None:
    crc = CrcIntegrity()
    raw = bytes(range(256)) * 4
    words = memoryview(bytearray(raw)).cast("I")  # len() counts 4-byte items here
    for payload in (memoryview(raw)[10:20], bytearray(raw), words):
        got = decode(encode(data(payload=payload), crc), crc)  # type: ignore[arg-type]
        assert isinstance(got, DataPacket)
        assert bytes(got.payload) == bytes(payload)
        assert got.dma_len == len(bytes(payload))


# --- the exact layout (docs/wire-format.md's conformance table) ---------------------------


def test_write_layout_offsets() -> None:
    pkt = data(payload=b"P" * 10, flags=DataFlags.FIRST | DataFlags.LAST | DataFlags.RETX)
    wire = encode(pkt, CrcIntegrity())
    assert wire[0] == Opcode.RDMA_WRITE_ONLY
    assert wire[1] == 0  # M, SE, PadCnt, TVer
    assert int.from_bytes(wire[2:4]) == BTH_PKEY
    assert wire[4] == 0
    assert int.from_bytes(wire[5:8]) == pkt.qpn
    assert wire[8] == BthFlags.RTX | BthFlags.TS  # A clear
    assert int.from_bytes(wire[9:12]) == pkt.psn
    assert int.from_bytes(wire[12:14]) == pkt.rq_msn  # METH RQ MSN
    assert int.from_bytes(wire[14:16]) == pkt.msn
    assert int.from_bytes(wire[16:18]) == (pkt.ts_ns >> TS_UNIT_NS_SHIFT) & 0xFFFF  # TSETH
    assert int.from_bytes(wire[18:20]) == 0x0001  # TSR 0, ftype 1
    assert int.from_bytes(wire[20:28]) == pkt.va
    assert int.from_bytes(wire[28:32]) == pkt.rkey
    assert int.from_bytes(wire[32:36]) == 10  # RETH DMA length: the write's (one packet here)
    xeth = wire[36:68]
    assert xeth[0] == MRC_EXT_VERSION
    assert xeth[1] == 0  # switch-writable flags
    assert xeth[2] == pkt.port
    assert xeth[3] == 0
    assert int.from_bytes(xeth[4:8]) == pkt.ev
    assert int.from_bytes(xeth[8:16]) == pkt.tx_seq
    assert int.from_bytes(xeth[16:24]) == pkt.ts_ns
    assert int.from_bytes(xeth[24:28]) == 0  # offset: where this payload sits in its write
    assert int.from_bytes(xeth[28:32]) == crc32_header(wire[:68])
    assert wire[68:78] == b"P" * 10
    assert wire[78:] == icrc(wire[:78])


@pytest.mark.parametrize(
    ("flags", "imm", "opcode"),
    [
        (DataFlags.FIRST, None, Opcode.RDMA_WRITE_FIRST),
        (0, None, Opcode.RDMA_WRITE_MIDDLE),
        (DataFlags.LAST, None, Opcode.RDMA_WRITE_LAST),
        (DataFlags.LAST, 7, Opcode.RDMA_WRITE_LAST_IMM),
        (DataFlags.FIRST | DataFlags.LAST, None, Opcode.RDMA_WRITE_ONLY),
        (DataFlags.FIRST | DataFlags.LAST, 7, Opcode.RDMA_WRITE_ONLY_IMM),
    ],
)
def test_write_opcodes(flags: int, imm: int | None, opcode: int) -> None:
    crc = CrcIntegrity()
    wire = encode(data(flags=flags, imm=imm), crc)
    assert wire[0] == opcode == write_opcode(flags, imm)
    got = decode(wire, crc)
    assert isinstance(got, DataPacket)
    assert got.flags & (DataFlags.FIRST | DataFlags.LAST) == flags
    assert got.imm == imm


def test_immediate_sits_between_reth_and_extension() -> None:
    wire = encode(data(imm=0x01020304), CrcIntegrity())
    assert wire[0] == Opcode.RDMA_WRITE_LAST_IMM
    assert wire[36:40] == bytes([1, 2, 3, 4])
    assert wire[40] == MRC_EXT_VERSION


def test_sack_layout() -> None:
    pkt = ack(skip=SkipHint.SKIP_ONCE, ooo_count=5, rcv_bytes=0x123456, window=256, scid=0x77)
    wire = encode(pkt, CrcIntegrity())
    assert len(wire) == SACK_HDR_LEN + CRC_TRAILER_LEN
    assert wire[0] == Opcode.RELIABILITY_SACK
    assert int.from_bytes(wire[9:12]) == pkt.cum_psn
    seth = wire[12:40]
    assert seth[0] == 0x0F  # type 0; next header 0x1F (mrcstack's XFETH): bits 3-0 ...
    assert seth[1] == 0x80 | SkipHint.SKIP_ONCE << 5  # ... and bit 7 here; m in bits 6-5
    assert int.from_bytes(seth[2:4], signed=True) == pkt.echo_psn - pkt.cum_psn
    assert int.from_bytes(seth[4:8]) == pkt.echo_ev  # entropy of the acknowledged packet
    assert int.from_bytes(seth[8:10]) == 0x77  # source context id: the sending QP
    assert int.from_bytes(seth[10:12]) == pkt.qpn & 0xFFFF  # destination context id
    assert seth[12] == 0
    assert int.from_bytes(seth[13:16]) == pkt.cum_psn
    assert seth[16] == 0x01  # cc flags: ECN echo
    assert seth[17] == 2  # MPR: 256 PSNs
    assert int.from_bytes(seth[18:20], signed=True) == pkt.sack_base - pkt.cum_psn
    assert int.from_bytes(seth[20:28]) == pkt.sack_bitmap
    cc = wire[40:48]
    assert int.from_bytes(cc[0:2]) == (pkt.echo_ts_ns >> TS_UNIT_NS_SHIFT) & 0xFFFF
    assert int.from_bytes(cc[2:4]) == 5  # ooo_count
    assert int.from_bytes(cc[5:8]) == 0x123456  # received bytes
    xf = wire[48:84]
    assert xf[0] == MRC_EXT_VERSION
    assert int.from_bytes(xf[24:28]) == pkt.msn
    assert int.from_bytes(xf[28:30]) == pkt.port_state


@pytest.mark.parametrize("reason", list(NackReason))
def test_nack_layout(reason: NackReason) -> None:
    pkt = ack(nack_reason=reason, flags=0, scid=0x99)
    wire = encode(pkt, CrcIntegrity())
    assert len(wire) == NACK_HDR_LEN + CRC_TRAILER_LEN == BTH_LEN + 20 + XFETH_LEN + 4
    assert wire[0] == Opcode.RELIABILITY_NACK
    assert int.from_bytes(wire[9:12]) == pkt.echo_psn  # the BTH PSN is the NACKed one
    neth = wire[12:32]
    assert neth[0] == 0x0F and neth[1] == 0x80  # type 0, next: mrcstack's XFETH
    assert neth[2] == reason
    assert int.from_bytes(neth[4:8]) == pkt.echo_ev
    assert int.from_bytes(neth[8:10]) == 0x99 and int.from_bytes(neth[10:12]) == pkt.qpn & 0xFFFF
    assert int.from_bytes(neth[13:16]) == pkt.echo_psn
    assert int.from_bytes(neth[18:20]) == (pkt.echo_ts_ns >> TS_UNIT_NS_SHIFT) & 0xFFFF
    assert wire[32] == MRC_EXT_VERSION  # XFETH follows: no SETH, no CC_STATE
    assert decode(wire, CrcIntegrity()) == normalized(pkt)


def test_probe_layouts() -> None:
    crc = CrcIntegrity()
    probe = encode(PROBE, crc)
    assert len(probe) == PROBE_HDR_LEN + CRC_TRAILER_LEN
    assert probe[0] == Opcode.ENDPOINT_REQUEST
    assert int.from_bytes(probe[5:8]) == 2  # the endpoint's QP, section 7.4.7
    assert int.from_bytes(probe[9:12]) == PROBE.probe_id  # the probe id in PSN[15:0]
    assert probe[BTH_LEN + 1] == 0x80 | EndpointOp.EV_PROBE  # next[0], op in bits 1-0
    assert int.from_bytes(probe[BTH_LEN + 4 : BTH_LEN + 8]) == PROBE.port_state
    assert int.from_bytes(probe[BTH_LEN + 12 : BTH_LEN + 14]) == 42  # ts in 1.024 us units
    reply = encode(PROBE_REPLY, crc)
    assert len(reply) == PROBE_REPLY_HDR_LEN + CRC_TRAILER_LEN
    assert reply[0] == Opcode.ENDPOINT_RESPONSE
    assert int.from_bytes(reply[9:12]) == PROBE_REPLY.probe_id
    assert reply[BTH_LEN + 1] == 0x80 | EndpointOp.EV_PROBE << 4  # op in bits 5-4
    assert reply[BTH_LEN + 2 : BTH_LEN + 28] == bytes(26)  # reserved
    assert int.from_bytes(reply[BTH_LEN + 28 : BTH_LEN + 30]) == 0  # ts echo: 42 ns >> 10
    assert reply[BTH_LEN + 30 : BTH_LEN + 36] == bytes(6)  # reserved


@given(pkt=any_packet)
@settings(max_examples=60, deadline=None)
def test_hdr_check_matches_the_helper(pkt: Packet) -> None:
    wire = encode(pkt, CrcIntegrity())
    hlen = header_length(wire[0])
    assert int.from_bytes(wire[hlen - 4 : hlen]) == crc32_header(wire[:hlen])


@given(pkt=any_packet)
@settings(max_examples=100, deadline=None)
def test_icrc_is_the_rocev2_invariant_crc(pkt: Packet) -> None:
    """The trailer is the ICRC computed from the RoCEv2 rules, not from the codec."""
    wire = encode(pkt, CrcIntegrity())
    assert wire[-4:] == icrc(wire[:-4])


def test_icrc_covers_the_addresses() -> None:
    src, dst = bytes.fromhex("fd00" + "00" * 13 + "01"), bytes.fromhex("fd00" + "00" * 13 + "02")
    tx = CrcIntegrity((IcrcPath(src, dst, local_port=50000),))
    rx = CrcIntegrity((IcrcPath(dst, src, peer_port=50000),))
    wire = encode(data(port=0), tx)
    assert wire[-4:] == icrc(wire[:-4], src, dst, sport=50000)
    assert isinstance(decode(wire, rx), DataPacket)  # the peer's view verifies
    with pytest.raises(DecodeError) as info:
        decode(wire, CrcIntegrity())  # other addresses: another packet
    assert info.value.reason is DecodeReason.BAD_CHECKSUM
    with pytest.raises(DecodeError):
        decode(encode(data(port=1), tx), rx)  # no addresses for plane 1


def test_header_and_trimmed_lengths() -> None:
    assert trimmed_length(Opcode.RDMA_WRITE_ONLY) == 68
    assert trimmed_length(Opcode.RDMA_WRITE_MIDDLE) == 68
    assert trimmed_length(Opcode.RDMA_WRITE_ONLY_IMM) == 72
    assert trimmed_length(Opcode.RDMA_WRITE_LAST_IMM) == 72
    assert header_length(Opcode.RELIABILITY_SACK) == 84
    assert header_length(Opcode.RELIABILITY_NACK) == 68
    assert header_length(Opcode.ACKNOWLEDGE) == 16
    assert header_length(Opcode.ENDPOINT_REQUEST) == 60
    assert header_length(Opcode.ENDPOINT_RESPONSE) == 84
    with pytest.raises(WireUsageError):
        trimmed_length(Opcode.RELIABILITY_SACK)
    with pytest.raises(WireUsageError):
        header_length(0x42)


def test_peek_qpn() -> None:
    crc = CrcIntegrity()
    assert peek_qpn(encode(data(qpn=0xABCDEF), crc)) == 0xABCDEF
    assert peek_qpn(memoryview(encode(ack(qpn=5), crc))) == 5
    with pytest.raises(DecodeError) as info:
        peek_qpn(b"\xca" * 11)
    assert info.value.reason is DecodeReason.TRUNCATED


def test_probe_id_is_read_where_decode_finds_it() -> None:
    crc = CrcIntegrity()
    for pkt in (PROBE, PROBE_REPLY):
        wire = encode(pkt, crc)
        assert probe_id(wire) == probe_id(memoryview(wire)) == decode(wire, crc).probe_id  # type: ignore[union-attr]
        assert int.from_bytes(wire[BTH_QPN_BYTES], "big") == peek_qpn(wire) == pkt.qpn


@pytest.mark.parametrize("mode", MODES)
@given(pkt=any_packet)
@settings(max_examples=100, deadline=None)
def test_flags_aead_tag_says_which_integrity_opens_a_control_packet(mode: str, pkt: Packet) -> None:
    """Read from the extension's flags: True exactly for a control packet sealed with
    AES-GCM; a write never says (its QP's negotiation does)."""
    tx, _ = make_pair(mode)
    wire = encode(pkt, tx)
    expected = has_extension(wire) and mode != "crc"
    assert flags_aead_tag(wire) is expected
    assert flags_aead_tag(memoryview(wire)) is expected
    if not has_extension(wire):
        assert type(pkt) is DataPacket


@pytest.mark.parametrize("short", [b"", b"\x0a", bytes(PROBE_HDR_LEN - 1)])
def test_flags_aead_tag_on_too_little_is_false(short: bytes) -> None:
    assert flags_aead_tag(short) is False


# --- decode: no copy, input kinds ----------------------------------------------------------


def test_crc_payload_is_a_view_of_the_datagram() -> None:
    wire = encode(data(payload=b"x" * 100), CrcIntegrity())
    got = decode(wire, CrcIntegrity())
    assert isinstance(got, DataPacket)
    assert isinstance(got.payload, memoryview)
    assert got.payload.obj is wire
    assert bytes(got.payload) == b"x" * 100


def test_decode_accepts_bytearray_and_non_byte_views() -> None:
    crc = CrcIntegrity()
    wire = encode(data(payload=b"abcd" * 8), crc)  # 64 + 32 + 4 = 100 bytes, a multiple of 4
    assert normalized(decode(bytearray(wire), crc)) == normalized(decode(wire, crc))
    assert normalized(decode(memoryview(wire).cast("I"), crc)) == normalized(decode(wire, crc))


# --- tampering ---------------------------------------------------------------------------


TAMPER_PACKETS = [data(), data(imm=0xFEEDF00D, payload=b"z" * 7), data(payload=b""), ack(), PROBE]
TAMPER_PACKETS += [PROBE_REPLY, ack(nack_reason=NackReason.TRIMMED_LASTHOP)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pkt", TAMPER_PACKETS, ids=lambda p: type(p).__name__)
def test_any_single_byte_change_is_rejected(mode: str, pkt: Packet) -> None:
    """Every byte of an untrimmed packet is covered by a check: none may change unnoticed."""
    tx, rx = make_pair(mode)
    wire = encode(pkt, tx)
    assert normalized(decode(wire, rx)) == normalized(pkt)
    for offset in range(len(wire)):
        for xor in (0x01, 0x40, 0x80, 0xFF):
            bad = bytearray(wire)
            bad[offset] ^= xor
            with pytest.raises(DecodeError):
                decode(bytes(bad), rx)


@pytest.mark.parametrize("mode", MODES)
def test_truncated_or_extended_packets_are_rejected(mode: str) -> None:
    tx, rx = make_pair(mode)
    wire = encode(data(imm=5), tx)
    for size in range(len(wire)):
        if size == DATA_IMM_HDR_LEN:
            continue  # headers only, TRIMMED clear: covered below
        with pytest.raises(DecodeError):
            decode(wire[:size], rx)
    with pytest.raises(DecodeError) as info:
        decode(wire[:DATA_IMM_HDR_LEN], rx)
    assert info.value.reason is DecodeReason.TRUNCATED
    with pytest.raises(DecodeError):
        decode(wire + b"\x00", rx)


def test_setting_trimmed_on_a_full_packet_is_a_length_error() -> None:
    crc = CrcIntegrity()
    wire = bytearray(encode(data(), crc))
    wire[DATA_HDR_LEN - XETH_FLAGS_FROM_END] |= DataFlags.TRIMMED
    with pytest.raises(DecodeError) as info:
        decode(bytes(wire), crc)
    assert info.value.reason is DecodeReason.BAD_LENGTH


@pytest.mark.parametrize(
    ("offset", "value", "reason"),
    [
        (1, 0x40, DecodeReason.BAD_FIELD),  # BTH MigReq
        (2, 0x7F, DecodeReason.BAD_FIELD),  # P_Key
        (4, 0x01, DecodeReason.BAD_FIELD),  # BTH reserved byte
        (8, 0x50, DecodeReason.BAD_FIELD),  # R
        (8, 0x18, DecodeReason.BAD_FIELD),  # BTH reserved bits
        (8, 0x00, DecodeReason.BAD_FIELD),  # no TSETH: mrcstack's extension always has one
        (19, 0x02, DecodeReason.BAD_FIELD),  # TSETH ftype
        (35, 0x01, DecodeReason.BAD_LENGTH),  # RETH DMA length != payload
        (36, 1, DecodeReason.BAD_VERSION),  # mrcstack extension version (1: pre-OCP)
        (36, 3, DecodeReason.BAD_VERSION),  # 3: before the transcription's positions
        (37, 0x08, DecodeReason.BAD_FIELD),  # unknown flag bit
        (37, 0x80, DecodeReason.BAD_FIELD),  # TRIM_LASTHOP without TRIMMED
        (39, 0x01, DecodeReason.BAD_FIELD),  # reserved byte
    ],
)
def test_field_sanity_even_with_valid_checks(offset: int, value: int, reason: DecodeReason) -> None:
    crc = CrcIntegrity()
    wire = forge(encode(data(), crc), offset, value)
    with pytest.raises(DecodeError) as info:
        decode(wire, crc)
    assert info.value.reason is reason


@pytest.mark.parametrize("opcode", [0x00, 0x0A, 0x0B, 0x11, 0x64, 0xC0, 0xC5, 0xD0, 0xDF, 0xFF])
def test_unknown_opcodes(opcode: int) -> None:
    wire = bytearray(encode(data(), CrcIntegrity()))
    wire[0] = opcode
    with pytest.raises(DecodeError) as info:
        decode(bytes(wire), CrcIntegrity())
    assert info.value.reason is DecodeReason.BAD_OPCODE


@pytest.mark.parametrize(
    ("nack", "offset", "value"),
    [
        (False, 9, 0x01),  # BTH PSN differs from SETH cack_psn
        (False, 8, 0x80),  # BTH A on feedback
        (False, 12, 0x1F),  # SETH type not 0
        (False, 12, 0x0E),  # next header not mrcstack's extension (the QP negotiated it)
        (False, 13, 0xE0),  # m = 3 is not a hint
        (False, 13, 0x84),  # reserved bit 2
        (False, 13, 0x81),  # reserved bit 0
        (False, 23, 0x01),  # destination context id is not the QP's
        (False, 24, 0x01),  # reserved byte
        (False, 28, 0x02),  # unknown cc flag
        (False, 42, 0x80),  # CC_STATE reserved bit
        (False, 40, 0x00),  # timestamp echo differs from XFETH's
        (False, 48 + 1, 0x04),  # unknown XFETH flag
        (False, 48 + 30, 0x01),  # XFETH reserved u16
        (True, 12, 0x0E),  # NETH next header is not mrcstack's extension
        (True, 13, 0x81),  # NETH reserved bits
        (True, 14, 0x55),  # unknown NACK reason
        (True, 15, 0x01),  # vendor info
        (True, 23, 0x00),  # destination context id is not the QP's
        (True, 24, 0x01),  # reserved byte
        (True, 25, 0x02),  # NACK PSN differs from the BTH's
        (True, 29, 0x01),  # reserved byte
        (True, 30, 0x00),  # timestamp differs from XFETH's
    ],
)
def test_feedback_field_sanity(nack: bool, offset: int, value: int) -> None:
    crc = CrcIntegrity()
    wire = forge(encode(ack(nack_reason=NackReason.TRIMMED if nack else 0), crc), offset, value)
    with pytest.raises(DecodeError) as info:
        decode(wire, crc)
    assert info.value.reason is DecodeReason.BAD_FIELD


def test_probe_reply_with_stray_fields_is_rejected() -> None:
    crc = CrcIntegrity()
    wire = forge(encode(PROBE_REPLY, crc), 12 + 20, 0x01)  # EETH reserved words
    with pytest.raises(DecodeError) as info:
        decode(wire, crc)
    assert info.value.reason is DecodeReason.BAD_FIELD


def test_crc_mismatch_reason() -> None:
    crc = CrcIntegrity()
    wire = bytearray(encode(data(), crc))
    wire[70] ^= 1  # payload byte: header check still fine
    with pytest.raises(DecodeError) as info:
        decode(bytes(wire), crc)
    assert info.value.reason is DecodeReason.BAD_CHECKSUM


# --- trimming ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("lasthop", [False, True])
@pytest.mark.parametrize("imm", [None, 0xA5A5A5A5])
def test_trimmed_packets_decode_with_flags(mode: str, lasthop: bool, imm: int | None) -> None:
    tx, rx = make_pair(mode)
    pkt = data(imm=imm, payload=b"q" * 4000)
    wire = encode(pkt, tx)
    trimmed = encode_trimmed(wire, lasthop)
    assert len(trimmed) == trimmed_length(wire[0])
    got = decode(trimmed, rx)
    assert isinstance(got, DataPacket)
    assert got.trimmed
    assert bool(got.flags & DataFlags.TRIM_LASTHOP) == lasthop
    assert got.payload == b""
    assert got.dma_len == 4000
    expected_flags = pkt.flags | DataFlags.TRIMMED | (DataFlags.TRIM_LASTHOP if lasthop else 0)
    assert got == dataclasses.replace(pkt, payload=b"", flags=expected_flags, dma_len=4000)


@given(pkt=data_packets, lasthop=st.booleans())
@settings(max_examples=60, deadline=None)
def test_trimmed_packet_objects_round_trip(pkt: DataPacket, lasthop: bool) -> None:
    crc = CrcIntegrity()
    trimmed = encode_trimmed(encode(pkt, crc), lasthop)
    got = decode(trimmed, crc)
    assert encode(got, crc) == trimmed  # a trimmed DataPacket encodes to the switch's bytes


@pytest.mark.parametrize("mode", MODES)
@given(pkt=data_packets, lasthop=st.booleans())
@settings(max_examples=60, deadline=None)
def test_trim_is_what_the_receiver_decodes_from_a_trimmed_datagram(
    mode: str, pkt: DataPacket, lasthop: bool
) -> None:
    tx, rx = make_pair(mode)
    cut = encode_trimmed(encode(pkt, tx), lasthop)
    got = trim(pkt, lasthop)
    assert decode(cut, rx) == got
    assert encoded_length(got, tx.trailer_len) == len(cut)


def test_trimmed_header_is_still_checked() -> None:
    crc = CrcIntegrity()
    trimmed = encode_trimmed(encode(data(), crc), lasthop=False)
    flags_at = DATA_HDR_LEN - XETH_FLAGS_FROM_END
    for offset in range(len(trimmed)):
        for xor in (0x01, 0x10, 0xFF):
            bad = bytearray(trimmed)
            bad[offset] ^= xor
            if offset == flags_at and not xor & ~0xC0:
                continue
            with pytest.raises(DecodeError):
                decode(bytes(bad), crc)
    with pytest.raises(DecodeError) as info:
        decode(trimmed + b"\x00", crc)  # trimmed packets are exactly their headers
    assert info.value.reason is DecodeReason.BAD_LENGTH


def test_switch_bits_are_outside_hdr_check() -> None:
    """Honest limit: anyone on the path can set TRIM_LASTHOP on a trimmed header."""
    crc = CrcIntegrity()
    trimmed = bytearray(encode_trimmed(encode(data(), crc), lasthop=False))
    trimmed[DATA_HDR_LEN - XETH_FLAGS_FROM_END] |= DataFlags.TRIM_LASTHOP
    got = decode(bytes(trimmed), crc)
    assert got.flags & DataFlags.TRIM_LASTHOP  # type: ignore[union-attr]


def test_encode_trimmed_refuses_non_data() -> None:
    crc = CrcIntegrity()
    with pytest.raises(WireUsageError):
        encode_trimmed(encode(ack(), crc), lasthop=False)
    with pytest.raises(WireUsageError):
        encode_trimmed(encode(data(imm=1), crc)[:71], lasthop=False)


# --- errors --------------------------------------------------------------------------------


def test_decode_error_names_its_side_and_survives_pickle() -> None:
    err = DecodeError(DecodeReason.BAD_AUTH, "tag does not verify")
    assert isinstance(err, PeerError)
    assert "bad_auth" in str(err)
    copy = pickle.loads(pickle.dumps(err))
    assert copy.reason is DecodeReason.BAD_AUTH
    assert str(copy) == str(err)


@pytest.mark.parametrize("junk", [b"", b"\xca", b"\xff" * 100, bytes(68), "text", 42, None])
def test_decode_junk_raises_decode_error(junk: object) -> None:
    with pytest.raises(DecodeError):
        decode(junk, CrcIntegrity())  # type: ignore[arg-type]


DOCS = REPO / "docs" / "wire-format.md"


def test_worked_example_in_the_docs() -> None:
    """The hex dump in docs/wire-format.md is what encode() produces today."""
    text = DOCS.read_text()
    block = text.split("<!-- worked-example:begin -->")[1].split("<!-- worked-example:end -->")[0]
    dumped = bytes.fromhex(" ".join(line[6:] for line in block.splitlines() if line[:4].isalnum()))
    pkt = DataPacket(
        qpn=0x000101, psn=0x000010, va=0x00007F0000002000, rkey=0x12345678,
        payload=b"MRC!hello,world!", ev=0x00020005, port=2, tx_seq=42,
        ts_ns=1_000_000_000, flags=DataFlags.LAST, imm=0xCAFE0001, msn=3, dma_len=4112,
        offset=4096,
    )  # fmt: skip
    assert dumped == encode(pkt, CrcIntegrity())
    trimmed = encode_trimmed(dumped, lasthop=True)
    assert trimmed[0x29] == 0xC0
    assert trimmed == dumped[:0x29] + b"\xc0" + dumped[0x2A:72]


def test_reliability_probe_layout() -> None:
    probe = ReliabilityProbePacket(qpn=9, probe_id=0x1234, ev=0x102, port=1, tx_seq=5,
                                   ts_ns=7 << 10)  # fmt: skip
    wire = encode(probe, CrcIntegrity())
    assert len(wire) == RELIABILITY_PROBE_HDR_LEN + CRC_TRAILER_LEN
    assert wire[0] == Opcode.RELIABILITY_PROBE_REQ
    peth = wire[12:28]
    assert peth[0] == 0x0F and peth[1] == 0x80  # type 0, next header mrcstack's XETH
    assert int.from_bytes(peth[4:6]) == 0x1234
    assert int.from_bytes(peth[10:12]) == 9  # destination context id: the QP
    assert int.from_bytes(peth[12:14]) == 7  # tx_timestamp in 1.024 us units
    assert int.from_bytes(peth[14:16]) == 0x0001  # ftype
    assert decode(wire, CrcIntegrity()) == probe
