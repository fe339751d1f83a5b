"""How an entropy value (EV) reaches the fabric: the EV formats of the OCP controller API.

- ``SRV6``: SRv6 uSID, the path in the outer IPv6 destination (a locator block and one
  16-bit uSID per switch); switches shift it.  Needs only static tables; the default.
- ``SRV6_SRH``: SRv6 with a segment routing header: each switch's classic 128-bit SID in a
  segment list, the destination first the first segment.  The header is built once per EV.
- ``STEV``: plain ECMP.  The packet goes to the destination's per-plane address, and the EV
  is written into the UDP source port and the IPv6 flow label, which switches hash to pick
  an uplink.  This is how MRC runs on a fabric without SRv6.

The EV's stripe over the UDP source port and the flow label is the structured EV of OCP
MRC 1.0 as the public transcription builds it (section 9.3.4): ``UDP.src_port = EV[31:16]``,
``flow_label[15:0] = EV[15:0]``.  A peer without mrcstack's extension carries every packet's
EV this way in every format (with uSID the destination no longer names the path when the
packet arrives), so the receiver reads it back with :func:`ev_from_outer`.  The mapping
lives here so that every side (the sender's header, the ICRC's pseudo header, a receiver
reading it) agrees.
"""

from __future__ import annotations

import enum

#: The EV's bits in the UDP source port (its top half) and in the flow label (its bottom).
EV_PORT_SHIFT = 16
EV_LABEL_MASK = 0xFFFF
FLOW_LABEL_BITS = 20


class EvFormat(enum.Enum):
    """An EV format profile's mode, named as in ``mrc_ctl.h`` (SRV6, SRV6+SRH, STEV)."""

    SRV6 = "srv6"
    SRV6_SRH = "srv6-srh"
    STEV = "stev"


def stev_source_port(ev: int) -> int:
    """The UDP source port a packet striped with EV ``ev`` leaves from: ``EV[31:16]``."""
    return (ev >> EV_PORT_SHIFT) & 0xFFFF


def stev_flow_label(ev: int) -> int:
    """The IPv6 flow label of a packet striped with EV ``ev``: ``EV[15:0]`` (bits 19-16 0)."""
    return ev & EV_LABEL_MASK


def ev_from_outer(source_port: int, flow_label: int) -> int:
    """The EV a striped packet carries, from its UDP source port and flow label."""
    return (source_port & 0xFFFF) << EV_PORT_SHIFT | (flow_label & EV_LABEL_MASK)
