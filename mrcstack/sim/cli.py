"""``python -m mrcstack.sim``: run one simulated scenario and print a summary or JSON.

Exit status: 0 when every flow completed and verified, 1 when the run finished but did not
verify, 2 on bad arguments (one line on stderr naming the problem).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

from mrcstack import add_version_flag
from mrcstack.fabric import Fabric, format_rate, format_size, parse_rate, parse_size
from mrcstack.sim.runner import (
    LinkFailure,
    NicDown,
    SimConfig,
    SimResult,
    SwitchFailure,
    run,
)

PROG = "mrcstack-sim"
_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_TIME = re.compile(r"\s*((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[+-]?[0-9]{1,3})?)\s*([a-zµ]*)\s*")
_NIC = re.compile(r"h(0|[1-9][0-9]*):p(0|[1-9][0-9]*)")
T = TypeVar("T")


def parse_time(text: str) -> float:
    """Seconds from "2ms", "1.5us", "500ns", "0.01s" or a bare number of seconds."""
    match = _TIME.fullmatch(text)
    scale = _TIME_UNITS.get(match.group(2).lower()) if match else None
    if match is None or scale is None:
        raise ValueError(f"bad time {text!r}: expected like 2ms, 1us, 500ns or 0.5s")
    return float(match.group(1)) * scale


def parse_probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"bad probability {text!r}: expected a number in [0, 1]") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"bad probability {text!r}: must be in [0, 1]")
    return value


def parse_pairs(text: str) -> tuple[tuple[int, int], ...]:
    """ "0:3,1:2" -> ((0, 3), (1, 2))."""
    pairs = []
    for item in text.split(","):
        src, sep, dst = item.strip().partition(":")
        if not sep or not src.isdigit() or not dst.isdigit():
            raise ValueError(f"bad pair {item!r}: expected SRC:DST host numbers, like 0:3")
        pairs.append((int(src), int(dst)))
    return tuple(pairs)


def parse_window(text: str) -> tuple[str, float, float | None]:
    """ "TARGET@START" or "TARGET@START-END" -> (target, start, end)."""
    target, sep, when = text.rpartition("@")
    if not sep or not target:
        raise ValueError(f"bad failure {text!r}: expected TARGET@START or TARGET@START-END")
    start, dash, end = when.partition("-")
    return target, parse_time(start), parse_time(end) if dash else None


def parse_link_failure(text: str) -> LinkFailure:
    return LinkFailure(*parse_window(text))


def parse_switch_failure(text: str) -> SwitchFailure:
    return SwitchFailure(*parse_window(text))


def parse_nic_down(text: str) -> NicDown:
    target, start, end = parse_window(text)
    match = _NIC.fullmatch(target)
    if match is None:
        raise ValueError(f"bad NIC port {target!r}: expected h<host>:p<plane>, like h3:p1")
    return NicDown(int(match.group(1)), int(match.group(2)), start, end)


def parse_link_loss(text: str) -> tuple[str, float]:
    link, sep, p = text.partition("=")
    if not sep:
        raise ValueError(f"bad link loss {text!r}: expected LINK=P, like p0:t0a-t1c=0.01")
    return link, parse_probability(p)


def parse_ev_loss(text: str) -> tuple[int, float]:
    ev, sep, p = text.partition("=")
    try:
        value = int(ev, 0)
    except ValueError:
        value = -1
    if not sep or value < 0:
        raise ValueError(f"bad EV loss {text!r}: expected EV=P, like 0x102=0.2")
    return value, parse_probability(p)


def parse_ecn(text: str) -> tuple[int, int | None]:
    """ "KMIN" or "KMIN:KMAX" sizes."""
    kmin, sep, kmax = text.partition(":")
    return parse_size(kmin), parse_size(kmax) if sep else None


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"bad count {text!r}: expected a positive integer")
    return int(text)


def _arg(parse: Callable[[str], T]) -> Callable[[str], T]:
    """Adapt a ValueError-raising parser to argparse, keeping our message."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, no usage dump: the message names the option and the problem."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Simulate MRC transfers over a multi-plane Clos fabric.")
    add_version_flag(p)
    fab = p.add_argument_group("fabric (these flags override --fabric)")
    fab.add_argument("--fabric", metavar="FILE.toml", help="fabric description to start from")
    fab.add_argument("--planes", type=_arg(_positive_int), metavar="N", help="planes (4)")
    fab.add_argument("--racks", type=_arg(_positive_int), metavar="N", help="T0s per plane (2)")
    fab.add_argument("--hosts-per-rack", type=_arg(_positive_int), metavar="N", help="(2)")
    fab.add_argument("--t1", type=_arg(_positive_int), metavar="N", help="T1s per plane (4)")
    fab.add_argument("--rate", type=_arg(parse_rate), help="every link's rate (100Gbit)")
    fab.add_argument("--queue", type=_arg(parse_size), metavar="SIZE", help="switch port (1MiB)")
    fab.add_argument("--delay", type=_arg(parse_time), default=1e-6, help="per link (1us)")
    fab.add_argument("--trim-threshold", type=_arg(parse_size), metavar="SIZE", help="queue/2")
    fab.add_argument(
        "--ecn-threshold", type=_arg(parse_ecn), metavar="KMIN[:KMAX]", help="queue/16:queue/4"
    )
    fab.add_argument("--no-trim", action="store_true", help="tail-drop instead of trimming")
    work = p.add_argument_group("workload")
    work.add_argument("--bytes", type=_arg(parse_size), default="16MiB", help="per flow (16MiB)")
    work.add_argument("--wr-size", type=_arg(parse_size), metavar="SIZE", help="write size")
    work.add_argument("--pairs", type=_arg(parse_pairs), help="SRC:DST,... (0:<last host>)")
    work.add_argument("--mode", choices=("mrc", "roce"), default="mrc")
    work.add_argument("--cc", default="nscc", help="congestion control: nscc, fixed, ...")
    work.add_argument(
        "--ev-count", type=_arg(_positive_int), default=128, help="EVs in use (fewer paths: fewer)"
    )
    faults = p.add_argument_group(
        "faults (repeatable; windows are START[-END] in virtual time, like 0.1ms-0.2ms: "
        "the default 16MiB at 4 x 100Gbit lasts about 0.4ms)"
    )
    faults.add_argument("--loss", type=_arg(parse_probability), default=0.0, help="every link")
    for flag, parse, metavar, text in (
        ("--link-loss", parse_link_loss, "LINK=P", "random loss on one link, both ways"),
        ("--ev-loss", parse_ev_loss, "EV=P", "loss on one EV, sender to receiver (0x102=0.2)"),
        ("--fail-link", parse_link_failure, "LINK@WINDOW", "p0:t0a-t1c@0.1ms"),
        ("--fail-switch", parse_switch_failure, "SWITCH@WINDOW", "p0-t1a@0.1ms-0.2ms"),
        ("--nic-down", parse_nic_down, "hN:pP@WINDOW", "h3:p1@0.1ms-0.2ms"),
    ):
        faults.add_argument(
            flag, type=_arg(parse), metavar=metavar, help=text, action="append", default=[]
        )
    run_group = p.add_argument_group("run")
    run_group.add_argument("--seed", type=int, default=0, help="all randomness derives from it")
    run_group.add_argument(
        "--series", type=_arg(parse_time), metavar="INTERVAL", help="goodput per interval"
    )
    run_group.add_argument("--max-time", type=_arg(parse_time), default=1.0, help="(1s)")
    run_group.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """Build the scenario; ValueError (one line) when the arguments do not fit together."""
    fabric = Fabric.load(args.fabric) if args.fabric else Fabric()
    changes = {
        "planes": args.planes,
        "racks": args.racks,
        "hosts_per_rack": args.hosts_per_rack,
        "t1_per_plane": args.t1,
        "queue_bytes": args.queue,
        "host_link_bps": args.rate,
        "fabric_link_bps": args.rate,
    }
    fabric = dataclasses.replace(fabric, **{k: v for k, v in changes.items() if v is not None})
    kmin, kmax = args.ecn_threshold or (None, None)
    return SimConfig(
        fabric=fabric,
        pairs=args.pairs or (),
        bytes_per_flow=args.bytes,
        wr_size=args.wr_size,
        mode=args.mode,
        cc=args.cc,
        link_delay_s=args.delay,
        trim=not args.no_trim,
        trim_threshold_bytes=args.trim_threshold,
        ecn_kmin_bytes=kmin,
        ecn_kmax_bytes=kmax,
        loss=args.loss,
        link_loss=tuple(args.link_loss),
        ev_loss=tuple(args.ev_loss),
        link_failures=tuple(args.fail_link),
        switch_failures=tuple(args.fail_switch),
        nic_downs=tuple(args.nic_down),
        ev_count=args.ev_count,
        seed=args.seed,
        max_sim_time_s=args.max_time,
        series_interval_s=args.series,
    )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _counts(table: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(table.items()) if v) or "none"


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
    for row in result.timeline:
        lines.append(f"  t={_ms(row.t_s):>12}  {row.goodput_bps / 1e9:8.2f} Gbit/s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one line (or --help)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        cfg = config_from_args(args)
    except (ValueError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    result = run(cfg)
    if args.json:
        print(json.dumps(result.to_json(), sort_keys=True, indent=2))
    else:
        print(summary(result))
    return 0 if result.verified else 1
