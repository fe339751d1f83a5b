"""Deterministic fabric simulator: MRC connections in virtual time over a multi-plane Clos.

It is how the protocol core is tested, and a what-if tool::

    python -m mrcstack.sim --planes 4 --t1 8 --bytes 64MiB --loss 0.01 \\
        --fail-link p0:t0a-t1c@0.5ms --seed 7 --json

or from Python: ``run(SimConfig(...)).to_json()``.  Layers: :mod:`.engine` (event heap),
:mod:`.network` (links, switch queues, trimming, ECN, faults), :mod:`.runner` (scenario ->
connections -> result), :mod:`.cli`; beside them :mod:`.config` (``SimConfig``, flows,
faults), :mod:`.scenario` (TOML scenario files), :mod:`.collectives` (collectives as
dependent steps), :mod:`.content` (what each write's bytes must be), :mod:`.result`, and
:mod:`.probing` (the fabric mapper's agents and localizer on the simulated fabric, the
``[mapper]`` of a scenario).
The same configuration and seed always give the same JSON, byte for byte
(``json.dumps(result.to_json(), sort_keys=True)``; floats keep 9 significant digits).

Accounting: a packet occupies ``len(datagram) + 48`` bytes on the wire (outer IPv6 40 +
UDP 8; no Ethernet framing).  Goodput counts payload only while capacity is raw line rate,
so headers cap ``goodput_fraction`` at 4096 / (4096 + 60 + 48) = 0.974 with 4096-byte
payloads and CRC trailers.  A write completes only when its last packet has crossed the
fabric and its ACK has come back, so a short transfer cannot reach that cap either: 16 MiB
over 4 x 100 Gbit/s with 1 us links takes at least 344.4 us of serialization plus 5.0 us
for the last packet's remaining hops plus 4.0 us for the ACK, a ``goodput_fraction`` of at
most 0.9494 (0.960 for ``arrival_fraction``, which ends at the receiver).  The simulated
flows start at line rate and reach both bounds to within 0.1%.

JSON reference (``SimResult.to_json()``; these keys are stable)::

    key                type            meaning
    -----------------  --------------  -----------------------------------------------------
    bytes_delivered    int             payload bytes of writes completed with SUCCESS
    verified           bool            every flow completed; every write's bytes, derived
                                       from its flow and offset, were found in place when
                                       its immediate arrived; each completion fired once,
                                       in order, with SUCCESS; each immediate exactly once
                                       (memory stays flat: the receiver stores nothing and
                                       checks each packet as it is placed)
    completion_time_s  float           when the last flow finished (the end of the run if
                                       a flow never did)
    goodput_bps        float           bytes_delivered * 8 / completion_time_s
    capacity_bps       float           planes x host link rate x distinct sending hosts
    goodput_fraction   float           goodput_bps / capacity_bps
    arrival_time_s     float           when the last receiver had its last immediate
    arrival_fraction   float           bytes of flows whose last immediate arrived * 8 /
                                       arrival_time_s / capacity_bps: goodput as the
                                       receivers see it, without the last ACK's way back
    retransmissions    {reason: int}   summed over all connections (core.reasons.RetxReason)
    spurious_retransmissions  int      packets declared lost and resent that the
                                       receiver already had
    tlp_unneeded       int             tail-loss probes that found the tail had arrived
                                       (a probe, not a loss declaration)
    trims              int             data packets trimmed by switches
    ecn_marks          int             CE marks set by switches (never on host ports)
    drops              {reason: int}   queue (tail drop), loss (random), link_down,
                                       ev_loss, unknown_qpn
    ev_state_changes   int             EV state changes after setup, both ends, all flows
    per_plane_bytes    [int]           datagram bytes (payload + MRC headers) senders put
                                       on each plane
    flows              [object]        per flow: index, src, dst, bytes, work_requests,
                                       complete, verified, completion_time_s (null if not
                                       complete), goodput_bps, arrival_time_s (the
                                       receiver's last immediate, or null), failed (reason
                                       or null),
                                       failure_time_s (when it failed, or null),
                                       retransmissions, spurious_retransmissions,
                                       tlp_unneeded,
                                       nacks_received, trims_received
                                       (receiver), ecn_echoes (sender), per_plane_bytes,
                                       write_latency_s (a latency probe's writes, post to
                                       completion, in order: ``SimConfig.latency_flows``),
                                       group (its spec's label), start_time_s (null if it
                                       never started: a flow it waited for failed),
                                       fct_s (start to completion), ideal_fct_s (a
                                       floor: its payload at line rate on each of its
                                       planes plus the propagation there and back),
                                       slowdown (fct_s / ideal_fct_s, >= 1),
                                       packet_latency_s (every N-th full
                                       data packet's send-to-arrival time:
                                       ``SimConfig.packet_latency_every``)
    groups             [object]        per flow label, in order of first use: name,
                                       flows, complete, start_s, end_s (last completion,
                                       null unless all completed), duration_s, bytes
    fct_p50_s          float|null      median flow completion time of completed flows
    fct_p99_s          float|null      99th percentile (linear interpolation)
    slowdown_p50       float|null      median of the flows' slowdown
    slowdown_p99       float|null      99th percentile slowdown
    receiver_utilization {host: float} per receiving host ("h3"): wire bytes its T0s
                                       delivered to it * 8 / completion_time_s / (planes
                                       x host link rate)
    events             [object]        the first 1000 EV state changes: t_s, flow, side
                                       ("sender"/"receiver"), ev, plane, old, new, reason,
                                       drop_count
    events_truncated   int             EV state changes left out of ``events``
    port_events        [object]        port state changes seen by connections: t_s, flow,
                                       side, port, up, remote
    timeline           [object]        with ``--series``: t_s (interval start), bytes and
                                       goodput_bps (payload newly placed at receivers),
                                       flow_bytes (per flow); [] otherwise
    links              {name: object}  per directional link that forwarded anything:
                                       packets, bytes (wire), trims, ecn_marks, drops_queue,
                                       drops_loss, drops_down, max_queue_bytes
    packets_sent       int             datagrams injected by all endpoints
    packets_delivered  int             datagrams handed to endpoints
    sim_time_s         float           virtual time when the run ended
    sim_events         int             heap events processed
    config             object          the SimConfig echoed (pairs resolved), and
                                       retry_budget_s: how long a connection may go
                                       without progress before it fails
    seed               int             the seed
    mapper             object|null     with a [mapper] in the scenario: rounds, probes,
                                       probes_lost, changes (at, link, old, new,
                                       evidence, loss), denials (at, links, evs and
                                       connections changed), first_denial_s,
                                       data_on_denied (data packets sent on a path over a
                                       link of the denylist in force, or of the one it
                                       would have pushed with deny = false),
                                       control_on_denied (the same for feedback),
                                       pairs_on_denied ([src, dst] of them), and
                                       retransmissions ([time, [per host]] whenever a
                                       host's count changed); null without
"""

from mrcstack.sim.engine import Engine
from mrcstack.sim.network import NetParams, NetStats, Network
from mrcstack.sim.runner import (
    FlowResult,
    FlowSpec,
    GroupResult,
    LinkFailure,
    LossChange,
    NicDown,
    PlaneFailure,
    SimConfig,
    SimError,
    SimResult,
    SwitchFailure,
    run,
)

__all__ = [
    "Engine",
    "FlowResult",
    "FlowSpec",
    "GroupResult",
    "LinkFailure",
    "LossChange",
    "NetParams",
    "NetStats",
    "Network",
    "NicDown",
    "PlaneFailure",
    "SimConfig",
    "SimError",
    "SimResult",
    "SwitchFailure",
    "run",
]
