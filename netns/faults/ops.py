"""Running a fault's recorded operations: the kernel side of the fault harness.

:class:`.faults.Faults` plans every fault as data, a :class:`.faultplan.Fault` whose
``apply`` and ``undo`` are lists of operations such as ``{"op": "down", "netns": ...,
"ifname": ...}``.  :func:`execute` runs one of them with ``ip``, ``nft``, ``tc`` or the trim
program.  Also here: what a fault reads from the system before it is applied (a port's
addresses), the wait for links brought back up, and the up-front checks that what a fault
kind needs is there (:func:`require_nft`, :func:`require_trim`).

The operations:

- ``down``/``up``: ``ip link set``; ``up`` also re-adds the addresses recorded before
  ``down`` (the kernel flushed them, even the static link-local ones: docs/linux.md, trap 1).
- ``routes``: re-install a namespace's recorded routes, minus those through ports still
  held down by other faults.
- ``settle``: wait until both ends of the links brought back are operational, then flush
  their neighbour entries.
- ``nft``/``nft_delete``: load or delete one fault's nftables table in a namespace (through
  libnftables in this process, :mod:`.nftlib`; the ``nft`` program where it is missing).
- ``shape``/``unshape``/``trim_attach``/``trim_detach``: a port's root qdisc (the
  testbed's tbf, or the trim program with its htb); undoing either puts back the testbed's
  own shaping of that tier, if the fabric has one.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mrcstack.netns import ifctl, testbed, trim
from mrcstack.netns.faults import netem, nftlib
from mrcstack.netns.faults.plan import Fault, FaultError, as_replace, routes_avoiding
from mrcstack.netns.run import TestbedError, ip, ip_batch, net_exec, one_line
from mrcstack.netns.state import LinkRecord, TestbedState

SETTLE_TIMEOUT_S = 3.0  # a link brought back is operational within milliseconds
SETTLE_POLL_S = 0.005
PORT_OPS = ("shape", "unshape", "trim_attach", "trim_detach")
NETEM_OPS = ("netem_attach", "netem_detach")
Log = Callable[[str], object]


def execute(state: TestbedState, op: dict[str, Any], fault: Fault, log: Log) -> None:
    """One recorded operation (of ``fault.apply`` or ``fault.undo``)."""
    kind, netns = op["op"], op.get("netns", "")
    if kind == "down":
        ifctl.set_link(netns, op["ifname"], up=False)
    elif kind == "up":
        ifctl.set_link(netns, op["ifname"], up=True)
        lines = [
            f"address replace {a['local']}/{a['prefixlen']} dev {op['ifname']}"
            + (" nodad" if a.get("nodad") else "")
            for a in op["addrs"]
        ]
        ip_batch(lines, netns)
    elif kind == "routes":
        reinstall(state, netns)
    elif kind == "settle":
        settle(state, [(str(n), str(i)) for n, i in op["ports"]], log)
    elif kind == "nft":
        _nft(netns, op["script"])
    elif kind == "nft_delete":
        _nft_delete(netns, op["table"])
    elif kind in PORT_OPS:
        port_operation(state, op)
    elif kind == "netem_attach":
        netem.attach(netns, op["ifname"], netem.parse_spec(op["spec"]))
    elif kind == "netem_detach":
        netem.detach(netns, op["ifname"])
    else:
        raise FaultError(f"fault #{fault.id}: unknown operation {kind!r} in the record")


def _nft(netns: str, script: str) -> None:
    """Run an nftables script in ``netns``: through libnftables in this process, or the
    ``nft`` program where the library is missing (TestbedError with nft's message)."""
    if nftlib.available():
        nftlib.run(netns, script)
        return
    result = net_exec(netns, ["nft", "-f", "-"], input=script, check=False)
    if result.returncode:
        raise TestbedError(f"nft in {netns}: {one_line(result.stderr)}")


def _nft_delete(netns: str, table: str) -> None:
    """Delete one fault's table; one that is already gone is not an error."""
    try:
        _nft(netns, f"delete table inet {table}")
    except TestbedError as exc:
        if "No such file" not in str(exc):
            raise FaultError(f"nft delete table {table} in {netns}: {exc}") from None


def summary(ops: Sequence[dict[str, Any]]) -> str:
    """What a list of operations does, for the log: ``down mrc-p0-t0a/t1c, up ...``."""
    parts = []
    for op in ops:
        where = f"{op.get('netns', '')}/{op['ifname']}" if "ifname" in op else op.get("netns", "")
        parts.append(f"{op['op']} {where}".strip())
    return ", ".join(parts) or "nothing to do"


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


def addresses(netns: str, ifname: str) -> list[dict[str, Any]]:
    """What ``up`` must give the port back (:func:`~mrcstack.netns.ifctl.ipv6_addresses`)."""
    return ifctl.ipv6_addresses(netns, ifname)


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


# Ports: shaping and trimming ------------------------------------------------------------
def port_operation(state: TestbedState, op: dict[str, Any]) -> None:
    """Shaping (the testbed's tbf) and trimming (the trim program) of one port.  Undoing
    either puts back the testbed's own shaping of that tier, if the fabric has one."""
    netns, ifname, kind = op["netns"], op["ifname"], op["op"]
    if kind == "shape":
        queue = op.get("queue_bytes") or state.fabric.queue_bytes
        testbed.shape_port(netns, ifname, op["rate_bps"], queue)
        return
    if kind == "trim_attach":
        trim.attach(netns, ifname, rate_bps=op["rate_bps"],
                    trim_threshold_bytes=op["trim_threshold_bytes"],
                    ecn_threshold_bytes=op["ecn_threshold_bytes"], last_hop=op["last_hop"],
                    probability=op["probability"], queue_bytes=op["queue_bytes"])  # fmt: skip
        return
    if kind == "trim_detach":
        trim.detach(netns, ifname)
    fabric = state.fabric
    rate = fabric.host_link_bps if op.get("tier") == "host" else fabric.fabric_link_bps
    if rate is None:
        testbed.unshape_port(netns, ifname)
    else:
        testbed.shape_port(netns, ifname, rate, fabric.queue_bytes)


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
