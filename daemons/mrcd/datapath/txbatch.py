"""Batched datagram send: ``sendmmsg(2)`` through ctypes, into buffers made once.

Python's ``socket`` has no ``sendmmsg``: each ``sendto`` is a method call that parses its
address tuple, and a system call.  :class:`BatchSender` keeps ``vlen`` slots of ``slot``
bytes, with their ``mmsghdr`` and ``iovec`` made once; the transport copies each datagram
into the next slot, names its destination (a ``sockaddr_in6`` made once per path,
:class:`Sockaddr`) and its
traffic class (a control message made once), and :meth:`BatchSender.send` hands the slots
to the kernel in as few calls as it takes.  Each plane socket has its own sender, so the
datagrams of one plane leave in the order they were made (loss detection compares send
order per plane).

Layout, as :mod:`.rxbatch`: slot ``i`` of :attr:`BatchSender.data` (``i * slot`` ..) holds
datagram ``i``; the hot path writes the header words through index tables instead of
ctypes attributes (a memoryview store is a few tens of nanoseconds, a ctypes field store
several times that).
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
from typing import ClassVar

from mrcstack.daemons.mrcd.datapath.rxbatch import _Iovec, _Mmsghdr, _Msghdr, message_arrays

#: Largest datagram a slot holds: a jumbo frame's UDP payload fits (8,952 bytes on an MTU of
#: 9,000); a larger one is sent on its own (:meth:`Transport` falls back to ``sendto``).
SLOT = 9216
_SOCKADDR_IN6 = struct.Struct("=H2sI16sI")  # family (host order), port (network), flow, addr, scope
SOCKADDR_IN6_LEN = _SOCKADDR_IN6.size

_libc = ctypes.CDLL(None, use_errno=True)
# int sendmmsg(int fd, struct mmsghdr *msgs, unsigned vlen, int flags).  No argtypes (as
# recvmmsg in rxbatch): the pointer is a c_void_p made once, the others fit a C int.
_sendmmsg = _libc.sendmmsg
_sendmmsg.restype = ctypes.c_int


class Sockaddr:
    """A ``sockaddr_in6`` made once (a destination of :class:`BatchSender`), kept alive
    by whoever holds it; :attr:`at` is its address."""

    __slots__ = ("_buf", "address", "at")

    def __init__(self, address: tuple[str, int]) -> None:
        host, port = address[0], address[1]
        packed = _SOCKADDR_IN6.pack(
            socket.AF_INET6, port.to_bytes(2, "big"), 0, socket.inet_pton(socket.AF_INET6, host), 0
        )
        self._buf = ctypes.create_string_buffer(packed, len(packed))
        self.at = ctypes.addressof(self._buf)
        self.address = address


class ControlMessage:
    """Ancillary data made once (e.g. the control traffic class), for :meth:`BatchSender.add`."""

    __slots__ = ("_buf", "at", "length")

    def __init__(self, level: int, kind: int, value: bytes) -> None:
        length = socket.CMSG_LEN(len(value))
        space = socket.CMSG_SPACE(len(value))
        header = _Cmsghdr(length, level, kind)
        raw = bytes(header) + value
        self._buf = ctypes.create_string_buffer(raw.ljust(space, b"\0"), space)
        self.at = ctypes.addressof(self._buf)
        self.length = space


class _Cmsghdr(ctypes.Structure):
    _fields_: ClassVar = [("len", ctypes.c_size_t), ("level", ctypes.c_int), ("type", ctypes.c_int)]


class BatchSender:
    """Up to ``vlen`` datagrams for one socket per :meth:`send`, in buffers allocated once."""

    def __init__(self, vlen: int, slot: int = SLOT) -> None:
        self._data, self._iovs, self._msgs = message_arrays(vlen, slot)
        self.vlen = vlen
        self.slot = slot
        for i in range(vlen):
            self._msgs[i].hdr.namelen = SOCKADDR_IN6_LEN
        self._size = ctypes.sizeof(_Mmsghdr)
        at = ctypes.addressof(self._msgs)
        #: A pointer to each header, to send from there (a plain int would pass as a C int).
        self._from = [ctypes.c_void_p(at + i * self._size) for i in range(vlen)]
        self.data = memoryview(self._data).cast("B")
        #: Slot i as a writable view: where datagram i is encoded.
        self.slots = [self.data[i * slot : (i + 1) * slot] for i in range(vlen)]
        word = ctypes.sizeof(ctypes.c_size_t)
        if word != 8:  # the index tables below assume 64-bit words and pointers
            raise OSError(errno.ENOTSUP, "batched send needs a 64-bit platform")
        self._iov_words = memoryview(self._iovs).cast("B").cast("Q")
        self._msg_words = memoryview(self._msgs).cast("B").cast("Q")
        size = self._size // word
        iov = ctypes.sizeof(_Iovec) // word
        self._len_at = [i * iov + _Iovec.len.offset // word for i in range(vlen)]
        self._name_at = [i * size + _Msghdr.name.offset // word for i in range(vlen)]
        self._control_at = [i * size + _Msghdr.control.offset // word for i in range(vlen)]
        self._controllen_at = [i * size + _Msghdr.controllen.offset // word for i in range(vlen)]
        #: Datagrams waiting in the slots, and each one's destination (for a backlog).
        self.count = 0
        self.addresses: list[tuple[str, int] | None] = [None] * vlen

    def add(self, length: int, to: Sockaddr, control: ControlMessage | None) -> bool:
        """Datagram ``count`` (``length`` bytes, already in ``slots[count]``) goes to ``to``
        with ``control``; True when every slot is taken (:meth:`send` before the next)."""
        i = self.count
        self._iov_words[self._len_at[i]] = length
        words = self._msg_words
        words[self._name_at[i]] = to.at
        if control is None:
            words[self._control_at[i]] = 0
            words[self._controllen_at[i]] = 0
        else:
            words[self._control_at[i]] = control.at
            words[self._controllen_at[i]] = control.length
        self.addresses[i] = to.address
        self.count = i + 1
        return i + 1 == self.vlen

    def length(self, i: int) -> int:
        return int(self._iov_words[self._len_at[i]])

    def send(self, fd: int, start: int = 0) -> int:
        """Send datagrams ``start``.. of the batch on ``fd`` (non-blocking) in one system
        call; how many the kernel took (at least one), or OSError for the first one (its
        errno: EAGAIN when the socket is full).  The caller resets :attr:`count`."""
        n: int = _sendmmsg(fd, self._from[start], self.count - start, socket.MSG_DONTWAIT)
        if n > 0:
            return n
        err = ctypes.get_errno() if n < 0 else errno.EAGAIN
        raise OSError(err, os.strerror(err))

    def datagram(self, i: int) -> bytes:
        """A copy of datagram ``i`` (for a backlog that outlives the slots)."""
        return bytes(self.slots[i][: self.length(i)])
