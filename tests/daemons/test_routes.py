"""The headers mrcd writes for the SRV6_SRH and STEV EV formats, read back by Scapy."""

from __future__ import annotations

import logging

import pytest

from mrcstack import addrplan
from mrcstack.daemons.mrcd.datapath.routes import raw_route
from mrcstack.fabric import Fabric
from mrcstack.wire import TCLASS_CONTROL, TCLASS_DATA, EvFormat, stev_flow_label, stev_source_port

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)
inet6 = pytest.importorskip("scapy.layers.inet6")
inet = pytest.importorskip("scapy.layers.inet")
FABRIC = Fabric(sid_format="classic")
EV = addrplan.ev_value(1, 2)


def test_srh_header_lists_the_path_and_starts_at_its_first_segment() -> None:
    route = raw_route(FABRIC, 0, 3, 1, EV, EvFormat.SRV6_SRH, 4791)
    segments = [str(s) for s in addrplan.srh_segments(FABRIC, 0, 3, 1, EV)]
    for header, tclass in (
        (route.data_header, TCLASS_DATA),
        (route.control_header, TCLASS_CONTROL),
    ):
        pkt = inet6.IPv6(header)
        srh = pkt[inet6.IPv6ExtHdrSegmentRouting]
        assert pkt.src == str(addrplan.nic_sid(FABRIC, 1, 0)) and pkt.tc == tclass
        assert pkt.dst == segments[0] == route.first_hop[0]
        assert list(srh.addresses) == list(reversed(segments)) and srh.segleft == 3
        udp = pkt[inet.UDP]
        assert (udp.sport, udp.dport, udp.chksum) == (4791, 4791, 0)
        assert header[route.udp_at : route.udp_at + 2] == (4791).to_bytes(2, "big")


def test_stev_header_carries_the_ev_in_port_and_flow_label() -> None:
    route = raw_route(FABRIC, 0, 3, 1, EV, EvFormat.STEV, 4791)
    pkt = inet6.IPv6(route.data_header)
    assert pkt.dst == str(addrplan.nic_sid(FABRIC, 1, 3)) == route.first_hop[0]
    assert pkt.fl == stev_flow_label(EV) and pkt.tc == TCLASS_DATA
    assert inet.UDP in pkt and pkt[inet.UDP].sport == stev_source_port(EV)
    assert route.udp_at == 40 and pkt.nh == 17


def test_srv6_needs_no_header_of_ours() -> None:
    with pytest.raises(ValueError, match="no header"):
        raw_route(FABRIC, 0, 3, 1, EV, EvFormat.SRV6, 4791)
