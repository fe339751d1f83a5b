"""mrcstack against the public transcription of OCP MRC 1.0 (anichol67/MRC-Client), both ways.

Its builder's packets (``tests/wire/data/transcription_vectors.json``, with its source and
commit) decode with ``decode_plain`` into exactly the fields it was given; mrcstack's own
packets, read by its parser, come out with every key field right, for every packet type.
The vectors correct its three departures from RoCEv2 (P_Key, trailer, UDP port) and change
nothing else, which the first test checks against the bytes as it built them.
"""

from __future__ import annotations

from typing import Any

import pytest

from mrcstack.wire import (
    AcknowledgePacket,
    AckPacket,
    CrcIntegrity,
    DataFlags,
    DataPacket,
    FeedbackFlags,
    IcrcPath,
    PortStatusPacket,
    ProbePacket,
    ProbeReplyPacket,
    ReliabilityProbePacket,
    decode_plain,
    encode_plain,
    ev_from_outer,
)
from tests.support.transcription import DST, MRCSTACK_PACKETS, SOURCE, SRC, Ours, load

DATA = load()
VECTORS = {v["name"]: v for v in DATA["vectors"]}
#: The transcription's packet types (opcodes), and a port status update besides.
TYPES = {
    "RDMA_WRITE_FIRST", "RDMA_WRITE_MIDDLE", "RDMA_WRITE_LAST", "RDMA_WRITE_LAST_IMM",
    "RDMA_WRITE_ONLY", "RDMA_WRITE_ONLY_IMM", "ACKNOWLEDGE", "ENDPOINT_REQUEST",
    "ENDPOINT_RESPONSE", "RELIABILITY_SACK", "RELIABILITY_NACK", "RELIABILITY_PROBE_REQ",
}  # fmt: skip


def test_the_data_says_where_it_came_from() -> None:
    assert DATA["source"] == SOURCE and len(DATA["commit"]) == 40
    opcodes = {int(v["udp_payload"][:2], 16) for v in DATA["vectors"]}
    assert opcodes == {0xC6, 0xC7, 0xC8, 0xC9, 0xCA, 0xCB, 0xD1, 0xD8, 0xD9, 0xDC, 0xDD, 0xDE}


@pytest.mark.parametrize("name", list(VECTORS))
def test_only_the_rocev2_departures_were_corrected(name: str) -> None:
    vector = VECTORS[name]
    fixed, built = (
        bytes.fromhex(vector["udp_payload"]),
        bytes.fromhex(vector["as_built"]["udp_payload"]),
    )
    assert len(fixed) == len(built)
    assert built[2:4] == b"\x00\x00" and fixed[2:4] == b"\xff\xff"  # P_Key
    assert fixed[:2] == built[:2] and fixed[4:-4] == built[4:-4]  # nothing else in between
    assert vector["as_built"]["udp_dport"] == 4971 and vector["outer"]["dport"] == 4791


def _decode(vector: dict[str, Any]) -> Any:
    outer = vector["outer"]
    crc = CrcIntegrity((IcrcPath(outer["dst"], outer["src"]),), ev_ports=True)
    ev = ev_from_outer(outer["sport"], outer["flow_label"])
    return decode_plain(
        bytes.fromhex(vector["udp_payload"]), crc, ev=ev, port=0, tclass=outer["tclass"]
    )


def _ts16(ns: int) -> int | None:
    return None if ns < 0 else ns >> 10


