"""The mrcd-to-mrcd control channel: its messages, and the client that opens sessions.

MRC has no RDMA-CM: two daemons exchange QP attributes over TCP on the management network,
like perftest.  A connection carries 4-byte big-endian length-prefixed frames.  The first three
frames are the handshake of ``auth.py`` (nothing else is read or written before it completes);
every later frame is one AES-GCM record (``records.py``: direction keys, 64-bit counter
nonces) holding one JSON object with a ``type`` and an ``id``.  The initiator sends requests;
the responder answers each with the same ``id``, possibly out of order.
docs/control-channel.md has the message table.

This module holds what both ends share (the messages and their checks) and the initiator's
side (:class:`ControlClient`, one :class:`Session` per peer); the responder is
:class:`mrcstack.daemons.mrcd.control.server.ControlServer`.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import random
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from mrcstack.api.limits import MAX_PRIVATE_DATA, QPN_LIMIT
from mrcstack.daemons.mrcd.config import AuthConfig
from mrcstack.daemons.mrcd.control.auth import (
    MAX_HANDSHAKE_MESSAGE,
    Credentials,
    Initiator,
    SessionKeys,
)
from mrcstack.daemons.mrcd.control.records import (
    MAX_MESSAGE,
    ControlError,
    Message,
    RecordLayer,
    decode_busy,
    derive_qp_key,
    encode_frame,
    read_frame,
)
from mrcstack.errors import LocalError, PeerError

log = logging.getLogger("mrcd.control")

Address = tuple[str, int]

HANDSHAKE_TIMEOUT = 5.0  # the whole handshake, from accept: slow peers are cut off
#: Retrying a busy peer: the first wait (or the peer's hint, if longer), doubled each time
#: up to the last, with up to a quarter more at random so refused peers do not return as one.
BUSY_BACKOFF = (0.05, 1.0)
FRAME_TIMEOUT = 30.0  # the rest of a frame once its length has arrived
REQUEST_TIMEOUT = 10.0
_HOST_INDEX = re.compile(r"h(\d+)")
_INSTANCE = re.compile(r"[0-9a-f]{1,32}")
#: Called with (peer host name, reason) when a session ends other than by our own close.
LostHook = Callable[[str, str], None]


class ConnectRejectedError(PeerError):
    """The peer answered CONNECT with REJECT."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"connection rejected: {reason}")
        self.reason = reason


class BadRequestError(Exception):
    """A message field is missing or out of range: the server answers ERROR and keeps the
    session; the client turns it into ControlError("bad_message")."""


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
    #: The sending mrcd's instance (random at each start; "" from a peer that sends none).
    instance: str = ""
    #: The sender wants every packet of the QP authenticated with its AES-GCM key
    #: (mrcstack's extension); absent means yes.
    packet_auth: bool = True
    #: The version of mrcstack's extension headers the sender offers (0: none, it speaks
    #: OCP MRC 1.0 alone); -1 when absent (an mrcd from before this was negotiated).
    extensions: int = -1
    #: The sender flags ACK_REQ on the packet after which its window is full, so this end
    #: may delay its ACKs (``ack_delay``); absent means no (an mrcd from before that).
    window_ack_req: bool = False

    def derive_qp_key(self, dst_host: int, dst_qpn: int) -> bytes:
        return derive_qp_key(self.session_secret, self.src_host, self.src_qpn, dst_host, dst_qpn)


@dataclass(frozen=True, slots=True)
class Accept:
    dst_qpn: int
    dst_psn: int
    private_data: bytes = b""
    instance: str = ""  # the accepting mrcd's instance
    packet_auth: bool = True  # both ends agreed on AES-GCM packets (else the plain ICRC)
    extensions: int = -1  # the extension version agreed (0: none; -1: absent, an old mrcd)
    window_ack_req: bool = False  # as ConnectRequest's: the accepting end's sender flags it


@dataclass(frozen=True, slots=True)
class Reject:
    reason: str


class ControlHooks(Protocol):
    """What the server asks of the node."""

    @property
    def instance(self) -> str:
        """This mrcd's instance: random at each start, so peers tell a restart apart."""
        ...

    async def on_connect(self, req: ConnectRequest) -> Accept | Reject: ...

    def on_port_status(self, host: int, bitmap: int) -> None: ...

    def on_session_lost(self, peer_host: str, reason: str) -> None:
        """A peer's session ended by the peer or the network, not by our stop."""
        ...


def field_int(msg: Message, key: str, limit: int) -> int:
    value = msg.get(key)
    if type(value) is not int or not 0 <= value < limit:
        raise BadRequestError(f"{key}: must be an integer in 0..{limit - 1}")
    return value


