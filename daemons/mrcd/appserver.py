"""mrcd's Unix-socket server for the application API and the controller API.

One :class:`Session` per client connection.  A session owns, at most, one node Context (a
protection domain: regions, QPs, listeners) plus its CQs and completion channels, all torn
down when the client goes away.  Frames are the ones of :mod:`mrcstack.api.wire`: JSON for
control operations, packed structs for posts and completions.  Controller operations
(``ctl.*``) go to :class:`daemons.mrcd.ctlapi.Controller`; the peer's uid (SO_PEERCRED)
decides whether it may change anything.

Nothing a client sends is trusted: every key, offset and length is checked against mrcd's
own records, and a bad request gets an error reply while the session keeps serving.
"""

from __future__ import annotations

import array
import asyncio
import logging
import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from daemons.mrcd.appsession import Session
from daemons.mrcd.ctlapi import Controller
from daemons.mrcd.node import Node
from mrcstack.api import wire
from mrcstack.core.errors import LocalError

log = logging.getLogger("mrcd.api")

#: connect(qpn, remote_host, service, private_data) -> the peer's private data, QP in RTS.
Connector = Callable[[int, int, int, bytes], Awaitable[bytes]]

RECV_SIZE = 1 << 18
READS_PER_CALLBACK = 16
#: A client whose unread replies and completions exceed this is dropped (it stopped reading).
WRITE_LIMIT = 64 << 20
#: Descriptors a client may have in flight before the request that consumes them arrives.
MAX_PENDING_FDS = 8
#: Seconds :meth:`AppServer.stop` waits for clients to read what is queued for them.
LINGER = 1.0
_CREDS = struct.Struct("3i")


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
                data, anc, flags, _ = self.sock.recvmsg(RECV_SIZE, cmsg, socket.MSG_CMSG_CLOEXEC)
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
            if not data:
                self.close("client closed the connection")
                return
            self.rbuf += data
            try:
                frames = wire.split_frames(self.rbuf)
            except ValueError as exc:
                self.close(f"protocol error: {exc}")
                return
            for kind, body in frames:
                self.on_frame(kind, body)
                if self.closed:
                    return
            if len(data) < RECV_SIZE:
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


class AppServer:
    """The API socket of one mrcd: ``await start()``, ``await stop()``."""

    def __init__(
        self,
        node: Node,
        path: str | os.PathLike[str],
        *,
        controller: Controller | None = None,
        connector: Connector | None = None,
        admin_uids: frozenset[int] = frozenset({0}),
        mode: int = 0o660,
    ) -> None:
        self.node = node
        self.path = Path(path)
        self.controller = controller if controller is not None else Controller(node)
        self.connector: Connector = connector if connector is not None else node.connect_qp
        self.admin_uids = admin_uids
        self.mode = mode
        self.sessions: set[Session] = set()
        self._sock: socket.socket | None = None
        self._inode: tuple[int, int] | None = None

    async def start(self) -> None:
        loop = self.node.loop
        self._remove_stale()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(os.fspath(self.path))
            os.chmod(self.path, self.mode)
            sock.listen(128)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise LocalError(f"cannot listen on {self.path}: {exc.strerror}") from None
        st = os.stat(self.path)
        self._inode = (st.st_dev, st.st_ino)
        self._sock = sock
        loop.add_reader(sock.fileno(), self._on_accept)
        log.info("event=api_listening socket=%s mode=%o", self.path, self.mode)

    def _remove_stale(self) -> None:
        """A socket file left by a crashed mrcd is removed; a live one is an error."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise LocalError(f"{self.path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            probe.connect(os.fspath(self.path))
        except OSError:
            self.path.unlink(missing_ok=True)
        else:
            raise LocalError(f"another mrcd is serving {self.path}")
        finally:
            probe.close()

    def _on_accept(self) -> None:
        lsock = self._sock
        if lsock is None:
            return
        while True:
            try:
                conn, _ = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("event=api_accept_failed error=%r", exc.strerror)
                return
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            pid, uid, gid = _CREDS.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
            )
            io = ClientIO(self.node.loop, conn)
            session = Session(self, Peer(pid, uid, gid), io)
            io.start(session.on_frame, session.on_close)
            self.sessions.add(session)
            log.debug("event=api_client pid=%d uid=%d", pid, uid)

    def privileged(self, peer: Peer) -> bool:
        return peer.uid in self.admin_uids

    def forget(self, session: Session) -> None:
        self.sessions.discard(session)

    async def stop(self) -> None:
        """Tell every client mrcd is going away, tear their contexts down, remove the socket."""
        sock, self._sock = self._sock, None
        if sock is not None:
            self.node.loop.remove_reader(sock.fileno())
            sock.close()
        # What is already queued for a client (the completions of its flushed writes) is
        # written before its connection closes, unless it stops reading for LINGER s.
        for session in self.sessions:
            session.flush()
        deadline = self.node.loop.time() + LINGER
        while any(s.io.backlog for s in self.sessions) and self.node.loop.time() < deadline:
            await asyncio.sleep(0.005)
        for session in list(self.sessions):
            session.shutdown("mrcd stopping")
        self.sessions.clear()
        self.controller.close()
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._inode:
                self.path.unlink()
        except FileNotFoundError:
            pass
        log.info("event=api_stopped socket=%s", self.path)
