"""The wire between an application (or controller) and its local mrcd: pure codecs.

A Unix stream socket carries frames: ``u32 length | u8 kind | body`` (little endian; the
length counts kind and body).  Control operations are JSON; the hot path is packed structs:

===========  =========  ==============================================================
kind         direction  body
===========  =========  ==============================================================
REQUEST      c -> d     ``u32 req_id`` + JSON ``{"op", "args", "nfds"}`` (+ SCM_RIGHTS fds)
REPLY        d -> c     ``u32 req_id`` + JSON ``{"ok": true, "result"}`` or
                        ``{"ok": false, "errno", "error"}``
POST_SEND    c -> d     ``u32 req_id, u32 qpn, u16 count`` + count x :data:`SEND_WR`
POST_RECV    c -> d     ``u32 req_id, u32 qpn, u16 count`` + count x ``u64 wr_id``
POST_REPLY   d -> c     ``u32 req_id, i32 errno, u16 bad_index`` + UTF-8 message
ARM_CQ       c -> d     ``u32 cq, u8 solicited_only`` (no reply)
COMPLETIONS  d -> c     ``u16 count`` + count x :data:`WORK_COMPLETION`
EVENT        d -> c     JSON ``{"type", ...}``: async events, connect requests, EV events
===========  =========  ==============================================================

A completion channel is a SOCK_SEQPACKET socketpair end the client passes in; each message
on it is one :data:`CQ_EVENT` record ``(cq, seq)``: the CQ was armed and has now been sent
``seq`` completions in total on the main socket, so the reader knows how far to read there.
"""

from __future__ import annotations

import enum
import errno
import json
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from mrcstack.api.errors import ApiError

HEADER = struct.Struct("<IB")
#: Largest frame either side accepts (a batch of ~350k work requests fits).
MAX_FRAME = 16 << 20
#: Most work requests or completions in one frame (the count is a u16).
MAX_BATCH = 0xFFFF
#: Most file descriptors one request may carry.
MAX_FDS = 4

REQ_ID = struct.Struct("<I")
POST_HEAD = struct.Struct("<IIH")
#: wr_id, opcode, flags, pad, lkey, offset, length, remote_addr, rkey, imm
SEND_WR = struct.Struct("<QBBHIQQQII")
RECV_WR = struct.Struct("<Q")
POST_REPLY = struct.Struct("<IiH")
ARM_CQ = struct.Struct("<IB")
COUNT = struct.Struct("<H")
#: cq, qpn, wr_id, status, opcode, flags, pad, byte_len, imm
WORK_COMPLETION = struct.Struct("<IIQBBBBII")
CQ_EVENT = struct.Struct("<II")

WR_SIGNALED = 0x1
WC_HAS_IMM = 0x1


class Kind(enum.IntEnum):
    REQUEST = 1
    REPLY = 2
    POST_SEND = 3
    POST_RECV = 4
    POST_REPLY = 5
    ARM_CQ = 6
    COMPLETIONS = 7
    EVENT = 8


def frame(kind: Kind, body: bytes) -> bytes:
    if len(body) + 1 > MAX_FRAME:
        raise ApiError(
            errno.E2BIG, f"message of {len(body)} bytes exceeds the {MAX_FRAME}-byte frame limit"
        )
    return HEADER.pack(len(body) + 1, kind) + body


def split_frames(buf: bytearray) -> list[tuple[int, bytes]]:
    """Remove the complete ``(kind, body)`` frames at the start of ``buf`` and return them.

    Raises ValueError on a frame longer than :data:`MAX_FRAME` or of length zero (the peer
    is broken or hostile: the caller drops the connection).
    """
    out: list[tuple[int, bytes]] = []
    pos = 0
    end = len(buf)
    while end - pos >= HEADER.size:
        length, kind = HEADER.unpack_from(buf, pos)
        if not 1 <= length <= MAX_FRAME:
            raise ValueError(f"bad frame length {length}")
        if end - pos - 4 < length:
            break
        out.append((kind, bytes(buf[pos + HEADER.size : pos + 4 + length])))
        pos += 4 + length
    if pos:
        del buf[:pos]
    return out


# JSON messages ----------------------------------------------------------------------------
def encode_json(kind: Kind, req_id: int | None, doc: object) -> bytes:
    data = json.dumps(doc, separators=(",", ":")).encode()
    head = b"" if req_id is None else REQ_ID.pack(req_id)
    return frame(kind, head + data)


def decode_json(body: bytes, with_id: bool) -> tuple[int, Any]:
    """``(req_id, document)``; ValueError if it is not a JSON object."""
    req_id = 0
    if with_id:
        if len(body) < REQ_ID.size:
            raise ValueError("truncated request id")
        (req_id,) = REQ_ID.unpack_from(body)
        body = body[REQ_ID.size :]
    doc = json.loads(bytes(body))
    if not isinstance(doc, dict):
        raise ValueError("message is not a JSON object")
    return req_id, doc


