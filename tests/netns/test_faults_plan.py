"""Planning faults without a testbed (:mod:`mrcstack.netns.faults.plan`): names resolved
against the fabric, probabilities, nftables rules, loss sites, route lines, trim settings."""

from __future__ import annotations

from typing import Any

import pytest

from mrcstack.addrplan import switch_locator, switch_usid
from mrcstack.fabric import Fabric
from mrcstack.netns.faults.plan import (
    FaultError,
    as_replace,
    directions,
    loss_site,
    nft_random_drop,
    nft_ruleset,
    parse_probability,
    path_loss_rule,
    resolve_link,
    resolve_switch,
    routes_avoiding,
    trim_settings,
)
from mrcstack.netns.state import LinkEnd, LinkRecord

FABRIC = Fabric()


def test_links_resolve_from_node_names_or_link_names_either_way() -> None:
    assert resolve_link(FABRIC, "p0-t0a", "p0-t1c") == "p0:t0a-t1c"
    assert resolve_link(FABRIC, "p0-t1c", "p0-t0a") == "p0:t0a-t1c"
    assert resolve_link(FABRIC, "p0:t1c-t0a") == "p0:t0a-t1c"
    assert resolve_link(FABRIC, "p2-t0b", "h3") == "p2:h3-t0b"
    assert resolve_link(FABRIC, "p1:h0-t0a") == "p1:h0-t0a"


@pytest.mark.parametrize(
    ("a", "b", "problem"),
    [
        ("p0-t0a", "p0-t1z", "not in this fabric"),
        ("h0", "p0-t0b", "not in rack t0b"),
        ("h0", "h1", "both hosts"),
        ("p0-t1a", "p0-t1b", "not a link"),
        ("p0-t0a", "p1-t1a", "not on plane 0"),
        ("p9:t0a-t1a", None, "plane"),
        ("t0a-t1a", None, "bad link name"),
    ],
)
def test_bad_links_are_one_line_errors(a: str, b: str | None, problem: str) -> None:
    with pytest.raises(FaultError, match=problem) as info:
        resolve_link(FABRIC, a, b)
    assert "\n" not in str(info.value)


def test_switches_resolve_from_name_usid_or_locator() -> None:
    assert resolve_switch(FABRIC, "p1-t1c") == "p1-t1c"
    assert resolve_switch(FABRIC, "2102") == "p1-t1c"
    assert resolve_switch(FABRIC, "0x2102") == "p1-t1c"
    assert resolve_switch(FABRIC, "fcbb:bb00:2102::") == "p1-t1c"
    assert resolve_switch(FABRIC, "fcbb:bb00:1001::/48") == "p0-t0b"
    for bad, problem in [
        ("h0", "host"),
        ("p4-t0a", "plane 4"),
        ("p0-t0c", "not in this fabric"),
        ("8001", "host"),
        ("fcbb:bb00:1000:2001::", "names a path"),
        ("fcbb:bb00:1000::/40", "/48"),
        ("fd00:bb00:1000::", "block"),
        ("zz", "bad switch"),
    ]:
        with pytest.raises(FaultError, match=problem):
            resolve_switch(FABRIC, bad)


def test_probabilities_and_directions() -> None:
    assert parse_probability("20%") == pytest.approx(0.2)
    assert parse_probability("0.05") == pytest.approx(0.05)
    assert parse_probability(1) == 1.0
    for bad in ("0", 0.0, "150%", "-0.1", "lots", True):
        with pytest.raises(FaultError):
            parse_probability(bad)
    assert directions("p0:t0a-t1c") == [("p0-t0a", "p0-t1c"), ("p0-t1c", "p0-t0a")]
    assert directions("p0:h0-t0a", "p0-t0a") == [("p0-t0a", "h0")]
    with pytest.raises(FaultError, match="not an end"):
        directions("p0:h0-t0a", "h1")


# nftables rules ------------------------------------------------------------------------------
def test_random_drop_uses_numgen_with_the_asked_probability() -> None:
    assert nft_random_drop(0.2) == "numgen random mod 1000000 < 200000 counter drop"
    assert nft_random_drop(0.000001) == "numgen random mod 1000000 < 1 counter drop"
    assert nft_random_drop(1.0) == "counter drop"
    with pytest.raises(FaultError):
        nft_random_drop(1e-9)  # rounds to zero: refuse rather than silently do nothing


def test_ruleset_is_one_table_with_one_filter_chain() -> None:
    script = nft_ruleset("mrcfault_7", "forward", ['oifname "t1c" counter drop'])
    assert script.splitlines() == [
        "table inet mrcfault_7 {",
        "  chain c_forward {",
        "    type filter hook forward priority -300; policy accept;",
        '    oifname "t1c" counter drop',
        "  }",
        "}",
    ]
    with pytest.raises(ValueError):
        nft_ruleset("t", "output", [])


