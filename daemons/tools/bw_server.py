"""The server side of ``mrc-write-bw``: registers memory, accepts the client's QPs, follows
the writes by their immediates, checks what landed (``--verify``), hands slots back with
credit writes, and answers the client's END with its own counts.  See write_bw.py for the
protocol and docs/tools.md for the output.

It keeps its listener for the whole time: while the client's hello says another run follows
(``-a``), it releases the run's QPs, CQ and memory and accepts the next run from the same
host (for ``--timeout`` seconds), one table row or JSON document per run."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

from mrcstack.api import (
    Context,
    Device,
    Listener,
    QpCap,
    QueuePair,
    WcOpcode,
    WorkCompletion,
    WriteWr,
)
from mrcstack.daemons.tools.common import (
    BW_PROG,
    CREDIT_CELL,
    CREDIT_WR,
    CTRL_AREA,
    END,
    END_WR,
    KIND_BW,
    MASK31,
    MAX_CREDITS_OUT,
    POLL_N,
    RECVS,
    REPOST,
    RESULT_CELL,
    RESULT_SIZE,
    Events,
    Hello,
    Result,
    ToolError,
    Welcome,
    align,
    crc31,
    delta31,
    end_stop,
    naming_size,
    wait_hello,
)
from mrcstack.daemons.tools.flags import Options
from mrcstack.daemons.tools.report import (
    LINE,
    MB,
    Series,
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


@dataclass
class _Peer:
    """One server QP and what arrived on it."""

    index: int
    qp: QueuePair
    hello: Hello
    slots_off: int
    received: int = 0
    last_imm: int = 0
    verified: int = 0
    mismatches: int = 0
    first_mismatch: int | None = None
    credit_sent: int = 0
    credits_out: int = 0
    recvs_left: int = RECVS
    ended: bool = False
    stop: bool = False  # its END said no run follows after all
    result_done: bool = False


class BwServer:
    """One run: its QPs, CQ and memory (:meth:`close` releases them for the next one)."""

    def __init__(self, opts: Options, ctx: Context, host: int, listener: Listener) -> None:
        self.opts = opts
        self.ctx = ctx
        self.host = host
        self.listener = listener
        self.events = Events(ctx, time.monotonic())
        self.peers: list[_Peer] = []
        self.by_qpn: dict[int, _Peer] = {}

    def accept(self, client_host: int | None = None, after: int = 0) -> Hello:
        """The first run's client (waits for ever), or the next run of ``client_host``'s -a
        (for --timeout seconds)."""
        o = self.opts
        listener = self.listener
        if client_host is None:
            req, first = wait_hello(listener, KIND_BW, None)
        else:
            req, first = wait_hello(
                listener,
                KIND_BW,
                o.timeout,
                host=client_host,
                waiting_for=f"the client's next run (after size {after})",
            )
        self.client_host = req.remote_host
        size, slots, qps = first.size, first.slots, first.qps
        slots_len = qps * slots * size
        self.ctrl_base = align(slots_len)
        self.send_base = self.ctrl_base + qps * CTRL_AREA
        self.mr = self.ctx.reg_mr(self.send_base + 64 + qps * 64)
        self.buf = self.mr.buf
        self.cq = self.ctx.create_cq(65536)
        attr = o.qp_attr(MAX_CREDITS_OUT + 2)
        cap = QpCap(max_send_wr=MAX_CREDITS_OUT + 8, max_recv_wr=RECVS)
        hello = first
        for q in range(qps):
            if q:
                req, hello = wait_hello(listener, KIND_BW, o.timeout, like=hello)
            qp = self.ctx.create_qp(self.cq, attr=attr, cap=cap)
            qp.post_recv(range(RECVS))
            slots_off = q * slots * size
            welcome = Welcome(
                self.mr.addr + slots_off,
                self.mr.rkey,
                self.mr.addr + self.ctrl_base + q * CTRL_AREA,
            )
            listener.accept(req, qp, welcome.pack(), timeout=o.timeout)
            peer = _Peer(q, qp, hello, slots_off)
            self.peers.append(peer)
            self.by_qpn[qp.qpn] = peer
        self.hello = first
        return first

    @property
    def more(self) -> bool:
        """Another run follows (the hello said so and no END took it back)."""
        return self.hello.more and not any(p.stop for p in self.peers)

    def close(self) -> None:
        """Release this run's QPs, CQ and memory (the context and listener stay)."""
        for p in self.peers:
            p.qp.destroy()
        self.cq.destroy()
        self.mr.dereg()

    def _arrivals(self, wcs: list[WorkCompletion], series: Series) -> int:
        h = self.hello
        size = h.size
        placed = 0
        for wc in wcs:
            p = self.by_qpn.get(wc.qpn)
            if p is None:
                continue
            if not wc.ok:
                raise ToolError(f"QP {wc.qpn}: work request {wc.wr_id:#x} failed: {wc.status.name}")
            if wc.opcode is WcOpcode.RDMA_WRITE:
                if wc.wr_id & END_WR:
                    p.result_done = True
                else:
                    p.credits_out -= 1
                continue
            p.recvs_left -= 1
            imm = wc.imm or 0
            if imm & END:
                count = imm & MASK31
                if h.verify:
                    missing = delta31(count, p.received & MASK31)
                    if missing:
                        self._mismatch(p, p.received, missing)
                else:
                    n = delta31(count, p.last_imm)
                    p.received += n
                    placed += n
                p.ended = True
                p.stop = end_stop(self.buf, self.ctrl_base + p.index * CTRL_AREA)
                self._send_result(p)
            elif h.verify:
                k = p.received
                off = p.slots_off + (k % h.slots) * size
                if wc.byte_len != size or crc31(self.buf[off : off + size]) != imm:
                    self._mismatch(p, k, 1)
                p.received += 1
                p.verified += 1
                placed += 1
            else:
                n = delta31(imm, p.last_imm)
                p.last_imm = imm
                p.received += n
                placed += n
        series.count += placed
        series.bytes += placed * size
        return placed

    def _mismatch(self, p: _Peer, write: int, n: int) -> None:
        p.mismatches += n
        if p.first_mismatch is None:
            p.first_mismatch = write

    def _send_result(self, p: _Peer) -> None:
        h = p.hello
        off = self.send_base + 64 + p.index * 64
        Result(p.received, p.received * h.size, p.verified, p.mismatches).pack_into(self.buf, off)
        imm = END | (p.mismatches & MASK31)
        p.qp.post_send(
            WriteWr(
                END_WR | p.index,
                (self.mr, off, RESULT_SIZE),
                h.reply_addr + RESULT_CELL,
                h.reply_rkey,
                imm,
            )
        )

    def _credits(self) -> None:
        for p in self.peers:
            if p.ended or p.verified <= p.credit_sent or p.credits_out >= MAX_CREDITS_OUT:
                continue
            h = p.hello
            wr = WriteWr(
                CREDIT_WR | p.index,
                (self.mr, self.send_base, 8),
                h.reply_addr + CREDIT_CELL,
                h.reply_rkey,
                p.verified & MASK31,
            )
            p.qp.post_send(wr)
            p.credit_sent = p.verified
            p.credits_out += 1

    def run(self) -> dict[str, Any]:
        o, h = self.opts, self.hello
        start = time.monotonic()
        wall = time.time()
        self.events.start = start
        series = Series(o.interval, start)

        def close(s: Series, t: float) -> dict[str, Any]:
            entry = bw_series_entry(s, t)
            if o.show_intervals and not o.json:
                say(bw_interval_line(entry, o.interval, o.report_gbits))
            return entry

        total = 0
        last = start
        end = start
        while not all(p.result_done for p in self.peers):
            now = time.monotonic()
            wcs = self.cq.poll_wait(POLL_N, timeout=max(0.0, min(series.next_tick - now, 0.1)))
            now = time.monotonic()
            placed = self._arrivals(wcs, series)
            if wcs:
                last = now
            elif now - last > o.timeout:
                raise ToolError(f"nothing from the client for {o.timeout:g} s")
            if placed:
                total += placed
                end = now
            if h.verify:
                self._credits()
            for p in self.peers:
                if p.recvs_left <= RECVS - REPOST:
                    p.qp.post_recv(range(REPOST))
                    p.recvs_left += REPOST
            if now >= series.next_tick:
                series.tick(now, close)
                self.events.check()
        series.tick(time.monotonic(), close)
        self.events.check()
        nbytes = total * h.size
        first = next((p for p in self.peers if p.first_mismatch is not None), None)
        return {
            "tool": PROG,
            "role": "server",
            "host": self.host,
            "client_host": self.client_host,
            "service": o.service,
            "size": h.size,
            "qps": h.qps,
            "tx_depth": h.tx_depth,
            "verify": h.verify,
            "iterations": total,
            "bytes": nbytes,
            **bw_figures(nbytes, total, end - start, series.entries, o.interval),
            "verified": sum(p.verified for p in self.peers),
            "mismatches": sum(p.mismatches for p in self.peers),
            "first_mismatch": None
            if first is None
            else {"qp": first.index, "write": first.first_mismatch},
            "start_time": wall,
            "interval_s": o.interval,
            "series": series.entries,
            "qpns": [p.qp.qpn for p in self.peers],
            "events": self.events.seen,
        }


