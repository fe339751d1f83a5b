"""Shared memory for registered regions: a sealed memfd mapped by the client and by mrcd.

The client creates an anonymous memory file (``memfd_create``), sizes it, seals its size and
maps it; the file descriptor travels to mrcd with SCM_RIGHTS and mrcd maps the same pages.
Incoming writes are placed by mrcd straight into the application's pages; outgoing writes
are read from them; nothing is copied between the two processes.

Why a sealed memfd rather than a named file in /dev/shm: mrcd must never touch a page that
is not there.  A file that a client can truncate after mrcd mapped it would turn the next
placement into SIGBUS and kill the daemon.  A memfd sealed with ``F_SEAL_SHRINK`` can never
get smaller, and it has no name anyone else could open.  :func:`map_shared` refuses any
descriptor that is not a regular shared-memory file sealed that way.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import stat

from mrcstack.api.errors import ApiError

#: The largest region one registration may map (1 TiB; the fabric MTU is not the limit).
MAX_REGION = 1 << 40
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def create(length: int, name: str = "mrc-mr") -> tuple[int, mmap.mmap]:
    """A new zero-filled shared region: ``(fd, mapping)``.  The caller closes the fd."""
    if not 0 < length <= MAX_REGION:
        raise ApiError(errno.EINVAL, f"region length must be in 1..{MAX_REGION}, got {length}")
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, length)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        mapping = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError as exc:
        os.close(fd)
        raise ApiError(exc.errno or errno.ENOMEM, f"cannot create shared memory: {exc}") from None
    return fd, mapping


def map_shared(fd: int, length: int, writable: bool) -> mmap.mmap:
    """mrcd's side: map ``length`` bytes of a client's region after checking the file.

    The length is checked against the file itself (never trusted from the message) and the
    file must be sealed against shrinking.  Raises ApiError(EINVAL) otherwise.
    """
    if not 0 < length <= MAX_REGION:
        raise ApiError(errno.EINVAL, f"region length must be in 1..{MAX_REGION}, got {length}")
    try:
        st = os.fstat(fd)
    except OSError as exc:
        raise ApiError(errno.EBADF, f"bad region descriptor: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ApiError(errno.EINVAL, "region descriptor is not a shared-memory file")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        seals = 0
    if not seals & fcntl.F_SEAL_SHRINK:
        raise ApiError(
            errno.EINVAL,
            "region file is not sealed against shrinking (use a memfd with F_SEAL_SHRINK)",
        )
    if st.st_size < length:
        raise ApiError(
            errno.EINVAL,
            f"region file holds {st.st_size} bytes, fewer than the {length} registered",
        )
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    try:
        return mmap.mmap(fd, length, mmap.MAP_SHARED, prot)
    except OSError as exc:
        raise ApiError(
            exc.errno or errno.ENOMEM, f"cannot map the region: {exc.strerror}"
        ) from None
