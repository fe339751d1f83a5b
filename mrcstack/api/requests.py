"""Registered memory and the work requests that name it.

The verbs counterparts: ``ibv_mr``, ``ibv_sge`` and ``ibv_send_wr``.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import Any, Protocol

from mrcstack.api.types import Access, Opcode


class _Owner(Protocol):
    """What a region needs of its context (:class:`mrcstack.api.verbs.Context`)."""

    def dereg_mr(self, mr: MemoryRegion) -> None: ...


class MemoryRegion:
    """Registered shared memory: ``buf`` is this process's view of the very pages mrcd
    reads outgoing writes from and places incoming ones into."""

    def __init__(self, ctx: _Owner, mapping: mmap.mmap, doc: dict[str, Any]) -> None:
        self.context = ctx
        self._mmap: mmap.mmap | None = mapping
        self.buf: memoryview = memoryview(mapping)
        self.addr = int(doc["addr"])
        self.length = int(doc["length"])
        self.lkey = int(doc["lkey"])
        self.rkey = int(doc["rkey"])
        self.access = Access(int(doc["access"]))

    @property
    def registered(self) -> bool:
        return self._mmap is not None

    def dereg(self) -> None:
        """``ibv_dereg_mr``: mrcd unmaps it, then this process does (once ``buf``'s views
        are released; until then the pages stay mapped here, never in mrcd)."""
        self.context.dereg_mr(self)

    def close(self) -> None:
        """Unmap this process's view only (the context is closing: mrcd unmaps its own)."""
        mapping, self._mmap = self._mmap, None
        if mapping is None:
            return
        try:
            self.buf.release()
            mapping.close()
        except BufferError:
            pass  # the application still holds views: the mapping goes with the last one

    def __repr__(self) -> str:
        return (
            f"MemoryRegion(addr={self.addr:#x}, length={self.length}, "
            f"lkey={self.lkey:#x}, rkey={self.rkey:#x})"
        )


@dataclass(frozen=True, slots=True)
class Sge:
    """A local scatter/gather element: ``length`` bytes at ``offset`` of region ``mr``."""

    mr: MemoryRegion
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class SendWr:
    """A send work request with any verbs opcode (mrcd rejects all but the WRITE ones)."""

    wr_id: int
    opcode: Opcode
    local: Sge | tuple[MemoryRegion, int, int]
    remote_addr: int
    rkey: int
    imm: int | None = None
    signaled: bool = True


@dataclass(frozen=True, slots=True)
class WriteWr:
    """RDMA WRITE (``imm=None``) or WRITE-with-immediate of ``local`` to ``remote_addr``."""

    wr_id: int
    local: Sge | tuple[MemoryRegion, int, int]
    remote_addr: int
    rkey: int
    imm: int | None = None
    signaled: bool = True

    @property
    def opcode(self) -> Opcode:
        return Opcode.RDMA_WRITE if self.imm is None else Opcode.RDMA_WRITE_WITH_IMM
