"""System acceptance tests of mrcd on the real namespace testbed (mrcd end to end).

One default testbed (``ts``: 4 planes, 2 racks x 2 hosts, 4 T1 per plane) with one mrcd per
host (:class:`mrcstack.daemons.cluster.Cluster`: PSK auth, control and metrics on the management
network), built once for the module and removed by exact name in ``finally``.  The tests are
programs using the application API over each daemon's Unix socket, the fault harness
breaking the fabric underneath, raw UDP from host namespaces, and a real Prometheus server.

::

    h0 (rack a)  --4 planes--  T0a --- T1a..T1d --- T0b  --4 planes--  h3 (rack b)

Times are measured and printed, not asserted, with one exception: the sender must leave a
dead plane within 2 s of the receiver's NIC going down, a generous safety bound (tens of
times what is measured here) rather than a performance target.  Counts of UDP datagrams are
checked against what was sent and what the kernel provably dropped (:class:`Drops`).
"""

from __future__ import annotations

import os
import random
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mrcstack import addrplan
from mrcstack.api import (
    Access,
    AsyncEventType,
    QpState,
    WcStatus,
    WriteWr,
)
from mrcstack.daemons.cluster import METRICS_PORT
from mrcstack.daemons.mrcd.config import DATA_PORT
from mrcstack.daemons.mrcd.datapath.transport import PROBE_QPN
from mrcstack.daemons.mrcd.ops.promserver import run_prometheus
from mrcstack.fabric import Fabric
from mrcstack.netns import trim
from mrcstack.netns.run import call_in_netns
from mrcstack.netns.traffic import udp_sender
from mrcstack.qpn import qpn_text
from mrcstack.wire import WRITE_OPCODES as WRITES
from mrcstack.wire import AeadIntegrity, CrcIntegrity, DataPacket, encode
from tests.support.programs import (
    WAIT,
    async_events,
    by_label,
    closing,
    connect,
    drain,
    metric,
    open_end,
    plane_sent,
    scrape,
)
from tests.support.testbeds import Bed, Testbeds

FABRIC = Fabric()
MIB = 1 << 20
SRC, DST = 0, 3  # different racks
#: <linux/if_ether.h>
ETH_P_IPV6 = 0x86DD
IPPROTO_UDP = 17
IPV6_HDR = 40
UDP_HDR = 8


@pytest.fixture(scope="module")
def bed(testbeds: Testbeds) -> Bed:
    return testbeds.up("ts", FABRIC, cluster=True)


@pytest.fixture
def clean_faults(bed: Bed) -> Iterator[Bed]:
    """Every test leaves no fault behind (even when it fails) and every daemon running."""
    try:
        yield bed
        bed.alive()
    finally:
        bed.faults.restore_all()


# 1. Faults during a 256 MiB write -----------------------------------------------------------
FLAPPED = ["p0:t0a-t1a", "p1:t0b-t1b", "p2:t0a-t1d", "p3:t0b-t1c"]
FAILED_SWITCH = "p1-t1c"


def test_256mib_write_survives_link_flaps_and_a_t1_failure(clean_faults: Bed) -> None:
    bed = clean_faults
    size = 256 * MIB
    a, b = open_end(bed, SRC, size), open_end(bed, DST, size)
    with closing(a, b):
        qa, _ = connect(a, b, DST)
        payload = os.urandom(size)
        a.mr.buf[:] = payload
        timeline: list[tuple[float, str]] = []
        errors: list[BaseException] = []
        done = threading.Event()
        start = time.perf_counter()

        def at(what: str) -> None:
            timeline.append((time.perf_counter() - start, what))

        def inject() -> None:
            try:
                for link in FLAPPED:
                    bed.faults.link_down(link)
                    at(f"link down {link}")
                bed.faults.switch_fail(FAILED_SWITCH)
                at(f"switch fail {FAILED_SWITCH}")
                done.wait(0.1)
                for link in FLAPPED:
                    bed.faults.link_up(link)
                    at(f"link up {link}")
                bed.faults.switch_restore(FAILED_SWITCH)
                at(f"switch restore {FAILED_SWITCH}")
            except BaseException as exc:
                errors.append(exc)

        qa.post_send(WriteWr(1, (a.mr, 0, size), b.mr.addr, b.mr.rkey))
        injector = threading.Thread(target=inject)
        injector.start()
        try:
            (wc,) = drain(a.cq, 1)
            at(f"write complete: {wc.status.name}")
        finally:
            done.set()
            injector.join(WAIT)
        took = time.perf_counter() - start
        gbits = size * 8 / took / 1e9
        print(f"\n256 MiB h{SRC}->h{DST} under faults: {took:.2f} s, {gbits:.2f} Gbit/s")
        for t, what in sorted(timeline):
            print(f"  {t * 1000:8.1f} ms  {what}")
        assert not errors, errors
        assert wc.status is WcStatus.SUCCESS and wc.byte_len == size
        assert async_events(a, b) == []
        assert qa.query().state is QpState.RTS
        # Every fault hit the transfer: the failure came before the completion.
        failed_at = next(t for t, w in timeline if w.startswith("switch fail"))
        assert failed_at < took, "the transfer finished before the faults: nothing was tested"
        # Byte for byte, read through the receiving program's own mapping.
        assert b.mr.buf == payload
        retx = by_label(bed, SRC, "mrc_retransmissions_total")
        print(f"  sender retransmissions by reason: {retx}")


