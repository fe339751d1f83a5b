"""The mrcd-to-mrcd control channel: authenticated TCP sessions carrying QP setup.

MRC has no RDMA-CM: two daemons exchange QP attributes over TCP on the management network,
like perftest.  A connection carries 4-byte big-endian length-prefixed frames.  The first three
frames are the handshake of ``auth.py`` (nothing else is read or written before it completes);
every later frame is one AES-GCM record (direction keys, 64-bit counter nonces) holding one JSON
object with a ``type`` and an ``id``.  The initiator sends requests; the responder answers each
with the same ``id``, possibly out of order.  docs/control-channel.md has the message table.

Bad input never takes the server down: the connection is closed, the reason counted in
:attr:`ControlServer.stats` and logged in one line.  A peer that has not authenticated gets
no byte back.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from daemons.mrcd.auth import (
    MAX_HANDSHAKE_MESSAGE,
    AuthError,
    Credentials,
    Initiator,
    ReplayCache,
    Responder,
    SessionKeys,
)
from daemons.mrcd.config import AuthConfig
from daemons.mrcd.records import (
    MAX_MESSAGE,
    ControlError,
    Message,
    RecordLayer,
    derive_qp_key,
    encode_frame,
    read_frame,
)
from mrcstack.api.limits import MAX_PRIVATE_DATA, QPN_LIMIT
from mrcstack.core.errors import LocalError, PeerError

log = logging.getLogger("mrcd.control")

Address = tuple[str, int]

HANDSHAKE_TIMEOUT = 5.0  # the whole handshake, from accept: slow peers are cut off
FRAME_TIMEOUT = 30.0  # the rest of a frame once its length has arrived
REQUEST_TIMEOUT = 10.0
MAX_INFLIGHT = 64  # requests one session may have outstanding at the server
MAX_HANDSHAKES = 128  # concurrent unauthenticated connections; more are closed at once
LOG_BURST = 20  # rejection log lines per second; the rest are counted, then summarized
_HOST_INDEX = re.compile(r"h(\d+)")


class ConnectRejectedError(PeerError):
    """The peer answered CONNECT with REJECT."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"connection rejected: {reason}")
        self.reason = reason


class _BadRequestError(Exception):
    """An authenticated peer's request is malformed: answered with ERROR, session kept."""


# Messages ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ConnectRequest:
    """A peer's CONNECT, handed to :meth:`ControlHooks.on_connect`.

    ``peer_host`` is the authenticated name of the sending mrcd; the server has checked that
    ``src_host`` is that host.  :meth:`derive_qp_key` gives the QP's packet key once the
    local QP number is known.
    """

    peer_host: str
    src_host: int
    src_qpn: int
    src_psn: int
    service: int
    planes: int
    mtu_payload: int
    private_data: bytes
    session_secret: bytes = field(repr=False, compare=False, default=b"")

    def derive_qp_key(self, dst_host: int, dst_qpn: int) -> bytes:
        return derive_qp_key(self.session_secret, self.src_host, self.src_qpn, dst_host, dst_qpn)


@dataclass(frozen=True, slots=True)
class Accept:
    dst_qpn: int
    dst_psn: int
    private_data: bytes = b""


@dataclass(frozen=True, slots=True)
class Reject:
    reason: str


class ControlHooks(Protocol):
    """What the server asks of the node."""

    async def on_connect(self, req: ConnectRequest) -> Accept | Reject: ...

    def on_port_status(self, host: int, bitmap: int) -> None: ...


def _field_int(msg: Message, key: str, limit: int) -> int:
    value = msg.get(key)
    if type(value) is not int or not 0 <= value < limit:
        raise _BadRequestError(f"{key}: must be an integer in 0..{limit - 1}")
    return value


def _field_data(msg: Message, key: str) -> bytes:
    value = msg.get(key, "")
    if not isinstance(value, str) or len(value) > 2 * MAX_PRIVATE_DATA:
        raise _BadRequestError(f"{key}: must be base64 of at most {MAX_PRIVATE_DATA} bytes")
    try:
        data = base64.b64decode(value, validate=True)
    except ValueError:
        raise _BadRequestError(f"{key}: not base64") from None
    if len(data) > MAX_PRIVATE_DATA:
        raise _BadRequestError(f"{key}: at most {MAX_PRIVATE_DATA} bytes, got {len(data)}")
    return data


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def host_index(name: str) -> int | None:
    """``"h3"`` -> 3; None for names outside the fabric's scheme."""
    m = _HOST_INDEX.fullmatch(name)
    return int(m.group(1)) if m else None


