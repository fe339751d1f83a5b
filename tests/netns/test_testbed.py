"""The namespace testbed on the real kernel (root): forwarding, capture, crash recovery.

One default testbed (``ta...``: 4 planes, 2 racks x 2 hosts, 4 T1) is built for the module
and removed in ``finally``; the crash and coexistence tests build their own small ones
(``tak...``, ``tb...``, ``t1...``, ``t2...``).  Each name ends in random characters drawn
per run (concurrent runs never share a testbed), and every test removes what it built by
exact name.
Sockets are created inside host namespaces from this process (mrcstack.netns.traffic.netns_socket),
so sending and receiving costs no ``ip netns exec`` process at all.
"""

from __future__ import annotations

import errno
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from ipaddress import IPv6Address
from pathlib import Path

import pytest

from mrcstack.addrplan import Path as FabricPath
from mrcstack.addrplan import (
    ev_value,
    nic_sid,
    path,
    paths,
    switch_locator,
    switch_usid,
    usid_shift,
)
from mrcstack.fabric import Fabric
from mrcstack.netns import testbed
from mrcstack.netns.run import call_in_netns, ip, ip_batch, run
from mrcstack.netns.state import (
    TestbedState,
    exists,
    load,
)
from mrcstack.netns.traffic import (
    DEFAULT_PORT,
    netns_socket,
    ping,
    receive,
    send,
    udp_receiver,
    udp_sender,
)
from mrcstack.wire import CrcIntegrity, DataFlags, DataPacket, encode
from tests.support import REPO, dissector
from tests.support.isolation import run_name
from tests.support.testbeds import Testbeds, leftovers

ROOT = REPO
PORT = 40000
GROUP = 6  # paths checked together: path i of a group sends 2**i packets (at most 63)
WAIT_S = 5.0


@pytest.fixture(scope="module")
def bed(testbeds: Testbeds) -> TestbedState:
    return testbeds.up("ta", Fabric()).state


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mrcstack", "testbed", *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False,
    )  # fmt: skip


def sid_counters(bed: TestbedState) -> dict[str, int]:
    """Packets counted by every switch's uN route, read by ONE ``sh -c`` loop process."""
    block = f"{bed.fabric.locator_block}/32"
    script = f'for ns in "$@"; do ip -n "$ns" -6 -j -s route show root {block}; done'
    out = run(["sh", "-c", script, "sh", *(bed.ns(s) for s in bed.switches)]).stdout
    tables = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(tables) == len(bed.switches), out
    counters = {}
    for switch, table in zip(bed.switches, tables, strict=True):
        sid = str(switch_locator(bed.fabric, switch_usid(switch)))
        counters[switch] = next(r for r in table if r["dst"] == sid)["stats64"]["packets"]
    return counters


def _drain(
    receivers: dict[int, socket.socket], expect: dict[int, dict[int, tuple[str, int]]]
) -> dict[int, dict[int, int]]:
    """Receive until every host got what ``expect`` says: host -> stream -> (destination
    address, count).  A datagram at the wrong destination address fails at once."""
    got: dict[int, dict[int, int]] = {h: {} for h in receivers}
    want = sum(n for streams in expect.values() for _, n in streams.values())
    deadline = time.monotonic() + WAIT_S
    total = 0
    while total < want and time.monotonic() < deadline:
        ready, _, _ = select.select(list(receivers.values()), [], [], 0.2)
        for sock in ready:
            host = next(h for h, s in receivers.items() if s is sock)
            while (dgram := receive(sock, 0)) is not None:
                stream = int.from_bytes(dgram.data[4:8], "big")
                where, _ = expect[host].get(stream, ("?", 0))
                assert dgram.destination == where, (host, stream, dgram)
                got[host][stream] = got[host].get(stream, 0) + 1
                total += 1
    return got


