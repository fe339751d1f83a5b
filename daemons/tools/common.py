"""What mrc-write-bw and mrc-write-lat share: the handshake, patterns, connection setup, events.

The handshake is the connection's private data (``qp.connect`` / ``listener.accept``), as
MRC has no RDMA-CM and mrcd already exchanges QP numbers over its control channel:

- the client's CONNECT carries a :class:`Hello` (what it will do: size, QPs, slots, verify,
  and where the server may write back to it: credits, the final result, lat's pongs);
- the server's ACCEPT carries a :class:`Welcome` (where the client writes: the address and
  rkey of this QP's slots in the server's registered memory, and of its control cell).

Immediates are 32 bits: bit 31 (:data:`END`) marks the end of a run; the other 31 bits are
a write count (bw), a checksum (bw --verify), or an iteration number (lat).  The END write's
16 bytes (:func:`pack_end`) are the count again and flags: :data:`END_STOP` says that no run
follows after all, although the hello announced one (``-a`` stopped early: Ctrl-C, or lat
--verify found a bad echo).

``-a`` (all sizes) is a series of runs, one per size, each a fresh connection to the same
service: every hello but the last has :data:`FLAG_MORE`, and the server keeps its listener
and accepts the next run until a run without it (or one whose END has :data:`END_STOP`) is
over.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import random
import signal
import struct
import sys
import threading
import time
import zlib
from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TypeVar

from mrcstack.api import (
    ApiError,
    AsyncEventType,
    Context,
    Listener,
    MemoryRegion,
    QpCap,
    QueuePair,
    WcOpcode,
    WorkCompletion,
    WriteWr,
)
from mrcstack.api.types import ConnectRequest
from mrcstack.qpn import qpn_text

MAGIC = b"MRCT"
#: 2: FLAG_MORE (-a), the END write's flags, unknown hello flags rejected.  A version-1 server
#: would take a FLAG_MORE hello for a single run and leave the client's next run waiting,
#: so the version changed although the hello's layout did not.
VERSION = 2
KIND_BW, KIND_LAT = 1, 2
BW_PROG, LAT_PROG = "mrc-write-bw", "mrc-write-lat"
KIND_NAMES = {KIND_BW: BW_PROG, KIND_LAT: LAT_PROG}
FLAG_VERIFY = 0x1
FLAG_MORE = 0x2  # another run (the next size of -a) follows this one
FLAG_BIDIR = 0x4  # bw -b: the server writes back to the client's data_addr as much
KNOWN_FLAGS = FLAG_VERIFY | FLAG_MORE | FLAG_BIDIR
END_STOP = 0x1  # END payload flag: no run follows after all
END = 1 << 31  # immediate bit: the run is over (the other bits: the count)
MASK31 = END - 1
DEFAULT_SERVICE = 18515  # perftest's default port
MAX_SIZE = 1 << 31  # one work request (mrcd's limit)
MAX_DEPTH = 16384
MAX_QPS = 256
MIB = 1 << 20
MAX_ALL_SIZE = 8 * MIB  # -a: perftest's 2**23
#: Per-QP reply area in the client's region: the credit cell (the server's credit writes
#: land there), the result cell (the server's final counts) and the END write's source.
REPLY_AREA = 128
CREDIT_CELL, RESULT_CELL, END_CELL = 0, 64, 112
END_LEN = 16  # the END write: count, flags (at END_CELL, into the server's control cell)
CTRL_AREA = 64  # per QP in the server's region: where the END write lands
POLL_N = 4096  # completions taken per poll
END_WR = 1 << 62  # wr_id bit of the END and RESULT writes
CREDIT_WR = 1 << 61  # wr_id bit of bw --verify's credit writes
REVERSE_WR = 1 << 60  # wr_id bit of the server's writes back to the client (bw -b)
MAX_CREDITS_OUT = 16  # credit writes in flight per QP (credits are cumulative)
RECVS = 4096  # receive buffers kept posted per QP (immediates)
REPOST = 1024  # repost in batches of this many (each post_recv is a round trip to mrcd)
LAT_SLOTS = 2  # lat: alternating write slots on each side (a source stays put while in flight)

_HELLO = struct.Struct("<4sBBHHHQIIIQIQ")
#: The hello's fields after magic, version, kind and flags, in their order on the wire.
_HELLO_FIELDS = (
    "qps",
    "index",
    "size",
    "slots",
    "imm_every",
    "tx_depth",
    "reply_addr",
    "reply_rkey",
    "data_addr",
)
_WELCOME = struct.Struct("<4sBBHQIQ")
_RESULT = struct.Struct("<QQQQ")
_END = struct.Struct("<QQ")


class ToolError(Exception):
    """The run failed (mrcd unreachable, connection refused, a QP failed): exit status 1."""


class UsageError(ToolError):
    """Bad flags: one line, exit status 2."""


# The handshake ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hello:
    """The client's private data: the run it asks for and where the server writes back."""

    kind: int
    verify: bool
    qps: int
    index: int  # which of the client's QPs this is
    size: int  # bytes per write
    slots: int  # write slots per QP in the server's region
    imm_every: int  # bw: every Nth write carries an immediate (1 with --verify)
    tx_depth: int
    reply_addr: int  # this QP's REPLY_AREA in the client's region
    reply_rkey: int
    data_addr: int = 0  # lat: the client's pong slots; bw -b: where the server writes
    more: bool = False  # -a: another run (the next size) follows this one
    bidir: bool = False  # bw -b: the server writes to data_addr as the client writes to it

    def pack(self) -> bytes:
        flags = (FLAG_VERIFY if self.verify else 0) | (FLAG_MORE if self.more else 0)
        flags |= FLAG_BIDIR if self.bidir else 0
        fields = (getattr(self, name) for name in _HELLO_FIELDS)
        return _HELLO.pack(MAGIC, VERSION, self.kind, flags, *fields)

    @classmethod
    def unpack(cls, data: bytes) -> Hello:
        """Raises ValueError (with the reason) for anything that is not our client."""
        if len(data) < _HELLO.size:
            raise ValueError(f"private data of {len(data)} bytes is not a tool's hello")
        magic, version, kind, flags, *rest = _HELLO.unpack_from(data)
        fields: dict[str, int] = dict(zip(_HELLO_FIELDS, rest, strict=True))
        qps, index, size = fields["qps"], fields["index"], fields["size"]
        slots, imm_every, tx_depth = fields["slots"], fields["imm_every"], fields["tx_depth"]
        if magic != MAGIC:
            raise ValueError("private data is not a tool's hello (bad magic)")
        if version != VERSION:
            raise ValueError(f"hello version {version}, this tool speaks {VERSION}")
        if kind not in KIND_NAMES:
            raise ValueError(f"unknown test kind {kind}")
        if flags & ~KNOWN_FLAGS:
            raise ValueError(f"unknown hello flags {flags & ~KNOWN_FLAGS:#x}")
        if not (1 <= qps <= MAX_QPS and index < qps and 1 <= size <= MAX_SIZE):
            raise ValueError(f"bad hello: qps={qps} index={index} size={size}")
        if not (1 <= slots <= 2 * MAX_DEPTH and imm_every >= 1 and 1 <= tx_depth <= MAX_DEPTH):
            raise ValueError(f"bad hello: slots={slots} imm_every={imm_every} depth={tx_depth}")
        return cls(
            kind=kind,
            verify=bool(flags & FLAG_VERIFY),
            more=bool(flags & FLAG_MORE),
            bidir=bool(flags & FLAG_BIDIR),
            **fields,
        )

    def same_run(self, other: Hello) -> bool:
        return (self.kind, self.verify, self.qps, self.size, self.slots, self.more, self.bidir) == (
            other.kind,
            other.verify,
            other.qps,
            other.size,
            other.slots,
            other.more,
            other.bidir,
        )


