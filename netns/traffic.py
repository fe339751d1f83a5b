"""Tiny traffic tools for testbed tests: UDP senders and receivers, TCP, ICMPv6 echo.

Two ways to use them:

- in-process: :func:`netns_socket` creates a socket inside a namespace (a thread joins the
  namespace, creates the socket and leaves; the socket stays there), so one test process
  can send from every host and receive on every host with no ``ip netns exec`` at all;
- as a command inside a namespace: ``ip netns exec mrc-h0 python -m mrcstack.netns.traffic send
  --to ADDR --count N`` and ``... recv --port P --expect N``; both print one JSON object.

UDP checksums are zero on both sides (docs/linux.md, trap 2: after the last uSID shift the
receiver would check the checksum against the shifted address): ``UDP_NO_CHECK6_TX`` on the
sender, ``UDP_NO_CHECK6_RX`` on the receiver.  A payload starts with a 16-byte header
``MAGIC | stream (u32) | seq (u64)`` so that the receiver counts per (source, stream) and
spots duplicates; a datagram may be longer (``--size``) or cut short (a trimmed packet
keeps whatever prefix the switch left; it is counted under "short").
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mrcstack.netns.run import call_in_netns

UDP_NO_CHECK6_TX = 101
UDP_NO_CHECK6_RX = 102
MAGIC = b"MRCt"
HEADER = struct.Struct("!4sIQ")  # magic, stream, seq
DEFAULT_PORT = 4791  # RoCEv2's UDP port: tshark decodes what we send as RoCEv2
RCVBUF = 8 << 20
ECN_MASK = 0x3
ICMPV6_ECHO_REQUEST = 128
ICMPV6_ECHO_REPLY = 129


def netns_socket(
    netns: str | None, family: int = socket.AF_INET6, kind: int = socket.SOCK_DGRAM, proto: int = 0
) -> socket.socket:
    """A socket living in network namespace ``netns`` (the current one when None)."""
    if netns is None:
        return socket.socket(family, kind, proto)
    return call_in_netns(netns, lambda: socket.socket(family, kind, proto))


def udp_sender(netns: str | None = None, *, tclass: int | None = None) -> socket.socket:
    """An unbound UDP/IPv6 socket with zero checksums; ``tclass`` sets DSCP/ECN bits."""
    sock = netns_socket(netns)
    sock.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_TX, 1)
    if tclass is not None:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tclass)
    return sock


def udp_receiver(
    netns: str | None = None, port: int = DEFAULT_PORT, bind: str = "::"
) -> socket.socket:
    """A bound UDP/IPv6 socket that accepts zero checksums and reports each datagram's
    destination address (IPV6_RECVPKTINFO) and traffic class (IPV6_RECVTCLASS)."""
    sock = netns_socket(netns)
    sock.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVTCLASS, 1)
    try:
        sock.setsockopt(socket.SOL_SOCKET, 33, RCVBUF)  # SO_RCVBUFFORCE (root)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
    sock.bind((bind, port))
    return sock


def payload(stream: int, seq: int, size: int = HEADER.size) -> bytes:
    head = HEADER.pack(MAGIC, stream, seq)
    return head + bytes(max(0, size - len(head)))


@dataclass(frozen=True, slots=True)
class Datagram:
    data: bytes
    source: str
    destination: str  # the address the packet arrived at (after every uSID shift)
    tclass: int | None


def receive(sock: socket.socket, timeout: float) -> Datagram | None:
    """One datagram with its destination and traffic class, or None after ``timeout``."""
    ready, _, _ = select.select([sock], [], [], max(0.0, timeout))
    if not ready:
        return None
    data, ancillary, _flags, source = sock.recvmsg(65535, 256)
    destination, tclass = "", None
    for level, kind, value in ancillary:
        if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_PKTINFO:
            destination = socket.inet_ntop(socket.AF_INET6, value[:16])
        elif level == socket.IPPROTO_IPV6 and kind == socket.IPV6_TCLASS:
            tclass = int.from_bytes(value[:4], sys.byteorder)
    return Datagram(data, source[0], destination, tclass)


@dataclass
class Tally:
    """What a receiver saw: per (source, stream) counts, duplicates, lengths, ECN bits."""

    received: int = 0
    short: int = 0  # datagrams too short for our header (e.g. trimmed)
    foreign: int = 0  # datagrams without our magic
    streams: dict[str, dict[str, int]] = field(default_factory=dict)
    lengths: dict[int, int] = field(default_factory=dict)
    ecn: dict[int, int] = field(default_factory=dict)
    destinations: dict[str, int] = field(default_factory=dict)
    _seen: set[tuple[str, int, int]] = field(default_factory=set, repr=False)

    def add(self, dgram: Datagram) -> None:
        self.received += 1
        self.lengths[len(dgram.data)] = self.lengths.get(len(dgram.data), 0) + 1
        self.destinations[dgram.destination] = self.destinations.get(dgram.destination, 0) + 1
        if dgram.tclass is not None:
            bits = dgram.tclass & ECN_MASK
            self.ecn[bits] = self.ecn.get(bits, 0) + 1
        if len(dgram.data) < HEADER.size:
            self.short += 1
            return
        magic, stream, seq = HEADER.unpack_from(dgram.data)
        if magic != MAGIC:
            self.foreign += 1
            return
        key = f"{dgram.source}/{stream}"
        entry = self.streams.setdefault(key, {"count": 0, "duplicates": 0, "max_seq": -1})
        if (dgram.source, stream, seq) in self._seen:
            entry["duplicates"] += 1
            return
        self._seen.add((dgram.source, stream, seq))
        entry["count"] += 1
        entry["max_seq"] = max(entry["max_seq"], seq)

    def to_json(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "short": self.short,
            "foreign": self.foreign,
            "streams": self.streams,
            "lengths": {str(k): v for k, v in sorted(self.lengths.items())},
            "ecn": {str(k): v for k, v in sorted(self.ecn.items())},
            "destinations": self.destinations,
        }


def collect(sock: socket.socket, expect: int | None, timeout: float, idle: float) -> Tally:
    """Receive until ``expect`` datagrams arrived, ``timeout`` passed, or nothing came for
    ``idle`` seconds after the first one."""
    tally = Tally()
    deadline = time.monotonic() + timeout
    while expect is None or tally.received < expect:
        now = time.monotonic()
        wait = deadline - now if tally.received == 0 else min(idle, deadline - now)
        dgram = receive(sock, wait)
        if dgram is None:
            break
        tally.add(dgram)
    return tally


def send(
    sock: socket.socket,
    address: str,
    port: int,
    count: int,
    *,
    stream: int = 0,
    size: int = HEADER.size,
    pps: float | None = None,
) -> int:
    """Send ``count`` numbered datagrams; returns how many the kernel accepted."""
    sent = 0
    start = time.monotonic()
    for seq in range(count):
        if pps:
            delay = start + seq / pps - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        try:
            sock.sendto(payload(stream, seq, size), (address, port))
            sent += 1
        except (BlockingIOError, OSError):
            continue
    return sent


def ping(address: str, *, netns: str | None = None, timeout: float = 2.0) -> float | None:
    """One ICMPv6 echo; the round-trip time in seconds, or None without a reply."""
    sock = netns_socket(netns, socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
    with sock:
        ident = os.getpid() & 0xFFFF
        start = time.monotonic()
        request = struct.pack("!BBHHH", ICMPV6_ECHO_REQUEST, 0, 0, ident, 1) + b"mrcstack"
        sock.sendto(request, (address, 0))  # the kernel fills in the ICMPv6 checksum
        deadline = start + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([sock], [], [], left)
            if not ready:
                break
            data, source = sock.recvfrom(2048)
            if (
                data[0] == ICMPV6_ECHO_REPLY
                and data[4:6] == request[4:6]
                and (
                    socket.inet_pton(socket.AF_INET6, source[0].split("%")[0])
                    == socket.inet_pton(socket.AF_INET6, address)
                )
            ):
                return time.monotonic() - start
    return None


# Command line -------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mrcstack.netns.traffic", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("send", help="send numbered UDP datagrams")
    s.add_argument("--to", required=True, help="destination IPv6 address (a uSID path)")
    s.add_argument("--port", type=int, default=DEFAULT_PORT)
    s.add_argument("--count", type=int, default=1)
    s.add_argument("--size", type=int, default=HEADER.size, help="payload bytes")
    s.add_argument("--stream", type=int, default=0)
    s.add_argument("--tclass", type=lambda t: int(t, 0), help="traffic class, e.g. 0x02 (ECT0)")
    s.add_argument("--pps", type=float, help="pace to this many datagrams per second")
    r = sub.add_parser("recv", help="count UDP datagrams, print JSON")
    r.add_argument("--port", type=int, default=DEFAULT_PORT)
    r.add_argument("--bind", default="::")
    r.add_argument("--expect", type=int, help="stop after this many")
    r.add_argument("--timeout", type=float, default=5.0, help="seconds in all")
    r.add_argument("--idle", type=float, default=1.0, help="stop after this long with none")
    r.add_argument("--ready-file", help="create this file once bound")
    g = sub.add_parser("ping", help="one ICMPv6 echo; exit 1 without a reply")
    g.add_argument("address")
    g.add_argument("--timeout", type=float, default=2.0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "send":
        with udp_sender(tclass=args.tclass) as sock:
            sent = send(
                sock, args.to, args.port, args.count, stream=args.stream, size=args.size,
                pps=args.pps,
            )  # fmt: skip
        print(json.dumps({"sent": sent, "to": args.to, "port": args.port}))
        return 0 if sent == args.count else 1
    if args.command == "recv":
        with udp_receiver(port=args.port, bind=args.bind) as sock:
            if args.ready_file:
                with open(args.ready_file, "w", encoding="ascii"):
                    pass
            tally = collect(sock, args.expect, args.timeout, args.idle)
        print(json.dumps(tally.to_json(), sort_keys=True))
        return 0 if args.expect is None or tally.received >= args.expect else 1
    rtt = ping(args.address, timeout=args.timeout)
    print(json.dumps({"address": args.address, "rtt_ms": None if rtt is None else rtt * 1e3}))
    return 0 if rtt is not None else 1


if __name__ == "__main__":
    sys.exit(main())
