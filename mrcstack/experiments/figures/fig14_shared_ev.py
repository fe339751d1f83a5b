"""Fig 14 in the simulator: two flows pinned onto one shared path.  ECN marks make the
senders move traffic off it, so both stay near line rate; RoCE mode, one path for both,
halves them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from mrcstack import addrplan
from mrcstack.experiments import goodput
from mrcstack.experiments.analysis import ratio
from mrcstack.experiments.base import Claim, Mechanism, Op, Outcome, Plot, Table
from mrcstack.experiments.plots import bars
from mrcstack.experiments.simruns import RATE, Sim, params, simulated
from mrcstack.fabric import Fabric, letters
from mrcstack.sim import FlowSpec, SimResult

FABRIC = Fabric(planes=1, racks=2, hosts_per_rack=2, t1_per_plane=4)
PAIRS = ((0, 2), (1, 3))
BIN_S = 0.5e-3
# Three EVs of each flow cross T1 a (the shared path), the others the flow's own T1:
# spraying in rotation would put 3 of 5 packets in use on the shared path.
SHARED = tuple(addrplan.ev_value(0, 0, e) for e in range(3))
OWN_T1 = {0: 1, 1: 2}  # flow -> its own T1
EVS = {f: SHARED + tuple(addrplan.ev_value(0, t1, e) for e in range(3)) for f, t1 in OWN_T1.items()}
#: The share of the shared path under rotation alone (one EV of six is a backup).
ROTATION = len(SHARED) / (len(EVS[0]) - 1)
#: ECN thresholds above the queue: switches that never mark.
NEVER_MARK = {"ecn_kmin_bytes": FABRIC.queue_bytes - 2, "ecn_kmax_bytes": FABRIC.queue_bytes - 1}
ECN, NO_MARKS, ROCE = "MRC, ECN", "MRC, no ECN marks", "RoCE mode (one path)"
#: Each case: (mode, each flow's EVs, settings).
CASES: dict[str, tuple[str, dict[int, tuple[int, ...]], dict[str, Any]]] = {
    ECN: ("mrc", EVS, {}),
    NO_MARKS: ("mrc", EVS, NEVER_MARK),
    ROCE: ("roce", {0: SHARED[:1], 1: SHARED[:1]}, {}),
}
COLUMNS = (
    "case",
    "flow0_gbps",
    "flow1_gbps",
    "slowest_over_alone",
    "shared_path_share",
    "ecn_marks",
    "trims",
    "skips_on_shared",
    "demotions",
    "retransmissions",
    "spurious",
)


@dataclass(frozen=True, slots=True)
class _Case:
    """What one case's run shows: a row of the ``flows`` table."""

    label: str
    result: SimResult
    slowest: float  # the slower flow's goodput over its goodput alone
    share: float  # the shared path's share of the bytes on the three uplinks
    skips: int  # the senders' SKIPs of a shared EV (ECN steering)
    demoted: int  # EVs the senders took for broken (a false loss here)

    def row(self) -> tuple[Any, ...]:
        r = self.result
        return (
            self.label,
            *(f.goodput_bps / 1e9 for f in r.flows),
            self.slowest,
            self.share,
            r.ecn_marks,
            r.trims,
            self.skips,
            self.demoted,
            sum(r.retransmissions.values()),
            r.spurious_retransmissions,
        )


def _runs(sim: Sim, size: int) -> tuple[float, dict[str, SimResult]]:
    """The first flow's goodput alone, then each case's run; ``size`` bytes per flow."""
    base = sim.config(FABRIC, bytes_per_flow=size, max_sim_time_s=1.0)
    alone = sim.run(replace(base, flow_specs=(FlowSpec(*PAIRS[0], evs=EVS[0]),)))
    results = {}
    for label, (mode, pins, settings) in CASES.items():
        specs = tuple(FlowSpec(s, d, evs=pins[f]) for f, (s, d) in enumerate(PAIRS))
        cfg = replace(base, flow_specs=specs, mode=mode, series_interval_s=BIN_S, **settings)
        results[label] = sim.run(cfg)
    return alone.flows[0].goodput_bps, results


def _case(label: str, r: SimResult, alone_bps: float) -> _Case:
    up = [r.links.get(f"p0:t0a-t1{letters(t)}", {}).get("bytes", 0) for t in range(3)]
    sender = [e for e in r.events if e.side == "sender"]
    return _Case(
        label,
        r,
        slowest=min(f.goodput_bps for f in r.flows) / alone_bps,
        share=ratio(up[0], sum(up)),
        skips=sum(1 for e in sender if e.new == "skip" and e.ev in SHARED),
        demoted=sum(1 for e in sender if e.new == "assumed_bad"),
    )


