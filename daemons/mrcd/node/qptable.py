"""The QP table: contexts (protection domains with their memory), their QPs, and what the
controller API reads of them.

A QP is created in RESET inside a context; :mod:`.connect` puts it on the wire (RTS); it
ends in ERROR when its connection fails (the core's retry budget, the peer watch, or this
side's :meth:`QpTable.abort`) and is gone when its owner destroys it or its context closes.
Every event a failure produces goes through the node's event fan-out, as the transport's do.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from mrcstack.api.limits import QPN_LIMIT
from mrcstack.core.connection import Connection
from mrcstack.core.endpoint import ENDPOINT_QPN
from mrcstack.core.events import Event
from mrcstack.core.memory import Access, MemoryRegion
from mrcstack.daemons.mrcd.datapath import steer
from mrcstack.daemons.mrcd.datapath.transport import clock
from mrcstack.daemons.mrcd.node.listeners import Listeners
from mrcstack.daemons.mrcd.node.qps import Context, Qp, QpAttrs, QpConnection, QpState
from mrcstack.daemons.mrcd.node.snapshot import Totals
from mrcstack.daemons.mrcd.node.workers.pool import DataPath, WorkerPool
from mrcstack.daemons.mrcd.node.workers.remote import RemoteConnection
from mrcstack.errors import LocalError
from mrcstack.fabric import Fabric
from mrcstack.qpn import qpn_text

OnEvent = Callable[[int, Event], None]


class Running(Protocol):
    """What the table reads of its node as it runs (:class:`.node.Node`)."""

    transport: DataPath | None

    def running_transport(self) -> DataPath: ...

    def check_running(self) -> None: ...


@dataclass(eq=False, slots=True)
class QpTable:
    """Contexts and QPs of one node; ``on_event`` is the node's event fan-out and
    ``retired`` keeps the counters of destroyed connections (counters never go down);
    ``workers``: the data-path workers, QP ``qpn`` is worker ``qpn % workers``'s."""

    node: Running
    qps: dict[int, Qp]
    rng: random.Random  # QPNs, first PSNs, each connection's seed
    listeners: Listeners
    on_event: OnEvent
    retired: Totals
    workers: int = 1
    contexts: dict[int, Context] = field(default_factory=dict, init=False)
    _next_ctx: int = field(default=1, init=False)

    # Contexts and memory ----------------------------------------------------------------
    def open_context(self) -> Context:
        ctx = Context(self._next_ctx)
        self._next_ctx += 1
        self.contexts[ctx.ident] = ctx
        return ctx

    def close_context(self, ctx: Context) -> None:
        for qpn in list(ctx.qpns):
            self.destroy_qp(qpn, reason="context closed")
        self.listeners.forget(ctx)
        for region in ctx.memory.regions():
            ctx.memory.deregister(region.rkey)
        pool = self._pool()
        if pool is not None:
            pool.forget_context(ctx.ident)
        self.contexts.pop(ctx.ident, None)

    def register(
        self, ctx: Context, buffer: memoryview, access: Access, fd: int | None = None
    ) -> MemoryRegion:
        """Register ``buffer`` (mapped from the memfd ``fd``, which data-path workers map
        too; without workers it is not needed)."""
        region = ctx.memory.register(buffer, access)
        pool = self._pool()
        if pool is not None:
            if fd is None:
                ctx.memory.deregister(region.rkey)
                raise LocalError("with data-path workers a region needs its memfd")
            pool.add_region(ctx.ident, region, fd, writable=not buffer.readonly)
        return region

    def deregister(self, ctx: Context, rkey: int) -> None:
        ctx.memory.deregister(rkey)
        pool = self._pool()
        if pool is not None:
            pool.drop_region(ctx.ident, rkey)

    def _pool(self) -> WorkerPool | None:
        transport = self.node.transport
        return transport if isinstance(transport, WorkerPool) else None

    # QPs --------------------------------------------------------------------------------
    def create_qp(self, ctx: Context, attrs: QpAttrs, on_event: OnEvent) -> int:
        if ctx.ident not in self.contexts:
            raise LocalError("context is closed")
        self.node.check_running()
        n = self.workers
        # With workers, the one with the fewest QPs takes it (lowest index on a tie).
        worker = min(range(n), key=lambda w: (sum(1 for q in self.qps if q % n == w), w))
        while True:
            qpn = self.rng.randrange(1, QPN_LIMIT)
            if n > 1:
                qpn += worker - steer.worker_of(qpn, n)
            # (QP 2 is the endpoint's)
            if 0 < qpn < QPN_LIMIT and qpn not in self.qps and qpn != ENDPOINT_QPN:
                break
        self.qps[qpn] = Qp(qpn, ctx, attrs, on_event, psn=self.rng.randrange(QPN_LIMIT))
        ctx.qpns.add(qpn)
        return qpn

    def qp(self, qpn: int) -> Qp:
        qp = self.qps.get(qpn)
        if qp is None:
            raise LocalError(f"no QP {qpn_text(qpn)}")
        return qp

    def post_write(
        self,
        qpn: int,
        wr_id: int,
        local: memoryview,
        remote_va: int,
        rkey: int,
        imm: int | None,
        label: int | None = None,
        local_va: int | None = None,
    ) -> None:
        """Post a write; ``label``: the application's own wr_id, which error texts name
        (``wr_id`` is the node's, unique per QP); ``local_va``: where ``local`` starts in
        the context's registered memory (how a data-path worker finds it)."""
        qp = self.qp(qpn)
        conn = qp.conn
        if conn is None or qp.state is not QpState.RTS:
            raise LocalError(f"QP {qpn_text(qpn)} is not connected ({qp.state.value})")
        node = self.node
        node.check_running()
        now = clock()
        if type(conn) is RemoteConnection:
            if local_va is None:
                raise LocalError("a data-path worker's QP needs the write's local address")
            conn.post_remote(wr_id, local_va, len(local), remote_va, rkey, imm=imm, now=now)
        elif isinstance(conn, Connection):
            conn.post_write(wr_id, local, remote_va, rkey, imm=imm, now=now)
        qp.posted[wr_id] = now
        if label is not None:
            qp.labels[wr_id] = label
        node.running_transport().kick(qpn)

    def destroy_qp(self, qpn: int, reason: str = "destroyed") -> None:
        """Pending writes complete FLUSHED (the owner hears each once), then the QP goes."""
        qp = self.qps.get(qpn)
        if qp is None:
            return
        self.abort(qpn, qp, reason)
        del self.qps[qpn]
        qp.ctx.qpns.discard(qpn)
        if qp.conn is not None:
            transport = self.node.transport
            if transport is not None:
                transport.remove(qpn)
            self.retired.add(qp.conn.stats)

    # Failing connections from this side ----------------------------------------------------
    def abort(self, qpn: int, qp: Qp, reason: str) -> None:
        """Fail a connection from this side, delivering what it has to say at once
        (completions, ConnectionFailed) through the same path as the transport does."""
        conn = qp.conn
        if conn is None:
            qp.state, qp.failure = QpState.ERROR, reason
            return
        if conn.failed is None:
            qp.state, qp.failure = QpState.ERROR, reason  # ours: not logged as a failure
            conn.abort(reason)
        self._deliver(qpn, conn)

    def fail_all(self, reason: str) -> int:
        """Fail every live connection from this side: each pending write completes with
        FLUSHED and each owner hears ConnectionFailed (the QPs stay, in the error state,
        until their owners destroy them).  Returns how many writes were flushed."""
        flushed = self.writes_in_flight()
        for qpn, qp in list(self.qps.items()):
            self.abort(qpn, qp, reason)
        return flushed

    def fail_peer(self, host: int, reason: str, qpns: list[int] | None = None) -> int:
        """The peer ``host`` is gone: fail our live QPs to it (or those of ``qpns``) now,
        as an exhausted retry budget would; returns how many failed."""
        failed = 0
        for qpn, qp in list(self.qps.items()):
            conn = qp.conn
            if (
                conn is None
                or qp.remote_host != host
                or conn.failed is not None
                or (qpns is not None and qpn not in qpns)
            ):
                continue
            conn.peer_gone(reason)
            failed += 1
            self._deliver(qpn, conn)
        return failed

    def _deliver(self, qpn: int, conn: QpConnection) -> None:
        while (event := conn.next_event()) is not None:
            self.on_event(qpn, event)

    # What the controller API and the metrics read ------------------------------------------
    def writes_in_flight(self) -> int:
        """Writes posted and not completed yet, over every QP."""
        return sum(len(qp.posted) for qp in self.qps.values())

    def connections(self) -> list[QpConnection]:
        return [qp.conn for qp in self.qps.values() if qp.conn is not None]

    def retry_budget(self) -> float:
        """The longest retry budget of a live QP (0.0 with none)."""
        live = [qp.conn for qp in self.qps.values() if qp.state is QpState.RTS and qp.conn]
        return max((conn.retry_budget() for conn in live), default=0.0)

    def ev_states(self, qpn: int | None = None) -> list[dict[str, object]]:
        """Each EV of each QP (or one): plane, state, in use, drops (``mrcctl ev states``)."""
        out: list[dict[str, object]] = []
        for q, qp in sorted(self.qps.items()):
            if (qpn is not None and q != qpn) or qp.conn is None:
                continue
            for ev in qp.conn.ev_states():
                out.append(
                    {
                        "qpn": q,
                        "ev": ev.value,
                        "plane": ev.port,
                        "state": ev.state.value,
                        "in_use": ev.in_use,
                        "drop_count": ev.drop_count,
                    }
                )
        return out

    def qp_info(self, qpn: int | None = None) -> list[dict[str, object]]:
        """Each QP (or one) with its peer, state and retry budget (``mrcctl qp show``)."""
        out: list[dict[str, object]] = []
        for q, qp in sorted(self.qps.items()):
            if qpn is not None and q != qpn:
                continue
            conn = qp.conn
            doc: dict[str, object] = {
                "qpn": q,
                "state": qp.state.value,
                "remote_host": Fabric.host_name(qp.remote_host) if qp.remote_host >= 0 else None,
                "remote_qpn": qp.remote_qpn if qp.remote_qpn >= 0 else None,
                "peer_instance": qp.peer_instance or None,
                "failure": qp.failure,
                "writes_in_flight": len(qp.posted),
                "timeout": qp.attrs.timeout,
                "linear_cnt": qp.attrs.linear_cnt,
                "exp_cnt": qp.attrs.exp_cnt,
                "psn": qp.psn,
                "extensions": None if conn is None else not conn.plain,
                "worker": steer.worker_of(q, self.workers),
            }
            if conn is not None:
                cwnd, in_flight = conn.window()
                doc.update(
                    cwnd=cwnd,
                    in_flight=in_flight,
                    max_rto=conn.cfg.max_rto,
                    ack_delay=conn.cfg.ack_delay,  # (0 unless the peer flags a full window)
                    rto=conn.recovery.rto(),
                    srtt=conn.recovery.srtt,
                    retry_budget=conn.retry_budget(),
                )
            out.append(doc)
        return out
