"""How an entropy value (EV) reaches the fabric: the EV formats of the OCP controller API.

- ``SRV6``: SRv6 uSID, the path in the outer IPv6 destination (a locator block and one
  16-bit uSID per switch); switches shift it.  Needs only static tables; the default.
- ``SRV6_SRH``: SRv6 with a segment routing header: each switch's classic 128-bit SID in a
  segment list, the destination first the first segment.  The header is built once per EV.
- ``STEV``: plain ECMP.  The packet goes to the destination's per-plane address, and the EV
  is written into the UDP source port and the IPv6 flow label, which switches hash to pick
  an uplink.  This is how MRC runs on a fabric without SRv6.

The mapping of an EV onto the source port and flow label lives here, so every side (the
sender's header, the ICRC's pseudo header, a receiver checking it) agrees.
"""

from __future__ import annotations

import enum

#: STEV source ports: the top two bits set (49152-65535, the dynamic range), then the EV's
#: low 14 bits (T1 index, plane and the first entropy bits of our EV layout).
STEV_PORT_BASE = 0xC000
STEV_PORT_BITS = 14
FLOW_LABEL_BITS = 20


class EvFormat(enum.Enum):
    """An EV format profile's mode, named as in ``mrc_ctl.h`` (SRV6, SRV6+SRH, STEV)."""

    SRV6 = "srv6"
    SRV6_SRH = "srv6-srh"
    STEV = "stev"


def stev_source_port(ev: int) -> int:
    """The UDP source port a STEV packet on EV ``ev`` leaves from."""
    return STEV_PORT_BASE | (ev & ((1 << STEV_PORT_BITS) - 1))


def stev_flow_label(ev: int) -> int:
    """The IPv6 flow label of a STEV packet on EV ``ev`` (its low 20 bits)."""
    return ev & ((1 << FLOW_LABEL_BITS) - 1)