@dataclass(frozen=True, slots=True)
class Welcome:
    """The server's private data: where this QP writes in the server's region."""

    slots_addr: int
    rkey: int
    ctrl_addr: int

    def pack(self) -> bytes:
        return _WELCOME.pack(MAGIC, VERSION, 0, 0, self.slots_addr, self.rkey, self.ctrl_addr)

    @classmethod
    def unpack(cls, data: bytes) -> Welcome:
        if len(data) < _WELCOME.size:
            raise ToolError("the server's reply is not a tool's welcome (is it mrc-write-*?)")
        magic, version, _status, _pad, slots_addr, rkey, ctrl_addr = _WELCOME.unpack_from(data)
        if magic != MAGIC or version != VERSION:
            raise ToolError(f"the server speaks another protocol ({magic!r} v{version})")
        return cls(slots_addr, rkey, ctrl_addr)


@dataclass(frozen=True, slots=True)
class Result:
    """The server's final counts for one QP, written into the client's result cell."""

    writes: int
    bytes: int
    verified: int
    mismatches: int

    def pack_into(self, buf: memoryview, offset: int) -> None:
        _RESULT.pack_into(buf, offset, self.writes, self.bytes, self.verified, self.mismatches)

    @classmethod
    def unpack_from(cls, buf: memoryview, offset: int) -> Result:
        return cls(*_RESULT.unpack_from(buf, offset))

    def to_json(self) -> dict[str, int]:
        return {
            "writes": self.writes,
            "bytes": self.bytes,
            "verified": self.verified,
            "mismatches": self.mismatches,
        }


