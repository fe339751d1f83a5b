"""The run loop both tools share: the client's runs (one per size of ``-a``) and the server's,
with their headers, table rows, JSON documents, closing lines and exit statuses.

A tool brings what differs as a :class:`ClientTool` and a :class:`ServerTool`: how one run
goes (write_bw.py / bw_server.py, write_lat.py / lat_server.py), its header lines, its row
of the table, what its verification found.  Everything else happens here, in the same order
for both: the client connects and runs each size on a fresh context, reports it, and stops
at the first run that fails or is interrupted; the server keeps its listener and serves
runs until one without FLAG_MORE (or one whose END says stop) is over.
"""

from __future__ import annotations

import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from mrcstack.api import CompletionQueue, ConnectRequest, Context, Device, Listener, MemoryRegion
from mrcstack.daemons.tools.common import (
    REPLY_AREA,
    Events,
    Hello,
    Pattern,
    StopFlag,
    ToolError,
    align,
    naming_size,
    wait_hello,
)
from mrcstack.daemons.tools.flags import Options, run_main
from mrcstack.daemons.tools.report import LINE, Series, emit, header, peak_note, say

Doc = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Site:
    """The local mrcd a tool talks to."""

    dev: Device
    host: int
    planes: int

    @property
    def device(self) -> str:
        """The header's ``Device`` line."""
        return f"mrcd h{self.host} ({self.dev.path})"


# Client -------------------------------------------------------------------------------------
class ClientTool(Protocol):
    """What a tool's client brings to :func:`client_main`."""

    prog: str
    title: str  # of the header

    @property
    def client(self) -> Callable[[Options, Context, int, bool], ClientBase]:
        """A run with options ``o`` (of one size) on a context, for a host, and whether
        another run follows: ``client(o, ctx, host, more)``."""
        ...

    def columns(self, o: Options) -> str: ...

    def row(self, o: Options, doc: Doc) -> str | None:
        """A run's line of the table (None: none to show)."""
        ...

    def failure(self, doc: Doc) -> str | None:
        """What verification found wrong in a run (the error line's end), or None."""
        ...

    def summary(self, o: Options, docs: Sequence[Doc]) -> tuple[Doc, Doc]:
        """-a's closing document: the tool's fields after the common head, and its body."""
        ...

    def verified(self, docs: Sequence[Doc], sizes: str) -> str:
        """--verify's closing line of the table."""
        ...


def client_main(o: Options, tool: ClientTool) -> int:
    server = o.server_host
    if server is None:
        raise ToolError("client without --server-host")
    began = time.monotonic()
    with Device.open(o.socket_path()) as dev:
        attr = dev.query_device()
        site = Site(dev, attr.host, attr.planes)

        def run_one(ro: Options, i: int, more: bool) -> Doc:
            with dev.create_context() as ctx:
                run = tool.client(ro, ctx, attr.host, more)
                run.connect(server)
                if i == 0 and not o.json:
                    say(header(tool.title, run.header_rows(site)))
                    if o.run_infinitely or o.all:
                        say(tool.columns(o))
                return run.run()

        docs, status = run_sizes(o, run_one, lambda ro, doc: _report(tool, ro, doc))
    _end(tool, o, docs, time.monotonic() - began)
    return status


def run_sizes(
    o: Options,
    run_one: Callable[[Options, int, bool], Doc],
    report: Callable[[Options, Doc], int],
) -> tuple[list[Doc], int]:
    """The client's run(s), one per size: ``run_one(options, index, more)`` gives a run's
    document, ``report(options, doc)`` shows it and returns its exit status.  Stops at the
    first run that fails or is interrupted; returns the documents and the status."""
    sizes = o.sizes()
    docs: list[Doc] = []
    status = 0
    for i, size in enumerate(sizes):
        ro = o.for_size(size)
        with naming_size(size, o.all):
            doc = run_one(ro, i, i + 1 < len(sizes))
        if o.all:
            doc["run"] = i
        docs.append(doc)
        status = report(ro, doc)
        if status or doc["interrupted"]:
            break
    return docs, status


def _report(tool: ClientTool, o: Options, doc: Doc) -> int:
    """One run's JSON document or table row; 1 if verification found something wrong."""
    if o.json:
        emit(doc)
    elif not o.run_infinitely and (row := tool.row(o, doc)) is not None:
        if not o.all:
            say(tool.columns(o))
        say(row)
    failure = tool.failure(doc)
    if failure:
        where = f"size {o.size}: " if o.all else ""
        print(f"{tool.prog}: error: {where}verify: {failure}", file=sys.stderr)
        return 1
    return 0


