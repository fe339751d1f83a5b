"""The event heap: virtual time, one callback per event, strictly deterministic order.

Events at the same instant run in the order they were scheduled (a sequence number breaks
ties), so a run depends only on its inputs, never on hash order or the wall clock.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any

#: A callback receives the single argument it was scheduled with.
Callback = Callable[[Any], None]
#: One scheduled event: its sequence number (the tie-break), callback and argument.
Entry = tuple[int, Callback, Any]


class Engine:
    """A discrete-event scheduler over virtual seconds.

    Kept deliberately tiny: the network schedules one event per packet per hop, so the cost
    of :meth:`at` and of the :meth:`run` loop bounds the simulator's speed.

    The heap holds event *times* only (floats compare several times faster than
    ``(time, sequence, ...)`` tuples, and a heap operation makes about ``log2(n)``
    comparisons); ``slots`` maps each pending time to its event, or to the list of its
    events in sequence order when several fall on the same instant (rare: times are sums
    of serialization and propagation delays).  The order is exactly that of a heap of
    ``(time, sequence)`` keys.
    """

    __slots__ = ("_seq", "_stopped", "events_run", "now", "slots", "times")

    def __init__(self) -> None:
        self.now = 0.0
        self.events_run = 0
        self.times: list[float] = []  # a heap of the distinct pending times
        # time -> its Entry, or a list of Entries (Any: the hot paths tell them apart by
        # ``type(...) is tuple``, which a checker cannot narrow on)
        self.slots: dict[float, Any] = {}
        self._seq = itertools.count(1)
        self._stopped = False

    def at(self, time: float, callback: Callback, arg: Any = None) -> None:
        """Run ``callback(arg)`` at virtual ``time`` (clamped to now: no travel backwards)."""
        if time < self.now:
            if math.isnan(time):
                raise ValueError("event time is NaN")
            time = self.now
        entry = (next(self._seq), callback, arg)
        current = self.slots.setdefault(time, entry)
        if current is entry:
            heapq.heappush(self.times, time)
        elif type(current) is tuple:  # a fresh sequence number is the newest: it goes last
            self.slots[time] = [current, entry]
        else:
            current.append(entry)

    def queue(self) -> tuple[dict[float, Any], list[float], Callable[[], int]]:
        """The time -> event map, the heap of times and the tie-break counter, for a caller
        that schedules ``entry = (tiebreak(), callback, arg)`` at ``time >= now`` itself
        (the network does, once per packet per hop, where a method call is a noticeable
        share of the cost), as :meth:`at` does: ``current = slots.setdefault(time,
        entry)``; if that is ``entry``, ``heappush(times, time)``; else the instant has
        events already, and ``entry``, the newest, goes after them (:meth:`add` places an
        older key)."""
        return self.slots, self.times, self._seq.__next__

    def add(self, time: float, entry: Entry) -> None:
        """Schedule ``entry`` (a sequence number from the tie-break counter, a callback,
        its argument) at ``time >= now``, in sequence order among that instant's events."""
        slots = self.slots
        current = slots.get(time)
        if current is None:
            slots[time] = entry
            heapq.heappush(self.times, time)
        elif current is entry:
            return
        elif isinstance(current, tuple):
            slots[time] = [current, entry] if current[0] < entry[0] else [entry, current]
        else:
            seq = entry[0]
            index = len(current)
            while index and current[index - 1][0] > seq:
                index -= 1  # an older key (a deferred timer): before the newer ones
            current.insert(index, entry)

    def stop(self) -> None:
        """End :meth:`run` after the current event (e.g. every flow has finished)."""
        self._stopped = True

    @property
    def pending(self) -> int:
        return sum(1 if type(e) is tuple else len(e) for e in self.slots.values())

    def run(self, until: float) -> bool:
        """Run events up to virtual time ``until``; return True if stopped by :meth:`stop`.

        When the heap runs dry or the next event lies beyond ``until``, ``now`` is left at
        the last event run (or ``until`` when events remain past it).
        """
        if math.isnan(until):
            raise ValueError("until is NaN")
        times = self.times
        slots = self.slots
        pop = heapq.heappop
        self._stopped = False
        count = 0
        try:
            while times:
                time = times[0]
                if time > until:
                    self.now = max(self.now, until)
                    break
                pop(times)
                entry = slots.pop(time)
                self.now = time
                if type(entry) is tuple:
                    count += 1
                    entry[1](entry[2])
                    if self._stopped:
                        return True
                    continue
                # Several at one instant.  One scheduled at this instant while they run
                # gets a later sequence number: it goes into a new entry for this time.
                for each in entry:
                    count += 1
                    each[1](each[2])
                    if self._stopped:
                        for rest in entry[entry.index(each) + 1 :]:
                            self.add(time, rest)
                        return True
            return False
        finally:
            self.events_run += count
