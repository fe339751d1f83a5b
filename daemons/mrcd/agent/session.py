"""The agent's session to ``mrcmapper``: authenticated as the control channel is.

The agent connects to the mapper's agent listener (management network), runs the control
channel's handshake as initiator (cluster PSK or X25519 keys; the mapper proves it is
``name``), then exchanges AES-GCM records: a record forged, replayed or out of order ends
the session.  It says hello, sends its reports, and takes the mapper's denylists.  When the
session ends it connects again, backing off to :data:`MAX_BACKOFF`; meanwhile reports are
dropped and the last denylist stays in force.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from mrcstack.daemons.mrcd.config import Address
from mrcstack.daemons.mrcd.control.auth import (
    MAX_HANDSHAKE_MESSAGE,
    AuthError,
    Credentials,
    Initiator,
)
from mrcstack.daemons.mrcd.control.client import FRAME_TIMEOUT, HANDSHAKE_TIMEOUT, keepalive
from mrcstack.daemons.mrcd.control.records import (
    ControlError,
    Message,
    RecordLayer,
    encode_frame,
    read_frame,
)
from mrcstack.errors import PeerError

log = logging.getLogger("mrcd.agent")

FIRST_BACKOFF = 0.1
MAX_BACKOFF = 2.0
#: Bytes queued to the mapper beyond which reports are dropped (a mapper that cannot keep
#: up loses reports, not the agent's memory).
MAX_QUEUED = 1 << 20


async def initiate(
    initiator: Initiator, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, where: str
) -> None:
    """The control channel's handshake as initiator, on a connection open to ``where``:
    :class:`ControlError` ``refused`` when it closes on our credentials, :class:`AuthError`
    when its answer does not check out."""
    writer.write(encode_frame(initiator.start()))
    await writer.drain()
    msg2 = await read_frame(reader, MAX_HANDSHAKE_MESSAGE)
    if msg2 is None:
        raise ControlError("refused", f"{where} ended the handshake: it refuses our credentials")
    msg3 = initiator.receive(msg2)
    if msg3 is not None:
        writer.write(encode_frame(msg3))
        await writer.drain()


class MapperSession:
    """Keeps a session to the mapper open; ``hello()`` is said on each new one and every
    message that comes in goes to ``on_message`` (which raises :class:`PeerError` to end
    the session)."""

    def __init__(
        self,
        creds: Credentials,
        name: str,
        address: Address,
        hello: Callable[[], Message],
        on_message: Callable[[Message], None],
    ) -> None:
        self.creds = creds
        self.name = name
        self.address = address
        self.hello = hello
        self.on_message = on_message
        self._writer: asyncio.StreamWriter | None = None
        self._records: RecordLayer | None = None
        self._next_id = 0
        self._task: asyncio.Task[None] | None = None
        #: Sessions opened; sessions ended, by reason; messages dropped while none was open.
        self.sessions = 0
        self.ended: dict[str, int] = {}
        self.dropped = 0

    @property
    def connected(self) -> bool:
        return self._writer is not None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="mapper-session")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._drop()

    def send(self, msg: Message) -> bool:
        """Send one message (its ``id`` is set here); False, and counted, when there is no
        session or the mapper is not keeping up."""
        writer, records = self._writer, self._records
        if writer is None or records is None or writer.is_closing():
            self.dropped += 1
            return False
        if writer.transport.get_write_buffer_size() > MAX_QUEUED:
            self.dropped += 1
            return False
        self._next_id += 1
        writer.write(encode_frame(records.seal({**msg, "id": self._next_id})))
        return True

    async def _run(self) -> None:
        backoff = FIRST_BACKOFF
        where = f"{self.name} at [{self.address[0]}]:{self.address[1]}"
        while True:
            reason = "closed"
            try:
                reader = await self._open()
                backoff = FIRST_BACKOFF
                self.sessions += 1
                log.info("event=mapper_session_open mapper=%s", where)
                self.send(self.hello())
                await self._read(reader)
            except (ControlError, AuthError) as exc:
                reason = exc.reason
            except PeerError as exc:
                reason = getattr(exc, "reason", "bad_message")
            except OSError as exc:
                reason = "unreachable" if self._writer is None else "lost"
                log.debug("event=mapper_session_error error=%s", exc)
            except TimeoutError:
                reason = "timeout"
            was = self.connected
            self._drop()
            self.ended[reason] = self.ended.get(reason, 0) + 1
            if was:
                log.warning("event=mapper_session_lost mapper=%s reason=%s", where, reason)
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF, backoff * 2)

    async def _open(self) -> asyncio.StreamReader:
        initiator = Initiator(self.creds, self.name)
        async with asyncio.timeout(HANDSHAKE_TIMEOUT):
            reader, writer = await asyncio.open_connection(*self.address)
            try:
                await initiate(initiator, reader, writer, self.name)
            except BaseException:
                writer.close()
                raise
        keepalive(writer)
        self._writer = writer
        self._records = RecordLayer(initiator.result)
        return reader

    async def _read(self, reader: asyncio.StreamReader) -> None:
        records = self._records
        assert records is not None  # set by _open
        while True:
            body = await read_frame(reader, records.frame_limit, FRAME_TIMEOUT)
            if body is None:
                raise ControlError("eof", "the mapper closed the session")
            self.on_message(records.open(body))

    def _drop(self) -> None:
        writer, self._writer, self._records = self._writer, None, None
        if writer is not None:
            writer.close()
