"""The fabric mapper in the simulator: every host's agent sends its loops as packets through
the simulated fabric, and the mapper's own localizer judges the links.

The same sans-IO objects as on real hosts (:mod:`mrcstack.mapper`): each interval every
host's :class:`~mrcstack.mapper.agent.ProbeAgent` settles what is overdue, reports to the
:class:`~mrcstack.mapper.localize.Localizer` and sends its next round; a probe is a control
packet (strict priority, as DSCP 46) on the loop's links, lost where the network loses it.
:class:`SimMapper` reports every link change and, when asked, keeps the denylist in force
on connections (:meth:`SimMapper.deny_on`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from mrcstack import addrplan
from mrcstack.core.connection import Connection
from mrcstack.core.reasons import EvReason
from mrcstack.fabric import Fabric
from mrcstack.mapper.agent import ProbeAgent
from mrcstack.mapper.cost import IP_UDP_HEADER_BYTES, probe_bytes
from mrcstack.mapper.denylist import denied_evs
from mrcstack.mapper.localize import LinkChange, Localizer
from mrcstack.mapper.plan import ProbePlan, make_plan
from mrcstack.sim.config import MapperSpec
from mrcstack.sim.engine import Engine
from mrcstack.sim.network import Handler, Network

#: The network's ``send_packet``: (src, dst, plane, ev, message, length, is_data).
Sender = Callable[[int, int, int, int, Any, int, bool], None]

#: A probe's datagram on the simulated wire (the network adds the IPv6 and UDP headers).
PROBE_DATAGRAM = probe_bytes() - IP_UDP_HEADER_BYTES


class LoopProbe:
    """A probe in flight: its agent's sequence number.  ``qpn`` 0, as on the wire."""

    __slots__ = ("seq",)
    qpn = 0

    def __init__(self, seq: int) -> None:
        self.seq = seq


@dataclass(frozen=True, slots=True)
class Denial:
    """The denylist changed at ``at``: ``evs`` EV states changed on ``connections`` (none
    when the mapper only watches)."""

    at: float
    links: tuple[str, ...]
    evs: int
    connections: int


@dataclass(frozen=True, slots=True)
class ChangeRecord:
    """A link changed state (:class:`~mrcstack.mapper.localize.LinkChange`, as JSON)."""

    at: float
    link: str
    old: str
    new: str
    evidence: str
    loss: float | None


@dataclass(frozen=True, slots=True)
class MapperResult:
    """What the mapper did in a run (``SimResult.mapper``)."""

    rounds: int
    probes: int
    probes_lost: int
    changes: tuple[ChangeRecord, ...]
    denials: tuple[Denial, ...]
    first_denial_s: float | None
    #: Data packets sent on a path over a link of the denylist (in force, or the one the
    #: mapper would have pushed when it only watches) at the time they were sent.
    data_on_denied: int
    #: The same for feedback (ACKs, NACKs, the connections' probes).
    control_on_denied: int
    #: (sender, receiver) of every packet counted in either.
    pairs_on_denied: tuple[tuple[int, int], ...]
    #: (time, retransmissions so far per host) at every round where they had changed.
    retransmissions: tuple[tuple[float, tuple[int, ...]], ...] = ()


def _route_key(path_ident: int) -> int:
    """The route cache key of a loop: negative, so it never meets a real EV."""
    return -1 - path_ident


