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
"""

from __future__ import annotations

import struct
import sys
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mrcstack.api import (
    CompletionQueue,
    Context,
    Device,
    Listener,
    MemoryRegion,
    QpCap,
    QueuePair,
    WcOpcode,
    WriteWr,
)
from mrcstack.api.types import ConnectRequest
from mrcstack.daemons.tools.common import (
    CTRL_AREA,
    END,
    END_CELL,
    END_LEN,
    KIND_LAT,
    MASK31,
    RECVS,
    REPLY_AREA,
    REPOST,
    RESULT_CELL,
    RESULT_SIZE,
    Events,
    Hello,
    Pattern,
    Result,
    StopFlag,
    ToolError,
    Welcome,
    align,
    connect,
    end_stop,
    naming_size,
    pack_end,
    wait_hello,
)
from mrcstack.daemons.tools.flags import (
    Options,
    run_main,
)
from mrcstack.daemons.tools.report import (
    LAT_COLUMNS,
    LINE,
    Series,
    emit,
    header,
    lat_all_row,
    lat_row,
    lat_stats,
    say,
)

PROG = "mrc-write-lat"
END_WR = 1 << 62
SLOTS = 2


def _rounded(stats: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in stats.items()}


def _series_entry(s: Series, t: float) -> dict[str, Any]:
    st = lat_stats(s.samples)
    return {
        "t": round(t, 6),
        "iterations": len(s.samples),
        "t_typical_us": round(st.get("t_typical_us", 0.0), 3),
        "t_avg_us": round(st.get("t_avg_us", 0.0), 3),
        "t_max_us": round(st.get("t_max_us", 0.0), 3),
    }


# Client -------------------------------------------------------------------------------------
@dataclass
class LatClient:
    opts: Options
    ctx: Context
    host: int
    more: bool = False  # -a: another run follows this one
    samples: list[float] = field(default_factory=list)
    mismatches: int = 0
    recvs_left: int = RECVS

    def __post_init__(self) -> None:
        size = self.opts.size
        self.pong_base = align(SLOTS * size)
        self.reply_off = align(self.pong_base + SLOTS * size)
        self.mr: MemoryRegion = self.ctx.reg_mr(self.reply_off + REPLY_AREA)
        self.buf = self.mr.buf
        self.pattern = Pattern(size)
        self.crcs = [
            self.pattern.fill(self.buf[s * size : (s + 1) * size], 0, s) for s in range(SLOTS)
        ]
        self.cq: CompletionQueue = self.ctx.create_cq(4096)
        self.events = Events(self.ctx, time.monotonic())
        self.stop = StopFlag()

    def connect(self, server: int) -> None:
        o = self.opts
        self.qp: QueuePair = self.ctx.create_qp(
            self.cq, attr=o.qp_attr(2), cap=QpCap(max_send_wr=16, max_recv_wr=RECVS)
        )
        self.qp.post_recv(range(RECVS))
        hello = Hello(
            KIND_LAT,
            o.verify,
            1,
            0,
            o.size,
            SLOTS,
            1,
            1,
            self.mr.addr + self.reply_off,
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
                if not wc.ok:
                    raise ToolError(
                        f"QP {wc.qpn}: work request {wc.wr_id:#x} failed: {wc.status.name}"
                    )
                if wc.opcode is not WcOpcode.RECV_RDMA_WITH_IMM:
                    continue
                self.recvs_left -= 1
                imm = wc.imm or 0
                if (imm == want) if not end else bool(imm & END):
                    if self.recvs_left <= RECVS - REPOST:
                        self.qp.post_recv(range(REPOST))
                        self.recvs_left += REPOST
                    return
            if time.monotonic() > deadline:
                what = "the server's counts" if end else f"the echo of write {want}"
                raise ToolError(f"no {what} within {o.timeout:g} s")

    def run(self) -> dict[str, Any]:
        with self.stop:
            return self._run()

    def _run(self) -> dict[str, Any]:
        o = self.opts
        size, w = o.size, self.welcome
        start = time.monotonic()
        wall = time.time()
        self.events.start = start
        series = Series(o.interval, start)
        stop_at = start + o.duration if o.duration is not None and not o.run_infinitely else None
        period_at = start + o.duration if o.run_infinitely and o.duration else None
        period_from = 0
        last = start
        i = 0
        perf = time.perf_counter

        def close(s: Series, t: float) -> dict[str, Any]:
            entry = _series_entry(s, t)
            if o.show_intervals and not o.json:
                say(
                    f" [{t - o.interval:7.2f}-{t:7.2f} s] {entry['iterations']:>8} iterations "
                    f"t_typical {entry['t_typical_us']:.2f} usec"
                )
            return entry

        while not self.stop.set:
            if stop_at is None and not o.run_infinitely and i >= o.iters:
                break
            slot = i % SLOTS
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
            if period_at is not None and now >= period_at:
                self._period(self.samples[period_from:])
                period_from = len(self.samples)
                period_at = now + (o.duration or 5.0)
        series.tick(time.monotonic(), close)
        self.events.check()
        result = self._finish(i)
        stats = lat_stats(self.samples)
        return {
            "tool": PROG,
            "role": "client",
            "host": self.host,
            "server_host": o.server_host,
            "service": o.service,
            "size": size,
            "iterations": len(self.samples),
            "duration_s": round(last - start, 6),
            **_rounded(stats),
            "verify": o.verify,
            "mismatches": self.mismatches,
            "start_time": wall,
            "interval_s": o.interval,
            "series": series.entries,
            "qpns": [self.qp.qpn],
            "qp_attr": {"ev_profile_id": o.ev_profile, "cc_profile_id": o.cc_profile},
            "server": result.to_json(),
            "events": self.events.seen,
            "interrupted": self.stop.set,
        }

    def _period(self, samples: list[float]) -> None:
        o = self.opts
        if not samples:
            return
        st = lat_stats(samples)
        if o.json:
            emit(
                {
                    "tool": PROG,
                    "role": "client",
                    "report": "period",
                    "size": o.size,
                    "iterations": len(samples),
                    **_rounded(st),
                }
            )
        else:
            say(lat_row(o.size, len(samples), st))

    def _finish(self, count: int) -> Result:
        """END (with END_STOP if -a ends here after all: Ctrl-C, or a bad echo)."""
        off = self.reply_off + END_CELL
        stop = self.more and (self.stop.set or self.mismatches > 0)
        pack_end(self.buf, off, count, stop)
        w = self.welcome
        self.qp.post_send(
            WriteWr(END_WR, (self.mr, off, END_LEN), w.ctrl_addr, w.rkey, END | (count & MASK31))
        )
        self._wait_imm(0, end=True)
        return Result.unpack_from(self.buf, self.reply_off + RESULT_CELL)


def client_main(o: Options) -> int:
    server = o.server_host
    if server is None:
        raise ToolError("client without --server-host")
    began = time.monotonic()
    with Device.open(o.socket_path()) as dev:
        attr = dev.query_device()

        def run_one(ro: Options, i: int, more: bool) -> dict[str, Any]:
            with dev.create_context() as ctx:
                client = LatClient(ro, ctx, attr.host, more=more)
                client.connect(server)
                if i == 0 and not o.json:
                    qpn = "new for every size (in --json)" if o.all else f"{client.qp.qpn:#06x}"
                    say(
                        header(
                            "RDMA_Write Latency Test (MRC over mrcd)",
                            [
                                ("Device", f"mrcd h{attr.host} ({dev.path})"),
                                ("Remote", f"h{server} service {o.service}"),
                                ("Transport type", f"MRC, {attr.planes} planes"),
                                ("Message size", o.size_text()),
                                ("Verify", "ON (CRC-32 of every echo)" if o.verify else "OFF"),
                                ("Profiles", f"ev {o.ev_profile} cc {o.cc_profile}"),
                                ("QPN", qpn),
                                ("Latency", "half the round trip, API calls included"),
                            ],
                        )
                    )
                    if o.run_infinitely or o.all:
                        say(LAT_COLUMNS)
                return client.run()

        docs, status = o.run_sizes(run_one, _report)
    _end(o, docs, time.monotonic() - began)
    return status


def _report(o: Options, doc: dict[str, Any]) -> int:
    """One run's JSON document or table row; 1 if either side found mismatches."""
    if o.json:
        emit(doc)
    elif not o.run_infinitely and doc["iterations"]:
        if not o.all:
            say(LAT_COLUMNS)
        say(lat_row(o.size, doc["iterations"], doc))
    bad = doc["mismatches"] + doc["server"]["mismatches"]
    if bad:
        where = f"size {o.size}: " if o.all else ""
        print(f"{PROG}: error: {where}verify: {bad} mismatches", file=sys.stderr)
        return 1
    return 0


