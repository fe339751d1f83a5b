"""Scenario files: a whole simulator scenario (:class:`SimConfig`) in one TOML file.

A command line of twenty flags is hard to review, share and keep, and flags cannot say
everything a :class:`SimConfig` can (flows with their own sizes and dependencies,
collectives, plane failures, loss that changes over time, CC parameters); a file can.
``mrcstack-sim --scenario FILE`` runs one, flags given with it override the file, and
``--dump-scenario`` turns any command line into a file.  ``docs/scenario.md`` has a full
example; :func:`loads` and :func:`load` read one, :func:`dumps` writes one, and
``loads(dumps(cfg)) == cfg`` for every valid ``cfg``.

Values: sizes are integers (bytes) or strings with units ("16MiB", "64KiB", "1MB"); rates
numbers (bit/s) or tc strings ("10gbit"); times numbers (seconds) or strings ("2ms",
"1.5us", "500ns"); probabilities numbers in [0, 1].  A key left out keeps the
:class:`SimConfig` default.  Top-level keys, then tables::

    key                   SimConfig field        value (default)
    --------------------  ---------------------  -------------------------------------------
    bytes                 bytes_per_flow         size per flow (16MiB)
    wr_size               wr_size                size of each write (1MiB)
    mode                  mode                   "mrc" or "roce"
    cc                    cc                     "nscc", "fixed", ...
    delay                 link_delay_s           time, per link (1us)
    rate                  rate_bps               rate of links the fabric leaves unshaped
    queue                 queue_bytes            size of a switch port (the fabric's)
    trim                  trim                   bool (true)
    trim_threshold        trim_threshold_bytes   size (queue / 2)
    ecn_kmin, ecn_kmax    ecn_k{min,max}_bytes   sizes (queue / 16, queue / 4)
    loss                  loss                   probability, every link (0)
    ecn_last_hop          ecn_last_hop           bool (false)
    packet_latency_every  packet_latency_every   int (0: none)
    mtu_payload           mtu_payload            int (4096)
    ev_count              ev_count               int (128)
    seed                  seed                   int (0)
    max_time              max_sim_time_s         time (1s)
    series                series_interval_s      time (no timeline)
    latency_flows         latency_flows          [flow index, ...]
    latency_writes        latency_writes         int (256)
    latency_write_bytes   latency_write_bytes    size (4096)
    pairs                 pairs                  ["0:3", ...] or [[0, 3], ...]
    link_loss             link_loss              {"p0:t0a-t1c" = p, ...} or [[LINK, p], ...]
    ev_loss               ev_loss                {"0x102" = p, ...} or [[0x102, p], ...]
    fabric                fabric                 [fabric] table (a fabric file's keys) or the
                                                 path of a fabric file (or a shipped one)
    [cc_params]           cc_params              CCParams fields: times, sizes, qa_gate,
                                                 disable_qa
    [mapper]              mapper                 MapperSpec fields: interval, start,
                                                 timeout, hold_down (times), overlap,
                                                 short_repeat, down_after, bucket,
                                                 stale_after, windows (rounds),
                                                 loss_threshold, confidence, deny
    [[flow]]              flow_specs             src, dst, bytes, start, after, evs, planes,
                                                 group
    [[collective]]        flow_specs             kind, hosts (all), chunk, start, name:
                                                 collectives.ring_steps, after the [[flow]]s
    [[fail_link]]         link_failures          link, start, end (none: never restored)
    [[fail_switch]]       switch_failures        switch, start, end
    [[nic_down]]          nic_downs              host, plane, start, end
    [[fail_plane]]        plane_failures         plane, start, end
    [[loss_change]]       loss_changes           at, loss, link (none: every link)

Every error is a :class:`ScenarioError` whose one line starts with the key path at fault
(``flow[2].after[0]: ...``, ``fail_link[0].start: bad time ...``), or with the file name
when the scenario as a whole does not hold together (``SimConfig``'s own check), so a
user can fix the file without reading a traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import gzip
import math
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from importlib import resources as package_files
from pathlib import Path
from typing import Any, TypeVar

from mrcstack import addrplan, resources
from mrcstack.core.cc import CCParams
from mrcstack.errors import LocalError
from mrcstack.fabric import (
    Fabric,
    FabricConfigError,
    format_rate,
    format_size,
    parse_rate,
    parse_size,
)
from mrcstack.sim import collectives
from mrcstack.sim.config import (
    FlowSpec,
    LinkFailure,
    LossChange,
    MapperSpec,
    NicDown,
    PlaneFailure,
    SimConfig,
    SwitchFailure,
)

T = TypeVar("T")
D = TypeVar("D")
Converter = Callable[[str, object], T]
Fault = LinkFailure | SwitchFailure | NicDown | PlaneFailure | LossChange

#: Where the shipped scenarios live, inside the package (``examples/scenarios/*.toml``).
SHIPPED = ("examples", "scenarios")
#: A gzip stream starts with these bytes; a scenario file may be compressed.
GZIP_MAGIC = b"\x1f\x8b"

_TIME_UNITS = {
    "": Fraction(1),
    "s": Fraction(1),
    "ms": Fraction(1, 10**3),
    "us": Fraction(1, 10**6),
    "µs": Fraction(1, 10**6),
    "ns": Fraction(1, 10**9),
}
_TIME = re.compile(r"\s*((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[+-]?[0-9]{1,3})?)\s*([a-zµ]*)\s*")
_TIME_FORMAT = (("s", 0), ("ms", 3), ("us", 6), ("ns", 9))  # unit, decimal places it shifts
_PAIR = re.compile(r"\s*(0|[1-9][0-9]*)\s*:\s*(0|[1-9][0-9]*)\s*")


class ScenarioError(LocalError, ValueError):
    """A scenario is invalid; one line starting with the key path at fault."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem

    def __reduce__(self) -> tuple[type[ScenarioError], tuple[str, str]]:
        return (type(self), (self.key, self.problem))


