"""The uSID address plan: values, the uN shift, EVs, paths, link names and switch tables."""

from __future__ import annotations

from collections.abc import Iterator
from ipaddress import IPv6Address, IPv6Network
from itertools import permutations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mrcstack import addrplan as ap
from mrcstack.addrplan import (
    EvFields,
    active_usid,
    address,
    canonical_link,
    classic_sid,
    ev_fields,
    ev_value,
    fabric_links,
    forward,
    link_name,
    loop_address,
    loop_path,
    nic_plane_prefix,
    nic_sid,
    nic_usid,
    parse_link,
    parse_node,
    path,
    paths,
    render_plan,
    srh_segments,
    static_routes,
    switch_locator,
    switch_usid,
    t0_usid,
    t1_usid,
    usid_owner,
    usid_shift,
)
from mrcstack.core.evs import EvTable
from mrcstack.fabric import MAX_HOSTS, MAX_PLANES, MAX_RACKS, MAX_T1, Fabric

DEFAULT = Fabric()
FABRICS = [
    DEFAULT,
    Fabric(planes=1),
    Fabric(t1_per_plane=1),
    Fabric(racks=3, hosts_per_rack=3),
    Fabric(planes=16, racks=2, hosts_per_rack=1, t1_per_plane=2),
    Fabric(racks=1, hosts_per_rack=3),
    Fabric(planes=2, racks=27, hosts_per_rack=1, t1_per_plane=2),  # two-letter T0 names
    Fabric(planes=2, racks=2, hosts_per_rack=1, t1_per_plane=28),  # two-letter T1 names
    Fabric(planes=8, racks=4, hosts_per_rack=4, t1_per_plane=16),  # examples/fabric-large
    Fabric(planes=1, racks=2, hosts_per_rack=1, t1_per_plane=1, locator_block="2001:db8::"),
]
IDS = [f"{f.planes}p{f.racks}r{f.hosts_per_rack}h{f.t1_per_plane}t1" for f in FABRICS]


def all_paths(fabric: Fabric) -> Iterator[tuple[int, int, ap.Path]]:
    for src, dst in permutations(range(fabric.hosts), 2):
        for p in paths(fabric, src, dst):
            yield src, dst, p


# uSID values ----------------------------------------------------------------------------
def test_usid_values() -> None:
    assert t0_usid(0, 0) == 0x1000
    assert t0_usid(3, 1) == 0x1301
    assert t1_usid(0, 2) == 0x2002
    assert t1_usid(15, 255) == 0x2FFF
    assert nic_usid(0, 0) == 0x8000
    assert nic_usid(1, 5) == 0x8805
    assert nic_usid(15, 2047) == 0xFFFF


def test_usid_fields_fit_the_fabric_limits() -> None:
    """The bit fields must hold every plane, rack, T1 and host a Fabric allows."""
    assert MAX_PLANES <= ap.PLANE_MASK + 1 <= 1 << ap.EV_PLANE_BITS
    assert MAX_RACKS <= ap.SWITCH_INDEX_MASK + 1
    assert MAX_T1 <= ap.SWITCH_INDEX_MASK + 1 <= 1 << ap.EV_T1_BITS
    assert MAX_HOSTS <= ap.NIC_HOST_MASK + 1


def test_every_usid_is_unique_and_names_its_owner() -> None:
    owners: dict[int, tuple[int, str]] = {}
    for plane in range(MAX_PLANES):
        for i in range(MAX_RACKS):
            owners[t0_usid(plane, i)] = (plane, Fabric.t0_name(plane, i))
        for i in range(MAX_T1):
            owners[t1_usid(plane, i)] = (plane, Fabric.t1_name(plane, i))
        for i in range(MAX_HOSTS):
            owners[nic_usid(plane, i)] = (plane, Fabric.host_name(i))
    assert len(owners) == MAX_PLANES * (MAX_RACKS + MAX_T1 + MAX_HOSTS)
    for usid, owner in owners.items():
        assert usid_owner(usid) == owner
    for unassigned in (0x0000, 0x0FFF, 0x3000, 0x7FFF):
        with pytest.raises(ValueError, match="not assigned"):
            usid_owner(unassigned)


