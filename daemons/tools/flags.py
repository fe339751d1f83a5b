"""The flags of mrc-write-bw and mrc-write-lat (perftest's where they make sense), and the
``main`` wrapper: every failure is one line on stderr; bad flags exit 2, a failed run 1."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from mrcstack import add_version_flag
from mrcstack.api import ApiError, QpAttr, default_socket_path
from mrcstack.daemons.tools.common import (
    DEFAULT_SERVICE,
    KIND_BW,
    KIND_LAT,
    MAX_ALL_SIZE,
    MAX_DEPTH,
    MAX_QPS,
    MAX_SIZE,
    MIB,
    ToolError,
    UsageError,
    all_sizes,
)
from mrcstack.fabric import format_size, parse_size

#: -a without -n or -D: writes per QP (bw) / round trips (lat) per size.  perftest keeps its
#: usual count (5000 / 1000); here 8 MiB writes go at ~250 MB/s and take ~30 ms one way, so
#: that would take minutes.  These keep the default sweep (2 B .. 8 MiB) at ~13 s (bw; 15 s
#: with --verify) and ~16 s (lat) on the 2-core VM of docs/tools.md, well within 30 s.
ALL_ITERS_BW = 200
ALL_ITERS_LAT = 100
DEFAULT_TIMEOUT = 30.0  # seconds: --timeout when not given


# Flags --------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _size(text: str) -> int:
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not 1 <= value <= MAX_SIZE:
        raise argparse.ArgumentTypeError(f"{text}: must be in 1..{MAX_SIZE} bytes")
    return value


def _max_size(text: str) -> int:
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not 2 <= value <= MAX_SIZE or value & (value - 1):
        raise argparse.ArgumentTypeError(f"{text}: must be a power of two, 2..{MAX_SIZE} bytes")
    return value


def default_depth(size: int) -> int:
    """bw's default --tx-depth: 128, fewer for big writes (at most 16 MiB outstanding)."""
    return max(1, min(128, (16 * MIB) // size))


def _positive_int(top: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not 1 <= value <= top:
            raise argparse.ArgumentTypeError(f"{text}: must be in 1..{top}")
        return value

    return parse


def _nonneg_int(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must not be negative")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text}: must be a positive number of seconds")
    return value


def _host(text: str) -> int:
    raw = text[1:] if text[:1] in ("h", "H") else text
    if not raw.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected a host index like 3 or h3")
    return int(raw)


@dataclass(frozen=True, slots=True)
class Options:
    prog: str
    socket: Path | None
    server_host: int | None  # None: this is the server
    service: int
    size: int
    iters: int
    duration: float | None
    qps: int
    tx_depth: int
    report_gbits: bool
    run_infinitely: bool
    json: bool
    interval: float
    show_intervals: bool
    verify: bool
    ev_profile: int
    cc_profile: int
    mtu: int | None
    timeout: float
    kind: int = KIND_BW
    first_client_timeout: float | None = None  # --timeout as given (None: wait on)
    all: bool = False  # -a: every size 2 .. max_size, a run each
    max_size: int = MAX_ALL_SIZE
    depth_flag: int | None = None  # -t as given (None: default_depth of each size)
    bidir: bool = False  # bw -b: the server writes back as much (perftest's -b)

    @property
    def client(self) -> bool:
        return self.server_host is not None

    def sizes(self) -> list[int]:
        """The sizes of the run(s): -a's series, else -s."""
        return all_sizes(self.max_size) if self.all else [self.size]

    def for_size(self, size: int) -> Options:
        """The options of one run of -a (the default tx depth follows the size)."""
        depth = self.tx_depth
        if self.depth_flag is None and self.kind == KIND_BW:
            depth = default_depth(size)
        return dataclasses.replace(self, size=size, tx_depth=depth)

    def size_text(self) -> str:
        """The header's message size."""
        if not self.all:
            return f"{self.size} [B]"
        short = format_size(self.max_size)
        short = f" ({short})" if short != str(self.max_size) else ""
        return f"all: 2 .. {self.max_size} [B]{short}, a connection each"

    def socket_path(self) -> Path:
        try:
            return self.socket if self.socket is not None else default_socket_path()
        except ApiError as exc:
            raise ToolError(str(exc)) from None

    def qp_attr(self, imm_outstanding: int) -> QpAttr:
        extra: dict[str, Any] = {} if self.mtu is None else {"mtu_payload": self.mtu}
        return QpAttr(
            max_wimm=min(65535, max(1024, imm_outstanding + 4)),
            ev_profile_id=self.ev_profile,
            cc_profile_id=self.cc_profile,
            **extra,
        )


# The flags, as tables -----------------------------------------------------------------------
#: One flag: its names and ``add_argument``'s keywords.
Flag = tuple[tuple[str, ...], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ToolWords:
    """What the two tools' flags and help texts differ in."""

    what: str  # the description's quantity
    perftest: str  # the perftest tool it follows
    size: int  # default -s
    iters: int  # default -n
    all_iters: int  # default -n with -a
    unit: str  # what -n counts


TOOLS = {
    KIND_BW: ToolWords("bandwidth", "ib_write_bw", 65536, 5000, ALL_ITERS_BW, "writes per QP"),
    KIND_LAT: ToolWords("latency", "ib_write_lat", 2, 1000, ALL_ITERS_LAT, "round trips"),
}


#: Which mrcd, which role, which service.
WHERE_FLAGS: list[Flag] = [
    (
        ("--socket",),
        dict(
            type=Path,
            help="mrcd's API socket (default: $MRCD_SOCKET or the one /run/mrcstack/mrcd*.sock)",
        ),
    ),
    (
        ("--server-host",),
        dict(
            type=_host,
            metavar="HOST",
            help="run as the client of the server on this fabric host (3 or h3)",
        ),
    ),
    (
        ("--service",),
        dict(
            type=_nonneg_int,
            default=DEFAULT_SERVICE,
            help=f"the service both sides agree on, like a port (default {DEFAULT_SERVICE})",
        ),
    ),
]


def _size_flags(t: ToolWords) -> list[Flag]:
    """-s or -a (one excludes the other)."""
    return [
        (
            ("-s", "--size"),
            dict(type=_size, help=f"bytes per write (default {t.size}; 1MiB, 64KiB accepted)"),
        ),
        (
            ("-a", "--all"),
            dict(
                action="store_true",
                help="run every size 2, 4, 8, ... up to --max-size (perftest's -a), a table row "
                f"or JSON document each, each for -n {t.unit} (default with -a: {t.all_iters}) "
                "or -D seconds; the server takes the sizes from the client (-a given there is "
                "ignored)",
            ),
        ),
    ]


def _length_flags(t: ToolWords) -> list[Flag]:
    """How far -a goes, how long a run lasts."""
    return [
        (
            ("--max-size",),
            dict(
                type=_max_size,
                metavar="BYTES",
                help="with -a: the largest size, a power of two "
                f"(default {format_size(MAX_ALL_SIZE)})",
            ),
        ),
        (
            ("-n", "--iters"),
            dict(
                type=_positive_int(1 << 40),
                help=f"{t.unit} (default {t.iters}; with -a, {t.all_iters} per size)",
            ),
        ),
        (
            ("-D", "--duration"),
            dict(type=_seconds, help="run this many seconds instead of a number of iterations"),
        ),
    ]


#: bw only: QPs, their depth, the unit of its table.
BW_FLAGS: list[Flag] = [
    (
        ("-q", "--qp"),
        dict(
            type=_positive_int(MAX_QPS),
            default=1,
            dest="qps",
            help="number of QPs (default 1)",
        ),
    ),
    (
        ("-t", "--tx-depth"),
        dict(
            type=_positive_int(MAX_DEPTH),
            dest="tx_depth",
            help="writes outstanding per QP (default 128, fewer for big writes: "
            "at most 16 MiB outstanding)",
        ),
    ),
    (("--report_gbits",), dict(action="store_true", help="report Gbit/s, not MB/s")),
    (
        ("-b", "--bidirectional"),
        dict(
            action="store_true",
            dest="bidir",
            help="both directions at once (perftest's -b): the server writes back to the "
            "client as the client writes to it, and both report the two directions summed "
            "(and each apart in --json); the server takes it from the client",
        ),
    ),
]

#: What is reported, and how.
OUTPUT_FLAGS: list[Flag] = [
    (
        ("--run_infinitely",),
        dict(
            action="store_true",
            help="run until Ctrl-C, reporting every -D seconds (default 5)",
        ),
    ),
    (("--json",), dict(action="store_true", help="results as JSON (one line per report)")),
    (
        ("--interval",),
        dict(
            type=_seconds,
            help="length of the per-interval series in seconds (default 0.1, in the "
            "JSON); given, the series is also printed",
        ),
    ),
    (
        ("--verify",),
        dict(
            action="store_true",
            help="verify the data on arrival (bw: CRC-32 of every write that landed "
            "in the server's memory; lat: CRC-32 of every echo)",
        ),
    ),
]

#: This side's QPs, and patience.
QP_FLAGS: list[Flag] = [
    (
        ("--ev-profile",),
        dict(
            type=_nonneg_int,
            default=0,
            metavar="ID",
            help="EV profile id for this side's QPs (mrcctl ev-profile; default 0)",
        ),
    ),
    (
        ("--cc-profile",),
        dict(
            type=_nonneg_int,
            default=0,
            metavar="ID",
            help="CC profile id for this side's QPs (mrcctl cc-profile; default 0)",
        ),
    ),
    (
        ("-m", "--mtu"),
        dict(
            type=_positive_int(1 << 16),
            metavar="BYTES",
            help="payload bytes per packet (QP attribute mtu_payload; default mrcd's)",
        ),
    ),
    (
        ("--timeout",),
        dict(
            type=_seconds,
            default=None,
            help="seconds to wait for the server, a peer or progress (default 30); given, it "
            "also bounds a server's wait for its first client (default: wait on)",
        ),
    ),
]


def _add(add_argument: Callable[..., argparse.Action], flags: list[Flag]) -> None:
    for names, keywords in flags:
        add_argument(*names, **keywords)


def parser(prog: str, kind: int) -> argparse.ArgumentParser:
    """Either tool's flags, in the order ``--help`` shows them."""
    t = TOOLS[kind]
    p = _Parser(
        prog=prog,
        description=f"RDMA WRITE {t.what} over mrcd, like perftest's {t.perftest}. Without "
        "--server-host: the server (registers memory, waits for one client, takes the "
        "client's parameters). With --server-host: the client.",
    )
    add_version_flag(p)
    _add(p.add_argument, WHERE_FLAGS)
    _add(p.add_mutually_exclusive_group().add_argument, _size_flags(t))
    _add(p.add_argument, _length_flags(t))
    if kind == KIND_BW:
        _add(p.add_argument, BW_FLAGS)
    _add(p.add_argument, OUTPUT_FLAGS)
    _add(p.add_argument, QP_FLAGS)
    return p


# Checks and defaults ------------------------------------------------------------------------
def _check(ns: argparse.Namespace) -> None:
    """What no single flag can say: the combinations refused."""
    if ns.all and ns.run_infinitely:
        raise UsageError("argument -a/--all: not allowed with argument --run_infinitely")
    if ns.max_size is not None and not ns.all:
        raise UsageError("argument --max-size: only with -a/--all")
    if getattr(ns, "bidir", False) and ns.verify:
        raise UsageError("argument -b/--bidirectional: not allowed with argument --verify")


def _options(prog: str, kind: int, ns: argparse.Namespace) -> Options:
    """The options of the flags given, defaults filled in."""
    t = TOOLS[kind]
    size = ns.size if ns.size is not None else t.size
    iters = ns.iters
    if iters is None:
        iters = t.all_iters if ns.all else t.iters
    duration = ns.duration
    if ns.run_infinitely and duration is None:
        duration = 5.0
    depth_flag = getattr(ns, "tx_depth", None)
    depth = depth_flag
    if depth is None:
        depth = default_depth(size) if kind == KIND_BW else 1
    return Options(
        prog=prog,
        socket=ns.socket,
        server_host=ns.server_host,
        service=ns.service,
        size=size,
        iters=iters,
        duration=duration,
        qps=getattr(ns, "qps", 1),
        tx_depth=depth,
        report_gbits=bool(getattr(ns, "report_gbits", False)),
        run_infinitely=ns.run_infinitely,
        json=ns.json,
        interval=ns.interval if ns.interval is not None else 0.1,
        show_intervals=ns.interval is not None,
        verify=ns.verify,
        ev_profile=ns.ev_profile,
        cc_profile=ns.cc_profile,
        mtu=ns.mtu,
        timeout=ns.timeout if ns.timeout is not None else DEFAULT_TIMEOUT,
        kind=kind,
        first_client_timeout=ns.timeout,
        all=ns.all,
        max_size=ns.max_size if ns.max_size is not None else MAX_ALL_SIZE,
        depth_flag=depth_flag,
        bidir=bool(getattr(ns, "bidir", False)),
    )


def parse_args(prog: str, kind: int, argv: Sequence[str]) -> Options:
    """Flags of either tool; UsageError (one line) for anything wrong."""
    ns = parser(prog, kind).parse_args(list(argv))
    _check(ns)
    return _options(prog, kind, ns)


def run_main(
    prog: str, kind: int, argv: Sequence[str] | None, body: Callable[[Options], int]
) -> int:
    """Parse flags and run ``body``; every failure is one line on stderr."""
    args = sys.argv[1:] if argv is None else argv
    try:
        opts = parse_args(prog, kind, args)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    try:
        return body(opts)
    except (ToolError, ApiError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
