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


class Engine:
    """A discrete-event scheduler over virtual seconds.

    Kept deliberately tiny: the network schedules one event per packet per hop, so the cost
    of :meth:`at` and of the :meth:`run` loop bounds the simulator's speed.
    """

    __slots__ = ("_heap", "_seq", "_stopped", "events_run", "now")

    def __init__(self) -> None:
        self.now = 0.0
        self.events_run = 0
        self._heap: list[tuple[float, int, Callback, Any]] = []
        self._seq = itertools.count(1)
        self._stopped = False

    def at(self, time: float, callback: Callback, arg: Any = None) -> None:
        """Run ``callback(arg)`` at virtual ``time`` (clamped to now: no travel backwards)."""
        if time < self.now:
            if math.isnan(time):
                raise ValueError("event time is NaN")
            time = self.now
        heapq.heappush(self._heap, (time, next(self._seq), callback, arg))

    def queue(self) -> tuple[list[tuple[float, int, Callback, Any]], Callable[[], int]]:
        """The heap and its tie-break counter, for a caller that pushes
        ``(time, tiebreak(), callback, arg)`` itself with ``time >= now``: the network does,
        once per packet per hop, where a method call is a noticeable share of the cost."""
        return self._heap, self._seq.__next__

    def stop(self) -> None:
        """End :meth:`run` after the current event (e.g. every flow has finished)."""
        self._stopped = True

    @property
    def pending(self) -> int:
        return len(self._heap)

    def run(self, until: float) -> bool:
        """Run events up to virtual time ``until``; return True if stopped by :meth:`stop`.

        When the heap runs dry or the next event lies beyond ``until``, ``now`` is left at
        the last event run (or ``until`` when events remain past it).
        """
        if math.isnan(until):
            raise ValueError("until is NaN")
        heap = self._heap
        pop = heapq.heappop
        self._stopped = False
        count = 0
        try:
            while heap:
                entry = pop(heap)
                time = entry[0]
                if time > until:
                    heapq.heappush(heap, entry)  # (time, seq) keys are unique: same order
                    self.now = max(self.now, until)
                    break
                self.now = time
                count += 1
                entry[2](entry[3])
                if self._stopped:
                    return True
            return False
        finally:
            self.events_run += count
