"""The node: everything one mrcd runs, behind the calls its API servers make.

:class:`Node` composes the parts and owns the lifecycle (start, quiesce, drain, stop) and the
data path (the plane sockets and the transport); each part is a module of this package:
``qptable.py`` (contexts, QPs), ``connect.py`` (connection setup over the control channel),
``listeners.py`` (peers' connection requests), ``events.py`` (the event fan-out),
``ports.py``, ``peers.py`` (peer liveness), ``probing.py`` (EV probes, port status),
``addresses.py``, ``profiles.py`` and ``snapshot.py`` (what a metrics scrape reads).  The
rest of :class:`Node` is the one interface the API servers, the control server
(``ControlHooks``) and the parts themselves call.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import socket
import time
from collections.abc import Callable

from mrcstack.core.connection import Connection
from mrcstack.core.events import Event
from mrcstack.core.memory import Access, MemoryRegion
from mrcstack.daemons.mrcd.config import MrcdConfig
from mrcstack.daemons.mrcd.control.client import Accept, ConnectRequest, ControlClient, Reject
from mrcstack.daemons.mrcd.control.server import ControlServer, ControlStats
from mrcstack.daemons.mrcd.datapath.transport import (
    Address,
    Transport,
    clock,
    open_plane_socket,
    open_raw_socket,
)
from mrcstack.daemons.mrcd.node.addresses import Addresses
from mrcstack.daemons.mrcd.node.connect import ConnectionSetup
from mrcstack.daemons.mrcd.node.events import EventFanout
from mrcstack.daemons.mrcd.node.listeners import Listener, Listeners
from mrcstack.daemons.mrcd.node.peers import PeerWatch
from mrcstack.daemons.mrcd.node.ports import Ports
from mrcstack.daemons.mrcd.node.probing import Probing
from mrcstack.daemons.mrcd.node.profiles import ProfileStore
from mrcstack.daemons.mrcd.node.qps import Accepted, Context, Qp, QpAttrs
from mrcstack.daemons.mrcd.node.qptable import QpTable
from mrcstack.daemons.mrcd.node.snapshot import NodeCounters, NodeSnapshot, scrape
from mrcstack.errors import LocalError
from mrcstack.wire import IcrcPath

log = logging.getLogger("mrcd")


class Node:
    """One mrcd: call :meth:`start` inside the running loop, :meth:`stop` to finish."""

    def __init__(self, cfg: MrcdConfig, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """``loop``: the loop the node will run on; by default the running one (so a Node
        is made inside a coroutine, or given its loop explicitly)."""
        self.cfg = cfg
        self.fabric = cfg.fabric
        self.host = cfg.host
        self.loop = loop if loop is not None else asyncio.get_running_loop()
        self.rng = random.SystemRandom()
        self.counters = NodeCounters(cfg.fabric.planes)
        self.sockets: list[socket.socket] = []
        self.transport: Transport | None = None
        self.control_server: ControlServer | None = None
        self.control_client: ControlClient | None = None
        #: Set by :meth:`quiesce`: no new work (posts, QPs, connections) is taken.
        self.stopping = False
        self.started_at = time.time()
        self.control_stats = ControlStats()  # the control server's, once it runs
        #: Random at each start: peers tell a restarted mrcd from a reconnecting one.
        self.instance = secrets.token_hex(8)
        # The parts, each with what it needs of the others.
        self.qps: dict[int, Qp] = {}
        self.addresses = Addresses(cfg)
        self.ports = Ports(cfg.fabric.planes, cfg.host_name, self.qps, clock, self._kick)
        # Our ports' flags (the controller API and the metrics read them).
        self.port_admin, self.port_link = self.ports.admin, self.ports.link
        self.profiles = ProfileStore(cfg.fabric)
        self.listeners = Listeners(self.loop)
        self.peers = PeerWatch(self, cfg.fabric.planes, self.loop)
        self.ports.on_change = self.peers.ports_changed
        self.events = EventFanout(
            self.qps, self.peers.path_timed_out, self.counters.write_completion
        )
        self.ev_listeners = self.events.ev_listeners
        self.table = QpTable(
            self, self.qps, self.rng, self.listeners, self.events.on_event, self.counters.retired
        )
        self.contexts = self.table.contexts
        self.setup = ConnectionSetup(
            self,
            self.table,
            self.listeners,
            self.profiles,
            self.addresses,
            self.ports,
            self.events,
            self.counters,
        )
        self.probing = Probing(
            self, cfg, self.loop, self.addresses, self.ports, self._send_raw, self.on_port_status
        )
        self.prober = self.probing.prober

    # Lifecycle ---------------------------------------------------------------------------
    async def start(self, *, start_control: bool = True) -> None:
        """Open the plane sockets, the transport and the control channel.

        A failed start (a port in use, an unreadable key file) closes whatever it opened
        before raising, so the same node, or a new one, can start again on the same ports.
        """
        try:
            self._open_data_path()
            cfg = self.cfg
            self.control_client = ControlClient(
                cfg.host_name, cfg.auth, dict(cfg.peers), on_lost=self.peers.session_lost
            )
            creds = self.control_client.creds
            keys = {
                peer: key
                for peer in range(self.fabric.hosts)
                if peer != self.host
                and (key := creds.probe_key(self.fabric.host_name(peer))) is not None
            }
            self.prober.set_keys(self.host, keys)
            if start_control:
                server = ControlServer(cfg.host_name, cfg.auth, self, cfg.control_address)
                try:
                    await server.start()
                except OSError as exc:
                    raise LocalError(
                        f"cannot listen on control address {cfg.control_address}: {exc.strerror}"
                    ) from None
                self.control_server = server
                self.control_stats = server.stats
        except BaseException:
            await self._close()
            raise
        log.info("event=started host=%s planes=%d", self.cfg.host_name, self.fabric.planes)

    def _open_data_path(self) -> None:
        try:
            for plane in range(self.fabric.planes):
                self.sockets.append(
                    open_plane_socket(
                        self.data_address(self.host, plane),
                        device=self.cfg.interfaces[plane] if self.cfg.bind_devices else None,
                    )
                )
        except OSError as exc:
            raise LocalError(f"cannot open plane sockets: {exc}") from None
        self.transport = Transport(
            self.loop, self.sockets, self.addresses.route, self.prober.on_datagram, self._open_raw
        )

    def _open_raw(self, plane: int) -> socket.socket:
        device = self.cfg.interfaces[plane] if self.cfg.bind_devices else None
        return open_raw_socket(device)

    def quiesce(self) -> None:
        """Take no new work: posts, new QPs and connection requests (ours and the peers')
        are refused; what is already posted carries on."""
        if not self.stopping:
            self.stopping = True
            log.info("event=quiescing host=%s writes_in_flight=%d", self.cfg.host_name,
                     self.writes_in_flight())  # fmt: skip

    async def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s until no QP has a write pending; True if none has."""
        deadline = self.loop.time() + timeout
        while any(qp.conn is not None and not qp.conn.idle for qp in self.qps.values()):
            if self.loop.time() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    def fail_all(self, reason: str) -> int:
        """Fail every live connection from this side (:meth:`QpTable.fail_all`); returns
        how many writes were flushed."""
        return self.table.fail_all(reason)

    async def stop(self, drain_timeout: float = 2.0) -> None:
        """Stop gracefully: :meth:`quiesce`, let pending writes finish for up to
        ``drain_timeout`` s (:meth:`drain`), fail the rest (:meth:`fail_all`), then destroy
        every QP and close the control channel and the sockets."""
        self.quiesce()
        if not await self.drain(drain_timeout):
            log.warning("event=drain_timeout host=%s writes_in_flight=%d seconds=%g",
                        self.cfg.host_name, self.writes_in_flight(), drain_timeout)  # fmt: skip
        self.fail_all("mrcd stopping")
        await self._close()
        log.info("event=stopped host=%s", self.cfg.host_name)

    async def _close(self) -> None:
        """Release everything; tolerates a half-finished start and being called twice."""
        for qpn in list(self.qps):
            self.destroy_qp(qpn, reason="mrcd stopping")
        self.listeners.close()
        await self.peers.close()
        if self.control_server is not None:
            await self.control_server.stop()
            self.control_server = None
        if self.control_client is not None:
            await self.control_client.close()
            self.control_client = None
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()

    # The data path, as the parts use it ---------------------------------------------------
    def running_transport(self) -> Transport:
        """The transport; LocalError once the node has stopped (or before it started)."""
        if self.transport is None:
            raise LocalError("mrcd is not running")
        return self.transport

    def check_running(self) -> None:
        """LocalError once :meth:`quiesce` was called: no new work is taken."""
        if self.stopping:
            raise LocalError("mrcd is stopping: no new work is taken")

    def _kick(self, qpn: int) -> None:
        self.running_transport().kick(qpn)

    def _send_raw(self, plane: int, data: bytes, dst: Address) -> bool:
        return self.running_transport().send_raw(plane, data, dst)

    # Addresses (addresses.py) ---------------------------------------------------------------
    def data_address(self, host: int, plane: int) -> Address:
        return self.addresses.data_address(host, plane)

    def icrc_paths(self, remote: int) -> tuple[IcrcPath, ...]:
        return self.addresses.icrc_paths(remote)

    def host_of(self, source: Address, plane: int) -> int | None:
        return self.addresses.host_of(source, plane)

    # Contexts and QPs (qptable.py) ----------------------------------------------------------
    def open_context(self) -> Context:
        return self.table.open_context()

    def close_context(self, ctx: Context) -> None:
        self.table.close_context(ctx)

    def register(self, ctx: Context, buffer: memoryview, access: Access) -> MemoryRegion:
        return self.table.register(ctx, buffer, access)

    def create_qp(
        self, ctx: Context, attrs: QpAttrs, on_event: Callable[[int, Event], None]
    ) -> int:
        return self.table.create_qp(ctx, attrs, on_event)

    def qp(self, qpn: int) -> Qp:
        return self.table.qp(qpn)

    def post_write(
        self,
        qpn: int,
        wr_id: int,
        local: memoryview,
        remote_va: int,
        rkey: int,
        imm: int | None,
    ) -> None:
        self.table.post_write(qpn, wr_id, local, remote_va, rkey, imm)

    def destroy_qp(self, qpn: int, reason: str = "destroyed") -> None:
        self.table.destroy_qp(qpn, reason)

    def fail_peer(self, host: int, reason: str, qpns: list[int] | None = None) -> int:
        return self.table.fail_peer(host, reason, qpns)

    # Connection setup (connect.py, listeners.py) --------------------------------------------
    def ready(
        self, qpn: int, remote_host: int, remote_qpn: int, remote_psn: int, key: bytes | None
    ) -> None:
        self.setup.ready(qpn, remote_host, remote_qpn, remote_psn, key)

    async def connect_qp(
        self,
        qpn: int,
        remote_host: int,
        service: int,
        private_data: bytes = b"",
        timeout: float = 10.0,
    ) -> bytes:
        return await self.setup.connect_qp(qpn, remote_host, service, private_data, timeout)

    def listen(self, ctx: Context, service: int, on_request: Listener) -> None:
        self.listeners.listen(ctx, service, on_request)

    def accept(self, request_id: int, qpn: int, private_data: bytes) -> Accepted:
        return self.setup.accept(request_id, qpn, private_data)

    def reject(self, request_id: int) -> None:
        """The listening application refused: the peer's CONNECT is answered at once."""
        self.listeners.reject(request_id)

    # The control server's hooks (ControlHooks) ---------------------------------------------
    async def on_connect(self, req: ConnectRequest) -> Accept | Reject:
        """A peer's CONNECT, for the application listening on its service."""
        return await self.setup.on_connect(req)

    def on_port_status(self, host: int, bitmap: int) -> None:
        """A peer's PORT_STATUS_UPDATE, applied to our QPs to that host as the port bitmap
        in its SACKs would be (:meth:`Ports.peer_status`)."""
        self.ports.peer_status(host, bitmap)
        self.peers.peer_ports(host, bitmap)

    def on_session_lost(self, peer_host: str, reason: str) -> None:
        """A peer's session to our control server ended."""
        self.peers.session_lost(peer_host, reason)

    # EV probes and port status (probing.py) -------------------------------------------------
    async def probe(self, remote_host: int, plane: int, ev: int, timeout: float = 1.0) -> float:
        return await self.probing.probe(remote_host, plane, ev, timeout)

    def send_port_status(self, host: int, bitmap: int) -> int:
        return self.probing.send_port_status(host, bitmap)

    # Ports (ports.py) -------------------------------------------------------------------
    def port_up(self, plane: int) -> bool:
        return self.ports.up(plane)

    def set_port_admin(self, plane: int, enabled: bool) -> None:
        self.ports.set_admin(plane, enabled)

    def set_port_link(self, plane: int, up: bool) -> None:
        self.ports.set_link(plane, up)

    # What the controller API and the metrics read (qptable.py, snapshot.py) ----------------
    def ev_states(self, qpn: int | None = None) -> list[dict[str, object]]:
        return self.table.ev_states(qpn)

    def qp_info(self, qpn: int | None = None) -> list[dict[str, object]]:
        return self.table.qp_info(qpn)

    def writes_in_flight(self) -> int:
        return self.table.writes_in_flight()

    def connections(self) -> list[Connection]:
        return self.table.connections()

    def retry_budget(self) -> float:
        return self.table.retry_budget()

    def snapshot(self) -> NodeSnapshot:
        """Everything the metrics exporter shows, read at scrape time (:func:`.scrape`)."""
        return scrape(self)