def test_every_path_crosses_exactly_its_switches(bed: TestbedState) -> None:
    """For every ordered host pair and every path `paths` lists (both directions, 144 on
    the default fabric), a UDP datagram sent to the path's uSID address arrives at the
    destination host, at its NIC SID of that plane, and crosses exactly the path's switches.

    Method: paths are checked in groups of GROUP=6; the i-th path of a group sends 2**i
    datagrams (stream id = its index).  All uN counters (`count` on each seg6local route) are
    read before and after a group by one `sh -c` loop.  A switch's counter delta is then a
    sum of distinct powers of two, and bit i is set exactly when path i crossed that switch,
    so every path's switch set is recovered exactly: equal to the switches the path names,
    and no other switch counted anything (the deltas are asserted equal to the expected
    sums).  Receivers (one per host, bound to ::) check per-stream counts and that every
    datagram arrived at the destination NIC SID, i.e. after the last shift."""
    fabric = bed.fabric
    every = [
        (src, dst, p)
        for src in range(fabric.hosts)
        for dst in range(fabric.hosts)
        if src != dst
        for p in paths(fabric, src, dst)
    ]
    assert len(every) == 144
    receivers = {h: udp_receiver(bed.ns(f"h{h}"), PORT) for h in range(fabric.hosts)}
    senders = {h: udp_sender(bed.ns(f"h{h}")) for h in range(fabric.hosts)}
    try:
        before = sid_counters(bed)
        for start in range(0, len(every), GROUP):
            group = every[start : start + GROUP]
            expect: dict[int, dict[int, tuple[str, int]]] = {h: {} for h in receivers}
            for bit, (src, dst, p) in enumerate(group):
                sent = send(senders[src], str(p.address), PORT, 1 << bit, stream=start + bit)
                assert sent == 1 << bit
                expect[dst][start + bit] = (str(nic_sid(fabric, p.plane, dst)), 1 << bit)
            got = _drain(receivers, expect)
            after = sid_counters(bed)
            delta = {s: after[s] - before[s] for s in after}
            before = after
            for bit, (_, dst, p) in enumerate(group):
                crossed = {s for s, n in delta.items() if n >> bit & 1}
                assert crossed == set(p.nodes[1:-1]), (p.address, p.nodes, delta)
                assert got[dst].get(start + bit) == 1 << bit, (p.address, got[dst])
            for switch, n in delta.items():
                assert n == sum(1 << b for b, (_, _, p) in enumerate(group) if switch in p.nodes)
    finally:
        for sock in (*receivers.values(), *senders.values()):
            sock.close()


def _one_datagram(bed: TestbedState, src: str, dst: str, address: str) -> str:
    """Send one datagram from host src to ``address``; the address it arrived at in dst."""
    with udp_receiver(bed.ns(dst), PORT) as rx, udp_sender(bed.ns(src)) as tx:
        send(tx, address, PORT, 1)
        dgram = receive(rx, WAIT_S)
    assert dgram is not None, f"nothing from {src} to {address} arrived at {dst}"
    return dgram.destination


def test_kernel_shift_equals_usid_shift(bed: TestbedState) -> None:
    """One uN switch (p0-t0a) shifts a destination with arbitrary trailing uSIDs; the address
    the receiver sees (IPV6_PKTINFO) is addrplan.usid_shift of the original.  Then the
    docs/linux.md vector itself (/32 block 1111:2222): temporary routes send
    1111:2222:aaaa:bbbb:cccc:dddd:eeee:ffff through p0-t0a acting as uN aaaa to h1."""
    sent = IPv6Address("fcbb:bb00:1000:8001:aaaa:bbbb:cccc:dddd")
    arrived = _one_datagram(bed, "h0", "h1", str(sent))
    assert (
        IPv6Address(arrived)
        == usid_shift(sent)
        == IPv6Address("fcbb:bb00:8001:aaaa:bbbb:cccc:dddd:0")
    )

    vector = IPv6Address("1111:2222:aaaa:bbbb:cccc:dddd:eeee:ffff")
    end = "encap seg6local action End flavors next-csid lblen 32 nflen 16 count dev sid"
    extra = {
        bed.ns("h0"): ["route add 1111:2222:aaaa::/48 via fe80::2 dev nic0"],
        bed.ns("p0-t0a"): [
            f"route add 1111:2222:aaaa::/48 {end}",
            "route add 1111:2222:bbbb::/48 via fe80::1 dev h1",
        ],
        bed.ns("h1"): ["route add local 1111:2222:bbbb::/48 dev lo"],
    }
    try:
        for ns, lines in extra.items():
            ip_batch(lines, ns, options=("-6",))
        arrived = _one_datagram(bed, "h0", "h1", str(vector))
    finally:
        for ns, lines in extra.items():
            dels = [line.replace("route add", "route del", 1) for line in lines]
            ip_batch(dels, ns, options=("-6",), force=True)
    assert IPv6Address(arrived) == usid_shift(vector)
    assert arrived == "1111:2222:bbbb:cccc:dddd:eeee:ffff:0"


