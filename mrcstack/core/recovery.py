"""Loss recovery: when a packet in flight is declared lost, and when to look again.

Owns every transmission from the moment it leaves until it is acknowledged or declared
lost (the bytes in flight, the queue of packets to resend) and the timers that decide: the
RTT estimate and the per-packet RTO (RFC 6298) with its retry rounds, RACK's reordering
timer, the tail-loss probe and the stall timer.  The connection arms one timer at
:meth:`Recovery.next_deadline`; the sender hands over each transmission and each ACK.

MRC's detection is path-aware: packets on one EV follow one path and arrive in order, so
when a later packet on an EV is acknowledged while an earlier one on the same EV is not, the
earlier one was lost (a silent loss: the path is broken, the EV becomes ASSUMED_BAD).  RACK
(RFC 8985) finds by time the losses the path's order cannot show (an EV's last packets, a
path gone silent), the tail-loss probe a lost tail, the RTO the rest (black-holed paths).
When nothing can be sent at all (every port down, every EV bad or denied), the stall timer
spends the same retry budget, so the connection fails with a clear reason instead of
waiting forever.  The RoCE baseline (:class:`GoBackN`) infers nothing from order or time:
a timeout or a NACK resends everything from the lost packet on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Final, Protocol

from mypy_extensions import mypyc_attr

from mrcstack.core.cc import CongestionController
from mrcstack.core.config import ConnectionConfig, ConnectionStats
from mrcstack.core.events import WcStatus
from mrcstack.core.evs import EvSignal, EvTable
from mrcstack.core.psn import to_psn
from mrcstack.core.reasons import EvReason, RetxReason
from mrcstack.core.tx import Tx

#: RACK reordering window: a quarter of the smoothed RTT (RFC 8985 uses min_rtt/4), and
#: never less than a microsecond so packets sent in one burst are never compared.
RACK_REO_FRACTION: Final = 0.25
#: The window widens (doubling, up to this many smoothed RTTs) on each spurious retransmission
#: and narrows back after RACK_REO_DECAY acks without one (RFC 8985 section 6.2 adapts alike).
RACK_REO_MAX_FRACTION: Final = 2.0
RACK_REO_DECAY: Final = 4096
RACK_MIN_REO: Final = 1e-6
#: Tail-loss probe (RFC 8985 section 7): with packets in flight and no ack for this many
#: smoothed RTTs, the newest one is sent again on another EV, so that a lost tail is found
#: by the ack of the probe (and RACK) within about two RTTs instead of an RTO.
TLP_RTTS: Final = 2.0
#: Packets declared lost by the RTO that are remembered, to tell their duplicate reports from
#: those of RACK's misjudgments (the oldest are forgotten first).
RTO_MEMORY: Final = 4096
#: Time-detected losses in a row, with no reply on that EV in between, that condemn the EV.
RACK_LOSSES_TO_BLAME: Final = 2
#: RFC 6298 smoothing gains.
RTT_ALPHA: Final = 1 / 8
RTT_BETA: Final = 1 / 4
#: A timeout's back-off doubles at most this many times (then ``max_rto`` caps it anyway).
MAX_BACKOFF_EXPONENT: Final = 16

_TIMEOUT: Final = RetxReason.TIMEOUT


class SendWindow(Protocol):
    """The sender's sequence space, as recovery reads it."""

    snd_una: int  # the oldest unacknowledged packet
    next_seq: int  # the next new packet
    end_seq: int  # one past the last packet posted


class _RtoGroup:
    """Transmissions whose retransmission timeouts fall at one instant, in send order: one
    heap entry for them all.  The new packets of one transmit share ``now + rto``, so a
    heap push and pop per packet (about half a microsecond) becomes one per transmit.
    ``head``: the ones before it are known to be acked, lost or re-armed."""

    __slots__ = ("deadline", "head", "txs")

    def __init__(self, deadline: float, tx: Tx) -> None:
        self.deadline = deadline
        self.txs = [tx]
        self.head = 0


