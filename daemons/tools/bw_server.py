"""The server side of ``mrc-write-bw``: registers memory, accepts the client's QPs, follows
the writes by their immediates, checks what landed (``--verify``), hands slots back with
credit writes, and answers the client's END with its own counts.  See write_bw.py for the
protocol and docs/tools.md for the output.

One :class:`BwServer` is one run; the run loop (runloop.py) keeps the listener for the whole
time: while the client's hello says another run follows (``-a``), the run releases its QPs,
CQ and memory and the loop accepts the next run from the same host (for ``--timeout``
seconds), one table row or JSON document per run.

When the client's hello says ``-b``, the server also writes back: ``size`` bytes into the
client's ``data_addr``, ``tx_depth`` deep per QP, each write carrying its count as the
immediate, until the client's END arrives; its figures, like the client's, sum both
directions."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from mrcstack.api import (
    ConnectRequest,
    QueuePair,
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
    REVERSE_WR,
    Done,
    Events,
    Hello,
    Receives,
    Result,
    ToolError,
    Welcome,
    align,
    completions,
    crc31,
    delta31,
    end_stop,
    qp_cap,
    send_result,
    wait_hello,
)
from mrcstack.daemons.tools.flags import Options
from mrcstack.daemons.tools.report import (
    Series,
    bw_columns,
    bw_figures,
    bw_figures_row,
    bw_interval_line,
    bw_series_entry,
    header,
    per_qp_figures,
    per_qp_lines,
    qpns_text,
    say,
    server_size_text,
)
from mrcstack.daemons.tools.runloop import Doc, NewRun, interval_closer

PROG = BW_PROG
BIDIR_TEXT = "ON: writing back as much; BW and MsgRate sum both directions"


@dataclass
class _Peer:
    """One server QP and what arrived on it."""

    index: int
    qp: QueuePair
    hello: Hello
    slots_off: int
    recvs: Receives
    received: int = 0
    last_imm: int = 0
    verified: int = 0
    mismatches: int = 0
    first_mismatch: int | None = None
    credit_sent: int = 0
    credits_out: int = 0
    sent: int = 0  # -b: our writes back to the client, posted
    sent_done: int = 0  # and completed
    ended: bool = False
    stop: bool = False  # its END said no run follows after all
    result_done: bool = False


class BwServer:
    """One run: its QPs, CQ and memory (:meth:`close` releases them for the next one)."""

    def __init__(self, new: NewRun) -> None:
        self.opts = new.o
        self.ctx = new.ctx
        self.site = new.site
        self.host = new.site.host
        self.listener = new.listener
        self.sweep = new.sweep  # -a: the client's sizes, a run each
        self.events = Events(new.ctx, time.monotonic())
        self.peers: list[_Peer] = []
        self.by_qpn: dict[int, _Peer] = {}

    def accept(self, req: ConnectRequest, first: Hello) -> None:
        """Accept the run's QPs: the client's first request ``req``, then its others (each
        within --timeout seconds)."""
        o = self.opts
        listener = self.listener
        self.client_host = req.remote_host
        size, slots, qps = first.size, first.slots, first.qps
        slots_len = qps * slots * size
        self.ctrl_base = align(slots_len)
        self.send_base = self.ctrl_base + qps * CTRL_AREA
        self.reverse_src = align(self.send_base + 64 + qps * 64)  # -b: what we write back
        self.mr = self.ctx.reg_mr(self.reverse_src + (size if first.bidir else 0))
        self.buf = self.mr.buf
        self.cq = self.ctx.create_cq(65536)
        back = first.tx_depth if first.bidir else 0
        attr = o.qp_attr(MAX_CREDITS_OUT + 2 + back)
        cap = qp_cap(MAX_CREDITS_OUT + 8 + back)
        hello = first
        for q in range(qps):
            if q:
                req, hello = wait_hello(listener, KIND_BW, o.timeout, like=hello)
            qp = self.ctx.create_qp(self.cq, attr=attr, cap=cap)
            recvs = Receives(qp)
            slots_off = q * slots * size
            welcome = Welcome(
                self.mr.addr + slots_off,
                self.mr.rkey,
                self.mr.addr + self.ctrl_base + q * CTRL_AREA,
            )
            listener.accept(req, qp, welcome.pack(), timeout=o.timeout)
            peer = _Peer(q, qp, hello, slots_off, recvs)
            self.peers.append(peer)
            self.by_qpn[qp.qpn] = peer
        self.hello = first

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
        """The writes the client placed, and with -b ours to it that completed: both
        count in the series (and are the number returned)."""
        h = self.hello
        size = h.size
        placed = 0
        for p, what, wc in completions(wcs, self.by_qpn, PROG, self.events.finished):
            if what is Done.WROTE:  # one of our credit writes, or with -b one written back
                if wc.wr_id & CREDIT_WR:
                    p.credits_out -= 1
                else:
                    p.sent_done += 1
                    placed += 1  # -b: our write back, placed at the client
                continue
            if what is Done.ENDED:  # our counts
                p.result_done = True
                continue
            p.recvs.take()
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
        off = self.send_base + 64 + p.index * 64
        result = Result(p.received, p.received * p.hello.size, p.verified, p.mismatches)
        send_result(p.qp, self.mr, off, p.hello, result, END_WR | p.index)
        self.events.finished.add(p.qp.qpn)

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

    def _write_back(self) -> None:
        """-b: keep ``tx_depth`` writes to the client in flight on every QP until its END."""
        h = self.hello
        for p in self.peers:
            if p.ended:
                continue
            wrs = []
            while p.sent - p.sent_done < h.tx_depth:
                p.sent += 1
                src = (self.mr, self.reverse_src, h.size)
                wrs.append(WriteWr(REVERSE_WR | p.sent, src, h.data_addr, h.reply_rkey,
                                   p.sent & MASK31))  # fmt: skip
            if wrs:
                p.qp.post_send(wrs)

    def run(self) -> Doc:
        o, h = self.opts, self.hello
        start = time.monotonic()
        wall = time.time()
        self.events.start = start
        series = Series(o.interval, start)
        close = interval_closer(
            o, bw_series_entry, lambda e, _t: bw_interval_line(e, o.interval, o.report_gbits)
        )
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
                end = now
            if h.verify:
                self._credits()
            if h.bidir:
                self._write_back()
            for p in self.peers:
                p.recvs.top_up()
            if now >= series.next_tick:
                series.tick(now, close)
                self.events.check()
        series.tick(time.monotonic(), close)
        self.events.check()
        total = sum(p.received for p in self.peers)
        sent = sum(p.sent_done for p in self.peers)
        nbytes = total * h.size
        both = total + sent  # -b: both directions, as perftest sums them
        first = next((p for p in self.peers if p.first_mismatch is not None), None)
        bidir = {
            "bidirectional": {
                "sent": {"writes": sent, "bytes": sent * h.size},
                "received": {"writes": total, "bytes": nbytes},
            }
        }
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
            **bw_figures(both * h.size, both, end - start, series.entries, o.interval),
            **(bidir if h.bidir else {}),
            "verified": sum(p.verified for p in self.peers),
            "mismatches": sum(p.mismatches for p in self.peers),
            "first_mismatch": None
            if first is None
            else {"qp": first.index, "write": first.first_mismatch},
            "start_time": wall,
            "interval_s": o.interval,
            "series": series.entries,
            "qpns": [p.qp.qpn for p in self.peers],
            "per_qp": [
                per_qp_figures(p.qp.qpn, p.received, h.size, end - start) for p in self.peers
            ],
            "events": self.events.seen,
        }

    def serve(self, first: bool) -> tuple[Doc, bool]:
        """The run after :meth:`accept`: its header if ``first``, its writes, its release."""
        o = self.opts
        if first and not o.json:
            self._header()
        doc = self.run()
        more = self.more
        self.close()
        return doc, more

    def _header(self) -> None:
        o, hello = self.opts, self.hello
        if self.sweep:
            depth = f"the client's: {hello.tx_depth} at {hello.size} [B]"
        else:
            depth = str(hello.tx_depth)
        say(
            header(
                "RDMA_Write BW Test (MRC over mrcd): server",
                [
                    ("Device", self.site.device),
                    ("Client", f"h{self.client_host} service {o.service}"),
                    ("Number of qps", hello.qps),
                    ("TX depth", depth),
                    ("Message size", server_size_text(hello.size, self.sweep)),
                    ("Verify", "ON (CRC-32 of what landed)" if hello.verify else "OFF"),
                    *([("Bidirectional", BIDIR_TEXT)] if hello.bidir else []),
                    ("QPNs", qpns_text([p.qp.qpn for p in self.peers], self.sweep)),
                ],
            )
        )


class BwServerTool:
    """The server of ``mrc-write-bw`` in the shared run loop (:mod:`.runloop`)."""

    prog = PROG
    kind = KIND_BW

    def start(self, new: NewRun) -> BwServer:
        server = BwServer(new)
        server.accept(new.req, new.hello)
        return server

    def show(self, o: Options, doc: Doc, docs: Sequence[Doc], sweep: bool) -> None:
        if len(docs) == 1:
            say(bw_columns(o.report_gbits))
        say(bw_figures_row(doc["size"], doc["iterations"], doc, o.report_gbits))
        if doc["qps"] > 1 and not sweep:
            say("\n".join(per_qp_lines(doc["per_qp"], o.report_gbits)))

    def verified(self, docs: Sequence[Doc], sizes: str) -> str | None:
        if not docs[0]["verify"]:
            return None
        verified = sum(d["verified"] for d in docs)
        mismatches = sum(d["mismatches"] for d in docs)
        return f" verified: {verified} writes{sizes}, {mismatches} mismatches"

    def failure(self, doc: Doc) -> str:
        return f"{doc['mismatches']} writes did not land intact (first: {doc['first_mismatch']})"