@pytest.mark.requires_program("tshark")
def test_capture_on_a_switch_port_decodes_srv6_and_mrc(bed: TestbedState) -> None:
    """tshark on p0-t1c's port towards p0-t0b captures a core-encoded RDMA write sent by h0
    to h3 over the path through p0-t1c: the IPv6 destination is the uSID address after two
    shifts (T0a, T1c), and mrcstack's Lua dissector prints every field mrcstack.wire.encode
    wrote."""
    tshark = shutil.which("tshark")
    assert tshark is not None
    p: FabricPath = path(bed.fabric, 0, 3, 0, ev_value(0, 2))
    assert p.nodes[2] == "p0-t1c"
    hop_destination = usid_shift(usid_shift(p.address))
    port = bed.port("p0-t1c", "p0-t0b")
    pkt = DataPacket(
        qpn=0x123456, psn=0x00ABCD, va=0x1122334455667788, rkey=0xCAFEBABE,
        payload=bytes(range(256)), ev=p.ev, port=0, tx_seq=1, ts_ns=42 << 10,
        flags=DataFlags.FIRST | DataFlags.LAST,
    )  # fmt: skip
    datagram = encode(pkt, CrcIntegrity())
    pcap = Path(tempfile.mkdtemp(prefix="mrc-capture-")) / "switch.pcap"
    cmd = ["ip", "netns", "exec", port.netns, tshark, "-n", "-i", port.ifname, "-c", "1"]
    cmd += ["-a", "duration:60", "-f", f"udp dst port {DEFAULT_PORT}", "-w", str(pcap)]
    capture = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with udp_sender(bed.ns("h0")) as tx:
            deadline = time.monotonic() + 60
            while capture.poll() is None and time.monotonic() < deadline:
                tx.sendto(datagram, (str(p.address), DEFAULT_PORT))  # until tshark has one
                time.sleep(0.2)
        _, err = capture.communicate(timeout=10)
        rows = dissector.dissect(pcap)
        dst = subprocess.run(
            [tshark, "-n", "-r", str(pcap), "-T", "fields", "-e", "ipv6.dst"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.split()  # fmt: skip
    finally:
        if capture.poll() is None:
            capture.kill()
            capture.wait()
        shutil.rmtree(pcap.parent, ignore_errors=True)
    assert rows, err
    assert IPv6Address(dst[0]) == hop_destination == IPv6Address("fcbb:bb00:1001:8003::")
    assert bytes.fromhex(rows[0]["udp.payload"]) == datagram
    assert dissector.mismatches(rows[0], dissector.expected(pkt, datagram)) == []


def _proc_net(netns: str, name: str) -> str:
    """``/proc/net/<name>`` as seen inside ``netns`` (read from a thread that joins it)."""

    def read() -> str:
        with open(f"/proc/thread-self/net/{name}", encoding="ascii") as handle:
            return handle.read()

    return call_in_netns(netns, read)


def _tx_packets(netns: str, ifname: str) -> int:
    for line in _proc_net(netns, "dev").splitlines()[2:]:
        name, _, numbers = line.partition(":")
        if name.strip() == ifname:
            return int(numbers.split()[9])
    raise AssertionError(f"{netns} has no {ifname}")


def _snmp6(netns: str) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in _proc_net(netns, "snmp6").splitlines())}


