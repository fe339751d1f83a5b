"""What the daemon and its data-path workers tell each other: frozen, picklable records.

The daemon sends a worker its QPs (:class:`OpenQp`), their memory (:class:`AddRegion`, the
memfd travelling beside it), the application's posts and the node's calls on a connection
(:class:`Post`, :class:`Call`); a worker answers with its connections' events, a periodic
:class:`Status` (what the metrics and the controller API read), and the endpoint datagrams
that are not its own (:class:`Connectionless`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mrcstack.core.config import ConnectionConfig, ConnectionStats
from mrcstack.core.events import Event
from mrcstack.core.evs import EvStatus
from mrcstack.daemons.mrcd.config import MrcdConfig
from mrcstack.wire import EvFormat

#: Seconds between a worker's :class:`Status` messages: how stale what a scrape, ``mrcctl qp
#: show`` or a drain reads of a worker's QPs may be.
STATUS_INTERVAL = 0.1


class Op(enum.StrEnum):
    """The node's calls on a connection that a worker carries out (:class:`Call`)."""

    ABORT = "abort"
    PEER_GONE = "peer_gone"
    SET_PORT_STATE = "set_port_state"
    SET_PEER_PORTS = "set_peer_ports"
    DENY_EVS = "deny_evs"
    ALLOW_EVS = "allow_evs"
    SET_EV_MIN_ACTIVE = "set_ev_min_active"


# Daemon -> worker -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Start:
    """What a worker is started with (beside its sockets and its channel)."""

    index: int
    workers: int
    cfg: MrcdConfig
    bounds: tuple[float, ...]  # the RTT histogram's buckets


@dataclass(frozen=True, slots=True)
class OpenQp:
    """Build QP ``qpn``'s connection (its memory: context ``ctx``'s regions) and carry it."""

    qpn: int
    ctx: int
    config: ConnectionConfig
    remote: int
    seed: float  # the connection's random.Random
    now: float


@dataclass(frozen=True, slots=True)
class Prepare:
    """Resolve a new connection's paths before its first packet (``Transport.prepare``)."""

    remote: int
    paths: tuple[tuple[int, int], ...]
    fmt: EvFormat
    striped: bool


@dataclass(frozen=True, slots=True)
class CloseQp:
    qpn: int


@dataclass(frozen=True, slots=True)
class AddRegion:
    """Map context ``ctx``'s region (the memfd sent with this message) at ``va``/``rkey``."""

    ctx: int
    rkey: int
    va: int
    length: int
    access: int
    writable: bool


@dataclass(frozen=True, slots=True)
class DropRegion:
    ctx: int
    rkey: int


@dataclass(frozen=True, slots=True)
class Post:
    """An RDMA write from ``length`` bytes at ``local_va`` of the QP's context."""

    qpn: int
    wr_id: int
    local_va: int
    length: int
    remote_va: int
    rkey: int
    imm: int | None
    now: float


@dataclass(frozen=True, slots=True)
class Call:
    qpn: int
    op: Op
    args: tuple[object, ...]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An answer to one of this worker's QPs' EV probes, received by another worker."""

    data: bytes
    plane: int
    ev: int


@dataclass(frozen=True, slots=True)
class Keys:
    """The probe key the daemon shares with each peer host (``local``: our host index):
    the worker answers the EV probes that carry the ICRC itself, counted by whether their
    host is one we share a key with; sealed ones it hands to the daemon."""

    local: int
    keys: tuple[tuple[int, bytes], ...]


@dataclass(frozen=True, slots=True)
class Stop:
    pass


# Worker -> daemon -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Ready:
    """The worker reads its sockets and channel (its first message)."""

    pid: int


@dataclass(frozen=True, slots=True)
class Events:
    batch: tuple[tuple[int, Event], ...]


@dataclass(frozen=True, slots=True)
class QpStatus:
    """One connection as the node reads it between two :class:`Status` messages."""

    qpn: int
    stats: ConnectionStats
    evs: tuple[EvStatus, ...]
    rto: float
    srtt: float | None
    retry_budget: float
    window: tuple[int, int]  # the congestion window and the bytes in flight
    idle: bool
    posts: int  # posts carried out so far (the daemon's count says which it has not seen)


@dataclass(frozen=True, slots=True)
class Status:
    qps: tuple[QpStatus, ...]
    datagrams_in: int
    datagrams_out: int
    unknown_qpn: int
    malformed: int
    send_errors: int
    wrong_worker: int
    rtt_counts: tuple[int, ...]  # RTT samples since the last Status, per histogram bucket
    rtt_sum: float
    probe_answers: tuple[tuple[str, int], ...] = ()  # EV probes this worker answered, by auth
    probe_rejected: tuple[tuple[str, int], ...] = ()  # and refused, by reason


@dataclass(frozen=True, slots=True)
class Connectionless:
    """An endpoint datagram (QP 2) for none of this worker's QPs: the daemon's prober's,
    or another worker's probe answer."""

    data: bytes
    source: tuple[str, int]
    plane: int
    flow: int


ToWorker = (
    OpenQp | Prepare | CloseQp | AddRegion | DropRegion | Post | Call | Endpoint | Keys | Stop
)
FromWorker = Ready | Events | Status | Connectionless
