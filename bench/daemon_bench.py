"""mrcd goodput on the namespace testbed, next to the baselines a Linux user has today.

``run()`` (root only; without root it returns an empty dict) measures, each for
``MRC_BENCH_SECONDS`` (default 3) seconds and ``MRC_BENCH_REPEAT`` (default 3) interleaved
rounds (medians, min and max; ratios of the medians), see docs/benchmarks.md:

- on the unshaped default fabric (testbed ``dbu``), h0 -> h3 (different racks):
  - **mrcd**: one QP through the application API, 1 MiB RDMA writes, ``OUTSTANDING`` of them
    in flight, over all four planes; in each EV format: ``srv6`` (uSID), ``srv6-srh`` (the
    fabric has classic SIDs) and ``stev`` (ECMP), the last two through a raw socket;
  - **raw UDP blast**: the user-space ceiling: one Python process in h0 sending datagrams of
    exactly mrcd's data-packet size (8,192 bytes of payload + MRC headers + AES-GCM tag) in a
    tight ``sendto`` loop over the same uSID paths (round robin over the EVs of all planes),
    one Python process in h3 draining four sockets with ``recv_into``; goodput counts the
    8,192 payload bytes of each datagram received;
  - **kernel TCP**: one flow between the hosts' plain IPv6 baseline addresses on plane 0
    (``sendall``/``recv_into`` of 1 MiB buffers);
- on a shaped fabric (testbed ``dbs``: every link 200 Mbit/s, so 4 planes x 200 Mbit/s =
  800 Mbit/s between two hosts):
  - **mrcd** as above, as a fraction of the 800 Mbit/s;
  - **kernel MPTCP** (``socket(AF_INET6, SOCK_STREAM, IPPROTO_MPTCP)``) with one subflow per
    plane: the server announces its other planes' baseline addresses (``ip mptcp endpoint add
    ADDR dev nicP signal``), limits ``subflow 8 add_addr_accepted 8`` on both ends.  The
    sender reads what each subflow carried before it closes (``bench/mptcp.py``); the
    section fails loudly if the connection fell back to plain TCP or used one subflow, and
    prints ``shaped_mptcp_subflows`` (the fewest that carried data in any round).

CPU per packet comes from the processes' own CPU time (``/proc/PID/stat`` of each mrcd,
``time.process_time`` of each blast process) over the timed part of each round: the sending
mrcd per data packet, the receiving one per data packet and per ACK it sent, the blast's
sender and receiver per datagram, and each sender's time split into user space (what the
stack costs) and the kernel (mostly the emulated fabric forwarding what it sent)
(:func:`cpu_per_packet`).

Last, mrcd's aggregate goodput over 4 QPs with 1 and with 2 data-path workers
(``workers = N``) on both hosts, and the ratio (``bench/workers.py``; alone with
``python -m bench.daemon_bench --workers``).

``python -m bench.daemon_bench --against REV`` measures only mrcd, at git revision ``REV``
and in this tree, alternating on one unshaped testbed with a blast in every round: a change
to the data path measured before and after in the same run (:func:`compare`).

Each side of a baseline runs as its own process inside its host's namespace (``ip netns exec
NS python -m bench.daemon_bench --role ...``, one JSON line out).  Testbeds are built and
removed by exact name in ``finally``.  ``python -m bench.daemon_bench`` prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import mptcp, sim_bench, workers
from mrcstack import addrplan
from mrcstack.api import Device, WriteWr
from mrcstack.api.ctl import Controller
from mrcstack.daemons.cluster import Cluster
from mrcstack.daemons.lifecycle import process_times
from mrcstack.experiments.live import (
    SHAPED_BPS,
    accept,
    bed,
    counters,
    metrics,
    mptcp_setup,
    shaped,
)
from mrcstack.experiments.stream import IPPROTO_MPTCP
from mrcstack.fabric import Fabric
from mrcstack.netns import testbed
from mrcstack.netns.state import TestbedState, load
from mrcstack.wire import AeadIntegrity, DataPacket, encode

ROOT = Path(__file__).resolve().parent.parent
UNSHAPED, SHAPED = "dbu", "dbs"  # testbed names of this benchmark
SRC, DST = 0, 3
WRITE = 1 << 20
OUTSTANDING = 16
REGION = 64 << 20
MTU_PAYLOAD = 8192  # mrcd's default QpAttrs.mtu_payload
BLAST_PORT = 4799  # not mrcd's 4791: the blast may run while the daemons are idle
TCP_PORT = 5201
UDP_NO_CHECK6_TX, UDP_NO_CHECK6_RX = 101, 102
SO_RCVBUFFORCE, SO_SNDBUFFORCE = 33, 32
SOCKET_BUFFER = 8 << 20
IDLE = 1.0  # a receiver stops this long after its last packet


def seconds() -> float:
    return float(os.environ.get("MRC_BENCH_SECONDS", "3"))


def repeat() -> int:
    return int(os.environ.get("MRC_BENCH_REPEAT", "3"))


# mrcd -----------------------------------------------------------------------------------------
def mrcd_goodput(
    state: TestbedState, cluster: Cluster, duration: float
) -> tuple[float, dict[str, float]]:
    """bits/s of 1 MiB writes h0 -> h3 through the API for ``duration`` s, and how the
    :func:`counters` moved meanwhile."""
    a = Device.open(cluster.daemons[SRC].api_socket).create_context()
    b = Device.open(cluster.daemons[DST].api_socket).create_context()
    try:
        acq, bcq = a.create_cq(4096), b.create_cq(4096)
        qa, qb = a.create_qp(acq), b.create_qp(bcq)
        amr, bmr = a.reg_mr(REGION), b.reg_mr(REGION)
        amr.buf[:] = os.urandom(REGION)
        listener = b.listen(77)
        t = threading.Thread(target=lambda: accept(listener, qb))
        t.start()
        qa.connect(DST, 77, timeout=30)
        t.join(30)
        slots = REGION // WRITE

        def post(i: int) -> None:
            off = i % slots * WRITE
            qa.post_send(WriteWr(i, (amr, off, WRITE), bmr.addr + off, bmr.rkey))

        for i in range(OUTSTANDING):  # warm-up: congestion window, EV states
            post(i)
        warm = 0
        while warm < OUTSTANDING:
            warm += len(workers.successes(acq, "mrcd goodput run"))
        posted = done = 0
        before = counters(state, cluster) | _dst_packets(cluster)
        cpu = _daemon_cpu(cluster)
        start = time.perf_counter()
        end = start + duration
        window = WindowSampler(cluster, qa.qpn, end)
        for _ in range(OUTSTANDING):
            post(posted)
            posted += 1
        while done < posted:
            done += len(workers.successes(acq, "mrcd goodput run"))
            while time.perf_counter() < end and posted - done < OUTSTANDING:
                post(posted)
                posted += 1
        took = time.perf_counter() - start
        sampled = window.result()
        cpu = [b - a for a, b in zip(cpu, _daemon_cpu(cluster), strict=True)]
        after = counters(state, cluster) | _dst_packets(cluster)
        if bytes(bmr.buf[:WRITE]) != bytes(amr.buf[:WRITE]):
            raise RuntimeError("mrcd goodput run: data did not arrive intact")
        moved = {k: v - before.get(k, 0.0) for k, v in after.items()}
        more = {"src_cpu_s": cpu[0], "dst_cpu_s": cpu[1], "src_user_s": cpu[2],
                "dst_user_s": cpu[3], "timed_s": took} | sampled  # fmt: skip
        return done * WRITE * 8 / took, moved | more
    finally:
        a.close()
        b.close()


#: Seconds between two readings of the sending QP's window (a controller query each).
WINDOW_EVERY = 0.25
#: The window readings' sums over rounds (:func:`wait_figures` turns them into means).
WINDOW_SUMS = ("window_samples", "cwnd_kib_sum", "inflight_kib_sum", "srtt_ms_sum")


class WindowSampler:
    """Reads the sending QP's congestion window, bytes in flight and smoothed RTT (as
    ``mrcctl qp show`` gives them) every :data:`WINDOW_EVERY` s until ``end``, in a
    thread."""

    def __init__(self, cluster: Cluster, qpn: int, end: float) -> None:
        self.ctl = Controller.open(cluster.daemons[SRC].api_socket)
        self.qpn = qpn
        self.end = end
        self.sums = dict.fromkeys(WINDOW_SUMS, 0.0)
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while time.perf_counter() + WINDOW_EVERY < self.end:
                time.sleep(WINDOW_EVERY)
                (qp,) = self.ctl.qps(self.qpn)
                if "cwnd" not in qp:
                    return  # an mrcd from before it reported its window (``--against``)
                if qp.get("srtt") is None:
                    continue  # no RTT sample yet
                self.sums["window_samples"] += 1
                self.sums["cwnd_kib_sum"] += qp["cwnd"] / 1024
                self.sums["inflight_kib_sum"] += qp.get("in_flight", 0) / 1024
                self.sums["srtt_ms_sum"] += qp["srtt"] * 1e3
        except Exception as exc:  # (re-raised in the measuring thread by result())
            self.error = exc
        finally:
            self.ctl.close()  # (here: closed even if the run fails before result())

    def result(self) -> dict[str, float]:
        self.thread.join(WINDOW_EVERY + 30)
        if self.thread.is_alive():  # (a query that hangs: its sums are still moving)
            raise RuntimeError("mrcd goodput run: reading the window: no answer in 30 s")
        if self.error is not None:
            raise RuntimeError(f"mrcd goodput run: reading the window: {self.error}")
        return self.sums


def wait_figures(stats: dict[str, float]) -> dict[str, float]:
    """What one QP waited for, from sums over rounds: the fraction of the timed part each
    mrcd was on a CPU (its CPU time over the wall time: near 1, the sender is CPU bound;
    lower, it waited, for ACKs or the application), and the means of the window readings
    (:class:`WindowSampler`): the congestion window and the bytes in flight in KiB (in
    flight near the window: the QP waits for ACKs) and the smoothed RTT in ms."""
    out: dict[str, float] = {}
    timed = stats.get("timed_s", 0.0)
    if timed:
        out["sender_busy"] = stats["src_cpu_s"] / timed
        out["receiver_busy"] = stats["dst_cpu_s"] / timed
    n = stats.get("window_samples", 0.0)
    if n:
        out["cwnd_kib"] = stats["cwnd_kib_sum"] / n
        out["inflight_kib"] = stats["inflight_kib_sum"] / n
        out["srtt_ms"] = stats["srtt_ms_sum"] / n
    return out


def _counters_only(stats: dict[str, float]) -> dict[str, float]:
    """``stats`` without the window readings' sums (:func:`wait_figures` averages them)."""
    return {k: v for k, v in stats.items() if k not in WINDOW_SUMS}


