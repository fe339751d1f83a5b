"""The codecs against the Scapy layers (``mrcstack.wire.scapy_layers``), a second
implementation written from the field tables: for every packet type, with mrcstack's
extension and without it, a packet Scapy builds decodes with the codec to the same packet,
and what the codec encodes Scapy dissects into the same fields (and the bytes agree).
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Packet as ScapyPacket
from scapy.packet import Raw

from mrcstack.wire import (
    AcknowledgePacket,
    AckPacket,
    CrcIntegrity,
    DataFlags,
    DataPacket,
    FeedbackFlags,
    Packet,
    PortStatusPacket,
    ProbePacket,
    ProbeReplyPacket,
    ReliabilityProbePacket,
    decode,
    decode_plain,
    encode,
    encode_plain,
    write_opcode,
)
from mrcstack.wire import scapy_layers as sl
from tests.support import REPO
from tests.support.wire import (
    acknowledge_packets,
    any_packet,
    normalized,
    normalized_plain,
)

CRC = CrcIntegrity()  # addresses ::, both ports 4791: what the Scapy packets below carry
OUTER = 48  # IPv6 + UDP


def ts16(ns: int) -> int:
    return (ns >> 10) & 0xFFFF if ns >= 0 else 0


def scapy_packet(pkt: Packet, ext: bool) -> ScapyPacket:
    """``pkt`` built with the Scapy layers alone (the codec is not asked)."""
    nxt = sl.NEXT_EXT if ext else 0
    if isinstance(pkt, DataPacket):
        ts = ext or pkt.ts_ns >= 0
        resv7 = (sl.RESV7_RTX if pkt.flags & DataFlags.RETX else 0) | (sl.RESV7_TS if ts else 0)
        dma = pkt.dma_len if pkt.dma_len >= 0 else pkt.offset + len(pkt.payload)
        layer = BTH(
            opcode=int(write_opcode(pkt.flags, pkt.imm)), dqpn=pkt.qpn, psn=pkt.psn,
            ackreq=int(bool(pkt.flags & DataFlags.ACK_REQ)), resv7=resv7,
        ) / sl.METH(rq_msn=pkt.rq_msn, msn=pkt.msn)  # fmt: skip
        if ts:
            layer /= sl.TSETH(tx_timestamp=ts16(pkt.ts_ns))
        layer /= sl.RETH(va=pkt.va, rkey=pkt.rkey, dmalen=dma)
        if pkt.imm is not None:
            layer /= sl.ImmDt(imm=pkt.imm)
        if ext:
            layer /= sl.XETH(port=pkt.port, ev=pkt.ev, tx_seq=pkt.tx_seq, ts_ns=pkt.ts_ns,
                             offset=pkt.offset)  # fmt: skip
        layer /= Raw(bytes(pkt.payload))
    elif isinstance(pkt, AckPacket):
        rtx = sl.RESV7_RTX if pkt.flags & FeedbackFlags.RETX else 0
        ecn = int(bool(pkt.flags & FeedbackFlags.ECN_ECHO))
        xfeth = sl.XFETH(
            flags=2 if pkt.flags & FeedbackFlags.DUPLICATE else 0, port=pkt.port, ev=pkt.ev,
            tx_seq=pkt.tx_seq, echo_ts_ns=pkt.echo_ts_ns, msn=pkt.msn,
            port_state=pkt.port_state,
        )  # fmt: skip
        if pkt.nack_reason:
            layer = BTH(opcode=0xDD, dqpn=pkt.qpn, psn=pkt.echo_psn, resv7=rtx) / sl.NETH(
                next=nxt, nack_reason=pkt.nack_reason, entropy=pkt.echo_ev, spdcid=pkt.scid,
                dpdcid=pkt.qpn & 0xFFFF, nack_psn=pkt.echo_psn, cc_type=pkt.cc_type,
                cc_flags=ecn, tx_timestamp=ts16(pkt.echo_ts_ns),
            )  # fmt: skip
        else:
            cum = pkt.cum_psn

            def off(psn: int) -> int:
                return ((psn - cum + (1 << 23)) & 0xFFFFFF) - (1 << 23)

            layer = BTH(opcode=0xDC, dqpn=pkt.qpn, psn=cum, resv7=rtx) / sl.SETH(
                next=nxt, m=pkt.skip, pr=int(bool(pkt.flags & FeedbackFlags.PROBE_RESPONSE)),
                ack_psn_offset=off(pkt.echo_psn), entropy=pkt.echo_ev, spdcid=pkt.scid,
                dpdcid=pkt.qpn & 0xFFFF, cack_psn=cum, cc_type=pkt.cc_type, cc_flags=ecn,
                mpr=pkt.window // 128, sack_offset=off(pkt.sack_base),
                sack_bitmap=pkt.sack_bitmap,
            ) / sl.CC_STATE(
                tx_timestamp=ts16(pkt.echo_ts_ns), ooo_count=pkt.ooo_count,
                rcvd_bytes=pkt.rcv_bytes,
            )  # fmt: skip
        if ext:
            layer /= xfeth
    elif isinstance(pkt, ProbePacket | PortStatusPacket):
        layer = BTH(opcode=0xD8, dqpn=pkt.qpn, psn=pkt.probe_id) / sl.ERTH(
            next=nxt, op=int(isinstance(pkt, ProbePacket)), port_status_mask=pkt.port_state,
            tx_timestamp=ts16(pkt.ts_ns),
        )  # fmt: skip
        if ext:
            layer /= sl.XETH(port=pkt.port, ev=pkt.ev, tx_seq=pkt.tx_seq, ts_ns=pkt.ts_ns)
    elif isinstance(pkt, ProbeReplyPacket):
        layer = BTH(opcode=0xD9, dqpn=pkt.qpn, psn=pkt.probe_id) / sl.EETH(
            next=nxt, op=pkt.op, tx_timestamp=ts16(pkt.echo_ts_ns)
        )
        if ext:
            layer /= sl.XFETH(port=pkt.port, ev=pkt.ev, tx_seq=pkt.tx_seq,
                              echo_ts_ns=pkt.echo_ts_ns, port_state=pkt.port_state)  # fmt: skip
    elif isinstance(pkt, ReliabilityProbePacket):
        layer = BTH(opcode=0xDE, dqpn=pkt.qpn) / sl.PETH(
            next=nxt, probe_id=pkt.probe_id, spdcid=pkt.scid, dpdcid=pkt.qpn & 0xFFFF,
            tx_timestamp=ts16(pkt.ts_ns),
        )  # fmt: skip
        if ext:
            layer /= sl.XETH(port=pkt.port, ev=pkt.ev, tx_seq=pkt.tx_seq, ts_ns=pkt.ts_ns)
    else:
        assert isinstance(pkt, AcknowledgePacket)
        layer = BTH(opcode=0xD1, dqpn=pkt.qpn, psn=pkt.psn) / AETH(
            syndrome=pkt.syndrome, msn=pkt.msn
        )
    sl.fill_hdr_check(layer)
    return IPv6(src="::", dst="::") / UDP(sport=4791, dport=4791) / layer


def dissected(wire: bytes) -> dict[str, Any]:
    """Every MRC field Scapy reads from a codec-encoded UDP payload."""
    top = IPv6(bytes(IPv6(src="::", dst="::") / UDP(sport=4791, dport=4791) / Raw(wire)))
    out: dict[str, Any] = {}
    layer: Any = top[BTH]
    while layer is not None and not isinstance(layer, Raw):
        for f in layer.fields_desc:
            out[f"{layer.name}.{f.name}"] = layer.getfieldval(f.name)
        layer = layer.payload if layer.payload else None
    out["payload"] = bytes(top[Raw].load) if Raw in top else b""
    return out


def expected_fields(pkt: Packet, ext: bool) -> dict[str, Any]:
    """What Scapy must read, from the field tables (by the layers' names)."""
    return {k: v for k, v in dissected(bytes(scapy_packet(pkt, ext))[OUTER:]).items()}


packets = any_packet | acknowledge_packets
plain_packets = packets.filter(lambda p: not (isinstance(p, DataPacket) and p.trimmed)).map(
    lambda p: (
        dataclasses.replace(p, flags=p.flags & ~FeedbackFlags.DUPLICATE)
        if isinstance(p, AckPacket)
        else p
    )
)


@given(pkt=packets)
@settings(max_examples=300, deadline=None)
def test_with_the_extension_scapy_builds_what_the_codec_decodes(pkt: Packet) -> None:
    built = bytes(scapy_packet(pkt, ext=True))[OUTER:]
    assert normalized(decode(built, CRC)) == normalized(pkt)
    assert built == encode(pkt, CRC)


@given(pkt=packets)
@settings(max_examples=300, deadline=None)
def test_with_the_extension_scapy_dissects_what_the_codec_encodes(pkt: Packet) -> None:
    got = dissected(encode(pkt, CRC))
    assert got == expected_fields(pkt, ext=True)
    if isinstance(pkt, DataPacket):
        assert got["payload"] == bytes(pkt.payload)
        assert got["mrcstack XETH.ev"] == pkt.ev and got["mrcstack XETH.offset"] == pkt.offset
    elif not isinstance(pkt, AcknowledgePacket):
        assert any(k.startswith("mrcstack X") for k in got), "the extension was not shown"


@given(pkt=plain_packets, ev=st.integers(0, (1 << 32) - 1), port=st.integers(0, 15))
@settings(max_examples=300, deadline=None)
def test_without_it_scapy_builds_what_decode_plain_reads(pkt: Packet, ev: int, port: int) -> None:
    built = bytes(scapy_packet(pkt, ext=False))[OUTER:]
    assert decode_plain(built, CRC, ev=ev, port=port) == normalized_plain(pkt, ev, port)
    assert built == encode_plain(pkt, CRC)


@given(pkt=plain_packets)
@settings(max_examples=300, deadline=None)
def test_without_it_scapy_dissects_what_encode_plain_writes(pkt: Packet) -> None:
    got = dissected(encode_plain(pkt, CRC))
    assert got == expected_fields(pkt, ext=False)
    assert not any(k.startswith("mrcstack X") for k in got)


@pytest.mark.parametrize(
    "kind", [DataPacket, AckPacket, ProbePacket, ProbeReplyPacket, ReliabilityProbePacket]
)
def test_the_layers_name_every_field_of_the_tables(kind: type) -> None:
    """A dissection shows the OCP headers under the specification's names."""
    names = {
        DataPacket: ["MRC METH", "MRC TSETH", "MRC RETH"],
        AckPacket: ["MRC SETH", "MRC CC_STATE"],
        ProbePacket: ["MRC ERTH"],
        ProbeReplyPacket: ["MRC EETH"],
        ReliabilityProbePacket: ["MRC PETH"],
    }[kind]
    sample = {
        DataPacket: DataPacket(
            1, 2, 3, 4, b"x", 5, 0, 0, 1 << 10, DataFlags.FIRST | DataFlags.LAST
        ),
        AckPacket: AckPacket(1, 2, 0, 0, 0, 0, 5, 2, 0, 3, 0, 0),
        ProbePacket: ProbePacket(2, 5, 0, 0, 1 << 10, 0, 7),
        ProbeReplyPacket: ProbeReplyPacket(2, 5, 0, 0, 7, 1 << 10),
        ReliabilityProbePacket: ReliabilityProbePacket(1, 7, 5, 0, 0, 1 << 10),
    }[kind]
    got = dissected(encode_plain(sample, CRC))
    assert all(any(k.startswith(f"{n}.") for k in got) for n in names), sorted(got)


def test_the_layers_import_nothing_of_mrcstack() -> None:
    """Independent: written from the tables, not from the codec."""
    tree = ast.parse((REPO / "mrcstack" / "wire" / "scapy_layers.py").read_text())
    imported = [
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    ] + [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    ]
    assert all(not name.startswith("mrcstack") for name in imported), imported
