"""Packet integrity: the trailer that protects every untrimmed MRC packet, and anti-replay.

Two modes share one small interface (``Integrity``) so the codec never knows which is in use:

- ``CrcIntegrity``: the RoCEv2 invariant CRC (ICRC): a CRC32 over a pseudo IPv6/UDP header
  (the fields no router changes), the headers and the payload.  It catches corruption, not
  forgery; it is the default on a trusted fabric.
- ``AeadIntegrity``: AES-GCM with a 16-byte tag, optionally encrypting the payload (UET's TSS
  does the same).  The nonce is ``sender id (4 bytes) | tx_seq (8 bytes)``: both directions
  may share one key because their sender ids differ, and a sender never reuses a ``tx_seq``.

Trimmed data packets carry no trailer (a switch cut it off with the payload); they are checked
only by ``hdr_check`` (``crc32_header``), see ``docs/wire-format.md``.  ``ReplayWindow`` drops
authenticated packets seen before, the way IPsec ESP does.

The decode errors live here, the lowest wire layer, because integrity checks raise them too;
``mrcstack.wire.codec`` re-exports them.
"""

from __future__ import annotations

import abc
import enum
import ipaddress
import struct
import zlib
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from mypy_extensions import mypyc_attr

from mrcstack.errors import LocalError, PeerError
from mrcstack.wire.evformat import stev_source_port
from mrcstack.wire.packets import (
    AEAD_TAG_FLAG,
    ROCEV2_UDP_PORT,
    SWITCH_FLAGS,
    XETH_OPCODES,
    XFETH_OPCODES,
)

BytesLike = bytes | bytearray | memoryview

CRC_TRAILER_LEN: Final = 4
AEAD_TAG_LEN: Final = 16  # AES-GCM full-length tag
AEAD_KEY_LENS: Final = (16, 32)  # AES-128-GCM or AES-256-GCM
SENDER_ID_BITS: Final = 32  # first 4 bytes of the 12-byte GCM nonce
TX_SEQ_BITS: Final = 64  # last 8 bytes of the nonce
U32_MAX: Final = (1 << 32) - 1
U64_MAX: Final = (1 << 64) - 1
DEFAULT_REPLAY_WINDOW: Final = 4096
#: How far behind the newest sealed tx_seq a packet may still be sealed (nonce-reuse guard;
#: a wider window costs more per packet: 4096 bits is about 0.4 us, 65536 about 1.6 us).
SEAL_GUARD_WINDOW: Final = DEFAULT_REPLAY_WINDOW

HDR_CHECK_LEN: Final = 4
BTH_LEN: Final = 12
XETH_LEN: Final = 32  # mrcstack's extension on writes and EV probes
XFETH_LEN: Final = 36  # mrcstack's extension on feedback (SACK, NACK, probe reply)
_FLAGS_OFFSET_IN_EXT: Final = 1
_ZERO_CHECK: Final = bytes(HDR_CHECK_LEN)
_CLEAR_SWITCH_FLAGS: Final = 0xFF & ~int(SWITCH_FLAGS)
_U32: Final = struct.Struct(">I")
_ICRC: Final = struct.Struct("<I")  # the ICRC goes out least significant byte first (as Scapy's)
_NONCE_SEQ: Final = struct.Struct(">Q")
# ICRC pseudo header (RoCEv2 annex A17): 8 bytes of ones stand for the absent LRH; in the IPv6
# header traffic class, flow label and hop limit are ones (routers change them), as are the
# UDP checksum and BTH byte 4 (FECN, BECN, reserved).
_ICRC_START: Final = zlib.crc32(b"\xff" * 8 + b"\x6f\xff\xff\xff")
# The rest of the pseudo IPv6 header (payload length, next header UDP, hop limit as ones,
# the two addresses) and the UDP header (ports, length, checksum as ones), in one pack.
_ICRC_PSEUDO: Final = struct.Struct(">HBB32sHHHH")
_ICRC_BTH_VARIANT: Final = b"\xff"
_IPV6_UDP_NEXT: Final = 17
_UDP_HEADER: Final = 8
_UNSPECIFIED: Final = bytes(16)
_UNSPECIFIED_PAIR: Final = _UNSPECIFIED * 2


class DecodeReason(enum.Enum):
    """Why a received datagram was rejected (one counter per reason in the daemons)."""

    TRUNCATED = "truncated"
    BAD_OPCODE = "bad_opcode"
    BAD_VERSION = "bad_version"
    BAD_LENGTH = "bad_length"
    BAD_HEADER_CHECK = "bad_header_check"
    BAD_CHECKSUM = "bad_checksum"
    BAD_AUTH = "bad_auth"
    BAD_FIELD = "bad_field"


