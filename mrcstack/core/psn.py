"""24-bit PSN arithmetic: the core counts in unbounded sequence numbers, the wire in 24 bits."""

from __future__ import annotations

from typing import Final

from mrcstack.wire.packets import PSN_MASK, PSN_MOD

HALF: Final = PSN_MOD // 2


def to_psn(seq: int) -> int:
    return seq & PSN_MASK


def unwrap(psn: int, near: int) -> int:
    """The sequence number whose low 24 bits are ``psn``, closest to ``near``."""
    delta = (psn - near) & PSN_MASK
    if delta >= HALF:
        delta -= PSN_MOD
    return near + delta
