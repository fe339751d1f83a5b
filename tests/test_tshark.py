"""Wireshark agrees with our layout: tshark decodes encoded packets as RoCEv2 (UDP 4791).

An independent dissector reading back QP, PSN, VA, rkey and length is the check that the BTH,
RETH, ImmDt and AETH sit where the InfiniBand spec puts them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Raw
from scapy.utils import wrpcap

from mrcstack.wire import (
    AETH_ACK,
    AETH_NAK_SEQ,
    ROCEV2_UDP_PORT,
    AckPacket,
    CrcIntegrity,
    DataFlags,
    DataPacket,
    NackReason,
    Opcode,
    encode,
)

TSHARK = shutil.which("tshark")
pytestmark = pytest.mark.skipif(TSHARK is None, reason="tshark is not installed (make setup)")

FIELDS = [
    "infiniband.bth.opcode",
    "infiniband.bth.destqp",
    "infiniband.bth.psn",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.immdt",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.msn",
    "_ws.col.Protocol",
    "_ws.col.Info",
]
TSHARK_TIMEOUT_S = 60


def dissect(tmp_path: Path, datagrams: list[bytes]) -> list[dict[str, str]]:
    """Wrap each datagram in IPv6/UDP to 4791, write a pcap, return tshark's fields per packet."""
    pcap = tmp_path / "mrc.pcap"
    frames = [
        IPv6(src="fd00::1", dst="fd00::2") / UDP(sport=49152 + i, dport=ROCEV2_UDP_PORT) / Raw(d)
        for i, d in enumerate(datagrams)
    ]
    wrpcap(str(pcap), frames)
    cmd = [str(TSHARK), "-n", "-r", str(pcap), "-T", "fields", "-E", "separator=/t"]
    for field in FIELDS:
        cmd += ["-e", field]
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, timeout=TSHARK_TIMEOUT_S
    ).stdout
    rows = [line.split("\t") for line in out.splitlines() if line.strip()]
    assert len(rows) == len(datagrams), out
    return [dict(zip(FIELDS, row, strict=True)) for row in rows]


def test_rdma_write_decodes_as_rocev2(tmp_path: Path) -> None:
    crc = CrcIntegrity()
    plain = DataPacket(
        qpn=0x123456, psn=0xABCDEF, va=0x1122334455667788, rkey=0xCAFEBABE,
        payload=bytes(range(256)) * 4, ev=0x0F0F, port=2, tx_seq=1, ts_ns=99,
    )  # fmt: skip
    with_imm = DataPacket(
        qpn=0x000102, psn=0, va=0xFFFF_FFFF_FFFF_F000, rkey=7, payload=b"tail" * 25,
        ev=3, port=0, tx_seq=2, ts_ns=100, flags=DataFlags.LAST, imm=0xDEADBEEF,
    )  # fmt: skip
    rows = dissect(tmp_path, [encode(plain, crc), encode(with_imm, crc)])
    for pkt, row, opcode, name in (
        (plain, rows[0], Opcode.RDMA_WRITE_ONLY, "RDMA Write Only"),
        (with_imm, rows[1], Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE, "RDMA Write Only Immediate"),
    ):
        assert row["_ws.col.Protocol"] == "RRoCE"  # Wireshark's name for RoCEv2
        assert name in row["_ws.col.Info"]
        assert int(row["infiniband.bth.opcode"]) == opcode
        assert int(row["infiniband.bth.destqp"], 16) == pkt.qpn
        assert int(row["infiniband.bth.psn"]) == pkt.psn
        assert int(row["infiniband.reth.va"], 16) == pkt.va
        assert int(row["infiniband.reth.r_key"], 16) == pkt.rkey
        assert int(row["infiniband.reth.dmalen"]) == len(pkt.payload)
    assert rows[0]["infiniband.immdt"] == ""
    assert rows[1]["infiniband.immdt"].split(",")[0] == "deadbeef"


def test_ack_and_nack_decode_as_acknowledge(tmp_path: Path) -> None:
    crc = CrcIntegrity()
    base = dict(
        qpn=0x654321, cum_psn=0x00FFFE, msn=9, ev=1, port=2, echo_ev=4, echo_psn=5,
        echo_ts_ns=6, sack_base=7, sack_bitmap=8, port_state=9,
    )  # fmt: skip
    acks = [
        AckPacket(tx_seq=3, **base),
        AckPacket(tx_seq=4, nack_reason=NackReason.TRIMMED, **base),
    ]
    rows = dissect(tmp_path, [encode(a, crc) for a in acks])
    for pkt, row, syndrome in zip(acks, rows, (AETH_ACK, AETH_NAK_SEQ), strict=True):
        assert "Acknowledge" in row["_ws.col.Info"]
        assert int(row["infiniband.bth.opcode"]) == Opcode.ACKNOWLEDGE
        assert int(row["infiniband.bth.destqp"], 16) == pkt.qpn
        assert int(row["infiniband.bth.psn"]) == pkt.cum_psn
        assert int(row["infiniband.aeth.syndrome"]) == syndrome
        assert int(row["infiniband.aeth.msn"]) == pkt.msn
    assert "PSN Sequence Error" in rows[1]["_ws.col.Info"]
