"""What the parts of the API server see of each other: the records a session keeps (regions,
CQs) and two narrow views, so the QP table, the session and the server import one way only
(server -> session -> QP table -> here)."""

from __future__ import annotations

import mmap
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mrcstack.api.types import Access, AsyncEventType, WcOpcode, WcStatus
from mrcstack.core.memory import MemoryRegion as CoreRegion
from mrcstack.daemons.mrcd.appapi.clientio import ClientIO, Peer
from mrcstack.daemons.mrcd.ctlapi.controller import Controller
from mrcstack.daemons.mrcd.node.node import Node
from mrcstack.daemons.mrcd.node.qps import Context

#: connect(qpn, remote_host, service, private_data) -> the peer's private data, QP in RTS.
#: node.connect_qp: (qpn, remote host, service, private data, timeout) -> peer's private data
Connector = Callable[[int, int, int, bytes, float], Awaitable[bytes]]


@dataclass(slots=True)
class Region:
    lkey: int
    region: CoreRegion
    mapping: mmap.mmap
    view: memoryview
    access: Access


@dataclass(slots=True, eq=False)
class Cq:
    handle: int
    cqe: int
    channel: int | None
    armed: bool = False
    delivered: int = 0  # completions queued for the client so far (u32, wraps)
    users: int = 0  # QPs that complete here


class ServerView(Protocol):
    """What a session uses of its server (:class:`.server.AppServer`)."""

    node: Node
    controller: Controller
    connector: Connector

    def privileged(self, peer: Peer) -> bool: ...

    def forget(self, session: Any) -> None: ...


class SessionView(Protocol):
    """What a session's QP table uses of it (:class:`.session.Session`)."""

    node: Node
    server: ServerView
    io: ClientIO
    regions: dict[int, Region]
    hints: dict[int, dict[str, int]]
    closed: bool

    def context(self) -> Context: ...

    def cq(self, args: dict[str, Any], key: str) -> Cq: ...

    def max_mtu_payload(self) -> int: ...

    def event(self, doc: dict[str, Any]) -> None: ...

    def complete(
        self,
        cq: Cq,
        qpn: int,
        wr_id: int,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: int,
        imm: int | None,
    ) -> None: ...

    def async_event(
        self, kind: AsyncEventType, *, qpn: int | None = None, port: int | None = None, reason: str
    ) -> None: ...
