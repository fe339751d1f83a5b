"""``mrcstack testbed ...``: build, inspect and remove namespace testbeds.

Exit status: 0 on success; 1 when the operation failed (not root, a kernel feature missing,
an ``ip`` command failing, no such testbed); 2 on bad arguments.  Every error is one line on
stderr naming the problem.  ``exec`` replaces itself with the command, so its exit status
is the command's; ``exec --json`` runs it, captures its output and exits with its status
too.  ``--json`` output is documented in docs/testbed.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from mrcstack import add_version_flag
from mrcstack.errors import LocalError
from mrcstack.fabric import SID_FORMATS, Fabric, FabricConfigError, parse_rate, parse_size
from mrcstack.netns import linkload, testbed
from mrcstack.netns.run import TestbedError
from mrcstack.netns.state import NAME_ENV, check_name, default_name, load, recorded

PROG = "mrcstack testbed"
T = TypeVar("T")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, no usage dump: the message names the option and the problem."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def _arg(parse: Callable[[str], T]) -> Callable[[str], T]:
    def convert(text: str) -> T:
        try:
            return parse(text)
        except (ValueError, LocalError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"bad number of seconds {text!r}") from None
    if not 0 <= value <= 3600:
        raise ValueError(f"{text} s: must be in 0..3600")
    return value


def _int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise ValueError(f"bad integer {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Multi-plane SRv6 (uSID) testbeds in network namespaces.")
    add_version_flag(p)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    name = default_name()

    def named(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--name", type=_arg(check_name), default=name, help=f"${NAME_ENV} or mrc: {name}"
        )
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    u = sub.add_parser("up", help="build a testbed")
    named(u)
    fab = u.add_argument_group("fabric (flags override --config)")
    fab.add_argument("--config", "--fabric", metavar="FILE.toml", help="fabric description")
    fab.add_argument("--planes", type=_arg(_int), metavar="N", help="planes (4)")
    fab.add_argument("--racks", type=_arg(_int), metavar="N", help="T0 switches per plane (2)")
    fab.add_argument("--hosts-per-rack", type=_arg(_int), metavar="N", help="(2)")
    fab.add_argument("--t1", type=_arg(_int), metavar="N", help="T1 switches per plane (4)")
    fab.add_argument("--rate", type=_arg(parse_rate), help="every link's rate (unshaped)")
    fab.add_argument("--host-rate", type=_arg(parse_rate), help="NIC <-> T0 links")
    fab.add_argument("--fabric-rate", type=_arg(parse_rate), help="T0 <-> T1 links")
    fab.add_argument("--queue", type=_arg(parse_size), metavar="BYTES", help="per port (1MiB)")
    fab.add_argument("--mtu", type=_arg(_int), metavar="N", help="IP MTU of every link (9000)")
    fab.add_argument(
        "--sid-format",
        choices=SID_FORMATS,
        help="usid (default): uN switches; classic: also a 128-bit End SID each, for SRH paths",
    )

    d = sub.add_parser("down", help="remove a testbed")
    named(d)
    s = sub.add_parser(
        "status",
        help="what exists, link states, and the traffic over an interval: per plane, or the "
        "links and switches of one plane or switch",
    )
    named(s)
    s.add_argument("--plane", type=_arg(_int), metavar="N", help="its links and switches")
    s.add_argument("--switch", metavar="S", help="its ports and uN SID (p0-t1a)")
    s.add_argument(
        "--interval", type=_arg(_seconds), default=1.0, metavar="S",
        help="seconds between the two counter readings rates come from (1; 0: no rates)",
    )  # fmt: skip
    s.add_argument("--plot", metavar="FILE.png", help="a PNG of each link's load, per plane")
    ps = sub.add_parser("paths", help="every path between two hosts, with its uSID address")
    ps.add_argument("src", help="source host (h0)")
    ps.add_argument("dst", help="destination host (h3)")
    named(ps)
    e = sub.add_parser("exec", help="run a command inside a node's namespace")
    e.add_argument("node", help="host (h0) or switch (p0-t1a)")
    e.add_argument("cmd", nargs="*", help="-- COMMAND [ARGS...]")
    named(e)
    c = sub.add_parser("clean", help="remove what a crashed run left, from its state file")
    named(c)
    c.add_argument("--all-recorded", action="store_true", help="every recorded testbed")
    sub.add_parser("list", help="names of the recorded testbeds").add_argument(
        "--json", action="store_true"
    )
    return p


def fabric_from_args(args: argparse.Namespace) -> Fabric:
    """The fabric: --config (or the default), then each flag given; FabricConfigError."""
    try:
        fabric = Fabric.load(args.config) if args.config else Fabric()
    except OSError as exc:
        raise ValueError(f"--config {args.config}: cannot read: {exc.strerror}") from None
    host_rate = args.host_rate if args.host_rate is not None else args.rate
    fabric_rate = args.fabric_rate if args.fabric_rate is not None else args.rate
    changes = {
        "planes": args.planes,
        "racks": args.racks,
        "hosts_per_rack": args.hosts_per_rack,
        "t1_per_plane": args.t1,
        "host_link_bps": host_rate,
        "fabric_link_bps": fabric_rate,
        "queue_bytes": args.queue,
        "mtu": args.mtu,
        "sid_format": args.sid_format,
    }
    return dataclasses.replace(fabric, **{k: v for k, v in changes.items() if v is not None})


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True) if args.json else text)


def _cmd_up(args: argparse.Namespace) -> int:
    fabric = fabric_from_args(args)
    report = testbed.up(fabric, args.name)
    state = load(args.name)
    data = report.to_json() | {"fabric": testbed.fabric_json(fabric), "mgmt": state.mgmt}
    _emit(
        args,
        data,
        f"testbed {report.name} up: {report.namespaces} namespaces, {report.links} links "
        f"in {report.seconds:.2f} s (state {data['state_file']})",
    )
    return 0


def _cmd_clean(args: argparse.Namespace, require: bool) -> int:
    names = recorded() if getattr(args, "all_recorded", False) else [args.name]
    reports = [(testbed.down if require else testbed.clean)(name) for name in names]
    lines = [
        f"testbed {r.name}: removed {len(r.netns)} namespaces, {len(r.links)} root links"
        + (f", killed {len(r.killed)} processes" if r.killed else "")
        + ("" if r.had_state else " (nothing recorded)")
        for r in reports
    ]
    data = reports[0].to_json() if require else {"cleaned": [r.to_json() for r in reports]}
    _emit(args, data, "\n".join(lines) or "nothing recorded")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    state = load(args.name)
    if args.plane is not None and not 0 <= args.plane < state.fabric.planes:
        raise ValueError(
            f"--plane {args.plane}: the testbed has planes 0..{state.fabric.planes - 1}"
        )
    if args.switch is not None and args.switch not in state.switches:
        raise ValueError(f"--switch {args.switch}: no such switch (like p0-t1a)")
    data = testbed.status(args.name)
    if args.interval > 0:
        began = time.monotonic()
        time.sleep(args.interval)
        after = testbed.status(args.name)
        data = linkload.with_rates(data, after, time.monotonic() - began)
    if args.plot:
        linkload.plot(data, Path(args.plot))
    if args.plane is None and args.switch is None:
        text = linkload.summary_text(data)
    else:
        text = linkload.detail_text(data, args.plane, args.switch)
    if args.plot:
        text += f"\nplot: {args.plot}"
    _emit(args, data, text)
    return 0


def _cmd_paths(args: argparse.Namespace) -> int:
    state = load(args.name)
    table = testbed.path_table(state, args.src, args.dst)
    data = {"name": state.name, "src": args.src, "dst": args.dst, "paths": table}
    lines = [f"{'plane':<5} {'ev':<7} {'address':<34} nodes"]
    lines += [
        f"{p['plane']:<5} {p['ev']:#06x}  {p['address']:<34} {' '.join(p['nodes'])}" for p in table
    ]
    _emit(args, data, "\n".join(lines))
    return 0


def _cmd_exec(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ValueError("exec: no command given: mrcstack testbed exec NODE -- CMD [ARGS...]")
    state = load(args.name)
    node = args.node if args.node in state.netns or not args.node.isdigit() else f"h{args.node}"
    netns = state.ns(node)
    argv = ["ip", "netns", "exec", netns, *cmd]
    if not args.json:
        sys.stdout.flush()
        os.execvp("ip", argv)
    done = subprocess.run(argv, capture_output=True, check=False)
    status = done.returncode if done.returncode >= 0 else 128 - done.returncode  # as sh says
    data = {"name": state.name, "node": node, "netns": netns, "argv": cmd, "returncode": status,
            "stdout": done.stdout.decode(errors="replace"),
            "stderr": done.stderr.decode(errors="replace")}  # fmt: skip
    _emit(args, data, "")
    return status


def _cmd_list(args: argparse.Namespace) -> int:
    names = recorded()
    _emit(args, {"testbeds": names}, "\n".join(names) or "no testbeds recorded")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if words and words[0] == "exec" and "--" in words:  # options may precede "--"
        cut = words.index("--")
        words, command = words[:cut], words[cut + 1 :]
    try:
        args = parser.parse_args(words)
    except SystemExit as exc:  # argparse printed its one line (or --help)
        return exc.code if isinstance(exc.code, int) else 2
    if command:
        args.cmd = command
    try:
        if args.command == "up":
            return _cmd_up(args)
        if args.command in ("down", "clean"):
            return _cmd_clean(args, require=args.command == "down")
        if args.command == "status":
            return _cmd_status(args)
        if args.command == "paths":
            return _cmd_paths(args)
        if args.command == "exec":
            return _cmd_exec(args)
        return _cmd_list(args)
    except (FabricConfigError, ValueError) as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (TestbedError, LocalError, OSError) as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
