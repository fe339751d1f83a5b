"""``mrcstack fault ...``: inject and undo faults on a running testbed.

    mrcstack fault [--name NAME] [--json] link down|up A [B]
    mrcstack fault switch fail|restore|blackhole S
    mrcstack fault nic down|up HOST PLANE
    mrcstack fault loss A [B] --rate P [--from NODE]      (P: 0.05 or 5%)
    mrcstack fault loss --path SID --rate P               (SID: p0-t1c, 2002 or its /48)
    mrcstack fault loss clear A [B] [--from NODE] | loss clear --path SID
    mrcstack fault shape A [B] --rate R [--queue BYTES] [--from NODE] | shape clear A [B]
    mrcstack fault trim A [B] --threshold BYTES [--rate R] [--ecn-threshold BYTES]
                        [--probability P] [--queue BYTES] [--from NODE] | trim clear A [B]
    mrcstack fault scenario FILE [--check]
    mrcstack fault restore-all | clear ID | list [--json]

A and B are node names (``p0-t0a``, ``h0``) or A alone is a link name (``p0:t0a-t1c``).
``--name`` defaults to ``$MRC_TESTBED``, else ``mrc`` (as for ``mrcstack testbed``).  A
trim's rate and queue default to the testbed's shaping of the link and its queue size.
Every change is logged with an ISO timestamp on stderr and in
``<STATE_DIR>/<name>.faults.log``; stdout gets the faults applied or removed (JSON with
``--json``).  ``scenario --check`` validates against the testbed's fabric (the default
fabric when none is up) and prints the timeline.  Exit status: 0 done, 1 the operation
failed (one line on stderr), 2 bad arguments or an invalid scenario file.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from mrcstack import add_version_flag
from mrcstack.errors import LocalError
from mrcstack.fabric import Fabric, parse_rate, parse_size
from mrcstack.netns.faults import netem
from mrcstack.netns.faults.harness import Faults
from mrcstack.netns.faults.plan import FaultError, parse_probability
from mrcstack.netns.faults.records import Fault, load_records
from mrcstack.netns.faults.scenario import FaultScenarioError, LogEntry, load_scenario, run_scenario
from mrcstack.netns.state import NAME_ENV, check_name, default_name, exists, load

PROG = "mrcstack fault"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _arg(convert: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return convert(text)
        except (ValueError, LocalError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = what
    return parse


_PROB = _arg(parse_probability, "probability")
_RATE = _arg(parse_rate, "rate")
_SIZE = _arg(parse_size, "size")
_NAME = _arg(check_name, "name")


def _ends(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("a", metavar="A", help="node name (p0-t0a, h0) or link name (p0:t0a-t1c)")
    sub.add_argument("b", metavar="B", nargs="?", help="the other node (omit with a link name)")


def _from(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--from", dest="from_node", metavar="NODE",
                     help="only the direction sent by NODE (default: both)")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Inject and undo faults on a running testbed.")
    add_version_flag(parser)
    name_help = f"testbed name (${NAME_ENV} or mrc: {default_name()})"
    parser.add_argument("--name", type=_NAME, default=default_name(), help=name_help)
    parser.add_argument("--json", action="store_true", help="JSON on stdout")
    common = _Parser(add_help=False)  # the same options, after the command
    common.add_argument("--name", type=_NAME, default=argparse.SUPPRESS, help=name_help)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="JSON on stdout")  # fmt: skip
    cmds = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                 parser_class=_Parser)  # fmt: skip
    add = functools.partial(cmds.add_parser, parents=[common])

    link = add("link", help="link down|up A [B]")
    link.add_argument("op", choices=("down", "up"))
    _ends(link)

    switch = add("switch", help="switch fail|restore|blackhole S")
    switch.add_argument("op", choices=("fail", "restore", "blackhole"))
    switch.add_argument("switch", metavar="S", help="switch name (p0-t1c) or uSID")

    nic = add("nic", help="nic down|up HOST PLANE")
    nic.add_argument("op", choices=("down", "up"))
    nic.add_argument("host", metavar="HOST")
    nic.add_argument("plane", metavar="PLANE", type=_arg(int, "plane"))

    loss = add("loss", help="loss A [B] --rate P | --path SID --rate P | clear ...")
    loss.add_argument("ends", metavar="[clear] A [B]", nargs="*")
    loss.add_argument("--rate", type=_PROB, help="drop probability: 0.05 or 5%%")
    loss.add_argument("--path", metavar="SID", help="packets crossing this switch")
    _from(loss)

    shape = add("shape", help="shape A [B] --rate R [--queue BYTES] | clear A [B]")
    shape.add_argument("ends", metavar="[clear] A [B]", nargs="+")
    shape.add_argument("--rate", type=_RATE, help="tc rate: 100mbit, 1gbit")
    shape.add_argument("--queue", type=_SIZE, help="queue bytes: 64KiB")
    _from(shape)

    trim = add("trim", help="trim A [B] --threshold BYTES [--rate R] ... | clear")
    trim.add_argument("ends", metavar="[clear] A [B]", nargs="+")
    trim.add_argument("--threshold", type=_SIZE, help="trim above this queue (bytes)")
    trim.add_argument("--ecn-threshold", type=_SIZE, help="ECN-mark above this queue (bytes)")
    trim.add_argument("--rate", type=_RATE, help="port rate (default: the link's shaping)")
    trim.add_argument("--probability", type=_PROB, help="fixed-probability trim mode")
    trim.add_argument("--queue", type=_SIZE, help="data queue bytes (default: the fabric's)")
    _from(trim)

    ne = add("netem", help="netem A [B] [--delay T [--jitter T ...]] [--loss P] ... | clear")
    ne.add_argument("ends", metavar="[clear] A [B]", nargs="+")
    ne.add_argument("--delay", help="added delay: 10ms, 500us")
    ne.add_argument("--jitter", help="delay variation (needs --delay)")
    ne.add_argument("--distribution", choices=netem.DISTRIBUTIONS, help="of the jitter")
    ne.add_argument("--loss", help="random loss: 1%% or 0.01")
    ne.add_argument("--loss-gemodel", metavar="p,r,1-h,1-k", help="Gilbert-Elliott burst loss")
    ne.add_argument("--reorder", help="probability a packet skips the delay (needs --delay)")
    ne.add_argument("--gap", type=_arg(int, "gap"), help="reorder every Nth packet")
    ne.add_argument("--duplicate", help="duplication probability")
    ne.add_argument("--corrupt", help="bit-flip probability")
    ne.add_argument("--rate", help="netem's own rate limit: 100mbit")
    ne.add_argument("--slot", nargs="+", metavar="ARG", help="tc's slot arguments")
    ne.add_argument("--limit", type=_arg(int, "limit"), help="queue limit (packets)")
    _from(ne)

    scenario = add("scenario", help="scenario FILE [--check]: replay a timeline")
    scenario.add_argument("file", metavar="FILE")
    scenario.add_argument("--check", action="store_true",
                          help="validate and print the timeline; change nothing")  # fmt: skip

    add("restore-all", help="undo every active fault")
    clear = add("clear", help="clear ID: undo one fault (id or key)")
    clear.add_argument("fault", metavar="ID")
    add("list", help="the faults active now (restored ones are gone from it)")
    return parser


def _split_ends(parser: argparse.ArgumentParser, ends: Sequence[str]) -> tuple[bool, list[str]]:
    clearing = bool(ends) and ends[0] == "clear"
    rest = list(ends[1:] if clearing else ends)
    if len(rest) > 2:
        parser.error(f"too many arguments: {' '.join(rest)} (expected A [B])")
    return clearing, rest


def _need(parser: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    for name in names:
        if getattr(args, name) is None:
            parser.error(f"{args.command}: --{name.replace('_', '-')} is required")


Action = Callable[[Faults], list[Fault]]


def _action(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Action:
    """The harness call a command makes, checked before the testbed is touched."""
    cmd = args.command
    if cmd == "link":
        down = args.op == "down"
        return lambda f: (f.link_down if down else f.link_up)(args.a, args.b)
    if cmd == "switch":
        op = {"fail": "switch_fail", "restore": "switch_restore", "blackhole": "switch_blackhole"}
        return lambda f: getattr(f, op[args.op])(args.switch)
    if cmd == "nic":
        down = args.op == "down"
        return lambda f: (f.nic_down if down else f.nic_up)(args.host, args.plane)
    if cmd == "restore-all":
        return lambda f: f.restore_all()
    if cmd == "clear":
        return lambda f: f.clear(args.fault)
    clearing, ends = _split_ends(parser, args.ends)
    a, b = [*ends, None, None][:2]
    source = args.from_node
    if cmd == "loss" and args.path is not None:
        if ends:
            parser.error("loss --path takes no link ends")
        if clearing:
            return lambda f: f.clear_loss(path=args.path)
        _need(parser, args, "rate")
        return lambda f: f.loss_path(args.path, args.rate)
    if a is None:
        parser.error(f"{cmd}: give a link (A [B])" + (" or --path SID" if cmd == "loss" else ""))
    if cmd == "loss":
        if clearing:
            return lambda f: f.clear_loss(a, b, from_node=source)
        _need(parser, args, "rate")
        return lambda f: f.loss(a, b, args.rate, from_node=source)
    if cmd == "netem":
        if clearing:
            return lambda f: f.unnetem(a, b, from_node=source)
        spec = netem.parse_spec({k: getattr(args, k) for k in (
            "delay", "jitter", "distribution", "loss", "loss_gemodel", "reorder", "gap",
            "duplicate", "corrupt", "rate", "slot", "limit")})  # fmt: skip
        return lambda f: f.netem(a, b, spec, from_node=source)
    if cmd == "shape":
        if clearing:
            return lambda f: f.unshape(a, b, from_node=source)
        _need(parser, args, "rate")
        return lambda f: f.shape(a, b, args.rate, args.queue, from_node=source)
    if clearing:
        return lambda f: f.untrim(a, b, from_node=source)
    _need(parser, args, "threshold")
    return lambda f: f.trim(a, b, threshold_bytes=args.threshold,
                            ecn_threshold_bytes=args.ecn_threshold, rate_bps=args.rate,
                            probability=args.probability, queue_bytes=args.queue,
                            from_node=source)  # fmt: skip


def _scenario(args: argparse.Namespace) -> int:
    state = load(args.name) if exists(args.name) or not args.check else None
    try:
        scenario = load_scenario(args.file, Fabric() if state is None else state.fabric)
    except FaultScenarioError as exc:
        print(f"{PROG}: error: {args.file}: {exc}", file=sys.stderr)
        return 2
    if state is None or args.check:
        if args.json:
            print(json.dumps([_event_json(e) for e in scenario.events], indent=1))
        else:
            for event in scenario.events:
                print(f"{event.at:8.3f}s  step {event.step}: {event.describe()}")
        return 0
    entries = run_scenario(scenario, Faults(state))
    _print_log(entries, args.json)
    return 0


def _event_json(event: Any) -> dict[str, Any]:
    return {"at": event.at, "step": event.step, "action": event.action,
            "method": event.method, "kwargs": dict(event.kwargs),
            "restore": event.restore}  # fmt: skip


def _print_log(entries: list[LogEntry], as_json: bool) -> None:
    if as_json:
        print(json.dumps([e.to_json() for e in entries], indent=1))
    else:
        for entry in entries:
            print(entry.line())


def _undoes(args: argparse.Namespace) -> bool:
    """The command removes faults (``link up``, ``clear``, ``loss clear ...``)."""
    if args.command in ("restore-all", "clear"):
        return True
    if getattr(args, "op", None) in ("up", "restore"):
        return True
    ends: list[str] = getattr(args, "ends", None) or []
    return bool(ends) and ends[0] == "clear"


def _print_faults(faults: list[Fault], as_json: bool, restored: bool = False) -> None:
    """Active faults as ``#1 link_down p0:t0a-t1c  (since ...)``; faults an undo removed
    as ``restored #1 ...`` so they never read as still active."""
    if as_json:
        print(json.dumps([f.to_json() | ({"restored": True} if restored else {})
                          for f in faults], indent=1))  # fmt: skip
    else:
        for fault in faults:
            if restored:
                print(f"restored {fault.describe()}  (was active since {fault.since})")
            else:
                print(f"{fault.describe()}  (since {fault.since})")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "scenario":
            return _scenario(args)
        if args.command == "list":
            faults = load_records(check_name(args.name)).faults
            if not faults and not args.json:
                print("no active faults")
            _print_faults(faults, args.json)
            return 0
        action = _action(parser, args)
        _print_faults(action(Faults(load(args.name))), args.json, restored=_undoes(args))
        return 0
    except (LocalError, FaultError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
