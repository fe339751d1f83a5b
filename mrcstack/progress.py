"""What a fault cost a transfer: progress lost and time to recover, from a goodput series.

A series is what a receiver or a sender saw complete: ``(time_s, bytes)`` samples in any
order.  Given the time of a fault, :func:`analyze` compares the window after it with the
rate before it:

- **progress lost**: the bytes the transfer would have moved at its pre-fault rate from the
  fault to a *horizon* after it, minus the bytes it did move, expressed as time at the
  pre-fault rate (milliseconds of a stalled transfer).  The horizon is the recovery time
  (below) plus :data:`SMOOTH_S`, so a burst of completions held back by one late packet is
  counted with the stall it ends; :func:`row_horizon` gives a set of runs one horizon from
  their median recovery, so a noisy run cannot choose its own.  The progress at each end is
  averaged over a few milliseconds (completions come in clumps).  A run with no fault
  scores about zero either way, not only positive values: an earlier figure that counted
  only dips gave a run with nothing done a median of 7 ms.
  **window lost** is the same over the whole window, drift of a busy machine included.
- **recovery time**: if goodput dips below ``1 - tolerance`` of the pre-fault rate soon
  after the fault (averaged over ``smooth_s`` spans), the time from the fault until a span
  runs within tolerance again; 0 when it never dips; ``inf`` when it is not back within the
  window.
- **first 20 ms**: goodput in the first 20 ms after the fault over the pre-fault rate.

The same function serves the failover benchmark and the experiments, so a figure means the
same wherever it is printed.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate

#: Goodput counts as recovered within this fraction of the pre-fault rate.
TOLERANCE = 0.10
BIN_S = 0.010
SMOOTH_S = 0.050
#: A dip that starts later than this after the fault is not attributed to it.
DIP_GRACE_S = 0.100
#: The progress at the fault and at the horizon is averaged over this span (before the
#: fault: the span before it, carried to the fault time at the pre-fault rate).
EDGE_S = 0.010


@dataclass(frozen=True, slots=True)
class Impact:
    """One fault's cost to one transfer (see the module docstring)."""

    pre_rate_bps: float
    lost_ms: float
    window_lost_ms: float
    recovery_ms: float
    first_20ms_ratio: float
    window_s: float
    horizon_s: float


def _bins(
    samples: Iterable[tuple[float, int]], start: float, count: int, width: float
) -> list[int]:
    out = [0] * count
    for t, n in samples:
        i = math.floor((t - start) / width)
        if 0 <= i < count:
            out[i] += n
    return out


