"""Batched datagram receive with each datagram's flow information: ``recvmmsg(2)`` through
ctypes.

mrcd must see the traffic class of every datagram (a switch's CE mark is the ECN signal of
the core; DSCP 12 or 16 a trimmed write from a peer without mrcstack's extension), and, for
such a peer, the flow label and UDP source port its EV is striped over.  ``IPV6_FLOWINFO``
has the kernel deliver the traffic class and the flow label in one control message (the
IPv6 header's first word, the version masked off), and the source port is in the name.  Python's
``socket.recvmsg_into`` builds a list, a tuple and a bytes object of ancillary data per call:
measured here it costs about 550 ns per datagram more than ``recvfrom_into`` (1.7 against
1.15 us a call), a quarter more on the adapter's whole receive path (2 us a datagram).
``recvmmsg`` into buffers made once and reused (data slots, names, control messages) reads
up to ``vlen`` datagrams per system call and leaves the traffic class at a fixed offset of
each datagram's control buffer: about 0.9 us a datagram with its ECN bits in full batches,
less than ``recvfrom_into`` without them (the adapter: 2.0 -> 1.5 us a datagram; a lone
datagram per wakeup 3.7 -> 3.9 us).

Layout: slot ``i`` of :attr:`BatchReceiver.data` (``i * slot`` ..) holds datagram ``i`` of
the last batch; :meth:`BatchReceiver.length`, :meth:`BatchReceiver.ce` and
:meth:`BatchReceiver.source` read its length, CE mark and source address.  The transport's
hot loop reads the same words through the public index tables instead of calling methods.
Views handed out stay valid only until the next :meth:`BatchReceiver.recv`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
from typing import ClassVar

#: ECN codepoint "congestion experienced": both low bits of the traffic class (RFC 3168).
ECN_CE = 0x03
#: The same bits where the flow information's second byte holds them (big-endian word:
#: version 0 | traffic class | flow label).
FLOW_ECN_CE = ECN_CE << 4
#: setsockopt(IPPROTO_IPV6, IPV6_FLOWINFO, 1): deliver each datagram's flow information.
IPV6_FLOWINFO = 11
#: Largest datagram a slot holds (the largest UDP payload over IPv6 loopback).
SLOT = 65536
_SOCKADDR_IN6 = 28  # family, port, flowinfo, address (16), scope id
_CONTROL = socket.CMSG_SPACE(4)  # one cmsghdr carrying the flow information (4 bytes)
_FLOW_AT = socket.CMSG_LEN(0)  # where it starts in the control buffer


class _Iovec(ctypes.Structure):
    _fields_: ClassVar = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_: ClassVar = [
        ("name", ctypes.c_void_p),
        ("namelen", ctypes.c_uint32),
        ("iov", ctypes.c_void_p),
        ("iovlen", ctypes.c_size_t),
        ("control", ctypes.c_void_p),
        ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    ]


class _Mmsghdr(ctypes.Structure):
    _fields_: ClassVar = [("hdr", _Msghdr), ("len", ctypes.c_uint)]


_libc = ctypes.CDLL(None, use_errno=True)
# int recvmmsg(int fd, struct mmsghdr *msgs, unsigned vlen, int flags, struct timespec *t).
# No argtypes: converting arguments on every call cost 0.4 us; the pointer is passed as a
# c_void_p made once, the others are plain ints that fit a C int.
_recvmmsg = _libc.recvmmsg
_recvmmsg.restype = ctypes.c_int


def message_arrays(
    vlen: int, slot: int
) -> tuple[ctypes.Array[ctypes.c_char], ctypes.Array[_Iovec], ctypes.Array[_Mmsghdr]]:
    """``vlen`` data slots of ``slot`` bytes, and an ``iovec`` and ``mmsghdr`` per slot
    pointing at it (one buffer each), for ``recvmmsg`` and ``sendmmsg``."""
    if vlen < 1 or slot < 1:
        raise ValueError("vlen and slot must be positive")
    data = (ctypes.c_char * (slot * vlen))()
    iovs = (_Iovec * vlen)()
    msgs = (_Mmsghdr * vlen)()
    for i in range(vlen):
        iovs[i].base = ctypes.addressof(data) + i * slot
        iovs[i].len = slot
        hdr = msgs[i].hdr
        hdr.iov = ctypes.addressof(iovs) + i * ctypes.sizeof(_Iovec)
        hdr.iovlen = 1
    return data, iovs, msgs


def enable_flowinfo(sock: socket.socket) -> None:
    """Have the kernel deliver each datagram's traffic class and flow label (IPV6_FLOWINFO;
    no control message when both are 0)."""
    sock.setsockopt(socket.IPPROTO_IPV6, IPV6_FLOWINFO, 1)


class BatchReceiver:
    """Up to ``vlen`` datagrams per ``recv`` into buffers allocated once."""

    def __init__(self, vlen: int, slot: int = SLOT) -> None:
        self._data, self._iovs, self._msgs = message_arrays(vlen, slot)
        self.vlen = vlen
        self.slot = slot
        self._names = (ctypes.c_char * (_SOCKADDR_IN6 * vlen))()
        self._control = (ctypes.c_char * (_CONTROL * vlen))()
        for i in range(vlen):
            hdr = self._msgs[i].hdr
            hdr.name = ctypes.addressof(self._names) + i * _SOCKADDR_IN6
            hdr.namelen = _SOCKADDR_IN6
            hdr.control = ctypes.addressof(self._control) + i * _CONTROL
            hdr.controllen = _CONTROL
        # The kernel writes each message's name and control lengths back: a pristine copy
        # of the headers is restored before every call.
        self._pristine = ctypes.create_string_buffer(bytes(self._msgs), ctypes.sizeof(self._msgs))
        self._msgs_at = ctypes.addressof(self._msgs)
        self._msgs_ptr = ctypes.c_void_p(self._msgs_at)
        self._written = vlen  # headers the kernel may have changed since the copy
        #: Datagram i of the last batch is ``data[i * slot : i * slot + length(i)]``.
        self.data = memoryview(self._data).cast("B")
        self.names = memoryview(self._names).cast("B")
        self.control = memoryview(self._control).cast("B")
        headers = memoryview(self._msgs).cast("B")
        self.u32 = headers.cast("I")
        self.size_t = (
            headers.cast("Q") if ctypes.sizeof(ctypes.c_size_t) == 8 else headers.cast("I")
        )
        size = ctypes.sizeof(_Mmsghdr)
        word = ctypes.sizeof(ctypes.c_size_t)
        controllen = _Msghdr.controllen.offset
        #: Index tables for the hot loop: ``u32[length_at[i]]`` is datagram i's length,
        #: ``size_t[controllen_at[i]]`` its control length (0: no flow information came),
        #: ``control[ecn_at[i]] & FLOW_ECN_CE`` its ECN bits.
        self.length_at = [(i * size + _Mmsghdr.len.offset) // 4 for i in range(vlen)]
        self.controllen_at = [(i * size + controllen) // word for i in range(vlen)]
        self.ecn_at = [i * _CONTROL + _FLOW_AT + 1 for i in range(vlen)]

    def recv(self, fd: int) -> int:
        """Read what is waiting on ``fd`` (non-blocking), up to ``vlen`` datagrams; returns
        how many (0: nothing there).  Raises OSError for a socket error."""
        if self._written:
            ctypes.memmove(self._msgs_at, self._pristine, ctypes.sizeof(self._pristine))
        n: int = _recvmmsg(fd, self._msgs_ptr, self.vlen, socket.MSG_DONTWAIT, None)
        self._written = max(n, 0)
        if n >= 0:
            return n
        err = ctypes.get_errno()
        if err in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
            return 0
        raise OSError(err, os.strerror(err))

    def length(self, i: int) -> int:
        return self.u32[self.length_at[i]]

    def datagram(self, i: int) -> memoryview:
        start = i * self.slot
        return self.data[start : start + self.length(i)]

    def ce(self, i: int) -> bool:
        """Datagram i arrived marked Congestion Experienced."""
        return bool(self.size_t[self.controllen_at[i]]) and (
            self.control[self.ecn_at[i]] & FLOW_ECN_CE == FLOW_ECN_CE
        )

    def flowinfo(self, i: int) -> int:
        """Datagram i's traffic class (bits 27-20) and flow label (bits 19-0); 0 for none."""
        if not self.size_t[self.controllen_at[i]]:
            return 0
        at = i * _CONTROL + _FLOW_AT
        return int.from_bytes(self.control[at : at + 4], "big")

    def tclass(self, i: int) -> int:
        """Datagram i's whole traffic class."""
        return self.flowinfo(i) >> 20 & 0xFF

    def source_port(self, i: int) -> int:
        """Datagram i's UDP source port."""
        at = i * _SOCKADDR_IN6
        return int.from_bytes(self.names[at + 2 : at + 4], "big")

    def source(self, i: int) -> tuple[str, int]:
        """Datagram i's source (IPv6 address, port)."""
        name = self.names[i * _SOCKADDR_IN6 : (i + 1) * _SOCKADDR_IN6]
        return socket.inet_ntop(socket.AF_INET6, name[8:24]), int.from_bytes(name[2:4], "big")