def _end(tool: ClientTool, o: Options, docs: list[Doc], elapsed: float) -> None:
    """After the last run: the table's end (text), -a's summary document (JSON)."""
    if not docs:
        return
    if o.json:
        if o.all:
            emit(all_summary(o, tool.prog, docs, elapsed, *tool.summary(o, docs)))
        return
    say(LINE)
    if (note := peak_note(docs)) is not None:
        say(note)
    if o.verify:
        sizes = f" over {len(docs)} sizes" if o.all else ""
        say(tool.verified(docs, sizes))


def all_summary(
    o: Options, prog: str, docs: Sequence[Doc], elapsed: float, head: Doc, body: Doc
) -> Doc:
    """-a's closing JSON document (docs/tools.md): the common head, the tool's ``head``
    fields, the sizes, the tool's ``body`` (its rows, totals), the series' time."""
    return {
        "tool": prog,
        "role": "client",
        "report": "all",
        "host": docs[0]["host"],
        "server_host": o.server_host,
        "service": o.service,
        **head,
        "verify": o.verify,
        "sizes": [d["size"] for d in docs],
        **body,
        "duration_s": round(elapsed, 6),
        "interrupted": docs[-1]["interrupted"],
    }


# What a client run keeps -----------------------------------------------------------------
@dataclass(eq=False)
class ClientBase(ABC):
    """One run of a client (a tool's run says how it connects and goes).  Every run has its
    options and context, one registered region (:meth:`_register`: the writes' sources,
    then a REPLY_AREA per QP), the pattern it writes, a CQ, the context's events, Ctrl-C."""

    prog: ClassVar[str]
    opts: Options
    ctx: Context
    host: int
    more: bool = False  # -a: another run follows this one

    def _register(self, src_len: int, qps: int, cq_size: int) -> None:
        """The run's region (``src_len`` bytes of sources, then from ``reply_base`` a
        REPLY_AREA for each of ``qps`` QPs), its pattern, its CQ, its events, Ctrl-C."""
        self.reply_base = align(src_len)
        self.mr: MemoryRegion = self.ctx.reg_mr(self.reply_base + qps * REPLY_AREA)
        self.buf = self.mr.buf
        self.pattern = Pattern(self.opts.size)
        self.cq: CompletionQueue = self.ctx.create_cq(cq_size)
        self.events = Events(self.ctx, time.monotonic())
        self.stop = StopFlag()

    @abstractmethod
    def connect(self, server: int) -> None:
        """Create the run's QPs and connect them to the server on host ``server``."""

    @abstractmethod
    def header_rows(self, site: Site) -> list[tuple[str, object]]:
        """The header's lines, when this is the first run."""

    @abstractmethod
    def _run(self) -> Doc:
        """The run itself: its JSON document."""

    def run(self) -> Doc:
        """The run, until it is done, -D is over or Ctrl-C."""
        with self.stop:
            return self._run()

    def reply_off(self, qp: int) -> int:
        """Where the REPLY_AREA of the client's QP ``qp`` is in its region."""
        return self.reply_base + qp * REPLY_AREA

    def _begin(self) -> tuple[Schedule, Series]:
        """The run starts now: its clock, and its series of intervals."""
        clock = Schedule.begin(self.opts)
        self.events.start = clock.start
        return clock, Series(self.opts.interval, clock.start)

    def _closer(
        self, entry: Callable[[Series, float], Doc], line: Callable[[Doc, float], str]
    ) -> Callable[[Series, float], Doc]:
        return interval_closer(self.opts, entry, line)

    def _report_period(self, figures: Doc, row: str) -> None:
        """--run_infinitely: one period's figures, as a JSON document or a table row."""
        o = self.opts
        if o.json:
            emit(
                {"tool": self.prog, "role": "client", "report": "period", "size": o.size, **figures}
            )
        else:
            say(row)

    def _document(
        self, figures: Doc, clock: Schedule, series: Series, qpns: list[int], server: Doc
    ) -> Doc:
        """The run's JSON document: the common fields around the tool's ``figures``."""
        o = self.opts
        return {
            "tool": self.prog,
            "role": "client",
            "host": self.host,
            "server_host": o.server_host,
            "service": o.service,
            "size": o.size,
            **figures,
            "start_time": clock.wall,
            "interval_s": o.interval,
            "series": series.entries,
            "qpns": qpns,
            "qp_attr": {"ev_profile_id": o.ev_profile, "cc_profile_id": o.cc_profile},
            "server": server,
            "events": self.events.seen,
            "interrupted": self.stop.set,
        }


