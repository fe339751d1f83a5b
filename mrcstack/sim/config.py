"""Scenario description: :class:`SimConfig`, the fault windows, and their validation, plus
the per-path settings derived from a scenario (:func:`ev_profile`, :meth:`SimConfig.cc_for`).

A :class:`SimConfig` checks itself when built (hosts, sizes, modes, failure targets and
network parameters), so :func:`mrcstack.sim.runner.run` only ever sees a valid scenario.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from mrcstack import addrplan
from mrcstack.core import cc as cc_registry
from mrcstack.core.cc import CCParams
from mrcstack.core.config import MODES, ConnectionConfig
from mrcstack.core.evs import EvEntry
from mrcstack.fabric import Fabric
from mrcstack.mapper.localize import Params
from mrcstack.sim.network import (
    DEFAULT_LINK_DELAY_S,
    DEFAULT_RATE_BPS,
    WIRE_OVERHEAD_BYTES,
    NetParams,
)

DEFAULT_BYTES = 16 << 20
DEFAULT_MTU_PAYLOAD = 4096
DEFAULT_EV_COUNT = 128
MAX_EV_COUNT = 1 << 16
DEFAULT_MAX_SIM_TIME_S = 1.0
#: Largest data header + trailer (BTH 12, RETH 16, ImmDt 4, MRCX 28, GCM tag 16): sizes a
#: full packet for the base-RTT estimate.
DATA_PACKET_OVERHEAD_BYTES = 76
MAX_TIMELINE_BINS = 10_000_000


@dataclass(frozen=True, slots=True)
class LinkFailure:
    """A physical link (either direction's name) down from ``start`` until ``end`` (s).  A
    host's own link taken down is carrier loss at its NIC port: its connections are told."""

    link: str
    start: float
    end: float | None = None


@dataclass(frozen=True, slots=True)
class SwitchFailure:
    """Every link of a switch (node name, e.g. ``p0-t1a``) down during the window.  A T0's
    hosts lose carrier on that plane's NIC port, and their connections are told so."""

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


@dataclass(frozen=True, slots=True)
class PlaneFailure:
    """A whole plane fails: every switch and link of it down during the window, so every
    host loses carrier on that plane's NIC port (what one flag says for many switches)."""

    plane: int
    start: float
    end: float | None = None


Window = LinkFailure | SwitchFailure | NicDown | PlaneFailure


@dataclass(frozen=True, slots=True)
class LossChange:
    """From ``at`` (s) on, random loss ``loss`` on one physical link, or on every link when
    ``link`` is None: loss that changes over time is a list of these."""

    at: float
    loss: float
    link: str | None = None


@dataclass(frozen=True, slots=True)
class MapperSpec:
    """The fabric mapper in a run (:mod:`mrcstack.sim.probing`): from ``start`` every host
    probes its loops each ``interval`` and the localizer judges the links; every
    connection keeps the denylist.  The localizer's windows are counted in rounds (100,
    250 and 500 by default: 1, 2.5 and 5 s at the testbed's 10 ms), so a run at another
    interval sees as many probes per window; the hold-down is in seconds."""

    interval: float = 1e-3
    start: float = 0.0
    timeout: float | None = None  # None: two intervals
    overlap: int = 2
    short_repeat: int = 1
    down_after: int = 3
    loss_threshold: float = 0.005
    confidence: float = 0.99
    hold_down: float = 10.0
    windows: tuple[int, ...] = (100, 250, 500)  # rounds
    bucket: int = 25  # rounds
    stale_after: int = 100  # rounds
    deny: bool = True  # False: the mapper only watches (no denylist reaches a connection)

    def __post_init__(self) -> None:
        if not 0 < self.interval < float("inf") or not 0 <= self.start < float("inf"):
            raise ValueError("mapper interval must be positive and its start >= 0")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"mapper timeout must be positive, got {self.timeout}")
        if not 1 <= self.overlap <= 16 or self.short_repeat < 1:
            raise ValueError("mapper overlap must be in 1..16 and short_repeat >= 1")
        self.params()  # checks the localizer's settings

    def params(self) -> Params:
        return Params(
            down_after=self.down_after,
            loss_threshold=self.loss_threshold,
            confidence=self.confidence,
            windows=tuple(w * self.interval for w in self.windows),
            bucket=self.bucket * self.interval,
            hold_down=self.hold_down,
            stale_after=self.stale_after * self.interval,
        )


