"""Every fault against live traffic on one default testbed (``tc``, as root).

Live checks send UDP datagrams from a host to every path's uSID address (addrplan.paths)
and count, per path, what the destination host receives: a fault must stop exactly the
paths it names, keep the others flowing, and after the undo every path forwards again with
the namespaces' route tables and addresses exactly as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mrcstack.addrplan import Path as FabricPath
from mrcstack.addrplan import paths
from mrcstack.fabric import Fabric
from mrcstack.netns import ifctl, traffic, trim
from mrcstack.netns import run as run_module
from mrcstack.netns.faults import cli as fault_cli
from mrcstack.netns.faults import nftlib
from mrcstack.netns.faults import ops as faultops
from mrcstack.netns.faults.harness import Faults
from mrcstack.netns.faults.plan import FaultError
from mrcstack.netns.faults.records import Address
from mrcstack.netns.faults.scenario import parse_scenario, run_scenario
from mrcstack.netns.run import TestbedError, call_in_netns, resident_netns
from mrcstack.netns.traffic import DEFAULT_PORT
from mrcstack.wire import (
    DATA_HDR_LEN,
    DATA_IMM_HDR_LEN,
    IMM_OPCODES,
    TCLASS_DATA,
    CrcIntegrity,
    DataPacket,
    Dscp,
    encode,
    encode_trimmed,
    trimmed_length,
)
from tests.support import REPO
from tests.support.testbeds import Bed, Testbeds
from tests.support.trimming import CE, ECN_MASK, ECT0, L2_L4, check_trimmed, data_packets, psn_of

pytestmark = pytest.mark.requires_root
FABRIC = Fabric()
PORT = 9777
PAUSE_EVERY = 100  # datagrams between pauses: stays far below veth's per-CPU backlog
DRAIN_IDLE_S = 0.2  # the receiver is done when nothing more came for this long


def send(
    live: Bed,
    src: str,
    dst: str,
    jobs: list[tuple[str, bytes, int]],
    pause: float = 0.001,
    port: int = PORT,
    tclass: int | None = None,
) -> dict[str, Any]:
    """Send ``count`` copies of each payload to each address from host ``src`` (sockets
    made inside the namespaces by mrcstack.netns.traffic, zero UDP checksums, traffic class
    ``tclass``); return what host ``dst`` received: ``counts`` by the payload's first 4
    bytes, every datagram (``raw``) with its traffic class (``tclass``), and the
    time.monotonic() when sending began (``started``) and the last datagram was read
    (``last_read``).  The sending thread stays on one CPU meanwhile: veth hands a packet to
    the sending CPU's backlog, so packets cross the fabric in the order sent."""
    receiver = traffic.udp_receiver(live.state.ns(dst), port)  # 8 MiB buffer: holds a whole test
    sender = traffic.udp_sender(live.state.ns(src), tclass=tclass)
    cpus = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(cpus)})
        started = time.monotonic()
        sent = 0
        for address, data, count in jobs:
            for _ in range(count):
                with contextlib.suppress(OSError):  # no route while a NIC is down
                    sender.sendto(data, (address, port))
                sent += 1
                if sent % PAUSE_EVERY == 0:
                    time.sleep(pause)
        os.sched_setaffinity(0, cpus)
        counts: dict[str, int] = {}
        raw: list[bytes] = []
        tclasses: list[int | None] = []
        last_read = started
        while (dgram := traffic.receive(receiver, DRAIN_IDLE_S)) is not None:
            last_read = time.monotonic()
            key = dgram.data[:4].hex()
            counts[key] = counts.get(key, 0) + 1
            raw.append(dgram.data)
            tclasses.append(dgram.tclass)
        return {"counts": counts, "raw": raw, "tclass": tclasses, "started": started,
                "last_read": last_read}  # fmt: skip
    finally:
        os.sched_setaffinity(0, cpus)
        sender.close()
        receiver.close()


def tag(index: int) -> bytes:
    return index.to_bytes(4, "big") + bytes(60)


def probe(live: Bed, src: str, dst: str, count: int = 40) -> dict[FabricPath, int]:
    """Datagrams received per path from ``src`` to ``dst`` (``count`` sent on each)."""
    fabric = live.state.fabric
    every = paths(fabric, int(src[1:]), int(dst[1:]))
    got = send(live, src, dst, [(str(p.address), tag(i), count) for i, p in enumerate(every)])
    return {p: got["counts"].get(tag(i)[:4].hex(), 0) for i, p in enumerate(every)}


