"""Peers' connection requests, matched with the applications listening for them.

A peer's CONNECT (over the control channel) names a service.  The application listening on
it (the API's ``listen``) is offered an :class:`IncomingConnect` and answers with ``accept``
(naming a QP of its own) or ``reject``; :meth:`Listeners.offer` waits for that answer, at
most ``timeout`` seconds, and the node replies to the peer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from mrcstack.daemons.mrcd.node.qps import Accepted, Context, IncomingConnect
from mrcstack.errors import LocalError

#: What a listening application is handed: the request (it answers later).
Listener = Callable[[IncomingConnect], Awaitable[None]]


class Listeners:
    """Services listened on, and the requests waiting for their application's answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        #: Requests nobody took: no listener, or no answer in time (an application's own
        #: reject is not counted).
        self.unanswered = 0
        self._services: dict[int, tuple[Context, Listener]] = {}
        self._pending: dict[int, asyncio.Future[Accepted | None]] = {}
        self._next_request = 1

    def listen(self, ctx: Context, service: int, on_request: Listener) -> None:
        if service in self._services:
            raise LocalError(f"service {service} already has a listener")
        self._services[service] = (ctx, on_request)
        ctx.services.add(service)

    def forget(self, ctx: Context) -> None:
        """The context closed: its services are no longer listened on."""
        for service in ctx.services:
            self._services.pop(service, None)

    def new_request_id(self) -> int:
        self._next_request += 1
        return self._next_request

    async def offer(self, req: IncomingConnect, timeout: float = 10.0) -> Accepted | None:
        """Hand a connection request to the listening application, wait for its accept."""
        entry = self._services.get(req.service)
        if entry is None:
            self.unanswered += 1
            return None
        fut: asyncio.Future[Accepted | None] = self.loop.create_future()
        self._pending[req.request_id] = fut
        try:
            await entry[1](req)
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self.unanswered += 1
            return None
        finally:
            self._pending.pop(req.request_id, None)

    def reject(self, request_id: int) -> None:
        """The listening application refused: the peer's CONNECT is answered at once."""
        fut = self._pending.get(request_id)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def accept(self, request_id: int, accepted: Accepted) -> None:
        fut = self._pending.get(request_id)
        if fut is None or fut.done():
            raise LocalError(f"no pending connection request {request_id}")
        fut.set_result(accepted)

    def close(self) -> None:
        """mrcd is stopping: every waiting request is answered with a refusal."""
        for fut in self._pending.values():
            if not fut.done():
                fut.set_result(None)
