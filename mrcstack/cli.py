"""``mrcstack``: one command for every tool.

mrcstack testbed ...   namespace testbeds (mrcstack.netns.cli)
mrcstack fault ...     the fault harness (mrcstack.netns.faults.cli)
mrcstack cluster ...   mrcd on every testbed host (mrcstack.daemons.cluster_cli)
mrcstack mapper ...    what the fabric mapper says (mrcstack.daemons.mapper_cli)
mrcstack sim ...       the fabric simulator (mrcstack.sim.cli)
mrcstack demo ...      mrcd under faults on a fresh testbed (mrcstack.demo)
mrcstack files [NAME]  the shipped examples, systemd units, dissector, dashboard, alert rules
mrcstack render ...    switch configurations for real switches (mrcstack.render)
mrcstack plan ...      a multi-plane two-tier fabric beside a single-plane one (mrcstack.plan)
mrcstack experiment .. the MRC paper's experiments with plots (mrcstack.experiments.cli)
mrcstack native ...    the per-packet modules compiled with mypyc (mrcstack.native)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

from mrcstack import __version__

PROG = "mrcstack"
COMMANDS: dict[str, tuple[str, str]] = {
    "testbed": ("mrcstack.netns.cli", "multi-plane SRv6 testbeds in network namespaces"),
    "fault": (
        "mrcstack.netns.faults.cli",
        "faults on a running testbed (links, switches, loss, trim)",
    ),
    "cluster": ("mrcstack.daemons.cluster_cli", "mrcd on every host of a running testbed (root)"),
    "mapper": ("mrcstack.daemons.mapper_cli", "the fabric mapper's links, agents and picture"),
    "sim": ("mrcstack.sim.cli", "the deterministic fabric simulator"),
    "demo": ("mrcstack.demo", "the demo: mrcd under faults on a fresh testbed (root)"),
    "files": (
        "mrcstack.resources",
        "shipped fabrics, scenarios, systemd units, dissector, Grafana dashboard, alert rules",
    ),
    "render": ("mrcstack.render", "switch configs (linux, frr, sonic) from a fabric description"),
    "plan": ("mrcstack.plan", "size a multi-plane two-tier fabric against a single-plane one"),
    "experiment": ("mrcstack.experiments.cli", "the MRC paper's experiments, with plots"),
    "native": ("mrcstack.native", "the per-packet modules compiled with mypyc (build, state)"),
}


def usage() -> str:
    lines = [f"usage: {PROG} COMMAND [ARGS...] | --version", "", "commands:"]
    lines += [f"  {name:<10} {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", f"`{PROG} COMMAND --help` describes each one."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    if args[0] == "--version":
        print(f"{PROG} {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        known = ", ".join(COMMANDS)
        print(
            f"{PROG}: error: unknown command {command!r}: expected one of {known}", file=sys.stderr
        )
        return 2
    module_name = COMMANDS[command][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        print(f"{PROG} {command}: error: not available ({exc})", file=sys.stderr)
        return 1
    entry: Callable[[Sequence[str]], int] = module.main
    return entry(rest)
