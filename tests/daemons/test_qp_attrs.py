"""QP attributes and connection setup limits, seen from the application API.

Two mrcds in loopback data mode (tests/daemons/apiharness.py).
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest

from mrcstack.api import ApiError
from mrcstack.api.limits import MAX_PRIVATE_DATA
from tests.daemons.apiharness import WAIT, Daemons, connect, end

MTU = 4096


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    d = Daemons(tmp_path)
    try:
        yield d.start()
    finally:
        d.stop()


# Private data -------------------------------------------------------------------------------
def test_private_data_limit_is_one_constant_both_ways(daemons: Daemons) -> None:
    most = bytes(range(256)) * (MAX_PRIVATE_DATA // 256)
    assert len(most) == MAX_PRIVATE_DATA == 256
    # Exactly the limit, both ways, through mrcd and the control channel.
    connect(daemons, 4096, hello=most, welcome=most[::-1])
    a, b = end(daemons, 0, 4096), end(daemons, 3, 4096)
    # One byte more: the library says so before sending anything...
    with pytest.raises(ApiError, match=f"private_data: at most {MAX_PRIVATE_DATA} bytes, got 257"):
        a.qp.connect(3, 31, most + b"!", timeout=WAIT)
    # ...and so does mrcd, to a client that skips the library's check.
    for side, op, args in (
        (a, "connect", {"remote_host": 3, "service": 31}),
        (b, "accept", {"request_id": 1}),
    ):
        args |= {"qpn": side.qp.qpn, "private_data": (most + b"!").hex()}
        with pytest.raises(
            ApiError, match=f"private_data: at most {MAX_PRIVATE_DATA} bytes"
        ) as err:
            side.ctx.conn.call(op, args, timeout=WAIT)
        assert err.value.errno == errno.EINVAL
