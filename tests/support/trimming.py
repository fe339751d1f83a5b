"""What a trimming switch port must do to MRC packets: core-encoded writes to send through
it, and the exact trimmed form (and ECN marks) to expect back."""

from __future__ import annotations

from mrcstack.wire import (
    CrcIntegrity,
    DataFlags,
    DataPacket,
    decode,
    encode,
    encode_trimmed,
    trimmed_length,
)

L2_L4 = 14 + 40 + 8  # Ethernet + IPv6 + UDP: skb->len at egress counts them all
ECT0, CE, ECN_MASK = 0x02, 0x03, 0x03
CRC = CrcIntegrity()


def data_packets(count: int, payload: int, start_psn: int = 0) -> list[bytes]:
    """Core-encoded WRITE packets; every third one ends a write with an immediate."""
    return [
        encode(
            DataPacket(
                qpn=0x1234,
                psn=psn,
                va=0x7F00_0000_0000 + psn * payload,
                rkey=0xBEEF,
                payload=bytes([psn & 0xFF]) * payload,
                ev=psn * 7,
                port=3,
                tx_seq=psn,
                ts_ns=10**12 + psn,
                flags=DataFlags.LAST if psn % 3 == 0 else 0,
                imm=psn if psn % 3 == 0 else None,
            ),
            CRC,
        )
        for psn in range(start_psn, start_psn + count)
    ]


def psn_of(datagram: bytes) -> int:
    """The BTH PSN of an encoded packet."""
    return int.from_bytes(datagram[9:12], "big")


def check_trimmed(got: bytes, sent: bytes, last_hop: bool) -> None:
    """Exactly what a trimming switch produces, and the decoder accepts it as such."""
    assert len(got) == trimmed_length(sent[0])
    assert got == encode_trimmed(sent, last_hop)
    original = decode(sent, CRC)
    pkt = decode(got, CRC)
    assert isinstance(pkt, DataPacket) and isinstance(original, DataPacket)
    assert pkt.trimmed and pkt.payload == b""
    assert bool(pkt.flags & DataFlags.TRIM_LASTHOP) == last_hop
    assert (pkt.qpn, pkt.psn, pkt.va, pkt.rkey, pkt.imm, pkt.dma_len) == (
        original.qpn,
        original.psn,
        original.va,
        original.rkey,
        original.imm,
        original.dma_len,
    )