@pytest.mark.parametrize("name", list(VECTORS))
def test_mrcstack_decodes_the_transcriptions_packets(name: str) -> None:
    """Each decodes, with the values the builder was given, and re-encodes to its bytes."""
    vector = VECTORS[name]
    want = vector["expect"]
    pkt = _decode(vector)
    assert pkt.ev == want["ev"]
    if isinstance(pkt, DataPacket):
        got = {
            "opcode": int(vector["udp_payload"][:2], 16), "qpn": pkt.qpn, "psn": pkt.psn,
            "va": pkt.va, "rkey": pkt.rkey, "dma_len": pkt.dma_len, "msn": pkt.msn,
            "rq_msn": pkt.rq_msn, "payload": bytes(pkt.payload).hex(), "ts16": _ts16(pkt.ts_ns),
            "offset": pkt.offset, "first": bool(pkt.flags & DataFlags.FIRST),
            "last": bool(pkt.flags & DataFlags.LAST), "rtx": bool(pkt.flags & DataFlags.RETX),
            "ev": pkt.ev,
        }  # fmt: skip
        if pkt.imm is not None:
            got["imm"] = pkt.imm
    elif isinstance(pkt, AckPacket) and not pkt.nack_reason:
        got = {
            "opcode": 0xDC, "qpn": pkt.qpn, "cum_psn": pkt.cum_psn, "echo_psn": pkt.echo_psn,
            "sack_base": pkt.sack_base, "sack_bitmap": pkt.sack_bitmap, "window": pkt.window,
            "skip": pkt.skip, "pr": int(bool(pkt.flags & FeedbackFlags.PROBE_RESPONSE)),
            "echo_ev": pkt.echo_ev, "ev": pkt.ev, "scid": pkt.scid,
            "ts16": _ts16(pkt.echo_ts_ns), "ooo_count": pkt.ooo_count,
            "rcv_bytes": pkt.rcv_bytes, "cc_type": pkt.cc_type,
            "ecn": bool(pkt.flags & FeedbackFlags.ECN_ECHO),
            "rtx": bool(pkt.flags & FeedbackFlags.RETX),
        }  # fmt: skip
    elif isinstance(pkt, AckPacket):
        got = {
            "opcode": 0xDD, "qpn": pkt.qpn, "echo_psn": pkt.echo_psn,
            "nack_reason": pkt.nack_reason, "echo_ev": pkt.echo_ev, "ev": pkt.ev,
            "scid": pkt.scid, "ts16": _ts16(pkt.echo_ts_ns), "cc_type": pkt.cc_type,
            "ecn": bool(pkt.flags & FeedbackFlags.ECN_ECHO),
        }  # fmt: skip
    elif isinstance(pkt, ReliabilityProbePacket):
        got = {"opcode": 0xDE, "qpn": pkt.qpn, "probe_id": pkt.probe_id, "scid": pkt.scid,
               "ts16": _ts16(pkt.ts_ns), "ev": pkt.ev}  # fmt: skip
    elif isinstance(pkt, ProbePacket | PortStatusPacket):
        got = {"opcode": 0xD8, "qpn": pkt.qpn, "probe_id": pkt.probe_id,
               "op": int(isinstance(pkt, ProbePacket)), "port_state": pkt.port_state,
               "ts16": _ts16(pkt.ts_ns), "ev": pkt.ev}  # fmt: skip
    elif isinstance(pkt, ProbeReplyPacket):
        got = {"opcode": 0xD9, "qpn": pkt.qpn, "probe_id": pkt.probe_id, "op": pkt.op,
               "ts16": _ts16(pkt.echo_ts_ns), "ev": pkt.ev}  # fmt: skip
    else:
        assert isinstance(pkt, AcknowledgePacket)
        got = {"opcode": 0xD1, "qpn": pkt.qpn, "psn": pkt.psn, "syndrome": pkt.syndrome,
               "msn": pkt.msn, "ev": pkt.ev}  # fmt: skip
    assert got == want
    outer = vector["outer"]
    crc = CrcIntegrity((IcrcPath(outer["src"], outer["dst"]),), ev_ports=True)
    assert encode_plain(pkt, crc).hex() == vector["udp_payload"], "not mrcstack's canonical form"


PARSED = {p["type"]: p for p in DATA["parsed_mrcstack"]}


def test_every_packet_type_was_parsed() -> None:
    assert {p.kind for p in MRCSTACK_PACKETS} - {"PORT_STATUS_UPDATE"} == TYPES
    assert set(PARSED) == {p.kind for p in MRCSTACK_PACKETS}


