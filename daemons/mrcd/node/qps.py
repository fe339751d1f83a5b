"""The records behind a node's QPs: states, MRC attributes, contexts, connection requests.

Plain data shared by the node's parts (``qptable.py`` keeps the table, ``connect.py`` connects
its QPs, ``ports.py``, ``peers.py`` and ``events.py`` act on them) and the API server
(``appapi/qp.py``, ``appapi/session.py``).
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from mrcstack.core.config import ConnectionConfig, ConnectionStats
from mrcstack.core.events import Event
from mrcstack.core.evs import EvStatus
from mrcstack.core.memory import MemoryTable
from mrcstack.core.reasons import EvReason


class RecoveryState(Protocol):
    @property
    def srtt(self) -> float | None: ...

    def rto(self) -> float: ...


class QpConnection(Protocol):
    """What the node's parts use of a QP's connection: the core's ``Connection`` in the
    daemon's process, or a worker's (``workers.remote.RemoteConnection``)."""

    @property
    def cfg(self) -> ConnectionConfig: ...
    @property
    def plain(self) -> bool: ...
    @property
    def failed(self) -> str | None: ...
    @property
    def stats(self) -> ConnectionStats: ...
    @property
    def recovery(self) -> RecoveryState: ...
    @property
    def idle(self) -> bool: ...

    def ev_states(self) -> tuple[EvStatus, ...]: ...
    def retry_budget(self) -> float: ...
    def window(self) -> tuple[int, int]: ...
    def next_event(self) -> Event | None: ...
    def abort(self, reason: str) -> None: ...
    def peer_gone(self, reason: str) -> None: ...
    def set_port_state(self, port: int, up: bool, now: float) -> None: ...
    def set_peer_ports(self, bits: int, now: float) -> bool: ...
    def set_ev_min_active(self, count: int) -> None: ...
    def deny_evs(self, values: Iterable[int], *, now: float, reason: EvReason = ...) -> int: ...
    def allow_evs(self, values: Iterable[int], *, now: float, reason: EvReason = ...) -> int: ...


class QpState(enum.Enum):
    """Verbs QP states, as far as MRC uses them."""

    RESET = "reset"
    RTS = "rts"  # connected: ready to send
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class QpAttrs:
    """MRC QP attributes (mrc.h names).  Durations in seconds."""

    max_wimm: int = 1024
    max_wimm_dest: int = 1024
    # Minimum retransmission timeout.  A Python endpoint on a busy host is sometimes not
    # scheduled for several milliseconds (CFS time slices): a smaller floor turns those
    # silences into spurious timeouts.  Losses on a live connection are found by RACK.
    timeout: float = 10e-3
    linear_cnt: int = 3
    exp_cnt: int = 6
    ev_profile_id: int = 0
    cc_profile_id: int = 0
    mtu_payload: int = 8192
    ack_coalesce: int | None = None  # None: the daemon's setting


@dataclass(frozen=True, slots=True)
class IncomingConnect:
    """A peer asks to connect one of its QPs to a service we listen on."""

    remote_host: int
    remote_qpn: int
    remote_psn: int
    service: int
    private_data: bytes
    request_id: int


@dataclass(frozen=True, slots=True)
class Accepted:
    qpn: int
    psn: int
    private_data: bytes
    #: Set once the peer's CONNECT is answered: None if the QP is in RTS, else why not.
    connected: asyncio.Future[str | None] = field(compare=False, repr=False)


class Context:
    """One application connection: a protection domain with its regions and QPs."""

    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.memory = MemoryTable(rkey_seed=random.SystemRandom().randrange(1, 1 << 31))
        self.qpns: set[int] = set()
        self.services: set[int] = set()


@dataclass(slots=True)
class Qp:
    qpn: int
    ctx: Context
    attrs: QpAttrs
    on_event: Callable[[int, Event], None]
    psn: int
    state: QpState = QpState.RESET
    remote_host: int = -1
    remote_qpn: int = -1
    conn: QpConnection | None = None
    failure: str | None = None
    #: The peer mrcd's instance when the QP connected ("" if it sent none): a later
    #: session to a different instance means the peer restarted and this QP is gone there.
    peer_instance: str = ""
    #: wr_id -> when it was posted, until its completion (the write-completion histogram).
    posted: dict[int, float] = field(default_factory=dict)
    #: wr_id -> the application's wr_id, until the write completes successfully (kept for a
    #: failed one, whose error text names it).
    labels: dict[int, int] = field(default_factory=dict)
