"""The trim/ECN tc BPF program on a real kernel: three namespaces, one shaped switch port.

::

    tB-src [sw] fd00:b1::1 ---- fd00:b1::2 [src] tB-sw [dst] fd00:b2::1 ---- fd00:b2::2 [sw] tB-dst
                                                      ^ htb + trim.c (clsact egress)

Plain IPv6 static routes (the program does not care about the path in the destination
address); MTU 9000; UDP to port 4791 with zero checksums, as the MRC daemons send.  Every
assertion on markings follows from the program's rule, not from timing: the virtual queue
starts empty, so the first packets of a burst whose bytes sum below a threshold can never be
over it, and a burst far above the rate must push it over.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import select
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from mrcstack.netns import trim
from mrcstack.wire import (
    DataFlags,
    Dscp,
    Opcode,
    decode,
    traffic_class,
    trimmed_length,
)
from tests.support.trimming import (
    CE,
    CRC,
    ECN_MASK,
    ECT0,
    L2_L4,
    check_trimmed,
    data_packets,
    psn_of,
)

SRC, SW, DST = "tB-src", "tB-sw", "tB-dst"
SRC_ADDR, DST_ADDR = "fd00:b1::1", "fd00:b2::2"
PORT = 4791
OTHER_PORT = 4792  # non-MRC UDP
PORT_IF = "dst"  # the switch's port toward tB-dst, where the program runs
RATE_BPS = 20_000_000
MTU = 9000
DATA_CLASS = traffic_class(Dscp.DATA, ecn=0)  # the trimmable class, not ECN-capable
UDP_NO_CHECK6_TX, UDP_NO_CHECK6_RX = 101, 102
CLONE_NEWNET = 0x40000000


_libc = ctypes.CDLL(None, use_errno=True)


# --- plumbing ----------------------------------------------------------------------------


def sh(*argv: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")
    return proc.stdout


@contextmanager
def inside(netns: str) -> Iterator[None]:
    """Run the body in ``netns`` (sockets created there stay there after we leave)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {netns}")
        yield
    finally:
        _libc.setns(own, CLONE_NEWNET)
        os.close(own)
        os.close(target)


def delete_namespaces() -> None:
    existing = set(sh("ip", "netns", "list").split())
    for ns in (SRC, SW, DST):
        if ns in existing:
            sh("ip", "netns", "del", ns)


@pytest.fixture(scope="module")
def net() -> Iterator[None]:
    delete_namespaces()  # a crashed earlier run, by exact name
    try:
        for ns in (SRC, SW, DST):
            sh("ip", "netns", "add", ns)
        sh(
            "ip",
            "link",
            "add",
            "name",
            "sw",
            "netns",
            SRC,
            "mtu",
            str(MTU),
            "type",
            "veth",
            "peer",
            "name",
            "src",
            "netns",
            SW,
            "mtu",
            str(MTU),
        )
        sh(
            "ip",
            "link",
            "add",
            "name",
            "dst",
            "netns",
            SW,
            "mtu",
            str(MTU),
            "type",
            "veth",
            "peer",
            "name",
            "sw",
            "netns",
            DST,
            "mtu",
            str(MTU),
        )
        for ns, dev, addr in (
            (SRC, "sw", "fd00:b1::1/64"),
            (SW, "src", "fd00:b1::2/64"),
            (SW, "dst", "fd00:b2::1/64"),
            (DST, "sw", "fd00:b2::2/64"),
        ):
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev, "nodad")
            sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "netns", "exec", SW, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
        sh("ip", "-n", SRC, "-6", "route", "add", "default", "via", "fd00:b1::2", "dev", "sw")
        sh("ip", "-n", DST, "-6", "route", "add", "default", "via", "fd00:b2::1", "dev", "sw")
        yield
    finally:
        delete_namespaces()


@dataclass
class Flow:
    tx: socket.socket
    rx: socket.socket
    port: int

    def send(self, datagrams: list[bytes], gap_s: float = 0.0) -> None:
        for d in datagrams:
            self.tx.sendto(d, (DST_ADDR, self.port))
            if gap_s:
                time.sleep(gap_s)

    def receive(self, idle_s: float = 1.0) -> list[tuple[bytes, int]]:
        """Every datagram until none came for ``idle_s``: (payload, IPv6 traffic class)."""
        got: list[tuple[bytes, int]] = []
        while select.select([self.rx], [], [], idle_s)[0]:
            while True:
                try:
                    data, anc, _, _ = self.rx.recvmsg(65536, socket.CMSG_SPACE(4))
                except BlockingIOError:
                    break
                tclass = -1
                for level, kind, value in anc:
                    if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_TCLASS:
                        tclass = int.from_bytes(value[:4], "little")
                got.append((data, tclass))
        return got


