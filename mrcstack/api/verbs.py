"""The application API (mrc.h in Python): device, context, memory, CQs, channels, QPs.

Each :class:`Context` is one socket to the local mrcd and one protection domain there: its
regions, CQs and QPs exist until it is closed or the program exits (mrcd then tears them
down).  See ``docs/api.md`` for the mapping to every ``mrc_*`` call.
"""

from __future__ import annotations

import errno
import os
import socket
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mrcstack.api import shm, wire
from mrcstack.api.client import MrcdSocket
from mrcstack.api.completion import CompletionChannel, CompletionQueue
from mrcstack.api.errors import ApiError, invalid
from mrcstack.api.limits import check_private_data
from mrcstack.api.requests import MemoryRegion, SendWr, Sge, WriteWr
from mrcstack.api.types import (
    QP_ATTR_FIELDS,
    Access,
    AsyncEvent,
    AsyncEventType,
    ConnectRequest,
    DeviceAttr,
    QpAttr,
    QpCap,
    QpHint,
    QpInfo,
    WcOpcode,
    WcStatus,
    WorkCompletion,
)
from mrcstack.qpn import qpn_text

SOCKET_ENV = "MRCD_SOCKET"
RUN_DIR = Path("/run/mrcstack")
NETNS_DIR = Path("/run/netns")  # where iproute2 keeps named network namespaces
DEFAULT_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE
#: How much longer than its timeout a connect waits for mrcd, whose own error says more.
CONNECT_MARGIN = 2.0


def namespace_socket(netns: str) -> Path:
    """Where the mrcd of network namespace ``netns`` listens when started for a testbed
    (``mrcstack cluster up``): programs in that namespace find it with no flags."""
    return RUN_DIR / f"mrcd-{netns}.sock"


def current_netns() -> str | None:
    """The name of this process's network namespace (as ``ip netns identify`` says), if
    it is a named one."""
    try:
        own = os.stat("/proc/self/ns/net")
        names = os.listdir(NETNS_DIR)
    except OSError:
        return None
    for name in sorted(names):
        try:
            st = os.stat(NETNS_DIR / name)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino):
            return name
    return None


def default_socket_path() -> Path:
    """``$MRCD_SOCKET``; else, inside a named network namespace, that namespace's mrcd
    (:func:`namespace_socket`) when it runs; else the one ``/run/mrcstack/mrcd*.sock``."""
    env = os.environ.get(SOCKET_ENV)
    if env:
        return Path(env)
    netns = current_netns()
    if netns is not None and namespace_socket(netns).exists():
        return namespace_socket(netns)
    found = sorted(RUN_DIR.glob("mrcd*.sock"))
    if len(found) == 1:
        return found[0]
    if not found:
        raise ApiError(
            errno.ENOENT, f"no mrcd socket in {RUN_DIR}: pass its path or set {SOCKET_ENV}"
        )
    names = ", ".join(p.name for p in found)
    raise ApiError(errno.EINVAL, f"several mrcd sockets in {RUN_DIR} ({names}): pass one")


class Device:
    """The local mrcd, as ``ibv_open_device`` + ``mrc_query_device`` see a NIC."""

    def __init__(self, conn: MrcdSocket) -> None:
        self.conn = conn
        self.path = conn.path

    @classmethod
    def open(cls, socket_path: str | os.PathLike[str] | None = None) -> Device:
        return cls(MrcdSocket(socket_path if socket_path is not None else default_socket_path()))

    def query_device(self) -> DeviceAttr:
        return DeviceAttr.from_json(self.conn.call("query_device"))

    def create_context(self) -> Context:
        """A new context (``mrc_create_context``): its own socket and protection domain."""
        conn = MrcdSocket(self.path)
        try:
            conn.call("open_context")
        except ApiError:
            conn.close()
            raise
        return Context(self, conn)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _local(wr: WriteWr | SendWr, index: int, ctx: Context) -> Sge:
    local = wr.local if isinstance(wr.local, Sge) else Sge(*wr.local)
    mr = local.mr
    if not isinstance(mr, MemoryRegion) or mr.context is not ctx or not mr.registered:
        raise invalid(
            f"work request {index}: local memory region is not registered in this context"
        )
    return local