def _end(o: Options, docs: list[dict[str, Any]], elapsed: float) -> None:
    """After the last run: the table's end (text), -a's summary document (JSON)."""
    if not docs:
        return
    if o.json:
        if o.all:
            body = {
                "rows": [lat_all_row(d) for d in docs],
                "mismatches": sum(d["mismatches"] for d in docs),
                "server_mismatches": sum(d["server"]["mismatches"] for d in docs),
            }
            emit(o.all_summary(PROG, docs, elapsed, {}, body))
        return
    say(LINE)
    if o.verify:
        iters = sum(d["iterations"] for d in docs)
        mismatches = sum(d["mismatches"] for d in docs)
        srv = sum(d["server"]["mismatches"] for d in docs)
        sizes = f" over {len(docs)} sizes" if o.all else ""
        say(
            f" verified: {iters - mismatches} echoes intact{sizes}, "
            f"{mismatches} mismatches; server: {srv} bad stamps"
        )


# Server -------------------------------------------------------------------------------------
def server_main(o: Options) -> int:
    with Device.open(o.socket_path()) as dev:
        attr = dev.query_device()
        with dev.create_context() as ctx:
            listener = ctx.listen(o.service)
            if not o.json:
                say(f" waiting for a client on service {o.service} (mrcd h{attr.host})")
            docs: list[dict[str, Any]] = []
            sweep = False
            client_host: int | None = None
            while True:
                if client_host is None:
                    req, hello = wait_hello(listener, KIND_LAT, None)
                    sweep = hello.more
                    client_host = req.remote_host
                else:
                    req, hello = wait_hello(
                        listener,
                        KIND_LAT,
                        o.timeout,
                        host=client_host,
                        waiting_for=f"the client's next run (after size {docs[-1]['size']})",
                    )
                with naming_size(hello.size, sweep):
                    doc, more = _serve(o, ctx, attr.host, dev, listener, req, hello, sweep, docs)
                if sweep:
                    doc["run"] = len(docs)
                docs.append(doc)
                if o.json:
                    emit(doc)
                elif not sweep:
                    say(
                        f" echoed {doc['iterations']} writes of {doc['size']} bytes"
                        + (f"; {doc['mismatches']} bad stamps" if doc["verify"] else "")
                    )
                else:
                    say(
                        f" {doc['size']:<10} echoed {doc['iterations']} writes"
                        + (f"; {doc['mismatches']} bad stamps" if doc["verify"] else "")
                    )
                if doc["mismatches"] or not more:
                    break
    if not o.json:
        say(LINE)
    if doc["mismatches"]:
        where = f"size {doc['size']}: " if sweep else ""
        print(
            f"{PROG}: error: {where}verify: {doc['mismatches']} writes landed with a wrong stamp",
            file=sys.stderr,
        )
        return 1
    return 0


