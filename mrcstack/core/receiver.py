"""The responder side: place every packet on arrival, track PSNs, build ACK/SACK/NACK.

RoCE RC ordering falls out of the cumulative PSN: an immediate is delivered only when the
cumulative PSN passes the packet that carried it, so that write and every earlier one are
fully placed.  In ``roce`` mode the receiver accepts packets only in order (go-back-N).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mrcstack.core.config import ConnectionConfig, ConnectionStats
from mrcstack.core.events import Event, WriteImmReceived
from mrcstack.core.memory import MemoryTable
from mrcstack.core.psn import to_psn, unwrap
from mrcstack.errors import AccessError
from mrcstack.wire.packets import DataFlags, DataPacket, NackReason

SACK_BITS = 64
# Plain ints: IntFlag arithmetic costs a method call per packet.
_TRIMMED = int(DataFlags.TRIMMED)
_TRIM_LASTHOP = int(DataFlags.TRIM_LASTHOP)
_LAST = int(DataFlags.LAST)


@dataclass(frozen=True, slots=True)
class Feedback:
    """The ACK or NACK to send for one data packet (the connection encodes it)."""

    cum_psn: int
    msn: int
    echo_ev: int
    echo_psn: int
    echo_ts_ns: int
    sack_base: int
    sack_bitmap: int
    ecn: bool
    nack_reason: int
    dup: bool = False  # the packet had already arrived
    seq: int = 0  # the echoed packet's unwrapped PSN (coalescing checks coverage with it)
    base: int = 0  # the unwrapped PSN of bit 0 of the SACK bitmap
    rcv_nxt: int = 0  # everything below this is acknowledged cumulatively


class Receiver:
    def __init__(
        self,
        config: ConnectionConfig,
        memory: MemoryTable,
        stats: ConnectionStats,
        emit: Callable[[Event], None],
    ) -> None:
        self.cfg = config
        self.memory = memory
        self.stats = stats
        self.emit = emit
        self.roce = config.mode == "roce"
        self.rcv_nxt = config.remote_psn  # every seq below this has been placed
        self.ooo: dict[int, int] = {}  # seq -> payload bytes, received beyond rcv_nxt
        self.imms: dict[int, int] = {}  # seq of a received imm-carrying packet -> imm
        self.msn = 0  # messages (writes) completed, mod 2**24
        self.msg_bytes = 0  # bytes of the write being completed (since the last write's end)
        self.nak_sent_at: int | None = None  # roce mode: one NAK per gap

    def on_data(self, pkt: DataPacket, ecn: bool) -> Feedback | None:
        seq = unwrap(pkt.psn, self.rcv_nxt)
        flags = pkt.flags
        if flags & _TRIMMED:
            self.stats.trims_received += 1
            if seq < self.rcv_nxt or seq in self.ooo:
                return self._ack(pkt, seq, ecn)  # already have it: a plain ACK will do
            reason = NackReason.TRIMMED_LASTHOP if flags & _TRIM_LASTHOP else NackReason.TRIMMED
            return self._feedback(pkt, seq, ecn, reason)
        if seq < self.rcv_nxt or seq in self.ooo:
            self.stats.duplicates += 1
            return self._feedback(pkt, seq, ecn, 0, dup=True)
        if seq >= self.rcv_nxt + self.cfg.max_window:
            self.stats.count(self.stats.rejected, "psn_window")
            return self._feedback(pkt, seq, ecn, NackReason.PSN_OOR_WINDOW)
        if self.roce and seq != self.rcv_nxt:
            if self.nak_sent_at == self.rcv_nxt:
                return None
            self.nak_sent_at = self.rcv_nxt
            return self._feedback(pkt, seq, ecn, NackReason.SEQ_ERROR)
        size = len(pkt.payload)
        try:
            target = self.memory.target(pkt.rkey, pkt.va, size)
        except AccessError:
            self.stats.count(self.stats.rejected, "rkey")
            return self._feedback(pkt, seq, ecn, NackReason.REMOTE_ACCESS)
        target[:] = pkt.payload
        self.stats.data_bytes_placed += size
        if flags & _LAST:
            self.imms[seq] = -1 if pkt.imm is None else pkt.imm
        if seq == self.rcv_nxt:
            self._advance(seq + 1, size)
        else:
            self.ooo[seq] = size
        return self._ack(pkt, seq, ecn)

    def _advance(self, new_nxt: int, size: int) -> None:
        """Move the cumulative point past ``new_nxt - 1`` and whatever it makes contiguous."""
        ooo = self.ooo
        imms = self.imms
        seq = new_nxt - 1
        while True:
            self.msg_bytes += size
            if imms:
                imm = imms.pop(seq, None)
                if imm is not None:  # the last packet of a write: its length is complete
                    self.msn = (self.msn + 1) & 0xFFFFFF
                    if imm >= 0:
                        self.emit(WriteImmReceived(imm, self.msg_bytes))
                    self.msg_bytes = 0
            seq += 1
            nxt = ooo.pop(seq, None) if ooo else None
            if nxt is None:
                break
            size = nxt
        self.rcv_nxt = seq
        self.nak_sent_at = None

    def _ack(self, pkt: DataPacket, seq: int, ecn: bool) -> Feedback:
        return self._feedback(pkt, seq, ecn, 0)

    def _feedback(
        self, pkt: DataPacket, seq: int, ecn: bool, reason: int, dup: bool = False
    ) -> Feedback:
        base = max(self.rcv_nxt, seq - SACK_BITS + 1)
        bitmap = 0
        ooo = self.ooo
        if ooo:
            if len(ooo) < SACK_BITS:
                for s in ooo:
                    off = s - base
                    if 0 <= off < SACK_BITS:
                        bitmap |= 1 << off
            else:
                for off in range(SACK_BITS):
                    if base + off in ooo:
                        bitmap |= 1 << off
        return Feedback(
            cum_psn=to_psn(self.rcv_nxt - 1),
            msn=self.msn,
            echo_ev=pkt.ev,
            echo_psn=pkt.psn,
            echo_ts_ns=pkt.ts_ns,
            sack_base=to_psn(base),
            sack_bitmap=bitmap,
            ecn=ecn,
            nack_reason=reason,
            dup=dup,
            seq=seq,
            base=base,
            rcv_nxt=self.rcv_nxt,
        )
