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

With ``-a`` every size 2, 4, ... ``--max-size`` is such a run on a fresh context and
connection; the hellos of all but the last say that another run follows (common.py).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mrcstack.api import (
    CompletionQueue,
    Context,
    Device,
    MemoryRegion,
    QpCap,
    QueuePair,
    WcOpcode,
    WorkCompletion,
    WriteWr,
)
from mrcstack.daemons.tools.bw_server import server_main
from mrcstack.daemons.tools.common import (
    BW_PROG,
    END,
    END_CELL,
    END_LEN,
    END_WR,
    KIND_BW,
    MASK31,
    POLL_N,
    RECVS,
    REPLY_AREA,
    REPOST,
    RESULT_CELL,
    Events,
    Hello,
    Pattern,
    Result,
    StopFlag,
    ToolError,
    Welcome,
    align,
    connect,
    delta31,
    pack_end,
)
from mrcstack.daemons.tools.flags import (
    Options,
    run_main,
)
from mrcstack.daemons.tools.report import (
    LINE,
    MB,
    Series,
    bw_all_row,
    bw_columns,
    bw_figures,
    bw_interval_line,
    bw_row,
    bw_series_entry,
    emit,
    header,
    say,
)

PROG = BW_PROG


# Client -------------------------------------------------------------------------------------
@dataclass
class _Link:
    """One client QP."""

    index: int
    qp: QueuePair
    welcome: Welcome
    reply_off: int  # its REPLY_AREA in the client's region
    posted: int = 0
    completed: int = 0
    credited: int = 0  # --verify: writes the server has checked
    recvs_left: int = RECVS
    end_done: bool = False
    result: Result | None = None