def field_data(msg: Message, key: str) -> bytes:
    value = msg.get(key, "")
    if not isinstance(value, str) or len(value) > 2 * MAX_PRIVATE_DATA:
        raise BadRequestError(f"{key}: must be base64 of at most {MAX_PRIVATE_DATA} bytes")
    try:
        data = base64.b64decode(value, validate=True)
    except ValueError:
        raise BadRequestError(f"{key}: not base64") from None
    if len(data) > MAX_PRIVATE_DATA:
        raise BadRequestError(f"{key}: at most {MAX_PRIVATE_DATA} bytes, got {len(data)}")
    return data


def field_bool(msg: Message, name: str, *, default: bool) -> bool:
    """A true/false field; ``default`` when absent (a peer that predates it)."""
    value = msg.get(name, default)
    if not isinstance(value, bool):
        raise BadRequestError(f"{name}: must be true or false")
    return value


def field_extensions(msg: Message) -> int:
    """The extension version a CONNECT offers or an ACCEPT agrees on; -1 when absent."""
    if "extensions" not in msg:
        return -1
    return field_int(msg, "extensions", 256)


def field_instance(msg: Message) -> str:
    """An mrcd instance (up to 32 lowercase hex digits); "" when absent."""
    value = msg.get("instance", "")
    if value == "":
        return ""
    if not isinstance(value, str) or not _INSTANCE.fullmatch(value):
        raise BadRequestError("instance: must be 1..32 lowercase hex digits")
    return value


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def host_index(name: str) -> int | None:
    """``"h3"`` -> 3; None for names outside the fabric's scheme."""
    m = _HOST_INDEX.fullmatch(name)
    return int(m.group(1)) if m else None


# Shared by both ends ----------------------------------------------------------------------
def keepalive(writer: asyncio.StreamWriter) -> None:
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


def credentials(host_name: str, auth: AuthConfig | Credentials) -> Credentials:
    if isinstance(auth, Credentials):
        if auth.host != host_name:
            raise LocalError(f"credentials are for {auth.host}, not {host_name}")
        return auth
    return Credentials.from_config(host_name, auth)


