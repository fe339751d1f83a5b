"""A connection that runs in a data-path worker, as the node's parts see it.

:class:`RemoteConnection` answers what the node reads of a connection (its config, state,
counters, EV states, RTO) from the worker's last :class:`~.messages.Status` and the events
relayed since, and turns what the node does to it (posts, aborts, port and EV changes) into
messages, which the worker carries out in order.  What the node reads is therefore up to
:data:`~.messages.STATUS_INTERVAL` old, and a call's count of changed EVs is counted on
that picture; its effects on the connection are exactly the in-process ones.

Failing a connection from this side (``abort``, ``peer_gone``) or losing its worker says
at once what the core would (each pending write completed, oldest first, then
``ConnectionFailed``: :meth:`RemoteConnection.next_event`), so the node delivers it before
it returns as it does in-process; what the worker says of it later is then not delivered
twice (:meth:`RemoteConnection.absorb`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mrcstack.core.config import ConnectionConfig, ConnectionStats
from mrcstack.core.events import ConnectionFailed, Event, EvState, SendCompleted, WcStatus
from mrcstack.core.evs import EvStatus
from mrcstack.core.reasons import EvReason
from mrcstack.daemons.mrcd.node.workers import messages as m


@dataclass(frozen=True, slots=True)
class RecoveryView:
    """The worker's RTO and smoothed RTT at its last status."""

    base: float
    srtt: float | None

    def rto(self) -> float:
        return self.base


class RemoteConnection:
    """QP ``qpn``'s connection in worker ``worker``; ``send`` reaches that worker."""

    def __init__(
        self, qpn: int, worker: int, config: ConnectionConfig, send: Callable[[m.ToWorker], None]
    ) -> None:
        self.qpn = qpn
        self.worker = worker
        self.cfg = config
        self.plain = not config.extensions
        self.failed: str | None = None
        self.stats = ConnectionStats(planes=config.planes)
        self.recovery = RecoveryView(config.initial_rto or config.timeout, None)
        self._send = send
        self._evs: tuple[EvStatus, ...] = ()
        self._retry_budget = config.retry_budget(self.recovery.base)
        #: (cwnd, bytes in flight) at the worker's last status; before the first, what the
        #: worker's new connection starts with (an operator must not read an empty window).
        self._window = (config.controller(0.0).cwnd, 0)
        self._idle = True
        self._posts = 0  # posts sent; the worker's status says how many it carried out
        self._posts_done = 0
        #: wr_ids posted and not completed (in post order): flushed here on a failure.
        self.outstanding: dict[int, int] = {}
        self._events: deque[Event] = deque()
        self._told_failed = False

    # What the node reads ----------------------------------------------------------------
    @property
    def idle(self) -> bool:
        return self._idle and self._posts_done == self._posts and not self.outstanding

    def ev_states(self) -> tuple[EvStatus, ...]:
        return self._evs

    def retry_budget(self) -> float:
        return self._retry_budget

    def window(self) -> tuple[int, int]:
        return self._window

    def next_event(self) -> Event | None:
        """What a failure from this side said (the worker's events come through the pool)."""
        return self._events.popleft() if self._events else None

    # What the node does -------------------------------------------------------------------
    def post_remote(
        self,
        wr_id: int,
        local_va: int,
        length: int,
        remote_va: int,
        rkey: int,
        *,
        imm: int | None,
        now: float,
    ) -> None:
        """Post a write of ``length`` bytes at ``local_va`` in the QP's context."""
        self._posts += 1
        self.outstanding[wr_id] = length
        self._send(m.Post(self.qpn, wr_id, local_va, length, remote_va, rkey, imm, now))

    def abort(self, reason: str) -> None:
        """Pending writes complete FLUSHED (as ``Connection.abort``)."""
        if self.failed is None:
            self._send(m.Call(self.qpn, m.Op.ABORT, (reason,)))
            self._fail(reason, WcStatus.FLUSHED)

    def peer_gone(self, reason: str) -> None:
        """The oldest pending write completes RETRY_EXCEEDED, the rest FLUSHED (as
        ``Connection.peer_gone``)."""
        if self.failed is None:
            self._send(m.Call(self.qpn, m.Op.PEER_GONE, (reason,)))
            self._fail(reason, WcStatus.RETRY_EXCEEDED)

    def _fail(self, reason: str, first: WcStatus) -> None:
        self.failed = reason
        status = first
        for wr_id in self.outstanding:
            self._events.append(SendCompleted(wr_id, status, 0))
            status = WcStatus.FLUSHED
        self.outstanding.clear()
        if not self._told_failed:
            self._told_failed = True
            self._events.append(ConnectionFailed(reason))

    def set_port_state(self, port: int, up: bool, now: float) -> None:
        self._send(m.Call(self.qpn, m.Op.SET_PORT_STATE, (port, up, now)))

    def set_peer_ports(self, bits: int, now: float) -> bool:
        if self.failed is None:
            self._send(m.Call(self.qpn, m.Op.SET_PEER_PORTS, (bits, now)))
        return False  # the worker transmits what it changes itself

    def deny_evs(
        self, values: Iterable[int], *, now: float, reason: EvReason = EvReason.CONTROLLER
    ) -> int:
        return self._ev_call(m.Op.DENY_EVS, values, now, reason, deny=True)

    def allow_evs(
        self, values: Iterable[int], *, now: float, reason: EvReason = EvReason.CONTROLLER
    ) -> int:
        return self._ev_call(m.Op.ALLOW_EVS, values, now, reason, deny=False)

    def _ev_call(
        self, op: m.Op, values: Iterable[int], now: float, reason: EvReason, *, deny: bool
    ) -> int:
        wanted = tuple(values)
        self._send(m.Call(self.qpn, op, (wanted, now, reason)))
        denied = {ev.value for ev in self._evs if ev.state is EvState.DENIED}
        known = {ev.value for ev in self._evs}
        return sum(1 for v in set(wanted) & known if (v in denied) != deny)

    def set_ev_min_active(self, count: int) -> None:
        self._send(m.Call(self.qpn, m.Op.SET_EV_MIN_ACTIVE, (count,)))

    # From the worker ----------------------------------------------------------------------
    def absorb(self, event: Event) -> bool:
        """An event the worker relayed; False if this side has already said it (the node
        must not hear it twice)."""
        if type(event) is SendCompleted:
            return self.outstanding.pop(event.wr_id, None) is not None
        if type(event) is ConnectionFailed:
            if self._told_failed:
                return False
            self._told_failed = True
            self.failed = self.failed or event.reason
        return True

    def update(self, status: m.QpStatus) -> None:
        self.stats = status.stats
        self._evs = status.evs
        self.recovery = RecoveryView(status.rto, status.srtt)
        self._retry_budget = status.retry_budget
        self._window = status.window
        self._idle = status.idle
        self._posts_done = status.posts

    def worker_died(self, reason: str) -> None:
        """The worker is gone: each pending write FLUSHED, then ConnectionFailed naming the
        worker (unless this side failed the connection already), through ``next_event``."""
        self._fail(self.failed or reason, WcStatus.FLUSHED)
