"""The fabric description: one data type, used by the simulator, the testbed and the daemon.

A multi-plane two-tier Clos: every host has one NIC per plane, connected to its rack's T0
switch of that plane; every T0 of a plane connects to every T1 of that plane.  Node names
are stable strings shared by every tool:

- host ``h<i>`` (global index, rack = i // hosts_per_rack)
- T0 ``p<plane>-t0<rack letter>`` (``p0-t0a``), T1 ``p<plane>-t1<letter>`` (``p0-t1c``)

A link is named by its plane and two ends: ``p0:t0a-t1c``, ``p0:h0-t0a``.

The TOML form is one flat ``[fabric]`` table whose keys are the field names; rates may be
written with tc units (``"100gbit"``) and ``queue_bytes`` with size units (``"1MiB"``).
Every configuration error is a :class:`FabricConfigError` whose one-line message starts
with the key at fault (``fabric.planes: must be in 1..16, got 0``), so a user can fix the
file without reading a traceback.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import os
import re
import string
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from mrcstack import resources
from mrcstack.errors import LocalError

MAX_PLANES = 16
MAX_RACKS = 256
MAX_T1 = 256
MAX_HOSTS = 2048
MIN_MTU = 1280  # IPv6 minimum link MTU (RFC 8200)
MAX_MTU = 65535
LOCATOR_BLOCK_BITS = 32  # the uSID locator block; the rest of the address carries uSIDs
TABLE = "fabric"  # the one TOML table this module reads and writes

# Rate units, lowercase (matched case-insensitively), in bits per second.  These are tc's
# units (iproute2 tc_util.c), so a string means the same here and in `tc`: note that, as in
# tc, a "bps" suffix means BYTES per second ("1gbps" = 8 Gbit/s).  A bare number and the
# one-letter shorthands k/m/g/t (as in iperf's "10G") are bits per second.
_SI = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_IEC = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
RATE_UNITS: dict[str, int] = {
    "": 1,
    "bit": 1,
    "bps": 8,
    **{p: s for p, s in _SI.items()},
    **{p + "bit": s for p, s in (_SI | _IEC).items()},
    **{p + "bps": 8 * s for p, s in (_SI | _IEC).items()},
}
# Size units in bytes: SI (kB = 1000) and IEC (KiB = 1024), matched case-insensitively.
SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    **{p + "b": s for p, s in _SI.items()},
    **{p + "b": s for p, s in _IEC.items()},
}
# A decimal number (exponent limited to 3 digits, so no input can make a huge integer).
_QUANTITY = re.compile(
    r"\s*((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[+-]?[0-9]{1,3})?)\s*([a-z]*)\s*", re.I
)
_RATE_FORMAT = (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3))
_SIZE_FORMAT = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


class FabricConfigError(LocalError, ValueError):
    """A fabric description is invalid; the message is one line naming the key at fault."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem

    def __reduce__(self) -> tuple[type[FabricConfigError], tuple[str, str]]:
        return (type(self), (self.key, self.problem))


def _quantity(text: str, units: Mapping[str, int], what: str, examples: str) -> Fraction:
    """Exact value of ``<number><unit>``; exact so that "0.1gbit" is 1e8, not 1e8 + ulp."""
    match = _QUANTITY.fullmatch(text) if isinstance(text, str) else None
    scale = units.get(match.group(2).lower()) if match else None
    if match is None or scale is None:
        raise ValueError(f"bad {what} {text!r}: expected a number and a unit, like {examples}")
    return Fraction(match.group(1)) * scale


def parse_rate(text: str) -> float:
    """Bits per second from a tc-style rate: "100Gbit", "200mbit", "10G", "400000000"."""
    value = _quantity(text, RATE_UNITS, "rate", "100gbit, 200mbit, 10G or 1.5gbps")
    if value <= 0:
        raise ValueError(f"bad rate {text!r}: must be positive")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"bad rate {text!r}: too large") from None


def parse_size(text: str | int) -> int:
    """Bytes from "64MiB", "1GiB", "1MB" (10**6) or "4096"; an int passes through."""
    if isinstance(text, bool) or not isinstance(text, int | str):
        raise ValueError(f"bad size {text!r}: expected an integer or a string like 64MiB")
    if isinstance(text, int):
        value = Fraction(text)
    else:
        value = _quantity(text, SIZE_UNITS, "size", "4096, 64KiB, 1MB or 1GiB")
    if value < 0 or value.denominator != 1:
        raise ValueError(f"bad size {text!r}: must be a whole, non-negative number of bytes")
    return int(value)


