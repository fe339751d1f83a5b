"""Scenario in, result out: wire MRC connections to the simulated fabric and run a transfer.

Each flow is one connection (a QP at each end).  The sender posts RDMA WRITEs of
``wr_size`` (default :data:`DEFAULT_WR_SIZE`), each with an immediate.  Memory stays flat
whatever the flow size: a write's content is derived from its flow and offset (a seeded
filler, and a header of flow and offset in every 4 KiB block, so a misplaced block shows,
see :mod:`.content`); the sender fills a ring of a few work requests
(:data:`RING_BYTES`) when it posts, and a slot is posted again only once its write
completed; the receiver's memory is a :class:`~.content.CheckingSink` as large as the flow
that stores nothing and checks every packet as it is placed, each byte exactly once.
A flow is done when the sender saw every SendCompleted and the receiver every immediate.
The adapter is the usual sans-IO loop: after any input, drain events, transmit
``datagrams_to_send``, re-arm one timer.  Each host's NIC pulls data packets only as its
ports drain (:data:`NIC_PACKETS_PER_PORT` queued per port at most), serving waiting
connections round robin, as a hardware NIC's scheduler does: a packet is sent, and its
timers start, when it leaves, so a host running many connections does not queue all their
windows in its NIC and time them out there.

Packets travel decoded: connections hand them over with ``packets_to_send`` and take them
with ``receive_packet``, so no packet is ever encoded, checksummed and parsed again (that
was about 40% of the run time).  ``run(cfg, wire=True)`` encodes every packet and decodes it at
its destination as a real network would; it gives the same result, which a test checks.

All randomness comes from ``random.Random`` instances derived from ``SimConfig.seed``, and
time is virtual, so a configuration always produces the same :class:`SimResult`.

The scenario (:class:`SimConfig`, the fault windows) lives in :mod:`.config` and the result
types and their JSON form in :mod:`.result`; both are re-exported here.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from typing import Any

from mrcstack.core.config import ConnectionConfig
from mrcstack.core.connection import Connection
from mrcstack.core.endpoint import ENDPOINT_QPN, ProbeIds
from mrcstack.core.events import (
    ConnectionFailed,
    Event,
    EvStateChanged,
    PortStateChanged,
    SendCompleted,
    WcStatus,
    WriteImmReceived,
)
from mrcstack.core.memory import MemoryTable
from mrcstack.sim.config import (
    DATA_PACKET_OVERHEAD_BYTES,
    DEFAULT_BYTES,
    DEFAULT_EV_COUNT,
    DEFAULT_MAX_SIM_TIME_S,
    DEFAULT_MTU_PAYLOAD,
    MAX_EV_COUNT,
    MAX_TIMELINE_BINS,
    FlowSpec,
    LinkFailure,
    LossChange,
    MapperSpec,
    NicDown,
    PlaneFailure,
    SimConfig,
    SwitchFailure,
    Window,
    ev_profile,
)
from mrcstack.sim.content import CheckingSink, FlowContent
from mrcstack.sim.engine import Engine
from mrcstack.sim.network import WIRE_OVERHEAD_BYTES, Link, Network
from mrcstack.sim.probing import Sender, SimMapper
from mrcstack.sim.result import (
    JSON_FLOAT_DIGITS,
    EvRecord,
    FlowResult,
    GroupResult,
    PortRecord,
    SimResult,
    TimelineBin,
    sum_counts,
)
from mrcstack.stats import Method, quantile
from mrcstack.wire import (
    DataPacket,
    Opcode,
    ProbeReplyPacket,
    encode,
    encoded_length,
    peek_qpn,
    probe_id,
    trim,
)

#: What answers an EV probe, as a packet and as a datagram's opcode.
_REPLIES = frozenset({ProbeReplyPacket, int(Opcode.ENDPOINT_RESPONSE)})

__all__ = [
    "DATA_PACKET_OVERHEAD_BYTES",
    "DEFAULT_BYTES",
    "DEFAULT_EV_COUNT",
    "DEFAULT_MAX_SIM_TIME_S",
    "DEFAULT_MTU_PAYLOAD",
    "JSON_FLOAT_DIGITS",
    "MAX_EVENTS_LISTED",
    "MAX_EV_COUNT",
    "MAX_LATENCY_SAMPLES",
    "MAX_TIMELINE_BINS",
    "MAX_TIMER_SPINS",
    "QPN_BASE",
    "ConnectionFactory",
    "EvRecord",
    "FlowResult",
    "FlowSpec",
    "GroupResult",
    "LinkFailure",
    "LossChange",
    "NicDown",
    "PlaneFailure",
    "PortRecord",
    "SimConfig",
    "SimError",
    "SimResult",
    "SwitchFailure",
    "TimelineBin",
    "Window",
    "ev_profile",
    "run",
]

#: QPNs: flow i uses QPN_BASE + 2i at the sender and QPN_BASE + 2i + 1 at the receiver.
QPN_BASE = 0x100
#: A timer that keeps firing at one instant without the core moving it means a core bug.
MAX_TIMER_SPINS = 10_000
#: Cap on the EV / port event lists in a result (the counts stay exact).
MAX_EVENTS_LISTED = 1000
#: Cap on each flow's per-packet latency samples.
MAX_LATENCY_SAMPLES = 100_000
#: Full data packets a host NIC holds per port before it stops pulling from connections.
NIC_PACKETS_PER_PORT = 2


#: Builds one endpoint's connection; the benchmark passes one that times the core.
ConnectionFactory = Callable[[ConnectionConfig, MemoryTable, random.Random], Connection]


class SimError(RuntimeError):
    """The simulated core misbehaved (e.g. a timer that never moves)."""


def _real_connection(
    config: ConnectionConfig, memory: MemoryTable, rng: random.Random
) -> Connection:
    return Connection(config, memory=memory, rng=rng, now=0.0)


# The adapter ----------------------------------------------------------------------------
#: Work-request size when the scenario sets none.
DEFAULT_WR_SIZE = 1 << 20
#: The sender's ring of work-request buffers, per flow (at least two work requests).
RING_BYTES = 8 << 20


class _Flow:
    """One transfer and the bookkeeping that decides whether it completed correctly."""

    def __init__(self, index: int, spec: FlowSpec, cfg: SimConfig, rng: random.Random) -> None:
        self.index, self.src, self.dst = index, spec.src, spec.dst
        self.spec = spec
        self.probe = index in cfg.latency_flows  # one small write in flight, each timed
        if self.probe:
            self.size = cfg.latency_writes * cfg.latency_write_bytes
            self.wr_size = cfg.latency_write_bytes
        else:
            self.size = spec.bytes or cfg.bytes_per_flow
            self.wr_size = min(cfg.wr_size or DEFAULT_WR_SIZE, self.size)
        self.waiting = len(set(spec.after))  # prerequisite flows not yet complete
        self.dependents: list[_Flow] = []
        self.started_at: float | None = None
        profile = ev_profile(cfg, spec.src, spec.dst, spec=spec)
        planes = len({e.port for e in profile})
        self.ideal_s = cfg.ideal_fct(spec.src, spec.dst, self.size, planes)
        self.latency_every = cfg.packet_latency_every
        self.latency_count = 0
        self.packet_latency: list[float] = []
        self.nwrs = -(-self.size // self.wr_size)
        self.slots = 1 if self.probe else min(self.nwrs, max(2, RING_BYTES // self.wr_size))
        self.posted_at: list[float] = []  # probes: when each write was posted
        self.latency: list[float] = []  # probes: each write's post-to-completion time
        self.source = bytearray(self.slots * self.wr_size)
        self.content = FlowContent(index, rng)
        # The receiver's memory: as large as the flow, holding nothing, checking each write.
        self.sink = CheckingSink(self.content, self.size, cfg.mtu_payload)
        self.posted = 0  # work requests posted so far
        self.plane_bytes = [0] * cfg.fabric.planes
        self.completed = 0  # SendCompleted seen, all SUCCESS and in order while intact
        self.completions_ok = True
        self.bytes_done = 0
        self.imms = 0  # immediates seen, each checked against the sink
        self.content_ok = True
        self.failed: str | None = None
        self.done_at: float | None = None
        self.arrived_at: float | None = None  # the receiver's last immediate
        self.failed_at: float | None = None  # when ``failed`` was first set
        self.finished = False
        self.ends: list[_Endpoint] = []  # sender, receiver

    def complete(self) -> bool:
        return self.done_at is not None

    def wr(self, k: int) -> tuple[int, int, int]:
        """Work request ``k``: its offset in the flow, length, and ring slot offset."""
        offset = k * self.wr_size
        return offset, min(self.wr_size, self.size - offset), k % self.slots * self.wr_size

    def check_placed(self, k: int, imm: int) -> None:
        """The receiver says write ``k`` (and every earlier one) is placed: it must be, each
        byte once and as the sender made it (the sink checked every write on arrival)."""
        offset, length, _ = self.wr(k)
        if imm != k & 0xFFFF_FFFF or not self.sink.intact_below(offset + length):
            self.content_ok = False

    def verified(self) -> bool:
        return (
            self.complete()
            and self.failed is None
            and self.completions_ok
            and self.completed == self.nwrs
            and self.imms == self.nwrs
            and self.content_ok
            and self.sink.intact_below(self.size)
        )

    def result(self) -> FlowResult:
        tx, rx = (end.conn.stats for end in self.ends)
        time = self.done_at
        fct = None if time is None or self.started_at is None else time - self.started_at
        return FlowResult(
            index=self.index,
            src=self.src,
            dst=self.dst,
            bytes=self.size,
            work_requests=self.nwrs,
            complete=self.complete(),
            verified=self.verified(),
            completion_time_s=time,
            goodput_bps=self.size * 8 / fct if fct else 0.0,
            group=self.spec.group,
            start_time_s=self.started_at,
            fct_s=fct,
            ideal_fct_s=self.ideal_s,
            slowdown=fct / self.ideal_s if fct is not None else None,
            packet_latency_s=tuple(self.packet_latency),
            arrival_time_s=self.arrived_at,
            failed=self.failed,
            failure_time_s=self.failed_at,
            retransmissions=sum_counts([tx.retransmissions, rx.retransmissions]),
            spurious_retransmissions=tx.spurious_retransmissions + rx.spurious_retransmissions,
            tlp_unneeded=tx.tlp_unneeded + rx.tlp_unneeded,
            nacks_received=dict(sorted(tx.nacks_received.items())),
            trims_received=rx.trims_received,
            ecn_echoes=tx.ecn_echoes,
            write_latency_s=tuple(self.latency),
            per_plane_bytes=tuple(self.plane_bytes),
        )


class _Endpoint:
    """One connection on one host, its adapter loop and its single armed timer."""

    def __init__(self, sim: _Simulation, flow: _Flow, conn: Connection, sender: bool) -> None:
        self.sim = sim
        self.flow = flow
        self.conn = conn
        self.sender = sender
        self.side = "sender" if sender else "receiver"
        self.host, self.peer = (flow.src, flow.dst) if sender else (flow.dst, flow.src)
        self.qpn = conn.cfg.local_qpn
        # The connection's deadline as last read (None: no timer), and the heap event
        # standing for it: ``armed_at``, the time of the one live timer event (None: none
        # pending), which is never later than ``timer_at``.  A deadline that moves later
        # (the tail-loss probe's does on every ACK) is not pushed at once: the armed event
        # pushes it when it fires, under the key ``timer_key`` it was given when it moved,
        # so every event runs in exactly the order it would if each move were pushed (and
        # the heap does not fill with timer events that would fire only to find
        # themselves stale).
        self.timer_at: float | None = None
        self.timer_key = 0
        self.armed_at: float | None = None
        self.timer_gen = 0
        self.spin_at = -1.0
        self.spins = 0
        self.placed = 0
        self.nic_sent = False  # waiting for the NIC: had it sent something when it waited
        self.uplinks: list[Link] = []  # its host's NIC ports, one link per plane (set later)
        self.sink = None if sender else flow.sink
        # Per-packet latency samples are the receiver's to take, when asked for.
        self.latency_every = 0 if sender else flow.latency_every
        self._on_timer_cb = self._on_timer
        while conn.next_event() is not None:
            pass  # connection setup (the initial EV activations) is not a state change

    def receive(self, msg: Any, size: int, plane: int, ecn: bool) -> None:
        sim = self.sim
        if not sim.wire and msg.qpn not in (self.qpn, ENDPOINT_QPN):
            sim.unknown_qpn += 1  # (attached alone to its host: the host's table is not asked)
            return
        now = sim.engine.now
        if self.latency_every:
            latency = sim.net.delivered_latency
            if latency is not None:
                flow = self.flow
                flow.latency_count += 1
                if (
                    flow.latency_count % flow.latency_every == 0
                    and len(flow.packet_latency) < MAX_LATENCY_SAMPLES
                ):
                    flow.packet_latency.append(latency)
        if sim.wire:
            self.conn.receive_datagram(msg, now=now, port=plane, ecn=ecn)
        else:
            self.conn.receive_packet(msg, size, now=now, port=plane, ecn=ecn)
        sink = self.sink
        if sink is not None:
            if sink.pending is not None:
                sink.check()  # the write this datagram placed
            if sim.series is not None:
                placed = self.conn.stats.data_bytes_placed
                if placed != self.placed:
                    sim.series_add(self.flow.index, now, placed - self.placed)
                    self.placed = placed
        self.pump()

    def pump(self) -> None:
        """After any input: drain events, transmit, drain again, re-arm the one timer.

        The host's NIC pulls data: only as many data packets as its ports can take now
        (:meth:`_Simulation.nic_room`) leave the connection; the rest wait in it, unsent,
        and the NIC pumps again when its ports drain.  Control packets always go."""
        sim = self.sim
        now = sim.engine.now
        conn = self.conn
        events = conn.events
        if events:
            self._drain(now)
        send = sim.send_packet
        host, peer = self.host, self.peer
        if sim.wire:
            self._pump_wire(now)
        elif self.sender:
            per_plane = self.flow.plane_bytes
            backlog = 0.0  # sim.nic_room(host, now), inline: once per sender pump
            for link in self.uplinks:
                busy = link.busy_until
                if busy > now:
                    backlog += (busy - now) * link.bytes_per_s
            room = int((sim.nic_window - backlog) // sim.nic_packet)
            if room < 0:
                room = 0
            sent = 0
            for pkt, size in conn.packets_to_send(now, data_limit=room):
                port = pkt.port
                per_plane[port] += size
                if type(pkt) is DataPacket:
                    sent += 1
                    send(host, peer, port, pkt.ev, pkt, size, True)
                else:
                    send(host, peer, port, pkt.ev, pkt, size, False)
            if sent >= room:  # the NIC, not the window, stopped it
                sim.nic_wait(self, now, sent > 0)
        else:  # a receiver sends control only: no NIC room to work out
            for pkt, size in conn.packets_to_send(now, data_limit=0):
                send(host, peer, pkt.port, pkt.ev, pkt, size, False)
        if events:
            self._drain(now)
        deadline = conn.get_timer()
        if deadline != self.timer_at:
            self.timer_at = deadline
            if deadline is not None:
                armed = self.armed_at
                if armed is None or deadline <= armed:
                    self.timer_gen += 1  # an armed later event is now stale
                    self.armed_at = deadline if deadline > now else now
                    sim.engine.at(deadline, self._on_timer_cb, self.timer_gen)
                else:  # later than the armed event: that one pushes it, with this key
                    self.timer_key = sim.tiebreak()

    def _pump_wire(self, now: float) -> None:
        """:meth:`pump`'s transmit step when packets travel encoded (``run(wire=True)``)."""
        sim = self.sim
        conn = self.conn
        send = sim.send_packet
        if self.sender:
            per_plane = self.flow.plane_bytes
            room = sim.nic_room(self.host, now)
            sent = 0
            for pkt, size in conn.packets_to_send(now, data_limit=room):
                per_plane[pkt.port] += size
                is_data = type(pkt) is DataPacket
                if is_data:
                    sent += 1
                data = encode(pkt, conn.integrity)
                send(self.host, self.peer, pkt.port, pkt.ev, data, size, is_data)
            if sent >= room:
                sim.nic_wait(self, now, sent > 0)
        else:
            for pkt, size in conn.packets_to_send(now, data_limit=0):
                data = encode(pkt, conn.integrity)
                send(self.host, self.peer, pkt.port, pkt.ev, data, size, False)

    def _on_timer(self, gen: int) -> None:
        if gen != self.timer_gen:
            return
        self.armed_at = None
        deadline = self.timer_at
        if deadline is None:
            return  # the timer was cleared since this was armed
        sim = self.sim
        now = sim.engine.now
        if deadline > now:  # it moved later since: arm it now, under the key it got then
            self.armed_at = deadline
            sim.engine.add(deadline, (self.timer_key, self._on_timer_cb, gen))
            return
        if now == self.spin_at:
            self.spins += 1
            if self.spins > MAX_TIMER_SPINS:
                raise SimError(f"flow {self.flow.index} {self.side}: timer stuck at t={now}")
        else:
            self.spin_at, self.spins = now, 0
        self.timer_at = None
        self.conn.handle_timer(now)
        self.pump()

    def _drain(self, now: float) -> None:
        events = self.conn.events
        on_event = self.sim.on_event
        while events:
            on_event(self, events.popleft(), now)


