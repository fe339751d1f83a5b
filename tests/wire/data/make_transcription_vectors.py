"""Make ``transcription_vectors.json``: byte vectors from the public transcription of OCP MRC
1.0 (anichol67/MRC-Client), and its parser's reading of mrcstack's packets.

Run it against a copy of that repository's ``core`` package, outside mrcstack (its code is
run, never copied)::

    git -C MIRROR archive HEAD core | tar -x -C /tmp/mrc-client
    .venv/bin/python tests/wire/data/make_transcription_vectors.py /tmp/mrc-client COMMIT

Each vector is what its builder produced, with its three departures from RoCEv2 corrected
and nothing else changed (``tests/support/transcription.py`` says which), plus the outer
header fields it set and the field values it was given.  The builder cannot make every
packet type (it has no ACKNOWLEDGE call, and its write call makes only ONLY, ONLY_IMM and
LAST_IMM): those vectors are its own ``MRCPacket`` assembled from its own header classes,
as its builder does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from mrcstack.wire import CrcIntegrity, IcrcPath, encode_plain  # noqa: E402
from mrcstack.wire.evformat import stev_flow_label, stev_source_port  # noqa: E402
from tests.support.transcription import (  # noqa: E402
    DST,
    MRCSTACK_PACKETS,
    ROCEV2_PORT,
    SOURCE,
    SRC,
    VECTORS,
    frame,
    icrc,
)

MAC_A, MAC_B = "02:00:00:00:00:01", "02:00:00:00:00:02"
EV = 0x0A0B_0C0D  # STRUCTURED_EV: UDP source port 0x0A0B, flow label 0x0C0D
ETH, IP6, UDP = 14, 40, 8


def vectors(client: Any) -> list[dict[str, Any]]:
    """Every packet type through the transcription's builder."""
    hdr, pb_mod = client.mrc_headers, client.packet_builder
    pb = pb_mod.PacketBuilder()
    common = {"src_ipv6": SRC, "dst_ipv6": DST, "src_mac": MAC_A, "dst_mac": MAC_B}
    out: list[dict[str, Any]] = []

    def add(name: str, call: str, pkt: Any, expect: dict[str, Any]) -> None:
        out.append({"name": name, "call": call, "pkt": pkt, "expect": expect})

    def write(
        opcode: int,
        psn: int,
        va: int,
        dmalen: int,
        payload: bytes,
        ts: int | None,
        imm: int | None = None,
        rtx: bool = False,
    ) -> Any:
        """A write the way build_write assembles one, for the opcodes it cannot pick."""
        pkt = pb.build_write(**common, src_qpn=0x11, dst_qpn=0x22, psn=psn, va=va,
                             r_key=0xA1B2C3D4, dmalen=dmalen, payload=payload, msn=5, rqmsn=0,
                             ev_value=EV, ev_format="STRUCTURED_EV",
                             include_timestamp=ts is not None, tx_timestamp=ts or 0,
                             is_retransmit=rtx)  # fmt: skip
        pkt.bth.opcode = opcode
        if imm is not None:
            pkt.immdt = hdr.ImmDt(value=imm)
        return pkt

    base = {"qpn": 0x22, "rkey": 0xA1B2C3D4, "msn": 5, "rq_msn": 0, "ev": EV}
    add(
        "write_first",
        "build_write + BTH.opcode=0xC6",
        write(0xC6, 10, 0x7000, 96, b"A" * 32, 0x1111),
        {
            **base,
            "opcode": 0xC6,
            "psn": 10,
            "va": 0x7000,
            "dma_len": 96,
            "payload": "41" * 32,
            "ts16": 0x1111,
            "offset": 0,
            "first": True,
            "last": False,
            "rtx": False,
        },
    )
    add(
        "write_middle",
        "build_write + BTH.opcode=0xC7",
        write(0xC7, 11, 0x7020, 96, b"B" * 32, 0x1112),
        {
            **base,
            "opcode": 0xC7,
            "psn": 11,
            "va": 0x7020,
            "dma_len": 96,
            "payload": "42" * 32,
            "ts16": 0x1112,
            "offset": -1,
            "first": False,
            "last": False,
            "rtx": False,
        },
    )
    add(
        "write_last",
        "build_write + BTH.opcode=0xC8, retransmission, no TSETH",
        write(0xC8, 12, 0x7040, 96, b"C" * 32, None, rtx=True),
        {
            **base,
            "opcode": 0xC8,
            "psn": 12,
            "va": 0x7040,
            "dma_len": 96,
            "payload": "43" * 32,
            "ts16": None,
            "offset": 64,
            "first": False,
            "last": True,
            "rtx": True,
        },
    )
    add(
        "write_last_imm",
        "build_write(is_only=False, has_imm=True)",
        pb.build_write(
            **common,
            src_qpn=0x11,
            dst_qpn=0x22,
            psn=13,
            va=0x8010,
            r_key=0xA1B2C3D4,
            dmalen=32,
            payload=b"D" * 16,
            msn=5,
            ev_value=EV,
            ev_format="STRUCTURED_EV",
            is_only=False,
            has_imm=True,
            imm_data=0xCAFE0001,
            include_timestamp=True,
            tx_timestamp=0x2222,
        ),
        {
            **base,
            "opcode": 0xC9,
            "psn": 13,
            "va": 0x8010,
            "dma_len": 32,
            "payload": "44" * 16,
            "ts16": 0x2222,
            "imm": 0xCAFE0001,
            "offset": 16,
            "first": False,
            "last": True,
            "rtx": False,
        },
    )
    add(
        "write_only",
        "build_write()",
        pb.build_write(
            **common,
            src_qpn=0x11,
            dst_qpn=0x22,
            psn=14,
            va=0x9000,
            r_key=0xA1B2C3D4,
            dmalen=5,
            payload=b"hello",
            msn=5,
            ev_value=EV,
            ev_format="STRUCTURED_EV",
        ),
        {
            **base,
            "opcode": 0xCA,
            "psn": 14,
            "va": 0x9000,
            "dma_len": 5,
            "payload": b"hello".hex(),
            "ts16": None,
            "offset": 0,
            "first": True,
            "last": True,
            "rtx": False,
        },
    )
    add("write_only_imm", "build_write(has_imm=True, include_timestamp=True)",
        pb.build_write(**common, src_qpn=0x11, dst_qpn=0x22, psn=15, va=0xA000, r_key=0xA1B2C3D4,
                       dmalen=4, payload=b"imm!", msn=5, ev_value=EV, ev_format="STRUCTURED_EV",
                       has_imm=True, imm_data=0x01020304, include_timestamp=True,
                       tx_timestamp=0x3333),
        {**base, "opcode": 0xCB, "psn": 15, "va": 0xA000, "dma_len": 4, "payload": b"imm!".hex(),
         "ts16": 0x3333, "imm": 0x01020304, "offset": 0, "first": True, "last": True,
         "rtx": False})  # fmt: skip
    ack = pb_mod.MRCPacket(
        ethernet=pb_mod.EthernetHeader(dst_mac=MAC_B, src_mac=MAC_A),
        ipv6=pb_mod.IPv6Header(src_addr=SRC, dst_addr=DST, traffic_class=46 << 2),
        udp=pb_mod.UDPHeader(dst_port=pb.roce_port),
        bth=hdr.BTH(opcode=0xD1, dqp=0x22, psn=16),
        aeth=hdr.AETH(syndrome=0x1F, msn=6),
    )
    pb.apply_ev_to_packet(ack, EV, "STRUCTURED_EV")
    add(
        "acknowledge",
        "MRCPacket(bth=BTH(opcode=0xD1), aeth=AETH(syndrome=0x1F, msn=6))",
        ack,
        {"opcode": 0xD1, "qpn": 0x22, "psn": 16, "syndrome": 0x1F, "msn": 6, "ev": EV},
    )
    for m, pr, name in ((0, 0, "sack"), (1, 0, "sack_skip_once"), (2, 1, "sack_always_skip_pr")):
        cc = hdr.CCState(tx_timestamp=0x4444, ooo_count=7, rcvd_bytes=0x12345)
        add(name, f"build_sack(m_flag={m}, pr={pr})",
            pb.build_sack(**common, src_qpn=0x11, dst_qpn=0x22, cack_psn=100, ack_psn_offset=3,
                          sack_offset=2, sack_bitmap=0x8000_0000_0000_0005, mpr=64, m_flag=m,
                          pr=pr, entropy=EV, ev_format="STRUCTURED_EV", cc_state=cc),
            {"opcode": 0xDC, "qpn": 0x22, "cum_psn": 100, "echo_psn": 103, "sack_base": 102,
             "sack_bitmap": 0x8000_0000_0000_0005, "window": 64 * 128, "skip": m, "pr": pr,
             "echo_ev": EV, "ev": EV, "scid": 0x11, "ts16": 0x4444, "ooo_count": 7,
             "rcv_bytes": 0x12345, "cc_type": 0, "ecn": False, "rtx": False})  # fmt: skip
    add("nack", "build_nack(nack_reason=TRIMMED)",
        pb.build_nack(**common, src_qpn=0x11, dst_qpn=0x22, nack_psn=101, nack_reason=0x01,
                      entropy=EV, ev_format="STRUCTURED_EV", tx_timestamp=0x5555),
        {"opcode": 0xDD, "qpn": 0x22, "echo_psn": 101, "nack_reason": 0x01, "echo_ev": EV,
         "ev": EV, "scid": 0x11, "ts16": 0x5555, "cc_type": 2, "ecn": False})  # fmt: skip
    add("nack_oor", "build_nack(nack_reason=PSN_OOR_WINDOW)",
        pb.build_nack(**common, src_qpn=0x11, dst_qpn=0x22, nack_psn=0xFFFFFE, nack_reason=0x0B,
                      entropy=EV, ev_format="STRUCTURED_EV", tx_timestamp=0x5556),
        {"opcode": 0xDD, "qpn": 0x22, "echo_psn": 0xFFFFFE, "nack_reason": 0x0B, "echo_ev": EV,
         "ev": EV, "scid": 0x11, "ts16": 0x5556, "cc_type": 2, "ecn": False})  # fmt: skip
    add("reliability_probe", "build_reliability_probe()",
        pb.build_reliability_probe(**common, src_qpn=0x11, dst_qpn=0x22, probe_id=0x0777,
                                   ev_value=EV, ev_format="STRUCTURED_EV", tx_timestamp=0x6666),
        {"opcode": 0xDE, "qpn": 0x22, "probe_id": 0x0777, "scid": 0x11, "ts16": 0x6666,
         "ev": EV})  # fmt: skip
    add("ev_probe", "build_ev_probe()",
        pb.build_ev_probe(**common, probe_id=0x0888, ev_value=EV, ev_format="STRUCTURED_EV",
                          tx_timestamp=0x7777),
        {"opcode": 0xD8, "qpn": 2, "probe_id": 0x0888, "op": 1, "port_state": 0, "ts16": 0x7777,
         "ev": EV})  # fmt: skip
    add("port_status_update", "build_port_status_update()",
        pb.build_port_status_update(**common, probe_id=0x0999, port_mask=0b1011,
                                    tx_timestamp=0x8888),
        {"opcode": 0xD8, "qpn": 2, "probe_id": 0x0999, "op": 0, "port_state": 0b1011,
         "ts16": 0x8888, "ev": 0})  # fmt: skip
    add(
        "endpoint_response",
        "build_endpoint_response()",
        pb.build_endpoint_response(
            **common,
            probe_id=0x0888,
            op=1,
            tx_timestamp=0x7777,
            ev_value=EV,
            ev_format="STRUCTURED_EV",
        ),
        {"opcode": 0xD9, "qpn": 2, "probe_id": 0x0888, "op": 1, "ts16": 0x7777, "ev": EV},
    )
    return out


