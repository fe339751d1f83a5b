"""The MRC paper's experiments in the simulator, each MRC next to RoCE mode (one path per
flow, go-back-N: what RoCEv2 on ECMP does).

Time scaling: the paper's links run at 400 Gbit/s for seconds; here links run at
:data:`RATE` (10 Gbit/s) for milliseconds, so a run stays small enough for a laptop.  The
protocol's reactions are counted in RTTs, which scale with the link delay and packet size
alike; each result states its rate, fabric and time scale in its parameters.
"""

from __future__ import annotations

import functools
import random
import statistics
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import replace
from typing import Any

from mrcstack import addrplan
from mrcstack.experiments.base import Claim, Experiment, Outcome, Plot, Table
from mrcstack.experiments.plots import bars, cdf, lines
from mrcstack.fabric import Fabric, letters
from mrcstack.sim import FlowSpec, LinkFailure, NicDown, SimConfig, SimResult, SwitchFailure
from mrcstack.sim import run as sim_run
from mrcstack.sim import scenario as scenario_file
from mrcstack.sim.collectives import ring_steps, with_qps

RATE = 10e9
MODES = ("mrc", "roce")
BIN_S = 50e-6
SMOOTH = 4  # bins averaged for the "worst moment" figures (0.2 ms)


#: The runs of the experiment in progress, recorded as scenario files for the report.
_RUNS: ContextVar[list[tuple[str, str]] | None] = ContextVar("runs", default=None)


def run(cfg: SimConfig) -> SimResult:
    """The simulator; each run is kept as a scenario file, so any one can be rerun alone."""
    result = sim_run(cfg)
    runs = _RUNS.get()
    if runs is not None:
        runs.append((f"{len(runs) + 1:03d}-{cfg.mode}-seed{cfg.seed}", scenario_file.dumps(cfg)))
    return result


def _recorded(figure: Callable[[str, int], Outcome]) -> Callable[[str, int], Outcome]:
    @functools.wraps(figure)
    def wrapper(profile: str, seed: int) -> Outcome:
        runs: list[tuple[str, str]] = []
        token = _RUNS.set(runs)
        try:
            outcome = figure(profile, seed)
        finally:
            _RUNS.reset(token)
        outcome.scenarios.extend(runs)
        return outcome

    return wrapper


def _size(profile: str, quick: int, full: int) -> int:
    return quick if profile == "quick" else full


def _series(cfg: SimConfig) -> tuple[dict[str, Any], list[float]]:
    """Run; the result's JSON and goodput per bin in Gbit/s (the run's whole length)."""
    doc = run(cfg).to_json()
    return doc, [b["goodput_bps"] / 1e9 for b in doc["timeline"]]


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def _quantile(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank); NaN when empty."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _span(series: list[float], start_s: float, end_s: float) -> float:
    """Mean goodput between two times; a run that ended (or stalled for good) counts 0."""
    a, b = int(start_s / BIN_S), int(end_s / BIN_S)
    return _mean([series[i] if i < len(series) else 0.0 for i in range(a, max(b, a + 1))])


def _worst(series: list[float], start_s: float, end_s: float) -> float:
    """The lowest 0.2 ms average of goodput between two times."""
    a, b = int(start_s / BIN_S), max(int(end_s / BIN_S), int(start_s / BIN_S) + SMOOTH)
    spans = [_mean(series[i : i + SMOOTH]) for i in range(a, max(a + 1, b - SMOOTH + 1))]
    return min(spans) if spans else float("nan")


def _timeline(name: str, runs: dict[str, list[float]], until_s: float | None = None) -> Table:
    """Goodput per bin of each run, side by side (up to ``until_s``: a slower baseline's
    tail would squeeze the part where the faults are)."""
    n = max(len(s) for s in runs.values())
    if until_s is not None:
        n = min(n, int(until_s / BIN_S))
    rows = tuple(
        (round(i * BIN_S * 1e3, 4), *(s[i] if i < len(s) else 0.0 for s in runs.values()))
        for i in range(n)
    )
    return Table(name, ("time_ms", *runs), rows)


def _goodput_plot(
    columns: list[str],
    *,
    ylabel: str,
    title: str,
    marks: Sequence[tuple[float, str]] = (),
    spans: Sequence[tuple[float, float, str]] = (),
) -> Plot:
    """The ``goodput`` table's columns over time: the figure most experiments draw."""
    return Plot(
        "goodput",
        "goodput over time",
        lines(
            "goodput",
            "time_ms",
            columns,
            xlabel="time (ms)",
            ylabel=ylabel,
            title=title,
            marks=marks,
            spans=spans,
        ),
    )


def _fault_run(
    profile: str,
    seed: int,
    *,
    fabric: Fabric,
    pairs: tuple[tuple[int, int], ...],
    duration_s: float,
    faults: dict[str, Any],
) -> dict[str, tuple[dict[str, Any], list[float]]]:
    per_flow = int(RATE * fabric.planes / 8 * duration_s)
    out = {}
    for mode in MODES:
        cfg = SimConfig(
            fabric=fabric,
            pairs=pairs,
            bytes_per_flow=per_flow,
            mode=mode,
            rate_bps=RATE,
            seed=seed,
            max_sim_time_s=duration_s * 4,
            series_interval_s=BIN_S,
            **faults,
        )
        out[mode] = _series(cfg)
    return out


