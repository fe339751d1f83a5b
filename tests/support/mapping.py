"""An agent made by hand, for the mapper's tests: it authenticates as a host with the
cluster's credentials and then says exactly what a test wants, well-formed or not (a record
replayed, a tag forged, another host's loops)."""

from __future__ import annotations

import asyncio
from typing import Any

from mrcstack.daemons.mrcd.agent.session import initiate
from mrcstack.daemons.mrcd.control.auth import Credentials, Initiator
from mrcstack.daemons.mrcd.control.records import (
    ControlError,
    RecordLayer,
    encode_frame,
    read_frame,
)

WAIT = 30.0


class HandAgent:
    """One session to the mapper at ``address`` as ``creds.host``."""

    def __init__(self, creds: Credentials, address: tuple[str, int], mapper: str = "mapper"):
        self.creds = creds
        self.address = address
        self.mapper = mapper
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.records: RecordLayer | None = None
        self.next_id = 0

    async def connect(self) -> None:
        """The handshake; raises what the mapper's refusal causes (it closes silently)."""
        initiator = Initiator(self.creds, self.mapper)
        reader, writer = await asyncio.open_connection(*self.address)
        try:
            await asyncio.wait_for(initiate(initiator, reader, writer, self.mapper), WAIT)
        except ControlError:
            writer.close()
            raise ConnectionError("the mapper refused the handshake") from None
        self.reader, self.writer = reader, writer
        self.records = RecordLayer(initiator.result)

    def frame(self, msg: dict[str, Any]) -> bytes:
        """``msg`` sealed as the next record (not sent)."""
        assert self.records is not None, "connect first"
        self.next_id += 1
        return encode_frame(self.records.seal({**msg, "id": self.next_id}))

    async def send(self, msg: dict[str, Any]) -> bytes:
        frame = self.frame(msg)
        await self.send_raw(frame)
        return frame

    async def send_raw(self, frame: bytes) -> None:
        assert self.writer is not None, "connect first"
        self.writer.write(frame)
        await self.writer.drain()

    async def recv(self) -> dict[str, Any] | None:
        """The mapper's next message; None once it closed the session."""
        assert self.reader is not None and self.records is not None, "connect first"
        try:
            body = await asyncio.wait_for(read_frame(self.reader, 1 << 20), WAIT)
        except (ConnectionError, asyncio.IncompleteReadError):
            return None
        return None if body is None else self.records.open(body)

    async def closed(self) -> bool:
        """True once the mapper ends the session (messages before that are skipped)."""
        while await self.recv() is not None:
            pass
        return True

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
