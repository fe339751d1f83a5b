"""The topology planner: a multi-plane two-tier fabric beside a single-plane design of the
same endpoints, switches and optics counted side by side.

``mrcstack plan --gpus N [--planes P] [--radix K] [--speed RATE] [--oversubscription R]
[--tiers L] [--fabric-out FILE [--scale F]] [--json]``

Every endpoint (a GPU's NIC) has ``P`` ports of ``RATE``, one per plane; a switch has ``K``
ports of ``RATE`` (a 51.2 Tbit/s switch is 512 x 100 Gbit/s).  The comparison design uses
the same switches at the NIC's whole rate, ``K / P`` ports of ``P x RATE``, in one plane of
``L`` tiers.  Each number comes from one function below; ``docs/plan.md`` gives the same
formulas with the paper's inputs worked through.  With the defaults (8 planes of
100 Gbit/s, radix 512) two tiers reach 131,072 endpoints, with 3/5 of the switches and 2/3
of the optics of three tiers of 800 Gbit/s.

``--fabric-out FILE`` writes the two-tier design as a fabric description (the ``[fabric]``
TOML that ``mrcstack sim --fabric``, ``mrcstack testbed up --fabric`` and ``mrcstack
render --fabric`` read); ``--scale F`` first shrinks every switch to ``K / F`` ports, so
the written fabric keeps the design's shape with ``F^2`` times fewer endpoints.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, NoReturn

from mrcstack import __version__
from mrcstack.errors import LocalError
from mrcstack.fabric import Fabric, FabricConfigError, format_rate, parse_rate

PROG = "mrcstack plan"
PAPER_PLANES = 8
PAPER_RADIX = 512
PAPER_SPEED_BPS = 100e9


class PlanError(LocalError, ValueError):
    """Input no fabric can be built from; the message is one line saying why."""


@dataclass(frozen=True, slots=True)
class Request:
    """What to plan: ``endpoints`` NICs of ``planes`` x ``speed_bps`` ports, switches of
    ``radix`` such ports, T0s with ``oversubscription`` times as many ports down as up,
    compared with one plane of ``tiers`` tiers."""

    endpoints: int
    planes: int = PAPER_PLANES
    radix: int = PAPER_RADIX
    speed_bps: float = PAPER_SPEED_BPS
    oversubscription: Fraction = Fraction(1)
    tiers: int = 3

    def __post_init__(self) -> None:
        for name, value, low in (
            ("endpoints", self.endpoints, 2),
            ("planes", self.planes, 1),
            ("radix", self.radix, 2),
            ("tiers", self.tiers, 2),
        ):
            if value < low:
                raise PlanError(f"{name} must be at least {low}, got {value}")
        if not (math.isfinite(self.speed_bps) and self.speed_bps > 0):
            raise PlanError(f"speed must be positive, got {self.speed_bps}")
        if self.oversubscription < 1:
            raise PlanError(
                f"oversubscription must be at least 1 (down:up), got {self.oversubscription}"
            )

    @property
    def nic_bps(self) -> float:
        return self.planes * self.speed_bps


@dataclass(frozen=True, slots=True)
class Design:
    """One design's counts.  ``per_tier`` lists the switches of each tier (T0 first) in
    one plane; ``links`` counts cables of ``link_bps`` (host links included), all planes."""

    planes: int
    radix: int
    link_bps: float
    tiers: int
    hosts_per_t0: int  # T0 ports facing hosts
    uplinks_per_t0: int
    per_tier: tuple[int, ...]
    links: int
    reach: int  # the most endpoints these tiers of these switches can connect
    links_per_t0_t1: int = 1  # parallel links between a T0 and each T1 (two tiers)

    @property
    def switches(self) -> int:
        return self.planes * sum(self.per_tier)

    @property
    def longest_path(self) -> int:
        """Switches a packet crosses between the two farthest endpoints: up and down."""
        return 2 * self.tiers - 1

    def optics(self, module_bps: float) -> int:
        """Optical modules of ``module_bps`` (the NIC's rate): two per link, a module of
        ``module_bps`` serving ``module_bps / link_bps`` ports (an 800G module broken out
        into 8 x 100G counts once)."""
        return round(Fraction(2 * self.links) * Fraction(self.link_bps) / Fraction(module_bps))

    @property
    def lost_uplink(self) -> Fraction:
        """A node's share of capacity a lost T0-T1 link takes: its T0 loses one of its
        uplinks, and with the planes kept equally loaded the node's traffic to other T0s is
        held to what the hurt plane still carries."""
        return Fraction(1, self.uplinks_per_t0)

    @property
    def lost_port(self) -> Fraction:
        """A NIC's share of capacity a lost NIC port takes: one plane of its planes."""
        return Fraction(1, self.planes)


@dataclass(frozen=True, slots=True)
class Plan:
    """The two designs; the single-plane one is None (``why_not`` says why) when the
    switches cannot be run at the NIC's rate."""

    request: Request
    two_tier: Design
    single_plane: Design | None
    why_not: str = ""

    @property
    def switch_ratio(self) -> float:
        if self.single_plane is None:
            return math.nan
        return self.two_tier.switches / self.single_plane.switches

    @property
    def optics_ratio(self) -> float:
        if self.single_plane is None:
            return math.nan
        nic = self.request.nic_bps
        return self.two_tier.optics(nic) / self.single_plane.optics(nic)


def split_ports(radix: int, oversubscription: Fraction, what: str) -> tuple[int, int]:
    """A T0's ports down (to hosts) and up, ``oversubscription`` times as many down as up:
    ``down = radix x R / (1 + R)``."""
    down = Fraction(radix) * oversubscription / (1 + oversubscription)
    if down.denominator != 1 or down >= radix:
        raise PlanError(
            f"oversubscription {oversubscription} does not split the {radix} ports of a "
            f"{what} into whole numbers of ports down and up"
        )
    return int(down), radix - int(down)


def two_tier(req: Request) -> Design:
    """Per plane: ``T0 = ceil(N / down)``; each T0 sends ``m`` links to each of
    ``T1 = up / m`` T1s, ``m`` as many as the T1s' ports allow (``m <= radix / T0``), so
    at full size (T0 = radix) every T0 meets every T1 once.  Two tiers reach
    ``radix x down`` endpoints per plane, and every plane reaches all of them."""
    down, up = split_ports(req.radix, req.oversubscription, f"radix-{req.radix} switch")
    t0 = -(-req.endpoints // down)
    reach = req.radix * down
    if t0 > req.radix:
        raise PlanError(
            f"{req.endpoints:,} endpoints need more than two tiers: radix-{req.radix} "
            f"switches with {down} ports down reach {reach:,}"
        )
    m = max(d for d in range(1, up + 1) if up % d == 0 and d <= req.radix // t0)
    links = req.planes * (req.endpoints + t0 * up)
    return Design(req.planes, req.radix, req.speed_bps, 2, down, up, (t0, up // m), links,
                  reach, m)  # fmt: skip


def single_plane(req: Request) -> Design:
    """The same switches at the NIC's rate (``k = radix / planes`` ports), one plane of
    ``L`` tiers: ``T0 = ceil(N / down)`` with ``U = T0 x up`` uplinks; every middle tier
    ``ceil(U / (k/2))`` switches (half their ports down), the top ``ceil(U / k)`` (all
    down).  ``L`` tiers reach ``down x 2 (k/2)^(L-1)`` endpoints; the counts are those of
    the tiers as drawn, so below that reach they are per endpoint, as the paper compares."""
    if req.radix % req.planes:
        raise PlanError(
            f"a radix-{req.radix} switch cannot be split into ports of {req.planes} x "
            f"{format_rate(req.speed_bps)} for the single-plane design (radix must be a "
            f"multiple of the planes)"
        )
    k = req.radix // req.planes
    if k < 2 or (req.tiers > 2 and k % 2):
        raise PlanError(
            f"radix {req.radix} at {format_rate(req.nic_bps)} is {k} port(s): a switch of "
            f"{req.tiers} tiers needs an even number, at least 2"
        )
    down, up = split_ports(k, req.oversubscription, f"{k}-port switch")
    t0 = -(-req.endpoints // down)
    uplinks = t0 * up
    middle = [-(-uplinks // (k // 2))] * (req.tiers - 2)
    top = -(-uplinks // k)
    reach = down * 2 * (k // 2) ** (req.tiers - 1)
    links = req.endpoints + (req.tiers - 1) * uplinks
    return Design(1, k, req.nic_bps, req.tiers, down, up, (t0, *middle, top), links, reach)


def plan(req: Request) -> Plan:
    """Both designs; :class:`PlanError` when the two-tier one cannot be built."""
    design = two_tier(req)
    try:
        return Plan(req, design, single_plane(req))
    except PlanError as exc:
        return Plan(req, design, None, str(exc))


def scaled(req: Request, factor: int) -> Request:
    """``req`` with every switch ``factor`` times smaller (``radix / factor`` ports) and
    ``factor^2`` times fewer endpoints (at least two): the same shape, T0s and T1s per
    plane and hosts per T0 each ``factor`` times fewer."""
    if factor < 1 or req.radix % factor or req.radix // factor < 2:
        raise PlanError(f"--scale {factor} must divide the radix {req.radix} into at least 2 ports")
    return replace(req, radix=req.radix // factor,
                   endpoints=max(2, -(-req.endpoints // factor**2)))  # fmt: skip


def fabric(design: Design, endpoints: int) -> Fabric:
    """The two-tier ``design`` as a fabric description: a rack per T0, its hosts spread
    evenly (``ceil(N / T0)`` each, so at least ``N`` endpoints), parallel T0-T1 links as
    one link of their summed rate.  :class:`PlanError` when it exceeds what the
    description holds."""
    t0, t1 = design.per_tier
    try:
        return Fabric(
            planes=design.planes,
            racks=t0,
            hosts_per_rack=-(-endpoints // t0),
            t1_per_plane=t1,
            host_link_bps=design.link_bps,
            fabric_link_bps=design.link_bps * design.links_per_t0_t1,
        )
    except FabricConfigError as exc:
        raise PlanError(
            f"the design does not fit a fabric description ({exc}): try --scale"
        ) from None


def fabric_text(req: Request, factor: int) -> str:
    """The fabric description of ``req``'s two-tier design, scaled down by ``factor``."""
    small = scaled(req, factor) if factor > 1 else req
    design = two_tier(small)
    head = [
        f"# mrcstack plan: {req.endpoints:,} endpoints, {req.planes} planes of "
        f"{format_rate(req.speed_bps)}, radix {req.radix}, two tiers",
    ]
    if factor > 1:
        head.append(
            f"# scaled down by {factor}: radix {small.radix}, {small.endpoints:,} endpoints "
            f"(T0s, T1s and hosts per T0 each {factor} times fewer)"
        )
    return "\n".join(head) + "\n" + fabric(design, small.endpoints).to_toml()


# The table ----------------------------------------------------------------------------------
def _percent(x: Fraction) -> str:
    return f"{float(x) * 100:.2g}%"


_TIERS = ("T0", "T1", "T2", "T3", "T4", "T5", "T6", "T7")


def _column(d: Design, nic_bps: float, endpoints: int) -> dict[str, str]:
    """One design's cells of the table, by row (its tiers' rows after the first three)."""
    return {
        "planes x port speed": f"{d.planes} x {format_rate(d.link_bps)}",
        "switch radix": f"{d.radix}",
        "hosts per T0 (ports down:up)": f"{d.hosts_per_t0} ({d.hosts_per_t0}:{d.uplinks_per_t0})",
        **{f"{_TIERS[i]} per plane": f"{n:,}" for i, n in enumerate(d.per_tier)},
        "links per T0-T1 pair": f"{d.links_per_t0_t1}" if d.tiers == 2 else "-",
        "switches": f"{d.switches:,}",
        "links": f"{d.links:,} x {format_rate(d.link_bps)}",
        f"optics ({format_rate(nic_bps)} modules)": f"{d.optics(nic_bps):,}",
        "longest path (switches)": f"{d.longest_path}",
        "reach of these tiers": f"{d.reach:,}" + (" (too few)" if d.reach < endpoints else ""),
        "a lost T0-T1 link costs": f"{_percent(d.lost_uplink)} of a node",
        "a lost NIC port costs": f"1/{d.planes} of the NIC" if d.planes > 1 else "the whole NIC",
    }


def rows(p: Plan) -> list[tuple[str, str, str]]:
    """The side-by-side table: (what, two-tier, single-plane)."""
    r, single = p.request, p.single_plane
    a = _column(p.two_tier, r.nic_bps, r.endpoints)
    b = _column(single, r.nic_bps, r.endpoints) if single is not None else {}
    if b:
        b["switches"] += f"  (x{p.switch_ratio:.3g})"
        b[f"optics ({format_rate(r.nic_bps)} modules)"] += f"  (x{p.optics_ratio:.3g})"
    tiers = max(len(p.two_tier.per_tier), len(single.per_tier) if single else 0)
    per_tier = [f"{_TIERS[i]} per plane" for i in range(tiers)]
    rest = [k for k in a if k not in per_tier]
    order = [*rest[:3], *per_tier, *rest[3:]]
    return [(k, a.get(k, "-"), b.get(k, "-")) for k in order]


def table(p: Plan) -> str:
    r = p.request
    head = ("", "multi-plane, 2 tiers", f"single plane, {r.tiers} tiers")
    body = [head, *rows(p)]
    widths = [max(len(row[i]) for row in body) for i in range(3)]
    lines = [
        f"{r.endpoints:,} endpoints of {format_rate(r.nic_bps)}; "
        f"oversubscription {r.oversubscription}:1 at the T0",
        "",
        *("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in body),
        "",
    ]
    if p.single_plane is None:
        lines.append(f"no single-plane design: {p.why_not}.")
        return "\n".join(lines)
    lines.append("x: the two-tier count over the single-plane one.")
    if p.single_plane.reach < r.endpoints:
        lines.append(
            f"note: {r.tiers} tiers of {p.single_plane.radix}-port switches reach "
            f"{p.single_plane.reach:,} endpoints, fewer than {r.endpoints:,}: its counts are "
            "per endpoint (a real build needs another tier or larger top-tier switches)."
        )
    return "\n".join(lines)


def to_json(p: Plan) -> dict[str, Any]:
    nic = p.request.nic_bps

    def design(d: Design | None) -> dict[str, Any] | None:
        if d is None:
            return None
        return {
            **asdict(d),
            "switches": d.switches,
            "optics": d.optics(nic),
            "longest_path": d.longest_path,
            "lost_uplink": float(d.lost_uplink),
            "lost_port": float(d.lost_port),
        }

    req = asdict(p.request) | {"oversubscription": float(p.request.oversubscription)}
    ratios = {"switch_ratio": p.switch_ratio, "optics_ratio": p.optics_ratio}
    return {
        "request": req,
        "two_tier": design(p.two_tier),
        "single_plane": design(p.single_plane),
        "single_plane_error": p.why_not or None,
        **{k: None if math.isnan(v) else v for k, v in ratios.items()},
    }


# The command --------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        sys.stderr.write(f"{PROG}: error: {message}\n")
        raise SystemExit(2)


def _ratio(text: str) -> Fraction:
    """``2``, ``2:1`` or ``1.5``: ports down per port up at a T0."""
    down, _, up = text.partition(":")
    try:
        value = Fraction(down) / Fraction(up or "1")
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"not a ratio like 1, 2:1 or 1.5: {text!r}") from None
    return value


def _rate(text: str) -> float:
    try:
        return parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"%(prog)s (mrcstack) {__version__}")
    p.add_argument("--gpus", "--nics", dest="endpoints", type=int, required=True,
                   help="endpoints: GPUs, one NIC each")  # fmt: skip
    p.add_argument(
        "--planes", type=int, default=PAPER_PLANES, help="ports per NIC, one per plane (8)"
    )
    p.add_argument(
        "--radix",
        type=int,
        default=PAPER_RADIX,
        help="ports per switch at the port speed (512: 51.2 Tbit/s as 512 x 100G)",
    )
    p.add_argument("--speed", type=_rate, default=PAPER_SPEED_BPS,
                   help="a port's rate, like 100gbit (the NIC has planes x this)")  # fmt: skip
    p.add_argument("--oversubscription", type=_ratio, default=Fraction(1),
                   help="T0 ports down per port up, like 2:1 (1: non-blocking)")  # fmt: skip
    p.add_argument("--tiers", type=int, default=3, help="tiers of the single-plane design (3)")
    p.add_argument("--fabric-out", metavar="FILE", help="write the two-tier design as fabric TOML")
    p.add_argument(
        "--scale",
        type=int,
        default=1,
        help="with --fabric-out: switches F times smaller, F^2 times fewer endpoints",
    )
    p.add_argument("--json", action="store_true", help="the counts as JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        req = Request(args.endpoints, args.planes, args.radix, args.speed,
                      args.oversubscription, args.tiers)  # fmt: skip
        result = plan(req)
        if args.fabric_out:
            text = fabric_text(req, args.scale)
            Path(args.fabric_out).write_text(text)
        elif args.scale != 1:
            raise PlanError("--scale applies to --fabric-out only")
    except PlanError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{PROG}: error: cannot write {args.fabric_out}: {exc.strerror}", file=sys.stderr)
        return 1
    print(json.dumps(to_json(result), indent=1) if args.json else table(result))
    if args.fabric_out:
        print(f"fabric written to {args.fabric_out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