def corrected(raw: bytes) -> dict[str, Any]:
    """The builder's Ethernet frame, its RoCEv2 departures corrected: P_Key, trailer, port."""
    ip = raw[ETH : ETH + IP6]
    word = int.from_bytes(ip[:4], "big")
    udp = raw[ETH + IP6 : ETH + IP6 + UDP]
    sport, dport = int.from_bytes(udp[:2], "big"), int.from_bytes(udp[2:4], "big")
    payload = raw[ETH + IP6 + UDP :]
    body = bytearray(payload[:-4])
    body[2:4] = b"\xff\xff"
    src, dst = (str(__import__("ipaddress").IPv6Address(ip[a : a + 16])) for a in (8, 24))
    fixed = bytes(body) + icrc(bytes(body), src, dst, sport)
    return {
        "udp_payload": fixed.hex(),
        "as_built": {"udp_payload": payload.hex(), "udp_dport": dport},
        "outer": {"src": src, "dst": dst, "sport": sport, "dport": ROCEV2_PORT,
                  "flow_label": word & 0xFFFFF, "tclass": word >> 20 & 0xFF},
    }  # fmt: skip


def parsed(client: Any) -> list[dict[str, Any]]:
    """The transcription's parser on each of mrcstack's packets (no extension)."""
    crc = CrcIntegrity((IcrcPath(SRC, DST),), ev_ports=True)
    out = []
    for ours in MRCSTACK_PACKETS:
        udp = encode_plain(ours.packet, crc)
        raw = frame(udp, stev_source_port(ours.ev), stev_flow_label(ours.ev))
        pkt = client.packet_parser.parse_packet(raw)
        doc = pkt.to_dict()
        doc.pop("total_size", None)  # (its to_bytes re-appends its own CRC)
        if pkt.payload:
            doc["payload_hex_all"] = bytes(pkt.payload).hex()
        out.append({"type": ours.kind, "udp_payload": udp.hex(), "parsed": doc})
    return out


def main() -> None:
    client_dir, commit = sys.argv[1], sys.argv[2]
    sys.path.insert(0, client_dir)

    client = sys.modules["core"]
    records = []
    for v in vectors(client):
        records.append({"name": v["name"], "call": v["call"], **corrected(v["pkt"].to_bytes()),
                        "expect": v["expect"]})  # fmt: skip
    doc = {
        "source": SOURCE,
        "commit": commit,
        "files": ["core/mrc_headers.py", "core/packet_builder.py", "core/packet_parser.py"],
        "corrections": "P_Key 0x0000 -> 0xFFFF; trailer -> the RoCEv2 ICRC; UDP destination "
        "port 4971 -> 4791; nothing else",
        "vectors": records,
        "parsed_mrcstack": parsed(client),
    }
    Path(VECTORS).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(records)} vectors, {len(doc['parsed_mrcstack'])} parses -> {VECTORS}")


if __name__ == "__main__":
    main()
