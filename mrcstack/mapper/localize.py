"""Localization by tomography, without I/O: probe results and the time in, verdicts out.

:meth:`Localizer.observe` takes an agent's :class:`~.agent.PathResult` list; :meth:`Localizer.
evaluate` returns the links whose state changed (:class:`LinkChange`); :meth:`Localizer.
get_timer` says when a hold-down ends, and :meth:`Localizer.handle_timer` ends it.  The
mapper daemon and the simulator drive the same object.

The evidence about a link comes from the loops that cross it (:mod:`.plan`):

- **down**: every fresh loop over the link ended its last ``down_after`` probes lost, and
  the link is part of the smallest explanation of the failing loops of its T0 (boolean
  tomography, one T0 and plane at a time): every link of a loop that delivered its newest
  probe is good; a failing loop with one link not known good condemns that link; the
  failing loops left are explained greedily by the links that cover most of them.  So a
  dead T1 is its T0-T1 links (the short loops prove the host links good), a dead host link
  is that link alone (the other hosts' hairpins prove the T0-T1 links good), and a dead T0
  is its host links (each explains its host's every loop; its T0-T1 links cannot be told).
- **lossy**: the loss per crossing is above ``loss_threshold`` with ``confidence``
  (one-sided).  A loop crosses each of its links twice, so the threshold per round trip is
  ``q = 1 - (1 - threshold)^2``.  A host link's loss is its short loops' (nothing else on
  them); a T0-T1 link's is what its hairpins lose beyond the short loops of the same hosts
  (success of a hairpin = success of the short loop x success over the T0-T1 link).  The test
  is ``D = l1/n1 - l0/n0 - q (1 - l0/n0) > z sd``, ``sd`` from the Agresti-Coull estimates of
  both proportions; it runs over the last 1, 2.5 and 5 s of results (a new loss shows in the
  short window before the long one is full of it), and a lossy link is good again when the
  longest window says its loss is under the threshold with the same confidence.  A test
  needs :data:`MIN_PROBES` results, and leaves out each loop's current run of losses: a run
  still going is news of a link going down, not of one dropping a few packets.
- **good**: the loops deliver again (and, for a lossy link, the test above).

Results of a loop that is not *fresh* (no report for ``stale_after``: its agent is gone) are
no evidence, so a host whose agent died keeps its links' last state.  When a link goes down or
comes back, its loops' loss history is forgotten: losses of a dead link are not a gray failure.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

from mrcstack.mapper.agent import PathResult
from mrcstack.mapper.linkstate import DENIED, TRANSITIONS, Evidence, LinkState
from mrcstack.mapper.plan import ProbePlan, link_ends, switches

#: Results a loss test needs before it says anything (a few losses among fewer are no
#: measure of a loss rate).
MIN_PROBES = 50


@dataclass(frozen=True, slots=True)
class Params:
    """The localizer's settings (the mapper's config file names them the same)."""

    down_after: int = 3  # consecutive losses on every loop over a link
    loss_threshold: float = 0.005  # loss per crossing above which a link is lossy
    confidence: float = 0.99  # one-sided, for lossy and for good again
    windows: tuple[float, ...] = (1.0, 2.5, 5.0)  # seconds of results each test looks at
    bucket: float = 0.25  # seconds per bucket of results
    hold_down: float = 10.0  # seconds a recovered link stays denied
    stale_after: float = 1.0  # seconds without a report before a loop is no evidence

    def __post_init__(self) -> None:
        if self.down_after < 1:
            raise ValueError(f"down_after must be >= 1, got {self.down_after}")
        if not 0.0 < self.loss_threshold < 0.5:
            raise ValueError(f"loss_threshold must be in (0, 0.5), got {self.loss_threshold}")
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence}")
        if not self.windows or any(not w >= self.bucket for w in self.windows):
            raise ValueError("windows must be at least one bucket long")
        if not self.bucket > 0 or self.hold_down < 0 or not self.stale_after > 0:
            raise ValueError("bucket and stale_after must be positive, hold_down >= 0")

    @property
    def round_trip_threshold(self) -> float:
        return 1.0 - (1.0 - self.loss_threshold) ** 2

    @property
    def z(self) -> float:
        return NormalDist().inv_cdf(self.confidence)


@dataclass(frozen=True, slots=True)
class LinkChange:
    """A link changed state at ``at`` (seconds, the caller's clock)."""

    link: str
    old: LinkState
    new: LinkState
    evidence: Evidence
    at: float
    loss: float  # estimated loss per crossing then (NaN: not measured)


@dataclass(frozen=True, slots=True)
class LinkStatus:
    """A link as status pages and metrics show it."""

    link: str
    plane: int
    a: str  # its ends' node names, canonical order (host < T0 < T1)
    b: str
    state: LinkState
    since: float | None  # when it entered ``state`` (None: never left UP)
    loss: float  # loss per crossing over the longest window (NaN: no data)
    rtt: float  # mean round trip of its loops over the longest window (NaN: no data)
    probes: int  # probe results over the longest window
    hold_until: float | None  # HELD: when it may come back


def _counts(buckets: deque[list[float]], first: int, tail: int) -> tuple[int, int, float, int]:
    """(sent, lost, rtt sum, delivered) of the buckets from index ``first`` on, leaving out
    the loop's current run of ``tail`` losses: a run still going is news of a link going
    down, not of one losing some packets."""
    sent = lost = 0
    rtt = 0.0
    for b in reversed(buckets):
        if b[0] < first:
            break
        sent += int(b[1])
        lost += int(b[2])
        rtt += b[3]
    tail = min(tail, lost)
    return sent - tail, lost - tail, rtt, sent - lost


class Localizer:
    """Link states of one fabric from its agents' results."""

    def __init__(self, plan: ProbePlan, params: Params | None = None) -> None:
        self.plan = plan
        self.params = p = params or Params()
        self._z = p.z
        self._q = p.round_trip_threshold
        self._spans = sorted({max(1, round(w / p.bucket)) for w in p.windows})
        n = len(plan.paths)
        self._streak = [0] * n
        self._seen = [-math.inf] * n
        self._buckets: list[deque[list[float]]] = [deque() for _ in range(n)]
        self._state = dict.fromkeys(plan.links, LinkState.UP)
        self._since: dict[str, float] = {}
        self._hold: dict[str, float] = {}  # HELD link -> end of its hold-down
        self._dirty: set[str] = set()
        self._loss_dirty: set[str] = set()
        self._last_bucket = -1
        self._cover = {link: frozenset(plan.covering(link)) for link in plan.links}
        self._host_link = {p.ident: p.links[0] for p in plan.paths}
        self._shorts: dict[str, tuple[int, ...]] = {}  # host link -> its short loops
        for path in plan.paths:
            if path.short:
                self._shorts[path.links[0]] = (*self._shorts.get(path.links[0], ()), path.ident)
        # Each link's T0 (one plane), and every loop of that T0's hosts: the region where a
        # failure is explained.
        self._t0_of: dict[str, str] = {}
        region: dict[str, set[int]] = {}
        for link in plan.links:
            _, a, b = link_ends(link)
            t0 = b if a.startswith("h") else a
            self._t0_of[link] = t0
            region.setdefault(t0, set()).update(self._cover[link])
        self._region = {t0: tuple(sorted(loops)) for t0, loops in region.items()}
        self._region_links: dict[str, tuple[str, ...]] = {}
        for link, t0 in self._t0_of.items():
            self._region_links[t0] = (*self._region_links.get(t0, ()), link)
        #: Results taken so far.
        self.results = 0

    # Input -----------------------------------------------------------------------------------
    def observe(self, results: Iterable[PathResult], now: float) -> None:
        """An agent's results, received at ``now``."""
        p = self.params
        k = p.down_after
        index = int(now / p.bucket)
        keep = self._spans[-1] + 1
        paths = self.plan.paths
        for r in results:
            i = r.path
            if not 0 <= i < len(paths):
                raise ValueError(f"loop {i} is not in the plan")
            if r.sent == 0:
                continue
            self.results += r.sent
            prev = self._streak[i]
            new = prev + r.lost if r.tail == r.sent else r.tail
            self._streak[i] = new
            fresh = self._seen[i] >= now - p.stale_after
            self._seen[i] = now
            if not fresh or min(prev, k) != min(new, k) or (prev == 0) != (new == 0):
                self._mark(i)
            buckets = self._buckets[i]
            if buckets and buckets[-1][0] == index:
                last = buckets[-1]
                last[1] += r.sent
                last[2] += r.lost
                last[3] += r.rtt_sum
            else:
                buckets.append([index, r.sent, r.lost, r.rtt_sum])
                while buckets and buckets[0][0] <= index - keep:
                    buckets.popleft()
            if r.lost:
                self._loss_dirty.update(paths[i].links)

    def _mark(self, i: int) -> None:
        """Loop ``i`` changed in a way that may change a verdict: every link of its T0 (the
        region whose failures are explained together)."""
        self._dirty.update(self._region_links[self._t0_of[self.plan.paths[i].links[0]]])

    def seed(self, links: Iterable[str], now: float) -> list[LinkChange]:
        """Links some host still denies (a mapper that restarted learns them from its
        agents): HELD from now, so they come back only after a hold-down of good results."""
        changes = []
        for link in links:
            if self._state.get(link) is LinkState.UP:
                changes.append(self._set(link, LinkState.HELD, Evidence.GOOD, now))
        return changes

    # Output ----------------------------------------------------------------------------------
    def evaluate(self, now: float) -> list[LinkChange]:
        """The links whose state changed since the last call, after the results so far."""
        index = int(now / self.params.bucket)
        if index != self._last_bucket:  # lossy links may have become good as time passed
            self._last_bucket = index
            self._loss_dirty.update(
                link for link, s in self._state.items() if s in (LinkState.LOSSY, LinkState.HELD)
            )
        links = self._dirty | self._loss_dirty
        self._dirty = set()
        self._loss_dirty = set()
        changes = []
        down: dict[str, frozenset[str]] = {}  # T0 -> its links explaining failing loops
        for link in sorted(links):
            evidence = self._evidence(link, now, down)
            if evidence is None:
                continue
            state = self._state[link]
            new = TRANSITIONS.get((state, evidence))
            if new is not None:
                changes.append(self._set(link, new, evidence, now))
        return changes + self.handle_timer(now)

    def get_timer(self) -> float | None:
        """When the next hold-down ends (None: no link is held)."""
        return min(self._hold.values(), default=None)

    def handle_timer(self, now: float) -> list[LinkChange]:
        """End the hold-downs that are over: those links are UP again."""
        changes = []
        for link, until in sorted(self._hold.items()):
            if until <= now:
                changes.append(self._set(link, LinkState.UP, Evidence.HOLD_EXPIRED, now))
        return changes

    def _set(self, link: str, new: LinkState, evidence: Evidence, now: float) -> LinkChange:
        old = self._state[link]
        self._state[link] = new
        self._since[link] = now
        self._hold.pop(link, None)
        if new is LinkState.HELD:
            self._hold[link] = now + self.params.hold_down
        if LinkState.DOWN in (old, new):
            for i in self._cover[link]:  # a dead link's losses say nothing of gray failure
                self._buckets[i].clear()
        loss = self._loss(link, self._spans[-1], now)[0]
        return LinkChange(link, old, new, evidence, now, loss)

    # Queries ---------------------------------------------------------------------------------
    def state(self, link: str) -> LinkState:
        return self._state[link]

    @property
    def denylist(self) -> frozenset[str]:
        """The links whose paths no host may use: DOWN, LOSSY or HELD."""
        return frozenset(link for link, s in self._state.items() if s in DENIED)

    def status(self, now: float) -> list[LinkStatus]:
        out = []
        span = self._spans[-1]
        for link in self.plan.links:
            plane, a, b = link_ends(link)
            loss, rtt, probes = self._loss(link, span, now)
            out.append(
                LinkStatus(
                    link,
                    plane,
                    a,
                    b,
                    self._state[link],
                    self._since.get(link),
                    loss,
                    rtt,
                    probes,
                    self._hold.get(link),
                )
            )
        return out

    def switches_down(self) -> list[str]:
        """Switches that look dead: a T1 whose every link is down, a T0 whose every host link
        is down (its T0-T1 links cannot be judged then: every loop over them is dead)."""
        out = []
        for switch, links in switches(self.plan).items():
            judged = [lk for lk in links if lk.split(":")[1].startswith("h")] or list(links)
            if "-t0" in switch and not judged[0].split(":")[1].startswith("h"):
                continue  # a T0 without hosts
            if all(self._state[lk] is LinkState.DOWN for lk in judged):
                out.append(switch)
        return out

    # Evidence --------------------------------------------------------------------------------
    def _fresh(self, i: int, now: float) -> bool:
        return self._seen[i] >= now - self.params.stale_after

    def _evidence(self, link: str, now: float, down: dict[str, frozenset[str]]) -> Evidence | None:
        cover = [i for i in self._cover[link] if self._fresh(i, now)]
        if not cover:
            return None
        t0 = self._t0_of[link]
        if t0 not in down:
            down[t0] = self._explain(t0, now)
        if link in down[t0]:
            return Evidence.DOWN
        state = self._state[link]
        if state is LinkState.DOWN:  # its losses while down are no gray failure: wait
            delivering = [i for i in cover if self._streak[i] == 0]
            return Evidence.GOOD if len(delivering) * 2 > len(cover) else None
        if self._lossy(link, now):
            return Evidence.LOSSY
        if state is LinkState.LOSSY:
            return Evidence.GOOD if self._clear(link, now) else None
        k = self.params.down_after
        if state is LinkState.HELD and any(self._streak[i] >= k for i in cover):
            return None  # not down (other links explain it), not good either
        return Evidence.GOOD

    def _explain(self, t0: str, now: float) -> frozenset[str]:
        """The links of one T0 (its host links and uplinks, one plane) that explain the
        failing loops of its hosts: see the module docstring."""
        k = self.params.down_after
        streak = self._streak
        paths = self.plan.paths
        good: set[str] = set()
        failing: list[int] = []
        undecided: set[str] = set()
        for i in self._region[t0]:
            if not self._fresh(i, now):
                continue
            if streak[i] == 0:
                good.update(paths[i].links)
            elif streak[i] >= k:
                failing.append(i)
            else:
                undecided.update(paths[i].links)
        if not failing:
            return frozenset()
        down: set[str] = set()
        left = []
        for i in failing:
            suspects = [lk for lk in paths[i].links if lk not in good]
            if len(suspects) == 1:
                down.add(suspects[0])
            elif suspects:
                left.append(suspects)
        left = [s for s in left if down.isdisjoint(s)]
        while left:
            counts: dict[str, int] = {}
            for suspects in left:
                for lk in suspects:
                    counts[lk] = counts.get(lk, 0) + 1
            best = max(sorted(counts), key=lambda lk: counts[lk])
            down.add(best)
            left = [s for s in left if best not in s]
        return frozenset(lk for lk in down if lk not in undecided)

    def _pairs(
        self, link: str, span: int, now: float
    ) -> tuple[tuple[int, int], tuple[int, int], float, int]:
        """(n1, l1) of the link's loops, (n0, l0) of the baseline they are compared with (a
        T0-T1 link's hosts' short loops; none for a host link), and the loops' RTT sum and
        count, over the last ``span`` buckets.  Hosts whose own link is down are left out:
        their loops carry no news of this link."""
        first = int(now / self.params.bucket) - span + 1
        n1 = l1 = n0 = l0 = delivered = 0
        rtt = 0.0
        shorts = self._shorts
        host_side = link.split(":")[1].startswith("h")
        for i in self._cover[link]:
            path = self.plan.paths[i]
            if host_side and not path.short:
                continue  # a host link's loss is its short loops'
            if not host_side:
                hl = self._host_link[i]
                if self._state[hl] is LinkState.DOWN:
                    continue
                for s in shorts.get(hl, ()):
                    sent, lost, _, _ = _counts(self._buckets[s], first, self._streak[s])
                    n0 += sent
                    l0 += lost
            sent, lost, r, d = _counts(self._buckets[i], first, self._streak[i])
            n1 += sent
            l1 += lost
            rtt += r
            delivered += d
        return (n1, l1), (n0, l0), rtt, delivered

    def _excess(self, link: str, span: int, now: float) -> tuple[float, float] | None:
        """(D, its standard deviation) for the test in the module docstring; None: no data."""
        (n1, l1), (n0, l0), _, _ = self._pairs(link, span, now)
        if n1 < MIN_PROBES:
            return None
        z2 = self._z * self._z
        q = self._q
        p1 = l1 / n1
        a1 = (l1 + z2 / 2) / (n1 + z2)
        var = a1 * (1 - a1) / (n1 + z2)
        p0 = 0.0
        if n0:
            p0 = l0 / n0
            a0 = (l0 + z2 / 2) / (n0 + z2)
            var += (1 - q) ** 2 * a0 * (1 - a0) / (n0 + z2)
        return p1 - p0 - q * (1 - p0), math.sqrt(var)

    def _lossy(self, link: str, now: float) -> bool:
        for span in self._spans:
            got = self._excess(link, span, now)
            if got is not None and got[0] > self._z * got[1]:
                return True
        return False

    def _clear(self, link: str, now: float) -> bool:
        got = self._excess(link, self._spans[-1], now)
        return got is not None and got[0] < -self._z * got[1]

    def _loss(self, link: str, span: int, now: float) -> tuple[float, float, int]:
        """(loss per crossing, mean RTT, probes) over the last ``span`` buckets."""
        (n1, l1), (n0, l0), rtt, delivered = self._pairs(link, span, now)
        if n1 == 0:
            return math.nan, math.nan, 0
        s1 = 1 - l1 / n1
        s0 = 1 - l0 / n0 if n0 else 1.0
        round_trip = 1.0 - (s1 / s0 if s0 > 0 else 0.0)
        round_trip = min(1.0, max(0.0, round_trip))
        mean = rtt / delivered if delivered else math.nan
        return 1.0 - math.sqrt(1.0 - round_trip), mean, n1


def changes_text(changes: Sequence[LinkChange]) -> list[str]:
    """One log line per change: ``link=p0:t0a-t1c state=down was=up evidence=down``."""
    return [
        f"link={c.link} state={c.new.value} was={c.old.value} evidence={c.evidence.value}"
        + ("" if math.isnan(c.loss) else f" loss={c.loss:.4f}")
        for c in changes
    ]