# Fig 9a: link flaps -------------------------------------------------------------------------
def fig9a(profile: str, seed: int) -> Outcome:
    fabric = Fabric()
    dur = _size(profile, 6, 12) * 1e-3
    flaps = [("p0:t0a-t1a", 1.0), ("p1:t0a-t1b", 2.0), ("p2:t0b-t1c", 3.0), ("p3:t0b-t1d", 4.0)]
    down = 0.5e-3
    failures = tuple(LinkFailure(link, t * 1e-3, t * 1e-3 + down) for link, t in flaps)
    runs = _fault_run(
        profile,
        seed,
        fabric=fabric,
        pairs=((0, 2), (1, 3)),
        duration_s=dur,
        faults={"link_failures": failures},
    )
    pre = {m: _span(s, 0.3e-3, 1e-3) for m, (_, s) in runs.items()}
    worst = {m: _worst(s, 1e-3, 4.5e-3 + down) / pre[m] for m, (_, s) in runs.items()}
    tl = _timeline("goodput", {m: s for m, (_, s) in runs.items()}, dur * 1.1)
    return Outcome(
        params={
            "fabric": "4 planes x 4 T1, 2 racks x 2 hosts",
            "rate": "10 Gbit/s per link",
            "flows": "h0->h2, h1->h3",
            "flaps": f"{len(flaps)} T0-T1 links, 0.5 ms each",
            "bin_ms": BIN_S * 1e3,
        },
        tables=[tl],
        plots=[
            _goodput_plot(
                list(MODES),
                ylabel="goodput (Gbit/s, both flows)",
                title="Fig 9a: T0-T1 link flaps",
                spans=[(t, t + down * 1e3, link) for link, t in flaps],
            )
        ],
        claims=[
            Claim(
                "MRC's worst 0.2 ms during the flaps, as a fraction of its pre-flap goodput",
                worst["mrc"],
                0.75,
            ),
            Claim(
                "RoCE mode's worst 0.2 ms during the flaps (a flow on a dead link stalls)",
                worst["roce"],
                0.75,
                "<=",
            ),
            Claim("MRC's worst moment minus RoCE mode's", worst["mrc"] - worst["roce"], 0.0),
        ],
    )


# Fig 9b: NIC ports down, then up ------------------------------------------------------------
def fig9b(profile: str, seed: int) -> Outcome:
    fabric = Fabric(planes=8, t1_per_plane=2)
    dur = _size(profile, 6, 12) * 1e-3
    t_down, t_up = 2e-3, 4e-3
    nics = tuple(NicDown(0, plane, t_down, t_up) for plane in range(4))
    cfg = SimConfig(
        fabric=fabric,
        pairs=((0, 2),),
        bytes_per_flow=int(RATE * 8 / 8 * dur),
        rate_bps=RATE,
        seed=seed,
        max_sim_time_s=dur * 4,
        series_interval_s=BIN_S,
        nic_downs=nics,
    )
    doc, s = _series(cfg)
    pre = _span(s, 0.5e-3, t_down)
    during = _span(s, t_down + 0.3e-3, t_up) / pre
    after = _span(s, t_up + 0.5e-3, t_up + 1.5e-3) / pre
    return Outcome(
        params={
            "fabric": "8 planes x 2 T1",
            "rate": "10 Gbit/s per link",
            "flow": "h0->h2",
            "fault": "h0's NICs of planes 0-3 down at 2 ms, up at 4 ms",
        },
        tables=[_timeline("goodput", {"mrc": s})],
        plots=[
            _goodput_plot(
                ["mrc"],
                ylabel="goodput (Gbit/s)",
                title="Fig 9b: 4 of 8 NIC ports down, then up",
                marks=[(t_down * 1e3, "4 NICs down"), (t_up * 1e3, "NICs up")],
            )
        ],
        claims=[
            Claim(
                "goodput with 4 of 8 ports down, over the pre-fault goodput (halves)", during, 0.40
            ),
            Claim("... and not more than about half", during, 0.60, "<="),
            Claim(
                "goodput 0.5-1.5 ms after the ports come back, over the pre-fault goodput",
                after,
                0.90,
            ),
        ],
        notes=[f"flow verified: {doc['verified']}"],
    )


# Fig 9d: a T1 switch fails ------------------------------------------------------------------
def fig9d(profile: str, seed: int) -> Outcome:
    fabric = Fabric()
    dur = _size(profile, 5, 10) * 1e-3
    t_fail = 1.5e-3
    pairs = ((0, 2), (1, 3), (2, 0), (3, 1))
    # The T1 that fails is the one RoCE mode's ECMP hashing loaded most (a short dry run):
    # the paper's figure is about the flows that crossed the failed switch.
    dry = run(
        SimConfig(
            fabric=fabric,
            pairs=pairs,
            bytes_per_flow=1 << 20,
            mode="roce",
            rate_bps=RATE,
            seed=seed,
        )
    ).to_json()
    load: dict[str, int] = {}
    for link, st in dry["links"].items():  # "p3:t0a-t1c": plane 3, T0 a to T1 c
        plane, _, ends = link.partition(":")
        for end in ends.split("-"):
            if end.startswith("t1"):
                load[f"{plane}-{end}"] = load.get(f"{plane}-{end}", 0) + int(st["bytes"])
    switch = max(sorted(load), key=lambda k: load[k]) if load else "p1-t1b"
    runs = _fault_run(
        profile,
        seed,
        fabric=fabric,
        pairs=pairs,
        duration_s=dur,
        faults={"switch_failures": (SwitchFailure(switch, t_fail),)},
    )
    pre = {m: _span(s, 0.5e-3, t_fail) for m, (_, s) in runs.items()}
    after = {m: _span(s, t_fail + 1e-3, t_fail + 2e-3) / pre[m] for m, (_, s) in runs.items()}
    failed = {m: sum(1 for f in d["flows"] if f["failed"]) for m, (d, _) in runs.items()}
    return Outcome(
        params={
            "fabric": "4 planes x 4 T1, 2 racks x 2 hosts",
            "rate": "10 Gbit/s per link",
            "flows": "4 cross-rack flows",
            "fault": f"T1 {switch} fails at 1.5 ms",
        },
        tables=[_timeline("goodput", {m: s for m, (_, s) in runs.items()}, dur * 1.1)],
        plots=[
            _goodput_plot(
                list(MODES),
                ylabel="goodput (Gbit/s, all flows)",
                title="Fig 9d: a T1 switch fails",
                marks=[(t_fail * 1e3, f"T1 {switch} fails")],
            )
        ],
        claims=[
            Claim(
                "MRC keeps this fraction of its pre-failure goodput 1-2 ms after a T1 fails "
                "(a T1 is 1/16 of the paths)",
                after["mrc"],
                0.85,
            ),
            Claim(
                "RoCE mode keeps (its flows through the failed T1 stall)", after["roce"], 0.9, "<="
            ),
            Claim("MRC flows failed", failed["mrc"], 0, "<="),
        ],
    )