@pytest.mark.parametrize(
    ("func", "args"),
    [
        (t0_usid, (16, 0)),
        (t0_usid, (0, 256)),
        (t1_usid, (-1, 0)),
        (t1_usid, (0, 256)),
        (nic_usid, (0, 2048)),
        (nic_usid, (16, 0)),
        (usid_owner, (0x10000,)),
    ],
)
def test_usid_range_errors(func: object, args: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="out of range"):
        func(*args)  # type: ignore[operator]


def test_sids_and_locators() -> None:
    assert nic_sid(DEFAULT, 0, 2) == IPv6Address("fcbb:bb00:8002::")
    assert nic_sid(DEFAULT, 3, 1) == IPv6Address("fcbb:bb00:9801::")
    assert switch_locator(DEFAULT, 0x1001) == IPv6Network("fcbb:bb00:1001::/48")
    assert switch_usid("p0-t1c") == 0x2002
    assert switch_usid("p2-t0b") == 0x1201
    with pytest.raises(ValueError, match="is a host"):
        switch_usid("h0")
    with pytest.raises(ValueError):
        nic_sid(DEFAULT, 4, 0)
    with pytest.raises(ValueError):
        nic_sid(DEFAULT, 0, 4)
    for bad in (0, 0x10000):
        with pytest.raises(ValueError):
            switch_locator(DEFAULT, bad)


# The uN shift ---------------------------------------------------------------------------
def test_usid_shift_vector() -> None:
    """The vector Linux and FD.io VPP agree on (/32 block, 16-bit uSIDs)."""
    addr = IPv6Address("1111:2222:aaaa:bbbb:cccc:dddd:eeee:ffff")
    assert usid_shift(addr) == IPv6Address("1111:2222:bbbb:cccc:dddd:eeee:ffff:0")
    assert usid_shift(int(addr)) == usid_shift(addr)
    assert active_usid(addr) == 0xAAAA
    assert active_usid(usid_shift(addr)) == 0xBBBB


def test_linux_facts_example() -> None:
    """fcbb:bb00:111:122:112:2:: crossed 0111, 0122, 0112 and arrived as fcbb:bb00:2::."""
    addr = IPv6Address("fcbb:bb00:111:122:112:2::")
    crossed = []
    for _ in range(3):
        crossed.append(active_usid(addr))
        addr = usid_shift(addr)
    assert crossed == [0x0111, 0x0122, 0x0112]
    assert addr == IPv6Address("fcbb:bb00:2::")


def test_usid_shift_other_formats() -> None:
    addr = IPv6Address("1111:2222:3333:aaaa:bbbb:cccc:dddd:eeee")
    assert usid_shift(addr, block_bits=48) == IPv6Address("1111:2222:3333:bbbb:cccc:dddd:eeee:0")
    assert active_usid(addr, block_bits=48) == 0xAAAA
    assert usid_shift(addr, block_bits=32, usid_bits=32) == IPv6Address(
        "1111:2222:bbbb:cccc:dddd:eeee::"
    )
    assert active_usid(addr, block_bits=0, usid_bits=8) == 0x11
    for block, usid in ((-1, 16), (32, 0), (120, 16)):
        with pytest.raises(ValueError, match="bad uSID format"):
            usid_shift(addr, block, usid)
    with pytest.raises(ValueError):
        usid_shift(1 << 128)


@given(st.integers(0, (1 << 128) - 1))
def test_usid_shift_keeps_block_and_moves_the_rest(value: int) -> None:
    shifted = int(usid_shift(value))
    assert shifted >> 96 == value >> 96  # block kept
    assert shifted & 0xFFFF == 0  # zero-filled
    assert (shifted >> 16) & ((1 << 80) - 1) == value & ((1 << 80) - 1)  # moved up one
    assert active_usid(shifted) == (value >> 64) & 0xFFFF


# EVs ------------------------------------------------------------------------------------
def test_ev_layout() -> None:
    assert ev_value(2, 3) == 0x203
    assert ev_value(2, 3, 5) == 0x5203
    assert ev_value(15, 255, (1 << 20) - 1) == 0xFFFF_FFFF
    assert ev_fields(0x5203) == EvFields(t1=3, plane=2, entropy=5)


