"""``mrc-write-bw``: RDMA WRITE bandwidth over mrcd, like perftest's ``ib_write_bw``.

Server (registers memory, waits for one client, takes its parameters)::

    mrc-write-bw --socket /run/mrcstack/mrcd-h3.sock

Client::

    mrc-write-bw --socket /run/mrcstack/mrcd-h0.sock --server-host 3 -s 1MiB -D 10

The client keeps ``--tx-depth`` writes outstanding per QP and reposts as they complete.
Without ``--verify`` every write of a QP goes to the same place (as in perftest) and every
``tx-depth``-th one carries an immediate with the write count, so the server sees progress.
With ``--verify`` every write carries a fresh pattern into its own slot of the server's
region (2 x tx-depth slots per QP) and the CRC-32 of it as its immediate; the server checks
what landed in its memory against it, and hands slots back with credit writes
(write-with-immediate of the verified count) so none is overwritten before it was checked.
At the end the client sends an END write to each QP's control cell and the server answers
with its own counts (writes, bytes, verified, mismatches) in the client's result cell.

With ``-b`` (bidirectional) the hello asks the server to write back as much: into one slot
of the client's region (``data_addr``), ``tx-depth`` deep, every write carrying its count as
the immediate, until the client's END; both sides report the two directions summed.

With ``-a`` every size 2, 4, ... ``--max-size`` is such a run on a fresh context and
connection; the hellos of all but the last say that another run follows (common.py).  The
run loop, headers and reports around a run are runloop.py's.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mrcstack.api import (
    Context,
    QueuePair,
    WorkCompletion,
    WriteWr,
)
from mrcstack.daemons.tools.bw_server import BwServerTool
from mrcstack.daemons.tools.common import (
    BW_PROG,
    END,
    END_CELL,
    END_WR,
    KIND_BW,
    MASK31,
    POLL_N,
    RESULT_CELL,
    Done,
    Hello,
    Receives,
    Result,
    ToolError,
    Welcome,
    align,
    completions,
    connect,
    delta31,
    qp_cap,
    send_end,
)
from mrcstack.daemons.tools.flags import Options
from mrcstack.daemons.tools.report import (
    Series,
    bw_all_row,
    bw_columns,
    bw_figures,
    bw_figures_row,
    bw_interval_line,
    bw_series_entry,
    per_qp_figures,
    per_qp_lines,
    qpns_text,
)
from mrcstack.daemons.tools.runloop import (
    ClientBase,
    Doc,
    Site,
    tool_main,
)

PROG = BW_PROG
BIDIR_TEXT = "ON: the server writes back as much; BW and MsgRate sum both directions"


@dataclass
class _Link:
    """One client QP."""

    index: int
    qp: QueuePair
    welcome: Welcome
    reply_off: int  # its REPLY_AREA in the client's region
    recvs: Receives
    posted: int = 0
    completed: int = 0
    credited: int = 0  # --verify: writes the server has checked
    received: int = 0  # -b: the server's writes that arrived
    end_done: bool = False
    result: Result | None = None


class BwClient(ClientBase):
    """One run of the client: its QPs write ``opts.size`` bytes each, ``tx_depth`` deep."""

    prog = PROG

    def __init__(self, opts: Options, ctx: Context, host: int, more: bool = False) -> None:
        slots = 2 * opts.tx_depth if opts.verify else 1
        src_len = opts.qps * slots * opts.size if opts.verify else opts.size
        self.rx_off = align(src_len)  # -b: the slot the server writes into
        super().__init__(opts, ctx, host, more)
        self._register(self.rx_off + (opts.size if opts.bidir else 0), opts.qps, cq_size=65536)
        self.slots = slots
        if not opts.verify:
            self.pattern.fill(self.buf[: opts.size], 0, 0)
        self.links: list[_Link] = []
        self.by_qpn: dict[int, _Link] = {}
        self.imm_every = 1 if opts.verify else max(1, opts.tx_depth // 4)
        self.rx_writes = 0  # -b: the server's writes that arrived, all QPs

    def connect(self, server: int) -> None:
        o = self.opts
        attr = o.qp_attr(o.tx_depth if o.verify else 2)
        cap = qp_cap(o.tx_depth + 8)
        for q in range(o.qps):
            qp = self.ctx.create_qp(self.cq, attr=attr, cap=cap)
            recvs = Receives(qp)
            reply_off = self.reply_off(q)
            hello = Hello(
                KIND_BW,
                o.verify,
                o.qps,
                q,
                o.size,
                self.slots,
                self.imm_every,
                o.tx_depth,
                self.mr.addr + reply_off,
                self.mr.rkey,
                data_addr=self.mr.addr + self.rx_off if o.bidir else 0,
                more=self.more,
                bidir=o.bidir,
            )
            welcome = connect(qp, server, o.service, hello, o.timeout)
            link = _Link(q, qp, welcome, reply_off, recvs)
            self.links.append(link)
            self.by_qpn[qp.qpn] = link

    # The run --------------------------------------------------------------------------
    def _post(self, link: _Link, final: int | None) -> None:
        o = self.opts
        limit = link.completed + o.tx_depth
        if o.verify:
            limit = min(limit, link.credited + self.slots)
        if final is not None:
            limit = min(limit, final)
        wrs = []
        size, w = o.size, link.welcome
        while link.posted < limit:
            i = link.posted
            if o.verify:
                slot = i % self.slots
                off = (link.index * self.slots + slot) * size
                crc = self.pattern.fill(self.buf[off : off + size], link.index, i) & MASK31
                wrs.append(
                    WriteWr(i, (self.mr, off, size), w.slots_addr + slot * size, w.rkey, crc)
                )
            else:
                imm = (i + 1) & MASK31 if (i + 1) % self.imm_every == 0 else None
                wrs.append(WriteWr(i, (self.mr, 0, size), w.slots_addr, w.rkey, imm))
            link.posted += 1
        if wrs:
            link.qp.post_send(wrs)

    def _completions(self, wcs: list[WorkCompletion], series: Series) -> int:
        """Our writes that completed (and, with -b, the server's that arrived: both
        directions count in the series and as progress)."""
        done = received = 0
        for link, what, wc in completions(wcs, self.by_qpn):
            if what is Done.WROTE:
                link.completed += 1
                done += 1
            elif what is Done.ENDED:
                link.end_done = True
            else:  # the server's credits, or its counts
                link.recvs.take()
                imm = wc.imm or 0
                if imm & END:
                    link.result = Result.unpack_from(self.buf, link.reply_off + RESULT_CELL)
                elif self.opts.bidir:  # each of the server's writes carries its count
                    n = delta31(imm, link.received & MASK31)
                    link.received += n
                    received += n
                else:
                    link.credited += delta31(imm, link.credited & MASK31)
        series.count += done + received
        series.bytes += (done + received) * self.opts.size
        self.rx_writes += received
        for link in self.links:
            link.recvs.top_up()
        return done

    def _run(self) -> Doc:
        o = self.opts
        clock, series = self._begin()
        start = clock.start
        period = {"start": start, "writes": 0, "entry": 0, "rx": 0}
        total = 0
        last = start
        final = None if o.duration is not None else o.iters  # writes per QP
        stopping = False
        on_close = self._closer(
            bw_series_entry, lambda e, _t: bw_interval_line(e, o.interval, o.report_gbits)
        )
        while True:
            now = time.monotonic()
            if self.stop.set or (clock.stop_at is not None and now >= clock.stop_at):
                stopping = True
            if not stopping:
                for link in self.links:
                    self._post(link, final)
            if final is not None and all(link.completed >= final for link in self.links):
                break
            if stopping and all(link.completed == link.posted for link in self.links):
                break
            deadline = min(
                series.next_tick,
                clock.stop_at or series.next_tick,
                clock.period_at or series.next_tick,
            )
            wcs = self.cq.poll_wait(POLL_N, timeout=max(0.0, min(deadline - now, 0.1)))
            now = time.monotonic()
            received = self.rx_writes
            done = self._completions(wcs, series)
            if done or self.rx_writes != received:
                total += done
                period["writes"] += done
                last = now
            elif now - last > o.timeout:
                raise ToolError(f"no write completed for {o.timeout:g} s")
            if now >= series.next_tick:
                series.tick(now, on_close)
                self.events.check()
            if clock.period_at is not None and now >= clock.period_at:
                self._period(period, now, series)
                period = {"start": now, "writes": 0, "entry": len(series.entries)}
                period["rx"] = self.rx_writes
                clock.next_period(o, now)
        end = last
        series.tick(time.monotonic(), on_close)
        self.events.check()
        results = self._finish()
        nbytes = total * o.size
        both = total + self.rx_writes  # -b: both directions, as perftest sums them
        figures: Doc = {
            "qps": o.qps,
            "tx_depth": o.tx_depth,
            "verify": o.verify,
            "iterations": total,
            "bytes": nbytes,
            **bw_figures(both * o.size, both, end - start, series.entries, o.interval),
        }
        if o.bidir:
            figures["bidirectional"] = {
                "sent": {"writes": total, "bytes": nbytes},
                "received": {"writes": self.rx_writes, "bytes": self.rx_writes * o.size},
            }
        figures["per_qp"] = [
            per_qp_figures(link.qp.qpn, link.completed, o.size, end - start) for link in self.links
        ]
        qpns = [link.qp.qpn for link in self.links]
        return self._document(figures, clock, series, qpns, _sum_results(results))

    def _period(self, period: dict[str, Any], now: float, series: Series) -> None:
        o = self.opts
        elapsed = now - period["start"]
        writes = period["writes"]
        both = writes + self.rx_writes - period["rx"]  # -b: both directions
        fig = bw_figures(
            both * o.size, both, elapsed, series.entries[period["entry"] :], o.interval
        )
        figures = {"iterations": writes, "bytes": writes * o.size, **fig}
        self._report_period(figures, bw_figures_row(o.size, writes, fig, o.report_gbits))

    def header_rows(self, site: Site) -> list[tuple[str, object]]:
        o = self.opts
        if o.all:
            depth: object = o.depth_flag or "128, fewer from 256 KiB (at most 16 MiB outstanding)"
        else:
            depth = o.tx_depth
        return [
            ("Device", site.device),
            ("Remote", f"h{o.server_host} service {o.service}"),
            ("Number of qps", o.qps),
            ("Transport type", f"MRC, {site.planes} planes"),
            ("TX depth", depth),
            ("Message size", o.size_text()),
            ("Verify", "ON (CRC-32 of every write, checked by the server)" if o.verify else "OFF"),
            ("Profiles", f"ev {o.ev_profile} cc {o.cc_profile}"),
            *([("Bidirectional", BIDIR_TEXT)] if o.bidir else []),
            ("QPNs", qpns_text([link.qp.qpn for link in self.links], o.all)),
        ]

    def _finish(self) -> list[Result]:
        """END to every QP's control cell; wait for the server's counts (they come only
        after the END landed, so the END's own completion is not waited for)."""
        o = self.opts
        for link in self.links:
            off = link.reply_off + END_CELL
            stop = self.more and self.stop.set
            send_end(link.qp, self.mr, off, link.welcome, link.posted, stop, END_WR | link.index)
        deadline = time.monotonic() + o.timeout
        scratch = Series(o.interval, time.monotonic())
        while not all(link.result is not None for link in self.links):
            left = deadline - time.monotonic()
            if left <= 0:
                raise ToolError(f"the server did not report its counts within {o.timeout:g} s")
            self._completions(self.cq.poll_wait(POLL_N, timeout=min(left, 0.5)), scratch)
        return [link.result for link in self.links if link.result is not None]


def _sum_results(results: Sequence[Result]) -> dict[str, int]:
    return {
        "writes": sum(r.writes for r in results),
        "bytes": sum(r.bytes for r in results),
        "verified": sum(r.verified for r in results),
        "mismatches": sum(r.mismatches for r in results),
    }


class BwClientTool:
    """The client of ``mrc-write-bw`` in the shared run loop (:mod:`.runloop`)."""

    prog = PROG
    title = "RDMA_Write BW Test (MRC over mrcd)"
    client = BwClient

    def columns(self, o: Options) -> str:
        return bw_columns(o.report_gbits)

    def row(self, o: Options, doc: Doc) -> str:
        """The run's row (all QPs together), then each QP's when there are several."""
        row = bw_figures_row(o.size, doc["iterations"], doc, o.report_gbits)
        if o.qps > 1 and not o.all:
            row = "\n".join([row, *per_qp_lines(doc["per_qp"], o.report_gbits)])
        return row

    def failure(self, doc: Doc) -> str | None:
        mismatches = doc["server"]["mismatches"]
        return f"{mismatches} writes did not land intact" if mismatches else None

    def summary(self, o: Options, docs: Sequence[Doc]) -> tuple[Doc, Doc]:
        rows = [bw_all_row(d) for d in docs]
        return {"qps": o.qps}, {"rows": rows, "server": _server_totals(docs)}

    def verified(self, docs: Sequence[Doc], sizes: str) -> str:
        srv = _server_totals(docs)
        return (
            f" verified by the server: {srv['verified']} writes{sizes}, "
            f"{srv['mismatches']} mismatches"
        )


def _server_totals(docs: Sequence[Doc]) -> dict[str, int]:
    return _sum_results([Result(**d["server"]) for d in docs])


def main(argv: Sequence[str] | None = None) -> int:
    return tool_main(argv, BwClientTool(), BwServerTool())


if __name__ == "__main__":
    sys.exit(main())