class QueuePair:
    """``mrc_qp``: a reliable connection to one QP of a remote host."""

    def __init__(
        self,
        ctx: Context,
        qpn: int,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
        user: object,
    ) -> None:
        self.context = ctx
        self.qpn = qpn
        self.send_cq = send_cq
        self.recv_cq = recv_cq
        self.qp_context = user

    def __repr__(self) -> str:
        return f"QueuePair(qpn={qpn_text(self.qpn)})"

    def get_qpn(self) -> int:
        return self.qpn

    def connect(
        self,
        remote_host: int,
        service: int,
        private_data: bytes = b"",
        timeout: float | None = None,
    ) -> bytes:
        """Connect to the QP a listener on ``remote_host`` accepts for ``service`` (the
        out-of-band exchange plus RESET -> RTS); returns the peer's private data.

        ``timeout``: how long mrcd may try (a busy peer is asked again until then; default
        mrcd's 10 s); this call waits a little longer, for mrcd's answer."""
        args = self._connect_args(remote_host, service, private_data)
        if timeout is not None:
            args["timeout"] = timeout
        result = self.context.conn.call(
            "connect", args, timeout=None if timeout is None else timeout + CONNECT_MARGIN
        )
        return bytes.fromhex(result["private_data"])

    async def connect_async(
        self, remote_host: int, service: int, private_data: bytes = b""
    ) -> bytes:
        args = self._connect_args(remote_host, service, private_data)
        result = await self.context.conn.call_async("connect", args)
        return bytes.fromhex(result["private_data"])

    def connect_manual(
        self,
        remote_host: int,
        remote_qpn: int,
        remote_psn: int,
        *,
        key: bytes | None = None,
        extensions: bool = False,
    ) -> int:
        """Connect out of band, as ``ibv_modify_qp`` to RTR and RTS: the peer's host (its NIC
        addresses, one per plane, are the address plan's), its QPN and its first PSN, which
        the application exchanged itself; ``key``: an AES-GCM packet key both ends hold.
        For a peer without mrcd (a NIC that speaks only OCP MRC 1.0) the QP runs without
        mrcstack's extension headers; two mrcds set up this way may ask for them on both
        ends (``extensions``).  Returns this QP's first PSN, for the peer (also in
        ``query().psn``)."""
        args: dict[str, Any] = {
            "qpn": self.qpn,
            "remote_host": remote_host,
            "remote_qpn": remote_qpn,
            "remote_psn": remote_psn,
            "extensions": extensions,
        }
        if key is not None:
            args["key"] = bytes(key).hex()
        return int(self.context.conn.call("connect_manual", args)["psn"])

    def _connect_args(self, remote_host: int, service: int, private_data: bytes) -> dict[str, Any]:
        return {
            "qpn": self.qpn,
            "remote_host": remote_host,
            "service": service,
            "private_data": check_private_data(bytes(private_data)).hex(),
        }

    def modify(self, **changes: Any) -> QpAttr:
        """``mrc_modify_qp`` of MRC attributes (QpAttr field names), before connecting."""
        unknown = set(changes) - QP_ATTR_FIELDS
        if unknown:
            raise invalid(f"unknown QP attribute {sorted(unknown)[0]!r}")
        doc = self.context.conn.call("modify_qp", {"qpn": self.qpn, "attr": changes})
        return QpAttr.from_json(doc)

    def query(self) -> QpInfo:
        """``mrc_query_qp``: state, MRC attributes, capacities, peer."""
        return QpInfo.from_json(self.context.conn.call("query_qp", {"qpn": self.qpn}))

    def post_send(self, wrs: WriteWr | SendWr | Sequence[WriteWr | SendWr]) -> None:
        """``mrc_post_send``: RDMA WRITE / WRITE-with-immediate, as one batch.

        Raises ApiError for the first bad request (its index in the message); the ones
        before it are posted, like ``bad_wr`` in verbs.
        """
        batch = [wrs] if isinstance(wrs, WriteWr | SendWr) else list(wrs)
        records = []
        for i, wr in enumerate(batch):
            local = _local(wr, i, self.context)
            imm = wr.imm
            records.append(
                wire.SendWrRecord(
                    wr_id=wr.wr_id,
                    opcode=int(wr.opcode),
                    flags=wire.WR_SIGNALED if wr.signaled else 0,
                    lkey=local.mr.lkey,
                    offset=local.offset,
                    length=local.length,
                    remote_addr=wr.remote_addr,
                    rkey=wr.rkey,
                    imm=0 if imm is None else imm,
                )
            )
        conn = self.context.conn
        for start in range(0, len(records), wire.MAX_BATCH):
            req_id = conn.next_id()
            conn.post(
                wire.encode_post_send(req_id, self.qpn, records[start : start + wire.MAX_BATCH]),
                req_id,
            )

    def post_recv(self, wr_ids: int | Sequence[int]) -> None:
        """``mrc_post_recv``: receive buffers for writes with immediate (no data buffer:
        the data of an MRC write lands where the writer addressed it)."""
        ids = [wr_ids] if isinstance(wr_ids, int) else list(wr_ids)
        conn = self.context.conn
        for start in range(0, len(ids), wire.MAX_BATCH):
            req_id = conn.next_id()
            conn.post(
                wire.encode_post_recv(req_id, self.qpn, ids[start : start + wire.MAX_BATCH]), req_id
            )

    def destroy(self) -> None:
        """``mrc_destroy_qp``: outstanding requests are discarded, not completed."""
        self.context.destroy_qp(self)


