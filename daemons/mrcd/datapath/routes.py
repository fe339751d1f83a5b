"""The outer headers of the EV formats that mrcd writes itself: SRv6 with an SRH, STEV, and
any format for a QP without mrcstack's extension, whose EV rides in the UDP source port and
the flow label (``striped``).

Scapy builds each header once per (peer, plane, EV): its ``IPv6ExtHdrSegmentRouting`` for the
segment list, so the bytes on the wire are those of a well-tested packet library, and Scapy's
time stays off the per-packet path (the transport only writes two length fields).  SRv6 uSID
needs no header of ours: the path is the destination address, and a plain UDP socket sends.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from mrcstack import addrplan
from mrcstack.daemons.mrcd.datapath.transport import RawRoute
from mrcstack.fabric import Fabric
from mrcstack.wire import (
    TCLASS_CONTROL,
    TCLASS_DATA,
    EvFormat,
    stev_flow_label,
    stev_source_port,
)

if TYPE_CHECKING:
    from scapy.packet import Packet

#: Hop limit of the packets we build (the kernel's default for a socket's own).
HOP_LIMIT = 64
UDP_NEXT = 17  # what follows the SRH


def _quiet_scapy() -> None:
    logging.getLogger("scapy.runtime").setLevel(logging.ERROR)


def srh(fabric: Fabric, src_host: int, dst_host: int, plane: int, ev: int) -> Packet:
    """The segment routing header of ``ev``'s path (Scapy's ``IPv6ExtHdrSegmentRouting``):
    each switch's classic SID, then the destination NIC's address; UDP after it."""
    _quiet_scapy()
    from scapy.layers.inet6 import IPv6ExtHdrSegmentRouting  # noqa: PLC0415  (slow import)

    segments = [str(s) for s in addrplan.srh_segments(fabric, src_host, dst_host, plane, ev)]
    last = len(segments) - 1
    return IPv6ExtHdrSegmentRouting(
        addresses=list(reversed(segments)), segleft=last, lastentry=last, nh=UDP_NEXT
    )


def raw_route(
    fabric: Fabric,
    src_host: int,
    dst_host: int,
    plane: int,
    ev: int,
    fmt: EvFormat,
    port: int,
    striped: bool = False,
) -> RawRoute:
    """The headers (IPv6 [+ SRH] + UDP, zero lengths) for ``ev``'s path under ``fmt``.

    SRV6_SRH: to the first segment (the source T0's classic SID), with every switch's classic
    SID and the destination NIC's address in the segment list; UDP from ``port``.
    STEV: to the destination NIC's address, the EV in the flow label and the UDP source port.
    SRV6 (uSID) only ``striped``: to the EV's uSID address.  ``striped``: whatever the
    format, the EV in the UDP source port and the flow label.
    The UDP checksum is zero, as on every mrcstack packet (receivers accept it).
    """
    _quiet_scapy()
    from scapy.compat import raw  # noqa: PLC0415
    from scapy.layers.inet import UDP  # noqa: PLC0415  (only for these formats: slow import)
    from scapy.layers.inet6 import IPv6  # noqa: PLC0415

    src = str(addrplan.nic_sid(fabric, plane, src_host))
    striped = striped or fmt is EvFormat.STEV
    udp = UDP(
        sport=stev_source_port(ev) if striped else port, dport=port, chksum=0
    )  # fmt: skip
    label = stev_flow_label(ev) if striped else 0
    if fmt is EvFormat.SRV6_SRH:
        first = str(addrplan.srh_segments(fabric, src_host, dst_host, plane, ev)[0])
        tail: Packet = srh(fabric, src_host, dst_host, plane, ev) / udp
    elif fmt is EvFormat.STEV:
        first = str(addrplan.nic_sid(fabric, plane, dst_host))
        tail = udp
    elif striped:
        first = str(addrplan.address(fabric, src_host, dst_host, plane, ev))
        tail = udp
    else:
        raise ValueError(f"EV format {fmt.value} has no header of ours")
    data, control = (
        raw(IPv6(src=src, dst=first, tc=tclass, fl=label, hlim=HOP_LIMIT) / tail)
        for tclass in (TCLASS_DATA, TCLASS_CONTROL)
    )
    return RawRoute((first, 0), data, control, len(data) - 8)
