"""A port's state and addresses, set and read from inside this process.

A fault must take effect when it is asked for: an ``ip`` process per port costs a fork, an
exec and a namespace switch (3-7 ms each on a loaded 2-core machine, four of them for a link
down), time in which the transfer being measured shares the CPU with the fault harness.
Here a thread joins the namespace (:func:`~mrcstack.netns.run.call_in_netns`) and sets the
port's flags with one ``SIOCSIFFLAGS`` ioctl, as ``ip link set ... down`` does underneath;
the addresses come from the namespace's ``if_inet6`` table.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from pathlib import Path
from typing import Any

from mrcstack.netns.run import TestbedError, call_in_netns

#: <linux/sockios.h>, <net/if.h>, <linux/if_addr.h>
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
IFA_F_NODAD = 0x02
IPV6_ADDR_SCOPE_GLOBAL = 0x00
#: struct ifreq: the name, then a union whose first short is ifr_flags (40 bytes in all).
_IFREQ = struct.Struct("16sH22x")
#: The calling thread's view (``/proc/self/net`` is the main thread's namespace).
_IF_INET6 = Path("/proc/thread-self/net/if_inet6")


def set_link(netns: str, ifname: str, up: bool) -> None:
    """Bring port ``ifname`` of ``netns`` up or down (TestbedError naming it on failure)."""

    def body() -> None:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
            try:
                got = fcntl.ioctl(sock, SIOCGIFFLAGS, _IFREQ.pack(ifname.encode(), 0))
                flags = _IFREQ.unpack(got)[1]
                flags = flags | IFF_UP if up else flags & ~IFF_UP
                fcntl.ioctl(sock, SIOCSIFFLAGS, _IFREQ.pack(ifname.encode(), flags))
            except OSError as exc:
                what = "up" if up else "down"
                raise TestbedError(
                    f"set {netns}/{ifname} {what}: {exc.strerror or os.strerror(exc.errno or 0)}"
                ) from None

    call_in_netns(netns, body)


def ipv6_addresses(netns: str, ifname: str) -> list[dict[str, Any]]:
    """The IPv6 addresses a port loses when it goes down and must get back: global ones and
    the static link-local ones (``nodad``); the kernel regenerates its own link-local.
    Each is ``{"local": ..., "prefixlen": ..., "nodad": ...}``."""
    text = call_in_netns(netns, _IF_INET6.read_text)
    kept = []
    # Each line: address (32 hex digits), ifindex, prefix length, scope, flags, name (hex).
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 6 or fields[5] != ifname:
            continue
        scope, flags = int(fields[3], 16), int(fields[4], 16)
        nodad = bool(flags & IFA_F_NODAD)
        if scope == IPV6_ADDR_SCOPE_GLOBAL or nodad:
            local = ipaddress.IPv6Address(bytes.fromhex(fields[0])).compressed
            kept.append({"local": local, "prefixlen": int(fields[2], 16), "nodad": nodad})
    return kept
