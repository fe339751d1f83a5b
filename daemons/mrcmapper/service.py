"""The mapper's state: the localizer fed by its agents, the denylist it pushes, what status
pages and metrics show.

Every report goes straight into the :class:`~mrcstack.mapper.localize.Localizer` and is
judged at once, so a verdict is out as soon as the report that proves it arrives; a timer
judges again (each quarter second, as the loss windows move on, and when a hold-down ends).
When the set of denied links changes, its new version goes to every agent.  An agent's
hello says which denylist it holds: links the mapper does not deny yet are taken as HELD, so
a mapper that restarted keeps its predecessor's denials until they have been good for a
hold-down, never clearing them on no evidence.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mrcstack import __version__
from mrcstack.daemons.mrcmapper.config import MapperConfig
from mrcstack.mapper import messages
from mrcstack.mapper.agent import PathResult
from mrcstack.mapper.cost import probe_cost
from mrcstack.mapper.localize import LinkChange, Localizer, changes_text
from mrcstack.mapper.plan import make_plan

log = logging.getLogger("mrcmapper")

#: Link changes kept for the status page.
HISTORY = 1000
#: Seconds between two judgements with no report in between.
TICK = 0.05


class AgentLink(Protocol):
    """How the service reaches one agent's session."""

    def send(self, msg: dict[str, Any]) -> bool: ...


@dataclass(slots=True)
class Agent:
    """One host's agent as the mapper knows it."""

    host: int
    link: AgentLink | None = None  # None: no session now
    interval: float = math.nan
    connected_at: float = math.nan  # unix time
    last_report: float = math.nan  # unix time
    reports: int = 0
    applied_version: int = 0  # of this mapper's denylists; 0: none applied yet
    applied_at: float = math.nan  # unix time its newest applied message came
    denied_evs: int = 0
    qps: int = 0
    sessions: int = 0


@dataclass(slots=True)
class Counters:
    reports: int = 0
    results: int = 0
    pushes: int = 0
    #: Connections and messages refused, by reason (auth, forged or replayed records, ...).
    rejected: dict[str, int] = field(default_factory=dict)


