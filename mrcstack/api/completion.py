"""Completion queues and completion channels (mrc.h's CQ calls), sync and asyncio.

A CQ fills as the context's socket is read (by any call that reads it); ``poll`` drains the
socket without blocking first.  A completion channel is a socketpair end passed to mrcd:
for every armed CQ that got completions mrcd writes ``(cq, seq)`` there after sending them,
and ``get_cq_event`` reads the main socket until the CQ holds ``seq`` completions.
"""

from __future__ import annotations

import asyncio
import errno
import select
import socket
import time
from collections import deque
from typing import Protocol

from mrcstack.api import wire
from mrcstack.api.client import MrcdSocket
from mrcstack.api.errors import ApiError, invalid
from mrcstack.api.limits import U32
from mrcstack.api.types import WorkCompletion


class Context(Protocol):
    """What CQs and channels need of their context (:class:`mrcstack.api.verbs.Context`):
    its connection to mrcd and its tables of CQs and channels."""

    conn: MrcdSocket
    cqs: dict[int, CompletionQueue]
    channels: dict[int, CompletionChannel]


HALF_U32 = 1 << 31


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _behind(count: int, target: int) -> bool:
    """``count`` has not reached ``target`` yet (u32 counters that wrap)."""
    return 0 < (target - count) & U32 < HALF_U32


class CompletionChannel:
    """``mrc_comp_channel``: a selectable fd that becomes readable on CQ events."""

    def __init__(self, ctx: Context, handle: int, sock: socket.socket) -> None:
        self.context = ctx
        self.handle = handle
        self._sock = sock
        self._buf = bytearray()
        self._unacked: dict[int, int] = {}  # CQ handle -> events returned, not yet acked

    def fileno(self) -> int:
        return self._sock.fileno()

    def _record(self) -> tuple[int, int] | None:
        if len(self._buf) < wire.CQ_EVENT.size:
            return None
        cq, seq = wire.CQ_EVENT.unpack_from(self._buf)
        del self._buf[: wire.CQ_EVENT.size]
        return cq, seq

    def _read(self, block: bool, timeout: float | None) -> None:
        if block:
            ready, _, _ = select.select([self._sock], [], [], timeout)
            if not ready:
                return
        try:
            data = self._sock.recv(4096, 0 if block else socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            raise ApiError(errno.ECONNRESET, "mrcd closed the completion channel")
        self._buf += data

    def _take(self) -> tuple[CompletionQueue, int] | None:
        while (rec := self._record()) is not None:
            cq = self.context.cqs.get(rec[0])
            if cq is not None:
                return cq, rec[1]
        return None

    def get_cq_event(self, timeout: float | None = None) -> CompletionQueue | None:
        """``mrc_get_cq_event``: wait for an armed CQ to get a completion; None on timeout.

        When it returns, the CQ's completions up to the event are already in the CQ.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        self._read(False, None)
        while (got := self._take()) is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if left == 0.0:
                return None
            self._read(True, left)
        cq, seq = got
        self.context.conn.wait_for(lambda: cq.reached(seq))
        self._returned(cq)
        return cq

    async def get_cq_event_async(self) -> CompletionQueue:
        loop = asyncio.get_running_loop()
        while (got := self._take()) is None:
            self._read(False, None)
            if self._buf:
                continue
            fut: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self.fileno(), _set_done, fut)
            try:
                await fut
            finally:
                loop.remove_reader(self.fileno())
        cq, seq = got
        await self.context.conn.wait_until(lambda: cq.reached(seq))
        self._returned(cq)
        return cq

    def _returned(self, cq: CompletionQueue) -> None:
        self._unacked[cq.handle] = self._unacked.get(cq.handle, 0) + 1

    def ack_cq_events(self, cq: CompletionQueue, nevents: int) -> None:
        """``mrc_ack_cq_events`` (bookkeeping only: Python needs no release of events)."""
        self._unacked[cq.handle] = max(0, self._unacked.get(cq.handle, 0) - nevents)

    def unacked_events(self, cq: CompletionQueue) -> int:
        """Events of ``cq`` this channel returned and :meth:`ack_cq_events` has not acked."""
        return self._unacked.get(cq.handle, 0)

    def destroy(self) -> None:
        """``mrc_destroy_comp_channel`` (EBUSY while CQs use it)."""
        self.context.conn.call("destroy_comp_channel", {"channel": self.handle})
        self.context.channels.pop(self.handle, None)
        self.close()

    def close(self) -> None:
        """Close this end only (the context is closing: mrcd closes its end)."""
        self._sock.close()


class CompletionQueue:
    """``mrc_cq``: completions in order; ``poll``, ``req_notify``, ``await wait()``."""

    def __init__(
        self, ctx: Context, handle: int, cqe: int, channel: CompletionChannel | None, user: object
    ) -> None:
        self.context = ctx
        self.handle = handle
        self.cqe = cqe
        self.channel = channel
        self.cq_context = user
        self._entries: deque[WorkCompletion] = deque()
        self._received = 0  # completions mrcd has sent for this CQ (u32, wraps)

    def deliver(self, wc: WorkCompletion) -> None:
        """Queue a completion mrcd sent for this CQ (the context's socket reader calls it)."""
        self._entries.append(wc)
        self._received = (self._received + 1) & U32

    def reached(self, seq: int) -> bool:
        """Has this CQ received mrcd's ``seq``-th completion (a CQ event's ``seq``)?"""
        return not _behind(self._received, seq)

    def poll(self, num_entries: int = 1) -> list[WorkCompletion]:
        """``mrc_poll_cq``: up to ``num_entries`` completions, oldest first; never blocks."""
        if len(self._entries) < num_entries:
            self.context.conn.pump(block=False)
        entries = self._entries
        return [entries.popleft() for _ in range(min(num_entries, len(entries)))]

    def poll_wait(self, num_entries: int = 1, timeout: float | None = None) -> list[WorkCompletion]:
        """Like :meth:`poll`, but block until at least one completion (or ``timeout``)."""
        conn = self.context.conn
        if not conn.wait_for(lambda: bool(self._entries), timeout):
            conn.check_open()
        return self.poll(num_entries)

    def req_notify(self, solicited_only: bool = False) -> None:
        """``mrc_req_notify_cq``: the next completion signals this CQ's channel once."""
        if self.channel is None:
            raise invalid("req_notify needs a CQ created with a completion channel")
        self.context.conn.send(
            wire.frame(wire.Kind.ARM_CQ, wire.ARM_CQ.pack(self.handle, int(solicited_only)))
        )

    async def wait(self) -> None:
        """Return once at least one completion is waiting to be polled."""
        await self.context.conn.wait_until(lambda: bool(self._entries))

    def __aiter__(self) -> CompletionQueue:
        return self

    async def __anext__(self) -> WorkCompletion:
        await self.wait()
        return self._entries.popleft()

    def destroy(self) -> None:
        self.context.conn.call("destroy_cq", {"cq": self.handle})
        self.context.cqs.pop(self.handle, None)
