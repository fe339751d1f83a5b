"""A data-path worker: its own process and loop, the transport for its shard of the QPs.

The daemon starts it (:mod:`.pool`) with one socket of each plane's reuseport group, the
ones the kernel hands the datagrams of QPs ``qpn % workers == index``, and a channel
(:mod:`.channel`).  Over the channel come its QPs' connection configs, their memory (each
region's memfd, mapped here too, so a write lands straight in the application's buffer),
the posts and the node's calls; back go the events, one batch per loop turn, a
:class:`~.messages.Status` every :data:`~.messages.STATUS_INTERVAL`, and the endpoint
datagrams that belong to someone else.

The EV probes that carry the ICRC (the QPs' own, which a receiving QP sends a few hundred
times a second under load) the worker that receives them answers itself, with a
:class:`~mrcstack.daemons.mrcd.datapath.probes.Prober` of its own: relayed, each cost the
daemon's process a message, a decode and a ``sendto``, and every worker's probes met in that
one process.  Sealed probes (answered with the port bitmap, which the daemon keeps, under
sequence numbers it alone draws), answers and port status updates still go to the daemon.

A separate process, not a thread: the sans-IO core is pure Python and holds the GIL all the
time it runs, so only processes put a second core to work.  ``multiprocessing`` starts it
(``spawn``: the daemon runs an event loop and must not fork) and hands it the sockets; after
that, one message channel per worker is all the two share, so a worker that dies takes
nothing of the daemon's with it.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import logging
import math
import mmap
import os
import random
import signal
import socket
from collections.abc import Callable
from typing import Any

import uvloop

from mrcstack.api.shm import map_shared
from mrcstack.core.connection import Connection
from mrcstack.core.events import Event, SendCompleted, WcStatus
from mrcstack.core.memory import Access, MemoryRegion, MemoryTable
from mrcstack.daemons import lifecycle
from mrcstack.daemons.mrcd.datapath.probes import Prober
from mrcstack.daemons.mrcd.datapath.transport import Address, Transport, open_raw_socket
from mrcstack.daemons.mrcd.node.addresses import Addresses
from mrcstack.daemons.mrcd.node.workers import messages as m
from mrcstack.daemons.mrcd.node.workers.channel import Channel
from mrcstack.daemons.mrcd.node.workers.shards import ShardedProbeIds
from mrcstack.errors import LocalError
from mrcstack.wire import BTH_LEN, Opcode

log = logging.getLogger("mrcd")

#: Events per message (one SEQPACKET packet each).
EVENT_BATCH = 1024
_ENDPOINT_REQUEST = int(Opcode.ENDPOINT_REQUEST)


def main(start: m.Start, sockets: list[socket.socket], chan: socket.socket) -> None:
    """The worker process's entry point (``multiprocessing.Process`` target): worker
    ``start.index`` on its plane ``sockets`` and its channel ``chan`` to the daemon."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon decides when we stop
    lifecycle.setup_logging("mrcd", start.cfg.log_level)
    uvloop.run(Worker(start, sockets, chan).run())