@contextmanager
def flow(tclass: int = DATA_CLASS, port: int = PORT) -> Iterator[Flow]:
    with inside(SRC):
        tx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    with inside(DST):
        rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        tx.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_TX, 1)
        tx.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tclass)
        tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        rx.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)
        rx.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVTCLASS, 1)
        rx.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE: we are root
        rx.bind((DST_ADDR, port))
        rx.setblocking(False)
        f = Flow(tx, rx, port)
        for _ in range(25):  # neighbour discovery may eat the first packets of a new link
            f.send([b"warm-up"])
            if f.receive(idle_s=0.2):
                break
        else:
            raise AssertionError("no connectivity from tB-src to tB-dst through tB-sw")
        f.receive(idle_s=0.3)  # late warm-up copies
        yield f
    finally:
        tx.close()
        rx.close()


def wait_queue_empty() -> None:
    """Let the virtual (and real) queue drain: every burst here is under 2.5 MB, a second's
    worth at RATE_BPS."""
    time.sleep(1.1)


@contextmanager
def attached(**kwargs: object) -> Iterator[None]:
    try:
        trim.attach(SW, PORT_IF, **kwargs)  # type: ignore[arg-type]
        yield
    finally:
        trim.detach(SW, PORT_IF)


# --- tests on the kernel -----------------------------------------------------------------


@pytest.mark.requires_kernel("tc_bpf")
@pytest.mark.parametrize("last_hop", [False, True])
def test_overload_trims_to_headers_and_trimmed_packets_go_first(net: None, last_hop: bool) -> None:
    threshold = 64_000
    sent = data_packets(600, 4096)  # 2.5 MB at once; the port drains 2.5 MB/s
    by_psn = {psn_of(d): d for d in sent}
    with (
        flow() as f,
        attached(
            rate_bps=RATE_BPS,
            trim_threshold_bytes=threshold,
            ecn_threshold_bytes=None,
            last_hop=last_hop,
        ),
    ):
        wait_queue_empty()
        f.send(sent)
        got = f.receive()
        stats = trim.counters(SW, PORT_IF)
        qdiscs = json.loads(sh("tc", "-n", SW, "-j", "-s", "qdisc", "show", "dev", PORT_IF))
    trimmed = [d for d, _ in got if len(d) < 100]
    full = [d for d, _ in got if len(d) >= 100]
    assert trimmed and full
    for d in trimmed:
        check_trimmed(d, by_psn[psn_of(d)], last_hop)
    # Trimmed headers travel in the trimmed class (DSCP 12), the rest stays in DSCP 4.
    assert {tc >> 2 for d, tc in got if len(d) < 100} == {Dscp.TRIMMED}
    assert {tc >> 2 for d, tc in got if len(d) >= 100} == {Dscp.DATA}
    for d in full:
        assert d == by_psn[psn_of(d)]
        assert not decode(d, CRC).flags & DataFlags.TRIMMED  # type: ignore[union-attr]
    # Below the threshold nothing can be trimmed: packet i finds at most i packets queued.
    wire = L2_L4 + len(max(sent, key=len))
    never = {psn for psn in by_psn if (psn + 1) * wire <= threshold}
    assert never and not never & {psn_of(d) for d in trimmed}
    # Priority: some trimmed packet overtakes a full one sent before it.
    order = [psn_of(d) for d, _ in got]
    last_full_at = max(i for i, (d, _) in enumerate(got) if len(d) >= 100)
    assert any(len(got[i][0]) < 100 and order[i] > order[last_full_at] for i in range(last_full_at))
    # The program's own account agrees with what arrived.
    assert stats["trimmed"] >= len(trimmed) and stats["mrc_data"] >= len(got)
    assert stats["priority"] == stats["trimmed"] == stats["requeued"]
    assert stats["trim_errors"] == stats["ecn_marked"] == 0
    assert stats["class_data"] >= len(got) and stats["class_trimmed"] == 0
    # The shaper charged trimmed packets their trimmed size (what the priority class sent).
    prio = next(q for q in qdiscs if q["handle"] == "7473:")
    assert prio["packets"] >= len(trimmed)
    assert prio["bytes"] <= prio["packets"] * (L2_L4 + trimmed_length(Opcode.RDMA_WRITE_LAST_IMM))


