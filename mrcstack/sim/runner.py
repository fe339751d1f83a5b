"""Scenario in, result out: wire MRC connections to the simulated fabric and run a transfer.

Each flow is one connection (a QP at each end).  The sender registers a buffer of seeded
random bytes and posts RDMA WRITEs of ``wr_size`` (the last one with an immediate) into a
zeroed region the receiver registered.  A flow is done when the sender saw every
SendCompleted and the receiver the WriteImmReceived.  The adapter is the usual sans-IO
loop: after any input, drain events, transmit ``datagrams_to_send``, re-arm one timer.

All randomness comes from ``random.Random`` instances derived from ``SimConfig.seed``, and
time is virtual, so a configuration always produces the same :class:`SimResult`.
"""

from __future__ import annotations

import enum
import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from mrcstack import addrplan
from mrcstack.addrplan import ev_value
from mrcstack.core import cc as cc_registry
from mrcstack.core.cc import CCParams
from mrcstack.core.config import MODES, ConnectionConfig
from mrcstack.core.connection import Connection
from mrcstack.core.events import (
    ConnectionFailed,
    Event,
    EvStateChanged,
    PortStateChanged,
    SendCompleted,
    WcStatus,
    WriteImmReceived,
)
from mrcstack.core.evs import EvEntry
from mrcstack.core.memory import MemoryRegion, MemoryTable
from mrcstack.fabric import Fabric
from mrcstack.sim.engine import Engine
from mrcstack.sim.network import (
    DEFAULT_LINK_DELAY_S,
    DEFAULT_RATE_BPS,
    WIRE_OVERHEAD_BYTES,
    NetParams,
    Network,
)
from mrcstack.wire import peek_qpn

DEFAULT_BYTES = 16 << 20
DEFAULT_MTU_PAYLOAD = 4096
DEFAULT_EV_COUNT = 128
MAX_EV_COUNT = 1 << 16
DEFAULT_MAX_SIM_TIME_S = 1.0
#: EVs offered per plane, as a multiple of those in use: the rest are the backup set.
EV_PROFILE_FACTOR = 2
#: Largest data header + trailer (BTH 12, RETH 16, ImmDt 4, MRCX 28, GCM tag 16): sizes a
#: full packet for the base-RTT estimate.
DATA_PACKET_OVERHEAD_BYTES = 76
#: QPNs: flow i uses QPN_BASE + 2i at the sender and QPN_BASE + 2i + 1 at the receiver.
QPN_BASE = 0x100
#: A timer that keeps firing at one instant without the core moving it means a core bug.
MAX_TIMER_SPINS = 10_000
MAX_TIMELINE_BINS = 10_000_000
#: Cap on the EV / port event lists in a result (the counts stay exact).
MAX_EVENTS_LISTED = 1000
#: Significant digits kept for every float in the JSON form (byte-stable output).
JSON_FLOAT_DIGITS = 9


@dataclass(frozen=True, slots=True)
class LinkFailure:
    """A physical link (either direction's name) down from ``start`` until ``end`` (s)."""

    link: str
    start: float
    end: float | None = None


@dataclass(frozen=True, slots=True)
class SwitchFailure:
    """Every link of a switch (node name, e.g. ``p0-t1a``) down during the window."""

    switch: str
    start: float
    end: float | None = None


@dataclass(frozen=True, slots=True)
class NicDown:
    """A host's NIC port for ``plane`` loses link: its T0 link fails and the host's
    connections are told through ``set_port_state``, as a real NIC would tell them."""

    host: int
    plane: int
    start: float
    end: float | None = None


