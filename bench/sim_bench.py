"""Simulator speed: a full 64 MiB MRC transfer over a 4-plane fabric, timed on the wall clock.

Reports simulated packets and payload MB (10**6 bytes delivered) per wall-second, and the
protocol core's CPU microseconds per packet.  The core's share is measured by wrapping every
Connection call with ``time.perf_counter_ns`` (the run is single-threaded and CPU-bound, so
wall time inside a call is its CPU time); the rest is the simulator itself.
Run: ``python -m bench.sim_bench``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from mrcstack.core.config import ConnectionConfig
from mrcstack.core.connection import Connection, Outgoing
from mrcstack.core.events import Event
from mrcstack.core.memory import MemoryTable
from mrcstack.fabric import Fabric
from mrcstack.sim.runner import SimConfig
from mrcstack.sim.runner import run as run_sim
from mrcstack.wire import Packet

TRANSFER_BYTES = 64 << 20
FABRIC = Fabric(planes=4, racks=2, hosts_per_rack=2, t1_per_plane=8)
SEED = 7
NS_PER_US = 1000
BYTES_PER_MB = 1e6


class _CoreClock:
    """Nanoseconds spent inside the protocol core, summed over all connections."""

    def __init__(self) -> None:
        self.ns = 0


class _TimedConnection(Connection):
    """A Connection that adds the time of each adapter-facing call to a shared clock."""

    def __init__(
        self, config: ConnectionConfig, memory: MemoryTable, rng: random.Random, clock: _CoreClock
    ) -> None:
        self._clock = clock
        start = time.perf_counter_ns()
        super().__init__(config, memory=memory, rng=rng, now=0.0)
        clock.ns += time.perf_counter_ns() - start

    def post_write(
        self,
        wr_id: int,
        local: bytes | bytearray | memoryview,
        remote_va: int,
        rkey: int,
        *,
        imm: int | None = None,
        now: float,
    ) -> None:
        start = time.perf_counter_ns()
        super().post_write(wr_id, local, remote_va, rkey, imm=imm, now=now)
        self._clock.ns += time.perf_counter_ns() - start

    def receive_datagram(
        self, data: bytes | memoryview, *, now: float, port: int, ecn: bool = False
    ) -> None:
        start = time.perf_counter_ns()
        super().receive_datagram(data, now=now, port=port, ecn=ecn)
        self._clock.ns += time.perf_counter_ns() - start

    def receive_packet(
        self, pkt: Packet, size: int, *, now: float, port: int, ecn: bool = False
    ) -> None:
        start = time.perf_counter_ns()
        super().receive_packet(pkt, size, now=now, port=port, ecn=ecn)
        self._clock.ns += time.perf_counter_ns() - start

    def packets_to_send(  # (datagrams_to_send is this plus encoding: timed through it)
        self, now: float, limit: int = 1 << 16, data_limit: int | None = None
    ) -> list[Outgoing]:
        start = time.perf_counter_ns()
        out = super().packets_to_send(now, limit, data_limit)
        self._clock.ns += time.perf_counter_ns() - start
        return out

    def get_timer(self) -> float | None:
        start = time.perf_counter_ns()
        out = super().get_timer()
        self._clock.ns += time.perf_counter_ns() - start
        return out

    def handle_timer(self, now: float) -> None:
        start = time.perf_counter_ns()
        super().handle_timer(now)
        self._clock.ns += time.perf_counter_ns() - start

    def next_event(self) -> Event | None:
        start = time.perf_counter_ns()
        out = super().next_event()
        self._clock.ns += time.perf_counter_ns() - start
        return out

    def set_port_state(self, port: int, up: bool, now: float) -> None:
        start = time.perf_counter_ns()
        super().set_port_state(port, up, now)
        self._clock.ns += time.perf_counter_ns() - start


def run(transfer_bytes: int = TRANSFER_BYTES) -> dict[str, float]:
    """Time one transfer; every value is a float so the dict prints and compares easily."""
    clock = _CoreClock()

    def factory(config: ConnectionConfig, memory: MemoryTable, rng: random.Random) -> Connection:
        return _TimedConnection(config, memory, rng, clock)

    cfg = SimConfig(fabric=FABRIC, bytes_per_flow=transfer_bytes, seed=SEED)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    result = run_sim(cfg, connection_factory=factory)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    packets = result.packets_sent
    core_us = clock.ns / NS_PER_US
    return {
        "transfer_bytes": float(transfer_bytes),
        "packets": float(packets),
        "wall_s": wall,
        "cpu_s": cpu,
        "sim_time_s": result.sim_time_s,
        "packets_per_wall_s": packets / wall,
        "payload_mb_per_wall_s": result.bytes_delivered / wall / BYTES_PER_MB,
        "core_cpu_us_per_packet": core_us / packets,
        "sim_cpu_us_per_packet": (cpu * 1e6 - core_us) / packets,
        "goodput_fraction": result.goodput_fraction,
        "verified": float(result.verified),
    }


#: The same ``scaling()`` runs on this 2-core machine at the revision before SACK processing
#: became O(newly acknowledged) (packets per wall second), for the ratios it prints.
BASELINE_PKTS_PER_S = {
    "loss_1pct": 13_308.0,
    "evs_16": 15_689.0,
    "evs_256": 16_226.0,
    "evs_1024": 23_471.0,
}
LOSSY_BYTES = 16 << 20


def _timed(cfg: SimConfig) -> tuple[float, float, float]:
    """(packets per wall second, core CPU us per packet, verified) of one run."""
    clock = _CoreClock()

    def factory(config: ConnectionConfig, memory: MemoryTable, rng: random.Random) -> Connection:
        return _TimedConnection(config, memory, rng, clock)

    wall0 = time.perf_counter()
    result = run_sim(cfg, connection_factory=factory)
    wall = time.perf_counter() - wall0
    packets = result.packets_sent
    return packets / wall, clock.ns / NS_PER_US / packets, float(result.verified)


def scaling() -> dict[str, float]:
    """4 planes x 8 T1 at 1% loss on every link, and lossless at 16, 256 and 1024 EVs:
    packets per wall second, core CPU per packet, and the ratio to the recorded baseline."""
    cases = {
        "loss_1pct": SimConfig(fabric=FABRIC, bytes_per_flow=LOSSY_BYTES, loss=0.01, seed=SEED),
        **{
            f"evs_{n}": SimConfig(fabric=FABRIC, bytes_per_flow=LOSSY_BYTES, ev_count=n, seed=SEED)
            for n in (16, 256, 1024)
        },
    }
    out: dict[str, float] = {}
    for name, cfg in cases.items():
        rate, core_us, verified = _timed(cfg)
        out[f"{name}_packets_per_wall_s"] = rate
        out[f"{name}_core_cpu_us_per_packet"] = core_us
        base = BASELINE_PKTS_PER_S.get(name, 0.0)
        out[f"{name}_vs_baseline"] = rate / base if base else float("nan")
        out[f"{name}_verified"] = verified
    return out


def _print(results: dict[str, float], names: Sequence[str] | None = None) -> None:
    for name in names or sorted(results):
        print(f"{name:24} {results[name]:.6g}")


if __name__ == "__main__":
    _print(run())
    _print(scaling())
