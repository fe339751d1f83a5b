"""Steering datagrams to data-path workers by destination QP, in the kernel.

Workers share each plane's UDP port through ``SO_REUSEPORT``: every worker binds its own
socket to the same address, and a classic BPF program attached to the group
(``SO_ATTACH_REUSEPORT_CBPF``) chooses the socket for each datagram.  The kernel runs it with
the data starting at the UDP payload, the BTH: the program loads bytes 4-7, keeps the
24-bit destination QP and returns ``qpn % workers``, the index of the socket in the group
(sockets are numbered in the order they joined it).  So a QP belongs to worker
``qpn % workers`` (:func:`worker_of`), and a datagram too short to hold a BTH goes to
worker 0 (a failed load ends a classic BPF program with 0).

The answer to an EV probe (opcode ENDPOINT_RESPONSE, to QP 2) goes by its probe id
instead (BTH bytes 10-11): the daemon and each worker draw their probe ids from their own
residue modulo ``workers + 1``, so the id names who sent the probe, and the answer goes
straight to that worker; the daemon's own (residue ``workers``) to worker 0, which hands
it on.  Every other datagram for QP 2 (probes, port status updates) goes to worker
``2 % workers``.  :func:`worker_for` computes the same in Python.

Classic BPF needs neither clang nor a loader: the program is a few instructions made here
and handed to ``setsockopt``, on any kernel since 4.5.
"""

from __future__ import annotations

import ctypes
import socket
import struct

from mrcstack.wire import BTH_PROBE_ID_BYTES, Opcode, probe_id

#: ``SO_ATTACH_REUSEPORT_CBPF`` (asm-generic/socket.h); Python's socket module lacks it.
SO_ATTACH_REUSEPORT_CBPF = 51
#: Classic BPF opcodes (linux/filter.h).
_LD_W_ABS = 0x20  # A = 32-bit word at an absolute offset (network byte order)
_LD_H_ABS = 0x28  # A = 16-bit half-word at an absolute offset
_LD_B_ABS = 0x30  # A = the byte at an absolute offset
_JEQ_K = 0x15  # pc += (A == k) ? jt : jf
_JGE_K = 0x35  # pc += (A >= k) ? jt : jf
_RET_K = 0x06  # return k
_ALU_AND_K = 0x54  # A &= k
_ALU_MOD_K = 0x94  # A %= k
_RET_A = 0x16  # return A
_INSN = struct.Struct("=HBBI")  # code, jt, jf, k: struct sock_filter
_QPN_WORD = 4  # BTH bytes 4-7: a reserved byte, then the 24-bit destination QP
_QPN_MASK = 0xFFFFFF
_PROBE_ID_HALF = BTH_PROBE_ID_BYTES.start  # an endpoint datagram's probe id, 16 bits
_ENDPOINT_RESPONSE = int(Opcode.ENDPOINT_RESPONSE)


def worker_of(qpn: int, workers: int) -> int:
    """The worker that owns QP ``qpn`` (what the kernel program computes)."""
    return (qpn & _QPN_MASK) % workers


def probe_owner(ident: int, workers: int) -> int:
    """Who sent probe ``ident``: a worker's index, or ``workers`` for the daemon's prober
    (each draws its ids from its own residue modulo ``workers + 1``)."""
    return ident % (workers + 1)


def worker_for(datagram: bytes | memoryview, workers: int) -> int:
    """The worker the kernel program hands ``datagram`` (a UDP payload) to."""
    if len(datagram) and datagram[0] == _ENDPOINT_RESPONSE:
        if len(datagram) < BTH_PROBE_ID_BYTES.stop:
            return 0
        owner = probe_owner(probe_id(datagram), workers)
        return 0 if owner >= workers else owner
    if len(datagram) < _QPN_WORD + 4:
        return 0
    return worker_of(int.from_bytes(datagram[_QPN_WORD : _QPN_WORD + 4], "big"), workers)


def program(workers: int) -> bytes:
    """The classic BPF instructions (``struct sock_filter`` array) steering by QP, and an
    answer to a probe by its probe id."""
    if not 1 <= workers <= 0xFFFF:
        raise ValueError(f"workers must be in 1..65535, got {workers}")
    return b"".join(
        _INSN.pack(code, jt, jf, k)
        for code, jt, jf, k in (
            (_LD_B_ABS, 0, 0, 0),  # the opcode
            (_JEQ_K, 0, 5, _ENDPOINT_RESPONSE),  # not an answer: steer by QP (at 7)
            (_LD_H_ABS, 0, 0, _PROBE_ID_HALF),
            (_ALU_MOD_K, 0, 0, workers + 1),  # who drew the id
            (_JGE_K, 0, 1, workers),  # the daemon's: worker 0
            (_RET_K, 0, 0, 0),
            (_RET_A, 0, 0, 0),
            (_LD_W_ABS, 0, 0, _QPN_WORD),
            (_ALU_AND_K, 0, 0, _QPN_MASK),
            (_ALU_MOD_K, 0, 0, workers),
            (_RET_A, 0, 0, 0),
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
