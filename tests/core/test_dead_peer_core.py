"""A connection whose peer is gone fails within its retry budget, and does not flood the dead
paths meanwhile: the receiver's four NICs go down for good mid-transfer."""

from __future__ import annotations

import pytest

from mrcstack.core.config import ConnectionConfig, timeout_from_exponent
from mrcstack.core.evs import EvEntry
from mrcstack.errors import ConfigError
from mrcstack.fabric import Fabric
from mrcstack.sim import NicDown, SimConfig, run

FABRIC = Fabric(planes=4, racks=2, hosts_per_rack=2, t1_per_plane=8)
DOWN_AT = 100e-6
EVS = (EvEntry(0, 0),)


@pytest.mark.parametrize("cc", ["nscc", "fixed"])
def test_a_dead_peer_fails_the_flow_within_its_retry_budget(cc: str) -> None:
    downs = tuple(NicDown(3, p, DOWN_AT, None) for p in range(FABRIC.planes))
    cfg = SimConfig(fabric=FABRIC, bytes_per_flow=16 << 20, cc=cc, nic_downs=downs, seed=1)
    r = run(cfg)
    [flow] = r.flows
    assert flow.failed is not None and "retry_exceeded" in flow.failed
    assert flow.failure_time_s is not None
    budget = cfg.retry_budget_s()
    took = flow.failure_time_s - DOWN_AT
    assert 0.5 * budget <= took <= 1.5 * budget, (took, budget)
    conn = ConnectionConfig(1, 2, 4, EVS)
    # Retransmissions are bounded by the retry counts (one packet at a time once an RTO
    # found no progress), not by the window.
    assert sum(r.retransmissions.values()) <= 4 * (conn.linear_cnt + conn.exp_cnt + 1)


def test_the_retry_budget_formula() -> None:
    cfg = ConnectionConfig(1, 2, 1, EVS, timeout=200e-6, linear_cnt=3, exp_cnt=4)
    # 4 timeouts at the base, then 2 + 4 + 8 + 16 times the base.
    assert cfg.retry_budget() == pytest.approx(200e-6 * (4 + 30))
    assert cfg.retry_budget(base=1e-3) == pytest.approx(1e-3 * 34)  # a measured RTO
    capped = ConnectionConfig(1, 2, 1, EVS, timeout=0.1, max_rto=0.25, exp_cnt=4)
    assert capped.retry_budget() == pytest.approx(0.1 * 4 + 0.2 + 0.25 * 3)


def test_timeout_exponent() -> None:
    assert timeout_from_exponent(0) == pytest.approx(1.024e-6)
    assert timeout_from_exponent(8) == pytest.approx(262.144e-6)
    with pytest.raises(ConfigError, match="exponent"):
        timeout_from_exponent(32)