# Server -----------------------------------------------------------------------------------
@dataclass(slots=True)
class ControlStats:
    """Counters read by metrics: connections by outcome, requests by type."""

    connections: int = 0  # TCP connections accepted
    sessions: int = 0  # handshakes completed
    active: int = 0  # sessions open now
    requests: dict[str, int] = field(default_factory=dict)
    bad_requests: int = 0  # answered with ERROR
    rejected: dict[str, int] = field(default_factory=dict)  # connections closed, by reason

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


class LogLimit:
    """At most ``burst`` lines per ``window`` seconds; the lines held back are counted and
    reported with the next line let through."""

    def __init__(self, burst: int = LOG_BURST, window: float = 1.0) -> None:
        self.burst = burst
        self.window = window
        self._start = float("-inf")
        self._count = 0
        self._held = 0

    def allow(self, now: float) -> int | None:
        """None: stay quiet.  Otherwise log, mentioning this many held-back lines."""
        if now - self._start >= self.window:
            self._start, self._count = now, 0
        self._count += 1
        if self._count > self.burst:
            self._held += 1
            return None
        held, self._held = self._held, 0
        return held


def _keepalive(writer: asyncio.StreamWriter) -> None:
    """TCP keepalive, so a session to a host that died (no FIN, no RST) ends in about a minute
    instead of lingering until the next request times out."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
    except OSError:
        pass  # best effort


def _credentials(host_name: str, auth: AuthConfig | Credentials) -> Credentials:
    if isinstance(auth, Credentials):
        if auth.host != host_name:
            raise LocalError(f"credentials are for {auth.host}, not {host_name}")
        return auth
    return Credentials.from_config(host_name, auth)


class ControlServer:
    """Listens on the control address and answers authenticated peers' requests."""

    def __init__(
        self,
        host_name: str,
        auth: AuthConfig | Credentials,
        hooks: ControlHooks,
        listen: Address,
        *,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        max_message: int = MAX_MESSAGE,
        max_handshakes: int = MAX_HANDSHAKES,
    ) -> None:
        self.host_name = host_name
        self.creds = _credentials(host_name, auth)
        self.hooks = hooks
        self.listen = listen
        self.handshake_timeout = handshake_timeout
        self.max_message = max_message
        self.max_handshakes = max_handshakes
        self.stats = ControlStats()
        self._replay = ReplayCache()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._handshaking = 0
        self._log_limit = LogLimit()

    @property
    def address(self) -> Address:
        """The bound address (the real port when ``listen`` asked for port 0)."""
        if self._server is None or not self._server.sockets:
            raise LocalError("control server is not running")
        name = self._server.sockets[0].getsockname()
        return (str(name[0]), int(name[1]))

    async def start(self) -> None:
        host, port = self.listen
        try:
            self._server = await asyncio.start_server(self._handle, host, port)
        except OSError as exc:
            raise LocalError(f"control: cannot listen on [{host}]:{port}: {exc.strerror}") from None
        log.info("event=control_listening host=%s address=[%s]:%d", self.host_name, *self.address)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    def _reject(self, peer: str, reason: str, detail: str) -> None:
        """Count, and log one line (rate-limited: a flood stays readable)."""
        self.stats.reject(reason)
        suppressed = self._log_limit.allow(asyncio.get_running_loop().time())
        if suppressed is not None:
            log.warning(
                "event=control_rejected peer=%s reason=%s detail=%r%s",
                peer,
                reason,
                detail,
                f" suppressed={suppressed}" if suppressed else "",
            )

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        name = writer.get_extra_info("peername")
        peer = f"[{name[0]}]:{name[1]}" if name else "?"
        self.stats.connections += 1
        try:
            if self._handshaking >= self.max_handshakes:
                self._reject(peer, "busy", f"{self._handshaking} handshakes in progress")
                return
            self._handshaking += 1
            try:
                keys = await self._handshake(reader, writer)
            except AuthError as exc:
                self._reject(peer, exc.reason, exc.detail)
                return
            except ControlError as exc:
                self._reject(peer, exc.reason, exc.detail)
                return
            except TimeoutError:
                self._reject(peer, "timeout", f"no handshake within {self.handshake_timeout} s")
                return
            except OSError as exc:
                self._reject(peer, "reset", str(exc))
                return
            finally:
                self._handshaking -= 1
            await self._session(keys, reader, writer, peer)
        except Exception:  # a bug must cost one connection, never the server
            self.stats.reject("internal")
            log.exception("event=control_internal_error peer=%s", peer)
        except asyncio.CancelledError:
            # stop() cancels us; end normally, since Python 3.11's start_server callback
            # calls task.exception() on a cancelled task and logs an error.
            pass
        finally:
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> SessionKeys:
        responder = Responder(self.creds, replay=self._replay)
        async with asyncio.timeout(self.handshake_timeout):
            for _ in range(2):
                body = await read_frame(reader, MAX_HANDSHAKE_MESSAGE)
                if body is None:
                    raise ControlError("eof", "closed during the handshake")
                reply = responder.receive(body)
                if reply is not None:
                    writer.write(encode_frame(reply))
                    await writer.drain()
        return responder.result

    async def _session(
        self,
        keys: SessionKeys,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
    ) -> None:
        records = RecordLayer(keys, self.max_message)
        inflight = asyncio.Semaphore(MAX_INFLIGHT)
        tasks: set[asyncio.Task[None]] = set()
        self.stats.sessions += 1
        self.stats.active += 1
        _keepalive(writer)
        log.info("event=control_session peer=%s host=%s", peer, keys.peer_host)
        try:
            while True:
                body = await read_frame(reader, records.frame_limit, FRAME_TIMEOUT)
                if body is None:
                    break
                msg = records.open(body)
                await inflight.acquire()
                t = asyncio.create_task(self._dispatch(records, writer, msg, keys, inflight))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
        except ControlError as exc:
            self._reject(peer, exc.reason, f"{keys.peer_host}: {exc.detail}")
        except TimeoutError:
            self._reject(peer, "timeout", f"{keys.peer_host}: frame unfinished")
        except OSError as exc:
            log.info(
                "event=control_session_lost peer=%s host=%s error=%r", peer, keys.peer_host, exc
            )
        finally:
            self.stats.active -= 1
            for t in list(tasks):
                t.cancel()

    async def _dispatch(
        self,
        records: RecordLayer,
        writer: asyncio.StreamWriter,
        msg: Message,
        keys: SessionKeys,
        inflight: asyncio.Semaphore,
    ) -> None:
        try:
            reply = await self._answer(msg, keys)
            reply["id"] = msg["id"]
            if not writer.is_closing():
                writer.write(encode_frame(records.seal(reply)))
                await writer.drain()
        except OSError:
            pass  # the read loop sees the connection go and logs it
        finally:
            inflight.release()

    async def _answer(self, msg: Message, keys: SessionKeys) -> Message:
        kind = msg["type"]
        self.stats.requests[kind] = self.stats.requests.get(kind, 0) + 1
        peer_index = host_index(keys.peer_host)
        try:
            if kind == "CONNECT":
                return await self._connect(msg, keys, peer_index)
            if kind == "PORT_STATUS":
                host = _field_int(msg, "host", 1 << 32)
                if host != peer_index:
                    raise _BadRequestError(f"host {host}: a peer reports only its own ports")
                bitmap = _field_int(msg, "port_bitmap", 1 << 64)
                self.hooks.on_port_status(host, bitmap)
                return {"type": "OK"}
            if kind == "PING":
                ts = msg.get("ts")
                if type(ts) not in (int, float):
                    raise _BadRequestError("ts: must be a number")
                return {"type": "PONG", "ts": ts}
            raise _BadRequestError(f"unknown message type {kind[:32]!r}")
        except _BadRequestError as exc:
            self.stats.bad_requests += 1
            return {"type": "ERROR", "reason": str(exc)}
        except Exception as exc:  # the node's hook failed: the peer gets a bare error
            log.exception("event=control_hook_error host=%s type=%s", keys.peer_host, kind)
            return {"type": "ERROR", "reason": f"internal error ({type(exc).__name__})"}

    async def _connect(self, msg: Message, keys: SessionKeys, peer_index: int | None) -> Message:
        src_host = _field_int(msg, "src_host", 1 << 32)
        req = ConnectRequest(
            peer_host=keys.peer_host,
            src_host=src_host,
            src_qpn=_field_int(msg, "src_qpn", QPN_LIMIT),
            src_psn=_field_int(msg, "src_psn", QPN_LIMIT),
            service=_field_int(msg, "service", 1 << 64),
            planes=_field_int(msg, "planes", 1 << 16),
            mtu_payload=_field_int(msg, "mtu_payload", 1 << 32),
            private_data=_field_data(msg, "private_data"),
            session_secret=keys.session_secret,
        )
        if src_host != peer_index:
            return {"type": "REJECT", "reason": f"src_host {src_host} is not {keys.peer_host}"}
        try:
            result = await self.hooks.on_connect(req)
        except Exception as exc:
            log.exception("event=control_hook_error host=%s type=CONNECT", keys.peer_host)
            return {"type": "REJECT", "reason": f"internal error ({type(exc).__name__})"}
        if isinstance(result, Reject):
            return {"type": "REJECT", "reason": result.reason}
        return {
            "type": "ACCEPT",
            "dst_qpn": result.dst_qpn,
            "dst_psn": result.dst_psn,
            "private_data": _b64(result.private_data),
        }


