"""The shipped Wireshark dissector (``wireshark/mrc.lua``) agrees with the codec.

Every packet type, in one pcap: tshark with the Lua plugin must print every field the codec
wrote.  An independent reader of our bytes is the check that each header sits where
``docs/wire-format.md`` says.  The live capture of a testbed transfer is in
``tests/daemons/test_dissector_live.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Raw
from scapy.utils import wrpcap

from mrcstack.wire import (
    ROCEV2_UDP_PORT,
    AcknowledgePacket,
    CrcIntegrity,
    DataFlags,
    FeedbackFlags,
    NackReason,
    Packet,
    PortStatusPacket,
    ProbePacket,
    ProbeReplyPacket,
    ReliabilityProbePacket,
    SkipHint,
    decode,
    decode_plain,
    encode,
    encode_plain,
    encode_trimmed,
    plain_header_length,
)
from tests.support.dissector import TSHARK, dissect, expected, mismatches
from tests.support.wire import PROBE, PROBE_REPLY, ack, data, make_pair

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
    PortStatusPacket(
        qpn=2, port_state=0b1101, ev=0x100, port=1, tx_seq=6, ts_ns=3 << 10, probe_id=9
    ),
    AcknowledgePacket(qpn=0x0BB235, psn=77, syndrome=0x1F, msn=5),
]
#: What a peer without mrcstack sends: no tx_seq, ports, EVs in the packet; a write may lack
#: its TSETH; a NACK answers nothing but its PSN.
PLAIN_PACKETS: list[Packet] = [
    data(flags=DataFlags.FIRST | DataFlags.LAST, payload=b"p" * 100, tx_seq=0, ev=0, port=0),
    data(flags=DataFlags.FIRST, payload=b"f" * 64, tx_seq=0, ev=0, port=0, ts_ns=-1, dma_len=128),
    data(
        flags=DataFlags.LAST,
        imm=7,
        payload=b"l" * 64,
        tx_seq=0,
        ev=0,
        port=0,
        dma_len=128,
        offset=64,
    ),
    ack(tx_seq=0, ev=0, port=0, msn=0, port_state=0, flags=FeedbackFlags.PROBE_RESPONSE),
    ack(tx_seq=0, ev=0, port=0, msn=0, port_state=0, flags=0, nack_reason=NackReason.TRIMMED),
    ProbePacket(qpn=2, ev=0, port=0, tx_seq=0, ts_ns=5 << 10, port_state=3, probe_id=0x4242),
    ProbeReplyPacket(qpn=2, ev=0, port=0, tx_seq=0, probe_id=0x4242, echo_ts_ns=5 << 10),
    ReliabilityProbePacket(qpn=3, probe_id=9, ev=0, port=0, tx_seq=0, ts_ns=9 << 10, scid=4),
    AcknowledgePacket(qpn=0x0BB235, psn=78, syndrome=0x60, msn=6),
]


def _frames(wires: list[bytes], tclass: int = 0) -> list[Any]:
    return [
        IPv6(src="fd00::1", dst="fd00::2", tc=tclass)
        / UDP(sport=49152 + i, dport=ROCEV2_UDP_PORT)
        / Raw(w)
        for i, w in enumerate(wires)
    ]


def _check(tmp_path: Path, packets: list[Packet], wires: list[bytes], frames: list[Any],
           ext: bool) -> None:  # fmt: skip
    pcap = tmp_path / "mrc.pcap"
    wrpcap(str(pcap), frames)
    rows = dissect(pcap)
    assert len(rows) == len(wires)
    for pkt, wire, row in zip(packets, wires, rows, strict=True):
        assert bytes.fromhex(row["udp.payload"]) == wire
        assert mismatches(row, expected(pkt, wire, ext)) == [], pkt


@pytest.mark.parametrize("mode", ["crc", "aead"])
def test_every_field_of_every_packet_type(tmp_path: Path, mode: str) -> None:
    """With the extension, in both trailer modes and no dissector setting: the AEAD_TAG flag
    tells the dissector a 16-byte tag from a 4-byte ICRC on every packet."""
    packets = PACKETS if mode == "crc" else [p for p in PACKETS if type(p) is not AcknowledgePacket]
    wires = []
    for pkt in packets:
        seal = make_pair("aead")[0] if mode == "aead" else CrcIntegrity()
        wires.append(encode(pkt, seal))
    trimmed = [encode_trimmed(wires[0], lasthop=False), encode_trimmed(wires[4], lasthop=True)]
    opener = make_pair("aead")[1] if mode == "aead" else CrcIntegrity()
    packets = [*packets, *(decode(t, opener) for t in trimmed)]
    wires += trimmed
    _check(tmp_path, packets, wires, _frames(wires), ext=True)


def test_without_the_extension_every_field_and_trims_by_traffic_class(tmp_path: Path) -> None:
    """What a peer without mrcstack sends (encode_plain): no XETH/XFETH shown, the ICRC as
    trailer, and a write in DSCP 12 shown as a trimmed header."""
    crc = CrcIntegrity()
    packets = [p for p in PLAIN_PACKETS if type(p) is not PortStatusPacket or p.qpn == 2]
    wires = [encode_plain(p, crc) for p in packets]
    frames = _frames(wires)
    cut = encode_plain(PLAIN_PACKETS[0], crc)[: plain_header_length(0xCA, True)]
    frames.append(
        IPv6(src="fd00::1", dst="fd00::2", tc=12 << 2)
        / UDP(sport=1, dport=ROCEV2_UDP_PORT)
        / Raw(cut)
    )
    trimmed = decode_plain(cut, crc, tclass=12 << 2)
    _check(tmp_path, [*packets, trimmed], [*wires, cut], frames, ext=False)


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