@pytest.mark.requires_kernel("tc_bpf")
def test_only_the_trimmable_class_is_trimmed(net: None) -> None:
    """The same overload in DSCP 0 and in the control class: nothing is cut (the real queue
    drops what does not fit), and the counters tell the classes apart."""
    for tclass, counter in ((0, "class_other"), (traffic_class(Dscp.CONTROL, 0), "class_control")):
        sent = data_packets(300, 4096)
        with (
            flow(tclass=tclass) as f,
            attached(rate_bps=RATE_BPS, trim_threshold_bytes=64_000, ecn_threshold_bytes=None,
                     last_hop=False),
        ):  # fmt: skip
            wait_queue_empty()
            f.send(sent)
            got = f.receive()
            stats = trim.counters(SW, PORT_IF)
        assert got and all(d in sent for d, _ in got)  # whole, or not at all
        assert {tc >> 2 for _, tc in got} == {tclass >> 2}
        assert stats["trimmed"] == 0 and stats["class_data"] == 0
        assert stats[counter] >= len(got)


@pytest.mark.requires_kernel("tc_bpf")
def test_ecn_marks_only_above_threshold_and_never_on_a_last_hop_port(net: None) -> None:
    ecn_threshold = 30_000
    payload = 1024
    wire = L2_L4 + len(data_packets(1, payload)[0])
    with (
        flow(tclass=ECT0) as f,
        attached(
            rate_bps=RATE_BPS,
            trim_threshold_bytes=10**8,
            ecn_threshold_bytes=ecn_threshold,
            last_hop=False,
            queue_bytes=4 << 20,
        ),
    ):
        # Under the rate (about 1.7 Mbit/s of 20): the queue never reaches the threshold.
        wait_queue_empty()
        f.send(data_packets(100, payload), gap_s=0.005)
        slow = f.receive()
        assert len(slow) >= 90
        assert all(tc & ECN_MASK == ECT0 for _, tc in slow)
        assert trim.counters(SW, PORT_IF)["ecn_marked"] == 0

        # A burst of 300 KB at once: marks appear, but only past the threshold's worth.
        wait_queue_empty()
        f.send(data_packets(300, payload, start_psn=1000))
        burst = f.receive()
        marked = {psn_of(d) - 1000 for d, tc in burst if tc & ECN_MASK == CE}
        assert all(tc & ECN_MASK in (ECT0, CE) for _, tc in burst)
        assert marked, "an over-rate burst got no CE mark"
        assert min(marked) * wire > ecn_threshold
        assert trim.counters(SW, PORT_IF)["ecn_marked"] >= len(marked)
        assert all(len(d) > payload for d, _ in burst)  # marked, never trimmed

        # Last hop: the same burst, no mark at all.
        trim.configure(SW, PORT_IF, last_hop=True)
        before = trim.counters(SW, PORT_IF)["ecn_marked"]
        wait_queue_empty()
        f.send(data_packets(300, payload, start_psn=2000))
        lasthop = f.receive()
        assert len(lasthop) >= 250
        assert all(tc & ECN_MASK == ECT0 for _, tc in lasthop)
        assert trim.counters(SW, PORT_IF)["ecn_marked"] == before
        trim.configure(SW, PORT_IF, last_hop=False)

    # Packets that are not ECT (tclass 0) are never marked, however long the queue.
    with (
        flow(tclass=0) as f,
        attached(
            rate_bps=RATE_BPS, trim_threshold_bytes=10**8, ecn_threshold_bytes=0, last_hop=False
        ),
    ):
        wait_queue_empty()
        f.send(data_packets(300, payload))
        assert all(tc & ECN_MASK == 0 for _, tc in f.receive())
        assert trim.counters(SW, PORT_IF)["ecn_marked"] == 0


