"""``testbed status``'s traffic view from two counter readings, without a testbed: rates per
link, drops only of the interval (the few a port counts at build are not news), the plane
summary with its T1 spread, and text that fits a terminal."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from mrcstack.addrplan import canonical_link, parse_node
from mrcstack.fabric import Fabric
from mrcstack.netns import linkload

FABRIC = Fabric()


def reading() -> dict[str, Any]:
    """A status document of the default fabric, idle, as `up` leaves it (tx_dropped 2 on
    every port: the MLD reports sent before the veth peer came up)."""
    links = []
    for plane in range(FABRIC.planes):
        for t0 in ("t0a", "t0b"):
            hosts = ("h0", "h1") if t0 == "t0a" else ("h2", "h3")
            ends = [(h, f"p{plane}-{t0}") for h in hosts]
            ends += [(f"p{plane}-{t0}", f"p{plane}-t1{x}") for x in "abcd"]
            for a, b in ends:
                name = canonical_link(f"p{plane}:{parse_node(a).short}-{parse_node(b).short}")
                links.append({
                    "name": name, "host_facing": a.startswith("h"), "state": "up",
                    **{k: {"node": n, "tx_packets": 3, "tx_bytes": 300, "rx_dropped": 0,
                           "tx_dropped": 2} for k, n in (("a", a), ("b", b))},
                })  # fmt: skip
    sids = {
        f"p{p}-{s}": {"sid": f"fcbb:bb00:{p}::/48", "next_csid": True, "packets": 0}
        for p in range(FABRIC.planes)
        for s in ("t0a", "t0b", "t1a", "t1b", "t1c", "t1d")
    }
    return {
        "name": "mrc", "healthy": True, "complete": True,
        "fabric": {"planes": 4, "racks": 2, "hosts_per_rack": 2, "t1_per_plane": 4},
        "namespaces": {"expected": 28, "present": 28, "missing": []},
        "mgmt": {"bridge": "mrc-br", "prefix": "fd00::/64"}, "links": links, "sids": sids,
    }  # fmt: skip


def link(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(x for x in doc["links"] if x["name"] == name)


def test_rates_drops_and_the_t1_spread_come_from_the_interval() -> None:
    before = reading()
    after = copy.deepcopy(before)
    h0 = link(after, "p1:h0-t0a")
    h0["a"]["tx_packets"] += 2000  # h0 sent 2000 packets of 1000 bytes into plane 1
    h0["a"]["tx_bytes"] += 2_000_000
    link(after, "p1:t0a-t1a")["a"]["tx_packets"] += 1500  # a skewed ECMP spread
    link(after, "p1:t0a-t1b")["a"]["tx_packets"] += 500
    link(after, "p1:t0a-t1b")["b"]["tx_dropped"] += 7
    doc = linkload.with_rates(before, after, 2.0)
    rates = link(doc, "p1:h0-t0a")["rates"]
    assert rates["a_to_b"] == {"packets_per_s": 1000.0, "bits_per_s": 8e6}
    assert rates["b_to_a"]["packets_per_s"] == 0 and rates["drops"] == 0  # build drops: old
    plane = doc["planes"][1]
    assert plane["sent"] == {"packets_per_s": 1000.0, "bits_per_s": 8e6} and plane["drops"] == 7
    assert plane["t1_share"] == {"p1-t1a": 0.75, "p1-t1b": 0.25, "p1-t1c": 0.0, "p1-t1d": 0.0}
    summary = linkload.summary_text(doc)
    assert "t1a 75% t1b 25% t1c 0% t1d 0%" in summary
    idle = [line for line in summary.splitlines() if line.startswith("0 ")]
    assert idle and idle[0].split()[2:5] == ["0", "0.0", "0"]  # no "drops 4" when idle
    text = linkload.detail_text(doc, 1, None)
    lines = text.splitlines()
    assert len(lines) <= 24 and max(map(len, lines)) <= 80  # a terminal, as it opens
    assert any(x.startswith("p1:h0-t0a") and "1000     8.0" in x for x in lines)
    ports = linkload.detail_text(doc, None, "p1-t1b").splitlines()
    assert [x.split()[0] for x in ports[2:4]] == ["p1:t0a-t1b", "p1:t0b-t1b"]


def test_an_idle_interval_shows_the_spread_since_the_build() -> None:
    """After a transfer has ended the T1 spread is still there to read."""
    after = reading()
    link(after, "p2:t0b-t1c")["a"]["tx_packets"] += 96  # t1c: 3 + 99 of 120 packets sent up
    text = linkload.summary_text(linkload.with_rates(after, after, 1.0))
    assert "since up" in text
    assert "t1a 5% t1b 5% t1c 85% t1d 5%" in next(x for x in text.splitlines() if x[:2] == "2 ")


def test_plot_draws_a_png(tmp_path: Path) -> None:
    doc = linkload.with_rates(reading(), reading(), 1.0)
    linkload.plot(doc, tmp_path / "load.png")
    assert (tmp_path / "load.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