class Listener:
    """Connection requests for one service (mrcd listens on its control address).

    ``requests`` is filled by the context as mrcd's connect requests arrive."""

    def __init__(self, ctx: Context, service: int, requests: deque[ConnectRequest]) -> None:
        self.context = ctx
        self.service = service
        self._requests = requests

    def get_request(self, timeout: float | None = None) -> ConnectRequest | None:
        conn = self.context.conn
        if not conn.wait_for(lambda: bool(self._requests), timeout):
            conn.check_open()
            return None
        return self._requests.popleft()

    async def get_request_async(self) -> ConnectRequest:
        await self.context.conn.wait_until(lambda: bool(self._requests))
        return self._requests.popleft()

    def accept(
        self,
        request: ConnectRequest,
        qp: QueuePair,
        private_data: bytes = b"",
        timeout: float | None = None,
    ) -> None:
        """Accept with ``qp`` (RESET); returns once the QP is connected (RTS)."""
        self.context.conn.call("accept", _accept_args(request, qp, private_data), timeout=timeout)

    async def accept_async(
        self, request: ConnectRequest, qp: QueuePair, private_data: bytes = b""
    ) -> None:
        await self.context.conn.call_async("accept", _accept_args(request, qp, private_data))

    def reject(self, request: ConnectRequest) -> None:
        self.context.conn.call("reject", {"request_id": request.request_id})