@pytest.mark.requires_kernel("tc_bpf")
def test_ecn_on_other_traffic_only_when_asked(net: None) -> None:
    burst = [i.to_bytes(4, "big") * 256 for i in range(300)]
    with (
        flow(tclass=ECT0, port=OTHER_PORT) as f,
        attached(
            rate_bps=RATE_BPS, trim_threshold_bytes=0, ecn_threshold_bytes=10_000, last_hop=False
        ),
    ):
        wait_queue_empty()
        f.send(burst)
        got = f.receive()
        assert len(got) >= 250 and all(tc & ECN_MASK == ECT0 for _, tc in got)
        assert all(len(d) == 1024 for d, _ in got)  # not MRC: never trimmed
        trim.configure(SW, PORT_IF, ecn_any=True)
        wait_queue_empty()
        f.send(burst)
        assert any(tc & ECN_MASK == CE for _, tc in f.receive())


@pytest.mark.requires_kernel("tc_bpf")
def test_fixed_probability_trims_about_p_of_the_packets(net: None) -> None:
    p, count = 0.25, 4000
    sent = data_packets(count, 512)
    by_psn = {psn_of(d): d for d in sent}
    with (
        flow() as f,
        attached(
            rate_bps=0,
            trim_threshold_bytes=0,
            ecn_threshold_bytes=None,
            last_hop=False,
            probability=p,
        ),
    ):
        got: list[tuple[bytes, int]] = []
        for start in range(0, count, 200):  # paced only to stay inside socket buffers
            f.send(sent[start : start + 200])
            got += f.receive(idle_s=0.2)
        stats = trim.counters(SW, PORT_IF)
        trimmed = [d for d, _ in got if len(d) < 100]
        for d in trimmed:
            check_trimmed(d, by_psn[psn_of(d)], last_hop=False)
        n = len(got)
        sigma = math.sqrt(n * p * (1 - p))
        assert n >= count * 0.9
        assert abs(len(trimmed) - n * p) < 6 * sigma, (len(trimmed), n)
        assert abs(stats["trimmed"] - stats["mrc_data"] * p) < 6 * sigma
        assert stats["priority"] == 0  # unshaped: no priority class to send them to

        trim.configure(SW, PORT_IF, probability=1.0)
        f.send(data_packets(100, 512))
        assert all(len(d) < 100 for d, _ in f.receive(idle_s=0.5))
        trim.configure(SW, PORT_IF, probability=0.0)
        f.send(data_packets(100, 512))
        assert all(len(d) > 500 for d, _ in f.receive(idle_s=0.5))


@pytest.mark.requires_kernel("tc_bpf")
def test_detach_restores_plain_forwarding_and_is_idempotent(net: None) -> None:
    sent = data_packets(300, 4096)
    with flow() as f:
        trim.attach(
            SW,
            PORT_IF,
            rate_bps=RATE_BPS,
            trim_threshold_bytes=0,
            ecn_threshold_bytes=0,
            last_hop=True,
        )
        assert trim.attached(SW, PORT_IF)
        trim.attach(
            SW,
            PORT_IF,
            rate_bps=RATE_BPS,
            trim_threshold_bytes=0,
            ecn_threshold_bytes=0,
            last_hop=True,
            probability=1.0,
        )
        assert trim.config(SW, PORT_IF).probability == 1.0  # re-attach replaced it
        f.send(sent[:10])
        assert all(len(d) < 100 for d, _ in f.receive(idle_s=0.5))
        trim.detach(SW, PORT_IF)
        trim.detach(SW, PORT_IF)
        assert not trim.attached(SW, PORT_IF)
        qdiscs = sh("tc", "-n", SW, "qdisc", "show", "dev", PORT_IF)
        assert "clsact" not in qdiscs and "htb" not in qdiscs
        with pytest.raises(trim.TrimError, match="no trim program"):
            trim.counters(SW, PORT_IF)
        f.send(sent)
        got = sorted(d for d, _ in f.receive())
        assert got == sorted(sent)  # unshaped, untouched, nothing lost


@pytest.mark.requires_kernel("tc_bpf")
def test_errors_name_the_port(net: None) -> None:
    with pytest.raises(trim.TrimError, match="nosuchdev"):
        trim.attach(
            SW,
            "nosuchdev",
            rate_bps=RATE_BPS,
            trim_threshold_bytes=1,
            ecn_threshold_bytes=None,
            last_hop=False,
        )
    with pytest.raises(trim.TrimError, match="tB-nosuchns"):
        trim.detach("tB-nosuchns", PORT_IF)
    with (
        pytest.raises(trim.TrimError, match="configure"),
        attached(rate_bps=0, trim_threshold_bytes=1, ecn_threshold_bytes=None, last_hop=False),
    ):
        trim.configure(SW, PORT_IF, colour="blue")
