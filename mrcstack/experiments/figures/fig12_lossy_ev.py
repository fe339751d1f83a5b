"""Figs 12-13 in the simulator: one EV dropping 20% of its packets.  Goodput stays flat
(near the capacity of every plane), and the sender takes the EV out of use within a few
RTTs."""

from __future__ import annotations

from dataclasses import dataclass, replace

from mrcstack import addrplan
from mrcstack.experiments import goodput
from mrcstack.experiments.analysis import NOT_MEASURED
from mrcstack.experiments.base import Claim, Mechanism, Op, Outcome
from mrcstack.experiments.simruns import Sim, capacity_gbps, params, simulated
from mrcstack.fabric import Fabric
from mrcstack.sim import SimConfig

FABRIC = Fabric()
EV_LOSS = 0.2
CLEAN, LOSSY = "no loss", "one EV drops 20%"
PAIRS = ((0, FABRIC.hosts - 1),)
CAPACITY_GBPS = capacity_gbps(FABRIC, PAIRS)


@dataclass(frozen=True, slots=True)
class _Runs:
    base: SimConfig  # the lossless run
    bad_ev: int
    clean: goodput.Run
    lossy: goodput.Run


def _lossy_ev(cfg: SimConfig) -> int:
    """An EV the flow sprays on from the start: the first of plane 1 in its profile."""
    entries = addrplan.ev_profile(FABRIC, 0, FABRIC.hosts - 1, cfg.ev_count)
    return next(e.value for e in entries if e.port == 1)


def _runs(sim: Sim) -> _Runs:
    size = sim.size(16, 64) << 20
    base = sim.config(
        FABRIC, bytes_per_flow=size, series_interval_s=goodput.BIN_S, max_sim_time_s=1.0
    )
    clean = goodput.run(sim, base)
    bad_ev = _lossy_ev(base)
    lossy = goodput.run(sim, replace(base, ev_loss=((bad_ev, EV_LOSS),)))
    return _Runs(base, bad_ev, clean, lossy)


def _demoted_rtts(runs: _Runs) -> float:
    """RTTs from the start until the sender took the lossy EV for ASSUMED_BAD."""
    demoted = [
        e["t_s"]
        for e in runs.lossy.doc["events"]
        if e["ev"] == runs.bad_ev and e["new"] == "assumed_bad" and e["side"] == "sender"
    ]
    rtt = runs.base.base_rtt(0, FABRIC.hosts - 1)
    return (min(demoted) / rtt) if demoted else NOT_MEASURED


def _claims(runs: _Runs) -> list[Claim]:
    flat = runs.lossy.doc["goodput_bps"] / 1e9 / CAPACITY_GBPS
    return [
        Claim(
            f"goodput with one EV dropping 20%, over the capacity of every plane (lossless: "
            f"{runs.clean.doc['goodput_bps'] / 1e9 / CAPACITY_GBPS:.2f})",
            flat,
            0.9,
            credits=Mechanism.MRC,
        ),
        Claim(
            "RTTs until the lossy EV is ASSUMED_BAD",
            _demoted_rtts(runs),
            10,
            Op.AT_MOST,
            credits=Mechanism.MRC,
        ),
    ]


def figure(sim: Sim) -> Outcome:
    runs = _runs(sim)
    return Outcome(
        params=params(
            "4 planes x 4 T1",
            {
                "bytes": runs.base.bytes_per_flow,
                "lossy_ev": hex(runs.bad_ev),
                "ev_loss": EV_LOSS,
                "base_rtt_us": runs.base.base_rtt(0, FABRIC.hosts - 1) * 1e6,
            },
        ),
        tables=[goodput.timeline("goodput", {CLEAN: runs.clean.gbps, LOSSY: runs.lossy.gbps})],
        plots=[
            goodput.plot(
                [CLEAN, LOSSY],
                ylabel="goodput (Gbit/s)",
                title="Figs 12-13: one EV dropping 20%",
                capacity_gbps=CAPACITY_GBPS,
                ends_ms={CLEAN: runs.clean.end_ms, LOSSY: runs.lossy.end_ms},
                labels={
                    CLEAN: "MRC, no loss (sprayed over every plane)",
                    LOSSY: f"MRC, EV {runs.bad_ev:#x} drops 20%",
                },
            )
        ],
        claims=_claims(runs),
    )


EXPERIMENT = simulated(
    "fig12-lossy-ev",
    "Figs 12-13",
    "one EV dropping 20%: bandwidth stays flat, the EV is replaced within a few RTTs",
    figure,
)