def test_mtu_9000_frames_cross_a_path_unfragmented(bed: TestbedState) -> None:
    """An 8,900-byte UDP payload (an 8,948-byte IPv6 packet) sent with IPV6_DONTFRAG along
    a cross-rack uSID path arrives whole, and neither end fragmented or reassembled
    anything; one byte over the 9000 MTU is refused at the sender (EMSGSIZE)."""
    p = path(bed.fabric, 0, 2, 1, ev_value(1, 3))
    payload = bytes(range(256)) * 34 + bytes(196)
    before = {h: _snmp6(bed.ns(h)) for h in ("h0", "h2")}
    with udp_receiver(bed.ns("h2"), PORT) as rx, udp_sender(bed.ns("h0")) as tx:
        tx.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_DONTFRAG, 1)
        tx.sendto(payload, (str(p.address), PORT))
        dgram = receive(rx, WAIT_S)
        with pytest.raises(OSError) as info:  # 9000 - 40 (IPv6) - 8 (UDP) + 1
            tx.sendto(bytes(bed.fabric.mtu - 48 + 1), (str(p.address), PORT))
        assert info.value.errno == errno.EMSGSIZE
    assert dgram is not None and len(payload) == 8900 and dgram.data == payload
    after = {h: _snmp6(bed.ns(h)) for h in ("h0", "h2")}
    assert after["h0"]["Ip6FragCreates"] == before["h0"]["Ip6FragCreates"]
    assert after["h2"]["Ip6ReasmReqds"] == before["h2"]["Ip6ReasmReqds"]
    assert after["h2"]["Udp6InDatagrams"] > before["h2"]["Udp6InDatagrams"]


def test_plain_ipv6_tcp_over_every_plane(bed: TestbedState) -> None:
    """Kernel TCP between the baseline addresses of h0 and h3 (different racks) works on
    every plane, and leaves h0 through that plane's NIC."""
    payload = bytes(range(256)) * 64
    for plane in range(bed.fabric.planes):
        src, dst = bed.baseline["h0"][plane], bed.baseline["h3"][plane]
        before = _tx_packets(bed.ns("h0"), f"nic{plane}")
        server = netns_socket(bed.ns("h3"), socket.AF_INET6, socket.SOCK_STREAM)
        client = netns_socket(bed.ns("h0"), socket.AF_INET6, socket.SOCK_STREAM)
        with server, client:
            server.bind((dst, PORT))
            server.listen(1)
            client.settimeout(WAIT_S)
            client.bind((src, 0))
            client.connect((dst, PORT))
            conn, peer = server.accept()
            with conn:
                conn.settimeout(WAIT_S)
                client.sendall(payload)
                client.shutdown(socket.SHUT_WR)
                received = b""
                while chunk := conn.recv(65536):
                    received += chunk
            assert received == payload and peer[0] == src
        assert _tx_packets(bed.ns("h0"), f"nic{plane}") - before >= 3


def test_management_network_reaches_every_host_from_root(bed: TestbedState) -> None:
    assert bed.mgmt and bed.bridge == f"{bed.name}-br"
    for host, address in bed.mgmt.items():
        assert ping(address, timeout=WAIT_S) is not None, f"no echo reply from {host} {address}"
    # Management traffic between hosts stays on the management network, off the fabric.
    route = ip("-6", "route", "get", bed.mgmt["h3"], netns=bed.ns("h0"))
    assert " dev mgmt " in route, route


