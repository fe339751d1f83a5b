"""What an MPTCP socket really did: did it stay MPTCP, and how much each subflow carried.

The MPTCP baseline of ``bench/daemon_bench.py`` means something only if the connection
spread over several subflows (one per plane).  A connection that fell back to plain TCP, or
whose peer never announced its other addresses, still moves data, over one path: this module
tells those apart, from the kernel's own records (``<linux/mptcp.h>``):

- ``getsockopt(SOL_MPTCP, MPTCP_INFO)`` fails once the connection has fallen back to TCP
  (the socket options then go to the one remaining TCP subflow, which knows no SOL_MPTCP);
- ``getsockopt(SOL_MPTCP, MPTCP_TCPINFO)`` returns a ``struct tcp_info`` per subflow, whose
  ``tcpi_bytes_acked`` says what each one carried.  Its header is read *and* written by the
  kernel (the caller says how big its records are), which Python's ``socket.getsockopt``
  cannot do, so it goes through libc.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct

SOL_MPTCP = 284
MPTCP_INFO = 1
MPTCP_TCPINFO = 2
#: struct mptcp_subflow_data: size_subflow_data, num_subflows, size_kernel, size_user.
SUBFLOW_DATA = struct.Struct("=IIII")
#: Offset of tcpi_bytes_acked (u64) in struct tcp_info (<linux/tcp.h>): 8 bytes of u8
#: fields, 24 u32 (tcpi_rto ... tcpi_total_retrans), pacing_rate and max_pacing_rate (u64).
TCPI_BYTES_ACKED = 8 + 24 * 4 + 2 * 8
TCP_INFO_PREFIX = TCPI_BYTES_ACKED + 8  # the part of struct tcp_info we ask for
MAX_SUBFLOWS = 32

_libc = ctypes.CDLL(None, use_errno=True)


class MptcpFallbackError(RuntimeError):
    """The connection is not (or no longer) MPTCP: it fell back to plain TCP."""


def check_mptcp(sock: socket.socket) -> None:
    """Raise :class:`MptcpFallbackError` unless ``sock`` is a live MPTCP connection."""
    try:
        sock.getsockopt(SOL_MPTCP, MPTCP_INFO, 64)
    except OSError as exc:
        raise MptcpFallbackError(
            f"the connection fell back to plain TCP (MPTCP_INFO: {exc.strerror})"
        ) from None


def subflow_bytes(sock: socket.socket) -> list[int]:
    """Bytes acknowledged on each subflow of the MPTCP connection ``sock`` (its sender's
    view), in the kernel's order; raises :class:`MptcpFallbackError` after a fallback."""
    check_mptcp(sock)
    size = SUBFLOW_DATA.size + MAX_SUBFLOWS * TCP_INFO_PREFIX
    buf = ctypes.create_string_buffer(size)
    SUBFLOW_DATA.pack_into(buf, 0, SUBFLOW_DATA.size, 0, 0, TCP_INFO_PREFIX)
    length = ctypes.c_uint32(size)
    if _libc.getsockopt(sock.fileno(), SOL_MPTCP, MPTCP_TCPINFO, buf, ctypes.byref(length)):
        code = ctypes.get_errno()
        if code in (errno.EOPNOTSUPP, errno.ENOPROTOOPT):
            raise MptcpFallbackError(f"the connection fell back to plain TCP ({os.strerror(code)})")
        raise OSError(code, f"MPTCP_TCPINFO: {os.strerror(code)}")
    _, count, _, stride = SUBFLOW_DATA.unpack_from(buf, 0)
    shown = min(count, MAX_SUBFLOWS)
    return [
        struct.unpack_from("=Q", buf, SUBFLOW_DATA.size + i * stride + TCPI_BYTES_ACKED)[0]
        for i in range(shown)
    ]


def used_subflows(per_subflow: list[int], share: float = 0.01) -> int:
    """How many subflows carried at least ``share`` of the bytes."""
    total = sum(per_subflow)
    return sum(1 for n in per_subflow if total and n >= share * total)
