"""Flow specs and the scenario knobs built on them: start times, flows waiting for flows,
collectives as steps, pinned EVs and planes, whole-plane faults, loss that changes over
time, ECN on the last hop, per-packet latency samples and the incast metrics.

Each test runs the real core over the simulated fabric (deterministic for a seed)."""

from __future__ import annotations

import threading

import pytest

from mrcstack.addrplan import ev_value
from mrcstack.fabric import Fabric
from mrcstack.sim import (
    FlowSpec,
    LossChange,
    NicDown,
    PlaneFailure,
    SimConfig,
    SimResult,
    run,
)
from mrcstack.sim.collectives import ring_steps, with_qps
from mrcstack.sim.network import WIRE_OVERHEAD_BYTES

FABRIC = Fabric(planes=4, racks=2, hosts_per_rack=2, t1_per_plane=4)
RATE = 10e9
KIB, MIB = 1 << 10, 1 << 20
DELAY = 1e-6


def sim(**kw: object) -> SimResult:
    kw.setdefault("fabric", FABRIC)
    kw.setdefault("bytes_per_flow", 512 * KIB)
    return run(SimConfig(rate_bps=RATE, seed=3, **kw))  # type: ignore[arg-type]


def test_a_flow_starts_at_its_start_time() -> None:
    r = sim(flow_specs=(FlowSpec(0, 2), FlowSpec(1, 3, start_s=1e-3)))
    assert r.verified
    early, late = r.flows
    assert early.start_time_s == 0.0
    assert late.start_time_s == pytest.approx(1e-3)
    assert late.completion_time_s is not None and late.fct_s is not None
    assert late.completion_time_s == pytest.approx(late.start_time_s + late.fct_s)
    assert late.goodput_bps == pytest.approx(late.bytes * 8 / late.fct_s)


def test_a_flow_waits_for_every_flow_it_names() -> None:
    specs = (FlowSpec(0, 2), FlowSpec(1, 3, bytes=64 * KIB), FlowSpec(2, 1, after=(0, 1)))
    r = sim(flow_specs=specs)
    assert r.verified
    first, second, third = r.flows
    assert first.completion_time_s is not None and second.completion_time_s is not None
    assert third.start_time_s == max(first.completion_time_s, second.completion_time_s)


def test_a_flow_whose_prerequisite_failed_never_starts() -> None:
    # h2 loses every NIC port for good: flow 0 fails, flow 1 (after it) must not start.
    downs = tuple(NicDown(2, p, 0.0) for p in range(FABRIC.planes))
    r = sim(flow_specs=(FlowSpec(0, 2), FlowSpec(1, 3, after=(0,))), nic_downs=downs)
    assert not r.verified
    failed, waiting = r.flows
    assert failed.failed is not None
    assert waiting.start_time_s is None and waiting.fct_s is None
    assert waiting.failed == "flow 0 it waits for failed"
    assert waiting.failure_time_s == failed.failure_time_s


def test_a_ring_allreduce_runs_step_after_step() -> None:
    hosts = (0, 1, 2, 3)
    specs = ring_steps("ring-allreduce", hosts, 64 * KIB, name="ar")
    assert len(specs) == 2 * 3 * 4
    r = sim(flow_specs=specs)
    assert r.verified
    assert [g.name for g in r.groups] == [f"ar step {k}" for k in range(6)]
    for flow, spec in zip(r.flows, specs, strict=True):
        for before in spec.after:
            done = r.flows[before].completion_time_s
            assert done is not None and flow.start_time_s is not None
            assert flow.start_time_s >= done
    for earlier, later in zip(r.groups, r.groups[1:], strict=False):
        assert earlier.end_s is not None and later.end_s is not None
        assert later.end_s > earlier.end_s
    assert r.groups[-1].end_s == r.completion_time_s
    assert all(g.bytes == 4 * 64 * KIB and g.complete for g in r.groups)


def test_all_to_all_steps_are_a_shifted_permutation() -> None:
    specs = ring_steps("all-to-all", (0, 1, 2, 3), 4 * KIB)
    assert sorted((s.src, s.dst) for s in specs) == sorted(
        (a, b) for a in range(4) for b in range(4) if a != b
    )
    with pytest.raises(ValueError, match="unknown collective"):
        ring_steps("broadcast", (0, 1), 1)


def test_pinned_evs_carry_every_data_packet() -> None:
    pinned = (ev_value(1, 2), ev_value(1, 2, entropy=1))  # plane 1, T1 c, twice
    r = sim(flow_specs=(FlowSpec(0, 2, evs=pinned),))
    assert r.verified
    assert [b > 0 for b in r.per_plane_bytes] == [False, True, False, False]
    up = {name for name, c in r.links.items() if ":t0a-t1" in name and c["packets"]}
    assert up == {"p1:t0a-t1c"}