def _key_fields(ours: Ours) -> dict[str, Any]:
    """What the transcription's parser must read from ``ours``, by its own names."""
    pkt = ours.packet
    if isinstance(pkt, DataPacket):
        out: dict[str, Any] = {
            "bth.dqp": pkt.qpn, "bth.psn": pkt.psn, "bth.ts": 1,
            "bth.rtx": int(bool(pkt.flags & DataFlags.RETX)), "meth.msn": pkt.msn,
            "meth.rqmsn": pkt.rq_msn, "tseth.tx_timestamp": pkt.ts_ns >> 10,
            "tseth.ftype": 1, "reth.va": f"0x{pkt.va:016X}", "reth.r_key": f"0x{pkt.rkey:08X}",
            "reth.dmalen": pkt.dma_len, "payload_hex_all": bytes(pkt.payload).hex(),
        }  # fmt: skip
        if pkt.imm is not None:
            out["immdt.value"] = f"0x{pkt.imm:08X}"
        return out
    if isinstance(pkt, AckPacket) and not pkt.nack_reason:
        return {
            "bth.dqp": pkt.qpn, "bth.psn": pkt.cum_psn, "seth.m": pkt.skip,
            "seth.pr": int(bool(pkt.flags & FeedbackFlags.PROBE_RESPONSE)),
            "seth.ack_psn": pkt.echo_psn, "seth.entropy": f"0x{pkt.echo_ev:08X}",
            "seth.spdcid": pkt.scid, "seth.dpdcid": pkt.qpn & 0xFFFF, "seth.cack_psn": pkt.cum_psn,
            "seth.cc_type": pkt.cc_type, "seth.mpr_packets": pkt.window,
            "seth.sack_base_psn": pkt.sack_base, "seth.sack_bitmap": f"0x{pkt.sack_bitmap:016X}",
            "seth.cc_state.tx_timestamp": pkt.echo_ts_ns >> 10,
            "seth.cc_state.ooo_count": pkt.ooo_count, "seth.cc_state.rcvd_bytes": pkt.rcv_bytes,
        }  # fmt: skip
    if isinstance(pkt, AckPacket):
        return {
            "bth.dqp": pkt.qpn, "bth.psn": pkt.echo_psn, "neth.nack_reason": pkt.nack_reason,
            "neth.entropy": f"0x{pkt.echo_ev:08X}", "neth.spdcid": pkt.scid,
            "neth.dpdcid": pkt.qpn & 0xFFFF, "neth.nack_psn": pkt.echo_psn,
            "neth.cc_type": pkt.cc_type, "neth.tx_timestamp": pkt.echo_ts_ns >> 10,
        }  # fmt: skip
    if isinstance(pkt, ReliabilityProbePacket):
        return {
            "bth.dqp": pkt.qpn, "bth.psn": 0, "peth.probe_id": pkt.probe_id,
            "peth.spdcid": pkt.scid, "peth.dpdcid": pkt.qpn & 0xFFFF,
            "peth.tx_timestamp": pkt.ts_ns >> 10, "peth.ftype": 1,
        }  # fmt: skip
    if isinstance(pkt, ProbePacket | PortStatusPacket):
        return {
            "bth.dqp": 2, "bth.psn": pkt.probe_id, "erth.op": int(isinstance(pkt, ProbePacket)),
            "erth.port_status_mask": f"0x{pkt.port_state:08X}",
            "erth.tx_timestamp": pkt.ts_ns >> 10, "erth.ftype": 1,
        }  # fmt: skip
    if isinstance(pkt, ProbeReplyPacket):
        return {"bth.dqp": 2, "bth.psn": pkt.probe_id, "eeth.op": pkt.op,
                "eeth.tx_timestamp": pkt.echo_ts_ns >> 10}  # fmt: skip
    assert isinstance(pkt, AcknowledgePacket)
    return {"bth.dqp": pkt.qpn, "bth.psn": pkt.psn, "aeth.syndrome": f"0x{pkt.syndrome:02X}",
            "aeth.msn": pkt.msn}  # fmt: skip


def _lookup(doc: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        doc = doc[part]
    return doc


@pytest.mark.parametrize("ours", MRCSTACK_PACKETS, ids=lambda o: o.kind)
def test_the_transcriptions_parser_reads_mrcstacks_packets(ours: Ours) -> None:
    """Every key field right, for all 12 packet types (and a port status update): what its
    parser returned for the bytes mrcstack encodes today."""
    record = PARSED[ours.kind]
    crc = CrcIntegrity((IcrcPath(SRC, DST),), ev_ports=True)
    assert encode_plain(ours.packet, crc).hex() == record["udp_payload"], (
        "mrcstack's encoding changed: run tests/wire/data/make_transcription_vectors.py"
    )
    parsed = record["parsed"]
    assert parsed["bth"]["opcode_name"] == (
        "ENDPOINT_REQUEST" if ours.kind == "PORT_STATUS_UPDATE" else ours.kind
    )
    assert parsed["bth"]["p_key"] == "0xFFFF"
    wrong = {
        path: (_lookup(parsed, path), want)
        for path, want in _key_fields(ours).items()
        if _lookup(parsed, path) != want
    }
    assert not wrong, f"{ours.kind}: (parsed, sent) {wrong}"
    if parsed["udp"]["src_port"] != ours.ev >> 16 or int(parsed["ipv6"]["flow_label"], 16) != (
        ours.ev & 0xFFFF
    ):
        raise AssertionError("the EV stripe: UDP source port EV[31:16], flow label EV[15:0]")