def parse_time(text: str) -> float:
    """Seconds from "2ms", "1.5us", "500ns", "0.01s" or a bare number of seconds; exact
    (the float nearest the decimal value), so that "5us" is 5e-06, not 5e-06 - 1 ulp."""
    match = _TIME.fullmatch(text)
    scale = _TIME_UNITS.get(match.group(2).lower()) if match else None
    if match is None or scale is None:
        raise ValueError(f"bad time {text!r}: expected like 2ms, 1us, 500ns or 0.5s")
    return float(Fraction(match.group(1)) * scale)


def format_time(seconds: float) -> str | None:
    """The shortest "2ms"-style string :func:`parse_time` maps back to exactly ``seconds``,
    or None when the plain number of seconds is as short (or it is not a finite time)."""
    if not (math.isfinite(seconds) and seconds >= 0):
        return None
    plain = repr(float(seconds))
    decimal = Decimal(plain)
    texts = [f"{decimal.scaleb(places).normalize():f}{unit}" for unit, places in _TIME_FORMAT]
    best = min(texts, key=len)
    return best if len(best) <= len(plain) + 1 and parse_time(best) == seconds else None


# Reading values: each converter names the key path in its error --------------------------
def _describe(raw: object) -> str:
    return f"{raw!r} ({type(raw).__name__})"


