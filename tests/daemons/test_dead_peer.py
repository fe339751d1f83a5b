"""A peer that dies, live: mrcd on the namespace testbed, its process killed or its NICs down.

One default testbed (4 planes, 2 racks x 2 hosts) with mrcd on h0 and h3, built once for the
module and removed by exact name.  The programs use the application API over each daemon's
Unix socket, as in the system tests (tests/support/programs.py).

The acceptance bounds are the product's promises: after a SIGKILL of the receiver's mrcd
every outstanding write fails within 1 s (measured: a few milliseconds, the control channel
closes at once), and with every receiver NIC down the failure comes within the QP's retry
budget (measured: about a third of a second, through the port status and probes).  Both are
tens of times the measured figure, so a busy 2-core machine does not flake them.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from mrcstack.api import Controller, WcStatus, WorkCompletion, WriteWr
from mrcstack.daemons.mrcd.config import CONTROL_PORT
from mrcstack.fabric import Fabric
from tests.support.programs import WAIT, End, connect, drain, metric, open_end
from tests.support.testbeds import Bed, Testbeds

SRC, DST = 0, 3
MIB = 1 << 20
WRITES, WRITE = 16, 4 * MIB


@pytest.fixture(scope="module")
def bed(testbeds: Testbeds) -> Bed:
    return testbeds.up("dp", Fabric(), cluster=True, hosts=[SRC, DST])


@contextlib.contextmanager
def ends(bed: Bed) -> Iterator[tuple[End, End]]:
    a, b = open_end(bed, SRC, WRITES * WRITE), open_end(bed, DST, WRITES * WRITE)
    try:
        yield a, b
    finally:
        for e in (a, b):
            with contextlib.suppress(Exception):  # (the peer's mrcd may be gone)
                e.ctx.close()


def post_all(a: End, b: End) -> None:
    qa = a.qp
    for i in range(WRITES):
        qa.post_send(WriteWr(i, (a.mr, i * WRITE, WRITE), b.mr.addr + i * WRITE, b.mr.rkey))


def settle(a: End, done: list[WorkCompletion], t0: float) -> float:
    """Collect the rest of the completions; returns when the last one arrived after ``t0``."""
    done += drain(a.cq, WRITES - len(done))
    last = time.monotonic() - t0
    assert a.cq.poll_wait(1, timeout=0.5) == [], "a write completed twice"
    assert sorted(wc.wr_id for wc in done) == list(range(WRITES)), "each write exactly once"
    return last


def peer_failures(bed: Bed, signal: str) -> float:
    return metric(bed, SRC, "mrc_peer_failures_total", f'reason="{signal}"')


def test_a_control_channel_reset_fails_no_healthy_qp(bed: Bed) -> None:
    """Kill only the TCP connection between the daemons (``ss -K``, a socket destroy: both
    ends see a reset) in the middle of a transfer: they reconnect, find the same instance,
    and every write completes, verified."""
    ns = bed.ns(SRC)
    mgmt = bed.state.mgmt[f"h{DST}"]
    with ends(bed) as (a, b):
        connect(a, b, DST)
        payload = os.urandom(WRITES * WRITE)
        a.mr.buf[:] = payload
        post_all(a, b)
        done = drain(a.cq, 1)
        kill = subprocess.run(
            ["ip", "netns", "exec", ns, "ss", "-K", "dst", f"[{mgmt}]", "dport", "=",
             f":{CONTROL_PORT}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if kill.returncode != 0 or "ESTAB" not in kill.stdout:
            pytest.skip(f"cannot destroy a TCP socket here (CONFIG_INET_DIAG_DESTROY): "
                        f"{kill.stderr.strip() or kill.stdout.strip()}")  # fmt: skip
        settle(a, done, time.monotonic())
        assert all(wc.status is WcStatus.SUCCESS for wc in done), [wc.status for wc in done]
        assert b.mr.buf == payload
        deadline = time.monotonic() + WAIT
        while "event=peer_control_restored host=h3" not in bed.cluster.daemons[SRC].log.read_text():
            assert time.monotonic() < deadline, bed.cluster.tail(SRC)
            time.sleep(0.05)
        # A new write on the same QP still works.
        a.qp.post_send(WriteWr(99, (a.mr, 0, WRITE), b.mr.addr, b.mr.rkey))
        assert drain(a.cq, 1)[0].status is WcStatus.SUCCESS
    for signal in ("control_refused", "restarted", "unreachable", "ports_down", "silent"):
        assert peer_failures(bed, signal) == 0, signal


def test_every_receiver_nic_down_fails_the_qp_within_its_budget(bed: Bed) -> None:
    """The receiver's mrcd lives but every NIC of its host is down: its port status (over
    the control channel) and unanswered probes fail the sender's QP within the budget."""
    with ends(bed) as (a, b):
        qa, _qb = connect(a, b, DST)
        post_all(a, b)
        done = drain(a.cq, 1)
        with Controller.open(bed.cluster.daemons[SRC].api_socket) as ctl:
            budget = ctl.qps(qa.qpn)[0]["retry_budget"]
        t0 = time.monotonic()
        for plane in range(bed.state.fabric.planes):
            bed.faults.nic_down(f"h{DST}", plane)
        elapsed = settle(a, done, t0)
        print(f"\nall NICs of h{DST} down: last completion {elapsed * 1e3:.0f} ms later "
              f"(retry budget {budget * 1e3:.0f} ms)")  # fmt: skip
        errors = [wc for wc in done if wc.status is not WcStatus.SUCCESS]
        assert errors, "nothing failed"
        assert errors[0].status is WcStatus.RETRY_EXC_ERR
        assert all(wc.status is WcStatus.WR_FLUSH_ERR for wc in errors[1:])
        # Measured 0.34 s against 0.84 s: the bound leaves a busy 2-core machine room for
        # scheduling delays while still telling "within the budget" from "after an RTO chain".
        assert elapsed < 2 * budget, (elapsed, budget)
        # Whichever came first, the port status or a path's timeout, started the probes.
        found = peer_failures(bed, "ports_down") + peer_failures(bed, "silent")
        assert found == 1, bed.cluster.tail(SRC, 30)
        log = bed.cluster.daemons[SRC].log.read_text()
        assert f"event=peer_ports_all_down host=h{DST}" in log, bed.cluster.tail(SRC)
        bed.faults.restore_all()
        assert bed.cluster.daemons[DST].proc.poll() is None  # type: ignore[union-attr]


