"""The testbed plan (mrcstack.netns: topology) and its recorded state (state), without root.

The plan is pure data, so these tests check every name and route line the builder will
feed to ``ip -batch`` against the shared address plan, for the default and the large
fabric, and the CLI's argument errors that need no kernel.
"""

from __future__ import annotations

import dataclasses
import json
import re
from ipaddress import IPv6Address, IPv6Network
from pathlib import Path

import pytest

from mrcstack.addrplan import (
    classic_sid,
    fabric_links,
    nic_sid,
    nic_usid,
    parse_node,
    static_routes,
    switch_locator,
    switch_usid,
    usid_shift,
)
from mrcstack.fabric import MAX_HOSTS, MAX_PLANES, MAX_T1, Fabric
from mrcstack.netns import cli, state
from mrcstack.netns.run import TestbedError, one_line
from mrcstack.netns.topology import (
    LOWER_LL,
    MAX_IFNAME,
    SID_IF,
    UPPER_LL,
    Plan,
    baseline_address,
    mgmt_address,
    mgmt_port_name,
    mgmt_prefix,
    netns_name,
    nic_name,
    plan,
    port_name,
    tbf_line,
)
from tests.support import REPO

EXAMPLES = REPO / "examples"
DEFAULT = Fabric()
LARGE = Fabric.load(EXAMPLES / "fabric-large.toml")
SMALL = Fabric(planes=1, racks=2, hosts_per_rack=1, t1_per_plane=2)


def _route_words(line: str) -> list[str]:
    assert line.startswith("route replace "), line
    return line.split()[2:]


@pytest.mark.parametrize("fabric", [DEFAULT, LARGE], ids=["default", "large"])
def test_interface_names_fit_and_are_unique_per_namespace(fabric: Fabric) -> None:
    p = plan(fabric, "abcdef")  # the longest testbed name
    per_ns: dict[str, list[str]] = {ns: [] for ns in p.netns.values()}
    for rec in p.links.values():
        for end in (rec.a, rec.b):
            per_ns[end.netns].append(end.ifname)
    for ns, names in per_ns.items():
        names += ["mgmt"] if parse_node(ns.split("-", 1)[1]).kind == "h" else [SID_IF]
        assert len(names) == len(set(names)), ns
        assert all(len(n) <= MAX_IFNAME for n in names), names
    assert all(len(link) <= MAX_IFNAME for link in p.root_links)
    assert len(p.links) == len(fabric_links(fabric))


def test_names_at_the_fabric_limits_fit() -> None:
    longest = [
        port_name("p15-t0iv", "p15-t1iv", MAX_PLANES - 1),  # T1 index 255 -> "t1iv"
        port_name("p15-t1iv", "p15-t0iv", MAX_PLANES - 1),
        port_name("p15-t0a", f"h{MAX_HOSTS - 1}", MAX_PLANES - 1),
        nic_name(MAX_PLANES - 1),
        mgmt_port_name("abcdef", MAX_HOSTS - 1),
    ]
    assert longest[0] == f"t1{'iv'}" and MAX_T1 == 256
    assert all(len(n) <= MAX_IFNAME for n in longest), longest


@pytest.mark.parametrize("fabric", [DEFAULT, LARGE], ids=["default", "large"])
def test_every_static_route_is_a_route_line_in_its_switch(fabric: Fabric) -> None:
    p = plan(fabric, "mrc")
    for switch, table in static_routes(fabric).items():
        ns = p.netns[switch]
        lines = p.routes[ns]
        end = switch_locator(fabric, switch_usid(switch))
        assert (
            f"route replace {end} encap seg6local action End flavors next-csid "
            in (lines[0][: lines[0].index("lblen")])
        )
        assert "lblen 32 nflen 16 count dev sid" in lines[0]
        for usid, next_node in table.items():
            rec = p.links[_link_between(p, switch, next_node)]
            gateway = LOWER_LL if rec.a.node == next_node else UPPER_LL
            want = f"route replace {switch_locator(fabric, usid)} via {gateway} dev "
            want += rec.end(switch).ifname
            assert want in lines, (switch, want)
        # The rest of the block: the NIC addresses of other racks (a T0, ECMP over its
        # uplinks) or not yet in the table (a T1, via their T0), for the STEV EV format.
        plane = parse_node(switch).plane or 0
        nics = [h for h in range(fabric.hosts) if nic_usid(plane, h) not in table]
        for h in nics:
            want = f"route replace {switch_locator(fabric, nic_usid(plane, h))} "
            assert sum(line.startswith(want) for line in lines) == 1, (switch, want)
        srv6 = [line for line in lines if "fcbb:bb00:" in line]
        assert len(srv6) == 1 + len(table) + len(nics)  # nothing else is routed in the block
        assert not any("e000::" in line for line in lines)  # no classic SID unless asked