Window = LinkFailure | SwitchFailure | NicDown


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One scenario.  Times in seconds, rates in bit/s, sizes in bytes."""

    fabric: Fabric = field(default_factory=Fabric)
    pairs: tuple[tuple[int, int], ...] = ()  # (src, dst) hosts; () = one flow h0 -> last host
    bytes_per_flow: int = DEFAULT_BYTES
    wr_size: int | None = None  # None = one work request per flow
    mode: str = "mrc"
    cc: str = "nscc"
    cc_params: CCParams | None = None  # None = CCParams.for_path(line rate, base RTT)
    link_delay_s: float = DEFAULT_LINK_DELAY_S
    rate_bps: float = DEFAULT_RATE_BPS  # for links the fabric leaves unshaped
    queue_bytes: int | None = None  # None = fabric.queue_bytes
    trim: bool = True
    trim_threshold_bytes: int | None = None  # None = queue / 2
    ecn_kmin_bytes: int | None = None  # None = queue / 16
    ecn_kmax_bytes: int | None = None  # None = queue / 4
    loss: float = 0.0
    link_loss: tuple[tuple[str, float], ...] = ()
    ev_loss: tuple[tuple[int, float], ...] = ()  # applied sender -> receiver only
    link_failures: tuple[LinkFailure, ...] = ()
    switch_failures: tuple[SwitchFailure, ...] = ()
    nic_downs: tuple[NicDown, ...] = ()
    mtu_payload: int = DEFAULT_MTU_PAYLOAD
    ev_count: int = DEFAULT_EV_COUNT
    seed: int = 0
    max_sim_time_s: float = DEFAULT_MAX_SIM_TIME_S
    series_interval_s: float | None = None  # per-interval delivered bytes in the timeline

    def __post_init__(self) -> None:
        hosts = self.fabric.hosts
        if hosts < 2:
            raise ValueError("the fabric needs at least two hosts")
        for src, dst in self.pairs:
            for host in (src, dst):
                if not 0 <= host < hosts:
                    raise ValueError(f"pair {src}:{dst}: host {host} not in 0..{hosts - 1}")
            if src == dst:
                raise ValueError(f"pair {src}:{dst}: a flow needs two different hosts")
        if self.bytes_per_flow < 1:
            raise ValueError(f"bytes per flow must be >= 1, got {self.bytes_per_flow}")
        if self.wr_size is not None and self.wr_size < 1:
            raise ValueError(f"wr_size must be >= 1, got {self.wr_size}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.cc not in cc_registry.REGISTRY:
            known = ", ".join(sorted(cc_registry.REGISTRY))
            raise ValueError(f"unknown congestion control {self.cc!r}; known: {known}")
        overhead = DATA_PACKET_OVERHEAD_BYTES + WIRE_OVERHEAD_BYTES
        if not 1 <= self.mtu_payload <= self.fabric.mtu - overhead:
            raise ValueError(
                f"mtu_payload must be in 1..{self.fabric.mtu - overhead} for MTU "
                f"{self.fabric.mtu}, got {self.mtu_payload}"
            )
        if not 1 <= self.ev_count <= MAX_EV_COUNT:
            raise ValueError(f"ev_count must be in 1..{MAX_EV_COUNT}, got {self.ev_count}")
        if not 0 < self.max_sim_time_s < float("inf"):
            raise ValueError(f"max sim time must be positive, got {self.max_sim_time_s}")
        if self.series_interval_s is not None and not (
            self.series_interval_s > 0
            and self.max_sim_time_s / self.series_interval_s <= MAX_TIMELINE_BINS
        ):
            raise ValueError(
                f"series interval must be positive and at most {MAX_TIMELINE_BINS} "
                f"intervals per max sim time, got {self.series_interval_s}"
            )
        for window in self.windows():
            if not 0 <= window.start < float("inf") or (
                window.end is not None and not window.start < window.end < float("inf")
            ):
                raise ValueError(f"bad failure window {window}: need 0 <= start < end")
        for nic in self.nic_downs:
            self.fabric.check_host(nic.host)
            self.fabric.check_plane(nic.plane)
        for link in (*(w.link for w in self.link_failures), *(n for n, _ in self.link_loss)):
            addrplan.parse_link(link, self.fabric)
        for switch in self.switch_failures:
            _check_switch(self.fabric, switch.switch)
        self.net_params()  # checks rates, probabilities and thresholds

    def flows(self) -> tuple[tuple[int, int], ...]:
        return self.pairs or ((0, self.fabric.hosts - 1),)

    def windows(self) -> tuple[Window, ...]:
        return (*self.link_failures, *self.switch_failures, *self.nic_downs)

    def net_params(self) -> NetParams:
        params = NetParams(
            link_delay_s=self.link_delay_s,
            default_rate_bps=self.rate_bps,
            queue_bytes=self.queue_bytes,
            trim=self.trim,
            trim_threshold_bytes=self.trim_threshold_bytes,
            ecn_kmin_bytes=self.ecn_kmin_bytes,
            ecn_kmax_bytes=self.ecn_kmax_bytes,
            loss=self.loss,
            link_loss=self.link_loss,
            ev_loss=self.ev_loss,
        )
        params.thresholds(self.fabric)
        return params

    def host_rate_bps(self) -> float:
        return self.fabric.host_link_bps or self.rate_bps

    def base_rtt(self, src: int, dst: int) -> float:
        """2 x (hops x (propagation + serialization of a full data packet))."""
        f = self.fabric
        full = self.mtu_payload + DATA_PACKET_OVERHEAD_BYTES + WIRE_OVERHEAD_BYTES
        one_way = 2 * (self.link_delay_s + full * 8 / self.host_rate_bps())
        if f.rack_of(src) != f.rack_of(dst):
            one_way += 2 * (self.link_delay_s + full * 8 / (f.fabric_link_bps or self.rate_bps))
        return 2 * one_way

    def cc_for(self, src: int, dst: int) -> CCParams:
        if self.cc_params is not None:
            return self.cc_params
        planes = 1 if self.mode == "roce" else self.fabric.planes
        return CCParams.for_path(planes * self.host_rate_bps(), self.base_rtt(src, dst))


def _check_switch(fabric: Fabric, name: str) -> None:
    node = addrplan.parse_node(name)
    top = fabric.racks if node.kind == addrplan.T0 else fabric.t1_per_plane
    if node.plane is None:
        raise ValueError(f"{name} is a host, not a switch (use a NIC failure)")
    if node.plane >= fabric.planes or node.index >= top:
        raise ValueError(f"no switch {name} in this fabric")


#: Builds one endpoint's connection; the benchmark passes one that times the core.
ConnectionFactory = Callable[[ConnectionConfig, MemoryTable, random.Random], Connection]


class SimError(RuntimeError):
    """The simulated core misbehaved (e.g. a timer that never moves)."""


def _real_connection(
    config: ConnectionConfig, memory: MemoryTable, rng: random.Random
) -> Connection:
    return Connection(config, memory=memory, rng=rng, now=0.0)


def ev_profile(
    cfg: SimConfig, src: int, dst: int, rng: random.Random | None = None
) -> tuple[EvEntry, ...]:
    """EVs from src to dst: per plane, EV_PROFILE_FACTOR x the in-use share, cycling over
    the T1s (so the in-use prefix covers every T1 evenly) with fresh entropy each round.

    In RoCE mode the connection uses only the first EV; with ``rng`` the list is rotated to
    a random start, like an ECMP hash picking one path per flow.
    """
    f = cfg.fabric
    per_plane = EV_PROFILE_FACTOR * max(1, cfg.ev_count // f.planes)
    t1s = 1 if f.rack_of(src) == f.rack_of(dst) else f.t1_per_plane
    evs = [
        EvEntry(ev_value(plane, k % t1s, k // t1s), plane)
        for plane in range(f.planes)
        for k in range(per_plane)
    ]
    if cfg.mode == "roce" and rng is not None:
        start = rng.randrange(len(evs))
        evs = evs[start:] + evs[:start]
    return tuple(evs)


# Results --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FlowResult:
    index: int
    src: int
    dst: int
    bytes: int
    work_requests: int
    complete: bool  # sender saw every completion and the receiver the immediate
    verified: bool  # complete, data identical, completions once each and in order
    completion_time_s: float | None
    goodput_bps: float
    failed: str | None  # ConnectionFailed reason or a non-success completion status
    retransmissions: dict[str, int]
    nacks_received: dict[str, int]
    trims_received: int  # at the receiver
    ecn_echoes: int  # at the sender
    per_plane_bytes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class EvRecord:
    t_s: float
    flow: int
    side: str  # "sender" or "receiver": whose EV table changed
    ev: int
    plane: int
    old: str
    new: str
    reason: str
    drop_count: int


@dataclass(frozen=True, slots=True)
class PortRecord:
    t_s: float
    flow: int
    side: str
    port: int
    up: bool
    remote: bool


@dataclass(frozen=True, slots=True)
class TimelineBin:
    t_s: float  # interval start
    bytes: int  # payload bytes newly placed at receivers during the interval
    goodput_bps: float
    flow_bytes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SimResult:
    """What a run produced; :meth:`to_json` is the stable form (see the package docs)."""

    bytes_delivered: int
    verified: bool
    completion_time_s: float
    goodput_bps: float
    capacity_bps: float
    goodput_fraction: float
    retransmissions: dict[str, int]
    trims: int
    ecn_marks: int
    drops: dict[str, int]
    ev_state_changes: int
    per_plane_bytes: tuple[int, ...]
    flows: tuple[FlowResult, ...]
    events: tuple[EvRecord, ...]
    events_truncated: int
    port_events: tuple[PortRecord, ...]
    timeline: tuple[TimelineBin, ...]
    links: dict[str, dict[str, int]]
    packets_sent: int
    packets_delivered: int
    sim_time_s: float
    sim_events: int
    config: SimConfig
    seed: int

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types, floats rounded to JSON_FLOAT_DIGITS significant digits."""
        out = {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}
        out["config"]["pairs"] = [list(p) for p in self.config.flows()]
        return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return float(f"{value:.{JSON_FLOAT_DIGITS}g}")
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    raise TypeError(f"cannot put {type(value).__name__} into JSON")