# Python subclasses of it (and of its kin below) run beside it compiled (mrcstack.native).
@mypyc_attr(allow_interpreted_subclasses=True)
class Recovery:
    """MRC's loss recovery for one sending direction: same-path evidence, RACK, the
    tail-loss probe, the per-packet RTO and the stall timer.

    The sender hands it every transmission as it leaves (:meth:`track`), every packet an
    ACK acknowledges (:meth:`delivered`) and the ACK's other news (:meth:`duplicate`,
    :meth:`late_arrival`, :meth:`rtt_sample`, :meth:`after_ack`); lost packets wait in
    ``retx`` for the sender to resend them; a spent retry budget is left in ``failed``.
    :class:`GoBackN` overrides the hooks where the RoCE baseline differs.
    """

    def __init__(
        self,
        config: ConnectionConfig,
        evs: EvTable,
        cc: CongestionController,
        stats: ConnectionStats,
        window: SendWindow,
    ) -> None:
        self.cfg = config
        self.evs = evs
        self.cc = cc
        self.stats = stats
        self.window = window
        self.txs: dict[int, Tx] = {}  # current transmission of every unacked sent packet
        self.in_flight = 0  # bytes sent, not acked, not declared lost
        self.retx: deque[tuple[Tx, RetxReason]] = deque()  # lost, in the order to resend
        self.failed: tuple[str, WcStatus] | None = None
        self._cc_on_ack = cc.on_ack
        # RTT and RTO.
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.on_rtt: Callable[[float], None] | None = None  # e.g. a metrics histogram
        # rto()'s base (RFC 6298's, before any back-off) and rto(0), set when they change.
        self._rto_base = config.timeout if config.initial_rto is None else config.initial_rto
        self.rto_now = min(config.max_rto, self._rto_base)
        # (deadline, push order, group): a transmission's RTO is armed while it is in its
        # group with the deadline it has (a restart re-arms it in another group).
        self.rto_heap: list[tuple[float, int, _RtoGroup]] = []
        self._heap_tie = 0
        self._rto_last: _RtoGroup | None = None  # the latest pushed, while in the heap
        self.last_progress = -1.0  # when an ack last acknowledged a packet
        # Retransmission timeouts without progress, counted once per backed-off RTO: the
        # connection's retry budget (ConnectionConfig.retry_budget).  While it is not zero
        # only one packet is in flight at a time: nothing floods a dead path.
        self.rto_rounds = 0
        self.round_at = 0.0
        # Packets the RTO declared lost (insertion-ordered, oldest dropped past RTO_MEMORY):
        # a duplicate report for one of them is spurious, but says nothing of reordering.
        self._rto_lost: dict[int, None] = {}
        # No usable EV while work waits: when to retry, how many retries so far, since when.
        self.stall_deadline: float | None = None
        self.stall_retries = 0
        self.stall_since = 0.0
        # Same-path evidence: each EV's transmissions in send order; and those an ACK
        # showed a later packet of their path overtaking without reporting on them, with
        # when they are lost unless an ACK for them comes first (see after_ack), in the
        # order found (the window moves slowly, so one found later is due little earlier
        # at most: it waits for those before it rather than a heap per suspect).
        self.ev_fifo: dict[int, deque[Tx]] = {}
        self.suspects: deque[tuple[float, Tx]] = deque()
        # RACK.  Per plane (planes are separate networks, each with its own last-hop queue,
        # so a packet is never judged by another plane's deliveries): the latest send time
        # of an acknowledged transmission and its RTT (RFC 8985 RACK.xmit_ts and RACK.rtt).
        self.sent_fifo: deque[Tx] = deque()  # every transmission, in send order
        self.rack_rtt = [0.0] * config.planes
        self.rack_order = [-1] * config.planes  # send order of the newest delivered, per plane
        self.rack_timer: float | None = None  # the reordering timer (RFC 8985 6.3)
        self.rack_due = False  # acks arrived since RACK last ran (see run_rack)
        self.reo_fraction = RACK_REO_FRACTION  # reordering window, in smoothed RTTs
        self._reo_acks = 0
        # The tail-loss probe.
        self.tlp_deadline: float | None = None  # its timer (RFC 8985 7)
        self.tlp_out = False  # a probe is out and no ack came since
        # (seq, EV) of the last probe sent: a duplicate report for it means the tail had
        # arrived after all, which is a probe's expected outcome, not a needless retransmission.
        self.tlp_sent: tuple[int, int] | None = None

    # RTT and RTO ----------------------------------------------------------------------
    def rto(self, timeouts: int = 0) -> float:
        """The retransmission timeout after ``timeouts`` timeouts: ``linear_cnt`` of them at
        the base (``srtt + 4 * rttvar``, at least ``timeout``; ``initial_rto`` before the
        first sample), then doubling, capped at ``max_rto``."""
        extra = timeouts - self.cfg.linear_cnt
        if extra <= 0:
            return self.rto_now
        return min(self.cfg.max_rto, self._rto_base * (1 << min(extra, MAX_BACKOFF_EXPONENT)))

    def rtt_sample(self, rtt: float) -> None:
        """An RTT measured (seconds; from an ACK's or a probe reply's echoed timestamp)."""
        if rtt < 0:
            return
        self.stats.rtt_samples += 1
        if self.on_rtt is not None:
            self.on_rtt(rtt)
        srtt = self.srtt
        if srtt is None:
            srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar += RTT_BETA * (abs(srtt - rtt) - self.rttvar)
            srtt += RTT_ALPHA * (rtt - srtt)
        self.srtt = srtt
        # The RTO's base and rto(0) follow (written out: once per ACK).
        cfg = self.cfg
        base = srtt + 4 * self.rttvar
        if not base > cfg.timeout:
            base = cfg.timeout
        self._rto_base = base
        self.rto_now = base if base < cfg.max_rto else cfg.max_rto

    def rto_deadline(self) -> float | None:
        """The earliest retransmission timeout of a packet in flight."""
        heap = self.rto_heap
        while heap:
            group = heap[0][2]
            deadline = group.deadline
            txs = group.txs
            i = group.head
            n = len(txs)
            while i < n:
                tx = txs[i]
                if tx.acked or tx.lost or tx.deadline != deadline:
                    i += 1
                else:
                    group.head = i
                    return deadline
            self._pop_rto()
        return None

    def _arm_rto(self, tx: Tx) -> None:
        """``tx``'s timeout (``tx.deadline``) into the heap: with the latest pushed when it
        falls at the same instant (so the order stays that of the pushes)."""
        deadline = tx.deadline
        last = self._rto_last
        if last is not None and last.deadline == deadline:
            last.txs.append(tx)
            return
        group = _RtoGroup(deadline, tx)
        self._heap_tie += 1
        heappush(self.rto_heap, (deadline, self._heap_tie, group))
        self._rto_last = group

    def _pop_rto(self) -> _RtoGroup:
        group = heappop(self.rto_heap)[2]
        if group is self._rto_last:
            self._rto_last = None  # (nothing joins a group out of the heap)
        return group

    # Transmissions in and out ---------------------------------------------------------
    def track(self, tx: Tx) -> None:
        """A transmission left, its ``deadline`` set: a path was usable after all (a stall
        ends), it is in flight with its RTO armed, it joins its EV's FIFO and the send order
        (same-path evidence, RACK), and the probe timer rearms (it needs a measured RTT)."""
        if self.stall_deadline is not None:
            self._end_stall()
        self.txs[tx.seq] = tx
        ev = tx.ev
        fifo = self.ev_fifo.get(ev)
        if fifo is None:
            fifo = self.ev_fifo[ev] = deque()
        fifo.append(tx)
        tx.queued = True
        self.sent_fifo.append(tx)
        # _arm_rto, inline: once per data packet sent
        last = self._rto_last
        if last is not None and last.deadline == tx.deadline:
            last.txs.append(tx)
        else:
            self._arm_rto(tx)
        self.in_flight += tx.size
        srtt = self.srtt
        if srtt is not None and not self.tlp_out:
            self.tlp_deadline = tx.sent + TLP_RTTS * srtt

    def lose(self, tx: Tx, reason: RetxReason) -> None:
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

    def delivered(
        self, seq: int, rtt: float | None, ecn: bool, now: float, echo_tx: Tx | None
    ) -> None:
        """An ACK acknowledges packet ``seq`` (``echo_tx``: the transmission it echoes)."""
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

    # What an ACK says beside what it acknowledges ---------------------------------------
    def duplicate(self, seq: int, ev: int) -> None:
        """The receiver already had packet ``seq`` when its copy sent on ``ev`` arrived."""
        if self.tlp_sent == (seq, ev):
            # The probe found the tail already there: nothing was lost and nothing was
            # misjudged (the probe fired for want of acks, not on a reordering guess).
            self.tlp_sent = None
            self.stats.tlp_unneeded += 1
        elif seq in self._rto_lost:
            # The RTO resent a packet that had arrived: a stalled host or peer (every
            # packet in flight times out at once), not reordering, so the window stays;
            # doubling it per duplicate of such a storm left RACK finding every loss
            # for the next half second two RTTs late.
            self.stats.spurious_retransmissions += 1
        else:
            # The receiver already had that packet: our retransmission was spurious, so
            # packets get reordered more than the window allows (TCP's DSACK, RFC 8985
            # 6.2).
            self.stats.spurious_retransmissions += 1
            self.reo_fraction = min(RACK_REO_MAX_FRACTION, self.reo_fraction * 2)
            self._reo_acks = 0

    def late_arrival(self, ev: int, seq: int, now: float) -> None:
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

    def after_ack(
        self, echo_tx: Tx | None, nack: int, now: float, missing: int = -1, reported_from: int = 0
    ) -> None:
        """An ACK was taken in: the probe timer rearms (no probe is out now), RACK is due
        before the next transmission, and the echoed packet's path shows what it lost.

        Same-path evidence: packets sent on the echoed EV before the echoed one and still
        unacknowledged were lost on that path (paths keep order), when the ACK reports
        them missing: its cumulative point reports packet ``missing``, its SACK window the
        packets from ``reported_from``.  One in between may have arrived, reported by an
        earlier ACK that this one overtook (ACKs come back on several paths of a plane) or
        that was lost: it is lost only if no ACK for it comes within RACK's reordering window
        (:meth:`run_rack` judges it).  This also blames the EV for losses RACK already
        declared, since only here is the path known.  (With no backup in its plane, the EV
        is skipped a while instead: see ``EvTable.apply``.)  A NACK says nothing about the
        packets before it on that path: a trimmed header jumps the queue those packets
        still wait in.
        """
        self.tlp_out = False
        if not self.txs:
            self.tlp_deadline = None
        else:
            srtt = self.srtt
            if srtt is not None:
                self.tlp_deadline = now + TLP_RTTS * srtt
        self.rack_due = True
        if echo_tx is None or nack or not echo_tx.queued:
            return
        fifo = self.ev_fifo.get(echo_tx.ev)
        if not fifo:
            return
        txs = self.txs
        while fifo:
            tx = fifo.popleft()
            tx.queued = False
            if tx is echo_tx:
                return
            if tx.seq < reported_from and tx.seq != missing:
                # This ACK says nothing of it: its own ACK has a reordering window to come.
                if not tx.acked and txs.get(tx.seq) is not None:
                    self.suspects.append((now + self._reo_window(), tx))
                continue
            self._lost_on_path(tx, now)

    def _lost_on_path(self, tx: Tx, now: float) -> None:
        """Same-path evidence says ``tx`` did not arrive: resend it, blame its EV."""
        current = self.txs.get(tx.seq)
        if current is None or tx.acked or tx.trimmed:
            return  # it arrived after all (perhaps by another transmission), or its
            # header did: a trim is congestion, and the trim NACK already resent it
        if current is tx and not tx.lost:
            self.lose(tx, RetxReason.SACK)
        skip_until = now + self.cfg.skip_rtts * (self.srtt or self.cfg.timeout)
        self.evs.apply(tx.ev, EvSignal.LOSS, EvReason.SACK_LOSS, now, skip_until=skip_until)

    def _reo_window(self) -> float:
        """RACK's reordering window now (RFC 8985 6.2: a fraction of the smoothed RTT)."""
        srtt = self.srtt if self.srtt is not None else self.cfg.timeout
        return max(srtt * self.reo_fraction, RACK_MIN_REO)

    def retry_nack(self, tx: Tx | None, seq: int) -> None:
        """A NACK asks for ``tx`` again (the receiver had no room for it; None: the NACK is
        not for the current transmission).  ``seq``: the packet it names."""
        if tx is not None:
            self.lose(tx, RetxReason.NACK)

    def go_back(self, from_seq: int, reason: RetxReason) -> None:
        """RoCE-like recovery: resend everything from ``from_seq`` in order."""
        window = self.window
        for seq in range(max(from_seq, window.snd_una), window.next_seq):
            tx = self.txs.get(seq)
            if tx is not None:
                self.lose(tx, reason)

    def port_lost(self, port: int) -> None:
        """A plane went down: whatever is in flight on it will never arrive."""
        for ev, fifo in list(self.ev_fifo.items()):
            if fifo and fifo[0].slot.entry.port == port:  # (an EV replaced since, too)
                for tx in fifo:
                    tx.queued = False
                    self.lose(tx, RetxReason.PORT)
                del self.ev_fifo[ev]

    # RACK -----------------------------------------------------------------------------
    def run_rack(self, now: float) -> None:
        """Time-based loss detection (RACK, RFC 8985) across all paths.

        The connection runs it when acks arrived since it last ran (``rack_due``), once it
        is asked what to send, that is after the adapter fed it everything that had
        arrived: a software endpoint reads its plane sockets in turn, so an ack waiting in
        one socket must not be taken for a loss because a later ack was read from another
        first.  The reordering timer runs it too.

        A packet still unacknowledged although one sent after it on the same plane was
        acknowledged, and outstanding for longer than that one's RTT plus a reordering
        window, is lost
        (RFC 8985 6.2; the reordering timer looks again when it is not overdue yet).  The
        exception: its own path reported congestion (a trim, an ECN mark) after it was
        sent.  Switches trim instead of dropping, so such a packet is queued, and a busier
        path's queue must not be read as a loss.  This catches the losses the per-EV order
        cannot see (the last packets on an EV, a path gone silent) without an RTO.

        First, the same-path suspects whose window has passed with no ACK for them are
        lost (:meth:`after_ack`); the reordering timer waits for the next one.
        """
        self.rack_due = False
        fifo = self.sent_fifo
        txs = self.txs
        if self._reo_acks >= RACK_REO_DECAY:
            self._reo_acks = 0
            self.reo_fraction = max(RACK_REO_FRACTION, self.reo_fraction / 2)
        reo = self._reo_window()
        self.rack_timer = None
        suspects = self.suspects
        while suspects:
            due, tx = suspects[0]
            if now < due:
                self.rack_timer = due
                break
            suspects.popleft()
            self._lost_on_path(tx, now)
        rack_order, rack_rtt = self.rack_order, self.rack_rtt
        newest = max(rack_order)
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
            self.lose(tx, RetxReason.RACK)
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

    # The tail-loss probe --------------------------------------------------------------
    def _tail_probe(self, now: float) -> None:
        """The probe timer fired: send the newest packet in flight again, on another EV."""
        self.tlp_deadline = None
        window = self.window
        if self.retx or (window.next_seq < window.end_seq and self.in_flight < self.cc.cwnd):
            return  # the connection is still sending: its own packets will bring acks
        newest = max(
            (tx for tx in self.txs.values() if not tx.lost and not tx.acked),
            key=lambda tx: tx.seq,
            default=None,
        )
        if newest is None:
            return
        self.tlp_out = True
        self.lose(newest, RetxReason.TLP)

    def tail_probe_sent(self, seq: int, ev: int) -> None:
        """The tail-loss probe for packet ``seq`` left on ``ev``."""
        self.tlp_sent = (seq, ev)

    # The stall timer ------------------------------------------------------------------
    def no_path(self, now: float, timeouts: int) -> None:
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

    # The one deadline and its timers --------------------------------------------------
    def next_deadline(self) -> float | None:
        """The earliest of the RTO, the reordering timer, the probe timer and the stall."""
        deadline = self.rto_deadline()
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

    def on_timer(self, now: float) -> None:
        """Run whatever is due: RACK's look again, the probe, the stall, expired RTOs."""
        if self.rack_timer is not None and self.rack_timer <= now:
            due = self.rack_due  # acks that arrived meanwhile still want their own look
            self.run_rack(now)
            self.rack_due = due
        if self.tlp_deadline is not None and self.tlp_deadline <= now:
            self._tail_probe(now)
        stall = self.stall_deadline
        if stall is not None and stall <= now:
            self._stall_expired(now)
            if self.failed is not None:
                return
        heap = self.rto_heap
        while heap and heap[0][0] <= now:
            group = self._pop_rto()
            deadline = group.deadline
            for tx in group.txs[group.head :]:
                if tx.acked or tx.lost or deadline != tx.deadline or self.txs.get(tx.seq) is not tx:
                    continue
                if self._rto_expired(tx, now):
                    return

    def _rto_expired(self, tx: Tx, now: float) -> bool:
        """``tx``'s timeout came: restart it, or time it out (True: the connection failed)."""
        if self.last_progress > tx.sent:
            # Acks kept coming since this packet left, so the connection is not stalled:
            # its timer restarts from the latest one (RFC 6298 5.3).  A packet lost on a
            # live connection is RACK's to find; the RTO is for silence, and a burst
            # sent at once must not time out as one because its tail queued behind it.
            restart = self.last_progress + self.rto(tx.timeouts)
            if restart > now:
                tx.deadline = restart
                self._arm_rto(tx)
                return False
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
            return True
        self.cc.on_timeout(now)
        self._timed_out(tx, now)
        return False

    def _timed_out(self, tx: Tx, now: float) -> None:
        """``tx`` timed out: it is lost, its EV is condemned, and since the path is
        black-holed, everything else in flight on it is gone too."""
        self.lose(tx, _TIMEOUT)
        if self.evs.apply(tx.ev, EvSignal.TIMEOUT, EvReason.RTO, now):
            tx.slot.condemned_seq = tx.seq
        for other in self.ev_fifo.pop(tx.ev, ()):
            other.queued = False
            if other is not tx and not other.acked and not other.lost:
                other.timeouts = max(other.timeouts, tx.timeouts - 1)
                self.lose(other, _TIMEOUT)

    def abandon(self, from_seq: int) -> None:
        """The peer refused the write at ``from_seq``: nothing from there on is in flight
        any more (no timer, no resend; it is flushed when the writes before complete)."""
        for seq in [seq for seq in self.txs if seq >= from_seq]:
            tx = self.txs.pop(seq)
            if not tx.lost:
                self.in_flight -= tx.size
            tx.acked = True  # (so the timers and queues that still hold it skip it)
        if not self.txs:
            self.tlp_deadline = None

    def clear(self) -> None:
        """The connection failed: nothing is in flight any more, no timer runs."""
        self.txs.clear()
        self.retx.clear()
        self.sent_fifo.clear()
        self.rack_timer = self.tlp_deadline = None
        self.rto_heap.clear()
        self._rto_last = None
        self.ev_fifo.clear()
        self.suspects.clear()
        self.in_flight = 0
        self._end_stall()


@mypyc_attr(allow_interpreted_subclasses=True)
class GoBackN(Recovery):
    """The RoCE baseline's recovery: it infers nothing from order or time (no same-path
    evidence, no RACK, no tail-loss probe), and a timeout or a NACK asking for a retry
    resends everything from that packet on, as a RoCE NIC does."""

    def track(self, tx: Tx) -> None:
        if self.stall_deadline is not None:
            self._end_stall()
        self.txs[tx.seq] = tx
        self._arm_rto(tx)
        self.in_flight += tx.size

    def after_ack(
        self, echo_tx: Tx | None, nack: int, now: float, missing: int = -1, reported_from: int = 0
    ) -> None:
        pass

    def retry_nack(self, tx: Tx | None, seq: int) -> None:
        self.go_back(seq, RetxReason.NACK)

    def _timed_out(self, tx: Tx, now: float) -> None:
        self.go_back(tx.seq, _TIMEOUT)


#: Loss recovery by connection mode (``ConnectionConfig.mode``).
STRATEGIES: Final[dict[str, type[Recovery]]] = {"mrc": Recovery, "roce": GoBackN}