# 2. The receiver's NIC port goes down mid-transfer --------------------------------------------
PLANE = 1


class Sampler(threading.Thread):
    """Reads one counter of one daemon every few ms: ``(perf_counter, value)`` samples."""

    def __init__(self, read: Callable[[], float], period: float = 0.002) -> None:
        super().__init__(daemon=True)
        self.read = read
        self.period = period
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.perf_counter(), self.read()))
            self.stop.wait(self.period)

    def last_change(self) -> tuple[float, float]:
        """(time of the last sample before the final value, first sample showing it)."""
        final = self.samples[-1][1]
        for i in range(len(self.samples) - 1, -1, -1):
            if self.samples[i][1] != final:
                return self.samples[i][0], self.samples[i + 1][0]
        return self.samples[0][0], self.samples[0][0]


def test_receiver_nic_down_mid_transfer_and_back(clean_faults: Bed) -> None:
    bed = clean_faults
    size = 256 * MIB
    a, b = open_end(bed, SRC, size), open_end(bed, DST, size)
    with closing(a, b):
        qa, _ = connect(a, b, DST)
        payload = os.urandom(size)
        a.mr.buf[:] = payload
        base = plane_sent(bed, SRC, PLANE)
        sampler = Sampler(lambda: plane_sent(bed, SRC, PLANE))
        others = Sampler(lambda: sum(plane_sent(bed, SRC, p) for p in range(4) if p != PLANE), 0.02)
        qa.post_send(WriteWr(1, (a.mr, 0, size), b.mr.addr, b.mr.rkey))
        sampler.start()
        others.start()
        try:
            deadline = time.monotonic() + WAIT
            while plane_sent(bed, SRC, PLANE) < base + 500:  # the plane carries the write
                assert time.monotonic() < deadline
                time.sleep(0.005)
            t_cmd = time.perf_counter()
            bed.faults.nic_down(f"h{DST}", PLANE)
            t_ret = time.perf_counter()
            (wc,) = drain(a.cq, 1)
            t_done = time.perf_counter()
            time.sleep(0.3)  # watch the dead plane a little longer
        finally:
            sampler.stop.set()
            others.stop.set()
            sampler.join()
            others.join()
        before, last = sampler.last_change()
        print(
            f"\nnic down h{DST} plane {PLANE}: command took {(t_ret - t_cmd) * 1000:.1f} ms; "
            f"sender's last plane-{PLANE} packet {(before - t_cmd) * 1000:.1f}.."
            f"{(last - t_cmd) * 1000:.1f} ms after the command "
            f"(sampled every {sampler.period * 1000:.0f} ms, {len(sampler.samples)} samples); "
            f"write done {(t_done - t_cmd) * 1000:.0f} ms after it"
        )
        assert wc.status is WcStatus.SUCCESS
        assert async_events(a) == []  # no error on the sender's side
        # The receiving program hears of its port (mrc.h's port error event), nothing else.
        event = b.ctx.get_async_event(timeout=WAIT)
        assert event is not None and (event.type, event.port) == (AsyncEventType.PORT_ERR, PLANE)
        assert async_events(b) == []
        assert b.mr.buf == payload
        assert last - t_cmd < 2.0, "the sender kept using the dead plane"
        # It stopped because the receiver told it (the port bitmap in its SACKs).
        told = f"event=peer_plane_down qpn={qpn_text(qa.qpn)} plane={PLANE}"
        assert told in bed.cluster.daemons[SRC].log.read_text(), bed.cluster.tail(SRC)
        # The other planes carried on after the plane went quiet.
        later = [v for t, v in others.samples if t >= last]
        assert later and later[-1] > later[0], "plane 1 went quiet only when the write ended"
        # Back up: a new write uses the plane again, data one way and ACKs the other.
        bed.faults.nic_up(f"h{DST}", PLANE)
        t_up = time.perf_counter()
        s0, r0 = plane_sent(bed, SRC, PLANE), plane_sent(bed, DST, PLANE)
        deadline = time.monotonic() + WAIT
        i = 0
        while plane_sent(bed, SRC, PLANE) <= s0 or plane_sent(bed, DST, PLANE) <= r0:
            assert time.monotonic() < deadline, f"plane {PLANE} unused {WAIT}s after nic up"
            i += 1
            qa.post_send(WriteWr(10 + i, (a.mr, 0, 4 * MIB), b.mr.addr, b.mr.rkey))
            assert drain(a.cq, 1)[0].status is WcStatus.SUCCESS
        print(
            f"after nic up: plane {PLANE} carries data and ACKs again "
            f"({(time.perf_counter() - t_up) * 1000:.0f} ms, {i} writes of 4 MiB)"
        )
        event = b.ctx.get_async_event(timeout=WAIT)
        assert event is not None and (event.type, event.port) == (AsyncEventType.PORT_ACTIVE, PLANE)
        assert async_events(a, b) == []