class MapperService:
    """The mapper: its agents, its localizer, its denylist."""

    def __init__(
        self,
        cfg: MapperConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.wall = wall
        self.plan = make_plan(cfg.fabric, cfg.overlap)
        self.localizer = Localizer(self.plan, cfg.params)
        self.shares = {
            h: frozenset(p.ident for p in self.plan.share(h)) for h in range(cfg.fabric.hosts)
        }
        self.instance = secrets.token_hex(8)
        self.version = 0
        self.denylist: frozenset[str] = frozenset()
        #: (version, unix time it was made, its links) of the newest denylists.
        self.versions: deque[tuple[int, float, tuple[str, ...]]] = deque(maxlen=HISTORY)
        self.agents = {h: Agent(h) for h in range(cfg.fabric.hosts)}
        self.history: deque[tuple[float, LinkChange]] = deque(maxlen=HISTORY)
        self.state_since: dict[str, float] = {}  # link -> unix time of its current state
        self.counters = Counters()
        self.started = wall()

    # Agents --------------------------------------------------------------------------------
    def hello(self, host: int, msg: dict[str, Any], link: AgentLink) -> None:
        """An agent's first message on a new session (raises MessageError if it is bad)."""
        hello = messages.parse_hello(msg, self.plan, host)
        agent = self.agents[host]
        agent.link = link
        agent.interval = hello.interval
        agent.connected_at = self.wall()
        agent.sessions += 1
        if hello.instance != self.instance:
            agent.applied_version = 0  # what it holds is another mapper's
            seeded = self.localizer.seed(hello.links, self.clock())
            if seeded:
                log.info(
                    "event=links_seeded host=h%d links=%s",
                    host, ",".join(c.link for c in seeded),
                )  # fmt: skip
                self._changed(seeded)
        log.info("event=agent_hello host=h%d interval=%g", host, hello.interval)
        self._push(agent)

    def report(self, host: int, msg: dict[str, Any]) -> None:
        results: Sequence[PathResult] = messages.parse_report(msg, self.shares[host])
        now = self.clock()
        agent = self.agents[host]
        agent.last_report = self.wall()
        agent.reports += 1
        self.counters.reports += 1
        self.counters.results += sum(r.sent for r in results)
        self.localizer.observe(results, now)
        self._judge(now)

    def applied(self, host: int, msg: dict[str, Any]) -> None:
        done = messages.parse_applied(msg)
        agent = self.agents[host]
        agent.applied_version = done.version
        agent.applied_at = self.wall()
        agent.denied_evs = done.denied
        agent.qps = done.qps

    def gone(self, host: int, link: AgentLink) -> None:
        agent = self.agents[host]
        if agent.link is link:
            agent.link = None

    def reject(self, reason: str) -> None:
        self.counters.rejected[reason] = self.counters.rejected.get(reason, 0) + 1

    # Judging -------------------------------------------------------------------------------
    def tick(self) -> None:
        self._judge(self.clock())

    def _judge(self, now: float) -> None:
        changes = self.localizer.evaluate(now)
        if changes:
            self._changed(changes)

    def _changed(self, changes: list[LinkChange]) -> None:
        wall = self.wall()
        for change, line in zip(changes, changes_text(changes), strict=True):
            self.history.append((wall, change))
            self.state_since[change.link] = wall
            log.info("event=link_state %s", line)
        denylist = self.localizer.denylist
        if denylist != self.denylist:
            self.denylist = denylist
            self.version += 1
            self.versions.append((self.version, wall, tuple(sorted(denylist))))
            log.info(
                "event=denylist version=%d links=%s",
                self.version, ",".join(sorted(denylist)) or "-",
            )  # fmt: skip
            for agent in self.agents.values():
                self._push(agent)

    def _push(self, agent: Agent) -> None:
        if agent.link is None:
            return
        listing = messages.Denylist(self.version, self.instance, self.denylist)
        if agent.link.send(messages.denylist(0, listing)):
            self.counters.pushes += 1

    # What status and metrics show --------------------------------------------------------
    def status(self) -> dict[str, Any]:
        now = self.clock()
        wall = self.wall()
        links = []
        for s in self.localizer.status(now):
            links.append(
                {
                    "link": s.link,
                    "plane": s.plane,
                    "a": s.a,
                    "b": s.b,
                    "state": s.state.value,
                    "since": self.state_since.get(s.link),
                    "loss": None if math.isnan(s.loss) else s.loss,
                    "rtt_s": None if math.isnan(s.rtt) else s.rtt,
                    "probes": s.probes,
                    "hold_until": None if s.hold_until is None else wall + s.hold_until - now,
                }
            )
        return {
            "mapper": self.cfg.name,
            "version": __version__,
            "instance": self.instance,
            "started": self.started,
            "now": wall,
            "hold_down_s": self.cfg.params.hold_down,
            "plan": {
                "digest": self.plan.digest,
                "loops": len(self.plan.paths),
                "overlap": self.plan.overlap,
                "cost": probe_cost(self.plan, self.cfg.interval).to_json(),
            },
            "fabric": {
                "planes": self.cfg.fabric.planes,
                "racks": self.cfg.fabric.racks,
                "hosts_per_rack": self.cfg.fabric.hosts_per_rack,
                "t1_per_plane": self.cfg.fabric.t1_per_plane,
            },
            "denylist": {
                "version": self.version,
                "links": sorted(self.denylist),
                "since": self.versions[-1][1] if self.versions else None,
                "history": [
                    {"version": v, "time": t, "links": list(links)} for v, t, links in self.versions
                ],
            },
            "switches_down": self.localizer.switches_down(),
            "links": links,
            "agents": [self._agent_json(a) for a in self.agents.values()],
            "history": [
                {
                    "time": t,
                    "link": c.link,
                    "state": c.new.value,
                    "was": c.old.value,
                    "evidence": c.evidence.value,
                    "loss": None if math.isnan(c.loss) else c.loss,
                }
                for t, c in self.history
            ],
            "counters": {
                "reports": self.counters.reports,
                "results": self.counters.results,
                "pushes": self.counters.pushes,
                "rejected": dict(sorted(self.counters.rejected.items())),
            },
        }

    def _agent_json(self, a: Agent) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {
            "host": f"h{a.host}",
            "connected": a.link is not None,
            "interval": num(a.interval),
            "connected_at": num(a.connected_at),
            "last_report": num(a.last_report),
            "reports": a.reports,
            "sessions": a.sessions,
            "applied_version": a.applied_version,
            "applied_at": num(a.applied_at),
            "current": a.applied_version == self.version,
            "denied_evs": a.denied_evs,
            "qps": a.qps,
        }