def _dst_packets(cluster: Cluster) -> dict[str, float]:
    """The receiving daemon's datagrams in (the data packets) and out (its ACKs)."""
    page = metrics(cluster, DST)
    return {
        f"dst_{kind}_packets": sum(
            v for k, v in page.items() if k.startswith(f"mrc_{kind}_packets_total{{")
        )
        for kind in ("received", "sent")
    }


def _daemon_cpu(cluster: Cluster) -> list[float]:
    """CPU seconds used so far by the sending and the receiving mrcd, then the user-space
    part of each (``ip netns exec`` execs the daemon, so the process started is the
    daemon)."""
    times = []
    for host in (SRC, DST):
        proc = cluster.daemons[host].proc
        assert proc is not None
        got = process_times(proc.pid)
        if got is None:
            raise RuntimeError(f"mrcd on h{host} (pid {proc.pid}) is gone")
        times.append(got)
    return [user + system for user, system in times] + [user for user, _ in times]


def set_format(cluster: Cluster, fmt: str) -> None:
    """The EV format of both ends' default EV profile (between runs: no QP uses it)."""
    for host in (SRC, DST):
        with Controller.open(cluster.daemons[host].api_socket) as ctl:
            ctl.modify_ev_profile(0, ev_format=fmt)


# Baseline processes -------------------------------------------------------------------------
def datagram_size() -> int:
    """Bytes of one mrcd data datagram with a full payload (AES-GCM authenticated)."""
    pkt = DataPacket(qpn=1, psn=0, va=0, rkey=1, payload=bytes(MTU_PAYLOAD), ev=0, port=0,
                     tx_seq=0, ts_ns=0)  # fmt: skip
    return len(encode(pkt, AeadIntegrity(bytes(32), 1, 2)))


