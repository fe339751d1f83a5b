"""``mrc-write-lat``: RDMA WRITE latency over mrcd, like perftest's ``ib_write_lat``.

Ping-pong with writes-with-immediate: the client writes ``--size`` bytes with its iteration
number as the immediate into the server's region; the server's receive completion (the
write and everything before it placed) triggers a write of the same bytes back, with the
same immediate, into the client's region; the client's receive completion ends the round
trip.  As perftest does, the latency reported is half the round trip, and it includes
everything a program sees: the API calls to the local mrcd, both daemons and the fabric.

With ``--verify`` the client writes a fresh pattern every iteration, the server checks the
iteration stamp in what landed, and the client compares the CRC-32 of the echo with what it
sent.  Two alternating slots on each side keep a write's source unchanged while it may
still be retransmitted.

With ``-a`` every size 2, 4, ... ``--max-size`` is such a run on a fresh context and
connection; the server keeps its listener and serves them one after the other (common.py).
The server is lat_server.py; the run loop, headers and reports around a run are runloop.py's.
"""

from __future__ import annotations

import sys
import time
import zlib
from collections.abc import Sequence

from mrcstack.api import (
    Context,
    QueuePair,
    WcOpcode,
    WriteWr,
)
from mrcstack.daemons.tools.common import (
    END,
    END_CELL,
    KIND_LAT,
    LAT_PROG,
    LAT_SLOTS,
    MASK31,
    RESULT_CELL,
    Hello,
    Receives,
    Result,
    ToolError,
    align,
    check_wc,
    connect,
    qp_cap,
    send_end,
)
from mrcstack.daemons.tools.flags import Options
from mrcstack.daemons.tools.lat_server import LatServerTool
from mrcstack.daemons.tools.report import (
    LAT_COLUMNS,
    lat_all_row,
    lat_interval_line,
    lat_row,
    lat_series_entry,
    lat_stats,
    qpns_text,
    rounded,
)
from mrcstack.daemons.tools.runloop import (
    ClientBase,
    Doc,
    Site,
    tool_main,
)

PROG = LAT_PROG