class DecodeError(PeerError):
    """Bytes from the peer (or the network) that are not a valid MRC packet."""

    def __init__(self, reason: DecodeReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[type[DecodeError], tuple[DecodeReason, str]]:
        return (DecodeError, (self.reason, self.detail))


class WireUsageError(LocalError, ValueError):
    """Local misuse of the wire API: a field out of range, a bad key, a reused nonce."""


def crc32_header(header: BytesLike) -> int:
    """CRC32 of a complete header (BTH..extension) as ``hdr_check`` defines it.

    The ``hdr_check`` field (the last 4 header bytes) counts as zero and the switch-writable
    bits (``SWITCH_FLAGS``) of a data/probe extension's flags byte as clear, so a header
    trimmed in flight still verifies.
    """
    n = len(header)
    if n < BTH_LEN + HDR_CHECK_LEN:
        raise WireUsageError(f"a header is at least {BTH_LEN + HDR_CHECK_LEN} bytes, got {n}")
    if header[0] in XETH_OPCODES:
        ext_len = XETH_LEN
    elif header[0] in XFETH_OPCODES:
        ext_len = XFETH_LEN
    else:
        raise WireUsageError(f"opcode {header[0]:#04x} has no MRC extension")
    flags_at = n - ext_len + _FLAGS_OFFSET_IN_EXT
    if flags_at < BTH_LEN:
        raise WireUsageError(f"header of {n} bytes is too short for opcode {header[0]:#04x}")
    view = memoryview(header)
    crc = zlib.crc32(view[:flags_at])
    crc = zlib.crc32(bytes((header[flags_at] & _CLEAR_SWITCH_FLAGS,)), crc)
    crc = zlib.crc32(view[flags_at + 1 : n - HDR_CHECK_LEN], crc)
    return zlib.crc32(_ZERO_CHECK, crc)


# Python subclasses of it (and of its kin below) run beside it compiled (mrcstack.native).
@mypyc_attr(allow_interpreted_subclasses=True)
class Integrity(abc.ABC):
    """Seals outgoing packets with a trailer and opens incoming ones."""

    __slots__ = ()
    trailer_len: int
    #: What the sender sets in the extension's flags byte for this trailer (AEAD_TAG_FLAG
    #: for an AES-GCM tag, 0 for the ICRC), and a receiver requires.
    tag_flag: int = 0

    @abc.abstractmethod
    def seal(
        self,
        header: BytesLike,
        payload: bytes | memoryview,
        tx_seq: int,
        plane: int = 0,
        ev: int = 0,
    ) -> tuple[bytes | memoryview, bytes]:
        """Return (payload as sent, trailer) for a packet with this header, sent on ``plane``
        along ``ev`` (the EV the packet's own extension header names)."""

    @abc.abstractmethod
    def open(
        self,
        header: BytesLike,
        payload: bytes | memoryview,
        trailer: BytesLike,
        tx_seq: int,
        plane: int = 0,
        ev: int = 0,
    ) -> bytes | memoryview:
        """Return the plaintext payload, or raise DecodeError (BAD_CHECKSUM / BAD_AUTH)."""

    def seal_into(
        self,
        packet: bytearray | memoryview,
        hlen: int,
        end: int,
        tx_seq: int,
        plane: int = 0,
        ev: int = 0,
    ) -> None:
        """:meth:`seal` a packet laid out in ``packet``: header ``[:hlen]``, payload
        ``[hlen:end]``, room for the trailer after it; the payload as sent and the trailer
        are written in place (a data packet is built in one buffer)."""
        view = memoryview(packet)
        payload = view[hlen:end]
        body, trailer = self.seal(view[:hlen], payload, tx_seq, plane, ev)
        if body is not payload:
            view[hlen:end] = body
        view[end:] = trailer

    def open_at(
        self, view: memoryview, hlen: int, end: int, tx_seq: int, plane: int = 0, ev: int = 0
    ) -> bytes | memoryview:
        """:meth:`open` a received datagram ``view``: header ``[:hlen]``, payload
        ``[hlen:end]``, trailer ``[end:]``."""
        return self.open(view[:hlen], view[hlen:end], view[end:], tx_seq, plane, ev)


def _address(value: bytes | str) -> bytes:
    try:
        packed = value if isinstance(value, bytes) else ipaddress.IPv6Address(value).packed
    except ValueError as exc:
        raise WireUsageError(f"an ICRC address must be IPv6: {exc}") from None
    if len(packed) != len(_UNSPECIFIED):
        raise WireUsageError(f"an ICRC address is 16 bytes (IPv6), got {len(packed)}")
    return packed


@dataclass(frozen=True, slots=True)
class IcrcPath:
    """One plane's UDP endpoints as a packet arrives, for the ICRC's pseudo header."""

    local: bytes | str
    peer: bytes | str
    local_port: int = ROCEV2_UDP_PORT
    peer_port: int = ROCEV2_UDP_PORT

    def __reduce__(self) -> tuple[type[IcrcPath], tuple[object, ...]]:
        # What pickle and copy use: compiled by mypyc, a frozen dataclass cannot be
        # restored field by field (mrcd hands QPs to its data-path workers pickled).
        return (IcrcPath, (self.local, self.peer, self.local_port, self.peer_port))


@mypyc_attr(allow_interpreted_subclasses=True)
class CrcIntegrity(Integrity):
    """The RoCEv2 ICRC trailer: detects corruption, not forgery.

    The CRC covers a pseudo IPv6/UDP header, so it needs each plane's addresses and ports:
    ``paths[plane]`` as they are when the packet arrives (with SRv6 the final destination, as
    for a UDP checksum).  Without ``paths`` (the simulator, a test) the addresses count as
    ``::`` and both ports as 4791.  Switches set SWITCH_FLAGS only when they trim, and a
    trimmed packet has no trailer, so the CRC covers the headers exactly as sent.
    """

    __slots__ = ("_ev_ports", "_open_ctx", "_seal_ctx")
    trailer_len = CRC_TRAILER_LEN

    def __init__(self, paths: tuple[IcrcPath, ...] = (), *, ev_ports: bool = False) -> None:
        #: STEV: each packet's UDP source port is its EV's (``stev_source_port``).
        self._ev_ports = ev_ports
        self._seal_ctx: list[tuple[bytes, int, int]] = []
        self._open_ctx: list[tuple[bytes, int, int]] = []
        for path in paths:
            local, peer = _address(path.local), _address(path.peer)
            for port in (path.local_port, path.peer_port):
                if type(port) is not int or not 0 <= port <= 0xFFFF:
                    raise WireUsageError(f"an ICRC port is 0..65535, got {port!r}")
            self._seal_ctx.append((local + peer, path.local_port, path.peer_port))
            self._open_ctx.append((peer + local, path.peer_port, path.local_port))

    def _icrc(
        self, sealing: bool, header: BytesLike, payload: BytesLike, plane: int, ev: int
    ) -> int:
        ctx = self._seal_ctx if sealing else self._open_ctx
        if ctx:
            if not 0 <= plane < len(ctx):
                raise DecodeError(DecodeReason.BAD_FIELD, f"no ICRC addresses for plane {plane}")
            addresses, sport, dport = ctx[plane]
        else:
            addresses, sport, dport = _UNSPECIFIED_PAIR, ROCEV2_UDP_PORT, ROCEV2_UDP_PORT
        if self._ev_ports:  # the sender's port carries the EV; the receiver's stays as is
            sport = stev_source_port(ev)
        size = _UDP_HEADER + len(header) + len(payload) + CRC_TRAILER_LEN
        pseudo = _ICRC_PSEUDO.pack(
            size, _IPV6_UDP_NEXT, 0xFF, addresses, sport, dport, size, 0xFFFF
        )
        crc = zlib.crc32(pseudo, _ICRC_START)
        view = memoryview(header)
        crc = zlib.crc32(view[:4], crc)
        crc = zlib.crc32(_ICRC_BTH_VARIANT, crc)
        crc = zlib.crc32(view[5:], crc)
        return zlib.crc32(payload, crc)

    def seal(
        self,
        header: BytesLike,
        payload: bytes | memoryview,
        tx_seq: int,
        plane: int = 0,
        ev: int = 0,
    ) -> tuple[bytes | memoryview, bytes]:
        return payload, _ICRC.pack(self._icrc(True, header, payload, plane, ev))

    def open(
        self,
        header: BytesLike,
        payload: bytes | memoryview,
        trailer: BytesLike,
        tx_seq: int,
        plane: int = 0,
        ev: int = 0,
    ) -> bytes | memoryview:
        crc = self._icrc(False, header, payload, plane, ev)
        if len(trailer) != CRC_TRAILER_LEN or _ICRC.unpack(trailer)[0] != crc:
            raise DecodeError(DecodeReason.BAD_CHECKSUM, "ICRC does not match")
        return payload

    def __repr__(self) -> str:
        return f"CrcIntegrity(planes={len(self._seal_ctx)})"


class ReplayWindow:
    """Sliding-window anti-replay over the 64-bit tx_seq, as in IPsec ESP (RFC 4303 3.4.3).

    The window is the ``size`` positions up to the newest accepted (``top``).  It is kept as
    the positions in it not seen yet, not as a ``size``-bit mask: those below ``_floor``
    all, and the ones in ``_holes`` above it.  In-order traffic, the usual case on both
    ends (the seal guard's and the receiver's), then costs two comparisons and a store per
    packet where a mask is shifted, a new ``size``-bit integer, each time; a gap of ``g``
    adds ``g - 1`` holes once.  ``check`` before the (costly) authentication, ``update``
    only after it passed, so forged packets cannot move the window.
    """

    __slots__ = ("_floor", "_holes", "_size", "_top")

    def __init__(self, size: int = DEFAULT_REPLAY_WINDOW) -> None:
        if not isinstance(size, int) or size < 1:
            raise WireUsageError(f"replay window size must be a positive int, got {size!r}")
        self._size = size
        self._top = -1  # nothing seen yet
        self._floor = 0
        self._holes: set[int] = set()

    @property
    def size(self) -> int:
        return self._size

    @property
    def top(self) -> int:
        """Highest tx_seq accepted so far (-1 before the first)."""
        return self._top

    def check(self, tx_seq: int) -> bool:
        """True if tx_seq is new: ahead of the window, or inside it and not yet seen."""
        if not 0 <= tx_seq <= U64_MAX:
            raise WireUsageError(f"tx_seq must be a 64-bit unsigned int, got {tx_seq!r}")
        top = self._top
        if tx_seq > top:
            return True
        if top - tx_seq >= self._size:
            return False
        return tx_seq < self._floor or tx_seq in self._holes

    def update(self, tx_seq: int) -> None:
        """Record tx_seq as seen, sliding the window forward if it is the newest."""
        if not 0 <= tx_seq <= U64_MAX:
            raise WireUsageError(f"tx_seq must be a 64-bit unsigned int, got {tx_seq!r}")
        top = self._top
        if tx_seq == top + 1 and top >= 0:
            self._top = tx_seq  # in order: nothing between to remember
        elif tx_seq > top:
            if top < 0 or tx_seq - top >= self._size:
                # Nothing seen is left in the window: all of it below tx_seq is unseen.
                self._holes.clear()
                self._floor = tx_seq
            else:
                holes = self._holes
                holes.update(range(top + 1, tx_seq))
                if len(holes) > self._size + (self._size >> 1):
                    # Forget the holes that fell out of the window (never filled: lost).
                    # At most size - 1 stay, so this runs once per size / 2 added at most.
                    oldest = tx_seq - self._size
                    self._holes = {seq for seq in holes if seq > oldest}
            self._top = tx_seq
        elif top - tx_seq < self._size:
            floor = self._floor
            if tx_seq < floor:
                # Below the floor: what lies between it and tx_seq stays unseen, as holes.
                # (No pruning needed: the floor is within a window of the last start-over,
                # which cleared the holes, so all of them are in the window.)
                self._holes.update(range(tx_seq + 1, floor))
                self._floor = tx_seq
            else:
                self._holes.discard(tx_seq)


def _check_id(name: str, value: int) -> None:
    if not isinstance(value, int) or not 0 <= value <= U32_MAX:
        raise WireUsageError(f"{name} must be a 32-bit unsigned int, got {value!r}")


@mypyc_attr(allow_interpreted_subclasses=True)
class AeadIntegrity(Integrity):
    """AES-GCM: a 16-byte tag authenticates header and payload; optionally encrypts the payload.

    Nonce = 4-byte sender id + 8-byte tx_seq (``local_id`` when sealing, ``peer_id`` when
    opening), so the two directions of a connection can share one key.  GCM breaks if a nonce
    is reused with different data, so ``seal`` refuses a tx_seq it has already sealed (or one
    too far behind the newest to tell): every transmission, retransmissions included, needs a
    fresh tx_seq, and each (key, sender id) pair must have a single tx_seq counter.
    """

    __slots__ = (
        "_aead",
        "_encrypt",
        "_local_id",
        "_open_prefix",
        "_peer_id",
        "_seal_prefix",
        "_sealed",
    )
    trailer_len = AEAD_TAG_LEN
    tag_flag = AEAD_TAG_FLAG

    def __init__(self, key: bytes, local_id: int, peer_id: int, encrypt: bool = False) -> None:
        if not isinstance(key, bytes | bytearray) or len(key) not in AEAD_KEY_LENS:
            got = f"{len(key)} bytes" if isinstance(key, bytes | bytearray) else repr(type(key))
            raise WireUsageError(f"AES-GCM key must be 16 or 32 bytes, got {got}")
        _check_id("local_id", local_id)
        _check_id("peer_id", peer_id)
        if local_id == peer_id:
            raise WireUsageError("local_id and peer_id must differ (nonces would collide)")
        self._aead = AESGCM(bytes(key))
        self._encrypt = bool(encrypt)
        self._local_id = local_id
        self._peer_id = peer_id
        self._seal_prefix = _U32.pack(local_id)
        self._open_prefix = _U32.pack(peer_id)
        self._sealed = ReplayWindow(SEAL_GUARD_WINDOW)

    @property
    def encrypt(self) -> bool:
        return self._encrypt

    @property
    def local_id(self) -> int:
        return self._local_id

    @property
    def peer_id(self) -> int:
        return self._peer_id

    def seal(
        self,
        header: BytesLike,
        payload: bytes | memoryview,
        tx_seq: int,
        plane: int = 0,
        ev: int = 0,
    ) -> tuple[bytes | memoryview, bytes]:
        if not self._sealed.check(tx_seq):
            raise WireUsageError(f"tx_seq {tx_seq} already sealed or too old: GCM nonce reuse")
        self._sealed.update(tx_seq)
        nonce = self._seal_prefix + _NONCE_SEQ.pack(tx_seq)
        if self._encrypt:
            sealed = memoryview(self._aead.encrypt(nonce, payload, header))
            return sealed[:-AEAD_TAG_LEN], bytes(sealed[-AEAD_TAG_LEN:])
        return payload, self._aead.encrypt(nonce, b"", bytes(header) + payload)

    def seal_into(
        self,
        packet: bytearray | memoryview,
        hlen: int,
        end: int,
        tx_seq: int,
        plane: int = 0,
        ev: int = 0,
    ) -> None:
        # The header and payload are one buffer here: authenticated as they lie, with no
        # copy joining them (the generic seal's), once per data packet sent.
        sealed = self._sealed
        if not sealed.check(tx_seq):
            raise WireUsageError(f"tx_seq {tx_seq} already sealed or too old: GCM nonce reuse")
        sealed.update(tx_seq)
        nonce = self._seal_prefix + _NONCE_SEQ.pack(tx_seq)
        view = packet if type(packet) is memoryview else memoryview(packet)
        if self._encrypt:
            view[hlen:] = self._aead.encrypt(nonce, view[hlen:end], view[:hlen])
        else:
            view[end:] = self._aead.encrypt(nonce, b"", view[:end])

    def open_at(
        self, view: memoryview, hlen: int, end: int, tx_seq: int, plane: int = 0, ev: int = 0
    ) -> bytes | memoryview:
        # As open, with the datagram's own contiguous bytes as the associated data (and, when
        # encrypting, payload + tag as the ciphertext): no copy joining them.
        if len(view) - end != AEAD_TAG_LEN or not 0 <= tx_seq <= U64_MAX:
            raise DecodeError(DecodeReason.BAD_AUTH, "AES-GCM tag missing or malformed")
        nonce = self._open_prefix + _NONCE_SEQ.pack(tx_seq)
        try:
            if self._encrypt:
                return self._aead.decrypt(nonce, view[hlen:], view[:hlen])
            self._aead.decrypt(nonce, view[end:], view[:end])
        except InvalidTag:
            raise DecodeError(DecodeReason.BAD_AUTH, "AES-GCM tag does not verify") from None
        return view[hlen:end]

    def open(
        self,
        header: BytesLike,
        payload: bytes | memoryview,
        trailer: BytesLike,
        tx_seq: int,
        plane: int = 0,
        ev: int = 0,
    ) -> bytes | memoryview:
        if len(trailer) != AEAD_TAG_LEN or not 0 <= tx_seq <= U64_MAX:
            raise DecodeError(DecodeReason.BAD_AUTH, "AES-GCM tag missing or malformed")
        nonce = self._open_prefix + _NONCE_SEQ.pack(tx_seq)
        try:
            if self._encrypt:
                return self._aead.decrypt(nonce, bytes(payload) + trailer, header)
            self._aead.decrypt(nonce, trailer, bytes(header) + payload)
        except InvalidTag:
            raise DecodeError(DecodeReason.BAD_AUTH, "AES-GCM tag does not verify") from None
        return payload

    def __repr__(self) -> str:
        return (
            f"AeadIntegrity(local_id={self._local_id}, peer_id={self._peer_id}, "
            f"encrypt={self._encrypt})"
        )
