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
"""

from __future__ import annotations

import struct
import sys
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from daemons.tools.common import (
    CTRL_AREA,
    END,
    END_CELL,
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
    wait_hello,
)
from daemons.tools.flags import (
    Options,
    run_main,
)
from daemons.tools.report import (
    LAT_COLUMNS,
    LINE,
    Series,
    emit,
    header,
    lat_row,
    lat_stats,
    say,
)
from mrcstack.api import (
    CompletionQueue,
    Context,
    Device,
    MemoryRegion,
    QpCap,
    QueuePair,
    WcOpcode,
    WriteWr,
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
        off = self.reply_off + END_CELL
        struct.pack_into("<Q", self.buf, off, count)
        w = self.welcome
        self.qp.post_send(
            WriteWr(END_WR, (self.mr, off, 8), w.ctrl_addr, w.rkey, END | (count & MASK31))
        )
        self._wait_imm(0, end=True)
        return Result.unpack_from(self.buf, self.reply_off + RESULT_CELL)


def client_main(o: Options) -> int:
    server = o.server_host
    if server is None:
        raise ToolError("client without --server-host")
    with Device.open(o.socket_path()) as dev:
        attr = dev.query_device()
        with dev.create_context() as ctx:
            client = LatClient(o, ctx, attr.host)
            client.connect(server)
            if not o.json:
                say(
                    header(
                        "RDMA_Write Latency Test (MRC over mrcd)",
                        [
                            ("Device", f"mrcd h{attr.host} ({dev.path})"),
                            ("Remote", f"h{server} service {o.service}"),
                            ("Transport type", f"MRC, {attr.planes} planes"),
                            ("Message size", f"{o.size} [B]"),
                            ("Verify", "ON (CRC-32 of every echo)" if o.verify else "OFF"),
                            ("Profiles", f"ev {o.ev_profile} cc {o.cc_profile}"),
                            ("QPN", f"{client.qp.qpn:#06x}"),
                            ("Latency", "half the round trip, API calls included"),
                        ],
                    )
                )
                if o.run_infinitely:
                    say(LAT_COLUMNS)
            doc = client.run()
    if o.json:
        emit(doc)
    else:
        if not o.run_infinitely and doc["iterations"]:
            say(LAT_COLUMNS)
            say(lat_row(o.size, doc["iterations"], doc))
        say(LINE)
        if o.verify:
            srv = doc["server"]
            say(
                f" verified: {doc['iterations'] - doc['mismatches']} echoes intact, "
                f"{doc['mismatches']} mismatches; server: {srv['mismatches']} bad stamps"
            )
    bad = doc["mismatches"] + doc["server"]["mismatches"]
    if bad:
        print(f"{PROG}: error: verify: {bad} mismatches", file=sys.stderr)
        return 1
    return 0


# Server -------------------------------------------------------------------------------------
def server_main(o: Options) -> int:
    with Device.open(o.socket_path()) as dev:
        attr = dev.query_device()
        with dev.create_context() as ctx:
            doc = _serve(o, ctx, attr.host, dev)
    if o.json:
        emit(doc)
    else:
        say(
            f" echoed {doc['iterations']} writes of {doc['size']} bytes"
            + (f"; {doc['mismatches']} bad stamps" if doc["verify"] else "")
        )
        say(LINE)
    if doc["mismatches"]:
        print(
            f"{PROG}: error: verify: {doc['mismatches']} writes landed with a wrong stamp",
            file=sys.stderr,
        )
        return 1
    return 0


def _serve(o: Options, ctx: Context, host: int, dev: Device) -> dict[str, Any]:
    listener = ctx.listen(o.service)
    if not o.json:
        say(f" waiting for a client on service {o.service} (mrcd h{host})")
    req, hello = wait_hello(listener, KIND_LAT, None)
    size = hello.size
    ctrl = align(SLOTS * size)
    result_off = ctrl + CTRL_AREA
    mr = ctx.reg_mr(result_off + 64)
    buf = mr.buf
    cq = ctx.create_cq(4096)
    qp = ctx.create_qp(cq, attr=o.qp_attr(4), cap=QpCap(max_send_wr=16, max_recv_wr=RECVS))
    qp.post_recv(range(RECVS))
    listener.accept(req, qp, Welcome(mr.addr, mr.rkey, mr.addr + ctrl).pack(), timeout=o.timeout)
    if not o.json:
        say(
            header(
                "RDMA_Write Latency Test (MRC over mrcd): server",
                [
                    ("Device", f"mrcd h{host} ({dev.path})"),
                    ("Client", f"h{req.remote_host} service {o.service}"),
                    ("Message size", f"{size} [B]"),
                    ("Verify", "ON (iteration stamps)" if hello.verify else "OFF"),
                    ("QPN", f"{qp.qpn:#06x}"),
                ],
            )
        )
    events = Events(ctx, time.monotonic())
    wall = time.time()
    count = mismatches = 0
    recvs_left = RECVS
    last = time.monotonic()
    done = False
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
    return {
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


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(PROG, KIND_LAT, argv, lambda o: client_main(o) if o.client else server_main(o))


if __name__ == "__main__":
    sys.exit(main())