# 3. Bad input -------------------------------------------------------------------------------
def rejected(bed: Bed, host: int) -> dict[str, float]:
    return by_label(bed, host, "mrc_rejected_packets_total")


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def udp6_counters(netns: str) -> dict[str, int]:
    """The namespace's /proc/net/snmp6 UDP counters (receive buffer drops, errors)."""
    text = call_in_netns(netns, lambda: Path("/proc/net/snmp6").read_text())
    return {
        k: int(v) for k, v in (line.split() for line in text.splitlines()) if k.startswith("Udp6")
    }


def paths_to(bed: Bed) -> list[tuple[str, int]]:
    """Every uSID address from SRC to DST's daemon, one per EV, all planes."""
    fabric = bed.state.fabric
    return [
        (str(addrplan.address(fabric, SRC, DST, e.port, e.value)), DATA_PORT)
        for e in addrplan.ev_profile(fabric, SRC, DST)
    ]


def capture(netns: str, ifname: str, dst: str, qpn: int, stop: threading.Event) -> list[bytes]:
    """UDP payloads of data packets to ``dst``:4791 for ``qpn`` seen on ``ifname``."""
    sock = call_in_netns(
        netns, lambda: socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_IPV6))
    )
    got: list[bytes] = []
    want = socket.inet_pton(socket.AF_INET6, dst)
    try:
        sock.bind((ifname, ETH_P_IPV6))
        sock.settimeout(0.05)
        while not stop.is_set() and len(got) < 8:
            try:
                pkt = sock.recv(65536)
            except TimeoutError:
                continue
            if len(pkt) < IPV6_HDR + UDP_HDR + 12 or pkt[6] != IPPROTO_UDP or pkt[24:40] != want:
                continue
            (dport,) = struct.unpack_from("!H", pkt, IPV6_HDR + 2)
            udp = pkt[IPV6_HDR + UDP_HDR :]
            if dport == DATA_PORT and int.from_bytes(udp[5:8], "big") == qpn and udp[0] in WRITES:
                got.append(udp)  # an RDMA WRITE packet of our connection (BTH opcode)
    finally:
        sock.close()
    return got


class Drops:
    """What the kernel provably dropped on the way to the receiving daemon since creation:
    its namespace's UDP receive-buffer drops and the machine's backlog drops (machine-wide,
    so they only ever loosen a bound).  Exact counts of UDP datagrams are checked as
    ``sent - dropped <= counted <= sent``: exact when nothing was dropped, never flaky."""

    def __init__(self, bed: Bed) -> None:
        self.netns = bed.ns(DST)
        self.rcvbuf, self.backlog = self._read()

    def _read(self) -> tuple[int, int]:
        return udp6_counters(self.netns)["Udp6RcvbufErrors"], softnet_drops()

    def since(self) -> tuple[int, int]:
        rcvbuf, backlog = self._read()
        return rcvbuf - self.rcvbuf, backlog - self.backlog

    def total(self) -> int:
        return sum(self.since())


