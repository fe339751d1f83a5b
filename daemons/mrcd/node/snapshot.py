"""What the metrics exporter reads of a node: one frozen :class:`NodeSnapshot` per scrape.

The node keeps plain integers on the hot path (the core's ``ConnectionStats``, the
transport's ``TransportStats``, its own :class:`NodeCounters`) and :func:`scrape` builds a
snapshot only when asked; :mod:`mrcstack.daemons.mrcd.ops.metrics` turns it into metric
families.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from mrcstack import __version__
from mrcstack.core.config import ConnectionStats
from mrcstack.daemons.mrcd.config import MrcdConfig
from mrcstack.daemons.mrcd.control.server import ControlStats
from mrcstack.daemons.mrcd.datapath.probes import Prober
from mrcstack.daemons.mrcd.node.peers import PeerWatch
from mrcstack.daemons.mrcd.node.ports import Ports
from mrcstack.daemons.mrcd.node.qps import Qp, QpConnection, QpState
from mrcstack.daemons.mrcd.node.workers.pool import DataPath, WorkerPool

#: Histogram bounds in seconds, 1-2-5 per decade from 1 us to 10 s (22 buckets plus +Inf).
DEFAULT_BOUNDS: tuple[float, ...] = (
    *(float(f"{m}e{e}") for e in range(-6, 1) for m in (1, 2, 5)),
    10.0,
)


# Histograms ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """Cumulative bucket counts: ``cumulative[i]`` counts observations <= ``bounds[i]``;
    the last entry (one more than ``bounds``) is the +Inf bucket, i.e. the total count."""

    bounds: tuple[float, ...] = DEFAULT_BOUNDS
    cumulative: tuple[int, ...] = (0,) * (len(DEFAULT_BOUNDS) + 1)
    sum: float = 0.0

    def __post_init__(self) -> None:
        if len(self.cumulative) != len(self.bounds) + 1:
            raise ValueError("cumulative needs one count per bound plus +Inf")

    @property
    def count(self) -> int:
        return self.cumulative[-1]

    def __add__(self, other: HistogramSnapshot) -> HistogramSnapshot:
        if self.bounds != other.bounds:
            raise ValueError("cannot add histograms with different bounds")
        return HistogramSnapshot(
            self.bounds,
            tuple(a + b for a, b in zip(self.cumulative, other.cumulative, strict=True)),
            self.sum + other.sum,
        )


class Buckets:
    """A histogram cheap enough for the hot path: one bisect and two additions."""

    __slots__ = ("_counts", "_sum", "bounds")

    def __init__(self, bounds: Sequence[float] = DEFAULT_BOUNDS) -> None:
        b = tuple(float(x) for x in bounds)
        if not b or any(not math.isfinite(x) for x in b) or list(b) != sorted(set(b)):
            raise ValueError("bounds must be finite, strictly increasing and not empty")
        self.bounds = b
        self._counts = [0] * (len(b) + 1)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        if math.isnan(seconds):  # nothing sensible to count
            return
        if seconds < 0.0:
            seconds = 0.0
        # bisect_left: a value equal to a bound belongs to that bucket (le is inclusive).
        self._counts[bisect_left(self.bounds, seconds)] += 1
        self._sum += seconds

    def merge(self, counts: Sequence[int], seconds: float) -> None:
        """Add another histogram's observations (per bucket, as ``observe`` counts them;
        a data-path worker's) and their sum."""
        if len(counts) != len(self._counts):
            raise ValueError(f"{len(counts)} bucket counts for {len(self._counts)} buckets")
        for i, n in enumerate(counts):
            self._counts[i] += n
        self._sum += seconds

    def snapshot(self) -> HistogramSnapshot:
        total = 0
        cumulative = []
        for n in self._counts:
            total += n
            cumulative.append(total)
        return HistogramSnapshot(self.bounds, tuple(cumulative), self._sum)