class Context:
    """``mrc_context`` and its protection domain: everything below lives in one mrcd session."""

    def __init__(self, device: Device, conn: MrcdSocket) -> None:
        self.device = device
        self.conn = conn
        self.cqs: dict[int, CompletionQueue] = {}
        self._qps: dict[int, QueuePair] = {}
        self._mrs: dict[int, MemoryRegion] = {}
        self.channels: dict[int, CompletionChannel] = {}
        self._requests: dict[
            int, deque[ConnectRequest]
        ] = {}  # by service, shared with its Listener
        self._async: deque[AsyncEvent] = deque()
        conn.on_completions = self._on_completions
        conn.on_event = self._on_event

    # Objects ------------------------------------------------------------------------------
    def query_device(self) -> DeviceAttr:
        return DeviceAttr.from_json(self.conn.call("query_device"))

    def reg_mr(self, length: int, access: Access = DEFAULT_ACCESS) -> MemoryRegion:
        """Register ``length`` bytes of new shared memory (``ibv_reg_mr`` on a fresh buffer)."""
        fd, mapping = shm.create(length, f"mrc-mr-{os.getpid()}")
        try:
            doc = self.conn.call("reg_mr", {"length": length, "access": int(access)}, fds=[fd])
        except ApiError:
            mapping.close()
            raise
        finally:
            os.close(fd)
        mr = MemoryRegion(self, mapping, doc)
        self._mrs[mr.lkey] = mr
        return mr

    def dereg_mr(self, mr: MemoryRegion) -> None:
        """``ibv_dereg_mr`` (also ``mr.dereg()``)."""
        if not mr.registered:
            return
        self.conn.call("dereg_mr", {"lkey": mr.lkey})
        self._mrs.pop(mr.lkey, None)
        mr.close()

    def create_comp_channel(self) -> CompletionChannel:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            doc = self.conn.call("create_comp_channel", {}, fds=[theirs.fileno()])
        except ApiError:
            ours.close()
            raise
        finally:
            theirs.close()
        channel = CompletionChannel(self, int(doc["channel"]), ours)
        self.channels[channel.handle] = channel
        return channel

    def create_cq(
        self, cqe: int = 1024, channel: CompletionChannel | None = None, cq_context: object = None
    ) -> CompletionQueue:
        args = {"cqe": cqe, "channel": None if channel is None else channel.handle}
        doc = self.conn.call("create_cq", args)
        cq = CompletionQueue(self, int(doc["cq"]), cqe, channel, cq_context)
        self.cqs[cq.handle] = cq
        return cq

    def create_qp_hint(self, hint: QpHint) -> int:
        return int(self.conn.call("create_qp_hint", _hint_json(hint))["hint"])

    def modify_qp_hint(self, handle: int, hint: QpHint) -> None:
        self.conn.call("modify_qp_hint", {"hint": handle, **_hint_json(hint)})

    def query_qp_hint(self, handle: int) -> QpHint:
        return QpHint(**self.conn.call("query_qp_hint", {"hint": handle}))

    def destroy_qp_hint(self, handle: int) -> None:
        self.conn.call("destroy_qp_hint", {"hint": handle})

    def create_qp(
        self,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue | None = None,
        attr: QpAttr | None = None,
        cap: QpCap | None = None,
        sq_sig_all: bool = False,
        qp_context: object = None,
    ) -> QueuePair:
        """``mrc_create_qp`` (+ the INIT attributes): a QP in RESET, ready to connect."""
        recv = recv_cq or send_cq
        cap = cap or QpCap()
        args = {
            "send_cq": send_cq.handle,
            "recv_cq": recv.handle,
            "attr": (attr or QpAttr()).to_json(),
            "cap": {"max_send_wr": cap.max_send_wr, "max_recv_wr": cap.max_recv_wr},
            "sq_sig_all": sq_sig_all,
        }
        doc = self.conn.call("create_qp", args)
        qp = QueuePair(self, int(doc["qpn"]), send_cq, recv, qp_context)
        self._qps[qp.qpn] = qp
        return qp

    def destroy_qp(self, qp: QueuePair) -> None:
        """``mrc_destroy_qp`` (also ``qp.destroy()``)."""
        self.conn.call("destroy_qp", {"qpn": qp.qpn})
        self._qps.pop(qp.qpn, None)

    def listen(self, service: int) -> Listener:
        """Accept connections for ``service`` (a port-like number agreed out of band)."""
        self.conn.call("listen", {"service": service})
        requests = self._requests[service] = deque()
        return Listener(self, service, requests)

    # Events -------------------------------------------------------------------------------
    def get_async_event(self, timeout: float | None = None) -> AsyncEvent | None:
        """``mrc_get_async_event``: the next event, or None after ``timeout`` seconds
        (``timeout=0`` reads what has arrived without blocking, like ``poll_cq``)."""
        if not self._async:
            self.conn.pump(block=False)
        if not self.conn.wait_for(lambda: bool(self._async), timeout):
            return None
        return self._async.popleft()

    async def get_async_event_async(self) -> AsyncEvent:
        await self.conn.wait_until(lambda: bool(self._async))
        return self._async.popleft()

    def _on_completions(self, records: list[tuple[int, ...]]) -> None:
        cqs = self.cqs
        for cq_handle, qpn, wr_id, status, opcode, flags, _pad, byte_len, imm in records:
            cq = cqs.get(cq_handle)
            if cq is not None:
                cq.deliver(
                    WorkCompletion(
                        wr_id,
                        WcStatus(status),
                        WcOpcode(opcode),
                        qpn,
                        byte_len,
                        imm if flags & wire.WC_HAS_IMM else None,
                    )
                )

    def _on_event(self, doc: dict[str, Any]) -> None:
        kind = doc.get("type")
        if kind == "async":
            self._async.append(
                AsyncEvent(
                    AsyncEventType(doc["event"]),
                    qpn=doc.get("qpn"),
                    port=doc.get("port"),
                    reason=str(doc.get("reason", "")),
                )
            )
        elif kind == "connect_request":
            requests = self._requests.get(int(doc["service"]))
            if requests is not None:
                requests.append(
                    ConnectRequest(
                        request_id=int(doc["request_id"]),
                        remote_host=int(doc["remote_host"]),
                        remote_qpn=int(doc["remote_qpn"]),
                        service=int(doc["service"]),
                        private_data=bytes.fromhex(doc["private_data"]),
                    )
                )

    # Lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """``mrc_destroy_context``: mrcd destroys every QP, CQ and region of the context."""
        self.conn.close()
        for mr in list(self._mrs.values()):
            mr.close()
        self._mrs.clear()
        for channel in self.channels.values():
            channel.close()
        self.channels.clear()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _accept_args(request: ConnectRequest, qp: QueuePair, private_data: bytes) -> dict[str, Any]:
    return {
        "request_id": request.request_id,
        "qpn": qp.qpn,
        "private_data": check_private_data(bytes(private_data)).hex(),
    }


def _hint_json(hint: QpHint) -> dict[str, int]:
    return {
        "num_qps_per_peer": hint.num_qps_per_peer,
        "num_send_peers": hint.num_send_peers,
        "num_remote_recv_peers": hint.num_remote_recv_peers,
    }