def _int(key: str, raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ScenarioError(key, f"must be an integer, got {_describe(raw)}")
    return raw


def _bool(key: str, raw: object) -> bool:
    if not isinstance(raw, bool):
        raise ScenarioError(key, f"must be true or false, got {_describe(raw)}")
    return raw


def _str(key: str, raw: object) -> str:
    if not isinstance(raw, str):
        raise ScenarioError(key, f"must be a string, got {_describe(raw)}")
    return raw


def _number(key: str, raw: object, what: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ScenarioError(key, f"must be {what}, got {_describe(raw)}")
    return float(raw)


def _size(key: str, raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise ScenarioError(key, f'must be a size like 4096 or "64KiB", got {_describe(raw)}')
    try:
        return parse_size(raw)
    except ValueError as exc:
        raise ScenarioError(key, str(exc)) from None


def _time(key: str, raw: object) -> float:
    if isinstance(raw, str):
        try:
            value = parse_time(raw)
        except ValueError as exc:
            raise ScenarioError(key, str(exc)) from None
    else:
        value = _number(key, raw, 'a time like "2ms" or a number of seconds')
    if not (math.isfinite(value) and value >= 0):
        raise ScenarioError(key, f"must be a finite time >= 0, got {raw!r}")
    return value


def _rate(key: str, raw: object) -> float:
    if isinstance(raw, str):
        try:
            value = parse_rate(raw)
        except ValueError as exc:
            raise ScenarioError(key, str(exc)) from None
    else:
        value = _number(key, raw, 'a rate like "10gbit" or a number of bit/s')
    if not (math.isfinite(value) and value > 0):
        raise ScenarioError(key, f"must be a positive, finite rate, got {raw!r}")
    return value


def _probability(key: str, raw: object) -> float:
    value = _number(key, raw, "a probability in [0, 1]")
    if not 0.0 <= value <= 1.0:
        raise ScenarioError(key, f"must be a probability in [0, 1], got {raw!r}")
    return value


def _list(item: Converter[T]) -> Converter[tuple[T, ...]]:
    """A converter for a list whose items ``item`` reads, each named ``key[i]``."""

    def convert(key: str, raw: object) -> tuple[T, ...]:
        if not isinstance(raw, list):
            raise ScenarioError(key, f"must be a list, got {_describe(raw)}")
        return tuple(item(f"{key}[{i}]", value) for i, value in enumerate(raw))

    return convert


def _pair(key: str, raw: object) -> tuple[int, int]:
    """ "0:3" or [0, 3]."""
    if isinstance(raw, str) and (match := _PAIR.fullmatch(raw)):
        return int(match.group(1)), int(match.group(2))
    if isinstance(raw, list) and len(raw) == 2:
        return _int(f"{key}[0]", raw[0]), _int(f"{key}[1]", raw[1])
    raise ScenarioError(key, f'must be "SRC:DST" or [SRC, DST], got {_describe(raw)}')


def _link_probability(key: str, raw: object) -> tuple[str, float]:
    if not (isinstance(raw, list) and len(raw) == 2):
        raise ScenarioError(key, f'must be ["LINK", P], got {_describe(raw)}')
    return _str(f"{key}[0]", raw[0]), _probability(f"{key}[1]", raw[1])


def _ev_probability(key: str, raw: object) -> tuple[int, float]:
    if not (isinstance(raw, list) and len(raw) == 2):
        raise ScenarioError(key, f"must be [EV, P], got {_describe(raw)}")
    return _int(f"{key}[0]", raw[0]), _probability(f"{key}[1]", raw[1])


def _ev_number(key: str, text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise ScenarioError(key, "not an EV number (like 0x102 or 258)") from None


def _link_loss(key: str, raw: object) -> tuple[tuple[str, float], ...]:
    if isinstance(raw, dict):
        return tuple((link, _probability(f"{key}.{link}", p)) for link, p in raw.items())
    return _list(_link_probability)(key, raw)


def _ev_loss(key: str, raw: object) -> tuple[tuple[int, float], ...]:
    if isinstance(raw, dict):
        return tuple(
            (_ev_number(f"{key}.{ev}", ev), _probability(f"{key}.{ev}", p)) for ev, p in raw.items()
        )
    return _list(_ev_probability)(key, raw)


def _tables(key: str, raw: object) -> tuple[object, ...]:
    """An array of tables (``[[flow]]``); each item is checked when it is read."""
    if not isinstance(raw, list):
        raise ScenarioError(key, f"must be an array of tables ([[{key}]]), got {_describe(raw)}")
    return tuple(raw)


# Writing values: exact, so that a file read back gives the same SimConfig -----------------
_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def _string(text: str) -> str:
    """A TOML basic string: TOML allows no surrogates, and wants controls escaped."""
    out = ['"']
    for char in text:
        code = ord(char)
        if 0xD800 <= code <= 0xDFFF:
            raise ValueError(f"{text!r}: a lone surrogate cannot be written in TOML")
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out) + '"'


def _write_float(value: float) -> str:
    return repr(float(value))  # shortest exact form; TOML reads inf and nan too


def _write_time(seconds: float) -> str:
    text = format_time(seconds)
    return _string(text) if text is not None else _write_float(seconds)


def _write_size(size: int) -> str:
    text = format_size(size)
    return text if text.isdigit() else _string(text)


def _write_bool(value: bool) -> str:
    return "true" if value else "false"


def _write_int(value: int, hexa: bool = True) -> str:
    """Hexadecimal for EVs (TOML has no signed hexadecimal)."""
    return hex(value) if hexa and value >= 0 else str(value)


def _write_ints(values: Iterable[int], hexa: bool = False) -> str:
    return "[" + ", ".join(_write_int(v, hexa) for v in values) + "]"


@dataclass(frozen=True, slots=True)
class _Kind:
    """How one kind of value is read from TOML and written back."""

    read: Converter[Any]
    write: Callable[[Any], str]


SIZE = _Kind(_size, _write_size)
TIME = _Kind(_time, _write_time)
RATE = _Kind(_rate, lambda v: _string(format_rate(v)))
INT = _Kind(_int, str)
BOOL = _Kind(_bool, _write_bool)
STR = _Kind(_str, _string)
PROBABILITY = _Kind(_probability, _write_float)

#: Top-level scalar keys: file key -> (SimConfig field, kind, what "unset" means).
SCALARS: dict[str, tuple[str, _Kind, str]] = {
    "bytes": ("bytes_per_flow", SIZE, ""),
    "wr_size": ("wr_size", SIZE, "1 MiB writes"),
    "mode": ("mode", STR, ""),
    "cc": ("cc", STR, ""),
    "delay": ("link_delay_s", TIME, ""),
    "rate": ("rate_bps", RATE, ""),
    "queue": ("queue_bytes", SIZE, "the fabric's queue_bytes"),
    "trim": ("trim", BOOL, ""),
    "trim_threshold": ("trim_threshold_bytes", SIZE, "queue / 2"),
    "ecn_kmin": ("ecn_kmin_bytes", SIZE, "queue / 16"),
    "ecn_kmax": ("ecn_kmax_bytes", SIZE, "queue / 4"),
    "loss": ("loss", PROBABILITY, ""),
    "ecn_last_hop": ("ecn_last_hop", BOOL, ""),
    "packet_latency_every": ("packet_latency_every", INT, ""),
    "mtu_payload": ("mtu_payload", INT, ""),
    "ev_count": ("ev_count", INT, ""),
    "seed": ("seed", INT, ""),
    "max_time": ("max_sim_time_s", TIME, ""),
    "series": ("series_interval_s", TIME, "no timeline"),
    "latency_writes": ("latency_writes", INT, ""),
    "latency_write_bytes": ("latency_write_bytes", SIZE, ""),
}
#: The fault tables: file key -> (SimConfig field, the dataclass of one entry).
FAULTS: dict[str, tuple[str, type[Fault]]] = {
    "fail_link": ("link_failures", LinkFailure),
    "fail_switch": ("switch_failures", SwitchFailure),
    "nic_down": ("nic_downs", NicDown),
    "fail_plane": ("plane_failures", PlaneFailure),
    "loss_change": ("loss_changes", LossChange),
}
_FAULT_KINDS = {
    "link": STR,
    "switch": STR,
    "host": INT,
    "plane": INT,
    "start": TIME,
    "end": TIME,
    "at": TIME,
    "loss": PROBABILITY,
}
_CC_KINDS = {
    "base_rtt": TIME,
    "target_delay": TIME,
    "max_cwnd": SIZE,
    "adjust_bytes_threshold": SIZE,
    "adjust_period_threshold": TIME,
    "qa_gate": INT,
    "qa_threshold": TIME,
    "disable_qa": BOOL,
    "initial_cwnd": SIZE,
    "min_cwnd": SIZE,
}
#: The [mapper] table: MapperSpec fields and their kinds (windows: a list of rounds).
_MAPPER_KINDS = {
    "interval": TIME,
    "start": TIME,
    "timeout": TIME,
    "overlap": INT,
    "short_repeat": INT,
    "down_after": INT,
    "loss_threshold": PROBABILITY,
    "confidence": PROBABILITY,
    "hold_down": TIME,
    "windows": _Kind(_list(_int), _write_ints),
    "bucket": INT,
    "stale_after": INT,
    "deny": BOOL,
}
_FLOW_KEYS = ("src", "dst", "bytes", "start", "after", "evs", "planes", "group")
_COLLECTIVE_KEYS = ("kind", "hosts", "chunk", "start", "name")
#: Every file key -> the SimConfig field it sets (several keys may set one field).
FIELDS: dict[str, str] = {
    **{key: field for key, (field, _, _) in SCALARS.items()},
    "fabric": "fabric",
    "cc_params": "cc_params",
    "mapper": "mapper",
    "pairs": "pairs",
    "link_loss": "link_loss",
    "ev_loss": "ev_loss",
    "latency_flows": "latency_flows",
    "flow": "flow_specs",
    "collective": "flow_specs",
    **{key: field for key, (field, _) in FAULTS.items()},
}


# Reading a scenario ---------------------------------------------------------------------
class _Table:
    """One TOML table being read: unknown keys are refused up front, and every getter
    names its key path in its errors."""

    def __init__(self, path: str, raw: object, known: Sequence[str]) -> None:
        if not isinstance(raw, dict):
            raise ScenarioError(path or "scenario", f"must be a table, got {_describe(raw)}")
        for name in raw:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ScenarioError(f"{path}.{name}" if path else name, f"unknown key{hint}")
        self.path = path
        self.raw: dict[str, object] = raw

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def get(self, name: str, convert: Converter[T], default: D) -> T | D:
        return convert(self.key(name), self.raw[name]) if name in self.raw else default

    def need(self, name: str, convert: Converter[T]) -> T:
        if name not in self.raw:
            raise ScenarioError(self.key(name), "missing (required)")
        return convert(self.key(name), self.raw[name])


def _checked(key: str, build: Callable[[], T]) -> T:
    """``build()``, its ValueError (a dataclass's own check) reported at ``key``."""
    try:
        return build()
    except ScenarioError:
        raise
    except ValueError as exc:
        raise ScenarioError(key, str(exc)) from None


def _host(key: str, host: int, fabric: Fabric) -> int:
    if not 0 <= host < fabric.hosts:
        raise ScenarioError(key, f"host {host} not in 0..{fabric.hosts - 1}")
    return host


def _read_fabric(top: _Table, base_dir: Path | None) -> Fabric:
    raw = top.raw.get("fabric")
    if raw is None:
        return Fabric()
    if isinstance(raw, dict):
        try:
            return Fabric.from_mapping(raw)
        except FabricConfigError as exc:
            raise ScenarioError(exc.key, exc.problem) from None
    if not isinstance(raw, str):
        problem = f"must be a [fabric] table or a fabric file's path, got {_describe(raw)}"
        raise ScenarioError("fabric", problem)
    name = raw
    beside = base_dir / name if base_dir is not None else None
    try:
        return Fabric.load(beside if beside is not None and beside.is_file() else name)
    except FabricConfigError as exc:
        raise ScenarioError("fabric", f"{name}: {exc}") from None
    except OSError as exc:
        raise ScenarioError("fabric", f"cannot read {name!r}: {exc.strerror or exc}") from None


def _read_cc_params(top: _Table) -> CCParams | None:
    if "cc_params" not in top.raw:
        return None
    table = _Table("cc_params", top.raw["cc_params"], tuple(_CC_KINDS))
    values = {
        name: kind.read(table.key(name), raw)
        for name, kind in _CC_KINDS.items()
        if (raw := table.raw.get(name)) is not None
    }
    return _checked("cc_params", lambda: CCParams(**values))


def _read_mapper(top: _Table) -> MapperSpec | None:
    if "mapper" not in top.raw:
        return None
    table = _Table("mapper", top.raw["mapper"], tuple(_MAPPER_KINDS))
    values = {
        name: kind.read(table.key(name), raw)
        for name, kind in _MAPPER_KINDS.items()
        if (raw := table.raw.get(name)) is not None
    }
    return _checked("mapper", lambda: MapperSpec(**values))


def _read_pairs(top: _Table, fabric: Fabric) -> tuple[tuple[int, int], ...]:
    pairs = top.get("pairs", _list(_pair), ())
    for i, pair in enumerate(pairs):
        for host in pair:
            _host(f"pairs[{i}]", host, fabric)
        if pair[0] == pair[1]:
            raise ScenarioError(f"pairs[{i}]", "a flow needs two different hosts")
    return pairs


def _read_flow(table: _Table, index: int, fabric: Fabric) -> FlowSpec:
    src = _host(table.key("src"), table.need("src", _int), fabric)
    dst = _host(table.key("dst"), table.need("dst", _int), fabric)
    if src == dst:
        raise ScenarioError(table.key("dst"), f"a flow needs two different hosts, got {src} twice")
    size = table.get("bytes", _size, None)
    if size is not None and size < 1:
        raise ScenarioError(table.key("bytes"), f"must be >= 1, got {size}")
    after = table.get("after", _list(_int), ())
    for i, before in enumerate(after):
        if not 0 <= before < index:
            raise ScenarioError(
                f"{table.key('after')}[{i}]", f"flow {before} is not an earlier flow"
            )
    planes = table.get("planes", _list(_int), ())
    for i, plane in enumerate(planes):
        if not 0 <= plane < fabric.planes:
            raise ScenarioError(
                f"{table.key('planes')}[{i}]", f"plane {plane} not in 0..{fabric.planes - 1}"
            )
    return FlowSpec(
        src=src,
        dst=dst,
        bytes=size,
        start_s=table.get("start", _time, 0.0),
        after=after,
        evs=table.get("evs", _list(_int), ()),
        planes=planes,
        group=table.get("group", _str, ""),
    )


def _read_collective(table: _Table, first_index: int, fabric: Fabric) -> tuple[FlowSpec, ...]:
    kind = table.need("kind", _str)
    if kind not in collectives.KINDS:
        known = ", ".join(collectives.KINDS)
        raise ScenarioError(table.key("kind"), f"unknown collective {kind!r}; known: {known}")
    hosts = table.get("hosts", _list(_int), tuple(range(fabric.hosts)))
    for i, host in enumerate(hosts):
        _host(f"{table.key('hosts')}[{i}]", host, fabric)
    if len(hosts) < 2 or len(set(hosts)) != len(hosts):
        raise ScenarioError(table.key("hosts"), f"need two or more distinct hosts, got {hosts}")
    chunk = table.need("chunk", _size)
    if chunk < 1:
        raise ScenarioError(table.key("chunk"), f"must be >= 1, got {chunk}")
    start = table.get("start", _time, 0.0)
    name = table.get("name", _str, None)
    return _checked(
        table.path,
        lambda: collectives.ring_steps(
            kind, hosts, chunk, first_index=first_index, start_s=start, name=name
        ),
    )


def _read_fault(table: _Table, cls: type[Fault], fabric: Fabric) -> Fault:
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        kind = _FAULT_KINDS[field.name]
        if field.default is dataclasses.MISSING:
            values[field.name] = table.need(field.name, kind.read)
        elif field.name in table.raw:
            values[field.name] = kind.read(table.key(field.name), table.raw[field.name])
    if values.get("link") is not None:
        try:
            addrplan.parse_link(values["link"], fabric)
        except ValueError as exc:
            raise ScenarioError(table.key("link"), str(exc)) from None
    return cls(**values)


def _read_flows(top: _Table, fabric: Fabric) -> tuple[FlowSpec, ...]:
    """The [[flow]] tables, then every [[collective]]'s flows, in file order."""
    specs: list[FlowSpec] = []
    for i, raw in enumerate(top.get("flow", _tables, ())):
        specs.append(_read_flow(_Table(f"flow[{i}]", raw, _FLOW_KEYS), len(specs), fabric))
    for i, raw in enumerate(top.get("collective", _tables, ())):
        table = _Table(f"collective[{i}]", raw, _COLLECTIVE_KEYS)
        specs.extend(_read_collective(table, len(specs), fabric))
    return tuple(specs)


def _build(document: dict[str, Any], base_dir: Path | None) -> SimConfig:
    top = _Table("", document, tuple(FIELDS))
    fabric = _read_fabric(top, base_dir)
    values: dict[str, Any] = {
        field: kind.read(key, top.raw[key])
        for key, (field, kind, _) in SCALARS.items()
        if key in top.raw
    }
    values["cc_params"] = _read_cc_params(top)
    values["mapper"] = _read_mapper(top)
    values["link_loss"] = top.get("link_loss", _link_loss, ())
    values["ev_loss"] = top.get("ev_loss", _ev_loss, ())
    for i, (link, _) in enumerate(values["link_loss"]):
        try:
            addrplan.parse_link(link, fabric)
        except ValueError as exc:
            raise ScenarioError(f"link_loss[{i}]", str(exc)) from None
    # The scalars checked together first, so that a fault or flow error below names its key.
    base = _checked("", lambda: SimConfig(fabric=fabric, **values))
    changes: dict[str, Any] = {}
    for key, (field, cls) in FAULTS.items():
        entries = []
        for i, raw in enumerate(top.get(key, _tables, ())):
            where = f"{key}[{i}]"
            table = _Table(where, raw, [f.name for f in dataclasses.fields(cls)])
            entry = _read_fault(table, cls, fabric)
            alone: dict[str, Any] = {field: (entry,)}
            try:  # alone in the scenario, so that its own error names it
                dataclasses.replace(base, **alone)
            except ValueError as exc:
                raise ScenarioError(where, str(exc)) from None
            entries.append(entry)
        changes[field] = tuple(entries)
    pairs = _read_pairs(top, fabric)
    specs = _read_flows(top, fabric)
    if pairs and specs:
        raise ScenarioError("pairs", "give pairs or [[flow]]/[[collective]] tables, not both")
    flows = len(specs or pairs or ((0, 1),))
    latency = top.get("latency_flows", _list(_int), ())
    for i, index in enumerate(latency):
        if not 0 <= index < flows:
            raise ScenarioError(f"latency_flows[{i}]", f"{index} is not a flow (0..{flows - 1})")
    return _checked(
        "",
        lambda: dataclasses.replace(
            base, pairs=pairs, flow_specs=specs, latency_flows=latency, **changes
        ),
    )


def loads(
    text: str, *, source: str | None = None, base_dir: str | os.PathLike[str] | None = None
) -> SimConfig:
    """The scenario a TOML text describes; :class:`ScenarioError` (one line) if it is bad.

    ``source`` (a file name) starts every error message; ``base_dir`` is where a
    ``fabric = "file.toml"`` is looked for first (then the working directory, then the
    shipped examples)."""
    try:
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ScenarioError("toml", str(exc).splitlines()[0]) from None
        return _build(document, Path(base_dir) if base_dir is not None else None)
    except ScenarioError as exc:
        if source is None:
            raise
        raise ScenarioError(f"{source}: {exc.key}" if exc.key else source, exc.problem) from None


def _read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The file, else the shipped file it names (``incast.toml``,
    ``examples/scenarios/incast.toml``), else the OSError of the missing file."""
    try:
        return resources.read_bytes(path)
    except FileNotFoundError:
        parts = Path(path).parts
        if parts[: len(SHIPPED)] == SHIPPED:
            parts = parts[len(SHIPPED) :]
        elif parts[:1] == SHIPPED[-1:]:
            parts = parts[1:]
        item = package_files.files("mrcstack").joinpath(*SHIPPED, *parts)
        if len(parts) != 1 or not item.is_file():
            raise
        return item.read_bytes()


def load(path: str | os.PathLike[str]) -> SimConfig:
    """Read a scenario file, or the shipped scenario it names (OSError if neither)."""
    data = _read_bytes(path)
    name = os.fspath(path)
    if data[:2] == GZIP_MAGIC:  # experiments keep their large scenarios compressed
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise ScenarioError(f"{name}: gzip", str(exc)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{name}: toml", f"not UTF-8 at byte {exc.start}") from None
    return loads(text, source=name, base_dir=Path(path).parent)


# Writing a scenario ---------------------------------------------------------------------
def _write_table_entries(
    header: str, entries: Iterable[object], rows: Callable[[Any], list[str]]
) -> list[str]:
    out: list[str] = []
    for entry in entries:
        out += ["", f"[[{header}]]", *rows(entry)]
    return out


def _flow_rows(spec: FlowSpec) -> list[str]:
    rows = [f"src = {spec.src}", f"dst = {spec.dst}"]
    if spec.bytes is not None:
        rows.append(f"bytes = {_write_size(spec.bytes)}")
    if spec.start_s:
        rows.append(f"start = {_write_time(spec.start_s)}")
    for name, values, hexa in (
        ("after", spec.after, False),
        ("evs", spec.evs, True),
        ("planes", spec.planes, False),
    ):
        if values:
            rows.append(f"{name} = {_write_ints(values, hexa)}")
    if spec.group:
        rows.append(f"group = {_string(spec.group)}")
    return rows


def _fault_rows(entry: Fault) -> list[str]:
    return [
        f"{field.name} = {_FAULT_KINDS[field.name].write(value)}"
        for field in dataclasses.fields(entry)
        if (value := getattr(entry, field.name)) is not None
    ]


def dumps(cfg: SimConfig) -> str:
    """The TOML form of ``cfg``; ``loads(dumps(cfg)) == cfg``.  Collectives are written as
    the flows they expanded to; every setting is written, unset ones as comments."""
    f = cfg.fabric
    lines = [
        f"# mrcstack-sim scenario: {len(cfg.flows())} flow(s) on {f.planes} planes x "
        f"{f.t1_per_plane} T1, {f.racks} racks x {f.hosts_per_rack} hosts "
        "(docs/scenario.md)",
    ]
    for key, (field, kind, unset) in SCALARS.items():
        value = getattr(cfg, field)
        lines.append(
            f"# {key}: unset ({unset})" if value is None else f"{key} = {kind.write(value)}"
        )
    if cfg.pairs:
        lines.append(f"pairs = [{', '.join(_string(f'{s}:{d}') for s, d in cfg.pairs)}]")
    if cfg.latency_flows:
        lines.append(f"latency_flows = {_write_ints(cfg.latency_flows)}")
    tables = ["", *f.to_toml().rstrip("\n").splitlines()]
    if cfg.cc_params is not None:
        tables += ["", "[cc_params]"]
        for name, kind in _CC_KINDS.items():
            value = getattr(cfg.cc_params, name)
            tables.append(f"# {name}: unset" if value is None else f"{name} = {kind.write(value)}")
    if cfg.mapper is not None:
        tables += ["", "[mapper]"]
        for name, kind in _MAPPER_KINDS.items():
            value = getattr(cfg.mapper, name)
            tables.append(f"# {name}: unset" if value is None else f"{name} = {kind.write(value)}")
    for key, items in (
        ("link_loss", [(_string(link), _string(link), p) for link, p in cfg.link_loss]),
        ("ev_loss", [(_string(hex(ev)), _write_int(ev), p) for ev, p in cfg.ev_loss]),
    ):
        if items and len({name for name, _, _ in items}) == len(items):
            tables += ["", f"[{key}]", *(f"{name} = {_write_float(p)}" for name, _, p in items)]
        elif items:  # a name twice: a table cannot say that, a list can
            pairs = ", ".join(f"[{value}, {_write_float(p)}]" for _, value, p in items)
            lines.append(f"{key} = [{pairs}]")
    if cfg.flow_specs:  # one line per flow (a collective has hundreds), before any table
        lines += ["flow = ["]
        lines += [f"  {{ {', '.join(_flow_rows(spec))} }}," for spec in cfg.flow_specs]
        lines.append("]")
    for key, (field, _) in FAULTS.items():
        tables += _write_table_entries(key, getattr(cfg, field), _fault_rows)
    return "\n".join(lines + tables) + "\n"
