"""Steering datagrams to data-path workers by destination QP, in the kernel.

Workers share each plane's UDP port through ``SO_REUSEPORT``: every worker binds its own
socket to the same address, and a classic BPF program attached to the group
(``SO_ATTACH_REUSEPORT_CBPF``) chooses the socket for each datagram.  The kernel runs it with
the data starting at the UDP payload, the BTH: the program loads bytes 4-7, keeps the
24-bit destination QP and returns ``qpn % workers``, the index of the socket in the group
(sockets are numbered in the order they joined it).  So a QP belongs to worker
``qpn % workers`` (:func:`worker_of`), QP 0 (probes) to worker 0, and a datagram too short
to hold a BTH also goes to worker 0 (a failed load ends a classic BPF program with 0).

Classic BPF needs neither clang nor a loader: the program is a few instructions made here
and handed to ``setsockopt``, on any kernel since 4.5.
"""

from __future__ import annotations

import ctypes
import socket
import struct

#: ``SO_ATTACH_REUSEPORT_CBPF`` (asm-generic/socket.h); Python's socket module lacks it.
SO_ATTACH_REUSEPORT_CBPF = 51
#: Classic BPF opcodes (linux/filter.h).
_LD_W_ABS = 0x20  # A = 32-bit word at an absolute offset (network byte order)
_ALU_AND_K = 0x54  # A &= k
_ALU_MOD_K = 0x94  # A %= k
_RET_A = 0x16  # return A
_INSN = struct.Struct("=HBBI")  # code, jt, jf, k: struct sock_filter
_QPN_WORD = 4  # BTH bytes 4-7: a reserved byte, then the 24-bit destination QP
_QPN_MASK = 0xFFFFFF


def worker_of(qpn: int, workers: int) -> int:
    """The worker that owns QP ``qpn`` (what the kernel program computes)."""
    return (qpn & _QPN_MASK) % workers


def program(workers: int) -> bytes:
    """The classic BPF instructions (``struct sock_filter`` array) steering by QP."""
    if not 1 <= workers <= 0xFFFF:
        raise ValueError(f"workers must be in 1..65535, got {workers}")
    return b"".join(
        _INSN.pack(code, 0, 0, k)
        for code, k in (
            (_LD_W_ABS, _QPN_WORD),
            (_ALU_AND_K, _QPN_MASK),
            (_ALU_MOD_K, workers),
            (_RET_A, 0),
        )
    )


def attach(sock: socket.socket, workers: int) -> None:
    """Attach the steering program to the reuseport group of ``sock`` (bound, with
    ``SO_REUSEPORT``); it then applies to every socket of the group."""
    code = program(workers)
    insns = ctypes.create_string_buffer(code, len(code))
    # struct sock_fprog { unsigned short len; struct sock_filter *filter; }: the kernel
    # copies the instructions during the call.
    fprog = struct.pack("=H6xQ", len(code) // _INSN.size, ctypes.addressof(insns))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)
