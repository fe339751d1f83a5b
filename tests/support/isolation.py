"""What keeps concurrent test runs (other worktrees, CI) apart: testbed names of their own
and loopback ports that are free.

A fixed testbed name, or a port derived from the process id, lets two runs build, clean or
bind each other's: each run draws a random name, and probes for ports nobody holds.
"""

from __future__ import annotations

import contextlib
import random
import secrets
import socket
import string
from collections.abc import Iterable
from pathlib import Path

from mrcstack.daemons.mrcd.node.addresses import PORT_STRIDE

#: Testbed names are [a-z][a-z0-9]{0,5}.
NAME_LENGTH = 6
#: Loopback mrcds: host h listens for its control channel (TCP) on base + this + h.
CONTROL_OFFSET = 500
#: The lowest base port handed out (well above the privileged and the well-known ones).
LOWEST_BASE = 10000


def run_name(prefix: str) -> str:
    """A testbed name for this run: ``prefix`` and random lowercase letters or digits."""
    alphabet = string.ascii_lowercase + string.digits
    return prefix + "".join(secrets.choice(alphabet) for _ in range(NAME_LENGTH - len(prefix)))


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (clients' ports come from there)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_base(hosts: Iterable[int], planes: int) -> int:
    """A base port for loopback mrcds: for each host, its data ports (UDP, ``base +
    PORT_STRIDE * host + plane``, mrcd's loopback layout) and its control port (TCP,
    :func:`control_port`) on ::1 are all free now, and below the ephemeral range, so no
    client socket takes one later."""
    return free_bases(1, hosts, planes)[0]


def free_bases(count: int, hosts: Iterable[int], planes: int) -> tuple[int, ...]:
    """``count`` bases as :func:`free_base` draws them, whose ports are also apart from one
    another: each is drawn while the ports of those before it are still held, so two
    layouts meant to run side by side (an mrcd's data ports and its probe ports) cannot
    share a port, as two separate draws could."""
    hosts = tuple(hosts)
    wanted = [(socket.SOCK_DGRAM, PORT_STRIDE * h + p) for h in hosts for p in range(planes)]
    wanted += [(socket.SOCK_STREAM, CONTROL_OFFSET + h) for h in hosts]
    span = max(offset for _, offset in wanted) + 1
    rng = random.Random()
    bases: list[int] = []
    with contextlib.ExitStack() as held:
        while len(bases) < count:
            base = rng.randrange(LOWEST_BASE, _ephemeral_low() - span)
            try:
                with contextlib.ExitStack() as stack:
                    for kind, offset in wanted:
                        sock = stack.enter_context(socket.socket(socket.AF_INET6, kind))
                        sock.bind(("::1", base + offset))
                    held.enter_context(stack.pop_all())
            except OSError:
                continue
            bases.append(base)
    return tuple(bases)


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` (IPv4) that is free now and below the ephemeral range: a port
    the kernel hands out (bind to 0) can go to any client's connect before the test's
    server binds it."""
    rng = random.Random()
    while True:
        port = rng.randrange(LOWEST_BASE, _ephemeral_low())
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        return port


def control_port(base: int, host: int) -> int:
    """Host ``host``'s control port for a :func:`free_base` ``base``."""
    return base + CONTROL_OFFSET + host
