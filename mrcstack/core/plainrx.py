"""What a QP without mrcstack's extension works out for itself: a peer that speaks only OCP
MRC 1.0 does not say where a write's middle packet sits in its write, and its timestamps
are 16 bits of 1.024 us.

**Placement.**  Every packet of a write carries the write's MSN (METH), its own address and
the write's length (RETH), and the writes of a QP follow each other in PSN order.  A first
packet starts its write; a last one ends it (its offset is the length minus its payload).
Either tells where the write starts in PSNs, and so where its neighbours end and start: a
middle packet's offset is ``(PSN - first PSN) x MTU`` once its own write, the one before or
the one after it is known.  Until then it waits here (a copy, at most
:data:`MAX_HELD` packets; beyond, it is dropped unacknowledged and sent again), so that the
receiver still checks each write as a whole from the packet that tells where it lies, and
places nothing of a refused write.  Whatever the peer claims, the receiver places a packet
only inside a registered region that its rkey names.

**Time.**  :func:`widen` turns a 16-bit echo back into the connection's clock: the echo is
at most 67 ms old (the wrap), which is far beyond any RTT the connection keeps a packet for.
"""

from __future__ import annotations

from dataclasses import dataclass

from mrcstack.wire.packets import DataFlags, DataPacket

#: Middle packets waiting for their write's place, at most.
MAX_HELD = 4096
#: MSNs whose writes' places are remembered, at most (the oldest are forgotten first).
MAX_WRITES = 4096
_TS_SHIFT = 10
_TS_MASK = 0xFFFF
_MSN_MASK = 0xFFFF
_FIRST = int(DataFlags.FIRST)
_LAST = int(DataFlags.LAST)


def widen(echo_ns: int, now: float) -> int:
    """A 16-bit timestamp echo (``ts16 << 10`` ns, as ``decode_plain`` returns it) as the
    nanosecond time on this connection's clock it stands for; 0 (no sample) for none."""
    if echo_ns <= 0:
        return 0
    now_units = int(now * 1e9) >> _TS_SHIFT
    age = (now_units - (echo_ns >> _TS_SHIFT)) & _TS_MASK
    return (now_units - age) << _TS_SHIFT


@dataclass(slots=True)
class Held:
    """A middle packet that waits for its write's place (its payload copied)."""

    pkt: DataPacket
    seq: int
    size: int
    ecn: bool
    port: int


class Placement:
    """Where the writes of a peer without the extension start, by MSN; see the module."""

    __slots__ = ("held", "mtu", "spans")

    def __init__(self, mtu: int) -> None:
        self.mtu = mtu
        self.spans: dict[int, tuple[int, int]] = {}  # MSN -> (first seq, one past its last)
        self.held: dict[int, Held] = {}  # seq -> a middle packet waiting

    def _learn(self, msn: int, first: int, dma_len: int) -> None:
        spans = self.spans
        if msn not in spans:
            if len(spans) >= MAX_WRITES:
                del spans[next(iter(spans))]
            spans[msn] = (first, first + max(1, -(-dma_len // self.mtu)))

    def first_of(self, pkt: DataPacket, seq: int) -> int | None:
        """The PSN (unwrapped) where ``pkt``'s write starts; None while nothing tells."""
        flags = pkt.flags
        msn = pkt.msn
        if flags & _FIRST:
            self._learn(msn, seq, pkt.dma_len)
            return seq
        if flags & _LAST:
            if pkt.offset < 0 or pkt.offset % self.mtu:
                return None  # not a packet boundary: the receiver refuses the write
            first = seq - pkt.offset // self.mtu
            self._learn(msn, first, pkt.dma_len)
            return first
        spans = self.spans
        known = spans.get(msn)
        if known is not None:
            return known[0]
        before = spans.get((msn - 1) & _MSN_MASK)
        if before is not None:
            return before[1]
        after = spans.get((msn + 1) & _MSN_MASK)
        if after is not None:
            return after[0] - max(1, -(-pkt.dma_len // self.mtu))
        return None

    def hold(self, pkt: DataPacket, seq: int, size: int, ecn: bool, port: int) -> bool:
        """Keep a middle packet until its place is known; False if there is no room."""
        if len(self.held) >= MAX_HELD and seq not in self.held:
            return False
        copy = DataPacket(
            pkt.qpn, pkt.psn, pkt.va, pkt.rkey, bytes(pkt.payload), pkt.ev, pkt.port,
            pkt.tx_seq, pkt.ts_ns, pkt.flags, pkt.imm, pkt.dma_len, pkt.msn, -1, pkt.rq_msn,
        )  # fmt: skip
        self.held[seq] = Held(copy, seq, size, ecn, port)
        return True

    def ready(self) -> list[Held]:
        """The held packets whose place is known now, in PSN order, with their offsets."""
        out = []
        for seq in sorted(self.held):
            held = self.held[seq]
            first = self.first_of(held.pkt, seq)
            if first is not None:
                del self.held[seq]
                held.pkt.offset = (seq - first) * self.mtu
                out.append(held)
        return out

    def forget_below(self, seq: int) -> None:
        """Drop what is held below ``seq`` (it arrived again and was placed since)."""
        for old in [s for s in self.held if s < seq]:
            del self.held[old]
