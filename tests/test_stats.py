"""The one quantile: each method as documented, no data as None, a bad q refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mrcstack.stats import Method, quantile

SAMPLES = [4.0, 1.0, 3.0, 2.0]  # sorted: 1, 2, 3, 4


def test_linear_interpolates_between_order_statistics() -> None:
    assert quantile(SAMPLES, 0.5, method=Method.LINEAR) == 2.5
    assert quantile(SAMPLES, 0.0, method=Method.LINEAR) == 1.0
    assert quantile(SAMPLES, 1.0, method=Method.LINEAR) == 4.0
    assert quantile(SAMPLES, 0.99, method=Method.LINEAR) == pytest.approx(3.97)


def test_nearest_rank_takes_the_sample_at_floor_q_n() -> None:
    assert quantile(SAMPLES, 0.5, method=Method.NEAREST_RANK) == 3.0  # index 2: one above
    assert quantile(SAMPLES, 0.3, method=Method.NEAREST_RANK) == 2.0
    assert quantile(SAMPLES, 0.99, method=Method.NEAREST_RANK) == 4.0
    assert quantile(SAMPLES, 1.0, method=Method.NEAREST_RANK) == 4.0  # the largest, clamped


@given(st.lists(st.floats(-1e6, 1e6), min_size=1), st.floats(0.0, 1.0))
def test_nearest_rank_is_always_a_sample_and_linear_within_the_range(
    xs: list[float], q: float
) -> None:
    assert quantile(xs, q, method=Method.NEAREST_RANK) in xs
    linear = quantile(xs, q, method=Method.LINEAR)
    assert linear is not None and min(xs) - 1e-6 <= linear <= max(xs) + 1e-6  # rounding


@pytest.mark.parametrize("method", list(Method))
def test_no_data_is_none_and_a_bad_q_is_refused(method: Method) -> None:
    assert quantile([], 0.5, method=method) is None
    for q in (-0.1, 1.5):
        with pytest.raises(ValueError, match="q must be in"):
            quantile(SAMPLES, q, method=method)
