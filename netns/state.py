"""The recorded state of a testbed: one JSON file per testbed, ``<STATE_DIR>/<name>.json``.

``up`` writes the file BEFORE it creates anything (``complete`` false), listing every
namespace and root-namespace link it is about to create, so that a run killed at any point
leaves a file from which ``down``/``clean`` remove everything by exact name.  When the build
finishes the file is rewritten with ``complete`` true.  Writes are atomic (rename).

Other tools (the fault harness, the trim program, later the daemons) read a testbed through
:func:`load` and the :class:`TestbedState` helpers, never by guessing names.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mrcstack.addrplan import HOST, canonical_link, link_name, parse_link, parse_node
from mrcstack.fabric import Fabric
from mrcstack.netns.run import TestbedError, ip_batch

STATE_DIR = Path(os.environ.get("MRC_STATE_DIR", "/run/mrcstack"))
STATE_VERSION = 1
DEFAULT_NAME = "mrc"
NAME_ENV = "MRC_TESTBED"  # the testbed the CLIs act on when no --name is given
NAME_RE = re.compile(r"[a-z][a-z0-9]{0,5}")


def check_name(name: str) -> str:
    """The testbed name, checked: a lowercase letter then up to 5 letters or digits."""
    if not isinstance(name, str) or NAME_RE.fullmatch(name) is None:
        raise TestbedError(
            f"bad testbed name {name!r}: expected a lowercase letter then up to 5 "
            "lowercase letters or digits, like mrc or tb2"
        )
    return name


def default_name() -> str:
    """``$MRC_TESTBED`` if set, else ``mrc``: what ``--name`` defaults to in every CLI."""
    return os.environ.get(NAME_ENV) or DEFAULT_NAME


def state_path(name: str) -> Path:
    return STATE_DIR / f"{check_name(name)}.json"


def faults_path(name: str) -> Path:
    """Where the fault harness records a testbed's active faults."""
    return STATE_DIR / f"{check_name(name)}.faults.json"


def cluster_dir(name: str) -> Path:
    """Where ``mrcstack cluster up`` keeps the configs, keys, logs and records of the mrcd
    it runs on a testbed (``down``/``clean`` of the testbed remove it)."""
    return STATE_DIR / f"{check_name(name)}.cluster"


def faults_log_path(name: str) -> Path:
    """Where the fault harness logs what it applied and restored on a testbed."""
    return STATE_DIR / f"{check_name(name)}.faults.log"


@dataclass(frozen=True, slots=True)
class LinkEnd:
    node: str  # fabric node name: "h0", "p0-t0a"
    netns: str  # its namespace: "mrc-h0"
    ifname: str  # the interface inside that namespace: "nic0", "t1c", "h0"


@dataclass(frozen=True, slots=True)
class LinkRecord:
    name: str  # canonical link name, e.g. "p0:t0a-t1c", "p0:h0-t0a"
    a: LinkEnd  # the end named first in the canonical name
    b: LinkEnd
    host_facing: bool  # one end is a host: the switch's egress there is a last-hop port

    def end(self, node: str) -> LinkEnd:
        """This link's end at ``node``."""
        for end in (self.a, self.b):
            if end.node == node:
                return end
        raise TestbedError(f"{node} is not an end of link {self.name}")

    def peer(self, node: str) -> LinkEnd:
        """The end opposite ``node``."""
        return self.b if self.end(node) == self.a else self.a