@given(st.integers(0, 15), st.integers(0, 255), st.integers(0, (1 << 20) - 1))
def test_ev_round_trip(plane: int, t1: int, entropy: int) -> None:
    ev = ev_value(plane, t1, entropy)
    assert 0 <= ev < 1 << 32
    assert ev_fields(ev) == EvFields(t1, plane, entropy)


@pytest.mark.parametrize("args", [(16, 0, 0), (0, 256, 0), (0, 0, 1 << 20), (-1, 0, 0)])
def test_ev_value_range_errors(args: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="out of range"):
        ev_value(*args)


def test_ev_fields_range_errors() -> None:
    for bad in (-1, 1 << 32):
        with pytest.raises(ValueError, match="EV"):
            ev_fields(bad)


# Addresses ------------------------------------------------------------------------------
def test_address_layout() -> None:
    """block | T0(src rack) | T1 | T0(dst rack) | NIC(dst) | 0 | 0, as in docs/linux.md."""
    cross = address(DEFAULT, 0, 2, 0, ev_value(0, 2))
    assert cross == IPv6Address("fcbb:bb00:1000:2002:1001:8002::")
    assert cross.exploded.split(":")[6:] == ["0000", "0000"]
    assert address(DEFAULT, 3, 1, 3, ev_value(3, 1)) == IPv6Address(
        "fcbb:bb00:1301:2301:1300:9801::"
    )
    assert address(DEFAULT, 0, 1, 0, ev_value(0, 0)) == IPv6Address("fcbb:bb00:1000:8001::")