def format_rate(bps: float) -> str:
    """The shortest tc string that :func:`parse_rate` maps back to exactly ``bps``."""
    if not (math.isfinite(bps) and bps > 0):
        raise ValueError(f"bad rate {bps!r}: must be positive and finite")
    if float(bps).is_integer():
        whole = int(bps)
        for unit, scale in _RATE_FORMAT:
            if whole % scale == 0:
                return f"{whole // scale}{unit}"
        return f"{whole}bit"
    return f"{float(bps)!r}bit"


def format_size(size: int) -> str:
    """The shortest exact IEC string for a size ("1MiB"), or the plain number of bytes."""
    for unit, scale in _SIZE_FORMAT:
        if size and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def letters(index: int) -> str:
    """Spreadsheet-style letters: 0 -> a, 25 -> z, 26 -> aa."""
    if index < 0:
        raise ValueError(f"negative index {index}")
    out = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, 26)
        out = string.ascii_lowercase[rem] + out
    return out


def letter_index(text: str) -> int:
    """Inverse of :func:`letters`; raises ValueError on anything but lowercase letters."""
    if not text or any(c not in string.ascii_lowercase for c in text):
        raise ValueError(f"not a letter index: {text!r}")
    value = 0
    for c in text:
        value = value * 26 + (ord(c) - ord("a") + 1)
    return value - 1


#: How switches own SIDs: uSID only, or uSID plus a classic 128-bit End SID each.
SID_FORMATS = ("usid", "classic")


def _key(name: str) -> str:
    return f"{TABLE}.{name}"


@dataclass(frozen=True, slots=True)
class Fabric:
    """Shape and link properties of a multi-plane two-tier fabric."""

    planes: int = 4
    racks: int = 2
    hosts_per_rack: int = 2
    t1_per_plane: int = 4
    host_link_bps: float | None = None  # NIC <-> T0; None = unshaped
    fabric_link_bps: float | None = None  # T0 <-> T1; None = unshaped
    mtu: int = 9000  # IP MTU of every link
    queue_bytes: int = 1 << 20  # per switch egress port
    locator_block: str = "fcbb:bb00::"  # 32-bit uSID locator block
    # "usid": every switch is a uN (NEXT-C-SID); "classic": each also owns a full 128-bit
    # SID with the plain End behaviour, so SRv6 paths with an SRH can be sent too.
    sid_format: str = "usid"

    def __post_init__(self) -> None:
        for name, value, top in (
            ("planes", self.planes, MAX_PLANES),
            ("racks", self.racks, MAX_RACKS),
            ("hosts_per_rack", self.hosts_per_rack, MAX_HOSTS),
            ("t1_per_plane", self.t1_per_plane, MAX_T1),
        ):
            if not 1 <= value <= top:
                raise FabricConfigError(_key(name), f"must be in 1..{top}, got {value}")
        if self.hosts > MAX_HOSTS:
            raise FabricConfigError(
                _key("hosts_per_rack"),
                f"racks*hosts_per_rack must be <= {MAX_HOSTS}, got {self.hosts}",
            )
        for name, rate in (
            ("host_link_bps", self.host_link_bps),
            ("fabric_link_bps", self.fabric_link_bps),
        ):
            if rate is not None and not (math.isfinite(rate) and rate > 0):
                raise FabricConfigError(_key(name), f"must be positive, got {rate}")
        if not MIN_MTU <= self.mtu <= MAX_MTU:
            raise FabricConfigError(_key("mtu"), f"must be in {MIN_MTU}..{MAX_MTU}, got {self.mtu}")
        if self.queue_bytes < self.mtu:
            raise FabricConfigError(
                _key("queue_bytes"),
                f"must hold at least one MTU ({self.mtu}), got {self.queue_bytes}",
            )
        _check_block(self.locator_block)
        if self.sid_format not in SID_FORMATS:
            raise FabricConfigError(
                _key("sid_format"),
                f"must be one of {', '.join(SID_FORMATS)}, got {self.sid_format!r}",
            )

    @property
    def hosts(self) -> int:
        return self.racks * self.hosts_per_rack

    @property
    def block(self) -> int:
        """The locator block as a 128-bit integer (low 96 bits zero)."""
        return int(ipaddress.IPv6Address(self.locator_block))

    def rack_of(self, host: int) -> int:
        self.check_host(host)
        return host // self.hosts_per_rack

    def check_host(self, host: int) -> None:
        if not 0 <= host < self.hosts:
            raise ValueError(f"host {host} out of range 0..{self.hosts - 1}")

    def check_plane(self, plane: int) -> None:
        if not 0 <= plane < self.planes:
            raise ValueError(f"plane {plane} out of range 0..{self.planes - 1}")

    # Node names -----------------------------------------------------------------------
    @staticmethod
    def host_name(host: int) -> str:
        return f"h{host}"

    @staticmethod
    def t0_name(plane: int, rack: int) -> str:
        return f"p{plane}-t0{letters(rack)}"

    @staticmethod
    def t1_name(plane: int, t1: int) -> str:
        return f"p{plane}-t1{letters(t1)}"

    # TOML -----------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, table: Mapping[str, object]) -> Fabric:
        """A fabric from the contents of a ``[fabric]`` table (for tools that embed one)."""
        known = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, object] = {}
        for name, raw in table.items():
            if name not in known:
                raise FabricConfigError(_key(name), "unknown key")
            values[name] = _CONVERTERS[name](_key(name), raw)
        return cls(**values)  # type: ignore[arg-type]  # each value checked by its converter

    @classmethod
    def from_toml(cls, text: str) -> Fabric:
        """Parse the TOML form; every error is a one-line :class:`FabricConfigError`."""
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise FabricConfigError("toml", str(exc).splitlines()[0]) from None
        for name in document:
            if name != TABLE:
                raise FabricConfigError(name, f"unknown key (only a [{TABLE}] table is read)")
        if TABLE not in document:
            raise FabricConfigError(TABLE, f"missing [{TABLE}] table")
        table = document[TABLE]
        if not isinstance(table, dict):
            raise FabricConfigError(TABLE, f"must be a table, got {_describe(table)}")
        return cls.from_mapping(table)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Fabric:
        """Read a fabric TOML file, or the shipped example it names (OSError if neither)."""
        data = resources.read_bytes(path)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FabricConfigError("toml", f"not UTF-8 at byte {exc.start}") from None
        return cls.from_toml(text)

    def to_toml(self) -> str:
        """The TOML form, readable by :meth:`from_toml`; exact round trip."""
        lines = [
            f"# mrcstack fabric: {self.planes} planes, {self.racks} racks x "
            f"{self.hosts_per_rack} hosts, {self.t1_per_plane} T1 per plane",
            f"[{TABLE}]",
        ]
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                lines.append(f"# {field.name}: unset (unshaped)")
            elif field.name.endswith("_bps"):
                lines.append(f"{field.name} = {json.dumps(format_rate(value))}")
            elif field.name == "queue_bytes":
                lines.append(f"{field.name} = {json.dumps(format_size(value))}")
            elif isinstance(value, str):
                lines.append(f"{field.name} = {json.dumps(value)}")
            else:
                lines.append(f"{field.name} = {value}")
        return "\n".join(lines) + "\n"