@dataclass(frozen=True, slots=True)
class TestbedState:
    """Everything a testbed is made of, by exact name."""

    __test__ = False  # not a pytest test class

    name: str
    fabric: Fabric
    netns: dict[str, str]  # node name -> namespace name
    links: dict[str, LinkRecord]  # canonical name -> record
    routes: dict[str, list[str]]  # namespace -> the `ip -batch` route lines installed there
    mgmt: dict[str, str]  # host node -> management address
    bridge: str = ""  # the management bridge in the root namespace
    mgmt_prefix: str = ""  # the management /64 (the bridge holds ::1)
    root_links: tuple[str, ...] = ()  # every root-namespace link we create (bridge first)
    baseline: dict[str, list[str]] = field(default_factory=dict)  # host -> plain IPv6 by plane
    complete: bool = False  # false while `up` is still building (or was killed)

    # Lookups ----------------------------------------------------------------------------
    def ns(self, node: str) -> str:
        """The namespace of a fabric node ("h0" -> "mrc-h0")."""
        try:
            return self.netns[node]
        except KeyError:
            raise TestbedError(f"testbed {self.name} has no node {node!r}") from None

    def link(self, a: str, b: str | None = None) -> LinkRecord:
        """A link by name ("p0:t0a-t1c", either direction) or by its two node names."""
        try:
            if b is None:
                parse_link(a, self.fabric)
                key = canonical_link(a)
            else:
                plane = plane_of(a, b)
                key = canonical_link(link_name(plane, a, b))
        except ValueError as exc:
            raise TestbedError(f"bad link {_describe_link(a, b)}: {exc}") from None
        try:
            return self.links[key]
        except KeyError:
            raise TestbedError(
                f"testbed {self.name} has no link {_describe_link(a, b)} ({key})"
            ) from None

    def port(self, node: str, peer: str) -> LinkEnd:
        """``node``'s end of its link to ``peer``: where to shape, trim or drop."""
        return self.link(node, peer).end(node)

    def switch_links(self, switch: str) -> list[LinkRecord]:
        """Every link of a switch, in fabric order."""
        self.ns(switch)
        return [rec for rec in self.links.values() if switch in (rec.a.node, rec.b.node)]

    def host_links(self, host: str) -> list[LinkRecord]:
        """A host's links, one per plane, plane order."""
        self.ns(host)
        return [rec for rec in self.links.values() if rec.a.node == host]

    @property
    def hosts(self) -> list[str]:
        return [node for node in self.netns if parse_node(node).kind == HOST]

    @property
    def switches(self) -> list[str]:
        return [node for node in self.netns if parse_node(node).kind != HOST]

    # Actions ----------------------------------------------------------------------------
    def reinstall_routes(self, netns: str) -> None:
        """Re-apply every route recorded for ``netns`` (``route replace``: idempotent).

        Needed after ``ip link set DEV up`` because ``down`` deleted the routes through DEV
        (docs/linux.md, trap 1).  Runs every line even if one fails, then reports the failure."""
        if netns not in self.routes:
            raise TestbedError(f"testbed {self.name} has no namespace {netns!r}")
        ip_batch(self.routes[netns], netns, force=True, options=("-6",))

    # Serialisation ----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "name": self.name,
            "complete": self.complete,
            "fabric": self.fabric.to_toml(),
            "netns": self.netns,
            "links": {
                key: {
                    "a": _end_json(rec.a),
                    "b": _end_json(rec.b),
                    "host_facing": rec.host_facing,
                }
                for key, rec in self.links.items()
            },
            "routes": self.routes,
            "mgmt": self.mgmt,
            "bridge": self.bridge,
            "mgmt_prefix": self.mgmt_prefix,
            "root_links": list(self.root_links),
            "baseline": self.baseline,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TestbedState:
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported state version {data.get('version')!r}")
        return cls(
            name=check_name(data["name"]),
            fabric=Fabric.from_toml(data["fabric"]),
            netns={str(k): str(v) for k, v in data["netns"].items()},
            links={
                key: LinkRecord(
                    name=key,
                    a=LinkEnd(**rec["a"]),
                    b=LinkEnd(**rec["b"]),
                    host_facing=bool(rec["host_facing"]),
                )
                for key, rec in data["links"].items()
            },
            routes={str(k): [str(line) for line in v] for k, v in data["routes"].items()},
            mgmt={str(k): str(v) for k, v in data["mgmt"].items()},
            bridge=str(data["bridge"]),
            mgmt_prefix=str(data["mgmt_prefix"]),
            root_links=tuple(str(x) for x in data["root_links"]),
            baseline={str(k): [str(a) for a in v] for k, v in data["baseline"].items()},
            complete=bool(data["complete"]),
        )


def _end_json(end: LinkEnd) -> dict[str, str]:
    return {"node": end.node, "netns": end.netns, "ifname": end.ifname}


def _describe_link(a: str, b: str | None) -> str:
    return a if b is None else f"{a} - {b}"


def plane_of(a: str, b: str) -> int:
    """The plane of the link between nodes ``a`` and ``b`` (ValueError if both are hosts)."""
    for name in (a, b):
        plane = parse_node(name).plane
        if plane is not None:
            return plane
    raise ValueError(f"{a} and {b} are both hosts; a link joins a host to a T0 or a T0 to a T1")


# Files ------------------------------------------------------------------------------------
def save(state: TestbedState) -> Path:
    """Write the state file atomically (temporary file, fsync, rename)."""
    path = state_path(state.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(state.to_json(), handle, indent=1, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return path


def exists(name: str) -> bool:
    return state_path(name).exists()


def load(name: str = DEFAULT_NAME) -> TestbedState:
    """The recorded state of testbed ``name``; TestbedError (one line) if there is none."""
    path = state_path(name)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TestbedError(
            f"no testbed named {name!r}: no state file {path} (start one with "
            f"`mrcstack testbed up --name {name}`)"
        ) from None
    try:
        return TestbedState.from_json(json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        raise TestbedError(f"state file {path} is unreadable: {exc}") from None


def remove(name: str) -> None:
    """Delete the state file, the fault record and the fault log of ``name``, if present
    (by exact name)."""
    for path in (state_path(name), faults_path(name), faults_log_path(name)):
        path.unlink(missing_ok=True)


def recorded() -> list[str]:
    """Names of every testbed with a state file, sorted."""
    if not STATE_DIR.is_dir():
        return []
    return sorted(p.stem for p in STATE_DIR.glob("*.json") if NAME_RE.fullmatch(p.stem) is not None)
