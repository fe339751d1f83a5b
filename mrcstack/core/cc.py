"""Pluggable congestion control: a window-controller base class, a registry, and NSCC.

The protocol core owns one controller per connection, feeds it events and asks only for
``cwnd`` (bytes the sender may have in flight).  Sans-IO: ``now`` is always a parameter
(float seconds); nothing here reads a clock or draws randomness.

Parameter names are the OCP MRC CC-profile ones (``mrc_ctl.h``: ``base_rtt``,
``target_delay``, ``max_cwnd``, ``adjust_bytes_threshold``, ``adjust_period_threshold``,
``qa_gate``, ``qa_threshold``, ``disable_qa``).  The algorithm follows the shape of UET 1.0's
NSCC (four ECN x delay quadrants, batched increases, a decrease proportional to the delay
excess, quick adapt).  The UET text is not available here: constants marked "UET ref" come
from the published descriptions of NSCC and its reference simulator (htsim); the others are
our choices and say so.
"""

from __future__ import annotations

import abc
import math
from typing import ClassVar, Final, TypeVar

from mypy_extensions import mypyc_attr

from mrcstack.core.ccparams import (
    ADJUST_BYTES_PACKETS,
    QA_THRESHOLD_TARGET_RATIO,
    TARGET_DELAY_BASE_RTT_RATIO,
    CCParams,
    require_int,
)

__all__ = [
    "REGISTRY",
    "CCParams",
    "CongestionController",
    "DcqcnLite",
    "FixedWindow",
    "Nscc",
    "create",
    "register",
]

# --- NSCC gains --------------------------------------------------------------------------
NSCC_PROPORTIONAL_INCREASE: Final = 1 / 16  # ours: x max_cwnd per RTT at zero delay (UET ref ~1/14)
NSCC_FAST_INCREASE_DELAY_RATIO: Final = 0.25  # ours: delay below target/4 is "far below target"
NSCC_FAST_INCREASE_GAIN: Final = 0.25  # UET ref fi_scale: +25% per RTT after a clean window
NSCC_FAIR_INCREASE_PACKETS: Final = 1  # ours: unmarked high delay grows one packet per RTT (mild)
NSCC_ETA: Final = (
    1 / 256
)  # ours: x max_cwnd added once per adjust period in every quadrant, so that
# flows holding unequal windows converge (AIMD); UET ref eta is ~1/370 at its scale
NSCC_GAMMA: Final = 0.8  # UET ref: decrease factor 1 - gamma * (avg_delay - target) / avg_delay
NSCC_MD_MIN_FACTOR: Final = 0.5  # UET ref: one decrease removes at most half the window
NSCC_DELAY_EWMA_GAIN: Final = 1 / 8  # ours (RFC 6298's SRTT gain); UET ref uses 1/80, more pkts/RTT
NSCC_TRIM_MAX_DECREASE: Final = 0.5  # ours: trims remove at most half the window per RTT

# --- DCQCN-lite (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", 2015) ---
DCQCN_G: Final = 1 / 16  # ours: alpha gain per window (DCQCN: 1/256 per 55 us timer tick)
DCQCN_FAST_RECOVERY_STEPS: Final = 5  # DCQCN F: halve the gap to the target this many times first
DCQCN_AI_PACKETS: Final = 1  # ours: additive increase of the target, packets per byte-counter event