# Fig 9c: many T0-T1 links down, one after another --------------------------------------------
def fig9c(profile: str, seed: int) -> Outcome:
    """The paper takes 20 T0-T1 links down 1 s apart in a large fabric; here 8 of the 32
    T0-T1 links of a 4-plane x 4-T1 fabric go down 0.25 ms apart and stay down (two per
    plane, on different T1s, so each plane keeps two whole T1 paths and the uplinks still
    carry the whole demand: what a large fabric's spare paths give)."""
    fabric = Fabric()
    dur = _size(profile, 6, 12) * 1e-3
    start, gap = 1.0e-3, 0.25e-3
    links = [
        link
        for plane in range(fabric.planes)
        for link in (f"p{plane}:t0a-t1{'abcd'[plane]}", f"p{plane}:t0b-t1{'abcd'[(plane + 1) % 4]}")
    ]
    failures = tuple(LinkFailure(link, start + i * gap) for i, link in enumerate(links))
    last = start + (len(links) - 1) * gap
    runs = _fault_run(
        profile,
        seed,
        fabric=fabric,
        pairs=((0, 2), (1, 3), (2, 0), (3, 1)),
        duration_s=dur,
        faults={"link_failures": failures},
    )
    pre = {m: _span(s, 0.3e-3, start) for m, (_, s) in runs.items()}
    after = {m: _span(s, last + 0.5e-3, last + 2e-3) / pre[m] for m, (_, s) in runs.items()}
    worst = _worst(runs["mrc"][1], start, last + 0.5e-3) / pre["mrc"]
    return Outcome(
        params={
            "fabric": "4 planes x 4 T1, 2 racks x 2 hosts",
            "rate": "10 Gbit/s per link",
            "flows": "4 cross-rack flows (a permutation)",
            "faults": f"{len(links)} T0-T1 links down {gap * 1e3:g} ms apart from "
            f"{start * 1e3:g} ms, for good (paper: 20 links, 1 s apart)",
        },
        tables=[_timeline("goodput", {m: s for m, (_, s) in runs.items()}, dur * 1.1)],
        plots=[
            _goodput_plot(
                list(MODES),
                ylabel="goodput (Gbit/s, all flows)",
                title=f"Fig 9c: {len(links)} T0-T1 links go down one by one",
                marks=[((start + i * gap) * 1e3, link) for i, link in enumerate(links)],
            )
        ],
        claims=[
            Claim(
                "MRC's goodput after the last link went down, over its pre-fault goodput",
                after["mrc"],
                0.85,
            ),
            Claim("MRC's worst 0.2 ms while links went down, over pre-fault", worst, 0.6),
            Claim("MRC's fraction kept minus RoCE mode's", after["mrc"] - after["roce"], 0.0),
        ],
    )


# Figs 10-11: a T0 fails; a T1 fails and returns ------------------------------------------------
def fig10_11(profile: str, seed: int) -> Outcome:
    """Permutation traffic across the two racks (every host sends to one host of the other
    rack and receives from another).  A T0 failure takes one plane away from its rack's
    hosts, whose NIC ports lose link: the steady state drops by that plane's share.  A T1
    failure takes 1/16 of the paths: nothing is lost for long."""
    fabric = Fabric()
    dur = _size(profile, 6, 12) * 1e-3
    t_fail, t_back = 1.5e-3, 3.5e-3
    pairs = ((0, 2), (1, 3), (2, 0), (3, 1))
    t0 = _fault_run(
        profile, seed, fabric=fabric, pairs=pairs, duration_s=dur,
        faults={"switch_failures": (SwitchFailure("p1-t0a", t_fail),)},
    )  # fmt: skip
    t1 = _fault_run(
        profile, seed, fabric=fabric, pairs=pairs, duration_s=dur,
        faults={"switch_failures": (SwitchFailure("p1-t1b", t_fail, t_back),)},
    )  # fmt: skip

    def ratio(s: list[float], a: float, b: float) -> float:
        return _span(s, a, b) / _span(s, 0.5e-3, t_fail)

    t0_after = {m: ratio(s, t_fail + 1e-3, t_fail + 2e-3) for m, (_, s) in t0.items()}
    t1_during = {m: ratio(s, t_fail + 0.3e-3, t_back) for m, (_, s) in t1.items()}
    t1_after = {m: ratio(s, t_back + 0.5e-3, t_back + 1.5e-3) for m, (_, s) in t1.items()}
    series = {f"T0 fails, {m}": s for m, (_, s) in t0.items()}
    series |= {f"T1 fails and returns, {m}": s for m, (_, s) in t1.items()}
    return Outcome(
        params={
            "fabric": "4 planes x 4 T1, 2 racks x 2 hosts",
            "rate": "10 Gbit/s per link",
            "flows": f"{len(pairs)} cross-rack flows (a permutation)",
            "faults": "T0 p1-t0a fails at 1.5 ms for good; T1 p1-t1b fails at 1.5 ms, "
            "returns at 3.5 ms (separate runs)",
        },
        tables=[_timeline("goodput", series, dur * 1.1)],
        plots=[
            _goodput_plot(
                list(series),
                ylabel="goodput (Gbit/s, all flows)",
                title="Figs 10-11: a T0 fails; a T1 fails and returns",
                marks=[(t_fail * 1e3, "switch fails"), (t_back * 1e3, "T1 returns")],
            )
        ],
        claims=[
            Claim(
                "MRC's steady state after a T0 fails, over before (every flow loses one "
                "plane of four at one end: about 0.75)",
                t0_after["mrc"],
                0.65,
            ),
            Claim(
                "... and at most 0.85 of it: a plane behind a dead T0 is really gone",
                t0_after["mrc"],
                0.85,
                "<=",
            ),
            Claim("MRC's goodput while a T1 is down, over before", t1_during["mrc"], 0.9),
            Claim("MRC's goodput after the T1 returns, over before", t1_after["mrc"], 0.9),
            Claim(
                "MRC's fraction kept while the T1 is down minus RoCE mode's (a tie within "
                "0.02 when no RoCE flow hashed onto that T1)",
                t1_during["mrc"] - t1_during["roce"],
                -0.02,
            ),
        ],
    )


