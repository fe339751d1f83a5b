"""The probing agent: one timer runs the rounds, the session carries results and denylists.

Each round (every ``interval``, stretched if the share would exceed ``rate_limit`` probes a
second) it first reads its probe sockets dry, so a reply that waited while the daemon was
busy counts as back, then declares lost what is overdue, reports to the mapper, and sends
the next round.  A denylist from the mapper goes through the controller API
(``ctl.set_link_denylist``, as an operator's would), and the agent says back what it
denied.  Without a mapper the rounds go on and the last denylist stays in force.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mrcstack.api.errors import ApiError
from mrcstack.daemons.mrcd.agent.linkprobes import LinkProbes
from mrcstack.daemons.mrcd.agent.session import MapperSession
from mrcstack.daemons.mrcd.config import MapperAgentConfig, MrcdConfig
from mrcstack.daemons.mrcd.control.auth import Credentials
from mrcstack.daemons.mrcd.control.records import Message
from mrcstack.daemons.mrcd.ctlapi.controller import Controller
from mrcstack.mapper import messages
from mrcstack.mapper.agent import ProbeAgent
from mrcstack.mapper.plan import make_plan

log = logging.getLogger("mrcd.agent")


@dataclass(frozen=True, slots=True)
class AgentSnapshot:
    """What the metrics show of the agent."""

    interval: float
    loops: int
    probes_sent: int
    probes_back: int
    probes_lost: int
    rounds_void: int
    send_errors: int
    refused: Mapping[str, int]
    connected: bool
    sessions: int
    sessions_ended: Mapping[str, int]
    reports_dropped: int
    denylist_links: int
    denylist_version: int
    denied_evs: int


class MapperAgent:
    """The fabric mapper's agent in one mrcd: start in the running loop, stop to finish."""

    def __init__(self, cfg: MrcdConfig, controller: Controller) -> None:
        if cfg.mapper is None:
            raise ValueError("the config does not turn the probing agent on ([mrcd.mapper])")
        self.cfg = cfg
        self.settings: MapperAgentConfig = cfg.mapper
        self.controller = controller
        self.node = controller.node
        self.plan = make_plan(cfg.fabric, self.settings.overlap)
        share = self.plan.share(cfg.host)
        self.core = ProbeAgent(
            share, timeout=self.settings.timeout, short_repeat=self.settings.short_repeat
        )
        #: The round's period: the configured interval, longer if the rate limit says so.
        self.interval = max(self.settings.interval, self.core.per_round / self.settings.rate_limit)
        self.share = frozenset(p.ident for p in share)
        self.probes: LinkProbes | None = None
        self.session: MapperSession | None = None
        self.held: messages.Denylist | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        cfg = self.cfg
        devices = cfg.interfaces if cfg.bind_devices else ()
        self.probes = LinkProbes(
            cfg.fabric,
            cfg.host,
            self.settings,
            loopback=cfg.data_mode == "loopback",
            devices=devices,
            clock=time.monotonic_ns,
        )
        for plane, fd in enumerate(self.probes.filenos()):
            loop.add_reader(fd, self._readable, plane)
        creds = Credentials.from_config(cfg.host_name, cfg.auth)
        self.session = MapperSession(
            creds, self.settings.name, self.settings.address, self._hello, self._on_message
        )
        self.session.start()
        self._due = loop.time()
        self._timer = loop.call_at(self._due, self._tick)
        log.info(
            "event=agent_started loops=%d interval=%g mapper=[%s]:%d",
            len(self.share), self.interval, *self.settings.address,
        )  # fmt: skip

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.session is not None:
            await self.session.close()
        if self.probes is not None:
            if self._loop is not None:
                for fd in self.probes.filenos():
                    self._loop.remove_reader(fd)
            self.probes.close()
            self.probes = None

    # The rounds ----------------------------------------------------------------------------
    def _readable(self, plane: int) -> None:
        if self.probes is not None and self._loop is not None:
            self.probes.drain(self.core, self._loop.time(), plane)

    def _tick(self) -> None:
        loop, probes = self._loop, self.probes
        if loop is None or probes is None:
            return
        now = loop.time()
        probes.drain(self.core, now)  # whatever came back while we were busy is back
        self.core.settle(now)
        results = self.core.report()
        if results and self.session is not None:
            self.session.send(messages.report(0, results))
        probes.send(self.core.next_round(now))
        self._due += self.interval
        if self._due < now:  # behind by more than a round: start again from now
            self._due = now + self.interval
        self._timer = loop.call_at(self._due, self._tick)

    # The mapper ----------------------------------------------------------------------------
    def _hello(self) -> Message:
        return messages.hello(0, self.cfg.host, self.plan.digest, self.interval, self.held)

    def _on_message(self, msg: Message) -> None:
        listing = messages.parse_denylist(msg, self.plan)
        args = {
            "links": sorted(listing.links),
            "version": listing.version,
            "source": f"mapper {listing.instance}",
        }
        try:
            done: dict[str, Any] = self.controller.call("ctl.set_link_denylist", args, True, self)
        except ApiError as exc:  # the mapper sent what the controller API refuses
            raise messages.MessageError("bad_message", exc.message) from None
        self.held = listing
        if self.session is not None:
            self.session.send(
                messages.applied(0, listing.version, int(done["denied_evs"]), int(done["qps"]))
            )

    def push_ev_event(self, doc: dict[str, Any], limit: int) -> bool:
        """The controller API's subscriber interface: the agent subscribes to nothing."""
        return False

    def snapshot(self) -> AgentSnapshot:
        probes, session, denylist = self.probes, self.session, self.node.denylist
        return AgentSnapshot(
            interval=self.interval,
            loops=len(self.share),
            probes_sent=self.core.sent,
            probes_back=self.core.delivered_count,
            probes_lost=self.core.lost,
            rounds_void=self.core.void_rounds,
            send_errors=probes.send_errors if probes else 0,
            refused=dict(probes.refused) if probes else {},
            connected=session.connected if session else False,
            sessions=session.sessions if session else 0,
            sessions_ended=dict(session.ended) if session else {},
            reports_dropped=session.dropped if session else 0,
            denylist_links=len(denylist.links),
            denylist_version=denylist.version,
            denied_evs=denylist.denied(),
        )
