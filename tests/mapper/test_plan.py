"""The probe plan: every link covered, one failed link always localizable, shares fair."""

from __future__ import annotations

import pytest

from mrcstack import addrplan
from mrcstack.fabric import Fabric
from mrcstack.mapper.plan import make_plan, switches

FABRICS = [
    Fabric(),
    Fabric(planes=1, racks=1, hosts_per_rack=1, t1_per_plane=1),
    Fabric(planes=2, racks=3, hosts_per_rack=1, t1_per_plane=5),
    Fabric(planes=2, racks=2, hosts_per_rack=5, t1_per_plane=3),
    Fabric(planes=8, racks=4, hosts_per_rack=4, t1_per_plane=16),
]


@pytest.mark.parametrize(
    "fabric", FABRICS, ids=lambda f: f"{f.planes}p{f.racks}r{f.hosts_per_rack}h{f.t1_per_plane}t"
)
@pytest.mark.parametrize("overlap", [1, 2, 3])
def test_every_link_is_covered_and_no_two_links_share_their_loops(
    fabric: Fabric, overlap: int
) -> None:
    plan = make_plan(fabric, overlap)
    assert plan.problems() == []
    assert set(plan.links) == set(addrplan.fabric_links(fabric))
    for link in plan.links:
        cover = plan.covering(link)
        assert cover and all(link in plan.paths[i].links for i in cover)
        if link.split(":")[1].startswith("t0"):  # a T0-T1 link: hairpins of distinct hosts
            hosts = [plan.paths[i].host for i in cover]
            assert len(hosts) == len(set(hosts)) == min(overlap, fabric.hosts_per_rack)


@pytest.mark.parametrize("fabric", FABRICS[2:], ids=lambda f: f"{f.hosts}h")
def test_no_host_runs_more_than_one_loop_more_than_another_of_its_rack(fabric: Fabric) -> None:
    plan = make_plan(fabric)
    fewest, most = plan.per_host()
    assert most - fewest <= fabric.planes  # at most one more hairpin per plane
    for host in range(fabric.hosts):
        share = plan.share(host)
        assert all(p.host == host for p in share)
        assert sum(p.short for p in share) == fabric.planes  # its own link, every plane


def test_loops_are_the_address_plans_and_named_by_what_they_cross() -> None:
    plan = make_plan(Fabric())
    short, *hairpins = [p for p in plan.share(1) if p.plane == 0]
    assert short.name == "h1:p0:t0a" and short.links == ("p0:h1-t0a",)
    assert short.address == addrplan.loop_address(Fabric(), 1, 0, None)
    assert {p.name for p in hairpins} == {"h1:p0:t1a", "h1:p0:t1b", "h1:p0:t1c", "h1:p0:t1d"}
    assert all(p.links[0] == "p0:h1-t0a" and len(p.links) == 2 for p in hairpins)


def test_digest_names_the_fabric_and_overlap() -> None:
    assert make_plan(Fabric()).digest == make_plan(Fabric()).digest
    assert make_plan(Fabric()).digest != make_plan(Fabric(), 1).digest
    assert make_plan(Fabric()).digest != make_plan(Fabric(t1_per_plane=3)).digest
    with pytest.raises(ValueError, match="overlap"):
        make_plan(Fabric(), 0)


def test_switches_list_their_links() -> None:
    table = switches(make_plan(Fabric()))
    assert table["p0-t1c"] == ("p0:t0a-t1c", "p0:t0b-t1c")
    assert table["p1-t0b"][:2] == ("p1:h2-t0b", "p1:h3-t0b")
    assert len(table) == 4 * (2 + 4)
