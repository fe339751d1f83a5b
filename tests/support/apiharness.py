"""Test harness for the API servers: mrcd nodes in loopback data mode, on a loop in a thread.

The application side uses the blocking API from the test's thread, exactly like a program
would; the daemons run their asyncio loop in a background thread.  Nodes are complete
mrcds on ::1: plane sockets, the authenticated control channel (PSK) for connection setup,
and an API server each.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from mrcstack.api import (
    CompletionQueue,
    Context,
    Device,
    MemoryRegion,
    QueuePair,
    WorkCompletion,
)
from mrcstack.core.events import Event
from mrcstack.daemons.mrcd.agent.agent import MapperAgent
from mrcstack.daemons.mrcd.appapi.server import AppServer
from mrcstack.daemons.mrcd.config import AuthConfig, MapperAgentConfig, MrcdConfig
from mrcstack.daemons.mrcd.control.auth import Credentials
from mrcstack.daemons.mrcd.ctlapi.controller import Controller, EndpointOps
from mrcstack.daemons.mrcd.node.node import Node
from mrcstack.daemons.mrcd.ops.metrics import MetricsServer, serve
from mrcstack.daemons.mrcmapper.config import MapperConfig
from mrcstack.daemons.mrcmapper.metrics import make_registry as make_mapper_registry
from mrcstack.daemons.mrcmapper.server import AgentServer
from mrcstack.daemons.mrcmapper.service import MapperService
from mrcstack.fabric import Fabric
from tests.support.isolation import control_port, free_bases

FABRIC = Fabric(planes=4, racks=2, hosts_per_rack=2, t1_per_plane=4)
WAIT = 30.0  # safety limit for anything that should happen; never a timing assertion
T = TypeVar("T")


def node_config(host: int, port: int, psk: Path, hosts: tuple[int, ...] = (0, 3)) -> MrcdConfig:
    """Host ``host``'s mrcd in loopback data mode (data ports from ``port``), with ``hosts``
    as its peers and a pre-shared key."""
    return MrcdConfig(
        host=host,
        fabric=FABRIC,
        data_mode="loopback",
        data_port=port,
        control_address=("::1", control_port(port, host)),
        peers=tuple((f"h{h}", ("::1", control_port(port, h))) for h in hosts),
        auth=AuthConfig(mode="psk", psk_file=psk),
    )


class Recorder:
    """A node's event callback that keeps every event and wakes its waiters."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.changed = asyncio.Event()

    def __call__(self, qpn: int, event: Event) -> None:
        self.events.append(event)
        self.changed.set()

    async def wait_for(self, kind: type, count: int = 1, timeout: float = 30.0) -> list[Event]:
        """The first ``count`` events of type ``kind`` (waiting for them)."""

        async def until() -> list[Event]:
            while True:
                found = [e for e in self.events if isinstance(e, kind)]
                if len(found) >= count:
                    return found
                self.changed.clear()
                await self.changed.wait()

        return await asyncio.wait_for(until(), timeout)


