"""One host cannot lock the others out of a daemon's control channel (live, as root).

h0 holds as many idle TCP connections to h3's control port as it can, reopening each the
moment it is cut, for the whole test.  Meanwhile h1, another host, connects a QP to h3 and
moves a verified write, five times: each must be done within 2 s of starting to connect.
Before the per-source limit, the idle timeout and the busy frame, h1 waited out the attack
(over 20 s).  The attacker itself is told busy, with a retry hint, not just cut off.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from mrcstack.api import WcStatus, WriteWr
from mrcstack.daemons.mrcd.config import CONTROL_PORT
from mrcstack.daemons.mrcd.control.records import BUSY
from mrcstack.fabric import Fabric
from mrcstack.netns.run import call_in_netns
from tests.support.programs import closing, connect, drain, open_end
from tests.support.testbeds import Bed, Testbeds

ATTACKER, VICTIM, TARGET = 0, 1, 3
HOLD = 128  # connections the attacker tries to keep open: the old global limit
RUNS = 5
BOUND_S = 2.0  # connect + a 1 MiB verified write, from another host, under attack
MIB = 1 << 20
pytestmark = pytest.mark.requires_root


@pytest.fixture(scope="module")
def bed(testbeds: Testbeds) -> Bed:
    return testbeds.up("ca", Fabric(), cluster=True, hosts=[ATTACKER, VICTIM, TARGET])


class Slowloris:
    """Idle connections from ``netns`` to ``address``: never a byte sent, each one the
    server ends is opened again at once."""

    def __init__(self, netns: str, address: str) -> None:
        self.netns, self.address = netns, address
        self.stop = threading.Event()
        self.opened = self.cut = self.told_busy = 0
        self.thread = threading.Thread(target=lambda: call_in_netns(netns, self._run))

    def _open(self) -> socket.socket | None:
        try:
            sock = socket.create_connection((self.address, CONTROL_PORT), timeout=1.0)
        except OSError:
            return None
        self.opened += 1
        return sock

    def _run(self) -> None:
        held: list[socket.socket] = []
        try:
            while not self.stop.is_set():
                while len(held) < HOLD and (sock := self._open()) is not None:
                    held.append(sock)
                readable, _, _ = select.select(held, [], [], 0.05)
                for sock in readable:
                    try:
                        said = sock.recv(64)
                    except OSError:
                        said = b""
                    self.cut += 1
                    self.told_busy += BUSY in said
                    sock.close()
                    held.remove(sock)
        finally:
            for sock in held:
                sock.close()

    def __enter__(self) -> Slowloris:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.fixture
def attack(bed: Bed) -> Iterator[Slowloris]:
    with Slowloris(bed.ns(ATTACKER), bed.state.mgmt[f"h{TARGET}"]) as attacker:
        deadline = time.monotonic() + 30
        while attacker.cut < HOLD and time.monotonic() < deadline:  # under way, and cut
            time.sleep(0.05)
        yield attacker


def test_another_host_gets_through_while_one_holds_connections(bed: Bed, attack: Slowloris) -> None:
    took: list[float] = []
    for run in range(RUNS):
        a, b = open_end(bed, VICTIM, MIB), open_end(bed, TARGET, MIB)
        with closing(a, b):
            payload = os.urandom(MIB)
            a.mr.buf[:] = payload
            start = time.monotonic()
            qa, _ = connect(a, b, TARGET)
            qa.post_send(WriteWr(run, (a.mr, 0, MIB), b.mr.addr, b.mr.rkey))
            [wc] = drain(a.cq, 1)
            took.append(time.monotonic() - start)
            assert wc.status is WcStatus.SUCCESS and bytes(b.mr.buf) == payload
    print(f"\nconnect + verified 1 MiB from h{VICTIM} under attack: "
          f"{', '.join(f'{t * 1e3:.0f}' for t in took)} ms; attacker opened {attack.opened}, "
          f"cut {attack.cut}, told busy {attack.told_busy}")  # fmt: skip
    assert max(took) < BOUND_S, took
    assert attack.told_busy > 0  # refused with the busy frame, not just closed
    bed.alive()
