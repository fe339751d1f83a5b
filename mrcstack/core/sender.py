"""The requester side of a connection: work requests, spraying, SACK-driven recovery, RTO.

Loss detection is path-aware: packets on one EV follow one path and arrive in order, so when
a later packet on an EV is acknowledged while an earlier one on the same EV is not, the
earlier one was lost (a silent loss: the path is broken, the EV becomes ASSUMED_BAD).  A
trim NACK means congestion instead: retransmit at once, skip the EV for a while.  A per-packet
retransmission timeout catches the rest (black-holed paths, lost tails).  When nothing can
be sent at all (every port down, every EV bad or denied), a stall timer spends the same
retry budget, so the connection fails with a clear reason instead of waiting forever.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable

from mrcstack.core.cc import CongestionController
from mrcstack.core.config import ConnectionConfig, ConnectionStats
from mrcstack.core.events import Event, SendCompleted, WcStatus
from mrcstack.core.evs import EvSignal, EvSlot, EvTable
from mrcstack.core.psn import HALF, to_psn, unwrap
from mrcstack.core.reasons import NACK_NAMES, EvReason, RetxReason
from mrcstack.core.tx import U64, Outgoing, Tx, WorkRequest, new_record
from mrcstack.wire.codec import DATA_HDR_LEN, DATA_IMM_HDR_LEN
from mrcstack.wire.packets import (
    PSN_MASK,
    PSN_MOD,
    AckPacket,
    DataFlags,
    DataPacket,
    FeedbackFlags,
    NackReason,
    SkipHint,
)

#: RACK reordering window: a quarter of the smoothed RTT (RFC 8985 uses min_rtt/4), and
#: never less than a microsecond so packets sent in one burst are never compared.
RACK_REO_FRACTION = 0.25
#: The window widens (doubling, up to this many smoothed RTTs) on each spurious retransmission
#: and narrows back after RACK_REO_DECAY acks without one (RFC 8985 section 6.2 adapts alike).
RACK_REO_MAX_FRACTION = 2.0
RACK_REO_DECAY = 4096
RACK_MIN_REO = 1e-6
#: Tail-loss probe (RFC 8985 section 7): with packets in flight and no ack for this many
#: smoothed RTTs, the newest one is sent again on another EV, so that a lost tail is found
#: by the ack of the probe (and RACK) within about two RTTs instead of an RTO.
TLP_RTTS = 2.0
#: Packets declared lost by the RTO that are remembered, to tell their duplicate reports from
#: those of RACK's misjudgments (the oldest are forgotten first).
RTO_MEMORY = 4096
#: Time-detected losses in a row, with no reply on that EV in between, that condemn the EV.
RACK_LOSSES_TO_BLAME = 2
# Plain ints: IntFlag arithmetic costs a method call per packet.
_RETX = int(DataFlags.RETX)
_LAST = int(DataFlags.LAST)
_FIRST = int(DataFlags.FIRST)
_SKIP_ONCE = int(SkipHint.SKIP_ONCE)
_ALWAYS_SKIP = int(SkipHint.ALWAYS_SKIP)
_ECN_ECHO = int(FeedbackFlags.ECN_ECHO)
_DUPLICATE = int(FeedbackFlags.DUPLICATE)
# Enum members as module constants: a class attribute lookup costs more, once per ACK.
_TLP = RetxReason.TLP
_TIMEOUT = RetxReason.TIMEOUT
_ECN_SIGNAL = EvSignal.ECN
_SKIP_ONCE_SIGNAL = EvSignal.SKIP_ONCE
#: RFC 6298 smoothing gains.
RTT_ALPHA = 1 / 8
RTT_BETA = 1 / 4


class Sender:
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
        self.roce = config.mode == "roce"
        self.wrs: deque[WorkRequest] = deque()
        self.send_wr_index = 0  # index in wrs of the WR holding next_seq
        self.next_seq = config.local_psn
        self.snd_una = config.local_psn  # oldest unacknowledged sequence number
        # The newest SACK bitmap processed and its base: an ACK walks only the bits that
        # are new to it, so SACK costs O(newly acknowledged), not O(window), per ACK.
        self._sack_base = config.local_psn
        self._sack_seen = 0
        self.end_seq = config.local_psn  # one past the last posted packet
        self.txs: dict[int, Tx] = {}  # current transmission of every unacked sent packet
        self.ev_fifo: dict[int, deque[Tx]] = {}
        self.rto_heap: list[tuple[float, int, Tx]] = []
        self._heap_tie = 0
        self.retx: deque[tuple[Tx, RetxReason]] = deque()
        self.sent_fifo: deque[Tx] = deque()  # every transmission, in send order (RACK)
        # Per plane (planes are separate networks, each with its own last-hop queue, so a
        # packet is never judged by another plane's deliveries): the latest send time of an
        # acknowledged transmission and its RTT (RFC 8985 RACK.xmit_ts and RACK.rtt).
        self.rack_rtt = [0.0] * config.planes
        self.rack_order = [-1] * config.planes  # send order of the newest delivered, per plane
        self._tx_order = 0
        self.rack_timer: float | None = None  # the reordering timer (RFC 8985 6.3)
        self.tlp_deadline: float | None = None  # the tail-loss probe timer (RFC 8985 7)
        self.tlp_out = False  # a probe is out and no ack came since
        # (seq, EV) of the last probe sent: a duplicate report for it means the tail had
        # arrived after all, which is a probe's expected outcome, not a needless retransmission.
        self.tlp_sent: tuple[int, int] | None = None
        self.reo_fraction = RACK_REO_FRACTION  # reordering window, in smoothed RTTs
        self._reo_acks = 0
        # Packets the RTO declared lost (insertion-ordered, oldest dropped past RTO_MEMORY):
        # a duplicate report for one of them is spurious, but says nothing of reordering.
        self._rto_lost: dict[int, None] = {}
        self.rack_due = False  # acks arrived since RACK last ran (see run_rack)
        self.last_progress = -1.0  # when an ack last acknowledged a packet
        # Retransmission timeouts without progress, counted once per backed-off RTO: the
        # connection's retry budget (ConnectionConfig.retry_budget).  While it is not zero
        # only one packet is in flight at a time: nothing floods a dead path.
        self.rto_rounds = 0
        self.round_at = 0.0
        self.in_flight = 0  # bytes sent, not acked, not declared lost
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.failed: tuple[str, WcStatus] | None = None
        # No usable EV while work waits: when to retry, how many retries so far, since when.
        self.stall_deadline: float | None = None
        self.stall_retries = 0
        self.stall_since = 0.0
        self.on_rtt: Callable[[float], None] | None = None  # e.g. a metrics histogram
        self.posted = 0  # work requests posted: the next one's message sequence number
        # What a data packet's datagram adds to its payload (``trailer_len``: the ICRC or
        # the AEAD tag), with and without an immediate.
        self._overhead = DATA_HDR_LEN + trailer_len
        self._imm_overhead = DATA_IMM_HDR_LEN + trailer_len
        self._remote_qpn = config.remote_qpn
        self._cc_on_ack = cc.on_ack
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

    # RTT and RTO ----------------------------------------------------------------------
    def rto(self, timeouts: int = 0) -> float:
        base = self.cfg.timeout
        if self.srtt is not None:
            base = max(base, self.srtt + 4 * self.rttvar)
        elif self.cfg.initial_rto is not None:
            base = self.cfg.initial_rto
        extra = max(0, timeouts - self.cfg.linear_cnt)
        return min(self.cfg.max_rto, base * (1 << min(extra, 16)))

    def rtt_sample(self, rtt: float) -> None:
        if rtt < 0:
            return
        self.stats.rtt_samples += 1
        if self.on_rtt is not None:
            self.on_rtt(rtt)
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar += RTT_BETA * (abs(self.srtt - rtt) - self.rttvar)
            self.srtt += RTT_ALPHA * (rtt - self.srtt)

    def rto_deadline(self) -> float | None:
        """The earliest retransmission timeout of a packet in flight."""
        heap = self.rto_heap
        while heap and (heap[0][2].acked or heap[0][2].lost or heap[0][0] != heap[0][2].deadline):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def next_deadline(self) -> float | None:
        """The earliest of the RTO, the reordering timer, the probe timer and the stall."""
        heap = self.rto_heap  # rto_deadline(), inline: the adapter asks after every input
        deadline: float | None
        while heap:
            deadline, _, tx = heap[0]
            if tx.acked or tx.lost or deadline != tx.deadline:
                heapq.heappop(heap)
                continue
            break
        else:
            deadline = None
        timer = self.rack_timer
        if timer is not None and (deadline is None or timer < deadline):
            deadline = timer
        timer = self.tlp_deadline
        if timer is not None and (deadline is None or timer < deadline):
            deadline = timer
        stall = self.stall_deadline
        if stall is not None and (deadline is None or stall < deadline):
            return stall
        return deadline

    # Transmission ---------------------------------------------------------------------
    def next_packets(self, now: float, limit: int) -> list[Outgoing]:
        """Retransmissions first, then new packets, as far as the window allows: each a
        DataPacket with its datagram's length.  Their ``tx_seq`` is left 0: the connection
        numbers them, as it numbers its control packets."""
        out: list[Outgoing] = []
        cwnd = self.cc.cwnd
        if self.rto_rounds:
            # After a timeout with no progress since, one packet at a time probes the way.
            limit = 1 if self.in_flight <= 0 else 0
        if limit <= 0:
            return out
        # 0 on the wire means "no timestamp" (no RTT sample from its ack): a packet sent at
        # time 0, where a simulation starts, says 1 ns instead.
        ts_ns = int(now * 1e9) & U64 or 1
        retx = self.retx
        while retx and len(out) < limit:
            tx, reason = retx[0]
            if tx.acked or self.txs.get(tx.seq) is not tx:
                retx.popleft()
                continue
            if self.in_flight + tx.size > cwnd and self.in_flight > 0:
                return out
            retx.popleft()
            rto = self.rto(max(tx.timeouts, self.rto_rounds))
            sent = self._send(tx.seq, tx.wr, now, ts_ns, rto, tx.ev, tx)
            if sent is None:
                retx.appendleft((tx, reason))
                return out
            self.stats.count(self.stats.retransmissions, reason)  # counted when resent
            if reason is _TLP:
                self.tlp_sent = (tx.seq, sent[0].ev)
            out.append(sent)
        seq = self.next_seq
        end = min(self.end_seq, self.snd_una + self.cfg.max_window)
        if seq < end and len(out) < limit:
            # The same for every new packet of this call: rto(rto_rounds), written out for
            # the usual case (no timeout since the last progress).
            if self.rto_rounds:
                rto = self.rto(self.rto_rounds)
            else:
                cfg = self.cfg
                srtt = self.srtt
                if srtt is not None:
                    rto = srtt + 4 * self.rttvar
                    if rto < cfg.timeout:
                        rto = cfg.timeout
                elif cfg.initial_rto is not None:
                    rto = cfg.initial_rto
                else:
                    rto = cfg.timeout
                if rto > cfg.max_rto:  # (no back-off: linear_cnt >= 0)
                    rto = cfg.max_rto
            mtu = self.mtu
            wrs = self.wrs
            send = self._send
            n = len(out)
            while seq < end and n < limit:
                wr = wrs[self.send_wr_index]
                size = wr.length - (seq - wr.first) * mtu
                if size > mtu:
                    size = mtu
                if self.in_flight + size > cwnd and self.in_flight > 0:
                    break
                sent = send(seq, wr, now, ts_ns, rto, None, None)
                if sent is None:
                    break
                out.append(sent)
                n += 1
                seq += 1
                self.next_seq = seq
                if seq == wr.first + wr.npkts:
                    self.send_wr_index += 1
        if out and not self.roce:
            self._arm_tlp(now)
        return out

    def _arm_tlp(self, now: float) -> None:
        """(Re)arm the probe timer while packets are in flight; it needs a measured RTT."""
        if self.txs and not self.tlp_out and self.srtt is not None:
            self.tlp_deadline = now + TLP_RTTS * self.srtt
        elif not self.txs:
            self.tlp_deadline = None

    def _tail_probe(self, now: float) -> None:
        """The probe timer fired: send the newest packet in flight again, on another EV."""
        self.tlp_deadline = None
        if self.retx or (self.next_seq < self.end_seq and self.in_flight < self.cc.cwnd):
            return  # the connection is still sending: its own packets will bring acks
        newest = max(
            (tx for tx in self.txs.values() if not tx.lost and not tx.acked),
            key=lambda tx: tx.seq,
            default=None,
        )
        if newest is None:
            return
        self.tlp_out = True
        self._lose(newest, _TLP)

    def _send(
        self,
        seq: int,
        wr: WorkRequest,
        now: float,
        ts_ns: int,
        rto: float,
        avoid: int | None,
        retx: Tx | None,
    ) -> Outgoing | None:
        """Send packet ``seq`` of ``wr`` on the next EV, its timeout ``rto`` from now."""
        slot = self.evs.next_ev(avoid)
        if slot is None:
            self._no_path(now, retx.timeouts if retx is not None else 0)
            return None
        if self.stall_deadline is not None:
            self._end_stall()
        entry = slot.entry
        ev = entry.value
        port = entry.port
        if slot.first_sent < 0:
            slot.first_sent = now
        offset = (seq - wr.first) * self.mtu
        size = wr.length - offset
        if size > self.mtu:
            size = self.mtu
        self._tx_order += 1
        # Tx(seq, wr, size, slot, now, order), written out: once per data packet, and a
        # constructor call costs more than its stores.
        tx = new_record(Tx)
        tx.seq = seq
        tx.order = self._tx_order
        tx.slot = slot
        tx.wr = wr
        tx.size = size
        tx.ev = ev
        tx.sent = now
        tx.acked = tx.lost = tx.queued = tx.trimmed = False
        flags = 0
        if retx is not None:
            tx.timeouts = retx.timeouts
            tx.retx = True
            flags = _RETX
        else:
            tx.timeouts = 0
            tx.retx = False
        last = seq == wr.first + wr.npkts - 1
        if last:
            flags |= _LAST
        if seq == wr.first:
            flags |= _FIRST
        self.txs[seq] = tx
        if not self.roce:  # the go-back-N baseline infers nothing from order or time
            fifo = self.ev_fifo.get(ev)
            if fifo is None:
                fifo = self.ev_fifo[ev] = deque()
            fifo.append(tx)
            tx.queued = True
            self.sent_fifo.append(tx)
        tx.deadline = deadline = now + rto
        self._heap_tie += 1
        heapq.heappush(self.rto_heap, (deadline, self._heap_tie, tx))
        self.in_flight += size
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
        # DataPacket(...), its fields stored one by one: a dataclass's constructor call
        # costs more than its stores, once per data packet.
        pkt = new_record(DataPacket)
        pkt.qpn = self._remote_qpn
        pkt.psn = seq & PSN_MASK
        pkt.va = wr.va + offset
        pkt.rkey = wr.rkey
        pkt.payload = wr.src[offset : offset + size]
        pkt.ev = ev
        pkt.port = port
        pkt.tx_seq = 0  # numbered by the connection
        pkt.ts_ns = ts_ns
        pkt.flags = flags
        pkt.imm = imm
        pkt.dma_len = -1
        pkt.msn = wr.msn
        return pkt, length

    def _lose(self, tx: Tx, reason: RetxReason) -> None:
        """Declare a transmission lost and queue its packet for retransmission."""
        if tx.acked or tx.lost or self.txs.get(tx.seq) is not tx:
            return
        tx.lost = True
        self.in_flight -= tx.size
        self.retx.append((tx, reason))
        if reason is _TIMEOUT:
            rto_lost = self._rto_lost
            rto_lost[tx.seq] = None
            if len(rto_lost) > RTO_MEMORY:
                del rto_lost[next(iter(rto_lost))]

    # Feedback -------------------------------------------------------------------------
    def on_ack(self, ack: AckPacket, now: float) -> None:
        snd_una = self.snd_una
        delta = (ack.echo_psn - snd_una) & PSN_MASK  # unwrap(), inline: once per ACK
        if delta >= HALF:
            delta -= PSN_MOD
        echo_seq = snd_una + delta
        txs = self.txs
        echo_tx = txs.get(echo_seq)
        if echo_tx is not None and echo_tx.ev != ack.echo_ev:
            echo_tx = None  # the ack is for an earlier transmission of that packet
        flags = ack.flags
        ecn = flags & _ECN_ECHO != 0
        nack = ack.nack_reason
        if flags & _DUPLICATE:
            if self.tlp_sent == (echo_seq, ack.echo_ev):
                # The probe found the tail already there: nothing was lost and nothing was
                # misjudged (the probe fired for want of acks, not on a reordering guess).
                self.tlp_sent = None
                self.stats.tlp_unneeded += 1
            elif echo_seq in self._rto_lost:
                # The RTO resent a packet that had arrived: a stalled host or peer (every
                # packet in flight times out at once), not reordering, so the window stays;
                # doubling it per duplicate of such a storm left RACK finding every loss
                # for the next half second two RTTs late.
                self.stats.spurious_retransmissions += 1
            else:
                # The receiver already had that packet: our retransmission was spurious, so
                # packets get reordered more than the window allows (TCP's DSACK, RFC 8985
                # 6.2).
                self._spurious()
        if echo_tx is None or echo_tx.lost:
            self._late_arrival(ack.echo_ev, echo_seq, now)
        rtt = now - ack.echo_ts_ns / 1e9 if ack.echo_ts_ns else None
        if rtt is not None and rtt < 0:
            rtt = None  # an echo from the future (a bad peer): no sample for anyone
        if rtt is not None and not nack:
            self.rtt_sample(rtt)
        if echo_tx is not None:
            slot = self.evs.slots.get(echo_tx.ev)
            if slot is not None:
                slot.last_evidence = now
                slot.silent_losses = 0
                if ecn or (nack and nack in _TRIMS):
                    self._congested(slot, nack == NackReason.TRIMMED_LASTHOP, now)
            if ecn:
                self.stats.ecn_echoes += 1
            skip = ack.skip
            if (ecn or skip == _SKIP_ONCE) and self.srtt is not None:
                signal = _ECN_SIGNAL if ecn else _SKIP_ONCE_SIGNAL
                self.evs.skip(echo_tx.ev, now + self.cfg.skip_rtts * self.srtt, signal)
            elif skip == _ALWAYS_SKIP:
                self.evs.apply(echo_tx.ev, EvSignal.ALWAYS_SKIP, EvReason.ALWAYS_SKIP, now)
        delta = (ack.cum_psn - snd_una) & PSN_MASK  # unwrap(), inline
        if delta >= HALF:
            delta -= PSN_MOD
        cum = snd_una + delta + 1
        if cum > self.next_seq:
            return  # acknowledges what we never sent: ignore
        if nack:
            self._on_nack(ack, echo_seq, now)
            if self.failed:
                return
        acked = self._acked
        while self.snd_una < cum:
            seq = self.snd_una
            if seq == echo_seq:
                acked(seq, rtt, ecn, now, echo_tx)
            else:
                acked(seq, None, False, now, echo_tx)
            self.snd_una = seq + 1
        bitmap = ack.sack_bitmap
        if bitmap:
            una = self.snd_una  # base = unwrap(ack.sack_base, una), inline
            delta = (ack.sack_base - una) & PSN_MASK
            if delta >= HALF:
                delta -= PSN_MOD
            base = una + delta
            shift = base - self._sack_base
            if shift >= 0:  # the usual case: this ACK is at least as new as the last one
                bitmap &= ~(self._sack_seen >> shift)
                # (bits past next_seq name nothing we sent: never counted as seen)
                sent = ack.sack_bitmap & ((1 << max(0, self.next_seq - base)) - 1)
                self._sack_base, self._sack_seen = base, sent
            else:  # an older ACK, reordered: skip what the newer one reported
                bitmap &= ~(self._sack_seen << -shift)
            while bitmap:
                low = bitmap & -bitmap
                seq = base + low.bit_length() - 1
                bitmap ^= low
                if self.snd_una <= seq < self.next_seq and seq in txs:
                    if seq == echo_seq:
                        acked(seq, rtt, ecn, now, echo_tx)
                    else:
                        acked(seq, None, False, now, echo_tx)
        if not self.roce:
            self.tlp_out = False
            # _arm_tlp(now), inline (no probe is out now)
            if not txs:
                self.tlp_deadline = None
            elif self.srtt is not None:
                self.tlp_deadline = now + TLP_RTTS * self.srtt
            if echo_tx is not None and not nack:
                # A NACK says nothing about the packets before it on that path: a trimmed
                # header jumps the queue those packets still wait in.
                self._detect_losses(echo_tx, now)
            self.rack_due = True
        wrs = self.wrs
        if wrs and wrs[0].acked >= wrs[0].npkts:
            self._complete()

    def _late_arrival(self, ev: int, seq: int, now: float) -> None:
        """A transmission given up for lost arrived after all.  If its loss is what demoted
        its EV, the path works (the peer or this host stalled, a queue outlasted the RTO):
        the EV is reinstated at once, as enough probe replies would have done, instead of
        waiting out the probes with the plane short of paths."""
        slot = self.evs.slots.get(ev)
        if slot is not None and slot.condemned_seq == seq:
            slot.condemned_seq = -1
            slot.last_evidence = now
            slot.silent_losses = 0
            self.evs.apply(ev, EvSignal.PROBE_OK, EvReason.LATE_ARRIVAL, now)

    def _acked(
        self, seq: int, rtt: float | None, ecn: bool, now: float, echo_tx: Tx | None
    ) -> None:
        tx = self.txs.pop(seq, None)
        if tx is None:
            return
        tx.acked = True
        self.last_progress = now
        self.rto_rounds = 0
        self._reo_acks += 1
        # RFC 8985 6.2 step 2: an ack for a retransmitted packet may be for the original, so
        # its send time moves RACK only when the ack names this transmission (its EV echo).
        port = tx.slot.entry.port
        order = tx.order
        if (not tx.retx or tx is echo_tx) and order > self.rack_order[port]:
            self.rack_order[port] = order
            self.rack_rtt[port] = now - tx.sent
        size = tx.size
        if not tx.lost:
            self.in_flight -= size
        tx.wr.acked += 1
        self._cc_on_ack(size, rtt, ecn, now)

    def _detect_losses(self, echo_tx: Tx, now: float) -> None:
        """Same-path evidence: packets sent on the echoed EV before the echoed one and
        still unacknowledged were lost on that path (paths keep order).  This also blames
        the EV for losses RACK already declared, since only here is the path known.  (With
        no backup in its plane, the EV is skipped a while instead: see ``EvTable.apply``.)"""
        fifo = self.ev_fifo.get(echo_tx.ev)
        if not fifo or not echo_tx.queued:
            return
        txs = self.txs
        while fifo:
            tx = fifo.popleft()
            tx.queued = False
            if tx is echo_tx:
                return
            current = txs.get(tx.seq)
            if current is None or tx.acked or tx.trimmed:
                continue  # it arrived after all (perhaps by another transmission), or its
                # header did: a trim is congestion, and the trim NACK already resent it
            if current is tx and not tx.lost:
                self._lose(tx, RetxReason.SACK)
            skip_until = now + self.cfg.skip_rtts * (self.srtt or self.cfg.timeout)
            self.evs.apply(tx.ev, EvSignal.LOSS, EvReason.SACK_LOSS, now, skip_until=skip_until)

    def _congested(self, slot: EvSlot, last_hop: bool, now: float) -> None:
        """A queue on this path (on every path of its plane, for the receiver's last hop)
        holds what is in flight there now and what is sent within the next RTT."""
        until = now + (self.srtt or self.cfg.timeout)
        if last_hop:
            for other in self.evs.slots.values():
                if other.entry.port == slot.entry.port:
                    other.congested_until = max(other.congested_until, until)
        else:
            slot.congested_until = max(slot.congested_until, until)

    def _spurious(self) -> None:
        self.stats.spurious_retransmissions += 1
        self.reo_fraction = min(RACK_REO_MAX_FRACTION, self.reo_fraction * 2)
        self._reo_acks = 0

    def run_rack(self, now: float) -> None:
        """Run RACK if acks arrived since it last ran.

        The connection calls this when asked what to send, that is after the adapter fed
        it everything that had arrived: a software endpoint reads its plane sockets in
        turn, so an ack waiting in one socket must not be taken for a loss because a later
        ack was read from another first.
        """
        if self.rack_due:
            self.rack_due = False
            self._rack(now)

    def _rack(self, now: float) -> None:
        """Time-based loss detection (RACK, RFC 8985) across all paths.

        A packet still unacknowledged although one sent after it on the same plane was
        acknowledged, and outstanding for longer than that one's RTT plus a reordering
        window, is lost
        (RFC 8985 6.2; the reordering timer looks again when it is not overdue yet).  The
        exception: its own path reported congestion (a trim, an ECN mark) after it was
        sent.  Switches trim instead of dropping, so such a packet is queued, and a busier
        path's queue must not be read as a loss.  This catches the losses the per-EV order
        cannot see (the last packets on an EV, a path gone silent) without an RTO.
        """
        fifo = self.sent_fifo
        txs = self.txs
        srtt = self.srtt if self.srtt is not None else self.cfg.timeout
        if self._reo_acks >= RACK_REO_DECAY:
            self._reo_acks = 0
            self.reo_fraction = max(RACK_REO_FRACTION, self.reo_fraction / 2)
        reo = max(srtt * self.reo_fraction, RACK_MIN_REO)
        rack_order, rack_rtt = self.rack_order, self.rack_rtt
        newest = max(rack_order)
        self.rack_timer = None
        index = 0
        while index < len(fifo):
            tx = fifo[index]
            if tx.acked or tx.lost or txs.get(tx.seq) is not tx:
                if index == 0:
                    fifo.popleft()
                else:
                    index += 1
                continue
            if tx.order >= newest:
                return  # nothing sent after it was delivered yet, on any plane
            port = tx.slot.entry.port
            if tx.order >= rack_order[port] or tx.slot.congested_until > tx.sent:
                # Its plane delivered nothing sent later yet; or its path reported
                # congestion while it was in flight (a longer queue, not a loss: same-path
                # evidence or the RTO decides).
                index += 1
                continue
            due = tx.sent + rack_rtt[port] + reo
            if now < due:
                # Not overdue yet: the reordering timer looks again (RFC 8985 6.3).
                if self.rack_timer is None or due < self.rack_timer:
                    self.rack_timer = due
                index += 1
                continue
            if index == 0:
                fifo.popleft()
            else:
                del fifo[index]
            self._lose(tx, RetxReason.RACK)
            slot = tx.slot
            if slot.last_evidence < tx.sent:
                # Nothing on this EV came back since: a second such loss in a row
                # means the path is dead, not unlucky.  A path that never answered yet is
                # given one RTO from its first packet first: at the start its packets may
                # wait in a queue that other paths of the plane do not have.
                slot.silent_losses += 1
                if slot.silent_losses >= RACK_LOSSES_TO_BLAME and (
                    slot.last_evidence >= 0 or now - slot.first_sent >= self.rto(0)
                ):
                    slot.silent_losses = 0
                    if self.evs.apply(tx.ev, EvSignal.LOSS, EvReason.RACK_LOSS):
                        slot.condemned_seq = tx.seq

    def _on_nack(self, ack: AckPacket, seq: int, now: float) -> None:
        reason = ack.nack_reason
        name = NACK_NAMES.get(reason, "other")
        self.stats.count(self.stats.nacks_received, name)
        if reason == NackReason.REMOTE_ACCESS:
            tx = self.txs.get(seq)
            if tx is not None:
                self.failed = (
                    f"remote access error: the peer rejected rkey {tx.wr.rkey:#x} "
                    f"at va {tx.wr.va:#x} (wr_id {tx.wr.wr_id})",
                    WcStatus.REMOTE_ACCESS_ERROR,
                )
            return
        if reason == NackReason.SEQ_ERROR or (self.roce and reason in _RETRY_NACKS):
            self._go_back(unwrap(ack.cum_psn, self.snd_una) + 1, RetxReason.NACK)
            return
        tx = self.txs.get(seq)
        if tx is None or tx.ev != ack.echo_ev:
            return
        if reason in (NackReason.TRIMMED, NackReason.TRIMMED_LASTHOP):
            self.cc.on_trim(now)
            if reason == NackReason.TRIMMED and self.srtt is not None:
                # Congestion on this path (not the receiver's last hop): skip it a while.
                self.evs.skip(tx.ev, now + self.cfg.skip_rtts * self.srtt, EvSignal.TRIM)
            tx.trimmed = True
            self._lose(tx, RetxReason.TRIM)
        elif reason in _RETRY_NACKS:
            self._lose(tx, RetxReason.NACK)

    def _go_back(self, from_seq: int, reason: RetxReason) -> None:
        """RoCE-like recovery: resend everything from ``from_seq`` in order."""
        for seq in range(max(from_seq, self.snd_una), self.next_seq):
            tx = self.txs.get(seq)
            if tx is not None:
                self._lose(tx, reason)

    def _no_path(self, now: float, timeouts: int) -> None:
        """No EV is usable although a packet waits: arm the stall timer (once per stall).

        The packet neither leaves nor times out, so without this nothing would ever fail
        the connection.  The stall counts retries on the RTO schedule, starting from the
        waiting packet's own timeouts: the same budget as unanswered retransmissions.
        """
        if self.stall_deadline is None:
            self.stall_since = now
            self.stall_retries = max(timeouts, self.rto_rounds)
            self.stall_deadline = now + self.rto(self.stall_retries)

    def _end_stall(self) -> None:
        self.stall_deadline = None
        self.stall_retries = 0

    def _stall_expired(self, now: float) -> None:
        if self.evs.up_planes:
            self._end_stall()  # a path came back: the next transmission resumes
            return
        self.stall_retries += 1
        if self.stall_retries > self.cfg.linear_cnt + self.cfg.exp_cnt:
            self.failed = (
                f"retry limit exhausted: no usable path for {now - self.stall_since:.3g} s "
                f"({self.evs.unusable_reason()}), {self.stall_retries} retries",
                WcStatus.RETRY_EXCEEDED,
            )
            self._end_stall()
            return
        self.stall_deadline = now + self.rto(self.stall_retries)

    def on_timer(self, now: float) -> None:
        if self.rack_timer is not None and self.rack_timer <= now:
            self._rack(now)
        if self.tlp_deadline is not None and self.tlp_deadline <= now:
            self._tail_probe(now)
        stall = self.stall_deadline
        if stall is not None and stall <= now:
            self._stall_expired(now)
            if self.failed is not None:
                return
        heap = self.rto_heap
        while heap and heap[0][0] <= now:
            deadline, _, tx = heapq.heappop(heap)
            if tx.acked or tx.lost or deadline != tx.deadline or self.txs.get(tx.seq) is not tx:
                continue
            if self.last_progress > tx.sent:
                # Acks kept coming since this packet left, so the connection is not stalled:
                # its timer restarts from the latest one (RFC 6298 5.3).  A packet lost on a
                # live connection is RACK's to find; the RTO is for silence, and a burst
                # sent at once must not time out as one because its tail queued behind it.
                restart = self.last_progress + self.rto(tx.timeouts)
                if restart > now:
                    tx.deadline = restart
                    self._heap_tie += 1
                    heapq.heappush(heap, (restart, self._heap_tie, tx))
                    continue
            tx.timeouts += 1
            if not self.rto_rounds or now >= self.round_at + self.rto(self.rto_rounds - 1):
                self.rto_rounds += 1  # a new round: the last one's backed-off RTO has passed
                self.round_at = now
            retries = max(tx.timeouts, self.rto_rounds)
            if retries > self.cfg.linear_cnt + self.cfg.exp_cnt:
                self.failed = (
                    f"retry limit exhausted: PSN {to_psn(tx.seq)} timed out {retries} times "
                    f"with no progress",
                    WcStatus.RETRY_EXCEEDED,
                )
                self.cc.on_timeout(now)
                return
            self.cc.on_timeout(now)
            if self.roce:
                self._go_back(tx.seq, _TIMEOUT)
                continue
            self._lose(tx, _TIMEOUT)
            if self.evs.apply(tx.ev, EvSignal.TIMEOUT, EvReason.RTO, now):
                tx.slot.condemned_seq = tx.seq
            # The path is black-holed: everything else in flight on it is gone too.
            for other in self.ev_fifo.pop(tx.ev, ()):
                other.queued = False
                if other is not tx and not other.acked and not other.lost:
                    other.timeouts = max(other.timeouts, tx.timeouts - 1)
                    self._lose(other, _TIMEOUT)

    def port_lost(self, port: int) -> None:
        """A plane went down: whatever is in flight on it will never arrive."""
        for ev, fifo in list(self.ev_fifo.items()):
            if fifo and fifo[0].slot.entry.port == port:  # (an EV replaced since, too)
                for tx in fifo:
                    tx.queued = False
                    self._lose(tx, RetxReason.PORT)
                del self.ev_fifo[ev]

    # Completions ----------------------------------------------------------------------
    def _complete(self) -> None:
        while self.wrs and self.wrs[0].acked >= self.wrs[0].npkts:
            wr = self.wrs.popleft()
            self.send_wr_index -= 1
            self.emit(SendCompleted(wr.wr_id, WcStatus.SUCCESS, wr.length))

    def flush(self, status_first: WcStatus) -> None:
        """The connection failed: complete every pending WR in order with an error."""
        status = status_first
        while self.wrs:
            wr = self.wrs.popleft()
            self.emit(SendCompleted(wr.wr_id, status, wr.length))
            status = WcStatus.FLUSHED
        self.txs.clear()
        self.retx.clear()
        self.sent_fifo.clear()
        self.rack_timer = self.tlp_deadline = None
        self.rto_heap.clear()
        self.ev_fifo.clear()
        self.in_flight = 0
        self._end_stall()


_TRIMS = frozenset({NackReason.TRIMMED, NackReason.TRIMMED_LASTHOP})
_RETRY_NACKS = frozenset(
    {
        NackReason.NO_BITMAP,
        NackReason.NO_PKT_BUFFER,
        NackReason.NO_RESOURCE,
        NackReason.PSN_OOR_WINDOW,
        NackReason.UNEXP_EVENT,
    }
)
