"""Registered memory regions and the rkey check every incoming write must pass.

A region is any writable buffer (bytearray, mmap, a memoryview of shared memory). Each gets a
virtual address range and an rkey; a remote write is placed only when its rkey names a region
that grants REMOTE_WRITE and its whole [va, va+len) lies inside it.  Nothing else ever writes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from mrcstack.errors import AccessError, LocalError

#: Regions are placed at page-aligned virtual addresses starting here, with a gap between
#: them so that an off-by-one range never lands in a neighbour.
VA_BASE = 0x1000_0000
VA_ALIGN = 1 << 12
RKEY_MASK = 0xFFFF_FFFF


class Access(enum.IntFlag):
    LOCAL_READ = 0x1
    REMOTE_WRITE = 0x2


#: As a plain int: ``IntFlag & IntFlag`` builds a flag object in Python code (about a
#: microsecond), and a remote write checks it once per packet.
_REMOTE_WRITE = int(Access.REMOTE_WRITE)


@dataclass(frozen=True, slots=True)
class MemoryRegion:
    """A registered buffer: [va, va + length) is reachable with rkey when access allows."""

    va: int
    length: int
    rkey: int
    access: Access
    buffer: memoryview = field(repr=False, compare=False)

    def contains(self, va: int, length: int) -> bool:
        return self.va <= va and va + length <= self.va + self.length


class MemoryTable:
    """The regions of one endpoint (MRC's protection domain), looked up by rkey."""

    def __init__(self, rkey_seed: int = 0x100) -> None:
        self._by_rkey: dict[int, MemoryRegion] = {}
        self._next_va = VA_BASE
        self._next_rkey = rkey_seed & RKEY_MASK

    def register(
        self,
        buffer: bytearray | memoryview,
        access: Access = Access.REMOTE_WRITE | Access.LOCAL_READ,
        *,
        rkey: int | None = None,
        va: int | None = None,
    ) -> MemoryRegion:
        """Register a buffer; remote-writable buffers must be writable."""
        view = memoryview(buffer).cast("B")
        if view.nbytes == 0:
            raise LocalError("cannot register an empty buffer")
        if access & Access.REMOTE_WRITE and view.readonly:
            raise LocalError("REMOTE_WRITE needs a writable buffer")
        if rkey is None:
            while self._next_rkey in self._by_rkey or self._next_rkey == 0:
                self._next_rkey = (self._next_rkey + 1) & RKEY_MASK
            rkey = self._next_rkey
            self._next_rkey = (self._next_rkey + 1) & RKEY_MASK
        elif not 0 < rkey <= RKEY_MASK or rkey in self._by_rkey:
            raise LocalError(f"rkey {rkey:#x} is invalid or already registered")
        if va is None:
            va = self._next_va
            self._next_va += (view.nbytes + 2 * VA_ALIGN - 1) // VA_ALIGN * VA_ALIGN
        elif va < 0 or va + view.nbytes > 1 << 64:
            raise LocalError(f"va {va:#x} out of the 64-bit range")
        region = MemoryRegion(va=va, length=view.nbytes, rkey=rkey, access=access, buffer=view)
        self._by_rkey[rkey] = region
        return region

    def deregister(self, rkey: int) -> None:
        if self._by_rkey.pop(rkey, None) is None:
            raise LocalError(f"rkey {rkey:#x} is not registered")

    def __len__(self) -> int:
        return len(self._by_rkey)

    def regions(self) -> list[MemoryRegion]:
        return list(self._by_rkey.values())

    def check_range(self, rkey: int, va: int, length: int) -> None:
        """Raise AccessError unless a remote write of ``length`` bytes at ``va`` with
        ``rkey`` may land (what :meth:`target` checks, with nothing handed out)."""
        region = self._by_rkey.get(rkey)
        if region is None:
            raise AccessError(f"unknown rkey {rkey:#x}")
        if not int(region.access) & _REMOTE_WRITE:
            raise AccessError(f"rkey {rkey:#x} does not allow remote write")
        if length < 0 or not region.contains(va, length):
            raise AccessError(f"range {va:#x}+{length} outside rkey {rkey:#x}")

    def target(self, rkey: int, va: int, length: int) -> memoryview:
        """The writable slice a remote write of ``length`` bytes at ``va`` may fill.

        Raises AccessError when the rkey is unknown, the range leaves the region or the
        region is not remote-writable: the caller counts it, NAKs, and writes nothing.
        """
        region = self._by_rkey.get(rkey)
        if region is None:
            raise AccessError(f"unknown rkey {rkey:#x}")
        if not int(region.access) & _REMOTE_WRITE:
            raise AccessError(f"rkey {rkey:#x} does not allow remote write")
        if length < 0 or not region.contains(va, length):
            raise AccessError(f"range {va:#x}+{length} outside rkey {rkey:#x}")
        start = va - region.va
        return region.buffer[start : start + length]
