"""Peer liveness: notice within a fraction of a second that a peer mrcd is gone.

A connection's own retry budget (``ConnectionConfig.retry_budget``) is the last resort; a
dead peer usually says so much sooner, and this module listens for that:

- **The control channel ends** (EOF or reset: the kernel closes a dead process's sockets).
  Confirmation: reconnect.  Refused (nothing listens: the mrcd is not running) fails the
  peer's QPs; an answer from a *new* instance (the mrcd restarted) fails the QPs made with
  the old one; the same instance (a momentary reset) fails nothing.  If the control address
  does not answer at all, the data path decides, as below.
- **The peer's port bitmap says every port is down** (its PORT_STATUS over the control
  channel: we send ours to every peer we have QPs with whenever a port changes).
- **A path to the peer timed out** (an EV demoted by an RTO).

The last two, and an unreachable control address, are confirmed by EV probes to the peer
on every plane whose local port is up, a few rounds of a few EVs each: one answer anywhere
proves the peer alive.  No answer in any round fails its QPs.  A confirmation is bounded
(at most :data:`CONTROL_ATTEMPTS` reconnects and :data:`PROBE_ROUNDS` probe rounds, about
half a second), runs once per peer at a time, and never depends on a single timer or a
single signal.  Failed QPs complete their oldest write ``RETRY_EXCEEDED`` and the rest
``FLUSHED`` (``Connection.peer_gone``), like an exhausted retry budget.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from typing import Any, Protocol

from mrcstack.core.events import EvState
from mrcstack.daemons.mrcd.control.client import ControlClient, host_index
from mrcstack.daemons.mrcd.control.records import ControlError
from mrcstack.daemons.mrcd.node.qps import Qp, QpState
from mrcstack.fabric import Fabric

log = logging.getLogger("mrcd")

CONTROL_ATTEMPTS = 3  # reconnects before the data path decides
CONTROL_TIMEOUT = 0.2  # each reconnect (TCP connect, handshake and one PING), seconds
CONTROL_GAP = 0.02  # between reconnects
PROBE_ROUNDS = 3
PROBE_TIMEOUT = 0.1  # one round; a software peer answers in well under a millisecond
PROBES_PER_PLANE = 2
#: After a confirmation found the peer alive, path timeouts start no new one for this long:
#: a failed switch demotes many EVs at once and must not probe the peer once per EV.
SILENT_HOLD = 1.0
PORT_STATUS_TIMEOUT = 1.0

#: Why a peer's QPs were failed (``mrc_peer_failures_total{reason}``).
SIGNALS = ("control_refused", "restarted", "unreachable", "ports_down", "silent")
_BAD = (EvState.ASSUMED_BAD.value, EvState.DENIED.value)


class PeerNode(Protocol):
    """What the watch needs of its node."""

    host: int
    instance: str
    qps: dict[int, Qp]
    control_client: ControlClient | None

    async def probe(self, remote_host: int, plane: int, ev: int, timeout: float = 1.0) -> float: ...

    def port_up(self, plane: int) -> bool: ...

    def send_port_status(self, host: int, bitmap: int) -> int: ...

    def fail_peer(self, host: int, reason: str, qpns: list[int] | None = None) -> int: ...


class PeerWatch:
    """The liveness of every peer we have QPs with (one per node)."""

    def __init__(self, node: PeerNode, planes: int, loop: asyncio.AbstractEventLoop) -> None:
        self.node = node
        self.planes = planes
        self.loop = loop
        self.failures = dict.fromkeys(SIGNALS, 0)  # peers' QPs failed, by signal
        self.restored = 0  # control sessions lost and found the same instance
        self._checks: dict[tuple[int, str], asyncio.Task[None]] = {}
        self._alive_at: dict[int, float] = {}
        self._announce: dict[int, int] = {}  # host -> bitmap still to send
        self._senders: dict[int, asyncio.Task[None]] = {}
        self._closed = False

    # Signals ----------------------------------------------------------------------------
    def session_lost(self, peer_name: str, reason: str) -> None:
        """A control session with ``peer_name`` ended (ours or the peer's)."""
        host = host_index(peer_name)
        if host is not None and self._live(host):
            log.warning("event=peer_control_lost host=%s reason=%s", peer_name, reason)
            self._start(host, "control", self._confirm_control(host, reason))

    def peer_ports(self, host: int, bitmap: int) -> None:
        """The peer's port bitmap (from its PORT_STATUS)."""
        if bitmap & ((1 << self.planes) - 1) == 0 and self._live(host):
            log.warning("event=peer_ports_all_down host=h%d", host)
            self._start(host, "probe", self._confirm_data(host, "ports_down"))

    def path_timed_out(self, host: int) -> None:
        """An EV to ``host`` was demoted by a retransmission timeout."""
        alive = self._alive_at.get(host)
        if alive is not None and self.loop.time() - alive < SILENT_HOLD:
            return
        if self._live(host):
            self._start(host, "probe", self._confirm_data(host, "silent"))

    def ports_changed(self, bitmap: int) -> None:
        """Our port bitmap changed: tell every peer we have QPs with, over the control
        channel (SACKs carry it too, but none arrive when every port is down)."""
        for host in sorted({qp.remote_host for qp in self._rts()}):
            self._announce[host] = bitmap
            if host not in self._senders:
                self._senders[host] = self._spawn(self._send_ports(host))

    # Confirmations ----------------------------------------------------------------------
    async def _confirm_control(self, host: int, reason: str) -> None:
        client = self.node.control_client
        if client is None:
            return
        name = Fabric.host_name(host)
        last = reason
        for attempt in range(CONTROL_ATTEMPTS):
            if attempt:
                await asyncio.sleep(CONTROL_GAP)
            try:
                session = await client.open_session(name, timeout=CONTROL_TIMEOUT)
                instance = await session.instance(timeout=CONTROL_TIMEOUT)
            except ControlError as exc:
                if exc.reason == "no_listener":
                    self._fail(
                        host,
                        "control_refused",
                        f"peer gone: mrcd on {name} is not running "
                        f"(control channel {reason}, reconnect refused)",
                    )
                    return
                last = exc.reason
                continue
            except (TimeoutError, OSError) as exc:
                last = type(exc).__name__
                continue
            stale = [
                qp.qpn
                for qp in self._rts(host)
                if qp.peer_instance and instance and qp.peer_instance != instance
            ]
            if stale:
                self._fail(
                    host, "restarted", f"peer restarted: mrcd on {name} is a new instance", stale
                )
            else:
                self.restored += 1
                log.info("event=peer_control_restored host=%s", name)
            return
        log.warning("event=peer_control_unreachable host=%s last=%s", name, last)
        await self._confirm_data(host, "unreachable")

    async def _confirm_data(self, host: int, signal: str) -> None:
        planes = [p for p in range(self.planes) if self.node.port_up(p)]
        if not planes:
            return  # our own ports are down: that says nothing about the peer
        name = Fabric.host_name(host)
        for rnd in range(PROBE_ROUNDS):
            targets = [(p, ev) for p in planes for ev in self._evs(host, p, rnd)]
            answers = await asyncio.gather(
                *(self.node.probe(host, p, ev, PROBE_TIMEOUT) for p, ev in targets),
                return_exceptions=True,
            )
            if any(isinstance(a, float) for a in answers):
                self._alive_at[host] = self.loop.time()
                log.info("event=peer_alive host=%s signal=%s round=%d", name, signal, rnd)
                return
            if not self._live(host):
                return
        why = {
            "ports_down": "its port status says every port is down",
            "silent": "paths to it timed out",
            "unreachable": "its control channel is gone",
        }[signal]
        self._fail(
            host,
            signal,
            f"peer unreachable: {name}: {why} and no EV probe was answered on any plane "
            f"in {PROBE_ROUNDS} rounds",
        )

    def _evs(self, host: int, plane: int, rnd: int) -> list[int]:
        """A few EVs of ``plane`` to probe in round ``rnd``: the QPs' healthy ones first."""
        good: list[int] = []
        bad: list[int] = []
        for qp in self._rts(host):
            assert qp.conn is not None
            for ev in qp.conn.ev_states():
                if ev.port == plane:
                    (bad if ev.state.value in _BAD else good).append(ev.value)
        pool = list(dict.fromkeys(good + bad))
        if not pool:
            return []
        start = rnd * PROBES_PER_PLANE
        return [pool[(start + i) % len(pool)] for i in range(min(PROBES_PER_PLANE, len(pool)))]

    async def _send_ports(self, host: int) -> None:
        """PORT_STATUS_UPDATE to ``host``: over the fabric, on every plane still up (as MRC
        sends it); over the control channel only when no plane is up to carry it."""
        name = Fabric.host_name(host)
        node = self.node
        try:
            while (bitmap := self._announce.pop(host, None)) is not None:
                sent = node.send_port_status(host, bitmap)
                if sent:
                    log.info("event=port_status_sent host=%s via=fabric datagrams=%d",
                             name, sent)  # fmt: skip
                    continue
                client = node.control_client
                if client is None:
                    return
                try:
                    session = await client.open_session(name, timeout=PORT_STATUS_TIMEOUT)
                    await session.port_status(self.node.host, bitmap, PORT_STATUS_TIMEOUT)
                except (ControlError, OSError) as exc:  # (TimeoutError is an OSError)
                    log.info("event=port_status_not_sent host=%s error=%r", name, str(exc))
        finally:
            self._senders.pop(host, None)

    # Helpers ----------------------------------------------------------------------------
    def _rts(self, host: int | None = None) -> list[Qp]:
        return [
            qp
            for qp in self.node.qps.values()
            if qp.state is QpState.RTS
            and qp.conn is not None
            and qp.conn.failed is None
            and (host is None or qp.remote_host == host)
        ]

    def _live(self, host: int) -> bool:
        return not self._closed and bool(self._rts(host))

    def _fail(self, host: int, signal: str, reason: str, qpns: list[int] | None = None) -> None:
        n = self.node.fail_peer(host, reason, qpns)
        if n:
            self.failures[signal] += 1
            log.error("event=peer_failed host=h%d signal=%s qps=%d reason=%r",
                      host, signal, n, reason)  # fmt: skip

    def _start(self, host: int, kind: str, work: Coroutine[Any, Any, None]) -> None:
        key = (host, kind)
        if key in self._checks or self._closed:
            work.close()  # one confirmation of each kind per peer at a time
            return
        task = self._spawn(work)
        self._checks[key] = task
        task.add_done_callback(lambda _t: self._checks.pop(key, None))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = self.loop.create_task(work)
        task.add_done_callback(_log_crash)
        return task

    async def close(self) -> None:
        self._closed = True
        tasks = [*self._checks.values(), *self._senders.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def snapshot(self) -> Mapping[str, int]:
        return dict(self.failures)


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("event=peer_watch_error error=%r", exc, exc_info=exc)