def _udp_socket(bind: tuple[str, int], rx: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_RX if rx else UDP_NO_CHECK6_TX, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE if rx else SO_SNDBUFFORCE, SOCKET_BUFFER)
    sock.bind(bind)
    return sock


def role_udp_recv(args: argparse.Namespace) -> dict[str, Any]:
    socks = [_udp_socket((addr, BLAST_PORT), rx=True) for addr in args.bind]
    for s in socks:
        s.setblocking(False)
    poller = select.epoll()
    for s in socks:
        poller.register(s.fileno(), select.EPOLLIN)
    by_fd = {s.fileno(): s for s in socks}
    buf = bytearray(65536)
    packets = nbytes = 0
    first = last = 0.0
    cpu = user = 0.0
    print(json.dumps({"ready": True}), flush=True)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        events = poller.poll(IDLE)
        if not events:
            if packets:
                break
            continue
        if not cpu:
            cpu, user = time.process_time(), os.times().user  # from the first datagram on
        for fd, _ in events:
            recv_into = by_fd[fd].recv_into
            while True:
                try:
                    n = recv_into(buf)
                except BlockingIOError:
                    break
                packets += 1
                nbytes += n
        last = time.perf_counter()
        if not first:
            first = last
    return {"packets": packets, "bytes": nbytes, "seconds": last - first,
            "cpu": time.process_time() - cpu, "user": os.times().user - user}  # fmt: skip


