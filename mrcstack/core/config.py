"""Connection configuration (a boundary: frozen) and its counters (internal, read by adapters)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mrcstack.core.cc import CCParams, CongestionController, create
from mrcstack.core.evs import EvEntry, check_entries
from mrcstack.errors import ConfigError
from mrcstack.wire.evformat import EvFormat
from mrcstack.wire.integrity import IcrcPath
from mrcstack.wire.packets import MAX_WINDOW

MODES = ("mrc", "roce")
#: The port-state bitmap in SACKs and probe replies is 16 bits wide: one bit per plane.
MAX_PLANES = 16


def max_ack_delay(timeout: float) -> float:
    """The longest ``ack_delay`` a connection with minimum RTO ``timeout`` takes: a quarter
    of it, so a delayed ACK never looks lost."""
    return timeout / 4


@dataclass(frozen=True, slots=True)
class ConnectionConfig:
    """Everything a connection (MRC's QP) needs; both ends are configured out of band.

    ``evs`` are the paths from this end to the peer (an explicit or generated EV profile).
    ``mode="roce"`` is the single-path baseline: one EV, in-order receiver, go-back-N.
    """

    local_qpn: int
    remote_qpn: int
    planes: int
    evs: tuple[EvEntry, ...]
    mode: str = "mrc"
    cc: str = "nscc"
    cc_params: CCParams | None = None
    mtu_payload: int = 4096
    key: bytes | None = None  # AES-GCM key: authenticate every packet (and replay-protect)
    encrypt: bool = False  # also encrypt payloads (needs key)
    #: mrcstack's extension headers (XETH/XFETH), negotiated with the peer: off, the QP
    #: speaks OCP MRC 1.0 alone (a peer without mrcstack).  AES-GCM needs them.
    extensions: bool = True
    # Per plane (local, peer) IPv6 addresses as packets arrive, for the RoCEv2 ICRC's
    # pseudo header; empty: the ICRC counts them as ``::`` (the simulator, loopback tests).
    icrc_paths: tuple[IcrcPath, ...] = ()
    # How EVs reach the fabric; with STEV the UDP source port (in the ICRC) is the EV's.
    ev_format: EvFormat = EvFormat.SRV6
    local_psn: int = 0  # first PSN this end sends
    remote_psn: int = 0  # first PSN the peer sends
    profile_id: int = 0
    ev_count: int = 128
    ev_min_active: int = 1
    denied: frozenset[int] = frozenset()
    #: Minimum retransmission timeout, OCP's QP attribute ``timeout``; as an exponent ``t``
    #: (verbs' ACK timeout) it is ``1.024 us * 2**t``: :func:`timeout_from_exponent`.
    timeout: float = 200e-6
    max_rto: float = 0.25
    # RTO until the first RTT sample; None: ``timeout``.  A software endpoint's first window
    # takes longer than its steady RTT (RFC 6298 starts at 1 s for the same reason).
    initial_rto: float | None = None
    linear_cnt: int = 3  # timeouts at the base RTO before exponential back-off
    exp_cnt: int = 4  # then this many doubling timeouts; exhausted -> connection fails
    probe_interval: float | None = None  # None: derived from the smoothed RTT
    probe_ok_needed: int = 3  # consecutive probe replies that resurrect an EV
    probe_lost_needed: int = 2  # consecutive lost probes that demote a feedback EV
    skip_rtts: float = 4.0  # how long an ECN-marked or trimmed EV is skipped
    reverse_evs_per_plane: int = 2
    # Packets between oldest unacked and newest sent; SACK states it as MPR (128-PSN units,
    # 8 bits), so 32,640 at most.
    max_window: int = MAX_WINDOW
    ack_coalesce: int = 1  # data packets one ACK may stand for (until the next transmit)
    #: Seconds a coalesced ACK may wait, past the transmit that would have sent it, for
    #: more data on its port (0: it leaves with that transmit).  A write's last packet,
    #: and one the peer flags ACK_REQ (as this end flags the packet after which its
    #: window is full, and every retransmission), is acknowledged at once.  Well under
    #: ``timeout``.
    ack_delay: float = 0.0

    def retry_budget(self, base: float | None = None) -> float:
        """Seconds without progress before the connection fails: with ``L = linear_cnt``,
        ``E = exp_cnt`` and the RTO ``base`` (``timeout``, or the measured
        ``srtt + 4 * rttvar`` when larger), ``base * (L + 1) + base * (2 + 4 + ... + 2**E)``,
        each doubling capped at ``max_rto``: L + 1 timeouts at the base, then E doubling."""
        rto = self.timeout if base is None else max(self.timeout, base)
        return sum(
            min(self.max_rto, rto * (1 << max(0, k - self.linear_cnt)))
            for k in range(self.linear_cnt + self.exp_cnt + 1)
        )

    def controller(self, now: float) -> CongestionController:
        """A new congestion controller for this connection (``cc`` with ``cc_params``, or
        the default parameters), as of ``now``."""
        return create(
            self.cc,
            self.cc_params if self.cc_params is not None else CCParams(),
            self.mtu_payload,
            now,
        )

    def __post_init__(self) -> None:
        """Check every field: a bad value raises :class:`ConfigError` naming it (local misuse),
        so nothing later fails deep inside ``receive_datagram`` or a timer."""
        _check(self.mode in MODES, "mode", f"must be one of {MODES}, got {self.mode!r}")
        for name in ("local_qpn", "remote_qpn", "local_psn", "remote_psn"):
            value = getattr(self, name)
            _check(0 <= value < 1 << 24, name, f"must be a 24-bit value, got {value}")
        _check(
            1 <= self.planes <= MAX_PLANES,
            "planes",
            f"must be in 1..{MAX_PLANES} (the port-state bitmap), got {self.planes}",
        )
        try:
            check_entries(self.evs, self.planes)
        except ConfigError as exc:
            raise ConfigError(f"ConnectionConfig.evs: {exc}") from None
        _check(1 <= self.mtu_payload <= 65000, "mtu_payload", f"out of range: {self.mtu_payload}")
        _check(not self.encrypt or self.key is not None, "encrypt", "needs a key")
        _check(
            self.extensions or self.key is None,
            "key",
            "AES-GCM packet authentication needs mrcstack's extension headers (its nonce is "
            "their tx_seq), which this QP has off",
        )
        _check(
            0 <= self.profile_id < 1 << 64, "profile_id", f"must be a u64, got {self.profile_id}"
        )
        _check(self.ev_count >= 1, "ev_count", f"must be >= 1, got {self.ev_count}")
        _check(
            0 <= self.ev_min_active <= self.ev_count,
            "ev_min_active",
            f"must be in 0..ev_count ({self.ev_count}), got {self.ev_min_active}",
        )
        for name in ("timeout", "max_rto"):
            value = getattr(self, name)
            _check(_finite(value) and value > 0, name, f"must be a positive time, got {value}")
        _check(self.timeout <= self.max_rto, "max_rto", f"must be >= timeout, got {self.max_rto}")
        if self.initial_rto is not None:
            _check(
                _finite(self.initial_rto) and self.timeout <= self.initial_rto <= self.max_rto,
                "initial_rto",
                f"need timeout <= initial_rto <= max_rto, got {self.initial_rto}",
            )
        for name in ("linear_cnt", "exp_cnt"):
            _check(getattr(self, name) >= 0, name, "retry counts must be >= 0")
        if self.probe_interval is not None:
            _check(
                _finite(self.probe_interval) and self.probe_interval > 0,
                "probe_interval",
                f"must be positive (or None), got {self.probe_interval}",
            )
        for name in ("probe_ok_needed", "probe_lost_needed", "reverse_evs_per_plane"):
            value = getattr(self, name)
            _check(value >= 1, name, f"must be >= 1, got {value}")
        _check(
            _finite(self.skip_rtts) and self.skip_rtts >= 0,
            "skip_rtts",
            f"must be a finite number >= 0, got {self.skip_rtts}",
        )
        _check(
            1 <= self.ack_coalesce <= 64,
            "ack_coalesce",
            f"must be in 1..64 (the SACK bitmap covers 64), got {self.ack_coalesce}",
        )
        _check(
            _finite(self.ack_delay) and 0 <= self.ack_delay <= max_ack_delay(self.timeout),
            "ack_delay",
            f"must be in 0..timeout/4 ({max_ack_delay(self.timeout):g} s), got {self.ack_delay}",
        )
        _check(
            1 <= self.max_window <= MAX_WINDOW,
            "max_window",
            f"must be in 1..{MAX_WINDOW} (a SACK's MPR states at most 255 x 128 PSNs), "
            f"got {self.max_window}",
        )


def _check(ok: bool, name: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"ConnectionConfig.{name}: {problem}")


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def _zeros(n: int = 0) -> list[int]:
    return [0] * n


@dataclass(slots=True)
class ConnectionStats:
    """Counters an adapter exports; plain mutable integers, updated on the hot path."""

    planes: int = 0
    packets_sent: list[int] = field(default_factory=_zeros)
    bytes_sent: list[int] = field(default_factory=_zeros)
    packets_received: list[int] = field(default_factory=_zeros)
    bytes_received: list[int] = field(default_factory=_zeros)
    data_bytes_placed: int = 0
    retransmissions: dict[str, int] = field(default_factory=dict)
    trims_received: int = 0  # trimmed data packets that arrived here
    nacks_received: dict[str, int] = field(default_factory=dict)
    ecn_echoes: int = 0
    ecn_received: int = 0
    duplicates: int = 0
    spurious_retransmissions: int = 0  # declared lost and resent, yet the receiver had it
    tlp_unneeded: int = 0  # tail-loss probes that found the tail had arrived (no loss)
    rejected: dict[str, int] = field(default_factory=dict)
    probes_sent: int = 0
    probe_replies: int = 0
    reliability_probes: int = 0  # PETH probes answered with our acknowledgement state
    ev_state_changes: int = 0
    rtt_samples: int = 0

    def __post_init__(self) -> None:
        for name in ("packets_sent", "bytes_sent", "packets_received", "bytes_received"):
            setattr(self, name, [0] * self.planes)

    def count(self, table: dict[str, int], key: str, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n


#: OCP's ACK timeout unit: ``timeout = ACK_TIMEOUT_UNIT * 2**t``.
ACK_TIMEOUT_UNIT = 1.024e-6


def timeout_from_exponent(t: int) -> float:
    """The ACK timeout an OCP/verbs exponent ``t`` (0..31) stands for, in seconds."""
    if not 0 <= t <= 31:
        raise ConfigError(f"timeout exponent: must be in 0..31, got {t}")
    return ACK_TIMEOUT_UNIT * (1 << t)
