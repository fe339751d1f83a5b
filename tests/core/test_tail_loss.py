"""Random loss at 0.1% never costs an RTO: the tail is found by RACK's reordering timer or
the tail-loss probe, so run times stay together across seeds."""

from __future__ import annotations

import statistics

import pytest

from mrcstack.fabric import Fabric
from mrcstack.sim import SimConfig, run

FABRIC = Fabric(planes=4, racks=2, hosts_per_rack=2, t1_per_plane=8)


@pytest.mark.slow
def test_a_tenth_of_a_percent_loss_never_pays_an_rto() -> None:
    times = []
    for seed in range(1, 13):
        r = run(SimConfig(fabric=FABRIC, bytes_per_flow=16 << 20, loss=0.001, seed=seed))
        assert r.verified
        assert r.drops["loss"] > 0  # the premise: packets were lost
        assert r.retransmissions.get("timeout", 0) == 0, (seed, r.retransmissions)
        times.append(r.completion_time_s)
    assert max(times) <= 1.25 * statistics.median(times)


def test_a_short_flow_sent_at_time_zero_recovers_its_tail_by_probe() -> None:
    """A whole flow in its first window, sent at t = 0: its acks must still give RTT
    samples (a timestamp of 0 would read as "none"), so a lost packet with nothing after it
    on its path is found by the tail-loss probe, not the minimum RTO."""
    chunk = 256 << 10
    pairs = tuple((s, d) for s in range(4) for d in range(4) if s != d)
    probed = 0
    for seed in (1, 2, 3):
        r = run(SimConfig(fabric=FABRIC, pairs=pairs, bytes_per_flow=chunk, loss=0.002, seed=seed))
        assert r.verified and r.drops["loss"] > 0
        assert r.retransmissions.get("timeout", 0) == 0, (seed, r.retransmissions)
        probed += r.retransmissions.get("tlp", 0)
    assert probed > 0  # the premise: some tails were lost
