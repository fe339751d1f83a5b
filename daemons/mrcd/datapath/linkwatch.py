"""NIC link state from the kernel: a raw rtnetlink socket (no pyroute2) on the event loop.

``LinkWatcher`` subscribes to ``RTMGRP_LINK``, reads the current state with an
``RTM_GETLINK`` dump in :meth:`LinkWatcher.start`, then reports every change from
``RTM_NEWLINK`` / ``RTM_DELLINK`` notifications through ``callback(ifname, up)``.  A link is
up when it is administratively up (``IFF_UP``), has carrier (``IFF_LOWER_UP``) and its
``IFLA_OPERSTATE`` (when present) is ``UP`` or ``UNKNOWN`` (loopback, some tunnels).  The
callback runs only when a link's state changes (the kernel also sends ``RTM_NEWLINK`` for
MTU, address and statistics changes).

Messages are parsed by pure functions that never raise on truncated or garbage input.  If
the socket overflows (``ENOBUFS``: notifications were lost), the watcher dumps again.

Kernel note: carrier changes reach netlink through the kernel's linkwatch work.  Stacked
devices (veth, VLANs) are urgent and notified at once; a physical NIC's carrier change may
wait up to one second (the kernel runs non-urgent link events at most once per second,
against storms), so a port failure on real hardware is seen within about a second.
Measured here (veth, tests/daemons/test_linkwatch.py): admin and carrier changes reach the
callback 2-3 ms after the ``ip`` command starts, before ``ip`` itself exits.

``python -m mrcstack.daemons.mrcd.datapath.linkwatch [--json] [IFNAME ...]`` prints the
changes as they come.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import errno
import json
import logging
import os
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

log = logging.getLogger("mrcd.linkwatch")

# <linux/netlink.h>
NETLINK_ROUTE = 0
NLMSG_NOOP = 1
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSG_OVERRUN = 4
NLM_F_REQUEST = 0x01
NLM_F_MULTI = 0x02
NLM_F_DUMP = 0x300  # NLM_F_ROOT | NLM_F_MATCH
NLM_F_DUMP_INTR = 0x10
# <linux/rtnetlink.h>
RTM_NEWLINK = 16
RTM_DELLINK = 17
RTM_GETLINK = 18
RTMGRP_LINK = 0x1
# <linux/if_link.h>
IFLA_IFNAME = 3
IFLA_OPERSTATE = 16
# <linux/if.h>
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000

#: struct nlmsghdr: len, type, flags, seq, pid.
NLMSGHDR = struct.Struct("=IHHII")
#: struct ifinfomsg: family, pad, type, index, flags, change.
IFINFOMSG = struct.Struct("=BxHiII")
#: struct rtattr: len, type.
RTATTR = struct.Struct("=HH")
#: struct nlmsgerr starts with the (negative) errno.
NLMSGERR = struct.Struct("=i")
NLMSG_ALIGNTO = 4
RECV_BUFFER = 1 << 16
SOCKET_BUFFER = 1 << 20
#: Messages drained per readable callback before yielding to the loop.
DRAIN_LIMIT = 64
DUMP_TIMEOUT = 5.0


class OperState(enum.IntEnum):
    """RFC 2863 operational states (IF_OPER_* in <linux/if.h>)."""

    UNKNOWN = 0
    NOTPRESENT = 1
    DOWN = 2
    LOWERLAYERDOWN = 3
    TESTING = 4
    DORMANT = 5
    UP = 6


_OPER_OK = (OperState.UP, OperState.UNKNOWN)


def _align(n: int) -> int:
    return (n + NLMSG_ALIGNTO - 1) & ~(NLMSG_ALIGNTO - 1)


@dataclass(frozen=True, slots=True)
class LinkMessage:
    """One RTM_NEWLINK / RTM_DELLINK, reduced to what link state needs."""

    deleted: bool
    index: int
    ifname: str | None
    flags: int
    operstate: int | None
    seq: int

    @property
    def up(self) -> bool:
        if self.deleted or not self.flags & IFF_UP or not self.flags & IFF_LOWER_UP:
            return False
        return self.operstate is None or self.operstate in _OPER_OK


@dataclass(frozen=True, slots=True)
class Control:
    """NLMSG_DONE or NLMSG_ERROR for request ``seq`` (``error`` is a positive errno or 0)."""

    seq: int
    done: bool
    error: int = 0
    interrupted: bool = False


Message = LinkMessage | Control


def parse_messages(data: bytes | memoryview) -> Iterator[Message]:
    """The link and control messages in one netlink datagram (possibly multipart).

    Never raises: a truncated or malformed message ends the datagram; a bad attribute ends
    that message's attributes; unknown message types are skipped.
    """
    view = memoryview(data)
    offset = 0
    while offset + NLMSGHDR.size <= len(view):
        length, mtype, flags, seq, _pid = NLMSGHDR.unpack_from(view, offset)
        if length < NLMSGHDR.size or offset + length > len(view):
            return  # garbage or truncated: the rest of the datagram cannot be trusted
        body = view[offset + NLMSGHDR.size : offset + length]
        offset += _align(length)
        if mtype in (RTM_NEWLINK, RTM_DELLINK):
            msg = _parse_link(body, mtype == RTM_DELLINK, seq)
            if msg is not None:
                yield msg
        elif mtype == NLMSG_DONE:
            yield Control(seq, done=True, interrupted=bool(flags & NLM_F_DUMP_INTR))
        elif mtype == NLMSG_ERROR:
            code = NLMSGERR.unpack_from(body)[0] if len(body) >= NLMSGERR.size else -errno.EIO
            yield Control(seq, done=True, error=-code if code < 0 else code)
        elif mtype == NLMSG_OVERRUN:
            yield Control(seq, done=False, error=errno.ENOBUFS)


def _parse_link(body: memoryview, deleted: bool, seq: int) -> LinkMessage | None:
    if len(body) < IFINFOMSG.size:
        return None
    _family, _type, index, flags, _change = IFINFOMSG.unpack_from(body)
    ifname: str | None = None
    operstate: int | None = None
    offset = _align(IFINFOMSG.size)
    while offset + RTATTR.size <= len(body):
        alen, atype = RTATTR.unpack_from(body, offset)
        if alen < RTATTR.size or offset + alen > len(body):
            break
        payload = body[offset + RTATTR.size : offset + alen]
        atype &= 0x3FFF  # drop NLA_F_NESTED / NLA_F_NET_BYTEORDER
        if atype == IFLA_IFNAME:
            raw = bytes(payload).split(b"\0", 1)[0]
            ifname = raw.decode("utf-8", "replace") or None
        elif atype == IFLA_OPERSTATE and len(payload) >= 1:
            operstate = payload[0]
        offset += _align(alen)
    return LinkMessage(deleted, index, ifname, flags, operstate, seq)


def getlink_dump_request(seq: int) -> bytes:
    """RTM_GETLINK with NLM_F_DUMP: every link of the namespace."""
    ifi = IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    hdr = NLMSGHDR.pack(NLMSGHDR.size + len(ifi), RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, seq, 0)
    return hdr + ifi


LinkCallback = Callable[[str, bool], None]


class LinkWatcher:
    """Reports ``callback(ifname, up)`` for the links named in ``ifnames`` (None: all).

    :meth:`start` opens the socket, reports every current link once, then watches on the
    loop; :meth:`stop` closes it.  Exceptions from ``callback`` are logged, never raised
    into the loop.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        callback: LinkCallback,
        ifnames: set[str] | None = None,
    ) -> None:
        self.loop = loop
        self.callback = callback
        self.ifnames = None if ifnames is None else frozenset(ifnames)
        self.state: dict[str, bool] = {}  # last reported state per name
        self.redumps = 0  # dumps after lost notifications (ENOBUFS) or interrupted dumps
        self._names: dict[int, str] = {}  # ifindex -> name (renames, RTM_DELLINK)
        self._sock: socket.socket | None = None
        self._seq = int(time.time()) & 0xFFFF_FFFF
        self._dump_seq: int | None = None

    # Lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Subscribe, read the current state (callbacks run here), then watch on the loop."""
        if self._sock is not None:
            raise RuntimeError("link watcher already started")
        sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE
        )
        try:
            with contextlib.suppress(OSError):  # the default works; overflows trigger a dump
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
            sock.bind((0, RTMGRP_LINK))
            sock.settimeout(DUMP_TIMEOUT)
            self._sock = sock
            self._request_dump(sock)
            while self._dump_seq is not None:  # synchronous initial dump
                self._handle(sock.recv(RECV_BUFFER))
            sock.setblocking(False)
            self.loop.add_reader(sock.fileno(), self._on_readable)
        except BaseException:
            self._sock = None
            sock.close()
            raise

    def stop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            self.loop.remove_reader(sock.fileno())
            sock.close()

    # Reading ----------------------------------------------------------------------------
    def _request_dump(self, sock: socket.socket) -> None:
        self._seq = (self._seq + 1) & 0xFFFF_FFFF
        self._dump_seq = self._seq
        sock.send(getlink_dump_request(self._seq))

    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        for _ in range(DRAIN_LIMIT):
            try:
                data = sock.recv(RECV_BUFFER)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self._lost("socket overflow")
                    continue
                log.warning("event=linkwatch_error error=%r", exc)
                return
            try:
                self._handle(data)
            except Exception:  # never into the loop
                log.exception("event=linkwatch_parse_failed")

    def _lost(self, why: str) -> None:
        """Notifications were lost: read the whole state again."""
        self.redumps += 1
        log.warning("event=linkwatch_resync reason=%r", why)
        if self._sock is None:
            return
        try:
            self._request_dump(self._sock)
        except OSError as exc:
            self._dump_seq = None
            log.warning("event=linkwatch_error error=%r", exc)

    def _handle(self, data: bytes) -> None:
        for msg in parse_messages(data):
            if isinstance(msg, LinkMessage):
                self._update(msg)
            elif msg.seq == self._dump_seq and msg.done:
                self._dump_seq = None
                if msg.error:
                    log.warning("event=linkwatch_dump_failed errno=%d", msg.error)
                elif msg.interrupted:  # links changed mid-dump: read them again
                    self._lost("dump interrupted")
            elif msg.error == errno.ENOBUFS:
                self._lost("overrun")

    def _update(self, msg: LinkMessage) -> None:
        old = self._names.get(msg.index)
        name = msg.ifname or old
        if name is None:
            return
        if msg.deleted:
            self._names.pop(msg.index, None)
        else:
            self._names[msg.index] = name
            if old is not None and old != name:  # renamed: the old name is gone
                self._report(old, False)
                self.state.pop(old, None)
        self._report(name, msg.up)
        if msg.deleted:
            self.state.pop(name, None)

    def _report(self, name: str, up: bool) -> None:
        if self.ifnames is not None and name not in self.ifnames:
            return
        if self.state.get(name) is up:
            return
        self.state[name] = up
        try:
            self.callback(name, up)
        except Exception:
            log.exception("event=linkwatch_callback_failed ifname=%s", name)