def test_classic_sid_format_adds_one_plain_end_sid_per_switch() -> None:
    fabric = dataclasses.replace(DEFAULT, sid_format="classic")
    p = plan(fabric, "mrc")
    for switch in static_routes(fabric):
        sid = classic_sid(fabric, switch_usid(switch))
        ends = [line for line in p.routes[p.netns[switch]] if "e000::" in line]
        assert ends == [f"route replace {sid}/128 encap seg6local action End count dev sid"]
    for host in range(fabric.hosts):
        ns = p.netns[f"h{host}"]
        assert p.sysctls[ns]["net/ipv6/conf/all/seg6_enabled"] == "1"  # SRH ends at the host


def _link_between(p: Plan, a: str, b: str) -> str:
    return next(k for k, r in p.links.items() if {r.a.node, r.b.node} == {a, b})


def test_hosts_own_their_sids_and_route_each_plane_out_of_its_nic() -> None:
    p = plan(DEFAULT, "mrc")
    for host in range(DEFAULT.hosts):
        ns = p.netns[f"h{host}"]
        setup, routes = p.setup[ns], p.routes[ns]
        for plane in range(DEFAULT.planes):
            sid = nic_sid(DEFAULT, plane, host)
            assert f"address add {sid}/128 dev lo nodad" in setup
            assert f"route replace local {sid}/48 dev lo" in routes
            first_t0 = IPv6Network(f"fcbb:bb00:1{plane}00::/40")
            assert f"route replace {first_t0} via fe80::2 dev nic{plane} src {sid}" in routes
            addr = baseline_address(DEFAULT, plane, host)
            assert f"address add {addr}/128 dev lo nodad" in setup
        assert f"address add {mgmt_address('mrc', host)}/64 dev mgmt nodad" in setup


def test_baseline_routes_are_ecmp_at_t0_and_per_rack_at_t1() -> None:
    p = plan(DEFAULT, "mrc")
    t0 = p.routes[p.netns["p2-t0a"]]
    multipath = [line for line in t0 if "nexthop" in line]
    uplinks = " ".join(f"nexthop via fe80::2 dev t1{x}" for x in "abcd")
    assert multipath == [  # the other rack's baseline prefix and its hosts' NIC addresses
        f"route replace fdb0:0:2:1::/64 {uplinks}",
        f"route replace fcbb:bb00:9002::/48 {uplinks}",
        f"route replace fcbb:bb00:9003::/48 {uplinks}",
    ]
    assert p.sysctls[p.netns["p2-t0a"]]["net/ipv6/fib_multipath_hash_policy"] == "3"
    assert p.sysctls[p.netns["p2-t0a"]]["net/ipv6/fib_multipath_hash_fields"] == "0x3f"
    assert "route replace fdb0:0:2::1:0/128 via fe80::1 dev h0" in t0
    t1 = p.routes[p.netns["p2-t1c"]]
    assert "route replace fdb0:0:2::/64 via fe80::1 dev t0a" in t1
    assert "route replace fdb0:0:2:1::/64 via fe80::1 dev t0b" in t1
    assert str(baseline_address(DEFAULT, 2, 3)) == "fdb0:0:2:1::1:3"


def test_veth_pairs_are_created_with_both_ends_in_place() -> None:
    p = plan(SMALL, "tq")
    assert p.root_lines[: len(p.netns)] == [f"netns add {ns}" for ns in p.netns.values()]
    assert (
        "link add name t1b mtu 9000 netns tq-p0-t0a type veth peer name t0a mtu 9000 "
        "netns tq-p0-t1b" in p.root_lines
    )
    assert "link add name tq-m1 type veth peer name mgmt netns tq-h1" in p.root_lines
    assert p.root_links == ("tq-br", "tq-m0", "tq-m1")


def test_plan_is_deterministic() -> None:
    assert plan(DEFAULT, "mrc") == plan(DEFAULT, "mrc")
    assert plan(LARGE, "big").root_lines == plan(LARGE, "big").root_lines


def test_two_names_give_disjoint_root_objects() -> None:
    one, two = plan(DEFAULT, "ta1"), plan(DEFAULT, "ta2")
    assert not set(one.netns.values()) & set(two.netns.values())
    assert not set(one.root_links) & set(two.root_links)
    assert not mgmt_prefix("ta1").overlaps(mgmt_prefix("ta2"))
    assert mgmt_prefix("ta1").subnet_of(IPv6Network("fd00::/8"))


