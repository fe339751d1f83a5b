"""A flow's bytes, derived from (flow, offset): made where they are sent, checked where placed.

Neither end holds a flow: the sender fills a work request's buffer just before posting it,
and the receiver's memory is a :class:`CheckingSink`, a region as large as the flow that
keeps nothing and compares every write with what belongs at its offset.  So a run's memory
does not grow with the flow size, and a run still tells whether every byte arrived intact
and in its place.

Every 4 KiB block starts with a header (flow index, block offset): a write placed at the
wrong offset or into the wrong flow never matches.  The rest of a block is a seeded random
filler taken at an offset that depends on the block, so that a packet with no header in it
(a small MTU) still differs from its neighbours.
"""

from __future__ import annotations

import random
import struct

from mrcstack.core.memory import VA_BASE, MemoryTable
from mrcstack.errors import AccessError

BLOCK = 4096
_HEADER = struct.Struct("<QQ")  # flow index, the block's offset in the flow
_HEADER_SIZE = _HEADER.size
_FILLER = 1 << 16
#: The sink's one region: its rkey (any valid one: it is the table's only region).
SINK_RKEY = 0x100
#: Odd, and prime to the filler's size: consecutive blocks take far-apart filler slices.
_STRIDE = 4099 * 16 + 7


class FlowContent:
    """The content of flow ``index``: ``block(b)`` is its ``b``-th 4 KiB block.

    ``fill`` and ``matches`` work on a block's two parts (its header, and a slice of the
    filler seen through a memoryview) without building the block: they run once per write
    and once per packet placed, each over a few KiB."""

    __slots__ = ("_cache", "_filler", "_index", "_last", "_view")

    def __init__(self, index: int, rng: random.Random) -> None:
        self._index = index
        filler = rng.randbytes(_FILLER)
        self._filler = filler + filler[:BLOCK]  # any block's body is one slice
        self._view = memoryview(self._filler)
        self._last = -1
        self._cache = b""

    def block(self, b: int) -> bytes:
        """Block ``b`` (4096 bytes; the flow's last block is cut by the caller)."""
        if b != self._last:
            start = b * _STRIDE % _FILLER
            self._cache = (
                _HEADER.pack(self._index, b * BLOCK)
                + self._filler[start : start + BLOCK - _HEADER.size]
            )
            self._last = b
        return self._cache

    def fill(self, into: memoryview, offset: int) -> None:
        """Write the flow's bytes at ``offset`` into all of ``into``."""
        index, view = self._index, self._view
        n = into.nbytes
        pos = 0
        if offset % BLOCK == 0:
            # Whole blocks (a write starts on one, as the runner's always do): the header,
            # then the body in one slice, without working out where each part starts.
            pack = _HEADER.pack
            body = BLOCK - _HEADER_SIZE
            first = offset // BLOCK
            for b in range(first, first + n // BLOCK):
                into[pos : pos + _HEADER_SIZE] = pack(index, b * BLOCK)
                start = b * _STRIDE % _FILLER
                into[pos + _HEADER_SIZE : pos + BLOCK] = view[start : start + body]
                pos += BLOCK
        while pos < n:
            b, within = divmod(offset + pos, BLOCK)
            end = min(BLOCK, within + n - pos)
            if within < _HEADER_SIZE:
                cut = min(_HEADER_SIZE, end)
                into[pos : pos + cut - within] = _HEADER.pack(index, b * BLOCK)[within:cut]
                pos += cut - within
                within = cut
            if within < end:
                start = b * _STRIDE % _FILLER - _HEADER_SIZE
                into[pos : pos + end - within] = view[start + within : start + end]
                pos += end - within

    def matches(self, data: bytes | bytearray, offset: int, length: int | None = None) -> bool:
        """Whether the first ``length`` bytes of ``data`` (all of it by default) are the
        flow's content at ``offset``.  ``startswith(part, pos)`` compares in place: neither
        side is copied."""
        n = len(data) if length is None else length
        if n > len(data):
            return False
        index, view = self._index, self._view
        if n == BLOCK and offset % BLOCK == 0:
            # One whole block (a packet of a 4 KiB MTU): its header, then its body.
            start = offset // BLOCK * _STRIDE % _FILLER
            return data.startswith(_HEADER.pack(index, offset)) and data.startswith(
                view[start : start + BLOCK - _HEADER_SIZE], _HEADER_SIZE
            )
        pos = 0
        while pos < n:
            b, within = divmod(offset + pos, BLOCK)
            end = within + n - pos
            if end > BLOCK:
                end = BLOCK
            if within < _HEADER_SIZE:
                cut = _HEADER_SIZE if end > _HEADER_SIZE else end
                if not data.startswith(_HEADER.pack(index, b * BLOCK)[within:cut], pos):
                    return False
                pos += cut - within
                within = cut
            if within < end:
                start = b * _STRIDE % _FILLER - _HEADER_SIZE
                if not data.startswith(view[start + within : start + end], pos):
                    return False
                pos += end - within
        return True


class CheckingSink(MemoryTable):
    """The receiver's memory in the simulator: one remote-writable region of ``size`` bytes
    that stores nothing.  A write lands in a scratch buffer and is checked by the next
    :meth:`check` (the adapter calls it after every datagram) against ``content``; each
    byte must be written exactly once.  The rkey and range checks are the real table's."""

    def __init__(self, content: FlowContent, size: int, max_write: int) -> None:
        super().__init__(rkey_seed=SINK_RKEY + 1)
        self.content = content
        self.size = size
        self.va = VA_BASE
        self.rkey = SINK_RKEY
        self._scratch = bytearray(max_write)
        self._whole = memoryview(self._scratch)  # the scratch buffer, for a full-size write
        # (offset, length) of the write not checked yet: an adapter calls check() when set.
        self.pending: tuple[int, int] | None = None
        self.frontier = 0  # every byte below this offset was written, once, correctly
        self._ahead: dict[int, int] = {}  # start -> end of writes placed beyond the frontier
        self.bad_writes = 0  # wrong content, or bytes written twice

    def check_range(self, rkey: int, va: int, length: int) -> None:
        if rkey != self.rkey:
            raise AccessError(f"unknown rkey {rkey:#x}")
        if length < 0 or va < self.va or va - self.va + length > self.size:
            raise AccessError(f"range {va:#x}+{length} outside rkey {rkey:#x}")

    def target(self, rkey: int, va: int, length: int) -> memoryview:
        if self.pending is not None:
            self.check()
        self.check_range(rkey, va, length)
        offset = va - self.va
        self.pending = (offset, length)
        whole = self._whole
        if length == whole.nbytes:
            return whole
        if length > whole.nbytes:
            self._scratch = bytearray(length)
            self._whole = whole = memoryview(self._scratch)
            return whole
        return whole[:length]

    def check(self) -> None:
        """Check the write :meth:`target` handed out last, if any."""
        if self.pending is None:
            return
        offset, length = self.pending
        self.pending = None
        if not self.content.matches(self._scratch, offset, length):
            self.bad_writes += 1
        end = offset + length
        if offset == self.frontier:
            ahead = self._ahead
            while end in ahead:
                end = ahead.pop(end)
            self.frontier = end
        elif offset > self.frontier and offset not in self._ahead:
            self._ahead[offset] = end
        else:
            self.bad_writes += 1  # written before

    def intact_below(self, end: int) -> bool:
        """Every byte below ``end`` was written once with the right content."""
        self.check()
        return self.bad_writes == 0 and self.frontier >= end
