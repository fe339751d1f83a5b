"""A congestion control profile (:class:`CCParams`): the OCP NSCC parameters and window
bounds, checked when made.

Apart from the controllers (:mod:`mrcstack.core.cc`) because it is a boundary: profiles come
from configuration files and the controller API, and a bad field must be named.  The
controllers are compiled with mypyc (:mod:`mrcstack.native`), which would refuse a field of
the wrong type with a bare ``TypeError`` before any check could name it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# --- CCParams defaults and derivation ------------------------------------------------------
DEFAULT_BASE_RTT = 1e-3  # s; ours: an upper bound, controllers lower it to the smallest RTT seen
DEFAULT_MAX_CWND = 512 * 1024  # bytes; ours: >= BDP of 4 x 100 Gbit/s at 10 us, 1 Gbit/s at 4 ms
DEFAULT_QA_GATE = 3  # UET ref: quick adapt only if delivered < max_cwnd >> 3
MAX_QA_GATE = 31  # ours: a larger shift would gate every window to zero
TARGET_DELAY_BASE_RTT_RATIO = 0.75  # UET ref: target_qdelay = 0.75 x RTT with trimming on
QA_THRESHOLD_TARGET_RATIO = 4.0  # UET ref: qa_threshold = 4 x target_qdelay
ADJUST_BYTES_PACKETS = 8  # UET ref: adjust_bytes_threshold = 8 MTU
MAX_CWND_BDP_RATIO = 1.5  # UET ref: max_cwnd = 1.5 x BDP
ADJUST_BYTES_BDP_DIVISOR = 8  # ours: for_path adjusts about 8 times per RTT (8 MTU at UET scale)
FOR_PATH_MIN_MAX_CWND = 64 * 1024  # ours: keep several packets in flight on a tiny BDP


def require_positive(field: str, value: float) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value > 0):
        raise ValueError(f"{field} must be a positive finite number, got {value!r}")


def require_int(field: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{field} must be an int >= {minimum}, got {value!r}")


@dataclass(frozen=True, slots=True)
class CCParams:
    """One CC profile: the OCP NSCC parameters plus window bounds.

    ``None`` means "derive it", so the defaults serve both a simulated fabric (RTT of a few
    microseconds) and a Linux testbed (RTT of 0.1-2 ms).  For a known path prefer
    :meth:`for_path`, and ``dataclasses.replace`` to override single fields.
    """

    base_rtt: float = DEFAULT_BASE_RTT
    """Unloaded RTT (s).  Controllers use min(base_rtt, smallest RTT sample), so too high is
    self-correcting and the default is deliberately high."""
    target_delay: float | None = None
    """Queuing delay (s) NSCC aims for; None: 0.75 x the effective base RTT."""
    max_cwnd: int = DEFAULT_MAX_CWND
    """Largest window (bytes); about 1.5 x BDP of the whole connection (all planes)."""
    adjust_bytes_threshold: int | None = None
    """Apply batched increases after this many bytes acked; None: 8 packets."""
    adjust_period_threshold: float | None = None
    """...or after this long (s) since the last adjustment; None: the effective base RTT."""
    qa_gate: int = DEFAULT_QA_GATE
    """Quick adapt fires only if an epoch delivered less than max_cwnd >> qa_gate bytes."""
    qa_threshold: float | None = None
    """Queuing delay (s) that arms quick adapt, like a trim does; None: 4 x target_delay."""
    disable_qa: bool = False
    """Turn quick adapt off."""
    initial_cwnd: int | None = None
    """Starting window (bytes); None: max_cwnd, as UET does (line rate in the first RTT:
    trimming and quick adapt make an overshoot cheap)."""
    min_cwnd: int | None = None
    """Smallest window (bytes); None or less than a packet: one packet (mtu_payload)."""

    def __post_init__(self) -> None:
        require_positive("base_rtt", self.base_rtt)
        for name in ("target_delay", "adjust_period_threshold", "qa_threshold"):
            value = getattr(self, name)
            if value is not None:
                require_positive(name, value)
        require_int("max_cwnd", self.max_cwnd, 1)
        if self.adjust_bytes_threshold is not None:
            require_int("adjust_bytes_threshold", self.adjust_bytes_threshold, 1)
        require_int("qa_gate", self.qa_gate, 0)
        if self.qa_gate > MAX_QA_GATE:
            raise ValueError(f"qa_gate must be <= {MAX_QA_GATE}, got {self.qa_gate!r}")
        if not isinstance(self.disable_qa, bool):
            raise ValueError(f"disable_qa must be a bool, got {self.disable_qa!r}")
        if self.min_cwnd is not None:
            require_int("min_cwnd", self.min_cwnd, 1)
            if self.min_cwnd > self.max_cwnd:
                raise ValueError(f"min_cwnd {self.min_cwnd} exceeds max_cwnd {self.max_cwnd}")
        if self.initial_cwnd is not None:
            require_int("initial_cwnd", self.initial_cwnd, 1)
            low = self.min_cwnd or 1
            if not low <= self.initial_cwnd <= self.max_cwnd:
                raise ValueError(
                    f"initial_cwnd {self.initial_cwnd} outside [{low}, {self.max_cwnd}]"
                )

    @classmethod
    def for_path(cls, rate_bps: float, base_rtt: float) -> CCParams:
        """Derive a profile from the connection's line rate (all planes, bit/s) and base RTT.

        max_cwnd = 1.5 x BDP (at least 64 KiB), target_delay = 0.75 x base_rtt,
        qa_threshold = 4 x target_delay, adjustments every BDP/8 bytes or every base RTT.
        """
        require_positive("rate_bps", rate_bps)
        require_positive("base_rtt", base_rtt)
        bdp = rate_bps / 8 * base_rtt
        target = TARGET_DELAY_BASE_RTT_RATIO * base_rtt
        return cls(
            base_rtt=base_rtt,
            target_delay=target,
            max_cwnd=max(math.ceil(MAX_CWND_BDP_RATIO * bdp), FOR_PATH_MIN_MAX_CWND),
            adjust_bytes_threshold=max(math.ceil(bdp / ADJUST_BYTES_BDP_DIVISOR), 1),
            adjust_period_threshold=base_rtt,
            qa_threshold=QA_THRESHOLD_TARGET_RATIO * target,
        )