def watch_planes(
    loop: asyncio.AbstractEventLoop,
    interfaces: Sequence[str],
    set_link: Callable[[int, bool], None],
) -> LinkWatcher:
    """Watch plane p's interface ``interfaces[p]``, reporting ``set_link(p, up)``; started.

    An interface that does not exist is named in one warning line: its plane counts as up
    until the interface appears (then its state is reported like any other's).
    """
    planes = {name: plane for plane, name in enumerate(interfaces)}
    watcher = LinkWatcher(loop, lambda name, up: set_link(planes[name], up), set(planes))
    watcher.start()
    missing = [name for name in interfaces if name not in watcher.state]
    if missing:
        log.warning(
            "event=interfaces_missing names=%s planes=%s hint=%r",
            ",".join(missing),
            ",".join(str(planes[name]) for name in missing),
            "set mrcd.interfaces to this host's NIC port of each plane",
        )
    return watcher


# A tiny CLI for operators and tests -----------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mrcstack.daemons.mrcd.datapath.linkwatch",
        description="Print link up/down changes.",
    )
    parser.add_argument("ifnames", nargs="*", help="links to watch (default: all)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)

    def report(name: str, up: bool) -> None:
        now = time.time()
        if args.json:
            line = json.dumps({"ifname": name, "up": up, "time": now})
        else:
            line = f"{now:.6f} {name} {'up' if up else 'down'}"
        print(line, flush=True)

    async def run() -> None:
        watcher = LinkWatcher(asyncio.get_running_loop(), report, set(args.ifnames) or None)
        watcher.start()
        if args.json:
            print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            watcher.stop()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        print(f"linkwatch: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
