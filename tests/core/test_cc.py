"""Congestion control: registry, parameters, NSCC's reactions, and window bounds."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrcstack.core.cc import (
    REGISTRY,
    CCParams,
    CongestionController,
    DcqcnLite,
    FixedWindow,
    Nscc,
    create,
    register,
)

MTU = 4096
BASE_RTT = 10e-6
RATE = 400e9  # 4 planes x 100 Gbit/s


def nscc_params(**overrides: Any) -> CCParams:
    return dataclasses.replace(CCParams.for_path(RATE, BASE_RTT), **overrides)


def feed_acks(
    cc: CongestionController, count: int, rtt: float | None, ecn: bool, now: float
) -> float:
    """Deliver ``count`` full-packet acks paced as a window per RTT; return the new time."""
    for _ in range(count):
        now += (rtt or BASE_RTT) * MTU / max(cc.cwnd, MTU)
        cc.on_ack(MTU, rtt, ecn, now)
    return now


# --- registry ------------------------------------------------------------------------------


def test_create_by_name() -> None:
    params = CCParams()
    assert isinstance(create("nscc", params, MTU, 0.0), Nscc)
    assert isinstance(create("fixed", params, MTU, 0.0), FixedWindow)
    assert isinstance(create("dcqcn_lite", params, MTU, 0.0), DcqcnLite)


def test_unknown_name_lists_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown") as info:
        create("cubic", CCParams(), MTU, 0.0)
    for name in ("nscc", "fixed", "dcqcn_lite"):
        assert name in str(info.value)


def test_duplicate_registration_is_refused() -> None:
    class Impostor(FixedWindow):
        name = "nscc"

    with pytest.raises(ValueError, match="already registered"):
        register(Impostor)
    assert REGISTRY["nscc"] is Nscc


def test_register_new_controller_then_create() -> None:
    class Custom(FixedWindow):
        name = "test_custom"

    try:
        assert register(Custom) is Custom
        assert isinstance(create("test_custom", CCParams(), MTU, 0.0), Custom)
    finally:
        REGISTRY.pop("test_custom", None)


def test_register_requires_a_name() -> None:
    class Nameless(FixedWindow):
        name = ""

    with pytest.raises(ValueError, match="name"):
        register(Nameless)


# --- parameters ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("base_rtt", 0.0),
        ("base_rtt", -1e-6),
        ("base_rtt", math.nan),
        ("base_rtt", math.inf),
        ("target_delay", 0.0),
        ("max_cwnd", 0),
        ("max_cwnd", 1.5),
        ("max_cwnd", True),
        ("adjust_bytes_threshold", 0),
        ("adjust_period_threshold", -1.0),
        ("qa_gate", -1),
        ("qa_gate", 32),
        ("qa_threshold", 0.0),
        ("disable_qa", 1),
        ("min_cwnd", 0),
        ("min_cwnd", 10**9),
        ("initial_cwnd", 10**9),
        ("initial_cwnd", 0),
    ],
)
def test_params_validation_names_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        CCParams(**{field: value})


def test_initial_cwnd_below_min_cwnd_is_refused() -> None:
    with pytest.raises(ValueError, match="initial_cwnd"):
        CCParams(min_cwnd=8 * MTU, initial_cwnd=4 * MTU)


@pytest.mark.parametrize(
    ("rate_bps", "base_rtt"),
    [(400e9, 5e-6), (100e9, 12e-6), (10e9, 100e-6), (1e9, 2e-3), (10e6, 100e-6)],
)
def test_for_path_covers_the_bdp(rate_bps: float, base_rtt: float) -> None:
    params = CCParams.for_path(rate_bps, base_rtt)
    bdp = rate_bps / 8 * base_rtt
    assert params.max_cwnd >= bdp
    assert params.max_cwnd >= 1.5 * bdp
    assert params.base_rtt == base_rtt
    assert params.target_delay is not None and 0 < params.target_delay < base_rtt
    assert params.qa_threshold is not None and params.qa_threshold > params.target_delay
    assert params.adjust_period_threshold == base_rtt
    assert params.adjust_bytes_threshold is not None and params.adjust_bytes_threshold >= 1


@pytest.mark.parametrize(("rate_bps", "base_rtt"), [(0.0, 1e-5), (1e9, 0.0), (math.nan, 1e-5)])
def test_for_path_validates(rate_bps: float, base_rtt: float) -> None:
    with pytest.raises(ValueError, match="rate_bps" if rate_bps != 1e9 else "base_rtt"):
        CCParams.for_path(rate_bps, base_rtt)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_controller_argument_checks(name: str) -> None:
    with pytest.raises(ValueError, match="max_cwnd"):
        create(name, CCParams(max_cwnd=1000), MTU, 0.0)
    with pytest.raises(ValueError, match="mtu_payload"):
        create(name, CCParams(), 0, 0.0)
    cc = create(name, CCParams(), MTU, 0.0)
    with pytest.raises(ValueError, match="acked_bytes"):
        cc.on_ack(-1, None, False, 1.0)
    with pytest.raises(ValueError, match="rtt"):
        cc.on_ack(MTU, -1e-6, False, 1.0)
    with pytest.raises(ValueError, match="rtt"):
        cc.on_ack(MTU, math.nan, False, 1.0)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_window_is_at_least_one_packet(name: str) -> None:
    cc = create(name, CCParams(min_cwnd=100, initial_cwnd=100), MTU, 0.0)
    assert cc.min_cwnd == MTU
    assert cc.cwnd == MTU


def test_initial_cwnd_defaults_to_max_cwnd() -> None:
    assert create("nscc", nscc_params(), MTU, 0.0).cwnd == nscc_params().max_cwnd


# --- NSCC --------------------------------------------------------------------------------


def test_nscc_grows_to_max_cwnd_under_clean_acks() -> None:
    params = nscc_params(initial_cwnd=MTU)
    cc = create("nscc", params, MTU, 0.0)
    now, previous = 0.0, cc.cwnd
    for _ in range(200):
        now = feed_acks(cc, 10, BASE_RTT, False, now)
        assert cc.cwnd >= previous
        previous = cc.cwnd
    assert cc.cwnd == params.max_cwnd


def test_nscc_fast_increase_when_far_below_target() -> None:
    """At zero delay the window grows multiplicatively, well beyond what the proportional
    term alone gives over a delay just above the fast-increase band (1 / 0.7 of it)."""
    params = nscc_params(initial_cwnd=4 * MTU)
    zero_delay = create("nscc", params, MTU, 0.0)
    some_delay = create("nscc", params, MTU, 0.0)
    feed_acks(zero_delay, 200, BASE_RTT, False, 0.0)
    feed_acks(some_delay, 200, BASE_RTT + 0.3 * (params.target_delay or 0.0), False, 0.0)
    growth_zero = zero_delay.cwnd - 4 * MTU
    growth_some = some_delay.cwnd - 4 * MTU
    assert growth_some > 0
    assert growth_zero > 1.6 * growth_some


def test_nscc_shrinks_under_ecn_and_high_delay() -> None:
    params = nscc_params()
    cc = create("nscc", params, MTU, 0.0)
    high = BASE_RTT + 3 * (params.target_delay or 0.0)
    feed_acks(cc, 300, high, True, 0.0)
    assert cc.cwnd <= params.max_cwnd // 4


def test_nscc_decrease_is_proportional_to_delay_excess() -> None:
    params = nscc_params()
    target = params.target_delay or 0.0
    mild = create("nscc", params, MTU, 0.0)
    severe = create("nscc", params, MTU, 0.0)
    feed_acks(mild, 40, BASE_RTT + 1.3 * target, True, 0.0)
    feed_acks(severe, 40, BASE_RTT + 4 * target, True, 0.0)
    assert severe.cwnd < mild.cwnd < params.max_cwnd


def test_nscc_keeps_window_under_ecn_with_low_delay() -> None:
    """A mark without queuing delay is one busy path: the EV layer's job, not the window's."""
    params = nscc_params()
    cc = create("nscc", params, MTU, 0.0)
    feed_acks(cc, 1000, BASE_RTT, True, 0.0)
    assert cc.cwnd >= 0.9 * params.max_cwnd


def test_nscc_grows_only_mildly_on_high_delay_without_ecn() -> None:
    """Unmarked delay is not a switch queue we can drain: neither cut nor race."""
    params = nscc_params(initial_cwnd=16 * MTU, disable_qa=True)
    high_delay = create("nscc", params, MTU, 0.0)
    clean = create("nscc", params, MTU, 0.0)
    rtt = BASE_RTT + 2 * (params.target_delay or 0.0)
    feed_acks(high_delay, 64, rtt, False, 0.0)
    feed_acks(clean, 64, BASE_RTT, False, 0.0)
    assert high_delay.cwnd > 16 * MTU
    assert high_delay.cwnd - 16 * MTU < (clean.cwnd - 16 * MTU) / 3


def test_nscc_trim_reduces_by_one_packet() -> None:
    params = nscc_params()
    cc = create("nscc", params, MTU, 0.0)
    cc.on_trim(1e-6)
    assert cc.cwnd == params.max_cwnd - MTU


def test_nscc_trims_are_bounded_per_rtt() -> None:
    params = nscc_params(disable_qa=True)
    cc = create("nscc", params, MTU, 0.0)
    for _ in range(1000):
        cc.on_trim(1e-6)
    assert params.max_cwnd // 2 - 1 <= cc.cwnd < params.max_cwnd - MTU


def test_nscc_timeout_counts_like_a_trim_and_loss_is_ignored() -> None:
    params = nscc_params()
    cc = create("nscc", params, MTU, 0.0)
    for _ in range(50):
        cc.on_loss(1e-6)
    assert cc.cwnd == params.max_cwnd
    cc.on_timeout(2e-6)
    assert cc.cwnd == params.max_cwnd - MTU


def _incast_epoch(cc: CongestionController, delivered: int, trims: int, now: float) -> float:
    """One QA epoch in which ``delivered`` packets got through and ``trims`` were trimmed."""
    step = 0.5 * BASE_RTT / (delivered + trims)
    for _ in range(trims):
        now += step
        cc.on_trim(now)
    for _ in range(delivered):
        now += step
        cc.on_ack(MTU, BASE_RTT, False, now)
    return now


def test_quick_adapt_cuts_to_delivered_bytes() -> None:
    params = nscc_params(max_cwnd=128 * MTU)
    cc = create("nscc", params, MTU, 0.0)
    now = _incast_epoch(cc, delivered=3, trims=40, now=0.0)
    assert cc.cwnd > 64 * MTU  # the trims alone took at most half
    cc.on_ack(MTU, BASE_RTT, False, now + 5 * BASE_RTT)  # the epoch has ended
    assert 3 * MTU <= cc.cwnd <= 4 * MTU


def test_quick_adapt_ignores_signals_from_packets_already_in_flight() -> None:
    params = nscc_params(max_cwnd=128 * MTU)
    cc = create("nscc", params, MTU, 0.0)
    now = _incast_epoch(cc, delivered=3, trims=40, now=0.0)
    now += 5 * BASE_RTT
    cc.on_ack(MTU, BASE_RTT, False, now)
    after_cut = cc.cwnd
    for _ in range(20):  # trims of packets sent under the old window
        now += 0.01 * BASE_RTT
        cc.on_trim(now)
    assert cc.cwnd == after_cut


def test_quick_adapt_never_below_min_cwnd() -> None:
    params = nscc_params(max_cwnd=128 * MTU, min_cwnd=8 * MTU)
    cc = create("nscc", params, MTU, 0.0)
    now = _incast_epoch(cc, delivered=1, trims=40, now=0.0)
    cc.on_ack(MTU, BASE_RTT, False, now + 5 * BASE_RTT)
    assert cc.cwnd == 8 * MTU


@pytest.mark.parametrize(
    "overrides",
    [
        {"disable_qa": True},  # quick adapt off
        {"qa_gate": 6},  # 3 packets delivered is more than 128 packets >> 6
    ],
)
def test_quick_adapt_disabled_or_gated(overrides: dict[str, Any]) -> None:
    params = nscc_params(max_cwnd=128 * MTU, **overrides)
    cc = create("nscc", params, MTU, 0.0)
    now = _incast_epoch(cc, delivered=3, trims=40, now=0.0)
    cc.on_ack(MTU, BASE_RTT, False, now + 5 * BASE_RTT)
    assert cc.cwnd > 64 * MTU


def test_quick_adapt_needs_a_congestion_signal() -> None:
    """An application that sends little is not congested: no trims, no cut."""
    params = nscc_params(max_cwnd=128 * MTU)
    cc = create("nscc", params, MTU, 0.0)
    now = _incast_epoch(cc, delivered=3, trims=0, now=0.0)
    cc.on_ack(MTU, BASE_RTT, False, now + 5 * BASE_RTT)
    assert cc.cwnd == params.max_cwnd


def test_nscc_lowers_base_rtt_to_the_smallest_sample() -> None:
    cc = create("nscc", CCParams(base_rtt=1e-3), MTU, 0.0)
    assert isinstance(cc, Nscc)
    cc.on_ack(MTU, 5e-6, False, 1e-5)
    cc.on_ack(MTU, 8e-6, False, 2e-5)
    assert cc.base_rtt == 5e-6
    assert cc.target_delay == pytest.approx(0.75 * 5e-6)


def _shared_bottleneck(ccs: list[CongestionController], rounds: int) -> list[float]:
    """A fluid bottleneck at RATE: queue = excess over the BDP, ECN above 10% of the BDP.

    Returns the queuing delay (s) seen in each round.
    """
    capacity = RATE / 8
    bdp = capacity * BASE_RTT
    buffer = bdp
    now, delays = 0.0, []
    for _ in range(rounds):
        total = sum(cc.cwnd for cc in ccs)
        queue = max(0.0, total - bdp)
        trimmed = max(0.0, queue - buffer) / total
        queue = min(queue, buffer)
        rtt = BASE_RTT + queue / capacity
        for cc in ccs:
            packets = max(1, cc.cwnd // MTU)
            for i in range(packets):
                at = now + rtt * i / packets
                if i < int(packets * trimmed):
                    cc.on_trim(at)
                else:
                    cc.on_ack(MTU, rtt, queue > 0.1 * bdp, at)
        now += rtt
        delays.append(queue / capacity)
    return delays


def test_nscc_flows_converge_and_bound_queuing_delay() -> None:
    target = 0.2 * BASE_RTT
    params = nscc_params(target_delay=target, qa_threshold=4 * target)
    big = create("nscc", params, MTU, 0.0)
    small = create("nscc", dataclasses.replace(params, initial_cwnd=MTU), MTU, 0.0)
    delays = _shared_bottleneck([big, small], rounds=400)
    assert max(delays[-50:]) < 2.5 * target
    assert min(big.cwnd, small.cwnd) / max(big.cwnd, small.cwnd) > 0.75


def test_nscc_recovers_from_an_incast_overshoot() -> None:
    """Eight flows starting at max_cwnd into a shallow buffer: quick adapt, then recovery."""
    ccs = [create("nscc", nscc_params(), MTU, 0.0) for _ in range(8)]
    _shared_bottleneck(ccs, rounds=1)
    assert sum(cc.cwnd for cc in ccs) < RATE / 8 * BASE_RTT  # cut below one BDP in total
    _shared_bottleneck(ccs, rounds=100)
    assert sum(cc.cwnd for cc in ccs) >= RATE / 8 * BASE_RTT  # the link is full again


# --- fixed and DCQCN-lite ------------------------------------------------------------------


def test_dcqcn_lite_cuts_on_ecn_and_recovers() -> None:
    params = nscc_params()
    cc = create("dcqcn_lite", params, MTU, 0.0)
    now = feed_acks(cc, 1, BASE_RTT, True, 0.0)
    cut = cc.cwnd
    assert cut <= params.max_cwnd // 2 + 1
    feed_acks(cc, 2000, BASE_RTT, False, now)
    assert cc.cwnd > cut


# --- properties over random event sequences -----------------------------------------------

_events = st.lists(
    st.tuples(
        st.sampled_from(["ack", "trim", "loss", "timeout", "sent"]),
        st.floats(min_value=0.0, max_value=50e-6),  # time step
        st.integers(min_value=0, max_value=2 * MTU),  # bytes
        st.one_of(st.none(), st.floats(min_value=0.0, max_value=5e-3)),  # rtt
        st.booleans(),  # ecn
    ),
    max_size=200,
)


@st.composite
def _params(draw: st.DrawFn) -> CCParams:
    max_cwnd = draw(st.integers(min_value=MTU, max_value=256 * MTU))
    min_cwnd = draw(st.one_of(st.none(), st.integers(min_value=1, max_value=max_cwnd)))
    low = min_cwnd or 1
    initial = draw(st.one_of(st.none(), st.integers(min_value=low, max_value=max_cwnd)))
    return CCParams(
        base_rtt=draw(st.floats(min_value=1e-6, max_value=2e-3)),
        target_delay=draw(st.one_of(st.none(), st.floats(min_value=1e-7, max_value=1e-3))),
        max_cwnd=max_cwnd,
        min_cwnd=min_cwnd,
        initial_cwnd=initial,
        qa_gate=draw(st.integers(min_value=0, max_value=8)),
        disable_qa=draw(st.booleans()),
        adjust_bytes_threshold=draw(st.one_of(st.none(), st.integers(1, 64 * MTU))),
    )


Event = tuple[str, float, int, float | None, bool]


def _drive(cc: CongestionController, events: list[Event]) -> Iterator[int]:
    now = 0.0
    for kind, step, nbytes, rtt, ecn in events:
        now += step
        if kind == "ack":
            cc.on_ack(nbytes, rtt, ecn, now)
        elif kind == "trim":
            cc.on_trim(now)
        elif kind == "loss":
            cc.on_loss(now)
        elif kind == "timeout":
            cc.on_timeout(now)
        else:
            cc.on_sent(nbytes, now)
        yield cc.cwnd


@settings(max_examples=150, deadline=None, derandomize=True)
@given(name=st.sampled_from(sorted(REGISTRY)), params=_params(), events=_events)
def test_window_stays_within_bounds(name: str, params: CCParams, events: list[Event]) -> None:
    cc = create(name, params, MTU, 0.0)
    low, high = max(params.min_cwnd or MTU, MTU), params.max_cwnd
    assert low <= cc.cwnd <= high
    for cwnd in _drive(cc, events):
        assert isinstance(cwnd, int)
        assert low <= cwnd <= high


@settings(max_examples=50, deadline=None, derandomize=True)
@given(params=_params(), events=_events)
def test_fixed_window_never_changes(params: CCParams, events: list[Event]) -> None:
    cc = create("fixed", params, MTU, 0.0)
    expected = max(params.initial_cwnd or params.max_cwnd, MTU)
    assert cc.cwnd == expected
    assert all(cwnd == expected for cwnd in _drive(cc, events))