def _trim_packet(pkt: DataPacket, lasthop: bool) -> tuple[DataPacket, int]:
    """The network's trimmer for packets that travel decoded."""
    trimmed = trim(pkt, lasthop)
    return trimmed, encoded_length(trimmed, 0)


class _Simulation:
    def __init__(self, cfg: SimConfig, factory: ConnectionFactory, wire: bool = False) -> None:
        self.cfg = cfg
        self.wire = wire
        master = random.Random(cfg.seed)
        self.engine = Engine()
        _, _, self.tiebreak = self.engine.queue()
        pairs = cfg.flows()
        net_rng = random.Random(master.getrandbits(64))
        self.net = Network(
            cfg.fabric,
            self.engine,
            net_rng,
            cfg.net_params(),
            trimmer=None if wire else _trim_packet,
            ev_loss_pairs=pairs,
        )
        self.series: dict[int, list[int]] | None = None if cfg.series_interval_s is None else {}
        self.flows: list[_Flow] = []
        self.by_host: dict[int, dict[int, _Endpoint]] = {}  # host -> local QPN -> endpoint
        self.probe_ids: dict[int, ProbeIds] = {}  # host -> the ids of its EV probes
        self.ev_log: list[EvRecord] = []
        self.port_log: list[PortRecord] = []
        self.ev_changes = 0
        self.unknown_qpn = 0
        self.unfinished = len(pairs)
        data_rng = random.Random(master.getrandbits(64))
        hash_rng = random.Random(master.getrandbits(64))
        for index, spec in enumerate(cfg.specs()):
            src, dst = spec.src, spec.dst
            flow = _Flow(index, spec, cfg, data_rng)
            self.flows.append(flow)
            for before in set(spec.after):
                self.flows[before].dependents.append(flow)
            qpn = QPN_BASE + 2 * index
            for sender, host, peer, local in ((True, src, dst, qpn), (False, dst, src, qpn + 1)):
                config = ConnectionConfig(
                    local_qpn=local,
                    remote_qpn=local ^ 1,
                    planes=cfg.fabric.planes,
                    evs=ev_profile(cfg, host, peer, hash_rng, spec),
                    mode=cfg.mode,
                    cc=cfg.cc,
                    cc_params=cfg.cc_for(host, peer),
                    mtu_payload=cfg.mtu_payload,
                    ev_count=cfg.ev_count,
                )
                memory = MemoryTable()
                if sender:
                    memory.register(flow.source)
                else:
                    memory = flow.sink
                conn = factory(config, memory, random.Random(master.getrandbits(64)))
                # EV probes go to the peer's endpoint (QP 2): their ids are the host's.
                conn.probe_ids = self.probe_ids.setdefault(host, ProbeIds())
                endpoint = _Endpoint(self, flow, conn, sender)
                flow.ends.append(endpoint)
                self.by_host.setdefault(host, {})[local] = endpoint
        self.send_packet: Sender = self.net.send_packet
        self.mapper = None if cfg.mapper is None else self._start_mapper(cfg.mapper)
        if self.mapper is None:
            for host, table in sorted(self.by_host.items()):
                self.net.attach(host, self._host_handler(table))
        # Each host's NIC: its uplinks, and the connections waiting for them to drain.
        fabric = cfg.fabric
        self.uplinks = {
            host: [
                self.net.physical[self.net.host_link(host, plane)][0]
                for plane in range(fabric.planes)
            ]
            for host in self.by_host
        }
        full = cfg.mtu_payload + DATA_PACKET_OVERHEAD_BYTES + WIRE_OVERHEAD_BYTES
        self.nic_packet = full
        self.nic_window = NIC_PACKETS_PER_PORT * fabric.planes * full
        for table in self.by_host.values():
            for endpoint in table.values():
                endpoint.uplinks = self.uplinks[endpoint.host]
        self.waiting: dict[int, list[_Endpoint]] = {host: [] for host in self.by_host}
        self.wake_at: dict[int, float] = {}
        self._schedule_faults()
        for flow in self.flows:
            if not flow.waiting:
                self.engine.at(flow.spec.start_s, self._start, flow)

    def _start_mapper(self, spec: MapperSpec) -> SimMapper:
        """The fabric mapper: probes on every host (each host's arrivals tapped for them),
        its denylist kept on every connection, data packets on denied paths counted."""
        mapper = SimMapper(self.cfg.fabric, self.engine, self.net, spec)
        self.send_packet = mapper.counting(self.net.send_packet)
        for host in range(self.cfg.fabric.hosts):
            table = self.by_host.get(host, {})
            handler = self._host_handler(table) if table else self._no_endpoint
            self.net.attach(host, mapper.tap(host, handler))
            for endpoint in table.values():
                mapper.deny_on(host, endpoint.peer, endpoint.conn, endpoint.pump)
        mapper.start()
        return mapper

    def nic_backlog(self, host: int, now: float) -> float:
        """Bytes waiting in the host's NIC ports (all planes)."""
        backlog = 0.0
        for link in self.uplinks[host]:
            if link.busy_until > now:
                backlog += (link.busy_until - now) * link.bytes_per_s
        return backlog

    def nic_room(self, host: int, now: float) -> int:
        """How many full data packets the host's NIC takes now: enough to keep every port
        busy (:data:`NIC_PACKETS_PER_PORT` each), not a window's worth queued in it."""
        backlog = 0.0  # nic_backlog, inline: once per sender pump
        for link in self.uplinks[host]:
            busy = link.busy_until
            if busy > now:
                backlog += (busy - now) * link.bytes_per_s
        return max(0, int((self.nic_window - backlog) // self.nic_packet))

    def nic_wait(self, endpoint: _Endpoint, now: float, sent: bool) -> None:
        """``endpoint`` has data the NIC could not take: pump it again when the ports have
        drained to half.  Connections that got nothing keep their turn; those that sent go
        to the back (round robin, as a NIC's scheduler serves its queue pairs)."""
        host = endpoint.host
        queue = self.waiting[host]
        if endpoint in queue:
            return
        if sent:
            queue.append(endpoint)
        else:
            queue.insert(sum(1 for e in queue if not e.nic_sent), endpoint)
        endpoint.nic_sent = sent
        # A byte past half, so that rounding cannot leave the wake-up one hair short of
        # room for a packet (and wake it again and again at the same instant).
        uplinks = self.uplinks[host]
        backlog = 0.0  # nic_backlog(host, now), inline
        for link in uplinks:
            busy = link.busy_until
            if busy > now:
                backlog += (busy - now) * link.bytes_per_s
        drained = now + max(0.0, backlog - self.nic_window / 2 + 1) / (
            uplinks[0].bytes_per_s * len(uplinks)
        )
        if self.wake_at.get(host, math.inf) > drained:
            self.wake_at[host] = drained
            self.engine.at(drained, self._nic_wake, host)

    def _nic_wake(self, host: int) -> None:
        if self.wake_at.get(host) != self.engine.now:
            return  # a stale wake-up: an earlier one was scheduled since
        del self.wake_at[host]
        queue, self.waiting[host] = self.waiting[host], []
        for endpoint in queue:
            endpoint.pump()

    def _no_endpoint(self, msg: Any, size: int, plane: int, ecn: bool) -> None:
        """What reaches a host with no connection (beside the mapper's probes)."""
        self.unknown_qpn += 1

    def _host_handler(self, table: dict[int, _Endpoint]) -> Callable[[Any, int, int, bool], None]:
        if len(table) == 1 and not self.wire:
            (endpoint,) = table.values()
            return endpoint.receive  # it checks the QPN itself
        wire = self.wire
        net = self.net
        ids = table[min(table)].conn.probe_ids
        # The endpoint answers a probe to the host that sent it: through a connection to
        # that host (any of them), whose paths lead back there.
        to_peer: dict[int, _Endpoint] = {}
        for local in sorted(table):
            to_peer.setdefault(table[local].peer, table[local])

        def deliver(msg: Any, size: int, plane: int, ecn: bool) -> None:
            qpn = peek_qpn(msg) if wire else msg.qpn
            endpoint: _Endpoint | None
            if qpn == ENDPOINT_QPN:  # the host's endpoint: a probe, or an answer to ours
                if (msg[0] if wire else type(msg)) in _REPLIES:
                    owner = ids.owner(probe_id(msg) if wire else msg.probe_id)
                    endpoint = table.get(owner) if owner is not None else None
                else:
                    endpoint = to_peer.get(net.delivered_src)
            else:
                endpoint = table.get(qpn)
            if endpoint is None:
                self.unknown_qpn += 1
            else:
                endpoint.receive(msg, size, plane, ecn)

        return deliver

    def _schedule_faults(self) -> None:
        """Validate every failure target now, then schedule its start and end.

        A host's NIC port loses link whenever the link to its T0 is down, whatever took it
        down (a NIC fault, that link failing, or the whole T0 failing): its connections are
        told through ``set_port_state``, as a real NIC's carrier loss would tell them.
        """
        net = self.net
        for window in self.cfg.windows():
            change: Callable[[bool], None]
            if isinstance(window, LinkFailure):
                link = net.canonical(window.link)
                change = functools.partial(net.set_link, link)
                ports = self._host_ports([link])
            elif isinstance(window, SwitchFailure):
                links = net.switch_links(window.switch)
                change = functools.partial(net.set_switch, window.switch)
                ports = self._host_ports(links)
            elif isinstance(window, PlaneFailure):
                links = net.plane_links(window.plane)
                change = functools.partial(self._set_links, links)
                ports = self._host_ports(links)
            else:
                link = net.host_link(window.host, window.plane)
                change = functools.partial(net.set_link, link)
                ports = [(window.host, window.plane)]
            action = functools.partial(self._fault, change, ports)
            self.engine.at(window.start, action, False)
            if window.end is not None:
                self.engine.at(window.end, action, True)
        for change_at in sorted(self.cfg.loss_changes, key=lambda c: c.at):
            self.engine.at(change_at.at, self._set_loss, change_at)

    def _set_links(self, links: list[str], up: bool) -> None:
        for link in links:
            self.net.set_link(link, up)

    def _set_loss(self, change: LossChange) -> None:
        self.net.set_loss(change.link, change.loss)

    def _host_ports(self, links: list[str]) -> list[tuple[int, int]]:
        """The (host, plane) NIC ports at the end of any of these physical links."""
        fabric = self.cfg.fabric
        wanted = set(links)
        return [
            (host, plane)
            for host in range(fabric.hosts)
            for plane in range(fabric.planes)
            if self.net.host_link(host, plane) in wanted
        ]

    def _fault(
        self, change: Callable[[bool], None], ports: list[tuple[int, int]], up: bool
    ) -> None:
        change(up)
        now = self.engine.now
        for host, plane in ports:
            # Up only once every cause has ended (failures nest on the link).
            port_up = not self.net.links[self.net.host_link(host, plane)].down
            for endpoint in self.by_host.get(host, {}).values():
                endpoint.conn.set_port_state(plane, port_up, now)  # idempotent
                endpoint.pump()

    def _start(self, flow: _Flow) -> None:
        flow.started_at = self.engine.now
        for _k in range(flow.slots):
            self._post(flow)
        flow.ends[0].pump()

    def _release(self, flow: _Flow) -> None:
        """``flow`` finished: start what waited for it, or fail it all if it failed."""
        now = self.engine.now
        for dep in flow.dependents:
            if dep.finished:
                continue
            if flow.failed is not None:
                dep.failed = f"flow {flow.index} it waits for failed"
                dep.failed_at = now
                self._finish(dep)
                continue
            dep.waiting -= 1
            if dep.waiting == 0:
                self.engine.at(max(now, dep.spec.start_s), self._start, dep)

    def _finish(self, flow: _Flow) -> None:
        flow.finished = True
        self.unfinished -= 1
        self._release(flow)
        if self.unfinished == 0:
            self.engine.stop()

    def _post(self, flow: _Flow) -> None:
        """Post the flow's next write into its ring slot (free: the write it held is done)."""
        k = flow.posted
        if k - flow.slots >= flow.completed:
            raise SimError(f"flow {flow.index}: ring slot of write {k} still in use")
        offset, length, slot = flow.wr(k)
        source = memoryview(flow.source)[slot : slot + length]
        flow.content.fill(source, offset)
        flow.posted += 1
        if flow.probe:
            flow.posted_at.append(self.engine.now)
        sink = flow.sink
        flow.ends[0].conn.post_write(
            k, source, sink.va + offset, sink.rkey, imm=k & 0xFFFF_FFFF, now=self.engine.now
        )

    @staticmethod
    def _pump_sender(flow: _Flow) -> None:
        flow.ends[0].pump()

    def series_add(self, flow: int, now: float, n: int) -> None:
        if self.series is None or self.cfg.series_interval_s is None:
            return
        row = self.series.setdefault(int(now / self.cfg.series_interval_s), [0] * len(self.flows))
        row[flow] += n

    def on_event(self, endpoint: _Endpoint, event: Event, now: float) -> None:
        flow = endpoint.flow
        if isinstance(event, SendCompleted):
            if event.wr_id != flow.completed or event.status is not WcStatus.SUCCESS:
                flow.completions_ok = False
            flow.completed += 1
            if event.status is WcStatus.SUCCESS:
                flow.bytes_done += event.byte_len
                if flow.probe and event.wr_id < len(flow.posted_at):
                    flow.latency.append(now - flow.posted_at[event.wr_id])
                if flow.posted < flow.nwrs and flow.failed is None:
                    self._post(flow)
                    # Sent by a pump of its own: this event may come from a pump's last drain.
                    self.engine.at(now, self._pump_sender, flow)
            elif flow.failed is None:
                flow.failed = f"wr {event.wr_id}: {event.status.value}"
                flow.failed_at = now
        elif isinstance(event, WriteImmReceived):
            if flow.imms >= flow.posted:
                flow.content_ok = False  # an immediate for a write never posted
            else:
                flow.check_placed(flow.imms, event.imm)
            flow.imms += 1
            if flow.imms == flow.nwrs:
                flow.arrived_at = now
        elif isinstance(event, EvStateChanged):
            self.ev_changes += 1
            if len(self.ev_log) < MAX_EVENTS_LISTED:
                self.ev_log.append(
                    EvRecord(
                        now,
                        flow.index,
                        endpoint.side,
                        event.ev,
                        event.port,
                        event.old.value,
                        event.new.value,
                        event.reason,
                        event.drop_count,
                    )
                )
        elif isinstance(event, PortStateChanged):
            if len(self.port_log) < MAX_EVENTS_LISTED:
                self.port_log.append(
                    PortRecord(now, flow.index, endpoint.side, event.port, event.up, event.remote)
                )
        elif isinstance(event, ConnectionFailed) and flow.failed is None:
            flow.failed = f"{endpoint.side}: {event.reason}"
            flow.failed_at = now
        if flow.finished:
            return
        if flow.completed >= flow.nwrs and flow.imms >= flow.nwrs:
            flow.done_at = now
        elif flow.failed is None:
            return
        self._finish(flow)

    def run(self) -> SimResult:
        cfg = self.cfg
        self.engine.run(cfg.max_sim_time_s)
        end = self.engine.now
        flows = tuple(flow.result() for flow in self.flows)
        times = [f.done_at if f.done_at is not None else end for f in self.flows]
        completion = max(times) if times else 0.0
        delivered = sum(f.bytes_done for f in self.flows)
        goodput = delivered * 8 / completion if completion > 0 else 0.0
        arrivals = [f.arrived_at if f.arrived_at is not None else end for f in self.flows]
        arrival = max(arrivals) if arrivals else 0.0
        arrived = sum(f.size for f in self.flows if f.arrived_at is not None)
        senders = len({f.src for f in self.flows})
        capacity = cfg.fabric.planes * cfg.host_rate_bps() * senders
        stats = self.net.stats()
        drops = dict(stats.drops, unknown_qpn=self.unknown_qpn)
        fcts = [f.fct_s for f in flows if f.fct_s is not None]
        slowdowns = [f.slowdown for f in flows if f.slowdown is not None]
        return SimResult(
            bytes_delivered=delivered,
            verified=all(f.verified for f in flows),
            completion_time_s=completion,
            goodput_bps=goodput,
            capacity_bps=capacity,
            goodput_fraction=goodput / capacity,
            arrival_time_s=arrival,
            arrival_fraction=arrived * 8 / arrival / capacity if arrival > 0 else 0.0,
            retransmissions=sum_counts([f.retransmissions for f in flows]),
            spurious_retransmissions=sum(f.spurious_retransmissions for f in flows),
            tlp_unneeded=sum(f.tlp_unneeded for f in flows),
            trims=stats.trims,
            ecn_marks=stats.ecn_marks,
            drops=drops,
            ev_state_changes=self.ev_changes,
            per_plane_bytes=tuple(
                sum(f.plane_bytes[p] for f in self.flows) for p in range(cfg.fabric.planes)
            ),
            flows=flows,
            groups=self._groups(flows),
            fct_p50_s=quantile(fcts, 0.5, method=Method.LINEAR),
            fct_p99_s=quantile(fcts, 0.99, method=Method.LINEAR),
            slowdown_p50=quantile(slowdowns, 0.5, method=Method.LINEAR),
            slowdown_p99=quantile(slowdowns, 0.99, method=Method.LINEAR),
            receiver_utilization=self._receiver_utilization(completion),
            events=tuple(self.ev_log),
            events_truncated=self.ev_changes - len(self.ev_log),
            port_events=tuple(self.port_log),
            timeline=self._timeline(),
            links=stats.links,
            packets_sent=stats.packets_sent,
            packets_delivered=stats.packets_delivered,
            sim_time_s=end,
            sim_events=self.engine.events_run,
            config=cfg,
            seed=cfg.seed,
            mapper=None if self.mapper is None else self.mapper.result(),
        )

    @staticmethod
    def _groups(flows: tuple[FlowResult, ...]) -> tuple[GroupResult, ...]:
        by_name: dict[str, list[FlowResult]] = {}
        for f in flows:
            if f.group:
                by_name.setdefault(f.group, []).append(f)
        out = []
        for name, members in by_name.items():  # in order of first appearance
            starts = [f.start_time_s for f in members if f.start_time_s is not None]
            complete = all(f.complete for f in members)
            start = min(starts) if starts else None
            end = max(f.completion_time_s or 0.0 for f in members) if complete else None
            out.append(
                GroupResult(
                    name=name,
                    flows=len(members),
                    complete=complete,
                    start_s=start,
                    end_s=end,
                    duration_s=end - start if end is not None and start is not None else None,
                    bytes=sum(f.bytes for f in members),
                )
            )
        return tuple(out)

    def _receiver_utilization(self, duration: float) -> dict[str, float]:
        """Each receiving host: wire bytes its T0s delivered to it over the run's time."""
        if duration <= 0:
            return {}
        fabric = self.cfg.fabric
        rate = self.cfg.host_rate_bps() * fabric.planes
        out = {}
        for host in sorted({f.dst for f in self.flows}):
            wire = 0
            for plane in range(fabric.planes):
                _, down = self.net.physical[self.net.host_link(host, plane)]
                wire += down.tx_bytes
            out[f"h{host}"] = wire * 8 / (duration * rate)
        return out

    def _timeline(self) -> tuple[TimelineBin, ...]:
        interval = self.cfg.series_interval_s
        if self.series is None or interval is None:
            return ()
        last = max(self.series, default=-1)
        empty = [0] * len(self.flows)
        out = []
        for i in range(last + 1):
            row = self.series.get(i, empty)
            total = sum(row)
            out.append(TimelineBin(i * interval, total, total * 8 / interval, tuple(row)))
        return tuple(out)


def run(
    cfg: SimConfig, *, connection_factory: ConnectionFactory | None = None, wire: bool = False
) -> SimResult:
    """Simulate ``cfg`` to completion (or ``max_sim_time_s``) and report what happened.

    ``connection_factory`` replaces the real ``Connection`` (the benchmark wraps it to time
    the core); it must behave like :class:`Connection`.  ``wire`` sends every packet
    encoded, as on a real network: slower, and the same result.
    """
    return _Simulation(cfg, connection_factory or _real_connection, wire).run()