class BwClient:
    def __init__(self, opts: Options, ctx: Context, host: int, more: bool = False) -> None:
        self.opts = opts
        self.more = more  # -a: another run follows this one
        self.ctx = ctx
        self.host = host
        self.slots = 2 * opts.tx_depth if opts.verify else 1
        self.src_len = opts.qps * self.slots * opts.size if opts.verify else opts.size
        self.reply_base = align(self.src_len)
        self.mr: MemoryRegion = ctx.reg_mr(self.reply_base + opts.qps * REPLY_AREA)
        self.buf = self.mr.buf
        self.pattern = Pattern(opts.size)
        if not opts.verify:
            self.pattern.fill(self.buf[: opts.size], 0, 0)
        self.cq: CompletionQueue = ctx.create_cq(65536)
        self.links: list[_Link] = []
        self.by_qpn: dict[int, _Link] = {}
        self.imm_every = 1 if opts.verify else max(1, opts.tx_depth // 4)
        self.events = Events(ctx, time.monotonic())
        self.stop = StopFlag()

    def connect(self, server: int) -> None:
        o = self.opts
        attr = o.qp_attr(o.tx_depth if o.verify else 2)
        cap = QpCap(max_send_wr=o.tx_depth + 8, max_recv_wr=RECVS)
        for q in range(o.qps):
            qp = self.ctx.create_qp(self.cq, attr=attr, cap=cap)
            qp.post_recv(range(RECVS))
            reply_off = self.reply_base + q * REPLY_AREA
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
                more=self.more,
            )
            welcome = connect(qp, server, o.service, hello, o.timeout)
            link = _Link(q, qp, welcome, reply_off)
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
        done = 0
        for wc in wcs:
            link = self.by_qpn.get(wc.qpn)
            if link is None:
                continue
            if not wc.ok:
                raise ToolError(f"QP {wc.qpn}: work request {wc.wr_id:#x} failed: {wc.status.name}")
            if wc.opcode is WcOpcode.RDMA_WRITE:
                if wc.wr_id & END_WR:
                    link.end_done = True
                else:
                    link.completed += 1
                    done += 1
            else:
                link.recvs_left -= 1
                imm = wc.imm or 0
                if imm & END:
                    link.result = Result.unpack_from(self.buf, link.reply_off + RESULT_CELL)
                else:
                    link.credited += delta31(imm, link.credited & MASK31)
        series.count += done
        series.bytes += done * self.opts.size
        for link in self.links:
            if link.recvs_left <= RECVS - REPOST:
                link.qp.post_recv(range(REPOST))
                link.recvs_left += REPOST
        return done

    def run(self) -> dict[str, Any]:
        o = self.opts
        with self.stop:
            return self._run(o)

    def _run(self, o: Options) -> dict[str, Any]:
        start = time.monotonic()
        wall = time.time()
        self.events.start = start
        series = Series(o.interval, start)
        stop_at = start + o.duration if o.duration is not None and not o.run_infinitely else None
        period_at = start + o.duration if o.run_infinitely and o.duration else None
        period = {"start": start, "writes": 0, "entry": 0}
        total = 0
        last = start
        final = None if o.duration is not None else o.iters  # writes per QP
        stopping = False
        on_close = self._on_interval(o)
        while True:
            now = time.monotonic()
            if self.stop.set or (stop_at is not None and now >= stop_at):
                stopping = True
            if not stopping:
                for link in self.links:
                    self._post(link, final)
            if final is not None and all(link.completed >= final for link in self.links):
                break
            if stopping and all(link.completed == link.posted for link in self.links):
                break
            deadline = min(
                series.next_tick, stop_at or series.next_tick, period_at or series.next_tick
            )
            wcs = self.cq.poll_wait(POLL_N, timeout=max(0.0, min(deadline - now, 0.1)))
            now = time.monotonic()
            done = self._completions(wcs, series)
            if done:
                total += done
                period["writes"] += done
                last = now
            elif now - last > o.timeout:
                raise ToolError(f"no write completed for {o.timeout:g} s")
            if now >= series.next_tick:
                series.tick(now, on_close)
                self.events.check()
            if period_at is not None and now >= period_at:
                self._period_report(period, now, series)
                period = {"start": now, "writes": 0, "entry": len(series.entries)}
                period_at = now + (o.duration or 5.0)
        end = last
        series.tick(time.monotonic(), on_close)
        self.events.check()
        results = self._finish()
        size = o.size
        nbytes = total * size
        doc: dict[str, Any] = {
            "tool": PROG,
            "role": "client",
            "host": self.host,
            "server_host": o.server_host,
            "service": o.service,
            "size": size,
            "qps": o.qps,
            "tx_depth": o.tx_depth,
            "verify": o.verify,
            "iterations": total,
            "bytes": nbytes,
            **bw_figures(nbytes, total, end - start, series.entries, o.interval),
            "start_time": wall,
            "interval_s": o.interval,
            "series": series.entries,
            "qpns": [link.qp.qpn for link in self.links],
            "qp_attr": {"ev_profile_id": o.ev_profile, "cc_profile_id": o.cc_profile},
            "server": _sum_results(results),
            "events": self.events.seen,
            "interrupted": self.stop.set,
        }
        return doc

    def _on_interval(self, o: Options) -> Callable[[Series, float], dict[str, Any]]:
        def close(s: Series, t: float) -> dict[str, Any]:
            entry = bw_series_entry(s, t)
            if o.show_intervals and not o.json:
                say(bw_interval_line(entry, o.interval, o.report_gbits))
            return entry

        return close

    def _period_report(self, period: dict[str, Any], now: float, series: Series) -> None:
        o = self.opts
        elapsed = now - period["start"]
        writes = period["writes"]
        fig = bw_figures(
            writes * o.size, writes, elapsed, series.entries[period["entry"] :], o.interval
        )
        if o.json:
            emit(
                {
                    "tool": PROG,
                    "role": "client",
                    "report": "period",
                    "size": o.size,
                    "iterations": writes,
                    "bytes": writes * o.size,
                    **fig,
                }
            )
        else:
            peak = fig["bw_peak_MB_s"] * MB
            avg = fig["bw_average_MB_s"] * MB
            say(bw_row(o.size, writes, peak, avg, fig["msg_rate_mpps"] * 1e6, o.report_gbits))

    def _finish(self) -> list[Result]:
        """END to every QP's control cell; wait for the server's counts (they come only
        after the END landed, so the END's own completion is not waited for)."""
        o = self.opts
        for link in self.links:
            off = link.reply_off + END_CELL
            pack_end(self.buf, off, link.posted, stop=self.more and self.stop.set)
            imm = END | (link.posted & MASK31)
            w = link.welcome
            link.qp.post_send(
                WriteWr(END_WR | link.index, (self.mr, off, END_LEN), w.ctrl_addr, w.rkey, imm)
            )
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