class SimMapper:
    """Agents on every host, the localizer, and the changes they produced."""

    def __init__(
        self,
        fabric: Fabric,
        engine: Engine,
        net: Network,
        spec: MapperSpec,
        *,
        plan: ProbePlan | None = None,
        on_change: Callable[[list[LinkChange], float], None] | None = None,
    ) -> None:
        self.fabric = fabric
        self.engine = engine
        self.net = net
        self.spec = spec
        self.plan = plan if plan is not None else make_plan(fabric, spec.overlap)
        self.localizer = Localizer(self.plan, spec.params())
        self.on_change = on_change
        timeout = spec.timeout if spec.timeout is not None else 2 * spec.interval
        self.agents = [
            ProbeAgent(self.plan.share(h), timeout=timeout, short_repeat=spec.short_repeat)
            for h in range(fabric.hosts)
        ]
        self.changes: list[LinkChange] = []
        self.denials: list[Denial] = []
        self._connections: list[tuple[int, int, Connection, Callable[[], None]]] = []
        self._link_denied: dict[int, frozenset[int]] = {}  # id(connection) -> EVs we denied
        for path in self.plan.paths:
            loop = addrplan.loop_path(fabric, path.host, path.plane, path.t1)
            net.add_route(path.host, path.host, path.plane, _route_key(path.ident), loop.links)
        self._tick_cb = self._tick
        self.rounds = 0
        self._denied: frozenset[str] = frozenset()  # the denylist in force (or watched)
        self._version = self._counted_version = 0
        self.data_on_denied = 0
        self.control_on_denied = 0
        self.pairs_on_denied: set[tuple[int, int]] = set()
        #: (time, retransmissions so far per host) at each round that changed them.
        self.retransmissions: list[tuple[float, tuple[int, ...]]] = []

    def counting(self, send: Sender) -> Sender:
        """``send`` (the network's ``send_packet``), counting the packets that go on a path
        over a link of the denylist (:attr:`MapperResult.data_on_denied`, ...)."""
        crosses: dict[tuple[int, int, int, int], bool] = {}
        fabric = self.fabric

        def counted(
            src: int, dst: int, plane: int, ev: int, msg: Any, length: int, is_data: bool
        ) -> None:
            if self._denied:
                if self._version != self._counted_version:
                    crosses.clear()
                    self._counted_version = self._version
                key = (src, dst, plane, ev)
                hit = crosses.get(key)
                if hit is None:
                    links = addrplan.path(fabric, src, dst, plane, ev).physical_links
                    hit = crosses[key] = not self._denied.isdisjoint(links)
                if hit:
                    if is_data:
                        self.data_on_denied += 1
                    else:
                        self.control_on_denied += 1
                    self.pairs_on_denied.add((src, dst))
            send(src, dst, plane, ev, msg, length, is_data)

        return counted

    def tap(self, host: int, handler: Handler) -> Handler:
        """``handler`` for what arrives at ``host``, with the host's probes taken out."""
        agent = self.agents[host]
        engine = self.engine

        def tapped(msg: Any, size: int, plane: int, ecn: bool) -> None:
            if type(msg) is LoopProbe:
                agent.delivered(msg.seq, engine.now)
            else:
                handler(msg, size, plane, ecn)

        return tapped

    def result(self) -> MapperResult:
        return MapperResult(
            rounds=self.rounds,
            probes=sum(a.sent for a in self.agents),
            probes_lost=sum(a.lost for a in self.agents),
            changes=tuple(
                ChangeRecord(
                    c.at,
                    c.link,
                    c.old.value,
                    c.new.value,
                    c.evidence.value,
                    None if math.isnan(c.loss) else c.loss,
                )
                for c in self.changes
            ),
            denials=tuple(self.denials),
            first_denial_s=self.denials[0].at if self.denials else None,
            data_on_denied=self.data_on_denied,
            control_on_denied=self.control_on_denied,
            pairs_on_denied=tuple(sorted(self.pairs_on_denied)),
            retransmissions=tuple(self.retransmissions),
        )

    def start(self) -> None:
        self.engine.at(self.spec.start, self._tick_cb)

    def attach_all(self) -> None:
        """Take every host's arrivals (a fabric that carries nothing but probes)."""
        for host in range(self.fabric.hosts):
            self.net.attach(host, self._handler(host))

    def _handler(self, host: int) -> Handler:
        return self.tap(host, lambda msg, size, plane, ecn: None)

    def _tick(self, _arg: object) -> None:
        now = self.engine.now
        localizer = self.localizer
        send = self.net.send_packet
        for host, agent in enumerate(self.agents):
            agent.settle(now)
            results = agent.report()
            if results:
                localizer.observe(results, now)
            for probe in agent.next_round(now):
                path = probe.path
                send(host, host, path.plane, _route_key(path.ident), LoopProbe(probe.seq),
                     PROBE_DATAGRAM, False)  # fmt: skip
        self.rounds += 1
        if self._connections:
            self._sample(now)
        changes = localizer.evaluate(now)
        if changes:
            self.changes.extend(changes)
            self._apply(now)
            if self.on_change is not None:
                self.on_change(changes, now)
        self.engine.at(now + self.spec.interval, self._tick_cb)

    def _sample(self, now: float) -> None:
        """Each host's retransmissions so far (its connections', both ends), once a round."""
        per_host = [0] * self.fabric.hosts
        for host, _, conn, _ in self._connections:
            per_host[host] += sum(conn.stats.retransmissions.values())
        if not self.retransmissions or self.retransmissions[-1][1] != tuple(per_host):
            self.retransmissions.append((now, tuple(per_host)))

    # Denylists on connections ------------------------------------------------------------
    def deny_on(self, host: int, peer: int, conn: Connection, pump: Callable[[], None]) -> None:
        """Keep the denylist in force on ``conn`` (at ``host``, to ``peer``); ``pump`` runs
        after its EV set changed."""
        self._connections.append((host, peer, conn, pump))
        if self.spec.deny:
            self._apply_one(host, peer, conn, pump, self.engine.now)

    def _apply(self, now: float) -> None:
        links = self.localizer.denylist
        if links == self._denied:
            return
        self._denied = links
        self._version += 1
        evs = touched = 0
        if self.spec.deny:
            for host, peer, conn, pump in self._connections:
                n = self._apply_one(host, peer, conn, pump, now)
                evs += n
                touched += n > 0
        self.denials.append(Denial(now, tuple(sorted(links)), evs, touched))

    def _apply_one(
        self, host: int, peer: int, conn: Connection, pump: Callable[[], None], now: float
    ) -> int:
        want = denied_evs(self.fabric, host, peer, conn.cfg.evs, self.localizer.denylist)
        had = self._link_denied.get(id(conn), frozenset())
        if want == had:
            return 0
        changed = conn.deny_evs(want - had, now=now, reason=EvReason.DENYLIST)
        changed += conn.allow_evs(had - want, now=now, reason=EvReason.DENYLIST)
        self._link_denied[id(conn)] = want
        if changed:
            pump()
        return changed

    # Results ------------------------------------------------------------------------------
    def first_change(self, links: Iterable[str], after: float = 0.0) -> float | None:
        """When the first change naming one of ``links`` happened (at or after ``after``)."""
        wanted = set(links)
        return next((c.at for c in self.changes if c.link in wanted and c.at >= after), None)

    def flagged(self, after: float = 0.0) -> set[str]:
        """Every link that left UP at or after ``after``."""
        return {c.link for c in self.changes if c.at >= after and c.old.value == "up"}