def server_main(o: Options) -> int:
    with Device.open(o.socket_path()) as dev:
        attr = dev.query_device()
        with dev.create_context() as ctx:
            listener = ctx.listen(o.service)
            if not o.json:
                say(f" waiting for a client on service {o.service} (mrcd h{attr.host})")
            return _serve(o, ctx, attr.host, dev, listener)


def _serve(o: Options, ctx: Context, host: int, dev: Device, listener: Listener) -> int:
    """Runs until one without FLAG_MORE is over; a table row or JSON document each."""
    docs: list[dict[str, Any]] = []
    sweep = False
    client_host: int | None = None
    while True:
        server = BwServer(o, ctx, host, listener)
        hello = server.accept(client_host, docs[-1]["size"] if docs else 0)
        if not docs:
            sweep = hello.more
            client_host = server.client_host
        with naming_size(hello.size, sweep):
            if not docs and not o.json:
                _header(o, server, hello, dev, host, sweep)
            doc = server.run()
            more = server.more
            server.close()
        if sweep:
            doc["run"] = len(docs)
        docs.append(doc)
        if o.json:
            emit(doc)
        else:
            if len(docs) == 1:
                say(bw_columns(o.report_gbits))
            say(
                bw_row(
                    doc["size"],
                    doc["iterations"],
                    doc["bw_peak_MB_s"] * MB,
                    doc["bw_average_MB_s"] * MB,
                    doc["msg_rate_mpps"] * 1e6,
                    o.report_gbits,
                )
            )
        if doc["mismatches"]:
            _end(o, docs, sweep)
            where = f"size {doc['size']}: " if sweep else ""
            print(
                f"{PROG}: error: {where}verify: {doc['mismatches']} writes did not land intact "
                f"(first: {doc['first_mismatch']})",
                file=sys.stderr,
            )
            return 1
        if not more:
            _end(o, docs, sweep)
            return 0


