"""The responder side: place every packet on arrival, track PSNs, build ACK/SACK/NACK.

RoCE RC ordering falls out of the cumulative PSN: an immediate is delivered only when the
cumulative PSN passes the packet that carried it, so that write and every earlier one are
fully placed.  In ``roce`` mode the receiver accepts packets only in order (go-back-N).

A write is checked as a whole: each of its packets carries the write's length (RETH) and
its own place in it (XETH offset), so whichever packet arrives first checks the whole range
against the region.  A write that fails is refused and nothing of it is placed; neither is
anything sent after it, as an RC responder that stops at its first error: a packet is placed
only once every write before its own has been checked (until then it waits, acknowledged),
and after a refusal the QP places only what came before the refused write
(:attr:`Receiver.refusal` says why, for the connection to fail the QP with).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from mrcstack.core.config import ConnectionConfig, ConnectionStats
from mrcstack.core.events import Event, WriteImmReceived
from mrcstack.core.memory import MemoryTable
from mrcstack.core.psn import HALF
from mrcstack.core.reasons import RejectReason
from mrcstack.errors import AccessError
from mrcstack.wire.packets import PSN_MASK, PSN_MOD, DataFlags, DataPacket, NackReason, SkipHint

SACK_BITS: Final = 64
_SACK_MASK: Final = (1 << SACK_BITS) - 1
# Plain ints: IntFlag arithmetic costs a method call per packet.
_TRIMMED: Final = int(DataFlags.TRIMMED)
_TRIM_LASTHOP: Final = int(DataFlags.TRIM_LASTHOP)
_LAST: Final = int(DataFlags.LAST)
_SKIP_ONCE: Final = int(SkipHint.SKIP_ONCE)
#: A duplicate further behind than this gets no feedback: SETH states the echoed PSN as a
#: signed 16-bit offset from the cumulative PSN (and the sender has long forgotten it).
OLD_DUPLICATE: Final = 1 << 15
_OOO_MAX: Final = (1 << 15) - 1  # CC_STATE ooo_count saturates at 15 bits
_BYTES_MASK: Final = (1 << 24) - 1  # CC_STATE received bytes wrap at 24 bits...
_UNIT_SHIFT: Final = 8  # ...and count 256-byte units (rounded up), section 7.5.5.4 as transcribed
_UNIT: Final = 1 << _UNIT_SHIFT


class Receiver:
    def __init__(
        self,
        config: ConnectionConfig,
        memory: MemoryTable,
        stats: ConnectionStats,
        emit: Callable[[Event], None],
        feedback: Callable[..., None],
    ) -> None:
        self.cfg = config
        self.memory = memory
        self.stats = stats
        self.emit = emit
        self.roce = config.mode == "roce"
        self.mtu = config.mtu_payload
        self.rcv_nxt = config.remote_psn  # every seq below this has been placed
        self.ooo: dict[int, int] = {}  # seq -> payload bytes, received beyond rcv_nxt
        # The same set as bits (bit i: seq rcv_nxt + i), so that a SACK bitmap is a shift
        # and a mask, not a walk over what arrived out of order (that is up to a window).
        self.ooo_bits = 0
        self.imms: dict[int, int] = {}  # seq of a received imm-carrying packet -> imm
        self.msn = 0  # messages (writes) completed, mod 2**24
        self.msg_bytes = 0  # bytes of the write being completed (since the last write's end)
        self.nak_sent_at: int | None = None  # roce mode: one NAK per gap
        # Writes checked as a whole: every seq below ``checked`` lies in a checked write (or
        # below rcv_nxt); ``spans`` maps the first seq of each checked write beyond it to
        # one past its last.  A packet whose write starts beyond ``checked`` waits in
        # ``waiting`` (seq -> rkey, va, payload copy) until the writes before it are checked.
        self.checked = config.remote_psn
        self.spans: dict[int, int] = {}
        self.waiting: dict[int, tuple[int, int, bytes]] = {}
        # The refused write's first seq (nothing at or after it is placed), the NACK reason
        # every later packet gets, and why (for the connection's failure).
        self.refused_at: int | None = None
        self.refused_reason = 0
        self.refusal: str | None = None
        self.on_refused: Callable[[str], None] | None = None  # told the refusal, once
        # Where each packet's feedback goes, as the fields of its ACK and what coalescing
        # reads: ``feedback(port, cum_psn, msn, echo_ev, echo_psn, echo_ts_ns, sack_base,
        # sack_bitmap, ecn, nack_reason, dup, ooo_count, rcv_bytes, seq, base, rcv_nxt)``
        # (fields, not an object: this runs per data packet).
        self.feedback = feedback

    def on_data(self, pkt: DataPacket, ecn: bool, port: int = 0) -> None:
        """Place a data packet that arrived on NIC ``port``, and hand the feedback to send
        for it (if any) to :attr:`feedback`."""
        nxt = self.rcv_nxt
        delta = (pkt.psn - nxt) & PSN_MASK  # unwrap(), inline: this runs per packet
        if delta >= HALF:
            delta -= PSN_MOD
        seq = nxt + delta
        flags = pkt.flags
        ooo = self.ooo
        if flags & _TRIMMED:
            self.stats.trims_received += 1
            if delta < 0 or seq in ooo:
                if delta >= -OLD_DUPLICATE:
                    self._feedback(pkt, seq, ecn, 0, port)  # already have it: a plain ACK
                return
            reason = NackReason.TRIMMED_LASTHOP if flags & _TRIM_LASTHOP else NackReason.TRIMMED
            self._feedback(pkt, seq, ecn, reason, port)
            return
        if delta < 0 or seq in ooo:
            self.stats.duplicates += 1
            if delta >= -OLD_DUPLICATE:
                self._feedback(pkt, seq, ecn, 0, port, dup=True)
            return
        refused_at = self.refused_at
        if refused_at is not None and seq >= refused_at:
            self.stats.count(self.stats.rejected, RejectReason.REFUSED)
            self._feedback(pkt, seq, ecn, self.refused_reason, port)
            return
        if delta >= self.cfg.max_window:
            self.stats.count(self.stats.rejected, RejectReason.PSN_WINDOW)
            why = f"PSN {pkt.psn} is {delta} packets ahead of a window of {self.cfg.max_window}"
            self._refuse(pkt, seq, NackReason.PSN_OOR_WINDOW, why)
            if delta < OLD_DUPLICATE:  # (SETH cannot name a PSN further from the cumulative)
                self._feedback(pkt, seq, ecn, NackReason.PSN_OOR_WINDOW, port)
            return
        if self.roce and delta:
            if self.nak_sent_at != nxt:
                self.nak_sent_at = nxt
                # As an IBTA sequence-error NAK: the PSN it names is the one expected next.
                self._build(pkt.ev, nxt & PSN_MASK, pkt.ts_ns, nxt, ecn, NackReason.SEQ_ERROR,
                            False, port, self.feedback)  # fmt: skip
            return
        payload = pkt.payload
        size = len(payload)
        offset = pkt.offset
        first = seq - offset // self.mtu  # the write's first packet
        if first >= self.checked and first not in self.spans and not self._check_write(pkt, first):
            self._feedback(pkt, seq, ecn, self.refused_reason, port)
            return
        try:
            if first > self.checked:  # an earlier write is not checked yet: this one waits
                self.memory.check_range(pkt.rkey, pkt.va, size)
                self.waiting[seq] = (pkt.rkey, pkt.va, bytes(payload))
            else:
                self.memory.target(pkt.rkey, pkt.va, size)[:] = payload
                self.stats.data_bytes_placed += size
        except AccessError as exc:  # (a region deregistered while its write arrives)
            self.stats.count(self.stats.rejected, RejectReason.RKEY)
            self._refuse(pkt, first, NackReason.REMOTE_ACCESS, f"{exc} at offset {offset}")
            self._feedback(pkt, seq, ecn, NackReason.REMOTE_ACCESS, port)
            return
        if flags & _LAST:
            self.imms[seq] = -1 if pkt.imm is None else pkt.imm
        if delta:
            ooo[seq] = size
            self.ooo_bits |= 1 << delta
        else:
            self._advance(seq + 1, size)
        self._build(pkt.ev, pkt.psn, pkt.ts_ns, seq, ecn, 0, False, port, self.feedback)

    def _check_write(self, pkt: DataPacket, first: int) -> bool:
        """The first packet seen of the write that starts at ``first``: check the whole
        write; False if it is refused, else record it as checked (and place what waited for
        it)."""
        offset, dma_len = pkt.offset, pkt.dma_len
        mtu = self.mtu
        if offset % mtu or dma_len <= 0:
            self.stats.count(self.stats.rejected, RejectReason.INVALID_REQUEST)
            why = f"offset {offset} is not on a {mtu}-byte packet boundary, or length {dma_len}"
            self._refuse(pkt, first, NackReason.INVALID_REQUEST, why)
            return False
        try:
            self.memory.check_range(pkt.rkey, pkt.va - offset, dma_len)
        except AccessError as exc:
            self.stats.count(self.stats.rejected, RejectReason.RKEY)
            self._refuse(pkt, first, NackReason.REMOTE_ACCESS, str(exc))
            return False
        end = first + (dma_len + mtu - 1) // mtu
        if first > self.checked:
            self.spans[first] = end
            return True
        spans = self.spans
        while end in spans:
            end = spans.pop(end)
        self.checked = end
        if self.waiting:
            self._place_waiting()
        return True

    def _place_waiting(self) -> None:
        """Place the packets whose earlier writes are all checked now."""
        checked = self.checked
        memory = self.memory
        for seq in sorted(s for s in self.waiting if s < checked):
            rkey, va, payload = self.waiting.pop(seq)
            try:
                memory.target(rkey, va, len(payload))[:] = payload
            except AccessError as exc:  # (its region was deregistered while it waited)
                self.stats.count(self.stats.rejected, RejectReason.RKEY)
                self._refuse_at(seq, NackReason.REMOTE_ACCESS, f"refused the peer's write: {exc}")
                return
            self.stats.data_bytes_placed += len(payload)

    def _refuse(self, pkt: DataPacket, first: int, reason: NackReason, why: str) -> None:
        """Refuse ``pkt``'s write, which starts at ``first`` (see :meth:`_refuse_at`)."""
        self._refuse_at(
            first,
            reason,
            f"refused the peer's write of {pkt.dma_len} bytes to va {pkt.va - pkt.offset:#x} "
            f"(rkey {pkt.rkey:#x}, PSN {pkt.psn}): {why}",
        )

    def _refuse_at(self, first: int, reason: NackReason, text: str) -> None:
        """Nothing from ``first`` on is placed (what waited is dropped), every later packet
        is NACKed with ``reason``, and ``refusal`` keeps the first refusal's ``text``."""
        if self.refused_at is None or first < self.refused_at:
            self.refused_at = first
            self.refused_reason = reason
            for late in [s for s in self.waiting if s >= first]:
                del self.waiting[late]
        if self.refusal is None:
            self.refusal = text
            if self.on_refused is not None:
                self.on_refused(text)

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
        if self.ooo_bits:
            self.ooo_bits >>= seq - self.rcv_nxt
        self.rcv_nxt = seq
        self.nak_sent_at = None

    def state_feedback(self, ev: int, ts_ns: int, port: int, to: Callable[..., None]) -> None:
        """The SACK answering a reliability probe (from ``port``), handed to ``to`` (as
        :attr:`feedback` takes it): the cumulative and selective state now, echoing the
        probe's EV and timestamp (its PSN echo is the cumulative PSN)."""
        cum = self.rcv_nxt - 1
        self._build(ev, cum & PSN_MASK, ts_ns, cum, False, 0, False, port, to)

    def _feedback(
        self, pkt: DataPacket, seq: int, ecn: bool, reason: int, port: int, dup: bool = False
    ) -> None:
        self._build(pkt.ev, pkt.psn, pkt.ts_ns, seq, ecn, reason, dup, port, self.feedback)

    def _build(
        self,
        ev: int,
        psn: int,
        ts_ns: int,
        seq: int,
        ecn: bool,
        reason: int,
        dup: bool,
        port: int,
        to: Callable[..., None],
    ) -> None:
        """Feedback echoing packet ``seq`` (``ev``, ``psn``, ``ts_ns``): the cumulative PSN
        and the 64-bit SACK window that ends at ``seq`` (or starts at the cumulative point)."""
        nxt = self.rcv_nxt
        base = seq - SACK_BITS + 1
        if base < nxt:
            base = nxt
        bits = self.ooo_bits
        # The fields both hand-offs carry, computed once.
        cum = (nxt - 1) & PSN_MASK
        sack_bitmap = bits >> (base - nxt) & _SACK_MASK if bits else 0
        held = len(self.ooo)
        if held > _OOO_MAX:
            held = _OOO_MAX
        placed = ((self.stats.data_bytes_placed + _UNIT - 1) >> _UNIT_SHIFT) & _BYTES_MASK
        to(port, cum, self.msn, ev, psn, ts_ns, base & PSN_MASK, sack_bitmap, ecn, reason, dup,
           held, placed, seq, base, nxt)  # fmt: skip
