"""The simulator hands decoded packets from connection to connection; with ``wire=True`` it
encodes each one and decodes it at its destination instead, as a real network would.  Both
must simulate exactly the same thing: same lengths on the wire, same trims, same result."""

from __future__ import annotations

import pytest

from mrcstack.fabric import Fabric
from mrcstack.sim import LinkFailure, NicDown, SimConfig, run
from mrcstack.sim.scenario import load

FABRIC = Fabric(planes=4, racks=2, hosts_per_rack=2, t1_per_plane=4)
KIB = 1 << 10

CASES = {
    "loss": SimConfig(fabric=FABRIC, bytes_per_flow=512 * KIB, loss=0.02, seed=5),
    "faults": SimConfig(
        fabric=FABRIC,
        bytes_per_flow=512 * KIB,
        pairs=((0, 3), (1, 2)),
        link_failures=(LinkFailure("p0:t0a-t1b", 20e-6, 80e-6),),
        nic_downs=(NicDown(3, 1, 10e-6, 60e-6),),
        ev_loss=((0x102, 0.2),),
        packet_latency_every=5,
        seed=2,
    ),
    "roce_small_mtu": SimConfig(
        fabric=FABRIC, bytes_per_flow=256 * KIB, mode="roce", mtu_payload=1024, loss=0.01
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_wire_mode_simulates_the_same(name: str) -> None:
    cfg = CASES[name]
    decoded, encoded = run(cfg), run(cfg, wire=True)
    assert decoded.verified
    assert decoded.to_json() == encoded.to_json()


def test_wire_mode_trims_the_same() -> None:
    cfg = load("incast.toml")
    decoded, encoded = run(cfg), run(cfg, wire=True)
    assert decoded.trims > 0
    assert decoded.to_json() == encoded.to_json()