def role_udp_send(args: argparse.Namespace) -> dict[str, Any]:
    fabric = load(args.testbed).fabric
    socks = [
        _udp_socket((str(addrplan.nic_sid(fabric, p, SRC)), 0), rx=False)
        for p in range(fabric.planes)
    ]
    usid = addrplan.address
    paths = [
        (socks[e.port].sendto, (str(usid(fabric, SRC, DST, e.port, e.value)), BLAST_PORT))
        for e in addrplan.ev_profile(fabric, SRC, DST)
    ]
    data = os.urandom(args.size)
    sent = blocked = 0
    cpu, user = time.process_time(), os.times().user
    end = time.perf_counter() + args.seconds
    n = len(paths)
    while True:
        for i in range(1024):
            sendto, addr = paths[(sent + i) % n]
            try:
                sendto(data, addr)
            except (BlockingIOError, OSError):
                blocked += 1
        sent += 1024
        if time.perf_counter() >= end:
            break
    return {"sent": sent - blocked, "refused": blocked, "cpu": time.process_time() - cpu,
            "user": os.times().user - user}  # fmt: skip


def role_tcp_recv(args: argparse.Namespace) -> dict[str, Any]:
    srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM, args.proto)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("::", TCP_PORT))
    srv.listen(1)
    print(json.dumps({"ready": True}), flush=True)
    srv.settimeout(args.timeout)
    conn, _ = srv.accept()
    buf = bytearray(1 << 20)
    nbytes = 0
    first = last = 0.0
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        last = time.perf_counter()
        if not first:
            first = last
        nbytes += n
    return {"bytes": nbytes, "seconds": last - first}


def role_tcp_send(args: argparse.Namespace) -> dict[str, Any]:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM, args.proto)
    sock.settimeout(args.timeout)
    sock.connect((args.to, TCP_PORT))
    data = b"\xa5" * (1 << 20)
    end = time.perf_counter() + args.seconds
    sent = 0
    while time.perf_counter() < end:
        sock.sendall(data)
        sent += len(data)
    result: dict[str, Any] = {"bytes": sent}
    if args.proto == IPPROTO_MPTCP:
        try:
            result["subflow_bytes"] = mptcp.subflow_bytes(sock)
        except mptcp.MptcpFallbackError as exc:
            result["fallback"] = str(exc)
    sock.close()
    return result


def mptcp_subflows(sender: dict[str, Any], planes: int) -> int:
    """How many subflows carried the MPTCP sender's data; RuntimeError (the bench section
    fails) if the connection fell back to plain TCP or ran over one subflow: its figure
    would be kernel TCP's on one plane, not MPTCP's."""
    if "fallback" in sender:
        raise RuntimeError(f"MPTCP baseline: {sender['fallback']}")
    per = [int(n) for n in sender.get("subflow_bytes", [])]
    used = mptcp.used_subflows(per)
    if used < 2:
        raise RuntimeError(
            f"MPTCP baseline: {used} subflow(s) carried the data (bytes acked per subflow: "
            f"{per}), not one per plane ({planes}); see `ip mptcp endpoint show` and limits"
        )
    return used


