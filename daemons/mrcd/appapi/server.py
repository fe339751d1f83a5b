"""mrcd's Unix-socket server for the application API and the controller API.

One :class:`Session` per client connection.  A session owns, at most, one node Context (a
protection domain: regions, QPs, listeners) plus its CQs and completion channels, all torn
down when the client goes away.  Frames are the ones of :mod:`mrcstack.api.wire`: JSON for
control operations, packed structs for posts and completions.  Controller operations
(``ctl.*``) go to :class:`..ctlapi.controller.Controller`; the peer's uid (SO_PEERCRED)
decides whether it may change anything.

Nothing a client sends is trusted: every key, offset and length is checked against mrcd's
own records, and a bad request gets an error reply while the session keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
import struct
from pathlib import Path

from mrcstack.daemons.mrcd.appapi.clientio import ClientIO, Peer
from mrcstack.daemons.mrcd.appapi.session import Session
from mrcstack.daemons.mrcd.appapi.views import Connector
from mrcstack.daemons.mrcd.ctlapi.controller import Controller
from mrcstack.daemons.mrcd.node.node import Node
from mrcstack.errors import LocalError

log = logging.getLogger("mrcd.api")


#: Seconds :meth:`AppServer.stop` waits for clients to read what is queued for them.
LINGER = 1.0
_CREDS = struct.Struct("3i")


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