def test_bad_input_is_rejected_counted_and_harmless(clean_faults: Bed) -> None:
    bed = clean_faults
    region = 4 * MIB
    a = open_end(bed, SRC, region)
    b = open_end(bed, DST, region, region)  # the target and a neighbour never written to
    with closing(a, b):
        guard = b.ctx.reg_mr(region, Access.LOCAL_WRITE)  # registered, not remotely writable
        guard.buf[:] = b"\x5a" * region
        target, neighbour = b.mrs
        qa, qb = connect(a, b, DST)
        a.mr.buf[:] = os.urandom(region)
        written = 0  # target[:written] holds a.mr.buf[:written]; the rest is still zero

        def write(wr_id: int, length: int = MIB) -> None:
            nonlocal written
            qa.post_send(WriteWr(wr_id, (a.mr, 0, length), target.addr, target.rkey))
            assert drain(a.cq, 1)[0].status is WcStatus.SUCCESS
            written = max(written, length)

        def memory_unharmed(after: str) -> None:
            """Every byte of the three regions is what the legitimate writes made it."""
            assert target.buf[:written] == a.mr.buf[:written], f"target changed by {after}"
            assert target.buf[written:] == bytes(region - written), f"target changed by {after}"
            assert neighbour.buf == bytes(region), f"neighbour changed by {after}"
            assert guard.buf == b"\x5a" * region, f"guard changed by {after}"

        write(1)
        before = rejected(bed, DST)

        # A wrong rkey and a region without remote write, through the API: each fails its
        # own QP (at both ends) with a remote access error; the receiver counts rkey
        # rejections.
        for rkey in (target.rkey ^ 0x5A5A, guard.rkey):
            bad, bad_peer = connect(a, b, DST)
            bad.post_send(WriteWr(2, (a.mr, 0, 4096), guard.addr, rkey))
            (wc,) = drain(a.cq, 1)
            assert wc.status is WcStatus.REM_ACCESS_ERR
            event = a.ctx.get_async_event(timeout=WAIT)
            assert event is not None and event.qpn == bad.qpn, event
            event = b.ctx.get_async_event(timeout=WAIT)  # the responder's QP failed too
            assert event is not None and event.qpn == bad_peer.qpn, event
            assert "refused the peer's write of 4096 bytes" in event.reason
        after = rejected(bed, DST)
        print(f"\nwrong rkey: receiver rejections {delta(after, before)}")
        assert after["rkey"] >= before["rkey"] + 2
        memory_unharmed("wrong rkeys")

        # A forged authentication tag: a well-formed data packet for the live QP, sealed
        # with a key that is not the connection's, sent over the fabric from h0.
        paths = paths_to(bed)
        sender = udp_sender(bed.ns(SRC))
        try:
            forger = AeadIntegrity(os.urandom(32), qa.qpn, qb.qpn)
            drops = Drops(bed)
            for i in range(10):
                pkt = DataPacket(
                    qpn=qb.qpn, psn=i, va=target.addr, rkey=target.rkey, payload=b"\xee" * 1024,
                    ev=0, port=i % 4, tx_seq=1 << 40 | i, ts_ns=0,
                )  # fmt: skip
                sender.sendto(encode(pkt, forger), paths[i * 32 % len(paths)])
            before, after = after, _settle(lambda: rejected(bed, DST))
            forged = after["bad_auth"] - before["bad_auth"]
            print(f"forged tags: {delta(after, before)}, kernel drops {drops.since()}")
            assert 10 - drops.total() <= forged <= 10
            memory_unharmed("forged packets")

            # Data packets for QP 2, the endpoint (where only probes and their answers go):
            # rejected by the endpoint, whatever they say.
            drops = Drops(bed)
            for i in range(10):
                pkt = DataPacket(
                    qpn=PROBE_QPN, psn=i, va=target.addr, rkey=target.rkey, payload=b"\xee" * 64,
                    ev=0, port=i % 4, tx_seq=i, ts_ns=0,
                )  # fmt: skip
                sender.sendto(encode(pkt, CrcIntegrity()), paths[i * 32 % len(paths)])
            before, after = after, _settle(lambda: rejected(bed, DST))
            probes = sum(delta(after, before).values())
            print(f"data packets for QP 2: {delta(after, before)}, kernel drops {drops.since()}")
            assert 10 - drops.total() <= probes <= 10

            # A replayed packet: capture genuine data packets on the receiver's plane-0
            # port during a write, send them again after it completed.
            stop = threading.Event()
            got: list[list[bytes]] = []
            dst0 = str(addrplan.nic_sid(bed.state.fabric, 0, DST))
            cap = threading.Thread(
                target=lambda: got.append(capture(bed.ns(DST), "nic0", dst0, qb.qpn, stop))
            )
            cap.start()
            try:
                time.sleep(0.05)
                write(3, 4 * MIB)
            finally:
                stop.set()
                cap.join(WAIT)
            replay = got[0] if got else []
            assert replay, "captured no data packet on nic0"
            drops = Drops(bed)
            for pkt_bytes in replay:
                sender.sendto(pkt_bytes, paths[0])  # plane 0, EV 0: arrives on nic0 again
            before, after = after, _settle(lambda: rejected(bed, DST))
            replayed = after["replay"] - before["replay"]
            print(f"{len(replay)} replayed packets: {delta(after, before)}, "
                  f"kernel drops {drops.since()}")  # fmt: skip
            assert len(replay) - drops.total() <= replayed <= len(replay)
            memory_unharmed("replayed packets")

            # 100,000 random datagrams at the daemon's port, over every plane and path; one in
            # ten carries the live QP's number, so the connection's own decoder sees it, and
            # one in ten QPN 0, where the daemon's probe handling sees it.
            rng = random.Random(7)
            drops = Drops(bed)
            count = 100_000
            t0 = time.perf_counter()
            live = qb.qpn.to_bytes(3, "big")
            for i in range(count):
                junk = rng.randbytes(rng.randrange(0, 1200))
                if i % 10 == 0 and len(junk) >= 8:  # aimed at the live QP: reaches its decoder
                    junk = junk[:5] + live + junk[8:]
                elif i % 10 == 5 and len(junk) >= 8:  # QPN 0: a malformed probe
                    junk = junk[:5] + bytes(3) + junk[8:]
                sender.sendto(junk, paths[i % len(paths)])
                if i % 2000 == 1999:
                    time.sleep(0.002)  # keep the receive buffers from overflowing
            sent_s = time.perf_counter() - t0
            before, after = after, _settle(lambda: rejected(bed, DST))
            rcvbuf, backlog = drops.since()
        finally:
            sender.close()
        counted = sum(delta(after, before).values())
        print(
            f"{count} random datagrams in {sent_s:.2f} s: rejected {delta(after, before)} "
            f"(sum {counted:.0f}), receive-buffer drops {rcvbuf}, kernel backlog drops {backlog}"
        )
        # Every datagram that reached the daemon was rejected and counted (the kernel's
        # backlog drops are machine-wide: they only loosen the bound).
        assert count - backlog <= counted + rcvbuf <= count
        assert counted >= count * 0.9
        # No memory outside what the legitimate writes wrote changed, byte for byte, before
        # anything else is written; then the daemon still serves the connection it had.
        memory_unharmed("100,000 random datagrams")
        write(4, 2 * MIB)
        memory_unharmed("a last legitimate write")
        assert async_events(a, b) == []  # nothing more failed


