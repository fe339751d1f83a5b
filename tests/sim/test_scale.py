"""The simulator at scale: flows of any size in flat memory, every byte still checked.

A write's content is derived from its flow and offset and checked as each packet is placed
(the receiver's memory holds nothing), so a 1 GiB flow needs a few MiB.  The RSS figures
are measured in a child process (its ``VmHWM``), so the test process's own memory does not
count.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from mrcstack.core.config import ConnectionConfig
from mrcstack.core.connection import Connection
from mrcstack.core.memory import MemoryTable
from mrcstack.fabric import Fabric
from mrcstack.sim import SimConfig, run
from mrcstack.sim.content import BLOCK, CheckingSink, FlowContent
from tests.support import REPO

ROOT = REPO
MIB = 1 << 20
RSS_LIMIT_MB = 500

CHILD = """
import json, sys, time
from mrcstack.fabric import Fabric
from mrcstack.sim import SimConfig, run
def hwm_kb():
    # VmHWM: this process's peak RSS since its exec (ru_maxrss would include the pytest
    # process it was forked from: Linux keeps that mark across fork and exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")
flows, size = int(sys.argv[1]), int(sys.argv[2])
fabric = Fabric(planes=4, racks=4, hosts_per_rack=4 if flows > 1 else 2, t1_per_plane=4)
pairs = tuple((h, (h + fabric.hosts_per_rack) % fabric.hosts) for h in range(flows))
t = time.perf_counter()
r = run(SimConfig(fabric=fabric, pairs=pairs or ((0, 2),), bytes_per_flow=size,
                  rate_bps=400e9, mtu_payload=8192, max_sim_time_s=10.0))
print(json.dumps({"verified": r.verified, "bytes": r.bytes_delivered,
                  "wall_s": time.perf_counter() - t,
                  "rss_mb": hwm_kb() / 1024}))
"""


def child(flows: int, size: int) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(flows), str(size)],
        capture_output=True, text=True, cwd=ROOT, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc: dict[str, float] = json.loads(proc.stdout)
    print(f"\n{flows} x {size // MIB} MiB: {doc}")
    return doc


def test_a_1gib_flow_runs_verifies_and_stays_small() -> None:
    doc = child(1, 1 << 30)
    assert doc["verified"] and doc["bytes"] == 1 << 30
    assert doc["rss_mb"] < RSS_LIMIT_MB


def test_16_flows_of_256mib_run_verify_and_stay_small() -> None:
    """Four flows of 255 MiB once needed 2.3 GB (and a 256 MiB flow could not run)."""
    doc = child(16, 256 * MIB)
    assert doc["verified"] and doc["bytes"] == 16 * 256 * MIB
    assert doc["rss_mb"] < RSS_LIMIT_MB


def test_a_misplaced_block_is_caught() -> None:
    """The receiver's memory puts one packet 4 KiB off (a placement bug): not verified."""

    class Misplacing(CheckingSink):
        calls = 0

        def target(self, rkey: int, va: int, length: int) -> memoryview:
            Misplacing.calls += 1
            if Misplacing.calls == 700:  # some packet in the middle of the flow
                va += 4096
            return super().target(rkey, va, length)

    def factory(config: ConnectionConfig, memory: MemoryTable, rng: object) -> Connection:
        if isinstance(memory, CheckingSink):  # the receiver's end
            memory.__class__ = Misplacing
        return Connection(config, memory=memory, rng=rng, now=0.0)  # type: ignore[arg-type]

    cfg = SimConfig(fabric=Fabric(), bytes_per_flow=8 * MIB, wr_size=MIB)
    assert run(cfg).verified
    bad = run(cfg, connection_factory=factory)
    assert Misplacing.calls > 700
    assert not bad.verified and not bad.flows[0].verified


def test_work_requests_are_flat_too() -> None:
    """Many small work requests: completions and immediates counted, not listed."""
    r = run(SimConfig(fabric=Fabric(), bytes_per_flow=4 * MIB + 123, wr_size=64 << 10))
    assert r.verified and r.flows[0].work_requests == 65


@pytest.mark.parametrize(
    ("offset", "n"),
    [(0, 4096), (4096, 4096), (8, 16), (15, 2), (16, 4080), (4095, 4098), (12345, 20000)],
)
def test_content_fill_and_matches_follow_the_blocks(offset: int, n: int) -> None:
    c = FlowContent(5, random.Random(2))
    first, last = offset // BLOCK, (offset + n - 1) // BLOCK
    blocks = b"".join(c.block(b) for b in range(first, last + 1))
    expected = blocks[offset - first * BLOCK :][:n]
    got = bytearray(n)
    c.fill(memoryview(got), offset)
    assert got == expected
    assert c.matches(got, offset) and c.matches(got + b"tail", offset, n)
    assert not c.matches(got, offset, n + 1)
    for at in (0, n // 2, n - 1):
        bad = bytearray(got)
        bad[at] ^= 1
        assert not c.matches(bad, offset)


def test_the_sink_catches_wrong_bytes_twice_written_bytes_and_gaps() -> None:
    def sink() -> tuple[CheckingSink, FlowContent]:
        content = FlowContent(3, random.Random(1))
        return CheckingSink(content, 3 * 4096, 4096), content

    def write(s: CheckingSink, c: FlowContent, offset: int, corrupt: bool = False) -> None:
        view = s.target(s.rkey, s.va + offset, 4096)
        c.fill(view, offset)
        if corrupt:
            view[100] ^= 1
        s.check()

    good, c = sink()
    for offset in (8192, 0, 4096):  # out of order is fine
        write(good, c, offset)
    assert good.intact_below(3 * 4096)
    bad, c = sink()
    write(bad, c, 0)
    write(bad, c, 4096, corrupt=True)
    write(bad, c, 8192)
    assert not bad.intact_below(3 * 4096)
    twice, c = sink()
    for offset in (0, 4096, 4096, 8192):
        write(twice, c, offset)
    assert not twice.intact_below(3 * 4096)
    gap, c = sink()
    write(gap, c, 0)
    write(gap, c, 8192)
    assert gap.intact_below(4096) and not gap.intact_below(3 * 4096)


def test_latency_probe_flows_time_every_write() -> None:
    """A latency probe posts its small writes one at a time and reports each one's
    completion latency; the other flows report none."""
    fabric = Fabric(racks=2, hosts_per_rack=2)
    cfg = SimConfig(
        fabric=fabric, pairs=((0, 2), (1, 3)), bytes_per_flow=1 << 20, seed=3,
        latency_flows=(0,), latency_writes=40, latency_write_bytes=4096,
    )  # fmt: skip
    r = run(cfg)
    probe, bulk = r.flows
    assert r.verified and probe.bytes == 40 * 4096 and probe.work_requests == 40
    assert len(probe.write_latency_s) == 40 and bulk.write_latency_s == ()
    rtt_floor = 8 * cfg.link_delay_s  # four links each way, nothing faster
    assert all(rtt_floor < x < 1e-3 for x in probe.write_latency_s)
    # One write in flight: the probe takes at least the sum of its writes' latencies.
    assert probe.completion_time_s is not None
    assert probe.completion_time_s >= sum(probe.write_latency_s) * 0.999
    with pytest.raises(ValueError, match="latency flow 2"):
        SimConfig(fabric=fabric, pairs=((0, 2), (1, 3)), latency_flows=(2,))
