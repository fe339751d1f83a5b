"""The sans-IO MRC connection (a QP): three inputs, two outputs, one timer.

In: API calls (``post_write``, ``set_port_state``, ``set_peer_ports``, the EV controls
``deny_evs``, ``allow_evs``, ``replace_ev``, ``set_ev_min_active``),
``receive_datagram(data, now, port)``, ``handle_timer(now)``.  Out: ``datagrams_to_send(now)``
and ``next_event()``; ``get_timer()`` is the one deadline the adapter arms: the earliest of
loss recovery's (:mod:`mrcstack.core.recovery`) and the EV probe tick.  Nothing here reads a
clock, opens a socket or draws global randomness.

The codec sits at the edge: ``receive_datagram`` is ``decode`` then ``receive_packet``, and
``datagrams_to_send`` is ``packets_to_send`` then ``encode``.  A QP whose peer did not
negotiate mrcstack's extension (``ConnectionConfig.extensions`` off) uses the specification's
encoding alone (``decode_plain``/``encode_plain``): the adapter hands it each datagram's EV
and traffic class from the outer header, and :mod:`mrcstack.core.plainrx` works out what the
extension would have said.  EV probes go to the peer's endpoint (QP 2) with a probe id from
the host's :class:`~mrcstack.core.endpoint.ProbeIds`.  An adapter whose packets never
meet a wire (the simulator) uses the packet forms and skips the codec; the protocol logic
behind both is the same.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from mypy_extensions import mypyc_attr

from mrcstack.core.config import ConnectionConfig, ConnectionStats
from mrcstack.core.endpoint import ProbeIds
from mrcstack.core.events import (
    ConnectionFailed,
    Event,
    EvStateChanged,
    PortStateChanged,
    WcStatus,
)
from mrcstack.core.evs import EvEntry, EvSignal, EvSlot, EvStatus, EvTable
from mrcstack.core.memory import MemoryTable
from mrcstack.core.plainrx import Placement, widen
from mrcstack.core.psn import unwrap
from mrcstack.core.reasons import EvReason, RejectReason
from mrcstack.core.receiver import SACK_BITS, Receiver
from mrcstack.core.sender import Sender
from mrcstack.core.tx import U64, Outgoing
from mrcstack.errors import ConnectionFailedError, LocalError
from mrcstack.wire import (
    ENDPOINT_QPN,
    MPR_UNIT,
    NACK_HDR_LEN,
    SACK_HDR_LEN,
    AcknowledgePacket,
    AckPacket,
    AeadIntegrity,
    CrcIntegrity,
    DataFlags,
    DataPacket,
    DecodeError,
    EvFormat,
    FeedbackFlags,
    IcrcPath,
    Integrity,
    NackReason,
    Opcode,
    Packet,
    PortStatusPacket,
    ProbePacket,
    ProbeReplyPacket,
    ReliabilityProbePacket,
    ReplayWindow,
    SkipHint,
    WireUsageError,
    decode,
    decode_plain,
    encode,
    encode_into,
    encode_plain,
    encoded_length,
    has_extension,
    plain_encoded_length,
    plain_header_length,
)

# Plain ints: IntFlag arithmetic costs a method call per packet.
_ECN_ECHO: Final = int(FeedbackFlags.ECN_ECHO)
_DUPLICATE: Final = int(FeedbackFlags.DUPLICATE)
_TRIMMED: Final = int(DataFlags.TRIMMED)
_ACK_NOW: Final = int(DataFlags.LAST | DataFlags.ACK_REQ)
_SKIP_ONCE: Final = int(SkipHint.SKIP_ONCE)
_SKIP_NONE: Final = int(SkipHint.NONE)
_PROBE_RESPONSE: Final = int(FeedbackFlags.PROBE_RESPONSE)
#: What a QP that refused one of its peer's writes still takes (see Connection._refused).
_DRAINED: Final = frozenset({DataPacket, ReliabilityProbePacket})
#: Packets addressed to a host's endpoint (QP 2), not to a connection.
_ENDPOINT_PACKETS: Final = frozenset({ProbePacket, ProbeReplyPacket, PortStatusPacket})
#: An ACKNOWLEDGE's (IBTA AETH) NAK syndromes, as the NACK reasons they mean.
_AETH_NAKS: Final = {
    0x60: int(NackReason.SEQ_ERROR),
    0x61: int(NackReason.INVALID_REQUEST),
    0x62: int(NackReason.REMOTE_ACCESS),
}
#: A tx_seq no packet carries: a QP without the extension takes no port bitmap from ACKs.
_NO_PORTS: Final = 1 << 64
#: An ACK's fields as ``Connection._ack`` takes them: port, cum_psn, msn, echo_ev, echo_psn,
#: echo_ts_ns, sack_base, sack_bitmap, ecn, nack, dup, ooo_count, rcv_bytes.
_AckFields = tuple[int, int, int, int, int, int, int, int, bool, int, bool, int, int]
#: Datagrams handed out per ``datagrams_to_send`` call unless the caller asks otherwise.
DEFAULT_BATCH: Final = 1 << 16


@dataclass(frozen=True, slots=True)
class Datagram:
    """One UDP payload to send on NIC port ``port``, to the path that EV ``ev`` names."""

    data: bytes
    port: int
    ev: int

    def __reduce__(self) -> tuple[type[Datagram], tuple[object, ...]]:
        # What pickle and copy use: compiled by mypyc, a frozen dataclass cannot be
        # restored field by field (mrcd hands QPs to its data-path workers pickled).
        return (Datagram, (self.data, self.port, self.ev))


# Python subclasses of it run beside it compiled (mrcstack.native).
@mypyc_attr(allow_interpreted_subclasses=True)
class Connection:
    def __init__(
        self,
        config: ConnectionConfig,
        *,
        memory: MemoryTable,
        rng: random.Random,
        now: float,
        probe_ids: ProbeIds | None = None,
    ) -> None:
        self.cfg = config
        self.rng = rng
        self.memory = memory
        self.stats = ConnectionStats(planes=config.planes)
        # Events not yet taken by next_event: an adapter may test it for emptiness (cheaper
        # than a call that returns None, after every input).
        self.events: deque[Event] = deque()
        entries = config.evs[:1] if config.mode == "roce" else config.evs
        self.evs = EvTable(
            entries,
            config.planes,
            self._emit,
            profile_id=config.profile_id,
            ev_count=1 if config.mode == "roce" else config.ev_count,
            ev_min_active=config.ev_min_active,
            denied=config.denied,
        )
        self.cc = config.controller(now)
        self.integrity: Integrity
        #: Without mrcstack's extension every packet stripes its EV over the UDP source port
        #: and the flow label (which the ICRC covers); with it only STEV does.
        self.plain = not config.extensions
        striped = self.plain or config.ev_format is EvFormat.STEV
        # Endpoint packets (EV probes, QP 2) are the host's, whatever the QP's key: the ICRC.
        self.endpoint_integrity: Integrity = CrcIntegrity(config.icrc_paths, ev_ports=striped)
        # An endpoint's answer is checked with the UDP source port it came from (in ``ev``).
        self._endpoint_open = CrcIntegrity(config.icrc_paths, ev_ports=True)
        self._answer_crc: dict[int, CrcIntegrity] = {}  # source port -> its ICRC check
        if config.key is not None:
            self.integrity = AeadIntegrity(
                config.key, config.local_qpn, config.remote_qpn, encrypt=config.encrypt
            )
            self.replay: ReplayWindow | None = ReplayWindow()
        else:
            self.integrity = self.endpoint_integrity
            self.replay = None
        self._encode = encode_plain if self.plain else encode
        self.probe_ids = probe_ids if probe_ids is not None else ProbeIds(rng)
        self._trailer_len = trailer = self.integrity.trailer_len
        # Control packets' datagram lengths as this QP's layout has them (an endpoint packet
        # is sealed the host's way), and an ACK's, worked out once: one goes per data packet.
        self._endpoint_trailer_len = self.endpoint_integrity.trailer_len
        self._length = plain_encoded_length if self.plain else encoded_length
        if self.plain:
            self._sack_len = plain_header_length(Opcode.RELIABILITY_SACK) + trailer
            self._nack_len = plain_header_length(Opcode.RELIABILITY_NACK) + trailer
        else:
            self._sack_len = SACK_HDR_LEN + trailer
            self._nack_len = NACK_HDR_LEN + trailer
        self.sender = Sender(
            config, self.evs, self.cc, self.stats, self._emit, trailer_len=self._trailer_len
        )
        # Packets in flight, their loss and the timers that decide it (the sender's).
        self.recovery = self.sender.recovery
        # Every data packet's feedback comes as the fields of its ACK: ACKed at once, or
        # coalesced when an ACK may stand for several.
        feedback = self._ack_or_coalesce if config.ack_coalesce > 1 else self._ack
        self.receiver = Receiver(config, memory, self.stats, self._emit, feedback)
        self.receiver.on_refused = self._refused
        self._draining = False  # failed by refusing a write: still takes what came before
        self._control: deque[Outgoing] = deque()
        # port -> the fields of the newest ACK not yet sent (``_ack``'s arguments)
        self._pending_acks: dict[int, _AckFields] = {}
        self._pending_count = [0] * config.planes
        # Per port: the lowest and highest seq of the packets a pending ACK stands for.
        self._pending_span = [(0, 0)] * config.planes
        # ack_delay: pending ACKs wait until _ack_due (set at the first transmit that
        # holds them back), unless a packet that wants its ACK now came (_ack_now).
        self._ack_delay = config.ack_delay
        self._ack_due: float | None = None
        self._ack_now = False
        self._tx_seq = 0
        # tx_seq of the packet whose port bitmap was applied last (a QP without the
        # extension learns the peer's ports from its PORT_STATUS_UPDATEs only).
        self._ports_seq = _NO_PORTS if self.plain else -1
        self._placement = Placement(config.mtu_payload) if self.plain else None
        self._dup_flag = 0 if self.plain else _DUPLICATE  # (XFETH's: no room without it)
        self._scid = config.local_qpn & 0xFFFF
        # Feedback rotates over each plane's reverse EVs on its own: one shared counter
        # would lock every plane to one parity when arrivals alternate between planes.
        self._reverse_rr = [rng.randrange(1 << 16) for _ in range(config.planes)]
        self._port_bits = (1 << config.planes) - 1
        self._reverse_evs = config.reverse_evs_per_plane
        self._remote_qpn = config.remote_qpn
        # The peer's port bitmap as last applied (EvTable.remote_port_up as bits): an ACK
        # carries it, and one that changes nothing costs no walk over the planes.
        self._peer_bits = self._port_bits
        # The receive window stated in every SACK (MPR counts 128-PSN units, at least one).
        self._window = max(MPR_UNIT, config.max_window // MPR_UNIT * MPR_UNIT)
        self._probes: dict[int, float] = {}  # EV -> when its outstanding probe left
        self._probe_evs: dict[int, int] = {}  # probe id -> the EV it probes
        self._next_probe: float | None = None
        self._last_data_rx = -1.0
        self.failed: str | None = None

    # Application API ------------------------------------------------------------------
    def post_write(
        self,
        wr_id: int,
        local: bytes | bytearray | memoryview,
        remote_va: int,
        rkey: int,
        *,
        imm: int | None = None,
        now: float,
    ) -> None:
        """Post an RDMA WRITE (with immediate if ``imm`` is given) of all of ``local``."""
        if self.failed is not None:
            raise ConnectionFailedError(f"connection failed: {self.failed}")
        view = memoryview(local)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        n = view.nbytes
        if n == 0:
            raise LocalError("a write needs at least one byte")
        if remote_va < 0 or remote_va + n - 1 > U64:
            raise LocalError(f"remote range {remote_va:#x}+{n} leaves the 64-bit space")
        if not 0 <= rkey <= 0xFFFFFFFF:
            raise LocalError(f"rkey {rkey} is not 32-bit")
        if imm is not None and not 0 <= imm <= 0xFFFFFFFF:
            raise LocalError(f"immediate {imm} is not 32-bit")
        self.sender.post(wr_id, view, remote_va, rkey, imm)
        self._schedule_probes(now)

    def set_port_state(self, port: int, up: bool, now: float) -> None:
        """Our NIC port for ``port`` went down or came back (the adapter watches links)."""
        if not 0 <= port < self.cfg.planes:
            raise LocalError(f"port {port} out of range 0..{self.cfg.planes - 1}")
        if up:
            self._port_bits |= 1 << port
        else:
            self._port_bits &= ~(1 << port)
        if self.evs.set_port(port, up, remote=False):
            self._emit(PortStateChanged(port, up, remote=False))
            if not up:
                self.recovery.port_lost(port)

    def set_peer_ports(self, bits: int, now: float) -> bool:
        """The peer's port bitmap (bit p set iff its plane-p port is up) from outside the data
        path, e.g. its PORT_STATUS_UPDATE over the control channel: applied exactly as the
        bitmap its SACKs and probe replies carry, which keep updating it afterwards.  A plane
        the peer has down is out of use at once and what is in flight there counts as lost.
        Returns True if any plane changed (each change is a ``PortStateChanged`` event);
        a failed connection ignores it."""
        if self.failed is not None:
            return False
        return self._peer_ports(bits)

    # Path control (the controller's EV operations) ------------------------------------
    def deny_evs(
        self, values: Iterable[int], *, now: float, reason: EvReason = EvReason.CONTROLLER
    ) -> int:
        """DENY EVs (OCP MODIFY_EV_STATE): out of use and never probed until allowed.

        EVs not in this connection's set are ignored (a profile's denylist may name paths to
        other destinations).  Returns how many EVs changed state; the adapter should
        transmit afterwards, as after any call.
        """
        return sum(self.evs.apply(v, EvSignal.DENY, reason, now) for v in values)

    def allow_evs(
        self, values: Iterable[int], *, now: float, reason: EvReason = EvReason.CONTROLLER
    ) -> int:
        """Take EVs off the denylist: they return ASSUMED_BAD and carry data again once
        ``probe_ok_needed`` probes came back.  Returns how many EVs changed state."""
        changed = sum(self.evs.apply(v, EvSignal.ALLOW, reason, now) for v in values)
        if changed:
            self._schedule_probes(now)  # the probe tick stops by itself when idle
        return changed

    def replace_ev(self, old: int, new: EvEntry, *, reason: EvReason = EvReason.CONTROLLER) -> None:
        """OCP REPLACE_EV: ``new`` (same plane) takes ``old``'s place in the set; see
        :meth:`EvTable.replace`.  Raises :class:`LocalError` on a mismatch."""
        self.evs.replace(old, new, reason)

    def set_ev_min_active(self, count: int) -> None:
        """Change ``ev_min_active`` online (OCP MIN_ACTIVE): never demote below this many
        usable EVs on the planes that are up."""
        if not 0 <= count <= self.cfg.ev_count:
            raise LocalError(
                f"ev_min_active must be in 0..ev_count ({self.cfg.ev_count}), got {count}"
            )
        self.evs.ev_min_active = count

    @property
    def ev_min_active(self) -> int:
        """The ``ev_min_active`` in force: the config's, or the last :meth:`set_ev_min_active`."""
        return self.evs.ev_min_active

    def ev_states(self) -> tuple[EvStatus, ...]:
        """Every EV of the set with its state, use and drop count, plane by plane."""
        return self.evs.statuses()

    @property
    def on_rtt(self) -> Callable[[float], None] | None:
        """Called with every RTT sample the connection takes (seconds; from ACKs and probe
        replies), e.g. to feed a metrics histogram.  ``None``: no callback."""
        return self.recovery.on_rtt

    @on_rtt.setter
    def on_rtt(self, callback: Callable[[float], None] | None) -> None:
        self.recovery.on_rtt = callback

    def abort(self, reason: str) -> None:
        """Local teardown (QP destroyed, daemon stopping): pending writes complete FLUSHED."""
        self._fail(reason, WcStatus.FLUSHED)

    def peer_gone(self, reason: str) -> None:
        """The peer is known to be gone (its daemon died or restarted, every path to it is
        dead): fail now as a retry exhaustion would, without waiting out the budget.  The
        oldest pending write completes RETRY_EXCEEDED, the rest FLUSHED, each once."""
        self._fail(reason, WcStatus.RETRY_EXCEEDED)

    def retry_budget(self) -> float:
        """Seconds without progress before this connection fails on its own, with today's
        RTO base (``ConnectionConfig.retry_budget``)."""
        return self.cfg.retry_budget(self.recovery.rto())

    def next_event(self) -> Event | None:
        return self.events.popleft() if self.events else None

    def window(self) -> tuple[int, int]:
        """The congestion window and the bytes in flight (sent, not acknowledged, not
        declared lost), for an operator's view of the QP."""
        return self.cc.cwnd, self.recovery.in_flight

    @property
    def idle(self) -> bool:
        """Nothing posted is pending (every write completed or failed)."""
        return self.sender.idle

    # Network input --------------------------------------------------------------------
    def receive_datagram(
        self,
        data: bytes | memoryview,
        *,
        now: float,
        port: int,
        ecn: bool = False,
        ev: int = 0,
        tclass: int = 0,
    ) -> None:
        """A datagram from NIC port ``port``: decoded and verified here (what fails is
        counted in ``stats.rejected`` and dropped), then handled as by ``receive_packet``.

        A QP without mrcstack's extension needs ``ev``, the EV the outer header carried
        (``mrcstack.wire.ev_from_outer`` of its UDP source port and flow label), and
        ``tclass``, its traffic class (a trimmed write arrives in DSCP 12 or 16)."""
        stats = self.stats
        if self.failed is not None and not self._draining:
            return
        if not 0 <= port < self.cfg.planes:
            stats.count(stats.rejected, RejectReason.PORT)
            return
        if self.plain:
            self._receive_plain(data, now, port, ecn, ev, tclass)
            return
        try:
            pkt = decode(data, self.integrity)
        except DecodeError as exc:
            stats.count(stats.rejected, exc.reason.name.lower())
            return
        self._receive(pkt, len(data), now=now, port=port, ecn=ecn)

    def receive_endpoint_datagram(
        self, data: bytes | memoryview, *, now: float, port: int, ev: int = 0
    ) -> None:
        """A datagram the peer's endpoint (QP 2) sent to ours that answers one of this QP's
        EV probes (the adapter finds the QP by the probe id).  ``ev``: the EV the outer header
        carries (``ev_from_outer``), whose UDP source port the ICRC covers."""
        stats = self.stats
        if self.failed is not None or not 0 <= port < self.cfg.planes:
            return
        try:
            if has_extension(data):
                pkt = decode(data, self._endpoint_open_with(ev))
            else:
                pkt = decode_plain(data, self._endpoint_open, ev=ev, port=port)
        except DecodeError as exc:
            stats.count(stats.rejected, exc.reason.name.lower())
            return
        if type(pkt) is not ProbeReplyPacket:
            stats.count(stats.rejected, RejectReason.QPN)
            return
        if not has_extension(data):
            pkt.echo_ts_ns = widen(pkt.echo_ts_ns, now)
        stats.packets_received[port] += 1
        stats.bytes_received[port] += len(data)
        self._probe_reply(pkt, now)

    def _endpoint_open_with(self, ev: int) -> Integrity:
        """The ICRC check of an endpoint answer with the extension: the EV in its XETH is not
        the one its outer header carries, so its source port is fixed from ``ev``."""
        sport = ev >> 16
        crc = self._answer_crc.get(sport)
        if crc is None:
            paths = tuple(
                IcrcPath(p.local, p.peer, p.local_port, sport) for p in self.cfg.icrc_paths
            )
            crc = self._answer_crc[sport] = CrcIntegrity(paths)
        return crc

    def _receive_plain(
        self, data: bytes | memoryview, now: float, port: int, ecn: bool, ev: int, tclass: int
    ) -> None:
        """A datagram in the specification's encoding: decoded, then what the extension
        would have said worked out (a middle packet's offset, full timestamps)."""
        stats = self.stats
        try:
            pkt = decode_plain(data, self.integrity, ev=ev, port=port, tclass=tclass)
        except DecodeError as exc:
            stats.count(stats.rejected, exc.reason.name.lower())
            return
        kind = type(pkt)
        placement = self._placement
        if kind is DataPacket and placement is not None:
            data_pkt: DataPacket = pkt  # type: ignore[assignment]
            if not data_pkt.trimmed and data_pkt.qpn == self.cfg.local_qpn:
                seq = unwrap(data_pkt.psn, self.receiver.rcv_nxt)
                first = placement.first_of(data_pkt, seq)  # (a first or last one teaches it)
                if data_pkt.offset < 0:
                    if first is not None:
                        data_pkt.offset = (seq - first) * self.cfg.mtu_payload
                    elif seq < self.receiver.rcv_nxt:
                        data_pkt.offset = 0  # a duplicate: acknowledged, never placed again
                    else:
                        if not placement.hold(data_pkt, seq, len(data), ecn, port):
                            stats.count(stats.rejected, RejectReason.UNPLACED)
                        return
            self._receive(pkt, len(data), now=now, port=port, ecn=ecn)
            if placement.held:
                placement.forget_below(self.receiver.rcv_nxt)
                for held in placement.ready():
                    self._receive(held.pkt, held.size, now=now, port=held.port, ecn=held.ecn)
            return
        if kind is AckPacket or kind is ProbeReplyPacket:
            pkt.echo_ts_ns = widen(pkt.echo_ts_ns, now)  # type: ignore[union-attr]
        self._receive(pkt, len(data), now=now, port=port, ecn=ecn)

    def receive_packet(
        self, pkt: Packet, size: int, *, now: float, port: int, ecn: bool = False
    ) -> None:
        """A packet that was never encoded, as ``decode`` would return it, whose datagram
        would be ``size`` bytes long: the simulator hands over packets this way.  Payloads
        are read during the call only, as with ``receive_datagram``."""
        self._receive(pkt, size, now=now, port=port, ecn=ecn)

    def _receive(self, pkt: Packet, size: int, *, now: float, port: int, ecn: bool = False) -> None:
        """``receive_packet``'s work; the datagram path's too once decoded (a subclass that
        wraps ``receive_packet``, as the benchmark's timing one does, is not entered twice)."""
        if self.failed is not None and (not self._draining or type(pkt) not in _DRAINED):
            return
        stats = self.stats
        if not 0 <= port < self.cfg.planes:
            stats.count(stats.rejected, RejectReason.PORT)
            return
        if pkt.qpn != self.cfg.local_qpn and not (
            pkt.qpn == ENDPOINT_QPN and type(pkt) in _ENDPOINT_PACKETS
        ):
            stats.count(stats.rejected, RejectReason.QPN)
            return
        replay = self.replay
        if (
            replay is not None
            and not (type(pkt) is DataPacket and pkt.flags & _TRIMMED)
            and type(pkt) not in _ENDPOINT_PACKETS
        ):
            if not replay.check(pkt.tx_seq):
                stats.count(stats.rejected, RejectReason.REPLAY)
                return
            replay.update(pkt.tx_seq)
        stats.packets_received[port] += 1
        stats.bytes_received[port] += size
        if type(pkt) is DataPacket:
            self._last_data_rx = now
            if ecn:
                stats.ecn_received += 1
            if pkt.flags & _ACK_NOW:  # a write's last packet, or one flagged ACK_REQ
                self._ack_now = True
            # (its feedback goes to _ack or _ack_or_coalesce: the receiver's direct)
            self.receiver.on_data(pkt, ecn, port)
            if self._next_probe is None:
                self._schedule_probes(now)
        elif type(pkt) is AckPacket:
            if pkt.tx_seq > self._ports_seq:  # _peer_ports_from, inline: once per ACK
                self._ports_seq = pkt.tx_seq
                if pkt.port_state != self._peer_bits:
                    self._peer_ports(pkt.port_state)
            sender = self.sender
            sender.on_ack(pkt, now)
            if sender.failed is not None:
                self._fail(*sender.failed)
        elif type(pkt) is ProbePacket:
            self._reply_probe(pkt, port)
        elif type(pkt) is PortStatusPacket:
            if self.plain:
                self._peer_ports(pkt.port_state)
            else:
                self._peer_ports_from(pkt.tx_seq, pkt.port_state)
        elif type(pkt) is ReliabilityProbePacket:
            stats.reliability_probes += 1
            queued = len(self._control)
            # (the answer to a probe never waits to coalesce)
            self.receiver.state_feedback(pkt.ev, pkt.ts_ns, port, self._ack)
            if len(self._control) > queued:  # the SACK answering it: SETH pr
                self._control[-1][0].flags |= _PROBE_RESPONSE  # type: ignore[union-attr]
        elif type(pkt) is ProbeReplyPacket:
            self._probe_reply(pkt, now)
        elif type(pkt) is AcknowledgePacket:
            self._acknowledge(pkt, now)

    def _probe_reply(self, pkt: ProbeReplyPacket, now: float) -> None:
        """The peer's endpoint answered one of our EV probes (matched by its probe id)."""
        ev = self._probe_evs.pop(pkt.probe_id, None)
        self.probe_ids.release(pkt.probe_id)
        if ev is None or self._probes.pop(ev, None) is None:
            return  # not ours, or given up for lost
        self.stats.probe_replies += 1
        if pkt.echo_ts_ns:
            self.recovery.rtt_sample(now - pkt.echo_ts_ns / 1e9)
        self.evs.probe_result(ev, True, now, self.cfg.probe_ok_needed, self.cfg.probe_lost_needed)

    def _acknowledge(self, pkt: AcknowledgePacket, now: float) -> None:
        """An ACKNOWLEDGE (IBTA AETH) from a spec peer: a cumulative ACK up to its PSN, or a
        NAK of it; it names no EV or time, so it says nothing of a path."""
        nak = _AETH_NAKS.get(pkt.syndrome, 0)
        psn = pkt.psn
        ack = AckPacket(
            pkt.qpn, psn, pkt.msn, pkt.ev, pkt.port, 0, -1, psn, 0, (psn + 1) & 0xFFFFFF, 0, 0, 0,
            nak,
        )  # fmt: skip
        sender = self.sender
        sender.on_ack(ack, now)
        if sender.failed is not None:
            self._fail(*sender.failed)

    def _peer_ports_from(self, tx_seq: int, bits: int) -> None:
        """A bitmap the peer sent in packet ``tx_seq``: only one newer than the last applied
        counts (a late ACK must not revive a plane the peer has reported down since)."""
        if tx_seq > self._ports_seq:
            self._ports_seq = tx_seq
            self._peer_ports(bits)

    def _peer_ports(self, bits: int) -> bool:
        """Apply the peer's port bitmap; True if any plane changed."""
        bits &= (1 << self.cfg.planes) - 1
        if bits == self._peer_bits:
            return False
        self._peer_bits = bits
        changed = False
        for port in range(self.cfg.planes):
            up = bool(bits >> port & 1)
            if self.evs.set_port(port, up, remote=True):
                changed = True
                self._emit(PortStateChanged(port, up, remote=True))
                if not up:
                    self.recovery.port_lost(port)
        return changed

    # Output ---------------------------------------------------------------------------
    def _next_tx_seq(self) -> int:
        self._tx_seq += 1
        return self._tx_seq

    def _reverse_slot(self, port: int) -> EvSlot | None:
        rr = self._reverse_rr
        rr[port] += 1
        return self.evs.reverse_ev(port, rr[port], self.cfg.reverse_evs_per_plane)

    def _ack_or_coalesce(
        self,
        port: int,
        cum_psn: int,
        msn: int,
        echo_ev: int,
        echo_psn: int,
        echo_ts_ns: int,
        sack_base: int,
        sack_bitmap: int,
        ecn: bool,
        nack: int,
        dup: bool,
        ooo_count: int,
        rcv_bytes: int,
        seq: int,
        base: int,
        rcv_nxt: int,
    ) -> None:
        """ACK now, or let the next ACK on this port stand for this one too: the feedback
        for data packet ``seq`` (whose SACK window starts at ``base``, the cumulative point
        then ``rcv_nxt``) as the receiver hands it over.

        Coalescing is safe only while the newest ACK reports every packet of the group it
        stands for (in its cumulative PSN or its 64-bit SACK window): the sender reads a
        later packet on an EV acknowledged while an earlier one is not as a loss on that
        path, and the earlier packet arrived on this same port.  So the pending ACK goes
        out first whenever the new one would not cover its group, and before a NACK, ECN
        echo or duplicate report, which never wait: they are signals about one packet.
        """
        urgent = nack or ecn or dup
        pending = self._pending_acks.get(port)
        if pending is not None:
            low, high = self._pending_span[port]
            if urgent or not (
                high < rcv_nxt or (max(low, rcv_nxt) >= base and high < base + SACK_BITS)
            ):
                self._send_pending(port, pending)
                pending = None
        fields = (port, cum_psn, msn, echo_ev, echo_psn, echo_ts_ns, sack_base, sack_bitmap,
                  ecn, nack, dup, ooo_count, rcv_bytes)  # fmt: skip
        if urgent:
            self._ack(*fields)
            return
        if pending is None:
            count = 1
            self._pending_span[port] = (seq, seq)
        else:
            count = self._pending_count[port] + 1
            low, high = self._pending_span[port]
            self._pending_span[port] = (min(low, seq), max(high, seq))
        if count >= self.cfg.ack_coalesce:
            self._send_pending(port, fields)
        else:
            self._pending_acks[port] = fields
            self._pending_count[port] = count

    def _send_pending(self, port: int, fields: _AckFields) -> None:
        self._pending_acks.pop(port, None)
        self._pending_count[port] = 0
        self._ack(*fields)

    def _flush_acks(self) -> None:
        for port, fields in self._pending_acks.items():
            self._pending_count[port] = 0
            self._ack(*fields)
        self._pending_acks.clear()
        self._ack_due = None

    def _ack(
        self,
        port: int,
        cum_psn: int,
        msn: int,
        echo_ev: int,
        echo_psn: int,
        echo_ts_ns: int,
        sack_base: int,
        sack_bitmap: int,
        ecn: bool,
        nack: int,
        dup: bool,
        ooo_count: int,
        rcv_bytes: int,
        seq: int = 0,
        base: int = 0,
        rcv_nxt: int = 0,
    ) -> None:
        """Queue the ACK (or NACK) for data that arrived on ``port``: its feedback's fields,
        straight from the receiver or coalesced (``seq``, ``base`` and ``rcv_nxt`` are for
        coalescing: unused here)."""
        rr = self._reverse_rr  # _reverse_slot, inline: once per data packet received
        rr[port] += 1
        slot = self.evs.reverse_ev(port, rr[port], self._reverse_evs)
        if slot is None:
            self.stats.count(self.stats.rejected, RejectReason.NO_REVERSE_PATH)
            return
        entry = slot.entry
        out_port = entry.port
        self._tx_seq += 1
        ack = AckPacket(
            self._remote_qpn, cum_psn, msn, entry.value, out_port, self._tx_seq,
            echo_ev, echo_psn, echo_ts_ns, sack_base, sack_bitmap, self._port_bits,
            (_ECN_ECHO if ecn else 0) | (self._dup_flag if dup else 0), nack,
            # skip: an ECN-marked packet's path is busier than the others: skip it a while.
            _SKIP_ONCE if ecn else _SKIP_NONE,
            ooo_count, rcv_bytes, self._window, 0, self._scid,
        )  # fmt: skip
        # _queue, inline: one per data packet received.
        size = self._nack_len if nack else self._sack_len
        self._control.append((ack, size))
        stats = self.stats
        stats.packets_sent[out_port] += 1
        stats.bytes_sent[out_port] += size

    def _reply_probe(self, probe: ProbePacket, port: int) -> None:
        """Answer an EV probe as this host's endpoint would (an adapter with one connection
        per host hands them to it), on a reverse path of the plane it came on."""
        slot = self._reverse_slot(port)
        if slot is None:
            return
        reply = ProbeReplyPacket(
            qpn=ENDPOINT_QPN,
            ev=slot.entry.value,
            port=slot.entry.port,
            tx_seq=self._next_tx_seq(),
            probe_id=probe.probe_id,
            echo_ts_ns=probe.ts_ns,
            port_state=0 if self.plain else self._port_bits,
        )
        self._queue(reply, slot)

    def _queue(self, pkt: Packet, slot: EvSlot) -> None:
        """Queue a control packet (it is encoded, if at all, when it is handed out)."""
        port = slot.entry.port
        endpoint = pkt.qpn == ENDPOINT_QPN
        size = self._length(pkt, self._endpoint_trailer_len if endpoint else self._trailer_len)
        self._control.append((pkt, size))
        self.stats.packets_sent[port] += 1
        self.stats.bytes_sent[port] += size

    def datagrams_to_send(
        self, now: float, limit: int = DEFAULT_BATCH, data_limit: int | None = None
    ) -> list[Datagram]:
        """Control packets first, then data, ``limit`` in all; at most ``data_limit`` data
        packets (an adapter pacing a NIC asks only for what its wire can take now: a
        packet is sent, and its timers start, when it leaves, not while it waits)."""
        integrity = self.integrity
        out = self.packets_to_send(now, limit, data_limit)
        if self.replay is not None:  # AES-GCM: endpoint packets are sealed the host's way
            endpoint = self.endpoint_integrity
            return [
                Datagram(
                    self._encode(pkt, endpoint if pkt.qpn == ENDPOINT_QPN else integrity),
                    pkt.port,
                    pkt.ev,
                )
                for pkt, _ in out
            ]
        coder = self._encode
        return [Datagram(coder(pkt, integrity), pkt.port, pkt.ev) for pkt, _ in out]

    def encode(self, pkt: Packet) -> bytes:
        """One packet from :meth:`packets_to_send` as its datagram (as ``datagrams_to_send``
        encodes it)."""
        if pkt.qpn == ENDPOINT_QPN and self.replay is not None:
            return self._encode(pkt, self.endpoint_integrity)  # sealed the host's way
        return self._encode(pkt, self.integrity)

    def encode_into(self, pkt: Packet, out: bytearray | memoryview) -> int:
        """:meth:`encode` into the start of ``out`` (an adapter's send slot); the datagram's
        length.  A data packet with the extension is built there, its payload copied once
        (:func:`~mrcstack.wire.encode_into`); WireUsageError if ``out`` is too small."""
        if self.plain or (pkt.qpn == ENDPOINT_QPN and self.replay is not None):
            data = self.encode(pkt)
            size = len(data)
            if len(out) < size:
                raise WireUsageError(f"a buffer of {len(out)} bytes cannot hold {size} bytes")
            out[:size] = data
            return size
        return encode_into(pkt, self.integrity, out)

    def packets_to_send(
        self, now: float, limit: int = DEFAULT_BATCH, data_limit: int | None = None
    ) -> list[Outgoing]:
        """``datagrams_to_send`` before encoding: each packet with its datagram's length.

        A data packet's payload is a view of the posted buffer, which the application may
        reuse once the write completes; a copy still in flight by then is a duplicate,
        which the receiver drops without reading its payload."""
        out: list[Outgoing] = []
        if self._pending_acks:
            if not self._ack_delay or self._ack_now:
                self._flush_acks()
            elif self._ack_due is None:
                self._ack_due = now + self._ack_delay
            elif now >= self._ack_due:
                self._flush_acks()
        elif self._ack_due is not None:  # (sent meanwhile, each for its own reason)
            self._ack_due = None
        self._ack_now = False
        recovery = self.recovery
        if recovery.rack_due:
            recovery.run_rack(now)
        control = self._control
        while control and len(out) < limit:
            out.append(control.popleft())
        if self.failed is not None or len(out) >= limit:
            return out
        evs = self.evs
        if evs.next_skip_expiry <= now:
            evs.expire_skips(now)
        room = limit - len(out) if data_limit is None else min(limit - len(out), data_limit)
        if room <= 0:
            return out
        sent = self.sender.next_packets(now, room)
        if sent:
            tx_seq = self._tx_seq
            for pkt, _ in sent:
                tx_seq += 1
                pkt.tx_seq = tx_seq
            self._tx_seq = tx_seq
            if not out:
                return sent
            out += sent
        return out

    # Timers ---------------------------------------------------------------------------
    def get_timer(self) -> float | None:
        if self.failed is not None:
            return None
        deadline = self.recovery.next_deadline()
        due = self._ack_due
        if due is not None and (deadline is None or due < deadline):
            deadline = due
        probe = self._next_probe
        if probe is not None and (deadline is None or probe < deadline):
            return probe
        return deadline

    def handle_timer(self, now: float) -> None:
        if self.failed is not None:
            return
        recovery = self.recovery
        recovery.on_timer(now)
        if recovery.failed is not None:
            self._fail(*recovery.failed)
            return
        if self._next_probe is not None and self._next_probe <= now:
            self._probe_tick(now)

    # Probes ---------------------------------------------------------------------------
    def _probe_interval(self) -> float:
        if self.cfg.probe_interval is not None:
            return self.cfg.probe_interval
        srtt = self.recovery.srtt
        return max(srtt if srtt is not None else self.cfg.timeout, self.cfg.timeout / 4)

    def _schedule_probes(self, now: float) -> None:
        if self.cfg.mode == "mrc" and self._next_probe is None:
            self._next_probe = now + self._probe_interval()

    def _probe_tick(self, now: float) -> None:
        """Probe assumed-bad EVs (to resurrect them) and, when we only send feedback, the
        EVs our ACKs use (nothing else would tell us that the reverse path broke)."""
        interval = self._probe_interval()
        timeout = max(3 * interval, self.cfg.timeout)
        cfg = self.cfg
        for ev, sent in list(self._probes.items()):
            if now - sent > timeout:
                del self._probes[ev]
                self.evs.probe_result(ev, False, now, cfg.probe_ok_needed, cfg.probe_lost_needed)
        for ident, ev in list(self._probe_evs.items()):
            if ev not in self._probes:
                del self._probe_evs[ident]
                self.probe_ids.release(ident)
        receiving = now - self._last_data_rx < 8 * timeout
        if self.sender.idle and not receiving:
            self._next_probe = None  # idle: no traffic, no probes
            return
        targets = self.evs.probe_candidates()
        if self.sender.idle:
            for port in range(cfg.planes):
                for slot in self.evs.reverse_set(port, cfg.reverse_evs_per_plane):
                    if now - slot.last_evidence > 2 * interval:
                        targets.append(slot)
        for slot in targets:
            value = slot.entry.value
            if value in self._probes:
                continue
            self._probes[value] = now
            ident = self.probe_ids.allocate(cfg.local_qpn)
            self._probe_evs[ident] = value
            probe = ProbePacket(
                ENDPOINT_QPN,
                value,
                slot.entry.port,
                self._next_tx_seq(),
                int(now * 1e9) & U64 or 1,
                self._port_bits,
                ident,
            )
            self.stats.probes_sent += 1
            self._queue(probe, slot)
        self._next_probe = now + interval

    # Events and failure ---------------------------------------------------------------
    def _emit(self, event: Event) -> None:
        if type(event) is EvStateChanged:
            self.stats.ev_state_changes += 1
        self.events.append(event)

    def _fail(self, reason: str, status: WcStatus, wr_id: int | None = None) -> None:
        if self.failed is not None:
            return
        self.failed = reason
        self.sender.flush(status)
        self._control.clear()
        self._probes.clear()
        for ident in self._probe_evs:
            self.probe_ids.release(ident)
        self._probe_evs.clear()
        self._next_probe = None
        self._emit(ConnectionFailed(reason, wr_id))

    def _refused(self, reason: str) -> None:
        """This end refused one of the peer's writes: the QP fails (its own writes are
        flushed), but it still takes and acknowledges what the peer sent before that write,
        so the peer's earlier writes complete (as an RC responder handles them before its
        error); nothing at or after the refused write is placed."""
        self._fail(reason, WcStatus.FLUSHED)
        self._draining = True
