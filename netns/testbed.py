"""Build, inspect and remove testbeds: the I/O side of :mod:`mrcstack.netns.topology`.

``up`` checks the kernel and tools first (:func:`check_features`), records the plan in the
state file, then creates everything with few processes: one ``ip -batch`` in the root
namespace (every namespace, the management bridge, every veth pair), one ``ip -6 -batch``
per namespace (addresses, links up, routes, and a read-back of the SRv6 routes to verify
that the NEXT-C-SID flavour is really installed), sysctls written from a thread that
joins each namespace (no process at all), and one ``tc -batch`` per shaped namespace.
The per-namespace work runs on a few threads.  Any failure removes what was built.

``clean`` works from the state file alone, by exact name: it kills the processes inside
the recorded namespaces (as ``ip netns pids`` finds them), deletes the recorded root links
and namespaces, and deletes the state file.  It is idempotent.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mrcstack.addrplan import HOST, classic_sid, parse_node, paths, switch_locator, switch_usid
from mrcstack.api.verbs import namespace_socket
from mrcstack.fabric import LOCATOR_BLOCK_BITS, Fabric, format_rate
from mrcstack.netns.run import (
    NETNS_DIR,
    CommandError,
    TestbedError,
    call_in_netns,
    ip,
    ip_batch,
    one_line,
    run,
)
from mrcstack.netns.state import (
    TestbedState,
    check_name,
    cluster_dir,
    exists,
    load,
    remove,
    save,
    state_path,
)
from mrcstack.netns.topology import Plan, plan, probe_netns, tbf_line

WORKERS = 4  # concurrent ip/tc processes (the work is mostly in the kernel)
PAUSE_ENV = "MRC_TESTBED_PAUSE_AFTER"  # test hook: stop after this build step...
PAUSE_SECONDS = 600.0  # ...for this long (a test SIGKILLs the build meanwhile)
STEPS = ("recorded", "root", "config", "sysctl", "shape")
KILL_GRACE_S = 1.0  # SIGTERM, then SIGKILL after this long
NEXT_CSID_HELP = "kernel lacks SRv6 NEXT-C-SID (needs Linux >= 6.1 with CONFIG_IPV6_SEG6_LWTUNNEL)"
IPROUTE2_NEXT_CSID = (6, 1)  # the first iproute2 that knows `flavors next-csid`
IPROUTE2_HELP = "`ip` does not know seg6local flavors next-csid (needs iproute2 >= 6.1)"
PROBE_SID = "fcbb:bb00:ffff::/48"
T = TypeVar("T")


# Feature detection --------------------------------------------------------------------
def check_features(name: str, *, shaping: bool = False) -> None:
    """Everything ``up`` needs, checked up front; TestbedError with a one-line reason."""
    if os.geteuid() != 0:
        raise TestbedError(
            "must run as root: namespaces, veth pairs and routes need CAP_NET_ADMIN (try sudo)"
        )
    for tool, package in (("ip", "iproute2"), *((("tc", "iproute2"),) if shaping else ())):
        if shutil.which(tool) is None:
            raise TestbedError(f"`{tool}` not found: install {package}")
    _check_iproute2_version()
    with probe_namespace(name) as ns:
        _probe(ns, shaping)


@contextlib.contextmanager
def probe_namespace(name: str) -> Iterator[str]:
    """A throwaway namespace ``{name}-probe`` to try kernel features in, deleted afterwards
    (``clean`` removes it too, should a probe be killed halfway)."""
    probe = probe_netns(name)
    if probe in _netns_present():
        ip("netns", "del", probe)
    ip("netns", "add", probe)
    try:
        yield probe
    finally:
        ip("netns", "del", probe, check=False)


def probe_step(argv: Sequence[str], reason: str) -> None:
    """Run one feature probe; TestbedError ``reason: <what it printed>`` if it fails."""
    try:
        run(argv)
    except CommandError as exc:
        raise TestbedError(f"{reason}: {one_line(exc.stderr)}") from None


def _check_iproute2_version() -> None:
    """Refuse an iproute2 older than 6.1 by ``ip -V`` (``ip utility, iproute2-6.1.0``; before
    5.0 date-based, ``iproute2-ss190107``); a version it cannot read is let through."""
    shown = ip("-V", check=False)
    if (dated := re.search(r"iproute2-ss\d+", shown)) is not None:
        raise TestbedError(f"{dated[0]}: {IPROUTE2_HELP}")
    match = re.search(r"iproute2-(\d+)\.(\d+)", shown)
    if match is not None and (int(match[1]), int(match[2])) < IPROUTE2_NEXT_CSID:
        raise TestbedError(f"iproute2 {match[1]}.{match[2]}: {IPROUTE2_HELP}")


def _probe(ns: str, shaping: bool) -> None:
    for args, reason in (
        (("link", "add", "name", "sid", "type", "ifb"), "kernel lacks ifb devices (CONFIG_IFB)"),
        (
            ("link", "add", "name", "v0", "type", "veth", "peer", "name", "v1"),
            "kernel lacks veth pairs (CONFIG_VETH)",
        ),
        (
            ("link", "add", "name", "b0", "type", "bridge"),
            "kernel lacks bridges (CONFIG_BRIDGE), needed for the management network",
        ),
        (("link", "set", "dev", "sid", "up"), "cannot bring an ifb device up"),
    ):
        probe_step(["ip", "-n", ns, *args], reason)
    end = "encap seg6local action End flavors next-csid lblen 32 nflen 16 count dev sid"
    try:
        ip("-6", "route", "add", PROBE_SID, *end.split(), netns=ns)
    except CommandError as exc:
        # An ip without the keyword stops parsing the encap there and takes "flavors" for a
        # second destination ('either "to" is duplicate, or "flavors" is a garbage').
        if '"flavors" is a garbage' in exc.stderr or "is wrong" in exc.stderr:
            raise TestbedError(f"iproute2 {IPROUTE2_HELP}: {one_line(exc.stderr)}") from None
        raise TestbedError(f"{NEXT_CSID_HELP}: {one_line(exc.stderr)}") from None
    shown = ip("-6", "route", "show", PROBE_SID, netns=ns)
    if "next-csid" not in shown:  # the kernel took the route but dropped the flavour
        raise TestbedError(NEXT_CSID_HELP)
    if shaping:
        probe_step(
            ["tc", "-n", ns, *tbf_line("v0", 1e6, 10**5, 1500).split()],
            "kernel lacks the tbf qdisc (CONFIG_NET_SCH_TBF) needed for link rates",
        )


# Build --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BuildReport:
    name: str
    seconds: float
    namespaces: int
    links: int  # fabric links (veth pairs), not counting management veths
    steps: dict[str, float] = field(default_factory=dict)  # step -> seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seconds": round(self.seconds, 4),
            "namespaces": self.namespaces,
            "links": self.links,
            "steps": {k: round(v, 4) for k, v in self.steps.items()},
            "state_file": str(state_path(self.name)),
        }


def up(
    fabric: Fabric, name: str = "mrc", *, log: Callable[[str], None] | None = None
) -> BuildReport:
    """Build testbed ``name``; on any failure, remove what was built and re-raise."""
    check_name(name)
    if exists(name):
        if not load(name).complete:
            raise TestbedError(
                f"testbed {name} has a state file from a build that did not finish "
                f"({state_path(name)}); remove its leftovers: mrcstack testbed clean --name {name}"
            )
        raise TestbedError(
            f"testbed {name} is already up (state file {state_path(name)}); "
            f"take it down first: mrcstack testbed down --name {name}"
        )
    shaped = fabric.host_link_bps is not None or fabric.fabric_link_bps is not None
    start = time.perf_counter()
    check_features(name, shaping=shaped)
    the_plan = plan(fabric, name)
    _check_free(the_plan)
    steps: dict[str, float] = {"features": time.perf_counter() - start}
    save(the_plan.state())
    try:
        _step(steps, "recorded", log, lambda: None)
        _step(steps, "root", log, lambda: ip_batch(the_plan.root_lines, die_with_parent=True))
        shown = _step(steps, "config", log, lambda: _configure(the_plan))
        _step(steps, "sysctl", log, lambda: _sysctls(the_plan.sysctls))
        _step(steps, "shape", log, lambda: _shape_all(the_plan.shaping))
        _verify_end_routes(the_plan, shown)
        save(the_plan.state(complete=True))
    except BaseException:
        with contextlib.suppress(Exception):
            clean(name)
        raise
    return BuildReport(
        name=name,
        seconds=time.perf_counter() - start,
        namespaces=len(the_plan.netns),
        links=len(the_plan.links),
        steps=steps,
    )


def _step(
    steps: dict[str, float], step: str, log: Callable[[str], None] | None, fn: Callable[[], T]
) -> T:
    began = time.perf_counter()
    result = fn()
    steps[step] = time.perf_counter() - began
    if log is not None:
        log(f"{step}: {steps[step]:.3f} s")
    if os.environ.get(PAUSE_ENV) == step:
        print(f"paused after step {step} ({PAUSE_ENV})", file=sys.stderr, flush=True)
        time.sleep(PAUSE_SECONDS)
    return result


def _check_free(the_plan: Plan) -> None:
    """Refuse to start if any name we would create is taken (we must never delete it)."""
    taken = sorted(set(the_plan.netns.values()) & _netns_present())
    taken += sorted(set(the_plan.root_links) & _links_present())
    if taken:
        raise TestbedError(
            f"{taken[0]} already exists ({len(taken)} names of testbed {the_plan.name} are "
            "taken, with no state file): remove them by hand or pick another --name"
        )


def _parallel(jobs: Mapping[str, Callable[[], T]]) -> dict[str, T]:
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        futures = {key: pool.submit(job) for key, job in jobs.items()}
        return {key: future.result() for key, future in futures.items()}


def _configure(the_plan: Plan) -> dict[str, str]:
    """One ``ip -6 -batch`` per namespace; switches end with a read-back of their routes."""
    block = f"{the_plan.fabric.locator_block}/{LOCATOR_BLOCK_BITS}"
    switches = set(the_plan.switches)

    def job(node: str, ns: str) -> Callable[[], str]:
        lines = the_plan.setup[ns] + the_plan.routes[ns]
        if node in switches:
            lines = [*lines, f"route show root {block}"]
        return lambda: ip_batch(lines, ns, options=("-6",), die_with_parent=True)

    return _parallel({ns: job(node, ns) for node, ns in the_plan.netns.items()})


def _verify_end_routes(the_plan: Plan, shown: Mapping[str, str]) -> None:
    """docs/linux.md, trap 8: check that every uN route kept its NEXT-C-SID flavour."""
    for switch in the_plan.switches:
        ns = the_plan.netns[switch]
        locator = str(switch_locator(the_plan.fabric, switch_usid(switch)))
        lines = [line for line in shown[ns].splitlines() if line.startswith(locator + " ")]
        if not lines or "flavors next-csid" not in lines[0] or "action End" not in lines[0]:
            raise TestbedError(f"{ns}: uN route {locator} lost its next-csid flavour: {lines}")


def _sysctls(values: Mapping[str, Mapping[str, str]]) -> None:
    def write(ns: str, table: Mapping[str, str]) -> Callable[[], None]:
        def body() -> None:
            for path, value in table.items():
                try:
                    with open(f"/proc/sys/{path}", "w", encoding="ascii") as handle:
                        handle.write(value)
                except OSError as exc:
                    raise TestbedError(f"{ns}: cannot set {path}={value}: {exc.strerror}") from None

        return body

    for ns, table in values.items():
        call_in_netns(ns, write(ns, table))


def _shape_all(shaping: Mapping[str, list[str]]) -> None:
    def job(ns: str, lines: list[str]) -> Callable[[], object]:
        text = "\n".join(lines) + "\n"
        return lambda: run(["tc", "-n", ns, "-batch", "-"], input=text, die_with_parent=True)

    _parallel({ns: job(ns, lines) for ns, lines in shaping.items() if lines})


# Shaping (shared with the fault harness) ----------------------------------------------
def shape_port(
    netns: str, ifname: str, rate_bps: float, queue_bytes: int, *, mtu: int | None = None
) -> None:
    """Shape egress of one port with tbf: ``rate_bps``, a queue of ``queue_bytes``.

    The bucket holds max(2 packets, 1 ms at the rate); ``mtu`` defaults to the port's."""
    if mtu is None:
        mtu = int(json.loads(ip("-j", "link", "show", "dev", ifname, netns=netns))[0]["mtu"])
    line = tbf_line(ifname, rate_bps, queue_bytes, mtu)
    run(["tc", "-n", netns, *line.split()])


