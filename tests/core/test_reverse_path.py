"""The reverse EV set: the few EVs per plane that carry one end's ACKs, NACKs and probe
replies, used in turn, and refreshed when one of them breaks."""

from __future__ import annotations

import os
from collections import Counter

from mrcstack.core.connection import Datagram
from mrcstack.core.events import Event, EvState, EvStateChanged, SendCompleted, WcStatus
from mrcstack.wire import Opcode
from tests.support.pairnet import LinkFaults, PairNet

PLANES = 2
REVERSE = 2  # reverse EVs per plane


def receiver_acks(net: PairNet) -> list[tuple[float, int, int]]:
    """(time, port, EV) of every ACK or NACK the receiving end (side 1) hands out (not its
    probes: those go on assumed-bad EVs too, to resurrect them)."""
    log: list[tuple[float, int, int]] = []

    def on_send(side: int, d: Datagram, now: float) -> None:
        if side == 1 and d.data[0] == Opcode.RELIABILITY_SACK:
            log.append((now, d.port, d.ev))

    net.on_send = on_send
    return log


def write(net: PairNet, size: int) -> tuple[bytearray, bytes]:
    dst = bytearray(size)
    mr = net.mem[1].register(dst)
    data = os.urandom(size)
    net.conns[0].post_write(1, data, mr.va, mr.rkey, imm=1, now=net.now)
    net.run(net.now + 10.0, stop=lambda: any(isinstance(e, SendCompleted) for e in net.events[0]))
    assert [e for e in net.events[0] if isinstance(e, SendCompleted)] == [
        SendCompleted(1, WcStatus.SUCCESS, size)
    ]
    return dst, data


def test_acks_rotate_over_every_reverse_ev_of_each_plane() -> None:
    """Data alternates between the planes; each plane's ACKs must still use all of its
    reverse EVs (a rotation shared by all planes locked each plane onto one of them)."""
    net = PairNet(21, LinkFaults(), planes=PLANES, per_plane=4, reverse_evs_per_plane=REVERSE)
    log = receiver_acks(net)
    dst, data = write(net, 256 * 400)
    assert dst == data
    receiver = net.conns[1]
    for port in range(PLANES):
        reverse = {s.entry.value for s in receiver.evs.reverse_set(port, REVERSE)}
        assert len(reverse) == REVERSE
        used = Counter(ev for _, p, ev in log if p == port)
        assert set(used) == reverse
        # Used in turn: each carries about its share of the plane's ACKs.
        assert min(used.values()) >= 0.4 * sum(used.values()) / REVERSE


def test_broken_reverse_ev_is_demoted_by_probes_and_acks_move_to_the_same_plane() -> None:
    """Everything the receiver sends on one of its reverse EVs is lost (that direction of
    the path is broken; data the other way on the same EV value still arrives).  Its probes
    find out, the EV is demoted, its ACKs move to another EV of the same plane, and the
    transfer completes."""
    net = PairNet(22, LinkFaults(), planes=PLANES, per_plane=4, reverse_evs_per_plane=REVERSE)
    receiver = net.conns[1]
    broken = receiver.evs.reverse_set(0, REVERSE)[0].entry.value
    net.faults.one_way.append((0.0, 100.0, 1, broken))
    log = receiver_acks(net)
    demoted_at: list[float] = []

    def on_event(side: int, ev: Event) -> None:
        if side == 1 and isinstance(ev, EvStateChanged) and ev.ev == broken:
            assert ev.new is EvState.ASSUMED_BAD and ev.reason == "probes_lost"
            demoted_at.append(net.now)

    net.on_event = on_event
    dst, data = write(net, 256 * 8000)
    assert dst == data
    assert len(demoted_at) == 1 and receiver.evs.state(broken) is EvState.ASSUMED_BAD
    before = {ev for t, p, ev in log if p == 0 and t < demoted_at[0]}
    after = Counter(ev for t, p, ev in log if p == 0 and t > demoted_at[0])
    assert broken in before and broken not in after
    refreshed = {s.entry.value for s in receiver.evs.reverse_set(0, REVERSE)}
    assert broken not in refreshed and len(refreshed) == REVERSE
    assert set(after) == refreshed  # every ACK on plane 0 since uses the refreshed set
    assert all(ev >> 8 == 0 for ev in after)  # the same plane's EVs