class Daemons:
    """mrcd nodes with API servers; ``sockets[host]`` is each one's API socket path."""

    def __init__(
        self,
        tmp: Path,
        hosts: tuple[int, ...] = (0, 3),
        admin_uids: frozenset[int] = frozenset({0}),
        endpoint_ops: Callable[[dict[int, Node]], EndpointOps] | None = None,
        loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop,
        per_host: dict[int, dict[str, Any]] | None = None,
        mapper: MapperConfig | None = None,
        **config: Any,
    ) -> None:
        """``mapper``: an mrcmapper runs too, on ``::1`` (its listen and web addresses are
        chosen here), and every node runs its probing agent (loopback: each probe goes
        straight back to its own socket)."""
        self.tmp = tmp
        self.config = config  # more MrcdConfig fields for every node, e.g. encrypt=True
        self.per_host = per_host or {}  # and for one node only: {3: {"extensions": False}}
        self.hosts = hosts
        self.admin_uids = admin_uids
        self.endpoint_ops = endpoint_ops
        self.loop = loop_factory()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.nodes: dict[int, Node] = {}
        self.servers: dict[int, AppServer] = {}
        self.sockets: dict[int, Path] = {}
        self.mapper_config = mapper
        self.mapper: MapperService | None = None
        self.mapper_server: AgentServer | None = None
        self.mapper_web: MetricsServer | None = None
        self.mapper_port = 0
        self.agents: dict[int, MapperAgent] = {}

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def on_loop(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the daemons' loop (node state is only touched there)."""

        async def call() -> T:
            return fn()

        return self.run(call())

    def start(self) -> Daemons:
        self.thread.start()
        self.run(self._start())
        return self

    async def _start(self) -> None:
        # data ports and probe ports drawn together, so the two cannot overlap
        base, probes = free_bases(2, self.hosts, FABRIC.planes)
        psk = self.tmp / "cluster.key"
        psk.write_text(os.urandom(32).hex())
        agent: MapperAgentConfig | None = None
        if self.mapper_config is not None:
            await self.start_mapper()
            agent = MapperAgentConfig(("::1", self.mapper_port), probe_port=probes)
        for host in self.hosts:
            cfg = replace(node_config(host, base, psk, self.hosts), mapper=agent)
            node = Node(replace(cfg, **self.config, **self.per_host.get(host, {})), self.loop)
            await node.start()
            self.nodes[host] = node
        for host, node in self.nodes.items():
            ops = None if self.endpoint_ops is None else self.endpoint_ops(self.nodes)
            path = self.tmp / f"mrcd-h{host}.sock"
            server = AppServer(
                node,
                path,
                controller=Controller(node, ops),
                admin_uids=self.admin_uids,
            )
            await server.start()
            self.servers[host] = server
            self.sockets[host] = path
            if agent is not None:
                self.agents[host] = MapperAgent(node.cfg, server.controller)
                await self.agents[host].start()

    async def start_mapper(self) -> None:
        """Start the mapper (again: on the port it had before)."""
        cfg = self.mapper_config
        if cfg is None:
            raise ValueError("these daemons run no mapper")
        psk = self.tmp / "cluster.key"
        if not psk.exists():
            psk.write_text(os.urandom(32).hex())
        cfg = replace(cfg, auth=AuthConfig(mode="psk", psk_file=psk))
        self.mapper = MapperService(cfg)
        self.mapper_server = AgentServer(
            self.mapper, Credentials.from_config(cfg.name, cfg.auth), ("::1", self.mapper_port)
        )
        await self.mapper_server.start()
        self.mapper_port = self.mapper_server.address[1]
        service = self.mapper
        pages = {"/status": lambda: ("application/json", json.dumps(service.status()).encode())}
        self.mapper_web = await serve(make_mapper_registry(service.status), "[::1]:0", pages)

    async def stop_mapper(self) -> None:
        if self.mapper_web is not None:
            await self.mapper_web.stop()
        if self.mapper_server is not None:
            await self.mapper_server.stop()
        self.mapper = self.mapper_server = self.mapper_web = None

    def mapper_tick(self) -> None:
        """Judge now (mrcmapper's own loop does it every 50 ms)."""
        if self.mapper is not None:
            self.on_loop(self.mapper.tick)

    async def _stop(self) -> None:
        for agent in self.agents.values():
            await agent.stop()
        await self.stop_mapper()
        for server in self.servers.values():
            await server.stop()
        for node in self.nodes.values():
            await node.stop(drain_timeout=0.1)

    def stop(self) -> None:
        try:
            if self.thread.is_alive():
                self.run(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@dataclass
class End:
    """One side of a connection made through the application API."""

    ctx: Context
    cq: CompletionQueue
    qp: QueuePair
    mr: MemoryRegion


def end(d: Daemons, host: int, size: int, **qp: object) -> End:
    """A context on ``host`` with a CQ, a QP (``qp``: create_qp's keywords) and a region."""
    ctx = Device.open(d.sockets[host]).create_context()
    cq = ctx.create_cq()
    return End(ctx, cq, ctx.create_qp(cq, **qp), ctx.reg_mr(size))  # type: ignore[arg-type]


def connect(
    d: Daemons,
    size: int = 1 << 20,
    recvs: int = 64,
    service: int = 7,
    *,
    ends: tuple[End, End] | None = None,
    hello: bytes = b"hi",
    welcome: bytes = b"welcome",
    **qp: object,
) -> tuple[End, End]:
    """h0's QP connects to h3's, which posts ``recvs`` receive buffers and accepts; the
    private data goes both ways.  ``ends``: QPs made by the caller (else :func:`end`)."""
    a, b = ends if ends is not None else (end(d, 0, size, **qp), end(d, 3, size, **qp))
    listener = b.ctx.listen(service)
    if recvs:
        b.qp.post_recv(range(recvs))
    failure: list[BaseException] = []

    def accept() -> None:
        try:
            req = listener.get_request(timeout=WAIT)
            assert req is not None and req.remote_host == 0 and req.private_data == hello
            listener.accept(req, b.qp, welcome, timeout=WAIT)
        except BaseException as exc:
            failure.append(exc)

    t = threading.Thread(target=accept)
    t.start()
    try:
        assert a.qp.connect(3, service, hello, timeout=WAIT) == welcome
    finally:
        t.join(WAIT)
    if failure:
        raise failure[0]
    return a, b


def drain(cq: CompletionQueue, n: int) -> list[WorkCompletion]:
    """The next ``n`` completions of ``cq`` (fails if they do not come within WAIT)."""
    out: list[WorkCompletion] = []
    while len(out) < n:
        got = cq.poll_wait(n - len(out), timeout=WAIT)
        assert got, f"only {len(out)} of {n} completions"
        out += got
    return out


async def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll daemon state from inside its loop until ``predicate()`` holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.005)


Awaiter = Callable[[], Awaitable[None]]