# Python subclasses of it (and of its kin below) run beside it compiled (mrcstack.native).
@mypyc_attr(allow_interpreted_subclasses=True)
class CongestionController(abc.ABC):
    """A per-connection window controller driven by the protocol core.

    Subclasses set ``name`` and are made available with :func:`register`.  The window is
    always within [min_cwnd, max_cwnd], and min_cwnd is at least one packet.  Time that runs
    backwards is treated as no time elapsed.
    """

    name: ClassVar[str]

    def __init__(self, params: CCParams, mtu_payload: int, now: float) -> None:
        require_int("mtu_payload", mtu_payload, 1)
        if not math.isfinite(now):
            raise ValueError(f"now must be finite, got {now!r}")
        if params.max_cwnd < mtu_payload:
            raise ValueError(
                f"max_cwnd {params.max_cwnd} is below one packet (mtu_payload {mtu_payload})"
            )
        self._params = params
        self._mtu_payload = mtu_payload
        self._min_cwnd = max(params.min_cwnd or mtu_payload, mtu_payload)
        self._max_cwnd = params.max_cwnd
        self._base_rtt = params.base_rtt

    @property
    def params(self) -> CCParams:
        return self._params

    @property
    def mtu_payload(self) -> int:
        return self._mtu_payload

    @property
    def min_cwnd(self) -> int:
        return self._min_cwnd

    @property
    def max_cwnd(self) -> int:
        return self._max_cwnd

    @property
    def base_rtt(self) -> float:
        """Effective base RTT: the configured one, lowered by any smaller RTT sample."""
        return self._base_rtt

    @property
    @abc.abstractmethod
    def cwnd(self) -> int:
        """Bytes the sender may have in flight."""

    @abc.abstractmethod
    def on_ack(self, acked_bytes: int, rtt: float | None, ecn: bool, now: float) -> None:
        """One newly acknowledged data packet; ``rtt`` from its echoed timestamp, if any."""

    @abc.abstractmethod
    def on_trim(self, now: float) -> None:
        """A NACK for a trimmed packet: congestion."""

    @abc.abstractmethod
    def on_loss(self, now: float) -> None:
        """A silent loss: in MRC a broken path (the EV layer's business), not congestion."""

    @abc.abstractmethod
    def on_timeout(self, now: float) -> None:
        """A retransmission timeout."""

    def on_sent(self, sent_bytes: int, now: float) -> None:
        """Optional bookkeeping; the default ignores it."""
        require_int("sent_bytes", sent_bytes, 0)

    def _initial_window(self) -> float:
        initial = self._params.initial_cwnd
        return self._clamp(float(self._max_cwnd if initial is None else initial))

    def _clamp(self, window: float) -> float:
        return min(max(window, float(self._min_cwnd)), float(self._max_cwnd))

    def _check_ack(self, acked_bytes: int, rtt: float | None) -> None:
        """Validate an ack and let its RTT sample lower the effective base RTT."""
        require_int("acked_bytes", acked_bytes, 0)
        if rtt is None:
            return
        if not (math.isfinite(rtt) and rtt >= 0):
            raise ValueError(f"rtt must be None or a finite number >= 0, got {rtt!r}")
        if 0 < rtt < self._base_rtt:
            self._base_rtt = rtt


_C = TypeVar("_C", bound=type[CongestionController])

REGISTRY: dict[str, type[CongestionController]] = {}
"""Controllers by name; CC profiles and the simulator's configuration pick from here."""


