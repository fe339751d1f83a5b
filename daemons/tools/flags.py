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
    MAX_ALL_SIZE,
    MAX_DEPTH,
    MAX_QPS,
    MAX_SIZE,
    MIB,
    ToolError,
    UsageError,
    all_sizes,
    naming_size,
)
from mrcstack.fabric import format_size, parse_size

#: -a without -n or -D: writes per QP (bw) / round trips (lat) per size.  perftest keeps its
#: usual count (5000 / 1000); here 8 MiB writes go at ~250 MB/s and take ~30 ms one way, so
#: that would take minutes.  These keep the default sweep (2 B .. 8 MiB) at ~13 s (bw; 15 s
#: with --verify) and ~16 s (lat) on the 2-core VM of docs/tools.md, well within 30 s.
ALL_ITERS_BW = 200
ALL_ITERS_LAT = 100


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
    all: bool = False  # -a: every size 2 .. max_size, a run each
    max_size: int = MAX_ALL_SIZE
    depth_flag: int | None = None  # -t as given (None: default_depth of each size)

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

    def run_sizes(
        self,
        run_one: Callable[[Options, int, bool], dict[str, Any]],
        report: Callable[[Options, dict[str, Any]], int],
    ) -> tuple[list[dict[str, Any]], int]:
        """The client's run(s), one per size: ``run_one(options, index, more)`` gives a run's
        document, ``report(options, doc)`` shows it and returns its exit status.  Stops at
        the first run that fails or is interrupted; returns the documents and the status."""
        sizes = self.sizes()
        docs: list[dict[str, Any]] = []
        status = 0
        for i, size in enumerate(sizes):
            ro = self.for_size(size)
            with naming_size(size, self.all):
                doc = run_one(ro, i, i + 1 < len(sizes))
            if self.all:
                doc["run"] = i
            docs.append(doc)
            status = report(ro, doc)
            if status or doc["interrupted"]:
                break
        return docs, status

    def all_summary(
        self,
        prog: str,
        docs: Sequence[dict[str, Any]],
        elapsed: float,
        head: dict[str, Any],
        body: dict[str, Any],
    ) -> dict[str, Any]:
        """-a's closing JSON document (docs/tools.md): the common head, the tool's ``head``
        fields, the sizes, the tool's ``body`` (its rows, totals), the series' time."""
        return {
            "tool": prog,
            "role": "client",
            "report": "all",
            "host": docs[0]["host"],
            "server_host": self.server_host,
            "service": self.service,
            **head,
            "verify": self.verify,
            "sizes": [d["size"] for d in docs],
            **body,
            "duration_s": round(elapsed, 6),
            "interrupted": docs[-1]["interrupted"],
        }

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