# Client -----------------------------------------------------------------------------------
class Session:
    """One authenticated connection to a peer's control server; requests may overlap."""

    def __init__(
        self,
        keys: SessionKeys,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_message: int = MAX_MESSAGE,
    ) -> None:
        self.peer_host = keys.peer_host
        self._secret = keys.session_secret
        self._records = RecordLayer(keys, max_message)
        self._reader = reader
        self._writer = writer
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._next_id = 0
        self._closed: ControlError | None = None
        self._task = asyncio.create_task(self._read_loop())

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def derive_qp_key(self, src_host: int, src_qpn: int, dst_host: int, dst_qpn: int) -> bytes:
        return derive_qp_key(self._secret, src_host, src_qpn, dst_host, dst_qpn)

    async def request(self, msg: Message, timeout: float = REQUEST_TIMEOUT) -> Message:
        """Send one request, wait for its answer.  An ERROR answer raises ControlError."""
        if self._closed is not None:
            raise ControlError(self._closed.reason, f"session to {self.peer_host} is closed")
        self._next_id += 1
        rid = self._next_id
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            self._writer.write(encode_frame(self._records.seal({**msg, "id": rid})))
            await self._writer.drain()
            async with asyncio.timeout(timeout):
                reply = await fut
        except TimeoutError:
            raise  # (a subclass of OSError) the session stays; a late answer is dropped
        except OSError as exc:
            self._close(ControlError("lost", str(exc)))
            raise ControlError("lost", f"session to {self.peer_host}: {exc}") from None
        finally:
            self._pending.pop(rid, None)
        if reply.get("type") == "ERROR":
            raise ControlError("error", f"{self.peer_host}: {reply.get('reason')}")
        return reply

    async def connect(
        self,
        *,
        src_host: int,
        src_qpn: int,
        src_psn: int,
        service: int,
        planes: int,
        mtu_payload: int,
        private_data: bytes = b"",
        timeout: float = REQUEST_TIMEOUT,
    ) -> Accept:
        """CONNECT: the peer's ACCEPT, or :class:`ConnectRejectedError`."""
        reply = await self.request(
            {
                "type": "CONNECT",
                "src_host": src_host,
                "src_qpn": src_qpn,
                "src_psn": src_psn,
                "service": service,
                "planes": planes,
                "mtu_payload": mtu_payload,
                "private_data": _b64(private_data),
            },
            timeout,
        )
        try:
            if reply["type"] == "REJECT":
                raise ConnectRejectedError(str(reply.get("reason", ""))[:200])
            if reply["type"] != "ACCEPT":
                raise _BadRequestError(f"CONNECT answered with {reply['type'][:32]!r}")
            return Accept(
                _field_int(reply, "dst_qpn", QPN_LIMIT),
                _field_int(reply, "dst_psn", QPN_LIMIT),
                _field_data(reply, "private_data"),
            )
        except _BadRequestError as exc:
            raise ControlError("bad_message", f"{self.peer_host}: {exc}") from None

    async def port_status(self, host: int, bitmap: int, timeout: float = REQUEST_TIMEOUT) -> None:
        await self.request({"type": "PORT_STATUS", "host": host, "port_bitmap": bitmap}, timeout)

    async def ping(self, timeout: float = REQUEST_TIMEOUT) -> float:
        """Round-trip time of one PING, in seconds."""
        loop = asyncio.get_running_loop()
        sent = loop.time()
        await self.request({"type": "PING", "ts": sent}, timeout)
        return loop.time() - sent

    async def close(self) -> None:
        self._close(ControlError("closed", "closed locally"))
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def _close(self, why: ControlError) -> None:
        if self._closed is None:
            self._closed = why
            self._writer.close()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ControlError(why.reason, f"{self.peer_host}: {why.detail}"))

    async def _read_loop(self) -> None:
        why = ControlError("eof", "peer closed the session")
        try:
            while True:
                body = await read_frame(self._reader, self._records.frame_limit, FRAME_TIMEOUT)
                if body is None:
                    break
                msg = self._records.open(body)
                fut = self._pending.get(msg["id"])
                if fut is not None and not fut.done():  # else: answer after a timeout
                    fut.set_result(msg)
        except ControlError as exc:
            why = exc
            log.warning("event=control_session_error host=%s error=%r", self.peer_host, str(exc))
        except TimeoutError:
            why = ControlError("timeout", "frame unfinished")
        except OSError as exc:
            why = ControlError("lost", str(exc))
        finally:
            self._close(why)