def _sum_counts(tables: Sequence[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for table in tables:
        for key, n in table.items():
            out[key] = out.get(key, 0) + n
    return dict(sorted(out.items()))


# The adapter ----------------------------------------------------------------------------
class _Flow:
    """One transfer and the bookkeeping that decides whether it completed correctly."""

    def __init__(self, index: int, src: int, dst: int, cfg: SimConfig, data: bytes) -> None:
        self.index, self.src, self.dst = index, src, dst
        self.source = bytearray(data)
        self.target = bytearray(len(data))
        size = cfg.wr_size or len(data)
        self.wrs = [(off, min(size, len(data) - off)) for off in range(0, len(data), size)]
        self.imm = index
        self.plane_bytes = [0] * cfg.fabric.planes
        self.completions: list[tuple[int, WcStatus]] = []
        self.bytes_done = 0
        self.imms: list[int] = []
        self.failed: str | None = None
        self.done_at: float | None = None
        self.finished = False
        self.ends: list[_Endpoint] = []  # sender, receiver
        self.target_region: MemoryRegion | None = None

    def complete(self) -> bool:
        return self.done_at is not None

    def verified(self) -> bool:
        expected = [(i, WcStatus.SUCCESS) for i in range(len(self.wrs))]
        return (
            self.complete()
            and self.failed is None
            and self.completions == expected
            and self.imms == [self.imm]
            and self.target == self.source
        )

    def result(self) -> FlowResult:
        tx, rx = (end.conn.stats for end in self.ends)
        time = self.done_at
        return FlowResult(
            index=self.index,
            src=self.src,
            dst=self.dst,
            bytes=len(self.source),
            work_requests=len(self.wrs),
            complete=self.complete(),
            verified=self.verified(),
            completion_time_s=time,
            goodput_bps=len(self.source) * 8 / time if time else 0.0,
            failed=self.failed,
            retransmissions=_sum_counts([tx.retransmissions, rx.retransmissions]),
            nacks_received=dict(sorted(tx.nacks_received.items())),
            trims_received=rx.trims_received,
            ecn_echoes=tx.ecn_echoes,
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
        self.timer_at: float | None = None
        self.timer_gen = 0
        self.spin_at = -1.0
        self.spins = 0
        self.placed = 0
        self._on_timer_cb = self._on_timer
        while conn.next_event() is not None:
            pass  # connection setup (the initial EV activations) is not a state change

    def receive(self, data: bytes, plane: int, ecn: bool) -> None:
        now = self.sim.engine.now
        self.conn.receive_datagram(data, now=now, port=plane, ecn=ecn)
        if self.sim.series is not None and not self.sender:
            placed = self.conn.stats.data_bytes_placed
            if placed != self.placed:
                self.sim.series_add(self.flow.index, now, placed - self.placed)
                self.placed = placed
        self.pump()

    def pump(self) -> None:
        """After any input: drain events, transmit, drain again, re-arm the one timer."""
        sim = self.sim
        now = sim.engine.now
        conn = self.conn
        self._drain(now)
        send = sim.net.send
        per_plane = self.flow.plane_bytes if self.sender else None
        for d in conn.datagrams_to_send(now):
            if per_plane is not None:
                per_plane[d.port] += len(d.data)
            send(self.host, self.peer, d.port, d.ev, d.data)
        self._drain(now)
        deadline = conn.get_timer()
        if deadline != self.timer_at:
            self.timer_gen += 1  # any armed timer event is now stale
            self.timer_at = deadline
            if deadline is not None:
                sim.engine.at(deadline, self._on_timer_cb, self.timer_gen)

    def _on_timer(self, gen: int) -> None:
        if gen != self.timer_gen:
            return
        now = self.sim.engine.now
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
        while (event := self.conn.next_event()) is not None:
            self.sim.on_event(self, event, now)


class _Simulation:
    def __init__(self, cfg: SimConfig, factory: ConnectionFactory) -> None:
        self.cfg = cfg
        master = random.Random(cfg.seed)
        self.engine = Engine()
        pairs = cfg.flows()
        net_rng = random.Random(master.getrandbits(64))
        self.net = Network(cfg.fabric, self.engine, net_rng, cfg.net_params(), ev_loss_pairs=pairs)
        self.series: dict[int, list[int]] | None = None if cfg.series_interval_s is None else {}
        self.flows: list[_Flow] = []
        self.by_host: dict[int, dict[int, _Endpoint]] = {}  # host -> local QPN -> endpoint
        self.ev_log: list[EvRecord] = []
        self.port_log: list[PortRecord] = []
        self.ev_changes = 0
        self.unknown_qpn = 0
        self.unfinished = len(pairs)
        data_rng = random.Random(master.getrandbits(64))
        hash_rng = random.Random(master.getrandbits(64))
        for index, (src, dst) in enumerate(pairs):
            flow = _Flow(index, src, dst, cfg, data_rng.randbytes(cfg.bytes_per_flow))
            self.flows.append(flow)
            qpn = QPN_BASE + 2 * index
            for sender, host, peer, local in ((True, src, dst, qpn), (False, dst, src, qpn + 1)):
                config = ConnectionConfig(
                    local_qpn=local,
                    remote_qpn=local ^ 1,
                    planes=cfg.fabric.planes,
                    evs=ev_profile(cfg, host, peer, hash_rng),
                    mode=cfg.mode,
                    cc=cfg.cc,
                    cc_params=cfg.cc_for(host, peer),
                    mtu_payload=cfg.mtu_payload,
                    ev_count=cfg.ev_count,
                )
                memory = MemoryTable()
                region = memory.register(flow.source if sender else flow.target)
                if not sender:
                    flow.target_region = region
                conn = factory(config, memory, random.Random(master.getrandbits(64)))
                endpoint = _Endpoint(self, flow, conn, sender)
                flow.ends.append(endpoint)
                self.by_host.setdefault(host, {})[local] = endpoint
        for host, table in sorted(self.by_host.items()):
            self.net.attach(host, self._host_handler(table))
        self._schedule_faults()
        self.engine.at(0.0, self._post_all)

    def _host_handler(self, table: dict[int, _Endpoint]) -> Callable[[bytes, int, bool], None]:
        def deliver(data: bytes, plane: int, ecn: bool) -> None:
            endpoint = table.get(peek_qpn(data))
            if endpoint is None:
                self.unknown_qpn += 1
            else:
                endpoint.receive(data, plane, ecn)

        return deliver

    def _schedule_faults(self) -> None:
        """Validate every failure target now, then schedule its start and end."""
        net = self.net
        for window in self.cfg.windows():
            action: Callable[[bool], None]
            if isinstance(window, LinkFailure):
                link = net.canonical(window.link)
                action = functools.partial(net.set_link, link)
            elif isinstance(window, SwitchFailure):
                net.switch_links(window.switch)
                action = functools.partial(net.set_switch, window.switch)
            else:
                action = self._nic_action(window)
            self.engine.at(window.start, action, False)
            if window.end is not None:
                self.engine.at(window.end, action, True)

    def _nic_action(self, nic: NicDown) -> Callable[[bool], None]:
        link = self.net.host_link(nic.host, nic.plane)
        endpoints = list(self.by_host.get(nic.host, {}).values())

        def action(up: bool) -> None:
            self.net.set_link(link, up)
            now = self.engine.now
            for endpoint in endpoints:
                endpoint.conn.set_port_state(nic.plane, up, now)
                endpoint.pump()

        return action

    def _post_all(self, _: object) -> None:
        for flow in self.flows:
            sender = flow.ends[0]
            region = flow.target_region
            if region is None:
                raise SimError(f"flow {flow.index} has no target region")
            source = memoryview(flow.source)
            last = len(flow.wrs) - 1
            for wr_id, (offset, length) in enumerate(flow.wrs):
                sender.conn.post_write(
                    wr_id,
                    source[offset : offset + length],
                    region.va + offset,
                    region.rkey,
                    imm=flow.imm if wr_id == last else None,
                    now=0.0,
                )
            sender.pump()

    def series_add(self, flow: int, now: float, n: int) -> None:
        if self.series is None or self.cfg.series_interval_s is None:
            return
        row = self.series.setdefault(int(now / self.cfg.series_interval_s), [0] * len(self.flows))
        row[flow] += n

    def on_event(self, endpoint: _Endpoint, event: Event, now: float) -> None:
        flow = endpoint.flow
        if isinstance(event, SendCompleted):
            flow.completions.append((event.wr_id, event.status))
            if event.status is WcStatus.SUCCESS:
                flow.bytes_done += event.byte_len
            elif flow.failed is None:
                flow.failed = f"wr {event.wr_id}: {event.status.value}"
        elif isinstance(event, WriteImmReceived):
            flow.imms.append(event.imm)
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
        if flow.finished:
            return
        if len(flow.completions) >= len(flow.wrs) and flow.imms:
            flow.done_at = now
        elif flow.failed is None:
            return
        flow.finished = True
        self.unfinished -= 1
        if self.unfinished == 0:
            self.engine.stop()

    def run(self) -> SimResult:
        cfg = self.cfg
        self.engine.run(cfg.max_sim_time_s)
        end = self.engine.now
        flows = tuple(flow.result() for flow in self.flows)
        times = [f.done_at if f.done_at is not None else end for f in self.flows]
        completion = max(times) if times else 0.0
        delivered = sum(f.bytes_done for f in self.flows)
        goodput = delivered * 8 / completion if completion > 0 else 0.0
        senders = len({f.src for f in self.flows})
        capacity = cfg.fabric.planes * cfg.host_rate_bps() * senders
        stats = self.net.stats()
        drops = dict(stats.drops, unknown_qpn=self.unknown_qpn)
        return SimResult(
            bytes_delivered=delivered,
            verified=all(f.verified for f in flows),
            completion_time_s=completion,
            goodput_bps=goodput,
            capacity_bps=capacity,
            goodput_fraction=goodput / capacity,
            retransmissions=_sum_counts([f.retransmissions for f in flows]),
            trims=stats.trims,
            ecn_marks=stats.ecn_marks,
            drops=drops,
            ev_state_changes=self.ev_changes,
            per_plane_bytes=tuple(
                sum(f.plane_bytes[p] for f in self.flows) for p in range(cfg.fabric.planes)
            ),
            flows=flows,
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
        )

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


def run(cfg: SimConfig, *, connection_factory: ConnectionFactory | None = None) -> SimResult:
    """Simulate ``cfg`` to completion (or ``max_sim_time_s``) and report what happened.

    ``connection_factory`` replaces the real ``Connection`` (the benchmark wraps it to time
    the core); it must behave like :class:`Connection`.
    """
    return _Simulation(cfg, connection_factory or _real_connection).run()
