"""Order statistics: the one quantile of the package, its method named at every call.

Two methods answer different needs.  The simulator's flow-completion percentiles
interpolate (a p99 of few flows moves smoothly with them); the experiments' latency and
slowdown percentiles, like perftest's, take a sample that was measured.  A call states which:
there is no default, so two figures cannot disagree without saying so.

No data is ``None``, not NaN: a caller has to decide what a missing figure means (the
simulator's JSON writes null; an experiment's figure becomes "not measured", whose claim
fails).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence


class Method(enum.Enum):
    """How :func:`quantile` picks a value between the order statistics."""

    #: Linear interpolation between the two order statistics around ``q * (n - 1)``.
    LINEAR = "linear"
    #: The order statistic at index ``floor(q * n)`` (the largest for ``q = 1``): always a
    #: sample, never a value between two; where ``q * n`` is whole it is one rank above the
    #: textbook nearest rank, as perftest reports its percentiles.
    NEAREST_RANK = "nearest rank"


def quantile(xs: Sequence[float], q: float, *, method: Method) -> float | None:
    """The ``q`` quantile (0 <= q <= 1) of ``xs`` by ``method``; None when ``xs`` is empty."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile: q must be in [0, 1], got {q}")
    if not xs:
        return None
    ordered = sorted(xs)
    if method is Method.NEAREST_RANK:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
