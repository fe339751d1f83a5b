"""Connection setup: our CONNECT over the control channel, the answer to a peer's, a QP set
up out of band, and the step all end in, :meth:`ConnectionSetup.ready`, which builds the
sans-IO connection.

The control channel carries QPN, first PSN, private data and the mrcd instance both ways,
gives both ends the same per-QP packet key (:mod:`.control.client`) and agrees on mrcstack's
extension headers (:func:`negotiate`); a peer's CONNECT waits for the application listening
on its service (:mod:`.listeners`).  A peer without mrcd (a NIC that speaks only OCP MRC 1.0)
has no control channel: :meth:`ConnectionSetup.connect_manual` takes what ``ibv_modify_qp``
would (its QPN and first PSN, its host, a key) and runs the QP without the extension.
``ready`` takes the QP from RESET to RTS: its EV and CC profiles (:mod:`.profiles`),
addresses and ICRC paths (:mod:`.addresses`) and the daemon's settings make the
connection's config, and the transport starts carrying it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from dataclasses import dataclass
from typing import Protocol

from mrcstack.api.limits import CONNECT_TIMEOUT
from mrcstack.core.config import ConnectionConfig, max_ack_delay
from mrcstack.core.connection import Connection
from mrcstack.daemons.mrcd.config import MrcdConfig
from mrcstack.daemons.mrcd.control.client import (
    Accept,
    ConnectRejectedError,
    ConnectRequest,
    ControlClient,
    Reject,
)
from mrcstack.daemons.mrcd.control.records import ControlError
from mrcstack.daemons.mrcd.datapath.transport import Transport, clock
from mrcstack.daemons.mrcd.node.addresses import Addresses
from mrcstack.daemons.mrcd.node.events import EventFanout
from mrcstack.daemons.mrcd.node.listeners import Listeners
from mrcstack.daemons.mrcd.node.ports import Ports
from mrcstack.daemons.mrcd.node.profiles import ProfileStore
from mrcstack.daemons.mrcd.node.qps import Accepted, IncomingConnect, QpConnection, QpState
from mrcstack.daemons.mrcd.node.qptable import QpTable, Running
from mrcstack.daemons.mrcd.node.snapshot import NodeCounters
from mrcstack.daemons.mrcd.node.workers.pool import WorkerPool
from mrcstack.errors import LocalError
from mrcstack.fabric import Fabric
from mrcstack.qpn import qpn_text
from mrcstack.wire import MRC_EXT_VERSION, EvFormat

log = logging.getLogger("mrcd")

#: RTO of a QP until its first RTT sample (the QP attribute ``timeout`` if larger): the
#: first window of a software endpoint queues behind its own sending and the peer's
#: first touches of the region, which takes several times its steady RTT.
INITIAL_RTO = 0.05
#: What a CONNECT request gets at least, however long opening the session took.
MIN_REQUEST_TIME = 1.0


def negotiate(ours: int, theirs: int, peer: str) -> bool | str:
    """Whether a QP with ``peer`` carries mrcstack's extension, from the versions each end
    offers (0: none; -1: the peer says nothing, an mrcd from before this was agreed); a
    one-line reason to refuse the QP instead.  Either end without it: none (negotiated
    down); both with it: only the same version."""
    if theirs < 0:
        return (
            f"mrcd on {peer} does not negotiate mrcstack's extension headers (it lays out OCP "
            "MRC 1.0's headers the way before the public transcription): upgrade it"
        )
    if ours == 0 or theirs == 0:
        return False
    if ours != theirs:
        return f"mrcd on {peer} speaks mrcstack extension version {theirs}, this one {ours}"
    return True


class SetupNode(Running, Protocol):
    """What connection setup reads of its node as it runs (:class:`.node.Node`)."""

    cfg: MrcdConfig  # its settings are read at each use
    stopping: bool
    instance: str
    control_client: ControlClient | None


@dataclass(eq=False, slots=True)
class ConnectionSetup:
    """Connects the QPs of ``table``; the other parts are the node's."""

    node: SetupNode
    table: QpTable
    listeners: Listeners
    profiles: ProfileStore
    addresses: Addresses
    ports: Ports
    events: EventFanout
    counters: NodeCounters

    @property
    def fabric(self) -> Fabric:
        return self.addresses.cfg.fabric

    @property
    def host(self) -> int:
        return self.addresses.cfg.host

    @property
    def offered(self) -> int:
        """The extension version this mrcd offers its peers (0: it has them off)."""
        return MRC_EXT_VERSION if self.node.cfg.extensions else 0

    @property
    def window_ack_req(self) -> bool:
        """Whether this mrcd's senders flag ACK_REQ on the packet after which their window
        is full and on every retransmission (every one of this version does), told to each
        peer at connection setup: a peer delays its ACKs only for a sender that flags it."""
        return True

    def ready(
        self,
        qpn: int,
        remote_host: int,
        remote_qpn: int,
        remote_psn: int,
        key: bytes | None,
        extensions: bool = True,
        window_ack_req: bool = False,
    ) -> None:
        """Both ends agreed: build the connection and put it on the wire (RESET -> RTS);
        ``extensions``: with mrcstack's extension headers (else OCP MRC 1.0's alone);
        ``window_ack_req``: the peer said its sender flags ACK_REQ on the packet after
        which its window is full, so our ACKs may wait ``ack_delay`` for more data (a peer
        that does not flag it would wait that long for every window's ACK)."""
        qp = self.table.qp(qpn)
        if qp.state is not QpState.RESET:
            raise LocalError(f"QP {qpn_text(qpn)} is {qp.state.value}, not reset")
        self.addresses.check_remote(remote_host)
        self.node.check_running()
        transport = self.node.running_transport()
        attrs = qp.attrs
        fields = self.profiles.config_fields(attrs, self.host, remote_host)
        self.addresses.check_ev_format(fields["ev_format"], striped=not extensions)
        if key is not None and not extensions:
            raise LocalError(
                f"QP {qpn_text(qpn)}: AES-GCM packet authentication needs mrcstack's "
                "extension headers, which this QP has off"
            )
        ack_delay = min(self.node.cfg.ack_delay, max_ack_delay(attrs.timeout))
        config = ConnectionConfig(
            local_qpn=qpn,
            remote_qpn=remote_qpn,
            planes=self.fabric.planes,
            # The QP's EV and CC profiles: EV set, ev_count, ev_min_active, DENY, CC.
            **fields,
            mtu_payload=attrs.mtu_payload,
            key=key,
            encrypt=self.node.cfg.encrypt and key is not None,
            local_psn=qp.psn,
            remote_psn=remote_psn,
            timeout=attrs.timeout,
            initial_rto=max(attrs.timeout, INITIAL_RTO),
            linear_cnt=attrs.linear_cnt,
            exp_cnt=attrs.exp_cnt,
            ack_coalesce=attrs.ack_coalesce or self.node.cfg.ack_coalesce,
            ack_delay=ack_delay if window_ack_req else 0.0,
            icrc_paths=self.addresses.icrc_paths(remote_host),
            extensions=extensions,
        )
        if config.ev_format is not EvFormat.SRV6 or not extensions:
            paths = [(e.port, e.value) for e in config.evs]
            try:
                transport.prepare(remote_host, paths, config.ev_format, not extensions)
            except OSError as exc:
                what = (
                    f"EV format {config.ev_format.value}" if extensions
                    else "a QP without mrcstack's extension (its EV in the UDP source port)"
                )  # fmt: skip
                raise LocalError(f"{what} needs raw sockets (CAP_NET_RAW): {exc}") from None
        now = clock()
        seed = self.table.rng.random()
        on_event = functools.partial(self.events.on_event, qpn)
        conn: QpConnection
        if isinstance(transport, WorkerPool):  # built in the worker that owns the QP
            conn = transport.connect(qpn, qp.ctx.ident, config, remote_host, seed, now, on_event)
        else:
            rng = random.Random(seed)
            conn = local = Connection(config, memory=qp.ctx.memory, rng=rng, now=now)
            local.on_rtt = self.counters.rtt.observe
        self.ports.new_connection(conn)
        qp.conn = conn
        qp.remote_host = remote_host
        qp.remote_qpn = remote_qpn
        qp.state = QpState.RTS
        self.counters.connections_total += 1
        if isinstance(transport, Transport):
            transport.add(qpn, local, remote_host, on_event)
        log.info(
            "event=qp_ready qpn=%s remote=%s remote_qpn=%s keyed=%s extensions=%s",
            qpn_text(qpn),
            Fabric.host_name(remote_host),
            qpn_text(remote_qpn),
            key is not None,
            extensions,
        )

    def connect_manual(
        self,
        qpn: int,
        remote_host: int,
        remote_qpn: int,
        remote_psn: int,
        key: bytes | None = None,
        extensions: bool = False,
    ) -> None:
        """Set our QP up out of band, as ``ibv_modify_qp`` to RTR and RTS does: the peer's
        host (its NIC addresses are the address plan's), QPN and first PSN, and optionally
        the AES-GCM key, exchanged by the application.  For a peer without mrcd the QP runs
        without mrcstack's extension (the default); two mrcds set up this way may turn it
        on, on both ends.  Its ACKs are never delayed: nothing says the peer flags a full
        window."""
        if not 0 <= remote_qpn < 1 << 24 or remote_qpn in (0, 2):
            raise LocalError(
                f"remote QPN {qpn_text(remote_qpn)} is not a QP's (24 bits, not 0 or 2)"
            )
        if not 0 <= remote_psn < 1 << 24:
            raise LocalError(f"remote PSN {remote_psn} is not 24 bits")
        self.ready(qpn, remote_host, remote_qpn, remote_psn, key, extensions)
        self.table.qp(qpn).peer_instance = ""

    async def connect_qp(
        self,
        qpn: int,
        remote_host: int,
        service: int,
        private_data: bytes = b"",
        timeout: float = CONNECT_TIMEOUT,
    ) -> bytes:
        """Connect our QP to whatever the remote host's application accepts on ``service``.

        The control channel carries QPN, first PSN and private data both ways and gives both
        ends the same per-QP packet key; the QP is on the wire when this returns.  Within
        ``timeout`` a busy peer is asked again (with backoff) before giving up.
        """
        qp = self.table.qp(qpn)
        self.addresses.check_remote(remote_host)
        self.node.check_running()
        client = self.node.control_client
        if client is None:
            raise LocalError("mrcd is not running")
        peer = Fabric.host_name(remote_host)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            session = await client.open_session(peer, timeout=timeout)
            accept = await session.connect(
                src_host=self.host,
                src_qpn=qpn,
                src_psn=qp.psn,
                service=service,
                planes=self.fabric.planes,
                mtu_payload=qp.attrs.mtu_payload,
                private_data=private_data,
                instance=self.node.instance,
                timeout=max(deadline - loop.time(), MIN_REQUEST_TIME),
                packet_auth=self.node.cfg.packet_auth,
                extensions=self.offered,
                window_ack_req=self.window_ack_req,
            )
        except ConnectRejectedError as exc:
            raise LocalError(f"{peer} rejected the connection: {exc}") from None
        except ControlError as exc:
            if exc.reason == "busy":
                raise LocalError(f"mrcd on {peer} is busy: {exc.detail}") from None
            raise LocalError(f"cannot reach mrcd on {peer}: {exc}") from None
        except (OSError, TimeoutError) as exc:
            raise LocalError(f"cannot reach mrcd on {peer}: {exc}") from None
        agreed = negotiate(self.offered, accept.extensions, peer)
        if isinstance(agreed, str) or (agreed and not self.offered):
            raise LocalError(str(agreed) if isinstance(agreed, str) else f"{peer} broke the "
                             "negotiation of mrcstack's extension")  # fmt: skip
        key = None
        if agreed and accept.packet_auth and self.node.cfg.packet_auth:
            key = session.derive_qp_key(self.host, qpn, remote_host, accept.dst_qpn)
        self.ready(
            qpn, remote_host, accept.dst_qpn, accept.dst_psn, key, agreed, accept.window_ack_req
        )
        qp.peer_instance = accept.instance
        return accept.private_data

    async def on_connect(self, req: ConnectRequest) -> Accept | Reject:
        """A peer's CONNECT, for the application listening on its service."""
        if self.node.stopping:
            return Reject("mrcd is stopping")
        if req.planes != self.fabric.planes:
            return Reject(f"plane count differs: {req.planes} != {self.fabric.planes}")
        agreed = negotiate(self.offered, req.extensions, Fabric.host_name(req.src_host))
        if isinstance(agreed, str):
            return Reject(agreed)
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
        # AES-GCM packets only if both ends want them (and the extension that carries its
        # nonce is on); else OCP's plain ICRC.
        auth = agreed and req.packet_auth and self.node.cfg.packet_auth
        try:
            key = req.derive_qp_key(self.host, accepted.qpn) if auth else None
            self.ready(
                accepted.qpn, req.src_host, req.src_qpn, req.src_psn, key, agreed,
                req.window_ack_req,
            )  # fmt: skip
        except LocalError as exc:
            accepted.connected.set_result(str(exc))
            return Reject(str(exc))
        self.table.qps[accepted.qpn].peer_instance = req.instance
        accepted.connected.set_result(None)
        return Accept(
            accepted.qpn,
            accepted.psn,
            accepted.private_data,
            self.node.instance,
            packet_auth=auth,
            extensions=self.offered if agreed else 0,
            window_ack_req=self.window_ack_req,
        )

    def accept(self, request_id: int, qpn: int, private_data: bytes) -> Accepted:
        """The listening application takes the peer's request ``request_id`` on QP ``qpn``."""
        accepted = Accepted(
            qpn, self.table.qp(qpn).psn, private_data, self.listeners.loop.create_future()
        )
        self.listeners.accept(request_id, accepted)
        return accepted
