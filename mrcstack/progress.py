"""What a fault cost a transfer: progress lost and time to recover, from a goodput series.

A series is what a receiver or a sender saw complete: ``(time_s, bytes)`` samples in any
order.  Given the time of a fault, :func:`analyze` compares the window after it with the
rate before it:

- **progress lost**: from the fault until goodput has recovered (below), the bytes the
  transfer would have moved at its pre-fault rate minus the bytes it did move, expressed as
  time at the pre-fault rate (milliseconds of a stalled transfer).  Counting only the dip
  keeps the slow drift of a busy machine's goodput out of the figure;
  **window lost** is the same over the whole window, drift included.
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
from collections.abc import Iterable
from dataclasses import dataclass

#: Goodput counts as recovered within this fraction of the pre-fault rate.
TOLERANCE = 0.10
BIN_S = 0.010
SMOOTH_S = 0.050
#: A dip that starts later than this after the fault is not attributed to it.
DIP_GRACE_S = 0.100


@dataclass(frozen=True, slots=True)
class Impact:
    """One fault's cost to one transfer (see the module docstring)."""

    pre_rate_bps: float
    lost_ms: float
    window_lost_ms: float
    recovery_ms: float
    first_20ms_ratio: float
    window_s: float


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
) -> Impact:
    """The :class:`Impact` of a fault at ``fault_at`` on the transfer in ``samples``,
    against its rate over the ``pre_s`` seconds before (ValueError if it moved nothing)."""
    if pre_s <= 0 or window_s <= 0 or bin_s <= 0 or not 0 < tolerance < 1:
        raise ValueError("pre_s, window_s and bin_s must be > 0 and tolerance in (0, 1)")
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
        recovery_ms = lost_ms = 0.0
    else:
        back = next((i for i in range(dip + 1, nbins) if min(bins[i], ahead[i]) >= floor), None)
        recovery_ms = math.inf if back is None else back * bin_s * 1e3
        dipped = bins[: nbins if back is None else back]
        lost_ms = (rate * bin_s * len(dipped) - sum(dipped)) / rate * 1e3
    return Impact(
        pre_rate_bps=rate * 8,
        lost_ms=lost_ms,
        window_lost_ms=window_lost_ms,
        recovery_ms=recovery_ms,
        first_20ms_ratio=first / 0.020 / rate,
        window_s=window_s,
    )
