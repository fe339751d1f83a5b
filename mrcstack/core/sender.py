"""The requester side of a connection: work requests, spraying, what ACKs say, completions.

Posted writes are cut into packets as the congestion window allows and sprayed over the EV
set; each ACK acknowledges packets (cumulatively and in its SACK bitmap) and tells about the
path of the packet it echoes (ECN, skip hints, trims).  Which packets in flight are lost,
and when to resend them, is :mod:`mrcstack.core.recovery`'s: the sender hands it every
transmission and every acknowledgement, and resends what it queues.  A trim NACK means
congestion: the packet is resent at once and its EV skipped a while.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final

from mrcstack.core.cc import CongestionController
from mrcstack.core.config import ConnectionConfig, ConnectionStats
from mrcstack.core.events import Event, SendCompleted, WcStatus
from mrcstack.core.evs import EvSignal, EvSlot, EvTable
from mrcstack.core.psn import unwrap
from mrcstack.core.reasons import NACK_NAMES, EvReason, RetxReason
from mrcstack.core.recovery import STRATEGIES
from mrcstack.core.tx import U64, Outgoing, Tx, WorkRequest
from mrcstack.wire.codec import DATA_HDR_LEN, DATA_IMM_HDR_LEN
from mrcstack.wire.packets import (
    PSN_MASK,
    AckPacket,
    DataFlags,
    DataPacket,
    FeedbackFlags,
    NackReason,
    Opcode,
    SkipHint,
)
from mrcstack.wire.plain import plain_header_length

# Plain ints: IntFlag arithmetic costs a method call per packet.
_RETX: Final = int(DataFlags.RETX)
_LAST: Final = int(DataFlags.LAST)
_FIRST: Final = int(DataFlags.FIRST)
_ACK_REQ: Final = int(DataFlags.ACK_REQ)
_SKIP_ONCE: Final = int(SkipHint.SKIP_ONCE)
_ALWAYS_SKIP: Final = int(SkipHint.ALWAYS_SKIP)
_ECN_ECHO: Final = int(FeedbackFlags.ECN_ECHO)
_DUPLICATE: Final = int(FeedbackFlags.DUPLICATE)
# Enum members as module constants: a class attribute lookup costs more, once per ACK.
_TLP: Final = RetxReason.TLP
_ECN_SIGNAL: Final = EvSignal.ECN
_SKIP_ONCE_SIGNAL: Final = EvSignal.SKIP_ONCE

_TRIMS: Final = frozenset({NackReason.TRIMMED, NackReason.TRIMMED_LASTHOP})
#: NACKs that refuse a write for good: its completion status, and the error's name.
_REFUSALS: Final[dict[int, tuple[WcStatus, str]]] = {
    NackReason.REMOTE_ACCESS: (WcStatus.REMOTE_ACCESS_ERROR, "remote access error"),
    NackReason.INVALID_REQUEST: (WcStatus.REMOTE_INVALID_REQUEST, "remote invalid request"),
    NackReason.PSN_OOR_WINDOW: (WcStatus.REMOTE_INVALID_REQUEST, "PSN out of the peer's window"),
}
#: NACKs that ask for the packet again (the receiver had no room for it now).
_RETRY_NACKS: Final = frozenset(
    {
        NackReason.NO_BITMAP,
        NackReason.NO_PKT_BUFFER,
        NackReason.NO_RESOURCE,
        NackReason.UNEXP_EVENT,
    }
)


class Sender:
    """One connection's sending direction: its posted writes, their packets on the EVs, and
    what comes back about them.

    ``next_packets`` sends as far as the congestion window and ``max_window`` allow,
    retransmissions first; ``on_ack`` takes in an ACK or NACK; completions are emitted in
    posting order.  Packets in flight, their timers and their loss belong to ``recovery``
    (:class:`~mrcstack.core.recovery.Recovery`, or its go-back-N variant in RoCE mode),
    which reads this sender's sequence space (``snd_una``, ``next_seq``, ``end_seq``).

    A NACK that refuses a write for good (remote access, invalid request, out of the
    receiver's window) stops everything from that write on: nothing of it or after it is
    sent again, the writes before it complete as they are acknowledged, and then ``failed``
    holds the error for that write (its status, a reason, its wr_id); the connection flushes
    the rest.
    """

    def __init__(
        self,
        config: ConnectionConfig,
        evs: EvTable,
        cc: CongestionController,
        stats: ConnectionStats,
        emit: Callable[[Event], None],
        trailer_len: int = 0,
    ) -> None:
        self.cfg = config
        self.evs = evs
        self.cc = cc
        self.stats = stats
        self.emit = emit
        self.mtu = config.mtu_payload
        self.wrs: deque[WorkRequest] = deque()
        self.send_wr_index = 0  # index in wrs of the WR holding next_seq
        self.next_seq = config.local_psn
        self.snd_una = config.local_psn  # oldest unacknowledged sequence number
        self.end_seq = config.local_psn  # one past the last posted packet
        # The newest SACK bitmap processed and its base: an ACK walks only the bits that
        # are new to it, so SACK costs O(newly acknowledged), not O(window), per ACK.
        self._sack_base = config.local_psn
        self._sack_seen = 0
        self._tx_order = 0  # send order of the last transmission (Tx.order)
        self.failed: tuple[str, WcStatus, int | None] | None = None
        # The write the peer refused: its status and why; nothing from its first packet on
        # (``stop_seq``) is sent again.
        self.refused: tuple[WorkRequest, WcStatus, str] | None = None
        self.stop_seq: int | None = None
        self.posted = 0  # work requests posted: the next one's message sequence number
        self.recovery = STRATEGIES[config.mode](config, evs, cc, stats, self)
        # What a data packet's datagram adds to its payload (``trailer_len``: the ICRC or
        # the AEAD tag), with and without an immediate: once per QP, as its layout decides
        # (without the extension a write is the specification's headers, with TSETH).
        if config.extensions:
            header, imm_header = DATA_HDR_LEN, DATA_IMM_HDR_LEN
        else:
            header = plain_header_length(Opcode.RDMA_WRITE_MIDDLE)
            imm_header = plain_header_length(Opcode.RDMA_WRITE_LAST_IMM)
        self._overhead = header + trailer_len
        self._imm_overhead = imm_header + trailer_len
        self._remote_qpn = config.remote_qpn
        # Bound once: called once per packet sent and once per packet acknowledged.
        self._track = self.recovery.track
        self._delivered = self.recovery.delivered
        # The base class's on_sent only checks its argument, which is always valid here:
        # a controller that does not override it is not called once per packet.
        self._on_sent = None if type(cc).on_sent is CongestionController.on_sent else cc.on_sent

    # Application side -----------------------------------------------------------------
    def post(self, wr_id: int, src: memoryview, va: int, rkey: int, imm: int | None) -> None:
        wr = WorkRequest(wr_id, src, va, rkey, imm, self.end_seq, self.mtu, self.posted & 0xFFFF)
        self.posted += 1
        self.wrs.append(wr)
        self.end_seq += wr.npkts

    @property
    def idle(self) -> bool:
        return not self.wrs

    # Transmission ---------------------------------------------------------------------
    def next_packets(self, now: float, limit: int) -> list[Outgoing]:
        """Retransmissions first, then new packets, as far as the window allows: each a
        DataPacket with its datagram's length.  Their ``tx_seq`` is left 0: the connection
        numbers them, as it numbers its control packets."""
        out: list[Outgoing] = []
        cwnd = self.cc.cwnd
        rec = self.recovery
        rounds = rec.rto_rounds
        if rounds:
            # After a timeout with no progress since, one packet at a time probes the way.
            limit = 1 if rec.in_flight <= 0 else 0
        if limit <= 0:
            return out
        # 0 on the wire means "no timestamp" (no RTT sample from its ack): a packet sent at
        # time 0, where a simulation starts, says 1 ns instead.
        ts_ns = int(now * 1e9) & U64 or 1
        retx = rec.retx
        txs = rec.txs
        stop = self.stop_seq  # (a refused write: nothing from it on is resent)
        while retx and len(out) < limit:
            tx, reason = retx[0]
            if tx.acked or txs.get(tx.seq) is not tx or (stop is not None and tx.seq >= stop):
                retx.popleft()
                continue
            if rec.in_flight + tx.size > cwnd and rec.in_flight > 0:
                return self._window_full(out)
            retx.popleft()
            rto = rec.rto(max(tx.timeouts, rounds))
            sent = self._send(tx.seq, tx.wr, tx.size, now, ts_ns, rto, tx.ev, tx)
            if sent is None:
                retx.appendleft((tx, reason))
                return out
            self.stats.count(self.stats.retransmissions, reason)  # counted when resent
            if reason is _TLP:
                rec.tail_probe_sent(tx.seq, sent[0].ev)
            out.append(sent)
        seq = self.next_seq
        end = min(self.end_seq, self.snd_una + self.cfg.max_window)
        if self.stop_seq is not None and self.stop_seq < end:
            end = self.stop_seq
        if seq < end and len(out) < limit:
            # The same for every new packet of this call (rto(0), kept by the recovery,
            # in the usual case: no timeout since the last progress).
            rto = rec.rto(rounds) if rounds else rec.rto_now
            mtu = self.mtu
            wrs = self.wrs
            send = self._send
            n = len(out)
            while seq < end and n < limit:
                wr = wrs[self.send_wr_index]
                size = wr.length - (seq - wr.first) * mtu
                if size > mtu:
                    size = mtu
                if rec.in_flight + size > cwnd and rec.in_flight > 0:
                    return self._window_full(out)
                sent = send(seq, wr, size, now, ts_ns, rto, None, None)
                if sent is None:
                    break
                out.append(sent)
                n += 1
                seq += 1
                self.next_seq = seq
                if seq == wr.first + wr.npkts:
                    self.send_wr_index += 1
            if seq < self.end_seq and seq == end:  # the window's edge (max_window)
                return self._window_full(out)
        return out

    def _window_full(self, out: list[Outgoing]) -> list[Outgoing]:
        """``out`` ends where the window is full: its last packet asks for an ACK now (a
        peer that delays its ACKs, ``ack_delay``, sends that one at once, so the sender
        does not wait out the delay before it may send again)."""
        if out:
            out[-1][0].flags |= _ACK_REQ  # type: ignore[union-attr]
        return out

    def _send(
        self,
        seq: int,
        wr: WorkRequest,
        size: int,
        now: float,
        ts_ns: int,
        rto: float,
        avoid: int | None,
        retx: Tx | None,
    ) -> Outgoing | None:
        """Send packet ``seq`` of ``wr`` (``size`` bytes of payload) on the next EV, its
        timeout ``rto`` from now."""
        slot = self.evs.next_ev(avoid)
        if slot is None:
            self.recovery.no_path(now, retx.timeouts if retx is not None else 0)
            return None
        entry = slot.entry
        ev = entry.value
        port = entry.port
        if slot.first_sent < 0:
            slot.first_sent = now
        offset = (seq - wr.first) * self.mtu
        order = self._tx_order + 1
        self._tx_order = order
        tx = Tx(seq, wr, size, slot, now, order)
        flags = 0
        if retx is not None:
            tx.timeouts = retx.timeouts
            tx.retx = True
            # A repair asks for its ACK at once: a peer that delays its ACKs (``ack_delay``)
            # would otherwise hold back the news that the hole is filled, which the
            # write's completion and the loss detection of what follows wait for.
            flags = _RETX | _ACK_REQ
        last = seq == wr.first + wr.npkts - 1
        if last:
            flags |= _LAST
        if seq == wr.first:
            flags |= _FIRST
        tx.deadline = now + rto
        self._track(tx)
        if self._on_sent is not None:
            self._on_sent(size, now)
        if last:
            imm = wr.imm
            length = size + (self._overhead if imm is None else self._imm_overhead)
        else:
            imm = None
            length = size + self._overhead
        stats = self.stats
        stats.packets_sent[port] += 1
        stats.bytes_sent[port] += length
        pkt = DataPacket(
            self._remote_qpn, seq & PSN_MASK, wr.va + offset, wr.rkey,
            wr.src[offset : offset + size], ev, port,
            0,  # tx_seq: numbered by the connection
            ts_ns, flags, imm,
            wr.length,  # dma_len, the whole write: its receiver checks it as one
            wr.msn, offset,
        )  # fmt: skip
        return pkt, length

    # Feedback -------------------------------------------------------------------------
    def on_ack(self, ack: AckPacket, now: float) -> None:
        """An ACK or NACK from the peer, step by step: the packet it echoes (a duplicate?
        one given up for lost?), its RTT sample, what it says of that packet's path, its
        NACK, the packets it acknowledges (cumulatively, then by SACK), then loss
        detection and completions."""
        rec = self.recovery
        snd_una = self.snd_una
        echo_seq = unwrap(ack.echo_psn, snd_una)
        echo_tx = rec.txs.get(echo_seq)
        if echo_tx is not None and echo_tx.ev != ack.echo_ev:
            echo_tx = None  # the ack is for an earlier transmission of that packet
        flags = ack.flags
        ecn = flags & _ECN_ECHO != 0
        nack = ack.nack_reason
        if flags & _DUPLICATE:
            rec.duplicate(echo_seq, ack.echo_ev)
        if echo_tx is None or echo_tx.lost:
            rec.late_arrival(ack.echo_ev, echo_seq, now)
        rtt = now - ack.echo_ts_ns / 1e9 if ack.echo_ts_ns else None
        if rtt is not None and rtt < 0:
            rtt = None  # an echo from the future (a bad peer): no sample for anyone
        if rtt is not None and not nack:
            rec.rtt_sample(rtt)
        if echo_tx is not None:
            # The echoed packet's path delivers; anything else it says is rarer news.
            slot = self.evs.slots.get(echo_tx.ev)
            if slot is not None:
                slot.last_evidence = now
                slot.silent_losses = 0
            skip = ack.skip
            if ecn or nack or skip:
                self._path_news(slot, echo_tx.ev, skip, ecn, nack, now)
        if nack:  # a NACK (NETH) states no cumulative PSN: only the packet it names
            self._on_nack(ack, echo_seq, now)
            rec.after_ack(echo_tx, nack, now)
            return
        cum = unwrap(ack.cum_psn, snd_una) + 1
        if cum > self.next_seq:
            return  # acknowledges what we never sent: ignore
        acked = self._delivered
        seq = snd_una
        while seq < cum:
            if seq == echo_seq:
                acked(seq, rtt, ecn, now, echo_tx)
            else:
                acked(seq, None, False, now, echo_tx)
            seq += 1
        self.snd_una = seq
        base = unwrap(ack.sack_base, seq)
        if ack.sack_bitmap:
            self._on_sack(ack, base, echo_seq, rtt, ecn, now, echo_tx)
        rec.after_ack(echo_tx, nack, now, cum, base)
        wrs = self.wrs
        if wrs and wrs[0].acked >= wrs[0].npkts:
            self._complete()

    def _on_sack(
        self,
        ack: AckPacket,
        base: int,
        echo_seq: int,
        rtt: float | None,
        ecn: bool,
        now: float,
        echo_tx: Tx | None,
    ) -> None:
        """The SACK bitmap (its first bit: packet ``base``): every packet it reports
        received beyond the cumulative point is delivered, once (bits an earlier ACK
        already reported are skipped)."""
        bitmap = ack.sack_bitmap
        shift = base - self._sack_base
        if shift >= 0:  # the usual case: this ACK is at least as new as the last one
            bitmap &= ~(self._sack_seen >> shift)
            # (bits past next_seq name nothing we sent: never counted as seen)
            sent = ack.sack_bitmap & ((1 << max(0, self.next_seq - base)) - 1)
            self._sack_base, self._sack_seen = base, sent
        else:  # an older ACK, reordered: skip what the newer one reported
            bitmap &= ~(self._sack_seen << -shift)
        txs = self.recovery.txs
        acked = self._delivered
        while bitmap:
            low = bitmap & -bitmap
            seq = base + low.bit_length() - 1
            bitmap ^= low
            if self.snd_una <= seq < self.next_seq and seq in txs:
                if seq == echo_seq:
                    acked(seq, rtt, ecn, now, echo_tx)
                else:
                    acked(seq, None, False, now, echo_tx)

    def _path_news(
        self, slot: EvSlot | None, ev: int, skip: int, ecn: bool, nack: int, now: float
    ) -> None:
        """What an ACK says of the echoed packet's path (EV ``ev``, ``slot``) beside that it
        delivers: it is busy (an ECN echo, a trim: congested, skipped a while), or the
        receiver asks to skip it."""
        if slot is not None and (ecn or (nack and nack in _TRIMS)):
            self._congested(slot, nack == NackReason.TRIMMED_LASTHOP, now)
        if ecn:
            self.stats.ecn_echoes += 1
        srtt = self.recovery.srtt
        if (ecn or skip == _SKIP_ONCE) and srtt is not None:
            signal = _ECN_SIGNAL if ecn else _SKIP_ONCE_SIGNAL
            self.evs.skip(ev, now + self.cfg.skip_rtts * srtt, signal)
        elif skip == _ALWAYS_SKIP:
            self.evs.apply(ev, EvSignal.ALWAYS_SKIP, EvReason.ALWAYS_SKIP, now)

    def _congested(self, slot: EvSlot, last_hop: bool, now: float) -> None:
        """A queue on this path (on every path of its plane, for the receiver's last hop)
        holds what is in flight there now and what is sent within the next RTT."""
        until = now + (self.recovery.srtt or self.cfg.timeout)
        if last_hop:
            for other in self.evs.slots.values():
                if other.entry.port == slot.entry.port:
                    other.congested_until = max(other.congested_until, until)
        else:
            slot.congested_until = max(slot.congested_until, until)

    def _on_nack(self, ack: AckPacket, seq: int, now: float) -> None:
        """A NACK for packet ``seq`` (for a sequence error: the packet the receiver expects)."""
        reason = ack.nack_reason
        self.stats.count(self.stats.nacks_received, NACK_NAMES.get(reason, "other"))
        rec = self.recovery
        refusal = _REFUSALS.get(reason)
        if refusal is not None:
            self._refuse(seq, *refusal)
            return
        if reason == NackReason.SEQ_ERROR:
            rec.go_back(seq, RetxReason.NACK)
            return
        tx = rec.txs.get(seq)
        if tx is not None and tx.ev != ack.echo_ev:
            tx = None  # for an earlier transmission of that packet
        if reason in _RETRY_NACKS:
            rec.retry_nack(tx, seq)
        elif tx is not None and reason in _TRIMS:
            self.cc.on_trim(now)
            srtt = rec.srtt
            if reason == NackReason.TRIMMED and srtt is not None:
                # Congestion on this path (not the receiver's last hop): skip it a while.
                self.evs.skip(tx.ev, now + self.cfg.skip_rtts * srtt, EvSignal.TRIM)
            tx.trimmed = True
            rec.lose(tx, RetxReason.TRIM)

    def _refuse(self, seq: int, status: WcStatus, what: str) -> None:
        """The peer refused the write that holds packet ``seq``: stop at that write (nothing
        of it or after it is sent again); it fails once the writes before it complete."""
        wr = next((w for w in self.wrs if w.first <= seq < w.first + w.npkts), None)
        if wr is None or (self.stop_seq is not None and self.stop_seq <= wr.first):
            return  # acknowledged already, never ours, or a later write than the refused one
        self.refused = (wr, status, what)
        self.stop_seq = wr.first
        self.recovery.abandon(wr.first)
        self._complete()

    # Completions ----------------------------------------------------------------------
    def _complete(self) -> None:
        wrs = self.wrs
        while wrs and wrs[0].acked >= wrs[0].npkts:
            wr = wrs.popleft()
            self.send_wr_index -= 1
            self.emit(SendCompleted(wr.wr_id, WcStatus.SUCCESS, wr.length))
        refused = self.refused
        if refused is not None and wrs and wrs[0] is refused[0]:
            wr, status, what = refused
            self.failed = (
                f"{what}: the peer refused the write of {wr.length} bytes to va {wr.va:#x} "
                f"(rkey {wr.rkey:#x})",
                status,
                wr.wr_id,
            )

    def flush(self, status_first: WcStatus) -> None:
        """The connection failed: complete every pending WR in order with an error."""
        status = status_first
        while self.wrs:
            wr = self.wrs.popleft()
            self.emit(SendCompleted(wr.wr_id, status, wr.length))
            status = WcStatus.FLUSHED
        self.recovery.clear()