def unshape_port(netns: str, ifname: str) -> None:
    """Remove the port's root qdisc (back to veth's default, no queue); idempotent."""
    result = run(["tc", "-n", netns, "qdisc", "del", "dev", ifname, "root"], check=False)
    if result.returncode != 0 and "handle of zero" not in result.stderr:
        raise CommandError(result.args, result.returncode, result.stderr)


# Remove -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CleanReport:
    name: str
    netns: list[str]  # namespaces deleted
    links: list[str]  # root-namespace links deleted
    killed: list[int]  # processes killed inside the namespaces
    had_state: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "netns": self.netns,
            "links": self.links,
            "killed": self.killed,
            "had_state": self.had_state,
        }


def down(name: str = "mrc") -> CleanReport:
    """Remove a recorded testbed; TestbedError if there is no such testbed."""
    load(name)
    return clean(name)


def clean(name: str) -> CleanReport:
    """Remove everything recorded for ``name`` by exact name; a no-op when nothing is."""
    check_name(name)
    state = load(name) if exists(name) else None
    netns = [*(state.netns.values() if state else ()), probe_netns(name)]
    links = list(state.root_links) if state else []
    netns_here = [ns for ns in netns if ns in _netns_present()]
    killed = _kill_processes(netns_here)
    # What daemons run on this testbed leave behind (`mrcstack cluster up`): exact names.
    for ns in netns:
        namespace_socket(ns).unlink(missing_ok=True)
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(cluster_dir(name))
    links_here = [link for link in links if link in _links_present()]
    lines = [f"link del dev {link}" for link in links_here]
    lines += [f"netns del {ns}" for ns in netns_here]
    with contextlib.suppress(CommandError):  # a name vanishing meanwhile is fine; check below
        ip_batch(lines, force=True)
    left = sorted(set(netns) & _netns_present()) + sorted(set(links) & _links_present())
    if left:
        raise TestbedError(f"clean {name}: could not remove {', '.join(left[:5])}")
    remove(name)
    return CleanReport(name, netns_here, links_here, killed, state is not None)