@dataclass(slots=True)
class Schedule:
    """A client run's clock: when it began, when ``-D`` ends it, and when
    ``--run_infinitely`` reports its next period (every ``-D`` seconds, 5 by default)."""

    start: float
    wall: float
    stop_at: float | None
    period_at: float | None

    @classmethod
    def begin(cls, o: Options) -> Schedule:
        start = time.monotonic()
        wall = time.time()
        stop_at = start + o.duration if o.duration is not None and not o.run_infinitely else None
        period_at = start + o.duration if o.run_infinitely and o.duration else None
        return cls(start, wall, stop_at, period_at)

    def next_period(self, o: Options, now: float) -> None:
        self.period_at = now + (o.duration or 5.0)


def interval_closer(
    o: Options,
    entry: Callable[[Series, float], Doc],
    line: Callable[[Doc, float], str],
) -> Callable[[Series, float], Doc]:
    """What closes an interval of the series: its ``entry``, printed as ``line`` when
    --interval was given (and not --json)."""

    def close(s: Series, t: float) -> Doc:
        e = entry(s, t)
        if o.show_intervals and not o.json:
            say(line(e, t))
        return e

    return close


# Server -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class NewRun:
    """A server run about to begin: the client's first request, and where it came in."""

    o: Options
    ctx: Context
    site: Site
    listener: Listener
    req: ConnectRequest
    hello: Hello
    sweep: bool  # -a: the client's sizes, a run each


class ServerRun(Protocol):
    """One run of the server: the client's QPs of one size, and what arrived on them."""

    def serve(self, first: bool) -> tuple[Doc, bool]:
        """Until the run is over: its document, and whether another run follows
        (``first``: the first run, whose header is printed)."""
        ...


class ServerTool(Protocol):
    """What a tool's server brings to :func:`server_main`."""

    prog: str
    kind: int  # the hellos it takes

    def start(self, new: NewRun) -> ServerRun:
        """The run ``new`` asks for (it accepts the client's other QPs, if any)."""
        ...

    def show(self, o: Options, doc: Doc, docs: Sequence[Doc], sweep: bool) -> None:
        """A run's text: its line(s) of the table (``docs``: every run so far)."""
        ...

    def verified(self, docs: Sequence[Doc], sizes: str) -> str | None:
        """The closing line of what verification checked, or None."""
        ...

    def failure(self, doc: Doc) -> str:
        """The error line's end for a run that found mismatches."""
        ...


def server_main(o: Options, tool: ServerTool) -> int:
    with Device.open(o.socket_path()) as dev:
        attr = dev.query_device()
        with dev.create_context() as ctx:
            listener = ctx.listen(o.service)
            if not o.json:
                say(f" waiting for a client on service {o.service} (mrcd h{attr.host})")
            return _serve(o, tool, Site(dev, attr.host, attr.planes), ctx, listener)


def _serve(o: Options, tool: ServerTool, site: Site, ctx: Context, listener: Listener) -> int:
    """Runs until one without FLAG_MORE is over; a table row or JSON document each."""
    docs: list[Doc] = []
    sweep = False
    client_host: int | None = None
    while True:
        if client_host is None:
            req, hello = wait_hello(
                listener, tool.kind, o.first_client_timeout, waiting_for="a client"
            )
            sweep = hello.more
            client_host = req.remote_host
        else:
            req, hello = wait_hello(
                listener,
                tool.kind,
                o.timeout,
                host=client_host,
                waiting_for=f"the client's next run (after size {docs[-1]['size']})",
            )
        run = tool.start(NewRun(o, ctx, site, listener, req, hello, sweep))
        with naming_size(hello.size, sweep):
            doc, more = run.serve(first=not docs)
        if sweep:
            doc["run"] = len(docs)
        docs.append(doc)
        if o.json:
            emit(doc)
        else:
            tool.show(o, doc, docs, sweep)
        if doc["mismatches"] or not more:
            break
    if not o.json:
        say(LINE)
        if (note := peak_note(docs)) is not None:
            say(note)
        verified = tool.verified(docs, f" over {len(docs)} sizes" if sweep else "")
        if verified is not None:
            say(verified)
    if doc["mismatches"]:
        where = f"size {doc['size']}: " if sweep else ""
        print(f"{tool.prog}: error: {where}verify: {tool.failure(doc)}", file=sys.stderr)
        return 1
    return 0


def tool_main(argv: Sequence[str] | None, client: ClientTool, server: ServerTool) -> int:
    """A tool's command: its flags, then its client (with --server-host) or its server."""
    return run_main(
        client.prog,
        server.kind,
        argv,
        lambda o: client_main(o, client) if o.client else server_main(o, server),
    )