RESULT_SIZE = _RESULT.size


def pack_end(buf: memoryview, offset: int, count: int, stop: bool) -> None:
    """The END write's bytes: the write count and :data:`END_STOP`."""
    _END.pack_into(buf, offset, count, END_STOP if stop else 0)


def end_stop(buf: memoryview, offset: int) -> bool:
    """Whether the END write that landed at ``offset`` says no run follows after all."""
    return bool(_END.unpack_from(buf, offset)[1] & END_STOP)


def send_end(
    qp: QueuePair,
    mr: MemoryRegion,
    offset: int,
    welcome: Welcome,
    count: int,
    stop: bool,
    wr_id: int = END_WR,
) -> None:
    """The client's END: ``count`` (and :data:`END_STOP`) from ``offset`` of ``mr`` into the
    server's control cell, with END and the count as the immediate."""
    pack_end(mr.buf, offset, count, stop)
    imm = END | (count & MASK31)
    qp.post_send(WriteWr(wr_id, (mr, offset, END_LEN), welcome.ctrl_addr, welcome.rkey, imm))


def send_result(
    qp: QueuePair,
    mr: MemoryRegion,
    offset: int,
    hello: Hello,
    result: Result,
    wr_id: int = END_WR,
) -> None:
    """The server's answer to an END: its counts from ``offset`` of ``mr`` into the client's
    result cell, with END and the mismatches as the immediate."""
    result.pack_into(mr.buf, offset)
    dst = hello.reply_addr + RESULT_CELL
    imm = END | (result.mismatches & MASK31)
    qp.post_send(WriteWr(wr_id, (mr, offset, RESULT_SIZE), dst, hello.reply_rkey, imm))


@contextlib.contextmanager
def naming_size(size: int, sweep: bool) -> Iterator[None]:
    """Within -a (``sweep``), a run's error names the size it happened at."""
    try:
        yield
    except (ToolError, ApiError) as exc:
        if not sweep:
            raise
        raise ToolError(f"size {size}: {exc}") from None


def all_sizes(max_size: int) -> list[int]:
    """-a: 2, 4, 8, ... up to ``max_size`` (a power of two), like perftest's 2**1..2**23."""
    return [1 << k for k in range(1, max_size.bit_length()) if 1 << k <= max_size]


def delta31(new: int, old: int) -> int:
    """How far a 31-bit counter carried in an immediate moved on (it wraps)."""
    return (new - old) & MASK31


def align(n: int, to: int = 64) -> int:
    return (n + to - 1) // to * to