# Figs 12-13: one EV dropping 20% ------------------------------------------------------------
def fig12(profile: str, seed: int) -> Outcome:
    fabric = Fabric()
    size = _size(profile, 16, 64) << 20
    base = SimConfig(
        fabric=fabric,
        bytes_per_flow=size,
        rate_bps=RATE,
        seed=seed,
        series_interval_s=BIN_S,
        max_sim_time_s=1.0,
    )
    clean, s0 = _series(base)
    # An EV the flow sprays on from the start: the first of plane 1 in its profile.
    entries = addrplan.ev_profile(fabric, 0, fabric.hosts - 1, base.ev_count)
    bad_ev = next(e.value for e in entries if e.port == 1)
    lossy, s1 = _series(replace(base, ev_loss=((bad_ev, 0.2),)))
    demoted = [
        e["t_s"]
        for e in lossy["events"]
        if e["ev"] == bad_ev and e["new"] == "assumed_bad" and e["side"] == "sender"
    ]
    rtt = base.base_rtt(0, fabric.hosts - 1)
    ratio = lossy["goodput_bps"] / clean["goodput_bps"]
    return Outcome(
        params={
            "fabric": "4 planes x 4 T1",
            "rate": "10 Gbit/s per link",
            "bytes": size,
            "lossy_ev": hex(bad_ev),
            "ev_loss": 0.2,
            "base_rtt_us": rtt * 1e6,
        },
        tables=[_timeline("goodput", {"no loss": s0, "one EV drops 20%": s1})],
        plots=[
            _goodput_plot(
                ["no loss", "one EV drops 20%"],
                ylabel="goodput (Gbit/s)",
                title="Figs 12-13: one EV dropping 20%",
            )
        ],
        claims=[
            Claim("goodput with one EV dropping 20%, over lossless goodput", ratio, 0.9),
            Claim(
                "RTTs until the lossy EV is ASSUMED_BAD",
                (min(demoted) / rtt) if demoted else float("nan"),
                10,
                "<=",
            ),
        ],
    )


