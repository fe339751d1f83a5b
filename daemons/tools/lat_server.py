"""The server side of ``mrc-write-lat``: registers memory, accepts the client's QP, and
answers every write-with-immediate with the same bytes written back (the pong), checking the
iteration stamp of what landed with ``--verify``; the client's END gets its counts.  See
write_lat.py for the protocol and docs/tools.md for the output.

One :class:`LatServer` is one run; the run loop (runloop.py) keeps the listener and, while
the client's hello says another run follows (``-a``), serves the next one from the same
host, one line or JSON document per run."""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence

from mrcstack.api import WriteWr
from mrcstack.daemons.tools.common import (
    CTRL_AREA,
    END,
    KIND_LAT,
    LAT_PROG,
    LAT_SLOTS,
    MASK31,
    Done,
    Events,
    Receives,
    Result,
    ToolError,
    Welcome,
    align,
    completions,
    end_stop,
    qp_cap,
    send_result,
)
from mrcstack.daemons.tools.flags import Options
from mrcstack.daemons.tools.report import header, qpns_text, say, server_size_text
from mrcstack.daemons.tools.runloop import Doc, NewRun

PROG = LAT_PROG


class LatServer:
    """One run: the client's request until its END is answered (everything it creates is
    released before :meth:`serve` returns)."""

    def __init__(self, new: NewRun) -> None:
        self.new = new

    def serve(self, first: bool) -> tuple[Doc, bool]:
        """One run; its document and whether another follows."""
        new = self.new
        o, ctx, req, hello = new.o, new.ctx, new.req, new.hello
        size = hello.size
        ctrl = align(LAT_SLOTS * size)
        result_off = ctrl + CTRL_AREA
        mr = ctx.reg_mr(result_off + 64)
        buf = mr.buf
        cq = ctx.create_cq(4096)
        qp = ctx.create_qp(cq, attr=o.qp_attr(4), cap=qp_cap(16))
        recvs = Receives(qp)
        welcome = Welcome(mr.addr, mr.rkey, mr.addr + ctrl)
        new.listener.accept(req, qp, welcome.pack(), timeout=o.timeout)
        if not o.json and first:
            self._header(qp.qpn)
        events = Events(ctx, time.monotonic())
        wall = time.time()
        count = mismatches = 0
        last = time.monotonic()
        done = False
        stop = False
        owners = {qp.qpn: qp}
        next_check = 0.0
        while not done:
            wcs = cq.poll(64) or cq.poll_wait(64, timeout=0.5)
            now = time.monotonic()
            if wcs:
                last = now
            elif now - last > o.timeout:
                raise ToolError(f"nothing from the client for {o.timeout:g} s")
            for _, what, wc in completions(wcs, owners, PROG, events.finished):
                if what is not Done.ARRIVED:  # a pong, or our counts
                    done = done or what is Done.ENDED
                    continue
                recvs.take()
                imm = wc.imm or 0
                if imm & END:
                    if delta := (imm & MASK31) - (count & MASK31):
                        mismatches += abs(delta)
                    stop = end_stop(buf, ctrl)
                    result = Result(count, count * size, count, mismatches)
                    send_result(qp, mr, result_off, hello, result)
                    events.finished.add(qp.qpn)  # its run is over: see counts_unconfirmed
                    continue
                slot = imm % LAT_SLOTS
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
            recvs.top_up()
            if not events.finished and now >= next_check:
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
            "host": new.site.host,
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

    def _header(self, qpn: int) -> None:
        new = self.new
        say(
            header(
                "RDMA_Write Latency Test (MRC over mrcd): server",
                [
                    ("Device", new.site.device),
                    ("Client", f"h{new.req.remote_host} service {new.o.service}"),
                    ("Message size", server_size_text(new.hello.size, new.sweep)),
                    ("Verify", "ON (iteration stamps)" if new.hello.verify else "OFF"),
                    ("QPN", qpns_text([qpn], new.sweep)),
                ],
            )
        )


class LatServerTool:
    """The server of ``mrc-write-lat`` in the shared run loop (:mod:`.runloop`)."""

    prog = PROG
    kind = KIND_LAT

    def start(self, new: NewRun) -> LatServer:
        return LatServer(new)

    def show(self, o: Options, doc: Doc, docs: Sequence[Doc], sweep: bool) -> None:
        bad = f"; {doc['mismatches']} bad stamps" if doc["verify"] else ""
        if sweep:
            say(f" {doc['size']:<10} echoed {doc['iterations']} writes{bad}")
        else:
            say(f" echoed {doc['iterations']} writes of {doc['size']} bytes{bad}")

    def verified(self, docs: Sequence[Doc], sizes: str) -> str | None:
        return None

    def failure(self, doc: Doc) -> str:
        return f"{doc['mismatches']} writes landed with a wrong stamp"
