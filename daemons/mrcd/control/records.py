"""The control channel's record layer: length-prefixed frames, AES-GCM records, QP keys.

Pure pieces of ``control.py`` (which runs the sessions): a frame is a 4-byte big-endian
length and a body; after the handshake every body is one record, ``counter(8) ||
ciphertext+tag`` holding one JSON object.  docs/control-channel.md has the layout.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from mrcstack.api.limits import QPN_LIMIT
from mrcstack.daemons.mrcd.control.auth import SessionKeys
from mrcstack.errors import LocalError, PeerError

Message = dict[str, Any]

LENGTH = struct.Struct("!I")
COUNTER = struct.Struct("!Q")
GCM_TAG = 16
RECORD_OVERHEAD = COUNTER.size + GCM_TAG
#: Largest JSON body after the handshake (a CONNECT with the most private data is under 1 KiB).
MAX_MESSAGE = 64 * 1024
QP_KEY_INFO = b"mrc qp key"


class ControlError(PeerError):
    """The channel failed (bad frame or record, peer gone, peer refused us).

    ``reason`` is the short code the server counts; ``str()`` is one line for logs.
    """

    def __init__(self, reason: str, detail: str = "", *, retry_after: float = 0.0) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.retry_after = retry_after  # seconds the peer asked us to wait (``busy``)


# Keys -------------------------------------------------------------------------------------
def derive_qp_key(
    session_secret: bytes, src_host: int, src_qpn: int, dst_host: int, dst_qpn: int
) -> bytes:
    """The per-QP packet key (``ConnectionConfig.key``): both ends compute the same one.

    ``src`` is the end that sent CONNECT, ``dst`` the end that accepted.  HKDF-SHA256 with the
    session secret as input key material, no salt, and info = ``b"mrc qp key"`` followed by
    the four values as 32-bit big-endian integers.
    """
    for name, value, limit in (
        ("src_host", src_host, 1 << 32),
        ("src_qpn", src_qpn, QPN_LIMIT),
        ("dst_host", dst_host, 1 << 32),
        ("dst_qpn", dst_qpn, QPN_LIMIT),
    ):
        if isinstance(value, bool) or not 0 <= value < limit:
            raise LocalError(f"derive_qp_key: {name} out of range: {value}")
    info = QP_KEY_INFO + struct.pack("!IIII", src_host, src_qpn, dst_host, dst_qpn)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(session_secret)


# Framing and records (pure) ---------------------------------------------------------------
def encode_frame(body: bytes) -> bytes:
    return LENGTH.pack(len(body)) + body


#: The one frame a server sends to a peer it has not authenticated: "busy, try again in this
#: many milliseconds", instead of a handshake message.  It carries nothing the peer could not
#: learn by connecting, and is told apart from message 2 by its start and size.
BUSY = b"MRCCBUSY"
_BUSY_TAIL = struct.Struct("!H")


def encode_busy(retry_after: float) -> bytes:
    """The busy frame (body), asking to retry after ``retry_after`` seconds."""
    return BUSY + _BUSY_TAIL.pack(min(0xFFFF, max(1, round(retry_after * 1000))))


def decode_busy(body: bytes) -> float | None:
    """The retry hint in seconds if ``body`` is a busy frame, else None."""
    if len(body) != len(BUSY) + _BUSY_TAIL.size or not body.startswith(BUSY):
        return None
    (ms,) = _BUSY_TAIL.unpack_from(body, len(BUSY))
    return float(ms) / 1000


async def read_frame(
    reader: asyncio.StreamReader,
    limit: int,
    body_timeout: float | None = None,
    start_timeout: float | None = None,
) -> bytes | None:
    """One frame's body, or None on a clean end of stream between frames.

    ``start_timeout``: the frame's length prefix must arrive within it (ControlError
    ``idle``), so a connection that sends nothing is cut off early."""
    try:
        async with asyncio.timeout(start_timeout):
            header = await reader.readexactly(LENGTH.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise ControlError("truncated", "stream ended inside a length prefix") from None
    except TimeoutError:
        raise ControlError("idle", f"nothing sent within {start_timeout} s") from None
    (size,) = LENGTH.unpack(header)
    if size > limit:
        raise ControlError("oversized", f"frame of {size} bytes (limit {limit})")
    try:
        async with asyncio.timeout(body_timeout):
            return await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise ControlError("truncated", f"{len(exc.partial)} of {size} bytes") from None


class RecordLayer:
    """AES-GCM records after the handshake: ``counter(8) || ciphertext+tag``.

    Each direction has its own key and counter; the nonce is four zero bytes and the counter,
    which is also the associated data.  A record whose counter is not exactly the next one is
    refused (replayed, reordered or dropped), as is one whose tag fails.
    """

    def __init__(self, keys: SessionKeys, max_message: int = MAX_MESSAGE) -> None:
        self._send = AESGCM(keys.send_key)
        self._recv = AESGCM(keys.recv_key)
        self.max_message = max_message
        self.sent = 0
        self.received = 0

    @property
    def frame_limit(self) -> int:
        return self.max_message + RECORD_OVERHEAD

    def seal(self, msg: Message) -> bytes:
        return self.seal_bytes(json.dumps(msg, separators=(",", ":"), allow_nan=False).encode())

    def seal_bytes(self, plain: bytes) -> bytes:
        if len(plain) > self.max_message:
            raise LocalError(f"control message of {len(plain)} bytes exceeds {self.max_message}")
        if self.sent >= (1 << 64) - 1:
            raise LocalError("record counter exhausted: open a new session")
        counter = COUNTER.pack(self.sent)
        self.sent += 1
        return counter + self._send.encrypt(bytes(4) + counter, plain, counter)

    def open(self, record: bytes) -> Message:
        if len(record) < RECORD_OVERHEAD:
            raise ControlError("malformed", f"record of {len(record)} bytes")
        counter = record[: COUNTER.size]
        (seq,) = COUNTER.unpack(counter)
        if seq != self.received:
            raise ControlError("sequence", f"record {seq}, expected {self.received}")
        try:
            plain = self._recv.decrypt(bytes(4) + counter, record[COUNTER.size :], counter)
        except InvalidTag:
            raise ControlError("decrypt", f"record {seq} fails authentication") from None
        self.received += 1
        try:
            msg = json.loads(plain, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            raise ControlError("bad_message", "record is not JSON") from None
        if (
            not isinstance(msg, dict)
            or not isinstance(msg.get("type"), str)
            or type(msg.get("id")) is not int
        ):
            raise ControlError("bad_message", "message needs a string type and an integer id")
        return msg


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")
