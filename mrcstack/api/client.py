"""One client socket to mrcd: frames out, replies matched to requests, the rest dispatched.

No background thread: whoever needs something from the socket reads it (a blocking call
waiting for its reply, ``cq.poll`` draining without blocking, an asyncio reader installed
while coroutines wait), and every frame read is dispatched at once: replies to the table
their callers look in, completions to their CQs, events to their context.  A lock keeps
two threads from reading at the same time; the other one finds its reply already there.
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mrcstack.api import wire
from mrcstack.api.errors import ApiError
from mrcstack.api.limits import U32

RECV_SIZE = 1 << 18
#: The longest a thread waiting for another thread's read sleeps before it re-checks its
#: own condition (s); the reading thread wakes it as soon as it has dispatched a read.
LOCK_SLICE = 0.01

CompletionSink = Callable[[list[tuple[int, ...]]], None]
EventSink = Callable[[dict[str, Any]], None]


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class MrcdSocket:
    """The framed socket of one Device or Context (not thread-hostile, not thread-fast)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.connect(os.fspath(path))
        except OSError as exc:
            sock.close()
            raise ApiError(
                exc.errno or errno.ECONNREFUSED,
                f"cannot connect to mrcd at {path}: {exc.strerror or exc}",
            ) from None
        self._sock = sock
        self._rbuf = bytearray()
        self._chunk = bytearray(RECV_SIZE)
        self._rlock = threading.Lock()
        # Notified after every read: a thread waiting for its reply while another thread
        # reads (a poster beside a poller) wakes when the reply is dispatched.
        self._read_done = threading.Condition()
        self._undispatched = 0  # reads whose frames are not dispatched yet
        self._wlock = threading.Lock()
        self._ids = 0
        self._replies: dict[int, tuple[int, bytes]] = {}
        self._closed: str | None = None
        self.on_completions: CompletionSink | None = None
        self.on_event: EventSink | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._reader_loop: asyncio.AbstractEventLoop | None = None

    # Lifecycle ---------------------------------------------------------------------------
    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def close(self) -> None:
        if self._closed is None:
            self._closed = "connection closed by the application"
        self._drop_reader()
        self._sock.close()
        self._wake_waiters()

    def check_open(self) -> None:
        if self._closed is not None:
            raise ApiError(errno.ENOTCONN, self._closed)

    # Sending -----------------------------------------------------------------------------
    def next_id(self) -> int:
        self._ids = (self._ids + 1) & U32 or 1
        return self._ids

    def send(self, data: bytes, fds: Sequence[int] = ()) -> None:
        self.check_open()
        try:
            with self._wlock:
                if fds:
                    sent = socket.send_fds(self._sock, [data], list(fds))
                    if sent < len(data):
                        self._sock.sendall(data[sent:])
                else:
                    self._sock.sendall(data)
        except OSError as exc:
            self._lost(f"lost the connection to mrcd: {exc.strerror or exc}")
            raise ApiError(errno.ECONNRESET, self._closed or "connection lost") from None

    def call(
        self,
        op: str,
        args: dict[str, Any] | None = None,
        fds: Sequence[int] = (),
        timeout: float | None = None,
    ) -> Any:
        """A JSON request; returns its result or raises the daemon's ApiError."""
        req_id = self.next_id()
        self.send(wire.request(req_id, op, args or {}, len(fds)), fds)
        return self.reply(req_id, timeout, op)

    async def call_async(
        self, op: str, args: dict[str, Any] | None = None, fds: Sequence[int] = ()
    ) -> Any:
        req_id = self.next_id()
        self.send(wire.request(req_id, op, args or {}, len(fds)), fds)
        await self.wait_until(lambda: req_id in self._replies)
        kind, body = self._replies.pop(req_id)
        return self._result(kind, body)

    def post(self, data: bytes, req_id: int) -> None:
        """A POST_SEND / POST_RECV frame; raises ApiError naming the bad request's index."""
        self.send(data)
        self.reply(req_id, None, "post")

    def reply(self, req_id: int, timeout: float | None = None, what: str = "request") -> Any:
        """The result of request ``req_id`` (sent with :meth:`send`), or its ApiError.

        ``send`` and ``reply`` are the two halves of :meth:`call`: several requests may be
        sent in one write and their replies collected afterwards."""
        kind, body = self._wait_reply(req_id, timeout, what)
        return self._result(kind, body)

    @staticmethod
    def _result(kind: int, body: bytes) -> Any:
        if kind == wire.Kind.POST_REPLY:
            _, code, bad, message = wire.decode_post_reply(body)
            if code:
                raise ApiError(code, f"work request {bad}: {message}" if bad else message)
            return None
        _, doc = wire.decode_json(body, with_id=True)
        return wire.result_of(doc)

    # Receiving ---------------------------------------------------------------------------
    def _wait_reply(self, req_id: int, timeout: float | None, what: str) -> tuple[int, bytes]:
        if not self.wait_for(lambda: req_id in self._replies, timeout):
            self.check_open()
            raise ApiError(errno.ETIMEDOUT, f"{what}: no reply from mrcd in {timeout} s")
        return self._replies.pop(req_id)

    def wait_for(self, ready: Callable[[], bool], timeout: float | None = None) -> bool:
        """Read and dispatch until ``ready()`` (True), ``timeout`` seconds pass or the
        connection is gone (False).  ``timeout=0`` takes what is already there and checks."""
        if ready():
            return True
        self.pump(block=False)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not ready():
            left = None if deadline is None else deadline - time.monotonic()
            if (left is not None and left <= 0) or self._closed is not None:
                return False
            self.pump(block=True, timeout=left, until=ready)
        return True

    def pump(
        self, block: bool, timeout: float | None = None, until: Callable[[], bool] | None = None
    ) -> bool:
        """Read what is there (or wait for something when ``block``) and dispatch it.

        Returns True if a frame was dispatched.  A non-blocking pump while another thread
        reads does nothing: that thread dispatches for everyone.  A blocking one that had to
        wait for the reading thread first checks ``until()`` and does not block if it holds
        (that thread may have dispatched what this one waits for).
        """
        if self._closed is not None:
            return False
        if until is not None and block:
            # Another thread may be blocked reading for something else: wait for each of
            # its reads and check whether it dispatched what we wait for.
            while True:
                if self._rlock.acquire(blocking=False):
                    if not self._undispatched:
                        break
                    # Another thread read frames and has not dispatched them yet: what we
                    # wait for may be among them, and a read now could block for good.
                    self._rlock.release()
                with self._read_done:
                    if until() or self._closed is not None:
                        return False
                    if self._rlock.locked() or self._undispatched:
                        self._read_done.wait(LOCK_SLICE)
        elif not self._rlock.acquire(blocking=block):
            return False
        frames: list[tuple[int, bytes]] = []
        try:
            if self._closed is not None or (until is not None and until()):
                return False
            if block and timeout is not None:
                ready, _, _ = select.select([self._sock], [], [], max(timeout, 0.0))
                if not ready:
                    return False
            flags = 0 if block else socket.MSG_DONTWAIT
            try:
                n = self._sock.recv_into(self._chunk, RECV_SIZE, flags)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as exc:
                self._lost(f"lost the connection to mrcd: {exc.strerror or exc}")
                return False
            if n == 0:
                self._lost("mrcd closed the connection")
                return False
            self._rbuf += memoryview(self._chunk)[:n]
            # Take whatever else is already queued without blocking.
            while True:
                try:
                    n = self._sock.recv_into(self._chunk, RECV_SIZE, socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError, OSError):
                    break
                if n == 0:
                    break
                self._rbuf += memoryview(self._chunk)[:n]
                if n < RECV_SIZE:
                    break
            try:
                frames = wire.split_frames(self._rbuf)
            except ValueError as exc:
                self._lost(f"protocol error from mrcd: {exc}")
                return False
            if frames:
                with self._read_done:
                    self._undispatched += 1
        finally:
            self._rlock.release()
            self._notify_threads()  # the socket is free: a waiting thread may read it
        if not frames:
            return False
        try:
            for kind, body in frames:
                self._dispatch(kind, body)
        finally:
            with self._read_done:
                self._undispatched -= 1
        self._wake_waiters()
        return True

    def _dispatch(self, kind: int, body: bytes) -> None:
        if kind in (wire.Kind.REPLY, wire.Kind.POST_REPLY):
            (req_id,) = wire.REQ_ID.unpack_from(body)
            self._replies[req_id] = (kind, body)
        elif kind == wire.Kind.COMPLETIONS:
            if self.on_completions is not None:
                self.on_completions(list(wire.decode_completions(body)))
        elif kind == wire.Kind.EVENT:
            _, doc = wire.decode_json(body, with_id=False)
            if self.on_event is not None:
                self.on_event(doc)

    def _lost(self, why: str) -> None:
        if self._closed is None:
            self._closed = why
            if self.on_event is not None:
                self.on_event({"type": "async", "event": "device_fatal", "reason": why})
        self._wake_waiters()

    # asyncio -----------------------------------------------------------------------------
    async def wait_until(self, ready: Callable[[], bool]) -> None:
        """Await until ``ready()``; the socket is read by a loop reader meanwhile."""
        loop = asyncio.get_running_loop()
        while True:
            self.pump(block=False)
            if ready():
                return
            self.check_open()
            fut: asyncio.Future[None] = loop.create_future()
            entry = (loop, fut)
            self._waiters.append(entry)
            self._ensure_reader(loop)
            try:
                await fut
            finally:
                self._waiters.remove(entry)
                if not self._waiters:
                    self._drop_reader()

    def _ensure_reader(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._reader_loop is None and self._closed is None:
            loop.add_reader(self._sock.fileno(), self._on_readable)
            self._reader_loop = loop

    def _on_readable(self) -> None:
        if not self.pump(block=False) and self._closed is not None:
            self._drop_reader()

    def _drop_reader(self) -> None:
        loop, self._reader_loop = self._reader_loop, None
        fd = self._sock.fileno()
        if loop is not None and fd >= 0 and not loop.is_closed():
            loop.remove_reader(fd)

    def add_waiter_wakeup(self) -> None:
        """Something other than a frame changed (a local queue): re-check the waiters."""
        self._wake_waiters()

    def _notify_threads(self) -> None:
        with self._read_done:
            self._read_done.notify_all()

    def _wake_waiters(self) -> None:
        self._notify_threads()
        for loop, fut in list(self._waiters):
            if not loop.is_closed():
                loop.call_soon_threadsafe(_wake, fut)