def register(cls: _C) -> _C:
    """Class decorator: make ``cls`` creatable by its ``name``; duplicates are refused."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__qualname__} must set a non-empty class attribute 'name'")
    if name in REGISTRY:
        raise ValueError(
            f"congestion controller {name!r} is already registered by {REGISTRY[name].__qualname__}"
        )
    REGISTRY[name] = cls
    return cls


def create(name: str, params: CCParams, mtu_payload: int, now: float) -> CongestionController:
    """Instantiate the controller registered as ``name``."""
    try:
        cls = REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise ValueError(f"unknown congestion controller {name!r}; known: {known}") from None
    return cls(params, mtu_payload, now)


@mypyc_attr(allow_interpreted_subclasses=True)
class FixedWindow(CongestionController):
    """A constant window (initial_cwnd, else max_cwnd) that ignores every signal.

    The baseline for single-path RoCE-like runs (RoCE without DCQCN) and for experiments
    that want congestion control out of the picture.
    """

    name = "fixed"

    def __init__(self, params: CCParams, mtu_payload: int, now: float) -> None:
        super().__init__(params, mtu_payload, now)
        self._window = int(self._initial_window())

    @property
    def cwnd(self) -> int:
        return self._window

    def on_ack(self, acked_bytes: int, rtt: float | None, ecn: bool, now: float) -> None:
        self._check_ack(acked_bytes, rtt)

    def on_trim(self, now: float) -> None:
        pass

    def on_loss(self, now: float) -> None:
        pass

    def on_timeout(self, now: float) -> None:
        pass


@mypyc_attr(allow_interpreted_subclasses=True)
class Nscc(CongestionController):
    """NSCC-style window control from ECN echoes and queuing delay.

    Quadrants per ack (delay = rtt - base_rtt against target_delay):

    - no ECN, low delay: proportional increase (more the further below target), plus fast
      increase (+25% per RTT) once a whole window came back far below target;
    - no ECN, high delay: the congestion is not at a marking switch queue: grow mildly
      (one packet per RTT) so competing flows converge;
    - ECN, high delay: multiplicative decrease proportional to the smoothed delay excess,
      at most once per RTT;
    - ECN, low delay: one path is busier than the others, not the network: the window is
      kept and MRC's EV layer moves traffic off that path.

    Increases are batched (``adjust_bytes_threshold`` / ``adjust_period_threshold``), and
    every adjust period adds a small ``eta`` whatever the quadrant, so that flows holding
    unequal windows converge (additive increase against proportional decrease); decreases
    apply at once.  A trim removes one packet from the window, at most half the
    window per RTT, and arms quick adapt.  Quick adapt: at the end of each epoch
    (base_rtt + target_delay) in which a trim, a timeout or a delay above ``qa_threshold``
    was seen, if fewer than ``max_cwnd >> qa_gate`` bytes were delivered the window drops to
    what was delivered; signals from the packets already in flight are then ignored.

    A silent loss changes nothing: in MRC it means a broken path, which the EV layer
    retires; shrinking the window would punish every healthy path for it.  A timeout is a
    packet whose fate is unknown and is treated like a trim.
    """

    name = "nscc"

    def __init__(self, params: CCParams, mtu_payload: int, now: float) -> None:
        super().__init__(params, mtu_payload, now)
        # The profile's values that on_ack reads per packet (None: derived, as below).
        self._target_delay = params.target_delay
        self._qa_threshold_cfg = params.qa_threshold
        self._adjust_period_cfg = params.adjust_period_threshold
        self._adjust_bytes_n = self._adjust_bytes()
        self._cwnd = self._initial_window()
        self._avg_delay = 0.0
        # Batched increases.
        self._pending_increase = 0.0
        self._bytes_since_adjust = 0
        self._last_adjust = now
        self._last_eta = now
        self._clean_streak = 0  # bytes acked in a row far below target
        # Decreases.
        self._last_decrease = -math.inf
        self._trim_epoch_end = -math.inf
        self._trim_budget = 0.0
        # Quick adapt.
        self._qa_epoch_end = now + self._qa_period()
        self._qa_armed = False
        self._achieved = 0
        self._stale_bytes = 0.0  # signals of this many more bytes predate the last QA cut
        self._stale_until = -math.inf

    @property
    def cwnd(self) -> int:
        return int(self._cwnd)

    @property
    def target_delay(self) -> float:
        configured = self._params.target_delay
        if configured is not None:
            return configured
        return TARGET_DELAY_BASE_RTT_RATIO * self._base_rtt

    @property
    def avg_delay(self) -> float:
        """Smoothed queuing delay (s), the measure of a multiplicative decrease."""
        return self._avg_delay

    def _qa_threshold(self) -> float:
        configured = self._params.qa_threshold
        return QA_THRESHOLD_TARGET_RATIO * self.target_delay if configured is None else configured

    def _adjust_bytes(self) -> int:
        configured = self._params.adjust_bytes_threshold
        return ADJUST_BYTES_PACKETS * self._mtu_payload if configured is None else configured

    def _adjust_period(self) -> float:
        configured = self._params.adjust_period_threshold
        return self._base_rtt if configured is None else configured

    def _qa_period(self) -> float:
        return self._base_rtt + self.target_delay

    def _rtt_estimate(self) -> float:
        return self._base_rtt + self._avg_delay

    def _set_cwnd(self, window: float) -> None:
        self._cwnd = self._clamp(window)

    def on_ack(self, acked_bytes: int, rtt: float | None, ecn: bool, now: float) -> None:
        # This runs once per packet acknowledged: the checks and helpers it shares with the
        # rest of the class (_check_ack, target_delay, _qa_threshold, _consume_stale, the
        # adjust thresholds) are written out here, with the same arithmetic.
        if type(acked_bytes) is not int or acked_bytes < 0:
            require_int("acked_bytes", acked_bytes, 0)
        if rtt is None:
            delay = self._avg_delay
        else:
            if not 0 <= rtt < math.inf:  # false for NaN too
                raise ValueError(f"rtt must be None or a finite number >= 0, got {rtt!r}")
            if 0 < rtt < self._base_rtt:
                self._base_rtt = rtt
            delay = rtt - self._base_rtt
            if not delay > 0.0:
                delay = 0.0
            self._avg_delay += NSCC_DELAY_EWMA_GAIN * (delay - self._avg_delay)
        cut = now >= self._qa_epoch_end and self._end_qa_epoch_if_due(now)
        self._achieved += acked_bytes
        if now >= self._stale_until:
            self._stale_bytes = 0.0
        if self._stale_bytes <= 0:
            stale = False
        else:
            self._stale_bytes -= acked_bytes
            stale = True
        target = self._target_delay
        if target is None:
            target = TARGET_DELAY_BASE_RTT_RATIO * self._base_rtt
        qa_threshold = self._qa_threshold_cfg
        if qa_threshold is None:
            qa_threshold = QA_THRESHOLD_TARGET_RATIO * target
        if delay > qa_threshold and not stale:
            self._qa_armed = True
        if cut:
            return
        if not ecn:  # increase, batched until the next adjustment (inline: once per ACK)
            per_window = acked_bytes / self._cwnd
            if delay < target:
                headroom = (target - delay) / target
                gain = NSCC_PROPORTIONAL_INCREASE * self._max_cwnd * headroom
                self._pending_increase += gain * per_window
                if delay <= NSCC_FAST_INCREASE_DELAY_RATIO * target:
                    self._clean_streak += acked_bytes
                    if self._clean_streak >= self._cwnd:
                        self._pending_increase += NSCC_FAST_INCREASE_GAIN * acked_bytes
                else:
                    self._clean_streak = 0
            else:
                self._clean_streak = 0
                fair = NSCC_FAIR_INCREASE_PACKETS * self._mtu_payload
                self._pending_increase += fair * per_window
        else:
            self._clean_streak = 0
            if delay >= target and not stale:
                self._decrease(now, target)
        self._bytes_since_adjust += acked_bytes
        period = self._adjust_period_cfg
        if self._bytes_since_adjust >= self._adjust_bytes_n or now - self._last_adjust >= (
            self._base_rtt if period is None else period
        ):
            self._adjust(now)

    def _adjust(self, now: float) -> None:
        """Apply the batched increase, plus eta once per adjust period."""
        increase = self._pending_increase
        if now - self._last_eta >= self._adjust_period():
            increase += NSCC_ETA * self._max_cwnd
            self._last_eta = now
        self._set_cwnd(self._cwnd + increase)
        self._pending_increase = 0.0
        self._bytes_since_adjust = 0
        self._last_adjust = now

    def on_trim(self, now: float) -> None:
        self._congestion_loss(now)

    def on_loss(self, now: float) -> None:
        pass  # a broken path, not congestion: see the class docstring

    def on_timeout(self, now: float) -> None:
        self._congestion_loss(now)

    def _congestion_loss(self, now: float) -> None:
        """A packet that did not make it because of congestion (a trim, or a timeout)."""
        self._end_qa_epoch_if_due(now)
        if self._consume_stale(self._mtu_payload, now):
            return
        self._qa_armed = True
        self._clean_streak = 0
        if now >= self._trim_epoch_end:
            self._trim_epoch_end = now + self._rtt_estimate()
            self._trim_budget = self._cwnd * NSCC_TRIM_MAX_DECREASE
        step = min(float(self._mtu_payload), self._trim_budget)
        self._trim_budget -= step
        self._set_cwnd(self._cwnd - step)

    def _decrease(self, now: float, target: float) -> None:
        avg = self._avg_delay
        if avg <= target or now - self._last_decrease < self._rtt_estimate():
            return
        factor = max(1.0 - NSCC_GAMMA * (avg - target) / avg, NSCC_MD_MIN_FACTOR)
        self._set_cwnd(self._cwnd * factor)
        self._pending_increase = 0.0
        self._last_decrease = now

    def _end_qa_epoch_if_due(self, now: float) -> bool:
        """Close a finished quick-adapt epoch; True if it cut the window."""
        if now < self._qa_epoch_end:
            return False
        cut = (
            self._qa_armed
            and not self._params.disable_qa
            and self._achieved < self._max_cwnd >> self._params.qa_gate
            and self._achieved < self._cwnd
        )
        if cut:
            self._stale_bytes = self._cwnd
            self._stale_until = now + self._base_rtt + self._qa_threshold()
            self._set_cwnd(float(self._achieved))
            self._pending_increase = 0.0
            self._clean_streak = 0
        self._qa_armed = False
        self._achieved = 0
        self._qa_epoch_end = now + self._qa_period()
        return cut

    def _consume_stale(self, nbytes: int, now: float) -> bool:
        """True if this signal belongs to packets sent before the last quick-adapt cut."""
        if now >= self._stale_until:
            self._stale_bytes = 0.0
        if self._stale_bytes <= 0:
            return False
        self._stale_bytes -= nbytes
        return True


@mypyc_attr(allow_interpreted_subclasses=True)
class DcqcnLite(CongestionController):
    """A RoCE+DCQCN-like baseline, as a window and without timers.

    ECN (or a trim) cuts the window by alpha/2 at most once per RTT, alpha being the
    marked fraction smoothed per window; every ``adjust_bytes_threshold`` bytes acked
    without a cut first halves the gap to the pre-cut window (fast recovery), then raises
    that target by one packet (additive increase).  Losses and timeouts are ignored, as
    DCQCN reacts only to congestion notifications.
    """

    name = "dcqcn_lite"

    def __init__(self, params: CCParams, mtu_payload: int, now: float) -> None:
        super().__init__(params, mtu_payload, now)
        self._cwnd = self._initial_window()
        self._target = self._cwnd
        self._alpha = 1.0  # DCQCN starts at 1: the first cut halves the window
        self._window_bytes = 0
        self._marked_bytes = 0
        self._byte_counter = 0
        self._stage = 0
        self._last_cut = -math.inf

    @property
    def cwnd(self) -> int:
        return int(self._cwnd)

    def on_ack(self, acked_bytes: int, rtt: float | None, ecn: bool, now: float) -> None:
        self._check_ack(acked_bytes, rtt)
        self._window_bytes += acked_bytes
        if ecn:
            self._marked_bytes += acked_bytes
        if self._window_bytes >= self._cwnd:
            fraction = self._marked_bytes / self._window_bytes
            self._alpha += DCQCN_G * (fraction - self._alpha)
            self._window_bytes = self._marked_bytes = 0
        if ecn:
            self._cut(now)
            return
        self._byte_counter += acked_bytes
        threshold = self._params.adjust_bytes_threshold or ADJUST_BYTES_PACKETS * self._mtu_payload
        if self._byte_counter >= threshold:
            self._byte_counter = 0
            self._stage += 1
            if self._stage > DCQCN_FAST_RECOVERY_STEPS:
                self._target = self._clamp(self._target + DCQCN_AI_PACKETS * self._mtu_payload)
            self._cwnd = self._clamp((self._cwnd + self._target) / 2)

    def on_trim(self, now: float) -> None:
        self._cut(now)

    def on_loss(self, now: float) -> None:
        pass

    def on_timeout(self, now: float) -> None:
        pass

    def _cut(self, now: float) -> None:
        if now - self._last_cut < self._base_rtt:
            return
        self._target = self._cwnd
        self._cwnd = self._clamp(self._cwnd * (1 - self._alpha / 2))
        self._stage = 0
        self._byte_counter = 0
        self._last_cut = now


# Registered after their definitions, not by decorator: mypyc compiles a decorated class as
# a plain Python class (see mrcstack.native).
register(FixedWindow)
register(Nscc)
register(DcqcnLite)