class Worker:
    """One worker's state: its connections, their contexts' memory, what it owes the daemon."""

    def __init__(self, start: m.Start, sockets: list[socket.socket], chan: socket.socket) -> None:
        self.index = start.index
        self.workers = start.workers
        self.cfg = start.cfg
        self.bounds = start.bounds
        self.sockets = sockets
        self.chan_socket = chan
        self.rtt_counts = [0] * (len(self.bounds) + 1)
        self.rtt_sum = 0.0
        self.addresses = Addresses(self.cfg)
        self.memory: dict[int, MemoryTable] = {}  # context -> its regions, mapped here
        self.conns: dict[int, Connection] = {}
        self.ctx_of: dict[int, int] = {}
        self.posts: dict[int, int] = {}
        self.events: list[tuple[int, Event]] = []
        self.done = asyncio.Event()
        self.transport: Transport | None = None
        self.prober: Prober | None = None
        self.channel: Channel[m.ToWorker, m.FromWorker] | None = None
        self.handlers: dict[type, Callable[[Any, list[int]], None]] = {
            m.OpenQp: self._open,
            m.Prepare: self._prepare,
            m.CloseQp: self._close_qp,
            m.AddRegion: self._add_region,
            m.DropRegion: self._drop_region,
            m.Post: self._post,
            m.Call: self._call,
            m.Endpoint: self._endpoint,
            m.Keys: self._keys,
            m.Stop: self._stop,
        }

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        transport = Transport(
            loop, self.sockets, self.addresses.route, self._connectionless, self._raw
        )
        transport.shard, transport.shards = self.index, self.workers
        transport.probe_ids = ShardedProbeIds(self.index, self.workers + 1, random.Random())
        self.transport = transport
        self.prober = Prober(
            loop,
            self.addresses.resolve,
            self.addresses.host_of,
            transport.send_raw,
            lambda: 0,  # (it answers no sealed probe: no port bitmap)
            icrc_paths=self.addresses.icrc_paths,
            relay=self._to_daemon,
        )
        self.channel = Channel(loop, self.chan_socket, self._on_message, self.done.set)
        lifecycle.settle()
        self.channel.send(m.Ready(os.getpid()))
        status = loop.call_later(m.STATUS_INTERVAL, self._status)
        self._status_timer = status
        try:
            await self.done.wait()
        finally:
            self._status_timer.cancel()
            transport.close()
            self.channel.close()
            for sock in self.sockets:
                sock.close()

    def _raw(self, plane: int) -> socket.socket:
        return open_raw_socket(self.cfg.interfaces[plane] if self.cfg.bind_devices else None)

    # From the daemon ----------------------------------------------------------------------
    def _on_message(self, message: m.ToWorker, fds: list[int]) -> None:
        try:
            self.handlers[type(message)](message, fds)
        except (LocalError, OSError) as exc:  # the daemon checked it: log, carry on
            log.error("event=worker_refused worker=%d message=%s error=%r",
                      self.index, type(message).__name__, str(exc))  # fmt: skip
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _open(self, msg: m.OpenQp, _fds: list[int]) -> None:
        assert self.transport is not None
        memory = self.memory.setdefault(msg.ctx, MemoryTable())
        conn = Connection(msg.config, memory=memory, rng=random.Random(msg.seed), now=msg.now)
        conn.on_rtt = self._rtt
        self.transport.add(msg.qpn, conn, msg.remote, functools.partial(self._event, msg.qpn))
        self.conns[msg.qpn] = conn
        self.ctx_of[msg.qpn] = msg.ctx
        self.posts[msg.qpn] = 0

    def _prepare(self, msg: m.Prepare, _fds: list[int]) -> None:
        assert self.transport is not None
        self.transport.prepare(msg.remote, list(msg.paths), msg.fmt, msg.striped)

    def _close_qp(self, msg: m.CloseQp, _fds: list[int]) -> None:
        assert self.transport is not None
        self.transport.remove(msg.qpn)
        self.conns.pop(msg.qpn, None)
        self.ctx_of.pop(msg.qpn, None)
        self.posts.pop(msg.qpn, None)

    def _add_region(self, msg: m.AddRegion, fds: list[int]) -> None:
        if len(fds) != 1:
            raise LocalError(f"region {msg.rkey:#x} came without its memfd")
        mapping: mmap.mmap = map_shared(fds[0], msg.length, msg.writable)
        memory = self.memory.setdefault(msg.ctx, MemoryTable())
        memory.register(memoryview(mapping), Access(msg.access), rkey=msg.rkey, va=msg.va)

    def _drop_region(self, msg: m.DropRegion, _fds: list[int]) -> None:
        memory = self.memory.get(msg.ctx)
        if memory is not None:
            memory.deregister(msg.rkey)

    def _post(self, msg: m.Post, _fds: list[int]) -> None:
        assert self.transport is not None
        conn = self.conns.get(msg.qpn)
        if conn is None:
            return
        self.posts[msg.qpn] += 1
        try:
            if conn.failed is None:
                region = _region_at(self.memory[self.ctx_of[msg.qpn]], msg.local_va, msg.length)
                start = msg.local_va - region.va
                local = region.buffer[start : start + msg.length]
                conn.post_write(msg.wr_id, local, msg.remote_va, msg.rkey, imm=msg.imm, now=msg.now)
                return
        except LocalError as exc:  # (the daemon checked it): the QP fails, nothing hangs
            conn.abort(f"data-path worker {self.index} refused a write: {exc}")
        finally:
            self.transport.kick(msg.qpn)
        # Failed before the post got here: flushed, as verbs do.
        self._event(msg.qpn, SendCompleted(msg.wr_id, WcStatus.FLUSHED, 0))

    def _call(self, msg: m.Call, _fds: list[int]) -> None:
        assert self.transport is not None
        conn = self.conns.get(msg.qpn)
        if conn is None:
            return
        _CALLS[msg.op](conn, *msg.args)
        self.transport.kick(msg.qpn)

    def _endpoint(self, msg: m.Endpoint, _fds: list[int]) -> None:
        assert self.transport is not None
        self.transport.deliver_endpoint(msg.data, msg.plane, msg.ev)

    def _keys(self, msg: m.Keys, _fds: list[int]) -> None:
        assert self.prober is not None
        self.prober.set_keys(msg.local, dict(msg.keys))

    def _stop(self, _msg: m.Stop, _fds: list[int]) -> None:
        self.done.set()

    # To the daemon --------------------------------------------------------------------------
    def _event(self, qpn: int, event: Event) -> None:
        if not self.events:
            asyncio.get_running_loop().call_soon(self._send_events)
        self.events.append((qpn, event))

    def _send_events(self) -> None:
        events, self.events = self.events, []
        assert self.channel is not None
        for i in range(0, len(events), EVENT_BATCH):
            self.channel.send(m.Events(tuple(events[i : i + EVENT_BATCH])))

    def _connectionless(self, data: memoryview, source: Address, plane: int, flow: int) -> None:
        """An endpoint datagram for none of our QPs: an EV probe with the ICRC is answered
        here, the rest goes to the daemon."""
        assert self.prober is not None
        if len(data) > BTH_LEN and data[0] == _ENDPOINT_REQUEST:
            self.prober.on_datagram(data, source, plane, flow)
        else:
            self._to_daemon(data, source, plane, flow)

    def _to_daemon(self, data: memoryview, source: Address, plane: int, flow: int) -> None:
        assert self.channel is not None
        self.channel.send(m.Connectionless(bytes(data), source, plane, flow))

    def _rtt(self, seconds: float) -> None:
        if not math.isnan(seconds):
            seconds = max(seconds, 0.0)
            self.rtt_counts[bisect.bisect_left(self.bounds, seconds)] += 1
            self.rtt_sum += seconds

    def _status(self) -> None:
        transport, channel, prober = self.transport, self.channel, self.prober
        assert transport is not None and channel is not None and prober is not None
        self._status_timer = asyncio.get_running_loop().call_later(m.STATUS_INTERVAL, self._status)
        st = transport.stats
        channel.send(
            m.Status(
                qps=tuple(
                    m.QpStatus(
                        qpn=qpn,
                        stats=conn.stats,
                        evs=conn.ev_states(),
                        rto=conn.recovery.rto(),
                        srtt=conn.recovery.srtt,
                        retry_budget=conn.retry_budget(),
                        window=conn.window(),
                        idle=conn.idle,
                        posts=self.posts[qpn],
                    )
                    for qpn, conn in self.conns.items()
                ),
                datagrams_in=st.datagrams_in,
                datagrams_out=st.datagrams_out,
                unknown_qpn=st.unknown_qpn,
                malformed=st.malformed,
                send_errors=st.send_errors,
                wrong_worker=st.wrong_worker,
                rtt_counts=tuple(self.rtt_counts),
                rtt_sum=self.rtt_sum,
                probe_answers=tuple((a.value, n) for a, n in prober.answers.items()),
                probe_rejected=tuple(prober.rejected.items()),
            )
        )
        self.rtt_counts = [0] * len(self.rtt_counts)
        self.rtt_sum = 0.0


def _region_at(memory: MemoryTable, va: int, length: int) -> MemoryRegion:
    for region in memory.regions():
        if region.contains(va, length):
            return region
    raise LocalError(f"no region holds {va:#x}+{length}")


_CALLS: dict[m.Op, Callable[..., object]] = {
    m.Op.ABORT: Connection.abort,
    m.Op.PEER_GONE: Connection.peer_gone,
    m.Op.SET_PORT_STATE: Connection.set_port_state,
    m.Op.SET_PEER_PORTS: Connection.set_peer_ports,
    m.Op.DENY_EVS: lambda conn, values, now, reason: conn.deny_evs(values, now=now, reason=reason),
    m.Op.ALLOW_EVS: lambda conn, values, now, reason: conn.allow_evs(
        values, now=now, reason=reason
    ),
    m.Op.SET_EV_MIN_ACTIVE: Connection.set_ev_min_active,
}
