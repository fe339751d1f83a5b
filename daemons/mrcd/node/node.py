"""The node: everything one mrcd runs, behind the calls its API servers make.

:class:`Node` composes the parts and owns the lifecycle (start, quiesce, drain, stop) and the
data path (the plane sockets and the transport); each part is a module of this package:
``qptable.py`` (contexts, QPs), ``connect.py`` (connection setup over the control channel),
``listeners.py`` (peers' connection requests), ``events.py`` (the event fan-out),
``ports.py``, ``peers.py`` (peer liveness), ``probing.py`` (EV probes, port status),
``addresses.py``, ``profiles.py``, ``denylist.py`` (the fabric mapper's link denylist) and
``snapshot.py`` (what a metrics scrape reads); with ``workers = N`` (N > 1) the data path runs
in N processes (the ``workers`` subpackage) and the node keeps the rest.
:meth:`Node._bind` gives each call of the node's one interface (what the API servers, the
control server's ``ControlHooks`` and the parts call) to the part that answers it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import socket
import time

from mrcstack.daemons.mrcd.config import MrcdConfig
from mrcstack.daemons.mrcd.control.client import ControlClient
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
from mrcstack.daemons.mrcd.node.denylist import LinkDenylist
from mrcstack.daemons.mrcd.node.events import EventFanout
from mrcstack.daemons.mrcd.node.listeners import Listeners
from mrcstack.daemons.mrcd.node.peers import PeerWatch
from mrcstack.daemons.mrcd.node.ports import Ports
from mrcstack.daemons.mrcd.node.probing import Probing
from mrcstack.daemons.mrcd.node.profiles import ProfileStore
from mrcstack.daemons.mrcd.node.qps import Qp
from mrcstack.daemons.mrcd.node.qptable import QpTable
from mrcstack.daemons.mrcd.node.snapshot import NodeCounters, NodeSnapshot, scrape
from mrcstack.daemons.mrcd.node.workers.pool import DataPath, WorkerPool
from mrcstack.errors import LocalError

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
        self.transport: DataPath | None = None
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
        self.denylist = LinkDenylist(
            cfg.fabric, cfg.host, self.qps, self.profiles.denied_for, self._kick
        )
        self.profiles.link_denied = self.denylist.evs_for
        self.listeners = Listeners(self.loop)
        self.peers = PeerWatch(self, cfg.fabric.planes, self.loop)
        self.ports.on_change = self.peers.ports_changed
        self.events = EventFanout(
            self.qps, self.peers.path_timed_out, self.counters.write_completion
        )
        self.ev_listeners = self.events.ev_listeners
        self.table = QpTable(
            self,
            self.qps,
            self.rng,
            self.listeners,
            self.events.on_event,
            self.counters.retired,
            cfg.workers,
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
            self,
            cfg,
            self.loop,
            self.addresses,
            self.ports,
            self._send_raw,
            self.on_port_status,
            plain=self.plain_peer,
        )
        self.prober = self.probing.prober
        self._bind()

    def _bind(self) -> None:
        """The calls of the API servers, the control server and the parts, each answered by
        the part that owns it."""
        addresses, table, setup = self.addresses, self.table, self.setup
        # Addresses (addresses.py).
        self.data_address = addresses.data_address
        self.icrc_paths = addresses.icrc_paths
        self.host_of = addresses.host_of
        # Contexts and QPs (qptable.py).
        self.open_context = table.open_context
        self.close_context = table.close_context
        self.register = table.register
        self.deregister = table.deregister
        self.create_qp = table.create_qp
        self.qp = table.qp
        self.post_write = table.post_write
        self.destroy_qp = table.destroy_qp
        self.fail_all = table.fail_all
        self.fail_peer = table.fail_peer
        # Connection setup (connect.py, listeners.py); on_connect is a ControlHooks call.
        self.ready = setup.ready
        self.connect_qp = setup.connect_qp
        self.connect_manual = setup.connect_manual
        self.on_connect = setup.on_connect
        self.listen = self.listeners.listen
        self.accept = setup.accept
        self.reject = self.listeners.reject
        # EV probes and port status (probing.py), our ports (ports.py).
        self.probe = self.probing.probe
        self.send_port_status = self.probing.send_port_status
        self.port_up = self.ports.up
        self.set_port_admin = self.ports.set_admin
        self.set_port_link = self.ports.set_link
        # What the controller API and the metrics read (qptable.py).
        self.ev_states = table.ev_states
        self.qp_info = table.qp_info
        self.writes_in_flight = table.writes_in_flight
        self.connections = table.connections
        self.retry_budget = table.retry_budget

    # Lifecycle ---------------------------------------------------------------------------
    async def start(self, *, start_control: bool = True) -> None:
        """Open the plane sockets, the transport and the control channel.

        A failed start (a port in use, an unreadable key file) closes whatever it opened
        before raising, so the same node, or a new one, can start again on the same ports.
        """
        try:
            await self._open_data_path()
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
            if isinstance(self.transport, WorkerPool):
                self.transport.set_keys(self.host, keys)
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

    async def _open_data_path(self) -> None:
        if self.cfg.workers > 1:
            await self._start_workers()
            return
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
        self.prober.probe_ids = self.transport.probe_ids  # the host's, shared with its QPs

    async def _start_workers(self) -> None:
        """The data path in ``workers`` processes: they own the QPs; the node keeps the
        rest and sends its probes itself."""
        addresses = [self.data_address(self.host, p) for p in range(self.fabric.planes)]
        try:
            pool = WorkerPool(
                self.loop,
                self.cfg,
                addresses,
                self.prober.on_datagram,
                self.counters.rtt.merge,
                self.counters.rtt.bounds,
                self._open_raw,
            )
        except OSError as exc:
            raise LocalError(f"cannot open plane sockets: {exc}") from None
        self.transport = pool
        self.prober.probe_ids = pool.probe_ids
        await pool.start()

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

    async def stop(self, drain_timeout: float = 2.0) -> None:
        """Stop gracefully: :meth:`quiesce`, let pending writes finish for up to
        ``drain_timeout`` s (:meth:`drain`), fail the rest (:meth:`QpTable.fail_all`), then destroy
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
    def running_transport(self) -> DataPath:
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

    def plain_peer(self, host: int) -> bool:
        """``host`` is a peer without mrcstack's extension: a QP to it has them off."""
        return any(
            qp.remote_host == host and qp.conn is not None and qp.conn.plain
            for qp in self.qps.values()
        )

    # The control server's hooks (ControlHooks; on_connect is connect.py's) -------------------
    def on_port_status(self, host: int, bitmap: int) -> None:
        """A peer's PORT_STATUS_UPDATE, applied to our QPs to that host as the port bitmap
        in its SACKs would be (:meth:`Ports.peer_status`)."""
        self.ports.peer_status(host, bitmap)
        self.peers.peer_ports(host, bitmap)

    def on_session_lost(self, peer_host: str, reason: str) -> None:
        """A peer's session to our control server ended."""
        self.peers.session_lost(peer_host, reason)

    def snapshot(self) -> NodeSnapshot:
        """Everything the metrics exporter shows, read at scrape time (:func:`.scrape`)."""
        return scrape(self)
