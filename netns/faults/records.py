"""What the fault harness records: each fault, the operations that apply and undo it, and
the file that holds the active ones.

A fault is planned as data before anything runs: a :class:`Fault` whose ``apply`` and
``undo`` are operations, one frozen dataclass per kind (:class:`PortDown`, :class:`Nft`,
...), which :mod:`.ops` runs through one table.  ``<STATE_DIR>/<name>.faults.json`` holds
the active faults with their undo operations, each as ``{"op": NAME, FIELD: VALUE, ...}``
(:meth:`Operation.to_json`): the record's version 1, as the harness has always written it,
so a record written by an earlier mrcstack loads, and saves, unchanged.  An operation or
fault kind this one does not know makes the record unreadable, with one line naming it,
instead of being skipped.  A lock on the state directory serialises harness processes.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum, StrEnum
from typing import Any, ClassVar

from mrcstack.fabric import format_rate
from mrcstack.netns.faults.plan import FaultError
from mrcstack.netns.state import faults_path

FAULTS_VERSION = 1


class FaultKind(StrEnum):
    """What a fault does; the text is the record's ``kind`` and the log's."""

    LINK_DOWN = "link_down"
    NIC_DOWN = "nic_down"
    SWITCH_FAIL = "switch_fail"
    BLACKHOLE = "blackhole"
    LOSS = "loss"
    LOSS_PATH = "loss_path"
    SHAPE = "shape"
    TRIM = "trim"
    NETEM = "netem"


class Tier(StrEnum):
    """The testbed's shaping a port returns to when a fault stops shaping or trimming it."""

    HOST = "host"
    FABRIC = "fabric"


# Resources a fault holds, which no other fault may take -------------------------------------
def port_resource(netns: str, ifname: str) -> str:
    """What a down-type fault holds: the port, administratively down."""
    return f"down {netns}/{ifname}"


def qdisc_resource(netns: str, ifname: str) -> str:
    """What a shape or trim fault holds: the port's root qdisc."""
    return f"qdisc {netns}/{ifname}"


def netem_resource(netns: str, ifname: str) -> str:
    """What a netem fault holds: the port's netem (a child under shaping or trimming, or
    the root).  Shaping or trimming the port afterwards would replace it."""
    return f"netem {netns}/{ifname}"