def _per_flow(cases: dict[str, _Case]) -> dict[str, list[float]]:
    """Each flow's goodput per bin (Gbit/s), every case."""
    return {
        f"{label}: flow {f}": [b.flow_bytes[f] * 8 / BIN_S / 1e9 for b in c.result.timeline]
        for label, c in cases.items()
        for f in range(len(PAIRS))
    }


def _claims(cases: dict[str, _Case]) -> list[Claim]:
    return [
        Claim(
            "MRC with ECN: the slower flow's goodput over its goodput alone",
            cases[ECN].slowest,
            0.9,
            credits=Mechanism.ECN,
        ),
        Claim(
            "MRC: the slower flow with ECN marks over without them",
            cases[ECN].slowest / cases[NO_MARKS].slowest,
            1.05,
            credits=Mechanism.ECN,
        ),
        Claim(
            f"MRC with ECN: the shared path's share of the bytes, under the {ROTATION:.2f} "
            "that rotation alone would give",
            cases[ECN].share,
            ROTATION - 0.02,
            Op.AT_MOST,
            credits=Mechanism.ECN,
        ),
    ]


def _notes(cases: dict[str, _Case]) -> list[str]:
    return [
        "Pinning: each flow lists only its six EVs (FlowSpec.evs). ECN marks make the "
        "sender SKIP the shared path's EVs for a while, so both flows move part of "
        "their traffic to their own paths; without marks (thresholds above the queue) "
        "they keep the rotation's share and the shared link is the bottleneck. In the "
        "paper one flow moves entirely; here both shed part of the shared path.",
        f"In this run the switches marked {cases[ECN].result.ecn_marks} packets in the ECN "
        f"case, and the senders demoted {cases[ECN].demoted} EV(s) (ECN case) and "
        f"{cases[NO_MARKS].demoted} (no marks) to ASSUMED_BAD. No packet is "
        "dropped, so a demotion would be a false loss: at the start RACK takes a few "
        "packets queued on the shared path for lost (packets of the same plane on the "
        "idle paths come back first) and resends them (the spurious column), but an EV "
        "that has not yet had an RTO to answer is not condemned for it. A demotion "
        "would swap in a backup EV over the flow's own path and spread the flows "
        "before any ECN mark could; the two cases would end alike and the ECN claim "
        "fail, as it should.",
        f"RoCE mode, both flows on the one path, for comparison: the slower flow gets "
        f"{cases[ROCE].slowest:.2f} of its goodput alone.",
    ]


def _ends_ms(cases: dict[str, _Case]) -> dict[str, float | None]:
    """When each flow of each case completed (ms; None: never)."""
    return {
        f"{label}: flow {f}": (flow.completion_time_s or 0) * 1e3 if flow.complete else None
        for label, c in cases.items()
        for f, flow in enumerate(c.result.flows)
    }


def _plots(per_flow: list[str], cases: dict[str, _Case]) -> list[Plot]:
    return [
        goodput.plot(
            per_flow,
            ylabel="goodput per flow (Gbit/s)",
            title="Fig 14: two flows pinned onto one shared path",
            caption="per-flow goodput",
            capacity_gbps=RATE / 1e9,
            ends_ms=_ends_ms(cases),
        ),
        Plot(
            "slowest",
            "slowest flow",
            bars(
                "flows",
                "case",
                ["slowest_over_alone", "shared_path_share"],
                ylabel="fraction",
                title="Fig 14: slowest flow over its goodput alone; shared path's share",
            ),
        ),
    ]


def figure(sim: Sim) -> Outcome:
    size = sim.size(16, 64) << 20
    alone_bps, results = _runs(sim, size)
    cases = {label: _case(label, r, alone_bps) for label, r in results.items()}
    per_flow = _per_flow(cases)
    return Outcome(
        params=params(
            "1 plane x 4 T1, 2 racks x 2 hosts",
            {
                "bytes_per_flow": size,
                "flows": "h0 -> h2 and h1 -> h3, both from rack a to rack b",
                "pinned": "each flow: 3 EVs over T1 a (shared) + 3 over its own T1 (b, c); "
                "5 in use, 1 backup",
                "alone_gbps": alone_bps / 1e9,
            },
        ),
        tables=[
            Table("flows", COLUMNS, tuple(c.row() for c in cases.values())),
            goodput.timeline("goodput", per_flow, bin_s=BIN_S),
        ],
        plots=_plots(list(per_flow), cases),
        claims=_claims(cases),
        notes=_notes(cases),
    )


EXPERIMENT = simulated(
    "fig14-shared-ev",
    "Fig 14",
    "two flows pinned onto one shared path: ECN spreads them, both near line rate",
    figure,
    mechanisms=(Mechanism.ECN,),
)