def test_status_reports_links_and_sids(bed: TestbedState) -> None:
    result = _cli("status", "--name", bed.name, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["healthy"] and data["complete"]
    assert data["namespaces"] == {"expected": 28, "present": 28, "missing": []}
    assert len(data["links"]) == 48 and {link["state"] for link in data["links"]} == {"up"}
    assert all(sid["next_csid"] for sid in data["sids"].values())
    assert len(data["sids"]) == 24


def test_exec_runs_in_the_host_and_passes_the_exit_code(bed: TestbedState) -> None:
    result = _cli(
        "exec", "h2", "--name", bed.name, "--", "sh", "-c", "ip -br link show nic3; exit 7"
    )
    assert result.returncode == 7
    assert result.stdout.startswith("nic3")


def test_exec_json_captures_a_switch_commands_output_and_status(bed: TestbedState) -> None:
    script = ["sh", "-c", "ip -br link show t0b; echo oops >&2; exit 7"]
    result = _cli("exec", "p0-t1a", "--name", bed.name, "--json", "--", *script)
    assert result.returncode == 7 and result.stderr == ""
    data = json.loads(result.stdout)
    assert data.keys() == {"name", "node", "netns", "argv", "returncode", "stdout", "stderr"}
    assert (data["name"], data["node"], data["netns"]) == (bed.name, "p0-t1a", f"{bed.name}-p0-t1a")
    assert (data["argv"], data["returncode"], data["stderr"]) == (script, 7, "oops\n")
    assert data["stdout"].startswith("t0b@")  # the switch's port toward p0-t0b


def test_shape_port_and_unshape_port(bed: TestbedState) -> None:
    port = bed.port("p3-t1d", "p3-t0a")
    testbed.shape_port(port.netns, port.ifname, 100e6, 100_000)
    shown = json.loads(
        run(["tc", "-n", port.netns, "-j", "qdisc", "show", "dev", port.ifname]).stdout
    )
    assert shown[0]["kind"] == "tbf" and shown[0]["options"]["rate"] == 100e6 / 8
    testbed.unshape_port(port.netns, port.ifname)
    testbed.unshape_port(port.netns, port.ifname)  # idempotent
    shown = json.loads(
        run(["tc", "-n", port.netns, "-j", "qdisc", "show", "dev", port.ifname]).stdout
    )
    assert all(q["kind"] != "tbf" for q in shown)


def test_bad_arguments_fail_with_one_line(bed: TestbedState) -> None:
    for args, code, text in (
        (("up", "--planes", "0", "--name", "tax"), 2, "fabric.planes: must be in 1..16, got 0"),
        (("paths", "h0", "h99", "--name", bed.name), 2, "host 99 out of range 0..3"),
        (("down", "--name", "tanone"), 1, "no testbed named 'tanone'"),
        (("exec", "h9", "--name", bed.name, "--", "true"), 1, "has no node 'h9'"),
    ):
        result = _cli(*args)
        assert result.returncode == code, (args, result.stderr)
        assert text in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not exists("tax") and not leftovers("tax")


# Crash recovery and coexistence --------------------------------------------------------------
def _steps_done(name: str) -> list[str]:
    """The build steps (testbed.STEPS) whose effects show in testbed ``name``, judged on
    switch p0-t0a of a shaped fabric: the state file, the namespace, its uN route, a sysctl
    of its port h0, the tbf on that port."""
    if not exists(name):
        return []
    ns = f"{name}-p0-t0a"
    if ns not in leftovers(name):
        return ["recorded"]
    if "next-csid" not in ip("-6", "route", "show", "fcbb:bb00:1000::/48", netns=ns):
        return ["recorded", "root"]

    def seg6_enabled() -> str:
        with open("/proc/sys/net/ipv6/conf/h0/seg6_enabled", encoding="ascii") as handle:
            return handle.read().strip()

    if call_in_netns(ns, seg6_enabled) != "1":
        return ["recorded", "root", "config"]
    if "tbf" not in run(["tc", "-n", ns, "qdisc", "show", "dev", "h0"]).stdout:
        return ["recorded", "root", "config", "sysctl"]
    return list(testbed.STEPS)


@pytest.mark.parametrize("step", testbed.STEPS)
@pytest.mark.requires_kernel("netns")
def test_sigkill_while_paused_after_a_build_step_then_clean(step: str) -> None:
    """`up` of a shaped fabric stopped by the test hook right after ``step`` (so exactly
    the steps up to it are done, whatever the machine's speed), killed with SIGKILL, then
    `clean` removes everything."""
    name = run_name("tak")
    testbed.clean(name)
    env = os.environ | {testbed.PAUSE_ENV: step}
    build = subprocess.Popen(
        [sys.executable, "-m", "mrcstack", "testbed", "up", "--name", name, "--planes", "1",
         "--rate", "1gbit"],
        stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        assert build.stderr is not None
        ready, _, _ = select.select([build.stderr], [], [], 60)
        assert ready and f"paused after step {step}" in build.stderr.readline()
        steps = list(testbed.STEPS)
        assert _steps_done(name) == steps[: steps.index(step) + 1]
        os.kill(build.pid, signal.SIGKILL)
        build.wait(timeout=10)
        assert not load(name).complete  # the state file was written before anything
        result = _cli("clean", "--name", name)
        assert result.returncode == 0, result.stderr
        assert leftovers(name) == [] and not exists(name)
        again = _cli("clean", "--name", name)  # idempotent
        assert again.returncode == 0 and "nothing recorded" in again.stdout
    finally:
        if build.poll() is None:
            build.kill()
            build.wait()
        testbed.clean(name)


@pytest.mark.requires_kernel("netns")
def test_sigkill_at_an_arbitrary_moment_of_a_large_build_then_clean() -> None:
    """The large fabric (176 namespaces, 640 links, about 1.5 s to build here) killed
    0.1 s after its state file appeared: whatever it was doing then (its `ip`/`tc`
    children die with it: setpriv --pdeathsig), `clean` removes everything.  Nothing here
    depends on where the kill lands: a machine fast enough to finish first gets a
    complete testbed, which `clean` must remove just the same (the paused test above pins
    each step deterministically)."""
    name = run_name("tb")
    testbed.clean(name)
    build = subprocess.Popen(
        [sys.executable, "-m", "mrcstack", "testbed", "up", "--name", name,
         "--config", str(ROOT / "examples" / "fabric-large.toml")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not exists(name) and build.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert exists(name), "up never wrote its state file"
        time.sleep(0.1)
        os.kill(build.pid, signal.SIGKILL)
        build.wait(timeout=10)
        result = _cli("clean", "--name", name)
        assert result.returncode == 0, result.stderr
        assert leftovers(name) == [] and not exists(name)
    finally:
        if build.poll() is None:
            build.kill()
            build.wait()
        testbed.clean(name)


@pytest.mark.requires_kernel("netns")
def test_two_named_testbeds_do_not_interfere() -> None:
    """Two small testbeds (one shaped) at once: a path works in each; `down` of one leaves
    the other intact and forwarding."""
    small = Fabric(planes=1, racks=2, hosts_per_rack=1, t1_per_plane=1)
    shaped = Fabric(
        planes=1, racks=2, hosts_per_rack=1, t1_per_plane=1, host_link_bps=200e6,
        fabric_link_bps=200e6, queue_bytes=65536,
    )  # fmt: skip
    names = (run_name("t1"), run_name("t2"))
    for name in names:
        testbed.clean(name)
    try:
        testbed.up(small, names[0])
        testbed.up(shaped, names[1])
        one, two = load(names[0]), load(names[1])
        assert one.mgmt["h0"] != two.mgmt["h0"]
        address = str(path(small, 0, 1, 0, ev_value(0, 0)).address)
        for bed in (one, two):
            assert _one_datagram(bed, "h0", "h1", address) == str(nic_sid(small, 0, 1))
            assert ping(bed.mgmt["h1"], timeout=WAIT_S) is not None
        shaped_ends = [
            link[end] for link in testbed.status(names[1])["links"] for end in ("a", "b")
        ]
        assert all(end["qdisc"]["kind"] == "tbf" for end in shaped_ends)
        testbed.down(names[0])
        assert leftovers(names[0]) == [] and not exists(names[0])
        assert testbed.status(names[1])["healthy"]
        assert _one_datagram(two, "h1", "h0", str(path(small, 1, 0, 0, 0).address))
        assert ping(two.mgmt["h0"], timeout=WAIT_S) is not None
    finally:
        for name in names:
            testbed.clean(name)
    assert leftovers(names[1]) == []