# The snapshot: the contract between the node and the metrics -------------------------------
def _empty() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class TrafficCounters:
    """Cumulative data-path counters, summed over live and closed connections.

    Per-plane tuples are indexed by plane.  Reason maps use the core's reason names (see
    ``RETRANSMIT_REASONS``, ``NACK_REASONS``, ``REJECT_REASONS``).
    """

    packets_sent: tuple[int, ...] = ()
    bytes_sent: tuple[int, ...] = ()
    packets_received: tuple[int, ...] = ()
    bytes_received: tuple[int, ...] = ()
    data_bytes_placed: int = 0
    retransmissions: Mapping[str, int] = field(default_factory=_empty)
    spurious_retransmissions: int = 0
    tlp_unneeded: int = 0
    trims_received: int = 0
    nacks_received: Mapping[str, int] = field(default_factory=_empty)
    ecn_echoes: int = 0
    ecn_received: int = 0
    duplicates: int = 0
    rejections: Mapping[str, int] = field(default_factory=_empty)
    ev_state_changes: int = 0
    probes_sent: int = 0
    probe_replies: int = 0
    send_errors: int = 0


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """What one scrape sees of a node (``Node.snapshot()``); built on the loop, read once."""

    host: str  # the fabric host name, e.g. "h0"
    version: str
    planes: int
    start_time: float = 0.0  # unix time the daemon started
    port_link_up: tuple[bool, ...] = ()  # per plane: carrier (netlink)
    port_admin_up: tuple[bool, ...] = ()  # per plane: the controller's admin state
    connections: int = 0  # live (RTS) connections
    #: EV state value (EvState.value) -> number of EVs in that state, per plane, summed
    #: over live connections (EVs not in use count as "unknown").
    evs: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))
    traffic: TrafficCounters = field(default_factory=TrafficCounters)
    rtt: HistogramSnapshot = field(default_factory=HistogramSnapshot)
    write_completion: HistogramSnapshot = field(default_factory=HistogramSnapshot)
    control_auth_failures: int = 0  # control-channel peers that failed authentication
    #: Other control-channel connections closed, by reason (control/server.py REJECT_REASONS).
    control_rejections: Mapping[str, int] = field(default_factory=_empty)
    #: Peers' QPs failed early because the peer was found gone, by signal (peers.SIGNALS).
    peer_failures: Mapping[str, int] = field(default_factory=_empty)
    #: EV probes answered, by how they were authenticated (probes.ProbeAuth values).
    probe_answers: Mapping[str, int] = field(default_factory=_empty)
    #: The longest retry budget of a live QP: the latest a silent peer fails a QP.
    retry_budget: float = 0.0
    workers: int = 1  # data-path processes
    worker_restarts: int = 0
    #: Live QPs each data-path worker carries, by worker (one worker: every live QP).
    worker_qps: tuple[int, ...] = ()
    #: CPU seconds each data-path worker has used, by worker (one worker: the daemon's own
    #: process, its control plane included).
    worker_cpu: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.planes < 0:
            raise ValueError("planes must be >= 0")
        t = self.traffic
        per_plane = {
            "port_link_up": self.port_link_up,
            "port_admin_up": self.port_admin_up,
            "traffic.packets_sent": t.packets_sent,
            "traffic.bytes_sent": t.bytes_sent,
            "traffic.packets_received": t.packets_received,
            "traffic.bytes_received": t.bytes_received,
            **{f"evs[{k!r}]": v for k, v in self.evs.items()},
        }
        for name, values in per_plane.items():
            if values and len(values) != self.planes:
                raise ValueError(f"{name} has {len(values)} entries for {self.planes} planes")


class Totals:
    """Mutable sums of ``ConnectionStats``: keep one for closed connections (counters never
    go down), copy it at scrape time, add the live connections, :meth:`freeze`."""

    __slots__ = (
        "bytes_received",
        "bytes_sent",
        "ints",
        "maps",
        "packets_received",
        "packets_sent",
        "planes",
    )
    _INTS = (
        "data_bytes_placed",
        "spurious_retransmissions",
        "tlp_unneeded",
        "trims_received",
        "ecn_echoes",
        "ecn_received",
        "duplicates",
        "ev_state_changes",
        "probes_sent",
        "probe_replies",
    )

    def __init__(self, planes: int) -> None:
        self.planes = planes
        self.packets_sent = [0] * planes
        self.bytes_sent = [0] * planes
        self.packets_received = [0] * planes
        self.bytes_received = [0] * planes
        self.ints = dict.fromkeys((*self._INTS, "send_errors"), 0)
        self.maps: dict[str, dict[str, int]] = {
            "retransmissions": {},
            "nacks_received": {},
            "rejections": {},
        }

    def add(self, stats: ConnectionStats) -> None:
        for mine, theirs in (
            (self.packets_sent, stats.packets_sent),
            (self.bytes_sent, stats.bytes_sent),
            (self.packets_received, stats.packets_received),
            (self.bytes_received, stats.bytes_received),
        ):
            for i, n in enumerate(theirs[: self.planes]):
                mine[i] += n
        for name in self._INTS:
            self.ints[name] += getattr(stats, name)
        for name, table in (
            ("retransmissions", stats.retransmissions),
            ("nacks_received", stats.nacks_received),
            ("rejections", stats.rejected),
        ):
            self.add_reasons(name, table)

    def add_reasons(self, name: str, table: Mapping[str, int]) -> None:
        """Add ``table`` to the reason map ``name`` (retransmissions, nacks_received,
        rejections); e.g. the transport's ``unknown_qpn`` and ``malformed`` rejections."""
        mine = self.maps[name]
        for key, n in table.items():
            mine[key] = mine.get(key, 0) + n

    def add_send_errors(self, n: int) -> None:
        self.ints["send_errors"] += n

    def copy(self) -> Totals:
        other = Totals(self.planes)
        for name in ("packets_sent", "bytes_sent", "packets_received", "bytes_received"):
            setattr(other, name, list(getattr(self, name)))
        other.ints = dict(self.ints)
        other.maps = {k: dict(v) for k, v in self.maps.items()}
        return other

    def freeze(self) -> TrafficCounters:
        return TrafficCounters(
            packets_sent=tuple(self.packets_sent),
            bytes_sent=tuple(self.bytes_sent),
            packets_received=tuple(self.packets_received),
            bytes_received=tuple(self.bytes_received),
            retransmissions=MappingProxyType(dict(self.maps["retransmissions"])),
            nacks_received=MappingProxyType(dict(self.maps["nacks_received"])),
            rejections=MappingProxyType(dict(self.maps["rejections"])),
            **self.ints,
        )


