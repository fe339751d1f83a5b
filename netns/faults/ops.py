"""Running a fault's operations: the kernel side of the fault harness.

:class:`.harness.Faults` plans every fault as data, a :class:`.records.Fault` whose
``apply`` and ``undo`` are operations, one frozen dataclass per kind (:mod:`.records` says
what each does).  :func:`execute` runs one through :data:`HANDLERS`, a table from the
operation's type to the function that does it with ``ip``, ``nft``, ``tc`` or the trim
program.  Also here: what a fault reads from the system before it is applied (a port's
addresses), the wait for links brought back up, and the up-front checks that what a fault
kind needs is there (:func:`require_nft`, :func:`require_trim`).

nftables tables are loaded and deleted through libnftables in this process
(:mod:`.nftlib`), or the ``nft`` program where the library is missing.  Undoing a port's
shaping or trimming puts back the testbed's own shaping of that tier, if the fabric has one.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from mrcstack.netns import ifctl, testbed, trim
from mrcstack.netns.faults import netem, nftlib
from mrcstack.netns.faults.plan import FaultError, as_replace, routes_avoiding
from mrcstack.netns.faults.records import (
    Address,
    NetemAttach,
    NetemDetach,
    Nft,
    NftDelete,
    Operation,
    PortDown,
    PortUp,
    Routes,
    Settle,
    Shape,
    Tier,
    TierOp,
    TrimAttach,
    TrimDetach,
    Unshape,
)
from mrcstack.netns.run import TestbedError, ip, ip_batch, net_exec, one_line
from mrcstack.netns.state import LinkRecord, TestbedState

SETTLE_TIMEOUT_S = 3.0  # a link brought back is operational within milliseconds
SETTLE_POLL_S = 0.005
Log = Callable[[str], object]


@dataclass(frozen=True, slots=True)
class Context:
    """What an operation runs against: the testbed, and the harness's log for warnings."""

    state: TestbedState
    log: Log


def execute(state: TestbedState, op: Operation, log: Log) -> None:
    """One operation of a fault's ``apply`` or ``undo``."""
    HANDLERS[type(op)](Context(state, log), op)


def _down(ctx: Context, op: PortDown) -> None:
    ifctl.set_link(op.netns, op.ifname, up=False)


def _up(ctx: Context, op: PortUp) -> None:
    ifctl.set_link(op.netns, op.ifname, up=True)
    lines = [
        f"address replace {a.local}/{a.prefixlen} dev {op.ifname}" + (" nodad" if a.nodad else "")
        for a in op.addrs
    ]
    ip_batch(lines, op.netns)


def _routes(ctx: Context, op: Routes) -> None:
    reinstall(ctx.state, op.netns)


def _settle(ctx: Context, op: Settle) -> None:
    settle(ctx.state, op.ports, ctx.log)


def _nft(ctx: Context, op: Nft) -> None:
    nft(op.netns, op.script)


def _nft_delete(ctx: Context, op: NftDelete) -> None:
    nft_delete(op.netns, op.table)


def _shape(ctx: Context, op: Shape) -> None:
    queue = op.queue_bytes or ctx.state.fabric.queue_bytes
    testbed.shape_port(op.netns, op.ifname, op.rate_bps, queue)


def _unshape(ctx: Context, op: TierOp) -> None:
    """Back to the testbed's own shaping of the port's tier, or none."""
    fabric = ctx.state.fabric
    rate = fabric.host_link_bps if op.tier == Tier.HOST else fabric.fabric_link_bps
    if rate is None:
        testbed.unshape_port(op.netns, op.ifname)
    else:
        testbed.shape_port(op.netns, op.ifname, rate, fabric.queue_bytes)


def _trim_attach(ctx: Context, op: TrimAttach) -> None:
    trim.attach(op.netns, op.ifname, rate_bps=op.rate_bps,
                trim_threshold_bytes=op.trim_threshold_bytes,
                ecn_threshold_bytes=op.ecn_threshold_bytes, last_hop=op.last_hop,
                probability=op.probability, queue_bytes=op.queue_bytes)  # fmt: skip


def _trim_detach(ctx: Context, op: TrimDetach) -> None:
    trim.detach(op.netns, op.ifname)
    _unshape(ctx, op)


def _netem_attach(ctx: Context, op: NetemAttach) -> None:
    netem.attach(op.netns, op.ifname, netem.parse_spec(op.spec))


def _netem_detach(ctx: Context, op: NetemDetach) -> None:
    netem.detach(op.netns, op.ifname)


#: Each operation kind and the function that runs it (every kind of :data:`.records.OPERATIONS`).
HANDLERS: Mapping[type[Operation], Callable[[Context, Any], None]] = MappingProxyType({
    PortDown: _down,
    PortUp: _up,
    Routes: _routes,
    Settle: _settle,
    Nft: _nft,
    NftDelete: _nft_delete,
    Shape: _shape,
    Unshape: _unshape,
    TrimAttach: _trim_attach,
    TrimDetach: _trim_detach,
    NetemAttach: _netem_attach,
    NetemDetach: _netem_detach,
})  # fmt: skip


# nftables -------------------------------------------------------------------------------
def nft(netns: str, script: str) -> None:
    """Run an nftables script in ``netns``: through libnftables in this process, or the
    ``nft`` program where the library is missing (TestbedError with nft's message)."""
    if nftlib.available():
        nftlib.run(netns, script)
        return
    result = net_exec(netns, ["nft", "-f", "-"], input=script, check=False)
    if result.returncode:
        raise TestbedError(f"nft in {netns}: {one_line(result.stderr)}")