# Patterns -----------------------------------------------------------------------------------
class Pattern:
    """Deterministic, different data for every (QP, iteration): a window of a random block
    at an offset derived from both, with ``(qp << 48 | iteration)`` in the first 8 bytes."""

    CHUNK = MIB

    def __init__(self, size: int, seed: int = 1) -> None:
        self.size = size
        self.span = min(size, self.CHUNK)
        self.block = memoryview(random.Random(seed).randbytes(2 * self.span))

    def fill(self, dest: memoryview, qp: int, iteration: int) -> int:
        """Write the pattern into ``dest`` (``size`` bytes); returns its CRC-32."""
        span, block = self.span, self.block
        start = (iteration * 40503 + qp * 9973) % span
        pos = 0
        while pos < self.size:
            n = min(span, self.size - pos)
            dest[pos : pos + n] = block[start : start + n]
            pos += n
            start = (start + 7919) % span
        header = struct.pack("<Q", (qp << 48) | (iteration & ((1 << 48) - 1)))
        head = min(8, self.size)
        dest[:head] = header[:head]
        return zlib.crc32(dest[: self.size])


def crc31(data: memoryview) -> int:
    return zlib.crc32(data) & MASK31


# Connection setup ---------------------------------------------------------------------------
def connect(qp: QueuePair, host: int, service: int, hello: Hello, timeout: float) -> Welcome:
    """Connect, retrying while nothing listens yet (the server may start a moment later)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            data = qp.connect(host, service, hello.pack(), timeout=timeout + 15)
        except ApiError as exc:
            if exc.errno != errno.ECONNREFUSED or time.monotonic() >= deadline:
                raise ToolError(f"cannot connect to service {service} on h{host}: {exc}") from None
            time.sleep(0.2)
            continue
        return Welcome.unpack(data)


def wait_hello(
    listener: Listener,
    kind: int,
    timeout: float | None,
    like: Hello | None = None,
    host: int | None = None,
    waiting_for: str = "",
) -> tuple[ConnectRequest, Hello]:
    """The next request that is a client of this tool (others are rejected); with ``host``
    (the next run of -a), only from that host, and a first QP."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        req = listener.get_request(timeout=left if left is not None else 1.0)
        if req is None:
            if deadline is not None and time.monotonic() >= deadline:
                what = waiting_for or f"the client's QP {like.index + 1 if like else 0}"
                raise ToolError(f"{what} did not come within {timeout:g} s")
            continue
        try:
            hello = Hello.unpack(req.private_data)
            if hello.kind != kind:
                raise ValueError(f"a {KIND_NAMES[hello.kind]} client, this is {KIND_NAMES[kind]}")
            if like is not None and not (hello.same_run(like) and hello.index == like.index + 1):
                raise ValueError("a QP of another run")
            if host is not None and (req.remote_host != host or hello.index != 0):
                raise ValueError(f"not the next run of h{host}'s -a")
        except ValueError as exc:
            print(f"{KIND_NAMES[kind]}: rejected h{req.remote_host}: {exc}", file=sys.stderr)
            listener.reject(req)
            continue
        return req, hello


# QPs and their completions ------------------------------------------------------------------
Owner = TypeVar("Owner")


def qp_cap(max_send_wr: int) -> QpCap:
    """A tool's QP: ``max_send_wr`` writes, and the receive buffers :class:`Receives` keeps."""
    return QpCap(max_send_wr=max_send_wr, max_recv_wr=RECVS)


def check_wc(wc: WorkCompletion) -> None:
    """A failed work request ends the run."""
    if not wc.ok:
        raise ToolError(
            f"QP {qpn_text(wc.qpn)}: work request {wc.wr_id:#x} failed: {wc.status.name}"
        )


class Done(enum.Enum):
    """What a completion on a tool's QP says, as the tools number their work requests."""

    WROTE = "wrote"  # one of our writes completed
    ENDED = "ended"  # our END (client) or our counts (server) completed: END_WR in its wr_id
    ARRIVED = "arrived"  # a write with immediate arrived (a receive buffer is taken)


