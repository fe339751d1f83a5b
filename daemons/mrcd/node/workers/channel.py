"""One message channel between the daemon and a worker: a Unix ``SOCK_SEQPACKET`` pair.

Each message is one pickled record (:mod:`.messages`) in one packet, so the kernel keeps the
boundaries and a memfd rides with its message as ``SCM_RIGHTS``.  Neither end ever blocks on
the other: what a full socket does not take waits in order for the loop's writable callback,
so a worker busy sending events still reads its posts, and the daemon is never stalled by a
slow or dead worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import socket
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

#: Socket buffers of the pair: an event batch or a status is one packet and must fit.
BUFFER = 16 << 20
#: The largest message one receive takes.
MAX_MESSAGE = 4 << 20

In = TypeVar("In")
Out = TypeVar("Out")


def pair() -> tuple[socket.socket, socket.socket]:
    """The two ends of a new channel (the daemon's, the worker's)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for sock in (ours, theirs):
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, opt, BUFFER)
    return ours, theirs


class Channel(Generic[In, Out]):
    """Sends ``Out`` records, hands each received ``In`` (with the descriptors that came with
    it) to ``on_message``; ``on_closed`` once when the other end is gone."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        on_message: Callable[[In, list[int]], None],
        on_closed: Callable[[], None],
    ) -> None:
        self.loop = loop
        self.sock = sock
        self.on_message = on_message
        self.on_closed = on_closed
        self._queue: deque[tuple[bytes, list[int]]] = deque()
        self._closed = False
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._on_readable)

    def send(self, message: Out, fds: list[int] | None = None) -> None:
        """Send ``message`` (and ``fds``, which the caller still owns and may close after);
        nothing happens once the other end is gone."""
        if self._closed:
            return
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        if self._queue:
            self._queue.append((data, [os.dup(fd) for fd in fds or ()]))
            return
        try:
            self._sendmsg(data, fds or [])
        except BlockingIOError:
            self._queue.append((data, [os.dup(fd) for fd in fds or ()]))
            self.loop.add_writer(self.sock.fileno(), self._on_writable)
        except OSError:
            self._lost()

    def _sendmsg(self, data: bytes, fds: list[int]) -> None:
        if fds:
            socket.send_fds(self.sock, [data], fds)
        else:
            self.sock.send(data)

    def _on_writable(self) -> None:
        queue = self._queue
        while queue:
            data, fds = queue[0]
            try:
                self._sendmsg(data, fds)
            except BlockingIOError:
                return
            except OSError:
                self._lost()
                return
            queue.popleft()
            for fd in fds:
                os.close(fd)
        self.loop.remove_writer(self.sock.fileno())

    def _on_readable(self) -> None:
        while not self._closed:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE, 4)
            except BlockingIOError:
                return
            except OSError:
                self._lost()
                return
            if not data:
                self._lost()
                return
            self.on_message(pickle.loads(data), fds)

    def _lost(self) -> None:
        if not self._closed:
            self.close()
            self.on_closed()

    def close(self) -> None:
        """Stop reading and writing and close the socket (idempotent)."""
        if self._closed:
            return
        self._closed = True
        fd = self.sock.fileno()
        if fd >= 0:
            self.loop.remove_reader(fd)
            self.loop.remove_writer(fd)
        self.sock.close()
        for _data, fds in self._queue:
            for each in fds:
                with contextlib.suppress(OSError):
                    os.close(each)
        self._queue.clear()