class ControlClient:
    """Opens (and reuses) one session per peer."""

    def __init__(
        self,
        host_name: str,
        auth: AuthConfig | Credentials,
        peers: Mapping[str, Address] | None = None,
        *,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        max_message: int = MAX_MESSAGE,
    ) -> None:
        self.host_name = host_name
        self.creds = _credentials(host_name, auth)
        self.peers = dict(peers or {})
        self.handshake_timeout = handshake_timeout
        self.max_message = max_message
        self._sessions: dict[str, Session] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def open_session(self, peer_host: str, address: Address | None = None) -> Session:
        """The open session to ``peer_host``, or a new one (``address`` or the peers table)."""
        lock = self._locks.setdefault(peer_host, asyncio.Lock())
        async with lock:
            session = self._sessions.get(peer_host)
            if session is not None and not session.closed:
                return session
            if address is None:
                address = self.peers.get(peer_host)
                if address is None:
                    raise LocalError(f"no control address for {peer_host}")
            session = await self._open(peer_host, address)
            self._sessions[peer_host] = session
            return session

    async def _open(self, peer_host: str, address: Address) -> Session:
        where = f"{peer_host} at [{address[0]}]:{address[1]}"
        initiator = Initiator(self.creds, peer_host)
        deadline = asyncio.get_running_loop().time() + self.handshake_timeout
        try:
            async with asyncio.timeout_at(deadline):
                reader, writer = await asyncio.open_connection(*address)
        except TimeoutError:
            raise ControlError("timeout", f"cannot reach {where}") from None
        except OSError as exc:
            raise ControlError("unreachable", f"{where}: {exc.strerror or exc}") from None
        try:
            async with asyncio.timeout_at(deadline):
                writer.write(encode_frame(initiator.start()))
                await writer.drain()
                msg2 = await read_frame(reader, MAX_HANDSHAKE_MESSAGE)
                if msg2 is None:
                    raise ControlError(
                        "refused", f"{where} ended the handshake: it refuses our credentials"
                    )
                msg3 = initiator.receive(msg2)
                if msg3 is not None:
                    writer.write(encode_frame(msg3))
                    await writer.drain()
        except BaseException as exc:
            writer.close()
            if isinstance(exc, TimeoutError):
                raise ControlError("timeout", f"no handshake with {where}") from None
            if isinstance(exc, OSError):
                raise ControlError("lost", f"{where}: {exc.strerror or exc}") from None
            raise
        _keepalive(writer)
        log.info("event=control_session_open host=%s address=[%s]:%d", peer_host, *address)
        return Session(initiator.result, reader, writer, self.max_message)

    async def close(self) -> None:
        sessions = list(self._sessions.values())
        self._sessions.clear()
        for session in sessions:
            await session.close()
