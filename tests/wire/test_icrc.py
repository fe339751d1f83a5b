"""An independent check of the ICRC: Scapy's RoCE layer computes the same trailer.

``scapy.contrib.roce.BTH`` computes the RoCEv2 ICRC over IPv6/UDP/BTH/payload.  Its BTH does
not know MRC's opcodes, which does not matter: the ICRC treats everything after the BTH as
payload.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings

from mrcstack.wire import CrcIntegrity, IcrcPath, Packet, encode
from tests.support.wire import any_packet

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)
scapy_all = pytest.importorskip("scapy.all")
roce = pytest.importorskip("scapy.contrib.roce")

SRC = "fd00:0:0:1::10"
DST = "fd00:0:0:2::20"


def scapy_icrc(wire: bytes, src: str, dst: str, sport: int) -> bytes:
    """Dissect our datagram inside IPv6/UDP with Scapy, clear its ICRC and rebuild it."""
    ip = scapy_all.IPv6(src=src, dst=dst, tc=0xB8, fl=0x12345, hlim=7)
    frame = ip / scapy_all.UDP(sport=sport, dport=4791) / scapy_all.Raw(wire)
    parsed = scapy_all.IPv6(bytes(frame))
    bth = parsed[roce.BTH]
    assert bth.opcode == wire[0]
    bth.icrc = None
    return bytes(parsed)[-4:]


@given(pkt=any_packet)
@settings(max_examples=60, deadline=None)
def test_scapy_computes_our_icrc(pkt: Packet) -> None:
    plane = getattr(pkt, "port", 0)
    paths = tuple(IcrcPath(SRC, DST, local_port=49152) for _ in range(plane + 1))
    wire = encode(pkt, CrcIntegrity(paths))
    assert wire[-4:] == scapy_icrc(wire, SRC, DST, sport=49152)


def test_scapy_computes_our_icrc_without_addresses() -> None:
    """The simulator's ICRC (addresses ``::``) is a real ICRC for those addresses too."""
    from tests.support.wire import data  # noqa: PLC0415

    wire = encode(data(port=0), CrcIntegrity())
    assert wire[-4:] == scapy_icrc(wire, "::", "::", sport=4791)


@given(pkt=any_packet)
@settings(max_examples=40, deadline=None)
def test_stev_icrc_covers_the_evs_source_port(pkt: Packet) -> None:
    """With the STEV EV format each packet leaves from its EV's UDP source port: the ICRC
    covers that port, and the receiver (knowing the EV from the packet) checks it."""
    from mrcstack.wire import DecodeError, decode, stev_source_port  # noqa: PLC0415

    plane = getattr(pkt, "port", 0)
    paths = tuple(IcrcPath(SRC, DST) for _ in range(plane + 1))
    back = tuple(IcrcPath(DST, SRC) for _ in range(plane + 1))
    wire = encode(pkt, CrcIntegrity(paths, ev_ports=True))
    assert wire[-4:] == scapy_icrc(wire, SRC, DST, sport=stev_source_port(pkt.ev))
    assert decode(wire, CrcIntegrity(back, ev_ports=True)) is not None
    if stev_source_port(pkt.ev) != 4791:
        with pytest.raises(DecodeError):
            decode(wire, CrcIntegrity(back))  # a receiver that expects port 4791