def test_address_ignores_entropy_and_the_t1_of_a_same_rack_ev() -> None:
    base = address(DEFAULT, 0, 2, 1, ev_value(1, 3))
    assert address(DEFAULT, 0, 2, 1, ev_value(1, 3, 0xABCDE)) == base
    same_rack = {address(DEFAULT, 2, 3, 1, ev_value(1, t1, 7)) for t1 in range(256)}
    assert same_rack == {IPv6Address("fcbb:bb00:1101:8803::")}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 2, 0, ev_value(0, 4)), "names T1 4"),
        ((0, 2, 1, ev_value(0, 0)), "for plane 0, not plane 1"),
        ((0, 4, 0, ev_value(0, 0)), "host 4 out of range"),
        ((-1, 2, 0, ev_value(0, 0)), "host -1 out of range"),
        ((0, 2, 4, ev_value(4, 0)), "plane 4 out of range"),
        ((1, 1, 0, ev_value(0, 0)), "same host 1"),
        ((0, 2, 0, 1 << 32), "EV"),
    ],
)
def test_address_errors(args: tuple[int, int, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        address(DEFAULT, *args)
    with pytest.raises(ValueError, match=message):
        path(DEFAULT, *args)


def test_address_shifts_down_to_the_destination_sid() -> None:
    for fabric in FABRICS[:4]:
        for _src, dst, p in all_paths(fabric):
            addr = p.address
            for _switch in p.nodes[1:-1]:
                addr = usid_shift(addr)
            assert addr == nic_sid(fabric, p.plane, dst)


# Paths ----------------------------------------------------------------------------------
def test_path_example() -> None:
    p = path(DEFAULT, 0, 2, 0, ev_value(0, 2))
    assert p.nodes == ("h0", "p0-t0a", "p0-t1c", "p0-t0b", "h2")
    assert p.links == ("p0:h0-t0a", "p0:t0a-t1c", "p0:t1c-t0b", "p0:t0b-h2")
    assert p.physical_links == ("p0:h0-t0a", "p0:t0a-t1c", "p0:t0b-t1c", "p0:h2-t0b")
    assert p.address == IPv6Address("fcbb:bb00:1000:2002:1001:8002::")
    assert (p.plane, p.ev) == (0, 2)
    assert path(DEFAULT, 0, 2, 0, ev_value(0, 2)) is p  # cached: the simulator asks per packet
    local = path(DEFAULT, 1, 0, 2, ev_value(2, 3, 9))
    assert local.nodes == ("h1", "p2-t0a", "h0")
    assert local.links == ("p2:h1-t0a", "p2:t0a-h0")
    assert local.ev == ev_value(2, 3, 9)


@pytest.mark.parametrize("fabric", FABRICS, ids=IDS)
def test_path_counts_order_and_distinctness(fabric: Fabric) -> None:
    for src, dst in permutations(range(fabric.hosts), 2):
        found = paths(fabric, src, dst)
        same_rack = fabric.rack_of(src) == fabric.rack_of(dst)
        per_plane = 1 if same_rack else fabric.t1_per_plane
        assert len(found) == fabric.planes * per_plane
        expected = [
            ev_value(plane, t1) for plane in range(fabric.planes) for t1 in range(per_plane)
        ]
        assert [p.ev for p in found] == expected
        assert len({p.address for p in found}) == len(found)
        assert len({p.nodes for p in found}) == len(found)
        assert all(p.plane == ev_fields(p.ev).plane for p in found)


def test_paths_errors() -> None:
    with pytest.raises(ValueError, match="same host"):
        paths(DEFAULT, 2, 2)
    with pytest.raises(ValueError, match="out of range"):
        paths(DEFAULT, 0, 9)


# forward(): the address plan and the switch tables agree ---------------------------------
@pytest.mark.parametrize("fabric", FABRICS, ids=IDS)
def test_forward_follows_every_path(fabric: Fabric) -> None:
    routes = static_routes(fabric)
    count = 0
    for src, _dst, p in all_paths(fabric):
        assert forward(fabric, src, p.address, routes) == p.nodes
        count += 1
    assert count > 0 or fabric.hosts == 1


@pytest.mark.parametrize("fabric", FABRICS[:6], ids=IDS[:6])
def test_both_directions_use_the_same_physical_links(fabric: Fabric) -> None:
    for src, dst, p in all_paths(fabric):
        back = path(fabric, dst, src, p.plane, p.ev)
        assert back.nodes == p.nodes[::-1]
        assert back.physical_links == p.physical_links[::-1]
        assert forward(fabric, dst, back.address) == back.nodes


@st.composite
def fabric_and_route(draw: st.DrawFn) -> tuple[Fabric, int, int, int, int]:
    racks = draw(st.integers(1, 6))
    hosts_per_rack = draw(st.integers(1 if racks > 1 else 2, 4))
    fabric = Fabric(
        planes=draw(st.integers(1, 16)),
        racks=racks,
        hosts_per_rack=hosts_per_rack,
        t1_per_plane=draw(st.integers(1, 40)),
    )
    src = draw(st.integers(0, fabric.hosts - 1))
    dst = draw(st.integers(0, fabric.hosts - 1).filter(lambda h: h != src))
    plane = draw(st.integers(0, fabric.planes - 1))
    ev = ev_value(plane, draw(st.integers(0, fabric.t1_per_plane - 1)), draw(st.integers(0, 99)))
    return fabric, src, dst, plane, ev


@given(fabric_and_route())
def test_forward_matches_path_for_random_fabrics(
    case: tuple[Fabric, int, int, int, int],
) -> None:
    fabric, src, dst, plane, ev = case
    p = path(fabric, src, dst, plane, ev)
    assert forward(fabric, src, p.address) == p.nodes
    assert forward(fabric, src, int(p.address)) == p.nodes


def test_forward_errors() -> None:
    good = address(DEFAULT, 0, 2, 0, ev_value(0, 1))
    with pytest.raises(ValueError, match="outside the block"):
        forward(DEFAULT, 0, IPv6Address("2001:db8:1000:2001:1001:8002::"))
    with pytest.raises(ValueError, match="starts at p0-t0a, not at h2's T0 p0-t0b"):
        forward(DEFAULT, 2, good)
    with pytest.raises(ValueError, match="not assigned"):
        forward(DEFAULT, 0, IPv6Address("fcbb:bb00:3000::"))
    with pytest.raises(ValueError, match=r"p0-t0a: no route for uSID 0x3000"):
        forward(DEFAULT, 0, IPv6Address("fcbb:bb00:1000:3000::"))
    with pytest.raises(ValueError, match=r"p0-t0b: no route for uSID 0x8000"):
        forward(DEFAULT, 0, IPv6Address("fcbb:bb00:1000:2001:1001:8000::"))
    with pytest.raises(ValueError, match=r"no route for uSID 0x0000"):
        forward(DEFAULT, 0, IPv6Address("fcbb:bb00:1000::"))
    broken = static_routes(DEFAULT)
    del broken["p0-t1b"][0x1001]
    with pytest.raises(ValueError, match=r"p0-t1b: no route for uSID 0x1001"):
        forward(DEFAULT, 0, good, broken)
    loop = {"p0-t0a": {0x3000: "p0-t1a"}, "p0-t1a": {0x3000: "p0-t0a"}}
    with pytest.raises(ValueError, match="hops"):
        forward(DEFAULT, 0, IPv6Address("fcbb:bb00:1000:3000::"), loop)


@pytest.mark.parametrize("fabric", FABRICS, ids=IDS)
def test_loop_paths_come_back_to_their_host_through_the_static_tables(fabric: Fabric) -> None:
    """A link probe's loop (host -> T0 [-> T1 -> T0] -> host) is forwarded by the same
    tables as every data path: the walk ends at the host that sent it."""
    links = set(fabric_links(fabric))
    for host in range(fabric.hosts):
        for plane in range(fabric.planes):
            for t1 in (None, *range(fabric.t1_per_plane)):
                loop = loop_path(fabric, host, plane, t1)
                assert forward(fabric, host, loop.address) == loop.nodes
                assert loop.nodes[0] == loop.nodes[-1] == f"h{host}"
                assert len(loop.links) == (2 if t1 is None else 4)
                assert set(loop.physical_links) <= links


def test_loop_address_layout_and_errors() -> None:
    assert loop_address(DEFAULT, 0, 0, None) == IPv6Address("fcbb:bb00:1000:8000::")
    assert loop_address(DEFAULT, 3, 2, 1) == IPv6Address("fcbb:bb00:1201:2201:1201:9003::")
    loop = loop_path(DEFAULT, 1, 0, 2)
    assert loop.physical_links == ("p0:h1-t0a", "p0:t0a-t1c", "p0:t0a-t1c", "p0:h1-t0a")
    with pytest.raises(ValueError, match="T1 4 out of range"):
        loop_address(DEFAULT, 0, 0, 4)
    with pytest.raises(ValueError, match="host"):
        loop_address(DEFAULT, 4, 0, None)


# Switch tables --------------------------------------------------------------------------
@pytest.mark.parametrize("fabric", FABRICS, ids=IDS)
def test_static_routes_shape(fabric: Fabric) -> None:
    routes = static_routes(fabric)
    assert len(routes) == fabric.planes * (fabric.racks + fabric.t1_per_plane)
    for switch, table in routes.items():
        node = parse_node(switch)
        expected = (
            fabric.t1_per_plane + fabric.hosts_per_rack if node.kind == ap.T0 else fabric.racks
        )
        assert len(table) == expected
        for usid, next_hop in table.items():
            plane, owner = usid_owner(usid)
            assert owner == next_hop  # each entry points at the uSID's owner...
            assert plane == node.plane  # ...on the switch's own plane
            canonical_link(link_name(plane, switch, next_hop))  # ...over a real link
            if next_hop.startswith("h"):
                assert fabric.rack_of(parse_node(next_hop).index) == node.index


def test_static_routes_default_t0() -> None:
    assert static_routes(DEFAULT)["p1-t0b"] == {
        0x2100: "p1-t1a",
        0x2101: "p1-t1b",
        0x2102: "p1-t1c",
        0x2103: "p1-t1d",
        0x8802: "h2",
        0x8803: "h3",
    }
    assert static_routes(DEFAULT)["p3-t1d"] == {0x1300: "p3-t0a", 0x1301: "p3-t0b"}


# Link names -----------------------------------------------------------------------------
def test_link_name_forms() -> None:
    assert link_name(0, "h0", "p0-t0a") == "p0:h0-t0a"
    assert link_name(0, "p0-t1c", "p0-t0b") == "p0:t1c-t0b"
    assert link_name(3, "t0b", "t1aa") == "p3:t0b-t1aa"
    with pytest.raises(ValueError, match="not on plane 0"):
        link_name(0, "p1-t0a", "p0-t1a")
    for a, b in (("h0", "p0-t1a"), ("p0-t0a", "p0-t0b"), ("h0", "h1"), ("t1a", "t1b")):
        with pytest.raises(ValueError, match="is not a link"):
            link_name(0, a, b)
    with pytest.raises(ValueError, match="bad node name"):
        link_name(0, "x0", "p0-t0a")
    with pytest.raises(ValueError, match="plane"):
        link_name(16, "h0", "t0a")


def test_canonical_link() -> None:
    assert canonical_link("p0:t1c-t0b") == "p0:t0b-t1c"
    assert canonical_link("p0:t0b-t1c") == "p0:t0b-t1c"
    assert canonical_link("p2:t0a-h1") == "p2:h1-t0a"
    assert canonical_link("p2:h1-t0a") == "p2:h1-t0a"
    assert canonical_link("p0:t1b-t0aa") == "p0:t0aa-t1b"


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("p0:t0a-t1c", (0, "p0-t0a", "p0-t1c")),
        ("p0:h0-t0a", (0, "h0", "p0-t0a")),
        ("p15:t1ab-t0z", (15, "p15-t1ab", "p15-t0z")),
        ("p1:t0b-h2047", (1, "p1-t0b", "h2047")),
    ],
)
def test_parse_link(name: str, parsed: tuple[int, str, str]) -> None:
    assert parse_link(name) == parsed
    plane, a, b = parsed
    assert link_name(plane, a, b) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "p0:t0a_t1c",
        "p0-t0a-t1c",
        "p00:t0a-t1c",
        "p16:t0a-t1c",
        "p0:t0A-t1c",
        "p0:h01-t0a",
        "p0:h2048-t0a",
        "p0:t2a-t1c",
        "p0:t0a-t0b",
        "p0:h0-t1a",
        "p0:t0a-t1c ",
        "p0:t0a-t1c@2ms",
    ],
)
def test_parse_link_rejects(name: str) -> None:
    with pytest.raises(ValueError):
        parse_link(name)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("p4:t0a-t1a", "plane 4 out of range"),
        ("p0:t0c-t1a", "rack 2 out of range"),
        ("p0:t0a-t1e", "t1 4 out of range"),
        ("p0:h4-t0a", "host 4 out of range"),
        ("p0:h2-t0a", "h2 is not in rack t0a"),
        ("p0:t0a-h3", "h3 is not in rack t0a"),
    ],
)
def test_parse_link_checks_the_fabric(name: str, message: str) -> None:
    parse_link(name)  # well-formed...
    with pytest.raises(ValueError, match=message):
        parse_link(name, DEFAULT)  # ...but not in this fabric
    assert parse_link("p3:t0b-h3", DEFAULT) == (3, "p3-t0b", "h3")