def client_main(o: Options) -> int:
    server = o.server_host
    if server is None:
        raise ToolError("client without --server-host")
    began = time.monotonic()
    with Device.open(o.socket_path()) as dev:
        attr = dev.query_device()

        def run_one(ro: Options, i: int, more: bool) -> dict[str, Any]:
            with dev.create_context() as ctx:
                client = BwClient(ro, ctx, attr.host, more=more)
                client.connect(server)
                if i == 0 and not o.json:
                    _header(o, ro, dev, attr.host, attr.planes, server, client)
                return client.run()

        docs, status = o.run_sizes(run_one, _report)
    _end(o, docs, time.monotonic() - began)
    return status


def _header(
    o: Options,
    ro: Options,
    dev: Device,
    host: int,
    planes: int,
    server: int,
    client: BwClient,
) -> None:
    if o.all:
        depth: object = o.depth_flag or "128, fewer from 256 KiB (at most 16 MiB outstanding)"
        qpns = "new for every size (in --json)"
    else:
        depth = ro.tx_depth
        qpns = " ".join(f"{link.qp.qpn:#06x}" for link in client.links)
    say(
        header(
            "RDMA_Write BW Test (MRC over mrcd)",
            [
                ("Device", f"mrcd h{host} ({dev.path})"),
                ("Remote", f"h{server} service {o.service}"),
                ("Number of qps", o.qps),
                ("Transport type", f"MRC, {planes} planes"),
                ("TX depth", depth),
                ("Message size", o.size_text()),
                (
                    "Verify",
                    "ON (CRC-32 of every write, checked by the server)" if o.verify else "OFF",
                ),
                ("Profiles", f"ev {o.ev_profile} cc {o.cc_profile}"),
                ("QPNs", qpns),
            ],
        )
    )
    if o.run_infinitely or o.all:
        say(bw_columns(o.report_gbits))


def _report(o: Options, doc: dict[str, Any]) -> int:
    """One run's JSON document or table row; 1 if the server found mismatches."""
    if o.json:
        emit(doc)
    elif not o.run_infinitely:
        if not o.all:
            say(bw_columns(o.report_gbits))
        peak = doc["bw_peak_MB_s"] * MB
        avg = doc["bw_average_MB_s"] * MB
        say(
            bw_row(o.size, doc["iterations"], peak, avg, doc["msg_rate_mpps"] * 1e6, o.report_gbits)
        )
    mismatches = doc["server"]["mismatches"]
    if mismatches:
        where = f"size {o.size}: " if o.all else ""
        print(
            f"{PROG}: error: {where}verify: {mismatches} writes did not land intact",
            file=sys.stderr,
        )
        return 1
    return 0


def _end(o: Options, docs: list[dict[str, Any]], elapsed: float) -> None:
    """After the last run: the table's end (text), -a's summary document (JSON)."""
    if not docs:
        return
    srv = _sum_results([Result(**d["server"]) for d in docs])
    if o.json:
        if o.all:
            rows = [bw_all_row(d) for d in docs]
            emit(o.all_summary(PROG, docs, elapsed, {"qps": o.qps}, {"rows": rows, "server": srv}))
        return
    say(LINE)
    if o.verify:
        sizes = f" over {len(docs)} sizes" if o.all else ""
        say(
            f" verified by the server: {srv['verified']} writes{sizes}, "
            f"{srv['mismatches']} mismatches"
        )


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(PROG, KIND_BW, argv, lambda o: client_main(o) if o.client else server_main(o))


if __name__ == "__main__":
    sys.exit(main())
