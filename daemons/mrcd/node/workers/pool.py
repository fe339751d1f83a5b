"""The daemon's side of its data-path workers: sockets, processes, and the QPs they carry.

:class:`WorkerPool` opens every plane's reuseport group itself, socket ``w`` of each plane
for worker ``w``, and attaches the steering program (:mod:`.datapath.steer`): the kernel
numbers a group's sockets in the order they joined, and because the daemon holds them all
for its whole life, a worker that dies and restarts gets the very same sockets back and the
numbering never shifts.  It stands in for the transport towards the node's parts: a QP's
connection is built in its worker (:meth:`WorkerPool.connect` returns a
:class:`~.remote.RemoteConnection`), the memory of its context follows it there (each
region's memfd, sent once per worker), its events come back and go to the node's fan-out.
The daemon sends its own probes on worker 0's sockets (sending needs no steering) and
gets the endpoint datagrams no worker owns from whichever worker received them.

A worker that dies fails its QPs at once (``ConnectionFailed`` naming it; each pending write
FLUSHED), is started again on the same sockets and takes new QPs; the other workers'
QPs carry on.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Literal

from mrcstack.core.config import ConnectionConfig
from mrcstack.core.events import Event
from mrcstack.core.memory import MemoryRegion
from mrcstack.daemons.lifecycle import process_cpu
from mrcstack.daemons.mrcd.config import MrcdConfig
from mrcstack.daemons.mrcd.datapath import steer
from mrcstack.daemons.mrcd.datapath.transport import (
    Address,
    Connectionless,
    Transport,
    TransportStats,
    open_plane_socket,
    send,
)
from mrcstack.daemons.mrcd.node.workers import messages as m
from mrcstack.daemons.mrcd.node.workers import process
from mrcstack.daemons.mrcd.node.workers.channel import Channel, pair
from mrcstack.daemons.mrcd.node.workers.remote import RemoteConnection
from mrcstack.daemons.mrcd.node.workers.shards import ShardedProbeIds
from mrcstack.errors import LocalError
from mrcstack.qpn import qpn_text
from mrcstack.wire import BTH_LEN, EvFormat, Opcode, probe_id

log = logging.getLogger("mrcd")

_ENDPOINT_RESPONSE = int(Opcode.ENDPOINT_RESPONSE)
#: Seconds a stopping worker gets to finish before it is killed; a starting one to be ready.
STOP_TIMEOUT = 2.0
START_TIMEOUT = 30.0
_COUNTERS = ("datagrams_in", "datagrams_out", "unknown_qpn", "malformed", "send_errors",
             "wrong_worker")  # fmt: skip


@dataclass(eq=False, slots=True)
class _Worker:
    """One worker process and what the daemon knows of it."""

    index: int
    process: BaseProcess
    channel: Channel[m.FromWorker, m.ToWorker]
    contexts: set[int] = field(default_factory=set)  # contexts whose regions it has
    qps: dict[int, RemoteConnection] = field(default_factory=dict)
    status: m.Status | None = None
    gone: bool = False
    ready: asyncio.Future[None] | None = None


class WorkerPool:
    """``cfg.workers`` data-path worker processes and the plane sockets they share.

    ``on_event(qpn, event)`` is the node's event fan-out (each QP's own, given at connect);
    ``connectionless`` the prober's receive; ``rtt(counts, total)`` merges a worker's RTT
    samples into the node's histogram (``bounds`` are its buckets); ``raw_socket(plane)``
    opens a plane's raw socket."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        cfg: MrcdConfig,
        addresses: list[Address],
        connectionless: Connectionless,
        rtt: Callable[[tuple[int, ...], float], None],
        bounds: tuple[float, ...],
        raw_socket: Callable[[int], socket.socket],
    ) -> None:
        self.loop = loop
        self.raw_socket = raw_socket
        self._raw_ok: set[int] = set()  # planes whose raw socket opened here
        self.cfg = cfg
        self.count = cfg.workers
        self.connectionless = connectionless
        self.rtt = rtt
        self.bounds = bounds
        #: The daemon's own probe ids: the residue no worker draws.
        self.probe_ids = ShardedProbeIds(self.count, self.count + 1)
        self.sockets: list[list[socket.socket]] = []  # [worker][plane]
        self.workers: list[_Worker] = []
        self.restarts = 0
        #: Counters of workers that died (added to the live ones: counters never go down).
        self._retired = TransportStats()
        self._retired_probes: dict[str, dict[str, int]] = {"answers": {}, "rejected": {}}
        #: CPU seconds of each worker index's processes that died (the counter carries on).
        self._retired_cpu = [0.0] * self.count
        self._keys: m.Keys | None = None  # what every worker, restarted ones too, is sent
        #: context -> rkey -> (its memfd, kept open for workers to come, the region).
        self._regions: dict[int, dict[int, tuple[int, m.AddRegion]]] = {}
        self._on_event: dict[int, Callable[[Event], None]] = {}
        self._where: dict[int, _Worker] = {}  # qpn -> its worker
        self._closed = False
        self._ctx = multiprocessing.get_context("spawn")
        self._open_sockets(addresses)

    # Start, stop, restart -----------------------------------------------------------------
    def _open_sockets(self, addresses: list[Address]) -> None:
        cfg = self.cfg
        self.sockets = [[] for _ in range(self.count)]
        try:
            for plane, address in enumerate(addresses):
                device = cfg.interfaces[plane] if cfg.bind_devices else None
                for w in range(self.count):
                    sock = open_plane_socket(address, device=device, reuseport=True)
                    self.sockets[w].append(sock)
                    if w == 0:
                        steer.attach(sock, self.count)
        except OSError:
            self._close_sockets()
            raise

    async def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start every worker (their sockets are open) and wait until each reads them."""
        for w in range(self.count):
            self.workers.append(self._spawn(w))
        waiting = [w.ready for w in self.workers if w.ready is not None]
        try:
            await asyncio.wait_for(asyncio.gather(*waiting), timeout)
        except TimeoutError:
            raise LocalError(f"data-path workers not ready within {timeout:g} s") from None

    def _spawn(self, index: int) -> _Worker:
        ours, theirs = pair()
        proc = self._ctx.Process(
            target=process.main,
            args=(m.Start(index, self.count, self.cfg, self.bounds), self.sockets[index], theirs),
            name=f"mrcd-worker-{index}",
            daemon=True,
        )
        try:
            proc.start()
        finally:
            theirs.close()
        box: list[_Worker] = []  # (the channel calls back with its worker)
        channel: Channel[m.FromWorker, m.ToWorker] = Channel(
            self.loop,
            ours,
            lambda msg, fds: self._on_message(box[0], msg, fds),
            lambda: self._lost(box[0]),
        )
        worker = _Worker(index, proc, channel, ready=self.loop.create_future())
        box.append(worker)
        if self._keys is not None:
            channel.send(self._keys)
        self.loop.add_reader(proc.sentinel, self._lost, worker)
        log.info("event=worker_started worker=%d pid=%s", index, proc.pid)
        return worker

    def _lost(self, worker: _Worker) -> None:
        """A worker's channel closed or its process ended: fail its QPs, start another."""
        if worker.gone:
            return
        worker.gone = True
        self.loop.remove_reader(worker.process.sentinel)
        worker.channel.close()
        if self._closed:
            return
        proc = worker.process
        if proc.pid is not None:  # (read before join reaps it)
            self._retired_cpu[worker.index] += process_cpu(proc.pid) or 0.0
        proc.join(0.5)
        code = proc.exitcode
        how = "still running" if code is None else (
            f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        )  # fmt: skip
        if code is None:
            proc.kill()
            proc.join(1.0)
        reason = f"data-path worker {worker.index} (pid {proc.pid}) died ({how})"
        if worker.ready is not None and not worker.ready.done():
            # It never started: starting it again would fail again.
            worker.ready.set_exception(LocalError(f"{reason} before it was ready"))
            worker.ready.exception()  # (start() reports it; a restarted one's is logged)
            log.error("event=worker_failed_to_start worker=%d how=%r", worker.index, how)
            return
        log.error("event=worker_died worker=%d pid=%s qps=%d how=%r",
                  worker.index, proc.pid, len(worker.qps), how)  # fmt: skip
        self._retire(worker)
        for qpn, conn in list(worker.qps.items()):
            self._where.pop(qpn, None)
            conn.worker_died(reason)
            on_event = self._on_event.get(qpn)
            while (event := conn.next_event()) is not None:
                if on_event is not None:
                    on_event(event)
        worker.qps.clear()
        self.restarts += 1
        self.workers[worker.index] = self._spawn(worker.index)

    def _retire(self, worker: _Worker) -> None:
        if worker.status is not None:
            for name in _COUNTERS:
                setattr(self._retired, name,
                        getattr(self._retired, name) + getattr(worker.status, name))  # fmt: skip
            _add(self._retired_probes["answers"], worker.status.probe_answers)
            _add(self._retired_probes["rejected"], worker.status.probe_rejected)
            worker.status = None

    def close(self) -> None:
        """Stop every worker (a moment to finish, then killed) and close the sockets."""
        self._closed = True
        for worker in self.workers:
            if not worker.gone:
                worker.channel.send(m.Stop())
        for worker in self.workers:
            worker.process.join(STOP_TIMEOUT)
            if worker.process.exitcode is None:
                worker.process.kill()
                worker.process.join(1.0)
            if not worker.gone:
                worker.gone = True
                self.loop.remove_reader(worker.process.sentinel)
                worker.channel.close()
        for regions in self._regions.values():
            for fd, _region in regions.values():
                os.close(fd)
        self._regions.clear()
        self._close_sockets()

    def _close_sockets(self) -> None:
        for socks in self.sockets:
            for sock in socks:
                sock.close()
        self.sockets = []

    # QPs ----------------------------------------------------------------------------------
    def worker_of(self, qpn: int) -> int:
        return steer.worker_of(qpn, self.count)

    def connect(
        self,
        qpn: int,
        ctx: int,
        config: ConnectionConfig,
        remote: int,
        seed: float,
        now: float,
        on_event: Callable[[Event], None],
    ) -> RemoteConnection:
        """Build QP ``qpn``'s connection in the worker that owns it, with its context's
        memory, and relay its events to ``on_event``."""
        worker = self.workers[self.worker_of(qpn)]
        if qpn in self._where:
            raise ValueError(f"QP {qpn_text(qpn)} already exists")
        if worker.gone:
            raise LocalError(f"data-path worker {worker.index} is down")
        send = worker.channel.send
        if ctx not in worker.contexts:
            worker.contexts.add(ctx)
            for fd, region in self._regions.get(ctx, {}).values():
                send(region, [fd])
        conn = RemoteConnection(qpn, worker.index, config, send)
        send(m.OpenQp(qpn, ctx, config, remote, seed, now))
        worker.qps[qpn] = conn
        self._where[qpn] = worker
        self._on_event[qpn] = on_event
        return conn

    def prepare(
        self, remote: int, paths: list[tuple[int, int]], fmt: EvFormat, striped: bool = False
    ) -> None:
        """Every worker resolves the paths of a connection that sends through raw sockets
        (a QP's worker is not known here).  Raises OSError here, as the transport does,
        when this process cannot open one (no CAP_NET_RAW): its workers could not either."""
        for plane in {plane for plane, _ev in paths} - self._raw_ok:
            self.raw_socket(plane).close()
            self._raw_ok.add(plane)
        for worker in self.workers:
            worker.channel.send(m.Prepare(remote, tuple(paths), fmt, striped))

    def remove(self, qpn: int) -> None:
        worker = self._where.pop(qpn, None)
        self._on_event.pop(qpn, None)
        if worker is not None:
            worker.qps.pop(qpn, None)
            worker.channel.send(m.CloseQp(qpn))

    def kick(self, qpn: int) -> None:
        """Nothing to do: a worker transmits after every message it carries out."""

    def qps_per_worker(self) -> tuple[int, ...]:
        """How many QPs each worker carries, by worker index."""
        return tuple(len(w.qps) for w in self.workers)

    def cpu_per_worker(self) -> tuple[float, ...]:
        """CPU seconds each worker index has used, its processes that died included."""
        out = []
        for w in self.workers:
            pid = w.process.pid
            now = None if w.gone or pid is None else process_cpu(pid)
            out.append(self._retired_cpu[w.index] + (now or 0.0))
        return tuple(out)

    def worker_index(self, qpn: int) -> int | None:
        """The worker carrying QP ``qpn`` (None: not connected)."""
        worker = self._where.get(qpn)
        return None if worker is None else worker.index

    # Memory -------------------------------------------------------------------------------
    def add_region(self, ctx: int, region: MemoryRegion, fd: int, writable: bool) -> None:
        """Context ``ctx`` registered ``region`` (its memfd ``fd``, which stays the caller's)."""
        record = m.AddRegion(ctx, region.rkey, region.va, region.length, int(region.access),
                             writable)  # fmt: skip
        kept = os.dup(fd)
        self._regions.setdefault(ctx, {})[region.rkey] = (kept, record)
        for worker in self.workers:
            if ctx in worker.contexts:
                worker.channel.send(record, [kept])

    def drop_region(self, ctx: int, rkey: int) -> None:
        entry = self._regions.get(ctx, {}).pop(rkey, None)
        if entry is None:
            return
        os.close(entry[0])
        for worker in self.workers:
            if ctx in worker.contexts:
                worker.channel.send(m.DropRegion(ctx, rkey))

    def forget_context(self, ctx: int) -> None:
        for rkey in list(self._regions.get(ctx, {})):
            self.drop_region(ctx, rkey)
        self._regions.pop(ctx, None)
        for worker in self.workers:
            worker.contexts.discard(ctx)

    # Probes -------------------------------------------------------------------------------
    def set_keys(self, local: int, keys: dict[int, bytes]) -> None:
        """The probe keys (as :meth:`Prober.set_keys`), for the workers' probers: every
        worker gets them, a restarted one too."""
        self._keys = m.Keys(local, tuple(keys.items()))
        for worker in self.workers:
            if not worker.gone:
                worker.channel.send(self._keys)

    def probe_counts(self, which: Literal["answers", "rejected"]) -> dict[str, int]:
        """The workers' probers' counts (``which``: ``"answers"`` by authentication or
        ``"rejected"`` by reason), summed, with those of workers that died."""
        total = dict(self._retired_probes[which])
        for worker in self.workers:
            status = worker.status
            if status is not None:
                _add(total, status.probe_answers if which == "answers" else status.probe_rejected)
        return total

    def send_raw(self, plane: int, data: bytes, addr: Address) -> bool:
        """Send one datagram outside any connection (probes) on worker 0's socket."""
        try:
            send(self.sockets[0][plane], data, addr)
        except OSError:
            self._retired.send_errors += 1
            return False
        self._retired.datagrams_out += 1
        return True

    # From the workers -----------------------------------------------------------------------
    def _on_message(self, worker: _Worker, msg: m.FromWorker, fds: list[int]) -> None:
        for fd in fds:  # (workers send none)
            os.close(fd)
        if type(msg) is m.Ready:
            if worker.ready is not None and not worker.ready.done():
                worker.ready.set_result(None)
        elif type(msg) is m.Events:
            for qpn, event in msg.batch:
                conn = worker.qps.get(qpn)
                on_event = self._on_event.get(qpn)
                if conn is not None and on_event is not None and conn.absorb(event):
                    on_event(event)
        elif type(msg) is m.Status:
            self._status(worker, msg)
        elif type(msg) is m.Connectionless:
            self._connectionless(msg)

    def _status(self, worker: _Worker, status: m.Status) -> None:
        worker.status = status
        for qs in status.qps:
            conn = worker.qps.get(qs.qpn)
            if conn is not None:
                conn.update(qs)
        if status.rtt_sum or any(status.rtt_counts):
            self.rtt(status.rtt_counts, status.rtt_sum)

    def _connectionless(self, msg: m.Connectionless) -> None:
        """An endpoint datagram its receiver did not own: a worker's probe answer goes to
        that worker, everything else to the daemon's prober."""
        data = msg.data
        if len(data) >= BTH_LEN and data[0] == _ENDPOINT_RESPONSE:
            owner = steer.probe_owner(probe_id(data), self.count)
            if owner < self.count:
                flow = msg.flow
                ev = msg.source[1] << 16 | flow & 0xFFFF
                self.workers[owner].channel.send(m.Endpoint(data, msg.plane, ev))
                return
        self.connectionless(memoryview(data), msg.source, msg.plane, msg.flow)

    @property
    def stats(self) -> TransportStats:
        """The workers' socket counters, summed (with those of workers that died)."""
        total = TransportStats(**{n: getattr(self._retired, n) for n in _COUNTERS})
        for worker in self.workers:
            if worker.status is not None:
                for name in _COUNTERS:
                    setattr(total, name, getattr(total, name) + getattr(worker.status, name))
        return total


def _add(total: dict[str, int], counts: tuple[tuple[str, int], ...]) -> None:
    for key, n in counts:
        total[key] = total.get(key, 0) + n


#: What carries a node's QPs: its own transport, or its data-path workers.
DataPath = Transport | WorkerPool
