"""Fault scenarios: a timed sequence of faults in a TOML file, checked up front, replayed on a
monotonic clock.

A scenario is a list of steps; each step names an ``action`` (a :class:`.harness.Faults`
method), the time ``at`` which it starts, its targets and parameters, and optionally
``duration`` (or ``until``) after which it is undone automatically::

    [[step]]                 # at 2 s, flap two T0-T1 links for 3 s
    at = "2s"
    action = "link_down"
    links = ["p0:t0a-t1a", "p0:t0a-t1b"]
    duration = "3s"

    [[step]]
    at = "2.5s"
    action = "loss"
    a = "p1-t0a"
    b = "p1-t1c"
    rate = "20%"
    until = "4s"

Parsing (:func:`parse_scenario`) is pure: it checks every step against a fabric and builds
the whole timeline (:class:`Event` list) before anything runs, so a typo in step 7 is a
one-line error naming step 7 and the key, not a half-played scenario.  Events at the same
time run automatic restores first, then new steps in file order.  :func:`run_scenario`
replays the timeline with an injectable clock, logs every event with its planned and actual
offset and an ISO timestamp, and returns the log; if an event fails (or the run is
interrupted) it undoes the faults the scenario itself applied and re-raises.
"""

from __future__ import annotations

import math
import re
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrcstack import resources
from mrcstack.errors import LocalError
from mrcstack.fabric import Fabric, format_rate, parse_rate, parse_size
from mrcstack.netns.faults.netem import NETEM_KEYS, parse_spec
from mrcstack.netns.faults.plan import (
    FaultError,
    directions,
    now_iso,
    parse_probability,
    resolve_link,
    resolve_switch,
    tier_rate,
)

_TIME = re.compile(r"\s*((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[+-]?[0-9]{1,3})?)\s*([a-zµ]*)\s*")
_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "m": 60.0, "min": 60.0}
_COMMON = {"at", "action", "duration", "until", "note"}
_LINK_KEYS = {"link", "links", "a", "b"}
_SWITCH_KEYS = {"switch", "switches"}
_TOP_KEYS = {"step", "name", "description"}


class FaultScenarioError(LocalError, ValueError):
    """A scenario file is invalid or a step failed; one line naming the step and key."""


@dataclass(frozen=True, slots=True)
class _Action:
    targets: str  # "link", "switch", "nic", "path" or "none"
    required: frozenset[str]  # parameter keys (besides the targets)
    optional: frozenset[str]
    inverse: str | None  # the action that undoes it, for duration/until


ACTIONS: dict[str, _Action] = {
    "link_down": _Action("link", frozenset(), frozenset(), "link_up"),
    "link_up": _Action("link", frozenset(), frozenset(), None),
    "nic_down": _Action("nic", frozenset(), frozenset(), "nic_up"),
    "nic_up": _Action("nic", frozenset(), frozenset(), None),
    "switch_fail": _Action("switch", frozenset(), frozenset(), "switch_restore"),
    "switch_blackhole": _Action("switch", frozenset(), frozenset(), "switch_restore"),
    "switch_restore": _Action("switch", frozenset(), frozenset(), None),
    "loss": _Action("link", frozenset({"rate"}), frozenset({"from"}), "clear_loss"),
    "clear_loss": _Action("link", frozenset(), frozenset({"from"}), None),
    "loss_path": _Action("path", frozenset({"rate"}), frozenset(), "clear_loss_path"),
    "clear_loss_path": _Action("path", frozenset(), frozenset(), None),
    "shape": _Action("link", frozenset({"rate"}), frozenset({"queue", "from"}), "unshape"),
    "unshape": _Action("link", frozenset(), frozenset({"from"}), None),
    "trim": _Action(
        "link",
        frozenset({"threshold"}),
        frozenset({"rate", "ecn_threshold", "probability", "queue", "from"}),
        "untrim",
    ),
    "untrim": _Action("link", frozenset(), frozenset({"from"}), None),
    "netem": _Action("link", frozenset(), frozenset({*NETEM_KEYS, "from"}), "unnetem"),
    "unnetem": _Action("link", frozenset(), frozenset({"from"}), None),
    "restore_all": _Action("none", frozenset(), frozenset(), None),
}
APPLYING = frozenset(  # the harness methods that apply faults (the rest undo them)
    {
        "link_down",
        "nic_down",
        "switch_fail",
        "switch_blackhole",
        "loss",
        "loss_path",
        "shape",
        "trim",
        "netem",
    }
)
_TARGET_KEYS = {
    "link": _LINK_KEYS,
    "switch": _SWITCH_KEYS,
    "path": _SWITCH_KEYS,
    "nic": {"host", "plane"},
    "none": set(),
}