def test_pinned_planes_keep_the_flow_off_the_others() -> None:
    r = sim(flow_specs=(FlowSpec(0, 2, planes=(0, 2)),))
    assert r.verified
    assert [b > 0 for b in r.per_plane_bytes] == [True, False, True, False]
    flow = r.flows[0]
    # Alone on two planes: payload at twice one link's rate, 4 links there and back.
    assert flow.ideal_fct_s == pytest.approx(flow.bytes * 8 / (2 * RATE) + 8 * DELAY)


def test_bad_flow_specs_are_refused_with_the_flow_named() -> None:
    with pytest.raises(ValueError, match=r"flow 1 .*earlier flow"):
        SimConfig(flow_specs=(FlowSpec(0, 1), FlowSpec(1, 0, after=(1,))))
    with pytest.raises(ValueError, match="no path"):
        SimConfig(fabric=FABRIC, flow_specs=(FlowSpec(0, 2, evs=(ev_value(5, 0),)),))
    with pytest.raises(ValueError, match="not both"):
        SimConfig(pairs=((0, 1),), flow_specs=(FlowSpec(0, 1),))


def test_a_whole_plane_failure_takes_every_host_port_of_that_plane() -> None:
    r = sim(
        pairs=((0, 2), (1, 3)),
        bytes_per_flow=4 * MIB,
        plane_failures=(PlaneFailure(2, 0.2e-3, 0.4e-3),),
    )
    assert r.verified
    local_down = {
        (e.flow, e.side) for e in r.port_events if e.port == 2 and not e.up and not e.remote
    }
    assert local_down == {(f, s) for f in (0, 1) for s in ("sender", "receiver")}
    assert any(e.port == 2 and e.up for e in r.port_events)  # and back after the window
    # Nothing rides plane 2 while it is down: its share is below the others'.
    assert r.per_plane_bytes[2] < min(r.per_plane_bytes[p] for p in (0, 1, 3))


def test_loss_changes_over_time_on_one_link() -> None:
    link = "p0:t0a-t1a"
    quiet = sim(bytes_per_flow=2 * MIB)
    late = sim(bytes_per_flow=2 * MIB, loss_changes=(LossChange(1.0, 0.5, link),))
    lossy = sim(
        bytes_per_flow=2 * MIB,
        loss_changes=(LossChange(0.0, 0.2, link), LossChange(0.5e-3, 0.0, link)),
    )
    assert quiet.verified and late.verified and lossy.verified
    assert late.drops["loss"] == 0  # the change came after the transfer
    assert lossy.drops["loss"] > 0
    dropped = {n for n, c in lossy.links.items() if c["drops_loss"]}
    assert dropped <= {link, "p0:t1a-t0a"}


def test_ecn_on_the_last_hop_is_an_option() -> None:
    incast = tuple((s, 0) for s in (1, 2, 3))
    host_ports = ("p0:t0a-h0", "p1:t0a-h0", "p2:t0a-h0", "p3:t0a-h0")
    off = sim(pairs=incast)
    on = sim(pairs=incast, ecn_last_hop=True)
    assert off.verified and on.verified
    assert sum(off.links[p]["ecn_marks"] for p in host_ports) == 0
    assert sum(on.links[p]["ecn_marks"] for p in host_ports) > 0


