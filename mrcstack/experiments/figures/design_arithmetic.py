"""The paper's design arithmetic, from ``mrcstack plan``: 8 x 100G planes and radix-512
switches build 131,072 GPUs in two tiers, with 2/3 of the optics and 3/5 of the switches of
three tiers of 800G, a longest path of 3 switches instead of 5, and a lost T0-T1 link
costing 0.4% of a node's capacity instead of 3%.

Each claim is a number of the paper, reproduced within 2% by the planner's formulas
(``docs/plan.md``); the paper gives the lost-link costs to one significant figure, so they
are compared at that precision (exactly 1/256 and 1/32).  Without planes (one port of the
NIC's whole rate, the same switches as 64 x 800G), two tiers reach 2,048 endpoints: there is
no two-tier design to count, and every claim fails.
"""

from __future__ import annotations

import math
from dataclasses import replace

from mrcstack import plan
from mrcstack.experiments.base import Claim, Experiment, Mechanism, Op, Outcome, Plot, Table
from mrcstack.experiments.plots import bars

PAPER = plan.Request(endpoints=131_072)  # 8 planes x 100 Gbit/s, radix 512, three tiers
#: The same NICs and switches without planes: one 800G port, 64 x 800G per switch.
ONE_PLANE = replace(PAPER, planes=1, radix=PAPER.radix // PAPER.planes, speed_bps=PAPER.nic_bps)
#: The paper's other breakout of an 800G NIC: 4 x 200G (a lost port costs 1/4), as many
#: endpoints as two tiers of 256 x 200G switches reach.
FOUR_PLANES = plan.Request(endpoints=32_768, planes=4, radix=256, speed_bps=200e9)
TOLERANCE = 0.02
NAN = math.nan


def _plan(req: plan.Request) -> plan.Plan | None:
    """The planner's plan; None when no two-tier design reaches the endpoints."""
    try:
        return plan.plan(req)
    except plan.PlanError:
        return None


def _significant(x: float, digits: int = 1) -> float:
    """``x`` to the paper's precision (one significant figure)."""
    return float(f"{x:.{digits}g}") if math.isfinite(x) and x else x


def _claims(p: plan.Plan | None, four: plan.Plan | None) -> list[Claim]:
    two = p.two_tier if p else None
    single = p.single_plane if p else None
    nic = PAPER.nic_bps

    def claim(text: str, value: float, paper: float) -> Claim:
        return Claim(text, value, paper, Op.WITHIN, tolerance=TOLERANCE, credits=Mechanism.PLANES)

    return [
        claim(
            "endpoints two tiers reach (paper: 131,072 GPUs)", two.reach if two else NAN, 131_072
        ),
        claim(
            "switches, two tiers of 8 x 100G planes over three tiers of 800G (paper: 3/5)",
            p.switch_ratio if p else NAN,
            3 / 5,
        ),
        claim(
            f"optics (800G modules), two tiers over three (paper: 2/3; "
            f"{two.optics(nic) if two else 0:,} against {single.optics(nic) if single else 0:,})",
            p.optics_ratio if p else NAN,
            2 / 3,
        ),
        claim(
            "longest path in switches, two tiers (paper: 3, against 5)",
            two.longest_path if two else NAN,
            3,
        ),
        claim(
            "longest path in switches, three tiers (paper: 5)",
            single.longest_path if single else NAN,
            5,
        ),
        claim(
            "a lost T0-T1 link, % of a node's capacity with 100G planes, to one significant "
            "figure (exactly 100/256 = 0.39; paper: 0.4%)",
            _significant(float(two.lost_uplink) * 100) if two else NAN,
            0.4,
        ),
        claim(
            "a lost T0-T1 link, % of a node's capacity with one 800G plane, to one "
            "significant figure (exactly 100/32 = 3.1; paper: 3%)",
            _significant(float(single.lost_uplink) * 100) if single else NAN,
            3,
        ),
        claim(
            "a lost NIC port, share of the NIC with 8 planes (paper: 1/8)",
            float(two.lost_port) if two else NAN,
            1 / 8,
        ),
        claim(
            "a lost NIC port, share of the NIC with 4 x 200G planes (paper: 1/4)",
            float(four.two_tier.lost_port) if four and p else NAN,
            1 / 4,
        ),
    ]


def _tables(p: plan.Plan | None) -> list[Table]:
    if p is None or p.single_plane is None:
        return [
            Table("design", ("what", "two_tier", "single_plane"), (("no design", "-", "-"),)),
            Table("ratios", ("what", "two tiers over three"), (("none", 0.0),)),
        ]
    return [
        Table("design", ("what", "two_tier", "single_plane"), tuple(plan.rows(p))),
        Table(
            "ratios",
            ("what", "two tiers over three"),
            (
                ("switches", p.switch_ratio),
                ("optics", p.optics_ratio),
                ("longest path", p.two_tier.longest_path / p.single_plane.longest_path),
                (
                    "lost T0-T1 link's cost",
                    float(p.two_tier.lost_uplink / p.single_plane.lost_uplink),
                ),
            ),
        ),
    ]


PLOT = Plot(
    "ratios",
    "two tiers of planes over three tiers of one plane",
    bars(
        "ratios",
        "what",
        ["two tiers over three"],
        ylabel="multi-plane two-tier / single-plane three-tier",
        title="Design: 131,072 GPUs, 8 x 100G planes (radix 512) against one 800G plane (radix 64)",
        labels={"two tiers over three": "8 x 100G planes, 2 tiers, over 1 x 800G plane, 3 tiers"},
        capacity=(1.0, "1 x 800G plane, 3 tiers (= 1)"),
    ),
)


def run(profile: str, seed: int, sabotage: Mechanism | None = None) -> Outcome:
    del profile, seed  # arithmetic: the same numbers in every profile
    if sabotage not in (None, Mechanism.PLANES):
        raise ValueError(f"the design arithmetic cannot run without {sabotage}")
    req, four = (ONE_PLANE, replace(FOUR_PLANES, planes=1)) if sabotage else (PAPER, FOUR_PLANES)
    p, four_plan = _plan(req), _plan(four)
    return Outcome(
        params={
            "endpoints": req.endpoints,
            "planes": f"{req.planes} x {req.speed_bps / 1e9:g} Gbit/s",
            "radix": req.radix,
            "compared with": f"one plane of {req.nic_bps / 1e9:g} Gbit/s, three tiers, "
            f"radix {req.radix // req.planes}",
            "oversubscription": "none (non-blocking)",
        },
        tables=_tables(p),
        plots=[PLOT],
        claims=_claims(p, four_plan),
        notes=[
            "Formulas: docs/plan.md; the same numbers from `mrcstack plan --gpus 131072`.",
            "Three tiers of 64-port switches reach 65,536 endpoints, so the three-tier counts "
            "are per endpoint, as the paper compares (131,072 would need a fourth tier or "
            "larger top-tier switches: `mrcstack plan --gpus 131072 --tiers 4` counts it).",
        ]
        if p
        else [
            f"No two-tier design: {req.endpoints:,} endpoints need more than two tiers of "
            f"radix-{req.radix} switches."
        ],
    )


EXPERIMENT = Experiment(
    "design-arithmetic",
    "Design",
    "8 x 100G planes and radix-512 switches: 131,072 GPUs in two tiers, 2/3 of the optics, "
    "3/5 of the switches, a lost link 0.4% of a node instead of 3%",
    "design",
    run,
    mechanisms=(Mechanism.PLANES,),
)
