"""What probing costs: packets and bytes per host, and the share of each link it takes.

A loop crosses each of its links once each way, so a link carries, in each direction, one
packet per loop over it per round.  Sizes are IPv6 packets (header 40, UDP 8, the sealed
probe): Ethernet framing adds 38 bytes per packet on a real link.
"""

from __future__ import annotations

from dataclasses import dataclass

from mrcstack.mapper.plan import ProbePlan
from mrcstack.wire import ENDPOINT_QPN, AeadIntegrity, ProbePacket, encode

IP_UDP_HEADER_BYTES = 48
_KEY = bytes(32)


def probe_bytes() -> int:
    """One probe as an IPv6 packet: the headers and the AES-GCM-sealed probe."""
    sealed = encode(ProbePacket(ENDPOINT_QPN, 0, 0, 1, 0), AeadIntegrity(_KEY, 1, 2))
    return len(sealed) + IP_UDP_HEADER_BYTES


@dataclass(frozen=True, slots=True)
class ProbeCost:
    """Probing at ``interval`` seconds per round."""

    interval: float
    probe_bytes: int
    host_packets_per_s: float  # the busiest host: probes it sends (it receives as many)
    host_bytes_per_s: float  # the same in bytes, over all its NIC ports
    host_link_bps: float  # the busiest host link, each way
    fabric_link_bps: float  # the busiest T0-T1 link, each way

    def fraction(self, link_bps: float) -> float:
        """The busiest link's probe traffic over a link capacity of ``link_bps``."""
        return max(self.host_link_bps, self.fabric_link_bps) / link_bps

    def to_json(self) -> dict[str, float]:
        return {
            "interval_s": self.interval,
            "probe_bytes": self.probe_bytes,
            "host_packets_per_s": self.host_packets_per_s,
            "host_bytes_per_s": self.host_bytes_per_s,
            "host_link_bps": self.host_link_bps,
            "fabric_link_bps": self.fabric_link_bps,
        }


def probe_cost(plan: ProbePlan, interval: float, short_repeat: int = 1) -> ProbeCost:
    if not interval > 0:
        raise ValueError(f"interval must be positive, got {interval}")
    size = probe_bytes()
    per_link: dict[str, int] = {}
    per_host = [0] * plan.fabric.hosts
    for p in plan.paths:
        n = short_repeat if p.short else 1
        per_host[p.host] += n
        for link in p.links:
            per_link[link] = per_link.get(link, 0) + n
    rate = 1.0 / interval
    host_side = [n for link, n in per_link.items() if link.split(":")[1].startswith("h")]
    fabric_side = [n for link, n in per_link.items() if not link.split(":")[1].startswith("h")]
    busiest = max(per_host)
    return ProbeCost(
        interval,
        size,
        busiest * rate,
        busiest * rate * size,
        max(host_side, default=0) * rate * size * 8,
        max(fabric_side, default=0) * rate * size * 8,
    )
