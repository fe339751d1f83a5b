"""The agents' listener: authenticated sessions, as mrcd's control channel has them.

Each agent connects and runs the control channel's handshake as initiator; the mapper
answers as ``name`` (cluster PSK, or its own X25519 key and the hosts' public keys).  The
session's peer must be a host of the fabric (``h<N>``); its first record must be a hello.
Then every record is opened by the record layer, which refuses a forged record (its
AES-GCM tag fails) or a replayed or reordered one (its counter is not the next), and ends
the session.  Everything refused is counted by reason (``MapperService.counters``) and
logged in one line; a host's new session replaces its old one.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import re
from typing import Any

from mrcstack.daemons.mrcd.config import Address
from mrcstack.daemons.mrcd.control.auth import (
    MAX_HANDSHAKE_MESSAGE,
    AuthError,
    Credentials,
    ReplayCache,
    Responder,
    SessionKeys,
)
from mrcstack.daemons.mrcd.control.client import FRAME_TIMEOUT, HANDSHAKE_TIMEOUT, keepalive
from mrcstack.daemons.mrcd.control.records import (
    ControlError,
    RecordLayer,
    encode_frame,
    read_frame,
)
from mrcstack.daemons.mrcd.control.server import LogLimit, bound_address
from mrcstack.daemons.mrcmapper.service import MapperService
from mrcstack.errors import LocalError
from mrcstack.mapper.messages import MessageError

log = logging.getLogger("mrcmapper.agents")

MAX_HANDSHAKES = 256
#: Seconds an address the host does not have yet is waited for at start.
ADDRESS_WAIT = 10.0
#: Bytes queued to one agent beyond which its session is cut (it stopped reading).
MAX_QUEUED = 4 << 20
_HOST = re.compile(r"h(0|[1-9][0-9]*)")


async def respond(
    creds: Credentials,
    replay: ReplayCache,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    timeout: float,
) -> SessionKeys:
    """The control channel's handshake as responder, within ``timeout`` seconds: the
    session's keys.  Raises :class:`AuthError` (the agent's credentials or format),
    :class:`ControlError` (it closed), TimeoutError or OSError."""
    responder = Responder(creds, replay=replay)
    async with asyncio.timeout(timeout):
        for _ in range(2):
            body = await read_frame(reader, MAX_HANDSHAKE_MESSAGE)
            if body is None:
                raise ControlError("eof", "closed during the handshake")
            reply = responder.receive(body)
            if reply is not None:
                writer.write(encode_frame(reply))
                await writer.drain()
    return responder.result


class _Link:
    """One agent's session, as the service sends on it."""

    def __init__(self, writer: asyncio.StreamWriter, records: RecordLayer) -> None:
        self.writer = writer
        self.records = records
        self._next = 0

    def send(self, msg: dict[str, Any]) -> bool:
        if self.writer.is_closing():
            return False
        if self.writer.transport.get_write_buffer_size() > MAX_QUEUED:
            self.writer.close()
            return False
        self._next += 1
        self.writer.write(encode_frame(self.records.seal({**msg, "id": self._next})))
        return True


class AgentServer:
    """Listens for agents and feeds their messages to ``service``."""

    def __init__(self, service: MapperService, creds: Credentials, listen: Address) -> None:
        self.service = service
        self.creds = creds
        self.listen = listen
        self._replay = ReplayCache()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._handshaking = 0
        self._links: dict[int, _Link] = {}
        self._log_limit = LogLimit()

    @property
    def address(self) -> Address:
        return bound_address(self._server, "the agents' listener")

    async def start(self) -> None:
        """Listen; an address the host does not have yet (an interface still coming up)
        is tried again for :data:`ADDRESS_WAIT` seconds."""
        host, port = self.listen
        deadline = asyncio.get_running_loop().time() + ADDRESS_WAIT
        while True:
            try:
                self._server = await asyncio.start_server(self._handle, host, port)
                break
            except OSError as exc:
                late = asyncio.get_running_loop().time() > deadline
                if exc.errno != errno.EADDRNOTAVAIL or late:
                    reason = exc.strerror or str(exc)
                    raise LocalError(
                        f"cannot listen for agents on [{host}]:{port}: {reason}"
                    ) from None
                await asyncio.sleep(0.1)
        log.info("event=agents_listening address=[%s]:%d", *self.address)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    def _reject(self, peer: str, reason: str, detail: str) -> None:
        self.service.reject(reason)
        held = self._log_limit.allow(asyncio.get_running_loop().time())
        if held is not None:
            log.warning(
                "event=agent_rejected peer=%s reason=%s detail=%r%s",
                peer, reason, detail, f" suppressed={held}" if held else "",
            )  # fmt: skip

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        name = writer.get_extra_info("peername")
        peer = f"[{name[0]}]:{name[1]}" if name else "?"
        try:
            keys = await self._authenticate(reader, writer, peer)
            if keys is not None:
                await self._session(keys, reader, writer, peer)
        except asyncio.CancelledError:
            pass  # stop(): end quietly
        except Exception:  # a bug costs one session, never the mapper
            self.service.reject("internal")
            log.exception("event=agent_internal_error peer=%s", peer)
        finally:
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _authenticate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> SessionKeys | None:
        if self._handshaking >= MAX_HANDSHAKES:
            self._reject(peer, "busy", f"{self._handshaking} handshakes in progress")
            return None
        self._handshaking += 1
        try:
            return await respond(self.creds, self._replay, reader, writer, HANDSHAKE_TIMEOUT)
        except (AuthError, ControlError) as exc:
            self._reject(peer, exc.reason, exc.detail)
            return None
        except TimeoutError:
            self._reject(peer, "timeout", f"no handshake within {HANDSHAKE_TIMEOUT} s")
            return None
        except OSError as exc:
            self._reject(peer, "reset", str(exc))
            return None
        finally:
            self._handshaking -= 1

    async def _session(
        self,
        keys: SessionKeys,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
    ) -> None:
        match = _HOST.fullmatch(keys.peer_host)
        host = int(match.group(1)) if match else -1
        if not 0 <= host < self.service.cfg.fabric.hosts:
            self._reject(peer, "identity", f"{keys.peer_host} is not a host of the fabric")
            return
        records = RecordLayer(keys)
        link = _Link(writer, records)
        old = self._links.get(host)
        if old is not None:
            old.writer.close()  # its new session replaces it
        self._links[host] = link
        keepalive(writer)
        service = self.service
        try:
            first = True
            while True:
                body = await read_frame(reader, records.frame_limit, FRAME_TIMEOUT)
                if body is None:
                    return
                msg = records.open(body)
                kind = msg.get("type")
                if first:
                    service.hello(host, msg, link)
                    first = False
                elif kind == "report":
                    service.report(host, msg)
                elif kind == "applied":
                    service.applied(host, msg)
                else:
                    raise MessageError("bad_message", f"unexpected {kind!r}")
        except (ControlError, MessageError) as exc:
            self._reject(peer, exc.reason, f"h{host}: {exc}")
        except TimeoutError:
            self._reject(peer, "timeout", f"h{host}: frame unfinished")
        except OSError as exc:
            log.info("event=agent_lost host=h%d error=%r", host, exc)
        finally:
            service.gone(host, link)
            if self._links.get(host) is link:
                del self._links[host]