def check_paths(live: Bed, src: str, dst: str, dead: Any, count: int = 40) -> dict[FabricPath, int]:
    """Paths for which ``dead(path)`` is true carry nothing; every other path delivers."""
    got = probe(live, src, dst, count)
    wrong = {
        f"{p.address} {'-'.join(p.nodes)}": n
        for p, n in got.items()
        if (n != 0 if dead(p) else n < 0.9 * count)
    }
    assert not wrong, f"{src}->{dst}: paths delivering wrongly (received of {count}): {wrong}"
    assert any(not dead(p) for p in got), "the check needs at least one live path"
    return got


def all_alive(path: FabricPath) -> bool:
    return False


def tables(ns: str) -> list[str]:
    """What must be exactly as before a fault: every route (all tables), address and link
    state of the namespace.  Sorted: the kernel lists equal prefixes on different ports in
    the order they were added, which a flap changes."""
    lines: list[str] = []
    for cmd in (["-6", "route", "show", "table", "all"], ["-6", "-o", "address", "show"],
                ["-o", "link", "show"]):  # fmt: skip
        out = subprocess.run(["ip", "-n", ns, *cmd], capture_output=True, text=True, check=True)
        lines += out.stdout.splitlines()
    return sorted(lines)


@pytest.fixture(scope="module")
def live(testbeds: Testbeds) -> Bed:
    """The default fabric, its fault harness logging to ``live.log``."""
    return testbeds.up("tc", FABRIC)


@pytest.fixture
def clean_after(live: Bed) -> Iterator[Bed]:
    """Every live test leaves no fault behind, even when it fails."""
    try:
        yield live
    finally:
        live.faults.restore_all()


def through_link(link: str) -> Any:
    return lambda p: link in p.physical_links


def through_switch(switch: str) -> Any:
    return lambda p: switch in p.nodes


def test_live_baseline_every_path_delivers_both_ways(clean_after: Bed) -> None:
    check_paths(clean_after, "h0", "h2", all_alive)
    check_paths(clean_after, "h3", "h1", all_alive)
    check_paths(clean_after, "h0", "h1", all_alive)


