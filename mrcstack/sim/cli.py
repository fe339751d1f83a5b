"""``python -m mrcstack.sim``: run one simulated scenario and print a summary or JSON.

The scenario comes from the flags, or from a scenario file (``--scenario FILE``,
:mod:`mrcstack.sim.scenario`) whose settings the flags given with it override;
``--dump-scenario`` prints the resolved scenario as such a file instead of running it.

Exit status: 0 when every flow completed and verified, 1 when the run finished but did not
verify, 2 on bad arguments or a bad scenario file (one line on stderr naming the problem).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from mrcstack import add_version_flag
from mrcstack.fabric import Fabric, parse_rate, parse_size
from mrcstack.sim import scenario
from mrcstack.sim.runner import (
    LinkFailure,
    LossChange,
    NicDown,
    PlaneFailure,
    SimConfig,
    SwitchFailure,
    run,
)
from mrcstack.sim.scenario import parse_time
from mrcstack.sim.summary import summary

PROG = "mrcstack-sim"
_NIC = re.compile(r"h(0|[1-9][0-9]*):p(0|[1-9][0-9]*)")
T = TypeVar("T")


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


def parse_plane_failure(text: str) -> PlaneFailure:
    target, start, end = parse_window(text)
    if not (target.startswith("p") and target[1:].isdigit()):
        raise ValueError(f"bad plane {target!r}: expected p<plane>, like p2")
    return PlaneFailure(int(target[1:]), start, end)


def parse_loss_change(text: str) -> LossChange:
    """ "P@TIME" (every link) or "LINK=P@TIME": random loss from TIME on."""
    what, sep, when = text.rpartition("@")
    link, eq, p = what.rpartition("=")
    if not sep or not p:
        raise ValueError(f"bad loss change {text!r}: expected P@TIME or LINK=P@TIME, like 0.01@1ms")
    return LossChange(parse_time(when), parse_probability(p), link if eq else None)


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
    """The flags.  Defaults that a scenario file could set are None here (the SimConfig
    defaults apply), so that only flags given on the command line override the file."""
    p = _Parser(prog=PROG, description="Simulate MRC transfers over a multi-plane Clos fabric.")
    add_version_flag(p)
    scen = p.add_argument_group("scenario file (docs/scenario.md)")
    scen.add_argument(
        "--scenario",
        metavar="FILE.toml",
        help="the scenario to start from (a path, or a shipped name like incast.toml); "
        "the other flags given override it",
    )
    scen.add_argument(
        "--dump-scenario",
        action="store_true",
        help="print the resolved scenario as a scenario file and exit without running it",
    )
    fab = p.add_argument_group("fabric (these flags override --fabric)")
    fab.add_argument("--fabric", metavar="FILE.toml", help="fabric description to start from")
    fab.add_argument("--planes", type=_arg(_positive_int), metavar="N", help="planes (4)")
    fab.add_argument("--racks", type=_arg(_positive_int), metavar="N", help="T0s per plane (2)")
    fab.add_argument("--hosts-per-rack", type=_arg(_positive_int), metavar="N", help="(2)")
    fab.add_argument("--t1", type=_arg(_positive_int), metavar="N", help="T1s per plane (4)")
    fab.add_argument("--rate", type=_arg(parse_rate), help="every link's rate (100Gbit)")
    fab.add_argument("--queue", type=_arg(parse_size), metavar="SIZE", help="switch port (1MiB)")
    fab.add_argument("--delay", type=_arg(parse_time), help="per link (1us)")
    fab.add_argument("--trim-threshold", type=_arg(parse_size), metavar="SIZE", help="queue/2")
    fab.add_argument(
        "--ecn-threshold", type=_arg(parse_ecn), metavar="KMIN[:KMAX]", help="queue/16:queue/4"
    )
    fab.add_argument(
        "--trim",
        action=argparse.BooleanOptionalAction,
        help="trim above the threshold (the default), or tail-drop (--no-trim)",
    )
    work = p.add_argument_group("workload")
    work.add_argument("--bytes", type=_arg(parse_size), help="per flow (16MiB)")
    work.add_argument("--wr-size", type=_arg(parse_size), metavar="SIZE", help="write size")
    work.add_argument("--pairs", type=_arg(parse_pairs), help="SRC:DST,... (0:<last host>)")
    work.add_argument("--mode", choices=("mrc", "roce"), help="(mrc)")
    work.add_argument("--cc", help="congestion control: nscc (the default), fixed, ...")
    work.add_argument(
        "--ev-count", type=_arg(_positive_int), help="EVs in use (fewer paths: fewer) (128)"
    )
    faults = p.add_argument_group(
        "faults (repeatable, and each replaces the scenario file's list; windows are "
        "START[-END] in virtual time, like 0.1ms-0.2ms: the default 16MiB at 4 x 100Gbit "
        "lasts about 0.4ms)"
    )
    faults.add_argument("--loss", type=_arg(parse_probability), help="every link (0)")
    fab.add_argument(
        "--ecn-last-hop",
        action=argparse.BooleanOptionalAction,
        help="also mark ECN on switch ports facing hosts, as a DCQCN fabric does (off)",
    )
    run_extra = p.add_argument_group("measurements")
    run_extra.add_argument(
        "--packet-latency-every",
        type=_arg(_positive_int),
        metavar="N",
        help="sample every N-th data packet's one-way latency into the JSON (none)",
    )
    for flag, parse, metavar, text in (
        ("--link-loss", parse_link_loss, "LINK=P", "random loss on one link, both ways"),
        ("--ev-loss", parse_ev_loss, "EV=P", "loss on one EV, sender to receiver (0x102=0.2)"),
        ("--fail-link", parse_link_failure, "LINK@WINDOW", "p0:t0a-t1c@0.1ms"),
        ("--fail-switch", parse_switch_failure, "SWITCH@WINDOW", "p0-t1a@0.1ms-0.2ms"),
        ("--nic-down", parse_nic_down, "hN:pP@WINDOW", "h3:p1@0.1ms-0.2ms"),
        ("--fail-plane", parse_plane_failure, "pP@WINDOW", "every switch of a plane: p2@1ms"),
        (
            "--loss-change",
            parse_loss_change,
            "[LINK=]P@TIME",
            "loss from TIME on, every link or one: 0.01@1ms, p0:t0a-t1a=0@2ms",
        ),
    ):
        faults.add_argument(
            flag, type=_arg(parse), metavar=metavar, help=text, action="append", default=[]
        )
    run_group = p.add_argument_group("run")
    run_group.add_argument("--seed", type=int, help="all randomness derives from it (0)")
    run_group.add_argument(
        "--series", type=_arg(parse_time), metavar="INTERVAL", help="goodput per interval"
    )
    run_group.add_argument("--max-time", type=_arg(parse_time), help="(1s)")
    run_group.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def _fabric_from_args(args: argparse.Namespace, base: Fabric) -> Fabric:
    fabric = Fabric.load(args.fabric) if args.fabric else base
    changes = {
        "planes": args.planes,
        "racks": args.racks,
        "hosts_per_rack": args.hosts_per_rack,
        "t1_per_plane": args.t1,
        "queue_bytes": args.queue,
        "host_link_bps": args.rate,
        "fabric_link_bps": args.rate,
    }
    return dataclasses.replace(fabric, **{k: v for k, v in changes.items() if v is not None})


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """Build the scenario: the scenario file (or the SimConfig defaults), with every flag
    given on the command line replacing the file's value; ValueError (one line) when the
    arguments do not fit together, OSError when a file cannot be read."""
    base = scenario.load(args.scenario) if args.scenario else SimConfig()
    changes: dict[str, Any] = {"fabric": _fabric_from_args(args, base.fabric)}
    for field, value in (
        ("bytes_per_flow", args.bytes),
        ("wr_size", args.wr_size),
        ("mode", args.mode),
        ("cc", args.cc),
        ("link_delay_s", args.delay),
        ("trim", args.trim),
        ("trim_threshold_bytes", args.trim_threshold),
        ("loss", args.loss),
        ("ev_count", args.ev_count),
        ("seed", args.seed),
        ("max_sim_time_s", args.max_time),
        ("series_interval_s", args.series),
        ("ecn_last_hop", args.ecn_last_hop),
        ("packet_latency_every", args.packet_latency_every),
    ):
        if value is not None:
            changes[field] = value
    if args.queue is not None:  # the fabric's queue, not one the scenario file set
        changes["queue_bytes"] = None
    if args.ecn_threshold is not None:
        changes["ecn_kmin_bytes"], changes["ecn_kmax_bytes"] = args.ecn_threshold
    if args.pairs:  # plain pairs instead of the file's flows
        changes.update(pairs=args.pairs, flow_specs=())
    for field, values in (
        ("link_loss", args.link_loss),
        ("ev_loss", args.ev_loss),
        ("link_failures", args.fail_link),
        ("switch_failures", args.fail_switch),
        ("nic_downs", args.nic_down),
        ("plane_failures", args.fail_plane),
        ("loss_changes", args.loss_change),
    ):
        if values:
            changes[field] = tuple(values)
    return dataclasses.replace(base, **changes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one line (or --help)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        cfg = config_from_args(args)
        text = scenario.dumps(cfg) if args.dump_scenario else None
    except (ValueError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if text is not None:
        sys.stdout.write(text)
        return 0
    result = run(cfg)
    if args.json:
        print(json.dumps(result.to_json(), sort_keys=True, indent=2))
    else:
        print(summary(result))
    return 0 if result.verified else 1