def localization_time(
    fabric: Fabric,
    spec: MapperSpec,
    *,
    fail_link: str | None = None,
    fail_switch: str | None = None,
    loss_link: tuple[str, float] | None = None,
    fault_at: float | None = None,
    horizon: float = 1.0,
    seed: int = 1,
    plan: ProbePlan | None = None,
) -> tuple[float, set[str], SimMapper]:
    """Probe ``fabric`` alone (no other traffic), inject one fault at ``fault_at`` (default:
    once the mapper has a full window of results), run ``horizon`` seconds more, and return
    the time from the fault to the localizer naming the faulty links, the links it flagged,
    and the mapper.  The time is NaN when it named none of them in the horizon."""
    engine = Engine()
    net = Network(fabric, engine, random.Random(seed))
    mapper = SimMapper(fabric, engine, net, spec, plan=plan)
    mapper.attach_all()
    mapper.start()
    at = fault_at if fault_at is not None else spec.start + 2 * spec.interval
    targets: list[str] = []
    if fail_link is not None:
        name = net.canonical(fail_link)
        targets.append(name)
        engine.at(at, lambda _: net.set_link(name, False))
    if fail_switch is not None:
        targets += net.switch_links(fail_switch)
        engine.at(at, lambda _: net.set_switch(fail_switch, False))
    if loss_link is not None:
        name = net.canonical(loss_link[0])
        targets.append(name)
        engine.at(at, lambda _: net.set_loss(name, loss_link[1]))
    engine.run(at + horizon)
    found = mapper.first_change(targets, after=at)
    return (math.nan if found is None else found - at), mapper.flagged(), mapper