@dataclass(frozen=True, slots=True)
class Event:
    """One call on the harness at a time offset: ``getattr(faults, method)(**kwargs)``."""

    at: float  # seconds after the scenario starts
    step: int  # the step (1-based, file order) it comes from
    action: str  # the scenario action ("clear_loss_path", ...)
    method: str  # the Faults method it calls
    kwargs: tuple[tuple[str, Any], ...]
    restore: bool = False  # an automatic undo (duration/until)

    def describe(self) -> str:
        args = " ".join(
            f"{k}={format_rate(v) if k.endswith('_bps') else v}"
            for k, v in self.kwargs
            if v is not None
        )
        tail = " (automatic restore)" if self.restore else ""
        return f"{self.action} {args}".strip() + tail


@dataclass(frozen=True, slots=True)
class Scenario:
    """A validated scenario: its events in the order they run."""

    events: tuple[Event, ...]
    name: str = ""

    @property
    def duration(self) -> float:
        return self.events[-1].at if self.events else 0.0


@dataclass(frozen=True, slots=True)
class LogEntry:
    """What happened to one event."""

    planned: float  # offset from the timeline
    actual: float  # offset when the call was made (monotonic clock)
    wall: str  # ISO timestamp when the call was made
    step: int
    text: str
    faults: tuple[int, ...] = ()  # ids of the faults it applied or removed

    def line(self) -> str:
        return (
            f"{self.wall} t=+{self.actual:.3f}s (planned {self.planned:.3f}s) "
            f"step {self.step}: {self.text}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "planned": self.planned,
            "actual": self.actual,
            "wall": self.wall,
            "step": self.step,
            "text": self.text,
            "faults": list(self.faults),
        }


# Parsing ------------------------------------------------------------------------------------
def parse_time(value: object) -> float:
    """Seconds from a TOML number (seconds) or a string like "2s", "200ms", "50us"."""
    if isinstance(value, bool):
        raise ValueError(f"bad time {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _TIME.fullmatch(value)
        scale = _TIME_UNITS.get(match.group(2).lower()) if match else None
        if match is None or scale is None:
            raise ValueError(f"bad time {value!r}: expected like 2s, 200ms, 50us or 1.5")
        seconds = float(match.group(1)) * scale
    else:
        raise ValueError(f"bad time {value!r}: expected a number of seconds or a string")
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"bad time {value!r}: must be finite and not negative")
    return seconds


def load_scenario(path: str | Path, fabric: Fabric) -> Scenario:
    """Read and validate a scenario file (FaultScenarioError, one line, on any problem)."""
    try:
        text = resources.read_bytes(path).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FaultScenarioError(f"{path}: cannot read: {exc}") from None
    return parse_scenario(text, fabric)


