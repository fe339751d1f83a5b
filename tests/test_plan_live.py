"""``mrcstack plan --fabric-out`` on the real kernel: a small design builds a testbed that
carries a datagram on every plane."""

from __future__ import annotations

from pathlib import Path

import pytest

from mrcstack import plan
from mrcstack.addrplan import paths
from mrcstack.fabric import Fabric
from mrcstack.netns.traffic import receive, send, udp_receiver, udp_sender
from tests.support.testbeds import Testbeds


@pytest.mark.requires_root
def test_the_fabric_out_file_builds_a_testbed(testbeds: Testbeds, tmp_path: Path) -> None:
    """A small design (4 endpoints of 4 x 200 Mbit/s, radix 4: 2 T0s and one T1 a plane,
    two links to it from each T0) as a testbed: a datagram crosses it on every plane."""
    out = tmp_path / "small.toml"
    argv = ["--gpus", "4", "--planes", "4", "--radix", "4", "--speed", "200mbit"]
    assert plan.main([*argv, "--fabric-out", str(out)]) == 0
    fabric = Fabric.load(out)
    assert (fabric.racks, fabric.hosts_per_rack, fabric.t1_per_plane) == (2, 2, 1)
    assert fabric.fabric_link_bps == 400e6  # the T0's two uplinks to the one T1
    bed = testbeds.up("pl", fabric)
    for path in paths(fabric, 0, 3):
        with udp_receiver(bed.ns(3), 40001) as rx, udp_sender(bed.ns(0)) as tx:
            assert send(tx, str(path.address), 40001, 1) == 1
            got = receive(rx, 5.0)
        assert got is not None, f"nothing arrived over {path.nodes}"