def test_sigkill_of_the_receivers_mrcd_fails_every_write_within_a_second(bed: Bed) -> None:
    """SIGKILL the receiver's mrcd mid-transfer: every outstanding write completes with an
    error within 1 s, each exactly once.  Then the same mrcd restarts on the same config and
    a new connection between the same hosts works, with nothing else restarted."""
    sender = bed.cluster.daemons[SRC].proc
    assert sender is not None
    with ends(bed) as (a, b):
        connect(a, b, DST)
        post_all(a, b)
        done = drain(a.cq, 1)
        t0 = time.monotonic()
        bed.cluster.kill(DST)
        elapsed = settle(a, done, t0)
        print(f"\nmrcd on h{DST} killed: last completion {elapsed * 1e3:.1f} ms later")
        errors = [wc for wc in done if wc.status is not WcStatus.SUCCESS]
        assert errors, "nothing failed"
        assert errors[0].status is WcStatus.RETRY_EXC_ERR
        assert all(wc.status is WcStatus.WR_FLUSH_ERR for wc in errors[1:])
        assert elapsed < 1.0
        assert peer_failures(bed, "control_refused") == 1

    bed.cluster.restart(DST)
    with ends(bed) as (a, b):
        connect(a, b, DST)
        payload = os.urandom(WRITES * WRITE)
        a.mr.buf[:] = payload
        post_all(a, b)
        assert all(wc.status is WcStatus.SUCCESS for wc in drain(a.cq, WRITES))
        assert b.mr.buf == payload
    assert sender.poll() is None and bed.cluster.daemons[SRC].proc is sender