# Client -----------------------------------------------------------------------------------
class Session:
    """One authenticated connection to a peer's control server; requests may overlap."""

    def __init__(
        self,
        keys: SessionKeys,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_message: int = MAX_MESSAGE,
        on_lost: LostHook | None = None,
    ) -> None:
        self.peer_host = keys.peer_host
        self._on_lost = on_lost
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
        instance: str = "",
        timeout: float = REQUEST_TIMEOUT,
        packet_auth: bool = True,
        extensions: int = 0,
        window_ack_req: bool = False,
    ) -> Accept:
        """CONNECT: the peer's ACCEPT, or :class:`ConnectRejectedError`.  ``instance`` is
        ours; the ACCEPT carries the peer's, which a later session must show again."""
        reply = await self.request(
            {
                "type": "CONNECT",
                "src_host": src_host,
                "src_qpn": src_qpn,
                "src_psn": src_psn,
                "service": service,
                "planes": planes,
                "mtu_payload": mtu_payload,
                "private_data": b64(private_data),
                **({"instance": instance} if instance else {}),
                "packet_auth": packet_auth,
                "extensions": extensions,
                **({"window_ack_req": True} if window_ack_req else {}),  # (absent: no)
            },
            timeout,
        )
        try:
            if reply["type"] == "REJECT":
                raise ConnectRejectedError(str(reply.get("reason", ""))[:200])
            if reply["type"] != "ACCEPT":
                raise BadRequestError(f"CONNECT answered with {reply['type'][:32]!r}")
            return Accept(
                field_int(reply, "dst_qpn", QPN_LIMIT),
                field_int(reply, "dst_psn", QPN_LIMIT),
                field_data(reply, "private_data"),
                field_instance(reply),
                field_bool(reply, "packet_auth", default=True),
                field_extensions(reply),
                field_bool(reply, "window_ack_req", default=False),
            )
        except BadRequestError as exc:
            raise ControlError("bad_message", f"{self.peer_host}: {exc}") from None

    async def port_status(self, host: int, bitmap: int, timeout: float = REQUEST_TIMEOUT) -> None:
        await self.request({"type": "PORT_STATUS", "host": host, "port_bitmap": bitmap}, timeout)

    async def ping(self, timeout: float = REQUEST_TIMEOUT) -> float:
        """Round-trip time of one PING, in seconds."""
        loop = asyncio.get_running_loop()
        sent = loop.time()
        await self.request({"type": "PING", "ts": sent}, timeout)
        return loop.time() - sent

    async def instance(self, timeout: float = REQUEST_TIMEOUT) -> str:
        """The peer mrcd's instance (from its PONG; "" if it sends none)."""
        reply = await self.request({"type": "PING", "ts": 0}, timeout)
        try:
            return field_instance(reply)
        except BadRequestError as exc:
            raise ControlError("bad_message", f"{self.peer_host}: {exc}") from None

    async def close(self) -> None:
        self._close(ControlError("closed", "closed locally"))
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def _close(self, why: ControlError) -> None:
        if self._closed is None:
            self._closed = why
            self._writer.close()
            if self._on_lost is not None and why.reason != "closed":
                self._on_lost(self.peer_host, why.reason)
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
        on_lost: LostHook | None = None,
    ) -> None:
        """``on_lost``: told when an open session ends by the peer's doing or the network's
        (EOF, reset, a bad record), never for :meth:`close`."""
        self.host_name = host_name
        self.on_lost = on_lost
        self.creds = credentials(host_name, auth)
        self.peers = dict(peers or {})
        self.handshake_timeout = handshake_timeout
        self.max_message = max_message
        self._sessions: dict[str, Session] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def open_session(
        self, peer_host: str, address: Address | None = None, *, timeout: float | None = None
    ) -> Session:
        """The open session to ``peer_host``, or a new one (``address`` or the peers table;
        ``timeout`` for connect and handshake, default the client's handshake timeout).

        A peer that says it is busy is asked again, with backoff, until ``timeout`` is spent.

        ControlError reasons: ``no_listener`` (the peer host refused the TCP connection:
        no mrcd listens there), ``unreachable``, ``timeout``, ``busy`` (still, when the
        time ran out), ``refused`` (it closed the handshake: credentials), ``lost``."""
        lock = self._locks.setdefault(peer_host, asyncio.Lock())
        async with lock:
            session = self._sessions.get(peer_host)
            if session is not None and not session.closed:
                return session
            if address is None:
                address = self.peers.get(peer_host)
                if address is None:
                    raise LocalError(f"no control address for {peer_host}")
            loop = asyncio.get_running_loop()
            start = loop.time()
            deadline = start + (self.handshake_timeout if timeout is None else timeout)
            wait, tries = BUSY_BACKOFF[0], 1
            busy = ""  # the peer's last busy answer (none yet)

            def still_busy(answers: int, note: str = "") -> ControlError:
                took = loop.time() - start
                return ControlError(
                    "busy", f"{busy}; still busy after {answers} tries in {took:.1f} s{note}"
                )

            while True:
                try:
                    session = await self._open(peer_host, address, deadline)
                    break
                except ControlError as exc:
                    if exc.reason == "timeout" and busy:
                        # The time ran out while asking again (a slow connect or handshake
                        # on a loaded host): what is known of the peer is that it was busy.
                        raise still_busy(tries - 1, " (the last one unanswered)") from None
                    if exc.reason != "busy":
                        raise
                    busy = exc.detail
                    pause = max(wait, exc.retry_after) * random.uniform(1.0, 1.25)
                    if loop.time() + pause >= deadline:
                        raise still_busy(tries) from None
                    await asyncio.sleep(pause)
                    wait, tries = min(2 * wait, BUSY_BACKOFF[1]), tries + 1
            self._sessions[peer_host] = session
            return session

    async def _open(self, peer_host: str, address: Address, deadline: float) -> Session:
        where = f"{peer_host} at [{address[0]}]:{address[1]}"
        initiator = Initiator(self.creds, peer_host)
        try:
            async with asyncio.timeout_at(deadline):
                reader, writer = await asyncio.open_connection(*address)
        except TimeoutError:
            raise ControlError("timeout", f"cannot reach {where}") from None
        except ConnectionRefusedError:
            raise ControlError("no_listener", f"{where}: connection refused") from None
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
                if (retry_after := decode_busy(msg2)) is not None:
                    raise ControlError(
                        "busy",
                        f"{where} is busy (too many connections being set up there)",
                        retry_after=retry_after,
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
        keepalive(writer)
        log.info("event=control_session_open host=%s address=[%s]:%d", peer_host, *address)
        return Session(initiator.result, reader, writer, self.max_message, self.on_lost)

    async def close(self) -> None:
        sessions = list(self._sessions.values())
        self._sessions.clear()
        for session in sessions:
            await session.close()