def _record(name: str, a: tuple[str, str], b: tuple[str, str]) -> LinkRecord:
    return LinkRecord(
        name=name,
        a=LinkEnd(a[0], f"tc-{a[0]}", a[1]),
        b=LinkEnd(b[0], f"tc-{b[0]}", b[1]),
        host_facing=a[0].startswith("h"),
    )


def test_link_loss_sits_at_the_sending_switch_egress_or_the_t0_ingress_for_a_host() -> None:
    fabric_link = _record("p0:t0a-t1c", ("p0-t0a", "t1c"), ("p0-t1c", "t0a"))
    assert loss_site(fabric_link, "p0-t0a") == ("tc-p0-t0a", 'oifname "t1c"')
    assert loss_site(fabric_link, "p0-t1c") == ("tc-p0-t1c", 'oifname "t0a"')
    host_link = _record("p0:h0-t0a", ("h0", "nic0"), ("p0-t0a", "h0"))
    assert loss_site(host_link, "h0") == ("tc-p0-t0a", 'iifname "h0"')
    assert loss_site(host_link, "p0-t0a") == ("tc-p0-t0a", 'oifname "h0"')


def test_path_loss_matches_the_switch_locator_from_the_address_plan() -> None:
    rule = path_loss_rule(FABRIC, "p1-t1c", 0.3)
    locator = switch_locator(FABRIC, switch_usid("p1-t1c"))
    assert rule == f"ip6 daddr {locator} numgen random mod 1000000 < 300000 counter drop"
    assert str(locator) == "fcbb:bb00:2102::/48"


# Route lines ---------------------------------------------------------------------------------
def test_routes_avoiding_down_ports_keep_live_nexthops_only() -> None:
    lines = [
        "route replace fcbb:bb00:2000::/48 via fe80::2 dev t1a",
        "route replace fcbb:bb00:2001::/48 via fe80::2 dev t1b",
        "route replace fdb0:0:0:1::/64 nexthop via fe80::2 dev t1a nexthop via fe80::2 dev t1b",
        "route replace fdb0:0:0:2::/64 nexthop via fe80::2 dev t1a weight 2",
        "route replace fcbb:bb00:1000::/48 encap seg6local action End count dev sid",
    ]
    assert routes_avoiding(lines, {"t1a"}) == [
        "route replace fcbb:bb00:2001::/48 via fe80::2 dev t1b",
        "route replace fdb0:0:0:1::/64 nexthop via fe80::2 dev t1b",
        "route replace fcbb:bb00:1000::/48 encap seg6local action End count dev sid",
    ]
    assert routes_avoiding(lines, set()) == lines
    assert as_replace("route add 1::/64 dev x") == "route replace 1::/64 dev x"
    with pytest.raises(FaultError):
        as_replace("address add fe80::1/64 dev x")


def test_trim_rate_and_queue_default_to_the_links_shaping_and_the_fabric_queue() -> None:
    shaped = Fabric(host_link_bps=100e6, fabric_link_bps=400e6, queue_bytes=300_000)
    given: dict[str, Any] = {"threshold_bytes": 65536, "ecn_threshold_bytes": 16384,
                             "probability": None}  # fmt: skip
    to_t0 = trim_settings(shaped, "p0:t0b-t1a", "p0-t0b", rate_bps=None, queue_bytes=None, **given)
    assert to_t0 == {"rate_bps": 400_000_000, "trim_threshold_bytes": 65536,
                     "ecn_threshold_bytes": 16384, "last_hop": False, "probability": None,
                     "queue_bytes": 300_000}  # fmt: skip
    to_host = trim_settings(shaped, "p0:h2-t0b", "h2", rate_bps=None, queue_bytes=None, **given)
    assert (to_host["rate_bps"], to_host["last_hop"]) == (100_000_000, True)
    mine = trim_settings(shaped, "p0:h2-t0b", "h2", rate_bps=1e6, queue_bytes=70_000, **given)
    assert (mine["rate_bps"], mine["queue_bytes"]) == (1_000_000, 70_000)
    unshaped = r"^trim p0:t0b-t1a: the link is unshaped, give its rate \(--rate\)$"
    with pytest.raises(FaultError, match=unshaped):
        trim_settings(FABRIC, "p0:t0b-t1a", "p0-t0b", rate_bps=None, queue_bytes=None, **given)
    with pytest.raises(FaultError, match=r"threshold 300000 bytes is not below the queue"):
        trim_settings(shaped, "p0:t0b-t1a", "p0-t0b", rate_bps=None, queue_bytes=None,
                      **given | {"threshold_bytes": 300_000})  # fmt: skip
