"""The paper's figures, scaled down, asserted on the deterministic simulator.

Each test runs the real core over the simulated fabric (4 planes x 8 T1 at 100 Gbit/s
unless said otherwise) and asserts a figure; the numbers are deterministic for a seed, so
these are not timing tests.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from mrcstack.addrplan import canonical_link, ev_fields, path
from mrcstack.core.evs import EvTable
from mrcstack.fabric import Fabric
from mrcstack.sim import LinkFailure, NicDown, SimConfig, SimResult, SwitchFailure, run
from mrcstack.sim.config import ev_profile
from mrcstack.sim.network import WIRE_OVERHEAD_BYTES
from mrcstack.wire import CRC_TRAILER_LEN, DATA_HDR_LEN

FABRIC = Fabric(planes=4, racks=2, hosts_per_rack=2, t1_per_plane=8)
MIB = 1 << 20
RATE = 100e9
LINK_DELAY = 1e-6
#: One round trip h0 -> h3 -> h0: 4 links each way, propagation plus serialization of a full
#: data packet (4096 B payload, its MRC headers and trailer, 48 B IPv6+UDP).
RTT = 8 * (LINK_DELAY + (4096 + DATA_HDR_LEN + CRC_TRAILER_LEN + 48) * 8 / RATE)
MIN_RTO = 200e-6  # ConnectionConfig.timeout default


@cache
def sim(**kw: object) -> SimResult:
    cfg = SimConfig(fabric=FABRIC, bytes_per_flow=32 * MIB, seed=7, **kw)  # type: ignore[arg-type]
    result = run(cfg)
    assert result.verified, f"transfer did not verify: {kw}"
    return result


def test_four_planes_without_faults_reach_95_percent_of_capacity() -> None:
    r = sim()
    assert r.goodput_fraction >= 0.95
    assert r.retransmissions == {} or sum(r.retransmissions.values()) == 0
    low, high = min(r.per_plane_bytes), max(r.per_plane_bytes)
    assert high - low <= 8192  # planes exactly equally loaded, to a packet or two


def test_a_16mib_write_starts_at_line_rate() -> None:
    """No ramp: the transfer takes what serialization and one round trip force, no more.

    The first-principles floor on completion: the sender's plane with the most packets
    serializes them back to back, the last one crosses three more store-and-forward hops
    and four links, and its ACK four links back (its own serialization left out, so the
    floor is slightly low and the bound slightly generous).  Arrival ends at the receiver.
    """
    size = 16 * MIB
    r = run(SimConfig(fabric=FABRIC, bytes_per_flow=size, rate_bps=RATE, seed=7))
    assert r.verified and r.retransmissions == {}
    per_packet = (4096 + DATA_HDR_LEN + CRC_TRAILER_LEN + WIRE_OVERHEAD_BYTES) * 8 / RATE
    stream = -(-size // 4096 // FABRIC.planes) * per_packet
    arrival_floor = stream + 3 * per_packet + 4 * LINK_DELAY
    completion_floor = arrival_floor + 4 * LINK_DELAY
    bound = size * 8 / completion_floor / r.capacity_bps
    assert r.goodput_fraction <= bound  # the floor really is one
    assert r.goodput_fraction >= 0.999 * bound
    assert r.arrival_time_s <= 1.001 * arrival_floor
    assert r.arrival_fraction >= 0.95


def test_one_percent_loss_keeps_85_percent_of_lossless_goodput() -> None:
    lossless = sim().goodput_bps
    lossy = sim(loss=0.01)
    assert lossy.drops["loss"] > 100  # the loss really happened
    assert lossy.goodput_bps >= 0.85 * lossless


def sender_in_use(r: SimResult, src: int = 0, dst: int = 3) -> dict[int, str]:
    """Final state of every EV the sender had in use (at the start, or swapped in later)."""
    cfg = r.config
    table = EvTable(ev_profile(cfg, src, dst), FABRIC.planes, lambda _: None, ev_count=cfg.ev_count)
    final = {v: "good" for v, slot in table.slots.items() if slot.in_use}
    for e in r.events:
        if e.side == "sender" and (e.ev in final or e.new == "good"):
            final[e.ev] = e.new
    return final


def test_t0_t1_link_failure_costs_at_most_one_rto_and_a_few_rtts() -> None:
    base = sim()
    link = "p0:t0a-t1c"
    failed = sim(link_failures=(LinkFailure(link, 0.3e-3),))
    assert failed.drops["link_down"] > 0 and failed.events_truncated == 0
    extra = failed.completion_time_s - base.completion_time_s
    assert extra <= MIN_RTO + 5 * RTT
    # Every EV the sender had in use whose path crosses the dead link ends ASSUMED_BAD
    # (not only those that produced an event).
    final = sender_in_use(failed)
    crosses = canonical_link(link)
    dead = [
        ev for ev in final if crosses in path(FABRIC, 0, 3, ev_fields(ev).plane, ev).physical_links
    ]
    assert dead and all(final[ev] == "assumed_bad" for ev in dead)
    assert all(state != "assumed_bad" for ev, state in final.items() if ev not in dead)


def test_lossy_ev_is_replaced_at_once_and_bandwidth_stays_flat() -> None:
    """Fig 12-13: one EV drops 20% of its packets."""
    r = sim(ev_loss=((0x002, 0.2),), series_interval_s=50e-6)
    sender = [e for e in r.events if e.side == "sender"]
    bad = [e for e in sender if e.ev == 0x002 and e.new == "assumed_bad"]
    assert bad and bad[0].drop_count == 1  # turned inactive on its first loss
    backups = [e for e in sender if e.old == "unknown" and e.new == "good" and e.t_s == bad[0].t_s]
    assert backups and all(e.plane == 0 for e in backups)  # a backup from the same plane
    # Lost on it: the first loss, what was already in flight on it when that loss was seen
    # (one RTT of its share: 1 of the 24 EVs in use), and a probe that later tests it.
    in_flight = RATE * FABRIC.planes * RTT / 8 / 4096 / 24
    assert r.drops["ev_loss"] <= 1 + in_flight + 1
    middle = [b.goodput_bps for b in r.timeline[1:-1]]
    assert min(middle) >= 0.9 * max(middle)


def test_roce_like_single_path_is_far_slower_under_loss() -> None:
    """RoCE mode at 1% loss mostly runs out of retries (go-back-N resends the whole window
    per loss; 2-3 of 12 seeds finish 32 MiB): whether it finishes or not, it delivers far
    less than MRC, which always finishes."""
    mrc = sim(loss=0.01)
    roce = run(
        SimConfig(
            fabric=FABRIC, bytes_per_flow=32 * MIB, seed=7, loss=0.01, mode="roce", cc="fixed"
        )
    )
    assert roce.per_plane_bytes.count(0) == FABRIC.planes - 1  # one EV, one plane
    assert roce.goodput_bps < 0.2 * mrc.goodput_bps


def test_incast_is_resolved_by_trimming_and_nacks() -> None:
    r = run(
        SimConfig(
            fabric=FABRIC,
            pairs=((0, 3), (1, 3), (2, 3)),
            bytes_per_flow=4 * MIB,
            queue_bytes=256 * 1024,
            seed=3,
        )
    )
    assert r.verified
    assert r.trims > 0 and r.retransmissions.get("trim", 0) > 0
    assert r.retransmissions.get("timeout", 0) <= r.retransmissions["trim"] // 10


def test_same_seed_same_json_byte_for_byte() -> None:
    cfg = SimConfig(fabric=FABRIC, bytes_per_flow=2 * MIB, loss=0.02, seed=11)
    a = json.dumps(run(cfg).to_json(), sort_keys=True)
    b = json.dumps(run(cfg).to_json(), sort_keys=True)
    assert a == b


def test_a_t0_failure_is_carrier_loss_at_its_hosts_nics() -> None:
    """A T0 that fails takes its hosts' links with it, and a NIC sees that as link loss:
    the connections hear it at once (``port`` retransmissions, no timeout), the flow keeps
    three planes' worth, and the port comes back only when every cause has ended."""
    fabric = Fabric()
    base: dict[str, Any] = dict(
        fabric=fabric, pairs=((0, 2),), bytes_per_flow=32 << 20, rate_bps=10e9, seed=1
    )
    r = run(SimConfig(**base, switch_failures=(SwitchFailure("p1-t0a", 1e-3),)))
    assert r.verified
    assert r.retransmissions.get("timeout", 0) == 0 and r.retransmissions.get("port", 0) > 0
    downs = [e for e in r.port_events if e.side == "sender" and not e.remote]
    assert [(e.port, e.up, e.t_s) for e in downs] == [(1, False, 1e-3)]
    # Overlapping causes: the NIC is down 1-2 ms, the T0 1.5-3 ms: up again at 3 ms only.
    r = run(SimConfig(**base, nic_downs=(NicDown(0, 1, 1e-3, 2e-3),),
                      switch_failures=(SwitchFailure("p1-t0a", 1.5e-3, 3e-3),)))  # fmt: skip
    assert r.verified
    local = [(e.up, e.t_s) for e in r.port_events if e.side == "sender" and not e.remote]
    assert local == [(False, 1e-3), (True, 3e-3)]