def softnet_drops() -> int:
    """Packets the kernel dropped from its per-CPU backlogs (machine-wide)."""
    lines = Path("/proc/net/softnet_stat").read_text().splitlines()
    return sum(int(line.split()[1], 16) for line in lines)


def _settle(read: Callable[[], dict[str, float]], quiet: float = 0.2) -> dict[str, float]:
    """Read until two reads ``quiet`` seconds apart agree (the daemon drained its sockets)."""
    last = read()
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = read()
        if now == last:
            return now
        last = now
    return last


# 4. A real Prometheus scraping every daemon over the management network -----------------------
def test_prometheus_scrapes_every_daemon(clean_faults: Bed) -> None:
    bed = clean_faults
    targets = [f"[{bed.state.mgmt[f'h{h}']}]:{METRICS_PORT}" for h in bed.cluster.daemons]
    page = scrape(bed, SRC)
    lint = subprocess.run(
        ["promtool", "check", "metrics"], input=page, capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    a, b = open_end(bed, 1, MIB), open_end(bed, 2, MIB)
    with closing(a, b), run_prometheus(targets, bed.workdir / "prom", scrape_interval=0.5) as prom:
        qa, _ = connect(a, b, 2)
        qa.post_send(WriteWr(1, (a.mr, 0, MIB), b.mr.addr, b.mr.rkey))
        assert drain(a.cq, 1)[0].status is WcStatus.SUCCESS
        prom.wait_for("count(mrc_planes) == 4", timeout=WAIT)
        up = prom.query("up")
        assert len(up) == 4 and all(s["value"][1] == "1" for s in up)  # type: ignore[index]
        [planes] = prom.query("sum(mrc_planes)")
        assert planes["value"][1] == "16"  # type: ignore[index]
        # h1 sent the write; h2 sent the ACKs: both show bytes on the wire.
        sent = prom.wait_for("sum by (instance) (mrc_sent_bytes_total) > 0", WAIT, count=2)
        instances = {s["metric"]["instance"] for s in sent}  # type: ignore[index]
        assert {targets[1], targets[2]} <= instances
        names = {s["metric"]["__name__"] for s in prom.query('{__name__=~"mrc_.+"}')}  # type: ignore[index]
        print(f"\nprometheus: {len(names)} mrc_ series names from {len(up)} daemons")
        assert {"mrc_sent_packets_total", "mrc_rejected_packets_total"} <= names


# 5. ECN: a congested switch port on the path marks CE ---------------------------------------------
MARKING_LINK, MARKING_SWITCH = "p0:t0b-t1a", "p0-t1a"  # the T1's port down to h3's rack
MARKING_BPS = 200e6


def test_ecn_marks_of_a_congested_port_reach_the_receiver_and_the_sender(clean_faults: Bed) -> None:
    """A switch port on some of the paths h0 -> h3, shaped and ECN-marking (the testbed's trim
    program, not a last hop): the receiver sees the CE marks (mrc_ecn_marks_received_total)
    and echoes them, the sender counts the echoes (mrc_ecn_echoes_total), and the write
    still lands intact."""
    if (reason := trim.unavailable_reason()) is not None:
        pytest.skip(reason)
    bed = clean_faults
    size = 64 * MIB
    end = bed.state.link(MARKING_LINK).end(MARKING_SWITCH)
    # Shaped below that path's share of the write, and marking at the first packet queued:
    # a mark delays its packet by about one packet time, far less than a loss would need.
    # Trimming only past 1 MiB of a 2 MiB queue: the port marks, it hardly ever trims.
    bed.faults.trim(MARKING_LINK, None, from_node=MARKING_SWITCH, rate_bps=MARKING_BPS,
                    threshold_bytes=1 << 20, ecn_threshold_bytes=0,
                    queue_bytes=2 << 20)  # fmt: skip
    a, b = open_end(bed, SRC, size), open_end(bed, DST, size)
    with closing(a, b):
        qa, _ = connect(a, b, DST)
        a.mr.buf[:] = os.urandom(size)
        marks0 = metric(bed, DST, "mrc_ecn_marks_received_total")
        echoes0 = metric(bed, SRC, "mrc_ecn_echoes_total")
        t0 = time.perf_counter()
        qa.post_send(WriteWr(1, (a.mr, 0, size), b.mr.addr, b.mr.rkey))
        (wc,) = drain(a.cq, 1)
        took = time.perf_counter() - t0
        marks = metric(bed, DST, "mrc_ecn_marks_received_total") - marks0
        echoes = metric(bed, SRC, "mrc_ecn_echoes_total") - echoes0
        port = trim.counters(end.netns, end.ifname)
        print(f"\n{size >> 20} MiB, a {MARKING_BPS / 1e6:.0f} Mbit/s marking port on 1 of 16 "
              f"paths: {took:.2f} s; the port marked {port['ecn_marked']} and trimmed "
              f"{port['trimmed']} of {port['mrc_data']} data packets; h{DST} received "
              f"{marks:.0f} CE marks, h{SRC} counted {echoes:.0f} echoes")  # fmt: skip
        assert wc.status is WcStatus.SUCCESS and b.mr.buf == a.mr.buf
        assert port["ecn_marked"] > 0, port
        assert 0 < marks <= port["ecn_marked"]  # every mark counted came from that port
        assert 0 < echoes <= marks  # an echo answers a mark (coalescing never drops one)
