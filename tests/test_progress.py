"""Progress lost to a fault and the time to recover, on series whose answer is known."""

from __future__ import annotations

import math

import pytest

from mrcstack.progress import analyze

RATE = 1_000_000  # bytes per second: 1,000 bytes every millisecond


def series(
    stall_from: float, stall_to: float, end: float = 3.0, rate_after: float = 1.0
) -> list[tuple[float, int]]:
    """A sample per millisecond from 0 to ``end`` s, nothing in [stall_from, stall_to), then
    ``rate_after`` times the rate."""
    out = []
    for ms in range(int(end * 1000)):
        t = ms / 1000
        if stall_from <= t < stall_to:
            continue
        out.append((t, int(1000 * (rate_after if t >= stall_to else 1.0))))
    return out


def test_no_fault_loses_nothing() -> None:
    impact = analyze(series(9, 9), 1.0, pre_s=1.0, window_s=1.0)
    assert impact.pre_rate_bps == pytest.approx(RATE * 8)
    assert impact.lost_ms == 0.0 and abs(impact.window_lost_ms) < 1.5
    assert impact.recovery_ms == 0.0
    assert impact.first_20ms_ratio == pytest.approx(1.0)


def test_a_30ms_stall_loses_30ms_and_recovers_after_30ms() -> None:
    impact = analyze(series(1.0, 1.030), 1.0, pre_s=1.0, window_s=1.0)
    assert impact.lost_ms == pytest.approx(30, abs=1.5)
    assert impact.window_lost_ms == pytest.approx(30, abs=1.5)
    assert impact.recovery_ms == pytest.approx(30)
    assert impact.first_20ms_ratio == 0.0


def test_half_rate_forever_is_never_recovered() -> None:
    impact = analyze(series(1.0, 1.0, rate_after=0.5), 1.0, pre_s=1.0, window_s=1.0)
    assert impact.lost_ms == pytest.approx(500, abs=2)
    assert impact.window_lost_ms == pytest.approx(500, abs=2)
    assert math.isinf(impact.recovery_ms)


def test_a_stall_long_after_the_fault_is_not_its_recovery() -> None:
    impact = analyze(series(1.5, 1.55), 1.0, pre_s=1.0, window_s=1.0)
    assert impact.recovery_ms == 0.0 and impact.lost_ms == 0.0
    assert impact.window_lost_ms == pytest.approx(50, abs=1.5)


def test_drift_after_recovery_is_not_progress_lost() -> None:
    """A 20 ms stall, then 20% faster: the dip costs 20 ms; the window figure goes negative."""
    impact = analyze(series(1.0, 1.020, rate_after=1.2), 1.0, pre_s=1.0, window_s=1.0)
    assert impact.lost_ms == pytest.approx(20, abs=1.5)
    assert impact.window_lost_ms < -100


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="no pre-fault rate"):
        analyze([(2.0, 100)], 1.0, pre_s=0.5, window_s=1.0)
    with pytest.raises(ValueError):
        analyze(series(9, 9), 1.0, pre_s=0.0, window_s=1.0)
