"""The connection's public EV controls (what a controller does at runtime through mrcd):
deny, allow and replace EVs, change ev_min_active, read EV states, observe RTT samples."""

from __future__ import annotations

import os

import pytest

from mrcstack.core.connection import Datagram
from mrcstack.core.events import EvState, EvStateChanged, SendCompleted, WcStatus
from mrcstack.core.evs import EvEntry, EvSignal, EvStatus
from mrcstack.core.reasons import EvReason
from mrcstack.errors import LocalError
from mrcstack.wire import WRITE_OPCODES
from tests.support.pairnet import LinkFaults, PairNet

DATA = WRITE_OPCODES


def data_evs(net: PairNet) -> list[tuple[float, int]]:
    """(time, EV) of every data packet the sender (side 0) hands out."""
    log: list[tuple[float, int]] = []

    def on_send(side: int, d: Datagram, now: float) -> None:
        if side == 0 and d.data[0] in DATA:
            log.append((now, d.ev))

    net.on_send = on_send
    return log


def transfer(net: PairNet, size: int, wr_id: int = 1) -> None:
    dst = bytearray(size)
    mr = net.mem[1].register(dst)
    data = os.urandom(size)
    net.conns[0].post_write(wr_id, data, mr.va, mr.rkey, imm=1, now=net.now)

    def done() -> bool:
        return any(isinstance(e, SendCompleted) and e.wr_id == wr_id for e in net.events[0])

    net.run(net.now + 5.0, stop=done)
    completed = [e for e in net.events[0] if isinstance(e, SendCompleted) and e.wr_id == wr_id]
    assert completed == [SendCompleted(wr_id, WcStatus.SUCCESS, size)] and dst == data


def changes(net: PairNet, ev: int) -> list[tuple[EvState, EvState, str]]:
    return [
        (e.old, e.new, e.reason)
        for e in net.events[0]
        if isinstance(e, EvStateChanged) and e.ev == ev
    ]


def test_deny_and_allow_at_runtime() -> None:
    net = PairNet(41, LinkFaults(), planes=2, per_plane=4)  # 3 in use + 1 backup per plane
    sender = net.conns[0]
    log = data_evs(net)
    denied = [0x000, 0x101]
    assert sender.deny_evs([*denied, 0x7777], now=0.0) == 2  # unknown EVs are ignored
    assert sender.deny_evs(denied, now=0.0) == 0  # already denied
    net.kick()  # the adapter drains events and transmits after a call
    states = {s.value: s for s in sender.ev_states()}
    assert all(states[v].state is EvState.DENIED and not states[v].in_use for v in denied)
    assert states[0x003].in_use and states[0x103].in_use  # each plane's backup took over
    assert changes(net, 0x000) == [(EvState.GOOD, EvState.DENIED, "controller")]
    transfer(net, 256 * 400)
    assert not {ev for _, ev in log} & set(denied)
    # Allowed EVs come back ASSUMED_BAD and must pass probes before they carry data again.
    assert sender.allow_evs(denied, now=net.now, reason=EvReason.DENYLIST) == 2
    assert all(sender.evs.state(v) is EvState.ASSUMED_BAD for v in denied)
    transfer(net, 256 * 2000, wr_id=2)
    assert changes(net, 0x000)[1:] == [
        (EvState.DENIED, EvState.ASSUMED_BAD, "denylist"),
        (EvState.ASSUMED_BAD, EvState.UNKNOWN, "probes_ok"),  # healthy: back to the backups
    ]


def test_replace_an_ev_in_use() -> None:
    net = PairNet(42, LinkFaults(), planes=2, per_plane=2)  # 1 in use + 1 backup per plane
    sender = net.conns[0]
    log = data_evs(net)
    transfer(net, 256 * 100)
    assert {ev for _, ev in log} == {0x000, 0x100}
    replaced_at = net.now
    sender.replace_ev(0x000, EvEntry(0x0AB, 0))
    net.kick()
    assert changes(net, 0x000) == [(EvState.GOOD, EvState.UNKNOWN, "controller")]
    assert [(s.value, s.state, s.in_use) for s in sender.ev_states()][:2] == [
        (0x0AB, EvState.GOOD, True),  # the new EV took the old one's place, in use at once
        (0x001, EvState.UNKNOWN, False),  # the plane's backup stays a backup
    ]
    transfer(net, 256 * 100, wr_id=2)
    assert {ev for t, ev in log if t >= replaced_at} == {0x0AB, 0x100}
    with pytest.raises(LocalError, match="not in this EV set"):
        sender.replace_ev(0x000, EvEntry(0x0AC, 0))
    with pytest.raises(LocalError, match="already in this EV set"):
        sender.replace_ev(0x0AB, EvEntry(0x001, 0))
    with pytest.raises(LocalError, match="on port 1"):
        sender.replace_ev(0x0AB, EvEntry(0x1AB, 1))
    with pytest.raises(LocalError, match="32-bit"):
        sender.replace_ev(0x0AB, EvEntry(1 << 32, 0))
    with pytest.raises(LocalError, match="not an EvReason"):
        sender.replace_ev(0x0AB, EvEntry(0x0AC, 0), reason="operator")  # type: ignore[arg-type]


def test_replace_a_backup_keeps_it_a_backup() -> None:
    net = PairNet(43, LinkFaults(), planes=1, per_plane=4)
    sender = net.conns[0]
    sender.replace_ev(0x003, EvEntry(0x033, 0))
    net.kick()
    assert EvStatus(0x033, 0, EvState.UNKNOWN, False, 0) in sender.ev_states()
    assert not [e for e in net.events[0] if isinstance(e, EvStateChanged)]  # no state moved


def test_ev_min_active_changes_online() -> None:
    net = PairNet(44, LinkFaults(), planes=1, per_plane=3)  # 2 in use + 1 backup
    sender = net.conns[0]
    with pytest.raises(LocalError):
        sender.set_ev_min_active(-1)
    sender.set_ev_min_active(2)
    assert sender.ev_min_active == 2
    assert sender.evs.apply(0x000, EvSignal.TIMEOUT, EvReason.RTO)  # the backup replaces it
    assert not sender.evs.apply(0x001, EvSignal.TIMEOUT, EvReason.RTO)  # would leave one usable EV
    sender.set_ev_min_active(1)
    assert sender.evs.apply(0x001, EvSignal.TIMEOUT, EvReason.RTO)


def test_rtt_samples_reach_the_callback() -> None:
    net = PairNet(45, LinkFaults(delay=20e-6), planes=2, per_plane=2)
    samples: list[float] = []
    net.conns[0].on_rtt = samples.append
    assert net.conns[0].on_rtt == samples.append
    transfer(net, 256 * 50)
    assert len(samples) == net.conns[0].stats.rtt_samples > 0
    # Two one-way delays at least (less the 1 ns a packet sent at t=0 says it left at).
    assert all(40e-6 - 1e-9 <= rtt < 1e-3 for rtt in samples)
    net.conns[0].on_rtt = None
    before = len(samples)
    transfer(net, 256 * 50, wr_id=2)
    assert len(samples) == before
