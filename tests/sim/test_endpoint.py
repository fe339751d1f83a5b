"""A host's endpoint (QP 2) in the simulator: EV probes answered to the host that sent them,
whichever of the answering host's connections leads there."""

from __future__ import annotations

from mrcstack.fabric import Fabric
from mrcstack.sim import FlowSpec, SimConfig, SwitchFailure, run


def test_probes_to_a_host_with_several_peers_revive_the_prober_s_evs() -> None:
    """Host 0 sends to host 1 (its lowest QPN) and receives from host 2.  Host 2's EVs
    through a T1 that fails and returns are condemned, then probed at host 0's endpoint:
    the answers must go back to host 2 (not along host 0's connection to host 1) and bring
    those EVs back."""
    cfg = SimConfig(
        fabric=Fabric(planes=1, racks=3, hosts_per_rack=1, t1_per_plane=4),
        rate_bps=10e9,
        flow_specs=(FlowSpec(0, 1), FlowSpec(2, 0)),
        bytes_per_flow=8 << 20,
        switch_failures=(SwitchFailure("p0-t1a", 0.001, 0.002),),
        seed=1,
    )
    result = run(cfg)
    assert result.verified
    condemned = {
        e.ev for e in result.events if e.flow == 1 and e.side == "sender" and e.new == "assumed_bad"
    }
    revived = {
        e.ev
        for e in result.events
        if e.flow == 1 and e.side == "sender" and e.reason == "probes_ok" and e.t_s > 0.002
    }
    assert condemned, "the failure condemned none of host 2's EVs"
    assert revived == condemned