def nft_delete(netns: str, table: str) -> None:
    """Delete one fault's table; one that is already gone is not an error."""
    try:
        nft(netns, f"delete table inet {table}")
    except TestbedError as exc:
        if "No such file" not in str(exc):
            raise FaultError(f"nft delete table {table} in {netns}: {exc}") from None


# Links brought back ---------------------------------------------------------------------
def settle(state: TestbedState, ports: Sequence[tuple[str, str]], log: Log) -> None:
    """Wait until both ends of every link just brought back are operational, then forget
    their neighbour entries.

    A port whose peer went down kept its routes (no carrier, ``linkdown``), so traffic
    meanwhile left an INCOMPLETE neighbour entry there whose next solicitation is due only
    at the ND retransmit timer (1 s): without the flush the path would stay dead for up to
    a second after ``up``.  The peer's qdisc and operstate come back through the kernel's
    linkwatch work, a little after the carrier: hence the wait."""
    ends = {(n, i) for n, i in ports}
    links = [
        rec
        for rec in state.links.values()
        if (rec.a.netns, rec.a.ifname) in ends or (rec.b.netns, rec.b.ifname) in ends
    ]
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        shown = {ns: {d["ifname"]: d for d in _links_json(ns)} for ns in _namespaces(links)}
        waiting = [rec.name for rec in links if not _operational(rec, shown)]
        if not waiting:
            break
        if time.monotonic() > deadline:
            log(f"warning: not operational after {SETTLE_TIMEOUT_S:g} s: {', '.join(waiting)}")
            break
        time.sleep(SETTLE_POLL_S)
    for rec in links:
        for end in (rec.a, rec.b):
            if "UP" in shown[end.netns].get(end.ifname, {}).get("flags", []):
                ip("neigh", "flush", "dev", end.ifname, netns=end.netns)


def reinstall(state: TestbedState, netns: str) -> None:
    """The namespace's recorded routes, minus those through ports still down."""
    down = set(_admin_down(netns))
    if not down:
        state.reinstall_routes(netns)
        return
    lines = [as_replace(line) for line in routes_avoiding(state.routes[netns], down)]
    ip_batch(lines, netns, force=True)


def addresses(netns: str, ifname: str) -> tuple[Address, ...]:
    """What ``up`` must give the port back (:func:`~mrcstack.netns.ifctl.ipv6_addresses`)."""
    found = ifctl.ipv6_addresses(netns, ifname)
    return tuple(Address(a["local"], a["prefixlen"], a["nodad"]) for a in found)


def _links_json(netns: str) -> list[dict[str, Any]]:
    out = ip("-j", "link", "show", netns=netns)
    data: list[dict[str, Any]] = json.loads(out or "[]")
    return data


def _namespaces(links: Sequence[LinkRecord]) -> list[str]:
    return list(dict.fromkeys(ns for rec in links for ns in (rec.a.netns, rec.b.netns)))


def _operational(rec: LinkRecord, shown: dict[str, dict[str, dict[str, Any]]]) -> bool:
    """Both ends up and running, or one of them held down on purpose (nothing to wait for)."""
    ends = [shown[end.netns].get(end.ifname, {}) for end in (rec.a, rec.b)]
    if any("UP" not in end.get("flags", []) for end in ends):
        return True
    return all(end.get("operstate") == "UP" for end in ends)


def _admin_down(netns: str) -> list[str]:
    return [d["ifname"] for d in _links_json(netns) if "UP" not in d.get("flags", [])]


# What a fault kind needs, checked up front ------------------------------------------------
def require_nft() -> None:
    """Loss and blackhole faults are nftables rules."""
    if shutil.which("nft") is None:
        raise FaultError("`nft` not found: install nftables (loss and blackhole faults use it)")


def require_trim(name: str) -> None:
    """Trim faults need ``tc``, the compiled trim program (or clang to build it) and the
    kernel's clsact qdisc, cls_bpf classifier and htb qdisc, tried in testbed ``name``'s
    throwaway probe namespace."""
    if shutil.which("tc") is None:
        raise FaultError("trim: `tc` not found: install iproute2")
    if (problem := trim_object_problem()) is not None:
        raise FaultError(f"trim: {problem}")
    try:
        obj = trim.build()  # nothing to do unless trim.c changed since `make setup`
        with testbed.probe_namespace(name) as ns:
            probe_trim_kernel(ns, obj)
    except TestbedError as exc:
        raise FaultError(f"trim: {exc}") from None


def trim_object_problem(obj: Path = trim.OBJECT) -> str | None:
    """Why the compiled trim program cannot be had (None when it is built or can be)."""
    if trim.is_built(obj) or (problem := trim.build_problem()) is None:
        return None
    state = "out of date" if obj.is_file() else "missing"
    return f"the compiled trim program {obj} is {state} and cannot be built: {problem}"


def probe_trim_kernel(ns: str, obj: Path) -> None:
    """Attach ``obj`` the way :func:`.trim.attach` does, on a veth in namespace ``ns``."""
    for tool, args, reason in (
        ("ip", "link add v0 type veth peer name v1", "kernel lacks veth pairs (CONFIG_VETH)"),
        ("tc", "qdisc add dev v0 clsact",
         "kernel lacks the clsact qdisc (CONFIG_NET_SCH_INGRESS) the trim program hangs on"),
        ("tc", "filter add dev v0 egress bpf da",
         "cannot load the trim program with cls_bpf (CONFIG_NET_CLS_BPF, CONFIG_BPF_SYSCALL)"),
        ("tc", "qdisc add dev v0 root handle 1: htb",
         "kernel lacks the htb qdisc (CONFIG_NET_SCH_HTB), the trim program's shaper"),
    ):  # fmt: skip
        program = ["obj", str(obj), "sec", "tc"] if "bpf" in args else []
        testbed.probe_step([tool, "-n", ns, *args.split(), *program], reason)
