"""A client of mrcd's API socket: who it is (:class:`Peer`) and its framed, non-blocking I/O
with SCM_RIGHTS descriptors (:class:`ClientIO`)."""

from __future__ import annotations

import array
import asyncio
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from mrcstack.api import wire

RECV_SIZE = 1 << 18
READS_PER_CALLBACK = 16
#: A client whose unread replies and completions exceed this is dropped (it stopped reading).
WRITE_LIMIT = 64 << 20
#: Descriptors a client may have in flight before the request that consumes them arrives.
MAX_PENDING_FDS = 8


@dataclass(frozen=True, slots=True)
class Peer:
    """Who is on the other end (SO_PEERCRED at connect time)."""

    pid: int
    uid: int
    gid: int


class ClientIO:
    """Non-blocking framed I/O on one accepted socket, with SCM_RIGHTS descriptors."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self.loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        self.on_frame: Callable[[int, bytes], None] = lambda kind, body: None
        self.on_close: Callable[[str], None] = lambda reason: None
        self.fds: list[int] = []
        self.rbuf = bytearray()
        # Received into one buffer made once: a fresh RECV_SIZE bytes object per read would
        # cost an mmap, an mremap and a munmap each time (it is past malloc's mmap threshold).
        self._recv_buf = bytearray(RECV_SIZE)
        self._recv_view = memoryview(self._recv_buf)
        self.wbuf = bytearray()
        self.closed = False
        sock.setblocking(False)

    def start(
        self, on_frame: Callable[[int, bytes], None], on_close: Callable[[str], None]
    ) -> None:
        self.on_frame = on_frame
        self.on_close = on_close
        self.loop.add_reader(self.fd, self._on_readable)

    @property
    def backlog(self) -> int:
        return len(self.wbuf)

    def _on_readable(self) -> None:
        cmsg = socket.CMSG_SPACE(wire.MAX_FDS * 4)
        for _ in range(READS_PER_CALLBACK):
            try:
                n, anc, flags, _ = self.sock.recvmsg_into(
                    (self._recv_buf,), cmsg, socket.MSG_CMSG_CLOEXEC
                )
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.close(f"read error: {exc.strerror}")
                return
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(cdata[: len(cdata) - len(cdata) % fds.itemsize])
                    self.fds.extend(fds)
            if flags & socket.MSG_CTRUNC or len(self.fds) > MAX_PENDING_FDS:
                self.close("protocol error: too many file descriptors")
                return
            if not n:
                self.close("client closed the connection")
                return
            self.rbuf += self._recv_view[:n]
            try:
                frames = wire.split_frames(self.rbuf)
            except ValueError as exc:
                self.close(f"protocol error: {exc}")
                return
            for kind, body in frames:
                self.on_frame(kind, body)
                if self.closed:
                    return
            if n < RECV_SIZE:
                return

    def take_fds(self, n: int) -> list[int] | None:
        if n > len(self.fds):
            return None
        taken, self.fds = self.fds[:n], self.fds[n:]
        return taken

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if not self.wbuf:
            try:
                n = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as exc:
                self.close(f"write error: {exc.strerror}")
                return
            if n == len(data):
                return
            self.wbuf += memoryview(data)[n:]
            self.loop.add_writer(self.fd, self._on_writable)
        else:
            self.wbuf += data
        if len(self.wbuf) > WRITE_LIMIT:
            self.close(f"client stopped reading ({len(self.wbuf)} bytes unread)")

    def _on_writable(self) -> None:
        try:
            n = self.sock.send(self.wbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.close(f"write error: {exc.strerror}")
            return
        del self.wbuf[:n]
        if not self.wbuf:
            self.loop.remove_writer(self.fd)

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.fd)
        if self.wbuf:
            self.loop.remove_writer(self.fd)
            self.wbuf.clear()
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()
        self.sock.close()
        self.on_close(reason)