def request(req_id: int, op: str, args: dict[str, Any], nfds: int = 0) -> bytes:
    return encode_json(Kind.REQUEST, req_id, {"op": op, "args": args, "nfds": nfds})


def reply_ok(req_id: int, result: object) -> bytes:
    return encode_json(Kind.REPLY, req_id, {"ok": True, "result": result})


def reply_error(req_id: int, err: ApiError) -> bytes:
    return encode_json(Kind.REPLY, req_id, {"ok": False, "errno": err.errno, "error": err.message})


def event(doc: dict[str, Any]) -> bytes:
    return encode_json(Kind.EVENT, None, doc)


def result_of(doc: dict[str, Any]) -> Any:
    """The result of a decoded REPLY, or raise the ApiError it carries."""
    if doc.get("ok") is True:
        return doc.get("result")
    raise ApiError(
        int(doc.get("errno", errno.EIO)), str(doc.get("error", "mrcd reported an error"))
    )


# Work requests ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SendWrRecord:
    """One send work request as it crosses the socket (ints only; the daemon checks all)."""

    wr_id: int
    opcode: int
    flags: int
    lkey: int
    offset: int
    length: int
    remote_addr: int
    rkey: int
    imm: int


def encode_post_send(req_id: int, qpn: int, wrs: Sequence[SendWrRecord]) -> bytes:
    if not 0 < len(wrs) <= MAX_BATCH:
        raise ApiError(
            errno.EINVAL, f"post between 1 and {MAX_BATCH} work requests at once, not {len(wrs)}"
        )
    parts = [POST_HEAD.pack(req_id, qpn, len(wrs))]
    pack = SEND_WR.pack
    try:
        for w in wrs:
            parts.append(
                pack(
                    w.wr_id, w.opcode, w.flags, 0, w.lkey, w.offset, w.length,
                    w.remote_addr, w.rkey, w.imm,
                )
            )  # fmt: skip
    except struct.error as exc:
        raise ApiError(errno.EINVAL, f"work request field out of range: {exc}") from None
    return frame(Kind.POST_SEND, b"".join(parts))


def decode_post_send(body: bytes) -> tuple[int, int, list[SendWrRecord]]:
    req_id, qpn, count = POST_HEAD.unpack_from(body)
    if len(body) != POST_HEAD.size + count * SEND_WR.size:
        raise ValueError(f"POST_SEND of {len(body)} bytes does not hold {count} work requests")
    wrs = []
    for fields in SEND_WR.iter_unpack(body[POST_HEAD.size :]):
        wr_id, opcode, flags, _pad, lkey, offset, length, raddr, rkey, imm = fields
        wrs.append(SendWrRecord(wr_id, opcode, flags, lkey, offset, length, raddr, rkey, imm))
    return req_id, qpn, wrs


def encode_post_recv(req_id: int, qpn: int, wr_ids: Sequence[int]) -> bytes:
    if not 0 < len(wr_ids) <= MAX_BATCH:
        raise ApiError(
            errno.EINVAL, f"post between 1 and {MAX_BATCH} receive requests, not {len(wr_ids)}"
        )
    try:
        body = POST_HEAD.pack(req_id, qpn, len(wr_ids)) + b"".join(RECV_WR.pack(w) for w in wr_ids)
    except struct.error as exc:
        raise ApiError(errno.EINVAL, f"wr_id out of range: {exc}") from None
    return frame(Kind.POST_RECV, body)


def decode_post_recv(body: bytes) -> tuple[int, int, list[int]]:
    req_id, qpn, count = POST_HEAD.unpack_from(body)
    if len(body) != POST_HEAD.size + count * RECV_WR.size:
        raise ValueError(f"POST_RECV of {len(body)} bytes does not hold {count} wr_ids")
    return req_id, qpn, [w for (w,) in RECV_WR.iter_unpack(body[POST_HEAD.size :])]


def encode_post_reply(req_id: int, code: int, bad_index: int, message: str) -> bytes:
    return frame(Kind.POST_REPLY, POST_REPLY.pack(req_id, code, bad_index) + message.encode())


def decode_post_reply(body: bytes) -> tuple[int, int, int, str]:
    req_id, code, bad = POST_REPLY.unpack_from(body)
    return req_id, code, bad, bytes(body[POST_REPLY.size :]).decode(errors="replace")


# Completions ------------------------------------------------------------------------------
def encode_completions(entries: Sequence[bytes]) -> bytes:
    """``entries`` are :data:`WORK_COMPLETION`-packed records (at most MAX_BATCH)."""
    return frame(Kind.COMPLETIONS, COUNT.pack(len(entries)) + b"".join(entries))


def decode_completions(body: bytes) -> Iterator[tuple[int, ...]]:
    (count,) = COUNT.unpack_from(body)
    if len(body) != COUNT.size + count * WORK_COMPLETION.size:
        raise ValueError("COMPLETIONS length does not match its count")
    return WORK_COMPLETION.iter_unpack(body[COUNT.size :])