def test_packet_latency_samples_respect_the_physics() -> None:
    r = sim(packet_latency_every=1)
    assert r.verified and r.retransmissions == {}
    flow = r.flows[0]
    packets = -(-flow.bytes // 4096)
    assert len(flow.packet_latency_s) == packets  # every full data packet, once
    # Cross-rack: four links, each propagation plus one serialization of the packet.
    floor = 4 * (DELAY + (4096 + WIRE_OVERHEAD_BYTES) * 8 / RATE)
    assert min(flow.packet_latency_s) >= floor
    every_8th = sim(packet_latency_every=8).flows[0].packet_latency_s
    assert len(every_8th) == packets // 8
    assert sim().flows[0].packet_latency_s == ()


def test_incast_metrics_come_from_the_flows() -> None:
    alone = sim(bytes_per_flow=2 * MIB)
    flow = alone.flows[0]
    assert flow.slowdown is not None and flow.fct_s is not None
    # Alone: only headers, store-and-forward and the last ACK separate it from its floor.
    assert 1.0 <= flow.slowdown < 1.1
    assert alone.fct_p50_s == alone.fct_p99_s == flow.fct_s
    util = alone.receiver_utilization["h3"]  # the default flow: h0 -> the last host
    assert 0.9 < util <= 1.0
    incast = sim(pairs=tuple((s, 0) for s in (1, 2, 3)), bytes_per_flow=2 * MIB)
    slow = sorted(f.slowdown or 0.0 for f in incast.flows)
    assert incast.slowdown_p50 == pytest.approx(slow[1])
    assert incast.slowdown_p99 is not None and slow[1] <= incast.slowdown_p99 <= slow[2]
    assert slow[0] > 2.0  # three senders share one receiver's links
    assert 0.8 < incast.receiver_utilization["h0"] <= 1.0


def test_a_transfer_split_over_queue_pairs_waits_for_all_of_them() -> None:
    specs = ring_steps("allgather", (0, 1, 2), 10)
    split = with_qps(specs, 4)
    assert len(split) == 4 * len(specs)
    assert [s.bytes for s in split[:4]] == [3, 3, 2, 2]  # the bytes, shared out
    # Step 1's first flow waited for flows 0 and 2; now for all four parts of each.
    assert set(split[4 * 3].after) == {0, 1, 2, 3, 8, 9, 10, 11}
    r = sim(flow_specs=split)
    assert r.verified and len(r.flows) == 24
    with pytest.raises(ValueError, match="at least 4 bytes"):
        with_qps((FlowSpec(0, 1, bytes=3),), 4)


def test_a_host_nic_pulls_data_so_many_flows_from_one_host_do_not_time_out() -> None:
    """All-to-all of 8 hosts at 10 Gbit/s: each host runs 7 connections whose windows
    together far exceed what its NIC sends in a minimum RTO.  The NIC takes packets only as
    its ports drain, so none waits in it long enough to time out, and no path is blamed."""
    fabric = Fabric(racks=2, hosts_per_rack=4)
    hosts = range(fabric.hosts)
    pairs = tuple((s, d) for s in hosts for d in hosts if s != d)
    r = run(SimConfig(fabric=fabric, pairs=pairs, bytes_per_flow=256 * KIB, rate_bps=RATE))
    assert r.verified
    assert r.retransmissions.get("timeout", 0) == 0, r.retransmissions
    assert not [e for e in r.events if e.new == "assumed_bad"]
    # Each host sends 7 x 256 KiB over 4 x 10 Gbit/s: the floor is 0.367 ms.
    floor = 7 * 256 * KIB * 8 / (4 * RATE)
    assert r.completion_time_s < 1.5 * floor


def test_nic_wake_ups_stay_a_few_per_packet_on_one_plane() -> None:
    """One plane, two packets of NIC room: a wake-up that rounding left a hair short of
    room for a packet would come back at the same instant again and again."""
    fabric = Fabric(planes=1, racks=2, hosts_per_rack=2, t1_per_plane=4)
    cfg = SimConfig(fabric=fabric, pairs=((0, 2), (1, 3)), bytes_per_flow=4 * MIB, rate_bps=RATE)
    # On its own thread: that loop never advances the virtual clock, so the run would hang
    # the suite instead of failing this test.
    out: list[SimResult] = []
    worker = threading.Thread(target=lambda: out.append(run(cfg)), daemon=True)
    worker.start()
    worker.join(120.0)  # a safety limit, not a timing assertion (the run takes ~1 s)
    assert out, "the simulation did not finish: NIC wake-ups at one instant forever?"
    r = out[0]
    assert r.verified
    assert r.sim_events < 10 * r.packets_sent


def test_paths_queued_at_the_start_are_not_taken_for_dead() -> None:
    """Two flows pinned to six EVs each, three over one shared T1 and three over their own:
    at the start the shared path's packets wait behind both flows' windows, and RACK takes
    some for lost (packets of the same plane on the idle paths came back first), but an EV
    that has not yet had an RTO to answer is not condemned for it.  Nothing is dropped, so
    no EV may be demoted (before, one was, and the flows spread before ECN could act)."""
    fabric = Fabric(planes=1, racks=2, hosts_per_rack=2, t1_per_plane=4)
    shared = tuple(ev_value(0, 0, e) for e in range(3))
    specs = tuple(
        FlowSpec(src, dst, evs=shared + tuple(ev_value(0, t1, e) for e in range(3)))
        for src, dst, t1 in ((0, 2, 1), (1, 3, 2))
    )
    r = run(SimConfig(fabric=fabric, bytes_per_flow=2 << 20, rate_bps=RATE, seed=1,
                      flow_specs=specs))  # fmt: skip
    assert r.verified and not any(r.drops.values())
    assert [e for e in r.events if e.new == "assumed_bad"] == []