@dataclass(frozen=True, slots=True)
class FlowSpec:
    """One flow in detail: its own size, when it starts, what it waits for, and its EVs.

    A flow starts at ``start_s`` or when the last flow in ``after`` (indices of earlier
    flows) completed, whichever is later; a flow whose prerequisite failed never starts.
    That is how a collective is written: each step's flows wait for the previous step's.
    ``evs`` pins the flow to these EV values, in this order, at both ends (each value
    names its plane and T1, :func:`mrcstack.addrplan.ev_value`); ``planes`` keeps only the
    EVs of these planes.  ``group`` labels the flow for per-group results (a step, a
    collective, an incast).
    """

    src: int
    dst: int
    bytes: int | None = None  # None = SimConfig.bytes_per_flow
    start_s: float = 0.0
    after: tuple[int, ...] = ()
    evs: tuple[int, ...] = ()
    planes: tuple[int, ...] = ()
    group: str = ""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One scenario.  Times in seconds, rates in bit/s, sizes in bytes."""

    fabric: Fabric = field(default_factory=Fabric)
    pairs: tuple[tuple[int, int], ...] = ()  # (src, dst) hosts; () = one flow h0 -> last host
    flow_specs: tuple[FlowSpec, ...] = ()  # instead of pairs: flows with their own settings
    bytes_per_flow: int = DEFAULT_BYTES
    wr_size: int | None = None  # None = 1 MiB work requests (runner.DEFAULT_WR_SIZE)
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
    plane_failures: tuple[PlaneFailure, ...] = ()
    loss_changes: tuple[LossChange, ...] = ()  # applied in time order over loss/link_loss
    ecn_last_hop: bool = False  # also mark on switch ports facing hosts (DCQCN-style)
    # Every N-th data packet arriving at a receiver records its one-way latency (send to
    # arrival) in FlowResult.packet_latency_s; 0 = none.
    packet_latency_every: int = 0
    mtu_payload: int = DEFAULT_MTU_PAYLOAD
    ev_count: int = DEFAULT_EV_COUNT
    seed: int = 0
    max_sim_time_s: float = DEFAULT_MAX_SIM_TIME_S
    series_interval_s: float | None = None  # per-interval delivered bytes in the timeline
    # Latency probes: these flows (indices into the flows) post ``latency_writes`` writes of
    # ``latency_write_bytes``, one in flight at a time, and report each write's completion
    # latency (post to SendCompleted) in ``FlowResult.write_latency_s``.
    latency_flows: tuple[int, ...] = ()
    latency_writes: int = 256
    latency_write_bytes: int = 4096
    # The fabric mapper: probes, localization and denylists during the run (None: none).
    mapper: MapperSpec | None = None

    def retry_budget_s(self) -> float:
        """How long a flow's connection may go without progress before it fails: the
        defaults' ``ConnectionConfig.retry_budget`` (RTO base = the minimum timeout)."""
        return ConnectionConfig(1, 2, self.fabric.planes, (EvEntry(0, 0),)).retry_budget()

    def __post_init__(self) -> None:
        hosts = self.fabric.hosts
        if hosts < 2:
            raise ValueError("the fabric needs at least two hosts")
        if self.pairs and self.flow_specs:
            raise ValueError("give pairs or flow specs, not both")
        for index, spec in enumerate(self.flow_specs):
            self._check_spec(index, spec)
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
        for plane in self.plane_failures:
            self.fabric.check_plane(plane.plane)
        for change in self.loss_changes:
            if not 0 <= change.at < float("inf"):
                raise ValueError(f"bad loss change {change}: need 0 <= at")
            if not 0.0 <= change.loss <= 1.0:
                raise ValueError(f"loss change at {change.at}: {change.loss} is not in [0, 1]")
            if change.link is not None:
                addrplan.parse_link(change.link, self.fabric)
        if self.packet_latency_every < 0:
            raise ValueError(f"packet_latency_every must be >= 0, got {self.packet_latency_every}")
        for link in (*(w.link for w in self.link_failures), *(n for n, _ in self.link_loss)):
            addrplan.parse_link(link, self.fabric)
        for switch in self.switch_failures:
            _check_switch(self.fabric, switch.switch)
        n = len(self.flows())
        for index in self.latency_flows:
            if not 0 <= index < n:
                raise ValueError(f"latency flow {index} is not a flow (0..{n - 1})")
        if self.latency_writes < 1 or self.latency_write_bytes < 1:
            raise ValueError("latency_writes and latency_write_bytes must be >= 1")
        self.net_params()  # checks rates, probabilities and thresholds

    def _check_spec(self, index: int, spec: FlowSpec) -> None:
        where = f"flow {index} ({spec.src}:{spec.dst})"
        for host in (spec.src, spec.dst):
            if not 0 <= host < self.fabric.hosts:
                raise ValueError(f"{where}: host {host} not in 0..{self.fabric.hosts - 1}")
        if spec.src == spec.dst:
            raise ValueError(f"{where}: a flow needs two different hosts")
        if spec.bytes is not None and spec.bytes < 1:
            raise ValueError(f"{where}: bytes must be >= 1, got {spec.bytes}")
        if not 0 <= spec.start_s < float("inf"):
            raise ValueError(f"{where}: start must be >= 0, got {spec.start_s}")
        for before in spec.after:
            if not 0 <= before < index:
                raise ValueError(f"{where}: can only wait for an earlier flow, not {before}")
        for plane in spec.planes:
            self.fabric.check_plane(plane)
        for ev in spec.evs:
            fields = addrplan.ev_fields(ev)
            if fields.plane >= self.fabric.planes or fields.t1 >= self.fabric.t1_per_plane:
                raise ValueError(f"{where}: EV {ev:#x} names no path of this fabric")
        if (
            spec.evs
            and spec.planes
            and not any(addrplan.ev_fields(ev).plane in spec.planes for ev in spec.evs)
        ):
            raise ValueError(f"{where}: none of its EVs is on its planes")

    def specs(self) -> tuple[FlowSpec, ...]:
        """Every flow in detail (plain pairs become specs with the scenario's defaults)."""
        return self.flow_specs or tuple(FlowSpec(src, dst) for src, dst in self.flows())

    def flows(self) -> tuple[tuple[int, int], ...]:
        if self.flow_specs:
            return tuple((spec.src, spec.dst) for spec in self.flow_specs)
        return self.pairs or ((0, self.fabric.hosts - 1),)

    def windows(self) -> tuple[Window, ...]:
        return (*self.link_failures, *self.switch_failures, *self.nic_downs, *self.plane_failures)

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
            ecn_last_hop=self.ecn_last_hop,
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

    def ideal_fct(self, src: int, dst: int, nbytes: int, planes: int) -> float:
        """A floor no flow can beat: its payload at line rate on ``planes`` planes, plus the
        propagation there and back (headers, hops' serialization and queues all excluded),
        so a flow's slowdown against it is at least 1."""
        hops = 2 if self.fabric.rack_of(src) == self.fabric.rack_of(dst) else 4
        return nbytes * 8 / (planes * self.host_rate_bps()) + 2 * hops * self.link_delay_s

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


def ev_profile(
    cfg: SimConfig,
    src: int,
    dst: int,
    rng: random.Random | None = None,
    spec: FlowSpec | None = None,
) -> tuple[EvEntry, ...]:
    """EVs from src to dst: the address plan's default profile (:func:`addrplan.ev_profile`),
    or the flow's pinned EVs; only those of the flow's planes when it names planes.

    In RoCE mode the connection uses only the first EV; with ``rng`` the list is rotated to
    a random start, like an ECMP hash picking one path per flow.
    """
    if spec is not None and spec.evs:
        evs = [EvEntry(ev, addrplan.ev_fields(ev).plane) for ev in spec.evs]
    else:
        evs = list(addrplan.ev_profile(cfg.fabric, src, dst, cfg.ev_count))
    if spec is not None and spec.planes:
        evs = [e for e in evs if e.port in spec.planes]
    if cfg.mode == "roce" and rng is not None:
        start = rng.randrange(len(evs))
        evs = evs[start:] + evs[:start]
    return tuple(evs)
