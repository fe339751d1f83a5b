"""How to send SRv6 with an SRH from user space, decided by measurement.

The ``srv6-srh`` EV format needs a segment routing header per path.  The kernel cannot take
one per packet (``sendmsg`` control message: EINVAL; docs/linux.md), which leaves two ways:

- **sticky**: one UDP socket per (plane, EV) with the SRH set once by
  ``setsockopt(IPV6_RTHDR)``; then ``sendto`` to the final destination.  The kernel builds
  the IPv6 header and the SRH and computes a correct UDP checksum.
- **raw**: one raw IPv6 socket (IPPROTO_RAW) per plane, and a header (IPv6 + SRH + UDP)
  made once per path; per packet two length fields and one ``sendmsg`` of header and
  payload (what mrcd does).

Both send the same 4 KiB datagrams from h0 to h3 of a classic-SID testbed over the four
paths of plane 0 for ``MRC_BENCH_SECONDS`` each, next to plain SRv6 uSID ``sendto`` (no
header of ours), while h3 counts what arrives.  Run: ``python -m bench.srh_bench`` (root).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from mrcstack import addrplan
from mrcstack.daemons.mrcd.datapath.routes import raw_route, srh
from mrcstack.daemons.mrcd.datapath.transport import send_route
from mrcstack.fabric import Fabric
from mrcstack.netns import testbed
from mrcstack.netns.run import call_in_netns
from mrcstack.netns.state import TestbedState, exists, load
from mrcstack.wire import EvFormat

NAME = "sbh"
PORT = 4795  # not mrcd's: nothing else listens here
PAYLOAD = bytes(4096)
IPV6_RTHDR = 57  # <linux/in6.h>: sticky routing header of a socket
UDP_NO_CHECK6_TX, UDP_NO_CHECK6_RX = 101, 102


def seconds() -> float:
    return float(os.environ.get("MRC_BENCH_SECONDS", "2"))


def _srh_bytes(fabric: Fabric, ev: int) -> bytes:
    """The SRH alone, as mrcd builds it, for setsockopt(IPV6_RTHDR)."""
    return bytes(srh(fabric, 0, 3, 0, ev))


def _receiver(state: TestbedState, stop: threading.Event, got: list[int]) -> threading.Thread:
    addr = str(addrplan.nic_sid(state.fabric, 0, 3))
    sock = call_in_netns(state.ns("h3"), lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
    sock.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    sock.bind((addr, PORT))
    sock.settimeout(0.1)
    buf = bytearray(65536)

    def drain() -> None:
        with sock:
            while not stop.is_set():
                try:
                    sock.recv_into(buf)
                    got[0] += 1
                except TimeoutError:
                    continue

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    return t


def _timed(send: Any, duration: float) -> tuple[int, float]:
    """Call ``send(i)`` for ``duration`` s; (packets sent, seconds)."""
    n = 0
    start = time.perf_counter()
    end = start + duration
    while time.perf_counter() < end:
        for _ in range(64):
            try:
                send(n)
                n += 1
            except BlockingIOError:
                time.sleep(0)
    return n, time.perf_counter() - start


def _measure(state: TestbedState, how: str, duration: float) -> dict[str, float]:
    fabric = state.fabric
    evs = [addrplan.ev_value(0, t1) for t1 in range(fabric.t1_per_plane)]
    src = str(addrplan.nic_sid(fabric, 0, 0))
    dst = str(addrplan.nic_sid(fabric, 0, 3))
    new = socket.socket
    if how == "raw":
        sock = call_in_netns(
            state.ns("h0"), lambda: new(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
        )
        routes = [raw_route(fabric, 0, 3, 0, ev, EvFormat.SRV6_SRH, PORT) for ev in evs]
        socks = [sock]

        def send(i: int) -> None:
            send_route(sock, PAYLOAD, routes[i % len(routes)])
    else:
        socks = []
        for ev in evs:
            s = call_in_netns(state.ns("h0"), lambda: new(socket.AF_INET6, socket.SOCK_DGRAM))
            s.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_TX, 1)
            s.bind((src, 0))
            if how == "sticky":
                s.setsockopt(socket.IPPROTO_IPV6, IPV6_RTHDR, _srh_bytes(fabric, ev))
            socks.append(s)
        targets = (
            [(dst, PORT)] * len(evs)
            if how == "sticky"
            else [(str(addrplan.address(fabric, 0, 3, 0, ev)), PORT) for ev in evs]
        )

        def send(i: int) -> None:
            k = i % len(socks)
            socks[k].sendto(PAYLOAD, targets[k])

    stop, got = threading.Event(), [0]
    reader = _receiver(state, stop, got)
    try:
        time.sleep(0.05)
        sent, took = _timed(send, duration)
        time.sleep(0.2)
    finally:
        stop.set()
        reader.join(5)
        for s in socks:
            s.close()
    return {"sent_pps": sent / took, "received_pps": got[0] / took}


def run() -> dict[str, float]:
    if os.geteuid() != 0:
        return {}
    if exists(NAME):
        testbed.clean(NAME)
    out: dict[str, float] = {}
    try:
        testbed.up(Fabric(planes=1, racks=2, hosts_per_rack=2, sid_format="classic"), NAME)
        state = load(NAME)
        for how in ("usid", "raw", "sticky"):
            for key, value in _measure(state, how, seconds()).items():
                out[f"{how}_{key}"] = value
    finally:
        testbed.clean(NAME)
    out["raw_over_usid"] = out["raw_received_pps"] / out["usid_received_pps"]
    out["sticky_over_usid"] = out["sticky_received_pps"] / out["usid_received_pps"]
    out["raw_over_sticky"] = out["raw_received_pps"] / out["sticky_received_pps"]
    return out


if __name__ == "__main__":
    for key, value in run().items():
        print(f"{key:<40} {value:14,.3f}")