# Fig 14: two flows forced onto one path -------------------------------------------------------
def fig14(profile: str, seed: int) -> Outcome:
    fabric = Fabric(planes=1, racks=2, hosts_per_rack=2, t1_per_plane=4)
    size = _size(profile, 16, 64) << 20
    bin_s = 0.5e-3
    # Three EVs of each flow cross T1 a (the shared path), the others the flow's own T1:
    # spraying in rotation would put 3 of 5 packets in use on the shared path.
    shared = tuple(addrplan.ev_value(0, 0, e) for e in range(3))
    own = {0: 1, 1: 2}  # flow -> its own T1
    evs = {
        f: shared + tuple(addrplan.ev_value(0, t1, e) for e in range(3)) for f, t1 in own.items()
    }
    pairs = ((0, 2), (1, 3))
    never_mark = {
        "ecn_kmin_bytes": fabric.queue_bytes - 2,
        "ecn_kmax_bytes": fabric.queue_bytes - 1,
    }
    cases: dict[str, tuple[str, dict[int, tuple[int, ...]], dict[str, Any]]] = {
        "MRC, ECN": ("mrc", evs, {}),
        "MRC, no ECN marks": ("mrc", evs, never_mark),
        "RoCE mode (one path)": ("roce", {0: shared[:1], 1: shared[:1]}, {}),
    }
    base = SimConfig(
        fabric=fabric, bytes_per_flow=size, rate_bps=RATE, seed=seed, max_sim_time_s=1.0
    )
    alone = run(replace(base, flow_specs=(FlowSpec(*pairs[0], evs=evs[0]),)))
    alone_bps = alone.flows[0].goodput_bps
    series: dict[str, list[float]] = {}
    rows = []
    slowest: dict[str, float] = {}
    share: dict[str, float] = {}
    demoted: dict[str, int] = {}  # EVs the senders took for broken (a false loss here)
    marks: dict[str, int] = {}
    for label, (mode, pins, extra) in cases.items():
        specs = tuple(FlowSpec(s, d, evs=pins[f]) for f, (s, d) in enumerate(pairs))
        r = run(replace(base, flow_specs=specs, mode=mode, series_interval_s=bin_s, **extra))
        for f in range(2):
            series[f"{label}: flow {f}"] = [b.flow_bytes[f] * 8 / bin_s / 1e9 for b in r.timeline]
        up = [r.links.get(f"p0:t0a-t1{letters(t)}", {}).get("bytes", 0) for t in range(3)]
        share[label] = up[0] / sum(up) if sum(up) else float("nan")
        slowest[label] = min(f.goodput_bps for f in r.flows) / alone_bps
        skips = sum(
            1 for e in r.events if e.side == "sender" and e.new == "skip" and e.ev in shared
        )
        demoted[label] = sum(1 for e in r.events if e.side == "sender" and e.new == "assumed_bad")
        marks[label] = r.ecn_marks
        rows.append(
            (
                label,
                *(f.goodput_bps / 1e9 for f in r.flows),
                slowest[label],
                share[label],
                r.ecn_marks,
                r.trims,
                skips,
                demoted[label],
                sum(r.retransmissions.values()),
                r.spurious_retransmissions,
            )
        )
    table = Table(
        "flows",
        (
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
        ),
        tuple(rows),
    )
    timeline = Table(
        "goodput",
        ("time_ms", *series),
        tuple(
            (round(i * bin_s * 1e3, 4), *(s[i] if i < len(s) else 0.0 for s in series.values()))
            for i in range(max(len(s) for s in series.values()))
        ),
    )
    rotation = len(shared) / (len(evs[0]) - 1)  # one EV of six is a backup
    return Outcome(
        params={
            "fabric": "1 plane x 4 T1, 2 racks x 2 hosts",
            "rate": "10 Gbit/s per link",
            "bytes_per_flow": size,
            "flows": "h0 -> h2 and h1 -> h3, both from rack a to rack b",
            "pinned": "each flow: 3 EVs over T1 a (shared) + 3 over its own T1 (b, c); "
            "5 in use, 1 backup",
            "alone_gbps": alone_bps / 1e9,
        },
        tables=[table, timeline],
        plots=[
            Plot(
                "goodput",
                "per-flow goodput",
                lines(
                    "goodput",
                    "time_ms",
                    list(series),
                    xlabel="time (ms)",
                    ylabel="goodput per flow (Gbit/s)",
                    title="Fig 14: two flows pinned onto one shared path",
                ),
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
        ],
        claims=[
            Claim(
                "MRC with ECN: the slower flow's goodput over its goodput alone",
                slowest["MRC, ECN"],
                0.9,
            ),
            Claim(
                "MRC: the slower flow with ECN marks over without them",
                slowest["MRC, ECN"] / slowest["MRC, no ECN marks"],
                1.05,
            ),
            Claim(
                f"MRC with ECN: the shared path's share of the bytes, under the {rotation:.2f} "
                "that rotation alone would give",
                share["MRC, ECN"],
                rotation - 0.02,
                "<=",
            ),
            Claim(
                "RoCE mode, both flows on the one path: the slower flow over alone",
                slowest["RoCE mode (one path)"],
                0.6,
                "<=",
            ),
        ],
        notes=[
            "Pinning: each flow lists only its six EVs (FlowSpec.evs). ECN marks make the "
            "sender SKIP the shared path's EVs for a while, so both flows move part of "
            "their traffic to their own paths; without marks (thresholds above the queue) "
            "they keep the rotation's share and the shared link is the bottleneck. In the "
            "paper one flow moves entirely; here both shed part of the shared path.",
            f"In this run the switches marked {marks['MRC, ECN']} packets in the ECN case, "
            f"and the senders demoted {demoted['MRC, ECN']} EV(s) (ECN case) and "
            f"{demoted['MRC, no ECN marks']} (no marks) to ASSUMED_BAD. No packet is "
            "dropped, so a demotion would be a false loss: at the start RACK takes a few "
            "packets queued on the shared path for lost (packets of the same plane on the "
            "idle paths come back first) and resends them (the spurious column), but an EV "
            "that has not yet had an RTO to answer is not condemned for it. A demotion "
            "would swap in a backup EV over the flow's own path and spread the flows "
            "before any ECN mark could; the two cases would end alike and the ECN claim "
            "fail, as it should.",
        ],
    )


# Figs 16-17: collectives under loss ---------------------------------------------------------
#: The collectives' cases: (mode, queue pairs per transfer).  RoCE deployments split a
#: transfer over many QPs so that ECMP hashes spread it; MRC sprays one QP.
COLLECTIVE_CASES = {
    "MRC, 1 QP": ("mrc", 1),
    "RoCE, 1 QP": ("roce", 1),
    "RoCE, 16 QPs": ("roce", 16),
}


def _collective(kind: str, fabric: Fabric, chunk: int) -> tuple[FlowSpec, ...]:
    if kind == "ring all-reduce":
        # Ring neighbours alternate racks, so every step crosses the fabric.
        half = fabric.hosts // 2
        ring = [
            h for pair in zip(range(half), range(half, fabric.hosts), strict=True) for h in pair
        ]
        return ring_steps("ring-allreduce", ring, chunk, name=kind)
    hosts = range(fabric.hosts)
    return tuple(FlowSpec(s, d, bytes=chunk, group=kind) for s in hosts for d in hosts if s != d)


def fig16(profile: str, seed: int) -> Outcome:
    fabric = Fabric(racks=2, hosts_per_rack=4)
    chunk = _size(profile, 256, 1024) << 10
    losses = (0.0, 0.001, 0.01)
    seeds = [seed + k for k in range(_size(profile, 2, 5))]
    kinds = ("ring all-reduce", "all-to-all")
    rows = []
    times: dict[tuple[str, str, float], list[float]] = {}
    failed: dict[tuple[str, str, float], int] = {}
    for kind in kinds:
        specs = _collective(kind, fabric, chunk)
        for case, (mode, qps) in COLLECTIVE_CASES.items():
            flows = with_qps(specs, qps) if qps > 1 else specs
            for loss in losses:
                key = (kind, case, loss)
                times[key], failed[key] = [], 0
                for run_seed in seeds:
                    r = run(
                        SimConfig(
                            fabric=fabric,
                            flow_specs=flows,
                            mode=mode,
                            rate_bps=RATE,
                            loss=loss,
                            seed=run_seed,
                            max_sim_time_s=2.0,
                        )
                    )
                    # A failed flow fails every step after it: the run ends early, and its
                    # time is only a lower bound.
                    bad = sum(not f.verified for f in r.flows)
                    times[key].append(r.completion_time_s)
                    failed[key] += bad
                    rows.append((kind, case, loss * 100, run_seed, r.completion_time_s * 1e3, bad))
    runs = Table(
        "runs",
        ("collective", "case", "loss_pct", "seed", "completion_ms", "failed_flows"),
        tuple(rows),
    )
    mean = {k: _mean(v) for k, v in times.items()}
    summary_rows = []
    for kind in kinds:
        for case in COLLECTIVE_CASES:
            row: list[Any] = [f"{kind}, {case}"]
            for loss in losses:
                v = [t * 1e3 for t in times[(kind, case, loss)]]
                row += [_mean(v), min(v), max(v)]
            summary_rows.append(tuple(row))
    cols = [f"{loss * 100:g}% loss" for loss in losses]
    summary = Table(
        "summary",
        ("case", *(f"{c}{suffix}" for c in cols for suffix in ("", " min", " max"))),
        tuple(summary_rows),
    )
    mrc, roce1, roce16 = COLLECTIVE_CASES
    ar, a2a = kinds

    def slow(kind: str, case: str, loss: float) -> float:
        return mean[(kind, case, loss)] / mean[(kind, case, 0.0)]

    mrc_failed = sum(v for (k, c, _), v in failed.items() if c == mrc)
    roce_failed = {
        c: sum(v for (k, cc, _), v in failed.items() if cc == c) for c in (roce1, roce16)
    }
    return Outcome(
        params={
            "fabric": "4 planes x 4 T1, 2 racks x 4 hosts",
            "rate": "10 Gbit/s per link",
            "chunk_bytes": chunk,
            "ring all-reduce": "2 (n - 1) dependent steps of one chunk per host, ring "
            "neighbours in different racks",
            "all-to-all": "every host sends one chunk to every other, all at once",
            "seeds": seeds,
            "loss": "random, on every link in both directions",
            "error_bars": "min and max over the seeds",
        },
        tables=[runs, summary],
        plots=[
            Plot(
                "completion",
                "completion",
                bars(
                    "summary",
                    "case",
                    cols,
                    ylabel="completion time (ms), mean of seeds",
                    title="Figs 16-17: collectives under random loss",
                    errs={c: (f"{c} min", f"{c} max") for c in cols},
                ),
            )
        ],
        claims=[
            Claim(
                "ring all-reduce, lossless: RoCE 1 QP's time over MRC's (hash collisions)",
                mean[(ar, roce1, 0.0)] / mean[(ar, mrc, 0.0)],
                1.5,
            ),
            Claim(
                "ring all-reduce, lossless: RoCE 16 QPs' time over MRC 1 QP's",
                mean[(ar, roce16, 0.0)] / mean[(ar, mrc, 0.0)],
                1.0,
            ),
            Claim(
                "ring all-reduce at 0.1% loss over lossless, MRC", slow(ar, mrc, 0.001), 1.25, "<="
            ),
            Claim("all-to-all at 0.1% loss over lossless, MRC", slow(a2a, mrc, 0.001), 1.25, "<="),
            Claim("ring all-reduce at 1% loss over lossless, MRC", slow(ar, mrc, 0.01), 1.5, "<="),
            Claim("all-to-all at 1% loss over lossless, MRC", slow(a2a, mrc, 0.01), 1.5, "<="),
            Claim(
                "all-to-all at 1% loss: RoCE 16 QPs' slowdown over MRC's (a lower bound when "
                "RoCE flows failed)",
                slow(a2a, roce16, 0.01) / slow(a2a, mrc, 0.01),
                1.0,
            ),
            Claim("MRC flows that failed (every run, every loss)", float(mrc_failed), 0.0, "<="),
        ],
        notes=[
            f"RoCE mode: {roce_failed[roce1]} flow(s) with 1 QP and {roce_failed[roce16]} "
            "with 16 QPs exhausted their retries (go-back-N under random loss) or waited "
            "for one that did; a run with a failed flow ends when it fails, so its time is "
            "a lower bound and RoCE's slowdown is understated."
            if any(roce_failed.values())
            else "RoCE mode: every flow completed.",
            "Where this disagrees with the paper (MRC slowing more than it says under "
            "loss): the loss here is per link, so a packet crossing 4 links (and its ack "
            "4 more) is lost about 8 times as often as the percentage says; and a chunk "
            "is short (a few RTTs), sprayed over so many EVs that no EV carries two of its "
            "packets, so a loss is never followed by a later packet on its own path and "
            "is found by the tail-loss probe (two smoothed RTTs) rather than by SACKs. "
            "A step that loses a packet takes about twice as long, and the ring's "
            "dependent steps add those delays up; all-to-all overlaps them. The full "
            "profile's 1 MiB chunks make each delay a smaller share.",
        ],
    )


# Fig 18: incast -----------------------------------------------------------------------------
INCAST_CASES: dict[str, dict[str, Any]] = {
    "MRC, trimming": {},
    "MRC, tail drop": {"trim": False},
    # The paper's baseline: one path per flow, DCQCN, ECN marked on the last hop too.
    "RoCE mode + DCQCN": {
        "mode": "roce",
        "trim": False,
        "cc": "dcqcn_lite",
        "ecn_last_hop": True,
    },
}


def fig18(profile: str, seed: int) -> Outcome:
    fabric = Fabric(racks=2, hosts_per_rack=5)
    per = _size(profile, 256, 1024) << 10  # bursts the size of a collective's chunks
    queue = 128 << 10  # shallow ports, so that the incast overflows them
    receiver = 0
    senders = range(2, 9)  # 3 in the receiver's rack, 4 across the fabric
    victim = FlowSpec(9, 1, bytes=4 * per, group="victim")  # rack b -> rack a, beside it
    specs = (*(FlowSpec(s, receiver, group="incast") for s in senders), victim)
    # Every incast flow sharing the receiver's links fairly, plus the propagation.
    fair = len(senders) * per * 8 / (fabric.planes * RATE)
    seeds = [seed + k for k in range(_size(profile, 3, 8))]
    rows = []
    summary = []
    p99: dict[str, float] = {}
    util: dict[str, float] = {}
    victim_kept: dict[str, list[float]] = {}
    late: dict[str, int] = {}  # losses found by a timeout or a tail-loss probe
    for label, extra in INCAST_CASES.items():
        late[label] = 0
        slowdowns: list[float] = []
        utils: list[float] = []
        victim_kept[label] = []
        for run_seed in seeds:
            base = SimConfig(
                fabric=fabric,
                bytes_per_flow=per,
                rate_bps=RATE,
                queue_bytes=queue,
                seed=run_seed,
                max_sim_time_s=2.0,
                **extra,
            )
            alone = run(replace(base, flow_specs=(victim,))).flows[0].goodput_bps
            r = run(replace(base, flow_specs=specs))
            late[label] += r.retransmissions.get("timeout", 0) + r.retransmissions.get("tlp", 0)
            incast = [f for f in r.flows if f.group == "incast"]
            for f in incast:
                fct = f.fct_s if f.fct_s is not None else float("inf")
                slowdowns.append(fct / fair)
                rows.append((label, run_seed, fct * 1e3, fct / fair))
            end = max((f.completion_time_s or r.sim_time_s) for f in incast)
            # The receiver's links while the incast lasts (the victim ends earlier).
            utils.append(r.receiver_utilization[f"h{receiver}"] * r.completion_time_s / end)
            victim_kept[label].append(r.flows[-1].goodput_bps / alone)
        p99[label] = _quantile(slowdowns, 0.99)
        util[label] = _mean(utils)
        summary.append(
            (
                label,
                _quantile(slowdowns, 0.5),
                p99[label],
                util[label],
                _mean(victim_kept[label]),
                min(victim_kept[label]),
            )
        )
    table = Table("fct", ("case", "seed", "fct_ms", "slowdown"), tuple(rows))
    stats = Table(
        "summary",
        ("case", "p50_slowdown", "p99_slowdown", "receiver_utilization", "victim_mean",
         "victim_worst"),
        tuple(summary),
    )  # fmt: skip
    mrc, drop, roce = INCAST_CASES
    return Outcome(
        params={
            "fabric": "4 planes x 4 T1, 2 racks x 5 hosts",
            "rate": "10 Gbit/s per link",
            "switch_queue_bytes": queue,
            "incast": f"{len(senders)}:1 into h{receiver}, {per} bytes each",
            "victim": "h9 -> h1 (rack b to the receiver's rack), 4x the bytes",
            "ideal_ms": fair * 1e3,
            "seeds": seeds,
            "cases": {k: v or "defaults (NSCC)" for k, v in INCAST_CASES.items()},
        },
        tables=[table, stats],
        plots=[
            Plot(
                "fct_cdf",
                "incast flow completion",
                cdf(
                    "fct",
                    "slowdown",
                    "case",
                    xlabel="incast flow completion time / ideal (every flow sharing the "
                    "receiver's links fairly)",
                    title=f"Fig 18: {len(senders)}:1 incast, {len(seeds)} seeds pooled",
                ),
            ),
            Plot(
                "receiver_victim",
                "receiver utilization and victim",
                bars(
                    "summary",
                    "case",
                    ["receiver_utilization", "victim_mean", "victim_worst"],
                    ylabel="fraction",
                    title="Fig 18: receiver link use; victim goodput over its goodput alone",
                ),
            ),
        ],
        claims=[
            Claim("p99 slowdown, MRC with trimming", p99[mrc], 1.5, "<="),
            Claim(
                "p99 slowdown: MRC with tail drop over MRC with trimming", p99[drop] / p99[mrc], 1.0
            ),
            Claim(
                "MRC with trimming: losses left to a timeout or a tail-loss probe (every "
                f"trim is NACKed at once; tail drop left {late[drop]})",
                float(late[mrc]),
                0.0,
                "<=",
            ),
            Claim(
                "p99 slowdown: RoCE mode + DCQCN over MRC with trimming", p99[roce] / p99[mrc], 1.0
            ),
            Claim("receiver's links busy during the incast, MRC with trimming", util[mrc], 0.9),
            Claim(
                "victim flow, MRC: goodput over its goodput alone (worst seed)",
                min(victim_kept[mrc]),
                0.9,
            ),
            Claim(
                "victim flow, RoCE mode + DCQCN: goodput over alone (worst seed; the paper "
                "saw -25% to -75%)",
                min(victim_kept[roce]),
                0.9,
                "<=",
            ),
        ],
        notes=[
            "PFC is not modelled (the fabric is lossy, as MRC's is): the paper's RoCE "
            "victims also suffer pause frames spreading the incast; here a RoCE victim "
            "loses only where its one hashed path shares a link with incast flows, which "
            "depends on the seed.",
            "Slowdown is against every incast flow sharing the receiver's links fairly; "
            "RoCE mode's flows each use one plane, so the hash can leave some of the "
            "receiver's planes idle (its receiver utilization).",
        ],
    )


# Fig 20: permutation traffic ----------------------------------------------------------------
def fig20(profile: str, seed: int) -> Outcome:
    fabric = Fabric(racks=4, hosts_per_rack=2, t1_per_plane=8)
    per = _size(profile, 4, 16) << 20
    rng = random.Random(seed)
    rows = []
    frac: dict[str, list[float]] = {m: [] for m in MODES}
    for trial in range(_size(profile, 3, 10)):
        hosts = list(range(fabric.hosts))
        while True:  # a permutation with every host sending to another rack
            rng.shuffle(hosts)
            if all(fabric.rack_of(s) != fabric.rack_of(d) for s, d in enumerate(hosts)):
                break
        pairs = tuple(enumerate(hosts))
        for mode in MODES:
            doc = run(
                SimConfig(
                    fabric=fabric,
                    pairs=pairs,
                    bytes_per_flow=per,
                    mode=mode,
                    rate_bps=RATE,
                    seed=seed + trial,
                    max_sim_time_s=2.0,
                )
            ).to_json()
            frac[mode].append(doc["goodput_fraction"])
            rows.append((trial, mode, doc["goodput_fraction"]))
    table = Table("goodput", ("trial", "mode", "goodput_fraction"), tuple(rows))
    means = Table("mean", ("mode", "goodput_fraction"), tuple((m, _mean(frac[m])) for m in MODES))
    return Outcome(
        params={
            "fabric": "4 planes x 8 T1, 4 racks x 2 hosts",
            "rate": "10 Gbit/s per link",
            "bytes_per_flow": per,
            "trials": len(frac["mrc"]),
        },
        tables=[table, means],
        plots=[
            Plot(
                "goodput",
                "goodput",
                bars(
                    "mean",
                    "mode",
                    ["goodput_fraction"],
                    ylabel="goodput / capacity",
                    title="Fig 20: permutation traffic, spraying against one ECMP path per flow",
                ),
            )
        ],
        claims=[
            Claim("MRC's goodput as a fraction of capacity", _mean(frac["mrc"]), 0.85),
            Claim("RoCE mode's (ECMP collisions)", _mean(frac["roce"]), 1.0, "<="),
            Claim(
                "MRC over RoCE mode (the paper: colliding flows get 1/2 or 1/3 of the rate)",
                _mean(frac["mrc"]) / _mean(frac["roce"]),
                1.5,
            ),
        ],
    )


# Section 5.2.1: small-write latency ---------------------------------------------------------
def latency(profile: str, seed: int) -> Outcome:
    """One host writes 4 KiB, one write in flight at a time (as ``mrc-write-lat`` does):
    alone; while six other hosts send bulk writes to its receiver (a 6:1 incast on the
    receiver's links); and while three other flows cross the fabric between the racks (the
    T0s' uplinks are 2:1 oversubscribed, so one ECMP path per flow can collide), over
    several seeds.  The bulk is sized to outlast the probe, and a claim checks it did."""
    fabric = Fabric(racks=2, hosts_per_rack=4, t1_per_plane=2)
    writes = _size(profile, 64, 512)
    bulk = _size(profile, 24, 192) << 20
    seeds = [seed + k for k in range(_size(profile, 2, 5))]
    scenarios: dict[str, tuple[tuple[tuple[int, int], ...], list[int]]] = {
        "idle": (((1, 5),), [seed]),
        "incast": (((1, 0), *((h, 0) for h in range(2, fabric.hosts))), [seed]),
        "fabric load": (((1, 5), (0, 4), (2, 6), (3, 7)), seeds),
    }
    rows = []
    lat: dict[str, list[float]] = {}
    outlasted: list[bool] = []
    for scenario, (pairs, run_seeds) in scenarios.items():
        for mode in MODES:
            label = f"{'MRC' if mode == 'mrc' else 'RoCE mode'}, {scenario}"
            lat[label] = []
            for s in run_seeds:
                result = run(
                    SimConfig(
                        fabric=fabric,
                        pairs=pairs,
                        bytes_per_flow=bulk,
                        mode=mode,
                        rate_bps=RATE,
                        seed=s,
                        max_sim_time_s=2.0,
                        latency_flows=(0,),
                        latency_writes=writes,
                    )
                )
                lat[label] += result.flows[0].write_latency_s
                if len(pairs) > 1:
                    probe_end = result.flows[0].completion_time_s or float("inf")
                    ends = [f.completion_time_s or float("inf") for f in result.flows[1:]]
                    outlasted.append(min(ends) >= probe_end)
            rows += [(label, x * 1e6) for x in lat[label]]
    table = Table("latency", ("case", "latency_us"), tuple(rows))
    summary = Table(
        "summary",
        ("case", "p50_us", "p99_us", "writes"),
        tuple(
            (k, _quantile(v, 0.5) * 1e6, _quantile(v, 0.99) * 1e6, len(v)) for k, v in lat.items()
        ),
    )

    def ratio(scenario: str, p: float) -> float:
        return _quantile(lat[f"MRC, {scenario}"], p) / _quantile(lat[f"RoCE mode, {scenario}"], p)

    idle = lat["MRC, idle"]
    return Outcome(
        params={
            "fabric": "4 planes x 2 T1, 2 racks x 4 hosts (T0 uplinks 2:1 oversubscribed)",
            "rate": "10 Gbit/s per link",
            "probe": f"{writes} writes of 4 KiB, one in flight",
            "incast": f"h1 probes h0 while h2..h7 send {bulk >> 20} MiB each to h0",
            "fabric_load": f"h1 probes h5 while h0->h4, h2->h6, h3->h7 send {bulk >> 20} MiB "
            f"each; seeds {seeds}",
        },
        tables=[table, summary],
        plots=[
            Plot(
                "latency_cdf",
                "write latency",
                cdf(
                    "latency",
                    "latency_us",
                    "case",
                    xlabel="completion latency of a 4 KiB write (us, log scale)",
                    ylabel="fraction of writes",
                    title="Section 5.2.1: small-write latency, idle and under load",
                    logx=True,
                ),
            )
        ],
        claims=[
            Claim(
                "MRC idle: p99 over p50 (a flat distribution)",
                _quantile(idle, 0.99) / _quantile(idle, 0.5),
                1.5,
                "<=",
            ),
            Claim(
                "6:1 incast on the receiver, p99: MRC over RoCE mode (both wait in the "
                "receiver's last-hop queue: within 25%)",
                ratio("incast", 0.99),
                1.25,
                "<=",
            ),
            Claim(
                "fabric load, p99 over the seeds: MRC over RoCE mode (no worse, within 5%)",
                ratio("fabric load", 0.99),
                1.05,
                "<=",
            ),
            Claim("fabric load, median: MRC over RoCE mode", ratio("fabric load", 0.5), 1.0, "<="),
            Claim(
                "loaded runs in which the bulk outlasted every probe write (fraction)",
                sum(outlasted) / len(outlasted) if outlasted else float("nan"),
                1.0,
            ),
        ],
        notes=[
            "Latency here is the simulator's: serialization, propagation and queueing in "
            "the switches and NSCC's window, no host software.  Under an incast the "
            "receiver's own links are the queue; spraying cannot route around it, so MRC "
            "is not expected to beat RoCE mode there.  Across the fabric, whether one ECMP "
            "path per flow collides depends on the seed: several seeds are pooled."
        ],
    )


EXPERIMENTS = (
    Experiment(
        "fig9a-link-flaps",
        "Fig 9a",
        "goodput over time while T0-T1 links flap",
        "sim",
        _recorded(fig9a),
    ),
    Experiment(
        "fig9b-nic-down-up",
        "Fig 9b",
        "with 8 planes and 4 NIC ports down, goodput halves and comes back",
        "sim",
        _recorded(fig9b),
    ),
    Experiment(
        "fig9c-many-links",
        "Fig 9c",
        "8 T0-T1 links go down one by one and stay down (time-scaled)",
        "sim",
        _recorded(fig9c),
    ),
    Experiment(
        "fig9d-t1-fail", "Fig 9d", "a T1 switch fails under traffic", "sim", _recorded(fig9d)
    ),
    Experiment(
        "fig10-11-switch-fail",
        "Figs 10-11",
        "a T0 fails (one plane's share lost), a T1 fails and returns (nothing lost)",
        "sim",
        _recorded(fig10_11),
    ),
    Experiment(
        "fig12-lossy-ev",
        "Figs 12-13",
        "one EV dropping 20%: bandwidth stays flat, the EV is replaced within a few RTTs",
        "sim",
        _recorded(fig12),
    ),
    Experiment(
        "fig14-shared-ev",
        "Fig 14",
        "two flows pinned onto one shared path: ECN spreads them, both near line rate",
        "sim",
        _recorded(fig14),
    ),
    Experiment(
        "fig16-collectives",
        "Figs 16-17",
        "ring all-reduce (dependent steps) and all-to-all under 0, 0.1 and 1% loss, MRC "
        "1 QP against RoCE mode with 1 and 16 QPs, several seeds",
        "sim",
        _recorded(fig16),
    ),
    Experiment(
        "fig18-incast",
        "Fig 18",
        "7:1 incast plus a victim: trimming against tail drop, MRC against RoCE mode + "
        "DCQCN with last-hop ECN, per-flow completion",
        "sim",
        _recorded(fig18),
    ),
    Experiment(
        "fig20-permutation",
        "Fig 20",
        "permutation traffic: spraying against one ECMP path per flow",
        "sim",
        _recorded(fig20),
    ),
    Experiment(
        "latency-small-writes",
        "Section 5.2.1",
        "completion latency of 4 KiB writes, idle and under a 6:1 incast (CDF)",
        "sim",
        _recorded(latency),
    ),
)
