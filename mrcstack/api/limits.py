"""Limits the application API, mrcd and the mrcd-to-mrcd control channel share.

One definition each: the client library checks a value before sending it, mrcd checks it
again (a client may be hostile), and the control channel carries it to the peer's mrcd,
which checks it a third time; all three use these names, so they cannot disagree.
"""

from __future__ import annotations

import errno

from mrcstack.api.errors import ApiError
from mrcstack.wire.layout import QPN_MASK

U16 = 0xFFFF
U32 = 0xFFFF_FFFF
U64 = (1 << 64) - 1

#: QP numbers and PSNs are 24-bit fields of the BTH: both are below this.
QPN_LIMIT = QPN_MASK + 1

#: Bytes of private data a connect or an accept may carry.  MRC has no RDMA-CM, but this is
#: where RDMA programs put their connection-setup private data, so the limit is the one they
#: know: ``RDMA_MAX_PRIVATE_DATA`` (256) of ``<rdma/rdma_user_cm.h>``, the largest buffer
#: librdmacm passes for a connect, accept or reject (IB CM carries at most 196 bytes of it in
#: a REP, 92 in a REQ).  Enough for addresses, rkeys and a small handshake.
MAX_PRIVATE_DATA = 256

#: How long mrcd tries to connect a QP when the application does not say (seconds), and the
#: most it may ask for.
CONNECT_TIMEOUT = 10.0
MAX_CONNECT_TIMEOUT = 3600.0


def check_private_data(data: bytes, what: str = "private_data") -> bytes:
    """``data`` if it fits in :data:`MAX_PRIVATE_DATA`, else ApiError(EINVAL) saying so."""
    if len(data) > MAX_PRIVATE_DATA:
        raise ApiError(errno.EINVAL, f"{what}: at most {MAX_PRIVATE_DATA} bytes, got {len(data)}")
    return data
