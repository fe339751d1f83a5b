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


Window = LinkFailure | SwitchFailure | NicDown


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One scenario.  Times in seconds, rates in bit/s, sizes in bytes."""

    fabric: Fabric = field(default_factory=Fabric)
    pairs: tuple[tuple[int, int], ...] = ()  # (src, dst) hosts; () = one flow h0 -> last host
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

    def retry_budget_s(self) -> float:
        """How long a flow's connection may go without progress before it fails: the
        defaults' ``ConnectionConfig.retry_budget`` (RTO base = the minimum timeout)."""
        return ConnectionConfig(1, 2, self.fabric.planes, (EvEntry(0, 0),)).retry_budget()

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
        n = len(self.flows())
        for index in self.latency_flows:
            if not 0 <= index < n:
                raise ValueError(f"latency flow {index} is not a flow (0..{n - 1})")
        if self.latency_writes < 1 or self.latency_write_bytes < 1:
            raise ValueError("latency_writes and latency_write_bytes must be >= 1")
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


def ev_profile(
    cfg: SimConfig, src: int, dst: int, rng: random.Random | None = None
) -> tuple[EvEntry, ...]:
    """EVs from src to dst: the address plan's default profile (:func:`addrplan.ev_profile`).

    In RoCE mode the connection uses only the first EV; with ``rng`` the list is rotated to
    a random start, like an ECMP hash picking one path per flow.
    """
    evs = list(addrplan.ev_profile(cfg.fabric, src, dst, cfg.ev_count))
    if cfg.mode == "roce" and rng is not None:
        start = rng.randrange(len(evs))
        evs = evs[start:] + evs[:start]
    return tuple(evs)
