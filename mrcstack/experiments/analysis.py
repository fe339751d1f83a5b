"""Figures of merit the experiments share: means, medians, quantiles and ratios of what the
runs measured.

An experiment's figure that could not be measured (no samples, a zero denominator) is
:data:`NOT_MEASURED`, NaN: arithmetic carries it into every figure derived from it, a
claim on it fails (:class:`~mrcstack.experiments.base.Claim`), and ``result.json`` writes
it as null, as the simulator's JSON writes the ``None`` of :func:`mrcstack.stats.quantile`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from mrcstack import stats
from mrcstack.stats import Method

NOT_MEASURED = math.nan


def mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else NOT_MEASURED


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else NOT_MEASURED


def quantile(xs: Sequence[float], q: float, *, method: Method) -> float:
    """:func:`mrcstack.stats.quantile`, with no samples :data:`NOT_MEASURED`."""
    value = stats.quantile(xs, q, method=method)
    return NOT_MEASURED if value is None else value


def ratio(part: float, whole: float) -> float:
    """``part / whole``; :data:`NOT_MEASURED` when ``whole`` is zero."""
    return part / whole if whole else NOT_MEASURED
