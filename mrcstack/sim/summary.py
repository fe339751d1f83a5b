"""The simulator's readable summary: the run's figures, its flows, and a timeline of the
faults and the EV state changes they caused, so a claim such as "the EV on the failed link
went ASSUMED_BAD 22 us after the failure" can be read off without scripting the JSON.

Up to :data:`LISTED` EV state changes are listed one by one, between the faults at their
times; more than that (random loss on every link makes hundreds) are counted per slice of
the run, by the state entered, with the faults in the slice they fall in, as the demo's
table shows them per second.
"""

from __future__ import annotations

from collections import Counter

from mrcstack.fabric import format_rate, format_size
from mrcstack.sim.config import SimConfig
from mrcstack.sim.result import SimResult

PROG = "mrcstack-sim"
LISTED = 16  # EV state changes listed one by one; more are counted per slice
SLICES = 10


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _counts(table: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(table.items()) if v) or "none"


def faults(cfg: SimConfig) -> list[tuple[float, str]]:
    """Every fault's start and end as ``(time, text)``, in time order."""
    out: list[tuple[float, str]] = []

    def window(start: float, end: float | None, down: str, up: str) -> None:
        out.append((start, down))
        if end is not None:
            out.append((end, up))

    for link in cfg.link_failures:
        window(link.start, link.end, f"link {link.link} down", f"link {link.link} up")
    for sw in cfg.switch_failures:
        window(sw.start, sw.end, f"switch {sw.switch} fails", f"switch {sw.switch} back")
    for nic in cfg.nic_downs:
        name = f"h{nic.host} plane {nic.plane} NIC port"
        window(nic.start, nic.end, f"{name} down", f"{name} up")
    for plane in cfg.plane_failures:
        window(plane.start, plane.end, f"plane {plane.plane} fails", f"plane {plane.plane} back")
    for change in cfg.loss_changes:
        where = change.link or "every link"
        out.append((change.at, f"random loss {change.loss:.2%} on {where}"))
    return sorted(out, key=lambda item: item[0])


def timeline(result: SimResult) -> list[str]:
    """The faults and EV state changes: each one at its time, or counted per slice."""
    marks = faults(result.config)
    events = result.events
    if not marks and not events:
        return []
    more = f", {result.events_truncated} more not recorded" if result.events_truncated else ""
    if len(events) <= LISTED:
        lines = [f"  timeline           faults and EV state changes{more}"]
        rows = [(t, 0, f"fault: {text}") for t, text in marks]
        rows += [
            (
                e.t_s,
                1,
                f"flow {e.flow} {e.side} EV {e.ev:#05x} plane {e.plane} "
                f"{e.old} -> {e.new} ({e.reason})",
            )
            for e in events
        ]
        rows.sort(key=lambda r: (r[0], r[1]))
        return lines + [f"    {_ms(t):>11}  {text}" for t, _, text in rows]
    end = max(result.sim_time_s, *(t for t, _ in marks)) or 1e-9
    width = end / SLICES
    lines = [
        f"  timeline           EV state changes per {_ms(width)} by the state entered "
        f"({len(events)} in all{more}), and the faults"
    ]
    for k in range(SLICES):
        lo, hi = k * width, (k + 1) * width
        last = k == SLICES - 1
        within = [e for e in events if lo <= e.t_s < hi or (last and e.t_s >= hi)]
        entered = Counter(e.new for e in within)
        states = ", ".join(f"{s} {n}" for s, n in sorted(entered.items())) or "-"
        here = [text for t, text in marks if lo <= t < hi or (last and t >= hi)]
        line = f"    {lo * 1e3:7.3f}-{hi * 1e3:.3f} ms {len(within):>6}  {states}"
        lines.append(line + "".join(f"; fault: {text}" for text in here))
    return lines


def summary(result: SimResult) -> str:
    """A short human-readable report of a run."""
    cfg, f = result.config, result.config.fabric
    rate = format_rate(cfg.host_rate_bps())
    lines = [
        f"{PROG}: {len(result.flows)} flow(s), {f.planes} planes x {f.t1_per_plane} T1, "
        f"{f.racks} racks x {f.hosts_per_rack} hosts, {rate} host links, mode {cfg.mode}, "
        f"cc {cfg.cc}, seed {result.seed}",
        f"  verified           {'yes' if result.verified else 'NO'}",
        f"  completion time    {_ms(result.completion_time_s)}",
        f"  goodput            {result.goodput_bps / 1e9:.2f} Gbit/s of "
        f"{result.capacity_bps / 1e9:.0f} Gbit/s ({result.goodput_fraction:.1%})",
        f"  retransmissions    {_counts(result.retransmissions)}",
        f"  trims / ECN marks  {result.trims} / {result.ecn_marks}",
        f"  drops              {_counts(result.drops)}",
        f"  EV state changes   {result.ev_state_changes}",
        f"  per-plane bytes    {' '.join(format_size(b) for b in result.per_plane_bytes)}",
    ]
    for flow in result.flows:
        state = "verified" if flow.verified else (flow.failed or "INCOMPLETE")
        lines.append(
            f"  flow {flow.index}: h{flow.src} -> h{flow.dst} {format_size(flow.bytes)} "
            f"{_ms(flow.completion_time_s)} {flow.goodput_bps / 1e9:.2f} Gbit/s {state}"
        )
    lines += timeline(result)
    for row in result.timeline:
        lines.append(f"  t={_ms(row.t_s):>12}  {row.goodput_bps / 1e9:8.2f} Gbit/s")
    return "\n".join(lines)
