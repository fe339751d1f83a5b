"""The node: everything one mrcd runs, behind the calls its API servers make.

It owns the plane sockets and the transport, the QP table (records in ``qps.py``), the
per-application contexts (protection domains with their memory tables), its lifecycle
(start, quiesce, drain, stop), and the event fan-out to controllers, logs and metrics.
Around it: ``ports.py`` (our ports' link and admin state, peers' port bitmaps),
``listeners.py`` (peers' connection requests for listening applications), ``probes.py``
(connectionless EV probes on QPN 0).  QP attributes travel over the control channel
(``control.py``); this module only decides what to do with them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from ipaddress import IPv6Address
from types import MappingProxyType

from mrcstack import __version__, addrplan
from mrcstack.api.limits import QPN_LIMIT
from mrcstack.core.config import ConnectionConfig
from mrcstack.core.connection import Connection
from mrcstack.core.events import (
    ConnectionFailed,
    Event,
    EvState,
    EvStateChanged,
    PortStateChanged,
    SendCompleted,
    WcStatus,
)
from mrcstack.core.memory import Access, MemoryRegion
from mrcstack.daemons.mrcd.config import MrcdConfig
from mrcstack.daemons.mrcd.control.client import (
    Accept,
    ConnectRejectedError,
    ConnectRequest,
    ControlClient,
    Reject,
)
from mrcstack.daemons.mrcd.control.records import ControlError
from mrcstack.daemons.mrcd.control.server import ControlServer, ControlStats
from mrcstack.daemons.mrcd.datapath.probes import Prober
from mrcstack.daemons.mrcd.datapath.routes import raw_route
from mrcstack.daemons.mrcd.datapath.transport import (
    Address,
    RawRoute,
    Transport,
    clock,
    open_plane_socket,
    open_raw_socket,
)
from mrcstack.daemons.mrcd.node.listeners import Listener, Listeners
from mrcstack.daemons.mrcd.node.peers import PeerWatch
from mrcstack.daemons.mrcd.node.ports import Ports
from mrcstack.daemons.mrcd.node.profiles import ProfileStore
from mrcstack.daemons.mrcd.node.qps import Accepted, Context, IncomingConnect, Qp, QpAttrs, QpState
from mrcstack.daemons.mrcd.node.snapshot import Buckets, NodeSnapshot, Totals, count_evs
from mrcstack.errors import LocalError
from mrcstack.fabric import Fabric
from mrcstack.wire import EvFormat, IcrcPath

# The QP records live in qps.py; callers may keep importing them from here.
__all__ = [
    "Accepted",
    "Context",
    "IncomingConnect",
    "Node",
    "NodeCounters",
    "Qp",
    "QpAttrs",
    "QpState",
]
log = logging.getLogger("mrcd")

#: Loopback data mode: each host's plane sockets use data_port + host * PORT_STRIDE + plane.
PORT_STRIDE = 16
#: RTO of a QP until its first RTT sample (the QP attribute ``timeout`` if larger): the
#: first window of a software endpoint queues behind its own sending and the peer's
#: first touches of the region, which takes several times its steady RTT.
INITIAL_RTO = 0.05


@dataclass(slots=True)
class NodeCounters:
    """Node-level counters (the core and the transport keep their own)."""

    auth_failures: int = 0
    connections_total: int = 0
    operator_events: dict[str, int] = field(default_factory=dict)


EvListener = Callable[[int, EvStateChanged], None]


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
        self.contexts: dict[int, Context] = {}
        self.qps: dict[int, Qp] = {}
        self.ports = Ports(cfg.fabric.planes, cfg.host_name, self.qps, clock, self._kick)
        # Our ports' flags (the controller API and the metrics read them).
        self.port_admin, self.port_link = self.ports.admin, self.ports.link
        self.counters = NodeCounters()
        self.sockets: list[socket.socket] = []
        self.transport: Transport | None = None
        self.control_server: ControlServer | None = None
        self.control_client: ControlClient | None = None
        self.ev_listeners: list[EvListener] = []
        self.profiles = ProfileStore(cfg.fabric)
        self.listeners = Listeners(self.loop)
        self._next_ctx = 1
        self.prober = Prober(
            self.loop,
            self._resolve,
            self.host_of,
            self._send_raw,
            self.ports.bits,
            on_port_status=self.on_port_status,
        )
        # Dead connections' counters stay in the totals (Prometheus counters never go down).
        self.retired = Totals(cfg.fabric.planes)
        self.rtt = Buckets()
        self.write_completion = Buckets()
        #: Set by :meth:`quiesce`: no new work (posts, QPs, connections) is taken.
        self.stopping = False
        self.started_at = time.time()
        self.control_stats = ControlStats()  # the control server's, once it runs
        #: Random at each start: peers tell a restarted mrcd from a reconnecting one.
        self.instance = secrets.token_hex(8)
        self.peers = PeerWatch(self, cfg.fabric.planes, self.loop)
        self.ports.on_change = self.peers.ports_changed

    # Lifecycle --------------------------------------------------------------------------
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
            self.loop, self.sockets, self._route, self.prober.on_datagram, self._open_raw
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
        """Fail every live connection from this side: each pending write completes with
        FLUSHED and each owner hears ConnectionFailed (the QPs stay, in the error state,
        until their owners destroy them).  Returns how many writes were flushed."""
        flushed = self.writes_in_flight()
        for qpn, qp in list(self.qps.items()):
            self._abort(qpn, qp, reason)
        return flushed

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

    # Addresses --------------------------------------------------------------------------
    def data_address(self, host: int, plane: int) -> Address:
        if self.cfg.data_mode == "loopback":
            return ("::1", self.cfg.data_port + host * PORT_STRIDE + plane)
        return (str(addrplan.nic_sid(self.fabric, plane, host)), self.cfg.data_port)

    def icrc_paths(self, remote: int) -> tuple[IcrcPath, ...]:
        """Each plane's endpoints as packets arrive (uSID leaves the destination equal to the
        peer's plane address once the path is consumed): the ICRC's pseudo header."""
        paths = []
        for plane in range(self.fabric.planes):
            local, local_port = self.data_address(self.host, plane)
            peer, peer_port = self.data_address(remote, plane)
            paths.append(IcrcPath(local, peer, local_port, peer_port))
        return tuple(paths)

    def _route(self, remote: int, plane: int, ev: int, fmt: EvFormat) -> Address | RawRoute:
        """Where the transport sends a QP's datagram: SRv6 uSID addresses, or the headers of
        the formats mrcd writes itself (built once per path and cached by the transport)."""
        if fmt is EvFormat.SRV6:
            return self._resolve(remote, plane, ev)
        return raw_route(self.fabric, self.host, remote, plane, ev, fmt, self.cfg.data_port)

    def check_ev_format(self, fmt: EvFormat) -> None:
        """LocalError unless this daemon can send in ``fmt``."""
        if fmt is EvFormat.SRV6:
            return
        if self.cfg.data_mode == "loopback":
            raise LocalError(f"EV format {fmt.value} needs a fabric (data_mode srv6), not loopback")
        if fmt is EvFormat.SRV6_SRH and self.fabric.sid_format != "classic":
            raise LocalError(
                "EV format srv6-srh needs switches with classic SIDs (fabric sid_format classic)"
            )

    def _resolve(self, remote: int, plane: int, ev: int) -> Address:
        if self.cfg.data_mode == "loopback":
            return self.data_address(remote, plane)
        dst = addrplan.address(self.fabric, self.host, remote, plane, ev)
        return (str(dst), self.cfg.data_port)

    # Contexts and memory ----------------------------------------------------------------
    def open_context(self) -> Context:
        ctx = Context(self._next_ctx)
        self._next_ctx += 1
        self.contexts[ctx.ident] = ctx
        return ctx

    def close_context(self, ctx: Context) -> None:
        for qpn in list(ctx.qpns):
            self.destroy_qp(qpn, reason="context closed")
        self.listeners.forget(ctx)
        for region in ctx.memory.regions():
            ctx.memory.deregister(region.rkey)
        self.contexts.pop(ctx.ident, None)

    def register(self, ctx: Context, buffer: memoryview, access: Access) -> MemoryRegion:
        return ctx.memory.register(buffer, access)

    # QPs --------------------------------------------------------------------------------
    def create_qp(
        self, ctx: Context, attrs: QpAttrs, on_event: Callable[[int, Event], None]
    ) -> int:
        if ctx.ident not in self.contexts:
            raise LocalError("context is closed")
        self._check_running()
        while True:
            qpn = self.rng.randrange(1, QPN_LIMIT)
            if qpn not in self.qps:
                break
        self.qps[qpn] = Qp(qpn, ctx, attrs, on_event, psn=self.rng.randrange(QPN_LIMIT))
        ctx.qpns.add(qpn)
        return qpn

    def qp(self, qpn: int) -> Qp:
        qp = self.qps.get(qpn)
        if qp is None:
            raise LocalError(f"no QP {qpn}")
        return qp

    def ready(
        self, qpn: int, remote_host: int, remote_qpn: int, remote_psn: int, key: bytes | None
    ) -> None:
        """Both ends agreed: build the connection and put it on the wire (RESET -> RTS)."""
        qp = self.qp(qpn)
        if qp.state is not QpState.RESET:
            raise LocalError(f"QP {qpn} is {qp.state.value}, not reset")
        if not 0 <= remote_host < self.fabric.hosts or remote_host == self.host:
            raise LocalError(f"bad remote host {remote_host}")
        self._check_running()
        transport = self._transport()
        attrs = qp.attrs
        fields = self.profiles.config_fields(attrs, self.host, remote_host)
        self.check_ev_format(fields["ev_format"])
        config = ConnectionConfig(
            local_qpn=qpn,
            remote_qpn=remote_qpn,
            planes=self.fabric.planes,
            # The QP's EV and CC profiles: EV set, ev_count, ev_min_active, DENY, CC.
            **fields,
            mtu_payload=attrs.mtu_payload,
            key=key,
            encrypt=self.cfg.encrypt and key is not None,
            local_psn=qp.psn,
            remote_psn=remote_psn,
            timeout=attrs.timeout,
            initial_rto=max(attrs.timeout, INITIAL_RTO),
            linear_cnt=attrs.linear_cnt,
            exp_cnt=attrs.exp_cnt,
            ack_coalesce=attrs.ack_coalesce or self.cfg.ack_coalesce,
            icrc_paths=self.icrc_paths(remote_host),
        )
        if config.ev_format is not EvFormat.SRV6:
            paths = [(e.port, e.value) for e in config.evs]
            try:
                transport.prepare(remote_host, paths, config.ev_format)
            except OSError as exc:
                raise LocalError(
                    f"EV format {config.ev_format.value} needs raw sockets (CAP_NET_RAW): {exc}"
                ) from None
        now = clock()
        conn = Connection(
            config, memory=qp.ctx.memory, rng=random.Random(self.rng.random()), now=now
        )
        conn.on_rtt = self.rtt.observe
        self.ports.new_connection(conn)
        qp.conn = conn
        qp.remote_host = remote_host
        qp.remote_qpn = remote_qpn
        qp.state = QpState.RTS
        self.counters.connections_total += 1
        transport.add(qpn, conn, remote_host, functools.partial(self._on_event, qpn))
        log.info(
            "event=qp_ready qpn=%d remote=%s remote_qpn=%d keyed=%s",
            qpn,
            Fabric.host_name(remote_host),
            remote_qpn,
            key is not None,
        )

    def post_write(
        self,
        qpn: int,
        wr_id: int,
        local: memoryview,
        remote_va: int,
        rkey: int,
        imm: int | None,
    ) -> None:
        qp = self.qp(qpn)
        if qp.conn is None or qp.state is not QpState.RTS:
            raise LocalError(f"QP {qpn} is not connected ({qp.state.value})")
        self._check_running()
        now = clock()
        qp.conn.post_write(wr_id, local, remote_va, rkey, imm=imm, now=now)
        qp.posted[wr_id] = now
        self._transport().kick(qpn)

    def destroy_qp(self, qpn: int, reason: str = "destroyed") -> None:
        """Pending writes complete FLUSHED (the owner hears each once), then the QP goes."""
        qp = self.qps.get(qpn)
        if qp is None:
            return
        self._abort(qpn, qp, reason)
        del self.qps[qpn]
        qp.ctx.qpns.discard(qpn)
        if qp.conn is not None:
            if self.transport is not None:
                self.transport.remove(qpn)
            self.retired.add(qp.conn.stats)

    def _abort(self, qpn: int, qp: Qp, reason: str) -> None:
        """Fail a connection from this side, delivering what it has to say at once
        (completions, ConnectionFailed) through the same path as the transport does."""
        conn = qp.conn
        if conn is None:
            qp.state, qp.failure = QpState.ERROR, reason
            return
        if conn.failed is None:
            qp.state, qp.failure = QpState.ERROR, reason  # ours: not logged as a failure
            conn.abort(reason)
        while (event := conn.next_event()) is not None:
            self._on_event(qpn, event)

    # Connection setup over the control channel (hooks called by control.py) -----------
    def listen(self, ctx: Context, service: int, on_request: Listener) -> None:
        self.listeners.listen(ctx, service, on_request)

    async def connect_qp(
        self,
        qpn: int,
        remote_host: int,
        service: int,
        private_data: bytes = b"",
        timeout: float = 10.0,
    ) -> bytes:
        """Connect our QP to whatever the remote host's application accepts on ``service``.

        The control channel carries QPN, first PSN and private data both ways and gives both
        ends the same per-QP packet key; the QP is on the wire when this returns.
        """
        qp = self.qp(qpn)
        if not 0 <= remote_host < self.fabric.hosts or remote_host == self.host:
            raise LocalError(f"bad remote host {remote_host}")
        self._check_running()
        if self.control_client is None:
            raise LocalError("mrcd is not running")
        peer = Fabric.host_name(remote_host)
        try:
            session = await self.control_client.open_session(peer)
            accept = await session.connect(
                src_host=self.host,
                src_qpn=qpn,
                src_psn=qp.psn,
                service=service,
                planes=self.fabric.planes,
                mtu_payload=qp.attrs.mtu_payload,
                private_data=private_data,
                instance=self.instance,
                timeout=timeout,
                packet_auth=self.cfg.packet_auth,
            )
        except ConnectRejectedError as exc:
            raise LocalError(f"{peer} rejected the connection: {exc}") from None
        except (ControlError, OSError, TimeoutError) as exc:
            raise LocalError(f"cannot reach mrcd on {peer}: {exc}") from None
        key = None
        if accept.packet_auth and self.cfg.packet_auth:
            key = session.derive_qp_key(self.host, qpn, remote_host, accept.dst_qpn)
        self.ready(qpn, remote_host, accept.dst_qpn, accept.dst_psn, key)
        qp.peer_instance = accept.instance
        return accept.private_data

    async def on_connect(self, req: ConnectRequest) -> Accept | Reject:
        """ControlHooks: a peer's CONNECT, for the application listening on its service."""
        if self.stopping:
            return Reject("mrcd is stopping")
        if req.planes != self.fabric.planes:
            return Reject(f"plane count differs: {req.planes} != {self.fabric.planes}")
        incoming = IncomingConnect(
            remote_host=req.src_host,
            remote_qpn=req.src_qpn,
            remote_psn=req.src_psn,
            service=req.service,
            private_data=req.private_data,
            request_id=self.listeners.new_request_id(),
        )
        accepted = await self.listeners.offer(incoming)
        if accepted is None:
            return Reject(f"nothing accepted service {req.service}")
        # AES-GCM packets only if both ends want them; else OCP's plain ICRC.
        auth = req.packet_auth and self.cfg.packet_auth
        try:
            key = req.derive_qp_key(self.host, accepted.qpn) if auth else None
            self.ready(accepted.qpn, req.src_host, req.src_qpn, req.src_psn, key)
        except LocalError as exc:
            accepted.connected.set_result(str(exc))
            return Reject(str(exc))
        self.qps[accepted.qpn].peer_instance = req.instance
        accepted.connected.set_result(None)
        return Accept(
            accepted.qpn, accepted.psn, accepted.private_data, self.instance, packet_auth=auth
        )

    def send_port_status(self, host: int, bitmap: int) -> int:
        """PORT_STATUS_UPDATE to ``host`` over the fabric, on every plane up (0 if none is,
        or the data path is not open): how many datagrams went out."""
        planes = [p for p in range(self.fabric.planes) if self.ports.up(p)]
        if not planes or self.transport is None:
            return 0
        return self.prober.send_port_status(host, bitmap, planes, self.fabric.t1_per_plane)

    def on_port_status(self, host: int, bitmap: int) -> None:
        """ControlHooks: a peer's PORT_STATUS_UPDATE, applied to our QPs to that host as
        the port bitmap in its SACKs would be (:meth:`Ports.peer_status`)."""
        self.ports.peer_status(host, bitmap)
        self.peers.peer_ports(host, bitmap)

    def on_session_lost(self, peer_host: str, reason: str) -> None:
        """ControlHooks: a peer's session to our control server ended."""
        self.peers.session_lost(peer_host, reason)

    def fail_peer(self, host: int, reason: str, qpns: list[int] | None = None) -> int:
        """The peer ``host`` is gone: fail our live QPs to it (or those of ``qpns``) now,
        as an exhausted retry budget would; returns how many failed."""
        failed = 0
        for qpn, qp in list(self.qps.items()):
            conn = qp.conn
            if (
                conn is None
                or qp.remote_host != host
                or conn.failed is not None
                or (qpns is not None and qpn not in qpns)
            ):
                continue
            conn.peer_gone(reason)
            failed += 1
            while (event := conn.next_event()) is not None:
                self._on_event(qpn, event)
        return failed

    def new_request_id(self) -> int:
        return self.listeners.new_request_id()

    def reject(self, request_id: int) -> None:
        """The listening application refused: the peer's CONNECT is answered at once."""
        self.listeners.reject(request_id)

    def accept(self, request_id: int, qpn: int, private_data: bytes) -> Accepted:
        accepted = Accepted(qpn, self.qp(qpn).psn, private_data, self.loop.create_future())
        self.listeners.accept(request_id, accepted)
        return accepted

    # Connectionless EV probes (the controller API's EV_PROBE) ----------------------------
    async def probe(self, remote_host: int, plane: int, ev: int, timeout: float = 1.0) -> float:
        """Send an EV probe along one path to ``remote_host``'s mrcd; return the RTT.

        Raises TimeoutError if nothing comes back (the path, or the peer, is down); see
        :mod:`mrcstack.daemons.mrcd.datapath.probes`.
        """
        self._check_plane(plane)
        if not 0 <= remote_host < self.fabric.hosts or remote_host == self.host:
            raise LocalError(f"bad remote host {remote_host}")
        try:
            addrplan.address(self.fabric, self.host, remote_host, plane, ev)  # a real path?
            dst = self._resolve(remote_host, plane, ev)
        except ValueError as exc:
            raise LocalError(str(exc)) from None
        self._transport()
        return await self.prober.probe(plane, ev, dst, timeout, host=remote_host)

    def _send_raw(self, plane: int, data: bytes, dst: Address) -> bool:
        return self._transport().send_raw(plane, data, dst)

    def host_of(self, source: Address, plane: int) -> int | None:
        """Which host sent this: its NIC SID names it (loopback mode: its port does)."""
        if self.cfg.data_mode == "loopback":
            host, rest = divmod(source[1] - self.cfg.data_port, PORT_STRIDE)
            return host if rest == plane and 0 <= host < self.fabric.hosts else None
        try:
            owner_plane, name = addrplan.usid_owner(addrplan.active_usid(IPv6Address(source[0])))
        except ValueError:
            return None
        if owner_plane != plane or not name.startswith("h"):
            return None
        return int(name[1:])

    # Ports (ports.py) -------------------------------------------------------------------
    def port_up(self, plane: int) -> bool:
        return self.ports.up(plane)

    def set_port_admin(self, plane: int, enabled: bool) -> None:
        self.ports.set_admin(plane, enabled)

    def set_port_link(self, plane: int, up: bool) -> None:
        self.ports.set_link(plane, up)

    def _check_plane(self, plane: int) -> None:
        self.ports.check(plane)

    # Events -----------------------------------------------------------------------------
    def _on_event(self, qpn: int, event: Event) -> None:
        qp = self.qps.get(qpn)
        if type(event) is EvStateChanged:
            if event.new is EvState.ASSUMED_BAD:
                if event.reason == "rto" and qp is not None:
                    self.peers.path_timed_out(qp.remote_host)
                log.warning(
                    "event=path_failed qpn=%d ev=%#x plane=%d drops=%d reason=%s",
                    qpn,
                    event.ev,
                    event.port,
                    event.drop_count,
                    event.reason,
                )
            for listener in self.ev_listeners:
                listener(qpn, event)
        elif type(event) is PortStateChanged and event.remote:
            log.warning(
                "event=peer_plane_%s qpn=%d plane=%d", "up" if event.up else "down", qpn, event.port
            )
        elif type(event) is SendCompleted:
            posted = None if qp is None else qp.posted.pop(event.wr_id, None)
            if posted is not None and event.status is WcStatus.SUCCESS:
                self.write_completion.observe(clock() - posted)
        elif type(event) is ConnectionFailed:
            if qp is None or qp.failure is None:  # else we failed it ourselves (_abort)
                log.error("event=connection_failed qpn=%d reason=%r", qpn, event.reason)
            if qp is not None:
                qp.state = QpState.ERROR
                qp.failure = qp.failure or event.reason
        if qp is not None:
            qp.on_event(qpn, event)

    def _transport(self) -> Transport:
        if self.transport is None:
            raise LocalError("mrcd is not running")
        return self.transport

    def _kick(self, qpn: int) -> None:
        self._transport().kick(qpn)

    def _check_running(self) -> None:
        if self.stopping:
            raise LocalError("mrcd is stopping: no new work is taken")

    # Introspection ----------------------------------------------------------------------
    def ev_states(self, qpn: int | None = None) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for q, qp in sorted(self.qps.items()):
            if (qpn is not None and q != qpn) or qp.conn is None:
                continue
            for ev in qp.conn.ev_states():
                out.append(
                    {
                        "qpn": q,
                        "ev": ev.value,
                        "plane": ev.port,
                        "state": ev.state.value,
                        "in_use": ev.in_use,
                        "drop_count": ev.drop_count,
                    }
                )
        return out

    def qp_info(self, qpn: int | None = None) -> list[dict[str, object]]:
        """Each QP (or one) with its peer, state and retry budget (``mrcctl qp show``)."""
        out: list[dict[str, object]] = []
        for q, qp in sorted(self.qps.items()):
            if qpn is not None and q != qpn:
                continue
            conn = qp.conn
            doc: dict[str, object] = {
                "qpn": q,
                "state": qp.state.value,
                "remote_host": Fabric.host_name(qp.remote_host) if qp.remote_host >= 0 else None,
                "remote_qpn": qp.remote_qpn if qp.remote_qpn >= 0 else None,
                "peer_instance": qp.peer_instance or None,
                "failure": qp.failure,
                "writes_in_flight": len(qp.posted),
                "timeout": qp.attrs.timeout,
                "linear_cnt": qp.attrs.linear_cnt,
                "exp_cnt": qp.attrs.exp_cnt,
            }
            if conn is not None:
                doc.update(
                    max_rto=conn.cfg.max_rto,
                    rto=conn.sender.rto(),
                    srtt=conn.sender.srtt,
                    retry_budget=conn.retry_budget(),
                )
            out.append(doc)
        return out

    def writes_in_flight(self) -> int:
        """Writes posted and not completed yet, over every QP."""
        return sum(len(qp.posted) for qp in self.qps.values())

    def connections(self) -> list[Connection]:
        return [qp.conn for qp in self.qps.values() if qp.conn is not None]

    def retry_budget(self) -> float:
        """The longest retry budget of a live QP (0.0 with none)."""
        live = [qp.conn for qp in self.qps.values() if qp.state is QpState.RTS and qp.conn]
        return max((conn.retry_budget() for conn in live), default=0.0)

    def snapshot(self) -> NodeSnapshot:
        """Everything the metrics exporter shows, read at scrape time."""
        planes = self.fabric.planes
        conns = self.connections()
        totals = self.retired.copy()
        for conn in conns:
            totals.add(conn.stats)
        if self.transport is not None:
            ts = self.transport.stats
            totals.add_reasons(
                "rejections", {"unknown_qpn": ts.unknown_qpn, "malformed": ts.malformed}
            )
            totals.add_send_errors(ts.send_errors)
        totals.add_reasons("rejections", self.prober.rejected)
        return NodeSnapshot(
            host=self.cfg.host_name,
            version=__version__,
            planes=planes,
            start_time=self.started_at,
            port_link_up=tuple(self.port_link),
            port_admin_up=tuple(self.port_admin),
            connections=sum(1 for qp in self.qps.values() if qp.state is QpState.RTS),
            evs=count_evs(
                planes,
                ((ev.port, ev.state.value) for c in conns for ev in c.ev_states()),
            ),
            traffic=totals.freeze(),
            rtt=self.rtt.snapshot(),
            write_completion=self.write_completion.snapshot(),
            control_auth_failures=sum(self.control_stats.auth_failures.values()),
            control_rejections=MappingProxyType(dict(self.control_stats.rejected)),
            peer_failures=MappingProxyType(dict(self.peers.failures)),
            retry_budget=self.retry_budget(),
        )