def count_evs(planes: int, states: Iterable[tuple[int, str]]) -> Mapping[str, tuple[int, ...]]:
    """``(plane, EvState.value)`` pairs -> the ``NodeSnapshot.evs`` table (out of range
    planes are ignored)."""
    table: dict[str, list[int]] = {}
    for plane, state in states:
        if 0 <= plane < planes:
            table.setdefault(state, [0] * planes)[plane] += 1
    return MappingProxyType({k: tuple(v) for k, v in table.items()})


# The node's own counters, and the scrape --------------------------------------------------
class NodeCounters:
    """What the node counts itself, beside the core's and the transport's counters."""

    __slots__ = ("connections_total", "retired", "rtt", "write_completion")

    def __init__(self, planes: int) -> None:
        #: Closed connections' counters: they stay in the totals (Prometheus counters never
        #: go down).
        self.retired = Totals(planes)
        self.rtt = Buckets()
        self.write_completion = Buckets()  # from a write's post to its completion
        self.connections_total = 0


class Scraped(Protocol):
    """What a scrape reads of the node (:class:`.node.Node`)."""

    cfg: MrcdConfig
    started_at: float
    qps: dict[int, Qp]
    ports: Ports
    counters: NodeCounters
    transport: DataPath | None
    prober: Prober
    control_stats: ControlStats
    peers: PeerWatch

    def connections(self) -> list[QpConnection]: ...

    def retry_budget(self) -> float: ...


def scrape(node: Scraped) -> NodeSnapshot:
    """Everything the metrics exporter shows of ``node``, read now."""
    planes = node.cfg.fabric.planes
    conns = node.connections()
    totals = node.counters.retired.copy()
    for conn in conns:
        totals.add(conn.stats)
    if node.transport is not None:
        ts = node.transport.stats
        totals.add_reasons(
            "rejections",
            {
                "unknown_qpn": ts.unknown_qpn,
                "malformed": ts.malformed,
                "wrong_worker": ts.wrong_worker,
            },
        )
        totals.add_send_errors(ts.send_errors)
    totals.add_reasons("rejections", node.prober.rejected)
    connections = sum(1 for qp in node.qps.values() if qp.state is QpState.RTS)
    pool = node.transport if isinstance(node.transport, WorkerPool) else None
    answers = {a.value: n for a, n in node.prober.answers.items()}
    if pool is not None:  # the workers answer the probes with the ICRC themselves
        totals.add_reasons("rejections", pool.probe_counts("rejected"))
        for auth, n in pool.probe_counts("answers").items():
            answers[auth] = answers.get(auth, 0) + n
    return NodeSnapshot(
        host=node.cfg.host_name,
        version=__version__,
        planes=planes,
        start_time=node.started_at,
        port_link_up=tuple(node.ports.link),
        port_admin_up=tuple(node.ports.admin),
        connections=connections,
        evs=count_evs(
            planes,
            ((ev.port, ev.state.value) for c in conns for ev in c.ev_states()),
        ),
        traffic=totals.freeze(),
        rtt=node.counters.rtt.snapshot(),
        write_completion=node.counters.write_completion.snapshot(),
        control_auth_failures=sum(node.control_stats.auth_failures.values()),
        control_rejections=MappingProxyType(dict(node.control_stats.rejected)),
        peer_failures=MappingProxyType(dict(node.peers.failures)),
        probe_answers=MappingProxyType(answers),
        retry_budget=node.retry_budget(),
        workers=node.cfg.workers,
        worker_restarts=0 if pool is None else pool.restarts,
        worker_qps=(connections,) if pool is None else pool.qps_per_worker(),
        worker_cpu=(time.process_time(),) if pool is None else pool.cpu_per_worker(),
    )