def parse_args(prog: str, kind: int, argv: Sequence[str]) -> Options:
    """Flags of either tool; UsageError (one line) for anything wrong."""
    bw = kind == KIND_BW
    what = "bandwidth" if bw else "latency"
    p = _Parser(
        prog=prog,
        description=f"RDMA WRITE {what} over mrcd, like perftest's "
        f"{'ib_write_bw' if bw else 'ib_write_lat'}. Without --server-host: the server "
        "(registers memory, waits for one client, takes the client's parameters). "
        "With --server-host: the client.",
    )
    add_version_flag(p)
    p.add_argument(
        "--socket",
        type=Path,
        help="mrcd's API socket (default: $MRCD_SOCKET or the one /run/mrcstack/mrcd*.sock)",
    )
    p.add_argument(
        "--server-host",
        type=_host,
        metavar="HOST",
        help="run as the client of the server on this fabric host (3 or h3)",
    )
    p.add_argument(
        "--service",
        type=_nonneg_int,
        default=DEFAULT_SERVICE,
        help=f"the service both sides agree on, like a port (default {DEFAULT_SERVICE})",
    )
    sizes = p.add_mutually_exclusive_group()
    sizes.add_argument(
        "-s",
        "--size",
        type=_size,
        help=f"bytes per write (default {65536 if bw else 2}; 1MiB, 64KiB accepted)",
    )
    all_iters = ALL_ITERS_BW if bw else ALL_ITERS_LAT
    sizes.add_argument(
        "-a",
        "--all",
        action="store_true",
        help="run every size 2, 4, 8, ... up to --max-size (perftest's -a), a table row or "
        f"JSON document each, each for -n {'writes per QP' if bw else 'round trips'} "
        f"(default with -a: {all_iters}) or -D seconds; the server takes the sizes from the "
        "client (-a given there is ignored)",
    )
    p.add_argument(
        "--max-size",
        type=_max_size,
        metavar="BYTES",
        help=f"with -a: the largest size, a power of two (default {format_size(MAX_ALL_SIZE)})",
    )
    p.add_argument(
        "-n",
        "--iters",
        type=_positive_int(1 << 40),
        help=f"{'writes per QP' if bw else 'round trips'} (default {5000 if bw else 1000}; "
        f"with -a, {all_iters} per size)",
    )
    p.add_argument(
        "-D",
        "--duration",
        type=_seconds,
        help="run this many seconds instead of a number of iterations",
    )
    if bw:
        p.add_argument(
            "-q",
            "--qp",
            type=_positive_int(MAX_QPS),
            default=1,
            dest="qps",
            help="number of QPs (default 1)",
        )
        p.add_argument(
            "-t",
            "--tx-depth",
            type=_positive_int(MAX_DEPTH),
            dest="tx_depth",
            help="writes outstanding per QP (default 128, fewer for big writes: "
            "at most 16 MiB outstanding)",
        )
        p.add_argument("--report_gbits", action="store_true", help="report Gbit/s, not MB/s")
    p.add_argument(
        "--run_infinitely",
        action="store_true",
        help="run until Ctrl-C, reporting every -D seconds (default 5)",
    )
    p.add_argument("--json", action="store_true", help="results as JSON (one line per report)")
    p.add_argument(
        "--interval",
        type=_seconds,
        help="length of the per-interval series in seconds (default 0.1, in the "
        "JSON); given, the series is also printed",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="verify the data on arrival (bw: CRC-32 of every write that landed "
        "in the server's memory; lat: CRC-32 of every echo)",
    )
    p.add_argument(
        "--ev-profile",
        type=_nonneg_int,
        default=0,
        metavar="ID",
        help="EV profile id for this side's QPs (mrcctl ev-profile; default 0)",
    )
    p.add_argument(
        "--cc-profile",
        type=_nonneg_int,
        default=0,
        metavar="ID",
        help="CC profile id for this side's QPs (mrcctl cc-profile; default 0)",
    )
    p.add_argument(
        "-m",
        "--mtu",
        type=_positive_int(1 << 16),
        metavar="BYTES",
        help="payload bytes per packet (QP attribute mtu_payload; default mrcd's)",
    )
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=30.0,
        help="seconds to wait for the server, a peer or progress (default 30)",
    )
    ns = p.parse_args(list(argv))
    if ns.all and ns.run_infinitely:
        p.error("argument -a/--all: not allowed with argument --run_infinitely")
    if ns.max_size is not None and not ns.all:
        p.error("argument --max-size: only with -a/--all")
    size = ns.size if ns.size is not None else (65536 if bw else 2)
    iters = ns.iters
    if iters is None:
        iters = all_iters if ns.all else (5000 if bw else 1000)
    duration = ns.duration
    if ns.run_infinitely and duration is None:
        duration = 5.0
    qps = getattr(ns, "qps", 1)
    depth_flag = getattr(ns, "tx_depth", None)
    depth = depth_flag
    if depth is None:
        depth = default_depth(size) if bw else 1
    return Options(
        prog=prog,
        socket=ns.socket,
        server_host=ns.server_host,
        service=ns.service,
        size=size,
        iters=iters,
        duration=duration,
        qps=qps,
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
        timeout=ns.timeout,
        kind=kind,
        all=ns.all,
        max_size=ns.max_size if ns.max_size is not None else MAX_ALL_SIZE,
        depth_flag=depth_flag,
    )


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