def _check_block(text: str) -> None:
    key = _key("locator_block")
    try:
        block = int(ipaddress.IPv6Address(text))
    except (ipaddress.AddressValueError, TypeError):
        raise FabricConfigError(key, f"not an IPv6 address: {text!r}") from None
    if block & ((1 << (128 - LOCATOR_BLOCK_BITS)) - 1):
        raise FabricConfigError(
            key, f"must be a /{LOCATOR_BLOCK_BITS} block (only the first 32 bits set), got {text}"
        )


def _describe(raw: object) -> str:
    return f"{raw!r} ({type(raw).__name__})"


def _to_int(key: str, raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise FabricConfigError(key, f"must be an integer, got {_describe(raw)}")
    return raw


def _to_rate(key: str, raw: object) -> float:
    if isinstance(raw, str):
        try:
            return parse_rate(raw)
        except ValueError as exc:
            raise FabricConfigError(key, str(exc)) from None
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise FabricConfigError(key, f'must be a rate like "100gbit", got {_describe(raw)}')
    return float(raw)


def _to_size(key: str, raw: object) -> int:
    if not isinstance(raw, int | str) or isinstance(raw, bool):
        raise FabricConfigError(key, f'must be a size like "1MiB", got {_describe(raw)}')
    try:
        return parse_size(raw)
    except ValueError as exc:
        raise FabricConfigError(key, str(exc)) from None


def _to_str(key: str, raw: object) -> str:
    if not isinstance(raw, str):
        raise FabricConfigError(key, f"must be a string, got {_describe(raw)}")
    return raw


_CONVERTERS: dict[str, Callable[[str, object], object]] = {
    "planes": _to_int,
    "racks": _to_int,
    "hosts_per_rack": _to_int,
    "t1_per_plane": _to_int,
    "host_link_bps": _to_rate,
    "fabric_link_bps": _to_rate,
    "mtu": _to_int,
    "queue_bytes": _to_size,
    "locator_block": _to_str,
    "sid_format": _to_str,
}
