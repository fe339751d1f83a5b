"""Congestion is not loss: with no packet dropped anywhere, every retransmission answers a
trim, and no EV leaves GOOD/SKIP for ASSUMED_BAD.

Incast and all-to-all on the simulator with trimming: switches trim instead of dropping,
trimmed headers jump the queue ahead of full packets still waiting on the same path, and
paths of different load deliver in different orders.  None of that may be read as a broken
path (a demotion) or as a loss (a retransmission the trims do not explain).
"""

from __future__ import annotations

import pytest

from mrcstack.fabric import Fabric
from mrcstack.sim import SimConfig, SimResult, run

MIB = 1 << 20


def check_no_false_loss(r: SimResult) -> None:
    assert r.verified
    assert sum(r.drops.values()) == 0, r.drops  # the premise: nothing was dropped
    non_trim = {k: v for k, v in r.retransmissions.items() if k != "trim" and v}
    assert non_trim == {}, non_trim
    assert r.retransmissions.get("trim", 0) <= r.trims
    demoted = [e for e in r.events if e.new == "assumed_bad"]
    assert demoted == [], demoted[:3]
    assert r.events_truncated == 0


@pytest.mark.parametrize(("fan_in", "nbytes"), [(3, 4 * MIB), (7, 2 * MIB), (15, MIB)])
@pytest.mark.parametrize("seed", [1, 3])
def test_incast_with_trimming_retransmits_only_trims(fan_in: int, nbytes: int, seed: int) -> None:
    fabric = Fabric(planes=4, racks=4, hosts_per_rack=4, t1_per_plane=8)
    dst = 15
    pairs = tuple((src, dst) for src in range(fan_in))
    r = run(SimConfig(fabric=fabric, pairs=pairs, bytes_per_flow=nbytes, seed=seed))
    check_no_false_loss(r)
    if fan_in >= 7:
        assert r.trims > 0  # the premise: congestion a sender could misread


@pytest.mark.slow
def test_all_to_all_of_16_hosts_retransmits_only_trims() -> None:
    fabric = Fabric(planes=4, racks=4, hosts_per_rack=4, t1_per_plane=8)
    pairs = tuple((i, j) for i in range(16) for j in range(16) if i != j)
    # Shallow ports (128 KiB): the NICs pace their sends, so the default 1 MiB ports
    # absorb this all-to-all without a trim, and the premise needs congestion.
    r = run(
        SimConfig(
            fabric=fabric, pairs=pairs, bytes_per_flow=256 << 10, seed=1, queue_bytes=128 << 10
        )
    )
    check_no_false_loss(r)
    assert r.trims > 0