def test_shaping_puts_tbf_on_both_ends_of_every_shaped_link() -> None:
    only_fabric = dataclasses.replace(DEFAULT, fabric_link_bps=200e6, queue_bytes=65536)
    p = plan(only_fabric, "mrc")
    lines = [line for ns_lines in p.shaping.values() for line in ns_lines]
    t0_t1_links = DEFAULT.planes * DEFAULT.racks * DEFAULT.t1_per_plane
    assert len(lines) == 2 * t0_t1_links
    assert all("tbf rate 200000000bit burst 25000 limit 65536" in line for line in lines)
    assert not plan(DEFAULT, "mrc").shaping
    assert tbf_line("x", 1e6, 10_000, 9000) == (
        "qdisc replace dev x root tbf rate 1000000bit burst 18128 limit 10000"
    )


def test_sysctls_make_switches_forward_with_srv6() -> None:
    p = plan(SMALL, "tq")
    switch = p.sysctls[p.netns["p0-t0a"]]
    assert switch["net/ipv6/conf/all/forwarding"] == "1"
    assert switch["net/ipv6/conf/t1b/seg6_enabled"] == "1"
    assert switch["net/ipv6/conf/all/keep_addr_on_down"] == "1"
    assert "net/ipv6/conf/all/forwarding" not in p.sysctls[p.netns["h0"]]


def test_linux_facts_vector_through_usid_shift() -> None:
    """The kernel/VPP test vector of docs/linux.md: /32 block, 16-bit uSIDs."""
    shifted = usid_shift(IPv6Address("1111:2222:aaaa:bbbb:cccc:dddd:eeee:ffff"))
    assert shifted == IPv6Address("1111:2222:bbbb:cccc:dddd:eeee:ffff:0")


# State ------------------------------------------------------------------------------------
def test_state_round_trips_and_answers_lookups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state, "STATE_DIR", tmp_path)
    recorded = plan(DEFAULT, "rt").state(complete=True)
    state.save(recorded)
    loaded = state.load("rt")
    assert loaded == recorded
    assert state.recorded() == ["rt"]
    assert loaded.ns("p0-t1c") == netns_name("rt", "p0-t1c")
    link = loaded.link("p0:t1c-t0a")
    assert link == loaded.link("p0-t0a", "p0-t1c")
    assert link.name == "p0:t0a-t1c" and not link.host_facing
    assert loaded.port("p0-t0a", "p0-t1c").ifname == "t1c"
    assert loaded.port("p0-t1c", "p0-t0a").ifname == "t0a"
    assert loaded.port("h3", "p1-t0b").ifname == "nic1"
    assert loaded.link("h3", "p1-t0b").host_facing
    assert len(loaded.switch_links("p0-t0a")) == 2 + 4
    assert len(loaded.switch_links("p0-t1a")) == 2
    with pytest.raises(TestbedError, match="no link"):
        loaded.link("h0", "p0-t0b")  # h0 is in rack a
    with pytest.raises(TestbedError, match="no node"):
        loaded.ns("h9")
    state.remove("rt")
    with pytest.raises(TestbedError, match="no testbed named 'rt'"):
        state.load("rt")


@pytest.mark.parametrize("name", ["", "A", "1ab", "abcdefg", "a-b", "mrc "])
def test_bad_testbed_names_are_refused(name: str) -> None:
    with pytest.raises(TestbedError, match="bad testbed name"):
        state.check_name(name)


def test_one_line_collapses_stderr() -> None:
    assert one_line("Error: x\n\nCommand failed -:3\n") == "Error: x; Command failed -:3"


# CLI errors that need no kernel --------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["up", "--planes", "0"], "fabric.planes: must be in 1..16, got 0"),
        (["up", "--rate", "fast"], "bad rate 'fast'"),
        (["up", "--name", "Bad"], "bad testbed name 'Bad'"),
        (["up", "--config", "/nonexistent.toml"], "--config /nonexistent.toml: cannot read"),
        (["exec", "h0"], "no command given"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_cli_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_cli_unknown_testbed_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(state, "STATE_DIR", tmp_path)
    for argv in (["down", "--name", "zz"], ["status", "--name", "zz"], ["paths", "h0", "h1"]):
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert re.search(r"no testbed named '(zz|mrc)'", err) and err.count("\n") == 1, err


def test_cli_paths_lists_every_path_with_its_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(state, "STATE_DIR", tmp_path)
    state.save(plan(DEFAULT, "pq").state(complete=True))
    assert cli.main(["paths", "h0", "h3", "--name", "pq", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["paths"]) == DEFAULT.planes * DEFAULT.t1_per_plane
    first = data["paths"][0]
    assert first["address"] == "fcbb:bb00:1000:2000:1001:8003::"
    assert first["switches"] == ["p0-t0a", "p0-t1a", "p0-t0b"]
    assert cli.main(["paths", "h0", "h99", "--name", "pq"]) == 2
    assert "host 99 out of range 0..3" in capsys.readouterr().err
