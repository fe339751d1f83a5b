"""The send side's records, shared by the sender and loss recovery: a posted write
(:class:`WorkRequest`), one transmission of one of its packets (:class:`Tx`), and a packet
ready to leave (:data:`Outgoing`)."""

from __future__ import annotations

from typing import Final

from mrcstack.core.evs import EvSlot
from mrcstack.wire.packets import Packet

#: Wire timestamps and remote addresses are 64-bit.
U64: Final = (1 << 64) - 1

#: A packet to send and the length of its datagram once encoded.  It goes out on NIC port
#: ``packet.port``, to the path that EV ``packet.ev`` names.
Outgoing = tuple[Packet, int]


class WorkRequest:
    """A posted RDMA WRITE (or WRITE with immediate), cut into packets lazily."""

    __slots__ = ("acked", "first", "imm", "length", "msn", "npkts", "rkey", "src", "va", "wr_id")

    def __init__(
        self,
        wr_id: int,
        src: memoryview,
        va: int,
        rkey: int,
        imm: int | None,
        first: int,
        mtu: int,
        msn: int = 0,
    ) -> None:
        self.wr_id = wr_id
        self.msn = msn  # the message's sequence number on the wire (METH), mod 2**16
        self.src = src
        self.va = va
        self.rkey = rkey
        self.imm = imm
        self.length = src.nbytes
        self.first = first
        self.npkts = (self.length + mtu - 1) // mtu
        self.acked = 0


class Tx:
    """One transmission of one packet (a retransmission is a new Tx)."""

    __slots__ = (
        "acked",
        "deadline",
        "ev",
        "lost",
        "order",
        "queued",
        "retx",
        "sent",
        "seq",
        "size",
        "slot",
        "timeouts",
        "trimmed",
        "wr",
    )

    def __init__(
        self, seq: int, wr: WorkRequest, size: int, slot: EvSlot, sent: float, order: int
    ) -> None:
        self.seq = seq
        # Send order: a burst leaves at one ``now``, so time alone cannot say which of its
        # packets left first (RFC 8985 breaks such ties by sequence; ours by send order,
        # which also places retransmissions right).
        self.order = order
        self.slot = slot
        ev = slot.entry.value
        self.wr = wr
        self.size = size
        self.ev = ev
        self.sent = sent
        self.deadline = 0.0  # its retransmission timeout
        self.timeouts = 0
        self.acked = False
        self.lost = False
        self.queued = False  # in its EV's FIFO
        self.retx = False  # a retransmission: an ack may be for an earlier transmission
        self.trimmed = False  # a switch trimmed it: congestion, not a broken path