class LatClient(ClientBase):
    """One run of the client: ping-pong on one QP (its sources, then its pong slots)."""

    prog = PROG

    def __init__(self, opts: Options, ctx: Context, host: int, more: bool = False) -> None:
        size = opts.size
        pong_base = align(LAT_SLOTS * size)
        super().__init__(opts, ctx, host, more)
        self._register(pong_base + LAT_SLOTS * size, 1, cq_size=4096)
        self.pong_base = pong_base
        self.crcs = [
            self.pattern.fill(self.buf[s * size : (s + 1) * size], 0, s) for s in range(LAT_SLOTS)
        ]
        self.samples: list[float] = []
        self.mismatches = 0

    def connect(self, server: int) -> None:
        o = self.opts
        self.qp: QueuePair = self.ctx.create_qp(self.cq, attr=o.qp_attr(2), cap=qp_cap(16))
        self.recvs = Receives(self.qp)
        hello = Hello(
            KIND_LAT,
            o.verify,
            1,
            0,
            o.size,
            LAT_SLOTS,
            1,
            1,
            self.mr.addr + self.reply_off(0),
            self.mr.rkey,
            self.mr.addr + self.pong_base,
            more=self.more,
        )
        self.welcome = connect(self.qp, server, o.service, hello, o.timeout)

    def _wait_imm(self, want: int, end: bool = False) -> None:
        """Until the receive completion with immediate ``want`` (the pong, or the result)."""
        o = self.opts
        deadline = time.monotonic() + o.timeout
        while True:
            for wc in self.cq.poll(64) or self.cq.poll_wait(64, timeout=0.5):
                check_wc(wc)
                if wc.opcode is not WcOpcode.RECV_RDMA_WITH_IMM:
                    continue
                self.recvs.take()
                imm = wc.imm or 0
                if (imm == want) if not end else bool(imm & END):
                    self.recvs.top_up()
                    return
            if time.monotonic() > deadline:
                what = "the server's counts" if end else f"the echo of write {want}"
                raise ToolError(f"no {what} within {o.timeout:g} s")

    def _run(self) -> Doc:
        o = self.opts
        size, w = o.size, self.welcome
        clock, series = self._begin()
        start, stop_at = clock.start, clock.stop_at
        period_from = 0
        last = start
        i = 0
        perf = time.perf_counter
        close = self._closer(lat_series_entry, lambda e, t: lat_interval_line(e, t, o.interval))
        while not self.stop.set:
            if stop_at is None and not o.run_infinitely and i >= o.iters:
                break
            slot = i % LAT_SLOTS
            src = slot * size
            crc = self.crcs[slot]
            if o.verify:
                crc = self.pattern.fill(self.buf[src : src + size], 0, i)
            imm = i & MASK31
            t0 = perf()
            self.qp.post_send(
                WriteWr(i, (self.mr, src, size), w.slots_addr + slot * size, w.rkey, imm, False)
            )
            self._wait_imm(imm)
            t1 = perf()
            one_way = (t1 - t0) / 2
            self.samples.append(one_way)
            series.samples.append(one_way)
            if o.verify:
                pong = self.pong_base + slot * size
                if zlib.crc32(self.buf[pong : pong + size]) != crc:
                    self.mismatches += 1
            i += 1
            now = time.monotonic()
            last = now
            if now >= series.next_tick:
                series.tick(now, close)
                self.events.check()
            if stop_at is not None and now >= stop_at:
                break
            if clock.period_at is not None and now >= clock.period_at:
                self._period(self.samples[period_from:])
                period_from = len(self.samples)
                clock.next_period(o, now)
        series.tick(time.monotonic(), close)
        self.events.check()
        result = self._finish(i)
        figures = {
            "iterations": len(self.samples),
            "duration_s": round(last - start, 6),
            **rounded(lat_stats(self.samples)),
            "verify": o.verify,
            "mismatches": self.mismatches,
        }
        return self._document(figures, clock, series, [self.qp.qpn], result.to_json())

    def _period(self, samples: list[float]) -> None:
        if not samples:
            return
        o = self.opts
        st = lat_stats(samples)
        figures = {"iterations": len(samples), **rounded(st)}
        self._report_period(figures, lat_row(o.size, len(samples), st))

    def _finish(self, count: int) -> Result:
        """END (with END_STOP if -a ends here after all: Ctrl-C, or a bad echo)."""
        off = self.reply_off(0) + END_CELL
        stop = self.more and (self.stop.set or self.mismatches > 0)
        send_end(self.qp, self.mr, off, self.welcome, count, stop)
        self._wait_imm(0, end=True)
        return Result.unpack_from(self.buf, self.reply_off(0) + RESULT_CELL)

    def header_rows(self, site: Site) -> list[tuple[str, object]]:
        o = self.opts
        return [
            ("Device", site.device),
            ("Remote", f"h{o.server_host} service {o.service}"),
            ("Transport type", f"MRC, {site.planes} planes"),
            ("Message size", o.size_text()),
            ("Verify", "ON (CRC-32 of every echo)" if o.verify else "OFF"),
            ("Profiles", f"ev {o.ev_profile} cc {o.cc_profile}"),
            ("QPN", qpns_text([self.qp.qpn], o.all)),
            ("Latency", "half the round trip, API calls included"),
        ]


class LatClientTool:
    """The client of ``mrc-write-lat`` in the shared run loop (:mod:`.runloop`)."""

    title = "RDMA_Write Latency Test (MRC over mrcd)"
    prog = PROG
    client = LatClient

    def columns(self, o: Options) -> str:
        return LAT_COLUMNS

    def row(self, o: Options, doc: Doc) -> str | None:
        return lat_row(o.size, doc["iterations"], doc) if doc["iterations"] else None

    def failure(self, doc: Doc) -> str | None:
        bad = doc["mismatches"] + doc["server"]["mismatches"]
        return f"{bad} mismatches" if bad else None

    def summary(self, o: Options, docs: Sequence[Doc]) -> tuple[Doc, Doc]:
        return {}, {
            "rows": [lat_all_row(d) for d in docs],
            "mismatches": sum(d["mismatches"] for d in docs),
            "server_mismatches": sum(d["server"]["mismatches"] for d in docs),
        }

    def verified(self, docs: Sequence[Doc], sizes: str) -> str:
        iters = sum(d["iterations"] for d in docs)
        mismatches = sum(d["mismatches"] for d in docs)
        srv = sum(d["server"]["mismatches"] for d in docs)
        return (
            f" verified: {iters - mismatches} echoes intact{sizes}, "
            f"{mismatches} mismatches; server: {srv} bad stamps"
        )


def main(argv: Sequence[str] | None = None) -> int:
    return tool_main(argv, LatClientTool(), LatServerTool())


if __name__ == "__main__":
    sys.exit(main())