def _netns_present() -> set[str]:
    try:
        return set(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return set()


def _links_present() -> set[str]:
    """Interfaces of this process's network namespace (the root one for the CLI)."""
    with open("/proc/self/net/dev", encoding="ascii") as handle:
        return {line.split(":", 1)[0].strip() for line in handle.readlines()[2:]}


def _kill_processes(netns: Iterable[str]) -> list[int]:
    """Kill every process whose network namespace is one of ``netns`` (like
    ``ip netns pids``: same nsfs inode), SIGTERM first, SIGKILL after a grace period."""
    targets = set()
    for ns in netns:
        with contextlib.suppress(OSError):
            st = os.stat(os.path.join(NETNS_DIR, ns))
            targets.add((st.st_dev, st.st_ino))
    if not targets:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            st = os.stat(f"/proc/{entry}/ns/net")
            if (st.st_dev, st.st_ino) in targets:
                pids.append(int(entry))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + KILL_GRACE_S
        while sig == signal.SIGTERM and time.monotonic() < deadline:
            if not any(_alive(pid) for pid in pids):
                return sorted(pids)
            time.sleep(0.02)
    return sorted(pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# Inspect ------------------------------------------------------------------------------
def host_index(state: TestbedState, text: str) -> int:
    """ "h3" or "3" -> 3, checked against the testbed's fabric; ValueError otherwise."""
    try:
        node = parse_node(text if text.startswith("h") else f"h{text}")
    except ValueError:
        raise ValueError(f"bad host {text!r}: expected a host name like h0") from None
    if node.kind != HOST:
        raise ValueError(f"{text} is a switch, not a host")
    try:
        state.fabric.check_host(node.index)
    except ValueError as exc:
        raise ValueError(f"{text}: {exc} in testbed {state.name}") from None
    return node.index


def path_table(state: TestbedState, src: str, dst: str) -> list[dict[str, Any]]:
    """Every path from src to dst with its uSID address (from addrplan.paths)."""
    s, d = host_index(state, src), host_index(state, dst)
    return [
        {
            "plane": p.plane,
            "ev": p.ev,
            "address": str(p.address),
            "nodes": list(p.nodes),
            "switches": list(p.nodes[1:-1]),
            "links": list(p.physical_links),
        }
        for p in paths(state.fabric, s, d)
    ]


def fabric_json(fabric: Fabric) -> dict[str, Any]:
    return {
        "planes": fabric.planes,
        "racks": fabric.racks,
        "hosts_per_rack": fabric.hosts_per_rack,
        "t1_per_plane": fabric.t1_per_plane,
        "host_link_bps": fabric.host_link_bps,
        "fabric_link_bps": fabric.fabric_link_bps,
        "host_link_rate": format_rate(fabric.host_link_bps) if fabric.host_link_bps else None,
        "fabric_link_rate": format_rate(fabric.fabric_link_bps) if fabric.fabric_link_bps else None,
        "mtu": fabric.mtu,
        "queue_bytes": fabric.queue_bytes,
        "locator_block": fabric.locator_block,
    }


def status(name: str = "mrc") -> dict[str, Any]:
    """What exists of a testbed, every link's state and counters, every uN SID's counter."""
    state = load(name)
    present = _netns_present()
    block = f"{state.fabric.locator_block}/{LOCATOR_BLOCK_BITS}"
    shaped = state.fabric.host_link_bps is not None or state.fabric.fabric_link_bps is not None

    def job(node: str, ns: str) -> Callable[[], dict[str, Any]]:
        return lambda: _inspect(ns, node, block, shaped)

    live = _parallel({ns: job(node, ns) for node, ns in state.netns.items() if ns in present})
    links = [_link_status(rec, live) for rec in state.links.values()]
    sids = {}
    for switch in state.switches:
        ns = state.ns(switch)
        locator = str(switch_locator(state.fabric, switch_usid(switch)))
        route = live.get(ns, {}).get("routes", {}).get(locator)
        sids[switch] = {
            "sid": locator,
            "installed": route is not None,
            "next_csid": route is not None and "next-csid" in route.get("flavors", []),
            **{k: route.get("stats64", {}).get(k) if route else None for k in _SID_STATS},
        }
        if state.fabric.sid_format == "classic":  # the plain End SID that SRH paths name
            classic = str(classic_sid(state.fabric, switch_usid(switch)))
            croute = live.get(ns, {}).get("routes", {}).get(classic)
            sids[switch]["classic"] = {
                "sid": classic,
                "installed": croute is not None,
                **{k: croute.get("stats64", {}).get(k) if croute else None for k in _SID_STATS},
            }
    root_links = _links_present()
    missing_ns = [ns for ns in state.netns.values() if ns not in present]
    missing_links = [link for link in state.root_links if link not in root_links]
    healthy = (
        state.complete
        and not missing_ns
        and not missing_links
        and all(link["state"] == "up" for link in links)
        and all(s["next_csid"] for s in sids.values())
    )
    return {
        "name": state.name,
        "complete": state.complete,
        "healthy": healthy,
        "state_file": str(state_path(state.name)),
        "fabric": fabric_json(state.fabric),
        "namespaces": {
            "expected": len(state.netns),
            "present": len(state.netns) - len(missing_ns),
            "missing": missing_ns,
        },
        "root_links": {"expected": list(state.root_links), "missing": missing_links},
        "mgmt": {"bridge": state.bridge, "prefix": state.mgmt_prefix, "hosts": state.mgmt},
        "baseline": state.baseline,
        "links": links,
        "sids": sids,
    }


_SID_STATS = ("packets", "bytes", "errors")
_LINK_STATS = tuple((d, k) for d in ("rx", "tx") for k in ("packets", "bytes", "dropped"))


def _inspect(ns: str, node: str, block: str, shaped: bool) -> dict[str, Any]:
    lines = ["link show"]
    if parse_node(node).kind != HOST:
        lines.append(f"route show root {block}")
    out = ip_batch(lines, ns, options=("-6", "-j", "-s"))
    docs = _json_documents(out)
    result: dict[str, Any] = {"ports": {link["ifname"]: link for link in docs[0]}}
    if len(docs) > 1:
        result["routes"] = {route["dst"]: route for route in docs[1]}
    if shaped:
        qdiscs = json.loads(run(["tc", "-n", ns, "-s", "-j", "qdisc", "show"]).stdout or "[]")
        result["qdiscs"] = {q.get("dev"): q for q in qdiscs if q.get("root")}
    return result


def _json_documents(text: str) -> list[Any]:
    decoder = json.JSONDecoder()
    docs: list[Any] = []
    index = 0
    while True:
        while index < len(text) and text[index].isspace():
            index += 1
        if index >= len(text):
            return docs
        doc, index = decoder.raw_decode(text, index)
        docs.append(doc)


def _link_status(rec: Any, live: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    ends = {}
    for key, end in (("a", rec.a), ("b", rec.b)):
        port = live.get(end.netns, {}).get("ports", {}).get(end.ifname)
        info: dict[str, Any] = {"node": end.node, "netns": end.netns, "ifname": end.ifname}
        if port is None:
            info |= {"exists": False, "admin_up": False, "oper": "MISSING"}
        else:
            stats = port.get("stats64", {})
            info |= {
                "exists": True,
                "admin_up": "UP" in port.get("flags", []),
                "oper": port.get("operstate", "UNKNOWN"),
                **{f"{d}_{k}": stats.get(d, {}).get(k) for d, k in _LINK_STATS},
            }
            qdisc = live.get(end.netns, {}).get("qdiscs", {}).get(end.ifname)
            if qdisc is not None:
                info["qdisc"] = {
                    "kind": qdisc.get("kind"),
                    "drops": qdisc.get("drops"),
                    "backlog_bytes": qdisc.get("backlog"),
                }
        ends[key] = info
    if not (ends["a"]["exists"] and ends["b"]["exists"]):
        state = "missing"
    elif ends["a"]["oper"] == "UP" and ends["b"]["oper"] == "UP":
        state = "up"
    else:
        state = "down"
    return {"name": rec.name, "host_facing": rec.host_facing, "state": state, **ends}
