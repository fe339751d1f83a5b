"""The fabric model on its own: stub endpoints, a stub router and a stub trimmer.

Rates and delays are chosen so every expected time is exact arithmetic; the few tests that
use the real address plan and wire codec say so.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from mrcstack import addrplan, wire
from mrcstack.fabric import Fabric, letters
from mrcstack.sim.engine import Engine
from mrcstack.sim.network import (
    WIRE_OVERHEAD_BYTES,
    Handler,
    NetParams,
    Network,
    Router,
    _Packet,
)

RATE = 100e9
DELAY = 1e-6
SIZE = 1000  # wire bytes of the test packets
SER = SIZE * 8 / RATE  # 80 ns
DATA = 0xCA  # RDMA_WRITE_ONLY
ACK = 0xDC  # RELIABILITY_SACK
TRIM_MARK = b"TRIM"

Arrival = tuple[float, bytes, int, bool]  # time, data, plane, ecn


def stub_router(fabric: Fabric) -> Router:
    """T1 = ev % t1_per_plane; same-rack traffic turns at the T0."""

    def route(src: int, dst: int, plane: int, ev: int) -> Sequence[str]:
        a = f"t0{letters(src // fabric.hosts_per_rack)}"
        b = f"t0{letters(dst // fabric.hosts_per_rack)}"
        if a == b:
            return (f"p{plane}:h{src}-{a}", f"p{plane}:{a}-h{dst}")
        t1 = f"t1{letters(ev % fabric.t1_per_plane)}"
        return (
            f"p{plane}:h{src}-{a}",
            f"p{plane}:{a}-{t1}",
            f"p{plane}:{t1}-{b}",
            f"p{plane}:{b}-h{dst}",
        )

    return route


def stub_trim(data: bytes, lasthop: bool) -> tuple[bytes, int]:
    cut = data[:3] + TRIM_MARK + bytes([lasthop])
    return cut, len(cut)


def packet(src: int, seq: int, opcode: int = DATA, size: int = SIZE) -> bytes:
    """A datagram of ``size`` wire bytes, tagged with its sender and sequence number."""
    return bytes([opcode, src, seq % 256]) + bytes(size - WIRE_OVERHEAD_BYTES - 3)


class Rig:
    def __init__(
        self,
        fabric: Fabric | None = None,
        params: NetParams | None = None,
        seed: int = 1,
        real: bool = False,
        ev_loss_pairs: list[tuple[int, int]] | None = None,
    ) -> None:
        self.fabric = fabric or Fabric(planes=2, racks=2, hosts_per_rack=2, t1_per_plane=2)
        self.engine = Engine()
        self.net = Network(
            self.fabric,
            self.engine,
            random.Random(seed),
            params or NetParams(link_delay_s=DELAY, default_rate_bps=RATE),
            router=None if real else stub_router(self.fabric),
            trimmer=None if real else stub_trim,
            ev_loss_pairs=ev_loss_pairs,
        )
        self.inbox: dict[int, list[Arrival]] = {h: [] for h in range(self.fabric.hosts)}
        for host in range(self.fabric.hosts):
            self.net.attach(host, self._handler(host))

    def _handler(self, host: int) -> Handler:
        def deliver(data: bytes, size: int, plane: int, ecn: bool) -> None:
            assert size == len(data)
            self.inbox[host].append((self.engine.now, data, plane, ecn))

        return deliver

    def send_at(self, time: float, src: int, dst: int, plane: int, ev: int, data: bytes) -> None:
        self.engine.at(time, lambda _: self.net.send(src, dst, plane, ev, data))

    def run(self) -> None:
        self.engine.run(1.0)


def trimmed(data: bytes) -> bool:
    return data[3:7] == TRIM_MARK


# Timing ---------------------------------------------------------------------------------
def test_serialization_and_propagation_timing() -> None:
    rig = Rig()
    rig.net.send(0, 3, 0, 0, packet(0, 0))
    rig.net.send(0, 3, 0, 0, packet(0, 1))
    rig.run()
    (t0, *_), (t1, *_) = rig.inbox[3]
    assert t0 == pytest.approx(4 * SER + 4 * DELAY, rel=1e-12)
    assert t1 - t0 == pytest.approx(SER, rel=1e-9)  # store-and-forward pipelines at line rate


def test_same_rack_path_has_two_links() -> None:
    rig = Rig()
    rig.net.send(0, 1, 1, 0, packet(0, 0))
    rig.run()
    ((t, _, plane, _),) = rig.inbox[1]
    assert (t, plane) == (pytest.approx(2 * SER + 2 * DELAY), 1)


def test_queueing_two_senders_share_an_uplink() -> None:
    n = 20
    params = NetParams(link_delay_s=DELAY, default_rate_bps=RATE, trim=False)
    rig = Rig(params=params)
    for src in (0, 1):  # both via p0:t0a-t1a
        for k in range(n):
            rig.net.send(src, 2, 0, 0, packet(src, k))
    rig.run()
    times = [t for t, *_ in rig.inbox[2]]
    assert len(times) == 2 * n
    assert times[-1] == pytest.approx(2 * n * SER + 3 * SER + 4 * DELAY, rel=1e-9)
    counters = rig.net.stats().links["p0:t0a-t1a"]
    assert counters["max_queue_bytes"] == pytest.approx(n * SIZE, abs=1)
    assert counters["packets"] == 2 * n and counters["bytes"] == 2 * n * SIZE


def test_host_nic_never_drops() -> None:
    params = NetParams(link_delay_s=DELAY, default_rate_bps=RATE, queue_bytes=2 * SIZE)
    rig = Rig(fabric=Fabric(planes=1, racks=2, hosts_per_rack=1, queue_bytes=9000), params=params)
    for k in range(500):
        rig.net.send(0, 1, 0, 0, packet(0, k))
    rig.run()
    assert len(rig.inbox[1]) == 500  # a burst queues in the NIC, not in the fabric


# Tail drop, trimming, ECN ---------------------------------------------------------------
def test_tail_drop_without_trimming() -> None:
    queue = 9000
    params = NetParams(link_delay_s=DELAY, default_rate_bps=RATE, queue_bytes=queue, trim=False)
    rig = Rig(params=params)
    for src in (0, 1):
        for k in range(50):
            rig.net.send(src, 2, 0, 0, packet(src, k))
    rig.run()
    stats = rig.net.stats()
    got = rig.inbox[2]
    assert stats.drops["queue"] > 0 and stats.trims == 0
    assert len(got) + stats.drops["queue"] == 100
    assert not any(trimmed(d) for _, d, *_ in got)
    assert stats.links["p0:t0a-t1a"]["max_queue_bytes"] <= queue


def test_trimming_starts_at_the_threshold_with_no_lasthop_flag_on_fabric_ports() -> None:
    threshold = 3 * SIZE + 1
    params = NetParams(link_delay_s=DELAY, default_rate_bps=RATE, trim_threshold_bytes=threshold)
    rig = Rig(params=params)
    for src in (0, 1):
        for k in range(30):
            rig.net.send(src, 2, 0, 0, packet(src, k))
    rig.run()
    got = rig.inbox[2]
    assert len(got) == 60  # nothing dropped: over the threshold, data is trimmed
    cut = [d for _, d, *_ in got if trimmed(d)]
    assert cut and all(d[-1] == 0 for d in cut)  # p0:t0a-t1a faces a switch
    # Pairs arrive together; the k-th pair sees k and k+1 packets queued: the first packet
    # whose queue + size exceeds 3 packets + 1 byte is h1's third one (sequence 2).
    first = min(got, key=lambda a: (not trimmed(a[1]), a[0]))
    assert first[1][1:3] == bytes([1, 2])
    stats = rig.net.stats()
    assert stats.trims == len(cut) == stats.links["p0:t0a-t1a"]["trims"]
    assert stats.links["p0:t0a-t1a"]["max_queue_bytes"] <= threshold


def test_trimmed_header_leaves_at_priority() -> None:
    params = NetParams(link_delay_s=DELAY, default_rate_bps=RATE, trim_threshold_bytes=3 * SIZE + 1)
    rig = Rig(params=params)
    for src in (0, 1):
        for k in range(30):
            rig.net.send(src, 2, 0, 0, packet(src, k))
    rig.run()
    got = rig.inbox[2]
    index, (t, cut, *_) = next((i, a) for i, a in enumerate(got) if trimmed(a[1]))
    # h1's packet 2 reached the T0 at 3 SER + DELAY; from there each hop costs only its
    # own serialization, queued data or not.
    trim_ser = (len(cut) + WIRE_OVERHEAD_BYTES) * 8 / RATE
    assert cut[1:3] == bytes([1, 2])
    assert t == pytest.approx(3 * SER + 3 * trim_ser + 4 * DELAY, rel=1e-9)
    overtaken = [d for _, d, *_ in got[index + 1 :] if not trimmed(d) and d[2] <= cut[2]]
    assert overtaken  # data queued before the cut left after the trimmed header


def test_control_packets_leave_ahead_of_queued_data() -> None:
    """Strict priority for the control class, at the host NIC and at every switch port:
    an ACK sent behind 20 data packets arrives one serialization per hop after its own
    send, not after the data."""
    rig = Rig()
    for k in range(20):
        rig.net.send(0, 3, 0, 0, packet(0, k))
    rig.net.send(0, 3, 0, 0, packet(0, 99, opcode=ACK))
    rig.run()
    order = [d[0] for _, d, *_ in rig.inbox[3]]
    assert order.index(ACK) <= 1  # overtook (nearly) all the data queued at the NIC
    ((t_ack, *_),) = [a for a in rig.inbox[3] if a[1][0] == ACK]
    # Each hop: at most the packet already on the wire, then its own serialization.
    assert t_ack <= 4 * 2 * SER + 4 * DELAY + 1e-12


def test_only_data_is_trimmed_other_packets_tail_drop() -> None:
    params = NetParams(
        link_delay_s=DELAY, default_rate_bps=RATE, queue_bytes=4 * SIZE, trim_threshold_bytes=SIZE
    )
    rig = Rig(params=params)
    for src in (0, 1):
        for k in range(30):
            rig.net.send(src, 2, 0, 0, packet(src, k, opcode=ACK))
    rig.run()
    stats = rig.net.stats()
    assert stats.trims == 0 and stats.drops["queue"] > 0
    assert len(rig.inbox[2]) + stats.drops["queue"] == 60


def _incast(params: NetParams) -> Rig:
    """h0, h1, h2 (rack a) -> h4 (rack b), each over its own T1: only the last hop queues."""
    fabric = Fabric(planes=1, racks=2, hosts_per_rack=4, t1_per_plane=4)
    rig = Rig(fabric=fabric, params=params)
    for src in (0, 1, 2):
        for k in range(60):
            rig.net.send(src, 4, 0, src, packet(src, k))
    rig.run()
    return rig


def test_lasthop_trims_carry_the_flag_and_ecn_never_marks_a_host_port() -> None:
    params = NetParams(
        link_delay_s=DELAY,
        default_rate_bps=RATE,
        trim_threshold_bytes=20 * SIZE,
        ecn_kmin_bytes=SIZE,
        ecn_kmax_bytes=2 * SIZE,
    )
    rig = _incast(params)
    got = rig.inbox[4]
    cut = [d for _, d, *_ in got if trimmed(d)]
    assert len(got) == 180 and cut and all(d[-1] == 1 for d in cut)
    links = rig.net.stats().links
    assert links["p0:t0b-h4"]["max_queue_bytes"] > 2 * SIZE  # well over ECN kmax...
    assert sum(c["ecn_marks"] for c in links.values()) == 0  # ...yet never marked
    assert not any(ecn for *_, ecn in got)
    assert {n for n, c in links.items() if c["trims"]} == {"p0:t0b-h4"}


def test_ecn_marks_on_fabric_ports_follow_the_ramp() -> None:
    kmin, kmax = 2 * SIZE, 10 * SIZE
    params = NetParams(
        link_delay_s=DELAY,
        default_rate_bps=RATE,
        trim=False,
        ecn_kmin_bytes=kmin,
        ecn_kmax_bytes=kmax,
    )
    rig = Rig(params=params)
    for src in (0, 1):
        for k in range(40):
            rig.net.send(src, 2, 0, 0, packet(src, k))
    rig.run()
    got = rig.inbox[2]
    marked = [d for _, d, _, ecn in got if ecn]
    assert marked and len(marked) < len(got)
    # Packets of the first pairs see less than kmin queued: never marked.
    assert not any(d[2] < 2 for d in marked)
    # Once the queue exceeds kmax (from pair 10 on, both packets of a pair): always marked.
    assert all(ecn for _, d, _, ecn in got if d[2] >= 11)
    links = rig.net.stats().links
    assert links["p0:t0a-t1a"]["ecn_marks"] == len(marked)


def test_ack_packets_are_not_ecn_marked() -> None:
    params = NetParams(
        link_delay_s=DELAY, default_rate_bps=RATE, ecn_kmin_bytes=1, ecn_kmax_bytes=2
    )
    rig = Rig(params=params)
    for src in (0, 1):
        for k in range(20):
            rig.net.send(src, 2, 0, 0, packet(src, k, opcode=ACK))
    rig.run()
    assert rig.net.stats().ecn_marks == 0


# Faults ---------------------------------------------------------------------------------
def _binomial_ok(observed: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(observed - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


def test_random_loss_matches_its_probability() -> None:
    n, p = 20_000, 0.05
    rig = Rig(params=NetParams(link_delay_s=DELAY, default_rate_bps=RATE, loss=p), seed=11)
    for k in range(n):
        rig.net.send(0, 3, k % 2, k % 2, packet(0, k))
    rig.run()
    delivered = len(rig.inbox[3])
    assert _binomial_ok(delivered, n, (1 - p) ** 4)
    assert rig.net.stats().drops["loss"] == n - delivered


def test_link_loss_hits_only_that_link_in_both_directions() -> None:
    n = 4000
    params = NetParams(link_delay_s=DELAY, default_rate_bps=RATE, link_loss=(("p0:t1a-t0a", 0.2),))
    rig = Rig(params=params, seed=3)
    for k in range(n):
        rig.net.send(0, 3, 0, k % 2, packet(0, k))  # half via t1a, half via t1b
        rig.net.send(3, 0, 0, 0, packet(3, k))  # all via t1a, reverse direction
    rig.run()
    via_a = [d for _, d, *_ in rig.inbox[3] if d[2] % 2 == 0]
    via_b = [d for _, d, *_ in rig.inbox[3] if d[2] % 2 == 1]
    assert len(via_b) == n // 2
    assert _binomial_ok(len(via_a), n // 2, 0.8)
    assert _binomial_ok(len(rig.inbox[0]), n, 0.8)
    links = rig.net.stats().links
    assert {name for name, c in links.items() if c["drops_loss"]} == {"p0:t0a-t1a", "p0:t1a-t0a"}


def test_failed_link_drops_exactly_its_paths_packets_and_restores() -> None:
    rig = Rig()
    name = "p0:t1a-t0a"  # either direction's name fails the physical link
    rig.engine.at(1e-3, lambda _: rig.net.set_link(name, False))
    rig.engine.at(2e-3, lambda _: rig.net.set_link(name, True))
    for phase, start in enumerate((0.0, 1e-3, 2e-3)):
        for k in range(10):
            t = start + 1e-4 + k * 1e-6
            rig.send_at(t, 0, 3, 0, k % 2, packet(0, phase * 10 + k))  # even k via t1a
            rig.send_at(t, 3, 0, 0, 0, packet(3, phase * 10 + k))  # reverse, via t1a
            rig.send_at(t, 0, 3, 1, 0, packet(0, 100 + phase * 10 + k))  # plane 1: unaffected
    rig.run()
    fwd = {d[2] for _, d, plane, _ in rig.inbox[3] if plane == 0}
    back = {d[2] for _, d, *_ in rig.inbox[0]}
    lost_fwd = {10 + k for k in range(0, 10, 2)}
    assert fwd == set(range(30)) - lost_fwd
    assert back == set(range(30)) - set(range(10, 20))
    assert len([1 for *_, plane, _ in rig.inbox[3] if plane == 1]) == 30
    stats = rig.net.stats()
    assert stats.drops["link_down"] == 15
    assert stats.links["p0:t0a-t1a"]["drops_down"] == 5
    assert stats.links["p0:t1a-t0a"]["drops_down"] == 10


def test_switch_failure_takes_all_its_links_and_failures_nest() -> None:
    rig = Rig()
    rig.net.set_switch("p0-t1b", False)
    rig.net.set_link("p0:t0a-t1b", False)
    rig.net.set_switch("p0-t1b", True)  # the link failure still holds
    for k in range(4):
        rig.net.send(0, 3, 0, k % 2, packet(0, k))
    rig.net.send(3, 1, 0, 1, packet(3, 9))  # t0b -> t1b is back up, t1b -> t0a is not
    rig.run()
    assert sorted(d[2] for _, d, *_ in rig.inbox[3]) == [0, 2]
    assert rig.inbox[1] == []
    with pytest.raises(ValueError, match="no switch"):
        rig.net.switch_links("h0")


def test_ev_loss_applies_to_listed_pairs_only() -> None:
    n = 2000
    params = NetParams(link_delay_s=DELAY, default_rate_bps=RATE, ev_loss=((5, 0.25),))
    rig = Rig(params=params, ev_loss_pairs=[(0, 3)], seed=5)
    for k in range(n):
        rig.net.send(0, 3, 0, 5, packet(0, k))
        rig.net.send(0, 3, 0, 6, packet(1, k))  # another EV, same T1 pair of hops
        rig.net.send(3, 0, 0, 5, packet(3, k))  # the reverse direction
    rig.run()
    ev5 = [d for _, d, *_ in rig.inbox[3] if d[1] == 0]
    assert _binomial_ok(len(ev5), n, 0.75)
    assert len([d for _, d, *_ in rig.inbox[3] if d[1] == 1]) == n
    assert len(rig.inbox[0]) == n
    assert rig.net.stats().drops["ev_loss"] == n - len(ev5)


# Determinism, validation, real components -----------------------------------------------
def _lossy_run(seed: int) -> list[Arrival]:
    params = NetParams(
        link_delay_s=DELAY,
        default_rate_bps=RATE,
        loss=0.02,
        trim_threshold_bytes=8 * SIZE,
        ecn_kmin_bytes=SIZE,
        ecn_kmax_bytes=6 * SIZE,
    )
    rig = Rig(params=params, seed=seed)
    for k in range(300):
        for src in (0, 1):
            rig.net.send(src, 2 + k % 2, k % 2, k % 3, packet(src, k))
    rig.run()
    return rig.inbox[2] + rig.inbox[3]


def test_same_seed_same_run_other_seed_differs() -> None:
    assert _lossy_run(7) == _lossy_run(7)
    assert _lossy_run(7) != _lossy_run(8)


def test_parameter_and_route_checks() -> None:
    fabric = Fabric(planes=1)
    with pytest.raises(ValueError, match="exceeds the queue"):
        NetParams(queue_bytes=10_000, trim_threshold_bytes=20_000).thresholds(fabric)
    with pytest.raises(ValueError, match="probability"):
        NetParams(loss=1.5)
    with pytest.raises(ValueError, match="no link"):
        Network(fabric, Engine(), random.Random(0), NetParams(link_loss=(("p0:t0a-t1z", 0.1),)))
    net = Network(fabric, Engine(), random.Random(0), router=lambda *_: ("p0:h0-t0z",))
    with pytest.raises(ValueError, match="unknown link"):
        net.send(0, 3, 0, 0, packet(0, 0))


def test_engine_runs_same_time_events_in_order_and_stops() -> None:
    engine = Engine()
    seen: list[int] = []
    for i in range(5):
        engine.at(1.0, seen.append, i)
    engine.at(0.5, lambda _: engine.stop())
    engine.at(2.0, seen.append, 99)
    assert engine.run(10.0) is True and seen == [] and engine.now == 0.5
    assert engine.run(1.5) is False and seen == [0, 1, 2, 3, 4] and engine.now == 1.5
    engine.at(0.0, seen.append, 7)  # the past is clamped to now
    assert engine.run(10.0) is False and seen[-2:] == [7, 99]


def test_real_address_plan_routes_every_path() -> None:
    fabric = Fabric(planes=2, racks=3, hosts_per_rack=2, t1_per_plane=3)
    net = Network(fabric, Engine(), random.Random(0))
    for src in range(fabric.hosts):
        for dst in range(fabric.hosts):
            if src != dst:
                for path in addrplan.paths(fabric, src, dst):
                    links = net.route(src, dst, path.plane, path.ev)
                    assert tuple(link.name for link in links) == path.links
    assert sorted(net.physical) == sorted(addrplan.fabric_links(fabric))


def test_real_trimmer_marks_lasthop_only_on_host_ports() -> None:
    fabric = Fabric(planes=1, racks=2, hosts_per_rack=4, t1_per_plane=4)
    params = NetParams(link_delay_s=DELAY, default_rate_bps=RATE, trim_threshold_bytes=8 * SIZE)
    rig = Rig(fabric=fabric, params=params, real=True)
    crc = wire.CrcIntegrity()
    for src in (0, 1, 2):
        for k in range(40):
            pkt = wire.DataPacket(
                qpn=7,
                psn=k,
                va=0,
                rkey=1,
                payload=bytes(4096),
                ev=addrplan.ev_value(0, src),
                port=0,
                tx_seq=k,
                ts_ns=0,
            )
            rig.net.send(src, 4, 0, pkt.ev, wire.encode(pkt, crc))
    rig.run()
    decoded = [wire.decode(d, crc) for _, d, *_ in rig.inbox[4]]
    cut = [p for p in decoded if isinstance(p, wire.DataPacket) and p.trimmed]
    assert len(decoded) == 120 and cut
    assert all(p.flags & wire.DataFlags.TRIM_LASTHOP for p in cut)


def test_a_packet_sent_is_what_its_constructor_would_make(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``send`` fills each packet field by field (no constructor call): it must come out as
    ``_Packet``'s own constructor would build it."""
    rig = Rig()
    first: list[dict[str, object]] = []
    forward = rig.net._forward

    def capture(pkt: _Packet) -> None:
        first.append({name: getattr(pkt, name) for name in _Packet.__slots__})
        forward(pkt)

    monkeypatch.setattr(rig.net, "_forward", capture)
    rig.engine.at(1e-6, lambda _: rig.net.send(0, 3, 0, 0, packet(0, 0)))
    rig.run()
    got = first[0]
    args = ("msg", "size", "is_data", "route", "dst", "plane", "doomed", "sent_at", "src")
    ref = _Packet(*(got[name] for name in args))
    assert {name: getattr(ref, name) for name in _Packet.__slots__} == got
    assert got["sent_at"] == 1e-6 and got["hop"] == 0 and got["src"] == 0