def _header(
    o: Options, server: BwServer, hello: Hello, dev: Device, host: int, sweep: bool
) -> None:
    if sweep:
        size = f"the client's: from {hello.size} [B], a connection each"
        depth = f"the client's: {hello.tx_depth} at {hello.size} [B]"
        qpns = "new for every size (in --json)"
    else:
        size = f"{hello.size} [B]"
        depth = str(hello.tx_depth)
        qpns = " ".join(f"{p.qp.qpn:#06x}" for p in server.peers)
    say(
        header(
            "RDMA_Write BW Test (MRC over mrcd): server",
            [
                ("Device", f"mrcd h{host} ({dev.path})"),
                ("Client", f"h{server.client_host} service {o.service}"),
                ("Number of qps", hello.qps),
                ("TX depth", depth),
                ("Message size", size),
                ("Verify", "ON (CRC-32 of what landed)" if hello.verify else "OFF"),
                ("QPNs", qpns),
            ],
        )
    )


def _end(o: Options, docs: list[dict[str, Any]], sweep: bool) -> None:
    if o.json:
        return
    say(LINE)
    if docs[0]["verify"]:
        verified = sum(d["verified"] for d in docs)
        mismatches = sum(d["mismatches"] for d in docs)
        sizes = f" over {len(docs)} sizes" if sweep else ""
        say(f" verified: {verified} writes{sizes}, {mismatches} mismatches")