def done_of(wc: WorkCompletion) -> Done:
    if wc.opcode is WcOpcode.RDMA_WRITE:
        return Done.ENDED if wc.wr_id & END_WR else Done.WROTE
    return Done.ARRIVED


def counts_unconfirmed(wc: WorkCompletion, prog: str) -> bool:
    """Whether ``wc`` is a server's counts write that failed, with a warning on stderr.

    The counts are the last message of a run and the client goes once it has read them:
    if its acknowledgement is lost (a link flapping, say), the write is resent to a QP
    that is gone and fails.  The client judges the run by whether it got the counts, so
    for the server this is a warning, not an error."""
    if wc.ok or not wc.wr_id & END_WR or wc.opcode is not WcOpcode.RDMA_WRITE:
        return False
    print(
        f"{prog}: warning: QP {qpn_text(wc.qpn)}: the client did not acknowledge the counts "
        f"({wc.status.name}); it reports whether it got them",
        file=sys.stderr,
    )
    return True


def completions(
    wcs: Iterable[WorkCompletion],
    owners: Mapping[int, Owner],
    server: str | None = None,
    finished: Container[int] = (),
) -> Iterator[tuple[Owner, Done, WorkCompletion]]:
    """The completions of the QPs in ``owners`` (by QPN), with their owner and what they
    say; a failed one ends the run, those of other QPs are passed over.  For a server
    (``server``: its name), a QP in ``finished`` has sent its counts: its failed counts
    write is ENDED with a warning (:func:`counts_unconfirmed`) and its other failures
    (what was flushed with it) are passed over."""
    for wc in wcs:
        owner = owners.get(wc.qpn)
        if owner is None:
            continue
        if server is not None and not wc.ok and wc.qpn in finished:
            if counts_unconfirmed(wc, server):
                yield owner, Done.ENDED, wc
            continue
        check_wc(wc)
        yield owner, done_of(wc), wc


class Receives:
    """The receive buffers kept posted on one QP: every immediate that arrives takes one."""

    __slots__ = ("left", "qp")

    def __init__(self, qp: QueuePair) -> None:
        self.qp = qp
        qp.post_recv(range(RECVS))
        self.left = RECVS

    def take(self) -> None:
        self.left -= 1

    def top_up(self) -> None:
        """Post a batch of :data:`REPOST` once that many were taken."""
        if self.left <= RECVS - REPOST:
            self.qp.post_recv(range(REPOST))
            self.left += REPOST


# Events, interruption -----------------------------------------------------------------------
@dataclass
class Events:
    """Asynchronous events of a context: port changes are recorded, QP failures fatal,
    except those of the QPs in ``finished`` (a server's, once its counts are sent: see
    :func:`counts_unconfirmed`), which are recorded."""

    ctx: Context
    start: float
    seen: list[dict[str, Any]] = field(default_factory=list)
    finished: set[int] = field(default_factory=set)

    def check(self) -> None:
        while (ev := self.ctx.get_async_event(timeout=0)) is not None:
            self.seen.append(
                {
                    "t": round(time.monotonic() - self.start, 6),
                    "wall": time.time(),
                    "type": ev.type.value,
                    "port": ev.port,
                    "qpn": ev.qpn,
                    "reason": ev.reason,
                }
            )
            if ev.type is AsyncEventType.QP_FATAL and ev.qpn in self.finished:
                continue
            if ev.type in (AsyncEventType.QP_FATAL, AsyncEventType.DEVICE_FATAL):
                what = f"QP {qpn_text(ev.qpn)}" if ev.qpn is not None else "mrcd"
                raise ToolError(f"{what} failed: {ev.type.value}: {ev.reason}")


class StopFlag:
    """Ctrl-C ends the run gracefully (the results are still reported); twice, at once."""

    def __init__(self) -> None:
        self.set = False
        self._old: Any = None

    def __enter__(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.set = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *exc: object) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
