"""The shipped Wireshark dissector (``wireshark/mrc.lua``) agrees with the codec.

Every packet type, in one pcap: tshark with the Lua plugin must print every field the codec
wrote.  An independent reader of our bytes is the check that each header sits where
``docs/wire-format.md`` says.  The live capture of a testbed transfer is in
``tests/daemons/test_dissector_live.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Raw
from scapy.utils import wrpcap

from mrcstack.wire import (
    ROCEV2_UDP_PORT,
    CrcIntegrity,
    DataFlags,
    NackReason,
    Packet,
    PortStatusPacket,
    ReliabilityProbePacket,
    SkipHint,
    decode,
    encode,
    encode_trimmed,
)
from tests.support.dissector import TSHARK, dissect, expected, mismatches
from tests.support.wire import PROBE, PROBE_REPLY, ack, data

pytestmark = pytest.mark.requires_program("tshark")

PACKETS: list[Packet] = [
    data(flags=DataFlags.FIRST | DataFlags.LAST, payload=bytes(range(256)) * 4),
    data(flags=DataFlags.FIRST, payload=b"first"),
    data(flags=0, payload=b"middle", psn=0),
    data(flags=DataFlags.LAST | DataFlags.RETX, payload=b"last", psn=0xFFFFFF),
    data(flags=DataFlags.LAST, imm=0xDEADBEEF, payload=b"tail" * 25),
    data(flags=DataFlags.FIRST | DataFlags.LAST, imm=1, payload=b"only", va=(1 << 64) - 4096),
    ack(),
    ack(skip=SkipHint.ALWAYS_SKIP, flags=0, ooo_count=32767, window=128, sack_bitmap=0),
    ack(nack_reason=NackReason.TRIMMED),
    ack(nack_reason=NackReason.TRIMMED_LASTHOP, cum_psn=0, echo_psn=0xFFFFF0, sack_base=1),
    ack(nack_reason=NackReason.PSN_OOR_WINDOW, flags=2),
    PROBE,
    PROBE_REPLY,
    ReliabilityProbePacket(qpn=3, probe_id=0xBEEF, ev=0x203, port=2, tx_seq=5, ts_ns=9 << 10),
    PortStatusPacket(qpn=2, port_state=0b1101, ev=0x100, port=1, tx_seq=6, ts_ns=3 << 10, probe_id=9),
]


def test_every_field_of_every_packet_type(tmp_path: Path) -> None:
    crc = CrcIntegrity()
    wires = [encode(p, crc) for p in PACKETS]
    trimmed = [encode_trimmed(wires[0], lasthop=False), encode_trimmed(wires[4], lasthop=True)]
    wires += trimmed
    packets = [*PACKETS, *(decode(t, crc) for t in trimmed)]
    frames = [
        IPv6(src="fd00::1", dst="fd00::2") / UDP(sport=49152 + i, dport=ROCEV2_UDP_PORT) / Raw(w)
        for i, w in enumerate(wires)
    ]
    pcap = tmp_path / "mrc.pcap"
    wrpcap(str(pcap), frames)
    rows = dissect(pcap)
    assert len(rows) == len(wires)
    for pkt, wire, row in zip(packets, wires, rows, strict=True):
        assert bytes.fromhex(row["udp.payload"]) == wire
        assert mismatches(row, expected(pkt, wire)) == [], pkt


def test_plain_rocev2_still_goes_to_wiresharks_own_dissector(tmp_path: Path) -> None:
    """The plugin takes UDP 4791 only for MRC's opcodes; a RoCEv2 SEND stays InfiniBand."""
    import subprocess  # noqa: PLC0415

    from tests.support.dissector import LUA  # noqa: PLC0415

    send_only = bytes([0x04, 0, 0xFF, 0xFF, 0, 0, 0, 5, 0, 0, 0, 9]) + b"payload!" + bytes(4)
    pcap = tmp_path / "rocev2.pcap"
    wrpcap(str(pcap), [IPv6() / UDP(sport=1, dport=ROCEV2_UDP_PORT) / Raw(send_only)])
    out = subprocess.run(
        [str(TSHARK), "-n", "-r", str(pcap), "-X", f"lua_script:{LUA}", "-T", "fields",
         "-e", "_ws.col.Protocol", "-e", "infiniband.bth.destqp"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout.split()  # fmt: skip
    assert out[0] == "RRoCE"
    assert int(out[1], 16) == 5
