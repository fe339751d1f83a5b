"""Memory registration and the rkey/range/permission check."""

from __future__ import annotations

import mmap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mrcstack.core.memory import Access, MemoryTable
from mrcstack.errors import AccessError, LocalError, PeerError


def test_regions_get_distinct_rkeys_and_gapped_addresses() -> None:
    mt = MemoryTable()
    a = mt.register(bytearray(100))
    b = mt.register(bytearray(5000))
    assert a.rkey != b.rkey
    assert b.va >= a.va + a.length + 1  # never adjacent: an off-by-one cannot cross
    assert len(mt) == 2


def test_mmap_region_is_writable_through_target() -> None:
    mt = MemoryTable()
    with mmap.mmap(-1, 8192) as m:
        r = mt.register(m)
        mt.target(r.rkey, r.va + 10, 3)[:] = b"abc"
        assert m[10:13] == b"abc"
        r.buffer.release()


@pytest.mark.parametrize(
    "rkey_delta,offset,length,reason",
    [
        (1, 0, 1, "unknown rkey"),
        (0, -1, 1, "outside"),
        (0, 90, 11, "outside"),
        (0, 0, -1, "outside"),
    ],
)
def test_target_rejects(rkey_delta: int, offset: int, length: int, reason: str) -> None:
    mt = MemoryTable()
    r = mt.register(bytearray(100))
    with pytest.raises(AccessError, match=reason):
        mt.target(r.rkey + rkey_delta, r.va + offset, length)


def test_permissions_and_bad_registrations() -> None:
    mt = MemoryTable()
    ro = mt.register(bytearray(10), Access.LOCAL_READ)
    with pytest.raises(AccessError, match="does not allow"):
        mt.target(ro.rkey, ro.va, 1)
    with pytest.raises(LocalError):
        mt.register(bytes(10))  # read-only buffer cannot be remote-writable
    with pytest.raises(LocalError):
        mt.register(bytearray())
    with pytest.raises(LocalError):
        mt.register(bytearray(4), rkey=ro.rkey)
    mt.deregister(ro.rkey)
    with pytest.raises(LocalError):
        mt.deregister(ro.rkey)


@given(st.integers(-300, 300), st.integers(0, 300))
def test_target_is_inside_or_raises(offset: int, length: int) -> None:
    mt = MemoryTable()
    r = mt.register(bytearray(128))
    try:
        view = mt.target(r.rkey, r.va + offset, length)
    except AccessError:
        assert offset < 0 or offset + length > 128
    else:
        assert offset >= 0 and offset + length <= 128 and view.nbytes == length


def test_access_errors_are_the_peers_fault() -> None:
    """A remote write that misses every region comes from the peer: PeerError, not LocalError."""
    assert issubclass(AccessError, PeerError) and not issubclass(AccessError, LocalError)