# Operations ---------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """A field's JSON form: dataclasses as objects, tuples as lists, enums as their text."""
    if isinstance(value, Enum):
        return value.value
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class Operation:
    """One kernel step of a fault.  Each subclass is one kind, ``name`` its record's "op"."""

    name: ClassVar[str] = ""

    def where(self) -> str:
        """The namespace or port it acts on, for the log ("" for none)."""
        return ""

    def describe(self) -> str:
        return f"{self.name} {self.where()}".strip()

    def to_json(self) -> dict[str, Any]:
        return {"op": self.name} | {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def decode(cls, data: Mapping[str, Any]) -> Operation:
        """This kind from its JSON form (KeyError, TypeError or ValueError if malformed)."""
        return cls(**{f.name: data[f.name] for f in fields(cls)})


@dataclass(frozen=True, slots=True)
class NamespaceOp(Operation):
    """Acts in one namespace: the harness keeps a thread there for an armed fault."""

    netns: str

    def where(self) -> str:
        return self.netns


@dataclass(frozen=True, slots=True)
class PortOp(NamespaceOp):
    """Acts on one port of a namespace."""

    ifname: str

    def where(self) -> str:
        return f"{self.netns}/{self.ifname}"


@dataclass(frozen=True, slots=True)
class Address:
    """An IPv6 address a port loses when it goes down and gets back on ``up``
    (:func:`mrcstack.netns.ifctl.ipv6_addresses`)."""

    local: str
    prefixlen: int
    nodad: bool


@dataclass(frozen=True, slots=True)
class PortDown(PortOp):
    """``ip link set down``: the kernel deletes the port's routes and IPv6 addresses."""

    name: ClassVar[str] = "down"


@dataclass(frozen=True, slots=True)
class PortUp(PortOp):
    """``ip link set up``, then the addresses recorded before ``down`` again (the kernel
    flushed them, even the static link-local ones: docs/linux.md, trap 1)."""

    name: ClassVar[str] = "up"
    addrs: tuple[Address, ...]

    @classmethod
    def decode(cls, data: Mapping[str, Any]) -> Operation:
        addrs = tuple(
            Address(str(a["local"]), int(a["prefixlen"]), bool(a.get("nodad")))
            for a in data["addrs"]
        )
        return cls(str(data["netns"]), str(data["ifname"]), addrs)


@dataclass(frozen=True, slots=True)
class Routes(NamespaceOp):
    """Re-install the namespace's recorded routes, minus those through ports still down."""

    name: ClassVar[str] = "routes"


@dataclass(frozen=True, slots=True)
class Settle(Operation):
    """Wait until both ends of the links brought back are operational, then flush their
    neighbour entries."""

    name: ClassVar[str] = "settle"
    ports: tuple[tuple[str, str], ...]

    @classmethod
    def decode(cls, data: Mapping[str, Any]) -> Operation:
        return cls(tuple((str(n), str(i)) for n, i in data["ports"]))


@dataclass(frozen=True, slots=True)
class Nft(NamespaceOp):
    """Load one fault's nftables table (an ``nft -f`` script)."""

    name: ClassVar[str] = "nft"
    script: str


@dataclass(frozen=True, slots=True)
class NftDelete(NamespaceOp):
    """Delete one fault's nftables table; one already gone is not an error."""

    name: ClassVar[str] = "nft_delete"
    table: str


@dataclass(frozen=True, slots=True)
class Shape(PortOp):
    """The testbed's tbf on the port; the fabric's queue size unless ``queue_bytes``."""

    name: ClassVar[str] = "shape"
    rate_bps: int
    queue_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        data = Operation.to_json(self)
        if self.queue_bytes is None:
            del data["queue_bytes"]  # the fabric's queue: left out, as it always was
        return data

    @classmethod
    def decode(cls, data: Mapping[str, Any]) -> Operation:
        return cls(data["netns"], data["ifname"], data["rate_bps"], data.get("queue_bytes"))


@dataclass(frozen=True, slots=True)
class TierOp(PortOp):
    """Ends with the port back at the testbed's own shaping of its tier (none if the fabric
    shapes none)."""

    tier: Tier

    @classmethod
    def decode(cls, data: Mapping[str, Any]) -> Operation:
        return cls(data["netns"], data["ifname"], Tier(data["tier"]))


@dataclass(frozen=True, slots=True)
class Unshape(TierOp):
    """A shape fault's undo: the port back at its tier's shaping."""

    name: ClassVar[str] = "unshape"


@dataclass(frozen=True, slots=True)
class TrimAttach(PortOp):
    """The trim program and its htb on the port (:func:`.trim.attach`'s settings)."""

    name: ClassVar[str] = "trim_attach"
    rate_bps: int
    trim_threshold_bytes: int
    ecn_threshold_bytes: int | None
    last_hop: bool
    probability: float | None
    queue_bytes: int


@dataclass(frozen=True, slots=True)
class TrimDetach(TierOp):
    """The trim program off the port, then the port back at its tier's shaping."""

    name: ClassVar[str] = "trim_detach"


@dataclass(frozen=True, slots=True)
class NetemAttach(PortOp):
    """netem on the port's egress, under its shaping or trimming if it has one."""

    name: ClassVar[str] = "netem_attach"
    spec: dict[str, Any]  # NetemSpec.to_params(), what netem.parse_spec reads back


@dataclass(frozen=True, slots=True)
class NetemDetach(PortOp):
    """Our netem off the port, wherever it sits."""

    name: ClassVar[str] = "netem_detach"


#: Every operation kind by its record name.
OPERATIONS: Mapping[str, type[Operation]] = {
    cls.name: cls
    for cls in (PortDown, PortUp, Routes, Settle, Nft, NftDelete, Shape, Unshape, TrimAttach,
                TrimDetach, NetemAttach, NetemDetach)
}  # fmt: skip


def decode_operation(data: Mapping[str, Any]) -> Operation:
    """An operation from its JSON form; FaultError naming the problem if it is not one."""
    name = data.get("op")
    kind = OPERATIONS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise FaultError(f"unknown operation {name!r}")
    try:
        return kind.decode(data)
    except KeyError as exc:
        raise FaultError(f"operation {name!r}: missing {exc}") from None
    except (TypeError, ValueError) as exc:
        raise FaultError(f"operation {name!r}: {exc}") from None


def summary(ops: Sequence[Operation]) -> str:
    """What a list of operations does, for the log: ``down mrc-p0-t0a/t1c, up ...``."""
    return ", ".join(op.describe() for op in ops) or "nothing to do"


# Faults -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Fault:
    """One active fault: what it is and the exact operations that undo it.

    ``key`` identifies it (one active fault per key: a new loss on the same link direction
    replaces the old one); ``holds`` are the ports it keeps down or the egress ports whose
    qdisc it owns, which no other fault may take.  ``apply`` is not recorded: a fault is
    applied by the process that planned it."""

    id: int
    kind: FaultKind
    key: str
    target: str
    params: dict[str, Any]
    holds: tuple[str, ...]
    undo: tuple[Operation, ...]
    since: str = ""
    apply: tuple[Operation, ...] = field(default=(), compare=False)

    def describe(self) -> str:
        extra = " ".join(
            f"{k}={format_rate(v) if k.endswith('_bps') else v}" for k, v in self.params.items()
        )
        return f"#{self.id} {self.kind} {self.target}" + (f" {extra}" if extra else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "key": self.key,
            "target": self.target,
            "params": self.params,
            "holds": list(self.holds),
            "undo": [op.to_json() for op in self.undo],
            "since": self.since,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fault:
        """A recorded fault (FaultError naming it if its kind or an operation is unknown)."""
        try:
            kind = FaultKind(data["kind"])
        except ValueError:
            raise FaultError(f"fault #{data['id']}: unknown kind {data['kind']!r}") from None
        try:
            undo = tuple(decode_operation(op) for op in data["undo"])
        except FaultError as exc:
            raise FaultError(f"fault #{data['id']}: {exc}") from None
        return cls(
            id=int(data["id"]),
            kind=kind,
            key=str(data["key"]),
            target=str(data["target"]),
            params=dict(data["params"]),
            holds=tuple(str(h) for h in data["holds"]),
            undo=undo,
            since=str(data["since"]),
        )


@dataclass(slots=True)
class Records:
    """The contents of ``<name>.faults.json``."""

    testbed: str
    next_id: int = 1
    faults: list[Fault] = field(default_factory=list)

    def by_key(self, key: str) -> Fault | None:
        return next((f for f in self.faults if f.key == key), None)

    def holder(self, resource: str) -> Fault | None:
        return next((f for f in self.faults if resource in f.holds), None)


# The file -----------------------------------------------------------------------------------
def load_records(name: str) -> Records:
    """The active faults recorded for testbed ``name`` (none if there is no file)."""
    path = faults_path(name)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Records(testbed=name)
    except ValueError as exc:
        raise FaultError(f"fault record {path} is unreadable: {exc}") from None
    if data.get("version") != FAULTS_VERSION:
        raise FaultError(f"fault record {path}: unsupported version {data.get('version')!r}")
    try:
        faults = [Fault.from_json(f) for f in data["faults"]]
    except FaultError as exc:
        raise FaultError(f"fault record {path}: {exc}") from None
    return Records(testbed=str(data["testbed"]), next_id=int(data["next_id"]), faults=faults)


def save_records(records: Records) -> None:
    path = faults_path(records.testbed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = {
        "version": FAULTS_VERSION,
        "testbed": records.testbed,
        "next_id": records.next_id,
        "faults": [f.to_json() for f in records.faults],
    }
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@contextmanager
def harness_lock(name: str) -> Iterator[None]:
    """Exclusive among harness processes: flock on the state directory, which every harness
    process shares and nobody replaces."""
    directory = faults_path(name).parent
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def locked_records(name: str) -> Iterator[Records]:
    """Exclusive access to a testbed's fault record (:func:`harness_lock`); written back
    when the block ends, even on an exception."""
    with harness_lock(name):
        records = load_records(name)
        try:
            yield records
        finally:
            save_records(records)
