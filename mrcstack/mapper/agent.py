"""A probing agent without I/O: its share of the plan in rounds, outcomes in send order,
results per loop.

The adapter (mrcd's agent, or the simulator) calls :meth:`ProbeAgent.next_round` every
interval and sends one probe per :class:`Probe` (sealed, on the loop's plane, to its
address), feeds every probe that comes back to :meth:`ProbeAgent.delivered`, calls
:meth:`ProbeAgent.settle` to declare lost what is overdue, and hands
:meth:`ProbeAgent.report` to the mapper.  Time is always a parameter.

A probe's outcome is settled in send order per loop: a delivered probe waits until every
earlier one of its loop is delivered or overdue, so the run of losses a report ends with is
the newest run, whatever order the replies came in.  A round none of whose probes came
back, on two planes or more, is no result at all: independent links of every plane do not
fail together, the host's own stack does (its CPU held up the packets past the timeout).
:meth:`ProbeAgent.settle` takes the time up to which the adapter has read its sockets: a
probe whose reply sat unread while the adapter was not scheduled is not declared lost.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from mrcstack.mapper.plan import ProbePath
from mrcstack.wire import ReplayWindow

#: Replies remembered per agent to tell a replayed one from a late one.
REPLAY_WINDOW = 1 << 14


@dataclass(frozen=True, slots=True)
class Probe:
    """One probe to send now: its sequence number (unique per agent, the AES-GCM nonce's
    counter) and its loop."""

    seq: int
    path: ProbePath


@dataclass(frozen=True, slots=True)
class PathResult:
    """What one loop's probes did since the last report (only probes whose fate is known)."""

    path: int  # ProbePath.ident
    sent: int
    lost: int
    tail: int  # the run of losses the report ends with (0: the newest was delivered)
    rtt_sum: float  # seconds, over the delivered probes

    def __post_init__(self) -> None:
        if not 0 <= self.tail <= self.lost <= self.sent or self.rtt_sum < 0:
            raise ValueError(f"inconsistent result {self}")


class Reply(enum.Enum):
    """What became of a probe that came back."""

    OK = "ok"
    MISROUTED = "misrouted"  # sent for another loop (or plane) than the one it names
    LATE = "late"  # already declared lost
    REPLAYED = "replayed"  # already delivered once
    UNKNOWN = "unknown"  # never sent by this agent


class _Round:
    __slots__ = ("at", "delivered", "void")

    def __init__(self, at: float) -> None:
        self.at = at
        self.delivered = 0
        self.void = False  # nothing came back on any plane: no news of any link


class _Sent:
    __slots__ = ("at", "path", "round", "rtt", "seq")

    def __init__(self, seq: int, path: int, at: float, round_: _Round) -> None:
        self.seq = seq
        self.path = path
        self.at = at
        self.round = round_
        self.rtt = -1.0  # set on delivery


class _Tally:
    __slots__ = ("lost", "rtt_sum", "sent", "tail")

    def __init__(self) -> None:
        self.sent = self.lost = self.tail = 0
        self.rtt_sum = 0.0


class ProbeAgent:
    """One host's agent: rounds of its loops, and the results of each."""

    def __init__(
        self, paths: Sequence[ProbePath], *, timeout: float, short_repeat: int = 1
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"probe timeout must be positive, got {timeout}")
        if short_repeat < 1:
            raise ValueError(f"short_repeat must be >= 1, got {short_repeat}")
        self.paths = tuple(paths)
        self.timeout = timeout
        self.short_repeat = short_repeat
        self._round = [p for p in self.paths for _ in range(short_repeat if p.short else 1)]
        self._seq = 0
        self._sent: dict[int, _Sent] = {}  # outstanding, by seq
        self._order: dict[int, deque[_Sent]] = {p.ident: deque() for p in self.paths}
        self._tally: dict[int, _Tally] = {}
        self._delivered = ReplayWindow(REPLAY_WINDOW)
        self._rounds: deque[_Round] = deque()  # not yet settled, oldest first
        self._planes = len({p.plane for p in self.paths})
        #: Counters: probes sent, delivered, lost; rounds void (every probe of a round on
        #: two planes or more lost: the host's own stack, not its links); replies refused,
        #: by :class:`Reply`.
        self.sent = self.delivered_count = self.lost = self.void_rounds = 0
        self.refused: dict[Reply, int] = {}

    @property
    def per_round(self) -> int:
        """Probes one round sends."""
        return len(self._round)

    @property
    def outstanding(self) -> int:
        return len(self._sent)

    def next_round(self, now: float) -> list[Probe]:
        """One probe per loop (``short_repeat`` per short loop), recorded as sent now."""
        out = []
        round_ = _Round(now)
        self._rounds.append(round_)
        for path in self._round:
            self._seq += 1
            entry = _Sent(self._seq, path.ident, now, round_)
            self._sent[self._seq] = entry
            self._order[path.ident].append(entry)
            out.append(Probe(self._seq, path))
        self.sent += len(out)
        return out

    def delivered(self, seq: int, now: float, path: int | None = None) -> Reply:
        """A probe came back (authenticated by the adapter) at ``now``; ``path``: the loop
        it says it is on, which must be the one it was sent on."""
        entry = self._sent.get(seq)
        if entry is not None and path is not None and entry.path != path:
            self.refused[Reply.MISROUTED] = self.refused.get(Reply.MISROUTED, 0) + 1
            return Reply.MISROUTED
        entry = self._sent.pop(seq, None)
        if entry is None:
            if seq < 1 or seq > self._seq:
                reason = Reply.UNKNOWN
            elif not self._delivered.check(seq):
                reason = Reply.REPLAYED
            else:
                reason = Reply.LATE
            self.refused[reason] = self.refused.get(reason, 0) + 1
            return reason
        self._delivered.update(seq)
        entry.rtt = max(0.0, now - entry.at)
        entry.round.delivered += 1
        self.delivered_count += 1
        self._drain(self._order[entry.path], None)
        return Reply.OK

    def settle(self, before: float) -> None:
        """Declare lost every probe still out whose deadline (sent + timeout) is at or
        before ``before``: the adapter has read everything that arrived until then."""
        cutoff = before - self.timeout
        rounds = self._rounds
        while rounds and rounds[0].at <= cutoff:
            done = rounds.popleft()
            if done.delivered == 0 and self._planes > 1:
                done.void = True
                self.void_rounds += 1
        for order in self._order.values():
            if order and order[0].at <= cutoff:
                self._drain(order, cutoff)

    def _drain(self, order: deque[_Sent], cutoff: float | None) -> None:
        """Settle the loop's probes from the oldest on: delivered ones, and (with a cutoff)
        overdue ones; stop at the first still in time."""
        while order:
            head = order[0]
            if head.rtt >= 0.0:
                ok = True
            elif cutoff is not None and head.at <= cutoff:
                ok = False
                del self._sent[head.seq]
            else:
                return
            order.popleft()
            if not ok:
                if head.round.void:
                    continue  # no result: the whole round was lost, every plane at once
                self.lost += 1
            tally = self._tally.get(head.path)
            if tally is None:
                tally = self._tally[head.path] = _Tally()
            tally.sent += 1
            if ok:
                tally.tail = 0
                tally.rtt_sum += head.rtt
            else:
                tally.lost += 1
                tally.tail += 1

    def report(self) -> tuple[PathResult, ...]:
        """The results settled since the last report, by loop; empty when none."""
        tallies, self._tally = self._tally, {}
        return tuple(
            PathResult(path, t.sent, t.lost, t.tail, t.rtt_sum)
            for path, t in sorted(tallies.items())
        )