def test_parse_node() -> None:
    assert parse_node("h7") == ap.Node(ap.HOST, 7, None)
    assert parse_node("p2-t0b") == ap.Node(ap.T0, 1, 2)
    assert parse_node("p2-t1aa").short == "t1aa"
    for name in ("p2-t0b", "p15-t1iv", "h0", "h2047"):
        assert parse_node(name).name == name
    for bad in ("", "h", "h-1", "p1", "p1-t0", "p01-t0a", "p1-t2a", "p1-t0a1", "p16-t0a", "t0a"):
        with pytest.raises(ValueError):
            parse_node(bad)
    with pytest.raises(ValueError, match="rack 256 out of range"):
        parse_node("p0-t0iw")  # letters(256) == "iw"


@pytest.mark.parametrize("fabric", FABRICS, ids=IDS)
def test_fabric_links(fabric: Fabric) -> None:
    links = fabric_links(fabric)
    assert len(links) == fabric.planes * (fabric.hosts + fabric.racks * fabric.t1_per_plane)
    assert len(set(links)) == len(links)
    assert all(canonical_link(link) == link for link in links)
    assert all(parse_link(link, fabric) for link in links)


@pytest.mark.parametrize("fabric", FABRICS[:6], ids=IDS[:6])
def test_paths_use_exactly_the_fabric_links(fabric: Fabric) -> None:
    used = {link for _s, _d, p in all_paths(fabric) for link in p.physical_links}
    if fabric.racks == 1:  # no T0-T1 link is ever on a path
        assert used == {link for link in fabric_links(fabric) if "t1" not in link}
    else:
        assert used == set(fabric_links(fabric))