def test_live_link_down_stops_exactly_its_paths_and_up_restores_everything(
    clean_after: Bed,
) -> None:
    live, link = clean_after, "p0:t0a-t1b"
    ends = [live.state.ns("p0-t0a"), live.state.ns("p0-t1b")]
    before = {ns: tables(ns) for ns in ends}
    [fault] = live.faults.link_down("p0-t1b", "p0-t0a")
    assert fault.kind == "link_down" and fault.target == link
    shown = subprocess.run(["ip", "-n", ends[0], "-o", "link", "show", "dev", "t1b"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "state DOWN" in shown
    check_paths(live, "h0", "h2", through_link(link))
    check_paths(live, "h2", "h0", through_link(link))  # the way back crosses t1b -> t0a
    with pytest.raises(FaultError, match="already down"):
        live.faults.link_down(link)
    live.faults.link_up(link)
    assert {ns: tables(ns) for ns in ends} == before  # trap 1: routes and fe80::1/2 are back
    check_paths(live, "h0", "h2", all_alive)
    check_paths(live, "h2", "h0", all_alive)
    with pytest.raises(FaultError, match="is not down"):
        live.faults.link_up(link)
    assert any("apply #" in line and "link_down p0:t0a-t1b" in line for line in live.log)


def test_live_port_state_and_addresses_read_and_set_in_process(clean_after: Bed) -> None:
    """The harness sets a port's state with an ioctl from a thread in its namespace and
    reads the addresses it must restore from if_inet6: both agree with ``ip``."""
    ns = clean_after.state.ns("p0-t0a")

    def ip_json(*args: str) -> dict[str, Any]:
        out = subprocess.run(["ip", "-n", ns, "-j", *args], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
        [dev] = json.loads(out)
        return dict(dev)

    def is_up(ifname: str) -> bool:
        return "UP" in ip_json("link", "show", "dev", ifname)["flags"]

    for ifname in ("t1a", "h0"):
        want = [Address(a["local"], a["prefixlen"], bool(a.get("nodad")))
                for a in ip_json("-6", "address", "show", "dev", ifname)["addr_info"]
                if a.get("scope") == "global" or a.get("nodad")]  # fmt: skip
        assert want, f"{ifname}: the check needs a port with addresses"
        key = lambda a: a.local  # noqa: E731
        assert sorted(faultops.addresses(ns, ifname), key=key) == sorted(want, key=key)
    # A spare veth pair in the namespace: toggling a fabric port would cost it its routes.
    subprocess.run(["ip", "-n", ns, "link", "add", "tcx0", "type", "veth", "peer", "name", "tcx1"],
                   check=True)  # fmt: skip
    try:
        ifctl.set_link(ns, "tcx0", up=True)
        assert is_up("tcx0")
        ifctl.set_link(ns, "tcx0", up=False)
        assert not is_up("tcx0")
    finally:
        subprocess.run(["ip", "-n", ns, "link", "del", "tcx0"], check=True)
    with pytest.raises(TestbedError, match="nosuchport"):
        ifctl.set_link(ns, "nosuchport", up=False)


def test_live_nftables_rule_sets_loaded_in_process(clean_after: Bed) -> None:
    """The harness loads a fault's nftables table through libnftables from a thread in the
    namespace: ``nft`` itself sees it there, and only there; errors name the namespace."""
    if not nftlib.available():
        pytest.skip("libnftables cannot be loaded here: faults run the nft program instead")
    ns = clean_after.state.ns("p1-t1a")
    other = clean_after.state.ns("p1-t1b")

    def tables(netns: str) -> str:
        return subprocess.run(["ip", "netns", "exec", netns, "nft", "list", "tables"],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip

    nftlib.run(ns, "table inet mrc_nftlib_test {\n chain c { type filter hook forward "
                   "priority 0; policy accept; }\n}\n")  # fmt: skip
    try:
        assert "mrc_nftlib_test" in tables(ns)
        assert "mrc_nftlib_test" not in tables(other) and "mrc_nftlib_test" not in tables_root()
    finally:
        faultops.nft_delete(ns, "mrc_nftlib_test")
    assert "mrc_nftlib_test" not in tables(ns)
    faultops.nft_delete(ns, "mrc_nftlib_test")  # already gone: not an error
    with pytest.raises(TestbedError, match=rf"nft in {ns}: .*syntax"):
        nftlib.run(ns, "this is not nftables")


def tables_root() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def test_live_overlapping_link_faults_on_one_switch_restore_one_at_a_time(
    clean_after: Bed,
) -> None:
    live = clean_after
    t0 = live.state.ns("p1-t0a")
    before = tables(t0)
    live.faults.link_down("p1:t0a-t1a")
    live.faults.link_down("p1:t0a-t1b")
    live.faults.nic_down("h0", 1)
    check_paths(live, "h1", "h2", lambda p: p.plane == 1 and p.nodes[2] in ("p1-t1a", "p1-t1b"))
    live.faults.link_up("p1:t0a-t1a")  # t1b and h0's NIC still down: their routes stay out
    check_paths(live, "h1", "h2", lambda p: p.plane == 1 and p.nodes[2] == "p1-t1b")
    live.faults.link_up("p1:t0a-t1b")
    live.faults.nic_up("h0", 1)
    assert tables(t0) == before
    check_paths(live, "h1", "h2", all_alive)
    check_paths(live, "h0", "h3", all_alive)


def _link_flags(ns: str, ifname: str) -> list[str]:
    out = subprocess.run(["ip", "-n", ns, "-j", "link", "show", "dev", ifname],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    flags: list[str] = json.loads(out)[0]["flags"]
    return flags


def test_live_armed_fault_is_recorded_at_once_and_applied_only_by_fire(clean_after: Bed) -> None:
    """``arm`` plans and records a fault without touching the fabric; ``fire`` applies it
    (once); restore undoes it as any other, with every route and address back."""
    live, link = clean_after, "p0:t0a-t1b"
    ends = [live.state.ns("p0-t0a"), live.state.ns("p0-t1b")]
    before = {ns: tables(ns) for ns in ends}
    armed = live.faults.arm(lambda f: f.link_down(link))
    [fault] = armed.faults
    assert [f.id for f in live.faults.active()] == [fault.id]
    assert "UP" in _link_flags(ends[0], "t1b") and "UP" in _link_flags(ends[1], "t0a")
    with pytest.raises(FaultError, match="already down"):  # the record holds the link
        live.faults.link_down(link)
    assert armed.fire() == [fault]
    assert "UP" not in _link_flags(ends[0], "t1b") and "UP" not in _link_flags(ends[1], "t0a")
    check_paths(live, "h0", "h2", through_link(link))
    with pytest.raises(FaultError, match="fire once"):
        armed.fire()
    armed.cancel()  # after fire: nothing to forget, the fault stays
    assert [f.id for f in live.faults.active()] == [fault.id]
    live.faults.link_up(link)
    assert {ns: tables(ns) for ns in ends} == before
    assert any("apply #" in line and f"link_down {link}" in line for line in live.log)


def test_live_armed_faults_that_never_fire_leave_nothing(clean_after: Bed) -> None:
    """A cancelled arm forgets its records; one left armed is undone harmlessly by
    restore_all; an arm that fails records nothing."""
    live = clean_after
    ns = live.state.ns("h1")
    before = tables(ns)
    armed = live.faults.arm(lambda f: f.nic_down("h1", 1))
    assert len(live.faults.active()) == 1
    armed.cancel()
    assert live.faults.active() == [] and tables(ns) == before
    with pytest.raises(FaultError, match="fire once"):
        armed.fire()
    live.faults.arm(lambda f: (f.nic_down("h1", 1), f.switch_blackhole("p1-t1b")))
    assert len(live.faults.active()) == 2
    live.faults.restore_all()  # nothing applied: a port set up again, a table already gone
    assert live.faults.active() == [] and tables(ns) == before
    check_paths(live, "h1", "h2", all_alive)

    def fails(f: Faults) -> None:
        f.nic_down("h1", 1)
        f.nic_down("h1", 1)  # the first one's record holds the port

    with pytest.raises(FaultError, match="already down"):
        live.faults.arm(fails)
    assert live.faults.active() == []
    live.faults.nic_down("h1", 1)
    with pytest.raises(FaultError, match="not an undo"):  # it would act at once
        live.faults.arm(lambda f: f.nic_up("h1", 1))
    assert len(live.faults.active()) == 1  # still down
    live.faults.nic_up("h1", 1)
    assert tables(ns) == before


def test_resident_namespace_threads_serve_calls_until_closed(clean_after: Bed) -> None:
    """Inside ``resident_netns`` every call for a namespace runs on one thread that joined
    it beforehand (in that namespace: its own ports); outside, each call has a new thread."""
    ns, other = clean_after.state.ns("p0-t1a"), clean_after.state.ns("p0-t1b")

    def where() -> tuple[threading.Thread, str]:  # the object: a thread id can be reused
        return threading.current_thread(), Path("/proc/thread-self/net/dev").read_text()

    with resident_netns([ns, ns]):
        (one, dev), (two, _) = call_in_netns(ns, where), call_in_netns(ns, where)
        assert one is two and "t0a:" in dev and "h0:" not in dev
        _, other_dev = call_in_netns(other, where)  # not resident: still in its namespace
        assert "t0a:" in other_dev
        with pytest.raises(ZeroDivisionError):
            call_in_netns(ns, lambda: 1 // 0)  # errors reach the caller; the thread stays
        assert call_in_netns(ns, where)[0] is one
        assert call_in_netns(ns, lambda: call_in_netns(ns, where))[0] is one  # no deadlock
    assert call_in_netns(ns, where)[0] is not one
    with pytest.raises(TestbedError, match="does not exist"), resident_netns(["nosuchns-x"]):
        pass
    closed = run_module._Resident(ns)
    closed.close()
    with pytest.raises(run_module._ClosedError):  # call_in_netns then starts a fresh thread
        closed.call(where)


def test_live_switch_fail_and_restore(clean_after: Bed) -> None:
    live = clean_after
    switch_ns = live.state.ns("p1-t1c")
    before = tables(switch_ns)
    live.faults.switch_fail("p1-t1c")
    with pytest.raises(FaultError, match=r"holds it; undo that"):
        live.faults.link_up("p1:t0a-t1c")  # held down by the switch failure, not by itself
    with pytest.raises(FaultError, match=r"already down \(#\d+ switch_fail p1-t1c\)"):
        live.faults.link_down("p1:t0b-t1c")
    check_paths(live, "h0", "h3", through_switch("p1-t1c"))
    check_paths(live, "h3", "h0", through_switch("p1-t1c"))
    live.faults.switch_restore("p1-t1c")
    assert tables(switch_ns) == before
    check_paths(live, "h0", "h3", all_alive)


def test_live_switch_blackhole_keeps_links_up_but_forwards_nothing(clean_after: Bed) -> None:
    live = clean_after
    live.faults.switch_blackhole("p2-t1a")
    for end in (rec.end("p2-t1a") for rec in live.state.switch_links("p2-t1a")):
        shown = subprocess.run(["ip", "-n", end.netns, "-o", "link", "show", "dev", end.ifname],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert "state UP" in shown and "LOWER_UP" in shown, shown
    check_paths(live, "h1", "h2", through_switch("p2-t1a"))
    check_paths(live, "h2", "h1", through_switch("p2-t1a"))
    live.faults.switch_restore("p2-t1a")
    check_paths(live, "h1", "h2", all_alive)


def test_live_nic_down_cuts_the_host_off_one_plane(clean_after: Bed) -> None:
    live = clean_after
    host_ns = live.state.ns("h0")
    before = tables(host_ns)
    live.faults.nic_down("h0", 3)
    check_paths(live, "h0", "h2", lambda p: p.plane == 3)
    check_paths(live, "h1", "h0", lambda p: p.plane == 3)  # same rack: via p3-t0a only
    check_paths(live, "h2", "h0", lambda p: p.plane == 3)  # the T0 keeps routing to h0
    live.faults.nic_up("h0", 3)
    assert tables(host_ns) == before
    check_paths(live, "h0", "h2", all_alive)
    check_paths(live, "h2", "h0", all_alive)  # at once: no stale neighbour entry at the T0


def _one_path(live: Bed, src: str, dst: str, *nodes: str) -> FabricPath:
    fabric = live.state.fabric
    return next(p for p in paths(fabric, int(src[1:]), int(dst[1:])) if set(nodes) <= set(p.nodes))


def test_live_link_loss_rate_is_within_bounds_one_direction_only(clean_after: Bed) -> None:
    live = clean_after
    [fault] = live.faults.loss("p0-t0a", "p0-t1c", "20%", from_node="p0-t0a")
    assert fault.params == {"rate": 0.2}
    lossy = _one_path(live, "h0", "h2", "p0-t1c")
    other = _one_path(live, "h0", "h2", "p0-t1d")
    back = _one_path(live, "h2", "h0", "p0-t1c")  # t1c -> t0a: the other direction
    got = send(
        live, "h0", "h2", [(str(lossy.address), tag(1), 5000), (str(other.address), tag(2), 500)]
    )
    received = got["counts"].get(tag(1)[:4].hex(), 0)
    assert 0.15 <= 1 - received / 5000 <= 0.25, f"lost {5000 - received} of 5000"
    assert got["counts"].get(tag(2)[:4].hex(), 0) >= 495
    got_back = send(live, "h2", "h0", [(str(back.address), tag(3), 500)])
    assert got_back["counts"].get(tag(3)[:4].hex(), 0) >= 495
    assert live.faults.clear(f"#{fault.id}") == [fault]
    with pytest.raises(FaultError, match="no loss on p0:t0a-t1c"):
        live.faults.clear_loss("p0:t0a-t1c")
    check_paths(live, "h0", "h2", all_alive)


def test_live_host_link_loss_both_directions(clean_after: Bed) -> None:
    live = clean_after
    faults = live.faults.loss("p2:h1-t0a", None, 0.5)
    assert len(faults) == 2  # one per direction, both in the T0's forward hook
    path = _one_path(live, "h1", "h3", "p2-t1b")
    up = send(live, "h1", "h3", [(str(path.address), tag(1), 2000)])["counts"]
    assert 0.4 <= 1 - up.get(tag(1)[:4].hex(), 0) / 2000 <= 0.6
    back = _one_path(live, "h3", "h1", "p2-t1b")
    down = send(live, "h3", "h1", [(str(back.address), tag(1), 2000)])["counts"]
    assert 0.4 <= 1 - down.get(tag(1)[:4].hex(), 0) / 2000 <= 0.6
    live.faults.clear_loss("p2:h1-t0a")
    check_paths(live, "h1", "h3", all_alive)


def test_live_path_loss_drops_packets_crossing_one_switch_only(clean_after: Bed) -> None:
    live = clean_after
    live.faults.loss_path("fcbb:bb00:2103::/48", 0.3)  # p1-t1d, by its locator
    through = _one_path(live, "h0", "h2", "p1-t1d")
    beside = _one_path(live, "h0", "h2", "p1-t1c")
    back = _one_path(live, "h3", "h1", "p1-t1d")
    got = send(
        live, "h0", "h2", [(str(through.address), tag(1), 3000), (str(beside.address), tag(2), 500)]
    )
    assert 0.25 <= 1 - got["counts"].get(tag(1)[:4].hex(), 0) / 3000 <= 0.35
    assert got["counts"].get(tag(2)[:4].hex(), 0) >= 495
    got_back = send(live, "h3", "h1", [(str(back.address), tag(3), 3000)])
    assert 0.25 <= 1 - got_back["counts"].get(tag(3)[:4].hex(), 0) / 3000 <= 0.35
    with pytest.raises(FaultError, match="no path loss"):
        live.faults.clear_loss(path="p1-t1c")
    live.faults.clear_loss(path="p1-t1d")
    check_paths(live, "h0", "h2", all_alive)


def _tc_stats(ns: str, ifname: str) -> list[dict[str, Any]]:
    out = subprocess.run(["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", ifname],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return list(json.loads(out))


def test_live_shape_limits_throughput_and_unshape_restores(clean_after: Bed) -> None:
    live = clean_after
    port = live.state.port("p3-t0a", "p3-t1a")
    rate_bps, queue = 10e6, 16384
    [fault] = live.faults.shape("p3:t0a-t1a", None, rate_bps, queue, from_node="p3-t0a")
    assert fault.kind == "shape"
    [qdisc] = [q for q in _tc_stats(port.netns, port.ifname) if q.get("root")]
    assert qdisc["kind"] == "tbf"
    assert (qdisc["options"]["rate"], qdisc["options"]["limit"]) == (rate_bps / 8, queue)
    burst = qdisc["options"]["burst"]
    path = _one_path(live, "h0", "h2", "p3-t1a")
    payload = tag(1) + bytes(936)
    blast = send(live, "h0", "h2", [(str(path.address), payload, 2000)], pause=0.0005)
    received = blast["counts"].get(tag(1)[:4].hex(), 0)
    # A token bucket passes at most burst + rate x time, counted in Ethernet frames; the
    # window (first send to last read) can only be longer than the real one: no flake.
    window = blast["last_read"] - blast["started"]
    frames = received * (L2_L4 + len(payload))
    assert frames <= rate_bps / 8 * window * 1.5 + burst, (received, window)
    assert 0 < received < 2000
    [qdisc] = [q for q in _tc_stats(port.netns, port.ifname) if q.get("root")]
    assert qdisc["drops"] > 0 and qdisc["drops"] + received <= 2000
    live.faults.link_down("p3:t0a-t1a")  # a flap keeps the shaping (qdiscs outlive down)
    live.faults.link_up("p3:t0a-t1a")
    assert [q["kind"] for q in _tc_stats(port.netns, port.ifname) if q.get("root")] == ["tbf"]
    live.faults.unshape("p3:t0a-t1a")
    assert not [q for q in _tc_stats(port.netns, port.ifname) if q.get("kind") == "tbf"]
    again = send(live, "h0", "h2", [(str(path.address), payload, 2000)])
    assert again["counts"].get(tag(1)[:4].hex(), 0) >= 1980


@pytest.mark.requires_kernel("tc_bpf")
def test_live_trim_wraps_the_trim_program(clean_after: Bed) -> None:
    live = clean_after
    faults = live.faults.trim("p0:h2-t0b", None, threshold_bytes=1 << 20,
                              ecn_threshold_bytes=None, rate_bps=1e9, probability=1.0)  # fmt: skip
    assert [f.params["last_hop"] for f in faults] == [True]  # the host's own port never trims
    port = live.state.port("p0-t0b", "h2")
    assert trim.attached(port.netns, port.ifname)
    with pytest.raises(FaultError, match="is taken by"):
        live.faults.shape("p0:h2-t0b", None, 1e6, from_node="p0-t0b")  # one qdisc per port
    packet = encode(DataPacket(qpn=7, psn=1, va=0, rkey=1, payload=bytes(1000), ev=0, port=0,
                               tx_seq=1, ts_ns=1), CrcIntegrity())  # fmt: skip
    path = _one_path(live, "h0", "h2", "p0-t1a")
    got = send(live, "h0", "h2", [(str(path.address), packet, 20)], port=4791, tclass=TCLASS_DATA)
    raw = got["raw"]
    assert len(raw) == 20
    assert all(len(d) == trimmed_length(packet[0]) for d in raw)
    assert all(d == encode_trimmed(packet, True) for d in raw)
    assert trim.counters(port.netns, port.ifname)["trimmed"] >= 20
    live.faults.untrim("p0:h2-t0b")
    assert not trim.attached(port.netns, port.ifname)
    check_paths(live, "h0", "h2", all_alive)


TRIM_RATE_BPS = 1_000_000  # a burst of a hundred packets is far over it on any machine
TRIM_THRESHOLD, ECN_THRESHOLD = 48_000, 16_000  # bytes of queue (Ethernet frames)


@pytest.mark.requires_kernel("tc_bpf")
@pytest.mark.parametrize(("switch", "peer"), [("p0-t1a", "p0-t0b"), ("p0-t0b", "h2")])
def test_live_trim_in_congestion_marks_as_documented(
    clean_after: Bed, switch: str, peer: str
) -> None:
    """A burst of 120 core-encoded writes (1 KiB, every third with an immediate), in the data
    class (DSCP 4) and ECT(0), from h0 to h2 along the uSID path through p0-t1a, into a
    trimmed 1 Mbit/s port: the T1's port toward the T0, or the T0's last-hop port toward h2.

    The program's queue starts empty and packet i (in send order) finds at most i frames
    in it, so: every packet whose frame and all before it fit under the trim threshold
    arrives whole; CE only on a packet that had more than the ECN threshold before it; the
    burst is far over the rate, so the port does trim and (not last hop) mark."""
    live, last_hop = clean_after, peer == "h2"
    path = _one_path(live, "h0", "h2", "p0-t1a")
    send(live, "h0", "h2", [(str(path.address), tag(9), 5)])  # neighbours resolved first
    [fault] = live.faults.trim(switch, peer, threshold_bytes=TRIM_THRESHOLD,
                               ecn_threshold_bytes=ECN_THRESHOLD, rate_bps=TRIM_RATE_BPS,
                               from_node=switch)  # fmt: skip
    assert fault.params["last_hop"] is last_hop
    assert fault.params["queue_bytes"] == live.state.fabric.queue_bytes  # the default
    sent = data_packets(120, 1024)
    by_psn = {psn_of(d): d for d in sent}
    wire = L2_L4 + max(len(d) for d in sent)
    jobs = [(str(path.address), d, 1) for d in sent]
    got = send(live, "h0", "h2", jobs, pause=0.0, port=DEFAULT_PORT, tclass=TCLASS_DATA)
    port = live.state.port(switch, peer)
    stats = trim.counters(port.netns, port.ifname)
    live.faults.untrim(switch, peer)

    arrived = list(zip(got["raw"], got["tclass"], strict=True))
    assert sorted(psn_of(d) for d, _ in arrived) == sorted(by_psn)  # trimmed, never dropped
    trimmed = [d for d, _ in arrived if len(d) < 100]
    whole = [d for d, _ in arrived if len(d) >= 100]
    assert trimmed, "a burst far over the port rate was not trimmed"
    for d in trimmed:  # docs/trimming.md: UDP payload 8 + 64 (68 with ImmDt), flags set
        assert len(d) == (DATA_IMM_HDR_LEN if d[0] in IMM_OPCODES
                          else DATA_HDR_LEN) == trimmed_length(d[0])  # fmt: skip
        check_trimmed(d, by_psn[psn_of(d)], last_hop)  # TRIMMED, TRIM_LASTHOP iff last hop
    for d in whole:
        assert d == by_psn[psn_of(d)]
    # Trimmed headers are remarked to the trimmed class; whole packets keep the data class.
    assert {tc >> 2 for d, tc in arrived if len(d) < 100 and tc is not None} == {Dscp.TRIMMED}
    assert {tc >> 2 for d, tc in arrived if len(d) >= 100 and tc is not None} == {Dscp.DATA}
    assert stats["class_data"] >= len(arrived)
    under = {psn for psn in by_psn if (psn + 1) * wire <= TRIM_THRESHOLD}
    assert under and under <= {psn_of(d) for d in whole}  # nothing trimmed under threshold
    assert all(tc is not None and tc & ECN_MASK in (ECT0, CE) for _, tc in arrived)
    marked = {psn_of(d) for d, tc in arrived if tc is not None and tc & ECN_MASK == CE}
    assert stats["ecn_marked"] == len(marked) and stats["trimmed"] == len(trimmed)
    if last_hop:
        assert not marked  # never on a port facing a host, however long the queue
    else:
        assert marked, "the queue went over the ECN threshold but nothing was marked"
        assert min(marked) * wire > ECN_THRESHOLD  # only above the threshold
        assert not marked & {psn_of(d) for d in trimmed}  # a trimmed packet is not marked
    assert not trim.attached(port.netns, port.ifname)
    check_paths(live, "h0", "h2", all_alive)


#: p0:t0a-t1b down from 0.2 s to 0.6 s, named by its two ends.
FLAP = """
[[step]]
at = "0.2s"
action = "link_down"
a = "p0-t0a"
b = "p0-t1b"
until = "0.6s"
"""


def test_live_scenario_replays_a_flap_and_logs_both_steps(clean_after: Bed) -> None:
    live = clean_after
    before = tables(live.state.ns("p0-t0a"))
    scenario = parse_scenario(FLAP, live.state.fabric)
    lines: list[str] = []
    down_seen: list[bool] = []

    def watch() -> None:  # the link is down at some point between the two steps
        while not lines:
            time.sleep(0.01)
        argv = ["ip", "-n", live.state.ns("p0-t0a"), "-o", "link", "show", "dev", "t1b"]
        shown = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        down_seen.append("state DOWN" in shown)

    watcher = threading.Thread(target=watch)
    watcher.start()
    log = run_scenario(scenario, live.faults, log=lines.append)
    watcher.join()
    assert [(e.step, e.planned) for e in log] == [(1, 0.2), (1, 0.6)]
    assert "link_down" in log[0].text and "link_up" in log[1].text
    assert log[0].actual >= 0.2 and log[1].actual >= 0.6 and log[0].wall <= log[1].wall
    assert down_seen == [True]
    assert not live.faults.active()
    assert tables(live.state.ns("p0-t0a")) == before
    check_paths(live, "h0", "h2", all_alive)


def test_live_records_let_another_process_restore_everything(
    clean_after: Bed, capsys: pytest.CaptureFixture[str]
) -> None:
    live = clean_after
    assert fault_cli.main(["link", "down", "p3-t1d", "p3-t0b", "--name", live.name]) == 0
    assert "link_down p3:t0b-t1d" in capsys.readouterr().out
    live.faults.switch_blackhole("p2-t1c")
    live.faults.loss("p1:h3-t0b", None, 0.1)
    listed = subprocess.run(
        [sys.executable, "-m", "mrcstack.netns.faults.cli", "--name", live.name, "list", "--json"],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    assert sorted(f["kind"] for f in json.loads(listed.stdout)) == [
        "blackhole", "link_down", "loss", "loss"
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "mrcstack.netns.faults.cli", "--name", live.name, "restore-all"],
        capture_output=True, text=True, cwd=REPO, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("restore #") == 4  # each undo logged with its timestamp
    # What an undo prints says the fault is gone; `list` shows only active ones.
    assert done.stdout.count("restored #") == 4 and "(was active since " in done.stdout
    assert fault_cli.main(["link", "down", "p0:t0a-t1b", "--name", live.name]) == 0
    assert "(since " in capsys.readouterr().out
    assert fault_cli.main(["link", "up", "p0:t0a-t1b", "--name", live.name]) == 0
    assert re.match(
        r"restored #\d+ link_down p0:t0a-t1b  \(was active since ", capsys.readouterr().out
    )
    assert fault_cli.main(["list", "--name", live.name]) == 0
    assert capsys.readouterr().out.strip() == "no active faults"
    assert not live.faults.active()
    check_paths(live, "h0", "h3", all_alive)
    check_paths(live, "h3", "h0", all_alive)
    assert "restore #" in live.faults.log_path.read_text()