def analyze(
    samples: Iterable[tuple[float, int]],
    fault_at: float,
    *,
    pre_s: float,
    window_s: float,
    tolerance: float = TOLERANCE,
    bin_s: float = BIN_S,
    smooth_s: float = SMOOTH_S,
    horizon_s: float | None = None,
) -> Impact:
    """The :class:`Impact` of a fault at ``fault_at`` on the transfer in ``samples``,
    against its rate over the ``pre_s`` seconds before (ValueError if it moved nothing).
    Progress lost is counted to ``horizon_s`` after the fault (None: this run's recovery
    time plus ``smooth_s``; either way within the window)."""
    if pre_s <= 0 or window_s <= 2 * EDGE_S or bin_s <= 0 or not 0 < tolerance < 1:
        raise ValueError(
            f"pre_s and bin_s must be > 0, window_s > {2 * EDGE_S:g} and tolerance in (0, 1)"
        )
    data = list(samples)
    before = sum(n for t, n in data if fault_at - pre_s <= t < fault_at)
    if before <= 0:
        raise ValueError("nothing completed before the fault: no pre-fault rate")
    rate = before / pre_s  # bytes per second
    after = sum(n for t, n in data if fault_at <= t < fault_at + window_s)
    window_lost_ms = (rate * window_s - after) / rate * 1e3
    first = sum(n for t, n in data if fault_at <= t < fault_at + 0.020)
    nbins = max(1, round(window_s / bin_s))
    bins = _bins(data, fault_at, nbins, bin_s)
    k = max(1, round(smooth_s / bin_s))
    floor = (1 - tolerance) * rate * bin_s  # bytes per bin, averaged over a span
    # The span starting at each bin (shorter at the window's end): recovery is the first bin
    # that, and the span it starts, move at the pre-fault rate again (no smoothing delay).
    ahead = [sum(bins[i : i + k]) / len(bins[i : i + k]) for i in range(nbins)]
    grace = max(1, round(DIP_GRACE_S / bin_s))
    dip = next((i for i in range(min(grace, nbins)) if ahead[i] < floor), None)
    if dip is None:
        recovery_ms = 0.0
    else:
        back = next((i for i in range(dip + 1, nbins) if min(bins[i], ahead[i]) >= floor), None)
        # Rounded: a bin count times a float width leaves residue (70 x 0.01 s is
        # 700.0000000000001 ms), and a figure must not fail a claim at its threshold.
        recovery_ms = math.inf if back is None else round(back * bin_s * 1e3, 6)
    if horizon_s is None:
        horizon_s = horizon_for(recovery_ms, window_s, smooth_s)
    horizon_s = min(max(horizon_s, EDGE_S), window_s - EDGE_S)
    before_t = _completed_before(data)
    moved = _progress(before_t, fault_at + horizon_s, EDGE_S) - _progress_at_fault(
        before_t, fault_at, EDGE_S, rate
    )
    lost_ms = (rate * horizon_s - moved) / rate * 1e3
    return Impact(
        pre_rate_bps=rate * 8,
        lost_ms=lost_ms,
        window_lost_ms=window_lost_ms,
        recovery_ms=recovery_ms,
        first_20ms_ratio=first / 0.020 / rate,
        window_s=window_s,
        horizon_s=horizon_s,
    )


def horizon_for(recovery_ms: float, window_s: float, smooth_s: float = SMOOTH_S) -> float:
    """Where progress lost is counted to: ``smooth_s`` past a recovery time (ms; the whole
    window when goodput never came back), within the window."""
    end = window_s if math.isinf(recovery_ms) else recovery_ms / 1e3 + smooth_s
    return min(end, window_s - EDGE_S)


def row_horizon(
    recoveries_ms: Sequence[float], window_s: float, smooth_s: float = SMOOTH_S
) -> float:
    """One horizon for a set of runs of the same fault: from their median recovery time, so
    that a run whose noise happened to dip is not measured further out than one that did
    not (counting to the end of a run's own dip would favour losses).  ``smooth_s`` as
    given to :func:`analyze` for those runs."""
    if not recoveries_ms:
        raise ValueError("no runs")
    return horizon_for(statistics.median(recoveries_ms), window_s, smooth_s)


def _completed_before(data: Sequence[tuple[float, int]]) -> Callable[[float], int]:
    """A function: the bytes completed before a time."""
    ordered = sorted(data)
    times = [t for t, _ in ordered]
    sums = list(accumulate(n for _, n in ordered))

    def before(at: float) -> int:
        i = bisect_left(times, at)
        return sums[i - 1] if i else 0

    return before


def _progress(before: Callable[[float], int], at: float, edge: float) -> float:
    """Bytes completed before ``at``, averaged over ``at - edge .. at + edge`` (per ms)."""
    steps = max(1, round(2 * edge * 1e3))
    return sum(before(at - edge + (k + 0.5) * 2 * edge / steps) for k in range(steps)) / steps


def _progress_at_fault(
    before: Callable[[float], int], fault_at: float, edge: float, rate: float
) -> float:
    """Bytes completed by the fault, averaged over the ``edge`` before it and carried to the
    fault time at the pre-fault ``rate`` (the span after the fault is the fault's own)."""
    steps = max(1, round(edge * 1e3))
    points = [fault_at - edge + (k + 0.5) * edge / steps for k in range(steps)]
    return sum(before(p) + rate * (fault_at - p) for p in points) / steps
