"""The responder's side of the mrcd control channel: :class:`ControlServer`.

It listens on the control address, authenticates every peer (``auth.py``'s handshake, within
``handshake_timeout``), then answers its requests (``control.py`` has the messages).  Bad
input never takes the server down: the connection is closed, the reason counted in
:attr:`ControlServer.stats` (authentication failures apart from other rejections) and logged
in one line.  A peer that has not authenticated gets no byte back, but for the busy frame
that tells a refused one when to try again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from mrcstack.api.limits import QPN_LIMIT
from mrcstack.daemons.mrcd.config import AuthConfig
from mrcstack.daemons.mrcd.control.auth import (
    MAX_HANDSHAKE_MESSAGE,
    AuthError,
    Credentials,
    ReplayCache,
    Responder,
    SessionKeys,
)
from mrcstack.daemons.mrcd.control.client import (
    FRAME_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    Address,
    BadRequestError,
    ConnectRequest,
    ControlHooks,
    Reject,
    b64,
    credentials,
    field_bool,
    field_data,
    field_extensions,
    field_instance,
    field_int,
    host_index,
    keepalive,
)
from mrcstack.daemons.mrcd.control.records import (
    MAX_MESSAGE,
    ControlError,
    Message,
    RecordLayer,
    encode_busy,
    encode_frame,
    read_frame,
)
from mrcstack.errors import LocalError

log = logging.getLogger("mrcd.control")

MAX_INFLIGHT = 64  # requests one session may have outstanding at the server
MAX_HANDSHAKES = 128  # concurrent unauthenticated connections; more are told busy
#: Handshakes one source address may have in progress: one host holding connections open
#: cannot take the server's room from the others.
MAX_HANDSHAKES_PER_SOURCE = 8
#: Of MAX_HANDSHAKES, the slots only a source with no handshake in progress may take, so a
#: new peer gets in even while many sources each hold their share.
NEW_SOURCE_RESERVE = 32
#: A connection must start its first frame within this (an mrcd sends it at once); one that
#: sends nothing is closed long before the whole handshake's timeout.
IDLE_TIMEOUT = 1.0
#: What a busy server asks a refused peer to wait before trying again.
BUSY_RETRY_AFTER = 0.1
#: How long a refused connection is read (and discarded) after the busy frame, so closing
#: it does not reset the connection before the peer reads that frame.
BUSY_LINGER = 0.5
LOG_BURST = 20  # rejection log lines per second; the rest are counted, then summarized
#: Why a connection was closed, other than failed authentication (auth.CREDENTIAL_FAILURES).
#: A bounded set: metrics export each one (zero until it happens); anything else is a bug.
REJECT_REASONS = (
    "busy",  # MAX_HANDSHAKES handshakes in progress (or all but the new sources' reserve)
    "source_busy",  # MAX_HANDSHAKES_PER_SOURCE from this address in progress
    "idle",  # nothing sent within IDLE_TIMEOUT of connecting
    "timeout",  # no handshake within handshake_timeout, or a frame left unfinished
    "eof",  # closed during the handshake
    "malformed",  # not an mrcd handshake, or a record too short to be one
    "version",  # another handshake version
    "reset",  # a socket error during the handshake
    "truncated",  # the stream ended inside a frame
    "oversized",  # a frame over the limit
    "sequence",  # a record out of order (replayed, reordered or dropped)
    "decrypt",  # a record whose AES-GCM tag fails
    "bad_message",  # a record that is not a JSON request
    "internal",  # a bug in mrcd: one connection lost, the server kept
)


@dataclass(slots=True)
class ControlStats:
    """Counters read by metrics: connections by outcome, requests by type."""

    connections: int = 0  # TCP connections accepted
    sessions: int = 0  # handshakes completed
    active: int = 0  # sessions open now
    requests: dict[str, int] = field(default_factory=dict)
    bad_requests: int = 0  # answered with ERROR
    #: Peers that failed mutual authentication, by reason (auth.CREDENTIAL_FAILURES).
    auth_failures: dict[str, int] = field(default_factory=dict)
    #: Other connections closed, by reason (REJECT_REASONS).
    rejected: dict[str, int] = field(default_factory=dict)

    def auth_failed(self, reason: str) -> None:
        self.auth_failures[reason] = self.auth_failures.get(reason, 0) + 1

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


def bound_address(server: asyncio.Server | None, what: str) -> Address:
    """The first address ``server`` listens on (the real port after asking for port 0);
    ``what`` names the listener in the error when it is not running."""
    if server is None or not server.sockets:
        raise LocalError(f"{what} is not running")
    name = server.sockets[0].getsockname()
    return (str(name[0]), int(name[1]))


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


def admission(
    total: int, from_source: int, *, limit: int, per_source: int, reserve: int
) -> str | None:
    """Why a new handshake must wait (a REJECT_REASONS entry), or None to let it in.

    ``total`` handshakes are in progress, ``from_source`` of them from the new connection's
    address.  A source at its share is refused first; the last ``reserve`` slots go only to
    sources with nothing in progress, so one that keeps its share busy leaves them room."""
    if from_source >= per_source:
        return "source_busy"
    if total >= limit or (from_source and total >= limit - reserve):
        return "busy"
    return None


class ControlServer:
    """Listens on the control address and answers authenticated peers' requests.

    Handshakes are admitted by :func:`admission`; a refused peer gets one busy frame (a
    retry hint, nothing else) and is closed."""

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
        max_per_source: int = MAX_HANDSHAKES_PER_SOURCE,
        new_source_reserve: int = NEW_SOURCE_RESERVE,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        self.host_name = host_name
        self.creds = credentials(host_name, auth)
        self.hooks = hooks
        self.listen = listen
        self.handshake_timeout = handshake_timeout
        self.max_message = max_message
        self.max_handshakes = max_handshakes
        self.max_per_source = max_per_source
        self.new_source_reserve = min(new_source_reserve, max_handshakes - 1)
        self.idle_timeout = idle_timeout
        self.stats = ControlStats()
        self._replay = ReplayCache()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._handshaking = 0
        self._by_source: dict[str, int] = {}  # handshakes in progress per source address
        self._log_limit = LogLimit()

    @property
    def address(self) -> Address:
        """The bound address (the real port when ``listen`` asked for port 0)."""
        return bound_address(self._server, "control server")

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

    def _reject(self, peer: str, reason: str, detail: str, *, auth: bool = False) -> None:
        """Count (an authentication failure, or a rejection by ``reason``), and log one line
        (rate-limited: a flood stays readable)."""
        if auth:
            self.stats.auth_failed(reason)
        else:
            self.stats.reject(reason)
        suppressed = self._log_limit.allow(asyncio.get_running_loop().time())
        if suppressed is not None:
            log.warning(
                "event=%s peer=%s reason=%s detail=%r%s",
                "control_auth_failed" if auth else "control_rejected",
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
        source = str(name[0]) if name else "?"
        self.stats.connections += 1
        try:
            from_source = self._by_source.get(source, 0)
            busy = admission(
                self._handshaking,
                from_source,
                limit=self.max_handshakes,
                per_source=self.max_per_source,
                reserve=self.new_source_reserve,
            )
            if busy is not None:
                self._reject(
                    peer, busy, f"{self._handshaking} handshakes in progress, {from_source} "
                    f"from {source}"
                )  # fmt: skip
                await self._refuse(reader, writer)
                return
            self._handshaking += 1
            self._by_source[source] = from_source + 1
            try:
                keys = await self._handshake(reader, writer)
            except AuthError as exc:
                self._reject(peer, exc.reason, exc.detail, auth=exc.credentials)
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
                left = self._by_source.pop(source) - 1
                if left:
                    self._by_source[source] = left
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

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Send the busy frame and end the connection cleanly: what the peer sent is read
        and dropped for a moment, since closing with unread data would reset the connection
        and could destroy the frame before the peer reads it."""
        try:
            writer.write(encode_frame(encode_busy(BUSY_RETRY_AFTER)))
            if writer.can_write_eof():
                writer.write_eof()
            async with asyncio.timeout(BUSY_LINGER):
                while await reader.read(4096):
                    pass
        except (OSError, TimeoutError):
            pass  # gone, or still talking: it has had its answer

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> SessionKeys:
        responder = Responder(self.creds, replay=self._replay)
        async with asyncio.timeout(self.handshake_timeout):
            for i in range(2):
                start = self.idle_timeout if i == 0 else None
                body = await read_frame(reader, MAX_HANDSHAKE_MESSAGE, start_timeout=start)
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
        why = "eof"
        self.stats.sessions += 1
        self.stats.active += 1
        keepalive(writer)
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
            why = exc.reason
            self._reject(peer, exc.reason, f"{keys.peer_host}: {exc.detail}")
        except TimeoutError:
            why = "timeout"
            self._reject(peer, "timeout", f"{keys.peer_host}: frame unfinished")
        except OSError as exc:
            why = "lost"
            log.info(
                "event=control_session_lost peer=%s host=%s error=%r", peer, keys.peer_host, exc
            )
        except asyncio.CancelledError:
            why = ""  # our stop(): nothing to tell the node
            raise
        finally:
            self.stats.active -= 1
            for t in list(tasks):
                t.cancel()
            if why and self._server is not None:
                try:
                    self.hooks.on_session_lost(keys.peer_host, why)
                except Exception:
                    log.exception("event=control_hook_error host=%s type=lost", keys.peer_host)

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
                host = field_int(msg, "host", 1 << 32)
                if host != peer_index:
                    raise BadRequestError(f"host {host}: a peer reports only its own ports")
                bitmap = field_int(msg, "port_bitmap", 1 << 64)
                self.hooks.on_port_status(host, bitmap)
                return {"type": "OK"}
            if kind == "PING":
                ts = msg.get("ts")
                if type(ts) not in (int, float):
                    raise BadRequestError("ts: must be a number")
                return {"type": "PONG", "ts": ts, "instance": self.hooks.instance}
            raise BadRequestError(f"unknown message type {kind[:32]!r}")
        except BadRequestError as exc:
            self.stats.bad_requests += 1
            return {"type": "ERROR", "reason": str(exc)}
        except Exception as exc:  # the node's hook failed: the peer gets a bare error
            log.exception("event=control_hook_error host=%s type=%s", keys.peer_host, kind)
            return {"type": "ERROR", "reason": f"internal error ({type(exc).__name__})"}

    async def _connect(self, msg: Message, keys: SessionKeys, peer_index: int | None) -> Message:
        src_host = field_int(msg, "src_host", 1 << 32)
        req = ConnectRequest(
            peer_host=keys.peer_host,
            src_host=src_host,
            src_qpn=field_int(msg, "src_qpn", QPN_LIMIT),
            src_psn=field_int(msg, "src_psn", QPN_LIMIT),
            service=field_int(msg, "service", 1 << 64),
            planes=field_int(msg, "planes", 1 << 16),
            mtu_payload=field_int(msg, "mtu_payload", 1 << 32),
            private_data=field_data(msg, "private_data"),
            session_secret=keys.session_secret,
            instance=field_instance(msg),
            packet_auth=field_bool(msg, "packet_auth", default=True),
            extensions=field_extensions(msg),
            window_ack_req=field_bool(msg, "window_ack_req", default=False),
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
            "private_data": b64(result.private_data),
            **({"instance": result.instance} if result.instance else {}),
            "packet_auth": result.packet_auth,
            **({"extensions": result.extensions} if result.extensions >= 0 else {}),
            **({"window_ack_req": True} if result.window_ack_req else {}),
        }