def parse_scenario(text: str, fabric: Fabric) -> Scenario:
    """Validate a scenario against a fabric and build its timeline."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FaultScenarioError(f"toml: {str(exc).splitlines()[0]}") from None
    for key in document:
        if key not in _TOP_KEYS:
            hint = " (steps are [[step]] tables)" if key == "steps" else ""
            raise FaultScenarioError(f"{key}: unknown key{hint}")
    steps = document.get("step")
    if not isinstance(steps, list) or not steps:
        raise FaultScenarioError("step: no steps (add [[step]] tables)")
    events: list[tuple[tuple[float, int, int], Event]] = []
    for number, raw in enumerate(steps, start=1):
        if not isinstance(raw, dict):
            raise FaultScenarioError(f"step {number}: must be a table, got {raw!r}")
        try:
            for event in _step_events(number, raw, fabric):
                order = (event.at, 0 if event.restore else 1, len(events))
                events.append((order, event))
        except (FaultError, ValueError) as exc:
            if isinstance(exc, FaultScenarioError):
                raise
            raise FaultScenarioError(f"step {number}: {exc}") from None
    timeline = tuple(event for _, event in sorted(events, key=lambda item: item[0]))
    _check_downs(timeline)
    name = document.get("name", "")
    return Scenario(events=timeline, name=name if isinstance(name, str) else str(name))


def _fail(step: int, key: str, problem: object) -> FaultScenarioError:
    return FaultScenarioError(f"step {step}: {key}: {problem}")


def _step_events(step: int, raw: Mapping[str, Any], fabric: Fabric) -> list[Event]:
    action_name = raw.get("action")
    if not isinstance(action_name, str) or action_name not in ACTIONS:
        raise _fail(step, "action", f"expected one of {', '.join(ACTIONS)}, got {action_name!r}")
    action = ACTIONS[action_name]
    allowed = _COMMON | _TARGET_KEYS[action.targets] | action.required | action.optional
    for key in raw:
        if key not in allowed:
            raise _fail(step, key, f"unknown key for {action_name}")
    for key in action.required:
        if key not in raw:
            raise _fail(step, key, f"missing (required by {action_name})")
    if "at" not in raw:
        raise _fail(step, "at", 'missing (when the step starts, like at = "2s")')
    at = _get(step, "at", raw, parse_time)
    end = _end(step, raw, at, action_name, action.inverse)
    calls = _calls(step, action_name, action.targets, raw, fabric)
    events = [Event(at, step, action_name, method, kwargs) for method, kwargs in calls]
    if end is not None and action.inverse is not None:
        inverse = ACTIONS[action.inverse]
        for method, kwargs in _calls(step, action.inverse, inverse.targets, raw, fabric):
            events.append(Event(end, step, action.inverse, method, kwargs, restore=True))
    return events


def _get(step: int, key: str, raw: Mapping[str, Any], parse: Callable[[Any], Any]) -> Any:
    try:
        return parse(raw[key])
    except (ValueError, TypeError, FaultError) as exc:
        raise _fail(step, key, exc) from None


def _end(
    step: int, raw: Mapping[str, Any], at: float, action: str, inverse: str | None
) -> float | None:
    if "duration" in raw and "until" in raw:
        raise _fail(step, "until", "give duration or until, not both")
    if ("duration" in raw or "until" in raw) and inverse is None:
        key = "duration" if "duration" in raw else "until"
        raise _fail(step, key, f"{action} has no automatic restore")
    if "duration" in raw:
        duration = _get(step, "duration", raw, parse_time)
        if duration <= 0:
            raise _fail(step, "duration", "must be positive")
        return float(at + duration)
    if "until" in raw:
        until = _get(step, "until", raw, parse_time)
        if until <= at:
            raise _fail(step, "until", f"must be after at ({at:g}s), got {until:g}s")
        return float(until)
    return None


def _links(step: int, raw: Mapping[str, Any], fabric: Fabric) -> list[str]:
    given = [k for k in ("link", "links", "a") if k in raw]
    if len(given) != 1:
        raise _fail(step, "link", "give exactly one of link, links, or a and b")
    if given[0] == "a":
        if "b" not in raw:
            raise _fail(step, "b", "missing (a link's other end)")
        a, b = raw["a"], raw["b"]
        if not isinstance(a, str) or not isinstance(b, str):
            raise _fail(step, "a", "a and b must be node names like p0-t0a")
        return [_get(step, "a", raw, lambda _: resolve_link(fabric, a, b))]
    if "b" in raw:
        raise _fail(step, "b", f"b goes with a, not with {given[0]}")
    names = raw[given[0]]
    names = [names] if given[0] == "link" else names
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise _fail(step, given[0], "expected a link name like p0:t0a-t1c (links: a list)")
    return [_get(step, given[0], {given[0]: n}, lambda n: resolve_link(fabric, n)) for n in names]


def _switches(step: int, raw: Mapping[str, Any], fabric: Fabric) -> list[str]:
    given = [k for k in ("switch", "switches") if k in raw]
    if len(given) != 1:
        raise _fail(step, "switch", "give exactly one of switch or switches")
    names = raw[given[0]]
    names = [names] if given[0] == "switch" else names
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise _fail(step, given[0], "expected a switch name like p0-t1c (switches: a list)")
    return [_get(step, given[0], {given[0]: n}, lambda n: resolve_switch(fabric, n)) for n in names]


def _from(step: int, raw: Mapping[str, Any], link: str) -> str | None:
    if "from" not in raw:
        return None
    node = raw["from"]
    if not isinstance(node, str):
        raise _fail(step, "from", f"expected a node name, got {node!r}")
    _get(step, "from", raw, lambda n: directions(link, n))
    return node


def _calls(
    step: int, action: str, targets: str, raw: Mapping[str, Any], fabric: Fabric
) -> list[tuple[str, tuple[tuple[str, Any], ...]]]:
    """The harness calls a step (or its inverse) makes: (method, keyword arguments)."""
    if targets == "none":
        return [("restore_all", ())]
    if targets == "nic":
        host, plane = raw.get("host"), raw.get("plane")
        if not isinstance(host, str):
            raise _fail(step, "host", f"expected a host name like h0, got {host!r}")
        if isinstance(plane, bool) or not isinstance(plane, int):
            raise _fail(step, "plane", f"expected a plane number, got {plane!r}")
        _check_nic(step, fabric, host, plane)
        return [(action, (("host", host), ("plane", plane)))]
    if targets in ("switch", "path"):
        switches = _switches(step, raw, fabric)
        if action == "loss_path":
            rate = _get(step, "rate", raw, parse_probability)
            return [("loss_path", (("sid_or_switch", s), ("rate", rate))) for s in switches]
        if action == "clear_loss_path":
            return [("clear_loss", (("path", s),)) for s in switches]
        return [(action, (("switch", s),)) for s in switches]
    calls = []
    for link in _links(step, raw, fabric):
        kwargs: dict[str, Any] = {"a": link}
        source = _from(step, raw, link)
        if action == "loss":
            kwargs |= {"b": None, "rate": _get(step, "rate", raw, parse_probability)}
        elif action == "netem":
            try:
                spec = parse_spec({k: raw[k] for k in NETEM_KEYS if k in raw})
            except FaultError as exc:
                raise _fail(step, "netem", str(exc)) from None
            kwargs |= {"b": None, "spec": spec.to_params()}
        elif action == "shape":
            kwargs |= {"b": None, "rate_bps": _get(step, "rate", raw, _rate)}
            if "queue" in raw:
                kwargs["queue_bytes"] = _get(step, "queue", raw, _size)
        elif action == "trim":
            kwargs |= {
                "b": None,
                "threshold_bytes": _get(step, "threshold", raw, _size),
                "ecn_threshold_bytes": (
                    _get(step, "ecn_threshold", raw, _size) if "ecn_threshold" in raw else None
                ),
                "rate_bps": _get(step, "rate", raw, _rate) if "rate" in raw else None,
                "probability": (
                    _get(step, "probability", raw, parse_probability)
                    if "probability" in raw
                    else None
                ),
                "queue_bytes": _get(step, "queue", raw, _size) if "queue" in raw else None,
            }
            if kwargs["rate_bps"] is None and tier_rate(fabric, link) is None:
                raise _fail(step, "rate", f"missing (link {link} is unshaped in this fabric)")
        if action not in ("link_down", "link_up"):
            kwargs["from_node"] = source
        calls.append((action, tuple(kwargs.items())))
    return calls


def _check_nic(step: int, fabric: Fabric, host: str, plane: int) -> None:
    try:
        fabric.check_plane(plane)
    except ValueError as exc:
        raise _fail(step, "plane", exc) from None
    match = re.fullmatch(r"h(0|[1-9][0-9]*)", host)
    try:
        if match is None:
            raise ValueError(f"bad host name {host!r}: expected like h0")
        fabric.check_host(int(match.group(1)))
    except ValueError as exc:
        raise _fail(step, "host", exc) from None


def _rate(value: object) -> float:
    if isinstance(value, str):
        return parse_rate(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f'bad rate {value!r}: expected like "100mbit" or bits per second')
    return float(value)


def _size(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f'bad size {value!r}: expected bytes or a string like "64KiB"')
    return parse_size(value)


_DOWN = {"link_down": "link", "nic_down": "nic", "switch_fail": "switch"}
_UP = {"link_up": "link", "nic_up": "nic", "switch_restore": "switch"}


def _down_key(event: Event) -> str:
    args = dict(event.kwargs)
    kind = _DOWN.get(event.action) or _UP[event.action]
    if kind == "nic":
        return f"nic {args['host']} {args['plane']}"
    return f"{kind} {args.get('a') or args.get('switch')}"


def _check_downs(timeline: tuple[Event, ...]) -> None:
    """A link, NIC or switch taken down twice without coming back is an error up front."""
    down: dict[str, Event] = {}
    for event in timeline:
        if event.action == "restore_all":
            down.clear()
        elif event.action in _DOWN:
            key = _down_key(event)
            if key in down:
                first = down[key]
                raise FaultScenarioError(
                    f"step {event.step}: {key} is already down at {event.at:g}s "
                    f"(step {first.step}, at {first.at:g}s)"
                )
            down[key] = event
        elif event.action in _UP:
            down.pop(_down_key(event), None)


# Running ------------------------------------------------------------------------------------
def run_scenario(
    scenario: Scenario,
    faults: Any,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], object] | None = None,
    restore_on_error: bool = True,
) -> list[LogEntry]:
    """Replay a scenario on a :class:`.harness.Faults` (anything with its methods).

    Returns one :class:`LogEntry` per event, in order.  On a failing event (or Ctrl-C) the
    faults this run applied and that are still active are undone, then a FaultScenarioError
    naming the step is raised (KeyboardInterrupt is re-raised as is)."""
    emit: Callable[[str], object] = faults.log if log is None else log
    entries: list[LogEntry] = []
    applied: list[int] = []
    start = clock()
    event: Event | None = None
    try:
        for event in scenario.events:
            delay = start + event.at - clock()
            if delay > 0:
                sleep(delay)
            offset, wall = clock() - start, now_iso()
            result = getattr(faults, event.method)(**dict(event.kwargs))
            ids = tuple(int(f.id) for f in result or ())
            if event.method in APPLYING:
                applied.extend(ids)
            entry = LogEntry(event.at, offset, wall, event.step, event.describe(), ids)
            entries.append(entry)
            emit(f"scenario t=+{offset:.3f}s (planned {event.at:.3f}s) step {event.step}: "
                 f"{entry.text}")  # fmt: skip
    except BaseException as exc:
        if restore_on_error:
            _undo_applied(faults, applied, emit)
        if isinstance(exc, Exception) and event is not None:
            raise FaultScenarioError(f"step {event.step} ({event.describe()}): {exc}") from exc
        raise
    return entries


def _undo_applied(faults: Any, applied: list[int], emit: Callable[[str], object]) -> None:
    try:
        active = {int(f.id) for f in faults.active()}
    except Exception as exc:  # report, keep the original error
        emit(f"scenario: cannot read active faults to undo them: {exc}")
        return
    for fault_id in sorted(set(applied) & active, reverse=True):
        try:
            faults.clear(fault_id)
        except Exception as exc:  # undo as much as possible
            emit(f"scenario: could not undo fault #{fault_id}: {exc}")