ROLES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "udp-recv": role_udp_recv,
    "udp-send": role_udp_send,
    "tcp-recv": role_tcp_recv,
    "tcp-send": role_tcp_send,
}


@contextmanager
def in_netns(netns: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """``python -m bench.daemon_bench ARGS`` inside ``netns``; killed on the way out."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, "-m", "bench.daemon_bench", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _result(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"baseline process failed ({proc.returncode}): {out[-500:]}")
    return dict(json.loads(lines[-1]))


def _ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if '"ready"' not in line:
        raise RuntimeError(f"baseline receiver did not start: {line!r}")


def udp_blast(state: TestbedState, duration: float) -> tuple[float, dict[str, float]]:
    """Payload-equivalent bits/s of the raw UDP blast h0 -> h3 over every uSID path."""
    fabric = state.fabric
    binds = [str(addrplan.nic_sid(fabric, p, DST)) for p in range(fabric.planes)]
    size = datagram_size()
    wait = str(duration + 30)
    with in_netns(state.ns(f"h{DST}"), "--role", "udp-recv", "--timeout", wait,
                  *[f"--bind={b}" for b in binds]) as recv:  # fmt: skip
        _ready(recv)
        with in_netns(state.ns(f"h{SRC}"), "--role", "udp-send", "--seconds", str(duration),
                      "--size", str(size), "--testbed", state.name) as send:  # fmt: skip
            sent = _result(send, duration + 30)
        got = _result(recv, duration + 30)
    bps = got["packets"] * MTU_PAYLOAD * 8 / got["seconds"]
    return bps, {
        "datagram_bytes": float(size),
        "sent": float(sent["sent"]),
        "received": float(got["packets"]),
        "lost_fraction": 1 - got["packets"] / max(1, sent["sent"]),
        "sender_cpu_s": float(sent["cpu"]),
        "receiver_cpu_s": float(got["cpu"]),
        "sender_user_s": float(sent["user"]),
        "receiver_user_s": float(got["user"]),
    }


def tcp_flow(
    state: TestbedState, duration: float, to: str, proto: int = 0
) -> tuple[float, dict[str, Any]]:
    """bits/s of one TCP (or MPTCP: proto 262) connection h0 -> ``to`` in h3, and what the
    sender reported (for MPTCP: its subflows, see :func:`role_tcp_send`)."""
    wait = str(duration + 30)
    with in_netns(state.ns(f"h{DST}"), "--role", "tcp-recv", "--proto", str(proto),
                  "--timeout", wait) as recv:  # fmt: skip
        _ready(recv)
        with in_netns(state.ns(f"h{SRC}"), "--role", "tcp-send", "--proto", str(proto), "--to",
                      to, "--seconds", str(duration), "--timeout", wait) as send:  # fmt: skip
            sender = _result(send, duration + 30)
        got = _result(recv, duration + 30)
    return float(got["bytes"] * 8 / got["seconds"]), sender


# The runs -----------------------------------------------------------------------------------
def _add(total: dict[str, float], more: dict[str, float]) -> None:
    for k, v in more.items():
        total[k] = total.get(k, 0.0) + v


def cpu_per_packet(mrcd: dict[str, float], blast: dict[str, float]) -> dict[str, float]:
    """CPU microseconds per packet from the processes' own CPU time, summed over the rounds:
    the sending mrcd per data packet it sent, the receiving one per data packet it received
    and per ACK it sent (its whole CPU time, spread over its ACKs), and the blast's two
    processes per datagram.  The senders' time also split into user space and the kernel:
    the kernel's part carries most of the emulated fabric's forwarding of what was sent (the
    same per datagram for both), the user part is what the stack itself costs."""
    sent = max(1.0, mrcd["sent_packets"])
    out = {
        "sender_us_per_data_packet": 1e6 * mrcd["src_cpu_s"] / sent,
        "receiver_us_per_data_packet": 1e6
        * mrcd["dst_cpu_s"]
        / max(1.0, mrcd["dst_received_packets"]),
        "receiver_us_per_ack": 1e6 * mrcd["dst_cpu_s"] / max(1.0, mrcd["dst_sent_packets"]),
        "data_packets_per_ack": mrcd["dst_received_packets"] / max(1.0, mrcd["dst_sent_packets"]),
        "sender_user_us_per_data_packet": 1e6 * mrcd["src_user_s"] / sent,
        "sender_kernel_us_per_data_packet": 1e6 * (mrcd["src_cpu_s"] - mrcd["src_user_s"]) / sent,
    }
    result = {f"unshaped_mrcd_{k}": v for k, v in out.items()}
    if blast:
        datagrams = max(1.0, blast["sent"])
        sender = 1e6 * blast["sender_cpu_s"] / datagrams
        receiver = 1e6 * blast["receiver_cpu_s"] / max(1.0, blast["received"])
        user = 1e6 * blast["sender_user_s"] / datagrams
        result |= {
            "unshaped_udp_blast_sender_us_per_packet": sender,
            "unshaped_udp_blast_receiver_us_per_packet": receiver,
            "unshaped_udp_blast_sender_user_us_per_packet": user,
            "unshaped_udp_blast_sender_kernel_us_per_packet": sender - user,
            "unshaped_mrcd_sender_cpu_over_blast": out["sender_us_per_data_packet"] / sender,
            "unshaped_mrcd_receiver_cpu_over_blast": out["receiver_us_per_data_packet"] / receiver,
            "unshaped_mrcd_sender_kernel_over_blast": out["sender_kernel_us_per_data_packet"]
            / max(1e-9, sender - user),
        }
    return result


def compare(rev: str, shaped_fabric: bool = False) -> dict[str, float]:
    """mrcd at revision ``rev`` ("before") and in this tree ("after") on one testbed,
    alternating over ``MRC_BENCH_REPEAT`` rounds: the goodput medians and CPU per packet of
    each side.  Unshaped, a UDP blast runs in every round and goodputs are also given as
    ratios to its; shaped (``shaped_fabric``), as fractions of the capacity, with the
    retransmissions of each side.  Both ways, each side's UDP receive-buffer drops in the
    sending (ACKs) and the receiving (data) namespace.  The daemons of ``rev`` run from an
    exported copy of it (``PYTHONPATH``); the client is this tree's."""
    if os.geteuid() != 0:
        return {}
    duration, rounds = seconds(), repeat()
    fabric = shaped(Fabric()) if shaped_fabric else Fabric(sid_format="classic")
    name = SHAPED if shaped_fabric else UNSHAPED
    goodput: dict[str, list[float]] = {"before": [], "after": [], "blast": []}
    stats: dict[str, dict[str, float]] = {"before": {}, "after": {}}
    udp_stats: dict[str, float] = {}
    with revision_bed(rev, fabric, name, "daemon bench") as (state, sides, workdir):
        for _ in range(rounds):
            for label, tree in sides:
                with pythonpath(tree), Cluster(state, workdir, log_level="warning") as c:
                    bps, more = mrcd_goodput(state, c, duration)
                goodput[label].append(bps)
                _add(stats[label], more)
            if not shaped_fabric:
                bps, more = udp_blast(state, duration)
                goodput["blast"].append(bps)
                _add(udp_stats, more)
        # (1: the per-packet modules ran compiled, mrcstack.native; 0: as Python)
        compiled = {label: float(sim_bench.runs_compiled(tree)) for label, tree in sides}
    out = {"rounds": float(rounds)}
    out |= {f"{label}_compiled": value for label, value in compiled.items()}
    if udp_stats:
        out["udp_blast_gbps"] = statistics.median(goodput["blast"]) / 1e9
        blast = cpu_per_packet(stats["after"], udp_stats)
        out |= {k.removeprefix("unshaped_"): v for k, v in blast.items()
                if k.startswith("unshaped_udp_blast_")}  # fmt: skip
    for label in ("before", "after"):
        m = statistics.median(goodput[label])
        out[f"{label}_mrcd_gbps"] = m / 1e9
        if shaped_fabric:
            out[f"{label}_mrcd_fraction"] = m / (fabric.planes * SHAPED_BPS)
        else:
            out[f"{label}_mrcd_over_udp_blast"] = m / (out["udp_blast_gbps"] * 1e9)
        cpu = cpu_per_packet(stats[label], udp_stats)
        out |= {f"{label}_{k.removeprefix('unshaped_mrcd_')}": v for k, v in cpu.items()
                if k.startswith("unshaped_mrcd_")}  # fmt: skip
        out |= {f"{label}_{k}": v for k, v in stats[label].items()
                if k.startswith("retx_") or k.endswith("_rcvbuf_drops")}  # fmt: skip
        out |= {f"{label}_{k}": v for k, v in wait_figures(stats[label]).items()}
    out["after_over_before_goodput"] = out["after_mrcd_gbps"] / out["before_mrcd_gbps"]
    return out


#: Which side of a comparison runs from where: REV's exported tree, and this one (None).
Sides = tuple[tuple[str, Path | None], ...]


@contextmanager
def revision_bed(
    rev: str, fabric: Fabric, name: str, who: str
) -> Iterator[tuple[TestbedState, Sides, Path]]:
    """Testbed ``name`` up and revision ``rev`` exported beside it, for a comparison:
    (the testbed, the sides "before" (``rev``) and "after" (this tree) with the tree each
    runs from, a folder for the clusters' files); all removed on the way out."""
    with tempfile.TemporaryDirectory(prefix="mrcstack-before-") as tmp:
        old_tree = Path(tmp) / "tree"
        if not sim_bench.export(rev, old_tree):
            raise SystemExit(f"{who}: revision {rev!r} is not available here")
        testbed.clean(name)
        try:
            testbed.up(fabric, name)
            yield load(name), (("before", old_tree), ("after", None)), Path(tmp) / "cluster"
        finally:
            testbed.clean(name)


@contextmanager
def pythonpath(tree: Path | None) -> Iterator[None]:
    """Processes started meanwhile import mrcstack from ``tree`` (None: this tree).

    ``PYTHONSAFEPATH`` too: ``python -m`` (how the daemons start) otherwise puts the current
    directory first on ``sys.path``, and a bench run from the repository's root would
    import this tree's mrcstack on both sides."""
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", "PYTHONSAFEPATH")}
    if tree is not None:
        os.environ["PYTHONPATH"] = str(tree)
        os.environ["PYTHONSAFEPATH"] = "1"
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run() -> dict[str, float]:
    """Medians over ``MRC_BENCH_REPEAT`` interleaved rounds (mrcd, then each baseline, on the
    same testbed), ratios of the medians, and the mrcd counters summed over the rounds."""
    if os.geteuid() != 0:
        return {}
    duration, rounds = seconds(), repeat()
    out: dict[str, float] = {"seconds_per_run": duration, "rounds": float(rounds)}
    # 1: mrcd ran its per-packet modules compiled (mrcstack.native); 0: as Python.
    out["mrcd_compiled"] = float(sim_bench.runs_compiled(None))
    mrcd, udp, tcp = [], [], []
    formats: dict[str, list[float]] = {"srh": [], "stev": []}
    stats: dict[str, float] = {}
    udp_stats: dict[str, float] = {}
    with bed(Fabric(sid_format="classic"), UNSHAPED) as (state, cluster):
        for _ in range(rounds):
            set_format(cluster, "srv6")
            bps, more = mrcd_goodput(state, cluster, duration)
            mrcd.append(bps)
            _add(stats, more)
            for name, fmt in (("srh", "srv6-srh"), ("stev", "stev")):
                set_format(cluster, fmt)
                formats[name].append(mrcd_goodput(state, cluster, duration)[0])
            bps, more = udp_blast(state, duration)
            udp.append(bps)
            _add(udp_stats, more)
            tcp.append(tcp_flow(state, duration, state.baseline[f"h{DST}"][0])[0])
        set_format(cluster, "srv6")
    m, u, t = (statistics.median(x) for x in (mrcd, udp, tcp))
    srh, stev = (statistics.median(formats[k]) for k in ("srh", "stev"))
    out |= {  # the EV formats, in the same rounds: SRH and STEV go through a raw socket
        "unshaped_mrcd_srh_gbps": srh / 1e9,
        "unshaped_mrcd_stev_gbps": stev / 1e9,
        "unshaped_mrcd_srh_over_udp_blast": srh / u,
        "unshaped_mrcd_stev_over_udp_blast": stev / u,
        "unshaped_mrcd_srh_over_usid": srh / m,
        "unshaped_mrcd_stev_over_usid": stev / m,
    }
    out |= {
        "unshaped_mrcd_gbps": m / 1e9,
        "unshaped_mrcd_gbps_min": min(mrcd) / 1e9,
        "unshaped_mrcd_gbps_max": max(mrcd) / 1e9,
        "unshaped_udp_blast_gbps": u / 1e9,
        "unshaped_udp_blast_gbps_min": min(udp) / 1e9,
        "unshaped_udp_blast_gbps_max": max(udp) / 1e9,
        "unshaped_tcp_gbps": t / 1e9,
        "unshaped_tcp_gbps_min": min(tcp) / 1e9,
        "unshaped_tcp_gbps_max": max(tcp) / 1e9,
        "unshaped_mrcd_over_udp_blast": m / u,
        "unshaped_mrcd_over_tcp": m / t,
        "unshaped_udp_datagram_bytes": udp_stats["datagram_bytes"] / rounds,
        "unshaped_udp_blast_lost_fraction": 1 - udp_stats["received"] / udp_stats["sent"],
    }
    out |= {f"unshaped_mrcd_{k}": v for k, v in _counters_only(stats).items()}
    out |= {f"unshaped_mrcd_{k}": v for k, v in wait_figures(stats).items()}
    out |= cpu_per_packet(stats, udp_stats)
    shaped_fabric = shaped(Fabric())
    capacity = shaped_fabric.planes * SHAPED_BPS
    mrcd, mp, subflows = [], [], []
    stats = {}
    with bed(shaped_fabric, SHAPED) as (state, cluster):
        mptcp_setup(state)
        for _ in range(rounds):
            bps, more = mrcd_goodput(state, cluster, duration)
            mrcd.append(bps)
            _add(stats, more)
            to = state.baseline[f"h{DST}"][0]
            bps, sender = tcp_flow(state, duration, to, IPPROTO_MPTCP)
            subflows.append(mptcp_subflows(sender, shaped_fabric.planes))
            mp.append(bps)
    m, t = statistics.median(mrcd), statistics.median(mp)
    out |= {
        "shaped_capacity_mbps": capacity / 1e6,
        "shaped_mrcd_mbps": m / 1e6,
        "shaped_mrcd_mbps_min": min(mrcd) / 1e6,
        "shaped_mrcd_mbps_max": max(mrcd) / 1e6,
        "shaped_mptcp_mbps": t / 1e6,
        "shaped_mptcp_mbps_min": min(mp) / 1e6,
        "shaped_mptcp_mbps_max": max(mp) / 1e6,
        "shaped_mptcp_subflows": float(min(subflows)),
        "shaped_mrcd_fraction": m / capacity,
        "shaped_mptcp_fraction": t / capacity,
    }
    out |= {f"shaped_mrcd_{k}": v for k, v in _counters_only(stats).items()}
    out |= {f"shaped_mrcd_{k}": v for k, v in wait_figures(stats).items()}
    return out | workers.scaling(duration, rounds)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.daemon_bench", description=__doc__)
    p.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    p.add_argument("--bind", action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=5.0, help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=60.0, help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--proto", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--to", default="", help=argparse.SUPPRESS)
    p.add_argument("--testbed", default="", help=argparse.SUPPRESS)
    p.add_argument(
        "--against", metavar="REV", help="only mrcd at git revision REV vs this tree, alternating"
    )
    p.add_argument("--shaped", action="store_true", help="with --against: on the shaped fabric")
    p.add_argument(
        "--workers", action="store_true", help="only mrcd's goodput with 1 and 2 data-path workers"
    )
    args = p.parse_args(argv)
    if args.role:
        print(json.dumps(ROLES[args.role](args)), flush=True)
        return 0
    if os.geteuid() != 0:
        print("daemon bench: skipped (needs root for network namespaces)")
        return 0
    if args.shaped and not args.against:
        p.error("--shaped needs --against")
    if args.workers:
        results = workers.scaling(seconds(), repeat())
    else:
        results = compare(args.against, args.shaped) if args.against else run()
    for key, value in results.items():
        print(f"{key:<40} {value:14,.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
