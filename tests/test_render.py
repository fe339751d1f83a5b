"""``mrcstack render``: switch configurations from the fabric description, checked for
structure in every format, and the Linux one applied to a topology built by hand (not by the
testbed builder) until a packet crosses it along the path its uSID address names."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mrcstack import render
from mrcstack.addrplan import address, nic_sid, static_routes, switch_locator, switch_usid
from mrcstack.fabric import Fabric
from mrcstack.netns.run import call_in_netns
from tests.support import REPO
from tests.support.isolation import run_name

ROOT = REPO
FABRIC = Fabric()


def test_linux_batch_has_the_un_sid_and_one_route_per_table_entry() -> None:
    text = render.render(FABRIC, "linux", ["p1-t0b"], {"t1c": "swp3"})
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    own = switch_locator(FABRIC, switch_usid("p1-t0b"))
    assert f"route replace {own} encap seg6local action End flavors next-csid" in lines[2]
    routes = lines[3:]
    assert len(routes) == len(static_routes(FABRIC)["p1-t0b"])
    assert "route replace fcbb:bb00:2102::/48 via fe80::2 dev swp3" in routes  # renamed port
    assert "route replace fcbb:bb00:8802::/48 via fe80::1 dev h2" in routes  # down to a host


def test_frr_has_a_locator_a_un_sid_and_static_routes_per_switch() -> None:
    text = render.render(FABRIC, "frr", [])
    for switch, table in static_routes(FABRIC).items():
        own = switch_locator(FABRIC, switch_usid(switch))
        assert f"   locator {switch}\n    prefix {own} block-len 32 node-len 16" in text
        assert f"   sid {own} locator {switch} behavior uN" in text
        for usid in table:
            assert f"ipv6 route {switch_locator(FABRIC, usid)} fe80::" in text


def test_sonic_config_db_entries() -> None:
    doc = json.loads(render.render(FABRIC, "sonic", ["p0-t1a"]))
    assert doc["SRV6_MY_LOCATORS"]["p0-t1a"]["prefix"] == "fcbb:bb00:2000::"
    assert doc["SRV6_MY_SIDS"] == {"p0-t1a|fcbb:bb00:2000::/48": {"action": "uN"}}
    assert doc["STATIC_ROUTE"]["default|fcbb:bb00:1001::/48"] == {
        "nexthop": "fe80::1",
        "ifname": "t0b",
    }
    every = json.loads(render.render(FABRIC, "sonic", []))
    assert set(every) == set(static_routes(FABRIC))


def test_bad_arguments_are_one_line() -> None:
    for args, needle in (
        (["--format", "linux", "--switch", "p9-t0a"], "no switch 'p9-t0a'"),
        (["--format", "linux", "--port", "t1a"], "PEER=IFNAME"),
        (["--format", "linux", "--fabric", "/nonexistent.toml"], "No such file"),
    ):
        proc = subprocess.run([sys.executable, "-m", "mrcstack", "render", *args], cwd=ROOT,
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert needle in proc.stderr


def test_out_writes_one_file_per_switch(tmp_path: Path) -> None:
    """--out DIR: a file per switch, each what rendering that switch alone prints."""
    out = tmp_path / "switches"
    proc = subprocess.run(
        [sys.executable, "-m", "mrcstack", "render", "--format", "frr", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and f"wrote 24 files to {out}" in proc.stdout, proc.stderr
    names = sorted(static_routes(FABRIC))
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}.frr.conf" for n in names)
    for name in names:
        assert (out / f"{name}.frr.conf").read_text() == render.render(FABRIC, "frr", [name])
    (json_file,) = render.write_files(FABRIC, "sonic", ["p1-t0b"], tmp_path / "one")
    assert json_file.name == "p1-t0b.json" and "SRV6_MY_SIDS" in json.loads(json_file.read_text())


@pytest.mark.requires_root
def test_the_linux_rendering_forwards_a_packet_on_a_hand_built_topology() -> None:
    fabric = Fabric(planes=1, racks=2, hosts_per_rack=1, t1_per_plane=1)
    prefix = run_name("rn")
    nodes = ["h0", "h1", "p0-t0a", "p0-t0b", "p0-t1a"]
    ns = {n: f"{prefix}-{n}" for n in nodes}
    # canonical links (first-named end gets fe80::1): host < T0 < T1
    links = [("h0", "p0-t0a"), ("h1", "p0-t0b"), ("p0-t0a", "p0-t1a"), ("p0-t0b", "p0-t1a")]

    def sh(*argv: str) -> None:
        subprocess.run(argv, check=True, capture_output=True, text=True)

    def port(node: str, peer: str) -> str:
        return "nic0" if node.startswith("h") else peer.rsplit("-", maxsplit=1)[-1]

    try:
        for n in nodes:
            sh("ip", "netns", "add", ns[n])
            for key in ("all.forwarding", "all.seg6_enabled", "default.seg6_enabled"):
                sh("ip", "netns", "exec", ns[n], "sysctl", "-qw", f"net.ipv6.conf.{key}=1")
            sh("ip", "-n", ns[n], "link", "set", "lo", "up")
        for i, (a, b) in enumerate(links):
            va, vb = f"{prefix}a{i}", f"{prefix}b{i}"
            sh("ip", "link", "add", va, "netns", ns[a], "type", "veth", "peer", vb,
               "netns", ns[b])  # fmt: skip
            for node, dev, peer, ll in ((a, va, b, "fe80::1"), (b, vb, a, "fe80::2")):
                name = port(node, peer)
                sh("ip", "-n", ns[node], "link", "set", dev, "name", name)
                sh("ip", "-n", ns[node], "addr", "add", f"{ll}/64", "dev", name, "nodad")
                sh("ip", "-n", ns[node], "link", "set", name, "up")
        for switch in ("p0-t0a", "p0-t0b", "p0-t1a"):
            batch = render.render(fabric, "linux", [switch])
            subprocess.run(["ip", "-n", ns[switch], "-batch", "-"], input=batch, text=True,
                           check=True, capture_output=True)  # fmt: skip
        for host in (0, 1):
            sid = nic_sid(fabric, 0, host)
            sh("ip", "-n", ns[f"h{host}"], "addr", "add", f"{sid}/128", "dev", "lo", "nodad")
            sh("ip", "-n", ns[f"h{host}"], "-6", "route", "add", "local", f"{sid}/48", "dev", "lo")
            sh("ip", "-n", ns[f"h{host}"], "-6", "route", "add", "fcbb:bb00::/32", "via",
               "fe80::2", "dev", "nic0", "src", str(sid))  # fmt: skip

        def receiver() -> socket.socket:
            s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
            s.setsockopt(socket.IPPROTO_UDP, 102, 1)  # UDP_NO_CHECK6_RX: uSID shifts it
            s.bind(("::", 4799))
            s.settimeout(5)
            return s

        def sender() -> socket.socket:
            s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
            s.setsockopt(socket.IPPROTO_UDP, 101, 1)  # UDP_NO_CHECK6_TX
            return s

        rx = call_in_netns(ns["h1"], receiver)
        tx = call_in_netns(ns["h0"], sender)
        dst = address(fabric, 0, 1, 0, 0)  # h0 -> t0a -> t1a -> t0b -> h1
        tx.sendto(b"rendered", (str(dst), 4799))
        data, source = rx.recvfrom(100)
        assert data == b"rendered" and source[0] == str(nic_sid(fabric, 0, 0))
        tx.close()
        rx.close()
    finally:
        for n in nodes:
            subprocess.run(["ip", "netns", "del", ns[n]], capture_output=True, check=False)