def _serve(
    o: Options,
    ctx: Context,
    host: int,
    dev: Device,
    listener: Listener,
    req: ConnectRequest,
    hello: Hello,
    sweep: bool,
    docs: list[dict[str, Any]],
) -> tuple[dict[str, Any], bool]:
    """One run; its document and whether another follows.  Releases what it created."""
    size = hello.size
    ctrl = align(SLOTS * size)
    result_off = ctrl + CTRL_AREA
    mr = ctx.reg_mr(result_off + 64)
    buf = mr.buf
    cq = ctx.create_cq(4096)
    qp = ctx.create_qp(cq, attr=o.qp_attr(4), cap=QpCap(max_send_wr=16, max_recv_wr=RECVS))
    qp.post_recv(range(RECVS))
    listener.accept(req, qp, Welcome(mr.addr, mr.rkey, mr.addr + ctrl).pack(), timeout=o.timeout)
    if not o.json and not docs:
        say(
            header(
                "RDMA_Write Latency Test (MRC over mrcd): server",
                [
                    ("Device", f"mrcd h{host} ({dev.path})"),
                    ("Client", f"h{req.remote_host} service {o.service}"),
                    (
                        "Message size",
                        f"the client's: from {size} [B], a connection each"
                        if sweep
                        else f"{size} [B]",
                    ),
                    ("Verify", "ON (iteration stamps)" if hello.verify else "OFF"),
                    ("QPN", "new for every size (in --json)" if sweep else f"{qp.qpn:#06x}"),
                ],
            )
        )
    events = Events(ctx, time.monotonic())
    wall = time.time()
    count = mismatches = 0
    recvs_left = RECVS
    last = time.monotonic()
    done = False
    stop = False
    result_sent = False
    next_check = 0.0
    while not done:
        wcs = cq.poll(64) or cq.poll_wait(64, timeout=0.5)
        now = time.monotonic()
        if wcs:
            last = now
        elif now - last > o.timeout:
            raise ToolError(f"nothing from the client for {o.timeout:g} s")
        for wc in wcs:
            if not wc.ok:
                raise ToolError(f"QP {wc.qpn}: work request {wc.wr_id:#x} failed: {wc.status.name}")
            if wc.opcode is WcOpcode.RDMA_WRITE:
                done = done or bool(wc.wr_id & END_WR)
                continue
            recvs_left -= 1
            imm = wc.imm or 0
            if imm & END:
                if delta := (imm & MASK31) - (count & MASK31):
                    mismatches += abs(delta)
                stop = end_stop(buf, ctrl)
                Result(count, count * size, count, mismatches).pack_into(buf, result_off)
                qp.post_send(
                    WriteWr(
                        END_WR,
                        (mr, result_off, RESULT_SIZE),
                        hello.reply_addr + RESULT_CELL,
                        hello.reply_rkey,
                        END | (mismatches & MASK31),
                    )
                )
                result_sent = True
                continue
            slot = imm % SLOTS
            off = slot * size
            if hello.verify and size >= 8:
                (stamp,) = struct.unpack_from("<Q", buf, off)
                if stamp & MASK31 != imm:
                    mismatches += 1
            qp.post_send(
                WriteWr(
                    count,
                    (mr, off, size),
                    hello.data_addr + slot * size,
                    hello.reply_rkey,
                    imm,
                    False,
                )
            )
            count += 1
        if recvs_left <= RECVS - REPOST:
            qp.post_recv(range(REPOST))
            recvs_left += REPOST
        if not result_sent and now >= next_check:
            events.check()
            next_check = now + 0.1
    events.check()
    qp.destroy()
    cq.destroy()
    del buf
    mr.dereg()
    doc = {
        "tool": PROG,
        "role": "server",
        "host": host,
        "client_host": req.remote_host,
        "service": o.service,
        "size": size,
        "iterations": count,
        "verify": hello.verify,
        "mismatches": mismatches,
        "start_time": wall,
        "qpns": [qp.qpn],
        "events": events.seen,
    }
    return doc, hello.more and not stop


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(PROG, KIND_LAT, argv, lambda o: client_main(o) if o.client else server_main(o))


if __name__ == "__main__":
    sys.exit(main())
