"""Connection configuration (a boundary: frozen) and its counters (internal, read by adapters)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mrcstack.core.cc import CCParams
from mrcstack.core.evs import EvEntry

MODES = ("mrc", "roce")


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
    local_psn: int = 0  # first PSN this end sends
    remote_psn: int = 0  # first PSN the peer sends
    profile_id: int = 0
    ev_count: int = 128
    ev_min_active: int = 1
    denied: frozenset[int] = frozenset()
    timeout: float = 200e-6  # minimum retransmission timeout (OCP QP attribute `timeout`)
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
    max_window: int = 1 << 20  # packets between oldest unacked and newest sent
    ack_coalesce: int = 1  # data packets one ACK may stand for (until the next transmit)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        for name in ("local_qpn", "remote_qpn", "local_psn", "remote_psn"):
            value = getattr(self, name)
            if not 0 <= value < 1 << 24:
                raise ValueError(f"{name} must be a 24-bit value, got {value}")
        if self.planes < 1:
            raise ValueError("planes must be >= 1")
        if not 1 <= self.mtu_payload <= 65000:
            raise ValueError(f"mtu_payload out of range: {self.mtu_payload}")
        if self.encrypt and self.key is None:
            raise ValueError("encrypt needs a key")
        if self.timeout <= 0 or self.max_rto < self.timeout:
            raise ValueError("need 0 < timeout <= max_rto")
        if self.initial_rto is not None and not self.timeout <= self.initial_rto <= self.max_rto:
            raise ValueError("need timeout <= initial_rto <= max_rto")
        if self.linear_cnt < 0 or self.exp_cnt < 0:
            raise ValueError("retry counts must be >= 0")
        if not 1 <= self.ack_coalesce <= 64:
            raise ValueError("ack_coalesce must be in 1..64 (the SACK bitmap covers 64)")
        if not 1 <= self.max_window < 1 << 23:
            raise ValueError("max_window must be in 1..2**23-1 (24-bit PSN space)")


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
    spurious_retransmissions: int = 0  # retransmitted, then the original was acknowledged
    rejected: dict[str, int] = field(default_factory=dict)
    probes_sent: int = 0
    probe_replies: int = 0
    ev_state_changes: int = 0
    rtt_samples: int = 0

    def __post_init__(self) -> None:
        for name in ("packets_sent", "bytes_sent", "packets_received", "bytes_received"):
            setattr(self, name, [0] * self.planes)

    def count(self, table: dict[str, int], key: str, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n
