"""What agents and the mapper say to each other: JSON objects, checked on the way in.

They travel as records of an authenticated session (mrcd's control-channel handshake and
record layer: a forged or replayed record never gets here).  Agent to mapper:

- ``hello``: ``host``, the ``plan`` digest it probes, its probe ``interval``, and the
  denylist it holds (``links``, ``version``, the ``instance`` of the mapper that sent it);
- ``report``: ``results``, ``[loop, sent, lost, tail, rtt_us]`` per loop (its share only);
- ``applied``: the denylist ``version`` now in force, with the EVs it ``denied`` and the
  ``qps`` it touched.

Mapper to agent: ``denylist`` (``version``, ``instance``, ``links``), after every hello and
whenever the list changes.  A message that breaks these rules raises :class:`MessageError`
(the peer's fault); the session is closed and the reason counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mrcstack import addrplan
from mrcstack.errors import PeerError
from mrcstack.mapper.agent import PathResult
from mrcstack.mapper.plan import ProbePlan

#: Loops one report may carry, and links one denylist may name.
MAX_RESULTS = 4096
MAX_LINKS = 65536
MAX_PROBES = 1 << 20  # per loop per report
INSTANCE_MAX = 64


class MessageError(PeerError):
    """A message from the other end broke the protocol; ``reason`` is counted."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Hello:
    host: int
    plan: str
    interval: float
    links: frozenset[str]
    version: int
    instance: str


@dataclass(frozen=True, slots=True)
class Denylist:
    version: int
    instance: str
    links: frozenset[str]


@dataclass(frozen=True, slots=True)
class Applied:
    version: int
    denied: int
    qps: int


def _int(msg: Mapping[str, Any], key: str, top: int) -> int:
    value = msg.get(key)
    if type(value) is not int or not 0 <= value <= top:
        raise MessageError("bad_message", f"{key}: an integer in 0..{top}, got {value!r}")
    return value


def _str(msg: Mapping[str, Any], key: str, top: int) -> str:
    value = msg.get(key)
    if not isinstance(value, str) or len(value) > top:
        raise MessageError("bad_message", f"{key}: a string of at most {top}, got {value!r}")
    return value


def _links(msg: Mapping[str, Any], plan: ProbePlan) -> frozenset[str]:
    value = msg.get("links")
    if not isinstance(value, list) or len(value) > MAX_LINKS:
        raise MessageError("bad_message", "links: a list of link names")
    out = set()
    for item in value:
        if not isinstance(item, str):
            raise MessageError("bad_message", f"links: {item!r} is not a link name")
        try:
            name = addrplan.canonical_link(item)
        except ValueError:
            raise MessageError("bad_message", f"links: {item!r} is not a link name") from None
        if not plan.has_link(name):
            raise MessageError("bad_message", f"links: {item} is not in this fabric")
        out.add(name)
    return frozenset(out)


# Agent -> mapper ---------------------------------------------------------------------------
def hello(
    ident: int, host: int, plan: str, interval: float, held: Denylist | None
) -> dict[str, Any]:
    return {
        "type": "hello",
        "id": ident,
        "host": host,
        "plan": plan,
        "interval": interval,
        "links": sorted(held.links) if held else [],
        "version": held.version if held else 0,
        "instance": held.instance if held else "",
    }


def parse_hello(msg: Mapping[str, Any], plan: ProbePlan, host: int) -> Hello:
    """An agent's hello; its ``host`` must be the one the session authenticated and its
    plan the mapper's."""
    if msg.get("type") != "hello":
        raise MessageError("bad_message", f"expected hello, got {msg.get('type')!r}")
    said = _int(msg, "host", plan.fabric.hosts - 1)
    if said != host:
        raise MessageError("identity", f"session of h{host} says it is h{said}")
    digest = _str(msg, "plan", 64)
    if digest != plan.digest:
        raise MessageError("plan", f"h{host} probes plan {digest}, the mapper's is {plan.digest}")
    interval = msg.get("interval")
    if isinstance(interval, bool) or not isinstance(interval, int | float) or not interval > 0:
        raise MessageError("bad_message", f"interval: positive seconds, got {interval!r}")
    return Hello(
        host,
        digest,
        float(interval),
        _links(msg, plan),
        _int(msg, "version", 1 << 62),
        _str(msg, "instance", INSTANCE_MAX),
    )


def report(ident: int, results: Sequence[PathResult]) -> dict[str, Any]:
    return {
        "type": "report",
        "id": ident,
        "results": [[r.path, r.sent, r.lost, r.tail, round(r.rtt_sum * 1e6)] for r in results],
    }


def parse_report(msg: Mapping[str, Any], share: frozenset[int]) -> list[PathResult]:
    """A report's results; every loop must be in ``share`` (the host's own loops)."""
    rows = msg.get("results")
    if not isinstance(rows, list) or len(rows) > MAX_RESULTS:
        raise MessageError("bad_message", "results: a list of [loop, sent, lost, tail, rtt_us]")
    out = []
    for row in rows:
        if (
            not isinstance(row, list)
            or len(row) != 5
            or any(type(x) is not int or x < 0 for x in row)
        ):
            raise MessageError("bad_message", f"results: bad row {row!r}")
        path, sent, lost, tail, rtt_us = row
        if path not in share:
            raise MessageError("identity", f"results: loop {path} is not this host's")
        if sent > MAX_PROBES or not tail <= lost <= sent:
            raise MessageError("bad_message", f"results: inconsistent row {row!r}")
        out.append(PathResult(path, sent, lost, tail, rtt_us / 1e6))
    return out


def applied(ident: int, version: int, denied: int, qps: int) -> dict[str, Any]:
    return {"type": "applied", "id": ident, "version": version, "denied": denied, "qps": qps}


def parse_applied(msg: Mapping[str, Any]) -> Applied:
    return Applied(
        _int(msg, "version", 1 << 62), _int(msg, "denied", 1 << 40), _int(msg, "qps", 1 << 40)
    )


# Mapper -> agent ---------------------------------------------------------------------------
def denylist(ident: int, listing: Denylist) -> dict[str, Any]:
    return {
        "type": "denylist",
        "id": ident,
        "version": listing.version,
        "instance": listing.instance,
        "links": sorted(listing.links),
    }


def parse_denylist(msg: Mapping[str, Any], plan: ProbePlan) -> Denylist:
    if msg.get("type") != "denylist":
        raise MessageError("bad_message", f"expected denylist, got {msg.get('type')!r}")
    return Denylist(
        _int(msg, "version", 1 << 62), _str(msg, "instance", INSTANCE_MAX), _links(msg, plan)
    )