# Documentation --------------------------------------------------------------------------
def test_render_plan_is_the_code() -> None:
    text = render_plan(DEFAULT, 0)
    routes = static_routes(DEFAULT)
    for switch in ("p0-t0a", "p0-t0b", "p0-t1a", "p0-t1d"):
        line = next(line for line in text.splitlines() if line.startswith(switch + " "))
        for usid, hop in routes[switch].items():
            assert f"{usid:04x}->{hop}" in line
    assert "p1-" not in text
    assert "fcbb:bb00:1000:2002:1001:8002::  h0 p0-t0a p0-t1c p0-t0b h2" in text
    assert "fcbb:bb00:1000:8001::" in text
    with pytest.raises(ValueError):
        render_plan(DEFAULT, 4)


def _split(f: Fabric, src: int, dst: int, ev_count: int) -> list[tuple[int, int]]:
    """(listed, in use) per plane of the default profile, as the core's EV table takes it."""
    evs = ap.ev_profile(f, src, dst, ev_count)
    table = EvTable(evs, f.planes, lambda _: None, ev_count=ev_count)
    return [(len(p), sum(1 for s in p if s.in_use)) for p in table.by_plane]


def test_default_ev_profile_names_distinct_paths_with_a_backup_set() -> None:
    """Each EV names its own path; per plane min(ev_count/planes, paths) minus a backup
    quarter are in use; a pair within a rack (one path per plane) gets one EV per plane."""
    f = Fabric(planes=4, racks=2, hosts_per_rack=2, t1_per_plane=8)
    for src, dst in ((0, 3), (1, 2), (3, 0)):
        evs = ap.ev_profile(f, src, dst)
        addresses = {ap.address(f, src, dst, e.port, e.value) for e in evs}
        assert len(addresses) == len(evs) == 4 * 8  # every path once: 6 in use + 2 backups
        for e in evs:
            assert ev_fields(e.value).plane == e.port
            path(f, src, dst, e.port, e.value)  # every EV is a valid path
        assert _split(f, src, dst, 128) == [(8, 6)] * 4
    # The hosts of a rack keep disjoint T1s back as backups, so every T1 carries traffic.
    backups = [{ev_fields(e.value).t1 for e in ap.ev_profile(f, h, 3)[6:8]} for h in (0, 1)]
    assert backups == [{6, 7}, {0, 1}]
    assert _split(DEFAULT, 0, 3, 128) == [(4, 3)] * 4  # default fabric: 12 in use, 4 backups
    assert _split(f, 0, 3, 8) == [(3, 2)] * 4  # a small set: 2 per plane, plus a backup
    wide = Fabric(planes=2, racks=2, hosts_per_rack=1, t1_per_plane=64)
    assert _split(wide, 0, 1, 32) == [(21, 16)] * 2  # more paths than asked for
    same_rack = ap.ev_profile(f, 0, 1)
    assert [(ev_fields(e.value).t1, e.port) for e in same_rack] == [(0, p) for p in range(4)]
    assert _split(f, 0, 1, 128) == [(1, 1)] * 4  # no second path: no backup


def test_srh_segments_name_each_switch_then_the_destination() -> None:
    fabric = Fabric()
    ev = ev_value(1, 2)
    segments = srh_segments(fabric, 0, 3, 1, ev)
    switches = path(fabric, 0, 3, 1, ev).nodes[1:-1]
    assert segments[:-1] == tuple(classic_sid(fabric, switch_usid(s)) for s in switches)
    assert segments[-1] == nic_sid(fabric, 1, 3)
    for sid, switch in zip(segments, switches, strict=False):
        assert sid in switch_locator(fabric, switch_usid(switch))  # reached by the uN routes
        assert int(sid) & 0xFFFF << 64 == 0xE000 << 64  # the classic function
    assert len(srh_segments(fabric, 0, 1, 0, ev_value(0, 0))) == 2  # within a rack: T0, NIC


def test_nic_plane_prefix_holds_exactly_that_planes_nics() -> None:
    fabric = Fabric()
    for plane in range(fabric.planes):
        prefix = nic_plane_prefix(fabric, plane)
        for other in range(fabric.planes):
            for host in range(fabric.hosts):
                assert (nic_sid(fabric, other, host) in prefix) == (other == plane)
